"""bf16_experts.py DIR: a small bf16 checkpoint (per-expert gate/up/down of
bf16_experts.moe, E=4, F=16, D=8) and its inputs x [5, 8] (bf16 values as f32
.npy), idx [5, 1] (i32) and w [5, 1] (bf16 values as f32 .npy). Deterministic,
no numpy. Also `bf16_experts.py cmp A.npy B.npy TOL`: asserts that two f32
.npy files have the same 40 elements and max|A - B| <= TOL x max|B|."""
import array
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from litio import read_npy, write_npy  # noqa: E402


def bf16(v):
    """the bf16 bits of v (round to nearest even)"""
    b = struct.unpack("<I", struct.pack("<f", v))[0]
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


def as_f32(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def read_f32(path):
    return array.array("f", read_npy(path)[2])


if sys.argv[1] == "cmp":
    a, b, tol = read_f32(sys.argv[2]), read_f32(sys.argv[3]), float(sys.argv[4])
    s = max(map(abs, b))
    e = max(abs(x - y) for x, y in zip(a, b))
    assert len(a) == len(b) == 40 and s > 0 and e <= tol * s, (len(a), len(b), e, s)
    sys.exit(0)

out = sys.argv[1]
T, D, F, E, K = 5, 8, 16, 4, 1
rng = random.Random(15)
tensors, blobs, off = {}, [], 0
for e in range(E):
    for name, shape, scale in (("gate", [F, D], 0.35), ("up", [F, D], 0.35), ("down", [D, F], 0.25)):
        n = shape[0] * shape[1]
        data = struct.pack("<%dH" % n, *(bf16(rng.uniform(-scale, scale)) for _ in range(n)))
        tensors["%s.%d" % (name, e)] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
h = json.dumps(tensors).encode()
with open(os.path.join(out, "w.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
x = [as_f32(bf16(rng.uniform(-2, 2))) for _ in range(T * D)]
write_npy(os.path.join(out, "x.npy"), "<f4", [T, D], struct.pack("<%df" % len(x), *x))
idx = [3, 0, 2, 3, 1]  # every expert used, one twice (two rows in a block of B=4)
write_npy(os.path.join(out, "idx.npy"), "<i4", [T, K], struct.pack("<%di" % len(idx), *idx))
w = [as_f32(bf16(rng.uniform(0.25, 1))) for _ in range(T * K)]
write_npy(os.path.join(out, "w.npy"), "<f4", [T, K], struct.pack("<%df" % len(w), *w))
