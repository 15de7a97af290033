/* interp/interp_util.c: deterministic random bindings and output comparison,
 * used by tests and by pass checks (run a graph before and after a pass). */
#include <math.h>
#include <string.h>

#include "interp/interp.h"

/* ---- deterministic random numbers (splitmix64) ---- */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/* [0, n) */
static int64_t rng_below(uint64_t *s, int64_t n)
{
	return (int64_t)(rng_next(s) % (uint64_t)n);
}

/* Mean 0, variance 1, bounded by 2 sqrt(3): a sum of four uniforms. */
static float rng_normalish(uint64_t *s)
{
	double u = rng_uniform(s) + rng_uniform(s) + rng_uniform(s) + rng_uniform(s) - 2.0;
	return (float)(u * sqrt(3.0));
}

static uint64_t hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 1099511628211ull;
	}
	return h;
}

/* Range for an i32 leaf from its direct uses: [lo, hi), or distinct experts. */
typedef struct irange {
	int64_t lo, hi;
	int64_t experts; /* > 0: rows of distinct values in [0, experts) */
} irange;

static irange leaf_range(const moe_graph *g, moe_id leaf)
{
	irange r = {-8, 8, 0};
	bool index = false;
	for (moe_id id = leaf + 1; id < g->nnodes; id++) {
		const ir_node *n = N(g, id);
		int64_t hi = -1; /* exclusive bound from this use, if it is an index use */
		if (n->valid == leaf)
			hi = (N(g, leaf)->rank == 0 ? n->shape[0] : n->shape[1]) + 1;
		for (uint32_t j = 0; j < n->nargs; j++) {
			if (n->args[j] != leaf)
				continue;
			const ir_node *x = N(g, n->args[0]);
			int64_t b = -1;
			if (n->op == MOE_OP_GATHER && j == 1)
				b = x->shape[ir_norm_axis((int)ir_attr_int(n, "axis", 0), x->rank)];
			else if (n->op == MOE_OP_TAKE_ALONG && j == 1)
				b = x->shape[ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank)];
			else if (n->op == MOE_OP_SCATTER && j == 1)
				b = x->shape[0];
			else if (n->op == MOE_OP_EXPERTS && j == EXP_IDX) {
				int64_t e = N(g, n->args[EXP_UP])->shape[0];
				if (!r.experts || e < r.experts)
					r.experts = e;
			}
			if (b > 0 && (hi < 0 || b < hi))
				hi = b;
		}
		if (hi <= 0)
			continue;
		if (!index || hi < r.hi)
			r.hi = hi;
		r.lo = 0;
		index = true;
	}
	if (r.experts > 0 && (!index || r.hi >= r.experts))
		return (irange){0, r.experts, r.experts};
	r.experts = 0;
	return r;
}

static moe_tensor *random_tensor(moe_ctx *ctx, const moe_graph *g, moe_id id, uint64_t seed)
{
	const ir_node *n = N(g, id);
	moe_tensor *t = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
	if (!t)
		return NULL;
	uint64_t s = seed ^ hash_name(n->name);
	int64_t cnt = ir_numel(n);
	switch (n->dtype) {
	case MOE_F32:
		for (int64_t i = 0; i < cnt; i++)
			((float *)t->data)[i] = rng_normalish(&s);
		break;
	case MOE_BF16:
		for (int64_t i = 0; i < cnt; i++)
			((uint16_t *)t->data)[i] = moe_f32_to_bf16(rng_normalish(&s));
		break;
	case MOE_BOOL:
		for (int64_t i = 0; i < cnt; i++)
			((unsigned char *)t->data)[i] = (unsigned char)(rng_next(&s) & 1);
		break;
	case MOE_F8E4M3: /* raw bytes of a quantized weight: every code (NaN codes too) */
	case MOE_U8:
		for (int64_t i = 0; i < cnt; i++)
			((unsigned char *)t->data)[i] = (unsigned char)rng_next(&s);
		break;
	case MOE_I32: {
		irange r = leaf_range(g, id);
		int32_t *p = t->data;
		if (r.experts > 0 && n->rank == 2 && n->shape[1] <= r.experts) {
			int64_t E = r.experts, K = n->shape[1];
			int32_t *perm = ctx_alloc(ctx, (size_t)E * sizeof *perm);
			for (int64_t row = 0; row < n->shape[0]; row++) {
				for (int64_t e = 0; e < E; e++)
					perm[e] = (int32_t)e;
				for (int64_t k = 0; k < K; k++) { /* partial Fisher-Yates */
					int64_t j = k + rng_below(&s, E - k);
					int32_t tmp = perm[k];
					perm[k] = perm[j];
					perm[j] = tmp;
					p[row * K + k] = perm[k];
				}
			}
			ctx_free(ctx, perm, (size_t)E * sizeof *perm);
		} else {
			for (int64_t i = 0; i < cnt; i++)
				p[i] = (int32_t)(r.lo + rng_below(&s, r.hi - r.lo));
		}
		break;
	}
	default:
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "random bindings: type %s is not supported",
			moe_dtype_name((moe_dtype)n->dtype));
		moe_tensor_free(ctx, t);
		return NULL;
	}
	return t;
}

