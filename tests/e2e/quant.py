#!/usr/bin/env python3
"""Quantized experts end to end (issue #14).

For every folder of tests/fixtures/quant (block FP8 qwen3_moe and deepseek_v3 written by
transformers; int4 pack-quantized deepseek_v3, fbgemm per-channel FP8 llama4 and mxfp4
gpt_oss written by make_quant.py there), and every saved input:
    moec import-hf config.json --tokens T -o layer.moe
    moec run layer.moe --weights model.safetensors --input x.npy -o y.npy   (host, LLVM)
and require max|y - y_ref| <= 1e-5 x max|y_ref| (y_ref: the float layer on the dequantized
weights, computed without moec). At T=5 the C engine must give the same bytes as LLVM, and
(qwen3_moe) a second LLVM run too.

Then checkpoints broken on purpose must be rejected with a message naming the tensor and
without writing the output: a scale tensor with the wrong count, a group size that does not
divide K, a U8 blocks tensor of the wrong length, an unsupported quant_method.

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
        for T in (1, 5, 64):
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
            if T == 5:  # engines agree bit for bit; a second run gives the same bytes
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


def expect_reject(case, cmd, out, words):
    p = run(cmd, ok=False)
    msg = p.stdout + p.stderr
    good = p.returncode != 0 and not os.path.exists(out) and all(w in msg for w in words) \
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
                "--input", os.path.join(d, "x_float32_T5.npy"), "-o", out]

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
    # 4. a quant_method moec does not read: import-hf says so and writes nothing
    d = broken("qwen3_moe", fixtures, tmp, edit_cfg=lambda c: c["quantization_config"].__setitem__(
        "quant_method", "awq"))
    failed += expect_reject("unsupported quant_method", [moec, "import-hf", os.path.join(d, "config.json"),
                                                         "-o", moe], moe, ["quant_method 'awq'"])
    return failed


def main():
    moec, fixtures = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        failed = numeric(moec, fixtures, tmp) + rejections(moec, fixtures, tmp)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
