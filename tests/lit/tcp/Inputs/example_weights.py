"""example_weights.py LAYER.moe DIR MOEC [--set NAME=VALUE ...]: f32 weights bound
to the layer's own checkpoint names (read from `moec ir --format=json`) in
DIR/w.safetensors and one input in DIR/x.npy, uniform in [-1, 1) from a fixed
LCG (weights scaled by 0.3, vectors by 0.1; deterministic, no numpy). The layer
rounds them to its dtype."""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from litio import write_npy, write_safetensors  # noqa: E402


def lcg(state):
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield ((state >> 40) / float(1 << 24)) * 2.0 - 1.0


def f32s(gen, n, scale):
    return struct.pack("<%df" % n, *[next(gen) * scale for _ in range(n)])


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def main():
    layer, d, moec = sys.argv[1], sys.argv[2], sys.argv[3]
    ir = json.loads(subprocess.run([moec, "ir", layer, "--format=json"] + sys.argv[4:], check=True,
                                   capture_output=True, text=True).stdout)
    g = lcg(20261128)
    tensors, x_shape = [], None
    for n in ir["layers"][0]["nodes"]:
        if n["op"] == "input":
            x_shape = n["shape"]
        if n["op"] != "weight":
            continue
        src, shape = n["attrs"]["source"]["str"], n["shape"]
        scale = 0.3 if len(shape) > 1 else 0.1
        if "{e}" in src:
            for e in range(shape[0]):
                tensors.append((src.replace("{e}", str(e)), shape[1:], f32s(g, numel(shape[1:]), scale)))
        else:
            tensors.append((src, shape, f32s(g, numel(shape), scale)))
    write_safetensors(os.path.join(d, "w.safetensors"), [(n, "F32", shape, b) for n, shape, b in tensors])
    write_npy(os.path.join(d, "x.npy"), "<f4", x_shape, f32s(g, numel(x_shape), 1.0))

if __name__ == "__main__":
    main()
