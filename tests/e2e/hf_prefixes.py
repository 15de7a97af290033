#!/usr/bin/env python3
"""Tensor name prefixes: a checkpoint saved from another class of the same model.

HF's ForCausalLM, its base (text) model class and its multimodal class save the same
tensors under different prefixes (`model.layers.0...`, `layers.0...`,
`model.language_model.layers.0...`, `language_model.model.layers.0...`, and `transformer.` /
`backbone.` for DBRX and Nemotron-H). For each fixture family below, its committed
checkpoint is rewritten under every other known prefix (the tensor bytes untouched, only the
header's names renamed) and `moec run` on the layer import-hf writes must give exactly the
output of the original checkpoint. A checkpoint under an unknown prefix is refused with the
names tried and the nearest names present.

usage: hf_prefixes.py MOEC FIXTURES_DIR
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

import cases

PREFIXES = ["", "model.", "model.language_model.", "language_model.model.", "language_model.",
            "backbone.", "transformer."]
FAMILIES = ["qwen3_moe", "qwen3_vl_moe", "mistral4", "dbrx", "nemotron_h", "deepseek_v3", "axk1", "zaya"]


def own_prefix(name):
    for p in sorted(PREFIXES, key=len, reverse=True):
        if name.startswith(p):
            return p
    return ""


def rename(src, dst, to):
    """Copy the safetensors file src to dst with every tensor's prefix replaced by `to`."""
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        out[k if k == "__metadata__" else to + k[len(own_prefix(k)):]] = v
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + raw[8 + n:])


def main():
    moec, fixtures = sys.argv[1], sys.argv[2]
    tally = cases.Tally(48)
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES:
            d = os.path.join(fixtures, fam)
            x = os.path.join(d, "x_float32_T5.npy")
            moe = cases.import_layer(moec, d, 5, os.path.join(tmp, fam + ".moe"))
            base = os.path.join(tmp, fam + "_ref.npy")
            cases.run([moec, "run", moe, "--weights", os.path.join(d, "model.safetensors"), "--input", x, "-o", base])
            yref = np.load(base)
            own = own_prefix(open(moe).read().split('"')[1])
            for to in PREFIXES:
                if to == own:
                    continue
                name = "%s as '%s'" % (fam, to)
                with tally.case(name):
                    ck = os.path.join(tmp, "renamed.safetensors")
                    rename(os.path.join(d, "model.safetensors"), ck, to)
                    y = os.path.join(tmp, "y.npy")
                    cases.run([moec, "run", moe, "--weights", ck, "--input", x, "-o", y])
                    tally.check(name, np.array_equal(np.load(y), yref), "bitwise equal to the %r checkpoint" % own)
        d = os.path.join(fixtures, "qwen3_moe")
        with tally.case("unknown prefix refused"):
            ck = os.path.join(tmp, "bad.safetensors")
            rename(os.path.join(d, "model.safetensors"), ck, "decoder.")
            moe = os.path.join(tmp, "qwen3_moe.moe")
            p = subprocess.run([moec, "run", moe, "--weights", ck, "--input", os.path.join(d, "x_float32_T5.npy"),
                                "-o", os.path.join(tmp, "bad.npy")], capture_output=True, text=True)
            msg = p.stderr
            ok = (p.returncode != 0 and "tried 'model.layers.0.mlp.gate.weight', 'model.language_model.layers.0" in msg
                  and "'layers.0.mlp.gate.weight'" in msg and "nearest present: 'decoder.layers.0.mlp.gate.weight'" in msg
                  and not os.path.exists(os.path.join(tmp, "bad.npy")))
            tally.check("unknown prefix refused", ok, msg.strip().splitlines()[0][:300] if msg else "(no message)")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
