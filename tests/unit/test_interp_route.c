/* Unit tests of the reference interpreter: routing primitives (topk,
 * one_hot, filter, gather, take_along, scatter), valid masks, leaves and shape
 * ops, experts, bindings, run-time faults, random bindings and graph
 * comparison, and the allocator discipline. */
#include "interp_fx.h"

/* ---- routing primitives ---- */
static moe_id topk(fx *t, moe_id x, int k)
{
	moe_id id = mk(t, MOE_OP_TOPK, 1, x, 0, 0);
	moe_node_set_int(t->g, id, "k", k);
	return done(t, id);
}

static void test_topk(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {5, 4};
	float a[20] = {
		1, 3, 3, 2,                  /* ties: lower index first */
		1, NAN, 5, NAN,              /* NaN above all, NaNs by index */
		-0.0f, 0.0f, -1, -0.0f,      /* -0 == +0 */
		-INFINITY, INFINITY, 0, NAN, /* NaN > inf > 0 > -inf */
		2, 2, 2, 2,
	};
	moe_id x = input(t, "a", MOE_F32, 2, s, a);
	moe_graph_add_output(t->g, topk(t, x, 4));
	moe_graph_add_output(t->g, topk(t, x, 2));
	assert_int_equal(run(t), MOE_OK);
	int32_t w4[20] = {1, 2, 3, 0, 1, 3, 2, 0, 0, 1, 3, 2, 3, 1, 2, 0, 0, 1, 2, 3};
	int32_t w2[10] = {1, 2, 1, 3, 0, 1, 3, 1, 0, 1};
	expect_i32(t->out[0], w4, 20);
	expect_i32(t->out[1], w2, 10);
	fx_free(t);

	t = fx_new();
	int64_t si[1] = {5};
	int32_t v[5] = {-1, 7, INT32_MIN, 7, 0};
	x = input(t, "v", MOE_I32, 1, si, v);
	assert_int_equal(run1(t, topk(t, x, 3)), MOE_OK);
	int32_t wi[3] = {1, 3, 4};
	expect_i32(t->out[0], wi, 3);
	fx_free(t);

	t = fx_new();
	uint16_t h[3] = {0x3f80, 0x3f81, 0x3f80};
	x = input(t, "h", MOE_BF16, 1, (int64_t[]){3}, h);
	assert_int_equal(run1(t, topk(t, x, 3)), MOE_OK);
	int32_t wh[3] = {1, 0, 2};
	expect_i32(t->out[0], wh, 3);
	fx_free(t);
}

static void test_one_hot(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {4};
	int32_t a[4] = {0, 2, 3, -1};
	moe_id x = input(t, "a", MOE_I32, 1, s, a);
	moe_id oh = mk(t, MOE_OP_ONE_HOT, 1, x, 0, 0);
	moe_node_set_int(t->g, oh, "n", 3);
	assert_int_equal(run1(t, done(t, oh)), MOE_OK);
	int32_t want[12] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
	expect_i32(t->out[0], want, 12);
	assert_int_equal(t->out[0]->rank, 2);
	assert_int_equal(t->out[0]->shape[1], 3);
	fx_free(t);
}

