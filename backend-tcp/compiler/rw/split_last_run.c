/* backend-tcp/compiler/rw/split_last_run.c: rewrite `split-last-run`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With streamed weights merge-fetches copies a run of n ring tiles by one
 * DMA command, and each tile's load waits for the whole command. Inside the
 * loop that costs nothing where the next tiles' copies keep the DMA context
 * busy, but after the last block's last command the DMA context idles while
 * the last run's n tiles load and contract one after the other (Mixtral-8x7B
 * T = 512, three down tiles: about 15k cycles). The rewrite puts each of the
 * body's last runs (the last ring copy of its region, of each case where
 * row classes copied the body) in a classes region on $slcase = $g - ($nb -
 * 3) (2 in the last block, at most 1 in the others), bounds [1, 2]: case 1
 * (every block but the last) the run as it was, case 2 (the last block) one
 * copy per tile, each with the run's
 * dependencies, and each op that waited for the run and reads the ring
 * through a view no scalar moves waits for the copies of the tiles it reads
 * (any other waiter for all of them). So in the last block the first tiles
 * load and contract while the last arrives, for n - 1 more DMA setups once.
 * Values are unchanged: the same bytes land in the same slots, each before
 * its readers, after everything the run waited for. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { SLR_MAX = 256 };

/* whether op o copies a run of ring tiles of loop l: a dma.copy of dims
 * [n, r, c], 2 <= n <= the ring's slots, from a weight in HBM (moved by a register) into
 * consecutive slots of a DM buffer of l->ring slots, inside the body */
static bool ring_run(const tcp_sched *s, const ts_loop *l, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *v = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->ndim != 3 || in->dim[0] < 2 || in->dim[0] > l->ring || in->vreg >= 0 ||
		in->flags || d->t < 0 ||
		v->t < 0 || d->reg >= 0 || v->reg < 0 || in->v[TCP_V_S1].t >= 0 ||
		!ts_region_within(s, s->op[o].region, l->body))
		return false;
	const ts_buf *r = &s->buf[d->t], *h = &s->buf[v->t];
	return r->space == TCP_DM && r->slots == l->ring && h->space == TCP_HBM &&
	       d->stride[0] == ts_buf_numel(r);
}

/* whether op o copies into loop l's ring (a run or one tile) */
static bool ring_copy(const tcp_sched *s, const ts_loop *l, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST];
	return in->op == TCP_OP_DMA_COPY && d->t >= 0 && s->buf[d->t].space == TCP_DM &&
	       s->buf[d->t].slots == l->ring && ts_region_within(s, s->op[o].region, l->body);
}

/* whether item it (an op, or a region and everything in it) holds a ring copy */
static bool holds_copy(const tcp_sched *s, const ts_loop *l, uint32_t it, int depth)
{
	if (TS_ITEM_KIND(it) == TS_ITEM_OP)
		return ring_copy(s, l, TS_ITEM_ID(it));
	const ts_region *r = &s->rg[TS_ITEM_ID(it)];
	for (uint32_t k = 0; k < r->nitem && depth < 64; k++)
		if (holds_copy(s, l, r->item[k], depth + 1))
			return true;
	return false;
}

/* whether no ring copy can run after op o in its block: none after it in
 * its region or, up to the body, after the region holding it (the other
 * cases of a classes region never run with it) */
static bool last_copy(const tcp_sched *s, const ts_loop *l, ts_id o)
{
	uint32_t it = TS_ITEM_OP | o;
	ts_id r = s->op[o].region;
	for (int depth = 0; depth < 64; depth++) {
		const ts_region *x = &s->rg[r];
		uint32_t k = 0;
		while (k < x->nitem && x->item[k] != it)
			k++;
		for (k++; k < x->nitem; k++)
			if (holds_copy(s, l, x->item[k], 0))
				return false;
		if (r == l->body)
			return true;
		it = TS_ITEM_RG | r;
		r = x->parent;
		if (r < s->nrg && s->rg[r].kind == TS_RG_CLASSES) {
			it = TS_ITEM_RG | r;
			r = s->rg[r].parent;
		}
		if (r >= s->nrg)
			return false;
	}
	return false;
}

/* the body's last runs, at most cap */
static uint32_t find(const tcp_sched *s, ts_id *run, uint32_t cap)
{
	if (s->nloop != 1 || !s->m)
		return 0;
	const ts_loop *l = &s->loop[0];
	if (l->weights != TS_W_STREAM || l->ring < 4 || l->nb == TS_NONE || l->g == TS_NONE)
		return 0;
	uint32_t n = 0;
	for (ts_id o = 0; o < s->nop; o++)
		if (ring_run(s, l, o) && last_copy(s, l, o)) {
			if (n == cap)
				return 0;
			run[n++] = o;
		}
	return n;
}

