/* passes/expert_parallel.c: one device's program of an expert-parallel layer
 * (docs/expert-parallel.md), and lower-exchange for single-device exchanges.
 *
 * expert-parallel{ep=N,rank=r,tokens=T,placement=...} rewrites experts(...)
 * for device r of N, whose graph holds its shard of the T tokens (T_r =
 * floor(T/N) rows, the last device the remainder; a device without tokens
 * keeps one dummy row whose pairs are never sent):
 *   dest/loc  owner device and local index of each pair's expert
 *   spos      send-buffer row of pair p: grouped by device, pair order within
 *   send      scount = rows per device; x rows gathered by the tokens scattered
 *             to spos (x * w scattered to spos for weight_on=input)
 *             and local expert ids scattered to spos
 *   exchange  rcount = all_to_all(scount); rows and ids = all_to_all(send)
 *             into R = T * min(K, E_r) rows, the tight bound
 *   experts   the received rows, grouped by local expert into the
 *             G_r = G_max(T, min(K, E_r), E_r, B) blocks of the tight grid,
 *             run blockwise like blockwise-dispatch (padding rows go to a
 *             spare grid row past the blocks, empty blocks are skipped)
 *   return    each row goes back: all_to_all(rows, rcount) -> send order
 *   combine   each pair's row gathered at spos, weighted and summed over K
 *             in f32 in k order, as the one-device program does, so the
 *             result is bitwise that program's
 * Expert weights become this device's rows ([E_r, ...], or [E_r * F, ...]
 * for a weight stacking each expert's F rows) with attribute ep_experts
 * listing their global experts; the loader reads only those rows. */
#include <stdlib.h>
#include <string.h>

#include "ir/graph_keys.h"
#include "passes/pass.h"

#define EP_MAX 4096

typedef struct ep {
	moe_ctx *ctx;
	moe_graph *d;
	moe_loc loc;
	moe_dtype t;
	int64_t ep, rank, T, Tl, Td, K, E, D, B, Ed, Kd, R, G;
	moe_id rows, nblocks, bexp; /* the local block grid's control values */
	bool loop;                  /* loop=1: the expert FFN as a block_loop (pass_expert_loop) */
	int32_t *owner; /* [E] device of expert e */
	int64_t *mine;  /* [Ed] this device's experts, ascending */
} ep;

static moe_id ci(ep *c, int64_t v)
{
	return ir_b_const(c->d, MOE_I32, (double)v, c->loc);
}

static moe_id b2(ep *c, moe_op op, moe_id a, moe_id b)
{
	return ir_b2(c->d, op, a, b, c->loc);
}

static moe_id splat(ep *c, moe_dtype t, int rank, int64_t a, int64_t b, double v)
{
	int64_t s[2] = {a, b};
	moe_id id = ir_emit(c->d, MOE_OP_CONST, t, rank, s, NULL, 0, c->loc);
	moe_node_set_float(c->d, id, "value", v);
	return id;
}

static moe_id reshape(ep *c, moe_id x, int rank, int64_t a, int64_t b, int64_t d3)
{
	int64_t s[3] = {a, b, d3};
	return ir_b_reshape(c->d, x, rank, s, c->loc);
}

static moe_id cumsum_excl(ep *c, moe_id x)
{
	moe_id id = ir_b1(c->d, MOE_OP_CUMSUM, x, c->loc);
	moe_node_set_int(c->d, id, "axis", 0);
	moe_node_set_int(c->d, id, "exclusive", 1);
	return id;
}

static moe_id exchange(ep *c, moe_id x, moe_id counts, int64_t rows, const char *name)
{
	moe_id a[2] = {x, counts};
	moe_id id = moe_node_new(c->d, MOE_OP_ALL_TO_ALL, a, 2, c->loc);
	moe_node_set_int(c->d, id, "ep", c->ep);
	moe_node_set_int(c->d, id, "rows", rows);
	IR_ASSERT(ir_infer(c->ctx, c->d, id) == MOE_OK);
	moe_node_set_name(c->d, id, name);
	return id;
}

