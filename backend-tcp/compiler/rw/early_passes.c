/* backend-tcp/compiler/rw/early_passes.c: rewrite `early-passes`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After the block loop the combine runs on the main context: per row chunk, a
 * cast of each pair's routing weight (a pass over the weights alone) and the
 * product-and-sum pass that reads it with the gathered rows. The casts read
 * only values routing computed before the loop, yet sched-build emits them
 * among the combine's passes, where the main context runs them after the
 * loop's last block, while it could have run them before the loop's first
 * one, when it waits for the dispatch's scatter and block 0's rows.
 *
 * The set P: the `tu.vec` passes standing directly in the top region after
 * the loop that read no scalar (no view moved by a register, no valid count)
 * and whose every dependency is an op before the loop (in program order) or
 * in P, with distance 0. They move, in their order, to just before the loop,
 * ahead of the scalars and the other contexts' commands (the experts' staging
 * `dma.spm`, the loop count's `ld`) that stand right before it, so the main
 * context's in-order stream takes them right after routing's last pass. The
 * row is priced (ts_benefit_by_prediction): where the main context has no
 * idle time before block 0 they only delay it, and the row does not apply.
 * Every hazard is an explicit dependency (5.1): an op between the loop and a
 * pass of P that writes what the pass reads, reads what it writes or writes
 * it too is a dependency of the pass, and none is (each lies before the loop
 * or in P, which keeps its order), so the new order keeps every value: y is
 * the same bit for bit. Spans are renewed to the new positions (the casts'
 * outputs now live across the loop). */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct early {
	uint32_t at;  /* the loop's item in the top region */
	uint32_t ins; /* where P goes: before the scalars and other contexts' ops just before the loop */
	uint32_t n;   /* ops in P */
	uint8_t *in;  /* per op: in P */
} early;

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

/* P of s into x (x->in allocated by the caller, nop + 1 entries): tu.vec
 * passes only, or with any ops of every context; at most its first `limit`
 * ops in item order (a prefix of P is closed under its dependencies: each
 * one in P stands before its reader); false when empty, when there is no
 * loop standing directly in the top region, or with any when P holds no DMA
 * command */
static bool plan(const tcp_sched *s, moe_ctx *ctx, early *x, bool any, uint32_t limit)
{
	memset(x->in, 0, s->nop + 1);
	x->n = 0;
	if (s->nloop != 1 || s->nop == 0)
		return false;
	const ts_region *top = &s->rg[s->top];
	ts_id lrg = s->loop[0].region;
	x->at = top->nitem;
	for (uint32_t k = 0; k < top->nitem; k++)
		if (top->item[k] == (TS_ITEM_RG | lrg))
			x->at = k;
	if (x->at == top->nitem)
		return false;
	x->ins = x->at;
	while (x->ins > 0 && (TS_ITEM_KIND(top->item[x->ins - 1]) == TS_ITEM_SC ||
		(TS_ITEM_KIND(top->item[x->ins - 1]) == TS_ITEM_OP && s->op[TS_ITEM_ID(top->item[x->ins - 1])].ctx != TCP_CTX_MAIN)))
		x->ins--;
	uint32_t *pos = ctx_alloc(ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	uint32_t first = UINT32_MAX; /* the position of the loop's first op */
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_region_within(s, s->op[o].region, lrg) && pos[o] < first)
			first = pos[o];
	bool dma = false;
	for (uint32_t k = x->at + 1; k < top->nitem && first != UINT32_MAX && x->n < limit; k++) {
		uint32_t it = top->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		ts_id o = TS_ITEM_ID(it);
		const ts_op *op = &s->op[o];
		if ((!any && op->in.op != TCP_OP_TU_VEC) || !no_scalar(op))
			continue;
		bool ok = true;
		for (uint32_t d = 0; d < op->ndep && ok; d++)
			ok = op->dist[d] == 0 && (pos[op->dep[d]] < first || x->in[op->dep[d]]);
		if (ok) {
			x->in[o] = 1;
			x->n++;
			dma |= op->ctx == TCP_CTX_DMA;
		}
	}
	ctx_free(ctx, pos, 0);
	return x->n > 0 && (!any || dma);
}

bool ts_hoist_before_loop_applies(const tcp_sched *s, const ts_env *e, bool any)
{
	early x;
	x.in = ctx_alloc(e->ctx, s->nop + 1);
	bool r = plan(s, e->ctx, &x, any, UINT32_MAX);
	ctx_free(e->ctx, x.in, 0);
	return r;
}

uint32_t ts_hoist_before_loop_set(const tcp_sched *s, const ts_env *e, bool any, ts_id *ops)
{
	early x;
	x.in = ctx_alloc(e->ctx, s->nop + 1);
	uint32_t n = 0;
	if (plan(s, e->ctx, &x, any, UINT32_MAX)) {
		const ts_region *top = &s->rg[s->top];
		for (uint32_t k = x.at + 1; k < top->nitem; k++)
			if (TS_ITEM_KIND(top->item[k]) == TS_ITEM_OP && x.in[TS_ITEM_ID(top->item[k])])
				ops[n++] = TS_ITEM_ID(top->item[k]);
	}
	ctx_free(e->ctx, x.in, 0);
	return n;
}

moe_status ts_hoist_before_loop(tcp_sched *s, const ts_env *e, bool any)
{
	return ts_hoist_before_loop_n(s, e, any, UINT32_MAX);
}

moe_status ts_hoist_before_loop_n(tcp_sched *s, const ts_env *e, bool any, uint32_t limit)
{
	early x;
	x.in = ctx_alloc(e->ctx, s->nop + 1);
	if (!plan(s, e->ctx, &x, any, limit)) {
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

bool ts_rw_early_passes_applies(const tcp_sched *s, const ts_env *e)
{
	return ts_hoist_before_loop_applies(s, e, false);
}

moe_status ts_rw_early_passes_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	return ts_hoist_before_loop(s, e, false);
}
