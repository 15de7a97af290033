/* Unit tests of the host backend (backend-c): every primitive op, valid masks,
 * bf16, broadcasting and einsum variants run through the LLVM JIT and the C
 * engine and must equal the reference interpreter bit for bit (the backend
 * evaluates every op in the interpreter's order and precision, docs/abi.md).
 * Also: faults, rejected ops, block statistics, the emitted C compiling with
 * gcc and clang at -std=c11 -Wall -Wextra -Werror, object and IR files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interp/interp.h"
#include "ir/ir.h"
#include "moec/backend.h"

static moe_module *parse(moe_ctx *ctx, const char *text)
{
	moe_module *m = moe_module_parse_text(ctx, "test.moeir", text, strlen(text));
	if (!m)
		moe_diag_print(ctx, stderr);
	assert_non_null(m);
	return m;
}

static void print_diags(moe_ctx *ctx)
{
	if (moe_diag_count(ctx))
		moe_diag_print(ctx, stderr);
}

/* Bitwise equality; reports the first differing element. */
static int same_bits(const moe_tensor *a, const moe_tensor *b, const char *what, uint32_t j)
{
	if (a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes))
		return 1;
	size_t es = moe_dtype_size(a->dtype);
	for (size_t i = 0; i < a->nbytes / es; i++)
		if (memcmp((const char *)a->data + i * es, (const char *)b->data + i * es, es)) {
			uint32_t x = 0, y = 0;
			memcpy(&x, (const char *)a->data + i * es, es);
			memcpy(&y, (const char *)b->data + i * es, es);
			fprintf(stderr, "%s: output %u element %zu differs: 0x%08x vs 0x%08x\n", what, j, i, x, y);
			break;
		}
	return 0;
}

/* Runs every layer of text on random bindings (seeds 1..nseeds) through the
 * interpreter and both engines; all three must agree bitwise. */
static void check_text_seeds(const char *text, int nseeds)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(ctx, text);
	for (size_t gi = 0; gi < moe_module_num_graphs(m); gi++) {
		moe_graph *g = moe_module_graph(m, gi);
		uint32_t no = moe_graph_num_outputs(g);
		for (int seed = 1; seed <= nseeds; seed++) {
			moe_tensor_map *bind = NULL;
			assert_int_equal(ir_interp_random_bindings(ctx, g, (uint64_t)seed, &bind), MOE_OK);
			moe_tensor **ref = NULL;
			moe_status rs = ir_interp_run_alloc(ctx, g, bind, &ref);
			print_diags(ctx);
			assert_int_equal(rs, MOE_OK);
			moe_tensor *jit[32] = {0}, *cc[32] = {0};
			assert_true(no <= 32);
			moe_host_stats st;
			moe_host_opts ho; /* portable kernels: bitwise the interpreter's sums (docs/abi.md) */
			moe_host_opts_init(&ho);
			ho.portable = 1;
			ho.no_cache = 1;
			moe_status s1 = moe_host_run_opts(ctx, g, bind, &ho, jit, &st);
			print_diags(ctx);
			assert_int_equal(s1, MOE_OK);
			moe_status s2 = moe_host_run(ctx, g, bind, MOE_HOST_C, 1, cc, NULL);
			print_diags(ctx);
			assert_int_equal(s2, MOE_OK);
			for (uint32_t j = 0; j < no; j++) {
				assert_true(same_bits(jit[j], cc[j], "llvm vs c", j));
				if (!same_bits(ref[j], jit[j], "interp vs llvm", j)) {
					fprintf(stderr, "layer %s seed %d\n", moe_graph_name(g), seed);
					fail();
				}
				moe_tensor_free(ctx, jit[j]);
				moe_tensor_free(ctx, cc[j]);
			}
			ir_interp_free_outputs(ctx, g, ref);
			moe_tensor_map_free(bind);
		}
	}
	assert_int_equal(moe_error_count(ctx), 0);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

static void check_text(const char *text)
{
	check_text_seeds(text, 2);
}

static void test_unary(void **state)
{
	(void)state;
	check_text("moeir 1\n"
		   "layer @unary dtype=f32 {\n"
		   "  %0 = input \"x\" : f32[3, 7]\n"
		   "  %1 = neg(%0) : f32[3, 7]\n"
		   "  %2 = abs(%0) : f32[3, 7]\n"
		   "  %3 = exp(%0) : f32[3, 7]\n"
		   "  %4 = log(%0) : f32[3, 7]\n"
		   "  %5 = sqrt(%2) : f32[3, 7]\n"
		   "  %6 = rsqrt(%0) : f32[3, 7]\n"
		   "  %7 = tanh(%0) : f32[3, 7]\n"
		   "  %8 = erf(%0) : f32[3, 7]\n"
		   "  %9 = sigmoid(%0) : f32[3, 7]\n"
		   "  output %1, %2, %3, %4, %5, %6, %7, %8, %9\n"
		   "}\n"
		   "layer @unary_bf16 dtype=bf16 {\n"
		   "  %0 = input \"x\" : bf16[3, 7]\n"
		   "  %1 = neg(%0) : bf16[3, 7]\n"
		   "  %2 = abs(%0) : bf16[3, 7]\n"
		   "  %3 = exp(%0) : bf16[3, 7]\n"
		   "  %4 = log(%2) : bf16[3, 7]\n"
		   "  %5 = sqrt(%2) : bf16[3, 7]\n"
		   "  %6 = rsqrt(%2) : bf16[3, 7]\n"
		   "  %7 = tanh(%0) : bf16[3, 7]\n"
		   "  %8 = erf(%0) : bf16[3, 7]\n"
		   "  %9 = sigmoid(%0) : bf16[3, 7]\n"
		   "  output %1, %2, %3, %4, %5, %6, %7, %8, %9\n"
		   "}\n"
		   "layer @unary_int dtype=f32 {\n"
		   "  %0 = input \"i\" : i32[4, 5]\n"
		   "  %1 = input \"b\" : bool[4, 5]\n"
		   "  %2 = neg(%0) : i32[4, 5]\n"
		   "  %3 = abs(%0) : i32[4, 5]\n"
		   "  %4 = not(%0) : i32[4, 5]\n"
		   "  %5 = not(%1) : bool[4, 5]\n"
		   "  output %2, %3, %4, %5\n"
		   "}\n");
}

