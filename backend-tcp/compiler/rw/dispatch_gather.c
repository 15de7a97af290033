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
} dg;

/* writers and readers of buffer b among all ops (an op both reading and
 * writing it counts as both); the last of each in *w / *r */
static void uses(const tcp_sched *s, ts_id b, uint32_t *nw, uint32_t *nr, ts_id *w, ts_id *r)
{
	*nw = *nr = 0;
	*w = *r = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (in->v[TCP_V_DST].t >= 0 && (ts_id)in->v[TCP_V_DST].t == b)
			++*nw, *w = o;
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++)
			if (in->v[k].t >= 0 && (ts_id)in->v[k].t == b) {
				++*nr, *r = o;
				break;
			}
	}
}

static bool staged(const tcp_sched *s, ts_id b)
{
	for (ts_id q = 0; q < s->nsc; q++)
		if (s->sc[q].kind == TS_SC_SPM_LD && s->sc[q].buf == b)
			return true;
	return false;
}

static bool strides(const tcp_view *v, int n, const int64_t *st)
{
	for (int k = 0; k < n; k++)
		if (v->stride[k] != st[k])
			return false;
	return true;
}

/* i32 words per list row: one HBM granule, so that each row the scatter
 * writes is whole granules (a part of one is a read-modify-write) */
static int64_t entry(const tcp_sched *s)
{
	int64_t w = s->m->hbm_granule / 4;
	return w < 1 ? 1 : w;
}

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
	       sv->reg >= 0 && (ts_id)sv->reg == l->g && sv->scale == d->B * d->D && strides(sv, 2, st) &&
	       strides(dv, 2, st);
}

/* The dispatch as sched-build made it, or false. */
static bool match(const tcp_sched *s, dg *d)
{
	memset(d, 0, sizeof *d);
	if (!s->m || s->nloop != 1 || s->loop[0].rows == TS_NONE)
		return false;
	const ts_loop *l = &s->loop[0];
	uint32_t nw, nr;
	ts_id w, r;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (in->op != TCP_OP_DMA_SCATTER || in->flags != TCP_F_SCALED || in->vreg >= 0 || in->ndim != 3 ||
			in->dim[0] != 1 || ts_region_within(s, s->op[o].region, l->region))
			continue;
		const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1];
		if (dv->t < 0 || sv->t < 0 || iv->t < 0 || dv->reg >= 0 || sv->reg >= 0 || iv->reg >= 0 || dv->base ||
			sv->base || iv->base)
			continue;
		const ts_buf *gb = &s->buf[dv->t], *xb = &s->buf[sv->t];
		d->TK = in->dim[1];
		d->D = in->dim[2];
		d->GB = in->rows;
		if (gb->space != TCP_HBM || gb->kind != TCP_T_SCRATCH || xb->space != TCP_DM || xb->kind != TCP_T_SCRATCH ||
			xb->slots != 1 || xb->layout.split != TS_SPLIT_FLIT || gb->dtype != xb->dtype ||
			ts_buf_numel(gb) != d->GB * d->D || ts_buf_numel(xb) != d->TK * d->D || d->GB % l->G ||
			!strides(dv, 3, (const int64_t[]){d->GB * d->D, d->D, 1}) ||
			!strides(sv, 3, (const int64_t[]){d->TK * d->D, d->D, 1}) || iv->stride[1] != 1)
			continue;
		d->sc = o;
		d->grid = (ts_id)dv->t;
		d->x = (ts_id)sv->t;
		d->ibh = (ts_id)iv->t;
		d->B = d->GB / l->G;
		break;
	}
	if (!d->D)
		return false;
	/* the grid: written by the scatter alone, read only by body copies */
	uses(s, d->grid, &nw, &nr, &w, &r);
	if (nw != 1 || w != d->sc || !nr || staged(s, d->grid))
		return false;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		bool rd = false;
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++)
			rd |= in->v[k].t >= 0 && (ts_id)in->v[k].t == d->grid;
		if (rd && !body_copy(s, d, o))
			return false;
	}
	/* the gathered rows: written by one gather of x's rows, read by the scatter */
	uses(s, d->x, &nw, &nr, &w, &r);
	if (nw != 1 || nr != 1 || r != d->sc || staged(s, d->x))
		return false;
	d->ga = w;
	const tcp_insn *g = &s->op[d->ga].in;
	const tcp_view *gd = &g->v[TCP_V_DST], *gx = &g->v[TCP_V_S0], *gt = &g->v[TCP_V_S1];
	if (g->op != TCP_OP_DMA_GATHER || g->flags || g->vreg >= 0 || g->ndim != 3 || g->dim[0] != 1 ||
		g->dim[1] != d->TK || g->dim[2] != d->D || gd->base || gd->reg >= 0 ||
		!strides(gd, 3, (const int64_t[]){d->TK * d->D, d->D, 1}) || gx->t < 0 || gx->reg >= 0 || gt->t < 0 ||
		gt->reg >= 0 || gx->stride[1] != d->D || gx->stride[2] != 1 || gt->stride[1] != 1 ||
		ts_region_within(s, s->op[d->ga].region, l->region))
		return false;
	const ts_buf *xs = &s->buf[gx->t], *ts = &s->buf[gt->t];
	if (xs->space != TCP_HBM || xs->dtype != s->buf[d->x].dtype || ts->space != TCP_DM || ts->dtype != MOE_I32)
		return false;
	uses(s, (ts_id)gx->t, &nw, &nr, &w, &r);
	if (nw)
		return false;
	d->T = g->rows;
	d->xv = *gx;
	d->tv = *gt;
	d->tok = (ts_id)gt->t;
	/* the byte offsets: pos x row bytes (one multiply pass), copied to HBM */
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)s->buf[d->x].dtype);
	uses(s, d->ibh, &nw, &nr, &w, &r);
	if (nw != 1 || nr != 1 || r != d->sc || staged(s, d->ibh) || s->buf[d->ibh].space != TCP_HBM ||
		s->buf[d->ibh].kind != TCP_T_SCRATCH)
		return false;
	d->cp = w;
	const tcp_insn *c = &s->op[d->cp].in;
	if (c->op != TCP_OP_DMA_COPY || c->v[TCP_V_S0].t < 0)
		return false;
	d->ib = (ts_id)c->v[TCP_V_S0].t;
	uses(s, d->ib, &nw, &nr, &w, &r);
	if (nw != 1 || nr != 1 || r != d->cp || staged(s, d->ib))
		return false;
	d->vb = w;
	const tcp_insn *v = &s->op[d->vb].in;
	return v->op == TCP_OP_TU_VEC && v->nstep == 1 && v->step[0].op == TCP_V_IMUL && v->step[0].x == TCP_SRC_V &&
	       v->step[0].y == TCP_SRC_IMM && (int64_t)v->step[0].imm == d->D * es && v->ndim == 1 &&
	       v->dim[0] == d->TK && d->T * d->D * es <= INT32_MAX && d->GB * entry(s) * 4 <= INT32_MAX;
}

