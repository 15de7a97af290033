/* Direct tests of public functions of moec/base.h, moec/ir.h and
 * moec/runtime.h against their documented contracts (docs/api.md). Expected
 * values are written out by hand from the documentation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/ir.h"
#include "moec/runtime.h"
#include "graph_fx.h"

/* ---- base.h ---- */

/* A registered source is quoted under a diagnostic located in it: the line,
 * then a caret under the column. The text is copied; the newest registration
 * of a file name wins; a line past the end is not quoted. */
static void test_ctx_add_source(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char text[] = "first line\n  second = bad\nthird";
	moe_ctx_add_source(c, "emb.src", text, strlen(text));
	memset(text, 'x', strlen(text)); /* copied: the caller's buffer may change */
	moe_diag(c, MOE_DIAG_ERROR, moe_loc_at(c, "emb.src", 2, 5), "boom");
	char *s = moe_diag_string(c);
	assert_string_equal(s, "emb.src:2:5: error: boom\n  second = bad\n    ^\n");
	moe_free(c, s);

	/* len bounds the text: no NUL needed; line 3 is then past its end */
	moe_diag_clear(c);
	moe_ctx_add_source(c, "emb.src", "A\nBCD\nEFG", 5);
	moe_diag(c, MOE_DIAG_ERROR, moe_loc_at(c, "emb.src", 2, 2), "e1");
	moe_diag(c, MOE_DIAG_ERROR, moe_loc_at(c, "emb.src", 3, 1), "e2");
	moe_diag(c, MOE_DIAG_ERROR, moe_loc_at(c, "other.src", 1, 1), "e3");
	s = moe_diag_string(c);
	assert_string_equal(s, "emb.src:2:2: error: e1\nBCD\n ^\n"
			       "emb.src:3:1: error: e2\n"
			       "other.src:1:1: error: e3\n");
	moe_free(c, s);

	/* a file name NULL registers nothing that a located diagnostic could match */
	moe_diag_clear(c);
	moe_ctx_add_source(c, NULL, "zzz", 3);
	moe_diag(c, MOE_DIAG_ERROR, moe_loc_none(), "plain");
	s = moe_diag_string(c);
	assert_string_equal(s, "libmoec: error: plain\n");
	moe_free(c, s);
	moe_ctx_free(c);
}

/* ---- op and dtype tables ---- */

static void test_op_from_name(void **st)
{
	(void)st;
	/* spellings from docs/ir.md's op table */
	assert_int_equal(moe_op_from_name("input"), MOE_OP_INPUT);
	assert_int_equal(moe_op_from_name("weight"), MOE_OP_WEIGHT);
	assert_int_equal(moe_op_from_name("einsum"), MOE_OP_EINSUM);
	assert_int_equal(moe_op_from_name("topk"), MOE_OP_TOPK);
	assert_int_equal(moe_op_from_name("experts"), MOE_OP_EXPERTS);
	assert_int_equal(moe_op_from_name("all_to_all"), MOE_OP_ALL_TO_ALL);
	assert_int_equal(moe_op_from_name("neg"), MOE_OP_NEG);
	/* every op's name maps back to it */
	for (int op = 0; op < MOE_OP_COUNT; op++)
		assert_int_equal(moe_op_from_name(moe_op_name((moe_op)op)), op);
	/* unknown, case-sensitive, no prefix match */
	assert_int_equal(moe_op_from_name(""), -1);
	assert_int_equal(moe_op_from_name("Einsum"), -1);
	assert_int_equal(moe_op_from_name("eins"), -1);
	assert_int_equal(moe_op_from_name("einsum "), -1);
	assert_int_equal(moe_op_from_name("no_such_op"), -1);
}

static void test_dtype_from_name(void **st)
{
	(void)st;
	static const struct {
		const char *name;
		int t;
	} want[] = {{"f32", MOE_F32}, {"bf16", MOE_BF16}, {"i32", MOE_I32}, {"bool", MOE_BOOL},
		{"f8e4m3", MOE_F8E4M3}, {"i8", MOE_I8}, {"u8", MOE_U8}};
	assert_int_equal(sizeof want / sizeof *want, MOE_DTYPE_COUNT);
	for (size_t i = 0; i < sizeof want / sizeof *want; i++)
		assert_int_equal(moe_dtype_from_name(want[i].name), want[i].t);
	assert_int_equal(moe_dtype_from_name(""), -1);
	assert_int_equal(moe_dtype_from_name("F32"), -1);
	assert_int_equal(moe_dtype_from_name("float32"), -1);
	assert_int_equal(moe_dtype_from_name("f3"), -1);
	assert_int_equal(moe_dtype_from_name("?"), -1); /* moe_dtype_name's spelling of a bad dtype */
}