static void test_binary_broadcast(void **state)
{
	(void)state;
	check_text("moeir 1\n"
		   "layer @bin dtype=f32 {\n"
		   "  %0 = input \"a\" : f32[4, 1, 6]\n"
		   "  %1 = input \"b\" : f32[3, 1]\n"
		   "  %2 = add(%0, %1) : f32[4, 3, 6]\n"
		   "  %3 = sub(%0, %1) : f32[4, 3, 6]\n"
		   "  %4 = mul(%0, %1) : f32[4, 3, 6]\n"
		   "  %5 = div(%0, %1) : f32[4, 3, 6]\n"
		   "  %6 = min(%0, %1) : f32[4, 3, 6]\n"
		   "  %7 = max(%0, %1) : f32[4, 3, 6]\n"
		   "  %8 = lt(%0, %1) : bool[4, 3, 6]\n"
		   "  %9 = le(%0, %1) : bool[4, 3, 6]\n"
		   "  %10 = gt(%0, %1) : bool[4, 3, 6]\n"
		   "  %11 = ge(%0, %1) : bool[4, 3, 6]\n"
		   "  %12 = eq(%0, %0) : bool[4, 1, 6]\n"
		   "  %13 = ne(%0, %1) : bool[4, 3, 6]\n"
		   "  %14 = select(%8, %0, %1) : f32[4, 3, 6]\n"
		   "  %15 = const {value=0.0} : f32[]\n"
		   "  %16 = neg(%15) : f32[]\n"
		   "  %17 = max(%15, %16) : f32[]\n"
		   "  %18 = min(%15, %16) : f32[]\n"
		   "  %19 = max(%16, %15) : f32[]\n"
		   "  %20 = min(%16, %15) : f32[]\n"
		   "  output %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %17, %18, %19, %20\n"
		   "}\n"
		   "layer @bin_bf16 dtype=bf16 {\n"
		   "  %0 = input \"a\" : bf16[5, 6]\n"
		   "  %1 = input \"b\" : bf16[6]\n"
		   "  %2 = add(%0, %1) : bf16[5, 6]\n"
		   "  %3 = mul(%0, %1) : bf16[5, 6]\n"
		   "  %4 = div(%0, %1) : bf16[5, 6]\n"
		   "  %5 = max(%0, %1) : bf16[5, 6]\n"
		   "  %6 = sub(%0, %1) : bf16[5, 6]\n"
		   "  output %2, %3, %4, %5, %6\n"
		   "}\n"
		   "layer @bin_int dtype=f32 {\n"
		   "  %0 = input \"a\" : i32[4, 6]\n"
		   "  %1 = input \"b\" : i32[6]\n"
		   "  %2 = add(%0, %1) : i32[4, 6]\n"
		   "  %3 = sub(%0, %1) : i32[4, 6]\n"
		   "  %4 = mul(%0, %1) : i32[4, 6]\n"
		   "  %5 = min(%0, %1) : i32[4, 6]\n"
		   "  %6 = max(%0, %1) : i32[4, 6]\n"
		   "  %7 = and(%0, %1) : i32[4, 6]\n"
		   "  %8 = or(%0, %1) : i32[4, 6]\n"
		   "  %9 = xor(%0, %1) : i32[4, 6]\n"
		   "  %10 = shl(%0, %1) : i32[4, 6]\n"
		   "  %11 = shr(%0, %1) : i32[4, 6]\n"
		   "  %12 = sar(%0, %1) : i32[4, 6]\n"
		   "  %13 = const {value=3} : i32[]\n"
		   "  %14 = div(%0, %13) : i32[4, 6]\n"
		   "  %15 = const {value=-2147483648} : i32[]\n"
		   "  %16 = const {value=-1} : i32[]\n"
		   "  %17 = div(%15, %16) : i32[]\n"
		   "  %18 = mul(%15, %16) : i32[]\n"
		   "  %19 = lt(%0, %1) : bool[4, 6]\n"
		   "  %20 = eq(%19, %19) : bool[4, 6]\n"
		   "  %21 = xor(%19, %20) : bool[4, 6]\n"
		   "  %22 = select(%19, %0, %1) : i32[4, 6]\n"
		   "  output %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %14, %17, %18, %20, %21, %22\n"
		   "}\n");
}

/* ---- two NaN operands (docs/abi.md "NaN results") ---- */

static const uint32_t nan_vals[10] = {0x7fc00001u, 0xffc12345u, 0x7f810005u, 0xff812345u, 0x7f800000u,
	0xff800000u, 0u, 0x80000000u, 0x3fc00000u, 0xc0000000u};

