/* backend-tcp/compiler/gpass/pair_gate_up.c: one contraction for an expert's
 * gate and up projections (bf16 and f32 experts, W8A8 int8 experts, block-FP8
 * experts contracted with fp8 activations), on the
 * block_loop blockwise-dispatch writes (tcp-pair-gate-up).
 *
 * A block's gate and up einsums read the same activation rows and weights
 * of one shape. Each contraction pays, per TRF chunk, a command issue, the
 * fill/drain and the tree latency, and spreads its O output rows over
 * column groups of slices, the block's rows over the remaining row groups:
 * Qwen3-30B-A3B's F = 768 fills 480 of the 512 slices (48 column groups of
 * 16 rows, 10 row groups). Contracting the pair as one einsum with 2F output
 * rows halves the commands and lets the planner pick a tiling that fills
 * the slices (O = 1536: 64 column groups of 24 rows, 8 row groups).
 *
 * A deployment lays the two weights out side by side once, at load time:
 * concat(gate, up) along the output rows, [E, 2F, D] (prep.c packs it like
 * any weight computed from weights; assumption A13). The rewrite makes the
 * loop's two `e` operands one operand, the pair, the body's two einsums one
 * einsum over its blockarg, and each former einsum a slice of its value
 * along the last axis, which the schedule compiler reads as a view. Every
 * output element is the same dot product over the same inputs in the same
 * order, so the layer's value is unchanged. W8A8 int8 experts (per-channel
 * int8, act="int8") pair the same way: their values and their per-channel
 * scales are each laid out side by side and one dequant of the pair feeds
 * the einsum (its i8 x i8 contraction and its output-scale pass then run
 * once for both); each output row keeps its own values and scale, so the
 * value is unchanged. Block-FP8 experts with act="fp8" (128 x 128 blocks,
 * F a multiple of 128, so no block straddles the seam) pair alike, their
 * block scales [E, F / 128, D / 128] side by side; each output keeps its
 * chunk sums and scales (recipe_qact.c may cut the longer contraction's
 * reduction into other parts, which changes only their association). A graph without a block_loop (flattened) is left as
 * it is. */
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "backend-tcp/isa/cost.h"
#include "ir/quant.h"

static bool same_type(const ir_node *wa, const ir_node *wb)
{
	return wa != wb && wa->dtype == wb->dtype && wa->rank == wb->rank &&
	       !memcmp(wa->shape, wb->shape, sizeof(int64_t) * wa->rank);
}

static bool attr_equal(const ir_attr *a, const ir_attr *b)
{
	if (strcmp(a->key, b->key) || a->kind != b->kind)
		return false;
	switch (a->kind) {
	case MOE_ATTR_INT: return a->v.i == b->v.i;
	case MOE_ATTR_STR: return !strcmp(a->v.s, b->v.s);
	case MOE_ATTR_INTS:
		return a->count == b->count && !memcmp(a->v.ints, b->v.ints, sizeof(int64_t) * (size_t)a->count);
	default: return !memcmp(&a->v.f, &b->v.f, sizeof a->v.f); /* the same bits */
	}
}

/* Two W8A8 dequants of one kind: the same attributes in the same order. */
static bool same_dequant(const ir_node *a, const ir_node *b)
{
	if (a->nattrs != b->nattrs || a->dtype != b->dtype)
		return false;
	for (uint32_t k = 0; k < a->nattrs; k++)
		if (!attr_equal(&a->attrs[k], &b->attrs[k]))
			return false;
	return true;
}

/* How many times each node is read (outputs count twice); (nnodes + 1)
 * entries. */
uint32_t *tcp_use_counts(moe_ctx *ctx, const moe_graph *g)
{
	uint32_t nn = g->nnodes, *nuse = ctx_alloc(ctx, (nn + 1) * sizeof *nuse);
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE)
				nuse[a]++;
		}
	}
	for (uint32_t o = 0; o < g->nout; o++)
		nuse[g->outputs[o]] += 2;
	return nuse;
}

moe_id *tcp_rewrite_begin(moe_ctx *ctx, const moe_graph *g, moe_graph **dev)
{
	*dev = ir_graph_clone_empty(g);
	moe_id *map = ctx_alloc(ctx, (g->nnodes + 1) * sizeof *map);
	for (moe_id i = 0; i <= g->nnodes; i++)
		map[i] = MOE_NONE;
	return map;
}

moe_graph *tcp_rewrite_end(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, moe_id *map, bool ok)
{
	if (ok) {
		for (uint32_t o = 0; o < g->nout; o++)
			moe_graph_add_output(dev, map[g->outputs[o]]);
	}
	ctx_free(ctx, map, (g->nnodes + 1) * sizeof *map);
	if (!ok) {
		ir_graph_free(dev);
		return NULL;
	}
	return dev;
}

