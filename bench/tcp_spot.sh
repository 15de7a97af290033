#!/usr/bin/env bash
# bench/tcp_spot.sh: a quick TCP spot check (simulated, deterministic) of the four layers of bench/REPORT.md
# section 4: time, ratio to the roofline and routing share, T=1 and T=4096 for all four
# (DeepSeek-V3 at T=4096 takes 1 to 2 minutes on 2 shared cores). Needs bench/run's cache
# (M.routing.bf16.safetensors from bench/make_checkpoint.py --no-experts, x_D{D}_T{T}.npy inputs).
cd "$(dirname "$0")/.."
B=${MOEC_BENCH_CACHE:-bench/.cache}
run() { # layer D T
  build/moec run examples/$1.moe --target=tcp --set T=$3 --weights $B/$1.routing.bf16.safetensors --input $B/x_D$2_T$3.npy --timing-only --stats /tmp/tm.$1.$3.json 2>/dev/null
  python3 -c "
import json;d=json.load(open('/tmp/tm.$1.$3.json'))
print('$1 T=$3: %.1f us, roofline ratio %.3fx, routing share %.2f%%' % (d['simulated_seconds']*1e6, d['roofline_ratio'], d['routing_share']*100))"
}
for T in 1; do run mixtral_8x7b 4096 $T; run qwen3_30b_a3b 2048 $T; run deepseek_v3 7168 $T; run gpt_oss_20b 2880 $T; done
run qwen3_30b_a3b 2048 4096; run mixtral_8x7b 4096 4096; run gpt_oss_20b 2880 4096; run deepseek_v3 7168 4096
