#!/bin/sh
# bench/ep_tcp.sh: the DeepSeek-V3 layer (examples/deepseek_v3.moe, B = 64) on 1, 2, 4 and 8
# simulated TCP chips at T = 1, 64 and 4096, timing-only on a checkpoint without the routed
# experts' weights (bench/make_checkpoint.py deepseek_v3 --no-experts). One chip runs the
# layer's own program (--set B=64); N chips run the expert-parallel programs
# (moec run --target=tcp --ep N, docs/expert-parallel.md section 6).
#
# usage: bench/ep_tcp.sh [MOEC] [CACHE_DIR] [TOKENS] [CHIPS]   (defaults: build/moec, bench/.cache/ep,
#        "1 64 4096", "1 2 4 8"); chips 1 is the one-chip program
#        bench/ep_tcp.sh --table [CACHE_DIR] [TOKENS] [CHIPS]    only print the tables of earlier runs
# Each run leaves CACHE_DIR/ep{N}.T{T}.json (--stats) and .wall (seconds on this host), so
# subsets can run separately (or side by side) and --table prints them together:
#   1. per T and N: simulated time, compute and link parts, link bytes (the busiest chip's
#      out + in), speed-up over one chip, the receive buffer per chip against its tight bound;
#   2. per exchange round (0: dispatch, 1: return): measured end to end along the critical path
#      (what packing adds to the critical path of the phase on the chip that ends it last + link +
#      the most unpacking adds to the next phase's critical path on any chip; unpack's summed
#      durations in brackets) against the bound (latency + bytes / bandwidth per all_to_all on the
#      busiest chip), and the longest wait.
set -eu
table_only=0
if [ "${1:-}" = "--table" ]; then table_only=1; shift; set -- build/moec "$@"; fi
moec=${1:-build/moec}
cache=${2:-bench/.cache/ep}
tokens=${3:-1 64 4096}
chips=${4:-1 2 4 8}
py=/usr/bin/python3
mkdir -p "$cache"
ck=$cache/deepseek_v3.routing.bf16.safetensors
if [ $table_only = 0 ]; then
	[ -f "$ck" ] || $py bench/make_checkpoint.py deepseek_v3 "$ck" --no-experts
	for T in $tokens; do
		x=$cache/x_D7168_T$T.npy
		[ -f "$x" ] || $py -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).standard_normal(($T, 7168), dtype=np.float32))" "$x"
		for N in $chips; do
			s=$cache/ep$N.T$T.json
			t0=$(date +%s)
			if [ "$N" = 1 ]; then
				"$moec" run examples/deepseek_v3.moe --target=tcp --set T="$T" --set B=64 --weights "$ck" --input "$x" \
					--timing-only --stats "$s"
			else
				"$moec" run examples/deepseek_v3.moe --target=tcp --ep "$N" --set T="$T" --weights "$ck" --input "$x" \
					--timing-only --stats "$s"
				q=$((T / N)); td=$((T - q * (N - 1))); [ "$td" -ge 1 ] || td=1
				"$moec" ir examples/deepseek_v3.moe --set T=$td \
					--pipeline="infer-shapes,lower-topk,expert-parallel{ep=$N,rank=$((N - 1)),tokens=$T}" |
					sed -n 's/.*ep_recv_rows_max=\([0-9]*\).*/\1/p' >"$cache/ep$N.T$T.rows"
			fi
			echo $(( $(date +%s) - t0 )) >"$cache/ep$N.T$T.wall"
		done
	done
fi
$py - "$cache" "$tokens" "$chips" <<'PY'
import json, os, sys
cache, tokens, chips = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def load(N, T):
    p = os.path.join(cache, "ep%s.T%s" % (N, T))
    if not os.path.exists(p + ".json"):
        return None
    s = json.load(open(p + ".json"))
    s["wall"] = open(p + ".wall").read().strip() if os.path.exists(p + ".wall") else "?"
    s["rows"] = open(p + ".rows").read().strip() if os.path.exists(p + ".rows") else None
    return s
print("| T | chips | simulated | compute | link | link bytes (busiest chip, out + in) | speed-up | receive buffer per chip: rows (tight bound T K) | wall |")
print("|---|---|---|---|---|---|---|---|---|")
for T in tokens:
    one = load(1, T)
    for N in chips:
        s = load(N, T)
        if s is None:
            print("| %s | %s | not run | | | | | | |" % (T, N))
            continue
        sp = "%.2f" % (one["simulated_seconds"] / s["simulated_seconds"]) if one else "-"
        if N == "1":
            print("| %s | 1 | %.3f ms | %.3f ms | - | - | %s | %d (T K) | %s s |" % (T, s["simulated_seconds"] * 1e3,
                  s["simulated_seconds"] * 1e3, sp, int(T) * 8, s["wall"]))
            continue
        busy = max(c["link_bytes_out"] + c["link_bytes_in"] for c in s["chips"])
        print("| %s | %d | %.3f ms | %.3f ms | %.3f ms | %.2f MB | %s | %s (%d) | %s s |" % (T, s["ep"],
              s["simulated_seconds"] * 1e3, s["compute_seconds"] * 1e3, s["link_seconds"] * 1e3, busy / 1e6, sp,
              s["rows"], int(T) * 8, s["wall"]))
print()
print("| T | chips | round | bytes out / in (busiest chip) | bound = link | pack (chip; span) | unpack (summed) | measured | measured / bound | longest wait |")
print("|---|---|---|---|---|---|---|---|---|---|")
for T in tokens:
    for N in chips:
        s = load(N, T)
        if N == "1" or s is None:
            continue
        for r in s.get("rounds", []):
            print("| %s | %s | %d | %.3f / %.3f MB | %.1f us | %.1f us (%d; %.1f us) | %.1f us (%.1f us) | %.1f us | %.3f | %.1f us |" % (
                T, N, r["round"], r["bytes_out"] / 1e6, r["bytes_in"] / 1e6, r["bound_seconds"] * 1e6,
                r["pack_seconds"] * 1e6, r["chip"], r["pack_span_seconds"] * 1e6, r["unpack_seconds"] * 1e6,
                r.get("unpack_sum_seconds", r["unpack_seconds"]) * 1e6, r["seconds"] * 1e6,
                r["seconds"] / r["bound_seconds"], r["wait_seconds"] * 1e6))
PY
