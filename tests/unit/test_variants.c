/* Unit tests that pin each MoE variant's formula (moe/SEMANTICS.md sections
 * 1-2) on small cases whose expected numbers were worked out by hand from the
 * formulas (a calculator for exp/sigmoid; the arithmetic is in the comments),
 * never taken from moec. Each case is a .moe text with tiny dims - the text
 * `moec import-hf` writes for a small config, the example file with its dims
 * overridden, or a few lines written here - run through the frontend, the
 * `host` pipeline, and then the reference interpreter, the LLVM host engine
 * and (in f32) the C host engine; all must give the hand-computed values.
 *
 * Notation: silu(1) = 1 * sigmoid(1) = 0.7310585786; sigmoid(ln 3) = 3/4,
 * sigmoid(-ln 3) = 1/4, sigmoid(0) = 1/2 (ln 3 rounded to f32 moves a sigmoid
 * by < 1e-8, far inside the tolerances). Cases also run with
 * `--set dtype=bf16`: indices must be the same and values within 2e-2 of the
 * largest expected magnitude (bf16 keeps 8 significant bits). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/backend.h"
#include "moec/frontend.h"
#include "moec/io.h"
#include "moec/passes.h"

#define LN2 0.69314718f
#define LN3 1.0986123f
#define LN4 1.3862944f
#define LN6 1.7917595f
#define SILU1 0.7310585786

/* One input or weight: `names` lists aliases separated by '|' (the import-hf
 * name and the example's name); exactly one must be a node of the layer. */
typedef struct tin {
	const char *names;
	int rank;
	int64_t shape[4];
	const float *v;
} tin;

/* Expected values of output `out` (row-major, n elements). Index outputs
 * (i32) must match exactly; float outputs within atol + rtol * |want|. */
typedef struct texp {
	const char *what;
	uint32_t out;
	int64_t n;
	const double *v;
	double rtol, atol;
} texp;

typedef struct tcase {
	const char *label;
	char *text;              /* .moe text (owned) */
	const char *sets[12];    /* "NAME=VALUE" overrides, NULL-terminated */
	const tin *in;
	size_t nin;
	const texp *ex;
	size_t nex;
} tcase;

static double elem(const moe_tensor *t, int64_t i)
{
	switch (t->dtype) {
	case MOE_F32: return ((const float *)t->data)[i];
	case MOE_BF16: return moe_bf16_to_f32(((const uint16_t *)t->data)[i]);
	case MOE_I32: return ((const int32_t *)t->data)[i];
	default: fail_msg("unexpected output dtype"); return 0;
	}
}

static moe_id find_node(const moe_graph *g, const char *names, const char **which)
{
	moe_id found = MOE_NONE;
	const char *p = names;
	while (*p) {
		size_t n = strcspn(p, "|");
		for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++) {
			moe_op op = moe_node_op(g, i);
			const char *nm = moe_node_name(g, i);
			if ((op == MOE_OP_INPUT || op == MOE_OP_WEIGHT) && nm && strlen(nm) == n && !strncmp(nm, p, n)) {
				if (found != MOE_NONE)
					fail_msg("'%s' names two nodes", names);
				found = i;
				*which = nm;
			}
		}
		p += n + (p[n] == '|');
	}
	if (found == MOE_NONE)
		fail_msg("no input or weight of the layer is named '%s'", names);
	return found;
}

/* A tensor of the node's dtype (the layer's compute type or as declared) holding v. */
static moe_tensor *make(moe_ctx *c, const moe_graph *g, moe_id n, const tin *in)
{
	int rank = moe_node_rank(g, n);
	const int64_t *sh = moe_node_shape(g, n);
	if (rank != in->rank)
		fail_msg("'%s': rank %d, the layer declares %d", in->names, in->rank, rank);
	for (int d = 0; d < rank; d++)
		if (sh[d] != in->shape[d])
			fail_msg("'%s': dim %d is %lld, the layer declares %lld", in->names, d, (long long)in->shape[d],
				(long long)sh[d]);
	moe_tensor *t = moe_tensor_new(c, moe_node_dtype(g, n), rank, sh);
	assert_non_null(t);
	for (int64_t i = 0; i < moe_tensor_numel(t); i++) {
		switch (t->dtype) {
		case MOE_F32: ((float *)t->data)[i] = in->v[i]; break;
		case MOE_BF16: ((uint16_t *)t->data)[i] = moe_f32_to_bf16(in->v[i]); break;
		case MOE_I32: ((int32_t *)t->data)[i] = (int32_t)in->v[i]; break;
		default: fail_msg("'%s': unexpected dtype", in->names);
		}
	}
	return t;
}

