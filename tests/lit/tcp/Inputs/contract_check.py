"""contract_check.py: the simulator's cost follows machine.json (docs/tcp-model.md).

contract_check.py launch BASE.json LAUNCH.json DELTA: the cycles of LAUNCH.json
(the stats of a run on a machine whose kernel_launch_cycles is DELTA higher)
exceed BASE.json's by DELTA within 1%.
contract_check.py setup BASE.json SETUP.json TRACE.json EXTRA: the run on a
machine with EXTRA more dma.setup_cycles is longer by at least EXTRA x the DMA
commands on the critical path of the base run (TRACE.json: its trace, whose
events carry start, end and the critical-path predecessor pred).
contract_check.py ratio A B LO HI: the first number of file B over file A's
(tcp_book --print) lies in [LO, HI]."""
import json
import sys


def cycles(path):
    with open(path) as f:
        return json.load(f)["cycles"]


def critical_dma(trace):
    with open(trace) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    last = max(range(len(ev)), key=lambda i: ev[i]["args"]["end"])
    n, i = 0, last
    while i >= 0:
        n += ev[i]["name"].startswith("dma.")
        i = ev[i]["args"]["pred"]
    return n, len(ev)


def main(a):
    if a[0] == "launch":
        d, want = cycles(a[2]) - cycles(a[1]), float(a[3])
        print("launch: +%d cycles for +%d" % (d, want))
        assert abs(d - want) <= 0.01 * want, d
    elif a[0] == "setup":
        d, extra = cycles(a[2]) - cycles(a[1]), int(a[4])
        n, tot = critical_dma(a[3])
        print("setup: +%d cycles; %d DMA commands on the critical path (of %d commands) x %d = %d" %
              (d, n, tot, extra, n * extra))
        assert n > 0 and d >= n * extra, (d, n)
    else:
        x = float(open(a[1]).read().split()[0])
        y = float(open(a[2]).read().split()[0])
        print("ratio: %d -> %d cycles, %.4fx" % (x, y, y / x))
        assert float(a[3]) <= y / x <= float(a[4]), y / x


main(sys.argv[1:])
