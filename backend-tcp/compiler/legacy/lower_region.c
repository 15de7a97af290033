/* backend-tcp/lower_region.c: TCP lowering of the block region: finding it (nodes
 * masked by the per-block valid rows), and emitting it once as a guarded loop
 * over the blocks with double-buffered prefetch of weights and rows. */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

/* ---- block region ---- */
/* A weight, or a reshape of one (DBRX's [E*F, D] tensors viewed as [E, F, D]): a contiguous
 * view of the weight's HBM tensor, which per-block gathers read like the weight itself. */
static bool weight_view(const moe_graph *g, moe_id id)
{
	while (N(g, id)->op == MOE_OP_RESHAPE)
		id = N(g, id)->args[0];
	return N(g, id)->op == MOE_OP_WEIGHT;
}

/* A unit-step slice along the last axis of a block einsum that only such
 * slices read (the paired gate and up outputs, pair_gate_up.c): inside the
 * loop a view of its source. */
static bool region_slice(const moe_graph *g, const ir_node *n)
{
	const ir_node *sn = n->nargs == 1 ? N(g, n->args[0]) : NULL;
	bool wg = sn && sn->op == MOE_OP_GATHER && sn->valid != MOE_NONE && sn->valid == ir_graph_node_attr(g, IR_GK_NBLOCKS);
	if (n->op != MOE_OP_SLICE || n->nargs != 1 || n->rank < 2 || ir_attr_int(n, "step", 1) != 1 ||
		ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank) != n->rank - 1 || (sn->op != MOE_OP_EINSUM && !wg))
		return false; /* wg: the expert's weights packed together (pair_down.c) */
	moe_id e = n->args[0];
	for (moe_id u = e + 1; u < g->nnodes; u++) {
		const ir_node *un = N(g, u);
		for (uint32_t k = 0; k < un->nargs; k++)
			if (un->args[k] == e && (un->op != MOE_OP_SLICE || un->rank != n->rank ||
							ir_norm_axis((int)ir_attr_int(un, "axis", 0), un->rank) != n->rank - 1))
				return false;
	}
	for (uint32_t o = 0; o < g->nout; o++)
		if (g->outputs[o] == e)
			return false;
	return true;
}

/* The projections a block einsum computes: the slices that read it (its
 * gate and up paired, pair_gate_up.c), else one. */
int tcpl_region_projections(const lw *c, moe_id e)
{
	int k = 0;
	for (moe_id u = e + 1; u < c->g->nnodes; u++)
		k += c->inreg[u] && region_slice(c->g, N(c->g, u)) && N(c->g, u)->args[0] == e;
	return k > 1 ? k : 1;
}

/* The block region as blockwise-dispatch marked it (IR_GK_BLOCK_ROWS,
 * IR_GK_NBLOCKS, IR_GK_BLOCK_EXPERT): the nodes masked by the per-block
 * valid rows, the weight gathers by the block experts masked by nblocks, and
 * reshapes of region values that keep the leading G. */
void tcpl_find_region(lw *c)
{
	const moe_graph *g = c->g;
	c->rows = ir_graph_node_attr(g, IR_GK_BLOCK_ROWS);
	c->nblocks = ir_graph_node_attr(g, IR_GK_NBLOCKS);
	c->bexp = ir_graph_node_attr(g, IR_GK_BLOCK_EXPERT);
	if (c->rows == MOE_NONE || c->nblocks == MOE_NONE || c->bexp == MOE_NONE || N(g, c->rows)->rank != 1 ||
		N(g, c->nblocks)->rank != 0 || N(g, c->bexp)->rank != 1 || N(g, c->bexp)->shape[0] != N(g, c->rows)->shape[0]) {
		c->rows = c->nblocks = c->bexp = MOE_NONE;
		for (moe_id i = 0; i < g->nnodes && !c->failed; i++)
			if (N(g, i)->valid != MOE_NONE && N(g, N(g, i)->valid)->rank == 1)
				tcpl_err(c, i, "this node is masked per block row, but the graph does not name its block grid "
					"(graph attributes " IR_GK_BLOCK_ROWS ", " IR_GK_NBLOCKS " and " IR_GK_BLOCK_EXPERT
					", node ids set by blockwise-dispatch): the TCP backend lowers only the block loop "
					"blockwise-dispatch writes");
		return;
	}
	for (moe_id i = 0; i < g->nnodes && !c->failed; i++)
		if (N(g, i)->valid != MOE_NONE && N(g, i)->valid != c->rows && N(g, N(g, i)->valid)->rank == 1)
			tcpl_err(c, i, "this node is masked per block row by a block loop other than the one blockwise-dispatch "
				"wrote: the TCP backend lowers only that loop");
	if (c->failed)
		return;
	c->G = N(g, c->rows)->shape[0];
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		bool r = (n->valid == c->rows) ||
			(n->valid == c->nblocks && n->op == MOE_OP_GATHER && n->args[1] == c->bexp &&
				weight_view(g, n->args[0])) || tcpl_quant_in_region(c, i);
		if (!r && (n->op == MOE_OP_RESHAPE || region_slice(g, n)) && c->inreg[n->args[0]] && n->rank >= 1 &&
			n->shape[0] == c->G && N(g, n->args[0])->shape[0] == c->G)
			r = true;
		c->inreg[i] = r;
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE && (c->inreg[n->args[k]] || c->dep[n->args[k]]))
				c->dep[i] = true;
		if (r)
			c->dep[i] = false;
	}
	/* region results read outside live in HBM; so do grids read inside */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k < n->nargs; k++) {
			moe_id a = n->args[k];
			if (a == MOE_NONE)
				continue;
			if (c->inreg[i] && !c->inreg[a] && N(g, a)->rank >= 1 && N(g, a)->shape[0] == c->G &&
				!weight_view(g, a) && a != c->bexp) { /* the block experts reach the loop through SPM */
				moe_id s = a;
				while (N(g, s)->op == MOE_OP_RESHAPE)
					s = N(g, s)->args[0];
				c->hbm_home[s] = true;
			}
			if (!c->inreg[i] && c->inreg[a]) {
				c->hbm_home[a] = true;
				/* a reshape that keeps G (B = 1: [G, 1, D] -> [G, D]) is a view of its source's home */
				for (moe_id s = a; N(g, s)->op == MOE_OP_RESHAPE && c->inreg[N(g, s)->args[0]];)
					c->hbm_home[s = N(g, s)->args[0]] = true;
			}
		}
		if (c->inreg[i] && c->is_out[i])
			c->hbm_home[i] = true;
	}
}