/* ---- the pairing on a block_loop ----
 * In a loop body an expert projection is an einsum [M, I] x [O, I] -> [M, O]
 * (ir_einsum_form's MATMUL_NT, no batch letter) whose second operand is a
 * blockarg of an `e` operand. A merge replaces two `e` operands of the loop
 * by one value computed from them (the pair laid out side by side, packed at
 * load time by tcp-split-weights' rule), and the body reads the two former
 * blockargs' values as views of the new one. */

/* How many times each node of a body is read (its yield counted twice). */
static uint32_t use_of(const moe_graph *bg, moe_id v)
{
	uint32_t n = 0;
	for (moe_id i = 0; i < bg->nnodes; i++) {
		const ir_node *a = N(bg, i);
		for (uint32_t k = 0; k < a->nargs; k++)
			n += a->args[k] == v;
		n += a->valid == v;
	}
	return n + (ir_body_yield(bg) == v ? 2 : 0);
}

moe_id tcp_loop_e_arg(const moe_graph *g, const ir_node *loop, const moe_graph *bg, moe_id v, int *k)
{
	const char *kinds = ir_attr_str(loop, "kinds", "");
	const ir_node *a = N(bg, v);
	if (a->op != MOE_OP_BLOCKARG || ir_blockarg_role_of(a) != IR_BA_IN)
		return MOE_NONE;
	int64_t i = ir_attr_int(a, "index", -1);
	if (i < 0 || i >= (int64_t)strlen(kinds) || kinds[i] != IR_BK_EXPERT || IR_BL_NCTRL + i >= loop->nargs)
		return MOE_NONE;
	for (int j = 0; j < (int)strlen(kinds); j++) /* an operand given to the loop once */
		if (j != i && loop->args[IR_BL_NCTRL + j] == loop->args[IR_BL_NCTRL + i])
			return MOE_NONE;
	(void)g;
	*k = (int)i;
	return loop->args[IR_BL_NCTRL + i];
}

/* A projection of the body: a two-operand MATMUL_NT einsum whose weight is
 * a blockarg of an `e` operand read only there; its outer operand (*k: its
 * operand index). */
static moe_id loop_projection(const moe_graph *g, const ir_node *loop, const moe_graph *bg, moe_id e, int *k)
{
	const ir_node *en = N(bg, e);
	int batch = 0;
	if (en->op != MOE_OP_EINSUM || en->nargs != 2 || ir_node_einsum_form(en, &batch) != IR_EIN_MATMUL_NT ||
		batch != 0 || en->args[0] == en->args[1] || use_of(bg, en->args[1]) != 1)
		return MOE_NONE;
	return tcp_loop_e_arg(g, loop, bg, en->args[1], k);
}

/* whether operand index idx is one of ks[0..n) and how many of them lie below it */
static bool merged_index(const int *ks, int n, int64_t idx, int *below)
{
	bool in = false;
	*below = 0;
	for (int i = 0; i < n; i++) {
		in |= ks[i] == idx;
		*below += ks[i] < idx;
	}
	return in;
}

moe_graph *tcp_loop_merge(moe_ctx *ctx, const moe_graph *g, moe_id loop, int ka, int kb, const tcp_loop_hooks *h)
{
	const int ks[2] = {ka, kb};
	return tcp_loop_merge_n(ctx, g, loop, ks, 2, h);
}

