/* backend-tcp/compiler/rw/spec_group.c: rewrite `spec-group`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * spec-fetch, for group-runs' slots. With group-runs the loop's prologue
 * gathers the first k experts hit (hit list entries 0..k-1, valid
 * min(k, $gfnhit)) into half 0 of each weight slot buffer. The list and its
 * length are known only when routing has counted each expert's blocks and
 * the staging has run, so on the in-order DMA context that gather waits
 * for routing while the DMA context idles. Under uniform routing with T K
 * >= 4 E every expert is hit with probability at least 1 - e^-4, so the
 * first k experts hit are experts 0..k-1, which lie contiguously in each
 * packed HBM weight buffer, as the gather lays entries 0..k-1 out in half
 * 0. The rewrite
 *   - copies experts 0..k-1's rows of each packed buffer into half 0 (one
 *     dma.copy each) where the DMA context would otherwise wait for routing
 *     (ts_spec_insert_at, as spec-fetch);
 *   - adds a pass beside nb's (the sum over E of the per-expert block
 *     counts) that finds the first expert without blocks (E where every
 *     expert has some), written at element 2 of nb's buffer, which the
 *     staging already walks (group-runs put the hit count at element 1),
 *     loaded in the prologue as $sgk; the timeline stands in the same value
 *     from the loads (tcp_staged_counts);
 *   - runs the prologue's gathers only when $sgk < k (a guard).
 * Values are unchanged: half 0 holds the first k experts hit either way
 * (when $sgk >= k they are experts 0..k-1, which the copies wrote); the
 * prologue's gathers wait for the copies (both write half 0) and every op
 * that waited for a prologue gather waits for its copy too (the guard may
 * skip the gather). A miss costs the copies' time on the DMA context; the
 * prediction on expected loads decides. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { SG_MAX = 8 };

typedef struct sg {
	ts_id v0;            /* $gfv0 = alu.min $gfnhit, k */
	int64_t k;
	ts_id g[SG_MAX];     /* the prologue's gathers */
	uint32_t n;
	ts_id N, nbop, spm;  /* nb's buffer, the pass writing nb, the staging */
} sg;

/* An op of nothing but one element of nb's buffer N: its dst view. */
static bool one_element(const tcp_insn *in, int64_t *at)
{
	const tcp_view *d = &in->v[TCP_V_DST];
	for (int k = 0; k < in->ndim; k++)
		if (d->stride[k] != 0)
			return false;
	*at = d->base;
	return d->reg < 0;
}

static bool gather_ok(const tcp_sched *s, const sg *x, ts_id o)
{
	const ts_op *p = &s->op[o];
	const tcp_insn *in = &p->in;
	const tcp_view *d = &in->v[TCP_V_DST], *w = &in->v[TCP_V_S0], *h = &in->v[TCP_V_S1];
	if (in->op != TCP_OP_DMA_GATHER || in->vreg < 0 || (ts_id)in->vreg != x->v0 || in->ndim != 3 || in->dim[0] != 1 ||
		in->dim[1] != x->k || d->t < 0 || w->t < 0 || h->t < 0 || d->reg >= 0 || w->reg >= 0 || h->reg >= 0 ||
		d->base != 0 || w->base != 0 || h->base != 0 || d->stride[1] != in->dim[2] || d->stride[2] != 1 ||
		w->stride[1] != in->dim[2] || w->stride[2] != 1 || (in->flags & ~TCP_F_JOIN))
		return false;
	const ts_buf *db = &s->buf[d->t], *wb = &s->buf[w->t];
	if (db->space != TCP_DM || db->slots != 2 || db->kind != TCP_T_SCRATCH || wb->space != TCP_HBM ||
		ts_buf_numel(db) < x->k * in->dim[2] || ts_buf_numel(wb) < x->k * in->dim[2])
		return false;
	return !ts_buf_written(s, (ts_id)w->t) && !ts_buf_touched_outside(s, (ts_id)d->t, s->loop[0].region);
}

