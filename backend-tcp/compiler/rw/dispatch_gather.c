/* backend-tcp/compiler/rw/dispatch_gather.c: rewrite `dispatch-gather`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * sched-build dispatches as the graph writes it: one dma.gather of x's rows
 * by the pairs' token list into a DM buffer of T K rows, one dma.scatter of
 * those rows into the HBM grid of G B rows (byte offsets pos x row bytes),
 * and in the loop's body one dma.copy of block g's rows of the grid (cut to
 * its class's bound by row-classes) into the block's DM row buffer. The
 * rewrite scatters each pair's token instead of its row: the build's gather
 * op becomes a tu.vec writing each pair's token times x's row bytes (its
 * byte offset in x) into the first word of a row of one HBM granule (a
 * scattered row of part of a granule is a read-modify-write of it), the
 * scatter moves those rows to pos x granule bytes (the byte-offset pass's
 * immediate) into the grid, now an i32 list of G B such rows (HBM scratch
 * starts zeroed: padding rows name token 0), and each body copy becomes a
 * dma.gather flags=scaled of x's rows by block g's rows of that list (byte
 * offsets read in HBM) straight into the same DM rows, under valid=$rows.
 * Values are unchanged: row j < $rows of block g is x's row of the pair at
 * grid row g B + j, as the grid held; rows at and past $rows are written
 * zero, as the grid's padding rows were zero. The T K rows' round trip
 * through DM and HBM is gone (x's rows are read once, by the blocks).
 *
 * Applies when the grid is written only by that scatter (zero base, no
 * valid count) and read only by such body copies, the gathered rows are
 * read only by the scatter, and the byte offsets are one tu.vec multiply and
 * its copy to HBM read by nothing else (the build's dispatch; not a spilled
 * or staged gather, not after stage-rows, which copies the whole grid
 * before the loop). */
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

typedef struct dg {
	ts_id ga, sc, vb, cp;        /* the token-row gather, the grid scatter, the byte offsets' pass and copy */
	ts_id x, rows, grid, tok, ib, ibh;
	int64_t TK, D, B, GB, T;
	tcp_view xv, tv;             /* the gather's source (x) and token list */
	ts_id h, st2;                /* staged: the gathered rows in HBM and the scatter's staging; else TS_NONE */
} dg;

/* Whether op c is a body copy of block g's rows of the grid into DM rows. */
static bool body_copy(const tcp_sched *s, const dg *d, ts_id c)
{
	const ts_loop *l = &s->loop[0];
	const tcp_insn *in = &s->op[c].in;
	const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->flags || in->vreg >= 0 || !ts_region_within(s, s->op[c].region, l->body) ||
		sv->t < 0 || (ts_id)sv->t != d->grid || dv->t < 0 || s->buf[dv->t].space != TCP_DM ||
		s->buf[dv->t].dtype != s->buf[d->x].dtype)
		return false;
	const int64_t st[2] = {d->D, 1};
	return in->ndim == 2 && in->dim[0] >= 1 && in->dim[0] <= d->B && in->dim[1] == d->D && sv->base == 0 &&
	       sv->reg >= 0 && (ts_id)sv->reg == l->g && sv->scale == d->B * d->D && ts_view_strides(sv, 2, st) &&
	       ts_view_strides(dv, 2, st);
}

/* Whether op o is a dma.gather of c of x's rows by the token list at r
 * into rows 0.. of DM buffer st (dims [1, c, D]); the first such gather
 * (r 0) sets x's view and the token list's, the others must match them. */
static bool row_gather(const tcp_sched *s, dg *d, ts_id o, ts_id st, int64_t r, int64_t c)
{
	const tcp_insn *g = &s->op[o].in;
	const tcp_view *gd = &g->v[TCP_V_DST], *gx = &g->v[TCP_V_S0], *gt = &g->v[TCP_V_S1];
	if (g->op != TCP_OP_DMA_GATHER || g->flags || g->vreg >= 0 || g->ndim != 3 || g->dim[0] != 1 ||
		g->dim[1] != c || g->dim[2] != d->D || gd->t < 0 || (ts_id)gd->t != st || gd->base || gd->reg >= 0 ||
		!ts_view_strides(gd, 3, (const int64_t[]){c * d->D, d->D, 1}) || gx->t < 0 || gx->reg >= 0 || gt->t < 0 ||
		gt->reg >= 0 || gx->stride[1] != d->D || gx->stride[2] != 1 || gt->stride[1] != 1 ||
		ts_region_within(s, s->op[o].region, s->loop[0].region))
		return false;
	if (r == 0) {
		d->ga = o;
		d->T = g->rows;
		d->xv = *gx;
		d->tv = *gt;
		return true;
	}
	return g->rows == d->T && gx->t == d->xv.t && gx->base == d->xv.base && gx->stride[0] == d->xv.stride[0] &&
	       gt->t == d->tv.t && gt->base == d->tv.base + r;
}

