/* backend-tcp/compiler/rw/stage_rows.c: rewrite `stage-rows`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * sched-build copies each block's rows (a `b` operand of the loop held in
 * HBM, the dispatch grid) into a one-row DM buffer at the top of the body:
 * one DMA command per block, whose setup (dma.setup_cycles) dominates when
 * a block holds few rows (a decode's one row, a small prefill's blocks) and
 * which the in-order DMA context runs between the weight fetches. The
 * rewrite copies the whole operand, every block's rows, into a DM buffer
 * once before the loop (that copy is the moved op: block 0's copy widened to
 * the G blocks), and the body's readers read block g's rows of it in place
 * (their views moved by $g). Each block's rows start a new round of the
 * flit-spread layout (a multiple of slices x flit bytes), so block g's rows
 * lie on the slices the one-row buffer's did. Values are unchanged: each reader sees the
 * same bytes (the operand is written before the loop and by nothing in
 * it); the copy keeps its dependencies on the operand's writers, and the
 * body's readers, which waited for the block's copy, wait for it. The DM
 * buffer is one more demand on the placement: where it does not fit, the
 * prediction's trial fails and the row is not applied. */
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

/* The body's copy of block g's rows, or TS_NONE: a top-level dma.copy of
 * the contiguous rows [g * n, (g + 1) * n) of an HBM scratch buffer that no
 * op in the loop writes and no ld reads, into the whole of a one-slot DM
 * buffer that only the body reads besides it, through views that no scalar
 * moves. */
static ts_id copy_of(const tcp_sched *s)
{
	if (s->nloop != 1)
		return TS_NONE;
	const ts_loop *l = &s->loop[0];
	const ts_region *b = &s->rg[l->body];
	for (uint32_t k = 0; k < b->nitem; k++) {
		if (TS_ITEM_KIND(b->item[k]) != TS_ITEM_OP)
			continue;
		ts_id c = TS_ITEM_ID(b->item[k]);
		const tcp_insn *in = &s->op[c].in;
		const tcp_view *d = &in->v[TCP_V_DST], *v = &in->v[TCP_V_S0];
		if (in->op != TCP_OP_DMA_COPY || d->t < 0 || v->t < 0 || v->reg < 0 || (ts_id)v->reg != l->g || d->reg >= 0 ||
			in->vreg >= 0 || d->base != 0 || d->t == v->t)
			continue;
		const ts_buf *h = &s->buf[v->t], *r = &s->buf[d->t];
		int64_t n = ts_insn_numel(in);
		if (h->space != TCP_HBM || h->kind != TCP_T_SCRATCH || r->space != TCP_DM || r->slots != 1 ||
			r->layout.split != TS_SPLIT_FLIT || r->layout.copies != 1 || r->layout.slice0 != 0 ||
			r->layout.nslices < 1 ||
			r->kind != TCP_T_SCRATCH || r->dtype != h->dtype || ts_buf_numel(r) != n || v->scale != n ||
			ts_buf_numel(h) % n || !ts_view_contiguous(v, in->ndim, in->dim) || !ts_view_contiguous(d, in->ndim, in->dim) ||
			ts_buf_numel(h) / n < l->G)
			continue;
		bool ok = true;
		for (ts_id o = 0; o < s->nop && ok; o++) {
			if (o == c)
				continue;
			const tcp_insn *oi = &s->op[o].in;
			bool body = ts_region_within(s, s->op[o].region, l->body);
			for (int w = 0; w < TCP_NVIEW && ok; w++) {
				if (oi->v[w].t == v->t && w == TCP_V_DST && ts_region_within(s, s->op[o].region, l->region))
					ok = false;
				if (oi->v[w].t == d->t && (w == TCP_V_DST || !body || oi->v[w].reg >= 0))
					ok = false;
			}
		}
		for (ts_id q = 0; q < s->nsc && ok; q++)
			if (s->sc[q].kind == TS_SC_SPM_LD && (s->sc[q].buf == (ts_id)d->t || s->sc[q].buf == (ts_id)v->t))
				ok = false;
		if (ok)
			return c;
	}
	return TS_NONE;
}

bool ts_rw_stage_rows_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	return s->m && copy_of(s) != TS_NONE;
}

