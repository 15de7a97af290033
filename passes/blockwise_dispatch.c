/* passes/blockwise_dispatch.c: experts(...) -> expert-centric blockwise form.
 *
 * The n = T*K routed pairs are grouped by expert into blocks of B rows:
 *   oh    = one_hot(idx, E)                     [n, E]   pair p -> expert
 *   cnt   = sum_p oh                            [E]      tokens per expert
 *   nb    = ceil(cnt / B), boff = excl-cumsum(nb), nblocks = sum nb
 *   rank  = sum_e oh * excl-cumsum_p(oh)        [n]      row within expert
 *   pos   = (sum_e oh * boff) * B + rank        [n]      row in the grid
 *   owner = boff <= g < boff + nb               [G, E]
 *   bexp  = filter(owner, e)[:, 0]              [G]      expert of block g
 *   rows  = sum_e owner * min(B, cnt - (g - boff) B)  [G] valid rows
 * Option balance=1 spreads each expert's rows evenly over its nb blocks:
 *   be    = ceil(cnt / max(nb, 1))             [E]      rows per block
 *   pos   = (off + rank / be) * B + rank mod be, off = sum_e oh * boff
 *   rows  = sum_e owner * min(be, cnt - (g - boff) be)
 * (nb, boff and G unchanged): a block of an expert's last few rows, which
 * a backend that streams the expert's weights again for every block pays
 * in full, becomes rows spread over the expert's other blocks.
 * Tokens are scattered into a [G*B, D] grid, each block multiplies with its
 * expert's weights (gathered per block), and the results are gathered back
 * per pair and summed with the routing weights. G is the tight worst case of
 * grid-bound; `valid` masks (nblocks for weight gathers, rows for the block
 * math) mark padding rows and blocks past the run-time count so backends skip
 * them. Activations are computed in f32 and rounded once, like experts().
 * The combine runs over chunks of tokens when the gathered [T*K, D] rows
 * would exceed the `chunk` option (default 2^25 elements; f32 ones count
 * twice), so no buffer
 * holds them all (DeepSeek-V3 at T = 4096: 470 MB in bf16).
 * Serving (an n_tokens input, docs/semantics.md section 7): the pairs of
 * tokens >= n get no one-hot entry, so no count, grid row or block; they
 * scatter pair 0's row onto pair 0's place (the same bytes again), the
 * combine reads only the real pairs, and output rows >= n are zero. */
#include <math.h>
#include <string.h>

#include "passes/pass.h"

#define CHAIN_MIN ((int64_t)1 << 17) /* combine=chain: rows x D of a chunk from which the sum is K adds */
#define SQRT1_2 0.70710678118654752440
#define PI 3.14159265358979323846

typedef struct dp {
	moe_graph *d;
	moe_loc loc;
	moe_dtype t;
	int64_t T, K, E, F, D, B, G, n;
	int64_t chunk; /* combine: most gathered elements per token chunk */
	int64_t tail;  /* option tail: the last chunk's last 1/tail tokens a chunk of their own (0: off) */
	moe_id rows, nblocks, bexp;
	moe_id ntok; /* serving: the n_tokens input (rebuilt graph), else MOE_NONE */
	bool decode; /* option decode=1: a T = 1 layer takes the decode grid (decode_grid) */
	bool dgrid;  /* this layer's grid is the decode grid */
	bool chain;  /* option combine=chain: combine_chain for large chunks */
	bool scan_counts; /* option counts=scan: tokens per expert from the pairs' scan */
	bool tok_rank;    /* option rank=tokens: each pair's row within its expert from a scan over tokens */
	bool balance;     /* option balance=1: an expert's blocks share its rows evenly (index_grid) */
	/* building a block_loop body: d is the body, rows its rows blockarg,
	 * outer the graph holding the loop, whose data operands lop[] of kinds[]
	 * each blockarg of role in reads */
	bool body;
	moe_graph *outer;
	moe_id lop[IR_BODY_MAX_INPUTS];
	char kinds[IR_BODY_MAX_INPUTS + 1];
	int nl;
} dp;

static moe_id ci(dp *c, int64_t v)
{
	return ir_b_const(c->d, MOE_I32, (double)v, c->loc);
}

static moe_id cf(dp *c, double v)
{
	return ir_b_const(c->d, MOE_F32, v, c->loc);
}

static moe_id b2(dp *c, moe_op op, moe_id a, moe_id b)
{
	return ir_b2(c->d, op, a, b, c->loc);
}

/* Elementwise op over block values, skipped outside valid rows. */
static moe_id v2(dp *c, moe_op op, moe_id a, moe_id b)
{
	moe_id x[2] = {a, b};
	moe_id id = moe_node_new(c->d, op, x, 2, c->loc);
	moe_node_set_valid(c->d, id, c->rows);
	IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	return id;
}

static moe_id v1(dp *c, moe_op op, moe_id a)
{
	moe_id id = moe_node_new(c->d, op, &a, 1, c->loc);
	moe_node_set_valid(c->d, id, c->rows);
	IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	return id;
}

static moe_id vcast(dp *c, moe_id a, moe_dtype t)
{
	if (N(c->d, a)->dtype == t)
		return a;
	moe_id id = moe_node_new(c->d, MOE_OP_CAST, &a, 1, c->loc);
	moe_node_set_str(c->d, id, "to", moe_dtype_name(t));
	moe_node_set_valid(c->d, id, c->rows);
	IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	return id;
}

static moe_id reshape(dp *c, moe_id x, int rank, int64_t a, int64_t b, int64_t d3)
{
	int64_t s[3] = {a, b, d3};
	return ir_b_reshape(c->d, x, rank, s, c->loc);
}

/* In a body: the blockarg reading block g's row of outer value v (kind b)
 * or its expert's (kind e), the loop's next data input. */
static moe_id block_input(dp *c, moe_id v, char kind)
{
	const ir_node *x = N(c->outer, v);
	IR_ASSERT(c->nl < IR_BODY_MAX_INPUTS && x->rank >= 1);
	moe_id id = ir_emit(c->d, MOE_OP_BLOCKARG, (moe_dtype)x->dtype, x->rank - 1, x->shape + 1, NULL, 0, c->loc);
	moe_node_set_str(c->d, id, "role", "in");
	moe_node_set_int(c->d, id, "index", c->nl);
	c->kinds[c->nl] = kind;
	c->kinds[c->nl + 1] = 0;
	c->lop[c->nl++] = v;
	return id;
}

