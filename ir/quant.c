/* ir/quant.c: shape and type rule of `dequant` (formats in ir/quant.h).
 * Every mismatch between the packed values, the scales and the declared block
 * is reported naming the operands, so a checkpoint whose scale grid or packed
 * length disagrees with the weight's shape is rejected before anything runs. */
#include "ir/ir.h"
#include "ir/quant.h"

#define QERR(ctx, n, ...) (moe_diag((ctx), MOE_DIAG_ERROR, (n)->loc, __VA_ARGS__), MOE_ERR_INVALID)
/* in info(): report (when ctx is given) and fail */
#define FAIL(...)                                                            \
	do {                                                                  \
		if (ctx)                                                      \
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, __VA_ARGS__);   \
		return false;                                                 \
	} while (0)

/* The operand named for messages: a weight with its checkpoint tensor. */
#define nm(n) nm_((n), (char[512]){0})
static const char *nm_(const ir_node *n, char *buf)
{
	const char *src = n->op == MOE_OP_WEIGHT ? ir_attr_str(n, "source", NULL) : NULL;
	snprintf(buf, 512, "'%s'%s%s%s", n->name && *n->name ? n->name : ir_ops[n->op].name, src ? " (tensor '" : "",
		src ? src : "", src ? "')" : "");
	return buf;
}

static void shape_txt(const ir_node *n, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "%s[", moe_dtype_name((moe_dtype)n->dtype));
	for (int i = 0; i < n->rank && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)n->shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

/* gptq: q i32 [.., K/8, N], s float [.., NG, N], z i32 [.., NG, ceil(N/8)],
 * g i32 [.., K]; awq: q i32 [.., K, N/8], s and z as gptq's (N a multiple of 8),
 * no g. Both: block [1, G] with NG = ceil(K/G) (ir/quant.h). */
