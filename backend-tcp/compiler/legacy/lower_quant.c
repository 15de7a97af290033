/* backend-tcp/lower_quant.c: quantized expert weights on TCP (issue #14):
 * weight-only (act=bf16: fp8, mxfp4, int4, nvfp4, awq), fp8 activations
 * (act=fp8) and W8A8 int8 (act=int8). GPTQ reaches the lowering already
 * dequantized (tcp-split-weights binds it dequantized).
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
 * a second stream broadcast over their block by stride-0 loops (AWQ's zero
 * points a third, NVFP4's scales combined with the global scale first).
 * docs/tcp-isa.md section 7.10. */
#include "backend-tcp/compiler/legacy/lower_int.h"
#include "ir/quant.h"

static moe_id fp8_weight(const lw *c, moe_id d);
static bool scale_copies(const lw *c, moe_id id);
static tcp_view v4(int32_t t, int64_t base, int64_t s0, int64_t s1, int64_t s2, int64_t s3);
static void step(tcp_insn *in, tcp_vop op, int x, int y, uint32_t imm);
static uint32_t fbits(float f);

/* A slice or one-operand einsum of a per-block dequantized weight: a view.
 * (The region's nodes are lowered with their leading G dropped, so only
 * membership, decided before, looks at the shapes.) */
static bool qview_of(const lw *c, moe_id id, bool shapes)
{
	const ir_node *n = N(c->g, id);
	if (!(n->op == MOE_OP_SLICE || (n->op == MOE_OP_EINSUM && n->nargs == 1)) || n->args[0] == MOE_NONE)
		return false;
	moe_id a = n->args[0];
	const ir_node *an = N(c->g, a);
	if (shapes && !(n->rank >= 1 && n->shape[0] == c->G && an->rank >= 1 && an->shape[0] == c->G))
		return false;
	return c->inreg[a] && (an->op == MOE_OP_DEQUANT || qview_of(c, a, shapes));
}

/* A row slice of a per-block gather of packed expert weights (gate and up
 * side by side, quant_pack.c), read by dequants: a view of the gather's
 * buffer. */
static bool packed_slice(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (n->op != MOE_OP_SLICE || n->args[0] == MOE_NONE || !c->inreg[n->args[0]])
		return false;
	const ir_node *an = N(c->g, n->args[0]);
	return an->op == MOE_OP_GATHER && an->valid == c->nblocks && ir_attr_int(n, "axis", 0) != 0 &&
	       ir_attr_int(n, "axis", 0) != -(int64_t)an->rank;
}

/* A per-block row maximum of |a| for a block value a in a layer with W8A8
 * weights: the per-token activation quantization's (its valid rows are
 * those of a; blockwise-dispatch leaves it unmasked). */
static bool w8a8_rowmax(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (n->op != MOE_OP_REDUCE_MAX || n->rank < 2 || n->shape[0] != c->G || N(c->g, n->args[0])->op != MOE_OP_ABS ||
		!c->inreg[n->args[0]])
		return false;
	for (moe_id i = 0; i < c->g->nnodes; i++)
		if (N(c->g, i)->op == MOE_OP_DEQUANT && !strcmp(ir_attr_str(N(c->g, i), "act", "bf16"), "int8"))
			return true;
	return false;
}

bool tcpl_quant_in_region(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (w8a8_rowmax(c, id))
		return true;
	if (n->op == MOE_OP_REDUCE_MAX && scale_copies(c, n->args[0])) /* fused into its contraction */
		return true;
	if (n->op == MOE_OP_DEQUANT)
		return n->valid == c->nblocks && c->inreg[n->args[0]] && c->inreg[n->args[1]];
	return qview_of(c, id, true) || (packed_slice(c, id) && n->rank >= 1 && n->shape[0] == c->G);
}