/* Per-block weight [G, ...] = w[bexp], only for blocks < nblocks (in a
 * body: the block's expert's row of w). */
static moe_id gather_blocks(dp *c, moe_id w)
{
	if (c->body)
		return block_input(c, w, IR_BK_EXPERT);
	moe_id x[2] = {w, c->bexp};
	moe_id id = moe_node_new(c->d, MOE_OP_GATHER, x, 2, c->loc);
	moe_node_set_int(c->d, id, "axis", 0);
	moe_node_set_valid(c->d, id, c->nblocks);
	IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	return id;
}

/* Node id under valid(v) when v is set (a fresh node: shared builders may
 * return an existing one, which is then left alone). */
static moe_id masked(dp *c, moe_id id, moe_id v)
{
	if (v != MOE_NONE && N(c->d, id)->valid == MOE_NONE && (ir_ops[N(c->d, id)->op].flags & OPF_VALID) &&
		N(c->d, id)->rank >= 1 && !(ir_valid_rows_only(N(c->d, id)->op) && N(c->d, v)->rank != 0)) {
		moe_node_set_valid(c->d, id, v);
		IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	}
	return id;
}

/* eq of a one-operand einsum that keeps its first letter first, without
 * that letter ("edf->efd" -> "df->fd"): the same map of one expert's rows */
static void strip_lead(const char *eq, char *out, size_t len)
{
	size_t o = 0;
	bool lead = true;
	for (const char *p = eq; *p && o + 1 < len; p++) {
		if (*p == ' ')
			continue;
		if (*p == ',' || *p == '-' || *p == '>') {
			out[o++] = *p;
			lead = *p != '-';
			continue;
		}
		if (lead)
			lead = false;
		else
			out[o++] = *p;
	}
	out[o] = 0;
}

/* A copy of node `from` of graph og (op and attributes) on operand a; in a
 * body, a slice's axis and an einsum's letters lose the expert axis. */
static moe_id redo_n(dp *c, const moe_graph *og, moe_id from, const moe_id *x, uint32_t nx)
{
	moe_id id = moe_node_new(c->d, (moe_op)N(og, from)->op, x, nx, c->loc);
	char eq[64];
	for (uint32_t i = 0; i < N(og, from)->nattrs; i++) {
		ir_attr at = N(og, from)->attrs[i]; /* copied: ir_attr_set may grow the node array */
		if (c->body && N(og, from)->op == MOE_OP_SLICE && !strcmp(at.key, "axis"))
			at.v.i--;
		if (c->body && N(og, from)->op == MOE_OP_EINSUM && !strcmp(at.key, "eq")) {
			strip_lead(at.v.s, eq, sizeof eq);
			at.v.s = eq;
		}
		ir_attr_set(c->d, N(c->d, id), &at);
	}
	return id;
}

static moe_id redo(dp *c, const moe_graph *og, moe_id from, moe_id a, moe_id b)
{
	moe_id x[2] = {a, b};
	return redo_n(c, og, from, x, b == MOE_NONE ? 1 : 2);
}

/* Does n keep the expert dimension first (a slice past axis 0, an einsum
 * permutation that leaves its first letter first)? */
bool pass_keeps_expert_axis(const ir_node *n)
{
	if (n->op == MOE_OP_SLICE)
		return ir_attr_int(n, "axis", 0) > 0;
	if (n->op != MOE_OP_EINSUM || n->nargs != 1)
		return false;
	ir_einsum e;
	char msg[8];
	return ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg) && e.out_rank >= 1 &&
	       e.in[0][0] == e.out[0];
}

/* The weight of each block. A quantized weight (dequant of packed values and
 * scales, possibly under slices and transposes that keep the expert axis
 * first, as fused checkpoint tensors are imported) is dequantized per block
 * from its gathered bytes and scales, and the slices and transposes are
 * applied to the [G, ...] result: no dequantized copy of the layer exists. */
static moe_id block_weight(dp *c, moe_id w)
{
	moe_id chain[8];
	int n = 0;
	moe_id d = w;
	const moe_graph *og = c->body ? c->outer : c->d; /* where w is */
	while (n < 8 && pass_keeps_expert_axis(N(og, d)))
		chain[n++] = d, d = N(og, d)->args[0];
	if (N(og, d)->op != MOE_OP_DEQUANT)
		return gather_blocks(c, w);
	moe_id x[4]; /* values, scales (and gptq's zero points and g_idx) of the blocks' experts */
	uint32_t nx = N(og, d)->nargs;
	for (uint32_t k = 0; k < nx; k++)
		x[k] = gather_blocks(c, N(og, d)->args[k]);
	moe_id id = redo_n(c, og, d, x, nx);
	if (!c->body) /* a body runs for blocks < nblocks only */
		moe_node_set_valid(c->d, id, c->nblocks);
	IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	while (n-- > 0) {
		id = redo(c, og, chain[n], id, MOE_NONE);
		IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	}
	return id;
}

/* Is w an int8 weight with int8 activations (dequant act="int8", W8A8)? */
static bool w8a8(const dp *c, moe_id w)
{
	const moe_graph *og = c->body ? c->outer : c->d;
	for (int n = 0; n < 8 && pass_keeps_expert_axis(N(og, w)); n++)
		w = N(og, w)->args[0];
	return N(og, w)->op == MOE_OP_DEQUANT && !strcmp(ir_attr_str(N(og, w), "act", "bf16"), "int8");
}

/* x [.., in] quantized per row to int8 and back, as W8A8's reference quantizes
 * a Linear's input per token (ir/quant.h): m = max(max|x|, 1e-10);
 * v = x * (127 / m); q = v rounded half away from zero; q * (m / 127), in f32. */
