/* backend-tcp/compiler/rw/dispatch_first.c: rewrite `dispatch-first`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * Before the block loop, the dispatch's dma.scatter (the pairs' rows, or
 * with dispatch-gather their token offsets, into the HBM grid) waits for the
 * pairs' grid positions, and the loop's first block waits for the scatter:
 * on the in-order DMA context it is the longest command before the loop (its
 * 4-cycle row overhead per engine for each of the T K rows). sched-build
 * emits routing in node order, so the main context runs passes the scatter
 * does not need (the block list and row counts for the staging, the routing
 * weights) between the positions and the scatter's byte offsets, and the
 * placement's reuse order keeps the list scheduler from undoing it. The
 * rewrite moves each op the scatter depends on (directly or through other
 * ops of the region), and the scatter, to just after the last of its
 * dependencies (and after the region's leading items and its last scalar
 * item before it), in their order: the scatter starts as soon as the
 * positions are known and the other passes run while it is in flight. Every
 * hazard being an explicit dependency (5.1), an op that moves earlier passes
 * only ops it does not depend on, and an op depending on a moved op stood
 * after it and still does. Spans are renewed to the new positions. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* mv[op]: the scatters of [lead, end) and the ops of the segment they
 * depend on; their count */
static uint32_t mark(const tcp_sched *s, uint32_t lead, uint32_t end, uint8_t *mv)
{
	const ts_region *top = &s->rg[s->top];
	uint32_t n = 0;
	for (uint32_t k = end; k-- > lead;) {
		uint32_t it = top->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		ts_id o = TS_ITEM_ID(it);
		if (s->op[o].in.op == TCP_OP_DMA_SCATTER && s->op[o].in.vreg < 0)
			mv[o] = 1;
		if (!mv[o])
			continue;
		n++;
		for (uint32_t j = 0; j < s->op[o].ndep; j++)
			if (s->op[o].dist[j] == 0 && s->op[o].dep[j] < s->nop)
				mv[s->op[o].dep[j]] = 1;
	}
	return n;
}

/* The new order of [lead, end) in out; how many items stand elsewhere than
 * before. */
static uint32_t plan(const tcp_sched *s, moe_ctx *ctx, uint32_t lead, uint32_t end, uint32_t *out)
{
	uint8_t *mv = ctx_alloc(ctx, s->nop + 1);
	memset(mv, 0, s->nop + 1);
	uint32_t moved = mark(s, lead, end, mv) > 0 ? ts_segment_reorder(s, lead, end, mv, TS_LAND_AFTER_DEPS, out) : 0;
	ctx_free(ctx, mv, 0);
	return moved;
}

bool ts_rw_dispatch_first_applies(const tcp_sched *s, const ts_env *e)
{
	if (s->nloop < 1 || s->nop == 0)
		return false;
	uint32_t lead, end = ts_loop_segment(s, &lead);
	if (end <= lead)
		return false;
	uint32_t *out = ctx_alloc(e->ctx, (end - lead + 1) * sizeof *out);
	uint32_t moved = plan(s, e->ctx, lead, end, out);
	ctx_free(e->ctx, out, 0);
	return moved > 0;
}

moe_status ts_rw_dispatch_first_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	uint32_t lead, end = ts_loop_segment(s, &lead);
	if (end <= lead)
		return MOE_ERR_INVALID;
	uint32_t *out = ctx_alloc(e->ctx, (end - lead + 1) * sizeof *out);
	uint32_t *old = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *old);
	ts_op_positions(s, old);
	if (plan(s, e->ctx, lead, end, out) > 0) {
		memcpy(&s->rg[s->top].item[lead], out, (end - lead) * sizeof *out);
		ts_renew_spans(s, e->ctx, old);
	}
	ctx_free(e->ctx, old, 0);
	ctx_free(e->ctx, out, 0);
	return MOE_OK;
}
