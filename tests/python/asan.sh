#!/bin/sh
# python.asan (sanitizer builds): the package's error and leak tests against the
# ASan+UBSan build's libmoec, the ASan runtime preloaded into Debian's python3 and
# LeakSanitizer on. The interpreter's own never-freed allocations (its arenas, the
# modules it imports) are suppressed by tests/python/lsan.supp; allocation stacks are
# kept short (malloc_context_size) so that a block libmoec allocates and leaks keeps
# libmoec frames on top and is reported, whatever Python frames lie below.
# usage: asan.sh PYTHON CC LIBMOEC   (a report or a failed test fails it)
#
# LeakSanitizer checks at exit by stopping every thread from a ptrace'd tracer; when
# a thread is still starting or ending then, the tracer itself can die ("LeakSanitizer
# has encountered a fatal error"), which says nothing about leaks. BLAS threads are
# kept to one so that few threads exist at exit, and a run whose only failure is the
# tracer's crash (every test passed, no leak reported) is run once more; a leak report
# or a failed test is never retried.
set -eu
py=$1 cc=$2 lib=$3
here=$(cd "$(dirname "$0")" && pwd)
asan=$("$cc" -print-file-name=libasan.so)
case $asan in /*) ;; *) echo "asan.sh: $cc has no libasan.so" >&2; exit 1 ;; esac
export MOEC_LIBRARY="$lib"
export PYTHONDONTWRITEBYTECODE=1
export ASAN_OPTIONS="detect_leaks=1:malloc_context_size=4:fast_unwind_on_malloc=0:abort_on_error=0:exitcode=23"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() {
	rc=0
	LD_PRELOAD="$asan" "$py" -m pytest -q -p no:cacheprovider "$here/test_errors.py" "$here/test_leak.py" >"$log" 2>&1 || rc=$?
	cat "$log"
}
run
if [ "$rc" -ne 0 ] && grep -q "LeakSanitizer has encountered a fatal error" "$log" &&
	! grep -q "ERROR: LeakSanitizer: detected memory leaks" "$log" &&
	! grep -Eq "[0-9]+ (failed|error)" "$log"; then
	echo "asan.sh: LeakSanitizer's tracer crashed after every test passed; running once more" >&2
	run
fi
exit "$rc"
