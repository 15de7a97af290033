/* backend-tcp/compiler/rw/turn_contract.c: rewrite `turn-contract`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * A block's contraction is weight-stationary (docs/tcp-isa.md section 6):
 * the sub context loads every tile of the weight W [O, I] into TRF and the
 * block's M rows of x stream past it, so each block loads all of W into TRF
 * for M rows of work; for gpt-oss MXFP4 the decoded weights sit in DM. With
 * few rows the rewrite turns it around: x's M rows are one TRF tile held on
 * every slice (M x I elements, within the TRF), and W's rows stream from DM as
 * s0 through the switch: one tu.contract over dims [O, M, I] whose dst view
 * writes dst[m, o] at (o, m) (its strides swapped), reading W by the view
 * the TRF loads read it with. A group (the sub.ldtrf and tu.contract ops of
 * one graph node in one SEQ region of the loop body: a row-class case or the
 * body) is turned when its contractions cover W by column blocks (each the
 * whole of I, its dst at the block's columns) or by reduction chunks (each
 * the whole of O, an acc chain of f32 partials ending in the dst), every
 * contraction streams the same x view and has a valid count, and every
 * other reader of the dst has the same valid count (rows past it are zero
 * there, whatever the turned contraction wrote in them: it has no valid
 * count, its outer loop being W's rows). Values are unchanged: each output
 * is the f32 sum of the same bf16 products in index order (the acc chain's
 * partials are f32, so one pass over I sums the same), rounded once into
 * the dst; the dropped TRF tiles and partials go with their ops. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { TC_MAX = 16 };

typedef struct tc_group {
	ts_id rg;                /* the SEQ region */
	int64_t M;               /* x's rows (the contractions' dims[0]) */
	ts_id ld[TC_MAX], ct[TC_MAX];
	uint32_t nld, nct;
	ts_id out;               /* the contraction writing the dst */
	int64_t O, I;
	tcp_view w, x, d;        /* W by its first load's view, x, the dst at (0, 0) */
} tc_group;

static bool is_ct(const tcp_sched *s, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	return in->op == TCP_OP_TU_CONTRACT && !(in->flags & (TCP_F_BF16X3 | TCP_F_SCALED)) &&
	       in->v[TCP_V_S1].t >= 0 && s->buf[in->v[TCP_V_S1].t].dtype == MOE_BF16 &&
	       s->buf[in->v[TCP_V_S0].t].dtype == MOE_BF16;
}

/* the group's load writing TRF buffer t, or TS_NONE */
static ts_id loader(const tcp_sched *s, const tc_group *g, int32_t t)
{
	for (uint32_t k = 0; k < g->nld; k++)
		if (s->op[g->ld[k]].in.v[TCP_V_DST].t == t)
			return g->ld[k];
	return TS_NONE;
}

/* Whether the group's ops (collected) have one of the two shapes; fills O,
 * I, the views and out. Each contraction's load precedes it in the region
 * and the loads write each TRF buffer for one contraction at a time. */
