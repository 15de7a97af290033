/* backend-tcp/lower_route.c: TCP lowering of gather, take_along and scatter to DMA
 * gathers/scatters with index lists, and of reshape, slice and broadcast to
 * sequencer views (no data moves). */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"

/* ---- gathers and scatters ---- */
static void dma_gs(lw *c, tcp_opcode op, moe_id at, const val *dst, const val *srcv, const val *idx, int64_t groups,
	int64_t nidx, int64_t rows, int64_t row, int64_t sgstride, int64_t srstride, int64_t dgstride, int64_t drstride,
	int64_t igstride, int64_t istride, int vreg, unsigned flags)
{
	tcp_insn in = tcp_insn_init(op);
	in.ndim = 3;
	in.dim[0] = groups;
	in.dim[1] = nidx;
	in.dim[2] = row;
	in.rows = rows;
	in.vreg = vreg;
	in.flags = (uint8_t)flags;
	tcp_view *d = &in.v[TCP_V_DST], *s = &in.v[TCP_V_S0], *ix = &in.v[TCP_V_S1];
	d->t = dst->t;
	d->base = dst->base;
	d->stride[0] = dgstride;
	d->stride[1] = drstride;
	d->stride[2] = 1;
	s->t = srcv->t;
	s->base = srcv->base;
	s->stride[0] = sgstride;
	s->stride[1] = srstride;
	s->stride[2] = 1;
	ix->t = idx->t;
	ix->base = idx->base;
	ix->stride[0] = igstride;
	ix->stride[1] = istride;
	/* guarded row tiles (lower_rows.c); a scatter's skipped rows are exactly those not applied */
	if ((flags & TCP_F_VROWS) && (op == TCP_OP_DMA_SCATTER || tcpl_tile_outside(c, at)))
		tcpl_emit_row_tiles(c, &in, tcpl_row_tile(groups));
	else {
		emit(c, &in);
		tcpl_join_gs(c, c->p->ncode - 1);
	}
}

static int64_t prod(const int64_t *s, int a, int b)
{
	int64_t r = 1;
	for (int i = a; i < b; i++)
		r *= s[i];
	return r;
}

void tcpl_lower_gather(lw *c, moe_id id)
{
	if (tcpl_pairs_gather(c, id))
		return; /* rows of the block results in pair order, in DM */
	const ir_node *n = N(c->g, id), *x = N(c->g, n->args[0]), *ix = N(c->g, n->args[1]);
	int axis = norm_axis(n, x, 0);
	val *xv = tcpl_need_view(c, n->args[0]);
	if (!is_contig(xv, x)) {
		tcpl_err(c, id, "gather from a strided view is not lowered");
		return;
	}
	val *iv = tcpl_dm_view(c, n->args[1]);
	if (!is_contig(iv, ix)) {
		tcpl_err(c, id, "gather with a strided index list is not lowered");
		return;
	}
	tcpl_gather_to_output(c, id);
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int64_t groups = prod(x->shape, 0, axis), rows = x->shape[axis], row = prod(x->shape, axis + 1, x->rank);
	int64_t ni = ir_numel(ix);
	dma_gs(c, TCP_OP_DMA_GATHER, id, o, xv, iv, groups, ni, rows, row, rows * row, row, ni * row, row, 0, 1,
		tcpl_valid_reg(c, id), 0);
}

void tcpl_lower_take_along(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *x = N(c->g, n->args[0]), *ix = N(c->g, n->args[1]);
	int axis = norm_axis(n, x, -1);
	if (axis != x->rank - 1) {
		tcpl_err(c, id, "take_along is lowered along the last axis only");
		return;
	}
	val *xv = tcpl_need_view(c, n->args[0]);
	val *iv = tcpl_dm_view(c, n->args[1]);
	if (!is_contig(xv, x) || !is_contig(iv, ix)) {
		tcpl_err(c, id, "take_along of strided views is not lowered");
		return;
	}
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	int64_t groups = prod(x->shape, 0, axis), rows = x->shape[axis], k = ix->shape[ix->rank - 1];
	int vreg = tcpl_valid_reg(c, id); /* the mask counts leading rows (tokens) */
	int64_t per = x->rank > 2 && x->shape[0] > 0 ? groups / x->shape[0] : 1; /* groups per leading row */
	if (vreg >= 0 && per > 1) { /* [T, G, E] (DeepSeek's groups): n tokens are n x G groups */
		int r = tcpl_new_reg(c, id);
		alui(c, TCP_S_MUL, r, vreg, TCP_NOREG, per);
		vreg = r;
	}
	dma_gs(c, TCP_OP_DMA_GATHER, id, o, xv, iv, groups, k, rows, 1, rows, 1, k, 1, k, 1, vreg, TCP_F_VROWS);
}

