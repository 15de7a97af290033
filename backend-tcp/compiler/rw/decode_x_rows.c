/* backend-tcp/compiler/rw/decode_x_rows.c: rewrite `decode-x-rows`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * At T = 1 sched-build's dispatch gathers x's one row n = K times into DM
 * (`dma.gather` with rows=1: every index is row 0), scatters the n rows into
 * the HBM grid by the byte offsets j * row (a pass x.mul(ctr, row bytes)
 * copied into HBM) and the grid's readers copy its rows into DM: three DMA
 * commands on the one in-order DMA context before the block list's
 * `dma.spm`, which the first weight fetch waits for. Every row of the grid
 * then holds x's row, so each reader reads x's row itself (row stride 0) and
 * the gather, the scatter and the passes and copies only they read go; a
 * reader after the scatter in its region takes the scatter's place.
 *
 * Values are unchanged: the scatter's offsets are 0, row, ... (n - 1) row,
 * so it writes each of the grid's n rows (the grid is exactly n rows) with
 * the gathered row, s0's row 0; a reader's element at the grid's element e
 * is x's element e mod row, which the new view reads (its strides multiples
 * of the row but the last, 1, within one row). Nothing else writes the grid.
 * Every op that waited for a dropped op waits for what it waited for (the
 * grid's readers need nothing: x is an input). */
#include "backend-tcp/compiler/rewrites.h"

typedef struct dxr {
	ts_id ga, sc, cp, pp, tk; /* gather, scatter, offsets' copy and pass, the index pass */
	ts_id d, h, oh, od, ix, x; /* gathered rows, grid, offsets HBM/DM, index list, x */
	int64_t row, n, xbase;
} dxr;

/* the only op writing buffer b, or TS_NONE */
static ts_id writer(const tcp_sched *s, ts_id b)
{
	ts_id w = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_op_writes(&s->op[o], b)) {
			if (w != TS_NONE)
				return TS_NONE;
			w = o;
		}
	return w;
}

static bool readers_besides(const tcp_sched *s, ts_id b, ts_id except)
{
	if (ts_buf_spm_read(s, b))
		return true;
	for (ts_id o = 0; o < s->nop; o++)
		if (o != except && ts_op_reads(&s->op[o], b))
			return true;
	return false;
}

/* whether op w writes [n] i32 offsets j * imm (imm = row bytes) at view dv */
static bool offsets_pass(const tcp_sched *s, ts_id w, int64_t n, int64_t imm)
{
	const tcp_insn *in = &s->op[w].in;
	const tcp_view *d = &in->v[TCP_V_DST];
	if (in->op != TCP_OP_TU_VEC || in->ndim != 1 || in->dim[0] != n || in->nstep != 1 || in->vreg >= 0 ||
		d->reg >= 0 || d->base != 0 || d->stride[0] != 1 || in->v[TCP_V_S0].t >= 0 || in->v[TCP_V_S1].t >= 0 ||
		in->v[TCP_V_S2].t >= 0 || ts_op_in_loop(s, w))
		return false;
	const tcp_step *st = &in->step[0];
	return st->op == TCP_V_IMUL && st->x == TCP_SRC_CTR && st->ctr == 0 && st->y == TCP_SRC_IMM &&
	       (int64_t)st->imm == imm;
}