static void test_dtype_is_storage(void **st)
{
	(void)st;
	/* storage only: f8e4m3 and u8 (the raw bytes of quantized weights) */
	assert_true(moe_dtype_is_storage(MOE_F8E4M3));
	assert_true(moe_dtype_is_storage(MOE_U8));
	assert_false(moe_dtype_is_storage(MOE_F32));
	assert_false(moe_dtype_is_storage(MOE_BF16));
	assert_false(moe_dtype_is_storage(MOE_I32));
	assert_false(moe_dtype_is_storage(MOE_BOOL));
	assert_false(moe_dtype_is_storage(MOE_I8));
	assert_false(moe_dtype_is_storage(MOE_DTYPE_COUNT));
	assert_false(moe_dtype_is_storage((moe_dtype)-1));
	/* no dtype is both a compute float and storage */
	for (int t = 0; t < MOE_DTYPE_COUNT; t++)
		assert_false(moe_dtype_is_storage((moe_dtype)t) && moe_dtype_is_float((moe_dtype)t));
}

/* ---- graphs and nodes ---- */

/* Integer graph attributes: set, read back, replaced by a second set,
 * printed as `attrs KEY=V` in the textual IR and kept through a parse. */
static void test_graph_set_attr_int(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "l");
	moe_id x = leaf(g, MOE_OP_INPUT, MOE_F32, 1, (int64_t[]){3}, "x");
	moe_graph_add_output(g, x);
	int64_t v = 42;
	assert_int_equal(moe_graph_get_attr_int(g, "my_bound", &v), 0);
	assert_int_equal(v, 42); /* untouched when absent */
	moe_graph_set_attr_int(g, "my_bound", 7);
	assert_int_equal(moe_graph_get_attr_int(g, "my_bound", &v), 1);
	assert_int_equal(v, 7);
	moe_graph_set_attr_int(g, "my_bound", -9000000000LL); /* replaces; 64-bit */
	moe_graph_set_attr_int(g, "other", 0);
	assert_int_equal(moe_graph_get_attr_int(g, "my_bound", &v), 1);
	assert_int_equal(v, -9000000000LL);
	assert_int_equal(moe_graph_get_attr_int(g, "other", NULL), 1);
	/* attributes are not dims */
	assert_int_equal(moe_graph_get_dim(g, "my_bound", &v), 0);

	char *text = print_module(m);
	assert_non_null(strstr(text, "my_bound=-9000000000"));
	assert_null(strstr(text, "my_bound=7"));
	assert_non_null(strstr(text, "other=0"));
	moe_module *back = moe_module_parse_text(c, "t.moeir", text, strlen(text));
	if (!back)
		moe_diag_print(c, stderr);
	assert_non_null(back);
	assert_int_equal(moe_graph_get_attr_int(moe_module_graph(back, 0), "my_bound", &v), 1);
	assert_int_equal(v, -9000000000LL);
	free(text);
	moe_module_free(back);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* moe_node_num_args, moe_node_valid and moe_node_get_float on a graph built by hand. */
