/* backend-tcp/lower.c: a graph after the `tcp` pipeline -> a TCP program.
 *
 * Placement: graph inputs, weights and outputs live in HBM; the dispatch
 * grid and the block results the combine reads back live in HBM; every other
 * value lives in DM, allocated first-fit per slice with liveness (freed after
 * its last use) and checked against the DM capacity.
 * Ops: elementwise ops, reductions, scans, softmax, one_hot and filter become
 * vector-engine passes (tu.vec) whose ALU chain respects the fixed stage
 * order; einsums become contraction passes with the second operand stationary
 * in TRF (double-buffered tiles loaded by the sub context); gather,
 * take_along and scatter become DMA gathers/scatters with index lists;
 * reshape, slice, broadcast are sequencer views (no data moves).
 * Blocks: nodes masked by the per-block valid rows (and the per-block weight
 * gathers masked by nblocks; blockwise-dispatch names both in graph
 * attributes, ir/graph_keys.h) form the block region, emitted once as a loop
 * over g < nblocks (a run-time count: blocks past it are skipped). Inside,
 * the next block's weights and rows are prefetched by DMA into the other half
 * of double buffers while the current block computes; when consecutive
 * blocks share an expert its weights are not fetched again. When two whole
 * experts per weight do not fit (half of DM), the weights feeding block
 * contractions are streamed: each TRF tile is DMA'd from HBM into a small
 * double buffer just before its sub load (tiling along F; docs 7.4). */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

static void lower_leaf(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	switch ((moe_op)n->op) {
	case MOE_OP_CONST: {
		c->v[id].kind = VK_IMM;
		c->v[id].imm = imm_of(n, ir_attr_float(n, "value", (double)ir_attr_int(n, "value", 0)));
		break;
	}
	case MOE_OP_IOTA:
		c->v[id].kind = VK_IOTA;
		c->v[id].axis = norm_axis(n, n, 0);
		break;
	default: {
		bool w = n->op == MOE_OP_WEIGHT, packed = w && ir_attr_int(n, "tcp_packed", -1) >= 0;
		int32_t t = tcpl_hbm_tensor(c, n->name ? n->name : "", packed ? TCP_T_PACKED : w ? TCP_T_WEIGHT : TCP_T_INPUT,
			(moe_dtype)n->dtype, n->rank, n->shape);
		if (w && !packed) {
			char *src = tcp_resolve_source(c->ctx, c->g, ir_attr_str(n, "source", ""));
			tcp_set_source(c->p, t, src);
			ctx_free(c->ctx, src, strlen(src) + 1);
		}
		c->v[id] = tview(t, id, n);
		if (n->op == MOE_OP_INPUT)
			c->leaf_t[id] = t;
		c->p->act_bytes += w ? 0 : ir_bytes(n);
		/* a small i32 or f32 value an earlier phase of an expert-parallel
		 * program hands on (input "ep.<id>": counts, received experts,
		 * positions, routing weights; not rows) is copied into DM with the
		 * leaves, so the copies join one descriptor list, rather than one by
		 * one between the vector passes that use them */
		if (n->op == MOE_OP_INPUT && (n->dtype == MOE_I32 || n->dtype == MOE_F32) && n->name &&
			!strncmp(n->name, "ep.", 3) && ir_bytes(n) <= 256 * 1024)
			tcpl_dm_view(c, id);
		break;
	}
	}
}

/* A row slice of a graph input read by a row chunk of the tail: a view of
 * the input in HBM (copied to DM by its reader, per chunk), not of the DM copy
 * routing may have made of the whole input. */
static bool input_rows(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (!c->sink || n->op != MOE_OP_SLICE || c->leaf_t[n->args[0]] < 0 || ir_attr_int(n, "step", 1) != 1)
		return false;
	const ir_node *s = N(c->g, n->args[0]);
	int axis = norm_axis(n, s, 0);
	int64_t start = ir_attr_int(n, "start", 0);
	if (start < 0)
		start += s->shape[axis];
	val v = tview(c->leaf_t[n->args[0]], id, s);
	v.base = start * v.stride[axis];
	c->v[id] = v;
	return true;
}

/* Is o exactly one graph output (index *idx) that no node reads? */
static bool sole_output(const lw *c, moe_id o, uint32_t *idx)
{
	const moe_graph *g = c->g;
	uint32_t k = 0;
	for (uint32_t i = 0; i < g->nout; i++)
		if (g->outputs[i] == o)
			*idx = i, k++;
	for (moe_id i = o + 1; i < g->nnodes && k == 1; i++)
		for (uint32_t a = 0; a < N(g, i)->nargs; a++)
			k += N(g, i)->args[a] == o;
	return k == 1;
}

