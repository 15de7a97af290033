/* backend-tcp/compiler/recipe_quant.c: sched-build's recipe for dequant
 * (docs/tcp-isa.md 7.10): an expert's quantized weight inside the block
 * loop, q [N, Kp] and its scales in DM (the loop's `e` operands), becomes the
 * weight [N, K] in the compute type in a DM buffer, by vector passes that
 * decode in the fetch unit: f8e4m3 widens to f32 (fp8), E2M1 nibbles go
 * through the fetch table (flag e2m1: mxfp4, nvfp4), int4 nibbles have 8
 * subtracted and widen to i32 (flag i4: int4, awq); the scales are a second
 * stream broadcast over their block by stride-0 loops. The passes, their
 * views and their steps are those of docs/tcp-isa.md 7.10, so the weight's
 * bits are the same whatever the schedule; a permutation or slice after the dequant is a view of the
 * buffer. A dequant outside the loop does not reach sched-build: it is
 * computed from weights only, packed (tcp-split-weights) and bound by the
 * prep graph. A dequant whose activations are quantized (act="fp8" on
 * block FP8, act="int8", read only by einsums) emits nothing: its einsums
 * read q and s themselves (recipe_qact.c). GPTQ does not reach it either:
 * tcp-split-weights computes a GPTQ dequant of weights' `e` inputs outside
 * the loop, from the weights themselves, and binds it packed (its g_idx
 * gives each input channel its group, so a decode in the loop would need
 * each column's scale and zero point). Refused: a GPTQ dequant of anything
 * else inside the loop, and int8 read otherwise. */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"
#include "ir/quant.h"

/* A view of value v in units of u per element of its buffer (2 x bytes for
 * 4-bit streams), over dims [nb, bn, kb, bk] of blocks bn x bk with row and
 * column strides rs and cs; bcast: one element per block (the scales). */
static tcp_view qview(const sb_val *v, int64_t u, int64_t base, int64_t rs, int64_t cs, int64_t bn, int64_t bk,
	bool bcast)
{
	tcp_view tv = tcp_view_none();
	tv.t = (int32_t)v->buf;
	tv.base = v->base * u + base;
	if (v->reg != TS_NONE) {
		tv.reg = (int32_t)v->reg;
		tv.scale = v->scale * u;
	}
	tv.stride[0] = bcast ? rs : bn * rs;
	tv.stride[1] = bcast ? 0 : rs;
	tv.stride[2] = bcast ? cs : bk * cs;
	tv.stride[3] = bcast ? 0 : cs;
	return tv;
}

/* a view of v over nd dims with strides st, in units of u per element */
static tcp_view nview(const sb_val *v, int64_t u, int nd, const int64_t *st)
{
	tcp_view tv = qview(v, u, 0, 0, 0, 1, 1, true);
	for (int k = 0; k < TCP_MAXD; k++)
		tv.stride[k] = k < nd ? st[k] : 0;
	return tv;
}

static tcp_view plain(ts_id t, int nd, const int64_t *st)
{
	tcp_view v = tcp_view_none();
	v.t = (int32_t)t;
	for (int k = 0; k < nd; k++)
		v.stride[k] = st[k];
	return v;
}

static void step(tcp_insn *in, tcp_vop op, int x, int y, uint32_t imm)
{
	tcp_step *s = &in->step[in->nstep++];
	s->op = (uint8_t)op;
	s->x = (uint8_t)x;
	s->y = (uint8_t)y;
	s->imm = imm;
}

static tcp_insn vec(int nd, const int64_t *dim, uint8_t flags)
{
	tcp_insn in = tcp_insn_init(TCP_OP_TU_VEC);
	in.ndim = (uint8_t)nd;
	for (int k = 0; k < nd; k++)
		in.dim[k] = dim[k];
	in.vreg = -1;
	in.flags = flags | TCP_F_ROUTE; /* the slices' bytes by the switch stage, as every recipe's passes */
	return in;
}

/* One vector pass over rows [r0, r0 + nb x bn) and columns [k0, k0 + kb x bk)
 * of the block grid (whole blocks, or the partial edge block). */
