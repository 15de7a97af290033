/* backend-tcp/compiler/rw/row_classes.c: rewrite `row-classes`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * sched-build runs a block's passes over the block's whole row extent B,
 * the rows past its valid count ($rows) included, and the machine charges a
 * pass for every row of its static extent. The rewrite puts each run of the
 * body's consecutive ops that holds a pass over the block's rows into a
 * classes region keyed on $rows: the case of bound h (taken when the
 * previous bound < $rows <= h) holds a copy of every op of the run, the
 * passes over the rows cut to h rows; the last case, bound B, holds the
 * original ops; row_bounds chooses the bounds.
 *
 * Cut are:
 *  - row passes: a tu.vec or tu.contract (of the scaled ones, f8 x f8
 *    only) under valid=$rows of
 *    two or more dimensions whose destination steps along dim 0, no vector
 *    step that compacts (a merge picks per element) or reads the dim-0
 *    counter: its rows are independent of one another, and those past $rows
 *    it writes as zero;
 *  - feeders: a dma.copy of B rows into a DM buffer that only row passes
 *    read (the block's rows copied in).
 * Rows [h, B) of what they write are left as an earlier block wrote them, so
 * a pass is cut only when every other op that reads its destination buffer
 * is a cut pass reading, at its row i, row i of what the pass wrote (so rows
 * below h, the same class being taken in every run) or a dma.copy into HBM
 * (the store of the block's rows, whose rows past $rows the combine never
 * reads). Values are unchanged.
 *
 * Dependencies: a copy in case k depends on the copies in case k of the run's
 * ops its original waits for in its block, on every case's copy of those it
 * waits for in the previous block, and on the ops outside the run as the
 * original; every op that waits for an op of the run also waits, at the
 * same distance, for each of its copies (only one case runs in a block). A
 * span buffer whose first op is in the run starts at its first case's copy. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/tcp_int.h"

#define RC_MAX_BOUNDS 64
#define RC_ALIGN 8

/* The row classes of a pass over B rows. A case costs a block only the
 * control path's test (an li and a branch, and a jump out of the case
 * taken), which runs ahead of the engines, while a pass's time past its
 * fixed part grows with its rows; so the classes are as fine as the code
 * they copy allows. A contraction of R row groups is charged for
 * ceil(rows / R) rows per slice (isa/cost.c), so a bound that is not a
 * multiple of R pays for the rows up to the next one. Where the body's
 * largest contraction has R = `unit` <= RC_ALIGN row groups, the bounds are
 * every f rows, f the least multiple of R of at least 4 rows that keeps
 * them within RC_MAX_BOUNDS; else (and without a contraction, unit 0)
 * f = B / 32, at least 8 rows (the first row tile, docs/tcp-isa.md 7.4),
 * doubling while below the step max(f, B / 16), then every step. Then B; a
 * bound less than f below B is left out; at most maxn bounds. Returns their
 * count (1: no class to add). */
static uint32_t row_bounds(int64_t B, int64_t unit, uint32_t maxn, int64_t *b)
{
	int64_t f = B / 32 < 8 ? 8 : B / 32, st = B / 16 > f ? B / 16 : f, h;
	uint32_t n = 0;
	if (unit > 0 && unit <= RC_ALIGN) {
		f = (4 + unit - 1) / unit * unit;
		while ((B + f - 1) / f > maxn)
			f += unit;
		st = f;
	}
	for (h = f; h < st && h + f <= B; h *= 2)
		b[n++] = h;
	for (h = (h + st - 1) / st * st; h + f <= B && n + 1 < maxn; h += st)
		b[n++] = h;
	b[n++] = B;
	return n;
}

typedef struct rc {
	const tcp_sched *s;
	const ts_loop *l;
	uint8_t *cut;  /* per op: 1 row pass, 2 feeder, 0 neither */
	int64_t B;     /* the largest row pass's rows */
	int64_t unit;  /* the row groups of the largest cut contraction (0: none) */
	uint32_t maxn; /* the most bounds the ops' dependency lists allow */
	ts_id nop;     /* the ops cut covers */
} rc;

/* The row a view of instruction in starts at, in rows of `row` elements
 * from its base, when its dim-0 index i touches only that row + i (dim-0
 * stride row, the other dims within one row); else -1. */
