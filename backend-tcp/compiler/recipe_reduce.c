/* backend-tcp/compiler/recipe_reduce.c: sched-build's recipes for the row
 * operations of the vector engine: reductions, cumulative sums, the filter's
 * compaction, one-hot and softmax. Each is a pass whose innermost loop is the
 * node's axis (the other dimensions outside it, in order), the row op the
 * vector engine's along that loop, with the steps of docs/tcp-isa.md 7 so
 * that the values are the tests': softmax as max; sub, exp, sum; sub, exp, divide
 * (the exponential computed twice, never stored). */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"
#include "ir/graph_keys.h"

static void axis_order(const ir_node *n, int axis, int *order)
{
	int r = 0;
	for (int i = 0; i < n->rank; i++)
		if (i != axis)
			order[r++] = i;
	order[r] = axis;
}

/* A stream of node sn's value v broadcast (aligned right) into the loop order of src node n. */
static tcp_view row_stream(const ir_node *n, const int *order, const sb_val *v, const ir_node *sn)
{
	int map[TCP_MAXD];
	for (int k = 0; k < n->rank; k++) {
		int d = order[k] - (n->rank - sn->rank);
		map[k] = d >= 0 ? d : -1;
	}
	return sb_mkview(v, sn, n->rank, map);
}

/* The commit of a pass over src node n in the loop order `order` (axis
 * innermost) to dst, node dn's value: keep, dn keeps the axis; else the axis
 * is reduced away (stride 0). */
static void row_commit(tcp_insn *in, const ir_node *n, const int *order, int axis, const sb_val *dst,
	const ir_node *dn, bool keep)
{
	int dmap[TCP_MAXD] = {0};
	for (int k = 0; k < n->rank; k++) {
		int d = order[k];
		if (!keep)
			d = d == axis ? -1 : dn->rank < n->rank && d > axis ? d - 1 : d;
		dmap[k] = d;
	}
	in->v[TCP_V_DST] = sb_mkview(dst, dn, n->rank, dmap);
	if (!keep)
		in->v[TCP_V_DST].stride[n->rank - 1] = 0;
	if (axis == 0 && n->rank >= 2)
		in->flags |= TCP_F_XSLICE; /* the axis is the one spread over slices */
	in->flags |= TCP_F_ROUTE;
}

typedef struct rstep {
	uint8_t op, x, y;
	uint32_t imm;
} rstep;

/* One pass over the shape of n with axis innermost: streams s[0..ns) (values
 * of nodes sn[]), the steps, committed to dst (node dn's shape; keep: it keeps
 * the axis, else it is reduced away and its stride is 0). */
static void row_pass(sb *b, moe_id id, const ir_node *n, int axis, const sb_val *const *s, const ir_node *const *sn,
	int ns, const rstep *st, int nst, uint8_t flags0, const sb_val *dst, const ir_node *dn, bool keep)
{
	if (n->rank < 1 || n->rank > TCP_MAXD) {
		sb_refuse(b, id, "a row operation on a scalar or of more than 8 dimensions");
		return;
	}
	int order[MOE_MAX_RANK];
	axis_order(n, axis, order);
	int64_t dim[TCP_MAXD];
	for (int k = 0; k < n->rank; k++)
		dim[k] = n->shape[order[k]];
	tcp_insn in = tcp_b_vec(n->rank, dim, tcp_view_none());
	for (int k = 0; k < ns; k++)
		in.v[TCP_V_S0 + k] = row_stream(n, order, s[k], sn[k]);
	for (int k = 0; k < nst; k++)
		tcp_b_step(&in, st[k].op, st[k].x, st[k].y, st[k].imm);
	in.step[0].flags = flags0;
	row_commit(&in, n, order, axis, dst, dn, keep);
	if (SBN(b, id)->valid != MOE_NONE && axis > 0 && order[0] == 0)
		in.vreg = (int32_t)sb_valid(b, id);
	sb_emit(b, &in, id);
}

/* A reduce that ends a fusion group (tcp_fuse): the group's chain and the
 * reduce's step, one pass over the shape of its operand with the axis
 * innermost (as row_pass), the chain's streams read in that order. */
