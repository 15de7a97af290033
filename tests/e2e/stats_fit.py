#!/usr/bin/env python3
"""`moec stats --target=tcp` tells whether a layer fits the chip's HBM, and agrees with
`moec compile`: for every committed published config (tests/fixtures/configs, the layers
published_configs.py names) at T in {1, 4096}, in the config's dtype and in f32, the layer is
compiled for TCP and its stats are taken. Where compile succeeds, stats prints
"TCP HBM X GiB needed (weights W GiB) of C GiB: fits" with X <= C, then the whole program's
time predicted on expected loads ("TCP layer predicted P on expected loads ...", P > 0,
moe_tcp_predict) and exits 0; where compile refuses, stats exits 1 with exactly the error lines
compile printed.

Since stats runs the compiled program's timing on expected loads, a program that compiles but
faults on the simulator fails here (Llama-4 at T = 4096 did: its block loop copied the next
block's rows from the block buffer instead of the dispatch grid).

usage: stats_fit.py MOEC CONFIGS_DIR"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from published_configs import MODELS  # noqa: E402

LINE = re.compile(r"^TCP HBM ([0-9.]+) GiB needed \(weights ([0-9.]+) GiB\) of ([0-9.]+) GiB: fits$", re.M)
PRED = re.compile(r"^TCP layer predicted ([0-9.e+]+) (s|ms|us) on expected loads .*roofline ([0-9.e+]+) (s|ms|us), "
                  r"([0-9.]+)x$", re.M)
SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def errors(text):
    return [ln for ln in text.splitlines() if "error:" in ln]


def main():
    moec, d = sys.argv[1], sys.argv[2]
    bad = refused = fits = 0
    predicted = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in sorted(MODELS.items()):
            layer = spec[0]
            cfg = os.path.join(d, name + ".json")
            for dtype in (None, "f32"):
                for T in (1, 4096):
                    moe = os.path.join(tmp, "l.moe")
                    out = os.path.join(tmp, "l.tcpb")
                    imp = [moec, "import-hf", cfg, "--layer", str(layer), "--tokens", str(T), "-o", moe]
                    if dtype:
                        imp += ["--set", "dtype=" + dtype]
                    p = subprocess.run(imp, capture_output=True, text=True)
                    label = "%-36s %-6s T=%-4d" % (name, dtype or "config", T)
                    if p.returncode != 0:
                        print("FAIL %s import-hf: %s" % (label, p.stderr.strip()[:300]))
                        bad += 1
                        continue
                    c = subprocess.run([moec, "compile", moe, "-o", out], capture_output=True, text=True)
                    s = subprocess.run([moec, "stats", moe, "--target=tcp"], capture_output=True, text=True)
                    m = LINE.search(s.stdout)
                    pm = PRED.search(s.stdout)
                    if c.returncode == 0:
                        ok = s.returncode == 0 and m is not None and float(m.group(1)) <= float(m.group(3))
                        what = m.group(0) if m else "no HBM line: " + s.stdout[:200] + s.stderr[:200]
                        pred = float(pm.group(1)) * SCALE[pm.group(2)] if pm else 0.0
                        ok = ok and pred > 0
                        what += "; predicted %.4g s" % pred if pm else "; no prediction: " + s.stderr[-200:]
                        fits += ok
                        predicted.append(pred)
                    else:
                        ok = s.returncode == 1 and errors(s.stderr) == errors(c.stderr) and errors(c.stderr) != []
                        what = "refused by both: " + (errors(c.stderr)[:1] or ["?"])[0][-150:]
                        if not ok:
                            what = "compile: %r; stats (rc %d): %r" % (errors(c.stderr), s.returncode,
                                                                      errors(s.stderr) or s.stdout[:200])
                        refused += ok
                    print("%-4s %s %s" % ("ok" if ok else "FAIL", label, what))
                    bad += not ok
                    for f in (moe, out):
                        if os.path.exists(f):
                            os.unlink(f)
    print("%d cases: %d fit (%d with a predicted time), %d refused by compile and stats alike, %d failed" % (
        fits + refused + bad, fits, sum(p > 0 for p in predicted), refused, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
