/* backend-tcp/compiler/rw/shared_first.c: rewrite `shared-first`
 * (rewrites.def, docs/tcp-compiler.md 5.1, "Quantized activations").
 *
 * A layer's shared expert reads x and its own weights only, yet the graph
 * (HF's order) computes it after the routed experts, so sched-build emits its
 * weights' copies after the block loop: the DMA context, which binds a decode
 * step, fetches them after the last block's expert, and before the loop it
 * idles while routing computes the expert list that the loop's first fetch
 * waits for (DeepSeek-V3 at T = 1: about 5.5 k cycles between the router's
 * copies and the list's `dma.spm`).
 *
 * The set P: the ops standing directly in the top region after the loop, of
 * any context, that read no scalar (no view moved by a register, no valid
 * count) and whose every dependency is an op before the loop (in program
 * order) or in P, with distance 0. They move, in their order, to just before
 * the loop, ahead of the scalars and the other contexts' commands that stand
 * right before it (the experts' staging `dma.spm`, the loop count's `ld`):
 * the DMA context takes the shared weights' copies right after routing's
 * and fills its wait for the expert list with them. The row is priced
 * (ts_benefit_by_prediction): where the DMA context has no idle time before
 * the loop, the copies only delay block 0's fetch and the row does not apply.
 * Every hazard is an explicit dependency (5.1): an op that writes what an op
 * of P reads, reads what it writes or writes it too, and stands before it, is
 * one of its dependencies, and none lies in the loop or between the loop and
 * P (each lies before the loop or in P, which keeps its order), so the new
 * order keeps every value: y is the same bit for bit. Spans are renewed to
 * the new positions; the DM planner places the moved buffers before the loop. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct first {
	uint32_t ins; /* where P goes: before the scalars and other contexts' ops just before the loop */
	uint32_t n;   /* ops in P */
	uint8_t *in;  /* per op: in P */
} first;

/* whether op o reads no scalar: no view moved by a register, no valid count */
static bool no_scalar(const ts_op *op)
{
	if (op->in.vreg >= 0)
		return false;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (op->in.v[w].t >= 0 && op->in.v[w].reg >= 0)
			return false;
	return true;
}

/* P of s into x (x->in allocated by the caller, nop + 1 entries); false when
 * it holds no DMA command or when no loop stands directly in the top region */
static bool plan(const tcp_sched *s, moe_ctx *ctx, first *x)
{
	memset(x->in, 0, s->nop + 1);
	x->n = 0;
	if (s->nloop != 1 || s->nop == 0)
		return false;
	const ts_region *top = &s->rg[s->top];
	ts_id lrg = s->loop[0].region;
	uint32_t at = top->nitem;
	for (uint32_t k = 0; k < top->nitem; k++)
		if (top->item[k] == (TS_ITEM_RG | lrg))
			at = k;
	if (at == top->nitem)
		return false;
	x->ins = at;
	while (x->ins > 0 && (TS_ITEM_KIND(top->item[x->ins - 1]) == TS_ITEM_SC ||
		(TS_ITEM_KIND(top->item[x->ins - 1]) == TS_ITEM_OP && s->op[TS_ITEM_ID(top->item[x->ins - 1])].ctx != TCP_CTX_MAIN)))
		x->ins--;
	uint32_t *pos = ctx_alloc(ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	uint32_t lfirst = UINT32_MAX; /* the position of the loop's first op */
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_region_within(s, s->op[o].region, lrg) && pos[o] < lfirst)
			lfirst = pos[o];
	bool dma = false;
	for (uint32_t k = at + 1; k < top->nitem && lfirst != UINT32_MAX; k++) {
		uint32_t it = top->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		ts_id o = TS_ITEM_ID(it);
		const ts_op *op = &s->op[o];
		if (!no_scalar(op))
			continue;
		bool ok = true;
		for (uint32_t d = 0; d < op->ndep && ok; d++)
			ok = op->dist[d] == 0 && (pos[op->dep[d]] < lfirst || x->in[op->dep[d]]);
		if (ok) {
			x->in[o] = 1;
			x->n++;
			dma |= op->ctx == TCP_CTX_DMA;
		}
	}
	ctx_free(ctx, pos, 0);
	return x->n > 0 && dma;
}

bool ts_rw_shared_first_applies(const tcp_sched *s, const ts_env *e)
{
	first x;
	x.in = ctx_alloc(e->ctx, s->nop + 1);
	bool r = plan(s, e->ctx, &x);
	ctx_free(e->ctx, x.in, 0);
	return r;
}

moe_status ts_rw_shared_first_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	first x;
	x.in = ctx_alloc(e->ctx, s->nop + 1);
	if (!plan(s, e->ctx, &x)) {
		ctx_free(e->ctx, x.in, 0);
		return MOE_ERR_INVALID;
	}
	ts_region *top = &s->rg[s->top];
	uint32_t len = top->nitem - x.ins, a = 0, b = x.n;
	uint32_t *moved = ctx_alloc(e->ctx, (len + 1) * sizeof *moved);
	uint32_t *old = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *old);
	ts_op_positions(s, old);
	/* from the insertion point on: P first, then the rest, each in order */
	for (uint32_t k = x.ins; k < top->nitem; k++) {
		uint32_t it = top->item[k];
		bool p = TS_ITEM_KIND(it) == TS_ITEM_OP && x.in[TS_ITEM_ID(it)];
		moved[p ? a++ : b++] = it;
	}
	memcpy(&top->item[x.ins], moved, len * sizeof *moved);
	ctx_free(e->ctx, moved, 0);
	ts_renew_spans(s, e->ctx, old);
	ctx_free(e->ctx, old, 0);
	ctx_free(e->ctx, x.in, 0);
	return MOE_OK;
}
