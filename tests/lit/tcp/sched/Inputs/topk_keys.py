"""topk_keys.py X.npy W.safetensors: scores [8, 32] (f32, bf16-exact where it
matters) that stress top-K's key order, and an empty checkpoint (the layer has
no weights): rows of ties at +0 with a -0 and a -1; negative ties; a NaN, +inf
and -inf among random values; ties at 1.0 with a -NaN and a value one bf16 ulp
above; all -inf but two NaNs (different payloads); all -0; tiny values (f32
subnormals and values that round to bf16 neighbours); random values."""
import os
import random
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import write_npy, write_safetensors  # noqa: E402

T, E = 8, 32
NAN, NNAN, NAN2 = 0x7FC00000, 0xFFC00000, 0x7F812345  # +qNaN, -qNaN, a NaN with a payload


def main():
    rng = random.Random(11)
    rows = [[struct.unpack("<I", struct.pack("<f", rng.gauss(0, 1)))[0] for _ in range(E)] for _ in range(T)]
    bits = lambda f: struct.unpack("<I", struct.pack("<f", f))[0]  # noqa: E731
    rows[0] = [0] * E
    rows[0][5], rows[0][7] = 0x80000000, bits(-1.0)
    rows[1] = [bits(-2.0)] * E
    rows[1][3] = rows[1][9] = bits(-1.0)
    rows[2][4], rows[2][10], rows[2][11] = NAN, bits(float("inf")), bits(float("-inf"))
    rows[3] = [bits(1.0)] * E
    rows[3][1], rows[3][30] = bits(1.0078125), NNAN
    rows[4] = [bits(float("-inf"))] * E
    rows[4][2], rows[4][6] = NAN2, NAN
    rows[5] = [0x80000000] * E
    rows[6] = [bits(rng.gauss(0, 1) * 1e-39) for _ in range(E)]
    payload = b"".join(struct.pack("<%dI" % E, *r) for r in rows)
    write_npy(sys.argv[1], "<f4", (T, E), payload)
    write_safetensors(sys.argv[2], [])


if __name__ == "__main__":
    main()
