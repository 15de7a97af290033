/* backend-c/lower_int.h: what the host lowering files share (backend-c/lower.c
 * holds the driver, buffers, elementwise and einsum lowering; lower_data.c
 * the leaves, data movement, quantized weights and reductions): the lowering
 * state and the kernel-form construction and loop-nest helpers. */
#ifndef MOEC_BACKEND_C_LOWER_INT_H
#define MOEC_BACKEND_C_LOWER_INT_H

#include <math.h>
#include <string.h>

#include "backend-c/cgen.h"

/* Float einsum tiling (fast path): columns per panel and k per step. */
enum { EIN_NT = 256, EIN_KT = 256 };

typedef struct lw {
	cg_prog *p;
	moe_ctx *ctx;
	const moe_graph *g;
	moe_id cur;      /* node being lowered */
	int64_t *life0, *life1; /* per buffer: first and last node using it */
	uint32_t lifecap;
	bool *fused;     /* per node: a gather read in place by its einsum users */
	bool *nozero;    /* per node: its masked-out elements are never read, so not written */
	bool *inl;       /* per node: elementwise, computed inside its elementwise users' loops, never stored;
	                  * or a reshape of such a node read only by a row reduction (cgen_reduce_rows_ok) */
	int *tab;        /* per node: -1, or the f32 table of its values over the 2^16 bf16 operands (lower.c) */
} lw;

/* ---------------- construction helpers ---------------- */

static inline cg_expr *mk(lw *L, cg_eop op, cg_ty ty, cg_expr *a, cg_expr *b, cg_expr *c)
{
	cg_expr *e = ir_alloc(&L->p->arena, sizeof *e);
	e->op = (uint8_t)op;
	e->ty = (uint8_t)ty;
	e->a = a;
	e->b = b;
	e->c = c;
	e->var = e->buf = -1;
	return e;
}

static inline cg_expr *ic(lw *L, int64_t v)
{
	cg_expr *e = mk(L, CE_ICONST, CT_I64, NULL, NULL, NULL);
	e->i = v;
	return e;
}

static inline cg_expr *ic32(lw *L, int32_t v)
{
	cg_expr *e = mk(L, CE_ICONST, CT_I32, NULL, NULL, NULL);
	e->i = v;
	return e;
}

static inline cg_expr *fc(lw *L, float v)
{
	cg_expr *e = mk(L, CE_FCONST, CT_F32, NULL, NULL, NULL);
	e->d = v;
	return e;
}

static inline cg_expr *dc(lw *L, double v)
{
	cg_expr *e = mk(L, CE_FCONST, CT_F64, NULL, NULL, NULL);
	e->d = v;
	return e;
}

static inline int newvar(lw *L, cg_ty ty)
{
	cg_prog *p = L->p;
	ctx_grow(p->ctx, (void **)&p->vars, &p->varcap, p->nvars + 1, sizeof *p->vars);
	p->vars[p->nvars].ty = (uint8_t)ty;
	return (int)p->nvars++;
}

static inline cg_expr *vr(lw *L, int v)
{
	cg_expr *e = mk(L, CE_VAR, (cg_ty)L->p->vars[v].ty, NULL, NULL, NULL);
	e->var = v;
	return e;
}

static inline cg_ty val_ty(moe_dtype t)
{
	return t == MOE_F32 || t == MOE_BF16 ? CT_F32 : CT_I32;
}

static inline cg_expr *ld(lw *L, int buf, cg_expr *idx)
{
	cg_expr *e = mk(L, CE_LOAD, val_ty((moe_dtype)L->p->bufs[buf].dtype), idx, NULL, NULL);
	e->buf = buf;
	return e;
}

static inline cg_expr *bin(lw *L, cg_eop op, cg_expr *a, cg_expr *b)
{
	cg_ty t = (cg_ty)a->ty;
	if (op >= CE_EQ && op <= CE_GE)
		t = CT_I32;
	IR_ASSERT(a->ty == b->ty);
	return mk(L, op, t, a, b, NULL);
}

