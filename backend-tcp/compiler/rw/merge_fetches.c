/* backend-tcp/compiler/rw/merge_fetches.c: rewrite `merge-fetches`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With streamed weights, each TRF tile's part of an expert is copied from
 * HBM into the loop ring's next slot by a DMA command of its own
 * (recipe_contract.c), and each command pays dma.setup_cycles, serially on
 * the one in-order DMA queue that streams all the weights. The rewrite
 * merges a run of consecutive fetches of one contraction (the same weight,
 * the same expert register, one source step from each to the next) whose
 * slots follow each other in the ring (no wrap) into one three-dimensional
 * copy: dims [n, ...] with the source step as the outer source stride and
 * the slot size as the outer destination stride. At most half the ring is
 * written by one command (runs of two in a ring of four, four in a ring of
 * eight), so one half fills while the other is read. The merged command
 * waits for what any fetch of the run waited for (the last readers of its
 * slots), and every op that waited for a later fetch of the run waits for
 * the merged one. Values are
 * unchanged: the same bytes land in the same slots before any load reads
 * them, and no load's slot is written before that load has read it. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* whether op o is a ring fetch of loop l: a two-dimensional dma.copy from
 * a weight row in HBM (moved by a register) into a fixed slot of a DM ring
 * of l->ring slots, inside the body */
static bool ring_fetch(const tcp_sched *s, const ts_loop *l, ts_id o)
{
	const ts_op *q = &s->op[o];
	const tcp_insn *in = &q->in;
	const tcp_view *d = &in->v[TCP_V_DST], *v = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->vreg >= 0 || in->flags || d->t < 0 || v->t < 0 ||
		d->reg >= 0 || v->reg < 0 || in->v[TCP_V_S1].t >= 0 || !ts_region_within(s, q->region, l->body))
		return false;
	const ts_buf *r = &s->buf[d->t], *h = &s->buf[v->t];
	return r->space == TCP_DM && r->slots == l->ring && r->life == TS_LIFE_LOOP && h->space == TCP_HBM;
}

/* whether ring fetch b, the next after a, continues a's run: the same
 * shapes, buffers and register, b's slot the next after a's and its source
 * further on by step (*step: b's source offset less a's) */
static bool follows(const tcp_sched *s, ts_id a, ts_id b, int64_t *step)
{
	const tcp_insn *x = &s->op[a].in, *y = &s->op[b].in;
	const tcp_view *xd = &x->v[TCP_V_DST], *yd = &y->v[TCP_V_DST], *xs = &x->v[TCP_V_S0], *ys = &y->v[TCP_V_S0];
	int64_t slot = ts_buf_numel(&s->buf[xd->t]);
	if (s->op[a].region != s->op[b].region || x->dim[0] != y->dim[0] || x->dim[1] != y->dim[1] || xd->t != yd->t ||
		xs->t != ys->t || xs->reg != ys->reg || xs->scale != ys->scale || yd->base != xd->base + slot ||
		ys->base <= xs->base)
		return false;
	for (int k = 0; k < 2; k++)
		if (xd->stride[k] != yd->stride[k] || xs->stride[k] != ys->stride[k])
			return false;
	*step = ys->base - xs->base;
	return true;
}

static const uint32_t *by_pos;


static int pos_cmp(const void *a, const void *b)
{
	uint32_t x = by_pos[*(const ts_id *)a], y = by_pos[*(const ts_id *)b];
	return (x > y) - (x < y);
}

/* The runs: run k is the fetches memb[at[k]] .. memb[at[k + 1] - 1], the
 * first its head, at most len long (at most half the ring); greedy over the
 * body's ring fetches in program order. Returns how many runs (at most
 * cap). */
static int runs(const tcp_sched *s, ts_id *memb, uint32_t *at, int cap, int len)
{
	if (s->nloop != 1)
		return 0;
	const ts_loop *l = &s->loop[0];
	if (l->weights != TS_W_STREAM || l->ring < 4)
		return 0;
	uint32_t *pos = ctx_alloc(s->ctx, s->nop * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id *f = ctx_alloc(s->ctx, s->nop * sizeof *f);
	int nf = 0, nr = 0;
	uint32_t nm = 0;
	for (ts_id o = 0; o < s->nop; o++)
		if (ring_fetch(s, l, o))
			f[nf++] = o;
	by_pos = pos; /* by program position (each op's is its own) */
	qsort(f, (size_t)nf, sizeof *f, pos_cmp);
	uint8_t *mark = ctx_alloc(s->ctx, 2 * ((size_t)s->nop + 1));
	memset(mark, 0, 2 * ((size_t)s->nop + 1));
	for (int i = 0; i + 1 < nf && nr < cap;) {
		int64_t step = 0, st;
		int n = 1;
		/* a run's head waits for what every fetch of it waited for: no run
		 * whose head would hold more than half the dependency cap (later
		 * rewrites add to the lists) */
		while (i + n < nf && n < len && n < l->ring / 2 && follows(s, f[i + n - 1], f[i + n], &st) && (n == 1 || st == step) &&
			ts_deps_union(s, f + i, (uint32_t)n + 1, mark) <= TS_MAX_DEPS / 2)
			step = st, n++;
		if (n > 1) {
			at[nr++] = nm;
			for (int j = 0; j < n; j++)
				memb[nm++] = f[i + j];
		}
		i += n;
	}
	at[nr] = nm;
	ctx_free(s->ctx, mark, 0);
	ctx_free(s->ctx, f, 0);
	ctx_free(s->ctx, pos, 0);
	return nr;
}

bool ts_rw_merge_fetches_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	ts_id *memb = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *memb);
	uint32_t *at = ctx_alloc(s->ctx, (s->nop + 2) * sizeof *at);
	int nr = runs(s, memb, at, 1, 2);
	ctx_free(s->ctx, memb, 0);
	ctx_free(s->ctx, at, 0);
	return nr > 0;
}

