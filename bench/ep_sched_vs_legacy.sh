#!/usr/bin/env bash
# Expert parallelism on the schedule compiler against the legacy emitter: simulated time of
# one timing-only `moec run --ep N` each (both emitters back to back), and round 0's
# unpack (what reading the received rows adds to the experts phase's critical path), on
# the routing-only checkpoints bench/sched_vs_legacy.sh caches (run it once first).
#   bash bench/ep_sched_vs_legacy.sh
set -uo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
PY=${PY:-/usr/bin/python3}
CACHE=bench/.cache
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| layer | T | chips | legacy (us) | sched (us) | legacy unpack (us) | sched unpack (us) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for m in mixtral_8x7b qwen3_30b_a3b; do
	D=$("$MOEC" stats "examples/$m.moe" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["dims"]["D"])')
	for T in 64 512; do
		for N in 2 4; do
			for e in legacy sched; do
				"$MOEC" run "examples/$m.moe" --target=tcp --tcp-emitter=$e --set T="$T" \
					--weights "$CACHE/$m.routing.bf16.safetensors" --input "$CACHE/x_D${D}_T$T.npy" --ep "$N" \
					--timing-only --stats "$out/$e.json" 2>"$out/$e.err" >/dev/null || rm -f "$out/$e.json"
			done
			"$PY" - "$out" "$m" "$T" "$N" <<'PY'
import json, os, sys
d, m, T, N = sys.argv[1:]
cols = []
for e in ("legacy", "sched"):
    p = os.path.join(d, e + ".json")
    if not os.path.exists(p):
        cols.append(("fault" if os.path.getsize(os.path.join(d, e + ".err")) else "-", "-"))
        continue
    s = json.load(open(p))
    cols.append(("%.1f" % (s["simulated_seconds"] * 1e6), "%.2f" % (s["rounds"][0]["unpack_seconds"] * 1e6)))
print("| %s | %s | %s | %s | %s | %s | %s |" % (m, T, N, cols[0][0], cols[1][0], cols[0][1], cols[1][1]))
PY
		done
	done
done
