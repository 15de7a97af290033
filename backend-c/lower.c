/* backend-c/lower.c: graph -> kernel form (cgen.h), storage and workspace plan.
 *
 * One loop nest per node, in node order. Every node's value lives in a flat
 * buffer: a graph input or weight pointer, an output pointer (the first
 * occurrence of a graph output is computed in place), or a slice of the
 * workspace. Workspace offsets come from a liveness-based first-fit plan, so
 * buffers whose lifetimes do not overlap share memory. A reshape that is not a
 * graph output is a view of its operand's buffer (no copy). */
#include "backend-c/lower_int.h"

#include "ir/scalar.h"
#include "moec/runtime.h"

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
int cgen_scratch(lw *L, moe_dtype t, int64_t numel)
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
	case MOE_OP_ADD: return fl ? farith(L, b, CE_ADD, x[0], x[1]) : bin(L, CE_ADD, x[0], x[1]);
	case MOE_OP_SUB: return fl ? farith(L, b, CE_SUB, x[0], x[1]) : bin(L, CE_SUB, x[0], x[1]);
	case MOE_OP_MUL: return fl ? farith(L, b, CE_MUL, x[0], x[1]) : bin(L, CE_MUL, x[0], x[1]);
	case MOE_OP_DIV:
		if (fl)
			return farith(L, b, CE_FDIV, x[0], x[1]);
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

/* Whether every operand leaf of n (through inlined operands) has root's shape
 * or one element, so that one flat loop serves them all. */
static bool leaves_flat(lw *L, const ir_node *n, const ir_node *root)
{
	for (uint32_t i = 0; i < n->nargs; i++) {
		const ir_node *a = nd(L, n->args[i]);
		if (L->inl[n->args[i]] ? !leaves_flat(L, a, root) : ir_numel(a) != 1 && !ir_same_shape(a, root))
			return false;
	}
	return true;
}

/* ---- tables: a unary float op of a bf16 value has 2^16 possible results ---- */

enum { TAB_N = 1 << 16, TAB_MIN = 2 * TAB_N };

/* a transcendental unary op whose operand's value is exactly a bf16 (a bf16
 * node, or a cast of one to f32) */
static bool tabulable(lw *L, moe_id id)
{
	const ir_node *n = nd(L, id);
	moe_op op = (moe_op)n->op;
	if (!(op == MOE_OP_SIGMOID || op == MOE_OP_EXP || op == MOE_OP_LOG || op == MOE_OP_TANH || op == MOE_OP_ERF ||
		    op == MOE_OP_SQRT || op == MOE_OP_RSQRT) ||
		(n->dtype != MOE_F32 && n->dtype != MOE_BF16))
		return false;
	const ir_node *a = nd(L, n->args[0]);
	return a->dtype == MOE_BF16 ||
	       (a->op == MOE_OP_CAST && a->dtype == MOE_F32 && nd(L, a->args[0])->dtype == MOE_BF16);
}

/* n's value from its operands: computed, or looked up in n's table by the
 * operand's upper 16 bits (a widened bf16 is never a signalling NaN, so the
 * entry is the value computed from exactly that operand) */
static cg_expr *elem_value(lw *L, cg_block *in, moe_id id, cg_expr **x)
{
	if (L->tab[id] < 0)
		return elem_expr(L, in, nd(L, id), x);
	cg_expr *k = bin(L, CE_LSHR, mk(L, CE_BITS, CT_I32, x[0], NULL, NULL), ic32(L, 16));
	return ld(L, L->tab[id], conv(L, k, CT_I64));
}

/* the tabulable nodes of n's inlined operand tree (n included), at most max */
static int tab_nodes(lw *L, moe_id id, moe_id *out, int k, int max)
{
	if (k < max && tabulable(L, id))
		out[k++] = id;
	const ir_node *n = nd(L, id);
	for (uint32_t i = 0; i < n->nargs; i++)
		if (L->inl[n->args[i]])
			k = tab_nodes(L, n->args[i], out, k, max);
	return k;
}

