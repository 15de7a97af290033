/* backend-tcp/compiler/rw/group_fetch.c: rewrite `group-fetch`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With double weights every block fetches its expert's weights with one DMA
 * command per packed operand, and the DMA context pays dma.setup_cycles for
 * each, serially: 0.5 us per expert, about 8% of a 9.4 MB expert's fetch.
 * Where every block holds a distinct expert (B >= T: an expert's count is at
 * most T, so it fits one block; SEMANTICS section 5), the block list itself
 * names the experts in fetch order, and one `dma.gather` by that list moves k
 * experts' rows for one setup. The rewrite makes each slot of the two-slot
 * buffer hold a group of k experts (k a power of two, picked by trials):
 *   - the prologue gathers blocks 0..k-1's experts into half 0 (valid
 *     min(k, nb) indices: later rows are not moved);
 *   - block g reads entry g & (2k - 1) ($slot, which was g & 1; its scale
 *     one expert's rows), in half (g / k) & 1;
 *   - the prefetch, once per group (g & (k - 1) == 0), gathers blocks
 *     g + k .. g + 2k - 1's experts into the other half under g + k < nb
 *     (valid min(k, nb - g - k)); its guard's next block index is g + k,
 *     and the next block's expert and slot, read by the copies alone, go
 *     (and block 0's expert where the prologue's copies alone read it).
 * The block list is padded by k entries so the gather's index view (k
 * entries from g + k) stays inside it; the entries past nb are never used.
 * Values are unchanged: each block reads its expert's rows, written by the
 * gather of its group, which waits for the previous group's reads of that
 * half (its distance-1 dependencies on the previous block's reads) and
 * which those reads wait for (theirs on the prefetch, and on the prologue's
 * gather). A group's first block waits for the whole group (k fetches), and
 * after the last gather the last group's blocks compute while the DMA
 * context idles, so larger k saves setups and lengthens the tail: the
 * trials (placed and predicted) pick k, and a buffer that no longer fits DM
 * fails its trial.
 *
 * Applies to one block loop with double weights, prefetch 1 and the
 * experts read from a staged list, after the other structural rewrites:
 * its operands each fetched whole (a row of a packed HBM buffer into a
 * rank-1 slot) by a prologue copy at the list's first entry and by a
 * prefetch copy at the next block's, the slot register used only by views
 * inside one slot of those buffers. */
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

enum { GF_MAX = 4, GF_KMAX = 16 };

typedef struct gf {
	ts_id gd;            /* the prefetch guard */
	ts_id gnext, more;   /* its next block index and predicate */
	ts_id slot, e0, list;
	ts_id enext, nslot;  /* the prefetch copies' source and destination registers */
	uint32_t n;
	ts_id w[GF_MAX], h[GF_MAX], pro[GF_MAX], pf[GF_MAX];
	int64_t numel[GF_MAX], rows[GF_MAX];
} gf;

static bool is_next(const tcp_sched *s, ts_id x, ts_id g)
{
	const ts_scalar *c = x < s->nsc ? &s->sc[x] : NULL;
	return c && c->kind == TS_SC_ALU && c->op == TCP_S_ADD && c->a == g && c->b == TS_NONE && c->imm == 1;
}

/* Whether op o copies a whole n-element slot of w from row `reg` of an HBM
 * buffer (*h: that buffer, fixed by the first call), with dst register dreg
 * (TS_NONE: a fixed view of slot 0). */
static bool whole_fetch(const tcp_sched *s, ts_id o, ts_id w, int64_t n, ts_id reg, ts_id dreg, ts_id *h)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *v = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->vreg >= 0 || (in->flags & TCP_F_JOIN) || in->v[TCP_V_S1].t >= 0 ||
		d->t < 0 || (ts_id)d->t != w || d->base != 0 || v->t < 0 || v->base != 0 || v->reg < 0 ||
		(ts_id)v->reg != reg || v->scale != n || ts_insn_numel(in) != n ||
		!ts_view_contiguous(d, in->ndim, in->dim) || !ts_view_contiguous(v, in->ndim, in->dim))
		return false;
	if (dreg == TS_NONE ? d->reg >= 0 : d->reg < 0 || (ts_id)d->reg != dreg || d->scale != n)
		return false;
	const ts_buf *hb = &s->buf[v->t];
	if (hb->space != TCP_HBM || (*h != TS_NONE && (ts_id)v->t != *h))
		return false;
	*h = (ts_id)v->t;
	return true;
}

/* The prefetch copies standing in guard gd into two-slot DM buffers from
 * the list's next entry, one source and one destination register for all;
 * false on any other op or a region. */
static bool prefetches(const tcp_sched *s, ts_id gd, ts_id enext_buf, gf *x)
{
	const ts_region *r = &s->rg[gd];
	for (uint32_t k = 0; k < r->nitem; k++) {
		uint32_t it = r->item[k];
		ts_id id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_RG)
			return false;
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		const tcp_insn *in = &s->op[id].in;
		const tcp_view *d = &in->v[TCP_V_DST], *v = &in->v[TCP_V_S0];
		if (x->n == GF_MAX || in->op != TCP_OP_DMA_COPY || d->t < 0 || d->reg < 0 || v->reg < 0)
			return false;
		const ts_scalar *en = &s->sc[v->reg];
		const ts_buf *b = &s->buf[d->t];
		if (en->kind != TS_SC_SPM_LD || en->buf != enext_buf || !is_next(s, en->a, s->loop[0].g) ||
			b->space != TCP_DM || b->slots != 2 || b->rank != 1 || b->life != TS_LIFE_LOOP)
			return false;
		ts_id h = TS_NONE;
		if (!whole_fetch(s, id, (ts_id)d->t, ts_buf_numel(b), (ts_id)v->reg, (ts_id)d->reg, &h) ||
			(x->n && (x->enext != (ts_id)v->reg || x->nslot != (ts_id)d->reg)))
			return false;
		x->enext = (ts_id)v->reg, x->nslot = (ts_id)d->reg;
		for (uint32_t j = 0; j < x->n; j++)
			if (x->w[j] == (ts_id)d->t)
				return false;
		x->w[x->n] = (ts_id)d->t;
		x->h[x->n] = h;
		x->pf[x->n] = id;
		x->numel[x->n] = ts_buf_numel(b);
		x->rows[x->n++] = ts_buf_numel(&s->buf[h]) / ts_buf_numel(b);
	}
	return true;
}

