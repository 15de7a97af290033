"""The switch charge of tests/lit/tcp/main_placement.test, from machine.json alone.

usage: placement_check.py MACHINE.json N LOCAL ROUTED REMOTE_STREAMS
LOCAL, ROUTED: `tcp_book --print` outputs (span first) of an f32 copy pass of N
elements (one DM stream in, one commit) without and with flags=switch, REMOTE_STREAMS
of its two operands' bytes not held by the slice that computes them. The pass is cut
into units of one flit of lane words (flit_bytes / 4 elements), q = ceil(units / slices)
consecutive units on each slice (docs/tcp-isa.md section 5): each slice fetches and
commits b = 4 x q x flit_bytes / 4 bytes; without the switch it takes
max(b / max_fetch_bytes, b / 4 / int_elems_per_cycle) cycles beyond its fixed costs;
the routed operands' bytes cross the switch at flit_bytes_per_cycle into each slice,
after a ring of min(slices used, max_ring_size) (docs/tcp-model.md).
"""
import json
import sys

m = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
local = int(open(sys.argv[3]).read().split()[0])
routed = int(open(sys.argv[4]).read().split()[0])
remote = int(sys.argv[5])
S = m["clusters"] * m["slices_per_cluster"]
per = m["flit_bytes"] // 4
units = -(-n // per)
used = min(units, S)
b = 4 * per * -(-units // used)
work = max(-(-b // m["fetch"]["max_fetch_bytes"]), -(-(b // 4) // m["vector"]["int_elems_per_cycle"]))
sw = -(-remote * b // m["switch"]["flit_bytes_per_cycle"])
want = max(work, sw) + min(used, m["switch"]["max_ring_size"]) - work
got = routed - local
print(f"local {local} routed {routed}: +{got} cycles, machine.json gives +{want}")
sys.exit(0 if got == want and want > 0 else 1)
