/* backend-c/lower_data.c: host lowering of leaves, data movement (broadcast,
 * slice, concat, gather, take_along, scatter, one_hot, filter), quantized
 * weights (ir/quant.h) and reductions along one axis. */
#include "backend-c/lower_int.h"
#include "ir/quant.h"
#include "ir/scalar.h"
#include "moec/runtime.h"

/* ---------------- leaves and data movement ---------------- */

/* A double rounded once to f32 or bf16 (the reference's rule for attribute
 * values): for bf16 the f32 is made round-to-odd first. */
static float round_once(moe_dtype t, double d)
{
	float f = (float)d;
	if (t == MOE_BF16 && !isnan(d) && !isinf(f) && (double)f != d) {
		uint32_t u;
		memcpy(&u, &f, sizeof u);
		if (!(u & 1u))
			f = nextafterf(f, d > (double)f ? INFINITY : -INFINITY);
	}
	return t == MOE_BF16 ? moe_bf16_to_f32(moe_f32_to_bf16(f)) : f;
}

/* Attribute `key` of n as a constant of n's dtype, like a `cast` of the value;
 * integer values must fit i32. NULL after a diagnostic. */
static cg_expr *attr_const(lw *L, const ir_node *n, const char *key)
{
	const ir_attr *a = ir_attr_find(n, key);
	moe_dtype t = (moe_dtype)n->dtype;
	if (moe_dtype_is_float(t)) {
		double d = !a ? 0.0 : a->kind == MOE_ATTR_FLOAT ? a->v.f : a->kind == MOE_ATTR_INT ? (double)a->v.i : 0.0;
		return fc(L, round_once(t, d));
	}
	if (a && a->kind == MOE_ATTR_FLOAT)
		return ic32(L, t == MOE_BOOL ? a->v.f != 0 : sc_f2i((float)a->v.f));
	int64_t i = a && a->kind == MOE_ATTR_INT ? a->v.i : 0;
	if (t == MOE_BOOL)
		return ic32(L, i != 0);
	if (i < INT32_MIN || i > INT32_MAX) {
		moe_diag(L->ctx, MOE_DIAG_ERROR, n->loc, "'%s': %s = %lld does not fit i32", ir_ops[n->op].name, key,
			(long long)i);
		return NULL;
	}
	return ic32(L, (int32_t)i);
}

/* Is const c read only as the base (operand 0) of scatters? Those write its
 * value themselves (cgen_lower_scatter), so it need not be materialised. */
static bool scatter_base_only(lw *L, moe_id c)
{
	for (uint32_t j = 0; j < L->g->nout; j++)
		if (L->g->outputs[j] == c)
			return false;
	for (moe_id i = c + 1; i < L->g->nnodes; i++) {
		const ir_node *u = nd(L, i);
		for (uint32_t a = 0; a < u->nargs; a++)
			if (u->args[a] == c && (u->op != MOE_OP_SCATTER || a != 0))
				return false;
		if (u->valid == c)
			return false;
	}
	return true;
}

bool cgen_lower_const(lw *L, cg_block *b, const ir_node *n, int out)
{
	cg_expr *e = attr_const(L, n, "value");
	if (!e)
		return false;
	if (n->valid == MOE_NONE && scatter_base_only(L, L->cur))
		return true;
	int j;
	cg_block *in = loopv(L, b, &j, ic(L, 0), ic(L, ir_numel(n)));
	par_if_big(b, ir_numel(n)); /* one element per iteration */
	store(L, in, out, vr(L, j), e);
	return true;
}

void cgen_lower_iota(lw *L, cg_block *b, const ir_node *n, int out)
{
	int iv[MOE_MAX_RANK], ax = ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank);
	int64_t s[MOE_MAX_RANK];
	strides_of(n, s);
	cg_block *in = loops(L, b, n->shape, 0, n->rank, iv);
	store(L, in, out, lin(L, iv, s, n->rank, NULL), conv(L, vr(L, iv[ax]), CT_I32));
}

void cgen_copy_flat(lw *L, cg_block *b, int dst, int src, int64_t numel)
{
	int j;
	cg_block *in = loopv(L, b, &j, ic(L, 0), ic(L, numel));
	par_if_big(b, numel); /* one element per iteration */
	store(L, in, dst, vr(L, j), ld(L, src, vr(L, j)));
}

void cgen_lower_broadcast(lw *L, cg_block *b, const ir_node *n, int out)
{
	int iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], as[MOE_MAX_RANK];
	strides_of(n, os);
	bcast_strides(nd(L, n->args[0]), n->rank, as);
	cg_block *in = loops(L, b, n->shape, 0, n->rank, iv);
	store(L, in, out, lin(L, iv, os, n->rank, NULL), ld(L, L->p->node_buf[n->args[0]], lin(L, iv, as, n->rank, NULL)));
}

