/* backend-tcp/lower_quant.c: quantized expert weights on TCP (issue #14),
 * weight-only (act=bf16).
 *
 * After `blockwise-dispatch`, a quantized expert weight is
 *   dequant(gather(q, bexp), gather(s, bexp)) valid(nblocks)
 * possibly followed by one-operand permutation einsums and slices (fused
 * checkpoint tensors such as gpt-oss's gate_up). On TCP the two gathers are
 * per-block weight fetches like any other (the DMA moves the packed bytes and
 * the scales: the cost model charges the quantized bytes), the dequant is one
 * vector-engine pass per block that writes the expert's weight in the compute
 * type into DM, and the permutations and slices after it are sequencer views
 * of that buffer; the contractions then read it as they read a bf16 expert.
 * The pass decodes in the fetch unit: f8e4m3 widens to f32, E2M1 nibbles go
 * through the fetch table to f8e4m3 and then f32 (flag e2m1), int4 nibbles
 * have the zero point 8 subtracted and widen to i32 (flag i4); the scales are
 * a second stream broadcast over their block by stride-0 loops. docs/tcp-isa.md
 * section 7.10. */
#include "backend-tcp/lower_int.h"
#include "ir/quant.h"

/* A weight leaf, possibly under reshapes (mxfp4 blocks [E, N, K/32, 16] are
 * read as [E, N, K/2]). */
bool tcpl_weight_leaf(const moe_graph *g, moe_id id)
{
	while (N(g, id)->op == MOE_OP_RESHAPE)
		id = N(g, id)->args[0];
	return N(g, id)->op == MOE_OP_WEIGHT;
}

/* A slice or one-operand einsum of a per-block dequantized weight: a view. */
static bool qview_of(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (!(n->op == MOE_OP_SLICE || (n->op == MOE_OP_EINSUM && n->nargs == 1)) || n->args[0] == MOE_NONE)
		return false;
	moe_id a = n->args[0];
	const ir_node *an = N(c->g, a);
	return c->inreg[a] && n->rank >= 1 && n->shape[0] == c->G && an->rank >= 1 && an->shape[0] == c->G &&
	       (an->op == MOE_OP_DEQUANT || qview_of(c, a));
}

bool tcpl_quant_in_region(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (n->op == MOE_OP_DEQUANT)
		return n->valid == c->nblocks && c->inreg[n->args[0]] && c->inreg[n->args[1]];
	return qview_of(c, id);
}

bool tcpl_quant_is_view(const lw *c, moe_id id)
{
	return c->inreg[id] && qview_of(c, id);
}

/* Per block (shapes without the leading G): the view that a slice or a
 * permutation einsum makes of its source. */
void tcpl_lower_qview(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	const val *sv = &c->v[n->args[0]];
	if (sv->kind != VK_VIEW) {
		tcpl_err(c, id, "a view of a dequantized weight before it exists");
		return;
	}
	val v = *sv;
	if (n->op == MOE_OP_SLICE) {
		int axis = ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank + 1) - 1; /* per block: G dropped */
		if (axis < 0) {
			tcpl_err(c, id, "a slice of the block axis of a dequantized weight");
			return;
		}
		int64_t start = ir_attr_int(n, "start", 0), step = ir_attr_int(n, "step", 1);
		if (start < 0)
			start += s->shape[axis];
		v.base += start * sv->stride[axis];
		v.stride[axis] = sv->stride[axis] * step;
	} else {
		ir_einsum e;
		char msg[128];
		if (!ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg) || e.rank[0] != e.out_rank ||
			e.out_rank != n->rank + 1 || e.in[0][0] != e.out[0]) {
			tcpl_err(c, id, "einsum '%s' of a dequantized weight is not a permutation keeping the expert first",
				ir_attr_str(n, "eq", ""));
			return;
		}
		for (int j = 1; j < e.out_rank; j++) {
			const char *p = memchr(e.in[0], e.out[j], (size_t)e.rank[0]);
			if (!p || p == e.in[0]) {
				tcpl_err(c, id, "einsum '%s' of a dequantized weight is not a permutation",
					ir_attr_str(n, "eq", ""));
				return;
			}
			v.stride[j - 1] = sv->stride[p - e.in[0] - 1];
		}
	}
	v.owner = sv->owner;
	c->v[id] = v;
}

/* A sequencer view of per-block value v, in units of u per element of its
 * tensor (2 x bytes for 4-bit streams), over dims [nb, bn, kb, bk]. */
