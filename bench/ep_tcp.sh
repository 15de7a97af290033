#!/bin/sh
# bench/ep_tcp.sh: the DeepSeek-V3 layer (examples/deepseek_v3.moe, B = 64) on 1, 2, 4 and 8
# simulated TCP chips at T = 1, 64 and 4096, timing-only on a checkpoint without the routed
# experts' weights (bench/make_checkpoint.py deepseek_v3 --no-experts). One chip runs the
# layer's own program (--set B=64); N chips run the expert-parallel programs
# (moec run --target=tcp --ep N, docs/expert-parallel.md). Prints a Markdown table: simulated
# time, compute and link parts, link bytes (the busiest chip's out + in), speed-up over one
# chip, and the receive buffer the pass allocates per chip against T * K rows.
#
# usage: bench/ep_tcp.sh [MOEC] [CACHE_DIR] [TOKENS] [CHIPS]   (defaults: build/moec, bench/.cache/ep, "1 64 4096", "2 4 8")
set -eu
moec=${1:-build/moec}
cache=${2:-bench/.cache/ep}
tokens=${3:-1 64 4096}
chips=${4:-2 4 8}
py=/usr/bin/python3
mkdir -p "$cache"
ck=$cache/deepseek_v3.routing.bf16.safetensors
[ -f "$ck" ] || $py bench/make_checkpoint.py deepseek_v3 "$ck" --no-experts
echo "| T | chips | simulated | compute | link | link bytes (busiest chip, out + in) | speed-up | receive buffer per chip (rows) | wall |"
echo "|---|---|---|---|---|---|---|---|---|"
for T in $tokens; do
	x=$cache/x_D7168_T$T.npy
	[ -f "$x" ] || $py -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).standard_normal(($T, 7168), dtype=np.float32))" "$x"
	s1=$cache/one.T$T.json
	t0=$(date +%s)
	"$moec" run examples/deepseek_v3.moe --target=tcp --set T="$T" --set B=64 --weights "$ck" --input "$x" \
		--timing-only --stats "$s1"
	w=$(( $(date +%s) - t0 ))
	$py -c "import json,sys; s=json.load(open(sys.argv[1])); print('| %s | 1 | %.3f ms | %.3f ms | - | - | 1.00 | %d (T K) | %s s |' % (sys.argv[2], s['simulated_seconds']*1e3, s['simulated_seconds']*1e3, int(sys.argv[2])*8, sys.argv[3]))" "$s1" "$T" "$w"
	for N in $chips; do
		sN=$cache/ep$N.T$T.json
		t0=$(date +%s)
		"$moec" run examples/deepseek_v3.moe --target=tcp --ep "$N" --set T="$T" --weights "$ck" --input "$x" \
			--timing-only --stats "$sN"
		w=$(( $(date +%s) - t0 ))
		q=$((T / N)); td=$((T - q * (N - 1))); [ "$td" -ge 1 ] || td=1
		rows=$("$moec" ir examples/deepseek_v3.moe --set T=$td \
			--pipeline="infer-shapes,lower-topk,expert-parallel{ep=$N,rank=$((N - 1)),tokens=$T}" |
			sed -n 's/.*ep_recv_rows_max=\([0-9]*\).*/\1/p')
		$py -c "
import json, sys
s = json.load(open(sys.argv[1])); one = json.load(open(sys.argv[2]))
busy = max(c['link_bytes_out'] + c['link_bytes_in'] for c in s['chips'])
print('| %s | %d | %.3f ms | %.3f ms | %.3f ms | %.2f MB | %.2f | %s (T K = %d) | %s s |' % (sys.argv[3], s['ep'],
      s['simulated_seconds']*1e3, s['compute_seconds']*1e3, s['link_seconds']*1e3, busy/1e6,
      one['simulated_seconds']/s['simulated_seconds'], sys.argv[4], int(sys.argv[3])*8, sys.argv[5]))
" "$sN" "$s1" "$T" "$rows" "$w"
	done
done
