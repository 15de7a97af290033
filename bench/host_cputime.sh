#!/bin/sh
# CPU seconds per layer call on the host engine, robust to a loaded machine:
# (CPU time of a run with N+1 calls - CPU time of a run with 1 call) / N,
# each the minimum over R runs. Also prints the wall median (compute_seconds)
# and compile_seconds of the last long run.
# usage: bench/host_cputime.sh T [engine] [N] [R]   (needs /tmp/qwen3.safetensors, /tmp/x$T.npy)
T=${1:-1}; ENG=${2:-llvm}; N=${3:-20}; R=${4:-3}
MOEC=${MOEC:-./build/moec}
run() { # $1 = repeat; prints user+sys seconds
	/usr/bin/time -f "%U %S" -o /tmp/host_cputime.$$ "$MOEC" run examples/qwen3_30b_a3b.moe --set T="$T" \
		--weights /tmp/qwen3.safetensors --input /tmp/x"$T".npy -o /tmp/host_cputime_y.$$.npy \
		--engine="$ENG" --stats /tmp/host_cputime_s.$$.json --repeat "$1" >/dev/null || exit 1
	awk '{print $1 + $2}' /tmp/host_cputime.$$
}
best() { for i in $(seq "$R"); do run "$1"; done | sort -g | head -1; }
t1=$(best 1)
tn=$(best $((N + 1)))
echo "T=$T engine=$ENG cpu_per_call=$(echo "$t1 $tn $N" | awk '{printf "%.4f", ($2 - $1) / $3}')s" \
	"$(grep -E '"(compute|compile)_seconds"' /tmp/host_cputime_s.$$.json | tr -d ' \n')"
rm -f /tmp/host_cputime.$$ /tmp/host_cputime_y.$$.npy /tmp/host_cputime_s.$$.json
