/* backend-tcp/lower_fuse.c: TCP lowering: fusion choices made before emission
 * (aliased casts, fused multiply-reduce, HBM-homed gathers, dispatch by gather). */
#include <string.h>

#include "backend-tcp/lower_int.h"

/* Choices that keep real-size layers inside DM (a prefill's combine gathers
 * T x K rows of D): bf16 -> f32 casts read only by vector passes are views
 * (the fetch widens); reduce_sum(reshape(mul)) is one pass; a large gather
 * whose rows only feed a scatter stays in HBM (DMA on both sides). */
void tcpl_plan_fusions(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	uint32_t *nuse = ctx_alloc(c->ctx, (nn + 1) * sizeof *nuse);
	moe_id *user = ctx_alloc(c->ctx, (nn + 1) * sizeof *user);
	for (moe_id i = 0; i < nn; i++)
		c->fused_into[i] = MOE_NONE;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE)
				nuse[a]++, user[a] = i;
		}
	}
	for (moe_id i = 0; i < nn; i++)
		if (c->is_out[i])
			nuse[i] += 2; /* never folded away */
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		if (c->inreg[i] || c->is_out[i])
			continue;
		if (n->op == MOE_OP_REDUCE_SUM && n->dtype == MOE_F32) {
			moe_id r = n->args[0];
			const ir_node *rn = N(g, r);
			if (rn->op != MOE_OP_RESHAPE || nuse[r] != 1 || c->inreg[r])
				continue;
			moe_id m = rn->args[0];
			const ir_node *mn = N(g, m);
			if (mn->op != MOE_OP_MUL || mn->dtype != MOE_F32 || nuse[m] != 1 || c->inreg[m] || mn->valid != MOE_NONE ||
				rn->rank != mn->rank + 1 || rn->shape[0] * rn->shape[1] != mn->shape[0] || mn->rank + 1 > TCP_MAXD)
				continue;
			bool tail = true;
			for (int d = 1; d < mn->rank; d++)
				tail &= rn->shape[d + 1] == mn->shape[d];
			if (tail)
				c->fused_into[m] = c->fused_into[r] = i;
		}
	}
	int64_t big = c->m->dm_bytes_per_slice / 8 * c->S;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		if (c->inreg[i] || c->is_out[i] || n->valid != MOE_NONE)
			continue;
		if (n->op == MOE_OP_CAST && n->dtype == MOE_F32 && N(g, n->args[0])->dtype == MOE_BF16 && nuse[i] >= 1) {
			bool ok = true;
			for (moe_id u = i + 1; u < nn && ok; u++) {
				const ir_node *un = N(g, u);
				bool reads = false;
				for (uint32_t k = 0; k < un->nargs; k++)
					reads |= un->args[k] == i;
				if (!reads && un->valid != i)
					continue;
				bool vec = un->valid != i && !c->inreg[u] &&
					(((ir_ops[un->op].flags & OPF_ELEM) && un->op != MOE_OP_BITCAST && un->op != MOE_OP_CAST &&
						 c->fused_into[u] == MOE_NONE) ||
						(c->fused_into[u] != MOE_NONE && un->op == MOE_OP_MUL) || un->op == MOE_OP_REDUCE_SUM ||
						un->op == MOE_OP_REDUCE_MAX || un->op == MOE_OP_REDUCE_MIN || un->op == MOE_OP_SOFTMAX ||
						un->op == MOE_OP_CUMSUM);
				ok = vec;
			}
			c->alias_cast[i] = ok;
		}
		if (n->op == MOE_OP_GATHER && ir_bytes(n) >= big && nuse[i] >= 1) {
			bool only_scatter = true;
			for (moe_id u = i + 1; u < nn && only_scatter; u++) {
				const ir_node *un = N(g, u);
				for (uint32_t k = 0; k < un->nargs; k++)
					if (un->args[k] == i && (un->op != MOE_OP_SCATTER || k != 2))
						only_scatter = false;
				if (un->valid == i)
					only_scatter = false;
			}
			if (only_scatter)
				c->hbm_home[i] = true;
		}
	}
	/* dispatch by gather: scatter(0, pos, gather(x, tok)) read only through
	 * reshapes that only the block loop reads */
	for (moe_id i = 0; i < nn && c->rows != MOE_NONE; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_SCATTER || c->inreg[i] || c->is_out[i] || n->valid != MOE_NONE || n->rank != 2 ||
			strcmp(ir_attr_str(n, "mode", "set"), "set"))
			continue;
		const ir_node *z = N(g, n->args[0]), *xp = N(g, n->args[2]);
		if (z->op != MOE_OP_CONST || ir_attr_float(z, "value", (double)ir_attr_int(z, "value", 1)) != 0.0 ||
			xp->op != MOE_OP_GATHER || nuse[n->args[2]] != 1 || c->is_out[n->args[2]] || xp->valid != MOE_NONE ||
			ir_attr_int(xp, "axis", 0) != 0 || N(g, xp->args[0])->rank != 2 || N(g, xp->args[1])->rank != 1 ||
			N(g, xp->args[0])->op != MOE_OP_INPUT || N(g, xp->args[0])->dtype != n->dtype)
			continue;
		bool ok = nuse[i] >= 1;
		for (moe_id u = i + 1; u < nn && ok; u++) {
			const ir_node *un = N(g, u);
			for (uint32_t k = 0; k < un->nargs && ok; k++) {
				if (un->args[k] != i)
					continue;
				ok = un->op == MOE_OP_RESHAPE && !c->inreg[u] && !c->is_out[u] && un->rank >= 2 &&
				     un->shape[0] == c->G && nuse[u] >= 1;
				for (moe_id w = u + 1; w < nn && ok; w++)
					for (uint32_t q = 0; q < N(g, w)->nargs; q++)
						if (N(g, w)->args[q] == u && !c->inreg[w])
							ok = false;
			}
			if (un->valid == i)
				ok = false;
		}
		if (!ok || n->shape[0] % c->G)
			continue;
		c->ggrid[i] = i + 1;
		c->gdefer[n->args[2]] = true;
		for (moe_id u = i + 1; u < nn; u++)
			if (N(g, u)->op == MOE_OP_RESHAPE && N(g, u)->args[0] == i)
				c->ggrid[u] = i + 1;
	}
	ctx_free(c->ctx, nuse, (nn + 1) * sizeof *nuse);
	ctx_free(c->ctx, user, (nn + 1) * sizeof *user);
}
