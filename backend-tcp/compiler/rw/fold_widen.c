/* backend-tcp/compiler/rw/fold_widen.c: rewrite `fold-widen` (rewrites.def,
 * docs/tcp-compiler.md 5.2).
 *
 * sched-build gives a cast of a bf16 value to f32 that an elementwise chain
 * reads (SwiGLU's casts of the gate and up contractions, in every block) a
 * pass of its own: a tu.vec without steps copying the bf16 buffer into an f32
 * one, which the chain's pass then reads, once per operand that names it. A
 * pass reads any stored type and computes in f32, so the chain can read the
 * bf16 buffer itself: the rewrite drops the widening pass, its one reader
 * reads the pass's source through the pass's source view, and a reader that
 * names the same view twice reads it once (one stream fewer to fetch).
 * Values are unchanged: widening bf16 to f32 is exact, so the chain's steps
 * see the same f32 operands. Dependencies: the reader waits for what the
 * dropped pass waited for, and whatever waited for the dropped pass (a later
 * writer of its source, the next block's) waits for the reader. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* a view naming a buffer directly */
static bool same_view(const tcp_view *a, const tcp_view *b, int nd)
{
	if (a->t != b->t || a->reg != b->reg || a->base != b->base || a->scale != b->scale)
		return false;
	for (int k = 0; k < nd; k++)
		if (a->stride[k] != b->stride[k])
			return false;
	return true;
}

/* The widening pass a: a tu.vec without steps from a bf16 DM buffer into an
 * f32 DM scratch buffer; its one reader c (a tu.vec over the same dims and
 * rows, naming a's destination only through a's destination view); a's
 * destination written by a alone and read by no scalar. TS_NONE when a is
 * not one. */
static ts_id reader_of(const tcp_sched *s, ts_id a)
{
	const tcp_insn *in = &s->op[a].in;
	const tcp_view *d = &in->v[TCP_V_DST], *x = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_TU_VEC || in->nstep != 0 || (in->flags & ~(unsigned)TCP_F_ROUTE) || d->t < 0 || x->t < 0 ||
	    in->v[TCP_V_S1].t >= 0 || in->v[TCP_V_S2].t >= 0 || d->t == x->t)
		return TS_NONE;
	const ts_buf *db = &s->buf[d->t], *xb = &s->buf[x->t];
	if (db->space != TCP_DM || xb->space != TCP_DM || db->kind != TCP_T_SCRATCH || db->dtype != MOE_F32 ||
	    xb->dtype != MOE_BF16)
		return TS_NONE;
	ts_id c = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == a)
			continue;
		const tcp_insn *r = &s->op[o].in;
		for (int w = 0; w < TCP_NVIEW; w++) {
			if (r->v[w].t != d->t)
				continue;
			if (w == TCP_V_DST || (c != TS_NONE && c != o))
				return TS_NONE;
			if (r->op != TCP_OP_TU_VEC || (r->flags & (TCP_F_E2M1 | TCP_F_I4)) || r->vreg != in->vreg ||
			    r->ndim != in->ndim || memcmp(r->dim, in->dim, sizeof(int64_t) * in->ndim) ||
			    !same_view(&r->v[w], d, in->ndim))
				return TS_NONE;
			c = o;
		}
	}
	for (ts_id k = 0; k < s->nsc && c != TS_NONE; k++)
		if (s->sc[k].kind == TS_SC_SPM_LD && s->sc[k].buf == (ts_id)d->t)
			return TS_NONE;
	return c;
}

bool ts_rw_fold_widen_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	for (ts_id o = 0; o < s->nop; o++)
		if (reader_of(s, o) != TS_NONE)
			return true;
	return false;
}

static void add_dep_once(tcp_sched *s, ts_id o, ts_id on, int dist)
{
	if (o == on)
		return;
	for (uint32_t k = 0; k < s->op[o].ndep; k++)
		if (s->op[o].dep[k] == on && s->op[o].dist[k] == dist)
			return;
	ts_add_dep(s, o, on, dist);
}

/* c reads a's source in place of a's destination; views c names twice are
 * read once (the later source slot's steps read the earlier slot, the
 * sources after it move down one slot) */
