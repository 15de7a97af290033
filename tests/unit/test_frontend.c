/* Unit tests of the public .moe parse API (moec/frontend.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "moec/frontend.h"

static const char good[] =
	"layer l {\n"
	"  dim T = 4, D = 8, E = 4, K = 2\n"
	"  param layer = 3, eps = 1e-20\n"
	"  input x : [T, D]\n"
	"  weight r : [E, D] = \"model.layers.{layer}.gate.{e}\"\n"
	"  idx = topk(einsum(\"td,ed->te\", x, r), K)\n"
	"  y = silu(x) * 2\n"
	"  output y, idx\n"
	"}\n";

static moe_module *parse(moe_ctx *c, const char *text, const moe_setting *s, size_t n)
{
	moe_settings sets = {s, n};
	return moe_parse_moe(c, "t.moe", text, strlen(text), &sets);
}

static void test_parse_good(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(c, good, NULL, 0);
	assert_non_null(m);
	assert_int_equal(moe_error_count(c), 0);
	assert_int_equal(moe_module_num_graphs(m), 1);
	moe_graph *g = moe_module_graph(m, 0);
	assert_string_equal(moe_graph_name(g), "l");
	int64_t v;
	assert_true(moe_graph_get_dim(g, "K", &v));
	assert_int_equal(v, 2);
	assert_true(moe_graph_get_dim(g, "layer", &v));
	assert_int_equal(v, 3);
	assert_false(moe_graph_get_dim(g, "eps", &v));
	assert_int_equal(moe_graph_num_outputs(g), 2);
	assert_string_equal(moe_node_name(g, 0), "x");
	assert_string_equal(moe_node_name(g, 1), "r");
	assert_string_equal(moe_node_get_str(g, 1, "source"), "model.layers.3.gate.{e}");
	moe_id idx = moe_graph_output(g, 1);
	assert_int_equal(moe_node_op(g, idx), MOE_OP_TOPK);
	assert_int_equal(moe_node_dtype(g, idx), MOE_I32);
	assert_string_equal(moe_node_name(g, idx), "idx");
	moe_loc loc = moe_node_loc(g, idx);
	assert_int_equal(loc.line, 6);
	assert_int_equal(loc.col, 9);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_settings(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_setting s[] = {{"T", "7"}, {"layer", "11"}, {"dtype", "bf16"}};
	moe_module *m = parse(c, good, s, 3);
	assert_non_null(m);
	moe_graph *g = moe_module_graph(m, 0);
	assert_int_equal(moe_graph_dtype(g), MOE_BF16);
	assert_int_equal(moe_node_shape(g, 0)[0], 7);
	assert_string_equal(moe_node_get_str(g, 1, "source"), "model.layers.11.gate.{e}");
	moe_module_free(m);

	moe_setting bad[] = {{"nope", "1"}};
	assert_null(parse(c, good, bad, 1));
	assert_int_equal(moe_error_count(c), 1);
	moe_diag_clear(c);
	moe_setting badv[] = {{"T", "x"}, {"dtype", "i32"}, {"K", "9"}};
	assert_null(parse(c, good, badv, 3));
	assert_int_equal(moe_error_count(c), 2); /* T and dtype; nothing cascades from the bad T */
	moe_ctx_free(c);

	char name[8];
	const char *val;
	assert_true(moe_setting_split("T=5", name, sizeof name, &val));
	assert_string_equal(name, "T");
	assert_string_equal(val, "5");
	assert_false(moe_setting_split("=5", name, sizeof name, &val));
	assert_false(moe_setting_split("T5", name, sizeof name, &val));
	assert_false(moe_setting_split("verylongname=5", name, sizeof name, &val));
}

static void test_errors_located(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *text = "layer l {\n  dim T = 4\n  a = b +\n  c = d\n  output c\n}\n";
	assert_null(parse(c, text, NULL, 0));
	assert_int_equal(moe_error_count(c), 1);
	moe_loc loc;
	const char *msg;
	moe_diag_get(c, 0, NULL, &loc, &msg);
	assert_string_equal(loc.file, "t.moe");
	assert_int_equal(loc.line, 3);
	assert_int_equal(loc.col, 10);
	assert_non_null(strstr(msg, "syntax error"));
	moe_diag_clear(c);
	/* semantic errors: every one reported, no cascade */
	text = "layer l {\n  dim T = 4, T = 5\n  input x : [T]\n  y = foo(x) + bar\n  output y\n}\n";
	assert_null(parse(c, text, NULL, 0));
	assert_int_equal(moe_error_count(c), 3); /* T twice, foo, bar */
	moe_diag_clear(c);
	assert_null(parse(c, "", NULL, 0));
	assert_int_equal(moe_error_count(c), 1);
	moe_ctx_free(c);
}

/* Any prefix of a valid file and a few hostile inputs: diagnostics, no crash. */
static void test_no_crash(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t n = strlen(good);
	for (size_t i = 0; i + 1 < n; i++) { /* all but the final newline */
		moe_module *m = moe_parse_moe(c, "p.moe", good, i, NULL);
		assert_null(m);
		assert_true(moe_error_count(c) > 0);
		moe_diag_clear(c);
	}
	static const char *const bad[] = {
		"layer", "layer l { dim T = 99999999999999999999999 }", "layer l {\n \"unterminated\n}",
		"layer l { output ((((((x)))))) }", "\x01\xff layer", "layer l {\n dim T = 1 / 0\n output T\n}",
		"layer l {\n input x : [1,2,3,4,5,6,7,8,9]\n output x\n}", "layer l {\n y = iota([3], axis=5)\n output y\n}",
		"layer l {\n y = experts()\n output y\n}", "layer l {\n y = cast(1, q8)\n output y\n}",
		"layer l {\n dim A = -9223372036854775807 - 1, B = -A\n output 1\n}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		assert_null(moe_parse_moe(c, "b.moe", bad[i], strlen(bad[i]), NULL));
		assert_true(moe_error_count(c) > 0);
		moe_diag_clear(c);
	}
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_good),
		cmocka_unit_test(test_settings),
		cmocka_unit_test(test_errors_located),
		cmocka_unit_test(test_no_crash),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
