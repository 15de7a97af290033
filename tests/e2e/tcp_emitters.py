#!/usr/bin/env python3
"""The two TCP emitters agree bit for bit: for every case in scope, the same layer,
weights and x are run on the TCP simulator compiled by `--tcp-emitter=legacy` and by
`--tcp-emitter=sched` (the schedule compiler, docs/tcp-compiler.md 5.1), and the two
y .npy files must be byte-identical. No stored output: neither side is an expected
value made by the code under test.

Cases: every HF fixture family (or --families) of FIXTURES_DIR and each --more-fixtures
folder, for every saved input (bf16 and f32, T in {1, 5, 64}); the examples EXAMPLES at T in {1, 5, 64} with
random weights (E and K made small so the checkpoint stays small; seed and
qwen3_30b_a3b at their own D and F, whose expert weights fit DM double-buffered, the
other examples at D = 64, F = 32).
Quantized layers: the fixtures of --quant-fixtures (tests/fixtures/quant) whose experts the
schedule compiler compiles (QUANT_FAMILIES: block and per-channel FP8, MXFP4, int4, NVFP4,
AWQ, W8A8 dequantized in its block loop; GPTQ dequantized when the weights are bound), every
saved input (float32, T in {1, 5, 64}) run with the f32 and the bf16 compute type; the block-FP8 families of QACT_FAMILIES once more with fp8
activations (`--quant-act=fp8`: act=fp8 contractions, docs/tcp-isa.md 7.10).
Round trip: each case's schedule printed by `moec compile --emit=tcp-sched`, read
back and compiled (by `moec compile S.tsched` where this moec reads .tsched inputs,
else by the test tool tcp_sched_tool --tcpb given as --sched-tool) gives the same .tcpb
bytes as the direct `moec compile --tcp-emitter=sched`.

usage: tcp_emitters.py MOEC FIXTURES_DIR EXAMPLES_DIR [--families a,b] [--examples-only a,b]
                       [--sched-tool TCP_SCHED_TOOL] [--more-fixtures DIR ...] [--quant-fixtures DIR]
"""
import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import cases
from examples_targets import write_safetensors
import hf_rebuild

FAMILIES = None  # every family of the fixtures
SMALL = ["--set", "D=64", "--set", "F=32"]
EXAMPLES = {  # seed and qwen3_30b_a3b at their own D and F; the others at SMALL dims
    "seed": ["--set", "E=8", "--set", "K=2"],
    "qwen3_30b_a3b": ["--set", "E=8", "--set", "K=2"],
    "deepseek_v3": SMALL + ["--set", "E=16", "--set", "K=4", "--set", "n_group=4", "--set", "topk_group=2"],
    "gpt_oss_20b": SMALL + ["--set", "E=8", "--set", "K=2"],
    "llama4_scout": SMALL + ["--set", "E=8", "--set", "K=1"],
    "mixtral_8x7b": SMALL + ["--set", "E=8", "--set", "K=2"],
    "olmoe_1b_7b": SMALL + ["--set", "E=8", "--set", "K=2"],
}
TOKENS = (1, 5, 64)
QUANT_FAMILIES = ["deepseek_v3", "qwen3_moe", "fp8ch_llama4", "mxfp4_gpt_oss", "int4_deepseek_v3",
                  "nvfp4_mixtral", "nvfp4_qwen3_moe", "nvfp4mo_qwen3_moe", "awq_mixtral", "awq_qwen3_moe",
                  "w8a8_mixtral", "w8a8_qwen3_moe", "gptq_mixtral", "gptq_qwen3_moe"]
# block FP8 in 128 x 128 blocks: run a second time with --quant-act=fp8
QACT_FAMILIES = ["deepseek_v3", "qwen3_moe"]

run = cases.run


def random_checkpoint(moec, moe, sets, tmp, rng):
    """Random weights under the layer's checkpoint names, and an input x; (weights, x)."""
    ir = json.loads(run([moec, "ir", moe, "--format=json"] + sets).stdout)
    tensors, x_shape = {}, None
    for n in ir["layers"][0]["nodes"]:
        if n["op"] == "input":
            x_shape = n["shape"]
        if n["op"] != "weight":
            continue
        src, shape = n["attrs"]["source"]["str"], n["shape"]
        scale = 0.3 / max(1.0, float(shape[-1]) ** 0.5) if len(shape) > 1 else 0.1
        if "{e}" in src:
            for e in range(shape[0]):
                tensors[src.replace("{e}", str(e))] = rng.standard_normal(shape[1:]) * scale
        else:
            tensors[src] = rng.standard_normal(shape) * scale
    w = os.path.join(tmp, "w.safetensors")
    write_safetensors(w, tensors)
    x = os.path.join(tmp, "x.npy")
    np.save(x, rng.standard_normal(x_shape).astype(np.float32))
    return w, x


