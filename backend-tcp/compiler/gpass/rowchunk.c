/* backend-tcp/compiler/gpass/rowchunk.c: the schedule compiler's row chunks
 * (tcp_row_chunk_wide; docs/tcp-compiler.md 5.3), which sched_build.c asks
 * for when a layer's values do not fit DM.
 *
 * After routing, a layer computes values with one row per token that are
 * row-wise: row t of each depends only on row t of its row-wise operands
 * (the router's cast of x, a shared expert's einsums over x, its
 * activation, the add of the routed and shared results). At T = 4096 those
 * values, and the f32 partial sums of their contractions, exceed DM. The
 * rewrite computes a set of them (a region, below) once per chunk of rows,
 * reading each chunk's rows of its other operands (a slice; the matching
 * part of a concat along the rows, such as blockwise-dispatch's chunked
 * combine), the values read outside it joined by a concat. Nothing changes
 * numerically: every row is computed by the same operations in the same
 * order. The rewrite runs on the graph before the weights are split: a
 * value bound as a packed weight counts as the leaf it becomes. */
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "passes/pass.h"

enum { MAXCH = 64 }; /* a concat has at most 64 operands */

typedef struct rc {
	const moe_graph *g;
	int64_t T;
	bool *in; /* the nodes computed in chunks (one region) */
	const bool *pack; /* bound as packed weights (tcp_pack): leaves of the device program */
} rc;

/* A leaf of the device program: a leaf, or a value packed at load time. */
static bool dev_leaf(const rc *c, moe_id i)
{
	return (ir_ops[N(c->g, i)->op].flags & OPF_LEAF) || c->pack[i];
}

/* Is einsum n of the form r..,..->r.. with r only in its first operand? */
static bool row_einsum(const ir_node *n)
{
	ir_einsum e;
	char msg[96];
	if (n->nargs != 2 || !ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg))
		return false;
	char r = e.out[0];
	if (e.in[0][0] != r || memchr(e.in[1], r, (size_t)e.rank[1]))
		return false;
	return !memchr(e.in[0] + 1, r, (size_t)e.rank[0] - 1) && !memchr(e.out + 1, r, (size_t)e.out_rank - 1);
}

/* Operand k of node n is row-wise (its leading dimension is n's rows). */
static bool row_operand(const rc *c, const ir_node *n, uint32_t k)
{
	const ir_node *a = N(c->g, n->args[k]);
	if (n->op == MOE_OP_EINSUM || n->op == MOE_OP_RESHAPE || n->op == MOE_OP_REDUCE_SUM ||
		n->op == MOE_OP_REDUCE_MAX || n->op == MOE_OP_REDUCE_MIN)
		return k == 0;
	return a->rank == n->rank && a->shape[0] == c->T;
}

/* Can node i be computed one chunk of rows at a time? */
static bool row_wise(const rc *c, moe_id i)
{
	const ir_node *n = N(c->g, i);
	if (n->rank < 1 || n->shape[0] != c->T || n->valid != MOE_NONE || (ir_ops[n->op].flags & OPF_IMPURE))
		return false;
	if (dev_leaf(c, i))
		return false;
	switch ((moe_op)n->op) {
	case MOE_OP_EINSUM: return row_einsum(n) && N(c->g, n->args[0])->shape[0] == c->T;
	case MOE_OP_RESHAPE: return N(c->g, n->args[0])->shape[0] == c->T;
	case MOE_OP_REDUCE_SUM:
	case MOE_OP_REDUCE_MAX:
	case MOE_OP_REDUCE_MIN: {
		const ir_node *a = N(c->g, n->args[0]);
		return ir_norm_axis((int)ir_attr_int(n, "axis", -1), a->rank) > 0 && a->shape[0] == c->T;
	}
	default: break;
	}
	if (!(ir_ops[n->op].flags & OPF_ELEM))
		return false;
	for (uint32_t k = 0; k < n->nargs; k++) {
		const ir_node *a = N(c->g, n->args[k]);
		if (a->rank > n->rank || (a->rank == n->rank && a->shape[0] != c->T && a->shape[0] != 1))
			return false;
	}
	return true;
}

/* Chunk boundaries: at most `rows` rows each, inside the parts of a concat
 * along the rows that the chunked nodes read (so each chunk reads one part). */
