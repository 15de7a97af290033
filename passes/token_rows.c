/* passes/token_rows.c: which values of a serving layer are row-wise in the
 * tokens (docs/semantics.md section 7), for blockwise-dispatch.
 *
 * A serving layer has an i32 scalar input `n_tokens` (0 <= n <= T): rows at
 * and past n are padding. A value is *row-wise* when its axis 0 is the token
 * axis and its row t is computed from row t of the token inputs and from
 * token-free values (weights, constants, iotas) only: elementwise ops, an
 * einsum that keeps the first letter of its row-wise operand first, and
 * softmax, reductions, scans, top-k, one_hot, filter, take_along, slices and
 * concatenations along another axis; a slice of rows along the token axis
 * (top-k lowered in chunks of tokens) is row-wise with its row offset, and
 * the concatenation of consecutive such chunks is again. Rows of such a value below n are
 * bitwise those of the layer compiled for T = n, so the ones that honour a
 * `valid` mask get valid(n_tokens - offset) and the executors skip the
 * padded rows.
 * Anything else that reads a token value is not row-wise; a serving layer
 * whose experts or outputs are not row-wise is refused. */
#include <string.h>

#include "passes/pass.h"

enum { TR_FREE, TR_ROW, TR_OTHER };

moe_id token_count_input(const moe_graph *g)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_INPUT && n->name && !strcmp(n->name, MOE_TOKENS_INPUT))
			return i;
	}
	return MOE_NONE;
}

static bool axis_not_token(const ir_node *n, const char *key, int64_t def, int rank)
{
	int a = ir_norm_axis((int)ir_attr_int(n, key, def), rank);
	return a > 0;
}

/* Einsum "t...,...->t...": operand 0 row-wise, its first letter first in the
 * output and absent from operand 1. */
static bool einsum_rowwise(const moe_graph *g, const ir_node *n, const uint8_t *k, const int64_t *off, int64_t *o)
{
	ir_einsum e;
	char msg[8];
	if (!ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg) || e.out_rank < 1)
		return false;
	if (k[n->args[0]] != TR_ROW || (n->nargs == 2 && k[n->args[1]] != TR_FREE))
		return false;
	if (e.rank[0] < 1 || e.in[0][0] != e.out[0])
		return false;
	for (int i = 0; n->nargs == 2 && i < e.rank[1]; i++)
		if (e.in[1][i] == e.out[0])
			return false;
	(void)g;
	*o = off[n->args[0]];
	return true;
}

/* Every operand row-wise (same rank and row offset) or token-free. */
static bool elem_rowwise(const moe_graph *g, const ir_node *n, const uint8_t *k, const int64_t *off, int64_t *o)
{
	bool row = false;
	for (uint32_t a = 0; a < n->nargs; a++) {
		if (k[n->args[a]] == TR_OTHER)
			return false;
		if (k[n->args[a]] == TR_ROW) {
			if (N(g, n->args[a])->rank != n->rank || (row && off[n->args[a]] != *o))
				return false;
			*o = off[n->args[a]];
			row = true;
		}
	}
	return row;
}

/* Concatenation along the token axis of consecutive row-wise chunks. */
static bool concat_rows(const moe_graph *g, const ir_node *n, const uint8_t *k, const int64_t *off, int64_t *o)
{
	int64_t at = 0;
	for (uint32_t a = 0; a < n->nargs; a++) {
		if (k[n->args[a]] != TR_ROW || N(g, n->args[a])->rank != n->rank)
			return false;
		if (a == 0)
			*o = off[n->args[0]];
		if (off[n->args[a]] != *o + at)
			return false;
		at += N(g, n->args[a])->shape[0];
	}
	return true;
}

/* Every operand row-wise or token-free, at least one row-wise. */
static bool args_rows(const ir_node *n, const uint8_t *k, bool all_rows)
{
	bool row = false;
	for (uint32_t a = 0; a < n->nargs; a++) {
		uint8_t ka = k[n->args[a]];
		if (ka == TR_OTHER || (all_rows && ka != TR_ROW))
			return false;
		row |= ka == TR_ROW;
	}
	return row;
}

