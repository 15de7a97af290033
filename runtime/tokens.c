/* runtime/tokens.c: the run-time range check of a serving layer's token
 * count (docs/semantics.md section 7), shared by every executor. */
#include <string.h>

#include "ir/graph_keys.h"
#include "ir/ir.h"
#include "moec/runtime.h"

/* The largest token count of g: the dispatch's record, else the experts'
 * token rows; -1 without experts. */
static int64_t tokens_max(const moe_graph *g)
{
	int64_t T = ir_graph_attr_int(g, IR_GK_SERVING_TOKENS_MAX, -1);
	for (moe_id i = 0; i < g->nnodes && T < 0; i++)
		if (N(g, i)->op == MOE_OP_EXPERTS)
			T = N(g, N(g, i)->args[EXP_X])->shape[0];
	return T;
}

moe_status moe_tokens_check(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, int64_t *n_out)
{
	if (n_out)
		*n_out = -1;
	if (!ctx || !g)
		return MOE_ERR_INVALID;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_INPUT || !n->name || strcmp(n->name, MOE_TOKENS_INPUT))
			continue;
		const moe_tensor *t = bind ? moe_tensor_map_get(bind, n->name) : NULL;
		if (!t || t->dtype != MOE_I32 || t->rank != 0 || !t->data || t->nbytes != sizeof(int32_t))
			return MOE_OK; /* the executor's binding check reports it */
		int32_t v;
		memcpy(&v, t->data, sizeof v);
		int64_t T = tokens_max(g);
		if (v < 0 || (T >= 0 && v > T)) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "input '%s' is %d, outside 0..%lld (the layer's token rows T)",
				MOE_TOKENS_INPUT, (int)v, (long long)(T < 0 ? 0 : T));
			return MOE_ERR_INVALID;
		}
		if (n_out)
			*n_out = v;
	}
	return MOE_OK;
}
