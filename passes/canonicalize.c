/* passes/canonicalize.c: local simplifications that never change a value.
 *   cast/reshape/broadcast to the operand's own type   -> the operand
 *   reshape(reshape(x))                                -> reshape(x)
 *   x * 1, x + 0 (integer), x | 0, x ^ 0, shifts by 0  -> x (when shapes agree)
 *   select(c, a, a)                                    -> a (when shapes agree)
 *   integer op on two scalar constants                 -> a constant
 *   a composite elementwise op (ir/scalar.h)            -> its primitive steps
 * Nodes carrying a valid mask are left alone (their masked rows are 0), but
 * for composite ops, whose last step takes the mask. */
#include "ir/scalar.h"
#include "passes/pass.h"

static bool is_const(const ir_node *n, double *v)
{
	if (n->op != MOE_OP_CONST || n->rank != 0)
		return false;
	*v = ir_attr_float(n, "value", 0);
	return true;
}

/* Integer folding by the shared scalar rules; INT32_MIN / -1 is left alone. */
static bool fold_int(moe_op op, int32_t a, int32_t b, int32_t *r)
{
	if (op == MOE_OP_DIV && a == INT32_MIN && b == -1)
		return false;
	return sc_binary_i(op, a, b, r) == SC_OK;
}

/* Returns the id (in dst) that node n (already mapped operands) simplifies
 * to, or MOE_NONE to keep it. */
static moe_id simplify(moe_graph *d, const ir_node *n, const moe_id *a, moe_loc loc)
{
	if (n->valid != MOE_NONE)
		return MOE_NONE;
	moe_op op = (moe_op)n->op;
	const ir_node *x = n->nargs > 0 ? N(d, a[0]) : NULL, *y = n->nargs > 1 ? N(d, a[1]) : NULL;
	double cx, cy;
	switch (op) {
	case MOE_OP_CAST:
		return x->dtype == n->dtype ? a[0] : MOE_NONE;
	case MOE_OP_RESHAPE:
	case MOE_OP_BROADCAST:
		if (ir_same_shape(x, n))
			return a[0];
		if (op == MOE_OP_RESHAPE && x->op == MOE_OP_RESHAPE && x->valid == MOE_NONE)
			return ir_b_reshape(d, x->args[0], n->rank, n->shape, loc);
		return MOE_NONE;
	case MOE_OP_SELECT:
		return a[1] == a[2] && ir_same_shape(N(d, a[1]), n) ? a[1] : MOE_NONE;
	default:
		break;
	}
	if (n->nargs != 2 || !(ir_ops[op].flags & OPF_ELEM) || (ir_ops[op].flags & OPF_CMP))
		return MOE_NONE;
	bool xc = is_const(x, &cx), yc = is_const(y, &cy);
	if (xc && yc && n->dtype == MOE_I32) {
		int32_t r;
		if (fold_int(op, (int32_t)cx, (int32_t)cy, &r))
			return ir_b_const(d, MOE_I32, r, loc);
		return MOE_NONE;
	}
	if (!yc || !ir_same_shape(x, n))
		return MOE_NONE;
	if (op == MOE_OP_MUL && cy == 1.0)
		return a[0];
	if (n->dtype == MOE_I32 && cy == 0.0 &&
		(op == MOE_OP_ADD || op == MOE_OP_SUB || op == MOE_OP_OR || op == MOE_OP_XOR || op == MOE_OP_SHL ||
			op == MOE_OP_SHR || op == MOE_OP_SAR))
		return a[0];
	return MOE_NONE;
}

/* The steps of composite op n (operands a, mask valid, both in d) as nodes;
 * returns the last one. */
static moe_id expand_composite(moe_graph *d, const ir_node *n, const sc_composite_def *def, const moe_id *a,
	moe_id valid)
{
	moe_id v[SC_MAX_STEPS];
	for (int k = 0; k < def->nsteps; k++) {
		const sc_step *s = &def->step[k];
		int8_t src[2] = {s->a, s->b};
		moe_id in[2] = {MOE_NONE, MOE_NONE};
		for (int j = 0; j < 2; j++)
			in[j] = src[j] == SC_IMM ? ir_b_const(d, (moe_dtype)n->dtype, s->imm, n->loc) :
				src[j] >= SC_S(0) ? v[src[j] - SC_S(0)] : src[j] >= 0 ? a[src[j]] : MOE_NONE;
		v[k] = s->b == SC_NO ? ir_b1(d, s->op, in[0], n->loc) : ir_b2(d, s->op, in[0], in[1], n->loc);
	}
	moe_id last = v[def->nsteps - 1];
	if (n->name)
		moe_node_set_name(d, last, n->name);
	if (valid != MOE_NONE) {
		moe_node_set_valid(d, last, valid);
		IR_ASSERT(ir_infer(d->ctx, d, last) == MOE_OK);
	}
	return last;
}

PASS(pass_canonicalize)
{
	rebuild r;
	rebuild_begin(&r, g);
	for (moe_id i = 0; i < g->nnodes; i++) {
		ir_node *n = N(g, i);
		moe_id a[64];
		for (uint32_t k = 0; k < n->nargs && k < 64; k++)
			a[k] = n->args[k] == MOE_NONE ? MOE_NONE : r.map[n->args[k]];
		const sc_composite_def *def = sc_composite((moe_op)n->op);
		moe_id s = def ? expand_composite(r.dst, n, def, a, n->valid == MOE_NONE ? MOE_NONE : r.map[n->valid]) :
			n->nargs <= 64 ? simplify(r.dst, n, a, n->loc) :
					 MOE_NONE;
		if (s == MOE_NONE)
			rebuild_copy(&r, i);
		else
			r.map[i] = s;
	}
	rebuild_end(&r);
	return MOE_OK;
}
