#!/usr/bin/python3
"""PyTorch CPU baseline for bench/run: one Qwen3-MoE-style sparse block written the way
HuggingFace transformers runs it in eager mode (a router Linear, softmax in float32,
top-k, renormalisation, then a Python loop over the experts that received tokens, each
an nn.Linear-style SwiGLU MLP, results index_add-ed into the output).

It is a timing baseline, deliberately not the test oracle (tests/ref/moe_ref.py is).

usage: torch_moe.py --weights W.safetensors --input x.npy --output y.npy
                    [--dtype bf16|f32] [--threads 1] [--repeat N] [--warmup 1]
                    [--experts 128 --topk 8 --layer 0] [--json stats.json]
Prints (and writes with --json) {"compute_seconds": median, "times": [...], ...}.

With --ties-json FILE it only routes (no expert FFNs, no timing) and writes the tokens
whose K-th and (K+1)-th router probabilities are exactly equal: there the choice of
expert is a tie-break, which moec makes by the lower expert index and torch.topk leaves
unspecified, so such rows may legitimately differ between the two.
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load_safetensors(path, dtype):
    """{name: torch tensor in `dtype`}, read through a memory map and copied into RAM."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        shape = tuple(info["shape"])
        if info["dtype"] == "BF16":
            bits = np.array(raw[lo:hi]).view(np.int16).reshape(shape)
            t = torch.from_numpy(bits).view(torch.bfloat16)
        elif info["dtype"] == "F32":
            t = torch.from_numpy(np.array(raw[lo:hi]).view(np.float32).reshape(shape))
        else:
            raise SystemExit(f"{path}: {name}: dtype {info['dtype']} not handled")
        out[name] = t.to(dtype).contiguous()
    return out


class SparseBlock:
    """Router + per-expert SwiGLU MLPs, as separate weight tensors per expert."""

    def __init__(self, w, layer, n_experts, top_k, norm_topk=True):
        pre = f"model.layers.{layer}.mlp."
        self.router = w[pre + "gate.weight"]
        self.experts = [(w[f"{pre}experts.{e}.gate_proj.weight"], w[f"{pre}experts.{e}.up_proj.weight"],
                         w[f"{pre}experts.{e}.down_proj.weight"]) for e in range(n_experts)]
        self.n_experts, self.top_k, self.norm_topk = n_experts, top_k, norm_topk

    def probs(self, h):
        return F.softmax(F.linear(h, self.router), dim=-1, dtype=torch.float32)

    def __call__(self, h):
        dt = h.dtype
        probs = self.probs(h)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(dt)
        y = torch.zeros_like(h)
        # [E, K, T] membership mask; visit only experts that some token picked
        member = F.one_hot(chosen, num_classes=self.n_experts).permute(2, 1, 0)
        for e in torch.nonzero(member.sum(dim=(1, 2)) > 0).flatten().tolist():
            slot, tok = torch.where(member[e])
            g, u, d = self.experts[e]
            xe = h[tok]
            he = F.linear(F.silu(F.linear(xe, g)) * F.linear(xe, u), d)
            y.index_add_(0, tok, (he * weights[tok, slot, None]).to(dt))
        return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--ties-json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    t0 = time.perf_counter()
    block = SparseBlock(load_safetensors(a.weights, dtype), a.layer, a.experts, a.topk)
    x = torch.from_numpy(np.load(a.input).astype(np.float32)).to(dtype)
    load_s = time.perf_counter() - t0
    if a.ties_json:
        with torch.inference_mode():
            top = torch.topk(block.probs(x), a.topk + 1, dim=-1).values
        rows = torch.nonzero(top[:, a.topk - 1] == top[:, a.topk]).flatten().tolist()
        with open(a.ties_json, "w") as f:
            json.dump({"tokens": x.shape[0], "tie_rows": rows, "dtype": a.dtype}, f)
            f.write("\n")
        return 0
    times = []
    with torch.inference_mode():
        for i in range(a.warmup + a.repeat):
            t = time.perf_counter()
            y = block(x)
            dt = time.perf_counter() - t
            if i >= a.warmup:
                times.append(dt)
    if a.output:
        np.save(a.output, y.to(torch.float32).numpy())
    res = {"compute_seconds": statistics.median(times), "times": times, "repeat": a.repeat,
           "warmup": a.warmup, "threads": torch.get_num_threads(), "dtype": a.dtype,
           "load_seconds": load_s, "torch": torch.__version__}
    text = json.dumps(res, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
