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

#include "backend-tcp/lower_int.h"

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
		c->p->act_bytes += w ? 0 : ir_bytes(n);
		break;
	}
	}
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
	if (c->fused_into[id] != MOE_NONE || c->gdefer[id])
		return; /* computed inside the reduce it feeds; or gathered per block */
	if (c->ggrid[id] && n->op == MOE_OP_RESHAPE) {
		c->v[id] = c->v[n->args[0]]; /* the grid's row list; the block loop gathers */
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

/* Layers refused before any work: weights beyond HBM (the same clear error
 * as after lowering, before any DM limit is met). */
static bool lowerable(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	uint32_t nn = g->nnodes;
	double wsum = 0;
	moe_id big = MOE_NONE; /* the largest weight names the place */
	for (moe_id i = 0; i < nn; i++)
		if (N(g, i)->op == MOE_OP_WEIGHT) {
			wsum += (double)ir_bytes(N(g, i));
			if (big == MOE_NONE || ir_bytes(N(g, i)) > ir_bytes(N(g, big)))
				big = i;
		}
	if (wsum > m->hbm_bytes) {
		moe_diag(ctx, MOE_DIAG_ERROR, big != MOE_NONE ? N(g, big)->loc : g->loc,
			"tcp: the layer needs at least %.2f GB of HBM for its weights but the machine has %.2f GB; use bf16 "
			"(--set dtype=bf16) or fp8 weights, or split the experts over chips (--ep)", wsum / 1e9, m->hbm_bytes / 1e9);
		return false;
	}
	return true;
}

static void lw_init(lw *c, moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
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
	c->store_dt = ctx_alloc(ctx, nn + 1);
}

static void lw_fini(lw *c)
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
	ctx_free(ctx, c->store_dt, nn + 1);
	ctx_free(ctx, c->live, c->lcap * sizeof *c->live);
}

static void last_use(lw *c, moe_id owner, int64_t q)
{
	if (q > c->last[owner])
		c->last[owner] = q;
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
			 n->op != MOE_OP_TAKE_ALONG && !c->inreg[i] && !c->dep[i] && n->valid == MOE_NONE && !c->is_out[i];
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
		if (c->tier[i] == 2 && !c->inreg[i] && !c->dep[i])
			c->tier[i] = 1;
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE && c->tier[a] == 2 && !c->inreg[a] && !c->dep[a])
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
	mark_tiers(c);
	for (int h = 0; h < 3; h++)
		for (moe_id i = 0; i < nn; i++)
			if (!c->inreg[i] && !c->dep[i] && c->tier[i] == h)
				c->pos[i] = q++;
	if (c->rows != MOE_NONE)
		loop_pos = q++;
	for (moe_id i = 0; i < nn; i++) {
		if (c->inreg[i])
			c->pos[i] = loop_pos;
		else if (c->dep[i])
			c->pos[i] = q++;
	}
	moe_id *own = ctx_alloc(c->ctx, sizeof(moe_id) * (nn + 1));
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		own[i] = i;
		c->last[i] = c->pos[i];
		if ((n->op == MOE_OP_RESHAPE || n->op == MOE_OP_SLICE || n->op == MOE_OP_BROADCAST || c->alias_cast[i]) &&
			!c->inreg[i])
			own[i] = own[n->args[0]];
	}
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE)
				last_use(c, own[n->args[k]], c->pos[i]);
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
		if (c->ggrid[i] == i + 1)
			last_use(c, own[N(g, N(g, i)->args[2])->args[1]], c->pos[i]);
	for (moe_id i = 0; i < nn; i++)
		if (own[i] != i)
			c->last[i] = -2; /* views never free */
	ctx_free(c->ctx, own, sizeof(moe_id) * (nn + 1));
	return loop_pos;
}

/* Every node in emission order: those independent of the region, the loop, the rest. */
static void lower_all(lw *c, int64_t loop_pos)
{
	uint32_t nn = c->g->nnodes;
	for (int pass = 0; pass < 2 && !c->failed; pass++) {
		for (int h = pass == 0 ? 0 : 2; h < 3; h++)
			for (moe_id i = 0; i < nn && !c->failed; i++) {
				if (c->inreg[i] || (pass == 0) == c->dep[i] || (pass == 0 && c->tier[i] != h))
					continue;
				uint32_t at = c->p->ncode;
				tcpl_lower_node(c, i);
				if (pass == 0)
					tcpl_quant_stage_after(c, at); /* block scales: DMA idles while routing computes */
				release(c, c->pos[i]);
			}
		if (pass == 0 && c->rows != MOE_NONE && !c->failed) {
			tcpl_quant_stage_after(c, UINT32_MAX);
			tcpl_lower_region(c);
			release(c, loop_pos);
		}
	}
}

