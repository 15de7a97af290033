/* backend-tcp/compiler/gpass/plan_fusion.c: the `tcp-plan-fusion` pass, the last pass of
 * the TCP target's graph passes (registered with the others by
 * moe_tcp_register_passes, gpass.c).
 *
 * The pass records the schedule compiler's fusion groups on the nodes
 * (ir/graph_keys.h: tcp_fuse, and tcp_view on the casts of a widened
 * einsum), read by recipe_vec.c, recipe_reduce.c and recipe_contract.c, plus
 * the graph attribute tcp_fusion_plan, the fingerprint of the machine facts
 * the rule read. One rule for every graph, with a block loop or without
 * (a routing-only layer, a single op). It changes no value. It runs after
 * every structural tcp-* pass, so no later rewrite renumbers the graph under
 * its marks; a structural pass run after it sets tcp_fusion_plan back to 0.
 * moe_tcp_compile plans again, on a copy, for its machine (gpass.c). */
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "ir/graph_keys.h"
#include "passes/pass.h"

/* The machine facts the rule reads: the float ALUs a vector pass can chain
 * on (tcp_vec_chain_ok); nonzero. */
static int64_t fingerprint(const moe_tcp_machine *m)
{
	return (m->float_alus & 0xffffff) * 2 + 1;
}

static bool is_reduce(const ir_node *n)
{
	return n->op == MOE_OP_REDUCE_SUM || n->op == MOE_OP_REDUCE_MAX || n->op == MOE_OP_REDUCE_MIN;
}

/* Sets key on node i to v, or back to none where an earlier run left it. */
static void set_mark(moe_graph *g, moe_id i, const char *key, int64_t v, int64_t none)
{
	if (v != none || ir_attr_find(N(g, i), key))
		moe_node_set_int(g, i, key, v);
}

/* ---- the rule ----
 *
 * In a graph (the top graph, with or without a block loop, and each loop
 * body apart), an elementwise node of dtype f32, i32 or bool, unmasked (in a
 * body: masked by the block's rows, sched_mask_ok), read once, by an
 * elementwise node of its shape or by a reduce of it, and not an output, is
 * computed inside its reader's vector pass (sched-build's
 * recipe_vec.c and recipe_reduce.c read the marks): its steps first, its
 * result the chain's running value v, the lane word its own commit would
 * have stored. A reader takes one such operand (either operand of a binary
 * op, the first of a unary op, a cast, a select or a reduce), so a group is
 * a linear chain; it is formed only where its steps keep the vector
 * engine's stage order (tcp_vec_chain_ok) and the pass fetches at most
 * three streams. A select whose condition chains into it may also take one
 * of its two values from a side chain (side_pass below). The groups are
 * numbered from 0 in the order of their last node and recorded as
 * tcp_fuse = k on each of their nodes. */

/* which operands of u can be the running value v (bit k: operand k) */
static unsigned sched_chain_operands(const ir_node *u)
{
	switch ((moe_op)u->op) {
	case MOE_OP_ADD: case MOE_OP_SUB: case MOE_OP_MUL: case MOE_OP_DIV: case MOE_OP_MIN: case MOE_OP_MAX:
	case MOE_OP_AND: case MOE_OP_OR: case MOE_OP_XOR: case MOE_OP_SHL: case MOE_OP_SHR: case MOE_OP_SAR:
	case MOE_OP_EQ: case MOE_OP_NE: case MOE_OP_LT: case MOE_OP_LE: case MOE_OP_GT: case MOE_OP_GE: return 3;
	case MOE_OP_NEG: case MOE_OP_EXP: case MOE_OP_LOG: case MOE_OP_SQRT: case MOE_OP_TANH:
	case MOE_OP_ERF: case MOE_OP_SIGMOID: case MOE_OP_RSQRT: case MOE_OP_NOT: case MOE_OP_CAST: case MOE_OP_BITCAST:
	case MOE_OP_SELECT: case MOE_OP_REDUCE_SUM: case MOE_OP_REDUCE_MAX: case MOE_OP_REDUCE_MIN: return 1;
	case MOE_OP_ABS: return moe_dtype_is_float((moe_dtype)u->dtype) ? 1 : 0; /* an integer abs reads its operand twice */
	default: return 0;
	}
}