static float bits_f(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static uint32_t f_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

/* the stated rule, written out independently of ir/scalar.h */
static float want_op(char op, float a, float b)
{
	if (a != a)
		return bits_f(f_bits(a) | 0x00400000u);
	if (b != b)
		return bits_f(f_bits(b) | 0x00400000u);
	volatile float x = a, y = b;
	return op == '+' ? x + y : op == '-' ? x - y : op == '*' ? x * y : x / y;
}

static moe_tensor *nan_tensor(moe_ctx *ctx, moe_dtype t, int64_t n, int which)
{
	moe_tensor *x = moe_tensor_new(ctx, t, 1, &n);
	assert_non_null(x);
	for (int64_t i = 0; i < n; i++) {
		uint32_t v = nan_vals[which ? i % 10 : i / 10 % 10];
		if (t == MOE_F32)
			((uint32_t *)x->data)[i] = v;
		else
			((uint16_t *)x->data)[i] = (uint16_t)(v >> 16);
	}
	return x;
}

/* Runs g on bind through the interpreter, LLVM (portable and default kernels)
 * and the C engine into out[engine][output]. */
static void run_engines(moe_ctx *ctx, moe_graph *g, moe_tensor_map *bind, moe_tensor *out[4][8])
{
	uint32_t no = moe_graph_num_outputs(g);
	assert_true(no <= 8);
	moe_tensor **ref = NULL;
	assert_int_equal(ir_interp_run_alloc(ctx, g, bind, &ref), MOE_OK);
	for (uint32_t j = 0; j < no; j++) {
		out[0][j] = ref[j];
		ref[j] = NULL;
	}
	ir_interp_free_outputs(ctx, g, ref);
	for (int e = 1; e < 4; e++) {
		moe_host_opts ho;
		moe_host_opts_init(&ho);
		ho.engine = e == 3 ? MOE_HOST_C : MOE_HOST_LLVM;
		ho.portable = e == 1;
		ho.no_cache = 1;
		moe_status s = moe_host_run_opts(ctx, g, bind, &ho, out[e], NULL);
		print_diags(ctx);
		assert_int_equal(s, MOE_OK);
	}
}

static void test_nan_operands(void **state)
{
	(void)state;
	static const char text[] = "moeir 1\n"
				   "layer @nan2 dtype=f32 {\n"
				   "  %0 = input \"a\" : f32[100]\n"
				   "  %1 = input \"b\" : f32[100]\n"
				   "  %2 = add(%0, %1) : f32[100]\n"
				   "  %3 = sub(%0, %1) : f32[100]\n"
				   "  %4 = mul(%0, %1) : f32[100]\n"
				   "  %5 = div(%0, %1) : f32[100]\n"
				   "  %6 = sigmoid(%0) : f32[100]\n"
				   "  %7 = mul(%0, %6) : f32[100]\n"
				   "  %8 = sub(%1, %0) : f32[100]\n"
				   "  %9 = mul(%2, %8) : f32[100]\n"
				   "  output %2, %3, %4, %5, %7, %9\n"
				   "}\n"
				   "layer @nan2_bf16 dtype=bf16 {\n"
				   "  %0 = input \"a\" : bf16[100]\n"
				   "  %1 = input \"b\" : bf16[100]\n"
				   "  %2 = add(%0, %1) : bf16[100]\n"
				   "  %3 = sub(%0, %1) : bf16[100]\n"
				   "  %4 = mul(%0, %1) : bf16[100]\n"
				   "  %5 = div(%0, %1) : bf16[100]\n"
				   "  output %2, %3, %4, %5\n"
				   "}\n";
	static const char ops[] = "+-*/";
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(ctx, text);
	for (size_t gi = 0; gi < 2; gi++) {
		moe_graph *g = moe_module_graph(m, gi);
		moe_dtype t = gi ? MOE_BF16 : MOE_F32;
		moe_tensor_map *bind = moe_tensor_map_new(ctx);
		assert_int_equal(moe_tensor_map_set(bind, "a", nan_tensor(ctx, t, 100, 0)), MOE_OK);
		assert_int_equal(moe_tensor_map_set(bind, "b", nan_tensor(ctx, t, 100, 1)), MOE_OK);
		moe_tensor *out[4][8] = {{0}};
		run_engines(ctx, g, bind, out);
		uint32_t no = moe_graph_num_outputs(g);
		for (uint32_t j = 0; j < no; j++) {
			for (int e = 1; e < 4; e++)
				assert_true(same_bits(out[0][j], out[e][j], e == 3 ? "interp vs c" : "interp vs llvm", j));
			for (int i = 0; i < 100; i++) {
				float a = bits_f(gi ? nan_vals[i / 10] & 0xffff0000u : nan_vals[i / 10]);
				float b = bits_f(gi ? nan_vals[i % 10] & 0xffff0000u : nan_vals[i % 10]);
				float w = j < 4 ? want_op(ops[j], a, b) :
					  j == 4 ? want_op('*', a, (float)(1.0 / (1.0 + exp(-(double)a)))) :
						   want_op('*', want_op('+', a, b), want_op('-', b, a));
				uint32_t got = gi ? (uint32_t)((uint16_t *)out[0][j]->data)[i] << 16 :
						    ((uint32_t *)out[0][j]->data)[i];
				if (w != w) /* the NaN results: exactly the rule's (bf16: its upper half) */
					assert_int_equal(got, gi ? f_bits(w) & 0xffff0000u : f_bits(w));
				else
					assert_false(bits_f(got) != bits_f(got));
			}
		}
		for (int e = 0; e < 4; e++)
			for (uint32_t j = 0; j < no; j++)
				moe_tensor_free(ctx, out[e][j]);
		moe_tensor_map_free(bind);
	}
	moe_module_free(m);
	moe_ctx_free(ctx);
}

/* Sums (einsum, reduce_sum, cumsum, softmax): NaN exactly where the
 * interpreter has one, and every other element bitwise its value; which NaN
 * is not defined (docs/abi.md). */
static void test_nan_sums(void **state)
{
	(void)state;
	static const char text[] = "moeir 1\n"
				   "layer @nansum dtype=f32 {\n"
				   "  %0 = input \"a\" : f32[100]\n"
				   "  %1 = reshape(%0) {shape=[10, 10]} : f32[10, 10]\n"
				   "  %2 = reduce_sum(%1) {axis=1} : f32[10]\n"
				   "  %3 = cumsum(%1) {axis=0} : f32[10, 10]\n"
				   "  %4 = einsum(%1, %1) {eq=\"ij,kj->ik\"} : f32[10, 10]\n"
				   "  %5 = softmax(%1) {axis=1} : f32[10, 10]\n"
				   "  output %2, %3, %4, %5\n"
				   "}\n";
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(ctx, text);
	moe_graph *g = moe_module_graph(m, 0);
	moe_tensor_map *bind = moe_tensor_map_new(ctx);
	assert_int_equal(moe_tensor_map_set(bind, "a", nan_tensor(ctx, MOE_F32, 100, 1)), MOE_OK);
	moe_tensor *out[4][8] = {{0}};
	run_engines(ctx, g, bind, out);
	int nans = 0;
	for (uint32_t j = 0; j < 4; j++)
		for (int e = 1; e < 4; e++)
			for (size_t i = 0; i < out[0][j]->nbytes / 4; i++) {
				float r = ((float *)out[0][j]->data)[i], x = ((float *)out[e][j]->data)[i];
				assert_int_equal(r != r, x != x);
				if (r == r)
					assert_int_equal(f_bits(r), f_bits(x));
				nans += r != r;
			}
	assert_true(nans > 0);
	for (int e = 0; e < 4; e++)
		for (uint32_t j = 0; j < 4; j++)
			moe_tensor_free(ctx, out[e][j]);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

static void test_cast_bitcast_const_iota(void **state)
{
	(void)state;
	check_text("moeir 1\n"
		   "layer @casts dtype=f32 {\n"
		   "  %0 = input \"x\" : f32[4, 6]\n"
		   "  %1 = input \"i\" : i32[4, 6]\n"
		   "  %2 = const {value=1000.0} : f32[]\n"
		   "  %3 = mul(%0, %2) : f32[4, 6]\n"
		   "  %4 = cast(%3) {to=\"bf16\"} : bf16[4, 6]\n"
		   "  %5 = cast(%3) {to=\"i32\"} : i32[4, 6]\n"
		   "  %6 = cast(%0) {to=\"bool\"} : bool[4, 6]\n"
		   "  %7 = cast(%4) {to=\"f32\"} : f32[4, 6]\n"
		   "  %8 = cast(%1) {to=\"f32\"} : f32[4, 6]\n"
		   "  %9 = const {value=16777217} : i32[]\n"
		   "  %10 = mul(%1, %9) : i32[4, 6]\n"
		   "  %11 = cast(%10) {to=\"bf16\"} : bf16[4, 6]\n"
		   "  %12 = cast(%10) {to=\"f32\"} : f32[4, 6]\n"
		   "  %13 = cast(%6) {to=\"i32\"} : i32[4, 6]\n"
		   "  %14 = cast(%1) {to=\"bool\"} : bool[4, 6]\n"
		   "  %15 = bitcast(%0) {to=\"i32\"} : i32[4, 6]\n"
		   "  %16 = bitcast(%10) {to=\"f32\"} : f32[4, 6]\n"
		   "  %17 = const {value=1e10} : f32[]\n"
		   "  %18 = cast(%17) {to=\"i32\"} : i32[]\n"
		   "  %19 = const {value=0.1} : bf16[2, 3]\n"
		   "  %20 = const {value=7} : i32[3]\n"
		   "  %21 = const {value=1} : bool[2]\n"
		   "  %22 = iota {axis=1} : i32[3, 4]\n"
		   "  %23 = iota {axis=0} : i32[3, 4]\n"
		   "  %24 = cast(%6) {to=\"bf16\"} : bf16[4, 6]\n"
		   "  %25 = const {value=nan} : f32[]\n"
		   "  %26 = cast(%25) {to=\"i32\"} : i32[]\n"
		   "  output %4, %5, %6, %7, %8, %11, %12, %13, %14, %15, %16, %18, %19, %20, %21, %22, %23, %24, %26\n"
		   "}\n");
}

static void test_reductions(void **state)
{
	(void)state;
	check_text("moeir 1\n"
		   "layer @red dtype=f32 {\n"
		   "  %0 = input \"x\" : f32[3, 4, 5]\n"
		   "  %1 = reduce_sum(%0) {axis=-1} : f32[3, 4]\n"
		   "  %2 = reduce_sum(%0) {axis=1, keepdims=1} : f32[3, 1, 5]\n"
		   "  %3 = reduce_max(%0) {axis=0} : f32[4, 5]\n"
		   "  %4 = reduce_min(%0) {axis=2} : f32[3, 4]\n"
		   "  %5 = softmax(%0) {axis=-1} : f32[3, 4, 5]\n"
		   "  %6 = softmax(%0) {axis=1} : f32[3, 4, 5]\n"
		   "  %7 = cumsum(%0) {axis=2} : f32[3, 4, 5]\n"
		   "  %8 = cumsum(%0) {axis=0, exclusive=1} : f32[3, 4, 5]\n"
		   "  %9 = input \"b\" : bool[3, 4]\n"
		   "  %10 = reduce_sum(%9) {axis=1} : i32[3]\n"
		   "  %11 = cumsum(%9) {axis=1, exclusive=1} : i32[3, 4]\n"
		   "  %12 = input \"i\" : i32[3, 4]\n"
		   "  %13 = reduce_max(%12) {axis=0} : i32[4]\n"
		   "  %14 = reduce_min(%12) {axis=1} : i32[3]\n"
		   "  %15 = cumsum(%12) {axis=1} : i32[3, 4]\n"
		   "  %16 = reduce_max(%9) {axis=1} : i32[3]\n"
		   "  output %1, %2, %3, %4, %5, %6, %7, %8, %10, %11, %13, %14, %15, %16\n"
		   "}\n"
		   "layer @red_bf16 dtype=bf16 {\n"
		   "  %0 = input \"x\" : bf16[6, 33]\n"
		   "  %1 = reduce_sum(%0) {axis=1} : bf16[6]\n"
		   "  %2 = softmax(%0) {axis=1} : bf16[6, 33]\n"
		   "  %3 = cumsum(%0) {axis=1} : bf16[6, 33]\n"
		   "  %4 = reduce_max(%0) {axis=0} : bf16[33]\n"
		   "  output %1, %2, %3, %4\n"
		   "}\n");
}

static void test_einsum(void **state)
{
	(void)state;
	check_text("moeir 1\n"
		   "layer @ein dtype=f32 {\n"
		   "  %0 = input \"x\" : f32[5, 40]\n"
		   "  %1 = weight \"w\" {source=\"w\"} : f32[300, 40]\n"
		   "  %2 = einsum(%0, %1) {eq=\"td,ed->te\"} : f32[5, 300]\n"
		   "  %3 = weight \"v\" {source=\"v\"} : f32[40, 9]\n"
		   "  %4 = einsum(%0, %3) {eq=\"ij,jk->ik\"} : f32[5, 9]\n"
		   "  %5 = einsum(%3, %0) {eq=\"jk,ij->ki\"} : f32[9, 5]\n"
		   "  %6 = einsum(%0) {eq=\"ab->ba\"} : f32[40, 5]\n"
		   "  %7 = einsum(%0) {eq=\"ab->a\"} : f32[5]\n"
		   "  %8 = einsum(%0, %0) {eq=\"ij,ij->i\"} : f32[5]\n"
		   "  %9 = input \"y\" : f32[40]\n"
		   "  %10 = einsum(%0, %9) {eq=\"td,d->t\"} : f32[5]\n"
		   "  %11 = einsum(%0, %9) {eq=\"td,e->tde\"} : f32[5, 40, 40]\n"
		   "  %12 = input \"c\" : f32[2, 3, 4, 6]\n"
		   "  %13 = input \"d\" : f32[2, 4, 6, 5, 7]\n"
		   "  %14 = einsum(%12, %13) {eq=\"gmkl,gklnp->gmnp\"} : f32[2, 3, 5, 7]\n"
		   "  output %2, %4, %5, %6, %7, %8, %10, %11, %14\n"
		   "}\n"
		   "layer @ein_bf16 dtype=bf16 {\n"
		   "  %0 = input \"x\" : bf16[3, 4, 64]\n"
		   "  %1 = input \"w\" : bf16[3, 20, 64]\n"
		   "  %2 = einsum(%0, %1) {eq=\"gbd,gfd->gbf\"} : bf16[3, 4, 20]\n"
		   "  %3 = input \"u\" : bf16[3, 64, 20]\n"
		   "  %4 = einsum(%2, %3) {eq=\"gbf,gdf->gbd\"} : bf16[3, 4, 64]\n"
		   "  output %2, %4\n"
		   "}\n"
		   "layer @ein_int dtype=f32 {\n"
		   "  %0 = input \"a\" : i32[3, 4]\n"
		   "  %1 = input \"b\" : i32[4, 5]\n"
		   "  %2 = einsum(%0, %1) {eq=\"ij,jk->ik\"} : i32[3, 5]\n"
		   "  output %2\n"
		   "}\n");
}

static void test_valid_masks(void **state)
{
	(void)state;
	check_text_seeds("moeir 1\n"
			 "layer @valid dtype=bf16 {\n"
			 "  %0 = input \"x\" : bf16[4, 8, 32]\n"
			 "  %1 = input \"w\" : bf16[4, 24, 32]\n"
			 "  %2 = input \"rows\" : i32[4]\n"
			 "  %3 = einsum(%0, %1) valid(%2) {eq=\"gbd,gfd->gbf\"} : bf16[4, 8, 24]\n"
			 "  %4 = input \"n\" : i32[]\n"
			 "  %5 = einsum(%0, %1) valid(%4) {eq=\"gbd,gfd->gbf\"} : bf16[4, 8, 24]\n"
			 "  %6 = sigmoid(%3) valid(%2) : bf16[4, 8, 24]\n"
			 "  %7 = add(%0, %0) valid(%4) : bf16[4, 8, 32]\n"
			 "  %8 = einsum(%0, %1) valid(%2) {eq=\"gbd,gfd->gfb\"} : bf16[4, 24, 8]\n"
			 "  %9 = input \"t\" : bf16[8, 32]\n"
			 "  %10 = input \"tw\" : bf16[24, 32]\n"
			 "  %11 = einsum(%9, %10) valid(%4) {eq=\"td,fd->tf\"} : bf16[8, 24]\n"
			 "  %12 = input \"gi\" : i32[4, 8]\n"
			 "  %13 = gather(%9, %12) valid(%2) {axis=0} : bf16[4, 8, 32]\n"
			 "  %14 = cast(%13) valid(%4) {to=\"f32\"} : f32[4, 8, 32]\n"
			 "  output %3, %5, %6, %7, %8, %11, %13, %14\n"
			 "}\n",
		4);
}

/* Gathers of weight slabs read in place by their einsums (dot tiles): masked
 * blocks, blocks past the gather's count (their weights are +0), partial tiles
 * of lanes, K not a multiple of the tile, bf16 and f32 weights, a gather with
 * two einsum users and one that is also an output (materialised). */
static void test_fused_gather_dot(void **state)
{
	(void)state;
	check_text_seeds("moeir 1\n"
			 "layer @fuse dtype=bf16 {\n"
			 "  %0 = input \"x\" : bf16[5, 6, 37]\n"
			 "  %1 = input \"w\" : bf16[7, 21, 37]\n"
			 "  %2 = input \"bexp\" : i32[5]\n"
			 "  %3 = input \"nblocks\" : i32[]\n"
			 "  %4 = input \"rows\" : i32[5]\n"
			 "  %5 = gather(%1, %2) valid(%3) {axis=0} : bf16[5, 21, 37]\n"
			 "  %6 = einsum(%0, %5) valid(%4) {eq=\"gbd,gfd->gbf\"} : bf16[5, 6, 21]\n"
			 "  %7 = einsum(%0, %5) {eq=\"gbd,gfd->gbf\"} : bf16[5, 6, 21]\n"
			 "  %8 = cast(%6) valid(%4) {to=\"f32\"} : f32[5, 6, 21]\n"
			 "  %9 = input \"wf\" : f32[7, 40, 21]\n"
			 "  %10 = gather(%9, %2) valid(%3) {axis=0} : f32[5, 40, 21]\n"
			 "  %11 = einsum(%8, %10) valid(%4) {eq=\"gbf,gdf->gbd\"} : f32[5, 6, 40]\n"
			 "  %12 = gather(%1, %2) {axis=0} : bf16[5, 21, 37]\n"
			 "  %13 = einsum(%0, %12) valid(%3) {eq=\"gbd,gfd->gbf\"} : bf16[5, 6, 21]\n"
			 "  %14 = gather(%9, %2) valid(%3) {axis=0} : f32[5, 40, 21]\n"
			 "  %15 = einsum(%8, %14) {eq=\"gbf,gdf->gdb\"} : f32[5, 40, 6]\n"
			 "  %16 = sigmoid(%8) valid(%4) : f32[5, 6, 21]\n"
			 "  %17 = mul(%16, %8) valid(%4) : f32[5, 6, 21]\n"
			 "  %18 = einsum(%17, %10) valid(%4) {eq=\"gbf,gdf->gbd\"} : f32[5, 6, 40]\n"
			 "  output %6, %7, %11, %13, %14, %15, %18\n"
			 "}\n",
		8);
}

static void test_data_movement(void **state)
{
	(void)state;
	check_text("moeir 1\n"
		   "layer @move dtype=f32 {\n"
		   "  %0 = input \"x\" : f32[6, 5]\n"
		   "  %1 = input \"i\" : i32[3, 2]\n"
		   "  %2 = gather(%0, %1) {axis=0} : f32[3, 2, 5]\n"
		   "  %3 = input \"j\" : i32[4]\n"
		   "  %4 = gather(%0, %3) {axis=1} : f32[6, 4]\n"
		   "  %5 = input \"k\" : i32[6, 3]\n"
		   "  %6 = take_along(%0, %5) {axis=1} : f32[6, 3]\n"
		   "  %7 = input \"s\" : i32[4]\n"
		   "  %8 = input \"src\" : f32[4, 5]\n"
		   "  %9 = scatter(%0, %7, %8) : f32[6, 5]\n"
		   "  %10 = scatter(%0, %7, %8) {mode=\"add\"} : f32[6, 5]\n"
		   "  %11 = reshape(%0) {shape=[3, 10]} : f32[3, 10]\n"
		   "  %12 = exp(%11) : f32[3, 10]\n"
		   "  %13 = slice(%0) {axis=1, start=1, stop=5, step=2} : f32[6, 2]\n"
		   "  %14 = concat(%0, %13, %0) {axis=1} : f32[6, 12]\n"
		   "  %15 = broadcast(%8) {shape=[2, 4, 5]} : f32[2, 4, 5]\n"
		   "  %16 = one_hot(%3) {n=7} : i32[4, 7]\n"
		   "  %17 = input \"m\" : bool[6, 5]\n"
		   "  %18 = filter(%17, %0) {fill=-1.5} : f32[6, 5]\n"
		   "  %19 = reshape(%12) {shape=[30]} : f32[30]\n"
		   "  output %2, %4, %6, %9, %10, %11, %12, %13, %14, %15, %16, %18, %19, %0, %12\n"
		   "}\n"
		   "layer @move_bf16 dtype=bf16 {\n"
		   "  %0 = input \"x\" : bf16[6, 5]\n"
		   "  %1 = input \"s\" : i32[9]\n"
		   "  %2 = input \"src\" : bf16[9, 5]\n"
		   "  %3 = scatter(%0, %1, %2) {mode=\"add\"} : bf16[6, 5]\n"
		   "  %4 = input \"m\" : i32[6, 5]\n"
		   "  %5 = filter(%4, %4) {fill=3} : i32[6, 5]\n"
		   "  %6 = scatter(%0, %1, %2) : bf16[6, 5]\n"
		   "  output %3, %5, %6\n"
		   "}\n");
}

/* hand-made bindings */
static moe_tensor *tensor(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape, const void *data)
{
	moe_tensor *x = moe_tensor_new(ctx, t, rank, shape);
	assert_non_null(x);
	memcpy(x->data, data, x->nbytes);
	return x;
}

static void expect_fault(const char *text, moe_tensor_map *(*mk)(moe_ctx *))
{
	for (int eng = 0; eng < 2; eng++) {
		moe_ctx *ctx = moe_ctx_new(NULL, NULL);
		moe_module *m = parse(ctx, text);
		moe_tensor_map *bind = mk(ctx);
		moe_tensor *out[4] = {0};
		moe_status s = moe_host_run(ctx, moe_module_graph(m, 0), bind, eng ? MOE_HOST_C : MOE_HOST_LLVM, 1, out, NULL);
		assert_int_equal(s, MOE_ERR_RUNTIME);
		assert_null(out[0]);
		assert_true(moe_error_count(ctx) > 0);
		moe_tensor_map_free(bind);
		moe_module_free(m);
		moe_ctx_free(ctx);
	}
}

static moe_tensor_map *bind_gather_bad(moe_ctx *ctx)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	float x[6] = {1, 2, 3, 4, 5, 6};
	int32_t i[2] = {1, 3};
	moe_tensor_map_set(b, "x", tensor(ctx, MOE_F32, 2, (int64_t[]){3, 2}, x));
	moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){2}, i));
	return b;
}