static bool find(const tcp_sched *s, sg *x)
{
	memset(x, 0, sizeof *x);
	if (!s->m || s->nloop != 1 || s->loop[0].weights != TS_W_DOUBLE || s->loop[0].nb == TS_NONE)
		return false;
	const ts_meta *mt = &s->meta;
	if (mt->E < 2 || mt->K < 1 || mt->T < 1 || mt->T * mt->K < 4 * mt->E)
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_scalar *nb = &s->sc[l->nb];
	if (nb->kind != TS_SC_SPM_LD || nb->a != TS_NONE || nb->imm != 0 || nb->region != s->top)
		return false;
	x->N = nb->buf;
	const ts_region *pro = &s->rg[l->prologue];
	x->v0 = TS_NONE;
	for (uint32_t i = 0; i < pro->nitem; i++) {
		uint32_t it = pro->item[i];
		ts_id id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_SC) {
			const ts_scalar *c = &s->sc[id];
			const ts_scalar *a = c->a < s->nsc ? &s->sc[c->a] : NULL;
			if (c->kind == TS_SC_SPM_LD && c->buf == x->N && c->a == TS_NONE && c->imm == 2)
				return false; /* applied already */
			if (x->v0 == TS_NONE && c->kind == TS_SC_ALU && c->op == TCP_S_MIN && c->b == TS_NONE && c->imm >= 2 &&
				c->imm <= mt->E && a && a->kind == TS_SC_SPM_LD && a->buf == x->N && a->a == TS_NONE && a->imm == 1)
				x->v0 = id, x->k = c->imm;
			continue;
		}
		if (TS_ITEM_KIND(it) != TS_ITEM_OP || x->v0 == TS_NONE || s->op[id].in.op != TCP_OP_DMA_GATHER)
			continue;
		if (x->n == SG_MAX || !gather_ok(s, x, id))
			return false;
		x->g[x->n++] = id;
	}
	if (!x->n)
		return false;
	/* nb's buffer: i32 DM of >= 3 elements, staged whole (stride 1); its
	 * writers write one element each, none element 2; nb's pass the sum of
	 * the per-expert counts */
	const ts_buf *nbuf = &s->buf[x->N];
	if (nbuf->space != TCP_DM || nbuf->dtype != MOE_I32 || nbuf->slots != 1 || ts_buf_numel(nbuf) < 3)
		return false;
	x->nbop = x->spm = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (in->op == TCP_OP_DMA_SPM) {
			for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
				if (in->v[w].t >= 0 && (ts_id)in->v[w].t == x->N) {
					if (x->spm != TS_NONE || s->op[o].region != s->top || in->v[w].reg >= 0 ||
						in->v[w].base != 0 || in->v[w].stride[0] != 1 || in->ndim != 1 || in->dim[0] < 3)
						return false;
					x->spm = o;
				}
			continue;
		}
		int64_t at;
		if (!ts_op_writes(&s->op[o], (int32_t)x->N))
			continue;
		if (!one_element(in, &at) || at == 2 || s->op[o].region != s->top)
			return false;
		if (at == 0)
			x->nbop = o;
	}
	if (x->nbop == TS_NONE || x->spm == TS_NONE)
		return false;
	const tcp_insn *in = &s->op[x->nbop].in;
	const tcp_view *v = &in->v[TCP_V_S0];
	return in->op == TCP_OP_TU_VEC && in->ndim == 1 && in->dim[0] == mt->E && in->nstep == 1 &&
	       in->step[0].op == TCP_V_RSUM && in->step[0].x == TCP_SRC_S0 && in->vreg < 0 && v->t >= 0 && v->reg < 0 &&
	       v->base == 0 && v->stride[0] == 1 && in->v[TCP_V_S1].t < 0 && in->v[TCP_V_S2].t < 0 &&
	       s->buf[v->t].dtype == MOE_I32;
}

bool ts_rw_spec_group_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sg x;
	return find(s, &x);
}

/* The last item of region rg (just appended) moved to stand at position at. */
static void last_to(tcp_sched *s, ts_id rg, uint32_t at)
{
	ts_region *r = &s->rg[rg];
	uint32_t it = r->item[--r->nitem];
	ts_region_insert(s, rg, at <= r->nitem ? at : r->nitem, it);
}