/* A mask a group may carry: none, or in a loop body the block's rows (the
 * group's pass commits under them; its members' values are read by the chain
 * alone, so their rows past the count are never seen). */
static bool sched_mask_ok(const moe_graph *g, const ir_node *n)
{
	if (n->valid == MOE_NONE)
		return true;
	const ir_node *v = N(g, n->valid);
	return g->is_body && v->op == MOE_OP_BLOCKARG && ir_blockarg_role_of(v) == IR_BA_ROWS;
}

static bool sched_elem(const moe_graph *g, moe_id i)
{
	const ir_node *n = N(g, i);
	return (ir_ops[n->op].flags & OPF_ELEM) && !(ir_ops[n->op].flags & OPF_LEAF) && n->op != MOE_OP_CONST &&
	       n->op != MOE_OP_IOTA && n->rank >= 1 && sched_mask_ok(g, n) && sched_chain_operands(n);
}

static bool sched_is_reduce(const moe_graph *g, moe_id i)
{
	const ir_node *n = N(g, i);
	return is_reduce(n) && n->valid == MOE_NONE && N(g, n->args[0])->rank >= 1;
}

/* The steps recipe_vec.c gives u (fused: operand 0 is the running value v; tag:
 * v ends in a compare, whose tag a select reads), as vector ops; -1: none. */
static int sched_vops(const moe_graph *g, const ir_node *u, bool fused, bool tag, uint8_t *ops)
{
	moe_dtype at = (moe_dtype)N(g, u->args[0])->dtype, to = (moe_dtype)u->dtype;
	bool fl = moe_dtype_is_float(at), tf = moe_dtype_is_float(to);
	const ir_node *a0 = N(g, u->args[0]);
	bool lit = !fused && (a0->op == MOE_OP_CONST || a0->op == MOE_OP_IOTA); /* an immediate or the counter */
	switch ((moe_op)u->op) {
	case MOE_OP_ADD: ops[0] = fl ? TCP_V_FADD : TCP_V_IADD; return 1;
	case MOE_OP_SUB: ops[0] = fl ? TCP_V_FSUB : TCP_V_ISUB; return 1;
	case MOE_OP_MUL: ops[0] = fl ? TCP_V_FMUL : TCP_V_IMUL; return 1;
	case MOE_OP_DIV: ops[0] = fl ? TCP_V_FDIV : TCP_V_IDIV; return 1;
	case MOE_OP_MIN: ops[0] = fl ? TCP_V_FMIN : TCP_V_IMIN; return 1;
	case MOE_OP_MAX: ops[0] = fl ? TCP_V_FMAX : TCP_V_IMAX; return 1;
	case MOE_OP_AND: ops[0] = TCP_V_AND; return 1;
	case MOE_OP_OR: ops[0] = TCP_V_OR; return 1;
	case MOE_OP_XOR: case MOE_OP_NOT: ops[0] = TCP_V_XOR; return 1;
	case MOE_OP_SHL: ops[0] = TCP_V_SHL; return 1;
	case MOE_OP_SHR: ops[0] = TCP_V_SHR; return 1;
	case MOE_OP_SAR: ops[0] = TCP_V_SAR; return 1;
	case MOE_OP_EQ: ops[0] = fl ? TCP_V_FTEQ : TCP_V_TEQ; return 1;
	case MOE_OP_NE: ops[0] = fl ? TCP_V_FTNE : TCP_V_TNE; return 1;
	case MOE_OP_LT: ops[0] = fl ? TCP_V_FTLT : TCP_V_TLT; return 1;
	case MOE_OP_LE: ops[0] = fl ? TCP_V_FTLE : TCP_V_TLE; return 1;
	case MOE_OP_GT: ops[0] = fl ? TCP_V_FTGT : TCP_V_TGT; return 1;
	case MOE_OP_GE: ops[0] = fl ? TCP_V_FTGE : TCP_V_TGE; return 1;
	case MOE_OP_NEG: ops[0] = fl ? TCP_V_FNEG : TCP_V_ISUB; return 1;
	case MOE_OP_ABS: ops[0] = fl ? TCP_V_FABS : TCP_V_ISUB, ops[1] = TCP_V_IMAX; return fl ? 1 : 2;
	case MOE_OP_EXP: ops[0] = TCP_V_FEXP; return 1;
	case MOE_OP_LOG: ops[0] = TCP_V_FLOG; return 1;
	case MOE_OP_SQRT: ops[0] = TCP_V_FSQRT; return 1;
	case MOE_OP_TANH: ops[0] = TCP_V_FTANH; return 1;
	case MOE_OP_ERF: ops[0] = TCP_V_FERF; return 1;
	case MOE_OP_SIGMOID: ops[0] = TCP_V_FSIGM; return 1;
	case MOE_OP_RSQRT: ops[0] = TCP_V_FSQRT, ops[1] = TCP_V_FDIV; return 2;
	case MOE_OP_SELECT:
		if (fused && tag)
			return ops[0] = TCP_V_MERGE, 1;
		ops[0] = at == MOE_BOOL || !fl ? TCP_V_TNE : TCP_V_FTNE, ops[1] = TCP_V_MERGE;
		return 2;
	case MOE_OP_CAST:
		if (to == MOE_BOOL && at != MOE_BOOL)
			return ops[0] = fl ? TCP_V_FTNE : TCP_V_TNE, 1;
		if (fl != tf)
			return ops[0] = fl ? TCP_V_FTOI : TCP_V_ITOF, 1;
		return lit ? (ops[0] = TCP_V_OR, 1) : 0;
	case MOE_OP_BITCAST: return lit ? (ops[0] = TCP_V_OR, 1) : 0;
	case MOE_OP_REDUCE_SUM: ops[0] = fl ? TCP_V_FRSUM : TCP_V_RSUM; return 1;
	case MOE_OP_REDUCE_MAX: ops[0] = fl ? TCP_V_FRMAX : TCP_V_RMAX; return 1;
	case MOE_OP_REDUCE_MIN: ops[0] = fl ? TCP_V_FRMIN : TCP_V_RMIN; return 1;
	default: return -1;
	}
}

