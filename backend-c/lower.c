/* backend-c/lower.c: graph -> kernel form (cgen.h), storage and workspace plan.
 *
 * One loop nest per node, in node order. Every node's value lives in a flat
 * buffer: a graph input or weight pointer, an output pointer (the first
 * occurrence of a graph output is computed in place), or a slice of the
 * workspace. Workspace offsets come from a liveness-based first-fit plan, so
 * buffers whose lifetimes do not overlap share memory. A reshape that is not a
 * graph output is a view of its operand's buffer (no copy). */
#include <math.h>
#include <string.h>

#include "backend-c/cgen.h"
#include "ir/quant.h"
#include "ir/scalar.h"
#include "moec/runtime.h"

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
} lw;

/* ---------------- construction helpers ---------------- */

static cg_expr *mk(lw *L, cg_eop op, cg_ty ty, cg_expr *a, cg_expr *b, cg_expr *c)
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

static cg_expr *ic(lw *L, int64_t v)
{
	cg_expr *e = mk(L, CE_ICONST, CT_I64, NULL, NULL, NULL);
	e->i = v;
	return e;
}

static cg_expr *ic32(lw *L, int32_t v)
{
	cg_expr *e = mk(L, CE_ICONST, CT_I32, NULL, NULL, NULL);
	e->i = v;
	return e;
}

static cg_expr *fc(lw *L, float v)
{
	cg_expr *e = mk(L, CE_FCONST, CT_F32, NULL, NULL, NULL);
	e->d = v;
	return e;
}

static cg_expr *dc(lw *L, double v)
{
	cg_expr *e = mk(L, CE_FCONST, CT_F64, NULL, NULL, NULL);
	e->d = v;
	return e;
}

static int newvar(lw *L, cg_ty ty)
{
	cg_prog *p = L->p;
	ctx_grow(p->ctx, (void **)&p->vars, &p->varcap, p->nvars + 1, sizeof *p->vars);
	p->vars[p->nvars].ty = (uint8_t)ty;
	return (int)p->nvars++;
}

static cg_expr *vr(lw *L, int v)
{
	cg_expr *e = mk(L, CE_VAR, (cg_ty)L->p->vars[v].ty, NULL, NULL, NULL);
	e->var = v;
	return e;
}

static cg_ty val_ty(moe_dtype t)
{
	return t == MOE_F32 || t == MOE_BF16 ? CT_F32 : CT_I32;
}

static cg_expr *ld(lw *L, int buf, cg_expr *idx)
{
	cg_expr *e = mk(L, CE_LOAD, val_ty((moe_dtype)L->p->bufs[buf].dtype), idx, NULL, NULL);
	e->buf = buf;
	return e;
}

static cg_expr *bin(lw *L, cg_eop op, cg_expr *a, cg_expr *b)
{
	cg_ty t = (cg_ty)a->ty;
	if (op >= CE_EQ && op <= CE_GE)
		t = CT_I32;
	IR_ASSERT(a->ty == b->ty);
	return mk(L, op, t, a, b, NULL);
}

static cg_expr *un(lw *L, cg_eop op, cg_expr *a)
{
	return mk(L, op, op == CE_ISNAN ? CT_I32 : (cg_ty)a->ty, a, NULL, NULL);
}

static cg_expr *sel(lw *L, cg_expr *c, cg_expr *a, cg_expr *b)
{
	IR_ASSERT(c->ty == CT_I32 && a->ty == b->ty);
	return mk(L, CE_SELECT, (cg_ty)a->ty, c, a, b);
}

static cg_expr *conv(lw *L, cg_expr *a, cg_ty to)
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
static cg_expr *add64(lw *L, cg_expr *a, cg_expr *b)
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

static cg_expr *mul64(lw *L, cg_expr *a, int64_t k)
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
static cg_expr *fminmax(lw *L, bool max, cg_expr *a, cg_expr *b)
{
	cg_expr *aneg = bin(L, CE_LT, mk(L, CE_BITS, CT_I32, a, NULL, NULL), ic32(L, 0));
	/* equal values: max picks the non-negative zero, min the negative one */
	cg_expr *eq = max ? sel(L, aneg, b, a) : sel(L, aneg, a, b);
	cg_expr *ord = max ? sel(L, bin(L, CE_GT, a, b), a, b) : sel(L, bin(L, CE_LT, a, b), a, b);
	cg_expr *num = sel(L, bin(L, CE_EQ, a, b), eq, ord);
	return sel(L, un(L, CE_ISNAN, a), a, sel(L, un(L, CE_ISNAN, b), b, num));
}

static cg_expr *minmax(lw *L, bool max, cg_expr *a, cg_expr *b)
{
	if (a->ty == CT_F32)
		return fminmax(L, max, a, b);
	return bin(L, max ? CE_MAX : CE_MIN, a, b);
}

/* f(x) of an f32 evaluated in double and rounded once, like the reference */
static cg_expr *via_f64(lw *L, cg_eop op, cg_expr *x)
{
	return conv(L, un(L, op, conv(L, x, CT_F64)), CT_F32);
}

/* i32 -> bf16 with one rounding: the f32 conversion is made round-to-odd
 * (inexact results get an odd last bit), so rounding it to bf16 is exact. */
static cg_expr *i32_to_bf16(lw *L, cg_expr *v)
{
	cg_expr *f = conv(L, v, CT_F32), *d = conv(L, v, CT_F64), *fd = conv(L, f, CT_F64);
	cg_expr *u = mk(L, CE_BITS, CT_I32, f, NULL, NULL);
	cg_expr *even = bin(L, CE_EQ, bin(L, CE_AND, u, ic32(L, 1)), ic32(L, 0));
	cg_expr *need = bin(L, CE_AND, bin(L, CE_NE, fd, d), even);
	cg_expr *up = bin(L, CE_EQ, bin(L, CE_GT, d, fd), bin(L, CE_GT, f, fc(L, 0.0f)));
	cg_expr *u2 = sel(L, need, sel(L, up, bin(L, CE_ADD, u, ic32(L, 1)), bin(L, CE_SUB, u, ic32(L, 1))), u);
	return un(L, CE_RBF16, mk(L, CE_BITS, CT_F32, u2, NULL, NULL));
}

static cg_stmt *st(lw *L, cg_block *b, cg_sk kind)
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

static void set(lw *L, cg_block *b, int var, cg_expr *e)
{
	IR_ASSERT(L->p->vars[var].ty == e->ty);
	cg_stmt *s = st(L, b, CS_SET);
	s->var = var;
	s->a = e;
}

/* Store a value already in the buffer's value type; bf16 is rounded here. */
static void store(lw *L, cg_block *b, int buf, cg_expr *idx, cg_expr *v)
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

static cg_block *loop(lw *L, cg_block *b, int var, cg_expr *lo, cg_expr *hi)
{
	cg_stmt *s = st(L, b, CS_FOR);
	s->var = var;
	s->a = lo;
	s->b = hi;
	return &s->body;
}

static cg_block *loopv(lw *L, cg_block *b, int *var, cg_expr *lo, cg_expr *hi)
{
	*var = newvar(L, CT_I64);
	return loop(L, b, *var, lo, hi);
}

static cg_stmt *iff(lw *L, cg_block *b, cg_expr *cond)
{
	cg_stmt *s = st(L, b, CS_IF);
	s->a = cond;
	return s;
}

static void fault_unless(lw *L, cg_block *b, cg_expr *ok, int code)
{
	cg_stmt *s = iff(L, b, ok);
	cg_stmt *f = st(L, &s->els, CS_FAULT);
	f->code = code;
}

static void comment(lw *L, cg_block *b, const char *text)
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
static void par_if_big(cg_block *b, int64_t elems)
{
	IR_ASSERT(b->last && b->last->kind == CS_FOR);
	if (elems >= PAR_MIN_ELEMS)
		b->last->par = true;
}

/* zero of a buffer's value type */
static cg_expr *zero_of(lw *L, moe_dtype t)
{
	return val_ty(t) == CT_F32 ? fc(L, 0.0f) : ic32(L, 0);
}

/* ---------------- buffers and lifetimes ---------------- */

