/* backend-tcp/compiler/rw/pipe_decode.c: rewrite `pipe-decode`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With double weights, block g's body starts with the passes that decode its
 * expert's packed weights (gpt-oss MXFP4: the two scale-offset passes and
 * gate_up's first decode part, after early-dequant and split-decode), and the
 * sub context's first TRF load waits for them. The main context runs in
 * order, so those passes wait for block g - 1's last contraction and bias
 * add, and the sub context idles at every block boundary while the next
 * expert's packed weights have long been prefetched. The rewrite issues the
 * body's leading run of vector passes (ending at its first decode pass, each
 * reading only what came before the loop or the expert's weight slots) for
 * block g + 1 inside block g, under the prefetch's condition (g + 1 < nb),
 * reading the slot block g + 1 will use, after every op of block g that
 * reads or writes their destinations (those buffers live over the whole loop
 * now); block 0's run is a copy of them under g == 0 where they stood. The
 * prefetch copies those passes read that are not decode passes' values (the
 * scales) move to the front of their region, so the offsets can run early.
 * Values are unchanged: each pass computes what it computed, from the same
 * slot (the next block's slot is the one the prefetch fills, or the current
 * one when same-expert skips the fetch), every reader of its result waits for
 * it (the copy at distance 0, the moved pass at distance 1), and it waits
 * for every reader and writer of its destination in the block before. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { PD_MAX = 8 };

typedef struct pd {
	ts_id body, slot, gnext;
	bool sx;                      /* same-expert's slot: follows the expert */
	ts_id run[PD_MAX];            /* the moved passes, in body order */
	uint32_t n, at;               /* their count; the body index of the first */
} pd;

static bool decodes(const tcp_sched *s, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	if (in->op != TCP_OP_TU_VEC || in->v[TCP_V_S0].t < 0 || in->v[TCP_V_DST].t < 0)
		return false;
	return (in->flags & (TCP_F_E2M1 | TCP_F_I4)) || s->buf[in->v[TCP_V_S0].t].dtype == MOE_F8E4M3;
}

static bool in_run(const pd *x, ts_id o)
{
	for (uint32_t i = 0; i < x->n; i++)
		if (x->run[i] == o)
			return true;
	return false;
}

static bool in_body(const tcp_sched *s, const pd *x, ts_id o)
{
	return ts_region_within(s, s->op[o].region, x->body);
}

/* Whether run op o can move: a vector pass into a DM buffer of one slot
 * whose span starts in the run (nothing before it in the block reads it),
 * its sources with no register, the slot (a slotted buffer) or the expert,
 * its distance-0 dependencies before the loop body or earlier in the run,
 * and no op outside the body waiting for it. */
static bool movable(const tcp_sched *s, const pd *x, ts_id o)
{
	const ts_op *q = &s->op[o];
	const tcp_insn *in = &q->in;
	int32_t d = in->v[TCP_V_DST].t;
	if (in->op != TCP_OP_TU_VEC || in->vreg >= 0 || d < 0 || s->buf[d].space != TCP_DM || s->buf[d].slots != 1 ||
		in->v[TCP_V_DST].reg >= 0 || s->buf[d].life != TS_LIFE_SPAN || s->buf[d].first == TS_NONE ||
		!in_run(x, s->buf[d].first))
		return false;
	for (ts_id y = 0; y < s->nop; y++)
		for (uint32_t j = 0; j < s->op[y].ndep && !in_body(s, x, y); j++)
			if (s->op[y].dep[j] == o)
				return false;
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
		const tcp_view *v = &in->v[w];
		bool slot = (ts_id)v->reg == x->slot && s->buf[v->t].slots == 2;
		if (w != TCP_V_DST && v->t >= 0 && v->reg >= 0 && !slot && (ts_id)v->reg != s->loop[0].expert)
			return false;
	}
	for (uint32_t j = 0; j < q->ndep; j++)
		if (q->dist[j] == 0 && in_body(s, x, q->dep[j]) && !in_run(x, q->dep[j]))
			return false;
	return true;
}

static ts_id body_scalar(const tcp_sched *s, ts_id body, int kind, int op, ts_id a, ts_id b, int64_t imm)
{
	const ts_region *r = &s->rg[body];
	for (uint32_t k = 0; k < r->nitem; k++) {
		if (TS_ITEM_KIND(r->item[k]) != TS_ITEM_SC)
			continue;
		ts_id c = TS_ITEM_ID(r->item[k]);
		const ts_scalar *q = &s->sc[c];
		if (q->kind == kind && q->op == op && q->a == a && q->b == b && q->imm == imm)
			return c;
	}
	return TS_NONE;
}

