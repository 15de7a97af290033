/* The contraction tiling search (backend-tcp/compiler/plan.c,
 * docs/tcp-compiler.md 9): tcp_plan_contract stops at the first TRF row count
 * whose chunks' command issue alone reaches the best estimate. The plan it
 * returns must be the one an exhaustive search over every row count and
 * every chunk tcp_chunk_tries offers would pick (the first minimum), on the
 * shipped machine and on machines whose TRF, issue and granule differ. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "moec/tcp.h"

/* every os from 1 while some chunk fits, every chunk tried, the first minimum kept */
static cplan exhaustive(const moe_tcp_machine *m, int64_t M, int64_t O, int64_t I, int wdt, int64_t *cycles)
{
	cplan best = {M, O, I, 0, 0, 0};
	int64_t S = m->clusters * m->slices_per_cluster, best_t = -1, its[4];
	int64_t e = wdt == MOE_F32 ? 4 : wdt == MOE_F8E4M3 || wdt == MOE_I8 ? 1 : 2;
	bool aligned = e == 1 || I * e % m->hbm_granule == 0;
	for (int64_t os = 1; os <= O; os++) {
		int n = tcp_chunk_tries(m, os, I, e, aligned, its);
		if (n == 0)
			break;
		for (int v = 0; v < n; v++) {
			int64_t t = tcp_contract_cycles(m, os, its[v], O, I, wdt, &M, 1);
			if (best_t < 0 || t < best_t) {
				best_t = t;
				best.It = its[v], best.Os = os, best.Opass = O < S * os ? O : S * os;
			}
		}
	}
	*cycles = best_t;
	return best;
}

static int sweep(const moe_tcp_machine *m)
{
	static const int64_t Ms[] = {1, 8, 64, 200, 464, 4096};
	static const int64_t sizes[][2] = {{2048, 7168}, {7168, 2048}, {768, 2048}, {2048, 768}, {5760, 2880},
		{2880, 2880}, {4096, 7168}, {96, 160}, {1000, 333}};
	static const int wdts[] = {MOE_BF16, MOE_F32, MOE_F8E4M3, MOE_I8};
	int n = 0;
	for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
		for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++)
			for (size_t c = 0; c < sizeof wdts / sizeof *wdts; c++) {
				int64_t O = sizes[b][0], I = sizes[b][1], t0, t1;
				cplan want = exhaustive(m, Ms[a], O, I, wdts[c], &t0);
				cplan got = tcp_plan_contract(m, Ms[a], O, I, wdts[c], &t1);
				assert_int_equal(got.Os, want.Os);
				assert_int_equal(got.It, want.It);
				assert_int_equal(got.Opass, want.Opass);
				assert_int_equal(t1, t0);
				n++;
			}
	return n;
}

static void shipped(void **state)
{
	(void)state;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	assert_non_null(m);
	assert_int_equal(sweep(m), 6 * 9 * 4);
	moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
}

/* a small TRF (the search runs to the last row count that fits), a costly
 * issue (it stops early) and a free one (the bound never stops it), a
 * coarser granule */
static void edited(void **state)
{
	(void)state;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	assert_non_null(m);
	const moe_tcp_machine keep = *m;
	m->trf_bytes_per_lane = keep.trf_bytes_per_lane / 8;
	sweep(m);
	*m = keep;
	m->issue_cycles = keep.issue_cycles * 10;
	sweep(m);
	m->issue_cycles = 0;
	sweep(m);
	*m = keep;
	m->hbm_granule = keep.hbm_granule * 4;
	sweep(m);
	*m = keep;
	moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(shipped),
		cmocka_unit_test(edited),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