static bool zp4_info(moe_ctx *ctx, const moe_graph *g, const ir_node *n, qt_info *qi, int fmt)
{
	const bool gptq = fmt == QT_GPTQ;
	const char *f = gptq ? "gptq" : "awq";
	const ir_node *q = N(g, n->args[0]), *s = N(g, n->args[1]), *z = N(g, n->args[2]);
	const ir_node *gi = gptq ? N(g, n->args[3]) : NULL;
	if (q->dtype != MOE_I32 || z->dtype != MOE_I32 || (gi && gi->dtype != MOE_I32)) {
		if (gi)
			FAIL("'dequant': gptq values %s, zero points %s and g_idx %s must be i32, got %s, %s, %s", nm(q),
				nm(z), nm(gi), moe_dtype_name((moe_dtype)q->dtype), moe_dtype_name((moe_dtype)z->dtype),
				moe_dtype_name((moe_dtype)gi->dtype));
		FAIL("'dequant': awq values %s and zero points %s must be i32, got %s, %s", nm(q), nm(z),
			moe_dtype_name((moe_dtype)q->dtype), moe_dtype_name((moe_dtype)z->dtype));
	}
	if (!moe_dtype_is_float((moe_dtype)s->dtype))
		FAIL("'dequant': %s scales %s must be f32 or bf16, got %s", f, nm(s), moe_dtype_name((moe_dtype)s->dtype));
	int r = q->rank;
	if (r < 2 || s->rank != r || z->rank != r || (gi && gi->rank != r - 1)) {
		if (gi)
			FAIL("'dequant': gptq values %s (rank %d) need scales %s and zero points %s of the same rank and "
			     "g_idx %s one lower (%d, %d, %d)", nm(q), r, nm(s), nm(z), nm(gi), s->rank, z->rank, gi->rank);
		FAIL("'dequant': awq values %s, scales %s and zero points %s must have one rank >= 2 (%d, %d, %d)", nm(q),
			nm(s), nm(z), r, s->rank, z->rank);
	}
	for (int d = 0; d < r - 2; d++)
		if (s->shape[d] != q->shape[d] || z->shape[d] != q->shape[d] || (gi && gi->shape[d] != q->shape[d])) {
			if (gi)
				FAIL("'dequant': gptq operands %s, %s, %s, %s differ in dim %d", nm(q), nm(s), nm(z),
					nm(gi), d);
			FAIL("'dequant': awq operands %s, %s, %s differ in dim %d", nm(q), nm(s), nm(z), d);
		}
	const int64_t *b;
	if (ir_attr_ints(n, "block", &b) != 2 || b[0] != 1 || b[1] <= 0)
		FAIL("'dequant': %s needs block [1, group_size]", f);
	int64_t zp = ir_attr_int(n, "zp", 1);
	if (gptq && zp != 0 && zp != 1)
		FAIL("'dequant': gptq zp must be 0 (gptq_v2) or 1 (GPTQ v1), got %lld", (long long)zp);
	qi->fmt = (qt_format)fmt;
	qi->bn = 1;
	qi->bk = b[1];
	qi->N = gptq ? q->shape[r - 1] : q->shape[r - 1] * 8;
	qi->K = gptq ? q->shape[r - 2] * 8 : q->shape[r - 2];
	int64_t ng = (qi->K + qi->bk - 1) / qi->bk;
	char have[128];
	if (ctx)
		shape_txt(s, have, sizeof have);
	if (s->shape[r - 2] != ng || s->shape[r - 1] != qi->N)
		FAIL("'dequant': %s scales %s are %s; K = %lld in groups of %lld and N = %lld need [%lld, %lld]", f, nm(s),
			have, (long long)qi->K, (long long)qi->bk, (long long)qi->N, (long long)ng, (long long)qi->N);
	if (ctx)
		shape_txt(z, have, sizeof have);
	if (z->shape[r - 2] != ng || z->shape[r - 1] != (qi->N + 7) / 8)
		FAIL("'dequant': %s zero points %s are %s; %lld groups of N = %lld packed 8 per word need [%lld, %lld]",
			f, nm(z), have, (long long)ng, (long long)qi->N, (long long)ng, (long long)(qi->N + 7) / 8);
	if (gi && gi->shape[r - 2] != qi->K)
		FAIL("'dequant': gptq g_idx %s has %lld entries; the values %s hold K = %lld input channels", nm(gi),
			(long long)gi->shape[r - 2], nm(q), (long long)qi->K);
	if (!strcmp(ir_attr_str(n, "act", "bf16"), "fp8"))
		FAIL("'dequant': act=\"fp8\" (fp8 activations on TCP) applies to fp8 weights, not %s", f);
	return true;
}

/* nvfp4: q u8 [.., N, K/2], s f8e4m3 [.., N, K/16], g f32 [.., 1], block
 * [1, 16] (ir/quant.h). */
