/* ir/block_loop.c: the block_loop op's bodies, its shape rule and the rules
 * that keep a body isolated (docs/ir.md "Block loops").
 *
 * A body is a graph of its own: its ids start at 0, its leaves are blockarg
 * nodes (the block's rows of the loop's operands) and constants, and its one
 * output is the value each block yields. The loop's result is [G, ...] of
 * that value. Every check of a loop against its body is made here, once, by
 * the loop's shape rule, which every reader and the verifier run. */
#include <string.h>

#include "ir/serial.h"

const char *const ir_blockarg_roles[IR_BA_COUNT + 1] = {"rows", "expert", "index", "in", NULL};

moe_graph *ir_body_new(moe_graph *g, uint32_t *index)
{
	IR_ASSERT(!g->is_body);
	moe_graph *b = ir_graph_new(g->ctx, "body");
	b->dtype = g->dtype;
	b->loc = g->loc;
	b->is_body = true;
	ctx_grow(g->ctx, (void **)&g->bodies, &g->bodycap, g->nbodies + 1, sizeof *g->bodies);
	g->bodies[g->nbodies] = b;
	*index = g->nbodies++;
	return b;
}

moe_graph *ir_node_body(const moe_graph *g, const ir_node *n)
{
	return n->body != IR_NO_BODY && n->body < g->nbodies ? g->bodies[n->body] : NULL;
}

moe_id ir_body_yield(const moe_graph *body)
{
	return body->nout == 1 && body->outputs[0] < body->nnodes ? body->outputs[0] : MOE_NONE;
}

static int kind_width(char k)
{
	return k == IR_BK_ROWS ? 2 : 1;
}

int ir_block_loop_arg(const char *kinds, int k)
{
	int a = IR_BL_NCTRL;
	for (int i = 0; i < k; i++) {
		if (!kinds[i])
			return -1;
		a += kind_width(kinds[i]);
	}
	return kinds[k] ? a : -1;
}

int ir_block_loop_nargs(const char *kinds)
{
	int a = IR_BL_NCTRL;
	for (const char *p = kinds; *p; p++)
		a += kind_width(*p);
	return a;
}

ir_blockarg_role ir_blockarg_role_of(const ir_node *n)
{
	int r = ir_name_index(ir_blockarg_roles, ir_attr_str(n, "role", ""));
	return r < 0 ? IR_BA_COUNT : (ir_blockarg_role)r;
}

const ir_node *ir_graph_block_loop(const moe_graph *g)
{
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_BLOCK_LOOP)
			return N(g, i);
	return NULL;
}

bool ir_graph_has_block_loop(const moe_graph *g)
{
	return ir_graph_block_loop(g) != NULL;
}

#define ERR_AT(ctx, loc, ...) (moe_diag((ctx), MOE_DIAG_ERROR, (loc), __VA_ARGS__), MOE_ERR_INVALID)

moe_status ir_body_node_check(moe_ctx *ctx, const moe_graph *g, const ir_node *n)
{
	const char *op = ir_ops[n->op].name;
	if (!g->is_body)
		return n->op == MOE_OP_BLOCKARG ? ERR_AT(ctx, n->loc, "'blockarg' outside a block_loop body") : MOE_OK;
	if (n->op == MOE_OP_BLOCK_LOOP)
		return ERR_AT(ctx, n->loc, "'block_loop' inside a block_loop body (bodies do not nest)");
	if (n->op == MOE_OP_INPUT || n->op == MOE_OP_WEIGHT)
		return ERR_AT(ctx, n->loc,
			"'%s' inside a block_loop body: a body reads only its blockarg leaves (pass the value as a loop operand)",
			op);
	if (ir_ops[n->op].flags & OPF_IMPURE)
		return ERR_AT(ctx, n->loc, "'%s' inside a block_loop body: a body holds no impure op", op);
	return MOE_OK;
}

/* The type block g sees of data input k (kind kd, operand index a). */
static void row_type(const moe_graph *g, const ir_node *n, char kd, int a, int64_t B, moe_dtype *t, int *rank,
	int64_t *shape)
{
	const ir_node *x = N(g, n->args[a]);
	*t = (moe_dtype)x->dtype;
	if (kd == IR_BK_INVARIANT) {
		*rank = x->rank;
		memcpy(shape, x->shape, (size_t)x->rank * sizeof *shape);
	} else if (kd == IR_BK_ROWS) {
		*rank = 2;
		shape[0] = B;
		shape[1] = x->shape[1];
	} else {
		*rank = x->rank - 1;
		memcpy(shape, x->shape + 1, (size_t)*rank * sizeof *shape);
	}
}

