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
	ts_excl excl;
	uint8_t *ctx;       /* per op: its context */
	int8_t *oloop;      /* per op: region_loop of its region */
	ts_id *acc_buf;     /* per access: its buffer */
	struct rpicks *picks; /* per buffer: its picks as one run, found when first asked */
	int8_t *bdep;       /* per op and context: body_dep, -1 not asked */
	struct rdeps *deps; /* per op: op_deps */
	uint32_t *mark, *mat, stamp; /* op_deps' index of one op's entries */
} ru;

static inline bool exclusive(ru *u, ts_id a, ts_id b)
{
	return ts_excl_ops(&u->excl, a, b);
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
			u->acc_buf = ctx_alloc(s->ctx, (u->start[s->nbuf] + 1) * sizeof *u->acc_buf);
			for (ts_id b = 0; b < s->nbuf; b++)
				for (uint32_t i = u->start[b]; i < u->start[b + 1]; i++)
					u->acc_buf[i] = b;
		} else
			ctx_free(s->ctx, fill, 0);
	}
	for (ts_id b = 0; b < s->nbuf; b++)
		qsort(u->acc + u->start[b], u->start[b + 1] - u->start[b], sizeof *u->acc, cmp_racc);
}

/* A run: accesses r[0..n) of one buffer; buf, when the run is all of that
 * buffer's accesses (else TS_NONE). pick: on context c, the last access
 * (last) or the first access or first write (!last), with those of other
 * row-class cases, into out (at most RU_ALT). */
typedef struct rrun {
	const racc *r;
	uint32_t n;
	ts_id buf;
} rrun;

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

/* The contexts run r accesses (bit c) and those it writes on. */
static void run_ctxs(const racc *r, uint32_t n, unsigned *any, unsigned *wr)
{
	unsigned a = 0, w = 0;
	for (uint32_t i = 0; i < n; i++) {
		a |= 1u << r[i].ctx;
		w |= (unsigned)r[i].write << r[i].ctx;
	}
	*any = a, *wr = w;
}

enum { RU_FIRST, RU_WRITE, RU_LAST, RU_NPICK };

/* A whole buffer's picks, found once: ids[at[k][c]..at[k][c] + n[k][c]). */
typedef struct rpicks {
	ts_id *ids;
	uint32_t at[RU_NPICK][TCP_NCTX];
	uint8_t n[RU_NPICK][TCP_NCTX];
	unsigned any, wr;
} rpicks;

static const rpicks *buf_picks(ru *u, ts_id b)
{
	rpicks *p = &u->picks[b];
	if (p->ids)
		return p;
	const racc *r = u->acc + u->start[b];
	uint32_t n = u->start[b + 1] - u->start[b], m = 0;
	ts_id tmp[RU_NPICK * TCP_NCTX * RU_ALT];
	run_ctxs(r, n, &p->any, &p->wr);
	for (int k = 0; k < RU_NPICK; k++)
		for (int c = 0; c < TCP_NCTX; c++) {
			bool want = k == RU_WRITE ? p->wr >> c & 1 : p->any >> c & 1;
			int got = want ? pick(u, r, n, c, k == RU_LAST, k == RU_WRITE, tmp + m) : 0;
			p->at[k][c] = m, p->n[k][c] = (uint8_t)got;
			m += (uint32_t)got;
		}
	p->ids = ctx_alloc(u->s->ctx, (m + 1) * sizeof *p->ids);
	memcpy(p->ids, tmp, m * sizeof *tmp);
	return p;
}

/* Run v's picks of kind k on context c: a pointer to them (out, or the
 * buffer's picks when v is a whole buffer) and their count in *n. */
