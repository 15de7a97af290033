#!/usr/bin/python3
"""Turns the raw results of bench/run into bench/REPORT.md and bench/*.png (gnuplot).

usage: report.py RESULTS_DIR OUT_DIR

RESULTS_DIR holds what bench/run wrote: machine.env, commands.tsv (id, UTC date, command
line of every measurement), stream.json, host/*.json and *.npy, compile/*.json (hyperfine
exports), stats/*.json (moec stats --json), tcp/. Nothing here measures anything.
"""
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

import numpy as np

RES, OUT = sys.argv[1], sys.argv[2]
MODELS = ["mixtral_8x7b", "qwen3_30b_a3b", "deepseek_v3", "gpt_oss_20b"]
LABEL = {"mixtral_8x7b": "Mixtral-8x7B", "qwen3_30b_a3b": "Qwen3-30B-A3B", "deepseek_v3": "DeepSeek-V3",
         "gpt_oss_20b": "gpt-oss-20b"}


def load(path):
    with open(path) as f:
        return json.load(f)


def env():
    d = {}
    for line in open(os.path.join(RES, "machine.env")):
        k, _, v = line.rstrip("\n").partition("=")
        d[k] = v
    return d


def commands():
    rows = []
    p = os.path.join(RES, "commands.tsv")
    if os.path.exists(p):
        for line in open(p):
            i, d, c = line.rstrip("\n").split("\t", 2)
            rows.append((i, d, c))
    return rows


CMDS = commands()


def cmd_block(prefixes, title="commands"):
    """Markdown: the distinct command lines whose id starts with one of prefixes, with dates."""
    seen = {}
    for i, d, c in CMDS:
        if any(i == p or i.startswith(p + ".") or (p.endswith(".") and i.startswith(p)) for p in prefixes):
            # the round number in stats file names is the only thing that changes between rounds
            key = c
            for r in range(1, 10):
                key = key.replace(f".r{r}.json", ".r<N>.json")
            first, last, n = seen.get(key, (d, d, 0))
            seen[key] = (min(first, d), max(last, d), n + 1)
    if not seen:
        return "_(no commands recorded)_\n"
    out = [f"<details><summary>{title} ({sum(v[2] for v in seen.values())} runs)</summary>\n", "```sh"]
    for c, (first, last, n) in seen.items():
        when = first if first == last else f"{first} .. {last}"
        out.append(f"# {when}{'' if n == 1 else f', {n} runs'}")
        out.append(c)
    out.append("```\n</details>\n")
    return "\n".join(out)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt_s(s):
    if s != s:
        return "n/a"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_b(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:.1f} {unit}"
    return f"{b} B"


def gnuplot(script, name):
    path = os.path.join(RES, name + ".gp")
    with open(path, "w") as f:
        f.write(script)
    if not shutil.which("gnuplot"):
        # the PNG already in OUT (if any) stays; the tables carry every figure
        print(f"report.py: gnuplot not found; {name}.png not redrawn", file=sys.stderr)
        return
    subprocess.run(["gnuplot", path], check=True)


E_ = env()
out = []
w = out.append

# The report this run replaces: a section whose results are not in RESULTS_DIR (a fresh cache
# and `bench/run --only=...`) keeps its text from there instead of disappearing.
KEPT_NOTE = ("_Kept from the previous bench/REPORT.md: this run's results (`bench/run --only=...` on a cache "
             "without them) do not hold this section's measurements; the figures and command blocks below are "
             "that earlier run's._")
OLD = {}
_old_path = os.path.join(OUT, "REPORT.md")
if os.path.exists(_old_path):
    _cur = "0"  # the header
    for _line in open(_old_path).read().split("\n"):
        if _line.startswith("## "):
            _cur = _line[3:].split(" ", 1)[0]  # "1.", "2.", ..., "Reproducing"
        if _cur is not None and not _line.startswith("_Kept from the previous bench/REPORT.md"):
            OLD.setdefault(_cur, []).append(_line)
KEPT = []


def keep_old(key, since):
    """Replaces what out holds from index since (a section generated without results) by the
    previous report's section key, when there is one."""
    if key not in OLD:
        return
    del out[since:]
    lines = OLD[key]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    w(lines[0] + "\n")
    w(KEPT_NOTE + "\n")
    w("\n".join(lines[1:]).strip("\n") + "\n")
    KEPT.append(key.rstrip("."))


def old_subsection(key, title_prefix):
    """The previous report's subsection of section key whose title starts with title_prefix."""
    lines, on = [], False
    for line in OLD.get(key, []):
        if line.startswith("### "):
            on = line[4:].startswith(title_prefix)
        if on:
            lines.append(line)
    return "\n".join(lines).strip("\n")

# ---------------------------------------------------------------------------------- header
mem_gib = int(E_.get("mem_total_kib", "0")) / (1 << 20)
w("# moec benchmarks\n")
w("Generated by `bench/run" + (" --quick" if E_.get("mode") == "quick" else "") +
  "` (see the end of this file for how to reproduce). Every table lists, in a folded block under it, the exact "
  "command lines and UTC dates that produced its numbers.\n")
w("| | |\n|---|---|")
w(f"| run | {E_.get('date_utc', '?')} .. {E_.get('date_end_utc', '?')} (mode `{E_.get('mode')}`"
  f"{', `--only=' + E_['only'] + '`' if E_.get('only') else ''}) |")
for k in sorted(E_):
    if k.startswith("remeasured_"):
        w(f"| section `{k[11:]}` re-measured | {E_[k]} (`bench/run --only=...`); dates in its command blocks |")
w(f"| commit ({'full run' if not E_.get('only') else 'the first run on this cache: `--only=' + E_['only'] + '`'}) | `{E_.get('commit', '?')[:12]}` {E_.get('commit_subject', '')}"
  f"{' (plus uncommitted changes)' if E_.get('dirty', '0') not in ('0', '') else ''} |")
w(f"| machine | {E_.get('cpu', '?')}, {E_.get('nproc')} CPUs (nproc), {mem_gib:.1f} GiB RAM, Linux {E_.get('kernel')} |")
w(f"| tools | {E_.get('cc')}; PyTorch {E_.get('torch')} (/usr/bin/python3); moec built {E_.get('build_type') or 'RelWithDebInfo (CMakeLists default)'}; the layer code itself is JIT-compiled at O3 |")
w(f"| PyTorch BLAS | BLAS_INFO={E_.get('torch_blas', '?')}; oneDNN (mkldnn) available: {E_.get('torch_mkldnn', '?')} |")
w(f"| load average (1/5/15 min) | before {E_.get('load_before')}, after {E_.get('load_after', '?')} |")
KEPT_ROW = len(out)
w("")
w("**Caveat: a shared, loaded machine.** This is a 2-CPU virtual machine on which other work (builds, test suites, "
  "other benchmarks) ran at the same time; the load averages above show how busy it was. Absolute times are "
  "therefore noisy and pessimistic. Ratios are more trustworthy than absolute numbers: moec and PyTorch ran "
  "alternately in the same session (the order flipping every round), each process reports the median of its "
  "own calls, and the tables give the median over rounds together with the spread of the per-round ratios.\n")
w("This file is generated and replaced by every full run. The analyses behind the figures (profiles, what each "
  "change gave, spot checks between full runs, with their commands) are kept by hand in "
  "[NOTES.md](NOTES.md).\n")

# ------------------------------------------------------------------------------ bandwidth
st = load(os.path.join(RES, "stream.json")) if os.path.exists(os.path.join(RES, "stream.json")) else None
bw = st["read_best_gbs"] * 1e9 if st else float("nan")
# the probe over the T=1 working set (bench/run: arrays the size of the bf16 layer's bytes at T=1),
# which the decode fraction uses when it was measured
st1 = load(os.path.join(RES, "stream_t1.json")) if os.path.exists(os.path.join(RES, "stream_t1.json")) else None
bw1 = st1["read_best_gbs"] * 1e9 if st1 else bw

# cold decode rounds (bench/run: moec --cold next to the 256 MiB read probe, per round)
cold_rounds = []
for p in sorted(glob.glob(os.path.join(RES, "cold", "moec.r*.json"))):
    r = os.path.basename(p)[len("moec.r"):-len(".json")]
    sp = [os.path.join(RES, "cold", f"stream.r{r}.{w}.json") for w in ("before", "after")]
    if all(os.path.exists(x) for x in sp):
        cold_rounds.append((load(p)["compute_seconds"], 0.5e9 * sum(load(x)["read_best_gbs"] for x in sp)))

# ----------------------------------------------------------------------------------- host
host = {}
for p in glob.glob(os.path.join(RES, "host", "*.r*.json")):
    side, dt, T, r = os.path.basename(p)[:-5].split(".")
    host.setdefault((dt, int(T[1:])), {}).setdefault(side, {})[int(r[1:])] = load(p)
