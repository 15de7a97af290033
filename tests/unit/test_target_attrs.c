/* Target attribute sets (docs/ir.md "Target attributes"): a toy target
 * registers its keys on one context, where the textual and JSON readers and
 * the verifier then accept them (with their kind and op class checked) and
 * the printers write them back unchanged; a context without the registration
 * refuses them; registering is checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "moec/moec.h"
#include "graph_fx.h"

static const ir_target_attr toy[] = {
	{"toy_lanes", IR_AT_INT, 8, 0, "lanes of the toy vector unit"},
	{"toy_mode", IR_AT_STR, 0, OPF_ELEM, "how an elementwise op is issued"},
	{"toy_tiles", IR_AT_INTS, 0, 0, "tile sizes"},
	{NULL, IR_AT_INT, 0, 0, NULL},
};

static const char marked[] = "moeir 1\n"
			     "layer @t dtype=f32 {\n"
			     "  %0 = input \"x\" : f32[4, 8]\n"
			     "  %1 = exp(%0) {toy_lanes=4, toy_mode=\"dual\"} : f32[4, 8]\n"
			     "  %2 = softmax(%1) {axis=-1, toy_tiles=[2, 8]} : f32[4, 8]\n"
			     "  output %2\n"
			     "}\n";

static const char *error_at(moe_ctx *c, int *line, int *col)
{
	const char *msg = NULL;
	moe_loc loc;
	assert_true(moe_diag_count(c) > 0);
	moe_diag_get(c, 0, NULL, &loc, &msg);
	*line = loc.line;
	*col = loc.col;
	return msg;
}

/* Replace the first `from` of marked with `to`. */
static char *edited(const char *from, const char *to)
{
	const char *at = strstr(marked, from);
	assert_non_null(at);
	size_t n = strlen(marked) - strlen(from) + strlen(to) + 1;
	char *s = malloc(n);
	snprintf(s, n, "%.*s%s%s", (int)(at - marked), marked, to, at + strlen(from));
	return s;
}

