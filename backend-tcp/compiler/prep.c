/* backend-tcp/compiler/prep.c: weight packing (docs/tcp-isa.md section 7, item 5).
 *
 * Real deployments lay weights out for the device once, when they are
 * loaded: a fused gate_up tensor is transposed and split, a strided slice is
 * made dense. The TCP compiler does the same. The pass tcp-split-weights
 * (passes/tcp_split_weights.c) marks every node computed from weights (and
 * constants) only and consumed by the rest of the layer, a *packed weight*,
 * with `tcp_pack`; here the graph is split at those marks. The nodes that
 * compute the packed weights form the prep graph, stored in the program (as
 * IR JSON) and evaluated by the reference interpreter when weights are bound
 * (sim/pack.c), outside the simulated time; the device program binds the
 * results like ordinary weights, and their HBM traffic counts at their packed
 * size. A graph that carries no mark (lowered by a pipeline without the
 * pass) is planned by the pass's own rule (pass_tcp_pack_plan). */
#include <cjson/cJSON.h>
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
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

uint32_t tcp_packed_nodes(moe_ctx *ctx, const moe_graph *g, bool *pack)
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
	static const char *const keys[] = {
		IR_NK_TCP_PACK, IR_NK_TCP_FP8_ROWS, IR_NK_TCP_FUSE, IR_NK_TCP_VIEW, IR_NK_TCP_HBM, IR_NK_TCP_GGRID};
	for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
		drop_key(N(g, id), keys[k]);
}

moe_graph *tcp_split_weights(moe_ctx *ctx, const moe_graph *g, char **prep_json, size_t *prep_len, moe_id *dev_of)
{
	*prep_json = NULL;
	*prep_len = 0;
	uint32_t nn = g->nnodes;
	bool *pack = ctx_alloc(ctx, nn + 1);
	uint32_t npack = tcp_packed_nodes(ctx, g, pack);
	moe_graph *dev = NULL;
	if (npack) {
		/* the device graph: packed nodes become weight leaves */
		bool *need = ctx_alloc(ctx, nn + 1);
		moe_id *map = ctx_alloc(ctx, (nn + 1) * sizeof *map);
		for (uint32_t o = 0; o < g->nout; o++)
			mark(g, g->outputs[o], need, pack);
		dev = ir_graph_clone_empty(g);
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
		for (uint32_t a = pg->meta.nattrs; a-- > 0;) /* the TCP passes' records (tcp_*) */
			if (!strncmp(pg->meta.attrs[a].key, "tcp_", 4))
				drop_key(&pg->meta, pg->meta.attrs[a].key);
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
		if (!*prep_json) { /* out of memory: the JSON text or its copy (cJSON's memory is returned) */
			ir_graph_free(dev);
			ctx_throw(ctx, *prep_len + 1);
		}
	}
	ctx_free(ctx, pack, nn + 1);
	return dev;
}

/* Refused before any work, by both emitters: weights beyond HBM. The sum of
 * g's weight leaves (packed weights at their packed size when g is the device
 * graph) is a lower bound on what the program binds in HBM, so the layer is
 * refused with the sizes and a hint before any DM or HBM placement is tried;
 * the largest weight names the place. */
bool tcp_weights_fit_hbm(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	double wsum = 0;
	moe_id big = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_WEIGHT) {
			wsum += (double)ir_bytes(N(g, i));
			if (big == MOE_NONE || ir_bytes(N(g, i)) > ir_bytes(N(g, big)))
				big = i;
		}
	if (wsum <= m->hbm_bytes)
		return true;
	moe_diag(ctx, MOE_DIAG_ERROR, big != MOE_NONE ? N(g, big)->loc : g->loc,
		"tcp: the layer needs at least %.2f GiB of HBM for its weights but the machine has %.2f GiB; use bf16 "
		"(--set dtype=bf16) or fp8 weights, or split the experts over chips (--ep)", wsum / 1073741824.0,
		m->hbm_bytes / 1073741824.0);
	return false;
}
