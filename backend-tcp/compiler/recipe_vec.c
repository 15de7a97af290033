/* backend-tcp/compiler/recipe_vec.c: sched-build's recipe for elementwise
 * nodes (arithmetic, compares, select, casts, bitcast) and for immediates and
 * iotas that must exist in memory: one vector pass (tu.vec) per node, its
 * operands fetched as streams, immediates or the loop counter. Nodes of one
 * fusion group (tcp_fuse = k, marked by tcp-plan-fusion: a linear chain of
 * f32, i32 or bool elementwise nodes, each read once, by the next) are one
 * pass at the group's last node: each node's steps in turn, the previous
 * node's value the running value v (the lane word its own commit would have
 * stored), so the values are those of one pass per node; a select chained
 * after its condition may also compute one of its values in a side chain
 * (side_steps). A group's last node may be a reduce (recipe_reduce.c). In a
 * loop body a node masked by the block's rows commits them under
 * valid=$rows. */
#include <math.h>
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"
#include "ir/graph_keys.h"

typedef struct vsrc {
	uint8_t s, ctr;
	uint32_t imm;
} vsrc;

typedef struct vpass {
	tcp_insn in;
	int nstream, ctr; /* ctr: the dimension the counter operand reads, -1: none yet */
	moe_id sid[3];    /* the node each stream fetches */
} vpass;

static void vp_init(vpass *vp, int ndim, const int64_t *dim)
{
	memset(vp, 0, sizeof *vp);
	tcp_view none = tcp_view_none();
	vp->in = tcp_b_vec(ndim, dim, none);
	vp->ctr = -1;
}

/* node id's value as an operand of pass vp (map: iteration dim -> node dim);
 * force: fetched as a stream even when an immediate or an iota */
static vsrc operand(sb *b, vpass *vp, moe_id id, const int *map, bool force)
{
	const ir_node *n = SBN(b, id);
	sb_val *v = &b->v[id];
	vsrc r = {TCP_SRC_NONE, 0, 0};
	if (!force && v->kind == SV_IMM) {
		r.s = TCP_SRC_IMM;
		r.imm = v->imm;
		return r;
	}
	if (!force && v->kind == SV_IOTA) {
		int k = 0;
		while (k < vp->in.ndim && !(map[k] == v->axis && n->shape[v->axis] > 1))
			k++;
		if (k == vp->in.ndim) {
			r.s = TCP_SRC_IMM; /* an iota along a dimension of size 1 is 0 */
			return r;
		}
		if (vp->ctr < 0 || vp->ctr == k) {
			vp->ctr = k;
			r.s = TCP_SRC_CTR;
			r.ctr = (uint8_t)k;
			return r;
		}
	}
	v = sb_dm_val(b, id);
	if (!v)
		return r;
	if (vp->nstream >= 3) {
		sb_err(b, id, "a vector pass fetches at most three streams");
		return r;
	}
	vp->in.v[TCP_V_S0 + vp->nstream] = sb_mkview(v, n, vp->in.ndim, map);
	vp->sid[vp->nstream] = id;
	r.s = (uint8_t)(TCP_SRC_S0 + vp->nstream++);
	return r;
}

static bool view_eq(const tcp_view *a, const tcp_view *b)
{
	if (a->t != b->t || a->reg != b->reg || a->base != b->base || a->scale != b->scale)
		return false;
	for (int k = 0; k < TCP_MAXD; k++)
		if (a->stride[k] != b->stride[k])
			return false;
	return true;
}

/* node id's value as an operand of vp: the stream vp already fetches whose
 * lane words are its value (one of id's lane-word sources, tcp_lane_src, id
 * included, fetched through the same view), else as operand() gives id, or
 * where id has no value (a lane-word view in a side chain, no step) its
 * first lane-word source that has one */
static vsrc operand_shared(sb *b, vpass *vp, moe_id id, const int *map)
{
	moe_id root = id;
	while (b->v[root].kind == SV_NONE && tcp_lane_src(b->g, root) != MOE_NONE)
		root = tcp_lane_src(b->g, root);
	for (moe_id y = id; y != MOE_NONE; y = tcp_lane_src(b->g, y))
		for (int k = 0; k < vp->nstream; k++) {
			if (vp->sid[k] != y || b->v[y].kind != SV_VIEW)
				continue;
			const sb_val *v = sb_dm_val(b, y);
			if (!v)
				return (vsrc){TCP_SRC_NONE, 0, 0};
			tcp_view w = sb_mkview(v, SBN(b, y), vp->in.ndim, map);
			if (view_eq(&w, &vp->in.v[TCP_V_S0 + k]))
				return (vsrc){(uint8_t)(TCP_SRC_S0 + k), 0, 0};
		}
	return operand(b, vp, root, map, false);
}

