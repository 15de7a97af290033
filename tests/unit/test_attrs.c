/* The attribute schema of the op table (ATTRS rows of moec/ops.def) as the
 * verifier applies it to a graph built through the API: an unknown key, a
 * value of the wrong kind and a string outside the allowed values are errors
 * at the node's location; declared attributes and the metadata of the open
 * leaves (weight, const) pass. The readers' checks are lit tests
 * (tests/lit/frontend/bad_attr.moe, tests/lit/ir/bad_attr*). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "moec/moec.h"

/* A softmax layer; returns the softmax node. */
static moe_id layer(moe_ctx *c, moe_module **m)
{
	*m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(*m, "l");
	moe_id x = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_at(c, "a.moe", 1, 1));
	moe_node_set_type(g, x, MOE_F32, (int64_t[]){4, 8}, 2);
	moe_node_set_name(g, x, "x");
	moe_id s = moe_node_new(g, MOE_OP_SOFTMAX, &x, 1, moe_loc_at(c, "a.moe", 3, 7));
	moe_node_set_int(g, s, "axis", -1);
	assert_int_equal(moe_node_infer(g, s), MOE_OK);
	moe_graph_add_output(g, s);
	return s;
}

static const char *first_error(moe_ctx *c, moe_loc *loc)
{
	const char *msg = NULL;
	assert_true(moe_diag_count(c) > 0);
	moe_diag_get(c, 0, NULL, loc, &msg);
	return msg;
}

static void test_verifier_rejects_unknown_key(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_id s = layer(c, &m);
	moe_graph *g = moe_module_graph(m, 0);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);
	moe_node_set_int(g, s, "axsi", 0);
	assert_int_equal(moe_graph_verify(c, g), MOE_ERR_INVALID);
	moe_loc loc;
	const char *msg = first_error(c, &loc);
	assert_string_equal(msg, "'softmax' has no attribute 'axsi' (its attributes: axis)");
	assert_int_equal(loc.line, 3);
	assert_int_equal(loc.col, 7);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_verifier_rejects_wrong_kind(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_id s = layer(c, &m);
	moe_graph *g = moe_module_graph(m, 0);
	moe_node_set_str(g, s, "axis", "last");
	assert_int_equal(moe_graph_verify(c, g), MOE_ERR_INVALID);
	assert_string_equal(first_error(c, NULL), "attribute 'axis' of 'softmax' must be an integer");
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_open_leaves_keep_metadata(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "l");
	moe_id w = moe_node_new(g, MOE_OP_WEIGHT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, w, MOE_F32, (int64_t[]){4}, 1);
	moe_node_set_name(g, w, "w");
	moe_node_set_str(g, w, "source", "w.weight");
	moe_node_set_str(g, w, "origin", "checkpoint 3"); /* metadata: not a declared key */
	moe_graph_add_output(g, w);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);
	moe_node_set_int(g, w, "source", 3); /* a declared key keeps its kind */
	assert_int_equal(moe_graph_verify(c, g), MOE_ERR_INVALID);
	assert_string_equal(first_error(c, NULL), "attribute 'source' of 'weight' must be a string");
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_verifier_rejects_unknown_key),
		cmocka_unit_test(test_verifier_rejects_wrong_kind),
		cmocka_unit_test(test_open_leaves_keep_metadata),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
