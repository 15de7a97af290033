#!/usr/bin/env python3
"""bench/opkinds.py: where one simulated TCP run's cycles go, per context and op kind.

usage: bench/opkinds.py TRACE.json PROGRAM.tcps [MACHINE.json]

TRACE.json is what `moec run --target=tcp --trace` writes (one recorded command per line with
its pc, start and end cycles); PROGRAM.tcps is the same layer compiled with the same options
(`moec compile ... -o PROGRAM.tcps`), whose `@pc:` lines name each command's op, phase
(`ph=`, routing where absent) and dims. Prints one row per (context, op, phase, kind):
commands, cycles busy (end - start, the issue included), and for tu.contract the
contraction's shape (O, I, tile) and its MACs at the peak rate of the whole chip (M O I /
(slices x lanes x bf16 MACs per lane per cycle), from MACHINE.json, default backend-tcp/isa/machine.json),
so busy - MACs is the commands' time over their MACs. A tu.vec's kind is its chain's first
step (none: a copy). Then the main context's idle cycles and its five longest gaps.
Nothing is estimated: every figure is a sum over recorded commands.
"""
import collections
import json
import re
import sys


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    trace, tcps = sys.argv[1:3]
    mpath = sys.argv[3] if len(sys.argv) == 4 else "backend-tcp/isa/machine.json"
    m = json.load(open(mpath))
    peak = m["clusters"] * m["slices_per_cluster"] * m["lanes_per_slice"] * m["contraction"]["macs_per_lane_per_cycle"]["bf16"]
    ins = {}
    for line in open(tcps):
        g = re.match(r'@(\d+): (\S+) (.*)', line)
        if g:
            ins[int(g.group(1))] = (g.group(2), g.group(3))
    ctx = {}
    ev = []
    for line in open(trace):
        line = line.strip().rstrip(',')
        if '"ph":"M"' in line and '"thread_name"' in line:
            e = json.loads(line)
            ctx[e["tid"]] = e["args"]["name"]
        elif '"ph":"X"' in line:
            ev.append(json.loads(line))
    rows = collections.defaultdict(lambda: [0, 0, 0.0])
    for e in ev:
        a = e["args"]
        op, rest = ins.get(a["pc"], ("?", ""))
        ph = re.search(r'ph=(\w+)', rest)
        key = [ctx.get(e["tid"], str(e["tid"])), op, ph.group(1) if ph else "routing", ""]
        r = rows
        if op == "tu.contract":
            d = re.search(r'dims=\[(\d+),(\d+),(\d+)\]', rest)
            t = re.search(r'tile=(\d+)', rest)
            M, O, I = map(int, d.groups())
            key[3] = "O=%d I=%d tile=%s" % (O, I, t.group(1) if t else "?")
            r[tuple(key)][2] += M * O * I / peak
        elif op == "tu.vec":
            c = re.search(r'chain=\[([a-z0-9]+\.[a-z0-9]+)', rest)
            key[3] = c.group(1) if c else "copy"
        r[tuple(key)][0] += 1
        r[tuple(key)][1] += a["end"] - a["start"]
    print("%-5s %-12s %-8s %-26s %6s %10s %10s" % ("ctx", "op", "phase", "kind", "n", "busy", "MACs@peak"))
    for k, v in sorted(rows.items()):
        print("%-5s %-12s %-8s %-26s %6d %10d %10s" % (k + (v[0], v[1], "%d" % round(v[2]) if v[2] else "")))
    end = max(e["args"]["end"] for e in ev)
    main_tid = [t for t, n in ctx.items() if n == "main"]
    mev = sorted((e for e in ev if main_tid and e["tid"] == main_tid[0]), key=lambda e: e["args"]["start"])
    t, gaps = 0, []
    for e in mev:
        if e["args"]["start"] > t:
            gaps.append((e["args"]["start"] - t, t))
        t = max(t, e["args"]["end"])
    gaps.append((end - t, t))
    print("end %d; main idle %d; longest gaps (cycles, from):" % (end, sum(g for g, _ in gaps)),
          ", ".join("%d @%d" % g for g in sorted(gaps, reverse=True)[:5]))


if __name__ == "__main__":
    main()
