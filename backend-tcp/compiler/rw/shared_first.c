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
#include "backend-tcp/compiler/rewrites.h"

/* P and its move are early-passes' (rw/early_passes.c), over ops of every
 * context and only where P holds a DMA command. */
bool ts_rw_shared_first_applies(const tcp_sched *s, const ts_env *e)
{
	return ts_hoist_before_loop_applies(s, e, true);
}

moe_status ts_rw_shared_first_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	return ts_hoist_before_loop(s, e, true);
}
