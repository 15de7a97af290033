/* examples/embed/main.c: using libmoec as a pass library from another program.
 *
 * Builds a Mixtral-style MoE layer through the public C API (router einsum,
 * top-k, softmax over the selected logits, experts), registers an external
 * pass, runs it around lower-topk and blockwise-dispatch as one text
 * pipeline, checks with the reference interpreter that lowering kept the
 * layer's meaning, prints the lowered IR and emits portable C.
 *
 * Usage: moec-embed [OUT.c]   (without OUT.c the C goes to stdout after the IR)
 * Exit status 0 on success, 1 with diagnostics on stderr otherwise. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moec/moec.h>

/* Layer size: T tokens of width D, E experts of hidden width F, top-K, blocks of B rows. */
enum { T = 6, D = 16, F = 32, E = 4, K = 2, B = 4 };

/* ---- the allocator hook: counts what the context holds ---- */
typedef struct alloc_stats {
	size_t live, peak, calls;
} alloc_stats;

static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
	alloc_stats *s = ud;
	s->calls++;
	if (nsize == 0) {
		free(ptr);
		s->live -= osize;
		return NULL;
	}
	void *q = realloc(ptr, nsize);
	if (!q)
		return NULL; /* the old block stays valid and counted */
	s->live = s->live - osize + nsize;
	if (s->live > s->peak)
		s->peak = s->live;
	return q;
}

/* ---- an external pass: counts ops, tagged by its `tag` option ---- */
typedef struct census {
	FILE *out;
	int runs;
} census;

static moe_status op_census(moe_ctx *ctx, moe_graph *g, const moe_pass_opts *opts, void *ud)
{
	census *c = ud;
	const char *tag = moe_pass_opt(opts, "tag");
	unsigned count[MOE_OP_COUNT] = {0};
	uint32_t n = moe_graph_num_nodes(g);
	for (moe_id i = 0; i < n; i++)
		count[moe_node_op(g, i)]++;
	if (count[MOE_OP_EXPERTS] > 1) { /* a pass may reject its input: diagnostic + status */
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "op-census: layer '%s' has %u experts nodes",
			moe_graph_name(g), count[MOE_OP_EXPERTS]);
		return MOE_ERR_INVALID;
	}
	fprintf(c->out, "op-census[%s] %s: nodes=%u", tag ? tag : "-", moe_graph_name(g), n);
	static const moe_op shown[] = {MOE_OP_EINSUM, MOE_OP_SOFTMAX, MOE_OP_TOPK, MOE_OP_TAKE_ALONG, MOE_OP_EXPERTS,
		MOE_OP_FILTER, MOE_OP_SCATTER};
	for (size_t k = 0; k < sizeof shown / sizeof *shown; k++)
		fprintf(c->out, " %s=%u", moe_op_name(shown[k]), count[shown[k]]);
	fputc('\n', c->out);
	c->runs++;
	return MOE_OK;
}

/* ---- building the layer ---- */
static moe_id leaf(moe_graph *g, moe_op op, const char *name, const char *source, int rank, const int64_t *shape)
{
	moe_id id = moe_node_new(g, op, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, MOE_F32, shape, rank);
	moe_node_set_name(g, id, name);
	if (source)
		moe_node_set_str(g, id, "source", source);
	return id;
}

/* Op nodes are built in three steps: moe_node_new with the operands, the
 * attributes, then moe_node_infer for dtype and shape. infer() keeps the first
 * failure so that the build reads straight through. */
static moe_id node(moe_graph *g, moe_op op, const moe_id *args, uint32_t nargs)
{
	return moe_node_new(g, op, args, nargs, moe_loc_none());
}

static moe_status infer(moe_graph *g, moe_id id, moe_status st)
{
	return st == MOE_OK ? moe_node_infer(g, id) : st;
}

