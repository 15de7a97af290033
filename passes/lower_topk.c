/* passes/lower_topk.c: topk -> branchless pack / rank / select form.
 *
 * For scores x[..., E] every element gets a 32-bit integer key whose signed
 * order is the required score order, ties broken by index:
 *   exact     over the f32 score with every NaN -> +qNaN (ranks above +inf),
 *             key = bits(x) when bits(x) >= 0, else INT_MIN - bits(x) (the
 *             negated magnitude, so -0 and +0 share the key 0); equal keys
 *             are ordered by index (lower index first): the mask j < i is a
 *             constant computed before the compares (on TCP while x and the
 *             router weights are fetched), so the equality and the and are
 *             one vector pass, the greater-than, the or and the sum another.
 *   packed16  key = bf16 bits << 16 | (E-1-e) (NaN -> +qNaN) for a clear
 *             sign bit, else INT_MIN + (E-1-e) - (bf16 bits << 16) (the
 *             negated magnitude in the high half: -0 keys as +0); the index
 *             lives in the key, so keys are unique (needs E <= 65536). Built
 *             as two selects, each of a compare and of one more step of the
 *             compared value (packed_key), which tcp-plan-fusion makes one
 *             TCP vector pass each.
 * rank_i = #{j : key_j beats key_i} by an E x E compare and a reduce_sum;
 * output slot k holds the element of rank k (torch.topk(sorted=True) order),
 * found by comparing rank with k and a 0/1 product summed over the candidates
 * (one candidate matches, so the sum is its value); the index is selected
 * the same way, as the sum of e (in both modes). No data-dependent control
 * flow remains.
 *
 * The compare matrix has rows x E x E elements (DeepSeek-V3 at T = 4096:
 * 2^28). When that exceeds the `chunk` option (default 2^25 elements), the
 * rows are split along the leading axis into equal chunks that each stay
 * under it, lowered one by one and concatenated, so no buffer holds the
 * whole matrix. */
#include <math.h>
#include <string.h>

#include "passes/pass.h"

#define MAX_PARTS_ITER 64 /* select=iter: K at most (a concat's operands) */

typedef struct tk {
	moe_graph *d;
	moe_loc loc;
	int r;                     /* rank of x */
	int64_t sh[MOE_MAX_RANK]; /* x shape */
	int64_t E, K;
	bool iter; /* select=iter (lower_iter) */
} tk;

static moe_id ci(tk *c, int64_t v)
{
	return ir_b_const(c->d, MOE_I32, (double)v, c->loc);
}

/* x with a 1 inserted at position `at` (counted from the front). */
static moe_id unsqueeze(tk *c, moe_id x, int at)
{
	ir_node *n = N(c->d, x);
	int64_t s[MOE_MAX_RANK];
	int r = 0;
	for (int i = 0; i <= n->rank; i++) {
		if (i == at)
			s[r++] = 1;
		if (i < n->rank)
			s[r++] = n->shape[i];
	}
	return ir_b_reshape(c->d, x, r, s, c->loc);
}

/* 1-D iota of length n reshaped so its axis lands at `axis` of a rank-`rank` shape of ones. */
static moe_id iota_at(tk *c, int64_t n, int rank, int axis)
{
	int64_t s[MOE_MAX_RANK];
	for (int i = 0; i < rank; i++)
		s[i] = 1;
	s[axis] = n;
	return ir_b_iota(c->d, rank, s, axis, c->loc);
}

/* A score whose values other than NaN all have a clear sign bit: a softmax
 * (exp(x - max) / sum: +0 .. 1) or a sigmoid (1 / (1 + exp(-x)): +0 .. 1),
 * through casts between float types (which keep the sign). */
static bool nonneg_score(const moe_graph *d, moe_id x)
{
	while (N(d, x)->op == MOE_OP_CAST && moe_dtype_is_float((moe_dtype)N(d, x)->dtype) &&
		moe_dtype_is_float((moe_dtype)N(d, N(d, x)->args[0])->dtype))
		x = N(d, x)->args[0];
	return N(d, x)->op == MOE_OP_SOFTMAX || N(d, x)->op == MOE_OP_SIGMOID;
}

