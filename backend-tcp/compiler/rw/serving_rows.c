/* backend-tcp/compiler/rw/serving_rows.c: rewrite `serving-rows`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * A serving layer's passes outside the block loop run under valid=$count
 * (recipe_serving.c: n_tokens, staged and read by ld), over the layer's T
 * token rows, and the machine charges a pass for every row of its static
 * extent. The rewrite puts each run of the top region's consecutive ops that
 * holds a row pass under the serving count (the count most passes of the
 * top region are masked by) into a classes region keyed on it: the case of
 * bound h (taken when the previous bound < count <= h) holds a copy of every
 * op of the run, the row passes cut to h rows; the last case, bound T, holds
 * the original ops. The bounds are f, 2f, 4f, ... below T, then T, with f =
 * T / 32 and at least 8 rows (the legacy emitter's serving row tiles,
 * docs/tcp-isa.md 7.4).
 *
 * Cut are row passes: a tu.vec or tu.contract (not scaled) under valid=$count
 * of two or more dimensions into DM whose destination steps along dim 0, no
 * vector step that filters or reads the dim-0 counter: its rows are
 * independent of one another, and it writes those at and past the count as
 * zero. Rows [h, T) of what a cut pass writes are not written, so a pass is
 * cut only when every other op that reads its destination buffer is such a
 * row pass under the same count reading, at its row i, row i of what the
 * pass wrote (so rows below the count <= h only), and no scalar reads the
 * buffer: no output copy, no gather, no unmasked reader. Values are
 * unchanged. Each cut pass is a classes region of its own (a run of several
 * ops would make every buffer the run touches live over all its cases,
 * which at T = 4096 overflows DM). The count is unknown when the layer is
 * compiled: the timeline reads the unstaged n_tokens as 0, so the benefit by
 * prediction is the gain at the smallest n, and a copy that does not place
 * is refused; at n = T a region costs the control path's tests only.
 *
 * Dependencies as in row_classes.c (one case runs per call); a span buffer
 * touched in a region lives over all its cases. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

#define SR_MAX_BOUNDS 16

static uint32_t serving_bounds(int64_t T, int64_t *b)
{
	int64_t f = T / 32 < 8 ? 8 : T / 32;
	uint32_t n = 0;
	for (int64_t h = f; h < T && n + 1 < SR_MAX_BOUNDS; h *= 2)
		b[n++] = h;
	b[n++] = T;
	return n;
}

typedef struct sr {
	const tcp_sched *s;
	ts_id count;   /* the serving count scalar */
	uint8_t *cut;  /* per op: 1 row pass */
	int64_t T;     /* the largest row pass's rows */
	ts_id nop;
} sr;

/* The row a view of in starts at, in rows of `row` elements from its base,
 * when its dim-0 index i touches only that row + i; else -1. */
static int64_t view_row(const tcp_insn *in, const tcp_view *v, int64_t row)
{
	if (row < 1 || v->stride[0] != row || v->base < 0 || v->reg >= 0)
		return -1;
	int64_t ext = v->base % row;
	for (int k = 1; k < in->ndim; k++)
		ext += (in->dim[k] - 1) * (v->stride[k] < 0 ? -v->stride[k] : v->stride[k]);
	return ext < row ? v->base / row : -1;
}

/* whether every view of q that reads o's destination buffer reads, at dim-0
 * index i, row i of what o writes */
static bool same_rows(const ts_op *q, const ts_op *o)
{
	const tcp_view *d = &o->in.v[TCP_V_DST];
	int64_t r0 = view_row(&o->in, d, d->stride[0]);
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
		const tcp_view *v = &q->in.v[w];
		if (v->t == d->t && (r0 < 0 || view_row(&q->in, v, d->stride[0]) != r0))
			return false;
	}
	return true;
}

static bool row_pass(const tcp_sched *s, ts_id count, const ts_op *o)
{
	const tcp_insn *in = &o->in;
	const tcp_view *d = &in->v[TCP_V_DST];
	if (in->vreg < 0 || (ts_id)in->vreg != count || in->ndim < 2 || d->t < 0 || d->stride[0] == 0 ||
		s->buf[d->t].space != TCP_DM || view_row(in, d, d->stride[0]) < 0)
		return false;
	if (in->op == TCP_OP_TU_CONTRACT)
		return !(in->flags & TCP_F_SCALED);
	if (in->op != TCP_OP_TU_VEC)
		return false;
	for (int i = 0; i < in->nstep; i++) {
		const tcp_step *st = &in->step[i];
		if (st->op >= TCP_V_COUNT || tcp_vop_stage[st->op] == TCP_ST_FILTER ||
			((st->x == TCP_SRC_CTR || st->y == TCP_SRC_CTR) && st->ctr == 0))
			return false;
	}
	return true;
}

