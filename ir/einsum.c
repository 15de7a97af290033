/* ir/einsum.c: the form of a parsed einsum equation, so that passes and
 * backends match a contraction by its structure, never by its spelling
 * ("gbi,goi->gbo" and "xmk,xnk->xmn" are one form). */
#include <string.h>

#include "ir/ir.h"

/* The leading letters that both operands (or the one) and the output share,
 * in the same positions. */
static int batch_prefix(const ir_einsum *e)
{
	int nb = 0;
	for (;; nb++) {
		if (nb >= e->out_rank || nb >= e->rank[0] || (e->nin == 2 && nb >= e->rank[1]))
			return nb;
		char c = e->out[nb];
		if (e->in[0][nb] != c || (e->nin == 2 && e->in[1][nb] != c))
			return nb;
	}
}

static bool is_permutation(const ir_einsum *e)
{
	if (e->nin != 1 || e->rank[0] != e->out_rank)
		return false;
	for (int i = 0; i < e->out_rank; i++)
		if (!memchr(e->in[0], e->out[i], (size_t)e->rank[0]))
			return false;
	return true; /* letters are distinct within an operand and within the output */
}

ir_ein_form ir_einsum_form(const ir_einsum *e, int *batch)
{
	if (batch)
		*batch = 0;
	if (is_permutation(e)) {
		int nb = batch_prefix(e);
		if (batch)
			*batch = nb;
		return nb == e->out_rank ? IR_EIN_IDENTITY : IR_EIN_PERMUTE;
	}
	if (e->nin != 2)
		return IR_EIN_OTHER;
	int nb = batch_prefix(e);
	/* [batch, M, I] x [batch, O, I] (NT) or [batch, I, O] (NN) -> [batch, M, O] */
	if (e->rank[0] != nb + 2 || e->rank[1] != nb + 2 || e->out_rank != nb + 2)
		return IR_EIN_OTHER;
	char m = e->in[0][nb], i = e->in[0][nb + 1], a = e->in[1][nb], b = e->in[1][nb + 1];
	if (m == i || e->out[nb] != m)
		return IR_EIN_OTHER;
	ir_ein_form f;
	char o;
	if (b == i && a != m && a != i) {
		f = IR_EIN_MATMUL_NT;
		o = a;
	} else if (a == i && b != m && b != i) {
		f = IR_EIN_MATMUL_NN;
		o = b;
	} else {
		return IR_EIN_OTHER;
	}
	if (e->out[nb + 1] != o)
		return IR_EIN_OTHER;
	if (batch)
		*batch = nb;
	return f;
}

ir_ein_form ir_node_einsum_form(const ir_node *n, int *batch)
{
	ir_einsum e;
	char msg[8];
	if (batch)
		*batch = 0;
	if (n->op != MOE_OP_EINSUM || !ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg))
		return IR_EIN_OTHER;
	return ir_einsum_form(&e, batch);
}
