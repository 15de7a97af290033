#!/usr/bin/env python3
"""Writes a synthetic checkpoint with the tensor names and shapes of one MoE
layer of a real model, random weights, for timing runs at real sizes (the
real weights are not needed to measure speed; the values are N(0, 0.02)).

usage: make_checkpoint.py MODEL OUT.safetensors [--dtype bf16|f32] [--no-experts] [--fp8-block]
                          [--tokens T X.npy]

MODEL is one of qwen3_30b_a3b, olmoe_1b_7b, mixtral_8x7b, deepseek_v3, gpt_oss_20b; the
names and shapes are those the matching examples/MODEL.moe binds (its `layer` param
included). --no-experts leaves out the routed experts' weights (the router, its biases
and DeepSeek's shared experts stay): enough for `moec run --target=tcp --timing-only`,
whose cycle counts do not depend on expert weight values. The DeepSeek-V3 layer's experts
alone are 22.5 GB in bf16. --fp8-block stores the per-expert projections as block FP8
(F8_E4M3 `weight` with a float32 `weight_scale_inv` per 128x128 block, as DeepSeek-V3 and
Qwen3-FP8 publish them; random valid codes, scale 2^-14), for bench/qwen3_30b_a3b_fp8.moe; for
deepseek_v3 the shared experts too (with --no-experts they stay, in FP8), for the layer
`moec import-hf tests/fixtures/configs/DeepSeek-V3.json` writes.
"""
import json
import struct
import sys

import numpy as np


def per_expert(E, tmpl, names, D, F):
    """Per-expert tensors: names maps gate/up/down to the checkpoint's projection name."""
    out = []
    for e in range(E):
        for p in ("gate", "up", "down"):
            out.append((tmpl.format(e=e, p=names[p]), (F, D) if p != "down" else (D, F), None, True))
    return out


def tensors(model):
    """[(name, shape, forced dtype or None, is a routed-expert weight)]"""
    hf = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
    if model in ("qwen3_30b_a3b", "olmoe_1b_7b"):
        E, D, F = (128, 2048, 768) if model == "qwen3_30b_a3b" else (64, 2048, 1024)
        return [("model.layers.0.mlp.gate.weight", (E, D), None, False)] + \
            per_expert(E, "model.layers.0.mlp.experts.{e}.{p}.weight", hf, D, F)
    if model == "mixtral_8x7b":
        E, D, F = 8, 4096, 14336
        return [("model.layers.0.block_sparse_moe.gate.weight", (E, D), None, False)] + \
            per_expert(E, "model.layers.0.block_sparse_moe.experts.{e}.{p}.weight",
                       {"gate": "w1", "up": "w3", "down": "w2"}, D, F)
    if model == "deepseek_v3":
        E, D, F, L = 256, 7168, 2048, 3
        pre = f"model.layers.{L}.mlp."
        return [(pre + "gate.weight", (E, D), None, False),
                (pre + "gate.e_score_correction_bias", (E,), "f32", False)] + \
            per_expert(E, pre + "experts.{e}.{p}.weight", hf, D, F) + \
            [(pre + "shared_experts.gate_proj.weight", (F, D), None, False),
             (pre + "shared_experts.up_proj.weight", (F, D), None, False),
             (pre + "shared_experts.down_proj.weight", (D, F), None, False)]
    if model == "gpt_oss_20b":
        E, D, F = 32, 2880, 2880
        pre = "model.layers.0.mlp."
        return [(pre + "router.weight", (E, D), None, False),
                (pre + "router.bias", (E,), None, False),
                (pre + "experts.gate_up_proj", (E, D, 2 * F), None, True),
                (pre + "experts.gate_up_proj_bias", (E, 2 * F), None, True),
                (pre + "experts.down_proj", (E, F, D), None, True),
                (pre + "experts.down_proj_bias", (E, D), None, True)]
    sys.exit(f"make_checkpoint.py: unknown model '{model}'")


def fp8_proj(t):
    """An expert projection that --fp8-block stores as block FP8: every routed one, and the shared
    experts' (DeepSeek-V3 publishes those in FP8 too; its router stays bf16)."""
    return t[0].endswith(".weight") and (t[3] or ".shared_experts." in t[0])


def bf16_bits(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    model, out = sys.argv[1], sys.argv[2]
    dtype = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "bf16"
    ts = [t for t in tensors(model) if not ("--no-experts" in sys.argv and t[3])]
    fp8 = "--fp8-block" in sys.argv
    if fp8:  # a scale grid after every expert projection, routed or shared (DeepSeek-V3 stores both so)
        ts = [u for t in ts for u in ([(t[0], t[1], "f8", t[3]), (t[0] + "_scale_inv", (
            -(-t[1][0] // 128), -(-t[1][1] // 128)), "f32", t[3])] if fp8_proj(t) else [t])]
    rng = np.random.default_rng(0)
    header, off = {}, 0
    for name, shape, forced, _ in ts:
        dt = forced or dtype
        n = int(np.prod(shape)) * {"bf16": 2, "f8": 1}.get(dt, 4)
        header[name] = {"dtype": {"bf16": "BF16", "f8": "F8_E4M3"}.get(dt, "F32"), "shape": list(shape),
                        "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape, forced, _ in ts:
            if forced == "f8":  # E4M3 codes without the NaN ones (S.1111.111)
                f.write(rng.integers(0, 255, size=shape, dtype=np.uint8).clip(0, 0xFE).tobytes().replace(
                    b"\x7f", b"\x7e"))
                continue
            if name.endswith("_scale_inv"):
                f.write(np.full(shape, 2.0 ** -14, dtype=np.float32).tobytes())
                continue
            a = rng.standard_normal(shape, dtype=np.float32) * 0.02
            f.write(bf16_bits(a).tobytes() if (forced or dtype) == "bf16" else a.tobytes())
    if "--tokens" in sys.argv:
        i = sys.argv.index("--tokens")
        T, xpath = int(sys.argv[i + 1]), sys.argv[i + 2]
        D = header[ts[0][0]]["shape"][1]
        np.save(xpath, rng.standard_normal((T, D), dtype=np.float32))


if __name__ == "__main__":
    main()
