/* backend-tcp/lower_vec.c: TCP lowering of elementwise ops, reductions, scans,
 * filter, softmax, one_hot, concat and copies to vector-engine passes (tu.vec). */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"

typedef struct vpass {
	int ndim;
	int64_t dim[TCP_MAXD];
	tcp_insn in;
	int nstream;
	int ctr; /* the iteration dimension the chain's counter operand reads, -1: none yet */
} vpass;

static void vp_init(vpass *vp, int ndim, const int64_t *dim)
{
	memset(vp, 0, sizeof *vp);
	vp->in = tcp_insn_init(TCP_OP_TU_VEC);
	vp->ctr = -1;
	vp->ndim = ndim;
	vp->in.ndim = (uint8_t)ndim;
	for (int k = 0; k < ndim; k++)
		vp->dim[k] = vp->in.dim[k] = dim[k];
}

/* An operand source for node id with its node dims mapped to iteration dims. */
typedef struct src {
	uint8_t s;
	uint32_t imm;
	uint8_t ctr;
} src;

/* force: fetch it as a stream even when it is an immediate or an iota */
static src vp_operand_f(lw *c, vpass *vp, moe_id id, const int *map, bool force)
{
	const ir_node *n = N(c->g, id);
	val *v = &c->v[id];
	src r = {TCP_SRC_NONE, 0, 0};
	if (force) {
		/* fall through to the stream below */
	} else if (v->kind == VK_IMM) {
		r.s = TCP_SRC_IMM;
		r.imm = v->imm;
		return r;
	}
	if (v->kind == VK_IOTA) {
		int k = 0;
		while (k < vp->ndim && !(map[k] == v->axis && n->shape[v->axis] > 1))
			k++;
		if (k == vp->ndim) {
			r.s = TCP_SRC_IMM; /* an iota along a dimension of size 1 is 0 */
			return r;
		}
		if (vp->ctr < 0 || vp->ctr == k) {
			vp->ctr = k;
			r.s = TCP_SRC_CTR;
			r.ctr = (uint8_t)k;
			return r;
		}
		/* a step reads one loop counter: a second iota along another
		 * dimension (iota(i) < iota(j)) is fetched as a tensor */
	}
	v = tcpl_dm_view(c, id); /* tensor-unit passes fetch from DM */
	tcp_view w = mkview(v, n, vp->ndim, map);
	for (int k = 0; k < vp->nstream; k++) /* a view already fetched is one stream */
		if (!memcmp(&vp->in.v[TCP_V_S0 + k], &w, sizeof w)) {
			r.s = (uint8_t)(TCP_SRC_S0 + k);
			return r;
		}
	if (vp->nstream >= 3) {
		tcpl_err(c, id, "a vector pass fetches at most three streams");
		return r;
	}
	vp->in.v[TCP_V_S0 + vp->nstream] = w;
	r.s = (uint8_t)(TCP_SRC_S0 + vp->nstream++);
	return r;
}

static src vp_operand(lw *c, vpass *vp, moe_id id, const int *map)
{
	return vp_operand_f(c, vp, id, map, false);
}

static void vp_step(lw *c, vpass *vp, tcp_vop op, src x, src y, moe_id at)
{
	if (vp->in.nstep >= TCP_MAXSTEP) {
		tcpl_err(c, at, "vector chain too long");
		return;
	}
	if (x.s == TCP_SRC_IMM && y.s == TCP_SRC_IMM && x.imm != y.imm) {
		tcpl_err(c, at, "a vector step holds one immediate");
		return;
	}
	if (x.s == TCP_SRC_CTR && y.s == TCP_SRC_CTR && x.ctr != y.ctr) {
		tcpl_err(c, at, "a vector step reads one loop counter");
		return;
	}
	tcp_step *s = &vp->in.step[vp->in.nstep++];
	s->op = (uint8_t)op;
	s->x = x.s;
	s->y = y.s;
	s->imm = x.s == TCP_SRC_IMM ? x.imm : y.imm;
	s->ctr = x.s == TCP_SRC_CTR ? x.ctr : y.ctr;
}

