#!/usr/bin/env python3
"""Expert parallelism over MPI equals the single-process run bit for bit.

For every fixture family and saved input x_{dtype}_T{T}.npy (T in --tokens):
    moec import-hf config.json --tokens T -o layer.moe
    moec run layer.moe ... --engine interp -o y1.npy               (one process)
    moec run layer.moe ... --kernels=portable -o yl.npy            (one process, LLVM)
    mpirun -n N moec run layer.moe --ep N ... -o yN.npy            (N ranks, N in --ranks)
and require yN == y1 == yl bitwise. Each mpirun has a time limit (--timeout),
so a hang fails the test instead of stalling it. $MOEC_MPIRUN names another mpirun
(mpirun.mpich for a moec built against MPICH).

usage: ep_mpi.py MOEC FIXTURES_DIR [--families a,b] [--tokens 1,5,64] [--ranks 2,3]
                 [--dtypes float32,bfloat16] [--timeout S]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def mpirun_cmd(n):
    """mpirun -n N ($MOEC_MPIRUN, default mpirun) with oversubscription (2 cores run 3
    ranks) for Open MPI; MPICH's hydra oversubscribes as it is."""
    mpirun = os.environ.get("MOEC_MPIRUN", "mpirun")
    v = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    if "Open MPI" in v.stdout + v.stderr or "OpenRTE" in v.stdout + v.stderr:
        return [mpirun, "--oversubscribe", "-n", str(n)]
    return [mpirun, "-n", str(n)]


def mpi_env():
    env = dict(os.environ)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    return env


def run(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env())
    if p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return p


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moec")
    ap.add_argument("fixtures")
    ap.add_argument("--families", default=None)
    ap.add_argument("--tokens", default="1,5,64")
    ap.add_argument("--ranks", default="2,3")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    ranks = [int(r) for r in a.ranks.split(",")]
    fams = sorted(d for d in os.listdir(a.fixtures) if os.path.isfile(os.path.join(a.fixtures, d, "config.json")))
    if a.families:
        fams = [f for f in fams if f in a.families.split(",")]
    failed, passed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for fam in fams:
            d = os.path.join(a.fixtures, fam)
            w = os.path.join(d, "model.safetensors")
            for dtype in a.dtypes.split(","):
                for T in tokens:
                    x = os.path.join(d, "x_%s_T%d.npy" % (dtype, T))
                    if not os.path.exists(x):
                        continue
                    moe = os.path.join(tmp, "layer.moe")
                    sets = ["--set", "dtype=bf16"] if dtype == "bfloat16" else []
                    try:
                        run([a.moec, "import-hf", os.path.join(d, "config.json"), "--tokens", str(T), "-o", moe], a.timeout)
                        base = [a.moec, "run", moe, "--weights", w, "--input", x] + sets
                        y1p, ylp = os.path.join(tmp, "y1.npy"), os.path.join(tmp, "yl.npy")
                        run(base + ["--engine", "interp", "-o", y1p], a.timeout)
                        run(base + ["--kernels=portable", "-o", ylp], a.timeout)
                        y1, yl = np.load(y1p), np.load(ylp)
                    except Exception as e:
                        print("FAIL %s %s T=%d: single process: %s" % (fam, dtype, T, e))
                        failed.append("%s %s T=%d" % (fam, dtype, T))
                        continue
                    for n in ranks:
                        case = "%s %s T=%d ranks=%d" % (fam, dtype, T, n)
                        try:
                            yp = os.path.join(tmp, "y%d.npy" % n)
                            run(mpirun_cmd(n) + base + ["--ep", str(n), "-o", yp], a.timeout)
                            y = np.load(yp)
                            ok = same_bits(y, y1) and same_bits(y, yl)
                            print("%-4s %-44s bitwise %s the one-process interpreter and LLVM (portable) outputs"
                                  % ("ok" if ok else "FAIL", case, "equal to" if ok else "DIFFERENT from"))
                            if ok:
                                passed += 1
                            else:
                                failed.append(case)
                        except Exception as e:
                            print("FAIL %s: %s" % (case, e))
                            failed.append(case)
    print("%d passed, %d failed" % (passed, len(failed)))
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
