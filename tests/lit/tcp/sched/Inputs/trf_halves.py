"""trf_halves.py SCHED.tsched: reads a printed schedule (docs/tcp-compiler.md
4.2) and prints, for each region of the block loop's body that holds TRF
loads (`sub.ldtrf`), the placed offsets (`at=`) of their destination buffers
in program order, one line per distinct pattern with how many regions show
it: `tsel case <bound>: at,at,... xN` for the cases of a classes region keyed
on $tsel (the rewrite trf-parity's block parity), `body: at,at,... xN` for
any other region. Independent of moec: it reads only the text."""
import collections
import itertools
import re
import sys


def main():
    at = {}
    stack = []  # the open regions: (header line, a number unique in the file)
    serial = itertools.count()
    cur = {}  # region number -> [key, bound, offsets]
    pats = collections.Counter()
    inbody = False
    for line in open(sys.argv[1]):
        t = line.strip()
        m = re.match(r'buf %(\d+) .* at=(\d+)', t)
        if m:
            at[int(m.group(1))] = int(m.group(2))
            continue
        if t.endswith("{"):
            stack.append((t, next(serial)))
            inbody = inbody or t == "body {"
            continue
        if t == "}":
            if stack:
                h, n = stack.pop()
                if n in cur:
                    kind, bound, offs = cur.pop(n)
                    pats["%s: %s" % (kind if kind == "body" else kind + " case " + bound, ",".join(map(str, offs)))] += 1
                inbody = inbody and h != "body {"
            continue
        m = re.match(r'op @\d+ sub\.ldtrf .* dst=%(\d+)\+', t)
        if m and inbody and stack:
            h, n = stack[-1]
            tsel = len(stack) >= 2 and stack[-2][0].startswith("classes $tsel")
            bound = h.split()[1] if h.startswith("case ") else "-"
            cur.setdefault(n, ["tsel" if tsel else "body", bound, []])[2].append(at.get(int(m.group(1)), -1))
    for p, k in sorted(pats.items()):
        print("%s x%d" % (p, k))


if __name__ == "__main__":
    main()
