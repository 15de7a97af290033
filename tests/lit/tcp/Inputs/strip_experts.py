"""strip_experts.py IN OUT: copy a safetensors file without the routed experts'
tensors (names containing '.experts.'), for timing-only runs."""
import json
import struct
import sys

with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    data = f.read()
out, blobs, off = {}, [], 0
for name, t in hdr.items():
    if name == "__metadata__" or ".experts." in name:
        continue
    a, b = t["data_offsets"]
    out[name] = dict(t, data_offsets=[off, off + b - a])
    blobs.append(data[a:b])
    off += b - a
h = json.dumps(out).encode()
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
