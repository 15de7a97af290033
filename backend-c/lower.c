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

/* index of the accumulator of row r, column j of a tile of NT columns: an
 * [M, NT] panel, per batch element when the batch loop is the parallel one
 * (bat >= 0, its variable), else per tile for dot tiles (groups of DOT_GROUP
 * tiles of DOT_LANES columns, CS_DOT), else shared */
static cg_expr *accidx(lw *L, int bat, bool dot, int tile, int64_t M, int64_t NT, int r, int j)
{
	cg_expr *in = add64(L, mul64(L, vr(L, r), NT), vr(L, j));
	if (bat >= 0)
		return add64(L, mul64(L, vr(L, bat), M * NT), in);
	return dot ? add64(L, mul64(L, vr(L, tile), M * NT), in) : in;
}

/* A block einsum (one batch letter: the expert blocks of a dispatch) with at
 * least this many batch elements runs its batch loop in parallel, each block
 * on one thread with its own A panel and accumulators, instead of the tiles of
 * one block after another: at T = 512 the Qwen3 layer's 190 blocks each hold
 * about 32 rows, and splitting every block's 12 groups of tiles over the
 * threads cost a barrier per block and per projection (bench/NOTES.md 1); at
 * T = 1 its 8 blocks (one per routed expert) are streamed whole by the
 * threads, 3 barriers instead of 24. A decode step is bound by memory, which
 * a few cores' streams saturate on common hosts, so 8 blocks keep up to 8
 * threads busy enough. Smaller grids (top-1 or top-2 routing at T = 1) keep
 * the tiles as the parallel unit, so that every thread still streams. */
