"""sim_alias_check.py TRACE.json CLAIM...: checks the order of commands in a
`moec run --trace` timeline. A claim names two instructions by pc:
  X>=Y  instruction X starts no earlier than Y ends (ordered after it)
  X<Y   instruction X starts before Y ends (the two overlap in time)
Each command in the claims must have run exactly once."""
import json
import sys

ev = {}
for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e.get("ph") == "X" and "pc" in e.get("args", {}):
        a = e["args"]
        assert a["pc"] not in ev, "instruction %d ran twice" % a["pc"]
        ev[a["pc"]] = (a["start"], a["end"])
bad = 0
for c in sys.argv[2:]:
    op = ">=" if ">=" in c else "<"
    x, y = (int(v) for v in c.split(op))
    ok = ev[x][0] >= ev[y][1] if op == ">=" else ev[x][0] < ev[y][1]
    print("%s: %s (start %d, end of %d: %d)" % (c, "ok" if ok else "FAILS", ev[x][0], y, ev[y][1]))
    bad += not ok
sys.exit(1 if bad else 0)
