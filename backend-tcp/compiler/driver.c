/* backend-tcp/compiler/driver.c: the schedule compiler's driver: the graph
 * split at its packed weights (prep.c), sched-build of the device graph, the
 * verifier, the structural rewrites (rewrites.def), placement (dmplan.c), the
 * peephole rewrites (the list scheduler among them), the verifier again, then
 * instruction selection. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/isel.h"
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/sched_build.h"
#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/compiler/schedule.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "moec/io.h"

/* The switches: --tcp-opt's, after MOEC_TCP_SCHEDULE=0 (or "off") in the
 * environment, which switches every rewrite off (sched-build's schedule, for
 * comparison). */
static moe_status switches(moe_ctx *ctx, const moe_tcp_machine *m, const char *opts, ts_env *e)
{
	memset(e, 0, sizeof *e);
	e->ctx = ctx;
	e->m = m;
	e->reuse = TS_REUSE_ORDERED;
	const char *v = getenv("MOEC_TCP_SCHEDULE");
	if (v && (!strcmp(v, "0") || !strcmp(v, "off")))
		e->off = ts_nrewrites < 64 ? (1ull << ts_nrewrites) - 1 : ~0ull;
	return ts_rewrite_opts(ctx, opts, e);
}

/* MACs of einsum n: the product of its distinct index letters' sizes */
static int64_t einsum_macs(const moe_graph *g, const ir_node *n)
{
	const char *eq = ir_attr_str(n, "eq", "");
	int64_t size[128] = {0}, macs = 1;
	uint32_t a = 0;
	int k = 0;
	for (const char *c = eq; *c && *c != '-'; c++) {
		if (*c == ',') {
			a++, k = 0;
			continue;
		}
		const ir_node *x = a < n->nargs ? N(g, n->args[a]) : NULL;
		if ((unsigned char)*c < 128 && x && k < x->rank)
			size[(unsigned char)*c] = x->shape[k];
		k++;
	}
	for (int c = 0; c < 128; c++)
		macs *= size[c] > 0 ? size[c] : 1;
	return macs;
}

/* Marks v and every value it is computed from (an expert operand of the
 * block loop is a view of the expert weights: a slice, a transpose). */
static void mark_expert(const moe_graph *g, moe_id v, uint8_t *expert)
{
	moe_id *stack = ctx_alloc(g->ctx, (g->nnodes + 1) * sizeof *stack);
	uint32_t n = 0;
	if (!expert[v])
		expert[v] = 1, stack[n++] = v;
	while (n > 0) {
		const ir_node *x = N(g, stack[--n]);
		for (uint32_t k = 0; k < x->nargs; k++)
			if (x->args[k] < g->nnodes && !expert[x->args[k]])
				expert[x->args[k]] = 1, stack[n++] = x->args[k];
	}
	ctx_free(g->ctx, stack, 0);
}

/* F and the projections from the [E, F, D] and [E, D, F] expert weights of
 * g's block loop (the graph before the packed weights were split off, so a
 * packed operand, a paired [E, n] concat, still shows what it is made of). */
static void leaf_dims(const moe_graph *g, ts_meta *x)
{
	const ir_node *loop = ir_graph_block_loop(g);
	if (!loop)
		return;
	uint8_t *expert = ctx_alloc(g->ctx, g->nnodes + 1);
	memset(expert, 0, g->nnodes + 1);
	const char *kinds = ir_attr_str(loop, "kinds", "");
	for (int k = 0; kinds[k]; k++) {
		int a = ir_block_loop_arg(kinds, k);
		if (kinds[k] == IR_BK_EXPERT && a >= 0 && (uint32_t)a < loop->nargs)
			mark_expert(g, loop->args[a], expert);
	}
	int64_t up = 0, down = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *w = N(g, i);
		if (!expert[i] || w->op != MOE_OP_WEIGHT || w->rank != 3)
			continue;
		if (w->shape[2] == x->D && !up)
			up = w->shape[1];
		if (w->shape[1] == x->D && !down)
			down = w->shape[2];
	}
	x->F = down ? down : up;
	for (moe_id i = 0; i < g->nnodes && x->F > 0; i++) {
		const ir_node *w = N(g, i);
		if (expert[i] && w->op == MOE_OP_WEIGHT && w->rank == 3 && (w->shape[1] == x->D || w->shape[2] == x->D))
			x->nproj += (w->shape[1] == x->D ? w->shape[2] : w->shape[1]) / x->F;
	}
	ctx_free(g->ctx, expert, 0);
}

