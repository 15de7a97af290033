"""mxfp4_layer.py MOEC LAYER.moe "SETS" CKPT X [LO HI]: seeded random weights
for an MXFP4 layer under its checkpoint names (read from `moec ir
--format=json` with SETS): u8 packed E2M1 values uniform over all 256 bytes
(both zero codes, 0 and 8, included), u8 E8M0 scales uniform in [LO, HI]
(default [112, 120], 2^-15 .. 2^-7: finite, normal products), float weights and biases of scale 0.3 / sqrt(last dim)
(0.1 for vectors) stored F32; and x [T, D] of scale 1 (f32 .npy)."""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import write_npy, write_safetensors  # noqa: E402


def main():
    moec, moe, sets, ckpt, xpath = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4], sys.argv[5]
    lo, hi = (int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 7 else (112, 120)
    rng = np.random.default_rng(11)
    ir = json.loads(subprocess.run([moec, "ir", moe, "--format=json"] + sets, check=True, capture_output=True,
                                   text=True).stdout)
    tensors, x_shape = [], None
    for n in ir["layers"][0]["nodes"]:
        if n["op"] == "input":
            x_shape = n["shape"]
        if n["op"] != "weight":
            continue
        src, shape = n["attrs"]["source"]["str"], n["shape"]
        if "{e}" in src:
            raise SystemExit("per-expert names are not handled: %s" % src)
        if n["dtype"] == "u8":
            if src.endswith("_scales"):
                a = rng.integers(lo, hi + 1, size=shape, dtype=np.uint8)
            else:
                a = rng.integers(0, 256, size=shape, dtype=np.uint8)
            tensors.append((src, "U8", shape, a.tobytes()))
        else:
            scale = 0.3 / max(1.0, float(shape[-1]) ** 0.5) if len(shape) > 1 else 0.1
            a = (rng.standard_normal(shape) * scale).astype("<f4")
            tensors.append((src, "F32", shape, a.tobytes()))
    write_safetensors(ckpt, tensors)
    x = rng.standard_normal(x_shape).astype("<f4")
    write_npy(xpath, "<f4", x_shape, x.tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