static moe_id exact_key(tk *c, moe_id x)
{
	moe_graph *d = c->d;
	moe_dtype t = (moe_dtype)N(d, x)->dtype;
	if (t == MOE_I32)
		return x; /* integer scores are their own key */
	moe_id f = ir_b_cast(d, x, MOE_F32, c->loc);
	moe_id isnan_ = ir_b2(d, MOE_OP_NE, f, f, c->loc);
	moe_id q = ir_b3(d, MOE_OP_SELECT, isnan_, ir_b_const(d, MOE_F32, NAN, c->loc), f, c->loc);
	moe_id bits = ir_b_bitcast(d, q, MOE_I32, c->loc);
	if (nonneg_score(d, x))
		return bits; /* no negative bits: the key is the bits (one vector pass on TCP, not three) */
	/* sign-magnitude to two's complement: INT_MIN - bits = -(bits & 0x7fffffff)
	 * for a negative bits (no overflow there; the other lanes are not taken) */
	moe_id negm = ir_b2(d, MOE_OP_SUB, ci(c, INT32_MIN), bits, c->loc);
	moe_id neg = ir_b2(d, MOE_OP_LT, bits, ci(c, 0), c->loc);
	return ir_b3(d, MOE_OP_SELECT, neg, negm, bits, c->loc);
}

/* packed16's key, in two selects each of one operand's compare and of
 * another step of that operand (one TCP vector pass each: tag, then logic
 * and fxp steps, then the merge). hb = b's bits widened (low 16 bits 0) and
 * lo = E-1-e < 2^16, so hb | lo = hb + lo = (hb | (E-1)) - e; a NaN keys as
 * +qNaN | lo = 0x7fc00000 + lo. A negative packed word p = hb + lo (-0
 * included) keys as INT_MIN + lo - hb = (INT_MIN + 2 lo) - p: below every
 * other key, decreasing with the magnitude, -0's equal to +0's (0 | lo); the
 * other lanes' wrapped differences are not taken. */
static moe_id packed_key(tk *c, moe_id x)
{
	moe_graph *d = c->d;
	moe_id b = ir_b_cast(d, x, MOE_BF16, c->loc);
	moe_id hb = ir_b_bitcast(d, ir_b_cast(d, b, MOE_F32, c->loc), MOE_I32, c->loc);
	moe_id e = iota_at(c, c->E, c->r, c->r - 1);
	moe_id nanlo = ir_b2(d, MOE_OP_SUB, ci(c, 0x7fc00000 + c->E - 1), e, c->loc);
	moe_id fin = ir_b2(d, MOE_OP_SUB, ir_b2(d, MOE_OP_OR, hb, ci(c, c->E - 1), c->loc), e, c->loc);
	moe_id packed = ir_b3(d, MOE_OP_SELECT, ir_b2(d, MOE_OP_NE, b, b, c->loc), nanlo, fin, c->loc);
	moe_id neg2 = ir_b2(d, MOE_OP_SUB, ci(c, (int64_t)INT32_MIN + 2 * (c->E - 1)),
		ir_b2(d, MOE_OP_SHL, e, ci(c, 1), c->loc), c->loc);
	moe_id negkey = ir_b2(d, MOE_OP_SUB, neg2, packed, c->loc);
	moe_id neg = ir_b2(d, MOE_OP_LT, packed, ci(c, 0), c->loc);
	return ir_b3(d, MOE_OP_SELECT, neg, negkey, packed, c->loc);
}

/* The values of the K slots, take_along(x, topk(x)) along the last axis, as
 * sum_e (idx_k == e) x bits(x_e) in i32 (one candidate matches, so the sum is
 * its bits): one vector pass per chunk on TCP where a take_along is a DMA
 * gather of one element per index. bits: x's bits as i32 (pick_bits). */
static moe_id pick_values(tk *c, moe_id idx, moe_id bits)
{
	moe_graph *d = c->d;
	moe_id hit = ir_b_cast(d, ir_b2(d, MOE_OP_EQ, unsqueeze(c, idx, c->r), iota_at(c, c->E, c->r + 1, c->r), c->loc),
		MOE_I32, c->loc); /* [..., K, E] */
	moe_id sel = ir_b2(d, MOE_OP_MUL, hit, unsqueeze(c, bits, c->r - 1), c->loc);
	return ir_b_reduce(d, MOE_OP_REDUCE_SUM, sel, -1, false, c->loc); /* [..., K] */
}

