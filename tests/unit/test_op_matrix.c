/* The op x executor matrix (in the manner of ggml's test-backend-ops): every
 * op of moec/ops.def, on random shapes and dtypes drawn from a fixed seed,
 * is run by the four executors - the reference interpreter, the host backend
 * through LLVM and through C, and the TCP simulator - and each result is
 * compared with the interpreter's on the same random bindings.
 *
 * The host backend evaluates every op in the interpreter's order and
 * precision (docs/abi.md): its results must be equal bit for bit (any two
 * NaNs count as equal). The TCP simulator computes floats in f32 like the
 * interpreter but sums in its own order (tiles, fused einsum chains) and stores
 * bf16 operands of its matrix engine: float outputs must lie within 2e-2 x
 * max|y| + 1e-6 of the interpreter's, integer and bool outputs must be equal.
 *
 * The graph of an op is built from its shape rule alone, so a new op with an
 * existing rule (an elementwise op, say) is covered without an edit here.
 * The C engine, which runs the system compiler per layer, takes the first
 * seed only (scatter both: its mode alternates with the seed, so every
 * executor runs set and add; TCP's scatter is compared bit for bit too).
 * What an executor does not lower yet is listed in `gaps` below with the
 * diagnostic it must give instead (a clean error, never a crash or a
 * wrong result); a gap that starts passing is reported so that it is removed.
 * MOE_MATRIX_VERBOSE=1 prints one line per case, MOE_MATRIX_DUMP=1 the layer
 * of a failing one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interp/interp.h"
#include "ir/ir.h"
#include "moec/backend.h"
#include "moec/passes.h"
#include "moec/tcp.h"

enum { TRIALS = 2 };

typedef struct rng {
	uint64_t s;
	uint64_t seed; /* the case's seed: choices that must cover both sides alternate with it */
} rng;

static uint32_t rnd(rng *r, uint32_t n)
{
	r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(r->s >> 33) % n;
}

static moe_id input(moe_graph *g, const char *name, moe_dtype t, int rank, const int64_t *s)
{
	moe_id id = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, rank);
	moe_node_set_name(g, id, name);
	return id;
}

static moe_id weight(moe_graph *g, const char *name, moe_dtype t, int rank, const int64_t *s)
{
	moe_id id = moe_node_new(g, MOE_OP_WEIGHT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, rank);
	moe_node_set_name(g, id, name);
	moe_node_set_str(g, id, "source", name);
	return id;
}

/* A node of op over args with the attributes set by the caller afterwards. */
static moe_id node(moe_graph *g, moe_op op, const moe_id *args, uint32_t n)
{
	return moe_node_new(g, op, args, n, moe_loc_none());
}

static void infer(moe_graph *g, moe_id id)
{
	if (moe_node_infer(g, id) != MOE_OK) {
		moe_diag_print(g->ctx, stderr);
		fail_msg("op %s: the test built an ill-typed node", moe_op_name(moe_node_op(g, id)));
	}
}

static moe_dtype pick(rng *r, const moe_dtype *ts, int n)
{
	return ts[rnd(r, (uint32_t)n)];
}

static const moe_dtype FLOATS[] = {MOE_F32, MOE_BF16};
static const moe_dtype NUMS[] = {MOE_F32, MOE_BF16, MOE_I32};
static const moe_dtype INTS[] = {MOE_I32, MOE_BOOL};

/* A random shape of rank 1..3 with dims 1..9 (one of them at least 2). */
static int shape(rng *r, int64_t *s, int minrank)
{
	int rank = minrank + (int)rnd(r, (uint32_t)(4 - minrank));
	for (int i = 0; i < rank; i++)
		s[i] = 1 + rnd(r, 9);
	s[rank - 1] = 2 + rnd(r, 8);
	return rank;
}

