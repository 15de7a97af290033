/* backend-tcp/lower_region.c: TCP lowering of the block region: finding it (nodes
 * masked by the per-block valid rows), and emitting it once as a guarded loop
 * over the blocks with double-buffered prefetch of weights and rows. */
#include <string.h>

#include "backend-tcp/lower_int.h"

/* ---- block region ---- */
void tcpl_find_region(lw *c)
{
	const moe_graph *g = c->g;
	c->rows = c->nblocks = c->bexp = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->valid == MOE_NONE)
			continue;
		const ir_node *vn = N(g, n->valid);
		if (vn->rank == 1 && n->rank >= 2 && n->shape[0] == vn->shape[0]) {
			c->rows = n->valid;
			c->G = vn->shape[0];
		}
		if (vn->rank == 0 && n->op == MOE_OP_GATHER && N(g, n->args[1])->rank == 1) {
			c->nblocks = n->valid;
			c->bexp = n->args[1];
		}
	}
	if (c->rows == MOE_NONE || c->nblocks == MOE_NONE || N(g, c->bexp)->shape[0] != c->G) {
		c->rows = c->nblocks = c->bexp = MOE_NONE;
		return;
	}
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		bool r = (n->valid == c->rows) ||
			(n->valid == c->nblocks && n->op == MOE_OP_GATHER && n->args[1] == c->bexp && N(g, n->args[0])->op ==
				MOE_OP_WEIGHT);
		if (!r && n->op == MOE_OP_RESHAPE && c->inreg[n->args[0]] && n->rank >= 1 && n->shape[0] == c->G &&
			N(g, n->args[0])->shape[0] == c->G)
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
				N(g, a)->op != MOE_OP_WEIGHT) {
				moe_id s = a;
				while (N(g, s)->op == MOE_OP_RESHAPE)
					s = N(g, s)->args[0];
				c->hbm_home[s] = true;
			}
			if (!c->inreg[i] && c->inreg[a])
				c->hbm_home[a] = true;
		}
		if (c->inreg[i] && c->is_out[i])
			c->hbm_home[i] = true;
	}
}

/* Dispatch by gather: block blk's rows of x, by the grid's row list, into
 * slot `slot` of buf (n elements per block). */
static void block_gather(lw *c, int32_t buf, int slot, int64_t n, moe_id s, int blk)
{
	const ir_node *sn = N(c->g, s), *xp = N(c->g, sn->args[2]), *x = N(c->g, xp->args[0]);
	val *xv = tcpl_need_view(c, xp->args[0]);
	int64_t D = sn->shape[1], rows = n / D, T = x->shape[0];
	tcp_insn in = tcp_insn_init(TCP_OP_DMA_GATHER);
	in.ndim = 3;
	in.dim[0] = 1;
	in.dim[1] = rows;
	in.dim[2] = D;
	in.rows = T;
	in.vreg = -1;
	tcp_view *d = &in.v[TCP_V_DST], *sv = &in.v[TCP_V_S0], *ix = &in.v[TCP_V_S1];
	d->t = buf;
	d->reg = slot;
	d->scale = n;
	d->stride[0] = n;
	d->stride[1] = D;
	d->stride[2] = 1;
	sv->t = xv->t;
	sv->base = xv->base;
	sv->stride[0] = T * D;
	sv->stride[1] = D;
	sv->stride[2] = 1;
	ix->t = c->v[s].t;
	ix->base = c->v[s].base;
	ix->reg = blk;
	ix->scale = rows;
	ix->stride[0] = rows;
	ix->stride[1] = 1;
	emit(c, &in);
}

