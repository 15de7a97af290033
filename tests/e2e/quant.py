#!/usr/bin/env python3
"""Quantized experts end to end (issue #14).

For every folder of tests/fixtures/quant (block FP8 qwen3_moe and deepseek_v3 written by
transformers; int4 pack-quantized deepseek_v3, fbgemm per-channel FP8 llama4 and mxfp4
gpt_oss written by make_quant.py there), and the saved inputs of T = 1 and 64:
    moec import-hf config.json --tokens T -o layer.moe
    moec run layer.moe --weights model.safetensors --input x.npy -o y.npy   (host, LLVM)
and require max|y - y_ref| <= 1e-5 x max|y_ref| (y_ref: the float layer on the dequantized
weights, computed without moec). At T=1 the C engine must give the same bytes as LLVM, and
(qwen3_moe) a second LLVM run too. With the bf16 compute type (block FP8 and MXFP4) the
result stays within 2e-2 x max|y|; so does W8A8 int8 with the bf16 compute type, against a
W8A8 block computed here in numpy from the checkpoint's int8 values and scales.

The quantized block-FP8 qwen3_moe and int4 deepseek_v3 layers give the same bits as the
unquantized layer (import-hf --ignore-quantization) run on weights dequantized here in numpy.
Every code of each format (all 256 E4M3 bytes, all MXFP4 bytes under extreme E8M0 scales, all
int4 nibbles) is decoded by the interpreter, the LLVM and the C engine to the same bits and
to the values of the format descriptions (computed here with numpy).

Then checkpoints broken on purpose must be rejected with a message naming the tensor and
without writing the output: a scale tensor with the wrong count, a group size that does not
divide K, a U8 blocks tensor of the wrong length, an F4 tensor of an odd element count, an
unsupported quant_method; for GPTQ and AWQ a g_idx of the wrong length, zero points or
values of the wrong shape, scales not stored F16, an out-of-range g_idx, unsupported bits /
versions / checkpoint formats (AWQ's also on the TCP target, which runs all these formats:
tests/e2e/quant_tcp.py). A rejected `run` writes neither its -o nor its --stats file.

usage: quant.py MOEC FIXTURES_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-5


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return p


def read_st(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}


def write_st(path, t):
    header, blobs, off = {}, [], 0
    for k in sorted(t):
        dt, shape, data = t[k]
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def numeric(moec, fixtures, tmp):
    failed = 0
    for fam in sorted(os.listdir(fixtures)):
        d = os.path.join(fixtures, fam)
        if not os.path.isfile(os.path.join(d, "config.json")):
            continue
        for T in (1, 64):
            x = os.path.join(d, "x_float32_T%d.npy" % T)
            moe, y = os.path.join(tmp, fam + ".moe"), os.path.join(tmp, "y.npy")
            run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", str(T), "--set", "dtype=f32", "-o", moe])
            base = [moec, "run", moe, "--weights", os.path.join(d, "model.safetensors"), "--input", x]
            run(base + ["-o", y, "--engine=llvm"])
            ref = np.load(os.path.join(d, "y_float32_T%d.npy" % T))
            got = np.load(y)
            err = float(np.max(np.abs(got.astype(np.float64) - ref))) if got.shape == ref.shape else float("inf")
            scale = float(np.max(np.abs(ref)))
            ok = err <= TOL * scale
            same = True
            if T == 1:  # engines agree bit for bit; a second run gives the same bytes
                yc = os.path.join(tmp, "yc.npy")
                run(base + ["-o", yc, "--engine=c"])
                same = open(y, "rb").read() == open(yc, "rb").read()
                if fam == "qwen3_moe":
                    run(base + ["-o", yc, "--engine=llvm"])
                    same &= open(y, "rb").read() == open(yc, "rb").read()
            print("%-4s %-18s T=%-3d max|err| = %.2e x max|y| (tolerance %.0e)%s"
                  % ("ok" if ok and same else "FAIL", fam, T, err / scale, TOL,
                     "" if same else "; runs or engines differ"))
            failed += not (ok and same)
    return failed


def bf16(moec, fixtures, tmp):
    """The bf16 compute type (dequant to bf16, as HF loads these checkpoints) stays within
    2e-2 x max|y| of the f32 reference, the bf16 tolerance of hf_fixtures.py."""
    failed = 0
    for fam in ("qwen3_moe", "mxfp4_gpt_oss"):
        d = os.path.join(fixtures, fam)
        moe, y = os.path.join(tmp, "b.moe"), os.path.join(tmp, "yb.npy")
        run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "64", "--set", "dtype=bf16", "-o", moe])
        run([moec, "run", moe, "--weights", os.path.join(d, "model.safetensors"), "--input",
             os.path.join(d, "x_float32_T64.npy"), "-o", y])
        ref = np.load(os.path.join(d, "y_float32_T64.npy"))
        err = float(np.max(np.abs(np.load(y).astype(np.float64) - ref))) / float(np.max(np.abs(ref)))
        print("%-4s %-18s T=64 bf16 compute: max|err| = %.2e x max|y| (tolerance 2e-02)"
              % ("ok" if err <= 2e-2 else "FAIL", fam, err))
        failed += err > 2e-2
    return failed


def bf16_rne(a):
    """a rounded to bf16 (nearest, ties to even), as f32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def w8a8_reference(st, cfg, x, bf16=False):
    """The W8A8 block in numpy, from the checkpoint's int8 values and scales as
    docs/semantics.md states the format (written here, independently of moec): per token
    row m = max(max|x|, 1e-10), q = round-half-away(x * f32(127 / m)), the i8 x i8 products
    summed exactly, times f32(m / 127) x weight_scale[n] in f32; softmax top-K routing in
    f32. bf16: as the reference framework runs a bf16 model: x, the router's weight and
    logits, each contraction's output, the SwiGLU activation and y rounded to bf16."""
    mix = cfg["model_type"] == "mixtral"
    pre = "model.layers.0.%s." % ("block_sparse_moe" if mix else "mlp")
    proj = ("w1", "w3", "w2") if mix else ("gate_proj", "up_proj", "down_proj")
    K = cfg["num_experts_per_tok"]
    norm = True if mix else bool(cfg.get("norm_topk_prob", False))
    rnd = bf16_rne if bf16 else (lambda a: np.asarray(a, dtype=np.float32))

    def f32(name):
        dt, shape, data = st[name]
        if dt == "BF16":
            return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        return np.frombuffer(data, {"F32": "<f4", "F16": "<f2"}[dt]).astype(np.float32).reshape(shape)

    def linear(v, w):
        m = np.maximum(np.abs(v).max(axis=1, keepdims=True), np.float32(1e-10)).astype(np.float32)
        a = (v * (np.float32(127.0) / m)).astype(np.float32).astype(np.float64)
        q = np.sign(a) * np.floor(np.abs(a) + 0.5)
        dt, shape, data = st[w + ".weight"]
        wq = np.frombuffer(data, np.int8).reshape(shape).astype(np.float64)
        acc = (q @ wq.T).astype(np.float32)  # exact: |sum| < 2^24
        return rnd((acc * (m / np.float32(127.0)).astype(np.float32)) * f32(w + ".weight_scale").T)
    x = rnd(x)
    logits = rnd(x @ rnd(f32(pre + "gate.weight")).T)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    y = np.zeros(x.shape, np.float32)
    for t in range(x.shape[0]):
        ids = np.argsort(-p[t], kind="stable")[:K]
        w = (p[t, ids] / (p[t, ids].sum() if norm else np.float32(1.0))).astype(np.float32)
        for e, we in sorted(zip(ids, w)):
            ex = pre + "experts.%d." % e
            g, u = linear(x[t:t + 1], ex + proj[0]), linear(x[t:t + 1], ex + proj[1])
            h = rnd(g / (np.float32(1.0) + np.exp(-g)) * u)
            y[t] += we * linear(h, ex + proj[2])[0]
    return rnd(y)


