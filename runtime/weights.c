/* runtime/weights.c: bind the weight nodes of a graph to checkpoint tensors.
 *
 * A weight's `source` names one tensor, or with `{e}` a per-expert template
 * whose E = shape[0] tensors stack into the leading dimension. Stored floats
 * convert to the node's dtype; shapes must match exactly. Every weight's
 * tensors are checked from the checkpoint headers (names, shapes, dtypes)
 * before any weight is allocated or any tensor data is read. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/rt_io.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "moec's weight loader assumes a little-endian host"
#endif

static void shape_str(char *buf, size_t n, int rank, const int64_t *s)
{
	size_t at = 0;
	at += (size_t)snprintf(buf + at, n - at, "[");
	for (int i = 0; i < rank && at < n; i++)
		at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "", (long long)s[i]);
	if (at < n)
		snprintf(buf + at, n - at, "]");
}

/* src with every "{key}" replaced by the decimal value, in context memory
 * (rt_strfree); every caller runs inside a guarded entry point, so a refusal
 * unwinds. */
static char *subst(moe_ctx *ctx, const char *src, const char *key, int64_t value)
{
	rt_buf b = {0};
	size_t kl = strlen(key);
	for (const char *p = src; *p;) {
		const char *q = strstr(p, key);
		if (!q) {
			rt_buf_printf(&b, "%s", p);
			break;
		}
		rt_buf_printf(&b, "%.*s%lld", (int)(q - p), p, (long long)value);
		p = q + kl;
	}
	size_t n = b.s ? strlen(b.s) + 1 : 0;
	char *r = b.oom || !b.s ? NULL : ctx_try_alloc(ctx, n);
	if (r)
		memcpy(r, b.s, n);
	rt_buf_free(&b);
	if (!r)
		ctx_throw(ctx, n ? n : 1);
	return r;
}

static void list_sources(moe_checkpoint *ck, char *buf, size_t n)
{
	size_t at = 0;
	buf[0] = 0;
	for (size_t i = 0; i < rt_checkpoint_nsources(ck) && at < n; i++)
		at += (size_t)snprintf(buf + at, n - at, "%s%s", i ? ", " : "", rt_checkpoint_source(ck, i));
}

/* ---- tensor name prefixes ----
 * A source names the tensor as the ForCausalLM class saves it; a checkpoint
 * saved from the base (text) model class, or from a multimodal class, names
 * the same tensor under another of these prefixes, as HF's loader accepts.
 * The longest prefix a source starts with is its own; when the name itself is
 * absent, the others are tried in this order. The first that the checkpoint's
 * header holds is kept for every later source with the same own prefix. */
static const char *const known_prefixes[] = {"model.language_model.", "language_model.model.", "model.",
	"language_model.", "backbone.", "transformer.", ""};
#define NPREFIX (sizeof known_prefixes / sizeof *known_prefixes)

typedef struct rt_prefixes {
	signed char to[NPREFIX]; /* by own prefix: the prefix found (-1: not yet) */
} rt_prefixes;

static size_t own_prefix(const char *name)
{
	for (size_t i = 0; i < NPREFIX; i++)
		if (!strncmp(name, known_prefixes[i], strlen(known_prefixes[i])))
			return i;
	return NPREFIX - 1;
}

/* src (a template) with its own prefix replaced by prefix q, in context memory. */
static char *with_prefix(moe_ctx *ctx, const char *src, size_t q)
{
	const char *rest = src + strlen(known_prefixes[own_prefix(src)]);
	size_t a = strlen(known_prefixes[q]), b = strlen(rest);
	char *r = ctx_alloc(ctx, a + b + 1);
	memcpy(r, known_prefixes[q], a);
	memcpy(r + a, rest, b + 1);
	return r;
}

/* Whether the first tensor of template src is in ck. */
static bool probe(moe_ctx *ctx, moe_checkpoint *ck, const char *src, bool stacked, const int64_t *map)
{
	char *name = stacked ? subst(ctx, src, "{e}", map ? map[0] : 0) : NULL;
	bool found = moe_checkpoint_find(ck, stacked ? name : src, NULL) != NULL;
	rt_strfree(ctx, name);
	return found;
}

/* The template to read: src itself when its first tensor is present, else src
 * under the first known prefix that holds it (src's own string is freed); src
 * unchanged when none does (the caller reports it). */
