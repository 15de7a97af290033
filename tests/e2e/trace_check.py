#!/usr/bin/env python3
"""Checks Chrome trace JSON files written by `moec run --target=tcp --trace`.

For every file named: the object has a traceEvents array; every complete
slice (ph "X") has a finite, non-negative ts and dur; every (pid, tid) that a
thread_name metadata event declares has at least one slice or instant event,
and every track that holds slices is declared (named); on each track
(pid, tid) the slices nest or are disjoint: sorted by start (longer first on a
tie), a slice that starts inside an open slice ends within it. Times are
compared in whole nanoseconds (ts and dur are microseconds; the writers give
them as exact multiples of 1 ns).

usage: trace_check.py TRACE.json... (exit 1 with one line per problem)
"""
import json
import math
import sys


def ns(x):
    return int(round(float(x) * 1000.0))


def check(path):
    """The problems of one trace file (empty when it passes) and its slice count."""
    errs = []
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return ["%s: cannot read the trace: %s" % (path, e)], 0
    ev = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(ev, list):
        return ["%s: no traceEvents array" % path], 0
    declared, used, tracks = set(), set(), {}
    for i, e in enumerate(ev):
        ph = e.get("ph")
        key = (e.get("pid"), e.get("tid"))
        if ph == "M" and e.get("name") == "thread_name":
            if key in declared:
                errs.append("%s: track %s declared twice" % (path, key))
            declared.add(key)
        elif ph == "X":
            ts, dur = e.get("ts"), e.get("dur")
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (ts, dur)):
                errs.append("%s: event %d (%s): ts or dur not a finite number" % (path, i, e.get("name")))
                continue
            if ts < 0 or dur < 0:
                errs.append("%s: event %d (%s): negative ts %r or dur %r" % (path, i, e.get("name"), ts, dur))
                continue
            used.add(key)
            tracks.setdefault(key, []).append((ns(ts), ns(ts) + ns(dur), i, e.get("name")))
        elif ph in ("i", "I"):
            ts = e.get("ts")
            if not (isinstance(ts, (int, float)) and math.isfinite(ts) and ts >= 0):
                errs.append("%s: event %d (%s): bad instant ts %r" % (path, i, e.get("name"), ts))
            if e.get("s", "t") == "t":
                used.add(key)
    for key in sorted(declared - used, key=str):
        errs.append("%s: track pid=%s tid=%s is declared but has no events" % (path, key[0], key[1]))
    for key in sorted(set(tracks) - declared, key=str):
        errs.append("%s: track pid=%s tid=%s has slices but no thread_name" % (path, key[0], key[1]))
    bad = 0
    for key, sl in tracks.items():
        sl.sort(key=lambda s: (s[0], -s[1], s[2]))
        open_ = []  # end times of the enclosing slices
        for start, end, i, name in sl:
            while open_ and open_[-1][0] <= start:
                open_.pop()
            if open_ and end > open_[-1][0]:
                bad += 1
                if bad <= 5:
                    errs.append("%s: pid=%s tid=%s: event %d (%s) [%d, %d] ns partly overlaps event %d [.., %d] ns"
                                % (path, key[0], key[1], i, name, start, end, open_[-1][1], open_[-1][0]))
            open_.append((end, i))
    if bad > 5:
        errs.append("%s: %d partly overlapping slices in all" % (path, bad))
    nsl = sum(len(v) for v in tracks.values())
    if nsl == 0:
        errs.append("%s: no slices" % path)
    return errs, nsl


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    fails = 0
    for p in argv[1:]:
        errs, n = check(p)
        for e in errs:
            print(e)
        if errs:
            fails += 1
        else:
            print("%s: ok, %d slices" % (p, n))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
