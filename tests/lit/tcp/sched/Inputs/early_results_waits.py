"""early_results_waits.py SCHEDULE.tsched (early_results.test): counts the
early copies (the ops inside the body's `guard $erlast`) and the commands
before the epilogue that wait for one (the epilogue's copies and the combine
after the loop are left out)."""
import re
import sys

lines = open(sys.argv[1]).read().split("\n")
early, depth, inside, after = set(), 0, None, False
waiters = 0
for ln in lines:
    s = ln.strip()
    if s == "guard $erlast {":
        inside = depth
    if s == "epilogue {":
        after = True
    m = re.match(r"op @(\d+) ", s)
    if m and inside is not None:
        early.add(int(m.group(1)))
    elif m and not after:
        deps = re.search(r"deps=\[([^\]]*)\]", s)
        if deps and any(int(d.split("^")[0]) in early for d in re.findall(r"@(\d+(?:\^\d+)?)", deps.group(1))):
            waiters += 1
    depth += s.count("{") - s.count("}")
    if inside is not None and depth <= inside and s == "}":
        inside = None
print("%d early copies; %d commands outside the epilogue and the combine wait for one" % (len(early), waiters))
