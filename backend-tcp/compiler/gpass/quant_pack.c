/* backend-tcp/compiler/gpass/quant_pack.c: one fetch for a block-FP8
 * expert's gate and up weights (act=fp8).
 *
 * The block loop fetches each expert weight with its own DMA descriptor, and
 * every descriptor costs a DMA command's setup (docs/tcp-model.md section 4). The
 * gate and up projections of an expert read the same activation and have the
 * same shape, so a deployment lays their fp8 bytes out side by side once, at
 * load time: concat(gate_q, up_q) along the output rows, [E, 2F, D]. This
 * rewrite does that on the lowered graph before the weights are split
 * (prep.c packs the concat like any weight computed from weights, marked
 * tcp_pack when the tcp-split-weights pass has marked the graph): the two
 * per-block gathers become one gather of the pair and two row slices of it,
 * which the lowering reads as views of the one buffer (docs/tcp-isa.md 7.10). The
 * scales stay separate (they are staged whole in DM). The layer's value is
 * unchanged: each dequant reads the same bytes and scales as before. */
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "ir/graph_keys.h"
#include "ir/quant.h"

/* The per-block fp8 values gather of block einsum e's weight when it is a
 * block-FP8 dequant contracted with fp8 activations, read only there; else
 * MOE_NONE. */
static moe_id fp8_qgather(const moe_graph *g, const uint32_t *nuse, moe_id e, moe_id nb, moe_id bexp)
{
	const ir_node *en = N(g, e);
	if (en->op != MOE_OP_EINSUM || en->nargs != 2 || strcmp(ir_attr_str(en, "eq", ""), "gbi,goi->gbo"))
		return MOE_NONE;
	moe_id d = en->args[1];
	const ir_node *dn = N(g, d);
	qt_info qi;
	if (dn->op != MOE_OP_DEQUANT || nuse[d] != 1 || strcmp(ir_attr_str(dn, "act", "bf16"), "fp8") ||
		!ir_dequant_info(g, dn, &qi) || qi.fmt != QT_FP8)
		return MOE_NONE;
	moe_id q = dn->args[0];
	return tcp_block_weight_gather(g, nuse, q, nb, bexp) ? q : MOE_NONE;
}

/* Finds the gate/up pair: two such einsums on one activation over weights
 * of one type and shape. */
static bool find_pair(const moe_graph *g, const uint32_t *nuse, moe_id nb, moe_id bexp, moe_id *q1, moe_id *q2)
{
	for (moe_id a = 0; a < g->nnodes; a++) {
		moe_id qa = fp8_qgather(g, nuse, a, nb, bexp);
		if (qa == MOE_NONE)
			continue;
		for (moe_id b = a + 1; b < g->nnodes; b++) {
			moe_id qb = fp8_qgather(g, nuse, b, nb, bexp);
			if (qb == MOE_NONE || N(g, b)->args[0] != N(g, a)->args[0])
				continue;
			const ir_node *wa = N(g, N(g, qa)->args[0]), *wb = N(g, N(g, qb)->args[0]);
			if (wa == wb || N(g, qa)->args[0] > (qa < qb ? qa : qb) || N(g, qb)->args[0] > (qa < qb ? qa : qb) ||
				wa->dtype != wb->dtype || wa->rank != wb->rank ||
				memcmp(wa->shape, wb->shape, sizeof(int64_t) * wa->rank))
				continue;
			*q1 = qa < qb ? qa : qb;
			*q2 = qa < qb ? qb : qa;
			return true;
		}
	}
	return false;
}

moe_graph *tcp_pack_gate_up(moe_ctx *ctx, const moe_graph *g)
{
	moe_id nb = ir_graph_node_attr(g, IR_GK_NBLOCKS), bexp = ir_graph_node_attr(g, IR_GK_BLOCK_EXPERT);
	if (nb == MOE_NONE || bexp == MOE_NONE)
		return NULL;
	uint32_t nn = g->nnodes;
	uint32_t *nuse = tcp_use_counts(ctx, g);
	moe_id q1 = MOE_NONE, q2 = MOE_NONE;
	bool found = find_pair(g, nuse, nb, bexp, &q1, &q2);
	ctx_free(ctx, nuse, (nn + 1) * sizeof *nuse);
	if (!found)
		return NULL;
	int64_t pack_mark = tcp_next_pack_mark(g);
	moe_graph *dev;
	moe_id *map = tcp_rewrite_begin(ctx, g, &dev);
	for (moe_id i = 0; i < nn; i++) {
		if (i == q2) {
			continue; /* mapped with q1 */
		} else if (i != q1) {
			map[i] = ir_copy_node(dev, g, i, map);
			continue;
		}
		const ir_node *n1 = N(g, q1), *w1 = N(g, n1->args[0]);
		moe_id gq = tcp_emit_pair_gather(ctx, dev, g, q1, q2, bexp, nb, pack_mark, map);
		if (gq == MOE_NONE)
			return tcp_rewrite_end(ctx, dev, g, map, false);
		int64_t F = w1->shape[1];
		map[q1] = ir_b_slice(dev, gq, 1, 0, F, n1->loc);
		map[q2] = ir_b_slice(dev, gq, 1, F, 2 * F, n1->loc);
	}
	return tcp_rewrite_end(ctx, dev, g, map, true);
}
