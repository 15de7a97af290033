#!/usr/bin/env python3
"""npy_tile.py IN.npy N OUT.npy: N copies of the rows of an f32 C-order .npy
(version 1), copy k scaled by (-1)^k (1 + k / 4) so that the copies route
differently, without numpy."""
import ast
import struct
import sys

src, n, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open(src, "rb").read()
assert data[:6] == b"\x93NUMPY" and data[6] == 1, "npy version 1 only"
hlen = int.from_bytes(data[8:10], "little")
hdr = ast.literal_eval(data[10:10 + hlen].decode("latin1"))
assert hdr["descr"] == "<f4" and not hdr["fortran_order"], "little-endian f32, C order only"
shape = hdr["shape"]
count = 1
for d in shape:
    count *= d
vals = struct.unpack("<%df" % count, data[10 + hlen:10 + hlen + 4 * count])
out = []
for k in range(n):
    f = (-1) ** k * (1 + k / 4)
    out.extend(v * f for v in vals)
hdr["shape"] = (shape[0] * n,) + tuple(shape[1:])
text = repr(hdr).encode("latin1")
pad = 64 - (10 + len(text) + 1) % 64
text += b" " * (pad % 64) + b"\n"
with open(dst, "wb") as f:
    f.write(data[:8] + len(text).to_bytes(2, "little") + text + struct.pack("<%df" % len(out), *out))
