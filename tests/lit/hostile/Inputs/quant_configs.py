"""Writes the quantization_config reproducers of quant_config.test into argv[1]."""
import json
import os
import sys

out = sys.argv[1]
base = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
        "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "torch_dtype": "bfloat16"}
ct = {"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                                                                      "strategy": "channel", "symmetric": True}}}}


def write(name, cfg):
    with open(os.path.join(out, name), "w") as f:
        json.dump(cfg, f)


# 25 ".*" and a letter no name holds: exponential for a backtracking matcher
write("stars.json", dict(base, quantization_config=dict(ct, ignore=["lm_head", "re:" + ".*" * 25 + "Q"] +
                                                         ["re:.*padding_%d$" % i for i in range(60)])))
# 300,000 bytes of ".*"
write("long.json", dict(base, quantization_config=dict(ct, ignore=["re:" + ".*" * 150000])))
# groups nested 200,000 deep
write("deep.json", dict(base, quantization_config=dict(ct, ignore=["re:" + "(" * 200000])))
# MiniMax-M2's list on a family whose experts are gate_proj / up_proj / down_proj
write("minimax_list.json", dict(base, quantization_config={
    "quant_method": "fp8", "weight_block_size": [128, 128],
    "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}))
# one that excludes the experts of layer 1 only, by a regex prefix
write("layer1.json", dict(base, quantization_config={
    "quant_method": "fp8", "weight_block_size": [128, 128],
    "modules_to_not_convert": ["model\\.layers\\.1\\.mlp\\.experts"]}))