static void step(sb *b, vpass *vp, int op, vsrc x, vsrc y, moe_id at)
{
	if (b->failed)
		return;
	if (x.s == TCP_SRC_IMM && y.s == TCP_SRC_IMM && x.imm != y.imm) {
		sb_err(b, at, "a vector step holds one immediate");
		return;
	}
	if (!tcp_b_step(&vp->in, (uint8_t)op, x.s, y.s, x.s == TCP_SRC_IMM ? x.imm : y.imm)) {
		sb_err(b, at, "vector chain too long");
		return;
	}
	vp->in.step[vp->in.nstep - 1].ctr = x.s == TCP_SRC_CTR ? x.ctr : y.ctr;
}

static const vsrc SV = {TCP_SRC_V, 0, 0}, SN = {TCP_SRC_NONE, 0, 0};

static vsrc SI(uint32_t imm)
{
	return (vsrc){TCP_SRC_IMM, 0, imm};
}

static uint32_t f32bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static int binop(moe_op op, bool fl)
{
	switch (op) {
	case MOE_OP_ADD: return fl ? TCP_V_FADD : TCP_V_IADD;
	case MOE_OP_SUB: return fl ? TCP_V_FSUB : TCP_V_ISUB;
	case MOE_OP_MUL: return fl ? TCP_V_FMUL : TCP_V_IMUL;
	case MOE_OP_DIV: return fl ? TCP_V_FDIV : TCP_V_IDIV;
	case MOE_OP_MIN: return fl ? TCP_V_FMIN : TCP_V_IMIN;
	case MOE_OP_MAX: return fl ? TCP_V_FMAX : TCP_V_IMAX;
	case MOE_OP_AND: return TCP_V_AND;
	case MOE_OP_OR: return TCP_V_OR;
	case MOE_OP_XOR: return TCP_V_XOR;
	case MOE_OP_SHL: return TCP_V_SHL;
	case MOE_OP_SHR: return TCP_V_SHR;
	case MOE_OP_SAR: return TCP_V_SAR;
	case MOE_OP_EQ: return fl ? TCP_V_FTEQ : TCP_V_TEQ;
	case MOE_OP_NE: return fl ? TCP_V_FTNE : TCP_V_TNE;
	case MOE_OP_LT: return fl ? TCP_V_FTLT : TCP_V_TLT;
	case MOE_OP_LE: return fl ? TCP_V_FTLE : TCP_V_TLE;
	case MOE_OP_GT: return fl ? TCP_V_FTGT : TCP_V_TGT;
	case MOE_OP_GE: return fl ? TCP_V_FTGE : TCP_V_TGE;
	default: return -1;
	}
}

/* the steps of a unary node, a select or a cast on operands a[] */
static void unary_steps(sb *b, vpass *vp, moe_id id, const vsrc *a, moe_dtype at)
{
	const ir_node *n = SBN(b, id);
	bool fl = moe_dtype_is_float(at);
	switch ((moe_op)n->op) {
	case MOE_OP_NEG: fl ? step(b, vp, TCP_V_FNEG, a[0], SN, id) : step(b, vp, TCP_V_ISUB, SI(0), a[0], id); break;
	case MOE_OP_ABS:
		if (fl) {
			step(b, vp, TCP_V_FABS, a[0], SN, id);
		} else {
			step(b, vp, TCP_V_ISUB, SI(0), a[0], id);
			step(b, vp, TCP_V_IMAX, a[0], SV, id);
		}
		break;
	case MOE_OP_EXP: step(b, vp, TCP_V_FEXP, a[0], SN, id); break;
	case MOE_OP_LOG: step(b, vp, TCP_V_FLOG, a[0], SN, id); break;
	case MOE_OP_SQRT: step(b, vp, TCP_V_FSQRT, a[0], SN, id); break;
	case MOE_OP_TANH: step(b, vp, TCP_V_FTANH, a[0], SN, id); break;
	case MOE_OP_ERF: step(b, vp, TCP_V_FERF, a[0], SN, id); break;
	case MOE_OP_SIGMOID: step(b, vp, TCP_V_FSIGM, a[0], SN, id); break;
	case MOE_OP_RSQRT:
		step(b, vp, TCP_V_FSQRT, a[0], SN, id);
		step(b, vp, TCP_V_FDIV, SI(f32bits(1.0f)), SV, id);
		break;
	case MOE_OP_NOT: step(b, vp, TCP_V_XOR, a[0], SI(at == MOE_BOOL ? 1u : 0xffffffffu), id); break;
	case MOE_OP_SELECT:
		step(b, vp, at == MOE_BOOL || !fl ? TCP_V_TNE : TCP_V_FTNE, a[0], SI(0), id);
		step(b, vp, TCP_V_MERGE, a[1], a[2], id);
		break;
	case MOE_OP_CAST: {
		moe_dtype to = (moe_dtype)n->dtype;
		bool tf = moe_dtype_is_float(to);
		if (to == MOE_BOOL && at != MOE_BOOL)
			step(b, vp, fl ? TCP_V_FTNE : TCP_V_TNE, a[0], SI(0), id);
		else if (fl && !tf)
			step(b, vp, TCP_V_FTOI, a[0], SN, id);
		else if (!fl && tf)
			step(b, vp, TCP_V_ITOF, a[0], SN, id);
		else if (a[0].s == TCP_SRC_IMM || a[0].s == TCP_SRC_CTR)
			step(b, vp, TCP_V_OR, a[0], SI(0), id);
		break; /* float->float and int->int: the commit narrows */
	}
	case MOE_OP_BITCAST:
		if (a[0].s == TCP_SRC_IMM || a[0].s == TCP_SRC_CTR)
			step(b, vp, TCP_V_OR, a[0], SI(0), id);
		break; /* the lane word is copied unchanged */
	default: sb_refuse(b, id, moe_op_name((moe_op)n->op)); break;
	}
}

