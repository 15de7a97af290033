/* Expert parallelism (docs/expert-parallel.md): the receive bound and the
 * local grid bound against brute force, and simulated N-device runs of the
 * expert-parallel pass's programs against the one-device program, bit for
 * bit, on random layers, placements and token counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interp/interp.h"
#include "ir/ir.h"
#include "moec/passes.h"
#include "grid_brute.h"
#include "graph_fx.h"

/* ---- bounds ---- */

/* Over every reachable count vector: the most rows and blocks that land on
 * the experts [lo, hi) of one device. */
static void brute(int T, int K, int E, int B, int lo, int hi, int64_t *rows, int64_t *blocks)
{
	int c[8] = {0};
	*rows = *blocks = 0;
	for (;;) {
		int sum = 0;
		for (int e = 0; e < E; e++)
			sum += c[e];
		if (sum == T * K && feasible(T, K, E, c)) {
			int64_t r = 0, g = 0;
			for (int e = lo; e < hi; e++)
				r += c[e], g += (c[e] + B - 1) / B;
			if (r > *rows)
				*rows = r;
			if (g > *blocks)
				*blocks = g;
		}
		int e = 0;
		while (e < E && ++c[e] > T)
			c[e++] = 0;
		if (e == E)
			break;
	}
}

static void test_bounds_equal_brute_force(void **st)
{
	(void)st;
	int cases = 0;
	for (int T = 1; T <= 4; T++)
		for (int E = 2; E <= 6; E++)
			for (int K = 1; K <= E && K <= 3; K++)
				for (int B = 1; B <= 3; B++)
					for (int lo = 0; lo < E; lo++)
						for (int hi = lo + 1; hi <= E; hi++) {
							if (lo > 0 && hi < E)
								continue; /* by symmetry a device's set is any set of its size */
							int64_t rows, blocks, Ed = hi - lo;
							brute(T, K, E, B, lo, hi, &rows, &blocks);
							if (rows != moe_ep_recv_rows_max(T, K, Ed) ||
								blocks != moe_ep_grid_blocks_max(T, K, Ed, B))
								fail_msg("T=%d K=%d E=%d B=%d experts [%d, %d): brute force %lld rows %lld "
									 "blocks, bounds %lld and %lld", T, K, E, B, lo, hi, (long long)rows,
									(long long)blocks, (long long)moe_ep_recv_rows_max(T, K, Ed),
									(long long)moe_ep_grid_blocks_max(T, K, Ed, B));
							cases++;
						}
	assert_true(cases > 500);
}

/* ---- simulated runs ---- */

typedef struct rng {
	uint64_t s;
} rng;

static uint32_t rnd(rng *r, uint32_t n)
{
	r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(r->s >> 33) % n;
}

typedef struct cfg {
	int64_t T, D, E, K, F, B;
	moe_dtype t;
	const char *act;
	int bias, on_input;
	char placement[64];
} cfg;

/* The layer experts(x, idx, w, ...) with `rows` tokens. */
static moe_module *build(moe_ctx *ctx, const cfg *c, int64_t rows)
{
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, "ep");
	moe_graph_set_dtype(g, c->t);
	moe_id a[EXP_NSLOTS];
	bool gated = strcmp(c->act, "none") != 0;
	a[EXP_X] = leaf(g, MOE_OP_INPUT, c->t, 2, (int64_t[]){rows, c->D}, "x");
	a[EXP_IDX] = leaf(g, MOE_OP_INPUT, MOE_I32, 2, (int64_t[]){rows, c->K}, "idx");
	a[EXP_W] = leaf(g, MOE_OP_INPUT, c->t, 2, (int64_t[]){rows, c->K}, "w");
	a[EXP_GATE] = gated ? leaf(g, MOE_OP_WEIGHT, c->t, 3, (int64_t[]){c->E, c->F, c->D}, "gate") : MOE_NONE;
	a[EXP_UP] = leaf(g, MOE_OP_WEIGHT, c->t, 3, (int64_t[]){c->E, c->F, c->D}, "up");
	a[EXP_DOWN] = leaf(g, MOE_OP_WEIGHT, c->t, 3, (int64_t[]){c->E, c->D, c->F}, "down");
	a[EXP_B_GATE] = gated && c->bias ? leaf(g, MOE_OP_WEIGHT, c->t, 2, (int64_t[]){c->E, c->F}, "bg") : MOE_NONE;
	a[EXP_B_UP] = c->bias ? leaf(g, MOE_OP_WEIGHT, c->t, 2, (int64_t[]){c->E, c->F}, "bu") : MOE_NONE;
	a[EXP_B_DOWN] = c->bias ? leaf(g, MOE_OP_WEIGHT, c->t, 2, (int64_t[]){c->E, c->D}, "bd") : MOE_NONE;
	moe_id ex = moe_node_new(g, MOE_OP_EXPERTS, a, EXP_NSLOTS, moe_loc_none());
	moe_node_set_str(g, ex, "act", c->act);
	moe_node_set_int(g, ex, "block", c->B);
	moe_node_set_str(g, ex, "weight_on", c->on_input ? "input" : "output");
	assert_int_equal(moe_node_infer(g, ex), MOE_OK);
	moe_graph_add_output(g, ex);
	return m;
}