void tcpl_lower_region(lw *c)
{
	const moe_graph *g = c->g;
	tcp_program *p = c->p;
	int32_t tnb = tcpl_dm_view(c, c->nblocks)->t, tbe = tcpl_dm_view(c, c->bexp)->t, trw = tcpl_dm_view(c, c->rows)->t;
	int64_t nbbase = c->v[c->nblocks].base, bebase = c->v[c->bexp].base, rwbase = c->v[c->rows].base;
	int64_t bes = c->v[c->bexp].stride[0], rws = c->v[c->rows].stride[0];
	p->nblocks_t = tnb;
	p->bexp_t = tbe;
	/* per-block buffers: weights and grid rows double-buffered [2, ...] */
	typedef struct inp {
		moe_id src; /* node outside (weight leaf, or grid) */
		moe_id user; /* region node standing for it (gather), or MOE_NONE for a grid */
		int32_t buf;
		int64_t n;  /* elements per block */
		bool weight;
		moe_id gather; /* dispatch by gather: the grid scatter, else MOE_NONE */
	} inp;
	inp ins[32];
	int nin = 0;
	moe_id first = MOE_NONE;
	/* Block results read after the loop go to a grid of all G blocks: in DM
	 * when it is small (at most 1/16 of DM: a decode), where each block's
	 * math writes its slot directly and the combine reads it there, else in
	 * HBM through one copy per block. */
	int32_t dmhome[64];
	int ndh = 0;
	for (moe_id i = 0; i < g->nnodes && ndh < 64; i++) {
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
		dmhome[ndh++] = (int32_t)i;
	}
	int32_t t_first = (int32_t)p->nt; /* tensors from here on belong to the loop */
	/* Whole experts' weights, double-buffered, take this much DM per slice.
	 * When that exceeds half of DM, every weight gather read only as the
	 * stationary operand of block contractions is streamed instead: its
	 * TRF tiles are fetched from HBM one at a time (docs/tcp-isa.md 7.4).
	 * But when one expert's weights fit in half of DM and the experts get
	 * two blocks or more on average (T K >= 2 E B), they are held whole in a
	 * single buffer: each expert is read once for all its blocks, and the
	 * next expert's fetch waits for the last block of the current one. */
	int64_t whole = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (!c->inreg[i] || n->op != MOE_OP_GATHER || n->valid != c->nblocks)
			continue;
		ir_node b = block_node(n);
		whole += rup((2 * ir_numel(&b) * esz(n->dtype) + c->S - 1) / c->S, c->m->flit_bytes);
	}
	bool single = whole > c->m->dm_bytes_per_slice / 2 && whole <= c->m->dm_bytes_per_slice &&
		      p->moe_T * p->moe_K >= 2 * p->moe_E * p->moe_B && p->moe_E > 0 && p->moe_B > 0;
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
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i])
			continue;
		if (first == MOE_NONE)
			first = i;
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_GATHER && n->valid == c->nblocks && c->wstream[i]) {
			/* streamed: a view of the expert's weights in HBM, offset by the expert register */
			ir_node b = block_node(n);
			val *sv = tcpl_need_view(c, n->args[0]);
			if (sv->kind != VK_VIEW || !is_contig(sv, N(g, n->args[0])) || c->p->t[sv->t].space != TCP_HBM) {
				tcpl_err(c, n->args[0], "per-block input must be a contiguous tensor");
				return;
			}
			val v = tview(sv->t, i, &b);
			v.base = sv->base;
			v.region = true;
			v.reg = R_E;
			v.scale = ir_numel(&b);
			c->v[i] = v;
			continue;
		}
		if (n->op == MOE_OP_GATHER && n->valid == c->nblocks) {
			ir_node b = block_node(n);
			int64_t sh[MOE_MAX_RANK + 1];
			sh[0] = single ? 1 : 2;
			memcpy(sh + 1, b.shape, sizeof(int64_t) * b.rank);
			int32_t t = tcpl_dm_tensor(c, i, "wbuf", (moe_dtype)n->dtype, b.rank + 1, sh);
			if (nin < 32)
				ins[nin++] = (inp){n->args[0], i, t, ir_numel(&b), true, MOE_NONE};
			val v = tview(t, i, &b);
			v.region = true;
			v.reg = R_SLOT;
			v.scale = ir_numel(&b);
			c->v[i] = v;
			continue;
		}
		for (uint32_t k = 0; k < n->nargs; k++) {
			moe_id a = n->args[k];
			if (a == MOE_NONE || c->inreg[a] || c->v[a].kind == VK_IMM)
				continue;
			const ir_node *an = N(g, a);
			if (an->rank < 1 || an->shape[0] != c->G) {
				tcpl_err(c, i, "a block op reads a value that is not per block");
				return;
			}
			bool seen = false;
			for (int j = 0; j < nin; j++)
				seen |= ins[j].src == a;
			if (seen)
				continue;
			ir_node b = block_node(an);
			int64_t sh[MOE_MAX_RANK + 1];
			sh[0] = 2;
			memcpy(sh + 1, b.shape, sizeof(int64_t) * b.rank);
			int32_t t = tcpl_dm_tensor(c, i, "blkin", (moe_dtype)an->dtype, b.rank + 1, sh);
			if (nin < 32)
				ins[nin++] = (inp){a, MOE_NONE, t, ir_numel(&b), false, c->ggrid[a] ? c->ggrid[a] - 1 : MOE_NONE};
		}
	}
	if (nin >= 32) {
		tcpl_err(c, first, "too many per-block inputs");
		return;
	}
	/* region node buffers */
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i] || c->v[i].kind == VK_VIEW)
			continue;
		const ir_node *n = N(g, i);
		ir_node b = block_node(n);
		if (n->op == MOE_OP_RESHAPE) {
			const val *sv = &c->v[n->args[0]];
			if (sv->kind != VK_VIEW) {
				tcpl_err(c, i, "reshape of a block value before it exists");
				return;
			}
			val v = *sv;
			contiguous(b.shape, b.rank, v.stride);
			v.owner = i;
			c->v[i] = v;
			continue;
		}
		int32_t t = tcpl_dm_tensor(c, i, n->name ? n->name : "block", (moe_dtype)n->dtype, b.rank, b.shape);
		c->v[i] = tview(t, i, &b);
	}
	/* loads of one block's inputs into slot `slot` for block `blk` with expert `ex` */
	/* one DMA command per group: the later copies join the first's descriptors */
