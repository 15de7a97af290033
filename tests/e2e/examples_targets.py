#!/usr/bin/env python3
"""Every example at test sizes on both targets: random weights bound to the
example's own checkpoint names (read from `moec ir --format=json`), one input,
`moec run --target=host` and `--target=tcp`; the TCP output must be within
1e-2 * max|y_host| of the host output (a different expert choice would show as
an error of the order of y itself).

usage: examples_targets.py MOEC EXAMPLES_DIR
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

SMALL = ["--set", "T=6", "--set", "D=32", "--set", "F=16", "--set", "B=4"]
EXTRA = {  # per example: E and K small, family dims consistent with their groups
    "deepseek_v3": ["--set", "E=16", "--set", "K=4", "--set", "n_group=4", "--set", "topk_group=2"],
    "gpt_oss_20b": ["--set", "E=8", "--set", "K=2"],
    "llama4_scout": ["--set", "E=8", "--set", "K=1"],
    "mixtral_8x7b": ["--set", "E=8", "--set", "K=2"],
    "olmoe_1b_7b": ["--set", "E=8", "--set", "K=2"],
    "qwen3_30b_a3b": ["--set", "E=8", "--set", "K=2"],
    "seed": ["--set", "E=8", "--set", "K=2"],
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError("failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return p.stdout


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        b = a.astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    moec, exdir = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(3)
    failed, passed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, dt in [(n, d) for n in sorted(EXTRA) for d in ("f32", "bf16")]:
            f = os.path.join(exdir, name + ".moe")
            sets = SMALL + EXTRA[name] + ["--set", "dtype=" + dt]
            try:
                ir = json.loads(run([moec, "ir", f, "--format=json"] + sets))
                layer = ir["layers"][0]
                tensors, x_shape = {}, None
                for n in layer["nodes"]:
                    if n["op"] == "input":
                        x_shape = n["shape"]
                    if n["op"] != "weight":
                        continue
                    src = n["attrs"]["source"]["str"]
                    shape = n["shape"]
                    scale = 0.3 if len(shape) > 1 else 0.1
                    if "{e}" in src:
                        for e in range(shape[0]):
                            tensors[src.replace("{e}", str(e))] = rng.standard_normal(shape[1:]) * scale
                    else:
                        tensors[src] = rng.standard_normal(shape) * scale
                w = os.path.join(tmp, name + ".safetensors")
                write_safetensors(w, tensors)
                x = os.path.join(tmp, "x.npy")
                np.save(x, rng.standard_normal(x_shape).astype(np.float32))
                ys = {}
                for target in ("host", "tcp"):
                    y = os.path.join(tmp, "y_%s.npy" % target)
                    run([moec, "run", f, "--weights", w, "--input", x, "-o", y, "--target=" + target] + sets)
                    ys[target] = np.load(y).astype(np.float64)
                err = float(np.max(np.abs(ys["tcp"] - ys["host"])))
                scale = float(np.max(np.abs(ys["host"])))
                ok = scale > 0 and err <= 1e-2 * scale
                print("%-4s %-16s %-4s tcp vs host: max|err| = %.2e x max|y|" % ("ok" if ok else "FAIL", name, dt, err / scale))
                passed += ok
                if not ok:
                    failed.append(name + " " + dt)
            except Exception as e:
                print("FAIL %s %s: %s" % (name, dt, e))
                failed.append(name + " " + dt)
    print("%d passed, %d failed" % (passed, len(failed)))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
