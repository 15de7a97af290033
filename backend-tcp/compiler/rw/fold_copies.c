/* backend-tcp/compiler/rw/fold_copies.c: rewrite `fold-copies`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * A graph's slices and widening casts (the halves of the paired gate/up
 * contraction's bf16 result cast to f32 for SwiGLU) become `tu.vec` passes
 * with no chain: each is a command (its issue, fill/drain and switch ring)
 * that moves words from one DM buffer into another only for the next pass
 * to fetch them. The rewrite drops such a copy C where its every reader is
 * a `tu.vec` pass over C's iteration space reading C's destination D
 * through C's own destination view: the reader reads C's source S through
 * C's source view instead. Then a reader that fetches one view through two
 * streams fetches it once (its steps read the first stream), so a third
 * stream no longer costs a second pass through DM.
 *
 * Values are unchanged. A pass fetches each element as its 32-bit lane word
 * (docs/tcp-isa.md 5), and C's commit stores that word back: as is into an
 * f32 or i32 D, and into D of S's own type as the element it was read from,
 * so the reader fetching D gets the word it now fetches from S. D's view is
 * injective, so each element the reader fetches is the one C wrote from the
 * same iteration. Where C has a valid count, the reader has the same one
 * over at least two dimensions: the rows C wrote as zero are rows the
 * reader writes as zero too, whatever it fetches there, and it has no
 * integer division (the only step that faults on a value). S is not written
 * between C and its readers: every writer of S is one C waits for, and one
 * in C's loop waits for C of the previous block, a wait that moves to the
 * readers. The readers wait for what C waited for, and every op that
 * waited for C waits for its readers. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct fc {
	ts_id c, d, src;        /* the copy, its destination and source buffers */
	ts_id rd[16];           /* its readers */
	uint32_t nrd;
} fc;


static int dep_dist(const ts_op *p, ts_id on)
{
	int d = -1;
	for (uint32_t k = 0; k < p->ndep; k++)
		if (p->dep[k] == on && (d < 0 || p->dist[k] < d))
			d = p->dist[k];
	return d;
}

/* whether a and b name the same elements over in's dimensions */
static bool same_view(const tcp_insn *in, const tcp_view *a, const tcp_view *b)
{
	if (a->t != b->t || a->reg != b->reg || a->base != b->base || (a->reg >= 0 && a->scale != b->scale))
		return false;
	for (int k = 0; k < in->ndim; k++)
		if (in->dim[k] > 1 && a->stride[k] != b->stride[k])
			return false;
	return true;
}

/* whether view v names a different element at every iteration of in */
static bool injective(const tcp_insn *in, const tcp_view *v)
{
	int64_t st[TCP_MAXD], ext[TCP_MAXD];
	int n = 0;
	for (int k = 0; k < in->ndim; k++) {
		if (in->dim[k] <= 1)
			continue;
		if (v->stride[k] <= 0)
			return false;
		int j = n++;
		for (; j > 0 && st[j - 1] > v->stride[k]; j--) {
			st[j] = st[j - 1];
			ext[j] = ext[j - 1];
		}
		st[j] = v->stride[k];
		ext[j] = in->dim[k];
	}
	int64_t reach = 0; /* the largest offset the smaller strides reach */
	for (int j = 0; j < n; j++) {
		if (st[j] <= reach)
			return false;
		reach += st[j] * (ext[j] - 1);
	}
	return true;
}

/* whether reader r of the copy in c's D may read S instead */
static bool reader_ok(const tcp_sched *s, const fc *x, ts_id r)
{
	const ts_op *c = &s->op[x->c], *p = &s->op[r];
	const tcp_insn *ci = &c->in, *in = &p->in;
	if (in->op != TCP_OP_TU_VEC || p->region != c->region || r <= x->c || dep_dist(p, x->c) != 0 ||
		in->ndim != ci->ndim || ts_op_writes(p, x->src))
		return false;
	for (int k = 0; k < in->ndim; k++)
		if (in->dim[k] != ci->dim[k])
			return false;
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
		if (in->v[w].t == (int32_t)x->d &&
			(!same_view(in, &in->v[w], &ci->v[TCP_V_DST]) ||
			 (w == TCP_V_S0 && (in->flags & (TCP_F_E2M1 | TCP_F_I4)))))
			return false;
	if (ci->vreg >= 0) {
		if (in->vreg != ci->vreg || in->ndim < 2)
			return false;
		for (int i = 0; i < in->nstep; i++)
			if (in->step[i].op == TCP_V_IDIV)
				return false;
	}
	return true;
}

