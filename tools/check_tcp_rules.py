#!/usr/bin/env python3
"""tools/check_tcp_rules.py ROOT | --selftest: the TCP compiler's structural rules
(docs/tcp-compiler.md sections 5.3 and 9, must-show 2).

In backend-tcp/ (C sources and headers):
1. no `lower_try` and no `tcpl_find_region`: the block loop is an explicit op, never
   found again from the flattened graph, and nothing retries a lowering;
2. no einsum equation compared: a string literal of the form `"...->..."` stands only
   as the equation argument of an einsum builder (`ir_b_einsum(`), never in a
   comparison (strcmp, strncmp, strstr, memcmp, ==) or anywhere else;
3. in backend-tcp/compiler/, no read of the machine's DM size (`dm_bytes_per_slice`)
   outside the DM planner (dmplan.c, dmplan.h): every DM budget is the planner's grant
   or fit (tcp_dm_grant, tcp_dm_fits, tcp_space_bytes), so no pass holds its own
   fraction of DM. isa/ and sim/ read it to validate and to run.
Comments are ignored. With --selftest, check the checker on made-up sources: each
rule fires on a line that breaks it and not on one that keeps it.
Exit status 1 when a rule is broken, naming the file and line."""
import os
import re
import sys

EQ = re.compile(r'"[A-Za-z.,\s]*->[A-Za-z.\s]*"')
CMP = re.compile(r"\b(strcmp|strncmp|strstr|memcmp)\s*\(|==|!=")
PLANNER = ("dmplan.c", "dmplan.h")


def strip_comments(text):
    """text with /* */ and // comments blanked (newlines kept, so line numbers hold);
    string literals are kept as they are."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check_text(rel, text):
    """The broken rules of one file (rel: its path under the root, '/'-separated)."""
    errs = []
    in_compiler = rel.startswith("backend-tcp/compiler/")
    planner = os.path.basename(rel) in PLANNER
    for no, line in enumerate(strip_comments(text).split("\n"), 1):
        for name in ("lower_try", "tcpl_find_region"):
            if re.search(r"\b%s\b" % name, line):
                errs.append("%s:%d: `%s` (rule 1: the block loop is explicit, nothing retries)" % (rel, no, name))
        if EQ.search(line) and (CMP.search(line) or "ir_b_einsum(" not in line):
            errs.append("%s:%d: an einsum equation literal outside an einsum builder (rule 2)" % (rel, no))
        if in_compiler and not planner and re.search(r"\bdm_bytes_per_slice\b", line):
            errs.append("%s:%d: reads dm_bytes_per_slice outside the DM planner (rule 3: ask tcp_dm_grant, "
                        "tcp_dm_fits or tcp_space_bytes)" % (rel, no))
    return errs


def check_tree(root):
    errs = []
    base = os.path.join(root, "backend-tcp")
    for d, _, files in os.walk(base):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, root).replace(os.sep, "/")
                with open(p, encoding="utf-8") as fh:
                    errs += check_text(rel, fh.read())
    return errs


def selftest():
    cases = [  # (path, source, number of errors expected)
        ("backend-tcp/compiler/a.c", "static int f(void) { return lower_try(0); }\n", 1),
        ("backend-tcp/compiler/a.c", "/* lower_try was here */ int x;\n", 0),
        ("backend-tcp/sim/a.c", "moe_id r = tcpl_find_region(g);\n", 1),
        ("backend-tcp/compiler/a.c", 'if (!strcmp(eq, "gbi,goi->gbo")) return;\n', 1),
        ("backend-tcp/compiler/a.c", 'bool b = eq == "mi,oi->mo";\n', 1),
        ("backend-tcp/compiler/a.c", 'static const char *k = "gbi,goi->gbo";\n', 1),
        ("backend-tcp/compiler/a.c", 'return ir_b_einsum(d, "mi,oi->mo", a, b);\n', 0),
        ("backend-tcp/compiler/a.c", 'x = "a->b"; // "gbi,goi->gbo" in a comment\n', 1),
        ("backend-tcp/compiler/a.c", 'puts("not an equation - > here");\n', 0),
        ("backend-tcp/compiler/rw/a.c", "int64_t cap = m->dm_bytes_per_slice / 4;\n", 1),
        ("backend-tcp/compiler/dmplan.c", "return m->dm_bytes_per_slice;\n", 0),
        ("backend-tcp/isa/machine.c", "m->dm_bytes_per_slice = v;\n", 0),
        ("backend-tcp/compiler/a.c", "/* half of dm_bytes_per_slice */\nint y;\n", 0),
    ]
    bad = 0
    for rel, src, want in cases:
        got = len(check_text(rel, src))
        if got != want:
            print("selftest: %s %r: %d errors, want %d" % (rel, src, got, want))
            bad += 1
    print("selftest: %d cases, %d wrong" % (len(cases), bad))
    return 1 if bad else 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--selftest":
        return selftest()
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    errs = check_tree(sys.argv[1])
    for e in errs:
        print(e)
    print("check_tcp_rules: %d broken" % len(errs))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