/* x's bits as i32 (a bf16 x widened to f32 first: exact), and back. */
static moe_id pick_bits(tk *c, moe_id x)
{
	moe_graph *d = c->d;
	return N(d, x)->dtype == MOE_I32 ? x : ir_b_bitcast(d, ir_b_cast(d, x, MOE_F32, c->loc), MOE_I32, c->loc);
}

static moe_id unpick_bits(tk *c, moe_id v, moe_dtype t)
{
	moe_graph *d = c->d;
	return t == MOE_I32 ? v : ir_b_cast(d, ir_b_bitcast(d, v, MOE_F32, c->loc), t, c->loc);
}

/* The ranks of keys that are never negative (a softmax's or a sigmoid's
 * NaN-fixed bits: 0 .. 0x7fc00000), as f32 integers, in one reduce whose
 * elementwise chain is one vector pass on TCP (x.sub, cvt.itof, f.mul, f.add,
 * f.sigmoid, r.fsum) where the compare form takes two (the equality and the
 * tie mask's and, then the greater-than, the or and the sum: two tag steps).
 * j beats i when d = key_j - key_i > 0 (no overflow: both keys are in
 * [0, 2^31)), or d = 0 and j < i. With t = +2^62 for j < i and -2^62 else (a
 * constant built before, from iotas), s = float(d) x 2^64 + t has the sign of d
 * when d != 0 (|d| >= 1, so |float(d) x 2^64| >= 2^64 > 2^62, and at most
 * 2^95: finite) and t's sign when d = 0; sigmoid(s) is then exactly 1 or 0
 * (|s| >= 3 x 2^62: exp(-|s|) is 0 in double, exp(|s|) infinite), and the sum
 * of E such terms (E < 2^24) is the exact count. */
static moe_id step_rank(tk *c, moe_id kj, moe_id ki)
{
	moe_graph *d = c->d;
	int r = c->r;
	moe_id jlt = ir_b2(d, MOE_OP_LT, iota_at(c, c->E, r + 1, r), iota_at(c, c->E, r + 1, r - 1), c->loc);
	moe_id tie = ir_b3(d, MOE_OP_SELECT, jlt, ir_b_const(d, MOE_F32, 0x1p62, c->loc),
		ir_b_const(d, MOE_F32, -0x1p62, c->loc), c->loc);
	moe_id diff = ir_b_cast(d, ir_b2(d, MOE_OP_SUB, kj, ki, c->loc), MOE_F32, c->loc);
	moe_id s = ir_b2(d, MOE_OP_ADD, ir_b2(d, MOE_OP_MUL, diff, ir_b_const(d, MOE_F32, 0x1p64, c->loc), c->loc), tie,
		c->loc);
	return ir_b_reduce(d, MOE_OP_REDUCE_SUM, ir_b1(d, MOE_OP_SIGMOID, s, c->loc), -1, false, c->loc);
}