/* Dispatch by gather: block blk's rows of x, by the grid's row list, into
 * slot `slot` of buf (n elements per block). */
static void block_gather(lw *c, int32_t buf, int slot, int64_t n, moe_id s, int blk, int32_t trw, int64_t rwbase,
	int64_t rws)
{
	const ir_node *sn = N(c->g, s), *xp = N(c->g, sn->args[2]), *x = N(c->g, xp->args[0]);
	val *xv = tcpl_need_view(c, xp->args[0]);
	int64_t D = sn->shape[1], rows = n / D, T = x->shape[0];
	int64_t is = c->v[s].stride[0] > 1 ? c->v[s].stride[0] : 1; /* 8-byte index rows (lower_route.c) */
	const int64_t gdim[3] = {1, rows, D}, dst[3] = {n, D, 1}, src[3] = {T * D, D, 1}, ist[2] = {rows * is, is};
	tcp_view d = tcp_b_view(buf, 0, 3, dst), ix = tcp_b_view(c->v[s].t, c->v[s].base, 2, ist);
	d.reg = slot;
	d.scale = n;
	ix.reg = blk;
	ix.scale = rows * is;
	tcp_insn in = tcp_b_dma_gather(3, gdim, d, tcp_b_view(xv->t, xv->base, 3, src), ix, T);
	if (trw >= 0) { /* the block's real rows: the others are not moved (written as zero) */
		ld(c, R_ROWT, trw, blk, rwbase, rws);
		in.vreg = R_ROWT;
	}
	if (in.vreg >= 0 && c->lr_reg < 0 && c->next_reg < TCP_NREG)
		c->lr_reg = tcpl_new_reg(c, s); /* none left: the list of B rows */
	tcpl_emit_list_rows(c, &in, c->lr_reg); /* the list of the count's row class (list_rows.c) */
}

/* A per-block input of the loop: weights double-buffered per expert, grid
 * rows double-buffered per block. */
typedef struct rinp {
	moe_id src;    /* node outside (weight leaf, or grid) */
	moe_id user;   /* region node standing for it (gather), or MOE_NONE for a grid */
	int32_t buf;
	int64_t n;     /* elements per block */
	bool weight;
	moe_id gather; /* dispatch by gather: the grid scatter, else MOE_NONE */
	bool staged;   /* ... its rows staged into buf once, in block order (lower_stage.c) */
	bool inplace;  /* a decode's x row, read in place (lower_decode.c): no buffer, no DMA */
	bool homed;    /* a grid's value outside the loop, kept in home while the body reads src as its block */
	val home;
} rinp;

enum { RGN_MAXIN = 32, RGN_MAXDM = 64 };

/* The block loop being emitted. */
typedef struct rgn {
	int32_t tnb, tbe, trw; /* tensors of nblocks, the block experts, the block rows (-1: a constant, in the base) */
	int64_t nbbase, bebase, rwbase, bes, rws;
	rinp ins[RGN_MAXIN];
	int nin;
	moe_id first;             /* the first region node (diagnostics) */
	int32_t dmhome[RGN_MAXDM]; /* block results kept in a DM grid */
	int ndh;
	int32_t t_first; /* tensors from here on belong to the loop */
	bool single;     /* whole experts held in a single buffer */
	tcpl_bstore st[RGN_MAXDM]; /* block results copied to HBM grids (block_store.c) */
	moe_id stid[RGN_MAXDM];
	int nst;
	moe_id pair; /* a block result scattered in pair order (lower_pairs.c), deferred like the copies */
	int st_reg;      /* staged rows: the first row of block g, -1: none staged */
	int32_t st_tmp[2];
} rgn;

/* Block results read after the loop go to a grid of all G blocks: in DM
 * when it is small (at most 1/16 of DM: a decode), where each block's
 * math writes its slot directly and the combine reads it there, else in
 * HBM through one copy per block. */
static void region_dm_grids(lw *c, rgn *r)
{
	const moe_graph *g = c->g;
	for (moe_id i = 0; i < g->nnodes && r->ndh < RGN_MAXDM; i++) {
		const ir_node *n = N(g, i);
		if (!c->inreg[i] || !c->hbm_home[i] || n->op == MOE_OP_RESHAPE || c->is_out[i] ||
			ir_bytes(n) * 16 > c->m->dm_bytes_per_slice * c->S)
			continue;
		ir_node b = block_node(n);
		int32_t t = tcpl_dm_tensor(c, i, n->name ? n->name : "block-out", (moe_dtype)n->dtype, n->rank, n->shape);
		val v = tview(t, i, &b);
		v.region = true;
		v.reg = R_G;
		v.scale = ir_numel(&b);
		c->v[i] = v;
		r->dmhome[r->ndh++] = (int32_t)i;
	}
}

/* Whole experts' weights, double-buffered, take this much DM per slice.
 * When that exceeds half of DM, every weight gather read only as the
 * stationary operand of block contractions is streamed instead: its
 * TRF tiles are fetched from HBM one at a time (docs/tcp-isa.md 7.4).
 * But when one expert's weights fit in half of DM and the experts get
 * two blocks or more on average (T K >= 2 E B), they are held whole in a
 * single buffer: each expert is read once for all its blocks, and the
 * next expert's fetch waits for the last block of the current one.
 * Returns whether they are held in a single buffer. */
