#!/usr/bin/env python3
"""tools/check_sizes.py ROOT [--list] | --selftest: the size rules of docs/contributing.md.

No C source or header of the repository (library, command, tools and tests;
generated and third-party files excepted) is longer than MAX_FILE lines, and no
function in any of them is longer than MAX_FUNC lines (from the line of its name
to its closing brace). Functions are found by the house layout: a definition's
opening brace and closing brace stand alone in column 0. With --list, print
the largest files and the longest functions as well. With
--selftest, check the checker on a made-up tree (a file and a function one
line over the limits are reported, ones at the limits are not).
Exit status 1 when a rule is broken, naming the file (and function)."""
import os
import re
import sys

MAX_FILE = 1200
MAX_FUNC = 150
SKIP_DIRS = {".git", "build", "bench/.cache"}
SKIP_PREFIX = ("build",)  # any build*/ folder at the root


def c_files(root):
    for d, subs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        if rel != "." and (rel.split(os.sep)[0].startswith(SKIP_PREFIX) or rel in SKIP_DIRS or
                           rel.split(os.sep)[0].startswith(".")):
            subs[:] = []
            continue
        for f in files:
            if f.endswith((".c", ".h")):
                yield os.path.normpath(os.path.join(rel, f))


def functions(lines):
    """(name, first line, last line) of each function definition, 1-based."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].rstrip() != "{":
            i += 1
            continue
        start = i - 1  # the signature: back to the line in column 0 holding '('
        while start > 0 and (lines[start][:1] in ("\t", " ") or "(" not in lines[start]):
            start -= 1
        m = re.search(r"(\w+)\s*\(", lines[start])
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "}":
            j += 1
        out.append((m.group(1) if m else "?", start + 1, j + 1))
        i = j + 1
    return out


def selftest():
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "backend-tcp"))
        os.makedirs(os.path.join(d, "tests"))
        os.makedirs(os.path.join(d, "build"))

        def fn(name, lines):  # a function of exactly `lines` lines
            return "static int %s(int x)\n{\n" % name + "\tx++;\n" * (lines - 3) + "}\n"

        def write(rel, text):
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)

        write("backend-tcp/a.c", fn("ok", MAX_FUNC) + "\n" + fn("too_long", MAX_FUNC + 1))
        write("tests/at_limit.c", "int x;\n" * MAX_FILE)
        write("tests/over.h", "int x;\n" * (MAX_FILE + 1))
        write("build/generated.c", "int x;\n" * (MAX_FILE + 5))  # build folders are not sources
        write("tests/long_fn.c", fn("elsewhere", MAX_FUNC + 10))  # the function rule is every folder's
        write("build/long_fn.c", fn("generated", MAX_FUNC + 10))
        p = subprocess.run([sys.executable, __file__, d], capture_output=True, text=True)
        got = sorted(l.split(":")[0] + ":" + (l.split("'")[1] if "'" in l else "") for l in p.stdout.splitlines())
        want = ["backend-tcp/a.c:too_long", "tests/long_fn.c:elsewhere", "tests/over.h:"]
        if p.returncode != 1 or got != want:
            print("selftest failed: exit %d, reported %s, want %s" % (p.returncode, got, want))
            return 1
    print("selftest passed")
    return 0


def main():
    if "--selftest" in sys.argv:
        return selftest()
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    listing = "--list" in sys.argv
    bad = 0
    sizes = []
    funcs = []
    for rel in sorted(c_files(root)):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        n = len(lines) - (lines[-1] == "")
        sizes.append((n, rel))
        if n > MAX_FILE:
            print("%s: %d lines, over the limit of %d: split it by what the code does" % (rel, n, MAX_FILE))
            bad = 1
        for name, a, b in functions(lines):
            funcs.append((b - a + 1, rel, name, a))
            if b - a + 1 > MAX_FUNC:
                print("%s:%d: function '%s' has %d lines, over the limit of %d: extract helpers" %
                      (rel, a, name, b - a + 1, MAX_FUNC))
                bad = 1
    if not sizes:
        print("no C sources under %s" % root)
        return 1
    if listing:
        sizes.sort(reverse=True)
        funcs.sort(reverse=True)
        print("largest files:", ", ".join("%s (%d)" % (r, n) for n, r in sizes[:5]))
        print("longest functions:")
        for n, rel, name, a in funcs[:10]:
            print("  %4d  %s:%d %s" % (n, rel, a, name))
    return bad


if __name__ == "__main__":
    sys.exit(main())