moe_status ts_rw_spec_group_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	sg x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	ts_id pro = s->loop[0].prologue, nop0 = s->nop;
	/* the first expert without blocks (E where every one has some), at
	 * element 2 of nb's buffer: min over e of (blocks[e] != 0) << sh + e,
	 * 2^sh >= E, then at most E */
	tcp_insn in = s->op[x.nbop].in;
	int sh = 0;
	while ((int64_t)1 << sh < s->meta.E)
		sh++;
	in.v[TCP_V_DST].base = 2;
	in.nstep = 5;
	in.step[0] = (tcp_step){TCP_V_TNE, TCP_SRC_S0, TCP_SRC_IMM, 0, 0, 0};
	in.step[1] = (tcp_step){TCP_V_SHL, TCP_SRC_V, TCP_SRC_IMM, 0, 0, (uint32_t)sh};
	in.step[2] = (tcp_step){TCP_V_IADD, TCP_SRC_V, TCP_SRC_CTR, 0, 0, 0};
	in.step[3] = (tcp_step){TCP_V_RMIN, TCP_SRC_V, TCP_SRC_NONE, 0, 0, 0};
	in.step[4] = (tcp_step){TCP_V_IMIN, TCP_SRC_V, TCP_SRC_IMM, 0, 0, (uint32_t)s->meta.E};
	ts_id cnt = ts_add_op(s, TS_NONE, &in, s->op[x.nbop].phase);
	s->op[cnt].region = s->top;
	s->op[cnt].feature = feature;
	s->op[cnt].node = s->op[x.nbop].node;
	for (uint32_t j = 0; j < s->op[x.nbop].ndep; j++)
		ts_add_dep(s, cnt, s->op[x.nbop].dep[j], s->op[x.nbop].dist[j]);
	ts_region_insert(s, s->top, (uint32_t)ts_op_index(s, s->top, x.nbop) + 1, TS_ITEM_OP | cnt);
	ts_add_dep(s, x.spm, cnt, 0);
	/* the speculative copies: experts 0..k-1 of each packed buffer */
	uint32_t at = ts_spec_insert_at(s, e->ctx);
	ts_id sp[SG_MAX];
	for (uint32_t i = 0; i < x.n; i++) {
		const tcp_insn *g = &s->op[x.g[i]].in;
		tcp_insn c = tcp_insn_init(TCP_OP_DMA_COPY);
		c.ndim = 1;
		c.dim[0] = x.k * g->dim[2];
		c.v[TCP_V_DST] = tcp_view_none();
		c.v[TCP_V_DST].t = g->v[TCP_V_DST].t;
		c.v[TCP_V_DST].stride[0] = 1;
		c.v[TCP_V_S0] = tcp_view_none();
		c.v[TCP_V_S0].t = g->v[TCP_V_S0].t;
		c.v[TCP_V_S0].stride[0] = 1;
		sp[i] = ts_spec_copy(s, &c, x.g[i], at + i, feature);
	}
	ts_spec_waiters(s, x.g, sp, x.n, nop0);
	/* the prologue's gathers only when experts 0..k-1 are not all hit */
	int64_t first = ts_op_index(s, pro, x.g[0]);
	ts_id ld = ts_add_scalar(s, pro, "sgk", TS_SC_SPM_LD, 0, TS_NONE, TS_NONE, 2);
	s->sc[ld].buf = x.N;
	last_to(s, pro, (uint32_t)first);
	ts_id miss = ts_add_scalar(s, pro, "sgmiss", TS_SC_CMP, TCP_C_LT, ld, TS_NONE, x.k);
	last_to(s, pro, (uint32_t)first + 1);
	ts_id gd = ts_add_region(s, pro, TS_RG_GUARD, miss);
	last_to(s, pro, (uint32_t)first + 2);
	ts_spec_guard(s, pro, gd, x.g, sp, x.n);
	return MOE_OK;
}
