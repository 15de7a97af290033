#!/usr/bin/env python3
"""bench/critpath.py: the critical path of one simulated TCP run, from its trace.

usage: bench/critpath.py TRACE.json MACHINE.json OUT.json

TRACE.json is what `moec run --target=tcp --trace` writes: one command per line with its
context, start and end cycles and `pred`, the recorded command whose end released it
(backend-tcp/sim/sim_int.h, struct tev). Following pred from the command that ends last gives
the critical path; each command on it adds end - max(start, pred's end) cycles, the rest of
the run up to the last end is command issue on the control processor (the kernel launch
included). OUT.json gets, in cycles:

  path_end          the last command's end (the run's cycles less assumed.kernel_end_cycles)
  path_commands     commands on the critical path
  added             {op: cycles those commands add}, e.g. dma.copy, dma.gather, tu.contract
  issue             path_end - sum(added): control-processor time on the path
  dma_on_path       DMA commands on the path
  dma_setup_on_path sum over them of min(dma.setup_cycles, what the command adds): the
                    setups the path pays (a setup is the start of its command)
  events            commands recorded; truncated: true when the simulator stopped recording
                    (TCP_MAX_EVENTS), in which case the path is not complete
Nothing here is estimated: every figure is a sum over recorded commands.
"""
import json
import re
import sys

MAX_EVENTS = 2000000  # backend-tcp/sim/sim_int.h TCP_MAX_EVENTS

LINE = re.compile(r'^\{"name":"([a-z.]+)","ph":"X",.*"args":\{"pc":\d+,"start":(-?\d+),"end":(-?\d+),"pred":(-?\d+)\}\}')


def main():
    trace, machine, out = sys.argv[1:4]
    setup = json.load(open(machine))["dma"]["setup_cycles"]
    names, start, end, pred = [], [], [], []
    with open(trace) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            names.append(m.group(1))
            start.append(int(m.group(2)))
            end.append(int(m.group(3)))
            pred.append(int(m.group(4)))
    n = len(names)
    res = {"events": n, "truncated": n >= MAX_EVENTS, "dma_setup_cycles": setup}
    if n:
        i = max(range(n), key=lambda k: (end[k], k))
        added, cmds, dma, dma_setup = {}, 0, 0, 0
        res["path_end"] = end[i]
        seen = set()
        while i >= 0 and i not in seen:
            seen.add(i)
            p = pred[i]
            if p >= i:  # a link goes back in time; anything else is a malformed trace
                raise SystemExit(f"{trace}: pred {p} of command {i} is not earlier")
            a = end[i] - max(start[i], end[p] if p >= 0 else start[i])
            a = max(a, 0)
            added[names[i]] = added.get(names[i], 0) + a
            cmds += 1
            if names[i].startswith("dma."):
                dma += 1
                dma_setup += min(setup, a)
            i = p
        res.update(path_commands=cmds, added=added, issue=res["path_end"] - sum(added.values()), dma_on_path=dma,
                   dma_setup_on_path=dma_setup)
    with open(out + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    import os
    os.replace(out + ".tmp", out)


main()
