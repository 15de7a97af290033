#!/usr/bin/env bash
# The schedule compiler against the legacy emitter on the four bench layers: simulated
# time of one timing-only run each (`moec run --target=tcp --timing-only`, block=auto,
# the routing-only checkpoints bench/run caches), side by side in one run.
#   bash bench/sched_vs_legacy.sh [T ...]        (default T: 1 64 512 4096)
# Prints a markdown table; a run that fails shows its first error line in a note.
set -uo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
PY=${PY:-/usr/bin/python3}
CACHE=bench/.cache
mkdir -p "$CACHE"
TS=${*:-1 64 512 4096}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
secs() { "$PY" -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["simulated_seconds"] * 1e6))' "$1" 2>/dev/null; }
echo "| layer | T | legacy (us) | sched (us) | sched / legacy |"
echo "|---|---:|---:|---:|---:|"
notes=""
for m in mixtral_8x7b qwen3_30b_a3b deepseek_v3 gpt_oss_20b; do
	ck=$CACHE/$m.routing.bf16.safetensors
	[ -f "$ck" ] || "$PY" bench/make_checkpoint.py "$m" "$ck" --no-experts >/dev/null || exit 1
	D=$("$MOEC" stats "examples/$m.moe" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["dims"]["D"])')
	for T in $TS; do
		x=$CACHE/x_D${D}_T$T.npy
		[ -f "$x" ] || "$PY" -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).standard_normal(($T, $D), dtype=np.float32))" "$x"
		for e in legacy sched; do
			"$MOEC" run "examples/$m.moe" --target=tcp --tcp-emitter=$e --set T="$T" --weights "$ck" --input "$x" \
				--timing-only --stats "$out/$e.json" 2>"$out/$e.err" >/dev/null || rm -f "$out/$e.json"
		done
		l=$(secs "$out/legacy.json"); s=$(secs "$out/sched.json")
		for e in legacy sched; do
			[ -f "$out/$e.json" ] || notes+="- $m T=$T $e: $(grep -m1 error "$out/$e.err" | sed 's/.*error: //')"$'\n'
		done
		r=-
		[ -n "$l" ] && [ -n "$s" ] && r=$("$PY" -c "print('%.2f' % ($s / $l))")
		echo "| $m | $T | ${l:--} | ${s:--} | $r |"
	done
done
[ -z "$notes" ] || printf '\n%s' "$notes"