/* Position of each one-hot row within its column and the column offsets:
 * pos[p] = off[col(p)] + #{q < p : col(q) = col(p)}; cnt[j] = rows of j. */
static moe_id group_pos(ep *c, moe_id oh, int64_t ncol, int64_t scale, moe_id *cnt_out, moe_id *off_out)
{
	moe_id cnt = ir_b_reduce(c->d, MOE_OP_REDUCE_SUM, oh, 0, false, c->loc);
	moe_id span = scale == 1 ? cnt : b2(c, MOE_OP_DIV, b2(c, MOE_OP_ADD, cnt, ci(c, scale - 1)), ci(c, scale));
	moe_id off = cumsum_excl(c, span);
	moe_id rank = ir_b_reduce(c->d, MOE_OP_REDUCE_SUM, b2(c, MOE_OP_MUL, cumsum_excl(c, oh), oh), 1, false, c->loc);
	moe_id at = ir_b_reduce(c->d, MOE_OP_REDUCE_SUM, b2(c, MOE_OP_MUL, oh, reshape(c, off, 2, 1, ncol, 0)), 1, false,
		c->loc);
	*cnt_out = cnt;
	if (off_out)
		*off_out = off;
	return b2(c, MOE_OP_ADD, scale == 1 ? at : b2(c, MOE_OP_MUL, at, ci(c, scale)), rank);
}

/* Owner device and local index of each expert id in idx, from the runs of
 * equal owners in the placement (no table constants in the IR). */
static void route(ep *c, moe_id idx, moe_id *dest, moe_id *loc)
{
	moe_id dv = ci(c, 0), sh = ci(c, 0);
	int64_t *seen = calloc((size_t)c->ep, sizeof *seen);
	IR_ASSERT(seen);
	for (int64_t a = 0; a < c->E;) {
		int64_t b = a, dev = c->owner[a];
		while (b < c->E && c->owner[b] == dev)
			b++;
		moe_id in = b2(c, MOE_OP_AND, b2(c, MOE_OP_GE, idx, ci(c, a)), b2(c, MOE_OP_LT, idx, ci(c, b)));
		dv = ir_b3(c->d, MOE_OP_SELECT, in, ci(c, dev), dv, c->loc);
		sh = ir_b3(c->d, MOE_OP_SELECT, in, ci(c, a - seen[dev]), sh, c->loc);
		seen[dev] += b - a;
		a = b;
	}
	free(seen);
	if (c->Td == 0) /* a device without tokens sends nothing: owner out of range */
		dv = b2(c, MOE_OP_ADD, dv, ci(c, c->ep));
	*dest = dv;
	*loc = b2(c, MOE_OP_SUB, idx, sh);
}

