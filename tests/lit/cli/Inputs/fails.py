#!/usr/bin/env python3
"""fails.py CMD ARGS...: runs CMD and passes only when it fails the way moec
promises: exit status exactly 1, at least one and at most 20 lines of
`error:`, within a second of CPU time (user + system, which the load of a
shared machine does not inflate the way it does wall time; MOEC_FAILS_SECONDS
overrides; not checked in sanitizer builds, MOEC_TEST_SANITIZED=1). Prints
CMD's stderr then stdout, for FileCheck."""
import os
import resource
import subprocess
import sys
import time

limit = float(os.environ.get("MOEC_FAILS_SECONDS", "1.0"))
t0 = time.monotonic()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the only child
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
cpu = ru.ru_utime + ru.ru_stime
if os.environ.get("MOEC_TEST_SANITIZED") != "1" and cpu >= limit:
    bad.append(f"took {cpu:.3f} s of CPU ({wall:.3f} s wall), not under {limit} s")
if bad:
    sys.stderr.write("fails.py: " + "; ".join(bad) + "\n")
    sys.exit(1)
