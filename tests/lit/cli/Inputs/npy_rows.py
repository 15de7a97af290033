"""npy_rows.py IN.npy OUT.npy N: the first N rows of a 2-D little-endian f32
.npy (version 1), written without numpy."""
import ast
import struct
import sys

src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(src, "rb").read()
assert data[:6] == b"\x93NUMPY" and data[6] == 1
hlen = struct.unpack("<H", data[8:10])[0]
hdr = ast.literal_eval(data[10:10 + hlen].decode("latin1"))
assert hdr["descr"] == "<f4" and not hdr["fortran_order"] and len(hdr["shape"]) == 2
cols = hdr["shape"][1]
body = data[10 + hlen:10 + hlen + n * cols * 4]
h = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (n, cols)
h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
open(dst, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode("latin1") + body)
