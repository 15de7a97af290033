/* backend-tcp/multichip.c: N simulated TCP chips running the per-device
 * programs of an expert-parallel layer (docs/expert-parallel.md section 6).
 *
 * Each device's program is cut at its all_to_all nodes into phases: a node's
 * phase is the largest over its operands of the operand's phase, plus one
 * for an operand that is an exchange (an exchange runs at the end of the
 * phase of its operands). Every phase becomes a graph of its own whose
 * inputs are the values of earlier phases (input "ep.<id>"), compiled and
 * run on the simulator. The chips advance together, phase by phase
 * (bulk-synchronous): all chips run phase k, then the exchanges of round k
 * move rows between them in memory, costed by the link model:
 *     time of one all_to_all on chip d = latency + max(bytes out, bytes in) / bandwidth
 * (one full-duplex link per chip into a switch: the machine description's
 * interconnect section, MODEL.md section 9). The layer's time is the sum
 * over phases of the slowest chip plus the sum over rounds of the slowest
 * link. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/tcp_int.h"
#include "ir/graph_keys.h"
#include "moec/passes.h"

typedef struct chip {
	const moe_graph *g;
	int *level;        /* per node: phase (leaves -1) */
	moe_tensor **val;  /* per node: value once computed (owned) */
	double seconds;    /* compute, summed over phases */
	int64_t out_bytes, in_bytes;
	double link_seconds;
} chip;

/* Phases of every node; returns the phase count. Leaves and what depends on
 * leaves alone (a weight's slices and transposes) have phase -1: every phase
 * that uses them recomputes them, so the backend sees them as in one chip's
 * program. */
static int levels(const moe_graph *g, int *level)
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
static moe_module *phase_graph(moe_ctx *ctx, const chip *c, int k, moe_id *ids, uint32_t *nids)
{
	const moe_graph *g = c->g;
	moe_module *m = moe_module_new(ctx);
	moe_graph *d = moe_module_add_graph(m, g->name ? g->name : "phase");
	moe_graph_set_dtype(d, (moe_dtype)g->dtype);
	moe_id *map = calloc(g->nnodes, sizeof *map);
	IR_ASSERT(map);
	for (moe_id i = 0; i < g->nnodes; i++)
		map[i] = MOE_NONE;
	*nids = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_ALL_TO_ALL || c->level[i] != k)
			continue;
		for (uint32_t j = 0; j <= n->nargs; j++) {
			moe_id a = j < n->nargs ? n->args[j] : n->valid;
			if (a == MOE_NONE || map[a] != MOE_NONE)
				continue;
			const ir_node *an = N(g, a);
			if (c->level[a] < 0) {
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
		if (map[i] == MOE_NONE || c->level[i] != k)
			continue;
		bool out = false;
		for (uint32_t o = 0; o < g->nout; o++)
			out |= g->outputs[o] == i;
		for (moe_id j = i + 1; j < g->nnodes && !out; j++) /* an exchange's operand, or used later */
			for (uint32_t a = 0; a < N(g, j)->nargs; a++)
				out |= N(g, j)->args[a] == i && (N(g, j)->op == MOE_OP_ALL_TO_ALL || c->level[j] > k);
		if (out) {
			moe_graph_add_output(d, map[i]);
			ids[(*nids)++] = i;
		}
	}
	/* the block grid's node keys, in the phase that holds the grid */
	for (int k2 = 0; k2 < IR_NNODE_KEYS; k2++) {
		moe_id old = ir_graph_node_attr(g, ir_node_keys[k2]);
		if (old != MOE_NONE && map[old] != MOE_NONE && c->level[old] == k)
			ir_graph_set_attr_int(d, ir_node_keys[k2], map[old]);
	}
	free(map);
	return m;
}

/* A view of t that the map does not own. */
static moe_tensor *view(moe_ctx *ctx, const moe_tensor *t)
{
	moe_tensor *v = moe_tensor_new_shape(ctx, t->dtype, t->rank, t->shape);
	if (v) {
		v->data = t->data;
		v->nbytes = t->nbytes;
		v->owned = 0;
	}
	return v;
}

