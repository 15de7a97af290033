#!/usr/bin/env python3
"""Writes a small bf16 checkpoint (safetensors) for tests/lit/host/pack_cache.test
and an f32 input (.npy), with the standard library only: a layer of E experts,
D = F = 64 (so its bf16 weights are packed for the dot-product kernels).

usage: small_bf16_ckpt.py OUT.safetensors X.npy E D F T"""
import json
import random
import struct
import sys


def bf16(v):
    return struct.unpack("<I", struct.pack("<f", v))[0] >> 16


def main():
    out, xpath = sys.argv[1], sys.argv[2]
    E, D, F, T = (int(a) for a in sys.argv[3:7])
    rng = random.Random(7)
    names = [("model.layers.0.mlp.gate.weight", (E, D))]
    for e in range(E):
        for p, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            names.append(("model.layers.0.mlp.experts.%d.%s.weight" % (e, p), shape))
    header, blobs, at = {}, [], 0
    for name, shape in names:
        n = shape[0] * shape[1]
        b = struct.pack("<%dH" % n, *(bf16(rng.gauss(0, 0.05)) for _ in range(n)))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (T, D)
    hdr += " " * (-(len(hdr) + 11) % 64) + "\n"
    with open(xpath, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%df" % (T * D), *(rng.gauss(0, 1) for _ in range(T * D))))


if __name__ == "__main__":
    main()