/* Whether a scalar other than but0 and but1, a predicate, a loop field or
 * (with ops) an op other than the prefetch copies of ops reads scalar id. */
static bool reads_but(const tcp_sched *s, ts_id id, const struct gf *ops, ts_id but0, ts_id but1)
{
	for (ts_id c = 0; c < s->nsc; c++)
		if (c != but0 && c != but1 && ts_scalar_reads(&s->sc[c], id))
			return true;
	for (ts_id r = 0; r < s->nrg; r++)
		if (ts_region_reads(&s->rg[r], id))
			return true;
	const ts_loop *l = &s->loop[0];
	if (l->nb == id || l->expert == id || l->rows == id || l->g == id)
		return true;
	for (ts_id o = 0; ops && o < s->nop; o++) {
		bool pf = false;
		for (uint32_t j = 0; j < ops->n; j++)
			pf |= o == ops->pf[j];
		if (!pf && ts_insn_reads(&s->op[o].in, id))
			return true;
	}
	return false;
}

static bool reads_scalar(const tcp_sched *s, ts_id id, const struct gf *ops)
{
	return reads_but(s, id, ops, TS_NONE, TS_NONE);
}

/* Whether every other use of the operands' buffers is a view moved by the
 * slot register inside one slot, the slot register moves nothing else and
 * the prefetch's registers serve only its copies; in the runs form
 * (slot_by), the slot is also read by scalars slot_by[0] and slot_by[1]
 * (same-expert's next slot and its loop variable) and the next expert by
 * slot_by[2] (its comparison with this block's). */
static bool reads_ok(const tcp_sched *s, const gf *x, const ts_id *slot_by)
{
	for (ts_id o = 0; o < s->nop; o++) {
		bool fetch = false;
		for (uint32_t j = 0; j < x->n; j++)
			fetch |= o == x->pro[j] || o == x->pf[j];
		const tcp_insn *in = &s->op[o].in;
		if (in->vreg >= 0 && (ts_id)in->vreg == x->slot)
			return false;
		for (int w = 0; w < TCP_NVIEW; w++) {
			const tcp_view *v = &in->v[w];
			if (v->t < 0)
				continue;
			int j = -1;
			for (uint32_t q = 0; q < x->n; q++)
				if ((ts_id)v->t == x->w[q])
					j = (int)q;
			bool by_slot = v->reg >= 0 && (ts_id)v->reg == x->slot;
			if (fetch && j >= 0 && w == TCP_V_DST)
				continue;
			if (j < 0 ? by_slot : (!by_slot || w == TCP_V_DST || v->scale != x->numel[j]))
				return false;
			if (j >= 0) {
				int64_t lo, hi;
				ts_view_span(in, v, &lo, &hi);
				if (lo < 0 || hi > x->numel[j])
					return false;
			}
		}
	}
	ts_id by0 = slot_by ? slot_by[0] : TS_NONE, by1 = slot_by ? slot_by[1] : TS_NONE;
	ts_id en = slot_by ? slot_by[2] : TS_NONE;
	return !reads_but(s, x->slot, NULL, by0, by1) && !reads_but(s, x->enext, x, en, TS_NONE) &&
	       !reads_scalar(s, x->nslot, x);
}

/* Whether scalar id is read only by $more, by what stands in the prefetch
 * guard gd and as gd's predicate (more): the guard's index can move. */
static bool only_in(const tcp_sched *s, ts_id id, ts_id gd, ts_id more)
{
	for (ts_id c = 0; c < s->nsc; c++)
		if (ts_scalar_reads(&s->sc[c], id) && c != more && !ts_region_within(s, s->sc[c].region, gd))
			return false;
	for (ts_id r = 0; r < s->nrg; r++)
		if (ts_region_reads(&s->rg[r], id) && !(r == gd && id == more) && !ts_region_within(s, r, gd))
			return false;
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_insn_reads(&s->op[o].in, id) && !ts_region_within(s, s->op[o].region, gd))
			return false;
	const ts_loop *l = &s->loop[0];
	return l->nb != id && l->expert != id && l->rows != id && l->g != id;
}

/* The loop and its expert list: one block loop with double weights,
 * prefetch 1 and each block's expert loaded from a staged DM list. */
static bool loop_ok(const tcp_sched *s, gf *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1 || s->meta.T < 1 || !s->m)
		return false;
	const ts_loop *l = &s->loop[0];
	if (l->weights != TS_W_DOUBLE || l->prefetch != 1 || l->expert == TS_NONE || l->G < 2 ||
		s->sc[l->expert].kind != TS_SC_SPM_LD || s->sc[l->expert].a != l->g || s->sc[l->expert].imm != 0)
		return false;
	x->list = s->sc[l->expert].buf;
	const ts_buf *lb = x->list < s->nbuf ? &s->buf[x->list] : NULL;
	return lb && lb->space == TCP_DM && ts_buf_numel(lb) >= l->G && lb->shape[lb->rank - 1] == ts_buf_numel(lb) &&
	       lb->dtype == MOE_I32 && lb->slots == 1 && lb->life == TS_LIFE_PROGRAM;
}