void cgen_lower_slice(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank), iv[MOE_MAX_RANK];
	int64_t start = ir_attr_int(n, "start", 0), step = ir_attr_int(n, "step", 1);
	int64_t os[MOE_MAX_RANK], xs[MOE_MAX_RANK] = {0};
	strides_of(n, os);
	strides_of(x, xs);
	int64_t xs2[MOE_MAX_RANK];
	memcpy(xs2, xs, sizeof xs2);
	xs2[ax] = xs[ax] * step;
	cg_block *in = loops(L, b, n->shape, 0, n->rank, iv);
	store(L, in, out, lin(L, iv, os, n->rank, NULL),
		ld(L, L->p->node_buf[n->args[0]], lin(L, iv, xs2, n->rank, ic(L, start * xs[ax]))));
}

void cgen_lower_concat(lw *L, cg_block *b, const ir_node *n, int out)
{
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank), iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], at = 0;
	strides_of(n, os);
	for (uint32_t i = 0; i < n->nargs; i++) {
		const ir_node *x = nd(L, n->args[i]);
		int64_t xs[MOE_MAX_RANK];
		strides_of(x, xs);
		cg_block *in = loops(L, b, x->shape, 0, x->rank, iv);
		store(L, in, out, lin(L, iv, os, n->rank, ic(L, at * os[ax])),
			ld(L, L->p->node_buf[n->args[i]], lin(L, iv, xs, x->rank, NULL)));
		at += x->shape[ax];
	}
}

/* checked index: var = i32 value as i64; faults unless 0 <= var < n */
int cgen_checked_index(lw *L, cg_block *b, cg_expr *v32, int64_t n)
{
	int t = newvar(L, CT_I64);
	set(L, b, t, conv(L, v32, CT_I64));
	cg_expr *ok = bin(L, CE_AND, bin(L, CE_GE, vr(L, t), ic(L, 0)), bin(L, CE_LT, vr(L, t), ic(L, n)));
	fault_unless(L, b, ok, CG_FAULT_INDEX);
	return t;
}

/* A gather fused into its einsums: only its index checks remain here (the
 * faults it would raise), over the blocks its mask computes. */
void cgen_lower_gather_checks(lw *L, cg_block *b, const ir_node *n)
{
	const ir_node *x = nd(L, n->args[0]);
	cg_expr *hi = ic(L, n->shape[0]);
	if (n->valid != MOE_NONE) {
		int cnt = newvar(L, CT_I64);
		set(L, b, cnt, clamp_count(L, ld(L, L->p->node_buf[n->valid], ic(L, 0)), n->shape[0]));
		hi = vr(L, cnt);
	}
	int g;
	cg_block *in = loopv(L, b, &g, ic(L, 0), hi);
	cgen_checked_index(L, in, ld(L, L->p->node_buf[n->args[1]], vr(L, g)), x->shape[0]);
	comment(L, b, "indices of a gather read in place by its einsums");
}

void cgen_lower_gather(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]), *ix = nd(L, n->args[1]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", 0), x->rank), ir = ix->rank;
	int iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], xs[MOE_MAX_RANK], is[MOE_MAX_RANK];
	strides_of(n, os);
	strides_of(x, xs);
	strides_of(ix, is);
	int lvl = ax + ir, md = mask_depth(L, n);
	if (lvl < md)
		lvl = md;
	/* a big unmasked gather checks its indices first (serially, the faults in
	 * index order), then copies in a parallel loop that cannot fault */
	bool par = md == 0 && lvl > 0 && ir_numel(n) >= PAR_MIN_ELEMS;
	if (par) {
		int jv[MOE_MAX_RANK];
		cg_block *c = loops(L, b, ix->shape, 0, ir, jv);
		cgen_checked_index(L, c, ld(L, L->p->node_buf[n->args[1]], lin(L, jv, is, ir, NULL)), x->shape[ax]);
	}
	cg_block *in = nest(L, b, n, out, lvl, iv);
	if (par)
		b->last->par = true;
	/* index tensor position: output dims [ax, ax + ir) */
	int ivi[MOE_MAX_RANK];
	for (int d = 0; d < ir; d++)
		ivi[d] = iv[ax + d];
	cg_expr *iload = ld(L, L->p->node_buf[n->args[1]], lin(L, ivi, is, ir, NULL));
	int t;
	if (par) { /* checked above: the clamp never changes it */
		t = newvar(L, CT_I64);
		set(L, in, t, clamp_count(L, iload, x->shape[ax] - 1));
	} else {
		t = cgen_checked_index(L, in, iload, x->shape[ax]);
	}
	in = loops(L, in, n->shape, lvl, n->rank, iv);
	cg_expr *xi = mul64(L, vr(L, t), xs[ax]);
	for (int d = 0; d < ax; d++)
		xi = add64(L, xi, mul64(L, vr(L, iv[d]), xs[d]));
	for (int d = ax + 1; d < x->rank; d++)
		xi = add64(L, xi, mul64(L, vr(L, iv[d - 1 + ir]), xs[d]));
	store(L, in, out, lin(L, iv, os, n->rank, NULL), ld(L, L->p->node_buf[n->args[0]], xi));
}

