/* backend-tcp/prep.c: weight packing (docs/tcp-isa.md section 7, item 5).
 *
 * Real deployments lay weights out for the device once, when they are
 * loaded: a fused gate_up tensor is transposed and split, a strided slice is
 * made dense. The TCP compiler does the same. The pass tcp-split-weights
 * (passes/tcp_split_weights.c) marks every node computed from weights (and
 * constants) only and consumed by the rest of the layer, a *packed weight*,
 * with `tcp_pack`; here the graph is split at those marks. The nodes that
 * compute the packed weights form the prep graph, stored in the program (as
 * IR JSON) and evaluated by the reference interpreter when weights are bound,
 * outside the simulated time; the device program binds the results like
 * ordinary weights, and their HBM traffic counts at their packed size. A
 * graph that carries no mark (lowered by a pipeline without the pass) is
 * planned by the pass's own rule (pass_tcp_pack_plan). */
#include <cjson/cJSON.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"
#include "passes/pass.h"

static void mark(const moe_graph *g, moe_id id, bool *need, const bool *stop)
{
	if (need[id])
		return;
	need[id] = true;
	if (stop && stop[id])
		return;
	const ir_node *n = N(g, id);
	for (uint32_t k = 0; k < n->nargs; k++)
		if (n->args[k] != MOE_NONE)
			mark(g, n->args[k], need, stop);
	if (n->valid != MOE_NONE)
		mark(g, n->valid, need, stop);
}

/* pack[i] from the tcp_pack marks; without any mark, the pass's rule. */
static uint32_t packed_nodes(moe_ctx *ctx, const moe_graph *g, bool *pack)
{
	uint32_t npack = 0;
	bool marked = false;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_attr *a = ir_attr_find(N(g, i), IR_NK_TCP_PACK);
		marked |= a != NULL;
		pack[i] = a && ir_attr_int(N(g, i), IR_NK_TCP_PACK, -1) >= 0;
		npack += pack[i];
	}
	return marked ? npack : pass_tcp_pack_plan(ctx, g, pack);
}

static void drop_key(ir_node *n, const char *key)
{
	ir_attr *a = ir_attr_find(n, key);
	if (!a)
		return;
	uint32_t at = (uint32_t)(a - n->attrs);
	memmove(&n->attrs[at], &n->attrs[at + 1], (n->nattrs - at - 1) * sizeof *n->attrs);
	n->nattrs--;
}

/* The prep graph keeps no mark of the TCP passes (it is run, not split nor lowered). */
static void drop_mark(moe_graph *g, moe_id id)
{
	static const char *const keys[] = {IR_NK_TCP_PACK, IR_NK_TCP_FUSE, IR_NK_TCP_VIEW, IR_NK_TCP_HBM, IR_NK_TCP_GGRID};
	for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
		drop_key(N(g, id), keys[k]);
}

moe_graph *tcp_split_weights(moe_ctx *ctx, const moe_graph *g, char **prep_json, size_t *prep_len, moe_id *dev_of)
{
	*prep_json = NULL;
	*prep_len = 0;
	uint32_t nn = g->nnodes;
	bool *pack = ctx_alloc(ctx, nn + 1);
	uint32_t npack = packed_nodes(ctx, g, pack);
	moe_graph *dev = NULL;
	if (npack) {
		/* the device graph: packed nodes become weight leaves */
		bool *need = ctx_alloc(ctx, nn + 1);
		moe_id *map = ctx_alloc(ctx, (nn + 1) * sizeof *map);
		for (uint32_t o = 0; o < g->nout; o++)
			mark(g, g->outputs[o], need, pack);
		dev = ir_graph_clone_empty(g);
		ir_graph_drop_node_keys(dev);
		uint32_t k = 0;
		for (moe_id i = 0; i < nn; i++) {
			map[i] = MOE_NONE;
			if (!need[i])
				continue;
			const ir_node *n = N(g, i);
			if (!pack[i]) {
				map[i] = ir_copy_node(dev, g, i, map);
				continue;
			}
			map[i] = ir_emit(dev, MOE_OP_WEIGHT, (moe_dtype)n->dtype, n->rank, n->shape, NULL, 0, n->loc);
			char name[160];
			snprintf(name, sizeof name, "packed.%u.%s", k, n->name ? n->name : moe_op_name((moe_op)n->op));
			moe_node_set_name(dev, map[i], name);
			moe_node_set_int(dev, map[i], "tcp_packed", k++);
		}
		for (uint32_t o = 0; o < g->nout; o++)
			moe_graph_add_output(dev, map[g->outputs[o]]);
		ir_graph_remap_node_keys(dev, g, map);
		if (dev_of)
			memcpy(dev_of, map, nn * sizeof *map);
		/* the prep graph: the packed nodes and everything they read */
		memset(need, 0, nn + 1);
		for (moe_id i = 0; i < nn; i++)
			if (pack[i])
				mark(g, i, need, NULL);
		moe_module *pm = moe_module_new(ctx);
		moe_module_add_graph(pm, g->name ? g->name : "prep");
		moe_graph *pg = ir_graph_clone_empty(g);
		ir_graph_drop_node_keys(pg); /* the block grid is the device graph's */
		drop_key(&pg->meta, IR_GK_TCP_FUSION_PLAN);
		for (moe_id i = 0; i < nn; i++) {
			map[i] = need[i] ? ir_copy_node(pg, g, i, map) : MOE_NONE;
			if (map[i] != MOE_NONE)
				drop_mark(pg, map[i]);
		}
		for (moe_id i = 0; i < nn; i++)
			if (pack[i])
				moe_graph_add_output(pg, map[i]);
		ir_module_replace(pm, 0, pg);
		/* stored compact (one line in the assembly) */
		char *js = moe_module_to_json(pm);
		cJSON *root = js ? cJSON_Parse(js) : NULL;
		char *flat = root ? cJSON_PrintUnformatted(root) : NULL;
		if (flat) {
			*prep_len = strlen(flat);
			*prep_json = ctx_try_alloc(ctx, *prep_len + 1); /* no throw while cJSON holds memory */
			if (*prep_json)
				memcpy(*prep_json, flat, *prep_len);
		}
		cJSON_free(flat);
		cJSON_Delete(root);
		moe_free(ctx, js);
		moe_module_free(pm);
		ctx_free(ctx, need, nn + 1);
		ctx_free(ctx, map, (nn + 1) * sizeof *map);
		if (!*prep_json) {
			moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "tcp: out of memory writing the weight-packing graph");
			ir_graph_free(dev);
			dev = NULL;
		}
	}
	ctx_free(ctx, pack, nn + 1);
	return dev;
}

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