def w8a8_bf16(moec, fixtures, tmp):
    """W8A8 with the bf16 compute type (--set dtype=bf16) on the host, against the numpy
    W8A8 block above with the bf16 rounding steps: within 2e-2 x max|y| (the bf16 tolerance).
    The numpy block in f32 is first checked against the fixture's reference (make_quant.py's,
    1e-5), and the bf16 run must differ from the f32 run (the compute type is in effect)."""
    failed = 0
    for fam in ("w8a8_qwen3_moe", "w8a8_mixtral"):
        d = os.path.join(fixtures, fam)
        st = read_st(os.path.join(d, "model.safetensors"))
        cfg = json.load(open(os.path.join(d, "config.json")))
        for T in (5, 64):
            x = np.load(os.path.join(d, "x_float32_T%d.npy" % T))
            ref32 = w8a8_reference(st, cfg, x)
            self_err = float(np.max(np.abs(ref32 - np.load(os.path.join(d, "y_float32_T%d.npy" % T))))) / \
                float(np.max(np.abs(ref32)))
            ref = w8a8_reference(st, cfg, x, bf16=True).astype(np.float64)
            scale = float(np.max(np.abs(ref)))
            ys = {}
            for dt in ("bf16", "f32"):
                moe, y = os.path.join(tmp, "w%s.moe" % dt), os.path.join(tmp, "w%s.npy" % dt)
                run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", str(T), "--set", "dtype=" + dt,
                     "-o", moe])
                run([moec, "run", moe, "--weights", os.path.join(d, "model.safetensors"), "--input",
                     os.path.join(d, "x_float32_T%d.npy" % T), "-o", y])
                ys[dt] = np.load(y).astype(np.float64)
            err = float(np.max(np.abs(ys["bf16"] - ref))) / scale
            good = self_err <= TOL and err <= 2e-2 and not np.array_equal(ys["bf16"], ys["f32"])
            print("%-4s %-18s T=%-3d W8A8 bf16 compute: max|err| = %.2e x max|y| of the bf16 reference "
                  "(tolerance 2e-02; f32 reference vs fixture %.2e)" % ("ok" if good else "FAIL", fam, T, err, self_err))
            failed += not good
    return failed


