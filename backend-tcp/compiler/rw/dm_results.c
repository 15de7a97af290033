/* backend-tcp/compiler/rw/dm_results.c: rewrite `dm-results`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * sched-build ends block g's body with a dma.copy of its value (a DM
 * buffer y) into row g of the loop's HBM result: one DMA command per block,
 * whose setup dominates when a block holds few rows and which the in-order
 * DMA context runs between the weight fetches. The rewrite gives the value
 * a DM grid of G rows: the body's ops that write or read y use row $g of
 * the grid instead, and the per-block copy becomes one copy of the whole
 * grid into the HBM result after the loop (the moved op, widened to the G
 * rows). Each row starts a new round of the flit-spread layout (a multiple
 * of slices x flit bytes), so row g lies on the slices y did. Values are
 * unchanged for every row of a block that ran: the grid's row g holds what
 * y held when block g's copy read it, and the copy after the loop waits
 * for the last block's writers. Rows of blocks past the run-time count hold
 * whatever the grid's DM held where before they held zeros; the combine
 * reads only the rows of routed pairs. Where defer-stores moved the store
 * (block g + 1 stores row g under a guard, the epilogue stores row nb - 1
 * under nb != 0), the body's copy goes to the epilogue's guard and copies
 * the whole grid there, and the epilogue's copy of the last row goes (the
 * whole grid holds that row; whatever waited for it waits for the grid's
 * copy); the body's guard is left empty. Where the grid does not fit DM the prediction's trial fails and
 * the row is not applied. */
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

/* The store of loop 0's value: the body's last item (fin TS_NONE), or, as
 * defer-stores leaves it, the only op of a guard in the body and the only
 * op of a guard in the epilogue (fin). */
typedef struct store {
	ts_id st, fin;
} store;

/* the only item of guard region rg when it is an op, else TS_NONE */
static ts_id lone_op(const tcp_sched *s, uint32_t item)
{
	if (TS_ITEM_KIND(item) != TS_ITEM_RG || s->rg[TS_ITEM_ID(item)].kind != TS_RG_GUARD)
		return TS_NONE;
	const ts_region *r = &s->rg[TS_ITEM_ID(item)];
	return r->nitem == 1 && TS_ITEM_KIND(r->item[0]) == TS_ITEM_OP ? TS_ITEM_ID(r->item[0]) : TS_NONE;
}

/* whether op st is a dma.copy of the whole of a one-slot flit-spread DM
 * buffer into the contiguous row (moved by a scalar, row g when g) of an
 * HBM buffer of G rows of it */
static bool store_form(const tcp_sched *s, ts_id st, bool g)
{
	const ts_loop *l = &s->loop[0];
	const tcp_insn *in = &s->op[st].in;
	const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->ndim != 1 || d->t < 0 || y->t < 0 || d->reg < 0 ||
		(g && (ts_id)d->reg != l->g) || y->reg >= 0 || in->vreg >= 0 || y->base != 0 || y->stride[0] != 1 ||
		d->stride[0] != 1)
		return false;
	const ts_buf *r = &s->buf[d->t], *yb = &s->buf[y->t];
	int64_t n = in->dim[0];
	return r->space == TCP_HBM && r->kind == TCP_T_SCRATCH && yb->space == TCP_DM && yb->slots == 1 &&
	       yb->kind == TCP_T_SCRATCH && yb->dtype == r->dtype && ts_buf_numel(yb) == n && d->scale == n && d->base == 0 &&
	       ts_buf_numel(r) == l->G * n && yb->layout.split == TS_SPLIT_FLIT && yb->layout.copies == 1 &&
	       yb->layout.slice0 == 0 && yb->layout.nslices >= 1;
}

/* The store (x->st TS_NONE when none): its value read and written only by
 * body ops through views that no scalar moves, its HBM buffer written by no
 * other op and read by no body op. */