/* The HBM tensor of graph output o, named output<idx>. */
static int32_t out_tensor(lw *c, moe_id o, uint32_t idx)
{
	const ir_node *n = N(c->g, o);
	char name[64];
	snprintf(name, sizeof name, "output%u", idx);
	int32_t t = tcpl_hbm_tensor(c, n->name ? n->name : name, TCP_T_OUTPUT, (moe_dtype)n->dtype, n->rank, n->shape);
	c->p->t[t].name[0] = 0;
	ctx_free(c->ctx, c->p->t[t].name, 1);
	c->p->t[t].name = ctx_alloc(c->ctx, strlen(name) + 1);
	memcpy(c->p->t[t].name, name, strlen(name));
	return t;
}

bool tcpl_gather_to_output(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	uint32_t idx = 0;
	int64_t row = n->rank >= 1 && n->shape[0] > 0 ? ir_bytes(n) / n->shape[0] : 0;
	/* whole HBM granules per row: a partial one would be written at the
	 * unaligned factor, which one contiguous copy avoids */
	if (c->v[id].kind == VK_VIEW || c->inreg[id] || c->store_dt[id] || !c->is_out[id] || row <= 0 ||
		row % c->m->hbm_granule != 0 || !sole_output(c, id, &idx))
		return false;
	c->v[id] = tview(out_tensor(c, id, idx), id, n);
	return true;
}

/* (sink, or an output of 1/8 of DM or more) An output joined from parts
 * along its rows (out_cat): each part is DMA'd into its rows of the output
 * tensor as soon as it is computed, so no whole copy sits in DM. Not
 * otherwise: that DMA would queue ahead of the next part's gather and hold
 * it behind this part's compute. */
static bool out_cat(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	uint32_t idx = 0;
	/* (lower_pairs.c: no gather after the loop for such a DMA to hold) */
	bool big = c->sink || ir_bytes(n) >= c->m->dm_bytes_per_slice / 8 * c->S || c->pr_node != MOE_NONE;
	if (n->op != MOE_OP_CONCAT || !big || !c->is_out[id] || norm_axis(n, n, 0) != 0 || c->hbm_home[id] ||
		c->inreg[id] || !sole_output(c, id, &idx))
		return false;
	for (uint32_t i = 0; i < n->nargs; i++)
		for (uint32_t k = 0; k < i; k++)
			if (n->args[k] == n->args[i])
				return false;
	return true;
}

static void out_part(lw *c, moe_id part)
{
	moe_id id = c->cat_of[part];
	const ir_node *n = N(c->g, id), *a = N(c->g, part);
	if (c->v[id].kind != VK_VIEW) {
		uint32_t idx = 0;
		sole_output(c, id, &idx);
		c->v[id] = tview(out_tensor(c, id, idx), id, n);
	}
	int64_t row = ir_numel(n) / (n->shape[0] ? n->shape[0] : 1), off = 0;
	for (uint32_t i = 0; i < n->nargs && n->args[i] != part; i++)
		off += N(c->g, n->args[i])->shape[0];
	val *v = tcpl_need_view(c, part);
	if (v->kind != VK_VIEW || !is_contig(v, a) || c->p->t[v->t].dtype != a->dtype)
		v = tcpl_copy_contig(c, part);
	if (v->kind != VK_VIEW || !is_contig(v, a) || c->p->t[v->t].dtype != a->dtype) {
		tcpl_err(c, id, "output part is not a contiguous tensor");
		return;
	}
	uint32_t at = c->p->ncode;
	dma_copy(c, c->v[id].t, off * row, -1, 0, v->t, v->base, -1, 0, ir_numel(a));
	/* after the block loop a part's copy joins the DMA command before it
	 * (the next chunk's combine gather, or the previous part's copy), across
	 * the vector passes between that compute its rows: its setup runs beside
	 * that command's transfer (a row-chunked tail's 64 parts paid 500 cycles
	 * each between transfers; straight-line code only) */
	if (c->sink && c->rows != MOE_NONE && c->p->block_loop_pc >= 0 && at == c->p->ncode - 1) {
		uint32_t q = at;
		while (q > 0 && (tcp_op_ctx[c->p->code[q - 1].op] == TCP_CTX_MAIN ||
					tcp_op_ctx[c->p->code[q - 1].op] == TCP_CTX_SUB))
			q--;
		if (q > 0 && tcp_op_ctx[c->p->code[q - 1].op] == TCP_CTX_DMA && q - 1 > (uint32_t)c->p->block_loop_pc)
			c->p->code[at].flags |= TCP_F_JOIN;
	}
}

/* Lower node id (and, for a part of an output joined along its rows, its DMA out). */
static void lower_one(lw *c, moe_id id)
{
	tcpl_lower_node(c, id);
	if (c->cat_of[id] != MOE_NONE && !c->failed)
		out_part(c, id);
}