/* ---------------- quantized weights (ir/quant.h) ---------------- */

static cg_expr *i32div(lw *L, cg_expr *v64, int64_t d)
{
	return d == 1 ? v64 : conv(L, bin(L, CE_SDIV, conv(L, v64, CT_I32), ic32(L, (int32_t)d)), CT_I64);
}

/* The f32 2^e for an i32 expression e of normal range, from its bits. */
static cg_expr *pow2(lw *L, cg_expr *e)
{
	return mk(L, CE_BITS, CT_F32, bin(L, CE_SHL, bin(L, CE_ADD, e, ic32(L, 127)), ic32(L, 23)), NULL, NULL);
}

static cg_expr *fbits(lw *L, uint32_t u)
{
	return mk(L, CE_BITS, CT_F32, ic32(L, (int32_t)u), NULL, NULL);
}

static cg_expr *bit_set(lw *L, cg_expr *x, int32_t mask)
{
	return bin(L, CE_NE, bin(L, CE_AND, x, ic32(L, mask)), ic32(L, 0));
}

/* qt_e4m3 of the byte b (i32) */
static cg_expr *e4m3_expr(lw *L, cg_expr *b)
{
	cg_expr *e = bin(L, CE_AND, bin(L, CE_LSHR, b, ic32(L, 3)), ic32(L, 15));
	cg_expr *m = bin(L, CE_AND, b, ic32(L, 7)), *zero = bin(L, CE_EQ, e, ic32(L, 0));
	cg_expr *mant = conv(L, sel(L, zero, m, bin(L, CE_ADD, m, ic32(L, 8))), CT_F32);
	cg_expr *v = bin(L, CE_MUL, mant, pow2(L, bin(L, CE_SUB, sel(L, zero, ic32(L, 1), e), ic32(L, 10))));
	v = sel(L, bin(L, CE_EQ, bin(L, CE_AND, b, ic32(L, 0x7f)), ic32(L, 0x7f)), fbits(L, 0x7fc00000u), v);
	return sel(L, bit_set(L, b, 0x80), un(L, CE_NEG, v), v);
}

/* qt_e2m1 of the nibble c4 (i32) */
static cg_expr *e2m1_expr(lw *L, cg_expr *c4)
{
	cg_expr *c = bin(L, CE_AND, c4, ic32(L, 7)), *small = bin(L, CE_LT, c, ic32(L, 2));
	cg_expr *mant = conv(L, sel(L, small, c, bin(L, CE_ADD, bin(L, CE_AND, c, ic32(L, 1)), ic32(L, 2))), CT_F32);
	cg_expr *ex = sel(L, small, ic32(L, -1), bin(L, CE_SUB, bin(L, CE_LSHR, c, ic32(L, 1)), ic32(L, 2)));
	cg_expr *v = bin(L, CE_MUL, mant, pow2(L, ex));
	return sel(L, bit_set(L, c4, 8), un(L, CE_NEG, v), v);
}

/* qt_e8m0 of the byte s (i32): 2^(s-127), 0 -> 2^-127 (subnormal), 255 -> NaN */
static cg_expr *e8m0_expr(lw *L, cg_expr *s)
{
	cg_expr *v = sel(L, bin(L, CE_EQ, s, ic32(L, 0)), fbits(L, 0x00400000u),
		mk(L, CE_BITS, CT_F32, bin(L, CE_SHL, s, ic32(L, 23)), NULL, NULL));
	return sel(L, bin(L, CE_EQ, s, ic32(L, 255)), fbits(L, 0x7fc00000u), v);
}

/* v rounded to binary16 and back as qt_f16 does: nearest even on the f32
 * bits for normal magnitudes, multiples of 2^-24 below 2^-14. */
static cg_expr *f16_round(lw *L, cg_block *in, cg_expr *v)
{
	int x = newvar(L, CT_F32), a = newvar(L, CT_F32), bb = newvar(L, CT_I32);
	set(L, in, x, v);
	set(L, in, a, un(L, CE_ABS, vr(L, x)));
	set(L, in, bb, mk(L, CE_BITS, CT_I32, vr(L, a), NULL, NULL));
	cg_expr *odd = bin(L, CE_AND, bin(L, CE_LSHR, vr(L, bb), ic32(L, 13)), ic32(L, 1));
	cg_expr *rb = bin(L, CE_AND, bin(L, CE_ADD, bin(L, CE_ADD, vr(L, bb), ic32(L, 0xfff)), odd), ic32(L, ~0x1fff));
	int rn = newvar(L, CT_F32);
	set(L, in, rn, mk(L, CE_BITS, CT_F32, rb, NULL, NULL));
	cg_expr *norm = sel(L, bin(L, CE_GT, vr(L, rn), fc(L, 65504.0f)), fbits(L, 0x7f800000u), vr(L, rn));
	cg_expr *sub = bin(L, CE_SUB, bin(L, CE_ADD, vr(L, a), fc(L, 0.5f)), fc(L, 0.5f));
	int r = newvar(L, CT_F32);
	set(L, in, r, sel(L, bin(L, CE_LT, vr(L, a), fc(L, 0x1p-14f)), sub, norm));
	cg_expr *sg = sel(L, bin(L, CE_LT, vr(L, x), fc(L, 0.0f)), un(L, CE_NEG, vr(L, r)), vr(L, r));
	return sel(L, un(L, CE_ISNAN, vr(L, x)), vr(L, x), sg);
}

