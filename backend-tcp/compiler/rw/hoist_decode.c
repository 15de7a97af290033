/* backend-tcp/compiler/rw/hoist_decode.c: rewrite `hoist-decode`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * `row-classes` copies the block body's row passes into one case per row
 * class, and with them the passes that decode the expert's packed weights
 * (gpt-oss MXFP4: the scale-offset passes and the decode passes), which do
 * not depend on the rows: every case runs the same decode into its own
 * buffers. So `pipe-decode` finds no decode pass in the body itself and the
 * sub context's first TRF load of each block waits for that block's whole
 * decode. The rewrite takes the leading run of the classes region's cases
 * (vector passes, no valid count, the same instruction in every case up to
 * the case's own buffers, each reading only values from outside the classes
 * region or earlier passes of the run) out of the cases: the first case's
 * passes stand just before the classes region, every other case's copies and
 * their buffers go, and their readers read the first case's buffers and wait
 * for its passes. Then `pipe-decode` (unless switched off) issues the body's
 * leading decode for block g + 1 in block g, as it does without row classes.
 * Values are unchanged: each case computed the same bits from the same
 * operands, and every reader waits for the pass that now writes them. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { HD_MAX = 8, HD_CASES = 64 };

typedef struct hd {
	ts_id body, cls;                  /* the loop body and its classes region */
	uint32_t at;                      /* the classes region's index in the body */
	uint32_t ncase, n;                /* cases; the run's length */
	ts_id op[HD_CASES][HD_MAX];       /* op[c][j]: case c's j-th run op */
} hd;

static bool decodes(const tcp_sched *s, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	if (in->op != TCP_OP_TU_VEC || in->v[TCP_V_S0].t < 0 || in->v[TCP_V_DST].t < 0)
		return false;
	return (in->flags & (TCP_F_E2M1 | TCP_F_I4)) || s->buf[in->v[TCP_V_S0].t].dtype == MOE_F8E4M3;
}

/* case c's run buffer standing for buffer t of its run ops [0, j): case 0's
 * buffer at the same place, or t itself when no earlier run op writes it */
static int32_t to_first(const tcp_sched *s, const hd *x, uint32_t c, uint32_t j, int32_t t)
{
	for (uint32_t k = 0; k < j; k++)
		if (s->op[x->op[c][k]].in.v[TCP_V_DST].t == t)
			return s->op[x->op[0][k]].in.v[TCP_V_DST].t;
	return t;
}

static bool same_buf(const ts_buf *a, const ts_buf *b)
{
	return a->space == b->space && a->dtype == b->dtype && a->rank == b->rank && a->slots == b->slots &&
	       !memcmp(a->shape, b->shape, sizeof(int64_t) * a->rank) && a->layout.split == b->layout.split &&
	       a->layout.slice_bytes == b->layout.slice_bytes && a->layout.copies == b->layout.copies &&
	       a->layout.nslices == b->layout.nslices && a->layout.slice0 == b->layout.slice0;
}

/* Whether case c's op o is the run's j-th pass as case 0's is: the same
 * instruction, its run-made sources and destination case c's own. */
static bool same_pass(const tcp_sched *s, const hd *x, uint32_t c, uint32_t j, ts_id o)
{
	const tcp_insn *a = &s->op[x->op[0][j]].in, *b = &s->op[o].in;
	if (a->op != b->op || a->ndim != b->ndim || a->nstep != b->nstep || a->flags != b->flags || a->vreg != b->vreg ||
		a->imm != b->imm || a->tile != b->tile || a->rows != b->rows || memcmp(a->dim, b->dim, sizeof a->dim))
		return false;
	for (uint32_t k = 0; k < a->nstep; k++)
		if (a->step[k].op != b->step[k].op || a->step[k].x != b->step[k].x || a->step[k].y != b->step[k].y ||
			a->step[k].imm != b->step[k].imm)
			return false;
	for (int w = 0; w < TCP_NVIEW; w++) {
		tcp_view v = b->v[w];
		if (w == TCP_V_DST && v.t >= 0 && a->v[w].t >= 0 && v.t != a->v[w].t &&
			same_buf(&s->buf[v.t], &s->buf[a->v[w].t]))
			v.t = a->v[w].t;
		else if (w != TCP_V_DST && v.t >= 0)
			v.t = to_first(s, x, c, j, v.t);
		if (!ts_same_view(&v, &a->v[w], TCP_MAXD))
			return false;
	}
	return true;
}

/* Whether case 0's op o can lead the run at index j: a vector pass without
 * a valid count into a DM span of one slot that it starts, its registers
 * defined outside the classes region, its distance-0 dependencies outside
 * it or earlier in the run, and no source written inside it but by the run. */