/* the number of elements n's loops compute: its valid rows times the rest */
static cg_expr *elem_count(lw *L, cg_block *b, const ir_node *n)
{
	int md = mask_depth(L, n);
	if (!md)
		return ic(L, ir_numel(n));
	int vbuf = L->p->node_buf[n->valid];
	if (md == 1)
		return mul64(L, clamp_count(L, ld(L, vbuf, ic(L, 0)), n->shape[0]), ir_numel(n) / n->shape[0]);
	int cnt = newvar(L, CT_I64), g;
	set(L, b, cnt, ic(L, 0));
	cg_block *lg = loopv(L, b, &g, ic(L, 0), ic(L, n->shape[0]));
	set(L, lg, cnt, bin(L, CE_ADD, vr(L, cnt), clamp_count(L, ld(L, vbuf, vr(L, g)), n->shape[1])));
	return mul64(L, vr(L, cnt), ir_numel(n) / (n->shape[0] * n->shape[1]));
}

/* fills the table of node id: entry k = the op of the f32 with bits k << 16 */
static void tab_fill(lw *L, cg_block *b, moe_id id, int buf)
{
	int k;
	cg_block *in = loopv(L, b, &k, ic(L, 0), ic(L, TAB_N));
	par_if_big(b, TAB_N);
	cg_expr *x = mk(L, CE_BITS, CT_F32, bin(L, CE_SHL, conv(L, vr(L, k), CT_I32), ic32(L, 16)), NULL, NULL);
	store(L, in, buf, vr(L, k), elem_expr(L, in, nd(L, id), &x));
}

/* The value of operand a at the element of an elementwise output of rank r
 * reached by the loop variables iv (flat loop: j >= 0 is the element index).
 * An inlined operand is computed here exactly as it would have been stored
 * and loaded back: bf16 rounded (and a NaN quieted) as by the store. */
static cg_expr *elem_operand(lw *L, cg_block *in, moe_id a, int r, const int *iv, int j)
{
	const ir_node *an = nd(L, a);
	if (!L->inl[a]) {
		int64_t as[MOE_MAX_RANK];
		bcast_strides(an, r, as);
		cg_expr *idx = j < 0 ? lin(L, iv, as, r, NULL) : ir_numel(an) == 1 ? ic(L, 0) : vr(L, j);
		return ld(L, L->p->node_buf[a], idx);
	}
	cg_expr *x[3];
	for (uint32_t i = 0; i < an->nargs; i++)
		x[i] = elem_operand(L, in, an->args[i], r, iv, j);
	cg_expr *v = elem_value(L, in, a, x);
	return an->dtype == MOE_BF16 ? un(L, CE_RBF16, v) : v;
}

cg_expr *cgen_elem_operand(lw *L, cg_block *in, moe_id a, int r, const int *iv)
{
	return elem_operand(L, in, a, r, iv, -1);
}

static void elem_loop(lw *L, cg_block *b, const ir_node *n, int out)
{
	int r = n->rank, iv[MOE_MAX_RANK], j = -1;
	int64_t os[MOE_MAX_RANK];
	strides_of(n, os);
	bool flat = n->valid == MOE_NONE && leaves_flat(L, n, n);
	cg_block *in;
	cg_expr *oidx;
	if (flat && r > 0) { /* one loop over all elements */
		in = loopv(L, b, &j, ic(L, 0), ic(L, ir_numel(n)));
		par_if_big(b, ir_numel(n)); /* one element per iteration */
		oidx = vr(L, j);
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
	}
	cg_expr *x[3];
	for (uint32_t i = 0; i < n->nargs; i++)
		x[i] = elem_operand(L, in, n->args[i], r, iv, j);
	store(L, in, out, oidx, elem_value(L, in, L->cur, x));
}

/* With a transcendental of a bf16 value among the computed ops and at least
 * TAB_MIN elements to compute (counted at run time under a mask), each such
 * op is evaluated once per possible operand into a table first and looked up
 * in the loop: bitwise the same values, 2^16 evaluations instead of one per
 * element (the SwiGLU's sigmoid of a large T). */
