"""seed_layer.py DIR T D F E: f32 weights of examples/seed.moe (router [E, D],
per-expert up [F, D] and down [D, F], layer 0) in DIR/w.safetensors and an
input x [T, D] in DIR/x.npy, from a fixed LCG (deterministic, no numpy).
`seed_layer.py cmp A.npy B.npy TOL`: asserts that two f32 .npy files have the
same shape and max|A - B| <= TOL x max|B|."""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from litio import read_npy_f32, write_npy, write_safetensors  # noqa: E402


def lcg(state):
    """uniform values in [-1, 1) from a 64-bit LCG"""
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield ((state >> 40) / float(1 << 24)) * 2.0 - 1.0


def f32s(gen, n, scale):
    return struct.pack("<%df" % n, *[next(gen) * scale for _ in range(n)])


def make(d, T, D, F, E):
    g = lcg(12345)
    tensors = [("model.layers.0.mlp.gate.weight", [E, D], f32s(g, E * D, 0.1))]
    for e in range(E):
        tensors.append(("model.layers.0.mlp.experts.%d.up_proj.weight" % e, [F, D], f32s(g, F * D, 0.1)))
        tensors.append(("model.layers.0.mlp.experts.%d.down_proj.weight" % e, [D, F], f32s(g, D * F, 0.1)))
    write_safetensors(os.path.join(d, "w.safetensors"), [(n, "F32", shape, b) for n, shape, b in tensors])
    write_npy(os.path.join(d, "x.npy"), "<f4", [T, D], f32s(g, T * D, 1.0))


def cmp(a, b, tol):
    sa, va = read_npy_f32(a)
    sb, vb = read_npy_f32(b)
    assert sa == sb, "shapes differ: %s, %s" % (sa, sb)
    scale = max(abs(v) for v in vb)
    err = max(abs(x - y) for x, y in zip(va, vb))
    assert scale > 0 and err <= tol * scale, "max|A - B| = %g > %g x %g" % (err, tol, scale)


if __name__ == "__main__":
    if sys.argv[1] == "cmp":
        cmp(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        make(sys.argv[1], *[int(a) for a in sys.argv[2:6]])
