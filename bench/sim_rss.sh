#!/usr/bin/env bash
# The simulator's peak memory (/usr/bin/time -v). Two modes:
#
# bench/sim_rss.sh [T ...] (default 1): the real-size Qwen3-30B-A3B layer
# (examples/qwen3_30b_a3b.moe, bf16, the synthetic 1.2 GB checkpoint of bench/make_checkpoint.py
# in bench/.cache) run with its weights:
# - on the TCP simulator at each T given (a full run): peak RSS and wall time, the checkpoint's size for
#   the RSS limit (1.5x), and whether y.npy equals the run of MOEC_EAGER=path/to/an/older/moec
#   (whose peak RSS is shown beside; else skipped);
# - on the host (default engine) twice with an empty packed-weight cache: pack_seconds,
#   pack_cache and load_seconds of --stats on the first run and the cached one.
#
# bench/sim_rss.sh --timing-only [T ...] (default 4096): `moec run --target=tcp --timing-only`
# of DeepSeek-V3 and Qwen3-30B-A3B on the routing-only checkpoints (bench/run's, made when
# missing): peak RSS and wall time; with MOEC_BEFORE=path/to/an/older/moec
# also its peak RSS in the same run, and whether every figure of --stats but load_seconds and
# peak_rss_bytes is the same.
#
# Prints markdown rows; MOEC=path/to/moec.
set -euo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
PY=/usr/bin/python3
C=bench/.cache
mkdir -p "$C"
secs() { awk -F': ' '/Elapsed/ {n = split($2, p, ":"); print p[n] + (n > 1 ? 60 * p[n - 1] : 0)}' "$1"; }
rss() { awk -F': ' '/Maximum resident/ {printf "%.0f\n", $2 * 1024}' "$1"; }
if [ "${1:-}" = --timing-only ]; then
	shift
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# the simulated figures of --stats: all but the host's load time and memory
	sim_stats() { $PY -c 'import json, sys; s = json.load(open(sys.argv[1])); [s.pop(k, None) for k in ("load_seconds", "peak_rss_bytes")]; print(json.dumps(s, sort_keys=True))' "$1"; }
	echo "| layer | T | peak RSS (bytes) | wall (s) | MOEC_BEFORE peak RSS (bytes) | after / before | stats |"
	echo "|---|---:|---:|---:|---:|---:|---|"
	for m in deepseek_v3 qwen3_30b_a3b; do
		ck=$C/$m.routing.bf16.safetensors
		[ -f "$ck" ] || $PY bench/make_checkpoint.py "$m" "$ck" --no-experts >/dev/null
		D=$("$MOEC" stats "examples/$m.moe" --json | $PY -c 'import json, sys; print(json.load(sys.stdin)["dims"]["D"])')
		for T in "${@:-4096}"; do
			x=$C/x_D${D}_T$T.npy
			[ -f "$x" ] || $PY -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).standard_normal(($T, $D), dtype=np.float32))" "$x"
			for side in after ${MOEC_BEFORE:+before}; do
				bin=$MOEC
				[ $side = before ] && bin=$MOEC_BEFORE
				/usr/bin/time -v "$bin" run "examples/$m.moe" --target=tcp --set T="$T" --weights "$ck" \
					--input "$x" --timing-only --stats "$tmp/$side.json" 2>"$tmp/$side.time" >/dev/null
			done
			r=$(rss "$tmp/after.time")
			rb=- ratio=- same=-
			if [ -n "${MOEC_BEFORE:-}" ]; then
				rb=$(rss "$tmp/before.time")
				ratio=$(awk "BEGIN {printf \"%.3f\", $r / $rb}")
				[ "$(sim_stats "$tmp/after.json")" = "$(sim_stats "$tmp/before.json")" ] && same=identical || same=DIFFERENT
			fi
			echo "| $m | $T | $r | $(secs "$tmp/after.time") | $rb | $ratio | $same |"
		done
	done
	exit 0
fi
W="$C/qwen3_30b_a3b.bf16.safetensors"
[ -f "$W" ] || { $PY bench/make_checkpoint.py qwen3_30b_a3b "$C/q.tmp" --dtype bf16 && mv "$C/q.tmp" "$W"; }
size=$(stat -L -c %s "$W")
echo "checkpoint: $size bytes; RSS limit (1.5x): $((size * 3 / 2)) bytes"
echo
echo "| T | target | peak RSS (bytes) | RSS / checkpoint | wall (s) | MOEC_EAGER peak RSS (bytes) | output |"
echo "|---|---|---|---|---|---|---|"
for T in "${@:-1}"; do
	x="$C/xs_T$T.npy"
	$PY -c "import numpy as np; np.save('$x', np.random.default_rng(1).standard_normal(($T, 2048)).astype(np.float32))"
	/usr/bin/time -v "$MOEC" run examples/qwen3_30b_a3b.moe --target=tcp --set T=$T --weights "$W" --input "$x" \
		-o "$C/ys_tcp.npy" 2>"$C/time.txt" >/dev/null
	r=$(rss "$C/time.txt")
	same=unchecked re=-
	if [ -n "${MOEC_EAGER:-}" ]; then
		/usr/bin/time -v "$MOEC_EAGER" run examples/qwen3_30b_a3b.moe --target=tcp --set T=$T --weights "$W" --input "$x" \
			-o "$C/ys_eager.npy" 2>"$C/time_eager.txt" >/dev/null
		re=$(rss "$C/time_eager.txt")
		cmp -s "$C/ys_tcp.npy" "$C/ys_eager.npy" && same="identical to MOEC_EAGER" || same=DIFFERENT
	fi
	echo "| $T | tcp | $r | $(awk "BEGIN {printf \"%.2f\", $r / $size}") | $(secs "$C/time.txt") | $re | $same |"
done
echo
echo "| host run | pack_cache | pack_seconds | load_seconds | wall (s) |"
echo "|---|---|---|---|---|"
rm -rf "$C/pack_cache_xdg"
mkdir -p "$C/pack_cache_xdg"
x="$C/xs_T1.npy"
[ -f "$x" ] || $PY -c "import numpy as np; np.save('$x', np.random.default_rng(1).standard_normal((1, 2048)).astype(np.float32))"
for run in first cached; do
	XDG_CACHE_HOME="$PWD/$C/pack_cache_xdg" /usr/bin/time -v "$MOEC" run examples/qwen3_30b_a3b.moe --set T=1 \
		--weights "$W" --input "$x" -o "$C/ys_host_$run.npy" --stats "$C/s_host_$run.json" 2>"$C/time.txt" >/dev/null
	$PY - "$C/s_host_$run.json" "$run" "$(secs "$C/time.txt")" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("| %s | %s | %.3f | %.3f | %s |" % (sys.argv[2], s["pack_cache"], s["pack_seconds"], s["load_seconds"], sys.argv[3]))
PY
done
cmp "$C/ys_host_first.npy" "$C/ys_host_cached.npy" && echo && echo "host outputs of the two runs identical"