void tcpl_lower_node(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (c->failed)
		return;
	if (ir_ops[n->op].flags & OPF_LEAF) {
		lower_leaf(c, id);
		return;
	}
	if (c->fused_into[id] != MOE_NONE || c->gdefer[id] || id == c->dc.red)
		return; /* computed inside the reduce it feeds; or gathered per block; or in the loop (lower_dcomb.c) */
	if (c->ggrid[id] && n->op == MOE_OP_RESHAPE) {
		c->v[id] = c->v[n->args[0]]; /* the grid's row list; the block loop gathers */
		tcpl_decode_reshape(c, id);  /* or x's one row, read in place (lower_decode.c) */
		return;
	}
	if (tcpl_nan_key(c, id)) {
		c->v[id] = c->v[tcpl_nan_key_src(c, id)]; /* its lane words (lower_decode.c) */
		return;
	}
	if (c->alias_cast[id]) {
		c->v[id] = c->v[n->args[0]]; /* the fetch widens bf16 to the f32 lane word */
		if (c->v[id].kind != VK_VIEW)
			tcpl_err(c, id, "aliased cast of a value that is not a tensor view");
		return;
	}
	if (tcpl_quant_is_view(c, id)) {
		tcpl_lower_qview(c, id);
		return;
	}
	if (input_rows(c, id))
		return;
	if (n->op == MOE_OP_CONCAT && c->v[id].kind == VK_VIEW && c->p->t[c->v[id].t].kind == TCP_T_OUTPUT)
		return; /* its parts went out one by one (out_part) */
	switch ((moe_op)n->op) {
	case MOE_OP_RESHAPE:
	case MOE_OP_SLICE:
	case MOE_OP_BROADCAST: tcpl_lower_view_op(c, id); return;
	case MOE_OP_DEQUANT: tcpl_lower_dequant(c, id); return;
	case MOE_OP_REDUCE_SUM:
	case MOE_OP_REDUCE_MAX:
	case MOE_OP_REDUCE_MIN: tcpl_lower_reduce(c, id); return;
	case MOE_OP_CUMSUM: tcpl_lower_cumsum(c, id); return;
	case MOE_OP_SOFTMAX: tcpl_lower_softmax(c, id); return;
	case MOE_OP_EINSUM: tcpl_lower_einsum(c, id); return;
	case MOE_OP_ONE_HOT: tcpl_lower_one_hot(c, id); return;
	case MOE_OP_FILTER: tcpl_lower_filter(c, id); return;
	case MOE_OP_GATHER: tcpl_lower_gather(c, id); return;
	case MOE_OP_TAKE_ALONG: tcpl_lower_take_along(c, id); return;
	case MOE_OP_SCATTER: tcpl_lower_scatter(c, id); return;
	case MOE_OP_CONCAT: tcpl_lower_concat(c, id); return;
	case MOE_OP_TOPK:
	case MOE_OP_EXPERTS:
		tcpl_err(c, id, "op '%s' must be lowered by the tcp pipeline first", moe_op_name((moe_op)n->op));
		return;
	default:
		if (ir_ops[n->op].flags & OPF_ELEM) {
			tcpl_lower_elem(c, id);
			return;
		}
		tcpl_err(c, id, "op '%s' has no TCP lowering", moe_op_name((moe_op)n->op));
	}
}

/* Free DM tensors whose owner saw its last use at position q. */
static void release(lw *c, int64_t q)
{
	for (moe_id i = 0; i < c->g->nnodes; i++)
		if (c->last[i] == q && c->v[i].kind == VK_VIEW && !c->v[i].region && c->v[i].owner == i &&
			c->p->t[c->v[i].t].space == TCP_DM && !c->inreg[i])
			tcpl_dm_free(c, c->v[i].t);
}

void tcpl_init(lw *c, moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	uint32_t nn = g->nnodes;
	memset(c, 0, sizeof *c);
	c->ctx = ctx;
	c->g = g;
	c->m = m;
	c->p = tcp_prog_new(ctx);
	c->S = tcp_slices(m);
	c->next_reg = R_FREE;
	c->trf[0] = c->trf[1] = -1;
	c->pr_node = c->pr_pos = MOE_NONE; /* lower_pairs.c */
	c->dc.red = MOE_NONE;               /* lower_dcomb.c */
	c->pr_t = c->pr_rl = -1;
	c->pr_reg = c->pr_preg = -1;
	c->lr_reg = -1; /* list_rows.c */
	c->sr_idx = c->sr_grid = MOE_NONE; /* spec_rows.c */
	c->sr_buf = c->sr_m = c->sr_list = -1;
	c->v = ctx_alloc(ctx, sizeof *c->v * (nn + 1));
	c->inreg = ctx_alloc(ctx, nn + 1);
	c->dep = ctx_alloc(ctx, nn + 1);
	c->hbm_home = ctx_alloc(ctx, nn + 1);
	c->is_out = ctx_alloc(ctx, nn + 1);
	c->last = ctx_alloc(ctx, sizeof(int64_t) * (nn + 1));
	c->pos = ctx_alloc(ctx, sizeof(int64_t) * (nn + 1));
	c->alias_cast = ctx_alloc(ctx, nn + 1);
	c->wstream = ctx_alloc(ctx, nn + 1);
	c->fused_into = ctx_alloc(ctx, sizeof(moe_id) * (nn + 1));
	c->ggrid = ctx_alloc(ctx, sizeof(moe_id) * (nn + 1));
	c->gdefer = ctx_alloc(ctx, nn + 1);
	c->tier = ctx_alloc(ctx, nn + 1);
	c->after = ctx_alloc(ctx, nn + 1);
	c->cat_of = ctx_alloc(ctx, sizeof *c->cat_of * (nn + 1));
	c->order1 = ctx_alloc(ctx, sizeof *c->order1 * (nn + 1));
	c->leaf_t = ctx_alloc(ctx, sizeof *c->leaf_t * (nn + 1));
	for (moe_id i = 0; i < nn; i++)
		c->leaf_t[i] = -1, c->cat_of[i] = MOE_NONE;
	c->store_dt = ctx_alloc(ctx, nn + 1);
}