moe_graph *tcp_loop_merge_n(moe_ctx *ctx, const moe_graph *g, moe_id loop, const int *ks, int n,
	const tcp_loop_hooks *h)
{
	int ka = ks[0];
	const ir_node *ln = N(g, loop);
	const moe_graph *ob = ir_node_body(g, ln);
	const char *kinds = ir_attr_str(ln, "kinds", "");
	int nin = (int)strlen(kinds);
	moe_graph *dev;
	moe_id *map = tcp_rewrite_begin(ctx, g, &dev);
	bool ok = true;
	for (moe_id i = 0; i < g->nnodes && ok; i++) {
		if (h->skip_outer != MOE_NONE && i == h->skip_outer)
			continue;
		if (i != loop) {
			map[i] = ir_copy_node(dev, g, i, map);
			continue;
		}
		moe_id merged = h->outer(ctx, dev, g, h->ud, map);
		ok = merged != MOE_NONE;
		if (!ok)
			break;
		uint32_t bi;
		moe_graph *nb = ir_body_new(dev, &bi);
		moe_id *bm = ctx_alloc(ctx, (ob->nnodes + 1) * sizeof *bm);
		for (moe_id j = 0; j <= ob->nnodes; j++)
			bm[j] = MOE_NONE;
		moe_id q = MOE_NONE;
		for (moe_id j = 0; j < ob->nnodes && ok; j++) {
			const ir_node *a = N(ob, j);
			int64_t idx = a->op == MOE_OP_BLOCKARG && ir_blockarg_role_of(a) == IR_BA_IN ? ir_attr_int(a, "index", -1)
												    : -1;
			int below = 0;
			if (merged_index(ks, n, idx, &below)) {
				if (q == MOE_NONE) { /* the merged operand's blockarg where the first of the two was */
					const ir_node *mn = N(dev, merged);
					q = ir_emit(nb, MOE_OP_BLOCKARG, (moe_dtype)mn->dtype, mn->rank - 1, mn->shape + 1, NULL, 0,
						a->loc);
					moe_node_set_str(nb, q, "role", "in");
					moe_node_set_int(nb, q, "index", ka);
					ok = h->views(ctx, nb, q, ob, bm, h->ud);
				}
				continue;
			}
			int r = h->body ? h->body(ctx, nb, ob, j, q, bm, h->ud) : 0;
			if (r < 0)
				ok = false;
			else if (r == 0) {
				bm[j] = ir_copy_node(nb, ob, j, bm);
				if (idx > ka && below > 1)
					moe_node_set_int(nb, bm[j], "index", idx - (below - 1));
			}
		}
		moe_id y = ir_body_yield(ob);
		ok = ok && y != MOE_NONE && bm[y] != MOE_NONE;
		if (ok)
			moe_graph_add_output(nb, bm[y]);
		ctx_free(ctx, bm, (ob->nnodes + 1) * sizeof *bm);
		moe_id args[IR_BL_NCTRL + IR_BODY_MAX_INPUTS + 1];
		char nk[IR_BODY_MAX_INPUTS + 2];
		uint32_t na = 0;
		int nkk = 0;
		for (uint32_t k = 0; k < IR_BL_NCTRL; k++)
			args[na++] = map[ln->args[k]];
		for (int k = 0; k < nin && ok && nin <= IR_BODY_MAX_INPUTS; k++) {
			int below = 0;
			if (k != ka && merged_index(ks, n, k, &below))
				continue;
			args[na++] = k == ka ? merged : map[ln->args[IR_BL_NCTRL + k]];
			nk[nkk++] = kinds[k];
		}
		nk[nkk] = 0;
		ok = ok && nin <= IR_BODY_MAX_INPUTS && na == ln->nargs - (uint32_t)(n - 1);
		if (!ok)
			break;
		moe_id nl = moe_node_new(dev, MOE_OP_BLOCK_LOOP, args, na, ln->loc);
		for (uint32_t k = 0; k < ln->nattrs; k++)
			if (strcmp(ln->attrs[k].key, "kinds"))
				ir_attr_set(dev, N(dev, nl), &ln->attrs[k]);
		moe_node_set_str(dev, nl, "kinds", nk);
		if (ln->name)
			moe_node_set_name(dev, nl, ln->name);
		N(dev, nl)->body = bi;
		ok = ir_infer(ctx, dev, nl) == MOE_OK;
		map[i] = nl;
	}
	return tcp_rewrite_end(ctx, dev, g, map, ok);
}

/* ---- the decision on a loop (docs/tcp-compiler.md 3, rule 3) ----
 * Made on the loop alone, for the pass's machine: its buffers as a summary
 * asked of the DM planner (tcp_dm_fits), and one block priced on the cost
 * module (its expert operands' fetches, its contractions' tilings), never
 * by compiling the layer. */

/* the loop the pairings rewrite and price: the graph's first */
static const ir_node *first_loop(const moe_graph *g)
{
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_BLOCK_LOOP && ir_node_body(g, N(g, i)))
			return N(g, i);
	return NULL;
}

/* the bytes of one row of v ([E, ...]: one expert's) */
static int64_t row_bytes(const ir_node *v)
{
	return v->rank > 0 && v->shape[0] > 0 ? ir_bytes(v) / v->shape[0] : ir_bytes(v);
}

/* whether data operand k of loop ln is an `e` operand given to it before k */
static bool e_repeat(const ir_node *ln, const char *kinds, int k)
{
	for (int j = 0; j < k; j++)
		if (kinds[j] == IR_BK_EXPERT && ln->args[IR_BL_NCTRL + j] == ln->args[IR_BL_NCTRL + k])
			return true;
	return false;
}

/* a body node sched-build makes no DM buffer for: a leaf, or a view */
static bool body_view(const ir_node *n)
{
	int batch = 0;
	return (ir_ops[n->op].flags & OPF_LEAF) || n->op == MOE_OP_RESHAPE || n->op == MOE_OP_SLICE ||
	       n->op == MOE_OP_BROADCAST || (n->op == MOE_OP_EINSUM && n->nargs == 1 &&
						ir_node_einsum_form(n, &batch) == IR_EIN_PERMUTE);
}