/* streams u's own pass may fetch besides the running value (skip: the operand
 * that is v, or -1): every operand but a constant, a second constant too */
static int sched_streams(const moe_graph *g, const ir_node *u, int skip)
{
	int ns = 0, nc = 0;
	for (uint32_t k = 0; k < u->nargs; k++) {
		if ((int)k == skip)
			continue;
		if (N(g, u->args[k])->op == MOE_OP_CONST)
			nc++;
		else
			ns++;
	}
	return ns + (nc > 1 ? nc - 1 : 0);
}

/* the ops of the chain ch[0..n) (ch[0] unfused, each later one reading the
 * previous as v) into ops; -1 when a node has none or they exceed the pass */
static int sched_chain_ops(const moe_graph *g, const moe_id *ch, int n, uint8_t *ops)
{
	int len = 0;
	for (int j = 0; j < n; j++) {
		uint8_t o[4];
		bool tag = len > 0 && tcp_vop_stage[ops[len - 1]] == TCP_ST_TAG;
		int c = sched_vops(g, N(g, ch[j]), j > 0, tag, o);
		if (c < 0 || len + c > TCP_MAXSTEP)
			return -1;
		memcpy(ops + len, o, (size_t)c);
		len += c;
	}
	return len;
}

/* A cast of a bf16 value to f32, unmasked, not an output, read only by f32
 * contractions both of whose operands are such casts (widened einsums: each
 * product of two bf16 values is exact in f32, so contracting the bf16 values
 * into the f32 accumulator gives the f32 contraction's sums; docs/tcp-isa.md
 * 7.2): a view, its source the contractions' operand (tcp_view = 1, read by
 * recipe_contract.c). */
static bool widened_operand(const moe_graph *g, moe_id i)
{
	const ir_node *n = N(g, i);
	return n->op == MOE_OP_CAST && n->dtype == MOE_F32 && n->valid == MOE_NONE && N(g, n->args[0])->dtype == MOE_BF16;
}

static bool widened_einsum(const moe_graph *g, const ir_node *u)
{
	return u->op == MOE_OP_EINSUM && u->dtype == MOE_F32 && u->nargs == 2 && u->args[0] != u->args[1] &&
	       widened_operand(g, u->args[0]) && widened_operand(g, u->args[1]);
}