void tcpl_fini(lw *c)
{
	moe_ctx *ctx = c->ctx;
	uint32_t nn = c->g->nnodes;
	ctx_free(ctx, c->v, sizeof *c->v * (nn + 1));
	ctx_free(ctx, c->inreg, nn + 1);
	ctx_free(ctx, c->dep, nn + 1);
	ctx_free(ctx, c->hbm_home, nn + 1);
	ctx_free(ctx, c->is_out, nn + 1);
	ctx_free(ctx, c->last, sizeof(int64_t) * (nn + 1));
	ctx_free(ctx, c->pos, sizeof(int64_t) * (nn + 1));
	ctx_free(ctx, c->alias_cast, nn + 1);
	ctx_free(ctx, c->wstream, nn + 1);
	ctx_free(ctx, c->fused_into, sizeof(moe_id) * (nn + 1));
	ctx_free(ctx, c->ggrid, sizeof(moe_id) * (nn + 1));
	ctx_free(ctx, c->gdefer, nn + 1);
	ctx_free(ctx, c->tier, nn + 1);
	ctx_free(ctx, c->after, nn + 1);
	ctx_free(ctx, c->cat_of, sizeof *c->cat_of * (nn + 1));
	ctx_free(ctx, c->order1, sizeof *c->order1 * (nn + 1));
	ctx_free(ctx, c->leaf_t, sizeof *c->leaf_t * (nn + 1));
	ctx_free(ctx, c->store_dt, nn + 1);
	ctx_free(ctx, c->live, c->lcap * sizeof *c->live);
	tcpl_shared_fini(c);
}

static void last_use(lw *c, moe_id owner, int64_t q)
{
	if (q > c->last[owner])
		c->last[owner] = q;
}

/* after[i]: node i is emitted after the block loop: it depends on the loop,
 * or (sink) every reader of it comes after the loop and so does every
 * operand but leaves (sinking it extends no other value's life through the
 * loop). */
static bool sinkable(const lw *c, moe_id i, const bool *after)
{
	const ir_node *n = N(c->g, i);
	if (ir_ops[n->op].flags & OPF_LEAF)
		return false;
	for (uint32_t k = 0; k <= n->nargs; k++) {
		moe_id a = k < n->nargs ? n->args[k] : n->valid;
		if (a != MOE_NONE && !after[a] && !(ir_ops[N(c->g, a)->op].flags & OPF_LEAF))
			return false;
	}
	return true;
}

static void mark_after(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	for (moe_id i = 0; i < nn; i++)
		c->after[i] = !c->inreg[i] && (c->dep[i] || (c->sink && c->rows != MOE_NONE));
	if (c->rows != MOE_NONE)
		c->after[c->rows] = c->after[c->nblocks] = c->after[c->bexp] = false;
	for (bool changed = true; changed;) {
		changed = false;
		for (moe_id i = 0; i < nn; i++) /* operands first */
			if (c->after[i] && !c->dep[i] && !sinkable(c, i, c->after))
				c->after[i] = false, changed = true;
		for (moe_id i = nn; i-- > 0;) { /* a value read before the loop is computed before it */
			const ir_node *n = N(g, i);
			if (c->after[i])
				continue;
			for (uint32_t k = 0; k <= n->nargs; k++) {
				moe_id a = k < n->nargs ? n->args[k] : n->valid;
				if (a != MOE_NONE && c->after[a] && !c->dep[a])
					c->after[a] = false, changed = true;
			}
		}
	}
}

/* The nodes after the loop in emission order: by id, or (sink) depth first
 * from the outputs, so each row chunk of the tail runs to its end before the
 * next starts and its buffers are freed. */
static uint32_t visit_after(lw *c, moe_id root, bool *seen, moe_id *stack, uint32_t *next, uint32_t n1)
{
	const moe_graph *g = c->g;
	if (!c->after[root] || seen[root])
		return n1;
	uint32_t sp = 0;
	stack[sp++] = root;
	seen[root] = true;
	next[root] = 0;
	while (sp) {
		moe_id i = stack[sp - 1];
		const ir_node *n = N(g, i);
		if (next[i] > n->nargs) { /* every operand and the valid mask visited */
			c->order1[n1++] = i;
			sp--;
			continue;
		}
		uint32_t k = next[i]++;
		moe_id a = k < n->nargs ? n->args[k] : n->valid;
		if (a != MOE_NONE && c->after[a] && !seen[a]) {
			seen[a] = true;
			next[a] = 0;
			stack[sp++] = a;
		}
	}
	return n1;
}