static void test_registered_keys_read_verify_and_print_back(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	assert_false(ir_target_attrs_registered(c, "toy"));
	assert_int_equal(ir_target_attrs_register(c, "toy", toy), MOE_OK);
	assert_true(ir_target_attrs_registered(c, "toy"));
	const ir_attrspec *s = ir_attr_spec(c, MOE_OP_SOFTMAX, "toy_lanes");
	assert_non_null(s);
	assert_int_equal(s->type, IR_AT_INT);
	assert_int_equal(s->idef, 8);
	assert_null(ir_attr_spec(c, MOE_OP_SOFTMAX, "toy_mode")); /* elementwise ops only */
	assert_non_null(ir_attr_spec(c, MOE_OP_EXP, "toy_mode"));

	moe_module *m = moe_module_parse_text(c, "t.moeir", marked, strlen(marked));
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	assert_int_equal(moe_module_verify(c, m), MOE_OK);
	char *text = print_module(m);
	assert_string_equal(text, marked);
	char *json = moe_module_to_json(m);
	assert_non_null(json);
	moe_module *j = moe_module_parse_json(c, "t.json", json, strlen(json));
	assert_non_null(j);
	char *text2 = print_module(j);
	assert_string_equal(text2, marked);
	assert_int_equal(moe_diag_count(c), 0);
	free(text);
	free(text2);
	moe_free(c, json);
	moe_module_free(j);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_registered_keys_are_checked(void **st)
{
	(void)st;
	static const struct {
		const char *from, *to, *msg;
		int line, col;
	} bad[] = {
		{"toy_lanes=4", "toy_lane=4",
			"target 'toy' has no attribute 'toy_lane' (its attributes: toy_lanes, toy_mode, toy_tiles)", 4, 17},
		{"toy_lanes=4", "toy_lanes=\"four\"", "attribute 'toy_lanes' of 'exp' must be an integer", 4, 17},
		{"toy_tiles=", "toy_mode=\"dual\", toy_tiles=", "attribute 'toy_mode' of target 'toy' is not allowed on 'softmax'",
			5, 30},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		assert_int_equal(ir_target_attrs_register(c, "toy", toy), MOE_OK);
		char *src = edited(bad[i].from, bad[i].to);
		assert_null(moe_module_parse_text(c, "t.moeir", src, strlen(src)));
		int line, col;
		assert_string_equal(error_at(c, &line, &col), bad[i].msg);
		assert_int_equal(line, bad[i].line);
		assert_int_equal(col, bad[i].col);
		free(src);
		moe_ctx_free(c);
	}
}

/* Without the registration the toy keys are no op's attributes, and the
 * verifier refuses a key of the tcp target, naming it. */
static void test_unregistered_context_refuses(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	assert_null(moe_module_parse_text(c, "t.moeir", marked, strlen(marked)));
	int line, col;
	assert_string_equal(error_at(c, &line, &col), "'exp' has no attribute 'toy_lanes' (its attributes: none)");
	assert_int_equal(line, 4);
	moe_diag_clear(c);

	char *src = edited("toy_lanes=4, toy_mode=\"dual\"", "tcp_fuse=0");
	moe_module *m = moe_module_parse_text(c, "t.moeir", src, strlen(src));
	assert_null(m);
	assert_string_equal(error_at(c, &line, &col),
		"attribute tcp_fuse belongs to the target 'tcp', which is not registered in this context");
	assert_int_equal(line, 4);
	assert_int_equal(col, 17);
	free(src);
	moe_diag_clear(c);

	/* the verifier, on a graph built through the API: at the node */
	assert_int_equal(ir_target_attrs_register(c, "toy", toy), MOE_OK);
	src = edited("toy_lanes=4, toy_mode=\"dual\"", "toy_lanes=4");
	m = moe_module_parse_text(c, "t.moeir", src, strlen(src));
	assert_non_null(m);
	moe_graph *g = moe_module_graph(m, 0);
	moe_node_set_int(g, 1, "tcp_view", 1);
	assert_int_equal(moe_graph_verify(c, g), MOE_ERR_INVALID);
	assert_string_equal(error_at(c, &line, &col),
		"attribute tcp_view belongs to the target 'tcp', which is not registered in this context");
	assert_int_equal(line, 4);
	assert_int_equal(col, 3);
	free(src);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_registration_is_checked(void **st)
{
	(void)st;
	static const ir_target_attr no_prefix[] = {{"lanes", IR_AT_INT, 0, 0, NULL}, {NULL, IR_AT_INT, 0, 0, NULL}};
	static const ir_target_attr other[] = {{"tcp_fuse", IR_AT_INT, 0, 0, NULL}, {NULL, IR_AT_INT, 0, 0, NULL}};
	static const ir_target_attr twice[] = {
		{"toy_a", IR_AT_INT, 0, 0, NULL}, {"toy_a", IR_AT_INT, 0, 0, NULL}, {NULL, IR_AT_INT, 0, 0, NULL}};
	static const ir_target_attr empty[] = {{NULL, IR_AT_INT, 0, 0, NULL}};
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	assert_int_equal(ir_target_attrs_register(c, "toy", no_prefix), MOE_ERR_INVALID);
	assert_int_equal(ir_target_attrs_register(c, "toy", other), MOE_ERR_INVALID);
	assert_int_equal(ir_target_attrs_register(c, "toy", twice), MOE_ERR_INVALID);
	assert_int_equal(ir_target_attrs_register(c, "toy", empty), MOE_ERR_INVALID);
	assert_int_equal(ir_target_attrs_register(c, "Toy", toy), MOE_ERR_INVALID);
	assert_int_equal(ir_target_attrs_register(c, "toy_x", toy), MOE_ERR_INVALID);
	assert_false(ir_target_attrs_registered(c, "toy"));
	assert_int_equal(ir_target_attrs_register(c, "toy", toy), MOE_OK);
	assert_int_equal(ir_target_attrs_register(c, "toy", toy), MOE_ERR_INVALID);
	assert_int_equal(moe_error_count(c), 7);
	/* the TCP target registers its set once, however often it is asked */
	assert_int_equal(moe_tcp_register_passes(c), MOE_OK);
	assert_int_equal(moe_tcp_register_passes(c), MOE_OK);
	assert_true(ir_target_attrs_registered(c, "tcp"));
	assert_int_equal(moe_error_count(c), 7);
	moe_ctx_free(c);
}

typedef struct budget {
	long left; /* allocations still granted; < 0: no limit */
} budget;

static void *budget_alloc(void *ud, void *p, size_t o, size_t n)
{
	(void)o;
	budget *b = ud;
	if (n == 0) {
		free(p);
		return NULL;
	}
	if (b->left == 0)
		return NULL;
	if (b->left > 0)
		b->left--;
	return realloc(p, n);
}

/* Registration under an allocator that refuses its k-th block, for every k
 * until it succeeds: MOE_ERR_NOMEM leaves nothing registered, and the same
 * context registers the set once memory is granted again. */
static void test_registration_out_of_memory(void **st)
{
	(void)st;
	bool done = false;
	int refused = 0;
	for (long k = 0; !done && k < 64; k++) {
		budget b = {-1};
		moe_ctx *c = moe_ctx_new(budget_alloc, &b);
		assert_non_null(c);
		b.left = k;
		moe_status r = ir_target_attrs_register(c, "toy", toy);
		b.left = -1;
		if (r == MOE_OK) {
			done = true;
		} else {
			assert_int_equal(r, MOE_ERR_NOMEM);
			refused++;
			assert_false(ir_target_attrs_registered(c, "toy"));
			assert_int_equal(ir_target_attrs_register(c, "toy", toy), MOE_OK);
		}
		assert_true(ir_target_attrs_registered(c, "toy"));
		assert_non_null(ir_attr_spec(c, MOE_OP_EXP, "toy_mode"));
		moe_ctx_free(c);
	}
	assert_true(done);
	assert_true(refused > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_registered_keys_read_verify_and_print_back),
		cmocka_unit_test(test_registered_keys_are_checked),
		cmocka_unit_test(test_unregistered_context_refuses),
		cmocka_unit_test(test_registration_is_checked),
		cmocka_unit_test(test_registration_out_of_memory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
