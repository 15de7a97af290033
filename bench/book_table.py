#!/usr/bin/env python3
"""bench/book_table.py: table B of docs/tcp-model.md section 5 -- the items of the
furiosa-opt book's MNIST schedule figure (scheduling/schedule; the vendor compiler's
static schedule, not a device measurement) beside moec's simulated figure for the same
transfer or pass, written as programs in tests/tcp/book/tableB. A calibration of the
[A] fields, printed side by side, not fitted: nothing here changes machine.json.

usage: bench/book_table.py [BUILD]   (BUILD: the build directory, default build)
Prints a markdown table for bench/REPORT.md."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def meta(text, key):
    for line in text.splitlines():
        if line.startswith("# %s: " % key):
            return line[len(key) + 4:].strip()
    raise SystemExit("missing '# %s:'" % key)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    tool = os.path.join(build, "tests", "tcp_book")
    d = os.path.join(ROOT, "tests", "tcp", "book", "tableB")
    print("| MNIST figure item | book (cycles) | moec simulated | simulated / book |")
    print("|---|---|---|---|")
    order = ["tiny_pass", "trf_1600", "trf_512", "dma_512", "dma_8k", "dma_32", "fc1", "broadcast",
             "first_command", "tail"]
    for name in order:
        path = os.path.join(d, name + ".tcps")
        text = open(path).read()
        out = subprocess.run([tool, "--print", path], check=True, capture_output=True, text=True).stdout.split()
        span, first, cycles = int(out[0]), int(out[2]), int(out[3])
        metric = meta(text, "metric")
        got = {"span": span, "start": first, "tail": cycles - (first + span)}[metric]
        book = int(meta(text, "figure"))
        print("| %s | %s | %d | %.2f |" % (meta(text, "item"), "{:,}".format(book), got, got / book))


main()