static bool leads(const tcp_sched *s, const hd *x, uint32_t j, ts_id o)
{
	const ts_op *q = &s->op[o];
	const tcp_insn *in = &q->in;
	int32_t d = in->v[TCP_V_DST].t;
	if (in->op != TCP_OP_TU_VEC || in->vreg >= 0 || d < 0 || s->buf[d].space != TCP_DM || s->buf[d].slots != 1 ||
		s->buf[d].life != TS_LIFE_SPAN || s->buf[d].first != o || in->v[TCP_V_DST].reg >= 0)
		return false;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && in->v[w].reg >= 0 &&
			ts_region_within(s, s->sc[in->v[w].reg].region, x->cls))
			return false;
	for (uint32_t k = 0; k < q->ndep; k++) {
		bool run = false;
		for (uint32_t i = 0; i < j; i++)
			run |= q->dep[k] == x->op[0][i];
		if (q->dist[k] == 0 && !run && ts_region_within(s, s->op[q->dep[k]].region, x->cls))
			return false;
	}
	for (ts_id y = 0; y < s->nop; y++) {
		if (!ts_region_within(s, s->op[y].region, x->cls))
			continue;
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
			int32_t t = in->v[w].t;
			if (t < 0 || !ts_op_writes(&s->op[y], t))
				continue;
			bool run = false;
			for (uint32_t i = 0; i < j; i++)
				run |= y == x->op[0][i];
			if (!run)
				return false;
		}
	}
	return true;
}

static bool find(const tcp_sched *s, hd *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop < 1 || s->loop[0].weights != TS_W_DOUBLE)
		return false;
	x->body = s->loop[0].body;
	const ts_region *r = &s->rg[x->body];
	for (x->at = 0; x->at < r->nitem; x->at++) {
		uint32_t it = r->item[x->at];
		if (TS_ITEM_KIND(it) != TS_ITEM_RG || s->rg[TS_ITEM_ID(it)].kind != TS_RG_CLASSES)
			continue;
		x->cls = TS_ITEM_ID(it);
		const ts_region *c = &s->rg[x->cls];
		if (c->nitem < 2 || c->nitem > HD_CASES)
			continue;
		x->ncase = c->nitem;
		bool dec = false;
		for (x->n = 0; x->n < HD_MAX; x->n++) {
			const ts_region *c0 = &s->rg[TS_ITEM_ID(c->item[0])];
			if (x->n >= c0->nitem || TS_ITEM_KIND(c0->item[x->n]) != TS_ITEM_OP)
				break;
			x->op[0][x->n] = TS_ITEM_ID(c0->item[x->n]);
			if (!leads(s, x, x->n, x->op[0][x->n]))
				break;
			bool all = true;
			for (uint32_t k = 1; k < x->ncase && all; k++) {
				const ts_region *ck = &s->rg[TS_ITEM_ID(c->item[k])];
				all = x->n < ck->nitem && TS_ITEM_KIND(ck->item[x->n]) == TS_ITEM_OP;
				x->op[k][x->n] = all ? TS_ITEM_ID(ck->item[x->n]) : TS_NONE;
				all = all && same_pass(s, x, k, x->n, x->op[k][x->n]);
			}
			if (!all)
				break;
			dec |= decodes(s, x->op[0][x->n]);
		}
		if (x->n > 0 && dec)
			return true;
	}
	return false;
}

bool ts_rw_hoist_decode_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	hd x;
	return find(s, &x);
}

/* the run op standing for o (case 0's), or o */
static ts_id first_op(const hd *x, ts_id o)
{
	for (uint32_t c = 1; c < x->ncase; c++)
		for (uint32_t j = 0; j < x->n; j++)
			if (x->op[c][j] == o)
				return x->op[0][j];
	return o;
}

/* Every dependency on a later case's run op on case 0's instead (once). */
static void remap_deps(tcp_sched *s, const hd *x, ts_id o)
{
	ts_op *q = &s->op[o];
	uint32_t keep = 0;
	for (uint32_t k = 0; k < q->ndep; k++) {
		ts_id d = first_op(x, q->dep[k]);
		bool seen = d == o && q->dist[k] == 0;
		for (uint32_t i = 0; i < keep && !seen; i++)
			seen = q->dep[i] == d && q->dist[i] == q->dist[k];
		if (seen)
			continue;
		q->dep[keep] = d;
		q->dist[keep++] = q->dist[k];
	}
	q->ndep = keep;
}

/* Guard region nx (pipe-decode's next-block run, after the classes region)
 * copied into every case of classes region cls, just after the case's last
 * item touching the run's destinations and the contractions right after it
 * (those that consume its last TRF load: the in-order main context would
 * otherwise hold them behind the decode), so the next block's decode runs
 * while the sub context loads this block's later tiles, not after the
 * block's last pass. Each copy keeps the run's
 * dependencies outside the classes region and in its own case; every waiter
 * of a run op waits for every case's copy at the same distance (one case
 * runs); the originals go (nx keeps its scalars: the verifier wants every
 * region reached). */
