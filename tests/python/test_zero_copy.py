"""Zero copy: arrays cross into the library as moe_tensor views where the layout allows.
The weights of a layer given by its weight names (C-contiguous, the node's dtype; bf16 as
uint16 or torch.bfloat16) and the input are neither copied by Python (tracemalloc sees no
weight-sized allocation) nor by the library (its allocator never holds that much live),
and the result equals the one from the same weights as a state dict (which the library
converts and stacks into its own tensors, as from a file). The host runs use the portable
kernels: the avx512bf16 kernels copy bf16 expert weights into their tile layout once per
run by design (docs/abi.md), which is the library's copy, not the binding's."""
import tracemalloc

import numpy as np
import pytest
import torch

import moec

E, D, F = 8, 256, 1024


def layer(dtype):
    return moec.Layer(
        "layer zc {\n  dim T = 4, D = %d, F = %d, E = %d, K = 2, B = 4\n  dtype %s\n"
        "  input  x : [T, D]\n  weight router : [E, D] = \"r\"\n"
        "  weight w1 : [E, F, D] = \"e.{e}.w1\"\n  weight w3 : [E, F, D] = \"e.{e}.w3\"\n"
        "  weight w2 : [E, D, F] = \"e.{e}.w2\"\n"
        "  p   = softmax(cast(einsum(\"td,ed->te\", x, router), f32), axis=1)\n  idx = topk(p, k=K)\n"
        "  w   = take_along(p, idx, axis=1)\n"
        "  y   = experts(x, idx, w, gate=w1, up=w3, down=w2, act=\"swiglu\", block=B)\n"
        "  output y\n}\n" % (D, F, E, dtype), name="zc.moe")


def weights(kind):
    g = torch.Generator().manual_seed(0)
    w = {"router": torch.randn(E, D, generator=g), "w1": torch.randn(E, F, D, generator=g) * 0.05,
         "w3": torch.randn(E, F, D, generator=g) * 0.05, "w2": torch.randn(E, D, F, generator=g) * 0.05}
    if kind == "bf16-torch":
        return {k: v.to(torch.bfloat16) for k, v in w.items()}
    if kind == "bf16-numpy":
        return {k: v.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16) for k, v in w.items()}
    return {k: v.numpy() for k, v in w.items()}


def state_dict(w):
    sd = {"r": w["router"]}
    for e in range(E):
        for n, k in (("w1", "w1"), ("w3", "w3"), ("w2", "w2")):
            sd["e.%d.%s" % (e, n)] = w[k][e]
    return sd


@pytest.mark.parametrize("kind", ["f32", "bf16-numpy", "bf16-torch"])
def test_views_are_not_copied(kind):
    dtype = "f32" if kind == "f32" else "bf16"
    lay = layer(dtype)
    w = weights(kind)
    nbytes = sum(v.nbytes if hasattr(v, "nbytes") else v.numel() * v.element_size() for v in w.values())
    expert_bytes = nbytes // 3
    x = np.random.default_rng(0).standard_normal((4, D), dtype=np.float32)
    if dtype == "bf16":
        x = moec.f32_to_bf16(x)  # bit patterns: bound as they are
    tracemalloc.start()
    with moec.allocator() as a:
        y, _ = lay.run(x, w, kernels="portable")
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert py_peak < expert_bytes // 4, "Python allocated %d bytes during the run" % py_peak
    assert a.peak < expert_bytes // 4, "the library held %d bytes live" % a.peak
    # the same weights as a state dict: copied into the library's tensors, same result
    with moec.allocator() as b:
        y2, _ = lay.run(x, state_dict(w), kernels="portable")
    assert b.peak >= nbytes
    assert y.tobytes() == y2.tobytes()