static tcp_view qview(const val *v, int64_t u, int64_t base, int64_t rs, int64_t cs, int64_t bn, int64_t bk, bool bcast)
{
	tcp_view tv = tcp_view_none();
	tv.t = v->t;
	tv.base = v->base * u + base;
	tv.reg = v->region ? v->reg : -1;
	tv.scale = v->region ? v->scale * u : 0;
	tv.stride[0] = bcast ? rs : bn * rs;
	tv.stride[1] = bcast ? 0 : rs;
	tv.stride[2] = bcast ? cs : bk * cs;
	tv.stride[3] = bcast ? 0 : cs;
	return tv;
}

static void step(tcp_insn *in, tcp_vop op, int x, int y, uint32_t imm)
{
	tcp_step *s = &in->step[in->nstep++];
	s->op = (uint8_t)op;
	s->x = (uint8_t)x;
	s->y = (uint8_t)y;
	s->imm = imm;
}

/* One vector pass over the rows [r0, r0 + nb x bn) and columns [k0, k0 + kb x bk)
 * of the block grid (full blocks, or the partial edge block). */
static void dq_pass(lw *c, const qt_info *qi, const val *q, int64_t qu, const val *s, const val *d, int64_t r0,
	int64_t nb, int64_t bn, int64_t k0, int64_t kb, int64_t bk)
{
	if (nb < 1 || bn < 1 || kb < 1 || bk < 1)
		return;
	tcp_insn in = tcp_insn_init(TCP_OP_TU_VEC);
	in.ndim = 4;
	in.dim[0] = nb;
	in.dim[1] = bn;
	in.dim[2] = kb;
	in.dim[3] = bk;
	in.vreg = -1;
	int64_t qr = q->stride[0] * qu, qc = qi->fmt == QT_FP8 ? q->stride[1] : 1;
	in.v[TCP_V_S0] = qview(q, qu, r0 * qr + k0 * qc, qr, qc, qi->bn, qi->bk, false);
	in.v[TCP_V_S1] = qview(s, 1, r0 / qi->bn * s->stride[0] + k0 / qi->bk * s->stride[1], s->stride[0],
		s->stride[1], 1, 1, true);
	in.v[TCP_V_DST] = qview(d, 1, r0 * d->stride[0] + k0 * d->stride[1], d->stride[0], d->stride[1], qi->bn,
		qi->bk, false);
	switch (qi->fmt) {
	case QT_FP8: /* w = f32(e4m3) x scale */
		step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
		break;
	case QT_MXFP4: /* the E8M0 byte shifted into an f32 exponent: 2^(s - 127) */
		in.flags |= TCP_F_E2M1;
		step(&in, TCP_V_SHL, TCP_SRC_S1, TCP_SRC_IMM, 23);
		step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S0, 0);
		break;
	default: /* int4: (nibble - 8) as f32 x scale */
		in.flags |= TCP_F_I4;
		step(&in, TCP_V_ITOF, TCP_SRC_V, TCP_SRC_NONE, 0);
		step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
		break;
	}
	emit(c, &in);
}

/* Per block: q [N, Kp], s [Ns, Ks] -> the weight [N, K] in DM. */
void tcpl_lower_dequant(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *qn = N(c->g, n->args[0]);
	qt_info qi;
	if (!c->inreg[id] || n->rank != 2 || !ir_dequant_info(c->g, n, &qi)) {
		tcpl_err(c, id, "dequant is lowered only for the experts' weights inside the block loop (a quantized "
				"weight elsewhere is dequantized when the weights are bound)");
		return;
	}
	const val *q = &c->v[n->args[0]], *s = &c->v[n->args[1]];
	if (q->kind != VK_VIEW || s->kind != VK_VIEW || c->p->t[q->t].space != TCP_DM ||
		c->p->t[s->t].space != TCP_DM) {
		tcpl_err(c, id, "the packed values and scales of a block must be in DM");
		return;
	}
	val *d = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	/* 4-bit formats: the q view counts nibbles of the tensor's bytes */
	int64_t qu = qi.fmt == QT_FP8 ? 1 : 2 * esz(qn->dtype);
	int64_t fn = qi.N / qi.bn, rn = qi.N % qi.bn, fk = qi.K / qi.bk, rk = qi.K % qi.bk;
	dq_pass(c, &qi, q, qu, s, d, 0, fn, qi.bn, 0, fk, qi.bk);
	dq_pass(c, &qi, q, qu, s, d, 0, fn, qi.bn, fk * qi.bk, 1, rk);
	dq_pass(c, &qi, q, qu, s, d, fn * qi.bn, 1, rn, 0, fk, qi.bk);
	dq_pass(c, &qi, q, qu, s, d, fn * qi.bn, 1, rn, fk * qi.bk, 1, rk);
}
