#!/usr/bin/env python3
"""bench/reuse_order.py: accesses of shared bytes that a simulated TCP run did not order.

usage: bench/reuse_order.py TRACE.json PROGRAM.tcps [trf|dm]

TRACE.json is what `moec run --target=tcp --trace` writes (one recorded command per line, in
issue order, with its pc, start and end cycles); PROGRAM.tcps is the same layer compiled with
the same options (`moec compile ... -o PROGRAM.tcps`), whose tensor table gives each TRF or DM
tensor its per-slice offset (addr=) and footprint (slice=). The hazard scheduler orders
accesses of one tensor only (docs/tcp-isa.md 2); two tensors placed on the same bytes of a
slice are ordered by nothing but a dependency the program states (a token, or a command that
waits for one of them). For the space named (default trf), every command that writes a tensor
is checked against the commands issued before it that read or wrote another tensor on
overlapping per-slice bytes: where such a command had not ended when the writer started, the
writer replaced bytes still in use. Printed: how many writers did, the pairs, the largest
overlap in cycles and the first few pairs. Ranges are whole tensors' per-slice regions, which
is exact for TRF tiles (a load writes its whole tile, a contraction reads it) and an upper
bound for DM (a pass may touch part of its tensor).
"""
import json
import re
import sys

LOOKBACK = 64  # earlier accesses of the space compared with each writer


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    space = sys.argv[3] if len(sys.argv) == 4 else "trf"
    region, ins = {}, {}
    for line in open(sys.argv[2]):
        t = re.match(r'tensor %(\d+) (\w+) .* addr=(\d+) slice=(\d+)', line)
        if t and t.group(2) == space:
            a = int(t.group(3))
            region[int(t.group(1))] = (a, a + int(t.group(4)))
            continue
        g = re.match(r'@(\d+): (\S+) (.*)', line)
        if g:
            rest = g.group(3)
            dst = re.search(r'\bdst=%(\d+)', rest)
            srcs = [int(x) for x in re.findall(r'\bs[0-2]=%(\d+)', rest)]
            ins[int(g.group(1))] = (g.group(2), int(dst.group(1)) if dst else None, srcs)
    hist, writers, pairs, worst, shown = [], 0, 0, 0, []
    for line in open(sys.argv[1]):
        if '"ph":"X"' not in line:
            continue
        a = json.loads(line.strip().rstrip(','))["args"]
        op, dst, srcs = ins.get(a["pc"], ("?", None, []))
        touched = [(t, False) for t in srcs if t in region] + ([(dst, True)] if dst in region else [])
        hit = False
        for t, w in touched:
            if not w:
                continue
            lo, hi = region[t]
            for (pc2, op2, t2, end2) in hist[-LOOKBACK:]:
                r2 = region[t2]
                if t2 != t and r2[0] < hi and lo < r2[1] and end2 > a["start"]:
                    hit = True
                    pairs += 1
                    worst = max(worst, end2 - a["start"])
                    if len(shown) < 5:
                        shown.append("@%d %s %%%d starts %d; @%d %s %%%d ends %d" %
                                     (a["pc"], op, t, a["start"], pc2, op2, t2, end2))
        writers += hit
        for t, _ in touched:
            hist.append((a["pc"], op, t, a["end"]))
    print("%s: %d writers started while another tensor on their bytes was in use (%d pairs, "
          "largest overlap %d cycles)" % (space, writers, pairs, worst))
    for s in shown:
        print("  " + s)


if __name__ == "__main__":
    main()