static bool store_of(const tcp_sched *s, store *x)
{
	x->st = x->fin = TS_NONE;
	if (s->nloop != 1 || !s->m || s->loop[0].G < 2)
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_region *b = &s->rg[l->body], *ep = &s->rg[l->epilogue];
	if (!b->nitem)
		return false;
	uint32_t last = b->item[b->nitem - 1];
	if (TS_ITEM_KIND(last) == TS_ITEM_OP && store_form(s, TS_ITEM_ID(last), true))
		x->st = TS_ITEM_ID(last);
	else {
		for (uint32_t k = 0; k < ep->nitem && x->fin == TS_NONE; k++)
			x->fin = lone_op(s, ep->item[k]);
		for (uint32_t k = 0; k < b->nitem && x->fin != TS_NONE && x->st == TS_NONE; k++) {
			ts_id o = lone_op(s, b->item[k]);
			if (o != TS_NONE && store_form(s, o, false) &&
				s->op[o].in.v[TCP_V_DST].t == s->op[x->fin].in.v[TCP_V_DST].t &&
				s->op[o].in.v[TCP_V_S0].t == s->op[x->fin].in.v[TCP_V_S0].t)
				x->st = o;
		}
		if (x->st == TS_NONE || !store_form(s, x->fin, false))
			return false;
	}
	const tcp_insn *in = &s->op[x->st].in;
	int32_t rt = in->v[TCP_V_DST].t, yt = in->v[TCP_V_S0].t;
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == x->st || o == x->fin)
			continue;
		const tcp_insn *oi = &s->op[o].in;
		bool body = ts_region_within(s, s->op[o].region, l->body);
		for (int w = 0; w < TCP_NVIEW; w++) {
			if (oi->v[w].t == rt && (w == TCP_V_DST || body))
				return false;
			if (oi->v[w].t == yt && (!body || oi->v[w].reg >= 0))
				return false;
		}
	}
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD && (s->sc[c].buf == (ts_id)rt || s->sc[c].buf == (ts_id)yt))
			return false;
	return true;
}

bool ts_rw_dm_results_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	store x;
	return store_of(s, &x);
}

/* op o copies rows [r0, r0 + nr) of grid gb (row stride np) into rows of n of rb */
static void grid_copy(tcp_sched *s, ts_id o, ts_id gb, ts_id rb, int64_t r0, int64_t nr, int64_t n, int64_t np,
	uint16_t feature)
{
	ts_op *x = &s->op[o];
	x->feature = feature;
	x->in.ndim = 2;
	x->in.dim[0] = nr;
	x->in.dim[1] = n;
	x->in.v[TCP_V_DST] = tcp_b_view((int32_t)rb, r0 * n, 2, (const int64_t[]){n, 1});
	x->in.v[TCP_V_S0] = tcp_b_view((int32_t)gb, r0 * np, 2, (const int64_t[]){np, 1});
	for (uint32_t j = 0; j < x->ndep; j++)
		x->dist[j] = 0;
}

/* removes item from region rg */
static void drop_item(tcp_sched *s, ts_id rg, uint32_t item)
{
	ts_region *r = &s->rg[rg];
	uint32_t k = 0;
	while (k < r->nitem && r->item[k] != item)
		k++;
	if (k < r->nitem) {
		memmove(r->item + k, r->item + k + 1, (r->nitem - k - 1) * sizeof *r->item);
		r->nitem--;
	}
}

