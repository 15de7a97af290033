/* backend-tcp/compiler/gpass/w8a8_act.c: W8A8's per-token activation
 * quantization moved before the dispatch (tcp-w8a8-act-once).
 *
 * blockwise-dispatch writes the reference's per-token int8 quantization of
 * a W8A8 projection's input in the block_loop's body, on the block rows
 * (passes/blockwise_dispatch.c act_int8): each token's row is quantized once
 * per block it lands in, that is once per expert it visits (K times). The
 * quantization is row-wise, so it commutes with the dispatch's row gather
 * and scatter: this rewrite computes it once on the layer's input x [T, D],
 *   m = max(max_i |x[t, i]|, 1e-10), q = x * f32(127 / m) rounded half away
 *   from zero, as = f32(m / 127)
 * (the body's nodes, on x instead of the block rows), dispatches q (integers
 * of at most 127 in magnitude, exact in x's type) and as [T, 1] to the block
 * grid the way x was, as two `b` operands of the loop, and leaves in the
 * body only x' = q * as. A padding row of the grid is zero in both (x' = 0,
 * as the quantized zero row was). Every element of x' is the same f32
 * product of the same two values, so the layer's value is unchanged; the
 * schedule compiler then contracts the dispatched q rows (as i8) directly
 * and scales by the dispatched as (docs/tcp-isa.md 7.10).
 * The rewrite applies when its values fit DM (fits): with token-major
 * pairs (tok = iota(T K) / K: a layer without n_tokens), T D x 16 bytes
 * within the DM planner's grant for the layer (x's copy, an f32 [T, D]
 * temporary of the rounding and q, with room to spare); otherwise (a
 * serving layer, whose dispatch gathers the K T rows first) those rows
 * within its grant for one value. A graph without a block_loop (flattened)
 * is left as it is. */
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "passes/pass.h"

/* The dispatch of W8A8 activation a = cast(mul(q, div(m, c))): xf the rows
 * it quantizes, blocks = reshape(scatter(zero, pos, gather(x, tok))) their
 * grid, x the layer input [T, D]. */
typedef struct actq {
	moe_id a, mul, q, s, xf, blocks, scat, gath, x;
} actq;

static const ir_node *arg(const moe_graph *g, const ir_node *n, uint32_t k)
{
	return k < n->nargs && n->args[k] != MOE_NONE ? N(g, n->args[k]) : NULL;
}

bool tcp_w8a8_tok_major(const moe_graph *g, moe_id tok, int64_t T, int64_t *K)
{
	const ir_node *d = N(g, tok);
	if (d->op != MOE_OP_DIV || d->nargs != 2 || d->dtype != MOE_I32 || d->rank != 1 || d->valid != MOE_NONE)
		return false;
	const ir_node *io = N(g, d->args[0]), *k = N(g, d->args[1]);
	if (io->op != MOE_OP_IOTA || io->rank != 1 || ir_attr_int(io, "axis", -1) != 0 || k->op != MOE_OP_CONST ||
		k->rank != 0 || k->dtype != MOE_I32)
		return false;
	int64_t kv = ir_attr_int(k, "value", 0);
	if (kv < 1 || T < 1 || d->shape[0] != T * kv)
		return false;
	*K = kv;
	return true;
}

/* The quantization chain ending at activation a = cast(mul(q, div(m, c))):
 * its nodes mul, s, q and the rows xf [.., D] (f32) it quantizes. */
static bool match_chain(const moe_graph *g, moe_id a, actq *r)
{
	const ir_node *n = N(g, a);
	r->a = a;
	if (n->op != MOE_OP_CAST || !arg(g, n, 0) || arg(g, n, 0)->op != MOE_OP_MUL || arg(g, n, 0)->nargs != 2)
		return false;
	r->mul = n->args[0];
	const ir_node *mn = N(g, r->mul);
	int si = arg(g, mn, 1)->op == MOE_OP_DIV ? 1 : 0;
	r->s = mn->args[si];
	r->q = mn->args[1 - si];
	const ir_node *s = N(g, r->s), *m = arg(g, s, 0);
	if (s->op != MOE_OP_DIV || !m || m->op != MOE_OP_MAX || m->nargs != 2)
		return false;
	const ir_node *rm = arg(g, m, arg(g, m, 0)->op == MOE_OP_REDUCE_MAX ? 0 : 1);
	if (!rm || rm->op != MOE_OP_REDUCE_MAX || !arg(g, rm, 0) || arg(g, rm, 0)->op != MOE_OP_ABS)
		return false;
	r->xf = arg(g, rm, 0)->args[0];
	return N(g, r->xf)->dtype == MOE_F32;
}

