/* backend-tcp/compiler/recipe_vec.c: sched-build's recipe for elementwise
 * nodes (arithmetic, compares, select, casts, bitcast) and for immediates and
 * iotas that must exist in memory: one vector pass (tu.vec) per node, its
 * operands fetched as streams, immediates or the loop counter. No chain
 * crosses a node: each node's result is committed in its own dtype, which for
 * f32, i32 and bool is the lane word a fused chain would carry, so the values
 * are those of the legacy lowering's chains. In a loop body a node masked by
 * the block's rows commits them under valid=$rows. */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"

typedef struct vsrc {
	uint8_t s, ctr;
	uint32_t imm;
} vsrc;

typedef struct vpass {
	tcp_insn in;
	int nstream, ctr; /* ctr: the dimension the counter operand reads, -1: none yet */
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
	r.s = (uint8_t)(TCP_SRC_S0 + vp->nstream++);
	return r;
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

void sb_elem(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	int64_t one = 1;
	int nd = n->rank ? n->rank : 1;
	if (nd > TCP_MAXD || n->nargs > 3) {
		sb_refuse(b, id, "an elementwise node of more than 8 dimensions");
		return;
	}
	vpass vp;
	vp_init(&vp, nd, n->rank ? n->shape : &one);
	vsrc a[3];
	int map[TCP_MAXD];
	for (uint32_t i = 0; i < n->nargs && !b->failed; i++) {
		const ir_node *o = SBN(b, n->args[i]);
		map[0] = -1;
		for (int k = 0; k < n->rank; k++) {
			int d = k - (n->rank - o->rank);
			map[k] = d >= 0 ? d : -1;
		}
		a[i] = operand(b, &vp, n->args[i], map, false);
		for (uint32_t j = 0; j < i && a[i].s == TCP_SRC_IMM; j++)
			if (a[j].s == TCP_SRC_IMM && a[j].imm != a[i].imm)
				a[i] = operand(b, &vp, n->args[i], map, true);
	}
	if (b->failed)
		return;
	moe_dtype at = (moe_dtype)SBN(b, n->args[0])->dtype;
	int op = binop((moe_op)n->op, moe_dtype_is_float(at));
	if (op >= 0)
		step(b, &vp, op, a[0], a[1], id);
	else
		unary_steps(b, &vp, id, a, at);
	if (b->failed)
		return;
	if (vp.in.nstep == 0 && vp.nstream == 0)
		step(b, &vp, TCP_V_OR, SI(0), SI(0), id);
	sb_val *o = elem_out(b, id);
	for (int k = 0; k < nd; k++)
		map[k] = n->rank ? k : -1;
	vp.in.v[TCP_V_DST] = sb_mkview(o, n, nd, map);
	if (n->valid != MOE_NONE)
		vp.in.vreg = (int32_t)b->rows;
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
