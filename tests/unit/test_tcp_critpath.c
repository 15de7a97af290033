/* The simulator's critical-path links (tev.pred, backend-tcp/sim_sched.c) on
 * small hand-written programs, worked by hand on machine.json's numbers (the
 * expert-parallel runner measures each exchange round's packing and
 * unpacking along them: docs/expert-parallel.md section 6). A command's
 * predecessor is the recorded command whose end released it (a DMA
 * command, joined or not, the previous one in the one DMA queue). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "backend-tcp/sim/sim_int.h"

static const char *head =
	"tcps 1\n"
	"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
	"tensor %0 hbm scratch bf16 [1048576] addr=0 slice=0 const=0 \"h\"\n"
	"tensor %1 dm scratch bf16 [524288] addr=0 slice=2048 const=0 \"d\"\n"
	"tensor %2 dm scratch bf16 [524288] addr=2048 slice=2048 const=0 \"d2\"\n"
	"tensor %3 trf scratch bf16 [2097152] addr=0 slice=8192 const=0 \"t\"\n";

/* Runs head + body; the recorded commands in *ev (n of them). */
static size_t run(moe_ctx *ctx, const char *body, tev **ev)
{
	char prog[4096];
	snprintf(prog, sizeof prog, "%s%s", head, body);
	moe_tcp_program *p = moe_tcp_from_asm(ctx, "critpath.tcps", prog, strlen(prog), NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	moe_tcp_stats s;
	size_t n = 0;
	assert_int_equal(tcp_run_events(ctx, p, NULL, NULL, NULL, &s, ev, &n), MOE_OK);
	moe_tcp_program_free(p);
	return n;
}

/* What command i adds to the critical path: end - max(start, pred's end). */
static int64_t own(const tev *ev, size_t i)
{
	int64_t from = ev[i].pred >= 0 && ev[ev[i].pred].end > ev[i].start ? ev[ev[i].pred].end : ev[i].start;
	return ev[i].end - from;
}

/* 1 MiB HBM -> DM copies cost 1200 cycles each (test_tcp's cost rules: 500
 * setup, its issue included, + 700 for the HBM pool), issued at cycles 2001,
 * 2002, 2003 (kernel_launch_cycles 2000, then one scalar op each). DMA
 * setups are serial (dma.setup_overlaps_previous false): the second copy,
 * flagged join, queues behind the first (start 3201, end 4401) and links to
 * it. The TRF load reads what the second wrote: it waits for it (start 4401,
 * 784 cycles: 240 issue + 32 fill/drain + 512 for 8192 B per slice, of which
 * each of the 128 slices holding the 4096 source bytes has 32: the switch at
 * 32 B per cycle, 256, + a ring of 256) and links to it. The third copy
 * queues behind the second on the DMA context. */
static void test_joined_dma_and_hazard(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	tev *ev = NULL;
	size_t n = run(ctx,
		"@0: dma.copy dims=[524288] dst=%1+0:[1] s0=%0+0:[1]\n"
		"@1: dma.copy dims=[524288] flags=join, dst=%2+0:[1] s0=%0+524288:[1]\n"
		"@2: sub.ldtrf dims=[512,2048] flags=xslice, dst=%3+0:[2048,1] s0=%2+0:[0,1]\n"
		"@3: dma.copy dims=[524288] dst=%1+0:[1] s0=%0+0:[1]\n"
		"@4: halt\n", &ev);
	assert_int_equal(n, 4);
	assert_int_equal(ev[0].start, 2001);
	assert_int_equal(ev[0].end, 3201);
	assert_int_equal(ev[0].pred, -1);
	assert_int_equal(ev[1].start, 3201);
	assert_int_equal(ev[1].end, 4401);
	assert_int_equal(ev[1].pred, 0);
	assert_int_equal(own(ev, 1), 1200);
	assert_int_equal(ev[2].start, 4401);
	assert_int_equal(ev[2].end, 4401 + 784);
	assert_int_equal(ev[2].pred, 1);
	assert_int_equal(ev[3].start, 4401);
	assert_int_equal(ev[3].pred, 1);
	assert_int_equal(own(ev, 3), 1200);
	/* the path back from the last command: 3 -> 1 -> 0, covering [2001, end) */
	int64_t sum = 0;
	for (int32_t i = 3; i >= 0; i = ev[i].pred)
		sum += own(ev, (size_t)i);
	assert_int_equal(sum + 2001, ev[3].end);
	ctx_free(ctx, ev, 0);
	moe_ctx_free(ctx);
}

/* A command that waits for nothing recorded (issued on an idle context,
 * its operands untouched) has no predecessor; a vector pass on the main
 * context waits for the copy that wrote its operand. */
static void test_independent_contexts(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	tev *ev = NULL;
	size_t n = run(ctx,
		"@0: dma.copy dims=[524288] dst=%1+0:[1] s0=%0+0:[1]\n"
		"@1: sub.ldtrf dims=[512,2048] flags=xslice, dst=%3+0:[2048,1] s0=%2+0:[0,1]\n"
		"@2: sub.ldtrf dims=[512,2048] flags=xslice, dst=%3+4096:[2048,1] s0=%1+0:[0,1]\n"
		"@3: halt\n", &ev);
	assert_int_equal(n, 3);
	assert_int_equal(ev[1].pred, -1); /* d2 was never written: it starts at its issue */
	assert_int_equal(ev[1].start, 2002);
	assert_int_equal(ev[2].pred, 0); /* reads d after the copy */
	assert_int_equal(ev[2].start, 3201);
	ctx_free(ctx, ev, 0);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_joined_dma_and_hazard),
		cmocka_unit_test(test_independent_contexts),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
