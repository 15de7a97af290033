/* backend-tcp/compiler/gpass/fp8_rows.c: the `tcp-fp8-act-rows` pass
 * (docs/tcp-compiler.md section 3): how many activation rows an act=fp8
 * block-FP8 dequant outside the block loop may be contracted for from its
 * fp8 bytes, on the pass's machine.
 *
 * Contracting [M, I] x [O, I] from the stored e4m3 bytes and block scales
 * (recipe_qact.c) fetches half the bytes of the packed copy, but once the
 * main context binds, the scaled form's chunk-scale copies cost more than
 * the plain contraction of the packed copy (docs/tcp-compiler.md 5.1, "The
 * decode step"). So it pays while the plain contraction is bound by the
 * weight's bytes: while the dequantized weight's O I e bytes at the HBM
 * pool's rate take longer than its MACs, priced by the one cost model
 * (tcp_cost_contract) with the O outputs spread over the slices as the
 * contraction recipes tile them (f32: three bf16 products). That bound
 * is the largest such M; each dequant pass_tcp_fp8_act_dequant accepts gets
 * it as `tcp_fp8_rows`, which tcp-split-weights compares with the rows of
 * the einsums that read it. The pass only marks (idempotent: a mark for
 * another machine is replaced). */
#include "backend-tcp/compiler/tcp_compile.h"
#include "backend-tcp/isa/cost.h"
#include "passes/pass.h"

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* The MACs' cycles of M rows against O outputs of I of e bytes each: t
 * outputs per slice over the column groups, the rows cut over the row
 * groups the remaining slices make (recipe_contract.c's plan at
 * t = ceil(O / S)). */
static int64_t mac_cycles(const tcp_cm *cm, int64_t M, int64_t O, int64_t I, int64_t e)
{
	int64_t S = cm->S, t = cdiv(O, S), cg = cdiv(O, t), R = S / cg > 0 ? S / cg : 1;
	tcp_mm_load l = {cdiv(M, R), t, I, 1, TCP_MT_BF16, e == 4, e, 4, 0, 0, false};
	return tcp_cost_contract(cm, &l).engine;
}

/* The largest M for which the contraction's MACs take less time than its
 * weight's bytes (0: none); the MACs' cycles grow with M. */
static int64_t fp8_rows(const tcp_cm *cm, int64_t O, int64_t I, int64_t e)
{
	double fetch = (double)e * (double)O * (double)I / cm->hbm_bpc;
	int64_t lo = 0, hi = 1;
	while (hi < ((int64_t)1 << 40) && (double)mac_cycles(cm, hi, O, I, e) < fetch)
		lo = hi, hi *= 2;
	while (hi - lo > 1) {
		int64_t mid = lo + (hi - lo) / 2;
		if ((double)mac_cycles(cm, mid, O, I, e) < fetch)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

moe_status tcp_fp8_act_rows(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	(void)ctx;
	tcp_cm cm;
	tcp_cm_init(&cm, m);
	for (moe_id i = 0; i < g->nnodes; i++)
		if (pass_tcp_fp8_act_dequant(g, i)) {
			const ir_node *n = N(g, i);
			int64_t e = (int64_t)moe_dtype_size((moe_dtype)n->dtype);
			moe_node_set_int(g, i, IR_NK_TCP_FP8_ROWS, fp8_rows(&cm, n->shape[0], n->shape[1], e));
		}
	return MOE_OK;
}

bool tcp_fp8_act_rows_needed(const moe_graph *g)
{
	for (moe_id i = 0; i < g->nnodes; i++)
		if (pass_tcp_fp8_act_dequant(g, i) && !ir_attr_find(N(g, i), IR_NK_TCP_FP8_ROWS))
			return true;
	return false;
}
