/* backend-tcp/compiler/rw/token_scatter.c: rewrite `token-scatter`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * A dispatch with token-major pairs (pair p is token p / K: a layer without
 * n_tokens) scatters gather(src, tok) into the block grid, tok = iota(T K) /
 * K. Where src is a DM value (W8A8's quantized rows x.q and their scales,
 * gpass/w8a8_act.c), sched-build copies it into HBM (a gather reads HBM
 * only), gathers its T K rows into DM and scatters those: three DMA
 * commands, two of them over T K rows. The scatter alone can read src in
 * place, each row K times: dims [T, K, row], src's view [row, 0, 1] (token
 * t's row for each of its K pairs), the index list's [K, 1] (pair t K + j's
 * position) and the grid's [0, row, 1]. The rewrite makes that scatter; the gather goes, and
 * so does the copy into HBM when the gather was its only reader, and the
 * pass making tok when nothing else reads it.
 *
 * Values are unchanged: the gather's row p is src's row tok[p] = p / K, so
 * the scatter writes grid position pos[p] from src's row p / K either way.
 * tok is recognised by its writer, the only op writing it: one tu.vec step
 * x.div(ctr, K) over [T K] with no valid count. src is the DM buffer the
 * HBM copy read, the copy's only source, and every op writing src is one
 * the copy waits for and comes before it, so the copy's bytes are src's
 * when the scatter runs; src then lives up to the scatter. The scatter
 * waits for what the gather and the copy waited for (the writers of src and
 * of the index list), and every op that waited for either waits for it.
 *
 * The same holds where src is the layer's input x in HBM (bf16 layers: the
 * gather reads x's rows pair by pair) and routing keeps a whole copy of x in
 * DM for the router: one dma.copy of all of x into a DM buffer that nothing
 * else writes. The scatter reads that copy; the copy stays (the router
 * reads it), the scatter waits for it and it lives up to the scatter. Not
 * at T = 1, where every pair reads x's one row and decode-x-rows drops the
 * gather and the scatter both. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

typedef struct tsc {
	ts_id sc, ga, cp, tok; /* the scatter, the gather, the HBM copy, tok's pass */
	ts_id d, h, x, i;      /* the gathered rows (DM), src in HBM, src in DM, tok */
	int64_t T, K, row, xbase;
	bool input; /* src is an input in HBM with a whole DM copy (cp, kept) */
} tsc;


static bool strides(const tcp_view *v, int64_t s0, int64_t s1, int64_t s2)
{
	return v->reg < 0 && v->stride[0] == s0 && v->stride[1] == s1 && v->stride[2] == s2;
}

/* the only op writing buffer b, or TS_NONE */
static ts_id writer(const tcp_sched *s, ts_id b)
{
	ts_id w = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_op_writes(&s->op[o], b)) {
			if (w != TS_NONE)
				return TS_NONE;
			w = o;
		}
	return w;
}

/* whether op w makes tok[p] = p / K over [n] at the index view iv; *K */
static bool tok_pass(const tcp_sched *s, ts_id w, const tcp_view *iv, int64_t n, int64_t *K)
{
	const tcp_insn *in = &s->op[w].in;
	const tcp_view *d = &in->v[TCP_V_DST];
	if (in->op != TCP_OP_TU_VEC || in->ndim != 1 || in->dim[0] != n || in->nstep != 1 || in->vreg >= 0 ||
		d->reg >= 0 || d->base != iv->base || d->stride[0] != 1 || in->v[TCP_V_S0].t >= 0 ||
		in->v[TCP_V_S1].t >= 0 || in->v[TCP_V_S2].t >= 0)
		return false;
	const tcp_step *st = &in->step[0];
	*K = (int32_t)st->imm;
	return st->op == TCP_V_IDIV && st->x == TCP_SRC_CTR && st->ctr == 0 && st->y == TCP_SRC_IMM && *K >= 1 &&
	       n % *K == 0;
}

/* src an input in HBM (x->h, read at gs) and routing's whole copy of it in
 * DM, the copy's only writer (x->cp, x->x) */
