/* backend-tcp/compiler/rw/count_copies.c: rewrite `count-copies`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * dm-results keeps the loop's results in a DM grid of G blocks and copies the
 * whole grid into the HBM result after the loop: one [G, P] dma.copy (G the
 * worst-case grid, P a block's elements; the DM grid's block stride may be
 * larger, each block starting a new round of DM's layout). A run executes only nb <= G blocks,
 * and the HBM result is read only by gathers of the pairs' grid positions,
 * each a row below its block's count (docs/tcp-isa.md 7.4), so the rows of
 * blocks nb .. G - 1 are never read. The rewrite turns each such copy (in the
 * epilogue or after the loop) into a classes region keyed on $nb
 * (ts_split_on_nb): case h copies the first h blocks' rows, the bounds every
 * ceil(G / 32) blocks, then G. Values are unchanged: every row a gather reads
 * is copied.
 *
 * stage-rows' copy of the dispatch grid into DM before the loop has the same
 * shape, but cut by $nb it must wait for $nb's ld, which waits for the block
 * list's dma.spm: the list scheduler can then no longer issue the routing's
 * last passes ahead of that ld, and at T <= 64 the layer loses more than the
 * cut saves (docs/tcp-compiler.md 5.2), so it is left whole. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { CC_MAX = 8 };

typedef struct cc {
	ts_id op[CC_MAX];
	uint32_t n;
} cc;

/* whether region r is a classes region keyed on scalar k, or stands in one */
static bool under_classes(const tcp_sched *s, ts_id r, ts_id k)
{
	for (int depth = 0; r < s->nrg && depth < 70; depth++, r = s->rg[r].parent)
		if (s->rg[r].kind == TS_RG_CLASSES && s->rg[r].pred == k)
			return true;
	return false;
}

static bool find(const tcp_sched *s, cc *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	if (l->nb == TS_NONE || l->g == TS_NONE || s->sc[l->nb].region != s->top || l->G < 2)
		return false;
	for (ts_id o = 0; o < s->nop; o++) {
		const ts_op *p = &s->op[o];
		const tcp_insn *in = &p->in;
		const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0];
		if (in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->dim[0] != l->G || in->vreg >= 0 || d->t < 0 ||
			y->t < 0 || d->reg >= 0 || y->reg >= 0 || d->base != 0 || y->base != 0 ||
			d->stride[0] != in->dim[1] || d->stride[1] != 1 || y->stride[0] < in->dim[1] || y->stride[1] != 1 ||
			ts_buf_numel(&s->buf[d->t]) < l->G * in->dim[1] || under_classes(s, p->region, l->nb))
			continue;
		bool top = p->region == s->top, epi = ts_region_within(s, p->region, l->epilogue);
		bool after = top && ts_op_index(s, s->top, o) > ts_item_index(s, s->top, s->top, TS_ITEM_RG | l->region);
		if (!(after || epi) || s->buf[y->t].space != TCP_DM || s->buf[d->t].space != TCP_HBM ||
			!ts_buf_gathered_only(s, d->t))
			continue;
		if (x->n == CC_MAX)
			return false;
		x->op[x->n++] = o;
	}
	return x->n > 0;
}

bool ts_rw_count_copies_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	cc x;
	return find(s, &x);
}

moe_status ts_rw_count_copies_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	cc x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	uint32_t done = 0;
	for (uint32_t k = 0; k < x.n; k++) {
		ts_id o = x.op[k], rg = s->op[o].region;
		int64_t at = ts_op_index(s, rg, o);
		if (at < 0)
			continue;
		ts_split_on_nb(s, rg, (uint32_t)at, o, feature);
		done++;
	}
	return done ? MOE_OK : MOE_ERR_UNSUPPORTED;
}