static void test_node_readers(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "l");
	moe_id x = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){4, 3}, "x");
	moe_id y = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){4, 3}, "y");
	moe_id nv = leaf(g, MOE_OP_INPUT, MOE_I32, 0, NULL, "nv");
	moe_id a = moe_node_new(g, MOE_OP_ADD, (moe_id[]){x, y}, 2, moe_loc_none());
	assert_int_equal(moe_node_infer(g, a), MOE_OK);
	moe_id ng = moe_node_new(g, MOE_OP_NEG, &a, 1, moe_loc_none());
	moe_node_set_valid(g, ng, nv);
	assert_int_equal(moe_node_infer(g, ng), MOE_OK);
	moe_graph_add_output(g, ng);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);

	assert_int_equal(moe_node_num_args(g, x), 0);
	assert_int_equal(moe_node_num_args(g, nv), 0);
	assert_int_equal(moe_node_num_args(g, a), 2);
	assert_int_equal(moe_node_num_args(g, ng), 1); /* the valid mask is not an operand */
	assert_int_equal(moe_node_arg(g, a, 0), x);
	assert_int_equal(moe_node_arg(g, a, 1), y);
	assert_int_equal(moe_node_arg(g, a, 2), MOE_NONE);

	assert_int_equal(moe_node_valid(g, ng), nv);
	assert_int_equal(moe_node_valid(g, a), MOE_NONE);
	assert_int_equal(moe_node_valid(g, x), MOE_NONE);

	/* the mask survives a print and parse */
	char *text = print_module(m);
	assert_non_null(strstr(text, "valid(%2)"));
	moe_module *back = moe_module_parse_text(c, "t.moeir", text, strlen(text));
	assert_non_null(back);
	moe_graph *b = moe_module_graph(back, 0);
	assert_int_equal(moe_node_valid(b, ng), nv);
	assert_int_equal(moe_node_num_args(b, a), 2);
	free(text);
	moe_module_free(back);

	/* get_float: 1 with the value for a float or an int attribute, 0 (and *v
	 * untouched) when absent or a string (attributes of no op's row: not
	 * printable, so after the round trip above) */
	moe_node_set_float(g, a, "alpha", 1.702);
	moe_node_set_int(g, a, "count", 3);
	moe_node_set_str(g, a, "mode", "exact");
	double d = -1.0;
	assert_int_equal(moe_node_get_float(g, a, "alpha", &d), 1);
	assert_true(d == 1.702);
	assert_int_equal(moe_node_get_float(g, a, "count", &d), 1);
	assert_true(d == 3.0);
	d = -1.0;
	assert_int_equal(moe_node_get_float(g, a, "mode", &d), 0);
	assert_int_equal(moe_node_get_float(g, a, "missing", &d), 0);
	assert_true(d == -1.0);
	moe_node_set_float(g, a, "alpha", -0.0); /* replaced, sign kept */
	assert_int_equal(moe_node_get_float(g, a, "alpha", &d), 1);
	assert_true(d == 0.0 && signbit(d));

	moe_module_free(m);
	moe_ctx_free(c);
}

/* ---- runtime.h ---- */

static void test_tensor_new_shape(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tensor *t = moe_tensor_new_shape(c, MOE_BF16, 3, (int64_t[]){2, 3, 5});
	assert_non_null(t);
	assert_null(t->data);
	assert_int_equal(t->dtype, MOE_BF16);
	assert_int_equal(t->rank, 3);
	assert_int_equal(t->shape[0], 2);
	assert_int_equal(t->shape[1], 3);
	assert_int_equal(t->shape[2], 5);
	assert_int_equal(moe_tensor_numel(t), 30);
	assert_int_equal(t->nbytes, 60); /* the size its data would have */
	moe_tensor_free(c, t);
	/* the header checks of moe_tensor_new: NULL with a diagnostic */
	assert_null(moe_tensor_new_shape(c, MOE_F32, 9, (int64_t[9]){1}));
	assert_null(moe_tensor_new_shape(c, MOE_F32, -1, NULL));
	assert_null(moe_tensor_new_shape(c, MOE_F32, 1, (int64_t[]){-1}));
	assert_null(moe_tensor_new_shape(c, MOE_F32, 3, (int64_t[]){1 << 30, 1 << 30, 1 << 30}));
	assert_null(moe_tensor_new_shape(c, MOE_DTYPE_COUNT, 1, (int64_t[]){1}));
	assert_int_equal(moe_error_count(c), 5);
	moe_diag_clear(c);
	/* rank 0: a scalar */
	t = moe_tensor_new_shape(c, MOE_I32, 0, NULL);
	assert_non_null(t);
	assert_null(t->data);
	assert_int_equal(moe_tensor_numel(t), 1);
	/* a data-less tensor binds like any other; the map frees it */
	moe_tensor_map *map = moe_tensor_map_new(c);
	assert_int_equal(moe_tensor_map_set(map, "absent", t), MOE_OK);
	assert_ptr_equal(moe_tensor_map_get(map, "absent"), t);
	moe_tensor_map_free(map);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

/* A view shares the data, does not own it: freeing the view leaves the data
 * (writes through one are seen through the other), and it may be bound in a
 * second map. */
static void test_tensor_view(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tensor *t = moe_tensor_new(c, MOE_F32, 2, (int64_t[]){2, 2});
	float *f = t->data;
	f[0] = 1.5f, f[3] = -2.0f;
	moe_tensor *v = moe_tensor_view(c, t);
	assert_non_null(v);
	assert_ptr_not_equal(v, t);
	assert_ptr_equal(v->data, t->data);
	assert_int_equal(v->owned, 0);
	assert_int_equal(v->dtype, MOE_F32);
	assert_int_equal(v->rank, 2);
	assert_int_equal(v->shape[0], 2);
	assert_int_equal(v->shape[1], 2);
	assert_int_equal(v->nbytes, 16);
	((float *)v->data)[1] = 7.0f;
	assert_true(f[1] == 7.0f);
	moe_tensor_free(c, v);
	assert_true(f[0] == 1.5f && f[3] == -2.0f); /* still t's */
	/* bound in two maps: each map frees only what it owns */
	moe_tensor_map *a = moe_tensor_map_new(c), *b = moe_tensor_map_new(c);
	assert_int_equal(moe_tensor_map_set(a, "w", t), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "w", moe_tensor_view(c, t)), MOE_OK);
	moe_tensor_map_free(b);
	assert_true(((float *)moe_tensor_map_get(a, "w")->data)[1] == 7.0f);
	moe_tensor_map_free(a);
	/* a view of a data-less tensor has no data either */
	moe_tensor *s = moe_tensor_new_shape(c, MOE_I32, 1, (int64_t[]){4});
	v = moe_tensor_view(c, s);
	assert_non_null(v);
	assert_null(v->data);
	assert_int_equal(v->shape[0], 4);
	moe_tensor_free(c, v);
	moe_tensor_free(c, s);
	moe_ctx_free(c);
}