/* The concat along the rows of the top graph that is node id's only reader
 * (id not an output), or MOE_NONE; *off: id's first row in it. Such a part
 * is computed into its rows of the concat's buffer, so a value made in row
 * chunks (rowchunk.c) never exists twice. */
static moe_id row_concat_of(const sb *b, moe_id id, int64_t *off)
{
	const moe_graph *g = b->g;
	if (g != b->top || b->rows != TS_NONE || SBN(b, id)->rank < 1)
		return MOE_NONE;
	for (uint32_t k = 0; k < g->nout; k++)
		if (g->outputs[k] == id)
			return MOE_NONE;
	moe_id cat = MOE_NONE;
	for (moe_id u = id + 1; u < g->nnodes; u++) {
		const ir_node *n = SBN(b, u);
		if (n->valid == id)
			return MOE_NONE;
		for (uint32_t k = 0; k < n->nargs; k++) {
			if (n->args[k] != id)
				continue;
			if (cat != MOE_NONE || n->op != MOE_OP_CONCAT || sb_axis(n, n, 0) != 0 || n->dtype != SBN(b, id)->dtype)
				return MOE_NONE;
			cat = u;
			*off = 0;
			for (uint32_t j = 0; j < k; j++)
				*off += SBN(b, n->args[j])->shape[0];
		}
	}
	return cat;
}

/* Node id's output: its rows of the concat that alone reads it, else a fresh buffer. */
static sb_val *elem_out(sb *b, moe_id id)
{
	int64_t off = 0;
	moe_id cat = row_concat_of(b, id, &off);
	if (cat == MOE_NONE)
		return sb_out_val(b, id);
	if (b->v[cat].kind != SV_VIEW)
		sb_out_val(b, cat);
	b->v[id] = b->v[cat];
	b->v[id].base += off * b->v[cat].stride[0];
	return &b->v[id];
}

/* ---- fusion groups (tcp_fuse marks) ---- */

static int64_t group_of(const sb *b, moe_id id)
{
	return ir_attr_int(SBN(b, id), IR_NK_TCP_FUSE, -1);
}

/* readers of id in b's graph (arguments, valid counts and outputs); *last: the last reader */
static uint32_t readers(const sb *b, moe_id id, moe_id *last)
{
	const moe_graph *g = b->g;
	uint32_t n = 0;
	*last = MOE_NONE;
	for (moe_id u = id + 1; u < g->nnodes; u++) {
		const ir_node *un = SBN(b, u);
		for (uint32_t k = 0; k <= un->nargs; k++)
			if ((k < un->nargs ? un->args[k] : un->valid) == id)
				n++, *last = u;
	}
	for (uint32_t o = 0; o < g->nout; o++)
		n += 2 * (g->outputs[o] == id);
	return n;
}

bool sb_widened_operand(const sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	return n->op == MOE_OP_CAST && ir_attr_int(n, IR_NK_TCP_VIEW, 0) > 0 && n->dtype == MOE_F32 &&
	       n->valid == MOE_NONE && SBN(b, n->args[0])->dtype == MOE_BF16;
}

/* Whether a widened operand is read by einsums alone, not by an output (it is
 * not built then; otherwise it is, for its other readers, and the einsums
 * still read its source). */