/* Whether body node v is computed from data operands of the loop whose kind
 * is an expert's alone (a blockarg of role "in" and index k, kinds[k] 'e';
 * then views and dequantizations of them): a node that also reads the
 * block's rows (a contraction, a bias added) yields activations. */
static bool body_expert(const moe_graph *b, moe_id v, const char *kinds, const uint8_t *from)
{
	const ir_node *n = &b->nodes[v];
	if (n->op == MOE_OP_BLOCKARG) {
		int64_t k = ir_attr_int(n, "index", -1);
		return ir_blockarg_role_of(n) == IR_BA_IN && k >= 0 && k < (int64_t)strlen(kinds) &&
		       kinds[k] == IR_BK_EXPERT;
	}
	for (uint32_t a = 0; a < n->nargs; a++)
		if (n->args[a] >= b->nnodes || !from[n->args[a]])
			return false;
	return n->nargs > 0;
}

/* F and the projections from the contractions of the loop body that read
 * an expert weight [a, b] (a view or dequantization of the loop's expert
 * operands: a quantized expert's stored leaves, [E, F, D / 2] MXFP4 bytes or
 * [E, N, K / 32] scales, and a packed pair's rows do not show the logical
 * shapes) against the block's rows. Each does a x b MACs per row; F is the
 * smallest non-D side among them (a paired gate and up weight has 2F rows;
 * with F = D every side is D), so the projections are the sum of a x b over
 * D x F. True when the body has such a contraction. */
static bool body_dims(const moe_graph *g, const ir_node *loop, const char *kinds, ts_meta *x)
{
	const moe_graph *b = ir_node_body(g, loop);
	if (!b || x->D <= 0)
		return false;
	uint8_t *from = ctx_alloc(g->ctx, b->nnodes + 1);
	int64_t f = 0, ab = 0;
	for (moe_id i = 0; i < b->nnodes; i++) {
		const ir_node *n = &b->nodes[i];
		from[i] = body_expert(b, i, kinds, from);
		if (n->op != MOE_OP_EINSUM || n->nargs != 2 || n->args[0] >= b->nnodes || n->args[1] >= b->nnodes ||
		    from[n->args[0]] || !from[n->args[1]] || b->nodes[n->args[1]].rank < 2)
			continue;
		const ir_node *w = &b->nodes[n->args[1]];
		int64_t r = w->shape[w->rank - 2], c = w->shape[w->rank - 1];
		if (r != x->D && c != x->D)
			continue;
		int64_t side = r != x->D ? r : c;
		f = f == 0 || side < f ? side : f;
		ab += r * c;
	}
	ctx_free(g->ctx, from, 0);
	if (f <= 0)
		return false;
	x->F = f;
	x->nproj = ab / (x->D * f);
	return true;
}

/* The bytes a run must read from the layer's weights as stored (the
 * checkpoint's leaves: a quantized weight's values and scales, not the
 * dequantized or packed copy a program may lay out at load time, A13 in
 * docs/tcp-isa.md), split into the experts' (per expert) and the rest, with
 * x and y: the roofline's and the floor's byte counts. g is the graph before
 * its packed weights were split off. False when g has no block loop. */