/* The experts op's operand slots (docs/ir.md): x, idx, w, gate, up, down and three biases. */
enum { SLOT_X, SLOT_IDX, SLOT_W, SLOT_GATE, SLOT_UP, SLOT_DOWN, NSLOTS = 9 };

/* A layer of experts over T = 4 token rows; with_tokens adds the serving
 * input n_tokens, located at serve.moe:3:7. */
static moe_module *serving_layer(moe_ctx *c, int with_tokens)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "serve");
	moe_graph_set_dtype(g, MOE_F32);
	moe_id a[NSLOTS];
	for (int i = 0; i < NSLOTS; i++)
		a[i] = MOE_NONE;
	a[SLOT_X] = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){4, 2}, "x");
	a[SLOT_IDX] = leaf(g, MOE_OP_INPUT, MOE_I32, 2, (int64_t[]){4, 1}, "idx");
	a[SLOT_W] = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){4, 1}, "w");
	a[SLOT_UP] = leaf(g, MOE_OP_WEIGHT, MOE_F32, 3, (int64_t[]){2, 3, 2}, "up");
	a[SLOT_DOWN] = leaf(g, MOE_OP_WEIGHT, MOE_F32, 3, (int64_t[]){2, 2, 3}, "down");
	if (with_tokens) {
		moe_id n = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_at(c, "serve.moe", 3, 7));
		moe_node_set_type(g, n, MOE_I32, NULL, 0);
		moe_node_set_name(g, n, MOE_TOKENS_INPUT);
	}
	moe_id ex = moe_node_new(g, MOE_OP_EXPERTS, a, NSLOTS, moe_loc_none());
	moe_node_set_str(g, ex, "act", "none");
	moe_node_set_int(g, ex, "block", 2);
	assert_int_equal(moe_node_infer(g, ex), MOE_OK);
	moe_graph_add_output(g, ex);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);
	return m;
}

static moe_tensor *scalar_i32(moe_ctx *c, int32_t v)
{
	moe_tensor *t = moe_tensor_new(c, MOE_I32, 0, NULL);
	*(int32_t *)t->data = v;
	return t;
}

/* n_tokens must lie in 0..T (T = 4 here); outside it, an error at the input
 * node and MOE_ERR_INVALID. A layer without the input gives -1. */
