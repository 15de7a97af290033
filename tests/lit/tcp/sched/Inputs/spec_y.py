"""spec_y.py MOEC LAYER.moe "SETS" A.tcpb B.tcpb ...: same_y.py's check twice,
for the rewrites `spec-fetch` and `spec-ring` (a speculative fetch of expert 0): once on
same_y.py's random layer and input (expert 0 routed: the speculation hits),
once with the router's row of expert 0 set to -0.1 and x made positive
(|x| + 0.5), so that expert 0's logit is below every other expert's for every
token and no pair routes to it (the speculation misses, the guarded
fetch runs). Each time every program's y must be byte-identical to the first,
finite and not all zero, and within the TCP tolerance (2e-2 x max|y| + 1e-6)
of the reference interpreter's y (under the sanitizers the host LLVM engine's)
for the same weights and input. Exits 1 otherwise."""
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import REF_ENGINE, random_layer, read_npy_f32, write_npy, write_safetensors  # noqa: E402


def check(moec, moe, sets, progs, tensors, x_shape, xb, tmp, tag):
    w, x = os.path.join(tmp, tag + "w.safetensors"), os.path.join(tmp, tag + "x.npy")
    write_safetensors(w, tensors)
    write_npy(x, "<f4", x_shape, xb)
    ref = os.path.join(tmp, tag + "ref.npy")
    subprocess.run([moec, "run", moe] + sets + ["--weights", w, "--input", x, "-o", ref, "--target=host",
                                               REF_ENGINE], check=True)
    yr = read_npy_f32(ref)[1]
    ys = []
    for k, p in enumerate(progs):
        y = os.path.join(tmp, "%sy%d.npy" % (tag, k))
        subprocess.run([moec, "run", p, "--weights", w, "--input", x, "-o", y, "--target=tcp"], check=True)
        ys.append(open(y, "rb").read())
        if k == 0:
            y0 = read_npy_f32(y)[1]
    if not all(math.isfinite(v) for v in y0) or not any(y0):
        print("%s: y is not finite or is all zero" % tag)
        return False
    scale = max(map(abs, yr))
    err = max(abs(a - b) for a, b in zip(y0, yr)) if len(y0) == len(yr) else math.inf
    if err > 2e-2 * scale + 1e-6:
        print("%s: y differs from the interpreter's by %g (max|y| %g)" % (tag, err, scale))
        return False
    for k in range(1, len(ys)):
        if ys[k] != ys[0]:
            print("%s: y of %s differs from y of %s" % (tag, progs[k], progs[0]))
            return False
    return True


def main():
    moec, moe, sets, progs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
    tensors, x_shape, xb = random_layer(moec, moe, sets, random.Random(7))
    with tempfile.TemporaryDirectory() as tmp:
        if not check(moec, moe, sets, progs, tensors, x_shape, xb, tmp, "hit"):
            return 1
        # expert 0 never routed: its router row -0.1, x positive
        miss, found = [], False
        for name, dt, shape, payload in tensors:
            if len(shape) == 2 and name.endswith(".gate.weight"):
                v = list(struct.unpack("<%df" % (len(payload) // 4), payload))
                v[:shape[1]] = [-0.1] * shape[1]
                payload, found = struct.pack("<%df" % len(v), *v), True
            miss.append((name, dt, shape, payload))
        if not found:
            print("no router weight [E, D] named *.gate.weight")
            return 1
        xs = struct.unpack("<%df" % (len(xb) // 4), xb)
        xa = [abs(a) + 0.5 for a in xs]
        xm = struct.pack("<%df" % len(xa), *xa)
        # the premise, checked here: expert 0's logit is every token's lowest
        r = [(name, shape, struct.unpack("<%df" % (len(p) // 4), p)) for name, _, shape, p in miss
             if len(shape) == 2 and name.endswith(".gate.weight")][0]
        E, D = r[1]
        for t in range(len(xa) // D):
            lg = [sum(r[2][e * D + i] * xa[t * D + i] for i in range(D)) for e in range(E)]
            if lg[0] >= min(lg[1:]):
                print("token %d may route to expert 0" % t)
                return 1
        if not check(moec, moe, sets, progs, miss, x_shape, xm, tmp, "miss"):
            return 1
    print("same y: %d programs, expert 0 routed and not, the interpreter's within 2e-2" % len(progs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
