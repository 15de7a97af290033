/* interp/interp.c: the reference interpreter, the executable definition of every
 * op in moec/ops.def (docs/ir.md). Slow and obviously correct: every op is a
 * plain loop over the multi-indices of its result.
 *
 * Value storage: a float node (f32, bf16) holds one `float` per element whose
 * value is exactly representable in the node's dtype (bf16 results are rounded
 * after every op); an i32 or bool node holds one int32_t per element (bool is
 * 0 or 1). Float arithmetic is done in f32 from operands widened to f32;
 * sums (reductions, einsum, cumsum, softmax, scatter-add, experts) accumulate
 * in f32 in increasing index order, each product rounded to f32 before it is
 * added (separate statements: no fused multiply-add), and round to the node
 * dtype once at the end. Transcendental functions are evaluated in double and
 * rounded once to f32. Integer arithmetic wraps (two's complement).
 *
 * Only nodes the outputs depend on are evaluated; every value is freed after
 * its last use. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "interp/interp_int.h"
#include "ir/quant.h"
#include "ir/scalar.h"

typedef struct interp {
	moe_ctx *ctx;
	const moe_graph *g;
	val *v;           /* per node */
	const moe_exchange *x; /* all_to_all transport; NULL: ep = 1 only */
	moe_id id;        /* node being evaluated */
	const ir_node *n; /* N(g, id) */
	int64_t ntok;     /* serving: the n_tokens value, else -1 */
} interp;

static bool is_f(int t)
{
	return moe_dtype_is_float((moe_dtype)t) != 0;
}

/* ---- rounding ---- */
static float rnd(int t, float x)
{
	return t == MOE_BF16 ? moe_bf16_to_f32(moe_f32_to_bf16(x)) : x;
}

/* Round a double once to f32 or bf16 (nearest even). For bf16 the double is
 * first rounded to f32 with round-to-odd, which makes the second rounding
 * exact (f32 keeps more than 8 + 2 significand bits). */
static float rnd_double(int t, double d)
{
	float f = (float)d;
	if (t != MOE_BF16 || isnan(d) || isinf(f) || (double)f == d)
		return rnd(t, f);
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if (!(u & 1u))
		f = nextafterf(f, d > (double)f ? INFINITY : -INFINITY);
	return rnd(t, f);
}

static int32_t i32_wrap(uint32_t u)
{
	return sc_wrap(u);
}

/* ---- float semantics shared with `experts` ---- */
static float f_sigmoid(float x)
{
	return sc_sigmoid(x);
}

/* ---- diagnostics ---- */
static void fmt_index(char *buf, size_t len, const int64_t *idx, int rank)
{
	size_t o = (size_t)snprintf(buf, len, "[");
	for (int d = 0; d < rank && o < len; d++)
		o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "", (long long)idx[d]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static void fmt_type(char *buf, size_t len, int dtype, int rank, const int64_t *shape)
{
	size_t o = (size_t)snprintf(buf, len, "%s", moe_dtype_name((moe_dtype)dtype));
	if (o < len)
		fmt_index(buf + o, len - o, shape, rank);
}

MOE_PRINTF(2, 3) static moe_status fault(interp *ip, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	const ir_node *n = ip->n;
	moe_diag(ip->ctx, MOE_DIAG_ERROR, n->loc, "run-time fault in %%%u %s%s%s%s: %s", ip->id, ir_ops[n->op].name,
		n->name ? " \"" : "", n->name ? n->name : "", n->name ? "\"" : "", msg);
	return MOE_ERR_RUNTIME;
}

/* ---- multi-index helpers ---- */
/* Advances idx through shape in row-major order; false after the last. */
static bool next_index(int64_t *idx, const int64_t *shape, int rank)
{
	for (int d = rank - 1; d >= 0; d--) {
		if (++idx[d] < shape[d])
			return true;
		idx[d] = 0;
	}
	return false;
}

static int64_t offset_of(const int64_t *idx, const int64_t *shape, int rank)
{
	int64_t o = 0;
	for (int d = 0; d < rank; d++)
		o = o * shape[d] + idx[d];
	return o;
}

/* Offset in operand a of the element broadcast to index idx of a result of rank r. */
static int64_t bcast_offset(const ir_node *a, const int64_t *idx, int r)
{
	int64_t o = 0;
	for (int k = 0; k < a->rank; k++)
		o = o * a->shape[k] + (a->shape[k] == 1 ? 0 : idx[k + r - a->rank]);
	return o;
}

/* Splits a shape around axis: outer * len * inner elements. */

/* The `valid` mask: is result element idx computed? */
static bool computed(const interp *ip, const int64_t *idx)
{
	moe_id m = ip->n->valid;
	if (m == MOE_NONE)
		return true;
	const int32_t *lim = ip->v[m].i;
	if (N(ip->g, m)->rank == 0)
		return idx[0] < lim[0];
	return idx[1] < lim[idx[0]];
}

static const ir_node *arg_node(const interp *ip, uint32_t i)
{
	return N(ip->g, ip->n->args[i]);
}

static const val *arg_val(const interp *ip, uint32_t i)
{
	return &ip->v[ip->n->args[i]];
}

static int axis_attr(const ir_node *n, const char *key, int def, int rank)
{
	int ax = ir_norm_axis((int)ir_attr_int(n, key, def), rank);
	IR_ASSERT(ax >= 0); /* verified by shape inference */
	return ax;
}

/* An attribute read as a value of dtype t. Integer values must fit i32; a
 * float value converts like `cast`. */
static moe_status attr_value(interp *ip, const char *key, int t, double def, float *fv, int32_t *iv)
{
	const ir_attr *a = ir_attr_find(ip->n, key);
	if (is_f(t)) {
		double d = !a ? def : a->kind == MOE_ATTR_FLOAT ? a->v.f : a->kind == MOE_ATTR_INT ? (double)a->v.i : def;
		*fv = rnd_double(t, d);
		return MOE_OK;
	}
	if (a && a->kind == MOE_ATTR_FLOAT) {
		*iv = t == MOE_BOOL ? a->v.f != 0 : sc_f2i((float)a->v.f);
		return MOE_OK;
	}
	int64_t i = a && a->kind == MOE_ATTR_INT ? a->v.i : (int64_t)def;
	if (t == MOE_BOOL) {
		*iv = i != 0;
		return MOE_OK;
	}
	if (i < INT32_MIN || i > INT32_MAX) {
		moe_diag(ip->ctx, MOE_DIAG_ERROR, ip->n->loc, "%%%u %s: %s = %lld does not fit i32", ip->id,
			ir_ops[ip->n->op].name, key, (long long)i);
		return MOE_ERR_INVALID;
	}
	*iv = (int32_t)i;
	return MOE_OK;
}

/* ---- leaves ---- */
static moe_status ev_const(interp *ip, val *out)
{
	float fv = 0;
	int32_t iv = 0;
	moe_status st = attr_value(ip, "value", ip->n->dtype, 0, &fv, &iv);
	if (st)
		return st;
	for (int64_t o = 0; o < out->n; o++) {
		if (out->f)
			out->f[o] = fv;
		else
			out->i[o] = iv;
	}
	return MOE_OK;
}

static moe_status ev_iota(interp *ip, val *out)
{
	const ir_node *n = ip->n;
	int ax = axis_attr(n, "axis", 0, n->rank);
	int64_t idx[MOE_MAX_RANK] = {0};
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank))
		out->i[o] = (int32_t)idx[ax];
	return MOE_OK;
}