static bool shaped(const tcp_sched *s, tc_group *g)
{
	if (g->nct < 1 || g->nld != g->nct)
		return false;
	const tcp_insn *c0 = &s->op[g->ct[0]].in;
	int64_t xs = c0->v[TCP_V_S0].stride[0];
	bool byo = g->nct == 1 || !(s->op[g->ct[1]].in.flags & TCP_F_ACC); /* else an acc chain */
	int64_t o = 0, i = 0, rs = -1;
	for (uint32_t k = 0; k < g->nct; k++) {
		const tcp_insn *c = &s->op[g->ct[k]].in;
		ts_id l = g->ld[k]; /* loads and contractions alternate: the k-th load feeds the k-th */
		if (l > g->ct[k] || s->op[l].in.v[TCP_V_DST].t != c->v[TCP_V_S1].t)
			return false;
		const tcp_insn *ld = &s->op[l].in;
		const tcp_view *cx = &c->v[TCP_V_S0], *cw = &ld->v[TCP_V_S0], *cd = &c->v[TCP_V_DST];
		if (c->ndim != 3 || c->dim[0] != g->M || c->vreg != c0->vreg || c->vreg < 0 || cx->t != c0->v[TCP_V_S0].t ||
			cx->reg >= 0 || cx->stride[0] != xs || cx->stride[1] != 0 || cx->stride[2] != 1 || ld->ndim != 2 ||
			ld->dim[0] != c->dim[1] || ld->dim[1] != c->dim[2] || cw->reg >= 0 || cw->stride[1] != 1 ||
			cd->reg >= 0 || cd->stride[1] != 1 || cd->stride[2] != 0 || (rs >= 0 && cw->stride[0] != rs) ||
			c->v[TCP_V_S1].stride[0] != 0 || c->v[TCP_V_S1].stride[1] != c->dim[2] ||
			c->v[TCP_V_S1].stride[2] != 1 || c->v[TCP_V_S1].base != 0 || c->v[TCP_V_S1].reg >= 0)
			return false;
		rs = cw->stride[0];
		if (k == 0) {
			g->w = *cw;
			g->x = *cx;
			g->d = *cd;
		}
		if (byo) { /* column blocks: I whole, the dst and W at the block's columns */
			if ((c->flags & TCP_F_ACC) || cx->base != g->x.base || cd->t != g->d.t ||
				cd->stride[0] != g->d.stride[0] || cd->base != g->d.base + o ||
				cw->t != g->w.t || cw->base != g->w.base + o * rs || (k > 0 && c->dim[2] != g->I))
				return false;
			g->I = c->dim[2];
			o += c->dim[1];
			g->O = o;
		} else { /* reduction chunks: O whole, x and W at the chunk's offset, an acc chain */
			bool acc = (c->flags & TCP_F_ACC) != 0;
			if (acc != (k > 0) || cx->base != g->x.base + i || cw->t != g->w.t || cw->base != g->w.base + i ||
				(k > 0 && (c->dim[1] != g->O || c->v[TCP_V_S2].t != s->op[g->ct[k - 1]].in.v[TCP_V_DST].t)))
				return false;
			g->O = c->dim[1];
			i += c->dim[2];
			g->I = i;
			g->d = *cd;
		}
	}
	g->out = g->ct[g->nct - 1];
	return true;
}

/* Whether every op outside the group reading the dst's buffer has the
 * contractions' valid count, and nothing outside reads a partial or tile. */
static bool readers_valid(const tcp_sched *s, const tc_group *g)
{
	int32_t vr = s->op[g->ct[0]].in.vreg, dt = s->op[g->out].in.v[TCP_V_DST].t;
	for (ts_id o = 0; o < s->nop; o++) {
		bool mine = false;
		for (uint32_t k = 0; k < g->nct; k++)
			mine |= o == g->ct[k] || o == g->ld[k];
		if (mine)
			continue;
		if (ts_op_reads(&s->op[o], dt) && s->op[o].in.vreg != vr)
			return false;
		for (uint32_t k = 0; k + 1 < g->nct; k++)
			if (s->op[g->ct[k]].in.v[TCP_V_DST].t != dt && (ts_op_reads(&s->op[o], s->op[g->ct[k]].in.v[TCP_V_DST].t) ||
									  ts_op_writes(&s->op[o], s->op[g->ct[k]].in.v[TCP_V_DST].t)))
				return false;
		for (uint32_t k = 0; k < g->nld; k++)
			if (ts_op_reads(&s->op[o], s->op[g->ld[k]].in.v[TCP_V_DST].t))
				return false;
	}
	return true;
}

/* Whether W is a decoded weight: a DM buffer some vector pass of the loop
 * body writes (a dequant's decode; a bf16 layer's weights are DMA copies,
 * left weight-stationary). */
static bool decoded(const tcp_sched *s, const tc_group *g)
{
	int32_t w = g->w.t;
	if (w < 0 || s->buf[w].space != TCP_DM)
		return false;
	for (ts_id o = 0; o < s->nop; o++)
		if (s->op[o].in.op == TCP_OP_TU_VEC && ts_op_writes(&s->op[o], w) &&
			ts_region_within(s, s->op[o].region, s->loop[0].body))
			return true;
	return false;
}

