/* backend-tcp/compiler/rw/early_results.c: rewrite `early-results`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After count-copies the epilogue (or the top region after the loop) copies
 * the DM result grid R into the HBM result H by a classes region on $nb:
 * case h_k copies blocks [0, h_k).
 * Those copies wait for the last block, yet every block but the last was
 * done long before; in a weight-bound loop the DMA context idles while the
 * last block computes, and then copies the whole grid alone.
 *
 * The rewrite moves the earlier blocks' rows into a late block, block
 * nb - 1 - lead (lead 0, 1 or 2, by trials). The body gains, before the
 * item holding R's first writer, a guard on $g + 1 + lead == $nb holding a
 * classes region on $ernext = $g + 1, bounds 1, 2, ..., G: case c + 1 copies
 * blocks [0, c) (case 1 nothing), so that block g copies exactly the blocks
 * before it. Each epilogue case h_k then copies only blocks
 * [max(h_{k-1} - lead, 0), h_k) (h_{-1} = 0): where nb lies in
 * (h_{k-1}, h_k], blocks nb - 1 - lead .. nb - 1 are among them. Every block
 * below nb reaches H, the late blocks' rows after they wrote them (a block
 * of the epilogue's range copied early is copied again, the same bytes).
 *
 * Dependencies: each early copy waits for every writer of R in the previous
 * block (distance 1: block g - 1 is the last it reads, and each block's
 * writers run after the block before's). The writers of R in its block need
 * not wait for the copies: they write block g through a view moved by
 * $g, the copies read blocks below g, which the verifier sees from the
 * classes bound (docs/tcp-compiler.md 5.6). Each epilogue copy waits for the
 * early copies whose blocks meet its own (both write H), and every reader of
 * H waits for all of them. Values are unchanged: the same rows land in H
 * before the gathers read them. The cases' compares run in one block alone,
 * so G is capped (ER_MAX_G). */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { ER_MAX = 64, ER_MAX_G = 256, ER_MAX_LEAD = 4 };

typedef struct er {
	ts_id cls;            /* count-copies' classes region on $nb in the epilogue */
	ts_id copy[ER_MAX];   /* its cases' copies, one per bound */
	uint32_t n;
	int64_t P, SS;        /* H's and R's block strides */
	int32_t R, H;
	ts_id at;             /* the body item before which the early copies stand */
} er;

/* whether op o copies blocks [0, h) of the DM grid into the HBM result: a
 * [h, P] dma.copy, s0 R from element 0 by block stride SS, dst H from 0 by P */
static bool grid_copy(const tcp_sched *s, ts_id o, int64_t h, er *x)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->dim[0] != h || in->vreg >= 0 || in->flags || d->t < 0 ||
		y->t < 0 || d->reg >= 0 || y->reg >= 0 || d->base || y->base || d->stride[1] != 1 || y->stride[1] != 1 ||
		d->stride[0] != in->dim[1] || y->stride[0] < in->dim[1] || in->v[TCP_V_S1].t >= 0)
		return false;
	if (x->n == 0) {
		x->P = in->dim[1];
		x->SS = y->stride[0];
		x->R = y->t;
		x->H = d->t;
	}
	return in->dim[1] == x->P && y->stride[0] == x->SS && y->t == x->R && d->t == x->H;
}

/* the classes region on $nb in region rg (from item k0; nested guards and
 * sequences searched) whose every case holds one grid copy */