static void reduce_chain(sb *b, moe_id id, int axis, uint8_t op)
{
	const ir_node *n = SBN(b, id), *s = SBN(b, n->args[0]);
	if (s->rank < 1 || s->rank > TCP_MAXD || n->valid != MOE_NONE) {
		sb_err(b, id, "%s: a fusion group ends in a reduce of 1 to 8 dimensions, not masked", IR_NK_TCP_FUSE);
		return;
	}
	int order[MOE_MAX_RANK];
	axis_order(s, axis, order);
	int64_t dim[TCP_MAXD];
	for (int k = 0; k < s->rank; k++)
		dim[k] = s->shape[order[k]];
	tcp_insn in = tcp_b_vec(s->rank, dim, tcp_view_none());
	if (!sb_chain_into(b, id, s, order, &in))
		return;
	if (!tcp_b_step(&in, op, TCP_SRC_V, TCP_SRC_NONE, 0)) {
		sb_err(b, id, "%s: the group's chain is too long for one pass", IR_NK_TCP_FUSE);
		return;
	}
	uint8_t ops[TCP_MAXSTEP];
	for (int k = 0; k < in.nstep; k++)
		ops[k] = in.step[k].op;
	if (!tcp_vec_chain_ok(b->m, ops, in.nstep)) {
		sb_err(b, id, "%s: the group's steps break the vector engine's stage order on this machine", IR_NK_TCP_FUSE);
		return;
	}
	const sb_val *o = sb_out_val(b, id);
	bool keep = n->rank == s->rank;
	row_commit(&in, s, order, axis, o, n, keep);
	sb_emit(b, &in, id);
}

void sb_reduce(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *s = SBN(b, n->args[0]);
	int axis = sb_axis(n, s, -1);
	bool fl = moe_dtype_is_float((moe_dtype)s->dtype);
	uint8_t op = n->op == MOE_OP_REDUCE_SUM ? (fl ? TCP_V_FRSUM : TCP_V_RSUM)
		: n->op == MOE_OP_REDUCE_MAX   ? (fl ? TCP_V_FRMAX : TCP_V_RMAX)
					       : (fl ? TCP_V_FRMIN : TCP_V_RMIN);
	if (sb_fused_member(b, n->args[0])) {
		reduce_chain(b, id, axis, op);
		return;
	}
	const sb_val *sv = sb_dm_val(b, n->args[0]);
	if (!sv)
		return;
	const sb_val *o = sb_out_val(b, id);
	rstep st = {op, TCP_SRC_S0, TCP_SRC_NONE, 0};
	row_pass(b, id, s, axis, &sv, &s, 1, &st, 1, 0, o, n, n->rank == s->rank);
}

void sb_cumsum(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *s = SBN(b, n->args[0]);
	int axis = sb_axis(n, s, 0);
	bool fl = moe_dtype_is_float((moe_dtype)s->dtype);
	const sb_val *sv = sb_dm_val(b, n->args[0]);
	if (!sv)
		return;
	const sb_val *o = sb_out_val(b, id);
	rstep st = {fl ? TCP_V_FSCAN : TCP_V_ISCAN, TCP_SRC_S0, TCP_SRC_NONE, 0};
	row_pass(b, id, s, axis, &sv, &s, 1, &st, 1, ir_attr_int(n, "exclusive", 0) ? TCP_STEP_EXCL : 0, o, n, true);
}

void sb_filter(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *mk = SBN(b, n->args[0]), *vn = SBN(b, n->args[1]);
	const sb_val *mv = sb_dm_val(b, n->args[0]);
	const sb_val *vv = mv ? sb_dm_val(b, n->args[1]) : NULL;
	if (!vv)
		return;
	const sb_val *o = sb_out_val(b, id);
	uint32_t fill = sb_imm_of((moe_dtype)n->dtype, ir_attr_float(n, "fill", (double)ir_attr_int(n, "fill", 0)));
	rstep st[2] = {{moe_dtype_is_float((moe_dtype)mk->dtype) ? TCP_V_FTNE : TCP_V_TNE, TCP_SRC_S0, TCP_SRC_IMM, 0},
		{TCP_V_COMPACT, TCP_SRC_S1, TCP_SRC_IMM, fill}};
	const sb_val *s[2] = {mv, vv};
	const ir_node *sn[2] = {mk, vn};
	row_pass(b, id, n, n->rank - 1, s, sn, 2, st, 2, 0, o, n, true);
}