/* The received rows as blocks of local experts; returns each row's grid row. */
static moe_id local_experts(ep *c, const ir_node *ex, const moe_id *s, moe_id xr, moe_id er, moe_id valid,
	moe_id *out)
{
	moe_graph *d = c->d;
	int64_t G = c->G, B = c->B, Ed = c->Ed;
	moe_id e = ir_b3(d, MOE_OP_SELECT, valid, er, ci(c, Ed), c->loc); /* padding: no expert */
	moe_id oh = moe_node_new(d, MOE_OP_ONE_HOT, &e, 1, c->loc);
	moe_node_set_int(d, oh, "n", Ed);
	IR_ASSERT(ir_infer(c->ctx, d, oh) == MOE_OK);
	moe_id cnt, boff;
	moe_id pos = group_pos(c, oh, Ed, B, &cnt, &boff);
	moe_node_set_name(d, pos, "grid_pos");
	moe_id nb = b2(c, MOE_OP_DIV, b2(c, MOE_OP_ADD, cnt, ci(c, B - 1)), ci(c, B));
	pass_blocks b = {.G = G, .B = B};
	b.nblocks = ir_b_reduce(d, MOE_OP_REDUCE_SUM, nb, 0, false, c->loc);
	moe_node_set_name(d, b.nblocks, "nblocks");
	moe_id boffr = reshape(c, boff, 2, 1, Ed, 0), bendr = reshape(c, b2(c, MOE_OP_ADD, boff, nb), 2, 1, Ed, 0);
	int64_t ge[2] = {G, Ed};
	moe_id gi = ir_b_iota(d, 2, ge, 0, c->loc), ei = ir_b_iota(d, 2, ge, 1, c->loc);
	moe_id owner = b2(c, MOE_OP_AND, b2(c, MOE_OP_LE, boffr, gi), b2(c, MOE_OP_LT, gi, bendr));
	moe_id fx[2] = {owner, ei};
	moe_id first = ir_b(d, MOE_OP_FILTER, fx, 2, c->loc);
	b.bexp = ir_b_reshape(d, ir_b_slice(d, first, 1, 0, 1, c->loc), 1, &G, c->loc);
	moe_node_set_name(d, b.bexp, "block_expert");
	moe_id rem = b2(c, MOE_OP_SUB, reshape(c, cnt, 2, 1, Ed, 0), b2(c, MOE_OP_MUL, b2(c, MOE_OP_SUB, gi, boffr), ci(c, B)));
	moe_id rr = ir_b3(d, MOE_OP_SELECT, owner, b2(c, MOE_OP_MIN, rem, ci(c, B)), ci(c, 0), c->loc);
	b.rows = ir_b_reduce(d, MOE_OP_REDUCE_SUM, rr, 1, false, c->loc);
	moe_node_set_name(d, b.rows, "block_rows");
	/* Padding rows land on a free grid row: the first row past a block's count
	 * (blocks past nblocks count 0 rows). One exists whenever there is padding:
	 * the valid rows number fewer than R <= G B (section 3), so some block is not
	 * full. The block math masks that row, and the grid is scatter(0, pos,
	 * gather(received, rows)) as one device's dispatch (the TCP lowering then
	 * gathers each block's rows from the received buffer in HBM). */
	moe_id slot = G == 1 ? b.rows /* (a one-element iota is an immediate on TCP) */
			     : b2(c, MOE_OP_ADD, b2(c, MOE_OP_MUL, ir_b_iota(d, 1, &G, 0, c->loc), ci(c, B)), b.rows);
	moe_id open_ = ir_b3(d, MOE_OP_SELECT, b2(c, MOE_OP_LT, b.rows, ci(c, B)), slot, ci(c, G * B - 1), c->loc);
	moe_id spare = ir_b_reduce(d, MOE_OP_REDUCE_MIN, open_, 0, false, c->loc);
	moe_id at = ir_b3(d, MOE_OP_SELECT, valid, pos, spare, c->loc);
	moe_id gr[2] = {xr, ir_b_iota(d, 1, &c->R, 0, c->loc)};
	moe_id sx[3] = {splat(c, c->t, 2, G * B, c->D, 0.0), at, ir_b(d, MOE_OP_GATHER, gr, 2, c->loc)};
	moe_id grid = ir_b(d, MOE_OP_SCATTER, sx, 3, c->loc);
	b.blocks = reshape(c, grid, 3, G, B, c->D);
	moe_node_set_name(d, b.blocks, "blocks");
	c->rows = b.rows, c->nblocks = b.nblocks, c->bexp = b.bexp;
	*out = reshape(c, c->loop ? pass_expert_loop(d, ex, s, &b) : pass_expert_ffn(d, ex, s, &b), 2, G * B, c->D, 0);
	return ir_b3(d, MOE_OP_SELECT, valid, pos, ci(c, 0), c->loc);
}

/* Each pair's returned row (at spos), weighted by wp (MOE_NONE: weighted on
 * the input), summed over k in f32 and rounded: in chunks of tokens when the
 * gathered rows would exceed 2^25 elements, as blockwise-dispatch's combine
 * (a row's result does not depend on the chunking). */
