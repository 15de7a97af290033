#!/bin/sh
# tests/install/run.sh: libmoec as an installed package, used by other programs.
#
# Usage: run.sh BUILD_DIR EMBED_SRC_DIR VERSION CC CMAKE MAKE PKG_CONFIG
#
# Installs BUILD_DIR into a fresh temporary prefix, then checks, using nothing
# but that prefix (and system packages such as LLVM and cJSON):
#  1. the layout: versioned shared library with soname libmoec.so.MAJOR, the
#     static archive, every public header (each compiles on its own), moec.pc
#     and the CMake package; the shared library exports exactly the moe_*
#     functions the headers declare;
#  2. pkg-config --cflags --libs moec points into the prefix; a program calling
#     moe_version_string() compiles, links against the prefix alone (rpath to
#     the prefix) and prints VERSION;
#  3. the embed example (copied out of the source tree) builds with pkg-config
#     (shared and static) and with find_package(moec) (moec::moec and
#     moec::moec_static), runs, and its output shows the external pass, the
#     lowered IR without topk/experts and compilable C for the layer.
# The temporary directory is removed on exit.
set -eu

if [ $# -ne 7 ]; then
	echo "usage: $0 BUILD_DIR EMBED_SRC_DIR VERSION CC CMAKE MAKE PKG_CONFIG" >&2
	exit 2
fi
build=$1 embed_src=$2 version=$3 cc=$4 cmake=$5 make=$6 pkgconfig=$7
major=${version%%.*}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/moec-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=$tmp/prefix

fail() {
	echo "FAIL: $*" >&2
	exit 1
}
step() {
	echo "== $*"
}

# Keep the host's package search paths away from moec: only the prefix may
# provide it. (LLVM and cJSON still come from the system.)
unset CMAKE_PREFIX_PATH PKG_CONFIG_PATH

step "cmake --install to $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
	cat "$tmp/install.log" >&2
	fail "cmake --install"
}

# ---- 1. layout ----
pc=$(find "$prefix" -name moec.pc -path '*/pkgconfig/*')
[ -n "$pc" ] || fail "moec.pc not installed"
libdir=$(dirname "$(dirname "$pc")")
for f in "$libdir/libmoec.a" "$libdir/libmoec.so" "$libdir/libmoec.so.$major" "$libdir/libmoec.so.$version" \
	"$libdir/cmake/moec/moecConfig.cmake" "$libdir/cmake/moec/moecConfigVersion.cmake" \
	"$libdir/cmake/moec/moecTargets.cmake" "$prefix/include/moec/moec.h" "$prefix/include/moec/ops.def"; do
	[ -e "$f" ] || fail "not installed: ${f#"$prefix"/}"
done
[ -L "$libdir/libmoec.so" ] || fail "libmoec.so is not a symlink to the versioned library"
soname=$(readelf -d "$libdir/libmoec.so.$version" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libmoec.so.$major" ] || fail "soname is '$soname', expected libmoec.so.$major"

step "every public header compiles on its own"
for h in "$prefix"/include/moec/*.h; do
	printf '#include <moec/%s>\nint moe_header_check;\n' "$(basename "$h")" >"$tmp/hdr.c"
	"$cc" -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$prefix/include" "$tmp/hdr.c" ||
		fail "header $(basename "$h") does not compile alone"
done

step "exported symbols are the declared API"
sed -n 's/^MOE_API.*[ *]\(moe_[a-z0-9_]*\)(.*/\1/p' "$prefix"/include/moec/*.h | sort -u >"$tmp/declared"
nm -D --defined-only "$libdir/libmoec.so" | awk '$2 ~ /^[TDBRW]$/ {print $3}' |
	grep -v -x -e _edata -e _end -e __bss_start -e _init -e _fini | sort -u >"$tmp/exported"
[ "$(wc -l <"$tmp/declared")" -gt 100 ] || fail "could not read the declarations of the public headers"
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
[ -z "$missing" ] || fail "declared in the headers but not exported by libmoec.so: $missing"
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
[ -z "$extra" ] || fail "exported by libmoec.so but not declared public: $extra"

# ---- 2. pkg-config and a minimal program ----
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
step "pkg-config (PKG_CONFIG_PATH=$PKG_CONFIG_PATH)"
flags=$("$pkgconfig" --cflags --libs moec) || fail "pkg-config --cflags --libs moec"
echo "   $flags"
[ "$("$pkgconfig" --modversion moec)" = "$version" ] || fail "pkg-config --modversion is not $version"
pc_prefix=$(cd "$("$pkgconfig" --variable=prefix moec)" && pwd -P)
[ "$pc_prefix" = "$(cd "$prefix" && pwd -P)" ] || fail "moec.pc prefix resolves to $pc_prefix, not the install prefix"
pc_libdir=$("$pkgconfig" --variable=libdir moec)
[ -e "$pc_libdir/libmoec.so" ] || fail "moec.pc libdir $pc_libdir holds no libmoec.so"
[ -e "$("$pkgconfig" --variable=includedir moec)/moec/moec.h" ] || fail "moec.pc includedir holds no moec/moec.h"

step "a program calling moe_version_string() against the prefix alone"
mkdir "$tmp/ver"
cat >"$tmp/ver/ver.c" <<'EOF'
#include <stdio.h>
#include <moec/moec.h>
int main(void)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	if (!ctx)
		return 1;
	printf("%s\n", moe_version_string());
	moe_ctx_free(ctx);
	return 0;
}
EOF
# shellcheck disable=SC2046 # pkg-config output is a list of words
"$cc" -std=c11 -Wall -Werror $("$pkgconfig" --cflags moec) -o "$tmp/ver/ver" "$tmp/ver/ver.c" \
	$("$pkgconfig" --libs moec) -Wl,-rpath,"$pc_libdir" || fail "the version program does not build"