/* ---- elementwise: ir/scalar.h defines each op on one element ---- */
static sc_ires int_binary(moe_op op, int32_t a, int32_t b, int32_t *r)
{
	sc_ires res = sc_binary_i(op, a, b, r);
	IR_ASSERT(res != SC_NOT_OP);
	return res;
}

/* unary and binary ops (broadcasting), select */
static moe_status ev_elem(interp *ip, val *out)
{
	const ir_node *n = ip->n;
	moe_op op = (moe_op)n->op;
	uint32_t na = n->nargs;
	const ir_node *an[3];
	const val *av[3];
	for (uint32_t j = 0; j < na; j++) {
		an[j] = arg_node(ip, j);
		av[j] = arg_val(ip, j);
	}
	bool fin = is_f(an[na - 1]->dtype);
	const sc_composite_def *comp = sc_composite(op);
	int64_t idx[MOE_MAX_RANK] = {0};
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		if (!computed(ip, idx))
			continue;
		int64_t off[3];
		for (uint32_t j = 0; j < na; j++)
			off[j] = bcast_offset(an[j], idx, n->rank);
		if (op == MOE_OP_SELECT) {
			int sel = av[0]->i[off[0]] != 0 ? 1 : 2;
			if (fin)
				out->f[o] = av[sel]->f[off[sel]];
			else
				out->i[o] = av[sel]->i[off[sel]];
		} else if (comp) {
			float xs[3] = {0};
			for (uint32_t j = 0; j < na; j++)
				xs[j] = av[j]->f[off[j]];
			out->f[o] = sc_composite_eval(comp, xs, rnd, n->dtype);
		} else if (na == 1 && fin) {
			float r = 0;
			IR_ASSERT(sc_unary_f(op, av[0]->f[off[0]], &r));
			out->f[o] = rnd(n->dtype, r);
		} else if (na == 1) {
			IR_ASSERT(sc_unary_i(op, (moe_dtype)an[0]->dtype, av[0]->i[off[0]], &out->i[o]));
		} else if (fin) {
			int32_t cmp = 0;
			float r = 0;
			IR_ASSERT(sc_binary_f(op, av[0]->f[off[0]], av[1]->f[off[1]], &r, &cmp));
			if (out->f)
				out->f[o] = rnd(n->dtype, r);
			else
				out->i[o] = cmp;
		} else if (int_binary(op, av[0]->i[off[0]], av[1]->i[off[1]], &out->i[o]) == SC_DIV0) {
			char at[128];
			fmt_index(at, sizeof at, idx, n->rank);
			return fault(ip, "integer division by zero at %s", at);
		}
	}
	return MOE_OK;
}

static moe_status ev_cast(interp *ip, val *out)
{
	const ir_node *n = ip->n, *a = arg_node(ip, 0);
	const val *x = arg_val(ip, 0);
	int64_t idx[MOE_MAX_RANK] = {0};
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		if (!computed(ip, idx))
			continue;
		if (is_f(a->dtype)) {
			float v = x->f[o];
			if (is_f(n->dtype))
				out->f[o] = rnd(n->dtype, v);
			else if (n->dtype == MOE_BOOL)
				out->i[o] = v != 0; /* NaN is nonzero */
			else
				out->i[o] = sc_f2i(v);
		} else {
			int32_t v = x->i[o];
			if (n->dtype == MOE_F32)
				out->f[o] = (float)v; /* round to nearest even */
			else if (n->dtype == MOE_BF16)
				out->f[o] = rnd_double(MOE_BF16, (double)v);
			else if (n->dtype == MOE_BOOL)
				out->i[o] = v != 0;
			else
				out->i[o] = v;
		}
	}
	return MOE_OK;
}

static moe_status ev_bitcast(interp *ip, val *out)
{
	const ir_node *n = ip->n;
	const val *x = arg_val(ip, 0);
	int64_t idx[MOE_MAX_RANK] = {0};
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		if (!computed(ip, idx))
			continue;
		/* both sides are 4-byte values in storage except bf16 -> bf16 */
		if (out->f && x->f)
			out->f[o] = x->f[o];
		else if (out->i && x->i)
			out->i[o] = x->i[o];
		else if (out->f)
			memcpy(&out->f[o], &x->i[o], 4);
		else
			memcpy(&out->i[o], &x->f[o], 4);
	}
	return MOE_OK;
}

/* ---- reductions along one axis ---- */
static moe_status ev_reduce(interp *ip, val *out)
{
	const ir_node *n = ip->n, *a = arg_node(ip, 0);
	const val *x = arg_val(ip, 0);
	moe_op op = (moe_op)n->op;
	int64_t outer, len, inner;
	interp_split_axis(a, axis_attr(n, "axis", -1, a->rank), &outer, &len, &inner);
	if (n->valid != MOE_NONE) /* axis > 0 (verified): the outer loop's rows are the result's */
		outer = a->shape[0] ? outer / a->shape[0] * interp_rows_below(out->f, out->i, out->n, n->shape[0],
								  ip->v[n->valid].i[0]) : 0;
	for (int64_t p = 0; p < outer; p++)
		for (int64_t q = 0; q < inner; q++) {
			int64_t base = p * len * inner + q, o = p * inner + q;
			if (is_f(a->dtype)) {
				float acc = x->f[base];
				for (int64_t j = 1; j < len; j++) {
					float v = x->f[base + j * inner];
					acc = op == MOE_OP_REDUCE_SUM ? acc + v : op == MOE_OP_REDUCE_MAX ? sc_fmax(acc, v) : sc_fmin(acc, v);
				}
				out->f[o] = rnd(n->dtype, acc);
			} else {
				int32_t acc = x->i[base];
				for (int64_t j = 1; j < len; j++) {
					int32_t v = x->i[base + j * inner];
					if (op == MOE_OP_REDUCE_SUM)
						acc = i32_wrap((uint32_t)acc + (uint32_t)v);
					else if (op == MOE_OP_REDUCE_MAX)
						acc = v > acc ? v : acc;
					else
						acc = v < acc ? v : acc;
				}
				out->i[o] = acc;
			}
		}
	return MOE_OK;
}

