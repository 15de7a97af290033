"""e2m1_plus_zero.py IN OUT: copies safetensors file IN to OUT with every E2M1
code 8 (-0) of its MXFP4 value tensors (u8, names ending in _blocks) made
code 0 (+0), in both nibbles of each byte; other tensors are copied as they are."""
import json
import struct
import sys

import numpy as np


def main():
    src, dst = sys.argv[1], sys.argv[2]
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = bytearray(raw[8 + n:])
    changed = 0
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] != "U8" or not name.endswith("_blocks"):
            continue
        a, b = t["data_offsets"]
        v = np.frombuffer(bytes(data[a:b]), dtype=np.uint8).copy()
        lo, hi = v & 0x0F, v & 0xF0
        out = np.where(lo == 8, hi, v)
        out = np.where(hi == 0x80, out & 0x0F, out).astype(np.uint8)
        changed += int((out != v).sum())
        data[a:b] = out.tobytes()
    open(dst, "wb").write(raw[:8 + n] + bytes(data))
    print("rewrote %d bytes" % changed)


if __name__ == "__main__":
    main()
