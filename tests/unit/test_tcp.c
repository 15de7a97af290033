/* TCP backend: lowering + simulator against the reference interpreter, block
 * skipping, the .tcpb container and its validation, and the cost model's
 * response to the machine description. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "moec/io.h"
#include "moec/passes.h"
#include "moec/runtime.h"
#include "moec/tcp.h"
#include "safetensors_fx.h"

extern const char tcp_default_machine_json[]; /* backend-tcp/isa/machine.c */

typedef struct layer {
	moe_dtype t;
	int64_t T, D, F, E, K, B;
	int one_expert; /* router weights force every token onto expert 0 */
	int ties;       /* router rows 1 and 3 repeat rows 0 and 2: exactly tied scores */
} layer;

static moe_id leaf(moe_graph *g, moe_op op, const char *name, moe_dtype t, int r, int64_t a, int64_t b, int64_t c)
{
	int64_t s[3] = {a, b, c};
	moe_id id = moe_node_new(g, op, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, r);
	moe_node_set_name(g, id, name);
	if (op == MOE_OP_WEIGHT)
		moe_node_set_str(g, id, "source", name);
	return id;
}

/* router einsum -> softmax -> topk -> take_along -> experts(swiglu) */
static moe_module *build(moe_ctx *ctx, const layer *L)
{
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, "layer");
	moe_graph_set_dtype(g, L->t);
	moe_id x = leaf(g, MOE_OP_INPUT, "x", L->t, 2, L->T, L->D, 0);
	moe_id r = leaf(g, MOE_OP_WEIGHT, "router", L->t, 2, L->E, L->D, 0);
	moe_id a2[2] = {x, r};
	moe_id lg = moe_node_new(g, MOE_OP_EINSUM, a2, 2, moe_loc_none());
	moe_node_set_str(g, lg, "eq", "td,ed->te");
	assert_int_equal(moe_node_infer(g, lg), MOE_OK);
	moe_id sm = moe_node_new(g, MOE_OP_SOFTMAX, &lg, 1, moe_loc_none());
	assert_int_equal(moe_node_infer(g, sm), MOE_OK);
	moe_id tk = moe_node_new(g, MOE_OP_TOPK, &sm, 1, moe_loc_none());
	moe_node_set_int(g, tk, "k", L->K);
	assert_int_equal(moe_node_infer(g, tk), MOE_OK);
	moe_id ta[2] = {sm, tk};
	moe_id w = moe_node_new(g, MOE_OP_TAKE_ALONG, ta, 2, moe_loc_none());
	assert_int_equal(moe_node_infer(g, w), MOE_OK);
	moe_id gt = leaf(g, MOE_OP_WEIGHT, "gate", L->t, 3, L->E, L->F, L->D);
	moe_id up = leaf(g, MOE_OP_WEIGHT, "up", L->t, 3, L->E, L->F, L->D);
	moe_id dn = leaf(g, MOE_OP_WEIGHT, "down", L->t, 3, L->E, L->D, L->F);
	moe_id ea[9] = {x, tk, w, gt, up, dn, MOE_NONE, MOE_NONE, MOE_NONE};
	moe_id ex = moe_node_new(g, MOE_OP_EXPERTS, ea, 9, moe_loc_none());
	moe_node_set_str(g, ex, "act", "swiglu");
	moe_node_set_int(g, ex, "block", L->B);
	assert_int_equal(moe_node_infer(g, ex), MOE_OK);
	moe_graph_add_output(g, ex);
	moe_graph_add_output(g, tk);
	return m;
}

static uint64_t rng(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return *s >> 33;
}

static moe_tensor *rand_tensor(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape, double scale, uint64_t *seed)
{
	moe_tensor *x = moe_tensor_new(ctx, t, rank, shape);
	int64_t n = moe_tensor_numel(x);
	for (int64_t i = 0; i < n; i++) {
		float f = (float)(((double)(rng(seed) % 20001) / 10000.0 - 1.0) * scale);
		if (t == MOE_BF16)
			((uint16_t *)x->data)[i] = moe_f32_to_bf16(f);
		else
			((float *)x->data)[i] = f;
	}
	return x;
}

static moe_tensor_map *bindings(moe_ctx *ctx, const layer *L, uint64_t seed)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	int64_t sx[2] = {L->T, L->D}, sr[2] = {L->E, L->D}, sg[3] = {L->E, L->F, L->D}, sd[3] = {L->E, L->D, L->F};
	moe_tensor_map_set(b, "x", rand_tensor(ctx, L->t, 2, sx, 1.0, &seed));
	moe_tensor *r = rand_tensor(ctx, L->t, 2, sr, 1.0, &seed);
	if (L->one_expert) /* expert 0 scores far above the rest for positive x */
		for (int64_t d = 0; d < L->D; d++) {
			if (L->t == MOE_BF16)
				((uint16_t *)r->data)[d] = moe_f32_to_bf16(0.0f);
			else
				((float *)r->data)[d] = 0.0f;
		}
	if (L->ties) {
		size_t row = (size_t)L->D * moe_dtype_size(L->t);
		for (int64_t e = 0; e + 1 < L->E && e < 4; e += 2)
			memcpy((char *)r->data + (size_t)(e + 1) * row, (char *)r->data + (size_t)e * row, row);
	}
	moe_tensor_map_set(b, "router", r);
	moe_tensor_map_set(b, "gate", rand_tensor(ctx, L->t, 3, sg, 0.2, &seed));
	moe_tensor_map_set(b, "up", rand_tensor(ctx, L->t, 3, sg, 0.2, &seed));
	moe_tensor_map_set(b, "down", rand_tensor(ctx, L->t, 3, sd, 0.2, &seed));
	if (L->one_expert) {
		/* x >= 0 and router rows 1.. negative: every token picks expert 0 first */
		moe_tensor *x = moe_tensor_map_get(b, "x");
		for (int64_t i = 0; i < L->T * L->D; i++) {
			if (L->t == MOE_BF16) {
				uint16_t *h = x->data;
				h[i] &= 0x7fff;
			} else {
				float *f = x->data;
				f[i] = fabsf(f[i]);
			}
		}
		for (int64_t i = L->D; i < L->E * L->D; i++) {
			if (L->t == MOE_BF16)
				((uint16_t *)r->data)[i] |= 0x8000;
			else
				((float *)r->data)[i] = -fabsf(((float *)r->data)[i]);
		}
		for (int64_t d = 0; d < L->D; d++) {
			if (L->t == MOE_BF16)
				((uint16_t *)r->data)[d] = moe_f32_to_bf16(1.0f);
			else
				((float *)r->data)[d] = 1.0f;
		}
	}
	return b;
}

static float elem(const moe_tensor *t, int64_t i)
{
	if (t->dtype == MOE_BF16)
		return moe_bf16_to_f32(((const uint16_t *)t->data)[i]);
	if (t->dtype == MOE_I32)
		return (float)((const int32_t *)t->data)[i];
	return ((const float *)t->data)[i];
}

typedef struct run {
	moe_tcp_program *p;
	moe_tensor *out[2];
	moe_tcp_stats st;
} run;

static const char *pipeline = "tcp"; /* the lowering pipeline lowered() runs */

static moe_module *lowered(moe_ctx *ctx, const layer *L, moe_module **orig)
{
	*orig = build(ctx, L);
	moe_module *m = build(ctx, L);
	if (moe_run_pipeline_text(ctx, pipeline, m, NULL) != MOE_OK) {
		moe_diag_print(ctx, stderr);
		fail();
	}
	return m;
}