static uint32_t boundaries(const rc *c, int64_t rows, int64_t *at)
{
	const moe_graph *g = c->g;
	const ir_node *cat = NULL;
	for (moe_id i = 0; i < g->nnodes && !cat; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; c->in[i] && k < n->nargs; k++) {
			const ir_node *a = N(g, n->args[k]);
			if (!c->in[n->args[k]] && a->op == MOE_OP_CONCAT && ir_attr_int(a, "axis", 0) == 0 &&
				row_operand(c, n, k))
				cat = a;
		}
	}
	uint32_t nb = 0;
	at[nb++] = 0;
	int64_t p0 = 0;
	for (uint32_t p = 0; p < (cat ? cat->nargs : 1); p++) {
		int64_t p1 = cat ? p0 + N(g, cat->args[p])->shape[0] : c->T;
		int64_t k = (p1 - p0 + rows - 1) / rows, step = k > 0 ? (p1 - p0 + k - 1) / k : 1;
		for (int64_t r = p0 + step; r < p1 && nb <= MAXCH; r += step)
			at[nb++] = r;
		if (p1 > p0 && nb <= MAXCH)
			at[nb++] = p1;
		p0 = p1;
	}
	if (nb > MAXCH + 1 || nb < 2) { /* too many: equal chunks, read by slices */
		int64_t step = (c->T + MAXCH - 1) / MAXCH;
		nb = 0;
		for (int64_t r = 0; r < c->T; r += step)
			at[nb++] = r;
		at[nb++] = c->T;
	}
	return nb - 1;
}

/* Rows [a, b) of source node s (of the source graph) in dst. */
static moe_id rows_of(const rc *c, moe_graph *d, const moe_id *map, moe_id s, int64_t a, int64_t b)
{
	const ir_node *n = N(c->g, s);
	if (a == 0 && b == c->T)
		return map[s];
	if (n->op == MOE_OP_CONCAT && ir_attr_int(n, "axis", 0) == 0) {
		int64_t p0 = 0;
		for (uint32_t p = 0; p < n->nargs; p++) {
			int64_t p1 = p0 + N(c->g, n->args[p])->shape[0];
			if (a >= p0 && b <= p1)
				return a == p0 && b == p1 ? map[n->args[p]] : ir_b_slice(d, map[n->args[p]], 0, a - p0, b - p0, n->loc);
			p0 = p1;
		}
	}
	return ir_b_slice(d, map[s], 0, a, b, n->loc);
}

/* Chunked node i over rows [a, b): operands mapped through cm (chunked nodes of
 * this chunk) or sliced; a reshape gets its leading dimension. */
static moe_id chunk_node(const rc *c, moe_graph *d, const moe_id *map, moe_id *cm, moe_id i, int64_t a, int64_t b)
{
	const ir_node *n = N(c->g, i);
	IR_ASSERT(n->nargs <= 4);
	moe_id args[4];
	for (uint32_t k = 0; k < n->nargs; k++) {
		moe_id s = n->args[k];
		args[k] = c->in[s] ? cm[s] : row_operand(c, n, k) ? rows_of(c, d, map, s, a, b) : map[s];
	}
	moe_id *tm = cm + c->g->nnodes; /* scratch map for ir_copy_node */
	for (uint32_t k = 0; k < n->nargs; k++)
		tm[n->args[k]] = args[k];
	moe_id id = ir_copy_node(d, c->g, i, tm);
	if (n->op == MOE_OP_RESHAPE) {
		int64_t sh[MOE_MAX_RANK];
		memcpy(sh, n->shape, sizeof sh);
		sh[0] = b - a;
		moe_node_set_ints(d, id, "shape", sh, n->rank);
	}
	IR_ASSERT(ir_infer(d->ctx, d, id) == MOE_OK);
	return id;
}

/* ---- the schedule compiler's row chunks (sched_build.c asks for them) ----
 *
 * The schedule compiler keeps the block loop and fuses nothing, so a wide
 * row-wise value (a [T, D] f32 cast beside its operand) is a DM buffer of its
 * own wherever it stands: before the loop (the router's cast of x) as well as
 * after it. The *seeds* are the row-wise nodes of leading dimension T (c->T)
 * that are wide (a row at least as wide as x's) or read the rows of an input
 * that wide, and that are read only as rows by row-wise nodes (or by the
 * outputs); a *region* is a set of seeds and their readers joined by the
 * seeds' edges. Each region is computed once per chunk of rows where its last
 * node stands; a value of it read outside it (an *exit*: an output, the
 * router's logits) is the concat of its chunks. A seed's value then exists
 * one chunk at a time. A region whose exit is read before its last node, or
 * that reads one of its own values whole, is left whole (its chunks could not
 * stand in one place). */

static bool wide(const rc *c, moe_id i, int64_t row)
{
	return ir_bytes(N(c->g, i)) / c->T >= row;
}