static void test_tokens_check(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *plain = serving_layer(c, 0), *serve = serving_layer(c, 1);
	const moe_graph *gp = moe_module_graph(plain, 0), *gs = moe_module_graph(serve, 0);
	moe_tensor_map *bind = moe_tensor_map_new(c);
	int64_t n = 99;
	assert_int_equal(moe_tokens_check(c, gp, bind, &n), MOE_OK);
	assert_int_equal(n, -1);
	assert_int_equal(moe_tokens_check(c, gp, NULL, NULL), MOE_OK);

	static const int32_t ok[] = {0, 1, 3, 4};
	for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
		moe_tensor_map_set(bind, MOE_TOKENS_INPUT, scalar_i32(c, ok[i]));
		n = 99;
		assert_int_equal(moe_tokens_check(c, gs, bind, &n), MOE_OK);
		assert_int_equal(n, ok[i]);
		/* the plain layer ignores a stray n_tokens binding */
		assert_int_equal(moe_tokens_check(c, gp, bind, &n), MOE_OK);
		assert_int_equal(n, -1);
	}
	assert_int_equal(moe_error_count(c), 0);

	static const int32_t bad[] = {5, -1, 1000000, INT32_MIN};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		moe_diag_clear(c);
		moe_tensor_map_set(bind, MOE_TOKENS_INPUT, scalar_i32(c, bad[i]));
		n = 99;
		assert_int_equal(moe_tokens_check(c, gs, bind, &n), MOE_ERR_INVALID);
		assert_int_equal(n, -1);
		assert_int_equal(moe_error_count(c), 1);
		char want[128];
		snprintf(want, sizeof want, "serve.moe:3:7: error: input 'n_tokens' is %d, outside 0..4", (int)bad[i]);
		char *s = moe_diag_string(c);
		assert_non_null(strstr(s, want));
		moe_free(c, s);
		/* n_out may be NULL */
		assert_int_equal(moe_tokens_check(c, gs, bind, NULL), MOE_ERR_INVALID);
	}

	/* unbound or mistyped: left to the executor's binding check */
	moe_diag_clear(c);
	moe_tensor_map *none = moe_tensor_map_new(c);
	assert_int_equal(moe_tokens_check(c, gs, none, &n), MOE_OK);
	assert_int_equal(n, -1);
	moe_tensor *f = moe_tensor_new(c, MOE_F32, 0, NULL);
	*(float *)f->data = 100.0f;
	moe_tensor_map_set(none, MOE_TOKENS_INPUT, f);
	assert_int_equal(moe_tokens_check(c, gs, none, &n), MOE_OK);
	assert_int_equal(n, -1);
	assert_int_equal(moe_error_count(c), 0);

	/* and every executor applies it: the interpreter refuses n = 5 the same way */
	moe_tensor_map_set(bind, MOE_TOKENS_INPUT, scalar_i32(c, 5));
	moe_tensor_map_set(bind, "x", moe_tensor_new(c, MOE_F32, 2, (int64_t[]){4, 2}));
	moe_tensor_map_set(bind, "idx", moe_tensor_new(c, MOE_I32, 2, (int64_t[]){4, 1}));
	moe_tensor_map_set(bind, "w", moe_tensor_new(c, MOE_F32, 2, (int64_t[]){4, 1}));
	moe_tensor_map_set(bind, "up", moe_tensor_new(c, MOE_F32, 3, (int64_t[]){2, 3, 2}));
	moe_tensor_map_set(bind, "down", moe_tensor_new(c, MOE_F32, 3, (int64_t[]){2, 2, 3}));
	moe_tensor *out = NULL;
	assert_int_equal(moe_interp_run(c, gs, bind, &out), MOE_ERR_INVALID);
	assert_null(out);
	const char *msg;
	moe_diag_get(c, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "outside 0..4"));

	/* NULL context or graph */
	n = 99;
	assert_int_equal(moe_tokens_check(NULL, gs, bind, &n), MOE_ERR_INVALID);
	assert_int_equal(n, -1);
	assert_int_equal(moe_tokens_check(c, NULL, bind, &n), MOE_ERR_INVALID);
	moe_tensor_map_free(none);
	moe_tensor_map_free(bind);
	moe_module_free(plain);
	moe_module_free(serve);
	moe_ctx_free(c);
}

/* ---- moe_interp_run_ex: all_to_all through a caller's transport ---- */

