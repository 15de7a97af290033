/* backend-tcp/compiler/rw/defer_stores.c: rewrite `defer-stores`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * sched-build ends block g's body with the store of its value (a DM buffer,
 * y) into row g of the loop's HBM result. The DMA context runs its commands
 * in issue order, so that store, which waits for block g's last compute,
 * holds back block g + 1's row copies and weight prefetch queued behind it.
 * The rewrite moves the store into the next block: block g + 1 stores row
 * g (under g > 0) after its own DMA-only prefix (rows, prefetch), and the
 * loop's epilogue stores row nb - 1 (under nb > 0). Values are unchanged:
 *  - the moved store reads the previous block's y: its dependencies on body
 *    ops become distance 1; each body op that overwrites y, which waited
 *    for the previous block's store (distance 1), now waits for the store of
 *    its own block (distance 0), so y is not overwritten before it is saved;
 *  - y is live across blocks: a span buffer becomes loop-lived;
 *  - the epilogue's store depends on what the store depended on and on the
 *    store; every op after the loop that waited for the store also waits
 *    for it. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* The body's store of loop 0's value, or TS_NONE: the last op item of the
 * body, a dma.copy of a whole DM buffer read nowhere outside the body into
 * row $g of an HBM buffer that no other op writes and no op in the body
 * reads. */
static ts_id store_of(const tcp_sched *s)
{
	if (s->nloop != 1)
		return TS_NONE;
	const ts_loop *l = &s->loop[0];
	const ts_region *b = &s->rg[l->body];
	ts_id st = TS_NONE;
	for (uint32_t k = b->nitem; k-- > 0 && st == TS_NONE;)
		if (TS_ITEM_KIND(b->item[k]) == TS_ITEM_OP)
			st = TS_ITEM_ID(b->item[k]);
		else if (TS_ITEM_KIND(b->item[k]) == TS_ITEM_RG)
			return TS_NONE;
	if (st == TS_NONE)
		return TS_NONE;
	const tcp_insn *in = &s->op[st].in;
	const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || d->t < 0 || y->t < 0 || (ts_id)d->reg != l->g || y->reg >= 0 || in->vreg >= 0 ||
		s->buf[d->t].space != TCP_HBM || s->buf[y->t].space != TCP_DM || s->buf[y->t].slots > 1)
		return TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == st)
			continue;
		bool body = ts_region_within(s, s->op[o].region, l->body);
		for (int w = 0; w < TCP_NVIEW; w++) {
			int32_t t = s->op[o].in.v[w].t;
			if ((t == d->t && (w == TCP_V_DST || body)) || (t == y->t && !body))
				return TS_NONE;
		}
	}
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD && (s->sc[c].buf == (ts_id)d->t || s->sc[c].buf == (ts_id)y->t))
			return TS_NONE;
	return st;
}

bool ts_rw_defer_stores_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	return store_of(s) != TS_NONE && s->loop[0].G > 1;
}

/* whether body item it holds a command on another context than the DMA's */
static bool computes(const tcp_sched *s, uint32_t it)
{
	if (TS_ITEM_KIND(it) == TS_ITEM_OP)
		return s->op[TS_ITEM_ID(it)].ctx != TCP_CTX_DMA;
	if (TS_ITEM_KIND(it) != TS_ITEM_RG)
		return false;
	for (ts_id o = 0; o < s->nop; o++)
		if (s->op[o].ctx != TCP_CTX_DMA && ts_region_within(s, s->op[o].region, TS_ITEM_ID(it)))
			return true;
	return false;
}

/* whether body item it holds an op that waits for op st (a later block's store) */
static bool waits(const tcp_sched *s, uint32_t it, ts_id st)
{
	for (ts_id o = 0; o < s->nop; o++) {
		bool in = TS_ITEM_KIND(it) == TS_ITEM_OP ? o == TS_ITEM_ID(it)
			: TS_ITEM_KIND(it) == TS_ITEM_RG && ts_region_within(s, s->op[o].region, TS_ITEM_ID(it));
		for (uint32_t k = 0; in && k < s->op[o].ndep; k++)
			if (s->op[o].dep[k] == st)
				return true;
	}
	return false;
}

