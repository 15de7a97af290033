/* passes/flatten_blocks.c: block_loop -> the equivalent [G, ...] nodes.
 *
 * Each node of a loop's body becomes one node over every block at once, in
 * body order, at the loop's place: a value of the body [...] is [G, ...]
 * here (einsums take a block letter, reshapes a leading G, slices an axis
 * one further), the body's `valid(rows)` is valid(rows) of the loop's [G]
 * rows, an `e` input is gathered by the block experts under valid(nblocks)
 * where it is first read, and a dequant of `e` inputs alone is computed
 * under valid(nblocks) too; a `b` input is the loop's operand itself, and a
 * constant is copied as it is (it broadcasts). This is the graph that
 * blockwise-dispatch wrote before it made loops, node for node.
 *
 * Exact when the loop's value is zero for a block with no valid row and
 * every block at or past nblocks has none, as blockwise-dispatch's grids
 * have: the pass refuses a body whose value is not masked by its rows. It
 * flattens the body forms blockwise-dispatch writes (kinds b and e, the
 * rows blockarg as a mask, elementwise ops, einsum, reshape, slice,
 * dequant) and refuses others with a diagnostic at the node. */
#include <string.h>

#include "passes/pass.h"

typedef struct fl {
	moe_ctx *ctx;
	moe_graph *d;          /* the graph being built */
	const moe_graph *body;
	const ir_node *loop;   /* of the source graph */
	const moe_id *smap;    /* source id -> d id */
	const char *kinds;
	moe_id nb, bexp, rows; /* d ids */
	moe_id *map;           /* body id -> d id; MOE_NONE: an `e` input not gathered yet */
	uint8_t *cls;          /* body id: C_* */
	uint8_t *wonly;        /* body id: computed from per-expert inputs (and constants) alone */
} fl;

enum { C_FLAT, C_LEAF, C_ROWS, C_EXPERT };

static moe_status refuse(fl *f, const ir_node *n, const char *what)
{
	moe_diag(f->ctx, MOE_DIAG_ERROR, n->loc, "flatten-blocks: %s", what);
	return MOE_ERR_UNSUPPORTED;
}

static moe_id operand(const fl *f, int k)
{
	return f->smap[f->loop->args[ir_block_loop_arg(f->kinds, k)]];
}

/* The d value of body node a, an `e` input gathered on its first read. */
static moe_id get(fl *f, moe_id a)
{
	if (f->map[a] != MOE_NONE)
		return f->map[a];
	moe_id x[2] = {operand(f, (int)ir_attr_int(N(f->body, a), "index", 0)), f->bexp};
	moe_id id = moe_node_new(f->d, MOE_OP_GATHER, x, 2, N(f->body, a)->loc);
	moe_node_set_int(f->d, id, "axis", 0);
	moe_node_set_valid(f->d, id, f->nb);
	IR_ASSERT(ir_infer(f->ctx, f->d, id) == MOE_OK);
	return f->map[a] = id;
}

static moe_status leaf(fl *f, moe_id i)
{
	const ir_node *n = N(f->body, i);
	f->wonly[i] = 1;
	if (n->op != MOE_OP_BLOCKARG) { /* const, iota: as they are (they broadcast) */
		f->map[i] = ir_copy_node(f->d, f->body, i, f->map);
		f->cls[i] = C_LEAF;
		return MOE_OK;
	}
	ir_blockarg_role role = ir_blockarg_role_of(n);
	if (role == IR_BA_ROWS) {
		f->map[i] = f->rows;
		f->cls[i] = C_ROWS;
		return MOE_OK;
	}
	if (role != IR_BA_IN)
		return refuse(f, n, "a blockarg of role expert or index is not flattened");
	int k = (int)ir_attr_int(n, "index", 0);
	if (f->kinds[k] == IR_BK_EXPERT) {
		f->map[i] = MOE_NONE; /* gathered where it is first read */
		f->cls[i] = C_EXPERT;
		return MOE_OK;
	}
	if (f->kinds[k] != IR_BK_BLOCK)
		return refuse(f, n, "only inputs of kind b and e are flattened");
	f->map[i] = operand(f, k);
	f->cls[i] = C_FLAT;
	f->wonly[i] = 0;
	return MOE_OK;
}

