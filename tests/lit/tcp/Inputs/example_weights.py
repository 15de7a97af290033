"""example_weights.py LAYER.moe DIR SEED [--set NAME=VALUE ...]: random f32 weights
bound to the layer's own checkpoint names (read from `moec ir --format=json`) in
DIR/w.safetensors and one input in DIR/x.npy (normal, fixed seed; the layer
rounds them to its dtype). The first argument after SEED is the moec binary."""
import json
import os
import struct
import subprocess
import sys

import numpy as np


def main():
    layer, d, seed, moec = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    sets = sys.argv[5:]
    ir = json.loads(subprocess.run([moec, "ir", layer, "--format=json"] + sets, check=True, capture_output=True,
                                   text=True).stdout)
    rng = np.random.default_rng(seed)
    tensors, x_shape = {}, None
    for n in ir["layers"][0]["nodes"]:
        if n["op"] == "input":
            x_shape = n["shape"]
        if n["op"] != "weight":
            continue
        src, shape = n["attrs"]["source"]["str"], n["shape"]
        scale = 0.3 if len(shape) > 1 else 0.1
        if "{e}" in src:
            for e in range(shape[0]):
                tensors[src.replace("{e}", str(e))] = rng.standard_normal(shape[1:]) * scale
        else:
            tensors[src] = rng.standard_normal(shape) * scale
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        b = a.astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, "w.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    np.save(os.path.join(d, "x.npy"), rng.standard_normal(x_shape).astype(np.float32))


if __name__ == "__main__":
    main()
