/* backend-tcp/compiler/gpass/einsum_canon.c: the tcp-einsum-canon pass. The
 * schedule compiler has one contraction recipe, [M, I] x [O, I] -> [M, O]
 * (recipe_contract.c), and lowers a one-operand einsum that only reorders
 * letters as a view. Every other equation ir_einsum_parse accepts is
 * rewritten here into those two and reshape, slice, concat and reduce_sum,
 * with no new instruction kind. The letters of a two-operand equation fall
 * in six classes:
 *   B  in both operands and the output (batch)    M  in the first and the output
 *   O  in the second and the output               I  in both, not the output
 *   Ra in the first only                          Rw in the second only
 * Ra and Rw are summed away from their operand first (reduce_sum). The
 * operands are then permuted to [B, M, I] and [B, O, I] (one-operand einsums:
 * strided views, copied by a reshape only where the groups merge) and
 * reshaped to [nB, nM, nI] and [nB, nO, nI] (a group's size is the product of
 * its letters' sizes, 1 when it is empty); each batch is a slice of both,
 * contracted as [nM, nI] x [nO, nI], and the batches are concatenated. The
 * [nB, nM, nO] result is reshaped to the letters B M O and permuted into the
 * output's order. A one-operand equation sums the letters missing from the
 * output, then permutes. A bf16 contraction accumulates in f32
 * (docs/tcp-isa.md), f32 contracts as bf16x3; integers cannot enter the
 * matrix engine, so an integer einsum (the [M, I] x [O, I] form too) becomes
 * the product a[nB, nM, 1, nI] x w[nB, 1, nO, nI] summed over nI: exact, as
 * the interpreter's sum is. An einsum masked by valid rows is left as it is,
 * and so is an equation that needs none of this: the graph of a layer whose
 * einsums the recipes read already is unchanged. Loop bodies are not read
 * (their einsums are blockwise-dispatch's contractions). */
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "passes/pass.h"

typedef struct ec {
	moe_graph *d;
	moe_loc loc;
	int64_t size[26]; /* each letter's size */
} ec;

static bool has(const char *s, int n, char ch)
{
	return n > 0 && memchr(s, ch, (size_t)n) != NULL;
}

/* Whether einsum n of g is left as it stands: sched-build lowers it (a
 * permutation, the contraction of floats or of a dequantized weight:
 * recipe_qact.c), or it is masked by valid rows, which the rewrite would not
 * carry (the recipes judge it). */
static bool lowered_as_is(const moe_graph *g, const ir_node *n)
{
	if (n->valid != MOE_NONE)
		return true;
	int batch = 0;
	ir_ein_form f = ir_node_einsum_form(n, &batch);
	if (n->nargs == 1)
		return f == IR_EIN_PERMUTE || f == IR_EIN_IDENTITY;
	if (f != IR_EIN_MATMUL_NT || batch != 0)
		return false;
	const ir_node *a = N(g, n->args[0]), *w = N(g, n->args[1]);
	return moe_dtype_is_float((moe_dtype)a->dtype) || a->op == MOE_OP_DEQUANT || w->op == MOE_OP_DEQUANT;
}

bool tcp_einsum_canon_needed(const moe_graph *g)
{
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_EINSUM && !lowered_as_is(g, N(g, i)))
			return true;
	return false;
}

/* x, whose letters are lt[0 .. *r), with the letters in neither keep nor
 * keep2 summed away (the highest axis first, so the lower ones stay put) */
static moe_id sum_away(ec *c, moe_id x, char *lt, int *r, const char *keep, int nk, const char *keep2, int nk2)
{
	for (int k = *r - 1; k >= 0 && x != MOE_NONE; k--) {
		if (has(keep, nk, lt[k]) || has(keep2, nk2, lt[k]))
			continue;
		x = ir_b_reduce(c->d, MOE_OP_REDUCE_SUM, x, k, false, c->loc);
		memmove(lt + k, lt + k + 1, (size_t)(*r - k - 1));
		--*r;
	}
	return x;
}