/* gptq (ir/quant.h): q [.., K/8, N], s [.., NG, N], z [.., NG, N/8], g [.., K]. */
static void lower_gptq(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *qn = nd(L, n->args[0]), *sn = nd(L, n->args[1]), *zn = nd(L, n->args[2]), *gn = nd(L, n->args[3]);
	int r = n->rank, iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], qs[MOE_MAX_RANK], ss[MOE_MAX_RANK], zs[MOE_MAX_RANK], gs[MOE_MAX_RANK];
	strides_of(n, os);
	strides_of(qn, qs);
	strides_of(sn, ss);
	strides_of(zn, zs);
	strides_of(gn, gs);
	cg_block *in = nest(L, b, n, out, r, iv);
	cg_expr *gi = lin(L, iv, gs, r - 2, vr(L, iv[r - 1]));
	int grp = cgen_checked_index(L, in, ld(L, L->p->node_buf[n->args[3]], gi), sn->shape[r - 2]);
	cg_expr *qo = lin(L, iv, qs, r - 2, add64(L, mul64(L, i32div(L, vr(L, iv[r - 1]), 8), qs[r - 2]), vr(L, iv[r - 2])));
	cg_expr *so = lin(L, iv, ss, r - 2, add64(L, mul64(L, vr(L, grp), ss[r - 2]), vr(L, iv[r - 2])));
	cg_expr *zo = lin(L, iv, zs, r - 2, add64(L, mul64(L, vr(L, grp), zs[r - 2]), i32div(L, vr(L, iv[r - 2]), 8)));
	cg_expr *qsh = bin(L, CE_SHL, bin(L, CE_AND, conv(L, vr(L, iv[r - 1]), CT_I32), ic32(L, 7)), ic32(L, 2));
	cg_expr *zsh = bin(L, CE_SHL, bin(L, CE_AND, conv(L, vr(L, iv[r - 2]), CT_I32), ic32(L, 7)), ic32(L, 2));
	cg_expr *q = bin(L, CE_AND, bin(L, CE_LSHR, ld(L, L->p->node_buf[n->args[0]], qo), qsh), ic32(L, 15));
	cg_expr *z = bin(L, CE_AND, bin(L, CE_LSHR, ld(L, L->p->node_buf[n->args[2]], zo), zsh), ic32(L, 15));
	cg_expr *d = bin(L, CE_SUB, bin(L, CE_SUB, q, z), ic32(L, (int32_t)ir_attr_int(n, "zp", 1)));
	cg_expr *v = bin(L, CE_MUL, conv(L, d, CT_F32), ld(L, L->p->node_buf[n->args[1]], so));
	store(L, in, out, lin(L, iv, os, r, NULL), f16_round(L, in, v));
}

/* awq (ir/quant.h): q [.., K, N/8], s [.., NG, N], z [.., NG, N/8]. */
static void lower_awq(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *qn = nd(L, n->args[0]), *sn = nd(L, n->args[1]), *zn = nd(L, n->args[2]);
	qt_info qi;
	IR_ASSERT(ir_dequant_info(L->g, n, &qi));
	int r = n->rank, iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], qs[MOE_MAX_RANK], ss[MOE_MAX_RANK], zs[MOE_MAX_RANK];
	strides_of(n, os);
	strides_of(qn, qs);
	strides_of(sn, ss);
	strides_of(zn, zs);
	cg_block *in = nest(L, b, n, out, r, iv);
	cg_expr *grp = i32div(L, vr(L, iv[r - 1]), qi.bk);
	cg_expr *qo = lin(L, iv, qs, r - 2, add64(L, mul64(L, vr(L, iv[r - 1]), qs[r - 2]), i32div(L, vr(L, iv[r - 2]), 8)));
	cg_expr *so = lin(L, iv, ss, r - 2, add64(L, mul64(L, grp, ss[r - 2]), vr(L, iv[r - 2])));
	cg_expr *zo = lin(L, iv, zs, r - 2, add64(L, mul64(L, i32div(L, vr(L, iv[r - 1]), qi.bk), zs[r - 2]),
							 i32div(L, vr(L, iv[r - 2]), 8)));
	/* nibble (j/2) + 4(j%2) of output channel 8c + j */
	int sh = newvar(L, CT_I32);
	cg_expr *j = bin(L, CE_AND, conv(L, vr(L, iv[r - 2]), CT_I32), ic32(L, 7));
	cg_expr *j2 = bin(L, CE_AND, conv(L, vr(L, iv[r - 2]), CT_I32), ic32(L, 7));
	set(L, in, sh, bin(L, CE_SHL, bin(L, CE_ADD, bin(L, CE_LSHR, j, ic32(L, 1)),
					   bin(L, CE_SHL, bin(L, CE_AND, j2, ic32(L, 1)), ic32(L, 2))), ic32(L, 2)));
	cg_expr *q = bin(L, CE_AND, bin(L, CE_LSHR, ld(L, L->p->node_buf[n->args[0]], qo), vr(L, sh)), ic32(L, 15));
	cg_expr *z = bin(L, CE_AND, bin(L, CE_LSHR, ld(L, L->p->node_buf[n->args[2]], zo), vr(L, sh)), ic32(L, 15));
	cg_expr *v = bin(L, CE_MUL, conv(L, bin(L, CE_SUB, q, z), CT_F32), ld(L, L->p->node_buf[n->args[1]], so));
	store(L, in, out, lin(L, iv, os, r, NULL), f16_round(L, in, v));
}

