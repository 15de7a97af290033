/* The schedule's timeline (backend-tcp/compiler/sched_time.c) and the list
 * scheduler (schedule.c), against the simulator:
 * - a hand-written schedule (two halves of x, each copied in, y = x + 1.5 on
 *   the Tensor Unit, copied out; the build order puts half 1's store before
 *   half 2's load): each op's predicted start and end follow the issue rules
 *   (an op starts once its dependencies end, the DMA queue runs in program
 *   order, end = start + cost), and the predicted cycles equal the cycles of
 *   the selected program run on the simulator with data and predicted by
 *   moe_tcp_predict; the scheduler moves half 2's load before half 1's store,
 *   the prediction drops by the two vector passes it hides beside the copies,
 *   the run's cycles drop by as much, and y keeps its bytes, which equal x + 1.5 computed here;
 * - a small Qwen3-shaped layer (block loop, row classes, guards, gathers)
 *   scheduled by the driver: on the expected loads the timeline equals
 *   moe_tcp_predict of the program exactly; on the loads a run with data
 *   observed it equals the run's cycles and moe_tcp_predict's on the same
 *   loads (the dispatch's slot lists name the slots those loads fill, as in
 *   moe_tcp_predict; the other index lists here, x's rows by token, name
 *   each row K times whatever their order);
 * - that layer built and compiled in full: a copy (ts_clone) prints as the
 *   schedule, and a copy of a copy is the copy field for field (ts_same). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/isel.h"
#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/compiler/schedule.h"
#include "interp/interp.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "moec/runtime.h"
#include "tcp_qwen3_fx.h"

static const char HALVES[] =
	"tcpsched 1\n"
	"machine \"RNGD (TCP), one chip\"\n"
	"meta T=32 K=0 D=64 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=16384 rmacs=0 dtype=f32\n"
	"features granted=0x0 refused=0x0\n"
	"buf %0 \"x\" hbm input f32[32,64]\n"
	"buf %1 \"y\" hbm output f32[32,64]\n"
	"buf %2 \"a\" dm scratch f32[16,64] life=@0..@1 layout=flit(0,512,1,32) at=0\n"
	"buf %3 \"ya\" dm scratch f32[16,64] life=@1..@2 layout=flit(0,512,1,32) at=32\n"
	"buf %4 \"b\" dm scratch f32[16,64] life=@3..@4 layout=flit(0,512,1,32) at=64\n"
	"buf %5 \"yb\" dm scratch f32[16,64] life=@4..@5 layout=flit(0,512,1,32) at=96\n"
	"op @0 dma.copy ph=routing dims=[1024] dst=%2+0:[1] s0=%0+0:[1]\n"
	"op @1 tu.vec ph=routing dims=[16,64] dst=%3+0:[64,1] s0=%2+0:[64,1] chain=[f.add(s0,imm,#0x3fc00000,c0,0)] "
	"deps=[@0]\n"
	"op @2 dma.copy ph=combine dims=[1024] dst=%1+0:[1] s0=%3+0:[1] deps=[@1]\n"
	"op @3 dma.copy ph=routing dims=[1024] dst=%4+0:[1] s0=%0+1024:[1]\n"
	"op @4 tu.vec ph=routing dims=[16,64] dst=%5+0:[64,1] s0=%4+0:[64,1] chain=[f.add(s0,imm,#0x3fc00000,c0,0)] "
	"deps=[@3]\n"
	"op @5 dma.copy ph=combine dims=[1024] dst=%1+1024:[1] s0=%5+0:[1] deps=[@4]\n";

/* runs p on x (values k / 16, exact in f32); y's bytes in *y (malloc'd) */
static int64_t run_halves(moe_ctx *c, const moe_tcp_program *p, float **y)
{
	int64_t shape[2] = {32, 64};
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 2, shape);
	assert_non_null(x);
	for (int i = 0; i < 32 * 64; i++)
		((float *)x->data)[i] = (float)((i * 37) % 128 - 64) / 16.0f;
	moe_tensor_map *b = moe_tensor_map_new(c);
	assert_int_equal(moe_tensor_map_set(b, "x", x), MOE_OK);
	moe_tensor *out[1] = {NULL};
	moe_tcp_stats st;
	moe_status s = moe_tcp_run(c, p, b, NULL, out, &st);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	*y = malloc(32 * 64 * sizeof **y);
	assert_non_null(*y);
	memcpy(*y, out[0]->data, 32 * 64 * sizeof **y);
	for (int i = 0; i < 32 * 64; i++) /* y = f32(x + 1.5), exact */
		assert_true((*y)[i] == (float)((i * 37) % 128 - 64) / 16.0f + 1.5f);
	moe_tensor_free(c, out[0]);
	moe_tensor_map_free(b);
	return st.cycles;
}

