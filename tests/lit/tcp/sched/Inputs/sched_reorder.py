"""sched_reorder.py: input and check of tests/lit/tcp/sched/schedule.tsched,
computed here in Python from the schedule's meaning, independently of moec.

  sched_reorder.py x DIR        DIR/x.npy: f32[32,64], values k / 16 in [-4, 4), and
                                DIR/w.safetensors holding no tensor (the program has no weight)
  sched_reorder.py check DIR Y  Y == f32(x + 1.5) element by element (exact in f32)"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import f32_bytes, read_npy_f32, write_npy, write_safetensors  # noqa: E402


def x_values():
    return [((i * 37) % 128 - 64) / 16.0 for i in range(32 * 64)]


if sys.argv[1] == "x":
    write_npy(sys.argv[2] + "/x.npy", "<f4", (32, 64), f32_bytes(x_values()))
    write_safetensors(sys.argv[2] + "/w.safetensors", [])
elif sys.argv[1] == "check":
    y = read_npy_f32(sys.argv[3])[1]
    want = [v + 1.5 for v in x_values()]
    bad = [i for i in range(len(want)) if y[i] != want[i]]
    if len(y) != len(want) or bad:
        sys.exit("y differs from x + 1.5 at %d of %d elements" % (len(bad), len(want)))
    print("y == x + 1.5: %d elements" % len(want))
else:
    sys.exit(__doc__)