static bool find(const tcp_sched *s, pd *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop < 1 || s->loop[0].weights != TS_W_DOUBLE || s->loop[0].prefetch != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	x->body = l->body;
	x->slot = ts_find_scalar(s, "slot");
	if (x->slot == TS_NONE || s->sc[x->slot].region != x->body || l->expert == TS_NONE ||
		s->sc[l->expert].kind != TS_SC_SPM_LD || s->sc[l->expert].a != l->g)
		return false;
	const ts_scalar *sl = &s->sc[x->slot];
	if (sl->kind != TS_SC_ALU || sl->op != TCP_S_AND || sl->b != TS_NONE || sl->imm != 1)
		return false;
	x->sx = sl->a != l->g;
	x->gnext = body_scalar(s, x->body, TS_SC_ALU, TCP_S_ADD, l->g, TS_NONE, 1);
	if (x->gnext == TS_NONE || body_scalar(s, x->body, TS_SC_CMP, TCP_C_LT, x->gnext, l->nb, 0) == TS_NONE)
		return false;
	const ts_region *r = &s->rg[x->body];
	uint32_t d = 0;
	while (d < r->nitem && !(TS_ITEM_KIND(r->item[d]) == TS_ITEM_OP && decodes(s, TS_ITEM_ID(r->item[d]))))
		d++;
	if (d == r->nitem)
		return false;
	uint32_t a = d;
	while (a > 0 && d - a + 1 < PD_MAX && TS_ITEM_KIND(r->item[a - 1]) == TS_ITEM_OP &&
		s->op[TS_ITEM_ID(r->item[a - 1])].in.op == TCP_OP_TU_VEC)
		a--;
	x->at = a;
	for (uint32_t k = a; k <= d; k++)
		x->run[x->n++] = TS_ITEM_ID(r->item[k]);
	for (uint32_t i = 0; i < x->n; i++)
		if (!movable(s, x, x->run[i]))
			return false;
	return true;
}

bool ts_rw_pipe_decode_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	pd x;
	return find(s, &x);
}

/* appends a new item of region rg (ts_add_*), then moves it to index at */
static void place_last(tcp_sched *s, ts_id rg, uint32_t at)
{
	ts_region *r = &s->rg[rg];
	uint32_t it = r->item[r->nitem - 1];
	r->nitem--;
	ts_region_insert(s, rg, at, it);
}

/* whether op o (not in the run) reads or writes buffer t */
static bool touches(const tcp_sched *s, ts_id o, int32_t t)
{
	return ts_op_writes(&s->op[o], t) || ts_op_reads(&s->op[o], t);
}

/* The body index of the item standing for op o (o itself or a region holding it). */
static uint32_t body_index(const tcp_sched *s, ts_id body, ts_id o)
{
	ts_id rg = s->op[o].region;
	uint32_t it = TS_ITEM_OP | o;
	while (rg != body && rg != TS_NONE) {
		it = TS_ITEM_RG | rg;
		rg = s->rg[rg].parent;
	}
	const ts_region *r = &s->rg[body];
	for (uint32_t k = 0; k < r->nitem; k++)
		if (r->item[k] == it)
			return k;
	return 0;
}

/* Whether op y touches elements of view w of `in` (w's buffer, element
 * hulls overlapping: the simulator's hazard test within one tensor); a view
 * moved by a register or a 4-bit stream counts as its whole buffer. */
static bool overlaps(const tcp_sched *s, ts_id y, const tcp_insn *in, int w)
{
	const tcp_view *v = &in->v[w];
	const tcp_insn *q = &s->op[y].in;
	int64_t lo, hi, a, b;
	ts_view_span(in, v, &lo, &hi);
	for (int k = 0; k < TCP_NVIEW; k++) {
		const tcp_view *u = &q->v[k];
		if (u->t != v->t)
			continue;
		bool nib = q->op == TCP_OP_TU_VEC && k == TCP_V_S0 && (q->flags & (TCP_F_E2M1 | TCP_F_I4));
		if (v->reg >= 0 || u->reg >= 0 || nib)
			return true;
		ts_view_span(q, u, &a, &b);
		if (a < hi && lo < b)
			return true;
	}
	return false;
}