enum { BLOCK_PAR_MIN = 8 };

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
	int64_t NL = E.size[lastn], NT = dot ? DOT_GROUP * DOT_LANES : NL < EIN_NT ? NL : EIN_NT, KT = EIN_KT;
	int64_t ntiles = (NL + NT - 1) / NT;
	/* bf16 times bf16 dot tiles keep A in bf16 (exact): the LLVM emitter may
	 * then use the CPU's bf16 dot-product instructions (cgen.h, CS_DOT) */
	bool abf = dot && p->bufs[A].dtype == MOE_BF16 && p->bufs[B].dtype == MOE_BF16;
	/* a bf16 panel's rows are K + 32 elements apart: with K * 2 bytes a
	 * multiple of 4 KB, the rows a tile reads at one k would all fall in one
	 * set of the L1 cache and evict each other */
	int64_t AS = abf ? K + 32 : K;
	bool bpar = dot && gb.n == 1 && !mask_batch && E.size[gb.l[0]] >= BLOCK_PAR_MIN;
	int64_t nbat = bpar ? E.size[gb.l[0]] : 1;
	int apan = cgen_scratch(L, abf ? MOE_BF16 : MOE_F32, nbat * M * AS), bpan = dot ? -1 : cgen_scratch(L, MOE_F32, K * NT);
	/* parallel blocks or dot tiles are independent: each has its own accumulators */
	int64_t accsz = bpar ? nbat * M * NT : M * NT * (dot ? ntiles : 1);
	int acc = cgen_scratch(L, MOE_F32, accsz);
	int64_t os[MOE_MAX_RANK];
	strides_of(n, os);
	int64_t m0rest = M / E.size[gm.l[0]]; /* rows per m0 index */

	/* the rows past each batch element's count are zeros: with one batch letter
	 * they are written by a parallel loop of their own before the blocks,
	 * instead of by the serial block loop (the down projection of a block
	 * dispatch: 8064 of 12160 rows, 33 MB, for the Qwen3 layer at T = 512) */
	bool zero_ahead = mask_m && gb.n == 1 && !L->nozero[L->cur];
	if (zero_ahead) {
		int g, c = newvar(L, CT_I64);
		int64_t rowst = E.ost[gm.l[0]];
		cg_block *zb = loopv(L, b, &g, ic(L, 0), ic(L, E.size[gb.l[0]]));
		par_if_big(b, ir_numel(n));
		set(L, zb, c, clamp_count(L, ld(L, p->node_buf[n->valid], vr(L, g)), E.size[gm.l[0]]));
		cg_expr *slab = mul64(L, vr(L, g), os[0]);
		zero_range(L, zb, out, add64(L, slab, mul64(L, vr(L, c), rowst)),
			add64(L, mul64(L, vr(L, g), os[0]), ic(L, E.size[gm.l[0]] * rowst)));
	}
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
		cg_block *outer = in;
		in = loopv(L, in, &lv[l], ic(L, 0), hi);
		if (bpar) /* blocks write disjoint panels, accumulators and outputs */
			outer->last->par = true;
	}
	int bat = bpar ? lv[gb.l[0]] : -1;
	/* the block's slice of the A panel when blocks run in parallel */
	cg_expr *aoff = bpar ? mul64(L, vr(L, bat), M * AS) : NULL;
	/* m0 row count for this batch element */
	int m0 = gm.l[0];
	int mcnt = newvar(L, CT_I64);
	if (mask_m) {
		cg_expr *v = ld(L, p->node_buf[n->valid], gb.n ? vr(L, lv[gb.l[0]]) : ic(L, 0));
		set(L, in, mcnt, clamp_count(L, v, E.size[m0]));
		/* zero rows m0 >= mcnt of this batch element's output slab */
		cg_expr *slab = gb.n ? mul64(L, vr(L, lv[gb.l[0]]), os[0]) : NULL;
		int64_t rowst = E.ost[m0];
		if (!L->nozero[L->cur] && !zero_ahead)
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
		/* one m and one k letter: row and column are the loop variables, and
		 * the rows a parallel loop when the panel is big */
		bool direct = gm.n == 1 && gk.n == 1;
		cg_block *pb = bb;
		int r = -1, kk = -1;
		if (!direct) {
			r = newvar(L, CT_I64);
			set(L, pb, r, ic(L, 0));
		}
		for (int i = 0; i < gm.n; i++)
			pb = loopv(L, pb, &lv[gm.l[i]], ic(L, 0), i == 0 ? vr(L, mcnt) : ic(L, E.size[gm.l[i]]));
		if (direct && !bpar)
			par_if_big(bb, M * K);
		else {
			kk = newvar(L, CT_I64);
			set(L, pb, kk, ic(L, 0));
		}
		cg_block *kb = pb;
		for (int i = 0; i < gk.n; i++)
			kb = loopv(L, kb, &lv[gk.l[i]], ic(L, 0), ic(L, E.size[gk.l[i]]));
		cg_expr *ai = NULL;
		for (int dd = 0; dd < E.e.rank[ia]; dd++) {
			int l = E.e.in[ia][dd] - 'a';
			ai = add64(L, ai, mul64(L, vr(L, lv[l]), E.st[ia][l]));
		}
		cg_expr *pr = vr(L, direct ? lv[gm.l[0]] : r), *pk = vr(L, direct ? lv[gk.l[0]] : kk);
		store(L, kb, apan, add64(L, aoff, add64(L, mul64(L, pr, AS), pk)), ld(L, A, ai));
		comment(L, bb, abf ? "pack A rows (bf16 stays bf16)" : "pack A rows to f32");
		if (!direct) {
			set(L, kb, kk, add64(L, vr(L, kk), ic(L, 1)));
			set(L, pb, r, add64(L, vr(L, r), ic(L, 1)));
		}
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
	if (dot && !bpar) /* tiles write disjoint accumulators and output columns; no faults */
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
		cg_expr *di = mul64(L, vr(L, bpar ? bat : tile), M * NT);
		*d = (cg_dot){apan, B, acc, vr(L, rows), vr(L, nt), aoff ? aoff : ic(L, 0), wi ? wi : ic(L, 0), di, K, AS,
			E.st[ib][lastn], DOT_GROUP, DOT_LANES, NT};
		s->dot = d;
		comment(L, nb, "a group of tiles of dot products, k ascending per element");
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
			set(L, kb, av, ld(L, apan, add64(L, mul64(L, vr(L, r), AS), vr(L, k))));
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
					bin(L, CE_MUL, ld(L, apan, add64(L, aoff, add64(L, mul64(L, vr(L, r), AS), vr(L, k)))),
						fc(L, 0.0f))));
			store(L, jb, acc, accidx(L, bat, dot, tile, M, NT, r, j), vr(L, sv));
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
			ld(L, acc, accidx(L, bat, dot, tile, M, NT, r, j)));
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
		else if (L.fused[i] || L.inl[i])
			p->node_buf[i] = -1; /* read in place, or computed, by its users */
		else
			p->node_buf[i] = newbuf(&L, CB_WORK, (moe_dtype)n->dtype, ir_numel(n), 0, i);
		for (uint32_t a = 0; a < n->nargs; a++) {
			moe_id x = n->args[a];
			if (x == MOE_NONE)
				continue;
			use_operand(&L, x, i);
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
		case MOE_OP_CONST: bad |= !cgen_lower_const(&L, b, n, out); break;
		case MOE_OP_IOTA: cgen_lower_iota(&L, b, n, out); break;
		case MOE_OP_REDUCE_SUM:
		case MOE_OP_REDUCE_MAX:
		case MOE_OP_REDUCE_MIN: cgen_lower_reduce(&L, b, n, out); break;
		case MOE_OP_SOFTMAX: cgen_lower_softmax(&L, b, n, out); break;
		case MOE_OP_CUMSUM: cgen_lower_cumsum(&L, b, n, out); break;
		case MOE_OP_EINSUM: lower_einsum(&L, b, n, out); break;
		case MOE_OP_ONE_HOT: cgen_lower_one_hot(&L, b, n, out); break;
		case MOE_OP_FILTER: bad |= !cgen_lower_filter(&L, b, n, out); break;
		case MOE_OP_GATHER:
			if (L.fused[i])
				cgen_lower_gather_checks(&L, b, n);
			else
				cgen_lower_gather(&L, b, n, out);
			break;
		case MOE_OP_TAKE_ALONG: cgen_lower_take_along(&L, b, n, out); break;
		case MOE_OP_DEQUANT: cgen_lower_dequant(&L, b, n, out); break;
		case MOE_OP_SCATTER: cgen_lower_scatter(&L, b, n, out); break;
		case MOE_OP_RESHAPE:
			if (out != p->node_buf[n->args[0]])
				cgen_copy_flat(&L, b, out, p->node_buf[n->args[0]], ir_numel(n));
			break;
		case MOE_OP_SLICE: cgen_lower_slice(&L, b, n, out); break;
		case MOE_OP_CONCAT: cgen_lower_concat(&L, b, n, out); break;
		case MOE_OP_BROADCAST: cgen_lower_broadcast(&L, b, n, out); break;
		case MOE_OP_TOPK: cgen_lower_topk(&L, b, n, out); break;
		case MOE_OP_EXPERTS:
		case MOE_OP_ALL_TO_ALL:
		case MOE_OP_COUNT: IR_ASSERT(!"rejected above"); break;
		default:
			if (!L.inl[i])
				lower_elem(&L, b, n, out);
			break;
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
		cgen_copy_flat(&L, &p->body, dst, p->node_buf[v], ir_numel(N(g, v)));
	}
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
