/* tests/fuzz/fuzz_hfconfig.c: HuggingFace config import (moe_import_hf_text).
 *
 * Input: config.json text. A first byte below 0x10 is an options selector
 * (bits 0-1: layer 0..3, bit 2: bf16, bit 3: T=1 and B=1) followed by the
 * text. The .moe text of an accepted config is fed to the frontend, which
 * must not crash on it either. */
#include <string.h>

#include "moec/frontend.h"
#include "moec/io.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	moe_import_opts o = {.layer = 0, .tokens = 0, .block = 0, .dtype = MOE_F32, .prefix = NULL};
	if (size > 0 && data[0] < 0x10) {
		o.layer = data[0] & 3;
		o.dtype = (data[0] & 4) ? MOE_BF16 : MOE_F32;
		if (data[0] & 8)
			o.tokens = 1, o.block = 1;
		data++, size--;
	}
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	char *text = NULL;
	moe_status st = moe_import_hf_text(ctx, "config.json", (const char *)data, size, &o, &text);
	fz_check_result(ctx, 0, st == MOE_OK, "moe_import_hf_text");
	if (st == MOE_OK) {
		if (!text)
			FZ_FAIL("moe_import_hf_text returned MOE_OK without text");
		moe_module *m = moe_parse_moe(ctx, "imported.moe", text, strlen(text), NULL);
		moe_module_free(m);
		moe_free(ctx, text);
	} else if (text) {
		FZ_FAIL("moe_import_hf_text failed but returned text");
	}
	fz_ctx_free(ctx, &h);
	return 0;
}
