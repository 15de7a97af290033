#!/usr/bin/env python3
"""moec run --target=host against the independent PyTorch reference (tests/ref)
on random layers of every family and of the seed design, including T=1,
n = T*K < E, every token routed to one expert, exact score ties, E = 7 and
E = 13 (multiples of nothing), and block sizes larger than T.

usage: ref_random.py MOEC REPO_ROOT [--engine llvm|c|interp] [--target host|tcp]
Tolerances: max|y - y_ref| <= 1e-4 * max|y_ref| (float32), 2e-2 (bfloat16, tcp).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))


def main():
    moec, root = sys.argv[1], sys.argv[2]
    engine = sys.argv[sys.argv.index("--engine") + 1] if "--engine" in sys.argv else "llvm"
    target = sys.argv[sys.argv.index("--target") + 1] if "--target" in sys.argv else "host"
    failed, passed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        suite = os.path.join(tmp, "suite")
        run([sys.executable, os.path.join(root, "tests/ref/make_layer.py"), "--suite", suite])
        for name in sorted(os.listdir(suite)):
            d = os.path.join(suite, name)
            case = json.load(open(os.path.join(d, "case.json")))
            dt = "bf16" if case["ref_dtype"] == "bfloat16" else "f32"
            for B in case["B"]:
                label = "%s B=%d %s" % (name, B, dt)
                try:
                    moe = os.path.join(tmp, "l.moe")
                    sets = ["--set", "dtype=" + dt]
                    if case["family"] == "seed":
                        moe = os.path.join(root, "examples/seed.moe")
                        for k in ("T", "D", "F", "E", "K"):
                            sets += ["--set", "%s=%d" % (k, case[k])]
                        sets += ["--set", "B=%d" % B]
                    else:
                        run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", str(case["T"]),
                             "--block", str(B), "--set", "dtype=" + dt, "-o", moe])
                    y = os.path.join(tmp, "y.npy")
                    run([moec, "run", moe, "--weights", os.path.join(d, "model.safetensors"), "--input",
                         os.path.join(d, "x.npy"), "-o", y, "--target=" + target]
                        + (["--engine=" + engine] if target == "host" else []) + sets)
                    got, ref = np.load(y).astype(np.float64), np.load(os.path.join(d, "y.npy")).astype(np.float64)
                    err, scale = float(np.max(np.abs(got - ref))), float(np.max(np.abs(ref)))
                    tol = 1e-4 if dt == "f32" and target == "host" else 2e-2
                    ok = got.shape == ref.shape and err <= tol * scale
                    print("%-4s %-36s max|err| = %.2e x max|y|" % ("ok" if ok else "FAIL", label, err / scale))
                    if ok:
                        passed += 1
                    else:
                        failed.append(label)
                except Exception as e:
                    print("FAIL %s: %s" % (label, e))
                    failed.append(label)
    print("%d passed, %d failed" % (passed, len(failed)))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
