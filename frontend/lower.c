/* frontend/lower.c: .moe syntax tree -> IR module, one graph per layer.
 * Resolves names, evaluates dims and params (exact 64-bit integers, every
 * overflow an error), applies --set overrides, expands library functions into
 * IR ops and runs shape inference on each node at its source location. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "frontend/ast.h"
#include "moec/frontend.h"

typedef struct cval {
	bool isf;
	int64_t i;
	double f;
} cval;

typedef enum symkind { SYM_DIM, SYM_PARAM, SYM_VALUE, SYM_POISON } symkind;

typedef struct sym {
	const char *name;
	symkind kind;
	cval v;     /* SYM_DIM, SYM_PARAM */
	moe_id id;  /* SYM_VALUE */
	fe_pos pos; /* the definition */
} sym;

/* One --set, parsed once for all layers. */
typedef struct setv {
	const char *name, *text;
	bool ok, used;
	cval v;
} setv;

typedef struct lower {
	moe_ctx *ctx;
	const char *file;
	moe_graph *g;
	moe_dtype dtype;
	sym *syms;
	uint32_t nsyms, symcap;
	uint32_t *hash; /* open addressing: index + 1 of a sym, 0 = empty; hcap is a power of 2 */
	uint32_t hcap;
	setv *sets;
	size_t nsets;
	int dtype_set; /* index of the dtype setting or -1 */
} lower;

static moe_loc at(lower *L, fe_pos p)
{
	return moe_loc_at(L->ctx, L->file, p.line, p.col);
}

#define ERR(L, pos, ...) moe_diag((L)->ctx, MOE_DIAG_ERROR, at((L), (pos)), __VA_ARGS__)

