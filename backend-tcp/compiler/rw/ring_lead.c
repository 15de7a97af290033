/* backend-tcp/compiler/rw/ring_lead.c: rewrite `ring-lead`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With streamed weights each block copies its expert's TRF tiles from HBM
 * into a DM ring of slots, each copy just before its load, after the load
 * that read the slot before. Row classes leave the body as two classes
 * regions on $rows with the same bounds: the first holds the block's row
 * gather and its first tile's copy, the second the rest of the block's work,
 * and between them defer-stores' store of the previous block's value. On the
 * one in-order DMA context that store waits for the previous block's last
 * contraction, and the copies of the next tiles, standing after it, wait
 * with it: at each block's start the contraction engine idles while tile
 * 1's copy and load run (Mixtral-8x7B at T = 4096: 14k cycles a block).
 * The ring's lead, the copies that wait for nothing of their own block (their
 * slots were last read in the block before), is the same command in every
 * case of the second region: the rewrite hoists each to the body, between
 * the first region and the store, one op for all cases (its dependencies the
 * union of the cases' copies', every op that waited for a case's copy
 * waiting for it), so the DMA context fetches the lead before the store.
 * Values are unchanged: the hoisted copy writes what each case's copy wrote,
 * after everything any of them waited for, and before every reader. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct rl {
	ts_id a, b; /* the two classes regions of the body, a first */
} rl;

static bool same_classes(const tcp_sched *s, ts_id a, ts_id b)
{
	const ts_region *x = &s->rg[a], *y = &s->rg[b];
	if (x->kind != TS_RG_CLASSES || y->kind != TS_RG_CLASSES || x->pred != y->pred || x->nbound != y->nbound ||
		x->nitem != y->nitem)
		return false;
	for (uint32_t k = 0; k < x->nbound; k++)
		if (x->bound[k] != y->bound[k])
			return false;
	return true;
}

/* whether op o is a ring copy that waits for nothing at distance 0 */
static bool lead_copy(const tcp_sched *s, ts_id o, int32_t ring)
{
	const ts_op *p = &s->op[o];
	if (p->in.op != TCP_OP_DMA_COPY || p->in.v[TCP_V_DST].t != ring)
		return false;
	for (uint32_t j = 0; j < p->ndep; j++)
		if (!p->dist[j])
			return false;
	return true;
}

/* the ring: the buffer the first region's cases copy into */
static int32_t ring_of(const tcp_sched *s, ts_id a)
{
	const ts_region *c = &s->rg[TS_ITEM_ID(s->rg[a].item[0])];
	for (uint32_t i = 0; i < c->nitem; i++) {
		uint32_t it = c->item[i];
		if (TS_ITEM_KIND(it) == TS_ITEM_OP && s->op[TS_ITEM_ID(it)].in.op == TCP_OP_DMA_COPY)
			return s->op[TS_ITEM_ID(it)].in.v[TCP_V_DST].t;
	}
	return -1;
}

static bool find(const tcp_sched *s, rl *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1 || s->loop[0].weights != TS_W_STREAM)
		return false;
	const ts_region *body = &s->rg[s->loop[0].body];
	ts_id first = TS_NONE;
	for (uint32_t k = 0; k < body->nitem; k++) {
		uint32_t it = body->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_RG || s->rg[TS_ITEM_ID(it)].kind != TS_RG_CLASSES)
			continue;
		if (first == TS_NONE) {
			first = TS_ITEM_ID(it);
			continue;
		}
		if (!same_classes(s, first, TS_ITEM_ID(it)))
			return false;
		x->a = first, x->b = TS_ITEM_ID(it);
		int32_t ring = ring_of(s, first);
		if (ring < 0 || s->buf[ring].space != TCP_DM)
			return false;
		/* some case of b holds a lead copy */
		const ts_region *rb = &s->rg[x->b];
		for (uint32_t c = 0; c < rb->nitem; c++) {
			const ts_region *cs = &s->rg[TS_ITEM_ID(rb->item[c])];
			for (uint32_t i = 0; i < cs->nitem; i++)
				if (TS_ITEM_KIND(cs->item[i]) == TS_ITEM_OP && lead_copy(s, TS_ITEM_ID(cs->item[i]), ring))
					return true;
		}
		return false;
	}
	return false;
}

bool ts_rw_ring_lead_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	rl x;
	return find(s, &x);
}

/* The lead copies of case region c, in order, into out (at most max); their count. */
static uint32_t leads(const tcp_sched *s, ts_id c, int32_t ring, ts_id *out, uint32_t max)
{
	const ts_region *r = &s->rg[c];
	uint32_t n = 0;
	for (uint32_t i = 0; i < r->nitem; i++) {
		uint32_t it = r->item[i];
		if (TS_ITEM_KIND(it) == TS_ITEM_OP && lead_copy(s, TS_ITEM_ID(it), ring)) {
			if (n == max)
				return max + 1;
			out[n++] = TS_ITEM_ID(it);
		}
	}
	return n;
}