static moe_id b_elem(moe_graph *g, moe_op op, rng *r)
{
	unsigned f = ir_ops[op].flags;
	int64_t s[MOE_MAX_RANK], sb[MOE_MAX_RANK];
	int rank = shape(r, s, 1);
	moe_dtype t = f & OPF_FLOAT ? pick(r, FLOATS, 2) : f & OPF_INT ? pick(r, INTS, 2) : pick(r, NUMS, 3);
	if (op == MOE_OP_SHL || op == MOE_OP_SHR || op == MOE_OP_SAR)
		t = MOE_I32;
	if (op == MOE_OP_NOT && rnd(r, 2))
		t = MOE_BOOL;
	if (ir_ops[op].rule == SHAPE_UNARY)
		return node(g, op, (moe_id[]){input(g, "x", t, rank, s)}, 1);
	/* b broadcasts: some dims 1, sometimes a lower rank */
	int rb = rank - (int)rnd(r, (uint32_t)rank);
	for (int i = 0; i < rb; i++)
		sb[i] = rnd(r, 3) ? s[rank - rb + i] : 1;
	moe_id a = input(g, "a", t, rank, s), b = input(g, "b", t, rb, sb);
	if (op == MOE_OP_DIV && t == MOE_I32) /* b | 1 is never 0: no division fault */
		b = ir_b2(g, MOE_OP_OR, b, ir_b_const(g, MOE_I32, 1, moe_loc_none()), moe_loc_none());
	if (ir_ops[op].rule == SHAPE_SELECT) {
		moe_id c = input(g, "c", MOE_BOOL, rb, sb);
		return node(g, op, (moe_id[]){c, a, b}, 3);
	}
	return node(g, op, (moe_id[]){a, b}, 2);
}

static moe_id b_leaf(moe_graph *g, moe_op op, rng *r)
{
	int64_t s[MOE_MAX_RANK];
	int rank = shape(r, s, 1);
	moe_dtype t = pick(r, NUMS, 3);
	moe_id x = input(g, "x", t, rank, s);
	moe_id id;
	switch (op) {
	case MOE_OP_INPUT: return ir_b1(g, MOE_OP_NEG, x, moe_loc_none());
	case MOE_OP_WEIGHT: id = weight(g, "w", t, rank, s); break;
	case MOE_OP_CONST: id = ir_b_const(g, t, t == MOE_I32 ? -3.0 : 0.375, moe_loc_none()); break;
	default: /* iota */
		id = ir_b_iota(g, rank, s, (int)rnd(r, (uint32_t)rank), moe_loc_none());
		if (t != MOE_I32)
			id = ir_b_cast(g, id, t, moe_loc_none());
		break;
	}
	return ir_b2(g, MOE_OP_ADD, x, id, moe_loc_none());
}

static moe_id b_cast(moe_graph *g, moe_op op, rng *r)
{
	static const moe_dtype all[] = {MOE_F32, MOE_BF16, MOE_I32, MOE_BOOL};
	int64_t s[MOE_MAX_RANK];
	int rank = shape(r, s, 1);
	moe_dtype from = pick(r, all, 4), to = pick(r, all, 4);
	if (op == MOE_OP_BITCAST) {
		from = rnd(r, 2) ? MOE_F32 : MOE_I32;
		to = from == MOE_F32 ? MOE_I32 : MOE_F32;
	}
	moe_id x = input(g, "x", from, rank, s);
	return op == MOE_OP_CAST ? ir_b_cast(g, x, to, moe_loc_none()) : ir_b_bitcast(g, x, to, moe_loc_none());
}

static moe_id b_axis_op(moe_graph *g, moe_op op, rng *r)
{
	int64_t s[MOE_MAX_RANK];
	int rank = shape(r, s, 1), ax = (int)rnd(r, (uint32_t)rank) - (rnd(r, 2) ? rank : 0);
	moe_dtype t = op == MOE_OP_SOFTMAX ? pick(r, FLOATS, 2) : pick(r, NUMS, 3);
	moe_id x = input(g, "x", t, rank, s);
	if (ir_ops[op].rule == SHAPE_REDUCE)
		return ir_b_reduce(g, op, x, ax, rnd(r, 2), moe_loc_none());
	moe_id id = node(g, op, &x, 1);
	moe_node_set_int(g, id, "axis", ax);
	if (op == MOE_OP_CUMSUM)
		moe_node_set_int(g, id, "exclusive", rnd(r, 2));
	return id;
}

