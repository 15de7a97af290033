"""reuse_check.py SCHED.tsched: reads a printed schedule (docs/tcp-compiler.md
4.2) and counts the pairs of accesses that distinct DM/TRF/VRF buffers make to
shared bytes (their `at=` offsets and layout footprints overlap, on
overlapping slices), one access a write, on different contexts, that no path
of distance-0 dependencies and context order (a context runs its commands in
program order) orders, ops in different cases of one row-class switch
excepted. Prints `unordered: N` and the first few such pairs. Then the same
across the blocks of a loop: for two such accesses in one loop body (any
cases: consecutive blocks may take different ones), a in block g before b in
block g + 1 is ordered when b or an op that finishes before b in its block
runs on a's context, or waits at distance 1 for a or for an op that a
finishes before; prints `unordered across blocks: N` and the first few (a
first). Independent of moec's verifier: it reads only the text."""
import re
import sys

CTX = {"tu": "main", "sub": "sub", "dma": "dma"}


def main():
    bufs, ops, order, d1, body = {}, {}, [], {}, {}
    stack, nblock = [], 0
    for line in open(sys.argv[1]):
        t = line.strip()
        if t.startswith("buf %"):
            m = re.match(r'buf %(\d+) "[^"]*" (\w+) .*?layout=\w+\((\d+),(\d+),(\d+),(\d+)\).*? at=(\d+)', t)
            if m:
                b, space, s0, ns, cp, sb, at = m.groups()
                s0, ns, cp, sb, at = int(s0), int(ns), int(cp), int(sb), int(at)
                if space != "hbm" and sb > 0:
                    bufs[int(b)] = (space, at, at + sb, s0, s0 + ns * max(cp, 1))
            continue
        if t.startswith("op @"):
            m = re.match(r"op @(\d+) (\w+)\.", t)
            o = int(m.group(1))
            dst = re.search(r" dst=%(\d+)", t)
            srcs = [int(x) for x in re.findall(r" s\d=%(\d+)", t)]
            deps = re.search(r"deps=\[([^\]]*)\]", t)
            d0 = [int(d[1:]) for d in deps.group(1).split(",") if "^" not in d] if deps else []
            d1[o] = [int(d[1:-2]) for d in deps.group(1).split(",") if d.endswith("^1")] if deps else []
            bodies = [b for b, kind in stack if kind == "body"]
            body[o] = bodies[-1] if bodies else None
            ops[o] = (CTX[m.group(2)], int(dst.group(1)) if dst else None, srcs, d0, list(stack))
            order.append(o)
        elif t.endswith("{"):
            nblock += 1
            stack.append((nblock, t.split()[0]))
        elif t == "}":
            stack.pop()
    pos = {o: k for k, o in enumerate(order)}
    # reach[o]: the ops that finish before o starts (within one block)
    reach, last = {}, {}
    for o in order:
        ctx, _, _, d0, _ = ops[o]
        r = set()
        preds = list(d0)
        p = last.get(ctx)
        while p is not None and exclusive(ops[p][4], ops[o][4]):
            p = ops[p][5] if len(ops[p]) > 5 else None
        if p is not None:
            preds.append(p)
        for d in preds:
            r |= reach[d]
            r.add(d)
        reach[o] = r
        ops[o] = ops[o] + (last.get(ctx),)
        last[ctx] = o
    acc = {}
    for o in order:
        _, dst, srcs, _, _ = ops[o][:5]
        for b in set(srcs):
            acc.setdefault(b, []).append((o, False))
        if dst is not None:
            acc.setdefault(dst, []).append((o, True))
    bad, cross = [], []
    ids = sorted(b for b in bufs if b in acc)
    for i, x in enumerate(ids):
        for y in ids[i + 1:]:
            X, Y = bufs[x], bufs[y]
            if X[0] != Y[0] or X[2] <= Y[1] or Y[2] <= X[1] or X[4] <= Y[3] or Y[4] <= X[3]:
                continue
            for a, aw in acc[x]:
                for b, bw in acc[y]:
                    if a == b or not (aw or bw) or ops[a][0] == ops[b][0]:
                        continue
                    if body[a] is not None and body[a] == body[b]:
                        for p, q in ((a, b), (b, a)):
                            if not crossed(p, q, ops, reach, d1, body):
                                cross.append("%%%u/%%%u: @%u then @%u" % (x, y, p, q))
                    if exclusive(ops[a][4], ops[b][4]):
                        continue
                    if a not in reach[b] and b not in reach[a]:
                        p, q = (a, b) if pos[a] < pos[b] else (b, a)
                        bad.append("%%%u/%%%u: @%u and @%u" % (x, y, p, q))
    print("unordered: %d" % len(bad))
    for line in bad[:4]:
        print(line)
    print("unordered across blocks: %d" % len(cross))
    for line in cross[:4]:
        print(line)


def crossed(a, b, ops, reach, d1, body):
    """Whether a's run in block g finishes before b's in block g + 1."""
    for b2 in [b] + sorted(reach[b]):
        if body[b2] != body[a]:
            continue
        if ops[b2][0] == ops[a][0]:
            return True
        for c in d1[b2]:
            if body.get(c) == body[a] and (c == a or a in reach[c]):
                return True
    return False


def exclusive(pa, pb):
    """Paths of (block id, kind): in different cases of one classes block."""
    for k in range(min(len(pa), len(pb))):
        if pa[k] != pb[k]:
            return k > 0 and pa[k - 1][1] == "classes"
    return False


if __name__ == "__main__":
    main()
