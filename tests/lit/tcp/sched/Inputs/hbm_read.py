"""hbm_read.py MOEC LAYER.moe "SETS" A.tcpb B.tcpb ...: the layer's random
weights and input (litio.random_layer, the seed of same_y.py), each program
run on the TCP simulator with --stats; prints one line per program,
`PROGRAM: hbm_read_bytes N blocks_executed B experts_hit H`, the simulator's
own counts of the run."""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import random_layer, write_npy, write_safetensors  # noqa: E402


def main():
    moec, moe, sets, progs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
    tensors, x_shape, xb = random_layer(moec, moe, sets, random.Random(7))
    with tempfile.TemporaryDirectory() as tmp:
        w, x = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "x.npy")
        write_safetensors(w, tensors)
        write_npy(x, "<f4", x_shape, xb)
        for k, p in enumerate(progs):
            y, st = os.path.join(tmp, "y%d.npy" % k), os.path.join(tmp, "s%d.json" % k)
            subprocess.run([moec, "run", p, "--weights", w, "--input", x, "-o", y, "--target=tcp", "--stats", st],
                           check=True)
            d = json.load(open(st))
            print("%s: hbm_read_bytes %d blocks_executed %d experts_hit %d"
                  % (os.path.basename(p), d["hbm_read_bytes"], d["blocks_executed"], d["experts_hit"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