static void lower_elem(lw *L, cg_block *b, const ir_node *n, int out)
{
	moe_id t[4];
	int nt = ir_numel(n) >= TAB_MIN ? tab_nodes(L, L->cur, t, 0, 4) : 0;
	if (!nt) {
		elem_loop(L, b, n, out);
		return;
	}
	cg_stmt *s = iff(L, b, bin(L, CE_GE, elem_count(L, b, n), ic(L, TAB_MIN)));
	for (int i = 0; i < nt; i++) {
		int tb = L->tab[t[i]] = cgen_scratch(L, MOE_F32, TAB_N);
		L->p->bufs[tb].table = true; /* a slice of its own for the whole call (cg_buf.table) */
		L->life0[tb] = 0;
		L->life1[tb] = INT64_MAX;
		tab_fill(L, &s->body, t[i], L->tab[t[i]]);
	}
	elem_loop(L, &s->body, n, out);
	for (int i = 0; i < nt; i++)
		L->tab[t[i]] = -1;
	elem_loop(L, &s->els, n, out);
}

/* Elementwise nodes not stored but computed in their users' loops: every use
 * is as an operand of an elementwise node of the same shape and mask, and
 * there is one use, or the node is a cast of a stored value (cheap to compute
 * twice). Not
 * outputs, integer division (its fault check) or bitcasts. */
static void mark_inline(lw *L, const int64_t *outpos)
{
	const moe_graph *g = L->g;
	size_t nn = g->nnodes + 1;
	uint32_t *uses = ctx_alloc(L->ctx, nn * sizeof *uses);
	bool *ok = ctx_alloc(L->ctx, nn * sizeof *ok);
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		moe_dtype t = (moe_dtype)n->dtype;
		uses[i] = 0;
		ok[i] = ir_ops[n->op].flags & OPF_ELEM && outpos[i] < 0 && n->op != MOE_OP_BITCAST &&
		        (t == MOE_F32 || t == MOE_BF16 || t == MOE_I32 || t == MOE_BOOL) &&
		        !(n->op == MOE_OP_DIV && !moe_dtype_is_float((moe_dtype)N(g, n->args[0])->dtype));
	}
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *u = N(g, i);
		bool elem = ir_ops[u->op].flags & OPF_ELEM;
		for (uint32_t a = 0; a < u->nargs; a++) {
			moe_id x = u->args[a];
			if (x == MOE_NONE)
				continue;
			uses[x]++;
			if (!elem || u->valid != N(g, x)->valid || !ir_same_shape(u, N(g, x)))
				ok[x] = false;
		}
		if (u->valid != MOE_NONE)
			ok[u->valid] = false;
	}
	for (moe_id i = 0; i < g->nnodes; i++)
		L->inl[i] = ok[i] && uses[i] > 0 &&
		            (uses[i] == 1 || (N(g, i)->op == MOE_OP_CAST && !L->inl[N(g, i)->args[0]]));
	/* a row reduction over a reshape [A, K, C] of an unmasked elementwise node
	 * x of shape [A K, C], each read once (the MoE combine: the weighted
	 * expert rows summed per token): x is computed in the reduction's loop
	 * instead of stored and read back */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if ((n->op != MOE_OP_REDUCE_SUM && n->op != MOE_OP_REDUCE_MAX && n->op != MOE_OP_REDUCE_MIN) ||
			!cgen_reduce_rows_ok(L, n))
			continue;
		moe_id r = n->args[0];
		const ir_node *rn = N(g, r);
		if (rn->op != MOE_OP_RESHAPE || outpos[r] >= 0 || uses[r] != 1 || rn->rank != 3)
			continue;
		moe_id x = rn->args[0];
		const ir_node *xn = N(g, x);
		bool base = ir_ops[xn->op].flags & OPF_ELEM && outpos[x] < 0 && xn->op != MOE_OP_BITCAST &&
			    xn->dtype == n->dtype && xn->valid == MOE_NONE &&
			    !(xn->op == MOE_OP_DIV && !moe_dtype_is_float((moe_dtype)N(g, xn->args[0])->dtype));
		if (base && uses[x] == 1 && xn->rank == 2 && xn->shape[0] == rn->shape[0] * rn->shape[1] &&
			xn->shape[1] == rn->shape[2])
			L->inl[x] = L->inl[r] = true;
	}
	ctx_free(L->ctx, uses, nn * sizeof *uses);
	ctx_free(L->ctx, ok, nn * sizeof *ok);
}