static bool same_type(const ir_node *b, moe_dtype t, int rank, const int64_t *shape)
{
	if (b->dtype != t || b->rank != rank)
		return false;
	for (int i = 0; i < rank; i++)
		if (b->shape[i] != shape[i])
			return false;
	return true;
}

/* Checks the data operands against kinds; sets the block rows B of the
 * first `r` input (0: none). */
static moe_status check_data(moe_ctx *ctx, const moe_graph *g, const ir_node *n, const char *kinds, int64_t G,
	int64_t *B)
{
	char tb[160];
	int64_t E = -1;
	*B = 0;
	for (int k = 0; kinds[k]; k++) {
		int a = ir_block_loop_arg(kinds, k);
		const ir_node *x = N(g, n->args[a]);
		ir_fmt_type((moe_dtype)x->dtype, x->rank, x->shape, tb, sizeof tb);
		char kd = kinds[k];
		if ((kd == IR_BK_BLOCK || kd == IR_BK_EXPERT) && x->rank < 1)
			return ERR_AT(ctx, n->loc, "'block_loop': data input %d (kind '%c', operand %d) must have a leading "
				"dimension, got %s", k, kd, a + 1, tb);
		if (kd == IR_BK_BLOCK && x->shape[0] != G)
			return ERR_AT(ctx, n->loc, "'block_loop': data input %d (kind 'b', operand %d) must be [G=%lld, ...], "
				"got %s", k, a + 1, (long long)G, tb);
		if (kd == IR_BK_EXPERT && E >= 0 && x->shape[0] != E)
			return ERR_AT(ctx, n->loc, "'block_loop': data input %d (kind 'e', operand %d) must be [E=%lld, ...] "
				"like the other per-expert inputs, got %s", k, a + 1, (long long)E, tb);
		if (kd == IR_BK_EXPERT)
			E = x->shape[0];
		if (kd != IR_BK_ROWS)
			continue;
		const ir_node *l = N(g, n->args[a + 1]);
		if (x->rank != 2)
			return ERR_AT(ctx, n->loc, "'block_loop': data input %d (kind 'r', operand %d) must be a source [N, D], "
				"got %s", k, a + 1, tb);
		ir_fmt_type((moe_dtype)l->dtype, l->rank, l->shape, tb, sizeof tb);
		if (l->dtype != MOE_I32 || l->rank != 2 || l->shape[0] != G || (*B && l->shape[1] != *B))
			return ERR_AT(ctx, n->loc, "'block_loop': data input %d (kind 'r', operand %d) needs a row list "
				"i32[G=%lld, B], got %s", k, a + 2, (long long)G, tb);
		*B = l->shape[1];
	}
	return MOE_OK;
}

/* Each blockarg of the body against the loop's operand it reads. */
static moe_status check_blockargs(moe_ctx *ctx, const moe_graph *g, const ir_node *n, const moe_graph *body,
	const char *kinds, int64_t B)
{
	int nk = (int)strlen(kinds);
	for (moe_id i = 0; i < body->nnodes; i++) {
		const ir_node *b = N(body, i);
		if (b->op != MOE_OP_BLOCKARG)
			continue;
		ir_blockarg_role role = ir_blockarg_role_of(b);
		char want[160], got[160];
		ir_fmt_type((moe_dtype)b->dtype, b->rank, b->shape, got, sizeof got);
		if (role != IR_BA_IN) {
			if (ir_attr_find(b, "index"))
				return ERR_AT(ctx, b->loc, "blockarg %%%u: only role \"in\" takes an index", i);
			if (b->dtype != MOE_I32 || b->rank != 0)
				return ERR_AT(ctx, b->loc, "blockarg %%%u (role \"%s\") must be i32[], got %s", i,
					ir_blockarg_roles[role], got);
			continue;
		}
		int64_t k = ir_attr_int(b, "index", -1);
		if (k < 0 || k >= nk)
			return ERR_AT(ctx, b->loc, "blockarg %%%u: index %lld is not a data input of the loop (kinds=\"%s\": "
				"0..%d)", i, (long long)k, kinds, nk - 1);
		moe_dtype t;
		int rank;
		int64_t shape[MOE_MAX_RANK];
		row_type(g, n, kinds[k], ir_block_loop_arg(kinds, (int)k), B, &t, &rank, shape);
		if (!same_type(b, t, rank, shape)) {
			ir_fmt_type(t, rank, shape, want, sizeof want);
			return ERR_AT(ctx, b->loc, "blockarg %%%u (data input %lld, kind '%c') is %s but the loop's operand "
				"gives each block %s", i, (long long)k, kinds[k], got, want);
		}
	}
	return MOE_OK;
}

