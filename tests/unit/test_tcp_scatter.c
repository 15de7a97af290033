/* scatter with mode=add on the TCP simulator (backend-tcp/compiler/recipe_route.c)
 * against hand-computed values, which the reference interpreter must give too
 * (docs/ir.md: base first, then the rows of src in index order, floats summed
 * in f32 and rounded to the node dtype once; i32 wraps). The values are chosen
 * so that another order, or rounding after each addition, gives another
 * result. An index outside the destination's rows is a run-time fault. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moec/ir.h"
#include "moec/passes.h"
#include "moec/runtime.h"
#include "moec/tcp.h"

static moe_tensor *tensor(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape, const void *data)
{
	moe_tensor *x = moe_tensor_new(ctx, t, rank, shape);
	assert_non_null(x);
	memcpy(x->data, data, x->nbytes);
	return x;
}

/* Runs the one-output layer on TCP (use_tcp) or the interpreter. */
static moe_status run(moe_ctx *ctx, const char *text, const moe_tensor_map *b, bool use_tcp, moe_tensor **out)
{
	moe_module *m = moe_module_parse_text(ctx, "scatter.moeir", text, strlen(text));
	assert_non_null(m);
	moe_status st;
	if (!use_tcp) {
		st = moe_interp_run(ctx, moe_module_graph(m, 0), b, out);
	} else {
		/* the default compiler (the schedule compiler, recipe_route.c) */
		assert_int_equal(moe_run_pipeline_text(ctx, "tcp", m, NULL), MOE_OK);
		moe_tcp_program *p = moe_tcp_compile(ctx, moe_module_graph(m, 0), NULL);
		if (!p)
			moe_diag_print(ctx, stderr);
		assert_non_null(p);
		moe_tcp_run_opts ro = {0};
		moe_tcp_stats stats;
		st = moe_tcp_run(ctx, p, b, &ro, out, &stats);
		moe_tcp_program_free(p);
	}
	moe_module_free(m);
	return st;
}

static void expect_bytes(moe_ctx *ctx, const char *text, moe_tensor_map *b, const void *want, size_t nbytes)
{
	for (int e = 0; e < 2; e++) {
		moe_tensor *out[1] = {NULL};
		moe_status st = run(ctx, text, b, e == 1, out);
		if (st != MOE_OK)
			moe_diag_print(ctx, stderr);
		assert_int_equal(st, MOE_OK);
		assert_int_equal(out[0]->nbytes, nbytes);
		if (memcmp(out[0]->data, want, nbytes))
			fail_msg("%s differs from the hand-computed result", e ? "tcp" : "interp");
		moe_tensor_free(ctx, out[0]);
	}
}

/* bf16: base 1 plus three times 2^-8 (half a bf16 ulp at 1). Rounding after
 * each addition would stay at 1 (ties to even); the f32 sum 1 + 3 x 2^-8 lies
 * half way between 1 + 2^-7 and 1 + 2^-6 and rounds once to the even 1 + 2^-6.
 * Row 1 gets nothing, row 2 gets -1 + 0.5 on a base of 2 -> 1.5. */
static void test_bf16_rounds_once(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	uint16_t base[6] = {0x3f80, 0x3f80, 0x4040, 0x4040, 0x4000, 0x4000}; /* 1 1 3 3 2 2 */
	uint16_t src[10] = {0x3b80, 0x3b80, 0xbf80, 0xbf80, 0x3b80, 0x3b80, 0x3f00, 0x3f00, 0x3b80,
		0x3b80}; /* 2^-8, -1, 2^-8, 0.5, 2^-8 */
	int32_t idx[5] = {0, 2, 0, 2, 0};
	moe_tensor_map_set(b, "x", tensor(ctx, MOE_BF16, 2, (int64_t[]){3, 2}, base));
	moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){5}, idx));
	moe_tensor_map_set(b, "s", tensor(ctx, MOE_BF16, 2, (int64_t[]){5, 2}, src));
	uint16_t want[6] = {0x3f82, 0x3f82, 0x4040, 0x4040, 0x3fc0, 0x3fc0}; /* 1.015625, 3, 1.5 */
	expect_bytes(ctx, "moeir 1\nlayer @s dtype=bf16 {\n  %0 = input \"x\" : bf16[3, 2]\n  %1 = input \"i\" : i32[5]\n"
		     "  %2 = input \"s\" : bf16[5, 2]\n  %3 = scatter(%0, %1, %2) {mode=\"add\"} : bf16[3, 2]\n"
		     "  output %3\n}\n",
		b, want, sizeof want);
	moe_tensor_map_free(b);
	moe_ctx_free(ctx);
}

