/* backend-tcp/compiler/rw/grid_combine.c: rewrite `grid-combine`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After `dm-results` the loop's value is a DM grid of G rows, copied into
 * the HBM result after the loop; where the combine then copies every row of
 * that HBM result back into a DM buffer (a decode, whose pairs fill the grid
 * in order), the two copies only move the same bytes out and in: two or
 * three DMA commands on the critical path after the last block. The rewrite
 * drops the grid's copies into the HBM result and the combine's copy back,
 * and the combine's readers of the DM copy read the grid in place (row r at
 * r x the grid's row pitch instead of r x n). Values are unchanged: each
 * reader sees the bytes the copy held, which are the grid's rows, every one
 * written by a block because the block count is the constant G; the readers
 * wait for what the dropped copies waited for (the last block's writers). */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* The ops the rewrite drops and the buffers it joins. */
typedef struct gc {
	ts_id grid, res, cp;   /* DM grid, HBM result, DM copy of the result */
	ts_id rd;              /* the combine's copy of the result */
	int64_t n, np;         /* elements of a row; the grid's row pitch */
} gc;

static bool plain(const tcp_view *v)
{
	return v->t >= 0 && v->reg < 0;
}

/* whether op o is a dma.copy of rows of grid g (pitch np) into the same rows
 * of buffer r (pitch n), through views no scalar moves */
static bool row_copy(const tcp_sched *s, ts_id o, ts_id g, ts_id r, int64_t n, int64_t np)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
	return in->op == TCP_OP_DMA_COPY && in->ndim == 2 && in->vreg < 0 && plain(d) && plain(a) &&
	       (ts_id)d->t == r && (ts_id)a->t == g && in->dim[1] == n && d->stride[0] == n && d->stride[1] == 1 &&
	       a->stride[0] == np && a->stride[1] == 1 && d->base % n == 0 && a->base % np == 0 &&
	       d->base / n == a->base / np && d->base / n + in->dim[0] <= s->loop[0].G;
}

/* whether view v of a reader of the copy moves to the grid: base 0, its
 * contiguous axis within a row, its row axis within the G rows */
static bool row_view(const tcp_insn *in, const tcp_view *v, int64_t n, int64_t G)
{
	if (v->reg >= 0 || v->base != 0)
		return false;
	for (int k = 0; k < in->ndim; k++)
		if (in->dim[k] > 1 && !((v->stride[k] == 0) || (v->stride[k] == 1 && in->dim[k] <= n) ||
					 (v->stride[k] == n && in->dim[k] <= G)))
			return false;
	return true;
}

static bool find(const tcp_sched *s, gc *x)
{
	if (s->nloop != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_scalar *nb = &s->sc[l->nb];
	if (nb->kind != TS_SC_CONST || nb->imm != l->G)
		return false;
	/* the combine's copy: the only reader of an HBM scratch buffer, outside
	 * the loop, copying all of it into a one-slot DM buffer of its shape */
	x->rd = TS_NONE;
	for (ts_id o = 0; o < s->nop && x->rd == TS_NONE; o++) {
		const tcp_insn *in = &s->op[o].in;
		const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
		if (in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->dim[0] != l->G || in->dim[1] < 2 ||
			in->vreg >= 0 || !plain(d) || !plain(a) || d->base || a->base || d->stride[0] != in->dim[1] ||
			a->stride[0] != in->dim[1] || d->stride[1] != 1 || a->stride[1] != 1 ||
			ts_region_within(s, s->op[o].region, l->region))
			continue;
		const ts_buf *rb = &s->buf[a->t], *cb = &s->buf[d->t];
		if (rb->space == TCP_HBM && rb->kind == TCP_T_SCRATCH && cb->space == TCP_DM &&
			cb->kind == TCP_T_SCRATCH && cb->slots == 1 && cb->dtype == rb->dtype &&
			ts_buf_numel(rb) == l->G * in->dim[1] && ts_buf_numel(cb) == l->G * in->dim[1]) {
			x->rd = o;
			x->res = (ts_id)a->t;
			x->cp = (ts_id)d->t;
			x->n = in->dim[1];
		}
	}
	if (x->rd == TS_NONE)
		return false;
	/* the grid: what the result's first writer copies from */
	x->grid = TS_NONE;
	bool whole = false;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		for (int w = 0; w < TCP_NVIEW; w++) {
			const tcp_view *v = &in->v[w];
			if (o == x->rd || (v->t != (int32_t)x->res && v->t != (int32_t)x->cp))
				continue;
			if ((ts_id)v->t == x->cp) { /* a reader of the copy, after the loop */
				if (w == TCP_V_DST || ts_region_within(s, s->op[o].region, l->region) ||
					!row_view(in, v, x->n, l->G))
					return false;
				continue;
			}
			if (w != TCP_V_DST || ts_region_within(s, s->op[o].region, l->body))
				return false;
			if (x->grid == TS_NONE) {
				x->grid = (ts_id)in->v[TCP_V_S0].t;
				const ts_buf *gb = &s->buf[x->grid];
				if (in->v[TCP_V_S0].t < 0 || gb->space != TCP_DM || gb->rank != 2 || gb->shape[0] != l->G ||
					gb->dtype != s->buf[x->res].dtype || gb->slots != 1)
					return false;
				x->np = gb->shape[1];
			}
			if (!row_copy(s, o, x->grid, x->res, x->n, x->np))
				return false;
			whole |= in->dim[0] == l->G;
		}
	}
	if (x->grid == TS_NONE || !whole)
		return false;
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD &&
			(s->sc[c].buf == x->res || s->sc[c].buf == x->cp || s->sc[c].buf == x->grid))
			return false;
	return true;
}