/* x with letters from[0 .. r) reordered as to (a one-operand einsum) */
static moe_id permute(ec *c, moe_id x, const char *from, const char *to, int r)
{
	if (x == MOE_NONE || !memcmp(from, to, (size_t)r))
		return x;
	char eq[2 * MOE_MAX_RANK + 3];
	snprintf(eq, sizeof eq, "%.*s->%.*s", r, from, r, to);
	return ir_b_einsum(c->d, eq, x, MOE_NONE, c->loc);
}

static moe_id reshape(ec *c, moe_id x, int r, const int64_t *sh)
{
	if (x == MOE_NONE)
		return x;
	const ir_node *n = N(c->d, x);
	if (n->rank == r && !memcmp(n->shape, sh, sizeof *sh * (size_t)r))
		return x;
	return ir_b_reshape(c->d, x, r, sh, c->loc);
}

/* x reshaped to the letters lt[0 .. r) */
static moe_id to_letters(ec *c, moe_id x, const char *lt, int r)
{
	int64_t sh[MOE_MAX_RANK];
	for (int k = 0; k < r; k++)
		sh[k] = c->size[lt[k] - 'a'];
	return reshape(c, x, r, sh);
}

static int64_t group(const ec *c, const char *lt, int n)
{
	int64_t s = 1;
	for (int k = 0; k < n; k++)
		s *= c->size[lt[k] - 'a'];
	return s;
}

/* [nB, nM, nI] x [nB, nO, nI] -> [nB, nM, nO] (nB 0: no batch axis, [nM, nI] x [nO, nI]) */
static moe_id contract(ec *c, moe_id a, moe_id w, int64_t nB, int64_t nM, int64_t nO, int64_t nI)
{
	if (!nB)
		return ir_b_einsum(c->d, "mi,oi->mo", reshape(c, a, 2, (int64_t[]){nM, nI}),
			reshape(c, w, 2, (int64_t[]){nO, nI}), c->loc);
	a = reshape(c, a, 3, (int64_t[]){nB, nM, nI});
	w = reshape(c, w, 3, (int64_t[]){nB, nO, nI});
	moe_id *part = ctx_alloc(c->d->ctx, sizeof *part * (size_t)nB);
	if (!part)
		return MOE_NONE;
	for (int64_t b = 0; b < nB; b++) {
		moe_id ab = ir_b_slice(c->d, a, 0, b, b + 1, c->loc), wb = ir_b_slice(c->d, w, 0, b, b + 1, c->loc);
		moe_id y = contract(c, ab, wb, 0, nM, nO, nI);
		part[b] = reshape(c, y, 3, (int64_t[]){1, nM, nO});
	}
	moe_id y = ir_b_concat(c->d, part, (uint32_t)nB, 0, c->loc);
	ctx_free(c->d->ctx, part, sizeof *part * (size_t)nB);
	return y;
}

/* a[nB, nM, 1, nI] x w[nB, 1, nO, nI] summed over nI: the product form of a
 * type the matrix engine does not take */
static moe_id product(ec *c, moe_id a, moe_id w, int64_t nB, int64_t nM, int64_t nO, int64_t nI)
{
	a = reshape(c, a, 4, (int64_t[]){nB, nM, 1, nI});
	w = reshape(c, w, 4, (int64_t[]){nB, 1, nO, nI});
	moe_id p = ir_b2(c->d, MOE_OP_MUL, a, w, c->loc);
	return p == MOE_NONE ? p : ir_b_reduce(c->d, MOE_OP_REDUCE_SUM, p, 3, false, c->loc);
}