/* The prefetch guard: `g + 1 < nb`, a direct item of the body, its index
 * and predicate read nowhere else. */
static bool pf_guard(const tcp_sched *s, gf *x)
{
	const ts_loop *l = &s->loop[0];
	const ts_region *b = &s->rg[l->body];
	x->gd = TS_NONE;
	for (uint32_t k = 0; k < b->nitem && x->gd == TS_NONE; k++) {
		uint32_t it = b->item[k];
		const ts_region *g = &s->rg[TS_ITEM_ID(it)];
		if (TS_ITEM_KIND(it) != TS_ITEM_RG || g->kind != TS_RG_GUARD)
			continue;
		const ts_scalar *p = &s->sc[g->pred];
		if (p->kind == TS_SC_CMP && p->op == TCP_C_LT && p->b == l->nb && is_next(s, p->a, l->g) &&
			s->sc[p->a].region == l->body && p->region == l->body)
			x->gd = TS_ITEM_ID(it), x->gnext = p->a, x->more = g->pred;
	}
	return x->gd != TS_NONE && only_in(s, x->gnext, x->gd, x->more) && only_in(s, x->more, x->gd, x->more);
}

/* The prologue's copies at the list's first entry, one per operand. */
static bool pro_copies(const tcp_sched *s, gf *x)
{
	const ts_region *pro = &s->rg[s->loop[0].prologue];
	x->e0 = TS_NONE;
	for (uint32_t j = 0; j < x->n; j++) {
		x->pro[j] = TS_NONE;
		for (uint32_t k = 0; k < pro->nitem; k++) {
			uint32_t it = pro->item[k];
			ts_id o = TS_ITEM_ID(it), h = x->h[j];
			if (TS_ITEM_KIND(it) != TS_ITEM_OP || s->op[o].in.v[TCP_V_S0].reg < 0)
				continue;
			ts_id e0 = (ts_id)s->op[o].in.v[TCP_V_S0].reg;
			const ts_scalar *c = &s->sc[e0];
			if (c->kind == TS_SC_SPM_LD && c->buf == x->list && c->a == TS_NONE && c->imm == 0 &&
				(x->e0 == TS_NONE || x->e0 == e0) && whole_fetch(s, o, x->w[j], x->numel[j], e0, TS_NONE, &h))
				x->pro[j] = o, x->e0 = e0;
		}
		if (x->pro[j] == TS_NONE)
			return false;
	}
	return true;
}

/* The slot register: the one the first operand's readers use. */
static ts_id slot_reg(const tcp_sched *s, const gf *x)
{
	for (ts_id o = 0; o < s->nop; o++)
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
			if (s->op[o].in.v[w].t >= 0 && (ts_id)s->op[o].in.v[w].t == x->w[0] && s->op[o].in.v[w].reg >= 0)
				return (ts_id)s->op[o].in.v[w].reg;
	return TS_NONE;
}

static bool find(const tcp_sched *s, gf *x)
{
	if (!loop_ok(s, x) || s->meta.B < s->meta.T || !pf_guard(s, x) || !prefetches(s, x->gd, x->list, x) || !x->n ||
		!pro_copies(s, x))
		return false;
	const ts_loop *l = &s->loop[0];
	x->slot = slot_reg(s, x);
	const ts_scalar *sl = x->slot != TS_NONE ? &s->sc[x->slot] : NULL;
	if (!sl || sl->region != l->body || sl->kind != TS_SC_ALU || sl->op != TCP_S_AND || sl->a != l->g ||
		sl->b != TS_NONE || sl->imm != 1 || s->sc[x->enext].region != x->gd || s->sc[x->nslot].region != x->gd)
		return false;
	return reads_ok(s, x, NULL);
}

bool ts_rw_group_fetch_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	gf x;
	return find(s, &x);
}

/* Inserts item `it` just before item `before` of region rg. */
static void insert_before(tcp_sched *s, ts_id rg, uint32_t before, uint32_t it)
{
	const ts_region *r = &s->rg[rg];
	uint32_t at = 0;
	while (at < r->nitem && r->item[at] != before)
		at++;
	ts_region_insert(s, rg, at, it);
}

/* The last item of region rg (just appended) moved before item `before`. */
static void last_before(tcp_sched *s, ts_id rg, uint32_t before)
{
	ts_region *r = &s->rg[rg];
	uint32_t it = r->item[--r->nitem];
	insert_before(s, rg, before, it);
}

/* Op o (a whole-slot copy) turned into the gather of k rows of x's operand j
 * by the list from index register ix (TS_NONE: from 0), into the half that
 * register half selects (TS_NONE: half 0), valid count register v. */
static void to_gather(tcp_sched *s, const gf *x, uint32_t j, ts_id o, int64_t k, ts_id ix, ts_id half, ts_id v,
	uint16_t feature)
{
	int64_t n = x->numel[j], dim[3] = {1, k, n};
	tcp_view d = tcp_view_none(), h = tcp_view_none(), i = tcp_view_none();
	d.t = (int32_t)x->w[j];
	d.stride[0] = k * n, d.stride[1] = n, d.stride[2] = 1;
	if (half != TS_NONE)
		d.reg = (int32_t)half, d.scale = k * n;
	h.t = (int32_t)x->h[j];
	h.stride[0] = x->rows[j] * n, h.stride[1] = n, h.stride[2] = 1;
	i.t = (int32_t)x->list;
	i.stride[1] = 1;
	if (ix != TS_NONE)
		i.reg = (int32_t)ix, i.scale = 1;
	for (ts_id q = 0; q < s->nop; q++)
		if (q != o && ts_op_writes(&s->op[q], (int32_t)x->list) && !ts_op_in_loop(s, q))
			ts_add_dep_once(s, o, q, 0);
	ts_op *op = &s->op[o];
	tcp_insn in = tcp_b_dma_gather(3, dim, d, h, i, x->rows[j]);
	in.vreg = (int32_t)v;
	in.phase = op->in.phase;
	op->in = in;
	op->cost = 0;
	op->feature = feature;
}

