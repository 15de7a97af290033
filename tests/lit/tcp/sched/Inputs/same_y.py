"""same_y.py MOEC LAYER.moe "SETS" A.tcpb B.tcpb ...: random weights under the
layer's checkpoint names (from `moec ir --format=json` with SETS) and a random
input, each program run on the TCP simulator; exits 1 unless every y is
byte-identical to the first and finite and not all zero. Used by the
schedule-rewrite lit tests: a rewrite must not change values."""
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import read_npy_f32, write_npy, write_safetensors  # noqa: E402


def values(rng, shape, scale):
    n = math.prod(shape)
    return shape, struct.pack("<%df" % n, *(rng.gauss(0.0, 1.0) * scale for _ in range(n)))


def main():
    moec, moe, sets, progs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
    rng = random.Random(7)
    ir = json.loads(subprocess.run([moec, "ir", moe, "--format=json"] + sets, check=True, capture_output=True,
                                   text=True).stdout)
    tensors, x_shape = {}, None
    for n in ir["layers"][0]["nodes"]:
        if n["op"] == "input":
            x_shape = n["shape"]
        if n["op"] != "weight":
            continue
        src, shape = n["attrs"]["source"]["str"], n["shape"]
        scale = 0.3 / max(1.0, float(shape[-1]) ** 0.5) if len(shape) > 1 else 0.1
        if "{e}" in src:
            for e in range(shape[0]):
                tensors[src.replace("{e}", str(e))] = values(rng, shape[1:], scale)
        else:
            tensors[src] = values(rng, shape, scale)
    with tempfile.TemporaryDirectory() as tmp:
        w, x = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "x.npy")
        write_safetensors(w, [(k, "F32", shape, b) for k, (shape, b) in tensors.items()])
        _, xb = values(rng, x_shape, 1.0)
        write_npy(x, "<f4", x_shape, xb)
        ys = []
        for k, p in enumerate(progs):
            y = os.path.join(tmp, "y%d.npy" % k)
            subprocess.run([moec, "run", p, "--weights", w, "--input", x, "-o", y, "--target=tcp"], check=True)
            ys.append(open(y, "rb").read())
            if k == 0:
                y0 = read_npy_f32(y)[1]
    if not all(math.isfinite(v) for v in y0) or not any(y0):
        print("y is not finite or is all zero")
        return 1
    for k in range(1, len(ys)):
        if ys[k] != ys[0]:
            print("y of %s differs from y of %s" % (progs[k], progs[0]))
            return 1
    print("same y: %d programs" % len(ys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