static void compare(const tcase *k, const char *engine, bool bf16, moe_tensor *const *out)
{
	for (size_t j = 0; j < k->nex; j++) {
		const texp *e = &k->ex[j];
		const moe_tensor *t = out[e->out];
		if (moe_tensor_numel(t) != e->n)
			fail_msg("%s (%s): %s has %lld elements, expected %lld", k->label, engine, e->what,
				(long long)moe_tensor_numel(t), (long long)e->n);
		double scale = 0;
		for (int64_t i = 0; i < e->n; i++)
			if (isfinite(e->v[i]))
				scale = fmax(scale, fabs(e->v[i]));
		for (int64_t i = 0; i < e->n; i++) {
			double got = elem(t, i), want = e->v[i];
			bool ok;
			if (t->dtype == MOE_I32 || isinf(want))
				ok = got == want;
			else if (bf16)
				ok = fabs(got - want) <= 2e-2 * scale;
			else
				ok = fabs(got - want) <= e->atol + e->rtol * fabs(want);
			if (!ok)
				fail_msg("%s (%s%s): %s[%lld] = %.9g, expected %.9g", k->label, engine, bf16 ? ", bf16" : "",
					e->what, (long long)i, got, want);
		}
	}
}

/* Parse with the case's settings (plus dtype=bf16 when asked), lower with the
 * host pipeline, bind, and check the interpreter and the host engines. */
static void run_case(const tcase *k, bool bf16)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_setting sets[13];
	char names[13][32];
	size_t ns = 0;
	for (; k->sets[ns]; ns++) {
		assert_true(ns < 12);
		assert_true(moe_setting_split(k->sets[ns], names[ns], sizeof names[ns], &sets[ns].value));
		sets[ns].name = names[ns];
	}
	if (bf16)
		sets[ns++] = (moe_setting){"dtype", "bf16"};
	else
		sets[ns++] = (moe_setting){"dtype", "f32"};
	moe_settings ss = {sets, ns};
	moe_module *m = moe_parse_moe(c, k->label, k->text, strlen(k->text), &ss);
	if (!m) {
		moe_diag_print(c, stderr);
		fail_msg("%s: does not parse", k->label);
	}
	moe_run_opts ro = {.verify = 1};
	if (moe_run_pipeline_text(c, "host", m, &ro) != MOE_OK) {
		moe_diag_print(c, stderr);
		fail_msg("%s: the host pipeline failed", k->label);
	}
	moe_graph *g = moe_module_graph(m, 0);
	moe_tensor_map *bind = moe_tensor_map_new(c);
	for (size_t i = 0; i < k->nin; i++) {
		const char *nm = NULL;
		moe_id n = find_node(g, k->in[i].names, &nm);
		moe_tensor_map_set(bind, nm, make(c, g, n, &k->in[i]));
	}
	for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++) {
		moe_op op = moe_node_op(g, i);
		if ((op == MOE_OP_INPUT || op == MOE_OP_WEIGHT) && !moe_tensor_map_get(bind, moe_node_name(g, i)))
			fail_msg("%s: '%s' is not bound by the case", k->label, moe_node_name(g, i));
	}
	uint32_t no = moe_graph_num_outputs(g);
	assert_true(no <= 8);
	static const char *const engines[] = {"interp", "llvm", "c"};
	for (int en = 0; en < (bf16 ? 2 : 3); en++) { /* the C engine is slow to build: f32 only */
		moe_tensor *out[8] = {0};
		moe_status s = en == 0 ? moe_interp_run(c, g, bind, out) :
					 moe_host_run(c, g, bind, en == 1 ? MOE_HOST_LLVM : MOE_HOST_C, 1, out, NULL);
		if (s != MOE_OK) {
			moe_diag_print(c, stderr);
			fail_msg("%s: %s failed", k->label, engines[en]);
		}
		compare(k, engines[en], bf16, out);
		for (uint32_t j = 0; j < no; j++)
			moe_tensor_free(c, out[j]);
	}
	moe_tensor_map_free(bind);
	moe_module_free(m);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

/* text with ", EXTRA" appended to its (last) output statement */
static char *with_outputs(const char *text, const char *extra)
{
	const char *o = NULL;
	for (const char *p = strstr(text, "\n  output "); p; p = strstr(p + 1, "\n  output "))
		o = p;
	assert_non_null(o);
	const char *eol = strchr(o + 1, '\n');
	assert_non_null(eol);
	size_t a = (size_t)(eol - text), len = strlen(text) + strlen(extra) + 3;
	char *s = malloc(len);
	assert_non_null(s);
	snprintf(s, len, "%.*s, %s%s", (int)a, text, extra, eol);
	return s;
}

/* The .moe import-hf writes for config `json` (T tokens, block 4), with idx
 * and w added to the outputs. */