static int64_t view_row(const tcp_insn *in, const tcp_view *v, int64_t row)
{
	if (row < 1 || v->stride[0] != row || v->base < 0)
		return -1;
	int64_t ext = v->base % row;
	for (int k = 1; k < in->ndim; k++) {
		int64_t n = in->dim[k];
		/* a scaled f8 contraction's s2 steps its last stride once per
		 * 128-chunk of the reduction (docs/tcp-isa.md 6) */
		if (in->op == TCP_OP_TU_CONTRACT && (in->flags & TCP_F_SCALED) && !(in->flags & TCP_F_ROWDIV) &&
			v == &in->v[TCP_V_S2] && k == 2)
			n = (n + TCP_SCALE_CHUNK - 1) / TCP_SCALE_CHUNK;
		ext += (n - 1) * (v->stride[k] < 0 ? -v->stride[k] : v->stride[k]);
	}
	return ext < row ? v->base / row : -1;
}

/* whether every view of q that reads buffer t reads, at dim-0 index i, row
 * i of what op o writes there (o's destination view d) */
static bool same_rows(const ts_op *q, const ts_op *o)
{
	const tcp_view *d = &o->in.v[TCP_V_DST];
	int64_t r0 = view_row(&o->in, d, d->stride[0]);
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
		const tcp_view *v = &q->in.v[w];
		if (v->t != d->t)
			continue;
		if (r0 < 0 || view_row(&q->in, v, d->stride[0]) != r0 || v->reg != d->reg || (v->reg >= 0 && v->scale != d->scale))
			return false;
	}
	return true;
}

static bool row_pass(const tcp_sched *s, const ts_loop *l, const ts_op *o)
{
	const tcp_insn *in = &o->in;
	const tcp_view *d = &in->v[TCP_V_DST];
	if (in->vreg < 0 || (ts_id)in->vreg != l->rows || in->ndim < 2 || d->t < 0 || d->stride[0] == 0 ||
		s->buf[d->t].space != TCP_DM || view_row(in, d, d->stride[0]) < 0)
		return false;
	if (in->op == TCP_OP_TU_CONTRACT) /* of the scaled forms, f8 x f8 only */
		return !(in->flags & TCP_F_SCALED) ||
		       (!(in->flags & TCP_F_ROWDIV) && in->v[TCP_V_S1].t >= 0 &&
			       s->buf[in->v[TCP_V_S1].t].dtype == MOE_F8E4M3);
	if (in->op != TCP_OP_TU_VEC)
		return false;
	for (int i = 0; i < in->nstep; i++) {
		const tcp_step *st = &in->step[i];
		if (st->op >= TCP_V_COUNT || st->op == TCP_V_COMPACT ||
			((st->x == TCP_SRC_CTR || st->y == TCP_SRC_CTR) && st->ctr == 0))
			return false;
	}
	return true;
}

static bool feeder(const tcp_sched *s, const ts_op *o, int64_t B)
{
	const tcp_insn *in = &o->in;
	const tcp_view *d = &in->v[TCP_V_DST];
	return in->op == TCP_OP_DMA_COPY && in->vreg < 0 && in->ndim >= 2 && in->dim[0] == B && d->t >= 0 &&
	       d->stride[0] != 0 && s->buf[d->t].space == TCP_DM && !(in->flags & TCP_F_JOIN) &&
	       view_row(in, d, d->stride[0]) >= 0;
}


/* whether every op but o that reads o's destination is a cut row pass or
 * (for a row pass) a dma.copy into HBM */
static bool readers_ok(const rc *c, ts_id o, bool only_passes)
{
	const tcp_sched *s = c->s;
	int32_t t = s->op[o].in.v[TCP_V_DST].t;
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == o || !ts_op_reads(&s->op[q], t))
			continue;
		if (c->cut[q] == 1) {
			if (!same_rows(&s->op[q], &s->op[o]))
				return false;
			continue;
		}
		const tcp_insn *in = &s->op[q].in;
		if (only_passes || in->op != TCP_OP_DMA_COPY || in->v[TCP_V_DST].t < 0 ||
			s->buf[in->v[TCP_V_DST].t].space != TCP_HBM)
			return false;
	}
	return true;
}

/* The row groups R of the cut contraction of the most MACs (its rows split
 * over tcp_slices / ceil(O / tile) groups, as isa/cost.c charges it); 0
 * without one. */
static int64_t row_unit(const rc *c, int64_t S)
{
	const tcp_sched *s = c->s;
	int64_t unit = 0, most = 0;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (c->cut[o] != 1 || in->op != TCP_OP_TU_CONTRACT || in->tile < 1)
			continue;
		int64_t macs = in->dim[0] * in->dim[1] * in->dim[2], cg = (in->dim[1] + in->tile - 1) / in->tile;
		if (macs > most) {
			most = macs;
			unit = S / cg > 0 ? S / cg : 1;
		}
	}
	return unit;
}