static bool region_plan_weights(lw *c)
{
	const moe_graph *g = c->g;
	const tcp_program *p = c->p;
	int64_t whole = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (!c->inreg[i] || n->op != MOE_OP_GATHER || n->valid != c->nblocks)
			continue;
		ir_node b = block_node(n);
		whole += rup((2 * ir_numel(&b) * esz(n->dtype) + c->S - 1) / c->S, c->m->flit_bytes);
	}
	/* quantized weights: their dequantized copies (one per block) sit beside
	 * them; with those, the double buffers must leave a quarter of DM */
	int64_t deq = 0;
	for (moe_id i = 0; i < g->nnodes; i++)
		if (c->inreg[i] && N(g, i)->op == MOE_OP_DEQUANT) {
			ir_node b = block_node(N(g, i));
			deq += rup((ir_bytes(&b) + c->S - 1) / c->S, c->m->flit_bytes);
		}
	bool tight = deq && whole + deq > c->m->dm_bytes_per_slice / 4 * 3; /* then one block per expert will do */
	bool single = (whole > c->m->dm_bytes_per_slice / 2 || tight) && whole <= c->m->dm_bytes_per_slice &&
		      p->moe_T * p->moe_K >= (tight ? 1 : 2) * p->moe_E * p->moe_B && p->moe_E > 0 && p->moe_B > 0;
	if (whole > c->m->dm_bytes_per_slice / 2 && !single)
		for (moe_id i = 0; i < g->nnodes; i++) {
			const ir_node *n = N(g, i);
			if (!c->inreg[i] || n->op != MOE_OP_GATHER || n->valid != c->nblocks)
				continue;
			bool ok = true, used = false;
			for (moe_id u = i + 1; u < g->nnodes; u++) {
				const ir_node *un = N(g, u);
				for (uint32_t k = 0; k < un->nargs; k++)
					if (un->args[k] == i) {
						used = true;
						ok &= c->inreg[u] && un->op == MOE_OP_EINSUM && un->nargs == 2 && k == 1 &&
						      un->args[0] != i;
					}
			}
			c->wstream[i] = ok && used;
		}
	return single;
}

/* A streamed weight gather: a view of the expert's weights in HBM, offset by
 * the expert register (or in DM, for block scales staged whole: lower_quant.c). */
static bool region_stream_view(lw *c, moe_id i)
{
	const ir_node *n = N(c->g, i);
	ir_node b = block_node(n);
	val *sv = tcpl_need_view(c, n->args[0]);
	if (sv->kind != VK_VIEW || !is_contig(sv, N(c->g, n->args[0])) ||
		(c->p->t[sv->t].space != TCP_HBM && !tcpl_quant_resident(c, i))) {
		tcpl_err(c, n->args[0], "per-block input must be a contiguous tensor");
		return false;
	}
	val v = tview(sv->t, i, &b);
	v.base = sv->base;
	v.region = true;
	v.reg = R_E;
	v.scale = ir_numel(&b);
	c->v[i] = v;
	return true;
}

/* A weight gather held per expert: one buffer (single) or two, read through the slot register. */
static void region_weight_buffer(lw *c, rgn *r, moe_id i)
{
	const ir_node *n = N(c->g, i);
	ir_node b = block_node(n);
	int64_t sh[MOE_MAX_RANK + 1];
	sh[0] = r->single ? 1 : 2;
	memcpy(sh + 1, b.shape, sizeof(int64_t) * b.rank);
	int32_t t = tcpl_dm_tensor(c, i, "wbuf", (moe_dtype)n->dtype, b.rank + 1, sh);
	if (r->nin < RGN_MAXIN)
		r->ins[r->nin++] = (rinp){n->args[0], i, t, ir_numel(&b), true, MOE_NONE, false, false, false, {0}};
	val v = tview(t, i, &b);
	v.region = true;
	v.reg = R_SLOT;
	v.scale = ir_numel(&b);
	c->v[i] = v;
}

/* The per-block grids region node i reads from outside: double buffers per block. */
static bool region_grid_inputs(lw *c, rgn *r, moe_id i)
{
	const moe_graph *g = c->g;
	const ir_node *n = N(g, i);
	for (uint32_t k = 0; k < n->nargs; k++) {
		moe_id a = n->args[k];
		if (a == MOE_NONE || c->inreg[a] || c->v[a].kind == VK_IMM || (c->w8_c1 && a == c->w8_bsc))
			continue; /* (W8A8's rows' scales: read before the loop, lower_w8a8.c) */
		const ir_node *an = N(g, a);
		if (an->rank < 1 || an->shape[0] != c->G) {
			tcpl_err(c, i, "a block op reads a value that is not per block");
			return false;
		}
		bool seen = false;
		for (int j = 0; j < r->nin; j++)
			seen |= r->ins[j].src == a;
		if (seen)
			continue;
		if (tcpl_decode_view(c, a)) {
			if (r->nin < RGN_MAXIN)
				r->ins[r->nin++] = (rinp){a, MOE_NONE, -1, 0, false, MOE_NONE, false, true, false, {0}};
			continue;
		}
		ir_node b = block_node(an);
		int64_t sh[MOE_MAX_RANK + 1];
		sh[0] = 2;
		memcpy(sh + 1, b.shape, sizeof(int64_t) * b.rank);
		moe_id gs = c->ggrid[a] ? c->ggrid[a] - 1 : MOE_NONE;
		bool st = gs != MOE_NONE && r->st_reg < 0 && tcpl_stage_fits(c, gs, ir_numel(&b));
		int32_t pre = st || gs == MOE_NONE ? -1 : tcpl_spec_rows_buffer(c, gs); /* spec_rows.c */
		int32_t t = st ? tcpl_stage_buffer(c, gs, ir_numel(&b), r->st_tmp)
			     : pre >= 0 ? pre
					: tcpl_dm_tensor(c, i, "blkin", (moe_dtype)(c->store_dt[a] ? c->store_dt[a] : an->dtype),
						b.rank + 1, sh);
		if (st)
			r->st_reg = tcpl_new_reg(c, i);
		if (r->nin < RGN_MAXIN)
			r->ins[r->nin++] = (rinp){a, MOE_NONE, t, ir_numel(&b), false, gs, st, false, false, {0}};
	}
	return true;
}

