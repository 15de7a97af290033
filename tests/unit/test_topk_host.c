/* The host backend's native topk (backend-c/lower_topk.c) against the
 * reference interpreter and the semantics of docs/semantics.md: ties go to
 * the lower index, NaN ranks above +inf (NaNs among themselves by index),
 * -0 == +0. Scores of f32, bf16 and i32, 600 rows (rows x E x K above the
 * parallel-loop threshold, so the rows run on the thread pool), rows written
 * by hand with their expected indices, the rest random with many ties, NaNs,
 * zeros and infinities. Every engine (LLVM on 1, 2 and 3 threads, LLVM with
 * portable kernels, the C engine) must give bitwise the interpreter's
 * indices, and the hand rows the indices worked out below. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/backend.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "moec/runtime.h"
#include "host_layer.h"

enum { ROWS = 600, E = 32, K = 4, HAND = 5 };

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t next32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

/* hand rows (first 8 scores; the other E - 8 are -inf, or INT32_MIN) and
 * the top 4 by the rules above */
static const float hand[HAND][8] = {
	{1, 3, 3, 2, 0, 0, 0, 0},
	{1, NAN, 5, NAN, 0, 0, 0, 0},
	{-0.0f, 0.0f, -1, -0.0f, -2, -3, -4, -5},
	{-INFINITY, INFINITY, 0, NAN, -1, -2, -3, -4},
	{2, 2, 2, 2, 2, 2, 2, 2},
};
static const int32_t hand_idx[HAND][K] = {
	{1, 2, 3, 0},
	{1, 3, 2, 0},
	{0, 1, 3, 2}, /* +-0 tie by index, then -1 (index 2) */
	{3, 1, 2, 4},
	{0, 1, 2, 3},
};

/* a random score from a small set, so that ties are frequent */
static float rand_score(void)
{
	static const float pool[] = {0.5f, 0.25f, -0.25f, 1.0f, 0.0f, -0.0f, 3.0f, -7.0f};
	uint32_t r = next32() % 64;
	if (r == 0)
		return NAN;
	if (r == 1)
		return INFINITY;
	if (r == 2)
		return -INFINITY;
	if (r < 40)
		return pool[r % 8];
	return (float)(int)(next32() % 2001 - 1000) / 64.0f;
}

static moe_tensor *scores(moe_ctx *c, moe_dtype t)
{
	int64_t shape[2] = {ROWS, E};
	moe_tensor *x = moe_tensor_new(c, t, 2, shape);
	assert_non_null(x);
	for (int64_t r = 0; r < ROWS; r++)
		for (int64_t j = 0; j < E; j++) {
			float v = r < HAND ? (j < 8 ? hand[r][j] : -INFINITY) : rand_score();
			int64_t i = r * E + j;
			if (t == MOE_F32)
				((float *)x->data)[i] = v;
			else if (t == MOE_BF16)
				((uint16_t *)x->data)[i] = moe_f32_to_bf16(v);
			else /* i32: the hand rows' ordering is kept by 16 * value, NaN -> INT32_MAX */
				((int32_t *)x->data)[i] = isnan(v) ? INT32_MAX : isinf(v) ? (v > 0 ? INT32_MAX - 1 : INT32_MIN) :
					(int32_t)(v * 16.0f);
		}
	return x;
}

static moe_graph *layer(moe_ctx *c, const char *dtype, moe_module **mod)
{
	char text[256];
	snprintf(text, sizeof text,
		"layer tk {\n  dim T = %d, E = %d, K = %d\n  input x : %s[T, E]\n  idx = topk(x, K)\n  output idx\n}\n",
		ROWS, E, K, dtype);
	return host_layer(c, "tk.moe", text, strlen(text), NULL, mod);
}

static moe_tensor *run_host(moe_ctx *c, moe_graph *g, moe_tensor_map *b, moe_host_engine en, int threads, int portable)
{
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.engine = en;
	o.threads = threads;
	o.portable = portable;
	o.no_cache = 1;
	moe_tensor *out[1] = {NULL};
	moe_status s = moe_host_run_opts(c, g, b, &o, out, NULL);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	return out[0];
}

static void topk_case(moe_dtype t, const char *name)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_graph *g = layer(c, name, &m);
	moe_tensor_map *b = moe_tensor_map_new(c);
	assert_int_equal(moe_tensor_map_set(b, "x", scores(c, t)), MOE_OK);
	moe_tensor *ref[1] = {NULL};
	assert_int_equal(moe_interp_run(c, g, b, ref), MOE_OK);
	const int32_t *ri = ref[0]->data;
	for (int r = 0; r < HAND; r++)
		for (int s = 0; s < K; s++)
			if (ri[r * K + s] != hand_idx[r][s])
				fail_msg("%s: interpreter row %d slot %d: %d, want %d", name, r, s, ri[r * K + s], hand_idx[r][s]);
	moe_tensor *got[5] = {run_host(c, g, b, MOE_HOST_LLVM, 1, 0), run_host(c, g, b, MOE_HOST_LLVM, 2, 0),
		run_host(c, g, b, MOE_HOST_LLVM, 3, 0), run_host(c, g, b, MOE_HOST_LLVM, 2, 1),
		run_host(c, g, b, MOE_HOST_C, 0, 0)};
	static const char *what[5] = {"llvm 1 thread", "llvm 2 threads", "llvm 3 threads", "llvm portable", "c engine"};
	for (int i = 0; i < 5; i++) {
		assert_int_equal(got[i]->nbytes, ref[0]->nbytes);
		if (memcmp(got[i]->data, ref[0]->data, ref[0]->nbytes))
			fail_msg("%s: %s differs from the interpreter", name, what[i]);
		moe_tensor_free(c, got[i]);
	}
	moe_tensor_free(c, ref[0]);
	moe_tensor_map_free(b);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_topk_f32(void **state)
{
	(void)state;
	topk_case(MOE_F32, "f32");
}

static void test_topk_bf16(void **state)
{
	(void)state;
	topk_case(MOE_BF16, "bf16");
}

static void test_topk_i32(void **state)
{
	(void)state;
	topk_case(MOE_I32, "i32");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_topk_f32),
		cmocka_unit_test(test_topk_bf16),
		cmocka_unit_test(test_topk_i32),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