static void order_after(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes, n1 = 0;
	bool *seen = ctx_alloc(c->ctx, nn + 1);
	moe_id *stack = ctx_alloc(c->ctx, sizeof *stack * (nn + 1));
	uint32_t *next = ctx_alloc(c->ctx, sizeof *next * (nn + 1)); /* operand to visit next */
	for (uint32_t o = 0; c->sink && o < g->nout; o++)
		n1 = visit_after(c, g->outputs[o], seen, stack, next, n1);
	for (moe_id i = 0; i < nn; i++) /* what the outputs do not reach, by id */
		if (c->after[i] && !seen[i])
			c->order1[n1++] = i;
	c->norder1 = n1;
	ctx_free(c->ctx, seen, nn + 1);
	ctx_free(c->ctx, stack, sizeof *stack * (nn + 1));
	ctx_free(c->ctx, next, sizeof *next * (nn + 1));
}

/* Emission tiers of the nodes before the loop (each tier in node order;
 * data dependencies only point to the same or an earlier tier):
 * 0: leaves (no code) and vector passes that read only constants and iotas
 *    (the decode grid's rows and token list, top-k's index compare), which
 *    the main context computes while the first DMAs (x, the router weights)
 *    are in flight; DMA ops are not hoisted (the DMA context runs in order);
 * 1: what the block loop reads (its experts, counts and valid rows, the
 *    dispatch's row list) and everything those depend on;
 *    DMA ops (gathers, scatters) stay in this tier too, in node order, so
 *    that they start as early as before;
 * 2: the other vector passes (the routing weights of the combine), which
 *    would otherwise hold the in-order main context before the loop's index
 *    generation (gpt-oss's softmax of the top-k logits waits for their
 *    take_along gather: 17 us at T = 4096). */
static void mark_tiers(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		bool h = !(ir_ops[n->op].flags & OPF_LEAF) && n->op != MOE_OP_GATHER && n->op != MOE_OP_SCATTER &&
			 n->op != MOE_OP_TAKE_ALONG && !c->inreg[i] && !c->after[i] && n->valid == MOE_NONE && !c->is_out[i];
		for (uint32_t k = 0; k < n->nargs && h; k++) {
			const ir_node *a = n->args[k] != MOE_NONE ? N(g, n->args[k]) : NULL;
			h = a && (a->op == MOE_OP_CONST || a->op == MOE_OP_IOTA ||
					 (c->tier[n->args[k]] == 0 && !(ir_ops[a->op].flags & OPF_LEAF)));
		}
		c->tier[i] = h || (ir_ops[n->op].flags & OPF_LEAF) ? 0 : 2;
	}
	if (c->rows == MOE_NONE)
		return;
	/* backwards: operands (and masks) of a loop node or of a tier-1 node */
	for (moe_id i = nn; i-- > 0;) {
		const ir_node *n = N(g, i);
		bool dma = n->op == MOE_OP_GATHER || n->op == MOE_OP_TAKE_ALONG || n->op == MOE_OP_SCATTER;
		bool need = c->inreg[i] || c->tier[i] == 1 || i == c->rows || i == c->nblocks || i == c->bexp || dma;
		if (!need)
			continue;
		if (c->tier[i] == 2 && !c->inreg[i] && !c->after[i])
			c->tier[i] = 1;
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE && c->tier[a] == 2 && !c->inreg[a] && !c->after[a])
				c->tier[a] = 1;
		}
	}
}

/* Emission order (independent of the region, the loop, then the rest) and
 * liveness: the last use of each owner (views pass uses to their source).
 * Returns the position of the loop, -1 without one. */
