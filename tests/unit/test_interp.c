/* Unit tests of runtime tensors and the reference interpreter: hand-computed
 * results for the elementwise ops, conversions, reductions and einsum, and
 * numerics edge cases (routing ops, valid masks and faults: test_interp_route.c). */
#include "interp_fx.h"

/* ---- tensors and maps ---- */
static void test_tensor_basics(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	int64_t s[3] = {2, 3, 4};
	moe_tensor *t = moe_tensor_new(c, MOE_BF16, 3, s);
	assert_non_null(t);
	assert_int_equal(moe_tensor_numel(t), 24);
	assert_int_equal(t->nbytes, 48);
	assert_true(t->owned);
	for (size_t i = 0; i < t->nbytes; i++)
		assert_int_equal(((unsigned char *)t->data)[i], 0);
	moe_tensor_free(c, t);
	moe_tensor_free(c, NULL);

	moe_tensor *sc = moe_tensor_new(c, MOE_F32, 0, NULL);
	assert_non_null(sc);
	assert_int_equal(moe_tensor_numel(sc), 1);
	assert_int_equal(sc->nbytes, 4);
	moe_tensor_free(c, sc);

	int64_t big[3] = {MOE_MAX_DIM, MOE_MAX_DIM, MOE_MAX_DIM};
	assert_null(moe_tensor_new(c, MOE_F32, 3, big));
	assert_int_equal(moe_error_count(c), 1);
	int64_t neg[1] = {-1};
	assert_null(moe_tensor_new(c, MOE_F32, 1, neg));
	assert_null(moe_tensor_new(c, MOE_F32, 9, s));
	assert_int_equal(moe_error_count(c), 3);
	moe_ctx_free(c);
}

static void test_tensor_map(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tensor_map *m = moe_tensor_map_new(c);
	int64_t s[1] = {1};
	assert_null(moe_tensor_map_get(m, "a"));
	char name[32];
	for (int i = 0; i < 100; i++) {
		snprintf(name, sizeof name, "w%d", i);
		moe_tensor *t = moe_tensor_new(c, MOE_I32, 1, s);
		*(int32_t *)t->data = i;
		moe_tensor_map_set(m, name, t);
	}
	for (int i = 0; i < 100; i++) {
		snprintf(name, sizeof name, "w%d", i);
		moe_tensor *t = moe_tensor_map_get(m, name);
		assert_non_null(t);
		assert_int_equal(*(int32_t *)t->data, i);
	}
	moe_tensor *r = moe_tensor_new(c, MOE_I32, 1, s);
	*(int32_t *)r->data = -5;
	moe_tensor_map_set(m, "w7", r); /* replaces and frees the old one */
	assert_ptr_equal(moe_tensor_map_get(m, "w7"), r);
	moe_tensor_map_set(m, "w7", r); /* same tensor again: kept */
	assert_int_equal(*(int32_t *)moe_tensor_map_get(m, "w7")->data, -5);
	assert_null(moe_tensor_map_get(m, "w100"));
	moe_tensor_map_free(m);
	moe_tensor_map_free(NULL);
	moe_ctx_free(c);
}