moe_status ir_infer_block_loop(moe_ctx *ctx, moe_graph *g, moe_id id)
{
	ir_node *n = N(g, id);
	const moe_graph *body = ir_node_body(g, n);
	if (!body)
		return ERR_AT(ctx, n->loc, "'block_loop' has no body");
	const char *kinds = ir_attr_str(n, "kinds", NULL);
	if (!kinds)
		return ERR_AT(ctx, n->loc, "'block_loop' needs its kinds attribute");
	for (const char *p = kinds; *p; p++)
		if (*p != IR_BK_BLOCK && *p != IR_BK_EXPERT && *p != IR_BK_ROWS && *p != IR_BK_INVARIANT)
			return ERR_AT(ctx, n->loc, "'block_loop': kinds=\"%s\": '%c' is not a kind (b, e, r or i)", kinds, *p);
	int need = ir_block_loop_nargs(kinds);
	if ((int)n->nargs != need)
		return ERR_AT(ctx, n->loc, "'block_loop' with kinds=\"%s\" takes %d operands (nblocks, experts, rows and "
			"the data operands), got %u", kinds, need, n->nargs);
	const ir_node *nb = N(g, n->args[IR_BL_NBLOCKS]), *ex = N(g, n->args[IR_BL_EXPERTS]),
		      *rows = N(g, n->args[IR_BL_ROWS]);
	char tb[160];
	if (nb->dtype != MOE_I32 || nb->rank != 0) {
		ir_fmt_type((moe_dtype)nb->dtype, nb->rank, nb->shape, tb, sizeof tb);
		return ERR_AT(ctx, n->loc, "'block_loop': operand 1 (nblocks) must be i32[], got %s", tb);
	}
	if (ex->dtype != MOE_I32 || ex->rank != 1) {
		ir_fmt_type((moe_dtype)ex->dtype, ex->rank, ex->shape, tb, sizeof tb);
		return ERR_AT(ctx, n->loc, "'block_loop': operand 2 (the block experts) must be i32[G], got %s", tb);
	}
	int64_t G = ex->shape[0], B;
	if (rows->dtype != MOE_I32 || rows->rank != 1 || rows->shape[0] != G) {
		ir_fmt_type((moe_dtype)rows->dtype, rows->rank, rows->shape, tb, sizeof tb);
		return ERR_AT(ctx, n->loc, "'block_loop': operand 3 (the valid rows) must be i32[G=%lld], got %s",
			(long long)G, tb);
	}
	if (check_data(ctx, g, n, kinds, G, &B) != MOE_OK)
		return MOE_ERR_INVALID;
	if (check_blockargs(ctx, g, n, body, kinds, B) != MOE_OK)
		return MOE_ERR_INVALID;
	moe_id y = ir_body_yield(body);
	if (y == MOE_NONE)
		return ERR_AT(ctx, n->loc, "'block_loop': its body yields %u values, not exactly one", body->nout);
	const ir_node *yn = N(body, y);
	if (yn->rank >= MOE_MAX_RANK)
		return ERR_AT(ctx, n->loc, "'block_loop': the body's value has rank %d; the result would exceed rank %d",
			yn->rank, MOE_MAX_RANK);
	n->dtype = yn->dtype;
	n->rank = (uint8_t)(yn->rank + 1);
	n->shape[0] = G;
	memcpy(n->shape + 1, yn->shape, (size_t)yn->rank * sizeof *n->shape);
	return MOE_OK;
}
