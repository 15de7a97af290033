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