/* The canonical form of two-operand einsum e of a and w (see the top). */
static moe_id canon2(ec *c, const ir_einsum *e, moe_id a, moe_id w, moe_dtype t)
{
	char la[MOE_MAX_RANK], lw[MOE_MAX_RANK], B[MOE_MAX_RANK], M[MOE_MAX_RANK], O[MOE_MAX_RANK], I[MOE_MAX_RANK];
	int ra = e->rank[0], rw = e->rank[1], nb = 0, nm = 0, no = 0, ni = 0;
	memcpy(la, e->in[0], (size_t)ra);
	memcpy(lw, e->in[1], (size_t)rw);
	a = sum_away(c, a, la, &ra, e->out, e->out_rank, lw, rw);
	w = sum_away(c, w, lw, &rw, e->out, e->out_rank, la, ra);
	for (int k = 0; k < e->out_rank; k++) {
		char ch = e->out[k];
		bool ia = has(la, ra, ch), iw = has(lw, rw, ch);
		if (ia && iw)
			B[nb++] = ch;
		else if (ia)
			M[nm++] = ch;
		else
			O[no++] = ch;
	}
	for (int k = 0; k < ra; k++)
		if (!has(e->out, e->out_rank, la[k]))
			I[ni++] = la[k];
	char ao[MOE_MAX_RANK], wo[MOE_MAX_RANK], yo[MOE_MAX_RANK];
	memcpy(ao, B, (size_t)nb), memcpy(ao + nb, M, (size_t)nm), memcpy(ao + nb + nm, I, (size_t)ni);
	memcpy(wo, B, (size_t)nb), memcpy(wo + nb, O, (size_t)no), memcpy(wo + nb + no, I, (size_t)ni);
	memcpy(yo, B, (size_t)nb), memcpy(yo + nb, M, (size_t)nm), memcpy(yo + nb + nm, O, (size_t)no);
	a = permute(c, a, la, ao, ra);
	w = permute(c, w, lw, wo, rw);
	int64_t nB = group(c, B, nb), nM = group(c, M, nm), nO = group(c, O, no), nI = group(c, I, ni);
	moe_id y;
	if (a == MOE_NONE || w == MOE_NONE)
		return MOE_NONE;
	if (moe_dtype_is_float(t))
		y = contract(c, a, w, nB > 1 ? nB : 0, nM, nO, nI);
	else
		y = product(c, a, w, nB, nM, nO, nI);
	y = to_letters(c, y, yo, e->out_rank);
	return permute(c, y, yo, e->out, e->out_rank);
}

static moe_id canon1(ec *c, const ir_einsum *e, moe_id a)
{
	char la[MOE_MAX_RANK];
	int ra = e->rank[0];
	memcpy(la, e->in[0], (size_t)ra);
	a = sum_away(c, a, la, &ra, e->out, e->out_rank, NULL, 0);
	return permute(c, a, la, e->out, ra);
}

/* The canonical form of einsum i of g (mapped by rb) in rb's graph. */
static moe_id canon(rebuild *rb, moe_id i)
{
	const ir_node *n = N(rb->src, i);
	ir_einsum e;
	char msg[128];
	if (!ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg))
		return rebuild_copy(rb, i); /* sched-build reports it */
	ec c = {rb->dst, n->loc, {0}};
	for (uint32_t k = 0; k < n->nargs; k++) {
		const ir_node *x = N(rb->src, n->args[k]);
		for (int d = 0; d < x->rank; d++)
			c.size[e.in[k][d] - 'a'] = x->shape[d];
	}
	moe_id y = e.nin == 1 ? canon1(&c, &e, rb->map[n->args[0]])
			      : canon2(&c, &e, rb->map[n->args[0]], rb->map[n->args[1]],
				      (moe_dtype)N(rb->src, n->args[0])->dtype);
	if (y != MOE_NONE && n->name)
		moe_node_set_name(rb->dst, y, n->name);
	return rb->map[i] = y;
}

moe_status tcp_einsum_canon(moe_ctx *ctx, moe_graph *g, bool *changed)
{
	*changed = false;
	if (!tcp_einsum_canon_needed(g))
		return MOE_OK;
	rebuild rb;
	rebuild_begin(&rb, g);
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_EINSUM || lowered_as_is(g, n)) {
			rebuild_copy(&rb, i);
			continue;
		}
		if (canon(&rb, i) == MOE_NONE) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "tcp-einsum-canon: einsum '%s' could not be rewritten",
				ir_attr_str(n, "eq", ""));
			rebuild_abort(&rb);
			return MOE_ERR_INVALID;
		}
	}
	rebuild_end(&rb);
	*changed = true;
	return MOE_OK;
}