bool ts_rw_grid_combine_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	gc x;
	return find(s, &x);
}

/* whether op o is one the rewrite drops */
static bool dropped(const tcp_sched *s, const gc *x, ts_id o)
{
	return o == x->rd || s->op[o].in.v[TCP_V_DST].t == (int32_t)x->res;
}

/* adds to o the dependencies of dropped op q (through other dropped ops) */
static void inherit(tcp_sched *s, const gc *x, ts_id o, ts_id q, int depth)
{
	for (uint32_t j = 0; j < s->op[q].ndep; j++) {
		ts_id p = s->op[q].dep[j];
		if (dropped(s, x, p)) {
			if (depth < 8)
				inherit(s, x, o, p, depth + 1);
			continue;
		}
		bool have = false;
		for (uint32_t k = 0; k < s->op[o].ndep && !have; k++)
			have = s->op[o].dep[k] == p;
		if (!have)
			ts_add_dep(s, o, p, 0);
	}
}

/* removes the dropped ops (ts_drop_ops) */
static void compact(tcp_sched *s, const gc *x)
{
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	for (ts_id o = 0; o < s->nop; o++)
		drop[o] = dropped(s, x, o);
	ts_drop_ops(s, drop);
	ctx_free(s->ctx, drop, 0);
}

moe_status ts_rw_grid_combine_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	gc x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	/* the copy's readers read the grid and wait for what the dropped ops
	 * waited for; the first and last of them bound the grid's and the copy's
	 * spans */
	ts_id first = TS_NONE, last = TS_NONE;
	uint32_t *pos = ctx_alloc(s->ctx, s->nop * sizeof *pos);
	ts_op_positions(s, pos);
	for (ts_id o = 0; o < s->nop; o++) {
		ts_op *p = &s->op[o];
		bool reads = false;
		for (int w = 0; w < TCP_NVIEW; w++)
			if (p->in.v[w].t == (int32_t)x.cp && o != x.rd) {
				tcp_view *v = &p->in.v[w];
				v->t = (int32_t)x.grid;
				for (int k = 0; k < p->in.ndim; k++)
					if (v->stride[k] == x.n && p->in.dim[k] > 1)
						v->stride[k] = x.np;
				reads = true;
			}
		if (!reads)
			continue;
		p->feature = feature;
		bool waits = false;
		for (uint32_t j = 0; j < p->ndep; j++)
			waits |= dropped(s, &x, p->dep[j]);
		if (waits)
			inherit(s, &x, o, o, 0);
		if (first == TS_NONE || pos[o] < pos[first])
			first = o;
		if (last == TS_NONE || pos[o] > pos[last])
			last = o;
	}
	ctx_free(s->ctx, pos, 0);
	if (first == TS_NONE)
		return MOE_ERR_INVALID;
	/* the grid lives from its first writer to the last reader; the copy,
	 * read by nothing now, only at the first reader */
	ts_buf *gb = &s->buf[x.grid], *cb = &s->buf[x.cp];
	if (gb->life == TS_LIFE_SPAN)
		gb->last = last;
	cb->life = TS_LIFE_SPAN;
	cb->first = cb->last = first;
	/* a buffer whose span ends or starts at a dropped op: pinned to the first reader */
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life != TS_LIFE_SPAN)
			continue;
		if (f->first != TS_NONE && dropped(s, &x, f->first))
			f->first = first;
		if (f->last != TS_NONE && dropped(s, &x, f->last))
			f->last = first;
	}
	compact(s, &x);
	return MOE_OK;
}
