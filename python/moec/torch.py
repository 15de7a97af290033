"""moec.torch: a compiled moec layer as a torch.nn.Module, run on the host in forward().

    from moec.torch import MoE
    block = MoE(moec.Layer.from_hf(config_dict), state_dict)   # or MoE.from_hf(path)
    model = torch.nn.Sequential(torch.nn.Linear(D, D), block, torch.nn.Linear(D, D))
    y = model(x)                                                 # CPU tensors in and out

forward(x) flattens x's leading dimensions into tokens, runs the layer compiled for that
many tokens (T is set per call; the host JIT cache makes a repeated T cheap) and returns
y with x's shape and dtype. It is forward only: no gradient flows through the layer.
"""
import numpy as np
import torch

from . import Layer


class MoE(torch.nn.Module):
    """Runs `layer` (a moec.Layer) with `weights` (a checkpoint path, a state dict of
    tensors keyed by checkpoint names, or {weight name: tensor}; default: the layer's
    checkpoint) on the host. threads, kernels and engine are moec run's."""

    def __init__(self, layer, weights=None, threads=None, kernels="auto", engine="llvm"):
        super().__init__()
        self.layer = layer
        self.weights = weights if weights is not None else layer.checkpoint
        self.threads = threads
        self.kernels = kernels
        self.engine = engine
        self.last_stats = None
        self._by_T = {}

    @classmethod
    def from_hf(cls, path, weights=None, layer=None, dtype=None, **kw):
        """The MoE block of a HuggingFace config (path, model directory or dict)."""
        return cls(Layer.from_hf(path, layer=layer, dtype=dtype), weights, **kw)

    def _layer(self, T):
        if self.layer.T == T:
            return self.layer
        if T not in self._by_T:
            self._by_T[T] = self.layer.with_set(T=T)
        return self._by_T[T]

    def forward(self, x):
        if x.device.type != "cpu":
            raise ValueError("moec.torch.MoE runs on the host: give CPU tensors (got %s)" % x.device)
        D = x.shape[-1]
        x2 = x.detach().reshape(-1, D)
        bf16 = self.layer.dtype == "bf16"
        y, stats = self._layer(x2.shape[0]).run(x2.contiguous(), self.weights, target="host", threads=self.threads,
                                               kernels=self.kernels, engine=self.engine, raw=bf16)
        self.last_stats = stats
        if bf16:
            out = torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(torch.bfloat16)
        else:
            out = torch.from_numpy(y)
        return out.reshape(x.shape).to(x.dtype)

    def extra_repr(self):
        return "layer=%s, dtype=%s" % (self.layer.name, self.layer.dtype)