static moe_status ev_softmax(interp *ip, val *out)
{
	const ir_node *n = ip->n, *a = arg_node(ip, 0);
	const val *x = arg_val(ip, 0);
	int64_t outer, len, inner;
	interp_split_axis(a, axis_attr(n, "axis", -1, a->rank), &outer, &len, &inner);
	if (n->valid != MOE_NONE) /* axis > 0 (verified) */
		outer = a->shape[0] ? outer / a->shape[0] * interp_rows_below(out->f, out->i, out->n, n->shape[0],
								  ip->v[n->valid].i[0]) : 0;
	for (int64_t p = 0; p < outer; p++)
		for (int64_t q = 0; q < inner; q++) {
			int64_t base = p * len * inner + q;
			float m = x->f[base];
			for (int64_t j = 1; j < len; j++)
				m = sc_fmax(m, x->f[base + j * inner]);
			float sum = 0;
			for (int64_t j = 0; j < len; j++) {
				float z = x->f[base + j * inner] - m;
				float e = (float)exp((double)z);
				out->f[base + j * inner] = e;
				sum = j ? sum + e : e;
			}
			for (int64_t j = 0; j < len; j++) {
				float r = out->f[base + j * inner] / sum;
				out->f[base + j * inner] = rnd(n->dtype, r);
			}
		}
	return MOE_OK;
}

static moe_status ev_cumsum(interp *ip, val *out)
{
	const ir_node *n = ip->n, *a = arg_node(ip, 0);
	const val *x = arg_val(ip, 0);
	bool excl = ir_attr_int(n, "exclusive", 0) != 0;
	int64_t outer, len, inner;
	interp_split_axis(a, axis_attr(n, "axis", -1, a->rank), &outer, &len, &inner);
	for (int64_t p = 0; p < outer; p++)
		for (int64_t q = 0; q < inner; q++) {
			int64_t base = p * len * inner + q;
			float facc = 0;
			int32_t iacc = 0;
			for (int64_t j = 0; j < len; j++) {
				int64_t e = base + j * inner;
				if (is_f(a->dtype)) {
					if (excl)
						out->f[e] = rnd(n->dtype, facc);
					float v = x->f[e];
					facc = j ? facc + v : v;
					if (!excl)
						out->f[e] = rnd(n->dtype, facc);
				} else {
					if (excl)
						out->i[e] = iacc;
					iacc = i32_wrap((uint32_t)iacc + (uint32_t)x->i[e]);
					if (!excl)
						out->i[e] = iacc;
				}
			}
		}
	return MOE_OK;
}

/* ---- einsum ---- */
static moe_status ev_einsum(interp *ip, val *out)
{
	const ir_node *n = ip->n;
	ir_einsum e;
	char msg[160];
	bool ok = ir_einsum_parse(ir_attr_str(n, "eq", NULL), &e, msg, sizeof msg);
	IR_ASSERT(ok); /* verified */
	int64_t size[26] = {0}, pos[26] = {0};
	const ir_node *an[2];
	const val *av[2];
	for (int j = 0; j < e.nin; j++) {
		an[j] = arg_node(ip, (uint32_t)j);
		av[j] = arg_val(ip, (uint32_t)j);
		for (int d = 0; d < e.rank[j]; d++)
			size[e.in[j][d] - 'a'] = an[j]->shape[d];
	}
	/* summed letters, in first-seen order: the summation is row-major over them */
	char sum[26];
	int nsum = 0;
	int64_t ssize[26];
	for (int l = 0; l < e.nletters; l++)
		if (!memchr(e.out, e.letters[l], (size_t)e.out_rank)) {
			sum[nsum] = e.letters[l];
			ssize[nsum++] = size[e.letters[l] - 'a'];
		}
	bool fl = is_f(an[0]->dtype);
	int64_t idx[MOE_MAX_RANK] = {0};
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		if (!computed(ip, idx))
			continue;
		for (int d = 0; d < e.out_rank; d++)
			pos[e.out[d] - 'a'] = idx[d];
		int64_t sidx[26] = {0};
		float facc = 0;
		int32_t iacc = 0;
		bool first = true;
		do {
			for (int s = 0; s < nsum; s++)
				pos[sum[s] - 'a'] = sidx[s];
			int64_t off[2] = {0, 0};
			for (int j = 0; j < e.nin; j++) {
				off[j] = 0;
				for (int d = 0; d < e.rank[j]; d++)
					off[j] = off[j] * an[j]->shape[d] + pos[e.in[j][d] - 'a'];
			}
			if (fl) {
				float p = av[0]->f[off[0]];
				if (e.nin == 2)
					p = p * av[1]->f[off[1]];
				facc = first ? p : facc + p;
			} else {
				uint32_t p = (uint32_t)av[0]->i[off[0]];
				if (e.nin == 2)
					p *= (uint32_t)av[1]->i[off[1]];
				iacc = i32_wrap(first ? p : (uint32_t)iacc + p);
			}
			first = false;
		} while (next_index(sidx, ssize, nsum));
		if (fl)
			out->f[o] = rnd(n->dtype, facc);
		else
			out->i[o] = iacc;
	}
	return MOE_OK;
}

/* ---- routing primitives ---- */
/* Does element (a, ia) rank above (b, ib)? NaN above all numbers, -0 == +0,
 * ties to the lower index. */
static bool f_ranks_above(float a, int64_t ia, float b, int64_t ib)
{
	if (isnan(a) || isnan(b)) {
		if (isnan(a) && isnan(b))
			return ia < ib;
		return isnan(a);
	}
	if (a != b)
		return a > b;
	return ia < ib;
}