D, F, E, K = 2048, 768, 128, 8
host_rows = []
for (dt, T) in sorted(host, key=lambda k: (k[0] != "bf16", k[1])):
    h = host[(dt, T)]
    ms = [v["compute_seconds"] for v in h.get("moec", {}).values()]
    ts = [v["compute_seconds"] for v in h.get("torch", {}).values()]
    rounds = sorted(set(h.get("moec", {})) & set(h.get("torch", {})))
    ratios = [h["torch"][r]["compute_seconds"] / h["moec"][r]["compute_seconds"] for r in rounds]
    diff = rest = float("nan")
    off, ties = [], None
    ym, yt = (os.path.join(RES, "host", f"y.{s}.{dt}.T{T}.npy") for s in ("moec", "torch"))
    if os.path.exists(ym) and os.path.exists(yt):
        a, b = np.load(ym).astype(np.float64), np.load(yt).astype(np.float64)
        scale = np.abs(b).max()
        diff = float(np.abs(a - b).max() / scale)
        row_rel = np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)
        off = [int(i) for i in np.nonzero(row_rel > 0.05)[0]]
        keep = row_rel <= 0.05
        rest = float(np.abs(a - b)[keep].max() / scale) if keep.any() else float("nan")
    tp = os.path.join(RES, "host", f"ties.{dt}.T{T}.json")
    if os.path.exists(tp):
        ties = load(tp)["tie_rows"]
    m1 = next(iter(h.get("moec", {}).values()), {})
    mv = list(h.get("moec", {}).values())
    cold = [v["compile_seconds"] for v in mv if v.get("cache", "off") != "hit"]
    warm = [v["compile_seconds"] for v in mv if v.get("cache") == "hit"]
    host_rows.append(dict(dt=dt, T=T, moec=med(ms), torch=med(ts), ratio=med(ratios),
                          rmin=min(ratios) if ratios else float("nan"), rmax=max(ratios) if ratios else float("nan"),
                          n=len(rounds), calls=m1.get("repeat"), diff=diff, rest=rest, off=off, ties=ties, blocks=m1.get("blocks_executed"),
                          grid=m1.get("grid_blocks_max"), jit=med(cold) if cold else float("nan"),
                          jit_cached=med(warm) if warm else None, threads=m1.get("threads", 1),
                          kernels=m1.get("kernels", "portable"),
                          pack=med([v["pack_seconds"] for v in mv if "pack_seconds" in v]) if any("pack_seconds" in v for v in mv) else None))
NT = host_rows[0]["threads"] if host_rows else 1
NTS = "one thread" if NT == 1 else f"{NT} threads"


def decode_bytes(dt):
    esz = 2 if dt == "bf16" else 4
    experts = K * 3 * D * F * esz            # T=1: K distinct experts are hit
    router = E * D * esz
    act = 2 * 1 * D * esz                    # x in, y out
    return experts + router + act


# the cold rounds' fractions of the roofline (bytes / probe bandwidth / moec's call), sorted
cold_frac = sorted(decode_bytes("bf16") / b / t for t, b in cold_rounds)


SEC1 = len(out)
w(f"## 1. Host: `moec run --target=host` vs PyTorch (Qwen3-30B-A3B layer, {NTS})\n")
w("The layer is `examples/qwen3_30b_a3b.moe` (D=2048, F=768, E=128, K=8, SwiGLU experts, softmax routing with "
  "renormalised top-8) on a synthetic checkpoint of the real size with HuggingFace tensor names "
  "(`bench/make_checkpoint.py`, N(0, 0.02) weights; 1.2 GB in bf16, 2.4 GB in f32) and a fixed N(0, 1) input. "
  "The baseline `bench/torch_moe.py` is the HuggingFace eager formulation: router `Linear`, float32 softmax, top-k, "
  "renormalise, then a Python loop over the experts that got tokens, each three `F.linear` calls, `index_add_` "
  "into the output. Same weights, same input, same dtype (bf16 rows run in bf16 on both sides, f32 in f32).\n")
w(f"**Threads: {NT} on both sides** (`bench/run` takes the cores available, `nproc`, unless "
  "`MOEC_BENCH_THREADS` is set): moec runs with `--threads N` (its thread pool splits the tiles of every "
  "expert block, the router and the combine; the output is bitwise the same for every N), PyTorch with "
  "`torch.set_num_threads(N)` and `OMP_NUM_THREADS=N`. moec's dot-product kernels: "
  f"{', '.join(sorted(set(r['kernels'] for r in host_rows))) or '?'} (`avx512bf16` = vdpbf16ps for bf16 x bf16, "
  "chosen from cpuid; docs/abi.md bounds its difference from the portable kernels). "
  "Times are the compute of one layer call only "
  "(no weight loading, no compilation): moec's `compute_seconds` from `--stats` (median over `--repeat` calls), "
  "PyTorch's median over the same number of calls (no extra warm-up call on either side). "
  "`speed-up` = PyTorch time / moec time, so > 1 means moec is faster; it is the median of the per-round ratios, "
  "the range over rounds in brackets.\n")
w("Agreement: `rel diff` = max |y_moec - y_torch| / max |y_torch|, over the rows that agree to 5% and over all "
  "rows; `rows off` = rows whose own relative difference exceeds 5%; `tied` = rows where PyTorch's K-th and "
  "(K+1)-th router probabilities are exactly equal (`bench/torch_moe.py --ties-json`), i.e. where the expert "
  "choice is a tie-break: moec takes the lower expert index (shared/moe/SEMANTICS.md), `torch.topk` leaves the "
  "order unspecified.\n")
w("| dtype | T | moec | PyTorch | speed-up (range) | rounds x calls | rel diff: agreeing rows / all | rows off / tied | blocks run / grid | moec JIT cold / cached | moec pack |")
w("|---|---|---|---|---|---|---|---|---|---|---|")
for r in host_rows:
    t = r["ties"]
    tied = "?" if t is None else f"{len(t)}" + ("" if not r["off"] else
                                                 " (all off rows tied)" if set(r["off"]) <= set(t) else
                                                 f" ({len(set(r['off']) - set(t))} off rows not tied)")
    w(f"| {r['dt']} | {r['T']} | {fmt_s(r['moec'])} | {fmt_s(r['torch'])} | **{r['ratio']:.2f}x** "
      f"({r['rmin']:.2f}-{r['rmax']:.2f}) | {r['n']} x {r['calls']} | {r['rest']:.1e} / {r['diff']:.1e} | "
      f"{len(r['off'])} / {tied} | {r['blocks']} / {r['grid']} | {fmt_s(r['jit'])} / "
      f"{fmt_s(r['jit_cached']) if r['jit_cached'] is not None else '-'} | "
      f"{fmt_s(r['pack']) if r['pack'] and r['pack'] > 1e-4 else '-'} |")
w("")
w("About the baseline: Debian's PyTorch runs bf16 `F.linear` through oneDNN, whose speed depends on the kernels "
  f"it finds for this CPU (bf16 features: {E_.get('cpu_bf16', '?') or 'none'}), but float32 `F.linear` through the generic BLAS interface, which Debian resolves to the reference "
  "(netlib) `libblas.so.3` unless OpenBLAS or BLIS is installed (see the PyTorch BLAS row at the top). So the "
  "f32 baseline is weak at T = 32 and 512 and the f32 speed-ups there say more about that BLAS than about moec; "
  "the bf16 rows are the meaningful comparison, and the issue's target is stated for bf16.\n")
w("moec pack = `pack_seconds`: the bf16 expert weights copied once per run into the layout of the vdpbf16ps "
  "tiles (docs/abi.md), over the thread pool; like loading, not part of the compute time (`-`: nothing packed, "
  "f32). "
  "moec JIT = `compile_seconds` (lowering, LLVM code generation at O3 and loading, in process), not part of the "
  "compute time: cold = round 1 (the run's JIT cache starts empty), cached = later rounds, which load the "
  "object file from the cache (`$XDG_CACHE_HOME/moec`) instead of running LLVM. The output differences are at the level of bf16 rounding (bf16 has 8 significant bits, "
  "about 4e-3 relative) for bf16 and of float32 summation order for f32, so both sides compute the same "
  "function. A token sent to a different expert differs by the order of the output itself; that happens only "
  "on rows whose router scores tie exactly at the K-th place, which in bf16 (8 significant bits, 128 experts) "
  "is a few percent of the tokens and in f32 practically never.\n")
w(cmd_block(["checkpoint", "host", "ties"]))
if host_rows:
    dat = os.path.join(RES, "host.dat")
    with open(dat, "w") as f:
        for r in host_rows:
            f.write(f"\"{r['dt']} T={r['T']}\" {r['moec']:.6g} {r['torch']:.6g}\n")
    gnuplot(f"""set terminal pngcairo size 900,480 font ",11"
set output "{OUT}/host.png"
set title "Qwen3-30B-A3B MoE layer, host CPU, {NTS} (median compute time per call)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set ylabel "seconds per layer call (log)"
set grid ytics
set key top left
plot "{dat}" using 2:xtic(1) title "moec --target=host" lc rgb "#1f77b4", \\
     "" using 3 title "PyTorch (HF-style expert loop)" lc rgb "#ff7f0e"
""", "host")
    w("![host: moec vs PyTorch](host.png)\n")

