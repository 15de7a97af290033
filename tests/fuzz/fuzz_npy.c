/* tests/fuzz/fuzz_npy.c: NumPy .npy arrays (moe_npy_parse).
 *
 * Input: a whole .npy file, parsed once for each tensor dtype a caller may
 * ask for; an accepted array must have the element count its shape says. */
#include "moec/io.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const moe_dtype want[] = {MOE_F32, MOE_BF16, MOE_I32, MOE_BOOL};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		fz_heap h;
		moe_ctx *ctx = fz_ctx_new(&h);
		moe_tensor *t = moe_npy_parse(ctx, "fuzz.npy", data, size, want[i]);
		fz_check_result(ctx, 0, t != NULL, "moe_npy_parse");
		if (t) {
			int64_t n = 1;
			for (int k = 0; k < t->rank; k++)
				n *= t->shape[k];
			if (t->dtype != want[i] || n != moe_tensor_numel(t))
				FZ_FAIL("accepted array: dtype %d (wanted %d), numel %lld vs shape",
					(int)t->dtype, (int)want[i], (long long)moe_tensor_numel(t));
		}
		moe_tensor_free(ctx, t);
		fz_ctx_free(ctx, &h);
	}
	return 0;
}