static inline cg_expr *un(lw *L, cg_eop op, cg_expr *a)
{
	return mk(L, op, op == CE_ISNAN ? CT_I32 : (cg_ty)a->ty, a, NULL, NULL);
}

static inline cg_expr *sel(lw *L, cg_expr *c, cg_expr *a, cg_expr *b)
{
	IR_ASSERT(c->ty == CT_I32 && a->ty == b->ty);
	return mk(L, CE_SELECT, (cg_ty)a->ty, c, a, b);
}

static inline cg_expr *conv(lw *L, cg_expr *a, cg_ty to)
{
	if (a->ty == to)
		return a;
	if (a->op == CE_ICONST && to != CT_F32) {
		cg_expr *e = to == CT_I32 ? ic32(L, (int32_t)a->i) : ic(L, a->i);
		return e;
	}
	return mk(L, CE_CONV, to, a, NULL, NULL);
}

/* i64 helpers that fold constants, keeping index expressions small */
static inline cg_expr *add64(lw *L, cg_expr *a, cg_expr *b)
{
	if (!a)
		return b;
	if (!b)
		return a;
	if (a->op == CE_ICONST && a->i == 0)
		return b;
	if (b->op == CE_ICONST && b->i == 0)
		return a;
	if (a->op == CE_ICONST && b->op == CE_ICONST)
		return ic(L, a->i + b->i);
	return bin(L, CE_ADD, a, b);
}

static inline cg_expr *mul64(lw *L, cg_expr *a, int64_t k)
{
	if (k == 0)
		return ic(L, 0);
	if (k == 1)
		return a;
	if (a->op == CE_ICONST)
		return ic(L, a->i * k);
	return bin(L, CE_MUL, a, ic(L, k));
}

/* Float min/max as the reference defines them: NaN if either operand is NaN
 * (the first NaN), and -0 < +0. Built from primitives so both emitters agree. */
static inline cg_expr *fminmax(lw *L, bool max, cg_expr *a, cg_expr *b)
{
	cg_expr *aneg = bin(L, CE_LT, mk(L, CE_BITS, CT_I32, a, NULL, NULL), ic32(L, 0));
	/* equal values: max picks the non-negative zero, min the negative one */
	cg_expr *eq = max ? sel(L, aneg, b, a) : sel(L, aneg, a, b);
	cg_expr *ord = max ? sel(L, bin(L, CE_GT, a, b), a, b) : sel(L, bin(L, CE_LT, a, b), a, b);
	cg_expr *num = sel(L, bin(L, CE_EQ, a, b), eq, ord);
	return sel(L, un(L, CE_ISNAN, a), a, sel(L, un(L, CE_ISNAN, b), b, num));
}

static inline cg_expr *minmax(lw *L, bool max, cg_expr *a, cg_expr *b)
{
	if (a->ty == CT_F32)
		return fminmax(L, max, a, b);
	return bin(L, max ? CE_MAX : CE_MIN, a, b);
}

/* f(x) of an f32 evaluated in double and rounded once, like the reference */
static inline cg_expr *via_f64(lw *L, cg_eop op, cg_expr *x)
{
	return conv(L, un(L, op, conv(L, x, CT_F64)), CT_F32);
}

/* i32 -> bf16 with one rounding: the f32 conversion is made round-to-odd
 * (inexact results get an odd last bit), so rounding it to bf16 is exact. */