static char *resolve_prefix(moe_ctx *ctx, moe_checkpoint *ck, rt_prefixes *rp, char *src, bool stacked,
	const int64_t *map)
{
	int errs = moe_error_count(ctx);
	if (probe(ctx, ck, src, stacked, map) || moe_error_count(ctx) != errs)
		return src;
	size_t p = own_prefix(src);
	for (size_t k = 0; k <= NPREFIX; k++) {
		size_t q = k == 0 ? (size_t)(rp && rp->to[p] >= 0 ? rp->to[p] : (signed char)p) : k - 1;
		if (q == p)
			continue;
		char *alt = with_prefix(ctx, src, q);
		if (probe(ctx, ck, alt, stacked, map)) {
			if (rp)
				rp->to[p] = (signed char)q;
			rt_strfree(ctx, src);
			return alt;
		}
		rt_strfree(ctx, alt);
		if (moe_error_count(ctx) != errs)
			break;
	}
	return src;
}

/* The (up to) 3 names of the checkpoint sharing the longest tail with want. */
typedef struct nearest {
	const char *want;
	size_t wlen;
	const char *best[3];
	size_t score[3];
} nearest;

static void near_one(void *arg, const char *name)
{
	nearest *n = arg;
	size_t len = strlen(name), s = 0;
	while (s < len && s < n->wlen && name[len - 1 - s] == n->want[n->wlen - 1 - s])
		s++;
	for (int i = 0; i < 3; i++) {
		if (n->best[i] && s <= n->score[i])
			continue;
		for (int j = 2; j > i; j--) {
			n->best[j] = n->best[j - 1];
			n->score[j] = n->score[j - 1];
		}
		n->best[i] = name;
		n->score[i] = s;
		return;
	}
}

static void not_found(moe_ctx *ctx, moe_checkpoint *ck, moe_loc loc, const char *wname, const char *tn)
{
	char srcs[512];
	list_sources(ck, srcs, sizeof srcs);
	rt_buf b = {0};
	size_t p = own_prefix(tn);
	const char *rest = tn + strlen(known_prefixes[p]);
	rt_buf_printf(&b, "'%s'", tn);
	for (size_t q = 0; q < NPREFIX; q++)
		if (q != p)
			rt_buf_printf(&b, ", '%s%s'", known_prefixes[q], rest);
	nearest n = {.want = tn, .wlen = strlen(tn)};
	rt_checkpoint_names(ck, near_one, &n);
	rt_buf_printf(&b, "; nearest present: ");
	for (int i = 0; i < 3 && n.best[i]; i++)
		rt_buf_printf(&b, "%s'%.200s'", i ? ", " : "", n.best[i]);
	if (!n.best[0])
		rt_buf_printf(&b, "none (the checkpoint holds no tensor)");
	moe_diag(ctx, MOE_DIAG_ERROR, loc, "weight '%s': tensor '%s' not found in %s (tried %s)", wname, tn, srcs,
		b.oom || !b.s ? "" : b.s);
	rt_buf_free(&b);
}

/* The stored dtypes that convert to a node of dtype dt. */
static bool dtype_converts(moe_st_dtype from, moe_dtype dt)
{
	if (dt == MOE_F32 || dt == MOE_BF16)
		return from == MOE_ST_F32 || from == MOE_ST_BF16 || from == MOE_ST_F16;
	return (dt == MOE_I32 && from == MOE_ST_I32) || (dt == MOE_BOOL && from == MOE_ST_BOOL) ||
	       (dt == MOE_F8E4M3 && from == MOE_ST_F8_E4M3) ||
	       (dt == MOE_U8 && (from == MOE_ST_U8 || from == MOE_ST_F8_E8M0 || from == MOE_ST_I8));
}

static void dtype_error(moe_ctx *ctx, const moe_st_tensor *st, const char *file, const char *wname, moe_dtype dt)
{
	rt_err_at(ctx, file, st->offset, "tensor '%s' is %s; weight '%s' is %s and moec converts only F32, BF16 and F16 to "
		"f32/bf16 (and I32 to i32, BOOL to bool, F8_E4M3 to f8e4m3, U8 and F8_E8M0 to u8; quantized weights are "
		"declared with their stored type and read by dequant)", st->name, moe_st_dtype_name(st->dtype), wname,
		moe_dtype_name(dt));
}

