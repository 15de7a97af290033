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

/* The first `limit` ops of P moved before the loop; with lead, P's DMA
 * commands among them then move up, in their order, to the front of the
 * segment before the loop (right after its leading scalars and
 * dependency-free ops: the copies of x and the router's weights), where they
 * wait for nothing (a weight's copy into its own DM buffer), so the main
 * context can run the shared expert's projections while the DMA context is
 * still busy with the dispatch's gathers and scatters. */
static moe_status hoist(tcp_sched *s, const ts_env *e, uint32_t limit, bool lead)
{
	ts_id *ops = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *ops);
	uint32_t n = ts_hoist_before_loop_set(s, e, true, ops);
	moe_status st = ts_hoist_before_loop_n(s, e, true, limit);
	if (st == MOE_OK && lead) {
		uint8_t *mv = ctx_alloc(e->ctx, s->nop + 1);
		memset(mv, 0, s->nop + 1);
		for (uint32_t k = 0; k < n && k < limit; k++)
			mv[ops[k]] = s->op[ops[k]].ctx == TCP_CTX_DMA && s->op[ops[k]].ndep == 0;
		uint32_t at, end = ts_loop_segment(s, &at);
		uint32_t *out = ctx_alloc(e->ctx, (end - at + 1) * sizeof *out);
		uint32_t *old = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *old);
		ts_op_positions(s, old);
		if (end > at && ts_segment_reorder(s, at, end, mv, TS_LAND_IN_ORDER, out) > 0) {
			memcpy(&s->rg[s->top].item[at], out, (end - at) * sizeof *out);
			ts_renew_spans(s, e->ctx, old);
		}
		ctx_free(e->ctx, old, 0);
		ctx_free(e->ctx, out, 0);
		ctx_free(e->ctx, mv, 0);
	}
	ctx_free(e->ctx, ops, 0);
	return st;
}

typedef struct cut_arg {
	const ts_env *e;
	uint32_t limit;
	bool lead;
} cut_arg;

static bool hoist_copy(tcp_sched *c, void *arg)
{
	const cut_arg *a = arg;
	return hoist(c, a->e, a->limit, a->lead) == MOE_OK && tcp_sched_verify(c) == MOE_OK;
}

/* P and its move are early-passes' (rw/early_passes.c), over ops of every
 * context and only where P holds a DMA command. */
bool ts_rw_shared_first_applies(const tcp_sched *s, const ts_env *e)
{
	return ts_hoist_before_loop_applies(s, e, true);
}

/* The candidates: P, then the prefixes of P that end just before one of its
 * DMA commands (each closed under P's dependencies), longest first, each
 * moved as it is or with its DMA commands led (hoist). Each is moved in a
 * trial copy, placed and predicted; the first length at which one places
 * is taken, the faster of its two (P as it is where none places). A prefix
 * keeps the values that its last ops write live across the loop, but ends
 * the spans of what only P reads (x, read again by the shared expert's
 * first projections), so a prefix may place where P does not. */
moe_status ts_rw_shared_first_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	ts_id *ops = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *ops);
	uint32_t n = ts_hoist_before_loop_set(s, e, true, ops), ndma = 0;
	cut_arg best = {e, n, false};
	for (uint32_t k = 0; k < n; k++)
		ndma += s->op[ops[k]].ctx == TCP_CTX_DMA;
	int64_t least = -1;
	for (uint32_t k = n; ndma > 0 && k >= 1 && least < 0; k--) {
		if (k < n && s->op[ops[k]].ctx != TCP_CTX_DMA)
			continue;
		for (int l = 0; l < 2; l++) {
			cut_arg a = {e, k, l == 1};
			ts_trial t = ts_trial_for(e, "<shared-first trial>", hoist_copy, &a, true);
			int64_t c = ts_trial_of(s, &t);
			if (c >= 0 && (least < 0 || c < least)) {
				least = c;
				best = a;
			}
		}
	}
	ctx_free(e->ctx, ops, 0);
	return hoist(s, e, best.limit, best.lead);
}