/* whether op o (a writer of S) is ordered before the copy in every block */
static bool writer_ok(const tcp_sched *s, const fc *x, ts_id o)
{
	if (dep_dist(&s->op[o], x->c) == 0 || !ts_op_has_dep(&s->op[x->c], o, 0))
		return false;
	for (int l = 0; l < s->nloop; l++)
		if (ts_region_within(s, s->op[o].region, s->loop[l].body) &&
			!ts_op_has_dep(&s->op[o], x->c, 1))
			return false;
	return true;
}

/* The ops a view of which names buffer b, in id order, those gone left
 * out: op[at[b]] .. op[at[b + 1] - 1]. */
typedef struct touch {
	uint32_t *at;
	ts_id *op;
} touch;

static bool names_earlier(const tcp_insn *in, int w)
{
	for (int k = 0; k < w; k++)
		if (in->v[k].t == in->v[w].t)
			return true;
	return false;
}

static void touch_build(const tcp_sched *s, const uint8_t *gone, touch *u)
{
	u->at = ctx_alloc(s->ctx, (s->nbuf + 2) * sizeof *u->at);
	u->op = NULL;
	size_t n = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (ts_id o = 0; o < s->nop; o++) {
			const tcp_insn *in = &s->op[o].in;
			for (int w = 0; w < TCP_NVIEW && !gone[o]; w++) {
				int32_t b = in->v[w].t;
				if (b < 0 || (ts_id)b >= s->nbuf || names_earlier(in, w))
					continue;
				if (pass)
					u->op[u->at[b + 1]++] = o;
				else
					u->at[b + 2]++, n++;
			}
		}
		if (pass)
			break;
		for (ts_id b = 0; b < s->nbuf; b++)
			u->at[b + 2] += u->at[b + 1];
		u->op = ctx_alloc(s->ctx, (n + 1) * sizeof *u->op);
	}
}

/* whether op c is a copy the rewrite drops; fills x. Ops with gone set
 * are copies folded already, dropped at the end (as if dropped now: no
 * other op is compared with them and ids keep their order). Only the ops
 * naming D or S can refuse the copy or read D: those of u, in id order. */
static bool copy_ok(const tcp_sched *s, const touch *u, ts_id c, fc *x)
{
	const tcp_insn *in = &s->op[c].in;
	const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_TU_VEC || in->nstep || (in->flags & ~TCP_F_ROUTE) || dv->t < 0 || sv->t < 0 ||
		in->v[TCP_V_S1].t >= 0 || in->v[TCP_V_S2].t >= 0 || dv->t == sv->t || dv->reg >= 0 || !injective(in, dv))
		return false;
	const ts_buf *d = &s->buf[dv->t], *b = &s->buf[sv->t];
	if (d->space != TCP_DM || b->space != TCP_DM ||
		!(d->dtype == b->dtype || d->dtype == MOE_F32 || d->dtype == MOE_I32))
		return false;
	x->c = c;
	x->d = (ts_id)dv->t;
	x->src = (ts_id)sv->t;
	x->nrd = 0;
	uint32_t i = u->at[x->d], ie = u->at[x->d + 1], j = u->at[x->src], je = u->at[x->src + 1];
	while (i < ie || j < je) {
		ts_id o = j >= je || (i < ie && u->op[i] < u->op[j]) ? u->op[i] : u->op[j];
		i += i < ie && u->op[i] == o;
		j += j < je && u->op[j] == o;
		const ts_op *p = &s->op[o];
		if (o == c)
			continue;
		if (ts_op_writes(p, x->d))
			return false;
		if (ts_op_writes(p, x->src) && !writer_ok(s, x, o))
			return false;
		if (!ts_op_reads(p, x->d))
			continue;
		if (x->nrd == sizeof x->rd / sizeof *x->rd || !reader_ok(s, x, o))
			return false;
		x->rd[x->nrd++] = o;
	}
	for (ts_id k = 0; k < s->nsc; k++)
		if (s->sc[k].kind == TS_SC_SPM_LD && (s->sc[k].buf == x->d || s->sc[k].buf == x->src))
			return false;
	return x->nrd > 0;
}

static bool find(const tcp_sched *s, const uint8_t *gone, fc *x)
{
	touch u;
	touch_build(s, gone, &u);
	bool found = false;
	for (ts_id c = 0; c < s->nop && !found; c++)
		found = !gone[c] && copy_ok(s, &u, c, x);
	ctx_free(s->ctx, u.at, 0);
	ctx_free(s->ctx, u.op, 0);
	return found;
}

