/* backend-tcp/compiler/rw/same_expert.c: rewrite `same-expert`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * In the double weights mode sched-build gives block g the weight slot
 * g & 1 and fetches block g + 1's expert into slot (g + 1) & 1 in block g
 * (the prefetch guard, under g + 1 < nb). Blocks run in expert order, so
 * consecutive blocks often share an expert, and each of them fetched the
 * same weights again. The rewrite makes the slot follow the expert instead
 * of the block: block g's slot is the previous block's when its expert is
 * the previous block's, else the other one,
 *     $sxchg = cmp.ne $e, $sxeprev          (block 0: $sxeprev = -1)
 *     $sxsum = alu.add $sxwprev, $sxchg     (block 0: $sxwprev = 1)
 *     $slot  = alu.and $sxsum, 1
 * ($sxeprev and $sxwprev loopvars stepped to $e and $slot at each block's
 * end), and the prefetch fetches block g + 1's expert into the other slot
 * ($nslot = ($slot + 1) & 1) only when it differs from block g's (a guard
 * $sxdiff inside the prefetch guard). So an expert's weights are read from
 * HBM once for a run of its blocks. Values are unchanged: a block reads the
 * slot its expert was copied into (by the prologue, block 0, or by the
 * previous block's prefetch, the first block of each run), and a prefetch
 * overwrites the slot that the previous run's blocks read, after them: it
 * keeps its distance-1 dependencies on the previous block's reads of the
 * buffer, and the context that reads a slot runs its blocks in order. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct sx {
	ts_id slot, gd, enext, nslot;
} sx;

static bool is_and1(const ts_scalar *c, ts_id a)
{
	return c->kind == TS_SC_ALU && c->op == TCP_S_AND && c->a == a && c->b == TS_NONE && c->imm == 1;
}

/* Whether scalar id has a use other than those allowed: with reads_only
 * (the slot), views of the buffers that prefetch guard gd's copies write,
 * outside those copies' destinations; else (the next slot) those copies'
 * destinations only. */
static bool used_elsewhere(const tcp_sched *s, ts_id id, ts_id gd, bool reads_only)
{
	for (ts_id c = 0; c < s->nsc; c++)
		if (ts_scalar_reads(&s->sc[c], id))
			return true;
	for (ts_id r = 0; r < s->nrg; r++)
		if (ts_region_reads(&s->rg[r], id))
			return true;
	for (int k = 0; k < s->nloop; k++)
		if (s->loop[k].nb == id || s->loop[k].expert == id || s->loop[k].rows == id)
			return true;
	const ts_region *g = &s->rg[gd];
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (in->vreg >= 0 && (ts_id)in->vreg == id)
			return true;
		for (int w = 0; w < TCP_NVIEW; w++) {
			if (in->v[w].t < 0 || in->v[w].reg < 0 || (ts_id)in->v[w].reg != id)
				continue;
			bool pf = false; /* a view of a buffer the prefetch writes */
			for (uint32_t k = 0; k < g->nitem; k++) {
				uint32_t it = g->item[k];
				pf |= TS_ITEM_KIND(it) == TS_ITEM_OP && s->op[TS_ITEM_ID(it)].in.v[TCP_V_DST].t == in->v[w].t;
			}
			bool inpf = s->op[o].region == gd && w == TCP_V_DST;
			if (reads_only ? !pf || inpf : !inpf)
				return true;
		}
	}
	return false;
}

/* The loop's slot scalar and prefetch guard, or false when loop 0 is not
 * sched-build's double mode with a prefetch of the staged expert list. */
