/* passes/tcp_split_weights.c: the `tcp-split-weights` pass (docs/tcp-isa.md
 * section 7, item 5): which values the TCP program binds as *packed
 * weights*, computed once when weights are loaded instead of on the device.
 *
 * A node computed from weights and constants only (at least one weight, no
 * impure op), whose value the rest of the layer or an output reads, is packed
 * unless it is a free view of one weight (a chain of reshape / broadcast,
 * which stays a device view) or a bf16 -> f32 cast of one that only widened
 * einsums read (pass_tcp_widened_einsum: the TCP contraction reads the bf16
 * weight itself): gpt-oss's and Llama 4's fused gate_up
 * (a permuting einsum, then a strided or half slice), a transposed down, a
 * sliced bias. The pass records the choice on the graph: each packed node gets
 * `tcp_pack = k` (k = 0, 1, ... in node order). It changes no value, so every
 * executor still runs the graph; the TCP backend (backend-tcp/compiler/prep.c) reads
 * the marks and splits the graph into the device program, where each packed
 * node is a weight leaf, and the prep graph that computes them. */
#include <string.h>

#include "passes/pass.h"

enum { C_DEV, C_CONST, C_WEIGHT };

static bool free_view(const moe_graph *g, moe_id id)
{
	for (;;) {
		const ir_node *n = N(g, id);
		if (n->op == MOE_OP_WEIGHT)
			return true;
		if (n->op != MOE_OP_RESHAPE && n->op != MOE_OP_BROADCAST)
			return false;
		id = n->args[0];
	}
}

bool pass_tcp_widened_einsum(const moe_graph *g, moe_id id)
{
	const ir_node *n = N(g, id);
	if (n->op != MOE_OP_EINSUM || n->nargs != 2 || n->dtype != MOE_F32)
		return false;
	for (uint32_t k = 0; k < 2; k++) {
		const ir_node *a = N(g, n->args[k]);
		if (a->op != MOE_OP_CAST || a->dtype != MOE_F32 || N(g, a->args[0])->dtype != MOE_BF16)
			return false;
	}
	return true;
}

/* Each node's class: device, constant, or weight (weights and constants only). */
static void classify(const moe_graph *g, uint8_t *cls)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (ir_ops[n->op].flags & OPF_LEAF) {
			cls[i] = n->op == MOE_OP_WEIGHT ? C_WEIGHT : (n->op == MOE_OP_CONST || n->op == MOE_OP_IOTA) ? C_CONST : C_DEV;
			continue;
		}
		uint8_t c = C_CONST;
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a == MOE_NONE)
				continue;
			if (cls[a] == C_DEV)
				c = C_DEV;
			else if (cls[a] == C_WEIGHT && c == C_CONST)
				c = C_WEIGHT;
		}
		if (ir_ops[n->op].flags & OPF_IMPURE)
			c = C_DEV;
		cls[i] = c;
	}
}

uint32_t pass_tcp_pack_plan(moe_ctx *ctx, const moe_graph *g, bool *pack)
{
	uint32_t nn = g->nnodes;
	uint8_t *cls = ctx_alloc(ctx, nn + 1);
	bool *used_dev = ctx_alloc(ctx, nn + 1);
	bool *wide_only = ctx_alloc(ctx, nn + 1); /* read only as a widened einsum's operand */
	classify(g, cls);
	for (moe_id i = 0; i < nn; i++)
		wide_only[i] = true;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		bool wide = pass_tcp_widened_einsum(g, i);
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE && !wide)
				wide_only[n->args[k]] = false;
		if (n->valid != MOE_NONE)
			wide_only[n->valid] = false;
	}
	for (uint32_t o = 0; o < g->nout; o++)
		wide_only[g->outputs[o]] = false;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		if (cls[i] == C_WEIGHT)
			continue;
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE)
				used_dev[a] = true;
		}
	}
	for (uint32_t o = 0; o < g->nout; o++)
		used_dev[g->outputs[o]] = true;
	uint32_t npack = 0;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		bool widen = n->op == MOE_OP_CAST && n->dtype == MOE_F32 && N(g, n->args[0])->dtype == MOE_BF16 &&
			     wide_only[i] && free_view(g, n->args[0]);
		pack[i] = cls[i] == C_WEIGHT && n->op != MOE_OP_WEIGHT && used_dev[i] && !free_view(g, i) && !widen;
		npack += pack[i];
	}
	ctx_free(ctx, wide_only, nn + 1);
	ctx_free(ctx, cls, nn + 1);
	ctx_free(ctx, used_dev, nn + 1);
	return npack;
}

PASS(pass_tcp_split_weights)
{
	(void)opts;
	(void)ud;
	uint32_t nn = g->nnodes;
	bool *pack = ctx_alloc(ctx, nn + 1);
	pass_tcp_pack_plan(ctx, g, pack);
	int64_t k = 0;
	for (moe_id i = 0; i < nn; i++)
		if (pack[i])
			moe_node_set_int(g, i, IR_NK_TCP_PACK, k++);
		else if (ir_attr_find(N(g, i), IR_NK_TCP_PACK))
			moe_node_set_int(g, i, IR_NK_TCP_PACK, -1); /* a mark of an earlier run that no longer holds */
	ctx_free(ctx, pack, nn + 1);
	return MOE_OK;
}
