/* runtime/quant_import.c: quantization_config -> quantized weights in .moe text.
 *
 * Read (facts from the public formats, ir/quant.h):
 *   quant_method "fp8" with weight_block_size [BN, BK]   block FP8: `W.weight` F8_E4M3,
 *       `W.weight_scale_inv` [ceil(N/BN), ceil(K/BK)]; modules_to_not_convert /
 *       ignored_layers stay unquantized;
 *   quant_method "fbgemm_fp8"                             per-channel FP8: `W.weight`,
 *       `W.weight_scale` [N, 1]; modules_to_not_convert;
 *   quant_method "compressed-tensors", format "pack-quantized" (4-bit int, symmetric,
 *       group strategy): `W.weight_packed` I32 [N, ceil(K/8)], `W.weight_scale`
 *       [N, K/G]; format "float-quantized" (8-bit float, channel strategy):
 *       `W.weight`, `W.weight_scale` [N, 1]; format "int-quantized" (W8A8: 8-bit int
 *       channel weights, dynamic per-token int8 activations): `W.weight` I8 [N, K],
 *       `W.weight_scale` [N, 1]; format "nvfp4-pack-quantized": `W.weight_packed` U8
 *       [N, K/2], `W.weight_scale` F8_E4M3 [N, K/16], `W.weight_global_scale` F32 [1];
 *       `ignore` lists modules kept as they are;
 *   quant_method "modelopt", quant_algo "NVFP4": `W.weight` U8 [N, K/2],
 *       `W.weight_scale` F8_E4M3 [N, K/16], `W.weight_scale_2` F32; exclude_modules;
 *   quant_method "gptq", "awq": below.
 * Every `weight` line of the imported text whose tensor is a Linear `.weight`
 * (not the router's, not an ignored module) is replaced by NAME_q and NAME_s
 * declarations and `NAME = dequant(NAME_q, NAME_s, ...)` after the weights.
 * MXFP4 (gpt-oss) stores its experts in another layout and is refused here. */
#include <stdlib.h>

#include "runtime/rt_io.h"
#include "runtime/rt_quant.h"
#include "runtime/rt_re.h"

typedef struct qcfg {
	const char *fmt;       /* dequant format */
	const char *qtype;     /* declared type of the packed values */
	const char *qsuffix;   /* tensor name suffixes replacing ".weight" */
	const char *ssuffix;
	int64_t bn, bk;        /* block; bk 0 = the whole row (per channel) */
	const cJSON *ignore;   /* array of module names / patterns, or NULL */
	int fused;             /* fused [E, K, N] experts tensors: 1 fbgemm_fp8, 2 mxfp4 */
	const char *ignore_key; /* its key in quantization_config */
	bool ct;               /* compressed-tensors' matching rule, else transformers' */
	long budget;           /* matching steps left (rt_re.h) */
	char layer[24];        /* the text's `param layer`, "" when it has none */
	int zp;                /* gptq: added to each stored zero point (1 for v1, 0 for gptq_v2) */
	const char *gsuffix;   /* nvfp4: the global scale's suffix */
	const char *gscale;    /* nvfp4: "div" (compressed-tensors) or "mul" (ModelOpt) */
} qcfg;

/* Sanitised head of a pattern for a message: printable ASCII, at most 60 bytes. */
static void shown(const char *p, char *out, size_t n)
{
	size_t k = 0, len = strlen(p);
	for (; k + 4 < n && k < 60 && p[k]; k++)
		out[k] = p[k] >= 32 && p[k] < 127 ? p[k] : '?';
	snprintf(out + k, n - k, "%s", len > k ? "..." : "");
}

/* The module a tensor name's first len bytes name: {layer} as the imported
 * layer, {e} as expert 0 (one decision covers every expert). */
static void module_of(const qcfg *q, const char *src, size_t len, char *out, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < len && k + 1 < n;) {
		if (!strncmp(src + i, "{layer}", 7) && q->layer[0]) {
			k += (size_t)snprintf(out + k, n - k, "%s", q->layer);
			i += 7;
		} else if (!strncmp(src + i, "{e}", 3)) {
			out[k++] = '0';
			i += 3;
		} else {
			out[k++] = src[i++];
		}
	}
	out[k < n ? k : n - 1] = 0;
}

