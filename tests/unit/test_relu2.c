/* relu2 (squared ReLU, nemotron_h's expert activation): hand-computed values
 * through the interpreter and both host engines, in f32 and bf16, including
 * -0, NaN and the single rounding of the square to bf16. The op x executor
 * matrix (test_op_matrix) runs it on random data on every executor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "moec/backend.h"
#include "moec/moec.h"

enum { N = 8 };
static const float xs[N] = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f, 1.0078125f, -1e30f, NAN};
/* max(x, 0)^2, the square rounded once to f32 */
static const float want_f32[N] = {0.0f, 0.0f, 0.0f, 0.25f, 9.0f, 1.01568603515625f, 0.0f, NAN};
/* in bf16: 1.0078125^2 = 1.0156860... rounds to 1.015625 */
static const float want_bf16[N] = {0.0f, 0.0f, 0.0f, 0.25f, 9.0f, 1.015625f, 0.0f, NAN};

static void check(moe_dtype t, const float *want)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	static const char src[] = "layer l {\n  dim N = 8\n  input x : [N]\n  y = relu2(x)\n  output y\n}\n";
	moe_setting set = {"dtype", t == MOE_BF16 ? "bf16" : "f32"};
	moe_settings sets = {&set, 1};
	moe_module *m = moe_parse_moe(ctx, "relu2.moe", src, strlen(src), &sets);
	if (!m)
		moe_diag_print(ctx, stderr);
	assert_non_null(m);
	moe_graph *g = moe_module_graph(m, 0);
	int64_t n = N;
	moe_tensor *x = moe_tensor_new(ctx, t, 1, &n);
	for (int i = 0; i < N; i++) {
		if (t == MOE_BF16)
			((uint16_t *)x->data)[i] = moe_f32_to_bf16(xs[i]);
		else
			((float *)x->data)[i] = xs[i];
	}
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	moe_tensor_map_set(b, "x", x);
	moe_tensor *y[3] = {NULL, NULL, NULL};
	assert_int_equal(moe_interp_run(ctx, g, b, &y[0]), MOE_OK);
	assert_int_equal(moe_run_pipeline_text(ctx, "host", m, NULL), MOE_OK);
	g = moe_module_graph(m, 0);
	assert_int_equal(moe_host_run(ctx, g, b, MOE_HOST_LLVM, 1, &y[1], NULL), MOE_OK);
	assert_int_equal(moe_host_run(ctx, g, b, MOE_HOST_C, 1, &y[2], NULL), MOE_OK);
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < N; i++) {
			float v = t == MOE_BF16 ? moe_bf16_to_f32(((uint16_t *)y[k]->data)[i]) : ((float *)y[k]->data)[i];
			if (isnan(want[i])) {
				assert_true(isnan(v));
			} else {
				assert_true(v == want[i]);
				assert_false(signbit(v)); /* relu2(-0) is +0 */
			}
		}
		moe_tensor_free(ctx, y[k]);
	}
	moe_tensor_map_free(b);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

static void test_relu2_f32(void **st)
{
	(void)st;
	check(MOE_F32, want_f32);
}

static void test_relu2_bf16(void **st)
{
	(void)st;
	check(MOE_BF16, want_bf16);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_relu2_f32),
		cmocka_unit_test(test_relu2_bf16),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