moe_status ts_rw_dm_results_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	store x;
	if (!store_of(s, &x))
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	ts_id body = l->body, lrg = l->region, parent = s->rg[lrg].parent, g = l->g, st = x.st, fin = x.fin;
	ts_id rb = (ts_id)s->op[st].in.v[TCP_V_DST].t, yb = (ts_id)s->op[st].in.v[TCP_V_S0].t;
	int64_t n = s->op[st].in.dim[0], G = l->G;
	/* the grid: row g at element g * np */
	ts_layout lay = s->buf[yb].layout;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)s->buf[yb].dtype);
	int64_t round = (int64_t)lay.nslices * s->m->flit_bytes, np = (n * es + round - 1) / round * round / es;
	char name[160];
	snprintf(name, sizeof name, "%.*s.grid", 140, s->buf[yb].name);
	int64_t shape[2] = {G, np};
	ts_id gb = ts_add_buf(s, name, TCP_DM, TCP_T_SCRATCH, (moe_dtype)s->buf[yb].dtype, 2, shape);
	lay.slice_bytes = G * np * es / lay.nslices;
	s->buf[gb].layout = lay;
	s->buf[gb].feature = feature;
	s->buf[gb].node = s->buf[yb].node;
	ts_id out = fin;
	if (fin == TS_NONE) { /* the store leaves the body for the loop's parent, just after the loop */
		drop_item(s, body, TS_ITEM_OP | st);
		ts_region_push(s, parent, TS_ITEM_OP | st);
		ts_region *p = &s->rg[parent];
		uint32_t at = 0;
		while (at < p->nitem && p->item[at] != (TS_ITEM_RG | lrg))
			at++;
		memmove(p->item + at + 2, p->item + at + 1, (p->nitem - 2 - at) * sizeof *p->item);
		p->item[at + 1] = TS_ITEM_OP | st;
		s->op[st].region = parent;
		grid_copy(s, st, gb, rb, 0, G, n, np, feature);
		out = st;
	} else { /* the body's store into the epilogue's guard, copying the whole grid; the last row's goes */
		ts_id eg = s->op[fin].region;
		drop_item(s, s->op[st].region, TS_ITEM_OP | st);
		ts_region_push(s, eg, TS_ITEM_OP | st);
		ts_region *r = &s->rg[eg];
		memmove(r->item + 1, r->item, (r->nitem - 1) * sizeof *r->item);
		r->item[0] = TS_ITEM_OP | st;
		s->op[st].region = eg;
		grid_copy(s, st, gb, rb, 0, G, n, np, feature);
		for (uint32_t j = 0; j < s->op[fin].ndep; j++)
			if (s->op[fin].dep[j] != st)
				ts_add_dep_once(s, st, s->op[fin].dep[j], s->op[fin].dist[j]);
		for (ts_id q = 0; q < s->nop; q++)
			for (uint32_t j = 0; q != st && q != fin && j < s->op[q].ndep; j++)
				if (s->op[q].dep[j] == fin)
					ts_add_dep_once(s, q, st, s->op[q].dist[j]);
		out = st;
	}
	/* the body writes and reads row g of the grid; nothing in it waits for a store */
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == st || q == fin)
			continue;
		ts_op *o = &s->op[q];
		for (int w = 0; w < TCP_NVIEW; w++)
			if (o->in.v[w].t == (int32_t)yb) {
				o->in.v[w].t = (int32_t)gb;
				o->in.v[w].reg = (int32_t)g;
				o->in.v[w].scale = np;
			}
		if (!ts_region_within(s, o->region, body))
			continue;
		uint32_t keep = 0;
		for (uint32_t j = 0; j < o->ndep; j++)
			if (o->dep[j] != st && o->dep[j] != fin) {
				o->dep[keep] = o->dep[j];
				o->dist[keep++] = o->dist[j];
			}
		o->ndep = keep;
	}
	/* y is read by nothing now: live only at the copy */
	s->buf[yb].life = TS_LIFE_SPAN;
	s->buf[yb].first = s->buf[yb].last = out;
	ts_buf *gr = &s->buf[gb];
	gr->life = TS_LIFE_SPAN;
	gr->first = TS_NONE;
	for (ts_id q = 0; q < s->nop && gr->first == TS_NONE; q++)
		for (int w = 0; w < TCP_NVIEW; w++)
			if (q != st && q != fin && s->op[q].in.v[w].t == (int32_t)gb)
				gr->first = q;
	gr->last = out;
	if (gr->first == TS_NONE)
		gr->first = st;
	if (fin != TS_NONE) {
		uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
		memset(drop, 0, s->nop + 1);
		drop[fin] = 1;
		ts_drop_ops(s, drop);
		ctx_free(s->ctx, drop, 0);
	}
	return MOE_OK;
}
