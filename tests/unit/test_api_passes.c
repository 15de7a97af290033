/* Direct tests of public functions of moec/passes.h against their
 * documented contracts (passes.h, docs/api.md): the pass registry and its
 * option rows, the options a pass receives, the expert-parallel phase cut,
 * and the stats JSON. Expected values are worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/frontend.h"
#include "moec/passes.h"
#include "graph_fx.h"

/* ---- the registry ---- */

/* The built-in passes, in registry order (README.md's pass list). */
static const char *const builtins[] = {"infer-shapes", "canonicalize", "cse", "dce", "lower-topk",
	"blockwise-dispatch", "flatten-blocks", "grid-bound", "expert-parallel", "lower-exchange", "tcp-split-weights"};
#define NBUILTINS (sizeof builtins / sizeof *builtins)

static moe_status noop_pass(moe_ctx *ctx, moe_graph *g, const moe_pass_opts *opts, void *ud)
{
	(void)ctx, (void)g, (void)opts, (void)ud;
	return MOE_OK;
}

static void test_pass_count_get(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	assert_int_equal(moe_pass_count(c), NBUILTINS);
	for (size_t i = 0; i < NBUILTINS; i++) {
		const moe_pass_info *p = moe_pass_get(c, i);
		assert_non_null(p);
		assert_string_equal(p->name, builtins[i]);
		assert_non_null(p->summary);
		assert_non_null(p->run);
		assert_ptr_equal(moe_pass_find(c, builtins[i]), p);
	}
	assert_null(moe_pass_get(c, NBUILTINS));
	assert_null(moe_pass_get(c, SIZE_MAX));

	/* registered passes follow the built-ins, in registration order, copied */
	int tag1, tag2;
	moe_pass_info a = {"my-first", "first", NULL, noop_pass, &tag1};
	moe_pass_info b = {"my-second", "second", "tag=x", noop_pass, &tag2};
	assert_int_equal(moe_pass_register(c, &a), MOE_OK);
	assert_int_equal(moe_pass_register(c, &b), MOE_OK);
	a.name = "changed"; /* the registry holds its own copy */
	assert_int_equal(moe_pass_count(c), NBUILTINS + 2);
	const moe_pass_info *p = moe_pass_get(c, NBUILTINS);
	assert_string_equal(p->name, "my-first");
	assert_ptr_equal(p->ud, &tag1);
	p = moe_pass_get(c, NBUILTINS + 1);
	assert_string_equal(p->name, "my-second");
	assert_string_equal(p->options, "tag=x");
	assert_ptr_equal(p->ud, &tag2);
	assert_null(moe_pass_get(c, NBUILTINS + 2));
	/* a name taken is refused and the count stays */
	moe_pass_info dup = {"dce", "again", NULL, noop_pass, NULL};
	assert_int_not_equal(moe_pass_register(c, &dup), MOE_OK);
	assert_int_equal(moe_pass_count(c), NBUILTINS + 2);
	moe_diag_clear(c);

	/* another context has only the built-ins */
	moe_ctx *c2 = moe_ctx_new(NULL, NULL);
	assert_int_equal(moe_pass_count(c2), NBUILTINS);
	assert_null(moe_pass_find(c2, "my-first"));
	moe_ctx_free(c2);
	moe_ctx_free(c);
}

/* The option rows of the built-ins that take options (docs/cli.md's pass
 * options): each key parses in a pipeline, a key not among them does not. */
