#!/usr/bin/env python3
"""weights_fast.py MOEC EXAMPLES FIXTURES OUTDIR: a real-size layer
(examples/mixtral_8x7b.moe, 2.6 GB of weights) run against the tiny Mixtral
fixture checkpoint must fail on the router's shape from the checkpoint
headers alone: exit 1, within 0.2 s of CPU time, and without allocating any
weight, with a peak RSS (/usr/bin/time -v) under 50 MB. The moec command links
LLVM's static components (CMake option MOEC_LLVM_STATIC_CLI) for this: linked to
Debian's libLLVM.so it starts at about 51 MB before main runs. Without that option
the bound applies to the peak above `moec --version`'s. The figures are printed. Not timed in sanitizer builds (MOEC_TEST_SANITIZED=1)."""
import os
import re
import subprocess
import sys

moec, examples, fixtures, out = sys.argv[1:5]


def timed(args):
    p = subprocess.run(["/usr/bin/time", "-v"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = p.stderr.decode()
    field = lambda name: re.search(re.escape(name) + r": ([0-9.:]+)", err).group(1)
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    rss = int(field("Maximum resident set size (kbytes)"))
    status = int(field("Exit status"))
    return status, cpu, rss, err


y = os.path.join(out, "never.npy")
status, cpu, rss, err = timed([moec, "run", os.path.join(examples, "mixtral_8x7b.moe"),
                               "--weights", os.path.join(fixtures, "hf", "mixtral", "model.safetensors"),
                               "--input", os.path.join(fixtures, "hf", "mixtral", "x_float32_T5.npy"), "-o", y])
_, _, floor, _ = timed([moec, "--version"])
print(err)
print(f"weights_fast: exit {status}, {cpu:.3f} s CPU, peak RSS {rss / 1024:.1f} MB "
      f"(moec --version: {floor / 1024:.1f} MB; above it: {(rss - floor) / 1024:.1f} MB)")
bad = []
if status != 1:
    bad.append(f"exit status {status}, not 1")
if os.path.exists(y):
    bad.append("an output was written")
if os.environ.get("MOEC_TEST_SANITIZED") != "1":
    if cpu >= 0.2:
        bad.append(f"{cpu:.3f} s of CPU, not under 0.2 s")
    static_cli = os.environ.get("MOEC_LLVM_STATIC_CLI", "1") == "1"
    if static_cli and rss >= 50 * 1024:
        bad.append(f"peak RSS {rss / 1024:.1f} MB, not under 50 MB")
    if not static_cli and rss - floor >= 50 * 1024:
        bad.append(f"{(rss - floor) / 1024:.1f} MB above moec --version, not under 50 MB")
if bad:
    print("weights_fast: " + "; ".join(bad))
    sys.exit(1)