/* Is module left unquantized?
 * 1 yes, 0 no, -1 an error (reported). The configuration's rule: transformers'
 * for modules_to_not_convert / ignored_layers, compressed-tensors' for ignore. */
static int ignored(moe_ctx *ctx, const char *file, qcfg *q, const char *module)
{
	const cJSON *it;
	int i = 0;
	cJSON_ArrayForEach(it, q->ignore)
	{
		char err[200], pat[80];
		const char *p = it->valuestring;
		int m = q->ct ? rt_sel_ct(p, module, &q->budget, err, sizeof err)
			      : rt_sel_hf(p, module, &q->budget, err, sizeof err);
		if (m < 0) {
			shown(p, pat, sizeof pat);
			rt_err_at(ctx, file, -1, "quantization_config.%s[%d]: pattern '%s': %s", q->ignore_key, i, pat, err);
			return -1;
		}
		if (m)
			return 1;
		i++;
	}
	return 0;
}

/* The module list under key: absent, or an array of strings; every entry is
 * compiled against the root module "" (as the frameworks do for a model's
 * first module), so a bad pattern is an error whatever the layer. */
static moe_status read_ignore(moe_ctx *ctx, const char *file, const cJSON *qc, const char *key, qcfg *q)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(qc, key), *it;
	q->ignore = NULL;
	q->ignore_key = key;
	if (!v || cJSON_IsNull(v))
		return MOE_OK;
	int i = 0;
	if (!cJSON_IsArray(v)) {
		rt_err_at(ctx, file, -1, "quantization_config.%s: not a list of module names", key);
		return MOE_ERR_INVALID;
	}
	cJSON_ArrayForEach(it, v)
	{
		if (!cJSON_IsString(it)) {
			rt_err_at(ctx, file, -1, "quantization_config.%s[%d]: not a string", key, i);
			return MOE_ERR_INVALID;
		}
		i++;
	}
	q->ignore = v;
	return ignored(ctx, file, q, "") < 0 ? MOE_ERR_INVALID : MOE_OK;
}