static void test_pass_options(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	static const struct {
		const char *pass;
		const char *keys[9];
	} want[] = {
		{"lower-topk", {"mode", "chunk", "select"}},
		{"blockwise-dispatch", {"grid", "chunk", "combine", "counts", "decode", "rank", "tail", "balance"}},
		{"expert-parallel", {"ep", "rank", "tokens", "placement", "loop"}},
	};
	for (size_t w = 0; w < sizeof want / sizeof *want; w++) {
		const moe_pass_option *o = moe_pass_options(moe_pass_find(c, want[w].pass));
		assert_non_null(o);
		size_t k = 0;
		for (; o[k].key; k++) {
			assert_non_null(want[w].keys[k]);
			assert_string_equal(o[k].key, want[w].keys[k]);
			assert_non_null(o[k].help);
			/* an enum lists its values, the others do not */
			assert_true((o[k].kind == MOE_PASS_OPT_ENUM) == (o[k].values != NULL));
			char text[128];
			snprintf(text, sizeof text, "%s{%s=1}", want[w].pass, o[k].key);
			moe_pipeline *p = moe_pipeline_parse(c, text);
			if (!p)
				moe_diag_print(c, stderr);
			assert_non_null(p);
			moe_pipeline_free(p);
		}
		assert_null(want[w].keys[k]);
		char text[128];
		snprintf(text, sizeof text, "%s{nosuchkey=1}", want[w].pass);
		assert_null(moe_pipeline_parse(c, text));
		assert_true(moe_error_count(c) > 0);
		moe_diag_clear(c);
	}
	/* the kinds and values of a few rows */
	const moe_pass_option *o = moe_pass_options(moe_pass_find(c, "lower-topk"));
	assert_int_equal(o[0].kind, MOE_PASS_OPT_ENUM);
	assert_string_equal(o[0].values, "packed16|exact");
	assert_int_equal(o[1].kind, MOE_PASS_OPT_COUNT);
	assert_string_equal(o[1].def, "33554432");
	assert_int_equal(o[2].kind, MOE_PASS_OPT_ENUM);
	assert_string_equal(o[2].values, "rank|iter|auto");
	assert_string_equal(o[2].def, "auto");
	o = moe_pass_options(moe_pass_find(c, "blockwise-dispatch"));
	assert_string_equal(o[0].values, "tight|seed|vllm");
	assert_string_equal(o[0].def, "tight");
	o = moe_pass_options(moe_pass_find(c, "expert-parallel"));
	assert_int_equal(o[1].kind, MOE_PASS_OPT_TEXT);

	/* passes without rows, an external pass, a copy of a built-in's row, NULL */
	static const char *const plain[] = {"infer-shapes", "canonicalize", "cse", "dce", "flatten-blocks",
		"grid-bound", "lower-exchange", "tcp-split-weights"};
	for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
		assert_null(moe_pass_options(moe_pass_find(c, plain[i])));
		char text[64];
		snprintf(text, sizeof text, "%s{mode=1}", plain[i]);
		assert_null(moe_pipeline_parse(c, text));
		moe_diag_clear(c);
	}
	moe_pass_info ext = {"ext-pass", "external", "mode=a|b", noop_pass, NULL};
	assert_int_equal(moe_pass_register(c, &ext), MOE_OK);
	assert_null(moe_pass_options(moe_pass_find(c, "ext-pass")));
	moe_pass_info copy = *moe_pass_find(c, "lower-topk");
	assert_null(moe_pass_options(&copy));
	assert_null(moe_pass_options(NULL));
	moe_ctx_free(c);
}

/* ---- the options a pass receives ---- */

typedef struct seen {
	int calls;
	const char *tag, *other, *missing;
} seen;

static moe_status opt_pass(moe_ctx *ctx, moe_graph *g, const moe_pass_opts *opts, void *ud)
{
	(void)ctx, (void)g;
	seen *s = ud;
	s->calls++;
	s->tag = moe_pass_opt(opts, "tag");
	s->other = moe_pass_opt(opts, "other");
	s->missing = moe_pass_opt(opts, "missing");
	return MOE_OK;
}

