/* backend-tcp/lower_decode.c: TCP lowering of a decode's block rows
 * (docs/tcp-isa.md 7.4, "A decode's block rows").
 *
 * Under dispatch by gather (lower_fuse.c, tcpl_mark_ggrid) every block
 * gathers its rows of x by the grid's token list: one `dma.gather` per
 * block, each a descriptor on the DMA context between two experts' weight
 * streams (its issue, its row overhead and its DM -> DM transfer). When x has
 * one row (T = 1), every grid row's token is 0, so the gathered rows are all
 * x's row 0 (padding rows read token 0 too, and the block math masks them).
 * The block then reads x's DM copy in place through a view whose row stride
 * is 0: no token list is scattered, no row is moved, and the contractions
 * stream the same values. */
#include "backend-tcp/lower_int.h"

/* The grid scatter `id` (dispatch by gather) of a layer whose x has one row,
 * no serving count, and x's value kept in DM through the loop (not the tail
 * in row chunks, which moves inputs back to HBM before the loop). */
static bool decode_rows(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *xp = N(c->g, n->args[2]);
	return c->ggrid[id] == id + 1 && !c->sink && n->valid == MOE_NONE && N(c->g, xp->args[0])->shape[0] == 1;
}

/* The grid scatter `id`: when the block rows are x's one row, its value is
 * a view of x's DM copy with row stride 0 (every grid row is row 0) and
 * nothing is emitted; false otherwise. */
bool tcpl_decode_scatter(lw *c, moe_id id)
{
	if (!decode_rows(c, id))
		return false;
	moe_id x = N(c->g, N(c->g, id)->args[2])->args[0];
	val *xv = tcpl_dm_view(c, x);
	if (c->failed || xv->kind != VK_VIEW)
		return false;
	val v = *xv;
	memset(v.stride, 0, sizeof v.stride);
	v.stride[N(c->g, id)->rank - 1] = xv->stride[N(c->g, x)->rank - 1];
	v.owner = x;
	c->v[id] = v;
	return true;
}

/* Whether grid value `id` (the scatter or a reshape of it) is such a view. */
bool tcpl_decode_view(const lw *c, moe_id id)
{
	return c->ggrid[id] && decode_rows(c, c->ggrid[id] - 1) && c->v[id].kind == VK_VIEW &&
	       c->p->t[c->v[id].t].dtype != MOE_I32;
}

/* A reshape of the grid: the same row-0 view at the reshape's rank. */
void tcpl_decode_reshape(lw *c, moe_id id)
{
	if (!tcpl_decode_view(c, id))
		return;
	const ir_node *n = N(c->g, id);
	int64_t inner = c->v[id].stride[N(c->g, n->args[0])->rank - 1];
	memset(c->v[id].stride, 0, sizeof c->v[id].stride);
	c->v[id].stride[n->rank - 1] = inner;
}

/* The block's view of such a grid value: the leading G dropped. */
val tcpl_decode_block_view(const lw *c, moe_id id)
{
	val v = c->v[id];
	const ir_node *n = N(c->g, id);
	for (int k = 0; k + 1 < n->rank; k++)
		v.stride[k] = v.stride[k + 1];
	v.stride[n->rank - 1] = 0;
	v.region = true; /* narrowed with the block's nodes; no offset per block */
	v.reg = R_IN;
	v.scale = 0;
	return v;
}