/* A letter for the block axis not in eq: g, or e for a value of weights only. */
static char block_letter(const char *eq, bool weights)
{
	static const char order[] = "gehjklmnpqrstuvwxyzabcdfio";
	if (!strchr(eq, weights ? 'e' : 'g'))
		return weights ? 'e' : 'g';
	for (const char *p = order; *p; p++)
		if (!strchr(eq, *p))
			return *p;
	return 0;
}

/* eq with the letter c in front of every operand and of the output */
static bool prefix_eq(const char *eq, char c, char *out, size_t len)
{
	size_t o = 0;
	bool start = true;
	for (const char *p = eq; *p; p++) {
		if (*p == ' ')
			continue;
		if (o + 3 >= len)
			return false;
		if (start && *p >= 'a' && *p <= 'z')
			out[o++] = c;
		start = *p == ',' || *p == '>';
		out[o++] = *p;
	}
	out[o] = 0;
	return true;
}

/* The attributes of body node n onto d node id, adjusted for the G axis. */
static moe_status copy_attrs(fl *f, const ir_node *n, moe_id id, bool weights)
{
	char eq[64];
	int64_t shape[MOE_MAX_RANK];
	for (uint32_t k = 0; k < n->nattrs; k++) {
		ir_attr a = n->attrs[k];
		if (n->op == MOE_OP_EINSUM && !strcmp(a.key, "eq")) {
			char c = block_letter(a.v.s, weights);
			if (!c || !prefix_eq(a.v.s, c, eq, sizeof eq))
				return refuse(f, n, "no letter is left for the block axis of this einsum");
			a.v.s = eq;
		} else if (n->op == MOE_OP_RESHAPE && !strcmp(a.key, "shape")) {
			if (a.count >= MOE_MAX_RANK)
				return refuse(f, n, "the reshape's result would exceed the largest rank");
			shape[0] = f->loop->shape[0];
			memcpy(shape + 1, a.v.ints, (size_t)a.count * sizeof *shape);
			a.v.ints = shape;
			a.count++;
		} else if ((n->op == MOE_OP_SLICE || n->op == MOE_OP_REDUCE_MAX) && !strcmp(a.key, "axis") &&
			   a.kind == MOE_ATTR_INT && a.v.i >= 0) {
			a.v.i++;
		}
		ir_attr_set(f->d, N(f->d, id), &a);
	}
	if (n->op == MOE_OP_SLICE && !ir_attr_find(n, "axis"))
		moe_node_set_int(f->d, id, "axis", 1);
	return MOE_OK;
}

static bool flattened_op(const ir_node *n)
{
	return (ir_ops[n->op].flags & OPF_ELEM) || n->op == MOE_OP_EINSUM || n->op == MOE_OP_RESHAPE ||
	       n->op == MOE_OP_SLICE || n->op == MOE_OP_DEQUANT || n->op == MOE_OP_REDUCE_MAX; /* W8A8's row maxima */
}