static bool widened_readers(const sb *b, moe_id id)
{
	const moe_graph *g = b->g;
	bool ok = true;
	for (moe_id u = id + 1; u < g->nnodes && ok; u++) {
		const ir_node *un = SBN(b, u);
		for (uint32_t k = 0; k <= un->nargs && ok; k++)
			ok = (k < un->nargs ? un->args[k] : un->valid) != id || (k < un->nargs && un->op == MOE_OP_EINSUM);
	}
	for (uint32_t o = 0; o < g->nout && ok; o++)
		ok = g->outputs[o] != id;
	return ok;
}

bool sb_fused_member(const sb *b, moe_id id)
{
	int64_t k = group_of(b, id);
	moe_id u;
	const ir_node *n = SBN(b, id);
	if (k < 0 || !(ir_ops[n->op].flags & OPF_ELEM) || (ir_ops[n->op].flags & OPF_LEAF) || readers(b, id, &u) != 1 ||
		u == MOE_NONE || group_of(b, u) != k)
		return false;
	const ir_node *un = SBN(b, u);
	return ((ir_ops[un->op].flags & OPF_ELEM) && !(ir_ops[un->op].flags & OPF_LEAF)) || un->op == MOE_OP_REDUCE_SUM ||
	       un->op == MOE_OP_REDUCE_MAX || un->op == MOE_OP_REDUCE_MIN;
}

static bool chain_dtype(moe_dtype d)
{
	return d == MOE_F32 || d == MOE_I32 || d == MOE_BOOL;
}

/* which operand of u may be the running value (bit k: operand k) */
static unsigned v_operands(const ir_node *u)
{
	if (u->op == MOE_OP_REDUCE_SUM || u->op == MOE_OP_REDUCE_MAX || u->op == MOE_OP_REDUCE_MIN || u->op == MOE_OP_SELECT ||
		u->op == MOE_OP_CAST || u->op == MOE_OP_BITCAST)
		return 1;
	if (u->op == MOE_OP_ABS) /* an integer abs reads its operand twice */
		return moe_dtype_is_float((moe_dtype)u->dtype) ? 1 : 0;
	return u->nargs == 2 ? 3 : 1;
}

/* The value of select x that its group's pass computes in its side chain
 * (tcp-plan-fusion's side_pass: the condition and one value in x's group):
 * 1 or 2, or 0: none. */
static int side_of(const sb *b, moe_id x)
{
	const ir_node *xn = SBN(b, x);
	int64_t k = group_of(b, x);
	if (xn->op != MOE_OP_SELECT || k < 0 || group_of(b, xn->args[0]) != k)
		return 0;
	bool s1 = group_of(b, xn->args[1]) == k, s2 = group_of(b, xn->args[2]) == k;
	return s1 == s2 ? 0 : s1 ? 1 : 2;
}

static int chain_from(sb *b, moe_id r, int64_t k, const ir_node *shape, moe_id *ch, int cap);

/* Group r's nodes from its first to r (ch[n - 1] = r), each link the one
 * operand of the next marked with r's group (of a select with a side chain:
 * its condition), checked: elementwise, f32, i32 or bool, of the pass's
 * shape `shape`, read once, masked as r is (unmasked, or in a body by the
 * block's rows, which r's pass commits under); a select's side chain
 * (side_of) is checked the same way, its last node too. 0 with a diagnostic
 * when the marks are not such a chain. */
static int chain_of(sb *b, moe_id r, const ir_node *shape, moe_id *ch, int cap)
{
	return chain_from(b, r, group_of(b, r), shape, ch, cap);
}

/* whether p may be a node of the pass of the group (or side chain) ending
 * at r, over shape, read by xn as its operand at (-1: any) */
static bool member_ok(sb *b, moe_id p, moe_id r, const ir_node *shape, const ir_node *xn, int at)
{
	const ir_node *pn = SBN(b, p);
	moe_id u;
	return (ir_ops[pn->op].flags & OPF_ELEM) && !(ir_ops[pn->op].flags & OPF_LEAF) && pn->op != MOE_OP_CONST &&
	       pn->op != MOE_OP_IOTA && chain_dtype((moe_dtype)pn->dtype) && pn->valid == SBN(b, r)->valid &&
	       pn->rank == shape->rank && !memcmp(pn->shape, shape->shape, sizeof(int64_t) * (size_t)pn->rank) &&
	       readers(b, p, &u) == 1 && (at < 0 || v_operands(xn) >> at & 1);
}

