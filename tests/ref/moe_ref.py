#!/usr/bin/python3
"""Independent PyTorch reference for one Mixture-of-Experts block (moec test oracle).

Written from the formulas in shared/moe/SEMANTICS.md, not from any model library. It
loads one layer's MoE weights from a safetensors file (own reader: json + numpy) plus
the HuggingFace-style config.json, runs the block on x [T, D] and writes y [T, D].

Families (--family, default from config "model_type"):
  mixtral      softmax_f32(l), top-K, renormalise; SwiGLU experts
  qwen3_moe    as mixtral; renormalise only if norm_topk_prob (HF default false)
  qwen2_moe    as qwen3_moe (norm default false) + sigmoid(w_sg . x) * SwiGLU_shared(x)
  olmoe        as qwen3_moe (norm default false)
  gpt_oss      l = W_r x + b_r; top-K on l; w = softmax over the K selected l;
               clamped interleaved SwiGLU with biases (alpha 1.702, +1 on up)
  deepseek_v3  s = sigmoid_f32(l); c = s + e_score_correction_bias (selection only);
               group-limited top-K; w = s_sel / (sum s_sel + 1e-20) * routed_scaling_factor;
               + shared SwiGLU experts
  llama4       top-K on l (K = 1); w = sigmoid(l_sel) scales the expert *input*;
               fused gate_up (gate = first F columns); + shared SwiGLU expert
  seed         moec's seed design: top-K on l; w = softmax over the K selected l;
               FFN(x) = W_down (W_up x), no activation.  Checkpoint (model_type "moec_seed"):
                 model.layers.{L}.mlp.gate.weight                 [E, D]
                 model.layers.{L}.mlp.experts.{e}.up_proj.weight   [F, D]
                 model.layers.{L}.mlp.experts.{e}.down_proj.weight [D, F]
               config keys: hidden_size, intermediate_size, num_local_experts,
               num_experts_per_tok.

Top-k rule (SEMANTICS section 4), independent of torch.topk's unspecified tie order:
  every score is mapped to an order-preserving integer key (NaN -> +NaN, ranks above all
  numbers; -0.0 -> +0.0), combined with the reversed expert index into one unique int64,
  and sorted.  Equal scores therefore select the lower expert index first; the K selected
  are returned in rank order (descending score, then ascending index).

Precision policy (--dtype), mirroring how HF transformers 5.17 runs a model in that dtype
(bit-exact against the bf16 Mixtral and Qwen3 fixtures):
  * weights and activations are rounded (round-to-nearest-even) to the compute dtype and
    every Linear / elementwise op yields a compute-dtype result; transcendental ops
    (silu, sigmoid) are evaluated in float32 and rounded once;
  * router softmax / sigmoid are float32 (DeepSeek-V3 computes its router logits in
    float32 too); routing weights stay float32 for mixtral, deepseek_v3 and seed, and are
    rounded to the compute dtype for qwen2_moe, qwen3_moe, olmoe, gpt_oss and llama4
    (their HF routers cast them back);
  * expert output times weight: float32 product for float32 weights, compute-dtype product
    for rounded weights; the K contributions are summed in float32 (ascending expert index),
    rounded once to the compute dtype; then the shared expert output is added in the
    compute dtype.
In float32 all of this is plain float32 arithmetic.

DeepSeek-V3 masking: experts of dropped groups get -inf before the final top-K (as
SEMANTICS.md and DeepSeek's own code).  HF transformers fills them with 0.0 instead; that
only differs when fewer than K kept experts have c > 0.  --dsv3-mask-fill zero selects the
HF behaviour.

CLI:
  /usr/bin/python3 tests/ref/moe_ref.py --config C.json --weights W.safetensors \
      --input x.npy --output y.npy [--layer N] [--dtype float32|bfloat16] \
      [--family NAME] [--routing ids.npy] [--dsv3-mask-fill inf|zero]
  y.npy is float32 with x's shape; ids.npy is int32 [T, K] in rank order.
"""
import argparse
import json
import re
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------
# safetensors I/O: 8-byte little-endian header length, JSON header
# {name: {dtype, shape, data_offsets:[begin, end)}} (offsets relative to the data area),
# then raw little-endian tensor bytes.  Optional "__metadata__" entry of strings.

