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

/* A GPTQ dequant of per-block gathers (blockwise-dispatch's
 * dequant(gather(q, e), gather(s, e), gather(z, e), gather(g, e))) of weights. */
static bool gptq_of_gathers(const moe_graph *g, moe_id d)
{
	const ir_node *n = N(g, d);
	if (n->op != MOE_OP_DEQUANT || strcmp(ir_attr_str(n, "format", ""), "gptq") || n->nargs != 4)
		return false;
	const ir_node *g0 = N(g, n->args[0]);
	for (uint32_t k = 0; k < 4; k++) {
		const ir_node *a = N(g, n->args[k]);
		if (a->op != MOE_OP_GATHER || a->nargs != 2 || ir_attr_int(a, "axis", 0) != 0 || a->args[1] != g0->args[1] ||
			a->valid != g0->valid || !free_view(g, a->args[0]))
			return false;
	}
	return true;
}

/* GPTQ on TCP is dequantized when the weights are bound: g_idx maps every
 * input channel to its group, so a per-block decode would need each column's
 * scale and zero point (the expanded scales alone, f32 per weight, outweigh
 * the dequantized weight's 2 bytes in bf16) or a per-expert permutation of
 * the activation's columns, which the DMA and vector engines cannot do.
 * dequant(gather(q, e), ...) becomes gather(dequant(q, s, z, g), e): the
 * dequant is then computed from weights only and packed below. */
static moe_status gptq_at_bind(moe_ctx *ctx, moe_graph *g)
{
	uint32_t nn = g->nnodes;
	bool any = false;
	for (moe_id i = 0; i < nn && !any; i++)
		any = gptq_of_gathers(g, i);
	if (!any)
		return MOE_OK;
	bool *only = ctx_alloc(ctx, nn + 1); /* a gather read by such dequants only */
	for (moe_id i = 0; i < nn; i++)
		only[i] = N(g, i)->op == MOE_OP_GATHER;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE && !gptq_of_gathers(g, i))
				only[a] = false;
		}
	}
	for (uint32_t o = 0; o < g->nout; o++)
		only[g->outputs[o]] = false;
	rebuild r;
	rebuild_begin(&r, g);
	moe_status st = MOE_OK;
	for (moe_id i = 0; i < nn && st == MOE_OK; i++) {
		const ir_node *n = N(g, i);
		if (only[i])
			continue;
		if (!gptq_of_gathers(g, i)) {
			rebuild_copy(&r, i);
			continue;
		}
		const ir_node *g0 = N(g, n->args[0]);
		moe_id w[4]; /* the weights themselves */
		for (uint32_t k = 0; k < 4; k++)
			w[k] = r.map[N(g, n->args[k])->args[0]];
		moe_id d = moe_node_new(r.dst, MOE_OP_DEQUANT, w, 4, n->loc);
		for (uint32_t a = 0; a < n->nattrs; a++)
			ir_attr_set(r.dst, N(r.dst, d), &n->attrs[a]);
		st = ir_infer(ctx, r.dst, d);
		moe_id x[2] = {d, r.map[g0->args[1]]};
		moe_id ga = st == MOE_OK ? moe_node_new(r.dst, MOE_OP_GATHER, x, 2, n->loc) : MOE_NONE;
		if (st == MOE_OK) {
			moe_node_set_int(r.dst, ga, "axis", 0);
			moe_node_set_valid(r.dst, ga, n->valid == MOE_NONE ? MOE_NONE : r.map[n->valid]);
			st = ir_infer(ctx, r.dst, ga);
		}
		r.map[i] = ga;
	}
	ctx_free(ctx, only, nn + 1);
	if (st != MOE_OK) {
		rebuild_abort(&r);
		return st;
	}
	rebuild_end(&r);
	return MOE_OK;
}

PASS(pass_tcp_split_weights)
{
	(void)opts;
	(void)ud;
	moe_status st = gptq_at_bind(ctx, g);
	if (st != MOE_OK)
		return st;
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