/* The dispatch of x into the block grid blocks = reshape(scatter(0, pos,
 * gather(x, tok))), each read once. */
static bool match_dispatch(const moe_graph *g, const uint32_t *nuse, moe_id blocks, actq *r)
{
	r->blocks = blocks;
	const ir_node *b = N(g, blocks);
	if (b->op != MOE_OP_RESHAPE || b->rank != 3 || !arg(g, b, 0) || arg(g, b, 0)->op != MOE_OP_SCATTER)
		return false;
	r->scat = b->args[0];
	const ir_node *sc = N(g, r->scat), *ga = arg(g, sc, 2);
	if (sc->nargs != 3 || !ga || ga->op != MOE_OP_GATHER || ga->valid != MOE_NONE || sc->valid != MOE_NONE ||
		strcmp(ir_attr_str(sc, "mode", "set"), "set") || ir_attr_int(ga, "axis", 0) != 0 ||
		arg(g, sc, 0)->op != MOE_OP_CONST || sc->rank != 2)
		return false;
	r->gath = sc->args[2];
	r->x = ga->args[0];
	const ir_node *x = N(g, r->x);
	return x->op == MOE_OP_INPUT && x->rank == 2 && nuse[r->gath] == 1 && nuse[r->scat] == 1 && nuse[r->blocks] == 1;
}

/* inq[i]: node i is part of the quantization (depends on xf, up to a). Every
 * reader of such a node but a must be one too. */
static bool chain(const moe_graph *g, const actq *r, bool *inq)
{
	inq[r->xf] = true;
	for (moe_id i = r->xf + 1; i <= r->a; i++)
		for (uint32_t k = 0; k < N(g, i)->nargs && !inq[i]; k++)
			inq[i] = N(g, i)->args[k] != MOE_NONE && inq[N(g, i)->args[k]];
	for (moe_id i = r->xf + 1; i < g->nnodes; i++)
		for (uint32_t k = 0; k < N(g, i)->nargs; k++) {
			moe_id v = N(g, i)->args[k];
			if (v != MOE_NONE && v != r->a && inq[v] && (!inq[i] || i > r->a))
				return false;
		}
	return inq[r->q] && inq[r->s] && inq[r->mul];
}

static moe_id node(moe_ctx *ctx, moe_graph *d, moe_op op, moe_id a0, moe_id a1, moe_id a2, moe_loc loc, bool *ok)
{
	moe_id x[3] = {a0, a1, a2};
	moe_id id = moe_node_new(d, op, x, a2 != MOE_NONE ? 3 : a1 != MOE_NONE ? 2 : 1, loc);
	*ok &= ir_infer(ctx, d, id) == MOE_OK;
	return id;
}

/* The rewrite at a's place: the quantization on x, its dispatch, x' per
 * block. The scales travel as rows of w equal copies (w x 4 bytes: one HBM
 * access granule), so the grid's scatter writes whole granules where a
 * 4-byte row is a partial granule's read-modify-write; each block takes
 * their maximum (the value itself). */
/* The quantization of chain r of graph src (its nodes inq) copied into d on
 * x's rows xf (d's node), unmasked; m2 maps src's other operands into d, an
 * axis of src's rows shifts by -shift ([G, B, ..] rows become [T, ..]).
 * *q: the integers in the activation's type (x.q), *s: the rows' scales
 * (x.scale). */
static bool quant_x(moe_ctx *ctx, moe_graph *d, const moe_graph *src, const actq *r, const bool *inq, moe_id *m2,
	moe_id xf, int64_t shift, moe_id *q, moe_id *s)
{
	const ir_node *an = N(src, r->a);
	bool ok = true;
	m2[r->xf] = xf;
	for (moe_id i = r->xf + 1; i < r->a && ok; i++) {
		if (!inq[i] || i == r->mul)
			continue;
		m2[i] = ir_copy_node(d, src, i, m2);
		N(d, m2[i])->valid = MOE_NONE;
		int64_t ax = ir_attr_int(N(src, i), "axis", -1);
		if (shift && ir_attr_find(N(src, i), "axis") && ax >= 0)
			moe_node_set_int(d, m2[i], "axis", ax - shift);
		ok &= ir_infer(ctx, d, m2[i]) == MOE_OK;
	}
	if (!ok)
		return false;
	*q = m2[r->q];
	*s = m2[r->s];
	if (N(d, *q)->dtype != an->dtype)
		*q = ir_b_cast(d, *q, (moe_dtype)an->dtype, an->loc); /* |q| <= 127: exact */
	moe_node_set_name(d, *q, "x.q");
	moe_node_set_name(d, *s, "x.scale");
	return true;
}

