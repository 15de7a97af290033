/* backend-tcp/compiler/rw/split_last_group.c: rewrite `split-last-group`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After group-fetch or group-runs, the body's prefetch moves the next group
 * of k experts into the other half of each weight slot with one dma.gather
 * by the hit list, and the group's first block waits for all k. Every other
 * group's gather overlaps the compute of the group before; the last does
 * not: after its last byte the DMA context idles while the last group's k
 * blocks compute in turn. The rewrite splits the gather of the last group
 * (the list holding at most k entries from the gather's first index) in
 * two gathers of k / 2 entries (one where at most k / 2 are left: a classes
 * region on the entries left), so the first k / 2 blocks compute while the
 * rest arrives;
 * every other group keeps its one gather (one more command would delay the
 * in-order DMA context's weight stream by its setup). Each part waits for
 * what the gather waited for, and every op that waited for the gather
 * waits for both parts: the timeline tells a group's entries apart
 * (sched_time.c, units), so a block's loads wait for the part holding its
 * expert, as the simulator's hazards on element ranges do. Values are
 * unchanged: the parts move the same rows to the same entries.
 *
 * The last part (the one part where at most k / 2 entries are left, the
 * second of two) may be cut once more, by columns: where the body's loads
 * of an entry divide at a point P (the first projections' weights of a
 * packed expert below P, the last projection's from P on), the part moves
 * columns [0, P) of its entries, then [P, n), so the last blocks' first
 * projections load and contract while their last projection's weights
 * arrive (the timeline tells those columns apart: sched_time.c, units).
 * A trial decides the cut (one more command on the DMA queue): taken where
 * the placed copy is predicted faster.
 *
 * Applies to a body gather into a two-slot DM buffer's half (its
 * destination moved by group-fetch's half register) of k >= 2 rows (k
 * even), valid count min(left, k) with left = the list's length less the
 * gather's first index register, its index view moved by that register,
 * standing last in its region. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { SG_MAX = 4 };

typedef struct sg {
	ts_id g[SG_MAX]; /* the gathers */
	uint32_t n;
} sg;

static const ts_scalar *alu_of(const tcp_sched *s, int32_t reg, int op)
{
	if (reg < 0 || (uint32_t)reg >= s->nsc)
		return NULL;
	const ts_scalar *c = &s->sc[reg];
	return c->kind == TS_SC_ALU && c->op == op ? c : NULL;
}

/* whether op o is a group's prefetch gather this rewrite can split */
static bool group_gather(const tcp_sched *s, ts_id o)
{
	const ts_op *p = &s->op[o];
	const tcp_insn *in = &p->in;
	const tcp_view *d = &in->v[TCP_V_DST], *ix = &in->v[TCP_V_S1];
	if (in->op != TCP_OP_DMA_GATHER || in->ndim != 3 || in->dim[0] != 1 || in->dim[1] < 2 || in->dim[1] % 2 ||
		d->t < 0 || ix->t < 0 || ix->reg < 0 || ix->scale != 1 || d->reg < 0 || !ts_group_half(s, d->reg) ||
		in->vreg < 0 || !ts_op_in_loop(s, o) || s->op[o].region == s->loop[0].prologue)
		return false;
	const ts_buf *b = &s->buf[d->t];
	if (b->space != TCP_DM || b->slots != 2 || d->stride[1] != in->dim[2] || d->stride[2] != 1 ||
		d->scale != ts_buf_numel(b) || d->base != 0 || in->dim[1] * in->dim[2] != ts_buf_numel(b))
		return false;
	/* valid = min(left, k), left = length - first index */
	const ts_scalar *v = alu_of(s, in->vreg, TCP_S_MIN);
	const ts_scalar *left = v && v->b == TS_NONE && v->imm == in->dim[1] ? alu_of(s, (int32_t)v->a, TCP_S_SUB) : NULL;
	if (!left || left->b == TS_NONE || left->b != (ts_id)ix->reg)
		return false;
	const ts_region *r = &s->rg[p->region];
	return r->nitem && r->item[r->nitem - 1] == (TS_ITEM_OP | o);
}

