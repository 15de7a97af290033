/* tests/fuzz/fuzz_moe.c: the .moe frontend (moe_parse_moe).
 *
 * Input: .moe text. When the first byte is below 0x08 it is not text but a
 * selector of one of the --set lists below, and the text follows it; this
 * lets the fuzzer combine any source with overrides, valid or not. */
#include <string.h>

#include "moec/frontend.h"
#include "tests/fuzz/fuzz_util.h"

static const moe_setting set_t1[] = {{"T", "1"}};
static const moe_setting set_bf16[] = {{"dtype", "bf16"}};
static const moe_setting set_mix[] = {{"dtype", "f32"}, {"T", "3"}, {"B", "2"}};
static const moe_setting set_ek[] = {{"E", "3"}, {"K", "2"}, {"layer", "7"}};
static const moe_setting set_zero[] = {{"T", "0"}};
static const moe_setting set_huge[] = {{"D", "99999999999999999999"}, {"F", "-1"}};
static const moe_setting set_junk[] = {{"nosuch", "1"}, {"K", "abc"}, {"dtype", "f64"}};

static const moe_settings sets[8] = {
	{NULL, 0},
	{set_t1, 1},
	{set_bf16, 1},
	{set_mix, 3},
	{set_ek, 3},
	{set_zero, 1},
	{set_huge, 2},
	{set_junk, 3},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const moe_settings *s = NULL;
	if (size > 0 && data[0] < 8) {
		s = &sets[data[0]];
		data++, size--;
	}
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	moe_module *m = moe_parse_moe(ctx, "fuzz.moe", (const char *)data, size, s);
	fz_check_result(ctx, 0, m != NULL, "moe_parse_moe");
	moe_module_free(m);
	fz_ctx_free(ctx, &h);
	return 0;
}
