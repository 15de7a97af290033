"""router_ckpt.py SCHED.tsched OUT.safetensors X.npy: for a timing-only run,
write the weights a printed schedule binds that are not per expert (their
checkpoint name has no {e}: the router, its biases, shared experts) and the
input x (f32 [T, D] from the schedule's meta line), with deterministic
pseudo-random values of scale 0.02 (one 4096-value block repeated)."""
import json
import random
import re
import struct
import sys

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
hdr, blobs, off = {}, [], 0
for name, dt, shape in tensors:
    n = 1
    for d in shape:
        n *= d
    st, block, size = ("BF16", bf16, 2) if dt == "bf16" else ("F32", f32, 4)
    hdr[name] = {"dtype": st, "shape": shape, "data_offsets": [off, off + n * size]}
    blobs.append(fill(block, n * size))
    off += n * size
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)
T, D = int(meta["T"]), int(meta["D"])
npy = ("{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (T, D)).encode()
npy += b" " * (-(len(npy) + 11) % 64) + b"\n"
with open(sys.argv[3], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(npy)) + npy + fill(f32, T * D * 4))