static int newbuf(lw *L, cg_bk kind, moe_dtype t, int64_t numel, uint32_t index, moe_id node)
{
	cg_prog *p = L->p;
	uint32_t old = p->bufcap;
	ctx_grow(p->ctx, (void **)&p->bufs, &p->bufcap, p->nbufs + 1, sizeof *p->bufs);
	if (p->bufcap != old) {
		L->life0 = ctx_realloc(p->ctx, L->life0, old * sizeof(int64_t), p->bufcap * sizeof(int64_t));
		L->life1 = ctx_realloc(p->ctx, L->life1, old * sizeof(int64_t), p->bufcap * sizeof(int64_t));
	}
	cg_buf *b = &p->bufs[p->nbufs];
	memset(b, 0, sizeof *b);
	b->kind = (uint8_t)kind;
	b->dtype = (uint8_t)t;
	b->numel = numel;
	b->index = index;
	b->node = node;
	b->writable = kind == CB_OUTPUT || kind == CB_WORK;
	L->life0[p->nbufs] = L->life1[p->nbufs] = node == MOE_NONE ? (int64_t)L->cur : (int64_t)node;
	return (int)p->nbufs++;
}

/* scratch workspace for the node being lowered */
static int scratch(lw *L, moe_dtype t, int64_t numel)
{
	return newbuf(L, CB_WORK, t, numel, 0, MOE_NONE);
}

static void use(lw *L, moe_id node, int64_t at)
{
	int b = L->p->node_buf[node];
	if (b >= 0 && L->life1[b] < at)
		L->life1[b] = at;
}

typedef struct span {
	int64_t off, end;
	int64_t t0, t1;
} span;

/* first-fit by decreasing size over lifetime-overlapping buffers */
static void plan_workspace(lw *L)
{
	cg_prog *p = L->p;
	uint32_t n = 0;
	uint32_t *order = ctx_alloc(p->ctx, (p->nbufs + 1) * sizeof *order);
	span *placed = ctx_alloc(p->ctx, (p->nbufs + 1) * sizeof *placed);
	for (uint32_t i = 0; i < p->nbufs; i++)
		if (p->bufs[i].kind == CB_WORK)
			order[n++] = i;
	for (uint32_t i = 1; i < n; i++) { /* insertion sort: size desc, then id */
		uint32_t x = order[i];
		int64_t sx = p->bufs[x].numel * (int64_t)moe_dtype_size((moe_dtype)p->bufs[x].dtype);
		uint32_t j = i;
		while (j > 0) {
			uint32_t y = order[j - 1];
			int64_t sy = p->bufs[y].numel * (int64_t)moe_dtype_size((moe_dtype)p->bufs[y].dtype);
			if (sy >= sx)
				break;
			order[j] = y;
			j--;
		}
		order[j] = x;
	}
	int64_t total = 0;
	for (uint32_t i = 0; i < n; i++) {
		cg_buf *b = &p->bufs[order[i]];
		int64_t size = (b->numel * (int64_t)moe_dtype_size((moe_dtype)b->dtype) + 63) & ~(int64_t)63;
		int64_t t0 = L->life0[order[i]], t1 = L->life1[order[i]];
		int64_t off = 0;
		for (bool moved = true; moved;) {
			moved = false;
			for (uint32_t j = 0; j < i; j++) {
				span *s = &placed[j];
				if (s->t1 < t0 || t1 < s->t0)
					continue;
				if (off < s->end && s->off < off + size) {
					off = s->end;
					moved = true;
				}
			}
		}
		placed[i] = (span){off, off + size, t0, t1};
		b->offset = off;
		if (off + size > total)
			total = off + size;
	}
	p->workspace = total;
	ctx_free(p->ctx, order, (p->nbufs + 1) * sizeof *order);
	ctx_free(p->ctx, placed, (p->nbufs + 1) * sizeof *placed);
}

/* ---------------- loop nests ---------------- */

static const ir_node *nd(lw *L, moe_id id)
{
	return N(L->g, id);
}

static void strides_of(const ir_node *n, int64_t *s)
{
	int64_t k = 1;
	for (int d = n->rank - 1; d >= 0; d--) {
		s[d] = k;
		k *= n->shape[d];
	}
}

/* sum of iv[d] * s[d] for d < r, optional base */
static cg_expr *lin(lw *L, const int *iv, const int64_t *s, int r, cg_expr *base)
{
	cg_expr *e = base;
	for (int d = 0; d < r; d++)
		if (s[d] && iv[d] >= 0)
			e = add64(L, e, mul64(L, vr(L, iv[d]), s[d]));
	return e ? e : ic(L, 0);
}

/* clamp(i32 v, 0, hi) as i64 */
static cg_expr *clamp_count(lw *L, cg_expr *v32, int64_t hi)
{
	cg_expr *v = conv(L, v32, CT_I64);
	cg_expr *lo0 = sel(L, bin(L, CE_LT, v, ic(L, 0)), ic(L, 0), v);
	return sel(L, bin(L, CE_GT, v, ic(L, hi)), ic(L, hi), lo0);
}

static void zero_range(lw *L, cg_block *b, int buf, cg_expr *from, cg_expr *to)
{
	int j;
	cg_block *z = loopv(L, b, &j, from, to);
	store(L, z, buf, vr(L, j), zero_of(L, (moe_dtype)L->p->bufs[buf].dtype));
}

static int mask_depth(lw *L, const ir_node *n)
{
	if (n->valid == MOE_NONE)
		return 0;
	return nd(L, n->valid)->rank == 0 ? 1 : 2;
}

/* Open loops over the first `depth` dims of node n's output (stored in buf),
 * honouring its valid mask: masked rows are skipped and their elements zeroed.
 * depth must be >= mask_depth(n). Loop variables land in iv[0..depth). */
static cg_block *nest(lw *L, cg_block *b, const ir_node *n, int buf, int depth, int *iv)
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

static cg_block *loops(lw *L, cg_block *b, const int64_t *shape, int from, int to, int *iv)
{
	for (int d = from; d < to; d++)
		b = loopv(L, b, &iv[d], ic(L, 0), ic(L, shape[d]));
	return b;
}

/* Strides of operand a broadcast into an output of rank r. */
static void bcast_strides(const ir_node *a, int r, int64_t *s)
{
	int64_t as[MOE_MAX_RANK];
	strides_of(a, as);
	for (int d = 0; d < r; d++) {
		int k = d - (r - a->rank);
		s[d] = k < 0 || a->shape[k] == 1 ? 0 : as[k];
	}
}

/* ---------------- elementwise ---------------- */

static cg_expr *cast_expr(lw *L, cg_expr *x, moe_dtype from, moe_dtype to)
{
	bool ff = moe_dtype_is_float(from), tf = moe_dtype_is_float(to);
	if (to == MOE_BOOL)
		return ff ? bin(L, CE_NE, x, fc(L, 0.0f)) : bin(L, CE_NE, x, ic32(L, 0));
	if (ff && tf)
		return x; /* rounding to bf16 happens at the store */
	if (ff)
		return conv(L, x, CT_I32);
	if (to == MOE_BF16)
		return i32_to_bf16(L, x);
	if (tf)
		return conv(L, x, CT_F32);
	return x; /* i32/bool -> i32 */
}