static void test_pass_opt(void **st)
{
	(void)st;
	/* by hand: the first value of a key, NULL when absent */
	moe_pass_opts o = {3, {"mode", "chunk", "mode"}, {"exact", "64", "packed16"}};
	assert_string_equal(moe_pass_opt(&o, "mode"), "exact");
	assert_string_equal(moe_pass_opt(&o, "chunk"), "64");
	assert_null(moe_pass_opt(&o, "chun"));
	assert_null(moe_pass_opt(&o, "Mode"));
	assert_null(moe_pass_opt(&o, ""));
	o.count = 1; /* only the first count entries are options */
	assert_null(moe_pass_opt(&o, "chunk"));
	o.count = 0;
	assert_null(moe_pass_opt(&o, "mode"));
	assert_null(moe_pass_opt(NULL, "mode"));

	/* through a pipeline: what a pass's step names reaches it */
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	seen s = {0};
	moe_pass_info info = {"opt-probe", "reads its options", "tag=text other=text", opt_pass, &s};
	assert_int_equal(moe_pass_register(c, &info), MOE_OK);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "l");
	moe_id x = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, x, MOE_F32, (int64_t[]){2}, 1);
	moe_node_set_name(g, x, "x");
	moe_graph_add_output(g, x);
	assert_int_equal(moe_run_pipeline_text(c, "opt-probe{tag=hello}", m, NULL), MOE_OK);
	assert_int_equal(s.calls, 1);
	assert_string_equal(s.tag, "hello");
	assert_null(s.other);
	assert_null(s.missing);
	assert_int_equal(moe_run_pipeline_text(c, "opt-probe{other=2,tag=b}", m, NULL), MOE_OK);
	assert_int_equal(s.calls, 2);
	assert_string_equal(s.tag, "b");
	assert_string_equal(s.other, "2");
	assert_int_equal(moe_run_pipeline_text(c, "opt-probe", m, NULL), MOE_OK);
	assert_null(s.tag);
	assert_null(s.other);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* ---- the expert-parallel phase cut ---- */

static moe_id node(moe_graph *g, moe_op op, const moe_id *args, uint32_t n)
{
	moe_id id = moe_node_new(g, op, args, n, moe_loc_none());
	assert_int_equal(moe_node_infer(g, id), MOE_OK);
	return id;
}

enum { X, CNT, A2A, Y, Z, W, WN, ADD, OUT, NV, VM, YV, NN };

/* One device's program, ids fixed by the enum above:
 *   %0 x, %1 counts (inputs); %2 = all_to_all(x, counts); %3 = neg(%2);
 *   %4 = neg(x); %5 weight; %6 = neg(%5); %7 = add(%3, %4); %8 = add(%7, %6)
 *   %9 nv (input i32[]); %10 = neg(%9); %11 = neg(%8) valid(%10)
 * outputs %11 and %4. */
static moe_module *ep_program(moe_ctx *c)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "dev");
	moe_graph_set_dtype(g, MOE_F32);
	moe_id id[NN];
	id[X] = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){4, 2}, "x");
	id[CNT] = leaf(g, MOE_OP_INPUT, MOE_I32, 1, (int64_t[]){2}, "counts");
	id[A2A] = moe_node_new(g, MOE_OP_ALL_TO_ALL, (moe_id[]){id[X], id[CNT]}, 2, moe_loc_none());
	moe_node_set_int(g, id[A2A], "ep", 2);
	moe_node_set_int(g, id[A2A], "rows", 4);
	assert_int_equal(moe_node_infer(g, id[A2A]), MOE_OK);
	id[Y] = node(g, MOE_OP_NEG, &id[A2A], 1);
	id[Z] = node(g, MOE_OP_NEG, &id[X], 1);
	id[W] = leaf(g, MOE_OP_WEIGHT, MOE_F32, 2, (int64_t[]){4, 2}, "wt");
	id[WN] = node(g, MOE_OP_NEG, &id[W], 1);
	id[ADD] = node(g, MOE_OP_ADD, (moe_id[]){id[Y], id[Z]}, 2);
	id[OUT] = node(g, MOE_OP_ADD, (moe_id[]){id[ADD], id[WN]}, 2);
	id[NV] = leaf(g, MOE_OP_INPUT, MOE_I32, 0, NULL, "nv");
	id[VM] = node(g, MOE_OP_NEG, &id[NV], 1);
	id[YV] = moe_node_new(g, MOE_OP_NEG, &id[OUT], 1, moe_loc_none());
	moe_node_set_valid(g, id[YV], id[VM]);
	assert_int_equal(moe_node_infer(g, id[YV]), MOE_OK);
	for (int i = 0; i < NN; i++)
		assert_int_equal(id[i], i);
	moe_graph_add_output(g, id[YV]);
	moe_graph_add_output(g, id[Z]);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);
	return m;
}

