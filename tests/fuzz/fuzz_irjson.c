/* tests/fuzz/fuzz_irjson.c: the JSON IR reader (moe_module_parse_json).
 *
 * A module the reader accepts must export, import back without error and
 * export identically. */
#include <string.h>

#include "moec/ir.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	moe_module *m = moe_module_parse_json(ctx, "fuzz.json", (const char *)data, size);
	fz_check_result(ctx, 0, m != NULL, "moe_module_parse_json");
	if (m) {
		char *j1 = moe_module_to_json(m);
		if (!j1)
			FZ_FAIL("moe_module_to_json failed on a module the reader accepted");
		moe_module *m2 = moe_module_parse_json(ctx, "exported.json", j1, strlen(j1));
		fz_check_result(ctx, 0, m2 != NULL, "moe_module_parse_json (exported form)");
		char *j2 = moe_module_to_json(m2);
		if (!j2 || strcmp(j1, j2))
			FZ_FAIL("export -> import -> export differs:\n--- first\n%s\n--- second\n%s", j1, j2 ? j2 : "(null)");
		moe_free(ctx, j1);
		moe_free(ctx, j2);
		moe_module_free(m2);
	}
	moe_module_free(m);
	fz_ctx_free(ctx, &h);
	return 0;
}
