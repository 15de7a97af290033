/* backend-tcp/compiler/recipe_route.c: sched-build's recipes for gather,
 * take_along and scatter (mode=add: vector passes, at scatter_add), in the
 * forms machine revision 3 has: a gather moves HBM rows into
 * DM by an i32 list of row positions in DM; a scatter moves DM rows to HBM at
 * the byte offsets of an HBM list (one vector pass scales the positions by
 * the row's bytes into DM, one copy moves them to HBM). A scatter's result is
 * an HBM buffer, which starts zeroed (docs/tcp-isa.md, assumption A7): a zero
 * base needs no copy. A gather read only as scatters' sources is spillable
 * (dmplan.h): kept in HBM when the planner says so, it is gathered chunk by
 * chunk into a DM staging buffer and copied to HBM, and each scatter copies
 * it back chunk by chunk into a staging buffer it scatters from. A value
 * of the top graph with a gap before its next reader is spillable too
 * (sb_spill_value). */
#include <stdio.h>
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

/* The staging of a spilled [n, row] buffer: the rows of one chunk, at most
 * TS_STAGE_SLICE bytes per slice (at least one row). */
#define TS_STAGE_SLICE 32768
static int64_t stage_rows(const sb *b, int64_t n, int64_t row_bytes)
{
	int64_t c = TS_STAGE_SLICE * b->S / (row_bytes > 0 ? row_bytes : 1);
	return c < 1 ? 1 : c > n ? n : c;
}

bool sb_in_hbm(const sb *b, moe_id id)
{
	if (b->g != b->top)
		return false;
	for (uint32_t k = 0; k < b->nhbm; k++)
		if (b->hbm[k] == id)
			return true;
	return false;
}

/* A gather of the top graph outside the loop, one group, not an output,
 * read only as the source of scatters. */
static bool spillable(const sb *b, moe_id id, int64_t groups)
{
	const moe_graph *g = b->g;
	if (g != b->top || b->rows != TS_NONE || groups != 1 || SBN(b, id)->rank != 2)
		return false;
	for (uint32_t k = 0; k < g->nout; k++)
		if (g->outputs[k] == id)
			return false;
	bool used = false;
	for (moe_id u = id + 1; u < g->nnodes; u++) {
		const ir_node *un = &g->nodes[u];
		if (un->valid == id)
			return false;
		for (uint32_t k = 0; k < un->nargs; k++)
			if (un->args[k] == id) {
				if (un->op != MOE_OP_SCATTER || k != 2)
					return false;
				used = true;
			}
	}
	return used;
}

/* The spilled gather: chunk by chunk into a DM staging, then to HBM. */
/* The type a gather or scatter of node id stores, reading view src: the
 * node's, or i8 where src holds W8A8's integers as i8 (recipe_qact.c: x.q
 * and its dispatch keep that type). */
static moe_dtype moved_type(const sb *b, moe_id id, const sb_val *src)
{
	return b->s->buf[src->buf].dtype == MOE_I8 ? MOE_I8 : (moe_dtype)SBN(b, id)->dtype;
}

static void gather_spilled(sb *b, moe_id id, const sb_val *xv, const sb_val *iv, int64_t rows, int64_t ni, int64_t row)
{
	const ir_node *n = SBN(b, id);
	moe_dtype dt = moved_type(b, id, xv);
	int64_t eb = (int64_t)moe_dtype_size(dt), ch = stage_rows(b, ni, row * eb);
	ts_id t = sb_hbm_buf(b, id, n->name ? n->name : "gather", TCP_T_SCRATCH, dt, n->rank, n->shape);
	const int64_t sh[2] = {ch, row}, one = 1;
	ts_id st = sb_dm_buf(b, id, "gather.stage", dt, 2, sh);
	sb_val sv = sb_view_of(st, n);
	for (int64_t r0 = 0; r0 < ni; r0 += ch) {
		int64_t c = ni - r0 < ch ? ni - r0 : ch, dim[3] = {1, c, row}, total = c * row;
		sb_val ic = *iv;
		ic.base += r0;
		const int64_t ds[2] = {c * row, row}, ss[2] = {rows * row, row}, is[2] = {0, 1};
		tcp_insn in = dma_gs(true, &sv, xv, &ic, dim, rows, ds, ss, is);
		in.vreg = (int32_t)sb_valid_less(b, id, sb_valid(b, id), r0);
		sb_emit(b, &in, id);
		tcp_insn cp =
			tcp_b_dma_copy(1, &total, tcp_b_view((int32_t)t, r0 * row, 1, &one), tcp_b_view((int32_t)st, 0, 1, &one));
		sb_emit(b, &cp, id);
	}
	b->v[id] = sb_view_of(t, n);
}

