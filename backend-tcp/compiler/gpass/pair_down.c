/* backend-tcp/compiler/gpass/pair_down.c: an expert's three weight matrices
 * fetched by one DMA descriptor (tcp-pair-down), on the block_loop whose
 * gate and up pair_gate_up.c paired.
 *
 * After pair_gate_up.c a block reads two `e` operands per expert, the
 * packed gate/up pair and down: two DMA descriptors per expert fetch, each
 * paying the DMA context's command issue between two experts' transfers. A
 * decode is that stream of fetches back to back (Qwen3-30B-A3B at T = 1:
 * 8 experts of 9.4 MB), so every descriptor is time the layer waits for.
 *
 * A deployment lays out, once at load time, each expert's three matrices
 * side by side: [E, 2 F D + D F], the pair's rows then down's (prep.c packs
 * it like any weight computed from weights; assumption A13). The rewrite
 * makes the two operands one, and the pair's and down's weights slices of
 * its row reshaped to their shapes, which the schedule compiler reads as
 * views of the one per-expert buffer. The contractions read the same
 * weights in the same order: the value is unchanged. Only when the merged
 * loop fits DM with its experts double-buffered whole (a merged operand is
 * never streamed tile by tile) and the merge pays (down_pays). */
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "passes/pass.h"

/* The loop's `e` operand concat(w1, w2) along the output rows (the pair
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

/* The expected block's fetch and drain cycles of the merged loop r (fr, lr)
 * and of the loop as it was, g (fg, lg); false unless r fits DM with its
 * experts double-buffered whole and a full block of r is bound by its fetch. */
static bool merged_costs(const moe_graph *g, const moe_graph *r, const moe_tcp_machine *m, int64_t *fr, int64_t *lr,
	int64_t *fg, int64_t *lg)
{
	int64_t B = tcp_loop_rows(r, false), re = tcp_loop_rows(r, true);
	int64_t full = tcp_loop_block_cycles(r, m, B, fr, lr);
	if (full < 0 || full > *fr || !tcp_loop_fits(r, m))
		return false;
	return tcp_loop_block_cycles(r, m, re, fr, lr) >= 0 && tcp_loop_block_cycles(g, m, re, fg, lg) >= 0;
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
	int64_t fr, lr, fg, lg;
	return merged_costs(g, r, m, &fr, &lr, &fg, &lg) && (fg - fr) * tcp_loop_blocks(r) > lr - lg;
}

/* The first block_loop's pair and down merged (NULL: g has no loop, the loop
 * has no such pieces, or the merge does not pay). */
