/* backend-tcp/compiler/rw/count_stage.c: rewrite `count-stage`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * stage-rows copies the whole HBM dispatch grid into DM before the loop: one
 * [G, P] dma.copy (G the worst-case grid, P a block's elements, each block
 * starting a new round of DM's layout), on the
 * in-order DMA context between the dispatch and the first weight fetch. A
 * run executes nb <= G blocks, and block g's readers in the body read only
 * block g's rows of the DM copy, so the rows of blocks nb .. G - 1 are never
 * read. The rewrite turns that copy into a classes region keyed on $nb
 * (ts_split_on_nb): case h copies the first h blocks, the bounds every
 * ceil(G / 32) blocks, then G, as count-copies does for the copy of the
 * results after the loop. The copy now reads $nb, so $nb's ld moves up to
 * stand right before it: the ld waits for the block list's dma.spm, which
 * stands before the copy, and the control path stops there until the list
 * is staged, holding back whatever comes after it in program order (at a
 * small prefill the routing's last passes, which the list scheduler would
 * otherwise issue ahead); the row is taken only where the prediction gains
 * (ts_benefit_by_prediction). Values are unchanged: every row a body op
 * reads is copied. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct cs {
	ts_id op;       /* the staged copy */
	uint32_t at;    /* its item index in the top region */
	uint32_t ld;    /* $nb's item index in the top region */
} cs;

static bool find(const tcp_sched *s, cs *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	if (l->nb == TS_NONE || l->g == TS_NONE || l->G < 2)
		return false;
	const ts_scalar *nb = &s->sc[l->nb];
	if (nb->region != s->top || nb->kind != TS_SC_SPM_LD || nb->a != TS_NONE)
		return false;
	int64_t lp = ts_item_index(s, s->top, s->top, TS_ITEM_RG | l->region);
	int64_t ld = ts_item_index(s, s->top, s->top, TS_ITEM_SC | l->nb);
	if (lp < 0 || ld < 0)
		return false;
	for (ts_id o = 0; o < s->nop; o++) {
		const ts_op *p = &s->op[o];
		const tcp_insn *in = &p->in;
		const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0];
		if (p->region != s->top || in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->dim[0] != l->G ||
			in->vreg >= 0 || in->flags || d->t < 0 || y->t < 0 || d->reg >= 0 || y->reg >= 0 || d->base != 0 ||
			y->base != 0 || d->stride[0] < in->dim[1] || d->stride[1] != 1 || y->stride[0] != in->dim[1] ||
			y->stride[1] != 1 || s->buf[y->t].space != TCP_HBM || s->buf[d->t].space != TCP_DM ||
			s->buf[d->t].slots != 1 || ts_buf_numel(&s->buf[d->t]) != l->G * d->stride[0])
			continue;
		int64_t at = ts_op_index(s, s->top, o);
		uint8_t *skip = ctx_alloc(s->ctx, s->nop + 1);
		memset(skip, 0, s->nop + 1);
		skip[o] = 1;
		bool per_block = at >= 0 && at <= lp && ts_buf_read_per_block(s, l, d->t, d->stride[0], skip);
		ctx_free(s->ctx, skip, 0);
		if (!per_block)
			continue;
		/* $nb's ld may stand before the copy only after the dma.spm staging
		 * what it reads */
		bool staged = false;
		for (int64_t k = 0; k < at && !staged; k++) {
			uint32_t it = s->rg[s->top].item[k];
			if (TS_ITEM_KIND(it) != TS_ITEM_OP)
				continue;
			const tcp_insn *q = &s->op[TS_ITEM_ID(it)].in;
			for (int v = TCP_V_S0; q->op == TCP_OP_DMA_SPM && v < TCP_NVIEW; v++)
				staged |= q->v[v].t >= 0 && (ts_id)q->v[v].t == nb->buf;
		}
		if (!staged)
			continue;
		x->op = o;
		x->at = (uint32_t)at;
		x->ld = (uint32_t)ld;
		return true;
	}
	return false;
}

bool ts_rw_count_stage_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	cs x;
	return find(s, &x);
}

moe_status ts_rw_count_stage_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	cs x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	ts_region *top = &s->rg[s->top];
	uint32_t at = x.at;
	if (x.ld > x.at) { /* the ld up to just before the copy */
		uint32_t it = top->item[x.ld];
		memmove(&top->item[x.at + 1], &top->item[x.at], (x.ld - x.at) * sizeof *top->item);
		top->item[x.at] = it;
		at = x.at + 1;
	}
	ts_split_on_nb(s, s->top, at, x.op, feature);
	return MOE_OK;
}
