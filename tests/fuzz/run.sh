#!/bin/sh
# tests/fuzz/run.sh: bounded fuzzing of moec's readers (CI and by hand).
#
#   tests/fuzz/run.sh [SECONDS] [NAME...]
#
# For each fuzzer NAME (default: every fuzz_* built): replay regress/NAME
# (every input ever found to crash, plus the hand-made hostile inputs), then
# fuzz for SECONDS (default 30) starting from corpus/NAME. New inputs go to
# $WORK/NAME (the seed corpus in git is only read); a crash leaves its input
# as $WORK/NAME.crash-* and the log as $WORK/NAME.log. Prints one line per
# fuzzer with its executed units; exits non-zero if any replay or run failed.
#
# Environment: BUILD (default build-fuzz: a -DMOEC_FUZZ=ON build),
# WORK (default $BUILD/fuzz-work).
set -u
here=$(cd "$(dirname "$0")" && pwd)
secs=${1:-30}
[ $# -gt 0 ] && shift
build=${BUILD:-build-fuzz}
work=${WORK:-$build/fuzz-work}
bin=$build/tests/fuzz
names="$*"
if [ -z "$names" ]; then
	for f in "$bin"/fuzz_*; do
		[ -x "$f" ] && names="$names ${f##*/fuzz_}"
	done
fi
[ -n "$names" ] || { echo "run.sh: no fuzz_* in $bin (configure with -DMOEC_FUZZ=ON)" >&2; exit 2; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
fail=0
for n in $names; do
	fz=$bin/fuzz_$n
	[ -x "$fz" ] || { echo "run.sh: $fz missing" >&2; fail=1; continue; }
	mkdir -p "$work/$n"
	log=$work/$n.log
	if [ -d "$here/regress/$n" ] && ! "$fz" -runs=0 "$here/regress/$n" >"$work/$n.replay.log" 2>&1; then
		echo "$n: REPLAY FAILED (see $work/$n.replay.log)"
		fail=1
		continue
	fi
	"$fz" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$work/$n." "$work/$n" "$here/corpus/$n" >"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	if [ $rc -eq 0 ]; then
		echo "$n: ok, ${execs:-?} executions in ${secs}s"
	else
		echo "$n: FAILED (exit $rc) after ${execs:-?} executions; see $log and $work/$n.crash-*"
		fail=1
	fi
done
exit $fail