w("### Decode roofline (T = 1)\n")
if st:
    w(f"Memory bandwidth with {st.get('threads', 1)} thread(s), the thread count of the host rows, measured by "
      f"`bench/stream.c` (STREAM-like, 256 MiB arrays, "
      f"{st['repetitions']} repetitions): read {st['read_best_gbs']:.2f} GB/s best / {st['read_median_gbs']:.2f} median, "
      f"copy {st['copy_best_gbs']:.2f} / {st['copy_median_gbs']:.2f}, triad {st['triad_best_gbs']:.2f} / "
      f"{st['triad_median_gbs']:.2f} (copy and triad count the bytes read and written). A decode step only reads "
      "its weights, so the roofline uses the best read bandwidth.\n")
    if st1:
        w(f"The roofline below uses the same probe over {st1.get('array_mib', '?')} MiB arrays, the size of what the bf16 "
          f"layer reads at T = 1 (76.0 MB), re-read back to back like moec's `--repeat` calls re-read the same "
          f"experts: read {st1['read_best_gbs']:.2f} GB/s best / {st1['read_median_gbs']:.2f} median. The set does "
          "not fit in the 32 MB L3 on either side; whatever part of a repeated sweep L3 still serves, it serves "
          "to both.\n")
    w("Bytes at T = 1: the K = 8 experts hit (3 x D x F each) + the router (E x D) + x and y (D each), in the "
      "dtype of the run. Roofline time = bytes / read bandwidth; fraction = roofline time / measured time.\n")
    w("| dtype | bytes | roofline | moec | moec fraction | PyTorch | PyTorch fraction |")
    w("|---|---|---|---|---|---|---|")
    for r in host_rows:
        if r["T"] != 1:
            continue
        b = decode_bytes(r["dt"])
        rt = b / bw1
        w(f"| {r['dt']} | {b / 1e6:.1f} MB | {fmt_s(rt)} | {fmt_s(r['moec'])} | **{100 * rt / r['moec']:.0f}%** | "
          f"{fmt_s(r['torch'])} | {100 * rt / r['torch']:.0f}% |")
    w("")
    w(cmd_block(["stream", "stream_t1"], "bandwidth probe commands"))
    if cold_rounds:
        w(f"**Cold calls** (the figure issue 17's must-show 2 is judged by): `moec run --cold` reads 256 MiB "
          "between calls (not timed), so every call reads its experts from memory, not from the L3; each round "
          "runs the 256 MiB read probe (no reuse either) right before and right after it. "
          "Fraction = bytes / the mean of the two probes' best read / moec's median call.\n")
        w("| round | moec bf16 T=1, cold | probe read (best, mean of before and after) | roofline | fraction |")
        w("|---|---|---|---|---|")
        for i, (t, b) in enumerate(cold_rounds):
            w(f"| {i + 1} | {fmt_s(t)} | {b / 1e9:.2f} GB/s | {fmt_s(decode_bytes('bf16') / b)} | "
              f"{100 * decode_bytes('bf16') / b / t:.0f}% |")
        w(f"\nMedian fraction **{100 * med(cold_frac):.0f}%** "
          f"(range {100 * cold_frac[0]:.0f}-{100 * cold_frac[-1]:.0f}%).\n")
        w(cmd_block(["cold.bf16.T1"], "cold decode commands"))

if not host_rows and not st and not cold_rounds:
    keep_old("1.", SEC1)
# -------------------------------------------------------------------------------- compile
SEC2 = len(out)
w("## 2. Compile time\n")
tcp_ok = open(os.path.join(RES, "tcp", "available")).read().strip() == "1" if os.path.exists(
    os.path.join(RES, "tcp", "available")) else False


def hf(path):
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    r = load(path)["results"][0]
    return dict(median=r["median"], mean=r["mean"], min=r["min"], max=r["max"], n=len(r["times"]),
                user=r.get("user", 0.0), system=r.get("system", 0.0))


comp = []
for p in sorted(glob.glob(os.path.join(RES, "compile", "c.*.json"))):
    name = os.path.basename(p)[2:-5]
    comp.append((name, hf(p), hf(os.path.join(RES, "compile", f"tcp.{name}.json"))))
w("Whole `moec compile` process (parse, the target's pass pipeline, code emission, file write) per example "
  "layer, timed with hyperfine (1 warm-up run, then N runs; median, min-max). Dimensions are those written in "
  "each example (T = 16 for most).\n")
w("| example | C: median (min-max) | TCP: median (min-max) |")
w("|---|---|---|")
for name, c, t in comp:
    cs = f"{fmt_s(c['median'])} ({fmt_s(c['min'])}-{fmt_s(c['max'])}), n={c['n']}" if c else "n/a"
    ep = os.path.join(RES, "compile", f"tcp.{name}.err")
    terr = open(ep).read().strip().splitlines() if os.path.exists(ep) else []
    ts = f"{fmt_s(t['median'])} ({fmt_s(t['min'])}-{fmt_s(t['max'])}), n={t['n']}" if t else \
        "not available on this commit" if not tcp_ok else \
        ("fails: `" + terr[0].split("error: ", 1)[-1].replace("|", "/") + "`") if terr else "n/a"
    w(f"| {name} | {cs} | {ts} |")
w("")
if not tcp_ok:
    err = open(os.path.join(RES, "tcp", "probe.err")).read().strip() if os.path.exists(
        os.path.join(RES, "tcp", "probe.err")) else ""
    w(f"`--target=tcp`: the probe `moec compile examples/seed.moe --target=tcp` failed on this commit "
      f"(`{err.splitlines()[0] if err else '?'}`); bench/run times the TCP column automatically once it works.\n")
t4096 = [(n, hf(os.path.join(RES, "compile", f"tcp4096.{n}.json")))
         for n in ("mixtral_8x7b", "qwen3_30b_a3b", "deepseek_v3", "gpt_oss_20b")]
if any(h for _, h in t4096):
    w("### TCP at T = 4096\n")
    w("The bench layers compiled for TCP at T = 4096 (`--set T=4096`: block=auto's search over B, the "
      "`tcp` pipeline and the lowering; docs/tcp-compiler.md 9 asks under 1 s for DeepSeek-V3).\n")
    w("Wall time per compile (median, min-max) and its CPU time (user + system, hyperfine's means "
      "over the runs).\n")
    w("| layer | wall | CPU |")
    w("|---|---|---|")

    def cell(h):
        if not h:
            return "n/a | n/a"
        cpu = h.get("user", 0) + h.get("system", 0)
        return f"{fmt_s(h['median'])} ({fmt_s(h['min'])}-{fmt_s(h['max'])}), n={h['n']} | {fmt_s(cpu)}"
    for n, h in t4096:
        w(f"| {n} | {cell(h)} |")
    w("")
w(cmd_block(["compile"]))
sweep = {}
for axis in ("E", "T"):
    pts = []
    for p in glob.glob(os.path.join(RES, "compile", f"sweep{axis}.*.json")):
        v = int(os.path.basename(p).split(".")[1])
        pts.append((v, hf(p)))
    sweep[axis] = sorted(pts)
if sweep["E"] or sweep["T"]:
    w("### Growth with E and T (Qwen3-30B-A3B, `--target=c`)\n")
    w("| sweep | median compile time |")
    w("|---|---|")
    for axis, other in (("E", "T = 16"), ("T", "E = 128")):
        if sweep[axis]:
            w(f"| {axis} ({other}) | " + ", ".join(f"{axis}={v}: {fmt_s(h['median'])}" for v, h in sweep[axis]) + " |")
    w("")
    for axis in ("E", "T"):
        if len(sweep[axis]) > 1:
            ms_ = [h["median"] for _, h in sweep[axis]]
            sz = [os.path.getsize(os.path.join(RES, "compile", f"sweep{axis}.{v}.c")) for v, _ in sweep[axis]
                  if os.path.exists(os.path.join(RES, "compile", f"sweep{axis}.{v}.c"))]
            w(f"Over the {axis} sweep ({sweep[axis][0][0]} .. {sweep[axis][-1][0]}) the slowest median is "
              f"{max(ms_) / min(ms_):.2f}x the fastest" +
              (f"; the emitted C is {min(sz) / 1e3:.1f} .. {max(sz) / 1e3:.1f} kB" if sz else "") +
              (f". No measurable growth: {axis} ends up as a loop bound, not as unrolled code, and what varies is "
               "machine noise.\n" if max(ms_) / min(ms_) < 2 and (not sz or max(sz) < 1.2 * min(sz)) else ".\n"))
    for axis in ("E", "T"):
        with open(os.path.join(RES, f"sweep{axis}.dat"), "w") as f:
            for v, h in sweep[axis]:
                f.write(f"{v} {h['median'] * 1e3:.4f} {h['min'] * 1e3:.4f} {h['max'] * 1e3:.4f}\n")
    gnuplot(f"""set terminal pngcairo size 1000,420 font ",11"
set output "{OUT}/compile.png"
set multiplot layout 1,2 title "moec compile --target=c, Qwen3-30B-A3B layer (median, min-max bars)"
set logscale x 2
set offsets graph 0.06, graph 0.06, 0, 0
set ylabel "ms"
set yrange [0:*]
set grid
set key off
set xlabel "E (experts), T = 16"
plot "{RES}/sweepE.dat" using 1:2:3:4 with yerrorlines lw 2 pt 7 lc rgb "#1f77b4"
set xlabel "T (tokens), E = 128"
plot "{RES}/sweepT.dat" using 1:2:3:4 with yerrorlines lw 2 pt 7 lc rgb "#2ca02c"
unset multiplot
""", "compile")
    w("![compile time vs E and T](compile.png)\n")
    w(cmd_block(["sweep"]))