static bool find_cls(const tcp_sched *s, const ts_loop *l, ts_id rg, uint32_t k0, er *x, int depth)
{
	const ts_region *r = &s->rg[rg];
	for (uint32_t k = k0; k < r->nitem && depth < 8; k++) {
		if (TS_ITEM_KIND(r->item[k]) == TS_ITEM_OP)
			continue;
		ts_id c = TS_ITEM_ID(r->item[k]);
		const ts_region *q = &s->rg[c];
		if (q->kind != TS_RG_CLASSES || q->pred != l->nb) {
			if ((q->kind == TS_RG_SEQ || q->kind == TS_RG_GUARD) && find_cls(s, l, c, 0, x, depth + 1))
				return true;
			continue;
		}
		if (q->nbound < 2 || q->nbound > ER_MAX || q->nitem != q->nbound || q->bound[q->nbound - 1] != l->G)
			continue;
		bool ok = true;
		x->n = 0;
		for (uint32_t i = 0; i < q->nbound && ok; i++) {
			const ts_region *cs = &s->rg[TS_ITEM_ID(q->item[i])];
			ok = cs->nitem == 1 && TS_ITEM_KIND(cs->item[0]) == TS_ITEM_OP &&
			     grid_copy(s, TS_ITEM_ID(cs->item[0]), q->bound[i], x);
			if (ok)
				x->copy[x->n++] = TS_ITEM_ID(cs->item[0]);
		}
		if (!ok)
			continue;
		x->cls = c;
		return true;
	}
	return false;
}

/* whether in writes R only through a view moved by $g one block stride SS
 * per block and staying within that block */
static bool own_block(const ts_loop *l, const tcp_insn *in, const er *x)
{
	for (int w = 0; w < TCP_NVIEW; w++) {
		const tcp_view *v = &in->v[w];
		if (v->t != x->R)
			continue;
		if (w != TCP_V_DST)
			continue; /* a read of R: the block's own partial, under the same view */
		int64_t lo, hi;
		ts_view_span(in, v, &lo, &hi);
		if (v->reg < 0 || (ts_id)v->reg != l->g || v->scale != x->SS || lo < 0 || hi > x->SS)
			return false;
	}
	return true;
}

static bool is_copy(const er *x, ts_id o)
{
	for (uint32_t i = 0; i < x->n; i++)
		if (x->copy[i] == o)
			return true;
	return false;
}

static bool find(const tcp_sched *s, er *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1 || !s->m)
		return false;
	const ts_loop *l = &s->loop[0];
	if (l->nb == TS_NONE || l->g == TS_NONE || l->G < 2 || l->G > ER_MAX_G)
		return false;
	int64_t after = ts_item_index(s, s->top, s->top, TS_ITEM_RG | l->region);
	if (!find_cls(s, l, l->epilogue, 0, x, 0) &&
		(after < 0 || !find_cls(s, l, s->top, (uint32_t)after + 1, x, 0)))
		return false;
	const ts_buf *R = &s->buf[x->R], *H = &s->buf[x->H];
	if (R->space != TCP_DM || H->space != TCP_HBM || R->slots != 1 || !ts_buf_gathered_only(s, x->H) ||
		ts_buf_numel(R) < l->G * x->SS || ts_buf_numel(H) < l->G * x->P)
		return false;
	/* R: written in the body only, each block its own rows; read outside
	 * it by the copies alone or after the loop; H: written by the copies
	 * alone */
	uint32_t first = UINT32_MAX;
	for (ts_id o = 0; o < s->nop; o++) {
		const ts_op *p = &s->op[o];
		bool body = ts_region_within(s, p->region, l->body), copy = is_copy(x, o);
		if (ts_op_writes(p, x->H) && !copy)
			return false;
		if (ts_op_writes(p, x->R)) {
			if (!body || !own_block(l, &p->in, x))
				return false;
			int64_t i = ts_item_index(s, l->body, p->region, TS_ITEM_OP | o);
			if (i >= 0 && (uint32_t)i < first)
				first = (uint32_t)i;
		} else if (ts_op_reads(p, x->R) && !copy && ts_op_in_loop(s, o) && !ts_region_within(s, p->region, l->epilogue))
			return false;
	}
	if (first == UINT32_MAX)
		return false;
	x->at = first;
	return true;
}

bool ts_rw_early_results_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	er x;
	return find(s, &x);
}

/* The rewrite with the early copies in block nb - 1 - lead: the guard
 * $g + 1 + lead == $nb, each epilogue case from max(h_{k-1} - lead, 0). */