/* The loop's inputs and their buffers; false after an error. */
static bool region_inputs(lw *c, rgn *r)
{
	const moe_graph *g = c->g;
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i])
			continue;
		if (r->first == MOE_NONE)
			r->first = i;
		const ir_node *n = N(g, i);
		bool wgather = n->op == MOE_OP_GATHER && n->valid == c->nblocks;
		if (wgather && (c->wstream[i] || tcpl_quant_resident(c, i))) {
			if (!region_stream_view(c, i))
				return false;
		} else if (wgather) {
			region_weight_buffer(c, r, i);
		} else if (!region_grid_inputs(c, r, i)) {
			return false;
		}
	}
	if (r->nin >= RGN_MAXIN) {
		tcpl_err(c, r->first, "too many per-block inputs");
		return false;
	}
	return true;
}

/* Buffers of the region nodes (one block's worth); reshapes view their source. */
static bool region_buffers(lw *c)
{
	const moe_graph *g = c->g;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (!c->inreg[i] || c->v[i].kind == VK_VIEW || (tcpl_quant_no_buffer(c, i) && !region_slice(g, n)))
			continue;
		if (c->fused_into[i] != MOE_NONE && !c->hbm_home[i] && !c->is_out[i])
			continue; /* computed inside the pass it feeds (lower_fuse.c): never stored */
		ir_node b = block_node(n);
		if (n->op == MOE_OP_RESHAPE || region_slice(g, n)) {
			const val *sv = &c->v[n->args[0]];
			if (sv->kind != VK_VIEW) {
				tcpl_err(c, i, "reshape of a block value before it exists");
				return false;
			}
			val v = *sv;
			if (n->op == MOE_OP_RESHAPE) {
				contiguous(b.shape, b.rank, v.stride);
			} else { /* per block: the axis less the dropped G */
				int ax = ir_norm_axis((int)ir_attr_int(n, "axis", 0), n->rank) - 1;
				int64_t start = ir_attr_int(n, "start", 0);
				v.base += (start < 0 ? start + N(g, n->args[0])->shape[ax + 1] : start) * sv->stride[ax];
			}
			v.owner = i;
			c->v[i] = v;
			continue;
		}
		if (tcpl_pairs_buffer(c, i, &b))
			continue; /* two slots (lower_pairs.c) */
		int32_t t = tcpl_dm_tensor(c, i, n->name ? n->name : "block", (moe_dtype)n->dtype, b.rank, b.shape);
		c->v[i] = tview(t, i, &b);
	}
	return true;
}

/* Every input copied whole per block must be a contiguous tensor. */
static bool region_check_inputs(lw *c, const rgn *r)
{
	for (int j = 0; j < r->nin; j++) {
		if (r->ins[j].gather != MOE_NONE || r->ins[j].inplace)
			continue;
		val *sv = tcpl_need_view(c, r->ins[j].src);
		if (sv->kind != VK_VIEW || !is_contig(sv, N(c->g, r->ins[j].src))) {
			tcpl_err(c, r->ins[j].src, "per-block input must be a contiguous tensor");
			return false;
		}
	}
	return true;
}

/* Loads of one block's inputs into slot `slot` for block `blk` with expert
 * `ex` (registers) as one DMA descriptor list (the later commands join the
 * first). `join`: the list itself joins the DMA command before it, so inside
 * the loop every block's list sets up while the previous one transfers (the
 * hazards still hold each copy until its buffer's last reader is done). */
/* An expert's weights packed whole (pair_down.c): the gather's first slice
 * ends at the pair's elements, where down's begin; 0 for any other gather. */
static int64_t merged_split(const lw *c, moe_id q)
{
	const moe_graph *g = c->g;
	for (moe_id u = q + 1; u < g->nnodes; u++) {
		const ir_node *un = N(g, u);
		if (un->op == MOE_OP_SLICE && un->args[0] == q && c->inreg[u] && region_slice(g, un) &&
			ir_attr_int(un, "start", 0) == 0)
			return ir_attr_int(un, "stop", 0);
	}
	return 0;
}

/* The fetch of such an expert: one descriptor, but two (the pair's rows,
 * then down's) when block `blk` is the last, so that its gate and up work
 * while down streams in and only down's contraction follows the stream. */
static void merged_fetch(lw *c, const rinp *in, int blk, int slot, int ex, int64_t na, bool join)
{
	const val *sv = &c->v[in->src];
	alui(c, TCP_S_ADD, R_T, blk, TCP_NOREG, 1);
	uint32_t one = br(c, TCP_C_LT, R_T, R_NB);
	dma_copy(c, in->buf, 0, slot, in->n, sv->t, sv->base, ex, in->n, na);
	c->p->code[c->p->ncode - 1].flags |= join ? TCP_F_JOIN : 0;
	dma_copy(c, in->buf, na, slot, in->n, sv->t, sv->base + na, ex, in->n, in->n - na);
	c->p->code[c->p->ncode - 1].flags |= TCP_F_JOIN;
	uint32_t done = jmp(c);
	patch(c, one);
	dma_copy(c, in->buf, 0, slot, in->n, sv->t, sv->base, ex, in->n, in->n);
	c->p->code[c->p->ncode - 1].flags |= join ? TCP_F_JOIN : 0;
	patch(c, done);
}