static void test_bf16_conversion(void **st)
{
	(void)st;
	assert_int_equal(moe_f32_to_bf16(1.0f), 0x3f80);
	assert_int_equal(moe_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);          /* tie, to even */
	assert_int_equal(moe_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* above the tie */
	assert_int_equal(moe_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);      /* tie, odd -> up */
	assert_int_equal(moe_f32_to_bf16(-1.0f - 0x1p-8f), 0xbf80);
	assert_int_equal(moe_f32_to_bf16(0.0f), 0x0000);
	assert_int_equal(moe_f32_to_bf16(-0.0f), 0x8000);
	assert_int_equal(moe_f32_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(moe_f32_to_bf16(-INFINITY), 0xff80);
	assert_int_equal(moe_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds up to inf */
	assert_int_equal(moe_f32_to_bf16(bitsf(0x00000001)), 0x0000); /* tiny subnormal */
	/* NaNs stay NaN and come out quiet, even with only low payload bits */
	uint16_t h = moe_f32_to_bf16(bitsf(0x7f800001));
	assert_true((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0 && (h & 0x40));
	h = moe_f32_to_bf16(bitsf(0xffffffff));
	assert_int_equal(h, 0xffff);
	assert_true(moe_bf16_to_f32(0x3f80) == 1.0f);
	assert_true(moe_bf16_to_f32(0xc040) == -3.0f);
	assert_int_equal(fbits(moe_bf16_to_f32(0x7f81)), 0x7fc10000u); /* quieted */
	assert_true(isinf(moe_bf16_to_f32(0xff80)));
	for (uint32_t b = 0; b < 0x10000; b++) { /* every non-NaN bf16 round-trips */
		if ((b & 0x7fff) > 0x7f80)
			continue;
		assert_int_equal(moe_f32_to_bf16(moe_bf16_to_f32((uint16_t)b)), b);
	}
}

/* ---- elementwise ---- */
static void test_add_broadcast(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s23[2] = {2, 3}, s3[1] = {3};
	float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30};
	moe_id x = input(t, "a", MOE_F32, 2, s23, a), y = input(t, "b", MOE_F32, 1, s3, b);
	assert_int_equal(run1(t, ir_b2(t->g, MOE_OP_ADD, y, x, moe_loc_none())), MOE_OK);
	float want[6] = {11, 22, 33, 14, 25, 36};
	expect_f32(t->out[0], want, 6);
	assert_int_equal(t->out[0]->rank, 2);
	fx_free(t);
}

static void test_float_binary_edges(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {6};
	float a[6] = {1, -1, NAN, 2, 0.0f, -0.0f}, b[6] = {0, 0, 3, NAN, -0.0f, 0.0f};
	moe_id x = input(t, "a", MOE_F32, 1, s, a), y = input(t, "b", MOE_F32, 1, s, b);
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_DIV, x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_MAX, x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_MIN, x, y, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float d[6] = {INFINITY, -INFINITY, NAN, NAN, NAN, NAN};
	float mx[6] = {1, 0, NAN, NAN, 0.0f, 0.0f};
	float mn[6] = {0, -1, NAN, NAN, -0.0f, -0.0f};
	expect_f32(t->out[0], d, 6);
	expect_f32(t->out[1], mx, 6);
	expect_f32(t->out[2], mn, 6);
	fx_free(t);
}

static void test_float_unary(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {3};
	float a[3] = {0, 1, -2};
	moe_id x = input(t, "a", MOE_F32, 1, s, a);
	moe_op ops[] = {MOE_OP_NEG, MOE_OP_ABS, MOE_OP_EXP, MOE_OP_TANH, MOE_OP_ERF, MOE_OP_SIGMOID};
	for (int i = 0; i < 6; i++)
		moe_graph_add_output(t->g, ir_b1(t->g, ops[i], x, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float neg[3] = {-0.0f, -1, 2}, ab[3] = {0, 1, 2};
	expect_f32(t->out[0], neg, 3);
	expect_f32(t->out[1], ab, 3);
	double ex[3] = {1, 2.718281828459045, 0.1353352832366127};
	expect_near(t->out[2], ex, 3, 1e-7);
	double th[3] = {0, 0.7615941559557649, -0.9640275800758169};
	expect_near(t->out[3], th, 3, 1e-7);
	double er[3] = {0, 0.8427007929497149, -0.9953222650189527};
	expect_near(t->out[4], er, 3, 1e-7);
	double sg[3] = {0.5, 0.7310585786300049, 0.11920292202211755};
	expect_near(t->out[5], sg, 3, 1e-7);
	fx_free(t);

	t = fx_new();
	float b[4] = {4, 0.25f, -1, 0};
	int64_t s4[1] = {4};
	x = input(t, "b", MOE_F32, 1, s4, b);
	moe_graph_add_output(t->g, ir_b1(t->g, MOE_OP_SQRT, x, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b1(t->g, MOE_OP_RSQRT, x, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b1(t->g, MOE_OP_LOG, x, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float sq[4] = {2, 0.5f, NAN, 0}, rs[4] = {0.5f, 2, NAN, INFINITY}, lg[4] = {0, 0, NAN, -INFINITY};
	lg[0] = (float)log(4.0);
	lg[1] = (float)-log(4.0);
	expect_f32(t->out[0], sq, 4);
	expect_f32(t->out[1], rs, 4);
	expect_f32(t->out[2], lg, 4);
	fx_free(t);
}

static void test_bf16_rounding_per_op(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {3};
	/* 1 + 2^-8 is a tie -> 1; 1 + 3 * 2^-8 is a tie -> 1 + 2^-6; */
	uint16_t a[3] = {0x3f80, 0x3f80, 0x4040}, b[3] = {0x3b80, 0x3c40, 0x3b80}; /* 1,1,3 and 2^-8, 3*2^-8, 2^-8 */
	moe_id x = input(t, "a", MOE_BF16, 1, s, a), y = input(t, "b", MOE_BF16, 1, s, b);
	moe_id sum = ir_b2(t->g, MOE_OP_ADD, x, y, moe_loc_none());
	moe_graph_add_output(t->g, sum);
	/* rounding after every op: (1 + 2^-8) rounds to 1 before the subtraction */
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_SUB, sum, x, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	uint16_t want[3] = {0x3f80, 0x3f82, 0x4040}, diff[3] = {0x0000, 0x3c80, 0x0000};
	expect_bf16(t->out[0], want, 3);
	expect_bf16(t->out[1], diff, 3);
	fx_free(t);
}

static void test_int_ops(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {5};
	int32_t a[5] = {-7, 7, INT32_MIN, INT32_MAX, -16}, b[5] = {2, -2, -1, 1, 33};
	moe_id x = input(t, "a", MOE_I32, 1, s, a), y = input(t, "b", MOE_I32, 1, s, b);
	moe_op ops[4] = {MOE_OP_DIV, MOE_OP_ADD, MOE_OP_SHL, MOE_OP_SAR};
	for (int i = 0; i < 4; i++)
		moe_graph_add_output(t->g, ir_b2(t->g, ops[i], x, y, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	int32_t dv[5] = {-3, -3, INT32_MIN, INT32_MAX, 0};
	int32_t ad[5] = {-5, 5, INT32_MAX, INT32_MIN, 17}; /* wraps */
	int32_t sl[5] = {-28, -1073741824, 0, -2, -32}; /* counts mod 32: -2 -> 30, 33 -> 1 */
	int32_t sr[5] = {-2, 0, -1, 0x3fffffff, -8};
	expect_i32(t->out[0], dv, 5);
	expect_i32(t->out[1], ad, 5);
	expect_i32(t->out[2], sl, 5);
	expect_i32(t->out[3], sr, 5);
	fx_free(t);

	t = fx_new();
	int32_t c[3] = {-1, -16, 5}, d[3] = {28, 2, 32};
	int64_t s3[1] = {3};
	x = input(t, "c", MOE_I32, 1, s3, c);
	y = input(t, "d", MOE_I32, 1, s3, d);
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_SHR, x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b1(t->g, MOE_OP_NOT, x, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_XOR, x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b1(t->g, MOE_OP_NEG, x, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	int32_t shr[3] = {15, 0x3ffffffc, 5}, nt[3] = {0, 15, -6}, xr[3] = {-1 ^ 28, -16 ^ 2, 5 ^ 32}, ng[3] = {1, 16, -5};
	expect_i32(t->out[0], shr, 3);
	expect_i32(t->out[1], nt, 3);
	expect_i32(t->out[2], xr, 3);
	expect_i32(t->out[3], ng, 3);
	fx_free(t);
}

static void test_bool_ops(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {4};
	unsigned char a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1};
	moe_id x = input(t, "a", MOE_BOOL, 1, s, a), y = input(t, "b", MOE_BOOL, 1, s, b);
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_AND, x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_OR, x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b1(t->g, MOE_OP_NOT, x, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_EQ, x, y, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	unsigned char an[4] = {0, 0, 0, 1}, orr[4] = {0, 1, 1, 1}, nt[4] = {1, 1, 0, 0}, eq[4] = {1, 0, 0, 1};
	expect_bool(t->out[0], an, 4);
	expect_bool(t->out[1], orr, 4);
	expect_bool(t->out[2], nt, 4);
	expect_bool(t->out[3], eq, 4);
	fx_free(t);
}

static void test_compare_select(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {4};
	float a[4] = {NAN, -0.0f, 1, 2}, b[4] = {NAN, 0.0f, 2, 1};
	moe_id x = input(t, "a", MOE_F32, 1, s, a), y = input(t, "b", MOE_F32, 1, s, b);
	moe_id eq = ir_b2(t->g, MOE_OP_EQ, x, y, moe_loc_none());
	moe_graph_add_output(t->g, eq);
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_NE, x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b2(t->g, MOE_OP_LE, x, y, moe_loc_none()));
	moe_id ten = ir_b_const(t->g, MOE_F32, 10, moe_loc_none());
	moe_graph_add_output(t->g, ir_b3(t->g, MOE_OP_SELECT, eq, x, ten, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	unsigned char e[4] = {0, 1, 0, 0}, ne[4] = {1, 0, 1, 1}, le[4] = {0, 1, 1, 0};
	float sel[4] = {10, -0.0f, 10, 10};
	expect_bool(t->out[0], e, 4);
	expect_bool(t->out[1], ne, 4);
	expect_bool(t->out[2], le, 4);
	expect_f32(t->out[3], sel, 4);
	fx_free(t);
}

/* ---- conversions ---- */
static void test_cast(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {7};
	float a[7] = {NAN, 3e9f, -3e9f, -2.7f, 2.7f, -0.0f, 1.0f + 0x1p-8f};
	moe_id x = input(t, "a", MOE_F32, 1, s, a);
	moe_graph_add_output(t->g, ir_b_cast(t->g, x, MOE_I32, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_cast(t->g, x, MOE_BOOL, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_cast(t->g, x, MOE_BF16, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	int32_t i[7] = {0, INT32_MAX, INT32_MIN, -2, 2, 0, 1};
	unsigned char b[7] = {1, 1, 1, 1, 1, 0, 1};
	expect_i32(t->out[0], i, 7);
	expect_bool(t->out[1], b, 7);
	const uint16_t *h = t->out[2]->data;
	assert_true((h[0] & 0x7fff) > 0x7f80);
	assert_int_equal(h[5], 0x8000);
	assert_int_equal(h[6], 0x3f80);
	fx_free(t);

	t = fx_new();
	/* 2^24 + 1 -> f32 ties to even; 2^24 + 2^16 + 1 -> bf16 rounded once (up),
	 * where rounding through f32 would give 2^24 */
	int32_t v[4] = {16777217, 16842753, 257, -3};
	int64_t s4[1] = {4};
	x = input(t, "v", MOE_I32, 1, s4, v);
	moe_graph_add_output(t->g, ir_b_cast(t->g, x, MOE_F32, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_cast(t->g, x, MOE_BF16, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_cast(t->g, x, MOE_BOOL, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float f[4] = {16777216.0f, 16842752.0f, 257, -3};
	expect_f32(t->out[0], f, 4);
	uint16_t bh[4] = {0x4b80, 0x4b81, 0x4380, 0xc040};
	expect_bf16(t->out[1], bh, 4);
	unsigned char bb[4] = {1, 1, 1, 1};
	expect_bool(t->out[2], bb, 4);
	fx_free(t);
}

static void test_bitcast(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {2};
	float a[2] = {1.0f, -0.0f};
	moe_id x = input(t, "a", MOE_F32, 1, s, a);
	moe_id i = ir_b_bitcast(t->g, x, MOE_I32, moe_loc_none());
	moe_graph_add_output(t->g, i);
	moe_id one = ir_b_const(t->g, MOE_I32, 1, moe_loc_none());
	moe_graph_add_output(t->g, ir_b_bitcast(t->g, ir_b2(t->g, MOE_OP_ADD, i, one, moe_loc_none()), MOE_F32,
		moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	int32_t want[2] = {0x3f800000, INT32_MIN};
	expect_i32(t->out[0], want, 2);
	float back[2] = {bitsf(0x3f800001), bitsf(0x80000001)};
	expect_f32(t->out[1], back, 2);
	fx_free(t);
}

/* ---- reductions, softmax, cumsum ---- */
static void test_reduce(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {2, 3};
	float a[6] = {1, 2, 3, 4, NAN, -6};
	unsigned char m[6] = {1, 0, 1, 1, 1, 0};
	moe_id x = input(t, "a", MOE_F32, 2, s, a), b = input(t, "m", MOE_BOOL, 2, s, m);
	moe_id r0 = ir_b_reduce(t->g, MOE_OP_REDUCE_SUM, x, 0, true, moe_loc_none());
	assert_int_equal(moe_node_rank(t->g, r0), 2);
	moe_graph_add_output(t->g, r0);
	moe_graph_add_output(t->g, ir_b_reduce(t->g, MOE_OP_REDUCE_MAX, x, -1, false, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_reduce(t->g, MOE_OP_REDUCE_MIN, x, 1, false, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_reduce(t->g, MOE_OP_REDUCE_SUM, b, 1, false, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float sum[3] = {5, NAN, -3}, mx[2] = {3, NAN}, mn[2] = {1, NAN};
	int32_t cnt[2] = {2, 2};
	expect_f32(t->out[0], sum, 3);
	expect_f32(t->out[1], mx, 2);
	expect_f32(t->out[2], mn, 2);
	expect_i32(t->out[3], cnt, 2);
	fx_free(t);
}

static void test_reduce_bf16_rounds_once(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[1] = {3};
	uint16_t a[3] = {0x3f80, 0x3b80, 0x3b80}; /* 1, 2^-8, 2^-8 */
	moe_id x = input(t, "a", MOE_BF16, 1, s, a);
	assert_int_equal(run1(t, ir_b_reduce(t->g, MOE_OP_REDUCE_SUM, x, 0, false, moe_loc_none())), MOE_OK);
	uint16_t want[1] = {0x3f81}; /* f32 accumulation: 1 + 2^-7 exactly; bf16 steps would give 1 */
	expect_bf16(t->out[0], want, 1);
	fx_free(t);
}

static void test_softmax(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {2, 3};
	float a[6] = {1, 2, 3, 1000, 1000, -INFINITY};
	moe_id x = input(t, "a", MOE_F32, 2, s, a);
	moe_id sm = mk(t, MOE_OP_SOFTMAX, 1, x, 0, 0);
	assert_int_equal(run1(t, done(t, sm)), MOE_OK);
	double want[6] = {0.09003057317038046, 0.24472847105479764, 0.6652409557748218, 0.5, 0.5, 0};
	expect_near(t->out[0], want, 6, 2e-7);
	fx_free(t);

	t = fx_new();
	x = input(t, "a", MOE_F32, 2, s, a);
	sm = mk(t, MOE_OP_SOFTMAX, 1, x, 0, 0);
	moe_node_set_int(t->g, sm, "axis", 0);
	assert_int_equal(run1(t, done(t, sm)), MOE_OK);
	float w0[6] = {0, 0, 1, 1, 1, 0};
	expect_f32(t->out[0], w0, 6);
	fx_free(t);
}

static void test_cumsum(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t s[2] = {2, 3};
	int32_t a[6] = {1, 2, 3, 4, 5, 6};
	moe_id x = input(t, "a", MOE_I32, 2, s, a);
	moe_id ex = mk(t, MOE_OP_CUMSUM, 1, x, 0, 0);
	moe_node_set_int(t->g, ex, "exclusive", 1);
	moe_graph_add_output(t->g, done(t, ex));
	moe_id in = mk(t, MOE_OP_CUMSUM, 1, x, 0, 0);
	moe_node_set_int(t->g, in, "axis", 0);
	moe_graph_add_output(t->g, done(t, in));
	assert_int_equal(run(t), MOE_OK);
	int32_t we[6] = {0, 1, 3, 0, 4, 9}, wi[6] = {1, 2, 3, 5, 7, 9};
	expect_i32(t->out[0], we, 6);
	expect_i32(t->out[1], wi, 6);
	fx_free(t);

	t = fx_new();
	unsigned char m[4] = {1, 0, 1, 1};
	int64_t s4[1] = {4};
	x = input(t, "m", MOE_BOOL, 1, s4, m);
	ex = mk(t, MOE_OP_CUMSUM, 1, x, 0, 0);
	moe_node_set_int(t->g, ex, "exclusive", 1);
	assert_int_equal(moe_node_dtype(t->g, done(t, ex)), MOE_I32);
	moe_graph_add_output(t->g, ex);
	float f[4] = {0.5f, -0.0f, 1.5f, -3};
	moe_id y = input(t, "f", MOE_F32, 1, s4, f);
	moe_graph_add_output(t->g, done(t, mk(t, MOE_OP_CUMSUM, 1, y, 0, 0)));
	assert_int_equal(run(t), MOE_OK);
	int32_t pos[4] = {0, 1, 1, 2};
	float fs[4] = {0.5f, 0.5f, 2, -1};
	expect_i32(t->out[0], pos, 4);
	expect_f32(t->out[1], fs, 4);
	fx_free(t);
}

/* ---- einsum ---- */
static void test_einsum(void **st)
{
	(void)st;
	fx *t = fx_new();
	int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
	float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
	moe_id x = input(t, "a", MOE_F32, 2, sa, a), y = input(t, "b", MOE_F32, 2, sb, b);
	moe_graph_add_output(t->g, ir_b_einsum(t->g, "ik,kj->ij", x, y, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_einsum(t->g, "ij->ji", x, MOE_NONE, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_einsum(t->g, "ij->", x, MOE_NONE, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_einsum(t->g, "ik,kj->ji", x, y, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float mm[4] = {4, 5, 10, 11}, tr[6] = {1, 4, 2, 5, 3, 6}, all[1] = {21}, mmt[4] = {4, 10, 5, 11};
	expect_f32(t->out[0], mm, 4);
	expect_f32(t->out[1], tr, 6);
	expect_f32(t->out[2], all, 1);
	assert_int_equal(t->out[2]->rank, 0);
	expect_f32(t->out[3], mmt, 4);
	fx_free(t);

	/* batched, outer product, integer contraction */
	t = fx_new();
	int64_t sg[3] = {2, 1, 2}, sf[3] = {2, 2, 2};
	float gb[4] = {1, 2, 3, 4}, gf[8] = {1, 0, 0, 1, 2, 0, 0, -1};
	x = input(t, "x", MOE_F32, 3, sg, gb);
	y = input(t, "w", MOE_F32, 3, sf, gf);
	moe_graph_add_output(t->g, ir_b_einsum(t->g, "gbd,gfd->gbf", x, y, moe_loc_none()));
	int64_t s2[1] = {2}, s3[1] = {3};
	int32_t u[2] = {2, -1}, v[3] = {1, 2, 3};
	moe_id iu = input(t, "u", MOE_I32, 1, s2, u), iv = input(t, "v", MOE_I32, 1, s3, v);
	moe_graph_add_output(t->g, ir_b_einsum(t->g, "i,j->ij", iu, iv, moe_loc_none()));
	moe_graph_add_output(t->g, ir_b_einsum(t->g, "i,j->", iu, iv, moe_loc_none()));
	assert_int_equal(run(t), MOE_OK);
	float bg[4] = {1, 2, 6, -4};
	int32_t op[6] = {2, 4, 6, -1, -2, -3}, tot[1] = {6};
	expect_f32(t->out[0], bg, 4);
	expect_i32(t->out[1], op, 6);
	expect_i32(t->out[2], tot, 1);
	fx_free(t);
}

static void test_einsum_f32_order(void **st)
{
	(void)st;
	/* f32 accumulation in index order: (2^24 + 1) + 1 = 2^24 twice, whereas a
	 * wider accumulator would give 2^24 + 2 */
	fx *t = fx_new();
	int64_t s[1] = {3};
	float a[3] = {16777216.0f, 1, 1}, b[3] = {1, 1, 1};
	moe_id x = input(t, "a", MOE_F32, 1, s, a), y = input(t, "b", MOE_F32, 1, s, b);
	assert_int_equal(run1(t, ir_b_einsum(t->g, "i,i->", x, y, moe_loc_none())), MOE_OK);
	float want[1] = {16777216.0f};
	expect_f32(t->out[0], want, 1);
	fx_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensor_basics),
		cmocka_unit_test(test_tensor_map),
		cmocka_unit_test(test_bf16_conversion),
		cmocka_unit_test(test_add_broadcast),
		cmocka_unit_test(test_float_binary_edges),
		cmocka_unit_test(test_float_unary),
		cmocka_unit_test(test_bf16_rounding_per_op),
		cmocka_unit_test(test_int_ops),
		cmocka_unit_test(test_bool_ops),
		cmocka_unit_test(test_compare_select),
		cmocka_unit_test(test_cast),
		cmocka_unit_test(test_bitcast),
		cmocka_unit_test(test_reduce),
		cmocka_unit_test(test_reduce_bf16_rounds_once),
		cmocka_unit_test(test_softmax),
		cmocka_unit_test(test_cumsum),
		cmocka_unit_test(test_einsum),
		cmocka_unit_test(test_einsum_f32_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