static void retarget(tcp_insn *c, const tcp_insn *a)
{
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
		if (c->v[w].t == a->v[TCP_V_DST].t)
			c->v[w] = a->v[TCP_V_S0];
	for (int w = TCP_V_S1; w < TCP_NVIEW; w++) {
		int p = TCP_V_S0;
		while (p < w && !(c->v[p].t >= 0 && same_view(&c->v[p], &c->v[w], c->ndim)))
			p++;
		if (p == w || c->v[w].t < 0)
			continue;
		for (int i = 0; i < c->nstep; i++) {
			uint8_t *src[2] = {&c->step[i].x, &c->step[i].y};
			for (int k = 0; k < 2; k++)
				if (*src[k] >= TCP_SRC_S0 && *src[k] <= TCP_SRC_S2) {
					int v = TCP_V_S0 + (*src[k] - TCP_SRC_S0);
					v = v == w ? p : v > w ? v - 1 : v;
					*src[k] = (uint8_t)(TCP_SRC_S0 + (v - TCP_V_S0));
				}
		}
		for (int q = w; q + 1 < TCP_NVIEW; q++)
			c->v[q] = c->v[q + 1];
		c->v[TCP_NVIEW - 1] = tcp_view_none();
		w--;
	}
}

/* removes the ops marked in drop: ids stay dense, every reference renumbered */
static void compact(tcp_sched *s, const uint8_t *drop)
{
	ts_id *map = ctx_alloc(s->ctx, s->nop * sizeof *map);
	ts_id n = 0;
	for (ts_id o = 0; o < s->nop; o++)
		map[o] = drop[o] ? TS_NONE : n++;
	for (ts_id o = 0; o < s->nop; o++) {
		if (map[o] == TS_NONE)
			continue;
		ts_op *p = &s->op[o];
		uint32_t keep = 0;
		for (uint32_t j = 0; j < p->ndep; j++)
			if (map[p->dep[j]] != TS_NONE) {
				p->dep[keep] = map[p->dep[j]];
				p->dist[keep++] = p->dist[j];
			}
		p->ndep = keep;
		if (s->op_line)
			s->op_line[map[o]] = s->op_line[o];
		s->op[map[o]] = *p;
	}
	for (ts_id r = 0; r < s->nrg; r++) {
		ts_region *g = &s->rg[r];
		uint32_t keep = 0;
		for (uint32_t k = 0; k < g->nitem; k++) {
			uint32_t it = g->item[k];
			if (TS_ITEM_KIND(it) == TS_ITEM_OP) {
				if (map[TS_ITEM_ID(it)] == TS_NONE)
					continue;
				it = TS_ITEM_OP | map[TS_ITEM_ID(it)];
			}
			g->item[keep++] = it;
		}
		g->nitem = keep;
	}
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life != TS_LIFE_SPAN)
			continue;
		f->first = f->first == TS_NONE ? TS_NONE : map[f->first];
		f->last = f->last == TS_NONE ? TS_NONE : map[f->last];
	}
	s->nop = n;
	ctx_free(s->ctx, map, 0);
}

/* drops widening pass a read by c */
static void fold(tcp_sched *s, ts_id a, ts_id c, const uint32_t *pos, uint16_t feature)
{
	const tcp_insn *ai = &s->op[a].in;
	ts_id src = (ts_id)ai->v[TCP_V_S0].t, dst = (ts_id)ai->v[TCP_V_DST].t;
	retarget(&s->op[c].in, ai);
	s->op[c].feature = feature;
	for (uint32_t j = 0; j < s->op[a].ndep; j++)
		add_dep_once(s, c, s->op[a].dep[j], s->op[a].dist[j]);
	for (ts_id o = 0; o < s->nop; o++)
		for (uint32_t j = 0; j < s->op[o].ndep && o != c; j++)
			if (s->op[o].dep[j] == a)
				add_dep_once(s, o, c, s->op[o].dist[j]);
	/* the source lives to the reader; the widened buffer, read by nothing
	 * now, only at the reader */
	ts_buf *sb = &s->buf[src], *db = &s->buf[dst];
	if (sb->life == TS_LIFE_SPAN && (sb->last == TS_NONE || sb->last == a || pos[c] > pos[sb->last]))
		sb->last = c;
	db->life = TS_LIFE_SPAN;
	db->first = db->last = c;
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life == TS_LIFE_SPAN && f->first == a)
			f->first = c;
		if (f->life == TS_LIFE_SPAN && f->last == a)
			f->last = c;
	}
}

moe_status ts_rw_fold_widen_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	memset(drop, 0, s->nop + 1);
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	bool any = false;
	for (ts_id a = 0; a < s->nop; a++) {
		ts_id c = reader_of(s, a);
		if (c == TS_NONE || drop[c] || pos[c] < pos[a])
			continue;
		fold(s, a, c, pos, feature);
		drop[a] = 1;
		any = true;
	}
	ctx_free(s->ctx, pos, 0);
	if (any)
		compact(s, drop);
	ctx_free(s->ctx, drop, 0);
	return any ? MOE_OK : MOE_ERR_INVALID;
}
