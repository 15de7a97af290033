"""Every HF fixture family through the Python API, from arrays in memory (the
checkpoint read into a dict of tensors, x an ndarray: the API is given no file), on the
host and on the TCP simulator, matching HuggingFace's saved outputs at the tolerances of
tests/e2e/hf_fixtures.py, and giving the same bytes as `moec run` on the same case.

Every family at T=5 in each saved dtype (the first seven families at T=1, 5 and 64), as
the LLVM row of e2e.hf_fixtures does. bf16 rows whose K-th and (K+1)-th selection scores
tie are counted apart as hf_fixtures.py does (recomputed here through the API)."""
import os
import re
import subprocess
import tempfile

import numpy as np
import pytest

import cases
import moec
from conftest import FIXTURES
from hf_fixtures import TOL
from moe_ref import read_safetensors

FIRST7 = {"mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3", "llama4"}


def _cases():
    fams = cases.families(FIXTURES)
    return [(fam, dtype, T) for fam, dtype, T, _ in cases.inputs(FIXTURES, fams, tokens=lambda f, T: T == 5 or f in FIRST7)]


_STATE = {}


def state_dict(fam):
    """The fixture's checkpoint as {name: torch tensor}, read once (tests/ref's reader)."""
    if fam not in _STATE:
        _STATE.clear()
        _STATE[fam] = read_safetensors(os.path.join(FIXTURES, fam, "model.safetensors"))
    return _STATE[fam]


def tied_rows(layer, x, weights, target_dtype_sets):
    """Rows whose K-th and (K+1)-th selection scores are equal in the layer's dtype."""
    text = layer.text.decode()
    m = re.search(r"^  idx\s+= topk\((\w+), k=K\)", text, re.M)
    kd = re.search(r"K = (\d+)", text)
    if not m or not kd:
        return None
    K = int(kd.group(1))
    scores = moec.Layer(re.sub(r"^  output y(,.*)?$", "  output " + m.group(1), text, flags=re.M),
                        set=target_dtype_sets, name=layer.file)
    sc, _ = scores.run(x, weights)
    sc = sc.reshape(sc.shape[0], -1)
    if K >= sc.shape[1]:
        return np.zeros(sc.shape[0], dtype=bool)
    srt = -np.sort(-sc, axis=1)
    return srt[:, K - 1] == srt[:, K]


def cli_y(cli, fam, dtype, T, target):
    d = os.path.join(FIXTURES, fam)
    with tempfile.TemporaryDirectory() as tmp:
        moe = cases.import_layer(cli, d, T, os.path.join(tmp, "l.moe"))
        y = os.path.join(tmp, "y.npy")
        cases.run([cli, "run", moe, "--weights", os.path.join(d, "model.safetensors"), "--input",
                   os.path.join(d, "x_%s_T%d.npy" % (dtype, T)), "-o", y, "--target=" + target] +
                  cases.dtype_sets(dtype))
        return np.load(y)


@pytest.mark.parametrize("target", ["host", "tcp"])
@pytest.mark.parametrize("fam,dtype,T", _cases())
def test_family(fam, dtype, T, target, cli):
    d = os.path.join(FIXTURES, fam)
    sets = {"dtype": "bf16"} if dtype == "bfloat16" else {}
    with open(os.path.join(d, "config.json")) as f:
        import json
        config = json.load(f)
    layer = moec.Layer.from_hf(config, tokens=T, set=sets)  # the config as a dict: no file
    weights = state_dict(fam)
    x = np.load(os.path.join(d, "x_%s_T%d.npy" % (dtype, T)))
    y, stats = layer.run(x, weights, target=target)
    assert isinstance(stats, dict) and stats
    ref = np.load(os.path.join(d, "y_%s_T%d.npy" % (dtype, T))).astype(np.float64)
    ysh = os.path.join(d, "yshared_%s_T%d.npy" % (dtype, T))
    if os.path.exists(ysh):
        ref = ref + np.load(ysh)
    assert y.shape == ref.shape and y.dtype == np.float32
    rowerr = np.max(np.abs(y.astype(np.float64) - ref), axis=1)
    scale = float(np.max(np.abs(ref)))
    tol = TOL[(target, dtype)]
    if dtype == "bfloat16" and np.max(rowerr) > tol * scale:
        ties = tied_rows(layer, x, weights, sets)
        if ties is not None and ties.any():
            rowerr = rowerr[~ties]
    err = float(np.max(rowerr)) if rowerr.size else 0.0
    assert err <= tol * scale, "max|err| = %.3e = %.2e x max|y| (tolerance %.0e)" % (err, err / scale, tol)
    # the same bytes as the command line on the same case
    yc = cli_y(cli, fam, dtype, T, target)
    assert yc.dtype == y.dtype and yc.shape == y.shape
    assert yc.tobytes() == y.tobytes(), "differs from moec run: max|diff| = %g" % np.max(np.abs(yc - y))