static bool input_copy(const tcp_sched *s, tsc *x, const tcp_view *gs)
{
	const ts_buf *h = &s->buf[x->h];
	if (h->space != TCP_HBM || (h->kind != TCP_T_INPUT && h->kind != TCP_T_CONST) || gs->base != 0 ||
		ts_buf_numel(h) != x->T * x->row)
		return false;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *c = &s->op[o].in;
		const tcp_view *cd = &c->v[TCP_V_DST], *cs = &c->v[TCP_V_S0];
		if (c->op != TCP_OP_DMA_COPY || cs->t != (int32_t)x->h || cd->t < 0 || c->vreg >= 0 || ts_op_in_loop(s, o) ||
			cs->base != 0 || cs->reg >= 0 || cd->base != 0 || cd->reg >= 0 || ts_insn_numel(c) != x->T * x->row ||
			!ts_view_contiguous(cd, c->ndim, c->dim) || !ts_view_contiguous(cs, c->ndim, c->dim) ||
			s->buf[cd->t].space != TCP_DM || s->buf[cd->t].slots != 1 || s->buf[cd->t].dtype != h->dtype ||
			s->buf[cd->t].dtype != s->buf[x->d].dtype || ts_buf_numel(&s->buf[cd->t]) != x->T * x->row ||
			writer(s, (ts_id)cd->t) != o)
			continue;
		x->cp = o, x->x = (ts_id)cd->t, x->xbase = 0;
		return true;
	}
	return false;
}

/* the gather feeding scatter sc, its source's copy and tok's pass */
static bool gather_of(const tcp_sched *s, ts_id sc, tsc *x)
{
	const tcp_insn *in = &s->op[sc].in;
	const tcp_view *sv = &in->v[TCP_V_S0];
	int64_t n = in->dim[1], row = in->dim[2];
	if (in->op != TCP_OP_DMA_SCATTER || in->ndim != 3 || in->dim[0] != 1 || in->vreg >= 0 || sv->t < 0 ||
		sv->base != 0 || !strides(sv, n * row, row, 1) || in->v[TCP_V_S1].reg >= 0 ||
		in->v[TCP_V_S1].stride[1] != 1 || in->v[TCP_V_DST].reg >= 0 || in->v[TCP_V_DST].stride[2] != 1 ||
		ts_op_in_loop(s, sc))
		return false;
	x->sc = sc;
	x->d = (ts_id)sv->t;
	x->ga = writer(s, x->d);
	if (x->ga == TS_NONE || s->buf[x->d].space != TCP_DM || ts_buf_numel(&s->buf[x->d]) != n * row)
		return false;
	const tcp_insn *g = &s->op[x->ga].in;
	const tcp_view *gs = &g->v[TCP_V_S0], *gi = &g->v[TCP_V_S1], *gd = &g->v[TCP_V_DST];
	if (g->op != TCP_OP_DMA_GATHER || g->ndim != 3 || g->dim[0] != 1 || g->dim[1] != n || g->dim[2] != row ||
		g->vreg >= 0 || (g->flags & TCP_F_HBMIDX) || gd->base != 0 || !strides(gd, n * row, row, 1) || gs->t < 0 ||
		!strides(gs, g->rows * row, row, 1) || gi->t < 0 || gi->reg >= 0 || gi->stride[1] != 1 ||
		s->op[x->ga].region != s->op[sc].region || !ts_op_has_dep(&s->op[sc], x->ga, 0))
		return false;
	x->h = (ts_id)gs->t;
	x->i = (ts_id)gi->t;
	x->tok = writer(s, x->i);
	x->cp = writer(s, x->h);
	x->row = row;
	x->input = x->cp == TS_NONE;
	if (x->tok == TS_NONE || !tok_pass(s, x->tok, gi, n, &x->K) || g->rows != n / x->K ||
		!ts_op_has_dep(&s->op[x->ga], x->tok, 0) || ts_op_in_loop(s, x->tok))
		return false;
	x->T = n / x->K;
	if (x->input) /* at T = 1 decode-x-rows drops the dispatch instead */
		return x->T > 1 && input_copy(s, x, gs);
	if (!ts_op_has_dep(&s->op[x->ga], x->cp, 0))
		return false;
	const tcp_insn *c = &s->op[x->cp].in;
	const tcp_view *cd = &c->v[TCP_V_DST], *cs = &c->v[TCP_V_S0];
	if (c->op != TCP_OP_DMA_COPY || c->ndim != 1 || c->vreg >= 0 || cd->base != 0 || cd->reg >= 0 ||
		cd->stride[0] != 1 || cs->t < 0 || cs->reg >= 0 || cs->stride[0] != 1 || s->buf[x->h].space != TCP_HBM ||
		s->buf[x->h].kind != TCP_T_SCRATCH || gs->base + x->T * row > c->dim[0] || ts_op_in_loop(s, x->cp))
		return false;
	x->x = (ts_id)cs->t;
	x->xbase = cs->base + gs->base;
	return s->buf[x->x].space == TCP_DM && s->buf[x->x].dtype == s->buf[x->d].dtype &&
	       s->buf[x->x].dtype == s->buf[x->h].dtype;
}

