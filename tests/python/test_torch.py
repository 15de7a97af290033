"""moec.torch.MoE inside a small PyTorch model (Linear -> MoE -> Linear)
gives the output of the same model built with the project's PyTorch reference block
(tests/ref/moe_ref.py, written from the formulas, not from moec), for every family the
reference implements, at the host float32 tolerance of the e2e suite (1e-4 x max|y|)."""
import json
import os

import numpy as np
import pytest
import torch

import moec
import moec.torch
import moe_ref
from conftest import FIXTURES
from hf_fixtures import TOL

REF_FAMILIES = ["mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3", "llama4"]


class RefBlock(torch.nn.Module):
    def __init__(self, cfg, tensors, family):
        super().__init__()
        self.spec = moe_ref.Spec(cfg, family)
        self.W = moe_ref.load_layer(tensors, self.spec, 0)

    def forward(self, x):
        y, _ = moe_ref.moe_forward(self.spec, self.W, x.reshape(-1, x.shape[-1]))
        return y.reshape(x.shape)


def models(fam, seed=0):
    d = os.path.join(FIXTURES, fam)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    tensors = moe_ref.read_safetensors(os.path.join(d, "model.safetensors"))
    D = int(cfg.get("text_config", cfg)["hidden_size"])
    g = torch.Generator().manual_seed(seed)
    lin1, lin2 = torch.nn.Linear(D, D), torch.nn.Linear(D, D)
    with torch.no_grad():
        for p in list(lin1.parameters()) + list(lin2.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(D))
    block = moec.torch.MoE(moec.Layer.from_hf(cfg, dtype="f32"), tensors)
    ours = torch.nn.Sequential(lin1, block, lin2)
    ref = torch.nn.Sequential(lin1, RefBlock(cfg, tensors, fam), lin2)
    x = torch.randn(2, 3, D, generator=g) * 2
    return ours, ref, x, block


@pytest.mark.parametrize("fam", REF_FAMILIES)
def test_model_matches_reference(fam):
    ours, ref, x, block = models(fam)
    with torch.no_grad():
        y = ours(x)
        yr = ref(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert block.last_stats["target"] == "host"
    err = float((y - yr).abs().max())
    scale = float(yr.abs().max())
    assert err <= TOL[("host", "float32")] * scale, "max|err| = %.3e = %.2e x max|y|" % (err, err / scale)


def test_token_counts_and_bf16():
    """Another token count reuses the layer with T set; a bf16 tensor runs a bf16 layer."""
    ours, ref, x, block = models("mixtral", seed=1)
    with torch.no_grad():
        y5 = ours(x[:, :2])                         # 4 tokens
        assert y5.shape == x[:, :2].shape
        assert float((y5 - ref(x[:, :2])).abs().max()) <= 1e-4 * float(ref(x[:, :2]).abs().max())
    d = os.path.join(FIXTURES, "mixtral")
    lb = moec.Layer.from_hf(d, dtype="bf16")
    mb = moec.torch.MoE(lb)                         # the model directory's checkpoint
    xb = torch.from_numpy(np.load(os.path.join(d, "x_bfloat16_T5.npy"))).to(torch.bfloat16)
    yb = mb(xb)
    assert yb.dtype == torch.bfloat16
    yref = np.load(os.path.join(d, "y_bfloat16_T5.npy"))
    err = float(np.max(np.abs(yb.float().numpy() - yref)))
    assert err <= TOL[("host", "bfloat16")] * float(np.max(np.abs(yref)))