/* Moves the last n items of region rg to position at. */
static void rotate_in(ts_region *r, uint32_t at, uint32_t n)
{
	uint32_t tail[4];
	memcpy(tail, r->item + r->nitem - n, n * sizeof *tail);
	memmove(r->item + at + n, r->item + at, (r->nitem - n - at) * sizeof *r->item);
	memcpy(r->item + at, tail, n * sizeof *tail);
}

moe_status ts_rw_defer_stores_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	ts_id st = store_of(s);
	if (st == TS_NONE)
		return MOE_ERR_INVALID;
	ts_loop *l = &s->loop[0];
	ts_id body = l->body, ybuf = (ts_id)s->op[st].in.v[TCP_V_S0].t;
	/* the store leaves the body's end (only scalar definitions may follow it) */
	ts_region *b = &s->rg[body];
	uint32_t k = b->nitem;
	while (k-- > 0 && b->item[k] != (TS_ITEM_OP | st))
		;
	memmove(b->item + k, b->item + k + 1, (b->nitem - k - 1) * sizeof *b->item);
	b->nitem--;
	/* block g + 1 stores row g after its DMA-only prefix */
	uint32_t at = 0;
	while (at < b->nitem && !computes(s, b->item[at]) && !waits(s, b->item[at], st))
		at++;
	ts_id gp = ts_add_scalar(s, body, "gprev", TS_SC_ALU, TCP_S_SUB, l->g, TS_NONE, 1);
	ts_id had = ts_add_scalar(s, body, "hadprev", TS_SC_CMP, TCP_C_NE, l->g, TS_NONE, 0);
	ts_id gd = ts_add_region(s, body, TS_RG_GUARD, had);
	rotate_in(&s->rg[body], at, 3);
	ts_region_push(s, gd, TS_ITEM_OP | st);
	ts_op *o = &s->op[st];
	o->region = gd;
	o->feature = feature;
	o->in.v[TCP_V_DST].reg = (int32_t)gp;
	/* the epilogue stores the last block's row */
	ts_id ep = l->epilogue;
	ts_id last = ts_add_scalar(s, ep, "glast", TS_SC_ALU, TCP_S_SUB, l->nb, TS_NONE, 1);
	ts_id any = ts_add_scalar(s, ep, "anyblock", TS_SC_CMP, TCP_C_NE, l->nb, TS_NONE, 0);
	ts_id eg = ts_add_region(s, ep, TS_RG_GUARD, any);
	tcp_insn in = s->op[st].in;
	in.v[TCP_V_DST].reg = (int32_t)last;
	ts_id fin = ts_add_op(s, eg, &in, s->op[st].phase);
	s->op[fin].feature = feature;
	s->op[fin].node = s->op[st].node;
	o = &s->op[st];
	for (uint32_t k = 0; k < o->ndep; k++) {
		ts_add_dep(s, fin, o->dep[k], 0);
		o = &s->op[st];
		if (ts_region_within(s, s->op[o->dep[k]].region, body))
			o->dist[k] = 1;
	}
	ts_add_dep(s, fin, st, 0);
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == st || q == fin)
			continue;
		bool inb = ts_region_within(s, s->op[q].region, body);
		uint32_t nd = s->op[q].ndep;
		for (uint32_t k = 0; k < nd; k++)
			if (s->op[q].dep[k] == st && inb)
				s->op[q].dist[k] = 0;
			else if (s->op[q].dep[k] == st && !ts_region_within(s, s->op[q].region, l->region))
				ts_add_dep(s, q, fin, 0);
	}
	ts_buf *y = &s->buf[ybuf];
	if (y->life == TS_LIFE_SPAN) {
		y->life = TS_LIFE_LOOP;
		y->first = y->last = TS_NONE;
	}
	return MOE_OK;
}