void tcpl_lower_scatter(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *ix = N(c->g, n->args[1]);
	if (strcmp(ir_attr_str(n, "mode", "set"), "set")) {
		tcpl_lower_scatter_add(c, id);
		return;
	}
	if (c->ggrid[id] && tcpl_decode_scatter(c, id))
		return; /* a decode: the blocks read x's one row in place (lower_decode.c) */
	if (c->ggrid[id]) {
		/* dispatch by gather: row r of the grid is token rowlist[r] (0 for
		 * padding rows, which the block math masks) */
		const ir_node *xp = N(c->g, n->args[2]);
		int64_t rows = n->shape[0], ni = ir_numel(ix);
		ir_node rn = *n;
		rn.dtype = MOE_I32;
		rn.rank = 1;
		int vreg = tcpl_valid_reg(c, id);
		/* without a serving count, each index is an 8-byte row (token, 0): a
		 * DM write aligned to dm_alignment_bytes, where a 4-byte one is a
		 * read-modify-write (A16); the block gathers read every other word */
		int64_t w = vreg < 0 && c->m->dm_align == 8 ? 2 : 1, wrows = rows * w;
		int32_t t = tcpl_dm_tensor(c, id, "grid_rows", MOE_I32, 1, &wrows);
		c->v[id] = tview(t, id, &rn);
		c->v[id].stride[0] = w;
		val *iv = tcpl_dm_view(c, n->args[1]);
		val *tv = tcpl_dm_view(c, xp->args[1]);
		if (!is_contig(iv, ix) || !is_contig(tv, N(c->g, xp->args[1]))) {
			tcpl_err(c, id, "dispatch by gather with a strided index list is not lowered");
			return;
		}
		if (vreg >= 0) { /* serving: one index per group, the count limits the groups (tiled) */
			dma_gs(c, TCP_OP_DMA_SCATTER, id, &c->v[id], tv, iv, ni, 1, rows, 1, 1, 1, 0, 1, 1, 1, vreg, TCP_F_VROWS);
			return;
		}
		val src = *tv;
		if (w == 2) { /* the tokens as the first words of 8-byte rows: one copy pass */
			int64_t n2 = ni * 2;
			src.t = tcpl_dm_tensor(c, id, "grid_src", MOE_I32, 1, &n2);
			src.base = 0;
			tcp_insn in = tcp_insn_init(TCP_OP_TU_VEC);
			in.ndim = 1;
			in.dim[0] = ni;
			in.v[TCP_V_DST].t = src.t;
			in.v[TCP_V_DST].stride[0] = 2;
			in.v[TCP_V_S0].t = tv->t;
			in.v[TCP_V_S0].base = tv->base;
			in.v[TCP_V_S0].stride[0] = 1;
			emit(c, &in);
			tcpl_pairs_alloc(c, id, src.t, ni, t); /* each pair's index as the second word (lower_pairs.c) */
		}
		dma_gs(c, TCP_OP_DMA_SCATTER, id, &c->v[id], &src, iv, 1, ni, rows, w, ni * w, w, rows * w, w, 0, 1, -1, 0);
		if (w == 2) /* its last reader, as tok's (release) */
			tcpl_dm_free(c, src.t);
		return;
	}
	val *bv = &c->v[n->args[0]];
	bool zero_base = bv->kind == VK_IMM && bv->imm == 0;
	val *o = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	const ir_node *gn = N(c->g, n->args[2]);
	if (gn->op == MOE_OP_GATHER && c->fused_into[n->args[2]] == id && zero_base) {
		/* token-major pairs (lower_quant.c w8a8_direct): pair t K + k is
		 * src's row t, read in place K times */
		const ir_node *src = N(c->g, gn->args[0]);
		val *iv = tcpl_dm_view(c, n->args[1]);
		val *xv = tcpl_dm_view(c, gn->args[0]);
		int64_t T = src->shape[0], row = src->shape[1], ni = ir_numel(ix), K = T > 0 ? ni / T : 0;
		if (c->failed)
			return;
		if (!is_contig(iv, ix) || !is_contig(xv, src) || K * T != ni || row != prod(n->shape, 1, n->rank)) {
			tcpl_err(c, id, "the dispatch of token-major rows reads a strided view");
			return;
		}
		dma_gs(c, TCP_OP_DMA_SCATTER, id, o, xv, iv, T, K, n->shape[0], row, row, 0, 0, row, K, 1, -1, 0);
		return;
	}
	if (!zero_base) {
		bv = tcpl_need_view(c, n->args[0]);
		if (!is_contig(bv, N(c->g, n->args[0]))) {
			tcpl_err(c, id, "scatter into a strided base is not lowered");
			return;
		}
		dma_copy(c, o->t, 0, -1, 0, bv->t, bv->base, -1, 0, ir_numel(n));
	}
	/* zero base: fresh tensors start zeroed (docs/tcp-isa.md, assumption A7) */
	val *iv = tcpl_dm_view(c, n->args[1]);
	val *sv = tcpl_need_view(c, n->args[2]);
	int64_t rows = n->shape[0], row = prod(n->shape, 1, n->rank), ni = ir_numel(ix);
	int vreg = tcpl_valid_reg(c, id);
	if (vreg >= 0) /* one index per group, the count limits the groups (tiled) */
		dma_gs(c, TCP_OP_DMA_SCATTER, id, o, sv, iv, ni, 1, rows, row, row, row, 0, row, 1, 1, vreg, TCP_F_VROWS);
	else
		dma_gs(c, TCP_OP_DMA_SCATTER, id, o, sv, iv, 1, ni, rows, row, ni * row, row, rows * row, row, 0, 1, -1, 0);
}