static void test_ep_phases(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = ep_program(c);
	int level[NN];
	assert_int_equal(moe_ep_phases(moe_module_graph(m, 0), level), 2);
	/* inputs and what reads no exchange: phase 0; the exchange runs at the end
	 * of its operands' phase; its readers are phase 1; a weight and what
	 * depends on leaves alone: -1 */
	static const int want[NN] = {[X] = 0, [CNT] = 0, [A2A] = 0, [Y] = 1, [Z] = 0, [W] = -1, [WN] = -1, [ADD] = 1,
		[OUT] = 1, [NV] = 0, [VM] = 0, [YV] = 1};
	assert_memory_equal(level, want, sizeof want);

	/* no exchange: one phase */
	moe_module *one = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(one, "plain");
	moe_id x = leaf(g, MOE_OP_INPUT, MOE_F32, 1, (int64_t[]){3}, "x");
	moe_id w = leaf(g, MOE_OP_WEIGHT, MOE_F32, 1, (int64_t[]){3}, "w");
	moe_id a = node(g, MOE_OP_ADD, (moe_id[]){x, w}, 2);
	moe_graph_add_output(g, a);
	int l1[3];
	assert_int_equal(moe_ep_phases(g, l1), 1);
	assert_int_equal(l1[0], 0);
	assert_int_equal(l1[1], -1);
	assert_int_equal(l1[2], 0);

	/* two exchanges in a row: three phases */
	moe_module *three = moe_module_new(c);
	g = moe_module_add_graph(three, "chain");
	x = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){4, 2}, "x");
	moe_id k = leaf(g, MOE_OP_INPUT, MOE_I32, 1, (int64_t[]){2}, "counts");
	moe_id e1 = moe_node_new(g, MOE_OP_ALL_TO_ALL, (moe_id[]){x, k}, 2, moe_loc_none());
	moe_node_set_int(g, e1, "ep", 2);
	moe_node_set_int(g, e1, "rows", 4);
	assert_int_equal(moe_node_infer(g, e1), MOE_OK);
	moe_id e2 = moe_node_new(g, MOE_OP_ALL_TO_ALL, (moe_id[]){e1, k}, 2, moe_loc_none());
	moe_node_set_int(g, e2, "ep", 2);
	moe_node_set_int(g, e2, "rows", 4);
	assert_int_equal(moe_node_infer(g, e2), MOE_OK);
	moe_id n2 = node(g, MOE_OP_NEG, &e2, 1);
	moe_graph_add_output(g, n2);
	int l3[5];
	assert_int_equal(moe_ep_phases(g, l3), 3);
	static const int want3[5] = {0, 0, 0, 1, 2};
	assert_memory_equal(l3, want3, sizeof want3);
	moe_module_free(three);
	moe_module_free(one);
	moe_module_free(m);
	moe_ctx_free(c);
}

static const char *input_name(const moe_graph *g, moe_id id)
{
	assert_int_equal(moe_node_op(g, id), MOE_OP_INPUT);
	return moe_node_name(g, id);
}

