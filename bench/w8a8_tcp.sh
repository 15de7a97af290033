#!/usr/bin/env bash
# Simulated TCP time (`moec run --target=tcp --timing-only`) of the real-size Qwen3-30B-A3B
# layer (E 128, D 2048, F 768, K 8) at T tokens (default 512) with W8A8 int8 experts
# (compressed-tensors int-quantized: int8 weights with one scale per output channel, int8
# activations quantized per token; on TCP i8 x i8 contractions at the i8 MAC rate) against
# the bf16 layer (examples/qwen3_30b_a3b.moe). The checkpoint holds only the router
# (bench/make_checkpoint.py --no-experts): timing-only runs bind the experts without values.
# Prints one markdown row per layer: experts' format, HBM bytes read, simulated time, ratio
# to the bf16 layer, and the expert phase's time.
# usage: bench/w8a8_tcp.sh [T] [OUT.json]   MOEC=path/to/moec (default build/moec)
# MOEC_BEFORE=path/to/another/moec adds that build's rows (bf16 and W8A8, "before"), each
# ratio taken to the bf16 layer of its own build, so one run shows a change's effect.
set -euo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
PY=/usr/bin/python3
T=${1:-512}
C=${MOEC_BENCH_CACHE:-bench/.cache}
Q=$C/w8a8_tcp
mkdir -p "$Q"
ck=$C/qwen3_30b_a3b.routing.bf16.safetensors
[ -f "$ck" ] || { $PY bench/make_checkpoint.py qwen3_30b_a3b "$ck.tmp" --no-experts && mv "$ck.tmp" "$ck"; }
x=$Q/x_D2048_T$T.npy
[ -f "$x" ] || $PY -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).standard_normal((int(sys.argv[2]), 2048), dtype=np.float32))" "$x" "$T"
cat >"$Q/w8a8.moe" <<EOF2
layer qwen3_30b_a3b_w8a8 {
  dim T = $T, D = 2048, F = 768, E = 128, K = 8, B = 64
  param layer = 0
  dtype bf16
  input  x : [T, D]
  weight router : [E, D] = "model.layers.{layer}.mlp.gate.weight"
  weight gate_q : u8[E, F, D] = "experts.{e}.gate_proj.weight"
  weight gate_s : f32[E, F, 1] = "experts.{e}.gate_proj.weight_scale"
  weight up_q : u8[E, F, D] = "experts.{e}.up_proj.weight"
  weight up_s : f32[E, F, 1] = "experts.{e}.up_proj.weight_scale"
  weight down_q : u8[E, D, F] = "experts.{e}.down_proj.weight"
  weight down_s : f32[E, D, 1] = "experts.{e}.down_proj.weight_scale"
  gate = dequant(gate_q, gate_s, format="int8", block=[1, D], act="int8", to=dtype)
  up = dequant(up_q, up_s, format="int8", block=[1, D], act="int8", to=dtype)
  down = dequant(down_q, down_s, format="int8", block=[1, F], act="int8", to=dtype)
  logits = einsum("td,ed->te", x, router)
  p      = softmax(cast(logits, f32), axis=1)
  idx    = topk(p, K)
  top    = take_along(p, idx, axis=1)
  w      = top / reduce_sum(top, axis=1, keepdims=1)
  y      = experts(x, idx, cast(w, dtype), gate=gate, up=up, down=down, act="swiglu", block=B)
  output y
}
EOF2
run() { # run NAME MOE [MOEC] [OPTION]
	"${3:-$MOEC}" run "$2" --target=tcp --set T="$T" --weights "$ck" --input "$x" --timing-only \
		--stats "$Q/$1.json" ${4:+"$4"} 2>"$Q/$1.err" || { echo "bench/w8a8_tcp.sh: $1 failed:" >&2; cat "$Q/$1.err" >&2; exit 1; }
}
if [ -n "${MOEC_BEFORE:-}" ]; then
	run bf16.before examples/qwen3_30b_a3b.moe "$MOEC_BEFORE"
	run w8a8.before "$Q/w8a8.moe" "$MOEC_BEFORE"
fi
run bf16 examples/qwen3_30b_a3b.moe
run w8a8 "$Q/w8a8.moe"
"$PY" - "$Q" "$T" "${2:-}" "${MOEC_BEFORE:+1}" <<'EOF2'
import json, sys
q, T, out, before = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [("bf16", "bf16 (bf16 x bf16)"), ("w8a8", "W8A8 int8 (i8 x i8, per-token activations)")]
if before:
    rows = [("bf16.before", "bf16, before"), ("w8a8.before", "W8A8 int8, before")] + rows
st = {k: json.load(open("%s/%s.json" % (q, k))) for k, _ in rows}
print("Qwen3-30B-A3B layer, T = %s, moec run --target=tcp --timing-only" % T)
print("| experts | HBM bytes read | simulated time (us) | vs bf16 |")
print("|---|---|---|---|")
for k, name in rows:
    s = st[k]
    base = st["bf16." + k.split(".", 1)[1] if "." in k else "bf16"]["simulated_seconds"]
    print("| %s | %.1f MB | %.1f | %.3fx |" % (name, s["hbm_read_bytes"] / 1e6, s["simulated_seconds"] * 1e6,
                                           s["simulated_seconds"] / base))
if out:
    json.dump({k: st[k] for k, _ in rows}, open(out, "w"), indent=1)
EOF2