static inline cg_expr *i32_to_bf16(lw *L, cg_expr *v)
{
	cg_expr *f = conv(L, v, CT_F32), *d = conv(L, v, CT_F64), *fd = conv(L, f, CT_F64);
	cg_expr *u = mk(L, CE_BITS, CT_I32, f, NULL, NULL);
	cg_expr *even = bin(L, CE_EQ, bin(L, CE_AND, u, ic32(L, 1)), ic32(L, 0));
	cg_expr *need = bin(L, CE_AND, bin(L, CE_NE, fd, d), even);
	cg_expr *up = bin(L, CE_EQ, bin(L, CE_GT, d, fd), bin(L, CE_GT, f, fc(L, 0.0f)));
	cg_expr *u2 = sel(L, need, sel(L, up, bin(L, CE_ADD, u, ic32(L, 1)), bin(L, CE_SUB, u, ic32(L, 1))), u);
	return un(L, CE_RBF16, mk(L, CE_BITS, CT_F32, u2, NULL, NULL));
}

static inline cg_stmt *st(lw *L, cg_block *b, cg_sk kind)
{
	cg_stmt *s = ir_alloc(&L->p->arena, sizeof *s);
	s->kind = (uint8_t)kind;
	s->var = s->buf = -1;
	if (b->last)
		b->last->next = s;
	else
		b->first = s;
	b->last = s;
	return s;
}

static inline void set(lw *L, cg_block *b, int var, cg_expr *e)
{
	IR_ASSERT(L->p->vars[var].ty == e->ty);
	cg_stmt *s = st(L, b, CS_SET);
	s->var = var;
	s->a = e;
}

/* f32 add/sub/mul/div with the defined NaN of ir/scalar.h (sc_nan2): the
 * first operand if it is a NaN, else the second if it is one, quieted; else
 * a op b. Which of two NaN operands the hardware passes on is not fixed once
 * a compiler commutes the operation, so a NaN first operand is chosen by a
 * select. A NaN second operand with a first that is not NaN is the one NaN
 * operand, which the hardware passes on quieted in either order; it gets a
 * select only when the first operand is a constant (1 * x, -0 + x could be
 * folded to an unquieted x). A non-NaN constant first operand needs none of
 * its own. An operand that is an expression is computed once into a
 * variable set in b. */
static inline cg_expr *fquiet(lw *L, cg_expr *x)
{
	cg_expr *u = bin(L, CE_OR, mk(L, CE_BITS, CT_I32, x, NULL, NULL), ic32(L, 0x00400000));
	return mk(L, CE_BITS, CT_F32, u, NULL, NULL);
}

static inline cg_expr *fleaf(lw *L, cg_block *b, cg_expr *x)
{
	if (x->op == CE_LOAD || x->op == CE_VAR || x->op == CE_FCONST)
		return x;
	int v = newvar(L, CT_F32);
	set(L, b, v, x);
	return vr(L, v);
}

static inline cg_expr *farith(lw *L, cg_block *b, cg_eop op, cg_expr *a, cg_expr *c)
{
	bool aconst = a->op == CE_FCONST && a->d == a->d;
	a = aconst ? a : fleaf(L, b, a);
	c = aconst && c->op != CE_FCONST ? fleaf(L, b, c) : c;
	cg_expr *r = bin(L, op, a, c);
	if (aconst)
		return c->op == CE_FCONST && c->d == c->d ? r : sel(L, un(L, CE_ISNAN, c), fquiet(L, c), r);
	return sel(L, un(L, CE_ISNAN, a), fquiet(L, a), r);
}

/* Store a value already in the buffer's value type; bf16 is rounded here. */
static inline void store(lw *L, cg_block *b, int buf, cg_expr *idx, cg_expr *v)
{
	moe_dtype t = (moe_dtype)L->p->bufs[buf].dtype;
	IR_ASSERT(v->ty == val_ty(t) && idx->ty == CT_I64);
	if (t == MOE_BF16 && v->op != CE_RBF16)
		v = un(L, CE_RBF16, v);
	cg_stmt *s = st(L, b, CS_STORE);
	s->buf = buf;
	s->a = idx;
	s->b = v;
}

static inline cg_block *loop(lw *L, cg_block *b, int var, cg_expr *lo, cg_expr *hi)
{
	cg_stmt *s = st(L, b, CS_FOR);
	s->var = var;
	s->a = lo;
	s->b = hi;
	return &s->body;
}