static const cJSON *member(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Every quant_method read_cfg accepts. */
#define SUPPORTED_METHODS "fp8, fbgemm_fp8, compressed-tensors, mxfp4, gptq, awq, modelopt"

/* A block or group size: a JSON integer in 1..2^20 (128.9 is not one). */
static bool size_ok(const cJSON *v)
{
	return cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1 << 20 &&
	       v->valuedouble == (double)(int64_t)v->valuedouble;
}

static moe_status bad(moe_ctx *ctx, const char *file, const char *msg)
{
	rt_err_at(ctx, file, -1, "quantization_config: %s", msg);
	return MOE_ERR_INVALID;
}

/* compressed-tensors: the one weight scheme of config_groups. */
static moe_status read_ct(moe_ctx *ctx, const char *file, const cJSON *qc, qcfg *q)
{
	const cJSON *fmt = member(qc, "format"), *groups = member(qc, "config_groups"), *g, *w = NULL;
	cJSON_ArrayForEach(g, groups)
	{
		if (w)
			return bad(ctx, file, "compressed-tensors with several config_groups is not supported");
		w = member(g, "weights");
	}
	if (!cJSON_IsString(fmt) || !w)
		return bad(ctx, file, "compressed-tensors needs a format and config_groups with weights");
	const cJSON *bits = member(w, "num_bits"), *type = member(w, "type"), *sym = member(w, "symmetric");
	const cJSON *strat = member(w, "strategy"), *gs = member(w, "group_size");
	const char *ty = cJSON_IsString(type) ? type->valuestring : "", *st = cJSON_IsString(strat) ? strat->valuestring : "";
	if (!strcmp(fmt->valuestring, "pack-quantized")) {
		if (!cJSON_IsNumber(bits) || bits->valuedouble != 4 || strcmp(ty, "int"))
			return bad(ctx, file, "pack-quantized is read for 4-bit int weights only");
		if (!cJSON_IsTrue(sym))
			return bad(ctx, file, "asymmetric int4 (weight_zero_point) is not supported");
		if (strcmp(st, "group") || !cJSON_IsNumber(gs))
			return bad(ctx, file, "pack-quantized int4 needs the group strategy and a group_size");
		if (!size_ok(gs))
			return bad(ctx, file, "group_size must be an integer in 1..1048576");
		*q = (qcfg){"int4", "i32", ".weight_packed", ".weight_scale", 1, (int64_t)gs->valuedouble, NULL, 0, "ignore", true, 0, "", 0, NULL, NULL};
		return MOE_OK;
	}
	if (!strcmp(fmt->valuestring, "float-quantized")) {
		if (!cJSON_IsNumber(bits) || bits->valuedouble != 8 || strcmp(ty, "float") || strcmp(st, "channel"))
			return bad(ctx, file, "float-quantized is read for 8-bit float weights with one scale per channel only");
		*q = (qcfg){"fp8", "f8e4m3", ".weight", ".weight_scale", 1, 0, NULL, 0, "ignore", true, 0, "", 0, NULL, NULL};
		return MOE_OK;
	}
	if (!strcmp(fmt->valuestring, "int-quantized")) { /* W8A8: int8 weights, dynamic per-token int8 activations */
		const cJSON *a = NULL;
		cJSON_ArrayForEach(g, groups)
		a = member(g, "input_activations");
		const cJSON *ab = member(a, "num_bits"), *at = member(a, "type"), *ad = member(a, "dynamic");
		const cJSON *as = member(a, "strategy"), *asym = member(a, "symmetric");
		if (!cJSON_IsNumber(bits) || bits->valuedouble != 8 || strcmp(ty, "int") || strcmp(st, "channel") ||
			!cJSON_IsTrue(sym))
			return bad(ctx, file, "int-quantized is read for 8-bit int weights, symmetric, strategy channel only");
		if (!cJSON_IsNumber(ab) || ab->valuedouble != 8 || !cJSON_IsString(at) || strcmp(at->valuestring, "int") ||
			!cJSON_IsTrue(ad) || !cJSON_IsString(as) || strcmp(as->valuestring, "token") || (asym && !cJSON_IsTrue(asym)))
			return bad(ctx, file, "int-quantized is read with input_activations of 8-bit int, dynamic, symmetric, "
					      "strategy token only (W8A8)");
		*q = (qcfg){"int8", "u8", ".weight", ".weight_scale", 1, 0, NULL, 0, "ignore", true, 0, "", 0, NULL, NULL};
		return MOE_OK;
	}
	if (!strcmp(fmt->valuestring, "nvfp4-pack-quantized")) {
		if (!cJSON_IsNumber(bits) || bits->valuedouble != 4 || strcmp(ty, "float") || strcmp(st, "tensor_group") ||
			!cJSON_IsNumber(gs) || gs->valuedouble != 16)
			return bad(ctx, file, "nvfp4-pack-quantized is read for 4-bit float weights, strategy tensor_group, "
					      "group_size 16 only");
		*q = (qcfg){"nvfp4", "u8", ".weight_packed", ".weight_scale", 1, 16, NULL, 0, "ignore", true, 0, "", 0,
			".weight_global_scale", "div"};
		return MOE_OK;
	}
	return bad(ctx, file, "compressed-tensors format is not pack-quantized, float-quantized, int-quantized or "
			      "nvfp4-pack-quantized");
}

/* gptq (GPTQ v1 as AutoGPTQ and transformers write it, or GPTQModel's gptq_v2):
 * `W.qweight` I32 [K/8, N], `W.scales` F16 [NG, N], `W.qzeros` I32 [NG, N/8],
 * `W.g_idx` I32 [K]; 4-bit only; group_size -1 is one group per row. */
static moe_status read_gptq(moe_ctx *ctx, const char *file, const cJSON *qc, qcfg *q)
{
	const cJSON *bits = member(qc, "bits"), *gs = member(qc, "group_size"), *cf = member(qc, "checkpoint_format");
	if (!cJSON_IsNumber(bits) || bits->valuedouble != 4)
		return bad(ctx, file, "gptq is read for bits 4 only");
	if (!gs || !(size_ok(gs) || (cJSON_IsNumber(gs) && gs->valuedouble == -1)))
		return bad(ctx, file, "gptq needs group_size, an integer in 1..1048576 or -1 (one group per row)");
	int zp = 1;
	if (cf && (!cJSON_IsString(cf) || (strcmp(cf->valuestring, "gptq") && strcmp(cf->valuestring, "gptq_v2"))))
		return bad(ctx, file, "gptq checkpoint_format must be \"gptq\" or \"gptq_v2\"");
	if (cf && !strcmp(cf->valuestring, "gptq_v2"))
		zp = 0;
	*q = (qcfg){"gptq", "i32", ".qweight", ".scales", 1, gs->valuedouble < 0 ? 0 : (int64_t)gs->valuedouble, NULL,
		0, "modules_to_not_convert", false, 0, "", zp, NULL, NULL};
	return MOE_OK;
}

/* awq, version gemm (AutoAWQ): `W.qweight` I32 [K, N/8], `W.qzeros` I32
 * [NG, N/8] (both packed along N in the order 0,2,4,6,1,3,5,7), `W.scales`
 * F16 [NG, N]; 4-bit with zero points only. */
static moe_status read_awq(moe_ctx *ctx, const char *file, const cJSON *qc, qcfg *q)
{
	const cJSON *bits = member(qc, "bits"), *gs = member(qc, "group_size"), *ver = member(qc, "version");
	const cJSON *zp = member(qc, "zero_point");
	if (!cJSON_IsNumber(bits) || bits->valuedouble != 4)
		return bad(ctx, file, "awq is read for bits 4 only");
	if (!size_ok(gs))
		return bad(ctx, file, "awq needs group_size, an integer in 1..1048576");
	if (ver && (!cJSON_IsString(ver) || (strcmp(ver->valuestring, "gemm") && strcmp(ver->valuestring, "GEMM"))))
		return bad(ctx, file, "awq is read for version gemm only (the GEMM packing order)");
	if (zp && !cJSON_IsTrue(zp))
		return bad(ctx, file, "awq without zero points (zero_point false) is not supported");
	*q = (qcfg){"awq", "i32", ".qweight", ".scales", 1, (int64_t)gs->valuedouble, NULL, 0, "modules_to_not_convert",
		false, 0, "", 0, NULL, NULL};
	return MOE_OK;
}

static moe_status read_cfg(moe_ctx *ctx, const char *file, const cJSON *qc, qcfg *q)
{
	const cJSON *m = member(qc, "quant_method");
	if (!cJSON_IsString(m)) {
		rt_err_at(ctx, file, -1, "quantization_config: quant_method %s; it names the format, one of: " SUPPORTED_METHODS,
			m ? "must be a string" : "is missing");
		return MOE_ERR_INVALID;
	}
	const char *meth = m->valuestring;
	if (!strcmp(meth, "fp8")) {
		const cJSON *bs = member(qc, "weight_block_size");
		if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !size_ok(bs->child) || !size_ok(bs->child->next))
			return bad(ctx, file, "fp8 needs weight_block_size [rows, cols] of integers in 1..1048576");
		*q = (qcfg){"fp8", "f8e4m3", ".weight", ".weight_scale_inv", (int64_t)bs->child->valuedouble,
			(int64_t)bs->child->next->valuedouble, NULL, 0,
			member(qc, "modules_to_not_convert") ? "modules_to_not_convert" : "ignored_layers", false, 0, "", 0, NULL, NULL};
		return MOE_OK;
	}
	if (!strcmp(meth, "fbgemm_fp8")) {
		*q = (qcfg){"fp8", "f8e4m3", ".weight", ".weight_scale", 1, 0, NULL, 1, "modules_to_not_convert", false, 0, "", 0, NULL, NULL};
		return MOE_OK;
	}
	if (!strcmp(meth, "compressed-tensors"))
		return read_ct(ctx, file, qc, q);
	if (!strcmp(meth, "gptq"))
		return read_gptq(ctx, file, qc, q);
	if (!strcmp(meth, "awq"))
		return read_awq(ctx, file, qc, q);
	if (!strcmp(meth, "modelopt")) { /* ModelOpt's quant_algo NVFP4: `W.weight` U8, `W.weight_scale`, `W.weight_scale_2` */
		const cJSON *al = member(qc, "quant_algo"), *gs = member(qc, "group_size");
		if (!cJSON_IsString(al) || strcmp(al->valuestring, "NVFP4"))
			return bad(ctx, file, "modelopt is read for quant_algo \"NVFP4\" only");
		if (gs && (!cJSON_IsNumber(gs) || gs->valuedouble != 16))
			return bad(ctx, file, "modelopt NVFP4 is read for group_size 16 only");
		*q = (qcfg){"nvfp4", "u8", ".weight", ".weight_scale", 1, 16, NULL, 0, "exclude_modules", false, 0, "", 0,
			".weight_scale_2", "mul"};
		return MOE_OK;
	}
	if (!strcmp(meth, "mxfp4")) {
		*q = (qcfg){"mxfp4", "u8", "_blocks", "_scales", 1, 32, NULL, 2, NULL, false, 0, "", 0, NULL, NULL};
		return MOE_OK;
	}
	rt_err_at(ctx, file, -1, "quantization_config: quant_method '%s' is not supported (" SUPPORTED_METHODS ")",
		meth);
	return MOE_ERR_INVALID;
}

