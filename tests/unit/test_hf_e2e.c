/* End to end on the HuggingFace fixtures: import-hf -> .moe -> frontend ->
 * weights from model.safetensors -> reference interpreter on x_*.npy, compared
 * with HF's own y_*.npy. f32 must agree to float rounding (any routing
 * difference would show as an O(1) error); bf16 to a couple of bf16 ulps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "moec/frontend.h"
#include "moec/io.h"

#define FIX MOEC_SOURCE_DIR "/tests/fixtures/hf/"

static void run_case(const char *fam, int T, moe_dtype dt)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char p[512], xp[600], yp[600];
	snprintf(p, sizeof p, FIX "%s/config.json", fam);
	moe_import_opts o = {.layer = 0, .tokens = T, .block = 4, .dtype = dt, .prefix = NULL};
	char *text = NULL;
	assert_int_equal(moe_import_hf(c, p, &o, &text), MOE_OK);
	moe_module *m = moe_parse_moe(c, "generated.moe", text, strlen(text), NULL);
	if (!m) {
		moe_diag_print(c, stderr);
		fail_msg("%s: the generated .moe does not parse", fam);
	}
	moe_graph *g = moe_module_graph(m, 0);
	moe_tensor_map *bind = moe_tensor_map_new(c);
	snprintf(p, sizeof p, FIX "%s", fam);
	const char *paths[] = {p};
	assert_int_equal(moe_weights_load(c, g, paths, 1, bind), MOE_OK);
	const char *tag = dt == MOE_BF16 ? "bfloat16" : "float32";
	snprintf(xp, sizeof xp, "%s/x_%s_T%d.npy", p, tag, T);
	snprintf(yp, sizeof yp, "%s/y_%s_T%d.npy", p, tag, T);
	moe_tensor *x = moe_npy_read(c, xp, dt), *y = moe_npy_read(c, yp, MOE_F32);
	assert_non_null(x);
	assert_non_null(y);
	moe_tensor_map_set(bind, "x", x);
	moe_tensor *out[1] = {NULL};
	if (moe_interp_run(c, g, bind, out) != MOE_OK) {
		moe_diag_print(c, stderr);
		fail_msg("%s: interpreter failed", fam);
	}
	assert_int_equal(out[0]->rank, 2);
	assert_int_equal(out[0]->shape[0], T);
	double tol = dt == MOE_BF16 ? 1.6e-2 : 1e-5;
	for (int64_t i = 0; i < moe_tensor_numel(y); i++) {
		float r = ((float *)y->data)[i];
		float v = dt == MOE_BF16 ? moe_bf16_to_f32(((uint16_t *)out[0]->data)[i]) : ((float *)out[0]->data)[i];
		if (!(fabs((double)v - r) <= tol * (1 + fabs(r))))
			fail_msg("%s T=%d %s: y[%lld] = %g, HF has %g", fam, T, tag, (long long)i, v, r);
	}
	moe_tensor_free(c, out[0]);
	moe_tensor_free(c, y);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	moe_free(c, text);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

static void test_f32(void **st)
{
	(void)st;
	static const char *const fams[] = {"mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3",
		"llama4"};
	static const int Ts[] = {1, 5, 64};
	for (size_t i = 0; i < sizeof fams / sizeof *fams; i++)
		for (size_t k = 0; k < 3; k++)
			run_case(fams[i], Ts[k], MOE_F32);
}

static void test_bf16(void **st)
{
	(void)st;
	static const int Ts[] = {1, 5, 64};
	for (size_t k = 0; k < 3; k++) {
		run_case("mixtral", Ts[k], MOE_BF16);
		run_case("qwen3_moe", Ts[k], MOE_BF16);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_f32),
		cmocka_unit_test(test_bf16),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