static moe_id act_int8(dp *c, moe_id x)
{
	moe_id xf = vcast(c, x, MOE_F32);
	moe_id m = ir_b_reduce(c->d, MOE_OP_REDUCE_MAX, v1(c, MOE_OP_ABS, xf), N(c->d, xf)->rank - 1, true, c->loc);
	m = v2(c, MOE_OP_MAX, m, cf(c, 1e-10));
	moe_id v = v2(c, MOE_OP_MUL, xf, v2(c, MOE_OP_DIV, cf(c, 127.0), m));
	moe_id t = vcast(c, vcast(c, v, MOE_I32), MOE_F32); /* toward zero, exact below 2^23 */
	moe_id half = v2(c, MOE_OP_GE, v1(c, MOE_OP_ABS, v2(c, MOE_OP_SUB, v, t)), cf(c, 0.5));
	moe_id away = v2(c, MOE_OP_SUB, v2(c, MOE_OP_MUL, vcast(c, v2(c, MOE_OP_GE, v, cf(c, 0.0)), MOE_F32), cf(c, 2.0)),
		cf(c, 1.0)); /* +1 or -1, the side of v */
	moe_id q = v2(c, MOE_OP_ADD, t, v2(c, MOE_OP_MUL, vcast(c, half, MOE_F32), away));
	return vcast(c, v2(c, MOE_OP_MUL, q, v2(c, MOE_OP_DIV, m, cf(c, 127.0))), (moe_dtype)N(c->d, x)->dtype);
}

/* [G, B, in] x W[G, out, in] (+ bias[G, out]) -> [G, B, out] over valid rows;
 * a W8A8 weight's input rows are quantized to int8 first. */
static moe_id project(dp *c, moe_id blocks, moe_id w, moe_id bias)
{
	if (w8a8(c, w))
		blocks = act_int8(c, blocks);
	moe_id wg = block_weight(c, w);
	moe_id x[2] = {blocks, wg};
	moe_id h = moe_node_new(c->d, MOE_OP_EINSUM, x, 2, c->loc);
	moe_node_set_str(c->d, h, "eq", c->body ? "bi,oi->bo" : "gbi,goi->gbo");
	moe_node_set_valid(c->d, h, c->rows);
	IR_ASSERT(ir_infer(c->d->ctx, c->d, h) == MOE_OK);
	if (bias != MOE_NONE) {
		moe_id bg = gather_blocks(c, bias);
		ir_node *bn = N(c->d, bg);
		h = v2(c, MOE_OP_ADD, h, c->body ? reshape(c, bg, 2, 1, bn->shape[0], 0)
						 : reshape(c, bg, 3, c->G, 1, bn->shape[1]));
	}
	return h;
}

static moe_id activation(dp *c, const ir_node *ex, moe_id gate, moe_id up)
{
	ir_act act = ir_node_act(ex);
	if (act == IR_ACT_NONE)
		return up;
	if (act == IR_ACT_RELU2) { /* not gated: max(u, 0)^2 in f32, rounded once */
		moe_id r = v2(c, MOE_OP_MAX, vcast(c, up, MOE_F32), cf(c, 0.0));
		return vcast(c, v2(c, MOE_OP_MUL, r, r), c->t);
	}
	moe_id g = vcast(c, gate, MOE_F32), u = vcast(c, up, MOE_F32), a;
	if (act == IR_ACT_SWIGLU) {
		a = v2(c, MOE_OP_MUL, g, v1(c, MOE_OP_SIGMOID, g));
	} else if (act == IR_ACT_GEGLU) {
		moe_id e = v1(c, MOE_OP_ERF, v2(c, MOE_OP_MUL, g, cf(c, SQRT1_2)));
		a = v2(c, MOE_OP_MUL, v2(c, MOE_OP_MUL, g, cf(c, 0.5)), v2(c, MOE_OP_ADD, e, cf(c, 1.0)));
	} else if (act == IR_ACT_GEGLU_TANH) {
		moe_id g3 = v2(c, MOE_OP_MUL, v2(c, MOE_OP_MUL, g, g), g);
		moe_id inner = v2(c, MOE_OP_ADD, g, v2(c, MOE_OP_MUL, g3, cf(c, 0.044715)));
		moe_id th = v1(c, MOE_OP_TANH, v2(c, MOE_OP_MUL, inner, cf(c, sqrt(2.0 / PI))));
		a = v2(c, MOE_OP_MUL, v2(c, MOE_OP_MUL, g, cf(c, 0.5)), v2(c, MOE_OP_ADD, th, cf(c, 1.0)));
	} else { /* gpt_oss */
		double alpha = ir_attr_float(ex, "alpha", 1.702), limit = ir_attr_float(ex, "limit", 7.0);
		g = v2(c, MOE_OP_MIN, g, cf(c, limit));
		u = v2(c, MOE_OP_MAX, v2(c, MOE_OP_MIN, u, cf(c, limit)), cf(c, -limit));
		moe_id glu = v2(c, MOE_OP_MUL, g, v1(c, MOE_OP_SIGMOID, v2(c, MOE_OP_MUL, g, cf(c, alpha))));
		return vcast(c, v2(c, MOE_OP_MUL, v2(c, MOE_OP_ADD, u, cf(c, 1.0)), glu), c->t);
	}
	return vcast(c, v2(c, MOE_OP_MUL, a, u), c->t);
}

/* The expert FFN of every block of blocks [G, B, D]. */
static moe_id expert_ffn(dp *c, const ir_node *ex, const moe_id *s, moe_id blocks)
{
	moe_id up = project(c, blocks, s[EXP_UP], s[EXP_B_UP]);
	moe_id gate = s[EXP_GATE] != MOE_NONE ? project(c, blocks, s[EXP_GATE], s[EXP_B_GATE]) : MOE_NONE;
	return project(c, activation(c, ex, gate, up), s[EXP_DOWN], s[EXP_B_DOWN]);
}

/* The expert FFN as a block_loop over blocks [G, B, D]: its body computes
 * one block, each weight an `e` input; the loop's result [G, B, D]. */