static bool widening_cast(const moe_graph *g, moe_id i)
{
	if (!widened_operand(g, i))
		return false;
	for (uint32_t o = 0; o < g->nout; o++)
		if (g->outputs[o] == i)
			return false;
	uint32_t readers = 0;
	for (moe_id u = i + 1; u < g->nnodes; u++) {
		const ir_node *un = N(g, u);
		bool reads = un->valid == i;
		for (uint32_t k = 0; k < un->nargs; k++)
			reads |= un->args[k] == i;
		if (reads && !widened_einsum(g, un))
			return false;
		readers += reads;
	}
	return readers > 0;
}

/* ---- a select's side chain ----
 *
 * A select s whose condition chains into it (the chain's last step, a compare,
 * sets the tag; otherwise the select's own t.ne does) may compute one of its
 * two values in the same pass: a side chain q_1 .. q_m of elementwise nodes
 * of s's shape and mask, f32, i32 or bool, each read once, by the next (q_m
 * by s), linked as a linear group is (prev), s's side[s] = q_m. Its steps
 * run after the condition's and before the merge: the first reads no
 * running value (v is the tag then) and has a step, v after the last is
 * q_m's value, and the merge takes v for it. Leading lane-word views
 * without a step (tcp_lane_src) are no steps: the first node with one reads
 * their source's stream. The tag stays the condition's:
 * the steps keep the stage order, so none after the condition's is a second
 * tag step. Streams: a side operand (or s's other value) that is, through
 * lane-word views (tcp_lane_src), an operand the chain before s fetches with
 * the pass's rank reads that stream; a side chain's iotas read the loop
 * counter where no node before s reads an iota and they share one axis.
 * recipe_vec.c builds the pass the same way. */

moe_id tcp_lane_src(const moe_graph *g, moe_id id)
{
	const ir_node *n = N(g, id);
	if (n->nargs != 1 || n->valid != MOE_NONE)
		return MOE_NONE;
	moe_dtype t = (moe_dtype)n->dtype, a = (moe_dtype)N(g, n->args[0])->dtype;
	bool w32 = (t == MOE_F32 || t == MOE_I32) && (a == MOE_F32 || a == MOE_I32);
	if ((n->op == MOE_OP_BITCAST && w32) || (n->op == MOE_OP_CAST && t == MOE_F32 && a == MOE_BF16))
		return n->args[0];
	return MOE_NONE;
}

typedef struct plan {
	const moe_graph *g;
	const uint32_t *nuse;
	moe_id *user, *prev, *side;
} plan;

#define GROUP_CAP (2 * TCP_MAXSTEP + 4)

/* the nodes of the chain ending at x, first to last, through prev; -1: too long */
static int chain_back(const plan *P, moe_id x, moe_id *ch)
{
	int n = 0;
	for (; x != MOE_NONE; x = P->prev[x]) {
		if (n == GROUP_CAP)
			return -1;
		ch[n++] = x;
	}
	for (int i = 0; i < n / 2; i++) {
		moe_id t = ch[i];
		ch[i] = ch[n - 1 - i], ch[n - 1 - i] = t;
	}
	return n;
}

/* a constant or an iota, or a view (reshape, slice, broadcast) of one: an
 * immediate or the counter, not a stream */
static bool imm_like(const moe_graph *g, moe_id y)
{
	while (N(g, y)->op == MOE_OP_RESHAPE || N(g, y)->op == MOE_OP_SLICE || N(g, y)->op == MOE_OP_BROADCAST)
		y = N(g, y)->args[0];
	return N(g, y)->op == MOE_OP_CONST || N(g, y)->op == MOE_OP_IOTA;
}

/* whether a, a side node's operand (or a select's other value), is through
 * lane-word views an operand that the nodes ch[0..j) fetch as a stream, a
 * node of the pass's rank (so read through the same view) */
static bool shared_stream(const moe_graph *g, const moe_id *ch, int j, moe_id a, int rank)
{
	if (N(g, a)->rank != rank)
		return false;
	for (moe_id y = a; y != MOE_NONE; y = tcp_lane_src(g, y)) {
		if (imm_like(g, y))
			continue;
		for (int i = 0; i < j; i++) {
			const ir_node *c = N(g, ch[i]);
			for (uint32_t k = 0; k < c->nargs; k++)
				if (c->args[k] == y && (i == 0 || y != ch[i - 1]))
					return true;
		}
	}
	return false;
}