/* dequant: one loop nest over the result (rows past a scalar mask zeroed),
 * each element decoded from its packed value and scale as qt_value does. */
void cgen_lower_dequant(lw *L, cg_block *b, const ir_node *n, int out)
{
	if (n->nargs == 3 && strcmp(ir_attr_str(n, "format", ""), "nvfp4")) {
		lower_awq(L, b, n, out);
		return;
	}
	if (n->nargs == 4) {
		lower_gptq(L, b, n, out);
		return;
	}
	const ir_node *qn = nd(L, n->args[0]), *sn = nd(L, n->args[1]);
	qt_info qi;
	IR_ASSERT(ir_dequant_info(L->g, n, &qi));
	int r = n->rank, iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], qs[MOE_MAX_RANK], ss[MOE_MAX_RANK];
	strides_of(n, os);
	strides_of(qn, qs);
	strides_of(sn, ss);
	cg_block *in = nest(L, b, n, out, r, iv);
	cg_expr *row = vr(L, iv[r - 2]), *k = vr(L, iv[r - 1]);
	cg_expr *qi_ = add64(L, lin(L, iv, qs, r - 1, NULL), i32div(L, k, qt_pack(qi.fmt)));
	cg_expr *si = add64(L, lin(L, iv, ss, r - 2, mul64(L, i32div(L, row, qi.bn), ss[r - 2])), i32div(L, k, qi.bk));
	cg_expr *raw = ld(L, L->p->node_buf[n->args[0]], qi_), *sc = ld(L, L->p->node_buf[n->args[1]], si);
	cg_expr *k32 = conv(L, k, CT_I32), *v;
	if (qi.fmt == QT_FP8) {
		v = bin(L, CE_MUL, e4m3_expr(L, raw), sc);
	} else if (qi.fmt == QT_INT8) { /* the byte as two's complement */
		cg_expr *b8 = bin(L, CE_AND, raw, ic32(L, 255));
		cg_expr *neg = bin(L, CE_SHL, bin(L, CE_AND, raw, ic32(L, 128)), ic32(L, 1));
		v = bin(L, CE_MUL, conv(L, bin(L, CE_SUB, b8, neg), CT_F32), sc);
	} else if (qi.fmt == QT_MXFP4 || qi.fmt == QT_NVFP4) {
		cg_expr *sh = bin(L, CE_SHL, bin(L, CE_AND, k32, ic32(L, 1)), ic32(L, 2));
		cg_expr *nib = bin(L, CE_AND, bin(L, CE_LSHR, raw, sh), ic32(L, 15));
		if (qi.fmt == QT_NVFP4) { /* qt_nvfp4: the block scale and the global one combined in f32 first */
			int64_t gs[MOE_MAX_RANK];
			strides_of(nd(L, n->args[2]), gs);
			cg_expr *g = ld(L, L->p->node_buf[n->args[2]], lin(L, iv, gs, r - 2, NULL));
			bool div = !strcmp(ir_attr_str(n, "gscale", "div"), "div");
			int bs = newvar(L, CT_F32);
			set(L, in, bs, bin(L, div ? CE_FDIV : CE_MUL, e4m3_expr(L, sc), g));
			v = bin(L, CE_MUL, e2m1_expr(L, nib), vr(L, bs));
		} else {
			v = bin(L, CE_MUL, e2m1_expr(L, nib), e8m0_expr(L, sc));
		}
	} else {
		cg_expr *sh = bin(L, CE_SHL, bin(L, CE_AND, k32, ic32(L, 7)), ic32(L, 2));
		cg_expr *nib = bin(L, CE_AND, bin(L, CE_LSHR, raw, sh), ic32(L, 15));
		v = bin(L, CE_MUL, conv(L, bin(L, CE_SUB, nib, ic32(L, 8)), CT_F32), sc);
	}
	store(L, in, out, lin(L, iv, os, r, NULL), v);
}

