"""Every operation of the package, on success and on error, returns
every block it took from the library's allocator (the counting hook sees live bytes and
contexts back at 0), and strings the library returns are freed (run this file under the
ASan build's library for the rest: tests/python/asan.sh, docs/python.md)."""
import os

import numpy as np
import pytest

import moec
from conftest import FIXTURES
from conftest import read_safetensors_np as read_safetensors

MIX = os.path.join(FIXTURES, "mixtral")


def _everything(tmp_path):
    layer = moec.Layer.from_hf(MIX, tokens=5)
    x = np.load(os.path.join(MIX, "x_float32_T5.npy"))
    sd = read_safetensors(os.path.join(MIX, "model.safetensors"))
    layer.stats()
    layer.stats(target="tcp")
    layer.ir(pipeline="host")
    layer.ir(format="json")
    layer.compile(path=str(tmp_path / "l.c"))
    layer.compile(path=str(tmp_path / "l.tcpb"))
    y1, _ = layer.run(x)
    y2, _ = layer.run(x, sd)
    y3, _ = layer.run(x, sd, target="tcp", trace=True)
    y4, _ = layer.run(x[:3], tokens=3)
    y5, _ = layer.with_set(dtype="bf16").run(x, target="tcp", tokens=5)
    assert y1.tobytes() == y2.tobytes()
    layer._repr_html_()
    for bad in (lambda: moec.Layer("layer q {\n  input x : [T]\n}\n"),
                lambda: layer.run(x[:2], sd),
                lambda: layer.run(x, "/nonexistent"),
                lambda: layer.ir(pipeline="nope")):
        with pytest.raises(moec.Error):
            bad()


def test_no_block_left(tmp_path):
    with moec.allocator() as a:
        _everything(tmp_path)
    assert a.requests > 1000
    assert a.contexts == 0
    assert a.live == 0, "%d bytes still live" % a.live


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="ASan keeps freed memory in quarantine: RSS grows by design")
def test_repeated_runs_do_not_grow(tmp_path):
    """RSS after many runs stays where it was after a few (nothing accumulates per call)."""
    def rss_kib():
        with open("/proc/self/status") as f:
            return int(next(ln for ln in f if ln.startswith("VmRSS:")).split()[1])
    layer = moec.Layer.from_hf(MIX, tokens=5)
    x = np.load(os.path.join(MIX, "x_float32_T5.npy"))
    sd = read_safetensors(os.path.join(MIX, "model.safetensors"))
    for _ in range(20):
        layer.run(x, sd)
    before = rss_kib()
    for _ in range(200):
        layer.run(x, sd)
    grew = rss_kib() - before
    assert grew < 8 * 1024, "RSS grew by %d KiB over 200 runs" % grew


@pytest.mark.skipif("asan" not in os.environ.get("LD_PRELOAD", ""),
                    reason="LeakSanitizer runs only under tests/python/asan.sh")
def test_leak_check_is_live():
    """Under asan.sh a context the caller never frees is reported (with the suppressions
    of the interpreter's own blocks in force), so a clean run above means something."""
    import subprocess
    import sys
    code = ("import moec\nfrom moec._lib import lib, ALLOC_FN\n"
            "lib.moe_ctx_new(ALLOC_FN(), None)\n")
    # use_tls=0: this libasan's leak check reads a bogus dynamic-TLS range of a child
    # that Python starts (GCC 12's libasan: "DTLS ... at 0x2d6", then "Tracer caught
    # signal 11"). TLS is only a root set: without it the check can report more, never
    # less, and the assertion below asks for the context moe_ctx_new left.
    lsan = os.environ.get("LSAN_OPTIONS", "")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(moec.__file__)),
               LSAN_OPTIONS=(lsan + ":" if lsan else "") + "use_tls=0")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode != 0 and "moe_ctx_new" in p.stderr and "LeakSanitizer" in p.stderr, p.stderr[-2000:]