/* Each string of has (NULL: none) occurs in p's assembly, none of lacks. */
static void asm_check(moe_ctx *ctx, const moe_tcp_program *p, const char *const *has, const char *const *lacks)
{
	char *text = NULL;
	size_t len = 0;
	assert_int_equal(moe_tcp_to_asm(ctx, p, &text, &len), MOE_OK);
	for (int want = 1; want >= 0; want--)
		for (const char *const *k = want ? has : lacks; k && *k; k++) {
			bool found = strstr(text, *k) != NULL;
			if (found != want)
				fprintf(stderr, "assembly %s '%s'\n", want ? "lacks" : "has", *k);
			assert_true(found == want);
		}
	moe_free(ctx, text);
}

/* Compile L for machine mjson (NULL: the default), run it there and compare
 * with the interpreter; each string of has (if not NULL) must occur, and each
 * of lacks must not, in the program's assembly. Returns y's bytes. */
static void *check_against_interp_on(const layer *L, double tol, const char *mjson, const char *const *has,
	const char *const *lacks)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *mach = NULL;
	if (mjson) {
		mach = moe_tcp_machine_parse(ctx, "small.json", mjson, strlen(mjson));
		if (!mach)
			moe_diag_print(ctx, stderr);
		assert_non_null(mach);
	}
	moe_module *orig, *m = lowered(ctx, L, &orig);
	moe_tcp_program *p = moe_tcp_compile(ctx, moe_module_graph(m, 0), mach);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	moe_tensor_map *b = bindings(ctx, L, 42);
	moe_tensor *want[2] = {NULL, NULL}, *got[2] = {NULL, NULL};
	moe_status rc = moe_interp_run(ctx, moe_module_graph(orig, 0), b, want);
	if (rc != MOE_OK)
		moe_diag_print(ctx, stderr);
	assert_int_equal(rc, MOE_OK);
	asm_check(ctx, p, has, lacks);
	moe_tcp_stats st;
	moe_tcp_run_opts ro = {0};
	ro.machine = mach;
	rc = moe_tcp_run(ctx, p, b, &ro, got, &st);
	if (rc != MOE_OK)
		moe_diag_print(ctx, stderr);
	assert_int_equal(rc, MOE_OK);
	/* routing identical */
	assert_int_equal(got[1]->nbytes, want[1]->nbytes);
	assert_memory_equal(got[1]->data, want[1]->data, want[1]->nbytes);
	double ymax = 0, err = 0;
	for (int64_t i = 0; i < moe_tensor_numel(want[0]); i++) {
		double a = elem(want[0], i), g = elem(got[0], i);
		ymax = fmax(ymax, fabs(a));
		err = fmax(err, fabs(a - g));
	}
	if (getenv("TCP_TEST_VERBOSE"))
		printf("max|y| %g max err %g cycles %lld ratio %.2f executed %lld skipped %lld\n", ymax, err,
			(long long)st.cycles, st.roofline_ratio, (long long)st.blocks_executed, (long long)st.blocks_skipped);
	assert_true(ymax > 0);
	assert_true(err <= tol * ymax);
	assert_true(st.simulated_seconds > 0 && st.roofline_seconds > 0);
	assert_true(st.blocks_executed > 0 && st.blocks_executed + st.blocks_skipped == st.blocks_max);
	void *y = malloc(got[0]->nbytes);
	memcpy(y, got[0]->data, got[0]->nbytes);
	for (int i = 0; i < 2; i++) {
		moe_tensor_free(ctx, want[i]);
		moe_tensor_free(ctx, got[i]);
	}
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_module_free(orig);
	if (mach)
		moe_tcp_machine_free(ctx, mach);
	moe_ctx_free(ctx);
	return y;
}

static void check_against_interp(const layer *L, double tol)
{
	free(check_against_interp_on(L, tol, NULL, NULL, NULL));
}

/* The default machine JSON with "key": from replaced by "key": to for each
 * triple (NULL-terminated); caller frees. */
static char *machine_json(const char *const *rep)
{
	char *buf = strdup(tcp_default_machine_json);
	for (; rep[0]; rep += 3) {
		char pat[128];
		snprintf(pat, sizeof pat, "\"%s\": %s", rep[0], rep[1]);
		char *at = strstr(buf, pat);
		assert_non_null(at);
		size_t n = strlen(buf), pre = (size_t)(at - buf);
		char *nb = malloc(n + 64);
		memcpy(nb, buf, pre);
		int k = sprintf(nb + pre, "\"%s\": %s", rep[0], rep[2]);
		strcpy(nb + pre + (size_t)k, at + strlen(pat));
		free(buf);
		buf = nb;
	}
	return buf;
}

/* A tiny machine (2 slices of 64 KB DM, 4 KB TRF) cannot hold two whole
 * experts of [256, 64] per projection (96 KB per slice): the weights come
 * from HBM in tiles through a DM ring ("wring", weights=stream), never
 * whole. With 1 MB of DM whole experts are copied (gate and up paired,
 * [512, 64], down [64, 256]), no ring. y matches the interpreter, and bit
 * for bit the larger machine's (the tiling does not depend on DM). */
static void test_streamed_expert_weights_match_interp(void **st)
{
	(void)st;
	const char *const small[] = {"clusters", "2", "1", "slices_per_cluster", "256", "2", "dm_bytes_per_slice",
		"524288", "65536", "trf_bytes_per_lane", "8192", "512", NULL};
	const char *const big[] = {"clusters", "2", "1", "slices_per_cluster", "256", "2", "dm_bytes_per_slice",
		"524288", "1048576", "trf_bytes_per_lane", "8192", "512", NULL};
	char *ms = machine_json(small), *mb = machine_json(big);
	const char *const ring[] = {"\"wring\"", NULL};
	const char *const whole[] = {"dma.copy dims=[512,64] dst=", "dma.copy dims=[64,256] dst=", NULL};
	const layer Ls[2] = {{MOE_BF16, 5, 64, 256, 4, 2, 8, 0, 0}, {MOE_F32, 7, 64, 256, 4, 2, 8, 0, 0}};
	for (int k = 0; k < 2; k++) {
		double tol = Ls[k].t == MOE_F32 ? 1e-4 : 1e-2;
		void *ys = check_against_interp_on(&Ls[k], tol, ms, ring, whole);
		void *yb = check_against_interp_on(&Ls[k], tol, mb, whole, ring);
		size_t n = (size_t)(Ls[k].T * Ls[k].D) * moe_dtype_size(Ls[k].t);
		assert_memory_equal(ys, yb, n);
		free(ys);
		free(yb);
	}
	free(ms);
	free(mb);
}

/* Blocks of B = 32 rows holding about 24: each block's rows run in one row
 * class, a multiple of row-classes' step (docs/tcp-compiler.md 5.2; here 4,
 * 8, ... 32 rows, the contraction's first dimension), whatever the DM. A DM of 160 KB per
 * slice double-buffers gate and up apart (two [256, 64] slots each,
 * [512, 64]); 1 MB holds the pair packed ([2F, D] twice, [1024, 64]). The
 * sums match the interpreter, and bit for bit across the two machines. */