static moe_status ev_topk(interp *ip, val *out)
{
	const ir_node *n = ip->n, *a = arg_node(ip, 0);
	const val *x = arg_val(ip, 0);
	int64_t len = a->shape[a->rank - 1], k = n->shape[n->rank - 1], rows = x->n / len;
	bool *taken = ctx_alloc(ip->ctx, (size_t)len * sizeof *taken);
	for (int64_t r = 0; r < rows; r++) {
		memset(taken, 0, (size_t)len * sizeof *taken);
		for (int64_t s = 0; s < k; s++) {
			int64_t best = -1;
			for (int64_t j = 0; j < len; j++) {
				if (taken[j])
					continue;
				int64_t e = r * len + j, b = r * len + best;
				bool above = best < 0 ||
					(is_f(a->dtype) ? f_ranks_above(x->f[e], j, x->f[b], best) :
							  x->i[e] > x->i[b] || (x->i[e] == x->i[b] && j < best));
				if (above)
					best = j;
			}
			taken[best] = true;
			out->i[r * k + s] = (int32_t)best;
		}
	}
	ctx_free(ip->ctx, taken, (size_t)len * sizeof *taken);
	return MOE_OK;
}

static moe_status ev_one_hot(interp *ip, val *out)
{
	const val *x = arg_val(ip, 0);
	int64_t depth = ip->n->shape[ip->n->rank - 1];
	for (int64_t p = 0; p < x->n; p++)
		for (int64_t j = 0; j < depth; j++)
			out->i[p * depth + j] = x->i[p] == j;
	return MOE_OK;
}

static moe_status ev_filter(interp *ip, val *out)
{
	const ir_node *n = ip->n;
	const val *m = arg_val(ip, 0), *x = arg_val(ip, 1);
	float ffill = 0;
	int32_t ifill = 0;
	moe_status st = attr_value(ip, "fill", n->dtype, 0, &ffill, &ifill);
	if (st)
		return st;
	int64_t len = n->shape[n->rank - 1], rows = out->n / len;
	for (int64_t r = 0; r < rows; r++) {
		int64_t w = r * len;
		for (int64_t j = r * len; j < (r + 1) * len; j++) {
			if (!m->i[j])
				continue;
			if (out->f)
				out->f[w++] = x->f[j];
			else
				out->i[w++] = x->i[j];
		}
		for (; w < (r + 1) * len; w++) {
			if (out->f)
				out->f[w] = ffill;
			else
				out->i[w] = ifill;
		}
	}
	return MOE_OK;
}

static moe_status index_fault(interp *ip, int32_t v, int64_t bound, const int64_t *at, int rank, const char *what)
{
	char s[128];
	fmt_index(s, sizeof s, at, rank);
	return fault(ip, "index %d at %s of the %s is outside [0, %lld)", v, s, what, (long long)bound);
}

static moe_status ev_gather(interp *ip, val *out)
{
	const ir_node *n = ip->n, *xn = arg_node(ip, 0), *in = arg_node(ip, 1);
	const val *x = arg_val(ip, 0), *iv = arg_val(ip, 1);
	int ax = axis_attr(n, "axis", 0, xn->rank);
	int64_t idx[MOE_MAX_RANK] = {0}, src[MOE_MAX_RANK];
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		if (!computed(ip, idx))
			continue;
		int32_t j = iv->i[offset_of(idx + ax, in->shape, in->rank)];
		if (j < 0 || j >= xn->shape[ax])
			return index_fault(ip, j, xn->shape[ax], idx + ax, in->rank, "indices");
		for (int d = 0; d < ax; d++)
			src[d] = idx[d];
		src[ax] = j;
		for (int d = ax + 1; d < xn->rank; d++)
			src[d] = idx[d - 1 + in->rank];
		int64_t s = offset_of(src, xn->shape, xn->rank);
		if (out->f)
			out->f[o] = x->f[s];
		else
			out->i[o] = x->i[s];
	}
	return MOE_OK;
}

static moe_status ev_take_along(interp *ip, val *out)
{
	const ir_node *n = ip->n, *xn = arg_node(ip, 0);
	const val *x = arg_val(ip, 0), *iv = arg_val(ip, 1);
	int ax = axis_attr(n, "axis", -1, xn->rank);
	int64_t idx[MOE_MAX_RANK] = {0}, src[MOE_MAX_RANK];
	int64_t nout = n->valid == MOE_NONE || !n->shape[0] ? out->n
		: interp_rows_below(out->f, out->i, out->n, n->shape[0], ip->v[n->valid].i[0]) * (out->n / n->shape[0]);
	for (int64_t o = 0; o < nout; o++, next_index(idx, n->shape, n->rank)) {
		int32_t j = iv->i[o];
		if (j < 0 || j >= xn->shape[ax])
			return index_fault(ip, j, xn->shape[ax], idx, n->rank, "indices");
		memcpy(src, idx, sizeof src);
		src[ax] = j;
		int64_t s = offset_of(src, xn->shape, xn->rank);
		if (out->f)
			out->f[o] = x->f[s];
		else
			out->i[o] = x->i[s];
	}
	return MOE_OK;
}

static moe_status ev_scatter(interp *ip, val *out)
{
	const ir_node *n = ip->n, *in = arg_node(ip, 1);
	const val *base = arg_val(ip, 0), *iv = arg_val(ip, 1), *src = arg_val(ip, 2);
	bool add = !strcmp(ir_attr_str(n, "mode", "set"), "add");
	int64_t row = out->n / n->shape[0];
	if (out->f)
		memcpy(out->f, base->f, (size_t)out->n * sizeof *out->f);
	else
		memcpy(out->i, base->i, (size_t)out->n * sizeof *out->i);
	int64_t idx[MOE_MAX_RANK] = {0}, v = n->valid != MOE_NONE ? ip->v[n->valid].i[0] : iv->n; /* index rows applied */
	int64_t np = in->rank < 1 || !in->shape[0] ? iv->n
		: (v < 0 ? 0 : v > in->shape[0] ? in->shape[0] : v) * (iv->n / in->shape[0]);
	for (int64_t p = 0; p < np; p++, next_index(idx, in->shape, in->rank)) {
		int32_t r = iv->i[p];
		if (r < 0 || r >= n->shape[0])
			return index_fault(ip, r, n->shape[0], idx, in->rank, "indices");
		for (int64_t q = 0; q < row; q++) {
			int64_t d = r * row + q, s = p * row + q;
			if (out->f)
				out->f[d] = add ? out->f[d] + src->f[s] : src->f[s];
			else
				out->i[d] = add ? i32_wrap((uint32_t)out->i[d] + (uint32_t)src->i[s]) : src->i[s];
		}
	}
	if (out->f) /* additions accumulate in f32 and round once */
		for (int64_t o = 0; o < out->n; o++)
			out->f[o] = rnd(n->dtype, out->f[o]);
	return MOE_OK;
}