static moe_id combine(ep *c, moe_id back, moe_id spos, moe_id wp)
{
	moe_graph *d = c->d;
	int64_t per = c->K * c->D, fit = ((int64_t)1 << 25) / per > 0 ? ((int64_t)1 << 25) / per : 1;
	int64_t nch = (c->Tl + fit - 1) / fit;
	if (nch > 64)
		nch = 64; /* a node has at most 64 operands */
	int64_t step = (c->Tl + nch - 1) / nch;
	moe_id parts[64];
	uint32_t np = 0;
	for (int64_t t0 = 0; t0 < c->Tl; t0 += step) {
		int64_t t1 = t0 + step < c->Tl ? t0 + step : c->Tl, tc = t1 - t0;
		bool all = tc == c->Tl;
		moe_id gb[2] = {back, all ? spos : ir_b_slice(d, spos, 0, t0 * c->K, t1 * c->K, c->loc)};
		moe_id yp = ir_b_cast(d, ir_b(d, MOE_OP_GATHER, gb, 2, c->loc), MOE_F32, c->loc);
		if (wp != MOE_NONE)
			yp = b2(c, MOE_OP_MUL, yp, ir_b_cast(d, all ? wp : ir_b_slice(d, wp, 0, t0 * c->K, t1 * c->K, c->loc),
							    MOE_F32, c->loc));
		moe_id y = ir_b_reduce(d, MOE_OP_REDUCE_SUM, reshape(c, yp, 3, tc, c->K, c->D), 1, false, c->loc);
		parts[np++] = ir_b_cast(d, y, c->t, c->loc);
	}
	return np == 1 ? parts[0] : ir_b_concat(d, parts, np, 0, c->loc);
}

static moe_id lower(ep *c, const ir_node *ex, const moe_id *s)
{
	moe_graph *d = c->d;
	int64_t n = c->Tl * c->K, P = c->ep;
	moe_id idx = ir_b_reshape(d, s[EXP_IDX], 1, &n, c->loc), dest, loc;
	route(c, idx, &dest, &loc);
	moe_id ohd = moe_node_new(d, MOE_OP_ONE_HOT, &dest, 1, c->loc);
	moe_node_set_int(d, ohd, "n", P);
	IR_ASSERT(ir_infer(c->ctx, d, ohd) == MOE_OK);
	moe_id scount;
	moe_id spos = group_pos(c, ohd, P, 1, &scount, NULL);
	moe_node_set_name(d, scount, "send_counts");
	moe_node_set_name(d, spos, "send_pos");
	/* send buffers: each pair's row and local expert at spos */
	moe_id tok = b2(c, MOE_OP_DIV, ir_b_iota(d, 1, &n, 0, c->loc), ci(c, c->K));
	bool on_input = !strcmp(ir_attr_str(ex, "weight_on", "output"), "input");
	moe_id wp = reshape(c, s[EXP_W], 2, n, 1, 0);
	moe_id xs;
	if (on_input) {
		moe_id gx[2] = {s[EXP_X], tok};
		moe_id xp = ir_b(d, MOE_OP_GATHER, gx, 2, c->loc);
		xp = ir_b_cast(d, b2(c, MOE_OP_MUL, ir_b_cast(d, xp, MOE_F32, c->loc), ir_b_cast(d, wp, MOE_F32, c->loc)),
			c->t, c->loc);
		moe_id sx[3] = {splat(c, c->t, 2, n, c->D, 0.0), spos, xp};
		xs = ir_b(d, MOE_OP_SCATTER, sx, 3, c->loc);
	} else {
		/* spos is a bijection onto [0, n): send row spos[p] is x[tok[p]], so
		 * the buffer is one gather of x by the tokens scattered to their
		 * positions (the rows move once, not gathered and then scattered) */
		moe_id st[3] = {splat(c, MOE_I32, 1, n, 0, 0.0), spos, tok};
		moe_id gx[2] = {s[EXP_X], ir_b(d, MOE_OP_SCATTER, st, 3, c->loc)};
		xs = ir_b(d, MOE_OP_GATHER, gx, 2, c->loc);
	}
	moe_id se[3] = {splat(c, MOE_I32, 1, n, 0, 0.0), spos, loc};
	moe_id es = ir_b(d, MOE_OP_SCATTER, se, 3, c->loc);
	/* dispatch */
	moe_id rcount = reshape(c, exchange(c, reshape(c, scount, 2, P, 1, 0), splat(c, MOE_I32, 1, P, 0, 1.0), P,
					   "recv_counts"), 1, P, 0, 0);
	moe_id xr = exchange(c, xs, scount, c->R, "recv_rows");
	moe_id er = exchange(c, es, scount, c->R, "recv_experts");
	moe_id total = ir_b_reduce(d, MOE_OP_REDUCE_SUM, rcount, 0, false, c->loc);
	moe_id valid = b2(c, MOE_OP_LT, ir_b_iota(d, 1, &c->R, 0, c->loc), total);
	moe_id flat;
	moe_id at = local_experts(c, ex, s, xr, er, valid, &flat);
	moe_id ga[2] = {flat, at};
	moe_id yr = ir_b(d, MOE_OP_GATHER, ga, 2, c->loc);
	/* only the received rows go back: the rows past their count are not sent,
	 * so they are not gathered (valid: zeros there) */
	moe_node_set_valid(d, yr, total);
	IR_ASSERT(ir_infer(c->ctx, d, yr) == MOE_OK);
	/* return and combine, in the one-device program's order */
	moe_id back = exchange(c, yr, rcount, n, "returned_rows");
	return combine(c, back, spos, on_input ? MOE_NONE : wp);
}