static moe_id b_einsum(moe_graph *g, rng *r)
{
	static const char *const eqs[] = {"td,ed->te", "td,de->te", "btd,bde->bte", "td->dt", "td->t", "d,ed->e"};
	const char *eq = eqs[rnd(r, 6)];
	ir_einsum e;
	char msg[64];
	assert_true(ir_einsum_parse(eq, &e, msg, sizeof msg));
	int64_t dim[26];
	for (int i = 0; i < 26; i++)
		dim[i] = 1 + rnd(r, 9);
	moe_dtype t = pick(r, FLOATS, 2);
	moe_id args[2];
	for (int k = 0; k < e.nin; k++) {
		int64_t s[MOE_MAX_RANK];
		for (int i = 0; i < e.rank[k]; i++)
			s[i] = dim[e.in[k][i] - 'a'];
		args[k] = input(g, k ? "b" : "a", t, e.rank[k], s);
	}
	return ir_b_einsum(g, eq, args[0], e.nin > 1 ? args[1] : MOE_NONE, moe_loc_none());
}

static moe_id b_routing(moe_graph *g, moe_op op, rng *r)
{
	int64_t T = 1 + rnd(r, 6), E = 2 + rnd(r, 7), D = 1 + rnd(r, 8);
	moe_id id;
	switch (op) {
	case MOE_OP_TOPK:
		id = node(g, op, (moe_id[]){input(g, "x", pick(r, FLOATS, 2), 2, (int64_t[]){T, E})}, 1);
		moe_node_set_int(g, id, "k", 1 + rnd(r, (uint32_t)E));
		return id;
	case MOE_OP_ONE_HOT:
		id = node(g, op, (moe_id[]){input(g, "i", MOE_I32, 2, (int64_t[]){T, 2})}, 1);
		moe_node_set_int(g, id, "n", E);
		return id;
	case MOE_OP_FILTER:
		id = node(g, op,
			(moe_id[]){input(g, "m", pick(r, INTS, 2), 2, (int64_t[]){T, E}),
				input(g, "v", pick(r, NUMS, 3), 2, (int64_t[]){T, E})},
			2);
		moe_node_set_float(g, id, "fill", -1.5);
		return id;
	case MOE_OP_GATHER: {
		moe_id x = input(g, "x", pick(r, NUMS, 3), 2, (int64_t[]){E, D});
		return node(g, op, (moe_id[]){x, input(g, "i", MOE_I32, 2, (int64_t[]){T, 2})}, 2);
	}
	case MOE_OP_TAKE_ALONG: {
		moe_id x = input(g, "x", pick(r, NUMS, 3), 2, (int64_t[]){T, E});
		return node(g, op, (moe_id[]){x, input(g, "i", MOE_I32, 2, (int64_t[]){T, 1 + rnd(r, 4)})}, 2);
	}
	default: { /* scatter */
		moe_dtype t = pick(r, NUMS, 3);
		moe_id base = input(g, "x", t, 2, (int64_t[]){E, D});
		int64_t P = 1 + rnd(r, 5);
		moe_id i = input(g, "i", MOE_I32, 1, (int64_t[]){P}), src = input(g, "s", t, 2, (int64_t[]){P, D});
		id = node(g, op, (moe_id[]){base, i, src}, 3);
		moe_node_set_str(g, id, "mode", r->seed % 2 ? "set" : "add");
		return id;
	}
	}
}