/* ---- shape manipulation ---- */
static void copy_elem(val *out, int64_t o, const val *x, int64_t s)
{
	if (out->f)
		out->f[o] = x->f[s];
	else
		out->i[o] = x->i[s];
}

static moe_status ev_reshape(interp *ip, val *out)
{
	const val *x = arg_val(ip, 0);
	for (int64_t o = 0; o < out->n; o++)
		copy_elem(out, o, x, o);
	return MOE_OK;
}

static moe_status ev_slice(interp *ip, val *out)
{
	const ir_node *n = ip->n, *xn = arg_node(ip, 0);
	const val *x = arg_val(ip, 0);
	int ax = axis_attr(n, "axis", 0, xn->rank);
	int64_t start = ir_attr_int(n, "start", 0), step = ir_attr_int(n, "step", 1);
	int64_t idx[MOE_MAX_RANK] = {0}, src[MOE_MAX_RANK];
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		memcpy(src, idx, sizeof src);
		src[ax] = start + idx[ax] * step;
		copy_elem(out, o, x, offset_of(src, xn->shape, xn->rank));
	}
	return MOE_OK;
}

static moe_status ev_concat(interp *ip, val *out)
{
	const ir_node *n = ip->n;
	int ax = axis_attr(n, "axis", 0, n->rank);
	int64_t idx[MOE_MAX_RANK] = {0}, src[MOE_MAX_RANK];
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		memcpy(src, idx, sizeof src);
		uint32_t j = 0;
		while (src[ax] >= arg_node(ip, j)->shape[ax]) {
			src[ax] -= arg_node(ip, j)->shape[ax];
			j++;
		}
		const ir_node *a = arg_node(ip, j);
		copy_elem(out, o, arg_val(ip, j), offset_of(src, a->shape, a->rank));
	}
	return MOE_OK;
}

static moe_status ev_broadcast(interp *ip, val *out)
{
	const ir_node *n = ip->n, *a = arg_node(ip, 0);
	int64_t idx[MOE_MAX_RANK] = {0};
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank))
		copy_elem(out, o, arg_val(ip, 0), bcast_offset(a, idx, n->rank));
	return MOE_OK;
}

/* ---- experts: token-centric MoE FFN ---- */

/* h(g, u) in f32, as the sequence of f32 ops given in docs/ir.md (with the
 * NaN rule of ir/scalar.h); the caller rounds the result to the node dtype once. */
static float activation(int act, float g, float u, float alpha, float limit)
{
	switch (act) {
	case IR_ACT_SWIGLU: {
		float s = f_sigmoid(g);
		float a = sc_fmul(g, s);
		return sc_fmul(a, u);
	}
	case IR_ACT_GEGLU: {
		float half = sc_fmul(g, 0.5f);
		float z = sc_fmul(g, 0.70710678118654752f); /* 1/sqrt(2) */
		float t = (float)erf((double)z);
		float one = sc_fadd(1.0f, t);
		float a = sc_fmul(half, one);
		return sc_fmul(a, u);
	}
	case IR_ACT_GEGLU_TANH: {
		float g2 = sc_fmul(g, g);
		float g3 = sc_fmul(g2, g);
		float c = sc_fmul(0.044715f, g3);
		float in = sc_fadd(g, c);
		float z = sc_fmul(0.79788456080286536f, in); /* sqrt(2/pi) */
		float t = (float)tanh((double)z);
		float one = sc_fadd(1.0f, t);
		float half = sc_fmul(g, 0.5f);
		float a = sc_fmul(half, one);
		return sc_fmul(a, u);
	}
	case IR_ACT_GPT_OSS: {
		float gc = sc_fmin(g, limit);
		float uc = sc_fmax(sc_fmin(u, limit), -limit);
		float z = sc_fmul(gc, alpha);
		float s = f_sigmoid(z);
		float glu = sc_fmul(gc, s);
		float u1 = sc_fadd(uc, 1.0f);
		return sc_fmul(u1, glu);
	}
	case IR_ACT_RELU2: {
		float r = sc_fmax(u, 0.0f);
		return sc_fmul(r, r);
	}
	default: return u;
	}
}

/* One projection row: sum_j w[j] * v[j] in f32, index order, rounded to t;
 * then + bias, rounded again (an einsum followed by an add). */
static float project(int t, const float *w, const float *v, int64_t n, const float *bias)
{
	float acc = 0;
	for (int64_t j = 0; j < n; j++) {
		float p = w[j] * v[j];
		acc = j ? acc + p : p;
	}
	acc = rnd(t, acc);
	if (bias)
		acc = rnd(t, sc_fadd(acc, *bias));
	return acc;
}

static const float *opt_f(const interp *ip, int slot)
{
	moe_id a = ip->n->args[slot];
	return a == MOE_NONE ? NULL : ip->v[a].f;
}