/* Copy/convert one stored tensor into dst (numel elements of dtype dt). */
static bool convert(moe_ctx *ctx, const moe_st_tensor *st, const char *file, const char *wname, moe_dtype dt,
	void *dst)
{
	const unsigned char *src = st->data;
	size_t n = (size_t)st->numel;
	if (dt == MOE_F32 || dt == MOE_BF16) {
		rt_src from;
		switch (st->dtype) {
		case MOE_ST_F32: from = RT_SRC_F32; break;
		case MOE_ST_BF16: from = RT_SRC_BF16; break;
		case MOE_ST_F16: from = RT_SRC_F16; break;
		default: goto bad;
		}
		rt_convert_float(dst, dt, src, from, n);
		return true;
	}
	if (dt == MOE_I32 && st->dtype == MOE_ST_I32) {
		memcpy(dst, src, n * 4);
		return true;
	}
	/* quantized weights: their bytes as stored (E8M0 scales may be U8 or F8_E8M0) */
	if ((dt == MOE_F8E4M3 && st->dtype == MOE_ST_F8_E4M3) ||
		(dt == MOE_U8 && (st->dtype == MOE_ST_U8 || st->dtype == MOE_ST_F8_E8M0 || st->dtype == MOE_ST_I8))) {
		memcpy(dst, src, n);
		return true;
	}
	if (dt == MOE_BOOL && st->dtype == MOE_ST_BOOL) {
		for (size_t i = 0; i < n; i++)
			if (src[i] > 1) {
				rt_err_at(ctx, file, st->offset + (int64_t)i, "tensor '%s': bool element %zu is %u, not 0 or 1",
					st->name, i, src[i]);
				return false;
			}
		memcpy(dst, src, n);
		return true;
	}
bad:
	dtype_error(ctx, st, file, wname, dt);
	return false;
}

/* Is id s, or reached from s through gathers, reshapes, slices and (up to
 * `depth` of them) the parts of concats: a weight laid out with others (the
 * TCP target's packed gate/up and down, one per-block fetch)? */
static bool reaches(const moe_graph *g, moe_id s, moe_id id, int depth)
{
	while (s != id && (moe_node_op(g, s) == MOE_OP_GATHER || moe_node_op(g, s) == MOE_OP_RESHAPE ||
			   moe_node_op(g, s) == MOE_OP_SLICE))
		s = moe_node_arg(g, s, 0);
	if (s == id)
		return true;
	if (moe_node_op(g, s) != MOE_OP_CONCAT || depth <= 0)
		return false;
	for (uint32_t k = 0; k < moe_node_num_args(g, s); k++)
		if (reaches(g, moe_node_arg(g, s, k), id, depth - 1))
			return true;
	return false;
}

/* Does operand arg of dequant i of graph dg come from weight id of g? dg is
 * g, or the body of g's block_loop node L, whose `in` blockargs are the
 * loop's operands (a dequant of the experts' weights in the loop a graph
 * that kept its block loop holds). */
static bool arg_reaches(const moe_graph *g, const moe_graph *dg, moe_id L, moe_id i, uint32_t arg, moe_id id)
{
	moe_id s = moe_node_arg(dg, i, arg);
	if (dg == g)
		return reaches(g, s, id, 2);
	while (moe_node_op(dg, s) == MOE_OP_RESHAPE || moe_node_op(dg, s) == MOE_OP_SLICE)
		s = moe_node_arg(dg, s, 0);
	if (moe_node_op(dg, s) != MOE_OP_BLOCKARG || ir_blockarg_role_of(N(dg, s)) != IR_BA_IN)
		return false;
	const ir_node *ln = N(g, L);
	int a = ir_block_loop_arg(ir_attr_str(ln, "kinds", ""), (int)ir_attr_int(N(dg, s), "index", -1));
	return a >= 0 && (uint32_t)a < ln->nargs && reaches(g, ln->args[a], id, 2);
}

static uint32_t reach_in(const moe_graph *g, const moe_graph *dg, moe_id L, moe_id id, const char *format,
	uint32_t arg)
{
	for (moe_id i = 0; i < moe_graph_num_nodes(dg); i++) {
		if (moe_node_op(dg, i) != MOE_OP_DEQUANT || moe_node_num_args(dg, i) <= arg ||
			(format && strcmp(ir_attr_str(N(dg, i), "format", ""), format)))
			continue;
		/* through the per-block gathers of blockwise-dispatch */
		if (arg_reaches(g, dg, L, i, arg, id))
			return moe_node_num_args(dg, i);
	}
	return 0;
}

/* The operand count of a dequant (of format, any when NULL) of g or of a
 * block loop's body whose operand arg comes from weight id; 0 when none. */
