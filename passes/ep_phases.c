/* passes/ep_phases.c: an expert-parallel device program cut at its
 * all_to_all nodes into phases (docs/expert-parallel.md section 6), for the
 * runners that compile each phase on its own: the TCP chips
 * (backend-tcp/multichip/multichip.c) and the host engines under MPI (cli/ep.c).
 *
 * A node's phase is the largest over its operands of the operand's phase,
 * plus one for an operand that is an exchange (an exchange runs at the end
 * of the phase of its operands). Phase k's graph takes the values of
 * earlier phases and the exchanges' results as inputs "ep.<id>" and gives as
 * outputs what later phases, the exchanges and the program's outputs read;
 * its work that reads no exchange result comes first (the TCP chips defer
 * the shared expert's down projection to the combine, where it is issued
 * before the returned rows are gathered: backend-tcp/multichip/multichip.c). */
#include <stdio.h>
#include <stdlib.h>

#include "ir/ir.h"
#include "moec/passes.h"

/* Phases of every node; returns the phase count. Leaves and what depends on
 * leaves alone (a weight's slices and transposes) have phase -1: every phase
 * that uses them recomputes them, so the backend sees them as in one chip's
 * program. */
int moe_ep_phases(const moe_graph *g, int *level)
{
	int top = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		bool pure = n->op != MOE_OP_ALL_TO_ALL && n->op != MOE_OP_INPUT && n->valid == MOE_NONE;
		for (uint32_t j = 0; pure && j < n->nargs; j++)
			pure = level[n->args[j]] < 0;
		int l = pure ? -1 : 0;
		for (uint32_t j = 0; j < n->nargs; j++) {
			moe_id a = n->args[j];
			int la = level[a] + (N(g, a)->op == MOE_OP_ALL_TO_ALL);
			if (la > l)
				l = la;
		}
		if (n->valid != MOE_NONE && level[n->valid] + (N(g, n->valid)->op == MOE_OP_ALL_TO_ALL) > l)
			l = level[n->valid] + (N(g, n->valid)->op == MOE_OP_ALL_TO_ALL);
		level[i] = l;
		if (l > top)
			top = l;
	}
	return top + 1;
}

/* Copies node a of phase -1 and what it depends on. */
static void copy_pure(moe_graph *d, const moe_graph *g, moe_id a, moe_id *map)
{
	const ir_node *n = N(g, a);
	for (uint32_t j = 0; j < n->nargs; j++)
		if (map[n->args[j]] == MOE_NONE)
			copy_pure(d, g, n->args[j], map);
	map[a] = ir_copy_node(d, g, a, map);
}

/* The graph of phase k; ids[j] receives the source node of output j. */
moe_module *moe_ep_phase_graph(moe_ctx *ctx, const moe_graph *g, const int *level, int k, moe_id *ids, uint32_t cap,
	uint32_t *nids)
{
	moe_module *m = moe_module_new(ctx);
	moe_graph *d = moe_module_add_graph(m, g->name ? g->name : "phase");
	moe_graph_set_dtype(d, (moe_dtype)g->dtype);
	moe_id *map = calloc(g->nnodes, sizeof *map);
	IR_ASSERT(map);
	for (moe_id i = 0; i < g->nnodes; i++)
		map[i] = MOE_NONE;
	*nids = 0;
	/* recv[i]: node i of phase k reads, through nodes of phase k, an exchange's
	 * result; the nodes that do not come first (their work, the shared expert's
	 * tail deferred to the combine, is issued before the received rows') */
	uint8_t *recv = calloc(g->nnodes, 1);
	IR_ASSERT(recv);
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t j = 0; level[i] == k && j <= n->nargs; j++) {
			moe_id a = j < n->nargs ? n->args[j] : n->valid;
			if (a != MOE_NONE && (recv[a] || N(g, a)->op == MOE_OP_ALL_TO_ALL))
				recv[i] = 1;
		}
	}
	for (moe_id s = 0; s < 2 * g->nnodes; s++) {
		moe_id i = s % g->nnodes;
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_ALL_TO_ALL || level[i] != k || recv[i] != s / g->nnodes)
			continue;
		for (uint32_t j = 0; j <= n->nargs; j++) {
			moe_id a = j < n->nargs ? n->args[j] : n->valid;
			if (a == MOE_NONE || map[a] != MOE_NONE)
				continue;
			const ir_node *an = N(g, a);
			if (level[a] < 0) {
				copy_pure(d, g, a, map);
			} else { /* a value of an earlier phase or an exchange */
				char name[32];
				snprintf(name, sizeof name, "ep.%u", a);
				map[a] = ir_emit(d, MOE_OP_INPUT, (moe_dtype)an->dtype, an->rank, an->shape, NULL, 0, an->loc);
				moe_node_set_name(d, map[a], name);
			}
		}
		map[i] = ir_copy_node(d, g, i, map);
	}
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (map[i] == MOE_NONE || level[i] != k)
			continue;
		bool out = false;
		for (uint32_t o = 0; o < g->nout; o++)
			out |= g->outputs[o] == i;
		for (moe_id j = i + 1; j < g->nnodes && !out; j++) { /* an exchange's operand, or used later */
			const ir_node *u = N(g, j);
			bool reads = u->valid == i; /* a valid mask is read like an operand */
			for (uint32_t a = 0; a < u->nargs; a++)
				reads |= u->args[a] == i;
			out |= reads && (u->op == MOE_OP_ALL_TO_ALL || level[j] > k);
		}
		if (out && *nids < cap) {
			moe_graph_add_output(d, map[i]);
			ids[*nids] = i;
		}
		*nids += out;
	}
	free(map);
	free(recv);
	return m;
}

