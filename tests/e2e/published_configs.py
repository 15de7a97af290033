#!/usr/bin/env python3
"""Published flagship config.json files (tests/fixtures/configs, sources in its
README) import on an MoE layer, and `moec stats` reports the model's real
dimensions. The expected numbers below were read off each published config by
hand; a quantized checkpoint's config (FP8, MXFP4) imports with its experts
dequantized from the packed checkpoint tensors (issue #14's `dequant`).

Then each compiles for TCP (issue 16, must-show 5) at T = 1 and T = 4096 in
bf16 and f32 with the shipped machine description: it compiles, or, when its
weights exceed the chip's HBM, it is refused with the HBM error (the sizes
and the hint), no output file. Which of the two is expected is computed here
from the dimensions above and the HBM size of MACHINE, not by moec: routed
experts E x 3 x D x F elements (quantized ones stored at most one byte each),
the shared expert 3 x D x S, in the compute type.

usage: published_configs.py MOEC CONFIGS_DIR [MACHINE_JSON]
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

# file: (layer, D, E, K, F, S (shared width, 0 = none), quantized)
MODELS = {
    "Mixtral-8x22B-v0.1": (0, 6144, 8, 2, 16384, 0, False),
    "Qwen3-235B-A22B": (0, 4096, 128, 8, 1536, 0, False),
    "Qwen3-Next-80B-A3B-Thinking": (0, 2048, 512, 10, 512, 512, False),
    "Qwen3-VL-30B-A3B-Instruct": (0, 2048, 128, 8, 768, 0, False),
    "DeepSeek-V2-Lite": (1, 2048, 64, 6, 1408, 2816, False),
    "DeepSeek-V3": (3, 7168, 256, 8, 2048, 2048, True),
    "Kimi-K2-Instruct": (1, 7168, 384, 8, 2048, 2048, True),
    "GLM-4.5": (3, 5120, 160, 8, 1536, 1536, False),
    "GLM-4.5-Air": (1, 4096, 128, 8, 1408, 1408, False),
    "gpt-oss-120b": (0, 2880, 128, 4, 2880, 0, True),
    "Llama-4-Maverick-17B-128E-Instruct": (1, 5120, 128, 1, 8192, 8192, False),
    "Hunyuan-A13B": (0, 4096, 64, 8, 3072, 3072, False),
    "OLMoE-1B-7B-0125-Instruct": (0, 2048, 64, 8, 1024, 0, False),
    "Phi-3.5-MoE-instruct": (0, 4096, 16, 2, 6400, 0, False),
    "DBRX": (0, 6144, 16, 4, 10752, 0, False),
    "MiniMax-M2": (0, 3072, 256, 8, 1536, 0, True),
    # Jamba: layer 0 is dense (expert_layer_period 2, expert_layer_offset 1), layer 1 the first MoE one
    "Jamba-v0.1": (1, 4096, 16, 2, 14336, 0, False),
    "Granite-3.1-3B-A800M-Instruct": (0, 1536, 40, 8, 512, 0, False),
    # flagship models beyond the list (the named ERNIE-4.5-21B-A3B and dots.llm1 configs
    # were not found; README)
    "Mixtral-8x7B-v0.1": (0, 4096, 8, 2, 14336, 0, False),
    "Qwen3-30B-A3B": (0, 2048, 128, 8, 768, 0, False),
    "Qwen3-Coder-480B-A35B-Instruct": (0, 6144, 160, 8, 2560, 0, False),
    "Qwen3.5-35B-A3B": (0, 2048, 256, 8, 512, 512, False),
    "DeepSeek-R1": (3, 7168, 256, 8, 2048, 2048, True),
    "DeepSeek-V3.2": (3, 7168, 256, 8, 2048, 2048, True),
    "gpt-oss-20b": (0, 2880, 32, 4, 2880, 0, True),
    "Llama-4-Scout-17B-16E-Instruct": (0, 5120, 16, 1, 8192, 8192, False),
    "MiniMax-M2.5": (0, 3072, 256, 8, 1536, 0, True),
    "MiMo-V2-Flash": (1, 4096, 256, 8, 2048, 0, True),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (1, 2688, 128, 6, 1856, 3712, False),
}

# SHA-256 of the HuggingFace hub's config.json, for the files whose bytes are known to equal it:
# the hashes are recorded, per hub revision, in dinoml/model-configs-rs corpus/report-repositories.json
# (commit 23d004779fcb; README). A copy that an editor re-indents or re-terminates fails here.
PUBLISHED_SHA256 = {
    "MiniMax-M2": "03d0b726553f72ee799f30f52f77b9292b873714abda76ee7e2683953373db87",
    "Jamba-v0.1": "98d005b3bdb7b4d3104ed3f8e6e8e45fa484846703012a11010d43aad768e984",
    "GLM-4.5": "a5dbd07371a8a51b0013a63a7a70543a7094af1a9598812b537133e6da78dda7",
    "GLM-4.5-Air": "e59f21d7be4b4b917d80bb3a2d1211356d29cf3aeff93372523daf7d0ffb839d",
    "DeepSeek-V3": "cbf0b95dc614de208a109bb5fd4e7eed11385e9c68411d2c17db5319443035d9",
    "gpt-oss-120b": "933aeb666a3fd851133ddd7686414f369bc564c4185fb5704416550879f10566",
    "gpt-oss-20b": "3a2a26ded679375b7928ddeca59764df7cea83220c1961035f6d6e232659e9ce",
    "Phi-3.5-MoE-instruct": "0b7d26ba176054d43f2b47012ec7cb01868ae7078693757f940e90c13e5bae15",
    "Qwen3-235B-A22B": "0ecd5d6fe6f2db6739e4e36ab06b88ebe7bd013ef31b9583f43796059a2b23a4",
    "Qwen3-30B-A3B": "2850ddb3bf7aecad20b611e2d44f3077fc8193f4827c93beddd4c02ad63c2297",
    "Qwen3.5-35B-A3B": "5e4d7f74fec2f360eb9cfbfcd6ec0c4c76e684d3a11caaed259d9fd9bfbc7944",
}

# Files copied verbatim from the hub's own page (indentation kept) with no third-party hash:
# the size the hub's page states for the file (README).
PUBLISHED_SIZE = {
    "Granite-3.1-3B-A800M-Instruct": 890,
}


def weight_bytes(D, E, F, S, quant, dtype):
    """A lower bound of the layer's weight bytes (router and biases left out)."""
    size = 4 if dtype == "f32" else 2
    return E * 3 * D * F * (1 if quant else size) + 3 * D * S * size


