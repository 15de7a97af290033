"""fp8_layer.py MOEC LAYER.moe "SETS" W.safetensors X.npy: seeded random
weights under a block-FP8 layer's checkpoint names (read from `moec ir
--format=json` with the --set arguments SETS) and its input x. An f8e4m3
weight gets E4M3 codes of magnitude at most 8 (no NaN code); a weight named
*_s or *scale_inv (a block scale) f32 powers of two times [1, 2) from 2^-6 to
2^-3; every other weight f32 of scale 0.3 / sqrt(last dim) (0.1 for vectors);
x f32 of scale 1. Plain Python (lit's Python has no numpy)."""
import json
import math
import os
import random
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import write_npy, write_safetensors  # noqa: E402


def main():
    moec, moe, sets, wpath, xpath = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4], sys.argv[5]
    rng = random.Random(11)
    ir = json.loads(subprocess.run([moec, "ir", moe, "--format=json"] + sets, check=True, capture_output=True,
                                   text=True).stdout)
    nodes = ir["layers"][0]["nodes"]

    def gauss(shape, scale):
        n = math.prod(shape)
        return "F32", struct.pack("<%df" % n, *(rng.gauss(0.0, 1.0) * scale for _ in range(n)))

    def codes(shape):  # sign, exponent field 0..10 (|v| <= 8), any mantissa
        n = math.prod(shape)
        return "F8_E4M3", bytes((rng.randrange(2) << 7) | (rng.randrange(11) << 3) | rng.randrange(8)
                                for _ in range(n))

    def scales(shape):
        n = math.prod(shape)
        return "F32", struct.pack("<%df" % n, *(2.0 ** rng.randrange(-6, -2) * rng.uniform(1, 2) for _ in range(n)))

    tensors, x_shape = [], None
    for n in nodes:
        if n["op"] == "input":
            x_shape = n["shape"]
        if n["op"] != "weight":
            continue
        src, shape = n["attrs"]["source"]["str"], n["shape"]
        per = shape[1:] if "{e}" in src else shape
        if n["dtype"] == "f8e4m3":
            make = codes
        elif src.endswith("scale_inv") or n["name"].endswith("_s"):
            make = scales
        else:
            sc = 0.3 / max(1.0, float(shape[-1]) ** 0.5) if len(shape) > 1 else 0.1
            make = lambda s, sc=sc: gauss(s, sc)  # noqa: E731
        for e in range(shape[0]) if "{e}" in src else [None]:
            dt, payload = make(per)
            tensors.append((src if e is None else src.replace("{e}", str(e)), dt, per, payload))
    write_safetensors(wpath, tensors)
    write_npy(xpath, "<f4", x_shape, gauss(x_shape, 1.0)[1])


if __name__ == "__main__":
    main()
