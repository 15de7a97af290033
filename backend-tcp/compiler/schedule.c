/* backend-tcp/compiler/schedule.c: the list scheduler (schedule.h,
 * docs/tcp-compiler.md 5.4).
 *
 * Per region, innermost first, the items form a graph whose edges go from an
 * earlier item to a later one in the region's current order (so it is
 * acyclic and every order it allows keeps what the edges protect): an op's
 * distance-0 dependencies, a scalar's definition before its uses, an `ld`
 * kept on its side of every command touching the buffer it reads, and the
 * planner's reuse order (two buffers placed on shared bytes of one space and
 * shared slices: every access of one keeps its side of every access of the
 * other). A child region stands as one item carrying all of that for what it
 * holds. Loop-carried dependencies (distance 1) order blocks, not a body's
 * items: every item of block g precedes every item of block g + 1 in program
 * order whatever the body's order.
 *
 * The region's timeline for the list orders: the control clock advances by
 * one scalar instruction per item; an op starts at the latest of its issue,
 * its context's end and its placed predecessors' ends, and runs its cost
 * (isa cost, tcp_sched_cost); a child region is its ops' costs summed per
 * context, from the latest of the clock and its predecessors' ends. That
 * model only proposes: a region's new order (a list order, then each move
 * of an op before its context's previous op) is kept only when the whole
 * schedule's timeline (sched_time.c, expected loads, exact where the
 * simulator is) predicts fewer cycles, so the result is never slower than
 * the build order by that prediction. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/compiler/schedule.h"
#include "backend-tcp/isa/cost.h"

typedef struct edge {
	uint32_t from, to;
} edge;

typedef struct touch {
	ts_id buf;
	uint32_t item;
	bool ld;
} touch;

typedef struct vec {
	void *a;
	size_t n, cap, sz;
} vec;

typedef struct sch {
	moe_ctx *ctx;
	tcp_sched *s;
	tcp_cm cm;
	ts_id *op_rg, *sc_rg;    /* the region whose item holds it now */
	uint32_t *op_it, *sc_it; /* that item */
	ts_id **alias;           /* per buffer: the buffers placed on shared bytes */
	uint32_t *nalias;
	vec edges, touches;
	/* per item of the current region */
	uint8_t *adj; /* adj[from * nadj + to]: the edge is in `edges` (NULL: duplicates kept, removed after the sort) */
	uint32_t nadj;
	int64_t (*csum)[TCP_NCTX];
	int64_t *nscal;
	int64_t cycles; /* the whole schedule's prediction with the orders kept so far */
	int evals;      /* predictions counted (at most SCHED_EVALS) */
	ts_cost_cache *memo;
	/* per region: that prediction's walk entered it (entered), and the last
	 * prediction's (tried) */
	uint8_t *entered, *tried;
} sch;

/* The whole-schedule predictions one compile may make to choose orders. */
#define SCHED_EVALS 400

static void *push(sch *c, vec *v)
{
	if (v->n == v->cap) {
		size_t nc = v->cap ? v->cap * 2 : 256;
		v->a = ctx_realloc(c->ctx, v->a, v->cap * v->sz, nc * v->sz);
		v->cap = nc;
	}
	return (char *)v->a + v->n++ * v->sz;
}

/* ---- buffers on shared bytes ---- */
static bool shares(const ts_buf *a, const ts_buf *b)
{
	if (a->space != b->space || a->space == TCP_HBM || a->offset < 0 || b->offset < 0)
		return false;
	int64_t la = a->layout.slice_bytes, lb = b->layout.slice_bytes;
	if (la < 1 || lb < 1 || a->offset + la <= b->offset || b->offset + lb <= a->offset)
		return false;
	int64_t a0 = a->layout.slice0, a1 = a0 + (int64_t)a->layout.nslices * a->layout.copies - 1;
	int64_t b0 = b->layout.slice0, b1 = b0 + (int64_t)b->layout.nslices * b->layout.copies - 1;
	return !(a1 < b0 || b1 < a0);
}