if not comp and not sweep["E"] and not sweep["T"]:
    keep_old("2.", SEC2)
# ------------------------------------------------------------------------- block buffers
SEC3 = len(out)
w("## 3. Worst-case grid and block-buffer bytes (`moec stats --json`, no run)\n")
w("The dispatch buffer holds G_max blocks of B rows of D values. moec's tight bound, the seed design's formula "
  "and vLLM's bound on the number of blocks are reported by `moec stats` as `grid_blocks_max`, "
  "`grid_blocks_seed` and `grid_blocks_vllm`, with the buffer bytes `block_buffer_bytes(_seed|_vllm)`.\n")
stats = {}
for m in MODELS:
    for p in glob.glob(os.path.join(RES, "stats", f"{m}.T*.json")):
        T = int(os.path.basename(p).split(".")[1][1:])
        stats[(m, T)] = load(p)
Ts = sorted({T for (_, T) in stats})
w("| layer | T | G tight | G seed | G vLLM | bytes tight | bytes seed | bytes vLLM | tight / seed | tight / vLLM |")
w("|---|---|---|---|---|---|---|---|---|---|")
for m in MODELS:
    for T in Ts:
        s = stats.get((m, T))
        if not s:
            continue
        bt, bs, bv = s["block_buffer_bytes"], s["block_buffer_bytes_seed"], s["block_buffer_bytes_vllm"]
        w(f"| {LABEL[m]} | {T} | {s['grid_blocks_max']} | {s['grid_blocks_seed']} | {s['grid_blocks_vllm']} | "
          f"{fmt_b(bt)} | {fmt_b(bs)} | {fmt_b(bv)} | {bt / bs:.2f} | {bt / bv:.2f} |")
w("")
if stats:
    for m in MODELS:
        with open(os.path.join(RES, f"bb.{m}.dat"), "w") as f:
            for T in Ts:
                s = stats.get((m, T))
                if s:
                    f.write(f"{T} {s['block_buffer_bytes']} {s['block_buffer_bytes_seed']} {s['block_buffer_bytes_vllm']}\n")
    plots = []
    for m in MODELS:
        plots.append(f"""set title "{LABEL[m]}"
plot "{RES}/bb.{m}.dat" using 1:($2/1048576) with linespoints lw 2 pt 7 title "moec tight", \\
     "" using 1:($3/1048576) with linespoints lw 2 pt 5 dt 2 title "seed formula", \\
     "" using 1:($4/1048576) with linespoints lw 2 pt 9 dt 3 title "vLLM bound"
""")
    gnuplot(f"""set terminal pngcairo size 1000,760 font ",10"
set output "{OUT}/block_buffer.png"
set multiplot layout 2,2 title "block-buffer bytes (worst-case grid) vs tokens T"
set logscale xy
set xlabel "T"
set ylabel "MiB"
set grid
set key top left
""" + "".join(plots) + "unset multiplot\n", "block_buffer")
    w("![block-buffer bytes](block_buffer.png)\n")
w(cmd_block(["stats"]))
if not stats:
    keep_old("3.", SEC3)

# ------------------------------------------------------------------------------------ TCP
w("## 4. TCP (simulated)\n")
mj = None
for p in ("backend-tcp/isa/machine.json", "../shared/tcp/machine.json"):
    if os.path.exists(p):
        mj = load(p)
        mj_path = p
        break
peak = mj["peak_ops_per_s"]["bf16"] if mj else 256e12
hbm = mj["memory"]["hbm_bytes_per_s"] if mj else 1.5e12
model_rev = "?"
if os.path.exists("docs/tcp-model.md"):
    mm_ = re.search(r"\(revision (\d+)\)", open("docs/tcp-model.md").readline())
    model_rev = mm_.group(1) if mm_ else "?"
w(f"**Every figure in this section is simulated**, not measured on a device: moec's TCP simulator "
  f"(backend-tcp/sim/sim.c) runs the compiled program on **machine model revision {model_rev}** "
  f"(docs/tcp-model.md; {mj_path if mj else 'machine.json'} `revision` \"{mj.get('revision', '?') if mj else '?'}\"). "
  "The times are as true as that model: where it is only an assumption (its `assumed` fields) the figures are "
  "too. The revision-2 columns quote the figures of this section committed before revision 3, as they were.\n")
w("**Shared bytes taken in turn.** The compiler orders every reuse of on-chip bytes by dependencies "
  "(reuse edges, `--tcp-reuse=ordered`, docs/tcp-compiler.md 5.3) and the simulator orders the accesses of "
  "distinct tensors on the same per-slice bytes (`--sim-order=bytes`, docs/tcp-isa.md section 2), as the chip "
  "would; both are the defaults since 2026-12-03. Figures of this section committed before then ordered "
  "accesses per tensor and omitted the waits that reuse costs (up to 8% at DeepSeek-V3 T = 4096); "
  "`--tcp-reuse=unordered --sim-order=tensor` reproduces that optimistic accounting.\n")
if tcp_ok:
    w("Every layer runs on moec's simulator with the shipped machine description, timing-only "
      "(`moec run --timing-only`: the cycle counts of the full simulation without the arithmetic of the expert "
      "blocks and the combine) on a synthetic checkpoint without the routed experts' weights "
      "(`bench/make_checkpoint.py MODEL --no-experts`), which is what makes DeepSeek-V3 (22.5 GB of experts) "
      "possible on this machine. Routing is simulated in full, so the blocks executed and the experts hit are "
      "those of the actual routing of a fixed N(0, 1) input through N(0, 0.02) router weights. The table after "
      "this one checks timing-only against the full simulation.\n")
w("The roofline bound itself needs no simulator. Following the project's TCP model (MODEL.md section 6): "
  f"bound = max(FLOPs / {peak / 1e12:.0f} TFLOP/s bf16, HBM bytes / {hbm / 1e12:.2f} TB/s)"
  f"{' (numbers from ' + mj_path + ')' if mj else ' (built-in numbers; machine.json not found)'}. "
  "FLOPs = `flops` of `moec stats` (router + 3 projections x 2 x T x K x D x F, shared experts included). "
  "HBM bytes = weights of the experts hit + every non-expert weight + x in and y out (bf16). The experts hit "
  "at run time depend on the routing; here they are the expectation under uniform routing, "
  "E (1 - (1 - K/E)^T) (DeepSeek-V3's group limit is ignored). One expert's bytes = "
  "(weight_bytes at 2E - weight_bytes at E) / E from `moec stats`.\n")
dma_bw = (mj["dma"]["engines"] * mj["dma"]["bytes_per_cycle_per_engine"] * mj["clock_hz"]) if mj else 2.048e12
w("HBM is one pool of `hbm_bytes_per_s` that reads and writes share, so the roofline's bound is reachable in "
  "principle. The DMA engines move at most "
  f"{dma_bw / 1e12:.3f} TB/s, above the pool's {hbm / 1e12:.2f} TB/s. The block size is the compiler's own "
  "choice (block=auto, docs/tcp-isa.md 7.8); the *B* column gives it.\n")
roof, tcp_runs, tcp_faults, autos, auto_vs = [], [], [], {}, []
rrows = []
for m in MODELS:
    p2 = os.path.join(RES, "stats", f"{m}.2E.json")
    if not os.path.exists(p2):
        continue
    for T in Ts:
        s = stats.get((m, T))
        if not s:
            continue
        d = s["dims"]
        Em, Km, Dm = d["E"], d["K"], d["D"]
        per = (load(p2)["weight_bytes"] - s["weight_bytes"]) / Em
        rest = s["weight_bytes"] - Em * per
        hit = Em * (1 - (1 - Km / Em) ** T)
        by = hit * per + rest + 2 * T * Dm * 2
        tc, tm = s["flops"] / peak, by / hbm
        roof.append((m, T, max(tc, tm)))
        j, path = None, None
        sp, ep = (os.path.join(RES, "tcp", f"{m}.T{T}.{x}") for x in ("json", "err"))
        if os.path.exists(sp) and os.path.getsize(sp) > 0:
            j = load(sp)
            tcp_runs.append((m, T, j))
            pp = os.path.join(RES, "tcp", f"path.{m}.T{T}.json")
            path = load(pp) if os.path.exists(pp) and os.path.getsize(pp) > 0 else None
        elif os.path.exists(ep) and open(ep).read().strip():
            tcp_faults.append((m, T, open(ep).read().strip().splitlines()[0]))
        ap = os.path.join(RES, "tcp", f"auto.{m}.T{T}.json")
        ab = load(ap).get("B", "?") if os.path.exists(ap) and os.path.getsize(ap) > 2 else "?"
        autos[(m, T)] = ab
        rrows.append(dict(m=m, T=T, hit=hit, E=Em, s=s, by=by, tc=tc, tm=tm, j=j, path=path, B=ab,
                          fault=any(f[0] == m and f[1] == T for f in tcp_faults)))