static void into_cases(tcp_sched *s, const ts_env *e, ts_id cls, ts_id nx)
{
	const ts_region *g = &s->rg[nx];
	uint32_t nit = g->nitem, nop0 = s->nop, ncase = s->rg[cls].nitem;
	uint32_t *items = ctx_alloc(e->ctx, (nit + 1) * sizeof *items);
	memcpy(items, g->item, nit * sizeof *items);
	ts_id *cp = ctx_alloc(e->ctx, ((size_t)nit * ncase + 1) * sizeof *cp); /* cp[c * nit + k]: item k's copy */
	for (uint32_t c = 0; c < ncase; c++) {
		ts_id cr = TS_ITEM_ID(s->rg[cls].item[c]);
		int64_t at = -1;
		for (uint32_t k = 0; k < nit; k++) {
			if (TS_ITEM_KIND(items[k]) != TS_ITEM_OP)
				continue;
			int32_t t = s->op[TS_ITEM_ID(items[k])].in.v[TCP_V_DST].t;
			for (ts_id o = 0; o < nop0; o++) {
				int64_t i = (ts_op_writes(&s->op[o], t) || ts_op_reads(&s->op[o], t)) ? ts_op_index(s, cr, o) : -1;
				at = i > at ? i : at;
			}
		}
		ts_id ng = ts_add_region(s, cr, TS_RG_GUARD, s->rg[nx].pred);
		uint32_t it = s->rg[cr].item[s->rg[cr].nitem - 1];
		s->rg[cr].nitem--;
		while (at + 1 < (int64_t)s->rg[cr].nitem && TS_ITEM_KIND(s->rg[cr].item[at + 1]) == TS_ITEM_OP &&
		       s->op[TS_ITEM_ID(s->rg[cr].item[at + 1])].in.op == TCP_OP_TU_CONTRACT)
			at++;
		ts_region_insert(s, cr, (uint32_t)(at + 1), it);
		for (uint32_t k = 0; k < nit; k++) {
			ts_id id = TS_ITEM_ID(items[k]), *me = &cp[c * nit + k];
			if (TS_ITEM_KIND(items[k]) == TS_ITEM_SC) {
				const ts_scalar q = s->sc[id];
				ts_id a = q.a, b = q.b;
				for (uint32_t j = 0; j < k; j++)
					if (TS_ITEM_KIND(items[j]) == TS_ITEM_SC) {
						a = a == TS_ITEM_ID(items[j]) ? cp[c * nit + j] : a;
						b = b == TS_ITEM_ID(items[j]) ? cp[c * nit + j] : b;
					}
				*me = ts_add_scalar(s, ng, q.name, q.kind, q.op, a, b, q.imm);
				s->sc[*me].buf = q.buf;
				continue;
			}
			const ts_op q = s->op[id];
			tcp_insn in = q.in;
			for (int w = 0; w < TCP_NVIEW; w++)
				for (uint32_t j = 0; j < k && in.v[w].reg >= 0; j++)
					if (TS_ITEM_KIND(items[j]) == TS_ITEM_SC && (ts_id)in.v[w].reg == TS_ITEM_ID(items[j])) {
						in.v[w].reg = (int32_t)cp[c * nit + j];
						break;
					}
			*me = ts_add_op(s, ng, &in, q.phase);
			s->op[*me].feature = q.feature;
			s->op[*me].node = q.node;
			for (uint32_t d = 0; d < s->op[id].ndep; d++) {
				ts_id on = s->op[id].dep[d];
				uint8_t dist = s->op[id].dist[d];
				if (ts_region_within(s, s->op[on].region, cls) && !ts_region_within(s, s->op[on].region, cr))
					continue;
				for (uint32_t j = 0; j < k; j++)
					on = TS_ITEM_KIND(items[j]) == TS_ITEM_OP && on == TS_ITEM_ID(items[j]) && dist == 0
						     ? cp[c * nit + j]
						     : on;
				ts_add_dep(s, *me, on, dist);
			}
		}
	}
	uint8_t *drop = ctx_alloc(e->ctx, s->nop + 1);
	memset(drop, 0, s->nop + 1);
	for (uint32_t k = 0; k < nit; k++)
		if (TS_ITEM_KIND(items[k]) == TS_ITEM_OP)
			drop[TS_ITEM_ID(items[k])] = 1;
	for (ts_id o = 0; o < nop0; o++) {
		if (drop[o])
			continue;
		uint32_t nd = s->op[o].ndep;
		for (uint32_t d = 0; d < nd; d++)
			for (uint32_t k = 0; k < nit; k++)
				if (TS_ITEM_KIND(items[k]) == TS_ITEM_OP && s->op[o].dep[d] == TS_ITEM_ID(items[k]))
					for (uint32_t c = 0; c < ncase; c++)
						ts_add_dep(s, o, cp[c * nit + k], s->op[o].dist[d]);
	}
	for (ts_id b = 0; b < s->nbuf; b++) /* a span ending at a run op: at its first and last case's copies */
		for (uint32_t k = 0; k < nit && s->buf[b].life == TS_LIFE_SPAN; k++) {
			if (TS_ITEM_KIND(items[k]) != TS_ITEM_OP)
				continue;
			if (s->buf[b].first == TS_ITEM_ID(items[k]))
				s->buf[b].first = cp[k];
			if (s->buf[b].last == TS_ITEM_ID(items[k]))
				s->buf[b].last = cp[(ncase - 1) * nit + k];
		}
	ts_drop_ops(s, drop);
	ctx_free(e->ctx, drop, 0);
	ctx_free(e->ctx, cp, 0);
	ctx_free(e->ctx, items, 0);
}