static cg_expr *elem_expr(lw *L, cg_block *b, const ir_node *n, cg_expr **x)
{
	moe_dtype dt = (moe_dtype)nd(L, n->args[0])->dtype;
	bool fl = moe_dtype_is_float(dt);
	switch ((moe_op)n->op) {
	case MOE_OP_NEG: return un(L, CE_NEG, x[0]);
	case MOE_OP_ABS: return un(L, CE_ABS, x[0]);
	case MOE_OP_EXP: return via_f64(L, CE_EXP, x[0]);
	case MOE_OP_LOG: return via_f64(L, CE_LOG, x[0]);
	case MOE_OP_SQRT: return via_f64(L, CE_SQRT, x[0]);
	case MOE_OP_TANH: return via_f64(L, CE_TANH, x[0]);
	case MOE_OP_ERF: return via_f64(L, CE_ERF, x[0]);
	case MOE_OP_RSQRT:
		return conv(L, bin(L, CE_FDIV, dc(L, 1.0), un(L, CE_SQRT, conv(L, x[0], CT_F64))), CT_F32);
	case MOE_OP_SIGMOID: {
		cg_expr *e = un(L, CE_EXP, un(L, CE_NEG, conv(L, x[0], CT_F64)));
		return conv(L, bin(L, CE_FDIV, dc(L, 1.0), bin(L, CE_ADD, dc(L, 1.0), e)), CT_F32);
	}
	case MOE_OP_NOT: return dt == MOE_BOOL ? bin(L, CE_XOR, x[0], ic32(L, 1)) : un(L, CE_NOT, x[0]);
	case MOE_OP_ADD: return bin(L, CE_ADD, x[0], x[1]);
	case MOE_OP_SUB: return bin(L, CE_SUB, x[0], x[1]);
	case MOE_OP_MUL: return bin(L, CE_MUL, x[0], x[1]);
	case MOE_OP_DIV:
		if (fl)
			return bin(L, CE_FDIV, x[0], x[1]);
		else {
			int t = newvar(L, CT_I32);
			set(L, b, t, x[1]);
			fault_unless(L, b, bin(L, CE_NE, vr(L, t), ic32(L, 0)), CG_FAULT_DIV0);
			return bin(L, CE_SDIV, x[0], vr(L, t));
		}
	case MOE_OP_MIN: return minmax(L, false, x[0], x[1]);
	case MOE_OP_MAX: return minmax(L, true, x[0], x[1]);
	case MOE_OP_AND: return bin(L, CE_AND, x[0], x[1]);
	case MOE_OP_OR: return bin(L, CE_OR, x[0], x[1]);
	case MOE_OP_XOR: return bin(L, CE_XOR, x[0], x[1]);
	case MOE_OP_SHL: return bin(L, CE_SHL, x[0], x[1]);
	case MOE_OP_SHR: return bin(L, CE_LSHR, x[0], x[1]);
	case MOE_OP_SAR: return bin(L, CE_ASHR, x[0], x[1]);
	case MOE_OP_EQ: return bin(L, CE_EQ, x[0], x[1]);
	case MOE_OP_NE: return bin(L, CE_NE, x[0], x[1]);
	case MOE_OP_LT: return bin(L, CE_LT, x[0], x[1]);
	case MOE_OP_LE: return bin(L, CE_LE, x[0], x[1]);
	case MOE_OP_GT: return bin(L, CE_GT, x[0], x[1]);
	case MOE_OP_GE: return bin(L, CE_GE, x[0], x[1]);
	case MOE_OP_SELECT: return sel(L, x[0], x[1], x[2]);
	case MOE_OP_CAST: return cast_expr(L, x[0], dt, (moe_dtype)n->dtype);
	case MOE_OP_BITCAST:
		return n->dtype == dt ? x[0] : mk(L, CE_BITS, val_ty((moe_dtype)n->dtype), x[0], NULL, NULL);
	default: break;
	}
	IR_ASSERT(!"not an elementwise op");
	return NULL;
}

static void lower_elem(lw *L, cg_block *b, const ir_node *n, int out)
{
	int r = n->rank, iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], as[3][MOE_MAX_RANK];
	strides_of(n, os);
	bool flat = n->valid == MOE_NONE;
	for (uint32_t i = 0; i < n->nargs; i++) {
		const ir_node *a = nd(L, n->args[i]);
		bcast_strides(a, r, as[i]);
		if (ir_numel(a) != 1 && !ir_same_shape(a, n))
			flat = false;
	}
	cg_block *in;
	cg_expr *oidx, *aidx[3];
	if (flat && r > 0) { /* one loop over all elements */
		int j;
		in = loopv(L, b, &j, ic(L, 0), ic(L, ir_numel(n)));
		par_if_big(b, ir_numel(n)); /* one element per iteration */
		oidx = vr(L, j);
		for (uint32_t i = 0; i < n->nargs; i++)
			aidx[i] = ir_numel(nd(L, n->args[i])) == 1 ? ic(L, 0) : vr(L, j);
	} else {
		cg_stmt *before = b->last;
		in = nest(L, b, n, out, r, iv);
		/* the outermost loop: one slab of the output per iteration */
		cg_stmt *outer = before ? before->next : b->first;
		while (outer && outer->kind != CS_FOR)
			outer = outer->next;
		if (outer && ir_numel(n) >= PAR_MIN_ELEMS)
			outer->par = true;
		oidx = lin(L, iv, os, r, NULL);
		for (uint32_t i = 0; i < n->nargs; i++)
			aidx[i] = lin(L, iv, as[i], r, NULL);
	}
	cg_expr *x[3];
	for (uint32_t i = 0; i < n->nargs; i++)
		x[i] = ld(L, L->p->node_buf[n->args[i]], aidx[i]);
	store(L, in, out, oidx, elem_expr(L, in, n, x));
}

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

static bool lower_const(lw *L, cg_block *b, const ir_node *n, int out)
{
	cg_expr *e = attr_const(L, n, "value");
	if (!e)
		return false;
	int j;
	cg_block *in = loopv(L, b, &j, ic(L, 0), ic(L, ir_numel(n)));
	store(L, in, out, vr(L, j), e);
	return true;
}

static void lower_iota(lw *L, cg_block *b, const ir_node *n, int out)
{
	int iv[MOE_MAX_RANK], ax = ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank);
	int64_t s[MOE_MAX_RANK];
	strides_of(n, s);
	cg_block *in = loops(L, b, n->shape, 0, n->rank, iv);
	store(L, in, out, lin(L, iv, s, n->rank, NULL), conv(L, vr(L, iv[ax]), CT_I32));
}

static void copy_flat(lw *L, cg_block *b, int dst, int src, int64_t numel)
{
	int j;
	cg_block *in = loopv(L, b, &j, ic(L, 0), ic(L, numel));
	store(L, in, dst, vr(L, j), ld(L, src, vr(L, j)));
}

static void lower_broadcast(lw *L, cg_block *b, const ir_node *n, int out)
{
	int iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], as[MOE_MAX_RANK];
	strides_of(n, os);
	bcast_strides(nd(L, n->args[0]), n->rank, as);
	cg_block *in = loops(L, b, n->shape, 0, n->rank, iv);
	store(L, in, out, lin(L, iv, os, n->rank, NULL), ld(L, L->p->node_buf[n->args[0]], lin(L, iv, as, n->rank, NULL)));
}

static void lower_slice(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank), iv[MOE_MAX_RANK];
	int64_t start = ir_attr_int(n, "start", 0), step = ir_attr_int(n, "step", 1);
	int64_t os[MOE_MAX_RANK], xs[MOE_MAX_RANK];
	strides_of(n, os);
	strides_of(x, xs);
	int64_t xs2[MOE_MAX_RANK];
	memcpy(xs2, xs, sizeof xs2);
	xs2[ax] = xs[ax] * step;
	cg_block *in = loops(L, b, n->shape, 0, n->rank, iv);
	store(L, in, out, lin(L, iv, os, n->rank, NULL),
		ld(L, L->p->node_buf[n->args[0]], lin(L, iv, xs2, n->rank, ic(L, start * xs[ax]))));
}

static void lower_concat(lw *L, cg_block *b, const ir_node *n, int out)
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
static int checked_index(lw *L, cg_block *b, cg_expr *v32, int64_t n)
{
	int t = newvar(L, CT_I64);
	set(L, b, t, conv(L, v32, CT_I64));
	cg_expr *ok = bin(L, CE_AND, bin(L, CE_GE, vr(L, t), ic(L, 0)), bin(L, CE_LT, vr(L, t), ic(L, n)));
	fault_unless(L, b, ok, CG_FAULT_INDEX);
	return t;
}

/* A gather fused into its einsums: only its index checks remain here (the
 * faults it would raise), over the blocks its mask computes. */
static void lower_gather_checks(lw *L, cg_block *b, const ir_node *n)
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
	checked_index(L, in, ld(L, L->p->node_buf[n->args[1]], vr(L, g)), x->shape[0]);
	comment(L, b, "indices of a gather read in place by its einsums");
}

static void lower_gather(lw *L, cg_block *b, const ir_node *n, int out)
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
	cg_block *in = nest(L, b, n, out, lvl, iv);
	/* index tensor position: output dims [ax, ax + ir) */
	int ivi[MOE_MAX_RANK];
	for (int d = 0; d < ir; d++)
		ivi[d] = iv[ax + d];
	int t = checked_index(L, in, ld(L, L->p->node_buf[n->args[1]], lin(L, ivi, is, ir, NULL)), x->shape[ax]);
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

