#!/usr/bin/env bash
# Simulated TCP decode time (T=1, `moec run --target=tcp --timing-only`) of the real-size
# Qwen3-30B-A3B layer (E 128, D 2048, F 768, K 8) with its experts in each quantized format,
# against the bf16 layer (examples/qwen3_30b_a3b.moe). The block-FP8 layer is
# bench/qwen3_30b_a3b_fp8.moe (Qwen3-30B-A3B-FP8's layout), run weight-only (--quant-act=bf16,
# dequantized in DM) and with fp8 activations (--quant-act=fp8); the per-channel FP8, MXFP4
# (gpt-oss layout) and INT4 (compressed-tensors groups of 32) layers are the same block with
# those weight declarations, written into the cache. The checkpoint holds only the router
# (bench/make_checkpoint.py --no-experts): timing-only runs bind the experts without values.
# Prints one markdown row per layer: format, experts' bytes read (quantized values and
# scales), simulated time, its ratio to the bf16 layer, and the roofline ratio.
# usage: bench/quant_tcp.sh [OUT.json]   MOEC=path/to/moec (default build/moec)
set -euo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
PY=/usr/bin/python3
C=${MOEC_BENCH_CACHE:-bench/.cache}
Q=$C/quant_tcp
mkdir -p "$Q"
ck=$C/qwen3_30b_a3b.routing.bf16.safetensors
[ -f "$ck" ] || { $PY bench/make_checkpoint.py qwen3_30b_a3b "$ck.tmp" --no-experts && mv "$ck.tmp" "$ck"; }
x=$C/x_D2048_T1.npy
[ -f "$x" ] || $PY -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).standard_normal((1, 2048), dtype=np.float32))" "$x"

# layer NAME WEIGHT-DECLARATIONS: the Qwen3-30B-A3B block over quantized gate/up/down
layer() {
	cat >"$Q/$1.moe" <<EOF
layer qwen3_30b_a3b_$1 {
  dim T = 1, D = 2048, F = 768, E = 128, K = 8, B = 64
  param layer = 0
  dtype bf16
  input  x : [T, D]
  weight router : [E, D] = "model.layers.{layer}.mlp.gate.weight"
$2
  logits = einsum("td,ed->te", x, router)
  p      = softmax(cast(logits, f32), axis=1)
  idx    = topk(p, K)
  top    = take_along(p, idx, axis=1)
  w      = top / reduce_sum(top, axis=1, keepdims=1)
  y      = experts(x, idx, cast(w, dtype), gate=gate, up=up, down=down, act="swiglu", block=B)
  output y
}
EOF
}
# per-channel FP8 (compressed-tensors float-quantized): one f32 scale per output row
layer fp8ch '  weight gate_q : f8e4m3[E, F, D] = "experts.{e}.gate_proj.weight"
  weight gate_s : f32[E, F, 1] = "experts.{e}.gate_proj.weight_scale"
  weight up_q : f8e4m3[E, F, D] = "experts.{e}.up_proj.weight"
  weight up_s : f32[E, F, 1] = "experts.{e}.up_proj.weight_scale"
  weight down_q : f8e4m3[E, D, F] = "experts.{e}.down_proj.weight"
  weight down_s : f32[E, D, 1] = "experts.{e}.down_proj.weight_scale"
  gate = dequant(gate_q, gate_s, format="fp8", block=[1, D], to=dtype)
  up = dequant(up_q, up_s, format="fp8", block=[1, D], to=dtype)
  down = dequant(down_q, down_s, format="fp8", block=[1, F], to=dtype)'
