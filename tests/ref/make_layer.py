#!/usr/bin/python3
"""Generate a random one-layer MoE test case for a family, in HuggingFace checkpoint form.

Writes into OUT/:
  config.json        HF-style config (model_type, hidden_size, expert counts, extras)
  model.safetensors  the MoE block of layer L under the family's HF tensor names,
                     stored float32 or bfloat16 (--store)
  x.npy              float32 [T, D] input (bf16-representable values when --store bfloat16)
  case.json          how it was made: family, sizes, route, seed, suggested block sizes B
  y.npy, routing.npy with --ref DTYPE: moe_ref.py's output (float32 [T, D]) and expert ids
                     (int32 [T, K], rank order) computed in DTYPE

Everything is a function of the arguments (torch.Generator seeded by --seed).

Routings (--route):
  random      Gaussian weights; gpt-oss gate_up is scaled so the +-7 clamp is active.
  one-expert  every token ranks expert 0 first (c_0 = T: the most loaded expert).  Softmax
              and llama4/seed families: x gets a common component c*u and router row 0 =
              a*u while the other rows are orthogonal to u, with a above every other logit;
              gpt_oss: router bias b_0 above the logit spread; deepseek_v3: correction
              bias b_0 = 4 (s < 1, so c_0 and its group win).
  ties        all router rows identical (and equal biases), x and router on a coarse
              power-of-two grid so every logit is computed exactly, in any summation
              order: all E scores tie and the selection must be experts 0..K-1.
  pair-ties   rows 2j and 2j+1 identical (grid-exact); distinct pairs otherwise, so the
              lower-index-wins rule decides inside the selection.
The generator checks with moe_ref that the routing has the promised property.

Edge cases are chosen with the sizes: --T 1 (decode), T*K < E (--T 3 --E 13 --K 3),
E prime (7, 13), and --B larger than T (recorded in case.json for the harness).

Usage:
  /usr/bin/python3 tests/ref/make_layer.py --family mixtral --out /tmp/case \\
      [--T 5 --D 64 --F 96 --E 8 --K 2] [--layer 0] [--store float32|bfloat16] \\
      [--route random|one-expert|ties|pair-ties] [--seed 0] [--B 16 64] [--ref float32]
      family extras: [--shared-F N] (qwen2_moe shared expert width; deepseek_v3 uses
      --n-shared * F; llama4 uses F) [--n-shared 1] [--n-group 4 --topk-group 2]
      [--scale 2.5] [--norm-topk 0|1] [--swiglu-limit 7.0]
  /usr/bin/python3 tests/ref/make_layer.py --suite /tmp/suite [--ref float32]
      writes the standard set of cases (every family x sizes x routings) into sub-folders.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_ref  # noqa: E402

ROUTES = ("random", "one-expert", "ties", "pair-ties")


# ----------------------------------------------------------------------------------------
# HF config for each family.

def make_config(a):
    fam = a.family
    c = {"hidden_size": a.D, "num_experts_per_tok": a.K, "num_hidden_layers": a.layer + 1,
         "hidden_act": "silu", "dtype": a.store, "moec_generated_by": "tests/ref/make_layer.py"}
    if fam == "mixtral":
        c.update(model_type="mixtral", architectures=["MixtralForCausalLM"],
                 intermediate_size=a.F, num_local_experts=a.E)
    elif fam == "qwen3_moe":
        c.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
                 moe_intermediate_size=a.F, num_experts=a.E, decoder_sparse_step=1,
                 mlp_only_layers=[], norm_topk_prob=bool(a.norm_topk if a.norm_topk is not None else 1))
    elif fam == "qwen2_moe":
        c.update(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"],
                 moe_intermediate_size=a.F, num_experts=a.E, decoder_sparse_step=1,
                 mlp_only_layers=[], shared_expert_intermediate_size=a.shared_F,
                 norm_topk_prob=bool(a.norm_topk or 0))
    elif fam == "olmoe":
        c.update(model_type="olmoe", architectures=["OlmoeForCausalLM"],
                 intermediate_size=a.F, num_experts=a.E, norm_topk_prob=bool(a.norm_topk or 0))
    elif fam == "gpt_oss":
        c.update(model_type="gpt_oss", architectures=["GptOssForCausalLM"],
                 intermediate_size=a.F, num_local_experts=a.E, swiglu_limit=a.swiglu_limit)
    elif fam == "deepseek_v3":
        c.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
                 moe_intermediate_size=a.F, n_routed_experts=a.E, n_shared_experts=a.n_shared,
                 n_group=a.n_group, topk_group=a.topk_group, routed_scaling_factor=a.scale,
                 norm_topk_prob=bool(a.norm_topk if a.norm_topk is not None else 1),
                 first_k_dense_replace=0, topk_method="noaux_tc", scoring_func="sigmoid")
    elif fam == "llama4":
        c.update(model_type="llama4_text", architectures=["Llama4ForCausalLM"],
                 intermediate_size=a.F, intermediate_size_mlp=a.F, num_local_experts=a.E,
                 interleave_moe_layer_step=1, moe_layers=[a.layer])
    elif fam == "seed":
        c.update(model_type="moec_seed", intermediate_size=a.F, num_local_experts=a.E)
    else:
        raise ValueError(fam)
    return c


# ----------------------------------------------------------------------------------------
# Random weights in the canonical Linear layout of moe_ref.load_layer, then HF names.

def random_weights(a, spec, g):
    E, D, F = spec.E, spec.D, spec.F

    def lin(*shape, gain=1.0):           # [.., out, in] with std gain / sqrt(in)
        return torch.randn(*shape, generator=g) * (gain / math.sqrt(shape[-1]))

    gu_gain = 3.0 if a.family == "gpt_oss" else 1.0   # pushes gate/up past the clamp
    W = {"router_w": lin(E, D, gain=2.0), "router_b": None, "corr_bias": None,
         "gate": lin(E, F, D, gain=gu_gain), "up": lin(E, F, D, gain=gu_gain),
         "down": lin(E, D, F)}
    if a.family == "seed":
        W["gate"] = None
    if a.family == "gpt_oss":
        W["router_b"] = 0.1 * torch.randn(E, generator=g)
        W["gate_b"] = 0.1 * torch.randn(E, F, generator=g)
        W["up_b"] = 0.1 * torch.randn(E, F, generator=g)
        W["down_b"] = 0.1 * torch.randn(E, D, generator=g)
    if a.family == "deepseek_v3":
        W["corr_bias"] = 0.1 * torch.randn(E, generator=g)
    if spec.shared_F:
        Fs = spec.shared_F
        W["sh_gate"], W["sh_up"], W["sh_down"] = lin(Fs, D), lin(Fs, D), lin(D, Fs)
        if a.family == "qwen2_moe":
            W["sh_gate_w"] = lin(1, D)
    return W


def to_checkpoint(family, W, layer):
    """Canonical tensors -> {HF name: tensor}, the inverse of moe_ref.load_layer."""
    E = W["router_w"].shape[0]
    out = {}
    if family == "mixtral":
        p = f"model.layers.{layer}.block_sparse_moe."
        out[p + "gate.weight"] = W["router_w"]
        for e in range(E):
            out[p + f"experts.{e}.w1.weight"] = W["gate"][e]
            out[p + f"experts.{e}.w3.weight"] = W["up"][e]
            out[p + f"experts.{e}.w2.weight"] = W["down"][e]
    elif family in ("qwen3_moe", "qwen2_moe", "olmoe", "deepseek_v3", "seed"):
        p = f"model.layers.{layer}.mlp."
        out[p + "gate.weight"] = W["router_w"]
        for e in range(E):
            if W["gate"] is not None:
                out[p + f"experts.{e}.gate_proj.weight"] = W["gate"][e]
            out[p + f"experts.{e}.up_proj.weight"] = W["up"][e]
            out[p + f"experts.{e}.down_proj.weight"] = W["down"][e]
        if family == "deepseek_v3":
            out[p + "gate.e_score_correction_bias"] = W["corr_bias"]
    elif family == "gpt_oss":
        p = f"model.layers.{layer}.mlp."
        out[p + "router.weight"] = W["router_w"]
        out[p + "router.bias"] = W["router_b"]
        _, F, D = W["gate"].shape
        gu = torch.empty(E, D, 2 * F)                    # x @ gu, columns interleaved
        gu[:, :, 0::2] = W["gate"].transpose(1, 2)
        gu[:, :, 1::2] = W["up"].transpose(1, 2)
        gub = torch.empty(E, 2 * F)
        gub[:, 0::2], gub[:, 1::2] = W["gate_b"], W["up_b"]
        out[p + "experts.gate_up_proj"] = gu
        out[p + "experts.gate_up_proj_bias"] = gub
        out[p + "experts.down_proj"] = W["down"].transpose(1, 2)
        out[p + "experts.down_proj_bias"] = W["down_b"]
    elif family == "llama4":
        p = f"model.layers.{layer}.feed_forward."
        out[p + "router.weight"] = W["router_w"]
        out[p + "experts.gate_up_proj"] = torch.cat(     # x @ gu = [gate | up]
            [W["gate"].transpose(1, 2), W["up"].transpose(1, 2)], dim=2)
        out[p + "experts.down_proj"] = W["down"].transpose(1, 2)
    if W.get("sh_gate") is not None:
        p = {"qwen2_moe": f"model.layers.{layer}.mlp.shared_expert.",
             "llama4": f"model.layers.{layer}.feed_forward.shared_expert.",
             "deepseek_v3": f"model.layers.{layer}.mlp.shared_experts."}[family]
        out[p + "gate_proj.weight"] = W["sh_gate"]
        out[p + "up_proj.weight"] = W["sh_up"]
        out[p + "down_proj.weight"] = W["sh_down"]
        if family == "qwen2_moe":
            out[f"model.layers.{layer}.mlp.shared_expert_gate.weight"] = W["sh_gate_w"]
    return {k: v.contiguous() for k, v in out.items()}


# ----------------------------------------------------------------------------------------
# Adversarial routings.

def grid(t, step, lim):
    """Round to multiples of `step` (a power of two) within +-lim: exact in f32 and bf16."""
    return (torch.round(t / step) * step).clamp(-lim, lim)


def craft_route(a, spec, W, x, g):
    E, D = spec.E, spec.D
    if a.route == "one-expert":
        if a.family == "deepseek_v3":
            W["corr_bias"] = 0.1 * torch.tanh(W["corr_bias"])   # |b_e| < 0.1 for e != 0
            W["corr_bias"][0] = 4.0
        elif a.family == "gpt_oss":
            spread = (x @ W["router_w"].T).abs().max().item()
            W["router_b"][0] = 2 * spread + 8.0
        else:
            u = torch.randn(D, generator=g)
            u = u / u.norm()
            x = x - (x @ u)[:, None] * u + 1.0 * u             # x.u = 1 for every token
            R = W["router_w"]
            R = R - (R @ u)[:, None] * u                        # other rows ignore u
            other = (x @ R[1:].T).abs().max().item()
            R[0] = (2 * other + 8.0) * u                        # l_0 = a > every other l_e
            W["router_w"] = R
    elif a.route in ("ties", "pair-ties"):
        x = grid(torch.randn(x.shape, generator=g), 0.25, 2.0)
        rows = grid(torch.randn(E, D, generator=g) / 4, 0.125, 0.25)
        if a.route == "ties":
            rows[:] = rows[0]
        else:
            rows[1::2] = rows[0:E - 1:2]                         # row 2j+1 = row 2j
        W["router_w"] = rows
        for key in ("router_b", "corr_bias"):
            if W[key] is not None:
                b = grid(W[key], 1 / 64, 0.25)
                if a.route == "ties":
                    b[:] = b[0]
                else:
                    b[1::2] = b[0:E - 1:2]
                W[key] = b
    return W, x


def check_route(a, spec, ids):
    """Assert the promised routing property on moe_ref's selection ids [T, K]."""
    # DeepSeek: twins in different groups may be split by the group filter, legitimately.
    per = spec.E // spec.n_group if a.family == "deepseek_v3" else spec.E
    T, K = ids.shape
    if a.route == "one-expert":
        assert (ids[:, 0] == 0).all(), f"one-expert: expert 0 not first for all tokens:\n{ids}"
    elif a.route == "ties":
        want = np.broadcast_to(np.arange(K), (T, K))
        assert (ids == want).all(), f"ties: expected experts 0..K-1 for every token:\n{ids}"
    elif a.route == "pair-ties":
        for row in ids:
            pos = {int(e): i for i, e in enumerate(row)}
            for e, i in pos.items():
                if e % 2 == 1 and e // per == (e - 1) // per:
                    # the odd twin may appear only after its even twin
                    assert e - 1 in pos and pos[e - 1] < i, f"pair-ties violated: {row}"