static src SV(void)
{
	return (src){TCP_SRC_V, 0, 0};
}

static src SI(uint32_t imm)
{
	return (src){TCP_SRC_IMM, imm, 0};
}

static src SN(void)
{
	return (src){TCP_SRC_NONE, 0, 0};
}

/* Commit to a fresh DM tensor for node id (out shape), with dst strides per dim. */
static void vp_commit(lw *c, vpass *vp, moe_id id, const tcp_view *dst, int vreg)
{
	vp->in.v[TCP_V_DST] = *dst;
	vp->in.vreg = vreg;
	if (vreg == R_ROWS) /* a block's rows (lower_rows.c) */
		tcpl_emit_block_pass(c, &vp->in);
	else if (vreg >= 0 && tcpl_tile_outside(c, id)) /* guarded row tiles (lower_rows.c) */
		tcpl_emit_row_tiles(c, &vp->in, tcpl_row_tile(vp->in.dim[0]));
	else
		emit(c, &vp->in);
}

static uint32_t f32bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

/* The steps of elementwise node id in pass vp, after those of the operand
 * fused into it (tcpl_plan_chains: fused_into == root, at most one per node,
 * whose result is the chain's running value v). Returns where id's result
 * is: v, or the operand itself when id needs no step (a bitcast). */