# revision 2: the figures of this section as committed before revision 3 (bench/tcp_rev2.tsv)
REV2 = {}
rev2_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tcp_rev2.tsv")
if os.path.exists(rev2_path):
    for line in open(rev2_path):
        if line.startswith("#") or not line.strip():
            continue
        c = line.rstrip("\n").split("\t")
        REV2[(c[0], int(c[1]))] = dict(B=c[2], cycles=int(c[3]), roof=c[4], ratio=float(c[5]))
clock = mj["clock_hz"] if mj else 1e9
launch = mj["assumed"]["kernel_launch_cycles"] if mj and "kernel_launch_cycles" in mj.get("assumed", {}) else None
kend = mj["assumed"]["kernel_end_cycles"] if mj and "kernel_end_cycles" in mj.get("assumed", {}) else None
setup = mj["dma"]["setup_cycles"] if mj else 500
cyc = lambda c: fmt_s(c / clock)

w("### Roofline, simulated time and what separates them\n")
w("Three groups of columns per layer and T. **Roofline**: moec's own bound for the run (`roofline_seconds` of the "
  "stats JSON: the same formula as above over the experts the routing actually hit) and the bound under uniform "
  "routing from the inputs table below. **Simulated**: the simulated time and its ratio to moec's bound; the "
  "ratio on machine model revision 2 (bench/tcp_rev2.tsv: the figures of this table as committed in 452746a, a "
  "full bench/run on 060c220) and the cycles of revision 3 over those of revision 2. **What separates them** "
  "(each an exact sum from the run, never a fit; they overlap and do not add up to the gap):\n")
w(f"- *launch + end*: `assumed.kernel_launch_cycles` + `assumed.kernel_end_cycles` of machine.json "
  f"({launch if launch is not None else '?'} + {kend if kend is not None else '?'} cycles), which the simulator "
  "adds to every run;")
w(f"- *DMA setups on the critical path*: the DMA commands on the run's critical path (followed back from the "
  "command that ends last through the simulator's `pred` links, `moec run --trace`; bench/critpath.py), and the "
  f"setup cycles they pay (`dma.setup_cycles` = {setup}, less where a command adds less to the path);")
w("- *routing before the first expert command*: `expert_start_seconds` of the stats JSON (when the first block's "
  "weight fetch starts) less the launch: router, top-k, index generation and dispatch that nothing hides;")
w("- *gathers/scatters on the critical path*: the cycles the `dma.gather` and `dma.scatter` commands on the "
  "critical path add to it (exposed, not hidden under other work; where `group-fetch` applies, the experts' "
  "weight fetches are gathers too, so a weight-bound run shows them here).\n")
w("**Floor**: the contract's floor for the run (`floor_seconds` of the stats JSON, `moe_tcp_floor`: a lower bound "
  "on every correct program of the layer for the tokens and experts the run hit, derived in docs/tcp-isa.md "
  "section 12) and the simulated time's ratio to it (issue 31: each row within 1.05x; `-` where the run's stats "
  "predate the floor).\n")
w("| layer | T | B | moec's bound | uniform-routing bound | simulated | **ratio** | floor | **sim / floor** "
  "| rev-2 ratio | rev-3 / rev-2 cycles "
  "| gap | launch + end | DMA setups on path (commands) | routing before 1st expert | gathers/scatters on path |")
w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rrows:
    j, path, r2 = r["j"], r["path"], REV2.get((LABEL[r["m"]], r["T"]))
    bound = max(r["tc"], r["tm"])
    r2r = f"{r2['ratio']:.2f}x" if r2 else "-"
    if not j:
        w(f"| {LABEL[r['m']]} | {r['T']} | {r['B']} | - | {fmt_s(bound)} | {'**fault**' if r['fault'] else 'pending'} "
          f"| - | - | - | {r2r} | - | - | - | - | - | - |")
        continue
    gap = j["simulated_seconds"] - j["roofline_seconds"]
    le = cyc(launch + kend) if launch is not None and kend is not None else "n/a"
    if path and not path.get("truncated") and "dma_on_path" in path:
        ds = f"{cyc(path['dma_setup_on_path'])} ({path['dma_on_path']})"
        gs = cyc(path["added"].get("dma.gather", 0) + path["added"].get("dma.scatter", 0))
    else:
        ds = gs = "n/a (trace truncated)" if path else "n/a (no trace)"
    if "expert_start_seconds" in j and j.get("blocks_executed", 0) > 0:
        rb = fmt_s(max(j["expert_start_seconds"] - (launch or 0) / clock, 0))
    else:
        rb = "n/a"
    slow = f"{j['cycles'] / r2['cycles']:.2f}x" if r2 else "-"
    fl = j.get("floor_seconds", 0)
    fcol = f"{fmt_s(fl)} | **{j['simulated_seconds'] / fl:.3f}x**" if fl > 0 else "- | -"
    w(f"| {LABEL[r['m']]} | {r['T']} | {r['B']} | {fmt_s(j['roofline_seconds'])} | {fmt_s(bound)} | "
      f"{fmt_s(j['simulated_seconds'])} | **{j['roofline_ratio']:.2f}x** | {fcol} | {r2r} | {slow} | "
      f"{fmt_s(gap)} | {le} | {ds} | {rb} | {gs} |")
w("")
w("The last four columns are the costs named by issue 30; whatever else makes up a gap (a compute-bound run's own "
  "contraction time, a weight stream slower than the pool) shows in the composition of the critical path below.\n")
w("Critical-path composition (bench/critpath.py over `--trace`: the cycles each kind of command adds to the path, "
  "and `issue`, the control processor's share: command issue, waits and the launch), as a share of the run:\n")
kinds = ["dma.copy", "dma.gather", "dma.scatter", "dma.spm", "sub.ldtrf", "sub.ldvrf", "tu.contract", "tu.vec"]
w("| layer | T | commands on path | " + " | ".join(kinds) + " | issue |")
w("|---|---|---|" + "---|" * len(kinds) + "---|")
for r in rrows:
    j, path = r["j"], r["path"]
    if not j or not path or path.get("truncated") or "added" not in path:
        continue
    tot = j["cycles"]
    w(f"| {LABEL[r['m']]} | {r['T']} | {path['path_commands']} | " +
      " | ".join(f"{100 * path['added'].get(k, 0) / tot:.1f}%" for k in kinds) +
      f" | {100 * path['issue'] / tot:.1f}% |")
w("")
w("Roofline inputs (needs no simulator):\n")
w("| layer | T | experts hit (exp.) | FLOPs | HBM bytes | compute bound | memory bound | **bound** | limited by |")
w("|---|---|---|---|---|---|---|---|---|")
for r in rrows:
    w(f"| {LABEL[r['m']]} | {r['T']} | {r['hit']:.1f} / {r['E']} | {r['s']['flops'] / 1e9:.2f} G | {r['by'] / 1e6:.1f} MB | "
      f"{fmt_s(r['tc'])} | {fmt_s(r['tm'])} | **{fmt_s(max(r['tc'], r['tm']))}** | "
      f"{'compute' if r['tc'] > r['tm'] else 'memory'} |")
w("")
# quantized layers as published (bench/run's tcpq part), each run against the layer's bounds
QLAYERS = [("deepseek_v3_fp8", "DeepSeek-V3, block FP8, act=fp8"), ("gpt_oss_20b_mxfp4", "gpt-oss-20b, MXFP4")]
QTITLE = "Quantized layers as published"
qrows = []
for qm, qlabel in QLAYERS:
    for p in sorted(glob.glob(os.path.join(RES, "tcpq", f"{qm}.T*.json")), key=lambda p: int(p.split(".T")[-1][:-5])):
        T = int(p.split(".T")[-1][:-5])
        sj = load(p) if os.path.getsize(p) > 0 else None
        ap = os.path.join(RES, "tcpq", f"auto.{qm}.T{T}.json")
        if sj is not None:
            sj["B"] = load(ap).get("B", "?") if os.path.exists(ap) and os.path.getsize(ap) > 2 else "?"
        qrows.append((qlabel, T, sj))
