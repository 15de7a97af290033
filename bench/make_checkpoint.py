#!/usr/bin/env python3
"""Writes a synthetic checkpoint with the tensor names and shapes of one MoE
layer of a real model, random weights, for timing runs at real sizes (the
real weights are not needed to measure speed; the values are N(0, 0.02)).

usage: make_checkpoint.py qwen3_30b_a3b OUT.safetensors [--dtype bf16|f32] [--tokens T X.npy]
"""
import json
import struct
import sys

import numpy as np

MODELS = {
    # name: (E, D, F, per-expert name template, router name)
    "qwen3_30b_a3b": (128, 2048, 768, "model.layers.0.mlp.experts.{e}.{p}_proj.weight", "model.layers.0.mlp.gate.weight"),
    "olmoe_1b_7b": (64, 2048, 1024, "model.layers.0.mlp.experts.{e}.{p}_proj.weight", "model.layers.0.mlp.gate.weight"),
    "mixtral_8x7b": (8, 4096, 14336, "model.layers.0.block_sparse_moe.experts.{e}.{p}.weight",
                     "model.layers.0.block_sparse_moe.gate.weight"),
}
MIXTRAL = {"gate": "w1", "up": "w3", "down": "w2"}


def bf16_bits(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    model, out = sys.argv[1], sys.argv[2]
    dtype = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "bf16"
    E, D, F, tmpl, router = MODELS[model]
    rng = np.random.default_rng(0)
    tensors = [(router, (E, D))]
    for e in range(E):
        for p in ("gate", "up", "down"):
            name = tmpl.format(e=e, p=MIXTRAL[p] if model == "mixtral_8x7b" else p)
            tensors.append((name, (F, D) if p != "down" else (D, F)))
    esz = 2 if dtype == "bf16" else 4
    header, off = {}, 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * esz
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in tensors:
            a = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
            f.write(bf16_bits(a).tobytes() if dtype == "bf16" else a.tobytes())
    if "--tokens" in sys.argv:
        i = sys.argv.index("--tokens")
        T, xpath = int(sys.argv[i + 1]), sys.argv[i + 2]
        np.save(xpath, rng.standard_normal((T, D), dtype=np.float32))


if __name__ == "__main__":
    main()
