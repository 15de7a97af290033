/* backend-tcp/compiler/reuse.c: reuse edges (docs/tcp-compiler.md 5.3, item
 * 4). Two placed buffers of one on-chip space whose bytes and slices overlap
 * take turns on those bytes; every turn is ordered by dependencies here:
 * the accesses of the two buffers, merged in program order, form runs of one
 * buffer each, and at each change of run the next run's first access and
 * first write on each context depend on the previous run's last access on
 * every other context (one context runs its commands in order, so its own
 * accesses need none). When both buffers are used only inside one block
 * loop's body, block g + 1's first run also depends at distance 1 on block
 * g's last run. Ops in different cases of one row-class switch never run in
 * one pass of it: those pairs take no edge at distance 0, but inside a loop
 * body, whose consecutive blocks may take different cases, the edge is taken
 * at distance 1; each case's own first and last accesses are taken. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"

enum { RU_ALT = 128 }; /* per context: one op, plus ops of other row-class cases (more cases than a classes region holds) */

typedef struct racc {
	ts_id op;
	uint32_t pos;
	uint8_t ctx, write;
} racc;

typedef struct ru {
	tcp_sched *s;
	uint32_t *pos;
	int8_t *rloop;      /* per region: the loop whose body holds it, -1 */
	uint32_t *start;    /* per buffer: its accesses acc[start[b]..start[b + 1]), program order */
	racc *acc;
	uint8_t *excl;      /* per region pair (nrg x nrg): 0 not asked, else 1 + ts_ops_exclusive; NULL: ask */
	ts_id *rg;          /* per op: its region */
	uint8_t *ctx;       /* per op: its context */
	int8_t *oloop;      /* per op: region_loop of its region */
} ru;

/* ts_ops_exclusive(a, b), which depends only on the two ops' regions:
 * asked once per region pair */
static inline bool exclusive(ru *u, ts_id a, ts_id b)
{
	const tcp_sched *s = u->s;
	ts_id x = u->rg[a], y = u->rg[b];
	if (!u->excl || x >= s->nrg || y >= s->nrg)
		return ts_ops_exclusive(s, a, b);
	uint8_t *e = &u->excl[(size_t)x * s->nrg + y];
	if (!*e)
		*e = (uint8_t)(1 + ts_ops_exclusive(s, a, b));
	return *e == 2;
}

/* u->excl where there are few enough regions: 0 (not asked yet) for every pair */
static void exclusive_table(ru *u)
{
	const tcp_sched *s = u->s;
	if (!s->nrg || s->nrg > 4096)
		return;
	size_t n = (size_t)s->nrg * s->nrg;
	u->excl = ctx_alloc(s->ctx, n + 1);
	memset(u->excl, 0, n + 1);
}

static int8_t region_loop(ru *u, ts_id r, int depth)
{
	const tcp_sched *s = u->s;
	if (r >= s->nrg || depth > 70)
		return -1;
	if (u->rloop[r] != -2)
		return u->rloop[r];
	int8_t l = -1;
	for (int k = 0; k < s->nloop; k++)
		if (s->loop[k].body == r)
			l = (int8_t)k;
	if (l < 0)
		l = region_loop(u, s->rg[r].parent, depth + 1);
	return u->rloop[r] = l;
}

static int cmp_racc(const void *x, const void *y)
{
	const racc *a = x, *b = y;
	return (a->pos > b->pos) - (a->pos < b->pos);
}

/* Every op's accesses per buffer (one per op and buffer; a write when the op's
 * destination names it), in program order. */
static void accesses(ru *u)
{
	tcp_sched *s = u->s;
	u->start = ctx_alloc(s->ctx, (s->nbuf + 2) * sizeof *u->start);
	for (int pass = 0; pass < 2; pass++) {
		uint32_t *fill = pass ? ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *fill) : NULL;
		if (fill)
			memcpy(fill, u->start, s->nbuf * sizeof *fill);
		for (ts_id o = 0; o < s->nop; o++) {
			const tcp_insn *in = &s->op[o].in;
			for (int w = 0; w < TCP_NVIEW; w++) {
				int32_t t = in->v[w].t;
				bool dup = t < 0 || (ts_id)t >= s->nbuf;
				for (int k = 0; k < w && !dup; k++)
					dup = in->v[k].t == t;
				if (dup)
					continue;
				bool wr = in->v[TCP_V_DST].t == t;
				if (!pass)
					u->start[t + 1]++;
				else
					u->acc[fill[t]++] = (racc){o, u->pos[o], s->op[o].ctx, wr};
			}
		}
		if (!pass) {
			for (ts_id b = 0; b < s->nbuf; b++)
				u->start[b + 1] += u->start[b];
			u->acc = ctx_alloc(s->ctx, (u->start[s->nbuf] + 1) * sizeof *u->acc);
		} else
			ctx_free(s->ctx, fill, 0);
	}
	for (ts_id b = 0; b < s->nbuf; b++)
		qsort(u->acc + u->start[b], u->start[b + 1] - u->start[b], sizeof *u->acc, cmp_racc);
}

