/* ir/verify.c: structural and type verification of graphs.
 * Re-runs shape inference on a scratch copy of every node and checks that the
 * recorded dtype and shape agree, that every attribute is one of the op's
 * (ops.def ATTRS) with the declared kind, that operands precede uses, that
 * outputs exist and that every leaf is well formed; the same for the body
 * of every block_loop, which the loop's shape rule checks against the loop. */
#include <string.h>

#include "ir/ir.h"

/* Every node of g (a layer or a body): its op, attributes and recorded type. */
static void verify_nodes(moe_ctx *ctx, const moe_graph *g)
{
	moe_graph *s = ir_graph_clone(g); /* inference writes into nodes: work on a copy */
	for (moe_id i = 0; i < s->nnodes; i++) {
		ir_node *n = N(s, i), *o = N(g, i);
		if (n->op >= MOE_OP_COUNT) {
			moe_diag(ctx, MOE_DIAG_ERROR, o->loc, "verifier: node %%%u has an unknown op", i);
			continue;
		}
		if (!ir_node_attrs_check(ctx, o) || ir_infer(ctx, s, i) != MOE_OK)
			continue;
		if (n->dtype != o->dtype || !ir_same_shape(n, o))
			moe_diag(ctx, MOE_DIAG_ERROR, o->loc,
				"verifier: node %%%u ('%s') records type %s rank %d but its operands give %s rank %d", i,
				ir_ops[o->op].name, moe_dtype_name((moe_dtype)o->dtype), o->rank,
				moe_dtype_name((moe_dtype)n->dtype), n->rank);
		if ((o->op == MOE_OP_INPUT || o->op == MOE_OP_WEIGHT) && (!o->name || !*o->name))
			moe_diag(ctx, MOE_DIAG_ERROR, o->loc, "verifier: %s %%%u has no name", ir_ops[o->op].name, i);
		if (o->op == MOE_OP_WEIGHT && !ir_attr_str(o, "source", NULL))
			moe_diag(ctx, MOE_DIAG_ERROR, o->loc, "verifier: weight '%s' has no source", o->name ? o->name : "?");
	}
	ir_graph_free(s);
}

static moe_status graph_verify(moe_ctx *ctx, const moe_graph *g)
{
	int before = moe_error_count(ctx);
	verify_nodes(ctx, g);
	/* a body's nodes (the loop's own rule checks the body against the loop) */
	for (uint32_t b = 0; b < g->nbodies; b++) {
		const moe_graph *body = g->bodies[b];
		verify_nodes(ctx, body);
		for (uint32_t i = 0; i < body->nout; i++)
			if (body->outputs[i] >= body->nnodes)
				moe_diag(ctx, MOE_DIAG_ERROR, body->loc, "verifier: a body yields a missing node");
	}
	if (g->nout == 0)
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "verifier: layer '%s' has no output", g->name);
	for (uint32_t i = 0; i < g->nout; i++)
		if (g->outputs[i] >= g->nnodes)
			moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "verifier: output %u refers to a missing node", i);
	return moe_error_count(ctx) > before ? MOE_ERR_INVALID : MOE_OK;
}

static moe_status module_verify(moe_ctx *ctx, const moe_module *m)
{
	moe_status st = MOE_OK;
	for (uint32_t i = 0; i < m->ngraphs; i++)
		if (moe_graph_verify(ctx, m->graphs[i]) != MOE_OK)
			st = MOE_ERR_INVALID;
	return st;
}

moe_status moe_graph_verify(moe_ctx *ctx, const moe_graph *g)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, graph_verify(ctx, g));
}

moe_status moe_module_verify(moe_ctx *ctx, const moe_module *m)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, module_verify(ctx, m));
}
