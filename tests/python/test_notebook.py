"""Notebook niceties: a Layer's stats as an HTML table (_repr_html_); a TCP run's
per-engine timeline and roofline drawn with matplotlib when it is installed, and a clean
ImportError from the plot functions (a skip here) when it is not."""
import os

import numpy as np
import pytest

import moec
import moec.notebook
from conftest import FIXTURES

MIX = os.path.join(FIXTURES, "mixtral")


def test_repr_html_table():
    layer = moec.Layer.from_hf(MIX, tokens=5)
    h = layer._repr_html_()
    st = layer.stats()
    assert h.startswith("<table") and h.endswith("</table>")
    assert "mixtral_layer0" in h and "FLOPs" in h and "{:,.0f}".format(st["flops"]) in h
    assert "grid blocks" in h and "%d tight" % st["grid_blocks_max"] in h
    # the tcp target adds the block size block=auto picks
    assert "TCP block size" in moec.notebook.stats_html(layer, target="tcp")


def test_repr_html_never_raises():
    layer = moec.Layer.from_hf(MIX, tokens=5)
    layer.text = layer.text.replace(b"output y", b"output nope")
    assert "error" in layer._repr_html_()


@pytest.fixture(scope="module")
def tcp_stats():
    layer = moec.Layer.from_hf(MIX, tokens=5)
    x = np.load(os.path.join(MIX, "x_float32_T5.npy"))
    _, st = layer.run(x, target="tcp", trace=True)
    return st


def test_trace_in_stats(tcp_stats):
    ev = tcp_stats["trace"]["traceEvents"]
    assert any(e.get("ph") == "X" for e in ev)
    assert tcp_stats["simulated_seconds"] > 0 and tcp_stats["flops"] > 0


def test_plots(tcp_stats):
    if not moec.notebook.HAVE_MATPLOTLIB:
        with pytest.raises(ImportError):
            moec.notebook.plot_timeline(tcp_stats)
        pytest.skip("matplotlib is not installed (python3-matplotlib): the plot functions raise ImportError")
    import matplotlib
    matplotlib.use("Agg")
    ax = moec.notebook.plot_timeline(tcp_stats)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "main" in labels and "dma" in labels
    assert len(ax.collections) >= len(labels)
    ax = moec.notebook.plot_roofline(tcp_stats)
    assert len(ax.lines) == 3
    ai = tcp_stats["flops"] / (tcp_stats["hbm_read_bytes"] + tcp_stats["hbm_write_bytes"])
    assert ax.lines[1].get_xdata()[0] == pytest.approx(ai)


def test_stats_as_the_cli_shows_them(cli, tmp_path):
    """Layer.stats() has the keys `moec stats --json` has (no `buffers`, the CLI's
    host_memory with the same numbers), and the notebook table shows the host memory line."""
    import json
    import subprocess
    layer = moec.Layer.from_hf(MIX, tokens=5)
    moe = tmp_path / "l.moe"
    moe.write_bytes(layer.text)
    p = subprocess.run([cli, "stats", str(moe), "--json"], capture_output=True, text=True, check=True)
    want = json.loads(p.stdout)
    want = want["layers"][0] if "layers" in want else want
    st = layer.stats()
    assert "buffers" not in st and "buffer_bytes_total" not in st
    assert "buffers" not in want
    assert st["host_memory"] == want["host_memory"] and st["host_memory"]["peak_bytes"] > 0
    assert set(want) - {"tcp_block"} <= set(st)
    h = layer._repr_html_()
    assert ">buffers<" not in h and ">host memory<" in h
    assert moec.notebook._human(want["host_memory"]["peak_bytes"]) + " predicted peak" in h
    # the tcp target: no host memory, as `moec stats --target=tcp`
    assert "host_memory" not in layer.stats(target="tcp")