static moe_id expert_loop(dp *c, const ir_node *ex, const moe_id *s, moe_id blocks)
{
	dp b = *c;
	uint32_t bi;
	b.body = true;
	b.outer = c->d;
	b.nl = 0;
	b.kinds[0] = 0;
	b.d = ir_body_new(c->d, &bi);
	b.rows = ir_emit(b.d, MOE_OP_BLOCKARG, MOE_I32, 0, NULL, NULL, 0, c->loc);
	moe_node_set_str(b.d, b.rows, "role", "rows");
	moe_id y = expert_ffn(&b, ex, s, block_input(&b, blocks, IR_BK_BLOCK));
	moe_graph_add_output(b.d, y);
	moe_id args[IR_BL_NCTRL + IR_BODY_MAX_INPUTS] = {c->nblocks, c->bexp, c->rows};
	for (int k = 0; k < b.nl; k++)
		args[IR_BL_NCTRL + k] = b.lop[k];
	moe_id id = moe_node_new(c->d, MOE_OP_BLOCK_LOOP, args, (uint32_t)(IR_BL_NCTRL + b.nl), c->loc);
	moe_node_set_str(c->d, id, "kinds", b.kinds);
	N(c->d, id)->body = bi;
	IR_ASSERT(ir_infer(c->d->ctx, c->d, id) == MOE_OK);
	return id;
}

moe_id pass_expert_ffn(moe_graph *d, const ir_node *ex, const moe_id *s, const pass_blocks *b)
{
	dp c = {.d = d, .loc = ex->loc, .t = (moe_dtype)N(d, b->blocks)->dtype, .G = b->G, .B = b->B,
		.rows = b->rows, .nblocks = b->nblocks, .bexp = b->bexp};
	return expert_ffn(&c, ex, s, b->blocks);
}

moe_id pass_expert_loop(moe_graph *d, const ir_node *ex, const moe_id *s, const pass_blocks *b)
{
	dp c = {.d = d, .loc = ex->loc, .t = (moe_dtype)N(d, b->blocks)->dtype, .G = b->G, .B = b->B,
		.rows = b->rows, .nblocks = b->nblocks, .bexp = b->bexp};
	return expert_loop(&c, ex, s, b->blocks);
}

/* rank=pairs: the exclusive cumsum of the pairs' one-hot [n, E], from which
 * each pair's row within its expert is read. Sets *cnt. */
static moe_id pair_scan(dp *c, moe_id oh, moe_id *cnt)
{
	moe_graph *d = c->d;
	int64_t E = c->E;
	moe_id before = ir_b1(d, MOE_OP_CUMSUM, oh, c->loc);
	moe_node_set_int(d, before, "axis", 0);
	moe_node_set_int(d, before, "exclusive", 1);
	if (c->scan_counts && c->n > 0) { /* the scan's last row plus the last pair: no second pass over [n, E] */
		moe_id lb = ir_b_slice(d, before, 0, c->n - 1, c->n, c->loc), lo = ir_b_slice(d, oh, 0, c->n - 1, c->n, c->loc);
		*cnt = ir_b_reshape(d, b2(c, MOE_OP_ADD, lb, lo), 1, &E, c->loc);
	} else {
		*cnt = ir_b_reduce(d, MOE_OP_REDUCE_SUM, oh, 0, false, c->loc);
	}
	return before;
}

/* rank=tokens: pair (t, k)'s row within its expert e counts the pairs before
 * it with expert e: those of tokens t' < t (an exclusive cumsum over the T
 * tokens of each token's count of e, [T, E], K times fewer rows than the
 * pairs' one-hot) plus those of token t in slots k' < k (none when a token's
 * K experts differ, as top-k's do; counted all the same). The same integers
 * as the pairs' scan. Sets *cnt (tokens per expert); returns rank [n]. */
static moe_id token_rank(dp *c, moe_id idx, moe_id oh, moe_id *cnt)
{
	moe_graph *d = c->d;
	int64_t T = c->T, K = c->K, E = c->E, se[3] = {1, E, 1}, sk[3] = {1, K, K};
	moe_id hit = b2(c, MOE_OP_EQ, reshape(c, idx, 3, T, 1, K), ir_b_iota(d, 3, se, 1, c->loc)); /* [T, E, K] */
	moe_id per = ir_b_reduce(d, MOE_OP_REDUCE_SUM, ir_b_cast(d, hit, MOE_I32, c->loc), 2, false, c->loc); /* [T, E] */
	moe_id before = ir_b1(d, MOE_OP_CUMSUM, per, c->loc);
	moe_node_set_int(d, before, "axis", 0);
	moe_node_set_int(d, before, "exclusive", 1);
	if (c->scan_counts) { /* the scan's last row plus the last token's counts */
		moe_id lb = ir_b_slice(d, before, 0, T - 1, T, c->loc), lp = ir_b_slice(d, per, 0, T - 1, T, c->loc);
		*cnt = ir_b_reshape(d, b2(c, MOE_OP_ADD, lb, lp), 1, &E, c->loc);
	} else {
		*cnt = ir_b_reduce(d, MOE_OP_REDUCE_SUM, per, 0, false, c->loc);
	}
	/* before[t, e] at each pair's expert: sum_e oh[t, k, e] x before[t, e] */
	moe_id at = ir_b_reduce(d, MOE_OP_REDUCE_SUM,
		b2(c, MOE_OP_MUL, reshape(c, oh, 3, T, K, E), reshape(c, before, 3, T, 1, E)), 2, false, c->loc);
	/* earlier slots of the same token with the same expert */
	moe_id same = b2(c, MOE_OP_EQ, reshape(c, idx, 3, T, K, 1), reshape(c, idx, 3, T, 1, K));
	moe_id earlier = b2(c, MOE_OP_LT, ir_b_iota(d, 3, sk, 2, c->loc), ir_b_iota(d, 3, sk, 1, c->loc));
	moe_id dup = ir_b_reduce(d, MOE_OP_REDUCE_SUM, ir_b_cast(d, b2(c, MOE_OP_AND, same, earlier), MOE_I32, c->loc), 2,
		false, c->loc);
	return reshape(c, b2(c, MOE_OP_ADD, at, dup), 1, c->n, 0, 0);
}

