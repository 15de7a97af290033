/* backend-tcp/compiler/gpass/pair_down.c: an expert's three weight matrices
 * fetched by one DMA descriptor.
 *
 * After pair_gate_up.c a block reads two weight gathers per expert, the
 * packed gate/up pair and down: two DMA descriptors per expert fetch, each
 * paying the DMA context's command issue between two experts' transfers. A
 * decode is that stream of fetches back to back (Qwen3-30B-A3B at T = 1:
 * 8 experts of 9.4 MB), so every descriptor is time the layer waits for.
 *
 * A deployment lays out, once at load time, each expert's three matrices
 * side by side: [E, 2 F D + D F], the pair's rows then down's (prep.c packs
 * it like any weight computed from weights; assumption A13). The rewrite
 * makes the two per-block gathers one gather of that, and the pair's and
 * down's weights slices of it reshaped to their shapes, which the block
 * loop reads as views of the one per-expert buffer. The
 * contractions read the same weights in the same order: the value is
 * unchanged. Only when the double-buffered experts fit the DM planner's
 * grant for the loop's experts (tcp_dm_grant, dmplan.h), so the weights are
 * never streamed tile by tile, which reads each contraction's weights by
 * itself; on a block_loop, when the merged loop fits (pair_down_loop). */
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "ir/graph_keys.h"

/* The pieces: the pair's gather pq of concat(w1, w2), and down's
 * gather dq of a plain weight, both per expert under nb, each read by one
 * block einsum. */
typedef struct pdown {
	moe_id pq, cat, dq, w1, w2, wd;
} pdown;

/* down is [E, D, F] for the pair's [E, 2F, D], of the pair's type */
static bool down_fits(const moe_graph *g, const pdown *p)
{
	const ir_node *a = N(g, p->pq), *d = N(g, p->dq);
	return a->dtype == d->dtype && N(g, p->wd)->dtype == N(g, p->w1)->dtype && a->shape[0] == d->shape[0] &&
	       d->shape[1] == a->shape[2] && 2 * d->shape[2] == a->shape[1];
}

/* The first pair gather and, after it, the first plain gather that fits it
 * as down (a W8A8 layer's scale gathers, [E, F, 1] and [E, D, 1], fit no
 * pair of values). */
static bool find_pieces(const moe_graph *g, const uint32_t *nuse, moe_id nb, moe_id bexp, pdown *p)
{
	p->pq = p->dq = p->cat = p->w1 = p->w2 = p->wd = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_GATHER || n->valid != nb || n->args[1] != bexp || nuse[i] != 1 || n->rank != 3 ||
			ir_attr_int(n, "axis", 0) != 0)
			continue;
		const ir_node *s = N(g, n->args[0]);
		if (s->op == MOE_OP_CONCAT && s->nargs == 2 && nuse[n->args[0]] == 1 &&
			ir_attr_int(s, "axis", 0) == 1 && N(g, s->args[0])->op == MOE_OP_WEIGHT &&
			N(g, s->args[1])->op == MOE_OP_WEIGHT && p->pq == MOE_NONE) {
			p->pq = i, p->cat = n->args[0], p->w1 = s->args[0], p->w2 = s->args[1];
		} else if (tcp_block_weight_gather(g, nuse, i, nb, bexp) && p->dq == MOE_NONE && p->pq != MOE_NONE) {
			p->dq = i, p->wd = n->args[0];
			if (!down_fits(g, p))
				p->dq = p->wd = MOE_NONE;
		}
	}
	return p->pq != MOE_NONE && p->dq != MOE_NONE;
}

/* The merged weight, its gather and the two views, at the pair gather's place. */
static bool emit_merged(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, const pdown *p, moe_id nb, moe_id bexp,
	moe_id *map)
{
	const ir_node *a = N(g, p->pq), *d = N(g, p->dq), *cat = N(g, p->cat);
	int64_t E = N(g, p->w1)->shape[0], G = a->shape[0], na = a->shape[1] * a->shape[2],
		nd = d->shape[1] * d->shape[2], half = na / 2;
	moe_id parts[3];
	int64_t sh[2] = {E, half};
	parts[0] = ir_b_reshape(dev, map[p->w1], 2, sh, cat->loc);
	parts[1] = ir_b_reshape(dev, map[p->w2], 2, sh, cat->loc);
	sh[1] = nd;
	parts[2] = ir_b_reshape(dev, map[p->wd], 2, sh, cat->loc);
	moe_id all = ir_b_concat(dev, parts, 3, 1, cat->loc);
	char name[240];
	snprintf(name, sizeof name, "%.150s+%.80s", cat->name ? cat->name : "pair",
		N(g, p->wd)->name ? N(g, p->wd)->name : "down");
	moe_node_set_name(dev, all, name);
	if (ir_attr_find(cat, IR_NK_TCP_PACK)) /* else tcp-split-weights packs it by its own rule */
		moe_node_set_int(dev, all, IR_NK_TCP_PACK, ir_attr_int(cat, IR_NK_TCP_PACK, 0));
	moe_id ga[2] = {all, map[bexp]};
	moe_id gq = moe_node_new(dev, MOE_OP_GATHER, ga, 2, a->loc);
	moe_node_set_int(dev, gq, "axis", 0);
	if (ir_infer(ctx, dev, gq) != MOE_OK)
		return false;
	moe_node_set_valid(dev, gq, map[nb]);
	int64_t s3[3] = {G, a->shape[1], a->shape[2]};
	map[p->pq] = ir_b_reshape(dev, ir_b_slice(dev, gq, 1, 0, na, a->loc), 3, s3, a->loc);
	s3[1] = d->shape[1];
	s3[2] = d->shape[2];
	map[p->dq] = ir_b_reshape(dev, ir_b_slice(dev, gq, 1, na, na + nd, d->loc), 3, s3, d->loc);
	return true;
}