static void find_aliases(sch *c)
{
	const tcp_sched *s = c->s;
	c->alias = ctx_alloc(c->ctx, (s->nbuf + 1) * sizeof *c->alias);
	c->nalias = ctx_alloc(c->ctx, (s->nbuf + 1) * sizeof *c->nalias);
	memset(c->alias, 0, (s->nbuf + 1) * sizeof *c->alias);
	memset(c->nalias, 0, (s->nbuf + 1) * sizeof *c->nalias);
	for (ts_id i = 0; i < s->nbuf; i++)
		for (ts_id j = i + 1; j < s->nbuf; j++)
			if (shares(&s->buf[i], &s->buf[j])) {
				ts_id x[2] = {i, j};
				for (int k = 0; k < 2; k++) {
					uint32_t n = c->nalias[x[k]];
					c->alias[x[k]] = ctx_realloc(c->ctx, c->alias[x[k]], n * sizeof **c->alias,
						(n + 1) * sizeof **c->alias);
					c->alias[x[k]][c->nalias[x[k]]++] = x[1 - k];
				}
			}
}

/* ---- the items' contents ---- */
static void walk_mark(sch *c, ts_id r, ts_id owner, uint32_t k, int depth);

static void mark_region(sch *c, ts_id r, ts_id owner, uint32_t k, int depth)
{
	const tcp_sched *s = c->s;
	if (depth > 70)
		return;
	if (s->rg[r].kind == TS_RG_LOOP) {
		const ts_loop *l = &s->loop[s->rg[r].loop];
		walk_mark(c, l->prologue, owner, k, depth + 1);
		walk_mark(c, l->body, owner, k, depth + 1);
		walk_mark(c, l->epilogue, owner, k, depth + 1);
	}
	walk_mark(c, r, owner, k, depth + 1);
}

static void walk_mark(sch *c, ts_id r, ts_id owner, uint32_t k, int depth)
{
	const ts_region *g = &c->s->rg[r];
	for (uint32_t i = 0; i < g->nitem; i++) {
		uint32_t it = g->item[i], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			c->op_rg[id] = owner, c->op_it[id] = k;
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			c->sc_rg[id] = owner, c->sc_it[id] = k;
		else
			mark_region(c, id, owner, k, depth);
	}
}

static void add_edge(sch *c, uint32_t a, uint32_t b)
{
	if (a == b)
		return;
	uint32_t from = a < b ? a : b, to = a < b ? b : a;
	if (c->adj) {
		uint8_t *bit = &c->adj[(size_t)from * c->nadj + to];
		if (*bit)
			return;
		*bit = 1;
	}
	edge *e = push(c, &c->edges);
	e->from = from;
	e->to = to;
}

/* item k reads scalar x */
static void uses(sch *c, ts_id r, uint32_t k, ts_id x)
{
	if (x < c->s->nsc && c->sc_rg[x] == r && c->sc_it[x] < k)
		add_edge(c, c->sc_it[x], k);
}

static void touches(sch *c, uint32_t k, ts_id b, bool ld)
{
	touch *t = push(c, &c->touches);
	*t = (touch){b, k, ld};
}

static void item_op(sch *c, ts_id r, uint32_t k, ts_id id)
{
	const ts_op *o = &c->s->op[id];
	for (uint32_t d = 0; d < o->ndep; d++)
		if (!o->dist[d] && o->dep[d] < c->s->nop && c->op_rg[o->dep[d]] == r && c->op_it[o->dep[d]] < k)
			add_edge(c, c->op_it[o->dep[d]], k);
	for (int w = 0; w < TCP_NVIEW; w++)
		if (o->in.v[w].t >= 0) {
			touches(c, k, (ts_id)o->in.v[w].t, false);
			if (o->in.v[w].reg >= 0)
				uses(c, r, k, (ts_id)o->in.v[w].reg);
		}
	if (o->in.vreg >= 0)
		uses(c, r, k, (ts_id)o->in.vreg);
	for (ts_id b = 0; b < c->s->nbuf; b++) /* a span held at an op that does not touch it */
		if (c->s->buf[b].life == TS_LIFE_SPAN && (c->s->buf[b].first == id || c->s->buf[b].last == id))
			touches(c, k, b, false);
	c->csum[k][o->ctx] += o->cost;
	c->nscal[k]++;
}