/* One parsed `  weight NAME : TYPE[DIMS] = "SRC"` line. */
typedef struct wline {
	char name[64], type[16], dims[160], src[400];
} wline;

static bool parse_weight(const char *l, size_t len, wline *w)
{
	char buf[700];
	if (len >= sizeof buf || strncmp(l, "  weight ", 9))
		return false;
	memcpy(buf, l, len);
	buf[len] = 0;
	return sscanf(buf, "  weight %63s : %15[a-z0-9][%159[^]]] = \"%399[^\"]\"", w->name, w->type, w->dims, w->src) == 4 ||
	       (w->type[0] = 0, sscanf(buf, "  weight %63s : [%159[^]]] = \"%399[^\"]\"", w->name, w->dims, w->src) == 3);
}

static bool ends_with(const char *s, const char *tail)
{
	size_t a = strlen(s), b = strlen(tail);
	return a >= b && !strcmp(s + a - b, tail);
}

/* Fused experts tensors [E, K, N] (llama4, gpt_oss): fbgemm_fp8 keeps that
 * layout with one scale per n ([E, 1, N], or [E, N, 1] for down_proj);
 * mxfp4 stores [E, N, K/32, 16] blocks and [E, N, K/32] scales, transposed back. */
static bool quantize_fused(const qcfg *q, const wline *w, rt_buf *decl, rt_buf *bind)
{
	if (!ends_with(w->src, "experts.gate_up_proj") && !ends_with(w->src, "experts.down_proj"))
		return false;
	char e[64], k[64], n[64];
	if (sscanf(w->dims, " %63[^,], %63[^,], %63[^,]", e, k, n) != 3)
		return false;
	const char *to = w->type[0] ? w->type : "dtype";
	if (q->fused == 1) {
		rt_buf_printf(decl, "  weight %s_q : f8e4m3[%s] = \"%s\"\n", w->name, w->dims, w->src);
		rt_buf_printf(decl, "  weight %s_s : f32[%s, 1, %s] = \"%s_scale\"\n", w->name, e, n, w->src);
		rt_buf_printf(bind, "  %-6s = dequant(%s_q, %s_s, format=\"fp8\", block=[%s, 1], to=%s)\n", w->name, w->name,
			w->name, k, to);
		return true;
	}
	rt_buf_printf(decl, "  weight %s_q : u8[%s, %s, %s / 32, 16] = \"%s_blocks\"\n", w->name, e, n, k, w->src);
	rt_buf_printf(decl, "  weight %s_s : u8[%s, %s, %s / 32] = \"%s_scales\"\n", w->name, e, n, k, w->src);
	rt_buf_printf(bind, "  %-6s = einsum(\"enk->ekn\", dequant(reshape(%s_q, shape=[%s, %s, %s / 2]), %s_s, "
		"format=\"mxfp4\", block=[1, 32], to=%s))\n", w->name, w->name, e, n, k, w->name, to);
	return true;
}

