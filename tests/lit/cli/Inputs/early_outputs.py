"""Every output of every command is checked before any work: for -o, --stats,
--trace and --reproducer, a missing directory, a directory that is a regular
file, an unwritable directory (run as `nobody` through setpriv when the test
runs as root, else a mode 0555 directory) and an output that is an input each
fail in under 0.5 s, with an error naming the output, before the 1 GB sparse
checkpoint is read (its content is zeros: a read would fail on its header
instead), and nothing is written anywhere in the test's directory.

usage: early_outputs.py MOEC MOE_FILE X_NPY WORKDIR"""
import os
import resource
import shutil
import subprocess
import sys

moec, src, xnpy, work = sys.argv[1:5]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chmod(work, 0o755)
layer = os.path.join(work, "m.moe")
x = os.path.join(work, "x.npy")
ck = os.path.join(work, "w.safetensors")
shutil.copy(src, layer)
shutil.copy(xnpy, x)
with open(ck, "wb") as f:
    f.truncate(1 << 30)  # sparse: no block written
for p in (layer, x, ck):
    os.chmod(p, 0o644)
afile = os.path.join(work, "afile")
open(afile, "w").close()
ro = os.path.join(work, "ro")
os.makedirs(ro)
os.chmod(ro, 0o555)
as_nobody = os.geteuid() == 0 and shutil.which("setpriv")
if os.geteuid() == 0 and not as_nobody:
    sys.exit("early_outputs: running as root without setpriv: cannot test an unwritable directory")


def listing():
    out = []
    for d, _, files in os.walk(work):
        out += [os.path.join(d, f) for f in files]
    return sorted(out)


before = listing()
run = ["run", layer, "--weights", ck, "--input", x]
tcp = run + ["--target=tcp"]
# (option, argv with {} for the output, needs another output)
cases = [
    ("-o", run + ["-o", "{}"]),
    ("--stats", run + ["-o", os.path.join(work, "y.npy"), "--stats", "{}"]),
    ("--trace", tcp + ["-o", os.path.join(work, "y.npy"), "--trace", "{}"]),
    ("-o", ["compile", layer, "--target=c", "-o", "{}"]),
    ("-o", ["ir", layer, "-o", "{}"]),
    ("--reproducer", ["ir", layer, "--pipeline=host", "--reproducer", "{}"]),
]
targets = {
    "missing": (os.path.join(work, "nodir", "out.json"), "does not exist"),
    "parent-is-file": (os.path.join(afile, "out.json"), "is not a directory"),
    "unwritable": (os.path.join(ro, "out.json"), "is not writable"),
    "input": (ck, "the output is the input file"),
}
n = 0
for opt, argv in cases:
    for what, (path, msg) in targets.items():
        if what == "input" and argv[0] != "run":
            path = layer  # the layer is the input of compile and ir
        cmd = [moec] + [a.replace("{}", path) for a in argv]
        if what == "unwritable" and as_nobody:
            cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] + cmd
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(cmd, capture_output=True, text=True)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the command's own time (user + system CPU), which the load of a shared
        # machine does not stretch as it stretches the wall clock
        dt = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
        label = "%s %s %s" % (argv[0], opt, what)
        if r.returncode != 1:
            sys.exit("%s: exit %d, want 1\n%s" % (label, r.returncode, r.stderr))
        if msg not in r.stderr or "header" in r.stderr:
            sys.exit("%s: want an error '%s' before the checkpoint is read, got:\n%s" % (label, msg, r.stderr))
        if dt > 0.5 and os.environ.get("MOEC_TEST_SANITIZED") != "1":
            sys.exit("%s: took %.3f s of CPU (limit 0.5 s)" % (label, dt))
        if listing() != before:
            sys.exit("%s: wrote %s" % (label, sorted(set(listing()) - set(before))))
        n += 1
print("early_outputs: %d cases refused before any work, nothing written%s" %
      (n, " (unwritable: as nobody)" if as_nobody else ""))
