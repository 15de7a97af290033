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
#include <math.h>

#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

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

/* Whether every reader of id, through reshapes, is an elementwise vector
 * pass outside the loop (which reads lane words whatever the tensor type). */
static bool vector_readers(const lw *c, moe_id id, int depth)
{
	const moe_graph *g = c->g;
	for (moe_id u = id + 1; u < g->nnodes; u++) {
		const ir_node *un = N(g, u);
		bool reads = false;
		for (uint32_t k = 0; k < un->nargs; k++)
			reads |= un->args[k] == id;
		if (un->valid == id)
			return false;
		if (!reads)
			continue;
		if (c->inreg[u])
			return false;
		if (un->op == MOE_OP_RESHAPE && depth < 4 && vector_readers(c, u, depth + 1))
			continue;
		if (!(ir_ops[un->op].flags & OPF_ELEM) || (ir_ops[un->op].flags & OPF_LEAF) || un->op == MOE_OP_BITCAST ||
			un->op == MOE_OP_CAST)
			return false;
	}
	return !c->is_out[id];
}

/* bitcast(select(ne(f, f), NaN, f), i32), top-k's key of a softmax score
 * (passes/lower_topk.c: NaN made +qNaN, no sign to fix), one chained pass
 * (lower_fuse.c): f's last pass divides, and a float ALU returns the
 * canonical NaN 0x7fc00000 (assumption A9), the select's constant, so the
 * key is f's lane words bit for bit. When only vector passes read the key,
 * it is a view of f: one vector pass less between the router and the first
 * expert fetch. */
bool tcpl_nan_key(const lw *c, moe_id id)
{
	const moe_graph *g = c->g;
	const ir_node *b = N(g, id);
	if (b->op != MOE_OP_BITCAST || b->dtype != MOE_I32 || c->inreg[id] || b->valid != MOE_NONE)
		return false;
	moe_id sel = b->args[0];
	const ir_node *n = N(g, sel);
	if (n->op != MOE_OP_SELECT || n->nargs != 3 || n->valid != MOE_NONE || n->dtype != MOE_F32 ||
		c->fused_into[sel] != id)
		return false;
	const ir_node *ne = N(g, n->args[0]), *k = N(g, n->args[1]), *f = N(g, n->args[2]);
	if (ne->op != MOE_OP_NE || ne->args[0] != n->args[2] || ne->args[1] != n->args[2] ||
		c->fused_into[n->args[0]] != id || k->op != MOE_OP_CONST || k->rank != 0 ||
		!isnan(ir_attr_float(k, "value", 0.0)))
		return false;
	return f->op == MOE_OP_SOFTMAX && f->dtype == MOE_F32 && f->valid == MOE_NONE && f->rank == b->rank &&
	       !memcmp(f->shape, b->shape, sizeof(int64_t) * b->rank) && !c->inreg[n->args[2]] &&
	       vector_readers(c, id, 0);
}

/* The softmax whose lane words such a key is. */
moe_id tcpl_nan_key_src(const lw *c, moe_id id)
{
	return N(c->g, N(c->g, id)->args[0])->args[2];
}

/* The first block's expert weights in a loop of a compile-time block count
 * (a decode): a `dma.gather` of one row, expert list entry 0, instead of a
 * `dma.copy` addressed by the register that `ld` reads from SPM. The copy
 * waits for the `dma.spm` staging (its setup and issue) before its own
 * setup can start; the gather's index list is the DM expert list itself, so
 * its descriptor (setup, issue) starts as soon as top-k wrote that list, beside
 * the staging (it joins the staging's list), and only its transfer follows
 * the staging's. The bytes, packets and engines are the copy's (a gather
 * row of n elements is split into packets like a copy's run); one row, no
 * row overhead. The loop's control still reads the expert from SPM. */
void tcpl_decode_first_fetch(lw *c, int32_t buf, int64_t n, moe_id w, int32_t tbe, int64_t bebase, int64_t bes)
{
	const val *sv = &c->v[w];
	int64_t ne = ir_numel(N(c->g, w)) / n; /* the experts: the weight is [E, n] as the copy read it */
	const int64_t gdim[3] = {1, 1, n}, dst[3] = {n, n, 1}, src[3] = {ne * n, n, 1}, ist[2] = {bes, bes};
	/* dst: slot 0 (the prologue's R_SLOT); index: block 0's expert */
	tcp_insn in = tcp_b_dma_gather(3, gdim, tcp_b_view(buf, 0, 3, dst), tcp_b_view(sv->t, sv->base, 3, src),
		tcp_b_view(tbe, bebase, 2, ist), ne);
	emit(c, &in);
}
