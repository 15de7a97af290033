/* The decode tier (docs/tcp-isa.md section 7.4, "Decode tier"): a Qwen3-shaped serving
 * program for T = 16 linked with the layer compiled for T = 1, on the TCP
 * simulator with random x and weights:
 * - at n = 1 (the tier) and n = 2, 15, 16 (the serving code, both sides of
 *   the tier's boundary and the top) rows < n are bitwise those of the layer
 *   compiled for T = n, rows >= n are zero; at n = 0 the program stops at its
 *   guard (five instructions) and the output is zero;
 * - n = 1 runs the K one-row blocks of the T = 1 program in its time plus
 *   less than 1 us (the guard: staging n_tokens and one branch); n = 2 runs
 *   the blocks of the unlinked serving program;
 * - the linked program survives the binary and the assembly round trips;
 * - linking anything but a T = 1 program of the same layer is refused. */
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

#define TMAX 16

/* bind with x cut to n rows (the other tensors shared by copy) */
static moe_tensor_map *rows_of(moe_ctx *c, const moe_tensor_map *bind, int64_t n)
{
	moe_tensor_map *r = moe_tensor_map_new(c);
	static const char *const names[] = {"router", "gate", "up", "down", "x"};
	for (int w = 0; w < 5; w++) {
		const moe_tensor *t = moe_tensor_map_get(bind, names[w]);
		int64_t shape[MOE_MAX_RANK];
		memcpy(shape, t->shape, sizeof shape);
		if (w == 4)
			shape[0] = n;
		moe_tensor *cp = moe_tensor_new(c, t->dtype, t->rank, shape);
		assert_non_null(cp);
		memcpy(cp->data, t->data, cp->nbytes);
		moe_tensor_map_set(r, names[w], cp);
	}
	return r;
}

static moe_tensor *run(moe_ctx *c, const moe_tcp_program *p, const moe_tensor_map *b, moe_tcp_stats *st)
{
	moe_tensor *out[1] = {NULL};
	moe_status s = moe_tcp_run(c, p, b, NULL, out, st);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	return out[0];
}

static void test_tier_matches_layer_of_n(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *sm;
	moe_tcp_program *sp = tcp_fx_qwen3(c, TMAX, true, &sm), *dp = tcp_fx_qwen3(c, 1, false, NULL);
	moe_tcp_program *lp = moe_tcp_link_tier(c, sp, dp);
	if (!lp)
		moe_diag_print(c, stderr);
	assert_non_null(lp);
	moe_tensor_map *bind = NULL;
	assert_int_equal(ir_interp_random_bindings(c, moe_module_graph(sm, 0), 23, &bind), MOE_OK);
	const int64_t ns[] = {0, 1, 2, TMAX - 1, TMAX};
	for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
		int64_t n = ns[k];
		tcp_fx_set_tokens(c, bind, (int32_t)n);
		moe_tcp_stats ls, us, rs;
		moe_tensor *yl = run(c, lp, bind, &ls), *yu = run(c, sp, bind, &us);
		size_t row = yl->nbytes / TMAX;
		if (n) {
			moe_tcp_program *rp = n == 1 ? NULL : tcp_fx_qwen3(c, n, false, NULL);
			moe_tensor_map *rb = rows_of(c, bind, n);
			moe_tensor *yr = run(c, rp ? rp : dp, rb, &rs);
			assert_int_equal(yr->nbytes, (size_t)n * row);
			if (memcmp(yl->data, yr->data, yr->nbytes))
				fail_msg("n = %lld: rows below n differ from the layer compiled for T = n", (long long)n);
			if (n == 1) { /* the tier: the T = 1 program's blocks, its time and the guard */
				assert_int_equal(ls.blocks_executed, rs.blocks_executed);
				if (ls.simulated_seconds >= us.simulated_seconds) /* the serving code did not run */
					fail_msg("n = 1: %g s, the serving code alone %g s", ls.simulated_seconds, us.simulated_seconds);
				if (ls.simulated_seconds > rs.simulated_seconds + 1e-6)
					fail_msg("n = 1: %g s against %g s for T = 1", ls.simulated_seconds, rs.simulated_seconds);
			} else {
				assert_int_equal(ls.blocks_executed, us.blocks_executed);
			}
			moe_tensor_free(c, yr);
			moe_tensor_map_free(rb);
			moe_tcp_program_free(rp);
		} else { /* n = 0 stops at the guard: stage, load, two branches, halt */
			assert_int_equal(ls.blocks_executed, 0);
			assert_true(ls.instructions <= 5);
		}
		const unsigned char *b = (const unsigned char *)yl->data;
		for (size_t i = (size_t)n * row; i < yl->nbytes; i++)
			if (b[i])
				fail_msg("n = %lld: byte %zu of a padded row is not zero", (long long)n, i);
		moe_tensor_free(c, yl);
		moe_tensor_free(c, yu);
	}
	moe_tensor_map_free(bind);
	moe_module_free(sm);
	moe_tcp_program_free(lp);
	moe_tcp_program_free(sp);
	moe_tcp_program_free(dp);
	moe_ctx_free(c);
}

