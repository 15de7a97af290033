"""litio.py: .npy and .safetensors reading and writing, shared by the lit tests'
input writers and checkers. Payloads are bytes, little-endian, as the files
store them. The readers and writers are plain Python; random_layer draws its
values with numpy (a test dependency, README's install), whose generator makes
the large layers of the schedule-rewrite tests in a fraction of a second."""
import json
import os
import struct

# The host engine that gives a TCP test its reference y, as lit.cfg.py chose it
# for %ref_engine (the interpreter outside lit).
REF_ENGINE = os.environ.get("MOEC_TEST_REF_ENGINE", "--engine=interp")


def write_npy(path, descr, shape, payload):
    """an .npy (version 1.0) of dtype descr (e.g. '<f4') and shape holding payload"""
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, "".join("%d, " % s for s in shape))
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + payload)


def read_npy(path):
    """(descr, shape, payload) of an .npy written by moec or write_npy"""
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    hdr = b[10:10 + n].decode()
    descr = hdr.split("'descr': '")[1].split("'")[0]
    shape = tuple(int(s) for s in hdr.split("'shape': (")[1].split(")")[0].split(",") if s.strip())
    return descr, shape, b[10 + n:]


def read_npy_f32(path):
    """(shape, values) of an f32 .npy"""
    descr, shape, data = read_npy(path)
    assert descr == "<f4", descr
    return shape, struct.unpack("<%df" % (len(data) // 4), data)


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def write_safetensors(path, tensors):
    """tensors: [(name, dtype, shape, payload)], dtype a safetensors name (F32, BF16, ...)"""
    header, off = {}, 0
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(payload)]}
        off += len(payload)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors:
            f.write(t[3])


def random_layer(moec, moe, sets, rng):
    """Seeded random f32 weights under a layer's checkpoint names (read from
    `moec ir --format=json` with the --set arguments sets), of scale
    0.3 / sqrt(last dim) (0.1 for vectors), then its input x of scale 1, all
    drawn in that order from a numpy generator seeded by rng:
    ([(name, "F32", shape, payload)], x_shape, x_payload)."""
    import math
    import subprocess

    import numpy as np

    gen = np.random.default_rng(rng.getrandbits(64))

    def gauss(shape, scale):
        return (gen.standard_normal(math.prod(shape)) * scale).astype("<f4").tobytes()

    ir = json.loads(subprocess.run([moec, "ir", moe, "--format=json"] + sets, check=True, capture_output=True,
                                   text=True).stdout)
    tensors, x_shape = [], None
    for n in ir["layers"][0]["nodes"]:
        if n["op"] == "input":
            x_shape = n["shape"]
        if n["op"] != "weight":
            continue
        src, shape = n["attrs"]["source"]["str"], n["shape"]
        scale = 0.3 / max(1.0, float(shape[-1]) ** 0.5) if len(shape) > 1 else 0.1
        if "{e}" in src:
            for e in range(shape[0]):
                tensors.append((src.replace("{e}", str(e)), "F32", shape[1:], gauss(shape[1:], scale)))
        else:
            tensors.append((src, "F32", shape, gauss(shape, scale)))
    return tensors, x_shape, gauss(x_shape, 1.0)