/* Records a spill for the planner; when the list is full, the largest
 * (by the HBM bytes of its round trip) are kept, the earlier on ties. */
static void add_spill(sb *b, ts_spill sp)
{
	ts_wdemand *d = &b->wd;
	if (d->nspill < TS_MAX_SPILLS) {
		d->spill[d->nspill++] = sp;
		return;
	}
	uint32_t lo = 0;
	for (uint32_t k = 1; k < d->nspill; k++)
		if (d->spill[k].extra <= d->spill[lo].extra)
			lo = k;
	if (sp.extra <= d->spill[lo].extra)
		return;
	memmove(&d->spill[lo], &d->spill[lo + 1], (d->nspill - lo - 1) * sizeof *d->spill);
	d->spill[d->nspill - 1] = sp;
}

/* The source of gather or take_along id (its operand 0) as a contiguous HBM
 * view: the value itself, or (a contiguous DM value of the top graph) copied
 * to HBM once, since revision 3 gathers from HBM only; NULL with a refusal
 * naming what (`a gather`) otherwise. */
static const sb_val *hbm_source(sb *b, moe_id id, sb_val *hv, const char *what)
{
	const ir_node *x = SBN(b, SBN(b, id)->args[0]);
	const sb_val *xv = &b->v[SBN(b, id)->args[0]];
	if (xv->kind == SV_VIEW && b->s->buf[xv->buf].space == TCP_DM && sb_contig(xv, x) && xv->reg == TS_NONE &&
		b->g == b->top) {
		ts_id h = sb_hbm_buf(b, id, x->name ? x->name : "gather.src", TCP_T_SCRATCH,
			(moe_dtype)b->s->buf[xv->buf].dtype, x->rank, x->shape);
		tcp_insn c = tcp_b_dma_copy_flat((int32_t)h, (int32_t)xv->buf, ir_numel(x));
		c.v[TCP_V_S0].base = xv->base;
		sb_emit(b, &c, id);
		*hv = sb_view_of(h, x);
		xv = hv;
	}
	if (xv->kind != SV_VIEW || b->s->buf[xv->buf].space != TCP_HBM || !sb_contig(xv, x) || xv->reg != TS_NONE) {
		char m[96];
		snprintf(m, sizeof m, "%s from a value that is not a contiguous HBM tensor", what);
		sb_refuse(b, id, m);
		return NULL;
	}
	return xv;
}

