/* backend-tcp/lower_fuse.c: TCP lowering: fusion choices made before emission
 * (aliased casts, fused multiply-reduce, HBM-homed gathers, dispatch by gather).
 * The legacy emitter applies this rule itself, on the graph it lowers, after
 * finding its block region (lower.c); it reads no tcp_* fusion mark: those of
 * the tcp-plan-fusion pass (gpass/plan_fusion.c) are the schedule compiler's. */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"
#include "passes/pass.h"

/* Which operands of elementwise node u its pass can take as the chain's
 * running value v (bit k: operand k): every operand of a one-step binary op,
 * the first of a unary op or of select (whose later steps read the others). */
static unsigned chain_operands(const moe_graph *g, const ir_node *u)
{
	switch ((moe_op)u->op) {
	case MOE_OP_ADD: case MOE_OP_SUB: case MOE_OP_MUL: case MOE_OP_DIV: case MOE_OP_MIN: case MOE_OP_MAX:
	case MOE_OP_AND: case MOE_OP_OR: case MOE_OP_XOR: case MOE_OP_SHL: case MOE_OP_SHR: case MOE_OP_SAR:
	case MOE_OP_EQ: case MOE_OP_NE: case MOE_OP_LT: case MOE_OP_LE: case MOE_OP_GT: case MOE_OP_GE: return 3;
	case MOE_OP_NEG: case MOE_OP_EXP: case MOE_OP_LOG: case MOE_OP_SQRT: case MOE_OP_TANH: case MOE_OP_ERF:
	case MOE_OP_SIGMOID: case MOE_OP_RSQRT: case MOE_OP_NOT: case MOE_OP_CAST: case MOE_OP_BITCAST:
	case MOE_OP_SELECT:
	case MOE_OP_REDUCE_SUM: case MOE_OP_REDUCE_MAX: case MOE_OP_REDUCE_MIN: return 1;
	case MOE_OP_ABS: return moe_dtype_is_float((moe_dtype)N(g, u->args[0])->dtype) ? 1 : 0;
	default: return 0;
	}
}

/* Streams (upper bound: every operand but a constant, a second constant
 * too) of elementwise node u's own pass. */
static int elem_streams(const moe_graph *g, const ir_node *u)
{
	int ns = 0, nc = 0;
	for (uint32_t k = 0; k < u->nargs; k++) {
		if (N(g, u->args[k])->op == MOE_OP_CONST)
			nc++;
		else
			ns++;
	}
	return ns + (nc > 1 ? nc - 1 : 0);
}

/* The vector ops tcpl_lower_elem gives node u (as its lowering picks them;
 * fused: operand 0 is a chain's value, so a cast or bitcast needs no step). */