/* The expert-sorted grid of section 5 (docs/semantics.md): one-hot counts,
 * block offsets, each pair's row and each block's expert and valid rows.
 * Sets nblocks, bexp and rows; returns pos. */
static moe_id index_grid(dp *c, moe_id idx)
{
	moe_graph *d = c->d;
	int64_t E = c->E, B = c->B, G = c->G;
	moe_id oh = moe_node_new(d, MOE_OP_ONE_HOT, &idx, 1, c->loc);
	moe_node_set_int(d, oh, "n", E);
	IR_ASSERT(ir_infer(d->ctx, d, oh) == MOE_OK);
	moe_id cnt, before = MOE_NONE, rank = MOE_NONE;
	if (c->tok_rank && c->n > 0)
		rank = token_rank(c, idx, oh, &cnt);
	else
		before = pair_scan(c, oh, &cnt);
	moe_id nb = b2(c, MOE_OP_DIV, b2(c, MOE_OP_ADD, cnt, ci(c, B - 1)), ci(c, B));
	moe_id boff = ir_b1(d, MOE_OP_CUMSUM, nb, c->loc);
	moe_node_set_int(d, boff, "axis", 0);
	moe_node_set_int(d, boff, "exclusive", 1);
	moe_id bend = b2(c, MOE_OP_ADD, boff, nb);
	c->nblocks = ir_b_reduce(d, MOE_OP_REDUCE_SUM, nb, 0, false, c->loc);
	moe_node_set_name(d, c->nblocks, "nblocks");
	if (rank == MOE_NONE)
		rank = ir_b_reduce(d, MOE_OP_REDUCE_SUM, b2(c, MOE_OP_MUL, before, oh), 1, false, c->loc);
	moe_id boffr = reshape(c, boff, 2, 1, E, 0), bendr = reshape(c, bend, 2, 1, E, 0);
	moe_id off = ir_b_reduce(d, MOE_OP_REDUCE_SUM, b2(c, MOE_OP_MUL, oh, boffr), 1, false, c->loc);
	moe_id pos, per = MOE_NONE; /* balance: rows per block of each expert, [1, E] */
	if (c->balance) {
		/* nb blocks of be = ceil(cnt / nb) rows each, the last fewer: with
		 * b = B, ceil(cnt / be) = nb (be <= B gives >=, be >= cnt / nb
		 * gives <=), so nb, boff and the grid bound stand; a pair's block
		 * is off + rank / be, its row rank mod be */
		moe_id nb1 = b2(c, MOE_OP_MAX, nb, ci(c, 1));
		moe_id be = b2(c, MOE_OP_DIV, b2(c, MOE_OP_ADD, cnt, b2(c, MOE_OP_SUB, nb1, ci(c, 1))), nb1);
		moe_node_set_name(d, be, "block_share");
		per = reshape(c, be, 2, 1, E, 0);
		/* at least 1: a serving pair past n has no expert (a zero one-hot row) */
		moe_id bp = b2(c, MOE_OP_MAX, ir_b_reduce(d, MOE_OP_REDUCE_SUM, b2(c, MOE_OP_MUL, oh, per), 1, false, c->loc),
			ci(c, 1));
		moe_id q = b2(c, MOE_OP_DIV, rank, bp);
		pos = b2(c, MOE_OP_ADD, b2(c, MOE_OP_MUL, b2(c, MOE_OP_ADD, off, q), ci(c, B)),
			b2(c, MOE_OP_SUB, rank, b2(c, MOE_OP_MUL, q, bp)));
	} else {
		pos = b2(c, MOE_OP_ADD, b2(c, MOE_OP_MUL, off, ci(c, B)), rank);
	}
	moe_node_set_name(d, pos, "pos");
	/* blocks: owner expert and valid rows */
	int64_t ge[2] = {G, E};
	moe_id gi = ir_b_iota(d, 2, ge, 0, c->loc), ei = ir_b_iota(d, 2, ge, 1, c->loc);
	moe_id owner = b2(c, MOE_OP_AND, b2(c, MOE_OP_LE, boffr, gi), b2(c, MOE_OP_LT, gi, bendr));
	moe_id fx[2] = {owner, ei};
	moe_id first = ir_b(d, MOE_OP_FILTER, fx, 2, c->loc); /* fill 0: blocks past nblocks get expert 0 */
	moe_id sl = ir_b_slice(d, first, 1, 0, 1, c->loc);
	c->bexp = ir_b_reshape(d, sl, 1, &G, c->loc);
	moe_node_set_name(d, c->bexp, "block_expert");
	moe_id rem = b2(c, MOE_OP_SUB, reshape(c, cnt, 2, 1, E, 0),
		b2(c, MOE_OP_MUL, b2(c, MOE_OP_SUB, gi, boffr), per != MOE_NONE ? per : ci(c, B)));
	moe_id rr = ir_b3(d, MOE_OP_SELECT, owner, b2(c, MOE_OP_MIN, rem, per != MOE_NONE ? per : ci(c, B)), ci(c, 0),
		c->loc);
	c->rows = ir_b_reduce(d, MOE_OP_REDUCE_SUM, rr, 1, false, c->loc);
	moe_node_set_name(d, c->rows, "block_rows");
	return pos;
}

/* Decode (T = 1, no serving count, G = K): the K pairs are K blocks of one
 * row each in slot order, so the top-k indices are the block experts and no
 * index generation runs: pos = k B, rows = 1, nblocks = K (constants). Each
 * block computes its own pair as the sorted grid would, and the combine sums
 * over k in slot order, so the result is the same. */
static moe_id decode_grid(dp *c, moe_id idx)
{
	moe_graph *d = c->d;
	int64_t G = c->G;
	c->nblocks = ir_emit(d, MOE_OP_CONST, MOE_I32, 0, NULL, NULL, 0, c->loc);
	moe_node_set_int(d, c->nblocks, "value", c->K);
	moe_node_set_name(d, c->nblocks, "nblocks");
	c->rows = ir_emit(d, MOE_OP_CONST, MOE_I32, 1, &G, NULL, 0, c->loc);
	moe_node_set_int(d, c->rows, "value", 1);
	moe_node_set_name(d, c->rows, "block_rows");
	c->bexp = idx;
	moe_node_set_name(d, c->bexp, "block_expert");
	moe_id pos;
	if (G > 1) {
		pos = b2(c, MOE_OP_MUL, ir_b_iota(d, 1, &G, 0, c->loc), ci(c, c->B));
	} else { /* K = 1: the one pair is row 0 */
		pos = ir_emit(d, MOE_OP_CONST, MOE_I32, 1, &G, NULL, 0, c->loc);
		moe_node_set_int(d, pos, "value", 0);
	}
	moe_node_set_name(d, pos, "pos");
	return pos;
}