void sb_gather(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *x = SBN(b, n->args[0]), *ix = SBN(b, n->args[1]);
	int axis = sb_axis(n, x, 0);
	sb_val hv;
	const sb_val *xv = hbm_source(b, id, &hv, "a gather");
	if (!xv)
		return;
	const sb_val *iv = sb_dm_val(b, n->args[1]);
	if (!iv)
		return;
	if (!sb_contig(iv, ix)) {
		sb_refuse(b, id, "a gather by a strided index list");
		return;
	}
	int64_t groups = prod(x->shape, 0, axis), rows = x->shape[axis], row = prod(x->shape, axis + 1, x->rank);
	int64_t ni = ir_numel(ix), dim[3] = {groups, ni, row};
	if (n->valid != MOE_NONE && (groups != 1 || ix->rank != 1)) {
		sb_refuse(b, id, "a gather under a valid mask other than along one index list");
		return;
	}
	bool spill = spillable(b, id, groups);
	if (spill && sb_in_hbm(b, id)) {
		gather_spilled(b, id, xv, iv, rows, ni, row);
		return;
	}
	moe_dtype dt = moved_type(b, id, xv);
	if (dt != n->dtype)
		b->v[id] = sb_view_of(sb_dm_buf(b, id, n->name ? n->name : "gather", dt, n->rank, n->shape), n);
	const sb_val *o = dt != n->dtype ? &b->v[id] : sb_out_val(b, id);
	const int64_t ds[2] = {ni * row, row}, ss[2] = {rows * row, row}, is[2] = {0, 1};
	tcp_insn in = dma_gs(true, o, xv, iv, dim, rows, ds, ss, is);
	in.vreg = (int32_t)sb_valid(b, id); /* indices at and past the count not used, their rows zero */
	sb_emit(b, &in, id);
	if (spill) {
		int64_t eb = (int64_t)moe_dtype_size(dt), ch = stage_rows(b, ni, row * eb);
		const ts_layout *L = &b->s->buf[o->buf].layout;
		int64_t stage = ((ch * row * eb + b->S - 1) / b->S + b->m->flit_bytes - 1) / b->m->flit_bytes * b->m->flit_bytes;
		add_spill(b, (ts_spill){o->buf, id, TS_NONE, stage < L->slice_bytes ? stage : L->slice_bytes, 2 * ni * row * eb});
	}
}

/* idx (DM, ni positions) times rb bytes, as an HBM list; iv NULL: the
 * positions are the iota 0 .. ni - 1, the pass's counter (no pass of its
 * own writes them into DM first) */