static int elem_vops(const moe_graph *g, const ir_node *u, bool fused, uint8_t *ops)
{
	moe_dtype at = (moe_dtype)N(g, u->args[0])->dtype, to = (moe_dtype)u->dtype;
	bool fl = moe_dtype_is_float(at), tf = moe_dtype_is_float(to);
	static const struct {
		moe_op op;
		tcp_vop f, i;
	} bin[] = {{MOE_OP_ADD, TCP_V_FADD, TCP_V_IADD}, {MOE_OP_SUB, TCP_V_FSUB, TCP_V_ISUB}, {MOE_OP_MUL, TCP_V_FMUL, TCP_V_IMUL},
		{MOE_OP_DIV, TCP_V_FDIV, TCP_V_IDIV}, {MOE_OP_MIN, TCP_V_FMIN, TCP_V_IMIN}, {MOE_OP_MAX, TCP_V_FMAX, TCP_V_IMAX},
		{MOE_OP_AND, TCP_V_AND, TCP_V_AND}, {MOE_OP_OR, TCP_V_OR, TCP_V_OR}, {MOE_OP_XOR, TCP_V_XOR, TCP_V_XOR},
		{MOE_OP_SHL, TCP_V_SHL, TCP_V_SHL}, {MOE_OP_SHR, TCP_V_SHR, TCP_V_SHR}, {MOE_OP_SAR, TCP_V_SAR, TCP_V_SAR},
		{MOE_OP_EQ, TCP_V_FTEQ, TCP_V_TEQ}, {MOE_OP_NE, TCP_V_FTNE, TCP_V_TNE}, {MOE_OP_LT, TCP_V_FTLT, TCP_V_TLT},
		{MOE_OP_LE, TCP_V_FTLE, TCP_V_TLE}, {MOE_OP_GT, TCP_V_FTGT, TCP_V_TGT}, {MOE_OP_GE, TCP_V_FTGE, TCP_V_TGE},
		{MOE_OP_EXP, TCP_V_FEXP, TCP_V_FEXP}, {MOE_OP_LOG, TCP_V_FLOG, TCP_V_FLOG}, {MOE_OP_SQRT, TCP_V_FSQRT, TCP_V_FSQRT},
		{MOE_OP_TANH, TCP_V_FTANH, TCP_V_FTANH}, {MOE_OP_ERF, TCP_V_FERF, TCP_V_FERF},
		{MOE_OP_SIGMOID, TCP_V_FSIGM, TCP_V_FSIGM}, {MOE_OP_NEG, TCP_V_FNEG, TCP_V_ISUB}, {MOE_OP_NOT, TCP_V_XOR, TCP_V_XOR}};
	for (size_t k = 0; k < sizeof bin / sizeof bin[0]; k++)
		if (bin[k].op == (moe_op)u->op) {
			ops[0] = (uint8_t)(fl ? bin[k].f : bin[k].i);
			return 1;
		}
	switch ((moe_op)u->op) {
	case MOE_OP_ABS:
		ops[0] = fl ? TCP_V_FABS : TCP_V_ISUB;
		ops[1] = TCP_V_IMAX;
		return fl ? 1 : 2;
	case MOE_OP_RSQRT: ops[0] = TCP_V_FSQRT, ops[1] = TCP_V_FDIV; return 2;
	case MOE_OP_REDUCE_SUM:
	case MOE_OP_REDUCE_MAX:
	case MOE_OP_REDUCE_MIN: ops[0] = TCP_V_RSUM; return 1; /* the reduce stage */
	case MOE_OP_SELECT: ops[0] = at == MOE_BOOL || !fl ? TCP_V_TNE : TCP_V_FTNE, ops[1] = TCP_V_MERGE; return 2;
	case MOE_OP_CAST:
		if (to == MOE_BOOL && at != MOE_BOOL)
			return ops[0] = fl ? TCP_V_FTNE : TCP_V_TNE, 1;
		if (fl != tf)
			return ops[0] = fl ? TCP_V_FTOI : TCP_V_ITOF, 1;
		/* fall through */
	case MOE_OP_BITCAST:
		if (fused)
			return 0;
		ops[0] = TCP_V_OR; /* taken when the operand is an immediate or a counter */
		return 1;
	default: return -1; /* not chained */
	}
}

static bool is_reduce(const ir_node *n)
{
	return n->op == MOE_OP_REDUCE_SUM || n->op == MOE_OP_REDUCE_MAX || n->op == MOE_OP_REDUCE_MIN;
}

/* a node lowered by tcpl_lower_elem outside the block loop, or inside it
 * masked by the block's rows (lower_block_node narrows a chain's nodes) */
static bool plain_elem(const lw *c, moe_id i)
{
	const ir_node *n = N(c->g, i);
	return (ir_ops[n->op].flags & OPF_ELEM) && !(ir_ops[n->op].flags & OPF_LEAF) &&
	       (!c->inreg[i] || n->valid == c->rows) && !c->alias_cast[i] && !c->hbm_home[i] && !c->ggrid[i] &&
	       !c->gdefer[i] && c->fused_into[i] == MOE_NONE && n->rank >= 1;
}

/* Elementwise chains: an elementwise node read once, by an elementwise node
 * of its shape or by a reduce, is computed inside that node's pass (its steps
 * first, its result the running value v), so a chain of them is one tu.vec
 * pass, when the steps keep the vector engine's stage order. Its
 * value is a 32-bit lane word (f32, i32, bool), which is what its own commit
 * would have stored. fused_into names the chain's last node (the pass). */
