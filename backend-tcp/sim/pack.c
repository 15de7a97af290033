/* backend-tcp/sim/pack.c: the packed weights of a run (docs/tcp-isa.md
 * section 7, item 5): the program's prep graph evaluated by the reference
 * interpreter on the bound weights when they are bound, outside the
 * simulated time. */
#include "backend-tcp/sim/sim_int.h"

/* Binds each packed tensor of p in table order: out[k] when given (taken),
 * else a tensor without data (shape only). */
static moe_status bind_packed(moe_ctx *ctx, const tcp_program *p, moe_tensor **out, const bool *none,
	moe_tensor_map *packed)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->kind != TCP_T_PACKED)
			continue;
		moe_tensor *h = none[k] ? moe_tensor_new_shape(ctx, (moe_dtype)t->dtype, t->rank, t->shape) : out[k];
		if (!none[k])
			out[k] = NULL;
		k++;
		if (!h)
			return MOE_ERR_INVALID;
		moe_tensor_map_set(packed, t->name, h);
	}
	return MOE_OK;
}

/* The graph of g's outputs that do not depend on a weight in `absent`
 * (none[k] set for the others), or NULL when all or none do. */
static moe_graph *present_part(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, bool *none, bool *all)
{
	uint32_t nn = g->nnodes;
	bool *dep = ctx_alloc(ctx, (nn + 1) * sizeof *dep);
	moe_id *map = ctx_alloc(ctx, (nn + 1) * sizeof *map);
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		const moe_tensor *w = n->op == MOE_OP_WEIGHT && bind ? moe_tensor_map_get(bind, n->name) : NULL;
		dep[i] = w && !w->data;
		for (uint32_t a = 0; a < n->nargs; a++)
			dep[i] |= n->args[a] != MOE_NONE && dep[n->args[a]];
	}
	uint32_t nd = 0;
	for (uint32_t k = 0; k < g->nout; k++)
		nd += none[k] = dep[g->outputs[k]];
	*all = nd == g->nout;
	moe_graph *r = NULL;
	if (nd && nd < g->nout) {
		r = ir_graph_clone_empty(g);
		for (moe_id i = 0; i < nn; i++)
			map[i] = dep[i] ? MOE_NONE : ir_copy_node(r, g, i, map);
		for (uint32_t k = 0; k < g->nout; k++)
			if (!none[k])
				moe_graph_add_output(r, map[g->outputs[k]]);
	}
	ctx_free(ctx, dep, (nn + 1) * sizeof *dep);
	ctx_free(ctx, map, (nn + 1) * sizeof *map);
	return r;
}

moe_status tcp_pack_weights(moe_ctx *ctx, const tcp_program *p, const moe_tensor_map *bind, bool timing_only,
	moe_tensor_map *packed)
{
	if (!p->prep_len)
		return MOE_OK;
	moe_module *m = tcp_prep_module(ctx, p, NULL);
	if (!m)
		return MOE_ERR_INVALID;
	const moe_graph *g = moe_module_graph(m, 0);
	/* timing only, with weights absent: the packed tensors computed from them
	 * are absent too (shape, no data; the simulator faults if it needs their
	 * values), the others are packed from the weights present */
	uint32_t no = g->nout;
	bool *none = ctx_alloc(ctx, (no + 1) * sizeof *none), all = false;
	moe_graph *part = timing_only ? present_part(ctx, g, bind, none, &all) : NULL;
	moe_tensor **out = ctx_alloc(ctx, (no + 1) * sizeof *out);
	moe_status rc = MOE_OK;
	if (!all) {
		moe_tensor **o = part ? ctx_alloc(ctx, (no + 1) * sizeof *o) : out;
		rc = moe_interp_run(ctx, part ? part : g, bind, o);
		for (uint32_t k = 0, j = 0; part && k < no; k++)
			out[k] = none[k] || rc != MOE_OK ? NULL : o[j++];
		if (part)
			ctx_free(ctx, o, (no + 1) * sizeof *o);
	}
	if (rc == MOE_OK)
		rc = bind_packed(ctx, p, out, none, packed);
	else
		moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_none(), "tcp: packing the weights failed");
	for (uint32_t k = 0; k < no; k++)
		moe_tensor_free(ctx, out[k]);
	ctx_free(ctx, out, (no + 1) * sizeof *out);
	ctx_free(ctx, none, (no + 1) * sizeof *none);
	if (part)
		ir_graph_free(part);
	moe_module_free(m);
	return rc;
}
