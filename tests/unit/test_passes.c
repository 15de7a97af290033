/* Passes checked for meaning: every pass runs on graphs that are then executed
 * by the reference interpreter before and after, on random inputs; lowered
 * top-k is compared with a direct reference top-k on 10,000+ rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "moec/passes.h"
#include "moec/runtime.h"

/* ---- deterministic random numbers ---- */
static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}
static double unif(void) { return (rnd() & 0xffffff) / 16777216.0; }
static float gauss(void)
{
	double u = unif() + 1e-12, v = unif();
	return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static float get_f(const moe_tensor *t, int64_t i)
{
	if (t->dtype == MOE_BF16)
		return moe_bf16_to_f32(((uint16_t *)t->data)[i]);
	return ((float *)t->data)[i];
}
static void set_f(moe_tensor *t, int64_t i, float v)
{
	if (t->dtype == MOE_BF16)
		((uint16_t *)t->data)[i] = moe_f32_to_bf16(v);
	else
		((float *)t->data)[i] = v;
}

static moe_id leaf(moe_graph *g, moe_op op, const char *name, moe_dtype t, int rank, const int64_t *s)
{
	moe_id id = ir_emit(g, op, t, rank, s, NULL, 0, moe_loc_none());
	moe_node_set_name(g, id, name);
	if (op == MOE_OP_WEIGHT)
		moe_node_set_str(g, id, "source", name);
	return id;
}

/* ---- reference top-k: sort indices by (score desc, NaN first, index asc) ---- */
static const float *ref_scores;
static int cmp_desc(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	float x = ref_scores[i], y = ref_scores[j];
	int xn = isnan(x), yn = isnan(y);
	if (xn != yn)
		return xn ? -1 : 1;
	if (!xn && x != y) /* -0 == +0 here */
		return x > y ? -1 : 1;
	return i - j;
}

static float special(int mode)
{
	static const float v[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f, 0.5f};
	if (mode == 4 && (rnd() & 1))
		return -NAN;
	return v[mode];
}

/* One batch: R rows of E scores (x, or pre(x) for pre a softmax or a
 * sigmoid: the scores whose ranks lower-topk counts in one step-function
 * reduce), top-K, through lower-topk{mode}. */
static void topk_batch_pre(moe_ctx *c, int R, int E, int K, moe_dtype t, const char *mode, moe_op pre)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "tk");
	int64_t s[2] = {R, E};
	moe_id x = leaf(g, MOE_OP_INPUT, "x", t, 2, s);
	moe_id sc = x;
	if (pre == MOE_OP_SOFTMAX || pre == MOE_OP_SIGMOID)
		sc = ir_b1(g, pre, x, moe_loc_none());
	moe_id k = moe_node_new(g, MOE_OP_TOPK, &sc, 1, moe_loc_none());
	moe_node_set_int(g, k, "k", K);
	assert_int_equal(moe_node_infer(g, k), MOE_OK);
	moe_id tv = ir_b2(g, MOE_OP_TAKE_ALONG, sc, k, moe_loc_none());
	moe_graph_add_output(g, k);
	moe_graph_add_output(g, tv);
	moe_graph_add_output(g, sc);

	moe_tensor_map *bind = moe_tensor_map_new(c);
	moe_tensor *xt = moe_tensor_new(c, t, 2, s);
	int style = rnd() % 4; /* 0 gaussian, 1 few distinct values (ties), 2 specials mixed, 3 all equal */
	for (int64_t i = 0; i < (int64_t)R * E; i++) {
		float v = gauss();
		if (style == 1)
			v = (float)(rnd() % 4) - 1.5f;
		else if (style == 2 && rnd() % 3 == 0)
			v = special(rnd() % 8);
		else if (style == 3)
			v = 0.25f;
		set_f(xt, i, v);
	}
	moe_tensor_map_set(bind, "x", xt);

	char text[64];
	snprintf(text, sizeof text, "lower-topk{mode=%s},cse,dce", mode);
	moe_run_opts ro = {.verify = 1};
	assert_int_equal(moe_run_pipeline_text(c, text, m, &ro), MOE_OK);
	for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++)
		assert_int_not_equal(moe_node_op(g, i), MOE_OP_TOPK);
	moe_tensor *out[3] = {0};
	assert_int_equal(moe_interp_run(c, g, bind, out), MOE_OK);
	const int32_t *got = out[0]->data;
	float *row = malloc(sizeof(float) * (size_t)E);
	int *ord = malloc(sizeof(int) * (size_t)E);
	for (int r = 0; r < R; r++) {
		for (int e = 0; e < E; e++) {
			row[e] = get_f(out[2], (int64_t)r * E + e);
			ord[e] = e;
		}
		ref_scores = row;
		qsort(ord, (size_t)E, sizeof *ord, cmp_desc);
		for (int j = 0; j < K; j++) {
			if (got[r * K + j] != ord[j])
				fail_msg("%s E=%d K=%d row %d slot %d: got %d want %d (style %d)", mode, E, K, r, j,
					got[r * K + j], ord[j], style);
			float a = get_f(out[1], (int64_t)r * K + j), b = row[ord[j]];
			if (memcmp(&a, &b, sizeof a) && !(isnan(a) && isnan(b)))
				fail_msg("value mismatch");
		}
	}
	free(row);
	free(ord);
	moe_tensor_free(c, out[0]);
	moe_tensor_free(c, out[1]);
	moe_tensor_free(c, out[2]);
	moe_tensor_map_free(bind);
	moe_module_free(m);
}