static moe_id b_shape_op(moe_graph *g, moe_op op, rng *r)
{
	int64_t s[MOE_MAX_RANK];
	int rank = shape(r, s, 2);
	moe_dtype t = pick(r, NUMS, 3);
	moe_id x = input(g, "x", t, rank, s), id;
	int ax = (int)rnd(r, (uint32_t)rank);
	switch (op) {
	case MOE_OP_RESHAPE: {
		int64_t n = 1;
		for (int i = 0; i < rank; i++)
			n *= s[i];
		return ir_b_reshape(g, x, 1, &n, moe_loc_none());
	}
	case MOE_OP_SLICE: {
		int64_t start = rnd(r, (uint32_t)s[ax]), stop = start + 1 + rnd(r, (uint32_t)(s[ax] - start));
		id = ir_b_slice(g, x, ax, start, stop, moe_loc_none());
		moe_node_set_int(g, id, "step", 1 + rnd(r, 2));
		infer(g, id);
		return id;
	}
	case MOE_OP_CONCAT: {
		int64_t s2[MOE_MAX_RANK];
		memcpy(s2, s, sizeof s2);
		s2[ax] = 1 + rnd(r, 4);
		moe_id parts[3] = {x, input(g, "y", t, rank, s2), x};
		return ir_b_concat(g, parts, 2 + rnd(r, 2), ax, moe_loc_none());
	}
	default: { /* broadcast: x gets a leading dim and a 1 */
		int64_t to[MOE_MAX_RANK], from[MOE_MAX_RANK];
		to[0] = 2 + rnd(r, 3);
		for (int i = 0; i < rank; i++)
			to[i + 1] = s[i], from[i] = i == ax ? 1 : s[i];
		to[ax + 1] = 1 + rnd(r, 3);
		moe_id y = input(g, "y", t, rank, from);
		id = node(g, op, &y, 1);
		moe_node_set_ints(g, id, "shape", to, rank + 1);
		(void)x;
		return id;
	}
	}
}

/* dequant of a weight: fp8 blocks (odd seeds) or packed int4 groups. */
static moe_id b_dequant(moe_graph *g, rng *r)
{
	int64_t E = 1 + rnd(r, 3), N = 1 + rnd(r, 9), id;
	moe_id q, s;
	if (r->seed % 2) {
		int64_t K = 1 + rnd(r, 9), bn = 1 + rnd(r, 4), bk = 1 + rnd(r, 4);
		q = weight(g, "q", MOE_F8E4M3, 3, (int64_t[]){E, N, K});
		s = weight(g, "s", pick(r, FLOATS, 2), 3, (int64_t[]){E, (N + bn - 1) / bn, (K + bk - 1) / bk});
		id = node(g, MOE_OP_DEQUANT, (moe_id[]){q, s}, 2);
		moe_node_set_str(g, id, "format", "fp8");
		moe_node_set_ints(g, id, "block", (int64_t[]){bn, bk}, 2);
	} else {
		int64_t words = 1 + rnd(r, 3), bk = 8;
		q = weight(g, "q", MOE_I32, 3, (int64_t[]){E, N, words});
		s = weight(g, "s", pick(r, FLOATS, 2), 3, (int64_t[]){E, N, words * 8 / bk});
		id = node(g, MOE_OP_DEQUANT, (moe_id[]){q, s}, 2);
		moe_node_set_str(g, id, "format", "int4");
		moe_node_set_ints(g, id, "block", (int64_t[]){1, bk}, 2);
	}
	if (rnd(r, 2))
		moe_node_set_str(g, id, "to", "bf16");
	return id;
}

