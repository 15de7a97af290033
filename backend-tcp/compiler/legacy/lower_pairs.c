/* backend-tcp/lower_pairs.c: the block results in pair order in DM
 * (docs/tcp-isa.md 7.3).
 *
 * A prefill's combine gathers each routed pair's row of the block results
 * from the HBM grid after the block loop: T K rows of D (Qwen3-30B-A3B at
 * T = 4096: 128 MB), a DMA that no expert work overlaps. When those rows fit
 * in half of DM, each block instead scatters its result rows, right
 * after computing them, into a DM buffer P [T K, D] in pair order, at the
 * pair index that the dispatch's row list carries beside each token (the
 * second word of its 8-byte rows, lower_route.c): P[p] = grid[pos[p]]. The
 * combine's gathers of grid rows pos[a..b) are then the rows a..b of P, a
 * view: no DMA after the loop. The scatter is a DM -> DM DMA of the block's
 * real rows (its valid count), inside the loop, where it overlaps the next
 * block's contractions. The rows are the same bytes, so y is unchanged. */
#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

/* Is id the slice [a, b) (step 1, axis 0) of pos, or pos itself? */
static bool pos_range(const lw *c, moe_id id, moe_id pos, int64_t *a, int64_t *b)
{
	const ir_node *n = N(c->g, id);
	if (id == pos) {
		*a = 0;
		*b = n->shape[0];
		return true;
	}
	if (n->op != MOE_OP_SLICE || n->args[0] != pos || n->rank != 1 || ir_attr_int(n, "axis", 0) != 0 ||
		ir_attr_int(n, "step", 1) != 1)
		return false;
	int64_t start = ir_attr_int(n, "start", 0);
	if (start < 0)
		start += N(c->g, pos)->shape[0];
	*a = start;
	*b = start + n->shape[0];
	return *a >= 0 && *b <= N(c->g, pos)->shape[0];
}

/* The region result (in HBM, not a DM grid) every outside reader of which
 * is a reshape to the grid's rows read only by gathers at ranges of pos. */
static moe_id pair_result(const lw *c, moe_id pos)
{
	const moe_graph *g = c->g;
	moe_id res = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (!c->inreg[i] || !c->hbm_home[i] || n->op == MOE_OP_RESHAPE)
			continue;
		if (res != MOE_NONE || c->is_out[i] || n->rank != 3 || ir_bytes(n) * 16 <= c->m->dm_bytes_per_slice * c->S)
			return MOE_NONE; /* one result, of the HBM grid (region_dm_grids keeps small ones in DM) */
		res = i;
	}
	if (res == MOE_NONE)
		return MOE_NONE;
	int nread = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k < n->nargs; k++) {
			if (n->args[k] != res)
				continue;
			if (n->op != MOE_OP_RESHAPE || n->rank != 2 || c->is_out[i])
				return MOE_NONE; /* the reshape to the grid's rows (a view, in the region) */
			for (moe_id u = 0; u < g->nnodes; u++)
				for (uint32_t j = 0; j < N(g, u)->nargs; j++) {
					int64_t a, b;
					if (N(g, u)->args[j] == i &&
						(c->inreg[u] || N(g, u)->op != MOE_OP_GATHER || j != 0 || N(g, u)->valid != MOE_NONE ||
							ir_attr_int(N(g, u), "axis", 0) != 0 || !pos_range(c, N(g, u)->args[1], pos, &a, &b)))
						return MOE_NONE;
				}
			nread++;
		}
	}
	return nread ? res : MOE_NONE;
}

/* Decides the pair-order buffer before anything is emitted. */
void tcpl_pairs_plan(lw *c)
{
	c->pr_node = MOE_NONE;
	c->pr_t = -1;
	if (c->rows == MOE_NONE || c->m->dm_align != 8)
		return;
	const moe_graph *g = c->g;
	moe_id sc = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++)
		if (c->ggrid[i] == i + 1 && N(g, i)->op == MOE_OP_SCATTER)
			sc = i;
	if (sc == MOE_NONE || N(g, sc)->valid != MOE_NONE)
		return; /* serving: the row list keeps 4-byte rows */
	moe_id pos = N(g, sc)->args[1], res = pair_result(c, pos);
	if (res == MOE_NONE)
		return;
	const ir_node *rn = N(g, res);
	int64_t bytes = N(g, pos)->shape[0] * rn->shape[2] * (int64_t)moe_dtype_size((moe_dtype)rn->dtype);
	if (bytes * 2 > c->m->dm_bytes_per_slice * c->S)
		return;
	c->pr_node = res;
	c->pr_pos = pos;
}

/* At the dispatch scatter: the pair index written as the second word of
 * each 8-byte row of the row list's source (src: [n, 2] i32; rowlist: the
 * row list it is scattered into). P is allocated at the loop (tcpl_pairs_rows)
 * and lives to the end. */