/* Node i reads the rows of a wide input (whose DM copy would be whole). */
static bool reads_wide_input(const rc *c, moe_id i, int64_t row)
{
	const ir_node *n = N(c->g, i);
	for (uint32_t k = 0; k < n->nargs; k++)
		if (N(c->g, n->args[k])->op == MOE_OP_INPUT && row_operand(c, n, k) && wide(c, n->args[k], row))
			return true;
	return false;
}

/* Every reader of i is row-wise and reads it as rows only (an output may read it). */
static bool read_as_rows(const rc *c, moe_id i, const bool *rw)
{
	const moe_graph *g = c->g;
	for (moe_id u = i + 1; u < g->nnodes; u++) {
		const ir_node *n = N(g, u);
		if (n->valid == i)
			return false;
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] == i && (!rw[u] || !row_operand(c, n, k)))
				return false;
	}
	return true;
}

static uint32_t find_root(uint32_t *up, uint32_t i)
{
	while (up[i] != i)
		i = up[i] = up[up[i]];
	return i;
}

/* in[i]: node i is in a region; reg[i]: its region's root; last[root]: the
 * region's last node. Regions whose exits are read before their last node,
 * or that read one of their own values whole, are dropped. */
static void regions(rc *c, bool *in, uint32_t *reg, moe_id *last)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	int64_t row = ir_graph_attr_int(g, IR_GK_MOE_ROW_BYTES, 0);
	bool *rw = ctx_alloc(g->ctx, nn + 1), *seed = ctx_alloc(g->ctx, nn + 1), *bad = ctx_alloc(g->ctx, nn + 1);
	for (moe_id i = 0; i < nn; i++)
		rw[i] = row_wise(c, i);
	for (moe_id i = 0; i < nn; i++) {
		seed[i] = row > 0 && rw[i] && (wide(c, i, row) || reads_wide_input(c, i, row)) && read_as_rows(c, i, rw);
		in[i] = seed[i];
		reg[i] = i;
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k < n->nargs && rw[i] && !in[i]; k++)
			in[i] = seed[n->args[k]] && row_operand(c, n, k);
		for (uint32_t k = 0; k < n->nargs && in[i]; k++)
			if (seed[n->args[k]] && row_operand(c, n, k))
				reg[find_root(reg, n->args[k])] = find_root(reg, i);
	}
	for (moe_id i = 0; i < nn; i++) {
		reg[i] = find_root(reg, i);
		last[i] = MOE_NONE;
	}
	for (moe_id i = 0; i < nn; i++)
		if (in[i])
			last[reg[i]] = i; /* ascending: the last one stays */
	for (moe_id u = 0; u < nn; u++) {
		const ir_node *n = N(g, u);
		for (uint32_t k = 0; k < n->nargs; k++) {
			moe_id a = n->args[k];
			if (a >= nn || !in[a])
				continue;
			if (in[u] && reg[u] == reg[a] ? !row_operand(c, n, k) : u <= last[reg[a]])
				bad[reg[a]] = true;
		}
		if (n->valid != MOE_NONE && n->valid < nn && in[n->valid])
			bad[reg[n->valid]] = true;
	}
	for (moe_id i = 0; i < nn; i++)
		in[i] = in[i] && !bad[reg[i]];
	ctx_free(g->ctx, rw, nn + 1);
	ctx_free(g->ctx, seed, nn + 1);
	ctx_free(g->ctx, bad, nn + 1);
}

/* Region r (root) in row chunks of at most `rows` rows, its exits joined. */
static void emit_region(rc *c, moe_graph *d, moe_id *map, moe_id *cm, const bool *is_out, const bool *in,
	const uint32_t *reg, uint32_t r, int64_t rows)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	bool *all = c->in, *mask = ctx_alloc(g->ctx, nn + 1);
	for (moe_id i = 0; i < nn; i++)
		mask[i] = in[i] && reg[i] == r;
	int64_t at[MAXCH + 2];
	c->in = mask; /* this region's nodes; boundaries inside the parts of a concat it reads */
	uint32_t nch = boundaries(c, rows, at);
	moe_id(*parts)[MAXCH] = ctx_alloc(g->ctx, sizeof *parts * (nn + 1));
	bool *exit = ctx_alloc(g->ctx, nn + 1);
	for (moe_id u = 0; u < nn; u++) {
		const ir_node *n = N(g, u);
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] < nn && mask[n->args[k]] && !mask[u])
				exit[n->args[k]] = true;
	}
	for (moe_id i = 0; i < nn; i++)
		exit[i] = mask[i] && (exit[i] || is_out[i]);
	for (uint32_t ch = 0; ch < nch; ch++)
		for (moe_id i = 0; i < nn; i++)
			if (mask[i]) {
				cm[i] = chunk_node(c, d, map, cm, i, at[ch], at[ch + 1]);
				if (exit[i])
					parts[i][ch] = cm[i];
			}
	for (moe_id i = 0; i < nn; i++)
		if (exit[i]) {
			map[i] = ir_b_concat(d, parts[i], nch, 0, N(g, i)->loc);
			if (N(g, i)->name)
				moe_node_set_name(d, map[i], N(g, i)->name);
		}
	c->in = all;
	ctx_free(g->ctx, parts, sizeof *parts * (nn + 1));
	ctx_free(g->ctx, exit, nn + 1);
	ctx_free(g->ctx, mask, nn + 1);
}