/* gptq (awq): packed values, scales, zero points (and g_idx) of w, whose Linear weight
 * is [pre N, K]; the result dequantizes each product in f16 (ir/quant.h). */
static int quantize_gptq(const qcfg *q, const wline *w, const char *pre, const char *nn, const char *kk, int bl,
	rt_buf *decl, rt_buf *bind)
{
	char g[96], ng[160];
	if (q->bk)
		snprintf(g, sizeof g, "%lld", (long long)q->bk);
	else
		snprintf(g, sizeof g, "%s", kk);
	if (q->bk)
		snprintf(ng, sizeof ng, "(%s + %lld) / %lld", kk, (long long)q->bk - 1, (long long)q->bk);
	else
		snprintf(ng, sizeof ng, "1");
	if (!strcmp(q->fmt, "awq")) {
		rt_buf_printf(decl, "  weight %s_q : i32[%s%s, %s / 8] = \"%.*s.qweight\"\n", w->name, pre, kk, nn, bl, w->src);
		rt_buf_printf(decl, "  weight %s_s : f32[%s%s, %s] = \"%.*s.scales\"\n", w->name, pre, ng, nn, bl, w->src);
		rt_buf_printf(decl, "  weight %s_z : i32[%s%s, %s / 8] = \"%.*s.qzeros\"\n", w->name, pre, ng, nn, bl,
			w->src);
		rt_buf_printf(bind, "  %-6s = dequant(%s_q, %s_s, %s_z, format=\"awq\", block=[1, %s], to=%s)\n", w->name,
			w->name, w->name, w->name, g, w->type[0] ? w->type : "dtype");
		return 1;
	}
	rt_buf_printf(decl, "  weight %s_q : i32[%s%s / 8, %s] = \"%.*s.qweight\"\n", w->name, pre, kk, nn, bl, w->src);
	rt_buf_printf(decl, "  weight %s_s : f32[%s%s, %s] = \"%.*s.scales\"\n", w->name, pre, ng, nn, bl, w->src);
	rt_buf_printf(decl, "  weight %s_z : i32[%s%s, (%s + 7) / 8] = \"%.*s.qzeros\"\n", w->name, pre, ng, nn, bl,
		w->src);
	rt_buf_printf(decl, "  weight %s_g : i32[%s%s] = \"%.*s.g_idx\"\n", w->name, pre, kk, bl, w->src);
	rt_buf_printf(bind, "  %-6s = dequant(%s_q, %s_s, %s_z, %s_g, format=\"gptq\", block=[1, %s], zp=%d, to=%s)\n",
		w->name, w->name, w->name, w->name, w->name, g, q->zp, w->type[0] ? w->type : "dtype");
	return 1;
}