w(f"### {QTITLE}\n")
if qrows:
    w("DeepSeek-V3 with its routed and shared experts in block FP8 (F8_E4M3 values, one f32 scale per 128 x 128 "
      "block) and fp8 activations (`--quant-act=fp8`: f8 x f8 contractions, as its fp8_gemm runs them), and "
      "gpt-oss-20b with its MXFP4 experts (E2M1 pairs in bytes, one E8M0 scale per 32; bf16 activations, dequantized "
      "in DM): each the .moe `moec import-hf` writes from the published config.json (tests/fixtures/configs), run "
      "timing-only on a routing-only checkpoint (the router; DeepSeek-V3's shared expert in block FP8 too), "
      "block=auto. The **roofline** (`roofline_seconds` of the run's stats JSON) counts the weights as stored - the "
      "hit experts' and the other weights' quantized values and scales, x and y - over `hbm_bytes_per_s`, and the "
      "FLOPs at the peak of the contraction the layer uses (f8 with act=fp8, bf16 otherwise); the **floor** is the "
      "run's `floor_seconds` (the same stored bytes; docs/tcp-isa.md section 12).\n")
    w("| layer | T | B | roofline | floor | simulated | **sim / roofline** | **sim / floor** |")
    w("|---|---|---|---|---|---|---|---|")
    for qlabel, T, sj in qrows:
        if not sj:
            w(f"| {qlabel} | {T} | - | - | - | **fault** | - | - |")
            continue
        rf, fl, ss = sj["roofline_seconds"], sj.get("floor_seconds", 0), sj["simulated_seconds"]
        fcol = f"{fmt_s(fl)}" if fl > 0 else "-"
        sf = f"**{ss / fl:.3f}x**" if fl > 0 else "-"
        w(f"| {qlabel} | {T} | {sj['B']} | {fmt_s(rf)} | {fcol} | {fmt_s(ss)} | **{ss / rf:.2f}x** | {sf} |")
    w("")
    w(cmd_block(["tcpq"], "commands (quantized layers)"))
else:
    old = old_subsection("4.", QTITLE)
    if old:
        w("\n".join(old.split("\n")[1:]).strip("\n") + "\n")
        w(KEPT_NOTE + "\n")
    else:
        w("_(not measured: `bench/run --only=tcpq`)_\n")
bt = os.path.join(RES, "tcp", "book_table.md")
w("### The book's MNIST schedule beside the simulator (table B)\n")
w("Table B of the machine model (docs/tcp-model.md section 5; section 9 of the reference MODEL.md): each item of the "
  "furiosa-opt book's MNIST schedule figure (the vendor compiler's static schedule, not a device measurement) "
  "beside moec's simulated figure for the same transfer or pass, written as programs in tests/tcp/book/tableB "
  "and printed by `bench/book_table.py`. Side by side, **not fitted**: nothing here changes machine.json.\n")
if os.path.exists(bt) and os.path.getsize(bt) > 0:
    w(open(bt).read().rstrip("\n") + "\n")
else:
    w("_(not produced by this run: `bench/book_table.py` needs build/tests/tcp_book)_\n")
if tcp_faults:
    w("Simulator runs that failed (`moec run --target=tcp`):\n")
    for m, T, e in tcp_faults:
        w(f"- {LABEL[m]}, T={T}: `{e}`")
    w("")
if tcp_runs:
    eng = list(tcp_runs[0][2]["busy_cycles"])
    w("Per-engine utilisation (busy cycles / total cycles, from the stats JSON):\n")
    w("| layer | T | cycles | " + " | ".join(eng) + " | HBM read | HBM written | blocks run / G_max | experts hit |")
    w("|---|---|---|" + "---|" * len(eng) + "---|---|---|---|")
    for m, T, j in tcp_runs:
        w(f"| {LABEL[m]} | {T} | {j['cycles']:.0f} | " + " | ".join(
            f"{100 * j['busy_cycles'][e] / j['cycles']:.0f}%" for e in eng) +
          f" | {j['hbm_read_bytes'] / 1e6:.1f} MB | {j['hbm_write_bytes'] / 1e6:.1f} MB | "
          f"{j['blocks_executed']:.0f} / {j['blocks_max']:.0f} | {j['experts_hit']:.0f} |")
    w("")
    w("### Routing against the expert GEMMs\n")
    w("Routing here is everything outside the block loop: router einsum, softmax/sigmoid, top-k, index "
      "generation, dispatch (gather + scatter into the grid) and combine (gather + weighted sum). Its **share** is "
      "the simulated time during which no command of the block loop (expert weights fetch, TRF loads, the GEMMs, "
      "the activation, block results out) is in flight, over the simulated time: the routing time that expert work "
      "does not hide (`routing_seconds` / `simulated_seconds` of the stats JSON). The busy columns are the cycles "
      "routing commands keep each engine busy, as a share of that engine's busy cycles.\n")
    w("| layer | T | simulated | routing (exposed) | **share** | routing DMA busy | routing main busy | routing vector busy |")
    w("|---|---|---|---|---|---|---|---|")
    for m, T, j in tcp_runs:
        rb, bb = j.get("routing_busy_cycles", {}), j["busy_cycles"]
        pct = lambda e: f"{100 * rb.get(e, 0) / bb[e]:.0f}%" if bb.get(e) else "-"
        w(f"| {LABEL[m]} | {T} | {fmt_s(j['simulated_seconds'])} | {fmt_s(j.get('routing_seconds', 0))} | "
          f"**{100 * j.get('routing_share', 0):.1f}%** | {pct('dma')} | {pct('main')} | {pct('vector')} |")
    w("")
    full = []
    for T in Ts:
        fp = os.path.join(RES, "tcp", f"full.qwen3_30b_a3b.T{T}.json")
        tj = next((j for m, t, j in tcp_runs if m == "qwen3_30b_a3b" and t == T), None)
        if os.path.exists(fp) and os.path.getsize(fp) > 0 and tj:
            full.append((T, load(fp), tj))
    if full:
        w("### Timing-only against the full simulation\n")
        w("The Qwen3-30B-A3B layer again, fully simulated (every expert GEMM computed, output written) on its full "
          "synthetic checkpoint (1.2 GB), against the timing-only run above on the checkpoint without experts:\n")
        w("| T | cycles, full | cycles, timing-only | equal |")
        w("|---|---|---|---|")
        for T, fj, tj in full:
            w(f"| {T} | {fj['cycles']:.0f} | {tj['cycles']:.0f} | {'yes' if fj['cycles'] == tj['cycles'] else '**NO**'} |")
        w("")
    sweep = {}
    for f in sorted(os.listdir(os.path.join(RES, "tcp"))):
        mm = re.match(r"blocks\.(\w+)\.T(\d+)\.B(\d+)\.(json|err)$", f)
        if not mm:
            continue
        key = (mm.group(1), int(mm.group(2)))
        path = os.path.join(RES, "tcp", f)
        if mm.group(4) == "json" and os.path.getsize(path) > 0:
            sweep.setdefault(key, {})[int(mm.group(3))] = load(path)
        elif mm.group(4) == "err":
            err = [ln for ln in open(path).read().splitlines() if ln.strip() and not ln.startswith("moec: timing only")]
            if err:
                sweep.setdefault(key, {}).setdefault(int(mm.group(3)), "DM" if "DM capacity exceeded" in err[0] else
                                                     "error")
    if sweep:
        Bs = sorted({b for d in sweep.values() for b in d})
        w("### Block size\n")
        w("The block size B is the `block=` of the layer (`--set B=`); results do not depend on it, the time does. "
          "Larger blocks load each expert's weights into TRF for more rows (and, for the streamed Mixtral and "
          "DeepSeek experts, read them from HBM fewer times) and cut per-block DMA setups, but pad more rows "
          "(the MACs of padding rows are spent; assumption A6) and need more DM. Simulated time (ratio to the "
          "roofline); *DM* marks a size the compiler rejects because it does not fit DM, *error* any other failure "
          "(its stderr is in bench/.cache/results/tcp/blocks.*.err):\n")
        w("The last columns compare the compiler's own choice (block=auto, the runs of the first table) with the "
          "best of the fixed sizes; issue 16 asks that it be at most 3% slower.\n")
        w("| layer | T | " + " | ".join(f"B={b}" for b in Bs) + " | auto: B | auto | vs best |")
        w("|---|---|" + "---|" * len(Bs) + "---|---|---|")
        for (m, T), d in sorted(sweep.items(), key=lambda kv: (MODELS.index(kv[0][0]), kv[0][1])):
            cells = []
            for b in Bs:
                j = d.get(b, "absent")
                cells.append("-" if j == "absent" else f"*{j}*" if isinstance(j, str) else
                             f"{fmt_s(j['simulated_seconds'])} ({j['roofline_ratio']:.2f}x)")
            aj = next((j for mm, t, j in tcp_runs if mm == m and t == T), None)
            best = min((j["simulated_seconds"] for j in d.values() if not isinstance(j, str)), default=None)
            vs = f"{100 * (aj['simulated_seconds'] / best - 1):+.1f}%" if aj and best else "-"
            if aj and best:
                auto_vs.append((m, T, aj["simulated_seconds"] / best - 1))
            w(f"| {LABEL[m]} | {T} | " + " | ".join(cells) +
              f" | {autos.get((m, T), '?')} | {fmt_s(aj['simulated_seconds']) if aj else '-'} | {vs} |")
        w("")
    var = {v: os.path.join(RES, "tcp", f"variant.{v}.json") for v in ("hbm2", "mac2")}
    var_extra = {"hbm2dma2": os.path.join(RES, "tcp", "variant.hbm2dma2.json")}
    base = {1: next((j for m, t, j in tcp_runs if m == "qwen3_30b_a3b" and t == 1), None),
            4096: next((j for m, t, j in tcp_runs if m == "qwen3_30b_a3b" and t == 4096), None)}
    if all(os.path.exists(p) and os.path.getsize(p) > 0 for p in var.values()) and base[1] and base[4096]:
        h2, m2 = load(var["hbm2"]), load(var["mac2"])
        d1 = 1 - h2["simulated_seconds"] / base[1]["simulated_seconds"]
        d4 = 1 - m2["simulated_seconds"] / base[4096]["simulated_seconds"]
        b1 = base[1]
        wbytes1 = b1["hbm_read_bytes"]
        gain = wbytes1 * (1 / hbm - 1 / min(2 * hbm, dma_bw))
        w("### Does the cost follow the machine? (issue 16, must-show 3)\n")
        w("The same layer (Qwen3-30B-A3B, compiled for each machine) on two variants of the machine description: "
          "`hbm_bytes_per_s` doubled at T=1 (issue 16 asks for a drop of at least 30%), and "
          "`macs_per_lane_per_cycle.bf16` doubled at T=4096 (at least 25%).\n")
        w("| variant | T | shipped machine | variant | drop |")
        w("|---|---|---|---|---|")
        w(f"| HBM bandwidth x2 | 1 | {fmt_s(b1['simulated_seconds'])} | {fmt_s(h2['simulated_seconds'])} | "
          f"**{100 * d1:.1f}%** |")
        hd = var_extra["hbm2dma2"]
        if os.path.exists(hd) and os.path.getsize(hd) > 0:
            h2d = load(hd)
            w(f"| HBM bandwidth and DMA engine rate x2 | 1 | {fmt_s(b1['simulated_seconds'])} | "
              f"{fmt_s(h2d['simulated_seconds'])} | "
              f"**{100 * (1 - h2d['simulated_seconds'] / b1['simulated_seconds']):.1f}%** |")
        w(f"| bf16 MACs per lane x2 | 4096 | {fmt_s(base[4096]['simulated_seconds'])} | {fmt_s(m2['simulated_seconds'])} | "
          f"**{100 * d4:.1f}%** |")
        w("")
        w(f"How far the first drop can go, from the contract alone: every byte read from HBM reaches the "
          "compute engines through a DMA into DM (fetch, TRF and VRF loads read DM only; MODEL.md sections 3-4), "
          "and a DMA moves at most `dma.engines` x `dma.bytes_per_cycle_per_engine` per cycle "
          f"({dma_bw / 1e12:.3f} TB/s: 8 engines x 256 B at 1 GHz, MODEL.md: \"DMA sees DM at 2 TB/s per chip\"), "
          f"bounded below by the HBM pool. With {2 * hbm / 1e12:.1f} TB/s of HBM the engines bind, so each byte "
          f"read from HBM gains at most 1/{hbm / 1e9:.0f} - 1/{min(2 * hbm, dma_bw) / 1e9:.0f} ns: the "
          f"{wbytes1 / 1e6:.1f} MB this run reads gain at most {fmt_s(gain)}, "
          f"**{100 * gain / b1['simulated_seconds']:.1f}%** of its {fmt_s(b1['simulated_seconds'])}; the rest "
          "(routing's vector passes, DMA setups and issue cycles, the last block's compute) does not depend on "
          "HBM. Even a run made only of the weight stream would drop by "
          f"{100 * (1 - hbm / min(2 * hbm, dma_bw)):.1f}% (1 - 1.5/2.048). Only bytes that the pool charges twice "
          "(misaligned reads, HBM -> HBM copies) could gain more, and a program within 1.10x of the roofline "
          "(must-show 1) has too few of them: it still spends at least the engines' time on the 76 MB plus its "
          "serial routing, so it can drop by about 29.5% at most. A 30% drop is out of reach on this "
          "machine description for any program that meets must-show 1; it would need the DMA engines' rate raised with the HBM's "
          "(at 3.0 TB/s of engines as well, a pure stream would drop by 50%): the third row doubles both, "
          "`hbm_bytes_per_s` and `dma.bytes_per_cycle_per_engine`, the whole path an HBM byte takes.\n")
        w("That argument was made on machine model revision 2, where the DMA engines were the only bound past the "
          "pool. Revision 3 adds the per-DMN bound and serial DMA setups (docs/tcp-model.md section 8); the third "
          "row doubles the DMNs' rate as well, and what still binds when it gains no more than the first is not "
          "analysed here.\n")
