#!/usr/bin/env bash
# Two moec builds side by side on the four bench layers: simulated time of one timing-only
# run each (`moec run --target=tcp --timing-only`, block=auto, the routing-only checkpoints
# bench/run caches), with sim / floor for each, in one run. Extra moec options (a rewrite
# switched off, another machine) go in OPTS, for both sides or, with OPTS_AFTER, the new one.
#   MOEC_BEFORE=path/to/old/moec bash bench/sim_before_after.sh [T ...]   (default T: 1 64 512 4096)
#   OPTS_AFTER=--tcp-opt=-fold-copies bash bench/sim_before_after.sh 4096  (one build, two settings)
# MOEC (default build/moec) is the new side; MOEC_BEFORE defaults to MOEC. Prints a markdown
# table; a run that fails shows its first error line in a note.
set -uo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
BEFORE=${MOEC_BEFORE:-$MOEC}
PY=${PY:-/usr/bin/python3}
CACHE=bench/.cache
mkdir -p "$CACHE"
TS=${*:-1 64 512 4096}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
field() { "$PY" -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))[sys.argv[2]] * 1e6))' "$1" "$2" 2>/dev/null; }
echo "| layer | T | before (us) | after (us) | after / before | after / floor |"
echo "|---|---:|---:|---:|---:|---:|"
notes=""
for m in mixtral_8x7b qwen3_30b_a3b deepseek_v3 gpt_oss_20b; do
	ck=$CACHE/$m.routing.bf16.safetensors
	[ -f "$ck" ] || "$PY" bench/make_checkpoint.py "$m" "$ck" --no-experts >/dev/null || exit 1
	D=$("$MOEC" stats "examples/$m.moe" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["dims"]["D"])')
	for T in $TS; do
		x=$CACHE/x_D${D}_T$T.npy
		[ -f "$x" ] || "$PY" -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).standard_normal(($T, $D), dtype=np.float32))" "$x"
		# shellcheck disable=SC2086 # OPTS and OPTS_AFTER are word lists
		"$BEFORE" run "examples/$m.moe" --target=tcp --set T="$T" --weights "$ck" --input "$x" ${OPTS:-} \
			--timing-only --stats "$out/before.json" 2>"$out/before.err" >/dev/null || rm -f "$out/before.json"
		# shellcheck disable=SC2086
		"$MOEC" run "examples/$m.moe" --target=tcp --set T="$T" --weights "$ck" --input "$x" ${OPTS:-} ${OPTS_AFTER:-} \
			--timing-only --stats "$out/after.json" 2>"$out/after.err" >/dev/null || rm -f "$out/after.json"
		b=$(field "$out/before.json" simulated_seconds); a=$(field "$out/after.json" simulated_seconds)
		f=$(field "$out/after.json" floor_seconds)
		for e in before after; do
			[ -f "$out/$e.json" ] || notes+="- $m T=$T $e: $(grep -m1 error "$out/$e.err" | sed 's/.*error: //')"$'\n'
		done
		r=-; rf=-
		[ -n "$a" ] && [ -n "$b" ] && r=$("$PY" -c "print('%.3f' % ($a / $b))")
		[ -n "$a" ] && [ -n "$f" ] && rf=$("$PY" -c "print('%.3f' % ($a / $f) if $f > 0 else '-')")
		echo "| $m | $T | ${b:--} | ${a:--} | $r | $rf |"
	done
done
[ -z "$notes" ] || printf '\n%s' "$notes"