static void item_scalar(sch *c, ts_id r, uint32_t k, ts_id id)
{
	const ts_scalar *x = &c->s->sc[id];
	if (x->kind == TS_SC_ALU || x->kind == TS_SC_CMP || x->kind == TS_SC_LOOPVAR || x->kind == TS_SC_SPM_LD)
		uses(c, r, k, x->a);
	if (x->kind == TS_SC_ALU || x->kind == TS_SC_CMP)
		uses(c, r, k, x->b);
	if (x->kind == TS_SC_SPM_LD)
		touches(c, k, x->buf, true);
	c->nscal[k]++;
}

static void item_region(sch *c, ts_id r, uint32_t k, ts_id sub, int depth);

static void item_items(sch *c, ts_id r, uint32_t k, ts_id sub, int depth)
{
	const ts_region *g = &c->s->rg[sub];
	if (g->kind == TS_RG_GUARD || g->kind == TS_RG_CLASSES)
		uses(c, r, k, g->pred);
	for (uint32_t i = 0; i < g->nitem; i++) {
		uint32_t it = g->item[i], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			item_op(c, r, k, id);
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			item_scalar(c, r, k, id);
		else
			item_region(c, r, k, id, depth + 1);
	}
}

static void item_region(sch *c, ts_id r, uint32_t k, ts_id sub, int depth)
{
	const tcp_sched *s = c->s;
	if (depth > 70)
		return;
	if (s->rg[sub].kind == TS_RG_LOOP) {
		const ts_loop *l = &s->loop[s->rg[sub].loop];
		uses(c, r, k, l->nb);
		item_items(c, r, k, l->prologue, depth + 1);
		item_items(c, r, k, l->body, depth + 1);
		item_items(c, r, k, l->epilogue, depth + 1);
	}
	item_items(c, r, k, sub, depth + 1);
}

static int cmp_touch(const void *x, const void *y)
{
	const touch *a = x, *b = y;
	if (a->buf != b->buf)
		return a->buf < b->buf ? -1 : 1;
	return a->item < b->item ? -1 : a->item > b->item;
}

static int cmp_edge(const void *x, const void *y)
{
	const edge *a = x, *b = y;
	if (a->from != b->from)
		return a->from < b->from ? -1 : 1;
	return a->to < b->to ? -1 : a->to > b->to;
}