static inline cg_block *loopv(lw *L, cg_block *b, int *var, cg_expr *lo, cg_expr *hi)
{
	*var = newvar(L, CT_I64);
	return loop(L, b, *var, lo, hi);
}

static inline cg_stmt *iff(lw *L, cg_block *b, cg_expr *cond)
{
	cg_stmt *s = st(L, b, CS_IF);
	s->a = cond;
	return s;
}

static inline void fault_unless(lw *L, cg_block *b, cg_expr *ok, int code)
{
	cg_stmt *s = iff(L, b, ok);
	cg_stmt *f = st(L, &s->els, CS_FAULT);
	f->code = code;
}

static inline void comment(lw *L, cg_block *b, const char *text)
{
	(void)L;
	if (b->last)
		b->last->comment = text;
}

/* Elements a node must have before its outer loop runs in parallel: below
 * this, handing out iterations costs more than it saves. */
enum { PAR_MIN_ELEMS = 1 << 16 };

/* The loop just appended to block b becomes a parallel loop (cg_stmt.par) when
 * the node has at least PAR_MIN_ELEMS elements of work. The caller guarantees
 * that its iterations write disjoint elements and share no variables. */
static inline void par_if_big(cg_block *b, int64_t elems)
{
	IR_ASSERT(b->last && b->last->kind == CS_FOR);
	if (elems >= PAR_MIN_ELEMS)
		b->last->par = true;
}

/* zero of a buffer's value type */
static inline cg_expr *zero_of(lw *L, moe_dtype t)
{
	return val_ty(t) == CT_F32 ? fc(L, 0.0f) : ic32(L, 0);
}

/* ---------------- loop nests ---------------- */

static inline const ir_node *nd(lw *L, moe_id id)
{
	return N(L->g, id);
}

static inline void strides_of(const ir_node *n, int64_t *s)
{
	int64_t k = 1;
	for (int d = n->rank - 1; d >= 0; d--) {
		s[d] = k;
		k *= n->shape[d];
	}
}

/* sum of iv[d] * s[d] for d < r, optional base */
static inline cg_expr *lin(lw *L, const int *iv, const int64_t *s, int r, cg_expr *base)
{
	cg_expr *e = base;
	for (int d = 0; d < r; d++)
		if (s[d] && iv[d] >= 0)
			e = add64(L, e, mul64(L, vr(L, iv[d]), s[d]));
	return e ? e : ic(L, 0);
}

/* clamp(i32 v, 0, hi) as i64 */
static inline cg_expr *clamp_count(lw *L, cg_expr *v32, int64_t hi)
{
	cg_expr *v = conv(L, v32, CT_I64);
	cg_expr *lo0 = sel(L, bin(L, CE_LT, v, ic(L, 0)), ic(L, 0), v);
	return sel(L, bin(L, CE_GT, v, ic(L, hi)), ic(L, hi), lo0);
}

static inline void zero_range(lw *L, cg_block *b, int buf, cg_expr *from, cg_expr *to)
{
	int j;
	cg_block *z = loopv(L, b, &j, from, to);
	store(L, z, buf, vr(L, j), zero_of(L, (moe_dtype)L->p->bufs[buf].dtype));
}

static inline int mask_depth(lw *L, const ir_node *n)
{
	if (n->valid == MOE_NONE)
		return 0;
	return nd(L, n->valid)->rank == 0 ? 1 : 2;
}

/* Open loops over the first `depth` dims of node n's output (stored in buf),
 * honouring its valid mask: masked rows are skipped and their elements zeroed.
 * depth must be >= mask_depth(n). Loop variables land in iv[0..depth). */