/* Each slot of the operands' two-slot buffers made a group of k experts. */
static void group_slots(tcp_sched *s, const gf *x, int64_t k)
{
	for (uint32_t j = 0; j < x->n; j++) {
		ts_buf *w = &s->buf[x->w[j]];
		int64_t es = (int64_t)moe_dtype_size((moe_dtype)w->dtype);
		w->shape[0] = k * x->numel[j];
		w->layout.slice_bytes = 2 * k * x->numel[j] * es / w->layout.nslices;
	}
}

/* Whether two slots of k experts each of every operand can fit DM at all
 * (a trial that cannot place need not run). */
static bool groups_fit(const tcp_sched *s, const gf *x, int64_t k)
{
	const moe_tcp_machine *m = s->m;
	int64_t dm = m->clusters * m->slices_per_cluster * tcp_space_bytes(m, TCP_DM), need = 0;
	for (uint32_t j = 0; j < x->n; j++)
		need += 2 * k * x->numel[j] * (int64_t)moe_dtype_size((moe_dtype)s->buf[x->w[j]].dtype);
	return need <= dm;
}

static void group(tcp_sched *s, const gf *x, int64_t k, uint16_t feature)
{
	const ts_loop *l = &s->loop[0];
	ts_id body = l->body, pro = l->prologue, g = l->g, nb = l->nb;
	/* each slot a group of k experts; the list padded for the last group's view */
	group_slots(s, x, k);
	ts_buf *lb = &s->buf[x->list];
	lb->shape[lb->rank - 1] += k;
	int64_t cap = lb->layout.slice_bytes * lb->layout.nslices, need = ts_buf_numel(lb) * 4;
	if (need > cap)
		lb->layout.slice_bytes = (need + lb->layout.nslices - 1) / lb->layout.nslices;
	/* the prologue: blocks 0..k-1's experts into half 0 */
	ts_id v0 = ts_add_scalar(s, pro, "gfv0", TS_SC_ALU, TCP_S_MIN, nb, TS_NONE, k);
	last_before(s, pro, TS_ITEM_OP | x->pro[0]);
	for (uint32_t j = 0; j < x->n; j++)
		to_gather(s, x, j, x->pro[j], k, TS_NONE, TS_NONE, v0, feature);
	/* block g's entry: g & (2k - 1), in half (g / k) & 1 */
	s->sc[x->slot].imm = 2 * k - 1;
	/* the prefetch once per group, of the next group (its first block g + k) */
	ts_id m = ts_add_scalar(s, body, "gfpos", TS_SC_ALU, TCP_S_AND, g, TS_NONE, k - 1);
	last_before(s, body, TS_ITEM_RG | x->gd);
	ts_id first = ts_add_scalar(s, body, "gffirst", TS_SC_CMP, TCP_C_EQ, m, TS_NONE, 0);
	last_before(s, body, TS_ITEM_RG | x->gd);
	ts_id fg = ts_add_region(s, body, TS_RG_GUARD, first);
	ts_region *br = &s->rg[body];
	br->nitem--;
	for (uint32_t k2 = 0; k2 < br->nitem; k2++)
		if (br->item[k2] == (TS_ITEM_RG | x->gd))
			br->item[k2] = TS_ITEM_RG | fg;
	/* $gnext and $more move into the group guard with the prefetch guard */
	for (uint32_t k2 = 0; k2 < br->nitem; k2++)
		if (br->item[k2] == (TS_ITEM_SC | x->gnext) || br->item[k2] == (TS_ITEM_SC | x->more)) {
			memmove(br->item + k2, br->item + k2 + 1, (br->nitem - k2 - 1) * sizeof *br->item);
			br->nitem--, k2--;
		}
	ts_region_push(s, fg, TS_ITEM_SC | x->gnext);
	ts_region_push(s, fg, TS_ITEM_SC | x->more);
	ts_region_push(s, fg, TS_ITEM_RG | x->gd);
	s->sc[x->gnext].region = fg;
	s->sc[x->more].region = fg;
	s->rg[x->gd].parent = fg;
	s->sc[x->gnext].imm = k;
	/* in the prefetch guard: the next group's half and its count */
	ts_id gd = x->gd;
	ts_id a = ts_add_scalar(s, gd, "gfbit", TS_SC_ALU, TCP_S_AND, x->gnext, TS_NONE, k);
	ts_id half = ts_add_scalar(s, gd, "gfhalf", TS_SC_ALU, TCP_S_MIN, a, TS_NONE, 1);
	ts_id left = ts_add_scalar(s, gd, "gfleft", TS_SC_ALU, TCP_S_SUB, nb, x->gnext, 0);
	ts_id v = ts_add_scalar(s, gd, "gfv", TS_SC_ALU, TCP_S_MIN, left, TS_NONE, k);
	ts_region *gr = &s->rg[gd];
	uint32_t add[4];
	memcpy(add, gr->item + gr->nitem - 4, sizeof add);
	memmove(gr->item + 4, gr->item, (gr->nitem - 4) * sizeof *gr->item);
	memcpy(gr->item, add, sizeof add);
	for (uint32_t j = 0; j < x->n; j++)
		to_gather(s, x, j, x->pf[j], k, x->gnext, half, v, feature);
	/* the next block's expert and slot, read by the copies alone, and block
	 * 0's expert where the prologue's copies alone read it */
	uint8_t *drop = ctx_alloc(s->ctx, s->nsc); /* zeroed */
	const gf every = {.n = 0};
	drop[x->enext] = drop[x->nslot] = 1;
	drop[x->e0] = !reads_scalar(s, x->e0, &every);
	ts_drop_scalars(s, drop);
	ctx_free(s->ctx, drop, 0);
}

