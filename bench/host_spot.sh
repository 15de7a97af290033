#!/usr/bin/env bash
# bench/host_spot.sh: a short side-by-side check of section 1 of bench/REPORT.md (issue 17,
# must-shows 1 and 2) without the whole of bench/run: moec --target=host and bench/torch_moe.py
# on the Qwen3-30B-A3B layer, the same thread count on both sides, alternating (the order
# flips every round), then the two bandwidth probes of bench/run. Prints per round the two
# medians and their ratio, then per (dtype, T) the median ratio over rounds, and the load
# average before and after. Needs bench/run's cache (checkpoints, inputs): bench/.cache, or MOEC_BENCH_CACHE.
#   bench/host_spot.sh [ROUNDS] [DTYPES] [TOKENS]     e.g. bench/host_spot.sh 3 "bf16 f32" "1 32 512"
# MOEC_BENCH_THREADS sets the threads (default nproc), MOEC (default build/moec) the binary.
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
DTYPES=${2:-bf16}
TOKENS=${3:-1 32 512}
TH=${MOEC_BENCH_THREADS:-$(nproc)}
MOEC=${MOEC:-build/moec}
PY=${PYTHON:-/usr/bin/python3}
C=${MOEC_BENCH_CACHE:-bench/.cache}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMP_NUM_THREADS=$TH XDG_CACHE_HOME=$OUT/jit
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)  threads $TH  commit $(git rev-parse --short HEAD)  $(date -u +%FT%TZ)"
cc -std=c11 -O3 -march=native -pthread -o "$OUT/stream" bench/stream.c
for dt in $DTYPES; do
	for T in $TOKENS; do
		R=3
		[ "$T" = 1 ] && R=7
		for r in $(seq 1 "$ROUNDS"); do
			m() {
				"$MOEC" run examples/qwen3_30b_a3b.moe --target=host --set T="$T" --threads "$TH" --set dtype="$dt" \
					--weights "$C/qwen3_30b_a3b.$dt.safetensors" --input "$C/x_T$T.npy" -o "$OUT/y.npy" \
					--stats "$OUT/m.json" --repeat "$R" >/dev/null
			}
			t() {
				"$PY" bench/torch_moe.py --weights "$C/qwen3_30b_a3b.$dt.safetensors" --dtype "$dt" --threads "$TH" \
					--input "$C/x_T$T.npy" --output "$OUT/t.npy" --repeat "$R" --warmup 0 --json "$OUT/t.json" >/dev/null
			}
			if [ $((r % 2)) = 1 ]; then m && t; else t && m; fi
			"$PY" - "$dt" "$T" "$r" "$OUT" <<'PY'
import json, sys
dt, T, r, out = sys.argv[1:]
m = json.load(open(out + "/m.json"))["compute_seconds"]
t = json.load(open(out + "/t.json"))
t = t["compute_seconds"]
print(f"{dt} T={T} round {r}: moec {m * 1e3:.1f} ms  torch {t * 1e3:.1f} ms  ratio {t / m:.2f}x  load {open('/proc/loadavg').read().split()[0]}")
with open(out + "/ratios.txt", "a") as f:
    f.write(f"{dt} {T} {t / m} {m} {t}\n")
PY
		done
	done
done
"$PY" - "$OUT" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1] + "/ratios.txt"):
    dt, T, q, m, t = line.split()
    rows.setdefault((dt, int(T)), []).append((float(q), float(m), float(t)))
for (dt, T), v in rows.items():
    q = sorted(x[0] for x in v)
    print(f"{dt} T={T}: median ratio {statistics.median(q):.2f}x (range {q[0]:.2f}-{q[-1]:.2f}), moec median "
          f"{statistics.median(x[1] for x in v) * 1e3:.1f} ms, torch median {statistics.median(x[2] for x in v) * 1e3:.1f} ms")
PY
echo "probe 256 MiB: $("$OUT/stream" 256 5 "$TH")"
echo "probe T=1 set (73 MiB, read only): $("$OUT/stream" 73 10 "$TH" read)"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