static bool find(const tcp_sched *s, sg *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1 || s->loop[0].weights != TS_W_DOUBLE)
		return false;
	for (ts_id o = 0; o < s->nop; o++)
		if (group_gather(s, o)) {
			if (x->n == SG_MAX)
				return false;
			x->g[x->n++] = o;
		}
	return x->n > 0;
}

bool ts_rw_split_last_group_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sg x;
	return find(s, &x);
}

/* A part of gather o: h rows from entry `from` of its half, valid count
 * register v, index register ix, in region rg. */
static ts_id part(tcp_sched *s, ts_id o, ts_id rg, int64_t from, int64_t h, ts_id v, ts_id ix, uint16_t feature)
{
	tcp_insn in = s->op[o].in;
	in.dim[1] = h;
	in.vreg = (int32_t)v;
	in.v[TCP_V_DST].base += from * in.dim[2];
	in.v[TCP_V_S1].reg = (int32_t)ix;
	ts_id p = ts_add_op(s, rg, &in, s->op[o].phase);
	s->op[p].node = s->op[o].node;
	s->op[p].feature = feature;
	for (uint32_t j = 0; j < s->op[o].ndep; j++)
		ts_add_dep(s, p, s->op[o].dep[j], s->op[o].dist[j]);
	return p;
}

/* Where the loads of buffer b's entries of n elements divide: the largest
 * P in (0, n) at which some reader's columns start and no reader's columns
 * straddle; 0 where none does. Readers are the ops reading b (every view
 * but the destination), their columns taken modulo n. */
static int64_t columns_cut(const tcp_sched *s, ts_id b, int64_t n)
{
	/* the readers' columns, [ca, cz) modulo n (cz - ca beyond n: more than an entry) */
	int64_t (*col)[2] = ctx_alloc(s->ctx, ((size_t)s->nop * TCP_NVIEW + 1) * sizeof *col), best = 0;
	uint32_t nc = 0;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
			if (in->v[w].t < 0 || (ts_id)in->v[w].t != b)
				continue;
			int64_t lo, hi;
			ts_view_span(in, &in->v[w], &lo, &hi);
			col[nc][0] = lo % n, col[nc][1] = lo % n + (hi - lo), nc++;
		}
	}
	for (uint32_t i = 0; i < nc; i++) {
		int64_t c = col[i][0];
		if (c <= best || col[i][1] > n)
			continue;
		bool straddled = false;
		for (uint32_t j = 0; j < nc && !straddled; j++) {
			int64_t ca = col[j][0], cz = col[j][1];
			straddled = cz - ca > n || (ca < c && cz > c) || (ca < c + n && cz > c + n);
		}
		if (!straddled)
			best = c;
	}
	ctx_free(s->ctx, col, 0);
	return best;
}

/* Part p cut at column c of its entries: p moves [0, c), a new op after it
 * in its region [c, n), which waits for p and what p waits for, is
 * ordered both ways with the loop's other writers of the buffer w[0..nw)
 * (dist 1), and which every waiter of p waits for. */
static void cut_columns(tcp_sched *s, ts_id p, int64_t c, const ts_id *w, int nw, uint16_t feature)
{
	tcp_insn in = s->op[p].in;
	int64_t n = in.dim[2];
	s->op[p].in.dim[2] = c;
	in.dim[2] = n - c;
	in.v[TCP_V_DST].base += c;
	in.v[TCP_V_S0].base += c;
	ts_id q = ts_add_op(s, s->op[p].region, &in, s->op[p].phase);
	s->op[q].node = s->op[p].node;
	s->op[q].feature = feature;
	for (uint32_t j = 0; j < s->op[p].ndep; j++)
		ts_add_dep(s, q, s->op[p].dep[j], s->op[p].dist[j]);
	ts_add_dep(s, q, p, 0); /* spans of several entries meet: after p, as the in-order queue runs them */
	for (int i = 0; i < nw; i++)
		if (w[i] != p)
			ts_add_dep_once(s, q, w[i], 1), ts_add_dep_once(s, w[i], q, 1);
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == q || o == p)
			continue;
		for (uint32_t j = 0, nd = s->op[o].ndep; j < nd; j++)
			if (s->op[o].dep[j] == p)
				ts_add_dep_once(s, o, q, s->op[o].dist[j]);
	}
}