def reader(a):
    """The command that compiles a .tsched into a .tcpb (a list to which IN and OUT are
    appended as the function gives them), or None."""
    p = subprocess.run([a.moec, "compile", "--help"], capture_output=True, text=True)
    if ".tsched" in p.stdout:
        return lambda src, out: [a.moec, "compile", src, "-o", out]
    if a.sched_tool:
        return lambda src, out: [a.sched_tool, "--tcpb", out, src]
    return None


def compare(a, tally, case, moe, weights, x, sets, tmp):
    ys = {}
    for em in ("legacy", "sched"):
        ys[em] = os.path.join(tmp, "y_%s.npy" % em)
        run([a.moec, "run", moe, "--weights", weights, "--input", x, "-o", ys[em], "--target=tcp",
             "--tcp-emitter=" + em] + sets)
    same = filecmp.cmp(ys["legacy"], ys["sched"], shallow=False)
    detail = "y bitwise equal" if same else "y differs: max|diff| = %.3e" % float(
        np.max(np.abs(np.load(ys["legacy"]).astype(np.float64) - np.load(ys["sched"]).astype(np.float64))))
    tally.check(case, same, detail)
    if not a.reader:
        return
    ts, direct, back = (os.path.join(tmp, n) for n in ("s.tsched", "direct.tcpb", "back.tcpb"))
    run([a.moec, "compile", moe, "--target=tcp", "--emit=tcp-sched", "-o", ts] + sets)
    run([a.moec, "compile", moe, "--tcp-emitter=sched", "-o", direct] + sets)
    run(a.reader(ts, back))
    tally.check(case + " round trip", filecmp.cmp(direct, back, shallow=False), ".tcpb from the .tsched")


def hf_cases(a, tally, fixtures, tmp):
    for fam, dtype, T, xpath in cases.inputs(fixtures, cases.families(fixtures, a.families), tokens=TOKENS):
        label = "" if fixtures == a.fixtures else os.path.basename(os.path.normpath(fixtures)) + "/"
        case = "%s%s %s T=%d" % (label, fam, dtype, T)
        with tally.case(case):
            d = os.path.join(fixtures, fam)
            weights = hf_rebuild.checkpoint(d, tmp)
            moe = cases.import_layer(a.moec, d, T, os.path.join(tmp, "%s.moe" % fam))
            compare(a, tally, case, moe, weights, xpath, cases.dtype_sets(dtype), tmp)


def quant_cases(a, tally, qdir, tmp):
    for fam, dtype, T, xpath in cases.inputs(qdir, cases.families(qdir, ",".join(QUANT_FAMILIES)), tokens=TOKENS):
        for dt in ("f32", "bf16"):
            case = "quant/%s %s T=%d" % (fam, dt, T)
            with tally.case(case):
                d = os.path.join(qdir, fam)
                moe = cases.import_layer(a.moec, d, T, os.path.join(tmp, "%s.moe" % fam))
                compare(a, tally, case, moe, os.path.join(d, "model.safetensors"), xpath,
                        ["--set", "dtype=" + dt], tmp)
            if fam not in QACT_FAMILIES:
                continue
            case = "quant/%s %s T=%d --quant-act=fp8" % (fam, dt, T)
            with tally.case(case):
                compare(a, tally, case, moe, os.path.join(d, "model.safetensors"), xpath,
                        ["--set", "dtype=" + dt, "--quant-act=fp8"], tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moec")
    ap.add_argument("fixtures")
    ap.add_argument("examples")
    ap.add_argument("--families", default=FAMILIES)
    ap.add_argument("--examples-only", dest="only", default=",".join(EXAMPLES))
    ap.add_argument("--sched-tool", default=None)
    ap.add_argument("--more-fixtures", action="append", default=[], help="another fixtures folder (repeatable)")
    ap.add_argument("--quant-fixtures", default=None, help="the quantized fixtures folder")
    a = ap.parse_args()
    a.reader = reader(a)
    tally = cases.Tally(32)
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        for fdir in [a.fixtures] + a.more_fixtures:
            hf_cases(a, tally, fdir, tmp)
        if a.quant_fixtures:
            quant_cases(a, tally, a.quant_fixtures, tmp)
        for name in [n for n in a.only.split(",") if n]:
            for dt in ("bf16", "f32"):
                for T in TOKENS:
                    case = "%s %s T=%d" % (name, dt, T)
                    with tally.case(case):
                        moe = os.path.join(a.examples, name + ".moe")
                        sets = EXAMPLES[name] + ["--set", "T=%d" % T, "--set", "dtype=" + dt]
                        w, x = random_checkpoint(a.moec, moe, sets, tmp, rng)
                        compare(a, tally, case, moe, w, x, sets, tmp)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