static uint8_t classify(const moe_graph *g, moe_id i, const uint8_t *k, int64_t *off, int64_t T, moe_id ntok)
{
	const ir_node *n = N(g, i);
	int64_t *o = &off[i];
	*o = 0;
	if (n->op == MOE_OP_INPUT)
		return i != ntok && n->rank >= 1 && n->shape[0] == T ? TR_ROW : TR_OTHER;
	if (ir_ops[n->op].flags & OPF_LEAF)
		return TR_FREE;
	bool any = false;
	for (uint32_t a = 0; a < n->nargs; a++)
		any |= n->args[a] != MOE_NONE && k[n->args[a]] != TR_FREE;
	if (!any)
		return TR_FREE;
	if (n->rank < 1)
		return TR_OTHER;
	const ir_node *x = N(g, n->args[0]);
	bool ok = false, same = args_rows(n, k, true);
	if (same)
		*o = off[n->args[0]];
	if (n->op == MOE_OP_SLICE && same && ir_attr_int(n, "step", 1) == 1 && !axis_not_token(n, "axis", 0, n->rank)) {
		*o += ir_attr_int(n, "start", 0); /* a chunk of token rows */
		return *o >= 0 && *o + n->shape[0] <= T ? TR_ROW : TR_OTHER;
	}
	switch (n->op) {
	case MOE_OP_EINSUM: ok = einsum_rowwise(g, n, k, off, o); break;
	case MOE_OP_SOFTMAX: ok = args_rows(n, k, true) && axis_not_token(n, "axis", -1, n->rank); break;
	case MOE_OP_CUMSUM: ok = args_rows(n, k, true) && axis_not_token(n, "axis", -1, n->rank); break;
	case MOE_OP_REDUCE_SUM:
	case MOE_OP_REDUCE_MAX:
	case MOE_OP_REDUCE_MIN: ok = args_rows(n, k, true) && axis_not_token(n, "axis", -1, x->rank); break;
	case MOE_OP_TOPK: ok = args_rows(n, k, true) && x->rank >= 2; break;
	case MOE_OP_ONE_HOT: ok = args_rows(n, k, true); break;
	case MOE_OP_FILTER: ok = args_rows(n, k, false) && n->rank >= 2 && elem_rowwise(g, n, k, off, o); break;
	case MOE_OP_TAKE_ALONG: ok = args_rows(n, k, true) && axis_not_token(n, "axis", -1, n->rank); break;
	case MOE_OP_SLICE: ok = args_rows(n, k, true) && axis_not_token(n, "axis", 0, n->rank); break;
	case MOE_OP_CONCAT:
		ok = axis_not_token(n, "axis", 0, n->rank) ? elem_rowwise(g, n, k, off, o) : concat_rows(g, n, k, off, o);
		break;
	case MOE_OP_RESHAPE: ok = args_rows(n, k, true) && x->shape[0] == n->shape[0]; break;
	case MOE_OP_EXPERTS:
		ok = k[n->args[EXP_X]] == TR_ROW && k[n->args[EXP_IDX]] == TR_ROW && k[n->args[EXP_W]] == TR_ROW &&
		     !off[n->args[EXP_X]] && !off[n->args[EXP_IDX]] && !off[n->args[EXP_W]] && n->shape[0] == T;
		for (int s = EXP_W + 1; ok && s < EXP_NSLOTS; s++)
			ok = n->args[s] == MOE_NONE || k[n->args[s]] == TR_FREE;
		break;
	default: ok = (ir_ops[n->op].flags & OPF_ELEM) && elem_rowwise(g, n, k, off, o); break;
	}
	return ok && *o >= 0 && *o + n->shape[0] <= T ? TR_ROW : TR_OTHER;
}

/* Classifies every node of g (kinds[i], g->nnodes entries); false with a
 * located error when an experts node or an output is not row-wise, or an
 * output is neither an experts node nor an op that honours `valid`. */
bool token_rows_classify(moe_ctx *ctx, const moe_graph *g, int64_t T, moe_id ntok, uint8_t *kinds, int64_t *off)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		kinds[i] = classify(g, i, kinds, off, T, ntok);
		if (N(g, i)->op == MOE_OP_EXPERTS && kinds[i] != TR_ROW) {
			moe_diag(ctx, MOE_DIAG_ERROR, N(g, i)->loc,
				"serving (n_tokens): the experts' tokens, routing and weights must be computed row by row from "
				"the token inputs [T, ...]");
			return false;
		}
	}
	for (uint32_t o = 0; o < g->nout; o++) {
		const ir_node *n = N(g, g->outputs[o]);
		if (kinds[g->outputs[o]] != TR_ROW || off[g->outputs[o]] || n->shape[0] != T || !(n->op == MOE_OP_EXPERTS || (ir_ops[n->op].flags & OPF_VALID))) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc,
				"serving (n_tokens): output '%s' must be computed row by row from the tokens by experts(...) or "
				"an elementwise op or einsum, so that its rows past n_tokens can be zero",
				n->name ? n->name : "?");
			return false;
		}
	}
	return true;
}

static bool maskable(const ir_node *n, uint8_t kind)
{
	return kind == TR_ROW && n->op != MOE_OP_EXPERTS && (ir_ops[n->op].flags & OPF_VALID) && n->valid == MOE_NONE;
}

/* Before the rebuild copies the graph (right after n_tokens): the count of
 * real rows for each row offset in use, n_tokens - offset, into counts[]
 * (src->nnodes entries: counts[i] for node i, MOE_NONE where not needed). */
void token_rows_counts(moe_graph *dst, const moe_graph *src, const uint8_t *kinds, const int64_t *off,
	moe_id ntok_dst, moe_id *counts)
{
	for (moe_id i = 0; i < src->nnodes; i++) {
		counts[i] = MOE_NONE;
		if (!maskable(N(src, i), kinds[i]))
			continue;
		for (moe_id j = 0; j < i && counts[i] == MOE_NONE; j++)
			if (counts[j] != MOE_NONE && off[j] == off[i])
				counts[i] = counts[j];
		if (counts[i] == MOE_NONE)
			counts[i] = off[i] ? ir_b2(dst, MOE_OP_SUB, ntok_dst, ir_b_const(dst, MOE_I32, (double)off[i], src->loc),
						   src->loc)
					   : ntok_dst;
	}
}

/* After the rebuild: valid(counts[i]) on every row-wise node of the source
 * that honours a mask and has none (map: source id -> rebuilt id). */
void token_rows_mask(moe_graph *dst, const moe_graph *src, const uint8_t *kinds, const moe_id *map,
	const moe_id *counts)
{
	for (moe_id i = 0; i < src->nnodes; i++) {
		const ir_node *n = N(src, i);
		if (!maskable(n, kinds[i]) || counts[i] == MOE_NONE)
			continue;
		ir_node *d = N(dst, map[i]);
		if (d->op == n->op && d->valid == MOE_NONE)
			d->valid = counts[i];
	}
}