/* Runs phase k on chip d. */
static moe_status run_phase(moe_ctx *ctx, chip *c, int k, const moe_tensor_map *bind, const moe_tcp_run_opts *ro)
{
	moe_id ids[256];
	uint32_t nids = 0;
	moe_module *m = phase_graph(ctx, c, k, ids, &nids);
	moe_graph *g = moe_module_graph(m, 0);
	moe_status st = nids > 256 ? MOE_ERR_UNSUPPORTED : MOE_OK;
	if (st == MOE_OK && moe_graph_num_outputs(g) == 0) {
		moe_module_free(m);
		return MOE_OK;
	}
	moe_run_opts po = {.verify = 1};
	if (st == MOE_OK)
		st = moe_run_pipeline_text(ctx, "infer-shapes,canonicalize,cse,dce", m, &po);
	moe_tcp_program *p = st == MOE_OK ? moe_tcp_compile(ctx, g, ro->machine) : NULL;
	if (st == MOE_OK && !p)
		st = MOE_ERR_INVALID;
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	bool absent = false;
	for (moe_id i = 0; st == MOE_OK && i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_INPUT && n->op != MOE_OP_WEIGHT)
			continue;
		const moe_tensor *t = NULL;
		unsigned src;
		if (!strncmp(n->name, "ep.", 3) && sscanf(n->name + 3, "%u", &src) == 1)
			t = c->val[src];
		else
			t = moe_tensor_map_get(bind, n->name);
		if (t)
			moe_tensor_map_set(b, n->name, view(ctx, t));
		absent |= t && !t->data;
	}
	moe_tensor *out[256] = {0};
	moe_tcp_stats s;
	/* timing-only: a phase whose weights are all present (routing, combine) runs in
	 * full, so the exchanges move the real counts; one without (the experts) is
	 * timed only and its outputs are zeros of their shapes */
	moe_tcp_run_opts o = *ro;
	o.timing_only = ro->timing_only && absent;
	if (st == MOE_OK)
		st = moe_tcp_run(ctx, p, b, &o, o.timing_only ? NULL : out, &s);
	for (uint32_t j = 0; st == MOE_OK && o.timing_only && j < nids; j++) {
		const ir_node *n = N(c->g, ids[j]);
		out[j] = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		if (!out[j])
			st = MOE_ERR_NOMEM;
	}
	if (st == MOE_OK) {
		c->seconds += s.simulated_seconds;
		for (uint32_t j = 0; j < nids; j++)
			c->val[ids[j]] = out[j], out[j] = NULL;
	}
	for (uint32_t j = 0; j < nids; j++)
		moe_tensor_free(ctx, out[j]);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_module_free(m);
	return st;
}

/* The value of an exchange operand: computed by a phase, or a constant. */
static const moe_tensor *operand(moe_ctx *ctx, chip *c, moe_id a)
{
	const ir_node *n = N(c->g, a);
	if (!c->val[a] && n->op == MOE_OP_CONST) {
		moe_tensor *t = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		double v = ir_attr_float(n, "value", 0);
		for (int64_t i = 0; t && i < moe_tensor_numel(t); i++) {
			if (n->dtype == MOE_I32)
				((int32_t *)t->data)[i] = (int32_t)v;
			else if (n->dtype == MOE_F32)
				((float *)t->data)[i] = (float)v;
			else if (n->dtype == MOE_BF16)
				((uint16_t *)t->data)[i] = moe_f32_to_bf16((float)v);
		}
		c->val[a] = t;
	}
	return c->val[a];
}

/* The exchange of node x (an all_to_all of every chip's program) among the chips. */
static moe_status exchange(moe_ctx *ctx, chip *c, int ep, const moe_id *xs)
{
	for (int d = 0; d < ep; d++) {
		const ir_node *n = N(c[d].g, xs[d]);
		moe_tensor *t = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		if (!t)
			return MOE_ERR_NOMEM;
		c[d].val[xs[d]] = t;
	}
	for (int d = 0; d < ep; d++) {
		moe_id x = xs[d];
		const ir_node *n = N(c[d].g, x);
		const moe_tensor *src = operand(ctx, &c[d], n->args[0]), *cnt = operand(ctx, &c[d], n->args[1]);
		if (!src || !cnt || cnt->dtype != MOE_I32) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "chip %d: all_to_all %%%u: operand %s is neither computed nor a constant", d, x, !src ? moe_op_name((moe_op)N(c[d].g, n->args[0])->op) : moe_op_name((moe_op)N(c[d].g, n->args[1])->op));
			return MOE_ERR_UNSUPPORTED;
		}
		size_t row = src->shape[0] ? src->nbytes / (size_t)src->shape[0] : 0;
		const int32_t *k = cnt->data;
		int64_t off = 0, out = 0;
		for (int j = 0; j < ep; j++) {
			moe_tensor *dst = c[j].val[xs[j]];
			size_t drow = dst->shape[0] ? dst->nbytes / (size_t)dst->shape[0] : 0;
			int64_t at = 0;
			for (int s = 0; s < d; s++) /* rows already received by j from devices before d */
				at += ((const int32_t *)operand(ctx, &c[s], N(c[s].g, xs[s])->args[1])->data)[j];
			if (k[j] < 0 || off + k[j] > src->shape[0] || at + k[j] > dst->shape[0] || drow != row) {
				moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "chip %d: all_to_all sends %d rows to chip %d, more than fit",
					d, k[j], j);
				return MOE_ERR_RUNTIME;
			}
			memcpy((char *)dst->data + (size_t)at * row, (const char *)src->data + (size_t)off * row,
				(size_t)k[j] * row);
			if (j != d) {
				out += k[j] * (int64_t)row;
				c[j].in_bytes += k[j] * (int64_t)row;
			}
			off += k[j];
		}
		c[d].out_bytes += out;
	}
	return MOE_OK;
}

