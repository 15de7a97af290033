#!/usr/bin/env python3
"""retype.py IN OUT NAME: copies a safetensors file with tensor NAME's dtype
relabelled F32 -> I32 (same bytes), to test the dtype check."""
import json
import struct
import sys

src, dst, name = sys.argv[1:4]
data = open(src, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
assert header[name]["dtype"] == "F32", header[name]
header[name]["dtype"] = "I32"
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + data[8 + n:])