# MXFP4 (gpt-oss): two E2M1 values per byte, one E8M0 scale byte per 32
layer mxfp4 '  weight gate_q : u8[E, F, D / 2] = "experts.{e}.gate_proj_blocks"
  weight gate_s : u8[E, F, D / 32] = "experts.{e}.gate_proj_scales"
  weight up_q : u8[E, F, D / 2] = "experts.{e}.up_proj_blocks"
  weight up_s : u8[E, F, D / 32] = "experts.{e}.up_proj_scales"
  weight down_q : u8[E, D, F / 2] = "experts.{e}.down_proj_blocks"
  weight down_s : u8[E, D, F / 32] = "experts.{e}.down_proj_scales"
  gate = dequant(gate_q, gate_s, format="mxfp4", block=[1, 32], to=dtype)
  up = dequant(up_q, up_s, format="mxfp4", block=[1, 32], to=dtype)
  down = dequant(down_q, down_s, format="mxfp4", block=[1, 32], to=dtype)'
# INT4 (compressed-tensors pack-quantized, Kimi-K2-Thinking): 8 values per i32, bf16 scale per 32
layer int4 '  weight gate_q : i32[E, F, D / 8] = "experts.{e}.gate_proj.weight_packed"
  weight gate_s : bf16[E, F, D / 32] = "experts.{e}.gate_proj.weight_scale"
  weight up_q : i32[E, F, D / 8] = "experts.{e}.up_proj.weight_packed"
  weight up_s : bf16[E, F, D / 32] = "experts.{e}.up_proj.weight_scale"
  weight down_q : i32[E, D, F / 8] = "experts.{e}.down_proj.weight_packed"
  weight down_s : bf16[E, D, F / 32] = "experts.{e}.down_proj.weight_scale"
  gate = dequant(gate_q, gate_s, format="int4", block=[1, 32], to=dtype)
  up = dequant(up_q, up_s, format="int4", block=[1, 32], to=dtype)
  down = dequant(down_q, down_s, format="int4", block=[1, 32], to=dtype)'

run() { # run NAME MOE [extra options]
	local name=$1 moe=$2
	shift 2
	"$MOEC" run "$moe" --target=tcp --set T=1 --weights "$ck" --input "$x" --timing-only \
		--stats "$Q/$name.json" "$@" 2>"$Q/$name.err" || { echo "bench/quant_tcp.sh: $name failed:" >&2; cat "$Q/$name.err" >&2; exit 1; }
}
run bf16 examples/qwen3_30b_a3b.moe
run fp8_block_w bench/qwen3_30b_a3b_fp8.moe --quant-act=bf16
run fp8_block_a bench/qwen3_30b_a3b_fp8.moe --quant-act=fp8
run fp8_channel "$Q/fp8ch.moe"
run mxfp4 "$Q/mxfp4.moe"
run int4 "$Q/int4.moe"
"$PY" - "$Q" "${1:-}" <<'EOF'
import json, sys
q, out = sys.argv[1], sys.argv[2]
rows = [("bf16", "bf16 (no quantization)"), ("fp8_block_w", "block FP8 128x128, act=bf16 (dequantized in DM)"),
        ("fp8_block_a", "block FP8 128x128, act=fp8 (fp8 x fp8, DeepSeek scaling)"),
        ("fp8_channel", "per-channel FP8, act=bf16"), ("mxfp4", "MXFP4 (E2M1 via the fetch table), act=bf16"),
        ("int4", "INT4 groups of 32 (i4 fetch), act=bf16")]
st = {k: json.load(open("%s/%s.json" % (q, k))) for k, _ in rows}
base = st["bf16"]["simulated_seconds"]
print("| experts | HBM bytes read | simulated time (us) | vs bf16 | vs roofline |")
print("|---|---|---|---|---|")
for k, name in rows:
    s = st[k]
    print("| %s | %.1f MB | %.1f | %.2fx | %.2f |" % (name, s["hbm_read_bytes"] / 1e6, s["simulated_seconds"] * 1e6,
                                                  s["simulated_seconds"] / base, s["roofline_ratio"]))
if out:
    json.dump({k: st[k] for k, _ in rows}, open(out, "w"), indent=1)
EOF
