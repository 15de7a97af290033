#!/bin/sh
# tests/layers/check.sh CC BUILD_DIR [CFLAGS...]: the layer graph holds.
# BUILD_DIR/layers/uses.txt (written by CMakeLists.txt from MOEC_LAYERS and
# MOEC_USES_<dir>) lists each layer and every layer it may use. The build
# compiles each directory with only build/layers/<dir>/ on its include path.
# Two probes, over every ordered pair of layers (lo, hi):
# - include: with lo's include path, a file including an internal header of
#   hi compiles when hi is lo or a layer lo may use, and otherwise fails
#   because the header is not found (not for some other reason);
# - call: every symbol that lo's library (BUILD_DIR/libmoec_<lo>.a) leaves
#   undefined and another layer's library defines is defined by a layer lo
#   may use (the link order catches an upward call, this a sideways one:
#   the simulator calling the compiler or the reverse). NM names nm.
# And the moec command (cli/) is a client of the library: with its include
# path (cli/ and include/) no layer's internal header is found, and every
# library function its objects call is one libmoec.so exports (MOE_API).
set -u
export LC_ALL=C
CC=$1 BUILD=$2
shift 2
NM=${NM:-nm}
USES=$BUILD/layers/uses.txt
[ -r "$USES" ] || { echo "FAIL: $USES is missing (configure the build first)"; exit 1; }
LAYERS=$(sed 's/:.*//' "$USES")
uses() { sed -n "s#^$1: ##p" "$USES"; }
header() {
	case $1 in
	support) echo support/support.h ;;
	ir) echo ir/ir.h ;;
	runtime) echo runtime/rt_io.h ;;
	interp) echo interp/interp.h ;;
	frontend) echo frontend/ast.h ;;
	passes) echo passes/pass.h ;;
	backend-c) echo backend-c/cgen.h ;;
	backend-tcp/isa) echo backend-tcp/isa/tcp_int.h ;;
	backend-tcp/sim) echo backend-tcp/sim/sim_int.h ;;
	backend-tcp/compiler) echo backend-tcp/compiler/tcp_compile.h ;;
	# multichip has no header of its own: its one source stands in for it
	backend-tcp/multichip) echo backend-tcp/multichip/multichip.c ;;
	*) echo "FAIL: no probe header for layer $1" >&2; echo "" ;;
	esac
}
lib() { echo "$BUILD/libmoec_$(echo "$1" | tr -- '-/' '__').a"; }
may_use() { # lo hi
	[ "$1" = "$2" ] && return 0
	for u in $(uses "$1"); do [ "$u" = "$2" ] && return 0; done
	return 1
}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0 n=0
for lo in $LAYERS; do
	for hi in $LAYERS; do
		h=$(header "$hi")
		[ -n "$h" ] || { fail=1; continue; }
		printf '#include "%s"\nint layer_probe;\n' "$h" >"$tmp/probe.c"
		if "$CC" -std=c11 -fsyntax-only -D_POSIX_C_SOURCE=200809L -I"$BUILD/layers/$lo" "$@" \
			"$tmp/probe.c" 2>"$tmp/err"; then
			ok=1
		else
			ok=0
		fi
		n=$((n + 1))
		if may_use "$lo" "$hi"; then
			[ "$ok" = 1 ] || { echo "FAIL: $lo cannot include $h (a layer it may use):"; cat "$tmp/err"; fail=1; }
		elif [ "$ok" = 1 ]; then
			echo "FAIL: $lo can include $h, of a layer it may not use"; fail=1
		elif ! grep -q "$h" "$tmp/err"; then
			echo "FAIL: $lo including $h failed for another reason:"; cat "$tmp/err"; fail=1
		fi
	done
done
# call probe: symbol -> defining layer, then each layer's undefined symbols
: >"$tmp/defs"
for l in $LAYERS; do
	a=$(lib "$l")
	[ -r "$a" ] || { echo "FAIL: $a is missing (build first)"; fail=1; continue; }
	"$NM" -g --defined-only "$a" 2>/dev/null | awk -v l="$l" 'NF == 3 { print $3, l }' >>"$tmp/defs"
done
sort -u "$tmp/defs" >"$tmp/defs.s"
nsym=0
for lo in $LAYERS; do
	a=$(lib "$lo")
	[ -r "$a" ] || continue
	"$NM" -u "$a" 2>/dev/null | awk 'NF == 2 { print $2 }' | sort -u >"$tmp/undef"
	join "$tmp/undef" "$tmp/defs.s" >"$tmp/calls"
	while read -r sym hi; do
		nsym=$((nsym + 1))
		if ! may_use "$lo" "$hi"; then
			echo "FAIL: $lo calls $sym of $hi, a layer it may not use"; fail=1
		fi
	done <"$tmp/calls"
done
[ "$nsym" -gt 0 ] || { echo "FAIL: the call probe found no symbol between layers"; fail=1; }
SRC=$(cd "$(dirname "$0")/../.." && pwd)
for hi in $LAYERS; do
	h=$(header "$hi")
	printf '#include "%s"\nint cli_probe;\n' "$h" >"$tmp/probe.c"
	n=$((n + 1))
	if "$CC" -std=c11 -fsyntax-only -D_POSIX_C_SOURCE=200809L -I"$SRC/cli" -I"$SRC/include" "$@" \
		"$tmp/probe.c" 2>"$tmp/err"; then
		echo "FAIL: the moec command can include $h, a layer's internal header"; fail=1
	elif ! grep -q "$h" "$tmp/err"; then
		echo "FAIL: the moec command including $h failed for another reason:"; cat "$tmp/err"; fail=1
	fi
done
ncli=0
"$NM" -D --defined-only "$BUILD/libmoec.so" 2>/dev/null | awk 'NF == 3 && $2 == "T" { print $3 }' | sort -u >"$tmp/api"
[ -s "$tmp/api" ] || { echo "FAIL: $BUILD/libmoec.so exports nothing (build first)"; fail=1; }
for o in "$BUILD"/CMakeFiles/moec.dir/cli/*.o; do
	[ -r "$o" ] || { echo "FAIL: no object of the moec command under $BUILD/CMakeFiles/moec.dir/cli"; fail=1; break; }
	"$NM" -u "$o" 2>/dev/null | awk 'NF == 2 { print $2 }' | sort -u >"$tmp/undef"
	join "$tmp/undef" "$tmp/defs.s" >"$tmp/calls"
	while read -r sym hi; do
		ncli=$((ncli + 1))
		grep -qx "$sym" "$tmp/api" || { echo "FAIL: the moec command ($(basename "$o" .o)) calls $sym of $hi, which is not public API"; fail=1; }
	done <"$tmp/calls"
done
[ "$ncli" -gt 0 ] || { echo "FAIL: the command probe found no call into the library"; fail=1; }
[ "$fail" = 0 ] && echo "layers: $n include probes, $nsym calls between layers and $ncli calls of the command into the library as expected"
exit $fail