typedef struct xrec {
	int calls;
	int64_t counts[4];
	size_t row_bytes;
	int64_t cap;
	float sent[8];
	moe_status ret;
	int64_t got;
} xrec;

/* A fake transport standing for device 1 of 2: records what it is handed and
 * "receives" rows 10, 11, ... */
static moe_status fake_a2a(void *ud, moe_ctx *ctx, const void *send, const int64_t *counts, size_t row_bytes,
	void *recv, int64_t cap, int64_t *got)
{
	xrec *r = ud;
	r->calls++;
	memcpy(r->counts, counts, 2 * sizeof *counts);
	r->row_bytes = row_bytes;
	r->cap = cap;
	int64_t nsend = counts[0] + counts[1];
	memcpy(r->sent, send, (size_t)nsend * row_bytes);
	if (r->ret != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "transport: peer gone");
		return r->ret;
	}
	int64_t n = r->got < cap ? r->got : cap;
	for (int64_t i = 0; i < n * 2; i++)
		((float *)recv)[i] = 10.0f + (float)i;
	*got = r->got;
	return MOE_OK;
}

/* x f32[3, 2], counts i32[ep] -> all_to_all{ep, rows = 4} */
static moe_module *a2a_layer(moe_ctx *c, int ep)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "dev");
	moe_id x = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){3, 2}, "x");
	moe_id k = leaf(g, MOE_OP_INPUT, MOE_I32, 1, (int64_t[]){ep}, "counts");
	moe_id a = moe_node_new(g, MOE_OP_ALL_TO_ALL, (moe_id[]){x, k}, 2, moe_loc_at(c, "dev.moeir", 4, 3));
	moe_node_set_int(g, a, "ep", ep);
	moe_node_set_int(g, a, "rows", 4);
	assert_int_equal(moe_node_infer(g, a), MOE_OK);
	moe_graph_add_output(g, a);
	return m;
}

static moe_tensor_map *a2a_bind(moe_ctx *c, int ep, const int32_t *counts)
{
	moe_tensor_map *b = moe_tensor_map_new(c);
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 2, (int64_t[]){3, 2});
	for (int i = 0; i < 6; i++)
		((float *)x->data)[i] = (float)(i + 1);
	moe_tensor *k = moe_tensor_new(c, MOE_I32, 1, (int64_t[]){ep});
	memcpy(k->data, counts, (size_t)ep * sizeof *counts);
	moe_tensor_map_set(b, "x", x);
	moe_tensor_map_set(b, "counts", k);
	return b;
}

static const char *last_error(moe_ctx *c)
{
	assert_true(moe_error_count(c) > 0);
	const char *msg = NULL;
	for (size_t i = 0; i < moe_diag_count(c); i++) {
		moe_diag_kind k;
		moe_diag_get(c, i, &k, NULL, &msg);
		if (k == MOE_DIAG_ERROR)
			break;
	}
	return msg;
}