/* Whether op o is a one-dimensional dma.copy of n elements from src at sb
 * to dst at db. */
static bool flat_copy(const tcp_sched *s, ts_id o, ts_id dst, int64_t db, ts_id src, int64_t sb, int64_t n)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	return in->op == TCP_OP_DMA_COPY && !in->flags && in->vreg < 0 && in->ndim == 1 && in->dim[0] == n &&
	       dv->t >= 0 && (ts_id)dv->t == dst && dv->base == db && dv->reg < 0 && dv->stride[0] == 1 && sv->t >= 0 &&
	       (ts_id)sv->t == src && sv->base == sb && sv->reg < 0 && sv->stride[0] == 1;
}

/* op o's dependency at distance 0 that writes buffer b (the last listed),
 * or TS_NONE */
static ts_id writer_dep(const tcp_sched *s, ts_id o, ts_id b)
{
	ts_id w = TS_NONE;
	for (uint32_t j = 0; j < s->op[o].ndep; j++)
		if (!s->op[o].dist[j] && ts_op_writes(&s->op[s->op[o].dep[j]], (int32_t)b))
			w = s->op[o].dep[j];
	return w;
}

/* the op writing exactly elements [at, at + n) of buffer b by a copy, or TS_NONE */
static ts_id range_writer(const tcp_sched *s, ts_id b, int64_t at, int64_t n)
{
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (ts_op_writes(&s->op[o], (int32_t)b) && in->op == TCP_OP_DMA_COPY && in->ndim == 1 &&
			in->v[TCP_V_DST].base == at && in->dim[0] == n)
			return o;
	}
	return TS_NONE;
}

/* The staged dispatch (recipe_route.c: a spilled gather, and the scatter of
 * its HBM copy): for each chunk of c rows at r (the chunks tile [0, T K)), a
 * gather of x's rows by tokens r.. into the DM staging st1, a copy of st1
 * to rows r.. of the HBM buffer h, a copy of those rows into the DM staging
 * st2 (d->x on entry) and a scatter of st2 into the grid by the offsets
 * r.., each after the one before it. The grid then holds what one gather
 * and one scatter of the T K rows would write. On success d->x is st1,
 * d->ga and d->sc the chunk at 0's gather and scatter. */
