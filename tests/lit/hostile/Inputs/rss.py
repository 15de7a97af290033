"""rss.py LIMIT_MIB CMD...: runs CMD, prints its stderr, and fails unless it
exited non-zero within 10 s with a peak RSS under LIMIT_MIB (the child's
ru_maxrss)."""
import resource
import subprocess
import sys
import time

limit = int(sys.argv[1])
t0 = time.monotonic()
r = subprocess.run(sys.argv[2:], stderr=subprocess.PIPE, text=True, errors="replace")
secs = time.monotonic() - t0
mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
sys.stdout.write(r.stderr)
if r.returncode == 0 or r.returncode < 0 or secs > 10 or mib >= limit:
    sys.exit("rc %d, %.1f s, peak RSS %d MiB (limit %d)" % (r.returncode, secs, mib, limit))