static moe_tensor_map *bind_div0(moe_ctx *ctx)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	int32_t a[3] = {1, 2, 3}, d[3] = {1, 0, 1};
	moe_tensor_map_set(b, "a", tensor(ctx, MOE_I32, 1, (int64_t[]){3}, a));
	moe_tensor_map_set(b, "d", tensor(ctx, MOE_I32, 1, (int64_t[]){3}, d));
	return b;
}

static moe_tensor_map *bind_scatter_bad(moe_ctx *ctx)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	float x[6] = {0}, s[4] = {1, 2, 3, 4};
	int32_t i[2] = {0, -1};
	moe_tensor_map_set(b, "x", tensor(ctx, MOE_F32, 2, (int64_t[]){3, 2}, x));
	moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){2}, i));
	moe_tensor_map_set(b, "s", tensor(ctx, MOE_F32, 2, (int64_t[]){2, 2}, s));
	return b;
}

/* masked-off rows may hold garbage indices without a fault */
static moe_tensor_map *bind_gather_masked(moe_ctx *ctx)
{
	moe_tensor_map *b = bind_gather_bad(ctx);
	int32_t n = 1;
	moe_tensor_map_set(b, "n", tensor(ctx, MOE_I32, 0, NULL, &n));
	return b;
}

static void test_faults(void **state)
{
	(void)state;
	expect_fault("moeir 1\nlayer @g dtype=f32 {\n"
		     "  %0 = input \"x\" : f32[3, 2]\n  %1 = input \"i\" : i32[2]\n"
		     "  %2 = gather(%0, %1) {axis=0} : f32[2, 2]\n  output %2\n}\n",
		bind_gather_bad);
	expect_fault("moeir 1\nlayer @d dtype=f32 {\n"
		     "  %0 = input \"a\" : i32[3]\n  %1 = input \"d\" : i32[3]\n"
		     "  %2 = div(%0, %1) : i32[3]\n  output %2\n}\n",
		bind_div0);
	expect_fault("moeir 1\nlayer @s dtype=f32 {\n"
		     "  %0 = input \"x\" : f32[3, 2]\n  %1 = input \"i\" : i32[2]\n  %2 = input \"s\" : f32[2, 2]\n"
		     "  %3 = scatter(%0, %1, %2) : f32[3, 2]\n  output %3\n}\n",
		bind_scatter_bad);
	/* the same bad index in a row the valid mask skips: no fault, row is 0 */
	for (int eng = 0; eng < 2; eng++) {
		moe_ctx *ctx = moe_ctx_new(NULL, NULL);
		moe_module *m = parse(ctx, "moeir 1\nlayer @gm dtype=f32 {\n"
					   "  %0 = input \"x\" : f32[3, 2]\n  %1 = input \"i\" : i32[2]\n"
					   "  %2 = input \"n\" : i32[]\n"
					   "  %3 = gather(%0, %1) valid(%2) {axis=0} : f32[2, 2]\n  output %3\n}\n");
		moe_tensor_map *bind = bind_gather_masked(ctx);
		moe_tensor *out[1] = {0};
		assert_int_equal(moe_host_run(ctx, moe_module_graph(m, 0), bind, eng ? MOE_HOST_C : MOE_HOST_LLVM, 1, out, NULL),
			MOE_OK);
		const float *o = out[0]->data;
		assert_true(o[0] == 3 && o[1] == 4 && o[2] == 0 && o[3] == 0);
		moe_tensor_free(ctx, out[0]);
		moe_tensor_map_free(bind);
		moe_module_free(m);
		moe_ctx_free(ctx);
	}
}