static bool match_staged(const tcp_sched *s, dg *d)
{
	ts_id st2 = d->x, st1 = TS_NONE, h = TS_NONE;
	uint32_t n = 0, nw, nr;
	int64_t total = 0, TK = ts_buf_numel(&s->buf[d->ibh]);
	ts_id w, r;
	uint8_t *cov = ctx_alloc(s->ctx, (size_t)TK + 1);
	memset(cov, 0, (size_t)TK + 1);
	bool ok = TK > 0;
	for (ts_id o = 0; o < s->nop && ok; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (!ts_op_writes(&s->op[o], (int32_t)d->grid))
			continue;
		const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1];
		int64_t c = in->dim[1], at = iv->base;
		ok = in->op == TCP_OP_DMA_SCATTER && in->flags == TCP_F_SCALED && in->vreg < 0 && in->ndim == 3 &&
		     in->dim[0] == 1 && in->dim[2] == d->D && in->rows == d->GB && dv->base == 0 && dv->reg < 0 &&
		     ts_view_strides(dv, 3, (const int64_t[]){d->GB * d->D, d->D, 1}) && sv->t == (int32_t)st2 && !sv->base &&
		     sv->reg < 0 && ts_view_strides(sv, 3, (const int64_t[]){c * d->D, d->D, 1}) && iv->t == (int32_t)d->ibh &&
		     iv->reg < 0 && iv->stride[1] == 1 && c > 0 && at >= 0 && at + c <= TK;
		for (int64_t k = at; ok && k < at + c; k++)
			ok = !cov[k]++;
		/* the scatter's staging copy (its dependency), the copy that wrote
		 * its rows of h, and that copy's gather (its dependency) */
		ts_id rc = ok ? writer_dep(s, o, st2) : TS_NONE, cc = TS_NONE, gg = TS_NONE;
		int32_t src = rc != TS_NONE ? s->op[rc].in.v[TCP_V_S0].t : -1;
		if (src >= 0 && h == TS_NONE)
			h = (ts_id)src;
		ok = ok && src >= 0 && flat_copy(s, rc, st2, 0, h, at * d->D, c * d->D) &&
		     (cc = range_writer(s, h, at * d->D, c * d->D)) != TS_NONE;
		src = ok ? s->op[cc].in.v[TCP_V_S0].t : -1;
		if (src >= 0 && st1 == TS_NONE)
			st1 = (ts_id)src;
		ok = ok && src >= 0 && flat_copy(s, cc, h, at * d->D, st1, 0, c * d->D) &&
		     (gg = writer_dep(s, cc, st1)) != TS_NONE && row_gather(s, d, gg, st1, at, c);
		if (ok && at == 0)
			d->sc = o;
		n++;
		total += c;
	}
	ctx_free(s->ctx, cov, (size_t)TK + 1);
	if (!ok || total != TK || d->sc == TS_NONE || d->ga == TS_NONE || h == st1 || h == st2 || st1 == st2)
		return false;
	/* nothing else touches the stagings and h; h in HBM, the stagings in DM */
	const ts_buf *hb = &s->buf[h], *b1 = &s->buf[st1];
	if (hb->space != TCP_HBM || hb->kind != TCP_T_SCRATCH || ts_buf_numel(hb) != TK * d->D ||
		b1->space != TCP_DM || b1->kind != TCP_T_SCRATCH || b1->slots != 1 || b1->layout.split != TS_SPLIT_FLIT)
		return false;
	const ts_id bufs[3] = {st1, h, st2};
	for (int k = 0; k < 3; k++) {
		ts_buf_uses(s, bufs[k], &nw, &nr, &w, &r);
		if (nw != n || nr != n || ts_buf_spm_read(s, bufs[k]))
			return false;
	}
	d->TK = TK;
	d->x = st1;
	d->h = h;
	d->st2 = st2;
	return true;
}