static moe_status ev_experts(interp *ip, val *out)
{
	const ir_node *n = ip->n;
	const ir_node *upn = arg_node(ip, EXP_UP);
	int t = n->dtype;
	int64_t T = n->shape[0], D = n->shape[1], K = arg_node(ip, EXP_IDX)->shape[1];
	int64_t E = upn->shape[0], F = upn->shape[1];
	const float *x = arg_val(ip, EXP_X)->f, *w = arg_val(ip, EXP_W)->f;
	const int32_t *idx = arg_val(ip, EXP_IDX)->i;
	const float *gate = opt_f(ip, EXP_GATE), *up = opt_f(ip, EXP_UP), *down = opt_f(ip, EXP_DOWN);
	const float *bg = opt_f(ip, EXP_B_GATE), *bu = opt_f(ip, EXP_B_UP), *bd = opt_f(ip, EXP_B_DOWN);
	ir_act act = ir_node_act(n);
	float alpha = (float)ir_attr_float(n, "alpha", 1.702), limit = (float)ir_attr_float(n, "limit", 7.0);
	bool on_input = !strcmp(ir_attr_str(n, "weight_on", "output"), "input");

	size_t fsz = (size_t)F * sizeof(float), dsz = (size_t)D * sizeof(float);
	float *xin = ctx_alloc(ip->ctx, dsz), *acc = ctx_alloc(ip->ctx, dsz), *h = ctx_alloc(ip->ctx, fsz);
	moe_status st = MOE_OK;
	if (ip->ntok >= 0 && ip->ntok < T) { /* serving: later rows are not routed and are 0 */
		memset(out->f + ip->ntok * D, 0, (size_t)((T - ip->ntok) * D) * sizeof(float));
		T = ip->ntok;
	}
	for (int64_t ti = 0; ti < T && !st; ti++) {
		for (int64_t k = 0; k < K; k++) {
			int32_t e = idx[ti * K + k];
			if (e < 0 || e >= E) {
				int64_t at[2] = {ti, k};
				st = index_fault(ip, e, E, at, 2, "expert indices idx");
				break;
			}
			float wk = w[ti * K + k];
			for (int64_t d = 0; d < D; d++) {
				float xv = x[ti * D + d];
				xin[d] = on_input ? rnd(t, sc_fmul(xv, wk)) : xv;
			}
			for (int64_t f = 0; f < F; f++) {
				int64_t row = (e * F + f) * D;
				float u = project(t, up + row, xin, D, bu ? &bu[e * F + f] : NULL);
				float g = gate ? project(t, gate + row, xin, D, bg ? &bg[e * F + f] : NULL) : 0;
				h[f] = rnd(t, activation(act, g, u, alpha, limit));
			}
			for (int64_t d = 0; d < D; d++) {
				float o = project(t, down + (e * D + d) * F, h, F, bd ? &bd[e * D + d] : NULL);
				float term = on_input ? o : sc_fmul(o, wk);
				acc[d] = k ? sc_fadd(acc[d], term) : term;
			}
		}
		for (int64_t d = 0; d < D && !st; d++)
			out->f[ti * D + d] = rnd(t, acc[d]);
	}
	ctx_free(ip->ctx, xin, dsz);
	ctx_free(ip->ctx, acc, dsz);
	ctx_free(ip->ctx, h, fsz);
	return st;
}

/* ---- driver ---- */
/* dequant: every element from its packed value and scale (ir/quant.h), rounded
 * once to the result type; rows past a scalar valid mask are 0. */
static moe_status ev_dequant(interp *ip, val *out)
{
	const ir_node *n = ip->n, *qn = arg_node(ip, 0), *sn = arg_node(ip, 1);
	const val *q = arg_val(ip, 0), *s = arg_val(ip, 1);
	qt_info qi;
	IR_ASSERT(ir_dequant_info(ip->g, n, &qi));
	int r = n->rank;
	int64_t idx[MOE_MAX_RANK] = {0}, qi_[MOE_MAX_RANK], si[MOE_MAX_RANK];
	for (int64_t o = 0; o < out->n; o++, next_index(idx, n->shape, n->rank)) {
		if (!computed(ip, idx)) {
			out->f[o] = 0;
			continue;
		}
		memcpy(qi_, idx, sizeof qi_);
		memcpy(si, idx, sizeof si);
		int64_t row = idx[r - 2], k = idx[r - 1];
		if (qi.fmt == QT_AWQ || qi.fmt == QT_GPTQ) { /* q, s, z (and g) of ir/quant.h */
			const val *z = arg_val(ip, 2);
			const ir_node *zn = arg_node(ip, 2);
			int64_t grp = k / qi.bk, gix[MOE_MAX_RANK];
			if (qi.fmt == QT_GPTQ) {
				memcpy(gix, idx, sizeof gix);
				gix[r - 2] = k;
				grp = arg_val(ip, 3)->i[offset_of(gix, arg_node(ip, 3)->shape, r - 1)];
				if (grp < 0 || grp >= sn->shape[r - 2])
					return fault(ip, "dequant: g_idx[%lld] = %lld is outside the %lld groups", (long long)k,
						(long long)grp, (long long)sn->shape[r - 2]);
			}
			bool gq = qi.fmt == QT_GPTQ;
			qi_[r - 2] = gq ? k / 8 : k;
			qi_[r - 1] = gq ? row : row / 8;
			uint32_t qw = (uint32_t)q->i[offset_of(qi_, qn->shape, r)];
			si[r - 2] = grp;
			si[r - 1] = row;
			float sc = s->f[offset_of(si, sn->shape, r)];
			si[r - 1] = row / 8;
			uint32_t zw = (uint32_t)z->i[offset_of(si, zn->shape, r)];
			out->f[o] = rnd(n->dtype, gq ? qt_gptq(qw, k, zw, row, ir_attr_int(n, "zp", 1), sc) : qt_awq(qw, zw, row, sc));
			continue;
		}
		qi_[r - 1] = k / qt_pack(qi.fmt);
		si[r - 2] = row / qi.bn;
		si[r - 1] = k / qi.bk;
		uint32_t raw = (uint32_t)q->i[offset_of(qi_, qn->shape, r)];
		int64_t so = offset_of(si, sn->shape, r);
		float v = qi.fmt == QT_NVFP4 ? qt_nvfp4(raw, k, (uint32_t)s->i[so], arg_val(ip, 2)->f[o / (qi.N * qi.K)],
							!strcmp(ir_attr_str(n, "gscale", "div"), "div"))
					     : qt_value(qi.fmt, raw, k, s->f ? s->f[so] : 0.0f, s->i ? (uint32_t)s->i[so] : 0u);
		out->f[o] = rnd(n->dtype, v);
	}
	return MOE_OK;
}

/* all_to_all: rows [0, sum counts) of x grouped by destination go to their
 * devices; the result holds the rows received, in device order, then zeros. */
