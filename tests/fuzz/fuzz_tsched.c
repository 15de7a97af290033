/* tests/fuzz/fuzz_tsched.c: the schedule IR's text reader (tcp_sched_parse,
 * backend-tcp/compiler/sched_parse.c) and the verifier it runs.
 *
 * Read without a machine, so that any machine line is accepted and the
 * fuzzer reaches the body. Beyond not crashing: a schedule the reader
 * accepts must print, read back without error and print identically
 * (docs/tcp-compiler.md 4.2, the round-trip contract). */
#include <string.h>

#include "backend-tcp/compiler/sched.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	tcp_sched *s = tcp_sched_parse(ctx, NULL, "fuzz.tsched", (const char *)data, size);
	fz_check_result(ctx, 0, s != NULL, "tcp_sched_parse");
	if (s) {
		char *p1 = NULL, *p2 = NULL;
		size_t l1 = 0, l2 = 0;
		if (tcp_sched_print(s, &p1, &l1) != MOE_OK)
			FZ_FAIL("tcp_sched_print failed on a schedule the reader accepted");
		tcp_sched *t = tcp_sched_parse(ctx, NULL, "printed.tsched", p1, l1);
		fz_check_result(ctx, 0, t != NULL, "tcp_sched_parse (printed form)");
		if (tcp_sched_print(t, &p2, &l2) != MOE_OK)
			FZ_FAIL("tcp_sched_print failed on the printed form read back");
		if (l1 != l2 || memcmp(p1, p2, l1))
			FZ_FAIL("print -> parse -> print differs:\n--- first\n%.*s--- second\n%.*s", (int)l1, p1, (int)l2, p2);
		ctx_free(ctx, p1, l1);
		ctx_free(ctx, p2, l2);
		tcp_sched_free(t);
	}
	tcp_sched_free(s);
	fz_ctx_free(ctx, &h);
	return 0;
}