static src elem_steps(lw *c, vpass *vp, moe_id id, moe_id root, const int *perm)
{
	const ir_node *n = N(c->g, id);
	int nst0 = vp->in.nstep;
	src a[3];
	int map[TCP_MAXD];
	for (uint32_t i = 0; i < n->nargs; i++) {
		const ir_node *o = N(c->g, n->args[i]);
		if (n->rank == 0)
			map[0] = -1;
		for (int k = 0; k < n->rank; k++) { /* iteration dim k is node dim perm[k] */
			int d = perm[k] - (n->rank - o->rank);
			map[k] = d >= 0 ? d : -1;
		}
		if (c->fused_into[n->args[i]] == root) {
			a[i] = elem_steps(c, vp, n->args[i], root, perm); /* its steps come first: their result is v */
			continue;
		}
		a[i] = vp_operand(c, vp, n->args[i], map);
		/* a step holds one immediate: a second, different one is fetched
		 * (div(iota over a size-1 axis, 1) at T = 1) */
		for (uint32_t j = 0; j < i && a[i].s == TCP_SRC_IMM; j++)
			if (a[j].s == TCP_SRC_IMM && a[j].imm != a[i].imm)
				a[i] = vp_operand_f(c, vp, n->args[i], map, true);
	}
	moe_dtype at = (moe_dtype)N(c->g, n->args[0])->dtype;
	bool fl = moe_dtype_is_float(at);
	tcp_vop op = TCP_V_COUNT;
	switch ((moe_op)n->op) {
	case MOE_OP_ADD: op = fl ? TCP_V_FADD : TCP_V_IADD; break;
	case MOE_OP_SUB: op = fl ? TCP_V_FSUB : TCP_V_ISUB; break;
	case MOE_OP_MUL: op = fl ? TCP_V_FMUL : TCP_V_IMUL; break;
	case MOE_OP_DIV: op = fl ? TCP_V_FDIV : TCP_V_IDIV; break;
	case MOE_OP_MIN: op = fl ? TCP_V_FMIN : TCP_V_IMIN; break;
	case MOE_OP_MAX: op = fl ? TCP_V_FMAX : TCP_V_IMAX; break;
	case MOE_OP_AND: op = TCP_V_AND; break;
	case MOE_OP_OR: op = TCP_V_OR; break;
	case MOE_OP_XOR: op = TCP_V_XOR; break;
	case MOE_OP_SHL: op = TCP_V_SHL; break;
	case MOE_OP_SHR: op = TCP_V_SHR; break;
	case MOE_OP_SAR: op = TCP_V_SAR; break;
	case MOE_OP_EQ: op = fl ? TCP_V_FTEQ : TCP_V_TEQ; break;
	case MOE_OP_NE: op = fl ? TCP_V_FTNE : TCP_V_TNE; break;
	case MOE_OP_LT: op = fl ? TCP_V_FTLT : TCP_V_TLT; break;
	case MOE_OP_LE: op = fl ? TCP_V_FTLE : TCP_V_TLE; break;
	case MOE_OP_GT: op = fl ? TCP_V_FTGT : TCP_V_TGT; break;
	case MOE_OP_GE: op = fl ? TCP_V_FTGE : TCP_V_TGE; break;
	default: break;
	}
	if (op != TCP_V_COUNT) {
		vp_step(c, vp, op, a[0], a[1], id);
	} else {
		switch ((moe_op)n->op) {
		case MOE_OP_NEG:
			if (fl)
				vp_step(c, vp, TCP_V_FNEG, a[0], SN(), id);
			else
				vp_step(c, vp, TCP_V_ISUB, SI(0), a[0], id);
			break;
		case MOE_OP_ABS:
			if (fl) {
				vp_step(c, vp, TCP_V_FABS, a[0], SN(), id);
			} else {
				vp_step(c, vp, TCP_V_ISUB, SI(0), a[0], id);
				vp_step(c, vp, TCP_V_IMAX, a[0], SV(), id);
			}
			break;
		case MOE_OP_EXP: vp_step(c, vp, TCP_V_FEXP, a[0], SN(), id); break;
		case MOE_OP_LOG: vp_step(c, vp, TCP_V_FLOG, a[0], SN(), id); break;
		case MOE_OP_SQRT: vp_step(c, vp, TCP_V_FSQRT, a[0], SN(), id); break;
		case MOE_OP_TANH: vp_step(c, vp, TCP_V_FTANH, a[0], SN(), id); break;
		case MOE_OP_ERF: vp_step(c, vp, TCP_V_FERF, a[0], SN(), id); break;
		case MOE_OP_SIGMOID: vp_step(c, vp, TCP_V_FSIGM, a[0], SN(), id); break;
		case MOE_OP_RSQRT:
			vp_step(c, vp, TCP_V_FSQRT, a[0], SN(), id);
			vp_step(c, vp, TCP_V_FDIV, SI(f32bits(1.0f)), SV(), id);
			break;
		case MOE_OP_NOT: vp_step(c, vp, TCP_V_XOR, a[0], SI(at == MOE_BOOL ? 1u : 0xffffffffu), id); break;
		case MOE_OP_SELECT:
			if (a[1].s == TCP_SRC_IMM && a[2].s == TCP_SRC_IMM && a[1].imm != a[2].imm) {
				/* one immediate per step: the tag compares with 0 (no immediate) */
				vp_step(c, vp, TCP_V_TNE, a[0], SI(0), id);
				tcpl_err(c, id, "select between two different immediates is not lowered");
				break;
			}
			/* a condition computed by the chain's last step, a compare, has set
			 * the tag already (v = tag): the merge reads it */
			if (!(c->fused_into[n->args[0]] == root && vp->in.nstep > nst0 &&
				    tcp_vop_stage[vp->in.step[vp->in.nstep - 1].op] == TCP_ST_TAG))
				vp_step(c, vp, at == MOE_BOOL || !fl ? TCP_V_TNE : TCP_V_FTNE, a[0], SI(0), id);
			vp_step(c, vp, TCP_V_MERGE, a[1], a[2], id);
			break;
		case MOE_OP_CAST: {
			moe_dtype to = (moe_dtype)n->dtype;
			bool tf = moe_dtype_is_float(to);
			if (to == MOE_BOOL && at != MOE_BOOL)
				vp_step(c, vp, fl ? TCP_V_FTNE : TCP_V_TNE, a[0], SI(0), id);
			else if (fl && !tf)
				vp_step(c, vp, TCP_V_FTOI, a[0], SN(), id);
			else if (!fl && tf)
				vp_step(c, vp, TCP_V_ITOF, a[0], SN(), id);
			else if (a[0].s == TCP_SRC_IMM || a[0].s == TCP_SRC_CTR)
				vp_step(c, vp, TCP_V_OR, a[0], SI(0), id);
			break; /* float->float and int->int: the commit narrows */
		}
		case MOE_OP_BITCAST:
			if (a[0].s == TCP_SRC_IMM || a[0].s == TCP_SRC_CTR)
				vp_step(c, vp, TCP_V_OR, a[0], SI(0), id);
			break; /* the lane word is copied unchanged */
		default: tcpl_err(c, id, "op '%s' has no vector-engine lowering", moe_op_name((moe_op)n->op)); return SV();
		}
	}
	if (vp->in.nstep == nst0 && n->nargs)
		return a[0]; /* no step: the lane word passes unchanged */
	return SV();
}