/* the first pair of streams (u < w) of a pass that fetch one view, or false */
static bool twice(const tcp_insn *in, int *u, int *w)
{
	if (in->op != TCP_OP_TU_VEC)
		return false;
	for (*w = TCP_V_S1; *w < TCP_NVIEW; (*w)++)
		for (*u = TCP_V_S0; *u < *w; (*u)++)
			if (in->v[*w].t >= 0 && same_view(in, &in->v[*w], &in->v[*u]) &&
				!(*u == TCP_V_S0 && (in->flags & (TCP_F_E2M1 | TCP_F_I4))))
				return true;
	return false;
}

bool ts_rw_fold_copies_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	fc x;
	int u, w;
	for (ts_id o = 0; o < s->nop; o++)
		if (twice(&s->op[o].in, &u, &w))
			return true;
	uint8_t *gone = ctx_alloc(s->ctx, s->nop + 1);
	bool found = find(s, gone, &x);
	ctx_free(s->ctx, gone, 0);
	return found;
}

/* The ops that depend on each op (some listed twice, none missed): those
 * the apply began with, op[at[x]] .. op[at[x + 1] - 1], and those a fold
 * added, a list from head[x] (entry + 1) through next. */
typedef struct waiters {
	uint32_t *at, *head, *next, *mark;
	ts_id *op, *who, *list;
	uint32_t nadd, cadd, nlist, clist;
} waiters;

static void waiters_build(const tcp_sched *s, waiters *w)
{
	memset(w, 0, sizeof *w);
	w->at = ctx_alloc(s->ctx, (s->nop + 2) * sizeof *w->at);
	w->head = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *w->head);
	w->mark = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *w->mark);
	size_t n = 0;
	for (ts_id o = 0; o < s->nop; o++)
		for (uint32_t k = 0; k < s->op[o].ndep; k++)
			if (s->op[o].dep[k] < s->nop)
				w->at[s->op[o].dep[k] + 2]++, n++;
	for (ts_id x = 0; x < s->nop; x++)
		w->at[x + 2] += w->at[x + 1];
	w->op = ctx_alloc(s->ctx, (n + 1) * sizeof *w->op);
	for (ts_id o = 0; o < s->nop; o++)
		for (uint32_t k = 0; k < s->op[o].ndep; k++)
			if (s->op[o].dep[k] < s->nop)
				w->op[w->at[s->op[o].dep[k] + 1]++] = o;
}

static void waiters_free(moe_ctx *ctx, waiters *w)
{
	void *p[] = {w->at, w->head, w->next, w->mark, w->op, w->who, w->list};
	for (size_t k = 0; k < sizeof p / sizeof *p; k++)
		if (p[k])
			ctx_free(ctx, p[k], 0);
}

static int cmp_id(const void *a, const void *b)
{
	ts_id x = *(const ts_id *)a, y = *(const ts_id *)b;
	return x < y ? -1 : x > y;
}

/* The ops depending on op c, each once, in id order, in w->list. */
static uint32_t waiting_for(const tcp_sched *s, waiters *w, ts_id c, uint32_t stamp)
{
	w->nlist = 0;
	uint32_t n = w->at[c + 1] - w->at[c];
	for (uint32_t e = w->head[c]; e; e = w->next[e - 1])
		n++;
	ctx_grow(s->ctx, (void **)&w->list, &w->clist, n + 1, sizeof *w->list);
	for (uint32_t i = w->at[c]; i < w->at[c + 1]; i++)
		if (w->mark[w->op[i]] != stamp)
			w->mark[w->op[i]] = stamp, w->list[w->nlist++] = w->op[i];
	for (uint32_t e = w->head[c]; e; e = w->next[e - 1])
		if (w->mark[w->who[e - 1]] != stamp)
			w->mark[w->who[e - 1]] = stamp, w->list[w->nlist++] = w->who[e - 1];
	qsort(w->list, w->nlist, sizeof *w->list, cmp_id);
	return w->nlist;
}

static void add_dep_once(tcp_sched *s, waiters *w, ts_id o, ts_id on, int dist)
{
	if ((dist == 0 && on == o) || ts_op_has_dep(&s->op[o], on, dist))
		return;
	ts_add_dep(s, o, on, dist);
	if (on >= s->nop)
		return;
	uint32_t need = w->nadd + 1;
	if (need > w->cadd) {
		uint32_t c = w->cadd;
		ctx_grow(s->ctx, (void **)&w->next, &c, need, sizeof *w->next);
		ctx_grow(s->ctx, (void **)&w->who, &w->cadd, need, sizeof *w->who);
	}
	w->who[w->nadd] = o;
	w->next[w->nadd] = w->head[on];
	w->head[on] = ++w->nadd;
}

/* a pass fetching one view through two streams fetches it once: the
 * steps read the first of them; whether it changed */
