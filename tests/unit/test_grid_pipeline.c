/* Grid bound against brute force; pipeline text parsing and printing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "moec/passes.h"
#include "moec/tcp.h"
#include "grid_brute.h"

static int64_t brute(int T, int K, int E, int B)
{
	int c[8] = {0};
	int64_t best = 0;
	for (;;) {
		int sum = 0;
		for (int e = 0; e < E; e++)
			sum += c[e];
		if (sum == T * K && feasible(T, K, E, c)) {
			int64_t g = 0;
			for (int e = 0; e < E; e++)
				g += (c[e] + B - 1) / B;
			if (g > best)
				best = g;
		}
		int e = 0;
		while (e < E && ++c[e] > T)
			c[e++] = 0;
		if (e == E)
			break;
	}
	return best;
}

static void test_bound_equals_brute_force(void **st)
{
	(void)st;
	int cases = 0;
	for (int T = 1; T <= 7; T++)
		for (int E = 1; E <= 6; E++)
			for (int K = 1; K <= E; K++)
				for (int B = 1; B <= 5; B++) {
					int64_t want = brute(T, K, E, B), got = moe_grid_blocks_max(T, K, E, B);
					if (want != got)
						fail_msg("T=%d K=%d E=%d B=%d: brute force %lld, bound %lld", T, K, E, B,
							(long long)want, (long long)got);
					cases++;
				}
	assert_int_equal(cases, 7 * 21 * 5);
}

/* Random and adversarial routings never need more than the bound. */
static void test_routings_within_bound(void **st)
{
	(void)st;
	srand(7);
	for (int iter = 0; iter < 20000; iter++) {
		int E = 1 + rand() % 64, K = 1 + rand() % (E < 8 ? E : 8), T = 1 + rand() % 300, B = 1 + rand() % 70;
		int cnt[64] = {0};
		int mode = iter % 3; /* 0 random, 1 crowd the low experts, 2 spread evenly */
		for (int t = 0; t < T; t++) {
			int used[64] = {0};
			for (int k = 0; k < K; k++) {
				int e;
				if (mode == 1)
					e = k;
				else if (mode == 2)
					e = (t * K + k) % E;
				else
					e = rand() % E;
				while (used[e])
					e = (e + 1) % E;
				used[e] = 1;
				cnt[e]++;
			}
		}
		int64_t g = 0;
		for (int e = 0; e < E; e++)
			g += (cnt[e] + B - 1) / B;
		if (g > moe_grid_blocks_max(T, K, E, B))
			fail_msg("T=%d K=%d E=%d B=%d mode %d: %lld blocks > bound", T, K, E, B, mode, (long long)g);
	}
}

static void test_known_values(void **st)
{
	(void)st;
	assert_int_equal(moe_grid_blocks_max(1, 8, 128, 64), 8);
	assert_int_equal(moe_grid_blocks_max(4096, 8, 128, 64), 638);
	assert_int_equal(moe_grid_blocks_seed(4096, 8, 128, 64), 638);
	assert_int_equal(moe_grid_blocks_seed(1, 8, 128, 64), 128);
	/* vLLM: P = min(n*B, n + E*(B-1)) = 512 for n = 8 -> 8 blocks */
	assert_int_equal(moe_grid_blocks_vllm(1, 8, 128, 64), 8);
	assert_int_equal(moe_grid_blocks_vllm(4096, 8, 128, 64), (32768 + 128 * 63 + 63) / 64);
}

