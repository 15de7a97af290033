"""sched_reorder.py: input and check of tests/lit/tcp/sched/schedule.tsched,
computed here in Python from the schedule's meaning, independently of moec.

  sched_reorder.py x DIR        DIR/x.npy: f32[32,64], values k / 16 in [-4, 4), and
                                DIR/w.safetensors holding no tensor (the program has no weight)
  sched_reorder.py check DIR Y  Y == f32(x + 1.5) element by element (exact in f32)"""
import struct
import sys


def write(path, values):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (32, 64), }"
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%df" % len(values), *values))


def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    body = b[10 + n:]
    return list(struct.unpack("<%df" % (len(body) // 4), body))


def x_values():
    return [((i * 37) % 128 - 64) / 16.0 for i in range(32 * 64)]


if sys.argv[1] == "x":
    write(sys.argv[2] + "/x.npy", x_values())
    with open(sys.argv[2] + "/w.safetensors", "wb") as f:
        f.write(struct.pack("<Q", 8) + b"{}      ")
elif sys.argv[1] == "check":
    y = read(sys.argv[3])
    want = [v + 1.5 for v in x_values()]
    bad = [i for i in range(len(want)) if y[i] != want[i]]
    if len(y) != len(want) or bad:
        sys.exit("y differs from x + 1.5 at %d of %d elements" % (len(bad), len(want)))
    print("y == x + 1.5: %d elements" % len(want))
else:
    sys.exit(__doc__)