static void load_inputs(lw *c, const rgn *r, int blk, int slot, int ex, bool weights_only, bool grids_only, bool join)
{
	for (int j = 0, first_ = !join; j < r->nin; j++) {
		const rinp *in = &r->ins[j];
		if ((in->weight && grids_only) || (!in->weight && weights_only) || in->inplace)
			continue;
		/* a grid's copy reads the grid, not the block view the body reads it through */
		const val *sv = in->homed ? &in->home : &c->v[in->src];
		int64_t na = in->weight ? merged_split(c, in->user) : 0;
		/* the prologue's block 0 of a decode (count a constant above 1) is not the last */
		if (na > 0 && blk == R_G && r->tnb < 0 && r->nbbase > 1)
			na = 0;
		if (na > 0 && na < in->n) {
			merged_fetch(c, in, blk, slot, ex, na, !first_);
			first_ = 0;
			continue;
		}
		if (in->staged && (weights_only || grids_only))
			continue; /* staged once, before the loop */
		uint32_t mark = c->p->ncode;
		if (in->staged)
			tcpl_stage_emit(c, in->gather, in->buf, in->n, r->trw, r->rwbase, r->rws, r->st_tmp);
		else if (in->gather != MOE_NONE) {
			block_gather(c, in->buf, slot, in->n, in->gather, blk, r->trw, r->rwbase, r->rws);
			for (uint32_t k = mark; !first_ && k + 1 < c->p->ncode; k++) /* each class's gather joins */
				if (tcp_op_ctx[c->p->code[k].op] == TCP_CTX_DMA)
					c->p->code[k].flags |= TCP_F_JOIN;
		} else if (in->weight && blk == R_G && r->tnb < 0 && r->nbbase > 1) /* a decode's first expert (lower_decode.c) */
			tcpl_decode_first_fetch(c, in->buf, in->n, in->src, r->tbe, r->bebase, r->bes);
		else
			dma_copy(c, in->buf, 0, slot, in->n, sv->t, sv->base, in->weight ? ex : blk, in->n, in->n);
		if (!first_)
			c->p->code[c->p->ncode - 1].flags |= TCP_F_JOIN;
		first_ = 0;
	}
}

/* A prefill (at least 8 rows per expert on average) whose one weight input
 * is held whole in DM: expert 0's weights into slot 0 ahead of routing, and
 * expert 1's into slot 1 (block 1's expert, or block 2's after a second block
 * of expert 0, for nearly every prefill: the in-order DMA context would
 * otherwise fetch it only behind the dispatch scatter). Returns how many
 * experts were fetched (0, 1 or 2). */
static int spec_first(lw *c, const rgn *r)
{
	int w = -1;
	for (int j = 0; j < r->nin; j++) {
		if (r->ins[j].staged || r->ins[j].inplace || (r->ins[j].weight && w >= 0))
			return 0;
		w = r->ins[j].weight ? j : w;
	}
	const tcp_program *p = c->p;
	if (w < 0 || r->single || r->tnb < 0 || !tcpl_upper_rows(c) || p->moe_T * p->moe_K < 8 * p->moe_E)
		return 0;
	const val *sv = &c->v[r->ins[w].src];
	int64_t n = r->ins[w].n;
	if (!tcpl_spec_fetch(c, r->ins[w].buf, 0, n, sv->t, sv->base))
		return 0;
	return p->moe_E >= 2 && tcpl_spec_fetch(c, r->ins[w].buf, n, n, sv->t, sv->base + n) ? 2 : 1;
}

/* The run-time scalars reach the control path through SPM (one DMA of
 * three descriptors); the first block's inputs are loaded. Returns the
 * branch that skips the whole loop when there are no blocks. */
static uint32_t region_prologue(lw *c, const rgn *r)
{
	tcp_insn spm = tcp_insn_init(TCP_OP_DMA_SPM);
	spm.ndim = 1;
	spm.dim[0] = c->G;
	/* a compile-time count (tensor -1, the value in its base: the decode
	 * grid) is no descriptor: `li` sets its register */
	int w = TCP_V_S0;
	if (r->tnb >= 0)
		spm.v[w].t = r->tnb, spm.v[w++].base = r->nbbase;
	spm.v[w].t = r->tbe;
	spm.v[w].base = r->bebase;
	spm.v[w++].stride[0] = r->bes;
	if (r->trw >= 0)
		spm.v[w].t = r->trw, spm.v[w].base = r->rwbase, spm.v[w].stride[0] = r->rws;
	/* the staging joins the descriptor list of the DMA command before it (its
	 * setup overlaps that one's transfer); right after dispatch's scatter,
	 * which it does not read, it goes first and the scatter joins it: the
	 * loop's control waits for the staging only, the row list is read by the
	 * block gathers, which the hazards order after the scatter */
	uint32_t at = c->p->ncode, q = at;
	while (q > 0 && tcp_op_ctx[c->p->code[q - 1].op] != TCP_CTX_DMA)
		q--; /* the last DMA command before the loop is code[q - 1] */
	if (q > 0)
		spm.flags |= TCP_F_JOIN;
	emit(c, &spm);
	tcp_insn *code = c->p->code;
	bool guarded = false; /* a scatter in guarded row tiles (lower_rows.c) is not moved */
	for (uint32_t k = 0; q > 0 && k < at; k++)
		guarded |= (code[k].op == TCP_OP_BR || code[k].op == TCP_OP_JMP) && code[k].target >= (int32_t)q - 1 &&
			   code[k].target <= (int32_t)at;
	if (q > 0 && !guarded && code[q - 1].op == TCP_OP_DMA_SCATTER && !(code[q - 1].flags & TCP_F_JOIN)) {
		/* straight-line code (no branch targets) between: the staging moves up */
		tcp_insn st = code[at], sc = code[q - 1];
		memmove(&code[q], &code[q - 1], (at - q + 1) * sizeof *code);
		code[q - 1] = st;
		sc.flags |= TCP_F_JOIN;
		code[q] = sc;
	}
	for (int j = 0; j < r->nin; j++) /* staged rows: their count beside the loop's scalars */
		if (r->ins[j].staged)
			tcpl_stage_count(c, r->ins[j].gather);
	if (r->tnb >= 0)
		ld(c, R_NB, r->tnb, -1, r->nbbase, 0);
	else
		li(c, R_NB, r->nbbase);
	li(c, R_G, 0);
	li(c, R_GMAX, c->G);
	li(c, R_SLOT, 0);
	li(c, R_IN, 0);
	li(c, R_PF, -1);
	if (r->nst || r->pair != MOE_NONE)
		li(c, R_PG, -1); /* no block result pending */
	if (r->st_reg >= 0)
		li(c, r->st_reg, 0);
	int nspec = spec_first(c, r); /* experts 0 and 1 fetched while routing runs (spec_fetch.c) */
	bool spec = nspec > 0;
	if (nspec == 2)
		li(c, R_PF, 1); /* the other slot holds expert 1 */
	tcpl_shared_regs(c);
	uint32_t skip_all = br(c, TCP_C_GE, R_G, R_NB);
	/* a decode's first weights are gathered by the DM expert list: the
	 * control path reads the expert from SPM after issuing that fetch */
	bool gathered = r->tnb < 0 && r->nbbase > 1;
	if (!gathered)
		ld(c, R_E, r->tbe, R_G, r->bebase, r->bes);
	bool rows0 = tcpl_spec_rows_take(c); /* block 0's rows gathered after top-k (spec_rows.c) */
	if (spec || rows0) { /* block 0's rows and weights, each unless its expert is 0 and they are there */
		if (!rows0)
			load_inputs(c, r, R_G, R_SLOT, R_E, false, true, true);
		if (!spec)
			load_inputs(c, r, R_G, R_SLOT, R_E, true, false, true);
		li(c, R_ROWT, 0);
		uint32_t have = br(c, TCP_C_EQ, R_E, R_ROWT);
		if (rows0)
			load_inputs(c, r, R_G, R_SLOT, R_E, false, true, true);
		if (spec)
			load_inputs(c, r, R_G, R_SLOT, R_E, true, false, true);
		patch(c, have);
	} else {
		load_inputs(c, r, R_G, R_SLOT, R_E, false, false, true); /* joins the staging list */
	}
	if (gathered)
		ld(c, R_E, r->tbe, R_G, r->bebase, r->bes);
	tcpl_lower_pre_experts(c, false); /* a shared expert: after the first fetch (lower_preexp.c) */
	tcpl_shared_prologue(c);          /* ... or its weights, for its pieces in the loop (lower_shared.c) */
	return skip_all;
}