/* the x tile's bytes on every slice within the TRF */
static bool fits(const tcp_sched *s, const tc_group *g)
{
	int64_t trf = s->m ? s->m->lanes_per_slice * s->m->trf_bytes_per_lane : 65536;
	return g->M * g->I * 2 <= trf;
}

static bool in_group(const tc_group *g, ts_id o)
{
	for (uint32_t k = 0; k < g->nct; k++)
		if (o == g->ct[k] || o == g->ld[k])
			return true;
	return false;
}

static void after_scalar(const tcp_sched *s, ts_id rg, const tcp_view *v, int64_t *lo)
{
	if (v->t < 0 || v->reg < 0 || (ts_id)v->reg >= s->nsc)
		return;
	int64_t k = ts_item_index(s, rg, s->sc[v->reg].region, TS_ITEM_SC | (ts_id)v->reg);
	*lo = k > *lo ? k : *lo;
}

/* The index of group g's region before which the turned pair (x's load,
 * then the contraction) stands, counted with every group op still in
 * place; -1 when none is legal. The pair stands where the contraction
 * stood unless an op waiting (distance 0) on a group op stands before that
 * (a writer of W after its last tile load: the turned contraction reads W
 * itself, so that writer must follow it): then just before the first such
 * waiter, which must follow every item the group's ops wait for and every
 * scalar the turned views name. */
static int64_t turn_index(const tcp_sched *s, const tc_group *g)
{
	int64_t at = ts_op_index(s, g->rg, g->out), lo = -1;
	if (at < 0)
		return -1;
	for (ts_id o = 0; o < s->nop; o++) {
		const ts_op *p = &s->op[o];
		bool mine = in_group(g, o);
		for (uint32_t d = 0; d < p->ndep; d++) {
			ts_id on = p->dep[d];
			if (p->dist[d] || on >= s->nop || mine == in_group(g, on))
				continue;
			int64_t k = ts_op_index(s, g->rg, mine ? on : o);
			if (mine)
				lo = k > lo ? k : lo;
			else if (k >= 0 && k < at)
				at = k;
		}
	}
	after_scalar(s, g->rg, &g->w, &lo);
	after_scalar(s, g->rg, &g->x, &lo);
	after_scalar(s, g->rg, &g->d, &lo);
	return lo < at ? at : -1;
}

/* The next group of region rg from item *at on (by the node of its first
 * contraction); false when none is left. */
static bool next_group(const tcp_sched *s, ts_id rg, int64_t M, uint32_t *at, tc_group *g)
{
	const ts_region *r = &s->rg[rg];
	for (; *at < r->nitem; (*at)++) {
		uint32_t it = r->item[*at];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP || !is_ct(s, TS_ITEM_ID(it)))
			continue;
		memset(g, 0, sizeof *g);
		g->rg = rg;
		moe_id node = s->op[TS_ITEM_ID(it)].node;
		g->M = M > 0 ? M : s->op[TS_ITEM_ID(it)].in.dim[0];
		bool ok = true;
		for (uint32_t k = 0; k < r->nitem && ok; k++) {
			uint32_t jt = r->item[k];
			if (TS_ITEM_KIND(jt) != TS_ITEM_OP || s->op[TS_ITEM_ID(jt)].node != node)
				continue;
			ts_id o = TS_ITEM_ID(jt);
			uint8_t op = s->op[o].in.op;
			if (op == TCP_OP_SUB_TRF && g->nld < TC_MAX)
				g->ld[g->nld++] = o;
			else if (op == TCP_OP_TU_CONTRACT && is_ct(s, o) && g->nct < TC_MAX)
				g->ct[g->nct++] = o;
			else if (op == TCP_OP_SUB_TRF || op == TCP_OP_TU_CONTRACT)
				ok = false;
		}
		(*at)++;
		if (ok && shaped(s, g) && fits(s, g) && decoded(s, g) && readers_valid(s, g) &&
			loader(s, g, s->op[g->ct[0]].in.v[TCP_V_S1].t) == g->ld[0] && turn_index(s, g) >= 0)
			return true;
	}
	return false;
}

/* the SEQ regions of the loop body holding contractions: the body, the
 * cases of its classes regions (bound[k] rows) */
