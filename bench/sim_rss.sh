#!/usr/bin/env bash
# The real-size Qwen3-30B-A3B layer (examples/qwen3_30b_a3b.moe, bf16, the synthetic 1.2 GB
# checkpoint of bench/make_checkpoint.py in bench/.cache) run with its weights:
# - on the TCP simulator at each T given: peak RSS and wall time (/usr/bin/time -v), the
#   checkpoint's size for the RSS limit (1.5x), and whether y.npy equals the eager run's
#   (MOEC_EAGER=path/to/an/older/moec to compare against one; else skipped);
# - on the host (default engine) twice with an empty packed-weight cache: pack_seconds,
#   pack_cache and load_seconds of --stats on the first run and the cached one.
# Prints markdown rows. usage: bench/sim_rss.sh [T ...] (default 1); MOEC=path/to/moec
set -euo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
PY=/usr/bin/python3
C=bench/.cache
mkdir -p "$C"
W="$C/qwen3_30b_a3b.bf16.safetensors"
[ -f "$W" ] || { $PY bench/make_checkpoint.py qwen3_30b_a3b "$C/q.tmp" --dtype bf16 && mv "$C/q.tmp" "$W"; }
size=$(stat -L -c %s "$W")
secs() { awk -F': ' '/Elapsed/ {n = split($2, p, ":"); print p[n] + (n > 1 ? 60 * p[n - 1] : 0)}' "$1"; }
rss() { awk -F': ' '/Maximum resident/ {print $2 * 1024}' "$1"; }
echo "checkpoint: $size bytes; RSS limit (1.5x): $((size * 3 / 2)) bytes"
echo
echo "| T | target | peak RSS (bytes) | RSS / checkpoint | wall (s) | output |"
echo "|---|---|---|---|---|---|"
for T in "${@:-1}"; do
	x="$C/xs_T$T.npy"
	$PY -c "import numpy as np; np.save('$x', np.random.default_rng(1).standard_normal(($T, 2048)).astype(np.float32))"
	/usr/bin/time -v "$MOEC" run examples/qwen3_30b_a3b.moe --target=tcp --set T=$T --weights "$W" --input "$x" \
		-o "$C/ys_tcp.npy" 2>"$C/time.txt" >/dev/null
	r=$(rss "$C/time.txt")
	same=unchecked
	if [ -n "${MOEC_EAGER:-}" ]; then
		"$MOEC_EAGER" run examples/qwen3_30b_a3b.moe --target=tcp --set T=$T --weights "$W" --input "$x" \
			-o "$C/ys_eager.npy" 2>/dev/null
		cmp -s "$C/ys_tcp.npy" "$C/ys_eager.npy" && same="identical to MOEC_EAGER" || same=DIFFERENT
	fi
	echo "| $T | tcp | $r | $(awk "BEGIN {printf \"%.2f\", $r / $size}") | $(secs "$C/time.txt") | $same |"
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
