/* passes/dce.c: dead-code elimination. A node is live if an output depends
 * on it through operands or valid masks; the rest are dropped. Inputs stay
 * even when unused: they are the layer's calling convention. */
#include "passes/pass.h"

PASS(pass_dce)
{
	uint8_t *live = ctx_alloc(ctx, g->nnodes + 1);
	for (uint32_t i = 0; i < g->nout; i++)
		live[g->outputs[i]] = 1;
	for (moe_id i = g->nnodes; i-- > 0;) {
		ir_node *n = N(g, i);
		if (n->op == MOE_OP_INPUT)
			live[i] = 1;
		if (!live[i])
			continue;
		for (uint32_t a = 0; a < n->nargs; a++)
			if (n->args[a] != MOE_NONE)
				live[n->args[a]] = 1;
		if (n->valid != MOE_NONE)
			live[n->valid] = 1;
	}
	rebuild r;
	rebuild_begin(&r, g);
	for (moe_id i = 0; i < g->nnodes; i++)
		if (live[i])
			rebuild_copy(&r, i);
	ctx_free(ctx, live, g->nnodes + 1);
	rebuild_end(&r);
	return MOE_OK;
}