# ----------------------------------------------------------------------------------------

def make_case(a):
    g = torch.Generator().manual_seed(a.seed)
    cfg = make_config(a)
    spec = moe_ref.Spec(cfg, a.family)
    W = random_weights(a, spec, g)
    x = torch.randn(a.T, a.D, generator=g)
    W, x = craft_route(a, spec, W, x, g)

    sdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.store]
    tensors = {k: (v.to(sdt) if k != "model.layers.%d.mlp.gate.e_score_correction_bias" % a.layer
                   else v.float())          # DeepSeek keeps its correction bias in float32
               for k, v in to_checkpoint(a.family, W, a.layer).items()}
    x = x.to(sdt).float().numpy()           # bf16 store: x on the bf16 grid as well

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    moe_ref.write_safetensors(os.path.join(a.out, "model.safetensors"), tensors,
                              {"format": "pt"})
    np.save(os.path.join(a.out, "x.npy"), x.astype(np.float32))

    # Check the routing property in every dtype the case may be run in.
    for dt in ("float32", "bfloat16"):
        _, ids = moe_ref.run(cfg, tensors, x, a.layer, dt)
        check_route(a, spec, ids)
    if a.ref:
        y, ids = moe_ref.run(cfg, tensors, x, a.layer, a.ref)
        np.save(os.path.join(a.out, "y.npy"), y)
        np.save(os.path.join(a.out, "routing.npy"), ids)
    meta = {"family": a.family, "T": a.T, "D": a.D, "F": a.F, "E": a.E, "K": a.K,
            "layer": a.layer, "store": a.store, "route": a.route, "seed": a.seed,
            "B": a.B, "n_pairs": a.T * a.K, "ref_dtype": a.ref,
            "shared_F": spec.shared_F}
    with open(os.path.join(a.out, "case.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def parser():
    ap = argparse.ArgumentParser(description="generate a random MoE layer test case")
    ap.add_argument("--family", choices=moe_ref.FAMILIES)
    ap.add_argument("--out")
    ap.add_argument("--suite", help="write the standard set of cases under this folder")
    ap.add_argument("--T", type=int, default=5)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--F", type=int, default=96)
    ap.add_argument("--E", type=int, default=8)
    ap.add_argument("--K", type=int, default=2)
    ap.add_argument("--B", type=int, nargs="*", default=[16, 64],
                    help="block sizes the harness should try (recorded only)")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--store", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--route", choices=ROUTES, default="random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ref", choices=["float32", "bfloat16"],
                    help="also write y.npy / routing.npy computed by moe_ref in this dtype")
    ap.add_argument("--shared-F", dest="shared_F", type=int, default=None)
    ap.add_argument("--n-shared", dest="n_shared", type=int, default=1)
    ap.add_argument("--n-group", dest="n_group", type=int, default=None)
    ap.add_argument("--topk-group", dest="topk_group", type=int, default=None)
    ap.add_argument("--scale", type=float, default=2.5)
    ap.add_argument("--norm-topk", dest="norm_topk", type=int, choices=[0, 1], default=None)
    ap.add_argument("--swiglu-limit", dest="swiglu_limit", type=float, default=7.0)
    return ap


def finish_args(a):
    """Family defaults that depend on other sizes."""
    if a.shared_F is None:
        a.shared_F = a.F + a.F // 2
    if a.family == "deepseek_v3":
        if a.n_group is None:
            a.n_group = 4 if a.E % 4 == 0 else 1
        if a.topk_group is None:
            a.topk_group = max(1, a.n_group // 2)
    else:
        a.n_group = a.n_group or 1
        a.topk_group = a.topk_group or 1
    return a


# (name, overrides) of the standard suite; applied to every family.
SUITE = [
    ("basic", dict(T=64, E=8, K=2)),
    ("basic_bf16", dict(T=64, E=8, K=2, store="bfloat16")),
    ("decode_t1", dict(T=1, E=16, K=4, B=[16, 64])),
    ("sparse_n_lt_e", dict(T=3, E=13, K=3, B=[4, 16])),       # n = 9 < E = 13
    ("prime_e7", dict(T=33, E=7, K=2, B=[8, 64])),           # B larger than T
    ("one_expert", dict(T=40, E=13, K=3, route="one-expert", B=[16])),
    ("ties", dict(T=9, E=12, K=4, route="ties", B=[16])),
    ("pair_ties", dict(T=17, E=12, K=4, route="pair-ties", B=[16])),
]


def run_suite(a):
    n = 0
    for fam in moe_ref.FAMILIES:
        for i, (name, over) in enumerate(SUITE):
            b = parser().parse_args(["--family", fam])
            for k, v in over.items():
                setattr(b, k, v)
            if fam == "llama4":
                b.K = 1                         # Llama 4 routes to a single expert
            b.seed = 1000 * moe_ref.FAMILIES.index(fam) + i
            b.ref = a.ref or b.store
            b.out = os.path.join(a.suite, f"{fam}_{name}")
            make_case(finish_args(b))
            n += 1
    print(f"wrote {n} cases under {a.suite}")


def main(argv=None):
    a = parser().parse_args(argv)
    torch.set_num_threads(1)
    if a.suite:
        run_suite(a)
        return 0
    if not a.family or not a.out:
        parser().error("--family and --out are required (or --suite DIR)")
    meta = make_case(finish_args(a))
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