/* A run: accesses r[0..n) of one buffer. pick: on context c, the last access
 * (last) or the first access or first write (!last), with those of other
 * row-class cases, into out (at most RU_ALT). */
static int pick(ru *u, const racc *r, uint32_t n, int c, bool last, bool write, ts_id *out)
{
	int k = 0;
	for (uint32_t i = 0; i < n && k < RU_ALT; i++) {
		const racc *a = &r[last ? n - 1 - i : i];
		if (a->ctx != c || (write && !a->write))
			continue;
		bool alt = true;
		for (int j = 0; j < k && alt; j++)
			alt = exclusive(u, a->op, out[j]);
		if (alt)
			out[k++] = a->op;
	}
	return k;
}

static bool any_write(const racc *r, uint32_t n, int c)
{
	for (uint32_t i = 0; i < n; i++)
		if (r[i].ctx == c && r[i].write)
			return true;
	return false;
}

/* Whether op d, in the body of loop l, runs in every pass of the body that
 * runs op o: every region between d and the body is an unconditional
 * sequence (not a guard, a case, a tier or a loop) or holds o. */
static bool runs_with(ru *u, ts_id d, ts_id o, int l)
{
	const tcp_sched *s = u->s;
	ts_id body = s->loop[l].body;
	for (ts_id r = s->op[d].region; r < s->nrg && r != body; r = s->rg[r].parent) {
		const ts_region *g = &s->rg[r];
		bool plain = g->kind == TS_RG_SEQ && (g->parent >= s->nrg || s->rg[g->parent].kind != TS_RG_CLASSES);
		if (!plain && !ts_region_within(s, s->op[o].region, r))
			return false;
	}
	return true;
}

/* o waits for `on` (at distance dist) unless a dependency of o already
 * implies it: one at that distance on a later-or-same op of on's context,
 * or, at distance 1 inside a loop body, one at distance 0 on an op of on's
 * context that runs in o's pass of the body (it starts after the previous
 * block's commands of its context). Ops in different cases of one
 * row-class switch run in different passes only: inside a loop body, block
 * g + 1's o waits at distance 1 for on's last run before it (block g may
 * have taken on's case); elsewhere they need none. */
static void edge(ru *u, ts_id o, ts_id on, int dist)
{
	const tcp_sched *s = u->s;
	int l = u->oloop[o];
	if (exclusive(u, o, on)) {
		if (l < 0)
			return;
		dist = 1;
	}
	if (o == on || (!dist && u->pos[on] >= u->pos[o]))
		return;
	const ts_op *p = &s->op[o];
	bool body = dist && l >= 0 && u->oloop[on] == l;
	uint8_t c = u->ctx[on];
	for (uint32_t k = 0; k < p->ndep; k++) {
		ts_id d = p->dep[k];
		if (d >= s->nop || u->ctx[d] != c)
			continue;
		if (p->dist[k] == dist && u->pos[d] >= u->pos[on] && !exclusive(u, d, on))
			return;
		if (body && !p->dist[k] && u->oloop[d] == l && runs_with(u, d, o, l))
			return;
	}
	if (p->ndep < TS_MAX_DEPS - 1) /* else the verifier reports the unordered pair */
		ts_add_dep(u->s, o, on, dist);
}

/* Run b (the later) waits for run a: per context of b, its first access
 * (when it writes or a writes on that other context) and its first write. */
static void order_runs(ru *u, const racc *a, uint32_t na, const racc *b, uint32_t nb, int dist)
{
	for (int cb = 0; cb < TCP_NCTX; cb++) {
		ts_id first[RU_ALT], wr[RU_ALT];
		int nf = pick(u, b, nb, cb, false, false, first), nw = pick(u, b, nb, cb, false, true, wr);
		if (!nf)
			continue;
		/* fw[j]: first[j] writes (its edge is taken whatever a does); a
		 * first write that is some case's first access already has it */
		bool fw[RU_ALT];
		for (int j = 0; j < nf; j++) {
			fw[j] = false;
			for (uint32_t k = 0; k < nb && !fw[j]; k++)
				fw[j] = b[k].op == first[j] && b[k].write;
		}
		int nw2 = 0;
		for (int j = 0; j < nw; j++) {
			bool seen = false;
			for (int f = 0; f < nf && !seen; f++)
				seen = first[f] == wr[j];
			if (!seen)
				wr[nw2++] = wr[j];
		}
		for (int ca = 0; ca < TCP_NCTX; ca++) {
			ts_id last[RU_ALT];
			int nl = ca == cb ? 0 : pick(u, a, na, ca, true, false, last);
			bool aw = nl && any_write(a, na, ca);
			for (int i = 0; i < nl; i++) {
				for (int j = 0; j < nf; j++)
					if (fw[j] || aw)
						edge(u, first[j], last[i], dist);
				for (int j = 0; j < nw2; j++)
					edge(u, wr[j], last[i], dist);
			}
		}
	}
}