/* The graph outputs, copied to HBM tensors output0, output1, ... */
static void emit_outputs(lw *c)
{
	const moe_graph *g = c->g;
	for (uint32_t i = 0; i < g->nout && !c->failed; i++) {
		moe_id o = g->outputs[i];
		const ir_node *n = N(g, o);
		char name[64];
		snprintf(name, sizeof name, "output%u", i);
		int32_t t = tcpl_hbm_tensor(c, n->name ? n->name : name, TCP_T_OUTPUT, (moe_dtype)n->dtype, n->rank, n->shape);
		c->p->t[t].name[0] = 0;
		ctx_free(c->ctx, c->p->t[t].name, 1);
		c->p->t[t].name = ctx_alloc(c->ctx, strlen(name) + 1);
		memcpy(c->p->t[t].name, name, strlen(name));
		val *v = tcpl_need_view(c, o);
		if (v->kind == VK_VIEW && !is_contig(v, n))
			v = tcpl_copy_contig(c, o);
		if (v->kind != VK_VIEW || !is_contig(v, n)) {
			tcpl_err(c, o, "output is not a contiguous tensor");
			break;
		}
		dma_copy(c, t, 0, -1, 0, v->t, v->base, -1, 0, ir_numel(n));
		c->p->act_bytes += ir_bytes(n);
	}
}

/* Roofline dims from the block contractions: up [F, D]. */
static void roofline_dims(lw *c)
{
	const moe_graph *g = c->g;
	tcp_program *p = c->p;
	p->moe_D = ir_graph_attr_int(g, IR_GK_MOE_ROW_BYTES, 0) / (int64_t)moe_dtype_size(g->dtype);
	int64_t wb = 0;
	for (moe_id i = 0; i < g->nnodes; i++)
		if (c->inreg[i] && N(g, i)->op == MOE_OP_GATHER && N(g, i)->valid == c->nblocks) {
			ir_node b = block_node(N(g, i));
			wb += ir_bytes(&b);
			if (b.rank == 2 && b.shape[1] == p->moe_D && !p->moe_F)
				p->moe_F = b.shape[0];
		}
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
		"tcp: the layer needs %.2f GB of HBM (weights %.2f GB, inputs, outputs and scratch %.2f GB) but the "
		"machine has %.2f GB; use bf16 (--set dtype=bf16) or fp8 weights, or split the experts over chips (--ep)",
		(double)top / 1e9, w / 1e9, ((double)top - w) / 1e9, m->hbm_bytes / 1e9);
	return false;
}

tcp_program *tcp_lower(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, char *prep, size_t prep_len)
{
	if (!lowerable(ctx, g, m)) {
		if (prep)
			ctx_free(ctx, prep, prep_len + 1);
		return NULL;
	}
	lw c;
	lw_init(&c, ctx, g, m);
	tcp_program *p = c.p;
	p->prep = prep; /* owned by the program from here on */
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
	tcpl_plan_fusions(&c);
	lower_all(&c, plan_order(&c));
	emit_outputs(&c);
	tcp_insn h = tcp_insn_init(TCP_OP_HALT);
	tcp_emit(p, &h);
	if (c.rows != MOE_NONE)
		roofline_dims(&c);
	bool failed = c.failed;
	int64_t top = c.hbm_top;
	lw_fini(&c);
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

static moe_tcp_program *tcp_compile(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine)
{
	moe_tcp_machine *def = NULL;
	if (!machine) {
		def = moe_tcp_machine_default(ctx);
		if (!def)
			return NULL;
		machine = def;
	}
	/* weights packed at load time (prep.c): the device program sees them as leaves */
	char *prep = NULL;
	size_t plen = 0;
	int errs = moe_error_count(ctx);
	moe_graph *gu = tcp_pack_gate_up(ctx, g);
	if (gu)
		g = gu;
	moe_graph *dev = tcp_split_weights(ctx, g, &prep, &plen);
	tcp_program *p = NULL;
	if (moe_error_count(ctx) == errs) {
		if (dev)
			p = tcp_lower(ctx, dev, machine, prep, plen);
		else
			p = tcp_lower(ctx, g, machine, NULL, 0);
	}
	if (dev)
		ir_graph_free(dev);
	if (gu)
		ir_graph_free(gu);
	moe_tcp_machine_free(ctx, def);
	return p;
}


moe_tcp_program *moe_tcp_compile(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine)
{
	CTX_GUARDED(ctx, moe_tcp_program *, NULL, tcp_compile(ctx, g, machine));
}
