"""A checkpoint kept as its header and the name of another fixture's checkpoint that holds
its tensors' bytes (tests/fixtures/hf/compact.py writes it, README.md there says why).

rebuild.json: {"source": the source fixture folder, relative to this one, "sha256": of the file as HF wrote it,
"header": the header bytes as HF wrote them (latin-1), "tensors": {name: source name}}.
The file is rebuilt (8-byte length, header, every tensor's bytes in offset order) and
must hash to the recorded sha256: the tests then read the bytes HF wrote, or fail.
"""
import hashlib
import json
import os
import struct


def read(path):
    """(header dict, data bytes) of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def checkpoint(fixture_dir, tmp):
    """The path of the fixture's model.safetensors, rebuilt under tmp where it is kept as
    rebuild.json (a RuntimeError where the rebuilt bytes are not HF's)."""
    own = os.path.join(fixture_dir, "model.safetensors")
    spec_path = os.path.join(fixture_dir, "rebuild.json")
    if os.path.exists(own) or not os.path.exists(spec_path):
        return own
    spec = json.load(open(spec_path))
    shdr, sdata = read(os.path.join(fixture_dir, spec["source"], "model.safetensors"))
    hbytes = spec["header"].encode("latin-1")
    hdr = json.loads(hbytes)
    parts = []
    for name, meta in sorted(((k, v) for k, v in hdr.items() if k != "__metadata__"),
                             key=lambda kv: kv[1]["data_offsets"][0]):
        src = shdr[spec["tensors"][name]]
        parts.append(sdata[src["data_offsets"][0]:src["data_offsets"][1]])
    blob = struct.pack("<Q", len(hbytes)) + hbytes + b"".join(parts)
    if hashlib.sha256(blob).hexdigest() != spec["sha256"]:
        raise RuntimeError("%s: the rebuilt checkpoint is not the one HF wrote (sha256)" % spec_path)
    out = os.path.join(tmp, "rebuilt_%s_%s.safetensors" % (os.path.basename(os.path.dirname(os.path.abspath(fixture_dir))),
                                                            os.path.basename(os.path.abspath(fixture_dir))))
    with open(out, "wb") as f:
        f.write(blob)
    return out
