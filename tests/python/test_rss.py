"""Running the real-size Qwen3-30B-A3B layer (examples/, bf16,
1.2 GB of weights) at T=1 from a memory-mapped checkpoint through the package adds no
more than 10% to the peak RSS of `moec run` on the same case, and gives its bytes.

The checkpoint is $MOEC_RSS_CHECKPOINT, else bench/.cache/qwen3_30b_a3b.bf16.safetensors
(bench/run writes it), else one written by bench/make_checkpoint.py into a temporary
directory (1.2 GB; ctest label `slow`). Both runs are child processes measured with
wait4's ru_maxrss."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from conftest import ROOT

LAYER = os.path.join(ROOT, "examples", "qwen3_30b_a3b.moe")

PY_RUN = r'''
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, moec
y, _ = moec.Layer(sys.argv[2], set={"T": 1}).run(np.load(sys.argv[3]), sys.argv[4])
np.save(sys.argv[5], y)
'''


def peak_rss_kib(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    out, err = p.stdout.read(), p.stderr.read()
    assert os.waitstatus_to_exitcode(status) == 0, (cmd, out, err)
    return ru.ru_maxrss


@pytest.fixture(scope="module")
def checkpoint():
    ck = os.environ.get("MOEC_RSS_CHECKPOINT") or os.path.join(ROOT, "bench", ".cache",
                                                                 "qwen3_30b_a3b.bf16.safetensors")
    if os.path.isfile(ck):
        yield ck
        return
    mk = os.path.join(ROOT, "bench", "make_checkpoint.py")
    if not os.path.isfile(mk):
        pytest.skip("no checkpoint and no bench/make_checkpoint.py")
    with tempfile.TemporaryDirectory(prefix="moec-rss.") as d:  # 1.2 GB, removed after the test
        ck = os.path.join(d, "qwen3_30b_a3b.bf16.safetensors")
        subprocess.run([sys.executable, mk, "qwen3_30b_a3b", ck, "--dtype", "bf16"], check=True,
                       stdout=subprocess.DEVNULL)
        yield ck


def test_peak_rss_within_10_percent(checkpoint, cli, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(1).standard_normal((1, 2048), dtype=np.float32))
    yc, yp = tmp_path / "y_cli.npy", tmp_path / "y_py.npy"
    cli_kib = peak_rss_kib([cli, "run", LAYER, "--set", "T=1", "--weights", checkpoint, "--input", str(x),
                            "-o", str(yc)])
    py_kib = peak_rss_kib([sys.executable, "-c", PY_RUN, os.path.join(ROOT, "python"), LAYER, str(x),
                           checkpoint, str(yp)])
    ratio = py_kib / cli_kib
    print("peak RSS: moec run %.1f MiB, Python %.1f MiB (%.3fx)" % (cli_kib / 1024, py_kib / 1024, ratio))
    assert np.load(yc).tobytes() == np.load(yp).tobytes()
    assert ratio <= 1.10, "Python peak RSS %.1f MiB is %.3fx the CLI's %.1f MiB" % (
        py_kib / 1024, ratio, cli_kib / 1024)
