/* backend-tcp/lower_preexp.c: TCP lowering: expert work that does not depend
 * on routing (a shared expert before the block loop) runs inside the loop's
 * region, after the first block's fetch (docs/tcp-isa.md 7.4).
 *
 * A shared expert reads only x and its weights, and only the layer's tail
 * (after the loop) reads its result. Emitted before the loop (tier 2 of
 * plan_order), its weight copies queued behind routing's last DMA commands and
 * the loop's staging waited for them: on DeepSeek-V3 at T = 1 the first routed
 * expert's fetch started 59 us after routing had finished. Emitted right
 * after the first block's descriptor list instead, its weights stream behind
 * the first routed expert's, its contractions run while the second block's
 * weights stream, and its DM copies are freed before the loop body starts. The
 * DMA context still moves every byte in order, so the HBM time is the same;
 * what changes is that routing's own latency is the only work before the
 * first expert fetch. Such nodes get tier 3: emitted by tcpl_lower_pre_experts
 * from the region's prologue (lower_region.c), positioned just before the loop
 * for liveness; when their buffers do not fit in the DM that the loop's
 * buffers leave (f32 layers whose weights are streamed), right after the loop
 * instead, where they were (the tail reads them). */
#include "backend-tcp/compiler/legacy/lower_int.h"

/* A node of routing-independent work: computed before the loop (tier 2), no
 * valid mask (a serving layer's nodes keep their place: with no real token the
 * loop, and so its prologue, is skipped), not a DMA op, every operand a leaf or
 * such a node. */
static bool candidate(const lw *c, moe_id i, const uint8_t *tier)
{
	const ir_node *n = N(c->g, i);
	if ((tier[i] != 2 && tier[i] != 3) || c->inreg[i] || c->after[i] || n->valid != MOE_NONE || c->is_out[i] ||
		(ir_ops[n->op].flags & OPF_LEAF) || n->op == MOE_OP_GATHER || n->op == MOE_OP_SCATTER ||
		n->op == MOE_OP_TAKE_ALONG || n->op == MOE_OP_CONCAT)
		return false;
	for (uint32_t k = 0; k < n->nargs; k++) {
		moe_id a = n->args[k];
		if (a != MOE_NONE && !(ir_ops[N(c->g, a)->op].flags & OPF_LEAF) && tier[a] != 3)
			return false;
	}
	return true;
}

void tcpl_mark_pre_experts(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	if (c->rows == MOE_NONE || c->sink)
		return;
	for (moe_id i = 0; i < nn; i++) /* operands come first */
		if (candidate(c, i, c->tier))
			c->tier[i] = 3;
	/* every reader must be another such node or come after the loop */
	for (bool changed = true; changed;) {
		changed = false;
		for (moe_id i = 0; i < nn; i++) {
			const ir_node *u = N(g, i);
			if (c->after[i] || c->tier[i] == 3)
				continue;
			for (uint32_t k = 0; k <= u->nargs; k++) {
				moe_id a = k < u->nargs ? u->args[k] : u->valid;
				if (a != MOE_NONE && c->tier[a] == 3)
					c->tier[a] = 2, changed = true;
			}
		}
		for (moe_id i = 0; i < nn; i++) /* and its operands still such nodes */
			if (c->tier[i] == 3 && !candidate(c, i, c->tier))
				c->tier[i] = 2, changed = true;
	}
	/* only when it holds a contraction: the work worth moving */
	bool any = false;
	for (moe_id i = 0; i < nn && !any; i++)
		any = c->tier[i] == 3 && N(g, i)->op == MOE_OP_EINSUM;
	for (moe_id i = 0; i < nn && !any; i++)
		if (c->tier[i] == 3)
			c->tier[i] = 2;
}

/* Per-slice DM bytes of tensor bytes b (as tcpl_dm_tensor rounds them). */
static int64_t per_slice(const lw *c, int64_t b)
{
	int64_t f = c->m->flit_bytes, s = (b + c->S - 1) / c->S;
	return (s + f - 1) / f * f;
}

/* Will tier 3 fit above the DM that is live now (the loop's buffers)? Its
 * values (f32 partials counted twice) and the largest weight copy, or a
 * streamed weight's two TRF tiles, whichever its contractions take. */
bool tcpl_pre_experts_fit(const lw *c)
{
	const moe_graph *g = c->g;
	int64_t dm = c->m->dm_bytes_per_slice, cap, need = 0, wmax = 0;
	int64_t top = tcpl_dm_live_top(c, &cap); /* (below the early row buffer, spec_rows.c) */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (c->inreg[i] || c->after[i] || c->tier[i] != 3)
			continue;
		need += per_slice(c, ir_bytes(n) * (n->dtype == MOE_F32 ? 2 : 1));
		if (n->op != MOE_OP_EINSUM)
			continue;
		int64_t wb = ir_bytes(N(g, n->args[1]));
		int64_t w = wb * 8 >= dm * c->S ? c->m->trf_bytes_per_lane * c->m->lanes_per_slice : per_slice(c, wb);
		wmax = w > wmax ? w : wmax;
	}
	return top + need + wmax <= cap;
}