typedef struct gr gr;
static bool find_runs(const tcp_sched *s, struct gr *x);
static void group_runs(tcp_sched *s, const struct gr *xr, int64_t k, uint16_t feature);
static int64_t pick_k(const tcp_sched *s, const ts_env *e, const gf *x, int64_t n, bool runs, uint16_t feature);

typedef struct fin_arg {
	const ts_env *e;
	int row; /* group-fetch's row, or -1: the copy as it is */
	bool fin;
} fin_arg;

static bool finished_copy(tcp_sched *c, void *arg)
{
	const fin_arg *a = arg;
	if (a->row < 0)
		return !a->fin || (ts_rw_finish(c, a->e, "split-last-fetch") && tcp_sched_verify(c) == MOE_OK);
	return ts_rewrites[a->row].apply(c, a->e, (uint16_t)(a->row + 1)) == MOE_OK &&
	       ts_rw_finish(c, a->e, "split-last-group") && tcp_sched_verify(c) == MOE_OK;
}

/* group-fetch's benefit: both choices priced finished (ts_rw_finish), the groups
 * with split-last-group, the per-expert copies with split-last-fetch (as
 * they are where that copy fails); the cycles saved, 0 where a trial
 * fails. */
double ts_rw_group_fetch_benefit(const tcp_sched *s, const ts_env *e, int row)
{
	int64_t cy[2];
	for (int k = 0; k < 2; k++) {
		fin_arg a = {e, k ? row : -1, true};
		ts_trial t = ts_trial_for(e, k ? "<group-fetch trial>" : "<group-fetch base>", finished_copy, &a, true);
		cy[k] = ts_trial_of(s, &t);
		if (cy[k] < 0 && !k) {
			a.fin = false;
			cy[k] = ts_trial_of(s, &t);
		}
	}
	return cy[0] < 0 || cy[1] < 0 ? 0.0 : (double)(cy[0] - cy[1]);
}

moe_status ts_rw_group_fetch_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	gf x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	int64_t k = pick_k(s, e, &x, s->loop[0].G, false, feature);
	if (!k)
		return MOE_ERR_UNSUPPORTED;
	group(s, &x, k, feature);
	return MOE_OK;
}

/* ---- rewrite `group-runs`: the same where T > B ----------------------------
 *
 * Where an expert's rows may fill several blocks (T > B), same-expert has
 * made the slot follow the expert: block g's run index
 *     $sxsum = $sxwprev + ($e != previous block's expert)
 * counts the experts before block g's (0 for block 0's), $slot is
 * $sxsum & 1, and the prefetch fetches block g + 1's expert where it
 * differs from block g's. The block list names an expert once per block, so
 * it cannot serve as a gather's list; the experts hit, in block order, can:
 * the blocks run in expert order (blockwise-dispatch), so they are the
 * experts whose block count is not zero, ascending. The rewrite
 *   - adds two passes beside the pass that sums the per-expert block counts
 *     into nb: the hit list (`t.ne`, `flt.compact` of the expert index:
 *     experts with blocks to the front in order) and its length, written
 *     beside nb (element 1 of nb's buffer, which the loop's staging then
 *     walks: the length reaches SPM with nb) and loaded as $gfnhit;
 *   - makes each slot a group of k experts: run r's weights are entry
 *     r & (2k - 1) ($slot), in half (r / k) & 1; $sxwprev becomes the run
 *     index itself (from -1);
 *   - gathers hit list entries 0..k-1 in the prologue (valid
 *     min(k, $gfnhit)), and in the first block of every run r with
 *     r & (k - 1) == 0 the entries r + k .. r + 2k - 1 into the other half
 *     under r + k < $gfnhit (valid min(k, $gfnhit - r - k)).
 * Values are unchanged: each block reads its run's entry, which the gather
 * of its group wrote; that gather waits for the previous block's reads (the
 * last block of the group before, which read the half it overwrites) and
 * the reads wait for it, as the per-expert copies did. */

struct gr {
	gf f;
	ts_id sd, sxdiff, sxnsum;     /* the guard `$enext != $e` in the prefetch guard, its predicate, $slot + 1 */
	ts_id chg, sum, wprev;        /* same-expert's change flag, run index, its loop variable */
	ts_id nbop, P, NB, spm;       /* nb's pass, the block counts it sums, nb's buffer and staging */
	int nbv;                      /* the staging's view of nb */
};

static const ts_scalar *sc_at(const tcp_sched *s, ts_id id)
{
	return id < s->nsc ? &s->sc[id] : NULL;
}

/* The prefetch guard's items: $enext, $sxnsum, $nslot, $sxdiff and the
 * guard sd, nothing else. */
