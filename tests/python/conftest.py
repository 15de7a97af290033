"""pytest set-up for the Python package's tests (tests/python).

The package comes from the source tree's python/ folder unless MOEC_PYTHON_INSTALLED=1
(then from wherever `import moec` finds it); the library is found as docs/python.md
says (MOEC_LIBRARY, the build tree, the install prefix, the system loader). MOEC_CLI is
the moec command the byte-for-byte checks compare with (default build/moec).
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("MOEC_PYTHON_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("MOEC_CLI", os.path.join(ROOT, "build", "moec"))
    if not os.access(path, os.X_OK):
        pytest.skip("no moec command at %s (set MOEC_CLI)" % path)
    return path


_NP = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I32": "<i4", "I64": "<i8", "U8": "u1", "BOOL": "?"}


def read_safetensors_np(path):
    """{name: ndarray} of a safetensors file (BF16 as uint16 bit patterns), without torch."""
    import json
    import struct

    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        out[name] = np.frombuffer(data[b:en], dtype=_NP[e["dtype"]]).reshape(e["shape"])
    return out
