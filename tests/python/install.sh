#!/bin/sh
# python.install: `cmake --install` into a fresh prefix installs the package beside the
# library; the installed package, imported from PREFIX/lib/python3/dist-packages with no
# MOEC_LIBRARY, finds the installed libmoec through moec/_install.py and runs a layer.
# usage: install.sh PYTHON BUILD_DIR SOURCE_DIR
set -eu
py=$1 build=$2 src=$3
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/lib/python3/dist-packages/moec/__init__.py"
test -f "$prefix/lib/python3/dist-packages/moec/_install.py"
cd "$prefix"
env -u MOEC_LIBRARY PYTHONPATH="$prefix/lib/python3/dist-packages" "$py" - "$src" "$prefix" <<'PY'
import os, sys
import numpy as np
import moec
src, prefix = sys.argv[1], os.path.realpath(sys.argv[2])
assert os.path.realpath(moec.__file__).startswith(prefix), moec.__file__
assert os.path.realpath(moec.library_path).startswith(prefix), moec.library_path
d = os.path.join(src, "tests/fixtures/hf/mixtral")
y, _ = moec.Layer.from_hf(d, tokens=5).run(np.load(os.path.join(d, "x_float32_T5.npy")))
ref = np.load(os.path.join(d, "y_float32_T5.npy"))
assert np.max(np.abs(y - ref)) <= 1e-4 * np.max(np.abs(ref))
print("installed package", moec.__file__, "library", moec.library_path, "version", moec.version())
PY