static uint32_t name_hash(const char *s)
{
	uint32_t h = 2166136261u; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/* The slot of name in the hash table: its entry, or the empty slot it would take. */
static uint32_t *slot_of(lower *L, const char *name)
{
	uint32_t m = L->hcap - 1;
	for (uint32_t i = name_hash(name) & m;; i = (i + 1) & m)
		if (!L->hash[i] || !strcmp(L->syms[L->hash[i] - 1].name, name))
			return &L->hash[i];
}

static sym *lookup(lower *L, const char *name)
{
	if (!L->hcap)
		return NULL;
	uint32_t k = *slot_of(L, name);
	return k ? &L->syms[k - 1] : NULL;
}

/* Empties the table (a new layer). */
static void clear_syms(lower *L)
{
	L->nsyms = 0;
	if (L->hash)
		memset(L->hash, 0, L->hcap * sizeof *L->hash);
}

static void hash_insert(lower *L, uint32_t idx)
{
	if (2 * (L->nsyms + 1) > L->hcap) {
		uint32_t *old = L->hash, ocap = L->hcap;
		L->hcap = ocap ? 2 * ocap : 64;
		L->hash = ctx_alloc(L->ctx, L->hcap * sizeof *L->hash);
		for (uint32_t i = 0; i < ocap; i++)
			if (old[i])
				*slot_of(L, L->syms[old[i] - 1].name) = old[i];
		if (old)
			ctx_free(L->ctx, old, ocap * sizeof *old);
	}
	*slot_of(L, L->syms[idx].name) = idx + 1;
}

/* Defines name; a redefinition is reported and the old binding stays. */
static sym *define(lower *L, const char *name, symkind k, fe_pos pos)
{
	sym *old = lookup(L, name);
	if (old) {
		ERR(L, pos, "redefinition of '%s'", name);
		moe_diag(L->ctx, MOE_DIAG_NOTE, at(L, old->pos), "previous definition of '%s' is here", name);
		return NULL;
	}
	ctx_grow(L->ctx, (void **)&L->syms, &L->symcap, L->nsyms + 1, sizeof *L->syms);
	sym *s = &L->syms[L->nsyms];
	*s = (sym){.name = name, .kind = k, .id = MOE_NONE, .pos = pos};
	hash_insert(L, L->nsyms);
	L->nsyms++;
	return s;
}

/* ---- constant expressions over dims and params ---- */

static bool builtin_float(const char *name, double *f)
{
	if (!strcmp(name, "inf"))
		*f = INFINITY;
	else if (!strcmp(name, "nan"))
		*f = NAN;
	else
		return false;
	return true;
}

static bool is_arith(fe_oper op)
{
	return op == FE_ADD || op == FE_SUB || op == FE_MUL || op == FE_DIV || op == FE_MOD;
}

/* Whether e is a constant expression (literals, dims, params, + - * / %). */
static bool is_const(lower *L, const fe_expr *e)
{
	double f;
	switch (e->kind) {
	case FE_E_INT:
	case FE_E_FLOAT:
		return true;
	case FE_E_NAME: {
		sym *s = lookup(L, e->s);
		if (s)
			return s->kind == SYM_DIM || s->kind == SYM_PARAM || (s->kind == SYM_POISON && s->id == 1);
		return builtin_float(e->s, &f);
	}
	case FE_E_UNARY:
		return e->op == FE_NEG && is_const(L, e->kids);
	case FE_E_BINARY:
		return is_arith(e->op) && is_const(L, e->kids) && is_const(L, e->kids->next);
	default:
		return false;
	}
}

static double fval(cval v)
{
	return v.isf ? v.f : (double)v.i;
}

/* Evaluates a constant expression; false after reporting (or after an error
 * reported earlier, for a poisoned name). */
static bool ceval(lower *L, const fe_expr *e, cval *out)
{
	switch (e->kind) {
	case FE_E_INT:
		*out = (cval){false, e->i, 0};
		return true;
	case FE_E_FLOAT:
		*out = (cval){true, 0, e->f};
		return true;
	case FE_E_NAME: {
		sym *s = lookup(L, e->s);
		if (!s) {
			double f;
			if (builtin_float(e->s, &f)) {
				*out = (cval){true, 0, f};
				return true;
			}
			ERR(L, e->pos, "use of undefined name '%s'", e->s);
			return false;
		}
		if (s->kind == SYM_POISON)
			return false;
		if (s->kind == SYM_VALUE) {
			ERR(L, e->pos, "'%s' is a tensor; a constant expression may use only dims, params and numbers", e->s);
			return false;
		}
		*out = s->v;
		return true;
	}
	case FE_E_UNARY: {
		cval a;
		if (e->op != FE_NEG) {
			ERR(L, e->pos, "'~' is not allowed in a constant expression");
			return false;
		}
		if (!ceval(L, e->kids, &a))
			return false;
		if (a.isf) {
			*out = (cval){true, 0, -a.f};
		} else {
			if (a.i == INT64_MIN) {
				ERR(L, e->pos, "integer overflow in constant expression");
				return false;
			}
			*out = (cval){false, -a.i, 0};
		}
		return true;
	}
	case FE_E_BINARY: {
		cval a, b;
		if (!is_arith(e->op)) {
			ERR(L, e->pos, "only + - * / %% are allowed in a constant expression");
			return false;
		}
		bool ok = ceval(L, e->kids, &a);
		ok &= ceval(L, e->kids->next, &b);
		if (!ok)
			return false;
		if (a.isf || b.isf) {
			double x = fval(a), y = fval(b), r = 0;
			switch (e->op) {
			case FE_ADD: r = x + y; break;
			case FE_SUB: r = x - y; break;
			case FE_MUL: r = x * y; break;
			case FE_DIV: r = x / y; break;
			default:
				ERR(L, e->pos, "'%%' needs integer operands");
				return false;
			}
			*out = (cval){true, 0, r};
			return true;
		}
		int64_t r = 0;
		bool ov = false;
		switch (e->op) {
		case FE_ADD: ov = __builtin_add_overflow(a.i, b.i, &r); break;
		case FE_SUB: ov = __builtin_sub_overflow(a.i, b.i, &r); break;
		case FE_MUL: ov = __builtin_mul_overflow(a.i, b.i, &r); break;
		case FE_DIV:
		case FE_MOD:
			if (b.i == 0) {
				ERR(L, e->pos, "division by zero in constant expression");
				return false;
			}
			if (a.i == INT64_MIN && b.i == -1)
				ov = true;
			else
				r = e->op == FE_DIV ? a.i / b.i : a.i % b.i;
			break;
		default: break;
		}
		if (ov) {
			ERR(L, e->pos, "integer overflow in constant expression");
			return false;
		}
		*out = (cval){false, r, 0};
		return true;
	}
	case FE_E_STR:
		ERR(L, e->pos, "expected a constant expression, got a string");
		return false;
	case FE_E_LIST:
		ERR(L, e->pos, "expected a constant expression, got a list");
		return false;
	case FE_E_CALL:
		ERR(L, e->pos, "expected a constant expression, got a call of '%s'", e->s);
		return false;
	case FE_E_KWARG:
		break;
	}
	ERR(L, e->pos, "expected a constant expression");
	return false;
}

static bool ceval_int(lower *L, const fe_expr *e, const char *what, int64_t *out)
{
	cval v;
	if (!ceval(L, e, &v))
		return false;
	if (v.isf) {
		ERR(L, e->pos, "%s must be an integer, got %g", what, v.f);
		return false;
	}
	*out = v.i;
	return true;
}

/* [DIMS] of an input or weight: each an integer in 1..MOE_MAX_DIM. */
static bool eval_shape(lower *L, const fe_expr *list, int64_t *shape, int *rank)
{
	if (list->nkids > MOE_MAX_RANK) {
		ERR(L, list->pos, "a shape has at most %d dimensions, got %d", MOE_MAX_RANK, list->nkids);
		return false;
	}
	bool ok = true;
	int r = 0;
	for (const fe_expr *d = list->kids; d; d = d->next, r++) {
		int64_t v;
		if (!ceval_int(L, d, "a dimension", &v)) {
			ok = false;
			continue;
		}
		if (v < 1 || v > MOE_MAX_DIM) {
			ERR(L, d->pos, "dimension %lld is outside 1..%lld", (long long)v, (long long)MOE_MAX_DIM);
			ok = false;
		}
		shape[r] = v;
	}
	*rank = r;
	return ok;
}

/* ---- building nodes ---- */

static moe_id finish(lower *L, moe_id id)
{
	return ir_infer(L->ctx, L->g, id) == MOE_OK ? id : MOE_NONE;
}

static moe_id mknode(lower *L, moe_op op, const moe_id *args, uint32_t n, fe_pos pos)
{
	return moe_node_new(L->g, op, args, n, at(L, pos));
}

static moe_id op1(lower *L, moe_op op, moe_id a, fe_pos pos)
{
	return finish(L, mknode(L, op, &a, 1, pos));
}

static moe_id op2(lower *L, moe_op op, moe_id a, moe_id b, fe_pos pos)
{
	moe_id x[2] = {a, b};
	if (a == MOE_NONE || b == MOE_NONE)
		return MOE_NONE;
	return finish(L, mknode(L, op, x, 2, pos));
}

/* A scalar constant of type t, or MOE_NONE after reporting a value t cannot hold. */
static moe_id emit_const(lower *L, cval v, moe_dtype t, fe_pos pos)
{
	if (!moe_dtype_is_float(t)) {
		if (v.isf && (v.f != floor(v.f) || !isfinite(v.f))) {
			ERR(L, pos, "constant %g is not an integer, but the other operand is %s", v.f, moe_dtype_name(t));
			return MOE_NONE;
		}
		int64_t i = v.isf ? (int64_t)v.f : v.i;
		if (v.isf && (v.f < -2147483648.0 || v.f > 2147483647.0))
			i = INT64_MAX;
		if (t == MOE_BOOL && i != 0 && i != 1) {
			ERR(L, pos, "constant %lld is not a bool (0 or 1)", (long long)i);
			return MOE_NONE;
		}
		if (i < INT32_MIN || i > INT32_MAX) {
			ERR(L, pos, "constant %lld does not fit in %s", (long long)i, moe_dtype_name(t));
			return MOE_NONE;
		}
		moe_id id = mknode(L, MOE_OP_CONST, NULL, 0, pos);
		moe_node_set_type(L->g, id, t, NULL, 0);
		moe_node_set_int(L->g, id, "value", i);
		return finish(L, id);
	}
	moe_id id = mknode(L, MOE_OP_CONST, NULL, 0, pos);
	moe_node_set_type(L->g, id, t, NULL, 0);
	moe_node_set_float(L->g, id, "value", fval(v));
	return finish(L, id);
}

static moe_id fconst(lower *L, double f, moe_dtype t, fe_pos pos)
{
	return emit_const(L, (cval){true, 0, f}, t, pos);
}

/* A constant alone: an integer is i32, a float the layer dtype. */
static moe_id const_default(lower *L, const fe_expr *e)
{
	cval v;
	if (!ceval(L, e, &v))
		return MOE_NONE;
	return emit_const(L, v, v.isf ? L->dtype : MOE_I32, e->pos);
}

static moe_id lower_expr(lower *L, const fe_expr *e);

/* Lowers n operands of an elementwise op: constants take the dtype of the
 * first non-constant operand at index >= typed_from. */
static bool lower_operands(lower *L, const fe_expr *const *xs, int n, int typed_from, moe_id *out)
{
	bool ok = true;
	int ref = -1;
	for (int i = 0; i < n; i++) {
		out[i] = MOE_NONE;
		if (i >= typed_from && is_const(L, xs[i]))
			continue;
		out[i] = lower_expr(L, xs[i]);
		if (out[i] == MOE_NONE)
			ok = false;
		else if (i >= typed_from && ref < 0)
			ref = i;
	}
	if (!ok)
		return false;
	for (int i = typed_from; i < n; i++) {
		if (out[i] != MOE_NONE)
			continue;
		if (ref < 0) {
			out[i] = const_default(L, xs[i]);
		} else {
			cval v;
			out[i] = ceval(L, xs[i], &v) ? emit_const(L, v, moe_node_dtype(L->g, out[ref]), xs[i]->pos) : MOE_NONE;
		}
		if (out[i] == MOE_NONE)
			ok = false;
	}
	return ok;
}

static moe_id lower_name(lower *L, const fe_expr *e)
{
	sym *s = lookup(L, e->s);
	if (s) {
		switch (s->kind) {
		case SYM_VALUE: return s->id;
		case SYM_POISON: return MOE_NONE;
		default: return const_default(L, e);
		}
	}
	double f;
	if (builtin_float(e->s, &f))
		return fconst(L, f, L->dtype, e->pos);
	if (moe_dtype_from_name(e->s) >= 0)
		ERR(L, e->pos, "'%s' is a type, not a value", e->s);
	else
		ERR(L, e->pos, "use of undefined name '%s'", e->s);
	return MOE_NONE;
}

static const moe_op binops[] = {
	[FE_ADD] = MOE_OP_ADD, [FE_SUB] = MOE_OP_SUB, [FE_MUL] = MOE_OP_MUL, [FE_DIV] = MOE_OP_DIV,
	[FE_OR] = MOE_OP_OR, [FE_XOR] = MOE_OP_XOR, [FE_AND] = MOE_OP_AND, [FE_EQ] = MOE_OP_EQ,
	[FE_NE] = MOE_OP_NE, [FE_LT] = MOE_OP_LT, [FE_LE] = MOE_OP_LE, [FE_GT] = MOE_OP_GT,
	[FE_GE] = MOE_OP_GE, [FE_SHL] = MOE_OP_SHL, [FE_SAR] = MOE_OP_SAR, [FE_SHR] = MOE_OP_SHR,
};

static moe_id lower_binary(lower *L, const fe_expr *e)
{
	if (is_arith(e->op) && is_const(L, e))
		return const_default(L, e);
	if (e->op == FE_MOD) {
		ERR(L, e->pos, "'%%' is defined only in constant expressions, not on tensors");
		return MOE_NONE;
	}
	const fe_expr *xs[2] = {e->kids, e->kids->next};
	moe_id a[2];
	if (!lower_operands(L, xs, 2, 0, a))
		return MOE_NONE;
	return op2(L, binops[e->op], a[0], a[1], e->pos);
}

/* ---- calls ---- */

typedef struct callargs {
	const fe_expr *pos[64];
	int npos;
	const fe_expr *kw[32];
	int nkw;
} callargs;

static bool split_args(lower *L, const fe_expr *e, callargs *c)
{
	c->npos = c->nkw = 0;
	for (const fe_expr *a = e->kids; a; a = a->next) {
		if (a->kind == FE_E_KWARG) {
			for (int i = 0; i < c->nkw; i++)
				if (!strcmp(c->kw[i]->s, a->s)) {
					ERR(L, a->pos, "'%s' is given twice", a->s);
					return false;
				}
			if (c->nkw == 32) {
				ERR(L, a->pos, "too many keyword arguments");
				return false;
			}
			c->kw[c->nkw++] = a;
			continue;
		}
		if (c->nkw) {
			ERR(L, a->pos, "a positional argument follows a keyword argument");
			return false;
		}
		if (c->npos == 64) {
			ERR(L, a->pos, "too many arguments (at most 64)");
			return false;
		}
		c->pos[c->npos++] = a;
	}
	return true;
}

/* Attributes each op family takes: key and kind (i int, n number, s string,
 * t type name, l integer list). */
static bool eval_ints(lower *L, const fe_expr *list, int64_t *v, int *n)
{
	if (list->kind != FE_E_LIST) {
		ERR(L, list->pos, "expected a list of integers like [T, K]");
		return false;
	}
	if (list->nkids > MOE_MAX_RANK) {
		ERR(L, list->pos, "a list has at most %d entries here, got %d", MOE_MAX_RANK, list->nkids);
		return false;
	}
	bool ok = true;
	*n = 0;
	for (const fe_expr *d = list->kids; d; d = d->next)
		ok &= ceval_int(L, d, "a list entry", &v[(*n)++]);
	return ok;
}

/* Sets attribute key = value on node id, checked against the op's
 * attribute set in moec/ops.def (ir_attr_check). */
static bool set_attr(lower *L, moe_id id, moe_op op, const char *key, const fe_expr *v, fe_pos kpos)
{
	const ir_attrspec *s = ir_attr_spec(L->ctx, op, key);
	if (!s || !strcmp(key, "*")) {
		if (ir_attr_check(L->ctx, op, &(ir_attr){.key = key}, at(L, kpos)))
			ERR(L, kpos, "'%s' takes no attribute '%s' here", moe_op_name(op), key); /* an open leaf */
		return false;
	}
	ir_attr a = {.key = key, .kind = MOE_ATTR_STR};
	int64_t xs[MOE_MAX_RANK];
	switch (s->type) {
	case IR_AT_STR:
		a.v.s = v->kind == FE_E_STR ? v->s : NULL;
		break;
	case IR_AT_TYPE:
		a.v.s = v->kind == FE_E_STR || (v->kind == FE_E_NAME && !lookup(L, v->s)) ? v->s : NULL;
		if (a.v.s && !strcmp(a.v.s, "dtype")) /* the layer's compute type */
			a.v.s = moe_dtype_name(L->dtype);
		break;
	case IR_AT_INTS:
		if (!eval_ints(L, v, xs, &a.count))
			return false;
		a.kind = MOE_ATTR_INTS;
		a.v.ints = xs;
		break;
	case IR_AT_INT:
	case IR_AT_NUM: {
		cval c;
		if (!ceval(L, v, &c))
			return false;
		if (s->type == IR_AT_INT && c.isf) {
			ERR(L, v->pos, "attribute '%s' of '%s' must be an integer, got %g", key, moe_op_name(op), c.f);
			return false;
		}
		a.kind = c.isf ? MOE_ATTR_FLOAT : MOE_ATTR_INT;
		if (c.isf)
			a.v.f = c.f;
		else
			a.v.i = c.i;
		break;
	}
	}
	if (a.kind == MOE_ATTR_STR && !a.v.s) {
		a.v.s = ""; /* not a string or a type name: ir_attr_check names the kind */
		a.kind = MOE_ATTR_INT;
	}
	if (!ir_attr_check(L->ctx, op, &a, at(L, v->pos)))
		return false;
	ir_attr_set(L->g, N(L->g, id), &a);
	return true;
}

static bool want_args(lower *L, const fe_expr *e, const callargs *c, int n, bool kw_ok)
{
	if (c->npos != n) {
		ERR(L, e->pos, "'%s' takes %d argument%s, got %d", e->s, n, n == 1 ? "" : "s", c->npos);
		return false;
	}
	if (!kw_ok && c->nkw) {
		ERR(L, c->kw[0]->pos, "'%s' takes no keyword arguments", e->s);
		return false;
	}
	return true;
}

static bool dtype_arg(lower *L, const fe_expr *a, moe_dtype *t)
{
	int d = a->kind == FE_E_NAME || a->kind == FE_E_STR ? moe_dtype_from_name(a->s) : -1;
	if (a->kind == FE_E_NAME && !strcmp(a->s, "dtype")) /* the layer's compute type */
		d = L->dtype;
	if (d < 0 || d == MOE_I8 || moe_dtype_is_storage((moe_dtype)d)) {
		ERR(L, a->pos, "expected a type (f32, bf16, i32, bool)");
		return false;
	}
	*t = (moe_dtype)d;
	return true;
}

/* zeros / full / iota: a leaf with a given shape. */
static moe_id lower_fill(lower *L, const fe_expr *e, const callargs *c, bool zeros)
{
	moe_dtype t = MOE_F32;
	int64_t shape[MOE_MAX_RANK];
	int rank = 0;
	cval v = {false, 0, 0};
	if (!want_args(L, e, c, zeros ? 2 : 3, false))
		return MOE_NONE;
	bool ok = dtype_arg(L, c->pos[0], &t);
	ok &= eval_ints(L, c->pos[1], shape, &rank);
	if (!zeros)
		ok &= ceval(L, c->pos[2], &v);
	if (!ok)
		return MOE_NONE;
	for (int i = 0; i < rank; i++)
		if (shape[i] < 1 || shape[i] > MOE_MAX_DIM) {
			ERR(L, c->pos[1]->pos, "dimension %lld is outside 1..%lld", (long long)shape[i], (long long)MOE_MAX_DIM);
			return MOE_NONE;
		}
	moe_id k = emit_const(L, v, t, e->pos);
	if (k == MOE_NONE)
		return MOE_NONE;
	moe_node_set_type(L->g, k, t, shape, rank);
	return finish(L, k);
}

static moe_id lower_iota(lower *L, const fe_expr *e, const callargs *c)
{
	int64_t shape[MOE_MAX_RANK];
	int rank;
	if (!want_args(L, e, c, 1, true))
		return MOE_NONE;
	if (!eval_ints(L, c->pos[0], shape, &rank))
		return MOE_NONE;
	for (int i = 0; i < rank; i++)
		if (shape[i] < 1 || shape[i] > MOE_MAX_DIM) {
			ERR(L, c->pos[0]->pos, "dimension %lld is outside 1..%lld", (long long)shape[i], (long long)MOE_MAX_DIM);
			return MOE_NONE;
		}
	moe_id id = mknode(L, MOE_OP_IOTA, NULL, 0, e->pos);
	moe_node_set_type(L->g, id, MOE_I32, shape, rank);
	moe_node_set_int(L->g, id, "axis", 0);
	for (int i = 0; i < c->nkw; i++) {
		if (strcmp(c->kw[i]->s, "axis")) {
			ERR(L, c->kw[i]->pos, "'iota' has no attribute '%s'", c->kw[i]->s);
			return MOE_NONE;
		}
		int64_t ax;
		if (!ceval_int(L, c->kw[i]->kids, "axis", &ax))
			return MOE_NONE;
		moe_node_set_int(L->g, id, "axis", ax);
	}
	return finish(L, id);
}

/* silu gelu gelu_tanh relu clamp zeros full iota; -1 if name is none of them */
static int lower_library(lower *L, const fe_expr *e, const callargs *c, moe_id *out)
{
	static const char *const names[] = {"silu", "gelu", "gelu_tanh", "relu", "clamp", "zeros", "full", "iota"};
	int which = -1;
	for (int i = 0; i < 8; i++)
		if (!strcmp(e->s, names[i]))
			which = i;
	if (which < 0)
		return -1;
	*out = MOE_NONE;
	if (which == 5 || which == 6) {
		*out = lower_fill(L, e, c, which == 5);
		return 0;
	}
	if (which == 7) {
		*out = lower_iota(L, e, c);
		return 0;
	}
	if (which == 4) {
		moe_id a[3];
		if (!want_args(L, e, c, 3, false) || !lower_operands(L, c->pos, 3, 0, a))
			return 0;
		*out = op2(L, MOE_OP_MIN, op2(L, MOE_OP_MAX, a[0], a[1], e->pos), a[2], e->pos);
		return 0;
	}
	if (!want_args(L, e, c, 1, false))
		return 0;
	moe_id x = lower_expr(L, c->pos[0]);
	if (x == MOE_NONE)
		return 0;
	moe_dtype t = moe_node_dtype(L->g, x);
	if (!moe_dtype_is_float(t)) {
		ERR(L, e->pos, "'%s' needs a floating-point operand, got %s", e->s, moe_dtype_name(t));
		return 0;
	}
	fe_pos p = e->pos;
	switch (which) {
	case 0: /* x * sigmoid(x) */
		*out = op2(L, MOE_OP_MUL, x, op1(L, MOE_OP_SIGMOID, x, p), p);
		break;
	case 1: { /* x/2 (1 + erf(x / sqrt 2)) */
		moe_id r = op1(L, MOE_OP_ERF, op2(L, MOE_OP_MUL, x, fconst(L, 0.70710678118654752440, t, p), p), p);
		r = op2(L, MOE_OP_ADD, r, fconst(L, 1.0, t, p), p);
		*out = op2(L, MOE_OP_MUL, op2(L, MOE_OP_MUL, x, fconst(L, 0.5, t, p), p), r, p);
		break;
	}
	case 2: { /* x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
		moe_id x3 = op2(L, MOE_OP_MUL, op2(L, MOE_OP_MUL, x, x, p), x, p);
		moe_id in = op2(L, MOE_OP_ADD, x, op2(L, MOE_OP_MUL, x3, fconst(L, 0.044715, t, p), p), p);
		moe_id th = op1(L, MOE_OP_TANH, op2(L, MOE_OP_MUL, in, fconst(L, 0.79788456080286535588, t, p), p), p);
		th = op2(L, MOE_OP_ADD, th, fconst(L, 1.0, t, p), p);
		*out = op2(L, MOE_OP_MUL, op2(L, MOE_OP_MUL, x, fconst(L, 0.5, t, p), p), th, p);
		break;
	}
	case 3:
		*out = op2(L, MOE_OP_MAX, x, fconst(L, 0.0, t, p), p);
		break;
	}
	return 0;
}

static moe_id lower_call(lower *L, const fe_expr *e)
{
	callargs c;
	moe_id out;
	if (!split_args(L, e, &c))
		return MOE_NONE;
	if (lower_library(L, e, &c, &out) == 0)
		return out;
	int o = moe_op_from_name(e->s);
	if (o < 0) {
		ERR(L, e->pos, "unknown op or function '%s'", e->s);
		return MOE_NONE;
	}
	moe_op op = (moe_op)o;
	if (ir_ops[op].flags & OPF_LEAF) {
		ERR(L, e->pos, "'%s' cannot be called; declare inputs and weights, write constants as numbers", e->s);
		return MOE_NONE;
	}
	/* shorthands: einsum("eq", ...), cast(x, T), topk(x, K), one_hot(i, N), reshape(x, [..]) */
	const fe_expr *lead = NULL, *trail = NULL;
	const char *tkey = NULL;
	int first = 0, npos = c.npos;
	if (op == MOE_OP_EINSUM && npos > 0 && c.pos[0]->kind == FE_E_STR)
		lead = c.pos[first++];
	switch (ir_ops[op].rule) {
	case SHAPE_CAST:
	case SHAPE_BITCAST: tkey = "to"; break;
	case SHAPE_TOPK: tkey = "k"; break;
	case SHAPE_ONE_HOT: tkey = "n"; break;
	case SHAPE_RESHAPE:
	case SHAPE_BROADCAST: tkey = "shape"; break;
	default: break;
	}
	if (tkey && npos == 2)
		trail = c.pos[--npos];
	int nops = npos - first;
	if (op == MOE_OP_EXPERTS && nops > 3) {
		ERR(L, c.pos[first + 3]->pos, "'experts' takes x, idx, w by position; pass weights by keyword (gate=, up=, down=, ...)");
		return MOE_NONE;
	}
	moe_id args[64];
	uint32_t nargs;
	bool ok;
	if (op == MOE_OP_EXPERTS) {
		for (int i = 0; i < EXP_NSLOTS; i++)
			args[i] = MOE_NONE;
		ok = true;
		for (int i = 0; i < nops; i++)
			if ((args[i] = lower_expr(L, c.pos[first + i])) == MOE_NONE)
				ok = false;
		for (int k = 0; k < c.nkw; k++)
			for (int s = EXP_GATE; s < EXP_NSLOTS; s++)
				if (!strcmp(c.kw[k]->s, ir_experts_slot_names[s])) {
					if ((args[s] = lower_expr(L, c.kw[k]->kids)) == MOE_NONE)
						ok = false;
				}
		nargs = EXP_NSLOTS;
	} else {
		bool elem = (ir_ops[op].flags & OPF_ELEM) && nops >= 2;
		ok = lower_operands(L, c.pos + first, nops, elem ? (op == MOE_OP_SELECT ? 1 : 0) : nops, args);
		if (ok && !elem)
			for (int i = 0; i < nops; i++)
				if (args[i] == MOE_NONE && (args[i] = lower_expr(L, c.pos[first + i])) == MOE_NONE)
					ok = false;
		nargs = (uint32_t)nops;
	}
	if (!ok)
		return MOE_NONE;
	moe_id id = mknode(L, op, args, nargs, e->pos);
	if (lead)
		moe_node_set_str(L->g, id, "eq", lead->s);
	if (trail)
		ok &= set_attr(L, id, op, tkey, trail, trail->pos);
	for (int k = 0; k < c.nkw; k++) {
		bool slot = false;
		for (int s = EXP_GATE; op == MOE_OP_EXPERTS && s < EXP_NSLOTS; s++)
			slot |= !strcmp(c.kw[k]->s, ir_experts_slot_names[s]);
		if (slot)
			continue;
		if ((lead && !strcmp(c.kw[k]->s, "eq")) || (trail && !strcmp(c.kw[k]->s, tkey))) {
			ERR(L, c.kw[k]->pos, "'%s' is given twice", c.kw[k]->s);
			ok = false;
			continue;
		}
		ok &= set_attr(L, id, op, c.kw[k]->s, c.kw[k]->kids, c.kw[k]->pos);
	}
	if (!ok)
		return MOE_NONE;
	if (op == MOE_OP_EINSUM && !moe_node_get_str(L->g, id, "eq")) {
		ERR(L, e->pos, "'einsum' needs an equation, e.g. einsum(\"td,ed->te\", x, w)");
		return MOE_NONE;
	}
	return finish(L, id);
}

static moe_id lower_expr(lower *L, const fe_expr *e)
{
	switch (e->kind) {
	case FE_E_INT:
	case FE_E_FLOAT: return const_default(L, e);
	case FE_E_NAME: return lower_name(L, e);
	case FE_E_UNARY:
		if (is_const(L, e))
			return const_default(L, e);
		return op1(L, e->op == FE_NEG ? MOE_OP_NEG : MOE_OP_NOT, lower_expr(L, e->kids), e->pos);
	case FE_E_BINARY: return lower_binary(L, e);
	case FE_E_CALL: return lower_call(L, e);
	case FE_E_STR: ERR(L, e->pos, "a string is not a value; strings are attribute values"); break;
	case FE_E_LIST: ERR(L, e->pos, "a list is not a value; lists are shapes and attribute values"); break;
	case FE_E_KWARG: ERR(L, e->pos, "unexpected keyword argument"); break;
	}
	return MOE_NONE;
}

/* ---- statements ---- */

static bool value_type(lower *L, const fe_stmt *s, moe_dtype *t)
{
	*t = L->dtype;
	if (!s->type)
		return true;
	int d = moe_dtype_from_name(s->type);
	if (d >= 0 && moe_dtype_is_storage((moe_dtype)d) && s->kind != FE_S_WEIGHT) {
		ERR(L, s->type_pos, "type '%s' holds the raw bytes of a quantized weight: only a weight may have it", s->type);
		return false;
	}
	if (d < 0 || d == MOE_I8) {
		ERR(L, s->type_pos, "unknown or unsupported type '%s' (f32, bf16, i32, bool; f8e4m3, u8 for quantized weights)",
			s->type);
		return false;
	}
	*t = (moe_dtype)d;
	return true;
}

/* "{layer}" and other {NAME} of integer dims/params are replaced; {e} stays. */
static char *expand_source(lower *L, const fe_stmt *s, size_t *cap)
{
	size_t n = 0;
	*cap = strlen(s->source) + 64;
	char *buf = ctx_alloc(L->ctx, *cap);
	bool ok = true;
	for (const char *p = s->source; *p;) {
		char piece[32];
		const char *add = p;
		size_t len = 1;
		if (*p == '{') {
			const char *q = strchr(p, '}');
			if (!q) {
				ERR(L, s->source_pos, "unclosed '{' in weight source \"%s\"", s->source);
				ok = false;
				break;
			}
			size_t nl = (size_t)(q - p - 1);
			char name[128];
			if (nl >= sizeof name)
				nl = sizeof name - 1;
			memcpy(name, p + 1, nl);
			name[nl] = 0;
			len = (size_t)(q - p + 1);
			if (strcmp(name, "e")) {
				sym *v = lookup(L, name);
				if (v && (v->kind == SYM_DIM || v->kind == SYM_PARAM) && !v->v.isf) {
					snprintf(piece, sizeof piece, "%lld", (long long)v->v.i);
					add = piece;
				} else {
					if (!v || v->kind != SYM_POISON)
						ERR(L, s->source_pos, "'{%s}' in weight source: no integer dim or param '%s' (only {e} and those may appear)",
							name, name);
					ok = false;
				}
			}
			p += len;
			len = add == piece ? strlen(piece) : len;
		} else {
			p++;
		}
		if (n + len + 1 > *cap) {
			size_t nc = (n + len + 1) * 2;
			buf = ctx_realloc(L->ctx, buf, *cap, nc);
			*cap = nc;
		}
		memcpy(buf + n, add, len);
		n += len;
	}
	buf[n] = 0;
	if (!ok) {
		ctx_free(L->ctx, buf, *cap);
		return NULL;
	}
	return buf;
}

static setv *find_set(lower *L, const char *name)
{
	for (size_t i = 0; i < L->nsets; i++)
		if (!strcmp(L->sets[i].name, name))
			return &L->sets[i];
	return NULL;
}

static void lower_dimparam(lower *L, const fe_stmt *s)
{
	bool dim = s->kind == FE_S_DIM;
	sym *y = define(L, s->name, SYM_POISON, s->pos);
	if (!y)
		return;
	y->id = 1; /* a poisoned constant */
	cval v;
	setv *set = find_set(L, s->name);
	fe_pos vpos = s->value->pos;
	if (set) {
		set->used = true;
		if (!set->ok)
			return;
		v = set->v;
		vpos = s->pos;
	} else if (!ceval(L, s->value, &v)) {
		return;
	}
	if (dim) {
		if (v.isf) {
			ERR(L, vpos, "dimension '%s' must be an integer, got %g", s->name, v.f);
			return;
		}
		if (v.i < 1 || v.i > MOE_MAX_DIM) {
			ERR(L, vpos, "dimension '%s' = %lld is outside 1..%lld", s->name, (long long)v.i, (long long)MOE_MAX_DIM);
			return;
		}
	}
	y->kind = dim ? SYM_DIM : SYM_PARAM;
	y->v = v;
	if (!v.isf)
		moe_graph_set_dim(L->g, s->name, v.i);
}

static void lower_leaf(lower *L, const fe_stmt *s)
{
	sym *y = define(L, s->name, SYM_POISON, s->pos);
	if (!y)
		return;
	moe_dtype t;
	int64_t shape[MOE_MAX_RANK];
	int rank = 0;
	bool ok = value_type(L, s, &t);
	ok &= eval_shape(L, s->shape, shape, &rank);
	char *src = NULL;
	size_t cap = 0;
	if (s->kind == FE_S_WEIGHT) {
		src = expand_source(L, s, &cap);
		ok &= src != NULL;
		if (ok && strstr(src, "{e}") && rank == 0) {
			ERR(L, s->shape->pos, "a weight stacked over {e} needs the expert dimension first in its shape");
			ok = false;
		}
	}
	if (ok) {
		moe_id id = mknode(L, s->kind == FE_S_WEIGHT ? MOE_OP_WEIGHT : MOE_OP_INPUT, NULL, 0, s->pos);
		moe_node_set_type(L->g, id, t, shape, rank);
		moe_node_set_name(L->g, id, s->name);
		if (src)
			moe_node_set_str(L->g, id, "source", src);
		if (finish(L, id) != MOE_NONE) {
			y->kind = SYM_VALUE;
			y->id = id;
		}
	}
	if (src)
		ctx_free(L->ctx, src, cap);
}

static void lower_stmt(lower *L, const fe_stmt *s)
{
	switch (s->kind) {
	case FE_S_DTYPE: break;
	case FE_S_DIM:
	case FE_S_PARAM: lower_dimparam(L, s); break;
	case FE_S_INPUT:
	case FE_S_WEIGHT: lower_leaf(L, s); break;
	case FE_S_BIND: {
		moe_id id = lower_expr(L, s->value);
		sym *y = define(L, s->name, SYM_POISON, s->pos);
		if (!y || id == MOE_NONE)
			return;
		y->kind = SYM_VALUE;
		y->id = id;
		if (!moe_node_name(L->g, id))
			moe_node_set_name(L->g, id, s->name);
		break;
	}
	case FE_S_OUTPUT:
		for (const fe_expr *e = s->value; e; e = e->next) {
			moe_id id = lower_expr(L, e);
			if (id != MOE_NONE)
				moe_graph_add_output(L->g, id);
		}
		break;
	}
}

static void lower_layer(lower *L, moe_module *m, const fe_layer *y)
{
	L->g = moe_module_add_graph(m, y->name);
	clear_syms(L);
	L->dtype = MOE_F32;
	const fe_stmt *dt = NULL;
	for (const fe_stmt *s = y->stmts; s; s = s->next) {
		if (s->kind != FE_S_DTYPE)
			continue;
		if (dt) {
			ERR(L, s->pos, "the layer's dtype is declared twice");
			moe_diag(L->ctx, MOE_DIAG_NOTE, at(L, dt->pos), "first declared here");
			continue;
		}
		dt = s;
		int d = moe_dtype_from_name(s->type);
		if (d != MOE_F32 && d != MOE_BF16)
			ERR(L, s->pos, "the layer dtype must be f32 or bf16, got '%s'", s->type);
		else
			L->dtype = (moe_dtype)d;
	}
	if (L->dtype_set >= 0) {
		L->sets[L->dtype_set].used = true;
		L->dtype = moe_dtype_from_name(L->sets[L->dtype_set].text) == MOE_BF16 ? MOE_BF16 : MOE_F32;
	}
	moe_graph_set_dtype(L->g, L->dtype);
	bool has_output = false;
	for (const fe_stmt *s = y->stmts; s; s = s->next) {
		lower_stmt(L, s);
		has_output |= s->kind == FE_S_OUTPUT;
	}
	if (!has_output)
		ERR(L, y->pos, "layer '%s' has no output", y->name);
}

/* Parses the text of every --set once. */
static void parse_sets(lower *L, const moe_settings *sets)
{
	L->dtype_set = -1;
	L->nsets = sets ? sets->count : 0;
	L->sets = L->nsets ? ctx_alloc(L->ctx, L->nsets * sizeof *L->sets) : NULL;
	for (size_t i = 0; i < L->nsets; i++) {
		setv *s = &L->sets[i];
		const char *name = sets->items[i].name ? sets->items[i].name : "", *text = sets->items[i].value;
		s->name = name;
		s->text = text ? text : "";
		for (size_t j = 0; j < i; j++)
			if (!strcmp(L->sets[j].name, name))
				moe_diag(L->ctx, MOE_DIAG_WARNING, moe_loc_none(), "--set %s is given twice; the last one wins", name);
		if (!strcmp(name, "dtype")) {
			s->used = true;
			int d = moe_dtype_from_name(s->text);
			if (d != MOE_F32 && d != MOE_BF16)
				moe_diag(L->ctx, MOE_DIAG_ERROR, moe_loc_none(), "--set dtype=%s: the dtype must be f32 or bf16", s->text);
			else
				L->dtype_set = (int)i;
			continue;
		}
		const char *t = s->text;
		char *end;
		errno = 0;
		long long v = strtoll(t, &end, 10);
		bool intlike = *t && !*end && (*t == '-' || *t == '+' || (*t >= '0' && *t <= '9'));
		if (intlike && errno == ERANGE) {
			moe_diag(L->ctx, MOE_DIAG_ERROR, moe_loc_none(), "--set %s=%s: the value does not fit in 64 bits", name, t);
			continue;
		}
		if (intlike && !errno) {
			s->v = (cval){false, v, 0};
			s->ok = true;
			continue;
		}
		bool num = *t && strspn(t, "0123456789.eE+-") == strlen(t);
		errno = 0;
		double f = num ? strtod(t, &end) : 0;
		if (num && !*end && !errno) {
			s->v = (cval){true, 0, f};
			s->ok = true;
			continue;
		}
		moe_diag(L->ctx, MOE_DIAG_ERROR, moe_loc_none(), "--set %s=%s: the value is not a number%s", name, t,
			errno == ERANGE ? " in range" : "");
	}
	/* the last of a repeated --set wins */
	for (size_t i = 0; i < L->nsets; i++)
		for (size_t j = i + 1; j < L->nsets; j++)
			if (!strcmp(L->sets[i].name, L->sets[j].name)) {
				L->sets[i].name = "";
				L->sets[i].used = true;
				if (!strcmp(L->sets[j].name, "dtype") && L->dtype_set == (int)i)
					L->dtype_set = -1;
			}
}

int moe_setting_split(const char *arg, char *name, size_t namelen, const char **value)
{
	const char *eq = arg ? strchr(arg, '=') : NULL;
	if (!eq || eq == arg || (size_t)(eq - arg) >= namelen)
		return 0;
	memcpy(name, arg, (size_t)(eq - arg));
	name[eq - arg] = 0;
	*value = eq + 1;
	return 1;
}

static moe_module *parse_moe(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const moe_settings *sets)
{
	if (!file)
		file = "<input>";
	int errs = moe_error_count(ctx);
	moe_ctx_add_source(ctx, file, text ? text : "", text ? len : 0);
	lower L = {.ctx = ctx, .file = ctx_intern(ctx, file)};
	parse_sets(&L, sets);
	ir_arena arena;
	ir_arena_init(&arena, ctx);
	fe_parser p = {.ctx = ctx, .arena = &arena, .file = L.file};
	p.tail = &p.layers;
	moe_module *m = NULL;
	if (len > INT_MAX) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, file), "file is too large (%zu bytes)", len);
		goto done;
	}
	if (fe_parse_text(&p, text ? text : "", text ? len : 0))
		goto done;
	if (!p.layers) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, file), "no layer in this file");
		goto done;
	}
	m = moe_module_new(ctx);
	for (const fe_layer *y = p.layers; y; y = y->next) {
		for (const fe_layer *z = p.layers; z != y; z = z->next)
			if (!strcmp(z->name, y->name)) {
				ERR(&L, y->pos, "a layer named '%s' is already defined", y->name);
				moe_diag(ctx, MOE_DIAG_NOTE, at(&L, z->pos), "previous definition is here");
				break;
			}
		lower_layer(&L, m, y);
	}
	for (size_t i = 0; i < L.nsets; i++)
		if (!L.sets[i].used)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--set %s: no dim or param named '%s' in %s",
				L.sets[i].name, L.sets[i].name, file);
	if (moe_error_count(ctx) == errs)
		moe_module_verify(ctx, m);
done:
	if (L.syms)
		ctx_free(ctx, L.syms, L.symcap * sizeof *L.syms);
	if (L.hash)
		ctx_free(ctx, L.hash, L.hcap * sizeof *L.hash);
	if (L.sets)
		ctx_free(ctx, L.sets, L.nsets * sizeof *L.sets);
	ir_arena_free(&arena);
	if (moe_error_count(ctx) != errs) {
		moe_module_free(m);
		return NULL;
	}
	return m;
}

moe_module *moe_parse_moe(moe_ctx *ctx, const char *file, const char *text, size_t len, const moe_settings *sets)
{
	CTX_GUARDED(ctx, moe_module *, NULL, parse_moe(ctx, file, text, len, sets));
}