/* the buffers an operand x of the node at `at` is read from: its own, or an
 * inlined operand's operands */
static void use_operand(lw *L, moe_id x, int64_t at)
{
	use(L, x, at);
	if (!L->inl[x])
		return;
	const ir_node *n = nd(L, x);
	for (uint32_t a = 0; a < n->nargs; a++)
		use_operand(L, n->args[a], at);
	if (n->valid != MOE_NONE)
		use(L, n->valid, at);
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

/* Errors for what the host backend does not lower (the ops the host
 * pipeline removes, composite ops, unsupported types) and a layer without
 * outputs; false after one. */
static bool lowerable(moe_ctx *ctx, const moe_graph *g)
{
	bool bad = false;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_EXPERTS || n->op == MOE_OP_ALL_TO_ALL) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc,
				"the host backend does not lower '%s': run the host pipeline first (blockwise-dispatch, "
				"lower-exchange)",
				ir_ops[n->op].name);
			bad = true;
		} else if (n->op == MOE_OP_BLOCK_LOOP) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc,
				"the host backend does not lower 'block_loop': run flatten-blocks first (the host pipeline does)");
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
	return !bad;
}

/* L->nozero: masked nodes whose users read only their valid elements:
 * elementwise users of the same shape and mask, and einsums with the same
 * row mask reading them once with the output's two leading letters. */
static void mark_nozero(lw *L, const int64_t *outpos)
{
	const moe_graph *g = L->g;
	/* masked nodes whose users read only their valid elements: elementwise
	 * users of the same shape and mask, and einsums with the same row mask
	 * reading them once with the output's two leading letters */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		L->nozero[i] = n->valid != MOE_NONE && outpos[i] < 0 && (ir_ops[n->op].flags & OPF_ELEM || n->op == MOE_OP_EINSUM);
	}
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *u = N(g, i);
		for (uint32_t a = 0; a < u->nargs; a++) {
			moe_id x = u->args[a];
			if (x == MOE_NONE || !L->nozero[x])
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
				L->nozero[x] = false;
		}
		if (u->valid != MOE_NONE && L->nozero[u->valid])
			L->nozero[u->valid] = false;
	}
}

/* L->fused: gathers whose every user is an einsum reading them in place. */
static void mark_fused(lw *L, const int64_t *outpos)
{
	const moe_graph *g = L->g;
	size_t nn = g->nnodes + 1;
	uint32_t *users = ctx_alloc(L->ctx, nn * sizeof *users), *fusers = ctx_alloc(L->ctx, nn * sizeof *fusers);
	memset(users, 0, nn * sizeof *users);
	memset(fusers, 0, nn * sizeof *fusers);
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t a = 0; a < n->nargs; a++) {
			moe_id x = n->args[a];
			if (x == MOE_NONE)
				continue;
			users[x]++;
			if (N(g, x)->op == MOE_OP_GATHER && cgen_gather_fusable_into(L, x, n))
				fusers[x]++;
		}
		if (n->valid != MOE_NONE)
			users[n->valid]++;
	}
	for (moe_id i = 0; i < g->nnodes; i++)
		L->fused[i] = N(g, i)->op == MOE_OP_GATHER && outpos[i] < 0 && users[i] > 0 && users[i] == fusers[i];
	ctx_free(L->ctx, users, nn * sizeof *users);
	ctx_free(L->ctx, fusers, nn * sizeof *fusers);
}

