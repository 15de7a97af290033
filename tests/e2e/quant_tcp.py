#!/usr/bin/env python3
"""Quantized experts on the TCP simulator (issue #14).

1. Weight-only (act=bf16, the default): for every fixture of tests/fixtures/quant (block FP8
   qwen3_moe and deepseek_v3, int4 deepseek_v3, per-channel FP8 llama4, MXFP4 gpt_oss) and a
   synthetic qwen3_moe layer whose 128x128 blocks are partial at the edges (D = 256,
   F = 320), `moec run --target=tcp` of the imported layer (bf16 compute) matches the float
   layer on the dequantized weights within 2e-2 x max|y|. The references are the fixtures'
   y_float32 files (written without moec, see tests/fixtures/quant/README.md) and, for the
   synthetic layer, tests/ref/moe_ref.py (PyTorch) on weights dequantized here in numpy.
   With the f32 compute type (bf16x3 contractions) the TCP run stays within 1e-4 x max|y|.
2. Costs: the TCP run of the quantized qwen3_moe layer reads fewer HBM bytes than the same
   layer with bf16 experts (import-hf --ignore-quantization on the dequantized weights).
3. act=fp8 (`--quant-act=fp8`) on block-FP8 layers (qwen3_moe, deepseek_v3 and a synthetic
   qwen3_moe layer with D = 256, F = 384: several 128-wide K chunks and scale blocks) matches
   a reference written here that quantizes activations as DeepSeek-V3's inference kernels do
   (per 1x128 group: s = max|a| / 448, q = e4m3(a / s) rounded to nearest even; each K chunk's
   fp8 x fp8 dot product in f32 scaled by s_a x s_w and summed in f32), within 2e-2 x max|y|;
   the program contracts f8e4m3 operands. On the synthetic layer the compiled .tcpb gives
   the bytes of the .moe run, and the program's block loop is as docs/tcp-isa.md 7.10
   describes it: gate and up values packed in one [E, 2F, D] tensor, the three scale
   tensors copied before the loop (none inside it), two activation quantizations (the
   block input once for gate and up, the SwiGLU output once).
4. A compiled .tcpb of a quantized layer (MXFP4, INT4, GPTQ, AWQ, compressed-tensors NVFP4)
   binds the checkpoint by its sources and gives the same bytes as the .moe run.
5. act="fp8" on MXFP4 weights, and --quant-act=int8, are errors that write nothing.
6. GPTQ (v1 act-order qwen3_moe, gptq_v2 mixtral), AWQ, NVFP4 (compressed-tensors on both
   families, ModelOpt on qwen3_moe) and W8A8 int8 (both families) on TCP at T = 1 and 64:
   with the f32 compute type against the fixtures' y_float32 (the formats' reference
   semantics, written without moec) within 1e-4 x max|y| (AWQ 2e-3: TCP rounds (q - z) x s
   once, to the compute type, where the reference rounds it to f16 first, about 2^-12
   relative per weight); with bf16 within 2e-2 at T = 1 and 5 (and 64 on qwen3_moe: on the
   mixtral T = 64 input one token's router scores nearly tie, and the bf16 logits pick
   another expert, on the host as on TCP). W8A8 with bf16 is checked at T = 5 and 64 against
   the numpy W8A8 block of tests/e2e/quant.py with its bf16 rounding steps. The W8A8
   program contracts i8 x i8 (scaled) only in its block loop; the GPTQ program binds each
   projection's dequantized weight as one packed bf16 tensor [E, N, K] (dequantized when
   the weights are bound) and reads no g_idx on the device.

usage: quant_tcp.py MOEC FIXTURES_DIR REF_DIR
"""
import json
import re
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant  # noqa: E402  (read_st, write_st, e4m3_np, dequantized)

TOL = 2e-2


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return p


def rel_err(got, ref):
    if got.shape != ref.shape:
        return float("inf")
    return float(np.max(np.abs(got.astype(np.float64) - ref))) / float(np.max(np.abs(ref)))


def tcp_run(moec, tmp, cfg, weights, x, T, extra=(), ignore=False, dtype="bf16"):
    moe, y, st = os.path.join(tmp, "l.moe"), os.path.join(tmp, "y.npy"), os.path.join(tmp, "s.json")
    run([moec, "import-hf", cfg, "--tokens", str(T), "--set", "dtype=" + dtype, "-o", moe]
        + (["--ignore-quantization"] if ignore else []))
    run([moec, "run", moe, "--target=tcp", "--weights", weights, "--input", x, "-o", y, "--stats", st]
        + list(extra))
    return np.load(y), json.load(open(st))


