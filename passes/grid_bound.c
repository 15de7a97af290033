/* passes/grid_bound.c: the worst-case block grid (docs/semantics.md section 5).
 *
 * With n = T*K routed pairs, c_e <= T tokens on expert e and sum c_e = n, the
 * dispatch needs G = sum_e ceil(c_e / B) blocks. Each non-empty expert costs
 * one block plus one per further B rows, so with M = min(E, n) experts hit
 * G <= M + floor((n - M)/B); and no expert holds more than T rows, so
 * G <= M * ceil(T/B). Every count vector with c_e <= T is reachable, so the
 * minimum of the two is attained. The pass records it with the seed's and
 * vLLM's bounds and the block-buffer bytes each implies. */
#include "passes/pass.h"

/* The bounds are computed exactly in 128 bits (T*K alone may pass 2^63):
 * an argument <= 0 gives 0, a bound beyond INT64_MAX gives -1. */
__extension__ typedef unsigned __int128 u128;

static int64_t fit(u128 v)
{
	return v > (u128)INT64_MAX ? -1 : (int64_t)v;
}

int64_t moe_grid_blocks_max(int64_t T, int64_t K, int64_t E, int64_t B)
{
	if (T <= 0 || K <= 0 || E <= 0 || B <= 0)
		return 0;
	u128 n = (u128)T * (u128)K, M = (u128)E < n ? (u128)E : n;
	u128 a = M + (n - M) / (u128)B, b = M * (((u128)T + (u128)B - 1) / (u128)B);
	return fit(a < b ? a : b);
}

int64_t moe_grid_blocks_seed(int64_t T, int64_t K, int64_t E, int64_t B)
{
	if (T <= 0 || K <= 0 || E <= 0 || B <= 0)
		return 0;
	u128 n = (u128)T * (u128)K;
	return fit(n >= (u128)E ? (n - (u128)E) / (u128)B + (u128)E : (u128)E);
}

int64_t moe_grid_blocks_vllm(int64_t T, int64_t K, int64_t E, int64_t B)
{
	if (T <= 0 || K <= 0 || E <= 0 || B <= 0)
		return 0;
	u128 n = (u128)T * (u128)K, P = n + (u128)E * (u128)(B - 1);
	if (n < (u128)E && n * (u128)B < P) /* n < E < 2^63: n * B < 2^126 */
		P = n * (u128)B;
	return fit((P + (u128)B - 1) / (u128)B);
}

PASS(pass_grid_bound)
{
	int64_t T = ir_graph_attr_int(g, IR_GK_MOE_TOKENS, -1), K = ir_graph_attr_int(g, IR_GK_MOE_K, -1),
		E = ir_graph_attr_int(g, IR_GK_MOE_EXPERTS, -1), B = ir_graph_attr_int(g, IR_GK_MOE_BLOCK, -1),
		row = ir_graph_attr_int(g, IR_GK_MOE_ROW_BYTES, 0);
	/* before dispatch: read the experts nodes themselves */
	for (moe_id i = 0; i < g->nnodes && T < 0; i++) {
		ir_node *n = N(g, i);
		if (n->op != MOE_OP_EXPERTS)
			continue;
		ir_node *x = N(g, n->args[EXP_X]), *idx = N(g, n->args[EXP_IDX]), *up = N(g, n->args[EXP_UP]);
		T = x->shape[0];
		K = idx->shape[1];
		E = up->shape[0];
		B = ir_attr_int(n, "block", 0);
		row = x->shape[1] * (int64_t)moe_dtype_size((moe_dtype)x->dtype);
	}
	if (T < 0)
		return MOE_OK; /* a layer without experts has no grid */
	int64_t gt = moe_grid_blocks_max(T, K, E, B), gs = moe_grid_blocks_seed(T, K, E, B),
		gv = moe_grid_blocks_vllm(T, K, E, B);
	int64_t used = ir_graph_attr_int(g, IR_GK_GRID_BLOCKS, gt); /* allocated by dispatch */
	if (used < gt) {
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "layer '%s' allocates %lld blocks, below the worst case %lld", g->name,
			(long long)used, (long long)gt);
		return MOE_ERR_INTERNAL;
	}
	ir_graph_set_attr_int(g, IR_GK_GRID_BLOCKS_MAX, gt);
	ir_graph_set_attr_int(g, IR_GK_GRID_BLOCKS_SEED, gs);
	ir_graph_set_attr_int(g, IR_GK_GRID_BLOCKS_VLLM, gv);
	ir_graph_set_attr_int(g, IR_GK_BLOCK_BUFFER_BYTES, gt * B * row);
	ir_graph_set_attr_int(g, IR_GK_BLOCK_BUFFER_BYTES_SEED, gs * B * row);
	ir_graph_set_attr_int(g, IR_GK_BLOCK_BUFFER_BYTES_VLLM, gv * B * row);
	return MOE_OK;
}