/* Every node's buffer (inputs, weights, outputs, views, work buffers; none
 * for what its users read in place or compute), each buffer's lifetime, and
 * the vector masks of einsums, kept to the end for block statistics. */
static void assign_storage(lw *L, const int64_t *outpos, int64_t end)
{
	const moe_graph *g = L->g;
	cg_prog *p = L->p;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		L->cur = i;
		moe_op op = (moe_op)n->op;
		if (op == MOE_OP_INPUT)
			p->node_buf[i] = newbuf(L, CB_INPUT, (moe_dtype)n->dtype, ir_numel(n), p->ninputs, i),
			p->inputs[p->ninputs++] = i;
		else if (op == MOE_OP_WEIGHT)
			p->node_buf[i] = newbuf(L, CB_WEIGHT, (moe_dtype)n->dtype, ir_numel(n), p->nweights, i),
			p->weights[p->nweights++] = i;
		else if (outpos[i] >= 0)
			p->node_buf[i] = newbuf(L, CB_OUTPUT, (moe_dtype)n->dtype, ir_numel(n), (uint32_t)outpos[i], i);
		else if (op == MOE_OP_RESHAPE)
			p->node_buf[i] = p->node_buf[n->args[0]]; /* a view */
		else if (L->fused[i] || L->inl[i])
			p->node_buf[i] = -1; /* read in place, or computed, by its users */
		else
			p->node_buf[i] = newbuf(L, CB_WORK, (moe_dtype)n->dtype, ir_numel(n), 0, i);
		for (uint32_t a = 0; a < n->nargs; a++) {
			moe_id x = n->args[a];
			if (x == MOE_NONE)
				continue;
			use_operand(L, x, i);
			if (L->fused[x]) { /* the einsum reads the gather's operands and mask */
				use(L, N(g, x)->args[0], i);
				use(L, N(g, x)->args[1], i);
				if (N(g, x)->valid != MOE_NONE)
					use(L, N(g, x)->valid, i);
			}
		}
		if (n->valid != MOE_NONE)
			use(L, n->valid, i);
	}
	for (uint32_t j = 0; j < g->nout; j++)
		use(L, g->outputs[j], end);
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
		use(L, n->valid, end);
	}
}

/* The code, node by node in order; false when a node cannot be lowered
 * (after its diagnostic). */
static bool lower_nodes(lw *L)
{
	const moe_graph *g = L->g;
	cg_prog *p = L->p;
	bool bad = false;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		L->cur = i;
		int out = p->node_buf[i];
		cg_block *b = &p->body;
		cg_stmt *mark = b->last;
		switch ((moe_op)n->op) {
		case MOE_OP_INPUT:
		case MOE_OP_WEIGHT: break;
		case MOE_OP_CONST: bad |= !cgen_lower_const(L, b, n, out); break;
		case MOE_OP_IOTA: cgen_lower_iota(L, b, n, out); break;
		case MOE_OP_REDUCE_SUM:
		case MOE_OP_REDUCE_MAX:
		case MOE_OP_REDUCE_MIN: cgen_lower_reduce(L, b, n, out); break;
		case MOE_OP_SOFTMAX: cgen_lower_softmax(L, b, n, out); break;
		case MOE_OP_CUMSUM: cgen_lower_cumsum(L, b, n, out); break;
		case MOE_OP_EINSUM: cgen_lower_einsum(L, b, n, out); break;
		case MOE_OP_ONE_HOT: cgen_lower_one_hot(L, b, n, out); break;
		case MOE_OP_FILTER: bad |= !cgen_lower_filter(L, b, n, out); break;
		case MOE_OP_GATHER:
			if (L->fused[i])
				cgen_lower_gather_checks(L, b, n);
			else
				cgen_lower_gather(L, b, n, out);
			break;
		case MOE_OP_TAKE_ALONG: cgen_lower_take_along(L, b, n, out); break;
		case MOE_OP_DEQUANT: cgen_lower_dequant(L, b, n, out); break;
		case MOE_OP_SCATTER: cgen_lower_scatter(L, b, n, out); break;
		case MOE_OP_RESHAPE:
			if (out != p->node_buf[n->args[0]])
				cgen_copy_flat(L, b, out, p->node_buf[n->args[0]], ir_numel(n));
			break;
		case MOE_OP_SLICE: cgen_lower_slice(L, b, n, out); break;
		case MOE_OP_CONCAT: cgen_lower_concat(L, b, n, out); break;
		case MOE_OP_BROADCAST: cgen_lower_broadcast(L, b, n, out); break;
		case MOE_OP_TOPK: cgen_lower_topk(L, b, n, out); break;
		case MOE_OP_EXPERTS:
		case MOE_OP_ALL_TO_ALL:
		case MOE_OP_COUNT: IR_ASSERT(!"rejected above"); break;
		default:
			if (!L->inl[i])
				lower_elem(L, b, n, out);
			break;
		}
		cg_stmt *first = mark ? mark->next : b->first;
		if (first) {
			char *c = ir_alloc(&p->arena, 96);
			snprintf(c, 96, "%%%u = %s", (unsigned)i, ir_ops[n->op].name);
			first->comment = c;
		}
	}
	return !bad;
}