# ---- synthetic block-FP8 qwen3_moe layers (random valid E4M3 codes, f32 block scales) ----
def e4m3_codes(rng, shape):
    c = rng.integers(0, 256, size=shape, dtype=np.int64)
    c = np.where((c & 0x7F) == 0x7F, c ^ 1, c)  # no NaN codes
    return c.astype(np.uint8)


def synth(tmp, name, D, F, E=4, K=2, T=5, seed=7):
    rng = np.random.default_rng(seed)
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    cfg = json.load(open(os.path.join(FIXTURES, "qwen3_moe", "config.json")))
    cfg.update(hidden_size=D, moe_intermediate_size=F, num_experts=E, num_local_experts=E, num_experts_per_tok=K)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    st = {}
    pre = "model.layers.0.mlp."
    router = (rng.standard_normal((E, D)) * 0.5).astype(np.float32)
    st[pre + "gate.weight"] = ("F32", [E, D], router.tobytes())
    for e in range(E):
        for p, (n, k) in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            q = e4m3_codes(rng, (n, k))
            sn, sk = (n + 127) // 128, (k + 127) // 128
            s = (2.0 ** rng.integers(-9, -6, size=(sn, sk)) * rng.uniform(1, 2, size=(sn, sk))).astype(np.float32)
            st[pre + "experts.%d.%s.weight" % (e, p)] = ("F8_E4M3", [n, k], q.tobytes())
            st[pre + "experts.%d.%s.weight_scale_inv" % (e, p)] = ("F32", [sn, sk], s.tobytes())
    quant.write_st(os.path.join(d, "model.safetensors"), st)
    np.save(os.path.join(d, "x.npy"), rng.standard_normal((T, D)).astype(np.float32))
    return d


def load_ref():
    sys.path.insert(0, REF)
    import moe_ref
    return moe_ref


def float_ref(d, x, patch=None):
    """moe_ref (bf16 compute) on the dequantized checkpoint; patch replaces expert_ffn."""
    import torch
    moe_ref = load_ref()
    torch.set_num_threads(1)
    st = quant.read_st(os.path.join(d, "model.safetensors"))
    deq = quant.dequantized(st)
    tensors = {}
    for k, (dt, shape, data) in deq.items():
        if dt == "F32":
            a = np.frombuffer(data, "<f4").reshape(shape).copy()
        else:  # BF16
            a = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape).copy()
        tensors[k] = torch.from_numpy(a)
    saved, saved_sh = moe_ref.expert_ffn, moe_ref.swiglu
    if patch:
        moe_ref.expert_ffn, moe_ref.swiglu = patch(st)
    try:
        y, _ = moe_ref.run(os.path.join(d, "config.json"), tensors, x, dtype="bfloat16")
    finally:
        moe_ref.expert_ffn, moe_ref.swiglu = saved, saved_sh
    return y


# ---- the act=fp8 reference: DeepSeek-V3 act_quant + fp8_gemm semantics, in numpy ----
E4M3_POS = quant.e4m3_np(np.arange(127))  # codes 0..126: the finite non-negative values, increasing


def to_e4m3(y):
    """f32 -> E4M3fn value, round to nearest, ties to the even code; |y| past 464 is NaN
    (464 ties to 448: the next step, 480, would be the NaN code)."""
    a = np.abs(y).astype(np.float64)
    i = np.clip(np.searchsorted(E4M3_POS, a), 1, 126)
    lo, hi = E4M3_POS[i - 1].astype(np.float64), E4M3_POS[i].astype(np.float64)
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & ((i % 2) == 0))
    v = np.where(a <= 0, 0.0, np.where(pick_hi, hi, lo))
    v = np.where(a > 464, np.nan, v)
    return np.where(y < 0, -v, v).astype(np.float32)