static bool reads(const ts_op *q, int32_t t)
{
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
		if (q->in.v[w].t == t)
			return true;
	return false;
}

/* whether every op but o that reads o's destination is a row pass under
 * the same count reading its rows (cut or not, it reads no row at or past
 * the count), and no scalar reads it */
static bool readers_ok(const sr *c, ts_id o)
{
	const tcp_sched *s = c->s;
	int32_t t = s->op[o].in.v[TCP_V_DST].t;
	for (ts_id i = 0; i < s->nsc; i++)
		if (s->sc[i].kind == TS_SC_SPM_LD && s->sc[i].buf == (ts_id)t)
			return false;
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == o || !reads(&s->op[q], t))
			continue;
		if (!row_pass(s, c->count, &s->op[q]) || !same_rows(&s->op[q], &s->op[o]))
			return false;
	}
	return true;
}

/* The serving count: the scalar defined in the top region that masks most
 * of its ops; TS_NONE when none does. */
static ts_id serving_count(const tcp_sched *s)
{
	const ts_region *top = &s->rg[s->top];
	ts_id best = TS_NONE;
	uint32_t most = 0;
	for (uint32_t k = 0; k < top->nitem; k++) {
		if (TS_ITEM_KIND(top->item[k]) != TS_ITEM_SC)
			continue;
		ts_id x = TS_ITEM_ID(top->item[k]);
		uint32_t n = 0;
		for (uint32_t j = 0; j < top->nitem; j++)
			if (TS_ITEM_KIND(top->item[j]) == TS_ITEM_OP && s->op[TS_ITEM_ID(top->item[j])].in.vreg == (int32_t)x)
				n++;
		if (n > most)
			most = n, best = x;
	}
	return best;
}

static uint32_t mark(sr *c)
{
	const tcp_sched *s = c->s;
	const ts_region *top = &s->rg[s->top];
	c->T = 0;
	for (uint32_t k = 0; k < top->nitem; k++) {
		ts_id o = TS_ITEM_ID(top->item[k]);
		if (TS_ITEM_KIND(top->item[k]) == TS_ITEM_OP && row_pass(s, c->count, &s->op[o])) {
			c->cut[o] = 1;
			c->T = s->op[o].in.dim[0] > c->T ? s->op[o].in.dim[0] : c->T;
		}
	}
	for (ts_id o = 0; o < s->nop; o++) /* a pass whose readers are not all safe stays whole */
		if (c->cut[o] == 1 && !readers_ok(c, o))
			c->cut[o] = 0;
	uint32_t n = 0;
	for (ts_id o = 0; o < s->nop; o++)
		n += c->cut[o] == 1;
	return n;
}

static bool prepare(sr *c, const tcp_sched *s)
{
	memset(c, 0, sizeof *c);
	c->s = s;
	c->count = serving_count(s);
	if (c->count == TS_NONE)
		return false;
	c->nop = s->nop;
	c->cut = ctx_alloc(s->ctx, s->nop + 1);
	memset(c->cut, 0, s->nop + 1);
	int64_t b[SR_MAX_BOUNDS];
	return mark(c) > 0 && serving_bounds(c->T, b) > 1;
}

bool ts_rw_serving_rows_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sr c;
	bool ok = prepare(&c, s);
	if (c.cut)
		ctx_free(s->ctx, c.cut, 0);
	return ok;
}

/* The copies' dependencies (the originals' within the run map to the same
 * case's copies), and every other op waiting for an op of the run waits for
 * its copies too. */