/* At the top of block g's body: its row count, and the next block's grid
 * rows prefetched into the other half of their double buffer. Unless the
 * weights are held in a single buffer, the next expert's weights go into
 * the other weight slot as early as it is free: for block g + 1 when its
 * expert differs, and otherwise, looking one block further, for block
 * g + 2's (an expert's last block, often nearly empty, is then not the only
 * work its successor's fetch overlaps). R_PF names the expert whose weights
 * the other slot holds or is receiving (-1: none known). */
static void region_prefetch(lw *c, const rgn *r)
{
	if (r->trw >= 0)
		ld(c, R_ROWS, r->trw, R_G, r->rwbase, r->rws);
	else
		li(c, R_ROWS, r->rwbase);
	alui(c, TCP_S_ADD, R_NEXT, R_G, TCP_NOREG, 1);
	uint32_t nopref = br(c, TCP_C_GE, R_NEXT, R_NB);
	ld(c, R_E2, r->tbe, R_NEXT, r->bebase, r->bes);
	li(c, R_T, 1);
	alui(c, TCP_S_SUB, R_IN2, R_T, R_IN, 0);
	if (!r->nst) /* a decode's (results in a DM grid): its rows go first, the weights join them */
		load_inputs(c, r, R_NEXT, R_IN2, R_E2, false, true, true);
	if (!r->single) {
		uint32_t same = br(c, TCP_C_EQ, R_E2, R_E);
		alui(c, TCP_S_SUB, R_S2, R_T, R_SLOT, 0);
		uint32_t have = br(c, TCP_C_EQ, R_E2, R_PF);
		load_inputs(c, r, R_NEXT, R_S2, R_E2, true, false, true);
		patch(c, have);
		alui(c, TCP_S_ADD, R_PF, R_E, TCP_NOREG, 0); /* after the swap the other slot holds this expert */
		uint32_t done = jmp(c);
		patch(c, same);
		alui(c, TCP_S_ADD, R_S2, R_SLOT, TCP_NOREG, 0);
		alui(c, TCP_S_ADD, R_ROWT, R_G, TCP_NOREG, 2);
		uint32_t end2 = br(c, TCP_C_GE, R_ROWT, R_NB);
		ld(c, R_E3, r->tbe, R_ROWT, r->bebase, r->bes);
		uint32_t same2 = br(c, TCP_C_EQ, R_E3, R_E), have2 = br(c, TCP_C_EQ, R_E3, R_PF);
		alui(c, TCP_S_SUB, R_S2, R_T, R_SLOT, 0);
		load_inputs(c, r, R_ROWT, R_S2, R_E3, true, false, true);
		alui(c, TCP_S_ADD, R_S2, R_SLOT, TCP_NOREG, 0);
		alui(c, TCP_S_ADD, R_PF, R_E3, TCP_NOREG, 0);
		patch(c, end2);
		patch(c, same2);
		patch(c, have2);
		patch(c, done);
	}
	patch(c, nopref);
}

/* Lowers region node i with the per-block view of every operand: the
 * shapes are narrowed (the leading G dropped) for the call, then restored;
 * an elementwise chain fused into i (lower_fuse.c) narrows its nodes and
 * their operands too. */
enum { BLK_NARROW = 48 };
static void lower_block_node(lw *c, moe_id i)
{
	const moe_graph *g = c->g;
	moe_id ids[BLK_NARROW];
	ir_node saved[BLK_NARROW];
	bool narrow[BLK_NARROW];
	int nid = 0;
	for (moe_id m = 0; m < g->nnodes; m++) {
		if (m != i && c->fused_into[m] != i)
			continue;
		const ir_node *mn = N(g, m);
		for (uint32_t k = 0; k <= mn->nargs; k++) {
			moe_id a = k < mn->nargs ? mn->args[k] : m;
			int j = 0;
			while (j < nid && ids[j] != a)
				j++;
			if (j < nid)
				continue;
			if (nid == BLK_NARROW) {
				tcpl_err(c, i, "a block op with more than %d operands", BLK_NARROW);
				return;
			}
			const ir_node *an = N(g, a);
			ids[nid] = a;
			saved[nid] = *an;
			narrow[nid] = a == m || c->fused_into[a] == i ||
				      (c->v[a].kind == VK_VIEW && an->rank >= 1 && an->shape[0] == c->G &&
					      (c->inreg[a] || c->v[a].region));
			nid++;
		}
	}
	for (int j = 0; j < nid; j++)
		if (narrow[j])
			*(ir_node *)N(g, ids[j]) = block_node(&saved[j]);
	tcpl_lower_node(c, i);
	for (int j = nid; j-- > 0;)
		*(ir_node *)N(g, ids[j]) = saved[j];
}