/* Per run k: u[k] the ops depending on a fetch of it after its head, w[k]
 * those depending on its head, each entry (op << 8 | distance) in the order
 * the dependencies were listed (an op's first entry in u[k] is its first
 * dependency on such a fetch); kof/kfirst[o] the run o is a later fetch /
 * the head of (-1: none); stamp and mark[dist] per op, the run last seen
 * (k + 1). */
typedef struct users {
	uint64_t *e;
	uint32_t n, cap;
} users;

typedef struct rev {
	users *u, *w;
	int32_t *kof, *kfirst;
	uint32_t *stamp, *has[2], *mark[2];
} rev;

static void rev_push(const tcp_sched *s, users *u, ts_id o, uint8_t dist)
{
	if (u->n == u->cap) {
		uint32_t nc = u->cap ? 2 * u->cap : 4;
		u->e = ctx_realloc(s->ctx, u->e, u->cap * sizeof *u->e, nc * sizeof *u->e);
		u->cap = nc;
	}
	u->e[u->n++] = (uint64_t)o << 8 | dist;
}

/* op o gained dependency (d, dist): listed where a pair reads it */
static void rev_note(const tcp_sched *s, rev *r, ts_id o, ts_id d, uint8_t dist)
{
	if (d >= s->nop)
		return;
	if (r->kof[d] >= 0)
		rev_push(s, &r->u[r->kof[d]], o, dist);
	if (r->kfirst[d] >= 0)
		rev_push(s, &r->w[r->kfirst[d]], o, dist);
}

static rev rev_new(const tcp_sched *s, const ts_id *memb, const uint32_t *at, int nr)
{
	rev r;
	r.u = ctx_alloc(s->ctx, ((size_t)nr + 1) * sizeof *r.u); /* zeroed */
	r.w = ctx_alloc(s->ctx, ((size_t)nr + 1) * sizeof *r.w);
	r.kof = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *r.kof);
	r.kfirst = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *r.kfirst);
	r.stamp = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *r.stamp);
	for (int i = 0; i < 2; i++) {
		r.has[i] = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *r.has[i]);
		r.mark[i] = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *r.mark[i]);
	}
	for (ts_id o = 0; o < s->nop; o++)
		r.kof[o] = r.kfirst[o] = -1;
	for (int k = 0; k < nr; k++) {
		r.kfirst[memb[at[k]]] = k;
		for (uint32_t j = at[k] + 1; j < at[k + 1]; j++)
			r.kof[memb[j]] = k;
	}
	for (ts_id o = 0; o < s->nop; o++)
		for (uint32_t j = 0; j < s->op[o].ndep; j++)
			rev_note(s, &r, o, s->op[o].dep[j], s->op[o].dist[j]);
	return r;
}

static void rev_free(const tcp_sched *s, rev *r, int np)
{
	for (int k = 0; k < np; k++) {
		if (r->u[k].e)
			ctx_free(s->ctx, r->u[k].e, 0);
		if (r->w[k].e)
			ctx_free(s->ctx, r->w[k].e, 0);
	}
	void *p[] = {r->u, r->w, r->kof, r->kfirst, r->stamp, r->has[0], r->has[1], r->mark[0], r->mark[1]};
	for (size_t i = 0; i < sizeof p / sizeof *p; i++)
		ctx_free(s->ctx, p[i], 0);
}

/* Run k's merge in the dependencies: its head a waits for what its later
 * fetches b[0..nb) waited for, and each op waiting for one of them waits
 * for a, at the distance of its first dependency on them (each added unless
 * the op has it: marks stand for the linear search, as fetches wait on
 * thousands of slot readers). */
