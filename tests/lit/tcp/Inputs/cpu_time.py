"""Runs a command (argv[2:]) and prints whether its CPU time, user and
system of the child alone, stayed under argv[1] seconds; exits with the
command's status when it fails."""
import resource
import subprocess
import sys

limit = float(sys.argv[1])
r = subprocess.run(sys.argv[2:], check=False)
if r.returncode != 0:
    sys.exit(r.returncode)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the only child
cpu = ru.ru_utime + ru.ru_stime
print("cpu %.2f s" % cpu)
print("cpu under %s s: %s" % (sys.argv[1], cpu < limit))
