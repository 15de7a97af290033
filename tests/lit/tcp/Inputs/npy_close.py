#!/usr/bin/env python3
"""npy_close.py A.npy B.npy TOL: exit 0 when A and B (f32, C order, .npy
version 1, same shape) differ by at most TOL x max|B| everywhere, without
numpy; prints the figures either way."""
import ast
import struct
import sys


def load(path):
    data = open(path, "rb").read()
    assert data[:6] == b"\x93NUMPY" and data[6] == 1, path + ": npy version 1 only"
    hlen = int.from_bytes(data[8:10], "little")
    hdr = ast.literal_eval(data[10:10 + hlen].decode("latin1"))
    assert hdr["descr"] == "<f4" and not hdr["fortran_order"], path + ": little-endian f32, C order only"
    n = 1
    for d in hdr["shape"]:
        n *= d
    return hdr["shape"], struct.unpack("<%df" % n, data[10 + hlen:10 + hlen + 4 * n])


sa, a = load(sys.argv[1])
sb, b = load(sys.argv[2])
tol = float(sys.argv[3])
if sa != sb:
    sys.exit("shapes differ: %s and %s" % (sa, sb))
ref = max(abs(v) for v in b)
err = max(abs(x - y) for x, y in zip(a, b))
print("max|b| %g max err %g (%.2e of max|b|)" % (ref, err, err / ref if ref else 0.0))
sys.exit(0 if ref > 0 and err <= tol * ref else 1)
