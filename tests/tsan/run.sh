#!/bin/sh
# tests/tsan/run.sh: the two-threads test (tests/unit/test_threads.c) and the
# host thread-pool test (tests/unit/test_host_par.c: layers on 1-3 threads) and the
# simulated expert-parallel devices (tests/unit/test_expert_parallel.c: a thread each)
# built with ThreadSanitizer and run through ctest; any data race fails them.
# (The JIT-compiled layer code itself is not instrumented; the pool's
# hand-offs around it are.)
#
# Usage: tests/tsan/run.sh [BUILD_DIR]     (default: build-tsan in the source tree)
# Environment: CC     the compiler (default clang-19 when installed, else cc)
#              JOBS   parallel build jobs (default 2)
# Configures BUILD_DIR with -DMOEC_TSAN=ON, builds only those two targets (and
# the library they need) and runs them through ctest.
set -eu

src=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$src/build-tsan}
if [ -z "${CC:-}" ]; then
	if command -v clang-19 >/dev/null 2>&1; then CC=clang-19; else CC=cc; fi
fi

# Warnings are the normal build's business (clang flags bison's output).
cmake -S "$src" -B "$bdir" -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DMOEC_TSAN=ON -DMOEC_WERROR=OFF
cmake --build "$bdir" -j"${JOBS:-2}" --target test_threads test_host_par test_expert_parallel
cd "$bdir"
ctest --output-on-failure -R '^unit\.test_(threads|host_par|expert_parallel)$'