/* f32, in index order: (1 + 2^24) rounds to 2^24 (ties to even), then
 * - 2^24 gives 0; summing the sources first would give 1. A zero base (a
 * constant) with -0 added stays +0 (0 + -0 = +0). */
static void test_f32_index_order(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	float base[2] = {1.0f, 5.0f}, src[3] = {16777216.0f, -16777216.0f, 2.5f};
	int32_t idx[3] = {0, 0, 1};
	moe_tensor_map_set(b, "x", tensor(ctx, MOE_F32, 2, (int64_t[]){2, 1}, base));
	moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){3}, idx));
	moe_tensor_map_set(b, "s", tensor(ctx, MOE_F32, 2, (int64_t[]){3, 1}, src));
	float want[2] = {0.0f, 7.5f};
	expect_bytes(ctx, "moeir 1\nlayer @s dtype=f32 {\n  %0 = input \"x\" : f32[2, 1]\n  %1 = input \"i\" : i32[3]\n"
		     "  %2 = input \"s\" : f32[3, 1]\n  %3 = scatter(%0, %1, %2) {mode=\"add\"} : f32[2, 1]\n"
		     "  output %3\n}\n",
		b, want, sizeof want);
	moe_tensor_map_free(b);

	b = moe_tensor_map_new(ctx);
	float z[2] = {-0.0f, 4.0f};
	int32_t i2[2] = {0, 1};
	moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){2}, i2));
	moe_tensor_map_set(b, "s", tensor(ctx, MOE_F32, 2, (int64_t[]){2, 1}, z));
	float want0[3] = {0.0f, 4.0f, 0.0f};
	expect_bytes(ctx, "moeir 1\nlayer @s dtype=f32 {\n  %0 = const {value=0} : f32[3, 1]\n  %1 = input \"i\" : i32[2]\n"
		     "  %2 = input \"s\" : f32[2, 1]\n  %3 = scatter(%0, %1, %2) {mode=\"add\"} : f32[3, 1]\n"
		     "  output %3\n}\n",
		b, want0, sizeof want0);
	moe_tensor_map_free(b);
	moe_ctx_free(ctx);
}

/* i32 wraps: INT32_MAX + 1 = INT32_MIN; a duplicate index adds twice. */
static void test_i32_wraps(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	int32_t base[2] = {INT32_MAX, 10}, src[3] = {1, 7, 7}, idx[3] = {0, 1, 1};
	moe_tensor_map_set(b, "x", tensor(ctx, MOE_I32, 1, (int64_t[]){2}, base));
	moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){3}, idx));
	moe_tensor_map_set(b, "s", tensor(ctx, MOE_I32, 1, (int64_t[]){3}, src));
	int32_t want[2] = {INT32_MIN, 24};
	expect_bytes(ctx, "moeir 1\nlayer @s dtype=f32 {\n  %0 = input \"x\" : i32[2]\n  %1 = input \"i\" : i32[3]\n"
		     "  %2 = input \"s\" : i32[3]\n  %3 = scatter(%0, %1, %2) {mode=\"add\"} : i32[2]\n"
		     "  output %3\n}\n",
		b, want, sizeof want);
	moe_tensor_map_free(b);
	moe_ctx_free(ctx);
}

/* NaN: a NaN base, a NaN source and inf + -inf give NaN where the reference
 * does; TCP's float ALU returns only the canonical NaN 0x7fc00000
 * (docs/tcp-isa.md, assumption A9), the reference keeps the host's NaN
 * (docs/abi.md, "NaN results": sums agree in NaN-ness). The other elements
 * are bit for bit: 3 + 1 + 2 = 6, -0 + -0 stays -0, -0 + 5 = 5. */