moe_status moe_tcp_ep_run(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tensor_map *const *bind,
	const moe_tcp_run_opts *ro, moe_tensor **const *out, moe_tcp_ep_stats *stats)
{
	if (!ctx || ep < 1 || ep > MOE_TCP_EP_MAX || !g || !bind || !ro || !out || !stats)
		return MOE_ERR_INVALID;
	moe_tcp_machine *def = ro->machine ? NULL : moe_tcp_machine_default(ctx);
	const moe_tcp_machine *mach = ro->machine ? ro->machine : def;
	if (!mach)
		return MOE_ERR_INVALID;
	double bw = mach->link_bytes_per_s, lat = mach->link_latency_s;
	memset(stats, 0, sizeof *stats);
	stats->ep = ep;
	chip c[MOE_TCP_EP_MAX];
	memset(c, 0, sizeof c);
	int phases = 0;
	moe_status st = MOE_OK;
	for (int d = 0; d < ep; d++) {
		c[d].g = g[d];
		c[d].level = calloc(g[d]->nnodes, sizeof *c[d].level);
		c[d].val = calloc(g[d]->nnodes, sizeof *c[d].val);
		if (!c[d].level || !c[d].val) {
			st = MOE_ERR_NOMEM;
			break;
		}
		int p = levels(g[d], c[d].level);
		if (d && (p != phases || g[d]->nnodes < 1)) {
			moe_diag(ctx, MOE_DIAG_ERROR, g[d]->loc, "chip %d: its program has %d phases, chip 0's %d", d, p, phases);
			st = MOE_ERR_INVALID;
		}
		phases = p;
	}
	for (int k = 0; st == MOE_OK && k < phases; k++) {
		double slow = 0, before[MOE_TCP_EP_MAX];
		for (int d = 0; st == MOE_OK && d < ep; d++) {
			before[d] = c[d].seconds;
			st = run_phase(ctx, &c[d], k, bind[d], ro);
			if (c[d].seconds - before[d] > slow)
				slow = c[d].seconds - before[d];
		}
		stats->compute_seconds += slow;
		/* round k: the exchanges whose operands are of phase k, in node order; the
		 * programs differ in node ids (folded constants), not in their exchanges */
		int64_t bo[MOE_TCP_EP_MAX], bi[MOE_TCP_EP_MAX];
		moe_id at[MOE_TCP_EP_MAX] = {0}, xs[MOE_TCP_EP_MAX];
		for (;;) {
			int found = 0;
			for (int d = 0; d < ep; d++) {
				while (at[d] < g[d]->nnodes &&
					(N(g[d], at[d])->op != MOE_OP_ALL_TO_ALL || c[d].level[at[d]] != k))
					at[d]++;
				found += at[d] < g[d]->nnodes;
				xs[d] = at[d]++;
			}
			if (st != MOE_OK || found == 0)
				break;
			if (found != ep) {
				moe_diag(ctx, MOE_DIAG_ERROR, g[0]->loc, "the chips' programs do not exchange alike in phase %d", k);
				st = MOE_ERR_INVALID;
				break;
			}
			for (int d = 0; d < ep; d++)
				bo[d] = c[d].out_bytes, bi[d] = c[d].in_bytes;
			st = exchange(ctx, c, ep, xs);
			double t = 0;
			for (int d = 0; st == MOE_OK && d < ep; d++) {
				int64_t o = c[d].out_bytes - bo[d], i = c[d].in_bytes - bi[d];
				double td = lat + (double)(o > i ? o : i) / bw;
				c[d].link_seconds += td;
				if (td > t)
					t = td;
			}
			stats->link_seconds += t;
			stats->exchanges++;
		}
	}
	for (int d = 0; d < ep; d++) {
		if (st == MOE_OK)
			for (uint32_t o = 0; o < g[d]->nout; o++) {
				out[d][o] = c[d].val[g[d]->outputs[o]];
				c[d].val[g[d]->outputs[o]] = NULL;
			}
		stats->chip_seconds[d] = c[d].seconds;
		stats->chip_link_seconds[d] = c[d].link_seconds;
		stats->chip_link_bytes_out[d] = c[d].out_bytes;
		stats->chip_link_bytes_in[d] = c[d].in_bytes;
		for (moe_id i = 0; c[d].val && i < g[d]->nnodes; i++)
			moe_tensor_free(ctx, c[d].val[i]);
		free(c[d].val);
		free(c[d].level);
	}
	stats->simulated_seconds = stats->compute_seconds + stats->link_seconds;
	stats->link_bytes_per_s = bw;
	stats->link_latency_s = lat;
	if (def)
		moe_tcp_machine_free(ctx, def);
	return st;
}
