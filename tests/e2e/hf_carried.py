#!/usr/bin/env python3
"""A router state carried between layers (ZAYA1), against HuggingFace's own blocks.

The zaya fixture (tests/fixtures/hf/README.md) is a two-layer model. Its layer 0 block
takes x alone and passes on a router state; its layer 1 block adds that state to its own
router's down-projection. For each saved case this checks, through `import-hf` + `run`:
- layer 0: the second output (the router state passed on) against the state HF's layer 1
  received on the same run (carried_s_*), the first output (y) is checked by hf_fixtures.py;
- layer 1, given x and the carried state as inputs (`--input x=...,router_state=...`):
  y against HF's (carried_y_*) and the state it passes on against HF's (carried_snext_*).
Tolerances are hf_fixtures.py's (host f32 1e-4 x max|ref|, bf16 and TCP 2e-2). A reference
that is all zero (a single token that picked the skip class) must be matched exactly.

FIXTURES_DIR may also be classes/text (the checkpoint ZAYA's text model class wrote).

usage: hf_carried.py MOEC FIXTURES_DIR [--target host|tcp] [--engine llvm|c|interp]
"""
import argparse
import os
import re
import sys
import tempfile

import numpy as np

import cases
import hf_rebuild
from hf_fixtures import TOL

FAMILY = "zaya"


def run_layer(a, d, layer, T, dtype, inputs, output, tmp):
    """The layer's output named `output` (the .moe's output line rewritten to it)."""
    moe = os.path.join(tmp, "l%d_T%d.moe" % (layer, T))
    cases.run([a.moec, "import-hf", os.path.join(d, "config.json"), "--tokens", str(T),
               "--layer", str(layer), "-o", moe])
    text = open(moe).read()
    text, n = re.subn(r"^  output y, rstate\b.*$", "  output " + output, text, flags=re.M)
    if n != 1:
        raise RuntimeError("%s: no 'output y, rstate' line" % moe)
    moe_o = os.path.join(tmp, "l%d_T%d_%s.moe" % (layer, T, output))
    open(moe_o, "w").write(text)
    ypath = os.path.join(tmp, "out.npy")
    cmd = [a.moec, "run", moe_o, "--weights", hf_rebuild.checkpoint(d, tmp), "--input",
           ",".join("%s=%s" % kv for kv in inputs), "-o", ypath, "--target=" + a.target]
    cmd += cases.dtype_sets(dtype)
    if a.engine:
        cmd += ["--engine=" + a.engine]
    cases.run(cmd)
    return np.load(ypath)


def compare(tally, case, got, ref_path, tol):
    ref = np.load(ref_path).astype(np.float64)
    if got.shape != ref.shape:
        raise RuntimeError("shape %s, expected %s" % (got.shape, ref.shape))
    err = float(np.max(np.abs(got.astype(np.float64) - ref)))
    scale = float(np.max(np.abs(ref)))
    if scale == 0.0:
        tally.check(case, err == 0.0, "max|err| = %.3e, reference all zero (exact match required)" % err)
    else:
        tally.check(case, err <= tol * scale, "max|err| = %.3e = %.2e x max|ref| (tolerance %.0e)"
                    % (err, err / scale, tol))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moec")
    ap.add_argument("fixtures")
    ap.add_argument("--target", default="host")
    ap.add_argument("--engine", default=None)
    a = ap.parse_args()
    d = os.path.join(a.fixtures, FAMILY)
    tally = cases.Tally(44)
    found = sorted((dt, int(T)) for dt, T in
                   (re.match(r"carried_x_(\w+)_T(\d+)\.npy$", n).groups() for n in os.listdir(d)
                    if re.match(r"carried_x_(\w+)_T(\d+)\.npy$", n)))
    if not found:
        print("no carried_x_*.npy in %s" % d)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for dtype, T in found:
            tol = TOL[(a.target, dtype)]
            f = lambda kind: os.path.join(d, "%s_%s_T%d.npy" % (kind, dtype, T))  # noqa: E731
            case = "%s layer 0 state %s T=%d %s" % (FAMILY, dtype, T, a.target)
            with tally.case(case):
                got = run_layer(a, d, 0, T, dtype, [("x", f("x"))], "rstate", tmp)
                compare(tally, case, got, f("carried_s"), tol)
            ins = [("x", f("carried_x")), ("router_state", f("carried_s"))]
            for out, ref in (("y", "carried_y"), ("rstate", "carried_snext")):
                case = "%s layer 1 %s %s T=%d %s" % (FAMILY, out, dtype, T, a.target)
                with tally.case(case):
                    got = run_layer(a, d, 1, T, dtype, ins, out, tmp)
                    compare(tally, case, got, f(ref), tol)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