static void test_streamed_fine_row_tiles_match(void **st)
{
	(void)st;
	const char *const mid[] = {"clusters", "2", "1", "slices_per_cluster", "256", "2", "dm_bytes_per_slice",
		"524288", "163840", "trf_bytes_per_lane", "8192", "512", NULL};
	const char *const big[] = {"clusters", "2", "1", "slices_per_cluster", "256", "2", "dm_bytes_per_slice",
		"524288", "1048576", "trf_bytes_per_lane", "8192", "512", NULL};
	char *mm = machine_json(mid), *mb = machine_json(big);
	const char *const apart[] = {"tu.contract dims=[4,32,64]", "tu.contract dims=[24,32,64]",
		"dm scratch bf16 [512,64]", NULL};
	const char *const paired[] = {"tu.contract dims=[4,32,64]", "tu.contract dims=[24,32,64]",
		"dm scratch bf16 [1024,64]", NULL};
	const char *const none_apart[] = {"tu.contract dims=[6,", "tu.contract dims=[10,", "dm scratch bf16 [1024,64]", NULL};
	const char *const none_paired[] = {"tu.contract dims=[6,", "tu.contract dims=[10,", "dm scratch bf16 [512,64]", NULL};
	const layer L = {MOE_BF16, 48, 64, 256, 4, 2, 32, 0, 0};
	void *ys = check_against_interp_on(&L, 1e-2, mm, apart, none_apart);
	void *yb = check_against_interp_on(&L, 1e-2, mb, paired, none_paired);
	assert_memory_equal(ys, yb, (size_t)(L.T * L.D) * moe_dtype_size(L.t));
	free(ys);
	free(yb);
	free(mm);
	free(mb);
}

/* On a DM of 128 KB per slice gate, up and down are double-buffered apart
 * (each expert's [256, 64] and [64, 256] copied whole into one of two
 * slots), never paired; on 1 MB gate and up are paired, [512, 64] copies
 * into two slots ([1024, 64]). The sums are the same on both. */
static void test_single_buffered_expert_weights_match_interp(void **st)
{
	(void)st;
	const char *const mid[] = {"clusters", "2", "1", "slices_per_cluster", "256", "2", "dm_bytes_per_slice",
		"524288", "131072", "trf_bytes_per_lane", "8192", "512", NULL};
	const char *const big[] = {"clusters", "2", "1", "slices_per_cluster", "256", "2", "dm_bytes_per_slice",
		"524288", "1048576", "trf_bytes_per_lane", "8192", "512", NULL};
	char *mm = machine_json(mid), *mb = machine_json(big);
	const char *const apart[] = {"dma.copy dims=[256,64] dst=", "dma.copy dims=[64,256] dst=",
		"dm scratch bf16 [512,64]", "dm scratch bf16 [128,256]", NULL};
	const char *const paired[] = {"dma.copy dims=[512,64] dst=", "dm scratch bf16 [1024,64]", NULL};
	const layer L = {MOE_BF16, 32, 64, 256, 4, 2, 8, 0, 0}; /* T K = 64 = 2 E B */
	void *y1 = check_against_interp_on(&L, 1e-2, mm, apart, paired);
	void *y2 = check_against_interp_on(&L, 1e-2, mb, paired, NULL);
	assert_memory_equal(y1, y2, (size_t)(L.T * L.D) * moe_dtype_size(L.t));
	free(y1);
	free(y2);
	free(mm);
	free(mb);
}

static void test_experts_bf16_matches_interp(void **st)
{
	(void)st;
	layer L = {MOE_BF16, 5, 48, 96, 8, 2, 16, 0, 0};
	/* dispatch: routing's DM copy of x scattered, each row K = 2 times, into
	 * the block grid's slots in HBM (G B = 8 x 16 = 128), gathered back from
	 * them for the combine; no gather of x's rows per pair (token-scatter) */
	static const char *const has[] = {"dma.scatter dims=[5,2,48] flags=scaled, rows=128 ", "rows=128 dst=", NULL};
	static const char *const lacks[] = {"dma.gather dims=[1,10,48] rows=5 ", NULL};
	free(check_against_interp_on(&L, 1e-2, NULL, has, lacks));
}

static void test_experts_f32_matches_interp(void **st)
{
	(void)st;
	layer L = {MOE_F32, 5, 48, 96, 8, 2, 16, 0, 0};
	check_against_interp(&L, 1e-4);
}

static void test_experts_more_tokens(void **st)
{
	(void)st;
	layer L = {MOE_BF16, 37, 64, 80, 6, 3, 8, 0, 0};
	check_against_interp(&L, 1e-2);
}

/* Regression: the top-k tie break compares two iotas (iota(j) < iota(i));
 * a vector step reads one loop counter, so one of them must be fetched.
 * With both read from the same counter every tied pair got the same rank
 * and the selected index was the sum of the pair (qwen3_moe bf16 T=64:
 * "gather index 29 outside [0, 16)"). */
static void test_tied_scores_route_like_host(void **st)
{
	(void)st;
	layer bf = {MOE_BF16, 64, 48, 48, 16, 4, 64, 0, 1};
	check_against_interp(&bf, 1e-2);
	layer f = {MOE_F32, 37, 32, 48, 6, 3, 8, 0, 1};
	check_against_interp(&f, 1e-4);
}

