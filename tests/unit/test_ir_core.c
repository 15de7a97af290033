/* Unit tests of the IR core: building nodes, shape inference, diagnostics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "ir/ir.h"

static void test_build_and_infer(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "l");
	int64_t xs[2] = {5, 48}, ws[2] = {8, 48};
	moe_id x = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, x, MOE_F32, xs, 2);
	moe_node_set_name(g, x, "x");
	moe_id w = moe_node_new(g, MOE_OP_WEIGHT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, w, MOE_F32, ws, 2);
	moe_node_set_name(g, w, "router");
	moe_node_set_str(g, w, "source", "gate.weight");
	moe_id e = ir_b_einsum(g, "td,ed->te", x, w, moe_loc_none());
	assert_int_equal(moe_node_rank(g, e), 2);
	assert_int_equal(moe_node_shape(g, e)[0], 5);
	assert_int_equal(moe_node_shape(g, e)[1], 8);
	moe_id k = moe_node_new(g, MOE_OP_TOPK, &e, 1, moe_loc_at(c, "f.moe", 3, 7));
	moe_node_set_int(g, k, "k", 9);
	assert_int_equal(moe_node_infer(g, k), MOE_ERR_INVALID);
	assert_int_equal(moe_error_count(c), 1);
	const char *msg;
	moe_loc loc;
	moe_diag_get(c, 0, NULL, &loc, &msg);
	assert_non_null(strstr(msg, "K > E"));
	assert_int_equal(loc.line, 3);
	moe_node_set_int(g, k, "k", 2);
	moe_diag_clear(c);
	assert_int_equal(moe_node_infer(g, k), MOE_OK);
	assert_int_equal(moe_node_dtype(g, k), MOE_I32);
	moe_graph_add_output(g, k);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_einsum_mismatch(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_graph *g = ir_graph_new(c, "l");
	int64_t a[2] = {4, 6}, b[2] = {5, 7};
	moe_id x = ir_emit(g, MOE_OP_INPUT, MOE_F32, 2, a, NULL, 0, moe_loc_none());
	moe_id y = ir_emit(g, MOE_OP_INPUT, MOE_F32, 2, b, NULL, 0, moe_loc_none());
	moe_id args[2] = {x, y};
	moe_id e = moe_node_new(g, MOE_OP_EINSUM, args, 2, moe_loc_none());
	moe_node_set_str(g, e, "eq", "ij,jk->ik");
	assert_int_equal(moe_node_infer(g, e), MOE_ERR_INVALID);
	const char *msg;
	moe_diag_get(c, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "index 'j'"));
	ir_graph_free(g);
	moe_ctx_free(c);
}

static void test_overflow(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_graph *g = ir_graph_new(c, "l");
	int64_t a[1] = {(int64_t)1 << 40};
	moe_id x = ir_emit(g, MOE_OP_IOTA, MOE_I32, 1, a, NULL, 0, moe_loc_none());
	assert_int_equal(ir_infer(c, g, x), MOE_ERR_INVALID);
	ir_graph_free(g);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_build_and_infer),
		cmocka_unit_test(test_einsum_mismatch),
		cmocka_unit_test(test_overflow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