#define LOAD_INPUTS(blk, slot, ex, weights_only, grids_only)                                                     \
	for (int j = 0, first_ = 1; j < nin; j++) {                                                                \
		if ((ins[j].weight && (grids_only)) || (!ins[j].weight && (weights_only)))                             \
			continue;                                                                                      \
		val *sv = &c->v[ins[j].src];                                                                       \
		if (ins[j].gather != MOE_NONE)                                                                     \
			block_gather(c, ins[j].buf, slot, ins[j].n, ins[j].gather, blk);                               \
		else                                                                                               \
			dma_copy(c, ins[j].buf, 0, slot, ins[j].n, sv->t, sv->base, ins[j].weight ? ex : blk, ins[j].n, \
				ins[j].n);                                                                         \
		if (!first_)                                                                                       \
			c->p->code[c->p->ncode - 1].flags |= TCP_F_JOIN;                                               \
		first_ = 0;                                                                                        \
	}
	for (int j = 0; j < nin; j++) {
		if (ins[j].gather != MOE_NONE)
			continue;
		val *sv = tcpl_need_view(c, ins[j].src);
		if (sv->kind != VK_VIEW || !is_contig(sv, N(g, ins[j].src))) {
			tcpl_err(c, ins[j].src, "per-block input must be a contiguous tensor");
			return;
		}
	}
	/* the run-time scalars reach the control path through SPM (one DMA of
	 * three descriptors); the loop runs the worst-case G blocks, each body
	 * guarded by g < nblocks (docs/tcp-isa.md 7.4) */
	tcp_insn spm = tcp_insn_init(TCP_OP_DMA_SPM);
	spm.ndim = 1;
	spm.dim[0] = c->G;
	spm.v[TCP_V_S0].t = tnb;
	spm.v[TCP_V_S0].base = nbbase;
	spm.v[TCP_V_S1].t = tbe;
	spm.v[TCP_V_S1].base = bebase;
	spm.v[TCP_V_S1].stride[0] = bes;
	spm.v[TCP_V_S2].t = trw;
	spm.v[TCP_V_S2].base = rwbase;
	spm.v[TCP_V_S2].stride[0] = rws;
	emit(c, &spm);
	ld(c, R_NB, tnb, -1, nbbase, 0);
	li(c, R_G, 0);
	li(c, R_GMAX, c->G);
	li(c, R_SLOT, 0);
	li(c, R_IN, 0);
	uint32_t skip_all = br(c, TCP_C_GE, R_G, R_NB);
	ld(c, R_E, tbe, R_G, bebase, bes);
	LOAD_INPUTS(R_G, R_SLOT, R_E, false, false)
	p->block_loop_pc = (int32_t)p->ncode;
	uint32_t loop = p->ncode;
	uint32_t guard = br(c, TCP_C_GE, R_G, R_NB);
	ld(c, R_ROWS, trw, R_G, rwbase, rws);
	alui(c, TCP_S_ADD, R_NEXT, R_G, TCP_NOREG, 1);
	uint32_t nopref = br(c, TCP_C_GE, R_NEXT, R_NB);
	ld(c, R_E2, tbe, R_NEXT, bebase, bes);
	li(c, R_T, 1);
	alui(c, TCP_S_SUB, R_IN2, R_T, R_IN, 0);
	LOAD_INPUTS(R_NEXT, R_IN2, R_E2, false, true)
	if (!single) {
		uint32_t same = br(c, TCP_C_EQ, R_E2, R_E);
		alui(c, TCP_S_SUB, R_S2, R_T, R_SLOT, 0);
		LOAD_INPUTS(R_NEXT, R_S2, R_E2, true, false)
		uint32_t done = jmp(c);
		patch(c, same);
		alui(c, TCP_S_ADD, R_S2, R_SLOT, TCP_NOREG, 0);
		patch(c, done);
	}
	patch(c, nopref);
	p->block_body_pc = (int32_t)p->ncode;
	/* the grid inputs are read through the input slot register */
	for (int j = 0; j < nin; j++) {
		if (ins[j].weight)
			continue;
		ir_node b = block_node(N(g, ins[j].src));
		val v = tview(ins[j].buf, ins[j].src, &b);
		v.region = true;
		v.reg = R_IN;
		v.scale = ins[j].n;
		for (moe_id i = 0; i < g->nnodes; i++)
			if (c->inreg[i])
				for (uint32_t k = 0; k < N(g, i)->nargs; k++)
					if (N(g, i)->args[k] == ins[j].src)
						c->v[ins[j].src] = v;
	}
	for (moe_id i = 0; i < g->nnodes && !c->failed; i++) {
		if (!c->inreg[i])
			continue;
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_GATHER || n->op == MOE_OP_RESHAPE)
			continue;
		/* lower with the per-block view of every operand: temporarily narrow shapes */
		ir_node *mn = (ir_node *)n;
		ir_node saved = *mn;
		ir_node saved_args[16];
		for (uint32_t k = 0; k < n->nargs && k < 16; k++) {
			ir_node *an = (ir_node *)N(g, n->args[k]);
			saved_args[k] = *an;
			if (c->v[n->args[k]].kind == VK_VIEW && an->rank >= 1 && an->shape[0] == c->G &&
				(c->inreg[n->args[k]] || c->v[n->args[k]].region))
				*an = block_node(an);
		}
		*mn = block_node(n);
		tcpl_lower_node(c, i);
		for (uint32_t k = n->nargs; k-- > 0;)
			if (k < 16)
				*(ir_node *)N(g, n->args[k]) = saved_args[k];
		*mn = saved;
	}
	/* store region results read outside the loop (those in a DM grid are there) */
	for (moe_id i = 0; i < g->nnodes; i++) {
		bool indm = false;
		for (int k = 0; k < ndh; k++)
			indm |= dmhome[k] == (int32_t)i;
		if (!c->inreg[i] || !c->hbm_home[i] || N(g, i)->op == MOE_OP_RESHAPE || indm)
			continue;
		const ir_node *n = N(g, i);
		ir_node b = block_node(n);
		int32_t home = tcpl_hbm_tensor(c, n->name ? n->name : "block-out", TCP_T_SCRATCH, (moe_dtype)n->dtype, n->rank,
			n->shape);
		dma_copy(c, home, 0, R_G, ir_numel(&b), c->v[i].t, 0, -1, 0, ir_numel(&b));
		c->v[i] = tview(home, i, n);
	}
	if (single) {
		/* the next expert's weights, after this block's reads of the buffer */
		uint32_t last = br(c, TCP_C_GE, R_NEXT, R_NB);
		uint32_t same = br(c, TCP_C_EQ, R_E2, R_E);
		LOAD_INPUTS(R_NEXT, R_SLOT, R_E2, true, false)
		patch(c, last);
		patch(c, same);
	}
	if (!single)
		alui(c, TCP_S_ADD, R_SLOT, R_S2, TCP_NOREG, 0);
	alui(c, TCP_S_ADD, R_E, R_E2, TCP_NOREG, 0);
	alui(c, TCP_S_ADD, R_IN, R_IN2, TCP_NOREG, 0);
	patch(c, guard);
	alui(c, TCP_S_ADD, R_G, R_G, TCP_NOREG, 1);
	uint32_t back = br(c, TCP_C_LT, R_G, R_GMAX);
	p->code[back].target = (int32_t)loop;
	patch(c, skip_all);
	for (int k = 0; k < ndh; k++)
		c->v[dmhome[k]] = tview(c->v[dmhome[k]].t, dmhome[k], N(g, dmhome[k]));
	/* the loop's DM buffers die with it (results read after it went to HBM or to a DM grid) */
	for (int j = 0; j < nin; j++)
		tcpl_dm_free(c, ins[j].buf);
	for (moe_id i = 0; i < g->nnodes; i++)
		if (c->inreg[i] && c->v[i].kind == VK_VIEW && c->v[i].t >= t_first && c->p->t[c->v[i].t].space == TCP_DM)
			tcpl_dm_free(c, c->v[i].t);
	/* views of region results for the consumers outside: reshapes follow their source */
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i] || N(g, i)->op != MOE_OP_RESHAPE)
			continue;
		const val *sv = &c->v[N(g, i)->args[0]];
		bool dmgrid = false;
		for (int k = 0; k < ndh; k++)
			dmgrid |= sv->kind == VK_VIEW && sv->t == c->v[dmhome[k]].t;
		if (sv->kind == VK_VIEW && (c->p->t[sv->t].space == TCP_HBM || dmgrid)) {
			val v = *sv;
			contiguous(N(g, i)->shape, N(g, i)->rank, v.stride);
			c->v[i] = v;
		}
	}
	for (int j = 0; j < nin; j++)
		if (!ins[j].weight)
			c->v[ins[j].src] = tview(c->p->t[ins[j].buf].space == TCP_HBM ? ins[j].buf : c->v[ins[j].src].t,
				ins[j].src, N(g, ins[j].src));
#undef LOAD_INPUTS
}