static int chain_from(sb *b, moe_id r, int64_t k, const ir_node *shape, moe_id *ch, int cap)
{
	int n = 0;
	ch[n++] = r;
	for (moe_id x = r; k >= 0;) {
		const ir_node *xn = SBN(b, x);
		moe_id p = MOE_NONE;
		int at = -1, side = side_of(b, x);
		if (side) {
			moe_id sc[TCP_MAXSTEP + 1];
			if (!member_ok(b, xn->args[side], r, shape, xn, -1) ||
				chain_from(b, xn->args[side], k, shape, sc, TCP_MAXSTEP + 1) == 0) {
				sb_err(b, x, "%s=%lld: not a select's side chain (elementwise nodes of the select's shape, "
					"each read once, by the next)", IR_NK_TCP_FUSE, (long long)k);
				return 0;
			}
			p = xn->args[0], at = 0;
		}
		for (uint32_t a = 0; a < xn->nargs && !side; a++)
			if (group_of(b, xn->args[a]) == k) {
				if (p != MOE_NONE) {
					sb_err(b, x, "%s=%lld: two operands of one node in the group (a group is a chain)",
						IR_NK_TCP_FUSE, (long long)k);
					return 0;
				}
				p = xn->args[a], at = (int)a;
			}
		if (p == MOE_NONE)
			break;
		if (n == cap || !member_ok(b, p, r, shape, xn, at)) {
			sb_err(b, p, "%s=%lld: not a fusion group of this graph (one vector pass: f32, i32 or bool "
				"elementwise nodes of one shape, each read once, by the next)", IR_NK_TCP_FUSE, (long long)k);
			return 0;
		}
		ch[n++] = p;
		x = p;
	}
	for (int i = 0; i < n / 2; i++) {
		moe_id t = ch[i];
		ch[i] = ch[n - 1 - i], ch[n - 1 - i] = t;
	}
	return n;
}

/* operand i of c, of the chain's rank, as an operand of vp (map: its dims) */
static void operand_map(const vpass *vp, const ir_node *c, const ir_node *o, const int *pmap, int *map)
{
	for (int k = 0; k < vp->in.ndim; k++) {
		int d = pmap[k] < 0 ? -1 : pmap[k] - (c->rank - o->rank);
		map[k] = d >= 0 ? d : -1;
	}
}

/* whether cast or bitcast x of a stream (fused: of the running value) has
 * no step (unary_steps: a widening cast and a bitcast copy the lane word) */
static bool lane_view(const sb *b, moe_id x, bool fused)
{
	const ir_node *xn = SBN(b, x);
	const sb_val *a = &b->v[xn->args[0]];
	return xn->op == MOE_OP_BITCAST || xn->op == MOE_OP_CAST ? fused || (a->kind != SV_IMM && a->kind != SV_IOTA)
								  : false;
}

/* The operands of chain node c into a: SV for its argument prev (the value
 * the chain holds), else each operand read in vp (with `shared`, a view of a
 * stream the pass already fetches where one holds it); two immediates that
 * differ cannot share the pass's one immediate, so the later is read. */
static void step_operands(sb *b, vpass *vp, const ir_node *c, moe_id prev, const int *pmap, bool shared, vsrc a[3])
{
	int map[TCP_MAXD];
	for (uint32_t i = 0; i < c->nargs && !b->failed; i++) {
		if (prev != MOE_NONE && c->args[i] == prev) {
			a[i] = SV;
			continue;
		}
		operand_map(vp, c, SBN(b, c->args[i]), pmap, map);
		a[i] = shared ? operand_shared(b, vp, c->args[i], map) : operand(b, vp, c->args[i], map, false);
		for (uint32_t q = 0; q < i && a[i].s == TCP_SRC_IMM; q++)
			if (a[q].s == TCP_SRC_IMM && a[q].imm != a[i].imm)
				a[i] = operand(b, vp, c->args[i], map, true);
	}
}

/* Select s (its condition in v) with its side chain (side_of: value `side`):
 * the condition's tag (set by the compare that made v, else by t.ne), the
 * side chain's steps, its first reading no v (leading lane-word views with
 * no step are none: the first node with one reads their source), then the
 * merge of v and the other value. An operand of the side chain, or the other value, that is a
 * stream the pass already fetches reads it (operand_shared); the plan
 * counted it so (plan_fusion.c, side_streams). */
