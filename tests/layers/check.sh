#!/bin/sh
# tests/layers/check.sh CC BUILD_DIR [CFLAGS...]: the layer rule holds.
# The build compiles each directory with only build/layers/<dir>/ on its
# include path (the directories at or below it and their public headers).
# For every pair of layers this checks, with exactly those paths, that a file
# of the lower layer can include the upper layer's internal header only when
# the upper one is not above it: a header of the same layer or one below
# compiles, a header of a layer above does not (the compiler must report the
# missing file, not some other error).
set -u
CC=$1 BUILD=$2
shift 2
LAYERS="support ir runtime interp frontend passes backend-c backend-tcp"
header() {
	case $1 in
	support) echo support/support.h ;;
	ir) echo ir/ir.h ;;
	runtime) echo runtime/rt_io.h ;;
	interp) echo interp/interp.h ;;
	frontend) echo frontend/ast.h ;;
	passes) echo passes/pass.h ;;
	backend-c) echo backend-c/cgen.h ;;
	backend-tcp) echo backend-tcp/isa/tcp_int.h ;;
	esac
}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0 n=0
i=0
for lo in $LAYERS; do
	i=$((i + 1))
	j=0
	for hi in $LAYERS; do
		j=$((j + 1))
		h=$(header "$hi")
		printf '#include "%s"\nint layer_probe;\n' "$h" >"$tmp/probe.c"
		if "$CC" -std=c11 -fsyntax-only -D_POSIX_C_SOURCE=200809L -I"$BUILD/layers/$lo" "$@" \
			"$tmp/probe.c" 2>"$tmp/err"; then
			ok=1
		else
			ok=0
		fi
		n=$((n + 1))
		if [ "$j" -le "$i" ] && [ "$ok" = 0 ]; then
			echo "FAIL: $lo cannot include $h (same layer or below):"; cat "$tmp/err"; fail=1
		elif [ "$j" -gt "$i" ] && [ "$ok" = 1 ]; then
			echo "FAIL: $lo can include $h from the layer above it"; fail=1
		elif [ "$j" -gt "$i" ] && ! grep -q "$h" "$tmp/err"; then
			echo "FAIL: $lo including $h failed for another reason:"; cat "$tmp/err"; fail=1
		fi
	done
done
[ "$fail" = 0 ] && echo "layers: $n include probes as expected"
exit $fail