/* Whether every access of buffer b stands in loop l's body. */
static bool in_body(ru *u, ts_id b, int l)
{
	for (uint32_t i = u->start[b]; i < u->start[b + 1]; i++)
		if (u->oloop[u->acc[i].op] != l)
			return false;
	return u->start[b + 1] > u->start[b];
}

/* Buffers x and y share bytes: their runs in program order, each ordered
 * after the one before it (and the first after the last of the previous
 * block, inside one loop body). */
static void order_pair(ru *u, ts_id x, ts_id y)
{
	const racc *ax = u->acc + u->start[x], *ay = u->acc + u->start[y];
	uint32_t nx = u->start[x + 1] - u->start[x], ny = u->start[y + 1] - u->start[y];
	if (!nx || !ny)
		return;
	const racc *prev = NULL, *first = NULL;
	uint32_t np = 0, nfirst = 0, i = 0, j = 0;
	while (i < nx || j < ny) {
		bool tx = j >= ny || (i < nx && ax[i].pos <= ay[j].pos);
		const racc *r = tx ? ax + i : ay + j;
		uint32_t n = 0, lim = tx ? nx - i : ny - j;
		const racc *other = tx ? ay + j : ax + i;
		bool more = tx ? j < ny : i < nx;
		while (n < lim && (!more || r[n].pos <= other->pos))
			n++;
		if (prev)
			order_runs(u, prev, np, r, n, 0);
		else
			first = r, nfirst = n;
		prev = r, np = n;
		if (tx)
			i += n;
		else
			j += n;
	}
	if (prev == first || (prev >= ax && prev < ax + nx) == (first >= ax && first < ax + nx))
		return;
	for (int l = 0; l < u->s->nloop; l++)
		if (in_body(u, x, l) && in_body(u, y, l))
			order_runs(u, prev, np, first, nfirst, 1);
}

typedef struct rplaced {
	ts_id buf;
	uint8_t space;
	int64_t lo, hi;   /* per-slice bytes, inclusive */
	uint32_t s0, s1;  /* slices, inclusive */
} rplaced;

static int cmp_rplaced(const void *x, const void *y)
{
	const rplaced *a = x, *b = y;
	if (a->space != b->space)
		return a->space < b->space ? -1 : 1;
	return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : (a->buf > b->buf) - (a->buf < b->buf);
}

static void reuse_edges(tcp_sched *s)
{
	ru u = {.s = s};
	u.pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *u.pos);
	ts_op_positions(s, u.pos);
	u.rloop = ctx_alloc(s->ctx, s->nrg + 1);
	memset(u.rloop, -2, s->nrg + 1);
	u.rg = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *u.rg);
	u.ctx = ctx_alloc(s->ctx, s->nop + 1);
	u.oloop = ctx_alloc(s->ctx, s->nop + 1);
	for (ts_id o = 0; o < s->nop; o++) {
		u.rg[o] = s->op[o].region;
		u.ctx[o] = s->op[o].ctx;
		u.oloop[o] = region_loop(&u, s->op[o].region, 0);
	}
	exclusive_table(&u);
	accesses(&u);
	rplaced *P = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *P);
	uint32_t n = 0;
	for (ts_id b = 0; b < s->nbuf; b++) {
		const ts_buf *x = &s->buf[b];
		if (x->space == TCP_HBM || x->space >= TCP_NSPACE || x->offset < 0 || x->layout.slice_bytes <= 0)
			continue;
		uint32_t s0 = x->layout.slice0, ns = (uint32_t)x->layout.nslices * (x->layout.copies ? x->layout.copies : 1);
		P[n++] = (rplaced){b, x->space, x->offset, x->offset + x->layout.slice_bytes - 1, s0, s0 + (ns ? ns : 1) - 1};
	}
	qsort(P, n, sizeof *P, cmp_rplaced);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = i + 1; j < n && P[j].space == P[i].space && P[j].lo <= P[i].hi; j++)
			if (!(P[i].s1 < P[j].s0 || P[j].s1 < P[i].s0))
				order_pair(&u, P[i].buf, P[j].buf);
	void *blocks[] = {u.pos, u.rloop, u.start, u.acc, P, u.excl, u.rg, u.ctx, u.oloop};
	for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++)
		ctx_free(s->ctx, blocks[k], 0);
}

void ts_reuse_edges(tcp_sched *s)
{
	reuse_edges(s);
}