static void dq_pass(sb *b, moe_id id, const qt_info *qi, const sb_val *q, int64_t qu, const sb_val *s,
	const sb_val *d, bool canon, int64_t r0, int64_t nb, int64_t bn, int64_t k0, int64_t kb, int64_t bk)
{
	if (nb < 1 || bn < 1 || kb < 1 || bk < 1)
		return;
	const int64_t dim[4] = {nb, bn, kb, bk};
	tcp_insn in = vec(4, dim, 0);
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
	case QT_MXFP4:
		in.flags |= TCP_F_E2M1;
		if (canon) { /* s1: (s - 127) << 23, added to the exponent; the zero word kept */
			step(&in, TCP_V_TEQ, TCP_SRC_S0, TCP_SRC_IMM, 0);
			step(&in, TCP_V_IADD, TCP_SRC_S0, TCP_SRC_S1, 0);
			step(&in, TCP_V_MERGE, TCP_SRC_S0, TCP_SRC_V, 0);
			break;
		}
		/* the E8M0 byte shifted into an f32 exponent: 2^(s - 127) */
		step(&in, TCP_V_SHL, TCP_SRC_S1, TCP_SRC_IMM, 23);
		step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S0, 0);
		break;
	default: /* int4: (nibble - 8) as f32 x scale */
		in.flags |= TCP_F_I4;
		step(&in, TCP_V_ITOF, TCP_SRC_V, TCP_SRC_NONE, 0);
		step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
		break;
	}
	sb_emit(b, &in, id);
}

static bool same_val(const sb_val *a, const sb_val *b, int rank);

/* MXFP4 on canonical bytes (tcp_e2m1_canon: no E2M1 code 8, the prep
 * graph's rewrite in tcp-split-weights): the scales as i32 exponent offsets
 * (s - 127) << 23 [N, K/32] in one integer pass, into a DM buffer named
 * after the scales' node. The decode pass then adds one to each non-zero
 * E2M1 word, all at the integer rate: the f32 product w x 2^(s - 127)
 * exactly while it stays normal (E8M0 scales 2..252 for every E2M1
 * magnitude). */
static ts_id offsets_pass(sb *b, moe_id at, const qt_info *qi, const sb_val *s, moe_id sn)
{
	int64_t nr = (qi->N + qi->bn - 1) / qi->bn, nk = (qi->K + qi->bk - 1) / qi->bk;
	const int64_t sh[2] = {nr, nk}, ss[2] = {s->stride[0], s->stride[1]}, ds[2] = {nk, 1};
	ts_id cs = sb_dm_buf(b, sn, "mxfp4.exp", MOE_I32, 2, sh);
	tcp_insn in = vec(2, sh, 0);
	in.v[TCP_V_S0] = nview(s, 1, 2, ss);
	in.v[TCP_V_DST] = plain(cs, 2, ds);
	step(&in, TCP_V_SHL, TCP_SRC_V, TCP_SRC_IMM, 23);
	step(&in, TCP_V_IADD, TCP_SRC_V, TCP_SRC_IMM, (uint32_t)-(int64_t)(127u << 23));
	sb_emit(b, &in, at);
	return cs;
}

/* dequant d of the body on canonical MXFP4 bytes that sb_dequant decodes */
static bool canon_mxfp4(const sb *b, moe_id d, qt_info *qi)
{
	const ir_node *n = SBN(b, d);
	return n->op == MOE_OP_DEQUANT && n->rank == 2 && n->nargs == 2 && ir_attr_int(n, "tcp_e2m1_canon", 0) == 1 &&
	       b->g->is_body && ir_dequant_info(b->g, n, qi) && qi->fmt == QT_MXFP4 && !sb_qact_dequant(b, d, NULL);
}

/* the latest offsets buffer of scales node sn, TS_NONE when none */
static ts_id offsets_buf(const sb *b, moe_id sn)
{
	for (ts_id t = b->s->nbuf; t-- > 0;)
		if (b->s->buf[t].node == sn && !strcmp(b->s->buf[t].name, "mxfp4.exp"))
			return t;
	return TS_NONE;
}

/* The offsets of canonical MXFP4 dequant id's scales s; *cv: their view.
 * The body's first such dequant makes those of every later one (one pass
 * per scales operand), so no later decode pass waits for a pass after the
 * first decode pass (early-dequant moves them up to it). */
static void mxfp4_offsets(sb *b, moe_id id, const qt_info *qi, const sb_val *s, sb_val *cv)
{
	qt_info pi;
	bool first = true;
	for (moe_id p = 0; p < id && first; p++)
		first = !canon_mxfp4(b, p, &pi);
	moe_id sn = SBN(b, id)->args[1];
	ts_id cs = first ? TS_NONE : offsets_buf(b, sn);
	if (cs == TS_NONE)
		cs = offsets_pass(b, id, qi, s, sn);
	for (moe_id p = id + 1; first && p < b->g->nnodes; p++) {
		moe_id pn = canon_mxfp4(b, p, &pi) ? SBN(b, p)->args[1] : MOE_NONE;
		bool seen = pn == MOE_NONE || b->v[pn].kind != SV_VIEW || b->s->buf[b->v[pn].buf].space != TCP_DM ||
			    same_val(&b->v[pn], s, 2);
		for (moe_id x = id + 1; !seen && x < p; x++)
			seen = canon_mxfp4(b, x, &pi) && same_val(&b->v[SBN(b, x)->args[1]], &b->v[pn], 2);
		if (!seen && canon_mxfp4(b, p, &pi))
			offsets_pass(b, p, &pi, &b->v[pn], pn);
	}
	memset(cv, 0, sizeof *cv);
	cv->kind = SV_VIEW;
	cv->buf = cs;
	cv->reg = TS_NONE;
	cv->stride[0] = (qi->K + qi->bk - 1) / qi->bk;
	cv->stride[1] = 1;
}