static void plan_chains(lw *c, const uint32_t *nuse, const moe_id *user)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	size_t sz = (nn + 1) * (sizeof(int) + 2 * sizeof(bool) + TCP_MAXSTEP + 1);
	char *mem = ctx_alloc(c->ctx, sz);
	int *ns = (int *)(void *)mem;
	bool *elem = (bool *)(ns + nn + 1), *has = elem + nn + 1; /* elem: a pass that can take a chain */
	uint8_t *chain = (uint8_t *)(has + nn + 1); /* per root: its steps' ops, then their count */
	memset(has, 0, (nn + 1) * sizeof *has);
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *nd = N(g, i);
		bool red = (nd->op == MOE_OP_REDUCE_SUM || nd->op == MOE_OP_REDUCE_MAX || nd->op == MOE_OP_REDUCE_MIN) &&
			   !c->inreg[i] && nd->valid == MOE_NONE && N(g, nd->args[0])->op != MOE_OP_RESHAPE;
		elem[i] = red || plain_elem(c, i);
		if (!elem[i])
			continue;
		ns[i] = elem_streams(g, N(g, i));
		uint8_t *ci = chain + (size_t)i * (TCP_MAXSTEP + 1);
		int n = elem_vops(g, N(g, i), false, ci);
		elem[i] = n >= 0;
		ci[TCP_MAXSTEP] = (uint8_t)(n > 0 ? n : 0);
	}
	for (moe_id i = nn; i-- > 0;) {
		const ir_node *p = N(g, i);
		if (!elem[i] || !(ir_ops[p->op].flags & OPF_ELEM) || c->is_out[i] || nuse[i] != 1 ||
			(p->valid != MOE_NONE && !c->inreg[i]) || c->hbm_home[i] ||
			(p->dtype != MOE_F32 && p->dtype != MOE_I32 && p->dtype != MOE_BOOL))
			continue;
		moe_id u = user[i];
		const ir_node *un = N(g, u);
		if (c->inreg[u] != c->inreg[i])
			continue; /* a chain stays inside the block loop or outside it */
		bool ured = !(ir_ops[un->op].flags & OPF_ELEM); /* a reduce of p */
		if (!elem[u] || has[u] || un->valid == i ||
			(!ured && (un->rank != p->rank || memcmp(un->shape, p->shape, sizeof(int64_t) * (size_t)p->rank))))
			continue;
		int k = 0;
		while (k < (int)un->nargs && un->args[k] != i)
			k++;
		if (k == (int)un->nargs || !(chain_operands(g, un) >> k & 1))
			continue;
		moe_id r = c->fused_into[u] != MOE_NONE ? c->fused_into[u] : u;
		uint8_t ops[2 * TCP_MAXSTEP], uo[2];
		/* the chain so far: u's ops (now without the copy a fused cast skips), then
		 * the rest of r's chain after u's */
		uint8_t *cr = chain + (size_t)r * (TCP_MAXSTEP + 1);
		int nold = cr[TCP_MAXSTEP], nu_old = elem_vops(g, un, false, uo), nu = elem_vops(g, un, true, uo);
		int np = elem_vops(g, p, false, ops), n = np;
		/* a select whose condition ends in a compare reads the tag it set (no t.ne) */
		int u0 = un->op == MOE_OP_SELECT && k == 0 && np > 0 && tcp_vop_stage[ops[np - 1]] == TCP_ST_TAG;
		for (int q = u0; q < nu; q++)
			ops[n++] = uo[q];
		for (int q = nu_old; q < nold; q++)
			ops[n++] = cr[q];
		if (ns[r] - 1 + ns[i] > 3 || n > TCP_MAXSTEP || !tcp_vec_chain_ok(c->m, ops, n))
			continue;
		memcpy(cr, ops, (size_t)n);
		cr[TCP_MAXSTEP] = (uint8_t)n;
		ns[r] += ns[i] - 1;
		c->fused_into[i] = r;
		has[u] = true;
	}
	ctx_free(c->ctx, mem, sz);
}

/* Dispatch by gather for the grid scatter i (ggrid): i and the reshapes of it
 * become the grid's token list; the token-row gather it reads is deferred. */
void tcpl_mark_ggrid(lw *c, moe_id i)
{
	const moe_graph *g = c->g;
	c->ggrid[i] = i + 1;
	c->gdefer[N(g, i)->args[2]] = true;
	for (moe_id u = i + 1; u < g->nnodes; u++)
		if (N(g, u)->op == MOE_OP_RESHAPE && N(g, u)->args[0] == i)
			c->ggrid[u] = i + 1;
}

/* A widened einsum contracts bf16 only when both casts are views: where one
 * is not, both are computed (the f32 contraction, bf16x3). */
static void widened_views(lw *c)
{
	for (moe_id i = 0; i < c->g->nnodes; i++)
		if (!c->inreg[i] && pass_tcp_widened_einsum(c->g, i)) {
			const ir_node *n = N(c->g, i);
			if (c->alias_cast[n->args[0]] != c->alias_cast[n->args[1]])
				c->alias_cast[n->args[0]] = c->alias_cast[n->args[1]] = false;
		}
}

/* Choices that keep real-size layers inside DM (a prefill's combine gathers
 * T x K rows of D): bf16 -> f32 casts read only by vector passes are views
 * (the fetch widens); reduce_sum(reshape(mul)) is one pass; a large gather
 * whose rows only feed a scatter stays in HBM (DMA on both sides). */