/* the dimension of node c an iota operand a counts along (-1: a is no iota) */
static int iota_dim(const moe_graph *g, const ir_node *c, moe_id a)
{
	const ir_node *an = N(g, a);
	return an->op == MOE_OP_IOTA ? (int)ir_attr_int(an, "axis", 0) + (c->rank - an->rank) : -1;
}

/* streams of the side chain sc[0..m) of select ch[j] and of its other value o */
static int side_streams(const moe_graph *g, const moe_id *ch, int j, const moe_id *sc, int m, moe_id o)
{
	int rank = N(g, ch[j])->rank, ns = 0, ctr = -2; /* -2: the counter is free, -1: taken */
	for (int i = 0; i < j; i++)
		for (uint32_t k = 0; k < N(g, ch[i])->nargs; k++)
			if (N(g, N(g, ch[i])->args[k])->op == MOE_OP_IOTA)
				ctr = -1;
	for (int t = 0; t < m; t++) {
		const ir_node *c = N(g, sc[t]);
		int nc = 0;
		for (uint32_t k = 0; k < c->nargs; k++) {
			moe_id a = c->args[k];
			int d = iota_dim(g, c, a);
			if (t > 0 && a == sc[t - 1])
				continue;
			if (N(g, a)->op == MOE_OP_CONST)
				nc++;
			else if (d >= 0 && (ctr == -2 || ctr == d))
				ctr = d;
			else if (!shared_stream(g, ch, j, a, rank))
				ns++;
		}
		ns += nc > 1 ? nc - 1 : 0;
	}
	return ns + (N(g, o)->op != MOE_OP_CONST && !shared_stream(g, ch, j, o, rank));
}

/* the operand index of c that is a (-1: none) */
static int arg_index(const ir_node *c, moe_id a)
{
	for (uint32_t k = 0; k < c->nargs; k++)
		if (c->args[k] == a)
			return (int)k;
	return -1;
}

/* Whether the group ending at r (its chain through prev, each select's side
 * chain through side) is one pass: at most TCP_MAXSTEP steps in the stage
 * order, at most three streams. */
static bool group_ok(const plan *P, const moe_tcp_machine *m, moe_id r)
{
	const moe_graph *g = P->g;
	moe_id ch[GROUP_CAP], sc[GROUP_CAP];
	int n = chain_back(P, r, ch), len = 0, ns = 0;
	uint8_t ops[TCP_MAXSTEP + 4];
	if (n < 0)
		return false;
	for (int j = 0; j < n; j++) {
		const ir_node *c = N(g, ch[j]);
		uint8_t o[4];
		bool tag = len > 0 && tcp_vop_stage[ops[len - 1]] == TCP_ST_TAG;
		moe_id q = P->side[ch[j]];
		if (q == MOE_NONE) {
			ns += sched_streams(g, c, j > 0 ? arg_index(c, ch[j - 1]) : -1);
			int k = sched_vops(g, c, j > 0, tag, o);
			if (k < 0 || len + k > TCP_MAXSTEP)
				return false;
			memcpy(ops + len, o, (size_t)k);
			len += k;
			continue;
		}
		if (j == 0 || c->op != MOE_OP_SELECT || len + 1 > TCP_MAXSTEP)
			return false;
		if (!tag) {
			moe_dtype at = (moe_dtype)N(g, c->args[0])->dtype;
			ops[len++] = at == MOE_BOOL || !moe_dtype_is_float(at) ? TCP_V_TNE : TCP_V_FTNE;
		}
		int ms = chain_back(P, q, sc), t0 = 0;
		while (t0 < ms && tcp_lane_src(g, sc[t0]) != MOE_NONE && sched_vops(g, N(g, sc[t0]), t0 > 0, false, o) == 0)
			t0++;
		if (ms < 0 || t0 == ms)
			return false;
		for (int t = t0; t < ms; t++) {
			int k = sched_vops(g, N(g, sc[t]), t > t0, false, o);
			if (k < 0 || (t == t0 && k == 0) || len + k + 1 > TCP_MAXSTEP)
				return false;
			memcpy(ops + len, o, (size_t)k);
			len += k;
		}
		ops[len++] = TCP_V_MERGE;
		ns += side_streams(g, ch, j, sc + t0, ms - t0, c->args[1] == q ? c->args[2] : c->args[1]);
	}
	return ns <= 3 && tcp_vec_chain_ok(m, ops, len);
}