def fp8_linear(h, q, s):
    """h [n, K] f32; q [O, K] E4M3 codes; s [O/128, K/128] f32 -> [n, O] f32."""
    w = quant.e4m3_np(q)
    n, K = h.shape
    acc = np.zeros((n, q.shape[0]), np.float32)
    for kc in range(K // 128):
        a = h[:, kc * 128:(kc + 1) * 128].astype(np.float32)
        sa = (np.max(np.abs(a), axis=1) / np.float32(448)).astype(np.float32)
        aq = to_e4m3(a / sa[:, None])
        part = (aq.astype(np.float64) @ w[:, kc * 128:(kc + 1) * 128].T.astype(np.float64)).astype(np.float32)
        sw = np.repeat(s[:, kc], 128)[:q.shape[0]]
        acc = (acc + part * sa[:, None] * sw[None, :]).astype(np.float32)
    return acc


def fp8_patch(st):
    """(expert_ffn, swiglu) for moe_ref: every block-FP8 linear, the routed experts' and the
    shared expert's (moe_ref's swiglu serves only the shared expert once expert_ffn is
    replaced), as DeepSeek's fp8_gemm runs it: --quant-act=fp8 marks every such dequant.
    The routed experts' SwiGLU rounds once (the loop's act="swiglu"); the shared expert's is
    the imported layer's ops, silu(g) = g * sigmoid(g) and its product with u, each rounded to
    the compute type (docs/semantics.md): the fp8 quantization of h turns a one-ulp
    difference there into e4m3 rounding flips, at the fixture's one 128-chunk per row."""
    import torch

    def mlp(pre, h, ops=False):
        def lin(x, p):
            k = pre + p + ".weight"
            dt, shape, data = st[k]
            q = np.frombuffer(data, np.uint8).reshape(shape)
            sdt, sshape, sdata = st[k + "_scale_inv"]
            s = np.frombuffer(sdata, "<f4").reshape((shape[0] + 127) // 128, (shape[1] + 127) // 128)
            y = fp8_linear(x.float().numpy(), q, s)
            return torch.from_numpy(y).to(x.dtype)  # DeepSeek's fp8_gemm writes the compute type
        g, u = lin(h, "gate_proj"), lin(h, "up_proj")
        if ops:
            sg = (g.float() * torch.sigmoid(g.float()).to(h.dtype).float()).to(h.dtype)
            return lin((sg.float() * u.float()).to(h.dtype), "down_proj")
        return lin((torch.nn.functional.silu(g.float()) * u.float()).to(h.dtype), "down_proj")

    def ffn(spec, W, e, h):
        return mlp("model.layers.0.mlp.experts.%d." % e, h)

    def shared(h, wg, wu, wd):
        pre = [p for p in ("model.layers.0.mlp.shared_experts.", "model.layers.0.mlp.shared_expert.")
               if p + "gate_proj.weight_scale_inv" in st]
        assert pre, "a shared expert without block-FP8 weights"
        return mlp(pre[0], h, ops=True)
    return ffn, shared


def main():
    global FIXTURES, REF
    moec, FIXTURES, REF = sys.argv[1], sys.argv[2], sys.argv[3]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        # 1. weight-only, every fixture
        # (f32 compute: the bf16x3 contractions keep the f32 layer's accuracy, 1e-4)
        for fam, T, dt, tol in (("qwen3_moe", 1, "bf16", TOL), ("qwen3_moe", 5, "bf16", TOL),
                                ("deepseek_v3", 5, "bf16", TOL), ("int4_deepseek_v3", 5, "bf16", TOL),
                                ("fp8ch_llama4", 5, "bf16", TOL), ("mxfp4_gpt_oss", 5, "bf16", TOL),
                                ("deepseek_v3", 5, "f32", 1e-4), ("int4_deepseek_v3", 5, "f32", 1e-4),
                                ("fp8ch_llama4", 5, "f32", 1e-4), ("mxfp4_gpt_oss", 5, "f32", 1e-4)):
            d = os.path.join(FIXTURES, fam)
            x = os.path.join(d, "x_float32_T%d.npy" % T)
            y, _ = tcp_run(moec, tmp, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"), x, T,
                           dtype=dt)
            err = rel_err(y, np.load(os.path.join(d, "y_float32_T%d.npy" % T)))
            print("%-4s tcp act=bf16 %-18s T=%d %-4s max|err| = %.2e x max|y| (tolerance %.0e)"
                  % ("ok" if err <= tol else "FAIL", fam, T, dt, err, tol))
            failed += err > tol
        d = synth(tmp, "edge", 256, 320)
        y, _ = tcp_run(moec, tmp, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"),
                       os.path.join(d, "x.npy"), 5)
        err = rel_err(y, float_ref(d, np.load(os.path.join(d, "x.npy"))))
        print("%-4s tcp act=bf16 synthetic D=256 F=320 (partial 128x128 blocks) max|err| = %.2e x max|y|"
              % ("ok" if err <= TOL else "FAIL", err))
        failed += err > TOL
        # 2. quantized bytes: fewer HBM bytes than the bf16 layer
        d = os.path.join(FIXTURES, "qwen3_moe")
        ck = os.path.join(tmp, "deq.safetensors")
        quant.write_st(ck, quant.dequantized(quant.read_st(os.path.join(d, "model.safetensors"))))
        x = os.path.join(d, "x_float32_T5.npy")
        _, sq = tcp_run(moec, tmp, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"), x, 5)
        _, sb = tcp_run(moec, tmp, os.path.join(d, "config.json"), ck, x, 5, ignore=True)
        good = sq["hbm_read_bytes"] < sb["hbm_read_bytes"]
        print("%-4s tcp qwen3_moe T=5 HBM bytes read: block FP8 %d, bf16 %d"
              % ("ok" if good else "FAIL", sq["hbm_read_bytes"], sb["hbm_read_bytes"]))
        failed += not good
        # 3. act=fp8
        # (deepseek_v3 at T = 1: 2 blocks of 8 experts, the scales gathered by the block list,
        # recipe_qgather.c; every case: the shared expert's scaled contractions outside the loop)
        cases = [("qwen3_moe", os.path.join(FIXTURES, "qwen3_moe"), "x_float32_T5.npy", 5),
                 ("deepseek_v3", os.path.join(FIXTURES, "deepseek_v3"), "x_float32_T5.npy", 5),
                 ("deepseek_v3", os.path.join(FIXTURES, "deepseek_v3"), "x_float32_T1.npy", 1),
                 ("synthetic D=256 F=384", synth(tmp, "chunks", 256, 384, seed=11), "x.npy", 5)]
        for name, d, xn, T in cases:
            x = os.path.join(d, xn)
            y, _ = tcp_run(moec, tmp, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"), x, T,
                           extra=["--quant-act=fp8"])
            ref = float_ref(d, np.load(x), patch=fp8_patch)
            err = rel_err(y, ref)
            # the activation rounding is visible: farther from the weight-only layer than from its reference
            err_wo = rel_err(y, float_ref(d, np.load(x)))
            good = err <= TOL and err < err_wo
            print("%-4s tcp act=fp8  %-22s T=%d max|err| = %.2e x max|y| against DeepSeek's fp8 scheme "
                  "(%.2e against the weight-only layer)" % ("ok" if good else "FAIL", name, T, err, err_wo))
            failed += not good
        # 3a. act=fp8 with a reduction cut into parts (recipe_qact.c fp8_split: D = 4096 leaves
        # 8 TRF rows per slice for one tile of the whole reduction, so gate and up, one
        # contraction of 2F outputs (tcp-pair-gate-up), are contracted in parts of whole
        # 128-chunks whose f32 partials are added in order):
        # the cut is in the schedule, and y keeps the tolerance against DeepSeek's scheme
        d = synth(tmp, "parts", 4096, 1024, T=128, seed=13)
        moe, sch = os.path.join(tmp, "p.moe"), os.path.join(tmp, "p.tsched")
        run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "128", "--set", "dtype=bf16", "-o", moe])
        run([moec, "compile", moe, "-o", sch, "--quant-act=fp8", "--emit=tcp-sched"])
        parts = sum('"fp8.part"' in l for l in open(sch).read().splitlines())
        y, _ = tcp_run(moec, tmp, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"),
                       os.path.join(d, "x.npy"), 128, extra=["--quant-act=fp8"])
        err = rel_err(y, float_ref(d, np.load(os.path.join(d, "x.npy")), patch=fp8_patch))
        good = parts >= 2 and err <= TOL
        print("%-4s tcp act=fp8  synthetic D=4096 F=1024 T=128, %d partial buffers: max|err| = %.2e x max|y| "
              "against DeepSeek's fp8 scheme" % ("ok" if good else "FAIL", parts, err))
        failed += not good
        # 3b. act=fp8 block loop (issue #14, decode at HBM rate): the gate and up values are one packed
        # [E, 2F, D] tensor (one fetch per block), the scales are copied into DM once before the loop,
        # the activation of gate and up is quantized once; the .tcpb binds the same checkpoint and gives
        # the bytes of the .moe run
        d = synth(tmp, "chunks", 256, 384, seed=11)
        moe, tcpb = os.path.join(tmp, "f.moe"), os.path.join(tmp, "f.tcpb")
        yb = os.path.join(tmp, "yf.npy")
        args = ["--weights", os.path.join(d, "model.safetensors"), "--input", os.path.join(d, "x.npy")]
        run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "5", "--set", "dtype=bf16", "-o", moe])
        run([moec, "compile", moe, "-o", tcpb, "--quant-act=fp8"])
        run([moec, "run", tcpb, "-o", yb] + args)
        y, _ = tcp_run(moec, tmp, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"),
                       os.path.join(d, "x.npy"), 5, extra=["--quant-act=fp8"])
        good = np.array_equal(np.load(yb), y)
        print("%-4s tcp act=fp8 synthetic D=256 F=384: the compiled .tcpb gives the bytes of the .moe run"
              % ("ok" if good else "FAIL"))
        failed += not good
        # the printed schedule: gate and up paired (tcp-pair-gate-up: their values and their
        # block scales each one packed tensor, one scaled contraction), the two scale tensors
        # (the pair's, down's) copied into DM before the loop (read in place at row $e), the
        # activation quantized once per projection input (two f.abs/r.fmax passes)
        sch = os.path.join(tmp, "f.tsched")
        run([moec, "compile", moe, "-o", sch, "--quant-act=fp8", "--emit=tcp-sched"])
        lines = open(sch).read().splitlines()
        bid = {m.group(2): m.group(1)
               for m in (re.match(r'buf %(\d+) "([^"]+)" hbm (weight|packed) ', l) for l in lines) if m}
        at = next(i for i, l in enumerate(lines) if l.lstrip().startswith("loop "))
        staged = [i for i, l in enumerate(lines) if "dma.copy" in l
                  for n in ("packed.0.up_s+gate_s", "down_s") if " s0=%%%s+0:" % bid.get(n, "?") in l]
        quants = [i for i, l in enumerate(lines) if "f.abs" in l and "r.fmax" in l and i > at]
        scaled = [l for l in lines if "tu.contract" in l and "scaled" in l]
        good = ("packed.1.up_q+gate_q" in bid and len(staged) == 2 and max(staged) < at and len(quants) == 2
                and len(scaled) == 2)
        print("%-4s tcp act=fp8 schedule: scales staged at lines %s (loop at %d), activation quantizations %s, "
              "%d scaled contractions" % ("ok" if good else "FAIL", staged, at, quants, len(scaled)))
        failed += not good
        # 4. a compiled .tcpb binds the packed checkpoint by its sources and gives the same bytes
        for fam in ("mxfp4_gpt_oss", "int4_deepseek_v3", "gptq_qwen3_moe", "awq_mixtral", "nvfp4_qwen3_moe"):
            d = os.path.join(FIXTURES, fam)
            moe, tcpb, yb = os.path.join(tmp, "b.moe"), os.path.join(tmp, "b.tcpb"), os.path.join(tmp, "yb.npy")
            run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "5", "--set", "dtype=bf16", "-o", moe])
            run([moec, "compile", moe, "-o", tcpb])
            args = ["--weights", os.path.join(d, "model.safetensors"), "--input", os.path.join(d, "x_float32_T5.npy")]
            run([moec, "run", tcpb, "-o", yb] + args)
            y, _ = tcp_run(moec, tmp, os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"),
                           os.path.join(d, "x_float32_T5.npy"), 5)
            good = np.array_equal(np.load(yb), y)
            print("%-4s tcp %-18s the compiled .tcpb gives the bytes of the .moe run" % ("ok" if good else "FAIL", fam))
            failed += not good
        # 5. act=fp8 asked where it cannot apply: an error, nothing written
        d = os.path.join(FIXTURES, "mxfp4_gpt_oss")
        moe, bad, out = os.path.join(tmp, "m.moe"), os.path.join(tmp, "bad.moe"), os.path.join(tmp, "never.tcpb")
        run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "5", "-o", moe])
        open(bad, "w").write(open(moe).read().replace('to=dtype)', 'to=dtype, act="fp8")'))
        for case, cmd, words in (
                ("act=\"fp8\" on MXFP4 weights", [moec, "compile", bad, "-o", out],
                 ["act=\"fp8\"", "applies to fp8 weights, not mxfp4", "bad.moe:"]),
                ("--quant-act=int8", [moec, "compile", moe, "-o", out, "--quant-act=int8"],
                 ["--quant-act must be bf16 or fp8, got 'int8'"])):
            p = subprocess.run(cmd, capture_output=True, text=True)
            good = p.returncode == 1 and not os.path.exists(out) and all(w in p.stderr for w in words)
            print("%-4s tcp reject: %s%s" % ("ok" if good else "FAIL", case, "" if good else "\n" + p.stderr))
            failed += not good
        moe, tcps = os.path.join(tmp, "c.moe"), os.path.join(tmp, "c.tcps")
        run([moec, "import-hf", os.path.join(FIXTURES, "qwen3_moe", "config.json"), "--tokens", "5", "--set",
             "dtype=bf16", "-o", moe])
        run([moec, "compile", moe, "-o", tcps, "--quant-act=fp8"])
        asm = open(tcps).read()
        good = any("trf" in line and "f8e4m3" in line for line in asm.splitlines())
        print("%-4s tcp act=fp8 contracts f8e4m3 operands (an f8e4m3 TRF tile)" % ("ok" if good else "FAIL"))
        failed += not good
        failed += new_formats(moec, tmp)
    print("%d failed" % failed)
    return 1 if failed else 0