def expect_reject(case, cmd, out, words):
    """cmd fails (not by a signal), its message holds every word, and neither `out` nor the
    --stats file of cmd (where it has one) exists."""
    p = run(cmd, ok=False)
    msg = p.stdout + p.stderr
    written = [f for f in [out] + [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "--stats"] if os.path.exists(f)]
    good = p.returncode != 0 and not written and all(w in msg for w in words) \
        and "Sanitizer" not in msg and p.returncode < 128
    print("%-4s reject: %s%s" % ("ok" if good else "FAIL", case, "" if good else "\n" + msg))
    return not good


def broken(name, fixtures, tmp, edit_st=None, edit_cfg=None):
    """A copy of fixture `name` with its checkpoint or config edited."""
    src, dst = os.path.join(fixtures, name), os.path.join(tmp, "broken_" + name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if edit_st:
        st = read_st(os.path.join(dst, "model.safetensors"))
        edit_st(st)
        write_st(os.path.join(dst, "model.safetensors"), st)
    if edit_cfg:
        cfg = json.load(open(os.path.join(dst, "config.json")))
        edit_cfg(cfg)
        json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    return dst


def rejections(moec, fixtures, tmp):
    failed = 0
    out = os.path.join(tmp, "never.npy")

    def run_cmd(d):
        moe = os.path.join(tmp, "b.moe")
        run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "5", "-o", moe])
        return [moec, "run", moe, "--weights", os.path.join(d, "model.safetensors"),
                "--input", os.path.join(d, "x_float32_T5.npy"), "--stats", os.path.join(tmp, "never.json"), "-o", out]

    # 1. a block-FP8 scale tensor with 4 scales where the 128x128 weight has one block
    bad = "model.layers.0.mlp.experts.3.gate_proj.weight_scale_inv"
    d = broken("qwen3_moe", fixtures, tmp,
               edit_st=lambda st: st.__setitem__(bad, ("F32", [2, 2], np.ones(4, "<f4").tobytes())))
    failed += expect_reject("FP8 scales of the wrong count", run_cmd(d), out, [bad, "[2, 2]"])
    # 2. int4 groups of 32 declared for rows of K = 48: import-hf compiles what it writes
    d = broken("int4_deepseek_v3", fixtures, tmp,
               edit_cfg=lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"]
               .__setitem__("group_size", 32))
    moe = os.path.join(tmp, "never.moe")
    failed += expect_reject("int4 group size that does not divide K", [moec, "import-hf", os.path.join(
        d, "config.json"), "-o", moe], moe, ["does not divide", "experts.{e}.gate_proj.weight_packed"])
    # 3. an MXFP4 blocks tensor whose rows hold 15 bytes, not 16
    blk = "model.layers.0.mlp.experts.gate_up_proj_blocks"

    def shorten(st):
        dt, shape, data = st[blk]
        a = np.frombuffer(data, np.uint8).reshape(shape)[..., :15]
        st[blk] = (dt, list(a.shape), a.tobytes())
    d = broken("mxfp4_gpt_oss", fixtures, tmp, edit_st=shorten)
    failed += expect_reject("U8 blocks of the wrong length", run_cmd(d), out, [blk, "15"])
    # 4. safetensors F4 (packed E2M1): an odd element count does not fill whole bytes
    d = broken("qwen3_moe", fixtures, tmp, edit_st=lambda st: st.__setitem__("extra.f4", ("F4", [3], b"\0\0")))
    failed += expect_reject("F4 tensor of an odd element count", run_cmd(d), out,
                            ["tensor 'extra.f4': 3 F4 elements do not fill whole bytes"])
    # 4b. int4 scales stored F32: the layer dequantizes in bf16, the scale's dtype, as
    # compressed-tensors does for the published bf16 scales; F32 scales are refused, not rounded
    sc = "model.layers.0.mlp.experts.2.up_proj.weight_scale"

    def widen(st):
        dt, shape, data = st[sc]
        a = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
        st[sc] = ("F32", shape, a.astype("<f4").tobytes())
    d = broken("int4_deepseek_v3", fixtures, tmp, edit_st=widen)
    failed += expect_reject("int4 scales of another dtype", run_cmd(d), out, [sc, "is F32", "bf16 scale"])
    # 5. a quant_method moec does not read: import-hf says so and writes nothing
    d = broken("qwen3_moe", fixtures, tmp, edit_cfg=lambda c: c["quantization_config"].__setitem__(
        "quant_method", "hqq"))
    failed += expect_reject("unsupported quant_method", [moec, "import-hf", os.path.join(d, "config.json"),
                                                         "-o", moe], moe, ["quant_method 'hqq'"])
    return failed + gptq_rejections(moec, fixtures, tmp, run_cmd) + awq_rejections(moec, fixtures, tmp, run_cmd) + \
        nvfp4_rejections(moec, fixtures, tmp, run_cmd) + w8a8_rejections(moec, fixtures, tmp, run_cmd)


