/* backend-tcp/compiler/rw/expert_table.c: rewrite `expert-table`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With double weights, every per-expert operand of the block loop is
 * fetched once per block: block 0's expert by the prologue, block g + 1's
 * by block g into the other slot. A small operand (gpt-oss-20b's three
 * biases, one row of D each) is a whole DMA command per block whose setup
 * (dma.setup_cycles) is most of its cost and which the in-order DMA context
 * runs between the weight fetches, on the critical path of a weight-bound
 * layer. The rewrite copies every expert's row of such an operand into one
 * DM table once before the loop (the prologue's fetch, widened to the E
 * rows and moved before the loop, where it depends on no routing and runs
 * while routing computes), drops the body's fetches, and the body's readers
 * read row $e of the table in place (their views moved by the block's
 * expert instead of its slot). Each row starts a new round of the
 * flit-spread layout (a multiple of slices x flit bytes), so row e lies on
 * the slices slot 0 did. Values are unchanged: each reader sees its
 * block's expert's bytes, written before the loop and by nothing in it.
 * Whether the table fits DM and gains is the prediction's trial
 * (ts_benefit_by_prediction): a table that does not fit fails the trial's
 * placement, and one that moves more bytes than it saves setups is slower. */
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/isa/build.h"

enum { ET_MAX = 16 };

/* One operand: its slot buffer, the HBM rows, the prologue's fetch and the
 * slot register its readers use. */
typedef struct et {
	ts_id w, h, pro;
	int32_t slot;
	int64_t n, E;
} et;

/* whether op o is a fetch of n elements of HBM buffer h's row (register
 * scale n, base 0) into the whole of a slot of w */
static bool fetch(const tcp_sched *s, ts_id o, ts_id w, int64_t n, int32_t *h)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *v = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->vreg >= 0 || v->t < 0 || v->reg < 0 || v->base != 0 || v->scale != n ||
		(in->flags & TCP_F_JOIN) || ts_insn_numel(in) != n || !ts_view_contiguous(v, in->ndim, in->dim) ||
		!ts_view_contiguous(d, in->ndim, in->dim) || in->v[TCP_V_S1].t >= 0 || (ts_id)d->t != w)
		return false;
	if (*h >= 0 && v->t != *h)
		return false;
	*h = v->t;
	return true;
}

/* Whether slot buffer w of loop l is such an operand; fills x. */
static bool operand(const tcp_sched *s, const ts_loop *l, ts_id w, et *x)
{
	const ts_buf *b = &s->buf[w];
	if (b->space != TCP_DM || b->slots != 2 || b->life != TS_LIFE_LOOP || b->kind != TCP_T_SCRATCH ||
		b->layout.split != TS_SPLIT_FLIT || b->layout.copies != 1 || b->layout.slice0 != 0 || b->layout.nslices < 1)
		return false;
	int64_t n = ts_buf_numel(b);
	int32_t h = -1, slot = -1;
	ts_id pro = TS_NONE;
	int nbody = 0;
	for (ts_id o = 0; o < s->nop; o++) {
		const ts_op *q = &s->op[o];
		if (ts_op_writes(q, (int32_t)w)) {
			const tcp_view *d = &q->in.v[TCP_V_DST];
			if (!fetch(s, o, w, n, &h))
				return false;
			if (ts_region_within(s, q->region, l->prologue) && d->reg < 0 && d->base == 0 && pro == TS_NONE)
				pro = o;
			else if (ts_region_within(s, q->region, l->body) && d->reg >= 0 && d->scale == n && d->base == 0)
				nbody++;
			else
				return false;
			continue;
		}
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++) {
			const tcp_view *v = &q->in.v[k];
			if (v->t != (int32_t)w)
				continue;
			if (!ts_region_within(s, q->region, l->body) || v->reg < 0 || v->scale != n || (slot >= 0 && v->reg != slot))
				return false;
			slot = v->reg;
		}
	}
	if (pro == TS_NONE || !nbody || slot < 0 || h < 0)
		return false;
	const ts_buf *hb = &s->buf[h];
	if (hb->space != TCP_HBM || hb->dtype != b->dtype || ts_buf_numel(hb) % n || ts_buf_numel(hb) / n < 1)
		return false;
	for (ts_id o = 0; o < s->nop; o++) { /* the rows are written by nothing; the fetches awaited by readers only */
		const ts_op *q = &s->op[o];
		if (ts_op_writes(q, h))
			return false;
		if (ts_op_reads(q, (int32_t)w) || ts_op_writes(q, (int32_t)w))
			continue;
		for (uint32_t j = 0; j < q->ndep; j++)
			if (ts_op_writes(&s->op[q->dep[j]], (int32_t)w))
				return false;
	}
	for (ts_id q = 0; q < s->nsc; q++)
		if (s->sc[q].kind == TS_SC_SPM_LD && (s->sc[q].buf == w || s->sc[q].buf == (ts_id)h))
			return false;
	*x = (et){w, (ts_id)h, pro, slot, n, ts_buf_numel(hb) / n};
	return true;
}