static void test_rejects(void **state)
{
	(void)state;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(ctx, "moeir 1\nlayer @r dtype=f32 {\n"
				   "  %0 = input \"x\" : f32[3, 8]\n  %1 = const {value=2} : i32[1]\n"
				   "  %2 = all_to_all(%0, %1) {ep=1, rows=4} : f32[4, 8]\n  output %2\n}\n");
	char *c = NULL;
	assert_int_equal(moe_emit_c_string(ctx, moe_module_graph(m, 0), &c), MOE_ERR_INVALID);
	assert_null(c);
	assert_true(moe_error_count(ctx) == 1);
	const char *msg;
	moe_diag_get(ctx, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "run the host pipeline first"));
	moe_tensor *out[1];
	assert_int_equal(moe_host_run(ctx, moe_module_graph(m, 0), NULL, MOE_HOST_LLVM, 1, out, NULL), MOE_ERR_INVALID);
	moe_module_free(m);
	/* a missing binding is a diagnostic */
	moe_diag_clear(ctx);
	m = parse(ctx, "moeir 1\nlayer @r dtype=f32 {\n  %0 = input \"x\" : f32[3]\n  %1 = neg(%0) : f32[3]\n"
		       "  output %1\n}\n");
	moe_tensor_map *bind = moe_tensor_map_new(ctx);
	assert_int_equal(moe_host_run(ctx, moe_module_graph(m, 0), bind, MOE_HOST_LLVM, 1, out, NULL), MOE_ERR_INVALID);
	assert_true(moe_error_count(ctx) == 1);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