def awq_rejections(moec, fixtures, tmp, run_cmd):
    """AWQ checkpoints broken on purpose: the tensor is named, nothing is written."""
    failed = 0
    out, moe = os.path.join(tmp, "never.npy"), os.path.join(tmp, "never.moe")
    pre = "model.layers.0.block_sparse_moe.experts.1.w2."  # down: K = 96, N = 48

    def put(name, code, shape, data):
        return lambda st: st.__setitem__(pre + name, (code, shape, data))
    d = broken("awq_mixtral", fixtures, tmp, edit_st=put("qzeros", "I32", [6, 5], np.zeros(30, "<i4").tobytes()))
    failed += expect_reject("awq zero points of the wrong shape", run_cmd(d), out, [pre + "qzeros", "[6, 5]"])
    d = broken("awq_mixtral", fixtures, tmp, edit_st=put("scales", "BF16", [6, 48], np.zeros(288, "<u2").tobytes()))
    failed += expect_reject("awq scales of the wrong dtype", run_cmd(d), out, [pre + "scales", "BF16", "f16"])
    d = broken("awq_mixtral", fixtures, tmp, edit_st=put("qweight", "I32", [96, 8], np.zeros(768, "<i4").tobytes()))
    failed += expect_reject("awq values of the wrong shape", run_cmd(d), out, [pre + "qweight", "[96, 8]"])
    for key, val, words in (("version", "gemv", ["version gemm only"]), ("zero_point", False, ["zero_point false"]),
                            ("bits", 8, ["bits 4 only"])):
        d = broken("awq_mixtral", fixtures, tmp, edit_cfg=lambda c: c["quantization_config"].__setitem__(key, val))
        failed += expect_reject("awq %s %s" % (key, val), [moec, "import-hf", os.path.join(d, "config.json"),
                                                           "-o", moe], moe, words)
    # the TCP target reads the same checkpoint: a broken one is refused there too, naming the tensor
    d = broken("awq_mixtral", fixtures, tmp, edit_st=put("qzeros", "I32", [6, 5], np.zeros(30, "<i4").tobytes()))
    failed += expect_reject("awq zero points of the wrong shape on the tcp target", run_cmd(d) + ["--target=tcp"],
                            out, [pre + "qzeros", "[6, 5]"])
    return failed