bool tcp_loop_fits(const moe_graph *g, const moe_tcp_machine *m)
{
	const ir_node *ln = first_loop(g);
	if (!ln)
		return false;
	const moe_graph *bg = ir_node_body(g, ln);
	const char *kinds = ir_attr_str(ln, "kinds", "");
	ts_demand d;
	memset(&d, 0, sizeof d);
	/* the expert weights double-buffered whole: a merged operand is read
	 * through views, so it is never streamed tile by tile */
	for (int k = 0; kinds[k] && IR_BL_NCTRL + (uint32_t)k < ln->nargs && d.n < TS_MAX_DEMAND; k++)
		if (kinds[k] == IR_BK_EXPERT && !e_repeat(ln, kinds, k)) {
			d.bytes[d.n] = row_bytes(N(g, ln->args[IR_BL_NCTRL + k]));
			d.slots[d.n++] = 2;
		}
	/* a block's values: a `b` row copied in, every computed value, and each
	 * contraction's f32 partial */
	for (moe_id j = 0; j < bg->nnodes && d.n + 2 <= TS_MAX_DEMAND; j++) {
		const ir_node *n = N(bg, j);
		if (n->op == MOE_OP_BLOCKARG && ir_blockarg_role_of(n) == IR_BA_IN) {
			int64_t i = ir_attr_int(n, "index", -1);
			if (i >= 0 && i < (int64_t)strlen(kinds) && kinds[i] == IR_BK_BLOCK)
				d.bytes[d.n] = ir_bytes(n), d.slots[d.n++] = 1;
			continue;
		}
		if (body_view(n))
			continue;
		d.bytes[d.n] = ir_bytes(n), d.slots[d.n++] = 1;
		if (n->op == MOE_OP_EINSUM && n->rank > 0)
			d.bytes[d.n] = ir_bytes(n) / (int64_t)moe_dtype_size((moe_dtype)n->dtype) * 4, d.slots[d.n++] = 1;
	}
	return d.n < TS_MAX_DEMAND && tcp_dm_fits(m, &d);
}

int64_t tcp_loop_rows(const moe_graph *g, bool expected)
{
	const ir_node *ln = first_loop(g);
	if (!ln || ln->rank < 2)
		return 0;
	int64_t B = ln->shape[1], T = ir_graph_attr_int(g, "moe_tokens", 0), K = ir_graph_attr_int(g, "moe_k", 0),
		E = ir_graph_attr_int(g, "moe_experts", 0);
	if (!expected || T <= 0 || K <= 0 || E <= 0)
		return B;
	int64_t r = (T * K + E - 1) / E;
	return r < 1 ? 1 : r < B ? r : B;
}

int64_t tcp_loop_blocks(const moe_graph *g)
{
	const ir_node *ln = first_loop(g);
	if (!ln || ln->rank < 2)
		return 0;
	int64_t G = ln->shape[0], B = ln->shape[1], T = ir_graph_attr_int(g, "moe_tokens", 0),
		K = ir_graph_attr_int(g, "moe_k", 0), E = ir_graph_attr_int(g, "moe_experts", 0);
	if (T <= 0 || K <= 0 || E <= 0 || B <= 0)
		return G;
	int64_t used = T * K < E ? T * K : E, r = tcp_loop_rows(g, true), n = used * ((r + B - 1) / B);
	return n < G ? n : G;
}

/* one dma.copy of `bytes` contiguous HBM bytes into a buffer spread over
 * every slice */
static int64_t fetch_cycles(const tcp_cm *cm, int64_t bytes)
{
	tcp_dma_load c;
	tcp_dma_load_init(&c);
	c.bytes = bytes;
	c.requests = tcp_dma_requests(cm, bytes);
	tcp_dma_run(cm, &c, true, 0, bytes, false);
	tcp_dma_run(cm, &c, false, 0, bytes, true);
	tcp_dm_spread_side(cm->m, &c);
	tcp_dma_engines(cm, &c, false);
	bool over = false;
	return tcp_cost_dma(cm, &c, false, 0, &over);
}

/* the data operand index a body value reads, through views of a blockarg; -1: none */
static int64_t operand_of(const moe_graph *bg, moe_id v)
{
	for (int d = 0; d < 8 && v < bg->nnodes; d++) {
		const ir_node *n = N(bg, v);
		if (n->op == MOE_OP_BLOCKARG)
			return ir_blockarg_role_of(n) == IR_BA_IN ? ir_attr_int(n, "index", -1) : -1;
		if ((n->op != MOE_OP_SLICE && n->op != MOE_OP_RESHAPE) || n->nargs < 1)
			return -1;
		v = n->args[0];
	}
	return -1;
}

