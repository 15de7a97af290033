/* backend-tcp/compiler/rw/gather_ahead.c: rewrite `gather-ahead`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After the block loop the combine runs in token chunks: a dma.gather of
 * the chunk's rows from the loop's HBM result into a DM buffer, then the
 * main context's passes that weight and add them. sched-build emits the
 * chunks one after the other, so each gather's buffer lives only from its
 * gather to its chunk's last pass; the planner gives every chunk the same
 * bytes and the reuse order makes gather i + 1 wait for chunk i's passes,
 * while the in-order DMA context, which has nothing else to do, idles.
 *
 * Taken are: in the top region after the loop, dma.gather ops A and then G
 * (the next such gather), each writing a DM buffer that no other op writes,
 * no view of G moved by a scalar; R, the first op after A reading A's
 * buffer, stands before G. G moves to just before R's item when every
 * dependency of G stands before R and no op from R up to G touches G's
 * buffer. Taken in order, gather i + 1 then stands before chunk i's passes:
 * two gather buffers are live at a time, so the planner places them apart
 * and the DMA context gathers chunk i + 1 while the main context adds
 * chunk i. Every hazard being an explicit dependency (5.1), G passes only
 * ops it does not depend on and that do not touch what it writes, so y is
 * the same bit for bit. Spans are renewed to the new positions; the row is
 * priced (ts_benefit_by_prediction), which includes the two buffers fitting
 * in DM. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* The top region's first item after the block loop's region; nitem if the
 * loop does not stand in the top region. */
static uint32_t after_loop(const tcp_sched *s)
{
	ts_id lrg = s->loop[0].region;
	int64_t at = ts_item_index(s, s->top, lrg, TS_ITEM_RG | lrg);
	return at < 0 ? s->rg[s->top].nitem : (uint32_t)at + 1;
}

static bool combine_gather(const tcp_sched *s, uint32_t item)
{
	if (TS_ITEM_KIND(item) != TS_ITEM_OP)
		return false;
	const tcp_insn *in = &s->op[TS_ITEM_ID(item)].in;
	if (in->op != TCP_OP_DMA_GATHER || in->vreg >= 0 || in->v[TCP_V_DST].t < 0 ||
		s->buf[in->v[TCP_V_DST].t].space != TCP_DM)
		return false;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && in->v[w].reg >= 0)
			return false;
	return true;
}

typedef struct site {
	uint32_t from, to; /* G's item index and the index it moves to (R's) */
} site;

/* The first site in the top region's order; false where none. */
static bool find(const tcp_sched *s, site *x)
{
	const ts_region *top = &s->rg[s->top];
	uint32_t a = UINT32_MAX;
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	bool found = false;
	for (uint32_t k = after_loop(s); k < top->nitem && !found; k++) {
		if (!combine_gather(s, top->item[k]))
			continue;
		if (a == UINT32_MAX) {
			a = k;
			continue;
		}
		uint32_t pa = a;
		ts_id A = TS_ITEM_ID(top->item[pa]), G = TS_ITEM_ID(top->item[k]);
		int32_t ta = s->op[A].in.v[TCP_V_DST].t, tg = s->op[G].in.v[TCP_V_DST].t;
		a = k;
		if (ta == tg)
			continue;
		/* R: the first reader of A's buffer after A; no other op may write
		 * either buffer, and none from R up to G may read G's: the last
		 * reader of G's buffer before G (lastg) must stand before R */
		ts_id R = TS_NONE;
		uint32_t lastg = 0;
		bool ok = true, anyg = false;
		for (ts_id o = 0; o < s->nop && ok; o++) {
			const ts_op *q = &s->op[o];
			if ((o != A && ts_op_writes(q, ta)) || (o != G && ts_op_writes(q, tg)))
				ok = false;
			else if (pos[o] > pos[A] && pos[o] < pos[G] && ts_op_reads(q, ta) && (R == TS_NONE || pos[o] < pos[R]))
				R = o;
			if (pos[o] < pos[G] && ts_op_reads(q, tg) && (!anyg || pos[o] > lastg)) {
				lastg = pos[o];
				anyg = true;
			}
		}
		if (!ok || R == TS_NONE || (anyg && lastg >= pos[R]))
			continue;
		for (uint32_t j = 0; j < s->op[G].ndep && ok; j++)
			ok = s->op[G].dep[j] < s->nop && pos[s->op[G].dep[j]] < pos[R];
		int64_t at = ts_op_index(s, s->top, R);
		if (!ok || at < 0 || (uint32_t)at <= pa || (uint32_t)at >= k)
			continue;
		x->from = k;
		x->to = (uint32_t)at;
		found = true;
	}
	ctx_free(s->ctx, pos, 0);
	return found;
}

static void move(tcp_sched *s, const site *x)
{
	ts_region *top = &s->rg[s->top];
	uint32_t it = top->item[x->from];
	memmove(&top->item[x->to + 1], &top->item[x->to], (x->from - x->to) * sizeof *top->item);
	top->item[x->to] = it;
}

bool ts_rw_gather_ahead_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	site x;
	return s->nloop >= 1 && find(s, &x);
}

moe_status ts_rw_gather_ahead_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	site x;
	if (s->nloop < 1 || !find(s, &x))
		return MOE_ERR_INVALID;
	uint32_t *old = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *old);
	ts_op_positions(s, old);
	do
		move(s, &x);
	while (find(s, &x));
	ts_renew_spans(s, e->ctx, old);
	ctx_free(e->ctx, old, 0);
	return MOE_OK;
}