static void redirect(tcp_sched *s, rev *r, int k, ts_id a, const ts_id *b, uint32_t nb)
{
	uint32_t mk = (uint32_t)k + 1;
	for (uint32_t j = 0; j < s->op[a].ndep; j++)
		if (s->op[a].dep[j] < s->nop && s->op[a].dist[j] < 2)
			r->has[s->op[a].dist[j]][s->op[a].dep[j]] = mk;
	for (uint32_t m = 0; m < nb; m++)
		for (uint32_t j = 0; j < s->op[b[m]].ndep; j++) {
			ts_id d = s->op[b[m]].dep[j];
			uint8_t dist = s->op[b[m]].dist[j];
			uint32_t had = s->op[a].ndep;
			if (d == a || (d < s->nop && r->kof[d] == k))
				continue;
			if (d < s->nop && dist < 2) {
				if (r->has[dist][d] != mk)
					ts_add_dep(s, a, d, dist), r->has[dist][d] = mk;
			} else {
				ts_add_dep_once(s, a, d, dist);
			}
			if (s->op[a].ndep > had)
				rev_note(s, r, a, d, dist);
		}
	for (uint32_t i = 0; i < r->w[k].n; i++) {
		uint8_t dist = (uint8_t)(r->w[k].e[i] & 255);
		if (dist < 2)
			r->mark[dist][r->w[k].e[i] >> 8] = mk;
	}
	for (uint32_t i = 0; i < r->u[k].n; i++) {
		ts_id o = (ts_id)(r->u[k].e[i] >> 8);
		uint8_t dist = (uint8_t)(r->u[k].e[i] & 255);
		if (o == a || r->kof[o] == k || r->stamp[o] == mk)
			continue;
		r->stamp[o] = mk;
		if (dist >= 2)
			ts_add_dep_once(s, o, a, dist);
		else if (r->mark[dist][o] != mk)
			ts_add_dep(s, o, a, dist), r->mark[dist][o] = mk;
	}
}

/* The runs of at most len fetches each merged; false where none is. */
static bool merge(tcp_sched *s, uint16_t feature, int len)
{
	ts_id *memb = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *memb);
	uint32_t *at = ctx_alloc(s->ctx, (s->nop + 2) * sizeof *at);
	int nr = runs(s, memb, at, (int)s->nop, len);
	if (!nr) {
		ctx_free(s->ctx, memb, 0);
		ctx_free(s->ctx, at, 0);
		return false;
	}
	uint8_t *drop = ctx_alloc(s->ctx, s->nop); /* zeroed */
	rev r = rev_new(s, memb, at, nr);
	for (int k = 0; k < nr; k++) {
		ts_id a = memb[at[k]];
		uint32_t n = at[k + 1] - at[k];
		tcp_insn *x = &s->op[a].in;
		const tcp_insn y = s->op[memb[at[k] + 1]].in;
		int64_t slot = ts_buf_numel(&s->buf[x->v[TCP_V_DST].t]);
		x->ndim = 3;
		x->dim[2] = x->dim[1];
		x->dim[1] = x->dim[0];
		x->dim[0] = (int64_t)n;
		for (int w = TCP_V_DST; w <= TCP_V_S0; w++) {
			tcp_view *v = &x->v[w];
			v->stride[2] = v->stride[1];
			v->stride[1] = v->stride[0];
			v->stride[0] = w == TCP_V_DST ? slot : y.v[TCP_V_S0].base - v->base;
		}
		s->op[a].feature = feature;
		s->op[a].cost = 0;
		redirect(s, &r, k, a, &memb[at[k] + 1], n - 1);
		for (uint32_t j = at[k] + 1; j < at[k + 1]; j++)
			drop[memb[j]] = 1;
	}
	rev_free(s, &r, nr);
	ts_drop_ops(s, drop);
	ctx_free(s->ctx, drop, 0);
	ctx_free(s->ctx, memb, 0);
	ctx_free(s->ctx, at, 0);
	return true;
}

typedef struct merge_arg {
	const ts_env *e;
	uint16_t feature;
	int len;
	bool lead; /* ring-lead applied after the merge */
} merge_arg;

static bool merge_copy(tcp_sched *c, void *arg)
{
	const merge_arg *a = arg;
	return merge(c, a->feature, a->len) && (!a->lead || ts_rw_finish(c, a->e, "ring-lead"));
}

/* The run length: half the ring where that is two; else each length from
 * half the ring down to two merged in a trial copy, placed and predicted,
 * the fastest taken (ties: the longer, fewer commands). Longer runs pay
 * fewer setups but a run's first tile waits for the whole run, so where the
 * contractions, not the DMA queue, bound the block the shorter runs win.
 * Each length is priced as merged and, where ring-lead is switched on, also
 * finished by it (a later row, which hoists each block's first copies ahead
 * of the previous block's store and so changes which length waits least:
 * Mixtral-8x7B T = 512 predicts runs of two fastest without it and three
 * with it); a length's price is the lower of the two. */
moe_status ts_rw_merge_fetches_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	int half = s->nloop == 1 ? s->loop[0].ring / 2 : 2, best = 2;
	int64_t least = -1;
	int rl = ts_rewrite_find("ring-lead", strlen("ring-lead"));
	bool lead = rl >= 0 && !(e->off >> rl & 1);
	for (int len = half; half > 2 && len >= 2; len--)
		for (int f = 0; f < 1 + lead; f++) {
			merge_arg a = {e, feature, len, f == 1};
			ts_trial t = ts_trial_for(e, "<merge-fetches trial>", merge_copy, &a, true);
			int64_t c = ts_trial_of(s, &t);
			if (c >= 0 && (least < 0 || c < least)) {
				least = c;
				best = len;
			}
		}
	return merge(s, feature, best) ? MOE_OK : MOE_ERR_INVALID;
}