void cgen_lower_take_along(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank), iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], xs[MOE_MAX_RANK];
	strides_of(n, os);
	strides_of(x, xs);
	int md = mask_depth(L, n);
	cg_block *in = loops(L, nest(L, b, n, out, md, iv), n->shape, md, n->rank, iv);
	cg_expr *oi = lin(L, iv, os, n->rank, NULL);
	int t = cgen_checked_index(L, in, ld(L, L->p->node_buf[n->args[1]], oi), x->shape[ax]);
	int64_t xs2[MOE_MAX_RANK];
	memcpy(xs2, xs, sizeof xs2);
	xs2[ax] = 0;
	cg_expr *xi = lin(L, iv, xs2, x->rank, mul64(L, vr(L, t), xs[ax]));
	store(L, in, out, oi, ld(L, L->p->node_buf[n->args[0]], xi));
}

void cgen_lower_scatter(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *ix = nd(L, n->args[1]);
	bool add = !strcmp(ir_attr_str(n, "mode", "set"), "add");
	int src = L->p->node_buf[n->args[2]], iv[MOE_MAX_RANK];
	/* bf16 additions accumulate in f32 and round once at the end */
	int dst = add && n->dtype == MOE_BF16 ? cgen_scratch(L, MOE_F32, ir_numel(n)) : out;
	const ir_node *base = nd(L, n->args[0]);
	cg_expr *fill = base->op == MOE_OP_CONST && base->valid == MOE_NONE ? attr_const(L, base, "value") : NULL;
	if (fill) { /* a constant base is written here (its node is not materialised) */
		int j;
		cg_block *z = loopv(L, b, &j, ic(L, 0), ic(L, ir_numel(n)));
		par_if_big(b, ir_numel(n));
		store(L, z, dst, vr(L, j), fill);
	} else {
		cgen_copy_flat(L, b, dst, L->p->node_buf[n->args[0]], ir_numel(n));
	}
	int64_t row = ir_numel(n) / n->shape[0];
	int64_t is[MOE_MAX_RANK];
	strides_of(ix, is);
	cg_block *in = b;
	int d0 = 0;
	if (n->valid != MOE_NONE && ix->rank >= 1) { /* only index rows below the count are applied */
		int cnt = newvar(L, CT_I64);
		set(L, b, cnt, clamp_count(L, ld(L, L->p->node_buf[n->valid], ic(L, 0)), ix->shape[0]));
		in = loopv(L, b, &iv[0], ic(L, 0), vr(L, cnt));
		d0 = 1;
	}
	in = loops(L, in, ix->shape, d0, ix->rank, iv);
	cg_expr *p = lin(L, iv, is, ix->rank, NULL);
	int r = cgen_checked_index(L, in, ld(L, L->p->node_buf[n->args[1]], p), n->shape[0]);
	int j;
	in = loopv(L, in, &j, ic(L, 0), ic(L, row));
	cg_expr *di = add64(L, mul64(L, vr(L, r), row), vr(L, j));
	cg_expr *v = ld(L, src, add64(L, mul64(L, p, row), vr(L, j)));
	if (add)
		v = bin(L, CE_ADD, ld(L, dst, di), v);
	store(L, in, dst, di, v);
	if (dst != out)
		cgen_copy_flat(L, b, out, dst, ir_numel(n));
}

void cgen_lower_one_hot(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *ix = nd(L, n->args[0]);
	int iv[MOE_MAX_RANK], j;
	int64_t is[MOE_MAX_RANK], depth = n->shape[n->rank - 1];
	strides_of(ix, is);
	cg_block *in = loops(L, b, ix->shape, 0, ix->rank, iv);
	if (ix->rank > 0) /* rows of the output per iteration (the dispatch's [T K, E] one-hot) */
		par_if_big(b, ir_numel(n));
	cg_expr *p = lin(L, iv, is, ix->rank, NULL);
	int t = newvar(L, CT_I64);
	set(L, in, t, conv(L, ld(L, L->p->node_buf[n->args[0]], p), CT_I64));
	in = loopv(L, in, &j, ic(L, 0), ic(L, depth));
	store(L, in, out, add64(L, mul64(L, p, depth), vr(L, j)), bin(L, CE_EQ, vr(L, t), vr(L, j)));
}

bool cgen_lower_filter(lw *L, cg_block *b, const ir_node *n, int out)
{
	int64_t len = n->shape[n->rank - 1], rows = ir_numel(n) / len;
	cg_expr *fill = attr_const(L, n, "fill");
	if (!fill)
		return false;
	int r, j, j2, k = newvar(L, CT_I64);
	cg_block *in = loopv(L, b, &r, ic(L, 0), ic(L, rows));
	cg_expr *base = mul64(L, vr(L, r), len);
	set(L, in, k, ic(L, 0));
	cg_block *lj = loopv(L, in, &j, ic(L, 0), ic(L, len));
	cg_stmt *s = iff(L, lj, bin(L, CE_NE, ld(L, L->p->node_buf[n->args[0]], add64(L, base, vr(L, j))), ic32(L, 0)));
	store(L, &s->body, out, add64(L, base, vr(L, k)), ld(L, L->p->node_buf[n->args[1]], add64(L, base, vr(L, j))));
	set(L, &s->body, k, add64(L, vr(L, k), ic(L, 1)));
	cg_block *lf = loopv(L, in, &j2, vr(L, k), ic(L, len));
	store(L, lf, out, add64(L, base, vr(L, j2)), fill);
	return true;
}

