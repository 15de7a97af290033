/* tests/fuzz/fuzz_tcpb.c: the .tcpb loader and validator (moe_tcp_from_binary).
 *
 * Built only when include/moec/tcp.h exists (the TCP backend is in the tree).
 * Input: a whole .tcpb file, validated against the built-in machine. A
 * program the validator accepts must also print its summary and serialise
 * back; its bytes must load again. */
#include "moec/tcp.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	moe_tcp_program *p = moe_tcp_from_binary(ctx, "fuzz.tcpb", data, size, NULL);
	fz_check_result(ctx, 0, p != NULL, "moe_tcp_from_binary");
	if (p) {
		if (moe_tcp_print_summary(p, fz_sink()) != MOE_OK)
			FZ_FAIL("moe_tcp_print_summary failed on an accepted program");
		uint8_t *bin = NULL;
		size_t len = 0;
		if (moe_tcp_to_binary(ctx, p, &bin, &len) != MOE_OK)
			FZ_FAIL("moe_tcp_to_binary failed on an accepted program");
		moe_tcp_program *q = moe_tcp_from_binary(ctx, "reserialised.tcpb", bin, len, NULL);
		fz_check_result(ctx, 0, q != NULL, "moe_tcp_from_binary (reserialised)");
		moe_tcp_program_free(q);
		moe_free(ctx, bin);
		moe_tcp_program_free(p);
	}
	fz_ctx_free(ctx, &h);
	return 0;
}