static bool runs_guard(const tcp_sched *s, gr *x)
{
	const ts_region *gd = &s->rg[x->f.gd];
	x->sd = x->sxdiff = x->sxnsum = TS_NONE;
	for (uint32_t k = 0; k < gd->nitem; k++) {
		uint32_t it = gd->item[k];
		ts_id id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP || (TS_ITEM_KIND(it) == TS_ITEM_RG && x->sd != TS_NONE))
			return false;
		if (TS_ITEM_KIND(it) == TS_ITEM_RG) {
			x->sd = id;
			continue;
		}
		const ts_scalar *c = &s->sc[id];
		if (c->kind == TS_SC_CMP && c->op == TCP_C_NE && x->sxdiff == TS_NONE)
			x->sxdiff = id;
		else if (c->kind == TS_SC_ALU && c->op == TCP_S_ADD && c->b == TS_NONE && c->imm == 1 && x->sxnsum == TS_NONE)
			x->sxnsum = id;
		else if (c->kind != TS_SC_SPM_LD && !(c->kind == TS_SC_ALU && c->op == TCP_S_AND))
			return false;
	}
	return x->sd != TS_NONE && x->sxdiff != TS_NONE && x->sxnsum != TS_NONE &&
	       s->rg[x->sd].kind == TS_RG_GUARD && s->rg[x->sd].pred == x->sxdiff;
}

/* nb's pass: nb is loaded from a one-element buffer that one pass before
 * the loop writes, the sum over E experts of an i32 DM buffer P (the
 * blocks of each expert); the `dma.spm` that stages nb stands in the loop's
 * region, as does nb's load. */
static bool nb_pass(const tcp_sched *s, gr *x)
{
	const ts_loop *l = &s->loop[0];
	const ts_scalar *nb = sc_at(s, l->nb);
	ts_id top = s->rg[l->region].parent;
	if (!nb || nb->kind != TS_SC_SPM_LD || nb->a != TS_NONE || nb->imm != 0 || nb->region != top)
		return false;
	x->NB = nb->buf;
	x->nbop = x->spm = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (in->op == TCP_OP_DMA_SPM) {
			for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
				if (in->v[w].t >= 0 && (ts_id)in->v[w].t == x->NB) {
					if (x->spm != TS_NONE || s->op[o].region != top || in->v[w].reg >= 0 ||
						in->v[w].base != 0 || in->v[w].stride[0] != 0 || in->ndim != 1 || in->dim[0] != l->G)
						return false;
					x->spm = o, x->nbv = w;
				}
			continue;
		}
		if (!ts_op_writes(&s->op[o], (int32_t)x->NB))
			continue;
		if (x->nbop != TS_NONE || s->op[o].region != top)
			return false;
		x->nbop = o;
	}
	if (x->nbop == TS_NONE || x->spm == TS_NONE)
		return false;
	const tcp_insn *in = &s->op[x->nbop].in;
	const tcp_view *d = &in->v[TCP_V_DST], *v = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_TU_VEC || in->ndim != 1 || in->dim[0] != s->meta.E || in->nstep != 1 ||
		in->step[0].op != TCP_V_RSUM || in->step[0].x != TCP_SRC_S0 || in->vreg >= 0 || v->t < 0 ||
		in->v[TCP_V_S1].t >= 0 || in->v[TCP_V_S2].t >= 0 || v->reg >= 0 || v->base != 0 || v->stride[0] != 1 ||
		d->reg >= 0 || d->base != 0 || d->stride[0] != 0)
		return false;
	x->P = (ts_id)v->t;
	const ts_buf *p = &s->buf[x->P], *n = &s->buf[x->NB];
	if (p->space != TCP_DM || p->dtype != MOE_I32 || p->slots != 1 || ts_buf_numel(p) != s->meta.E ||
		n->space != TCP_DM || n->dtype != MOE_I32 || n->slots != 1 || ts_buf_numel(n) != 1)
		return false;
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_op_writes(&s->op[o], (int32_t)x->P) && ts_op_in_loop(s, o))
			return false;
	return true;
}

static bool find_runs(const tcp_sched *s, gr *x)
{
	memset(x, 0, sizeof *x);
	gf *f = &x->f;
	if (!loop_ok(s, f) || s->meta.B >= s->meta.T || s->meta.E < 2 || !pf_guard(s, f) || !runs_guard(s, x) ||
		!prefetches(s, x->sd, f->list, f) || !f->n || !pro_copies(s, f) || !nb_pass(s, x))
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_scalar *en = sc_at(s, f->enext), *ns = sc_at(s, f->nslot), *df = &s->sc[x->sxdiff];
	const ts_scalar *nsum = &s->sc[x->sxnsum];
	f->slot = slot_reg(s, f);
	const ts_scalar *sl = sc_at(s, f->slot);
	if (!en || !ns || !sl || en->region != f->gd || ns->region != f->gd || ns->kind != TS_SC_ALU || ns->op != TCP_S_AND ||
		ns->a != x->sxnsum || ns->b != TS_NONE || ns->imm != 1 || nsum->a != f->slot ||
		!((df->a == f->enext && df->b == l->expert) || (df->b == f->enext && df->a == l->expert)))
		return false;
	/* $slot = $sxsum & 1, $sxsum = $sxwprev + $sxchg, $sxwprev stepped to $slot */
	if (sl->region != l->body || sl->kind != TS_SC_ALU || sl->op != TCP_S_AND || sl->b != TS_NONE || sl->imm != 1)
		return false;
	x->sum = sl->a;
	const ts_scalar *sum = sc_at(s, x->sum);
	if (!sum || sum->region != l->body || sum->kind != TS_SC_ALU || sum->op != TCP_S_ADD || sum->b == TS_NONE)
		return false;
	x->wprev = sum->a, x->chg = sum->b;
	const ts_scalar *wp = sc_at(s, x->wprev), *chg = sc_at(s, x->chg);
	if (!wp || !chg || wp->kind != TS_SC_LOOPVAR || wp->b != f->slot || wp->region != l->prologue ||
		chg->region != l->body || chg->kind != TS_SC_CMP || chg->op != TCP_C_NE || chg->a != l->expert ||
		!sc_at(s, chg->b) || sc_at(s, chg->b)->kind != TS_SC_LOOPVAR || reads_but(s, x->sum, NULL, f->slot, TS_NONE) ||
		reads_but(s, x->sxnsum, NULL, f->nslot, TS_NONE))
		return false;
	/* $sxdiff is read as sd's predicate alone */
	for (ts_id c = 0; c < s->nsc; c++)
		if (ts_scalar_reads(&s->sc[c], x->sxdiff))
			return false;
	for (ts_id r = 0; r < s->nrg; r++)
		if (r != x->sd && ts_region_reads(&s->rg[r], x->sxdiff))
			return false;
	const ts_id by[3] = {x->sxnsum, x->wprev, x->sxdiff};
	return reads_ok(s, f, by);
}