/* Elementwise node -> one pass (with the elementwise operands fused into it). */
void tcpl_lower_elem(lw *c, moe_id id)
{
	if (tcpl_w8a8_lower_q(c, id))
		return;
	const ir_node *n = N(c->g, id);
	vpass vp;
	vp_init(&vp, n->rank, n->shape);
	if (n->rank == 0) {
		vp.ndim = 1;
		vp.in.ndim = 1;
		vp.dim[0] = vp.in.dim[0] = 1;
	}
	int perm[TCP_MAXD];
	for (int k = 0; k < TCP_MAXD; k++)
		perm[k] = k;
	src r = elem_steps(c, &vp, id, id, perm);
	if (c->failed)
		return;
	/* a chain must start from a fetched stream or compute v */
	if (vp.in.nstep == 0 && vp.nstream == 0)
		vp_step(c, &vp, TCP_V_OR, SI(0), SI(0), id);
	/* a float value held as i8 (W8A8's quantized rows, integers of at most
	 * 127 in magnitude: lower_quant.c): converted exactly, the commit keeps
	 * the low byte */
	if (c->store_dt[id] == MOE_I8 && moe_dtype_is_float((moe_dtype)n->dtype))
		vp_step(c, &vp, TCP_V_FTOI, vp.in.nstep ? SV() : r, SN(), id);
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int idm[TCP_MAXD];
	for (int k = 0; k < vp.ndim; k++)
		idm[k] = n->rank ? k : -1;
	tcp_view d = mkview(o, n, vp.ndim, idm);
	vp_commit(c, &vp, id, &d, tcpl_valid_reg(c, id));
}

/* Reduction, scan, compaction, softmax pieces: dims = others + [axis]. */
static void axis_order(const ir_node *n, int axis, int *order)
{
	int r = 0;
	for (int i = 0; i < n->rank; i++)
		if (i != axis)
			order[r++] = i;
	order[r] = axis;
}

/* One pass over src node (or a tensor view) moving `axis` innermost.
 * keep_out: the output keeps the axis (scan/compact/elementwise) or drops it (reduce). */
typedef struct rp3 {
	const val *v;
	const ir_node *n;
} rp3;
static void row_pass3(lw *c, moe_id id, const ir_node *srcn, const val *srcv, const val *src2, const ir_node *s2n,
	rp3 s3, int axis, const tcp_vop *ops, const src *xs, const src *ys, int nops, uint8_t flags0, const val *dst,
	const ir_node *dstn, bool dst_keeps_axis);
static void row_pass(lw *c, moe_id id, const ir_node *srcn, const val *srcv, const val *src2, const ir_node *s2n,
	int axis, const tcp_vop *ops, const src *xs, const src *ys, int nops, uint8_t flags0, const val *dst,
	const ir_node *dstn, bool dst_keeps_axis)
{
	rp3 none = {NULL, NULL};
	row_pass3(c, id, srcn, srcv, src2, s2n, none, axis, ops, xs, ys, nops, flags0, dst, dstn, dst_keeps_axis);
}

/* A row pass's second or third stream: node sn's value v broadcast like
 * numpy (aligned right) into the pass's loop order. */
static tcp_view row_stream(const ir_node *srcn, const int *order, const val *v, const ir_node *sn, int ndim)
{
	int map2[TCP_MAXD];
	for (int k = 0; k < srcn->rank; k++) {
		int d = order[k] - (srcn->rank - sn->rank);
		map2[k] = d >= 0 ? d : -1;
	}
	return mkview(v, sn, ndim, map2);
}

