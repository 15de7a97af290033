#!/usr/bin/env python3
"""Expert parallelism on N simulated TCP chips equals one chip.

For every fixture family and saved input x_{dtype}_T{T}.npy (T in --tokens):
    moec import-hf config.json --tokens T -o layer.moe           (its block size B)
    moec run layer.moe --target=tcp --set B=B -o y1.npy           (one chip, the same B)
    moec run layer.moe --target=tcp --ep N --stats s.json -o yN.npy   (N in --chips, N <= E)
and require max|yN - y1| <= 1e-6 max|y1| (--tol), and the stats to account for every
chip: link bytes out and in summing to the same total over the chips; each exchange
round measured end to end (stats "rounds") at least its bound and positive, its pack, link
and unpack summing to it, pack within its span and unpack within its summed durations (the
critical path's share of a command set is at most the set's whole time); the --trace to
hold one process per chip, each with one all_to_all per round, every command's
critical-path link ("pred") to name an earlier command of its phase that ends no later, and
to pass trace_check.py (every track named and used, slices on a track nested or disjoint).

With --quant-acts bf16,fp8 (the quantized fixtures, tests/fixtures/quant) every run of a
layer with block-FP8 experts, one chip and N chips alike, is made once per --quant-act
value: the chips must agree with one chip in both activation modes (act=fp8 quantizes each
token's activations per 1x128 group, so a token's scales do not depend on which chip holds
it, and the outputs are equal). The other layers (per-channel FP8, int4, MXFP4) run without
the option, which is refused on them (on one chip and on two, nothing written).

usage: ep_tcp.py MOEC FIXTURES_DIR [--families a,b] [--tokens 5] [--chips 2,4,8] [--dtypes float32]
                 [--quant-acts bf16,fp8]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

import cases
import quant  # read_st, write_st
import trace_check


def run(cmd):
    return cases.run(cmd, 600)


def preds_ok(ev):
    """Every command's critical-path link (args.pred) is an earlier command
    of its chip and phase that ends no later than it does."""
    runs = {}
    for e in ev:
        if e["ph"] == "X" and "event" in e.get("args", {}):
            runs[(e["pid"], e["args"]["phase"], e["args"]["event"])] = e
    for (pid, ph, i), e in runs.items():
        p = e["args"]["pred"]
        if p < 0:
            continue
        q = runs.get((pid, ph, p))
        if p >= i or q is None or q["ts"] + q["dur"] > e["ts"] + e["dur"] + 1e-3:
            return False
    return len(runs) > 0


GRANULE_LAYER = """layer granule {
  dim T = 5, D = 128, F = 64, E = 8, K = 2, B = 4
  dtype f32
  input  x : [T, D]
  weight router : [E, D]    = "router"
  weight up     : [E, F, D] = "up.{e}"
  weight down   : [E, D, F] = "down.{e}"
  logits = einsum("td,ed->te", x, router)
  idx    = topk(logits, K)
  w      = softmax(take_along(logits, idx, axis=1), axis=1)
  y      = experts(x, idx, w, up=up, down=down, act="none", block=B)
  output y
}
"""


def save_safetensors(path, tensors):
    """f32 tensors in the safetensors layout (8-byte header size, JSON header, data)."""
    head, blobs, at = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        head[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def granule_case(moec, tmp, tally, tol):
    """A layer whose rows are whole 256-byte HBM granules (f32, D = 128): the
    send and return buffers are gathered straight into their phase outputs
    (docs/tcp-isa.md section 7), so a phase's outputs are not created in
    index order; 2 chips must still equal one."""
    rng = np.random.default_rng(7)
    E, F, D, T = 8, 64, 128, 5
    lay, ck, x = (os.path.join(tmp, n) for n in ("granule.moe", "granule.safetensors", "granule_x.npy"))
    open(lay, "w").write(GRANULE_LAYER)
    t = {"router": rng.standard_normal((E, D)) * 0.5}
    for e in range(E):
        t["up.%d" % e] = rng.standard_normal((F, D)) * 0.1
        t["down.%d" % e] = rng.standard_normal((D, F)) * 0.1
    save_safetensors(ck, t)
    np.save(x, rng.standard_normal((T, D)).astype(np.float32))
    case = "granule rows f32 D=128 T=5 chips=2"
    with tally.case(case):
        base = [moec, "run", lay, "--target=tcp", "--weights", ck, "--input", x]
        y1p, y2p = os.path.join(tmp, "g1.npy"), os.path.join(tmp, "g2.npy")
        run(base + ["-o", y1p])
        run(base + ["--ep", "2", "-o", y2p])
        y1, y2 = np.load(y1p).astype(np.float64), np.load(y2p).astype(np.float64)
        rel = float(np.max(np.abs(y2 - y1))) / (float(np.max(np.abs(y1))) or 1.0)
        tally.check(case, y1.shape == y2.shape and rel <= tol and float(np.max(np.abs(y1))) > 0,
                    "max|y - y1| = %.2e x max|y1|" % rel)


def compare(a, tally, tmp, fam, dtype, T, x, moe, act):
    """One chip, then N chips for each N of --chips, of the imported layer `moe`
    (with --quant-act=act unless act is None); the one-chip output."""
    d = os.path.join(a.fixtures, fam)
    w = os.path.join(d, "model.safetensors")
    tag = "%s %s T=%d%s" % (fam, dtype, T, "" if act is None else " act=" + act)
    one = None
    with tally.case(tag + " (one chip)"):
        text = open(moe).read()
        B = re.search(r"\bB = (\d+)", text).group(1)
        E = int(re.search(r"\bE = (\d+)", text).group(1))
        base = [a.moec, "run", moe, "--target=tcp", "--weights", w, "--input", x] + cases.dtype_sets(dtype)
        base += [] if act is None else ["--quant-act=" + act]
        y1p = os.path.join(tmp, "y1.npy")
        run(base + ["--set", "B=" + B, "-o", y1p])
        one = np.load(y1p).astype(np.float64)
    if one is None:
        return None
    y1 = one
    for n in [int(c) for c in a.chips.split(",")]:
        if n > E:
            continue
        case = "%s chips=%d" % (tag, n)
        with tally.case(case):
            yp, sp, tp = os.path.join(tmp, "yn.npy"), os.path.join(tmp, "s.json"), os.path.join(tmp, "t.json")
            run(base + ["--ep", str(n), "--stats", sp, "--trace", tp, "-o", yp])
            y = np.load(yp).astype(np.float64)
            s = json.load(open(sp))
            scale = float(np.max(np.abs(y1))) or 1.0
            rel = float(np.max(np.abs(y - y1))) / scale
            chips = s["chips"]
            bytes_ok = (len(chips) == n and sum(c["link_bytes_out"] for c in chips) ==
                        sum(c["link_bytes_in"] for c in chips))
            rounds = s["rounds"]
            eps = 1e-12
            rounds_ok = len(rounds) >= 1 and all(
                0 < r["bound_seconds"] <= r["seconds"] and
                abs(r["seconds"] - r["pack_seconds"] - r["link_seconds"] - r["unpack_seconds"]) <= 1e-9 and
                0 <= r["pack_seconds"] <= r["pack_span_seconds"] + eps and
                0 <= r["unpack_seconds"] <= r["unpack_sum_seconds"] + eps for r in rounds)
            ev = json.load(open(tp))["traceEvents"]
            rounds_ok = rounds_ok and preds_ok(ev)
            drawn = trace_check.check(tp)[0]  # tracks named and used, slices on a track nested or disjoint
            trace_ok = (set(e["pid"] for e in ev if e["ph"] == "X") == set(range(n)) and
                        all(sum(1 for e in ev if e["name"] == "all_to_all" and e["pid"] == d) == len(rounds)
                            for d in range(n)) and not drawn)
            ok = y.shape == y1.shape and rel <= a.tol and bytes_ok and rounds_ok and trace_ok
            tally.check(case, ok, "max|y - y1| = %.2e x max|y1|, %s, link %d bytes, %.2f us, rounds %s x bound%s"
                        % (rel, "bitwise" if (y == y1).all() else "not bitwise",
                           sum(c["link_bytes_out"] for c in chips), s["link_seconds"] * 1e6,
                           "/".join("%.2f" % (r["seconds"] / r["bound_seconds"]) for r in rounds),
                           "" if trace_ok else ", trace WRONG" + "".join("; " + m for m in drawn[:3])))
    return y1


def block_fp8(moe):
    """Whether the layer has block-FP8 experts (128 x 128 blocks), the weights --quant-act
    chooses the contraction of."""
    return "block=[128, 128]" in open(moe).read()


def act_refused(a, tally, fam, dtype, T, x, moe, tmp):
    """--quant-act on a layer without block-FP8 experts is an error naming the option
    (on N chips as on one), and writes nothing."""
    w = os.path.join(a.fixtures, fam, "model.safetensors")
    yp = os.path.join(tmp, "refused.npy")
    for chips in ([], ["--ep", "2"]):
        case = "%s %s T=%d --quant-act=fp8 refused%s" % (fam, dtype, T, " chips=2" if chips else "")
        with tally.case(case):
            p = subprocess.run([a.moec, "run", moe, "--target=tcp", "--weights", w, "--input", x, "--quant-act=fp8",
                                "-o", yp] + chips + cases.dtype_sets(dtype), capture_output=True, text=True)
            ok = (p.returncode == 1 and "error: --quant-act=fp8 applies to block-FP8 experts" in p.stderr and
                  not os.path.exists(yp))
            tally.check(case, ok, p.stderr.strip().splitlines()[0] if p.stderr.strip() else "rc %d" % p.returncode)


def act_took_effect(tally, moe, tag, ys):
    """A layer with 128 x 128 block-FP8 experts contracts them fp8 x fp8 under
    --quant-act=fp8: its one-chip output must differ from the bf16 one (else the
    comparison of the chips would not test the fp8 activation path)."""
    if "block=[128, 128]" not in open(moe).read() or ys.get("bf16") is None or ys.get("fp8") is None:
        return
    d = float(np.max(np.abs(ys["fp8"] - ys["bf16"])))
    tally.check(tag + " act=fp8 != bf16", d > 0, "one chip: max|y_fp8 - y_bf16| = %.3g" % d)


def bad_scale_case(moec, fixtures, tmp, tally):
    """fp8ch_llama4 stores down_proj_scale [E, D, 1] for the grid [E, 1, D]: the chips
    read its rows (compared above). A scale whose other dims differ ([E, D/2, 2], the same
    bytes) is still refused on 2 chips, naming the tensor, with no output written."""
    d = os.path.join(fixtures, "fp8ch_llama4")
    name = "model.layers.0.feed_forward.experts.down_proj_scale"
    case = "fp8ch_llama4 scale [E, D/2, 2] chips=2 refused"
    with tally.case(case):
        t = quant.read_st(os.path.join(d, "model.safetensors"))
        dt, shape, data = t[name]
        t[name] = (dt, [shape[0], shape[1] // 2, 2], data)
        ck, moe, y = (os.path.join(tmp, n) for n in ("bad.safetensors", "bad.moe", "bad.npy"))
        quant.write_st(ck, t)
        cases.import_layer(moec, d, 5, moe, 600)
        p = subprocess.run([moec, "run", moe, "--target=tcp", "--ep", "2", "--weights", ck, "--input",
                            os.path.join(d, "x_float32_T5.npy"), "-o", y], capture_output=True, text=True)
        ok = p.returncode == 1 and name in p.stderr and "error:" in p.stderr and not os.path.exists(y)
        tally.check(case, ok, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "rc %d" % p.returncode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moec")
    ap.add_argument("fixtures")
    ap.add_argument("--families", default=None)
    ap.add_argument("--tokens", default="5")
    ap.add_argument("--chips", default="2,4,8")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--quant-acts", default=None)
    a = ap.parse_args()
    fams = cases.families(a.fixtures, a.families)
    tally = cases.Tally(40)
    tokens = [int(t) for t in a.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        acts = a.quant_acts.split(",") if a.quant_acts else [None]
        for fam, dtype, T, x in cases.inputs(a.fixtures, fams, a.dtypes.split(","), tokens):
            moe = os.path.join(tmp, "layer.moe")
            imported = False
            with tally.case("%s %s T=%d (import)" % (fam, dtype, T)):
                cases.import_layer(a.moec, os.path.join(a.fixtures, fam), T, moe, 600)
                imported = True
            # --quant-act applies to block-FP8 experts only; on any other layer it is refused
            fam_acts = acts if not imported or acts == [None] or block_fp8(moe) else [None]
            if fam_acts != acts:
                act_refused(a, tally, fam, dtype, T, x, moe, tmp)
            ys = {act: compare(a, tally, tmp, fam, dtype, T, x, moe, act) for act in (fam_acts if imported else [])}
            act_took_effect(tally, moe, "%s %s T=%d" % (fam, dtype, T), ys)
        granule_case(a.moec, tmp, tally, a.tol)
        if "fp8ch_llama4" in fams:
            bad_scale_case(a.moec, a.fixtures, tmp, tally)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