/* experts: x [T, D], idx [T, K] (distinct experts per row), w [T, K]. */
static moe_id b_experts(moe_graph *g, rng *r)
{
	static const char *const acts[] = {"swiglu", "geglu", "geglu_tanh", "gpt_oss", "none"};
	int64_t T = 1 + rnd(r, 6), D = 2 + rnd(r, 7), E = 2 + rnd(r, 4), K = 1 + rnd(r, (uint32_t)E), F = 2 + rnd(r, 7);
	moe_dtype t = r->seed % 2 ? MOE_F32 : MOE_BF16;
	moe_graph_set_dtype(g, t); /* the layer's compute type */
	const char *act = acts[rnd(r, 5)];
	bool gated = strcmp(act, "none") != 0;
	moe_id a[EXP_NSLOTS];
	a[EXP_X] = input(g, "x", t, 2, (int64_t[]){T, D});
	a[EXP_IDX] = input(g, "idx", MOE_I32, 2, (int64_t[]){T, K});
	a[EXP_W] = input(g, "w", t, 2, (int64_t[]){T, K});
	a[EXP_GATE] = gated ? weight(g, "gate", t, 3, (int64_t[]){E, F, D}) : MOE_NONE;
	a[EXP_UP] = weight(g, "up", t, 3, (int64_t[]){E, F, D});
	a[EXP_DOWN] = weight(g, "down", t, 3, (int64_t[]){E, D, F});
	a[EXP_B_GATE] = gated && rnd(r, 2) ? weight(g, "bg", t, 2, (int64_t[]){E, F}) : MOE_NONE;
	a[EXP_B_UP] = rnd(r, 2) ? weight(g, "bu", t, 2, (int64_t[]){E, F}) : MOE_NONE;
	a[EXP_B_DOWN] = rnd(r, 2) ? weight(g, "bd", t, 2, (int64_t[]){E, D}) : MOE_NONE;
	moe_id id = node(g, MOE_OP_EXPERTS, a, EXP_NSLOTS);
	moe_node_set_str(g, id, "act", act);
	moe_node_set_int(g, id, "block", 1 + rnd(r, 4));
	moe_node_set_str(g, id, "weight_on", rnd(r, 2) ? "input" : "output");
	return id;
}

/* all_to_all over one device (ep = 1): x [S, D], counts = [c] with c <= S
 * and c <= rows, so every executor keeps the first c rows (lower-exchange). */
static moe_id b_all_to_all(moe_graph *g, rng *r)
{
	int64_t S = 1 + rnd(r, 6), D = 1 + rnd(r, 5), rows = 1 + rnd(r, 8);
	int64_t c = rnd(r, (uint32_t)((S < rows ? S : rows) + 1));
	moe_id x = input(g, "x", pick(r, NUMS, 3), 2, (int64_t[]){S, D});
	moe_id k = ir_emit(g, MOE_OP_CONST, MOE_I32, 1, (int64_t[]){1}, NULL, 0, moe_loc_none());
	moe_node_set_float(g, k, "value", (double)c);
	moe_id id = node(g, MOE_OP_ALL_TO_ALL, (moe_id[]){x, k}, 2);
	moe_node_set_int(g, id, "ep", 1);
	moe_node_set_int(g, id, "rows", rows);
	return id;
}

static moe_id blockarg(moe_graph *g, const char *role, int index, moe_dtype t, int rank, const int64_t *s)
{
	moe_id id = moe_node_new(g, MOE_OP_BLOCKARG, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, rank);
	moe_node_set_str(g, id, "role", role);
	if (index >= 0)
		moe_node_set_int(g, id, "index", index);
	return id;
}

/* block_loop (and its blockarg): G blocks of B rows, the rows of a
 * [G, B, D] operand (kind b) times the block expert's [O, D] weight plus
 * its [O] bias (e), under each block's valid rows; the blocks past nblocks
 * (zero) have no rows, as flatten-blocks needs. */
