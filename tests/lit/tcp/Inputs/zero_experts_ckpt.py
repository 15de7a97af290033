#!/usr/bin/env python3
"""Writes a Qwen3-style bf16 checkpoint (safetensors) whose E experts' weights are
zeros (written in large blocks, so hundreds of MB take well under a second) and
whose router is small pseudo-random values, with the standard library only; and
an f32 input x of T rows.

usage: zero_experts_ckpt.py OUT.safetensors X.npy E D F T"""
import json
import random
import struct
import sys


def main():
    out, xpath = sys.argv[1], sys.argv[2]
    E, D, F, T = (int(a) for a in sys.argv[3:7])
    rng = random.Random(11)
    router = struct.pack("<%dH" % (E * D), *(struct.unpack("<I", struct.pack("<f", rng.gauss(0, 0.05)))[0] >> 16
                                             for _ in range(E * D)))
    names = [("model.layers.0.mlp.gate.weight", (E, D), router)]
    for e in range(E):
        for p, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            names.append(("model.layers.0.mlp.experts.%d.%s.weight" % (e, p), shape, None))
    header, at = {}, 0
    for name, shape, _ in names:
        n = 2 * shape[0] * shape[1]
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    zero = bytes(1 << 20)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape, data in names:
            if data is not None:
                f.write(data)
                continue
            n = 2 * shape[0] * shape[1]
            while n:
                k = min(n, len(zero))
                f.write(zero[:k])
                n -= k
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (T, D)
    hdr += " " * (-(len(hdr) + 11) % 64) + "\n"
    with open(xpath, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%df" % (T * D), *(rng.gauss(0, 1) for _ in range(T * D))))


if __name__ == "__main__":
    main()