static moe_id lower_one(tk *c, moe_id x, bool packed, moe_id bits, moe_id *vals)
{
	moe_graph *d = c->d;
	int r = c->r;
	moe_id key = packed ? packed_key(c, x) : exact_key(c, x);
	/* ki[..., i, 1] against kj[..., 1, j] */
	moe_id ki = unsqueeze(c, key, r), kj = unsqueeze(c, key, r - 1);
	moe_id rank = MOE_NONE, kk = iota_at(c, c->K, r + 1, r);
	if (!packed && nonneg_score(d, x)) {
		rank = step_rank(c, kj, ki);
		kk = ir_b_cast(d, kk, MOE_F32, c->loc); /* the ranks are f32 integers */
	} else {
		moe_id beats = MOE_NONE, jlt = MOE_NONE;
		if (!packed) /* before the compares: a constant, its own pass, so the equality chains into the and */
			jlt = ir_b2(d, MOE_OP_LT, iota_at(c, c->E, r + 1, r), iota_at(c, c->E, r + 1, r - 1), c->loc);
		beats = ir_b2(d, MOE_OP_GT, kj, ki, c->loc);
		if (!packed) {
			moe_id eq = ir_b2(d, MOE_OP_EQ, kj, ki, c->loc);
			beats = ir_b2(d, MOE_OP_OR, beats, ir_b2(d, MOE_OP_AND, eq, jlt, c->loc), c->loc);
		}
		rank = ir_b_reduce(d, MOE_OP_REDUCE_SUM, beats, -1, false, c->loc); /* i32 [..., E] */
	}
	/* slot k takes the element of rank k: is[..., e, k] = rank[..., e] == k */
	moe_id is = ir_b2(d, MOE_OP_EQ, unsqueeze(c, rank, r), kk, c->loc);
	/* the select-sum as a 0/1 product: compare, multiply and sum are one
	 * vector pass in TCP's stage order (a select's merge comes after the sum) */
	moe_id isi = ir_b_cast(d, is, MOE_I32, c->loc);
	/* the slot's index as the select-sum of e itself (packed16's keys hold
	 * E-1-e too, but unpacking the selected key takes one more pass) */
	moe_id e = iota_at(c, c->E, r + 1, r - 1);
	moe_id sel = ir_b2(d, MOE_OP_MUL, isi, e, c->loc);
	moe_id ix = ir_b_reduce(d, MOE_OP_REDUCE_SUM, sel, -2, false, c->loc);
	if (vals)
		*vals = pick_values(c, ix, bits);
	return ix;
}

/* select=iter: K rounds over the keys [..., E] instead of the E x E rank
 * compare. Round k takes the largest key m (reduce_max) and, among the
 * elements holding it, the lowest index (reduce_min of e + ((key != m) << s),
 * 2^s >= E); that element's key becomes INT_MIN, which no key reaches (the
 * least key, -inf's, is INT_MIN + 2^23; packed16's keys are above INT_MIN
 * too, as every element holds its own index). Slot k is the element of
 * rank k: the largest remaining key, ties by lower index, as the rank
 * compare orders them. 3 K passes of E elements per row where the rank
 * compare has 2 of E x E (see lower-topk's `select` option). */
static moe_id lower_iter(tk *c, moe_id x, bool packed, moe_id bits, moe_id *vals)
{
	moe_graph *d = c->d;
	int r = c->r;
	moe_id key = packed ? packed_key(c, x) : exact_key(c, x), e = iota_at(c, c->E, r, r - 1);
	int sh = 0;
	while (((int64_t)1 << sh) < c->E)
		sh++;
	moe_id parts[MAX_PARTS_ITER];
	for (int64_t k = 0; k < c->K; k++) {
		moe_id m = ir_b_reduce(d, MOE_OP_REDUCE_MAX, key, -1, true, c->loc); /* [..., 1] */
		moe_id off = ir_b2(d, MOE_OP_SHL, ir_b_cast(d, ir_b2(d, MOE_OP_NE, key, m, c->loc), MOE_I32, c->loc),
			ci(c, sh), c->loc);
		moe_id ik = ir_b_reduce(d, MOE_OP_REDUCE_MIN, ir_b2(d, MOE_OP_ADD, off, e, c->loc), -1, true, c->loc);
		parts[k] = ik;
		if (k + 1 < c->K)
			key = ir_b3(d, MOE_OP_SELECT, ir_b2(d, MOE_OP_EQ, e, ik, c->loc), ci(c, INT32_MIN), key, c->loc);
	}
	moe_id ix = c->K == 1 ? parts[0] : ir_b_concat(d, parts, (uint32_t)c->K, r - 1, c->loc);
	if (vals)
		*vals = pick_values(c, ix, bits);
	return ix;
}

/* take_along(y, topk(x)) with y another f32, bf16 or i32 value of x's
 * shape (the pick needs one candidate per index: top-k's are in range). */
static bool pick_other(const moe_graph *g, const ir_node *n)
{
	const ir_node *y = N(g, n->args[0]), *t = N(g, n->args[1]), *x = N(g, t->args[0]);
	if (n->args[0] == t->args[0] || y->rank != x->rank || y->rank + 1 > MOE_MAX_RANK ||
		(y->dtype != MOE_F32 && y->dtype != MOE_BF16 && y->dtype != MOE_I32))
		return false;
	for (int d = 0; d < y->rank; d++)
		if (y->shape[d] != x->shape[d])
			return false;
	return true;
}