/* ---------------- reductions ---------------- */

/* Open loops over every dim except `ax` of x; returns the base index (i64
 * expression of the outer/inner position) and the output index. */
/* The loops around axis ax of x (reduce, softmax); a result n with a scalar
 * valid mask (ax > 0: its rows are x's) runs the rows below the count only
 * and zeroes the others of out. */
static cg_block *around_axis_masked(lw *L, cg_block *b, const ir_node *x, int ax, cg_expr **xbase, cg_expr **obase,
	const ir_node *n, int out);

static cg_block *around_axis(lw *L, cg_block *b, const ir_node *x, int ax, cg_expr **xbase, cg_expr **obase)
{
	return around_axis_masked(L, b, x, ax, xbase, obase, NULL, -1);
}

static cg_block *around_axis_masked(lw *L, cg_block *b, const ir_node *x, int ax, cg_expr **xbase, cg_expr **obase,
	const ir_node *n, int out)
{
	int iv[MOE_MAX_RANK];
	int64_t xs[MOE_MAX_RANK], osk[MOE_MAX_RANK];
	strides_of(x, xs);
	/* output strides of the dims kept, in x's numbering (axis has stride 0) */
	int64_t k = 1;
	for (int d = x->rank - 1; d >= 0; d--) {
		osk[d] = d == ax ? 0 : k;
		if (d != ax)
			k *= x->shape[d];
	}
	bool outer = true;
	for (int d = 0; d < x->rank; d++) {
		if (d == ax) {
			iv[d] = -1;
			continue;
		}
		cg_expr *hi = ic(L, x->shape[d]);
		if (d == 0 && n && n->valid != MOE_NONE) {
			int cnt = newvar(L, CT_I64);
			int64_t row = ir_numel(n) / n->shape[0];
			set(L, b, cnt, clamp_count(L, ld(L, L->p->node_buf[n->valid], ic(L, 0)), n->shape[0]));
			zero_range(L, b, out, mul64(L, vr(L, cnt), row), ic(L, ir_numel(n)));
			hi = vr(L, cnt);
		}
		cg_block *in = loopv(L, b, &iv[d], ic(L, 0), hi);
		if (outer) /* each iteration reduces into its own outputs */
			par_if_big(b, ir_numel(x));
		outer = false;
		b = in;
	}
	*xbase = lin(L, iv, xs, x->rank, NULL);
	*obase = lin(L, iv, osk, x->rank, NULL);
	return b;
}

/* A reduction over an axis that is neither the first nor the last, kept in
 * its own type (f32, i32) and unmasked: each row of the output is reduced in
 * place, row after row of x (out[o, :] = x[o, 0, :], then out[o, :] op=
 * x[o, k, :] for k = 1, 2, ...). Every element takes its terms in the same
 * order as below, and the inner loops run along contiguous rows. */
bool cgen_reduce_rows_ok(lw *L, const ir_node *n)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank);
	return !(ax == 0 || ax == x->rank - 1 || n->valid != MOE_NONE || n->dtype != x->dtype ||
		 (x->dtype != MOE_F32 && x->dtype != MOE_I32));
}

/* element (o, k, j) of the reduction's operand: stored, or (an inlined
 * reshape [A, K, C] of an inlined [A K, C] node, lower.c mark_inline)
 * computed at row o * K + k, column j */
static cg_expr *row_elem(lw *L, cg_block *b, const ir_node *n, int o, cg_expr *k, int64_t len, int64_t inner, int j)
{
	moe_id r = n->args[0];
	if (!L->inl[r])
		return ld(L, L->p->node_buf[r], add64(L, add64(L, mul64(L, vr(L, o), len * inner), mul64(L, k, inner)), vr(L, j)));
	int iv[2] = {newvar(L, CT_I64), j};
	set(L, b, iv[0], add64(L, mul64(L, vr(L, o), len), k));
	return cgen_elem_operand(L, b, nd(L, r)->args[0], 2, iv);
}

static bool reduce_rows(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank);
	if (!cgen_reduce_rows_ok(L, n))
		return false;
	int64_t outer = 1, inner = 1, len = x->shape[ax];
	for (int d = 0; d < x->rank; d++) {
		if (d < ax)
			outer *= x->shape[d];
		else if (d > ax)
			inner *= x->shape[d];
	}
	int o, j, k, j2;
	cg_block *lo = loopv(L, b, &o, ic(L, 0), ic(L, outer));
	par_if_big(b, ir_numel(x)); /* each iteration reduces into its own outputs */
	cg_expr *ob = mul64(L, vr(L, o), inner);
	cg_block *l0 = loopv(L, lo, &j, ic(L, 0), ic(L, inner));
	store(L, l0, out, add64(L, ob, vr(L, j)), row_elem(L, l0, n, o, ic(L, 0), len, inner, j));
	cg_block *lk = loopv(L, lo, &k, ic(L, 1), ic(L, len));
	cg_block *lj = loopv(L, lk, &j2, ic(L, 0), ic(L, inner));
	cg_expr *oi = add64(L, ob, vr(L, j2));
	cg_expr *elt = row_elem(L, lj, n, o, vr(L, k), len, inner, j2);
	cg_expr *acc = ld(L, out, oi);
	store(L, lj, out, oi,
		n->op == MOE_OP_REDUCE_SUM ? bin(L, CE_ADD, acc, elt) : minmax(L, n->op == MOE_OP_REDUCE_MAX, acc, elt));
	return true;
}

