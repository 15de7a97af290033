/* backend-tcp/isa/prep_graph.c: what a program says about its weights: the
 * weight-packing (prep) graph it carries, parsed and checked against its
 * packed tensors, and its interface (the inputs and the weights to bind,
 * with their checkpoint sources). Both read only the program, so the loader,
 * the validator and the simulator use them without the compiler. */
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"

/* The prep graph of p, parsed and checked against the packed tensors of the
 * table: one graph, verified, leaves only weights and constants, its outputs
 * in order matching the packed tensors' dtypes and shapes. NULL plus a
 * diagnostic otherwise (or when p has no prep graph: *none set). */
moe_module *tcp_prep_module(moe_ctx *ctx, const tcp_program *p, const char *file)
{
	uint32_t npacked = 0;
	for (uint32_t i = 0; i < p->nt; i++)
		npacked += p->t[i].kind == TCP_T_PACKED;
	moe_loc loc = moe_loc_file(ctx, file ? file : "<program>");
	if (!p->prep_len) {
		if (npacked)
			moe_diag(ctx, MOE_DIAG_ERROR, loc, "the program has %u packed weights but no weight-packing graph", npacked);
		return NULL;
	}
	moe_module *m = moe_module_parse_json(ctx, file ? file : "<prep>", p->prep, p->prep_len);
	if (!m) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "the weight-packing graph does not parse");
		return NULL;
	}
	const char *why = NULL;
	char msg[200];
	if (moe_module_num_graphs(m) != 1) {
		why = "the weight-packing graph must be one layer";
	} else if (moe_module_verify(ctx, m) != MOE_OK) {
		why = "the weight-packing graph does not verify";
	} else {
		const moe_graph *g = moe_module_graph(m, 0);
		for (moe_id i = 0; i < g->nnodes && !why; i++) {
			const ir_node *n = N(g, i);
			if ((ir_ops[n->op].flags & OPF_LEAF) && n->op != MOE_OP_WEIGHT && n->op != MOE_OP_CONST &&
				n->op != MOE_OP_IOTA)
				why = "the weight-packing graph reads something other than weights and constants";
			else if (ir_ops[n->op].flags & OPF_IMPURE)
				why = "the weight-packing graph holds an impure op";
		}
		if (!why && g->nout != npacked) {
			snprintf(msg, sizeof msg, "the weight-packing graph has %u outputs for %u packed weights", g->nout, npacked);
			why = msg;
		}
		uint32_t k = 0;
		for (uint32_t i = 0; i < p->nt && !why; i++) {
			const tcp_tensor *t = &p->t[i];
			if (t->kind != TCP_T_PACKED)
				continue;
			const ir_node *o = N(g, g->outputs[k++]);
			bool same = o->dtype == t->dtype && o->rank == t->rank;
			for (int d = 0; same && d < t->rank; d++)
				same = o->shape[d] == t->shape[d];
			if (!same) {
				snprintf(msg, sizeof msg, "packed weight %%%u '%.80s' does not match output %u of the weight-packing graph",
					i, t->name, k - 1);
				why = msg;
			}
		}
	}
	if (why) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "%s", why);
		moe_module_free(m);
		return NULL;
	}
	return m;
}

/* {layer} resolved from the graph's `layer` param; {e} kept. */
char *tcp_resolve_source(moe_ctx *ctx, const moe_graph *g, const char *src)
{
	int64_t layer = 0;
	moe_graph_get_dim(g, "layer", &layer);
	char num[32];
	snprintf(num, sizeof num, "%lld", (long long)layer);
	size_t n = 0;
	for (const char *s = src; *s;) {
		if (!strncmp(s, "{layer}", 7)) {
			n += strlen(num);
			s += 7;
		} else {
			n++;
			s++;
		}
	}
	char *r = ctx_alloc(ctx, n + 1), *d = r;
	for (const char *s = src; *s;) {
		if (!strncmp(s, "{layer}", 7)) {
			memcpy(d, num, strlen(num));
			d += strlen(num);
			s += 7;
		} else {
			*d++ = *s++;
		}
	}
	return r;
}

static void add_leaf(moe_graph *g, moe_op op, const char *name, const char *source, moe_dtype dt, int rank,
	const int64_t *shape)
{
	moe_id id = ir_emit(g, op, dt, rank, shape, NULL, 0, moe_loc_none());
	moe_node_set_name(g, id, name);
	if (source)
		moe_node_set_str(g, id, "source", source);
}

static moe_module *tcp_interface(moe_ctx *ctx, const moe_tcp_program *p);

moe_module *moe_tcp_interface(moe_ctx *ctx, const moe_tcp_program *p)
{
	CTX_GUARDED(ctx, moe_module *, NULL, tcp_interface(ctx, p));
}

static moe_module *tcp_interface(moe_ctx *ctx, const moe_tcp_program *p)
{
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, "tcp_program");
	moe_graph_set_dtype(g, (moe_dtype)p->dtype);
	bool ok = true;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->kind == TCP_T_INPUT) {
			add_leaf(g, MOE_OP_INPUT, t->name, NULL, (moe_dtype)t->dtype, t->rank, t->shape);
		} else if (t->kind == TCP_T_WEIGHT) {
			if (!t->source || !t->source[0]) {
				moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
					"tcp: weight '%s' has no checkpoint source in the program; bind it by name instead", t->name);
				ok = false;
			}
			add_leaf(g, MOE_OP_WEIGHT, t->name, t->source, (moe_dtype)t->dtype, t->rank, t->shape);
		}
	}
	if (ok && p->prep_len) {
		moe_module *pm = tcp_prep_module(ctx, p, NULL);
		if (!pm) {
			ok = false;
		} else {
			const moe_graph *pg = moe_module_graph(pm, 0);
			for (moe_id i = 0; i < pg->nnodes; i++) {
				const ir_node *n = N(pg, i);
				if (n->op != MOE_OP_WEIGHT)
					continue;
				bool seen = false;
				for (moe_id j = 0; j < g->nnodes && !seen; j++)
					seen = N(g, j)->name && n->name && !strcmp(N(g, j)->name, n->name);
				if (seen)
					continue;
				char *src = tcp_resolve_source(ctx, pg, ir_attr_str(n, "source", ""));
				add_leaf(g, MOE_OP_WEIGHT, n->name ? n->name : "", src, (moe_dtype)n->dtype, n->rank, n->shape);
				ctx_free(ctx, src, strlen(src) + 1);
			}
			moe_module_free(pm);
		}
	}
	if (!ok) {
		moe_module_free(m);
		return NULL;
	}
	return m;
}