static bool stored_bytes(const moe_graph *g, ts_meta *x)
{
	const ir_node *loop = ir_graph_block_loop(g);
	if (!loop)
		return false;
	uint8_t *expert = ctx_alloc(g->ctx, g->nnodes + 1);
	memset(expert, 0, g->nnodes + 1);
	const char *kinds = ir_attr_str(loop, "kinds", "");
	for (int k = 0; kinds[k]; k++) {
		int a = ir_block_loop_arg(kinds, k);
		if (kinds[k] == IR_BK_EXPERT && a >= 0 && (uint32_t)a < loop->nargs)
			mark_expert(g, loop->args[a], expert);
	}
	int64_t wall = 0, act = 0, E = x->E > 0 ? x->E : 1;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_WEIGHT && expert[i])
			wall += ir_bytes(n);
		else if (n->op == MOE_OP_WEIGHT || n->op == MOE_OP_INPUT)
			act += ir_bytes(n);
	}
	for (uint32_t i = 0; i < g->nout; i++)
		act += ir_bytes(N(g, g->outputs[i]));
	x->wexp = wall / E;
	x->act = act;
	ctx_free(g->ctx, expert, 0);
	return true;
}

/* The roofline dims a program records (docs/tcp-model.md 6), from the
 * graph: F and the projections from the block loop's per-expert operands
 * ([E, F, D] on x, [E, D, F] back; a paired [E, 2F, D] counts two; dequantized
 * ones from the body's contractions), the stored bytes of one expert's
 * operands, the bytes every run reads whatever the routing (inputs, outputs,
 * the weights no expert operand is made from) and the MACs of the
 * contractions outside those operands and the loop. */
static void roofline(tcp_sched *s, const moe_graph *g, const moe_graph *orig)
{
	ts_meta *x = &s->meta;
	uint8_t *expert = ctx_alloc(s->ctx, g->nnodes + 1);
	memset(expert, 0, g->nnodes + 1);
	int64_t up = 0, down = 0, E = x->E > 0 ? x->E : 1;
	const ir_node *loop = NULL;
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_BLOCK_LOOP && !loop)
			loop = N(g, i);
	const char *kinds = loop ? ir_attr_str(loop, "kinds", "") : "";
	for (int k = 0; kinds[k]; k++) {
		int a = ir_block_loop_arg(kinds, k);
		if (kinds[k] != IR_BK_EXPERT || a < 0 || (uint32_t)a >= loop->nargs)
			continue;
		const ir_node *w = N(g, loop->args[a]);
		mark_expert(g, loop->args[a], expert);
		x->wexp += ir_bytes(w) / E;
		if (w->rank == 3 && w->shape[2] == x->D && !up)
			up = w->shape[1];
		if (w->rank == 3 && w->shape[1] == x->D && !down)
			down = w->shape[2];
	}
	x->F = down ? down : up;
	for (int k = 0; kinds[k] && x->F > 0; k++) {
		int a = ir_block_loop_arg(kinds, k);
		const ir_node *w = kinds[k] == IR_BK_EXPERT && a >= 0 ? N(g, loop->args[a]) : NULL;
		if (w && w->rank == 3 && (w->shape[1] == x->D || w->shape[2] == x->D))
			x->nproj += (w->shape[1] == x->D ? w->shape[2] : w->shape[1]) / x->F;
	}
	if (loop)
		body_dims(g, loop, kinds, x);
	if (!x->F && orig) /* packed operands: the expert weights they are made from */
		leaf_dims(orig, x);
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_INPUT || (n->op == MOE_OP_WEIGHT && !expert[i]))
			x->act += ir_bytes(n);
		else if (n->op == MOE_OP_EINSUM && !expert[i])
			x->rmacs += einsum_macs(g, n);
	}
	for (uint32_t i = 0; i < g->nout; i++)
		x->act += ir_bytes(N(g, g->outputs[i]));
	stored_bytes(orig ? orig : g, x); /* the weights as stored, not as packed */
	ctx_free(s->ctx, expert, 0);
}

