"""overflow_kernels.test: `gen DIR` writes the weights and input of
overflow_sum.moe; `check INTERP PORTABLE AUTO` compares the three outputs.

Each output element sums the products [P, P, P, -P, -P, -P] (P = 1.5e38, the rest 0).
Added one k at a time (the interpreter, the portable kernels) the third partial sum
overflows: +inf. vdpbf16ps adds each k pair odd term first (P + P, then -P + P, then
-P + -P... as (2P - P) + P = 2P, then 2P - P - P = 0): 0. Without AVX512-BF16, auto is
the portable kernel."""
import json
import struct
import sys

P_BF16 = 0x7ee2  # bf16 nearest 1.5e38
ONE_BF16 = 0x3f80


def npy_write(path, descr, shape, payload):
    head = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else ""))
    head += " " * (63 - (10 + len(head)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + payload)


def npy_read_f32(path):
    data = open(path, "rb").read()
    hl = struct.unpack("<H", data[8:10])[0]
    head = data[10:10 + hl].decode()
    body = data[10 + hl:]
    if "'<u2'" in head:  # bf16 bits
        return [struct.unpack("<f", struct.pack("<I", b << 16))[0]
                for b in struct.unpack("<%dH" % (len(body) // 2), body)]
    return list(struct.unpack("<%df" % (len(body) // 4), body))


def gen(d):
    p = struct.unpack("<f", struct.pack("<I", P_BF16 << 16))[0]
    row = [p, p, p, -p, -p, -p] + [0.0] * 58
    npy_write(d + "/x.npy", "<f4", (4, 64), struct.pack("<256f", *(row * 4)))
    w = ([ONE_BF16] * 6 + [0] * 58) * 16
    data = struct.pack("<%dH" % len(w), *w)
    hdr = json.dumps({"w": {"dtype": "BF16", "shape": [16, 64], "data_offsets": [0, len(data)]}}).encode()
    with open(d + "/w.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)


def check(interp, portable, auto):
    i, p, a = npy_read_f32(interp), npy_read_f32(portable), npy_read_f32(auto)
    assert all(v == float("inf") for v in i), i[:4]
    assert struct.pack("<%df" % len(p), *p) == struct.pack("<%df" % len(i), *i), "portable differs"
    if a == i:
        print("auto: the interpreter's +inf (portable kernel: no AVX512-BF16 here)")
    else:
        assert all(v == 0.0 for v in a), a[:4]
        print("auto: 0 where the interpreter has +inf (vdpbf16ps)")


if __name__ == "__main__":
    gen(sys.argv[2]) if sys.argv[1] == "gen" else check(*sys.argv[2:5])