/* The decode grid's pair rows for the combine: pair k is row 0 of block k,
 * a strided view of the block results ([G, B, D] -> [K, D]), no gather. */
static moe_id decode_rows(dp *c, moe_id out)
{
	return reshape(c, ir_b_slice(c->d, out, 1, 0, 1, c->loc), 2, c->K, c->D, 0);
}

/* The combine's sum over k as K elementwise adds in slot order, acc = 0 +
 * p_0, acc = acc + p_k (p_k = rows of slot k, times w_k unless the weight
 * was applied to the input): the same f32 additions in the same order as
 * the reduce, each reading slot k's rows [tc, D] with unit stride. A reduce
 * over K walks the rows of D elements across, one element per step (TCP
 * fetches D times slower than a contiguous stream), so for many rows the
 * K passes are faster (option combine=chain, from CHAIN_MIN elements). */
static moe_id combine_chain(dp *c, moe_id pr, moe_id cw, int64_t tc, moe_id rows)
{
	moe_graph *d = c->d;
	moe_id rk = reshape(c, pr, 3, tc, c->K, c->D), wk = MOE_NONE, acc = cf(c, 0.0);
	if (cw != MOE_NONE)
		wk = reshape(c, cw, 3, tc, c->K, 1);
	for (int64_t k = 0; k < c->K; k++) {
		moe_id p = ir_b_cast(d, reshape(c, ir_b_slice(d, rk, 1, k, k + 1, c->loc), 2, tc, c->D, 0), MOE_F32, c->loc);
		if (wk != MOE_NONE)
			p = masked(c, b2(c, MOE_OP_MUL, p,
				ir_b_cast(d, reshape(c, ir_b_slice(d, wk, 1, k, k + 1, c->loc), 2, tc, 1, 0), MOE_F32, c->loc)), rows);
		acc = masked(c, b2(c, MOE_OP_ADD, acc, p), rows); /* serving: the real tokens' rows */
	}
	return acc;
}