int64_t tcp_loop_block_cycles(const moe_graph *g, const moe_tcp_machine *m, int64_t rows, int64_t *fetch,
	int64_t *last)
{
	const ir_node *ln = first_loop(g);
	*fetch = *last = 0;
	if (!ln || rows <= 0)
		return -1;
	const moe_graph *bg = ir_node_body(g, ln);
	const char *kinds = ir_attr_str(ln, "kinds", "");
	tcp_cm cm;
	tcp_cm_init(&cm, m);
	int64_t lastk = -1;
	for (int k = 0; kinds[k] && IR_BL_NCTRL + (uint32_t)k < ln->nargs; k++)
		if (kinds[k] == IR_BK_EXPERT && !e_repeat(ln, kinds, k)) {
			*fetch += fetch_cycles(&cm, row_bytes(N(g, ln->args[IR_BL_NCTRL + k])));
			lastk = k;
		}
	int64_t compute = 0;
	for (moe_id j = 0; j < bg->nnodes; j++) {
		const ir_node *n = N(bg, j);
		int batch = 0;
		if (n->op != MOE_OP_EINSUM || n->nargs != 2 || ir_node_einsum_form(n, &batch) != IR_EIN_MATMUL_NT ||
			batch != 0 || n->rank != 2)
			continue;
		const ir_node *a = N(bg, n->args[0]), *w = N(bg, n->args[1]);
		/* a W8A8 weight contracts i8 x i8 (recipe_qact.c) over its values */
		bool i8 = w->op == MOE_OP_DEQUANT && w->nargs == 2 && !strcmp(ir_attr_str(w, "act", "bf16"), "int8");
		int64_t c = 0;
		tcp_plan_contract(m, rows, n->shape[1], a->shape[a->rank - 1], i8 ? MOE_I8 : w->dtype, &c);
		compute += c;
		if (lastk >= 0 && operand_of(bg, i8 ? w->args[0] : n->args[1]) == lastk)
			*last += c;
	}
	return compute;
}

/* one block's time with its next expert prefetched: its fetch or its
 * contractions, whichever is longer */
static int64_t block_time(const moe_graph *g, const moe_tcp_machine *m, int64_t rows)
{
	int64_t fetch, last, compute = tcp_loop_block_cycles(g, m, rows, &fetch, &last);
	return compute < 0 ? -1 : compute > fetch ? compute : fetch;
}

/* the gate/up pairing r of g pays: its loop fits DM and a block of it is no
 * slower than g's, full (B rows) or at the expected rows */
static bool pair_pays(const moe_graph *g, const moe_graph *r, const moe_tcp_machine *m)
{
	if (!tcp_loop_fits(r, m))
		return false;
	for (int x = 0; x < 2; x++) {
		int64_t rows = tcp_loop_rows(g, x == 1), a = block_time(r, m, rows), b = block_time(g, m, rows);
		if (a < 0 || b < 0 || a > b)
			return false;
	}
	return true;
}

/* gate/up on a loop: the two projections e1 < e2 of one activation under
 * one mask, their weights plain bf16 or f32 weights of one type */
typedef struct lpair {
	moe_id e1, e2, w1, w2, loop;
	int k1, k2;
	int64_t F;
	moe_id pe, s1, s2; /* in the new body */
} lpair;

static bool loop_pair_find(const moe_graph *g, moe_id loop, lpair *p)
{
	const ir_node *ln = N(g, loop);
	const moe_graph *bg = ir_node_body(g, ln);
	if (!bg)
		return false;
	for (moe_id a = 0; a < bg->nnodes; a++) {
		int ka, kb;
		moe_id wa = loop_projection(g, ln, bg, a, &ka);
		if (wa == MOE_NONE)
			continue;
		for (moe_id b = a + 1; b < bg->nnodes; b++) {
			moe_id wb = loop_projection(g, ln, bg, b, &kb);
			const ir_node *na = N(bg, a), *nbn = N(bg, b);
			if (wb == MOE_NONE || wb == wa || nbn->args[0] != na->args[0] || nbn->valid != na->valid ||
				nbn->dtype != na->dtype || N(g, wa)->op != MOE_OP_WEIGHT || N(g, wb)->op != MOE_OP_WEIGHT ||
				(N(g, wa)->dtype != MOE_BF16 && N(g, wa)->dtype != MOE_F32) || !same_type(N(g, wa), N(g, wb)) ||
				N(g, wa)->rank != 3)
				continue;
			*p = (lpair){a, b, wa, wb, loop, ka < kb ? ka : kb, ka < kb ? kb : ka, N(g, wa)->shape[1],
				MOE_NONE, MOE_NONE, MOE_NONE};
			return true;
		}
	}
	return false;
}