static bool nvfp4_info(moe_ctx *ctx, const moe_graph *g, const ir_node *n, qt_info *qi)
{
	const ir_node *q = N(g, n->args[0]), *s = N(g, n->args[1]), *gs = N(g, n->args[2]);
	if (q->dtype != MOE_U8 || s->dtype != MOE_F8E4M3 || gs->dtype != MOE_F32)
		FAIL("'dequant': nvfp4 values %s, scales %s and global scale %s must be u8, f8e4m3 and f32, got %s, %s, %s",
			nm(q), nm(s), nm(gs), moe_dtype_name((moe_dtype)q->dtype), moe_dtype_name((moe_dtype)s->dtype),
			moe_dtype_name((moe_dtype)gs->dtype));
	int r = q->rank;
	if (r < 2 || s->rank != r || gs->rank != r - 1)
		FAIL("'dequant': nvfp4 values %s (rank %d) need scales %s of the same rank and a global scale %s one lower "
		     "(%d, %d)", nm(q), r, nm(s), nm(gs), s->rank, gs->rank);
	for (int d = 0; d < r - 2; d++)
		if (s->shape[d] != q->shape[d] || gs->shape[d] != q->shape[d])
			FAIL("'dequant': nvfp4 operands %s, %s, %s differ in dim %d", nm(q), nm(s), nm(gs), d);
	if (gs->shape[r - 2] != 1)
		FAIL("'dequant': nvfp4 global scale %s must hold one value per matrix (last dim 1), got %lld", nm(gs),
			(long long)gs->shape[r - 2]);
	const int64_t *b;
	int nb = ir_attr_ints(n, "block", &b);
	if (nb >= 0 && (nb != 2 || b[0] != 1 || b[1] != 16))
		FAIL("'dequant': nvfp4 blocks are [1, 16]");
	qi->fmt = QT_NVFP4;
	qi->bn = 1;
	qi->bk = 16;
	qi->N = q->shape[r - 2];
	qi->K = q->shape[r - 1] * 2;
	if (qi->K % 16)
		FAIL("'dequant': nvfp4 values %s hold K = %lld per row, not a multiple of the 16-element block", nm(q),
			(long long)qi->K);
	if (s->shape[r - 2] != qi->N || s->shape[r - 1] != qi->K / 16) {
		char have[128];
		if (ctx)
			shape_txt(s, have, sizeof have);
		FAIL("'dequant': nvfp4 scales %s are %s; N = %lld rows of K = %lld in blocks of 16 need [%lld, %lld]", nm(s),
			have, (long long)qi->N, (long long)qi->K, (long long)qi->N, (long long)qi->K / 16);
	}
	if (strcmp(ir_attr_str(n, "act", "bf16"), "bf16"))
		FAIL("'dequant': act=\"%s\" does not apply to nvfp4 (its weights are dequantized, activations kept)",
			ir_attr_str(n, "act", "bf16"));
	return true;
}

/* Format, block and result dims of n from its attributes and operands;
 * false with a diagnostic (ctx non-NULL) when they do not fit together. */