_ST_NUMPY = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4",
             "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """Return {name: torch.Tensor}; BF16 tensors come back as torch.bfloat16."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = raw[base + begin:base + end]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "BF16":
            # bf16 is the high half of a float32: widen the bits, then narrow exactly.
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            t = torch.from_numpy(bits.view(np.float32).reshape(shape).copy())
            out[name] = t.to(torch.bfloat16)
        elif dt in _ST_NUMPY:
            arr = np.frombuffer(buf, dtype=_ST_NUMPY[dt]).reshape(shape)
            out[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("=")).copy())
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
    return out


def write_safetensors(path, tensors, metadata=None):
    """Write {name: torch.Tensor} (float32, bfloat16, float16, int32, int64)."""
    codes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
             torch.int32: "I32", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            data = t.view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            data = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)   # keep the data area 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------------------
# Exact, tie-deterministic top-k (SEMANTICS section 4).

def order_key(scores):
    """Order-preserving int64 key of float scores: a > b  <=>  key(a) > key(b).

    The float32 bit pattern read as a signed integer orders non-negative floats correctly;
    for negative floats the magnitude bits are flipped (xor 0x7fffffff) so that larger
    magnitude gives a smaller key.  -0.0 is first turned into +0.0 and every NaN into the
    positive quiet NaN, whose key exceeds that of +inf."""
    s = scores.to(torch.float32)
    s = torch.where(s == 0, torch.zeros_like(s), s)
    s = torch.where(torch.isnan(s), torch.full_like(s, float("nan")), s)
    bits = s.contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def stable_topk(scores, k):
    """Indices [..., k] of the k largest scores along the last axis, in rank order.

    rank_i = #{j : s_j > s_i or (s_j == s_i and j < i)}.  Implemented by sorting the unique
    composite key  order_key(s) * n + (n - 1 - i): ties in the score are broken by the
    index term in favour of the lower index, so the sort has no ties left to resolve."""
    n = scores.shape[-1]
    if not 0 < k <= n:
        raise ValueError(f"top-k: k={k} not in 1..{n}")
    idx = torch.arange(n, dtype=torch.int64)
    composite = order_key(scores) * n + (n - 1 - idx)
    return torch.argsort(composite, dim=-1, descending=True)[..., :k]


# ----------------------------------------------------------------------------------------
# Configuration.

FAMILIES = ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3",
            "llama4", "seed")
MODEL_TYPE_TO_FAMILY = {"mixtral": "mixtral", "qwen3_moe": "qwen3_moe",
                        "qwen2_moe": "qwen2_moe", "olmoe": "olmoe", "gpt_oss": "gpt_oss",
                        "deepseek_v3": "deepseek_v3", "llama4": "llama4",
                        "llama4_text": "llama4", "moec_seed": "seed"}
# Names a module may have in the checkpoint: block_sparse_moe (Mixtral), feed_forward
# (Llama 4), mlp (the rest).
BLOCK_ATTRS = {"mixtral": ("block_sparse_moe", "mlp"), "llama4": ("feed_forward",)}
_REQUIRED = object()


def _get(cfg, names, default=_REQUIRED):
    """First present, non-null key among the HF aliases `names`."""
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    if default is _REQUIRED:
        raise KeyError(f"config lacks all of {names}")
    return default