/* Compile the lowered layer; caller frees. */
static moe_tcp_program *compile_layer(moe_ctx *ctx, const layer *L, moe_module **keep)
{
	moe_module *orig, *m = lowered(ctx, L, &orig);
	moe_module_free(orig);
	moe_tcp_program *p = moe_tcp_compile(ctx, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	*keep = m;
	return p;
}

/* One test's compiled layer and its seeded bindings; tcase_close frees them. */
typedef struct tcase {
	moe_module *m;
	moe_tcp_program *p;
	moe_tensor_map *b;
} tcase;

static tcase tcase_open(moe_ctx *ctx, const layer *L, uint64_t seed)
{
	tcase c;
	c.p = compile_layer(ctx, L, &c.m);
	c.b = bindings(ctx, L, seed);
	return c;
}

static void tcase_close(tcase *c)
{
	moe_tensor_map_free(c->b);
	moe_tcp_program_free(c->p);
	moe_module_free(c->m);
}

static void free_outs(moe_ctx *ctx, moe_tensor **o, int n)
{
	for (int i = 0; i < n; i++)
		moe_tensor_free(ctx, o[i]);
}

/* Every token on expert 0 (K = 1): exactly ceil(T/B) blocks run. */
static void test_one_expert_skips_blocks(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	layer L = {MOE_BF16, 40, 48, 96, 8, 1, 16, 1, 0};
	tcase c = tcase_open(ctx, &L, 7);
	moe_tensor *o1[2] = {0}, *o2[2] = {0};
	moe_tcp_stats s1, s2;
	moe_tcp_run_opts skip = {0}, noskip = {0};
	noskip.no_skip = 1;
	assert_int_equal(moe_tcp_run(ctx, c.p, c.b, &skip, o1, &s1), MOE_OK);
	assert_int_equal(moe_tcp_run(ctx, c.p, c.b, &noskip, o2, &s2), MOE_OK);
	for (int64_t t = 0; t < L.T; t++)
		assert_int_equal(((int32_t *)o1[1]->data)[t], 0);
	int64_t real = (L.T + L.B - 1) / L.B, gmax = moe_grid_blocks_max(L.T, L.K, L.E, L.B);
	assert_int_equal(s1.blocks_executed, real);
	assert_int_equal(s1.blocks_max, gmax);
	assert_int_equal(s1.blocks_skipped, gmax - real);
	assert_int_equal(s2.blocks_executed, gmax);
	assert_int_equal(s1.experts_hit, 1);
	assert_true(s1.simulated_seconds < s2.simulated_seconds);
	/* skipping changes no result */
	assert_memory_equal(o1[0]->data, o2[0]->data, o1[0]->nbytes);
	free_outs(ctx, o1, 2);
	free_outs(ctx, o2, 2);
	tcase_close(&c);
	moe_ctx_free(ctx);
}

static void test_binary_round_trip_and_corruption(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	layer L = {MOE_BF16, 5, 48, 96, 8, 2, 16, 0, 0};
	moe_module *m;
	moe_tcp_program *p = compile_layer(ctx, &L, &m);
	char *a1, *a2, *a3;
	size_t n1, n2, n3, bl, bl2;
	uint8_t *bin, *bin2;
	/* asm -> program -> bin -> program -> asm */
	assert_int_equal(moe_tcp_to_asm(ctx, p, &a1, &n1), MOE_OK);
	moe_tcp_program *pa = moe_tcp_from_asm(ctx, "t.tcps", a1, n1, NULL);
	assert_non_null(pa);
	assert_int_equal(moe_tcp_to_asm(ctx, pa, &a2, &n2), MOE_OK);
	assert_int_equal(n1, n2);
	assert_memory_equal(a1, a2, n1);
	assert_int_equal(moe_tcp_to_binary(ctx, pa, &bin, &bl), MOE_OK);
	moe_tcp_program *pb = moe_tcp_from_binary(ctx, "t.tcpb", bin, bl, NULL);
	assert_non_null(pb);
	assert_int_equal(moe_tcp_to_asm(ctx, pb, &a3, &n3), MOE_OK);
	assert_int_equal(n1, n3);
	assert_memory_equal(a1, a3, n1);
	assert_int_equal(moe_tcp_to_binary(ctx, pb, &bin2, &bl2), MOE_OK);
	assert_int_equal(bl, bl2);
	assert_memory_equal(bin, bin2, bl);
	/* the loaded binary computes what the compiled program computes */
	moe_tensor_map *b = bindings(ctx, &L, 3);
	moe_tensor *o1[2] = {0}, *o2[2] = {0};
	moe_tcp_stats s1, s2;
	assert_int_equal(moe_tcp_run(ctx, p, b, NULL, o1, &s1), MOE_OK);
	assert_int_equal(moe_tcp_run(ctx, pb, b, NULL, o2, &s2), MOE_OK);
	assert_memory_equal(o1[0]->data, o2[0]->data, o1[0]->nbytes);
	assert_int_equal(s1.cycles, s2.cycles);
	/* a file on disk round-trips too */
	char path[] = "/tmp/moec_tcp_testXXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(moe_tcp_write_binary(ctx, p, path), MOE_OK);
	moe_tcp_program *pf = moe_tcp_load_binary(ctx, path, NULL);
	assert_non_null(pf);
	moe_tcp_program_free(pf);
	remove(path);
	/* corrupt inputs are rejected before anything runs */
	moe_diag_clear(ctx);
	uint8_t *bad = malloc(bl);
	size_t step = bl / 97 + 1;
	for (size_t i = 0; i < bl; i += step) {
		memcpy(bad, bin, bl);
		bad[i] ^= 0x40;
		assert_null(moe_tcp_from_binary(ctx, "flip.tcpb", bad, bl, NULL));
	}
	assert_true(moe_error_count(ctx) > 0);
	for (size_t cut = 0; cut < bl; cut += step)
		assert_null(moe_tcp_from_binary(ctx, "cut.tcpb", bin, cut, NULL));
	memcpy(bad, bin, bl);
	bad[8] = 1; /* version 1 (no sources, no prep); the checksum does not cover the header */
	moe_diag_clear(ctx);
	assert_null(moe_tcp_from_binary(ctx, "ver.tcpb", bad, bl, NULL));
	const char *msg;
	moe_diag_get(ctx, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "version"));
	free(bad);
	free(a1);
	free(a2);
	free(a3);
	free(bin);
	free(bin2);
	free_outs(ctx, o1, 2);
	free_outs(ctx, o2, 2);
	moe_tensor_map_free(b);
	moe_tcp_program_free(pa);
	moe_tcp_program_free(pb);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

/* The default machine with one number replaced. */
static moe_tcp_machine *variant(moe_ctx *ctx, const char *key, const char *from, const char *to)
{
	const char *d = tcp_default_machine_json;
	char pat[128];
	snprintf(pat, sizeof pat, "\"%s\": %s", key, from);
	const char *at = strstr(d, pat);
	assert_non_null(at);
	size_t n = strlen(d);
	char *buf = malloc(n + 64);
	size_t pre = (size_t)(at - d);
	memcpy(buf, d, pre);
	int k = sprintf(buf + pre, "\"%s\": %s", key, to);
	strcpy(buf + pre + (size_t)k, at + strlen(pat));
	moe_tcp_machine *m = moe_tcp_machine_parse(ctx, "variant.json", buf, strlen(buf));
	free(buf);
	assert_non_null(m);
	return m;
}

static moe_tcp_stats last_run; /* sim_time's last run */
static double sim_time(moe_ctx *ctx, moe_tcp_program *p, moe_tensor_map *b, const moe_tcp_machine *mach, int timing)
{
	moe_tcp_run_opts o = {0};
	o.machine = mach;
	o.timing_only = timing;
	static int ntrace;
	char tp[256];
	if (getenv("TCP_TEST_TRACE")) {
		snprintf(tp, sizeof tp, "%s.%d.json", getenv("TCP_TEST_TRACE"), ntrace++);
		o.trace_path = tp;
	}
	moe_tcp_stats s;
	moe_status rc = moe_tcp_run(ctx, p, b, &o, NULL, &s);
	if (rc != MOE_OK)
		moe_diag_print(ctx, stderr);
	assert_int_equal(rc, MOE_OK);
	if (getenv("TCP_TEST_VERBOSE")) {
		char *j = moe_tcp_stats_json(ctx, &s);
		printf("%s\n", j);
		moe_free(ctx, j);
	}
	last_run = s;
	return s.simulated_seconds;
}

/* The rank compare of top-k and the combine split into row chunks (forced
 * small here; DeepSeek-V3 at T = 4096 needs it to fit DM): the concat of the
 * chunks lowers to copy passes and the result still matches the interpreter. */
static void test_chunked_rows_match_interp(void **st)
{
	(void)st;
	pipeline = "infer-shapes,canonicalize,lower-topk{chunk=300},blockwise-dispatch{chunk=200},grid-bound,"
		   "canonicalize,cse,dce";
	layer L = {MOE_F32, 23, 16, 24, 6, 2, 4, 0, 0};
	check_against_interp(&L, 1e-5);
	layer Lb = {MOE_BF16, 23, 16, 24, 6, 2, 4, 0, 0};
	check_against_interp(&Lb, 1e-2);
	pipeline = "tcp";
}

/* Timing-only runs need no expert weights: bound without values (absent
 * from the checkpoint) they give the cycles of the full run; a weight that
 * routing reads must be present, and a full run refuses absent weights. */
static void test_timing_only_absent_expert_weights(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	layer L = {MOE_BF16, 37, 64, 80, 6, 3, 8, 0, 0};
	tcase c = tcase_open(ctx, &L, 11);
	moe_tcp_program *p = c.p;
	moe_tensor_map *full = c.b;
	char path[] = "/tmp/moec_absentXXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	const char *router_only[] = {"router", NULL};
	write_checkpoint(path, full, router_only);
	const char *paths[] = {path};
	const moe_graph *g = moe_module_graph(c.m, 0);

	moe_tensor_map *b = moe_tensor_map_new(ctx);
	size_t absent = 0;
	/* without the flag, the missing tensors are errors */
	assert_int_equal(moe_weights_load(ctx, g, paths, 1, b), MOE_ERR_INVALID);
	assert_true(moe_error_count(ctx) > 0);
	moe_diag_clear(ctx);
	assert_int_equal(moe_weights_load_ex(ctx, g, paths, 1, MOE_WEIGHTS_ALLOW_ABSENT, b, &absent), MOE_OK);
	assert_int_equal(absent, 3);
	assert_null(moe_tensor_map_get(b, "gate")->data);
	assert_non_null(moe_tensor_map_get(b, "router")->data);
	moe_tensor *x = moe_tensor_map_get(full, "x");
	moe_tensor *xc = moe_tensor_new(ctx, x->dtype, x->rank, x->shape);
	memcpy(xc->data, x->data, x->nbytes);
	moe_tensor_map_set(b, "x", xc);

	moe_tcp_run_opts o = {0};
	moe_tcp_stats sf, sa;
	o.timing_only = 1;
	assert_int_equal(moe_tcp_run(ctx, p, full, &o, NULL, &sf), MOE_OK);
	assert_int_equal(moe_tcp_run(ctx, p, b, &o, NULL, &sa), MOE_OK);
	assert_int_equal(sf.cycles, sa.cycles);
	assert_int_equal(sf.blocks_executed, sa.blocks_executed);
	assert_true(sa.timing_only);
	/* the routing share: expert work covers part of the time, never more */
	assert_true(sa.expert_seconds > 0 && sa.routing_seconds > 0);
	assert_true(fabs(sa.expert_seconds + sa.routing_seconds - sa.simulated_seconds) < 1e-12);
	assert_true(sa.routing_busy_cycles[MOE_TCP_ENGINE_VECTOR] > 0);
	assert_true(sa.routing_busy_cycles[MOE_TCP_ENGINE_DMA] < sa.busy_cycles[MOE_TCP_ENGINE_DMA]);
	/* a full run refuses a weight without values, before anything runs */
	o.timing_only = 0;
	moe_tensor *out[2] = {0};
	assert_int_equal(moe_tcp_run(ctx, p, b, &o, out, &sa), MOE_ERR_INVALID);
	moe_diag_clear(ctx);
	/* without the router, routing cannot run: a clear fault, not zeros */
	const char *none[] = {NULL};
	write_checkpoint(path, full, none);
	moe_tensor_map *nb = moe_tensor_map_new(ctx);
	assert_int_equal(moe_weights_load_ex(ctx, g, paths, 1, MOE_WEIGHTS_ALLOW_ABSENT, nb, &absent), MOE_OK);
	assert_int_equal(absent, 4);
	xc = moe_tensor_new(ctx, x->dtype, x->rank, x->shape);
	moe_tensor_map_set(nb, "x", xc);
	o.timing_only = 1;
	assert_int_equal(moe_tcp_run(ctx, p, nb, &o, NULL, &sa), MOE_ERR_RUNTIME);
	char *msg = NULL;
	size_t len = 0;
	FILE *mf = open_memstream(&msg, &len);
	moe_diag_print(ctx, mf);
	fclose(mf);
	assert_non_null(strstr(msg, "needs the values of"));
	assert_non_null(strstr(msg, "router"));
	free(msg);
	remove(path);
	moe_tensor_map_free(nb);
	moe_tensor_map_free(b);
	tcase_close(&c);
	moe_ctx_free(ctx);
}

typedef struct prog_seen {
	int64_t routing, blocks, combine, last_block, block_total;
} prog_seen;

static void count_progress(void *ud, const char *phase, int64_t done, int64_t total)
{
	prog_seen *p = ud;
	assert_true(done >= 0 && done <= total);
	if (!strcmp(phase, "routing"))
		p->routing++;
	else if (!strcmp(phase, "combine"))
		p->combine++;
	else {
		assert_string_equal(phase, "blocks");
		assert_true(done == p->last_block + 1); /* every block, in order */
		p->blocks++;
		p->last_block = done;
		p->block_total = total;
	}
}

static void test_timing_only_same_cycles(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	layer L = {MOE_BF16, 37, 64, 80, 6, 3, 8, 0, 0};
	tcase c = tcase_open(ctx, &L, 11);
	assert_true(sim_time(ctx, c.p, c.b, NULL, 0) == sim_time(ctx, c.p, c.b, NULL, 1));
	/* progress: routing commands, then every block, then the combine */
	prog_seen ps = {0};
	moe_tcp_run_opts po = {0};
	po.timing_only = 1;
	po.progress = count_progress;
	po.progress_ud = &ps;
	moe_tcp_stats pst;
	assert_int_equal(moe_tcp_run(ctx, c.p, c.b, &po, NULL, &pst), MOE_OK);
	assert_true(ps.routing > 0 && ps.combine > 0);
	assert_int_equal(ps.blocks, pst.blocks_executed);
	assert_int_equal(ps.block_total, pst.blocks_executed);
	/* the trace is Chrome trace-event JSON with one event per command */
	char path[] = "/tmp/moec_tcp_traceXXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	moe_tcp_run_opts o = {0};
	o.trace_path = path;
	moe_tcp_stats s;
	assert_int_equal(moe_tcp_run(ctx, c.p, c.b, &o, NULL, &s), MOE_OK);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	long n = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
	rewind(f);
	char *txt = malloc((size_t)n + 1);
	assert_int_equal(fread(txt, 1, (size_t)n, f), (size_t)n);
	txt[n] = 0;
	fclose(f), remove(path);
	cJSON *j = cJSON_Parse(txt);
	assert_non_null(j);
	cJSON *ev = cJSON_GetObjectItem(j, "traceEvents");
	int slices = 0; /* one "X" slice per command, besides the tracks' names */
	for (const cJSON *e = cJSON_IsArray(ev) ? ev->child : NULL; e; e = e->next)
		slices += !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph")), "X");
	assert_true(slices > 0 && slices == s.commands);
	cJSON_Delete(j);
	free(txt);
	tcase_close(&c);
	moe_ctx_free(ctx);
}

/* Decode (T = 1) is bound by the weight stream: each expert's weights come
 * from HBM in two DMAs, gate and up paired ([2F, D]) and down ([D, F]), at
 * the HBM pool's 1500 B per cycle. With twice the HBM bandwidth the DMA
 * engines (and the DMNs) become the limit, 8 x 256 = 16 x 128 = 2048 B per
 * cycle, so each byte moved gains at most 1/1500 - 1/2048 cycles. The last
 * block's contractions start when its gate and up weights land and take
 * longer than its down copy on both machines, so that copy runs under them
 * and its gain is not the run's. The run is shorter by at least 90% of the
 * gain over the other bytes of the experts hit (2 here: 2 x 3 D F - D F
 * elements; measured 100%, 7.48 us), and by no more than the gain over every
 * byte the run moves in HBM (the experts', the router's, x, y, the grid). */
static void test_decode_follows_hbm_bandwidth(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	layer L = {MOE_BF16, 1, 1024, 4096, 4, 2, 4, 0, 0};
	tcase c = tcase_open(ctx, &L, 5);
	asm_check(ctx, c.p, (const char *const[]){"dma.copy dims=[8192,1024] dst=", "dma.copy dims=[1024,4096] dst=", NULL},
		NULL);
	moe_tcp_machine *fast = variant(ctx, "hbm_bytes_per_s", "1.5e12", "3.0e12");
	double t0 = sim_time(ctx, c.p, c.b, NULL, 1), t1 = sim_time(ctx, c.p, c.b, fast, 1);
	double per_byte = (1 / 1500.0 - 1 / 2048.0) * 1e-9;
	double all = (double)(last_run.hbm_read_bytes + last_run.hbm_write_bytes) * per_byte;
	double exposed = (2.0 * 3 - 1) * L.D * L.F * 2 * per_byte;
	if (getenv("TCP_TEST_VERBOSE"))
		printf("decode: %g s -> %g s (weight stream gain %g s, without the last down copy %g s)\n", t0, t1, all,
			exposed);
	assert_true(t0 - t1 >= 0.90 * exposed);
	assert_true(t0 - t1 <= all);
	moe_tcp_machine_free(ctx, fast);
	tcase_close(&c);
	moe_ctx_free(ctx);
}

/* A decode streams the experts' weights back to back in the one in-order
 * DMA queue. Under machine model revision 3 every DMA command's setup
 * (dma.setup_cycles, 0.5 us, its issue included) follows the previous
 * command's transfer (dma.setup_overlaps_previous false). The expert part of
 * the run (stats: expert_seconds) is the weight bytes at the HBM rate
 * (33.6 us) plus the setups of the program's 2 K weight copies (gate and up
 * paired, and down: 4 us), plus what follows the last copy: at most one
 * block's main-context work (its gate and up contractions began when their
 * weights landed, one copy earlier; the run's main busy cycles over the
 * blocks, 5.0 us), plus the expert part's three other DMA commands (x's row
 * in, the results out; each a setup and at most 64 KB at 2048 B per cycle,
 * under 0.55 us). Measured 42.4 us against the bound's 44.2 us. */
static void test_decode_stream_back_to_back(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	layer L = {MOE_BF16, 1, 1024, 2048, 8, 4, 8, 0, 0};
	tcase c = tcase_open(ctx, &L, 13);
	asm_check(ctx, c.p, (const char *const[]){"dma.copy dims=[4096,1024] dst=", "dma.copy dims=[1024,2048] dst=", NULL},
		NULL);
	moe_tcp_run_opts o = {0};
	o.timing_only = 1;
	moe_tcp_stats s;
	assert_int_equal(moe_tcp_run(ctx, c.p, c.b, &o, NULL, &s), MOE_OK);
	double stream = (double)L.K * 3 * (double)L.D * (double)L.F * 2 / 1.5e12;
	double hz = (double)s.cycles / s.simulated_seconds;
	double block_main = (double)(s.busy_cycles[MOE_TCP_ENGINE_MAIN] - s.routing_busy_cycles[MOE_TCP_ENGINE_MAIN]) /
			    (double)s.blocks_executed / hz;
	double bound = stream + 2.0 * L.K * 500e-9 + block_main + 3 * 0.55e-6;
	if (getenv("TCP_TEST_VERBOSE"))
		printf("decode stream: experts %g s, weights at the HBM rate %g s, a block's main work %g s, bound %g s, "
		       "%lld blocks\n",
			s.expert_seconds, stream, block_main, bound, (long long)s.blocks_executed);
	assert_int_equal(s.blocks_executed, L.K);
	assert_true(s.expert_seconds >= stream);
	assert_true(s.expert_seconds <= bound);
	tcase_close(&c);
	moe_ctx_free(ctx);
}

/* A large-T f32 layer (three bf16 products per MAC) is bound by the contraction engine, not by the
 * switch that streams its rows (bf16: 0.76x): twice the bf16 MACs per lane cut the time by >= 30%. */
/* The contraction tiling is chosen for the machine compiled for (as `moec run
 * --target=tcp --machine X` does); the prefill follows the MAC rate when the
 * layer is compute-bound (8 experts, 512-row blocks). */
static void test_prefill_follows_mac_rate(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	layer L = {MOE_F32, 4096, 1024, 2048, 8, 2, 512, 0, 0};
	moe_module *m, *m1;
	moe_tcp_program *p = compile_layer(ctx, &L, &m);
	moe_tcp_machine *fast = variant(ctx, "bf16", "32", "64");
	moe_module *orig1;
	m1 = lowered(ctx, &L, &orig1);
	moe_module_free(orig1);
	moe_tcp_program *p1 = moe_tcp_compile(ctx, moe_module_graph(m1, 0), fast);
	assert_non_null(p1);
	moe_tensor_map *b = bindings(ctx, &L, 9);
	double t0 = sim_time(ctx, p, b, NULL, 1), t1 = sim_time(ctx, p1, b, fast, 1), t1same = sim_time(ctx, p, b, fast, 1);
	if (getenv("TCP_TEST_VERBOSE"))
		printf("prefill: %g s -> %g s (recompiled), %g s (same binary)\n", t0, t1, t1same);
	assert_true(t1 <= 0.7 * t0);
	assert_true(t1same <= t0);
	moe_tcp_machine_free(ctx, fast);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_tcp_program_free(p1);
	moe_module_free(m);
	moe_module_free(m1);
	moe_ctx_free(ctx);
}

static void test_machine_file_errors(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *d = moe_tcp_machine_default(ctx);
	assert_non_null(d);
	moe_tcp_machine_free(ctx, d);
	assert_null(moe_tcp_machine_parse(ctx, "x.json", "{\"clock_hz\": 1e9}", 17));
	assert_null(moe_tcp_machine_parse(ctx, "x.json", "not json", 8));
	moe_tcp_machine *neg = NULL;
	const char *dj = tcp_default_machine_json;
	char *buf = strdup(dj);
	char *at = strstr(buf, "\"engines\": 8");
	assert_non_null(at);
	at[11] = '0';
	neg = moe_tcp_machine_parse(ctx, "zero.json", buf, strlen(buf));
	assert_null(neg);
	free(buf);
	/* the shipped copy equals the project's contract file */
	FILE *f = fopen(MOEC_SOURCE_DIR "/backend-tcp/isa/machine.json", "rb");
	assert_non_null(f);
	char txt[8192];
	size_t n = fread(txt, 1, sizeof txt, f);
	fclose(f);
	assert_int_equal(n, strlen(dj));
	assert_memory_equal(txt, dj, n);
	moe_ctx_free(ctx);
}

/* block=auto against the simulator: the B the cost model picks for a
 * decode and a prefill layer runs within 3% of the fastest of B in
 * {32, 64, 128, 256}, at unit scale. */
static void test_block_auto_near_best(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	const layer Ls[] = {{MOE_BF16, 1, 1024, 2048, 8, 2, 64, 0, 0}, {MOE_BF16, 1024, 512, 1024, 8, 2, 64, 0, 0}};
	for (size_t k = 0; k < sizeof Ls / sizeof *Ls; k++) {
		moe_module *orig = build(ctx, &Ls[k]);
		double pred = 0;
		int64_t ab = moe_tcp_auto_block(ctx, moe_module_graph(orig, 0), NULL, &pred);
		moe_module_free(orig);
		assert_true(ab > 0 && pred > 0);
		const int64_t cand[5] = {32, 64, 128, 256, ab};
		double best = 0, tauto = 0;
		for (int i = 0; i < 5; i++) {
			layer L = Ls[k];
			L.B = cand[i];
			tcase c = tcase_open(ctx, &L, 11);
			double t = sim_time(ctx, c.p, c.b, NULL, 1);
			if (i < 4)
				best = i == 0 || t < best ? t : best;
			else
				tauto = t;
			tcase_close(&c);
		}
		if (getenv("TCP_TEST_VERBOSE"))
			printf("block=auto: T=%lld B=%lld %g s, best of 32..256 %g s\n", (long long)Ls[k].T, (long long)ab, tauto,
				best);
		assert_true(tauto <= 1.03 * best);
	}
	moe_ctx_free(ctx);
}

/* Cycles of one command on the default machine, from a hand-written program. */
static int64_t one_command_cycles(const char *body)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char prog[2048];
	snprintf(prog, sizeof prog,
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %%0 hbm scratch bf16 [1048576] addr=0 slice=0 const=0 \"h\"\n"
		"tensor %%1 dm scratch bf16 [524288] addr=0 slice=2048 const=0 \"d\"\n"
		"tensor %%2 dm scratch bf16 [524288] addr=2048 slice=2048 const=0 \"d2\"\n"
		"tensor %%3 trf scratch bf16 [2097152] addr=0 slice=8192 const=0 \"t\"\n"
		"@0: %s\n@1: halt\n", body);
	moe_tcp_program *p = moe_tcp_from_asm(ctx, "cost.tcps", prog, strlen(prog), NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	moe_tcp_stats s;
	assert_int_equal(moe_tcp_run(ctx, p, NULL, NULL, NULL, &s), MOE_OK);
	moe_tcp_program_free(p);
	moe_ctx_free(ctx);
	return s.cycles;
}

/* The cost rules of docs/tcp-model.md section 4 on machine.json's numbers,
 * worked by hand. The kernel launches in 2000 cycles and ends in 600; the
 * command is issued one scalar op later, at 2001; a DMA adds setup_cycles =
 * 500 (its issue included), a Tensor Unit command command_issue_cycles = 240.
 * HBM is one pool of 1500 B per cycle for reads and writes. d and d2 (2048 B
 * per slice, 1 MiB) span all 512 slices, 16 DMNs, 8 DMN pairs (engines). */
static void test_cost_rules_by_hand(void **st)
{
	(void)st;
	/* 1 MiB HBM -> DM, aligned: engines 1048576 / (8 x 256) = 512, DMNs
	 * 1048576 / (16 x 128) = 512, requests 4096 / 8 = 512; the pool needs
	 * 1048576 / 1500 = 699.05 -> 700: 2001 + 500 + 700 + 600 */
	assert_int_equal(one_command_cycles("dma.copy dims=[524288] dst=%1+0:[1] s0=%0+0:[1]"), 3801);
	/* a DM -> HBM write of the same size is charged to the same pool */
	assert_int_equal(one_command_cycles("dma.copy dims=[524288] dst=%0+0:[1] s0=%1+0:[1]"), 3801);
	/* 1024 rows of 256 B at a 512 B stride: every request has address bit 8
	 * clear (the stack bit never toggles): 262144 / 1500 x
	 * hbm_no_stack_bit_factor 2 = 349.5 -> 350 */
	assert_int_equal(one_command_cycles("dma.copy dims=[1024,128] dst=%1+0:[128,1] s0=%0+0:[256,1]"), 3451);
	/* the same rows at a 768 B stride toggle bit 8: 262144 / 1500 = 174.76 ->
	 * 175 (the engines and requests: 128) */
	assert_int_equal(one_command_cycles("dma.copy dims=[1024,128] dst=%1+0:[128,1] s0=%0+0:[384,1]"), 3276);
	/* the 512 B-stride rows from byte 128: each crosses a 256 B boundary (two
	 * requests, bit 8 toggles), 524288 B charged / 1500 = 349.53 -> 350 */
	assert_int_equal(one_command_cycles("dma.copy dims=[1024,128] dst=%1+0:[128,1] s0=%0+64:[256,1]"), 3451);
	/* 8 rows of 64 B written to HBM at a 512 B stride: each a partial 256 B
	 * block, a read-modify-write at hbm_unaligned_write_factor = 50, and bit
	 * 8 never toggles: 8 x 256 x 50 / 1500 x 2 = 136.53 -> 137 (the DM side,
	 * 512 B in 16 slices of one DMN: 4) */
	assert_int_equal(one_command_cycles("dma.copy dims=[8,32] dst=%0+0:[256,1] s0=%1+0:[32,1]"), 3238);
	/* DM -> DM within the clusters serializes its reads and writes: the DMNs'
	 * 512 doubled */
	assert_int_equal(one_command_cycles("dma.copy dims=[524288] dst=%2+0:[1] s0=%1+0:[1]"), 4125);
	/* 1 KiB HBM -> DM: 32 flits in the first 32 slices of d (one DMN, one
	 * engine): the DMN bound 1024 / 128 = 8 over the engine's 4 and the
	 * pool's 0.7 */
	assert_int_equal(one_command_cycles("dma.copy dims=[512] dst=%1+0:[1] s0=%0+0:[1]"), 3109);
	/* a TRF load of 8192 B per slice from 4096 B of d (128 slices, 32 B
	 * each): the switch brings 8192 / 32 = 256 cycles' flits, the ring of
	 * ceil(8192 / 32) = 256 copies (switch.max_ring_size) adds 256; + fill/drain
	 * 32 + issue 240 */
	assert_int_equal(one_command_cycles("sub.ldtrf dims=[512,2048] flags=xslice, dst=%3+0:[2048,1] s0=%1+0:[0,1]"), 3385);
	/* all of d (2048 B in each slice) into t's 8192 B per slice: a slice
	 * reads its own 2048 B at sub_context_read_bytes 8 (256) while the switch
	 * brings the other copies' 8192 / 32 (256), + a ring of 4, + 32 + 240 */
	assert_int_equal(one_command_cycles("sub.ldtrf dims=[524288] flags=xslice, dst=%3+0:[1] s0=%1+0:[1]"), 3133);
}

/* A gather index out of range and a DM overflow are run-time faults. */
static void test_runtime_faults(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	const char *prog =
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %0 dm scratch i32 [4] addr=0 slice=32 const=0 \"idx\"\n"
		"tensor %1 hbm scratch f32 [4,8] addr=0 slice=0 const=0 \"src\"\n"
		"tensor %2 dm scratch f32 [4,8] addr=64 slice=32 const=0 \"dst\"\n"
		"@0: tu.vec dims=[4] dst=%0+0:[1] chain=[x.add(ctr,imm,#0x00000002,c0,0)]\n"
		"@1: dma.gather dims=[1,4,8] rows=4 dst=%2+0:[32,8,1] s0=%1+0:[32,8,1] s1=%0+0:[0,1]\n"
		"@2: halt\n";
	moe_tcp_program *p = moe_tcp_from_asm(ctx, "fault.tcps", prog, strlen(prog), NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	assert_int_equal(moe_tcp_run(ctx, p, NULL, NULL, NULL, NULL), MOE_ERR_RUNTIME);
	const char *msg;
	moe_diag_get(ctx, moe_diag_count(ctx) - 1, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "index 4"));
	moe_tcp_program_free(p);
	/* a register offset past the end of a DM tensor (such a view takes the switch) */
	const char *prog2 =
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %0 dm scratch f32 [4,8] addr=0 slice=32 const=0 \"a\"\n"
		"@0: li rd=r1 imm=3\n"
		"@1: tu.vec dims=[8] flags=switch, dst=%0+0+r1*8:[1] chain=[l.or(imm,imm,#0x00000000,c0,0)]\n"
		"@2: li rd=r1 imm=4\n"
		"@3: br.lt ra=r1 rb=r2 target=@5\n" /* never taken: the loop's exit (a loop without one is rejected) */
		"@4: jmp target=@1\n"
		"@5: halt\n";
	p = moe_tcp_from_asm(ctx, "dm.tcps", prog2, strlen(prog2), NULL);
	assert_non_null(p);
	moe_diag_clear(ctx);
	assert_int_equal(moe_tcp_run(ctx, p, NULL, NULL, NULL, NULL), MOE_ERR_RUNTIME);
	moe_diag_get(ctx, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "DM overflow"));
	moe_tcp_program_free(p);
	/* statically wrong programs never run: a stage-order violation, a float
	 * ALU used twice (exp takes FpExp then FpFpu, a third has none), a bad
	 * target, a tensor past DM */
	const char *bad[] = {
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %0 dm scratch f32 [8] addr=0 slice=32 const=0 \"a\"\n"
		"@0: tu.vec dims=[8] dst=%0+0:[1] s0=%0+0:[1] chain=[f.exp(s0,_,#0x00000000,c0,0),x.add(v,s0,#0x00000000,c0,0)]\n"
		"@1: halt\n",
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %0 dm scratch f32 [8] addr=0 slice=32 const=0 \"a\"\n"
		"@0: tu.vec dims=[8] dst=%0+0:[1] s0=%0+0:[1] chain=[f.exp(s0,_,#0x00000000,c0,0),f.exp(v,_,#0x00000000,c0,0),"
		"f.exp(v,_,#0x00000000,c0,0)]\n"
		"@1: halt\n",

		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"@0: jmp target=@7\n",
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %0 dm scratch f32 [4] addr=524280 slice=32 const=0 \"a\"\n"
		"@0: halt\n",
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		assert_null(moe_tcp_from_asm(ctx, "bad.tcps", bad[i], strlen(bad[i]), NULL));
	/* a run-time scalar reaches the control path only through SPM */
	const char *prog3 =
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %0 dm scratch i32 [8] addr=0 slice=32 const=0 \"a\"\n"
		"@0: ld rd=r1 s0=%0+0:[]\n"
		"@1: halt\n";
	p = moe_tcp_from_asm(ctx, "spm.tcps", prog3, strlen(prog3), NULL);
	assert_non_null(p);
	moe_diag_clear(ctx);
	assert_int_equal(moe_tcp_run(ctx, p, NULL, NULL, NULL, NULL), MOE_ERR_RUNTIME);
	moe_diag_get(ctx, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "not staged into SPM"));
	moe_tcp_program_free(p);
	moe_ctx_free(ctx);
}

