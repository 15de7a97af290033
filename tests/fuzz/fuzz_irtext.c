/* tests/fuzz/fuzz_irtext.c: the textual IR reader (moe_module_parse_text).
 *
 * Beyond not crashing: a module the reader accepts must print, parse back
 * without error and print identically (ir.h promises the round trip). */
#define _GNU_SOURCE /* open_memstream is POSIX 2008; glibc wants this in C11 mode */
#include <string.h>

#include "moec/ir.h"
#include "tests/fuzz/fuzz_util.h"

static char *print_module(const moe_module *m, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		abort();
	if (moe_module_print(m, f) != MOE_OK)
		FZ_FAIL("moe_module_print failed on a module the reader accepted");
	fclose(f);
	return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	moe_module *m = moe_module_parse_text(ctx, "fuzz.moeir", (const char *)data, size);
	fz_check_result(ctx, 0, m != NULL, "moe_module_parse_text");
	if (m) {
		size_t l1, l2;
		char *p1 = print_module(m, &l1);
		moe_module *m2 = moe_module_parse_text(ctx, "printed.moeir", p1, l1);
		fz_check_result(ctx, 0, m2 != NULL, "moe_module_parse_text (printed form)");
		char *p2 = print_module(m2, &l2);
		if (l1 != l2 || memcmp(p1, p2, l1))
			FZ_FAIL("print -> parse -> print differs:\n--- first\n%s--- second\n%s", p1, p2);
		free(p1);
		free(p2);
		moe_module_free(m2);
	}
	moe_module_free(m);
	fz_ctx_free(ctx, &h);
	return 0;
}