/* g's regions of leading dimension T in nch chunks, or NULL when it has none. */
static moe_graph *chunk_rows(moe_ctx *ctx, const moe_graph *g, int64_t T, uint32_t nch)
{
	uint32_t nn = g->nnodes;
	bool *pack = ctx_alloc(ctx, nn + 1), *in = ctx_alloc(ctx, nn + 1), *is_out = ctx_alloc(ctx, nn + 1);
	uint32_t *reg = ctx_alloc(ctx, sizeof *reg * (nn + 1));
	moe_id *last = ctx_alloc(ctx, sizeof *last * (nn + 1));
	tcp_packed_nodes(ctx, g, pack);
	rc c = {g, T, in, pack};
	for (uint32_t o = 0; o < g->nout; o++)
		is_out[g->outputs[o]] = true;
	regions(&c, in, reg, last);
	bool any = false;
	for (moe_id i = 0; i < nn && !any; i++)
		any = in[i];
	moe_graph *d = NULL;
	if (any) {
		d = ir_graph_clone_empty(g);
		moe_id *map = ctx_alloc(ctx, sizeof *map * (nn + 1)), *cm = ctx_alloc(ctx, sizeof *cm * (2 * nn + 1));
		int64_t rows = (T + nch - 1) / nch;
		for (moe_id i = 0; i < nn; i++) {
			map[i] = in[i] ? MOE_NONE : ir_copy_node(d, g, i, map);
			if (in[i] && last[reg[i]] == i)
				emit_region(&c, d, map, cm, is_out, in, reg, reg[i], rows);
		}
		for (uint32_t o = 0; o < g->nout; o++)
			moe_graph_add_output(d, map[g->outputs[o]]);
		ctx_free(ctx, map, sizeof *map * (nn + 1));
		ctx_free(ctx, cm, sizeof *cm * (2 * nn + 1));
	}
	ctx_free(ctx, pack, nn + 1);
	ctx_free(ctx, in, nn + 1);
	ctx_free(ctx, is_out, nn + 1);
	ctx_free(ctx, reg, sizeof *reg * (nn + 1));
	ctx_free(ctx, last, sizeof *last * (nn + 1));
	if (d && pass_dce(ctx, d, NULL, NULL) != MOE_OK) {
		ir_graph_free(d);
		return NULL;
	}
	return d;
}

/* The row counts of g's wide values (a leading dimension of at least 2), ascending. */
static uint32_t row_counts(const moe_graph *g, int64_t *out, uint32_t max)
{
	int64_t row = ir_graph_attr_int(g, IR_GK_MOE_ROW_BYTES, 0);
	uint32_t n = 0;
	for (moe_id i = 0; i < g->nnodes && row > 0; i++) {
		const ir_node *x = N(g, i);
		int64_t R = x->rank >= 1 ? x->shape[0] : 0;
		if (R < 2 || (ir_ops[x->op].flags & OPF_LEAF) || ir_bytes(x) / R < row)
			continue;
		uint32_t k = 0;
		while (k < n && out[k] < R)
			k++;
		if ((k < n && out[k] == R) || n == max)
			continue;
		memmove(out + k + 1, out + k, (n - k) * sizeof *out);
		out[k] = R;
		n++;
	}
	return n;
}

/* Each row count in turn, the smallest first (so a larger count's chunks,
 * made later, are not chunked again): a region's rows are its leading
 * dimension, T or a part of blockwise-dispatch's chunked combine. */
moe_graph *tcp_row_chunk_wide(moe_ctx *ctx, const moe_graph *g, uint32_t nch, uint32_t *nchunks)
{
	int64_t R[16];
	*nchunks = 0;
	if (g->nnodes == 0 || nch < 2 || nch > MAXCH || g->is_body)
		return NULL;
	uint32_t nr = row_counts(g, R, 16);
	moe_graph *cur = NULL;
	for (uint32_t k = 0; k < nr; k++) {
		moe_graph *d = chunk_rows(ctx, cur ? cur : g, R[k], nch);
		if (d) {
			if (cur)
				ir_graph_free(cur);
			cur = d;
		}
	}
	*nchunks = cur ? nch : 0;
	return cur;
}