static const char *const block_layer = "moeir 1\n"
				       "layer @blocks dtype=bf16 {\n"
				       "  attrs grid_blocks_max=6\n"
				       "  %0 = input \"x\" : bf16[6, 4, 16]\n"
				       "  %1 = input \"w\" : bf16[6, 8, 16]\n"
				       "  %2 = input \"rows\" : i32[6]\n"
				       "  %3 = einsum(%0, %1) valid(%2) {eq=\"gbd,gfd->gbf\"} : bf16[6, 4, 8]\n"
				       "  %4 = input \"u\" : bf16[6, 16, 8]\n"
				       "  %5 = einsum(%3, %4) valid(%2) {eq=\"gbf,gdf->gbd\"} : bf16[6, 4, 16]\n"
				       "  output %5\n"
				       "}\n";

static void test_block_stats(void **state)
{
	(void)state;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(ctx, block_layer);
	moe_graph *g = moe_module_graph(m, 0);
	moe_tensor_map *bind = NULL;
	assert_int_equal(ir_interp_random_bindings(ctx, g, 7, &bind), MOE_OK);
	int32_t rows[6] = {4, 0, 2, 0, 0, 7};
	moe_tensor_map_set(bind, "rows", tensor(ctx, MOE_I32, 1, (int64_t[]){6}, rows));
	for (int eng = 0; eng < 2; eng++) {
		moe_tensor *out[1] = {0};
		moe_host_stats st;
		assert_int_equal(moe_host_run(ctx, g, bind, eng ? MOE_HOST_C : MOE_HOST_LLVM, 3, out, &st), MOE_OK);
		assert_int_equal(st.blocks_executed, 3);
		assert_int_equal(st.blocks_skipped, 3);
		assert_int_equal(st.rows_executed, 4 + 2 + 4);
		assert_int_equal(st.grid_blocks_max, 6);
		assert_int_equal(st.repeat, 3);
		assert_true(st.compute_seconds >= 0);
		/* skipped blocks are zero */
		const uint16_t *o = out[0]->data;
		for (int i = 4 * 16; i < 2 * 4 * 16; i++)
			assert_int_equal(o[i], 0);
		moe_tensor **ref = NULL;
		assert_int_equal(ir_interp_run_alloc(ctx, g, bind, &ref), MOE_OK);
		assert_true(same_bits(ref[0], out[0], "blocks", 0));
		ir_interp_free_outputs(ctx, g, ref);
		moe_tensor_free(ctx, out[0]);
	}
	size_t ws = 0;
	assert_int_equal(moe_host_workspace_size(ctx, g, &ws), MOE_OK);
	assert_true(ws > 0);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

static int run_cmd(const char *cmd)
{
	int rc = system(cmd);
	return rc;
}

static int have(const char *tool)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
	return system(cmd) == 0;
}