static inline cg_block *nest(lw *L, cg_block *b, const ir_node *n, int buf, int depth, int *iv)
{
	int64_t s[MOE_MAX_RANK];
	strides_of(n, s);
	int md = mask_depth(L, n);
	IR_ASSERT(depth >= md && depth <= n->rank);
	int vbuf = md ? L->p->node_buf[n->valid] : -1;
	for (int d = 0; d < depth; d++) {
		cg_expr *hi = ic(L, n->shape[d]);
		int cnt = -1;
		if ((md == 1 && d == 0) || (md == 2 && d == 1)) {
			cg_expr *v = ld(L, vbuf, md == 1 ? ic(L, 0) : vr(L, iv[0]));
			cnt = newvar(L, CT_I64);
			set(L, b, cnt, clamp_count(L, v, n->shape[d]));
			hi = vr(L, cnt);
		}
		cg_block *in = loopv(L, b, &iv[d], ic(L, 0), hi);
		if (cnt >= 0 && !L->nozero[L->cur]) {
			/* elements of skipped rows are 0 */
			cg_expr *slab = d == 0 ? NULL : mul64(L, vr(L, iv[0]), s[0]);
			cg_expr *from = add64(L, slab, mul64(L, vr(L, cnt), s[d]));
			cg_expr *to = add64(L, slab, ic(L, n->shape[d] * s[d]));
			zero_range(L, b, buf, from, to);
		}
		b = in;
	}
	return b;
}

static inline cg_block *loops(lw *L, cg_block *b, const int64_t *shape, int from, int to, int *iv)
{
	for (int d = from; d < to; d++)
		b = loopv(L, b, &iv[d], ic(L, 0), ic(L, shape[d]));
	return b;
}

/* Strides of operand a broadcast into an output of rank r. */
static inline void bcast_strides(const ir_node *a, int r, int64_t *s)
{
	int64_t as[MOE_MAX_RANK];
	strides_of(a, as);
	for (int d = 0; d < r; d++) {
		int k = d - (r - a->rank);
		s[d] = k < 0 || a->shape[k] == 1 ? 0 : as[k];
	}
}

/* ---------------- lower.c ---------------- */
int cgen_scratch(lw *L, moe_dtype t, int64_t numel); /* a work buffer of numel elements */

/* ---------------- lower_data.c ---------------- */
bool cgen_lower_const(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_iota(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_copy_flat(lw *L, cg_block *b, int dst, int src, int64_t numel);
void cgen_lower_broadcast(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_slice(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_concat(lw *L, cg_block *b, const ir_node *n, int out);
int cgen_checked_index(lw *L, cg_block *b, cg_expr *v32, int64_t n);
void cgen_lower_gather_checks(lw *L, cg_block *b, const ir_node *n);
void cgen_lower_gather(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_dequant(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_take_along(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_scatter(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_one_hot(lw *L, cg_block *b, const ir_node *n, int out);
bool cgen_lower_filter(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_reduce(lw *L, cg_block *b, const ir_node *n, int out);
/* reduce n runs row after row in place (lower_data.c); with an inlined
 * reshape of an inlined elementwise node as operand it computes that node's
 * elements in its own loop */
bool cgen_reduce_rows_ok(lw *L, const ir_node *n);
/* the value of (inlined or stored) elementwise operand a at the element of
 * rank r reached by loop variables iv (lower.c) */
cg_expr *cgen_elem_operand(lw *L, cg_block *in, moe_id a, int r, const int *iv);
void cgen_lower_softmax(lw *L, cg_block *b, const ir_node *n, int out);
void cgen_lower_cumsum(lw *L, cg_block *b, const ir_node *n, int out);

/* ---------------- lower_einsum.c ---------------- */
void cgen_lower_einsum(lw *L, cg_block *b, const ir_node *n, int out);
/* whether gather gid is read by einsum n as its B operand through dot tiles,
 * its first dimension indexed by a batch letter (then n reads the gather's
 * source in place and the gather is not materialised) */
bool cgen_gather_fusable_into(lw *L, moe_id gid, const ir_node *n);

/* ---------------- lower_topk.c ---------------- */
void cgen_lower_topk(lw *L, cg_block *b, const ir_node *n, int out);

#endif