static void test_tier_round_trips(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_program *sp = tcp_fx_qwen3(c, TMAX, true, NULL), *dp = tcp_fx_qwen3(c, 1, false, NULL);
	moe_tcp_program *lp = moe_tcp_link_tier(c, sp, dp);
	assert_non_null(lp);
	uint8_t *b0, *b1, *b2;
	size_t n0, n1, n2, na;
	char *text;
	assert_int_equal(moe_tcp_to_binary(c, lp, &b0, &n0), MOE_OK);
	assert_int_equal(moe_tcp_to_binary(c, sp, &b1, &n1), MOE_OK);
	assert_true(n0 > n1); /* the tier's fields and code are written */
	free(b1);
	moe_tcp_program *rp = moe_tcp_from_binary(c, "tier.tcpb", b0, n0, NULL);
	assert_non_null(rp);
	assert_int_equal(moe_tcp_to_binary(c, rp, &b1, &n1), MOE_OK);
	assert_int_equal(n1, n0);
	assert_memory_equal(b1, b0, n0);
	assert_int_equal(moe_tcp_to_asm(c, lp, &text, &na), MOE_OK);
	assert_non_null(strstr(text, " tier=1 tier_loop="));
	moe_tcp_program *ap = moe_tcp_from_asm(c, "tier.tcps", text, na, NULL);
	if (!ap)
		moe_diag_print(c, stderr);
	assert_non_null(ap);
	assert_int_equal(moe_tcp_to_binary(c, ap, &b2, &n2), MOE_OK);
	assert_int_equal(n2, n0);
	assert_memory_equal(b2, b0, n0);
	/* a tier loop past the code is refused when the assembly is loaded */
	char *at = strstr(text, " tier_loop="), *bad = malloc(na + 16);
	assert_non_null(at);
	size_t pre = (size_t)(at - text) + strlen(" tier_loop=");
	const char *rest = strchr(text + pre, ' ');
	assert_non_null(rest);
	int nb = snprintf(bad, na + 16, "%.*s99999999%s", (int)pre, text, rest);
	moe_diag_clear(c);
	assert_null(moe_tcp_from_asm(c, "bad.tcps", bad, (size_t)nb, NULL));
	assert_true(moe_error_count(c) >= 1);
	free(bad);
	free(b0);
	free(b1);
	free(b2);
	free(text);
	moe_tcp_program_free(rp);
	moe_tcp_program_free(ap);
	/* refused: a serving program as the tier, a tier on a tiered program */
	moe_diag_clear(c);
	assert_null(moe_tcp_link_tier(c, sp, sp));
	assert_null(moe_tcp_link_tier(c, lp, dp));
	assert_true(moe_error_count(c) >= 2);
	moe_tcp_program_free(lp);
	moe_tcp_program_free(sp);
	moe_tcp_program_free(dp);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tier_matches_layer_of_n),
		cmocka_unit_test(test_tier_round_trips),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