static void topk_batch(moe_ctx *c, int R, int E, int K, moe_dtype t, const char *mode)
{
	topk_batch_pre(c, R, E, K, t, mode, MOE_OP_TOPK);
}

static void test_topk_property(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	long rows = 0;
	for (int it = 0; rows < 10000 || it < 60; it++) {
		/* E from 2 to 300, skewed small; every K <= E reachable */
		int E = it % 10 == 0 ? 2 + (int)(rnd() % 299) : 2 + (int)(rnd() % 40);
		if (it == 1)
			E = 300;
		int K = 1 + (int)(rnd() % (unsigned)E);
		int R = E > 100 ? 8 : 120;
		topk_batch(c, R, E, K, MOE_F32, "exact");
		topk_batch(c, R, E, K, MOE_BF16, "packed16");
		topk_batch(c, R, E, K, MOE_BF16, "exact");
		if (it % 4 == 0) { /* softmax and sigmoid scores: the one-pass rank (ties from rounding, NaN) */
			topk_batch_pre(c, R, E, K, MOE_F32, "exact", MOE_OP_SOFTMAX);
			topk_batch_pre(c, R, E, K, MOE_F32, "exact", MOE_OP_SIGMOID);
			rows += 2L * R;
		}
		rows += 3L * R;
	}
	assert_true(rows >= 10000);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

/* ---- an MoE layer, interpreted before and after each pass ---- */
typedef struct layer_cfg {
	int T, D, F, E, K, B;
	moe_dtype t;
	const char *act, *weight_on;
	int biases, one_expert;
} layer_cfg;

static moe_module *build_layer(moe_ctx *c, const layer_cfg *L)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "moe");
	moe_graph_set_dtype(g, L->t);
	int64_t xs[2] = {L->T, L->D}, rs[2] = {L->E, L->D}, us[3] = {L->E, L->F, L->D}, ds[3] = {L->E, L->D, L->F};
	int64_t bf[2] = {L->E, L->F}, bd[2] = {L->E, L->D};
	moe_loc nl = moe_loc_none();
	moe_id x = leaf(g, MOE_OP_INPUT, "x", L->t, 2, xs);
	moe_id r = leaf(g, MOE_OP_WEIGHT, "router", L->t, 2, rs);
	bool gated = strcmp(L->act, "none") != 0;
	moe_id gate = gated ? leaf(g, MOE_OP_WEIGHT, "gate", L->t, 3, us) : MOE_NONE;
	moe_id up = leaf(g, MOE_OP_WEIGHT, "up", L->t, 3, us);
	moe_id down = leaf(g, MOE_OP_WEIGHT, "down", L->t, 3, ds);
	moe_id bg = MOE_NONE, bu = MOE_NONE, bdn = MOE_NONE;
	if (L->biases) {
		bg = gated ? leaf(g, MOE_OP_WEIGHT, "gate_bias", L->t, 2, bf) : MOE_NONE;
		bu = leaf(g, MOE_OP_WEIGHT, "up_bias", L->t, 2, bf);
		bdn = leaf(g, MOE_OP_WEIGHT, "down_bias", L->t, 2, bd);
	}
	moe_id logits = ir_b_einsum(g, "td,ed->te", ir_b_cast(g, x, MOE_F32, nl), ir_b_cast(g, r, MOE_F32, nl), nl);
	moe_id p = ir_b1(g, MOE_OP_SOFTMAX, logits, nl);
	moe_id idx = moe_node_new(g, MOE_OP_TOPK, &p, 1, nl);
	moe_node_set_int(g, idx, "k", L->K);
	assert_int_equal(moe_node_infer(g, idx), MOE_OK);
	moe_id top = ir_b2(g, MOE_OP_TAKE_ALONG, p, idx, nl);
	moe_id w = ir_b2(g, MOE_OP_DIV, top, ir_b_reduce(g, MOE_OP_REDUCE_SUM, top, 1, true, nl), nl);
	moe_id a[EXP_NSLOTS] = {x, idx, w, gate, up, down, bg, bu, bdn};
	moe_id y = moe_node_new(g, MOE_OP_EXPERTS, a, EXP_NSLOTS, nl);
	moe_node_set_str(g, y, "act", L->act);
	moe_node_set_int(g, y, "block", L->B);
	moe_node_set_str(g, y, "weight_on", L->weight_on);
	if (!strcmp(L->act, "gpt_oss")) {
		moe_node_set_float(g, y, "alpha", 1.702);
		moe_node_set_float(g, y, "limit", 0.5); /* small, so the clamps are hit */
	}
	assert_int_equal(moe_node_infer(g, y), MOE_OK);
	moe_graph_add_output(g, y);
	moe_graph_add_output(g, idx);
	return m;
}