static void test_filter(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {2, 5};
	int32_t m[10] = {0, 1, 1, 0, 1, 0, 0, 0, 0, 0};
	int32_t v[10] = {10, 11, 12, 13, 14, 20, 21, 22, 23, 24};
	float fv[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
	moe_id mi = input(t, "m", MOE_I32, 2, s, m), vi = input(t, "v", MOE_I32, 2, s, v);
	moe_id fi = input(t, "f", MOE_F32, 2, s, fv);
	moe_id f1 = mk(t, MOE_OP_FILTER, 2, mi, vi, 0);
	moe_node_set_int(t->g, f1, "fill", -1);
	moe_graph_add_output(t->g, done(t, f1));
	moe_id f2 = mk(t, MOE_OP_FILTER, 2, mi, fi, 0);
	moe_node_set_float(t->g, f2, "fill", 0.5);
	moe_graph_add_output(t->g, done(t, f2));
	moe_graph_add_output(t->g, done(t, mk(t, MOE_OP_FILTER, 2, mi, fi, 0)));
	assert_int_equal(run(t), MOE_OK);
	int32_t w1[10] = {11, 12, 14, -1, -1, -1, -1, -1, -1, -1};
	float w2[10] = {2, 3, 5, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
	float w3[10] = {2, 3, 5, 0, 0, 0, 0, 0, 0, 0};
	expect_i32(t->out[0], w1, 10);
	expect_f32(t->out[1], w2, 10);
	expect_f32(t->out[2], w3, 10);
	fx_free(t);
}

static moe_id gather(fx *t, moe_id x, moe_id i, int axis, moe_loc loc)
{
	moe_id args[2] = {x, i};
	moe_id id = moe_node_new(t->g, MOE_OP_GATHER, args, 2, loc);
	moe_node_set_int(t->g, id, "axis", axis);
	return done(t, id);
}

static void test_gather(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t sx[2] = {3, 2}, si[2] = {2, 2};
	float x[6] = {1, 2, 3, 4, 5, 6};
	int32_t i[4] = {2, 0, 1, 1};
	moe_id xi = input(t, "x", MOE_F32, 2, sx, x), ii = input(t, "i", MOE_I32, 2, si, i);
	moe_id g0 = gather(t, xi, ii, 0, moe_loc_none());
	assert_int_equal(moe_node_rank(t->g, g0), 3);
	moe_graph_add_output(t->g, g0);
	int32_t j[3] = {1, 0, 1};
	moe_id ji = input(t, "j", MOE_I32, 1, (int64_t[]){3}, j);
	moe_graph_add_output(t->g, gather(t, xi, ji, 1, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float w0[8] = {5, 6, 1, 2, 3, 4, 3, 4}, w1[9] = {2, 1, 2, 4, 3, 4, 6, 5, 6};
	expect_f32(t->out[0], w0, 8);
	expect_f32(t->out[1], w1, 9);
	fx_free(t);
}

static void test_gather_fault(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t sx[2] = {3, 2}, si[1] = {3};
	float x[6] = {1, 2, 3, 4, 5, 6};
	int32_t i[3] = {0, 3, 1};
	moe_id xi = input(t, "x", MOE_F32, 2, sx, x), ii = input(t, "i", MOE_I32, 1, si, i);
	moe_id g = gather(t, xi, ii, 0, moe_loc_at(t->c, "route.moe", 4, 9));
	moe_node_set_name(t->g, g, "rows");
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_MUL, g, g, moe_loc_none()));
	assert_int_equal(run(t), MOE_ERR_RUNTIME);
	assert_null(t->out[0]);
	assert_int_equal(moe_error_count(t->c), 1);
	const char *msg;
	moe_loc loc;
	moe_diag_get(t->c, 0, NULL, &loc, &msg);
	assert_non_null(strstr(msg, "%2 gather"));
	assert_non_null(strstr(msg, "\"rows\""));
	assert_non_null(strstr(msg, "index 3 at [1]"));
	assert_non_null(strstr(msg, "[0, 3)"));
	assert_string_equal(loc.file, "route.moe");
	assert_int_equal(loc.line, 4);
	assert_int_equal(loc.col, 9);
	fx_free(t);

	t = fx_new(); /* negative indices are faults too, not numpy wrap-around */
	int32_t n[1] = {-1};
	xi = input(t, "x", MOE_F32, 2, sx, x);
	ii = input(t, "i", MOE_I32, 1, (int64_t[]){1}, n);
	assert_int_equal(run1(t, gather(t, xi, ii, 0, moe_loc_none())), MOE_ERR_RUNTIME);
	assert_true(has_diag(t, "index -1"));
	fx_free(t);
}

static void test_take_along(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {2, 3}, si[2] = {2, 2};
	float x[6] = {1, 2, 3, 4, 5, 6};
	int32_t i[4] = {2, 0, 1, 1};
	moe_id xi = input(t, "x", MOE_F32, 2, s, x), ii = input(t, "i", MOE_I32, 2, si, i);
	moe_graph_add_output(t->g, done(t, mk(t, MOE_OP_TAKE_ALONG, 2, xi, ii, 0)));
	int32_t k[6] = {1, 0, 1, 0, 1, 0};
	moe_id ki = input(t, "k", MOE_I32, 2, s, k);
	moe_id ta = mk(t, MOE_OP_TAKE_ALONG, 2, xi, ki, 0);
	moe_node_set_int(t->g, ta, "axis", 0);
	moe_graph_add_output(t->g, done(t, ta));
	assert_int_equal(run(t), MOE_OK);
	float w[4] = {3, 1, 5, 5}, w0[6] = {4, 2, 6, 1, 5, 3};
	expect_f32(t->out[0], w, 4);
	expect_f32(t->out[1], w0, 6);
	fx_free(t);

	t = fx_new();
	int32_t bad[4] = {0, 0, 3, 0};
	xi = input(t, "x", MOE_F32, 2, s, x);
	ii = input(t, "i", MOE_I32, 2, si, bad);
	assert_int_equal(run1(t, done(t, mk(t, MOE_OP_TAKE_ALONG, 2, xi, ii, 0))), MOE_ERR_RUNTIME);
	assert_true(has_diag(t, "take_along: index 3 at [1, 0]"));
	fx_free(t);
}

static void test_scatter(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t sb[2] = {3, 2}, si[1] = {3}, ss[2] = {3, 2};
	float base[6] = {1, 1, 1, 1, 1, 1}, src[6] = {10, 20, 30, 40, 50, 60};
	int32_t i[3] = {2, 0, 2};
	moe_id b = input(t, "b", MOE_F32, 2, sb, base), ii = input(t, "i", MOE_I32, 1, si, i);
	moe_id s = input(t, "s", MOE_F32, 2, ss, src);
	moe_graph_add_output(t->g, done(t, mk(t, MOE_OP_SCATTER, 3, b, ii, s)));
	moe_id sa = mk(t, MOE_OP_SCATTER, 3, b, ii, s);
	moe_node_set_str(t->g, sa, "mode", "add");
	moe_graph_add_output(t->g, done(t, sa));
	assert_int_equal(run(t), MOE_OK);
	float set[6] = {30, 40, 1, 1, 50, 60}; /* duplicate index 2: the last wins */
	float add[6] = {31, 41, 1, 1, 61, 81};
	expect_f32(t->out[0], set, 6);
	expect_f32(t->out[1], add, 6);
	fx_free(t);

	/* bf16 scatter-add accumulates in f32 and rounds once */
	t = fx_new();
	uint16_t hb[1] = {0x3f80}, hs[2] = {0x3b80, 0x3b80};
	b = input(t, "b", MOE_BF16, 1, (int64_t[]){1}, hb);
	int32_t z[2] = {0, 0};
	ii = input(t, "i", MOE_I32, 1, (int64_t[]){2}, z);
	s = input(t, "s", MOE_BF16, 1, (int64_t[]){2}, hs);
	sa = mk(t, MOE_OP_SCATTER, 3, b, ii, s);
	moe_node_set_str(t->g, sa, "mode", "add");
	assert_int_equal(run1(t, done(t, sa)), MOE_OK);
	uint16_t w[1] = {0x3f81};
	expect_bf16(t->out[0], w, 1);
	fx_free(t);

	t = fx_new();
	int32_t bad[3] = {0, 1, 5};
	b = input(t, "b", MOE_F32, 2, sb, base);
	ii = input(t, "i", MOE_I32, 1, si, bad);
	s = input(t, "s", MOE_F32, 2, ss, src);
	assert_int_equal(run1(t, done(t, mk(t, MOE_OP_SCATTER, 3, b, ii, s))), MOE_ERR_RUNTIME);
	assert_true(has_diag(t, "scatter: index 5 at [2]"));
	fx_free(t);
}

/* ---- valid masks ---- */
static void test_valid_masks(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {3, 2};
	int32_t a[6] = {6, 8, 9, 12, 7, 7}, b[6] = {2, 4, 3, 0, 0, 0}; /* zeros in skipped elements */
	int32_t lim[3] = {2, 1, 0};
	moe_id x = input(t, "a", MOE_I32, 2, s, a), y = input(t, "b", MOE_I32, 2, s, b);
	moe_id v = input(t, "v", MOE_I32, 1, (int64_t[]){3}, lim);
	moe_id d = mk(t, MOE_OP_DIV, 2, x, y, 0);
	moe_node_set_valid(t->g, d, v);
	moe_graph_add_output(t->g, done(t, d));
	int32_t n[1] = {1};
	moe_id vs = input(t, "n", MOE_I32, 0, NULL, n);
	moe_id d2 = mk(t, MOE_OP_ADD, 2, x, y, 0);
	moe_node_set_valid(t->g, d2, vs);
	moe_graph_add_output(t->g, done(t, d2));
	assert_int_equal(run(t), MOE_OK);
	int32_t w[6] = {3, 2, 3, 0, 0, 0}, w2[6] = {8, 12, 0, 0, 0, 0};
	expect_i32(t->out[0], w, 6);
	expect_i32(t->out[1], w2, 6);
	fx_free(t);

	/* an unmasked division by zero faults */
	t = fx_new();
	x = input(t, "a", MOE_I32, 2, s, a);
	y = input(t, "b", MOE_I32, 2, s, b);
	moe_id dz = moe_node_new(t->g, MOE_OP_DIV, (moe_id[]){x, y}, 2, moe_loc_at(t->c, "k.moe", 2, 5));
	assert_int_equal(run1(t, done(t, dz)), MOE_ERR_RUNTIME);
	assert_true(has_diag(t, "%2 div: integer division by zero at [1, 1]"));
	fx_free(t);
}

/* reduce_sum, softmax and take_along under a scalar valid mask: rows at and
 * past the count are 0 and their operands are not read (a garbage index) */
static void test_valid_rows_ops(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {3, 2};
	float x[6] = {1, 3, 0, 0, NAN, NAN};
	int32_t i[6] = {1, 0, 0, 0, 99, -7}, two[1] = {2};
	moe_id xi = input(t, "x", MOE_F32, 2, s, x), ii = input(t, "i", MOE_I32, 2, s, i);
	moe_id v = input(t, "v", MOE_I32, 0, NULL, two);
	moe_id r = mk(t, MOE_OP_REDUCE_SUM, 1, xi, 0, 0);
	moe_node_set_int(t->g, r, "axis", 1);
	moe_node_set_valid(t->g, r, v);
	moe_graph_add_output(t->g, done(t, r));
	moe_id sm = mk(t, MOE_OP_SOFTMAX, 1, xi, 0, 0);
	moe_node_set_int(t->g, sm, "axis", 1);
	moe_node_set_valid(t->g, sm, v);
	moe_graph_add_output(t->g, done(t, sm));
	moe_id ta = mk(t, MOE_OP_TAKE_ALONG, 2, xi, ii, 0);
	moe_node_set_int(t->g, ta, "axis", 1);
	moe_node_set_valid(t->g, ta, v);
	moe_graph_add_output(t->g, done(t, ta));
	assert_int_equal(run(t), MOE_OK);
	float e0 = (float)exp(-2.0), sum = e0 + 1.0f; /* softmax of [1, 3] as docs/ir.md computes it */
	float wr[3] = {4, 0, 0}, ws[6] = {e0 / sum, 1.0f / sum, 0.5f, 0.5f, 0, 0}, wt[6] = {3, 1, 0, 0, 0, 0};
	expect_f32(t->out[0], wr, 3);
	expect_f32(t->out[1], ws, 6);
	expect_f32(t->out[2], wt, 6);
	fx_free(t);

	/* the mask counts rows: a vector mask, or a reduction along axis 0, is refused */
	t = fx_new();
	xi = input(t, "x", MOE_F32, 2, s, x);
	int32_t lim[3] = {1, 1, 1};
	moe_id vv = input(t, "v", MOE_I32, 1, (int64_t[]){3}, lim);
	r = mk(t, MOE_OP_REDUCE_SUM, 1, xi, 0, 0);
	moe_node_set_int(t->g, r, "axis", 1);
	moe_node_set_valid(t->g, r, vv);
	assert_int_not_equal(moe_node_infer(t->g, r), MOE_OK);
	assert_true(has_diag(t, "'reduce_sum' takes only a scalar valid mask"));
	fx_free(t);
	t = fx_new();
	xi = input(t, "x", MOE_F32, 2, s, x);
	v = input(t, "v", MOE_I32, 0, NULL, two);
	r = mk(t, MOE_OP_REDUCE_MAX, 1, xi, 0, 0);
	moe_node_set_int(t->g, r, "axis", 0);
	moe_node_set_int(t->g, r, "keepdims", 1);
	moe_node_set_valid(t->g, r, v);
	assert_int_not_equal(moe_node_infer(t->g, r), MOE_OK);
	assert_true(has_diag(t, "along axis 0 takes no valid mask"));
	fx_free(t);
}

static void test_valid_gather_einsum(void **st)
{
	(void)st;
	/* a gather index in a masked row is garbage and never read */
	fx *t = fx_new();
	int64_t sx[2] = {3, 2}, si[2] = {2, 2};
	float x[6] = {1, 2, 3, 4, 5, 6};
	int32_t i[4] = {2, 1, 99, -7};
	moe_id xi = input(t, "x", MOE_F32, 2, sx, x), ii = input(t, "i", MOE_I32, 2, si, i);
	int32_t one[1] = {1};
	moe_id v = input(t, "v", MOE_I32, 0, NULL, one);
	moe_id g = mk(t, MOE_OP_GATHER, 2, xi, ii, 0);
	moe_node_set_valid(t->g, g, v);
	moe_graph_add_output(t->g, done(t, g));
	/* einsum over blocks [G, B, D] x [G, F, D] with per-block row counts */
	int64_t sa[3] = {2, 2, 2}, sw[3] = {2, 1, 2};
	float a[8] = {1, 2, 3, 4, 5, 6, NAN, NAN}, w[4] = {1, 1, 1, -1};
	moe_id ai = input(t, "a", MOE_F32, 3, sa, a), wi = input(t, "w", MOE_F32, 3, sw, w);
	int32_t rows[2] = {2, 1};
	moe_id vr = input(t, "rows", MOE_I32, 1, (int64_t[]){2}, rows);
	moe_id e = ir_b_einsum(t->g, "gbd,gfd->gbf", ai, wi, moe_loc_none());
	moe_node_set_valid(t->g, e, vr);
	assert_int_equal(moe_node_infer(t->g, e), MOE_OK);
	moe_graph_add_output(t->g, e);
	assert_int_equal(run(t), MOE_OK);
	float wg[8] = {5, 6, 3, 4, 0, 0, 0, 0}, we[4] = {3, 7, -1, 0};
	expect_f32(t->out[0], wg, 8);
	expect_f32(t->out[1], we, 4);
	fx_free(t);
}

/* ---- leaves and shape ops ---- */
static void test_leaves(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {2, 3};
	moe_graph_add_output(t->g, ir_b_iota(t->g, 2, s, 1, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_iota(t->g, 2, s, 0, moe_loc_none()));
	moe_id c = ir_emit(t->g, MOE_OP_CONST, MOE_BF16, 1, (int64_t[]){2}, NULL, 0, moe_loc_none());
	moe_node_set_float(t->g, c, "value", 0.1);
	moe_graph_add_output(t->g, c);
	moe_graph_add_output(t->g, ir_b_const(t->g, MOE_I32, -4, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	int32_t i1[6] = {0, 1, 2, 0, 1, 2}, i0[6] = {0, 0, 0, 1, 1, 1}, m4[1] = {-4};
	uint16_t tenth[2] = {0x3dcd, 0x3dcd};
	expect_i32(t->out[0], i1, 6);
	expect_i32(t->out[1], i0, 6);
	expect_bf16(t->out[2], tenth, 2);
	expect_i32(t->out[3], m4, 1);
	fx_free(t);

	t = fx_new();
	moe_id big = ir_emit(t->g, MOE_OP_CONST, MOE_I32, 0, NULL, NULL, 0, moe_loc_none());
	moe_node_set_int(t->g, big, "value", (int64_t)1 << 40);
	assert_int_equal(run1(t, big), MOE_ERR_INVALID);
	assert_true(has_diag(t, "does not fit i32"));
	fx_free(t);
}

static void test_shape_ops(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {2, 3};
	float a[6] = {1, 2, 3, 4, 5, 6};
	moe_id x = input(t, "a", MOE_F32, 2, s, a);
	int64_t rs[3] = {3, 1, 2};
	moe_graph_add_output(t->g, ir_b_reshape(t->g, x, 3, rs, moe_loc_none()));
	moe_id sl = mk(t, MOE_OP_SLICE, 1, x, 0, 0);
	moe_node_set_int(t->g, sl, "axis", 1);
	moe_node_set_int(t->g, sl, "start", 0);
	moe_node_set_int(t->g, sl, "stop", 3);
	moe_node_set_int(t->g, sl, "step", 2);
	moe_graph_add_output(t->g, done(t, sl));
	moe_id cc = mk(t, MOE_OP_CONCAT, 2, x, done(t, sl), 0);
	moe_node_set_int(t->g, cc, "axis", -1);
	moe_graph_add_output(t->g, done(t, cc));
	moe_id bc = mk(t, MOE_OP_BROADCAST, 1, ir_b_reshape(t->g, x, 3, (int64_t[]){2, 1, 3}, moe_loc_none()), 0, 0);
	moe_node_set_ints(t->g, bc, "shape", (int64_t[]){2, 2, 3}, 3);
	moe_graph_add_output(t->g, done(t, bc));
	assert_int_equal(run(t), MOE_OK);
	float sli[4] = {1, 3, 4, 6}, cat[10] = {1, 2, 3, 1, 3, 4, 5, 6, 4, 6};
	float br[12] = {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6};
	expect_f32(t->out[0], a, 6);
	assert_int_equal(t->out[0]->rank, 3);
	expect_f32(t->out[1], sli, 4);
	expect_f32(t->out[2], cat, 10);
	expect_f32(t->out[3], br, 12);
	fx_free(t);
}

/* ---- experts ---- */
typedef struct exp_case {
	const char *act, *weight_on;
	bool gate, biases;
} exp_case;

/* T=2, D=2, E=2, F=2, K=2, chosen so every value is exact in f32. */
static moe_id experts_graph(fx *t, exp_case c)
{
	int64_t sx[2] = {2, 2}, sw[3] = {2, 2, 2}, sb[2] = {2, 2};
	float x[4] = {1, 2, 0.5f, -1}, w[4] = {0.75f, 0.25f, 0.5f, 0.5f};
	int32_t idx[4] = {0, 1, 1, 0};
	float up[8] = {1, 0, 0, 1, 1, 1, 1, -1}, down[8] = {1, 0, 0, 1, 2, 0, 0, 0.5f};
	float gate[8] = {1, 0, 0, 1, 1, 0, 0, 1};
	float bu[4] = {0, 0, 1, 0}, bd[4] = {0, 0, 0, 1}, bg[4] = {0, 0, 0, 0};
	moe_id a[EXP_NSLOTS];
	for (int i = 0; i < EXP_NSLOTS; i++)
		a[i] = MOE_NONE;
	a[EXP_X] = input(t, "x", MOE_F32, 2, sx, x);
	a[EXP_IDX] = input(t, "idx", MOE_I32, 2, sx, idx);
	a[EXP_W] = input(t, "w", MOE_F32, 2, sx, w);
	a[EXP_UP] = weight(t, "up", MOE_F32, 3, sw, up);
	a[EXP_DOWN] = weight(t, "down", MOE_F32, 3, sw, down);
	if (c.gate)
		a[EXP_GATE] = weight(t, "gate", MOE_F32, 3, sw, gate);
	if (c.biases) {
		a[EXP_B_UP] = weight(t, "bu", MOE_F32, 2, sb, bu);
		a[EXP_B_DOWN] = weight(t, "bd", MOE_F32, 2, sb, bd);
		if (c.gate)
			a[EXP_B_GATE] = weight(t, "bg", MOE_F32, 2, sb, bg);
	}
	moe_id e = moe_node_new(t->g, MOE_OP_EXPERTS, a, EXP_NSLOTS, moe_loc_none());
	moe_node_set_str(t->g, e, "act", c.act);
	moe_node_set_int(t->g, e, "block", 4);
	moe_node_set_str(t->g, e, "weight_on", c.weight_on);
	return done(t, e);
}

static void test_experts_linear(void **st)
{
	(void)st;
	/* act none: y[t] = sum_k w * (down_e (up_e x + bu_e) + bd_e) */
	struct {
		exp_case c;
		float want[4];
	} cases[] = {
		{{"none", "output", false, false}, {2.25f, 1.375f, -0.25f, -0.125f}},
		{{"none", "output", false, true}, {2.75f, 1.625f, 0.75f, 0.375f}},
		{{"none", "input", false, false}, {2.25f, 1.375f, -0.25f, -0.125f}},
		{{"none", "input", false, true}, {4.25f, 2.375f, 1.75f, 0.875f}},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		fx *t = fx_new();
		assert_int_equal(run1(t, experts_graph(t, cases[i].c)), MOE_OK);
		expect_f32(t->out[0], cases[i].want, 4);
		fx_free(t);
	}
}

/* T=D=E=F=K=1: y = h(g, u) with x = w = down = 1 */
static moe_status experts_scalar(fx *t, const char *act, float g, float u, double alpha, double limit)
{
	int64_t s2[2] = {1, 1}, s3[3] = {1, 1, 1};
	float one[1] = {1};
	int32_t zero[1] = {0};
	moe_id a[EXP_NSLOTS];
	for (int i = 0; i < EXP_NSLOTS; i++)
		a[i] = MOE_NONE;
	a[EXP_X] = input(t, "x", MOE_F32, 2, s2, one);
	a[EXP_IDX] = input(t, "idx", MOE_I32, 2, s2, zero);
	a[EXP_W] = input(t, "w", MOE_F32, 2, s2, one);
	a[EXP_GATE] = weight(t, "gate", MOE_F32, 3, s3, &g);
	a[EXP_UP] = weight(t, "up", MOE_F32, 3, s3, &u);
	a[EXP_DOWN] = weight(t, "down", MOE_F32, 3, s3, one);
	moe_id e = moe_node_new(t->g, MOE_OP_EXPERTS, a, EXP_NSLOTS, moe_loc_none());
	moe_node_set_str(t->g, e, "act", act);
	moe_node_set_int(t->g, e, "block", 1);
	if (alpha > 0)
		moe_node_set_float(t->g, e, "alpha", alpha);
	if (limit > 0)
		moe_node_set_float(t->g, e, "limit", limit);
	return run1(t, done(t, e));
}

static void test_experts_activations(void **st)
{
	(void)st;
	struct {
		const char *act;
		float g, u;
		double alpha, limit, want;
	} cases[] = {
		{"swiglu", 2, 3, 0, 0, 5.284782467867294},      /* 2 sigmoid(2) 3 */
		{"geglu", 1, 2, 0, 0, 1.6826894921370859},      /* gelu_erf(1) 2 */
		{"geglu_tanh", 1, 2, 0, 0, 1.6823839812165535}, /* gelu_tanh(1) 2 */
		{"gpt_oss", 0.5f, 0.25f, 0, 0, 0.43798554575797516},  /* 1.25 * 0.5 sigmoid(1.702 * 0.5) */
		{"gpt_oss", 10, -9, 0, 0, -41.99971876981991},   /* clamps hit: g' = 7, u' = -7 */
		{"gpt_oss", 2, 3, 1.702, 1, 1.6915915318656425}, /* limit 1: g' = u' = 1 */
		{"gpt_oss", -20, 20, 1.702, 7, -8.0 * 20 / (1 + exp(1.702 * 20))}, /* g not clamped below */
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		fx *t = fx_new();
		assert_int_equal(experts_scalar(t, cases[i].act, cases[i].g, cases[i].u, cases[i].alpha, cases[i].limit),
			MOE_OK);
		double want[1] = {cases[i].want};
		expect_near(t->out[0], want, 1, 1e-5);
		fx_free(t);
	}
}

/* bf16 experts with K = T = E = 1, act none, optional up bias. */
static moe_id experts_bf16(fx *t, int64_t D, int64_t F, const uint16_t *x, uint16_t w, const uint16_t *up,
	const uint16_t *down, const uint16_t *bu)
{
	int64_t sx[2] = {1, D}, s11[2] = {1, 1}, su[3] = {1, F, D}, sd[3] = {1, D, F}, sb[2] = {1, F};
	int32_t idx[1] = {0};
	moe_id a[EXP_NSLOTS];
	for (int i = 0; i < EXP_NSLOTS; i++)
		a[i] = MOE_NONE;
	a[EXP_X] = input(t, "x", MOE_BF16, 2, sx, x);
	a[EXP_IDX] = input(t, "idx", MOE_I32, 2, s11, idx);
	a[EXP_W] = input(t, "w", MOE_BF16, 2, s11, &w);
	a[EXP_UP] = weight(t, "up", MOE_BF16, 3, su, up);
	a[EXP_DOWN] = weight(t, "down", MOE_BF16, 3, sd, down);
	if (bu)
		a[EXP_B_UP] = weight(t, "bu", MOE_BF16, 2, sb, bu);
	moe_id e = moe_node_new(t->g, MOE_OP_EXPERTS, a, EXP_NSLOTS, moe_loc_none());
	moe_node_set_str(t->g, e, "act", "none");
	moe_node_set_int(t->g, e, "block", 1);
	return done(t, e);
}

static void test_experts_bf16_rounding(void **st)
{
	(void)st;
	/* up x = 1 + 2^-8 rounds to 1 before the bias 2^-8 is added (and the sum
	 * rounds to 1 again): y = 1, where one rounding would give 1 + 2^-7 */
	fx *t = fx_new();
	uint16_t x[2] = {0x3f80, 0x3b80}, up[2] = {0x3f80, 0x3f80}, down[2] = {0x3f80, 0x3f80}, bu[1] = {0x3b80};
	assert_int_equal(run1(t, experts_bf16(t, 2, 1, x, 0x3f80, up, down, bu)), MOE_OK);
	uint16_t want[2] = {0x3f80, 0x3f80};
	expect_bf16(t->out[0], want, 2);
	fx_free(t);

	/* down h = 1 + 2^-8 rounds to 1 before the routing weight 3 scales it:
	 * y = 3, not bf16(3 + 3 * 2^-8) = 3.015625 */
	t = fx_new();
	uint16_t x1[1] = {0x3f80}, up1[2] = {0x3f80, 0x3b80}, down1[2] = {0x3f80, 0x3f80};
	assert_int_equal(run1(t, experts_bf16(t, 1, 2, x1, 0x4040, up1, down1, NULL)), MOE_OK);
	uint16_t want1[1] = {0x4040};
	expect_bf16(t->out[0], want1, 1);
	fx_free(t);
}

static void test_experts_sum_over_k_f32(void **st)
{
	(void)st;
	/* bf16, K = 3: the sum over k accumulates in f32 (1 + 2^-8 + 2^-8 = 1 + 2^-7)
	 * and rounds once; a bf16 accumulator would stay at 1 */
	fx *t = fx_new();
	int64_t sx[2] = {1, 1}, sk[2] = {1, 3}, sw[3] = {3, 1, 1};
	uint16_t x[1] = {0x3f80}, w[3] = {0x3f80, 0x3b80, 0x3b80}, ones[3] = {0x3f80, 0x3f80, 0x3f80};
	int32_t idx[3] = {2, 0, 1};
	moe_id a[EXP_NSLOTS];
	for (int i = 0; i < EXP_NSLOTS; i++)
		a[i] = MOE_NONE;
	a[EXP_X] = input(t, "x", MOE_BF16, 2, sx, x);
	a[EXP_IDX] = input(t, "idx", MOE_I32, 2, sk, idx);
	a[EXP_W] = input(t, "w", MOE_BF16, 2, sk, w);
	a[EXP_UP] = weight(t, "up", MOE_BF16, 3, sw, ones);
	a[EXP_DOWN] = weight(t, "down", MOE_BF16, 3, sw, ones);
	moe_id e = moe_node_new(t->g, MOE_OP_EXPERTS, a, EXP_NSLOTS, moe_loc_none());
	moe_node_set_str(t->g, e, "act", "none");
	moe_node_set_int(t->g, e, "block", 2);
	assert_int_equal(run1(t, done(t, e)), MOE_OK);
	uint16_t want[1] = {0x3f81};
	expect_bf16(t->out[0], want, 1);
	fx_free(t);
}

static void test_experts_fault(void **st)
{
	(void)st;
	fx *t = fx_new();
	moe_id e = experts_graph(t, (exp_case){"none", "output", false, false});
	moe_tensor *idx = moe_tensor_map_get(t->m, "idx");
	((int32_t *)idx->data)[3] = 2; /* E = 2 */
	assert_int_equal(run1(t, e), MOE_ERR_RUNTIME);
	assert_true(has_diag(t, "experts: index 2 at [1, 1] of the expert indices idx is outside [0, 2)"));
	fx_free(t);
}

/* ---- bindings ---- */
static void test_binding_errors(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {2};
	float a[2] = {1, 2};
	moe_id x = input(t, "a", MOE_F32, 1, s, a);
	moe_id y = ir_emit(t->g, MOE_OP_INPUT, MOE_F32, 1, s, NULL, 0, moe_loc_none());
	moe_node_set_name(t->g, y, "missing");
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_ADD, x, y, moe_loc_none()));
	assert_int_equal(run(t), MOE_ERR_INVALID);
	assert_true(has_diag(t, "no tensor is bound to input 'missing'"));
	moe_diag_clear(t->c);
	int64_t s3[1] = {3};
	moe_tensor_map_set(t->m, "missing", moe_tensor_new(t->c, MOE_F32, 1, s3));
	assert_int_equal(run(t), MOE_ERR_INVALID);
	assert_true(has_diag(t, "input 'missing' (%1) is f32[2] but the tensor bound to it is f32[3]"));
	moe_diag_clear(t->c);
	moe_tensor_map_set(t->m, "missing", moe_tensor_new(t->c, MOE_BF16, 1, s));
	assert_int_equal(run(t), MOE_ERR_INVALID);
	assert_true(has_diag(t, "is bf16[2]"));
	moe_diag_clear(t->c);
	moe_tensor_map_set(t->m, "missing", moe_tensor_new(t->c, MOE_F32, 1, s));
	assert_int_equal(run(t), MOE_OK);
	fx_free(t);
}

static void test_dead_fault_not_evaluated(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {2};
	int32_t a[2] = {1, 2}, z[2] = {0, 0};
	moe_id x = input(t, "a", MOE_I32, 1, s, a), y = input(t, "z", MOE_I32, 1, s, z);
	ir_b2(t->g, MOE_OP_DIV, x, y, moe_loc_none()); /* dead */
	assert_int_equal(run1(t, ir_b2(t->g, MOE_OP_ADD, x, y, moe_loc_none())), MOE_OK);
	fx_free(t);
}

/* ---- random bindings and graph comparison ---- */
static void test_random_compare(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_graph *g[3];
	for (int v = 0; v < 3; v++) {
		moe_graph *h = g[v] = ir_graph_new(c, "l");
		int64_t sx[2] = {6, 8}, sr[2] = {4, 8};
		moe_id x = ir_emit(h, MOE_OP_INPUT, MOE_BF16, 2, sx, NULL, 0, moe_loc_none());
		moe_node_set_name(h, x, "x");
		moe_id r = ir_emit(h, MOE_OP_WEIGHT, MOE_BF16, 2, sr, NULL, 0, moe_loc_none());
		moe_node_set_name(h, r, "router");
		moe_node_set_str(h, r, "source", "router");
		moe_id l = ir_b_einsum(h, "td,ed->te", x, r, moe_loc_none());
		/* variants: l * 2, l + l (bitwise equal), l * 2.015625 (differs) */
		moe_id two = ir_b_const(h, MOE_BF16, v == 2 ? 2.015625 : 2.0, moe_loc_none());
		moe_id y = v == 1 ? ir_b2(h, MOE_OP_ADD, l, l, moe_loc_none()) : ir_b2(h, MOE_OP_MUL, l, two, moe_loc_none());
		moe_graph_add_output(h, y);
	}
	ir_diff d;
	assert_int_equal(ir_interp_compare(c, g[0], g[1], 7, &d), MOE_OK);
	assert_int_equal(d.ndiff, 0);
	assert_int_equal(d.worst_index, -1);
	assert_true(d.max_abs == 0);
	assert_int_equal(ir_interp_compare(c, g[0], g[2], 7, &d), MOE_OK);
	assert_true(d.ndiff > 0);
	assert_true(d.max_abs > 0 && d.max_rel > 0 && d.max_rel < 0.02);
	assert_true(d.worst_index >= 0);

	/* deterministic in the seed */
	moe_tensor_map *m1, *m2, *m3;
	assert_int_equal(ir_interp_random_bindings(c, g[0], 7, &m1), MOE_OK);
	assert_int_equal(ir_interp_random_bindings(c, g[0], 7, &m2), MOE_OK);
	assert_int_equal(ir_interp_random_bindings(c, g[0], 8, &m3), MOE_OK);
	moe_tensor *a = moe_tensor_map_get(m1, "x"), *b = moe_tensor_map_get(m2, "x"), *e = moe_tensor_map_get(m3, "x");
	assert_memory_equal(a->data, b->data, a->nbytes);
	assert_memory_not_equal(a->data, e->data, a->nbytes);
	moe_tensor_map_free(m1);
	moe_tensor_map_free(m2);
	moe_tensor_map_free(m3);
	for (int v = 0; v < 3; v++)
		ir_graph_free(g[v]);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

static void test_random_bindings_ranges(void **st)
{
	(void)st;
	/* experts idx: distinct in [0, E) per token; gather index in range */
	fx *t = fx_new();
	moe_id e = experts_graph(t, (exp_case){"swiglu", "output", true, true});
	int64_t s[1] = {50};
	moe_id gi = ir_emit(t->g, MOE_OP_INPUT, MOE_I32, 1, s, NULL, 0, moe_loc_none());
	moe_node_set_name(t->g, gi, "gi");
	moe_graph_add_output(t->g, e);
	moe_graph_add_output(t->g, gather(t, e, gi, 0, moe_loc_none()));
	moe_tensor_map *m;
	assert_int_equal(ir_interp_random_bindings(t->c, t->g, 3, &m), MOE_OK);
	const int32_t *idx = moe_tensor_map_get(m, "idx")->data;
	for (int r = 0; r < 2; r++) {
		assert_in_range(idx[2 * r], 0, 1);
		assert_in_range(idx[2 * r + 1], 0, 1);
		assert_int_not_equal(idx[2 * r], idx[2 * r + 1]);
	}
	const int32_t *g = moe_tensor_map_get(m, "gi")->data;
	for (int i = 0; i < 50; i++)
		assert_in_range(g[i], 0, 1);
	assert_int_equal(moe_interp_run(t->c, t->g, m, t->out), MOE_OK);
	moe_tensor_map_free(m);
	fx_free(t);
}

/* ---- allocator discipline: every block is freed through the context
 * allocator with the size it was allocated with ---- */
typedef struct counting {
	int64_t live_bytes, live_blocks, bad_sizes;
} counting;

static void *counting_alloc(void *ud, void *p, size_t osize, size_t nsize)
{
	counting *c = ud;
	size_t *h = p ? (size_t *)p - 2 : NULL;
	if (h && h[0] != osize)
		c->bad_sizes++;
	if (nsize == 0) {
		if (h) {
			c->live_bytes -= (int64_t)h[0];
			c->live_blocks--;
			free(h);
		}
		return NULL;
	}
	size_t *n = realloc(h, nsize + 2 * sizeof(size_t));
	if (!n)
		return NULL;
	c->live_bytes += (int64_t)nsize - (h ? (int64_t)n[0] : 0);
	if (!h)
		c->live_blocks++;
	n[0] = nsize;
	return n + 2;
}

static void test_allocator_discipline(void **st)
{
	(void)st;
	counting cnt = {0, 0, 0};
	moe_ctx *c = moe_ctx_new(counting_alloc, &cnt);
	moe_graph *g = ir_graph_new(c, "l");
	int64_t sx[2] = {3, 4}, sw[3] = {4, 5, 4}, sd[3] = {4, 4, 5}, sk[2] = {3, 2}, sb[2] = {4, 5};
	moe_id a[EXP_NSLOTS];
	const char *names[EXP_NSLOTS] = {"x", "idx", "w", "gate", "up", "down", "bg", "bu", "bd"};
	const int64_t *shapes[EXP_NSLOTS] = {sx, sk, sk, sw, sw, sd, sb, sb, NULL};
	int64_t sbd[2] = {4, 4};
	shapes[EXP_B_DOWN] = sbd;
	for (int i = 0; i < EXP_NSLOTS; i++) {
		moe_dtype t = i == EXP_IDX ? MOE_I32 : MOE_BF16;
		int rank = i >= EXP_GATE && i <= EXP_DOWN ? 3 : 2;
		a[i] = ir_emit(g, i < EXP_GATE ? MOE_OP_INPUT : MOE_OP_WEIGHT, t, rank, shapes[i], NULL, 0, moe_loc_none());
		moe_node_set_name(g, a[i], names[i]);
		if (i >= EXP_GATE)
			moe_node_set_str(g, a[i], "source", names[i]);
	}
	moe_id e = moe_node_new(g, MOE_OP_EXPERTS, a, EXP_NSLOTS, moe_loc_none());
	moe_node_set_str(g, e, "act", "gpt_oss");
	moe_node_set_int(g, e, "block", 2);
	assert_int_equal(moe_node_infer(g, e), MOE_OK);
	moe_id l = ir_b_einsum(g, "td,td->t", a[EXP_X], e, moe_loc_none());
	moe_graph_add_output(g, e);
	moe_graph_add_output(g, ir_b1(g, MOE_OP_SOFTMAX, l, moe_loc_none()));
	ir_diff d;
	assert_int_equal(ir_interp_compare(c, g, g, 11, &d), MOE_OK);
	assert_int_equal(d.ndiff, 0);
	moe_tensor_map *m;
	assert_int_equal(ir_interp_random_bindings(c, g, 11, &m), MOE_OK);
	moe_tensor_map_set(m, "up", moe_tensor_new(c, MOE_F32, 3, sw)); /* wrong dtype */
	moe_tensor *out[2];
	assert_int_equal(moe_interp_run(c, g, m, out), MOE_ERR_INVALID);
	moe_tensor_map_free(m);
	ir_graph_free(g);
	moe_ctx_free(c);
	assert_int_equal(cnt.bad_sizes, 0);
	assert_int_equal(cnt.live_blocks, 0);
	assert_int_equal(cnt.live_bytes, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_topk),
		cmocka_unit_test(test_one_hot),
		cmocka_unit_test(test_filter),
		cmocka_unit_test(test_gather),
		cmocka_unit_test(test_gather_fault),
		cmocka_unit_test(test_take_along),
		cmocka_unit_test(test_scatter),
		cmocka_unit_test(test_valid_masks),
		cmocka_unit_test(test_valid_rows_ops),
		cmocka_unit_test(test_valid_gather_einsum),
		cmocka_unit_test(test_leaves),
		cmocka_unit_test(test_shape_ops),
		cmocka_unit_test(test_experts_linear),
		cmocka_unit_test(test_experts_activations),
		cmocka_unit_test(test_experts_bf16_rounding),
		cmocka_unit_test(test_experts_sum_over_k_f32),
		cmocka_unit_test(test_experts_fault),
		cmocka_unit_test(test_binding_errors),
		cmocka_unit_test(test_dead_fault_not_evaluated),
		cmocka_unit_test(test_random_compare),
		cmocka_unit_test(test_random_bindings_ranges),
		cmocka_unit_test(test_allocator_discipline),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