/* Marks the body's top-level ops to cut; returns how many row passes. */
static uint32_t mark(rc *c)
{
	const tcp_sched *s = c->s;
	const ts_region *b = &s->rg[c->l->body];
	c->B = 0;
	for (uint32_t k = 0; k < b->nitem; k++) {
		ts_id o = TS_ITEM_ID(b->item[k]);
		if (TS_ITEM_KIND(b->item[k]) == TS_ITEM_OP && row_pass(s, c->l, &s->op[o])) {
			c->cut[o] = 1;
			c->B = s->op[o].in.dim[0] > c->B ? s->op[o].in.dim[0] : c->B;
		}
	}
	for (bool changed = true; changed;) { /* a pass whose readers are not all safe stays whole */
		changed = false;
		for (ts_id o = 0; o < s->nop; o++)
			if (c->cut[o] == 1 && !readers_ok(c, o, false))
				c->cut[o] = 0, changed = true;
	}
	uint32_t n = 0;
	for (ts_id o = 0; o < s->nop; o++)
		n += c->cut[o] == 1;
	for (uint32_t k = 0; k < b->nitem && n; k++) {
		ts_id o = TS_ITEM_ID(b->item[k]);
		if (TS_ITEM_KIND(b->item[k]) == TS_ITEM_OP && feeder(s, &s->op[o], c->B) && readers_ok(c, o, true))
			c->cut[o] = 2;
	}
	return n;
}

/* The most bounds every op's dependency list allows: an op's dependency on
 * an op of the body becomes one on each case's copy (ts_split_classes), so
 * an op with d of them gets up to d x n (TS_MAX_DEPS in all). */
static uint32_t dep_cap(const tcp_sched *s, const ts_loop *l)
{
	uint32_t cap = RC_MAX_BOUNDS;
	for (ts_id o = 0; o < s->nop; o++) {
		uint32_t d = 0;
		for (uint32_t j = 0; j < s->op[o].ndep; j++)
			d += ts_region_within(s, s->op[s->op[o].dep[j]].region, l->body);
		if (d && (TS_MAX_DEPS - 1 - (s->op[o].ndep - d)) / d < cap)
			cap = (TS_MAX_DEPS - 1 - (s->op[o].ndep - d)) / d;
	}
	return cap;
}

static bool prepare(rc *c, const tcp_sched *s, const ts_env *e)
{
	memset(c, 0, sizeof *c);
	if (s->nloop < 1 || s->loop[0].rows == TS_NONE)
		return false;
	c->s = s;
	c->l = &s->loop[0];
	c->nop = s->nop;
	c->cut = ctx_alloc(s->ctx, s->nop + 1);
	int64_t b[RC_MAX_BOUNDS];
	if (mark(c) == 0)
		return false;
	c->unit = row_unit(c, tcp_slices(e->m));
	c->maxn = dep_cap(s, c->l);
	return row_bounds(c->B, c->unit, c->maxn, b) > 1;
}

bool ts_rw_row_classes_applies(const tcp_sched *s, const ts_env *e)
{
	rc c;
	bool ok = prepare(&c, s, e);
	if (c.cut)
		ctx_free(s->ctx, c.cut, 0);
	return ok;
}

moe_status ts_rw_row_classes_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	rc c;
	if (!prepare(&c, s, e)) {
		if (c.cut)
			ctx_free(s->ctx, c.cut, 0);
		return MOE_ERR_INVALID;
	}
	int64_t bound[RC_MAX_BOUNDS];
	uint32_t n = row_bounds(c.B, c.unit, c.maxn, bound);
	ts_id body = c.l->body;
	/* runs of consecutive op items holding a cut op, first to last */
	for (uint32_t i = 0; i < s->rg[body].nitem;) {
		uint32_t m = 0;
		bool any = false;
		while (i + m < s->rg[body].nitem && TS_ITEM_KIND(s->rg[body].item[i + m]) == TS_ITEM_OP) {
			ts_id o = TS_ITEM_ID(s->rg[body].item[i + m]);
			any |= o < c.nop && c.cut[o];
			m++;
		}
		if (!any) {
			i += m ? m : 1;
			continue;
		}
		ts_split_classes(s, body, i, m, c.l->rows, bound, n, c.cut, true, feature);
		i++;
	}
	ctx_free(s->ctx, c.cut, 0);
	return MOE_OK;
}
