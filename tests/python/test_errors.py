"""A bad .moe raises moec.Error whose message is moec's located
diagnostic with the source line and caret; a refused allocation raises MemoryError, with
every block returned to the allocator; bad arrays are errors, never crashes."""
import os
import subprocess
import sys

import numpy as np
import pytest

import moec
from conftest import FIXTURES, ROOT

BAD = "layer bad {\n  dim T = 2, D = 4\n  input x : [T, Q]\n  output x\n}\n"


def test_bad_text_has_caret():
    with pytest.raises(moec.Error) as e:
        moec.Layer(BAD, name="bad.moe")
    msg = str(e.value)
    lines = msg.splitlines()
    assert lines[0] == "bad.moe:3:17: error: use of undefined name 'Q'", msg
    assert lines[1] == "  input x : [T, Q]"
    assert lines[2] == " " * 16 + "^"
    assert e.value.diagnostics == msg and e.value.status is None


def test_bad_file_named(tmp_path):
    p = tmp_path / "broken.moe"
    p.write_text(BAD)
    with pytest.raises(moec.Error, match=r"broken\.moe:3:17: error: use of undefined name 'Q'\n  input x"):
        moec.Layer(p)


def test_bad_set_and_pipeline():
    good = BAD.replace("Q", "D")
    with pytest.raises(moec.Error, match="error"):
        moec.Layer(good, set={"Z": 3})
    layer = moec.Layer(good)
    with pytest.raises(moec.Error, match="error"):
        layer.ir(pipeline="no-such-pass")


def _tiny(E=8, D=256, F=1024):
    text = ("layer big {\n  dim T = 2, D = %d, F = %d, E = %d, K = 2, B = 2\n  dtype f32\n"
            "  input  x : [T, D]\n  weight router : [E, D] = \"r\"\n"
            "  weight w1 : [E, F, D] = \"e.{e}.w1\"\n  weight w3 : [E, F, D] = \"e.{e}.w3\"\n"
            "  weight w2 : [E, D, F] = \"e.{e}.w2\"\n"
            "  p   = softmax(einsum(\"td,ed->te\", x, router), axis=1)\n  idx = topk(p, k=K)\n"
            "  w   = take_along(p, idx, axis=1)\n"
            "  y   = experts(x, idx, w, gate=w1, up=w3, down=w2, act=\"swiglu\", block=B)\n"
            "  output y\n}\n") % (D, F, E)
    rng = np.random.default_rng(0)
    sd = {"r": rng.standard_normal((E, D), dtype=np.float32)}
    for e in range(E):
        sd["e.%d.w1" % e] = rng.standard_normal((F, D), dtype=np.float32) * 0.05
        sd["e.%d.w3" % e] = rng.standard_normal((F, D), dtype=np.float32) * 0.05
        sd["e.%d.w2" % e] = rng.standard_normal((D, F), dtype=np.float32) * 0.05
    x = rng.standard_normal((2, D), dtype=np.float32)
    return moec.Layer(text, name="big.moe"), sd, x


def test_refused_allocation_is_memory_error():
    layer, sd, x = _tiny()
    y, _ = layer.run(x, sd, engine="interp")
    # the stacked expert weights are 8 MiB each: a 4 MiB budget refuses the first
    with moec.allocator(limit=4 << 20) as a:
        with pytest.raises(MemoryError, match="out of memory"):
            layer.run(x, sd, engine="interp")
    assert a.refused >= 1
    assert a.live == 0 and a.contexts == 0
    # and the same call with room succeeds with the same result
    with moec.allocator(limit=1 << 30) as a:
        y2, _ = layer.run(x, sd, engine="interp")
    assert a.refused == 0 and a.live == 0
    assert y2.tobytes() == y.tobytes()


SWEEP = r'''
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, moec
layer = moec.Layer.from_hf(sys.argv[2], tokens=3)
x = np.load(sys.argv[2] + "/x_float32_T5.npy")[:3]
target, engine = sys.argv[3], sys.argv[4]
def go():
    y, _ = layer.run(x, target=target, engine=engine, no_cache=True)
    return y
with moec.allocator() as a:
    ref = go()
total = a.requests
ks = sorted(set([1, 2, 3, total] + [1 + (total - 1) * i // 47 for i in range(48)]))
ok = nomem = 0
for k in ks:
    with moec.allocator(fail_at=k) as a:
        try:
            y = go()
            assert y.tobytes() == ref.tobytes()
            ok += 1
        except MemoryError as e:
            assert "out of memory" in str(e), str(e)
            nomem += 1
    assert a.live == 0 and a.contexts == 0, (k, a.live)
print("requests", total, "refusals", nomem, "succeeded", ok)
assert nomem > 0
'''


@pytest.mark.parametrize("target,engine", [("host", "interp"), ("host", "llvm"), ("tcp", "llvm")])
def test_allocation_sweep(target, engine):
    """The k-th request refused for k spread over a whole run (unit.test_oom's sweep through
    the package): MemoryError or the right result, every block returned, never an abort
    (run in a child process so that an abort fails the test instead of ending pytest)."""
    p = subprocess.run([sys.executable, "-c", SWEEP, os.path.join(ROOT, "python"),
                        os.path.join(FIXTURES, "mixtral"), target, engine],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "refusals" in p.stdout


def test_bad_arrays():
    layer, sd, x = _tiny(E=4, D=8, F=4)
    with pytest.raises(moec.Error, match=r"shape \[3, 8\] does not match input 'x' \[2, 8\]"):
        layer.run(np.zeros((3, 8), np.float32), sd)
    with pytest.raises(moec.Error, match="cannot bind"):
        layer.run(np.zeros((2, 8), np.int32), sd)
    bad = dict(sd)
    bad["r"] = np.zeros((4, 9), np.float32)
    with pytest.raises(moec.Error, match="tensor 'r' has shape"):
        layer.run(x[:, :8], bad)
    del bad["r"]
    with pytest.raises(moec.Error, match="tensor 'r' not found in <weights dict>"):
        layer.run(x[:, :8], bad)
    with pytest.raises(moec.Error, match="cannot open"):
        layer.run(x[:, :8], "/nonexistent/model.safetensors")