static void test_interp_run_ex(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m2 = a2a_layer(c, 2);
	const moe_graph *g2 = moe_module_graph(m2, 0);
	moe_tensor_map *b = a2a_bind(c, 2, (int32_t[]){1, 2});
	xrec r = {.ret = MOE_OK, .got = 3};
	moe_exchange x = {2, 1, fake_a2a, &r};
	moe_tensor *out = NULL;
	assert_int_equal(moe_interp_run_ex(c, g2, b, &x, &out), MOE_OK);
	/* the transport got rows [0, 3) of x grouped by destination, row bytes 8, room for 4 rows */
	assert_int_equal(r.calls, 1);
	assert_int_equal(r.counts[0], 1);
	assert_int_equal(r.counts[1], 2);
	assert_int_equal(r.row_bytes, 8);
	assert_int_equal(r.cap, 4);
	for (int i = 0; i < 6; i++)
		assert_true(r.sent[i] == (float)(i + 1));
	/* the result: the 3 rows received, then a row of zeros */
	assert_int_equal(out->rank, 2);
	assert_int_equal(out->shape[0], 4);
	assert_int_equal(out->shape[1], 2);
	static const float want[8] = {10, 11, 12, 13, 14, 15, 0, 0};
	assert_memory_equal(out->data, want, sizeof want);
	moe_tensor_free(c, out);

	/* a transport error is returned as is, with no outputs */
	r = (xrec){.ret = MOE_ERR_IO};
	out = (moe_tensor *)&r;
	assert_int_equal(moe_interp_run_ex(c, g2, b, &x, &out), MOE_ERR_IO);
	assert_null(out);
	assert_string_equal(last_error(c), "transport: peer gone");
	moe_diag_clear(c);

	/* more rows than the buffer holds: a run-time fault at the node */
	r = (xrec){.ret = MOE_OK, .got = 5};
	assert_int_equal(moe_interp_run_ex(c, g2, b, &x, &out), MOE_ERR_RUNTIME);
	assert_null(out);
	assert_non_null(strstr(last_error(c), "5 rows received, more than the 4 the buffer holds"));
	moe_loc loc;
	moe_diag_get(c, 0, NULL, &loc, NULL);
	assert_int_equal(loc.line, 4);
	moe_diag_clear(c);

	/* counts that do not fit the send buffer: refused before the transport runs */
	moe_tensor_map *bad = a2a_bind(c, 2, (int32_t[]){2, 2});
	r = (xrec){.ret = MOE_OK, .got = 0};
	assert_int_equal(moe_interp_run_ex(c, g2, bad, &x, &out), MOE_ERR_RUNTIME);
	assert_int_equal(r.calls, 0);
	assert_non_null(strstr(last_error(c), "counts[1] = 2"));
	moe_diag_clear(c);
	moe_tensor_map_free(bad);
	bad = a2a_bind(c, 2, (int32_t[]){-1, 0});
	assert_int_equal(moe_interp_run_ex(c, g2, bad, &x, &out), MOE_ERR_RUNTIME);
	assert_int_equal(r.calls, 0);
	moe_diag_clear(c);
	moe_tensor_map_free(bad);

	/* a transport over another device count */
	moe_exchange x3 = {3, 0, fake_a2a, &r};
	assert_int_equal(moe_interp_run_ex(c, g2, b, &x3, &out), MOE_ERR_RUNTIME);
	assert_non_null(strstr(last_error(c), "exchanges over 2 devices but runs on 3"));
	assert_int_equal(r.calls, 0);
	moe_diag_clear(c);

	/* no transport: ep = 2 cannot run (nor through moe_interp_run) */
	assert_int_equal(moe_interp_run_ex(c, g2, b, NULL, &out), MOE_ERR_RUNTIME);
	assert_non_null(strstr(last_error(c), "all_to_all over 2 devices needs an expert-parallel run"));
	moe_diag_clear(c);
	assert_int_equal(moe_interp_run(c, g2, b, &out), MOE_ERR_RUNTIME);
	moe_diag_clear(c);

	/* ep = 1 keeps rows [0, counts[0]) on this device, with or without a transport of ep 1 */
	moe_module *m1 = a2a_layer(c, 1);
	moe_tensor_map *b1 = a2a_bind(c, 1, (int32_t[]){2});
	moe_exchange x1 = {1, 0, fake_a2a, &r};
	static const float want1[8] = {1, 2, 3, 4, 0, 0, 0, 0};
	for (int pass = 0; pass < 2; pass++) {
		assert_int_equal(moe_interp_run_ex(c, moe_module_graph(m1, 0), b1, pass ? &x1 : NULL, &out), MOE_OK);
		assert_memory_equal(out->data, want1, sizeof want1);
		moe_tensor_free(c, out);
	}
	assert_int_equal(r.calls, 0);

	/* bad arguments */
	assert_int_equal(moe_interp_run_ex(c, NULL, b, &x, &out), MOE_ERR_INVALID);
	assert_int_equal(moe_interp_run_ex(c, g2, b, &x, NULL), MOE_ERR_INVALID);
	moe_tensor_map_free(b1);
	moe_module_free(m1);
	moe_tensor_map_free(b);
	moe_module_free(m2);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ctx_add_source),
		cmocka_unit_test(test_op_from_name),
		cmocka_unit_test(test_dtype_from_name),
		cmocka_unit_test(test_dtype_is_storage),
		cmocka_unit_test(test_graph_set_attr_int),
		cmocka_unit_test(test_node_readers),
		cmocka_unit_test(test_tensor_new_shape),
		cmocka_unit_test(test_tensor_view),
		cmocka_unit_test(test_tokens_check),
		cmocka_unit_test(test_interp_run_ex),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
