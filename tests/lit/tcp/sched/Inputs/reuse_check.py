"""reuse_check.py SCHED.tsched: reads a printed schedule (docs/tcp-compiler.md
4.2) and counts the pairs of accesses that distinct DM/TRF/VRF buffers make to
shared bytes (their `at=` offsets and layout footprints overlap, on
overlapping slices), one access a write, on different contexts, that no path
of distance-0 dependencies and context order (a context runs its commands in
program order) orders, ops in different cases of one row-class switch
excepted. Prints `unordered: N` and the first few such pairs. Independent of
moec's verifier: it reads only the text."""
import re
import sys

CTX = {"tu": "main", "sub": "sub", "dma": "dma"}


def main():
    bufs, ops, order = {}, {}, []
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
    bad = []
    ids = sorted(b for b in bufs if b in acc)
    for i, x in enumerate(ids):
        for y in ids[i + 1:]:
            X, Y = bufs[x], bufs[y]
            if X[0] != Y[0] or X[2] <= Y[1] or Y[2] <= X[1] or X[4] <= Y[3] or Y[4] <= X[3]:
                continue
            for a, aw in acc[x]:
                for b, bw in acc[y]:
                    if a == b or not (aw or bw) or ops[a][0] == ops[b][0] or exclusive(ops[a][4], ops[b][4]):
                        continue
                    if a not in reach[b] and b not in reach[a]:
                        p, q = (a, b) if pos[a] < pos[b] else (b, a)
                        bad.append("%%%u/%%%u: @%u and @%u" % (x, y, p, q))
    print("unordered: %d" % len(bad))
    for line in bad[:4]:
        print(line)


def exclusive(pa, pb):
    """Paths of (block id, kind): in different cases of one classes block."""
    for k in range(min(len(pa), len(pb))):
        if pa[k] != pb[k]:
            return k > 0 and pa[k - 1][1] == "classes"
    return False


if __name__ == "__main__":
    main()