moe_status ts_rw_hoist_decode_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	hd x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	uint8_t *drop = ctx_alloc(e->ctx, s->nop + 1), *gone = ctx_alloc(e->ctx, s->nbuf + 1);
	memset(drop, 0, s->nop + 1);
	memset(gone, 0, s->nbuf + 1);
	for (uint32_t c = 1; c < x.ncase; c++)
		for (uint32_t j = 0; j < x.n; j++) {
			drop[x.op[c][j]] = 1;
			int32_t t = s->op[x.op[c][j]].in.v[TCP_V_DST].t, t0 = s->op[x.op[0][j]].in.v[TCP_V_DST].t;
			if (t == t0)
				continue;
			gone[t] = 1;
			for (ts_id o = 0; o < s->nop; o++)
				for (int w = 0; w < TCP_NVIEW; w++)
					if (s->op[o].in.v[w].t == t)
						s->op[o].in.v[w].t = t0;
		}
	for (ts_id o = 0; o < s->nop; o++)
		if (!drop[o])
			remap_deps(s, &x, o);
	/* case 0's run before the classes region, in order */
	ts_region *c0 = &s->rg[TS_ITEM_ID(s->rg[x.cls].item[0])];
	memmove(c0->item, c0->item + x.n, (c0->nitem - x.n) * sizeof *c0->item);
	c0->nitem -= x.n;
	for (uint32_t j = 0; j < x.n; j++) {
		ts_region_insert(s, x.body, x.at + j, TS_ITEM_OP | x.op[0][j]);
		s->op[x.op[0][j]].region = x.body;
		s->op[x.op[0][j]].feature = feature;
	}
	/* the run's spans: from its pass to the last op touching them now */
	uint32_t *pos = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	for (uint32_t j = 0; j < x.n; j++) {
		ts_buf *b = &s->buf[s->op[x.op[0][j]].in.v[TCP_V_DST].t];
		for (ts_id o = 0; o < s->nop; o++)
			if (!drop[o] && (ts_op_writes(&s->op[o], (int32_t)(b - s->buf)) ||
					    ts_op_reads(&s->op[o], (int32_t)(b - s->buf))) &&
				pos[o] > pos[b->last])
				b->last = o;
	}
	ctx_free(e->ctx, pos, 0);
	for (ts_id b = 0; b < s->nbuf; b++) /* a span pinned to a dropped copy: to case 0's pass */
		if (!gone[b] && s->buf[b].life == TS_LIFE_SPAN) {
			s->buf[b].first = first_op(&x, s->buf[b].first);
			s->buf[b].last = first_op(&x, s->buf[b].last);
		}
	ts_drop_unused_bufs(s, gone);
	ts_drop_ops(s, drop);
	ctx_free(e->ctx, gone, 0);
	ctx_free(e->ctx, drop, 0);
	int pdrow = ts_rewrite_find("pipe-decode", strlen("pipe-decode"));
	if (pdrow < 0 || (e->off >> pdrow & 1) || !ts_rw_pipe_decode_applies(s, e))
		return MOE_OK;
	moe_status st = ts_rw_pipe_decode_apply(s, e, (uint16_t)(pdrow + 1));
	if (st != MOE_OK)
		return st;
	s->ran |= 1ull << pdrow;
	ts_id pe = ts_find_scalar(s, "pdenext");
	if (pe == TS_NONE || s->rg[s->sc[pe].region].parent != x.body)
		return MOE_ERR_INVALID;
	into_cases(s, e, x.cls, s->sc[pe].region);
	return MOE_OK;
}
