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
 * T / 32 and at least 8 rows (serving row tiles, docs/tcp-isa.md 7.4).
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
		if (q == o || !ts_op_reads(&s->op[q], t))
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
			ts_split_classes(s, s->top, i, 1, c.count, bound, n, c.cut, false, feature);
	}
	ctx_free(s->ctx, c.cut, 0);
	return MOE_OK;
}