void cgen_lower_reduce(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank), src = L->p->node_buf[n->args[0]];
	if (reduce_rows(L, b, n, out))
		return;
	int64_t xs[MOE_MAX_RANK];
	strides_of(x, xs);
	cg_expr *xb, *ob;
	cg_block *in = around_axis_masked(L, b, x, ax, &xb, &ob, n, out);
	cg_ty t = val_ty((moe_dtype)x->dtype);
	int acc = newvar(L, t), k;
	cg_expr *elt;
	/* acc = x[0], then x[1], x[2], ... in order */
	set(L, in, acc, ld(L, src, xb));
	cg_block *lk = loopv(L, in, &k, ic(L, 1), ic(L, x->shape[ax]));
	elt = ld(L, src, add64(L, xb, mul64(L, vr(L, k), xs[ax])));
	if (n->op == MOE_OP_REDUCE_SUM)
		set(L, lk, acc, bin(L, CE_ADD, vr(L, acc), elt));
	else
		set(L, lk, acc, minmax(L, n->op == MOE_OP_REDUCE_MAX, vr(L, acc), elt));
	store(L, in, out, ob, vr(L, acc));
}

void cgen_lower_softmax(lw *L, cg_block *b, const ir_node *n, int out)
{
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), n->rank), src = L->p->node_buf[n->args[0]];
	int64_t xs[MOE_MAX_RANK];
	strides_of(n, xs);
	cg_expr *xb, *ob;
	cg_block *in = around_axis_masked(L, b, n, ax, &xb, &ob, n, out);
	(void)ob;
	int m = newvar(L, CT_F32), s = newvar(L, CT_F32), k1, k2, k3;
	set(L, in, m, ld(L, src, xb));
	cg_block *l1 = loopv(L, in, &k1, ic(L, 1), ic(L, n->shape[ax]));
	set(L, l1, m, fminmax(L, true, vr(L, m), ld(L, src, add64(L, xb, mul64(L, vr(L, k1), xs[ax])))));
	/* sum starts at -0: -0 + e == e for every e, as "sum = first ? e : sum + e" */
	set(L, in, s, fc(L, -0.0f));
	cg_block *l2 = loopv(L, in, &k2, ic(L, 0), ic(L, n->shape[ax]));
	cg_expr *e2 = via_f64(L, CE_EXP, bin(L, CE_SUB, ld(L, src, add64(L, xb, mul64(L, vr(L, k2), xs[ax]))), vr(L, m)));
	set(L, l2, s, bin(L, CE_ADD, vr(L, s), e2));
	cg_block *l3 = loopv(L, in, &k3, ic(L, 0), ic(L, n->shape[ax]));
	cg_expr *i3 = add64(L, xb, mul64(L, vr(L, k3), xs[ax]));
	cg_expr *e3 = via_f64(L, CE_EXP, bin(L, CE_SUB, ld(L, src, i3), vr(L, m)));
	store(L, l3, out, i3, bin(L, CE_FDIV, e3, vr(L, s)));
}

void cgen_lower_cumsum(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), n->rank), src = L->p->node_buf[n->args[0]];
	bool excl = ir_attr_int(n, "exclusive", 0) != 0;
	int64_t xs[MOE_MAX_RANK];
	strides_of(n, xs);
	cg_expr *xb, *ob;
	cg_block *in = around_axis(L, b, x, ax, &xb, &ob);
	cg_ty t = val_ty((moe_dtype)n->dtype);
	int acc = newvar(L, t), k;
	set(L, in, acc, t == CT_F32 ? fc(L, 0.0f) : ic32(L, 0));
	cg_block *lk = loopv(L, in, &k, ic(L, 0), ic(L, n->shape[ax]));
	cg_expr *i = add64(L, xb, mul64(L, vr(L, k), xs[ax]));
	if (excl)
		store(L, lk, out, i, vr(L, acc));
	/* acc = k ? acc + x : x (the first partial sum is x itself, keeping -0) */
	cg_expr *x0 = ld(L, src, i);
	set(L, lk, acc, sel(L, bin(L, CE_EQ, vr(L, k), ic(L, 0)), x0, bin(L, CE_ADD, vr(L, acc), x0)));
	if (!excl)
		store(L, lk, out, i, vr(L, acc));
}