static int64_t plan_order(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	int64_t q = 0, loop_pos = -1;
	mark_after(c);
	order_after(c);
	tcpl_shared_plan(c);
	mark_tiers(c);
	tcpl_mark_pre_experts(c);
	for (int h = 0; h < 4; h++) /* tier 3 runs in the loop's prologue */
		for (moe_id i = 0; i < nn; i++)
			if (!c->inreg[i] && !c->after[i] && c->tier[i] == h)
				c->pos[i] = q++;
	if (c->rows != MOE_NONE)
		loop_pos = q++;
	for (moe_id i = 0; i < nn; i++)
		if (c->inreg[i])
			c->pos[i] = loop_pos;
	for (uint32_t k = 0; k < c->norder1; k++)
		c->pos[c->order1[k]] = q++;
	tcpl_shared_pos(c, loop_pos);
	moe_id *own = ctx_alloc(c->ctx, sizeof(moe_id) * (nn + 1));
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		own[i] = i;
		c->last[i] = c->pos[i];
		bool in_rows = c->sink && n->op == MOE_OP_SLICE && N(g, n->args[0])->op == MOE_OP_INPUT; /* input_rows */
		if ((n->op == MOE_OP_RESHAPE || n->op == MOE_OP_SLICE || n->op == MOE_OP_BROADCAST || c->alias_cast[i]) &&
			!c->inreg[i] && !in_rows)
			own[i] = own[n->args[0]];
		if (tcpl_nan_key(c, i))
			own[i] = own[tcpl_nan_key_src(c, i)];
	}
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		bool oc = out_cat(c, i); /* its parts are read when each is computed */
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE) {
				if (oc)
					c->cat_of[n->args[k]] = i;
				else
					last_use(c, own[n->args[k]], c->pos[i]);
			}
		if (n->valid != MOE_NONE)
			last_use(c, own[n->valid], c->pos[i]);
		if (c->fused_into[i] != MOE_NONE) /* read when the reduce runs */
			for (uint32_t k = 0; k < n->nargs; k++)
				last_use(c, own[n->args[k]], c->pos[c->fused_into[i]]);
		if (c->is_out[i])
			c->last[own[i]] = INT64_MAX;
	}
	/* the loop reads nblocks, rows and bexp */
	if (c->rows != MOE_NONE) {
		last_use(c, own[c->rows], loop_pos);
		last_use(c, own[c->nblocks], loop_pos);
		last_use(c, own[c->bexp], loop_pos);
	}
	/* dispatch by gather: the scatter reads the token list of the gather it replaces */
	for (moe_id i = 0; i < nn; i++)
		if (c->ggrid[i] == i + 1) {
			const ir_node *ga = N(g, N(g, i)->args[2]);
			last_use(c, own[ga->args[1]], c->pos[i]);
			/* and every block gathers its rows from the gather's source */
			last_use(c, own[ga->args[0]], loop_pos);
		}
	for (moe_id i = 0; i < nn; i++)
		if (own[i] != i) /* views never free; (sink) a view's own DM copy frees with its source */
			c->last[i] = c->sink && !c->inreg[i] ? c->last[own[i]] : -2;
	tcpl_shared_liveness(c);
	ctx_free(c->ctx, own, sizeof(moe_id) * (nn + 1));
	return loop_pos;
}

/* (sink) Before the block loop: an input copied whole into DM for routing
 * is read from HBM again from here on (the block gathers, the tail's row
 * chunks), so its DM copy does not stay through the loop. */
static void inputs_to_hbm(lw *c)
{
	for (moe_id i = 0; i < c->g->nnodes; i++) {
		val *v = &c->v[i];
		/* an input's DM copy, or one made for an aliased cast of it (the
		 * widened router's x, lower_contract.c): the cast is that copy's owner */
		const ir_node *n = N(c->g, i);
		int32_t lt = c->leaf_t[i] >= 0 ? c->leaf_t[i] :
			     c->alias_cast[i] && n->nargs == 1 && !c->inreg[i] ? c->leaf_t[n->args[0]] : -1;
		if (lt < 0 || v->kind != VK_VIEW || c->p->t[v->t].space != TCP_DM)
			continue;
		bool shared = false; /* a view made of the copy keeps it */
		for (moe_id k = 0; k < c->g->nnodes && !shared; k++)
			shared = k != i && c->v[k].kind == VK_VIEW && c->v[k].t == v->t;
		if (shared)
			continue;
		tcpl_dm_free(c, v->t);
		*v = tview(lt, i, n);
	}
}

/* Every node in emission order: those independent of the region (by tier),
 * the loop, the rest. */
static void lower_all(lw *c, int64_t loop_pos)
{
	uint32_t nn = c->g->nnodes;
	tcpl_spec_rows_plan(c);
	for (int h = 0; h < 3; h++)
		for (moe_id i = 0; i < nn && !c->failed; i++) {
			if (c->inreg[i] || c->after[i] || c->tier[i] != h)
				continue;
			uint32_t at = c->p->ncode;
			lower_one(c, i);
			tcpl_router_rows(c, i, at); /* the router behind x's copy, chunk by chunk (router_rows.c) */
			tcpl_spec_rows_emit(c, i);  /* block 0's rows, after top-k (spec_rows.c) */
			tcpl_quant_stage_after(c, at); /* block scales: DMA idles while routing computes */
			release(c, c->pos[i]);
		}
	if (c->sink || c->pr_node != MOE_NONE) /* lower_pairs.c: the DM the copy held goes to the pair rows */
		inputs_to_hbm(c);
	if (c->rows != MOE_NONE && !c->failed) {
		tcpl_quant_stage_after(c, UINT32_MAX);
		tcpl_lower_region(c);
		release(c, loop_pos);
		tcpl_shared_after(c); /* lower_shared.c */
		tcpl_lower_pre_experts(c, true); /* when the loop's prologue had no DM for them */
	}
	for (uint32_t k = 0; k < c->norder1 && !c->failed; k++) {
		lower_one(c, c->order1[k]);
		release(c, c->pos[c->order1[k]]);
	}
}