/* In block g's body, after its first contraction (or before a value that
 * is copied out is written again), when block results go to HBM grids:
 * block g + 1's grid rows into the other half of their double buffer, then
 * block g - 1's results to HBM (block_store.c). Issued at the top of the
 * body, the gather would wait for block g - 1's reads of that half, and the
 * DMA commands after it (block g's weights) with it. A decode (results in a
 * DM grid) gathers at the top: its one-row blocks are read at once, and the
 * weights that follow join the gather. */
static void region_mid(lw *c, const rgn *r)
{
	if (r->pair != MOE_NONE) { /* block g - 1's results scattered to their pairs */
		li(c, R_ROWT, 0);
		uint32_t none = br(c, TCP_C_LT, R_PG, R_ROWT);
		tcpl_pairs_store(c, r->pair, R_PG, R_PROWS);
		patch(c, none);
	}
	if (!r->nst)
		return; /* no result to copy: a decode's small blocks, whose rows were gathered at the top */
	uint32_t last = br(c, TCP_C_GE, R_NEXT, R_NB);
	load_inputs(c, r, R_NEXT, R_IN2, R_E2, false, true, true);
	patch(c, last);
	tcpl_store_pending(c, r->st, r->nst);
}

/* The block body: the grid inputs read through the input slot register, then every region node. */
static void region_body(lw *c, rgn *r)
{
	const moe_graph *g = c->g;
	tcpl_pairs_slot(c); /* the slot of block g's pair-order result (lower_pairs.c) */
	for (int j = 0; j < r->nin; j++) {
		if (r->ins[j].weight)
			continue;
		r->ins[j].home = c->v[r->ins[j].src];
		r->ins[j].homed = true;
		ir_node b = block_node(N(g, r->ins[j].src));
		val v = tview(r->ins[j].buf, r->ins[j].src, &b);
		v.region = true;
		v.reg = r->ins[j].staged ? r->st_reg : R_IN;
		v.scale = r->ins[j].staged ? b.shape[b.rank - 1] : r->ins[j].n; /* staged: rows from the block's first */
		if (r->ins[j].inplace)
			v = tcpl_decode_block_view(c, r->ins[j].src);
		for (moe_id i = 0; i < g->nnodes; i++)
			if (c->inreg[i])
				for (uint32_t k = 0; k < N(g, i)->nargs; k++)
					if (N(g, i)->args[k] == r->ins[j].src)
						c->v[r->ins[j].src] = v;
	}
	bool pending = true; /* the next block's rows, block g - 1's results: after block g's first contraction */
	for (moe_id i = 0; i < g->nnodes && !c->failed; i++) {
		if (!c->inreg[i])
			continue;
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_GATHER || n->op == MOE_OP_RESHAPE || region_slice(g, n))
			continue;
		bool rewrites = false; /* a stored value is written again: its copy goes first */
		for (int k = 0; k < r->nst; k++)
			rewrites |= r->stid[k] == i;
		rewrites |= i == r->pair;
		if (pending && rewrites) {
			region_mid(c, r);
			pending = false;
		}
		lower_block_node(c, i);
		if (pending && n->op == MOE_OP_EINSUM) {
			region_mid(c, r);
			pending = false;
		}
	}
	if (pending)
		region_mid(c, r);
	tcpl_shared_body(c);
}

static bool in_dm_grid(const rgn *r, moe_id i)
{
	bool indm = false;
	for (int k = 0; k < r->ndh; k++)
		indm |= r->dmhome[k] == (int32_t)i;
	return indm;
}

/* Region results read outside the loop (those in a DM grid are there):
 * each gets an HBM grid, to which every block's result is copied
 * (block_store.c: deferred to the next block's body). */
static void region_homes(lw *c, rgn *r)
{
	const moe_graph *g = c->g;
	bool fine = false; /* streamed weights: the contractions run fine row tiles */
	for (moe_id i = 0; i < g->nnodes; i++)
		fine |= c->inreg[i] && c->wstream[i];
	for (moe_id i = 0; i < g->nnodes && r->nst < RGN_MAXDM; i++) {
		if (!c->inreg[i] || !c->hbm_home[i] || N(g, i)->op == MOE_OP_RESHAPE || in_dm_grid(r, i) ||
			(i == c->pr_node && c->pr_t >= 0)) { /* in pair order (lower_pairs.c) */
			if (c->inreg[i] && i == c->pr_node && c->pr_t >= 0)
				r->pair = i;
			continue;
		}
		const ir_node *n = N(g, i);
		ir_node b = block_node(n);
		int32_t home = tcpl_hbm_tensor(c, n->name ? n->name : "block-out", TCP_T_SCRATCH, (moe_dtype)n->dtype,
			n->rank, n->shape);
		r->stid[r->nst] = i;
		r->st[r->nst++] = (tcpl_bstore){home, c->v[i].t, b.shape[0], ir_numel(&b) / b.shape[0], fine};
	}
}

/* The end of block g's body: the next expert's weights into the single
 * buffer (after this block's reads of it), the slots swapped. */
static void region_advance(lw *c, const rgn *r)
{
	if (r->single) {
		uint32_t last = br(c, TCP_C_GE, R_NEXT, R_NB);
		uint32_t same = br(c, TCP_C_EQ, R_E2, R_E);
		load_inputs(c, r, R_NEXT, R_SLOT, R_E2, true, false, true);
		patch(c, last);
		patch(c, same);
	}
	if (!r->single)
		alui(c, TCP_S_ADD, R_SLOT, R_S2, TCP_NOREG, 0);
	alui(c, TCP_S_ADD, R_E, R_E2, TCP_NOREG, 0);
	alui(c, TCP_S_ADD, R_IN, R_IN2, TCP_NOREG, 0);
	if (r->st_reg >= 0)
		alui(c, TCP_S_ADD, r->st_reg, r->st_reg, R_ROWS, 0);
}

