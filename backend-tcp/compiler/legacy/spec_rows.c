/* backend-tcp/spec_rows.c: block 0's token rows gathered while routing
 * finishes (docs/tcp-isa.md section 7.4, "Speculative first rows").
 *
 * A prefill's first contraction needs block 0's weights, fetched during the
 * router (spec_fetch.c), and its rows of x, gathered by the dispatch's row
 * list. That list is written by one DMA scatter of all T K pairs, which pays
 * the gather/scatter row overhead per pair (Qwen3-30B-A3B at T = 4096:
 * 17.2 us) after the whole index generation, and the in-order DMA context
 * then ran block 0's row gather behind it. Block 0's expert is the lowest
 * one hit, expert 0 for nearly every prefill (the guess spec_fetch.c makes),
 * and its rows are the tokens that chose expert 0, in token order (the rank
 * within an expert counts earlier tokens first; a token holds an expert at
 * most once, the experts op's contract, docs/ir.md), the first B of them.
 * So right after top-k's indices exist, two vector passes list them:
 * m[t] = sum_k (idx[t, k] == 0), then flt.compact of the token counter where
 * m[t] != 0 (the rest 0, token 0, as the grid's padding rows); and one DMA
 * gather of the first B listed rows of x (from HBM) goes into slot 0 of the
 * loop's row buffer, which is therefore allocated now, at the top of DM
 * (where the loop's first-fit allocations would reach last). The loop's
 * prologue gathers block 0's rows itself only when its expert is not 0, as
 * it fetches the weights (lower_region.c); that gather overwrites the slot,
 * in order on the DMA context. Rows past block 0's count are x's rows of the
 * list (token 0 past the end), where the prologue's gather wrote zeros: the
 * block math masks them (valid rows), so the results are the same. */
#include <string.h>
#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

/* Source node through reshapes. */
static moe_id unreshape(const moe_graph *g, moe_id i)
{
	while (i != MOE_NONE && N(g, i)->op == MOE_OP_RESHAPE)
		i = N(g, i)->args[0];
	return i;
}

/* The grid scatter of dispatch by gather with 8-byte index rows and no
 * serving count, the [G, B, D] grid input the loop reads, and the top-k
 * indices [T, K] the one-hot of the index generation reads. */
void tcpl_spec_rows_plan(lw *c)
{
	const moe_graph *g = c->g;
	c->sr_idx = c->sr_grid = MOE_NONE;
	c->sr_buf = c->sr_m = c->sr_list = -1;
	c->sr_used = false;
	if (c->rows == MOE_NONE || c->m->dm_align != 8 || !tcpl_upper_rows(c))
		return;
	moe_id sc = MOE_NONE, grid = MOE_NONE, idx = MOE_NONE;
	int64_t E = 0;
	int nidx = 0;
	for (moe_id i = 0; i < g->nnodes && E == 0; i++) /* the experts: rows of a per-block weight gather */
		if (N(g, i)->op == MOE_OP_GATHER && N(g, i)->valid == c->nblocks && c->nblocks != MOE_NONE)
			E = N(g, N(g, i)->args[0])->shape[0];
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (c->ggrid[i] == i + 1 && n->op == MOE_OP_SCATTER && n->valid == MOE_NONE && sc == MOE_NONE)
			sc = i;
		else if (c->ggrid[i] && n->op == MOE_OP_RESHAPE && n->rank == 3 && !c->inreg[i] && grid == MOE_NONE)
			grid = i;
		/* the index generation's one-hot of the pairs' experts (not of
		 * DeepSeek's groups: n = E, one such) */
		if (n->op == MOE_OP_ONE_HOT && E > 0 && ir_attr_int(n, "n", 0) == E) {
			idx = unreshape(g, n->args[0]);
			nidx++;
		}
	}
	if (sc == MOE_NONE || grid == MOE_NONE || idx == MOE_NONE || nidx != 1 || c->ggrid[grid] != sc + 1 ||
		N(g, idx)->rank != 2 || N(g, sc)->args[1] == MOE_NONE ||
		ir_numel(N(g, N(g, sc)->args[1])) != ir_numel(N(g, idx)))
		return; /* the scatter's positions: one per pair of the indices */
	const ir_node *xp = N(g, N(g, sc)->args[2]), *gn = N(g, grid), *in = N(g, idx);
	moe_id x = xp->args[0];
	const ir_node *xn = N(g, x);
	if (xn->op != MOE_OP_INPUT || xn->rank != 2 || in->rank != 2 || in->dtype != MOE_I32 ||
		(xn->name && !strncmp(xn->name, "ep.", 3)))
		return; /* (received rows are staged whole before the loop: lower_stage.c) */
	int64_t T = xn->shape[0], K = in->shape[1];
	if (in->shape[0] != T || gn->shape[0] != c->G || gn->shape[2] != xn->shape[1] || E < 1 || T * K < 8 * E ||
		c->inreg[idx] || c->after[idx])
		return;
	c->sr_idx = idx;
	c->sr_grid = sc;
}

/* A DM tensor at the top of DM, when that is free now (first-fit
 * allocations reach it last); -1 otherwise. */