/* Every op of the tests above, emitted as C, compiles warning-free. */
static void test_emitted_c_compiles(void **state)
{
	(void)state;
	const char *texts[] = {block_layer,
		"moeir 1\nlayer @all dtype=f32 {\n"
		"  %0 = input \"x\" : f32[6, 5]\n  %1 = input \"i\" : i32[3, 2]\n"
		"  %2 = gather(%0, %1) {axis=0} : f32[3, 2, 5]\n  %3 = input \"k\" : i32[6, 3]\n"
		"  %4 = take_along(%0, %3) {axis=1} : f32[6, 3]\n  %5 = input \"s\" : i32[4]\n"
		"  %6 = input \"src\" : f32[4, 5]\n  %7 = scatter(%0, %5, %6) {mode=\"add\"} : f32[6, 5]\n"
		"  %8 = softmax(%0) : f32[6, 5]\n  %9 = cumsum(%0) {exclusive=1} : f32[6, 5]\n"
		"  %10 = cast(%1) {to=\"bf16\"} : bf16[3, 2]\n  %11 = div(%1, %1) : i32[3, 2]\n"
		"  %12 = sar(%1, %1) : i32[3, 2]\n  %13 = bitcast(%0) {to=\"i32\"} : i32[6, 5]\n"
		"  %14 = filter(%3, %3) : i32[6, 3]\n  %15 = one_hot(%5) {n=4} : i32[4, 4]\n"
		"  %16 = erf(%0) : f32[6, 5]\n  %17 = const {value=inf} : f32[]\n  %18 = min(%0, %17) : f32[6, 5]\n"
		"  %19 = einsum(%0, %0) {eq=\"ab,cb->ac\"} : f32[6, 6]\n"
		"  output %2, %4, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %18, %19\n}\n"};
	char dir[] = "/tmp/moec-cgen-test-XXXXXX";
	assert_non_null(mkdtemp(dir));
	const char *ccs[] = {"gcc", "clang"};
	for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
		moe_ctx *ctx = moe_ctx_new(NULL, NULL);
		moe_module *m = parse(ctx, texts[t]);
		char path[300], cmd[1024];
		snprintf(path, sizeof path, "%s/layer%zu.c", dir, t);
		assert_int_equal(moe_emit_c_file(ctx, moe_module_graph(m, 0), path), MOE_OK);
		for (size_t c = 0; c < 2; c++) {
			if (!have(ccs[c])) {
				fprintf(stderr, "note: %s not found, skipped\n", ccs[c]);
				continue;
			}
			snprintf(cmd, sizeof cmd,
				"%s -std=c11 -Wall -Wextra -Werror -pedantic -O1 -ffp-contract=off -c -o %s/layer%zu_%zu.o %s", ccs[c],
				dir, t, c, path);
			assert_int_equal(run_cmd(cmd), 0);
			snprintf(cmd, sizeof cmd, "%s/layer%zu_%zu.o", dir, t, c);
			unlink(cmd);
		}
		unlink(path);
		moe_module_free(m);
		moe_ctx_free(ctx);
	}
	rmdir(dir);
}

