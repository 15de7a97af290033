"""router_ckpt.py SCHED.tsched OUT.safetensors X.npy: for a timing-only run,
write the weights a printed schedule binds that are not per expert (their
checkpoint name has no {e}: the router, its biases, shared experts) and the
input x (f32 [T, D] from the schedule's meta line), with deterministic
pseudo-random values of scale 0.02 (one 4096-value block repeated)."""
import os
import random
import re
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import write_npy, write_safetensors  # noqa: E402

rng = random.Random(1)
vals = [rng.gauss(0.0, 0.02) for _ in range(4096)]
f32 = b"".join(struct.pack("<f", v) for v in vals)
bf16 = b"".join(struct.pack("<f", v)[2:] for v in vals)  # truncated: a valid bf16 of the same sign and scale


def fill(block, n):
    reps = -(-n // len(block))
    return (block * reps)[:n]


meta, tensors = {}, []
for line in open(sys.argv[1]):
    if line.startswith("meta "):
        meta = dict(kv.split("=", 1) for kv in line.split()[1:])
    m = re.match(r'buf %\d+ "[^"]*" hbm weight (\w+)\[([\d,]+)\] src="([^"]+)"', line)
    if m and "{e}" not in m.group(3):
        shape = [int(d) for d in m.group(2).split(",")]
        tensors.append((m.group(3), m.group(1), shape))
out = []
for name, dt, shape in tensors:
    n = 1
    for d in shape:
        n *= d
    st, block, size = ("BF16", bf16, 2) if dt == "bf16" else ("F32", f32, 4)
    out.append((name, st, shape, fill(block, n * size)))
write_safetensors(sys.argv[2], out)
T, D = int(meta["T"]), int(meta["D"])
write_npy(sys.argv[3], "<f4", (T, D), fill(f32, T * D * 4))