bool ts_rw_dispatch_gather_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	dg d;
	return match(s, &d);
}

/* the flit-spread layout of lay's slices for n bytes */
static ts_layout spread(const tcp_sched *s, ts_layout lay, int64_t n)
{
	int64_t per = lay.nslices * (int64_t)lay.copies, f = s->m->flit_bytes;
	lay.slice_bytes = ((n + per - 1) / per + f - 1) / f * f;
	if (!lay.slice_bytes)
		lay.slice_bytes = f;
	return lay;
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
		t->layout = spread(s, t->layout, n * 4);
}

static void set_op(tcp_sched *s, ts_id o, const tcp_insn *in, uint16_t feature)
{
	ts_op *p = &s->op[o];
	in = in ? in : &p->in;
	uint8_t ph = p->in.phase;
	p->in = *in;
	p->in.phase = ph;
	p->ctx = tcp_op_ctx[p->in.op];
	p->cost = 0;
	p->feature = feature;
}

moe_status ts_rw_dispatch_gather_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	dg d;
	if (!match(s, &d))
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	ts_id g = l->g, nrows = l->rows;
	int64_t W = entry(s), es = (int64_t)moe_dtype_size((moe_dtype)s->buf[d.x].dtype);
	/* each pair's token as a byte offset into x, the first word of a row of
	 * W words (the gather's op) */
	retype(s, d.x, "tokens", W * d.TK);
	const int64_t one = 1;
	tcp_insn v = tcp_b_vec(1, &d.TK, tcp_b_view((int32_t)d.x, 0, 1, &W));
	v.v[TCP_V_S0] = tcp_b_view(d.tv.t, d.tv.base, 1, &one);
	tcp_b_step(&v, TCP_V_IMUL, TCP_SRC_S0, TCP_SRC_IMM, (uint32_t)(d.D * es));
	v.flags |= TCP_F_ROUTE;
	set_op(s, d.ga, &v, feature);
	/* the rows' byte offsets in the list: pos x W x 4 */
	s->op[d.vb].in.step[0].imm = (uint32_t)(W * 4);
	set_op(s, d.vb, NULL, feature);
	/* scattered into the grid, now the list of G B such rows */
	retype(s, d.grid, "tokens", W * d.GB);
	tcp_insn *sc = &s->op[d.sc].in;
	sc->dim[2] = W;
	sc->v[TCP_V_DST] = tcp_b_view((int32_t)d.grid, 0, 3, (const int64_t[]){W * d.GB, W, 1});
	sc->v[TCP_V_S0] = tcp_b_view((int32_t)d.x, 0, 3, (const int64_t[]){W * d.TK, W, 1});
	set_op(s, d.sc, NULL, feature);
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
		set_op(s, o, &gin, feature);
	}
	return MOE_OK;
}