static bool info(moe_ctx *ctx, const moe_graph *g, const ir_node *n, qt_info *qi)
{
	const ir_node *q = N(g, n->args[0]), *s = N(g, n->args[1]);
	const char *f = ir_attr_str(n, "format", NULL);
	int fmt = qt_format_from_name(f);
	if (fmt < 0)
		FAIL("'dequant': unknown format '%s' (fp8, mxfp4, int4, gptq, awq, nvfp4, int8)", f ? f : "(none)");
	uint32_t want = fmt == QT_GPTQ ? 4 : fmt == QT_AWQ || fmt == QT_NVFP4 ? 3 : 2;
	if (n->nargs != want)
		FAIL("'dequant': format %s takes %s operands, got %u", f,
			want == 4 ? "four (q, s, z, g)" : fmt == QT_NVFP4 ? "three (q, s, g)" : want == 3 ? "three (q, s, z)"
			: "two (q, s)", n->nargs);
	if (fmt != QT_INT8 && !strcmp(ir_attr_str(n, "act", "bf16"), "int8"))
		FAIL("'dequant': act=\"int8\" (W8A8: int8 activations) applies to int8 weights, not %s", f);
	if (fmt == QT_GPTQ || fmt == QT_AWQ)
		return zp4_info(ctx, g, n, qi, fmt);
	if (fmt == QT_NVFP4)
		return nvfp4_info(ctx, g, n, qi);
	static const moe_dtype qdt[QT_NFORMATS] = {MOE_F8E4M3, MOE_U8, MOE_I32, MOE_I32, MOE_I32, MOE_U8, MOE_U8};
	if (q->dtype != qdt[fmt])
		FAIL("'dequant': %s values %s must be %s, got %s", f, nm(q),
			moe_dtype_name(qdt[fmt]), moe_dtype_name((moe_dtype)q->dtype));
	bool sok = fmt == QT_MXFP4 ? s->dtype == MOE_U8 : moe_dtype_is_float((moe_dtype)s->dtype);
	if (!sok)
		FAIL("'dequant': %s scales %s must be %s, got %s", f, nm(s),
			fmt == QT_MXFP4 ? "u8 (E8M0)" : "f32 or bf16", moe_dtype_name((moe_dtype)s->dtype));
	if (q->rank < 2 || s->rank != q->rank)
		FAIL("'dequant': values %s must have rank >= 2 and scales %s the same rank (%d, %d)",
			nm(q), nm(s), q->rank, s->rank);
	for (int d = 0; d < q->rank - 2; d++)
		if (q->shape[d] != s->shape[d])
			FAIL("'dequant': values %s and scales %s differ in dim %d (%lld, %lld)", nm(q),
					      nm(s), d, (long long)q->shape[d], (long long)s->shape[d]);
	int64_t packed = q->shape[q->rank - 1];
	qi->fmt = (qt_format)fmt;
	qi->N = q->shape[q->rank - 2];
	qi->K = packed * qt_pack(qi->fmt);
	if (fmt == QT_INT4 && ir_attr_find(n, "k")) {
		qi->K = ir_attr_int(n, "k", 0);
		if (qi->K <= 0 || (qi->K + 7) / 8 != packed)
			FAIL("'dequant': int4 values %s pack %lld words per row, which cannot hold k = %lld",
					      nm(q), (long long)packed, (long long)qi->K);
	}
	const int64_t *b;
	int nb = ir_attr_ints(n, "block", &b);
	if (nb < 0 && fmt == QT_MXFP4) {
		qi->bn = 1;
		qi->bk = 32;
	} else if (nb != 2 || b[0] <= 0 || b[1] <= 0) {
		FAIL("'dequant': block must be two positive sizes [rows, cols]");
	} else {
		qi->bn = b[0];
		qi->bk = b[1];
	}
	if (fmt != QT_FP8 && qi->bn != 1)
		FAIL("'dequant': %s scales are per row: block must be [1, group], got [%lld, %lld]", f,
			(long long)qi->bn, (long long)qi->bk);
	if (fmt != QT_FP8 && !strcmp(ir_attr_str(n, "act", "bf16"), "fp8"))
		FAIL("'dequant': act=\"fp8\" (fp8 activations on TCP) applies to fp8 weights, not %s", f);
	if (fmt == QT_MXFP4 && qi->bk != 32)
		FAIL("'dequant': mxfp4 blocks are 32 elements, got %lld", (long long)qi->bk);
	if (fmt != QT_FP8 && qi->K % qi->bk)
		FAIL("'dequant': the group size %lld does not divide K = %lld of %s",
			(long long)qi->bk, (long long)qi->K, nm(q));
	int64_t sn = (qi->N + qi->bn - 1) / qi->bn, sk = (qi->K + qi->bk - 1) / qi->bk;
	if (s->shape[s->rank - 2] != sn || s->shape[s->rank - 1] != sk) {
		char have[128];
		if (ctx)
			shape_txt(s, have, sizeof have);
		FAIL("'dequant': scales %s are %s but %lld x %lld elements in blocks of %lld x %lld "
			"need %lld x %lld scales per matrix", nm(s), have, (long long)qi->N, (long long)qi->K,
			(long long)qi->bn, (long long)qi->bk, (long long)sn, (long long)sk);
	}
	return true;
}

moe_status ir_infer_dequant(moe_ctx *ctx, moe_graph *g, moe_id id)
{
	ir_node *n = N(g, id);
	qt_info qi;
	if (!info(ctx, g, n, &qi))
		return MOE_ERR_INVALID;
	const char *to = ir_attr_str(n, "to", "f32");
	int t = moe_dtype_from_name(to);
	if (t != MOE_F32 && t != MOE_BF16)
		return QERR(ctx, n, "'dequant': result type must be f32 or bf16, got '%s'", to);
	const ir_node *q = N(g, n->args[0]);
	n->dtype = (uint8_t)t;
	n->rank = q->rank;
	for (int d = 0; d < q->rank - 2; d++)
		n->shape[d] = q->shape[d];
	n->shape[q->rank - 2] = qi.N;
	n->shape[q->rank - 1] = qi.K;
	return MOE_OK;
}

bool ir_dequant_info(const moe_graph *g, const ir_node *n, qt_info *qi)
{
	return info(NULL, g, n, qi);
}