NEW_FORMATS = (("gptq_qwen3_moe", 1e-4), ("gptq_mixtral", 1e-4), ("awq_qwen3_moe", 2e-3), ("awq_mixtral", 2e-3),
               ("nvfp4_qwen3_moe", 1e-4), ("nvfp4_mixtral", 1e-4), ("nvfp4mo_qwen3_moe", 1e-4),
               ("w8a8_qwen3_moe", 1e-4), ("w8a8_mixtral", 1e-4))


def new_formats(moec, tmp):
    """Section 6: GPTQ, AWQ, NVFP4 and W8A8 on TCP."""
    failed = 0
    for fam, tol32 in NEW_FORMATS:
        d = os.path.join(FIXTURES, fam)
        cfg, ck = os.path.join(d, "config.json"), os.path.join(d, "model.safetensors")
        w8a8 = fam.startswith("w8a8")
        cases = [(1, "f32"), (64, "f32")]
        cases += [(5, "bf16"), (64, "bf16")] if w8a8 else [(1, "bf16"), (5, "bf16")]
        if not w8a8 and "mixtral" not in fam:
            cases.append((64, "bf16"))
        for T, dt in cases:
            xf = os.path.join(d, "x_float32_T%d.npy" % T)
            y, _ = tcp_run(moec, tmp, cfg, ck, xf, T, dtype=dt)
            if dt == "bf16" and w8a8:
                st = quant.read_st(ck)
                ref = quant.w8a8_reference(st, json.load(open(cfg)), np.load(xf), bf16=True).astype(np.float64)
                what = "the numpy W8A8 block in bf16"
            else:
                ref = np.load(os.path.join(d, "y_float32_T%d.npy" % T))
                what = "the fixture's reference"
            tol = tol32 if dt == "f32" else TOL
            err = rel_err(y, ref)
            print("%-4s tcp %-18s T=%-2d %-4s max|err| = %.2e x max|y| against %s (tolerance %.0e)"
                  % ("ok" if err <= tol else "FAIL", fam, T, dt, err, what, tol))
            failed += err > tol
    # the programs: W8A8 contracts i8 x i8 in its block loop; GPTQ binds dequantized weights
    for fam, want in (("w8a8_mixtral", "i8"), ("gptq_qwen3_moe", "gptq")):
        d = os.path.join(FIXTURES, fam)
        moe, tcps = os.path.join(tmp, "n.moe"), os.path.join(tmp, "n.tcps")
        run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "64", "--set", "dtype=bf16", "-o", moe])
        run([moec, "compile", moe, "-o", tcps])
        asm = open(tcps).read().splitlines()
        dt = {m.group(1): m.group(2) for m in (re.match(r"tensor %(\d+) \S+ \S+ (\S+)", l) for l in asm) if m}
        con = [(dt.get(m.group(1)), "scaled" in l) for l in asm if "tu.contract" in l and "ph=expert" in l
               for m in [re.search(r" s0=%(\d+)", l)] if m]
        if want == "i8":  # gate and up contracted as one (tcp-pair-gate-up), then down
            good = len(con) >= 2 and all(c == ("i8", True) for c in con)
            print("%-4s tcp %s: the block loop's %d contractions are all scaled i8 x i8"
                  % ("ok" if good else "FAIL", fam, len(con)))
        else:
            packed = [l for l in asm if " hbm packed bf16 [16," in l]
            gidx = [l for l in asm if l.startswith("tensor") and "g_idx" in l]
            good = len(packed) == 3 and not gidx and len(con) >= 3 and all(c[0] == "bf16" for c in con)
            print("%-4s tcp %s: %d packed bf16 weights (dequantized when bound), g_idx read on the device: %s"
                  % ("ok" if good else "FAIL", fam, len(packed), bool(gidx)))
        failed += not good
    return failed


if __name__ == "__main__":
    sys.exit(main())
