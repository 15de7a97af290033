/* backend-tcp/compiler/rw/first_gather.c: rewrite `first-gather`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After group-fetch the loop's prologue gathers the first group's experts,
 * min($nb, k) entries of the block list in DM, into half 0 of the weight
 * slots. $nb is an SPM load, so the gather waits for the block list's
 * dma.spm, which stages every list the loop's scalars read (the counts,
 * the experts, the rows) and so waits for the last of routing's and the
 * dispatch's passes that write them; on the one in-order DMA context the
 * weight stream starts only then. The gather itself reads the expert list
 * from DM. Every token routes to K distinct experts, so a loop over every
 * expert runs at least K blocks, and where k <= K and k <= G, min($nb, k)
 * is k: the rewrite issues the gather before the loop with the constant
 * count k, right after the op writing the list, before the dma.spm; it
 * waits for what the prologue's gather waited for, and every op that waited
 * for that gather waits for it. Values are unchanged: the same k entries,
 * read from the same list, into the same half. Where the loop covers only
 * some experts (expert parallelism) and runs fewer than k blocks, the extra
 * entries are blocks past $nb, whose experts the list holds as it holds
 * every one of its G entries (`--no-skip` runs them): their weights arrive
 * unused. A structural row priced by prediction: the list scheduler then
 * orders routing's passes so the list's writer runs first where that is
 * faster. */
#include "backend-tcp/compiler/rewrites.h"

typedef struct fg {
	ts_id op, v, list, w; /* the prologue's gather, its count scalar, the list, its writer */
	int64_t k;
} fg;

/* the one op writing buffer b, standing in the top region; TS_NONE else */
static ts_id top_writer(const tcp_sched *s, ts_id b)
{
	uint32_t nw, nr;
	ts_id w, r;
	ts_buf_uses(s, b, &nw, &nr, &w, &r);
	return nw == 1 && s->op[w].region == s->top ? w : TS_NONE;
}

static bool find(const tcp_sched *s, fg *x)
{
	if (s->nloop != 1 || s->loop[0].weights != TS_W_DOUBLE || s->loop[0].expert == TS_NONE)
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_region *pro = &s->rg[l->prologue];
	ts_id list = s->sc[l->expert].kind == TS_SC_SPM_LD ? s->sc[l->expert].buf : TS_NONE;
	for (uint32_t i = 0; i < pro->nitem && list != TS_NONE; i++) {
		uint32_t it = pro->item[i];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		ts_id o = TS_ITEM_ID(it);
		const ts_op *q = &s->op[o];
		const tcp_insn *in = &q->in;
		const tcp_view *iv = &in->v[TCP_V_S1];
		if (in->op != TCP_OP_DMA_GATHER || in->vreg < 0 || iv->t != (int32_t)list || iv->reg >= 0 || iv->base != 0)
			continue;
		const ts_scalar *v = &s->sc[in->vreg];
		if (v->kind != TS_SC_ALU || v->op != TCP_S_MIN || v->a != l->nb || v->b != TS_NONE || v->region != l->prologue ||
			v->imm < 1 || v->imm > s->meta.K || v->imm > l->G)
			continue;
		bool outside = true;
		for (uint32_t j = 0; j < q->ndep && outside; j++)
			outside = q->dist[j] == 0 && !ts_op_in_loop(s, q->dep[j]);
		ts_id w = top_writer(s, list);
		if (!outside || w == TS_NONE)
			continue;
		/* the count scalar read by this gather alone (ts_drop_scalars drops it) */
		bool alone = l->nb != (ts_id)in->vreg && l->expert != (ts_id)in->vreg && l->rows != (ts_id)in->vreg &&
			     l->g != (ts_id)in->vreg;
		for (ts_id p = 0; p < s->nop && alone; p++)
			alone = p == o || !ts_insn_reads(&s->op[p].in, (ts_id)in->vreg);
		for (ts_id c = 0; c < s->nsc && alone; c++)
			alone = !ts_scalar_reads(&s->sc[c], (ts_id)in->vreg);
		for (ts_id r = 0; r < s->nrg && alone; r++)
			alone = !ts_region_reads(&s->rg[r], (ts_id)in->vreg);
		if (!alone)
			continue;
		*x = (fg){o, (ts_id)in->vreg, list, w, v->imm};
		return true;
	}
	return false;
}

static void hoist(tcp_sched *s, const fg *x, uint16_t feature)
{
	uint32_t at = (uint32_t)ts_op_index(s, s->top, x->w) + 1, nop0 = s->nop;
	ts_id kc = ts_add_scalar(s, s->top, "fgk", TS_SC_CONST, 0, TS_NONE, TS_NONE, x->k);
	ts_region_move_tail(s, s->top, at, 1);
	tcp_insn in = s->op[x->op].in;
	in.vreg = (int32_t)kc;
	ts_id sp = ts_spec_copy(s, &in, x->op, at + 1, feature);
	const ts_op *q = &s->op[x->op];
	for (uint32_t j = 0; j < q->ndep; j++)
		ts_add_dep_once(s, sp, q->dep[j], q->dist[j]);
	ts_add_dep_once(s, sp, x->w, 0);
	ts_spec_waiters(s, &x->op, &sp, 1, nop0);
	/* the slot is live from the gather on, through the loop */
	ts_id d = (ts_id)in.v[TCP_V_DST].t;
	ts_buf *b = &s->buf[d];
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	if (b->life == TS_LIFE_LOOP || b->life == TS_LIFE_BLOCK) {
		ts_id last = sp;
		for (ts_id o = 0; o < s->nop; o++)
			if (o != x->op && ts_op_reads(&s->op[o], (int32_t)d) && pos[o] > pos[last])
				last = o;
		b->life = TS_LIFE_SPAN;
		b->first = sp;
		b->last = last;
	}
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	drop[x->op] = 1;
	ts_drop_ops_to(s, drop, sp, pos);
	ctx_free(s->ctx, drop, 0);
	ctx_free(s->ctx, pos, 0);
	uint8_t *dsc = ctx_alloc(s->ctx, s->nsc + 1);
	dsc[x->v] = 1;
	ts_drop_scalars(s, dsc);
	ctx_free(s->ctx, dsc, 0);
}

TS_RW_EACH_SITE(first_gather, fg, hoist)