/* Run op o's dependencies for block g + 1 issued in block g: its
 * distance-1 ones kept, those on the run kept, those on the loop prologue
 * replaced by the body's writers of its slotted sources, and every other
 * body op touching elements of its destination added (distance 0). Returns
 * the body index past the last body op touching its destination's buffer,
 * overlapping or not: the run stands after all of them. */
static uint32_t next_block_deps(tcp_sched *s, const pd *x, ts_id o, const uint8_t *copy)
{
	ts_op *q = &s->op[o];
	uint32_t keep = 0, at = 0;
	for (uint32_t j = 0; j < q->ndep; j++)
		if (q->dist[j] == 1 || in_run(x, q->dep[j]) || !ts_region_within(s, s->op[q->dep[j]].region, s->loop[0].prologue)) {
			q->dep[keep] = q->dep[j];
			q->dist[keep++] = q->dist[j];
		}
	q->ndep = keep;
	tcp_insn in = q->in;
	for (ts_id y = 0; y < s->nop; y++) {
		if (y == o || in_run(x, y) || copy[y] || !in_body(s, x, y))
			continue;
		if (touches(s, y, in.v[TCP_V_DST].t)) {
			uint32_t k = body_index(s, x->body, y) + 1;
			at = k > at ? k : at;
		}
		bool dep = overlaps(s, y, &in, TCP_V_DST);
		for (int w = TCP_V_S0; w < TCP_NVIEW && !dep; w++)
			dep = w != TCP_V_DST && in.v[w].t >= 0 && in.v[w].reg >= 0 && ts_op_writes(&s->op[y], in.v[w].t);
		if (dep)
			ts_add_dep(s, o, y, 0);
	}
	return at;
}

/* the slot block g + 1 reads, defined in guard region gd; *pe: its expert */
static ts_id next_slot(tcp_sched *s, const pd *x, ts_id gd, ts_id *pe_out)
{
	const ts_loop *l = &s->loop[0];
	ts_id pe = ts_add_scalar(s, gd, "pdenext", TS_SC_SPM_LD, 0, x->gnext, TS_NONE, s->sc[l->expert].imm);
	s->sc[pe].buf = s->sc[l->expert].buf;
	*pe_out = pe;
	if (!x->sx)
		return ts_add_scalar(s, gd, "pdslot", TS_SC_ALU, TCP_S_AND, x->gnext, TS_NONE, 1);
	ts_id df = ts_add_scalar(s, gd, "pddiff", TS_SC_CMP, TCP_C_NE, pe, l->expert, 0);
	ts_id sm = ts_add_scalar(s, gd, "pdsum", TS_SC_ALU, TCP_S_ADD, x->slot, df, 0);
	return ts_add_scalar(s, gd, "pdslot", TS_SC_ALU, TCP_S_AND, sm, TS_NONE, 1);
}

/* the prefetch copies of the run's slotted sources that no decode pass
 * reads (the scales) to the front of their region */
static void scales_first(tcp_sched *s, const pd *x, uint8_t *moved)
{
	for (ts_id y = 0; y < s->nop; y++) {
		const ts_op *q = &s->op[y];
		if (!in_body(s, x, y) || q->region == x->body || tcp_op_ctx[q->in.op] != TCP_CTX_DMA)
			continue;
		bool scale = false;
		for (uint32_t i = 0; i < x->n && !scale; i++) {
			const tcp_insn *in = &s->op[x->run[i]].in;
			for (int w = TCP_V_S0; w < TCP_NVIEW && !decodes(s, x->run[i]); w++)
				scale |= w != TCP_V_DST && in->v[w].t >= 0 && in->v[w].reg >= 0 && ts_op_writes(q, in->v[w].t);
		}
		if (!scale)
			continue;
		ts_id rg = q->region;
		ts_region_unlink(s, rg, TS_ITEM_OP | y);
		const ts_region *r = &s->rg[rg];
		uint32_t at = 0;
		while (at < r->nitem && TS_ITEM_KIND(r->item[at]) == TS_ITEM_SC)
			at++;
		while (at < r->nitem && TS_ITEM_KIND(r->item[at]) == TS_ITEM_OP &&
			tcp_op_ctx[s->op[TS_ITEM_ID(r->item[at])].in.op] == TCP_CTX_DMA &&
			moved[TS_ITEM_ID(r->item[at])])
			at++;
		ts_region_insert(s, rg, at, TS_ITEM_OP | y);
		moved[y] = 1;
	}
}