static bool find_any(const tcp_sched *s, tc_group *g)
{
	if (s->nloop < 1)
		return false;
	ts_id body = s->loop[0].body;
	uint32_t at = 0;
	if (next_group(s, body, 0, &at, g))
		return true;
	const ts_region *b = &s->rg[body];
	for (uint32_t k = 0; k < b->nitem; k++) {
		uint32_t it = b->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_RG || s->rg[TS_ITEM_ID(it)].kind != TS_RG_CLASSES)
			continue;
		const ts_region *c = &s->rg[TS_ITEM_ID(it)];
		for (uint32_t j = 0; j < c->nitem && j < c->nbound; j++) {
			at = 0;
			if (next_group(s, TS_ITEM_ID(c->item[j]), c->bound[j], &at, g))
				return true;
		}
	}
	return false;
}

bool ts_rw_turn_contract_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	tc_group g;
	return find_any(s, &g);
}

/* Group g turned: its first load loads x, its last contraction is the
 * turned one, the others go. */
static void turn(tcp_sched *s, const tc_group *g, uint16_t feature, uint8_t *cand)
{
	ts_id ld = g->ld[0], ct = g->out;
	int32_t tile = s->op[ld].in.v[TCP_V_DST].t;
	int64_t at = turn_index(s, g);
	for (uint32_t k = 0; k < g->nct; k++) {
		cand[s->op[g->ld[k]].in.v[TCP_V_DST].t] = 1;
		cand[s->op[g->ct[k]].in.v[TCP_V_DST].t] = 1;
	}
	/* x's tile on every slice */
	ts_buf *tb = &s->buf[tile];
	tb->rank = 2;
	tb->shape[0] = g->M;
	tb->shape[1] = g->I;
	tb->layout.slice0 = 0;
	tb->layout.nslices = 1;
	tb->layout.copies = (uint16_t)(s->m ? s->m->clusters * s->m->slices_per_cluster : 512);
	tb->layout.split = TS_SPLIT_FLIT;
	tb->layout.slice_bytes = g->M * g->I * 2;
	tcp_insn *l = &s->op[ld].in;
	l->dim[0] = g->M;
	l->dim[1] = g->I;
	l->v[TCP_V_S0] = g->x;
	l->v[TCP_V_S0].stride[1] = 1;
	l->v[TCP_V_S0].stride[2] = 0;
	l->v[TCP_V_DST].base = 0;
	l->v[TCP_V_DST].stride[0] = g->I;
	l->v[TCP_V_DST].stride[1] = 1;
	tcp_insn *c = &s->op[ct].in;
	c->flags &= (uint8_t)~TCP_F_ACC;
	c->vreg = -1;
	c->dim[0] = g->O;
	c->dim[1] = g->M;
	c->dim[2] = g->I;
	c->tile = g->M;
	c->v[TCP_V_S0] = g->w;
	c->v[TCP_V_S0].stride[1] = 0;
	c->v[TCP_V_S0].stride[2] = 1;
	c->v[TCP_V_S1] = tcp_view_none();
	c->v[TCP_V_S1].t = tile;
	c->v[TCP_V_S1].stride[1] = g->I;
	c->v[TCP_V_S1].stride[2] = 1;
	c->v[TCP_V_DST] = g->d; /* dst[m, o] at (o, m) */
	c->v[TCP_V_DST].stride[1] = g->d.stride[0];
	c->v[TCP_V_DST].stride[0] = 1;
	c->v[TCP_V_DST].stride[2] = 0;
	c->v[TCP_V_S2] = tcp_view_none();
	s->op[ld].feature = s->op[ct].feature = feature;
	/* dependencies: the load's and the contraction's are every group op's
	 * outside the group (a previous block's group op: the contraction) */
	ts_id keep[2] = {ld, ct};
	for (int q = 0; q < 2; q++) {
		ts_id o = keep[q];
		ts_id *dep = ctx_alloc(s->ctx, (TS_MAX_DEPS + 1) * sizeof *dep);
		uint8_t *dist = ctx_alloc(s->ctx, TS_MAX_DEPS + 1);
		uint32_t n = 0;
		for (uint32_t k = 0; k < g->nct * 2; k++) {
			ts_id src = k < g->nct ? g->ct[k] : g->ld[k - g->nct];
			for (uint32_t d = 0; d < s->op[src].ndep; d++) {
				ts_id on = s->op[src].dep[d];
				uint8_t di = s->op[src].dist[d];
				if (in_group(g, on) && di == 0)
					continue;
				on = in_group(g, on) ? ct : on;
				bool seen = on == o || n >= TS_MAX_DEPS;
				for (uint32_t j = 0; j < n && !seen; j++)
					seen = dep[j] == on && dist[j] == di;
				if (!seen) {
					dep[n] = on;
					dist[n++] = di;
				}
			}
		}
		s->op[o].ndep = 0;
		for (uint32_t j = 0; j < n; j++)
			ts_add_dep(s, o, dep[j], dist[j]);
		ctx_free(s->ctx, dist, 0);
		ctx_free(s->ctx, dep, 0);
	}
	ts_add_dep(s, ct, ld, 0);
	/* the pair at index `at` (turn_index), the load of x just before the
	 * contraction */
	ts_region *r = &s->rg[g->rg];
	for (int q = 0; q < 2; q++) {
		uint32_t k = 0;
		while (k < r->nitem && r->item[k] != (TS_ITEM_OP | keep[q]))
			k++;
		at -= k < at;
		memmove(r->item + k, r->item + k + 1, (r->nitem - k - 1) * sizeof *r->item);
		r->nitem--;
	}
	ts_region_insert(s, g->rg, (uint32_t)at, TS_ITEM_OP | ct);
	ts_region_insert(s, g->rg, (uint32_t)at, TS_ITEM_OP | ld);
	/* waiters of a group op wait for the turned contraction (it reads W
	 * and writes the dst now), once */
	for (ts_id o = 0; o < s->nop; o++) {
		if (in_group(g, o))
			continue;
		ts_op *p = &s->op[o];
		uint32_t w = 0;
		for (uint32_t d = 0; d < p->ndep; d++) {
			ts_id on = in_group(g, p->dep[d]) ? ct : p->dep[d];
			bool seen = false;
			for (uint32_t j = 0; j < w && !seen; j++)
				seen = p->dep[j] == on && p->dist[j] == p->dist[d];
			if (!seen) {
				p->dep[w] = on;
				p->dist[w++] = p->dist[d];
			}
		}
		p->ndep = w;
	}
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *u = &s->buf[b];
		if (u->life != TS_LIFE_SPAN)
			continue;
		if (u->first != TS_NONE && in_group(g, u->first) && u->first != ld)
			u->first = ct;
		if (u->last != TS_NONE && in_group(g, u->last) && u->last != ld)
			u->last = ct;
	}
	tb->life = TS_LIFE_SPAN;
	tb->first = ld;
	tb->last = ct;
}