/* the program of s: its cycles predicted by the simulator (expected loads) */
static int64_t sim_predict(moe_ctx *c, const moe_tcp_program *p)
{
	moe_tcp_prediction pr;
	moe_status s = moe_tcp_predict(c, p, NULL, NULL, &pr);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	return pr.stats.cycles;
}

/* position of op id in the root region's items */
static int pos_of(const tcp_sched *s, ts_id id)
{
	const ts_region *g = &s->rg[s->top];
	for (uint32_t k = 0; k < g->nitem; k++)
		if (g->item[k] == (TS_ITEM_OP | id))
			return (int)k;
	return -1;
}

static void test_halves(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = moe_tcp_machine_default(c);
	tcp_sched *s = tcp_sched_parse(c, m, "halves.tsched", HALVES, strlen(HALVES));
	if (!s)
		moe_diag_print(c, stderr);
	assert_non_null(s);
	assert_int_equal(tcp_dm_place(s), MOE_OK);
	ts_timeline tl;
	int64_t before = tcp_sched_predict(c, s, NULL, &tl);
	assert_true(before > 0);
	assert_int_equal(tl.cycles, before);
	for (ts_id i = 0; i < s->nop; i++) {
		assert_true(tl.start[i] >= 0);
		assert_int_equal(tl.end[i] - tl.start[i], tl.cost[i]);
		for (uint32_t d = 0; d < s->op[i].ndep; d++)
			assert_true(tl.start[i] >= tl.end[s->op[i].dep[d]]);
	}
	/* one DMA queue in program order; each vector pass right after its load */
	assert_true(tl.start[2] >= tl.end[0] && tl.start[3] >= tl.end[2] && tl.start[5] >= tl.end[3]);
	assert_int_equal(tl.start[1], tl.end[0]);
	assert_int_equal(tl.start[4], tl.end[3]);
	/* half 1's store waits for its pass, and half 2's load waits for the store */
	assert_int_equal(tl.start[2], tl.end[1]);
	assert_int_equal(tl.start[3], tl.end[2]);
	int64_t cost_vec = tl.cost[1], tl_copy = tl.cost[3];
	ts_timeline_free(c, s, &tl);
	moe_tcp_program *p = tcp_sched_isel(c, s);
	assert_non_null(p);
	float *y0, *y1;
	assert_int_equal(run_halves(c, p, &y0), before);
	assert_int_equal(sim_predict(c, p), before);
	moe_tcp_program_free(p);
	/* scheduled: half 2's load goes before half 1's store, hiding the pass */
	assert_int_equal(tcp_sched_cost(c, s), MOE_OK);
	assert_int_equal(tcp_sched_schedule(c, s), MOE_OK);
	assert_int_equal(tcp_sched_verify(s), MOE_OK);
	assert_true(pos_of(s, 3) < pos_of(s, 2));
	assert_true(pos_of(s, 0) < pos_of(s, 1) && pos_of(s, 1) < pos_of(s, 2) && pos_of(s, 3) < pos_of(s, 4) &&
		    pos_of(s, 4) < pos_of(s, 5));
	int64_t after = tcp_sched_predict(c, s, NULL, NULL);
	assert_true(after < before);
	/* both passes now run beside a DMA (a pass is shorter than a copy here) */
	assert_true(cost_vec < tl_copy);
	assert_int_equal(before - after, 2 * cost_vec);
	p = tcp_sched_isel(c, s);
	assert_non_null(p);
	assert_int_equal(run_halves(c, p, &y1), after);
	assert_int_equal(sim_predict(c, p), after);
	assert_memory_equal(y0, y1, 32 * 64 * sizeof *y0);
	free(y0);
	free(y1);
	moe_tcp_program_free(p);
	tcp_sched_free(s);
	moe_tcp_machine_free(c, m);
	moe_ctx_free(c);
}

