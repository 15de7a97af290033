#!/usr/bin/env python3
"""Expert parallelism on N simulated TCP chips equals one chip.

For every fixture family and saved input x_{dtype}_T{T}.npy (T in --tokens):
    moec import-hf config.json --tokens T -o layer.moe           (its block size B)
    moec run layer.moe --target=tcp --set B=B -o y1.npy           (one chip, the same B)
    moec run layer.moe --target=tcp --ep N --stats s.json -o yN.npy   (N in --chips, N <= E)
and require max|yN - y1| <= 1e-6 max|y1| (--tol), and the stats to account for every
chip: link bytes out and in summing to the same total over the chips.

usage: ep_tcp.py MOEC FIXTURES_DIR [--families a,b] [--tokens 5] [--chips 2,4,8] [--dtypes float32]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moec")
    ap.add_argument("fixtures")
    ap.add_argument("--families", default=None)
    ap.add_argument("--tokens", default="5")
    ap.add_argument("--chips", default="2,4,8")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--tol", type=float, default=1e-6)
    a = ap.parse_args()
    fams = sorted(d for d in os.listdir(a.fixtures) if os.path.isfile(os.path.join(a.fixtures, d, "config.json")))
    if a.families:
        fams = [f for f in fams if f in a.families.split(",")]
    failed, passed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for fam in fams:
            d = os.path.join(a.fixtures, fam)
            w = os.path.join(d, "model.safetensors")
            for dtype in a.dtypes.split(","):
                for T in [int(t) for t in a.tokens.split(",")]:
                    x = os.path.join(d, "x_%s_T%d.npy" % (dtype, T))
                    if not os.path.exists(x):
                        continue
                    moe = os.path.join(tmp, "layer.moe")
                    sets = ["--set", "dtype=bf16"] if dtype == "bfloat16" else []
                    try:
                        run([a.moec, "import-hf", os.path.join(d, "config.json"), "--tokens", str(T), "-o", moe])
                        text = open(moe).read()
                        B = re.search(r"\bB = (\d+)", text).group(1)
                        E = int(re.search(r"\bE = (\d+)", text).group(1))
                        base = [a.moec, "run", moe, "--target=tcp", "--weights", w, "--input", x] + sets
                        y1p = os.path.join(tmp, "y1.npy")
                        run(base + ["--set", "B=" + B, "-o", y1p])
                        y1 = np.load(y1p).astype(np.float64)
                    except Exception as e:
                        print("FAIL %s %s T=%d: one chip: %s" % (fam, dtype, T, e))
                        failed.append("%s %s T=%d" % (fam, dtype, T))
                        continue
                    for n in [int(c) for c in a.chips.split(",")]:
                        if n > E:
                            continue
                        case = "%s %s T=%d chips=%d" % (fam, dtype, T, n)
                        try:
                            yp, sp = os.path.join(tmp, "yn.npy"), os.path.join(tmp, "s.json")
                            run(base + ["--ep", str(n), "--stats", sp, "-o", yp])
                            y = np.load(yp).astype(np.float64)
                            s = json.load(open(sp))
                            scale = float(np.max(np.abs(y1))) or 1.0
                            rel = float(np.max(np.abs(y - y1))) / scale
                            chips = s["chips"]
                            bytes_ok = (len(chips) == n and sum(c["link_bytes_out"] for c in chips) ==
                                        sum(c["link_bytes_in"] for c in chips))
                            ok = y.shape == y1.shape and rel <= a.tol and bytes_ok
                            print("%-4s %-40s max|y - y1| = %.2e x max|y1|, %s, link %d bytes, %.2f us"
                                  % ("ok" if ok else "FAIL", case, rel, "bitwise" if (y == y1).all() else "not bitwise",
                                     sum(c["link_bytes_out"] for c in chips), s["link_seconds"] * 1e6))
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
