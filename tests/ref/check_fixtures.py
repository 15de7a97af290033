#!/usr/bin/python3
"""Check tests/ref/moe_ref.py against HuggingFace-written MoE fixtures.

For every family folder of FIXTURES_DIR (config.json, model.safetensors, x_<dtype>_T<n>.npy,
y_<dtype>_T<n>.npy) run the reference on x in <dtype> and compare with y.  Prints
max|err| / max|y| per case; exits 0 only if every case is within tolerance
(float32: 1e-5, bfloat16: 1e-2 relative to max|y|) and at least one case ran.

  /usr/bin/python3 tests/ref/check_fixtures.py tests/fixtures/hf
"""
import argparse
import json
import glob
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_ref  # noqa: E402

TOL = {"float32": 1e-5, "bfloat16": 1e-2}


def main(argv=None):
    ap = argparse.ArgumentParser(description="compare moe_ref with HF fixtures")
    ap.add_argument("fixtures_dir", help="folder holding one sub-folder per family")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    failures, cases = 0, 0
    for folder in sorted(glob.glob(os.path.join(a.fixtures_dir, "*", "config.json"))):
        folder = os.path.dirname(folder)
        name = os.path.basename(folder)
        cfg = json.load(open(os.path.join(folder, "config.json")))
        tensors = moe_ref.read_safetensors(os.path.join(folder, "model.safetensors"))
        for xf in sorted(glob.glob(os.path.join(folder, "x_*.npy"))):
            m = re.match(r"x_(float32|bfloat16)_(T\d+)\.npy$", os.path.basename(xf))
            if not m:
                continue
            dtype, tag = m.groups()
            yf = os.path.join(folder, f"y_{dtype}_{tag}.npy")
            y_ref = np.load(yf)
            try:
                y, _ = moe_ref.run(cfg, tensors, np.load(xf), 0, dtype)
                scale = float(np.abs(y_ref).max()) or 1.0
                err = float(np.abs(y.astype(np.float64) - y_ref).max())
                rel = err / scale
                ok = y.shape == y_ref.shape and rel <= TOL[dtype]
                msg = f"max|err| {err:.3e}  max|y| {scale:.3e}  rel {rel:.3e}"
            except Exception as exc:  # a crash is a failure of this case, keep going
                ok, msg = False, f"error: {exc}"
            cases += 1
            failures += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {name:12s} {dtype:9s} {tag:4s} {msg}")
    print(f"{cases - failures}/{cases} cases pass")
    return 0 if cases and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
