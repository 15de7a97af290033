#!/usr/bin/env python3
"""Config keys absent from config.json take the defaults of the family's HF config class.

For each family below, DEFAULTS lists its HF configuration class's defaults of the keys
moec reads (transformers' configuration_<family>.py). A config with all of these keys
removed must import to exactly the layer of the same config with each key written out at
that value. HunYuanMoEV1Config has no moe_intermediate_size (its experts are
intermediate_size wide): the hunyuan fixture without that key must still match HF's own
block output.

usage: hf_defaults.py MOEC FIXTURES_DIR
"""
import json
import os
import sys
import tempfile

import numpy as np

import cases

DEFAULTS = {
    "mixtral": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, hidden_act="silu",
                    num_experts_per_tok=2, num_local_experts=8),
    "qwen3_moe": dict(hidden_size=2048, num_hidden_layers=24, hidden_act="silu", decoder_sparse_step=1,
                      moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128, norm_topk_prob=False),
    "deepseek_v3": dict(hidden_size=7168, moe_intermediate_size=2048, num_hidden_layers=61, n_shared_experts=1,
                        n_routed_experts=256, routed_scaling_factor=2.5, n_group=8, topk_group=4,
                        num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, hidden_act="silu"),
    "hunyuan_v1_moe": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, hidden_act="silu",
                           num_experts=1, moe_topk=1),
    "olmoe": dict(hidden_size=2048, intermediate_size=2048, num_hidden_layers=16, hidden_act="silu",
                  num_experts_per_tok=8, num_experts=64, norm_topk_prob=False),
    "qwen2_moe": dict(hidden_size=2048, num_hidden_layers=24, hidden_act="silu", decoder_sparse_step=1,
                      moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_experts_per_tok=4,
                      num_experts=60, norm_topk_prob=False),
    "gpt_oss": dict(num_hidden_layers=36, num_local_experts=128, hidden_size=2880, intermediate_size=2880,
                    num_experts_per_tok=4, swiglu_limit=7.0),
    "axk1": dict(hidden_size=7168, moe_intermediate_size=2048, num_hidden_layers=61, n_shared_experts=1,
                 n_routed_experts=192, routed_scaling_factor=2.5, n_group=8, topk_group=4, num_experts_per_tok=8,
                 first_k_dense_replace=1, norm_topk_prob=True, hidden_act="silu", rms_norm_eps=1e-6),
    "zaya": dict(hidden_size=2048, num_hidden_layers=40, hidden_act="silu", moe_intermediate_size=2048,
                 num_experts_per_tok=1, num_experts=16, router_hidden_size=256, rms_norm_eps=1e-5),
}
LAYER = {"deepseek_v3": 3, "axk1": 1, "zaya": 1}
# aliases of those keys the fixtures also write (attribute_map), removed with them
ALIASES = {"qwen3_moe": ["num_local_experts"], "mixtral": ["num_experts"], "deepseek_v3": ["num_local_experts"],
           "olmoe": ["num_local_experts"], "qwen2_moe": ["num_local_experts"], "gpt_oss": ["num_experts"],
           "hunyuan_v1_moe": ["moe_intermediate_size"]}


def body(path):
    return [l for l in open(path).read().splitlines() if not l.startswith("#")]


def main():
    moec, fixtures = sys.argv[1], sys.argv[2]
    tally = cases.Tally(40)
    with tempfile.TemporaryDirectory() as tmp:
        for fam, dflt in DEFAULTS.items():
            with tally.case(fam):
                cfg = json.load(open(os.path.join(fixtures, fam, "config.json")))
                for k in list(dflt) + ALIASES.get(fam, []):
                    cfg.pop(k, None)
                cfg.pop("moe_layer_freq", None)
                cfg.pop("mlp_only_layers", None)
                absent = os.path.join(tmp, "absent.json")
                json.dump(cfg, open(absent, "w"))
                explicit = os.path.join(tmp, "explicit.json")
                json.dump(dict(cfg, **dflt), open(explicit, "w"))
                outs = []
                for c in (absent, explicit):
                    o = os.path.join(tmp, os.path.basename(c) + ".moe")
                    cases.run([moec, "import-hf", c, "--layer", str(LAYER.get(fam, 0)), "-o", o])
                    outs.append(body(o))
                tally.check(fam, outs[0] == outs[1], "absent keys import as HF's defaults (%d keys)" % len(dflt))
        name = "hunyuan_v1_moe without moe_intermediate_size"
        with tally.case(name):
            d = os.path.join(fixtures, "hunyuan_v1_moe")
            cfg = json.load(open(os.path.join(d, "config.json")))
            del cfg["moe_intermediate_size"]
            c = os.path.join(tmp, "config.json")
            json.dump(cfg, open(c, "w"))
            moe = os.path.join(tmp, "hy.moe")
            cases.run([moec, "import-hf", c, "--tokens", "5", "-o", moe])
            y = os.path.join(tmp, "y.npy")
            cases.run([moec, "run", moe, "--weights", os.path.join(d, "model.safetensors"), "--input",
                       os.path.join(d, "x_float32_T5.npy"), "-o", y])
            ref = np.load(os.path.join(d, "y_float32_T5.npy"))
            err = float(np.max(np.abs(np.load(y) - ref)) / np.max(np.abs(ref)))
            tally.check(name, err <= 1e-4, "max err %.2e x max|y_hf|" % err)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