/* The dispatch as sched-build made it, or false. */
static bool match(const tcp_sched *s, dg *d)
{
	memset(d, 0, sizeof *d);
	d->ga = d->sc = d->h = d->st2 = TS_NONE;
	if (!s->m || s->nloop != 1 || s->loop[0].rows == TS_NONE)
		return false;
	const ts_loop *l = &s->loop[0];
	uint32_t nw = 0, nr = 0, xw = 0, xr = 0;
	ts_id w, r, xo = TS_NONE, xl = TS_NONE;
	bool whole = false;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (in->op != TCP_OP_DMA_SCATTER || in->flags != TCP_F_SCALED || in->vreg >= 0 || in->ndim != 3 ||
			in->dim[0] != 1 || ts_region_within(s, s->op[o].region, l->region))
			continue;
		const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1];
		if (dv->t < 0 || sv->t < 0 || iv->t < 0 || dv->reg >= 0 || sv->reg >= 0 || iv->reg >= 0 || dv->base ||
			sv->base)
			continue;
		const ts_buf *gb = &s->buf[dv->t], *xb = &s->buf[sv->t];
		d->TK = in->dim[1];
		d->D = in->dim[2];
		d->GB = in->rows;
		if (gb->space != TCP_HBM || gb->kind != TCP_T_SCRATCH || xb->space != TCP_DM || xb->kind != TCP_T_SCRATCH ||
			xb->slots != 1 || xb->layout.split != TS_SPLIT_FLIT || gb->dtype != xb->dtype ||
			ts_buf_numel(gb) != d->GB * d->D || d->GB % l->G ||
			!ts_view_strides(dv, 3, (const int64_t[]){d->GB * d->D, d->D, 1}) ||
			!ts_view_strides(sv, 3, (const int64_t[]){d->TK * d->D, d->D, 1}) || iv->stride[1] != 1)
			continue;
		d->grid = (ts_id)dv->t;
		d->x = (ts_id)sv->t;
		d->ibh = (ts_id)iv->t;
		d->B = d->GB / l->G;
		/* the T K rows whole in DM (gathered by the grid's one writer), or
		 * one chunk's staging (copied from HBM) */
		ts_buf_uses(s, d->grid, &nw, &nr, &w, &r);
		ts_buf_uses(s, d->x, &xw, &xr, &xo, &xl);
		whole = nw == 1 && !iv->base && ts_buf_numel(xb) == d->TK * d->D && xw == 1 &&
			s->op[xo].in.op == TCP_OP_DMA_GATHER;
		if (whole)
			d->sc = o;
		break;
	}
	if (!d->D || !nr || ts_buf_spm_read(s, d->grid) || s->buf[d->ibh].space != TCP_HBM ||
		s->buf[d->ibh].kind != TCP_T_SCRATCH || ts_buf_spm_read(s, d->ibh))
		return false;
	if (whole) { /* the rows gathered by one gather, read by the scatter alone */
		if (xr != 1 || xl != d->sc || ts_buf_spm_read(s, d->x) || !row_gather(s, d, xo, d->x, 0, d->TK))
			return false;
	} else if (!match_staged(s, d))
		return false;
	/* the grid read only by body copies */
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		bool rd = false;
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++)
			rd |= in->v[k].t >= 0 && (ts_id)in->v[k].t == d->grid;
		if (rd && !body_copy(s, d, o))
			return false;
	}
	const ts_buf *xs = &s->buf[d->xv.t], *ts = &s->buf[d->tv.t];
	if (xs->space != TCP_HBM || xs->dtype != s->buf[d->x].dtype || ts->space != TCP_DM || ts->dtype != MOE_I32)
		return false;
	ts_buf_uses(s, (ts_id)d->xv.t, &nw, &nr, &w, &r);
	if (nw)
		return false;
	d->tok = (ts_id)d->tv.t;
	/* the byte offsets: pos x row bytes (one multiply pass), copied to HBM,
	 * read by the scatter (or the staged scatters) alone */
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)s->buf[d->x].dtype);
	ts_buf_uses(s, d->ibh, &nw, &nr, &w, &r);
	if (nw != 1 || (whole && (nr != 1 || r != d->sc)))
		return false;
	for (ts_id o = 0; o < s->nop && !whole; o++)
		if (ts_op_reads(&s->op[o], (int32_t)d->ibh) && !ts_op_writes(&s->op[o], (int32_t)d->grid))
			return false;
	return ts_offsets_pass(s, d->ibh, d->D * es, d->TK, &d->cp, &d->ib, &d->vb) && d->T * d->D * es <= INT32_MAX &&
	       d->GB * ts_granule_words(s) * 4 <= INT32_MAX;
}

bool ts_rw_dispatch_gather_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	dg d;
	return match(s, &d);
}

static void retype(tcp_sched *s, ts_id b, const char *suffix, int64_t n)
{
	ts_buf *t = &s->buf[b];
	char name[160];
	snprintf(name, sizeof name, "%.*s.%s", 140, t->name, suffix);
	t->name = ir_strdup(&s->arena, name);
	t->dtype = MOE_I32;
	t->rank = 1;
	memset(t->shape, 0, sizeof t->shape);
	t->shape[0] = n;
	if (t->space != TCP_HBM)
		t->layout = ts_layout_spread(s, t->layout, n * 4);
}

/* The staged form's other chunks go: the first chunk's gather (now the
 * token pass) and scatter (now of all T K list rows) do the whole work.
 * An op that waited for a dropped gather or copy into h waits for the
 * token pass, one that waited for a dropped copy out of h or scatter waits
 * for the scatter; h and the scatter's staging go. */