static moe_status ev_all_to_all(interp *ip, val *out)
{
	const ir_node *n = ip->n, *x = arg_node(ip, 0);
	const val *xv = arg_val(ip, 0), *cv = arg_val(ip, 1);
	int64_t ep = ir_attr_int(n, "ep", 1), rows = n->shape[0], S = x->shape[0];
	int64_t width = S ? xv->n / S : 0, sum = 0;
	int64_t counts[4096];
	for (int64_t j = 0; j < ep; j++) {
		counts[j] = cv->i[j];
		if (counts[j] < 0 || counts[j] > S - sum)
			return fault(ip, "all_to_all: counts[%lld] = %d: the counts must be >= 0 and sum to at most the %lld rows "
				"of the send buffer", (long long)j, cv->i[j], (long long)S);
		sum += counts[j];
	}
	const void *src = xv->f ? (const void *)xv->f : (const void *)xv->i;
	void *dst = out->f ? (void *)out->f : (void *)out->i;
	size_t rb = (size_t)width * 4;
	if (out->n)
		memset(dst, 0, (size_t)out->n * 4);
	int64_t got = 0;
	if (!ip->x || ip->x->ep == 1) {
		if (ep != 1)
			return fault(ip, "all_to_all over %lld devices needs an expert-parallel run (moec run --ep %lld under "
				"mpirun, or moe_ep_sim_run)", (long long)ep, (long long)ep);
		got = counts[0];
		if (got > rows)
			return fault(ip, "all_to_all: %lld rows received, more than the %lld the buffer holds", (long long)got,
				(long long)rows);
		if (got)
			memcpy(dst, src, (size_t)got * rb);
		return MOE_OK;
	}
	if (ip->x->ep != ep)
		return fault(ip, "all_to_all: the program exchanges over %lld devices but runs on %d", (long long)ep,
			ip->x->ep);
	moe_status st = ip->x->all_to_all(ip->x->ud, ip->ctx, src, counts, rb, dst, rows, &got);
	if (st == MOE_OK && got > rows)
		return fault(ip, "all_to_all: %lld rows received, more than the %lld the buffer holds", (long long)got,
			(long long)rows);
	return st;
}

#define val_free interp_val_free
#define val_alloc interp_val_alloc

/* Checks a binding against its leaf node; diagnostics at the node. */
static bool check_binding(moe_ctx *ctx, const moe_graph *g, moe_id id, const moe_tensor *t)
{
	const ir_node *n = N(g, id);
	const char *kind = ir_ops[n->op].name;
	if (!t) {
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "no tensor is bound to %s '%s' (%%%u)", kind, n->name, id);
		return false;
	}
	bool same = t->dtype == (moe_dtype)n->dtype && t->rank == n->rank;
	for (int d = 0; same && d < n->rank; d++)
		same = t->shape[d] == n->shape[d];
	if (!same) {
		char want[160], got[160];
		fmt_type(want, sizeof want, n->dtype, n->rank, n->shape);
		fmt_type(got, sizeof got, t->dtype, t->rank < 0 || t->rank > MOE_MAX_RANK ? 0 : t->rank, t->shape);
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "%s '%s' (%%%u) is %s but the tensor bound to it is %s", kind, n->name,
			id, want, got);
		return false;
	}
	if (!t->data || t->nbytes != (size_t)ir_bytes(n)) {
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "the tensor bound to %s '%s' (%%%u) holds %zu bytes, not %lld", kind,
			n->name, id, t->data ? t->nbytes : 0, (long long)ir_bytes(n));
		return false;
	}
	return true;
}

#define load_binding interp_load_binding
#define store_output interp_store_output

static moe_status eval_node(interp *ip, val *out)
{
	switch ((moe_op)ip->n->op) {
	case MOE_OP_CONST: return ev_const(ip, out);
	case MOE_OP_IOTA: return ev_iota(ip, out);
	case MOE_OP_CAST: return ev_cast(ip, out);
	case MOE_OP_BITCAST: return ev_bitcast(ip, out);
	case MOE_OP_REDUCE_SUM:
	case MOE_OP_REDUCE_MAX:
	case MOE_OP_REDUCE_MIN: return ev_reduce(ip, out);
	case MOE_OP_SOFTMAX: return ev_softmax(ip, out);
	case MOE_OP_CUMSUM: return ev_cumsum(ip, out);
	case MOE_OP_EINSUM: return ev_einsum(ip, out);
	case MOE_OP_TOPK: return ev_topk(ip, out);
	case MOE_OP_ONE_HOT: return ev_one_hot(ip, out);
	case MOE_OP_FILTER: return ev_filter(ip, out);
	case MOE_OP_GATHER: return ev_gather(ip, out);
	case MOE_OP_TAKE_ALONG: return ev_take_along(ip, out);
	case MOE_OP_SCATTER: return ev_scatter(ip, out);
	case MOE_OP_RESHAPE: return ev_reshape(ip, out);
	case MOE_OP_SLICE: return ev_slice(ip, out);
	case MOE_OP_CONCAT: return ev_concat(ip, out);
	case MOE_OP_BROADCAST: return ev_broadcast(ip, out);
	case MOE_OP_EXPERTS: return ev_experts(ip, out);
	case MOE_OP_DEQUANT: return ev_dequant(ip, out);
	case MOE_OP_ALL_TO_ALL: return ev_all_to_all(ip, out);
	case MOE_OP_BLOCK_LOOP: return interp_block_loop(ip->ctx, ip->g, ip->id, ip->v, ip->x, out);
	default:
		IR_ASSERT(ir_ops[ip->n->op].flags & OPF_ELEM);
		return ev_elem(ip, out);
	}
}

static moe_status interp_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_tensor **out)
{
	return moe_interp_run_ex(ctx, g, bind, NULL, out);
}

moe_status moe_interp_run_ex(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const moe_exchange *x,
	moe_tensor **out)
{
	if (!ctx || !g || !out)
		return MOE_ERR_INVALID;
	moe_status st = moe_graph_verify(ctx, g);
	for (uint32_t i = 0; st && i < g->nout; i++)
		out[i] = NULL;
	return st ? st : ir_interp_run_verified(ctx, g, bind, x, out);
}

static moe_status run_nodes(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const val *args,
	const moe_exchange *x, int64_t ntok, val *res);