/* Binds each packed tensor of p in table order: out[k] when given (taken),
 * else a tensor without data (shape only). */
static moe_status bind_packed(moe_ctx *ctx, const tcp_program *p, moe_tensor **out, const bool *none,
	moe_tensor_map *packed)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->kind != TCP_T_PACKED)
			continue;
		moe_tensor *h = none[k] ? moe_tensor_new_shape(ctx, (moe_dtype)t->dtype, t->rank, t->shape) : out[k];
		if (!none[k])
			out[k] = NULL;
		k++;
		if (!h)
			return MOE_ERR_INVALID;
		moe_tensor_map_set(packed, t->name, h);
	}
	return MOE_OK;
}

/* The graph of g's outputs that do not depend on a weight in `absent`
 * (none[k] set for the others), or NULL when all or none do. */
static moe_graph *present_part(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, bool *none, bool *all)
{
	uint32_t nn = g->nnodes;
	bool *dep = ctx_alloc(ctx, (nn + 1) * sizeof *dep);
	moe_id *map = ctx_alloc(ctx, (nn + 1) * sizeof *map);
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		const moe_tensor *w = n->op == MOE_OP_WEIGHT && bind ? moe_tensor_map_get(bind, n->name) : NULL;
		dep[i] = w && !w->data;
		for (uint32_t a = 0; a < n->nargs; a++)
			dep[i] |= n->args[a] != MOE_NONE && dep[n->args[a]];
	}
	uint32_t nd = 0;
	for (uint32_t k = 0; k < g->nout; k++)
		nd += none[k] = dep[g->outputs[k]];
	*all = nd == g->nout;
	moe_graph *r = NULL;
	if (nd && nd < g->nout) {
		r = ir_graph_clone_empty(g);
		for (moe_id i = 0; i < nn; i++)
			map[i] = dep[i] ? MOE_NONE : ir_copy_node(r, g, i, map);
		for (uint32_t k = 0; k < g->nout; k++)
			if (!none[k])
				moe_graph_add_output(r, map[g->outputs[k]]);
	}
	ctx_free(ctx, dep, (nn + 1) * sizeof *dep);
	ctx_free(ctx, map, (nn + 1) * sizeof *map);
	return r;
}

moe_status tcp_pack_weights(moe_ctx *ctx, const tcp_program *p, const moe_tensor_map *bind, bool timing_only,
	moe_tensor_map *packed)
{
	if (!p->prep_len)
		return MOE_OK;
	moe_module *m = tcp_prep_module(ctx, p, NULL);
	if (!m)
		return MOE_ERR_INVALID;
	const moe_graph *g = moe_module_graph(m, 0);
	/* timing only, with weights absent: the packed tensors computed from them
	 * are absent too (shape, no data; the simulator faults if it needs their
	 * values), the others are packed from the weights present */
	uint32_t no = g->nout;
	bool *none = ctx_alloc(ctx, (no + 1) * sizeof *none), all = false;
	moe_graph *part = timing_only ? present_part(ctx, g, bind, none, &all) : NULL;
	moe_tensor **out = ctx_alloc(ctx, (no + 1) * sizeof *out);
	moe_status rc = MOE_OK;
	if (!all) {
		moe_tensor **o = part ? ctx_alloc(ctx, (no + 1) * sizeof *o) : out;
		rc = moe_interp_run(ctx, part ? part : g, bind, o);
		for (uint32_t k = 0, j = 0; part && k < no; k++)
			out[k] = none[k] || rc != MOE_OK ? NULL : o[j++];
		if (part)
			ctx_free(ctx, o, (no + 1) * sizeof *o);
	}
	if (rc == MOE_OK)
		rc = bind_packed(ctx, p, out, none, packed);
	else
		moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_none(), "tcp: packing the weights failed");
	for (uint32_t k = 0; k < no; k++)
		moe_tensor_free(ctx, out[k]);
	ctx_free(ctx, out, (no + 1) * sizeof *out);
	ctx_free(ctx, none, (no + 1) * sizeof *none);
	if (part)
		ir_graph_free(part);
	moe_module_free(m);
	return rc;
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