static int32_t dm_top(lw *c, const char *name, moe_dtype dt, int rank, const int64_t *shape)
{
	int64_t numel = 1;
	for (int k = 0; k < rank; k++)
		numel *= shape[k];
	int64_t need = rup((numel * esz(dt) + c->S - 1) / c->S, c->m->flit_bytes);
	int64_t off = (c->m->dm_bytes_per_slice - need) / c->m->flit_bytes * c->m->flit_bytes;
	if (off < 0 || (c->nlive > 0 && c->live[c->nlive - 1].off + c->live[c->nlive - 1].size > off))
		return -1;
	int32_t t = tcp_add_tensor(c->p, name, TCP_DM, TCP_T_SCRATCH, dt, rank, shape);
	tcpl_dm_place(c, t, c->nlive, off, need);
	return t;
}

/* After node i is lowered: when it is the indices, block 0's rows listed
 * and gathered (the file's comment). */
void tcpl_spec_rows_emit(lw *c, moe_id i)
{
	const moe_graph *g = c->g;
	if (i != c->sr_idx || c->failed || c->v[i].kind != VK_VIEW || c->p->t[c->v[i].t].space != TCP_DM)
		return;
	const ir_node *sn = N(g, c->sr_grid), *xp = N(g, sn->args[2]), *in = N(g, i);
	moe_id x = xp->args[0];
	int64_t T = in->shape[0], K = in->shape[1], D = sn->shape[1], B = sn->shape[0] / c->G;
	/* a small buffer only (1/64 of DM): at the top of DM it must not take
	 * the room of the loop's larger buffers */
	if (c->leaf_t[x] < 0 || B < 1 || B > T ||
		2 * B * D * esz(N(g, x)->dtype) * 64 > c->m->dm_bytes_per_slice * c->S)
		return;
	int64_t sh[3] = {2, B, D};
	c->sr_buf = dm_top(c, "blkin", (moe_dtype)N(g, x)->dtype, 3, sh);
	if (c->sr_buf < 0)
		return;
	c->sr_m = tcpl_dm_tensor(c, i, "spec_m", MOE_I32, 1, &T);
	c->sr_list = tcpl_dm_tensor(c, i, "spec_rows", MOE_I32, 1, &T);
	const val *iv = &c->v[i];
	/* m[t] = sum_k (idx[t, k] == 0) */
	const int64_t mdim[2] = {T, K};
	tcp_insn m = tcp_b_vec(2, mdim, tcp_b_flat(c->sr_m));
	m.v[TCP_V_S0] = tcp_b_view(iv->t, iv->base, 2, iv->stride);
	tcp_b_step(&m, TCP_V_TEQ, TCP_SRC_S0, TCP_SRC_IMM, 0);
	tcp_b_step(&m, TCP_V_RSUM, TCP_SRC_V, TCP_SRC_NONE, 0);
	emit(c, &m);
	/* list = the tokens t with m[t] != 0, in order, then 0 */
	tcp_insn k = tcp_b_vec(1, &T, tcp_b_flat(c->sr_list));
	k.v[TCP_V_S0] = tcp_b_flat(c->sr_m);
	tcp_b_step(&k, TCP_V_TNE, TCP_SRC_S0, TCP_SRC_IMM, 0);
	tcp_b_step(&k, TCP_V_COMPACT, TCP_SRC_CTR, TCP_SRC_IMM, 0);
	emit(c, &k);
	/* slot 0 of the row buffer = x's rows of the first B listed tokens */
	const int64_t gdim[3] = {1, B, D}, dst[3] = {B * D, D, 1}, src[3] = {T * D, D, 1}, ist[2] = {B, 1};
	tcp_insn ga = tcp_b_dma_gather(3, gdim, tcp_b_view(c->sr_buf, 0, 3, dst), tcp_b_view(c->leaf_t[x], 0, 3, src),
		tcp_b_view(c->sr_list, 0, 2, ist), T);
	emit(c, &ga);
}

/* The loop's row buffer for grid scatter s when block 0's rows are in it
 * already, else -1. */
int32_t tcpl_spec_rows_buffer(lw *c, moe_id s)
{
	c->sr_used |= s == c->sr_grid && c->sr_buf >= 0;
	return s == c->sr_grid ? c->sr_buf : -1;
}

/* In the loop's prologue: true when block 0's rows are gathered (its
 * gather is then guarded like its weights' fetch); the index lists are
 * freed. */
bool tcpl_spec_rows_take(lw *c)
{
	if (c->sr_m >= 0)
		tcpl_dm_free(c, c->sr_m);
	if (c->sr_list >= 0)
		tcpl_dm_free(c, c->sr_list);
	c->sr_m = c->sr_list = -1;
	return c->sr_buf >= 0 && c->sr_used;
}

/* The end of the highest live DM block but the early row buffer, which sits
 * at the top (the estimates of what still fits beside the live blocks,
 * lower_preexp.c and lower_shared.c); *cap: the DM below that buffer. */
int64_t tcpl_dm_live_top(const lw *c, int64_t *cap)
{
	int64_t top = 0;
	*cap = c->m->dm_bytes_per_slice;
	for (uint32_t k = 0; k < c->nlive; k++) {
		if (c->live[k].t == c->sr_buf && c->sr_buf >= 0) {
			*cap = c->live[k].off;
			continue;
		}
		if (c->live[k].off + c->live[k].size > top)
			top = c->live[k].off + c->live[k].size;
	}
	return top;
}