/* the scatter sc of x's row into a whole grid, its gather and offsets */
static bool dispatch_of(const tcp_sched *s, ts_id sc, dxr *x)
{
	const tcp_insn *in = &s->op[sc].in;
	const tcp_view *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1], *dv = &in->v[TCP_V_DST];
	if (in->op != TCP_OP_DMA_SCATTER || !(in->flags & TCP_F_HBMIDX) || in->ndim != 3 || in->dim[0] != 1 ||
		in->vreg >= 0 || ts_op_in_loop(s, sc) || sv->t < 0 || dv->t < 0 || iv->t < 0 || sv->reg >= 0 ||
		dv->reg >= 0 || iv->reg >= 0)
		return false;
	x->sc = sc;
	x->n = in->dim[1];
	x->row = in->dim[2];
	x->d = (ts_id)sv->t;
	x->h = (ts_id)dv->t;
	x->oh = (ts_id)iv->t;
	const ts_buf *hb = &s->buf[x->h];
	if (in->rows != x->n || sv->base != 0 || sv->stride[1] != x->row || sv->stride[2] != 1 || dv->base != 0 ||
		dv->stride[1] != x->row || dv->stride[2] != 1 || iv->base != 0 || iv->stride[1] != 1 ||
		hb->space != TCP_HBM || hb->kind != TCP_T_SCRATCH || hb->slots != 1 ||
		ts_buf_numel(hb) != x->n * x->row || writer(s, x->h) != sc || ts_buf_spm_read(s, x->h))
		return false;
	/* the offsets: an HBM copy of a DM list j * row bytes */
	x->cp = writer(s, x->oh);
	if (x->cp == TS_NONE || ts_op_in_loop(s, x->cp) || !ts_op_has_dep(&s->op[sc], x->cp, 0))
		return false;
	const tcp_insn *c = &s->op[x->cp].in;
	const tcp_view *cd = &c->v[TCP_V_DST], *cs = &c->v[TCP_V_S0];
	if (c->op != TCP_OP_DMA_COPY || c->ndim != 1 || c->dim[0] != x->n || c->vreg >= 0 || cd->base != 0 ||
		cd->reg >= 0 || cd->stride[0] != 1 || cs->t < 0 || cs->reg >= 0 || cs->base != 0 || cs->stride[0] != 1 ||
		s->buf[x->oh].space != TCP_HBM || s->buf[x->oh].kind != TCP_T_SCRATCH)
		return false;
	x->od = (ts_id)cs->t;
	x->pp = writer(s, x->od);
	if (x->pp == TS_NONE || !ts_op_has_dep(&s->op[x->cp], x->pp, 0) ||
		!offsets_pass(s, x->pp, x->n, x->row * (int64_t)moe_dtype_size((moe_dtype)hb->dtype)))
		return false;
	/* the gathered rows: every one the source's row 0 (rows=1) */
	x->ga = writer(s, x->d);
	if (x->ga == TS_NONE || ts_op_in_loop(s, x->ga) || !ts_op_has_dep(&s->op[sc], x->ga, 0) || s->buf[x->d].space != TCP_DM)
		return false;
	const tcp_insn *g = &s->op[x->ga].in;
	const tcp_view *gs = &g->v[TCP_V_S0], *gi = &g->v[TCP_V_S1], *gd = &g->v[TCP_V_DST];
	if (g->op != TCP_OP_DMA_GATHER || g->ndim != 3 || g->dim[0] != 1 || g->dim[1] != x->n ||
		g->dim[2] != x->row || g->rows != 1 || g->vreg >= 0 || (g->flags & TCP_F_HBMIDX) || gd->base != 0 ||
		gd->reg >= 0 || gd->stride[1] != x->row || gd->stride[2] != 1 || gs->t < 0 || gs->reg >= 0 ||
		gs->stride[2] != 1 || gi->t < 0)
		return false;
	x->x = (ts_id)gs->t;
	x->xbase = gs->base;
	x->ix = (ts_id)gi->t;
	x->tk = writer(s, x->ix);
	const ts_buf *xb = &s->buf[x->x];
	return xb->space == TCP_HBM && (xb->kind == TCP_T_INPUT || xb->kind == TCP_T_CONST) &&
	       xb->dtype == hb->dtype && s->buf[x->d].dtype == hb->dtype && writer(s, x->x) == TS_NONE &&
	       !readers_besides(s, x->d, sc);
}

/* whether view v of op o (reading the grid) reads within one row of it:
 * strides multiples of the row but the last, 1, its extent inside the row */
static bool row_view(const tcp_insn *in, const tcp_view *v, int64_t row)
{
	int nd = in->ndim;
	if (nd < 1 || v->stride[nd - 1] != 1 || (v->reg >= 0 && v->scale % row != 0))
		return false;
	for (int k = 0; k + 1 < nd; k++)
		if (v->stride[k] % row != 0)
			return false;
	return v->base % row + in->dim[nd - 1] <= row;
}

/* whether every reader of the grid reads it through such views */
static bool readers_ok(const tcp_sched *s, const dxr *x)
{
	bool any = false;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (!ts_op_reads(&s->op[o], x->h))
			continue;
		if (in->op != TCP_OP_DMA_COPY || in->v[TCP_V_DST].t == (int32_t)x->h)
			return false;
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
			if (in->v[w].t == (int32_t)x->h && !row_view(in, &in->v[w], x->row))
				return false;
		any = true;
	}
	return any;
}

