"""sched_data.py: inputs and expected outputs of the hand-written schedules
run by the lit tests of tests/lit/tcp/sched, computed here in Python from the
schedules' meaning (docs/tcp-compiler.md 4 and 5.5), independently of moec.

  sched_data.py straight DIR            x.npy f32[16,64], w.safetensors (model.w f32[16,64])
  sched_data.py check-straight DIR Y    Y == f32(f32(x * w) + 1.5)
  sched_data.py loop DIR                x.npy f32[32,64], counts.npy i32[5], w.safetensors (model.s f32[8,64])
  sched_data.py check-loop DIR Y        the block loop of loop.tsched (see there)

Values are exact in f32 (the products and sums below are computed in double
and rounded once to f32, as one f32 operation rounds), so the checks compare
bit for bit."""
import struct
import sys
import os

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import f32_bytes, read_npy_f32, write_npy, write_safetensors  # noqa: E402


def lcg(seed):
    """values k / 16 in [-4, 4) from a 64-bit LCG: exact in f32, and so are their products"""
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield ((state >> 40) % 128 - 64) / 16.0


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def values(seed, n):
    g = lcg(seed)
    return [next(g) for _ in range(n)]


def compare(got_path, shape, want):
    shape_got, got = read_npy_f32(got_path)
    if shape_got != shape:
        sys.exit("shape %s, expected %s" % (shape_got, shape))
    bad = [i for i in range(len(want)) if got[i] != want[i]]
    if bad:
        i = bad[0]
        sys.exit("%d of %d values differ; first at %d: %r, expected %r" % (len(bad), len(want), i, got[i], want[i]))
    print("ok: %d values equal" % len(want))


# -- straight.tsched: y = x * w + 1.5 over [16, 64]
def straight(d):
    write_npy(d + "/x.npy", "<f4", (16, 64), f32_bytes(values(1, 1024)))
    write_safetensors(d + "/w.safetensors", [("model.w", "F32", (16, 64), f32_bytes(values(2, 1024)))])


def check_straight(d, y):
    x, w = values(1, 1024), values(2, 1024)
    compare(y, (16, 64), [f32(f32(x[i] * w[i]) + 1.5) for i in range(1024)])


# -- loop.tsched: a grid of G = 4 blocks of 8 rows of x [32, 64]; counts =
# [nb, rows_0 .. rows_3]. Block g < nb: its rows i < rows_g are x * s * c
# (c = 2 in row class 4, rows_g <= 4; c = 3 in class 8), its other rows 0;
# blocks of even g then get + 100 (a guard). Blocks g >= nb are not run: y
# stays 0 there (an output starts as zeros, docs/tcp-isa.md 7).
COUNTS = [3, 3, 8, 0, 6]


def loop(d):
    write_npy(d + "/x.npy", "<f4", (32, 64), f32_bytes(values(3, 2048)))
    write_npy(d + "/counts.npy", "<i4", (5,), struct.pack("<%di" % len(COUNTS), *COUNTS))
    write_safetensors(d + "/w.safetensors", [("model.s", "F32", (8, 64), f32_bytes(values(4, 512)))])


def check_loop(d, y):
    x, s = values(3, 2048), values(4, 512)
    nb, want = COUNTS[0], [0.0] * 2048
    for g in range(nb):
        rows = COUNTS[1 + g]
        c = 2.0 if rows <= 4 else 3.0
        for i in range(8):
            for j in range(64):
                k = (g * 8 + i) * 64 + j
                v = f32(f32(x[k] * s[i * 64 + j]) * c) if i < rows else 0.0
                want[k] = f32(v + 100.0) if g % 2 == 0 else v
    compare(y, (32, 64), want)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"straight": straight, "check-straight": check_straight, "loop": loop, "check-loop": check_loop}[cmd](*args)
