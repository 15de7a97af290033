/* The lowering's DM allocation check (backend-tcp/lower_check.c) on small
 * hand-built programs: two DM tensors on the same bytes are an error only
 * while both are live, and a tensor named inside and outside a loop is live
 * through the whole loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"

/* A DM scratch tensor of 64 bytes per slice at addr. */
static int32_t dm(tcp_program *p, const char *name, int64_t addr)
{
	int64_t sh[1] = {16};
	int32_t t = tcp_add_tensor(p, name, TCP_DM, TCP_T_SCRATCH, MOE_F32, 1, sh);
	p->t[t].addr = addr;
	p->t[t].slice_bytes = 64;
	return t;
}

/* One vector pass writing dst from src (-1: none). */
static void pass(tcp_program *p, int32_t dst, int32_t src)
{
	tcp_insn in = tcp_insn_init(TCP_OP_TU_VEC);
	in.v[TCP_V_DST].t = dst;
	in.v[TCP_V_S0].t = src;
	tcp_emit(p, &in);
}

static int errors(tcp_program *p)
{
	moe_ctx *ctx = p->ctx;
	int before = moe_error_count(ctx);
	int bad = tcpl_check_dm(ctx, p, moe_loc_none());
	assert_int_equal(moe_error_count(ctx) - before, bad);
	return bad;
}

/* a written, read; b written over a's bytes after a's last read: no error.
 * The same with a read again after b is written: an error. */
static void test_reuse_after_last_read(void **state)
{
	(void)state;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	tcp_program *p = tcp_prog_new(ctx);
	int32_t a = dm(p, "a", 0), b = dm(p, "b", 32), c = dm(p, "c", 128);
	pass(p, a, -1);
	pass(p, c, a);
	pass(p, b, c);
	assert_int_equal(errors(p), 0);
	pass(p, c, a); /* a read while b holds bytes 32..63 */
	assert_int_equal(errors(p), 1);
	tcp_prog_free(p);
	moe_ctx_free(ctx);
}

/* a written before a loop and read in its body; b written in the body at a's
 * bytes after a's read: the next iteration reads a again, so an error. */
static void test_loop_keeps_outer_tensor_live(void **state)
{
	(void)state;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	tcp_program *p = tcp_prog_new(ctx);
	int32_t a = dm(p, "a", 0), b = dm(p, "b", 0), c = dm(p, "c", 256);
	pass(p, a, -1);
	uint32_t top = p->ncode;
	pass(p, c, a);
	pass(p, b, c);
	tcp_insn br = tcp_insn_init(TCP_OP_BR);
	br.target = (int32_t)top;
	tcp_emit(p, &br);
	assert_int_equal(errors(p), 1);
	/* b at other bytes: none */
	p->t[b].addr = 512;
	assert_int_equal(errors(p), 0);
	tcp_prog_free(p);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reuse_after_last_read),
		cmocka_unit_test(test_loop_keeps_outer_tensor_live),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
