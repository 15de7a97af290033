/* backend-tcp/compiler/gpass/pack_bias.c: an expert's bias vectors laid out
 * side by side, fetched by one DMA command (tcp-pack-bias).
 *
 * gpt-oss-20b's experts add a bias after each projection: three `e`
 * operands of the block_loop of one row of D (or F) each. The schedule
 * fetches each by a DMA command of its own (per block, or, expert-table,
 * every expert's rows once before the loop), and each command pays
 * dma.setup_cycles on the one in-order DMA queue that streams the weights;
 * at T = 1 that queue is the layer's critical path.
 *
 * The rewrite makes the loop's vector `e` operands of one type one operand
 * [E, sum of n], each expert's vectors side by side (a weight-only value:
 * tcp-split-weights marks it, prep.c packs it at load time, assumption
 * A13), and the body reads each as a slice of its row, a view of the one
 * per-expert buffer. Every reader sees the same values: y is unchanged. */
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "passes/pass.h"

/* whether every value node v depends on is a weight (no input, no loop) */
static bool weight_only(const moe_graph *g, moe_id v, int depth)
{
	const ir_node *n = N(g, v);
	if (n->op == MOE_OP_WEIGHT)
		return true;
	if (depth <= 0 || n->nargs == 0 || n->op == MOE_OP_BLOCK_LOOP || n->valid != MOE_NONE ||
		(ir_ops[n->op].flags & OPF_LEAF))
		return false;
	for (uint32_t k = 0; k < n->nargs; k++)
		if (!weight_only(g, n->args[k], depth - 1))
			return false;
	return true;
}

/* how many times node v of g is read (an output counted too) */
static uint32_t uses(const moe_graph *g, moe_id v)
{
	uint32_t n = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *a = N(g, i);
		for (uint32_t k = 0; k < a->nargs; k++)
			n += a->args[k] == v;
		n += a->valid == v;
	}
	for (uint32_t o = 0; o < g->nout; o++)
		n += g->outputs[o] == v;
	return n;
}

/* whether body value v is read whole, as a bias: by elementwise ops and
 * reshapes only (an operand tcp-pair-down packed is read as slices of its
 * row, a quantized weight's scales by its dequant) */
static bool read_whole(const moe_graph *bg, moe_id v)
{
	for (moe_id i = 0; i < bg->nnodes; i++) {
		const ir_node *n = N(bg, i);
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] == v && n->op != MOE_OP_RESHAPE && !(ir_ops[n->op].flags & OPF_ELEM))
				return false;
	}
	return true;
}

/* The loop's vector `e` operands: a body blockarg [n] read whole, of an
 * operand given to the loop once, read by nothing else, weight-only, of
 * the first one's type and E; in the body's order. */
static bool bias_find(const moe_graph *g, moe_id loop, tcp_packed *p)
{
	const ir_node *ln = N(g, loop);
	const moe_graph *bg = ir_node_body(g, ln);
	p->n = 0;
	p->off[0] = 0;
	if (!bg)
		return false;
	for (moe_id j = 0; j < bg->nnodes && p->n < TCP_PACK_MAX; j++) {
		const ir_node *a = N(bg, j);
		int k;
		if (a->op != MOE_OP_BLOCKARG || a->rank != 1 || !read_whole(bg, j))
			continue;
		moe_id w = tcp_loop_e_arg(g, ln, bg, j, &k);
		if (w == MOE_NONE)
			continue;
		const ir_node *wn = N(g, w), *w0 = p->n ? N(g, p->w[0]) : wn;
		if (wn->rank != 2 || wn->shape[1] != a->shape[0] || wn->dtype != w0->dtype ||
			wn->shape[0] != w0->shape[0] || uses(g, w) != 1 || !weight_only(g, w, 16))
			continue;
		tcp_packed_add(p, w, j, k, wn->shape[1]);
	}
	return p->n >= 2;
}

static moe_id bias_outer(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, void *ud, const moe_id *map)
{
	(void)ctx;
	const tcp_packed *p = ud;
	moe_id parts[TCP_PACK_MAX];
	char name[240];
	size_t at = 0;
	name[0] = 0;
	for (int i = 0; i < p->n; i++) {
		const ir_node *wn = N(g, p->w[i]);
		parts[i] = map[p->w[i]];
		at += (size_t)snprintf(name + at, sizeof name - at, "%s%.28s", i ? "+" : "", wn->name ? wn->name : "b");
		if (at >= sizeof name)
			at = sizeof name - 1;
	}
	moe_id all = ir_b_concat(dev, parts, (uint32_t)p->n, 1, N(g, p->w[0])->loc);
	moe_node_set_name(dev, all, name);
	return all;
}

static bool bias_views(moe_ctx *ctx, moe_graph *nb, moe_id q, const moe_graph *ob, moe_id *bm, void *ud)
{
	(void)ctx;
	const tcp_packed *p = ud;
	for (int i = 0; i < p->n; i++)
		bm[p->b[i]] = ir_b_slice(nb, q, 0, p->off[i], p->off[i + 1], N(ob, p->b[i])->loc);
	return true;
}

/* Kept when the merged loop fits DM (tcp_loop_fits) and the expected
 * block's fetch is shorter (the setups of the commands it saves): the
 * merged vectors are the same bytes, so neither DM nor the contractions
 * change otherwise. */
static bool bias_pays(const moe_graph *g, const moe_graph *r, const moe_tcp_machine *m)
{
	int64_t re = tcp_loop_rows(r, true), fr, lr, fg, lg;
	return tcp_loop_fits(r, m) && tcp_loop_block_cycles(r, m, re, &fr, &lr) >= 0 &&
	       tcp_loop_block_cycles(g, m, re, &fg, &lg) >= 0 && fr < fg;
}

moe_graph *tcp_pack_bias(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	const tcp_pack_rule rule = {bias_find, bias_pays, {bias_outer, bias_views, NULL, NULL, MOE_NONE}};
	return tcp_pack_loop(ctx, g, m, &rule);
}