/* Does n keep the expert dimension first (blockwise-dispatch's rule, a dequant, or a cast)? */
static bool keeps_expert_axis(const ir_node *n)
{
	return n->op == MOE_OP_DEQUANT || (n->op == MOE_OP_CAST && n->nargs == 1) || pass_keeps_expert_axis(n);
}

/* Marks the expert weights under v (through ops that keep the expert axis)
 * 2 and the ops between 1; false when something else carries experts. A
 * weight may stack its experts' rows ([E * F, D], reshaped to [E, F, D]). */
static bool mark(moe_graph *g, moe_id v, int64_t E, uint8_t *m)
{
	ir_node *n = N(g, v);
	if (n->op == MOE_OP_WEIGHT && n->rank >= 1 && n->shape[0] >= E && n->shape[0] % E == 0) {
		m[v] = 2;
		return true;
	}
	if (n->rank < 1 || n->shape[0] != E)
		return false;
	if (n->op == MOE_OP_RESHAPE) {
		const ir_node *a = N(g, n->args[0]);
		if (a->rank < 1 || a->shape[0] % E)
			return false;
	} else if (!keeps_expert_axis(n)) {
		return false;
	}
	m[v] = 1;
	for (uint32_t i = 0; i < n->nargs; i++)
		if (!mark(g, n->args[i], E, m))
			return false;
	return true;
}

/* Copies node i (marked by mark) for this device's Ed experts. */
static void copy_marked(rebuild *rb, const ep *c, moe_id i, uint8_t how)
{
	moe_id id = rebuild_copy(rb, i);
	ir_node *n = N(rb->dst, id);
	if (how == 2) { /* this device's experts only */
		n->shape[0] = n->shape[0] / c->E * c->Ed;
		moe_node_set_ints(rb->dst, id, "ep_experts", c->mine, (int)c->Ed);
		return;
	}
	if (n->op == MOE_OP_RESHAPE) {
		int64_t s[MOE_MAX_RANK];
		memcpy(s, n->shape, sizeof s);
		s[0] = c->Ed;
		moe_node_set_ints(rb->dst, id, "shape", s, n->rank);
	}
	IR_ASSERT(ir_infer(c->ctx, rb->dst, id) == MOE_OK);
}

static bool parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	long long x = v ? strtoll(v, &end, 10) : 0;
	if (!v || end == v || *end || x < lo || x > hi)
		return false;
	*out = x;
	return true;
}

/* placement: the device of each expert, "0.0.1.1" (E entries), or absent:
 * contiguous ranges, the first E mod N devices one expert more. */