void sb_one_hot(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	if (n->rank < 1 || n->rank > TCP_MAXD) {
		sb_refuse(b, id, "a one_hot of more than 8 dimensions");
		return;
	}
	tcp_insn in = tcp_b_vec(n->rank, n->shape, tcp_view_none());
	int map[TCP_MAXD];
	for (int k = 0; k < n->rank; k++)
		map[k] = k < n->rank - 1 ? k : -1;
	const sb_val *a = sb_dm_val(b, n->args[0]);
	if (!a)
		return;
	in.v[TCP_V_S0] = sb_mkview(a, SBN(b, n->args[0]), n->rank, map);
	tcp_b_step(&in, TCP_V_TEQ, TCP_SRC_S0, TCP_SRC_CTR, 0);
	in.step[0].ctr = (uint8_t)(n->rank - 1);
	const sb_val *o = sb_out_val(b, id);
	for (int k = 0; k < n->rank; k++)
		map[k] = k;
	in.v[TCP_V_DST] = sb_mkview(o, n, n->rank, map);
	in.flags |= TCP_F_ROUTE;
	sb_emit(b, &in, id);
}

void sb_softmax(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	int axis = sb_axis(n, n, -1);
	const sb_val *xv = sb_dm_val(b, n->args[0]);
	if (!xv)
		return;
	static const uint8_t seb[3] = {TCP_V_FSUB, TCP_V_FEXP, TCP_V_FRSUM}, sed[3] = {TCP_V_FSUB, TCP_V_FEXP, TCP_V_FDIV};
	if (!tcp_vec_chain_ok(b->m, seb, 3) || !tcp_vec_chain_ok(b->m, sed, 3)) {
		sb_refuse(b, id, "a softmax on a machine whose float cluster cannot chain sub, exp and sum");
		return;
	}
	/* m = max along axis (kept as size 1), s = sum exp(x - m), y = exp(x - m) / s */
	ir_node kn = *n;
	kn.shape[axis] = 1;
	kn.dtype = MOE_F32;
	sb_val vm = sb_view_of(sb_dm_buf(b, id, "softmax.max", MOE_F32, n->rank, kn.shape), &kn);
	sb_val vs = sb_view_of(sb_dm_buf(b, id, "softmax.sum", MOE_F32, n->rank, kn.shape), &kn);
	const sb_val *s3[3] = {xv, &vm, &vs};
	const ir_node *n3[3] = {n, &kn, &kn};
	rstep mx = {TCP_V_FRMAX, TCP_SRC_S0, TCP_SRC_NONE, 0};
	row_pass(b, id, n, axis, s3, n3, 1, &mx, 1, 0, &vm, &kn, true);
	rstep se[3] = {{TCP_V_FSUB, TCP_SRC_S0, TCP_SRC_S1, 0}, {TCP_V_FEXP, TCP_SRC_V, TCP_SRC_NONE, 0},
		{TCP_V_FRSUM, TCP_SRC_V, TCP_SRC_NONE, 0}};
	row_pass(b, id, n, axis, s3, n3, 2, se, 3, 0, &vs, &kn, true);
	const sb_val *o = sb_out_val(b, id);
	rstep de[3] = {{TCP_V_FSUB, TCP_SRC_S0, TCP_SRC_S1, 0}, {TCP_V_FEXP, TCP_SRC_V, TCP_SRC_NONE, 0},
		{TCP_V_FDIV, TCP_SRC_V, TCP_SRC_S2, 0}};
	row_pass(b, id, n, axis, s3, n3, 3, de, 3, 0, o, n, true);
}