moe_status ts_rw_turn_contract_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	tc_group g;
	if (!find_any(s, &g))
		return MOE_ERR_INVALID;
	uint8_t *cand = ctx_alloc(e->ctx, s->nbuf + 1);
	memset(cand, 0, s->nbuf + 1);
	uint8_t *drop = ctx_alloc(e->ctx, s->nop + 1);
	memset(drop, 0, s->nop + 1);
	/* every group, each turned once: a turned group no longer matches
	 * (its contraction has no valid count) */
	for (int guard = 0; guard < 4096 && find_any(s, &g); guard++) {
		turn(s, &g, feature, cand);
		for (uint32_t k = 0; k < g.nct; k++) {
			if (g.ct[k] != g.out) {
				drop[g.ct[k]] = 1;
				s->op[g.ct[k]].in.vreg = -1; /* no longer matched */
			}
			if (g.ld[k] != g.ld[0])
				drop[g.ld[k]] = 1;
		}
	}
	/* the dropped ops' own dependencies and views no longer matter: their
	 * views are cleared so unused buffers go */
	for (ts_id o = 0; o < s->nop; o++)
		if (drop[o])
			for (int w = 0; w < TCP_NVIEW; w++)
				s->op[o].in.v[w].t = -1;
	ts_drop_ops(s, drop);
	ts_drop_unused_bufs(s, cand);
	ctx_free(e->ctx, drop, 0);
	ctx_free(e->ctx, cand, 0);
	return MOE_OK;
}
