/* backend-tcp/compiler/rw/route_first.c: rewrite `route-first`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * Before the block loop the one in-order DMA context carries routing's
 * inputs, the dispatch's commands (gather, offsets, scatter, staging) and
 * the dma.spm that hands the block list to the control processor; the
 * loop's first weight fetch waits for the spm. `const-tier` issues the
 * commands that read only constants and inputs right after the leading
 * input copies, so a routing command reading a weight other than the
 * router's (a router bias) stands behind the dispatch's commands and the
 * routing passes after it wait for them all. The rewrite moves every DMA
 * command of the segment before the loop that waits for nothing and that
 * the spm depends on (directly or through ops of the segment) to just after
 * the segment's leading items, in their order. Such a command moves only
 * earlier and past ops it does not depend on (it depends on none), and an
 * op depending on it stood after it and still does (every hazard is an
 * explicit dependency, 5.1). Spans are renewed to the new positions.
 * A peephole row: it runs on the list scheduler's order, and the placement
 * is made again for the moved commands' longer lives (the prediction that
 * prices it is then the program's). */
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/rewrites.h"

/* mv[op]: the segment's dependency-free DMA commands that a dma.spm of
 * [lead, end) depends on; their count. anc marks the spm's ancestors,
 * walking the segment backwards (a dependency stands before its op). */
static uint32_t mark(const tcp_sched *s, moe_ctx *ctx, uint32_t lead, uint32_t end, uint8_t *mv)
{
	const ts_region *top = &s->rg[s->top];
	uint8_t *anc = ctx_alloc(ctx, s->nop + 1);
	memset(anc, 0, s->nop + 1);
	uint32_t n = 0;
	for (uint32_t k = end; k-- > lead;) {
		uint32_t it = top->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		ts_id o = TS_ITEM_ID(it);
		const ts_op *op = &s->op[o];
		if (op->in.op == TCP_OP_DMA_SPM)
			anc[o] = 1;
		if (!anc[o])
			continue;
		if (op->ctx == TCP_CTX_DMA && op->ndep == 0 && op->in.op != TCP_OP_DMA_SPM) {
			mv[o] = 1;
			n++;
		}
		for (uint32_t j = 0; j < op->ndep; j++)
			if (op->dist[j] == 0 && op->dep[j] < s->nop)
				anc[op->dep[j]] = 1;
	}
	ctx_free(ctx, anc, 0);
	return n;
}

/* The new order of [lead, end) in out; how many items stand elsewhere than
 * before. A moved command goes after the moved ones before it, and never
 * above a scalar item. */
static uint32_t plan(const tcp_sched *s, moe_ctx *ctx, uint32_t lead, uint32_t end, uint32_t *out)
{
	uint8_t *mv = ctx_alloc(ctx, s->nop + 1);
	memset(mv, 0, s->nop + 1);
	uint32_t moved = mark(s, ctx, lead, end, mv) > 0 ? ts_segment_reorder(s, lead, end, mv, TS_LAND_IN_ORDER, out) : 0;
	ctx_free(ctx, mv, 0);
	return moved;
}

bool ts_rw_route_first_applies(const tcp_sched *s, const ts_env *e)
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

moe_status ts_rw_route_first_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	uint32_t lead, end = ts_loop_segment(s, &lead);
	if (end <= lead)
		return MOE_ERR_INVALID;
	uint32_t *out = ctx_alloc(e->ctx, (end - lead + 1) * sizeof *out);
	uint32_t *was = ctx_alloc(e->ctx, (end - lead + 1) * sizeof *was);
	uint32_t *old = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *old);
	moe_status st = MOE_OK;
	if (plan(s, e->ctx, lead, end, out) > 0) {
		uint32_t *seg = &s->rg[s->top].item[lead];
		memcpy(was, seg, (end - lead) * sizeof *was);
		ts_op_positions(s, old);
		memcpy(seg, out, (end - lead) * sizeof *out);
		ts_renew_spans(s, e->ctx, old);
		/* the moved commands' DM buffers live longer: they are placed
		 * again (every other buffer keeps its bytes), and where they no
		 * longer fit the order and offsets the rewrite found stay */
		int64_t *off = ctx_alloc(e->ctx, (end - lead + 1) * sizeof *off);
		for (uint32_t k = 0; k < end - lead; k++) {
			int32_t t = TS_ITEM_KIND(was[k]) == TS_ITEM_OP ? s->op[TS_ITEM_ID(was[k])].in.v[TCP_V_DST].t : -1;
			off[k] = t >= 0 && (ts_id)t < s->nbuf ? s->buf[t].offset : -1;
			if (was[k] != seg[k] && t >= 0 && (ts_id)t < s->nbuf && s->buf[t].space != TCP_HBM &&
				s->op[TS_ITEM_ID(was[k])].ctx == TCP_CTX_DMA)
				s->buf[t].offset = -1;
		}
		size_t n0 = moe_diag_count(e->ctx);
		if (tcp_dm_place(s) != MOE_OK) {
			ts_diag_truncate(e->ctx, n0);
			for (uint32_t k = 0; k < end - lead; k++) {
				int32_t t = TS_ITEM_KIND(was[k]) == TS_ITEM_OP ? s->op[TS_ITEM_ID(was[k])].in.v[TCP_V_DST].t : -1;
				if (t >= 0 && (ts_id)t < s->nbuf)
					s->buf[t].offset = off[k];
			}
			ts_op_positions(s, old);
			memcpy(seg, was, (end - lead) * sizeof *was);
			ts_renew_spans(s, e->ctx, old);
		}
		ctx_free(e->ctx, off, 0);
	}
	ctx_free(e->ctx, old, 0);
	ctx_free(e->ctx, was, 0);
	ctx_free(e->ctx, out, 0);
	return st;
}
