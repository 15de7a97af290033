#!/usr/bin/env python3
"""End-to-end check against HuggingFace's own MoE blocks.

For every fixture folder (written by transformers itself, see
tests/fixtures/hf/README.md) and every saved input, run
    moec import-hf config.json --tokens T -o layer.moe
    moec run layer.moe --weights model.safetensors --input x.npy -o y.npy --target=TARGET
and require max|y - y_hf| <= tol * max|y_hf|: 1e-4 for float32 on the host,
2e-2 for bfloat16 and for every TCP run. Where HF adds a shared MLP outside
its block (granitemoeshared), y_hf is the block's y plus that MLP's saved
output (yshared_*.npy).

FIXTURES_DIR is tests/fixtures/hf (the checkpoints of the families' ForCausalLM or
image-text class) or one of its classes/<class> folders (the checkpoints other classes of
the same models wrote, some kept as rebuild.json: tests/e2e/hf_rebuild.py).

Ties: in bf16 two experts' selection scores can be exactly equal at the K-th
place; moec takes the lower index, torch.topk promises none. Such rows are
found by recomputing the layer's selection scores in its dtype (the same .moe
with the operand of its top-K selection as the output) and are counted apart;
every other row must match.

usage: hf_fixtures.py MOEC FIXTURES_DIR [--target host|tcp] [--engine llvm|c] [--families a,b]
                      [--tokens N] [--all-tokens a,b]
  --tokens N      run only the T=N inputs, except for the families of --all-tokens
  --exclude a,b   leave these families out (tests/CMakeLists.txt says why)
"""
import argparse
import os
import re
import sys
import tempfile

import numpy as np

import cases
import hf_rebuild

TOL = {("host", "float32"): 1e-4, ("host", "bfloat16"): 2e-2,
       ("tcp", "float32"): 2e-2, ("tcp", "bfloat16"): 2e-2}


run = cases.run


def tied_rows(a, moe, xpath, dtype, tmp):
    """Rows whose K-th and (K+1)-th selection scores are equal, recomputed in the layer's dtype."""
    text = open(moe).read()
    m = re.search(r"^  idx\s+= topk\((\w+), k=K\)", text, re.M)
    kd = re.search(r"K = (\d+)", text)
    if not m or not kd:
        return None
    K = int(kd.group(1))
    smoe = os.path.join(tmp, "scores.moe")
    open(smoe, "w").write(re.sub(r"^  output y(,.*)?$", "  output " + m.group(1), text, flags=re.M))
    spath = os.path.join(tmp, "scores.npy")
    cmd = [a.moec, "run", smoe, "--weights", a.weights, "--input", xpath, "-o", spath]
    if dtype == "bfloat16":
        cmd += ["--set", "dtype=bf16"]
    if a.engine:  # the host engine of the run (the scores are recomputed on the host)
        cmd += ["--engine=" + a.engine]
    run(cmd)
    sc = np.load(spath)
    sc = sc.reshape(sc.shape[0], -1)
    if K >= sc.shape[1]:
        return np.zeros(sc.shape[0], dtype=bool)
    srt = -np.sort(-sc, axis=1)
    return srt[:, K - 1] == srt[:, K]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moec")
    ap.add_argument("fixtures")
    ap.add_argument("--target", default="host")
    ap.add_argument("--engine", default=None)
    ap.add_argument("--families", default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--all-tokens", default="")
    ap.add_argument("--exclude", default="")
    a = ap.parse_args()
    full = set(x for x in a.all_tokens.split(",") if x)
    fams = cases.families(a.fixtures, a.families, a.exclude)
    tally = cases.Tally(32)

    def wanted(fam, T):
        return a.tokens is None or T == a.tokens or fam in full

    with tempfile.TemporaryDirectory() as tmp:
        for fam, dtype, T, xpath in cases.inputs(a.fixtures, fams, tokens=wanted):
            d = os.path.join(a.fixtures, fam)
            case = "%s %s T=%d %s" % (fam, dtype, T, a.target)
            with tally.case(case):
                weights = hf_rebuild.checkpoint(d, tmp)
                moe = cases.import_layer(a.moec, d, T, os.path.join(tmp, "%s.moe" % fam))
                ypath = os.path.join(tmp, "y.npy")
                cmd = [a.moec, "run", moe, "--weights", weights,
                       "--input", xpath, "-o", ypath, "--target=" + a.target] + cases.dtype_sets(dtype)
                if a.engine:
                    cmd += ["--engine=" + a.engine]
                run(cmd)
                y = np.load(ypath)
                ref = np.load(os.path.join(d, "y_%s_T%d.npy" % (dtype, T))).astype(np.float64)
                # a shared MLP outside HF's block whose output the layer adds (granitemoeshared):
                # the fixture holds HF's output of it on the same x, the import includes it
                ysh = os.path.join(d, "yshared_%s_T%d.npy" % (dtype, T))
                if os.path.exists(ysh):
                    ref = ref + np.load(ysh)
                if y.shape != ref.shape:
                    raise RuntimeError("shape %s, expected %s" % (y.shape, ref.shape))
                rowerr = np.max(np.abs(y.astype(np.float64) - ref), axis=1)
                scale = float(np.max(np.abs(ref)))
                tol = TOL[(a.target, dtype)]
                note = ""
                if dtype == "bfloat16" and np.max(rowerr) > tol * scale:
                    a.weights = weights
                    ties = tied_rows(a, moe, xpath, dtype, tmp)
                    if ties is not None and ties.any():
                        rowerr = rowerr[~ties]
                        note = ", %d tied row(s) of %d counted apart" % (int(ties.sum()), T)
                err = float(np.max(rowerr)) if rowerr.size else 0.0
                tally.check(case, err <= tol * scale, "max|err| = %.3e = %.2e x max|y| (tolerance %.0e%s)"
                            % (err, err / scale, tol, note))
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