def w8a8_rejections(moec, fixtures, tmp, run_cmd):
    """W8A8 int8 checkpoints broken on purpose: the tensor is named, nothing is written; the
    activation quantization is in the host IR; configs moec does not read are refused."""
    failed = 0
    out, moe = os.path.join(tmp, "never.npy"), os.path.join(tmp, "never.moe")
    pre = "model.layers.0.block_sparse_moe.experts.1.w2."  # down: N = 48, K = 96

    def put(name, code, shape, size):
        return lambda st: st.__setitem__(pre + name, (code, shape, b"\x01" * size))
    for case, name, code, shape, size, words in (
            ("w8a8 scales of the wrong shape", "weight_scale", "F32", [48, 2], 384, ["[48, 2]"]),
            ("w8a8 scales of the wrong dtype", "weight_scale", "I32", [48, 1], 192, ["is I32"]),
            ("w8a8 values of the wrong shape", "weight", "I8", [48, 95], 48 * 95, ["[48, 95]"]),
            ("w8a8 values of the wrong dtype", "weight", "U8", [48, 96], 48 * 96, ["is U8", "stored I8"])):
        d = broken("w8a8_mixtral", fixtures, tmp, edit_st=put(name, code, shape, size))
        failed += expect_reject(case, run_cmd(d), out, [pre + name] + words)
    grp = lambda c: c["quantization_config"]["config_groups"]["group_0"]  # noqa: E731
    for case, edit in (("no input_activations (weight-only)", lambda c: grp(c).__setitem__("input_activations", None)),
                       ("static activation scales", lambda c: grp(c)["input_activations"].__setitem__("dynamic", False)),
                       ("per-tensor activations", lambda c: grp(c)["input_activations"].__setitem__("strategy", "tensor")),
                       ("asymmetric weights", lambda c: grp(c)["weights"].__setitem__("symmetric", False))):
        d = broken("w8a8_qwen3_moe", fixtures, tmp, edit_cfg=edit)
        failed += expect_reject("w8a8 config: " + case, [moec, "import-hf", os.path.join(d, "config.json"), "-o", moe],
                                moe, ["int-quantized is read"])
    d = os.path.join(fixtures, "w8a8_mixtral")
    wm = os.path.join(tmp, "w.moe")
    run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "5", "-o", wm])
    ir = run([moec, "ir", wm, "--pipeline", "host"]).stdout
    # one row maximum for x (gate and up share it) and one for the activation h before down
    good = ir.count("reduce_max(") == 2 and ir.count('act="int8"') == 3
    print("%-4s w8a8: the host IR quantizes the experts' input rows (reduce_max x %d)" % (
        "ok" if good else "FAIL", ir.count("reduce_max(")))
    failed += not good
    return failed