static bool find(const tcp_sched *s, sx *x)
{
	if (s->nloop != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	if (l->weights != TS_W_DOUBLE || l->prefetch != 1 || l->expert == TS_NONE ||
		s->sc[l->expert].kind != TS_SC_SPM_LD || s->sc[l->expert].a != l->g)
		return false;
	const ts_region *b = &s->rg[l->body];
	x->slot = x->gd = TS_NONE;
	bool e_seen = false;
	for (uint32_t k = 0; k < b->nitem; k++) {
		uint32_t it = b->item[k];
		ts_id id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_SC && id == l->expert)
			e_seen = true;
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC && e_seen && x->slot == TS_NONE && is_and1(&s->sc[id], l->g))
			x->slot = id;
		else if (TS_ITEM_KIND(it) == TS_ITEM_RG && s->rg[id].kind == TS_RG_GUARD && x->gd == TS_NONE) {
			const ts_region *g = &s->rg[id];
			const ts_scalar *p = &s->sc[g->pred];
			if (p->kind != TS_SC_CMP || p->op != TCP_C_LT || p->b != l->nb)
				continue;
			const ts_scalar *gn = &s->sc[p->a];
			if (gn->kind != TS_SC_ALU || gn->op != TCP_S_ADD || gn->a != l->g || gn->b != TS_NONE || gn->imm != 1)
				continue;
			ts_id en = TS_NONE, ns = TS_NONE;
			uint32_t nops = 0;
			bool ok = true;
			for (uint32_t j = 0; j < g->nitem && ok; j++) {
				uint32_t gi = g->item[j];
				const ts_scalar *c = &s->sc[TS_ITEM_ID(gi)];
				if (TS_ITEM_KIND(gi) == TS_ITEM_SC && c->kind == TS_SC_SPM_LD && c->a == p->a &&
					c->buf == s->sc[l->expert].buf && en == TS_NONE)
					en = TS_ITEM_ID(gi);
				else if (TS_ITEM_KIND(gi) == TS_ITEM_SC && is_and1(c, p->a) && ns == TS_NONE)
					ns = TS_ITEM_ID(gi);
				else if (TS_ITEM_KIND(gi) == TS_ITEM_OP) {
					const tcp_insn *in = &s->op[TS_ITEM_ID(gi)].in;
					const tcp_view *d = &in->v[TCP_V_DST];
					ok = in->op == TCP_OP_DMA_COPY && d->t >= 0 && d->reg >= 0 && ns != TS_NONE &&
						(ts_id)d->reg == ns && s->buf[d->t].slots == 2 && s->buf[d->t].space == TCP_DM &&
						en != TS_NONE && in->v[TCP_V_S0].reg >= 0 && (ts_id)in->v[TCP_V_S0].reg == en;
					nops++;
				} else
					ok = false;
			}
			if (ok && nops && en != TS_NONE && ns != TS_NONE) {
				x->gd = id;
				x->enext = en;
				x->nslot = ns;
			}
		}
	}
	if (x->slot == TS_NONE || x->gd == TS_NONE)
		return false;
	/* $slot only picks the prefetched buffers' slot, $nslot only the prefetch's */
	return !used_elsewhere(s, x->slot, x->gd, true) && !used_elsewhere(s, x->nslot, x->gd, false);
}

/* Where every block holds its own expert (B >= T: an expert's count is at
 * most T, so it fills one block), no block repeats its predecessor's and
 * the carried slot would only cost control cycles. */
bool ts_rw_same_expert_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sx x;
	return find(s, &x) && s->loop[0].G > 1 && !(s->meta.T >= 1 && s->meta.B >= s->meta.T);
}

static uint32_t item_at(const tcp_sched *s, ts_id rg, uint32_t item)
{
	const ts_region *r = &s->rg[rg];
	uint32_t k = 0;
	while (k < r->nitem && r->item[k] != item)
		k++;
	return k;
}

moe_status ts_rw_same_expert_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	(void)feature;
	sx x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	ts_loop *l = &s->loop[0];
	ts_id body = l->body, pro = l->prologue, ex = l->expert;
	/* the previous block's expert and slot, stepped at each block's end */
	ts_id m1 = ts_add_scalar(s, pro, "sxnone", TS_SC_CONST, 0, TS_NONE, TS_NONE, -1);
	ts_id one = ts_add_scalar(s, pro, "sxone", TS_SC_CONST, 0, TS_NONE, TS_NONE, 1);
	ts_id ep = ts_add_scalar(s, pro, "sxeprev", TS_SC_LOOPVAR, 0, m1, ex, 0);
	ts_id wp = ts_add_scalar(s, pro, "sxwprev", TS_SC_LOOPVAR, 0, one, x.slot, 0);
	/* block g's slot: the previous block's, flipped when the expert changes */
	ts_id chg = ts_add_scalar(s, body, "sxchg", TS_SC_CMP, TCP_C_NE, ex, ep, 0);
	ts_id sum = ts_add_scalar(s, body, "sxsum", TS_SC_ALU, TCP_S_ADD, wp, chg, 0);
	ts_region_move_tail(s, body, item_at(s, body, TS_ITEM_SC | x.slot), 2);
	s->sc[x.slot].a = sum;
	/* the prefetch: into the other slot, only for another expert */
	ts_id gd = x.gd;
	ts_id ns = ts_add_scalar(s, gd, "sxnsum", TS_SC_ALU, TCP_S_ADD, x.slot, TS_NONE, 1);
	ts_region_move_tail(s, gd, item_at(s, gd, TS_ITEM_SC | x.nslot), 1);
	s->sc[x.nslot].a = ns;
	ts_id diff = ts_add_scalar(s, gd, "sxdiff", TS_SC_CMP, TCP_C_NE, x.enext, ex, 0);
	ts_id in = ts_add_region(s, gd, TS_RG_GUARD, diff);
	ts_region *g = &s->rg[gd];
	uint32_t keep = 0;
	for (uint32_t k = 0; k < g->nitem; k++) {
		uint32_t it = g->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP) {
			g->item[keep++] = it;
			continue;
		}
		ts_region_push(s, in, it);
		g = &s->rg[gd];
		s->op[TS_ITEM_ID(it)].region = in;
	}
	g->nitem = keep;
	return MOE_OK;
}