bool ts_rw_group_runs_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	gr x;
	return find_runs(s, &x);
}

/* The last item of region rg (just appended) moved to stand after item
 * `after` of rg. */
static void last_after(tcp_sched *s, ts_id rg, uint32_t after)
{
	ts_region *r = &s->rg[rg];
	uint32_t it = r->item[--r->nitem], at = 0;
	while (at < r->nitem && r->item[at] != after)
		at++;
	ts_region_insert(s, rg, at < r->nitem ? at + 1 : at, it);
}

/* A pass like nb's (its dims and s0: the block counts), writing view d
 * with the steps st, standing after nb's pass with its dependencies. */
static ts_id count_pass(tcp_sched *s, const gr *x, tcp_view d, const tcp_step *st, int nst, uint16_t feature)
{
	const ts_op *nbo = &s->op[x->nbop];
	ts_id top = nbo->region;
	tcp_insn in = nbo->in;
	in.v[TCP_V_DST] = d;
	in.nstep = 0;
	for (int k = 0; k < nst; k++)
		in.step[in.nstep++] = st[k];
	ts_id o = ts_add_op(s, top, &in, s->op[x->nbop].phase);
	s->op[o].feature = feature;
	s->op[o].node = s->op[x->nbop].node;
	for (uint32_t j = 0; j < s->op[x->nbop].ndep; j++)
		ts_add_dep(s, o, s->op[x->nbop].dep[j], s->op[x->nbop].dist[j]);
	last_after(s, top, TS_ITEM_OP | x->nbop);
	return o;
}