/* AWQ: q i32 [K, N/8] and z i32 [NG, N/8] packed along N (channel
 * 8c + 2a + c' in nibble a + 4c'), s [NG, N] -> W [N, K] = (q - z) s. One
 * pass unpacks z to i32 (z - 8, the i4 decode), one decodes q (q - 8),
 * subtracts, converts and scales, over dims [N/8, 4, 2, NG, G]. */
static void awq_passes(sb *b, moe_id id, const qt_info *qi, const sb_val *q, const sb_val *s, const sb_val *z,
	const sb_val *d)
{
	int64_t N = qi->N, K = qi->K, G = qi->bk, NG = K / G, N8 = N / 8;
	const int64_t shz[2] = {NG, N};
	ts_id zd = sb_dm_buf(b, id, "awq.zero", MOE_I32, 2, shz);
	const int64_t zdim[4] = {NG, N8, 4, 2};
	tcp_insn in = vec(4, zdim, TCP_F_I4);
	const int64_t zs[4] = {z->stride[0] * 8, z->stride[1] * 8, 1, 4}, zds[4] = {N, 8, 2, 1};
	in.v[TCP_V_S0] = nview(z, 8, 4, zs);
	in.v[TCP_V_DST] = plain(zd, 4, zds);
	sb_emit(b, &in, id);
	const int64_t dim[5] = {N8, 4, 2, NG, G};
	in = vec(5, dim, TCP_F_I4);
	const int64_t qs[5] = {q->stride[1] * 8, 1, 4, G * q->stride[0] * 8, q->stride[0] * 8};
	const int64_t z1[5] = {8, 2, 1, N, 0};
	const int64_t ss[5] = {8 * s->stride[1], 2 * s->stride[1], s->stride[1], s->stride[0], 0};
	const int64_t ds[5] = {8 * d->stride[0], 2 * d->stride[0], d->stride[0], G * d->stride[1], d->stride[1]};
	in.v[TCP_V_S0] = nview(q, 8, 5, qs);
	in.v[TCP_V_S1] = plain(zd, 5, z1);
	in.v[TCP_V_S2] = nview(s, 1, 5, ss);
	in.v[TCP_V_DST] = nview(d, 1, 5, ds);
	step(&in, TCP_V_ISUB, TCP_SRC_V, TCP_SRC_S1, 0); /* (q - 8) - (z - 8) */
	step(&in, TCP_V_ITOF, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S2, 0);
	sb_emit(b, &in, id);
}

/* NVFP4: the combined scales f32(e4m3(s) / g) ("div") or f32(e4m3(s) x g)
 * ("mul") [N, K/16] in one pass, into a DM buffer; *cv: their view. */