void tcpl_pairs_alloc(lw *c, moe_id at, int32_t src, int64_t n, int32_t rowlist)
{
	if (c->pr_node == MOE_NONE)
		return;
	(void)at;
	c->pr_rl = rowlist;
	c->pr_n = n;
	const int64_t two = 2;
	tcp_insn in = tcp_b_vec(1, &n, tcp_b_view(src, 1, 1, &two));
	tcp_b_step(&in, TCP_V_IADD, TCP_SRC_CTR, TCP_SRC_IMM, 0);
	emit(c, &in);
}

/* Before the loop's buffers (after routing's have been freed): P. */
void tcpl_pairs_rows(lw *c)
{
	if (c->pr_node == MOE_NONE || c->pr_rl < 0)
		return;
	const ir_node *rn = N(c->g, c->pr_node);
	int64_t shape[2] = {c->pr_n, rn->shape[2]};
	c->pr_t = tcpl_dm_tensor(c, c->pr_node, "pair-rows", (moe_dtype)rn->dtype, 2, shape);
}

/* In the block body, for the pair-order result i: the block's real rows
 * scattered into P by the pair indices of its grid rows. */
bool tcpl_pairs_store(lw *c, moe_id i, int greg, int rreg)
{
	if (i != c->pr_node || c->pr_t < 0)
		return false;
	const ir_node *n = N(c->g, i);
	int64_t B = n->shape[1], D = n->shape[2];
	tcp_insn in = tcp_insn_init(TCP_OP_DMA_SCATTER);
	in.ndim = 3;
	in.dim[0] = 1;
	in.dim[1] = B;
	in.dim[2] = D;
	in.rows = c->p->t[c->pr_t].shape[0];
	in.vreg = rreg; /* the block's real rows (R_ROWS, or a pending block's: block_store.c) */
	tcp_view *d = &in.v[TCP_V_DST], *s = &in.v[TCP_V_S0], *ix = &in.v[TCP_V_S1];
	d->t = c->pr_t;
	d->stride[0] = in.rows * D;
	d->stride[1] = D;
	d->stride[2] = 1;
	s->t = c->v[i].t;
	s->base = c->v[i].base;
	if (c->pr_reg >= 0) { /* the slot block greg wrote (tcpl_pairs_buffer) */
		int sreg = greg == R_G ? c->pr_reg : c->pr_preg;
		if (sreg != c->pr_reg)
			alui(c, TCP_S_AND, sreg, greg, TCP_NOREG, 1);
		s->reg = sreg;
		s->scale = B * D;
	}
	s->stride[0] = B * D;
	s->stride[1] = D;
	s->stride[2] = 1;
	ix->t = c->pr_rl;
	ix->base = 1;
	ix->reg = greg;
	ix->scale = 2 * B;
	ix->stride[0] = 2 * B;
	ix->stride[1] = 2;
	in.flags |= TCP_F_JOIN; /* sets up while the DMA before it (the loop's last weights) transfers */
	tcpl_emit_list_rows(c, &in, R_ROWT); /* the list of the count's row class (list_rows.c) */
	return true; /* read outside the loop only through P (tcpl_pairs_gather) */
}

/* The block's result buffer of the pair-order result i (b: its per-block
 * shape) in two slots, block g writing slot g & 1: the scatter of block
 * g - 1's rows (deferred to block g's body, behind block g + 1's weights in
 * the DMA queue) reads the other slot, so block g's last pass does not wait
 * for it, and the main context does not fall a block behind the weight
 * stream (gpt-oss-20b at T = 512: 1168.5 -> 1153.8 us). False for any other
 * node, or when no register is left (then one slot). */
bool tcpl_pairs_buffer(lw *c, moe_id i, const ir_node *b)
{
	if (i != c->pr_node || c->pr_t < 0 || c->next_reg + 2 > TCP_NREG)
		return false;
	const ir_node *n = N(c->g, i);
	int64_t shape[MOE_MAX_RANK + 1];
	shape[0] = 2;
	for (int k = 0; k < b->rank; k++)
		shape[k + 1] = b->shape[k];
	int32_t t = tcpl_dm_tensor(c, i, n->name ? n->name : "block", (moe_dtype)n->dtype, b->rank + 1, shape);
	c->pr_reg = tcpl_new_reg(c, i);
	c->pr_preg = tcpl_new_reg(c, i);
	val v = tview(t, i, b);
	v.region = true;
	v.reg = c->pr_reg;
	v.scale = ir_numel(b);
	c->v[i] = v;
	return true;
}

/* At the top of block g's body: its result's slot. */
void tcpl_pairs_slot(lw *c)
{
	if (c->pr_reg >= 0)
		alui(c, TCP_S_AND, c->pr_reg, R_G, TCP_NOREG, 1);
}

/* A combine gather of grid rows pos[a..b): rows a..b of P, a view. */
bool tcpl_pairs_gather(lw *c, moe_id id)
{
	if (c->pr_t < 0)
		return false;
	const ir_node *n = N(c->g, id), *src = N(c->g, n->args[0]);
	int64_t a, b;
	if (src->op != MOE_OP_RESHAPE || src->args[0] != c->pr_node || !pos_range(c, n->args[1], c->pr_pos, &a, &b))
		return false;
	val v = tview(c->pr_t, c->pr_node, n);
	v.base = a * n->shape[1];
	c->v[id] = v;
	return true;
}