/* the first touch of buffer b in the sorted list (n when none) */
static size_t first_touch(const touch *t, size_t n, ts_id b)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (t[mid].buf < b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* ld order and reuse order, from the touches */
static void touch_edges(sch *c)
{
	touch *t = c->touches.a;
	size_t n = c->touches.n;
	if (n > 1) /* none: the list may be unallocated */
		qsort(t, n, sizeof *t, cmp_touch);
	for (size_t i = 0; i < n;) {
		size_t j = i;
		while (j < n && t[j].buf == t[i].buf)
			j++;
		for (size_t a = i; a < j; a++) /* an ld keeps its side of every access of its buffer */
			if (t[a].ld)
				for (size_t b = i; b < j; b++)
					add_edge(c, t[a].item, t[b].item);
		ts_id x = t[i].buf;
		for (uint32_t q = 0; x < c->s->nbuf && q < c->nalias[x]; q++) {
			ts_id y = c->alias[x][q];
			if (y < x)
				continue;
			for (size_t b = first_touch(t, n, y); b < n && t[b].buf == y; b++)
				for (size_t a = i; a < j; a++)
					add_edge(c, t[a].item, t[b].item);
		}
		i = j;
	}
}

/* ---- one region ---- */
typedef struct rstate {
	int64_t tc, cfree[TCP_NCTX];
} rstate;

static int64_t item_start(const sch *c, const tcp_sched *s, uint32_t it, const rstate *st, int64_t ready)
{
	int64_t t = st->tc;
	if (TS_ITEM_KIND(it) == TS_ITEM_OP) {
		const ts_op *o = &s->op[TS_ITEM_ID(it)];
		t += tcp_cost_scalar(&c->cm, o->in.op);
		t = t > st->cfree[o->ctx] ? t : st->cfree[o->ctx];
	}
	return t > ready ? t : ready;
}

static int64_t item_commit(const sch *c, const tcp_sched *s, uint32_t k, uint32_t it, rstate *st, int64_t ready)
{
	int64_t start = item_start(c, s, it, st, ready), end = start;
	int64_t sc = tcp_cost_scalar(&c->cm, TCP_OP_LI);
	if (TS_ITEM_KIND(it) == TS_ITEM_OP) {
		const ts_op *o = &s->op[TS_ITEM_ID(it)];
		st->tc += tcp_cost_scalar(&c->cm, o->in.op);
		end = start + o->cost;
		st->cfree[o->ctx] = end;
		return end;
	}
	st->tc = (st->tc > ready ? st->tc : ready) + sc * c->nscal[k];
	for (int x = 0; x < TCP_NCTX; x++)
		if (c->csum[k][x] > 0) {
			int64_t from = st->cfree[x] > start ? st->cfree[x] : start;
			st->cfree[x] = from + c->csum[k][x];
			end = end > st->cfree[x] ? end : st->cfree[x];
		}
	return end > st->tc ? end : st->tc;
}

/* The list order of variant v (0: ties by bottom level; 1: ties by the
 * earliest predicted end, then bottom level) as original item indices. */
static void list_order(sch *c, const uint32_t *items, uint32_t n, const edge *e, const uint32_t *first, const uint32_t *npred0,
	const int64_t *bl, int v, uint32_t *out)
{
	uint32_t *npred = ctx_alloc(c->ctx, n * sizeof *npred);
	int64_t *ready = ctx_alloc(c->ctx, n * sizeof *ready);
	bool *done = ctx_alloc(c->ctx, n);
	memcpy(npred, npred0, n * sizeof *npred);
	memset(ready, 0, n * sizeof *ready);
	memset(done, 0, n);
	rstate st = {0, {0}};
	for (uint32_t step = 0; step < n; step++) {
		uint32_t best = UINT32_MAX;
		int64_t bs = 0, be = 0;
		for (uint32_t k = 0; k < n; k++) {
			if (done[k] || npred[k])
				continue;
			int64_t t = item_start(c, c->s, items[k], &st, ready[k]);
			int64_t end = t + (TS_ITEM_KIND(items[k]) == TS_ITEM_OP ? c->s->op[TS_ITEM_ID(items[k])].cost : 0);
			bool better = best == UINT32_MAX || t < bs;
			if (!better && t == bs)
				better = v == 1 ? end < be || (end == be && bl[k] > bl[best]) : bl[k] > bl[best];
			if (better)
				best = k, bs = t, be = end;
		}
		int64_t end = item_commit(c, c->s, best, items[best], &st, ready[best]);
		done[best] = true;
		out[step] = best;
		for (uint32_t j = first[best]; j < first[best + 1]; j++) {
			npred[e[j].to]--;
			ready[e[j].to] = ready[e[j].to] > end ? ready[e[j].to] : end;
		}
	}
	ctx_free(c->ctx, npred, 0);
	ctx_free(c->ctx, ready, 0);
	ctx_free(c->ctx, done, 0);
}

/* the whole schedule's predicted cycles on the expected loads (the timeline
 * of sched_time.c); INT64_MAX when it cannot be predicted. A new order of
 * region r only: where the kept orders' walk did not enter r, the
 * prediction is c->cycles (tcp_sched_predict_cached), which it returns
 * without a walk; either way it counts against the budget. */
static int64_t whole(sch *c, ts_id r)
{
	c->evals++;
	if (!c->entered[r])
		return c->cycles;
	int64_t t = tcp_sched_predict_cached(c->ctx, c->s, c->memo, c->tried);
	return t < 0 ? INT64_MAX : t;
}

/* the last prediction (whole) is kept: t its cycles */
static void keep(sch *c, int64_t t)
{
	uint8_t *x = c->entered;
	c->cycles = t;
	c->entered = c->tried;
	c->tried = x;
}

/* Moves each op before the previous op of its context in the region when no
 * edge forbids it and the whole schedule's prediction drops; one pass, within
 * the evaluation budget. orig[k]: the item's original index. */
static void improve(sch *c, ts_region *g, uint32_t *orig, const uint8_t *adj)
{
	uint32_t n = g->nitem;
	for (uint32_t p = 1; p < n && c->evals < SCHED_EVALS; p++) {
		uint32_t it = g->item[p];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			continue;
		int ctx = c->s->op[TS_ITEM_ID(it)].ctx;
		uint32_t q = p;
		while (q-- > 0)
			if (TS_ITEM_KIND(g->item[q]) == TS_ITEM_OP && c->s->op[TS_ITEM_ID(g->item[q])].ctx == ctx)
				break;
		if (q == UINT32_MAX)
			continue;
		bool legal = true;
		for (uint32_t r = q; r < p && legal; r++)
			legal = !adj[(size_t)orig[r] * n + orig[p]];
		if (!legal)
			continue;
		uint32_t k = orig[p];
		memmove(&g->item[q + 1], &g->item[q], (p - q) * sizeof *g->item);
		memmove(&orig[q + 1], &orig[q], (p - q) * sizeof *orig);
		g->item[q] = it, orig[q] = k;
		int64_t t = whole(c, (ts_id)(g - c->s->rg));
		if (t < c->cycles) {
			keep(c, t);
			continue;
		}
		memmove(&g->item[q], &g->item[q + 1], (p - q) * sizeof *g->item);
		memmove(&orig[q], &orig[q + 1], (p - q) * sizeof *orig);
		g->item[p] = it, orig[p] = k;
	}
}

static void schedule_region(sch *c, ts_id r)
{
	tcp_sched *s = c->s;
	ts_region *g = &s->rg[r];
	uint32_t n = g->nitem;
	if (g->kind == TS_RG_CLASSES || n < 2)
		return; /* a row-class switch's items are its cases, in bound order */
	for (uint32_t k = 0; k < n; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			c->op_rg[id] = r, c->op_it[id] = k;
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			c->sc_rg[id] = r, c->sc_it[id] = k;
		else
			mark_region(c, id, r, k, 0);
	}
	c->edges.n = c->touches.n = 0;
	uint8_t *adj = (size_t)n * n <= ((size_t)1 << 24) ? ctx_alloc(c->ctx, (size_t)n * n) : NULL;
	if (adj)
		memset(adj, 0, (size_t)n * n);
	c->adj = adj, c->nadj = n;
	c->csum = ctx_alloc(c->ctx, n * sizeof *c->csum);
	c->nscal = ctx_alloc(c->ctx, n * sizeof *c->nscal);
	memset(c->csum, 0, n * sizeof *c->csum);
	memset(c->nscal, 0, n * sizeof *c->nscal);
	for (uint32_t k = 0; k < n; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			item_op(c, r, k, id);
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			item_scalar(c, r, k, id);
		else
			item_region(c, r, k, id, 0);
	}
	touch_edges(c);
	edge *e = c->edges.a;
	size_t ne = c->edges.n, m = 0;
	if (ne)
		qsort(e, ne, sizeof *e, cmp_edge);
	for (size_t i = 0; i < ne; i++)
		if (!m || e[i].from != e[m - 1].from || e[i].to != e[m - 1].to)
			e[m++] = e[i];
	/* successors (CSR over `from`), predecessor counts, bottom levels */
	uint32_t *first = ctx_alloc(c->ctx, (n + 1) * sizeof *first), *npred = ctx_alloc(c->ctx, n * sizeof *npred);
	int64_t *bl = ctx_alloc(c->ctx, n * sizeof *bl);
	uint32_t *items = ctx_alloc(c->ctx, n * sizeof *items), *cand = ctx_alloc(c->ctx, n * sizeof *cand);
	uint32_t *orig = ctx_alloc(c->ctx, n * sizeof *orig), *best = ctx_alloc(c->ctx, n * sizeof *best);
	memset(npred, 0, n * sizeof *npred);
	memcpy(items, g->item, n * sizeof *items);
	for (uint32_t k = 0, j = 0; k <= n; k++) {
		while (j < m && e[j].from < k)
			j++;
		first[k] = j;
	}
	for (size_t i = 0; i < m; i++)
		npred[e[i].to]++;
	for (uint32_t k = n; k-- > 0;) {
		int64_t own = 0, down = 0;
		for (int x = 0; x < TCP_NCTX; x++)
			own += c->csum[k][x];
		for (uint32_t j = first[k]; j < first[k + 1]; j++)
			down = bl[e[j].to] > down ? bl[e[j].to] : down;
		bl[k] = own + down;
	}
	/* the list orders, each kept only if the whole schedule's prediction drops */
	for (uint32_t k = 0; k < n; k++)
		best[k] = k;
	for (int v = 0; v < 2; v++) {
		list_order(c, items, n, e, first, npred, bl, v, cand);
		for (uint32_t k = 0; k < n; k++)
			g->item[k] = items[cand[k]];
		/* the kept order again: its prediction is c->cycles */
		bool same = !memcmp(cand, best, n * sizeof *best);
		int64_t t = c->evals >= SCHED_EVALS ? INT64_MAX : same ? (c->evals++, c->cycles) : whole(c, r);
		if (t < c->cycles) {
			keep(c, t);
			memcpy(best, cand, n * sizeof *best);
		}
	}
	for (uint32_t k = 0; k < n; k++)
		g->item[k] = items[best[k]], orig[k] = best[k];
	if (c->evals < SCHED_EVALS && adj)
		improve(c, g, orig, adj); /* adj holds exactly the edges of e */
	if (adj)
		ctx_free(c->ctx, adj, 0);
	c->adj = NULL;
	void *blocks[] = {first, npred, bl, items, cand, orig, best, c->csum, c->nscal};
	for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++)
		ctx_free(c->ctx, blocks[k], 0);
	c->csum = NULL;
	c->nscal = NULL;
}

