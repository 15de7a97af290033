"""spill_y.py MOEC LAYER.moe "SETS" REF.tcpb PROG.tcpb ...: the values of
programs compiled from one layer for machines of different DM sizes.

Random weights under the layer's checkpoint names (from `moec ir
--format=json` with SETS) and a random input x (pure Python, seeded); each
program run on the TCP simulator. Prints one line per program and exits 1
unless:
  - REF's y is finite, not all zero, and within 1e-2 * max|y_host| of the
    host run of the layer (`moec run LAYER SETS`, the bound of
    tests/e2e/examples_targets.py: a token routed to other experts shows as an
    error of the order of y itself);
  - every PROG's y is byte-identical to REF's (same summation order: the DM
    residence of a buffer changes where bytes live, never an operation), else
    its max |y - y_ref| and the number of differing values are printed."""
import array
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import random_layer, write_npy, write_safetensors  # noqa: E402


def read_npy(path):
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    if "'<f4'" not in b[10:10 + n].decode():
        sys.exit("%s: not f32" % path)
    a = array.array("f")
    a.frombytes(b[10 + n:])
    return b, a


def main():
    moec, moe, sets, ref, progs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4], sys.argv[5:]
    rng = random.Random(11)
    tensors, x_shape, xb = random_layer(moec, moe, sets, rng)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        w, x = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "x.npy")
        write_safetensors(w, tensors)
        write_npy(x, "<f4", x_shape, xb)
        yh = os.path.join(tmp, "host.npy")
        subprocess.run([moec, "run", moe, "--weights", w, "--input", x, "-o", yh] + sets, check=True)
        _, host = read_npy(yh)
        ys = {}
        for k, p in enumerate([ref] + progs):
            y = os.path.join(tmp, "y%d.npy" % k)
            subprocess.run([moec, "run", p, "--weights", w, "--input", x, "-o", y, "--target=tcp"], check=True)
            ys[p] = read_npy(y)
    rb, ry = ys[ref]
    scale = max(abs(v) for v in host)
    err = max(abs(a - b) for a, b in zip(ry, host)) if len(ry) == len(host) else math.inf
    ok = len(ry) == len(host) and all(math.isfinite(v) for v in ry) and scale > 0 and err <= 1e-2 * scale
    print("%s %s: tcp vs host max|err| = %.2e x max|y_host| (%d values)" % ("ok" if ok else "FAIL", os.path.basename(ref),
                                                                          err / scale if scale else math.inf, len(ry)))
    bad += not ok
    for p in progs:
        pb, py = ys[p]
        if pb == rb:
            print("ok %s: y byte-identical to %s" % (os.path.basename(p), os.path.basename(ref)))
            continue
        diff = [abs(a - b) for a, b in zip(py, ry) if a != b or not math.isfinite(a)] if len(py) == len(ry) else [math.inf]
        print("FAIL %s: y differs from %s: %d values, max|diff| = %.3e" % (os.path.basename(p), os.path.basename(ref),
                                                                         len(diff), max(diff) if diff else 0.0))
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