static void test_nan_as_reference(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	const float inf = __builtin_inff(), nan = __builtin_nanf("");
	float base[6] = {nan, 1, 2, 3, -0.0f, -0.0f}, src[8] = {1, nan, inf, 1, -inf, 2, -0.0f, 5};
	int32_t idx[4] = {0, 1, 1, 2};
	moe_tensor_map_set(b, "x", tensor(ctx, MOE_F32, 2, (int64_t[]){3, 2}, base));
	moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){4}, idx));
	moe_tensor_map_set(b, "s", tensor(ctx, MOE_F32, 2, (int64_t[]){4, 2}, src));
	const char *text = "moeir 1\nlayer @s dtype=f32 {\n  %0 = input \"x\" : f32[3, 2]\n  %1 = input \"i\" : i32[4]\n"
			   "  %2 = input \"s\" : f32[4, 2]\n  %3 = scatter(%0, %1, %2) {mode=\"add\"} : f32[3, 2]\n"
			   "  output %3\n}\n";
	/* row 0: nan + 1, 1 + nan; row 1: 2 + inf - inf, 3 + 1 + 2; row 2: -0 + -0, -0 + 5 */
	const bool want_nan[6] = {true, true, true, false, false, false};
	const float want[6] = {0, 0, 0, 6, -0.0f, 5};
	moe_tensor *out[2] = {NULL, NULL};
	for (int e = 0; e < 2; e++) {
		moe_status s = run(ctx, text, b, e == 1, &out[e]);
		if (s != MOE_OK)
			moe_diag_print(ctx, stderr);
		assert_int_equal(s, MOE_OK);
	}
	const float *ref = out[0]->data, *tcp = out[1]->data;
	for (int k = 0; k < 6; k++) {
		uint32_t bits;
		memcpy(&bits, &tcp[k], 4);
		assert_int_equal(ref[k] != ref[k], want_nan[k]);
		assert_int_equal(tcp[k] != tcp[k], want_nan[k]);
		if (want_nan[k]) {
			assert_int_equal(bits, 0x7fc00000u);
			continue;
		}
		assert_memory_equal(&ref[k], &want[k], 4);
		assert_memory_equal(&tcp[k], &want[k], 4);
	}
	moe_tensor_free(ctx, out[0]);
	moe_tensor_free(ctx, out[1]);
	moe_tensor_map_free(b);
	moe_ctx_free(ctx);
}

/* An index outside [0, rows) is a run-time fault naming the instruction,
 * never a write outside the result. */
static void test_index_out_of_range_faults(void **st)
{
	(void)st;
	const int32_t bad[2][2] = {{1, 3}, {-1, 0}};
	for (int k = 0; k < 2; k++) {
		moe_ctx *ctx = moe_ctx_new(NULL, NULL);
		moe_tensor_map *b = moe_tensor_map_new(ctx);
		float base[6] = {1, 2, 3, 4, 5, 6}, src[4] = {1, 1, 1, 1};
		moe_tensor_map_set(b, "x", tensor(ctx, MOE_F32, 2, (int64_t[]){3, 2}, base));
		moe_tensor_map_set(b, "i", tensor(ctx, MOE_I32, 1, (int64_t[]){2}, bad[k]));
		moe_tensor_map_set(b, "s", tensor(ctx, MOE_F32, 2, (int64_t[]){2, 2}, src));
		moe_tensor *out[1] = {NULL};
		moe_status s = run(ctx,
			"moeir 1\nlayer @s dtype=f32 {\n  %0 = input \"x\" : f32[3, 2]\n  %1 = input \"i\" : i32[2]\n"
			"  %2 = input \"s\" : f32[2, 2]\n  %3 = scatter(%0, %1, %2) {mode=\"add\"} : f32[3, 2]\n"
			"  output %3\n}\n",
			b, true, out);
		assert_int_equal(s, MOE_ERR_RUNTIME);
		assert_null(out[0]);
		assert_true(moe_error_count(ctx) > 0);
		moe_tensor_map_free(b);
		moe_ctx_free(ctx);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bf16_rounds_once),
		cmocka_unit_test(test_f32_index_order),
		cmocka_unit_test(test_i32_wraps),
		cmocka_unit_test(test_nan_as_reference),
		cmocka_unit_test(test_index_out_of_range_faults),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