/* Tier 3 (lower_preexp.c), from the block loop's prologue. */
void tcpl_lower_pre_experts(lw *c, bool late)
{
	if (c->pre_done || (!late && !tcpl_pre_experts_fit(c)))
		return;
	c->pre_done = true;
	for (moe_id i = 0; i < c->g->nnodes && !c->failed; i++)
		if (!c->inreg[i] && !c->after[i] && c->tier[i] == 3) {
			lower_one(c, i);
			release(c, c->pos[i]);
		}
}

/* The graph outputs, copied to HBM tensors output0, output1, ... */
static void emit_outputs(lw *c)
{
	const moe_graph *g = c->g;
	for (uint32_t i = 0; i < g->nout && !c->failed; i++) {
		moe_id o = g->outputs[i];
		const ir_node *n = N(g, o);
		val *v = tcpl_need_view(c, o);
		if (v->kind == VK_VIEW && c->p->t[v->t].kind == TCP_T_OUTPUT) { /* written by its parts */
			c->p->act_bytes += ir_bytes(n);
			continue;
		}
		int32_t t = out_tensor(c, o, i);
		if (v->kind == VK_VIEW && !is_contig(v, n))
			v = tcpl_copy_contig(c, o);
		if (v->kind != VK_VIEW || !is_contig(v, n)) {
			tcpl_err(c, o, "output is not a contiguous tensor");
			break;
		}
		uint32_t at = c->p->ncode;
		if (!tcpl_copy_out_rows(c, o, t, v))
			dma_copy(c, t, 0, -1, 0, v->t, v->base, -1, 0, ir_numel(n));
		if (c->p->ncode == at + 1)
			tcpl_join_output(c, at);
		c->p->act_bytes += ir_bytes(n);
	}
}

/* Roofline dims from the block contractions: down [D, F], else up [F, D]
 * (gate and up paired are [2F, D]: pair_gate_up.c). The bytes every run
 * reads whatever the routing (act_bytes) count the weights outside the
 * block loop too (router, shared experts, biases: read whole each run). */
static void roofline_dims(lw *c)
{
	const moe_graph *g = c->g;
	tcp_program *p = c->p;
	for (moe_id w = 0; w < g->nnodes; w++) {
		if (N(g, w)->op != MOE_OP_WEIGHT)
			continue;
		bool expert = false;
		for (moe_id i = w + 1; i < g->nnodes && !expert; i++)
			for (uint32_t k = 0; k < N(g, i)->nargs && !expert; k++)
				expert = N(g, i)->args[k] == w && c->inreg[i];
		p->act_bytes += expert ? 0 : ir_bytes(N(g, w));
	}
	p->moe_D = ir_graph_attr_int(g, IR_GK_MOE_ROW_BYTES, 0) / (int64_t)moe_dtype_size(g->dtype);
	int64_t wb = 0, up = 0, down = 0;
	bool paired = false;
	for (moe_id i = 0; i < g->nnodes; i++) {
		paired |= c->inreg[i] && N(g, i)->op == MOE_OP_EINSUM && tcpl_region_projections(c, i) > 1;
		bool wview = c->inreg[i] && N(g, i)->op == MOE_OP_RESHAPE && N(g, N(g, i)->args[0])->op == MOE_OP_SLICE &&
			     N(g, N(g, N(g, i)->args[0])->args[0])->op == MOE_OP_GATHER; /* pair_down.c */
		if ((c->inreg[i] && N(g, i)->op == MOE_OP_GATHER && N(g, i)->valid == c->nblocks) || wview) {
			ir_node b = block_node(N(g, i));
			wb += wview ? 0 : ir_bytes(&b);
			if (b.rank == 2 && b.shape[1] == p->moe_D && !up)
				up = b.shape[0];
			if (b.rank == 2 && b.shape[0] == p->moe_D && !down)
				down = b.shape[1];
		}
	}
	if (!p->moe_F)
		p->moe_F = paired && down ? down : up;
	p->weight_bytes_per_expert = wb;
}

/* The tensors bound in HBM (weights first) must fit the chip: a clear error, not a bad program. */
static bool hbm_fits(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const tcp_program *p, int64_t top)
{
	if ((double)top <= m->hbm_bytes)
		return true;
	double w = 0;
	for (uint32_t i = 0; i < p->nt; i++)
		if (p->t[i].space == TCP_HBM && (p->t[i].kind == TCP_T_WEIGHT || p->t[i].kind == TCP_T_PACKED))
			w += (double)p->t[i].numel * (double)esz(p->t[i].dtype);
	moe_diag(ctx, MOE_DIAG_ERROR, g->loc,
		"tcp: the layer needs %.2f GiB of HBM (weights %.2f GiB, inputs, outputs and scratch %.2f GiB) but the "
		"machine has %.2f GiB; use bf16 (--set dtype=bf16) or fp8 weights, or split the experts over chips (--ep)",
		(double)top / 1073741824.0, w / 1073741824.0, ((double)top - w) / 1073741824.0, m->hbm_bytes / 1073741824.0);
	return false;
}