static moe_status node(fl *f, moe_id i)
{
	const ir_node *n = N(f->body, i);
	if (!flattened_op(n))
		return refuse(f, n, "this op is not flattened out of a block_loop body");
	moe_id args[IR_BODY_MAX_INPUTS];
	if (n->nargs > IR_BODY_MAX_INPUTS)
		return refuse(f, n, "too many operands");
	/* the `e` inputs first read here are gathered in body order */
	for (moe_id a = 0; a < i; a++)
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] == a && f->cls[a] == C_EXPERT) {
				get(f, a);
				break;
			}
	bool weights = true, experts = true;
	for (uint32_t k = 0; k < n->nargs; k++) {
		moe_id a = n->args[k];
		if (f->cls[a] == C_ROWS)
			return refuse(f, n, "the rows blockarg is read only as a valid mask");
		const ir_node *an = N(f->body, a);
		if (f->cls[a] != C_LEAF && (ir_ops[n->op].flags & OPF_ELEM) && an->rank != n->rank)
			return refuse(f, n, "an elementwise operand of another rank than its result");
		args[k] = f->map[a];
		weights &= f->wonly[a] != 0;
		experts &= f->cls[a] == C_EXPERT;
	}
	if (n->valid != MOE_NONE && f->cls[n->valid] != C_ROWS)
		return refuse(f, n, "a valid mask other than the rows blockarg");
	moe_id id = moe_node_new(f->d, (moe_op)n->op, args, n->nargs, n->loc);
	if (copy_attrs(f, n, id, weights) != MOE_OK)
		return MOE_ERR_UNSUPPORTED;
	if (n->valid != MOE_NONE)
		moe_node_set_valid(f->d, id, f->rows);
	else if (n->op == MOE_OP_DEQUANT && experts) /* a weight's rows, for blocks < nblocks */
		moe_node_set_valid(f->d, id, f->nb);
	if (ir_infer(f->ctx, f->d, id) != MOE_OK)
		return refuse(f, n, "the flat form of this node does not type");
	f->map[i] = id;
	f->cls[i] = C_FLAT;
	f->wonly[i] = weights;
	return MOE_OK;
}

/* The flat nodes of loop li of src into d; *out its value. */
static moe_status flatten_loop(moe_ctx *ctx, moe_graph *d, const moe_graph *src, moe_id li, const moe_id *smap,
	moe_id *out)
{
	const ir_node *loop = N(src, li);
	const moe_graph *body = ir_node_body(src, loop);
	fl f = {ctx, d, body, loop, smap, ir_attr_str(loop, "kinds", ""), smap[loop->args[IR_BL_NBLOCKS]],
		smap[loop->args[IR_BL_EXPERTS]], smap[loop->args[IR_BL_ROWS]], NULL, NULL, NULL};
	uint32_t nn = body->nnodes;
	f.map = ctx_alloc(ctx, ((size_t)nn + 1) * sizeof *f.map);
	f.cls = ctx_alloc(ctx, (size_t)nn + 1);
	f.wonly = ctx_alloc(ctx, (size_t)nn + 1);
	moe_status st = MOE_OK;
	for (moe_id i = 0; i < nn && st == MOE_OK; i++)
		st = ir_ops[N(body, i)->op].flags & OPF_LEAF ? leaf(&f, i) : node(&f, i);
	moe_id y = ir_body_yield(body);
	if (st == MOE_OK) {
		const ir_node *yn = N(body, y);
		if (f.cls[y] != C_FLAT || yn->valid == MOE_NONE || f.cls[yn->valid] != C_ROWS)
			st = refuse(&f, loop, "the body's value is not masked by its rows (valid(rows)): blocks without "
				"rows would not be zero");
		else if (!ir_same_shape(N(d, f.map[y]), loop) || N(d, f.map[y])->dtype != loop->dtype)
			st = refuse(&f, loop, "the flat value's type differs from the loop's");
	}
	*out = st == MOE_OK ? f.map[y] : MOE_NONE;
	ctx_free(ctx, f.map, ((size_t)nn + 1) * sizeof *f.map);
	ctx_free(ctx, f.cls, (size_t)nn + 1);
	ctx_free(ctx, f.wonly, (size_t)nn + 1);
	return st;
}

PASS(pass_flatten_blocks)
{
	(void)opts;
	(void)ud;
	if (!ir_graph_has_block_loop(g))
		return MOE_OK;
	rebuild rb;
	rebuild_begin(&rb, g);
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (N(g, i)->op != MOE_OP_BLOCK_LOOP) {
			rebuild_copy(&rb, i);
			continue;
		}
		moe_id y;
		if (flatten_loop(ctx, rb.dst, g, i, rb.map, &y) != MOE_OK) {
			rebuild_abort(&rb);
			return MOE_ERR_UNSUPPORTED;
		}
		if (N(g, i)->name)
			moe_node_set_name(rb.dst, y, N(g, i)->name);
		rb.map[i] = y;
	}
	rebuild_end(&rb);
	return MOE_OK;
}
