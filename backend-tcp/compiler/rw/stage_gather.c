/* backend-tcp/compiler/rw/stage_gather.c: rewrite `stage-gather`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With token-scatter and stage-rows, the dispatch moves x's rows twice on the
 * in-order DMA context before the first weight fetch: one dma.scatter of the
 * T K pairs' rows (x's DM copy read K times) into the HBM grid of G B rows,
 * then one copy of that grid into DM for the loop (whole, or the first h
 * blocks in each case of count-stage's classes region on $nb). The rewrite
 * scatters each pair's token instead of its row, as dispatch-gather does: a
 * tu.vec with no dependency writes t times x's row bytes (the byte offset of
 * pair (t, k)'s row in x) into the first word of row (t, k) of a DM buffer of
 * one-granule rows (a scattered row of part of a granule is a
 * read-modify-write of it), the scatter moves those rows to pos x granule
 * bytes (the byte-offset pass's immediate) into the grid, now an i32 list of
 * G B such rows (HBM scratch starts zeroed), and each copy of h blocks becomes
 * a dma.gather flags=scaled of x's rows from HBM by those blocks' rows of the
 * list straight into the staged DM grid. The scatter then moves a granule per
 * pair instead of a row, which where a row is not a whole number of granules
 * (gpt-oss-20b: 5760 bytes) also saves the read-modify-write of its last one.
 *
 * A peephole row: it is priced on the list-scheduled program it leaves as it
 * is (the new pass stands first in the top region). Priced before the list
 * scheduler it predicted gains at T <= 64 that the scheduled program lost.
 *
 * Values: row j < rows of a copied block g is x's row of the pair at grid row
 * g B + j, as the grid held. A padding row (j at or past its block's count)
 * names byte offset 0, so it holds x's row 0 where it held zeros, and so does
 * every row of a copied block at or past nb: the body reads only blocks below
 * nb, each under valid=$rows or row by row, and the combine reads only the
 * pairs' rows, so y is unchanged (same_y.py).
 *
 * Applies to sched-build's dispatch after token-scatter: the scatter's source
 * is x's DM copy (one dma.copy of the HBM input x) through a view reading
 * row t for every k, the grid is written by that scatter alone and read by
 * the staged copies alone (whose DM grid the body reads block by block), and
 * the byte offsets are one tu.vec multiply and its copy to HBM read by
 * nothing else. */
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

typedef struct sg {
	ts_id sc, vb, cp;          /* the scatter, the byte offsets' pass and its copy */
	ts_id grid, stg, x, ib;    /* the HBM grid, the staged DM grid, x in HBM, the offsets in DM */
	int64_t T, K, D, GB, B, p; /* p: the staged grid's block stride */
} sg;

/* The scatter of x's DM copy into the grid (dims [T, K, D]); fills the
 * dispatch's sizes and buffers. */