static moe_id b_block_loop(moe_graph *g, rng *r)
{
	moe_loc nl = moe_loc_none();
	int64_t G = 1 + rnd(r, 4), B = 1 + rnd(r, 3), E = 1 + rnd(r, 4), D = 1 + rnd(r, 6), O = 1 + rnd(r, 5);
	moe_dtype t = pick(r, FLOATS, 2);
	moe_id nb = ir_b_const(g, MOE_I32, (double)rnd(r, (uint32_t)G + 1), nl);
	/* experts from an input (clamped into range), so the weight gathers are not weight-only values */
	moe_id pick_e = input(g, "experts", MOE_I32, 1, &G);
	moe_id bexp = ir_b2(g, MOE_OP_MIN, ir_b2(g, MOE_OP_MAX, pick_e, ir_b_const(g, MOE_I32, 0, nl), nl),
		ir_b_const(g, MOE_I32, (double)(E - 1), nl), nl);
	moe_id r0 = ir_b_const(g, MOE_I32, (double)rnd(r, (uint32_t)B + 1), nl);
	moe_id rows = ir_b3(g, MOE_OP_SELECT, ir_b2(g, MOE_OP_LT, ir_b_iota(g, 1, &G, 0, nl), nb, nl), r0,
		ir_b_const(g, MOE_I32, 0, nl), nl);
	moe_id x = input(g, "x", t, 3, (int64_t[]){G, B, D});
	moe_id w = weight(g, "w", t, 3, (int64_t[]){E, O, D});
	moe_id bias = weight(g, "bias", t, 2, (int64_t[]){E, O});
	moe_id id = node(g, MOE_OP_BLOCK_LOOP, (moe_id[]){nb, bexp, rows, x, w, bias}, 6);
	moe_node_set_str(g, id, "kinds", "bee");
	uint32_t bi;
	moe_graph *body = ir_body_new(g, &bi);
	N(g, id)->body = bi;
	moe_id br = blockarg(body, "rows", -1, MOE_I32, 0, NULL);
	moe_id bx = blockarg(body, "in", 0, t, 2, (int64_t[]){B, D});
	moe_id bw = blockarg(body, "in", 1, t, 2, (int64_t[]){O, D});
	moe_id bb = ir_b_reshape(body, blockarg(body, "in", 2, t, 1, &O), 2, (int64_t[]){1, O}, nl);
	moe_id h = node(body, MOE_OP_EINSUM, (moe_id[]){bx, bw}, 2);
	moe_node_set_str(body, h, "eq", "bd,od->bo");
	moe_node_set_valid(body, h, br);
	infer(body, h);
	moe_id y = node(body, MOE_OP_ADD, (moe_id[]){h, bb}, 2);
	moe_node_set_valid(body, y, br);
	infer(body, y);
	moe_graph_add_output(body, y);
	return id;
}

/* One layer exercising op, deterministic in seed. */
static moe_module *build(moe_ctx *ctx, moe_op op, uint64_t seed)
{
	rng r = {seed * 0x9e3779b97f4a7c15ull + (uint64_t)op, seed};
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, moe_op_name(op));
	moe_id y;
	switch (op == MOE_OP_BLOCKARG ? SHAPE_BLOCK_LOOP : ir_ops[op].rule) {
	case SHAPE_LEAF: y = b_leaf(g, op, &r); break;
	case SHAPE_UNARY:
	case SHAPE_BINARY:
	case SHAPE_SELECT: y = b_elem(g, op, &r); break;
	case SHAPE_CAST:
	case SHAPE_BITCAST: y = b_cast(g, op, &r); break;
	case SHAPE_REDUCE:
	case SHAPE_SOFTMAX:
	case SHAPE_CUMSUM: y = b_axis_op(g, op, &r); break;
	case SHAPE_EINSUM: y = b_einsum(g, &r); break;
	case SHAPE_TOPK:
	case SHAPE_ONE_HOT:
	case SHAPE_FILTER:
	case SHAPE_GATHER:
	case SHAPE_TAKE_ALONG:
	case SHAPE_SCATTER: y = b_routing(g, op, &r); break;
	case SHAPE_RESHAPE:
	case SHAPE_SLICE:
	case SHAPE_CONCAT:
	case SHAPE_BROADCAST: y = b_shape_op(g, op, &r); break;
	case SHAPE_EXPERTS: y = b_experts(g, &r); break;
	case SHAPE_DEQUANT: y = b_dequant(g, &r); break;
	case SHAPE_ALL_TO_ALL: y = b_all_to_all(g, &r); break;
	case SHAPE_BLOCK_LOOP: y = b_block_loop(g, &r); break;
	default: fail_msg("op %s: no graph builder for its shape rule", moe_op_name(op)); return NULL;
	}
	infer(g, y);
	moe_graph_add_output(g, y);
	if (moe_graph_verify(ctx, g) != MOE_OK) {
		moe_diag_print(ctx, stderr);
		fail_msg("op %s: the test built an invalid layer", moe_op_name(op));
	}
	return m;
}

static double elem(const moe_tensor *t, int64_t i)
{
	switch (t->dtype) {
	case MOE_F32: return ((const float *)t->data)[i];
	case MOE_BF16: return moe_bf16_to_f32(((const uint16_t *)t->data)[i]);
	case MOE_I32: return ((const int32_t *)t->data)[i];
	default: return ((const uint8_t *)t->data)[i];
	}
}