static uint32_t dequant_reach(const moe_graph *g, moe_id id, const char *format, uint32_t arg)
{
	uint32_t n = reach_in(g, g, MOE_NONE, id, format, arg);
	for (moe_id L = 0; L < moe_graph_num_nodes(g) && !n; L++) {
		const moe_graph *body = moe_node_op(g, L) == MOE_OP_BLOCK_LOOP ? ir_node_body(g, N(g, L)) : NULL;
		if (body)
			n = reach_in(g, body, L, id, format, arg);
	}
	return n;
}

/* Is weight id the scale operand of a dequant? Scales are stored with a
 * collapsed rank at times (a 0-d tensor for one 128x128 block): their grid is
 * rebuilt from the weight's shape, so only the non-1 dims must agree. */
static uint32_t is_scale(const moe_graph *g, moe_id id) /* the dequant's operand count, 0 when none reads it */
{
	return dequant_reach(g, id, NULL, 1);
}

/* Is weight id operand `arg` of a dequant of `format`, directly or through
 * the gathers, reshapes, slices and concats between a weight and its
 * dequant? */
static bool dequant_operand(const moe_graph *g, moe_id id, const char *format, uint32_t arg)
{
	return dequant_reach(g, id, format, arg) != 0;
}

/* Is weight id an nvfp4 dequant's global scale (one f32 per matrix, stored
 * [1] by compressed-tensors and 0-d by ModelOpt)? */
static bool is_global_scale(const moe_graph *g, moe_id id)
{
	return dequant_operand(g, id, "nvfp4", 2);
}

/* Is weight id the values of an int8 dequant (bytes of int8, stored I8)? */
static bool is_int8_values(const moe_graph *g, moe_id id)
{
	return dequant_operand(g, id, "int8", 0);
}

/* A dequant's scale declared bf16 says the products are rounded to bf16, the
 * scale's dtype (compressed-tensors): stored in another float type, the
 * reference would compute in that type, so it is refused rather than rounded. */
static bool scale_dtype_ok(moe_ctx *ctx, const moe_graph *g, moe_id id, const moe_st_tensor *st, const char *file)
{
	if ((st->dtype == MOE_ST_I8) != is_int8_values(g, id) && moe_node_dtype(g, id) == MOE_U8) {
		rt_err_at(ctx, file, st->offset, "tensor '%s' is %s; weight '%s' %s", st->name, moe_st_dtype_name(st->dtype),
			moe_node_name(g, id), st->dtype == MOE_ST_I8 ? "is u8 bytes, not int8 values (dequant format int8)"
								  : "holds W8A8 int8 values, stored I8");
		return false;
	}
	if (st->dtype != MOE_ST_F32 && is_global_scale(g, id)) {
		rt_err_at(ctx, file, st->offset, "tensor '%s' is %s; weight '%s' is an NVFP4 global scale, stored F32",
			st->name, moe_st_dtype_name(st->dtype), moe_node_name(g, id));
		return false;
	}
	if (moe_node_dtype(g, id) == MOE_F32 && st->dtype != MOE_ST_F16 && is_scale(g, id) >= 3) {
		rt_err_at(ctx, file, st->offset, "tensor '%s' is %s; weight '%s' is a GPTQ or AWQ scale, stored F16: the layer "
			"dequantizes in f16 as the format's reference does", st->name, moe_st_dtype_name(st->dtype),
			moe_node_name(g, id));
		return false;
	}
	if (moe_node_dtype(g, id) != MOE_BF16 || st->dtype == MOE_ST_BF16 || !is_scale(g, id))
		return true;
	rt_err_at(ctx, file, st->offset, "tensor '%s' is %s; weight '%s' is a bf16 scale: the layer dequantizes in "
		"the scale's dtype as the format's reference does for bf16 scales (declare it f32 and dequantize "
		"to=f32 for exact f32 products)", st->name, moe_st_dtype_name(st->dtype), moe_node_name(g, id));
	return false;
}

static bool same_squeezed(int ra, const int64_t *a, int rb, const int64_t *b)
{
	int i = 0, j = 0;
	for (;;) {
		while (i < ra && a[i] == 1)
			i++;
		while (j < rb && b[j] == 1)
			j++;
		if (i == ra || j == rb)
			return i == ra && j == rb;
		if (a[i++] != b[j++])
			return false;
	}
}

/* True when no tensor of src (each expert's, for a template) is in ck. */
static bool absent_all(moe_ctx *ctx, moe_checkpoint *ck, const char *src, int64_t count, bool stacked, const int64_t *map)
{
	for (int64_t e = 0; e < count; e++) {
		char *name = stacked ? subst(ctx, src, "{e}", map ? map[e] : e) : NULL;
		bool found = (stacked ? name != NULL : true) && moe_checkpoint_find(ck, stacked ? name : src, NULL);
		rt_strfree(ctx, name);
		if (found || (stacked && !name))
			return false;
	}
	return true;
}