/* q may end a side chain of select s: elementwise of s's shape and mask,
 * f32, i32 or bool, read once (by s), neither s's condition nor its other
 * value, and no node of its chain a select with a side chain itself */
static bool side_candidate(const plan *P, const ir_node *s, moe_id q)
{
	const moe_graph *g = P->g;
	const ir_node *qn = N(g, q);
	for (moe_id x = q; x != MOE_NONE; x = P->prev[x])
		if (P->side[x] != MOE_NONE)
			return false;
	return q != s->args[0] && s->args[1] != s->args[2] && sched_elem(g, q) && P->nuse[q] == 1 &&
	       (qn->dtype == MOE_F32 || qn->dtype == MOE_I32 || qn->dtype == MOE_BOOL) && qn->valid == s->valid &&
	       qn->rank == s->rank && !memcmp(qn->shape, s->shape, sizeof(int64_t) * (size_t)s->rank);
}

/* whether the chain ending at q reads constants and iotas alone (a value
 * of the constant tier, computed before the data it selects among) */
static bool const_chain(const plan *P, moe_id q)
{
	for (moe_id x = q; x != MOE_NONE; x = P->prev[x]) {
		const ir_node *xn = N(P->g, x);
		for (uint32_t k = 0; k < xn->nargs; k++)
			if (xn->args[k] != P->prev[x] && !imm_like(P->g, xn->args[k]))
				return false;
	}
	return true;
}

/* Select s takes a side chain where its condition chains into it (already,
 * or now: a condition read once, by s, of its shape and mask) and the group
 * stays one pass: of its two values, one that reads data first (a constant
 * chain is computed off the data's path), then the first. */
static void side_pass(plan *P, const moe_tcp_machine *m, moe_id s)
{
	const moe_graph *g = P->g;
	const ir_node *sn = N(g, s);
	if (sn->op != MOE_OP_SELECT || !sched_elem(g, s) || P->side[s] != MOE_NONE)
		return;
	moe_id c = sn->args[0];
	const ir_node *cn = N(g, c);
	bool join = P->prev[s] == MOE_NONE;
	if (!join && P->prev[s] != c)
		return;
	if (join && (!sched_elem(g, c) || P->nuse[c] != 1 || P->user[c] != s || cn->valid != sn->valid ||
		(cn->dtype != MOE_F32 && cn->dtype != MOE_I32 && cn->dtype != MOE_BOOL) || cn->rank != sn->rank ||
		memcmp(cn->shape, sn->shape, sizeof(int64_t) * (size_t)sn->rank)))
		return;
	moe_id r = s;
	while (P->user[r] != MOE_NONE && P->prev[P->user[r]] == r)
		r = P->user[r];
	for (int t = 0; t < 4; t++) {
		moe_id q = sn->args[1 + t % 2];
		if (!side_candidate(P, sn, q) || const_chain(P, q) != (t >= 2))
			continue;
		P->prev[s] = c, P->side[s] = q;
		if (group_ok(P, m, r))
			return;
		P->prev[s] = join ? MOE_NONE : c, P->side[s] = MOE_NONE;
	}
}

