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

/* Format, block and result dims of n from its attributes and operands;
 * false with a diagnostic (ctx non-NULL) when they do not fit together. */
static bool info(moe_ctx *ctx, const moe_graph *g, const ir_node *n, qt_info *qi)
{
	const ir_node *q = N(g, n->args[0]), *s = N(g, n->args[1]);
	const char *f = ir_attr_str(n, "format", NULL);
	int fmt = qt_format_from_name(f);
	if (fmt < 0)
		FAIL("'dequant': unknown format '%s' (fp8, mxfp4, int4)", f ? f : "(none)");
	static const moe_dtype qdt[QT_NFORMATS] = {MOE_F8E4M3, MOE_U8, MOE_I32};
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