moe_status ts_rw_pipe_decode_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	pd x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	uint32_t nop0 = s->nop;
	/* block 0's run: copies under g == 0 where the run stood */
	ts_id first = ts_add_scalar(s, x.body, "pdfirst", TS_SC_CMP, TCP_C_EQ, l->g, TS_NONE, 0);
	place_last(s, x.body, x.at);
	ts_id f = ts_add_region(s, x.body, TS_RG_GUARD, first);
	place_last(s, x.body, x.at + 1);
	ts_id cp[PD_MAX];
	for (uint32_t i = 0; i < x.n; i++) {
		const ts_op *q = &s->op[x.run[i]];
		cp[i] = ts_add_op(s, f, &q->in, q->phase);
		s->op[cp[i]].feature = feature;
		s->op[cp[i]].node = s->op[x.run[i]].node;
		for (uint32_t j = 0; j < s->op[x.run[i]].ndep; j++) {
			ts_id d = s->op[x.run[i]].dep[j];
			if (s->op[x.run[i]].dist[j] != 0)
				continue;
			for (uint32_t k = 0; k < i; k++)
				d = d == x.run[k] ? cp[k] : d;
			ts_add_dep(s, cp[i], d, 0);
		}
	}
	uint8_t *copy = ctx_alloc(e->ctx, s->nop + 1);
	memset(copy, 0, s->nop + 1);
	for (uint32_t i = 0; i < x.n; i++)
		copy[cp[i]] = 1;
	/* every other waiter of a run op waits for its copy too, and for the
	 * run op at distance 1 (issued in the block before) */
	for (ts_id o = 0; o < nop0; o++) {
		if (in_run(&x, o))
			continue;
		ts_op *q = &s->op[o];
		uint32_t nd = q->ndep;
		for (uint32_t j = 0; j < nd; j++)
			for (uint32_t i = 0; i < x.n; i++)
				if (q->dep[j] == x.run[i] && q->dist[j] == 0) {
					q->dist[j] = 1;
					ts_add_dep(s, o, cp[i], 0);
					q = &s->op[o];
				}
	}
	/* block g + 1's run in block g, after every op of block g touching its
	 * destinations */
	for (uint32_t i = 0; i < x.n; i++)
		ts_region_unlink(s, x.body, TS_ITEM_OP | x.run[i]);
	uint32_t at = 0;
	for (uint32_t i = 0; i < x.n; i++) {
		uint32_t k = next_block_deps(s, &x, x.run[i], copy);
		at = k > at ? k : at;
		/* ordered with block 0's copies both ways (a guard skips one side) */
		for (uint32_t k = 0; k < x.n; k++) {
			ts_add_dep(s, x.run[i], cp[k], 0);
			ts_add_dep(s, cp[k], x.run[i], 1);
		}
	}
	for (uint32_t i = 0; i < x.n; i++) {
		const ts_op *q = &s->op[x.run[i]];
		for (uint32_t j = 0; j < q->ndep; j++)
			if (q->dist[j] == 0 && !in_run(&x, q->dep[j]) && in_body(s, &x, q->dep[j])) {
				uint32_t k = body_index(s, x.body, q->dep[j]) + 1;
				at = k > at ? k : at;
			}
	}
	ts_id more = body_scalar(s, x.body, TS_SC_CMP, TCP_C_LT, x.gnext, l->nb, 0);
	ts_id nx = ts_add_region(s, x.body, TS_RG_GUARD, more);
	place_last(s, x.body, at > x.at + 2 ? at : x.at + 2);
	ts_id pe, ns = next_slot(s, &x, nx, &pe);
	for (uint32_t i = 0; i < x.n; i++) {
		ts_op *q = &s->op[x.run[i]];
		ts_region_push(s, nx, TS_ITEM_OP | x.run[i]);
		q->region = nx;
		q->feature = feature;
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
			if (w != TCP_V_DST && q->in.v[w].t >= 0 && q->in.v[w].reg >= 0)
				q->in.v[w].reg = (int32_t)((ts_id)q->in.v[w].reg == x.slot ? ns : pe);
		ts_buf *b = &s->buf[q->in.v[TCP_V_DST].t];
		b->life = TS_LIFE_LOOP;
		b->first = b->last = TS_NONE;
	}
	memset(copy, 0, s->nop + 1);
	scales_first(s, &x, copy);
	ctx_free(e->ctx, copy, 0);
	return MOE_OK;
}