static moe_id node2(moe_graph *g, moe_op op, moe_id a, moe_id b)
{
	moe_id args[2] = {a, b};
	moe_id id = moe_node_new(g, op, args, b == MOE_NONE ? 1 : 2, moe_loc_none());
	if (op == MOE_OP_CAST)
		moe_node_set_str(g, id, "to", "i32");
	if (op == MOE_OP_REDUCE_SUM)
		moe_node_set_int(g, id, "axis", 1);
	assert_int_equal(moe_node_infer(g, id), MOE_OK);
	return id;
}

/* Elementwise chains share one tu.vec pass where the stage order allows:
 * sum(exp(a - b)) (f.sub, f.exp, r.fsum), min(i - j, 3) (x.sub, c.min) and
 * (i < j) & k (t.lt, l.and: tag then logic) are one pass each; (i < j) < k
 * (tag after tag) stays two. Results equal the interpreter's exactly. */
static void test_elementwise_chains_one_pass(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, "chains");
	moe_graph_set_dtype(g, MOE_F32);
	moe_id a = leaf(g, MOE_OP_INPUT, "a", MOE_F32, 2, 4, 8, 0), b = leaf(g, MOE_OP_INPUT, "b", MOE_F32, 2, 4, 8, 0);
	moe_id i = leaf(g, MOE_OP_INPUT, "i", MOE_I32, 2, 4, 8, 0), j = leaf(g, MOE_OP_INPUT, "j", MOE_I32, 2, 4, 8, 0);
	moe_id k = leaf(g, MOE_OP_INPUT, "k", MOE_I32, 2, 4, 8, 0);
	moe_id three = leaf(g, MOE_OP_CONST, "three", MOE_I32, 0, 0, 0, 0);
	moe_node_set_int(g, three, "value", 3);
	moe_id sm = node2(g, MOE_OP_REDUCE_SUM, node2(g, MOE_OP_EXP, node2(g, MOE_OP_SUB, a, b), MOE_NONE), MOE_NONE);
	moe_id mn = node2(g, MOE_OP_MIN, node2(g, MOE_OP_SUB, i, j), three);
	moe_id an = node2(g, MOE_OP_AND, node2(g, MOE_OP_LT, i, j), node2(g, MOE_OP_NE, k, three));
	moe_id lt2 = node2(g, MOE_OP_LT, node2(g, MOE_OP_CAST, node2(g, MOE_OP_LT, j, i), MOE_NONE), k);
	moe_id outs[4] = {sm, mn, an, lt2};
	for (int q = 0; q < 4; q++)
		moe_graph_add_output(g, outs[q]);
	moe_tcp_program *p = moe_tcp_compile(ctx, g, NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	char *text = NULL;
	size_t len = 0;
	assert_int_equal(moe_tcp_to_asm(ctx, p, &text, &len), MOE_OK);
	int passes = 0;
	for (const char *q = text; (q = strstr(q, "tu.vec")) != NULL; q++)
		passes++;
	/* sm 1, mn 1, an: ne (tag) then lt + and in one pass = 2, lt2: the
	 * cast of a bool to i32 needs no step, but its lt (tag) cannot follow
	 * the first lt's tag = 2 */
	if (passes != 6)
		fprintf(stderr, "%s", text);
	assert_int_equal(passes, 6);
	moe_free(ctx, text);
	moe_tensor_map *bind = moe_tensor_map_new(ctx);
	uint64_t seed = 7;
	int64_t sh[2] = {4, 8};
	moe_tensor_map_set(bind, "a", rand_tensor(ctx, MOE_F32, 2, sh, 2.0, &seed));
	moe_tensor_map_set(bind, "b", rand_tensor(ctx, MOE_F32, 2, sh, 2.0, &seed));
	const char *in[3] = {"i", "j", "k"};
	for (int q = 0; q < 3; q++) {
		moe_tensor *t = moe_tensor_new(ctx, MOE_I32, 2, sh);
		for (int64_t e = 0; e < 32; e++)
			((int32_t *)t->data)[e] = (int32_t)(rng(&seed) % 9) - 4;
		moe_tensor_map_set(bind, in[q], t);
	}
	moe_tensor *want[4] = {NULL}, *got[4] = {NULL};
	assert_int_equal(moe_interp_run(ctx, g, bind, want), MOE_OK);
	moe_tcp_run_opts ro = {0};
	moe_tcp_stats tst;
	moe_status rc = moe_tcp_run(ctx, p, bind, &ro, got, &tst);
	if (rc != MOE_OK)
		moe_diag_print(ctx, stderr);
	assert_int_equal(rc, MOE_OK);
	for (int q = 0; q < 4; q++) {
		assert_int_equal(got[q]->nbytes, want[q]->nbytes);
		assert_memory_equal(got[q]->data, want[q]->data, want[q]->nbytes);
		moe_tensor_free(ctx, want[q]);
		moe_tensor_free(ctx, got[q]);
	}
	moe_tensor_map_free(bind);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_experts_bf16_matches_interp),
		cmocka_unit_test(test_experts_f32_matches_interp),
		cmocka_unit_test(test_experts_more_tokens),
		cmocka_unit_test(test_tied_scores_route_like_host),
		cmocka_unit_test(test_streamed_expert_weights_match_interp),
		cmocka_unit_test(test_streamed_fine_row_tiles_match),
		cmocka_unit_test(test_one_expert_skips_blocks),
		cmocka_unit_test(test_binary_round_trip_and_corruption),
		cmocka_unit_test(test_timing_only_same_cycles),
		cmocka_unit_test(test_single_buffered_expert_weights_match_interp),
		cmocka_unit_test(test_chunked_rows_match_interp),
		cmocka_unit_test(test_timing_only_absent_expert_weights),
		cmocka_unit_test(test_decode_follows_hbm_bandwidth),
		cmocka_unit_test(test_prefill_follows_mac_rate),
		cmocka_unit_test(test_decode_stream_back_to_back),
		cmocka_unit_test(test_machine_file_errors),
		cmocka_unit_test(test_cost_rules_by_hand),
		cmocka_unit_test(test_block_auto_near_best),
		cmocka_unit_test(test_runtime_faults),
		cmocka_unit_test(test_elementwise_chains_one_pass),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