/* Adds a binding for every named leaf of g that m lacks. */
static moe_status add_random_bindings(moe_ctx *ctx, const moe_graph *g, uint64_t seed, moe_tensor_map *m)
{
	for (moe_id id = 0; id < g->nnodes; id++) {
		const ir_node *n = N(g, id);
		if (n->op != MOE_OP_INPUT && n->op != MOE_OP_WEIGHT)
			continue;
		if (!n->name) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "random bindings: %s %%%u has no name", ir_ops[n->op].name, id);
			return MOE_ERR_INVALID;
		}
		if (moe_tensor_map_get(m, n->name))
			continue;
		moe_tensor *t = random_tensor(ctx, g, id, seed);
		if (!t)
			return MOE_ERR_INVALID;
		if (moe_tensor_map_set(m, n->name, t) != MOE_OK)
			return MOE_ERR_NOMEM;
	}
	return MOE_OK;
}

moe_status ir_interp_random_bindings(moe_ctx *ctx, const moe_graph *g, uint64_t seed, moe_tensor_map **out)
{
	moe_tensor_map *m = moe_tensor_map_new(ctx);
	moe_status st = add_random_bindings(ctx, g, seed, m);
	if (st) {
		moe_tensor_map_free(m);
		m = NULL;
	}
	*out = m;
	return st;
}

/* ---- running and comparing ---- */
moe_status ir_interp_run_alloc(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_tensor ***out)
{
	moe_tensor **o = ctx_alloc(ctx, ((size_t)g->nout + 1) * sizeof *o);
	moe_status st = moe_interp_run(ctx, g, bind, o);
	if (st) {
		ctx_free(ctx, o, ((size_t)g->nout + 1) * sizeof *o);
		o = NULL;
	}
	*out = o;
	return st;
}

void ir_interp_free_outputs(moe_ctx *ctx, const moe_graph *g, moe_tensor **out)
{
	if (!out)
		return;
	for (uint32_t i = 0; i < g->nout; i++)
		moe_tensor_free(ctx, out[i]);
	ctx_free(ctx, out, ((size_t)g->nout + 1) * sizeof *out);
}

/* Element i as a double, and its bit pattern. */
static double elem(const moe_tensor *t, int64_t i, uint32_t *bits)
{
	switch (t->dtype) {
	case MOE_F32: {
		float f;
		memcpy(&f, (const char *)t->data + i * 4, 4);
		memcpy(bits, &f, 4);
		return f;
	}
	case MOE_BF16: {
		uint16_t h;
		memcpy(&h, (const char *)t->data + i * 2, 2);
		*bits = h;
		return moe_bf16_to_f32(h);
	}
	case MOE_I32: {
		int32_t v;
		memcpy(&v, (const char *)t->data + i * 4, 4);
		*bits = (uint32_t)v;
		return v;
	}
	default: {
		unsigned char c = ((const unsigned char *)t->data)[i];
		*bits = c;
		return c;
	}
	}
}