/* Places s for the peephole rewrites. When it does not fit and `keep` is set
 * (the schedule is printed, not selected), s is left unplaced and the
 * overflow's diagnostics are dropped: the program's compile reports them. */
static bool place(moe_ctx *ctx, tcp_sched *s, bool keep)
{
	size_t n0 = moe_diag_count(ctx);
	int64_t *off = ctx_alloc(ctx, (s->nbuf + 1) * sizeof *off);
	for (ts_id i = 0; i < s->nbuf; i++)
		off[i] = s->buf[i].offset;
	bool ok = tcp_dm_place(s) == MOE_OK;
	if (!ok && keep) {
		for (ts_id i = 0; i < s->nbuf; i++)
			s->buf[i].offset = off[i];
		ts_diag_truncate(ctx, n0);
	}
	ctx_free(ctx, off, 0);
	return ok;
}

/* After a failed placement: the rows forced on (--tcp-opt=+NAME) that ran,
 * since a forced row adds its buffers whatever they cost in DM. */
static void note_forced(moe_ctx *ctx, const tcp_sched *s, const ts_env *e)
{
	char names[512];
	size_t n = 0;
	names[0] = 0;
	for (int k = 0; k < ts_nrewrites && k < 64; k++)
		if (e->on >> k & 1 && s->ran >> k & 1) {
			int w = snprintf(names + n, sizeof names - n, "%s+%s", n ? "," : "", ts_rewrites[k].name);
			if (w < 0 || (size_t)w >= sizeof names - n)
				break;
			n += (size_t)w;
		}
	if (n)
		moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_none(),
			"tcp: --tcp-opt forced on %s; a forced rewrite adds its buffers whatever they cost in DM (without it the "
			"compiler takes it only where it places)", names);
}

/* The schedule of g, carrying the prep graph `prep`: built, verified, then
 * (with e) the structural rewrites, placement when a peephole rewrite may
 * run, the peephole rewrites and the verifier. */
static tcp_sched *compiled_graph(moe_ctx *ctx, const moe_graph *g, const moe_graph *orig, const char *prep,
	const moe_tcp_machine *m, const ts_env *e, bool print)
{
	tcp_sched *s = tcp_sched_build(ctx, g, m);
	if (s && prep)
		s->meta.prep = ir_strdup(&s->arena, prep);
	if (s && tcp_sched_verify(s) != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "tcp: the schedule built for this layer does not verify (a moec bug)");
		tcp_sched_free(s);
		return NULL;
	}
	if (s && !s->meta.wexp && !s->meta.act)
		roofline(s, g, orig);
	if (!s || !e)
		return s;
	if (ts_rewrites_run(s, e, TS_RW_STRUCT) != MOE_OK) {
		tcp_sched_free(s);
		return NULL;
	}
	if (!ts_rewrites_enabled(e, TS_RW_PEEP))
		return s;
	s->reuse = e->reuse; /* from placement on: the verifier checks the reuse order */
	if (!place(ctx, s, print)) {
		s->reuse = TS_REUSE_UNORDERED;
		if (print)
			return s; /* printed unplaced: its compile reports the overflow */
		note_forced(ctx, s, e);
		tcp_sched_free(s);
		return NULL;
	}
	if (ts_rewrites_run(s, e, TS_RW_PEEP) != MOE_OK || tcp_sched_verify(s) != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "tcp: the rewritten schedule does not verify (a moec bug)");
		tcp_sched_free(s);
		return NULL;
	}
	return s;
}

/* g split at its tcp_pack marks (prep.c; planned by the tcp-split-weights
 * rule when g carries none): the device graph, whose packed values are
 * weight leaves, is built, and the schedule carries the prep graph that
 * computes them when the weights are bound. */