enum { RL_MAX = 16 };

/* Whether every case of b has the same lead copies (the same commands in the
 * same order); their count in *n. */
static bool uniform(const tcp_sched *s, const rl *x, int32_t ring, uint32_t *n)
{
	const ts_region *rb = &s->rg[x->b];
	ts_id l0[RL_MAX], lk[RL_MAX];
	*n = leads(s, TS_ITEM_ID(rb->item[0]), ring, l0, RL_MAX);
	if (!*n || *n > RL_MAX)
		return false;
	for (uint32_t c = 1; c < rb->nitem; c++) {
		if (leads(s, TS_ITEM_ID(rb->item[c]), ring, lk, RL_MAX) != *n)
			return false;
		for (uint32_t i = 0; i < *n; i++)
			if (memcmp(&s->op[l0[i]].in, &s->op[lk[i]].in, sizeof(tcp_insn)) != 0)
				return false;
	}
	return true;
}

moe_status ts_rw_ring_lead_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	(void)feature; /* the hoisted ops are the last case's, which keep their own */
	rl x;
	uint32_t n;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	int32_t ring = ring_of(s, x.a);
	if (!uniform(s, &x, ring, &n))
		return MOE_ERR_UNSUPPORTED;
	const ts_region *rb = &s->rg[x.b];
	uint32_t nc = rb->nitem;
	ts_id body = s->loop[0].body, *all = ctx_alloc(s->ctx, (size_t)nc * n * sizeof *all);
	for (uint32_t c = 0; c < nc; c++)
		leads(s, TS_ITEM_ID(rb->item[c]), ring, all + (size_t)c * n, n);
	/* each hoisted copy waits for what every case's copy waited for: none
	 * past half the dependency cap (later rewrites add to the lists) */
	uint8_t *mark = ctx_alloc(s->ctx, 2 * ((size_t)s->nop + 1));
	memset(mark, 0, 2 * ((size_t)s->nop + 1));
	ts_id *one = ctx_alloc(s->ctx, (size_t)nc * sizeof *one);
	bool fits = true;
	for (uint32_t i = 0; i < n && fits; i++) {
		for (uint32_t c = 0; c < nc; c++)
			one[c] = all[(size_t)c * n + i];
		fits = ts_deps_union(s, one, nc, mark) <= TS_MAX_DEPS / 2;
	}
	ctx_free(s->ctx, one, 0);
	ctx_free(s->ctx, mark, 0);
	if (!fits) {
		ctx_free(s->ctx, all, 0);
		return MOE_ERR_UNSUPPORTED;
	}
	ts_id nop0 = s->nop;
	uint8_t *drop = ctx_alloc(s->ctx, nop0 + 1);
	memset(drop, 0, nop0 + 1);
	/* map[o]: the hoisted op standing for lead copy o */
	ts_id *map = ctx_alloc(s->ctx, (nop0 + 1) * sizeof *map);
	for (ts_id o = 0; o < nop0; o++)
		map[o] = TS_NONE;
	int64_t at = ts_item_index(s, body, body, TS_ITEM_RG | x.a);
	for (uint32_t i = 0; i < n; i++) {
		ts_id h = all[(size_t)(nc - 1) * n + i]; /* the last case's: the originals */
		for (uint32_t c = 0; c < nc; c++) {
			ts_id o = all[(size_t)c * n + i];
			map[o] = h;
			if (o == h)
				continue;
			drop[o] = 1;
			for (uint32_t j = 0; j < s->op[o].ndep; j++)
				ts_add_dep_once(s, h, s->op[o].dep[j], s->op[o].dist[j]);
		}
		/* out of its case, into the body after the first region */
		ts_region *cr = &s->rg[s->op[h].region];
		uint32_t keep = 0;
		for (uint32_t k = 0; k < cr->nitem; k++)
			if (cr->item[k] != (TS_ITEM_OP | h))
				cr->item[keep++] = cr->item[k];
		cr->nitem = keep;
		s->op[h].region = body;
		ts_region_insert(s, body, (uint32_t)(at + 1 + i), TS_ITEM_OP | h);
	}
	/* every waiter of a case's copy waits for the hoisted one (ts_drop_ops
	 * then drops its dependencies on the dropped copies) */
	for (ts_id q = 0; q < nop0; q++) {
		if (drop[q])
			continue;
		for (uint32_t j = 0, nd = s->op[q].ndep; j < nd; j++) {
			ts_id d = s->op[q].dep[j];
			uint8_t dist = s->op[q].dist[j];
			if (d < nop0 && drop[d] && (map[d] != q || dist != 0))
				ts_add_dep_once(s, q, map[d], dist);
		}
	}
	ts_drop_ops(s, drop);
	ctx_free(s->ctx, drop, 0);
	ctx_free(s->ctx, map, 0);
	ctx_free(s->ctx, all, 0);
	return MOE_OK;
}
