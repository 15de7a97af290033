#!/usr/bin/env bash
# Peak host memory of the real-size Qwen3-30B-A3B layer (128 experts, D 2048, F 768) with
# bf16 experts (examples/qwen3_30b_a3b.moe) and with block-FP8 experts as Qwen3-30B-A3B-FP8
# stores them (bench/qwen3_30b_a3b_fp8.moe), from synthetic checkpoints written by
# bench/make_checkpoint.py into bench/.cache. Prints one markdown row per run:
# tokens, experts, peak RSS (/usr/bin/time -v), wall time.
# usage: bench/quant_rss.sh [T ...]   (default 1 512); MOEC=path/to/moec
set -euo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-build/moec}
PY=/usr/bin/python3
C=bench/.cache
mkdir -p "$C"
[ -f "$C/qwen3_30b_a3b.bf16.safetensors" ] || { $PY bench/make_checkpoint.py qwen3_30b_a3b "$C/q.tmp" --dtype bf16 &&
	mv "$C/q.tmp" "$C/qwen3_30b_a3b.bf16.safetensors"; }
[ -f "$C/qwen3_30b_a3b.fp8.safetensors" ] || { $PY bench/make_checkpoint.py qwen3_30b_a3b "$C/q.tmp" --fp8-block &&
	mv "$C/q.tmp" "$C/qwen3_30b_a3b.fp8.safetensors"; }
echo "| T | experts | peak RSS (MB) | wall (s) |"
echo "|---|---|---|---|"
for T in "${@:-1 512}"; do
	$PY -c "import numpy as np; np.save('$C/xq_T$T.npy', np.random.default_rng(1).standard_normal(($T, 2048)).astype(np.float32))"
	for v in bf16 fp8; do
		moe=examples/qwen3_30b_a3b.moe
		[ $v = fp8 ] && moe=bench/qwen3_30b_a3b_fp8.moe
		/usr/bin/time -v "$MOEC" run $moe --set T=$T --weights "$C/qwen3_30b_a3b.$v.safetensors" \
			--input "$C/xq_T$T.npy" -o "$C/yq.npy" 2>"$C/time.txt" >/dev/null
		rss=$(awk -F': ' '/Maximum resident/ {print int($2 / 1024)}' "$C/time.txt")
		wall=$(awk -F': ' '/Elapsed/ {n = split($2, p, ":"); print p[n] + (n > 1 ? 60 * p[n - 1] : 0)}' "$C/time.txt")
		echo "| $T | $v | $rss | $wall |"
	done
done