static moe_tensor_map *random_bind(moe_ctx *c, const moe_graph *g, const layer_cfg *L)
{
	moe_tensor_map *b = moe_tensor_map_new(c);
	for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++) {
		moe_op op = moe_node_op(g, i);
		if (op != MOE_OP_INPUT && op != MOE_OP_WEIGHT)
			continue;
		const char *name = moe_node_name(g, i);
		moe_tensor *t = moe_tensor_new(c, moe_node_dtype(g, i), moe_node_rank(g, i), moe_node_shape(g, i));
		for (int64_t k = 0; k < moe_tensor_numel(t); k++) {
			float v = gauss() * (op == MOE_OP_INPUT ? 1.0f : 0.3f);
			if (L->one_expert && op == MOE_OP_INPUT)
				v = 0.5f + (float)unif(); /* positive inputs ... */
			if (L->one_expert && !strcmp(name, "router"))
				v = k < L->D ? 4.0f : -4.0f; /* ... and a router that loves expert 0 */
			set_f(t, k, v);
		}
		moe_tensor_map_set(b, name, t);
	}
	return b;
}

static double max_abs(const moe_tensor *t)
{
	double m = 0;
	for (int64_t i = 0; i < moe_tensor_numel(t); i++)
		m = fmax(m, fabs(get_f(t, i)));
	return m;
}

static void compare(const moe_tensor *ref, const moe_tensor *got, double rtol, const char *what)
{
	assert_int_equal(ref->dtype, got->dtype);
	assert_int_equal(moe_tensor_numel(ref), moe_tensor_numel(got));
	if (ref->dtype == MOE_I32) {
		assert_memory_equal(ref->data, got->data, ref->nbytes);
		return;
	}
	double m = max_abs(ref), e = 0;
	for (int64_t i = 0; i < moe_tensor_numel(ref); i++)
		e = fmax(e, fabs(get_f(ref, i) - get_f(got, i)));
	if (e > rtol * (m > 0 ? m : 1))
		fail_msg("%s: max |error| %g > %g * max|y| (%g)", what, e, rtol, m);
}