static bool scatter_of(const tcp_sched *s, ts_id o, sg *x)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1];
	if (in->op != TCP_OP_DMA_SCATTER || in->flags != TCP_F_SCALED || in->vreg >= 0 || in->ndim != 3 ||
		s->op[o].region != s->top || dv->t < 0 || sv->t < 0 || iv->t < 0 || dv->reg >= 0 || sv->reg >= 0 ||
		iv->reg >= 0 || dv->base || sv->base || iv->base)
		return false;
	int64_t T = in->dim[0], K = in->dim[1], D = in->dim[2];
	if (!ts_view_strides(dv, 3, (const int64_t[]){0, D, 1}) || !ts_view_strides(sv, 3, (const int64_t[]){D, 0, 1}) ||
		!ts_view_strides(iv, 2, (const int64_t[]){K, 1}))
		return false;
	const ts_buf *gb = &s->buf[dv->t], *xb = &s->buf[sv->t], *ib = &s->buf[iv->t];
	if (gb->space != TCP_HBM || gb->kind != TCP_T_SCRATCH || xb->space != TCP_DM || gb->dtype != xb->dtype ||
		ts_buf_numel(gb) != in->rows * D || ts_buf_numel(xb) != T * D || ib->space != TCP_HBM ||
		ib->kind != TCP_T_SCRATCH || ib->dtype != MOE_I32 || ts_buf_numel(ib) != T * K)
		return false;
	x->sc = o;
	x->T = T, x->K = K, x->D = D, x->GB = in->rows;
	x->grid = (ts_id)dv->t;
	/* x's DM copy: one whole copy of an HBM input [T, D] */
	uint32_t nw, nr;
	ts_id w, r;
	ts_buf_uses(s, (ts_id)sv->t, &nw, &nr, &w, &r);
	if (nw != 1)
		return false;
	const tcp_insn *c = &s->op[w].in;
	const tcp_view *cd = &c->v[TCP_V_DST], *cs = &c->v[TCP_V_S0];
	if (c->op != TCP_OP_DMA_COPY || c->flags || c->vreg >= 0 || c->ndim != 2 || c->dim[0] != T || c->dim[1] != D ||
		cd->base || cs->base || cd->reg >= 0 || cs->reg >= 0 || cs->t < 0 ||
		!ts_view_strides(cd, 2, (const int64_t[]){D, 1}) || !ts_view_strides(cs, 2, (const int64_t[]){D, 1}) ||
		s->buf[cs->t].space != TCP_HBM || s->buf[cs->t].kind != TCP_T_INPUT || s->buf[cs->t].dtype != gb->dtype ||
		ts_buf_numel(&s->buf[cs->t]) != T * D)
		return false;
	x->x = (ts_id)cs->t;
	ts_buf_uses(s, x->x, &nw, &nr, &w, &r);
	if (nw)
		return false;
	/* the byte offsets: pos x row bytes, one multiply pass copied to HBM,
	 * each read once */
	ts_buf_uses(s, (ts_id)iv->t, &nw, &nr, &w, &r);
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)gb->dtype);
	return nw == 1 && nr == 1 && r == o && ts_offsets_pass(s, (ts_id)iv->t, D * es, T * K, &x->cp, &x->ib, &x->vb) &&
	       s->buf[x->ib].layout.split == TS_SPLIT_FLIT && T * D * es <= INT32_MAX &&
	       x->GB * ts_granule_words(s) * 4 <= INT32_MAX;
}

/* Whether op o is a copy of the first h <= G blocks of the grid into the
 * staged DM grid (the same for every such copy: stage-rows' copy, or the
 * cases of count-stage's classes region); the first sets x->stg and x->p. */
static bool staged_copy(const tcp_sched *s, ts_id o, sg *x)
{
	const ts_loop *l = &s->loop[0];
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0];
	int64_t P = x->B * x->D;
	if (in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->dim[0] < 1 || in->dim[0] > l->G || in->dim[1] != P ||
		in->vreg >= 0 || in->flags || d->t < 0 || y->t != (int32_t)x->grid || d->reg >= 0 || y->reg >= 0 ||
		d->base || y->base || d->stride[0] < P || d->stride[1] != 1 || y->stride[0] != P || y->stride[1] != 1 ||
		ts_region_within(s, s->op[o].region, l->region))
		return false;
	if (x->stg != TS_NONE)
		return (ts_id)d->t == x->stg && d->stride[0] == x->p;
	const ts_buf *b = &s->buf[d->t];
	if (b->space != TCP_DM || b->slots != 1 || b->dtype != s->buf[x->x].dtype ||
		ts_buf_numel(b) != l->G * d->stride[0])
		return false;
	x->stg = (ts_id)d->t;
	x->p = d->stride[0];
	return true;
}

static bool find(const tcp_sched *s, sg *x)
{
	memset(x, 0, sizeof *x);
	x->stg = TS_NONE;
	if (!s->m || s->nloop != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	if (l->g == TS_NONE || l->G < 1)
		return false;
	bool found = false;
	for (ts_id o = 0; o < s->nop && !found; o++)
		found = scatter_of(s, o, x);
	if (!found || x->GB % l->G)
		return false;
	x->B = x->GB / l->G;
	/* the grid: written by the scatter, read by the staged copies alone */
	uint32_t nw, nr;
	ts_id w, r;
	ts_buf_uses(s, x->grid, &nw, &nr, &w, &r);
	if (nw != 1 || !nr || ts_buf_spm_read(s, x->grid))
		return false;
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_op_reads(&s->op[o], (int32_t)x->grid) && !staged_copy(s, o, x))
			return false;
	if (x->stg == TS_NONE)
		return false;
	uint8_t *skip = ctx_alloc(s->ctx, s->nop + 1);
	for (ts_id o = 0; o < s->nop; o++)
		skip[o] = ts_op_reads(&s->op[o], (int32_t)x->grid);
	bool ok = ts_buf_read_per_block(s, l, (int32_t)x->stg, x->p, skip);
	ctx_free(s->ctx, skip, 0);
	return ok;
}