got=$("$tmp/ver/ver") || fail "the version program failed"
[ "$got" = "$version" ] || fail "moe_version_string() = '$got', expected '$version'"
resolved=$(ldd "$tmp/ver/ver" | sed -n 's/^[[:space:]]*libmoec\.so[^ ]* => \([^ ]*\).*/\1/p')
case "$resolved" in
"$prefix"/* | "$pc_libdir"/*) ;;
*) fail "the version program loads libmoec from '$resolved', not the prefix" ;;
esac

# ---- 3. the embed example ----
# Checks one run of the example: its stdout, stderr and C file.
check_embed() { # NAME DIR
	name=$1 dir=$2
	(cd "$dir" && ./moec-embed layer.c >out.txt 2>err.txt) || {
		cat "$dir/err.txt" >&2
		fail "$name: moec-embed failed"
	}
	out=$dir/out.txt
	grep -q "^# libmoec $version\$" "$out" || fail "$name: no version line"
	grep -q '^# passes: .* lower-topk .*blockwise-dispatch.* op-census$' "$out" ||
		fail "$name: the external pass is not listed after the built-in ones"
	grep -q '^op-census\[built\] embed_moe: .* topk=1 .* experts=1 ' "$out" ||
		fail "$name: the external pass did not see the built layer"
	grep -q '^op-census\[lowered\] embed_moe: .* topk=0 .* experts=0 ' "$out" ||
		fail "$name: the external pass did not see the lowered layer"
	grep -q '^# interpreter: max |y_lowered - y_built| = ' "$out" || fail "$name: no interpreter check"
	sed -n '/^# lowered IR$/,/^# C written to /p' "$out" >"$dir/ir.txt"
	grep -q '^layer @embed_moe dtype=f32 {$' "$dir/ir.txt" || fail "$name: no lowered IR printed"
	grep -q 'grid_blocks_max=' "$dir/ir.txt" || fail "$name: grid-bound did not run"
	grep -q '= einsum(.*) valid(%' "$dir/ir.txt" || fail "$name: no blockwise (masked) einsum in the lowered IR"
	if grep -E '= (topk|experts)\(' "$dir/ir.txt"; then
		fail "$name: topk or experts left in the lowered IR"
	fi
	grep -q '^int moe_embed_moe(const void \*const \*inputs' "$dir/layer.c" || fail "$name: no layer function in the C"
	grep -q '^size_t moe_embed_moe_workspace_size(void)' "$dir/layer.c" || fail "$name: no workspace function in the C"
	"$cc" -std=c11 -c -o "$dir/layer.o" "$dir/layer.c" || fail "$name: the emitted C does not compile"
	grep -q ', 0 bytes live after moe_ctx_free$' "$dir/err.txt" ||
		fail "$name: memory allocated through the allocator hook was not all returned"
	echo "   $name: ok"
}

src=$tmp/embed-src
cp -R "$embed_src" "$src"

step "embed example with pkg-config (Makefile)"
mkdir "$tmp/pc-shared" "$tmp/pc-static"
"$make" -s -C "$tmp/pc-shared" -f "$src/Makefile" CC="$cc" || fail "make (shared)"
check_embed pkg-config/shared "$tmp/pc-shared"
"$make" -s -C "$tmp/pc-static" -f "$src/Makefile" CC="$cc" STATIC=1 || fail "make STATIC=1"
if readelf -d "$tmp/pc-static/moec-embed" | grep -q 'libmoec\.so'; then
	fail "the STATIC=1 build still needs libmoec.so"
fi
check_embed pkg-config/static "$tmp/pc-static"

step "embed example with find_package(moec) (CMAKE_PREFIX_PATH=$prefix)"
unset PKG_CONFIG_PATH # the package config itself needs pkg-config only for libcjson
for kind in shared static; do
	b=$tmp/cmake-$kind
	st=OFF
	[ "$kind" = static ] && st=ON
	"$cmake" -S "$src" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
		-DMOEC_EMBED_STATIC=$st >"$tmp/cmake-$kind.log" 2>&1 || {
		cat "$tmp/cmake-$kind.log" >&2
		fail "configuring the example ($kind)"
	}
	found=$(sed -n 's/^moec_DIR:PATH=//p' "$b/CMakeCache.txt")
	case "$found" in
	"$prefix"/*) ;;
	*) fail "find_package(moec) found '$found', not the prefix" ;;
	esac
	"$cmake" --build "$b" >"$tmp/build-$kind.log" 2>&1 || {
		cat "$tmp/build-$kind.log" >&2
		fail "building the example ($kind)"
	}
	if [ $kind = static ] && readelf -d "$b/moec-embed" | grep -q 'libmoec\.so'; then
		fail "the moec::moec_static build needs libmoec.so"
	fi
	if [ $kind = shared ] && ! readelf -d "$b/moec-embed" | grep -q 'NEEDED.*libmoec\.so\.'"$major"; then
		fail "the moec::moec build does not link libmoec.so.$major"
	fi
	check_embed "find_package/$kind" "$b"
done

echo "PASS"