/* dequant: one loop nest over the result (rows past a scalar mask zeroed),
 * each element decoded from its packed value and scale as qt_value does. */
static void lower_dequant(lw *L, cg_block *b, const ir_node *n, int out)
{
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
	} else if (qi.fmt == QT_MXFP4) {
		cg_expr *sh = bin(L, CE_SHL, bin(L, CE_AND, k32, ic32(L, 1)), ic32(L, 2));
		cg_expr *nib = bin(L, CE_AND, bin(L, CE_LSHR, raw, sh), ic32(L, 15));
		v = bin(L, CE_MUL, e2m1_expr(L, nib), e8m0_expr(L, sc));
	} else {
		cg_expr *sh = bin(L, CE_SHL, bin(L, CE_AND, k32, ic32(L, 7)), ic32(L, 2));
		cg_expr *nib = bin(L, CE_AND, bin(L, CE_LSHR, raw, sh), ic32(L, 15));
		v = bin(L, CE_MUL, conv(L, bin(L, CE_SUB, nib, ic32(L, 8)), CT_F32), sc);
	}
	store(L, in, out, lin(L, iv, os, r, NULL), v);
}

static void lower_take_along(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank), iv[MOE_MAX_RANK];
	int64_t os[MOE_MAX_RANK], xs[MOE_MAX_RANK];
	strides_of(n, os);
	strides_of(x, xs);
	cg_block *in = loops(L, b, n->shape, 0, n->rank, iv);
	cg_expr *oi = lin(L, iv, os, n->rank, NULL);
	int t = checked_index(L, in, ld(L, L->p->node_buf[n->args[1]], oi), x->shape[ax]);
	int64_t xs2[MOE_MAX_RANK];
	memcpy(xs2, xs, sizeof xs2);
	xs2[ax] = 0;
	cg_expr *xi = lin(L, iv, xs2, x->rank, mul64(L, vr(L, t), xs[ax]));
	store(L, in, out, oi, ld(L, L->p->node_buf[n->args[0]], xi));
}

static void lower_scatter(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *ix = nd(L, n->args[1]);
	bool add = !strcmp(ir_attr_str(n, "mode", "set"), "add");
	int src = L->p->node_buf[n->args[2]], iv[MOE_MAX_RANK];
	/* bf16 additions accumulate in f32 and round once at the end */
	int dst = add && n->dtype == MOE_BF16 ? scratch(L, MOE_F32, ir_numel(n)) : out;
	copy_flat(L, b, dst, L->p->node_buf[n->args[0]], ir_numel(n));
	int64_t row = ir_numel(n) / n->shape[0];
	int64_t is[MOE_MAX_RANK];
	strides_of(ix, is);
	cg_block *in = loops(L, b, ix->shape, 0, ix->rank, iv);
	cg_expr *p = lin(L, iv, is, ix->rank, NULL);
	int r = checked_index(L, in, ld(L, L->p->node_buf[n->args[1]], p), n->shape[0]);
	int j;
	in = loopv(L, in, &j, ic(L, 0), ic(L, row));
	cg_expr *di = add64(L, mul64(L, vr(L, r), row), vr(L, j));
	cg_expr *v = ld(L, src, add64(L, mul64(L, p, row), vr(L, j)));
	if (add)
		v = bin(L, CE_ADD, ld(L, dst, di), v);
	store(L, in, dst, di, v);
	if (dst != out)
		copy_flat(L, b, out, dst, ir_numel(n));
}

static void lower_one_hot(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *ix = nd(L, n->args[0]);
	int iv[MOE_MAX_RANK], j;
	int64_t is[MOE_MAX_RANK], depth = n->shape[n->rank - 1];
	strides_of(ix, is);
	cg_block *in = loops(L, b, ix->shape, 0, ix->rank, iv);
	cg_expr *p = lin(L, iv, is, ix->rank, NULL);
	int t = newvar(L, CT_I64);
	set(L, in, t, conv(L, ld(L, L->p->node_buf[n->args[0]], p), CT_I64));
	in = loopv(L, in, &j, ic(L, 0), ic(L, depth));
	store(L, in, out, add64(L, mul64(L, p, depth), vr(L, j)), bin(L, CE_EQ, vr(L, t), vr(L, j)));
}

static bool lower_filter(lw *L, cg_block *b, const ir_node *n, int out)
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
static cg_block *around_axis(lw *L, cg_block *b, const ir_node *x, int ax, cg_expr **xbase, cg_expr **obase)
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
		cg_block *in = loopv(L, b, &iv[d], ic(L, 0), ic(L, x->shape[d]));
		if (outer) /* each iteration reduces into its own outputs */
			par_if_big(b, ir_numel(x));
		outer = false;
		b = in;
	}
	*xbase = lin(L, iv, xs, x->rank, NULL);
	*obase = lin(L, iv, osk, x->rank, NULL);
	return b;
}

static void lower_reduce(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank), src = L->p->node_buf[n->args[0]];
	int64_t xs[MOE_MAX_RANK];
	strides_of(x, xs);
	cg_expr *xb, *ob;
	cg_block *in = around_axis(L, b, x, ax, &xb, &ob);
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