static sb_val scaled_list(sb *b, moe_id id, const sb_val *iv, int64_t ni, int64_t rb)
{
	ts_id sd = sb_dm_buf(b, id, "index.bytes", MOE_I32, 1, &ni);
	ts_id sh = sb_hbm_buf(b, id, "index.bytes.hbm", TCP_T_SCRATCH, MOE_I32, 1, &ni);
	const int64_t one = 1;
	tcp_insn v = tcp_b_vec(1, &ni, tcp_b_flat((int32_t)sd));
	if (iv)
		v.v[TCP_V_S0] = tcp_b_view((int32_t)iv->buf, iv->base, 1, &one);
	tcp_b_step(&v, TCP_V_IMUL, iv ? TCP_SRC_V : TCP_SRC_CTR, TCP_SRC_IMM, (uint32_t)rb);
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

/* take_along along the last axis: x as [groups, rows], the index list as
 * [groups, k]; one gather of one-element rows, dst[g, j] = x[g, i[g, j]].
 * Under a valid count of leading rows, the count times the groups per
 * leading row limits the groups (flags=vrows); the rows past it are zero,
 * as the reference leaves them. */
void sb_take_along(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *x = SBN(b, n->args[0]), *ix = SBN(b, n->args[1]);
	if (x->rank < 1 || ix->rank != x->rank || sb_axis(n, x, -1) != x->rank - 1) {
		sb_refuse(b, id, "a take_along along an axis other than the last");
		return;
	}
	sb_val hv;
	const sb_val *xv = hbm_source(b, id, &hv, "a take_along");
	if (!xv)
		return;
	if (b->s->buf[xv->buf].dtype != n->dtype) {
		sb_refuse(b, id, "a take_along from a value held in another type");
		return;
	}
	const sb_val *iv = sb_dm_val(b, n->args[1]);
	if (!iv)
		return;
	if (!sb_contig(iv, ix)) {
		sb_refuse(b, id, "a take_along by a strided index list");
		return;
	}
	int64_t groups = prod(x->shape, 0, x->rank - 1), rows = x->shape[x->rank - 1], k = ix->shape[ix->rank - 1];
	ts_id cnt = sb_valid(b, id);
	if (b->failed)
		return;
	bool vrows = cnt != TS_NONE && x->rank > 1; /* rank 1: the count limits the k indices */
	int64_t per = x->rank > 1 && x->shape[0] > 0 ? groups / x->shape[0] : 1;
	if (vrows && per > 1) /* [T, G, E]: n leading rows are n x G groups */
		cnt = ts_add_scalar(b->s, b->rg, "groups", TS_SC_ALU, TCP_S_MUL, cnt, TS_NONE, per);
	const sb_val *o = sb_out_val(b, id);
	const int64_t dim[3] = {groups, k, 1}, ds[2] = {k, 1}, ss[2] = {rows, 1}, is[2] = {k, 1};
	tcp_insn in = dma_gs(true, o, xv, iv, dim, rows, ds, ss, is);
	in.vreg = (int32_t)cnt;
	if (vrows)
		in.flags |= TCP_F_VROWS;
	sb_emit(b, &in, id);
}

/* The most index rows a scatter with mode=add takes: one pass per row. */
#define TS_SCATTER_ADD_MAX 4096

/* A vector pass over n elements of buffer d from s (flat, both contiguous):
 * the fetch widens to the lane word, the commit narrows (bf16 rounds to
 * nearest even once); with imm, no source: every element the lane word w. */
static void vec_copy(sb *b, moe_id id, ts_id d, const sb_val *s, bool imm, uint32_t w, int64_t n)
{
	const int64_t one = 1;
	tcp_insn in = tcp_b_vec(1, &n, tcp_b_flat((int32_t)d));
	if (imm)
		tcp_b_step(&in, TCP_V_OR, TCP_SRC_IMM, TCP_SRC_IMM, w);
	else
		in.v[TCP_V_S0] = tcp_b_view((int32_t)s->buf, s->base, 1, &one);
	in.flags |= TCP_F_ROUTE;
	sb_emit(b, &in, id);
}

/* scatter with mode=add (docs/ir.md): base copied, then for p = 0, 1, ...
 * in row-major order of the index list row p of src added to row i[p],
 * floats in f32 and rounded to the node type once at the end, i32 wrapping.
 * DMA only sets bytes, so the additions are vector passes on a DM
 * accumulator (f32 or i32; the result itself unless it is bf16): the list
 * staged into SPM by one dma.spm, then per index p an `ld` of i[p] and one
 * pass acc + $i*row <- acc + $i*row + src + p*row. Each pass reads and
 * writes acc, so they run in index order and duplicates add in the
 * reference's order. An index outside [0, rows) puts the pass's view
 * outside acc: a run-time fault, never a write elsewhere. The adds are the
 * vector engine's (docs/tcp-isa.md, assumption A9). */
static void scatter_add(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *ix = SBN(b, n->args[1]), *sn = SBN(b, n->args[2]);
	if (b->g != b->top || n->valid != MOE_NONE || n->rank < 1) {
		sb_refuse(b, id, "a scatter with mode=add inside a block loop, under a valid mask or of a scalar");
		return;
	}
	if (n->dtype != MOE_F32 && n->dtype != MOE_BF16 && n->dtype != MOE_I32) {
		sb_refuse(b, id, "a scatter with mode=add of a type other than f32, bf16 or i32");
		return;
	}
	int64_t rows = n->shape[0], row = prod(n->shape, 1, n->rank), P = ir_numel(ix), total = rows * row;
	if (P > TS_SCATTER_ADD_MAX) {
		sb_refuse(b, id, "a scatter with mode=add of more than 4096 index rows");
		return;
	}
	moe_dtype adt = n->dtype == MOE_I32 ? MOE_I32 : MOE_F32;
	const int64_t ash[2] = {rows, row}, one = 1;
	ts_id acc = adt == n->dtype ? sb_out_val(b, id)->buf : sb_dm_buf(b, id, "scatter.acc", adt, 2, ash);
	const sb_val *bv = &b->v[n->args[0]];
	bool imm = bv->kind == SV_IMM;
	if (!imm && !(bv = sb_dm_val(b, n->args[0])))
		return;
	if (!imm && !sb_contig(bv, SBN(b, n->args[0]))) {
		sb_refuse(b, id, "a scatter into a strided base");
		return;
	}
	if (total > 0)
		vec_copy(b, id, acc, bv, imm, imm ? bv->imm : 0, total);
	const sb_val *iv = sb_dm_val(b, n->args[1]), *sv = iv ? sb_dm_val(b, n->args[2]) : NULL;
	if (!sv)
		return;
	if (!sb_contig(iv, ix) || !sb_contig(sv, sn)) {
		sb_refuse(b, id, "a scatter of strided views");
		return;
	}
	if (P > 0 && row > 0) {
		tcp_insn spm = tcp_b_dma_spm(1, &P, tcp_b_view((int32_t)iv->buf, iv->base, 1, &one), tcp_view_none(),
			tcp_view_none());
		sb_emit(b, &spm, id);
	}
	ts_id rg = b->rg;
	for (int64_t p = 0; p < P && row > 0; p++) {
		/* each ld with its pass in a region of their own: the list
		 * scheduler moves a region as one item, so no ld is hoisted
		 * above earlier passes and one register holds $row at a time */
		b->rg = ts_add_region(b->s, rg, TS_RG_SEQ, TS_NONE);
		ts_id r = ts_add_scalar(b->s, b->rg, "row", TS_SC_SPM_LD, 0, TS_NONE, TS_NONE, iv->base + p);
		b->s->sc[r].buf = iv->buf;
		tcp_view d = tcp_b_view((int32_t)acc, 0, 1, &one);
		d.reg = (int32_t)r;
		d.scale = row;
		tcp_insn in = tcp_b_vec(1, &row, d);
		in.v[TCP_V_S0] = d;
		in.v[TCP_V_S1] = tcp_b_view((int32_t)sv->buf, sv->base + p * row, 1, &one);
		tcp_b_step(&in, adt == MOE_I32 ? TCP_V_IADD : TCP_V_FADD, TCP_SRC_V, TCP_SRC_S1, 0);
		in.flags |= TCP_F_ROUTE;
		sb_emit(b, &in, id);
		b->rg = rg;
	}
	if (adt != n->dtype && total > 0) { /* bf16: one pass whose commit rounds once */
		sb_val a = sb_view_of(acc, n);
		vec_copy(b, id, sb_out_val(b, id)->buf, &a, false, 0, total);
	}
}

void sb_scatter(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *ix = SBN(b, n->args[1]), *sn = SBN(b, n->args[2]);
	if (strcmp(ir_attr_str(n, "mode", "set"), "set")) {
		scatter_add(b, id);
		return;
	}
	if (n->rank < 1 || (n->valid != MOE_NONE && ix->rank != 1)) {
		sb_refuse(b, id, "a scatter of a scalar, or under a valid mask by more than one index list");
		return;
	}
	const sb_val *src0 = &b->v[n->args[2]];
	moe_dtype dt = src0->kind == SV_VIEW ? moved_type(b, id, src0) : (moe_dtype)n->dtype;
	ts_id t = sb_hbm_buf(b, id, n->name ? n->name : "scatter", TCP_T_SCRATCH, dt, n->rank, n->shape);
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
	/* positions that are an iota along a one-dimensional list (a decode's
	 * pairs in order) are the scaling pass's counter */
	bool ctr = b->v[n->args[1]].kind == SV_IOTA && ix->rank == 1;
	const sb_val *iv = ctr ? &b->v[n->args[1]] : sb_dm_val(b, n->args[1]);
	bool spilled = sb_in_hbm(b, n->args[2]);
	const sb_val *sv = !iv ? NULL : spilled ? &b->v[n->args[2]] : sb_dm_val(b, n->args[2]);
	if (!sv)
		return;
	if ((!ctr && !sb_contig(iv, ix)) || !sb_contig(sv, sn)) {
		sb_refuse(b, id, "a scatter of strided views");
		return;
	}
	int64_t eb = (int64_t)moe_dtype_size(dt);
	sb_val hl = scaled_list(b, id, ctr ? NULL : iv, ni, row * eb);
	int64_t ch = spilled ? stage_rows(b, ni, row * eb) : ni;
	ts_id st = TS_NONE;
	if (spilled) {
		const int64_t sh[2] = {ch, row};
		st = sb_dm_buf(b, id, "scatter.stage", dt, 2, sh);
	}
	for (int64_t r0 = 0; r0 < ni; r0 += ch) {
		int64_t c = ni - r0 < ch ? ni - r0 : ch, dim[3] = {1, c, row}, total = c * row;
		sb_val src = *sv, il = hl;
		il.base += r0;
		if (spilled) { /* this chunk of the HBM source into the staging */
			const int64_t one = 1;
			tcp_insn cp = tcp_b_dma_copy(1, &total, tcp_b_view((int32_t)st, 0, 1, &one),
				tcp_b_view((int32_t)sv->buf, sv->base + r0 * row, 1, &one));
			sb_emit(b, &cp, id);
			src = sb_view_of(st, sn);
		}
		const int64_t ds[2] = {rows * row, row}, ss[2] = {c * row, row}, is[2] = {ni, 1};
		tcp_insn in = dma_gs(false, &o, &src, &il, dim, rows, ds, ss, is);
		in.flags |= TCP_F_HBMIDX;
		in.vreg = (int32_t)sb_valid_less(b, id, sb_valid(b, id), r0); /* index rows at and past the count not applied */
		sb_emit(b, &in, id);
	}
	b->v[id] = o;
}

/* Whether value id (built: a DM buffer of its own, contiguous, outside any
 * loop, not an output) has a gap before its first reader and is read by
 * no block loop, no view and no valid mask; the spill's cost is its round
 * trip. */
static bool value_spillable(const sb *b, moe_id id, int64_t *bytes)
{
	const moe_graph *g = b->g;
	const sb_val *v = &b->v[id];
	const ir_node *n = SBN(b, id);
	if (g != b->top || b->rows != TS_NONE || v->kind != SV_VIEW || v->reg != TS_NONE || v->base != 0 ||
		n->op == MOE_OP_INPUT || n->op == MOE_OP_WEIGHT || n->valid != MOE_NONE)
		return false;
	const ts_buf *u = &b->s->buf[v->buf];
	if (u->space != TCP_DM || u->node != id || u->life == TS_LIFE_LOOP || u->life == TS_LIFE_BLOCK || u->slots > 1 ||
		!sb_contig(v, n))
		return false;
	for (uint32_t k = 0; k < g->nout; k++)
		if (g->outputs[k] == id)
			return false;
	for (uint32_t k = 0; k < b->wd.nspill; k++)
		if (b->wd.spill[k].node == id)
			return false; /* a staged gather already */
	moe_id first = MOE_NONE;
	for (moe_id r = id + 1; r < g->nnodes; r++) {
		const ir_node *rn = &g->nodes[r];
		bool reads = false;
		for (uint32_t k = 0; k < rn->nargs; k++)
			reads |= rn->args[k] == id;
		if (rn->valid == id)
			return false; /* a count a scalar reads from DM */
		if (!reads)
			continue;
		if (rn->op == MOE_OP_BLOCK_LOOP || rn->op == MOE_OP_RESHAPE || rn->op == MOE_OP_SLICE ||
			rn->op == MOE_OP_BROADCAST || (rn->op == MOE_OP_EINSUM && rn->nargs == 1))
			return false; /* a view of it would name the DM buffer past the spill */
		first = first == MOE_NONE ? r : first;
	}
	*bytes = ir_bytes(n);
	return first != MOE_NONE && first > id + 1;
}

void sb_spill_value(sb *b, moe_id id)
{
	int64_t bytes = 0;
	if (b->failed || b->s->nop == 0 || !value_spillable(b, id, &bytes))
		return;
	const ir_node *n = SBN(b, id);
	ts_id d = b->v[id].buf, prod = b->s->nop - 1;
	if (b->s->op[prod].node != id && n->op != MOE_OP_CONCAT)
		return; /* no op of its own: nothing to spill after (a concat's parts may have written its buffer) */
	if (!sb_in_hbm(b, id)) {
		add_spill(b, (ts_spill){d, id, prod, 0, 2 * bytes});
		return;
	}
	ts_id h = sb_hbm_buf(b, id, n->name ? n->name : "spill", TCP_T_SCRATCH, (moe_dtype)n->dtype, n->rank, n->shape);
	int64_t total = ir_numel(n);
	tcp_insn c = tcp_b_dma_copy_flat((int32_t)h, (int32_t)d, total);
	sb_emit(b, &c, id);
	b->v[id] = sb_view_of(h, n); /* its readers copy it back (sb_dm_val) */
}