static void nvfp4_scales(sb *b, moe_id id, const qt_info *qi, const sb_val *s, const sb_val *g, sb_val *cv)
{
	const ir_node *n = SBN(b, id);
	int64_t nk = qi->K / 16;
	const int64_t sh[2] = {qi->N, nk}, dim[2] = {qi->N, nk}, ss[2] = {s->stride[0], s->stride[1]}, gs[2] = {0, 0},
		      ds[2] = {nk, 1};
	ts_id cs = sb_dm_buf(b, id, "nvfp4.scale", MOE_F32, 2, sh);
	tcp_insn in = vec(2, dim, 0);
	in.v[TCP_V_S0] = nview(s, 1, 2, ss);
	in.v[TCP_V_S1] = nview(g, 1, 2, gs);
	in.v[TCP_V_DST] = plain(cs, 2, ds);
	step(&in, strcmp(ir_attr_str(n, "gscale", "div"), "mul") ? TCP_V_FDIV : TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	sb_emit(b, &in, id);
	memset(cv, 0, sizeof *cv);
	cv->kind = SV_VIEW;
	cv->buf = cs;
	cv->reg = TS_NONE;
	cv->stride[0] = nk;
	cv->stride[1] = 1;
}

static bool same_attr(const ir_attr *x, const ir_attr *y)
{
	if (!y || x->kind != y->kind)
		return false;
	switch (x->kind) {
	case MOE_ATTR_INT: return x->v.i == y->v.i;
	case MOE_ATTR_FLOAT: return !memcmp(&x->v.f, &y->v.f, sizeof(double));
	case MOE_ATTR_STR: return !strcmp(x->v.s, y->v.s);
	case MOE_ATTR_INTS:
		return x->count == y->count && !memcmp(x->v.ints, y->v.ints, (size_t)x->count * sizeof(int64_t));
	}
	return false;
}

static bool same_val(const sb_val *a, const sb_val *b, int rank)
{
	bool same = a->kind == SV_VIEW && b->kind == SV_VIEW && a->buf == b->buf && a->reg == b->reg &&
		    a->base == b->base && a->scale == b->scale;
	for (int k = 0; same && k < rank; k++)
		same = a->stride[k] == b->stride[k];
	return same;
}

/* An earlier dequant of the body with the same operands' values (one
 * expert operand given to the loop twice: gpt-oss's gate and up each read
 * the fused gate_up) and the same attributes; MOE_NONE when none. */
static moe_id same_dequant(const sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	for (moe_id p = 0; p < id; p++) {
		const ir_node *x = SBN(b, p);
		bool same = x->op == MOE_OP_DEQUANT && x->nargs == n->nargs && x->dtype == n->dtype && x->rank == n->rank &&
			    !memcmp(x->shape, n->shape, sizeof(int64_t) * n->rank) && x->nattrs == n->nattrs &&
			    b->v[p].kind == SV_VIEW;
		for (uint32_t a = 0; same && a < x->nattrs; a++)
			same = same_attr(&x->attrs[a], ir_attr_find(n, x->attrs[a].key));
		for (uint32_t k = 0; same && k < n->nargs; k++)
			same = same_val(&b->v[x->args[k]], &b->v[n->args[k]], SBN(b, n->args[k])->rank);
		if (same)
			return p;
	}
	return MOE_NONE;
}

void sb_dequant(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *qn = SBN(b, n->args[0]);
	qt_info qi;
	if (sb_qact_dequant(b, id, NULL))
		return; /* its einsums read q and s themselves (recipe_qact.c) */
	if (!b->g->is_body || n->rank != 2 || !ir_dequant_info(b->g, n, &qi)) {
		sb_refuse(b, id, "a dequant outside the block loop's experts (one computed from weights only is packed)");
		return;
	}
	if (qi.fmt == QT_GPTQ || qi.fmt == QT_INT8 || (qi.fmt == QT_AWQ && (qi.K % qi.bk || qi.N % 8))) {
		sb_refuse(b, id, qi.fmt == QT_GPTQ ? "a GPTQ dequant inside the block loop of values other than weights"
				 : qi.fmt == QT_INT8 ? "an int8 (W8A8) dequant"
						     : "an AWQ dequant over partial groups of input channels");
		return;
	}
	if (n->nargs > 3 || ((qi.fmt == QT_AWQ || qi.fmt == QT_NVFP4) && n->nargs != 3)) {
		sb_refuse(b, id, "a dequant with these operands");
		return;
	}
	moe_id p = same_dequant(b, id);
	if (p != MOE_NONE) {
		b->v[id] = b->v[p];
		return;
	}
	const sb_val *q = sb_dm_val(b, n->args[0]);
	const sb_val *s = q ? sb_dm_val(b, n->args[1]) : NULL;
	const sb_val *third = s && n->nargs > 2 ? sb_dm_val(b, n->args[2]) : NULL;
	if (!s || (n->nargs > 2 && !third))
		return;
	const sb_val *d = sb_out_val(b, id);
	if (qi.fmt == QT_AWQ) {
		awq_passes(b, id, &qi, q, s, third, d);
		return;
	}
	sb_val cv;
	bool canon = qi.fmt == QT_MXFP4 && ir_attr_int(n, "tcp_e2m1_canon", 0) == 1;
	if (qi.fmt == QT_NVFP4) {
		nvfp4_scales(b, id, &qi, s, third, &cv);
		s = &cv;
	} else if (canon) {
		mxfp4_offsets(b, id, &qi, s, &cv);
		s = &cv;
	}
	/* 4-bit formats: the q view counts nibbles of the buffer's elements */
	int64_t qu = qi.fmt == QT_FP8 ? 1 : 2 * (int64_t)moe_dtype_size((moe_dtype)qn->dtype);
	int64_t fn = qi.N / qi.bn, rn = qi.N % qi.bn, fk = qi.K / qi.bk, rk = qi.K % qi.bk;
	dq_pass(b, id, &qi, q, qu, s, d, canon, 0, fn, qi.bn, 0, fk, qi.bk);
	dq_pass(b, id, &qi, q, qu, s, d, canon, 0, fn, qi.bn, fk * qi.bk, 1, rk);
	dq_pass(b, id, &qi, q, qu, s, d, canon, fn * qi.bn, 1, rn, 0, fk, qi.bk);
	dq_pass(b, id, &qi, q, qu, s, d, canon, fn * qi.bn, 1, rn, fk * qi.bk, 1, rk);
}