static char *imported(const char *json, int T)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_import_opts o = {.layer = 0, .tokens = T, .block = 4, .dtype = MOE_F32, .prefix = NULL};
	char *t = NULL;
	if (moe_import_hf_text(c, "config.json", json, strlen(json), &o, &t) != MOE_OK) {
		moe_diag_print(c, stderr);
		fail_msg("import-hf failed");
	}
	char *s = with_outputs(t, "idx, w");
	moe_free(c, t);
	moe_ctx_free(c);
	return s;
}

static char *example(const char *file)
{
	char path[512];
	snprintf(path, sizeof path, MOEC_SOURCE_DIR "/examples/%s", file);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static char buf[16384];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	return with_outputs(buf, "idx, w");
}

static void run_both(tcase *k, bool also_bf16)
{
	run_case(k, false);
	if (also_bf16)
		run_case(k, true);
	free(k->text);
	k->text = NULL;
}

#define N(a) (sizeof(a) / sizeof *(a))

/* ---- DeepSeek-V3: group-limited selection with every biased score negative ----
 * E = 12 experts in n_group = 4 groups of 3, topk_group = 2, K = 4, D = F = 1,
 * x = 1, so the router logit of expert e is router[e]. Logits 0 except
 * e5 = -ln 3, e6 = ln 3: s = sigmoid(l) = 1/2 except s5 = 1/4, s6 = 3/4.
 * Biases b = c - s give the selection scores c (all negative):
 *   group 0: c0 = 0.5-0.6 = -0.1, c1 = 0.5-3.5 = -3.0, c2 = -3.0
 *   group 1: c3 = 0.5-1.5 = -1.0, c4 = -1.0, c5 = 0.25-1.45 = -1.2
 *   group 2: c6 = 0.75-1.55 = -0.8, c7 = 0.5-2.0 = -1.5, c8 = 0.5-4.5 = -4.0
 *   group 3: c9 = c10 = c11 = 0.5-1.7 = -1.2
 * Group score = sum of its top-2 c: g0 = -0.1-3.0 = -3.1, g1 = -1.0-1.0 = -2.0,
 * g2 = -0.8-1.5 = -2.3, g3 = -1.2-1.2 = -2.4 -> kept groups 1 and 2. (By the
 * best single score g0 and g2 would be kept; by the sum of all three, g1 and g3.)
 * Top-4 of c over experts 3..8, the rest at -inf: c6 = -0.8, then c3 = c4 = -1.0
 * (tie: lower index first), then c5 = -1.2 -> idx = [6, 3, 4, 5]. e0 (c = -0.1,
 * the best overall) lies in a dropped group; a mask of 0 instead of -inf would
 * pick the dropped experts 0, 1, 2, 9.
 * Weights from s: [3/4, 1/2, 1/2, 1/4], sum 2 -> w = s / (2 + 1e-20) * 2.5 =
 * [0.9375, 0.625, 0.625, 0.3125].
 * Experts: gate = up = 1, down_e = e + 1 -> FFN_e(1) = silu(1) * (e + 1);
 * routed = silu(1) * (0.9375*7 + 0.625*4 + 0.625*5 + 0.3125*6) = silu(1) * 14.0625
 *        = 10.280511262; shared expert gate 1, up 2, down 1: 2 silu(1) = 1.462117157;
 * y = 11.742628419. */