/* regions innermost first */
static void schedule_tree(sch *c, ts_id r, int depth)
{
	const tcp_sched *s = c->s;
	if (depth > 70)
		return;
	if (s->rg[r].kind == TS_RG_LOOP) {
		const ts_loop *l = &s->loop[s->rg[r].loop];
		schedule_tree(c, l->prologue, depth + 1);
		schedule_tree(c, l->body, depth + 1);
		schedule_tree(c, l->epilogue, depth + 1);
	}
	const ts_region *g = &s->rg[r];
	for (uint32_t i = 0; i < g->nitem; i++)
		if (TS_ITEM_KIND(g->item[i]) == TS_ITEM_RG)
			schedule_tree(c, TS_ITEM_ID(g->item[i]), depth + 1);
	schedule_region(c, r);
}

static moe_status run(moe_ctx *ctx, tcp_sched *s)
{
	if (!s->m) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the list scheduler needs a machine");
		return MOE_ERR_INVALID;
	}
	sch c = {.ctx = ctx, .s = s, .edges = {.sz = sizeof(edge)}, .touches = {.sz = sizeof(touch)}};
	tcp_cm_init(&c.cm, s->m);
	size_t no = s->nop + 1, ns = s->nsc + 1;
	c.op_rg = ctx_alloc(ctx, no * sizeof *c.op_rg);
	c.sc_rg = ctx_alloc(ctx, ns * sizeof *c.sc_rg);
	c.op_it = ctx_alloc(ctx, no * sizeof *c.op_it);
	c.sc_it = ctx_alloc(ctx, ns * sizeof *c.sc_it);
	for (size_t i = 0; i < no; i++)
		c.op_rg[i] = TS_NONE;
	for (size_t i = 0; i < ns; i++)
		c.sc_rg[i] = TS_NONE;
	uint32_t *old = ctx_alloc(ctx, no * sizeof *old);
	ts_op_positions(s, old);
	find_aliases(&c);
	c.memo = ts_cost_cache_new(ctx);
	c.entered = ctx_alloc(ctx, s->nrg + 1);
	c.tried = ctx_alloc(ctx, s->nrg + 1);
	/* the ops' costs, and the build order's prediction */
	c.cycles = tcp_sched_cost_cached(ctx, s, c.memo, c.entered);
	c.cycles = c.cycles < 0 ? INT64_MAX : c.cycles;
	schedule_tree(&c, s->top, 0);
	ts_renew_spans(s, ctx, old);
	ts_cost_cache_free(ctx, c.memo);
	for (ts_id b = 0; b < s->nbuf; b++)
		ctx_free(ctx, c.alias[b], 0);
	void *blocks[] = {c.op_rg, c.sc_rg, c.op_it, c.sc_it, old, c.alias, c.nalias, c.edges.a, c.touches.a, c.entered, c.tried};
	for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++)
		ctx_free(ctx, blocks[k], 0);
	return MOE_OK;
}

moe_status tcp_sched_schedule(moe_ctx *ctx, tcp_sched *s)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, run(ctx, s));
}