#define MAX_PARTS 64

/* select=auto: the K rounds when they move fewer lane elements than the rank
 * compare, counting each vector pass's fixed cost (issue and fill/drain,
 * about 132 cycles on TCP) as 132 x 512 elements (TCP's 512 slices) and a
 * reduce's elements twice (4 per cycle where the others go 8): per row the
 * rank compare is E x E x 3 (equality, then greater-than with the sum), the
 * rounds 5 K x E (max, index min), over 3 and 3 K passes; the rank of a
 * softmax's or a sigmoid's key (step_rank) is E x E x 2 (one float pass) over
 * 2 passes. */
static bool iter_cheaper(const tk *c, bool step)
{
	int64_t rows = 1;
	for (int i = 0; i + 1 < c->r; i++)
		rows *= c->sh[i];
	double fixed = 132.0 * 512.0;
	double rank = (double)rows * (double)c->E * (double)c->E * (step ? 2.0 : 3.0) + (step ? 2.0 : 3.0) * fixed;
	double iter = (double)rows * (double)c->E * 5.0 * (double)c->K + 3.0 * (double)c->K * fixed;
	return iter < rank;
}

/* lower_one over chunks of the leading axis, each with at most `limit`
 * compare elements. */
static moe_id lower_chunked(tk *c, moe_id x, bool packed, int64_t limit, moe_id *vals)
{
	int64_t rows = c->sh[0], per = c->E; /* compare elements per leading row */
	for (int i = 1; i < c->r; i++)
		per *= c->sh[i];
	moe_dtype t = (moe_dtype)N(c->d, x)->dtype;
	moe_id bits = vals ? pick_bits(c, x) : MOE_NONE, out;
	if (c->iter) {
		out = lower_iter(c, x, packed, bits, vals);
		if (vals)
			*vals = unpick_bits(c, *vals, t);
		return out;
	}
	if (c->r < 2 || rows <= 0 || per <= 0 || rows <= (limit / per > 0 ? limit / per : 1)) {
		out = lower_one(c, x, packed, bits, vals);
		if (vals)
			*vals = unpick_bits(c, *vals, t);
		return out;
	}
	int64_t fit = limit / per > 0 ? limit / per : 1;
	int64_t n = (rows + fit - 1) / fit;
	if (n > MAX_PARTS)
		n = MAX_PARTS; /* a node has at most 64 operands; the chunks then exceed the limit */
	int64_t step = (rows + n - 1) / n;
	moe_id parts[MAX_PARTS], vparts[MAX_PARTS];
	uint32_t np = 0;
	for (int64_t a = 0; a < rows && np < MAX_PARTS; a += step) {
		int64_t b = a + step < rows ? a + step : rows;
		tk sub = *c;
		sub.sh[0] = b - a;
		np++;
		parts[np - 1] = lower_one(&sub, ir_b_slice(c->d, x, 0, a, b, c->loc), packed,
			vals ? ir_b_slice(c->d, bits, 0, a, b, c->loc) : MOE_NONE, vals ? &vparts[np - 1] : NULL);
	}
	if (vals)
		*vals = unpick_bits(c, ir_b_concat(c->d, vparts, np, 0, c->loc), t);
	return ir_b_concat(c->d, parts, np, 0, c->loc);
}

