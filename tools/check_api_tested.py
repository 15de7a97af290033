#!/usr/bin/env python3
"""tools/check_api_tested.py ROOT | --selftest: every public API function has a direct test.

The public API is every function declared MOE_API in ROOT/include/moec/*.h.
Each must be named (as a whole word) in a test: a file under ROOT/tests/
(the cmocka units, lit tests, the Python package's tests in tests/python) or
ROOT/python/tests/ where that exists. A call through the moec command or
through the library's own code is not a test of the function's contract, so
neither the sources nor the Python bindings (python/moec) count
(docs/contributing.md). With --selftest, check the checker on a made-up
tree. Exit status 1 listing the functions named in no test."""
import os
import re
import sys

TEST_DIRS = ("tests", os.path.join("python", "tests"))
MAX_BYTES = 4 << 20  # larger files are data (checkpoints, arrays), not tests
DECL = re.compile(r"\bMOE_API\b[^;{}()]*?\b(moe_\w+)\s*\(")


def api_functions(root):
    """{name: header} of every MOE_API function."""
    inc = os.path.join(root, "include", "moec")
    names = {}
    for f in sorted(os.listdir(inc)):
        if f.endswith(".h"):
            with open(os.path.join(inc, f), encoding="utf-8") as fh:
                text = fh.read()
            text = re.sub(r"#\s*define[^\n]*", "", text)  # the MOE_API macro itself
            for m in DECL.finditer(text):
                names.setdefault(m.group(1), f)
    return names


def test_words(root):
    """Every identifier-like word of the test files."""
    words = set()
    for sub in TEST_DIRS:
        top = os.path.join(root, sub)
        for d, subs, files in os.walk(top):
            subs[:] = [s for s in subs if not s.startswith(".") and s != "__pycache__"]
            for f in files:
                p = os.path.join(d, f)
                try:
                    if os.path.getsize(p) > MAX_BYTES:
                        continue
                    with open(p, "rb") as fh:
                        data = fh.read()
                except OSError:
                    continue
                if b"\0" in data:
                    continue
                words.update(re.findall(r"\bmoe_\w+", data.decode("utf-8", "replace")))
    return words


def check(root):
    names = api_functions(root)
    if not names:
        print(f"{root}/include/moec: no MOE_API function found", file=sys.stderr)
        return 1
    words = test_words(root)
    missing = sorted((h, n) for n, h in names.items() if n not in words)
    if missing:
        print(f"{len(missing)} of {len(names)} MOE_API functions are named in no test "
              f"(under {' or '.join(TEST_DIRS)}); give each a direct test of its contract "
              "(tests/unit/test_api_*.c) or remove it (docs/contributing.md):", file=sys.stderr)
        for h, n in missing:
            print(f"  include/moec/{h}: {n}", file=sys.stderr)
        return 1
    print(f"all {len(names)} MOE_API functions are named in a test")
    return 0


def selftest():
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "include", "moec"))
        os.makedirs(os.path.join(d, "tests", "unit"))
        os.makedirs(os.path.join(d, "python", "moec"))
        with open(os.path.join(d, "include", "moec", "a.h"), "w") as f:
            f.write("#define MOE_API __attribute__((visibility(\"default\")))\n"
                    "MOE_API int moe_tested(void);\n"
                    "MOE_API const char *moe_untested(int x,\n\tint y);\n"
                    "MOE_API moe_status moe_prefix(void);\n"
                    "int moe_not_api(void);\n")
        with open(os.path.join(d, "tests", "unit", "t.c"), "w") as f:
            f.write("assert(moe_tested() == 1); moe_prefix_longer();\n")
        with open(os.path.join(d, "python", "moec", "b.py"), "w") as f:
            f.write("lib.moe_untested\n")  # a binding is not a test
        run = lambda: subprocess.run([sys.executable, __file__, d], capture_output=True, text=True)
        r = run()
        if r.returncode != 1 or "moe_untested" not in r.stderr or "moe_prefix" not in r.stderr \
                or "moe_tested\n" in r.stderr or "moe_not_api" in r.stderr or "2 of 3" not in r.stderr:
            print("selftest: the untested functions were not reported as expected:\n" + r.stderr, file=sys.stderr)
            return 1
        os.makedirs(os.path.join(d, "python", "tests"))
        with open(os.path.join(d, "python", "tests", "test_b.py"), "w") as f:
            f.write("def test_b(): lib.moe_untested(1, 2)\n")
        with open(os.path.join(d, "tests", "unit", "u.c"), "w") as f:
            f.write("/* moe_prefix */\n")
        r = run()
        if r.returncode != 0:
            print("selftest: a fully tested tree was refused:\n" + r.stderr, file=sys.stderr)
            return 1
    print("selftest ok")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        sys.exit(selftest())
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(check(sys.argv[1]))