static moe_graph *pair_down_loop(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);

moe_graph *tcp_pair_down(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	if (ir_graph_has_block_loop(g))
		return pair_down_loop(ctx, g, m);
	moe_id nb = ir_graph_node_attr(g, IR_GK_NBLOCKS), bexp = ir_graph_node_attr(g, IR_GK_BLOCK_EXPERT);
	if (nb == MOE_NONE || bexp == MOE_NONE)
		return NULL;
	uint32_t nn = g->nnodes, *nuse = tcp_use_counts(ctx, g);
	pdown p;
	bool found = find_pieces(g, nuse, nb, bexp, &p);
	ctx_free(ctx, nuse, (nn + 1) * sizeof *nuse);
	if (!found || p.dq < p.pq || p.wd > p.cat || p.cat > p.pq)
		return NULL;
	/* never streamed: two experts' weights within the planner's grant for the
	 * loop's experts (half of DM); this flat-graph path is left from the
	 * flattened graphs no pipeline makes now (docs/tcp-compiler.md 8.1 step 10) */
	const ir_node *a = N(g, p.pq), *d = N(g, p.dq);
	double per = (double)(a->shape[1] * a->shape[2] + d->shape[1] * d->shape[2]) *
		     (double)moe_dtype_size((moe_dtype)a->dtype);
	if (2 * per > (double)tcp_dm_grant(m, TCP_DM_EXPERTS))
		return NULL;
	moe_graph *dev;
	moe_id *map = tcp_rewrite_begin(ctx, g, &dev);
	bool ok = true;
	for (moe_id i = 0; i < nn && ok; i++) {
		if (i == p.cat || i == p.dq)
			continue; /* read only by the gathers the merged one replaces */
		if (i == p.pq)
			ok = emit_merged(ctx, dev, g, &p, nb, bexp, map);
		else
			map[i] = ir_copy_node(dev, g, i, map);
	}
	return tcp_rewrite_end(ctx, dev, g, map, ok);
}

/* ---- on a block_loop (the tcp-sched pipeline) ----
 * The loop's `e` operand concat(w1, w2) along the output rows (the pair
 * tcp-pair-gate-up made, read only by the loop) and its `e` operand wd, a
 * plain weight [E, D, F] of the pair's type read in the body only as the
 * stationary operand of one contraction, become one operand [E, 2FD + DF]:
 * each expert's pair then down, side by side; the body reads the two as
 * reshaped slices of its row. */
typedef struct ldown {
	moe_id cat, w1, w2, wd, bp, bd; /* bp, bd: the two blockargs in the old body */
	int kp, kd;
	int64_t np, nd;
	const moe_graph *g;
} ldown;

static bool down_loop_find(const moe_graph *g, moe_id loop, ldown *p)
{
	const ir_node *ln = N(g, loop);
	const moe_graph *bg = ir_node_body(g, ln);
	uint32_t *nuse = NULL;
	p->bp = p->bd = MOE_NONE;
	for (moe_id j = 0; bg && j < bg->nnodes; j++) {
		const ir_node *en = N(bg, j);
		int batch = 0, k;
		if (en->op != MOE_OP_EINSUM || en->nargs != 2 || ir_node_einsum_form(en, &batch) != IR_EIN_MATMUL_NT ||
			batch != 0)
			continue;
		/* a W8A8 weight's int8 values: the dequant reads them as it would the
		 * operand's own blockarg (its scales stay an operand of their own) */
		moe_id v = en->args[1];
		const ir_node *dn = N(bg, v);
		if (dn->op == MOE_OP_DEQUANT && dn->nargs == 2 && !strcmp(ir_attr_str(dn, "act", "bf16"), "int8"))
			v = dn->args[0];
		moe_id w = tcp_loop_e_arg(g, ln, bg, v, &k);
		if (w == MOE_NONE)
			continue;
		const ir_node *wn = N(g, w);
		if (wn->op == MOE_OP_CONCAT && wn->nargs == 2 && ir_attr_int(wn, "axis", 0) == 1 && wn->rank == 3 &&
			N(g, wn->args[0])->op == MOE_OP_WEIGHT && N(g, wn->args[1])->op == MOE_OP_WEIGHT &&
			p->bp == MOE_NONE)
			p->bp = v, p->kp = k, p->cat = w, p->w1 = wn->args[0], p->w2 = wn->args[1];
		else if (wn->op == MOE_OP_WEIGHT && wn->rank == 3 && p->bd == MOE_NONE)
			p->bd = v, p->kd = k, p->wd = w;
	}
	if (p->bp == MOE_NONE || p->bd == MOE_NONE)
		return false;
	const ir_node *a = N(g, p->cat), *d = N(g, p->wd);
	if (a->dtype != d->dtype || a->shape[0] != d->shape[0] || d->shape[1] != a->shape[2] ||
		2 * d->shape[2] != a->shape[1])
		return false;
	/* the pair is read by the loop alone, each blockarg by one node */
	nuse = tcp_use_counts(g->ctx, g);
	bool once = nuse[p->cat] == 1;
	ctx_free(g->ctx, nuse, (g->nnodes + 1) * sizeof *nuse);
	uint32_t up = 0, ud = 0;
	for (moe_id j = 0; j < bg->nnodes; j++)
		for (uint32_t k = 0; k < N(bg, j)->nargs; k++)
			up += N(bg, j)->args[k] == p->bp, ud += N(bg, j)->args[k] == p->bd;
	p->np = a->shape[1] * a->shape[2];
	p->nd = d->shape[1] * d->shape[2];
	p->g = g;
	return once && up == 1 && ud == 1;
}