/* After the loop: its DM buffers die with it (results read after it went to
 * HBM or to a DM grid); consumers outside see whole-grid views. */
static void region_finish(lw *c, const rgn *r)
{
	const moe_graph *g = c->g;
	for (int k = 0; k < r->ndh; k++)
		c->v[r->dmhome[k]] = tview(c->v[r->dmhome[k]].t, r->dmhome[k], N(g, r->dmhome[k]));
	for (int k = 0; k < r->nst; k++)
		c->v[r->stid[k]] = tview(r->st[k].home, r->stid[k], N(g, r->stid[k]));
	for (int j = 0; j < r->nin; j++)
		if (!r->ins[j].inplace)
			tcpl_dm_free(c, r->ins[j].buf);
	for (int k = 0; r->st_reg >= 0 && k < 2; k++)
		if (r->st_tmp[k] >= 0)
			tcpl_dm_free(c, r->st_tmp[k]);
	for (moe_id i = 0; i < g->nnodes; i++)
		if (c->inreg[i] && c->v[i].kind == VK_VIEW && c->v[i].t >= r->t_first && c->p->t[c->v[i].t].space == TCP_DM)
			tcpl_dm_free(c, c->v[i].t);
	/* views of region results for the consumers outside: reshapes follow their source */
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i] || N(g, i)->op != MOE_OP_RESHAPE)
			continue;
		const val *sv = &c->v[N(g, i)->args[0]];
		bool dmgrid = false;
		for (int k = 0; k < r->ndh; k++)
			dmgrid |= sv->kind == VK_VIEW && sv->t == c->v[r->dmhome[k]].t;
		if (sv->kind == VK_VIEW && (c->p->t[sv->t].space == TCP_HBM || dmgrid)) {
			val v = *sv;
			contiguous(N(g, i)->shape, N(g, i)->rank, v.stride);
			c->v[i] = v;
		}
	}
	for (int j = 0; j < r->nin; j++)
		if (!r->ins[j].weight && !r->ins[j].inplace)
			c->v[r->ins[j].src] = tview(c->p->t[r->ins[j].buf].space == TCP_HBM ? r->ins[j].buf : c->v[r->ins[j].src].t,
				r->ins[j].src, N(g, r->ins[j].src));
}

/* The block region as one loop over g < G, each body guarded by
 * g < nblocks (docs/tcp-isa.md 7.4). */
void tcpl_lower_region(lw *c)
{
	tcp_program *p = c->p;
	rgn r;
	memset(&r, 0, sizeof r);
	r.first = MOE_NONE;
	r.st_reg = -1;
	r.pair = MOE_NONE;
	r.st_tmp[0] = r.st_tmp[1] = -1;
	bool nbi = c->v[c->nblocks].kind == VK_IMM, rwi = c->v[c->rows].kind == VK_IMM;
	r.tnb = nbi ? -1 : tcpl_dm_view(c, c->nblocks)->t;
	r.tbe = tcpl_dm_view(c, c->bexp)->t;
	r.trw = rwi ? -1 : tcpl_dm_view(c, c->rows)->t;
	r.nbbase = nbi ? (int32_t)c->v[c->nblocks].imm : c->v[c->nblocks].base;
	r.bebase = c->v[c->bexp].base;
	r.rwbase = rwi ? (int32_t)c->v[c->rows].imm : c->v[c->rows].base;
	r.bes = c->v[c->bexp].stride[0];
	r.rws = c->v[c->rows].stride[0];
	p->nblocks_t = r.tnb;
	p->bexp_t = r.tbe;
	region_dm_grids(c, &r);
	tcpl_w8a8_bulk(c, r.tbe, r.bebase, r.bes); /* lower_w8a8.c */
	r.t_first = (int32_t)p->nt;
	r.single = region_plan_weights(c);
	tcpl_pairs_rows(c); /* block results in pair order (lower_pairs.c) */
	if (!region_inputs(c, &r) || !region_buffers(c) || !region_check_inputs(c, &r))
		return;
	region_homes(c, &r);
	tcpl_dcomb_plan(c, r.dmhome, r.ndh); /* a decode's combine, in the loop (lower_dcomb.c) */
	uint32_t skip_all = region_prologue(c, &r);
	p->block_loop_pc = (int32_t)p->ncode;
	uint32_t loop = p->ncode;
	uint32_t guard = br(c, TCP_C_GE, R_G, R_NB);
	region_prefetch(c, &r);
	p->block_body_pc = (int32_t)p->ncode;
	tcpl_w8a8_bulk_body(c); /* lower_w8a8.c */
	region_body(c, &r);
	tcpl_dcomb_step(c);
	if (r.pair != MOE_NONE) { /* the last block scatters its own results in pair order (lower_pairs.c) */
		uint32_t more = br(c, TCP_C_LT, R_NEXT, R_NB);
		tcpl_pairs_store(c, r.pair, R_G, R_ROWS);
		patch(c, more);
	}
	tcpl_store_end(c, r.st, r.nst);
	if (r.pair != MOE_NONE && !r.nst) { /* this block's results pend (tcpl_store_end sets these with copies) */
		alui(c, TCP_S_ADD, R_PG, R_G, TCP_NOREG, 0);
		alui(c, TCP_S_ADD, R_PROWS, R_ROWS, TCP_NOREG, 0);
	}
	region_advance(c, &r);
	patch(c, guard);
	alui(c, TCP_S_ADD, R_G, R_G, TCP_NOREG, 1);
	uint32_t back = br(c, TCP_C_LT, R_G, R_GMAX);
	p->code[back].target = (int32_t)loop;
	patch(c, skip_all);
	region_finish(c, &r);
	tcpl_dcomb_finish(c);
	tcpl_w8a8_bulk_end(c);
}