static moe_id pair_outer(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, void *ud, const moe_id *map)
{
	(void)ctx;
	const lpair *p = ud;
	const ir_node *w1 = N(g, p->w1), *w2 = N(g, p->w2);
	moe_id parts[2] = {map[p->w1], map[p->w2]};
	moe_id cat = ir_b_concat(dev, parts, 2, 1, w1->loc);
	char name[200];
	snprintf(name, sizeof name, "%.90s+%.90s", w1->name ? w1->name : "w", w2->name ? w2->name : "w");
	moe_node_set_name(dev, cat, name);
	return cat;
}

static bool pair_views(moe_ctx *ctx, moe_graph *nb, moe_id q, const moe_graph *ob, moe_id *bm, void *ud)
{
	(void)ctx, (void)nb, (void)ob, (void)bm;
	((lpair *)ud)->pe = q;
	return true;
}

/* the paired einsum at e1, e1 and e2 its halves */
static int pair_body(moe_ctx *ctx, moe_graph *nb, const moe_graph *ob, moe_id j, moe_id q, moe_id *bm, void *ud)
{
	lpair *p = ud;
	if (j == p->e2)
		return 1;
	if (j != p->e1)
		return 0;
	const ir_node *n1 = N(ob, j);
	moe_id ea[2] = {bm[n1->args[0]], q};
	moe_id e = moe_node_new(nb, MOE_OP_EINSUM, ea, 2, n1->loc);
	moe_node_set_str(nb, e, "eq", ir_attr_str(n1, "eq", ""));
	if (ir_infer(ctx, nb, e) != MOE_OK)
		return -1;
	if (n1->valid != MOE_NONE)
		moe_node_set_valid(nb, e, bm[n1->valid]);
	int ax = n1->rank - 1;
	bm[p->e1] = ir_b_slice(nb, e, ax, 0, p->F, n1->loc);
	bm[p->e2] = ir_b_slice(nb, e, ax, p->F, 2 * p->F, n1->loc);
	const ir_node *n2 = N(ob, p->e2);
	if (n1->name)
		moe_node_set_name(nb, bm[p->e1], n1->name);
	if (n2->name)
		moe_node_set_name(nb, bm[p->e2], n2->name);
	return 1;
}

/* ---- W8A8 (and act=fp8 block-FP8) gate/up on a loop ----
 * The projections read dequant(qa, sa) and dequant(qb, sb) of per-channel
 * int8 weights with int8 activations (act="int8") or of block-FP8 weights
 * with fp8 activations (act="fp8"), each dequant and each
 * blockarg read once. Two merges, as the flattened form pairs its gathers:
 * first the scales, concat(sa, sb) [E, 2F, 1], each dequant reading its half
 * as a view; then the values, concat(qa, qb) [E, 2F, D], and one dequant of
 * the pair with the paired scales feeds one einsum whose halves gate and up
 * read. Each output row keeps its own int8 values, scale and dot product
 * order, so the value is unchanged. */

/* the W8A8 dequant body einsum e reads (*kq, *ks: its values' and scales'
 * operand indices, *wq, *ws: the outer weights); MOE_NONE when not one */
static moe_id loop_w8a8(const moe_graph *g, const ir_node *ln, const moe_graph *bg, moe_id e, int *kq, int *ks,
	moe_id *wq, moe_id *ws)
{
	const ir_node *en = N(bg, e);
	int batch = 0;
	if (en->op != MOE_OP_EINSUM || en->nargs != 2 || ir_node_einsum_form(en, &batch) != IR_EIN_MATMUL_NT ||
		batch != 0 || en->args[0] == en->args[1] || use_of(bg, en->args[1]) != 1)
		return MOE_NONE;
	moe_id d = en->args[1];
	const ir_node *dn = N(bg, d);
	qt_info qi;
	if (dn->op != MOE_OP_DEQUANT || dn->nargs != 2 || !ir_dequant_info(bg, dn, &qi) ||
		use_of(bg, dn->args[0]) != 1 || use_of(bg, dn->args[1]) != 1)
		return MOE_NONE;
	const char *act = ir_attr_str(dn, "act", "bf16");
	bool i8 = !strcmp(act, "int8") && qi.fmt == QT_INT8 && qi.bn == 1 && qi.bk == qi.K;
	bool f8 = !strcmp(act, "fp8") && qi.fmt == QT_FP8 && qi.bn == 128 && qi.bk == 128 && qi.N % 128 == 0 &&
		  qi.K % 128 == 0;
	if (!i8 && !f8)
		return MOE_NONE;
	*wq = tcp_loop_e_arg(g, ln, bg, dn->args[0], kq);
	*ws = tcp_loop_e_arg(g, ln, bg, dn->args[1], ks);
	if (*wq == MOE_NONE || *ws == MOE_NONE || N(g, *wq)->op != MOE_OP_WEIGHT || N(g, *ws)->op != MOE_OP_WEIGHT ||
		N(g, *wq)->rank != 3 || N(g, *ws)->rank != 3)
		return MOE_NONE;
	return d;
}