moe_status ir_tensor_diff(moe_ctx *ctx, const moe_tensor *a, const moe_tensor *b, uint32_t output, ir_diff *d)
{
	bool same = a->dtype == b->dtype && a->rank == b->rank;
	for (int i = 0; same && i < a->rank; i++)
		same = a->shape[i] == b->shape[i];
	if (!same || a->dtype >= MOE_F8E4M3) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "compare: output %u differs in type (%s rank %d vs %s rank %d)",
			output, moe_dtype_name(a->dtype), a->rank, moe_dtype_name(b->dtype), b->rank);
		return MOE_ERR_INVALID;
	}
	int64_t cnt = moe_tensor_numel(a);
	for (int64_t i = 0; i < cnt; i++) {
		uint32_t ba, bb;
		double x = elem(a, i, &ba), y = elem(b, i, &bb);
		if (isnan(x) && isnan(y))
			continue;
		if (ba == bb)
			continue;
		d->ndiff++;
		double diff;
		if (isnan(x) || isnan(y)) {
			d->nnan++;
			diff = INFINITY;
		} else if (x == y) {
			diff = 0; /* -0 and +0 */
		} else {
			diff = fabs(x - y);
			double m = fmax(fabs(x), fabs(y));
			if (isfinite(diff) && m > 0 && diff / m > d->max_rel)
				d->max_rel = diff / m;
		}
		if (diff > d->max_abs || d->worst_index < 0) {
			if (diff > d->max_abs)
				d->max_abs = diff;
			d->worst_output = output;
			d->worst_index = i;
		}
	}
	return MOE_OK;
}

moe_status ir_interp_compare(moe_ctx *ctx, const moe_graph *a, const moe_graph *b, uint64_t seed, ir_diff *d)
{
	memset(d, 0, sizeof *d);
	d->worst_index = -1;
	if (a->nout != b->nout) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "compare: the graphs have %u and %u outputs", a->nout, b->nout);
		return MOE_ERR_INVALID;
	}
	moe_tensor_map *m;
	moe_status st = ir_interp_random_bindings(ctx, a, seed, &m);
	if (st)
		return st;
	if ((st = add_random_bindings(ctx, b, seed, m))) {
		moe_tensor_map_free(m);
		return st;
	}
	moe_tensor **oa = NULL, **ob = NULL;
	st = ir_interp_run_alloc(ctx, a, m, &oa);
	if (!st)
		st = ir_interp_run_alloc(ctx, b, m, &ob);
	for (uint32_t i = 0; !st && i < a->nout; i++)
		st = ir_tensor_diff(ctx, oa[i], ob[i], i, d);
	ir_interp_free_outputs(ctx, a, oa);
	ir_interp_free_outputs(ctx, b, ob);
	moe_tensor_map_free(m);
	return st;
}

/* The rows of an n-element result of `rows` rows below count v (clamped to
 * 0..rows), its other rows set to 0 (f or i: the one buffer in use). */
int64_t interp_rows_below(float *f, int32_t *i, int64_t n, int64_t rows, int64_t v)
{
	v = v < 0 ? 0 : v > rows ? rows : v;
	int64_t row = rows ? n / rows : 0;
	if (f)
		memset(f + v * row, 0, (size_t)((rows - v) * row) * sizeof *f);
	else if (i)
		memset(i + v * row, 0, (size_t)((rows - v) * row) * sizeof *i);
	return v;
}

/* outer x len x inner around axis ax of x */
void interp_split_axis(const ir_node *x, int ax, int64_t *outer, int64_t *len, int64_t *inner)
{
	*outer = 1;
	*inner = 1;
	for (int d = 0; d < ax; d++)
		*outer *= x->shape[d];
	for (int d = ax + 1; d < x->rank; d++)
		*inner *= x->shape[d];
	*len = x->shape[ax];
}