def nvfp4_rejections(moec, fixtures, tmp, run_cmd):
    """NVFP4 checkpoints broken on purpose: the tensor is named, nothing is written."""
    failed = 0
    out, moe = os.path.join(tmp, "never.npy"), os.path.join(tmp, "never.moe")
    pre = "model.layers.0.block_sparse_moe.experts.1.w2."  # down: N = 48, K = 96

    def put(name, code, shape, data, p=pre):
        return lambda st: st.__setitem__(p + name, (code, shape, data))
    for case, name, code, shape, words in (
            ("nvfp4 scales of the wrong dtype", "weight_scale", "BF16", [48, 6], ["is BF16", "f8e4m3"]),
            ("nvfp4 scales of the wrong shape", "weight_scale", "F8_E4M3", [48, 5], ["[48, 5]"]),
            ("nvfp4 packed values of the wrong length", "weight_packed", "U8", [48, 47], ["[48, 47]"]),
            ("nvfp4 global scale not a scalar", "weight_global_scale", "F32", [2], ["[2]"]),
            ("nvfp4 global scale of the wrong dtype", "weight_global_scale", "F16", [1], ["is F16", "stored F32"])):
        size = int(np.prod(shape)) * {"BF16": 2, "F16": 2, "F32": 4}.get(code, 1)
        d = broken("nvfp4_mixtral", fixtures, tmp, edit_st=put(name, code, shape, b"\x01" * size))
        failed += expect_reject(case, run_cmd(d), out, [pre + name] + words)
    mo = "model.layers.0.mlp.experts.4.gate_proj."
    d = broken("nvfp4mo_qwen3_moe", fixtures, tmp, edit_st=put("weight_scale_2", "F32", [1, 2], b"\0" * 8, mo))
    failed += expect_reject("modelopt weight_scale_2 not a scalar", run_cmd(d), out, [mo + "weight_scale_2", "[1, 2]"])
    for fam, edit, words in (
            ("nvfp4mo_qwen3_moe", lambda c: c["quantization_config"].__setitem__("quant_algo", "W4A8_AWQ"),
             ["quant_algo \"NVFP4\" only"]),
            ("nvfp4_mixtral", lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"]
             .__setitem__("group_size", 32), ["group_size 16 only"])):
        d = broken(fam, fixtures, tmp, edit_cfg=edit)
        failed += expect_reject("%s config" % fam, [moec, "import-hf", os.path.join(d, "config.json"), "-o", moe],
                                moe, words)
    # ModelOpt's own layout: the quantization config in hf_quant_config.json beside config.json
    def split(c):
        q = c.pop("quantization_config")
        q.pop("quant_method")
        with open(os.path.join(tmp, "broken_nvfp4mo_qwen3_moe", "hf_quant_config.json"), "w") as f:
            json.dump({"producer": {"name": "modelopt"}, "quantization": q}, f)
    d = broken("nvfp4mo_qwen3_moe", fixtures, tmp, edit_cfg=split)
    y = os.path.join(tmp, "hq.npy")
    c = run_cmd(d)
    i = c.index("--stats")
    run(c[:i] + c[i + 2:-1] + [y])
    ref = np.load(os.path.join(d, "y_float32_T5.npy"))
    err = float(np.max(np.abs(np.load(y).astype(np.float64) - ref))) / float(np.max(np.abs(ref)))
    print("%-4s nvfp4mo_qwen3_moe from hf_quant_config.json: T=5 max|err| = %.2e x max|y|" % (
        "ok" if err <= TOL else "FAIL", err))
    failed += err > TOL
    with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt"}, "quant_algo": "NVFP4"}, f)
    failed += expect_reject("hf_quant_config.json without a quantization object", [
        moec, "import-hf", os.path.join(d, "config.json"), "-o", moe], moe,
        ["hf_quant_config.json", "no \"quantization\" object"])
    return failed


def gptq_rejections(moec, fixtures, tmp, run_cmd):
    """GPTQ checkpoints broken on purpose: the tensor is named, nothing is written."""
    failed = 0
    out = os.path.join(tmp, "never.npy")
    pre = "model.layers.0.mlp.experts.2.up_proj."

    def put(name, code, shape, data):
        return lambda st: st.__setitem__(pre + name, (code, shape, data))
    # g_idx with 40 entries for K = 48 input channels
    d = broken("gptq_qwen3_moe", fixtures, tmp, edit_st=put("g_idx", "I32", [40], np.zeros(40, "<i4").tobytes()))
    failed += expect_reject("gptq g_idx of the wrong length", run_cmd(d), out, [pre + "g_idx", "[40]"])
    # zero points [3, 5]: 48 output channels packed 8 per word need [3, 6]
    d = broken("gptq_qwen3_moe", fixtures, tmp, edit_st=put("qzeros", "I32", [3, 5], np.zeros(15, "<i4").tobytes()))
    failed += expect_reject("gptq zero points of the wrong shape", run_cmd(d), out, [pre + "qzeros", "[3, 5]"])
    # scales stored F32: the reference would dequantize in f32, not f16
    d = broken("gptq_qwen3_moe", fixtures, tmp, edit_st=put("scales", "F32", [3, 48], np.ones(144, "<f4").tobytes()))
    failed += expect_reject("gptq scales of the wrong dtype", run_cmd(d), out, [pre + "scales", "F32", "f16"])
    # a g_idx entry naming group 3 of 3: a fault at run time, no output
    gi = np.arange(48, dtype="<i4") // 16
    gi[7] = 3
    d = broken("gptq_qwen3_moe", fixtures, tmp, edit_st=put("g_idx", "I32", [48], gi.tobytes()))
    for eng, words in (("interp", ["g_idx[7] = 3 is outside the 3 groups"]), ("llvm", ["g_idx of dequant"])):
        c = run_cmd(d)
        if eng == "interp":  # the interpreter takes no --stats
            i = c.index("--stats")
            c = c[:i] + c[i + 2:]
        failed += expect_reject("gptq g_idx out of range (%s)" % eng, c + ["--engine", eng], out, words)
    # 8-bit GPTQ and an unknown checkpoint_format are refused by import-hf
    moe = os.path.join(tmp, "never.moe")
    for key, val, words in (("bits", 8, ["bits 4 only"]), ("checkpoint_format", "gptq_v9", ["checkpoint_format"])):
        d = broken("gptq_mixtral", fixtures, tmp, edit_cfg=lambda c: c["quantization_config"].__setitem__(key, val))
        failed += expect_reject("gptq %s %s" % (key, val), [moec, "import-hf", os.path.join(d, "config.json"),
                                                            "-o", moe], moe, words)
    return failed