/* Emits the quantized form of w when it is quantized: 1, else 0; -1 on an
 * error (reported). */
static int quantize(moe_ctx *ctx, const char *file, qcfg *q, const wline *w, rt_buf *decl, rt_buf *bind)
{
	if (q->fused) { /* the fused experts module is the tensor's parent */
		char module[400];
		const char *dot = strrchr(w->src, '.');
		module_of(q, w->src, dot ? (size_t)(dot - w->src) : 0, module, sizeof module);
		int ig = ignored(ctx, file, q, module);
		if (ig)
			return ig < 0 ? -1 : 0;
		if (quantize_fused(q, w, decl, bind))
			return 1;
		if (q->fused == 2)
			return 0;
	}
	size_t sl = strlen(w->src);
	if (sl < 7 || strcmp(w->src + sl - 7, ".weight") || strstr(w->name, "router"))
		return 0;
	char module[400];
	module_of(q, w->src, sl - 7, module, sizeof module);
	int ig = ignored(ctx, file, q, module);
	if (ig)
		return ig < 0 ? -1 : 0;
	/* the last two dims are N (out) and K (in) */
	const char *c2 = strrchr(w->dims, ',');
	if (!c2)
		return 0;
	const char *c1 = c2;
	while (c1 > w->dims && c1[-1] != ',')
		c1--;
	int lead = (int)(c1 - w->dims);
	char n[64], k[64];
	snprintf(n, sizeof n, "%.*s", (int)(c2 - c1), c1);
	snprintf(k, sizeof k, "%s", c2 + 1);
	char *nn = n, *kk = k;
	while (*nn == ' ')
		nn++;
	while (*kk == ' ')
		kk++;
	const char *base = w->src;
	int bl = (int)(sl - 7);
	char pre[160]; /* the leading dims, "E, " */
	snprintf(pre, sizeof pre, "%.*s%s", lead, w->dims, lead ? " " : "");
	if (!strcmp(q->fmt, "gptq") || !strcmp(q->fmt, "awq"))
		return quantize_gptq(q, w, pre, nn, kk, bl, decl, bind);
	if (!strcmp(q->fmt, "int8")) { /* W8A8: only the routed experts' contractions quantize their activations */
		if (!strstr(w->src, "{e}")) {
			rt_err_at(ctx, file, -1, "quantization_config: W8A8 int8 weight '%.*s' is not a routed expert's: moec "
				"quantizes the activations of the experts' contractions only (list it in ignore to keep it float)",
				bl, base);
			return -1;
		}
		rt_buf_printf(decl, "  weight %s_q : u8[%s] = \"%.*s.weight\"\n", w->name, w->dims, bl, base);
		rt_buf_printf(decl, "  weight %s_s : f32[%s%s, 1] = \"%.*s.weight_scale\"\n", w->name, pre, nn, bl, base);
		rt_buf_printf(bind, "  %-6s = dequant(%s_q, %s_s, format=\"int8\", block=[1, %s], act=\"int8\", to=%s)\n",
			w->name, w->name, w->name, kk, w->type[0] ? w->type : "dtype");
		return 1;
	}
	if (!strcmp(q->fmt, "nvfp4")) { /* the global scale: one f32 per matrix, [pre 1] */
		rt_buf_printf(decl, "  weight %s_q : u8[%s%s, %s / 2] = \"%.*s%s\"\n", w->name, pre, nn, kk, bl, base, q->qsuffix);
		rt_buf_printf(decl, "  weight %s_s : f8e4m3[%s%s, %s / 16] = \"%.*s%s\"\n", w->name, pre, nn, kk, bl, base,
			q->ssuffix);
		rt_buf_printf(decl, "  weight %s_g : f32[%s1] = \"%.*s%s\"\n", w->name, pre, bl, base, q->gsuffix);
		rt_buf_printf(bind, "  %-6s = dequant(%s_q, %s_s, %s_g, format=\"nvfp4\", block=[1, 16], gscale=\"%s\", to=%s)\n",
			w->name, w->name, w->name, w->name, q->gscale, w->type[0] ? w->type : "dtype");
		return 1;
	}
	if (!strcmp(q->fmt, "int4"))
		rt_buf_printf(decl, "  weight %s_q : i32[%s%s, (%s + 7) / 8] = \"%.*s%s\"\n", w->name, pre, nn, kk, bl, base,
			q->qsuffix);
	else
		rt_buf_printf(decl, "  weight %s_q : %s[%s] = \"%.*s%s\"\n", w->name, q->qtype, w->dims, bl, base, q->qsuffix);
	char sn[96], sk[96];
	if (q->bn == 1)
		snprintf(sn, sizeof sn, "%s", nn);
	else
		snprintf(sn, sizeof sn, "(%s + %lld) / %lld", nn, (long long)q->bn - 1, (long long)q->bn);
	if (q->bk == 0)
		snprintf(sk, sizeof sk, "1");
	else if (!strcmp(q->fmt, "int4"))
		snprintf(sk, sizeof sk, "%s / %lld", kk, (long long)q->bk);
	else
		snprintf(sk, sizeof sk, "(%s + %lld) / %lld", kk, (long long)q->bk - 1, (long long)q->bk);
	/* compressed-tensors int4 scales are bf16 as published; they are declared so, and the
	 * loader refuses another stored type rather than follow a semantics the layer does not */
	rt_buf_printf(decl, "  weight %s_s : %s[%s%s, %s] = \"%.*s%s\"\n", w->name, !strcmp(q->fmt, "int4") ? "bf16" : "f32",
		pre, sn, sk, bl, base, q->ssuffix);
	char bk[64];
	if (q->bk == 0)
		snprintf(bk, sizeof bk, "%s", kk);
	else
		snprintf(bk, sizeof bk, "%lld", (long long)q->bk);
	if (!strcmp(q->fmt, "int4")) /* compressed-tensors: each product rounded to the scale's dtype (bf16) */
		rt_buf_printf(bind, "  %-6s = cast(dequant(%s_q, %s_s, format=\"int4\", block=[1, %s], k=%s, to=bf16), %s)\n",
			w->name, w->name, w->name, bk, kk, w->type[0] ? w->type : "dtype");
	else
		rt_buf_printf(bind, "  %-6s = dequant(%s_q, %s_s, format=\"%s\", block=[%lld, %s], to=%s)\n", w->name,
			w->name, w->name, q->fmt, (long long)q->bn, bk, w->type[0] ? w->type : "dtype");
	return 1;
}

