/* Unit tests of the IR core: building nodes, shape inference, diagnostics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "ir/ir.h"
#include "moec/runtime.h"

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

/* An external pass rewrites neg(exp(x)) + 1 into abs(x) + 1 with the public
 * API: new nodes appended, uses replaced, compacted back into order; the
 * interpreter then computes the rewritten graph. A cycle is refused. */
static void test_rewrite_and_compact(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "l");
	int64_t xs[1] = {4};
	moe_id x = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, x, MOE_F32, xs, 1);
	moe_node_set_name(g, x, "x");
	moe_id e = ir_b1(g, MOE_OP_EXP, x, moe_loc_none());
	moe_id ng = ir_b1(g, MOE_OP_NEG, e, moe_loc_none());
	moe_id one = ir_b_const(g, MOE_F32, 1.0, moe_loc_none());
	moe_id y = ir_b2(g, MOE_OP_ADD, ng, one, moe_loc_none());
	moe_graph_add_output(g, y);
	moe_graph_add_output(g, ng);
	assert_int_equal(moe_graph_num_nodes(g), 5);
	moe_id a = ir_b1(g, MOE_OP_ABS, x, moe_loc_none()); /* appended after its users-to-be */
	assert_int_equal(moe_graph_replace_uses(g, ng, a), 2); /* the add's operand and output 1 */
	moe_id map[6];
	assert_int_equal(moe_graph_compact(c, g, map), MOE_OK);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);
	assert_int_equal(moe_graph_num_nodes(g), 4); /* x, const, abs, add: exp and neg dropped */
	assert_int_equal(map[e], MOE_NONE);
	assert_int_equal(map[ng], MOE_NONE);
	assert_int_equal(moe_node_op(g, map[a]), MOE_OP_ABS);
	assert_true(map[a] < map[y]);
	assert_int_equal(moe_graph_output(g, 0), map[y]);
	assert_int_equal(moe_graph_output(g, 1), map[a]);
	moe_tensor_map *b = moe_tensor_map_new(c);
	moe_tensor *xt = moe_tensor_new(c, MOE_F32, 1, xs);
	float xv[4] = {-2.0f, -0.5f, 0.0f, 3.0f};
	memcpy(xt->data, xv, sizeof xv);
	moe_tensor_map_set(b, "x", xt);
	moe_tensor *out[2] = {0};
	assert_int_equal(moe_interp_run(c, g, b, out), MOE_OK);
	for (int i = 0; i < 4; i++) {
		assert_true(((float *)out[0]->data)[i] == (xv[i] < 0 ? -xv[i] : xv[i]) + 1.0f);
		assert_true(((float *)out[1]->data)[i] == (xv[i] < 0 ? -xv[i] : xv[i]));
	}
	moe_tensor_free(c, out[0]);
	moe_tensor_free(c, out[1]);
	moe_tensor_map_free(b);
	/* a cycle: abs reads the add that reads it */
	moe_node_set_arg(g, map[a], 0, map[y]);
	assert_int_equal(moe_graph_compact(c, g, NULL), MOE_ERR_INVALID);
	assert_true(moe_error_count(c) == 1);
	const char *msg;
	moe_diag_get(c, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "cycle"));
	assert_int_equal(moe_graph_num_nodes(g), 4); /* unchanged */
	moe_diag_clear(c);

	/* v = f(old): f keeps reading old; an unused input survives compaction */
	moe_graph *h = moe_module_add_graph(m, "h");
	moe_id hx = moe_node_new(h, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(h, hx, MOE_F32, xs, 1);
	moe_node_set_name(h, hx, "x");
	moe_id hu = moe_node_new(h, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(h, hu, MOE_F32, xs, 1);
	moe_node_set_name(h, hu, "unused");
	moe_id he = ir_b1(h, MOE_OP_EXP, hx, moe_loc_none());
	moe_id hn = ir_b1(h, MOE_OP_NEG, he, moe_loc_none());
	moe_graph_add_output(h, hn);
	moe_id two = ir_b_const(h, MOE_F32, 2.0, moe_loc_none());
	moe_id hv = ir_b2(h, MOE_OP_MUL, he, two, moe_loc_none()); /* v = 2 * exp(x) */
	assert_int_equal(moe_graph_replace_uses(h, he, hv), 1); /* only neg's operand */
	assert_int_equal(moe_node_arg(h, hv, 0), he);
	moe_id hm[8];
	assert_int_equal(moe_graph_compact(c, h, hm), MOE_OK);
	assert_int_equal(moe_graph_verify(c, h), MOE_OK);
	assert_int_not_equal(hm[hu], MOE_NONE);
	assert_int_equal(moe_node_arg(h, hm[hn], 0), hm[hv]);
	assert_int_equal(moe_node_arg(h, hm[hv], 0), hm[he]);
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
		cmocka_unit_test(test_rewrite_and_compact),
		cmocka_unit_test(test_einsum_mismatch),
		cmocka_unit_test(test_overflow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