static void row_pass3(lw *c, moe_id id, const ir_node *srcn, const val *srcv, const val *src2, const ir_node *s2n,
	rp3 s3, int axis, const tcp_vop *ops, const src *xs, const src *ys, int nops, uint8_t flags0, const val *dst,
	const ir_node *dstn, bool dst_keeps_axis)
{
	int order[MOE_MAX_RANK];
	axis_order(srcn, axis, order);
	vpass vp;
	int64_t dim[TCP_MAXD];
	for (int k = 0; k < srcn->rank; k++)
		dim[k] = srcn->shape[order[k]];
	vp_init(&vp, srcn->rank, dim);
	int map[TCP_MAXD];
	for (int k = 0; k < srcn->rank; k++)
		map[k] = order[k];
	vp.in.v[TCP_V_S0] = mkview(srcv, srcn, vp.ndim, map);
	vp.nstream = 1;
	if (src2) {
		vp.in.v[TCP_V_S1] = row_stream(srcn, order, src2, s2n, vp.ndim);
		vp.nstream = 2;
	}
	if (src2 && s3.v) {
		vp.in.v[TCP_V_S2] = row_stream(srcn, order, s3.v, s3.n, vp.ndim);
		vp.nstream = 3;
	}
	for (int i = 0; i < nops; i++) {
		vp_step(c, &vp, ops[i], xs[i], ys[i], id);
		if (i == 0)
			vp.in.step[0].flags = flags0;
	}
	/* destination: same iteration order; a dropped axis has stride 0 */
	int dmap[TCP_MAXD];
	for (int k = 0; k < srcn->rank; k++) {
		int d = order[k];
		if (!dst_keeps_axis) {
			if (d == axis)
				d = -1;
			else if (dstn->rank < srcn->rank && d > axis)
				d--;
		}
		dmap[k] = d;
	}
	tcp_view dv = mkview(dst, dstn, vp.ndim, dmap);
	if (!dst_keeps_axis)
		dv.stride[vp.ndim - 1] = 0;
	if (axis == 0 && srcn->rank >= 2)
		vp.in.flags |= TCP_F_XSLICE; /* the axis is the one spread over slices */
	/* a masked reduce / softmax (axis > 0): its rows are the pass's outer loop */
	vp_commit(c, &vp, id, &dv, axis > 0 && order[0] == 0 ? tcpl_valid_reg(c, id) : -1);
}

/* Operand k of the fused mul m, viewed in the shape of the reshape r that
 * follows m ([a*b, rest] -> [a, b, rest]). */
static bool fused_operand(lw *c, moe_id m, moe_id r, int k, val *out)
{
	const ir_node *mn = N(c->g, m), *rn = N(c->g, r), *on = N(c->g, mn->args[k]);
	val *v = tcpl_dm_view(c, mn->args[k]);
	if (v->kind != VK_VIEW || v->region)
		return false;
	int map[MOE_MAX_RANK];
	bmap(on, mn->rank, map);
	int64_t st[MOE_MAX_RANK] = {0};
	for (int d = 0; d < mn->rank; d++)
		st[d] = map[d] >= 0 && on->shape[map[d]] > 1 ? v->stride[map[d]] : 0;
	*out = *v;
	out->stride[0] = st[0] * rn->shape[1];
	out->stride[1] = st[0];
	for (int d = 1; d < mn->rank; d++)
		out->stride[d + 1] = st[d];
	return true;
}

/* A reduce whose elementwise operand (and that one's chain) is fused into
 * its pass (tcpl_plan_chains): the operand's steps, then the row op. */