moe_status rt_quant_rewrite(moe_ctx *ctx, const char *file, const cJSON *qc, char **text)
{
	if (!cJSON_IsObject(qc))
		return bad(ctx, file, "not an object");
	qcfg q;
	moe_status st = read_cfg(ctx, file, qc, &q);
	q.budget = RT_RE_STEPS;
	const char *pl = strstr(*text, "\n  param layer = ");
	if (!pl || sscanf(pl, "\n  param layer = %20[0-9]", q.layer) != 1)
		q.layer[0] = 0;
	if (!st && q.ignore_key)
		st = read_ignore(ctx, file, qc, q.ignore_key, &q);
	if (st)
		return st;
	rt_buf out = {0}, bind = {0};
	int nq = 0;
	const char *p = *text, *last_weight_end = NULL;
	for (const char *l = p; *l;) {
		const char *nl = strchr(l, '\n');
		size_t len = nl ? (size_t)(nl - l) : strlen(l);
		wline w;
		if (parse_weight(l, len, &w)) {
			int r = quantize(ctx, file, &q, &w, &out, &bind);
			if (r < 0) {
				rt_buf_free(&out);
				rt_buf_free(&bind);
				return MOE_ERR_INVALID;
			}
			if (r)
				nq++;
			else
				rt_buf_printf(&out, "%.*s\n", (int)len, l);
			last_weight_end = l + len;
		} else {
			if (last_weight_end && bind.s && bind.len) { /* bindings right after the weights */
				rt_buf_printf(&out, "  # quantized weights (quantization_config: %s)\n%s", q.fmt, bind.s);
				bind.len = 0;
				bind.s[0] = 0;
			}
			rt_buf_printf(&out, "%.*s%s", (int)len, l, nl ? "\n" : "");
		}
		l += len + (nl ? 1 : 0);
	}
	rt_buf_free(&bind);
	if (out.oom || !out.s) {
		rt_buf_free(&out);
		rt_err_at(ctx, file, -1, "out of memory");
		return MOE_ERR_NOMEM;
	}
	if (!nq) {
		rt_buf_free(&out);
		return bad(ctx, file, "no expert weight of this layer is quantized by it (all ignored?)");
	}
	free(*text);
	*text = out.s;
	return MOE_OK;
}
