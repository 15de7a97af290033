/* passes/cse.c: common-subexpression elimination over the whole graph.
 * Two nodes are the same value when op, type, (mapped) operands, valid mask
 * and attributes agree; commutative ops compare operands as a set. Inputs and
 * weights are never merged (they are distinct bindings). */
#include <string.h>

#include "passes/pass.h"

static bool attrs_equal(const ir_node *a, const ir_node *b)
{
	if (a->nattrs != b->nattrs)
		return false;
	for (uint32_t i = 0; i < a->nattrs; i++) {
		const ir_attr *x = &a->attrs[i], *y = ir_attr_find(b, x->key);
		if (!y || x->kind != y->kind)
			return false;
		switch (x->kind) {
		case MOE_ATTR_INT: if (x->v.i != y->v.i) return false; break;
		case MOE_ATTR_FLOAT: if (memcmp(&x->v.f, &y->v.f, sizeof(double))) return false; break;
		case MOE_ATTR_STR: if (strcmp(x->v.s, y->v.s)) return false; break;
		case MOE_ATTR_INTS:
			if (x->count != y->count || memcmp(x->v.ints, y->v.ints, (size_t)x->count * sizeof(int64_t)))
				return false;
			break;
		}
	}
	return true;
}

static bool same(const ir_node *a, const ir_node *b)
{
	if (a->op != b->op || a->dtype != b->dtype || !ir_same_shape(a, b) || a->nargs != b->nargs ||
		a->valid != b->valid)
		return false;
	if (a->nargs && memcmp(a->args, b->args, a->nargs * sizeof *a->args))
		return false;
	return attrs_equal(a, b);
}

static uint64_t hash_node(const ir_node *n)
{
	uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
	MIX(n->op);
	MIX(n->dtype);
	MIX(n->rank);
	for (int i = 0; i < n->rank; i++)
		MIX(n->shape[i]);
	for (uint32_t i = 0; i < n->nargs; i++)
		MIX(n->args[i]);
	MIX(n->valid);
#undef MIX
	return h;
}

PASS(pass_cse)
{
	rebuild r;
	rebuild_begin(&r, g);
	uint32_t cap = 16;
	while (cap < g->nnodes * 2 + 16)
		cap *= 2;
	moe_id *table = ctx_alloc(ctx, cap * sizeof *table);
	for (uint32_t i = 0; i < cap; i++)
		table[i] = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++) {
		moe_id d = rebuild_copy(&r, i);
		ir_node *n = N(r.dst, d);
		/* a block_loop is not merged: its body is not compared */
		if (n->op == MOE_OP_INPUT || n->op == MOE_OP_WEIGHT || n->op == MOE_OP_BLOCK_LOOP ||
			(ir_ops[n->op].flags & OPF_IMPURE))
			continue;
		if ((ir_ops[n->op].flags & OPF_COMM) && n->nargs == 2 && n->args[0] > n->args[1]) {
			moe_id t = n->args[0];
			n->args[0] = n->args[1];
			n->args[1] = t;
		}
		uint32_t h = (uint32_t)hash_node(n) & (cap - 1);
		for (;; h = (h + 1) & (cap - 1)) {
			if (table[h] == MOE_NONE) {
				table[h] = d;
				break;
			}
			if (same(N(r.dst, table[h]), n)) {
				/* the new copy is the last node: drop it and reuse the earlier one */
				if (!N(r.dst, table[h])->name && n->name)
					N(r.dst, table[h])->name = n->name;
				r.dst->nnodes--;
				r.map[i] = table[h];
				break;
			}
		}
	}
	ctx_free(ctx, table, cap * sizeof *table);
	rebuild_end(&r);
	return MOE_OK;
}