/* The ep_experts list of an expert-parallel device's weight (the global
 * expert of each leading row), in *map; NULL when the weight has none. */
static bool ep_map(moe_ctx *ctx, const moe_graph *g, moe_id id, const int64_t **map, int *nmap)
{
	const ir_node *n = N(g, id);
	int k = *nmap = ir_attr_ints(n, "ep_experts", map);
	if (k < 0) {
		*map = NULL;
		return true;
	}
	bool ok = n->rank >= 1 && k >= 1 && n->shape[0] % k == 0;
	for (int i = 0; ok && i < k; i++)
		ok = (*map)[i] >= 0 && (*map)[i] < MOE_MAX_DIM;
	if (!ok)
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "weight '%s': ep_experts must list experts >= 0 whose count divides the leading dimension",
			n->name);
	return ok;
}

/* An expert-parallel device's rows of one tensor holding every expert
 * ([E * G, ...], each expert G consecutive rows; G = 1 mostly): the weight's
 * rows [i * G, (i + 1) * G) are the tensor's of expert map[i]; only those
 * bytes are read. */
static bool load_rows(moe_ctx *ctx, const moe_graph *g, moe_id id, const moe_st_tensor *st, const char *file,
	const int64_t *map, int nmap, bool check, moe_tensor *t)
{
	const ir_node *n = N(g, id);
	int64_t grp = n->shape[0] / nmap;
	bool lead = st->rank >= 1 && n->rank >= 1 && grp >= 1 && st->shape[0] % grp == 0;
	bool same = lead && st->rank == n->rank;
	for (int i = 1; same && i < n->rank; i++)
		same = st->shape[i] == n->shape[i];
	/* a dequant's scale may be stored with its unit dims elsewhere (per-channel
	 * FP8: [E, D, 1] for a [E, 1, D] grid), as load_one accepts on one device */
	if (!same && lead && (is_scale(g, id) || is_global_scale(g, id)))
		same = same_squeezed(st->rank - 1, st->shape + 1, n->rank - 1, n->shape + 1);
	for (int e = 0; same && e < nmap; e++)
		same = map[e] < st->shape[0] / grp;
	if (!same) {
		char have[160], want[160];
		shape_str(have, sizeof have, st->rank, st->shape);
		shape_str(want, sizeof want, n->rank, n->shape);
		rt_err_at(ctx, file, st->offset, "tensor '%s' has shape %s; weight '%s' : %s takes the rows of experts "
			"(ep_experts) up to %lld", st->name, have, n->name, want, (long long)map[nmap - 1]);
		return false;
	}
	if (!dtype_converts(st->dtype, (moe_dtype)n->dtype)) {
		dtype_error(ctx, st, file, n->name, (moe_dtype)n->dtype);
		return false;
	}
	if (!scale_dtype_ok(ctx, g, id, st, file))
		return false;
	if (check)
		return true;
	int64_t experts = st->shape[0] / grp;
	size_t sbytes = st->nbytes / (size_t)experts, dbytes = t->nbytes / (size_t)nmap;
	for (int e = 0; e < nmap; e++) {
		moe_st_tensor row = *st;
		row.numel = st->numel / experts;
		row.nbytes = sbytes;
		row.data = (const char *)st->data + (size_t)map[e] * sbytes;
		row.offset = st->offset + (int64_t)((size_t)map[e] * sbytes);
		if (!convert(ctx, &row, file, n->name, (moe_dtype)n->dtype, (char *)t->data + (size_t)e * dbytes))
			return false;
	}
	return true;
}

/* Check (check: headers only, nothing allocated or read) or load one weight
 * node; false after diagnostics. */
