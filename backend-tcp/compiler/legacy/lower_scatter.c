/* backend-tcp/lower_scatter.c: TCP lowering of scatter with mode=add.
 *
 * The reference (docs/ir.md) copies base, then for p = 0, 1, ... in row-major
 * order of the index list adds row p of src to row i[p], accumulating floats in
 * f32 and rounding to the node dtype once at the end. DMA only moves bytes
 * (a dma.scatter sets), so the additions run on the vector engine, one pass per
 * index in the same order, in a run-time loop of the control processor:
 *
 *   acc = base                     ; f32 (i32) DM buffer; the output itself for f32/i32 in DM
 *   dma.spm i[0..P)                ; the index list reaches the control path through SPM
 *   rp = 0; rP = P
 *   LOOP: ld ri, i[rp]
 *         tu.vec dims=[row] acc+ri*row <- f.add(acc+ri*row, src+rp*row)   (x.add for i32)
 *         rp = rp + 1; br.lt rp, rP, LOOP
 *   out = acc                      ; bf16: one pass whose commit rounds once
 *
 * Passes of the main context run in issue order, so duplicate indices add in
 * the reference's order. An index outside [0, rows) makes the pass's view
 * leave acc (exactly rows x row elements): a run-time DM overflow fault. The
 * float additions are the vector engine's (assumption A9: subnormals flush to
 * zero), otherwise IEEE f32 like the reference. */
#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

static int64_t row_elems(const ir_node *n)
{
	int64_t r = 1;
	for (int i = 1; i < n->rank; i++)
		r *= n->shape[i];
	return r;
}

/* A pass with no ALU step: the fetch widens to the lane word, the commit narrows
 * (bf16 rounds to nearest even). Both tensors contiguous, n elements. */
static void vcopy(lw *c, int32_t dt, int32_t st, int64_t sbase, int64_t n)
{
	const int64_t one = 1;
	tcp_insn in = tcp_b_vec(1, &n, tcp_b_flat(dt));
	in.v[TCP_V_S0] = tcp_b_view(st, sbase, 1, &one);
	emit(c, &in);
}

/* acc = base (a fresh tensor is zero: nothing to do for a zero base) */
static void init_acc(lw *c, moe_id id, int32_t acc, int64_t n)
{
	const ir_node *nd = N(c->g, id);
	moe_id b = nd->args[0];
	val *bv = &c->v[b];
	if (bv->kind == VK_IMM && bv->imm == 0)
		return;
	if (nd->dtype != MOE_BF16) {
		bv = tcpl_need_view(c, b);
		if (!is_contig(bv, N(c->g, b))) {
			tcpl_err(c, id, "scatter into a strided base is not lowered");
			return;
		}
		dma_copy(c, acc, 0, -1, 0, bv->t, bv->base, -1, 0, n);
		return;
	}
	bv = tcpl_dm_view(c, b);
	if (!is_contig(bv, N(c->g, b))) {
		tcpl_err(c, id, "scatter into a strided base is not lowered");
		return;
	}
	vcopy(c, acc, bv->t, bv->base, n);
}

/* The loop over the P indices (P >= 1): one add pass per index. */
static void add_loop(lw *c, moe_id id, int32_t acc, const val *iv, const val *sv, int64_t P, int64_t row)
{
	const ir_node *n = N(c->g, id);
	tcp_insn spm = tcp_insn_init(TCP_OP_DMA_SPM);
	spm.ndim = 1;
	spm.dim[0] = P;
	spm.v[TCP_V_S0].t = iv->t;
	spm.v[TCP_V_S0].base = iv->base;
	spm.v[TCP_V_S0].stride[0] = 1;
	emit(c, &spm);
	int rp = tcpl_new_reg(c, id), rn = tcpl_new_reg(c, id), ri = tcpl_new_reg(c, id);
	li(c, rp, 0);
	li(c, rn, P);
	uint32_t top = c->p->ncode;
	ld(c, ri, iv->t, rp, iv->base, 1);
	const int64_t one = 1;
	tcp_view d = tcp_b_flat(acc), s = tcp_b_view(sv->t, sv->base, 1, &one);
	d.reg = ri;
	d.scale = row;
	s.reg = rp;
	s.scale = row;
	tcp_insn in = tcp_b_vec(1, &row, d);
	in.v[TCP_V_S0] = d;
	in.v[TCP_V_S1] = s;
	tcp_b_step(&in, (uint8_t)(moe_dtype_is_float((moe_dtype)n->dtype) ? TCP_V_FADD : TCP_V_IADD), TCP_SRC_V,
		TCP_SRC_S1, 0);
	emit(c, &in);
	alui(c, TCP_S_ADD, rp, rp, TCP_NOREG, 1);
	uint32_t back = br(c, TCP_C_LT, rp, rn);
	c->p->code[back].target = (int32_t)top;
}

void tcpl_lower_scatter_add(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *ix = N(c->g, n->args[1]), *sn = N(c->g, n->args[2]);
	if (c->inreg[id] || n->valid != MOE_NONE) {
		tcpl_err(c, id, "scatter-add inside the block loop or under a valid mask is not lowered");
		return;
	}
	if (n->dtype != MOE_F32 && n->dtype != MOE_BF16 && n->dtype != MOE_I32) {
		tcpl_err(c, id, "scatter-add of %s is not lowered", moe_dtype_name((moe_dtype)n->dtype));
		return;
	}
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int64_t rows = n->shape[0], row = row_elems(n), P = ir_numel(ix), total = rows * row;
	moe_dtype adt = n->dtype == MOE_I32 ? MOE_I32 : MOE_F32;
	bool in_place = n->dtype == adt && c->p->t[o->t].space == TCP_DM;
	int64_t ash[2] = {rows, row};
	int32_t acc = in_place ? o->t : tcpl_dm_tensor(c, id, "scatter_acc", adt, 2, ash);
	init_acc(c, id, acc, total);
	val *iv = tcpl_dm_view(c, n->args[1]);
	val *sv = tcpl_dm_view(c, n->args[2]);
	if (c->failed)
		return;
	if (!is_contig(iv, ix) || !is_contig(sv, sn) || iv->region || sv->region) {
		tcpl_err(c, id, "scatter-add of strided views is not lowered");
		return;
	}
	if (P > 0 && row > 0)
		add_loop(c, id, acc, iv, sv, P, row);
	if (in_place)
		return;
	if (n->dtype == adt) { /* f32 / i32 result in HBM */
		dma_copy(c, o->t, o->base, -1, 0, acc, 0, -1, 0, total);
	} else if (c->p->t[o->t].space == TCP_DM) {
		vcopy(c, o->t, acc, 0, total); /* the commit rounds to bf16 once */
	} else {
		int32_t tmp = tcpl_dm_tensor(c, id, "scatter_out", (moe_dtype)n->dtype, 2, ash);
		vcopy(c, tmp, acc, 0, total);
		dma_copy(c, o->t, o->base, -1, 0, tmp, 0, -1, 0, total);
		tcpl_dm_free(c, tmp);
	}
	tcpl_dm_free(c, acc);
}
