/* passes/infer_shapes.c: re-derive every node's dtype and shape in order.
 * Graphs built by other tools may carry stale or missing types; this pass
 * makes them consistent or reports the first node that cannot be typed. */
#include "passes/pass.h"

PASS(pass_infer_shapes)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (ir_ops[N(g, i)->op].flags & OPF_LEAF && N(g, i)->op != MOE_OP_IOTA && N(g, i)->op != MOE_OP_CONST)
			continue; /* inputs and weights are typed by their declaration */
		if (ir_infer(ctx, g, i) != MOE_OK)
			return MOE_ERR_INVALID;
	}
	return MOE_OK;
}