static void test_llvm_files(void **state)
{
	(void)state;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(ctx, block_layer);
	char dir[] = "/tmp/moec-cgen-llvm-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char obj[300], ll[300];
	snprintf(obj, sizeof obj, "%s/blocks.o", dir);
	snprintf(ll, sizeof ll, "%s/blocks.ll", dir);
	assert_int_equal(moe_emit_object(ctx, moe_module_graph(m, 0), obj), MOE_OK);
	assert_int_equal(moe_emit_llvm_ir(ctx, moe_module_graph(m, 0), ll), MOE_OK);
	print_diags(ctx);
	struct stat sb;
	assert_int_equal(stat(obj, &sb), 0);
	assert_true(sb.st_size > 0);
	assert_int_equal(stat(ll, &sb), 0);
	assert_true(sb.st_size > 0);
	FILE *f = fopen(ll, "r");
	assert_non_null(f);
	char line[512];
	int found = 0;
	while (fgets(line, sizeof line, f))
		found |= strstr(line, "@moe_blocks(") != NULL;
	fclose(f);
	assert_true(found);
	/* an unwritable path is a diagnostic, not a crash */
	assert_int_equal(moe_emit_object(ctx, moe_module_graph(m, 0), "/nonexistent-dir/x.o"), MOE_ERR_IO);
	unlink(obj);
	unlink(ll);
	rmdir(dir);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unary),
		cmocka_unit_test(test_binary_broadcast),
		cmocka_unit_test(test_nan_operands),
		cmocka_unit_test(test_nan_sums),
		cmocka_unit_test(test_cast_bitcast_const_iota),
		cmocka_unit_test(test_reductions),
		cmocka_unit_test(test_einsum),
		cmocka_unit_test(test_fused_gather_dot),
		cmocka_unit_test(test_valid_masks),
		cmocka_unit_test(test_data_movement),
		cmocka_unit_test(test_faults),
		cmocka_unit_test(test_rejects),
		cmocka_unit_test(test_block_stats),
		cmocka_unit_test(test_emitted_c_compiles),
		cmocka_unit_test(test_llvm_files),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