static void lower_softmax(lw *L, cg_block *b, const ir_node *n, int out)
{
	int ax = ir_norm_axis((int)ir_attr_int(n, "axis", -1), n->rank), src = L->p->node_buf[n->args[0]];
	int64_t xs[MOE_MAX_RANK];
	strides_of(n, xs);
	cg_expr *xb, *ob;
	cg_block *in = around_axis(L, b, n, ax, &xb, &ob);
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

static void lower_cumsum(lw *L, cg_block *b, const ir_node *n, int out)
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

/* ---------------- einsum ---------------- */

typedef struct ein {
	ir_einsum e;
	int64_t size[26];
	int64_t st[2][26]; /* per operand: stride of each letter (0 if absent) */
	int64_t ost[26];   /* output stride per letter */
} ein;

static void ein_setup(lw *L, const ir_node *n, ein *E)
{
	char msg[160];
	memset(E, 0, sizeof *E);
	bool ok = ir_einsum_parse(ir_attr_str(n, "eq", ""), &E->e, msg, sizeof msg);
	IR_ASSERT(ok);
	for (int i = 0; i < E->e.nin; i++) {
		const ir_node *a = nd(L, n->args[i]);
		int64_t s[MOE_MAX_RANK];
		strides_of(a, s);
		for (int d = 0; d < a->rank; d++) {
			E->size[E->e.in[i][d] - 'a'] = a->shape[d];
			E->st[i][E->e.in[i][d] - 'a'] = s[d];
		}
	}
	int64_t s[MOE_MAX_RANK];
	strides_of(n, s);
	for (int d = 0; d < E->e.out_rank; d++)
		E->ost[E->e.out[d] - 'a'] = s[d];
}

/* Generic contraction: output nest (with mask), then the summed letters in
 * first-seen order; acc starts at 0 and adds each product in turn. */
static void lower_einsum_generic(lw *L, cg_block *b, const ir_node *n, int out, const ein *E)
{
	int iv[MOE_MAX_RANK], lv[26];
	for (int i = 0; i < 26; i++)
		lv[i] = -1;
	cg_block *in = nest(L, b, n, out, n->rank, iv);
	for (int d = 0; d < n->rank; d++)
		lv[E->e.out[d] - 'a'] = iv[d];
	cg_ty t = val_ty((moe_dtype)n->dtype);
	int acc = newvar(L, t);
	/* -0 + p == p for every p: the same as starting from the first product */
	set(L, in, acc, t == CT_F32 ? fc(L, -0.0f) : ic32(L, 0));
	cg_block *body = in;
	for (int i = 0; i < E->e.nletters; i++) {
		int l = E->e.letters[i] - 'a';
		if (lv[l] >= 0)
			continue;
		body = loopv(L, body, &lv[l], ic(L, 0), ic(L, E->size[l]));
	}
	cg_expr *prod = NULL;
	for (int k = 0; k < E->e.nin; k++) {
		cg_expr *idx = NULL;
		for (int d = 0; d < E->e.rank[k]; d++) {
			int l = E->e.in[k][d] - 'a';
			idx = add64(L, idx, mul64(L, vr(L, lv[l]), E->st[k][l]));
		}
		cg_expr *v = ld(L, L->p->node_buf[n->args[k]], idx ? idx : ic(L, 0));
		prod = prod ? bin(L, CE_MUL, prod, v) : v;
	}
	set(L, body, acc, bin(L, CE_ADD, vr(L, acc), prod));
	int64_t os[MOE_MAX_RANK];
	strides_of(n, os);
	store(L, in, out, lin(L, iv, os, n->rank, NULL), vr(L, acc));
}

/* Letters of one role, in output order (or operand order for k). */
typedef struct group {
	int n;
	int l[MOE_MAX_RANK];
	int64_t size; /* product */
} group;

static void group_add(group *g, int l, int64_t size)
{
	g->l[g->n++] = l;
	g->size *= size;
}

/* Role analysis of a float two-operand contraction of the form
 * out[batch.., m.., n..] = sum_k A[..] B[..] (any operand layouts). */
typedef struct ein_plan {
	int ia, ib;
	char role[26];
	group gb, gm, gn, gk;
	bool mask_batch, mask_m;
} ein_plan;

static bool ein_analyze(lw *L, const ir_node *n, const ein *E0, ein_plan *P)
{
	if (E0->e.nin != 2 || !moe_dtype_is_float((moe_dtype)n->dtype))
		return false;
	const ein *E = E0;
	memset(P, 0, sizeof *P);
	P->ia = 0;
	P->ib = 1;
	char *role = P->role;
	for (int i = 0; i < E->e.nletters; i++) {
		int l = E->e.letters[i] - 'a';
		bool a = memchr(E->e.in[0], 'a' + l, (size_t)E->e.rank[0]) != NULL;
		bool bb = memchr(E->e.in[1], 'a' + l, (size_t)E->e.rank[1]) != NULL;
		bool o = memchr(E->e.out, 'a' + l, (size_t)E->e.out_rank) != NULL;
		if (a && bb && o)
			role[l] = 'g';
		else if (a && o)
			role[l] = 'm';
		else if (bb && o)
			role[l] = 'n';
		else if (a && bb)
			role[l] = 'k';
		else
			return false; /* summed over one operand only */
	}
	group gb = {0, {0}, 1}, gm = {0, {0}, 1}, gn = {0, {0}, 1}, gk = {0, {0}, 1};
	int d = 0;
	while (d < E->e.out_rank && role[E->e.out[d] - 'a'] == 'g')
		group_add(&gb, E->e.out[d] - 'a', E->size[E->e.out[d] - 'a']), d++;
	if (d == E->e.out_rank)
		return false;
	char first = role[E->e.out[d] - 'a'];
	if (first == 'n') { /* B's free letters come first: swap roles (a*b == b*a exactly) */
		P->ia = 1;
		P->ib = 0;
		for (int l = 0; l < 26; l++)
			role[l] = role[l] == 'm' ? 'n' : role[l] == 'n' ? 'm' : role[l];
	}
	while (d < E->e.out_rank && role[E->e.out[d] - 'a'] == 'm')
		group_add(&gm, E->e.out[d] - 'a', E->size[E->e.out[d] - 'a']), d++;
	while (d < E->e.out_rank && role[E->e.out[d] - 'a'] == 'n')
		group_add(&gn, E->e.out[d] - 'a', E->size[E->e.out[d] - 'a']), d++;
	if (d != E->e.out_rank || gm.n == 0 || gn.n == 0)
		return false;
	/* k letters in first-seen order: the generic loop's summation order */
	for (int i = 0; i < E->e.nletters; i++)
		if (role[E->e.letters[i] - 'a'] == 'k')
			group_add(&gk, E->e.letters[i] - 'a', E->size[E->e.letters[i] - 'a']);
	if (gk.n == 0 || gn.size < 4)
		return false;
	/* masks: scalar on the first batch letter (or on m0 without batch);
	 * vector over the single batch letter, counting m0 rows */
	int md = mask_depth(L, n);
	if (md == 1) {
		if (gb.n >= 1)
			P->mask_batch = true;
		else
			P->mask_m = true;
	} else if (md == 2) {
		if (gb.n != 1)
			return false;
		P->mask_m = true;
	}
	P->gb = gb;
	P->gm = gm;
	P->gn = gn;
	P->gk = gk;
	return true;
}

/* The dot-tile path: one summed letter, contiguous in B. */
static bool ein_dot_ok(const ein *E, const ein_plan *P)
{
	return P->gk.n == 1 && E->st[P->ib][P->gk.l[0]] == 1;
}

/* Is node g (a gather) read by einsum n as its B operand through a dot tile,
 * indexing the gathered tensor's first dimension by a batch letter? Then the
 * einsum reads x[i[g]] directly and the gather is not materialised. */
static bool gather_fusable_into(lw *L, moe_id gid, const ir_node *n)
{
	const ir_node *g = nd(L, gid);
	if (n->op != MOE_OP_EINSUM || g->op != MOE_OP_GATHER)
		return false;
	const ir_node *x = nd(L, g->args[0]), *ix = nd(L, g->args[1]);
	if (ir_norm_axis((int)ir_attr_int(g, "axis", 0), x->rank) != 0 || ix->rank != 1)
		return false;
	if (g->valid != MOE_NONE && nd(L, g->valid)->rank != 0)
		return false;
	if (!moe_dtype_is_float((moe_dtype)g->dtype))
		return false;
	ein E;
	ein_plan P;
	ein_setup(L, n, &E);
	if (!ein_analyze(L, n, &E, &P) || !ein_dot_ok(&E, &P))
		return false;
	if (n->args[P.ib] != gid || n->args[P.ia] == gid)
		return false;
	return P.role[E.e.in[P.ib][0] - 'a'] == 'g';
}

/* offset of a tile's accumulators: per tile for dot tiles, else shared */
static cg_expr *accbase(lw *L, bool dot, int tile, int64_t per_tile)
{
	return dot ? mul64(L, vr(L, tile), per_tile) : NULL;
}

/* Fast path for float two-operand contractions: per batch element the valid
 * A rows are widened to f32 into a packed [M, K] panel. With one summed letter
 * contiguous in B, tiles of DOT_LANES output columns are computed by CS_DOT
 * straight from B (a gathered B operand is read through its index). Otherwise
 * B is widened into [K, NT] column panels and the inner loop runs along a
 * contiguous panel row. Either way every output element accumulates its
 * products in increasing k order, exactly as the generic loop. Returns false
 * when the equation does not fit. */
static bool lower_einsum_fast(lw *L, cg_block *b, const ir_node *n, int out, const ein *E0)
{
	ein_plan P;
	if (!ein_analyze(L, n, E0, &P))
		return false;
	const ein E = *E0;
	int ia = P.ia, ib = P.ib;
	group gb = P.gb, gm = P.gm, gn = P.gn, gk = P.gk;
	bool mask_batch = P.mask_batch, mask_m = P.mask_m;
	bool dot = ein_dot_ok(&E, &P);

	cg_prog *p = L->p;
	moe_id bnode = n->args[ib];
	bool fused = L->fused[bnode];
	IR_ASSERT(!fused || dot);
	const ir_node *gnode = fused ? nd(L, bnode) : NULL;
	int A = p->node_buf[n->args[ia]], B = fused ? p->node_buf[gnode->args[0]] : p->node_buf[bnode];
	int lv[26];
	for (int i = 0; i < 26; i++)
		lv[i] = -1;
	int64_t M = gm.size, K = gk.size;
	int lastn = gn.l[gn.n - 1];
	int64_t NL = E.size[lastn], NT = dot ? DOT_LANES : NL < EIN_NT ? NL : EIN_NT, KT = EIN_KT;
	int64_t ntiles = (NL + NT - 1) / NT;
	/* bf16 times bf16 dot tiles keep A in bf16 (exact): the LLVM emitter may
	 * then use the CPU's bf16 dot-product instructions (cgen.h, CS_DOT) */
	bool abf = dot && p->bufs[A].dtype == MOE_BF16 && p->bufs[B].dtype == MOE_BF16;
	int apan = scratch(L, abf ? MOE_BF16 : MOE_F32, M * K), bpan = dot ? -1 : scratch(L, MOE_F32, K * NT);
	/* dot tiles are independent (a parallel loop): each has its own accumulators */
	int64_t accsz = M * NT * (dot ? ntiles : 1);
	int acc = scratch(L, MOE_F32, accsz);
	int64_t os[MOE_MAX_RANK];
	strides_of(n, os);
	int64_t m0rest = M / E.size[gm.l[0]]; /* rows per m0 index */

	/* batch loops */
	cg_block *in = b;
	for (int i = 0; i < gb.n; i++) {
		int l = gb.l[i];
		cg_expr *hi = ic(L, E.size[l]);
		if (i == 0 && mask_batch) {
			int cnt = newvar(L, CT_I64);
			set(L, in, cnt, clamp_count(L, ld(L, p->node_buf[n->valid], ic(L, 0)), E.size[l]));
			hi = vr(L, cnt);
			cg_block *body = loopv(L, in, &lv[l], ic(L, 0), hi);
			if (!L->nozero[L->cur])
				zero_range(L, in, out, mul64(L, vr(L, cnt), os[0]), ic(L, ir_numel(n)));
			in = body;
			continue;
		}
		in = loopv(L, in, &lv[l], ic(L, 0), hi);
	}
	/* m0 row count for this batch element */
	int m0 = gm.l[0];
	int mcnt = newvar(L, CT_I64);
	if (mask_m) {
		cg_expr *v = ld(L, p->node_buf[n->valid], gb.n ? vr(L, lv[gb.l[0]]) : ic(L, 0));
		set(L, in, mcnt, clamp_count(L, v, E.size[m0]));
		/* zero rows m0 >= mcnt of this batch element's output slab */
		cg_expr *slab = gb.n ? mul64(L, vr(L, lv[gb.l[0]]), os[0]) : NULL;
		int64_t rowst = E.ost[m0];
		if (!L->nozero[L->cur])
			zero_range(L, in, out, add64(L, slab, mul64(L, vr(L, mcnt), rowst)),
				add64(L, slab, ic(L, E.size[m0] * rowst)));
	} else {
		set(L, in, mcnt, ic(L, E.size[m0]));
	}
	cg_stmt *blk = iff(L, in, bin(L, CE_GT, vr(L, mcnt), ic(L, 0)));
	cg_block *bb = &blk->body;
	comment(L, in, "block with rows: pack, multiply, store");
	int rows = newvar(L, CT_I64);
	set(L, bb, rows, mul64(L, vr(L, mcnt), m0rest));

	/* operand index of A for (batch, m, k) letters; B for (batch, k, n) */
	/* pack A: rows in m-group order, k in k-group order */
	{
		cg_block *pb = bb;
		int r = newvar(L, CT_I64);
		set(L, pb, r, ic(L, 0));
		for (int i = 0; i < gm.n; i++)
			pb = loopv(L, pb, &lv[gm.l[i]], ic(L, 0), i == 0 ? vr(L, mcnt) : ic(L, E.size[gm.l[i]]));
		int kk = newvar(L, CT_I64);
		set(L, pb, kk, ic(L, 0));
		cg_block *kb = pb;
		for (int i = 0; i < gk.n; i++)
			kb = loopv(L, kb, &lv[gk.l[i]], ic(L, 0), ic(L, E.size[gk.l[i]]));
		cg_expr *ai = NULL;
		for (int dd = 0; dd < E.e.rank[ia]; dd++) {
			int l = E.e.in[ia][dd] - 'a';
			ai = add64(L, ai, mul64(L, vr(L, lv[l]), E.st[ia][l]));
		}
		store(L, kb, apan, add64(L, mul64(L, vr(L, r), K), vr(L, kk)), ld(L, A, ai));
		comment(L, bb, abf ? "pack A rows (bf16 stays bf16)" : "pack A rows to f32");
		set(L, kb, kk, add64(L, vr(L, kk), ic(L, 1)));
		set(L, pb, r, add64(L, vr(L, r), ic(L, 1)));
	}
	/* a fused gather: slab bexp[g] of its source, for g below its count */
	int widx = -1;
	cg_block *nb = bb;
	cg_block *zb = NULL; /* blocks past the gather's count: B is all +0 */
	if (fused) {
		int l0 = E.e.in[ib][0] - 'a';
		cg_expr *okc = NULL;
		if (gnode->valid != MOE_NONE)
			okc = bin(L, CE_LT, vr(L, lv[l0]), conv(L, ld(L, p->node_buf[gnode->valid], ic(L, 0)), CT_I64));
		widx = newvar(L, CT_I64);
		if (okc) {
			cg_stmt *s = iff(L, nb, okc);
			nb = &s->body;
			zb = &s->els;
		}
		set(L, nb, widx, conv(L, ld(L, p->node_buf[gnode->args[1]], vr(L, lv[l0])), CT_I64));
	}
	/* column panels: outer n letters, then tiles of the last n letter */
	for (int i = 0; i < gn.n - 1; i++)
		nb = loopv(L, nb, &lv[gn.l[i]], ic(L, 0), ic(L, E.size[gn.l[i]]));
	int n0, nt = newvar(L, CT_I64);
	int tile;
	cg_block *tb = nb;
	nb = loopv(L, nb, &tile, ic(L, 0), ic(L, ntiles));
	if (dot) /* tiles write disjoint accumulators and output columns; no faults */
		tb->last->par = true;
	n0 = newvar(L, CT_I64);
	set(L, nb, n0, mul64(L, vr(L, tile), NT));
	set(L, nb, nt, bin(L, CE_MIN, bin(L, CE_SUB, ic(L, NL), vr(L, n0)), ic(L, NT)));
	if (dot) {
		cg_expr *wi = NULL;
		for (int dd = 0; dd < E.e.rank[ib]; dd++) {
			int l = E.e.in[ib][dd] - 'a';
			cg_expr *pos = fused && dd == 0 ? vr(L, widx) :
				       l == lastn	       ? vr(L, n0) :
				       P.role[l] == 'k'	       ? NULL :
							 vr(L, lv[l]);
			if (pos)
				wi = add64(L, wi, mul64(L, pos, E.st[ib][l]));
		}
		cg_stmt *s = st(L, nb, CS_DOT);
		cg_dot *d = ir_alloc(&p->arena, sizeof *d);
		*d = (cg_dot){apan, B, acc, vr(L, rows), vr(L, nt), ic(L, 0), wi ? wi : ic(L, 0),
			mul64(L, vr(L, tile), M * NT), K, K, E.st[ib][lastn]};
		s->dot = d;
		comment(L, nb, "a tile of dot products, k ascending per element");
	} else {
		{ /* pack B panel: [K, NT] */
			int kk = newvar(L, CT_I64), j;
			set(L, nb, kk, ic(L, 0));
			cg_block *kb = nb;
			for (int i = 0; i < gk.n; i++)
				kb = loopv(L, kb, &lv[gk.l[i]], ic(L, 0), ic(L, E.size[gk.l[i]]));
			cg_block *jb = loopv(L, kb, &j, ic(L, 0), vr(L, nt));
			cg_expr *bi = NULL;
			for (int dd = 0; dd < E.e.rank[ib]; dd++) {
				int l = E.e.in[ib][dd] - 'a';
				cg_expr *pos = l == lastn ? add64(L, vr(L, n0), vr(L, j)) : vr(L, lv[l]);
				bi = add64(L, bi, mul64(L, pos, E.st[ib][l]));
			}
			store(L, jb, bpan, add64(L, mul64(L, vr(L, kk), NT), vr(L, j)), ld(L, B, bi));
			set(L, kb, kk, add64(L, vr(L, kk), ic(L, 1)));
			comment(L, nb, "pack a B column panel to f32");
		}
		{ /* zero accumulators */
			int r, j;
			cg_block *rb = loopv(L, nb, &r, ic(L, 0), vr(L, rows));
			cg_block *jb = loopv(L, rb, &j, ic(L, 0), vr(L, nt));
			store(L, jb, acc, add64(L, mul64(L, vr(L, r), NT), vr(L, j)), fc(L, -0.0f));
		}
		{ /* acc[r, j] += A[r, k] * B[k, j], k ascending */
			int kt, r, k, j, kend = newvar(L, CT_I64), av = newvar(L, CT_F32);
			int64_t nkt = (K + KT - 1) / KT;
			cg_block *tb = loopv(L, nb, &kt, ic(L, 0), ic(L, nkt));
			set(L, tb, kend, bin(L, CE_MIN, add64(L, mul64(L, vr(L, kt), KT), ic(L, KT)), ic(L, K)));
			cg_block *rb = loopv(L, tb, &r, ic(L, 0), vr(L, rows));
			cg_block *kb = loopv(L, rb, &k, mul64(L, vr(L, kt), KT), vr(L, kend));
			set(L, kb, av, ld(L, apan, add64(L, mul64(L, vr(L, r), K), vr(L, k))));
			cg_block *jb = loopv(L, kb, &j, ic(L, 0), vr(L, nt));
			cg_expr *ai = add64(L, mul64(L, vr(L, r), NT), vr(L, j));
			cg_expr *prod = bin(L, CE_MUL, vr(L, av), ld(L, bpan, add64(L, mul64(L, vr(L, k), NT), vr(L, j))));
			store(L, jb, acc, ai, bin(L, CE_ADD, ld(L, acc, ai), prod));
			comment(L, nb, "multiply the panel, k ascending per element");
		}
	}
	for (int pass = 0; pass < (zb ? 2 : 1); pass++) {
		cg_block *sbase = nb;
		if (pass == 1) { /* the gathered B is +0 here: the same sums with zero products */
			sbase = zb;
			for (int i = 0; i < gn.n - 1; i++)
				sbase = loopv(L, sbase, &lv[gn.l[i]], ic(L, 0), ic(L, E.size[gn.l[i]]));
			sbase = loopv(L, sbase, &tile, ic(L, 0), ic(L, ntiles));
			set(L, sbase, n0, mul64(L, vr(L, tile), NT));
			set(L, sbase, nt, bin(L, CE_MIN, bin(L, CE_SUB, ic(L, NL), vr(L, n0)), ic(L, NT)));
			int r, j, k, sv = newvar(L, CT_F32);
			cg_block *rb = loopv(L, sbase, &r, ic(L, 0), vr(L, rows));
			cg_block *jb = loopv(L, rb, &j, ic(L, 0), vr(L, nt));
			set(L, jb, sv, fc(L, -0.0f));
			cg_block *kb = loopv(L, jb, &k, ic(L, 0), ic(L, K));
			set(L, kb, sv,
				bin(L, CE_ADD, vr(L, sv),
					bin(L, CE_MUL, ld(L, apan, add64(L, mul64(L, vr(L, r), K), vr(L, k))), fc(L, 0.0f))));
			store(L, jb, acc, add64(L, accbase(L, dot, tile, M * NT), add64(L, mul64(L, vr(L, r), NT), vr(L, j))),
				vr(L, sv));
		}
		/* store rows of the panel */
		int r = newvar(L, CT_I64), j;
		set(L, sbase, r, ic(L, 0));
		cg_block *sb = sbase;
		for (int i = 0; i < gm.n; i++)
			sb = loopv(L, sb, &lv[gm.l[i]], ic(L, 0), i == 0 ? vr(L, mcnt) : ic(L, E.size[gm.l[i]]));
		cg_block *jb = loopv(L, sb, &j, ic(L, 0), vr(L, nt));
		cg_expr *oi = NULL;
		for (int dd = 0; dd < E.e.out_rank; dd++) {
			int l = E.e.out[dd] - 'a';
			cg_expr *pos = l == lastn ? add64(L, vr(L, n0), vr(L, j)) : vr(L, lv[l]);
			oi = add64(L, oi, mul64(L, pos, E.ost[l]));
		}
		store(L, jb, out, oi,
			ld(L, acc, add64(L, accbase(L, dot, tile, M * NT), add64(L, mul64(L, vr(L, r), NT), vr(L, j)))));
		set(L, sb, r, add64(L, vr(L, r), ic(L, 1)));
	}
	return true;
}

static void lower_einsum(lw *L, cg_block *b, const ir_node *n, int out)
{
	ein E;
	ein_setup(L, n, &E);
	if (!lower_einsum_fast(L, b, n, out, &E))
		lower_einsum_generic(L, b, n, out, &E);
}

/* ---------------- driver ---------------- */

void cgen_symbol(const cg_prog *p, const char *suffix, char *buf, size_t len)
{
	snprintf(buf, len, "moe_%s%s", p->cname, suffix ? suffix : "");
}

static void sanitize(const char *name, char *out, size_t len)
{
	size_t o = 0;
	for (const char *s = name && *name ? name : "layer"; *s && o + 1 < len; s++) {
		char c = *s;
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
		out[o++] = ok ? c : '_';
	}
	out[o] = 0;
}

void cgen_free(cg_prog *p)
{
	if (!p)
		return;
	moe_ctx *c = p->ctx;
	ctx_free(c, p->bufs, p->bufcap * sizeof *p->bufs);
	ctx_free(c, p->vars, p->varcap * sizeof *p->vars);
	ctx_free(c, p->node_buf, (p->g->nnodes + 1) * sizeof *p->node_buf);
	ctx_free(c, p->inputs, (p->g->nnodes + 1) * sizeof *p->inputs);
	ctx_free(c, p->weights, (p->g->nnodes + 1) * sizeof *p->weights);
	ctx_free(c, p->masks, (p->g->nnodes + 1) * sizeof *p->masks);
	ir_arena_free(&p->arena);
	ctx_free(c, p, sizeof *p);
}

static bool supported_dtype(moe_dtype t)
{
	return t == MOE_F32 || t == MOE_BF16 || t == MOE_I32 || t == MOE_BOOL || moe_dtype_is_storage(t);
}

cg_prog *cgen_lower(moe_ctx *ctx, const moe_graph *g)
{
	if (moe_graph_verify(ctx, g) != MOE_OK)
		return NULL;
	bool bad = false;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_TOPK || n->op == MOE_OP_EXPERTS) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc,
				"the host backend does not lower '%s': run the host pipeline first (lower-topk, blockwise-dispatch)",
				ir_ops[n->op].name);
			bad = true;
		} else if (sc_composite((moe_op)n->op)) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc,
				"the host backend does not lower the composite op '%s': run canonicalize first (ir/scalar.h)",
				ir_ops[n->op].name);
			bad = true;
		} else if (!supported_dtype((moe_dtype)n->dtype)) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "the host backend does not support type %s yet",
				moe_dtype_name((moe_dtype)n->dtype));
			bad = true;
		}
	}
	if (g->nout == 0) {
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "layer '%s' has no outputs", g->name ? g->name : "");
		bad = true;
	}
	if (bad)
		return NULL;

	cg_prog *p = ctx_alloc(ctx, sizeof *p);
	p->ctx = ctx;
	p->g = g;
	ir_arena_init(&p->arena, ctx);
	sanitize(g->name, p->cname, sizeof p->cname);
	size_t nn = g->nnodes + 1;
	p->node_buf = ctx_alloc(ctx, nn * sizeof *p->node_buf);
	p->inputs = ctx_alloc(ctx, nn * sizeof *p->inputs);
	p->weights = ctx_alloc(ctx, nn * sizeof *p->weights);
	p->masks = ctx_alloc(ctx, nn * sizeof *p->masks);
	p->noutputs = g->nout;
	lw L = {p, ctx, g, 0, NULL, NULL, 0, NULL, NULL};
	int64_t end = (int64_t)g->nnodes;
	L.fused = ctx_alloc(ctx, nn * sizeof *L.fused);
	memset(L.fused, 0, nn * sizeof *L.fused);
	L.nozero = ctx_alloc(ctx, nn * sizeof *L.nozero);
	memset(L.nozero, 0, nn * sizeof *L.nozero);

	/* first output occurrence of each node */
	int64_t *outpos = ctx_alloc(ctx, nn * sizeof *outpos);
	for (moe_id i = 0; i < g->nnodes; i++)
		outpos[i] = -1;
	for (uint32_t j = 0; j < g->nout; j++)
		if (outpos[g->outputs[j]] < 0)
			outpos[g->outputs[j]] = j;

	/* masked nodes whose users read only their valid elements: elementwise
	 * users of the same shape and mask, and einsums with the same row mask
	 * reading them once with the output's two leading letters */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		L.nozero[i] = n->valid != MOE_NONE && outpos[i] < 0 && (ir_ops[n->op].flags & OPF_ELEM || n->op == MOE_OP_EINSUM);
	}
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *u = N(g, i);
		for (uint32_t a = 0; a < u->nargs; a++) {
			moe_id x = u->args[a];
			if (x == MOE_NONE || !L.nozero[x])
				continue;
			const ir_node *n = N(g, x);
			bool ok = false;
			if (u->valid == n->valid && ir_ops[u->op].flags & OPF_ELEM)
				ok = ir_same_shape(u, n);
			else if (u->valid == n->valid && u->op == MOE_OP_EINSUM && N(g, u->valid)->rank == 1 && n->rank >= 2) {
				ir_einsum e;
				char msg[160];
				ok = ir_einsum_parse(ir_attr_str(u, "eq", ""), &e, msg, sizeof msg) && e.out_rank >= 2 &&
				     e.in[a][0] == e.out[0] && e.in[a][1] == e.out[1];
				for (uint32_t b2 = 0; b2 < u->nargs; b2++)
					ok &= b2 == a || u->args[b2] != x;
			}
			if (!ok)
				L.nozero[x] = false;
		}
		if (u->valid != MOE_NONE && L.nozero[u->valid])
			L.nozero[u->valid] = false;
	}

	/* gathers whose every user is an einsum reading them in place */
	{
		uint32_t *users = ctx_alloc(ctx, nn * sizeof *users), *fusers = ctx_alloc(ctx, nn * sizeof *fusers);
		memset(users, 0, nn * sizeof *users);
		memset(fusers, 0, nn * sizeof *fusers);
		for (moe_id i = 0; i < g->nnodes; i++) {
			const ir_node *n = N(g, i);
			for (uint32_t a = 0; a < n->nargs; a++) {
				moe_id x = n->args[a];
				if (x == MOE_NONE)
					continue;
				users[x]++;
				if (N(g, x)->op == MOE_OP_GATHER && gather_fusable_into(&L, x, n))
					fusers[x]++;
			}
			if (n->valid != MOE_NONE)
				users[n->valid]++;
		}
		for (moe_id i = 0; i < g->nnodes; i++)
			L.fused[i] = N(g, i)->op == MOE_OP_GATHER && outpos[i] < 0 && users[i] > 0 && users[i] == fusers[i];
		ctx_free(ctx, users, nn * sizeof *users);
		ctx_free(ctx, fusers, nn * sizeof *fusers);
	}

	/* storage of every node */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		L.cur = i;
		moe_op op = (moe_op)n->op;
		if (op == MOE_OP_INPUT)
			p->node_buf[i] = newbuf(&L, CB_INPUT, (moe_dtype)n->dtype, ir_numel(n), p->ninputs, i),
			p->inputs[p->ninputs++] = i;
		else if (op == MOE_OP_WEIGHT)
			p->node_buf[i] = newbuf(&L, CB_WEIGHT, (moe_dtype)n->dtype, ir_numel(n), p->nweights, i),
			p->weights[p->nweights++] = i;
		else if (outpos[i] >= 0)
			p->node_buf[i] = newbuf(&L, CB_OUTPUT, (moe_dtype)n->dtype, ir_numel(n), (uint32_t)outpos[i], i);
		else if (op == MOE_OP_RESHAPE)
			p->node_buf[i] = p->node_buf[n->args[0]]; /* a view */
		else if (L.fused[i])
			p->node_buf[i] = -1; /* read in place by its users */
		else
			p->node_buf[i] = newbuf(&L, CB_WORK, (moe_dtype)n->dtype, ir_numel(n), 0, i);
		for (uint32_t a = 0; a < n->nargs; a++) {
			moe_id x = n->args[a];
			if (x == MOE_NONE)
				continue;
			use(&L, x, i);
			if (L.fused[x]) { /* the einsum reads the gather's operands and mask */
				use(&L, N(g, x)->args[0], i);
				use(&L, N(g, x)->args[1], i);
				if (N(g, x)->valid != MOE_NONE)
					use(&L, N(g, x)->valid, i);
			}
		}
		if (n->valid != MOE_NONE)
			use(&L, n->valid, i);
	}
	for (uint32_t j = 0; j < g->nout; j++)
		use(&L, g->outputs[j], end);
	/* vector masks of einsums are kept to the end for block statistics */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_EINSUM || n->valid == MOE_NONE || N(g, n->valid)->rank != 1)
			continue;
		int mb = p->node_buf[n->valid];
		bool seen = false;
		for (uint32_t k = 0; k < p->nmasks; k++)
			seen |= p->masks[k].buf == mb;
		if (!seen)
			p->masks[p->nmasks++] = (cg_mask){mb, N(g, n->valid)->shape[0], n->shape[1]};
		use(&L, n->valid, end);
	}

	/* code, node by node */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		L.cur = i;
		int out = p->node_buf[i];
		cg_block *b = &p->body;
		cg_stmt *mark = b->last;
		switch ((moe_op)n->op) {
		case MOE_OP_INPUT:
		case MOE_OP_WEIGHT: break;
		case MOE_OP_CONST: bad |= !lower_const(&L, b, n, out); break;
		case MOE_OP_IOTA: lower_iota(&L, b, n, out); break;
		case MOE_OP_REDUCE_SUM:
		case MOE_OP_REDUCE_MAX:
		case MOE_OP_REDUCE_MIN: lower_reduce(&L, b, n, out); break;
		case MOE_OP_SOFTMAX: lower_softmax(&L, b, n, out); break;
		case MOE_OP_CUMSUM: lower_cumsum(&L, b, n, out); break;
		case MOE_OP_EINSUM: lower_einsum(&L, b, n, out); break;
		case MOE_OP_ONE_HOT: lower_one_hot(&L, b, n, out); break;
		case MOE_OP_FILTER: bad |= !lower_filter(&L, b, n, out); break;
		case MOE_OP_GATHER:
			if (L.fused[i])
				lower_gather_checks(&L, b, n);
			else
				lower_gather(&L, b, n, out);
			break;
		case MOE_OP_TAKE_ALONG: lower_take_along(&L, b, n, out); break;
		case MOE_OP_DEQUANT: lower_dequant(&L, b, n, out); break;
		case MOE_OP_SCATTER: lower_scatter(&L, b, n, out); break;
		case MOE_OP_RESHAPE:
			if (out != p->node_buf[n->args[0]])
				copy_flat(&L, b, out, p->node_buf[n->args[0]], ir_numel(n));
			break;
		case MOE_OP_SLICE: lower_slice(&L, b, n, out); break;
		case MOE_OP_CONCAT: lower_concat(&L, b, n, out); break;
		case MOE_OP_BROADCAST: lower_broadcast(&L, b, n, out); break;
		case MOE_OP_TOPK:
		case MOE_OP_EXPERTS:
		case MOE_OP_COUNT: IR_ASSERT(!"rejected above"); break;
		default: lower_elem(&L, b, n, out); break;
		}
		cg_stmt *first = mark ? mark->next : b->first;
		if (first) {
			char *c = ir_alloc(&p->arena, 96);
			snprintf(c, 96, "%%%u = %s", (unsigned)i, ir_ops[n->op].name);
			first->comment = c;
		}
	}
	/* outputs that are leaves, repeated, or views */
	for (uint32_t j = 0; j < g->nout; j++) {
		moe_id v = g->outputs[j];
		const cg_buf *src = &p->bufs[p->node_buf[v]];
		if (src->kind == CB_OUTPUT && src->index == j)
			continue;
		L.cur = (moe_id)end;
		int dst = newbuf(&L, CB_OUTPUT, (moe_dtype)N(g, v)->dtype, ir_numel(N(g, v)), j, v);
		L.life0[dst] = L.life1[dst] = end;
		copy_flat(&L, &p->body, dst, p->node_buf[v], ir_numel(N(g, v)));
	}
	ctx_free(ctx, outpos, nn * sizeof *outpos);
	ctx_free(ctx, L.fused, nn * sizeof *L.fused);
	ctx_free(ctx, L.nozero, nn * sizeof *L.nozero);
	if (bad) {
		ctx_free(ctx, L.life0, p->bufcap * sizeof(int64_t));
		ctx_free(ctx, L.life1, p->bufcap * sizeof(int64_t));
		cgen_free(p);
		return NULL;
	}
	plan_workspace(&L);
	ctx_free(ctx, L.life0, p->bufcap * sizeof(int64_t));
	ctx_free(ctx, L.life1, p->bufcap * sizeof(int64_t));
	return p;
}