static void reduce_chain(lw *c, moe_id id, int axis, bool fl)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	int order[MOE_MAX_RANK];
	axis_order(s, axis, order);
	int64_t dim[TCP_MAXD];
	for (int k = 0; k < s->rank; k++)
		dim[k] = s->shape[order[k]];
	vpass vp;
	vp_init(&vp, s->rank, dim);
	src r = elem_steps(c, &vp, n->args[0], id, order);
	tcp_vop op = n->op == MOE_OP_REDUCE_SUM ? (fl ? TCP_V_FRSUM : TCP_V_RSUM)
		: n->op == MOE_OP_REDUCE_MAX   ? (fl ? TCP_V_FRMAX : TCP_V_RMAX)
					       : (fl ? TCP_V_FRMIN : TCP_V_RMIN);
	vp_step(c, &vp, op, r, SN(), id);
	if (c->failed)
		return;
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int dmap[TCP_MAXD];
	bool keep = n->rank == s->rank;
	for (int k = 0; k < s->rank; k++) {
		int d = order[k];
		if (!keep)
			d = d == axis ? -1 : d > axis ? d - 1 : d;
		dmap[k] = d;
	}
	tcp_view dv = mkview(o, n, vp.ndim, dmap);
	dv.stride[vp.ndim - 1] = 0;
	if (axis == 0 && s->rank >= 2)
		vp.in.flags |= TCP_F_XSLICE;
	vp_commit(c, &vp, id, &dv, axis > 0 && order[0] == 0 ? tcpl_valid_reg(c, id) : -1);
}

void tcpl_lower_reduce(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	int axis = norm_axis(n, s, -1);
	if (c->fused_into[n->args[0]] == id && s->op == MOE_OP_RESHAPE) {
		/* reduce_sum(reshape(mul(a, b))): one pass, f.mul then r.fsum, so the
		 * product (the size of the combine's gathered rows) never exists */
		moe_id r = n->args[0], m = N(c->g, r)->args[0];
		val a, b;
		if (!fused_operand(c, m, r, 0, &a) || !fused_operand(c, m, r, 1, &b)) {
			tcpl_err(c, id, "fused multiply-reduce operands are not views");
			return;
		}
		val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
		tcp_vop ops[2] = {TCP_V_FMUL, TCP_V_FRSUM};
		src xs[2] = {{TCP_SRC_S0, 0, 0}, SV()}, ys[2] = {{TCP_SRC_S1, 0, 0}, SN()};
		row_pass(c, id, s, &a, &b, s, axis, ops, xs, ys, 2, 0, o, n, n->rank == s->rank);
		return;
	}
	bool fl = moe_dtype_is_float((moe_dtype)s->dtype);
	if (c->fused_into[n->args[0]] == id) {
		reduce_chain(c, id, axis, fl);
		return;
	}
	tcp_vop op = n->op == MOE_OP_REDUCE_SUM ? (fl ? TCP_V_FRSUM : TCP_V_RSUM)
		: n->op == MOE_OP_REDUCE_MAX   ? (fl ? TCP_V_FRMAX : TCP_V_RMAX)
					       : (fl ? TCP_V_FRMIN : TCP_V_RMIN);
	val *sv = tcpl_dm_view(c, n->args[0]);
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	/* keepdims: the output has the axis with size 1, which mkview maps to stride 0 */
	src x = SV(), y = SN();
	x.s = TCP_SRC_S0;
	row_pass(c, id, s, sv, NULL, NULL, axis, &op, &x, &y, 1, 0, o, n, n->rank == s->rank);
}

void tcpl_lower_cumsum(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	int axis = norm_axis(n, s, 0);
	bool fl = moe_dtype_is_float((moe_dtype)s->dtype);
	tcp_vop op = fl ? TCP_V_FSCAN : TCP_V_ISCAN;
	val *sv = tcpl_dm_view(c, n->args[0]);
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	src x = {TCP_SRC_S0, 0, 0}, y = SN();
	row_pass(c, id, s, sv, NULL, NULL, axis, &op, &x, &y, 1, ir_attr_int(n, "exclusive", 0) ? TCP_STEP_EXCL : 0, o,
		n, true);
}

