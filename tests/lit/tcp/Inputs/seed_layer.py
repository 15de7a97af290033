"""seed_layer.py DIR T D F E: f32 weights of examples/seed.moe (router [E, D],
per-expert up [F, D] and down [D, F], layer 0) in DIR/w.safetensors and an
input x [T, D] in DIR/x.npy, from a fixed LCG (deterministic, no numpy).
`seed_layer.py cmp A.npy B.npy TOL`: asserts that two f32 .npy files have the
same shape and max|A - B| <= TOL x max|B|."""
import json
import os
import struct
import sys


def lcg(state):
    """uniform values in [-1, 1) from a 64-bit LCG"""
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield ((state >> 40) / float(1 << 24)) * 2.0 - 1.0


def f32s(gen, n, scale):
    return struct.pack("<%df" % n, *[next(gen) * scale for _ in range(n)])


def npy(path, shape, payload):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join("%d, " % s for s in shape)
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + payload)


def read_npy(path):
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    hdr = b[10:10 + n].decode()
    shape = hdr.split("'shape': (")[1].split(")")[0]
    data = b[10 + n:]
    return shape, struct.unpack("<%df" % (len(data) // 4), data)


def make(d, T, D, F, E):
    g = lcg(12345)
    tensors = [("model.layers.0.mlp.gate.weight", [E, D], f32s(g, E * D, 0.1))]
    for e in range(E):
        tensors.append(("model.layers.0.mlp.experts.%d.up_proj.weight" % e, [F, D], f32s(g, F * D, 0.1)))
        tensors.append(("model.layers.0.mlp.experts.%d.down_proj.weight" % e, [D, F], f32s(g, D * F, 0.1)))
    meta, off, blob = {}, 0, b""
    for name, shape, data in tensors:
        meta[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    h = json.dumps(meta).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, "w.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)
    npy(os.path.join(d, "x.npy"), [T, D], f32s(g, T * D, 1.0))


def cmp(a, b, tol):
    sa, va = read_npy(a)
    sb, vb = read_npy(b)
    assert sa == sb, "shapes differ: %s, %s" % (sa, sb)
    scale = max(abs(v) for v in vb)
    err = max(abs(x - y) for x, y in zip(va, vb))
    assert scale > 0 and err <= tol * scale, "max|A - B| = %g > %g x %g" % (err, tol, scale)


if __name__ == "__main__":
    if sys.argv[1] == "cmp":
        cmp(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        make(sys.argv[1], *[int(a) for a in sys.argv[2:6]])