/* The rewrite driver starts a stage from a copy of the schedule (ts_clone)
 * so that each trial's copy is that schedule field for field: on the
 * fixture layer, built and compiled in full, a copy prints as the schedule
 * and a copy of a copy is the copy (ts_same). */
static void test_layer_clone(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *mach = moe_tcp_machine_default(c);
	moe_module *m = tcp_fx_qwen3_module(c, 16, false, "tcp-sched");
	for (int full = 0; full < 2; full++) {
		tcp_sched *s = tcp_sched_compiled(c, moe_module_graph(m, 0), mach, full);
		assert_non_null(s);
		tcp_sched *c1 = ts_clone(s), *c2 = c1 ? ts_clone(c1) : NULL;
		assert_non_null(c2);
		assert_true(ts_same(c1, c2));
		char *t0 = NULL, *t1 = NULL;
		size_t n0 = 0, n1 = 0;
		assert_int_equal(tcp_sched_print(s, &t0, &n0), MOE_OK);
		assert_int_equal(tcp_sched_print(c1, &t1, &n1), MOE_OK);
		assert_int_equal(n0, n1);
		assert_memory_equal(t0, t1, n0);
		ctx_free(c, t0, n0);
		ctx_free(c, t1, n1);
		tcp_sched_free(c2);
		tcp_sched_free(c1);
		tcp_sched_free(s);
	}
	moe_module_free(m);
	moe_tcp_machine_free(c, mach);
	moe_ctx_free(c);
}

static void test_layer(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *mach = moe_tcp_machine_default(c);
	const int64_t Ts[] = {16, 1};
	for (size_t k = 0; k < 2; k++) {
		moe_module *m = tcp_fx_qwen3_module(c, Ts[k], false, "tcp-sched");
		tcp_sched *s = tcp_sched_compiled(c, moe_module_graph(m, 0), mach, true);
		if (!s)
			moe_diag_print(c, stderr);
		assert_non_null(s);
		ts_timeline tl;
		int64_t expect = tcp_sched_predict(c, s, NULL, &tl);
		assert_true(expect > 0 && tl.nblocks > 0);
		ts_timeline_free(c, s, &tl);
		moe_tcp_program *p = tcp_sched_isel(c, s);
		assert_non_null(p);
		assert_int_equal(sim_predict(c, p), expect);
		moe_tensor_map *bind = NULL;
		assert_int_equal(ir_interp_random_bindings(c, moe_module_graph(m, 0), 31, &bind), MOE_OK);
		moe_tcp_loads seen = {.n_tokens = -1};
		moe_tcp_run_opts ro = {.observed = &seen};
		moe_tcp_stats rs;
		moe_tensor *out[1] = {NULL};
		assert_int_equal(moe_tcp_run(c, p, bind, &ro, out, &rs), MOE_OK);
		moe_tensor_free(c, out[0]);
		int64_t got = tcp_sched_predict(c, s, &seen, NULL);
		printf("T=%lld: timeline %lld cycles, run %lld (%+.3f%%); expected loads %lld\n", (long long)Ts[k],
			(long long)got, (long long)rs.cycles, 100.0 * (double)(got - rs.cycles) / (double)rs.cycles,
			(long long)expect);
		assert_int_equal(got, rs.cycles);
		moe_tcp_prediction pd;
		assert_int_equal(moe_tcp_predict(c, p, mach, &seen, &pd), MOE_OK);
		assert_int_equal(pd.stats.cycles, got);
		moe_tcp_loads_free(c, &seen);
		moe_tensor_map_free(bind);
		moe_tcp_program_free(p);
		tcp_sched_free(s);
		moe_module_free(m);
	}
	moe_tcp_machine_free(c, mach);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_halves),
		cmocka_unit_test(test_layer),
		cmocka_unit_test(test_layer_clone),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