def compile_check(moec, moe_dir, name, cfg, layer, dims, hbm):
    """Compile at T in {1, 4096} x {bf16, f32}: the expected outcome or FAIL lines."""
    D, E, K, F, S, quant = dims
    bad = 0
    for dtype in ("bf16", "f32"):
        over = weight_bytes(D, E, F, S, quant, dtype) > hbm
        for T in (1, 4096):
            moe = os.path.join(moe_dir, "%s.%s.%d.moe" % (name, dtype, T))
            out = moe[:-4] + ".tcpb"
            p = subprocess.run([moec, "import-hf", cfg, "--layer", str(layer), "--tokens", str(T), "--set",
                                "dtype=" + dtype, "-o", moe], capture_output=True, text=True)
            if p.returncode == 0:
                p = subprocess.run([moec, "compile", moe, "--target=tcp", "-o", out], capture_output=True, text=True)
            made = os.path.exists(out)
            if over:
                ok = (p.returncode != 0 and not made and "GiB of HBM" in p.stderr and "--ep" in p.stderr
                      and "moec bug" not in p.stderr)
            else:
                ok = p.returncode == 0 and made
            print("%-4s %-36s %-4s T=%-4d %s" % ("ok" if ok else "FAIL", name, dtype, T,
                                               "HBM error (expected)" if over else "compiles"))
            if not ok:
                print("     rc=%d %s" % (p.returncode, p.stderr.strip()[:400]))
                bad += 1
            if made:
                os.unlink(out)
            os.unlink(moe)
    return bad


def main():
    moec, d = sys.argv[1], sys.argv[2]
    hbm = json.load(open(sys.argv[3]))["memory"]["hbm_bytes"] if len(sys.argv) > 3 else None
    bad = 0
    present = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json"))
    if sorted(MODELS) != present:
        print("FAIL the manifest and %s differ: %s" % (d, sorted(set(MODELS) ^ set(present))))
        bad += 1
    for name, want in sorted(PUBLISHED_SHA256.items()):
        got = hashlib.sha256(open(os.path.join(d, name + ".json"), "rb").read()).hexdigest()
        print("%-4s %-36s sha256 %s the hub's config.json" % ("ok" if got == want else "FAIL", name,
                                                              "equals" if got == want else "differs from"))
        bad += got != want
    for name, want in sorted(PUBLISHED_SIZE.items()):
        got = os.path.getsize(os.path.join(d, name + ".json"))
        print("%-4s %-36s %d bytes, the hub page states %d" % ("ok" if got == want else "FAIL", name, got, want))
        bad += got != want
    with tempfile.TemporaryDirectory() as tmp:
        for name, (layer, D, E, K, F, S, quant) in sorted(MODELS.items()):
            cfg, moe = os.path.join(d, name + ".json"), os.path.join(tmp, name + ".moe")
            cmd = [moec, "import-hf", cfg, "--layer", str(layer), "-o", moe]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print("FAIL %s: import-hf: %s" % (name, p.stderr.strip()))
                bad += 1
                continue
            if quant != ("dequant(" in open(moe).read()):
                print("FAIL %s: the import %s dequant" % (name, "lacks" if quant else "has"))
                bad += 1
            p = subprocess.run([moec, "stats", moe, "--json"], capture_output=True, text=True)
            if p.returncode != 0:
                print("FAIL %s: stats: %s" % (name, p.stderr.strip()))
                bad += 1
                continue
            dims = json.loads(p.stdout)["dims"]
            want = {"D": D, "E": E, "K": K, "F": F, "layer": layer}
            if S:
                want["S"] = S
            got = {k: dims.get(k) for k in want}
            if S == 0 and "S" in dims:
                got["S"] = dims["S"]
                want["S"] = None
            ok = got == want
            print("%-4s %-36s layer %-2d D=%s E=%s K=%s F=%s S=%s weights %.1f GB"
                  % ("ok" if ok else "FAIL", name, layer, dims.get("D"), dims.get("E"), dims.get("K"),
                     dims.get("F"), dims.get("S", "-"), json.loads(p.stdout)["weight_bytes"] / 1e9))
            if not ok:
                print("     expected %s" % want)
                bad += 1
            if hbm is not None:
                bad += compile_check(moec, tmp, name, cfg, layer, (D, E, K, F, S, quant), hbm)
    print("%d models, %d failed" % (len(MODELS), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
