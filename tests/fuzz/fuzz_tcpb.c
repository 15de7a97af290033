/* tests/fuzz/fuzz_tcpb.c: the .tcpb loader and validator (moe_tcp_from_binary).
 *
 * Built only when include/moec/tcp.h exists (the TCP backend is in the tree).
 * Input: a whole .tcpb file, validated against the built-in machine. A
 * program the validator accepts must also print its summary and serialise
 * back; its bytes must load again.
 *
 * A mutated file almost never keeps a valid CRC-32, which would stop every
 * input at the checksum; so each input is loaded twice, as given and with
 * the header's CRC (offset 16, over bytes 24..end) recomputed, to reach the
 * section, tensor and instruction validation behind it. */
#include <string.h>

#include "moec/tcp.h"
#include "tests/fuzz/fuzz_util.h"

/* CRC-32 (IEEE 802.3, reflected, as zlib), bitwise. */
static uint32_t crc32_ieee(const uint8_t *p, size_t n)
{
	uint32_t c = 0xffffffffu;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
	}
	return ~c;
}

static void load_one(const uint8_t *data, size_t size)
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
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	load_one(data, size);
	if (size >= 24) {
		uint8_t *fixed = malloc(size);
		if (!fixed)
			abort();
		memcpy(fixed, data, size);
		uint32_t c = crc32_ieee(fixed + 24, size - 24);
		for (int i = 0; i < 4; i++)
			fixed[16 + i] = (uint8_t)(c >> (8 * i));
		if (memcmp(fixed, data, size))
			load_one(fixed, size);
		free(fixed);
	}
	return 0;
}