static const ts_id *run_pick(ru *u, const rrun *v, int k, int c, ts_id *out, int *n)
{
	if (v->buf != TS_NONE) {
		const rpicks *p = buf_picks(u, v->buf);
		*n = p->n[k][c];
		return p->ids + p->at[k][c];
	}
	*n = pick(u, v->r, v->n, c, k == RU_LAST, k == RU_WRITE, out);
	return out;
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

/* Op o's dependencies by the context of the op depended on, one entry per
 * region and distance holding the latest position among them (whether one
 * implies an edge reads only that and the region): built when first asked,
 * kept current as edges are added. */
typedef struct rdep {
	uint32_t pos;
	ts_id op, rg; /* op: one of the region's ops (exclusivity reads only its region) */
	uint8_t dist;
} rdep;

typedef struct rdeps {
	rdep *e[TCP_NCTX];
	uint32_t n[TCP_NCTX], cap[TCP_NCTX];
	bool built;
} rdeps;

/* Entry `at` of o's list c raised to d's position, or (at == UINT32_MAX) a
 * new entry for d. */
static void dep_put(ru *u, rdeps *q, int c, ts_id d, int dist, uint32_t at)
{
	uint32_t pos = u->pos[d];
	if (at != UINT32_MAX) {
		rdep *x = &q->e[c][at];
		x->pos = pos > x->pos ? pos : x->pos;
		return;
	}
	ctx_grow(u->s->ctx, (void **)&q->e[c], &q->cap[c], q->n[c] + 1, sizeof *q->e[c]);
	q->e[c][q->n[c]++] = (rdep){pos, d, u->s->op[d].region, (uint8_t)dist};
}

static const rdeps *op_deps(ru *u, ts_id o)
{
	rdeps *q = &u->deps[o];
	if (q->built)
		return q;
	const tcp_sched *s = u->s;
	const ts_op *p = &s->op[o];
	q->built = true;
	u->stamp++;
	for (uint32_t k = 0; k < p->ndep; k++) {
		ts_id d = p->dep[k], rg = d < s->nop ? s->op[d].region : TS_NONE;
		uint8_t c = d < s->nop ? u->ctx[d] : TCP_NCTX;
		if (c >= TCP_NCTX)
			continue;
		/* mark[key]: the stamp of the build that listed (region, distance, context) at mat[key] */
		size_t key = ((size_t)rg * 2 + p->dist[k]) * TCP_NCTX + c;
		bool keyed = rg < s->nrg && p->dist[k] <= 1;
		uint32_t at = keyed && u->mark[key] == u->stamp ? u->mat[key] : UINT32_MAX;
		if (keyed && at == UINT32_MAX)
			u->mark[key] = u->stamp, u->mat[key] = q->n[c];
		dep_put(u, q, c, d, p->dist[k], at);
	}
	return q;
}

/* Whether op o, in the body of loop l, has a distance-0 dependency on an op
 * of context c that runs in o's pass of the body; asked once per op and
 * context, then kept current as edges are added. */
static bool body_dep(ru *u, ts_id o, int c, int l)
{
	int8_t *k = &u->bdep[(size_t)o * TCP_NCTX + c];
	if (*k < 0) {
		const ts_op *p = &u->s->op[o];
		*k = 0;
		for (uint32_t i = 0; i < p->ndep && !*k; i++) {
			ts_id d = p->dep[i];
			*k = d < u->s->nop && !p->dist[i] && u->ctx[d] == c && u->oloop[d] == l && runs_with(u, d, o, l);
		}
	}
	return *k;
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
	uint8_t c = u->ctx[on];
	if (dist && l >= 0 && u->oloop[on] == l && body_dep(u, o, c, l))
		return;
	const rdeps *q = op_deps(u, o);
	uint32_t at = u->pos[on];
	ts_id ron = s->op[on].region;
	uint32_t same = UINT32_MAX; /* the entry of on's region and dist */
	for (uint32_t k = 0; k < q->n[c]; k++) {
		const rdep *x = &q->e[c][k];
		if (x->dist != dist)
			continue;
		if (x->rg == ron)
			same = k;
		if (x->pos >= at && !ts_excl_regions(&u->excl, x->rg, ron, x->op, on))
			return;
	}
	if (p->ndep >= TS_MAX_DEPS - 1) /* the verifier reports the unordered pair */
		return;
	ts_add_dep(u->s, o, on, dist);
	dep_put(u, &u->deps[o], c, on, dist, same);
	int8_t *k = &u->bdep[(size_t)o * TCP_NCTX + c];
	if (!dist && *k == 0 && l >= 0 && u->oloop[on] == l && runs_with(u, on, o, l))
		*k = 1;
}

/* Run b (the later) waits for run a: per context of b, its first access
 * (when it writes or a writes on that other context) and its first write. */
static void order_runs(ru *u, const rrun *a, const rrun *b, int dist)
{
	unsigned aany, awr, bany, bwr;
	if (a->buf != TS_NONE) {
		const rpicks *p = buf_picks(u, a->buf);
		aany = p->any, awr = p->wr;
	} else
		run_ctxs(a->r, a->n, &aany, &awr);
	if (b->buf != TS_NONE) {
		const rpicks *p = buf_picks(u, b->buf);
		bany = p->any, bwr = p->wr;
	} else
		run_ctxs(b->r, b->n, &bany, &bwr);
	for (int cb = 0; cb < TCP_NCTX; cb++) {
		if (!(bany >> cb & 1) || !(aany & ~(1u << cb)))
			continue;
		ts_id fbuf[RU_ALT], wbuf[RU_ALT], wr[RU_ALT];
		int nf, nw = 0;
		const ts_id *first = run_pick(u, b, RU_FIRST, cb, fbuf, &nf);
		const ts_id *w = bwr >> cb & 1 ? run_pick(u, b, RU_WRITE, cb, wbuf, &nw) : wbuf;
		/* fw[j]: first[j] writes (its edge is taken whatever a does); a
		 * first write that is some case's first access already has it */
		bool fw[RU_ALT];
		for (int j = 0; j < nf; j++) {
			fw[j] = false;
			for (uint32_t k = 0; k < b->n && !fw[j]; k++)
				fw[j] = b->r[k].op == first[j] && b->r[k].write;
		}
		int nw2 = 0;
		for (int j = 0; j < nw; j++) {
			bool seen = false;
			for (int f = 0; f < nf && !seen; f++)
				seen = first[f] == w[j];
			if (!seen)
				wr[nw2++] = w[j];
		}
		for (int ca = 0; ca < TCP_NCTX; ca++) {
			if (ca == cb || !(aany >> ca & 1))
				continue;
			ts_id lbuf[RU_ALT];
			int nl;
			const ts_id *last = run_pick(u, a, RU_LAST, ca, lbuf, &nl);
			bool aw = awr >> ca & 1;
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

/* The buffer whose accesses are exactly r[0..n), else TS_NONE. */
static ts_id whole(ru *u, const racc *r, uint32_t n)
{
	ts_id b = n ? u->acc_buf[r - u->acc] : TS_NONE;
	return b != TS_NONE && u->start[b] == (uint32_t)(r - u->acc) && u->start[b + 1] - u->start[b] == n ? b : TS_NONE;
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
			order_runs(u, &(rrun){prev, np, whole(u, prev, np)}, &(rrun){r, n, whole(u, r, n)}, 0);
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
			order_runs(u, &(rrun){prev, np, whole(u, prev, np)}, &(rrun){first, nfirst, whole(u, first, nfirst)}, 1);
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
	u.ctx = ctx_alloc(s->ctx, s->nop + 1);
	u.oloop = ctx_alloc(s->ctx, s->nop + 1);
	for (ts_id o = 0; o < s->nop; o++) {
		u.ctx[o] = s->op[o].ctx;
		u.oloop[o] = region_loop(&u, s->op[o].region, 0);
	}
	ts_excl_init(&u.excl, s);
	u.bdep = ctx_alloc(s->ctx, (size_t)(s->nop + 1) * TCP_NCTX);
	memset(u.bdep, -1, (size_t)(s->nop + 1) * TCP_NCTX);
	u.deps = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *u.deps);
	u.mark = ctx_alloc(s->ctx, ((size_t)s->nrg + 1) * 2 * TCP_NCTX * sizeof *u.mark);
	u.mat = ctx_alloc(s->ctx, ((size_t)s->nrg + 1) * 2 * TCP_NCTX * sizeof *u.mat);
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
	u.picks = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *u.picks);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = i + 1; j < n && P[j].space == P[i].space && P[j].lo <= P[i].hi; j++)
			if (!(P[i].s1 < P[j].s0 || P[j].s1 < P[i].s0))
				order_pair(&u, P[i].buf, P[j].buf);
	for (ts_id o = 0; o < s->nop; o++)
		for (int c = 0; c < TCP_NCTX; c++)
			if (u.deps[o].e[c])
				ctx_free(s->ctx, u.deps[o].e[c], 0);
	for (ts_id b = 0; b < s->nbuf; b++)
		if (u.picks[b].ids)
			ctx_free(s->ctx, u.picks[b].ids, 0);
	void *blocks[] = {u.pos, u.rloop, u.start, u.acc, P, u.ctx, u.oloop, u.acc_buf, u.picks, u.bdep, u.deps, u.mark, u.mat};
	for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++)
		ctx_free(s->ctx, blocks[k], 0);
	ts_excl_free(&u.excl);
}

void ts_reuse_edges(tcp_sched *s)
{
	reuse_edges(s);
}
