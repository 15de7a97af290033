/* backend-tcp/compiler/recipe_route.c: sched-build's recipes for gather and
 * scatter, in the forms machine revision 3 has: a gather moves HBM rows into
 * DM by an i32 list of row positions in DM; a scatter moves DM rows to HBM at
 * the byte offsets of an HBM list (one vector pass scales the positions by
 * the row's bytes into DM, one copy moves them to HBM). A scatter's result is
 * an HBM buffer, which starts zeroed (docs/tcp-isa.md, assumption A7): a zero
 * base needs no copy. */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"

static int64_t prod(const int64_t *s, int a, int b)
{
	int64_t r = 1;
	for (int i = a; i < b; i++)
		r *= s[i];
	return r;
}

/* An indirect DMA over [groups, nidx, row]; strides of dst, src and the index list. */
static tcp_insn dma_gs(bool gather, const sb_val *dst, const sb_val *src, const sb_val *idx, const int64_t dim[3],
	int64_t rows, const int64_t ds[2], const int64_t ss[2], const int64_t is[2])
{
	const int64_t dst_st[3] = {ds[0], ds[1], 1}, src_st[3] = {ss[0], ss[1], 1}, ix_st[2] = {is[0], is[1]};
	tcp_view d = tcp_b_view((int32_t)dst->buf, dst->base, 3, dst_st), s = tcp_b_view((int32_t)src->buf, src->base, 3, src_st),
		 x = tcp_b_view((int32_t)idx->buf, idx->base, 2, ix_st);
	return gather ? tcp_b_dma_gather(3, dim, d, s, x, rows) : tcp_b_dma_scatter(3, dim, d, s, x, rows);
}

void sb_gather(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *x = SBN(b, n->args[0]), *ix = SBN(b, n->args[1]);
	int axis = sb_axis(n, x, 0);
	const sb_val *xv = &b->v[n->args[0]];
	if (xv->kind != SV_VIEW || b->s->buf[xv->buf].space != TCP_HBM || !sb_contig(xv, x) || xv->reg != TS_NONE) {
		sb_refuse(b, id, "a gather from a value that is not a contiguous HBM tensor");
		return;
	}
	const sb_val *iv = sb_dm_val(b, n->args[1]);
	if (!iv)
		return;
	if (!sb_contig(iv, ix)) {
		sb_refuse(b, id, "a gather by a strided index list");
		return;
	}
	if (n->valid != MOE_NONE) {
		sb_refuse(b, id, "a gather under a valid mask");
		return;
	}
	const sb_val *o = sb_out_val(b, id);
	int64_t groups = prod(x->shape, 0, axis), rows = x->shape[axis], row = prod(x->shape, axis + 1, x->rank);
	int64_t ni = ir_numel(ix), dim[3] = {groups, ni, row};
	const int64_t ds[2] = {ni * row, row}, ss[2] = {rows * row, row}, is[2] = {0, 1};
	tcp_insn in = dma_gs(true, o, xv, iv, dim, rows, ds, ss, is);
	sb_emit(b, &in, id);
}

/* idx (DM, ni positions) times rb bytes, as an HBM list */
static sb_val scaled_list(sb *b, moe_id id, const sb_val *iv, int64_t ni, int64_t rb)
{
	ts_id sd = sb_dm_buf(b, id, "index.bytes", MOE_I32, 1, &ni);
	ts_id sh = sb_hbm_buf(b, id, "index.bytes.hbm", TCP_T_SCRATCH, MOE_I32, 1, &ni);
	const int64_t one = 1;
	tcp_insn v = tcp_b_vec(1, &ni, tcp_b_flat((int32_t)sd));
	v.v[TCP_V_S0] = tcp_b_view((int32_t)iv->buf, iv->base, 1, &one);
	tcp_b_step(&v, TCP_V_IMUL, TCP_SRC_V, TCP_SRC_IMM, (uint32_t)rb);
	v.flags |= TCP_F_ROUTE;
	sb_emit(b, &v, id);
	tcp_insn c = tcp_b_dma_copy_flat((int32_t)sh, (int32_t)sd, ni);
	sb_emit(b, &c, id);
	sb_val r;
	memset(&r, 0, sizeof r);
	r.kind = SV_VIEW;
	r.buf = sh;
	r.reg = TS_NONE;
	r.stride[0] = 1;
	return r;
}

void sb_scatter(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *ix = SBN(b, n->args[1]), *sn = SBN(b, n->args[2]);
	if (strcmp(ir_attr_str(n, "mode", "set"), "set")) {
		sb_refuse(b, id, "a scatter with mode=add");
		return;
	}
	if (n->valid != MOE_NONE || n->rank < 1) {
		sb_refuse(b, id, "a scatter under a valid mask or of a scalar");
		return;
	}
	ts_id t = sb_hbm_buf(b, id, n->name ? n->name : "scatter", TCP_T_SCRATCH, (moe_dtype)n->dtype, n->rank, n->shape);
	sb_val o = sb_view_of(t, n);
	int64_t rows = n->shape[0], row = prod(n->shape, 1, n->rank), ni = ir_numel(ix);
	const sb_val *bv = &b->v[n->args[0]];
	if (!(bv->kind == SV_IMM && bv->imm == 0)) {
		bv = sb_dm_val(b, n->args[0]);
		if (!bv)
			return;
		if (!sb_contig(bv, SBN(b, n->args[0]))) {
			sb_refuse(b, id, "a scatter into a strided base");
			return;
		}
		const int64_t one = 1, total = rows * row;
		tcp_insn c = tcp_b_dma_copy(1, &total, tcp_b_flat((int32_t)t), tcp_b_view((int32_t)bv->buf, bv->base, 1, &one));
		sb_emit(b, &c, id);
	}
	const sb_val *iv = sb_dm_val(b, n->args[1]);
	const sb_val *sv = iv ? sb_dm_val(b, n->args[2]) : NULL;
	if (!sv)
		return;
	if (!sb_contig(iv, ix) || !sb_contig(sv, sn)) {
		sb_refuse(b, id, "a scatter of strided views");
		return;
	}
	sb_val hl = scaled_list(b, id, iv, ni, row * (int64_t)moe_dtype_size((moe_dtype)n->dtype));
	int64_t dim[3] = {1, ni, row};
	const int64_t ds[2] = {rows * row, row}, ss[2] = {ni * row, row}, is[2] = {ni, 1};
	tcp_insn in = dma_gs(false, &o, sv, &hl, dim, rows, ds, ss, is);
	in.flags |= TCP_F_HBMIDX;
	sb_emit(b, &in, id);
	b->v[id] = o;
}