/* whether the rewrite may fuse x: what reads and writes the buffers */
static bool legal(const tcp_sched *s, tsc *x)
{
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	bool ok = pos[x->cp] < pos[x->ga] && pos[x->ga] < pos[x->sc] && !ts_buf_spm_read(s, x->d) && !ts_buf_spm_read(s, x->h) &&
		  !ts_buf_spm_read(s, x->x) && x->x != x->d;
	for (ts_id o = 0; o < s->nop && ok; o++) {
		const ts_op *p = &s->op[o];
		if ((o != x->sc && ts_op_reads(p, x->d)) ||
			(o != x->ga && ((!x->input && ts_op_reads(p, x->h)) || ts_op_writes(p, x->d))))
			ok = false;
		if (ts_op_writes(p, x->x) && !(x->input && o == x->cp))
			ok &= o != x->cp && pos[o] < pos[x->cp] && ts_op_has_dep(&s->op[x->cp], o, 0) && !ts_op_in_loop(s, o);
	}
	ctx_free(s->ctx, pos, 0);
	return ok;
}

static bool find(const tcp_sched *s, tsc *x)
{
	for (ts_id o = 0; o < s->nop; o++)
		if (gather_of(s, o, x) && legal(s, x))
			return true;
	return false;
}

static void add_dep_once(tcp_sched *s, ts_id o, ts_id on, int dist)
{
	if (dist != 0 || on != o)
		ts_add_dep_once(s, o, on, dist);
}

/* op o's dependencies, but on `skip`, added to op to */
static void deps_to(tcp_sched *s, ts_id to, ts_id o, ts_id skip)
{
	for (uint32_t k = 0; k < s->op[o].ndep; k++)
		if (s->op[o].dep[k] != skip)
			add_dep_once(s, to, s->op[o].dep[k], s->op[o].dist[k]);
}

static void fuse(tcp_sched *s, const tsc *x, uint16_t feature)
{
	tcp_insn *in = &s->op[x->sc].in;
	tcp_view *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1], *dv = &in->v[TCP_V_DST];
	in->dim[0] = x->T;
	in->dim[1] = x->K;
	*sv = tcp_b_view((int32_t)x->x, x->xbase, 3, (const int64_t[]){x->row, 0, 1});
	iv->stride[0] = x->K;
	dv->stride[0] = 0;
	s->op[x->sc].feature = feature;
	bool tok_read = false;
	for (ts_id o = 0; o < s->nop; o++)
		tok_read |= o != x->ga && ts_op_reads(&s->op[o], x->i);
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	drop[x->ga] = 1;
	drop[x->cp] = !x->input; /* the copy into HBM: its only reader was the gather */
	if (x->input)
		add_dep_once(s, x->sc, x->cp, 0);
	drop[x->tok] = !tok_read && !ts_buf_spm_read(s, x->i);
	/* the scatter waits for what the dropped ops waited for; another op
	 * that waited for one of them waits for what it waited for, and for
	 * the scatter when it comes after it */
	for (ts_id q = 0; q < s->nop; q++)
		if (drop[q])
			deps_to(s, x->sc, q, TS_NONE);
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == x->sc || drop[o])
			continue;
		bool waits = false;
		for (ts_id q = 0; q < s->nop; q++)
			if (drop[q] && (ts_op_has_dep(&s->op[o], q, 0) || ts_op_has_dep(&s->op[o], q, 1))) {
				deps_to(s, o, q, TS_NONE);
				waits = true;
			}
		if (waits && pos[o] > pos[x->sc])
			add_dep_once(s, o, x->sc, 0);
	}
	/* src lives up to the scatter; the gathered rows, read by nothing now,
	 * only at it; a span bounded by a dropped op moves to the scatter */
	ts_buf *xb = &s->buf[x->x], *d = &s->buf[x->d];
	if (xb->life == TS_LIFE_SPAN && xb->last != TS_NONE && pos[xb->last] < pos[x->sc])
		xb->last = x->sc;
	d->life = TS_LIFE_SPAN;
	d->first = d->last = x->sc;
	ts_drop_ops_to(s, drop, x->sc, pos);
	ctx_free(s->ctx, pos, 0);
	ctx_free(s->ctx, drop, 0);
}

TS_RW_EACH_SITE(token_scatter, tsc, fuse)