static void side_steps(sb *b, vpass *vp, moe_id s, int side, const int *pmap)
{
	const ir_node *sn = SBN(b, s);
	moe_dtype at = (moe_dtype)SBN(b, sn->args[0])->dtype;
	if (!(vp->in.nstep > 0 && tcp_vop_stage[vp->in.step[vp->in.nstep - 1].op] == TCP_ST_TAG))
		step(b, vp, at == MOE_BOOL || !moe_dtype_is_float(at) ? TCP_V_TNE : TCP_V_FTNE, SV, SI(0), s);
	moe_id sc[TCP_MAXSTEP + 1];
	int m = chain_from(b, sn->args[side], group_of(b, s), sn, sc, TCP_MAXSTEP + 1), t0 = 0;
	while (t0 < m && tcp_lane_src(b->g, sc[t0]) != MOE_NONE && lane_view(b, sc[t0], t0 > 0))
		t0++;
	for (int t = t0; t < m && !b->failed; t++) {
		const ir_node *c = SBN(b, sc[t]);
		vsrc a[3] = {SN, SN, SN};
		int nstep = vp->in.nstep;
		step_operands(b, vp, c, t > t0 ? sc[t - 1] : MOE_NONE, pmap, true, a);
		if (b->failed)
			return;
		moe_dtype ct = (moe_dtype)SBN(b, c->args[0])->dtype;
		int op = binop((moe_op)c->op, moe_dtype_is_float(ct));
		if (op >= 0)
			step(b, vp, op, a[0], a[1], sc[t]);
		else
			unary_steps(b, vp, sc[t], a, ct);
		if (t == t0 && vp->in.nstep == nstep && !b->failed)
			sb_err(b, sc[t], "%s: a side chain's first node has no step", IR_NK_TCP_FUSE);
	}
	if (b->failed)
		return;
	int map[TCP_MAXD];
	moe_id o = sn->args[3 - side];
	operand_map(vp, sn, SBN(b, o), pmap, map);
	vsrc ov = operand_shared(b, vp, o, map);
	if (!b->failed)
		step(b, vp, TCP_V_MERGE, side == 1 ? SV : ov, side == 2 ? SV : ov, s);
}

/* The steps of chain ch[0..n) into vp, whose iteration dimension k is dimension
 * pmap[k] of the chain's shape; v holds ch[n - 1]'s value after. */
static void chain_steps(sb *b, vpass *vp, const moe_id *ch, int n, const int *pmap)
{
	for (int j = 0; j < n && !b->failed; j++) {
		const ir_node *c = SBN(b, ch[j]);
		int side = j > 0 ? side_of(b, ch[j]) : 0;
		if (side) {
			side_steps(b, vp, ch[j], side, pmap);
			continue;
		}
		vsrc a[3] = {SN, SN, SN};
		step_operands(b, vp, c, j > 0 ? ch[j - 1] : MOE_NONE, pmap, false, a);
		if (b->failed)
			return;
		moe_dtype at = (moe_dtype)SBN(b, c->args[0])->dtype;
		int op = binop((moe_op)c->op, moe_dtype_is_float(at));
		bool tag = vp->in.nstep > 0 && tcp_vop_stage[vp->in.step[vp->in.nstep - 1].op] == TCP_ST_TAG;
		if (op >= 0)
			step(b, vp, op, a[0], a[1], ch[j]);
		else if (c->op == MOE_OP_SELECT && a[0].s == TCP_SRC_V && tag)
			step(b, vp, TCP_V_MERGE, a[1], a[2], ch[j]); /* the compare that made v set the tag */
		else
			unary_steps(b, vp, ch[j], a, at);
	}
}

/* whether vp's steps keep the vector engine's stage order (a group's pass) */
static bool chain_legal(sb *b, const tcp_insn *in, moe_id at)
{
	uint8_t ops[TCP_MAXSTEP];
	for (int k = 0; k < in->nstep; k++)
		ops[k] = in->step[k].op;
	if (tcp_vec_chain_ok(b->m, ops, in->nstep))
		return true;
	sb_err(b, at, "%s=%lld: the group's steps break the vector engine's stage order on this machine",
		IR_NK_TCP_FUSE, (long long)group_of(b, at));
	return false;
}

bool sb_chain_into(sb *b, moe_id r, const ir_node *shape, const int *pmap, tcp_insn *in)
{
	moe_id ch[TCP_MAXSTEP + 1];
	int n = chain_of(b, r, shape, ch, TCP_MAXSTEP + 1);
	if (n < 2)
		return false;
	vpass vp;
	memset(&vp, 0, sizeof vp);
	vp.in = *in;
	vp.ctr = -1;
	chain_steps(b, &vp, ch, n - 1, pmap); /* r, a reduce, adds its own step */
	*in = vp.in;
	return !b->failed;
}

/* ---- two-sided clamps ---- */

/* the float immediate operand of binary node n (*imm its lane word) and the
 * other operand; MOE_NONE when n has no such pair */
static moe_id imm_pair(const sb *b, const ir_node *n, float *imm, uint32_t *bits)
{
	if (n->nargs != 2 || !moe_dtype_is_float((moe_dtype)n->dtype))
		return MOE_NONE;
	for (int k = 0; k < 2; k++) {
		const sb_val *c = &b->v[n->args[k]], *o = &b->v[n->args[1 - k]];
		if (c->kind != SV_IMM || o->kind == SV_IMM || o->kind == SV_IOTA ||
			SBN(b, n->args[1 - k])->dtype != n->dtype)
			continue;
		*bits = c->imm;
		memcpy(imm, bits, 4);
		return n->args[1 - k];
	}
	return MOE_NONE;
}

