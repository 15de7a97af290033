"""Notebook views of moec results: a Layer's stats as an HTML table (Layer._repr_html_),
and a TCP run's per-engine timeline and roofline with matplotlib, when it is installed
(moec.notebook.HAVE_MATPLOTLIB; the plot functions raise ImportError otherwise).

    y, st = layer.run(x, target="tcp", trace=True)    # st["trace"]: the simulator's events
    moec.notebook.plot_timeline(st)
    moec.notebook.plot_roofline(st)
"""
import html

try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False

# The built-in machine's peaks (backend-tcp/isa/machine.json: peak_ops_per_s.bf16 and
# memory.hbm_bytes_per_s); pass others for another machine description.
RNGD_PEAK_FLOPS = 262.144e12
RNGD_HBM_BYTES_PER_S = 1.5e12


def _human(b):
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    u = 0
    b = float(b)
    while b >= 1024 and u < 4:
        b /= 1024
        u += 1
    return ("%.1f %s" if u else "%.0f %s") % (b, units[u])


def stats_table_rows(st):
    """(label, value) rows of a `moec stats` dict, as the command's table prints them."""
    rows = [("layer", "%s (%s)" % (st.get("layer", "?"), st.get("dtype", "?"))),
            ("dims", " ".join("%s=%s" % kv for kv in st.get("dims", {}).items()))]
    if "tcp_block" in st:
        rows.append(("TCP block size", "B = %d (block loop predicted %.3g s)" %
                     (st["tcp_block"]["B"], st["tcp_block"]["predicted_block_loop_seconds"])))
    rows += [("FLOPs", "{:,.0f} (the worst-case grid computes {:,.0f})".format(st.get("flops", 0),
                                                                             st.get("flops_grid_max", 0))),
             ("weight bytes", "{:,.0f} ({})".format(st.get("weight_bytes", 0), _human(st.get("weight_bytes", 0))))]
    if st.get("quantized_weight_bytes"):
        rows.append(("quantized", _human(st["quantized_weight_bytes"])))
    rows += [("grid blocks", "%s tight, %s seed design, %s vLLM" % (st.get("grid_blocks_max"),
                                                                    st.get("grid_blocks_seed"),
                                                                    st.get("grid_blocks_vllm"))),
             ("block buffers", "%s tight, %s seed design, %s vLLM" % (
                 _human(st.get("block_buffer_bytes", 0)), _human(st.get("block_buffer_bytes_seed", 0)),
                 _human(st.get("block_buffer_bytes_vllm", 0))))]
    bufs = sorted(st.get("buffers", []), key=lambda b: -b.get("bytes", 0))
    rows.append(("buffers", "%s in %d values" % (_human(st.get("buffer_bytes_total", 0)), len(bufs))))
    for b in bufs[:5]:
        rows.append(("", "%s %s %s %s" % (b.get("value", ""), b.get("name") or "-", b.get("op", ""),
                                          _human(b.get("bytes", 0)))))
    return rows


def stats_html(layer, target=None):
    """The layer's stats as an HTML table (what Jupyter shows for a Layer)."""
    try:
        st = layer.stats(target=target)
    except Exception as e:  # a notebook view never raises: it shows the diagnostics
        return "<pre>%s</pre>" % html.escape(str(e))
    body = "".join("<tr><th style='text-align:left'>%s</th><td style='text-align:left'>%s</td></tr>" %
                   (html.escape(k), html.escape(v)) for k, v in stats_table_rows(st))
    return "<table class='moec-stats'>%s</table>" % body


def _events(stats_or_trace):
    t = stats_or_trace.get("trace", stats_or_trace) if isinstance(stats_or_trace, dict) else stats_or_trace
    if isinstance(t, dict):
        t = t.get("traceEvents", [])
    return t


def plot_timeline(stats_or_trace, ax=None):
    """A per-engine timeline (one row per engine, a bar per command) of a TCP run's trace:
    the stats of layer.run(..., target="tcp", trace=True), or the trace itself."""
    import matplotlib.pyplot as plt
    ev = _events(stats_or_trace)
    names = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid", 0), e.get("tid", 0))] = e["args"]["name"]
    rows = sorted({(e.get("pid", 0), e.get("tid", 0)) for e in ev if e.get("ph") == "X"})
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 + 0.5 * max(1, len(rows))))
    kinds = sorted({e["name"] for e in ev if e.get("ph") == "X"})
    cmap = plt.get_cmap("tab20")
    color = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    for r, key in enumerate(rows):
        spans = [(e["ts"], e["dur"], e["name"]) for e in ev if e.get("ph") == "X" and
                 (e.get("pid", 0), e.get("tid", 0)) == key]
        for kind in kinds:
            s = [(a, d) for a, d, n in spans if n == kind]
            if s:
                ax.broken_barh(s, (r - 0.4, 0.8), color=color[kind], label=kind)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([("chip %d " % p if len({k[0] for k in rows}) > 1 else "") + names.get((p, t), str(t))
                        for p, t in rows])
    ax.set_xlabel("time (us)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("TCP simulator: commands per engine")
    return ax


def plot_roofline(stats, ax=None, peak_flops=RNGD_PEAK_FLOPS, hbm_bytes_per_s=RNGD_HBM_BYTES_PER_S):
    """The run on a roofline: achieved FLOP/s against arithmetic intensity (FLOPs per HBM
    byte) under the machine's compute peak and memory slope; the bound the simulator
    reports (roofline_seconds) is marked beside the simulated time."""
    import matplotlib.pyplot as plt
    flops = float(stats["flops"])
    nbytes = float(stats["hbm_read_bytes"] + stats["hbm_write_bytes"])
    ai = flops / nbytes if nbytes else float("inf")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    lo, hi = min(ai, 1.0) / 10, max(ai, peak_flops / hbm_bytes_per_s) * 10
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.loglog(xs, [min(peak_flops, x * hbm_bytes_per_s) for x in xs], "k-", label="roofline")
    ax.loglog([ai], [flops / stats["simulated_seconds"]], "o", label="simulated")
    if stats.get("roofline_seconds"):
        ax.loglog([ai], [flops / stats["roofline_seconds"]], "x", label="bound (roofline_seconds)")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title("roofline: %.3g us simulated, %.1fx the bound" % (stats["simulated_seconds"] * 1e6,
                                                                  stats.get("roofline_ratio", float("nan"))))
    ax.legend(fontsize="small")
    return ax