static bool early(tcp_sched *s, const ts_env *e, uint16_t feature, int64_t lead)
{
	(void)e;
	er x;
	if (!find(s, &x))
		return false;
	const ts_loop *l = &s->loop[0];
	ts_id body = l->body, g = l->g, nb = l->nb;
	int64_t G = l->G;
	ts_id nold = s->nop;

	/* the epilogue's cases: case k copies blocks [max(h_{k-1} - lead, 0), h_k) */
	const ts_region *q = &s->rg[x.cls];
	int64_t lo[ER_MAX];
	for (uint32_t k = 0; k < x.n; k++) {
		lo[k] = k && q->bound[k - 1] > lead ? q->bound[k - 1] - lead : 0;
		tcp_insn in = s->op[x.copy[k]].in;
		in.dim[0] = q->bound[k] - lo[k];
		in.v[TCP_V_DST].base = lo[k] * x.P;
		in.v[TCP_V_S0].base = lo[k] * x.SS;
		ts_set_insn(s, x.copy[k], &in, feature);
	}

	/* the body: guard $g + 1 + lead == $nb { classes $g + 1 [1, 2, ..., G] } */
	ts_id nx = ts_add_scalar(s, body, "ernext", TS_SC_ALU, TCP_S_ADD, g, TS_NONE, 1);
	ts_id end = lead ? ts_add_scalar(s, body, "erend", TS_SC_ALU, TCP_S_ADD, g, TS_NONE, 1 + lead) : nx;
	ts_id last = ts_add_scalar(s, body, "erlast", TS_SC_CMP, TCP_C_EQ, end, nb, 0);
	ts_id gd = ts_add_region(s, body, TS_RG_GUARD, last);
	ts_region_move_tail(s, body, x.at, lead ? 4 : 3);
	int64_t bound[ER_MAX_G];
	uint32_t nbound = 0;
	for (int64_t c = 0; c < G; c++)
		bound[nbound++] = c + 1;
	ts_id cls = ts_add_classes(s, gd, 0, nx, bound, nbound);
	ts_id early[ER_MAX_G];
	uint32_t ne = 0;
	const tcp_insn whole = s->op[x.copy[x.n - 1]].in;
	for (uint32_t i = 1; i < nbound; i++) {
		tcp_insn in = whole;
		in.dim[0] = bound[i] - 1;
		in.v[TCP_V_DST].base = 0;
		in.v[TCP_V_S0].base = 0;
		ts_id cs = TS_ITEM_ID(s->rg[cls].item[i]);
		ts_id o = ts_add_op(s, cs, &in, s->op[x.copy[x.n - 1]].phase);
		s->op[o].feature = feature;
		s->op[o].node = s->op[x.copy[x.n - 1]].node;
		early[ne++] = o;
	}

	/* dependencies */
	for (ts_id o = 0; o < nold; o++) {
		const ts_op *p = &s->op[o];
		if (ts_op_writes(p, x.R))
			for (uint32_t i = 0; i < ne; i++)
				ts_add_dep(s, early[i], o, 1);
		else if (ts_op_reads(p, x.H))
			for (uint32_t i = 0; i < ne; i++)
				ts_add_dep_once(s, o, early[i], 0);
	}
	for (uint32_t k = 0; k < x.n; k++)
		for (uint32_t i = 0; i < ne; i++)
			if (bound[i + 1] - 1 > lo[k])
				ts_add_dep(s, x.copy[k], early[i], 0);
	return true;
}

/* The lead: the last block (0), then 1, 2, ... blocks before it (at most
 * ER_MAX_LEAD), each in a trial copy, placed and predicted, until one is no
 * faster than the fastest before it; the fastest taken (ties: the later
 * block). A block before the last copies while the DMA context would wait
 * for the last blocks' writers; the epilogue then copies the blocks after
 * it, once the last block is done. */
moe_status ts_rw_early_results_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	er x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	int64_t hi = s->loop[0].G - 2 < ER_MAX_LEAD ? s->loop[0].G - 2 : ER_MAX_LEAD;
	int64_t best = ts_price_ascending(s, e, "<early-results trial>", early, feature, 0, hi);
	return early(s, e, feature, best) ? MOE_OK : MOE_ERR_INVALID;
}