moe_graph *tcp_pair_down(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
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

/* ---- a loop whose gate and up were not paired (tcp_pack_experts) ----
 * gpt-oss-20b: gate and up are strided slices of the fused gate_up, not
 * weight leaves, so tcp-pair-gate-up leaves them; with down, each expert is
 * three fetches, each paying dma.setup_cycles on the one in-order DMA
 * queue that streams the weights. The projections' weights are laid out
 * side by side at load time, [E, sum of O I], in the order the body
 * contracts them (its last projection's weights last), and the body reads
 * each as a reshaped slice of its row: one fetch per expert. The biases
 * are not contractions' operands and stay apart (tcp-pack-bias, pack_bias.c,
 * lays them out side by side as one operand of their own). The contractions
 * read the same weights: the value is unchanged. */
enum { PACK_MAX = 4 };

static bool pack_find(const moe_graph *g, moe_id loop, tcp_packed *p)
{
	const ir_node *ln = N(g, loop);
	const moe_graph *bg = ir_node_body(g, ln);
	p->n = 0;
	p->off[0] = 0;
	if (!bg)
		return false;
	uint32_t *nuse = tcp_use_counts(g->ctx, g);
	bool ok = true;
	for (moe_id j = 0; j < bg->nnodes && ok; j++) {
		const ir_node *en = N(bg, j);
		int batch = 0, k;
		if (en->op != MOE_OP_EINSUM || en->nargs != 2 || ir_node_einsum_form(en, &batch) != IR_EIN_MATMUL_NT ||
			batch != 0)
			continue;
		moe_id w = tcp_loop_e_arg(g, ln, bg, en->args[1], &k);
		if (w == MOE_NONE)
			continue;
		const ir_node *wn = N(g, w);
		uint32_t uses = 0;
		for (moe_id i = 0; i < bg->nnodes; i++)
			for (uint32_t a = 0; a < N(bg, i)->nargs; a++)
				uses += N(bg, i)->args[a] == en->args[1];
		ok = p->n < PACK_MAX && uses == 1 && nuse[w] == 1 && wn->rank == 3 &&
		     (wn->dtype == MOE_BF16 || wn->dtype == MOE_F32) && (p->n == 0 || wn->dtype == N(g, p->w[0])->dtype) &&
		     (p->n == 0 || wn->shape[0] == N(g, p->w[0])->shape[0]);
		if (!ok)
			break;
		tcp_packed_add(p, w, en->args[1], k, wn->shape[1] * wn->shape[2]);
	}
	ctx_free(g->ctx, nuse, (g->nnodes + 1) * sizeof *nuse);
	return ok && p->n >= 2;
}

static moe_id pack_outer(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, void *ud, const moe_id *map)
{
	(void)ctx;
	const tcp_packed *p = ud;
	const ir_node *w0 = N(g, p->w[0]);
	moe_id parts[PACK_MAX];
	char name[240];
	size_t at = 0;
	name[0] = 0;
	for (int i = 0; i < p->n; i++) {
		const ir_node *wn = N(g, p->w[i]);
		int64_t sh[2] = {wn->shape[0], p->off[i + 1] - p->off[i]};
		parts[i] = ir_b_reshape(dev, map[p->w[i]], 2, sh, wn->loc);
		at += (size_t)snprintf(name + at, sizeof name - at, "%s%.50s", i ? "+" : "", wn->name ? wn->name : "w");
		if (at >= sizeof name)
			at = sizeof name - 1;
	}
	moe_id all = ir_b_concat(dev, parts, (uint32_t)p->n, 1, w0->loc);
	moe_node_set_name(dev, all, name);
	return all;
}

static bool pack_views(moe_ctx *ctx, moe_graph *nb, moe_id q, const moe_graph *ob, moe_id *bm, void *ud)
{
	(void)ctx;
	const tcp_packed *p = ud;
	for (int i = 0; i < p->n; i++) {
		const ir_node *a = N(ob, p->b[i]);
		bm[p->b[i]] = ir_b_reshape(nb, ir_b_slice(nb, q, 0, p->off[i], p->off[i + 1], a->loc), 2, a->shape, a->loc);
	}
	return true;
}

/* As down_pays, but the drain is not priced: split-last-fetch cuts the
 * last block's fetch where the body's last projection's weights begin (its
 * loads are the last of the slot's, docs/tcp-compiler.md 5.2), so after the
 * last weight byte the same contraction runs as with separate fetches.
 * Only when the merged loop fits DM with its experts double-buffered whole,
 * a full block is bound by its fetch and the expected block's fetch is
 * shorter (the setups saved). */
static bool pack_pays(const moe_graph *g, const moe_graph *r, const moe_tcp_machine *m)
{
	int64_t fr, lr, fg, lg;
	return merged_costs(g, r, m, &fr, &lr, &fg, &lg) && fg > fr;
}

/* Where tcp-split-weights marked g before this rewrite (moe_tcp_compile
 * runs the pass on a graph a pipeline without the target passes planned),
 * its marks name the projections, now read only by the concat: r's packed
 * values are planned again by its rule, as the pass would mark them. */
void tcp_pack_marks_again(moe_ctx *ctx, moe_graph *r)
{
	bool marked = false;
	for (moe_id i = 0; i < r->nnodes && !marked; i++)
		marked = ir_attr_find(N(r, i), IR_NK_TCP_PACK) != NULL;
	if (!marked)
		return;
	bool *pack = ctx_alloc(ctx, r->nnodes + 1);
	pass_tcp_pack_plan(ctx, r, pack);
	int64_t k = 0;
	for (moe_id i = 0; i < r->nnodes; i++)
		if (pack[i])
			moe_node_set_int(r, i, IR_NK_TCP_PACK, k++);
		else if (ir_attr_find(N(r, i), IR_NK_TCP_PACK))
			moe_node_set_int(r, i, IR_NK_TCP_PACK, -1);
	ctx_free(ctx, pack, r->nnodes + 1);
}

void tcp_packed_add(tcp_packed *p, moe_id w, moe_id b, int k, int64_t len)
{
	if (p->n >= TCP_PACK_MAX)
		return;
	p->w[p->n] = w, p->b[p->n] = b;
	p->off[p->n + 1] = p->off[p->n] + len;
	int j = p->n++;
	for (; j > 0 && p->k[j - 1] > k; j--) /* the operand indices ascending */
		p->k[j] = p->k[j - 1];
	p->k[j] = k;
}

moe_graph *tcp_pack_loop(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const tcp_pack_rule *rule)
{
	tcp_packed p;
	tcp_loop_hooks h = rule->h;
	h.ud = &p;
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (N(g, i)->op != MOE_OP_BLOCK_LOOP)
			continue;
		p = (tcp_packed){0};
		if (!rule->find(g, i, &p))
			return NULL;
		moe_graph *r = tcp_loop_merge_n(ctx, g, i, p.k, p.n, &h);
		if (r && !rule->pays(g, r, m)) {
			ir_graph_free(r);
			r = NULL;
		}
		if (r)
			tcp_pack_marks_again(ctx, r);
		return r;
	}
	return NULL;
}

moe_graph *tcp_pack_experts(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	const tcp_pack_rule rule = {pack_find, pack_pays, {pack_outer, pack_views, NULL, NULL, MOE_NONE}};
	return tcp_pack_loop(ctx, g, m, &rule);
}
