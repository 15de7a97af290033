#!/usr/bin/env python3
"""Expert parallelism over MPI equals the single-process run bit for bit.

For every fixture family and saved input x_{dtype}_T{T}.npy (T in --tokens):
    moec import-hf config.json --tokens T -o layer.moe
    moec run layer.moe ... --engine interp -o y1.npy               (one process)
    moec run layer.moe ... --kernels=portable -o yl.npy            (one process, LLVM)
    mpirun -n N moec run layer.moe --ep N [--engine E] ... -o yN.npy   (N in --ranks, E in --engines)
and require yN == y1 == yl bitwise. --engines: interp (each rank on the interpreter), llvm
(--kernels=portable) and c run each rank's phases compiled; default (no --engine: LLVM with
the kernels a plain run picks) is compared with a one-process run without --engine, and
writes --stats s.json: exactly one file (rank 0's), holding one entry per rank, nothing else
left beside it. Each mpirun has a time limit (--timeout),
so a hang fails the test instead of stalling it. $MOEC_MPIRUN names another mpirun
(mpirun.mpich for a moec built against MPICH).

usage: ep_mpi.py MOEC FIXTURES_DIR [--families a,b] [--tokens 1,5,64] [--ranks 2,3]
                 [--dtypes float32,bfloat16] [--engines interp,llvm,c] [--timeout S]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import cases


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
    return cases.run(cmd, timeout, mpi_env())


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
    ap.add_argument("--engines", default="interp")
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    ranks = [int(r) for r in a.ranks.split(",")]
    fams = cases.families(a.fixtures, a.families)
    tally = cases.Tally(44)
    with tempfile.TemporaryDirectory() as tmp:
        for fam, dtype, T, x in cases.inputs(a.fixtures, fams, a.dtypes.split(","), tokens):
            d = os.path.join(a.fixtures, fam)
            w = os.path.join(d, "model.safetensors")
            moe = os.path.join(tmp, "layer.moe")
            one = None
            with tally.case("%s %s T=%d (single process)" % (fam, dtype, T)):
                cases.import_layer(a.moec, d, T, moe, a.timeout)
                base = [a.moec, "run", moe, "--weights", w, "--input", x] + cases.dtype_sets(dtype)
                y1p, ylp = os.path.join(tmp, "y1.npy"), os.path.join(tmp, "yl.npy")
                run(base + ["--engine", "interp", "-o", y1p], a.timeout)
                run(base + ["--kernels=portable", "-o", ylp], a.timeout)
                one = np.load(y1p), np.load(ylp), None
                if "default" in a.engines.split(","):
                    ydp = os.path.join(tmp, "yd.npy")
                    run(base + ["-o", ydp], a.timeout)
                    one = one[0], one[1], np.load(ydp)
            if one is None:
                continue
            y1, yl, yd = one
            for n, eng in [(n, e) for n in ranks for e in a.engines.split(",")]:
                case = "%s %s T=%d ranks=%d%s" % (fam, dtype, T, n, "" if eng == "interp" else " " + eng)
                with tally.case(case):
                    yp = os.path.join(tmp, "y%d.npy" % n)
                    if eng == "default":
                        sdir = os.path.join(tmp, "stats%d" % n)
                        os.makedirs(sdir, exist_ok=True)
                        sp = os.path.join(sdir, "s.json")
                        run(mpirun_cmd(n) + base + ["--ep", str(n), "-o", yp, "--stats", sp], a.timeout)
                        y = np.load(yp)
                        st = json.load(open(sp))
                        ranks_in = [r["rank"] for r in st.get("ranks", [])]
                        ok = same_bits(y, yd) and st.get("ep") == n and ranks_in == list(range(n)) and \
                            st.get("engine") == "llvm" and os.listdir(sdir) == ["s.json"]
                        tally.check(case, ok, "%s the one-process LLVM output; stats: engine %s, ranks %s, files %s"
                                    % ("bitwise equal to" if same_bits(y, yd) else "DIFFERENT from",
                                       st.get("engine"), ranks_in, os.listdir(sdir)))
                        # an error every rank meets before MPI starts is printed once (rank 0's)
                        p = subprocess.run(mpirun_cmd(n) + base + ["--ep", str(n), "--repeat", "2", "-o", yp],
                                           capture_output=True, text=True, timeout=a.timeout, env=mpi_env())
                        said = (p.stdout + p.stderr).count("--repeat does not apply to --ep on the host")
                        tally.check(case + " one message", p.returncode != 0 and said == 1,
                                    "the option error printed %d time(s) by %d ranks" % (said, n))
                        continue
                    ex = {"interp": ["--engine", "interp"], "llvm": ["--engine", "llvm", "--kernels=portable"],
                          "c": ["--engine", "c"]}[eng]
                    run(mpirun_cmd(n) + base + ["--ep", str(n)] + ex + ["-o", yp], a.timeout)
                    y = np.load(yp)
                    ok = same_bits(y, y1) and same_bits(y, yl)
                    tally.check(case, ok, "bitwise %s the one-process interpreter and LLVM (portable) outputs"
                                % ("equal to" if ok else "DIFFERENT from"))
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