/* Whether node id is max(min(a, hi), lo) of float immediates with lo < hi
 * and lo non-zero, its min read once (by it), the max in no fusion group,
 * the min in none or last in [a widening cast, min], both of one shape and
 * masked alike (the max's pass commits the rows): one pass computes it,
 * t.flt(a, lo), c.fmin(a, hi), flt.merge(lo, v) (the clip stage holds one
 * ALU, so the two clips are two passes otherwise). The same lane word: where a < lo,
 * min(a, hi) = a and the max is lo; elsewhere (NaN included, which the
 * compare does not tag and both clips propagate) min(a, hi) >= lo, so the
 * max returns it, and a tie at lo is lo itself (lo non-zero: no signed-zero
 * tie). Neither value is rounded: the min's commit would store a value of
 * the type it read. *x: the min, *a: its operand. */
static bool clamp_of(const sb *b, moe_id id, moe_id *x, moe_id *a, uint32_t *lo, uint32_t *hi)
{
	const ir_node *n = SBN(b, id);
	float l, h;
	moe_id u;
	if (n->op != MOE_OP_MAX || group_of(b, id) >= 0)
		return false;
	*x = imm_pair(b, n, &l, lo);
	if (*x == MOE_NONE)
		return false;
	const ir_node *xn = SBN(b, *x);
	if (xn->op != MOE_OP_MIN || readers(b, *x, &u) != 1 || u != id || xn->valid != n->valid || xn->rank != n->rank ||
		memcmp(xn->shape, n->shape, sizeof(int64_t) * (size_t)n->rank))
		return false;
	*a = imm_pair(b, xn, &h, hi);
	if (*a == MOE_NONE || SBN(b, *a)->rank != n->rank ||
		memcmp(SBN(b, *a)->shape, n->shape, sizeof(int64_t) * (size_t)n->rank))
		return false;
	int64_t k = group_of(b, *x);
	if (k >= 0) {
		/* the min's group is [cast of a bf16 value to f32, min]: the pass
		 * reads the bf16 value, which the fetch widens to the same word */
		const ir_node *an = SBN(b, *a);
		if (group_of(b, *a) != k || an->op != MOE_OP_CAST || an->dtype != MOE_F32 || an->nargs != 1 ||
			SBN(b, an->args[0])->dtype != MOE_BF16 || group_of(b, an->args[0]) == k ||
			readers(b, *a, &u) != 1 || u != *x || an->valid != n->valid)
			return false;
		*a = an->args[0];
	} else if (group_of(b, *a) >= 0 && sb_fused_member(b, *a)) {
		return false;
	}
	return isfinite(l) && isfinite(h) && l < h && l != 0.0f;
}

/* whether node id is the min of a clamp its max computes (clamp_of) */
static bool clamp_member(const sb *b, moe_id id)
{
	moe_id u, x, a;
	uint32_t lo, hi;
	return SBN(b, id)->op == MOE_OP_MIN && readers(b, id, &u) == 1 && u != MOE_NONE &&
	       clamp_of(b, u, &x, &a, &lo, &hi) && x == id;
}

/* The clamp's one pass (clamp_of) at its max, node id. */
static void clamp_pass(sb *b, moe_id id, moe_id a, uint32_t lo, uint32_t hi)
{
	const ir_node *n = SBN(b, id);
	int64_t one = 1;
	int nd = n->rank ? n->rank : 1;
	vpass vp;
	vp_init(&vp, nd, n->rank ? n->shape : &one);
	int map[TCP_MAXD];
	for (int k = 0; k < nd; k++)
		map[k] = n->rank ? k : -1;
	vsrc s = operand(b, &vp, a, map, false);
	step(b, &vp, TCP_V_FTLT, s, SI(lo), id);
	step(b, &vp, TCP_V_FMIN, s, SI(hi), id);
	step(b, &vp, TCP_V_MERGE, SI(lo), SV, id);
	if (b->failed)
		return;
	vp.in.v[TCP_V_DST] = sb_mkview(elem_out(b, id), n, nd, map);
	if (n->valid != MOE_NONE)
		vp.in.vreg = (int32_t)sb_valid(b, id);
	vp.in.flags |= TCP_F_ROUTE;
	sb_emit(b, &vp.in, id);
}