typedef struct lw8a8 {
	moe_id e1, e2, d1, d2, sb1, sb2; /* body nodes of the graph being merged */
	moe_id wq1, wq2, ws1, ws2;
	int kq1, kq2, ks1, ks2;
	int64_t F, Fs; /* rows of each weight and of its scales */
	moe_id qs;     /* the paired scales' blockarg (values merge: in the old body) */
	lpair lp;  /* the merge in progress: its outer weights and new blockarg */
} lw8a8;

/* the W8A8 gate/up pair of loop's body: as loop_pair_find, for dequants of
 * one kind over values of one type and scales of one type */
static bool loop_w8a8_find(const moe_graph *g, moe_id loop, lw8a8 *p)
{
	const ir_node *ln = N(g, loop);
	const moe_graph *bg = ir_node_body(g, ln);
	for (moe_id a = 0; bg && a < bg->nnodes; a++) {
		int qa = 0, sa = 0, qb = 0, sb = 0;
		moe_id wqa = MOE_NONE, wsa = MOE_NONE, wqb = MOE_NONE, wsb = MOE_NONE, da = loop_w8a8(g, ln, bg, a, &qa, &sa, &wqa, &wsa);
		if (da == MOE_NONE)
			continue;
		for (moe_id b = a + 1; b < bg->nnodes; b++) {
			moe_id db = loop_w8a8(g, ln, bg, b, &qb, &sb, &wqb, &wsb);
			const ir_node *na = N(bg, a), *nbn = N(bg, b);
			if (db == MOE_NONE || nbn->args[0] != na->args[0] || nbn->valid != na->valid ||
				nbn->dtype != na->dtype || !same_type(N(g, wqa), N(g, wqb)) || !same_type(N(g, wsa), N(g, wsb)) ||
				!same_dequant(N(bg, da), N(bg, db)) || qa > qb)
				continue;
			*p = (lw8a8){a, b, da, db, N(bg, da)->args[1], N(bg, db)->args[1], wqa, wqb, wsa, wsb, qa, qb, sa, sb,
				N(g, wqa)->shape[1], N(g, wsa)->shape[1], MOE_NONE, {0}};
			return true;
		}
	}
	return false;
}

static moe_id w8a8_outer(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, void *ud, const moe_id *map)
{
	return pair_outer(ctx, dev, g, &((lw8a8 *)ud)->lp, map);
}

/* scales merge: each dequant reads its half of the paired scales */
static bool w8a8_scale_views(moe_ctx *ctx, moe_graph *nb, moe_id q, const moe_graph *ob, moe_id *bm, void *ud)
{
	(void)ctx;
	lw8a8 *p = ud;
	bm[p->sb1] = ir_b_slice(nb, q, 0, 0, p->Fs, N(ob, p->sb1)->loc);
	bm[p->sb2] = ir_b_slice(nb, q, 0, p->Fs, 2 * p->Fs, N(ob, p->sb2)->loc);
	return true;
}

/* values merge: w8a8_body reads the pair's blockarg as it is given */
static bool w8a8_value_views(moe_ctx *ctx, moe_graph *nb, moe_id q, const moe_graph *ob, moe_id *bm, void *ud)
{
	(void)ctx, (void)nb, (void)q, (void)ob, (void)bm, (void)ud;
	return true;
}

/* values merge: one dequant of the pair with the paired scales (the blockarg
 * both former halves view) at e1, one einsum, gate and up its halves */
static int w8a8_body(moe_ctx *ctx, moe_graph *nb, const moe_graph *ob, moe_id j, moe_id q, moe_id *bm, void *ud)
{
	lw8a8 *p = ud;
	if (j == p->e2 || j == p->d1 || j == p->d2 || j == p->sb1 || j == p->sb2)
		return 1;
	if (j != p->e1)
		return 0;
	const ir_node *d1 = N(ob, p->d1);
	moe_id da[2] = {q, bm[p->qs]};
	if (da[1] == MOE_NONE)
		return -1;
	moe_id d = moe_node_new(nb, MOE_OP_DEQUANT, da, 2, d1->loc);
	for (uint32_t k = 0; k < d1->nattrs; k++)
		ir_attr_set(nb, N(nb, d), &d1->attrs[k]);
	if (ir_infer(ctx, nb, d) != MOE_OK)
		return -1;
	if (d1->valid != MOE_NONE)
		moe_node_set_valid(nb, d, bm[d1->valid]);
	p->lp.e1 = p->e1, p->lp.e2 = p->e2, p->lp.F = p->F;
	return pair_body(ctx, nb, ob, j, d, bm, &p->lp);
}