static bool placement(moe_ctx *ctx, const char *pl, ep *c)
{
	if (!pl) {
		int64_t q = c->E / c->ep, r = c->E % c->ep;
		for (int64_t e = 0, dev = 0, left = q + (r > 0); e < c->E; e++) {
			while (left == 0)
				left = q + (++dev < r);
			c->owner[e] = (int32_t)dev;
			left--;
		}
	} else {
		const char *p = pl;
		for (int64_t e = 0; e < c->E; e++) {
			char *end;
			long v = strtol(p, &end, 10);
			if (end == p || v < 0 || v >= c->ep || (*end && *end != '.') || (e + 1 < c->E) != (*end == '.')) {
				moe_diag(ctx, MOE_DIAG_ERROR, c->loc,
					"expert-parallel: placement '%s' must give a device in 0..%lld for each of the %lld experts, "
					"separated by '.'", pl, (long long)c->ep - 1, (long long)c->E);
				return false;
			}
			c->owner[e] = (int32_t)v;
			p = *end ? end + 1 : end;
		}
	}
	int64_t *per = calloc((size_t)c->ep, sizeof *per);
	IR_ASSERT(per);
	for (int64_t e = 0; e < c->E; e++)
		per[c->owner[e]]++;
	bool ok = true;
	for (int64_t dev = 0; dev < c->ep && ok; dev++)
		if (!per[dev]) {
			moe_diag(ctx, MOE_DIAG_ERROR, c->loc, "expert-parallel: device %lld holds no expert (%lld experts over %lld "
				"devices)", (long long)dev, (long long)c->E, (long long)c->ep);
			ok = false;
		}
	free(per);
	c->Ed = 0;
	for (int64_t e = 0; e < c->E; e++)
		if (c->owner[e] == c->rank)
			c->mine[c->Ed++] = e;
	return ok;
}

/* Reads the options and the experts node's sizes; false after a diagnostic. */
static bool setup(moe_ctx *ctx, moe_graph *g, const ir_node *n, const moe_pass_opts *opts, ep *c)
{
	int64_t tokens = -1, loop = 0;
	const char *v;
	c->ep = 1;
	if (((v = moe_pass_opt(opts, "ep")) && !parse_int(v, 1, EP_MAX, &c->ep)) ||
		((v = moe_pass_opt(opts, "rank")) && !parse_int(v, 0, c->ep - 1, &c->rank)) ||
		((v = moe_pass_opt(opts, "tokens")) && !parse_int(v, 1, MOE_MAX_DIM, &tokens)) ||
		((v = moe_pass_opt(opts, "loop")) && !parse_int(v, 0, 1, &loop))) {
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "expert-parallel: ep must be 1..%d, rank 0..ep-1, tokens a positive "
			"count and loop 0 or 1", EP_MAX);
		return false;
	}
	c->loop = loop == 1;
	const ir_node *x = N(g, n->args[EXP_X]);
	c->loc = n->loc;
	c->t = (moe_dtype)x->dtype;
	c->Tl = x->shape[0];
	c->D = x->shape[1];
	c->K = N(g, n->args[EXP_IDX])->shape[1];
	c->E = N(g, n->args[EXP_UP])->shape[0];
	c->B = ir_attr_int(n, "block", 1);
	c->T = tokens > 0 ? tokens : c->Tl * c->ep;
	int64_t q = c->T / c->ep;
	c->Td = c->rank < c->ep - 1 ? q : c->T - q * (c->ep - 1);
	if (c->Tl != (c->Td ? c->Td : 1)) {
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "expert-parallel: device %lld of %lld holds %lld of the %lld tokens, but the "
			"layer has %lld rows (build it with T = %lld)", (long long)c->rank, (long long)c->ep, (long long)c->Td,
			(long long)c->T, (long long)c->Tl, (long long)(c->Td ? c->Td : 1));
		return false;
	}
	if (c->E < c->ep) {
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "expert-parallel: %lld experts cannot be spread over %lld devices",
			(long long)c->E, (long long)c->ep);
		return false;
	}
	c->owner = ctx_alloc(ctx, (size_t)c->E * sizeof *c->owner);
	c->mine = ctx_alloc(ctx, (size_t)c->E * sizeof *c->mine);
	if (!placement(ctx, moe_pass_opt(opts, "placement"), c))
		return false;
	c->Kd = c->K < c->Ed ? c->K : c->Ed;
	c->R = moe_ep_recv_rows_max(c->T, c->K, c->Ed);
	c->G = moe_ep_grid_blocks_max(c->T, c->K, c->Ed, c->B);
	int64_t cells;
	if (c->R < 0 || c->R > MOE_MAX_DIM || c->G < 0 || !ir_mul_ov(c->G, c->B, &cells) || !ir_mul_ov(cells, c->D, &cells)) {
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "expert-parallel: the receive buffers of this layer are too large");
		return false;
	}
	return true;
}