void sb_elem(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	int64_t one = 1;
	int nd = n->rank ? n->rank : 1;
	if (nd > TCP_MAXD || n->nargs > 3) {
		sb_refuse(b, id, "an elementwise node of more than 8 dimensions");
		return;
	}
	if (sb_fused_member(b, id))
		return; /* computed in its group's pass, at the group's last node */
	moe_id cx, ca;
	uint32_t lo, hi;
	if (clamp_member(b, id))
		return; /* computed in its max's pass */
	if (clamp_of(b, id, &cx, &ca, &lo, &hi)) {
		clamp_pass(b, id, ca, lo, hi);
		return;
	}
	if (sb_widened_operand(b, id) && widened_readers(b, id))
		return; /* the contractions read its source (recipe_contract.c) */
	moe_id ch[TCP_MAXSTEP + 1];
	int nch = 1;
	ch[0] = id;
	if (group_of(b, id) >= 0 && (nch = chain_of(b, id, n, ch, TCP_MAXSTEP + 1)) == 0)
		return;
	vpass vp;
	vp_init(&vp, nd, n->rank ? n->shape : &one);
	int map[TCP_MAXD];
	for (int k = 0; k < nd; k++)
		map[k] = n->rank ? k : -1;
	chain_steps(b, &vp, ch, nch, map);
	if (b->failed || (nch > 1 && !chain_legal(b, &vp.in, id)))
		return;
	if (vp.in.nstep == 0 && vp.nstream == 0)
		step(b, &vp, TCP_V_OR, SI(0), SI(0), id);
	sb_val *o = elem_out(b, id);
	vp.in.v[TCP_V_DST] = sb_mkview(o, n, nd, map);
	if (n->valid != MOE_NONE)
		vp.in.vreg = (int32_t)sb_valid(b, id);
	vp.in.flags |= TCP_F_ROUTE;
	sb_emit(b, &vp.in, id);
}

/* An immediate or iota written into a DM buffer of its node's shape. */
void sb_materialize(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	sb_val keep = b->v[id];
	int64_t one = 1;
	int nd = n->rank ? n->rank : 1;
	vpass vp;
	vp_init(&vp, nd, n->rank ? n->shape : &one);
	if (keep.kind == SV_IMM)
		step(b, &vp, TCP_V_OR, SI(keep.imm), SI(keep.imm), id);
	else
		step(b, &vp, TCP_V_IADD, (vsrc){TCP_SRC_CTR, (uint8_t)keep.axis, 0}, SI(0), id);
	sb_val *o = sb_out_val(b, id);
	int map[TCP_MAXD];
	for (int k = 0; k < nd; k++)
		map[k] = n->rank ? k : -1;
	vp.in.v[TCP_V_DST] = sb_mkview(o, n, nd, map);
	vp.in.flags |= TCP_F_ROUTE;
	sb_emit(b, &vp.in, id);
}

/* A contiguous DM copy of a strided view (a pass with no ALU step). */
sb_val *sb_copy_contig(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	int64_t one = 1;
	int nd = n->rank ? n->rank : 1, map[TCP_MAXD];
	vpass vp;
	vp_init(&vp, nd, n->rank ? n->shape : &one);
	for (int k = 0; k < nd; k++)
		map[k] = n->rank ? k : -1;
	operand(b, &vp, id, map, true);
	if (b->failed)
		return NULL;
	sb_val *o = sb_out_val(b, id);
	vp.in.v[TCP_V_DST] = sb_mkview(o, n, nd, map);
	vp.in.flags |= TCP_F_ROUTE;
	sb_emit(b, &vp.in, id);
	return o;
}

/* concat: one copy pass per part into its slice of the output, but for the
 * parts computed there (elem_out). */
void sb_concat(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	int axis = sb_axis(n, n, 0);
	if (n->rank < 1 || n->rank > TCP_MAXD) {
		sb_refuse(b, id, "a concat of more than 8 dimensions");
		return;
	}
	sb_val *o = b->v[id].kind == SV_VIEW ? &b->v[id] : sb_out_val(b, id); /* a part made it (elem_out) */
	sb_val ov = *o;
	int64_t off = 0;
	for (uint32_t i = 0; i < n->nargs && !b->failed; i++) {
		const ir_node *a = SBN(b, n->args[i]);
		const sb_val *pv = &b->v[n->args[i]];
		if (pv->kind == SV_VIEW && pv->buf == ov.buf) { /* computed in place */
			off += a->shape[axis];
			continue;
		}
		vpass vp;
		int map[TCP_MAXD];
		vp_init(&vp, a->rank, a->shape);
		for (int k = 0; k < a->rank; k++)
			map[k] = k;
		operand(b, &vp, n->args[i], map, true);
		if (b->failed)
			return;
		vp.in.v[TCP_V_DST] = sb_mkview(&ov, a, a->rank, map);
		vp.in.v[TCP_V_DST].base += off * ov.stride[axis];
		vp.in.flags |= TCP_F_ROUTE;
		sb_emit(b, &vp.in, id);
		off += a->shape[axis];
	}
}