moe_status ir_interp_run_verified(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	const moe_exchange *x, moe_tensor **out)
{
	moe_status st = MOE_OK;
	for (uint32_t i = 0; i < g->nout; i++)
		out[i] = NULL;
	uint32_t nn = g->nnodes;
	for (moe_id id = 0; id < nn; id++) {
		int t = N(g, id)->dtype;
		if (t == MOE_I8) { /* reserved */
			moe_diag(ctx, MOE_DIAG_ERROR, N(g, id)->loc, "%%%u: type %s is reserved and not supported yet", id,
				moe_dtype_name((moe_dtype)t));
			return MOE_ERR_UNSUPPORTED;
		}
	}

	/* bindings: every input and weight, by node name */
	bool bound = true;
	for (moe_id id = 0; id < nn; id++) {
		const ir_node *n = N(g, id);
		if (n->op == MOE_OP_INPUT || n->op == MOE_OP_WEIGHT)
			bound &= check_binding(ctx, g, id, moe_tensor_map_get(bind, n->name));
	}
	if (!bound)
		return MOE_ERR_INVALID;
	int64_t ntok;
	if ((st = moe_tokens_check(ctx, g, bind, &ntok)) != MOE_OK)
		return st;

	val *res = ctx_alloc(ctx, (size_t)(g->nout ? g->nout : 1) * sizeof *res);
	st = run_nodes(ctx, g, bind, NULL, x, ntok, res);
	for (uint32_t i = 0; i < g->nout && !st; i++) {
		out[i] = store_output(ctx, N(g, g->outputs[i]), &res[i]);
		if (!out[i])
			st = MOE_ERR_NOMEM;
	}
	if (st)
		for (uint32_t i = 0; i < g->nout; i++) {
			moe_tensor_free(ctx, out[i]);
			out[i] = NULL;
		}
	for (uint32_t i = 0; i < g->nout; i++)
		val_free(ctx, &res[i]);
	ctx_free(ctx, res, (size_t)(g->nout ? g->nout : 1) * sizeof *res);
	return st;
}

moe_status interp_run_body(moe_ctx *ctx, const moe_graph *body, const val *args, const moe_exchange *x, val *res)
{
	return run_nodes(ctx, body, NULL, args, x, -1, res);
}

/* Evaluates what g's outputs need (inputs and weights from bind, blockargs
 * from args) and copies each output's value into res[i]; every other value
 * is freed after its last use. */
static moe_status run_nodes(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const val *args,
	const moe_exchange *x, int64_t ntok, val *res)
{
	moe_status st = MOE_OK;
	uint32_t nn = g->nnodes;
	/* liveness: evaluate what the outputs need, free values after their last use */
	uint32_t *last = ctx_alloc(ctx, (size_t)nn * sizeof *last);
	bool *live = ctx_alloc(ctx, (size_t)nn * sizeof *live);
	for (uint32_t i = 0; i < g->nout; i++) {
		live[g->outputs[i]] = true;
		last[g->outputs[i]] = nn;
	}
	for (moe_id id = nn; id-- > 0;) {
		const ir_node *n = N(g, id);
		if (!live[id])
			continue;
		for (uint32_t j = 0; j < n->nargs; j++)
			if (n->args[j] != MOE_NONE)
				live[n->args[j]] = true;
		if (n->valid != MOE_NONE)
			live[n->valid] = true;
	}
	for (moe_id id = 0; id < nn; id++) {
		const ir_node *n = N(g, id);
		if (!live[id])
			continue;
		for (uint32_t j = 0; j < n->nargs; j++)
			if (n->args[j] != MOE_NONE && last[n->args[j]] < nn)
				last[n->args[j]] = id;
		if (n->valid != MOE_NONE && last[n->valid] < nn)
			last[n->valid] = id;
	}

	interp ip = {ctx, g, ctx_alloc(ctx, (size_t)nn * sizeof(val)), x, 0, NULL, ntok};
	for (moe_id id = 0; id < nn && !st; id++) {
		if (!live[id])
			continue;
		ip.id = id;
		ip.n = N(g, id);
		val *v = &ip.v[id];
		if (ir_numel(ip.n) > PTRDIFF_MAX / 8) {
			moe_diag(ctx, MOE_DIAG_ERROR, ip.n->loc, "%%%u %s: %lld elements are too many to interpret", id,
				ir_ops[ip.n->op].name, (long long)ir_numel(ip.n));
			st = MOE_ERR_NOMEM;
			break;
		}
		if (!val_alloc(ctx, v, ip.n)) {
			moe_diag(ctx, MOE_DIAG_ERROR, ip.n->loc, "%%%u %s: out of memory allocating %lld elements", id,
				ir_ops[ip.n->op].name, (long long)ir_numel(ip.n));
			st = MOE_ERR_NOMEM;
			break;
		}
		if (ip.n->op == MOE_OP_INPUT || ip.n->op == MOE_OP_WEIGHT)
			load_binding(v, moe_tensor_map_get(bind, ip.n->name));
		else if (ip.n->op == MOE_OP_BLOCKARG)
			memcpy(v->f ? (void *)v->f : (void *)v->i, args[id].f ? (void *)args[id].f : (void *)args[id].i,
				(size_t)v->n * 4);
		else
			st = eval_node(&ip, v);
		for (uint32_t j = 0; j < ip.n->nargs; j++) {
			moe_id a = ip.n->args[j];
			if (a != MOE_NONE && last[a] == id)
				val_free(ctx, &ip.v[a]);
		}
		if (ip.n->valid != MOE_NONE && last[ip.n->valid] == id)
			val_free(ctx, &ip.v[ip.n->valid]);
	}
	for (uint32_t i = 0; i < g->nout && !st; i++) {
		const val *o = &ip.v[g->outputs[i]];
		if (!val_alloc(ctx, &res[i], N(g, g->outputs[i]))) {
			moe_diag(ctx, MOE_DIAG_ERROR, N(g, g->outputs[i])->loc, "output %u: out of memory allocating %lld elements",
				i, (long long)o->n);
			st = MOE_ERR_NOMEM;
		} else if (o->n)
			memcpy(res[i].f ? (void *)res[i].f : (void *)res[i].i, o->f ? (void *)o->f : (void *)o->i,
				(size_t)o->n * 4);
	}
	if (st)
		for (uint32_t i = 0; i < g->nout; i++)
			val_free(ctx, &res[i]);
	for (moe_id id = 0; id < nn; id++)
		val_free(ctx, &ip.v[id]);
	ctx_free(ctx, ip.v, (size_t)nn * sizeof(val));
	ctx_free(ctx, last, (size_t)nn * sizeof *last);
	ctx_free(ctx, live, (size_t)nn * sizeof *live);
	return st;
}

static moe_status interp_run_guarded(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_tensor **out)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, interp_run(ctx, g, bind, out));
}

moe_status moe_interp_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_tensor **out)
{
	if (!ctx)
		return MOE_ERR_INVALID;
	moe_status s = interp_run_guarded(ctx, g, bind, out);
	if (s == MOE_ERR_NOMEM && g && out) /* the outputs were freed with the rest */
		for (uint32_t i = 0; i < g->nout; i++)
			out[i] = NULL;
	return s;
}
