"""per_expert.py IN OUT: copies safetensors file IN to OUT with every tensor
named "...mlp.experts.NAME" [E, ...] written as E tensors
"...mlp.experts.<e>.NAME" [...] (the per-expert names a layer whose weight
sources hold {e} reads); the others as they are."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Inputs"))
from litio import write_safetensors  # noqa: E402


def main():
    raw = open(sys.argv[1], "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = []
    for name, t in head.items():
        if name == "__metadata__":
            continue
        b = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if ".mlp.experts." not in name:
            out.append((name, t["dtype"], t["shape"], b))
            continue
        pre, post = name.split(".mlp.experts.")
        E, row = t["shape"][0], len(b) // t["shape"][0]
        for e in range(E):
            out.append(("%s.mlp.experts.%d.%s" % (pre, e, post), t["dtype"], t["shape"][1:], b[e * row:(e + 1) * row]))
    write_safetensors(sys.argv[2], out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