static moe_module *build_layer(moe_ctx *ctx)
{
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, "embed_moe");
	moe_graph_set_dtype(g, MOE_F32);
	const char *dn[] = {"T", "D", "F", "E", "K", "B"};
	const int64_t dv[] = {T, D, F, E, K, B};
	for (int i = 0; i < 6; i++)
		moe_graph_set_dim(g, dn[i], dv[i]);

	moe_status st = MOE_OK;
	moe_id x = leaf(g, MOE_OP_INPUT, "x", NULL, 2, (int64_t[]){T, D});
	moe_id router = leaf(g, MOE_OP_WEIGHT, "router", "layers.0.router.weight", 2, (int64_t[]){E, D});
	moe_id gate = leaf(g, MOE_OP_WEIGHT, "gate", "layers.0.experts.{e}.w1.weight", 3, (int64_t[]){E, F, D});
	moe_id up = leaf(g, MOE_OP_WEIGHT, "up", "layers.0.experts.{e}.w3.weight", 3, (int64_t[]){E, F, D});
	moe_id down = leaf(g, MOE_OP_WEIGHT, "down", "layers.0.experts.{e}.w2.weight", 3, (int64_t[]){E, D, F});

	/* logits[t, e] = sum_d x[t, d] router[e, d] */
	moe_id logits = node(g, MOE_OP_EINSUM, (moe_id[]){x, router}, 2);
	moe_node_set_str(g, logits, "eq", "td,ed->te");
	st = infer(g, logits, st);
	/* the K best experts of each token, their logits, softmax over those */
	moe_id idx = node(g, MOE_OP_TOPK, &logits, 1);
	moe_node_set_int(g, idx, "k", K);
	st = infer(g, idx, st);
	moe_id sel = node(g, MOE_OP_TAKE_ALONG, (moe_id[]){logits, idx}, 2);
	moe_node_set_int(g, sel, "axis", 1);
	st = infer(g, sel, st);
	moe_id w = node(g, MOE_OP_SOFTMAX, &sel, 1);
	moe_node_set_int(g, w, "axis", 1);
	st = infer(g, w, st);
	moe_node_set_name(g, w, "routing_weights");
	/* token-centric SwiGLU experts; the three bias slots are absent */
	moe_id args[9] = {x, idx, w, gate, up, down, MOE_NONE, MOE_NONE, MOE_NONE};
	moe_id y = node(g, MOE_OP_EXPERTS, args, 9);
	moe_node_set_str(g, y, "act", "swiglu");
	moe_node_set_int(g, y, "block", B);
	st = infer(g, y, st);
	moe_node_set_name(g, y, "y");
	moe_graph_add_output(g, y);

	if (st != MOE_OK || moe_module_verify(ctx, m) != MOE_OK) {
		moe_module_free(m);
		return NULL;
	}
	return m;
}

/* ---- inputs for the interpreter: a fixed pseudo-random pattern ---- */
static moe_tensor_map *make_bindings(moe_ctx *ctx, const moe_graph *g)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	uint32_t seed = 12345;
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++) {
		moe_op op = moe_node_op(g, i);
		if (op != MOE_OP_INPUT && op != MOE_OP_WEIGHT)
			continue;
		moe_tensor *t = moe_tensor_new(ctx, moe_node_dtype(g, i), moe_node_rank(g, i), moe_node_shape(g, i));
		if (!t) {
			moe_tensor_map_free(b);
			return NULL;
		}
		float *v = t->data;
		for (int64_t k = 0; k < moe_tensor_numel(t); k++) {
			seed = seed * 1664525u + 1013904223u;
			v[k] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * (op == MOE_OP_INPUT ? 2.0f : 0.5f);
		}
		moe_tensor_map_set(b, moe_node_name(g, i), t);
	}
	return b;
}

static moe_tensor *interpret(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *b)
{
	moe_tensor *out[1] = {NULL};
	return moe_interp_run(ctx, g, b, out) == MOE_OK ? out[0] : NULL;
}

/* A module's textual IR printed and parsed back: a deep copy. */
static moe_module *copy_module(moe_ctx *ctx, const moe_module *m)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	moe_status st = moe_module_print(m, f);
	if (fclose(f) != 0 || st != MOE_OK) {
		free(text);
		return NULL;
	}
	moe_module *c = moe_module_parse_text(ctx, "<copy>", text, len);
	free(text);
	return c;
}

static const char pipeline_text[] =
	"op-census{tag=built},infer-shapes,lower-topk,blockwise-dispatch,flatten-blocks,grid-bound,canonicalize,cse,dce,"
	"op-census{tag=lowered}";

