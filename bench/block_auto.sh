#!/usr/bin/env bash
# block=auto of two builds side by side in one run: the B each picks and the simulated time
# of one timing-only run (`moec run --target=tcp --timing-only`, schedule compiler) of the four
# bench layers and DeepSeek-V3 block FP8 with --quant-act=fp8, on bench/run's cached
# routing-only checkpoints and inputs (MOEC_BENCH_CACHE, default bench/.cache).
#   bash bench/block_auto.sh OLD_MOEC NEW_MOEC [T ...]     (default T: 1 64 512 4096;
#                                                            FP8: T in {1, 512, 4096} of those)
# Prints a markdown table: layer, T, B and microseconds of each build.
set -uo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2
shift 2
PY=${PY:-/usr/bin/python3}
CACHE=${MOEC_BENCH_CACHE:-bench/.cache}
TS=${*:-1 64 512 4096}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# the simulated microseconds of run stats $1, or tcp_block's B of `moec stats --json` output $1
get() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.1f" % (d["simulated_seconds"]*1e6) if sys.argv[2]=="t" else d.get("tcp_block",{}).get("B","-"))' "$1" "$2" 2>/dev/null || echo -; }
echo "| layer | T | B old | us old | B new | us new | new / old |"
echo "|---|---:|---:|---:|---:|---:|---:|"
row() { # name moe ckpt D T extra...
	local name=$1 moe=$2 ck=$3 D=$4 T=$5
	shift 5
	for b in old new; do
		bin=$OLD
		[ $b = new ] && bin=$NEW
		"$bin" run "$moe" --target=tcp --set T="$T" --weights "$ck" --input "$CACHE/x_D${D}_T$T.npy" "$@" \
			--timing-only --stats "$out/$b.json" >/dev/null 2>"$out/$b.err" || rm -f "$out/$b.json"
		"$bin" stats "$moe" --target=tcp --set T="$T" "$@" --json >"$out/$b.st.json" 2>/dev/null
	done
	local bo to bn tn r=-
	bo=$(get "$out/old.st.json" B) to=$(get "$out/old.json" t) bn=$(get "$out/new.st.json" B) tn=$(get "$out/new.json" t)
	[ "$to" != - ] && [ "$tn" != - ] && r=$("$PY" -c "print('%.3f' % ($tn / $to))")
	echo "| $name | $T | $bo | $to | $bn | $tn | $r |"
}
for m in mixtral_8x7b:4096 qwen3_30b_a3b:2048 deepseek_v3:7168 gpt_oss_20b:2880; do
	for T in $TS; do
		row "${m%%:*}" "examples/${m%%:*}.moe" "$CACHE/${m%%:*}.routing.bf16.safetensors" "${m#*:}" "$T"
	done
done
for T in $TS; do
	[ "$T" = 64 ] && continue
	row deepseek_v3_fp8 "$CACHE/deepseek_v3_fp8.moe" "$CACHE/deepseek_v3.routing.fp8.safetensors" 7168 "$T" --quant-act=fp8
done