static moe_status plan_sched(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	uint32_t nn = g->nnodes;
	size_t sz = (nn + 1) * (2 * sizeof(uint32_t) + 3 * sizeof(moe_id));
	char *mem = ctx_alloc(ctx, sz);
	if (!mem)
		return MOE_ERR_NOMEM;
	uint32_t *nuse = (uint32_t *)(void *)mem, *len = nuse + nn + 1;
	moe_id *user = (moe_id *)(void *)(len + nn + 1), *prev = user + nn + 1; /* prev[u]: u's chained operand */
	moe_id *side = prev + nn + 1;
	for (moe_id i = 0; i < nn; i++)
		nuse[i] = 0, user[i] = prev[i] = side[i] = MOE_NONE, len[i] = 1;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE && a < nn)
				nuse[a]++, user[a] = i;
		}
	}
	for (uint32_t o = 0; o < g->nout; o++)
		if (g->outputs[o] < nn)
			nuse[g->outputs[o]] += 2;
	/* from the last node back: p joins its reader's chain at its front */
	for (moe_id p = nn; p-- > 0;) {
		const ir_node *pn = N(g, p);
		if (!sched_elem(g, p) || nuse[p] != 1 || user[p] == MOE_NONE ||
			(pn->dtype != MOE_F32 && pn->dtype != MOE_I32 && pn->dtype != MOE_BOOL))
			continue;
		moe_id u = user[p];
		const ir_node *un = N(g, u);
		bool red = sched_is_reduce(g, u);
		if ((!sched_elem(g, u) && !red) || prev[u] != MOE_NONE || un->valid != pn->valid)
			continue;
		const ir_node *shp = red ? N(g, un->args[0]) : un;
		if (shp->rank != pn->rank || memcmp(shp->shape, pn->shape, sizeof(int64_t) * (size_t)pn->rank))
			continue;
		int k = 0;
		while (k < (int)un->nargs && un->args[k] != p)
			k++;
		if (k == (int)un->nargs || !(sched_chain_operands(un) >> k & 1))
			continue;
		/* the chain p, u, ... to its last node r */
		moe_id ch[TCP_MAXSTEP + 2];
		int n = 0;
		ch[n++] = p;
		for (moe_id x = u; n < TCP_MAXSTEP + 2; x = user[x]) {
			ch[n++] = x;
			if (user[x] == MOE_NONE || prev[user[x]] != x)
				break;
		}
		if (n > TCP_MAXSTEP + 1)
			continue;
		int ns = sched_streams(g, pn, -1);
		for (int j = 1; j < n; j++) {
			const ir_node *c = N(g, ch[j]);
			int kk = 0;
			while (kk < (int)c->nargs && c->args[kk] != ch[j - 1])
				kk++;
			ns += sched_streams(g, c, kk);
		}
		uint8_t ops[2 * TCP_MAXSTEP + 8];
		int nops = sched_chain_ops(g, ch, n, ops);
		if (ns > 3 || nops < 0 || !tcp_vec_chain_ok(m, ops, nops))
			continue;
		prev[u] = p;
	}
	plan P = {g, nuse, user, prev, side};
	for (moe_id s = 0; s < nn; s++)
		side_pass(&P, m, s);
	/* groups: each chain's last node r (one with a chained operand, not
	 * chained itself, nor a side chain's last) */
	int64_t k = 0;
	for (moe_id r = 0; r < nn; r++) {
		bool last = prev[r] != MOE_NONE && !(user[r] != MOE_NONE && (prev[user[r]] == r || side[user[r]] == r));
		for (moe_id x = r; last && x != MOE_NONE; x = prev[x]) {
			moe_node_set_int(g, x, IR_NK_TCP_FUSE, k);
			for (moe_id y = side[x]; y != MOE_NONE; y = prev[y])
				moe_node_set_int(g, y, IR_NK_TCP_FUSE, k);
		}
		k += last;
	}
	for (moe_id i = 0; i < nn; i++)
		set_mark(g, i, IR_NK_TCP_VIEW, widening_cast(g, i), 0);
	for (moe_id i = 0; i < nn; i++) /* marks left by an earlier run on nodes no group holds now */
		if (ir_attr_find(N(g, i), IR_NK_TCP_FUSE) && prev[i] == MOE_NONE &&
			!(user[i] != MOE_NONE && (prev[user[i]] == i || side[user[i]] == i)))
			moe_node_set_int(g, i, IR_NK_TCP_FUSE, -1);
	ctx_free(ctx, mem, sz);
	return MOE_OK;
}

/* The groups of g and of each block loop's body (a body's groups are its
 * own: its nodes are numbered apart). */
moe_status tcp_plan_fusion(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	moe_status st = plan_sched(ctx, g, m);
	for (moe_id i = 0; i < g->nnodes && st == MOE_OK; i++) {
		moe_graph *body = N(g, i)->op == MOE_OP_BLOCK_LOOP ? ir_node_body(g, N(g, i)) : NULL;
		if (body)
			st = plan_sched(ctx, body, m);
	}
	if (st == MOE_OK)
		ir_graph_set_attr_int(g, IR_GK_TCP_FUSION_PLAN, fingerprint(m));
	return st;
}