static void test_ep_phase_graph(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = ep_program(c);
	const moe_graph *g = moe_module_graph(m, 0);
	int level[NN];
	assert_int_equal(moe_ep_phases(g, level), 2);

	/* phase 0: x, counts, neg(x), nv, neg(nv); its outputs are what the
	 * exchange reads (x, counts), what phase 1 reads (neg(x) as an operand,
	 * neg(nv) as a valid mask) and the program's output neg(x), in g's order */
	moe_id ids[8];
	uint32_t nids = 99;
	moe_module *p0 = moe_ep_phase_graph(c, g, level, 0, ids, 8, &nids);
	assert_non_null(p0);
	const moe_graph *g0 = moe_module_graph(p0, 0);
	assert_int_equal(moe_graph_verify(c, g0), MOE_OK);
	assert_int_equal(moe_graph_num_nodes(g0), 5);
	static const moe_id want0[4] = {X, CNT, Z, VM};
	assert_int_equal(nids, 4);
	assert_memory_equal(ids, want0, sizeof want0);
	assert_int_equal(moe_graph_num_outputs(g0), 4);
	for (uint32_t j = 0; j < 4; j++) {
		moe_id o = moe_graph_output(g0, j);
		assert_int_equal(moe_node_op(g0, o), moe_node_op(g, ids[j]));
		assert_int_equal(moe_node_dtype(g0, o), moe_node_dtype(g, ids[j]));
		assert_int_equal(moe_node_rank(g0, o), moe_node_rank(g, ids[j]));
	}
	assert_string_equal(moe_node_name(g0, moe_graph_output(g0, 0)), "x");
	for (moe_id i = 0; i < moe_graph_num_nodes(g0); i++)
		assert_int_not_equal(moe_node_op(g0, i), MOE_OP_ALL_TO_ALL);

	/* cap: only the first cap values become outputs, *nids still counts all */
	moe_module *p0c = moe_ep_phase_graph(c, g, level, 0, ids, 2, &nids);
	assert_int_equal(nids, 4);
	assert_int_equal(moe_graph_num_outputs(moe_module_graph(p0c, 0)), 2);
	assert_int_equal(ids[0], X);
	assert_int_equal(ids[1], CNT);
	moe_module_free(p0c);

	/* phase 1: the exchange's result and phase 0's values come in as inputs
	 * "ep.<id>" (in the order of first use), the weight's neg is recomputed
	 * here, the output is the program's */
	moe_module *p1 = moe_ep_phase_graph(c, g, level, 1, ids, 8, &nids);
	const moe_graph *g1 = moe_module_graph(p1, 0);
	assert_int_equal(moe_graph_verify(c, g1), MOE_OK);
	assert_int_equal(nids, 1);
	assert_int_equal(ids[0], YV);
	assert_int_equal(moe_graph_num_outputs(g1), 1);
	int inputs = 0, weights = 0, negs = 0;
	char names[4][16] = {{0}};
	for (moe_id i = 0; i < moe_graph_num_nodes(g1); i++) {
		moe_op op = moe_node_op(g1, i);
		if (op == MOE_OP_INPUT && inputs < 4)
			snprintf(names[inputs++], sizeof names[0], "%s", input_name(g1, i));
		weights += op == MOE_OP_WEIGHT;
		negs += op == MOE_OP_NEG;
		assert_int_not_equal(op, MOE_OP_ALL_TO_ALL);
	}
	assert_int_equal(inputs, 3);
	assert_string_equal(names[0], "ep.2");  /* the exchange's result */
	assert_string_equal(names[1], "ep.4");  /* neg(x) of phase 0 */
	assert_string_equal(names[2], "ep.10"); /* the valid mask neg(nv) of phase 0 */
	assert_int_equal(weights, 1);
	assert_string_equal(moe_node_name(g1, 0) ? moe_node_name(g1, 0) : "", "ep.2");
	assert_int_equal(negs, 3); /* neg(a2a), neg(weight), the masked neg */
	/* the masked node keeps its mask, now the input ep.10 */
	moe_id out = moe_graph_output(g1, 0);
	moe_id v = moe_node_valid(g1, out);
	assert_int_not_equal(v, MOE_NONE);
	assert_string_equal(input_name(g1, v), "ep.10");

	/* a phase with nothing in it: an empty graph */
	moe_module *p5 = moe_ep_phase_graph(c, g, level, 5, ids, 8, &nids);
	assert_int_equal(nids, 0);
	assert_int_equal(moe_graph_num_nodes(moe_module_graph(p5, 0)), 0);
	moe_module_free(p5);
	moe_module_free(p1);
	moe_module_free(p0);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* ---- moe_module_stats_json ---- */

static const char *small_moe = "layer small {\n"
			       "  dim T = 4, D = 8, F = 16, E = 4, K = 2, B = 3\n"
			       "  dtype f32\n"
			       "  input  x : [T, D]\n"
			       "  weight router : [E, D]    = \"r\"\n"
			       "  weight w1     : [E, F, D] = \"e.{e}.w1\"\n"
			       "  weight w3     : [E, F, D] = \"e.{e}.w3\"\n"
			       "  weight w2     : [E, D, F] = \"e.{e}.w2\"\n"
			       "  logits = einsum(\"td,ed->te\", x, router)\n"
			       "  p      = softmax(logits, axis=1)\n"
			       "  idx    = topk(p, k=K)\n"
			       "  w      = take_along(p, idx, axis=1)\n"
			       "  y      = experts(x, idx, w, gate=w1, up=w3, down=w2, act=\"swiglu\", block=B)\n"
			       "  output y\n"
			       "}\n";

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsNumber(v))
		fail_msg("no number '%s'", key);
	return v->valuedouble;
}

