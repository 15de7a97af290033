#!/usr/bin/env python3
"""Published flagship config.json files (tests/fixtures/configs, sources in its
README) import on an MoE layer, and `moec stats` reports the model's real
dimensions. The expected numbers below were read off each published config by
hand; a quantized checkpoint's config (FP8, MXFP4) imports with its experts
dequantized from the packed checkpoint tensors (issue #14's `dequant`).

usage: published_configs.py MOEC CONFIGS_DIR
"""
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
    # flagship models beyond the list (the named Granite-3.1-3B-A800M, ERNIE-4.5-21B-A3B,
    # MiniMax-M2, Jamba and dots.llm1 configs were not found; README)
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


def main():
    moec, d = sys.argv[1], sys.argv[2]
    bad = 0
    present = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json"))
    if sorted(MODELS) != present:
        print("FAIL the manifest and %s differ: %s" % (d, sorted(set(MODELS) ^ set(present))))
        bad += 1
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
    print("%d models, %d failed" % (len(MODELS), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