bool tcpl_quant_is_view(const lw *c, moe_id id)
{
	return c->inreg[id] && (qview_of(c, id, false) || packed_slice(c, id));
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
	if (packed_slice(c, id) && !c->p->moe_F && n->rank == 2)
		c->p->moe_F = n->shape[0]; /* the roofline's F: one projection's rows, not the pair's */
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

static tcp_view v4(int32_t t, int64_t base, int64_t s0, int64_t s1, int64_t s2, int64_t s3)
{
	tcp_view v = tcp_view_none();
	v.t = t;
	v.base = base;
	v.stride[0] = s0;
	v.stride[1] = s1;
	v.stride[2] = s2;
	v.stride[3] = s3;
	return v;
}

static tcp_insn vec3(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int vreg)
{
	tcp_insn in = tcp_insn_init(TCP_OP_TU_VEC);
	in.ndim = d3 ? 4 : 3;
	in.dim[0] = d0;
	in.dim[1] = d1;
	in.dim[2] = d2;
	in.dim[3] = d3;
	in.vreg = vreg;
	return in;
}

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
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
	case QT_NVFP4: /* E2M1 x the combined f32 scale */
		in.flags |= TCP_F_E2M1;
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

/* A view of per-block value v over nd dims with the given strides, in units
 * of u per element of its tensor, from element `base` (in those units). */
static tcp_view nview(const val *v, int64_t u, int64_t base, int nd, const int64_t *st)
{
	tcp_view tv = qview(v, u, base, 0, 0, 1, 1, true);
	for (int k = 0; k < TCP_MAXD; k++)
		tv.stride[k] = k < nd ? st[k] : 0;
	return tv;
}

/* AWQ, per block: q i32 [K, N/8] and z i32 [NG, N/8] packed along N
 * (channel 8c + 2a + b in nibble a + 4b), s [NG, N] -> W [N, K] with
 * W = (q - z) s. The output channel is iterated as (c, a, b), so both nibble
 * streams are affine. One pass unpacks z to i32 (z - 8: the i4 decode), one
 * decodes q (q - 8), subtracts, converts and scales:
 * dims [N/8, 4, 2, NG, G]. */
static void awq_passes(lw *c, moe_id id, const qt_info *qi, const val *q, const val *s, const val *z, const val *d)
{
	int64_t N = qi->N, K = qi->K, G = qi->bk, NG = K / G, N8 = N / 8;
	int64_t shz[2] = {NG, N};
	int32_t zd = tcpl_dm_tensor(c, id, "awq.zero", MOE_I32, 2, shz);
	tcp_insn in = vec3(NG, N8, 4, 2, -1);
	in.flags = TCP_F_I4;
	int64_t zs[4] = {z->stride[0] * 8, z->stride[1] * 8, 1, 4}, zds[4] = {N, 8, 2, 1};
	in.v[TCP_V_S0] = nview(z, 8, 0, 4, zs);
	in.v[TCP_V_DST] = v4(zd, 0, zds[0], zds[1], zds[2], zds[3]);
	emit(c, &in);
	in = tcp_insn_init(TCP_OP_TU_VEC);
	in.ndim = 5;
	int64_t dims[5] = {N8, 4, 2, NG, G};
	memcpy(in.dim, dims, sizeof dims);
	in.vreg = -1;
	in.flags = TCP_F_I4;
	int64_t qs[5] = {q->stride[1] * 8, 1, 4, G * q->stride[0] * 8, q->stride[0] * 8};
	int64_t z1[5] = {8, 2, 1, N, 0};
	int64_t ss[5] = {8 * s->stride[1], 2 * s->stride[1], s->stride[1], s->stride[0], 0};
	int64_t ds[5] = {8 * d->stride[0], 2 * d->stride[0], d->stride[0], G * d->stride[1], d->stride[1]};
	in.v[TCP_V_S0] = nview(q, 8, 0, 5, qs);
	in.v[TCP_V_S1] = v4(zd, 0, 0, 0, 0, 0);
	for (int k = 0; k < 5; k++)
		in.v[TCP_V_S1].stride[k] = z1[k];
	in.v[TCP_V_S2] = nview(s, 1, 0, 5, ss);
	in.v[TCP_V_DST] = nview(d, 1, 0, 5, ds);
	step(&in, TCP_V_ISUB, TCP_SRC_V, TCP_SRC_S1, 0); /* (q - 8) - (z - 8) */
	step(&in, TCP_V_ITOF, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S2, 0);
	emit(c, &in);
	tcpl_dm_free(c, zd);
}

/* NVFP4, per block: the combined scales cs = f32(e4m3(s) / g) ("div") or
 * f32(e4m3(s) x g) ("mul") [N, K/16] in one pass, as the producers combine
 * them; then W = e2m1(q) x cs, the block pass of dq_pass. */
static int32_t nvfp4_scales(lw *c, moe_id id, const qt_info *qi, const val *s, const val *g, val *cv)
{
	const ir_node *n = N(c->g, id);
	int64_t nk = qi->K / 16, sh[2] = {qi->N, nk};
	int32_t cs = tcpl_dm_tensor(c, id, "nvfp4.scale", MOE_F32, 2, sh);
	tcp_insn in = vec3(qi->N, nk, 1, 0, -1);
	in.ndim = 2;
	int64_t ss[2] = {s->stride[0], s->stride[1]}, gs[2] = {0, 0};
	in.v[TCP_V_S0] = nview(s, 1, 0, 2, ss);
	in.v[TCP_V_S1] = nview(g, 1, 0, 2, gs);
	in.v[TCP_V_DST] = v4(cs, 0, nk, 1, 0, 0);
	step(&in, strcmp(ir_attr_str(n, "gscale", "div"), "mul") ? TCP_V_FDIV : TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	emit(c, &in);
	*cv = *s;
	cv->t = cs;
	cv->base = 0;
	cv->stride[0] = nk;
	cv->stride[1] = 1;
	cv->region = false;
	cv->reg = -1;
	cv->scale = 0;
	return cs;
}

/* Per block: q [N, Kp], s [Ns, Ks] -> the weight [N, K] in DM. */
void tcpl_lower_dequant(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *qn = N(c->g, n->args[0]);
	qt_info qi;
	if (fp8_weight(c, id) != MOE_NONE)
		return; /* act=fp8 or int8: the contractions read the packed weight */
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
	if (qi.fmt == QT_GPTQ || qi.fmt == QT_INT8 || ((qi.fmt == QT_AWQ) && (qi.K % qi.bk || qi.N % 8))) {
		tcpl_err(c, id, "%s weights are lowered %s", qi.fmt == QT_GPTQ ? "GPTQ" : qi.fmt == QT_INT8 ? "int8" : "AWQ",
			qi.fmt == QT_GPTQ ? "when the weights are bound (tcp-split-weights)"
			: qi.fmt == QT_INT8 ? "with int8 activations only (act=\"int8\")"
					    : "in whole groups of input channels only");
		return;
	}
	const val *third = n->nargs > 2 ? &c->v[n->args[2]] : NULL;
	if (third && (third->kind != VK_VIEW || c->p->t[third->t].space != TCP_DM)) {
		tcpl_err(c, id, "the zero points or global scale of a block must be in DM");
		return;
	}
	val *d = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	if (qi.fmt == QT_AWQ) {
		awq_passes(c, id, &qi, q, s, third, d);
		return;
	}
	val cv;
	int32_t cs = -1;
	if (qi.fmt == QT_NVFP4) {
		cs = nvfp4_scales(c, id, &qi, s, third, &cv);
		s = &cv;
	}
	/* 4-bit formats: the q view counts nibbles of the tensor's bytes */
	int64_t qu = qi.fmt == QT_FP8 ? 1 : 2 * esz(qn->dtype);
	int64_t fn = qi.N / qi.bn, rn = qi.N % qi.bn, fk = qi.K / qi.bk, rk = qi.K % qi.bk;
	dq_pass(c, &qi, q, qu, s, d, 0, fn, qi.bn, 0, fk, qi.bk);
	dq_pass(c, &qi, q, qu, s, d, 0, fn, qi.bn, fk * qi.bk, 1, rk);
	dq_pass(c, &qi, q, qu, s, d, fn * qi.bn, 1, rn, 0, fk, qi.bk);
	dq_pass(c, &qi, q, qu, s, d, fn * qi.bn, 1, rn, fk * qi.bk, 1, rk);
	if (cs >= 0)
		tcpl_dm_free(c, cs);
}

/* ---- act=fp8: DeepSeek's fp8_gemm on the block loop (block FP8 only) ----
 * Per block and projection y[M, O] = x[M, I] W^T with W = fp8 q [O, I] in
 * 128 x 128 blocks of scales s [O/128, I/128], c = 0 .. I/128 - 1:
 *   sa[m, c] = max_i |x[m, 128c + i]| / 448                     (one pass)
 *   xq[m, i] = e4m3(x[m, i] / sa[m, i / 128])  (the cast rounds to nearest even; one pass)
 *   C[m, o, c] = sa[m, c] x s[o / 128, c]                       (one pass)
 *   y[m, o] = sum_c C[m, o, c] x (sum_{i in chunk c} xq[m, i] q[o, i])
 * the last one contraction per TRF pass, f8 x f8 at the fp8 MAC rate, whose
 * accumulator is scaled and added per 128-wide chunk in f32 (flags=scaled:
 * the vector stage behind the contraction engine, docs/tcp-isa.md 6). The
 * dequant itself emits nothing: the contraction reads the packed fp8 weight
 * straight from its per-block buffer into TRF. */

/* The dequant a block contraction reads as its weight, when it is contracted
 * with fp8 activations (act=fp8, block FP8 128 x 128 dividing N and K) or
 * int8 ones (W8A8: per-channel int8, act="int8"), read only by block einsums
 * "gbi,goi->gbo" as the weight; else MOE_NONE. */
static moe_id fp8_weight(const lw *c, moe_id d)
{
	const ir_node *n = N(c->g, d);
	qt_info qi;
	if (n->op != MOE_OP_DEQUANT || !c->inreg[d] || !ir_dequant_info(c->g, n, &qi))
		return MOE_NONE;
	const char *act = ir_attr_str(n, "act", "bf16");
	bool fp8 = !strcmp(act, "fp8") && qi.fmt == QT_FP8 && qi.bn == 128 && qi.bk == 128 && qi.N % 128 == 0 &&
		   qi.K % 128 == 0;
	bool i8 = !strcmp(act, "int8") && qi.fmt == QT_INT8 && qi.bn == 1 && qi.bk == qi.K;
	if (!fp8 && !i8)
		return MOE_NONE;
	for (moe_id u = d + 1; u < c->g->nnodes; u++) {
		const ir_node *un = N(c->g, u);
		for (uint32_t k = 0; k < un->nargs; k++)
			if (un->args[k] == d && (un->op != MOE_OP_EINSUM || k != 1 || un->nargs != 2 || !c->inreg[u] ||
							strcmp(ir_attr_str(un, "eq", ""), "gbi,goi->gbo")))
				return MOE_NONE;
	}
	return d;
}

bool tcpl_quant_no_buffer(const lw *c, moe_id id)
{
	return tcpl_quant_is_view(c, id) || fp8_weight(c, id) != MOE_NONE;
}




/* The two TRF tiles, (re)declared for 1-byte (f8e4m3 or i8) [Opass, I] tiles. */
static void fp8_trf(lw *c, const cplan *pl, moe_dtype dt)
{
	int64_t need = pl->Opass * pl->It, fp = rup(pl->Os * pl->It, c->m->flit_bytes),
		share = rup((need + c->S - 1) / c->S, c->m->flit_bytes);
	fp = fp > share ? fp : share;
	if (c->trf[0] >= 0 && need <= c->trf_rows_cap && c->p->t[c->trf[0]].dtype == dt &&
		c->p->t[c->trf[0]].slice_bytes == fp)
		return;
	int64_t sh[2] = {pl->Opass, pl->It};
	for (int k = 0; k < 2; k++) {
		c->trf[k] = tcp_add_tensor(c->p, k ? "trf.1" : "trf.0", TCP_TRF, TCP_T_SCRATCH, dt, 2, sh);
		c->p->t[c->trf[k]].addr = k * (tcp_trf_bytes(c->m) / 2);
		c->p->t[c->trf[k]].slice_bytes = fp;
	}
	c->trf_rows_cap = need;
}

/* The tiling of a scaled contraction: the whole reduction in one TRF tile
 * (the scale chunks must not straddle an accumulation), as many rows per
 * slice as the planner would take within that. */
static cplan fp8_plan(lw *c, int64_t M, int64_t O, int64_t I, moe_dtype dt)
{
	cplan pl = tcp_plan_contract(c->m, M, O, I, dt, NULL);
	if (pl.It < I) {
		int64_t os = tcp_trf_bytes(c->m) / 2 / I;
		pl.Os = os < 1 ? 1 : os < O ? os : O;
		pl.It = I;
		pl.Opass = O < c->S * pl.Os ? O : c->S * pl.Os;
	}
	return pl;
}

/* y = xq q^T with the chunk scales C: sub loads and scaled f8 contractions
 * (f8e4m3 xq, C [M, O, I/128]), or i8 ones (i8 xq, C [M, O]); xq the view
 * of the activation over (m, o, i). */
static void fp8_contract(lw *c, moe_id at, const val *q, tcp_view xq, tcp_view cs, const val *ov, int64_t M, int64_t O,
	int64_t I, int vreg, bool rowdiv)
{
	moe_dtype dt = (moe_dtype)c->p->t[xq.t].dtype;
	cplan pl = fp8_plan(c, M, O, I, dt);
	int64_t w8t = dt == MOE_I8 ? tcpl_w8a8_tile(c, M, O, I, esz(c->p->t[ov->t].dtype)) : 0;
	if (w8t > 0) { /* lower_w8a8.c */
		pl.It = I;
		pl.Os = w8t;
		pl.Opass = O < c->S * w8t ? O : c->S * w8t;
	}
	if (pl.Os * I > tcp_trf_bytes(c->m) / 2) {
		tcpl_err(c, at, "act=%s: a reduction of %lld does not fit half of TRF", dt == MOE_I8 ? "int8" : "fp8",
			(long long)I);
		return;
	}
	fp8_trf(c, &pl, dt);
	for (int64_t o0 = 0; o0 < O; o0 += pl.Opass) {
		int64_t on = O - o0 < pl.Opass ? O - o0 : pl.Opass;
		int32_t tt = c->trf[c->trf_k];
		c->trf_k ^= 1;
		tcp_insn ld_ = tcp_insn_init(TCP_OP_SUB_TRF);
		ld_.ndim = 2;
		ld_.dim[0] = on;
		ld_.dim[1] = I;
		ld_.v[TCP_V_DST] = v4(tt, 0, I, 1, 0, 0);
		ld_.v[TCP_V_S0] = qview(q, 1, o0 * q->stride[0], q->stride[0], q->stride[1], 1, 1, true);
		ld_.v[TCP_V_S0].stride[1] = q->stride[1];
		emit(c, &ld_);
		tcp_insn in = tcp_insn_init(TCP_OP_TU_CONTRACT);
		in.ndim = 3;
		in.dim[0] = M;
		in.dim[1] = on;
		in.dim[2] = I;
		in.tile = pl.Os < on ? pl.Os : on;
		in.vreg = vreg;
		in.flags = TCP_F_SCALED | (rowdiv ? TCP_F_ROWDIV : 0);
		in.v[TCP_V_S0] = xq;
		in.v[TCP_V_S1] = v4(tt, 0, 0, I, 1, 0);
		in.v[TCP_V_S2] = cs; /* (m, o, chunk); rowdiv: (row factor, column factor, the row factors' offset) */
		in.v[TCP_V_S2].base += o0 * cs.stride[1];
		if (rowdiv) /* the row factors stay where they are */
			in.v[TCP_V_S2].stride[2] -= o0 * cs.stride[1];
		tcp_view dv = qview(ov, 1, o0 * ov->stride[1], ov->stride[0], ov->stride[1], 1, 1, true);
		dv.stride[1] = ov->stride[1];
		dv.stride[2] = 0;
		in.v[TCP_V_DST] = dv;
		emit(c, &in);
	}
}

/* sa = max |a| / 448 per 1 x 128 group of the block's activation a [M, I],
 * then xq = e4m3(a / sa): two passes (the division needs the finished max). */
static void fp8_quantize_act(lw *c, moe_id id, const val *a, int64_t M, int64_t I, int vreg, int32_t *sa_,
	int32_t *xq_)
{
	int64_t nk = I / 128, shs[2] = {M, nk}, shx[2] = {M, I};
	int32_t sa = tcpl_dm_tensor(c, id, "act.scale", MOE_F32, 2, shs);
	int32_t xq = tcpl_dm_tensor(c, id, "act.fp8", MOE_F8E4M3, 2, shx);
	tcp_view av3 = qview(a, 1, 0, a->stride[0], a->stride[1], 1, 128, false);
	av3.stride[0] = a->stride[0];
	av3.stride[1] = 128 * a->stride[1];
	av3.stride[2] = a->stride[1];
	av3.stride[3] = 0;
	tcp_insn p1 = vec3(M, nk, 128, 0, vreg);
	p1.v[TCP_V_S0] = av3;
	p1.v[TCP_V_DST] = v4(sa, 0, nk, 1, 0, 0);
	step(&p1, TCP_V_FABS, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p1, TCP_V_FRMAX, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p1, TCP_V_FDIV, TCP_SRC_V, TCP_SRC_IMM, fbits(448.0f));
	emit(c, &p1);
	/* the commit's cast to e4m3 rounds to nearest even */
	tcp_insn p2 = vec3(M, nk, 128, 0, vreg);
	p2.v[TCP_V_S0] = av3;
	p2.v[TCP_V_S1] = v4(sa, 0, nk, 1, 0, 0);
	p2.v[TCP_V_DST] = v4(xq, 0, I, 128, 1, 0);
	step(&p2, TCP_V_FDIV, TCP_SRC_V, TCP_SRC_S1, 0);
	emit(c, &p2);
	*sa_ = sa;
	*xq_ = xq;
}

/* The next act=fp8 block contraction that reads the activation of id, or MOE_NONE. */
static moe_id fp8_act_next(const lw *c, moe_id id)
{
	moe_id a = N(c->g, id)->args[0];
	for (moe_id u = id + 1; u < c->g->nnodes; u++) {
		const ir_node *un = N(c->g, u);
		if (c->inreg[u] && un->op == MOE_OP_EINSUM && un->nargs == 2 && un->args[0] == a &&
			fp8_weight(c, un->args[1]) != MOE_NONE)
			return u;
	}
	return MOE_NONE;
}

/* C[m, o, c] = sa[m, c] x s[o / 128, c] over [M, O/128, 128, nk] for block
 * einsum id (one pass): the chunk scales of its contraction. */
static int32_t fp8_chunk_scales(lw *c, moe_id id, int32_t sa, int64_t M, int vreg)
{
	const ir_node *n = N(c->g, id), *dn = N(c->g, n->args[1]);
	const val *s = &c->v[dn->args[1]];
	/* the dequant keeps its leading G here (it has no per-block view) */
	int64_t I = dn->shape[dn->rank - 1], O = dn->shape[dn->rank - 2], nk = I / 128, shc[3] = {M, O, nk};
	int32_t C = tcpl_dm_tensor(c, id, "fp8.scale", MOE_F32, 3, shc);
	tcp_insn p3 = vec3(M, O / 128, 128, nk, vreg);
	p3.v[TCP_V_S0] = v4(sa, 0, nk, 0, 0, 1);
	p3.v[TCP_V_S1] = qview(s, 1, 0, s->stride[0], s->stride[1], 1, 1, true);
	p3.v[TCP_V_S1].stride[0] = 0;
	p3.v[TCP_V_S1].stride[1] = s->stride[0];
	p3.v[TCP_V_S1].stride[2] = 0;
	p3.v[TCP_V_S1].stride[3] = s->stride[1];
	p3.v[TCP_V_DST] = v4(C, 0, O * nk, 128 * nk, nk, 1);
	step(&p3, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	emit(c, &p3);
	return C;
}

/* ---- W8A8 int8: per-token int8 activations, i8 x i8 contractions ----
 * blockwise-dispatch writes the reference's activation quantization into the
 * graph (passes/blockwise_dispatch.c act_int8): from the block rows xf,
 *   m = max(max_i |xf[r, i]|, 1e-10), R = f32(127 / m), v = xf R,
 *   q = v rounded half away from zero, x' = q x f32(m / 127)
 * and contracts x' with the dequantized weight. On TCP that chain is not
 * computed node by node: the contraction that reads x' (and its int8 weight)
 * runs, per block,
 *   m[r]    = c.fmax(r.fmax(f.abs(xf)), 1e-10)            (one pass)
 *   R[r]    = 127 / m,  as[r] = m / 127                     (two passes of M)
 *   v[r, i] = xf R                                          (one pass, f32)
 *   xq      = i8(ftoi(v + copysign(0.5 - 2^-25, v)))        (one pass)
 *   C[r, o] = as[r] x ws[o]                                 (one pass per weight)
 *   y[r, o] = f32(sum_i xq[r, i] q[o, i]) x C[r, o]         (scaled i8 contraction)
 * The i8 x i8 contraction sums exactly in i32 at the i8 MAC rate; the weight's
 * int8 bytes go to TRF as they were fetched. ftoi truncates, so adding
 * 0.5 - 2^-25 with v's sign before it rounds half away from zero exactly for
 * |v| <= 127 (0.5 itself would carry v = 0.5 - 2^-25 up to 1). The rows and
 * scales are shared by the contractions that read the same x' (gate and up). */

/* The nodes of x' = act_int8(xf): *xf from the chain ending at a (the
 * einsum's activation); false when a is not that chain. */
static bool w8a8_chain(const lw *c, moe_id a, moe_id *xf)
{
	const ir_node *n = N(c->g, a);
	if (n->op == MOE_OP_CAST)
		n = N(c->g, n->args[0]);
	if (n->op != MOE_OP_MUL || n->nargs != 2)
		return false;
	const ir_node *s = N(c->g, n->args[N(c->g, n->args[1])->op != MOE_OP_DIV ? 0 : 1]);
	if (s->op != MOE_OP_DIV || s->nargs != 2)
		return false;
	const ir_node *m = N(c->g, s->args[0]);
	if (m->op != MOE_OP_MAX || m->nargs != 2)
		return false;
	const ir_node *r = N(c->g, m->args[N(c->g, m->args[0])->op != MOE_OP_REDUCE_MAX ? 1 : 0]);
	if (r->op != MOE_OP_REDUCE_MAX || N(c->g, r->args[0])->op != MOE_OP_ABS)
		return false;
	*xf = N(c->g, r->args[0])->args[0];
	return N(c->g, *xf)->dtype == MOE_F32;
}

/* The block's rows' scales as dispatched (tcp-w8a8-act-once): [.., M, w],
 * w equal copies per row. */
static bool scale_copies(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	return n->op == MOE_OP_RESHAPE && n->dtype == MOE_F32 && n->rank >= 2 && n->name &&
	       !strcmp(n->name, "blocks.scale"); /* (the region's nodes lose their leading G when lowered) */
}

/* x' = q x as with q and as quantized before the dispatch (tcp-w8a8-act-once,
 * gpass/w8a8_act.c): a = cast(mul(cast(bq, f32), bs)), bq the block's rows of
 * q (integers of at most 127 in magnitude, in the compute type) and bs its
 * rows' scales [.., M, 1] f32. *bq, *bs: those per-block values; *mul the mul
 * and *qf the widening cast of bq (bq itself for f32). */
static bool w8a8_pre(const lw *c, moe_id a, moe_id *bq, moe_id *bs, moe_id *mul, moe_id *qf)
{
	const ir_node *n = N(c->g, a);
	*mul = n->op == MOE_OP_CAST ? n->args[0] : a;
	const ir_node *m = N(c->g, *mul);
	if (m->op != MOE_OP_MUL || m->nargs != 2 || m->dtype != MOE_F32)
		return false;
	*qf = m->args[0];
	*bs = m->args[1];
	const ir_node *q = N(c->g, *qf), *s = N(c->g, *bs);
	*bq = q->op == MOE_OP_CAST ? q->args[0] : *qf;
	const ir_node *b = N(c->g, *bq);
	if (!(q->dtype == MOE_F32 && s->dtype == MOE_F32 && s->rank == q->rank && s->shape[s->rank - 1] == 1 &&
		    b->op == MOE_OP_RESHAPE && b->name && !strcmp(b->name, "blocks.q") &&
		    (b->dtype == MOE_F32 || b->dtype == MOE_BF16)))
		return false;
	if (s->op == MOE_OP_REDUCE_MAX) /* of equal copies: the first */
		*bs = s->args[0];
	return scale_copies(c, *bs);
}

/* The one block einsum whose W8A8 activation was quantized before the
 * dispatch and is read as i8 rows (w8a8_i8_rows): its grid of the rows'
 * scales (blocks.scale) in *bs, its output shape in *M and *O and its
 * weight's scales (the per-block gather) in *ws; MOE_NONE when there is
 * none or more than one. */
moe_id tcpl_w8a8_pre_einsum(const lw *c, moe_id *bs, int64_t *M, int64_t *O, moe_id *ws)
{
	moe_id found = MOE_NONE;
	for (moe_id u = 0; u < c->g->nnodes; u++) {
		const ir_node *un = N(c->g, u);
		moe_id bq, b, mul, qf;
		if (!c->inreg[u] || un->op != MOE_OP_EINSUM || un->nargs != 2 || un->rank < 2 ||
			fp8_weight(c, un->args[1]) == MOE_NONE || strcmp(ir_attr_str(N(c->g, un->args[1]), "act", "bf16"), "int8"))
			continue;
		if (!w8a8_pre(c, un->args[0], &bq, &b, &mul, &qf) || c->store_dt[bq] != MOE_I8)
			continue;
		if (found != MOE_NONE)
			return MOE_NONE;
		found = u;
		*bs = b;
		*M = un->shape[un->rank - 2];
		*O = un->shape[un->rank - 1];
		*ws = N(c->g, un->args[1])->args[1];
	}
	return found;
}

/* The first einsum that reads a as a W8A8 contraction's activation, after id. */
static moe_id w8a8_next(const lw *c, moe_id a, moe_id id)
{
	for (moe_id u = id + 1; u < c->g->nnodes; u++) {
		const ir_node *un = N(c->g, u);
		if (c->inreg[u] && un->op == MOE_OP_EINSUM && un->nargs == 2 && un->args[0] == a &&
			fp8_weight(c, un->args[1]) != MOE_NONE &&
			!strcmp(ir_attr_str(N(c->g, un->args[1]), "act", "bf16"), "int8"))
			return u;
	}
	return MOE_NONE;
}

/* The activation quantization chains of W8A8 contractions are computed by
 * the first contraction that reads them (marked fused into it: no buffer,
 * not lowered, its operands kept alive until then). */
void tcpl_w8a8_plan(lw *c)
{
	const moe_graph *g = c->g;
	for (moe_id u = 0; u < g->nnodes && !c->failed; u++) {
		const ir_node *un = N(g, u);
		moe_id xf, a = un->nargs == 2 ? un->args[0] : MOE_NONE;
		if (un->op != MOE_OP_EINSUM || a == MOE_NONE || w8a8_next(c, a, u - 1) != u || c->fused_into[a] != MOE_NONE)
			continue;
		moe_id bq, bs, mul, qf;
		if (w8a8_pre(c, a, &bq, &bs, &mul, &qf)) { /* quantized before the dispatch */
			c->fused_into[a] = c->fused_into[mul] = c->fused_into[qf] = u;
			if (N(c->g, mul)->args[1] != bs)
				c->fused_into[N(c->g, mul)->args[1]] = u; /* the max of the scale copies */
			c->fused_into[bq] = c->fused_into[bs] = MOE_NONE;
			continue;
		}
		if (!w8a8_chain(c, a, &xf)) {
			tcpl_err(c, u, "W8A8: the contraction's activation is not the per-token int8 quantization "
				       "blockwise-dispatch writes");
			return;
		}
		/* every node from xf (exclusive) to a that a depends on */
		for (moe_id i = a + 1; i-- > xf + 1;) {
			const ir_node *n = N(g, i);
			if (i != a && c->fused_into[i] != u)
				continue;
			c->fused_into[i] = u;
			for (uint32_t k = 0; k < n->nargs; k++)
				if (n->args[k] > xf && !(ir_ops[N(g, n->args[k])->op].flags & OPF_LEAF))
					c->fused_into[n->args[k]] = u;
		}
		for (moe_id i = xf + 1; i < g->nnodes; i++) /* none of it read elsewhere */
			for (uint32_t k = 0; k < N(g, i)->nargs && c->fused_into[i] != u; k++) {
				moe_id v = N(g, i)->args[k];
				if (v != MOE_NONE && v != a && c->fused_into[v] == u && !c->failed)
					tcpl_err(c, i, "W8A8: a value of the activation quantization is read outside it");
				else if (v == a && (N(g, i)->op != MOE_OP_EINSUM || w8a8_next(c, a, i - 1) != i) && !c->failed)
					tcpl_err(c, i, "W8A8: the quantized activation is read by something other than an "
						       "int8 contraction");
			}
	}
	if (!c->failed)
		tcpl_w8a8_act_plan(c); /* lower_w8a8.c */
}

static tcp_insn vec2(int64_t d0, int64_t d1, int vreg)
{
	tcp_insn in = vec3(d0, d1, 1, 0, vreg);
	in.ndim = 2;
	return in;
}

/* The block's quantized rows bq [M, I] (integers of at most 127 in
 * magnitude, bf16 or f32) as i8: one pass, cvt.ftoi exact on them. */
static int32_t w8a8_rows_i8(lw *c, moe_id id, moe_id bq, int64_t M, int64_t I, int vreg)
{
	int64_t shx[2] = {M, I};
	val *bv = tcpl_dm_view(c, bq);
	if (c->failed)
		return -1;
	val b = *bv;
	int32_t xq = tcpl_dm_tensor(c, id, "act.i8", MOE_I8, 2, shx);
	tcp_insn p = vec2(M, I, vreg);
	p.v[TCP_V_S0] = qview(&b, 1, 0, b.stride[0], b.stride[1], 1, 1, true);
	p.v[TCP_V_S0].stride[1] = b.stride[1];
	p.v[TCP_V_DST] = v4(xq, 0, I, 1, 0, 0);
	step(&p, TCP_V_FTOI, TCP_SRC_V, TCP_SRC_NONE, 0);
	emit(c, &p);
	return xq;
}

/* The block einsum id: y = x' W^T with W8A8's int8 activations and weight. */
static void w8a8_einsum(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *dn = N(c->g, n->args[1]);
	moe_id a = n->args[0], xf, bq, bs, mul, qf;
	bool pre = w8a8_pre(c, a, &bq, &bs, &mul, &qf);
	if (!pre && !w8a8_chain(c, a, &xf)) {
		tcpl_err(c, id, "W8A8: the contraction's activation is not the per-token int8 quantization");
		return;
	}
	const val *q = &c->v[dn->args[0]], *s = &c->v[dn->args[1]];
	int64_t M = n->shape[n->rank - 2], O = n->shape[n->rank - 1];
	int64_t I = N(c->g, pre ? bq : xf)->shape[N(c->g, pre ? bq : xf)->rank - 1];
	int vreg = tcpl_valid_reg(c, id);
	int32_t as = -1, xq = -1;
	tcp_view asv, xv = tcp_view_none(), rslot = tcp_view_none();
	/* down's C = ws / R made by the contraction (flags=rowdiv): its activation quantized here for it alone */
	int rk = s->kind == VK_VIEW && s->region && c->w8_rd1[0] == s->t + 1 ? 0 : 1;
	bool rowdiv = !pre && s->kind == VK_VIEW && s->region && c->w8_rd1[rk] == s->t + 1 &&
		      !(c->qx_act == a + 1 && c->qx_cfor == id + 1) && w8a8_next(c, a, id) == MOE_NONE;
	if (pre && c->store_dt[bq] == MOE_I8) { /* the rows as dispatched, i8 (w8a8_i8_rows) */
		const val *bv = tcpl_dm_view(c, bq);
		if (c->failed)
			return;
		xv = qview(bv, 1, 0, 0, 0, 1, 1, true);
		xv.stride[0] = bv->stride[0];
		xv.stride[1] = 0;
		xv.stride[2] = bv->stride[1];
		xv.stride[3] = 0;
	} else if (c->qx_act == a + 1 && c->qx_cfor == id + 1) { /* made by the contraction before */
		as = c->qx_sa;
		xq = c->qx_xq;
	} else if (pre) {
		xq = w8a8_rows_i8(c, id, bq, M, I, vreg);
	} else {
		val *xv = tcpl_dm_view(c, xf);
		if (c->failed)
			return;
		val x = *xv;
		if (rowdiv) { /* R into the slot of the block expert's staged scales (tcpl_w8a8_stage_rowdiv) */
			rslot = qview(s, 1, c->w8_rdoff[rk], 1, 0, 1, 1, true);
			rslot.stride[1] = 0;
		}
		tcpl_w8a8_quantize(c, id, &x, M, I, vreg, rowdiv ? &rslot : NULL, &as, &xq); /* lower_w8a8.c: as is 127 / m */
	}
	if (c->failed)
		return;
	bool bulk = pre && c->w8_c1 && c->w8_bsc == bs; /* C made for every block before the loop (lower_w8a8.c) */
	if (bulk) {
		asv = tcp_view_none();
	} else if (pre) { /* the rows' scales as gathered: [M, 1] */
		const val *sv = tcpl_dm_view(c, bs);
		if (c->failed)
			return;
		asv = qview(sv, 1, 0, sv->stride[0], 0, 1, 1, true);
		asv.stride[0] = sv->stride[0];
		asv.stride[1] = 0;
	} else {
		asv = v4(as, 0, 1, 0, 0, 0); /* R = 127 / m per row */
	}
	val *ov = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int64_t shc[2] = {M, O};
	int32_t C = bulk || rowdiv ? -1 : tcpl_dm_tensor(c, id, "w8a8.scale", MOE_F32, 2, shc);
	tcp_insn p = vec2(M, O, vreg);
	p.v[TCP_V_S0] = asv;
	p.v[TCP_V_S1] = qview(s, 1, 0, s->stride[0], s->stride[1], 1, 1, true);
	p.v[TCP_V_S1].stride[0] = 0;
	p.v[TCP_V_S1].stride[1] = s->stride[0];
	p.v[TCP_V_DST] = v4(C, 0, O, 1, 0, 0);
	if (pre) /* C = as x ws */
		step(&p, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	else /* C = ws / R (docs/semantics.md: W8A8 on TCP) */
		step(&p, TCP_V_FDIV, TCP_SRC_S1, TCP_SRC_V, 0);
	if (!bulk && !rowdiv)
		emit(c, &p);
	tcp_view cs = v4(C, 0, O, 1, 0, 0);
	if (rowdiv) { /* col[o] = ws[o], row[m] = R[m] at the slot */
		cs = qview(s, 1, 0, 1, s->stride[0], 1, 1, true);
		cs.stride[1] = s->stride[0];
		cs.stride[2] = c->w8_rdoff[rk];
	}
	if (bulk) { /* block g's C: rows [g M, (g + 1) M) of the loop's table */
		cs = v4(c->w8_c1 - 1, 0, O, 1, 0, 0);
		cs.reg = R_G;
		cs.scale = c->w8_cstride;
	}
	moe_id next = xq >= 0 ? w8a8_next(c, a, id) : MOE_NONE;
	c->qx_act = c->qx_cfor = 0;
	if (next != MOE_NONE) {
		c->qx_act = a + 1;
		c->qx_sa = as;
		c->qx_xq = xq;
		c->qx_cfor = next + 1;
	}
	fp8_contract(c, id, q, xq >= 0 ? v4(xq, 0, I, 0, 1, 0) : xv, cs, ov, M, O, I, vreg, rowdiv);
	if (C >= 0)
		tcpl_dm_free(c, C);
	if (next == MOE_NONE && xq >= 0) {
		tcpl_dm_free(c, xq);
		if (as >= 0)
			tcpl_dm_free(c, as);
	}
	c->p->nproj++;
}

/* The block einsum id (a [M, I] x dequant [O, I]) with fp8 activations;
 * false when its weight is not contracted that way. When a later one reads
 * the same activation (gate, then up), the activation is quantized once and
 * the later one's chunk scales are made here too, before this contraction:
 * they need no weight bytes, so they run while the pair's fetch is in
 * flight. */
bool tcpl_lower_fp8_einsum(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (!c->inreg[id] || n->nargs != 2 || fp8_weight(c, n->args[1]) == MOE_NONE)
		return false;
	if (!strcmp(ir_attr_str(N(c->g, n->args[1]), "act", "bf16"), "int8")) {
		w8a8_einsum(c, id);
		return true;
	}
	const ir_node *an = N(c->g, n->args[0]), *dn = N(c->g, n->args[1]);
	const val *q = &c->v[dn->args[0]];
	val *av = tcpl_dm_view(c, n->args[0]);
	if (c->failed)
		return true;
	val a = *av;
	val *ov = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int64_t M = an->shape[0], I = an->shape[1], O = dn->shape[dn->rank - 2];
	int vreg = tcpl_valid_reg(c, id);
	int32_t sa, xq, C;
	if (c->qx_act == n->args[0] + 1 && c->qx_cfor == id + 1) { /* made by the einsum before */
		sa = c->qx_sa;
		xq = c->qx_xq;
		C = c->qx_c;
	} else {
		fp8_quantize_act(c, id, &a, M, I, vreg, &sa, &xq);
		C = fp8_chunk_scales(c, id, sa, M, vreg);
	}
	moe_id next = fp8_act_next(c, id);
	c->qx_act = c->qx_cfor = 0;
	if (next != MOE_NONE) {
		c->qx_act = n->args[0] + 1;
		c->qx_sa = sa;
		c->qx_xq = xq;
		c->qx_c = fp8_chunk_scales(c, next, sa, M, vreg);
		c->qx_cfor = next + 1;
	}
	fp8_contract(c, id, q, v4(xq, 0, I, 0, 1, 0), v4(C, 0, O * (I / 128), I / 128, 1, 0), ov, M, O, I, vreg, false);
	tcpl_dm_free(c, C);
	if (next == MOE_NONE) {
		tcpl_dm_free(c, xq);
		tcpl_dm_free(c, sa);
	}
	c->p->nproj++;
	return true;
}

/* ---- block scales staged whole ----
 * A block's fetch list pays one command issue per descriptor, and the three
 * scale tensors of a block-FP8 expert are three descriptors of a few hundred
 * bytes each. When all the experts' scales of the layer are small (at most
 * QSCALE_STAGE_BYTES together: Qwen3-30B-A3B's 128 experts take 147 KB; W8A8's
 * QSCALE_STAGE_W8A8_BYTES), they
 * are copied whole into DM once, right after routing's first contraction
 * (its inputs are fetched by then), while the DMA engines would otherwise idle; the block loop then reads them
 * in place through the expert register, like a streamed weight
 * (docs/tcp-isa.md 7.10). */
enum { QSCALE_STAGE_BYTES = 1 << 20 };
/* W8A8's per-channel scales (Qwen3-30B-A3B: 1.8 MB), which no dequantized
 * weight copy shares DM with */
enum { QSCALE_STAGE_W8A8_BYTES = 2 << 20 };

/* The weight leaf whose per-block gather id is the scales of an in-region
 * dequant; else MOE_NONE. */
static moe_id scale_leaf(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (!c->inreg[id] || n->op != MOE_OP_GATHER || n->valid != c->nblocks || N(c->g, n->args[0])->op != MOE_OP_WEIGHT)
		return MOE_NONE;
	for (moe_id u = id + 1; u < c->g->nnodes; u++) {
		const ir_node *un = N(c->g, u);
		if (c->inreg[u] && un->op == MOE_OP_DEQUANT && un->args[1] == id)
			return n->args[0];
	}
	return MOE_NONE;
}

/* The rows of the one W8A8 block contraction whose weight's scales are the
 * per-block gather gi and whose activation is quantized per block for it
 * alone (down's: the row factor R can go to a slot of the staged scales,
 * tcpl_w8a8_stage_rowdiv); else 0. */
static int64_t rowdiv_rows(const lw *c, moe_id gi)
{
	moe_id u = MOE_NONE, xf, bq, bs, mul, qf;
	for (moe_id d = gi + 1; d < c->g->nnodes; d++) {
		const ir_node *dn = N(c->g, d);
		if (dn->op != MOE_OP_DEQUANT || !c->inreg[d] || dn->nargs < 2 || dn->args[1] != gi)
			continue;
		if (u != MOE_NONE || fp8_weight(c, d) == MOE_NONE || strcmp(ir_attr_str(dn, "act", "bf16"), "int8"))
			return 0;
		for (moe_id e = d + 1; e < c->g->nnodes; e++)
			if (N(c->g, e)->op == MOE_OP_EINSUM && N(c->g, e)->args[1] == d) {
				if (u != MOE_NONE)
					return 0;
				u = e;
			}
		if (u == MOE_NONE)
			return 0;
	}
	if (u == MOE_NONE)
		return 0;
	moe_id a = N(c->g, u)->args[0];
	if (w8a8_pre(c, a, &bq, &bs, &mul, &qf) || !w8a8_chain(c, a, &xf) || w8a8_next(c, a, a) != u ||
		w8a8_next(c, a, u) != MOE_NONE)
		return 0;
	return N(c->g, u)->shape[N(c->g, u)->rank - 2];
}

void tcpl_quant_stage_after(lw *c, uint32_t from)
{
	bool now = from == UINT32_MAX;
	for (uint32_t pc = from; pc < c->p->ncode && !now; pc++)
		now = c->p->code[pc].op == TCP_OP_TU_CONTRACT;
	if (c->qscales_staged || !now)
		return;
	c->qscales_staged = true;
	if (c->rows == MOE_NONE)
		return;
	int64_t bytes = 0;
	for (moe_id i = 0; i < c->g->nnodes; i++) {
		moe_id w = scale_leaf(c, i);
		if (w != MOE_NONE)
			bytes += ir_bytes(N(c->g, w));
	}
	bool w8a8 = true; /* every staged scale an int8 dequant's (act="int8") */
	for (moe_id i = 0; i < c->g->nnodes; i++)
		if (c->inreg[i] && N(c->g, i)->op == MOE_OP_DEQUANT)
			w8a8 &= !strcmp(ir_attr_str(N(c->g, i), "act", "bf16"), "int8");
	if (bytes == 0 || bytes > (w8a8 ? QSCALE_STAGE_W8A8_BYTES : QSCALE_STAGE_BYTES))
		return;
	for (moe_id i = 0; i < c->g->nnodes && !c->failed; i++) {
		moe_id w = scale_leaf(c, i);
		if (w != MOE_NONE && c->v[w].kind == VK_VIEW && c->p->t[c->v[w].t].space == TCP_HBM &&
			!tcpl_w8a8_stage_rowdiv(c, w, rowdiv_rows(c, i))) /* lower_w8a8.c */
			tcpl_dm_view(c, w);
	}
}

bool tcpl_quant_resident(const lw *c, moe_id id)
{
	moe_id w = scale_leaf(c, id);
	return w != MOE_NONE && c->v[w].kind == VK_VIEW && c->p->t[c->v[w].t].space == TCP_DM;
}
