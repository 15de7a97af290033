#!/usr/bin/env python3
"""readme_walk.py MOEC SRCROOT: runs README.md's walk-through block (the sh
block after the `<!-- walkthrough` marker) exactly as written, with bash -e,
from a scratch directory that looks like the repository root (`tests` and
`build` link to the real ones; TMPDIR points inside it). Then checks what the
block promises: both runs wrote HF's output for the 5 tokens of x (within
1e-2 x max|y|, the TCP tolerance of tests/e2e), the stats and the trace."""
import array
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

moec, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
readme = open(os.path.join(root, "README.md")).read()
m = re.search(r"<!-- walkthrough[^\n]*-->\n```sh\n(.*?)\n```", readme, re.S)
assert m, "README.md has no walk-through block"
block = m.group(1)
for cmd in ("import-hf", "--tokens", "stats", "compile", "run", "--trace"):
    assert cmd in block, f"the walk-through lost '{cmd}'"

scratch = tempfile.mkdtemp(prefix="moec-readme-")
try:
    os.symlink(os.path.join(root, "tests"), os.path.join(scratch, "tests"))
    os.symlink(os.path.dirname(os.path.abspath(moec)), os.path.join(scratch, "build"))
    env = dict(os.environ, TMPDIR=scratch)
    script = block + '\necho "WALK_DIR=$d"\n'
    p = subprocess.run(["bash", "-e", "-c", script], cwd=scratch, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    out = p.stdout.decode()
    sys.stdout.write(out)
    sys.stderr.write(p.stderr.decode())
    assert p.returncode == 0, f"the walk-through failed with status {p.returncode}"
    d = re.search(r"^WALK_DIR=(.*)$", out, re.M).group(1)

    def npy(path):
        b = open(path, "rb").read()
        assert b[:6] == b"\x93NUMPY" and b[6] == 1, path
        n = struct.unpack("<H", b[8:10])[0]
        assert "'<f4'" in b[10:10 + n].decode(), path
        return array.array("f", b[10 + n:])

    ref = npy(os.path.join(root, "tests/fixtures/hf/mixtral/y_float32_T5.npy"))
    scale = max(map(abs, ref))
    for name in ("y_host.npy", "y_tcp.npy"):
        got = npy(os.path.join(d, name))
        err = max(abs(a - b) for a, b in zip(got, ref))
        assert len(got) == len(ref) == 5 * 48 and scale > 0 and err <= 1e-2 * scale, (name, err, scale)
        print(f"readme_walk: {name} max|y - y_HF| = {err:.3g} (max|y_HF| = {scale:.3g})")
    stats = json.load(open(os.path.join(d, "tcp.json")))
    assert stats["cycles"] > 0, stats
    trace = json.load(open(os.path.join(d, "trace.json")))
    assert len(trace["traceEvents"]) > 0
    print(f"readme_walk: {stats['cycles']} cycles, {len(trace['traceEvents'])} trace events")
finally:
    shutil.rmtree(scratch)