void tcpl_lower_filter(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *mk = N(c->g, n->args[0]), *vn = N(c->g, n->args[1]);
	if (!ir_same_shape(mk, vn)) {
		/* broadcast operands: materialize through views of the output shape */
	}
	val *mv = tcpl_dm_view(c, n->args[0]);
	val *vv = tcpl_dm_view(c, n->args[1]);
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	tcp_vop ops[2] = {moe_dtype_is_float((moe_dtype)mk->dtype) ? TCP_V_FTNE : TCP_V_TNE, TCP_V_COMPACT};
	src xs[2] = {{TCP_SRC_S0, 0, 0}, {TCP_SRC_S1, 0, 0}};
	src ys[2] = {SI(0), SI(imm_of(n, ir_attr_float(n, "fill", (double)ir_attr_int(n, "fill", 0))))};
	row_pass(c, id, n, mv, vv, vn, n->rank - 1, ops, xs, ys, 2, 0, o, n, true);
	(void)vn;
}

void tcpl_lower_softmax(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	int axis = norm_axis(n, n, -1);
	val *xv = tcpl_dm_view(c, n->args[0]);
	val xs = *xv;
	/* m = max along axis (kept as size 1), z = exp(x - m), s = sum z, y = z / s */
	int64_t ks[MOE_MAX_RANK];
	memcpy(ks, n->shape, sizeof ks);
	ks[axis] = 1;
	ir_node kn = *n, fn = *n;
	memcpy(kn.shape, ks, sizeof ks);
	kn.dtype = fn.dtype = MOE_F32;
	int32_t tm = tcpl_dm_tensor(c, id, "softmax.max", MOE_F32, n->rank, ks);
	int32_t ts = tcpl_dm_tensor(c, id, "softmax.sum", MOE_F32, n->rank, ks);
	val vm = tview(tm, id, &kn), vs = tview(ts, id, &kn);
	src s0 = {TCP_SRC_S0, 0, 0}, s1 = {TCP_SRC_S1, 0, 0}, sn = SN();
	tcp_vop op = TCP_V_FRMAX;
	row_pass(c, id, n, &xs, NULL, NULL, axis, &op, &s0, &sn, 1, 0, &vm, &kn, true);
	/* z = exp(x - m) in one pass where the float cluster chains f.sub and f.exp;
	 * with the sum (reduce stage) and the division (fpdiv stage) after it when
	 * the chain allows, two passes for z, s and y */
	tcp_vop se[3] = {TCP_V_FSUB, TCP_V_FEXP, TCP_V_FRSUM};
	uint8_t seb[3] = {TCP_V_FSUB, TCP_V_FEXP, TCP_V_FRSUM}, sed[3] = {TCP_V_FSUB, TCP_V_FEXP, TCP_V_FDIV};
	src sx[3] = {s0, SV(), SV()}, sy[3] = {s1, sn, sn};
	if (tcp_vec_chain_ok(c->m, seb, 3) && tcp_vec_chain_ok(c->m, sed, 3)) {
		/* s = sum exp(x - m) in one pass, and y = exp(x - m) / s in another
		 * that computes the same exp again: z is never stored */
		row_pass(c, id, n, &xs, &vm, &kn, axis, se, sx, sy, 3, 0, &vs, &kn, true);
		val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
		tcp_vop de[3] = {TCP_V_FSUB, TCP_V_FEXP, TCP_V_FDIV};
		src dy[3] = {s1, sn, {TCP_SRC_S2, 0, 0}};
		rp3 st = {&vs, &kn};
		row_pass3(c, id, n, &xs, &vm, &kn, st, axis, de, sx, dy, 3, 0, o, n, true);
		tcpl_dm_free(c, tm);
		tcpl_dm_free(c, ts);
		return;
	}
	int32_t tz = tcpl_dm_tensor(c, id, "softmax.z", MOE_F32, n->rank, n->shape);
	val vz = tview(tz, id, &fn);
	if (tcp_vec_chain_ok(c->m, seb, 2)) {
		row_pass(c, id, n, &xs, &vm, &kn, axis, se, sx, sy, 2, 0, &vz, &fn, true);
	} else {
		row_pass(c, id, n, &xs, &vm, &kn, axis, &se[0], &s0, &s1, 1, 0, &vz, &fn, true);
		row_pass(c, id, n, &vz, NULL, NULL, axis, &se[1], &s0, &sn, 1, 0, &vz, &fn, true);
	}
	op = TCP_V_FRSUM;
	row_pass(c, id, n, &vz, NULL, NULL, axis, &op, &s0, &sn, 1, 0, &vs, &kn, true);
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	op = TCP_V_FDIV;
	row_pass(c, id, n, &vz, &vs, &kn, axis, &op, &s0, &s1, 1, 0, o, n, true);
	tcpl_dm_free(c, tm);
	tcpl_dm_free(c, tz);
	tcpl_dm_free(c, ts);
}