static void lower(moe_ctx *ctx, moe_module *m, const char *pipeline)
{
	if (moe_run_pipeline_text(ctx, pipeline, m, &(moe_run_opts){.verify = 1}) != MOE_OK) {
		moe_diag_print(ctx, stderr);
		fail_msg("pipeline %s failed", pipeline);
	}
}

/* Rows [first, first + n) of t (one zero row when n = 0). */
static moe_tensor *rows_of(moe_ctx *ctx, const moe_tensor *t, int64_t first, int64_t n)
{
	int64_t s[2] = {n ? n : 1, t->shape[1]};
	moe_tensor *r = moe_tensor_new(ctx, t->dtype, 2, s);
	size_t row = t->nbytes / (size_t)t->shape[0];
	if (n)
		memcpy(r->data, (const char *)t->data + (size_t)first * row, (size_t)n * row);
	return r;
}

/* Device bindings: its rows of the inputs, its experts' rows of the weights. */
static moe_tensor_map *device_bind(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *all, int64_t first,
	int64_t n)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++) {
		const ir_node *nd = N(g, i);
		const moe_tensor *t = moe_tensor_map_get(all, nd->name ? nd->name : "");
		if (nd->op == MOE_OP_INPUT) {
			moe_tensor_map_set(b, nd->name, rows_of(ctx, t, first, n));
		} else if (nd->op == MOE_OP_WEIGHT) {
			const int64_t *map;
			int k = ir_attr_ints(nd, "ep_experts", &map);
			assert_true(k == nd->shape[0]);
			moe_tensor *w = moe_tensor_new(ctx, t->dtype, t->rank, nd->shape);
			size_t row = t->nbytes / (size_t)t->shape[0];
			for (int e = 0; e < k; e++)
				memcpy((char *)w->data + (size_t)e * row, (const char *)t->data + (size_t)map[e] * row, row);
			moe_tensor_map_set(b, nd->name, w);
		}
	}
	return b;
}

static void random_cfg(rng *r, cfg *c, int *N)
{
	static const char *const acts[] = {"swiglu", "geglu", "gpt_oss", "none"};
	c->E = 2 + rnd(r, 6);
	c->K = 1 + rnd(r, (uint32_t)(c->E < 3 ? c->E : 3));
	c->T = 1 + rnd(r, 9);
	c->D = 2 + rnd(r, 5);
	c->F = 2 + rnd(r, 5);
	c->B = 1 + rnd(r, 4);
	c->t = rnd(r, 2) ? MOE_F32 : MOE_BF16;
	c->act = acts[rnd(r, 4)];
	c->bias = (int)rnd(r, 2);
	c->on_input = (int)rnd(r, 3) == 0;
	*N = 2 + (int)rnd(r, (uint32_t)(c->E - 1 < 3 ? c->E - 1 : 3));
	c->placement[0] = 0;
	if (rnd(r, 2)) { /* a random placement in which every device holds an expert */
		size_t at = 0;
		for (int64_t e = 0; e < c->E; e++) {
			int dev = e < *N ? (int)e : (int)rnd(r, (uint32_t)*N);
			at += (size_t)snprintf(c->placement + at, sizeof c->placement - at, "%s%d", e ? "." : "", dev);
		}
	}
}