/* the values merge on r, the graph after the scales merge: its body's
 * dequants read the two halves of one scales blockarg */
static bool loop_w8a8_refind(const moe_graph *r, lw8a8 *p)
{
	for (moe_id i = 0; i < r->nnodes; i++) {
		if (N(r, i)->op != MOE_OP_BLOCK_LOOP)
			continue;
		const ir_node *ln = N(r, i);
		const moe_graph *bg = ir_node_body(r, ln);
		int n = 0;
		for (moe_id j = 0; bg && j < bg->nnodes; j++) {
			const ir_node *en = N(bg, j);
			int batch = 0, k;
			if (en->op != MOE_OP_EINSUM || en->nargs != 2 || ir_node_einsum_form(en, &batch) != IR_EIN_MATMUL_NT ||
				N(bg, en->args[1])->op != MOE_OP_DEQUANT)
				continue;
			const ir_node *dn = N(bg, en->args[1]);
			const ir_node *sl = N(bg, dn->args[1]);
			if (sl->op != MOE_OP_SLICE || N(bg, sl->args[0])->op != MOE_OP_BLOCKARG)
				continue; /* down */
			if (tcp_loop_e_arg(r, ln, bg, dn->args[0], &k) == MOE_NONE || n >= 2)
				return false;
			if (n == 0)
				p->e1 = j, p->d1 = en->args[1], p->sb1 = dn->args[1], p->qs = sl->args[0], p->kq1 = k;
			else if (sl->args[0] != p->qs || en->args[0] != N(bg, p->e1)->args[0])
				return false;
			else
				p->e2 = j, p->d2 = en->args[1], p->sb2 = dn->args[1], p->kq2 = k;
			n++;
		}
		return n == 2 && p->kq1 < p->kq2;
	}
	return false;
}

/* W8A8 gate/up on loop i of g: the scales merge, then the values merge */
static moe_graph *pair_loop_w8a8(moe_ctx *ctx, const moe_graph *g, moe_id i)
{
	lw8a8 p;
	if (!loop_w8a8_find(g, i, &p))
		return NULL;
	p.lp.w1 = p.ws1, p.lp.w2 = p.ws2;
	tcp_loop_hooks hs = {w8a8_outer, w8a8_scale_views, NULL, &p, MOE_NONE};
	moe_graph *r1 = tcp_loop_merge(ctx, g, i, p.ks1 < p.ks2 ? p.ks1 : p.ks2, p.ks1 < p.ks2 ? p.ks2 : p.ks1, &hs);
	if (!r1)
		return NULL;
	moe_graph *r = NULL;
	moe_id l1 = MOE_NONE;
	for (moe_id k = 0; k < r1->nnodes && l1 == MOE_NONE; k++)
		if (N(r1, k)->op == MOE_OP_BLOCK_LOOP)
			l1 = k;
	if (loop_w8a8_refind(r1, &p)) {
		/* the values' outer weights, as r1 maps them */
		const ir_node *ln = N(r1, l1);
		p.lp.w1 = ln->args[IR_BL_NCTRL + p.kq1], p.lp.w2 = ln->args[IR_BL_NCTRL + p.kq2];
		tcp_loop_hooks hq = {w8a8_outer, w8a8_value_views, w8a8_body, &p, MOE_NONE};
		r = tcp_loop_merge(ctx, r1, l1, p.kq1, p.kq2, &hq);
	}
	ir_graph_free(r1);
	return r;
}

/* gate/up on the first block_loop (the one the decision prices) when it has
 * such a pair and the pairing pays (pair_pays) */
/* The first block_loop's gate and up paired (NULL: g has no loop, the loop
 * has no such pair, or the pairing does not pay). */
moe_graph *tcp_pair_gate_up(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		lpair p;
		if (N(g, i)->op != MOE_OP_BLOCK_LOOP)
			continue;
		moe_graph *r = NULL;
		if (loop_pair_find(g, i, &p)) {
			tcp_loop_hooks h = {pair_outer, pair_views, pair_body, &p, MOE_NONE};
			r = tcp_loop_merge(ctx, g, i, p.k1, p.k2, &h);
		} else
			r = pair_loop_w8a8(ctx, g, i);
		if (r && !pair_pays(g, r, m)) {
			ir_graph_free(r);
			r = NULL;
		}
		return r;
	}
	return NULL;
}