void tcpl_lower_one_hot(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	vpass vp;
	vp_init(&vp, n->rank, n->shape);
	int map[TCP_MAXD];
	for (int k = 0; k < n->rank; k++)
		map[k] = k < n->rank - 1 ? k : -1;
	src a = vp_operand(c, &vp, n->args[0], map);
	src ct = {TCP_SRC_CTR, 0, (uint8_t)(n->rank - 1)};
	vp_step(c, &vp, TCP_V_TEQ, a, ct, id);
	val *o = tcpl_out_val(c, id, MOE_I32);
	int idm[TCP_MAXD];
	for (int k = 0; k < n->rank; k++)
		idm[k] = k;
	tcp_view d = mkview(o, n, n->rank, idm);
	vp_commit(c, &vp, id, &d, -1);
}

/* Leaves used as tensors (a const or iota that must exist in memory). */
void tcpl_materialize(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	val keep = c->v[id];
	vpass vp;
	int64_t one = 1;
	vp_init(&vp, n->rank ? n->rank : 1, n->rank ? n->shape : &one);
	if (keep.kind == VK_IMM)
		vp_step(c, &vp, TCP_V_OR, SI(keep.imm), SI(keep.imm), id);
	else
		vp_step(c, &vp, TCP_V_IADD, (src){TCP_SRC_CTR, 0, (uint8_t)keep.axis}, SI(0), id);
	int32_t t = tcpl_dm_tensor(c, id, "materialized", (moe_dtype)n->dtype, n->rank, n->shape);
	c->v[id] = tview(t, id, n);
	int idm[TCP_MAXD];
	for (int k = 0; k < vp.ndim; k++)
		idm[k] = n->rank ? k : -1;
	tcp_view d = mkview(&c->v[id], n, vp.ndim, idm);
	vp_commit(c, &vp, id, &d, -1);
}

/* A contiguous DM copy of a strided view (a pass with no ALU steps). */
val *tcpl_copy_contig(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	vpass vp;
	int64_t one = 1;
	vp_init(&vp, n->rank ? n->rank : 1, n->rank ? n->shape : &one);
	int map[TCP_MAXD];
	for (int k = 0; k < vp.ndim; k++)
		map[k] = n->rank ? k : -1;
	vp_operand(c, &vp, id, map);
	int32_t t = tcpl_dm_tensor(c, id, "contiguous", (moe_dtype)n->dtype, n->rank, n->shape);
	moe_id owner = c->v[id].owner;
	c->v[id] = tview(t, owner, n);
	tcp_view d = mkview(&c->v[id], n, vp.ndim, map);
	vp_commit(c, &vp, id, &d, -1);
	return &c->v[id];
}

/* concat: one copy pass per part into its slice of the output (lower-topk
 * concatenates the ranks of row chunks). */
void tcpl_lower_concat(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	int axis = norm_axis(n, n, 0);
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int64_t off = 0;
	for (uint32_t i = 0; i < n->nargs && !c->failed; i++) {
		const ir_node *a = N(c->g, n->args[i]);
		vpass vp;
		int map[TCP_MAXD];
		vp_init(&vp, a->rank, a->shape);
		for (int k = 0; k < a->rank; k++)
			map[k] = k;
		vp_operand(c, &vp, n->args[i], map);
		tcp_view d = mkview(o, n, vp.ndim, map);
		d.base += off * o->stride[axis];
		vp_commit(c, &vp, id, &d, -1);
		off += a->shape[axis];
	}
}