static bool find(const tcp_sched *s, dxr *x)
{
	for (ts_id o = 0; o < s->nop; o++)
		if (dispatch_of(s, o, x) && readers_ok(s, x))
			return true;
	return false;
}

/* adds to o the dependencies of dropped op q (through other dropped ops) */
static void inherit(tcp_sched *s, const uint8_t *drop, ts_id o, ts_id q, int depth)
{
	for (uint32_t j = 0; j < s->op[q].ndep; j++) {
		ts_id p = s->op[q].dep[j];
		if (drop[p]) {
			if (depth < 8)
				inherit(s, drop, o, p, depth + 1);
			continue;
		}
		if (p != o && !ts_op_has_dep(&s->op[o], p, s->op[q].dist[j]))
			ts_add_dep(s, o, p, s->op[q].dist[j]);
	}
}

/* the index of op o among region rg's items, or -1 */
static int64_t item_of(const ts_region *g, ts_id o)
{
	for (uint32_t k = 0; k < g->nitem; k++)
		if (g->item[k] == (TS_ITEM_OP | o))
			return k;
	return -1;
}

/* A reader standing after the scatter in its region moves to the scatter's
 * place and waits for the DMA command that stood before the dispatch's
 * gather there (kept), so the DMA commands routing reads keep their turn on
 * the in-order DMA context ahead of it (the list scheduler, which runs
 * later, would otherwise issue a copy that waits for nothing first). */
static void take_place(tcp_sched *s, ts_id o, const dxr *x, const uint8_t *drop)
{
	ts_region *g = &s->rg[s->op[x->sc].region];
	int64_t at = item_of(g, x->sc), from = s->op[o].region == s->op[x->sc].region ? item_of(g, o) : -1;
	int64_t ga = item_of(g, x->ga);
	if (at < 0 || from <= at)
		return;
	for (int64_t k = from; k > at; k--)
		g->item[k] = g->item[k - 1];
	g->item[at] = TS_ITEM_OP | o;
	for (int64_t k = ga - 1; k >= 0; k--) {
		ts_id p = TS_ITEM_ID(g->item[k]);
		if (TS_ITEM_KIND(g->item[k]) == TS_ITEM_OP && !drop[p] && s->op[p].ctx == s->op[o].ctx) {
			ts_add_dep(s, o, p, 0);
			return;
		}
	}
}

static void rewrite(tcp_sched *s, const dxr *x, uint16_t feature)
{
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	drop[x->ga] = drop[x->sc] = 1;
	drop[x->cp] = !readers_besides(s, x->oh, x->sc);
	drop[x->pp] = drop[x->cp] && !readers_besides(s, x->od, x->cp);
	if (x->tk != TS_NONE && !ts_op_in_loop(s, x->tk))
		drop[x->tk] = !readers_besides(s, x->ix, x->ga);
	/* the grid's readers read x's row; the first of them pins what lived
	 * only at the dropped ops */
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id first = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		tcp_insn *in = &s->op[o].in;
		if (!ts_op_reads(&s->op[o], x->h))
			continue;
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
			if (in->v[w].t == (int32_t)x->h)
				ts_view_fixed_row(in, &in->v[w], (int32_t)x->x, x->xbase + in->v[w].base % x->row);
		s->op[o].feature = feature;
		/* its dependencies on the dispatch go: x is an input */
		ts_op_drop_deps(&s->op[o], drop);
		take_place(s, o, x, drop);
		if (first == TS_NONE || pos[o] < pos[first])
			first = o;
	}
	for (ts_id o = 0; o < s->nop; o++) {
		if (drop[o])
			continue;
		for (uint32_t j = 0; j < s->op[o].ndep; j++)
			if (drop[s->op[o].dep[j]])
				inherit(s, drop, o, s->op[o].dep[j], 0);
	}
	ts_drop_ops_to(s, drop, first, pos);
	ctx_free(s->ctx, pos, 0);
	ctx_free(s->ctx, drop, 0);
}

TS_RW_EACH_SITE(decode_x_rows, dxr, rewrite)