/* q and s dispatched to the block grid as x was (o: the dispatch's nodes in
 * g): *bq [G, B, D] "blocks.q", *bs [G, B, 1] the rows' scales. */
static bool dispatch(moe_ctx *ctx, moe_graph *d, const moe_graph *g, const actq *o, const moe_id *map, moe_id q,
	moe_id s, int64_t w, moe_loc loc, moe_id *bq, moe_id *bs)
{
	const ir_node *sc = N(g, o->scat), *ga = N(g, o->gath), *bl = N(g, o->blocks);
	bool ok = true;
	moe_id tok = map[ga->args[1]], pos = map[sc->args[1]], z = map[sc->args[0]];
	int64_t zs[2] = {sc->shape[0], w}, os[2] = {1, w};
	if (w > 1) { /* as x ones [1, w]: exact */
		moe_id ones = ir_copy_node(d, g, sc->args[0], map);
		moe_node_set_type(d, ones, MOE_F32, os, 2);
		moe_node_set_float(d, ones, "value", 1.0);
		s = node(ctx, d, MOE_OP_MUL, s, ones, MOE_NONE, loc, &ok);
	}
	moe_id z1 = ir_copy_node(d, g, sc->args[0], map);
	moe_node_set_type(d, z1, MOE_F32, zs, 2);
	int64_t bsh[3] = {bl->shape[0], bl->shape[1], w};
	moe_id gq = node(ctx, d, MOE_OP_GATHER, q, tok, MOE_NONE, loc, &ok);
	moe_id gs = node(ctx, d, MOE_OP_GATHER, s, tok, MOE_NONE, loc, &ok);
	if (!ok)
		return false;
	moe_node_set_int(d, gq, "axis", 0);
	moe_node_set_int(d, gs, "axis", 0);
	moe_id sq = node(ctx, d, MOE_OP_SCATTER, z, pos, gq, loc, &ok);
	moe_id ss = node(ctx, d, MOE_OP_SCATTER, z1, pos, gs, loc, &ok);
	if (!ok)
		return false;
	*bq = ir_b_reshape(d, sq, 3, bl->shape, loc);
	*bs = ir_b_reshape(d, ss, 3, bsh, loc);
	moe_node_set_name(d, *bq, "blocks.q");
	moe_node_set_name(d, *bs, "blocks.scale");
	if (w > 1)
		*bs = ir_b_reduce(d, MOE_OP_REDUCE_MAX, *bs, 2, true, loc);
	return true;
}

/* x' = q x as on the block rows, under their mask rows: its value in d. */
static moe_id dequant_rows(moe_ctx *ctx, moe_graph *d, moe_id bq, moe_id bs, moe_id rows, moe_dtype t, moe_loc loc)
{
	bool ok = true;
	moe_id qf = t == MOE_F32 ? bq : ir_b_cast(d, bq, MOE_F32, loc);
	moe_node_set_valid(d, qf, rows);
	moe_id v = node(ctx, d, MOE_OP_MUL, qf, bs, MOE_NONE, loc, &ok);
	moe_node_set_valid(d, v, rows);
	moe_id out = t == MOE_F32 ? v : ir_b_cast(d, v, t, loc);
	moe_node_set_valid(d, out, rows);
	return ok ? out : MOE_NONE;
}

/* The dispatched rows (K T of them) pass through DM once: see the file's
 * comment for the bounds. */
static bool fits(const moe_graph *g, const actq *r, const moe_tcp_machine *m)
{
	int64_t K = 0;
	double dm = (double)tcp_dm_grant(m, TCP_DM_LAYER), val = (double)tcp_dm_grant(m, TCP_DM_VALUE);
	bool tm = tcp_w8a8_tok_major(g, N(g, r->gath)->args[1], N(g, r->x)->shape[0], &K);
	return tm ? 16.0 * (double)ir_numel(N(g, r->x)) <= dm : (double)ir_bytes(N(g, r->gath)) <= val;
}

static moe_graph *finish(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, moe_id *map, bool ok)
{
	moe_graph *out = tcp_rewrite_end(ctx, dev, g, map, ok);
	if (out && pass_dce(ctx, out, NULL, NULL) != MOE_OK) {
		ir_graph_free(out);
		return NULL;
	}
	return out;
}