bool ts_rw_split_last_run_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	ts_id run[SLR_MAX];
	return find(s, run, SLR_MAX) > 0;
}

/* run o (in case 2 of its classes region now) as one copy per tile: o the
 * first, the others after it; its waiters re-pointed */
static void per_tile(tcp_sched *s, ts_id o, uint16_t feature)
{
	ts_id rg = s->op[o].region, nold = s->nop, t[256];
	const tcp_insn whole = s->op[o].in;
	int64_t n = whole.dim[0], slot = whole.v[TCP_V_DST].stride[0]; /* n <= the ring's slots, < 256 */
	int32_t ring = whole.v[TCP_V_DST].t;
	uint32_t at = (uint32_t)ts_op_index(s, rg, o) + 1;
	for (int64_t i = 0; i < n; i++) {
		tcp_insn in = whole;
		in.ndim = 2;
		in.dim[0] = whole.dim[1];
		in.dim[1] = whole.dim[2];
		in.dim[2] = 0; /* unused dimensions are 0, as the schedule's reader leaves them */
		for (int w = TCP_V_DST; w <= TCP_V_S0; w++) {
			tcp_view *v = &in.v[w];
			v->base = whole.v[w].base + i * whole.v[w].stride[0];
			v->stride[0] = whole.v[w].stride[1];
			v->stride[1] = whole.v[w].stride[2];
			v->stride[2] = 0;
		}
		if (!i) {
			s->op[o].in = in;
			s->op[o].feature = feature;
			s->op[o].cost = 0;
			t[0] = o;
			continue;
		}
		t[i] = ts_op_sibling(s, o, &in, at++, TS_NONE, feature);
	}
	int64_t base = whole.v[TCP_V_DST].base;
	for (ts_id q = 0; q < nold; q++) {
		if (q == o)
			continue;
		ts_op *x = &s->op[q];
		for (uint32_t j = 0; j < x->ndep; j++) {
			if (x->dep[j] != o)
				continue;
			uint8_t dist = x->dist[j];
			/* the tiles q reads; all where it reads the ring by a moved view or not at all */
			int64_t lo = -1, hi = -1;
			bool all = false;
			for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
				const tcp_view *v = &x->in.v[w];
				if (v->t != ring)
					continue;
				if (v->reg >= 0) {
					all = true;
					break;
				}
				int64_t a, b;
				ts_view_span(&x->in, v, &a, &b);
				lo = lo < 0 || a < lo ? a : lo;
				hi = b > hi ? b : hi;
			}
			all |= lo < 0 || ts_op_writes(x, ring);
			bool first = true;
			for (int64_t i = 0; i < n; i++) {
				int64_t s0 = base + i * slot, s1 = s0 + slot;
				if (!all && !(lo < s1 && s0 < hi))
					continue;
				if (first) { /* the entry on o itself stands for tile 0, or for the first tile read */
					x->dep[j] = t[i];
					first = false;
				} else {
					ts_add_dep(s, q, t[i], dist);
					x = &s->op[q];
				}
			}
			break;
		}
	}
}

moe_status ts_rw_split_last_run_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	ts_id run[SLR_MAX];
	uint32_t n = find(s, run, SLR_MAX);
	if (!n)
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	ts_id body = l->body, g = l->g, nb = l->nb, lrg = l->region, parent = s->rg[lrg].parent;
	/* $slbase = $nb - 3 once before the loop; $slcase = $g - $slbase in the
	 * body: 2 in the last block, at most 1 in the others */
	int64_t at = ts_item_index(s, parent, parent, TS_ITEM_RG | lrg);
	if (at < 0)
		return MOE_ERR_INVALID;
	ts_id base = ts_add_scalar(s, parent, "slbase", TS_SC_ALU, TCP_S_SUB, nb, TS_NONE, 3);
	ts_region_move_tail(s, parent, (uint32_t)at, 1);
	ts_id key = ts_add_scalar(s, body, "slcase", TS_SC_ALU, TCP_S_SUB, g, base, 0);
	ts_region_move_tail(s, body, 0, 1);
	static const int64_t bound[2] = {1, 2};
	uint8_t *cut = ctx_alloc(s->ctx, s->nop + 1);
	memset(cut, 0, s->nop + 1);
	for (uint32_t k = 0; k < n; k++) {
		ts_id rg = s->op[run[k]].region;
		int64_t i = ts_op_index(s, rg, run[k]);
		if (i < 0)
			continue;
		/* case 1 a copy of the run, case 2 the run itself */
		ts_split_classes(s, rg, (uint32_t)i, 1, key, bound, 2, cut, false, feature);
		per_tile(s, run[k], feature);
	}
	ctx_free(s->ctx, cut, 0);
	return MOE_OK;
}