bool ts_rw_stage_gather_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sg x;
	return find(s, &x);
}

moe_status ts_rw_stage_gather_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	sg x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	int64_t W = ts_granule_words(s), TK = x.T * x.K, n = TK * W;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)s->buf[x.x].dtype);
	/* the pairs' tokens as byte offsets into x, the first word of rows of W
	 * words, laid out as the offsets' DM buffer is */
	ts_id tok = ts_add_buf(s, "tokens", TCP_DM, TCP_T_SCRATCH, MOE_I32, 1, &n);
	ts_buf *tb = &s->buf[tok];
	tb->layout = ts_layout_spread(s, s->buf[x.ib].layout, n * 4);
	tb->feature = feature;
	tb->node = s->buf[x.ib].node;
	tcp_insn v = tcp_b_vec(2, (const int64_t[]){x.T, x.K}, tcp_b_view((int32_t)tok, 0, 2, (const int64_t[]){x.K * W, W}));
	tcp_b_step(&v, TCP_V_IMUL, TCP_SRC_CTR, TCP_SRC_IMM, (uint32_t)(x.D * es));
	v.flags |= TCP_F_ROUTE; /* a lane's word lands on the slice holding its row */
	ts_id vt = ts_add_op(s, s->top, &v, TS_PH_ROUTING);
	s->op[vt].feature = feature;
	s->op[vt].node = s->op[x.vb].node;
	/* the pass depends on nothing: it stands first in the top region */
	ts_region *top = &s->rg[s->top];
	uint32_t it = top->item[--top->nitem];
	memmove(&top->item[1], &top->item[0], top->nitem * sizeof *top->item);
	top->item[0] = it;
	top->nitem++;
	tb->life = TS_LIFE_SPAN;
	tb->first = vt;
	tb->last = x.sc;
	/* the offsets now name granule rows of the list */
	s->op[x.vb].in.step[0].imm = (uint32_t)(W * 4);
	s->op[x.vb].feature = feature;
	s->op[x.vb].cost = 0;
	/* the grid, the list of G B such rows */
	ts_buf *gb = &s->buf[x.grid];
	char name[160];
	snprintf(name, sizeof name, "%.*s.tokens", 140, gb->name);
	gb->name = ir_strdup(&s->arena, name);
	gb->dtype = MOE_I32;
	gb->rank = 1;
	memset(gb->shape, 0, sizeof gb->shape);
	gb->shape[0] = x.GB * W;
	tcp_insn *sc = &s->op[x.sc].in;
	sc->dim[2] = W;
	sc->v[TCP_V_DST] = tcp_b_view((int32_t)x.grid, 0, 3, (const int64_t[]){0, W, 1});
	sc->v[TCP_V_S0] = tcp_b_view((int32_t)tok, 0, 3, (const int64_t[]){x.K * W, W, 1});
	s->op[x.sc].feature = feature;
	s->op[x.sc].cost = 0;
	ts_add_dep_once(s, x.sc, vt, 0);
	/* each staged copy of the first h blocks: a gather of x's rows by those
	 * blocks' rows of the list */
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == x.sc || !ts_op_reads(&s->op[o], (int32_t)x.grid))
			continue;
		int64_t h = s->op[o].in.dim[0];
		tcp_view dst = tcp_b_view((int32_t)x.stg, 0, 3, (const int64_t[]){x.p, x.D, 1});
		tcp_view src = tcp_b_view((int32_t)x.x, 0, 3, (const int64_t[]){0, x.D, 1});
		tcp_view idx = tcp_b_view((int32_t)x.grid, 0, 3, (const int64_t[]){x.B * W, W, 0});
		tcp_insn g = tcp_b_dma_gather(3, (const int64_t[]){h, x.B, x.D}, dst, src, idx, x.T);
		g.flags |= TCP_F_HBMIDX;
		ts_set_insn(s, o, &g, feature);
	}
	return MOE_OK;
}