/* ---- the rewrite of the loop ----
 * The body quantizes its `b` operand's rows xf = cast(rows) itself; the
 * rewrite moves that chain before the dispatch, onto x, as above, and the
 * loop takes two `b` operands in place of the rows: blocks.q (operand k, the
 * integers) and, appended, the rows' scales [G, B, 1]; the body's chain
 * becomes x' = q x as. */
typedef struct lform {
	moe_id loop, ba, rows;
	int k, nin;
	actq body, outer; /* the chain (body ids), the dispatch (outer ids) */
} lform;

static bool match_loop(const moe_graph *g, const uint32_t *nuse, moe_id l, lform *f)
{
	const ir_node *ln = N(g, l);
	const moe_graph *bg = ir_node_body(g, ln);
	const char *kinds = ir_attr_str(ln, "kinds", "");
	f->loop = l;
	f->nin = (int)strlen(kinds);
	if (!bg || f->nin >= IR_BODY_MAX_INPUTS)
		return false;
	uint32_t *bu = tcp_use_counts(g->ctx, bg);
	bool found = false;
	for (moe_id e = 0; e < bg->nnodes && !found; e++) {
		const ir_node *en = N(bg, e);
		if (en->op != MOE_OP_EINSUM || en->nargs != 2 || N(bg, en->args[1])->op != MOE_OP_DEQUANT ||
			strcmp(ir_attr_str(N(bg, en->args[1]), "act", "bf16"), "int8") || !match_chain(bg, en->args[0], &f->body))
			continue;
		const ir_node *xf = N(bg, f->body.xf), *an = N(bg, f->body.a);
		const ir_node *ba = xf->op == MOE_OP_CAST ? N(bg, xf->args[0]) : NULL;
		if (!ba || ba->op != MOE_OP_BLOCKARG || ir_blockarg_role_of(ba) != IR_BA_IN || bu[xf->args[0]] != 1 ||
			ba->dtype != an->dtype || an->dtype == MOE_F32 || an->valid == MOE_NONE)
			continue;
		f->ba = xf->args[0];
		f->rows = an->valid;
		f->k = (int)ir_attr_int(ba, "index", -1);
		if (f->k < 0 || f->k >= f->nin || kinds[f->k] != 'b')
			continue;
		moe_id blocks = ln->args[IR_BL_NCTRL + f->k];
		found = match_dispatch(g, nuse, blocks, &f->outer) && N(g, f->outer.x)->dtype == an->dtype;
	}
	ctx_free(g->ctx, bu, (bg->nnodes + 1) * sizeof *bu);
	return found;
}

/* The loop's body with the chain (inq) replaced: operand k's rows are the
 * integers, operand nin the scales. */
static bool loop_body(moe_ctx *ctx, moe_graph *nb, const moe_graph *bg, const lform *f, const bool *inq)
{
	moe_id *bm = ctx_alloc(ctx, (bg->nnodes + 1) * sizeof *bm);
	for (moe_id j = 0; j <= bg->nnodes; j++)
		bm[j] = MOE_NONE;
	bool ok = true;
	for (moe_id j = 0; j < bg->nnodes && ok; j++) {
		if (j == f->body.a) {
			const ir_node *an = N(bg, j);
			const int64_t sh[2] = {an->shape[0], 1};
			moe_id sa = ir_emit(nb, MOE_OP_BLOCKARG, MOE_F32, 2, sh, NULL, 0, an->loc);
			moe_node_set_str(nb, sa, "role", "in");
			moe_node_set_int(nb, sa, "index", f->nin);
			bm[j] = dequant_rows(ctx, nb, bm[f->ba], sa, bm[f->rows], (moe_dtype)an->dtype, an->loc);
			ok = bm[j] != MOE_NONE;
		} else if (!inq[j])
			bm[j] = ir_copy_node(nb, bg, j, bm);
	}
	moe_id y = ir_body_yield(bg);
	ok = ok && y != MOE_NONE && bm[y] != MOE_NONE;
	if (ok)
		moe_graph_add_output(nb, bm[y]);
	ctx_free(ctx, bm, (bg->nnodes + 1) * sizeof *bm);
	return ok;
}

/* The quantization before the dispatch, where x's scatter was: the body's
 * chain on x (its constants copied), then the dispatch of both. */
