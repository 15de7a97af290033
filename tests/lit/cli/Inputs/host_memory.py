"""Compares `moec stats --json`'s host_memory (predicted) with a host run's
`--stats` (measured): the workspace equal to the run's workspace_bytes, the
weights equal to the layer's weight_bytes, a packed copy exactly where the run
used the vdpbf16ps kernels and packed weights (pack_seconds > 0), the peak the
sum of its parts and no more than the run's peak RSS, which holds the process's
code besides.

usage: host_memory.py STATS.json RUN.json"""
import json
import sys

st, run = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
h = st["host_memory"]
assert "buffers" not in st and "buffer_bytes_total" not in st, st.keys()
parts = h["weight_bytes"] + h["packed_bytes"] + h["workspace_bytes"] + h["io_bytes"]
packs = run["kernels"] == "avx512bf16" and run["pack_seconds"] > 0
checks = [
    ("workspace", h["workspace_bytes"] == run["workspace_bytes"], (h["workspace_bytes"], run["workspace_bytes"])),
    ("weights", h["weight_bytes"] == st["weight_bytes"], (h["weight_bytes"], st["weight_bytes"])),
    ("packed", (h["packed_bytes"] > 0) == packs and h["packed_bytes"] <= h["packable_bytes"],
     (h["packed_bytes"], h["packable_bytes"], run["kernels"], run["pack_seconds"])),
    ("peak", h["peak_bytes"] == parts and 0 < h["peak_bytes"] <= run["peak_rss_bytes"],
     (h["peak_bytes"], parts, run["peak_rss_bytes"])),
]
for name, ok, got in checks:
    print("%s %s %s" % ("ok  " if ok else "FAIL", name, got))
sys.exit(0 if all(ok for _, ok, _ in checks) else 1)