static tcp_sched *compiled(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const ts_env *e, bool print)
{
	char *prep = NULL;
	size_t plen = 0;
	int errs = moe_error_count(ctx);
	moe_graph *dev = tcp_split_weights(ctx, g, &prep, &plen, NULL);
	tcp_sched *s = NULL;
	if (moe_error_count(ctx) == errs && tcp_weights_fit_hbm(ctx, dev ? dev : g, m))
		s = compiled_graph(ctx, dev ? dev : g, g, prep, m, e, print);
	if (prep)
		ctx_free(ctx, prep, plen + 1);
	if (dev)
		ir_graph_free(dev);
	return s;
}

static tcp_sched *compiled_opts(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const char *opts, bool print)
{
	ts_env e;
	if (switches(ctx, m, opts, &e) != MOE_OK)
		return NULL;
	return compiled(ctx, g, m, &e, print);
}

tcp_sched *tcp_sched_compiled(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, bool schedule)
{
	CTX_GUARDED(ctx, tcp_sched *, NULL, schedule ? compiled_opts(ctx, g, m, NULL, false) : compiled(ctx, g, m, NULL, false));
}

static tcp_program *compile_opts(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const char *opts)
{
	tcp_sched *s = compiled_opts(ctx, g, m, opts, false);
	if (!s)
		return NULL;
	tcp_program *p = tcp_sched_isel(ctx, s);
	tcp_sched_free(s);
	return p;
}

tcp_program *tcp_compile_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	return compile_opts(ctx, g, m, NULL);
}

static moe_status emit_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const char *opts, const char *path)
{
	tcp_sched *s = compiled_opts(ctx, g, m, opts, true);
	if (!s)
		return MOE_ERR_INVALID;
	char *text = NULL;
	size_t len = 0;
	moe_status st = tcp_sched_print(s, &text, &len);
	tcp_sched_free(s);
	if (st == MOE_OK)
		st = moe_write_output(ctx, path, 0, text, len);
	if (text)
		ctx_free(ctx, text, len + 1);
	return st;
}

/* machine NULL: the built-in one, as moe_tcp_compile takes it */
static tcp_program *compile_default(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const char *opts)
{
	moe_tcp_machine *def = m ? NULL : moe_tcp_machine_default(ctx);
	if (!m && !def)
		return NULL;
	tcp_program *p = compile_opts(ctx, g, m ? m : def, opts);
	moe_tcp_machine_free(ctx, def);
	return p;
}

static moe_status emit_default(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const char *opts,
	const char *path)
{
	moe_tcp_machine *def = m ? NULL : moe_tcp_machine_default(ctx);
	if (!m && !def)
		return MOE_ERR_INVALID;
	moe_status st = emit_sched(ctx, g, m ? m : def, opts, path);
	moe_tcp_machine_free(ctx, def);
	return st;
}

moe_tcp_program *moe_tcp_compile_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine,
	const char *opts)
{
	CTX_GUARDED(ctx, tcp_program *, NULL, compile_default(ctx, g, machine, opts));
}

moe_status moe_tcp_emit_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine, const char *opts,
	const char *path)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, emit_default(ctx, g, machine, opts, path));
}

/* machine NULL: the built-in one; the graph passes g lacks run on a clone */
static tcp_program *compile_graph(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	moe_tcp_machine *def = m ? NULL : moe_tcp_machine_default(ctx);
	if (!m && !def)
		return NULL;
	moe_status st;
	moe_graph *w = tcp_loop_graph_passes(ctx, g, m ? m : def, &st);
	tcp_program *p = st == MOE_OK ? compile_opts(ctx, w ? w : g, m ? m : def, NULL) : NULL;
	if (w)
		ir_graph_free(w);
	moe_tcp_machine_free(ctx, def);
	return p;
}

moe_tcp_program *moe_tcp_compile(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine)
{
	CTX_GUARDED(ctx, tcp_program *, NULL, compile_graph(ctx, g, machine));
}