CODES_MOE = """layer codes {
  dim N = 4
  input x : [1, 1]
  weight q8 : f8e4m3[N, 256] = "q8"
  weight s8 : f32[N, 1] = "s8"
  weight qm : u8[N, 128] = "qm"
  weight sm : u8[N, 8] = "sm"
  weight q4 : i32[N, 2] = "q4"
  weight s4 : bf16[N, 1] = "s4"
  a = dequant(q8, s8, format="fp8", block=[1, 256])
  b = dequant(qm, sm, format="mxfp4", block=[1, 32])
  c = dequant(q4, s4, format="int4", block=[1, 16])
  output concat(a, b, c, axis=1)
}
"""


def codes(moec, tmp):
    """Every E4M3 code, every MXFP4 byte under E8M0 scales 0, 1, 126, 127, 128, 200, 254, 255,
    every int4 nibble: the three engines give the same bits, and the values of the format
    descriptions (computed here in numpy; NaN where the format says NaN, signed zeros kept)."""
    n = 4
    q8 = np.tile(np.arange(256, dtype=np.uint8), (n, 1))
    s8 = np.array([[1.0], [0.5], [3.0], [2.0 ** -20]], np.float32)
    qm = np.array([np.arange(128), np.arange(128, 256)] * 2, dtype=np.uint8)
    sm = np.array([[0, 1, 126, 127, 128, 200, 254, 255]] * n, dtype=np.uint8)
    words = np.zeros((n, 2), dtype=np.uint32)
    for i in range(8):
        words[:, 0] |= np.uint32(i) << np.uint32(4 * i)
        words[:, 1] |= np.uint32(8 + i) << np.uint32(4 * i)
    s4bits = np.array([[0x3F80], [0x3E80], [0xC040], [0x3A83]], np.uint16)  # bf16 1, .25, -3, ~1e-3
    write_st(os.path.join(tmp, "codes.safetensors"), {
        "q8": ("F8_E4M3", [n, 256], q8.tobytes()), "s8": ("F32", [n, 1], s8.tobytes()),
        "qm": ("U8", [n, 128], qm.tobytes()), "sm": ("U8", [n, 8], sm.tobytes()),
        "q4": ("I32", [n, 2], words.view(np.int32).tobytes()), "s4": ("BF16", [n, 1], s4bits.tobytes())})
    moe = os.path.join(tmp, "codes.moe")
    open(moe, "w").write(CODES_MOE)
    np.save(os.path.join(tmp, "x11.npy"), np.zeros((1, 1), np.float32))
    outs = []
    for e in ("interp", "llvm", "c"):
        y = os.path.join(tmp, "codes_%s.npy" % e)
        run([moec, "run", moe, "--weights", os.path.join(tmp, "codes.safetensors"), "--input",
             os.path.join(tmp, "x11.npy"), "-o", y, "--engine=" + e])
        outs.append(open(y, "rb").read())
    got = np.load(y)
    # E4M3fn: bias 7, subnormals m x 2^-9, S.1111.111 NaN
    c = np.arange(256)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    e4 = np.where(c & 0x80, -v, v).astype(np.float32)
    want_a = e4[None, :] * s8
    # MXFP4: byte j holds element 2j (low nibble) and 2j+1 (high); E2M1 with bit 3 the sign
    nib = np.stack([qm & 15, qm >> 4], axis=2).reshape(n, 256).astype(np.int64)
    mag = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)[nib & 7]
    e2 = np.where(nib & 8, -mag, mag).astype(np.float32)
    with np.errstate(over="ignore"):  # 2^128 (code 255, NaN anyway) and 6 x 2^127 overflow f32 to inf
        sc = np.where(sm == 255, np.nan, np.ldexp(np.float32(1), np.minimum(sm.astype(np.int32), 254) - 127))
        want_b = e2 * np.repeat(sc.astype(np.float32), 32, axis=1)
    # int4: nibble i of word j is element 8j+i, value nibble - 8
    s4 = (s4bits.astype(np.uint32) << 16).view(np.float32)
    want_c = (np.arange(16, dtype=np.float32) - 8)[None, :] * s4
    want = np.concatenate([want_a, want_b, want_c], axis=1).astype(np.float32)
    same_bits = outs[0] == outs[1] == outs[2]
    nan_ok = np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    val_ok = np.array_equal(got[fin], want[fin]) and np.array_equal(np.signbit(got[fin]), np.signbit(want[fin]))
    good = same_bits and nan_ok and val_ok
    print("%-4s every code of the three formats: engines %s, values %s" % (
        "ok" if good else "FAIL", "bit-identical" if same_bits else "DIFFER",
        "as the formats define" if nan_ok and val_ok else "WRONG"))
    return not good