static const float ds_router[12] = {0, 0, 0, 0, 0, -LN3, LN3, 0, 0, 0, 0, 0};
static const float ds_bias[12] = {-0.6f, -3.5f, -3.5f, -1.5f, -1.5f, -1.45f, -1.55f, -2.0f, -4.5f, -1.7f, -1.7f, -1.7f};
static const float ones12[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
static const float ds_down[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static const float one[1] = {1}, two[1] = {2};
static const tin ds_in[] = {
	{"x", 2, {1, 1}, one},
	{"router", 2, {12, 1}, ds_router},
	{"score_bias|bias_corr", 1, {12}, ds_bias},
	{"gate", 3, {12, 1, 1}, ones12},
	{"up", 3, {12, 1, 1}, ones12},
	{"down", 3, {12, 1, 1}, ds_down},
	{"shared_gate|sh_gate", 2, {1, 1}, one},
	{"shared_up|sh_up", 2, {1, 1}, two},
	{"shared_down|sh_down", 2, {1, 1}, one},
};
static const double ds_y[] = {11.742628419}, ds_idx[] = {6, 3, 4, 5}, ds_w[] = {0.9375, 0.625, 0.625, 0.3125};
static const texp ds_ex[] = {
	{"y", 0, 1, ds_y, 1e-6, 1e-6},
	{"idx", 1, 4, ds_idx, 0, 0},
	{"w", 2, 4, ds_w, 1e-6, 1e-7},
};

static void test_deepseek_group_mask(void **st)
{
	(void)st;
	tcase k = {"deepseek import-hf", imported("{\"model_type\":\"deepseek_v3\",\"first_k_dense_replace\":0,\"hidden_size\":1,\"n_routed_experts\":12,"
						  "\"n_group\":4,\"topk_group\":2,\"num_experts_per_tok\":4,"
						  "\"moe_intermediate_size\":1,\"n_shared_experts\":1,\"norm_topk_prob\":true,"
						  "\"routed_scaling_factor\":2.5}", 1),
		{NULL}, ds_in, N(ds_in), ds_ex, N(ds_ex)};
	run_both(&k, true);
	tcase e = {"examples/deepseek_v3.moe", example("deepseek_v3.moe"),
		{"T=1", "D=1", "F=1", "E=12", "K=4", "B=4", "n_group=4", "topk_group=2", NULL}, ds_in, N(ds_in), ds_ex,
		N(ds_ex)};
	run_both(&e, true);
}

/* ---- -inf masks when K exceeds the unmasked entries ----
 * topk ranks -inf below every number; equal scores go to the lower index, so
 * once the unmasked entries are used up the lowest-index masked ones follow.
 * Token 0: c = [5, -2, 7, -1], keep = [0, 1, 0, 1] -> masked [-inf, -2, -inf, -1]
 *   -> idx [3, 1, 0], values [-1, -2, -inf].
 * Token 1: c = [-3, -3, -0.5, -9], keep = [1, 1, 0, 1] -> [-3, -3, -inf, -9]
 *   -> idx [0, 1, 3] (tie 0/1 by index; the masked -0.5 ranks below -9),
 *   values [-3, -3, -9]. In bf16 this goes through the packed 16-bit topk. */
static const char mask_moe[] = "layer mask {\n"
			       "  dim T = 2, E = 4, K = 3\n"
			       "  input c    : [T, E]\n"
			       "  input keep : i32[T, E]\n"
			       "  masked = select(keep != 0, c, -inf)\n"
			       "  idx    = topk(masked, K)\n"
			       "  output idx, take_along(masked, idx, axis=1)\n"
			       "}\n";
static const float mask_c[8] = {5, -2, 7, -1, -3, -3, -0.5f, -9};
static const float mask_keep[8] = {0, 1, 0, 1, 1, 1, 0, 1};
static const tin mask_in[] = {{"c", 2, {2, 4}, mask_c}, {"keep", 2, {2, 4}, mask_keep}};
static const double mask_idx[] = {3, 1, 0, 0, 1, 3}, mask_val[] = {-1, -2, -INFINITY, -3, -3, -9};
static const texp mask_ex[] = {{"idx", 0, 6, mask_idx, 0, 0}, {"values", 1, 6, mask_val, 0, 0}};

static void test_topk_among_neg_inf(void **st)
{
	(void)st;
	tcase k = {"-inf mask", strdup(mask_moe), {NULL}, mask_in, N(mask_in), mask_ex, N(mask_ex)};
	run_both(&k, true);
}

/* ---- gpt-oss: router bias, interleaved gate/up, clamp limits, alpha ----
 * E = 3, K = 2, D = F = 2, x = [1, 1]. Router rows [1, 1], [0.5, 0.5], [0, 0]
 * give logits [2, 1, 0]; with the bias [-3, 0, 0] they are [-1, 1, 0], so the
 * bias moves the selection from [0, 1] to idx = [1, 2]. w = softmax([1, 0]) =
 * [e/(e+1), 1/(e+1)] = [0.7310585786, 0.2689414214].
 * gate_up[e] is [D, 2F]; gu = x gate_up[e] + bias, gate = gu[0::2], up = gu[1::2]:
 *   e1: [6+3+1, -4-4-1, .5+.5+0, 1+.5+.5] = [10, -9, 1, 2] -> gate [10, 1], up [-9, 2]
 *   e2: [-1-1, 4+4, 4+4, -.25-.25] = [-2, 8, 8, -0.5] -> gate [-2, 8], up [8, -0.5]
 * (read as concatenated halves, e1 would get gate [10, -9], up [1, 2].)
 * h = (clamp(u, -L, L) + 1) * min(g, L) * sigmoid(alpha min(g, L)), L = 7, alpha 1.702:
 *   e1: (-7+1) * 7 * sigmoid(11.914) = -42 * 0.99999331 = -41.99971877   (both limits hit)
 *       (2+1) * 1 * sigmoid(1.702) = 3 * 0.84579577 = 2.53738730
 *   e2: (7+1) * -2 * sigmoid(-3.404) = -16 * 0.03217069 = -0.51473101   (up above L)
 *       (-0.5+1) * 7 * sigmoid(11.914) = 3.5 * 0.99999331 = 3.49997656   (gate above L)
 * down: e1 identity + bias [0.5, -0.5] -> [-41.49971877, 2.03738730];
 *       e2 swaps the two (down_t [[0, 1], [1, 0]]), no bias -> [3.49997656, -0.51473101].
 * y = 0.7310585786 * e1 + 0.2689414214 * e2
 *   = [-30.33872625 + 0.94128950, 1.48942780 - 0.13843103] = [-29.39743675, 1.35101697].
 * Expert 0 (not selected) would add large values. */
static const float go_x[2] = {1, 1};
static const float go_router[6] = {1, 1, 0.5f, 0.5f, 0, 0};
static const float go_rbias[3] = {-3, 0, 0};
static const float go_gu[24] = {5, 5, 5, 5, 5, 5, 5, 5, /* e0 */
	6, -4, 0.5f, 1, 3, -4, 0.5f, 0.5f,                   /* e1 */
	-1, 4, 4, -0.25f, -1, 4, 4, -0.25f};                 /* e2 */
static const float go_gub[12] = {0, 0, 0, 0, 1, -1, 0, 0.5f, 0, 0, 0, 0};
static const float go_down[12] = {1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0};
static const float go_db[6] = {0, 0, 0.5f, -0.5f, 0, 0};
static const tin go_in[] = {
	{"x", 2, {1, 2}, go_x},
	{"router|router_w", 2, {3, 2}, go_router},
	{"router_bias|router_b", 1, {3}, go_rbias},
	{"gate_up", 3, {3, 2, 4}, go_gu},
	{"gate_up_bias|gate_up_b", 2, {3, 4}, go_gub},
	{"down_t", 3, {3, 2, 2}, go_down},
	{"down_bias|down_b", 2, {3, 2}, go_db},
};
static const double go_y[] = {-29.39743675, 1.35101697}, go_idx[] = {1, 2}, go_w[] = {0.7310585786, 0.2689414214};
static const texp go_ex[] = {
	{"y", 0, 2, go_y, 1e-6, 1e-6},
	{"idx", 1, 2, go_idx, 0, 0},
	{"w", 2, 2, go_w, 1e-6, 1e-7},
};
/* The example with limit 5 and alpha 1:
 *   e1: (-5+1) * 5 * sigmoid(5) = -20 * 0.99330715 = -19.86614298; 3 * 1 * sigmoid(1) = 2.19317574
 *   e2: (5+1) * -2 * sigmoid(-2) = -12 * 0.11920292 = -1.43043506; 0.5 * 5 * sigmoid(5) = 2.48326787
 *   y = 0.7310585786 * [-19.36614298, 1.69317574] + 0.2689414214 * [2.48326787, -1.43043506]
 *     = [-14.15778585 + 0.66785448, 1.23780066 - 0.38470323] = [-13.48993137, 0.85310743]. */
static const double go5_y[] = {-13.48993137, 0.85310743};
static const texp go5_ex[] = {{"y", 0, 2, go5_y, 1e-6, 1e-6}, {"idx", 1, 2, go_idx, 0, 0}, {"w", 2, 2, go_w, 1e-6, 1e-7}};

static void test_gpt_oss(void **st)
{
	(void)st;
	tcase k = {"gpt_oss import-hf", imported("{\"model_type\":\"gpt_oss\",\"hidden_size\":2,\"num_local_experts\":3,"
						 "\"num_experts_per_tok\":2,\"intermediate_size\":2,\"swiglu_limit\":7.0}", 1),
		{NULL}, go_in, N(go_in), go_ex, N(go_ex)};
	run_both(&k, true);
	tcase e = {"examples/gpt_oss_20b.moe", example("gpt_oss_20b.moe"), {"T=1", "D=2", "F=2", "E=3", "K=2", "B=4", NULL},
		go_in, N(go_in), go_ex, N(go_ex)};
	run_both(&e, true);
	tcase e5 = {"examples/gpt_oss_20b.moe limit 5 alpha 1", example("gpt_oss_20b.moe"),
		{"T=1", "D=2", "F=2", "E=3", "K=2", "B=4", "limit=5.0", "alpha=1.0", NULL}, go_in, N(go_in), go5_ex,
		N(go5_ex)};
	run_both(&e5, false);
}

/* ---- Llama 4: concatenated gate_up, weight on the expert input, shared expert ----
 * E = 2, K = 1, D = F = 2, x = [[1, 0], [0, 1]]. Router [[2, -1], [-1, 0]]:
 * token 0 logits [2, -1] -> expert 0, w = sigmoid(2) = a = 0.8807970780;
 * token 1 logits [-1, 0] -> expert 1, w = sigmoid(0) = 0.5.
 * gate_up[e] is [D, 2F]: gate = its first F columns, up = the last F.
 * Token 0: x' = a x = [a, 0]; row 0 of gate_up[0] = [1, 2 | 3, -1]:
 *   gate = [a, 2a], up = [3a, -a]; h = [silu(a) * 3a, silu(2a) * (-a)]
 *   silu(a) = a sigmoid(a) = 0.8807970780 * 0.7069873680 = 0.6227124079
 *   silu(2a) = 1.7615941560 * 0.8534092045 = 1.5033606674
 *   h = [0.6227124079 * 2.6423912339, -1.5033606674 * 0.8807970780] = [1.6454498, -1.3241557];
 *   down_t[0] = identity -> FFN = h.
 * Token 1: x' = [0, 0.5]; row 1 of gate_up[1] = [2, 0 | -1, 4]: gate = [1, 0],
 *   up = [-0.5, 2]; h = [silu(1) * -0.5, silu(0) * 2 = 0]; down_t[1] = [[0, 2], [1, 0]]
 *   -> FFN = h0 [0, 2] = [0, -silu(1)].
 * Shared expert (gate I, up 2I, down I): 2 silu(x) x per element ->
 *   token 0 [2 silu(1), 0] = [1.4621171573, 0]; token 1 [0, 1.4621171573].
 * y = [[1.6454498 + 1.4621172, -1.3241557], [0, -0.7310586 + 1.4621172]]
 *   = [[3.1075670, -1.3241557], [0, 0.7310586]].
 * (Weight on the output instead: token 0 would be a * [3 silu(1), -silu(2)] + shared.) */
static const float l4_x[4] = {1, 0, 0, 1};
static const float l4_router[4] = {2, -1, -1, 0};
static const float l4_gu[16] = {1, 2, 3, -1, 5, 5, 5, 5, /* e0 */
	7, 7, 7, 7, 2, 0, -1, 4};                           /* e1 */
static const float l4_down[8] = {1, 0, 0, 1, 0, 2, 1, 0};
static const float eye2[4] = {1, 0, 0, 1}, eye2x2[4] = {2, 0, 0, 2};
static const tin l4_in[] = {
	{"x", 2, {2, 2}, l4_x},
	{"router", 2, {2, 2}, l4_router},
	{"gate_up", 3, {2, 2, 4}, l4_gu},
	{"down_t", 3, {2, 2, 2}, l4_down},
	{"shared_gate|sh_gate", 2, {2, 2}, eye2},
	{"shared_up|sh_up", 2, {2, 2}, eye2x2},
	{"shared_down|sh_down", 2, {2, 2}, eye2},
};
static const double l4_y[] = {3.1075669652, -1.3241556830, 0, SILU1}, l4_idx[] = {0, 1},
		    l4_w[] = {0.8807970780, 0.5};
static const texp l4_ex[] = {
	{"y", 0, 4, l4_y, 1e-6, 1e-6},
	{"idx", 1, 2, l4_idx, 0, 0},
	{"w", 2, 2, l4_w, 1e-6, 1e-7},
};

static void test_llama4(void **st)
{
	(void)st;
	tcase k = {"llama4 import-hf", imported("{\"model_type\":\"llama4_text\",\"hidden_size\":2,\"num_local_experts\":2,"
						"\"num_experts_per_tok\":1,\"intermediate_size\":2}", 2),
		{NULL}, l4_in, N(l4_in), l4_ex, N(l4_ex)};
	run_both(&k, true);
	tcase e = {"examples/llama4_scout.moe", example("llama4_scout.moe"), {"T=2", "D=2", "F=2", "E=2", "K=1", "B=4", NULL},
		l4_in, N(l4_in), l4_ex, N(l4_ex)};
	run_both(&e, true);
}

/* ---- DeepSeek renormalisation epsilon and routed scaling factor ----
 * E = 3, K = 2, one group, D = 2, F = 1, x = [[1, 0], [0, 1]], no correction
 * (bias 0), routed_scaling_factor 2.5. Router columns: token 0 logits
 * [-60, -61, -70], token 1 logits [ln 3, 0, -ln 3]; both select idx [0, 1].
 * Token 0: s0 = sigmoid(-60) = e^-60 / (1 + e^-60) = 8.7565108e-27,
 *          s1 = sigmoid(-61) = 3.2213403e-27, sum = 1.1977851e-26;
 *   renormalised: the epsilon dominates: denominator = 1.1977851e-26 + 1e-20
 *   (1e-20 in f32 is 9.9999997e-21) = 1.0000012e-20, so
 *   w = [8.7565108e-27, 3.2213403e-27] / 1.0000012e-20 * 2.5 = [2.1891251e-6, 8.0533413e-7]
 *   (without the epsilon it would be [1.8277, 0.6723]);
 *   not renormalised: w = s * 2.5 = [2.1891277e-26, 8.0533507e-27].
 * Token 1: s = [3/4, 1/2]: renormalised w = [0.75, 0.5] / 1.25 * 2.5 = [1.5, 1.0];
 *   not renormalised w = [1.875, 1.25].
 * Experts: gate = up = [1, 1], down_e = [e + 1, 1] -> FFN_e(x) = silu(1) [e + 1, 1]
 * for either token, y = silu(1) * sum_k w_k [e_k + 1, 1]:
 *   renormalised: token 0 silu(1) [2.1891251e-6 + 2 * 8.0533413e-7, 2.9944592e-6]
 *                 = [2.7778716e-6, 2.1891251e-6]; token 1 silu(1) [1.5 + 2, 2.5]
 *                 = [2.5587050, 1.8276464];
 *   not renormalised: token 0 [2.7778748e-26, 2.1891277e-26];
 *                 token 1 silu(1) [1.875 + 2.5, 3.125] = [3.1983813, 2.2845581]. */
static const float eps_x[4] = {1, 0, 0, 1};
static const float eps_router[6] = {-60, LN3, -61, 0, -70, -LN3};
static const float zeros3[3] = {0, 0, 0}, ones6[6] = {1, 1, 1, 1, 1, 1};
static const float eps_down[6] = {1, 1, 2, 1, 3, 1};
static const tin eps_in[] = {
	{"x", 2, {2, 2}, eps_x},
	{"router", 2, {3, 2}, eps_router},
	{"score_bias", 1, {3}, zeros3},
	{"gate", 3, {3, 1, 2}, ones6},
	{"up", 3, {3, 1, 2}, ones6},
	{"down", 3, {3, 2, 1}, eps_down},
};
static const double eps_idx[] = {0, 1, 0, 1};
static const double eps_w[] = {2.1891251e-6, 8.0533413e-7, 1.5, 1.0};
static const double eps_y[] = {2.7778716e-6, 2.1891251e-6, 2.5587050, 1.8276464};
static const double sc_w[] = {2.1891277e-26, 8.0533507e-27, 1.875, 1.25};
static const double sc_y[] = {2.7778748e-26, 2.1891277e-26, 3.1983813, 2.2845581};
static const texp eps_ex[] = {
	{"y", 0, 4, eps_y, 1e-6, 0},
	{"idx", 1, 4, eps_idx, 0, 0},
	{"w", 2, 4, eps_w, 1e-6, 0},
};
static const texp sc_ex[] = {
	{"y", 0, 4, sc_y, 1e-6, 0},
	{"idx", 1, 4, eps_idx, 0, 0},
	{"w", 2, 4, sc_w, 1e-6, 0},
};

static void test_epsilon_and_scale(void **st)
{
	(void)st;
	tcase k = {"deepseek epsilon", imported("{\"model_type\":\"deepseek_v3\",\"first_k_dense_replace\":0,\"n_shared_experts\":0,\"hidden_size\":2,\"n_routed_experts\":3,"
						"\"n_group\":1,\"topk_group\":1,\"num_experts_per_tok\":2,"
						"\"moe_intermediate_size\":1,\"norm_topk_prob\":true,"
						"\"routed_scaling_factor\":2.5}", 2),
		{NULL}, eps_in, N(eps_in), eps_ex, N(eps_ex)};
	run_both(&k, false);
	tcase s = {"deepseek scale", imported("{\"model_type\":\"deepseek_v3\",\"first_k_dense_replace\":0,\"n_shared_experts\":0,\"hidden_size\":2,\"n_routed_experts\":3,"
					      "\"n_group\":1,\"topk_group\":1,\"num_experts_per_tok\":2,"
					      "\"moe_intermediate_size\":1,\"norm_topk_prob\":false,"
					      "\"routed_scaling_factor\":2.5}", 2),
		{NULL}, eps_in, N(eps_in), sc_ex, N(sc_ex)};
	run_both(&s, false);
}

/* ---- Qwen2-MoE: no renormalisation, shared expert behind a sigmoid gate ----
 * E = 3, K = 2, D = F = S = 1, x = 1. Router logits [ln 4, ln 2, 0] ->
 * softmax p = [4, 2, 1] / 7, idx [0, 1], w = p_sel = [4/7, 2/7] (no renorm).
 * Experts: gate 1, up_e = e + 1, down 1 -> FFN_e = silu(1) (e + 1);
 * routed = silu(1) (4/7 + 2 * 2/7) = silu(1) * 8/7 = 0.8354955184.
 * Shared: gate 1, up 3, down 1 -> 3 silu(1) = 2.1931757359; its gate
 * sigmoid(ln 3 * 1) = 3/4 -> 1.6448818019. y = 2.4803773204. */
static const float qw_router[3] = {LN4, LN2, 0};
static const float ones3[3] = {1, 1, 1}, qw_up[3] = {1, 2, 3};
static const float three[1] = {3}, ln3v[1] = {LN3};
static const tin qw_in[] = {
	{"x", 2, {1, 1}, one},
	{"router", 2, {3, 1}, qw_router},
	{"gate", 3, {3, 1, 1}, ones3},
	{"up", 3, {3, 1, 1}, qw_up},
	{"down", 3, {3, 1, 1}, ones3},
	{"shared_gate", 2, {1, 1}, one},
	{"shared_up", 2, {1, 1}, three},
	{"shared_down", 2, {1, 1}, one},
	{"shared_expert_gate", 2, {1, 1}, ln3v},
};
static const double qw_y[] = {2.4803773204}, qw_idx[] = {0, 1}, qw_w[] = {4.0 / 7, 2.0 / 7};
static const texp qw_ex[] = {
	{"y", 0, 1, qw_y, 1e-6, 1e-6},
	{"idx", 1, 2, qw_idx, 0, 0},
	{"w", 2, 2, qw_w, 1e-6, 1e-7},
};

static void test_qwen2_shared_gate(void **st)
{
	(void)st;
	tcase k = {"qwen2_moe import-hf", imported("{\"model_type\":\"qwen2_moe\",\"hidden_size\":1,\"num_experts\":3,"
						   "\"num_experts_per_tok\":2,\"moe_intermediate_size\":1,"
						   "\"shared_expert_intermediate_size\":1,\"norm_topk_prob\":false}", 1),
		{NULL}, qw_in, N(qw_in), qw_ex, N(qw_ex)};
	run_both(&k, true);
}

/* ---- softmax -> top-K -> renormalise equals top-K -> softmax over the K ----
 * Token 0: l = [0, ln 3, ln 2, ln 6] -> p = [1, 3, 2, 6] / 12; top-2 = [3, 1];
 *   p_sel = [1/2, 1/4]; renormalised [2/3, 1/3]; softmax([ln 6, ln 3]) = [6, 3] / 9.
 * Token 1: l all 1/2 -> ties: top-2 = [0, 1]; p_sel = [1/4, 1/4]; both give [1/2, 1/2].
 * Token 2: l = [100, 101, 99, 0] -> top-2 = [1, 0]; softmax([101, 100]) =
 *   [1, e^-1] / (1 + e^-1) = [0.7310585786, 0.2689414214]; p_sel = [1, e^-1] /
 *   (1 + e^-1 + e^-2 + e^-101) = [1, 0.3678794412] / 1.5032147244 =
 *   [0.6652409558, 0.2447284711] (so without renormalisation they differ). */
static const char order_moe[] = "layer order {\n"
				"  dim T = 3, E = 4, K = 2\n"
				"  input l : [T, E]\n"
				"  lf = cast(l, f32)\n"
				"  p  = softmax(lf, axis=1)\n"
				"  i1 = topk(p, K)                                  # softmax, then top-K\n"
				"  t1 = take_along(p, i1, axis=1)\n"
				"  w1 = t1 / reduce_sum(t1, axis=1, keepdims=1)     # renormalised\n"
				"  i2 = topk(l, K)                                  # top-K on the logits\n"
				"  w2 = softmax(take_along(lf, i2, axis=1), axis=1) # softmax over the K\n"
				"  output i1, w1, i2, w2, t1\n"
				"}\n";
static const float order_l[12] = {0, LN3, LN2, LN6, 0.5f, 0.5f, 0.5f, 0.5f, 100, 101, 99, 0};
static const tin order_in[] = {{"l", 2, {3, 4}, order_l}};
static const double order_idx[] = {3, 1, 0, 1, 1, 0};
static const double order_w[] = {2.0 / 3, 1.0 / 3, 0.5, 0.5, 0.7310585786, 0.2689414214};
static const double order_p[] = {0.5, 0.25, 0.25, 0.25, 0.6652409558, 0.2447284711};
static const texp order_ex[] = {
	{"softmax-then-topk idx", 0, 6, order_idx, 0, 0},
	{"renormalised weights", 1, 6, order_w, 1e-6, 1e-7},
	{"topk-then-softmax idx", 2, 6, order_idx, 0, 0},
	{"softmax over the K", 3, 6, order_w, 1e-6, 1e-7},
	{"unrenormalised weights", 4, 6, order_p, 1e-6, 1e-7},
};

static void test_softmax_topk_order(void **st)
{
	(void)st;
	tcase k = {"softmax/topk order", strdup(order_moe), {NULL}, order_in, N(order_in), order_ex, N(order_ex)};
	run_both(&k, true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deepseek_group_mask),
		cmocka_unit_test(test_topk_among_neg_inf),
		cmocka_unit_test(test_gpt_oss),
		cmocka_unit_test(test_llama4),
		cmocka_unit_test(test_epsilon_and_scale),
		cmocka_unit_test(test_qwen2_shared_gate),
		cmocka_unit_test(test_softmax_topk_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