static int find(const tcp_sched *s, et *x)
{
	if (!s->m || s->nloop != 1)
		return 0;
	const ts_loop *l = &s->loop[0];
	if (l->weights != TS_W_DOUBLE || l->expert == TS_NONE)
		return 0;
	int nx = 0;
	for (ts_id w = 0; w < s->nbuf && nx < ET_MAX; w++)
		if (operand(s, l, w, &x[nx]))
			nx++;
	return nx;
}

bool ts_rw_expert_table_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	et x[ET_MAX];
	return find(s, x) > 0;
}

/* moves op c from its region to the loop's parent, just before the loop,
 * or before the dma.spm staging the loop's controls where that is the last
 * DMA command before it: the staging waits for routing's last pass, and
 * the DMA queue, in order, would otherwise hold the copy behind it */
static void hoist(tcp_sched *s, const ts_loop *l, ts_id c)
{
	ts_region *b = &s->rg[s->op[c].region];
	uint32_t k = 0;
	while (k < b->nitem && b->item[k] != (TS_ITEM_OP | c))
		k++;
	memmove(b->item + k, b->item + k + 1, (b->nitem - k - 1) * sizeof *b->item);
	b->nitem--;
	ts_id parent = s->rg[l->region].parent;
	ts_region_push(s, parent, TS_ITEM_OP | c);
	ts_region *p = &s->rg[parent];
	uint32_t at = 0;
	while (at < p->nitem && p->item[at] != (TS_ITEM_RG | l->region))
		at++;
	for (uint32_t k = at; k-- > 0;) {
		if (TS_ITEM_KIND(p->item[k]) == TS_ITEM_SC)
			continue;
		if (TS_ITEM_KIND(p->item[k]) != TS_ITEM_OP)
			break;
		int op = s->op[TS_ITEM_ID(p->item[k])].in.op;
		if (tcp_op_ctx[op] != TCP_CTX_DMA)
			continue;
		if (op == TCP_OP_DMA_SPM)
			at = k;
		break;
	}
	memmove(p->item + at + 1, p->item + at, (p->nitem - 1 - at) * sizeof *p->item);
	p->item[at] = TS_ITEM_OP | c;
	s->op[c].region = parent;
}