static bool loop_quant(moe_ctx *ctx, moe_graph *d, const moe_graph *g, const moe_graph *bg, const lform *f,
	const bool *inq, moe_id *map, int64_t w, moe_id *bq, moe_id *bs)
{
	moe_id *m2 = ctx_alloc(ctx, (bg->nnodes + 1) * sizeof *m2);
	for (moe_id j = 0; j <= bg->nnodes; j++)
		m2[j] = MOE_NONE;
	bool ok = true;
	for (moe_id j = f->body.xf + 1; j < f->body.a && ok; j++)
		for (uint32_t k = 0; k < N(bg, j)->nargs && inq[j]; k++) {
			moe_id a = N(bg, j)->args[k];
			if (a == MOE_NONE || inq[a] || m2[a] != MOE_NONE)
				continue;
			ok = N(bg, a)->op == MOE_OP_CONST;
			if (ok)
				m2[a] = ir_copy_node(d, bg, a, m2);
		}
	const ir_node *an = N(bg, f->body.a);
	moe_id q, s, x = map[f->outer.x];
	ok = ok && quant_x(ctx, d, bg, &f->body, inq, m2, ir_b_cast(d, x, MOE_F32, an->loc), 0, &q, &s);
	ctx_free(ctx, m2, (bg->nnodes + 1) * sizeof *m2);
	return ok && dispatch(ctx, d, g, &f->outer, map, q, s, w, an->loc, bq, bs);
}

static moe_graph *act_once_loop(moe_ctx *ctx, const moe_graph *g, const lform *f, int64_t w)
{
	const ir_node *ln = N(g, f->loop);
	const moe_graph *bg = ir_node_body(g, ln);
	bool *inq = ctx_alloc(ctx, (bg->nnodes + 1) * sizeof *inq);
	memset(inq, 0, (bg->nnodes + 1) * sizeof *inq);
	bool ok = chain(bg, &f->body, inq);
	moe_graph *dev;
	moe_id *map = tcp_rewrite_begin(ctx, g, &dev), bq = MOE_NONE, bs = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes && ok; i++) {
		if (i == f->outer.scat) { /* its operands are mapped here */
			ok = loop_quant(ctx, dev, g, bg, f, inq, map, w, &bq, &bs);
			continue;
		}
		if (i == f->outer.gath || i == f->outer.blocks)
			continue;
		if (i != f->loop) {
			map[i] = ir_copy_node(dev, g, i, map);
			continue;
		}
		uint32_t bi;
		moe_graph *nb = ir_body_new(dev, &bi);
		ok = loop_body(ctx, nb, bg, f, inq);
		moe_id args[IR_BL_NCTRL + IR_BODY_MAX_INPUTS + 1];
		uint32_t na = 0;
		for (uint32_t k = 0; k < ln->nargs; k++)
			args[na++] = k == IR_BL_NCTRL + (uint32_t)f->k ? bq : map[ln->args[k]];
		args[na++] = bs;
		moe_id nl = moe_node_new(dev, MOE_OP_BLOCK_LOOP, args, na, ln->loc);
		char kinds[IR_BODY_MAX_INPUTS + 2];
		snprintf(kinds, sizeof kinds, "%sb", ir_attr_str(ln, "kinds", ""));
		for (uint32_t k = 0; k < ln->nattrs; k++)
			if (strcmp(ln->attrs[k].key, "kinds"))
				ir_attr_set(dev, N(dev, nl), &ln->attrs[k]);
		moe_node_set_str(dev, nl, "kinds", kinds);
		if (ln->name)
			moe_node_set_name(dev, nl, ln->name);
		N(dev, nl)->body = bi;
		ok = ok && ir_infer(ctx, dev, nl) == MOE_OK;
		map[i] = nl;
	}
	ctx_free(ctx, inq, (bg->nnodes + 1) * sizeof *inq);
	return finish(ctx, dev, g, map, ok);
}

moe_graph *tcp_w8a8_act_once(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	uint32_t nn = g->nnodes, *nuse = tcp_use_counts(ctx, g);
	lform f;
	memset(&f, 0, sizeof f);
	bool found = false;
	for (moe_id e = 0; e < nn && !found; e++)
		found = N(g, e)->op == MOE_OP_BLOCK_LOOP && match_loop(g, nuse, e, &f);
	ctx_free(ctx, nuse, (nn + 1) * sizeof *nuse);
	int64_t w = m->hbm_granule >= 8 && m->hbm_granule <= 4096 ? m->hbm_granule / 4 : 1;
	return found && fits(g, &f.outer, m) ? act_once_loop(ctx, g, &f, w) : NULL;
}
