/* The schedule verifier's DM placement check (backend-tcp/compiler/sched_verify.c,
 * docs/tcp-compiler.md 5.6) on small written schedules: two DM buffers on the
 * same bytes are an error only while both are live, and a buffer whose
 * lifetime reaches into a block loop from outside it is live through the
 * whole loop (the next block reads it again). Each refusal is a diagnostic
 * naming the buffer, the bytes and the other buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/sched.h"

#define HEAD                                                                                                 \
	"tcpsched 1\n"                                                                                       \
	"machine \"RNGD (TCP), one chip\"\n"                                                                 \
	"meta T=16 K=1 D=64 F=0 E=1 B=16 G=4 nproj=0 router_e=0 wexp=0 act=4096 rmacs=0 dtype=f32\n"         \
	"features granted=0x0 refused=0x0\n"
#define ADD "chain=[f.add(s0,imm,#0x3fc00000,c0,0)]"

/* Reads text (tcp_sched_parse verifies what it read, tcp_sched_verify):
 * the number of errors reported, each a diagnostic, the schedule refused
 * when there is one; with want the diagnostic holds it. */
static int errors(const char *text, const char *want)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	assert_non_null(m);
	tcp_sched *s = tcp_sched_parse(ctx, m, "dm.tsched", text, strlen(text));
	int bad = moe_error_count(ctx);
	assert_int_equal(s == NULL, bad > 0);
	if (s)
		assert_int_equal(tcp_sched_verify(s), MOE_OK);
	if (want) {
		char *d = moe_diag_string(ctx);
		assert_non_null(d);
		if (!strstr(d, want))
			fprintf(stderr, "diagnostic lacks '%s':\n%s", want, d);
		assert_non_null(strstr(d, want));
		moe_free(ctx, d);
	}
	tcp_sched_free(s);
	moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
	return bad;
}

/* a written, read; b written over a's bytes 16..31 after a's last read: no
 * error. The same with a read again after b is written: an error. */
static void test_reuse_after_last_read(void **state)
{
	(void)state;
	static const char ok[] =
		HEAD "buf %0 \"x\" hbm input f32[16,64] at=0\n"
		     "buf %1 \"a\" dm scratch f32[16,64] life=@0..@1 layout=flit(0,512,1,32) at=0\n"
		     "buf %2 \"c\" dm scratch f32[16,64] life=@1..@2 layout=flit(0,512,1,32) at=64\n"
		     "buf %3 \"b\" dm scratch f32[16,64] life=@2..@2 layout=flit(0,512,1,32) at=16\n"
		     "op @0 dma.copy ph=routing dims=[1024] dst=%1+0:[1] s0=%0+0:[1]\n"
		     "op @1 tu.vec ph=routing dims=[16,64] dst=%2+0:[64,1] s0=%1+0:[64,1] " ADD " deps=[@0]\n"
		     "op @2 tu.vec ph=routing dims=[16,64] dst=%3+0:[64,1] s0=%2+0:[64,1] " ADD " deps=[@1]\n";
	assert_int_equal(errors(ok, NULL), 0);
	static const char bad[] =
		HEAD "buf %0 \"x\" hbm input f32[16,64] at=0\n"
		     "buf %1 \"a\" dm scratch f32[16,64] life=@0..@3 layout=flit(0,512,1,32) at=0\n"
		     "buf %2 \"c\" dm scratch f32[16,64] life=@1..@3 layout=flit(0,512,1,32) at=64\n"
		     "buf %3 \"b\" dm scratch f32[16,64] life=@2..@2 layout=flit(0,512,1,32) at=16\n"
		     "op @0 dma.copy ph=routing dims=[1024] dst=%1+0:[1] s0=%0+0:[1]\n"
		     "op @1 tu.vec ph=routing dims=[16,64] dst=%2+0:[64,1] s0=%1+0:[64,1] " ADD " deps=[@0]\n"
		     "op @2 tu.vec ph=routing dims=[16,64] dst=%3+0:[64,1] s0=%2+0:[64,1] " ADD " deps=[@1]\n"
		     "op @3 tu.vec ph=routing dims=[16,64] dst=%2+0:[64,1] s0=%1+0:[64,1] " ADD " deps=[@2]\n";
	assert_int_equal(errors(bad, "buffer %3: shares dm bytes 16..31 with buffer %1 'a' while both are live"), 1);
}

/* a written before a block loop and read in its body; b written in the body
 * at a's bytes after a's read: the next block reads a again, so an error,
 * though in program order b's span begins after a's ends. b at other bytes:
 * none. */
#define LOOP(b_at)                                                                                           \
	HEAD "buf %0 \"x\" hbm input f32[16,64] at=0\n"                                                      \
	     "buf %1 \"counts\" hbm scratch i32[16] at=8192\n"                                               \
	     "buf %2 \"a\" dm scratch f32[16,64] life=@0..@1 layout=flit(0,512,1,32) at=0\n"                 \
	     "buf %3 \"c\" dm scratch f32[16,64] life=loop layout=flit(0,512,1,32) at=64\n"                  \
	     "buf %4 \"b\" dm scratch f32[16,64] life=@2..@3 layout=flit(0,512,1,32) at=" b_at "\n"          \
	     "buf %5 \"y\" hbm output f32[16,64] at=16384\n"                                                 \
	     "op @0 dma.copy ph=routing dims=[1024] dst=%2+0:[1] s0=%0+0:[1]\n"                              \
	     "$nb = ld %1[0]\n"                                                                              \
	     "$g = loopidx 0\n"                                                                              \
	     "$e = ld %1[$g]\n"                                                                              \
	     "$rows = alu.add $e, 3\n"                                                                       \
	     "loop 0 grid=4 nb=$nb g=$g expert=$e rows=$rows weights=double prefetch=0 ring=0 row_slots=1 {\n" \
	     "  prologue {\n"                                                                                \
	     "  }\n"                                                                                         \
	     "  body {\n"                                                                                    \
	     "    op @1 tu.vec ph=expert dims=[16,64] dst=%3+0:[64,1] s0=%2+0:[64,1] " ADD " deps=[@0,@2^1]\n" \
	     "    op @2 tu.vec ph=expert dims=[16,64] dst=%4+0:[64,1] s0=%3+0:[64,1] " ADD " deps=[@1,@3^1]\n" \
	     "    op @3 dma.copy ph=expert dims=[1024] dst=%5+0:[1] s0=%4+0:[1] deps=[@2,@3^1]\n"             \
	     "  }\n"                                                                                         \
	     "  epilogue {\n"                                                                                \
	     "  }\n"                                                                                         \
	     "}\n"

static void test_loop_keeps_outer_buffer_live(void **state)
{
	(void)state;
	static const char bad[] = LOOP("16");
	assert_int_equal(errors(bad, "buffer %4: shares dm bytes 16..31 with buffer %2 'a' while both are live"), 1);
	static const char ok[] = LOOP("128");
	assert_int_equal(errors(ok, NULL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reuse_after_last_read),
		cmocka_unit_test(test_loop_keeps_outer_buffer_live),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
