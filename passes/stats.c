/* passes/stats.c: `moec stats` - sizes, FLOPs, grid bounds and buffer bytes
 * of each layer, measured on the graph before and after the pipeline. */
#include <cjson/cJSON.h>
#include <string.h>

#include "passes/pass.h"

/* 2 x multiply-adds of an einsum: product of every index extent. */
static double einsum_flops(const moe_graph *g, const ir_node *n)
{
	ir_einsum e;
	char msg[64];
	if (!ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg))
		return 0;
	double f = 2;
	for (int l = 0; l < e.nletters; l++) {
		int64_t sz = 1;
		for (int i = 0; i < e.nin; i++) {
			const ir_node *a = N(g, n->args[i]);
			for (int d = 0; d < e.rank[i]; d++)
				if (e.in[i][d] == e.letters[l])
					sz = a->shape[d];
		}
		f *= (double)sz;
	}
	return f;
}

static double graph_flops(const moe_graph *g)
{
	double f = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_EINSUM && n->nargs == 2)
			f += einsum_flops(g, n);
		else if (n->op == MOE_OP_EXPERTS) {
			const ir_node *x = N(g, n->args[EXP_X]), *idx = N(g, n->args[EXP_IDX]), *up = N(g, n->args[EXP_UP]);
			double proj = n->args[EXP_GATE] != MOE_NONE ? 3 : 2;
			f += 2.0 * (double)x->shape[0] * (double)idx->shape[1] * (double)x->shape[1] * (double)up->shape[1] * proj;
		}
	}
	return f;
}

static cJSON *layer_stats(moe_ctx *ctx, const moe_graph *g, const char *pipeline, moe_status *st)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "layer", g->name);
	cJSON_AddStringToObject(o, "dtype", moe_dtype_name(g->dtype));
	cJSON *dims = cJSON_AddObjectToObject(o, "dims");
	for (uint32_t i = 0; i < g->ndims; i++)
		cJSON_AddNumberToObject(dims, g->dims[i].name, (double)g->dims[i].value);
	double wbytes = 0;
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_WEIGHT)
			wbytes += (double)ir_bytes(N(g, i));
	cJSON_AddNumberToObject(o, "flops", graph_flops(g));
	cJSON_AddNumberToObject(o, "weight_bytes", wbytes);
	double qbytes = 0; /* packed values and scales read by dequant */
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_DEQUANT)
			for (uint32_t a = 0; a < 2; a++) {
				const ir_node *w = N(g, N(g, i)->args[a]);
				while (w->op == MOE_OP_RESHAPE || w->op == MOE_OP_SLICE)
					w = N(g, w->args[0]);
				if (w->op == MOE_OP_WEIGHT)
					qbytes += (double)ir_bytes(w);
			}
	cJSON_AddNumberToObject(o, "quantized_weight_bytes", qbytes);
	/* lower a copy */
	moe_module *tmp = moe_module_new(ctx);
	ctx_grow(ctx, (void **)&tmp->graphs, &tmp->gcap, 1, sizeof *tmp->graphs);
	tmp->graphs[tmp->ngraphs++] = ir_graph_clone(g);
	*st = moe_run_pipeline_text(ctx, pipeline ? pipeline : "tcp,flatten-blocks", tmp, NULL);
	if (*st == MOE_OK) {
		const moe_graph *l = tmp->graphs[0];
		static const char *const keys[] = {IR_GK_GRID_BLOCKS_MAX, IR_GK_GRID_BLOCKS_SEED, IR_GK_GRID_BLOCKS_VLLM,
			IR_GK_BLOCK_BUFFER_BYTES, IR_GK_BLOCK_BUFFER_BYTES_SEED, IR_GK_BLOCK_BUFFER_BYTES_VLLM};
		for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
			ir_attr *a = ir_attr_find(&l->meta, keys[k]);
			if (a)
				cJSON_AddNumberToObject(o, keys[k], (double)a->v.i);
		}
		if (!ir_attr_find(&l->meta, IR_GK_GRID_BLOCKS_MAX))
			cJSON_AddNullToObject(o, IR_GK_GRID_BLOCKS_MAX);
		cJSON_AddNumberToObject(o, "flops_grid_max", graph_flops(l));
		cJSON *bufs = cJSON_AddArrayToObject(o, "buffers");
		double total = 0;
		for (moe_id i = 0; i < l->nnodes; i++) {
			const ir_node *n = N(l, i);
			if (ir_ops[n->op].flags & OPF_LEAF && n->op != MOE_OP_CONST)
				continue;
			if (n->op == MOE_OP_CONST && n->rank == 0)
				continue;
			cJSON *b = cJSON_CreateObject();
			char id[32];
			snprintf(id, sizeof id, "%%%u", i);
			cJSON_AddStringToObject(b, "value", id);
			if (n->name)
				cJSON_AddStringToObject(b, "name", n->name);
			cJSON_AddStringToObject(b, "op", ir_ops[n->op].name);
			cJSON_AddNumberToObject(b, "bytes", (double)ir_bytes(n));
			total += (double)ir_bytes(n);
			cJSON_AddItemToArray(bufs, b);
		}
		cJSON_AddNumberToObject(o, "buffer_bytes_total", total);
	}
	moe_module_free(tmp);
	return o;
}

char *moe_module_stats_json(moe_ctx *ctx, const moe_module *m, const char *pipeline)
{
	if (!m->ngraphs)
		return NULL;
	moe_status st = MOE_OK;
	cJSON *first = layer_stats(ctx, m->graphs[0], pipeline, &st);
	if (st == MOE_OK && m->ngraphs > 1) {
		cJSON *arr = cJSON_CreateArray();
		cJSON_AddItemToArray(arr, cJSON_Duplicate(first, 1));
		for (uint32_t i = 1; i < m->ngraphs && st == MOE_OK; i++)
			cJSON_AddItemToArray(arr, layer_stats(ctx, m->graphs[i], pipeline, &st));
		cJSON_AddItemToObject(first, "layers", arr);
	}
	char *s = st == MOE_OK ? cJSON_Print(first) : NULL;
	cJSON_Delete(first);
	return s;
}
