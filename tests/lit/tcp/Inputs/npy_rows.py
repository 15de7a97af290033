#!/usr/bin/env python3
"""npy_rows.py IN.npy N OUT.npy: the first N rows of a C-order .npy (version 1),
without numpy: the header's shape gets N rows and the data is cut to them."""
import ast
import sys

src, n, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open(src, "rb").read()
assert data[:6] == b"\x93NUMPY" and data[6] == 1, "npy version 1 only"
hlen = int.from_bytes(data[8:10], "little")
hdr = ast.literal_eval(data[10:10 + hlen].decode("latin1"))
shape = hdr["shape"]
row = int(hdr["descr"][-1])
for d in shape[1:]:
    row *= d
hdr["shape"] = (n,) + tuple(shape[1:])
text = repr(hdr).encode("latin1")
pad = 64 - (10 + len(text) + 1) % 64
text += b" " * (pad % 64) + b"\n"
body = data[10 + hlen:10 + hlen + n * row]
open(dst, "wb").write(data[:8] + len(text).to_bytes(2, "little") + text + body)