/* Outputs that are leaves, repeated, or views: copied into their own
 * output buffers at the end. */
static void copy_outputs(lw *L, int64_t end)
{
	const moe_graph *g = L->g;
	cg_prog *p = L->p;
	for (uint32_t j = 0; j < g->nout; j++) {
		moe_id v = g->outputs[j];
		const cg_buf *src = &p->bufs[p->node_buf[v]];
		if (src->kind == CB_OUTPUT && src->index == j)
			continue;
		L->cur = (moe_id)end;
		int dst = newbuf(L, CB_OUTPUT, (moe_dtype)N(g, v)->dtype, ir_numel(N(g, v)), j, v);
		L->life0[dst] = L->life1[dst] = end;
		cgen_copy_flat(L, &p->body, dst, p->node_buf[v], ir_numel(N(g, v)));
	}
}

cg_prog *cgen_lower(moe_ctx *ctx, const moe_graph *g)
{
	if (moe_graph_verify(ctx, g) != MOE_OK)
		return NULL;
	if (!lowerable(ctx, g))
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
	lw L = {p, ctx, g, 0, NULL, NULL, 0, NULL, NULL, NULL, NULL};
	int64_t end = (int64_t)g->nnodes;
	L.fused = ctx_alloc(ctx, nn * sizeof *L.fused);
	memset(L.fused, 0, nn * sizeof *L.fused);
	L.nozero = ctx_alloc(ctx, nn * sizeof *L.nozero);
	memset(L.nozero, 0, nn * sizeof *L.nozero);
	L.inl = ctx_alloc(ctx, nn * sizeof *L.inl);
	L.tab = ctx_alloc(ctx, nn * sizeof *L.tab);
	for (size_t i = 0; i < nn; i++)
		L.tab[i] = -1;

	/* first output occurrence of each node */
	int64_t *outpos = ctx_alloc(ctx, nn * sizeof *outpos);
	for (moe_id i = 0; i < g->nnodes; i++)
		outpos[i] = -1;
	for (uint32_t j = 0; j < g->nout; j++)
		if (outpos[g->outputs[j]] < 0)
			outpos[g->outputs[j]] = j;

	mark_inline(&L, outpos);

	mark_nozero(&L, outpos);
	mark_fused(&L, outpos);
	assign_storage(&L, outpos, end);
	bool bad = !lower_nodes(&L);
	copy_outputs(&L, end);
	ctx_free(ctx, outpos, nn * sizeof *outpos);
	ctx_free(ctx, L.fused, nn * sizeof *L.fused);
	ctx_free(ctx, L.nozero, nn * sizeof *L.nozero);
	ctx_free(ctx, L.inl, nn * sizeof *L.inl);
	ctx_free(ctx, L.tab, nn * sizeof *L.tab);
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