static void group_runs(tcp_sched *s, const gr *xr, int64_t k, uint16_t feature)
{
	gr x = *xr;
	gf *f = &x.f;
	const ts_loop *l = &s->loop[0];
	ts_id pro = l->prologue, top = s->op[x.nbop].region;
	int64_t E = s->meta.E;
	group_slots(s, f, k);
	/* the hit list (E entries and k of padding for the last group's index
	 * view), laid out as the block counts are, and its length beside nb:
	 * the staging's first descriptor then walks nb's buffer (nb, runs) */
	int64_t hn = E + k, flit = s->m->flit_bytes;
	ts_id H = ts_add_buf(s, "hit_experts", TCP_DM, TCP_T_SCRATCH, MOE_I32, 1, &hn);
	s->buf[H].layout = s->buf[x.P].layout;
	s->buf[H].feature = feature;
	s->buf[H].node = s->buf[x.P].node;
	ts_buf *nbb = &s->buf[x.NB];
	nbb->shape[0] = l->G;
	for (int r = 1; r < nbb->rank; r++)
		nbb->shape[r] = 1;
	const ts_id fit[2] = {H, x.NB};
	for (int q = 0; q < 2; q++) {
		ts_buf *b = &s->buf[fit[q]];
		int64_t need = ts_buf_numel(b) * 4, per = (need + b->layout.nslices - 1) / b->layout.nslices;
		if (need > b->layout.slice_bytes * b->layout.nslices)
			b->layout.slice_bytes = (per + flit - 1) / flit * flit;
	}
	const tcp_step hit[2] = {{TCP_V_TNE, TCP_SRC_S0, TCP_SRC_IMM, 0, 0, 0}, {TCP_V_COMPACT, TCP_SRC_CTR, TCP_SRC_IMM, 0, 0, 0}};
	const tcp_step cnt[2] = {{TCP_V_TNE, TCP_SRC_S0, TCP_SRC_IMM, 0, 0, 0}, {TCP_V_RSUM, TCP_SRC_V, TCP_SRC_NONE, 0, 0, 0}};
	tcp_view hv = tcp_view_none(), nv = tcp_view_none();
	hv.t = (int32_t)H, hv.stride[0] = 1;
	nv.t = (int32_t)x.NB, nv.base = 1;
	ts_id cp = count_pass(s, &x, nv, cnt, 2, feature);
	count_pass(s, &x, hv, hit, 2, feature);
	tcp_view *sv = &s->op[x.spm].in.v[x.nbv];
	sv->stride[0] = 1;
	ts_add_dep(s, x.spm, cp, 0);
	ts_id nhit = ts_add_scalar(s, top, "gfnhit", TS_SC_SPM_LD, 0, TS_NONE, TS_NONE, 1);
	s->sc[nhit].buf = x.NB;
	last_after(s, top, TS_ITEM_SC | l->nb);
	/* the prologue: runs 0..k-1's experts into half 0 */
	f->list = H;
	ts_id v0 = ts_add_scalar(s, pro, "gfv0", TS_SC_ALU, TCP_S_MIN, nhit, TS_NONE, k);
	last_before(s, pro, TS_ITEM_OP | f->pro[0]);
	for (uint32_t j = 0; j < f->n; j++)
		to_gather(s, f, j, f->pro[j], k, TS_NONE, TS_NONE, v0, feature);
	/* the run index: $sxwprev from -1, stepped to $sxsum; entry r & (2k - 1) */
	ts_id m1 = ts_add_scalar(s, pro, "gfstart", TS_SC_CONST, 0, TS_NONE, TS_NONE, -1);
	last_before(s, pro, TS_ITEM_SC | x.wprev);
	ts_id oldinit = s->sc[x.wprev].a;
	s->sc[x.wprev].a = m1;
	s->sc[x.wprev].b = x.sum;
	s->sc[f->slot].imm = 2 * k - 1;
	/* the prefetch guard: under $sxchg; the group guard r & (k - 1) == 0
	 * inside it; sd under r + k < $gfnhit inside that */
	ts_region *gd = &s->rg[f->gd];
	gd->nitem = 0;
	gd->pred = x.chg;
	ts_id m = ts_add_scalar(s, f->gd, "gfpos", TS_SC_ALU, TCP_S_AND, x.sum, TS_NONE, k - 1);
	ts_id first = ts_add_scalar(s, f->gd, "gffirst", TS_SC_CMP, TCP_C_EQ, m, TS_NONE, 0);
	ts_id fg = ts_add_region(s, f->gd, TS_RG_GUARD, first);
	ts_id nx = ts_add_scalar(s, fg, "gfnext", TS_SC_ALU, TCP_S_ADD, x.sum, TS_NONE, k);
	ts_id more = ts_add_scalar(s, fg, "gfmore", TS_SC_CMP, TCP_C_LT, nx, nhit, 0);
	ts_region_push(s, fg, TS_ITEM_RG | x.sd);
	s->rg[x.sd].parent = fg;
	s->rg[x.sd].pred = more;
	s->rg[x.sd].nitem = 0;
	ts_id a = ts_add_scalar(s, x.sd, "gfbit", TS_SC_ALU, TCP_S_AND, nx, TS_NONE, k);
	ts_id half = ts_add_scalar(s, x.sd, "gfhalf", TS_SC_ALU, TCP_S_MIN, a, TS_NONE, 1);
	ts_id left = ts_add_scalar(s, x.sd, "gfleft", TS_SC_ALU, TCP_S_SUB, nhit, nx, 0);
	ts_id v = ts_add_scalar(s, x.sd, "gfv", TS_SC_ALU, TCP_S_MIN, left, TS_NONE, k);
	for (uint32_t j = 0; j < f->n; j++) {
		ts_region_push(s, x.sd, TS_ITEM_OP | f->pf[j]);
		to_gather(s, f, j, f->pf[j], k, nx, half, v, feature);
	}
	/* what only the per-expert copies read goes */
	uint8_t *drop = ctx_alloc(s->ctx, s->nsc); /* zeroed */
	const gf every = {.n = 0};
	drop[f->gnext] = drop[f->more] = drop[f->enext] = drop[f->nslot] = drop[x.sxnsum] = drop[x.sxdiff] = 1;
	drop[f->e0] = !reads_scalar(s, f->e0, &every);
	drop[oldinit] = !reads_scalar(s, oldinit, &every);
	ts_drop_scalars(s, drop);
	ctx_free(s->ctx, drop, 0);
}

typedef struct gf_arg {
	const ts_env *e;
	uint16_t feature;
	bool runs; /* group-runs, else group-fetch */
	int64_t k;
} gf_arg;

static bool group_copy(tcp_sched *c, void *arg)
{
	const gf_arg *a = arg;
	if (a->runs) {
		gr x;
		if (!find_runs(c, &x))
			return false;
		group_runs(c, &x, a->k, a->feature);
	} else {
		gf x;
		if (!find(c, &x))
			return false;
		group(c, &x, a->k, a->feature);
	}
	return ts_rw_finish(c, a->e, "split-last-group");
}

/* k: each power of two from 2 while a group holds fewer than n (the grid's
 * blocks; with runs, the experts) and two slots of k experts can fit DM, up
 * to GF_KMAX, grouped in a trial copy, placed and predicted; the fastest
 * taken (ties: the smaller group, the shorter tail). 0, with a note, where
 * no group places. */
static int64_t pick_k(const tcp_sched *s, const ts_env *e, const gf *x, int64_t n, bool runs, uint16_t feature)
{
	int64_t best = 0, least = -1;
	for (int64_t k = 2; k <= GF_KMAX && k / 2 < n && groups_fit(s, x, k); k *= 2) {
		gf_arg a = {e, feature, runs, k};
		ts_trial t = ts_trial_for(e, runs ? "<group-runs trial>" : "<group-fetch trial>", group_copy, &a, true);
		int64_t c = ts_trial_of(s, &t);
		if (c >= 0 && (least < 0 || c < least))
			least = c, best = k;
	}
	if (!best)
		moe_diag(s->ctx, MOE_DIAG_NOTE, moe_loc_none(),
			"tcp: %s: no group of two or more experts per weight slot places in DM; each expert keeps its own fetch",
			runs ? "group-runs" : "group-fetch");
	return best;
}

moe_status ts_rw_group_runs_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	gr x;
	if (!find_runs(s, &x))
		return MOE_ERR_INVALID;
	int64_t k = pick_k(s, e, &x.f, s->meta.E, true, feature);
	if (!k)
		return MOE_ERR_UNSUPPORTED;
	group_runs(s, &x, k, feature);
	return MOE_OK;
}