void tcpl_fusion_rule(lw *c)
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
		/* a large gather or scatter that only the program's caller reads (an
		 * expert-parallel phase's send or return rows) moves HBM to HBM */
		if (c->is_out[i] && !c->inreg[i] && n->valid == MOE_NONE && nuse[i] == 2 && ir_bytes(n) >= big &&
			(n->op == MOE_OP_GATHER || n->op == MOE_OP_SCATTER))
			c->hbm_home[i] = true;
		/* an f32 -> bf16 cast of a reduce read only by it: the reduce's pass
		 * commits bf16 (the commit rounds to nearest even, as the cast's pass
		 * would) and the cast is a view of it */
		if (n->op == MOE_OP_CAST && n->dtype == MOE_BF16 && !c->inreg[i] && n->valid == MOE_NONE &&
			N(g, n->args[0])->dtype == MOE_F32 && nuse[n->args[0]] == 1 && is_reduce(N(g, n->args[0])) &&
			!c->inreg[n->args[0]] && N(g, n->args[0])->valid == MOE_NONE && !c->is_out[n->args[0]]) {
			c->store_dt[n->args[0]] = MOE_BF16;
			c->alias_cast[i] = true;
		}
		/* a block's cast to f32 read only by the block's vector passes is a view too */
		bool blk = c->inreg[i] && n->valid == c->rows && n->op == MOE_OP_CAST;
		if ((c->inreg[i] && !blk) || c->is_out[i] || (n->valid != MOE_NONE && !blk))
			continue;
		/* a 4-byte bitcast (of an f32 or i32 value, or of a bf16 -> f32 cast read
		 * only by it) is the same lane words: a view as well */
		const ir_node *a0 = n->nargs ? N(g, n->args[0]) : NULL;
		bool bc = n->op == MOE_OP_BITCAST && esz(n->dtype) == 4 && a0->op != MOE_OP_CONST && a0->op != MOE_OP_IOTA &&
			  !c->inreg[n->args[0]] &&
			  (esz(a0->dtype) == 4 || (a0->op == MOE_OP_CAST && a0->dtype == MOE_F32 && nuse[n->args[0]] == 1 &&
							  N(g, a0->args[0])->dtype == MOE_BF16));
		if ((bc || (n->op == MOE_OP_CAST && n->dtype == MOE_F32 && a0->dtype == MOE_BF16)) && nuse[i] >= 1) {
			bool ok = true;
			for (moe_id u = i + 1; u < nn && ok; u++) {
				const ir_node *un = N(g, u);
				bool reads = false;
				for (uint32_t k = 0; k < un->nargs; k++)
					reads |= un->args[k] == i;
				if (!reads && un->valid != i)
					continue;
				bool vec = un->valid != i && c->inreg[u] == c->inreg[i] &&
					(((ir_ops[un->op].flags & OPF_ELEM) && un->op != MOE_OP_BITCAST && un->op != MOE_OP_CAST &&
						 c->fused_into[u] == MOE_NONE) ||
						(c->fused_into[u] != MOE_NONE && un->op == MOE_OP_MUL) || un->op == MOE_OP_REDUCE_SUM ||
						un->op == MOE_OP_REDUCE_MAX || un->op == MOE_OP_REDUCE_MIN || un->op == MOE_OP_SOFTMAX ||
						un->op == MOE_OP_CUMSUM);
				/* a widened einsum outside the loop contracts the bf16 values
				 * themselves (pass_tcp_widened_einsum) */
				bool wide = !c->inreg[u] && !c->inreg[i] && un->valid != i && pass_tcp_widened_einsum(g, u);
				ok = vec || wide;
			}
			c->alias_cast[i] = ok;
			if (ok && bc && a0->op == MOE_OP_CAST)
				c->alias_cast[n->args[0]] = true;
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
	widened_views(c);
	/* dispatch by gather: scatter(0, pos, gather(x, tok)) read only through
	 * reshapes that only the block loop reads */
	for (moe_id i = 0; i < nn && c->rows != MOE_NONE; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_SCATTER || c->inreg[i] || c->is_out[i] || n->rank != 2 ||
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
		tcpl_mark_ggrid(c, i);
	}
	plan_chains(c, nuse, user);
	ctx_free(c->ctx, nuse, (nn + 1) * sizeof *nuse);
	ctx_free(c->ctx, user, (nn + 1) * sizeof *user);
}