def e4m3_np(c):
    c = c.astype(np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return np.where(c & 0x80, -v, v).astype(np.float32)


def bf16_round(a):
    """float32 -> the nearest-even bfloat16 value, as float32."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def dequantized(st):
    """The float checkpoint of a block-FP8 or int4 pack-quantized one, dequantized in numpy
    under the unquantized tensor names, in each format's reference semantics: block FP8 in
    f32 (HF's FP8 dequantize multiplies in f32), int4 pack-quantized in its scale's dtype
    (compressed-tensors: q.to(bf16) * scale, each product rounded to bf16)."""
    out = {}
    for k, (dt, shape, data) in st.items():
        if k.endswith("_scale_inv") or k.endswith(".weight_scale") or k.endswith(".weight_shape"):
            continue
        if dt == "F8_E4M3":
            w = e4m3_np(np.frombuffer(data, np.uint8).reshape(shape))
            s = np.frombuffer(st[k + "_scale_inv"][2], "<f4").reshape(
                (shape[0] + 127) // 128, (shape[1] + 127) // 128)
            w = w * np.repeat(np.repeat(s, 128, 0), 128, 1)[:shape[0], :shape[1]]
        elif k.endswith(".weight_packed"):
            base = k[:-len("_packed")]
            n, kk = np.frombuffer(st[base + "_shape"][2], "<i4")
            words = np.frombuffer(data, "<u4").reshape(shape)
            nib = np.stack([(words >> np.uint32(4 * i)) & 15 for i in range(8)], axis=2).reshape(n, -1)[:, :kk]
            sdt, sshape, sdata = st[base + "_scale"]
            sc = (np.frombuffer(sdata, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(sshape)
            w, k = bf16_round((nib.astype(np.float32) - 8) * np.repeat(sc, kk // sshape[1], axis=1)), base
        elif dt in ("F32", "BF16"):
            out[k] = (dt, shape, data)
            continue
        else:
            raise RuntimeError("unexpected tensor %s %s" % (k, dt))
        out[k] = ("F32", list(w.shape), w.astype("<f4").tobytes())
    return out


def exact(moec, fixtures, tmp):
    """Quantized run == the unquantized layer (--ignore-quantization) on the dequantized
    weights, bit for bit (f32)."""
    failed = 0
    for fam in ("qwen3_moe", "int4_deepseek_v3"):
        d = os.path.join(fixtures, fam)
        ck = os.path.join(tmp, "deq.safetensors")
        write_st(ck, dequantized(read_st(os.path.join(d, "model.safetensors"))))
        ys = []
        for ign, w in ((False, os.path.join(d, "model.safetensors")), (True, ck)):
            moe, y = os.path.join(tmp, "e.moe"), os.path.join(tmp, "e%d.npy" % ign)
            run([moec, "import-hf", os.path.join(d, "config.json"), "--tokens", "5", "--set", "dtype=f32", "-o", moe]
                + (["--ignore-quantization"] if ign else []))
            run([moec, "run", moe, "--weights", w, "--input", os.path.join(d, "x_float32_T5.npy"), "-o", y])
            ys.append(open(y, "rb").read())
        good = ys[0] == ys[1]
        print("%-4s %-18s T=5 quantized run %s the float layer on the dequantized weights" % (
            "ok" if good else "FAIL", fam, "bit-identical to" if good else "DIFFERS from"))
        failed += not good
    return failed


def main():
    moec, fixtures = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        failed = codes(moec, tmp) + exact(moec, fixtures, tmp) + numeric(moec, fixtures, tmp) + \
            bf16(moec, fixtures, tmp) + w8a8_bf16(moec, fixtures, tmp) + rejections(moec, fixtures, tmp)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