static moe_id lower_experts(dp *c, const ir_node *ex, const moe_id *s)
{
	moe_graph *d = c->d;
	int64_t n = c->n, E = c->E, B = c->B, G = c->G;
	/* routing indices */
	moe_id idx = ir_b_reshape(d, s[EXP_IDX], 1, &n, c->loc);
	moe_id pairs = MOE_NONE, live = MOE_NONE, nk = MOE_NONE;
	if (c->ntok != MOE_NONE) { /* pairs of padded tokens: index E, a zero one-hot row */
		pairs = ir_b_iota(d, 1, &n, 0, c->loc);
		nk = b2(c, MOE_OP_MUL, c->ntok, ci(c, c->K));
		live = b2(c, MOE_OP_LT, pairs, nk);
		idx = ir_b3(d, MOE_OP_SELECT, live, idx, ci(c, E), c->loc);
	}
	moe_id pos;
	c->dgrid = c->decode && c->T == 1 && c->ntok == MOE_NONE && c->G == n;
	if (c->dgrid)
		pos = decode_grid(c, idx);
	else
		pos = index_grid(c, idx);
	/* dispatch: scatter each pair's token row into the grid */
	/* a layer without n_tokens keeps its nodes and their order */
	moe_id tok = live == MOE_NONE ? b2(c, MOE_OP_DIV, ir_b_iota(d, 1, &n, 0, c->loc), ci(c, c->K))
				      : b2(c, MOE_OP_DIV, ir_b3(d, MOE_OP_SELECT, live, pairs, ci(c, 0), c->loc), ci(c, c->K));
	moe_id gx[2] = {s[EXP_X], tok};
	moe_id xp = ir_b(d, MOE_OP_GATHER, gx, 2, c->loc); /* [n, D] */
	bool on_input = !strcmp(ir_attr_str(ex, "weight_on", "output"), "input");
	moe_id wp = reshape(c, s[EXP_W], 2, n, 1, 0);
	moe_id spos = pos, swp = wp;
	if (live != MOE_NONE) { /* padded pairs: pair 0's place and weight */
		spos = ir_b3(d, MOE_OP_SELECT, live, pos, ir_b_slice(d, pos, 0, 0, 1, c->loc), c->loc);
		if (on_input)
			swp = ir_b3(d, MOE_OP_SELECT, reshape(c, live, 2, n, 1, 0), wp, ir_b_slice(d, wp, 0, 0, 1, c->loc),
				c->loc);
	}
	if (on_input)
		xp = ir_b_cast(d, b2(c, MOE_OP_MUL, ir_b_cast(d, xp, MOE_F32, c->loc), ir_b_cast(d, swp, MOE_F32, c->loc)),
			c->t, c->loc);
	int64_t gbd[2] = {G * B, c->D};
	moe_id zero = ir_emit(d, MOE_OP_CONST, c->t, 2, gbd, NULL, 0, c->loc);
	moe_node_set_float(d, zero, "value", 0.0);
	moe_id sx[3] = {zero, spos, xp};
	moe_id grid = ir_b(d, MOE_OP_SCATTER, sx, 3, c->loc);
	if (nk != MOE_NONE) { /* serving: the pairs of padded tokens are not scattered */
		moe_node_set_valid(d, grid, nk);
		IR_ASSERT(ir_infer(d->ctx, d, grid) == MOE_OK);
	}
	moe_id blocks = reshape(c, grid, 3, G, B, c->D);
	moe_node_set_name(d, blocks, "blocks");
	moe_id out = expert_loop(c, ex, s, blocks); /* [G, B, D] */
	/* combine: gather each pair's row back, weight, sum over K in f32; in
	 * chunks of tokens when the gathered rows would exceed c->chunk elements */
	moe_id flat = reshape(c, out, 2, G * B, c->D, 0);
	/* counted in 2-byte elements: an f32 layer's chunks hold half the rows */
	int64_t per = c->K * c->D * (moe_dtype_size(c->t) > 2 ? 2 : 1), fit = per > 0 && c->chunk / per > 0 ? c->chunk / per : 1;
	int64_t nch = c->T > 0 ? (c->T + fit - 1) / fit : 1;
	if (nch > 64)
		nch = 64; /* a node has at most 64 operands; the chunks then exceed the limit */
	int64_t step = c->T > 0 ? (c->T + nch - 1) / nch : 1;
	/* option tail=N: the last of two or more chunks leaves its last 1/N
	 * (whole tokens) to a chunk of its own, so that the output part copied
	 * after the last chunk's sums is small (docs/tcp-isa.md 7.3) */
	int64_t tail = nch >= 2 && nch < 64 && c->tail > 1 && step / c->tail >= 1 ? step / c->tail : 0;
	moe_id parts[64];
	uint32_t np = 0;
	int64_t t0 = 0;
	do { /* once at least: T = 0 is one empty chunk */
		int64_t t1 = t0 + step < c->T ? t0 + step : c->T;
		if (tail > 0 && t1 == c->T && t1 - t0 > tail)
			t1 = c->T - tail;
		int64_t tc = t1 - t0;
		bool all = tc == c->T;
		moe_id cpos = all ? pos : ir_b_slice(d, pos, 0, t0 * c->K, t1 * c->K, c->loc);
		moe_id cx[2] = {flat, cpos};
		moe_id cnk = nk == MOE_NONE ? MOE_NONE : b2(c, MOE_OP_SUB, nk, ci(c, t0 * c->K)); /* real pairs here */
		/* serving: the gather is masked by the real pairs, the sums by the
		 * real tokens (rows); the cast stays unmasked (a view on TCP) */
		moe_id rows = c->ntok == MOE_NONE ? MOE_NONE : b2(c, MOE_OP_SUB, c->ntok, ci(c, t0));
		moe_id pr = c->dgrid ? decode_rows(c, out) : masked(c, ir_b(d, MOE_OP_GATHER, cx, 2, c->loc), cnk);
		moe_id cw = on_input ? MOE_NONE : all ? wp : ir_b_slice(d, wp, 0, t0 * c->K, t1 * c->K, c->loc);
		moe_id yc;
		if (c->chain && c->K > 1 && tc * c->D >= CHAIN_MIN) {
			yc = combine_chain(c, pr, cw, tc, rows);
		} else {
			moe_id yp = ir_b_cast(d, pr, MOE_F32, c->loc);
			if (cw != MOE_NONE)
				yp = b2(c, MOE_OP_MUL, yp, ir_b_cast(d, cw, MOE_F32, c->loc));
			yc = ir_b_reduce(d, MOE_OP_REDUCE_SUM, reshape(c, yp, 3, tc, c->K, c->D), 1, false, c->loc);
		}
		if (c->ntok == MOE_NONE) {
			parts[np++] = ir_b_cast(d, yc, c->t, c->loc); /* rounded per chunk: the parts stay small */
		} else { /* a cast even to f32: rows of padded tokens are zero */
			yc = masked(c, yc, rows); /* the sums of padded tokens are not computed */
			moe_id y = moe_node_new(d, MOE_OP_CAST, &yc, 1, c->loc);
			moe_node_set_str(d, y, "to", moe_dtype_name(c->t));
			IR_ASSERT(ir_infer(d->ctx, d, y) == MOE_OK);
			parts[np++] = masked(c, y, rows);
		}
		t0 = t1;
	} while (t0 < c->T);
	return np == 1 ? parts[0] : ir_b_concat(d, parts, np, 0, c->loc);
}

/* A serving layer's token rows: per node its kind, row offset and real-row
 * count (passes/token_rows.c). */
typedef struct srv {
	uint8_t *kind;
	int64_t *off;
	moe_id *count;
	uint32_t n;
} srv;

static void srv_free(moe_ctx *ctx, srv *v)
{
	if (!v)
		return;
	ctx_free(ctx, v->kind, v->n);
	ctx_free(ctx, v->off, v->n * sizeof *v->off);
	ctx_free(ctx, v->count, v->n * sizeof *v->count);
	ctx_free(ctx, v, sizeof *v);
}

/* The token rows of a serving layer's nodes (T from its experts), or NULL
 * after an error. */
static srv *serving_rows(moe_ctx *ctx, moe_graph *g, moe_id ntok)
{
	const ir_node *t = N(g, ntok);
	int64_t T = -1;
	for (moe_id i = 0; i < g->nnodes && T < 0; i++)
		if (N(g, i)->op == MOE_OP_EXPERTS)
			T = N(g, N(g, i)->args[EXP_X])->shape[0];
	if (t->dtype != MOE_I32 || t->rank != 0 || T < 0) {
		moe_diag(ctx, MOE_DIAG_ERROR, t->loc,
			T < 0 ? "input '%s' (serving) needs a layer with experts(...)" : "input '%s' must be an i32 scalar: i32[]",
			MOE_TOKENS_INPUT);
		return NULL;
	}
	srv *v = ctx_alloc(ctx, sizeof *v);
	v->n = g->nnodes;
	v->kind = ctx_alloc(ctx, v->n);
	v->off = ctx_alloc(ctx, v->n * sizeof *v->off);
	v->count = ctx_alloc(ctx, v->n * sizeof *v->count);
	if (!token_rows_classify(ctx, g, T, ntok, v->kind, v->off)) {
		srv_free(ctx, v);
		return NULL;
	}
	return v;
}