w(cmd_block(["tcp"], "TCP simulator commands"))

# ------------------------------------------------------------ expert parallelism (issue 19)
EPC = os.path.join(os.path.dirname(os.path.abspath(RES)), "ep")  # bench/run: $CACHE/ep beside $CACHE/results
ep_rounds = []  # (T, chips, round, measured / bound)
for p in sorted(glob.glob(os.path.join(EPC, "ep*.T*.json"))):
    m = re.match(r"ep(\d+)\.T(\d+)\.json$", os.path.basename(p))
    if m and int(m.group(1)) > 1:
        for r in load(p).get("rounds", []):
            ep_rounds.append((int(m.group(2)), int(m.group(1)), r["round"], r["seconds"] / r["bound_seconds"]))
if ep_rounds:
    w("### Expert parallelism on 1, 2, 4, 8 simulated chips (issue 19, must-show 3)\n")
    w("DeepSeek-V3 (B = 64, timing-only, the shipped machine) from `bench/ep_tcp.sh` (its results in "
      "`bench/.cache/ep`; docs/expert-parallel.md section 6 defines every column). Each exchange round is "
      "measured along the critical path of the simulator's own commands: what packing adds to the phase before "
      "it, the link, and what unpacking adds to the phase after it (unpack's summed durations in brackets), "
      "against its bound, latency + bytes / bandwidth per all_to_all on the busiest chip.\n")
    tab = subprocess.run(["sh", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ep_tcp.sh"), "--table",
                          EPC, " ".join(str(t) for t in sorted({1} | {r[0] for r in ep_rounds})), "1 2 4 8"],
                         capture_output=True, text=True)
    w(tab.stdout)
    w(cmd_block(["ep"], "expert-parallel commands"))
elif old_subsection("4.", "Expert parallelism"):
    _ep = old_subsection("4.", "Expert parallelism").split("\n")
    w(_ep[0] + "\n")
    w("_Kept from the previous bench/REPORT.md (`bench/run --only=ep` re-measures it): measured then, on the machine "
      "model of that run, not on this section's revision; its command block below is that run's._\n")
    w("\n".join(_ep[1:]).strip("\n") + "\n")
    KEPT.append("4 (expert parallelism)")

# -------------------------------------------------------------------------------- targets
w("## 5. Where the targets stand (issue 7; TCP rows: issue 16)\n")
SEC5 = len(out)


def row(target, measured, status):
    w(f"| {target} | {measured} | {status} |")


w("| target | measured | status |")
w("|---|---|---|")
for T, lim in ((1, 1.10), (4096, 1.25)):
    got = [(m, j) for m, t, j in tcp_runs if t == T]
    bad = [(m, e) for m, t, e in tcp_faults if t == T]
    if got:
        worst = max(j["roofline_ratio"] for _, j in got)
        row(f"TCP simulated time <= {lim:.2f}x roofline at T={T} (issue 16)",
            "; ".join(f"{LABEL[m]}: {j['roofline_ratio']:.2f}x" for m, j in got) +
            (f"; {', '.join(LABEL[m] for m, _ in bad)}: compile or run failed" if bad else ""),
            "met" if worst <= lim and not bad else
            f"**missed** ({sum(j['roofline_ratio'] <= lim for _, j in got)} of {len(got)} layers within it)")
    else:
        row(f"TCP simulated time <= {lim:.2f}x roofline at T={T} (issue 16)",
            ("TCP compile or run failed (section 4): " + "; ".join(f"{LABEL[m]}" for m, _ in bad)) if bad else
            "roofline bounds computed (section 4); no simulated time", "**not measured**")
for T in (1, 4096):
    r = [(m, j) for m, t, j in tcp_runs if t == T]
    if r:
        worst = max(j.get("routing_share", 0) for _, j in r)
        row(f"TCP routing exposed share <= 3% at T={T} (issue 16)",
            "; ".join(f"{LABEL[m]}: {100 * j.get('routing_share', 0):.1f}%" for m, j in r),
            "met" if worst <= 0.03 else f"**missed** ({sum(j.get('routing_share', 0) <= 0.03 for _, j in r)} of "
            f"{len(r)} layers within it)")
    else:
        row(f"TCP routing exposed share <= 3% at T={T} (issue 16)", "no run succeeded", "**not measured**")