static void copy_deps(tcp_sched *s, const ts_id *run, const ts_id *cp, const uint32_t *at, uint32_t m, uint32_t n,
	ts_id nop0)
{
	for (uint32_t j = 0; j < m; j++) {
		uint32_t nd = s->op[run[j]].ndep;
		for (uint32_t d = 0; d < nd; d++) {
			ts_id y = s->op[run[j]].dep[d];
			uint32_t jy = y < nop0 ? at[y] : 0;
			for (uint32_t k = 0; k + 1 < n; k++)
				ts_add_dep(s, cp[k * m + j], jy ? cp[k * m + jy - 1] : y, s->op[run[j]].dist[d]);
		}
	}
	for (ts_id q = 0; q < nop0; q++) {
		if (at[q])
			continue;
		uint32_t nd = s->op[q].ndep;
		for (uint32_t d = 0; d < nd; d++) {
			ts_id x = s->op[q].dep[d];
			if (x < nop0 && at[x])
				for (uint32_t k = 0; k + 1 < n; k++)
					ts_add_dep(s, q, cp[k * m + at[x] - 1], s->op[q].dist[d]);
		}
	}
}

/* The run of ops at top items [i0, i0 + m) into a classes region of n bounds
 * (the apply makes runs of one op; the copies' bookkeeping is general). */
static void split_run(tcp_sched *s, const sr *c, uint32_t i0, uint32_t m, const int64_t *bound, uint32_t n,
	uint16_t feature)
{
	ts_id top = s->top, nop0 = s->nop;
	ts_id *run = ctx_alloc(s->ctx, m * sizeof *run), *cp = ctx_alloc(s->ctx, (size_t)m * n * sizeof *cp);
	uint32_t *at = ctx_alloc(s->ctx, (nop0 + 1) * sizeof *at);
	memset(at, 0, (nop0 + 1) * sizeof *at);
	for (uint32_t j = 0; j < m; j++) {
		run[j] = TS_ITEM_ID(s->rg[top].item[i0 + j]);
		at[run[j]] = j + 1;
	}
	ts_region *b = &s->rg[top];
	memmove(b->item + i0, b->item + i0 + m, (b->nitem - i0 - m) * sizeof *b->item);
	b->nitem -= m;
	ts_id cls = ts_add_classes(s, top, i0, c->count, bound, n);
	for (uint32_t k = 0; k < n; k++) {
		ts_id cs = TS_ITEM_ID(s->rg[cls].item[k]);
		for (uint32_t j = 0; j < m; j++) {
			if (k + 1 == n) { /* the last case: the originals */
				cp[k * m + j] = run[j];
				s->op[run[j]].region = cs;
				ts_region_push(s, cs, TS_ITEM_OP | run[j]);
				continue;
			}
			tcp_insn in = s->op[run[j]].in;
			if (c->cut[run[j]] && in.dim[0] > bound[k])
				in.dim[0] = bound[k];
			ts_id o = ts_add_op(s, cs, &in, s->op[run[j]].phase);
			s->op[o].node = s->op[run[j]].node;
			s->op[o].feature = feature;
			cp[k * m + j] = o;
		}
	}
	copy_deps(s, run, cp, at, m, n, nop0);
	/* a span whose first op is in the run starts at its first case's copy
	 * (its last op, when in the run, is the original in the last case: the
	 * span holds every case, of which one runs) */
	for (ts_id t = 0; t < s->nbuf; t++) {
		ts_buf *bf = &s->buf[t];
		if (bf->life == TS_LIFE_SPAN && bf->first < nop0 && at[bf->first])
			bf->first = cp[at[bf->first] - 1];
	}
	ctx_free(s->ctx, run, 0);
	ctx_free(s->ctx, cp, 0);
	ctx_free(s->ctx, at, 0);
}

moe_status ts_rw_serving_rows_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	sr c;
	if (!prepare(&c, s)) {
		if (c.cut)
			ctx_free(s->ctx, c.cut, 0);
		return MOE_ERR_INVALID;
	}
	int64_t bound[SR_MAX_BOUNDS];
	uint32_t n = serving_bounds(c.T, bound);
	/* each cut op alone: the buffers of a case's copy live only over its
	 * classes region, not over a run of routing's ops */
	for (uint32_t i = 0; i < s->rg[s->top].nitem; i++) {
		uint32_t it = s->rg[s->top].item[i];
		if (TS_ITEM_KIND(it) == TS_ITEM_OP && TS_ITEM_ID(it) < c.nop && c.cut[TS_ITEM_ID(it)])
			split_run(s, &c, i, 1, bound, n, feature);
	}
	ctx_free(s->ctx, c.cut, 0);
	return MOE_OK;
}
