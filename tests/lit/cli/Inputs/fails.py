#!/usr/bin/env python3
"""fails.py CMD ARGS...: runs CMD and passes only when it fails the way moec
promises: exit status exactly 1, at most 20 lines of `error:`, no Python-style
crash, within a second (MOEC_FAILS_SECONDS overrides; timing is not checked in
sanitizer builds, MOEC_TEST_SANITIZED=1). Prints CMD's stderr then stdout, for
FileCheck."""
import os
import subprocess
import sys
import time

limit = float(os.environ.get("MOEC_FAILS_SECONDS", "1.0"))
t0 = time.monotonic()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
dt = time.monotonic() - t0
err = p.stderr.decode("utf-8", "replace")
sys.stdout.write(err)
sys.stdout.write(p.stdout.decode("utf-8", "replace"))
errors = sum(1 for line in err.splitlines() if "error:" in line)
bad = []
if p.returncode != 1:
    bad.append(f"exit status {p.returncode}, not 1")
if errors == 0:
    bad.append("no error line")
if errors > 20:
    bad.append(f"{errors} error lines, more than 20")
if os.environ.get("MOEC_TEST_SANITIZED") != "1" and dt >= limit:
    bad.append(f"took {dt:.3f} s, not under {limit} s")
if bad:
    sys.stderr.write("fails.py: " + "; ".join(bad) + "\n")
    sys.exit(1)