static void run_layer(const layer_cfg *L)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = build_layer(c, L);
	moe_graph *g = moe_module_graph(m, 0);
	moe_tensor_map *b = random_bind(c, g, L);
	moe_tensor *ref[2] = {0};
	assert_int_equal(moe_interp_run(c, g, b, ref), MOE_OK);
	double tol = L->t == MOE_BF16 ? 2e-2 : 1e-5;
	const char *steps[] = {"infer-shapes", "canonicalize", "lower-topk", "blockwise-dispatch", "flatten-blocks",
		"grid-bound", "canonicalize", "cse", "dce"};
	moe_run_opts ro = {.verify = 1};
	moe_tensor *prev[2] = {0};
	for (size_t s = 0; s < sizeof steps / sizeof *steps; s++) {
		assert_int_equal(moe_run_pipeline_text(c, steps[s], m, &ro), MOE_OK);
		moe_tensor *got[2] = {0};
		if (moe_interp_run(c, g, b, got) != MOE_OK) {
			moe_diag_print(c, stderr);
			fail_msg("interpreting after %s failed", steps[s]);
		}
		compare(ref[1], got[1], 0, steps[s]); /* routing identical */
		compare(ref[0], got[0], tol, steps[s]);
		if (!strcmp(steps[s], "flatten-blocks")) /* the flat graph computes the loop's values exactly */
			assert_memory_equal(prev[0]->data, got[0]->data, got[0]->nbytes);
		moe_tensor_free(c, prev[0]);
		moe_tensor_free(c, prev[1]);
		prev[0] = got[0];
		prev[1] = got[1];
	}
	moe_tensor_free(c, prev[0]);
	moe_tensor_free(c, prev[1]);
	/* the tcp pipeline leaves no topk, no experts */
	for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++) {
		assert_int_not_equal(moe_node_op(g, i), MOE_OP_TOPK);
		assert_int_not_equal(moe_node_op(g, i), MOE_OP_EXPERTS);
	}
	int64_t G = 0;
	assert_true(ir_graph_attr_int(g, "grid_blocks_max", -1) == moe_grid_blocks_max(L->T, L->K, L->E, L->B));
	(void)G;
	moe_tensor_free(c, ref[0]);
	moe_tensor_free(c, ref[1]);
	moe_tensor_map_free(b);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_layer_swiglu(void **st)
{
	(void)st;
	layer_cfg L = {5, 16, 24, 8, 2, 4, MOE_F32, "swiglu", "output", 0, 0};
	run_layer(&L);
}
static void test_layer_decode(void **st) /* T=1, n < E */
{
	(void)st;
	layer_cfg L = {1, 16, 8, 13, 3, 8, MOE_F32, "swiglu", "output", 0, 0};
	run_layer(&L);
}
static void test_layer_one_expert(void **st)
{
	(void)st;
	layer_cfg L = {9, 8, 8, 7, 1, 2, MOE_F32, "swiglu", "output", 0, 1};
	run_layer(&L);
}
static void test_layer_big_block(void **st) /* B larger than T */
{
	(void)st;
	layer_cfg L = {3, 8, 12, 5, 2, 64, MOE_F32, "geglu", "output", 0, 0};
	run_layer(&L);
}
static void test_layer_variants(void **st)
{
	(void)st;
	layer_cfg a = {6, 8, 12, 6, 2, 3, MOE_F32, "geglu_tanh", "output", 0, 0};
	run_layer(&a);
	layer_cfg b = {6, 8, 12, 6, 3, 3, MOE_F32, "gpt_oss", "output", 1, 0};
	run_layer(&b);
	layer_cfg d = {6, 8, 12, 6, 2, 4, MOE_F32, "none", "output", 1, 0};
	run_layer(&d);
	layer_cfg e = {7, 8, 12, 6, 1, 4, MOE_F32, "swiglu", "input", 0, 0};
	run_layer(&e);
}
static void test_layer_bf16(void **st)
{
	(void)st;
	layer_cfg L = {11, 32, 16, 8, 2, 4, MOE_BF16, "swiglu", "output", 0, 0};
	run_layer(&L);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layer_swiglu),
		cmocka_unit_test(test_layer_decode),
		cmocka_unit_test(test_layer_one_expert),
		cmocka_unit_test(test_layer_big_block),
		cmocka_unit_test(test_layer_variants),
		cmocka_unit_test(test_layer_bf16),
		cmocka_unit_test(test_topk_property),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