/* As moe_grid_blocks_max: an argument <= 0 gives 0, a bound beyond INT64_MAX -1. */
int64_t moe_ep_recv_rows_max(int64_t T, int64_t K, int64_t Ed)
{
	int64_t r;
	if (T <= 0 || K <= 0 || Ed <= 0)
		return 0;
	return ir_mul_ov(T, K < Ed ? K : Ed, &r) ? r : -1;
}

int64_t moe_ep_grid_blocks_max(int64_t T, int64_t K, int64_t Ed, int64_t B)
{
	if (T <= 0 || K <= 0 || Ed <= 0 || B <= 0)
		return 0;
	return moe_grid_blocks_max(T, K < Ed ? K : Ed, Ed, B);
}

static void record(moe_graph *d, const ep *c)
{
	ir_graph_set_attr_int(d, "ep", c->ep);
	ir_graph_set_attr_int(d, "ep_rank", c->rank);
	ir_graph_set_attr_int(d, "ep_tokens", c->T);
	ir_graph_set_attr_int(d, "ep_tokens_local", c->Td);
	ir_graph_set_attr_int(d, "ep_experts_local", c->Ed);
	ir_graph_set_attr_int(d, "ep_recv_rows_max", c->R);
	ir_graph_set_attr_int(d, "ep_grid_blocks_max", c->G);
	ir_graph_set_attr_int(d, "ep_recv_bytes_max", c->R * c->D * (int64_t)moe_dtype_size(c->t));
}

static void rewrite(moe_graph *g, moe_id ex, ep *c, const uint8_t *m);

PASS(pass_expert_parallel)
{
	(void)ud;
	moe_id ex = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_EXPERTS) {
			if (ex != MOE_NONE) {
				moe_diag(ctx, MOE_DIAG_ERROR, N(g, i)->loc, "expert-parallel: one experts(...) per layer");
				return MOE_ERR_UNSUPPORTED;
			}
			ex = i;
		}
	if (ex == MOE_NONE)
		return MOE_OK;
	ep c = {.ctx = ctx};
	moe_status st = setup(ctx, g, N(g, ex), opts, &c) ? MOE_OK : MOE_ERR_INVALID;
	size_t nn = g->nnodes; /* the rewrite replaces g's nodes */
	uint8_t *m = st == MOE_OK ? ctx_alloc(ctx, nn) : NULL;
	for (int k = EXP_GATE; st == MOE_OK && k < EXP_NSLOTS; k++) {
		moe_id a = N(g, ex)->args[k];
		if (a != MOE_NONE && !mark(g, a, c.E, m)) {
			moe_diag(ctx, MOE_DIAG_ERROR, N(g, a)->loc, "expert-parallel: expert operand %%%u is not a weight with "
				"the experts first (through slices, transposes or dequant)", a);
			st = MOE_ERR_UNSUPPORTED;
		}
	}
	if (st == MOE_OK)
		rewrite(g, ex, &c, m);
	if (m)
		ctx_free(ctx, m, nn);
	if (c.owner)
		ctx_free(ctx, c.owner, (size_t)c.E * sizeof *c.owner);
	if (c.mine)
		ctx_free(ctx, c.mine, (size_t)c.E * sizeof *c.mine);
	return st;
}

