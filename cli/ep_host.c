/* cli/ep_host.c: `moec run --ep N --engine=llvm|c`, one rank's
 * expert-parallel program on a host JIT engine (docs/expert-parallel.md
 * section 5). The engines compile whole graphs and have no call-out for an
 * exchange, so the program is cut at its all_to_all nodes into phases
 * (moe_ep_phases, as the TCP chips are); each phase is compiled and run by
 * the engine with the compiled kernels, and between phases the exchanges of
 * that round go through x (MPI) in node order, the order every rank's
 * program has. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moec/backend.h"
#include "moec/passes.h"

#define PHASE_MAX_OUT 256

/* Node a's value: computed, or a constant (an exchange's counts may be one). */
static moe_tensor *value(moe_ctx *ctx, const moe_graph *g, moe_tensor **val, moe_id a)
{
	if (val[a] || moe_node_op(g, a) != MOE_OP_CONST)
		return val[a];
	double v = 0;
	int64_t iv = 0;
	if (moe_node_get_int(g, a, "value", &iv))
		v = (double)iv;
	else
		moe_node_get_float(g, a, "value", &v);
	moe_tensor *t = moe_tensor_new(ctx, moe_node_dtype(g, a), moe_node_rank(g, a), moe_node_shape(g, a));
	for (int64_t i = 0; t && i < moe_tensor_numel(t); i++) {
		if (t->dtype == MOE_I32)
			((int32_t *)t->data)[i] = (int32_t)v;
		else if (t->dtype == MOE_F32)
			((float *)t->data)[i] = (float)v;
		else if (t->dtype == MOE_BF16)
			((uint16_t *)t->data)[i] = moe_f32_to_bf16((float)v);
	}
	return val[a] = t;
}

/* Phase k compiled and run by the engine; its outputs become val[...]. */
static int run_phase(moe_ctx *ctx, const moe_graph *g, const int *level, int k, const moe_tensor_map *bind,
	const moe_host_opts *ho, moe_tensor **val, moe_host_stats *sum)
{
	moe_id ids[PHASE_MAX_OUT];
	uint32_t nids = 0;
	moe_module *m = moe_ep_phase_graph(ctx, g, level, k, ids, PHASE_MAX_OUT, &nids);
	moe_graph *pg = moe_module_graph(m, 0);
	int st = 0;
	if (nids > PHASE_MAX_OUT) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--ep: phase %d hands on %u values, at most %d are supported", k,
			nids, PHASE_MAX_OUT);
		st = 1;
	}
	if (!st && moe_graph_num_outputs(pg) == 0) {
		moe_module_free(m);
		return 0;
	}
	moe_run_opts po = {.verify = 1};
	st = st || moe_run_pipeline_text(ctx, "infer-shapes,canonicalize,cse,dce", m, &po) != MOE_OK;
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	for (moe_id i = 0; !st && i < moe_graph_num_nodes(pg); i++) {
		moe_op op = moe_node_op(pg, i);
		const char *name = moe_node_name(pg, i);
		if ((op != MOE_OP_INPUT && op != MOE_OP_WEIGHT) || !name)
			continue;
		unsigned src;
		const moe_tensor *t = !strncmp(name, "ep.", 3) && sscanf(name + 3, "%u", &src) == 1 &&
					      src < moe_graph_num_nodes(g) ? val[src] : moe_tensor_map_get(bind, name);
		if (t)
			moe_tensor_map_set(b, name, moe_tensor_view(ctx, t));
	}
	moe_tensor *out[PHASE_MAX_OUT] = {0};
	moe_host_stats hs;
	memset(&hs, 0, sizeof hs);
	st = st || moe_host_run_opts(ctx, pg, b, ho, out, &hs) != MOE_OK;
	if (!st && sum) { /* the phases' times add up; the workspace is the largest */
		sum->compute_seconds += hs.compute_seconds;
		sum->compile_seconds += hs.compile_seconds;
		sum->setup_seconds += hs.setup_seconds;
		sum->pack_seconds += hs.pack_seconds;
		sum->blocks_executed += hs.blocks_executed;
		sum->blocks_skipped += hs.blocks_skipped;
		sum->rows_executed += hs.rows_executed;
		if (hs.workspace_bytes > sum->workspace_bytes)
			sum->workspace_bytes = hs.workspace_bytes;
		sum->threads = hs.threads;
		if (hs.cache > sum->cache)
			sum->cache = hs.cache;
	}
	for (uint32_t j = 0; j < nids && j < PHASE_MAX_OUT; j++) {
		if (!st && !val[ids[j]])
			val[ids[j]] = out[j], out[j] = NULL;
		moe_tensor_free(ctx, out[j]);
	}
	moe_tensor_map_free(b);
	moe_module_free(m);
	return st;
}

/* The exchange of node i through x: rows [0, sum counts) of its operand,
 * counts[j] of them to rank j; the rows received, then zeros. */
static int exchange(moe_ctx *ctx, const moe_graph *g, moe_id i, moe_tensor **val, const moe_exchange *x)
{
	const moe_tensor *src = value(ctx, g, val, moe_node_arg(g, i, 0)), *cnt = value(ctx, g, val, moe_node_arg(g, i, 1));
	moe_tensor *r = moe_tensor_new(ctx, moe_node_dtype(g, i), moe_node_rank(g, i), moe_node_shape(g, i));
	int64_t counts[4096];
	if (!src || !cnt || !r || cnt->dtype != MOE_I32 || moe_tensor_numel(cnt) != x->ep || x->ep > 4096) {
		moe_tensor_free(ctx, r);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_node_loc(g, i), "--ep: all_to_all %%%u: its operands are not computed", i);
		return 1;
	}
	for (int j = 0; j < x->ep; j++)
		counts[j] = ((const int32_t *)cnt->data)[j];
	size_t row = src->shape[0] ? src->nbytes / (size_t)src->shape[0] : 0;
	int64_t got = 0;
	if (x->all_to_all(x->ud, ctx, src->data, counts, row, r->data, r->shape[0], &got) != MOE_OK) {
		moe_tensor_free(ctx, r);
		return 1;
	}
	if (got < r->shape[0])
		memset((char *)r->data + (size_t)got * row, 0, (size_t)(r->shape[0] - got) * row);
	val[i] = r;
	return 0;
}

int cli_ep_host_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const moe_host_opts *ho,
	const moe_exchange *x, moe_tensor **out, moe_host_stats *sum)
{
	uint32_t nn = moe_graph_num_nodes(g);
	int *level = calloc(nn + 1, sizeof *level);
	moe_tensor **val = calloc(nn + 1, sizeof *val);
	int st = !level || !val;
	int phases = st ? 0 : moe_ep_phases(g, level);
	for (int k = 0; !st && k < phases; k++) {
		st = run_phase(ctx, g, level, k, bind, ho, val, sum);
		for (moe_id i = 0; !st && i < nn; i++)
			if (moe_node_op(g, i) == MOE_OP_ALL_TO_ALL && level[i] == k)
				st = exchange(ctx, g, i, val, x);
	}
	for (uint32_t o = 0; !st && o < moe_graph_num_outputs(g); o++) {
		moe_id y = moe_graph_output(g, o);
		st = !val[y];
		out[o] = val[y];
		val[y] = NULL;
	}
	for (uint32_t i = 0; val && i < nn; i++)
		moe_tensor_free(ctx, val[i]);
	free(val);
	free(level);
	return st;
}