static void split(tcp_sched *s, ts_id o, uint16_t feature, bool cols)
{
	const tcp_insn *in = &s->op[o].in;
	int64_t k = in->dim[1], h = k / 2, cap = ts_buf_numel(&s->buf[in->v[TCP_V_S1].t]);
	ts_id v = (ts_id)in->vreg, left = s->sc[v].a, ix = (ts_id)in->v[TCP_V_S1].reg, rg = s->op[o].region;
	/* the gather's place becomes a classes region on left: at most h
	 * entries left (one part), fewer than k + h (two parts: the last group,
	 * or the one before a last group of fewer than h), more (the gather) */
	s->rg[rg].nitem--;
	int64_t bound[3] = {h, k + h - 1, cap > k + h ? cap : k + h};
	ts_id c = ts_add_classes(s, rg, s->rg[rg].nitem, left, bound, 3);
	ts_id one = TS_ITEM_ID(s->rg[c].item[0]), two = TS_ITEM_ID(s->rg[c].item[1]), all = TS_ITEM_ID(s->rg[c].item[2]);
	ts_region_push(s, all, TS_ITEM_OP | o);
	s->op[o].region = all;
	ts_id p[3];
	p[0] = part(s, o, one, 0, h, v, ix, feature);
	ts_id va = ts_add_scalar(s, two, "sgva", TS_SC_ALU, TCP_S_MIN, v, TS_NONE, h);
	p[1] = part(s, o, two, 0, h, va, ix, feature);
	ts_id vb = ts_add_scalar(s, two, "sgvb", TS_SC_ALU, TCP_S_SUB, v, TS_NONE, h);
	ts_id ib = ts_add_scalar(s, two, "sgix", TS_SC_ALU, TCP_S_ADD, ix, TS_NONE, h);
	p[2] = part(s, o, two, h, h, vb, ib, feature);
	for (int i = 0; i < 3; i++) {
		/* the gather and its parts write the same halves in other blocks:
		 * ordered both ways (one in-order context runs them all) */
		ts_add_dep(s, p[i], o, 1), ts_add_dep(s, o, p[i], 1);
		for (int j = 0; j < 3; j++)
			if (j != i)
				ts_add_dep(s, p[i], p[j], 1);
	}
	/* every waiter of the gather waits for its parts */
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == o || q == p[0] || q == p[1] || q == p[2])
			continue;
		for (uint32_t j = 0, n = s->op[q].ndep; j < n; j++)
			if (s->op[q].dep[j] == o)
				for (int i = 0; i < 3; i++)
					ts_add_dep_once(s, q, p[i], s->op[q].dist[j]);
	}
	int64_t col = cols ? columns_cut(s, (ts_id)s->op[o].in.v[TCP_V_DST].t, s->op[o].in.dim[2]) : 0;
	if (col > 0) { /* the last parts: the one part, the second of two */
		ts_id w[4] = {o, p[0], p[1], p[2]};
		cut_columns(s, p[0], col, w, 4, feature);
		cut_columns(s, p[2], col, w, 4, feature);
	}
}

static bool split_all(tcp_sched *s, const ts_env *e, uint16_t feature, int64_t cols)
{
	(void)e;
	sg x;
	if (!find(s, &x))
		return false;
	for (uint32_t i = 0; i < x.n; i++)
		split(s, x.g[i], feature, cols);
	return true;
}

moe_status ts_rw_split_last_group_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	/* the columns cut where its trial is predicted faster than the halves alone */
	int64_t cy[2];
	for (int k = 0; k < 2; k++)
		cy[k] = ts_price_param(s, e, "<split-last-group trial>", split_all, feature, k);
	return split_all(s, e, feature, cy[1] >= 0 && (cy[0] < 0 || cy[1] < cy[0])) ? MOE_OK : MOE_ERR_INVALID;
}