PASS(pass_blockwise_dispatch)
{
	const char *grid = moe_pass_opt(opts, "grid");
	if (grid && strcmp(grid, "tight") && strcmp(grid, "seed") && strcmp(grid, "vllm")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "blockwise-dispatch: grid must be tight, seed or vllm, got '%s'",
			grid);
		return MOE_ERR_INVALID;
	}
	int64_t limit; /* gathered elements per combine chunk */
	int64_t climit = (int64_t)1 << 25, cap = ir_graph_attr_int(g, IR_GK_COMBINE_CHUNK, 0);
	ir_graph_drop_attr(g, IR_GK_COMBINE_CHUNK); /* an input of this pass only */
	if (cap > 0 && cap < climit)
		climit = cap; /* a target's bound lowers the default */
	if (!pass_opt_count(ctx, opts, "blockwise-dispatch", "chunk", climit, &limit))
		return MOE_ERR_INVALID;
	const char *comb = moe_pass_opt(opts, "combine");
	if (comb && strcmp(comb, "reduce") && strcmp(comb, "chain")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "blockwise-dispatch: combine must be reduce or chain, got '%s'",
			comb);
		return MOE_ERR_INVALID;
	}
	const char *cnts = moe_pass_opt(opts, "counts");
	if (cnts && strcmp(cnts, "reduce") && strcmp(cnts, "scan")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "blockwise-dispatch: counts must be reduce or scan, got '%s'",
			cnts);
		return MOE_ERR_INVALID;
	}
	const char *rk = moe_pass_opt(opts, "rank");
	if (rk && strcmp(rk, "pairs") && strcmp(rk, "tokens")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "blockwise-dispatch: rank must be pairs or tokens, got '%s'", rk);
		return MOE_ERR_INVALID;
	}
	int64_t tail;
	if (!pass_opt_count(ctx, opts, "blockwise-dispatch", "tail", 0, &tail))
		return MOE_ERR_INVALID;
	const char *dec = moe_pass_opt(opts, "decode");
	if (dec && strcmp(dec, "0") && strcmp(dec, "1")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "blockwise-dispatch: decode must be 0 or 1, got '%s'", dec);
		return MOE_ERR_INVALID;
	}
	const char *bal = moe_pass_opt(opts, "balance");
	if (bal && strcmp(bal, "0") && strcmp(bal, "1")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "blockwise-dispatch: balance must be 0 or 1, got '%s'", bal);
		return MOE_ERR_INVALID;
	}
	bool balance = bal ? *bal == '1' : ir_graph_attr_int(g, IR_GK_BLOCK_BALANCE, 0) > 0;
	ir_graph_drop_attr(g, IR_GK_BLOCK_BALANCE); /* an input of this pass only */
	moe_id ntok = token_count_input(g);
	srv *sv = NULL;
	if (ntok != MOE_NONE && !(sv = serving_rows(ctx, g, ntok)))
		return MOE_ERR_INVALID;
	rebuild rb;
	rebuild_begin(&rb, g);
	if (sv) { /* first: every node of the dispatch may read it */
		rebuild_copy(&rb, ntok);
		token_rows_counts(rb.dst, g, sv->kind, sv->off, rb.map[ntok], sv->count);
	}
	int nexperts = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		ir_node *n = N(g, i);
		if (i == ntok)
			continue;
		if (n->op != MOE_OP_EXPERTS) {
			rebuild_copy(&rb, i);
			continue;
		}
		moe_id s[EXP_NSLOTS];
		for (int k = 0; k < EXP_NSLOTS; k++)
			s[k] = n->args[k] == MOE_NONE ? MOE_NONE : rb.map[n->args[k]];
		ir_node *x = N(g, n->args[EXP_X]), *up = N(g, n->args[EXP_UP]);
		dp c = {.d = rb.dst, .loc = n->loc, .t = (moe_dtype)x->dtype, .chunk = limit, .decode = dec && *dec == '1',
			.chain = comb && !strcmp(comb, "chain"), .scan_counts = cnts && !strcmp(cnts, "scan"),
			.tok_rank = rk && !strcmp(rk, "tokens"), .tail = tail, .balance = balance,
			.ntok = ntok == MOE_NONE ? MOE_NONE : rb.map[ntok]};
		c.T = x->shape[0];
		c.D = x->shape[1];
		c.K = N(g, n->args[EXP_IDX])->shape[1];
		c.E = up->shape[0];
		c.F = up->shape[1];
		c.B = ir_attr_int(n, "block", 1);
		c.n = c.T * c.K;
		c.G = !grid || !strcmp(grid, "tight") ? moe_grid_blocks_max(c.T, c.K, c.E, c.B)
			: !strcmp(grid, "seed")        ? moe_grid_blocks_seed(c.T, c.K, c.E, c.B)
						       : moe_grid_blocks_vllm(c.T, c.K, c.E, c.B);
		int64_t cells;
		if (!ir_mul_ov(c.G, c.B, &cells) || !ir_mul_ov(cells, c.D, &cells) || c.n > MOE_MAX_DIM ||
			!ir_mul_ov(c.n, c.E, &cells)) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "blockwise-dispatch: the block grid of this layer is too large");
			rebuild_abort(&rb);
			srv_free(ctx, sv);
			return MOE_ERR_INVALID;
		}
		moe_id y = lower_experts(&c, n, s);
		if (n->name)
			moe_node_set_name(rb.dst, y, n->name);
		rb.map[i] = y;
		if (nexperts++ == 0) {
			ir_graph_set_attr_int(rb.dst, IR_GK_MOE_TOKENS, c.T);
			ir_graph_set_attr_int(rb.dst, IR_GK_MOE_K, c.K);
			ir_graph_set_attr_int(rb.dst, IR_GK_MOE_EXPERTS, c.E);
			ir_graph_set_attr_int(rb.dst, IR_GK_MOE_BLOCK, c.B);
			ir_graph_set_attr_int(rb.dst, IR_GK_MOE_ROW_BYTES, c.D * (int64_t)moe_dtype_size(c.t));
			ir_graph_set_attr_int(rb.dst, IR_GK_GRID_BLOCKS, c.G);
			if (ntok != MOE_NONE)
				ir_graph_set_attr_int(rb.dst, IR_GK_SERVING_TOKENS_MAX, c.T);
		}
	}
	if (sv) {
		token_rows_mask(rb.dst, g, sv->kind, rb.map, sv->count);
		srv_free(ctx, sv);
	}
	rebuild_end(&rb);
	return MOE_OK;
}