static void unstage(tcp_sched *s, const dg *d)
{
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1), *cand = ctx_alloc(s->ctx, s->nbuf + 1);
	memset(drop, 0, s->nop + 1);
	memset(cand, 0, s->nbuf + 1);
	ts_id *rep = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *rep);
	for (ts_id o = 0; o < s->nop; o++) {
		const ts_op *q = &s->op[o];
		rep[o] = TS_NONE;
		if (o == d->ga || o == d->sc)
			continue;
		if (ts_op_writes(q, (int32_t)d->x) || ts_op_writes(q, (int32_t)d->h))
			rep[o] = d->ga;
		else if (ts_op_writes(q, (int32_t)d->st2) || ts_op_writes(q, (int32_t)d->grid))
			rep[o] = d->sc;
		drop[o] = rep[o] != TS_NONE;
	}
	for (ts_id o = 0; o < s->nop; o++) {
		if (drop[o])
			continue;
		uint32_t n = s->op[o].ndep;
		for (uint32_t j = 0; j < n; j++) {
			ts_id q = s->op[o].dep[j];
			if (drop[q] && rep[q] != o)
				ts_add_dep_once(s, o, rep[q], s->op[o].dist[j]);
		}
	}
	ts_add_dep_once(s, d->sc, d->ga, 0);
	/* a span that began or ended at a dropped op: at its replacement */
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life != TS_LIFE_SPAN || f->first == TS_NONE || f->last == TS_NONE)
			continue;
		f->first = drop[f->first] ? rep[f->first] : f->first;
		f->last = drop[f->last] ? rep[f->last] : f->last;
		if (pos[f->last] < pos[f->first])
			f->last = f->first;
	}
	ts_buf *t = &s->buf[d->x];
	t->life = TS_LIFE_SPAN;
	t->first = d->ga;
	t->last = d->sc;
	ctx_free(s->ctx, pos, 0);
	ts_drop_ops(s, drop);
	cand[d->h] = cand[d->st2] = 1;
	ts_drop_unused_bufs(s, cand);
	ctx_free(s->ctx, rep, 0);
	ctx_free(s->ctx, cand, 0);
	ctx_free(s->ctx, drop, 0);
}

moe_status ts_rw_dispatch_gather_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	dg d;
	if (!match(s, &d))
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	ts_id g = l->g, nrows = l->rows;
	int64_t W = ts_granule_words(s), es = (int64_t)moe_dtype_size((moe_dtype)s->buf[d.x].dtype);
	/* each pair's token as a byte offset into x, the first word of a row of
	 * W words (the gather's op) */
	retype(s, d.x, "tokens", W * d.TK);
	const int64_t one = 1;
	tcp_insn v = tcp_b_vec(1, &d.TK, tcp_b_view((int32_t)d.x, 0, 1, &W));
	v.v[TCP_V_S0] = tcp_b_view(d.tv.t, d.tv.base, 1, &one);
	tcp_b_step(&v, TCP_V_IMUL, TCP_SRC_S0, TCP_SRC_IMM, (uint32_t)(d.D * es));
	v.flags |= TCP_F_ROUTE;
	ts_set_insn(s, d.ga, &v, feature);
	/* the rows' byte offsets in the list: pos x W x 4 */
	s->op[d.vb].in.step[0].imm = (uint32_t)(W * 4);
	ts_set_insn(s, d.vb, NULL, feature);
	/* scattered into the grid, now the list of G B such rows */
	retype(s, d.grid, "tokens", W * d.GB);
	tcp_insn *sc = &s->op[d.sc].in;
	sc->dim[1] = d.TK;
	sc->dim[2] = W;
	sc->v[TCP_V_DST] = tcp_b_view((int32_t)d.grid, 0, 3, (const int64_t[]){W * d.GB, W, 1});
	sc->v[TCP_V_S0] = tcp_b_view((int32_t)d.x, 0, 3, (const int64_t[]){W * d.TK, W, 1});
	ts_set_insn(s, d.sc, NULL, feature);
	/* each body copy of block g's rows becomes a gather of x's rows by
	 * block g's rows of the list */
	for (ts_id o = 0; o < s->nop; o++) {
		if (s->op[o].in.op != TCP_OP_DMA_COPY || s->op[o].in.v[TCP_V_S0].t != (int32_t)d.grid)
			continue;
		const tcp_insn *old = &s->op[o].in;
		int64_t h = old->dim[0], dim[3] = {1, h, d.D};
		tcp_view dst = tcp_b_view(old->v[TCP_V_DST].t, old->v[TCP_V_DST].base, 3, (const int64_t[]){h * d.D, d.D, 1});
		dst.reg = old->v[TCP_V_DST].reg;
		dst.scale = old->v[TCP_V_DST].scale;
		tcp_view src = tcp_b_view(d.xv.t, d.xv.base, 3, (const int64_t[]){0, d.D, 1});
		tcp_view idx = tcp_b_view((int32_t)d.grid, 0, 3, (const int64_t[]){W * d.B, W, 0});
		idx.reg = (int32_t)g;
		idx.scale = W * d.B;
		tcp_insn gin = tcp_b_dma_gather(3, dim, dst, src, idx, d.T);
		gin.flags |= TCP_F_HBMIDX;
		gin.vreg = (int32_t)nrows;
		ts_set_insn(s, o, &gin, feature);
	}
	if (d.h != TS_NONE)
		unstage(s, &d);
	return MOE_OK;
}