int main(int argc, char **argv)
{
	if (argc > 2) {
		fprintf(stderr, "usage: %s [OUT.c]\n", argv[0]);
		return 2;
	}
	alloc_stats as = {0};
	moe_ctx *ctx = moe_ctx_new(counting_alloc, &as);
	if (!ctx) {
		fprintf(stderr, "moec-embed: cannot create a context\n");
		return 1;
	}
	printf("# libmoec %s\n", moe_version_string());

	int rc = 1;
	moe_module *m = NULL, *ref = NULL;
	moe_pipeline *p = NULL;
	moe_tensor_map *bind = NULL;
	moe_tensor *y0 = NULL, *y1 = NULL;
	char *canon = NULL;
	moe_status st;

	census cs = {stdout, 0};
	moe_pass_info info = {
		.name = "op-census",
		.summary = "print how many nodes of the routing ops each layer has",
		.options = "tag=NAME",
		.run = op_census,
		.ud = &cs,
	};
	/* register before parsing pipelines that name the pass */
	if ((st = moe_pass_register(ctx, &info)) != MOE_OK)
		goto out;
	printf("# passes:");
	for (size_t i = 0; i < moe_pass_count(ctx); i++)
		printf(" %s", moe_pass_get(ctx, i)->name);
	printf("\n");

	if (!(m = build_layer(ctx)) || !(ref = copy_module(ctx, m)))
		goto out;
	moe_graph *g = moe_module_graph(m, 0);
	if (!(bind = make_bindings(ctx, g)) || !(y0 = interpret(ctx, moe_module_graph(ref, 0), bind)))
		goto out;

	if (!(p = moe_pipeline_parse(ctx, pipeline_text)) || !(canon = moe_pipeline_print(p)))
		goto out;
	printf("# pipeline: %s\n", canon);
	moe_run_opts ro = {.verify = 1}; /* the verifier runs after every pass */
	if ((st = moe_pipeline_run(ctx, p, m, &ro)) != MOE_OK)
		goto out;
	if (cs.runs != 2) {
		fprintf(stderr, "moec-embed: the external pass ran %d times, expected 2\n", cs.runs);
		goto out;
	}

	/* The lowered layer computes what the built one did. */
	if (!(y1 = interpret(ctx, g, bind)))
		goto out;
	double err = 0, mag = 0;
	const float *a = y0->data, *b = y1->data;
	for (int64_t i = 0; i < moe_tensor_numel(y0); i++) {
		err = fmax(err, fabs((double)a[i] - b[i]));
		mag = fmax(mag, fabs((double)a[i]));
	}
	printf("# interpreter: max |y_lowered - y_built| = %.3g (max |y| = %.3g)\n", err, mag);
	if (!(err <= 1e-5 * (mag > 0 ? mag : 1))) {
		fprintf(stderr, "moec-embed: lowering changed the result\n");
		goto out;
	}
	size_t ws = 0;
	if ((st = moe_host_workspace_size(ctx, g, &ws)) != MOE_OK)
		goto out;
	printf("# workspace: %zu bytes\n", ws);

	printf("# lowered IR\n");
	if (moe_module_print(m, stdout) != MOE_OK)
		goto out;
	if (argc == 2) {
		if ((st = moe_emit_c_file(ctx, g, argv[1])) != MOE_OK)
			goto out;
		printf("# C written to %s\n", argv[1]);
	} else {
		printf("# emitted C\n");
		if ((st = moe_emit_c(ctx, g, stdout)) != MOE_OK)
			goto out;
	}
	rc = 0;

out:
	if (moe_diag_count(ctx))
		moe_diag_print(ctx, stderr);
	moe_free(ctx, canon);
	moe_pipeline_free(p);
	moe_tensor_free(ctx, y0);
	moe_tensor_free(ctx, y1);
	moe_tensor_map_free(bind);
	moe_module_free(ref);
	moe_module_free(m);
	moe_ctx_free(ctx);
	/* everything the context allocated went back through the hook */
	fprintf(stderr, "moec-embed: allocator: %zu calls, peak %zu bytes, %zu bytes live after moe_ctx_free\n",
		as.calls, as.peak, as.live);
	if (as.live != 0)
		rc = 1;
	fflush(stdout);
	return rc;
}