static void check_case(uint64_t seed)
{
	rng r = {seed * 0x9e3779b97f4a7c15ull};
	cfg c;
	int N;
	random_cfg(&r, &c, &N);
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *one = build(ctx, &c, c.T);
	moe_tensor_map *all = NULL;
	assert_int_equal(ir_interp_random_bindings(ctx, moe_module_graph(one, 0), seed, &all), MOE_OK);
	lower(ctx, one, "host");
	moe_tensor *want = NULL;
	assert_int_equal(moe_interp_run(ctx, moe_module_graph(one, 0), all, &want), MOE_OK);

	moe_module *dev[8];
	const moe_graph *g[8];
	moe_tensor_map *bind[8];
	moe_tensor *outv[8] = {0}, **out[8];
	int64_t q = c.T / N;
	for (int d = 0; d < N; d++) {
		int64_t n = d < N - 1 ? q : c.T - q * (N - 1);
		dev[d] = build(ctx, &c, n ? n : 1);
		char pipe[512];
		snprintf(pipe, sizeof pipe, "infer-shapes,canonicalize,expert-parallel{ep=%d,rank=%d,tokens=%lld%s%s},"
			"blockwise-dispatch,grid-bound,canonicalize,cse,dce", N, d, (long long)c.T,
			c.placement[0] ? ",placement=" : "", c.placement);
		lower(ctx, dev[d], pipe);
		g[d] = moe_module_graph(dev[d], 0);
		bind[d] = device_bind(ctx, g[d], all, q * d, n);
		out[d] = &outv[d];
	}
	if (moe_ep_sim_run(ctx, N, g, (const moe_tensor_map *const *)bind, out) != MOE_OK) {
		moe_diag_print(ctx, stderr);
		fail_msg("seed %llu: the simulated run failed", (unsigned long long)seed);
	}
	size_t row = want->nbytes / (size_t)c.T, at = 0;
	for (int d = 0; d < N; d++) {
		int64_t n = d < N - 1 ? q : c.T - q * (N - 1);
		if (memcmp((const char *)want->data + at, outv[d]->data, (size_t)n * row))
			fail_msg("seed %llu (T=%lld E=%lld K=%lld B=%lld %s %s ep=%d placement '%s'): device %d's rows differ "
				 "from the one-device output", (unsigned long long)seed, (long long)c.T, (long long)c.E,
				(long long)c.K, (long long)c.B, moe_dtype_name(c.t), c.act, N, c.placement, d);
		at += (size_t)n * row;
		moe_tensor_free(ctx, outv[d]);
		moe_tensor_map_free(bind[d]);
		moe_module_free(dev[d]);
	}
	moe_tensor_free(ctx, want);
	moe_tensor_map_free(all);
	moe_module_free(one);
	moe_ctx_free(ctx);
}

static void test_simulated_runs_equal_one_device(void **st)
{
	(void)st;
	for (uint64_t seed = 1; seed <= 300; seed++)
		check_case(seed);
}

/* A device that fails before its first exchange stops the others: no hang. */
static void test_failed_device_stops_the_others(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	cfg c = {.T = 4, .D = 3, .E = 4, .K = 2, .F = 3, .B = 2, .t = MOE_F32, .act = "swiglu"};
	moe_module *one = build(ctx, &c, c.T);
	moe_tensor_map *all = NULL;
	assert_int_equal(ir_interp_random_bindings(ctx, moe_module_graph(one, 0), 7, &all), MOE_OK);
	moe_module *dev[3];
	const moe_graph *g[3];
	moe_tensor_map *bind[3];
	moe_tensor *outv[3] = {0}, **out[3];
	for (int d = 0; d < 3; d++) {
		int64_t n = d < 2 ? 1 : 2;
		dev[d] = build(ctx, &c, n);
		char pipe[256];
		snprintf(pipe, sizeof pipe, "infer-shapes,expert-parallel{ep=3,rank=%d,tokens=4},blockwise-dispatch", d);
		lower(ctx, dev[d], pipe);
		g[d] = moe_module_graph(dev[d], 0);
		bind[d] = d == 1 ? moe_tensor_map_new(ctx) : device_bind(ctx, g[d], all, d, n); /* device 1: nothing bound */
		out[d] = &outv[d];
	}
	assert_int_not_equal(moe_ep_sim_run(ctx, 3, g, (const moe_tensor_map *const *)bind, out), MOE_OK);
	bool said_input = false, said_stop = false;
	for (size_t i = 0; i < moe_diag_count(ctx); i++) {
		const char *m;
		moe_diag_get(ctx, i, NULL, NULL, &m);
		said_input |= strstr(m, "device 1: no tensor is bound to input 'x'") != NULL;
		said_stop |= strstr(m, "device 0: stopping: device 1 failed") != NULL;
	}
	if (!said_input || !said_stop)
		moe_diag_print(ctx, stderr);
	assert_true(said_input && said_stop);
	for (int d = 0; d < 3; d++) {
		assert_null(outv[d]);
		moe_tensor_map_free(bind[d]);
		moe_module_free(dev[d]);
	}
	moe_tensor_map_free(all);
	moe_module_free(one);
	moe_ctx_free(ctx);
}

int main(void)
{
	alarm(120); /* a hang in an exchange fails the test instead of stalling the suite */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bounds_equal_brute_force),
		cmocka_unit_test(test_simulated_runs_equal_one_device),
		cmocka_unit_test(test_failed_device_stops_the_others),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
