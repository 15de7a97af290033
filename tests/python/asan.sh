#!/bin/sh
# python.asan (sanitizer builds): the package's error and leak tests against the
# ASan+UBSan build's libmoec, the ASan runtime preloaded into Debian's python3 and
# LeakSanitizer on. The interpreter's own never-freed allocations (its arenas, the
# modules it imports) are suppressed by tests/python/lsan.supp; allocation stacks are
# kept short (malloc_context_size) so that a block libmoec allocates and leaks keeps
# libmoec frames on top and is reported, whatever Python frames lie below.
# usage: asan.sh PYTHON CC LIBMOEC   (a report or a failed test fails it)
set -eu
py=$1 cc=$2 lib=$3
here=$(cd "$(dirname "$0")" && pwd)
asan=$("$cc" -print-file-name=libasan.so)
case $asan in /*) ;; *) echo "asan.sh: $cc has no libasan.so" >&2; exit 1 ;; esac
export LD_PRELOAD="$asan"
export MOEC_LIBRARY="$lib"
export PYTHONDONTWRITEBYTECODE=1
export ASAN_OPTIONS="detect_leaks=1:malloc_context_size=4:fast_unwind_on_malloc=0:abort_on_error=0:exitcode=23"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exec "$py" -m pytest -q -p no:cacheprovider "$here/test_errors.py" "$here/test_leak.py"