static void test_pipeline_roundtrip(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *ok[] = {"infer-shapes,lower-topk{mode=exact},blockwise-dispatch,grid-bound,cse,dce",
		"lower-topk{mode=packed16}", "blockwise-dispatch{grid=seed},dce", ""};
	for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
		moe_pipeline *p = moe_pipeline_parse(c, ok[i]);
		assert_non_null(p);
		char *s = moe_pipeline_print(p);
		assert_string_equal(s, ok[i]);
		moe_pipeline *q = moe_pipeline_parse(c, s);
		char *s2 = moe_pipeline_print(q);
		assert_string_equal(s2, s);
		free(s);
		free(s2);
		moe_pipeline_free(p);
		moe_pipeline_free(q);
	}
	/* named pipelines expand to their text (the tcp target's passes once it
	 * registers them; skipped before) */
	moe_pipeline *p = moe_pipeline_parse(c, "tcp");
	char *s = moe_pipeline_print(p);
	static const char *const target[] = {
		",tcp-combine-chunk", ",tcp-block-balance", ",tcp-w8a8-act-once", ",tcp-pair-gate-up", ",tcp-pair-down", ",tcp-pack-bias", ",tcp-einsum-canon",
		",tcp-fp8-act-rows", ",tcp-plan-fusion"};
	char want[1024];
	snprintf(want, sizeof want, "%s", moe_pipeline_named("tcp"));
	for (size_t k = 0; k < sizeof target / sizeof *target; k++) {
		char *at = strstr(want, target[k]);
		assert_non_null(at);
		memmove(at, at + strlen(target[k]), strlen(at + strlen(target[k])) + 1);
	}
	assert_string_equal(s, want);
	free(s);
	moe_pipeline_free(p);
	assert_int_equal(moe_tcp_register_passes(c), MOE_OK);
	p = moe_pipeline_parse(c, "tcp");
	s = moe_pipeline_print(p);
	assert_string_equal(s, moe_pipeline_named("tcp"));
	free(s);
	moe_pipeline_free(p);
	/* tcp-sched names the same pipeline */
	assert_string_equal(moe_pipeline_named("tcp-sched"), moe_pipeline_named("tcp"));
	assert_int_equal(moe_error_count(c), 0);
	const char *bad[] = {"nope", "dce,,cse", "lower-topk{mode}", "lower-topk{wat=1}", "dce{", "dce cse", ","};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		moe_diag_clear(c);
		assert_null(moe_pipeline_parse(c, bad[i]));
		assert_int_equal(moe_error_count(c), 1);
		const char *msg;
		moe_diag_get(c, 0, NULL, NULL, &msg);
		assert_non_null(strstr(msg, "invalid pipeline"));
	}
	moe_ctx_free(c);
}

static moe_status noop(moe_ctx *c, moe_graph *g, const moe_pass_opts *o, void *ud)
{
	(void)c; (void)g; (void)o;
	(*(int *)ud)++;
	return MOE_OK;
}

static void test_external_pass(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	int calls = 0;
	moe_pass_info info = {"count-me", "counts calls", NULL, noop, &calls};
	assert_int_equal(moe_pass_register(c, &info), MOE_OK);
	assert_int_equal(moe_pass_register(c, &info), MOE_ERR_INVALID);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "a");
	int64_t s[1] = {4};
	moe_id x = ir_emit(g, MOE_OP_INPUT, MOE_F32, 1, s, NULL, 0, moe_loc_none());
	moe_node_set_name(g, x, "x");
	moe_graph_add_output(g, x);
	moe_graph *g2 = moe_module_add_graph(m, "b");
	x = ir_emit(g2, MOE_OP_INPUT, MOE_F32, 1, s, NULL, 0, moe_loc_none());
	moe_node_set_name(g2, x, "x");
	moe_graph_add_output(g2, x);
	moe_run_opts ro = {.verify = 1};
	assert_int_equal(moe_run_pipeline_text(c, "count-me,dce,count-me", m, &ro), MOE_OK);
	assert_int_equal(calls, 4);
	/* a parsed pipeline stays valid while more passes are registered */
	moe_pipeline *p = moe_pipeline_parse(c, "count-me");
	char names[40][24];
	for (int i = 0; i < 40; i++) {
		snprintf(names[i], sizeof names[i], "extra-%d", i);
		moe_pass_info more = {names[i], "more", NULL, noop, &calls};
		assert_int_equal(moe_pass_register(c, &more), MOE_OK);
	}
	assert_int_equal(moe_pipeline_run(c, p, m, &ro), MOE_OK);
	assert_int_equal(calls, 6);
	moe_pipeline_free(p);
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bound_equals_brute_force),
		cmocka_unit_test(test_routings_within_bound),
		cmocka_unit_test(test_known_values),
		cmocka_unit_test(test_pipeline_roundtrip),
		cmocka_unit_test(test_external_pass),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