/* One operand into its table; the body's fetches marked in drop. */
static void table(tcp_sched *s, const et *x, uint16_t feature, uint8_t *drop)
{
	const ts_loop *l = &s->loop[0];
	const ts_buf *h = &s->buf[x->h];
	ts_layout lay = s->buf[x->w].layout;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)h->dtype), round = (int64_t)lay.nslices * s->m->flit_bytes;
	int64_t np = (x->n * es + round - 1) / round * round / es, n = x->n, E = x->E;
	char name[160];
	snprintf(name, sizeof name, "%.*s.table", 140, s->buf[x->w].name);
	int64_t shape[2] = {E, np};
	ts_id st = ts_add_buf(s, name, TCP_DM, TCP_T_SCRATCH, (moe_dtype)h->dtype, 2, shape);
	lay.slice_bytes = E * np * es / lay.nslices;
	s->buf[st].layout = lay;
	s->buf[st].feature = feature;
	s->buf[st].node = s->buf[x->w].node;
	/* the prologue's fetch, widened to the E rows, before the loop */
	ts_id c = x->pro;
	hoist(s, l, c);
	ts_op *o = &s->op[c];
	o->feature = feature;
	o->in.ndim = 2;
	o->in.dim[0] = E;
	o->in.dim[1] = n;
	o->in.v[TCP_V_S0] = tcp_b_view((int32_t)x->h, 0, 2, (const int64_t[]){n, 1});
	o->in.v[TCP_V_DST] = tcp_b_view((int32_t)st, 0, 2, (const int64_t[]){np, 1});
	uint32_t keep = 0;
	for (uint32_t j = 0; j < o->ndep; j++)
		if (!ts_region_within(s, s->op[o->dep[j]].region, l->region)) {
			o->dep[keep] = o->dep[j];
			o->dist[keep++] = o->dist[j];
		}
	o->ndep = keep;
	ts_id last = c;
	for (ts_id q = 0; q < s->nop; q++) {
		ts_op *r = &s->op[q];
		if (q == c)
			continue;
		if (ts_op_writes(r, (int32_t)x->w)) { /* the body's fetches go */
			drop[q] = 1;
			continue;
		}
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++)
			if (r->in.v[k].t == (int32_t)x->w) {
				r->in.v[k].t = (int32_t)st;
				r->in.v[k].reg = (int32_t)l->expert;
				r->in.v[k].scale = np;
				last = q;
			}
		for (uint32_t j = 0; j < r->ndep; j++)
			if (r->dep[j] == c)
				r->dist[j] = 0;
	}
	s->buf[x->w].life = TS_LIFE_SPAN; /* read by nothing now */
	s->buf[x->w].first = s->buf[x->w].last = c;
	s->buf[st].life = TS_LIFE_SPAN;
	s->buf[st].first = c;
	s->buf[st].last = last;
}

/* The operands take[k] of find()'s list into their tables. */
static void tables(tcp_sched *s, const bool *take, uint16_t feature)
{
	et x[ET_MAX];
	int nx = find(s, x);
	uint8_t *drop = ctx_alloc(s->ctx, s->nop); /* zeroed */
	for (int k = 0; k < nx; k++)
		if (take[k])
			table(s, &x[k], feature, drop);
	ts_drop_ops(s, drop);
	ctx_free(s->ctx, drop, 0);
}

typedef struct take_arg {
	const bool *take;
	uint16_t feature;
} take_arg;

/* the tables taken, in a copy, which must still verify */
static bool with_tables(tcp_sched *c, void *arg)
{
	const take_arg *a = arg;
	tables(c, a->take, a->feature);
	return tcp_sched_verify(c) == MOE_OK;
}

/* The predicted cycles of a copy of s with the tables take, placed; -1
 * where it does not verify or place (ts_trial_of). */
static int64_t priced(const tcp_sched *s, const ts_env *e, const bool *take, uint16_t feature)
{
	take_arg a = {take, feature};
	ts_trial t = ts_trial_for(e, "<expert-table trial>", with_tables, &a, true);
	return ts_trial_of(s, &t);
}

/* Which operands get a table: each in turn, in find()'s order, is taken
 * where the layer with it and those taken before is predicted faster (a
 * table that does not fit DM fails its trial's placement). Forced on
 * (--tcp-opt=+expert-table), every one. */
moe_status ts_rw_expert_table_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	et x[ET_MAX];
	int nx = find(s, x);
	if (!nx)
		return MOE_ERR_INVALID;
	bool take[ET_MAX] = {false}, any = false;
	if (e->on >> (feature - 1) & 1) {
		for (int k = 0; k < nx; k++)
			take[k] = any = true;
	} else {
		int64_t best = priced(s, e, take, feature);
		for (int k = 0; k < nx && best >= 0; k++) {
			take[k] = true;
			int64_t cy = priced(s, e, take, feature);
			if (cy >= 0 && cy < best)
				best = cy, any = true;
			else
				take[k] = false;
		}
	}
	if (!any)
		return MOE_ERR_INVALID;
	tables(s, take, feature);
	return MOE_OK;
}