static moe_id down_outer(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, void *ud, const moe_id *map)
{
	(void)ctx;
	const ldown *p = ud;
	const ir_node *cat = N(g, p->cat);
	int64_t sh[2] = {cat->shape[0], p->np / 2};
	moe_id parts[3];
	parts[0] = ir_b_reshape(dev, map[p->w1], 2, sh, cat->loc);
	parts[1] = ir_b_reshape(dev, map[p->w2], 2, sh, cat->loc);
	sh[1] = p->nd;
	parts[2] = ir_b_reshape(dev, map[p->wd], 2, sh, cat->loc);
	moe_id all = ir_b_concat(dev, parts, 3, 1, cat->loc);
	char name[240];
	snprintf(name, sizeof name, "%.150s+%.80s", cat->name ? cat->name : "pair",
		N(g, p->wd)->name ? N(g, p->wd)->name : "down");
	moe_node_set_name(dev, all, name);
	return all;
}

static bool down_views(moe_ctx *ctx, moe_graph *nb, moe_id q, const moe_graph *ob, moe_id *bm, void *ud)
{
	(void)ctx;
	const ldown *p = ud;
	const ir_node *a = N(ob, p->bp), *d = N(ob, p->bd);
	bm[p->bp] = ir_b_reshape(nb, ir_b_slice(nb, q, 0, 0, p->np, a->loc), 2, a->shape, a->loc);
	bm[p->bd] = ir_b_reshape(nb, ir_b_slice(nb, q, 0, p->np, p->np + p->nd, d->loc), 2, d->shape, d->loc);
	return true;
}

/* Only when the merged loop fits DM with its experts double-buffered whole
 * (the merged operand is read through views, so it is never streamed tile
 * by tile), a full block (B rows) is bound by its fetch, and the DMA setups
 * it saves over the expected blocks outweigh what it adds to the loop's
 * drain. With the next expert prefetched a block ahead, a fetch-bound loop
 * takes a fetch per block: one fetch instead of three saves two setups per
 * block. But after the last fetch the last block computes: merged, every
 * contraction waits for the whole expert; separate, only those reading the
 * operand fetched last (down) do (DeepSeek-V3 at T = 1: 8 blocks save 8 us
 * of setups, the drain grows by the pair's contraction at about 14 us, TRF
 * loads of 58 MB). Where a full block's contractions outlast its fetch, the
 * setups are hidden under them and the separate operands let each block's
 * first contraction start once its own weights are in (DeepSeek-V3 at
 * T = 4096, B = 464: predicted faster on the expected loads, one block of
 * 128 rows per expert, slower on routing with full blocks). */
static bool down_pays(const moe_graph *g, const moe_graph *r, const moe_tcp_machine *m)
{
	int64_t fr, lr, fg, lg, B = tcp_loop_rows(r, false), re = tcp_loop_rows(r, true);
	int64_t full = tcp_loop_block_cycles(r, m, B, &fr, &lr);
	if (full < 0 || full > fr || !tcp_loop_fits(r, m))
		return false;
	if (tcp_loop_block_cycles(r, m, re, &fr, &lr) < 0 || tcp_loop_block_cycles(g, m, re, &fg, &lg) < 0)
		return false;
	return (fg - fr) * tcp_loop_blocks(r) > lr - lg;
}

static moe_graph *pair_down_loop(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		ldown p;
		if (N(g, i)->op != MOE_OP_BLOCK_LOOP)
			continue;
		if (!down_loop_find(g, i, &p))
			return NULL;
		tcp_loop_hooks h = {down_outer, down_views, NULL, &p, p.cat};
		moe_graph *r = tcp_loop_merge(ctx, g, i, p.kp < p.kd ? p.kp : p.kd, p.kp < p.kd ? p.kd : p.kp, &h);
		if (r && !down_pays(g, r, m)) {
			ir_graph_free(r);
			r = NULL;
		}
		return r;
	}
	return NULL;
}
