#!/usr/bin/env bash
# Compares two moec builds on every example, HF fixture and quantized fixture:
# the IR after the host and tcp pipelines (T in {1, 5, 64}) byte for byte, and
# the .tcpb of every example and fixture (T in {1, 64}).
# Usage: tools/ir_identical.sh OLD_MOEC NEW_MOEC. Exit 1 on any difference.
set -uo pipefail
old=$1 new=$2
root=$(cd "$(dirname "$0")/.." && pwd)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
n=0 bad=0
layers=("$root"/examples/*.moe)
for cfg in "$root"/tests/fixtures/hf/*/config.json "$root"/tests/fixtures/quant/*/config.json; do
	d=$(basename "$(dirname "$cfg")")
	k=$(basename "$(dirname "$(dirname "$cfg")")")
	"$new" import-hf "$cfg" -o "$t/$k-$d.moe" 2>/dev/null && layers+=("$t/$k-$d.moe")
done
for f in "${layers[@]}"; do
	b=$(basename "$f" .moe)
	for T in 1 5 64; do
		for p in host tcp; do
			"$old" ir "$f" --set T=$T --pipeline=$p -o "$t/old.moeir" 2>"$t/old.err"; ro=$?
			"$new" ir "$f" --set T=$T --pipeline=$p -o "$t/new.moeir" 2>"$t/new.err"; rn=$?
			n=$((n + 1))
			if [ $ro != $rn ] || { [ $ro = 0 ] && ! cmp -s "$t/old.moeir" "$t/new.moeir"; }; then
				echo "DIFF ir $b T=$T $p (rc $ro/$rn)"; bad=$((bad + 1))
			fi
		done
	done
	for T in 1 64; do
		"$old" compile "$f" --set T=$T -o "$t/old.tcpb" 2>/dev/null; ro=$?
		"$new" compile "$f" --set T=$T -o "$t/new.tcpb" 2>/dev/null; rn=$?
		n=$((n + 1))
		if [ $ro != $rn ] || { [ $ro = 0 ] && ! cmp -s "$t/old.tcpb" "$t/new.tcpb"; }; then
			echo "DIFF tcpb $b T=$T (rc $ro/$rn)"; bad=$((bad + 1))
		fi
	done
done
echo "$n comparisons, $bad differ (${#layers[@]} layers)"
[ $bad = 0 ]