static bool load_one(moe_ctx *ctx, const moe_graph *g, moe_id id, moe_checkpoint *ck, rt_prefixes *rp,
	unsigned flags, bool check, size_t *absent, moe_tensor_map *out)
{
	const char *wname = moe_node_name(g, id);
	moe_loc loc = moe_node_loc(g, id);
	const char *source = moe_node_get_str(g, id, "source");
	if (!wname || !*wname) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "weight node %%%u has no name", id);
		return false;
	}
	if (!source || !*source) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "weight '%s' has no source tensor name", wname);
		return false;
	}
	char *src;
	if (strstr(source, "{layer}")) {
		int64_t layer;
		if (!moe_graph_get_dim(g, "layer", &layer)) {
			moe_diag(ctx, MOE_DIAG_ERROR, loc, "weight '%s': source '%s' uses {layer} but the layer has no 'layer' param",
				wname, source);
			return false;
		}
		src = subst(ctx, source, "{layer}", layer);
	} else {
		src = subst(ctx, source, "{layer}", 0);
	}
	if (!src) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "out of memory");
		return false;
	}
	moe_dtype dt = moe_node_dtype(g, id);
	int rank = moe_node_rank(g, id);
	const int64_t *shape = moe_node_shape(g, id);
	bool stacked = strstr(src, "{e}") != NULL;
	if (stacked && rank < 1) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "weight '%s': a per-expert source ({e}) needs a shape [E, ...]", wname);
		rt_strfree(ctx, src);
		return false;
	}
	int errs = moe_error_count(ctx);
	/* an expert-parallel device's rows: the global experts it holds */
	const int64_t *map = NULL;
	int nmap = 0;
	if (!ep_map(ctx, g, id, &map, &nmap) || (map && stacked && nmap != shape[0])) {
		if (map && stacked && nmap != shape[0])
			moe_diag(ctx, MOE_DIAG_ERROR, loc, "weight '%s': a per-expert source ({e}) takes one ep_experts entry per "
				"leading row", wname);
		rt_strfree(ctx, src);
		return false;
	}
	src = resolve_prefix(ctx, ck, rp, src, stacked, map);
	bool absent_ok = (flags & MOE_WEIGHTS_ALLOW_ABSENT) && absent_all(ctx, ck, src, stacked ? shape[0] : 1, stacked, map);
	/* a listed tensor whose shard cannot be read is an error, not an absence */
	if (absent_ok && moe_error_count(ctx) == errs) {
		rt_strfree(ctx, src);
		if (check)
			return true;
		moe_tensor *t = moe_tensor_new_shape(ctx, dt, rank, shape);
		if (!t)
			ctx_throw(ctx, sizeof *t); /* refused (said so): the guarded call returns MOE_ERR_NOMEM */
		if (moe_tensor_map_set(out, wname, t) != MOE_OK)
			return false; /* out of memory: t freed, with an error */
		if (absent)
			(*absent)++;
		return true;
	}
	if (!check && stacked && !map && (flags & MOE_WEIGHTS_DEFER)) {
		/* checked above (every expert's header); read later, a row at a time */
		rt_strfree(ctx, src);
		moe_tensor *t = moe_tensor_new_shape(ctx, dt, rank, shape);
		if (!t)
			ctx_throw(ctx, sizeof *t);
		return moe_tensor_map_set(out, wname, t) == MOE_OK;
	}
	moe_tensor *t = check ? NULL : moe_tensor_new(ctx, dt, rank, shape);
	if (!check && !t)
		ctx_throw(ctx, sizeof *t); /* the shape was checked: a NULL tensor is a refused allocation */
	int64_t count = stacked ? shape[0] : 1;
	int prank = stacked ? rank - 1 : rank;
	const int64_t *pshape = stacked ? shape + 1 : shape;
	size_t pbytes = count && t ? t->nbytes / (size_t)count : 0;
	bool ok = true;
	for (int64_t e = 0; e < count && ok; e++) {
		char *name = stacked ? subst(ctx, src, "{e}", map ? map[e] : e) : NULL;
		const char *tn = stacked ? name : src;
		if (!tn) {
			moe_diag(ctx, MOE_DIAG_ERROR, loc, "out of memory");
			ok = false;
			break;
		}
		int before = moe_error_count(ctx);
		const char *file = NULL;
		const moe_st_tensor *st = moe_checkpoint_find(ck, tn, &file);
		if (!st) {
			if (moe_error_count(ctx) == before)
				not_found(ctx, ck, loc, wname, tn);
			ok = false;
		} else if (map && !stacked) {
			ok = load_rows(ctx, g, id, st, file, map, nmap, check, t);
		} else {
			bool same = st->rank == prank;
			for (int i = 0; same && i < prank; i++)
				same = st->shape[i] == pshape[i];
			if (!same && (is_scale(g, id) || is_global_scale(g, id)))
				same = same_squeezed(st->rank, st->shape, prank, pshape);
			if (!same) {
				char have[160], want[160], full[160];
				shape_str(have, sizeof have, st->rank, st->shape);
				shape_str(want, sizeof want, prank, pshape);
				shape_str(full, sizeof full, rank, shape);
				if (stacked)
					rt_err_at(ctx, file, st->offset,
						"tensor '%s' has shape %s but weight '%s' : %s stacks experts of shape %s", tn,
						have, wname, full, want);
				else
					rt_err_at(ctx, file, st->offset, "tensor '%s' has shape %s but weight '%s' needs %s", tn,
						have, wname, want);
				ok = false;
			} else if (!dtype_converts(st->dtype, dt)) {
				dtype_error(ctx, st, file, wname, dt);
				ok = false;
			} else if (!scale_dtype_ok(ctx, g, id, st, file)) {
				ok = false;
			} else if (!check) {
				ok = convert(ctx, st, file, wname, dt, (char *)t->data + (size_t)e * pbytes);
			}
		}
		rt_strfree(ctx, name);
	}
	rt_strfree(ctx, src);
	if (!ok || check) {
		moe_tensor_free(ctx, t);
		return ok;
	}
	return moe_tensor_map_set(out, wname, t) == MOE_OK; /* out of memory: t freed, with an error */
}

