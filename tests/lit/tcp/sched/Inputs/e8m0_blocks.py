"""e8m0_blocks.py IN OUT EDIT...: copies safetensors file IN to OUT with MXFP4
blocks edited. EDIT is PROJ:E:ROW:BLOCK:SCALE[:CODE]: the E8M0 scale of block
BLOCK of row ROW of expert E of the tensor whose name ends in PROJ_scales set
to SCALE, and, with CODE, its 32 E2M1 values (16 bytes of PROJ_blocks) all set
to code CODE (0..15). Prints one line per edit."""
import json
import struct
import sys

import numpy as np


def main():
    src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = bytearray(raw[8 + n:])

    def find(suffix):
        names = [k for k in head if k != "__metadata__" and k.endswith(suffix)]
        if len(names) != 1:
            raise SystemExit("no single tensor ends in %s: %s" % (suffix, names))
        return head[names[0]]

    for e in edits:
        f = e.split(":")
        proj, ex, row, blk, scale = f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4])
        st = find(proj + "_scales")
        shape = st["shape"]
        i = (ex * shape[-2] + row) * shape[-1] + blk
        data[st["data_offsets"][0] + i] = scale
        if len(f) > 5:
            c = int(f[5])
            bt = find(proj + "_blocks")
            a = bt["data_offsets"][0] + 16 * i
            data[a:a + 16] = bytes([c | c << 4]) * 16
        print("%s expert %d row %d block %d: scale %d%s" % (proj, ex, row, blk, scale,
                                                            " code %s" % f[5] if len(f) > 5 else ""))
    open(dst, "wb").write(raw[:8 + n] + bytes(data))


if __name__ == "__main__":
    main()