/* Rebuilds g with experts node ex replaced by device c's program. */
static void rewrite(moe_graph *g, moe_id ex, ep *c, const uint8_t *m)
{
	rebuild rb;
	rebuild_begin(&rb, g);
	c->d = rb.dst;
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (i != ex) {
			if (m[i])
				copy_marked(&rb, c, i, m[i]);
			else
				rebuild_copy(&rb, i);
			continue;
		}
		moe_id s[EXP_NSLOTS];
		for (int k = 0; k < EXP_NSLOTS; k++)
			s[k] = N(g, ex)->args[k] == MOE_NONE ? MOE_NONE : rb.map[N(g, ex)->args[k]];
		moe_id y = lower(c, N(g, ex), s);
		if (N(g, ex)->name)
			moe_node_set_name(rb.dst, y, N(g, ex)->name);
		rb.map[i] = y;
	}
	record(rb.dst, c);
	ir_graph_set_attr_int(rb.dst, IR_GK_MOE_BLOCK, c->B);
	ir_graph_set_attr_int(rb.dst, IR_GK_GRID_BLOCKS, c->G);
	rebuild_end(&rb);
}

/* all_to_all over one device: the first counts[0] rows stay, then zeros. */
PASS(pass_lower_exchange)
{
	(void)ud;
	(void)opts;
	bool any = false;
	for (moe_id i = 0; i < g->nnodes && !any; i++)
		any = N(g, i)->op == MOE_OP_ALL_TO_ALL;
	if (!any)
		return MOE_OK;
	rebuild rb;
	rebuild_begin(&rb, g);
	ep c = {.ctx = ctx, .d = rb.dst};
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_ALL_TO_ALL) {
			rebuild_copy(&rb, i);
			continue;
		}
		if (ir_attr_int(n, "ep", 1) != 1) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "lower-exchange: all_to_all over %lld devices needs an "
				"expert-parallel run (moec run --ep under mpirun; docs/expert-parallel.md)",
				(long long)ir_attr_int(n, "ep", 1));
			rebuild_abort(&rb);
			return MOE_ERR_UNSUPPORTED;
		}
		c.loc = n->loc;
		const ir_node *x = N(g, n->args[0]);
		moe_id xv = rb.map[n->args[0]];
		int64_t S = x->shape[0], R = n->shape[0];
		if (S == 0) { /* nothing to send: all zeros */
			xv = ir_emit(rb.dst, MOE_OP_CONST, (moe_dtype)n->dtype, n->rank, n->shape, NULL, 0, c.loc);
			moe_node_set_float(rb.dst, xv, "value", 0.0);
		} else { /* row r of x for r < S (rows past the count are zeroed below) */
			moe_id at = ir_b_iota(rb.dst, 1, &R, 0, c.loc);
			if (R > S)
				at = b2(&c, MOE_OP_MIN, at, ci(&c, S - 1));
			moe_id ga[2] = {xv, at};
			xv = ir_b(rb.dst, MOE_OP_GATHER, ga, 2, c.loc);
		}
		int64_t ms[MOE_MAX_RANK], ones[MOE_MAX_RANK];
		for (int k = 0; k < x->rank; k++)
			ms[k] = k ? 1 : R, ones[k] = 1;
		moe_id kept = ir_b_reshape(rb.dst, ir_b_slice(rb.dst, rb.map[n->args[1]], 0, 0, 1, c.loc), x->rank, ones,
			c.loc);
		moe_id keep = b2(&c, MOE_OP_LT, ir_b_iota(rb.dst, x->rank, ms, 0, c.loc), kept);
		moe_id zero = ir_b_const(rb.dst, (moe_dtype)x->dtype, 0.0, c.loc);
		moe_id y = ir_b3(rb.dst, MOE_OP_SELECT, keep, xv, zero, c.loc);
		if (n->name)
			moe_node_set_name(rb.dst, y, n->name);
		rb.map[i] = y;
	}
	rebuild_end(&rb);
	return MOE_OK;
}