/* A reshape that only adds or drops dimensions of size 1 keeps the strides. */
static bool squeeze_view(const val *sv, const ir_node *s, const ir_node *n, val *v)
{
	int j = 0;
	for (int i = 0; i < n->rank; i++) {
		if (n->shape[i] == 1) {
			v->stride[i] = 0;
			continue;
		}
		while (j < s->rank && s->shape[j] == 1)
			j++;
		if (j >= s->rank || s->shape[j] != n->shape[i])
			return false;
		v->stride[i] = sv->stride[j++];
	}
	while (j < s->rank && s->shape[j] == 1)
		j++;
	return j == s->rank;
}

void tcpl_lower_view_op(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	val *sv = &c->v[n->args[0]];
	if (n->args[0] == c->pr_node && c->pr_t >= 0) {
		c->v[id].kind = VK_NONE; /* the grid's rows: its gathers read the pair-order rows (lower_pairs.c) */
		return;
	}
	if (sv->kind == VK_IMM) {
		c->v[id] = *sv;
		return;
	}
	if (sv->kind == VK_IOTA && n->op != MOE_OP_BROADCAST)
		sv = tcpl_need_view(c, n->args[0]);
	if (sv->kind == VK_IOTA) { /* broadcast keeps trailing alignment */
		c->v[id] = *sv;
		c->v[id].axis = sv->axis + (n->rank - s->rank);
		return;
	}
	val v = *sv;
	switch ((moe_op)n->op) {
	case MOE_OP_RESHAPE:
		if (is_contig(sv, s)) {
			contiguous(n->shape, n->rank, v.stride);
			break;
		}
		if (!squeeze_view(sv, s, n, &v)) {
			/* copy into a contiguous tensor, then view that */
			val *cv = tcpl_copy_contig(c, n->args[0]);
			v = *cv;
			contiguous(n->shape, n->rank, v.stride);
		}
		break;
	case MOE_OP_SLICE: {
		int axis = norm_axis(n, s, 0);
		int64_t start = ir_attr_int(n, "start", 0), step = ir_attr_int(n, "step", 1);
		if (start < 0)
			start += s->shape[axis];
		v.base += start * sv->stride[axis];
		v.stride[axis] = sv->stride[axis] * step;
		break;
	}
	case MOE_OP_BROADCAST: {
		int off = n->rank - s->rank;
		for (int k = n->rank - 1; k >= 0; k--) {
			int d = k - off;
			v.stride[k] = d >= 0 && s->shape[d] > 1 ? sv->stride[d] : 0;
		}
		break;
	}
	default: break;
	}
	v.owner = sv->owner;
	c->v[id] = v;
}