if auto_vs:
    worst = max(v for _, _, v in auto_vs)
    row("block=auto within 3% of the best B in {32, 64, 128, 256} (issue 16)",
        f"worst {100 * worst:+.1f}% over {len(auto_vs)} layer/T pairs (section 4, block size)",
        "met" if worst <= 0.03 else "**missed** (" + "; ".join(f"{LABEL[m]} T={T}: {100 * v:+.1f}%"
                                                             for m, T, v in auto_vs if v > 0.03) + ")")
if ep_rounds:
    over = [x for x in ep_rounds if x[3] > 1.25]
    row("TCP expert parallelism: every all-to-all round <= 1.25x its bound, T in {1, 64, 4096} on 2/4/8 chips "
        "(issue 19, must-show 3)",
        f"{len(ep_rounds) - len(over)} of {len(ep_rounds)} rounds within it, worst {max(x[3] for x in ep_rounds):.3f}x",
        "met" if not over else "**missed** (" + "; ".join(f"T={T} {n} chips round {k}: {v:.4f}x"
                                                          for T, n, k, v in over) + ")")
b1 = next((r for r in host_rows if r["dt"] == "bf16" and r["T"] == 1), None)
if cold_rounds:
    row("host >= 90% of the bandwidth roofline at T=1 (same threads as the probe; cold calls)",
        f"bf16: median {100 * med(cold_frac):.0f}% over {len(cold_frac)} rounds "
        f"({100 * cold_frac[0]:.0f}-{100 * cold_frac[-1]:.0f}%), "
        "every call reading its experts from memory (section 1, cold calls)",
        "met" if med(cold_frac) >= 0.90 else f"**missed** (x{0.90 / med(cold_frac):.2f} short)")
elif b1 and st:
    frac = decode_bytes("bf16") / bw1 / b1["moec"]
    row("host >= 90% of the bandwidth roofline at T=1 (same threads as the probe)",
        f"bf16: {100 * frac:.0f}% ({fmt_s(b1['moec'])} vs roofline {fmt_s(decode_bytes('bf16') / bw1)}; "
        f"PyTorch reaches {100 * decode_bytes('bf16') / bw1 / b1['torch']:.0f}%)",
        ("**inconclusive**: above 100% of a DRAM roofline means repeated calls are served partly from "
         "the last-level cache (the experts hit at T=1 are 75 MB) or the probe ran under load; "
         "a cold-cache measurement is needed" if frac > 1.0 else
         "met" if frac >= 0.90 else f"**missed** (x{0.90 / frac:.2f} short)"))
elif "1" not in KEPT:  # a kept section 1 keeps its rows below
    row("host >= 90% of the bandwidth roofline at T=1", "not run", "**not measured**")
b512 = next((r for r in host_rows if r["dt"] == "bf16" and r["T"] == 512), None)
if b512:
    row("host >= 2x PyTorch bf16 at T=512", f"{b512['ratio']:.2f}x ({fmt_s(b512['moec'])} vs {fmt_s(b512['torch'])})",
        "met" if b512["ratio"] >= 2 else f"**missed** (x{2 / b512['ratio']:.1f} short"
        + ("; this CPU has " + E_.get("cpu_bf16", "") + ", which PyTorch's bf16 GEMMs (oneDNN) use, while moec's "
           "kernels stop at vdpbf16ps: AMX tiles are not used" if "amx_bf16" in E_.get("cpu_bf16", "") else "")
        + ")")
elif "1" not in KEPT:
    row("host >= 2x PyTorch bf16 at T=512", "not run in this mode", "**not measured**")
b32 = next((r for r in host_rows if r["dt"] == "bf16" and r["T"] == 32), None)
if b32:
    row("host >= 1.5x PyTorch bf16 at T=32", f"{b32['ratio']:.2f}x ({fmt_s(b32['moec'])} vs {fmt_s(b32['torch'])})",
        "met" if b32["ratio"] >= 1.5 else f"**missed** (x{1.5 / b32['ratio']:.2f} short)")
f32r = [r for r in host_rows if r["dt"] == "f32"]
if f32r:
    worst = min(f32r, key=lambda r: r["ratio"])
    row("host f32 >= PyTorch at every T", ", ".join(f"T={r['T']}: {r['ratio']:.2f}x" for r in f32r),
        "met" if worst["ratio"] >= 1 else f"**missed** at T={worst['T']}")
cached = [r["jit_cached"] for r in host_rows if r.get("jit_cached") is not None]
if cached:
    row("host JIT from the cache <= 100 ms (second `moec run` of a layer)",
        f"{fmt_s(min(cached))} .. {fmt_s(max(cached))} (cold: section 1)",
        "met" if max(cached) <= 0.1 else "**missed**")
if comp:
    worst = max(comp, key=lambda x: x[1]["median"])
    row("compile <= 100 ms per layer (C)",
        f"median per example {fmt_s(min(c['median'] for _, c, _ in comp))} .. {fmt_s(worst[1]['median'])} "
        f"({worst[0]}); whole process, loaded machine",
        "met" if worst[1]["median"] <= 0.1 else "**missed**")
    jits = [r["jit"] for r in host_rows if r.get("jit")]
    if jits:
        row("compile <= 100 ms per layer (host JIT: LLVM at O3 in `moec run`)",
            f"{fmt_s(min(jits))} .. {fmt_s(max(jits))} (Qwen3-30B-A3B, section 1)",
            "met" if max(jits) <= 0.1 else "**missed** (the C and TCP rows time code emission; this one also runs LLVM's "
            "O3 pipeline and code generation on it)")
    tt = [t for _, _, t in comp if t]
    row("compile <= 100 ms per layer (TCP)",
        (f"median up to {fmt_s(max(t['median'] for t in tt))} over the {len(tt)} of {len(comp)} examples" +
         (" (the others fail to compile, section 2)" if len(tt) < len(comp) else "")) if tt else
        "no example compiles to TCP",
        (("met" if len(tt) == len(comp) else f"met where it compiles ({len(tt)} of {len(comp)})")
         if max(t["median"] for t in tt) <= 0.1 else "**missed**") if tt else "**not measured**")
w("")

# rows of the previous report's table whose measurements this run does not hold
_new_targets = {ln.split("|")[1].strip() for ln in out[SEC5:] if ln.startswith("| ")}
_old_rows = [ln for ln in OLD.get("5.", []) if ln.startswith("| ") and not ln.startswith("| target |")]
_kept_rows = [ln for ln in _old_rows if ln.split("|")[1].strip() not in _new_targets]
if _kept_rows:
    _blank = out.pop() if out and out[-1] == "" else None
    for ln in _kept_rows:
        w(ln if "kept from the previous REPORT.md" in ln else
          ln.rstrip(" |") + " (kept from the previous REPORT.md: not measured in this run) |")
    if _blank is not None:
        w("")
    KEPT.append("5 (%d rows)" % len(_kept_rows))
# ---------------------------------------------------------------------------- reproducing
w("## Reproducing\n")
w("```sh\nbench/run            # everything above (builds moec if needed; checkpoints cached in bench/.cache)\n"
  "bench/run --quick    # reduced set: bf16, T in {1, 32}, 2 rounds, short sweeps\n"
  "bench/run --report-only   # rebuild this file and the PNGs from bench/.cache/results\n"
  "bench/run --only=tcp      # section 4 alone (and the stats it needs); sections without results in the\n"
  "                          # cache keep the previous REPORT.md's text, marked as kept\n"
  "bench/run --only=tcpq     # section 4's quantized layers alone (DeepSeek-V3 block FP8, gpt-oss-20b MXFP4)\n```\n")
w("Raw results (JSON per run, the hyperfine exports, the outputs compared, `commands.tsv`) stay in "
  "`bench/.cache/results/`. The figures above are from one run; expect them to move with machine load.\n")

if KEPT:
    # the kept sections' own run, machine and tools: the previous header's rows (or their own kept rows)
    _prev = {}
    _kept_hdr = any(ln.startswith("| kept sections' ") for ln in OLD.get("0", []))
    for ln in OLD.get("0", []):
        mm_ = re.match(r"\| (kept sections' )?(run|commit[^|]*|machine|tools) \| (.*) \|$", ln)
        if mm_ and bool(mm_.group(1)) == _kept_hdr:
            _prev.setdefault(mm_.group(2).split(" (")[0], mm_.group(3))
    rows_ = ["| sections kept from the previous REPORT.md | " + ", ".join(KEPT) +
             " (their results are not in this cache; each says so) |"]
    rows_ += [f"| kept sections' {k} | {_prev[k]} |" for k in ("run", "commit", "machine", "tools") if k in _prev]
    out.insert(KEPT_ROW, "\n".join(rows_))
with open(os.path.join(OUT, "REPORT.md") + ".tmp", "w") as f:
    f.write("\n".join(out) + "\n")
os.replace(os.path.join(OUT, "REPORT.md") + ".tmp", os.path.join(OUT, "REPORT.md"))