/* One lowering; with `pairs`, the block results in pair order (lower_pairs.c)
 * where planned, with `shdm` a shared expert's piece results in DM
 * (lower_shared.c), quietly: a failure then (DM capacity) sets *again for a
 * lowering without them. */
static tcp_program *lower_try(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, char *prep, size_t prep_len,
	bool sink, bool pairs, bool shdm, bool *again)
{
	lw c;
	tcpl_init(&c, ctx, g, m);
	c.sink = sink;
	c.sh_dm = shdm;
	tcp_program *p = c.p;
	p->prep = prep; /* owned by the program from here on, but when tried again */
	p->prep_len = prep_len;
	p->dtype = (uint8_t)g->dtype;
	p->moe_T = ir_graph_attr_int(g, IR_GK_MOE_TOKENS, 0);
	p->moe_K = ir_graph_attr_int(g, IR_GK_MOE_K, 0);
	p->moe_E = ir_graph_attr_int(g, IR_GK_MOE_EXPERTS, 0);
	p->moe_B = ir_graph_attr_int(g, IR_GK_MOE_BLOCK, 0);
	p->moe_G = ir_graph_attr_int(g, IR_GK_GRID_BLOCKS, 0);
	for (uint32_t i = 0; i < g->nout; i++)
		c.is_out[g->outputs[i]] = true;
	tcpl_find_region(&c);
	tcpl_fusion_rule(&c);
	tcpl_w8a8_plan(&c);
	if (pairs)
		tcpl_pairs_plan(&c);
	c.quiet = c.pr_node != MOE_NONE || shdm;
	lower_all(&c, plan_order(&c));
	emit_outputs(&c);
	tcp_insn h = tcp_b_halt();
	tcp_emit(p, &h);
	if (c.rows != MOE_NONE)
		roofline_dims(&c);
	bool failed = c.failed, quiet = c.quiet;
	int64_t top = c.hbm_top;
	tcpl_fini(&c);
	if (failed && quiet) {
		*again = true;
		p->prep = NULL;
		p->prep_len = 0;
		tcp_prog_free(p);
		return NULL;
	}
	if (!failed && !tcpl_legalize(ctx, p, m, &top))
		failed = true;
	if (!failed && tcpl_check_dm(ctx, p, g->loc))
		failed = true;
	if (failed || !hbm_fits(ctx, g, m, p, top)) {
		tcp_prog_free(p);
		return NULL;
	}
	if (tcp_validate(ctx, p, m, "<lowered program>") != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_NOTE, g->loc, "tcp: the lowering produced an invalid program (a moec bug)");
		tcp_prog_free(p);
		return NULL;
	}
	return p;
}

tcp_program *tcp_lower(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, char *prep, size_t prep_len,
	bool sink)
{
	if (!tcp_weights_fit_hbm(ctx, g, m)) {
		if (prep)
			ctx_free(ctx, prep, prep_len + 1);
		return NULL;
	}
	/* with pair-order results and the shared expert's results in DM, then
	 * without the latter, then without the former, then without both */
	tcp_program *p = NULL;
	for (int k = 0; k < 4; k++) {
		bool again = false;
		p = lower_try(ctx, g, m, prep, prep_len, sink, k < 2, !(k & 1), &again);
		if (!again)
			break;
	}
	return p;
}

/* The graph passes (gpass.c) have made every rewrite and recorded every
 * decision; here the weights are split at the tcp_pack marks (prep.c) and
 * the device graph lowered. */
static moe_tcp_program *tcp_compile(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine)
{
	moe_tcp_machine *def = NULL;
	if (!machine) {
		def = moe_tcp_machine_default(ctx);
		if (!def)
			return NULL;
		machine = def;
	}
	moe_status st;
	moe_graph *w = tcp_graph_passes(ctx, g, machine, &st);
	if (w)
		g = w;
	char *prep = NULL;
	size_t plen = 0;
	int errs = moe_error_count(ctx);
	moe_graph *dev = st == MOE_OK ? tcp_split_weights(ctx, g, &prep, &plen, NULL) : NULL;
	tcp_program *p = NULL;
	if (st == MOE_OK && moe_error_count(ctx) == errs)
		p = tcp_lower(ctx, dev ? dev : g, machine, dev ? prep : NULL, dev ? plen : 0, tcp_graph_row_chunked(g));
	if (p) /* the phases, from the loops the lowering emitted */
		tcp_phase_infer(p);
	if (dev)
		ir_graph_free(dev);
	if (w)
		ir_graph_free(w);
	moe_tcp_machine_free(ctx, def);
	return p;
}

moe_tcp_program *moe_tcp_compile_legacy(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine)
{
	CTX_GUARDED(ctx, moe_tcp_program *, NULL, tcp_compile(ctx, g, machine));
}