class Spec:
    """Sizes and options of one MoE block, resolved from config.json."""

    def __init__(self, cfg, family):
        if "text_config" in cfg:            # multimodal wrapper (Llama 4): use the text part
            cfg = cfg["text_config"]
        self.family = family
        self.D = int(_get(cfg, ["hidden_size"]))
        self.E = int(_get(cfg, ["num_local_experts", "num_experts", "n_routed_experts"]))
        self.K = int(_get(cfg, ["num_experts_per_tok", "experts_per_token"]))
        moe_f = family in ("qwen3_moe", "qwen2_moe", "deepseek_v3")
        self.F = int(_get(cfg, ["moe_intermediate_size"] if moe_f else ["intermediate_size"]))
        # renormalise the K selected weights?  (Mixtral always; the others follow the key,
        # whose HF default is false for Qwen/OLMoE and true for DeepSeek-V3.)
        self.norm_topk = {"mixtral": True,
                          "deepseek_v3": bool(cfg.get("norm_topk_prob", True))}.get(
            family, bool(cfg.get("norm_topk_prob", False)))
        act = cfg.get("hidden_act", "silu")
        if family not in ("gpt_oss", "seed") and act != "silu":
            raise ValueError(f"hidden_act {act!r} unsupported (SwiGLU needs silu)")
        self.shared_F = 0
        if family == "qwen2_moe":
            self.shared_F = int(cfg.get("shared_expert_intermediate_size", 0))
        elif family == "deepseek_v3":
            self.shared_F = self.F * int(cfg.get("n_shared_experts", 0) or 0)
            self.n_group = int(cfg.get("n_group", 1) or 1)
            self.topk_group = int(cfg.get("topk_group", 1) or 1)
            self.scale = float(cfg.get("routed_scaling_factor", 1.0))
            self.first_dense = int(cfg.get("first_k_dense_replace", 0) or 0)
            if self.E % self.n_group:
                raise ValueError(f"n_routed_experts {self.E} not divisible by n_group {self.n_group}")
            if self.K > self.topk_group * (self.E // self.n_group):
                raise ValueError("num_experts_per_tok exceeds the experts of the kept groups")
        elif family == "llama4":
            self.shared_F = self.F         # Llama4TextMLP uses intermediate_size
        elif family == "gpt_oss":
            self.limit = float(cfg.get("swiglu_limit", 7.0))
            self.alpha = 1.702
        # routing weights rounded to the compute dtype before use (see precision policy)
        self.round_weights = family in ("qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "llama4")
        if not 0 < self.K <= self.E:
            raise ValueError(f"K={self.K} must be in 1..E={self.E}")


def detect_family(cfg):
    mt = cfg.get("model_type", "")
    if mt not in MODEL_TYPE_TO_FAMILY:
        raise ValueError(f"unknown model_type {mt!r}; pass --family")
    return MODEL_TYPE_TO_FAMILY[mt]


# ----------------------------------------------------------------------------------------
# Weights of one layer, converted to one canonical Linear layout ([out, in], y = W x):
#   router_w [E, D], router_b [E] | None, corr_bias [E] | None,
#   gate, up [E, F, D] (gate None for seed), down [E, D, F],
#   gate_b, up_b [E, F], down_b [E, D] (gpt-oss only),
#   sh_gate, sh_up [Fs, D], sh_down [D, Fs], sh_gate_w [1, D] (qwen2 shared gate)

def _block_prefix(names, family, layer):
    """'<...>layers.{L}.<attr>.' of the MoE block, whatever the model prefix is."""
    for attr in BLOCK_ATTRS.get(family, ("mlp",)):
        pat = re.compile(r"^(.*?layers\.%d\.%s\.)" % (layer, re.escape(attr)))
        for n in sorted(names):
            m = pat.match(n)
            if m:
                return m.group(1)
    raise KeyError(f"no MoE block of layer {layer} in the checkpoint "
                   f"(looked for layers.{layer}.{'|'.join(BLOCK_ATTRS.get(family, ('mlp',)))})")


def load_layer(tensors, spec, layer):
    fam, E, D, F_ = spec.family, spec.E, spec.D, spec.F
    p = _block_prefix(tensors.keys(), fam, layer)

    def get(name, shape):
        full = p + name
        if full not in tensors:
            raise KeyError(f"missing tensor {full}")
        t = tensors[full].to(torch.float32)
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{full}: shape {tuple(t.shape)}, config implies {tuple(shape)}")
        return t

    def per_expert(fmt, shape):
        return torch.stack([get(fmt.format(e=e), shape) for e in range(E)])

    W = {"router_b": None, "corr_bias": None, "gate_b": None, "up_b": None,
         "down_b": None, "sh_gate": None, "sh_gate_w": None}
    if fam == "mixtral" and p.endswith("block_sparse_moe."):
        W["router_w"] = get("gate.weight", (E, D))
        W["gate"] = per_expert("experts.{e}.w1.weight", (F_, D))
        W["up"] = per_expert("experts.{e}.w3.weight", (F_, D))
        W["down"] = per_expert("experts.{e}.w2.weight", (D, F_))
    elif fam in ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "deepseek_v3"):
        W["router_w"] = get("gate.weight", (E, D))
        W["gate"] = per_expert("experts.{e}.gate_proj.weight", (F_, D))
        W["up"] = per_expert("experts.{e}.up_proj.weight", (F_, D))
        W["down"] = per_expert("experts.{e}.down_proj.weight", (D, F_))
    elif fam == "seed":
        W["router_w"] = get("gate.weight", (E, D))
        W["gate"] = None
        W["up"] = per_expert("experts.{e}.up_proj.weight", (F_, D))
        W["down"] = per_expert("experts.{e}.down_proj.weight", (D, F_))
    elif fam == "gpt_oss":
        W["router_w"] = get("router.weight", (E, D))
        W["router_b"] = get("router.bias", (E,))
        gu = get("experts.gate_up_proj", (E, D, 2 * F_))        # x @ gu: columns interleaved
        gub = get("experts.gate_up_proj_bias", (E, 2 * F_))
        W["gate"] = gu[:, :, 0::2].transpose(1, 2).contiguous()  # even columns: gate
        W["up"] = gu[:, :, 1::2].transpose(1, 2).contiguous()    # odd columns: up
        W["gate_b"], W["up_b"] = gub[:, 0::2].contiguous(), gub[:, 1::2].contiguous()
        W["down"] = get("experts.down_proj", (E, F_, D)).transpose(1, 2).contiguous()
        W["down_b"] = get("experts.down_proj_bias", (E, D))
    elif fam == "llama4":
        W["router_w"] = get("router.weight", (E, D))
        gu = get("experts.gate_up_proj", (E, D, 2 * F_))        # x @ gu: [gate | up]
        W["gate"] = gu[:, :, :F_].transpose(1, 2).contiguous()
        W["up"] = gu[:, :, F_:].transpose(1, 2).contiguous()
        W["down"] = get("experts.down_proj", (E, F_, D)).transpose(1, 2).contiguous()
    else:
        raise ValueError(f"unknown family {fam}")

    if fam == "deepseek_v3":
        if layer < spec.first_dense:
            raise ValueError(f"layer {layer} < first_k_dense_replace: dense, not MoE")
        W["corr_bias"] = get("gate.e_score_correction_bias", (E,))
    if spec.shared_F:
        Fs = spec.shared_F
        sh = {"qwen2_moe": "shared_expert.", "llama4": "shared_expert.",
              "deepseek_v3": "shared_experts."}[fam]
        W["sh_gate"] = get(sh + "gate_proj.weight", (Fs, D))
        W["sh_up"] = get(sh + "up_proj.weight", (Fs, D))
        W["sh_down"] = get(sh + "down_proj.weight", (D, Fs))
        if fam == "qwen2_moe":
            W["sh_gate_w"] = get("shared_expert_gate.weight", (1, D))
    return W


# ----------------------------------------------------------------------------------------
# Routing: returns (ids [T, K] int64 in rank order, weights [T, K] float32).

def route(spec, W, x, dtype, dsv3_mask_fill="inf"):
    fam, K = spec.family, spec.K
    if fam == "deepseek_v3":
        # Router in float32: s = sigmoid(l), c = s + b (bias only steers selection).
        logits = F.linear(x.float(), W["router_w"].float())
        s = torch.sigmoid(logits)
        c = s + W["corr_bias"]
        T, G = c.shape[0], spec.n_group
        per = spec.E // G
        grouped = c.view(T, G, per)
        # group score = sum of the two largest c in the group (fewer if the group is smaller)
        gscore = grouped.sort(dim=-1, descending=True).values[..., :min(2, per)].sum(-1)
        keep_groups = stable_topk(gscore, spec.topk_group)               # [T, topk_group]
        keep = torch.zeros(T, G, dtype=torch.bool)
        keep.scatter_(1, keep_groups, True)
        keep = keep.unsqueeze(-1).expand(T, G, per).reshape(T, spec.E)
        fill = float("-inf") if dsv3_mask_fill == "inf" else 0.0
        ids = stable_topk(torch.where(keep, c, torch.full_like(c, fill)), K)
        w = s.gather(1, ids)                                           # weights from s, not c
        if spec.norm_topk:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w * spec.scale

    logits = F.linear(x, W["router_w"])                                # compute dtype
    if W["router_b"] is not None:
        logits = logits + W["router_b"]
    if fam in ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe"):
        p = torch.softmax(logits.float(), dim=-1)                      # softmax over all E, f32
        ids = stable_topk(p, K)
        w = p.gather(1, ids)
        if spec.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        return ids, w
    if fam not in ("gpt_oss", "seed", "llama4"):
        raise ValueError(fam)
    ids = stable_topk(logits, K)                                       # selection on raw logits
    sel = logits.gather(1, ids).float()
    if fam == "llama4":
        return ids, torch.sigmoid(sel)                                 # per-expert gate, no mixing
    return ids, torch.softmax(sel, dim=-1)                             # softmax over the K chosen


# ----------------------------------------------------------------------------------------
# Expert FFNs (rows of h are tokens; every op returns the compute dtype).

def _silu(a):
    """silu in float32, rounded once to a's dtype (torch 1.13's CPU bf16 kernels round
    intermediate steps; current torch, which HF runs on, rounds once)."""
    return F.silu(a.float()).to(a.dtype)


def _sigmoid(a):
    return torch.sigmoid(a.float()).to(a.dtype)


def swiglu(h, wg, wu, wd):
    """W_down (silu(W_gate h) * (W_up h))."""
    return F.linear(_silu(F.linear(h, wg)) * F.linear(h, wu), wd)


def expert_ffn(spec, W, e, h):
    fam = spec.family
    if fam == "seed":
        return F.linear(F.linear(h, W["up"][e]), W["down"][e])         # no activation
    if fam == "gpt_oss":
        gate = F.linear(h, W["gate"][e]) + W["gate_b"][e]
        up = F.linear(h, W["up"][e]) + W["up_b"][e]
        gate = gate.clamp(max=spec.limit)                              # g = min(gate, limit)
        up = up.clamp(min=-spec.limit, max=spec.limit)                 # u = clamp(up, +-limit)
        glu = gate * _sigmoid(gate * spec.alpha)                       # g * sigmoid(1.702 g)
        return F.linear((up + 1) * glu, W["down"][e]) + W["down_b"][e]
    return swiglu(h, W["gate"][e], W["up"][e], W["down"][e])


def moe_forward(spec, W, x, dtype=torch.float32, dsv3_mask_fill="inf"):
    """y [T, D] (compute dtype) and expert ids [T, K] for x [T, D]."""
    Wc = {k: (v.to(dtype) if (v is not None and k != "corr_bias") else v) for k, v in W.items()}
    x = x.to(dtype)
    ids, w = route(spec, Wc, x, dtype, dsv3_mask_fill)
    if spec.round_weights:
        w = w.to(dtype).float()
    acc = torch.zeros(x.shape, dtype=torch.float32)                    # routed sum, float32
    for e in range(spec.E):                                            # ascending expert order
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        we = w[tok, slot].unsqueeze(-1)                                # [n_e, 1]
        if spec.family == "llama4":
            # the weight scales the expert's input: y_e = FFN_e(w * x)
            out = expert_ffn(spec, Wc, e, (x[tok].float() * we).to(dtype)).float()
        else:
            out = expert_ffn(spec, Wc, e, x[tok]).float() * we
            if spec.round_weights:
                out = out.to(dtype).float()                            # compute-dtype product
        acc.index_add_(0, tok, out)
    y = acc.to(dtype)
    if spec.shared_F:
        sh = swiglu(x, Wc["sh_gate"], Wc["sh_up"], Wc["sh_down"])
        if spec.family == "qwen2_moe":
            sh = _sigmoid(F.linear(x, Wc["sh_gate_w"])) * sh           # scalar gate per token
        y = y + sh
    return y, ids


def run(config, weights, x, layer=0, dtype="float32", family=None, dsv3_mask_fill="inf"):
    """Convenience entry: paths or loaded objects in, (y float32 numpy, ids int32 numpy) out."""
    cfg = json.load(open(config)) if isinstance(config, str) else config
    tensors = read_safetensors(weights) if isinstance(weights, str) else weights
    fam = family or detect_family(cfg)
    spec = Spec(cfg, fam)
    W = load_layer(tensors, spec, layer)
    xt = torch.from_numpy(np.asarray(x, dtype=np.float32))
    shape = xt.shape
    if shape[-1] != spec.D:
        raise ValueError(f"input last dim {shape[-1]} != hidden_size {spec.D}")
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    with torch.no_grad():
        y, ids = moe_forward(spec, W, xt.reshape(-1, spec.D), tdt, dsv3_mask_fill)
    return (y.float().reshape(shape).numpy(),
            ids.to(torch.int32).reshape(*shape[:-1], spec.K).numpy())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--input", required=True, help="x .npy, float32 [T, D] (or [..., D])")
    ap.add_argument("--output", required=True, help="y .npy, float32, same shape as x")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--family", choices=FAMILIES)
    ap.add_argument("--routing", help="write selected expert ids int32 [T, K] here")
    ap.add_argument("--dsv3-mask-fill", choices=["inf", "zero"], default="inf")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)       # fixed reduction order run to run
    try:
        y, ids = run(a.config, a.weights, np.load(a.input), a.layer, a.dtype, a.family,
                     a.dsv3_mask_fill)
    except (KeyError, ValueError, OSError) as exc:
        print(f"moe_ref: error: {exc}", file=sys.stderr)
        return 2
    np.save(a.output, y.astype(np.float32))
    if a.routing:
        np.save(a.routing, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
