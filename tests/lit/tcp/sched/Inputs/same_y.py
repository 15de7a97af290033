"""same_y.py MOEC LAYER.moe "SETS" A.tcpb B.tcpb ...: random weights under the
layer's checkpoint names (from `moec ir --format=json` with SETS) and a random
input, each program run on the TCP simulator; exits 1 unless every y is
byte-identical to the first, finite and not all zero, and within the TCP
tolerance of the reference interpreter's y (under the sanitizers the host LLVM
engine's) for the same layer, weights and input (2e-2 x max|y| + 1e-6,
tests/unit/test_op_matrix.c's: the simulator stores bf16 operands of its matrix
engine and sums in its own order). Used by the schedule-rewrite lit tests: a
rewrite must not change values, and the values must be the layer's."""
import math
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import REF_ENGINE, random_layer, read_npy_f32, write_npy, write_safetensors  # noqa: E402


def main():
    moec, moe, sets, progs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
    rng = random.Random(7)
    tensors, x_shape, xb = random_layer(moec, moe, sets, rng)
    with tempfile.TemporaryDirectory() as tmp:
        w, x = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "x.npy")
        write_safetensors(w, tensors)
        write_npy(x, "<f4", x_shape, xb)
        ref = os.path.join(tmp, "ref.npy")
        subprocess.run([moec, "run", moe] + sets + ["--weights", w, "--input", x, "-o", ref, "--target=host",
                                                   REF_ENGINE], check=True)
        yr = read_npy_f32(ref)[1]
        ys = []
        for k, p in enumerate(progs):
            y = os.path.join(tmp, "y%d.npy" % k)
            subprocess.run([moec, "run", p, "--weights", w, "--input", x, "-o", y, "--target=tcp"], check=True)
            ys.append(open(y, "rb").read())
            if k == 0:
                y0 = read_npy_f32(y)[1]
    if not all(math.isfinite(v) for v in y0) or not any(y0):
        print("y is not finite or is all zero")
        return 1
    scale = max(map(abs, yr))
    err = max(abs(a - b) for a, b in zip(y0, yr)) if len(y0) == len(yr) else math.inf
    if err > 2e-2 * scale + 1e-6:
        print("y differs from the interpreter's by %g (max|y| %g)" % (err, scale))
        return 1
    for k in range(1, len(ys)):
        if ys[k] != ys[0]:
            print("y of %s differs from y of %s" % (progs[k], progs[0]))
            return 1
    print("same y: %d programs, the interpreter's within 2e-2" % len(ys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