PASS(pass_lower_topk)
{
	const char *mode = moe_pass_opt(opts, "mode");
	if (mode && strcmp(mode, "exact") && strcmp(mode, "packed16")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "lower-topk: mode must be exact or packed16, got '%s'", mode);
		return MOE_ERR_INVALID;
	}
	int64_t limit; /* compare elements per chunk */
	if (!pass_opt_count(ctx, opts, "lower-topk", "chunk", (int64_t)1 << 25, &limit))
		return MOE_ERR_INVALID;
	const char *sel = moe_pass_opt(opts, "select");
	if (sel && strcmp(sel, "rank") && strcmp(sel, "iter") && strcmp(sel, "auto")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "lower-topk: select must be rank, iter or auto, got '%s'", sel);
		return MOE_ERR_INVALID;
	}
	if (sel && !strcmp(sel, "auto"))
		sel = NULL;
	rebuild rb;
	moe_id *vals = ctx_alloc(ctx, (g->nnodes + 1) * sizeof *vals); /* a topk's slot values, when read */
	if (!vals)
		return MOE_ERR_NOMEM;
	for (moe_id i = 0; i < g->nnodes; i++)
		vals[i] = MOE_NONE;
	bool want = false;
	rebuild_begin(&rb, g);
	for (moe_id i = 0; i < g->nnodes; i++) {
		ir_node *n = N(g, i);
		if (n->op == MOE_OP_TAKE_ALONG && vals[n->args[1]] != MOE_NONE && n->args[0] == N(g, n->args[1])->args[0] &&
			ir_norm_axis((int)ir_attr_int(n, "axis", -1), n->rank) == n->rank - 1) {
			rb.map[i] = vals[n->args[1]]; /* the slot pick's values (pick_values) */
			if (n->name)
				moe_node_set_name(rb.dst, vals[n->args[1]], n->name);
			continue;
		}
		if (n->op == MOE_OP_TAKE_ALONG && N(g, n->args[1])->op == MOE_OP_TOPK &&
			ir_norm_axis((int)ir_attr_int(n, "axis", -1), n->rank) == n->rank - 1 && pick_other(g, n)) {
			/* another value of the scores' shape at the top-k indices (DeepSeek-V3's
			 * unbiased scores at the indices of the biased ones): the same pick,
			 * one vector pass where the gather moved one element per index */
			const ir_node *x = N(g, n->args[0]);
			tk c = {rb.dst, n->loc, x->rank, {0}, x->shape[x->rank - 1], n->shape[n->rank - 1], false};
			memcpy(c.sh, x->shape, sizeof c.sh);
			rb.map[i] = unpick_bits(&c, pick_values(&c, rb.map[n->args[1]], pick_bits(&c, rb.map[n->args[0]])),
				(moe_dtype)x->dtype);
			if (n->name)
				moe_node_set_name(rb.dst, rb.map[i], n->name);
			continue;
		}
		if (n->op != MOE_OP_TOPK) {
			rebuild_copy(&rb, i);
			continue;
		}
		ir_node *x = N(g, n->args[0]);
		tk c = {rb.dst, n->loc, x->rank, {0}, x->shape[x->rank - 1], ir_attr_int(n, "k", 1), false};
		memcpy(c.sh, x->shape, sizeof c.sh);
		bool packed = mode ? !strcmp(mode, "packed16") : x->dtype == MOE_BF16;
		if (packed && (x->dtype == MOE_I32 || c.E > 65536)) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc,
				"lower-topk: packed16 needs float scores and at most 65536 candidates (got %s, %lld)",
				moe_dtype_name((moe_dtype)x->dtype), (long long)c.E);
			rebuild_abort(&rb);
			ctx_free(ctx, vals, 0);
			return MOE_ERR_INVALID;
		}
		if (x->rank + 1 > MOE_MAX_RANK) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "lower-topk: scores of rank %d leave no room for the rank matrix",
				x->rank);
			rebuild_abort(&rb);
			ctx_free(ctx, vals, 0);
			return MOE_ERR_INVALID;
		}
		moe_dtype xt = (moe_dtype)x->dtype;
		bool pick = xt == MOE_F32 || xt == MOE_BF16 || xt == MOE_I32;
		for (moe_id j = i + 1; pick && j < g->nnodes && !want; j++)
			want = N(g, j)->op == MOE_OP_TAKE_ALONG && N(g, j)->nargs >= 2 && N(g, j)->args[1] == i &&
			       N(g, j)->args[0] == n->args[0];
		c.iter = sel ? !strcmp(sel, "iter") : iter_cheaper(&c, !packed && nonneg_score(g, n->args[0]));
		c.iter = c.iter && c.K <= MAX_PARTS_ITER && c.E <= ((int64_t)1 << 30);
		moe_id out = lower_chunked(&c, rb.map[n->args[0]], packed, limit, want ? &vals[i] : NULL);
		want = false;
		if (n->name)
			moe_node_set_name(rb.dst, out, n->name);
		rb.map[i] = out;
	}
	rebuild_end(&rb);
	ctx_free(ctx, vals, 0);
	return MOE_OK;
}