static void check_small(const cJSON *o, const char *name, double T)
{
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "layer")->valuestring, name);
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "dtype")->valuestring, "f32");
	const cJSON *dims = cJSON_GetObjectItemCaseSensitive(o, "dims");
	assert_true(num(dims, "T") == T);
	assert_true(num(dims, "D") == 8 && num(dims, "F") == 16 && num(dims, "E") == 4 && num(dims, "K") == 2);
	/* router 2 T D E, experts 2 T K D F x 3 projections (gated) */
	assert_true(num(o, "flops") == 2 * T * 8 * 4 + 2 * T * 2 * 8 * 16 * 3);
	/* f32: router E D, three [E, F, D] */
	assert_true(num(o, "weight_bytes") == 4 * (4 * 8 + 3 * 4 * 16 * 8));
	assert_non_null(cJSON_GetObjectItemCaseSensitive(o, "buffers"));
	assert_true(num(o, "flops_grid_max") > 0);
}

static void test_module_stats_json(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_parse_moe(c, "small.moe", small_moe, strlen(small_moe), NULL);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	/* the tcp pipeline (NULL) and the host pipeline give the same grid bounds:
	 * n = T K = 8 pairs, M = min(E, n) = 4; tight min(M + (n - M) / B,
	 * M ceil(T / B)) = min(5, 8) = 5; seed (n - E) / B + E = 5; vLLM
	 * ceil((n + E (B - 1)) / B) = ceil(16 / 3) = 6 */
	const char *pipes[] = {NULL, "host"};
	for (int i = 0; i < 2; i++) {
		char *s = moe_module_stats_json(c, m, pipes[i]);
		assert_non_null(s);
		cJSON *o = cJSON_Parse(s);
		assert_non_null(o);
		check_small(o, "small", 4);
		assert_true(num(o, "grid_blocks_max") == 5);
		assert_true(num(o, "grid_blocks_seed") == 5);
		assert_true(num(o, "grid_blocks_vllm") == 6);
		assert_null(cJSON_GetObjectItemCaseSensitive(o, "layers"));
		cJSON_Delete(o);
		moe_free(c, s);
	}
	/* the module is not changed: stats lower a copy */
	assert_int_equal(moe_node_op(moe_module_graph(m, 0), moe_graph_output(moe_module_graph(m, 0), 0)),
		MOE_OP_EXPERTS);

	/* a pipeline that does not parse: NULL with a diagnostic */
	assert_null(moe_module_stats_json(c, m, "no-such-pass"));
	assert_true(moe_error_count(c) > 0);
	moe_diag_clear(c);
	moe_module_free(m);

	/* two layers: the first layer's keys plus "layers", one object each */
	char two[2048];
	char *second = strdup(small_moe);
	memcpy(strstr(second, "small"), "other", 5);
	memcpy(strstr(second, "T = 4"), "T = 6", 5);
	snprintf(two, sizeof two, "%s%s", small_moe, second);
	free(second);
	m = moe_parse_moe(c, "two.moe", two, strlen(two), NULL);
	assert_non_null(m);
	char *s = moe_module_stats_json(c, m, "host");
	cJSON *o = cJSON_Parse(s);
	check_small(o, "small", 4);
	const cJSON *layers = cJSON_GetObjectItemCaseSensitive(o, "layers");
	assert_int_equal(cJSON_GetArraySize(layers), 2);
	check_small(cJSON_GetArrayItem(layers, 0), "small", 4);
	check_small(cJSON_GetArrayItem(layers, 1), "other", 6);
	cJSON_Delete(o);
	moe_free(c, s);
	moe_module_free(m);

	/* a module without layers has no stats */
	m = moe_module_new(c);
	assert_null(moe_module_stats_json(c, m, NULL));
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pass_count_get),
		cmocka_unit_test(test_pass_options),
		cmocka_unit_test(test_pass_opt),
		cmocka_unit_test(test_ep_phases),
		cmocka_unit_test(test_ep_phase_graph),
		cmocka_unit_test(test_module_stats_json),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