static moe_status load_all(moe_ctx *ctx, const moe_graph *g, moe_checkpoint *ck, unsigned flags, size_t *absent,
	moe_tensor_map *out)
{
	bool ok = true;
	uint32_t n = moe_graph_num_nodes(g);
	rt_prefixes rp;
	memset(rp.to, -1, sizeof rp.to);
	if (absent)
		*absent = 0;
	/* every header first: a mismatch costs no allocation and no read */
	for (moe_id i = 0; i < n && !moe_diag_limit_reached(ctx); i++)
		if (moe_node_op(g, i) == MOE_OP_WEIGHT)
			ok &= load_one(ctx, g, i, ck, &rp, flags, true, NULL, out);
	for (moe_id i = 0; i < n && ok; i++)
		if (moe_node_op(g, i) == MOE_OP_WEIGHT)
			ok &= load_one(ctx, g, i, ck, &rp, flags, false, absent, out);
	return ok ? MOE_OK : MOE_ERR_INVALID;
}

/* The weights go to a map of the call's own and move into out at the end:
 * out changes only on success. A throw unmaps the files ck opened during
 * the call (own: all of them, ck being the call's own) and forgets them. */
static moe_status load_into(moe_ctx *ctx, const moe_graph *g, moe_checkpoint *ck, bool own, unsigned flags,
	size_t *absent, moe_tensor_map *out)
{
	rt_ck_mark mk;
	rt_checkpoint_mark(ck, own, &mk);
	uint32_t d = ctx_defer(ctx, rt_checkpoint_unwind, &mk);
	moe_tensor_map *tmp = moe_tensor_map_new(ctx);
	moe_status s = load_all(ctx, g, ck, flags, absent, tmp);
	if (s == MOE_OK)
		rt_tensor_map_move(out, tmp);
	moe_tensor_map_free(tmp);
	ctx_undefer(ctx, d);
	return s;
}

moe_status moe_weights_load_from(moe_ctx *ctx, const moe_graph *g, moe_checkpoint *ck, moe_tensor_map *out)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, load_into(ctx, g, ck, false, 0, NULL, out));
}

moe_status moe_weights_load_from_ex(moe_ctx *ctx, const moe_graph *g, moe_checkpoint *ck, unsigned flags,
	moe_tensor_map *out, size_t *absent)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, load_into(ctx, g, ck, false, flags, absent, out));
}

static moe_status weights_load(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t npaths,
	unsigned flags, moe_tensor_map *out, size_t *absent)
{
	moe_checkpoint *ck = moe_checkpoint_open(ctx, paths, npaths);
	if (!ck)
		return MOE_ERR_IO;
	moe_status s = load_into(ctx, g, ck, true, flags, absent, out);
	moe_checkpoint_close(ck);
	return s;
}

moe_status moe_weights_load_ex(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t npaths,
	unsigned flags, moe_tensor_map *out, size_t *absent)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, weights_load(ctx, g, paths, npaths, flags, out, absent));
}

moe_status moe_weights_load(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t npaths,
	moe_tensor_map *out)
{
	return moe_weights_load_ex(ctx, g, paths, npaths, 0, out, NULL);
}

/* One expert's row of a per-expert ({e}) weight: the same checks as
 * load_one (shape, dtype) against that one tensor, then its bytes
 * converted into dst. */
