/* moe_tcp_predict (backend-tcp/sim/predict.c) on small Qwen3-shaped layers (D = 40,
 * F = 24, E = 16, K = 4, B = 8) with random x and weights, compiled by the
 * schedule compiler:
 * - given the loads a full run staged (moe_tcp_run_opts.observed), the
 *   prediction, which has no data and computes nothing, reproduces the run's
 *   cycles exactly: T = 16 (a block grid), T = 1 (a decode grid, its
 *   compile-time block count) and a serving program linked with its decode
 *   tier at n = 1 (the tier's loop), 2 and 16 (the serving loop, n_tokens
 *   read through its DM copy). The dispatch scatter's and the combine
 *   gather's slot lists name the grid slots those loads fill (the HBM rows
 *   the dispatch writes set its cost); x's rows by token are each read K
 *   times in any order;
 * - on expected loads the block count is that of the uniform routing's
 *   counts, and two predictions agree (the generator is seeded);
 * - loads that do not fit the staged grid are refused with a diagnostic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interp/interp.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "moec/tcp.h"
#include "tcp_qwen3_fx.h"

/* A full run of p with its staged loads observed, then p predicted on them:
 * the cycles agree exactly. Returns the run's block count. */
static int64_t run_and_predict(moe_ctx *c, const moe_tcp_program *p, const moe_tensor_map *b)
{
	moe_tcp_loads seen = {.n_tokens = -1};
	moe_tcp_run_opts ro = {.observed = &seen};
	moe_tcp_stats st;
	moe_tensor *out[1] = {NULL};
	moe_status s = moe_tcp_run(c, p, b, &ro, out, &st);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	moe_tensor_free(c, out[0]);
	assert_int_equal(seen.stagings, 1);
	assert_non_null(seen.block_expert);
	moe_tcp_prediction pd;
	s = moe_tcp_predict(c, p, NULL, &seen, &pd);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	assert_int_equal(pd.approximated_lds, 0);
	assert_int_equal(pd.stats.cycles, st.cycles);
	assert_int_equal(pd.stats.commands, st.commands);
	assert_int_equal(pd.stats.experts_hit, st.experts_hit);
	assert_int_equal(pd.stats.blocks_executed, st.blocks_executed);
	int64_t nb = seen.nblocks;
	moe_tcp_loads_free(c, &seen);
	return nb;
}

static void test_run_loads_reproduce_cycles(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const int64_t Ts[] = {16, 1};
	for (size_t k = 0; k < 2; k++) {
		moe_module *m;
		moe_tcp_program *p = tcp_fx_qwen3(c, Ts[k], false, &m);
		moe_tensor_map *bind = NULL;
		assert_int_equal(ir_interp_random_bindings(c, moe_module_graph(m, 0), 31, &bind), MOE_OK);
		int64_t nb = run_and_predict(c, p, bind);
		assert_true(nb >= 4 && nb <= 16 * 4);
		moe_tensor_map_free(bind);
		moe_tcp_program_free(p);
		moe_module_free(m);
	}
	moe_ctx_free(c);
}

static void test_tier_loops(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *sm;
	moe_tcp_program *sp = tcp_fx_qwen3(c, 16, true, &sm), *dp = tcp_fx_qwen3(c, 1, false, NULL);
	moe_tcp_program *lp = moe_tcp_link_tier(c, sp, dp);
	assert_non_null(lp);
	moe_tensor_map *bind = NULL;
	assert_int_equal(ir_interp_random_bindings(c, moe_module_graph(sm, 0), 37, &bind), MOE_OK);
	const int32_t ns[] = {1, 2, 16};
	for (size_t k = 0; k < 3; k++) {
		tcp_fx_set_tokens(c, bind, ns[k]);
		run_and_predict(c, lp, bind);
	}
	/* expected loads follow n_tokens: T = 16 here, the serving loop */
	moe_tcp_prediction a;
	assert_int_equal(moe_tcp_predict(c, lp, NULL, NULL, &a), MOE_OK);
	assert_true(a.nblocks >= 8 && a.seconds > 0);
	moe_tensor_map_free(bind);
	moe_tcp_program_free(lp);
	moe_tcp_program_free(sp);
	moe_tcp_program_free(dp);
	moe_module_free(sm);
	moe_ctx_free(c);
}

/* Uniform routing of 16 tokens x 4 of 16 experts: 64 pairs, at most 8 per
 * block of B = 8, so at least 8 blocks and at most 16 + 64 / 8 = 24 (one
 * partial block per expert); the seeded generator gives the same both
 * times. */
static void test_expected_loads(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_program *p = tcp_fx_qwen3(c, 16, false, NULL);
	moe_tcp_prediction a, b;
	assert_int_equal(moe_tcp_predict(c, p, NULL, NULL, &a), MOE_OK);
	assert_int_equal(moe_tcp_predict(c, p, NULL, NULL, &b), MOE_OK);
	assert_true(a.nblocks >= 8 && a.nblocks <= 24);
	assert_true(a.stats.experts_hit >= 4 && a.stats.experts_hit <= 16);
	assert_int_equal(a.stats.cycles, b.stats.cycles);
	assert_true(a.seconds > 0 && a.stats.roofline_seconds > 0);
	moe_tcp_program_free(p);
	moe_ctx_free(c);
}

static void test_bad_loads(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_program *p = tcp_fx_qwen3(c, 16, false, NULL);
	int32_t e[3] = {0, 1, 2}, r[3] = {8, 8, 8};
	moe_tcp_loads l = {.grid = 3, .nblocks = 3, .block_expert = e, .block_rows = r, .n_tokens = -1};
	moe_tcp_prediction pd;
	assert_int_not_equal(moe_tcp_predict(c, p, NULL, &l, &pd), MOE_OK);
	char *d = moe_diag_string(c);
	assert_non_null(d);
	assert_non_null(strstr(d, "grid entries"));
	moe_free(c, d);
	moe_diag_clear(c);
	l.nblocks = 4; /* past the grid */
	assert_int_equal(moe_tcp_predict(c, p, NULL, &l, &pd), MOE_ERR_INVALID);
	moe_diag_clear(c);
	moe_tcp_program_free(p);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_run_loads_reproduce_cycles),
		cmocka_unit_test(test_tier_loops),
		cmocka_unit_test(test_expected_loads),
		cmocka_unit_test(test_bad_loads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