/* Compares got with want: bitwise (NaN == NaN) when tol < 0, else floats
 * within tol x max|want| + 1e-6 and other types exactly. */
static bool same(const moe_tensor *want, const moe_tensor *got, double tol, char *why, size_t len)
{
	if (got->dtype != want->dtype || got->nbytes != want->nbytes) {
		snprintf(why, len, "type or size differs");
		return false;
	}
	int64_t n = moe_tensor_numel(want);
	bool fl = moe_dtype_is_float(want->dtype);
	double ymax = 0;
	for (int64_t i = 0; fl && i < n; i++)
		if (isfinite(elem(want, i)))
			ymax = fmax(ymax, fabs(elem(want, i)));
	size_t es = moe_dtype_size(want->dtype);
	for (int64_t i = 0; i < n; i++) {
		double a = elem(want, i), b = elem(got, i);
		bool eq;
		if (fl && (isnan(a) || isnan(b)))
			eq = isnan(a) && isnan(b);
		else if (fl && tol >= 0)
			eq = a == b || fabs(a - b) <= tol * ymax + 1e-6;
		else
			eq = !memcmp((const char *)want->data + (size_t)i * es, (const char *)got->data + (size_t)i * es, es);
		if (!eq) {
			snprintf(why, len, "element %lld: %.9g vs %.9g (max|y| %g)", (long long)i, a, b, ymax);
			return false;
		}
	}
	return true;
}

/* tcp: moe_tcp_compile (the schedule compiler) after the tcp pipeline */
typedef enum exec { EX_LLVM, EX_C, EX_TCP, EX_COUNT } exec;
static const char *const exec_names[EX_COUNT] = {"host-llvm", "host-c", "tcp"};

/* Known gaps: (op, executor, seed) must fail with a diagnostic containing msg
 * (the last row is a terminator that matches nothing). None today: every
 * executor runs every op (the schedule compiler's list: docs/tcp-compiler.md
 * 5.1). */
static const struct gap {
	moe_op op;
	exec ex;
	uint64_t seed;
	const char *msg;
} gaps[] = {
	{MOE_OP_COUNT, EX_COUNT, 0, NULL},
};

static const struct gap *find_gap(moe_op op, exec ex, uint64_t seed)
{
	for (size_t i = 0; i < sizeof gaps / sizeof *gaps; i++)
		if (gaps[i].msg && gaps[i].op == op && gaps[i].ex == ex && gaps[i].seed == seed)
			return &gaps[i];
	return NULL;
}

static bool has_diag(moe_ctx *ctx, const char *msg)
{
	for (size_t i = 0; i < moe_diag_count(ctx); i++) {
		const char *m;
		moe_diag_get(ctx, i, NULL, NULL, &m);
		if (strstr(m, msg))
			return true;
	}
	return false;
}

/* Runs the layer of m (lowered by the executor's pipeline) on exec. */
static moe_status run_on(moe_ctx *ctx, exec ex, moe_module *m, const moe_tensor_map *bind, moe_tensor **out)
{
	moe_status st = moe_run_pipeline_text(ctx, ex == EX_TCP ? "tcp" : "host", m, NULL);
	if (st != MOE_OK)
		return st;
	moe_graph *g = moe_module_graph(m, 0);
	if (ex != EX_TCP)
		return moe_host_run(ctx, g, bind, ex == EX_LLVM ? MOE_HOST_LLVM : MOE_HOST_C, 1, out, NULL);
	moe_tcp_program *p = moe_tcp_compile(ctx, g, NULL);
	if (!p)
		return MOE_ERR_INVALID;
	moe_tcp_stats stats;
	moe_tcp_run_opts ro = {0};
	st = moe_tcp_run(ctx, p, bind, &ro, out, &stats);
	moe_tcp_program_free(p);
	return st;
}