static moe_status load_row(moe_ctx *ctx, const moe_graph *g, moe_id id, moe_checkpoint *ck, int64_t row, void *dst,
	size_t nbytes)
{
	const char *wname = moe_node_name(g, id), *source = moe_node_get_str(g, id, "source");
	moe_loc loc = moe_node_loc(g, id);
	int rank = moe_node_rank(g, id);
	const int64_t *shape = moe_node_shape(g, id);
	moe_dtype dt = moe_node_dtype(g, id);
	if (moe_node_op(g, id) != MOE_OP_WEIGHT || !wname || !source || !strstr(source, "{e}") || rank < 1 || row < 0 ||
		row >= shape[0] || ir_attr_find(N(g, id), "ep_experts")) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "weight %%%u is not a per-expert ({e}) weight with a row %lld", id,
			(long long)row);
		return MOE_ERR_INVALID;
	}
	int64_t layer = 0;
	moe_graph_get_dim(g, "layer", &layer);
	char *src = resolve_prefix(ctx, ck, NULL, subst(ctx, source, "{layer}", layer), true, NULL);
	char *name = subst(ctx, src, "{e}", row);
	rt_strfree(ctx, src);
	const char *file = NULL;
	int errs = moe_error_count(ctx);
	const moe_st_tensor *st = moe_checkpoint_find(ck, name, &file);
	bool ok = st != NULL;
	if (!st && moe_error_count(ctx) == errs)
		not_found(ctx, ck, loc, wname, name);
	if (ok) {
		bool same = st->rank == rank - 1;
		for (int i = 0; same && i < rank - 1; i++)
			same = st->shape[i] == shape[i + 1];
		/* scales may be stored with their unit dims elsewhere (load_one checked
		 * that against the dequant; g may be an interface without it) */
		if (!same)
			same = same_squeezed(st->rank, st->shape, rank - 1, shape + 1);
		size_t want = (size_t)st->numel * moe_dtype_size(dt);
		if (!same || want != nbytes) {
			rt_err_at(ctx, file, st->offset, "tensor '%s' no longer has the shape of one row of weight '%s'", name,
				wname);
			ok = false;
		} else if (!dtype_converts(st->dtype, dt)) {
			dtype_error(ctx, st, file, wname, dt);
			ok = false;
		} else {
			ok = convert(ctx, st, file, wname, dt, dst);
		}
	}
	rt_strfree(ctx, name);
	return ok ? MOE_OK : MOE_ERR_INVALID;
}

moe_status moe_weights_load_row(moe_ctx *ctx, const moe_graph *g, moe_id id, moe_checkpoint *ck, int64_t row,
	void *dst, size_t nbytes)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, load_row(ctx, g, id, ck, row, dst, nbytes));
}

/* ---- the checkpoint's identity (moe_checkpoint_id, moec/io.h) ---- */
char *moe_checkpoint_id(const char *const *paths, size_t np)
{
	rt_buf b = {0};
	for (size_t i = 0; i < np; i++) {
		char real[PATH_MAX];
		struct stat st;
		size_t n = strlen(paths[i]);
		if (n < 12 || strcmp(paths[i] + n - 12, ".safetensors") || !realpath(paths[i], real) || stat(real, &st) != 0 ||
			!S_ISREG(st.st_mode) || st.st_size < 8) {
			rt_buf_free(&b);
			return NULL;
		}
		uint64_t h = 0xcbf29ce484222325ull, len = 0;
		unsigned char buf[65536];
		FILE *f = fopen(real, "rb");
		bool ok = f && fread(buf, 1, 8, f) == 8;
		for (int k = 0; ok && k < 8; k++)
			len |= (uint64_t)buf[k] << (8 * k);
		ok = ok && len <= (uint64_t)100 << 20 && len <= (uint64_t)st.st_size - 8;
		for (uint64_t done = 0; ok && done < len;) {
			size_t want = len - done < sizeof buf ? (size_t)(len - done) : sizeof buf;
			ok = fread(buf, 1, want, f) == want;
			for (size_t k = 0; ok && k < want; k++)
				h = (h ^ buf[k]) * 0x100000001b3ull;
			done += want;
		}
		if (f)
			fclose(f);
		if (!ok) {
			rt_buf_free(&b);
			return NULL;
		}
		rt_buf_printf(&b, "file %s dev %llu ino %llu size %lld mtime %lld.%09ld header %016llx\n", real,
			(unsigned long long)st.st_dev, (unsigned long long)st.st_ino, (long long)st.st_size,
			(long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec, (unsigned long long)h);
	}
	char *r = b.oom || !b.s ? NULL : strdup(b.s);
	rt_buf_free(&b);
	return r;
}