moe_status ts_rw_stage_rows_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	ts_id c = copy_of(s);
	if (c == TS_NONE)
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	ts_id body = l->body, lrg = l->region, parent = s->rg[lrg].parent, g = l->g;
	tcp_insn in = s->op[c].in;
	ts_id hb = (ts_id)in.v[TCP_V_S0].t, rb = (ts_id)in.v[TCP_V_DST].t;
	int64_t n = ts_insn_numel(&in), G = l->G;
	/* the staged copy of every block's rows, block g's at element g * np */
	const ts_buf *h = &s->buf[hb];
	ts_layout lay = s->buf[rb].layout;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)h->dtype), round = (int64_t)lay.nslices * s->m->flit_bytes;
	int64_t np = (n * es + round - 1) / round * round / es;
	char name[160];
	snprintf(name, sizeof name, "%.*s.staged", 140, h->name);
	int64_t shape[2] = {G, np};
	ts_id st = ts_add_buf(s, name, TCP_DM, TCP_T_SCRATCH, (moe_dtype)h->dtype, 2, shape);
	ts_buf *sb = &s->buf[st];
	lay.slice_bytes = G * np * es / lay.nslices;
	sb->layout = lay;
	sb->feature = feature;
	sb->node = s->buf[rb].node;
	/* the copy leaves the body for the loop's parent, just before the loop */
	ts_region *b = &s->rg[body];
	uint32_t k = 0;
	while (k < b->nitem && b->item[k] != (TS_ITEM_OP | c))
		k++;
	memmove(b->item + k, b->item + k + 1, (b->nitem - k - 1) * sizeof *b->item);
	b->nitem--;
	ts_region_push(s, parent, TS_ITEM_OP | c);
	ts_region *p = &s->rg[parent];
	uint32_t at = 0;
	while (at < p->nitem && p->item[at] != (TS_ITEM_RG | lrg))
		at++;
	memmove(p->item + at + 1, p->item + at, (p->nitem - 1 - at) * sizeof *p->item);
	p->item[at] = TS_ITEM_OP | c;
	/* widened to the G blocks: dims [G, n], block g's n elements at g * n
	 * in the operand and at g * np in the staged buffer */
	ts_op *o = &s->op[c];
	o->region = parent;
	o->feature = feature;
	int64_t src_base = o->in.v[TCP_V_S0].base;
	o->in.ndim = 2;
	o->in.dim[0] = G;
	o->in.dim[1] = n;
	o->in.v[TCP_V_S0] = tcp_b_view((int32_t)hb, src_base, 2, (const int64_t[]){n, 1});
	o->in.v[TCP_V_DST] = tcp_b_view((int32_t)st, 0, 2, (const int64_t[]){np, 1});
	uint32_t keep = 0; /* its dependencies inside the loop (distance 1) go */
	for (uint32_t j = 0; j < o->ndep; j++)
		if (!ts_region_within(s, s->op[o->dep[j]].region, lrg)) {
			o->dep[keep] = o->dep[j];
			o->dist[keep++] = o->dist[j];
		}
	o->ndep = keep;
	/* the body reads block g's rows in place */
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == c)
			continue;
		ts_op *x = &s->op[q];
		for (int w = 0; w < TCP_NVIEW; w++)
			if (x->in.v[w].t == (int32_t)rb) {
				x->in.v[w].t = (int32_t)st;
				x->in.v[w].reg = (int32_t)g;
				x->in.v[w].scale = np;
			}
		for (uint32_t j = 0; j < x->ndep; j++)
			if (x->dep[j] == c)
				x->dist[j] = 0;
	}
	/* the one-row buffer is read by nothing now: live only at the copy */
	s->buf[rb].life = TS_LIFE_SPAN;
	s->buf[rb].first = s->buf[rb].last = c;
	sb = &s->buf[st];
	sb->life = TS_LIFE_SPAN;
	sb->first = sb->last = c;
	for (ts_id q = 0; q < s->nop; q++)
		for (int w = 0; w < TCP_NVIEW; w++)
			if (q != c && s->op[q].in.v[w].t == (int32_t)st)
				sb->last = q;
	return MOE_OK;
}
