#!/usr/bin/env python3
"""No simulated time falls below the contract's floor (docs/tcp-isa.md section 12): for every
case, `moec run --target=tcp --stats F` writes `simulated_seconds` and `floor_seconds` (the
floor for the tokens the run routed and the experts it hit) and the test requires
simulated >= floor > 0. A floor above a simulated time would be a program beating a bound that
claims to hold for every program: a wrong term in the floor, or a simulator that breaks the
contract's rule the term rests on.

Cases:
- the four bench layers (examples/mixtral_8x7b, qwen3_30b_a3b, deepseek_v3, gpt_oss_20b) at
  T = 1, 64 and 512, and Mixtral-8x7B, Qwen3-30B-A3B and gpt-oss-20b at T = 4096 (DeepSeek-V3's
  T = 4096 run holds 4.5 GB and takes minutes: left out), timing-only on router-only
  checkpoints that bench/make_checkpoint.py --no-experts writes into WORK_DIR (kept there for
  the next run), x ~ N(0, 1) seeded; and bench/qwen3_30b_a3b_fp8.moe (block-FP8 experts) at
  T = 512 and 4096, dequantized in DM and with --quant-act=fp8;
- every HF fixture family's small layer (FIXTURES_DIR), each saved input (bf16 and f32,
  T in {1, 5, 64}), run with its weights and data;
- a serving program (qwen3_moe's layer for T = 64 with an n_tokens input, its decode tier
  linked) run for n = 1, 5, 63 and 64 tokens: the floor for the n tokens routed.
The table of simulated/floor ratios is printed.

usage: floor_holds.py MOEC SRC_DIR FIXTURES_DIR WORK_DIR [--bench-only | --hf-only]"""
import json
import os
import subprocess
import sys

import numpy as np

import cases
import hf_rebuild

BENCH = {"mixtral_8x7b": 4096, "qwen3_30b_a3b": 2048, "deepseek_v3": 7168, "gpt_oss_20b": 2880}
TOKENS = {m: (1, 64, 512, 4096) for m in BENCH}
TOKENS["deepseek_v3"] = (1, 64, 512)


def stats(moec, moe, weights, x, extra, work):
    out = os.path.join(work, "stats.json")
    if os.path.exists(out):
        os.remove(out)
    cases.run([moec, "run", moe, "--target=tcp", "--weights", weights, "--input", x, "--stats", out] + extra)
    r = json.load(open(out))
    if "floor_seconds" not in r:
        raise RuntimeError("no floor_seconds in the run's stats")
    return r


def verdict(tally, case, r, rows):
    sim, fl = r["simulated_seconds"], r["floor_seconds"]
    rows.append((case, sim, fl, r["experts_hit"]))
    tally.check(case, fl > 0 and sim >= fl, "simulated %10.2f us, floor %10.2f us, %.3fx (%d experts hit)" % (
        sim * 1e6, fl * 1e6, sim / fl if fl > 0 else 0, r["experts_hit"]))


def bench(moec, src, work, tally, rows):
    for model, D in BENCH.items():
        ck = os.path.join(work, model + ".routing.safetensors")
        if not os.path.exists(ck):
            cases.run([sys.executable, os.path.join(src, "bench", "make_checkpoint.py"), model, ck + ".tmp",
                       "--no-experts"])
            os.replace(ck + ".tmp", ck)
        for T in TOKENS[model]:
            case = "%s T=%d" % (model, T)
            with tally.case(case):
                x = os.path.join(work, "x_%d_%d.npy" % (D, T))
                if not os.path.exists(x):
                    np.save(x + ".tmp.npy", np.random.default_rng(T).standard_normal((T, D), dtype=np.float32))
                    os.replace(x + ".tmp.npy", x)
                r = stats(moec, os.path.join(src, "examples", model + ".moe"), ck, x,
                          ["--set", "T=%d" % T, "--timing-only"], work)
                verdict(tally, case, r, rows)
    # block-FP8 experts (bench/qwen3_30b_a3b_fp8.moe): dequantized in DM, and fp8 x fp8
    ck = os.path.join(work, "qwen3_30b_a3b.routing.safetensors")
    for T in (512, 4096):
        for act in ([], ["--quant-act=fp8"]):
            case = "qwen3_30b_a3b_fp8 T=%d %s" % (T, " ".join(act))
            with tally.case(case):
                r = stats(moec, os.path.join(src, "bench", "qwen3_30b_a3b_fp8.moe"), ck,
                          os.path.join(work, "x_2048_%d.npy" % T), ["--set", "T=%d" % T, "--timing-only"] + act, work)
                verdict(tally, case, r, rows)


def hf(moec, fixtures, work, tally, rows):
    for fam, dtype, T, x in cases.inputs(fixtures, cases.families(fixtures), tokens=(1, 5, 64)):
        case = "hf %s %s T=%d" % (fam, dtype, T)
        with tally.case(case):
            d = os.path.join(fixtures, fam)
            weights = hf_rebuild.checkpoint(d, work)
            moe = cases.import_layer(moec, d, T, os.path.join(work, "%s.moe" % fam))
            y = os.path.join(work, "y.npy")
            verdict(tally, case, stats(moec, moe, weights, x, cases.dtype_sets(dtype) + ["-o", y], work), rows)


def serving(moec, fixtures, work, tally, rows):
    """A serving program (n_tokens input, T = 64, its decode tier linked) run for n tokens: the
    floor for the n tokens routed."""
    d = os.path.join(fixtures, "qwen3_moe")
    q = cases.import_layer(moec, d, 64, os.path.join(work, "q64.moe"))
    src = open(q).read()
    decl = "  input x : [T, D]\n"
    if decl not in src:
        raise RuntimeError("%s: no '%s' line to add n_tokens after" % (q, decl.strip()))
    sv = os.path.join(work, "s64.moe")
    with open(sv, "w") as f:
        f.write(src.replace(decl, decl + "  input n_tokens : i32[]\n", 1))
    tcpb = os.path.join(work, "s64.tcpb")
    cases.run([moec, "compile", sv, "-o", tcpb])
    for n in (1, 5, 63, 64):
        case = "serving qwen3_moe T=64 n=%d" % n
        with tally.case(case):
            r = stats(moec, tcpb, hf_rebuild.checkpoint(d, work), os.path.join(d, "x_float32_T64.npy"),
                      ["--tokens", str(n), "-o", os.path.join(work, "y.npy")], work)
            verdict(tally, case, r, rows)


def main():
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    moec, src, fixtures, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    tally, rows = cases.Tally(width=34), []
    if "--hf-only" not in sys.argv:
        bench(moec, src, work, tally, rows)
    if "--bench-only" not in sys.argv:
        hf(moec, fixtures, work, tally, rows)
        with tally.case("serving"):
            serving(moec, fixtures, work, tally, rows)
    if rows:
        r = [s / f for _, s, f, _ in rows if f > 0]
        print("simulated/floor over %d cases: min %.3fx, max %.3fx" % (len(rows), min(r), max(r)))
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