static void check_case(moe_op op, uint64_t seed, int *failures, int *passed)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *ref = build(ctx, op, seed);
	moe_graph *g = moe_module_graph(ref, 0);
	moe_tensor_map *bind = NULL;
	assert_int_equal(ir_interp_random_bindings(ctx, g, seed, &bind), MOE_OK);
	moe_tensor *want[1] = {NULL};
	if (moe_interp_run(ctx, g, bind, want) != MOE_OK) {
		moe_diag_print(ctx, stderr);
		fail_msg("op %s seed %llu: the interpreter failed", moe_op_name(op), (unsigned long long)seed);
	}
	for (int ex = 0; ex < EX_COUNT; ex++) {
		/* scatter's mode alternates with the seed (set, add): C takes both */
		if ((ex == EX_C && seed > 1 && op != MOE_OP_SCATTER))
			continue;
		moe_module *m = build(ctx, op, seed);
		moe_tensor *got[1] = {NULL};
		char why[160] = "";
		moe_status st = run_on(ctx, (exec)ex, m, bind, got);
		/* scatter adds in the reference's order on TCP too (backend-tcp/compiler/recipe_route.c): bitwise */
		double tol = ex == EX_TCP && op != MOE_OP_SCATTER ? 2e-2 : -1;
		bool ok = st == MOE_OK && same(want[0], got[0], tol, why, sizeof why);
		const struct gap *gp = find_gap(op, (exec)ex, seed);
		if (gp && ok) {
			printf("note: %s on %s (seed %llu) passes now: remove it from the gaps\n", moe_op_name(op),
				exec_names[ex], (unsigned long long)seed);
		} else if (gp && (st == MOE_OK || !has_diag(ctx, gp->msg))) {
			moe_diag_print(ctx, stderr);
			fprintf(stderr, "FAIL %s on %s (seed %llu): expected the error '%s'\n", moe_op_name(op),
				exec_names[ex], (unsigned long long)seed, gp->msg);
			++*failures;
		} else if (!ok && !gp) {
			if (st != MOE_OK)
				snprintf(why, sizeof why, "%s", moe_status_string(st));
			moe_diag_print(ctx, stderr);
			fprintf(stderr, "FAIL %s on %s (seed %llu, %s): %s\n", moe_op_name(op), exec_names[ex],
				(unsigned long long)seed, moe_dtype_name(moe_node_dtype(g, g->outputs[0])), why);
			++*failures;
			if (getenv("MOE_MATRIX_DUMP"))
				moe_module_print(ref, stderr);
		} else if (ok) {
			passed[ex]++;
		}
		if ((ok || gp) && getenv("MOE_MATRIX_VERBOSE")) {
			printf("%s %-12s %-10s seed %llu %s\n", gp ? "gap" : "ok ", moe_op_name(op), exec_names[ex],
				(unsigned long long)seed, moe_dtype_name(moe_node_dtype(g, g->outputs[0])));
		}
		moe_diag_clear(ctx);
		moe_tensor_free(ctx, got[0]);
		moe_module_free(m);
	}
	moe_tensor_free(ctx, want[0]);
	moe_tensor_map_free(bind);
	moe_module_free(ref);
	moe_ctx_free(ctx);
}

/* Whether every seed of (op, executor) is a known gap (checked to fail as listed). */
static bool gap_every_seed(moe_op op, exec ex)
{
	for (uint64_t seed = 1; seed <= TRIALS; seed++)
		if (!find_gap(op, ex, seed))
			return false;
	return true;
}

static void test_every_op_on_every_executor(void **st)
{
	(void)st;
	int failures = 0, unrun = 0;
	for (int op = 0; op < MOE_OP_COUNT; op++) {
		int passed[EX_COUNT] = {0};
		for (uint64_t seed = 1; seed <= TRIALS; seed++)
			check_case((moe_op)op, seed, &failures, passed);
		for (int ex = 0; ex < EX_COUNT; ex++)
			if (!passed[ex] && !gap_every_seed((moe_op)op, (exec)ex)) {
				fprintf(stderr, "FAIL %s never ran on %s\n", moe_op_name((moe_op)op), exec_names[ex]);
				unrun++;
			}
	}
	assert_int_equal(failures, 0);
	assert_int_equal(unrun, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_op_on_every_executor),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
