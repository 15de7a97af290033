/* backend-tcp/compiler/recipe_serving.c: the run-time row counts of valid
 * masks (docs/ir.md "The `valid` mask", docs/semantics.md section 7,
 * docs/tcp-compiler.md 5.1). A node masked by valid(v) is one command under
 * valid=$count: in a loop body v is the block's rows ($rows); outside the
 * loop (a serving layer) v is a scalar of the layer graph, n_tokens or a
 * count derived from it, and its scalar is made once per graph node where it
 * is first read:
 * - a constant: a `const` scalar;
 * - add, sub or mul of a count and a constant (n_tokens x K, n_tokens less a
 *   chunk's first row): an `alu` scalar on the count's scalar;
 * - any other i32 scalar value: one `dma.spm` of its element into SPM, then
 *   an `ld` (the value's buffer, the schedule's dependencies ordering the
 *   ld after the staging and the staging after the value's writer).
 * Every later reader names the same scalar. Scalars stand in the top
 * region (a loop body's masks name only its rows). */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"

static int sop_of(moe_op op)
{
	switch (op) {
	case MOE_OP_ADD: return TCP_S_ADD;
	case MOE_OP_SUB: return TCP_S_SUB;
	case MOE_OP_MUL: return TCP_S_MUL;
	default: return -1;
	}
}

static ts_id count_of(sb *b, moe_id at, moe_id v, int depth);

/* v = a op c (or c op a for add and mul), c a constant: an alu scalar */
static ts_id alu_count(sb *b, moe_id at, moe_id v, int depth)
{
	const ir_node *n = SBN(b, v);
	int op = n->nargs == 2 ? sop_of((moe_op)n->op) : -1;
	if (op < 0 || n->valid != MOE_NONE)
		return TS_NONE;
	for (int k = 0; k < 2; k++) {
		moe_id a = n->args[k], c = n->args[1 - k];
		if (b->v[c].kind != SV_IMM || (k == 1 && op == TCP_S_SUB))
			continue;
		const ir_node *an = SBN(b, a);
		if (an->rank != 0 || an->dtype != MOE_I32)
			continue;
		ts_id x = count_of(b, at, a, depth + 1);
		if (x == TS_NONE)
			return TS_NONE;
		return ts_add_scalar(b->s, b->rg, "count", TS_SC_ALU, op, x, TS_NONE, (int32_t)b->v[c].imm);
	}
	return TS_NONE;
}

/* the scalar holding i32 scalar node v of the top graph; TS_NONE after an error */
static ts_id count_of(sb *b, moe_id at, moe_id v, int depth)
{
	if (b->vcount[v] != TS_NONE)
		return b->vcount[v];
	const ir_node *n = SBN(b, v);
	const sb_val *x = &b->v[v];
	ts_id s = TS_NONE;
	if (n->rank != 0 || n->dtype != MOE_I32) {
		sb_refuse(b, at, "a valid mask that is not an i32 scalar");
		return TS_NONE;
	}
	if (x->kind == SV_IMM)
		s = ts_add_scalar(b->s, b->rg, "count", TS_SC_CONST, 0, TS_NONE, TS_NONE, (int32_t)x->imm);
	else if (depth < 8)
		s = alu_count(b, at, v, depth);
	if (s == TS_NONE && !b->failed) {
		if (x->kind != SV_VIEW || x->reg != TS_NONE) {
			sb_refuse(b, at, "a valid count that is not a tensor's element");
			return TS_NONE;
		}
		const int64_t one = 1, st = 0;
		tcp_insn in = tcp_b_dma_spm(1, &one, tcp_b_view((int32_t)x->buf, x->base, 1, &st), tcp_view_none(),
			tcp_view_none());
		sb_emit(b, &in, at);
		s = ts_add_scalar(b->s, b->rg, n->name ? n->name : "count", TS_SC_SPM_LD, 0, TS_NONE, TS_NONE, x->base);
		b->s->sc[s].buf = x->buf;
	}
	b->vcount[v] = s;
	return s;
}

ts_id sb_valid(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	if (n->valid == MOE_NONE || b->failed)
		return TS_NONE;
	const ir_node *v = SBN(b, n->valid);
	if (b->g->is_body) {
		if (v->op == MOE_OP_BLOCKARG && ir_blockarg_role_of(v) == IR_BA_ROWS)
			return b->rows;
		sb_refuse(b, id, "a node of a loop body masked by valid() other than the block's rows");
		return TS_NONE;
	}
	if (b->g != b->top || !b->vcount) {
		sb_refuse(b, id, "a node masked by valid() outside the layer's graph");
		return TS_NONE;
	}
	return count_of(b, id, n->valid, 0);
}

ts_id sb_valid_less(sb *b, moe_id id, ts_id count, int64_t off)
{
	if (count == TS_NONE || off == 0)
		return count;
	(void)id;
	return ts_add_scalar(b->s, b->rg, "count", TS_SC_ALU, TCP_S_SUB, count, TS_NONE, off);
}