static bool one_stream(tcp_insn *in)
{
	int u, w;
	bool any = false;
	while (twice(in, &u, &w)) {
		for (int i = 0; i < in->nstep; i++) {
			tcp_step *st = &in->step[i];
			st->x = st->x == TCP_SRC_V + w ? (uint8_t)(TCP_SRC_V + u) : st->x;
			st->y = st->y == TCP_SRC_V + w ? (uint8_t)(TCP_SRC_V + u) : st->y;
		}
		in->v[w] = tcp_view_none();
		any = true;
	}
	return any;
}

/* folds copy x->c, which the caller marks gone */
static void fold(tcp_sched *s, const uint8_t *gone, waiters *wt, uint32_t stamp, const fc *x, uint16_t feature)
{
	const ts_op *c = &s->op[x->c];
	tcp_view sv = c->in.v[TCP_V_S0];
	uint32_t *pos = ctx_alloc(s->ctx, s->nop * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id first = x->rd[0], last = x->rd[0];
	for (uint32_t i = 0; i < x->nrd; i++) {
		ts_id r = x->rd[i];
		ts_op *p = &s->op[r];
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
			if (p->in.v[w].t == (int32_t)x->d)
				p->in.v[w] = sv;
		/* S's bytes may lie on other slices than the reader's D did (a row
		 * pass spreads its rows, not the copy's flits): the switch stage
		 * routes them, and charges nothing where every slice holds its own */
		p->in.flags |= TCP_F_ROUTE;
		p->feature = feature;
		for (uint32_t k = 0; k < s->op[x->c].ndep; k++)
			if (s->op[x->c].dep[k] != r)
				add_dep_once(s, wt, r, s->op[x->c].dep[k], s->op[x->c].dist[k]);
		first = pos[r] < pos[first] ? r : first;
		last = pos[r] > pos[last] ? r : last;
	}
	/* an op of the same block that waited for the copy (no hazard: D has no
	 * other reader, S no writer after it) waits for what the copy waited
	 * for; one of the next block (S's writers among them) for its readers */
	ts_id body = TS_NONE;
	for (int l = 0; l < s->nloop; l++)
		body = ts_region_within(s, c->region, s->loop[l].body) ? s->loop[l].body : body;
	/* only an op depending on the copy changes here, and only its own
	 * dependencies: those ops in id order */
	for (uint32_t j = 0, nw = waiting_for(s, wt, x->c, stamp); j < nw; j++) {
		ts_id o = wt->list[j];
		if (gone[o])
			continue;
		bool reader = false;
		for (uint32_t i = 0; i < x->nrd; i++)
			reader |= o == x->rd[i];
		if (!reader && ts_op_has_dep(&s->op[o], x->c, 0)) {
			bool same = body != TS_NONE && ts_region_within(s, s->op[o].region, body);
			for (uint32_t k = 0; k < s->op[x->c].ndep; k++)
				if (!s->op[x->c].dist[k] || same)
					add_dep_once(s, wt, o, s->op[x->c].dep[k], s->op[x->c].dist[k]);
		}
		if (ts_op_has_dep(&s->op[o], x->c, 1))
			for (uint32_t i = 0; i < x->nrd; i++)
				if (o != x->rd[i])
					add_dep_once(s, wt, o, x->rd[i], 1);
	}
	/* S lives up to its last reader; D, read by nothing now, only at the
	 * first reader; a span bounded by the copy moves to its readers */
	ts_buf *sb = &s->buf[x->src], *db = &s->buf[x->d];
	if (sb->life == TS_LIFE_SPAN && sb->last != TS_NONE && pos[sb->last] < pos[last])
		sb->last = last;
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life != TS_LIFE_SPAN)
			continue;
		f->first = f->first == x->c ? first : f->first;
		f->last = f->last == x->c ? last : f->last;
	}
	db->life = TS_LIFE_SPAN;
	db->first = db->last = first;
	ctx_free(s->ctx, pos, 0);
}

moe_status ts_rw_fold_copies_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	if (!ts_rw_fold_copies_applies(s, e))
		return MOE_ERR_INVALID;
	fc x;
	uint8_t *gone = ctx_alloc(s->ctx, s->nop + 1);
	waiters wt;
	waiters_build(s, &wt);
	uint32_t stamp = 0;
	while (find(s, gone, &x)) {
		fold(s, gone, &wt, ++stamp, &x, feature);
		gone[x.c] = 1;
	}
	waiters_free(s->ctx, &wt);
	if (stamp)
		ts_drop_ops(s, gone);
	ctx_free(s->ctx, gone, 0);
	for (ts_id o = 0; o < s->nop; o++)
		if (one_stream(&s->op[o].in))
			s->op[o].feature = feature;
	return MOE_OK;
}
