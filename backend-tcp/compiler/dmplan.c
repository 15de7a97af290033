/* The DM planner (dmplan.h): lifetimes by program position, loop buffers
 * from the top of their space down, the others by next fit from offset 0 up
 * (first fit where that overflows),
 * HBM scratch bumped after the bound tensors; the plans of the loop's
 * weights and of the spills' residence, and their price. */
#include <inttypes.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/sched_time.h"

/* A buffer's lifetime [lo, hi] in program positions and its bytes. */
typedef struct life {
	int64_t lo, hi;
} life;

typedef struct walk {
	const tcp_sched *s;
	int64_t pos;
	int64_t *op_pos, *sc_pos; /* per op, per scalar */
	life loop[2], body[2]; /* per loop: its extent, its body's */
} walk;

static void walk_region(walk *w, ts_id r, int depth)
{
	const tcp_sched *s = w->s;
	if (r >= s->nrg || depth > 64)
		return;
	const ts_region *g = &s->rg[r];
	w->pos++;
	if (g->kind == TS_RG_LOOP && g->loop < (uint32_t)s->nloop) {
		const ts_loop *l = &s->loop[g->loop];
		int64_t lo = w->pos;
		walk_region(w, l->prologue, depth + 1);
		int64_t blo = w->pos;
		walk_region(w, l->body, depth + 1);
		w->body[g->loop] = (life){blo, w->pos};
		walk_region(w, l->epilogue, depth + 1);
		w->loop[g->loop] = (life){lo, w->pos};
	}
	for (uint32_t k = 0; k < g->nitem; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_RG)
			walk_region(w, id, depth + 1);
		else if (TS_ITEM_KIND(it) == TS_ITEM_OP && id < s->nop)
			w->op_pos[id] = w->pos++;
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC && id < s->nsc)
			w->sc_pos[id] = w->pos++;
		else
			w->pos++;
	}
	w->pos++;
}

static bool overlaps(life a, life b)
{
	return a.lo <= b.hi && b.lo <= a.hi;
}

/* Whether op `in` reads or writes buffer b through one of its views. */
static bool touches(const tcp_insn *in, ts_id b)
{
	for (int v = 0; v < TCP_NVIEW; v++)
		if (in->v[v].t >= 0 && (ts_id)in->v[v].t == b)
			return true;
	return false;
}

/* The program positions of the ops whose views name buffer b and of the
 * lds reading it, min and max over all of them ({INT64_MAX, INT64_MIN}:
 * none), for every buffer in one pass over the ops and scalars. */
static void touched(const walk *w, life *T)
{
	const tcp_sched *s = w->s;
	for (ts_id b = 0; b < s->nbuf; b++)
		T[b] = (life){INT64_MAX, INT64_MIN};
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		int64_t p = w->op_pos[o];
		for (int v = 0; v < TCP_NVIEW; v++)
			if (in->v[v].t >= 0 && (ts_id)in->v[v].t < s->nbuf) {
				life *L = &T[in->v[v].t];
				L->lo = p < L->lo ? p : L->lo;
				L->hi = p > L->hi ? p : L->hi;
			}
	}
	for (ts_id c = 0; c < s->nsc; c++) /* an ld reads the buffer's element when it runs */
		if (s->sc[c].kind == TS_SC_SPM_LD && s->sc[c].buf < s->nbuf) {
			int64_t p = w->sc_pos[c];
			life *L = &T[s->sc[c].buf];
			L->lo = p < L->lo ? p : L->lo;
			L->hi = p > L->hi ? p : L->hi;
		}
}

/* The lifetime of buffer b: by its kind (docs/tcp-compiler.md 5.3; a loop or
 * block buffer: the extent of every loop), widened to every op touching it
 * (T: touched()'s range) and to the whole of any loop it is live in part
 * of, unless it lies inside the loop's body (a value live into or out of a
 * body is live across all its blocks). */
static life lifetime(const walk *w, ts_id b, life T)
{
	const tcp_sched *s = w->s;
	const ts_buf *u = &s->buf[b];
	life L = {INT64_MAX, INT64_MIN};
	if (u->life == TS_LIFE_PROGRAM)
		L = (life){0, w->pos};
	else if (u->life == TS_LIFE_SPAN && u->first < s->nop && u->last < s->nop)
		L = (life){w->op_pos[u->first], w->op_pos[u->last]};
	L.lo = T.lo < L.lo ? T.lo : L.lo;
	L.hi = T.hi > L.hi ? T.hi : L.hi;
	/* as the verifier has it: a loop or block buffer is live across every loop */
	for (int k = 0; k < s->nloop && (u->life == TS_LIFE_LOOP || u->life == TS_LIFE_BLOCK); k++) {
		L.lo = w->loop[k].lo < L.lo ? w->loop[k].lo : L.lo;
		L.hi = w->loop[k].hi > L.hi ? w->loop[k].hi : L.hi;
	}
	if (L.lo > L.hi) /* touched by nothing: live nowhere, placed anyway */
		L = (life){0, 0};
	for (int k = 0; k < s->nloop; k++) {
		life l = w->loop[k], bd = w->body[k];
		if (overlaps(L, l) && !(L.lo >= bd.lo && L.hi <= bd.hi)) {
			L.lo = l.lo < L.lo ? l.lo : L.lo;
			L.hi = l.hi > L.hi ? l.hi : L.hi;
		}
	}
	return L;
}

static int64_t cap_of(const moe_tcp_machine *m, int space)
{
	return space == TCP_DM ? m->dm_bytes_per_slice : space == TCP_TRF ? tcp_trf_bytes(m) : m->vrf_bytes_per_slice;
}

static int64_t align_of(const moe_tcp_machine *m, int space)
{
	int64_t a = m->flit_bytes > 0 ? m->flit_bytes : 32;
	return space == TCP_DM && m->dm_align > a ? m->dm_align : a;
}

typedef struct plan {
	tcp_sched *s;
	life *L;
	bool *placed;
	const int64_t *foot; /* per buffer: its footprint when trying a weights mode (-1: absent); NULL: its layout's */
	life *hole;          /* per buffer: positions strictly inside are free (a spilled value); lo >= hi: none */
	bool quiet;          /* no diagnostic on overflow */
	bool trial;          /* a plan's trial: buffer order only (place_chip) */
	bool spread;         /* from 0 up: next fit from the end of the last buffer so placed (place_one) */
	int64_t cursor[TCP_NSPACE];
	int64_t (*iv)[2];    /* place_one's scratch: one byte range per buffer */
} plan;

static bool in_hole(const plan *P, ts_id b, life x)
{
	return P->hole && P->hole[b].lo < P->hole[b].hi && P->hole[b].lo < x.lo && x.hi < P->hole[b].hi;
}

/* Whether buffers b and j are live at one position. */
static bool live_together(const plan *P, ts_id b, ts_id j)
{
	life a = P->L[b], c = P->L[j];
	if (!overlaps(a, c))
		return false;
	life x = {a.lo > c.lo ? a.lo : c.lo, a.hi < c.hi ? a.hi : c.hi};
	return !in_hole(P, b, x) && !in_hole(P, j, x);
}

static int64_t foot_of(const plan *P, ts_id b)
{
	return P->foot ? P->foot[b] : P->s->buf[b].layout.slice_bytes;
}

/* Whether placed buffer j may not share bytes with buffer b: both of one
 * space, live together, on common slices. */
static bool rivals(const plan *P, ts_id b, ts_id j)
{
	const ts_buf *u = &P->s->buf[b], *v = &P->s->buf[j];
	if (!P->placed[j] || j == b || v->space != u->space || !live_together(P, b, j))
		return false;
	int64_t ua = u->layout.slice0, ub = ua + (int64_t)u->layout.nslices * u->layout.copies;
	int64_t va = v->layout.slice0, vb = va + (int64_t)v->layout.nslices * v->layout.copies;
	return !(ub <= va || vb <= ua);
}

static int cmp_lo(const void *a, const void *b)
{
	const int64_t *x = a, *y = b;
	return (x[0] > y[0]) - (x[0] < y[0]);
}

static int cmp_hi_desc(const void *a, const void *b)
{
	const int64_t *x = a, *y = b;
	return (x[1] < y[1]) - (x[1] > y[1]);
}

static int cmp_size_desc(const void *a, const void *b)
{
	const int64_t *x = a, *y = b; /* {bytes, id} */
	return x[0] != y[0] ? (x[0] < y[0] ? 1 : -1) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* The DM overflow diagnostic: what b needs and the largest buffers live with it. */
static void overflow(const plan *P, ts_id b, int64_t cap)
{
	static const char *const space[TCP_NSPACE] = {"HBM", "DM", "TRF", "VRF"};
	tcp_sched *s = P->s;
	const ts_buf *u = &s->buf[b];
	int64_t (*live)[2] = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *live), sum = 0;
	uint32_t n = 0;
	for (ts_id j = 0; j < s->nbuf; j++)
		if (P->placed[j] && j != b && s->buf[j].space == u->space && overlaps(P->L[b], P->L[j])) {
			live[n][0] = s->buf[j].layout.slice_bytes;
			live[n++][1] = j;
			sum += s->buf[j].layout.slice_bytes;
		}
	qsort(live, n, sizeof *live, cmp_size_desc);
	char list[512] = "";
	size_t at = 0;
	for (uint32_t k = 0; k < n && k < 4 && at < sizeof list; k++)
		at += (size_t)snprintf(list + at, sizeof list - at, "%s'%s' (%" PRId64 " B)", k ? ", " : "",
			s->buf[live[k][1]].name, live[k][0]);
	moe_loc loc = s->file && s->buf_line ? moe_loc_at(s->ctx, s->file, s->buf_line[b], 1) : moe_loc_none();
	moe_diag(s->ctx, MOE_DIAG_ERROR, loc,
		"%s overflow: buffer %%%u '%s' needs %" PRId64 " bytes per slice beside %" PRId64 " bytes of %u live buffer(s) "
		"(largest: %s), %" PRId64 " bytes per slice in all",
		space[u->space], b, u->name, u->layout.slice_bytes, sum, n, n ? list : "none", cap);
	ctx_free(s->ctx, live, (s->nbuf + 1) * sizeof *live);
}

/* Buffer b at the first offset clear of its rivals: from the top down, or
 * from 0 up. Two buffers on the same bytes are ordered by reuse edges
 * (reuse.c): the later one's first writer waits for the earlier one's last
 * reader on another context, which serializes work that could overlap. So
 * with P->spread the search from 0 up starts where the last buffer so
 * placed ends, wrapping to 0 (next fit): bytes freed by a buffer are taken
 * again only after the rest of the space, by buffers far from it in
 * program order. */
static bool place_one(plan *P, ts_id b, bool top)
{
	tcp_sched *s = P->s;
	ts_buf *u = &s->buf[b];
	int64_t cap = cap_of(s->m, u->space), al = align_of(s->m, u->space), n = foot_of(P, b);
	if (n < 0 || n > cap) {
		if (!P->quiet)
			overflow(P, b, cap);
		return false;
	}
	/* the rivals' byte ranges, swept from 0 up (by start) or from the top
	 * down (by end): the first aligned offset clear of all of them */
	int64_t (*iv)[2] = P->iv;
	uint32_t m = 0;
	for (ts_id j = 0; j < s->nbuf; j++)
		if (rivals(P, b, j)) {
			iv[m][0] = s->buf[j].offset;
			iv[m++][1] = s->buf[j].offset + foot_of(P, j);
		}
	qsort(iv, m, sizeof *iv, top ? cmp_hi_desc : cmp_lo);
	int64_t from = !top && P->spread ? P->cursor[u->space] : 0, off = -1;
	for (int pass = from > 0 ? 0 : 1; pass < 2 && (off < 0 || off + n > cap); pass++) {
		off = top ? (cap - n) / al * al : pass ? 0 : (from + al - 1) / al * al;
		for (uint32_t k = 0; k < m && off >= 0 && off + n <= cap; k++) {
			if (top ? iv[k][1] <= off : iv[k][0] >= off + n)
				break; /* this range and every later one clear of [off, off + n) */
			if (top && iv[k][0] < off + n)
				off = iv[k][0] - n < 0 ? -1 : (iv[k][0] - n) / al * al;
			else if (!top && iv[k][1] > off)
				off = (iv[k][1] + al - 1) / al * al;
		}
	}
	if (off < 0 || n > cap || off + n > cap) {
		if (!P->quiet)
			overflow(P, b, cap);
		return false;
	}
	u->offset = off;
	P->placed[b] = true;
	if (!top)
		P->cursor[u->space] = off + n;
	return true;
}

/* A verified buffer's bytes (every slot) fit int64; sums saturate. */
static int64_t hbm_bytes(const ts_buf *u)
{
	int64_t n = (int64_t)moe_dtype_size((moe_dtype)u->dtype) * (u->slots ? u->slots : 1);
	for (int k = 0; k < u->rank; k++)
		n *= u->shape[k];
	return n;
}

static int64_t sat_add(int64_t a, int64_t b)
{
	int64_t r;
	return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t round_up(int64_t a, int64_t g)
{
	return a > INT64_MAX - g ? INT64_MAX : (a + g - 1) / g * g;
}

/* HBM: the bound tensors, then scratch, each after the highest placed byte. */
static bool place_hbm(tcp_sched *s)
{
	int64_t g = s->m->hbm_granule > 0 ? s->m->hbm_granule : 256, top = 0;
	for (ts_id i = 0; i < s->nbuf; i++)
		if (s->buf[i].space == TCP_HBM && s->buf[i].offset >= 0) {
			int64_t e = sat_add(s->buf[i].offset, hbm_bytes(&s->buf[i]));
			top = e > top ? e : top;
		}
	top = round_up(top, g);
	for (int pass = 0; pass < 2; pass++)
		for (ts_id i = 0; i < s->nbuf; i++) {
			ts_buf *u = &s->buf[i];
			if (u->space != TCP_HBM || u->offset >= 0 || (u->kind == TCP_T_SCRATCH) != (pass == 1))
				continue;
			u->offset = top;
			top = round_up(sat_add(top, hbm_bytes(u)), g);
			if ((double)top > s->m->hbm_bytes) {
				u->offset = -1;
				moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(),
					"HBM overflow: buffer %%%u '%s' ends at byte %" PRId64 ", past the %.0f bytes of HBM", i, u->name,
					top, s->m->hbm_bytes);
				return false;
			}
		}
	return true;
}

/* The on-chip buffers not yet placed, in buffer order within each pass:
 * loop and block buffers from the top, then those of the whole program
 * from 0, then the others (spans) from 0, each pass in the order given
 * (`order[k][1]`: buffer ids); a buffer whose footprint is -1 is skipped. */
static bool place_order(plan *P, const int64_t (*order)[2], uint32_t n)
{
	tcp_sched *s = P->s;
	bool ok = true;
	for (int pass = 0; pass < 3 && ok; pass++)
		for (uint32_t k = 0; k < n && ok; k++) {
			ts_id i = (ts_id)order[k][1];
			const ts_buf *u = &s->buf[i];
			bool looped = u->life == TS_LIFE_LOOP || u->life == TS_LIFE_BLOCK;
			int want = looped ? 0 : u->life == TS_LIFE_PROGRAM ? 1 : 2;
			if (u->space != TCP_HBM && u->offset < 0 && want == pass && foot_of(P, i) >= 0)
				ok = place_one(P, i, looped);
		}
	return ok;
}

/* The longest-lived first, then the largest: a value made before the loop
 * and read after it takes its bytes before the tail's passes, which first
 * fit would otherwise spread over every gap the loop leaves. */
static int64_t span_key(const plan *P, ts_id b)
{
	int64_t len = P->L[b].hi - P->L[b].lo, foot = foot_of(P, b);
	foot = foot < 0 ? 0 : foot < (1 << 24) ? foot : (1 << 24) - 1;
	return len > (INT64_MAX >> 24) ? INT64_MAX : len << 24 | foot;
}

/* Buffer order first. When that overflows (outside a plan's trial, whose
 * verdicts stay those of buffer order), the spans largest first (a long
 * value that row chunks write part by part, made after the chunks' first
 * buffers, then finds its bytes in one piece), then the spans longest-lived
 * first (span_key), and when that too overflows, buffer order again for the
 * diagnostic. */
static bool place_chip(plan *P)
{
	tcp_sched *s = P->s;
	int64_t (*order)[2] = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *order), *off0 = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *off0);
	bool *placed0 = ctx_alloc(s->ctx, s->nbuf + 1), quiet = P->quiet;
	for (ts_id i = 0; i < s->nbuf; i++) {
		order[i][0] = 0;
		order[i][1] = i;
		off0[i] = s->buf[i].offset;
		placed0[i] = P->placed[i];
	}
	bool ok = false;
	if (!P->trial) { /* spread first (place_one); first fit where that overflows */
		P->quiet = true;
		P->spread = true;
		memset(P->cursor, 0, sizeof P->cursor);
		ok = place_order(P, (const int64_t(*)[2])order, s->nbuf);
		P->spread = false;
	}
	if (!ok) {
		for (ts_id i = 0; i < s->nbuf; i++)
			s->buf[i].offset = off0[i], P->placed[i] = placed0[i];
		P->quiet = quiet || !P->trial;
		ok = place_order(P, (const int64_t(*)[2])order, s->nbuf);
	}
	for (int t = 0; t < 3 && !ok && !P->trial; t++) {
		for (ts_id i = 0; i < s->nbuf; i++) {
			s->buf[i].offset = off0[i];
			P->placed[i] = placed0[i];
			order[i][0] = t == 0 ? foot_of(P, i) : t == 1 ? span_key(P, i) : 0;
			order[i][1] = i;
		}
		if (t < 2)
			qsort(order, s->nbuf, sizeof *order, cmp_size_desc);
		P->quiet = t < 2 || quiet;
		ok = place_order(P, (const int64_t(*)[2])order, s->nbuf);
	}
	P->quiet = quiet;
	ctx_free(s->ctx, order, (s->nbuf + 1) * sizeof *order);
	ctx_free(s->ctx, off0, (s->nbuf + 1) * sizeof *off0);
	ctx_free(s->ctx, placed0, s->nbuf + 1);
	return ok;
}

typedef struct planner {
	walk w;
	plan P;
} planner;

static bool planner_new(tcp_sched *s, planner *q)
{
	if (!s->m) {
		moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "placement needs a machine");
		return false;
	}
	q->w = (walk){s, 0, ctx_alloc(s->ctx, (s->nop + 1) * sizeof(int64_t)),
		ctx_alloc(s->ctx, (s->nsc + 1) * sizeof(int64_t)), {{0, 0}, {0, 0}}, {{0, 0}, {0, 0}}};
	if (s->top < s->nrg)
		walk_region(&q->w, s->top, 0);
	q->P = (plan){s, ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof(life)), ctx_alloc(s->ctx, s->nbuf + 1), NULL, NULL, false, false, false, {0},
		ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *q->P.iv)};
	life *T = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *T);
	touched(&q->w, T);
	for (ts_id i = 0; i < s->nbuf; i++) {
		q->P.L[i] = lifetime(&q->w, i, T[i]);
		q->P.placed[i] = s->buf[i].space != TCP_HBM && s->buf[i].offset >= 0;
	}
	ctx_free(s->ctx, T, (s->nbuf + 1) * sizeof *T);
	return true;
}

static void planner_free(planner *q)
{
	tcp_sched *s = q->P.s;
	ctx_free(s->ctx, q->w.op_pos, (s->nop + 1) * sizeof(int64_t));
	ctx_free(s->ctx, q->w.sc_pos, (s->nsc + 1) * sizeof(int64_t));
	ctx_free(s->ctx, q->P.L, (s->nbuf + 1) * sizeof(life));
	ctx_free(s->ctx, q->P.placed, s->nbuf + 1);
	ctx_free(s->ctx, q->P.iv, (s->nbuf + 1) * sizeof *q->P.iv);
}

static moe_status place(tcp_sched *s)
{
	planner q;
	if (!planner_new(s, &q))
		return MOE_ERR_INVALID;
	bool ok = place_hbm(s) && place_chip(&q.P);
	planner_free(&q);
	if (ok && s->reuse == TS_REUSE_ORDERED)
		ts_reuse_edges(s);
	return ok ? MOE_OK : MOE_ERR_INVALID;
}

moe_status tcp_dm_place(tcp_sched *s)
{
	CTX_GUARDED(s->ctx, moe_status, MOE_ERR_NOMEM, place(s));
}

/* bytes spread flit by flit over n slices */
static int64_t spread(const moe_tcp_machine *m, int64_t bytes, int64_t n)
{
	int64_t f = m->flit_bytes > 0 ? m->flit_bytes : 32;
	n = n > 0 ? n : 1;
	return bytes <= 0 ? f : ((bytes + n - 1) / n + f - 1) / f * f;
}

/* The position of the first op after position a that touches buffer b
 * (its next reader once spilled), or a when none. */
static int64_t next_touch(const walk *w, ts_id b, int64_t a)
{
	const tcp_sched *s = w->s;
	int64_t r = INT64_MAX;
	for (ts_id o = 0; o < s->nop; o++)
		if (w->op_pos[o] > a && w->op_pos[o] < r && touches(&s->op[o].in, b))
			r = w->op_pos[o];
	return r == INT64_MAX ? a : r;
}

/* The footprints of plan w: the weights' (ring tiles when streamed), each
 * staged gather's staging where it is kept in HBM, and each spilled
 * value's hole (its bytes free between its producer and its next reader). */
static void footprints(const planner *q, const ts_wdemand *d, const ts_wplan *w, int64_t *foot, life *hole)
{
	const tcp_sched *s = q->P.s;
	for (ts_id i = 0; i < s->nbuf; i++)
		hole[i] = (life){0, 0};
	for (uint32_t k = 0; k < d->nspill && k < TS_MAX_SPILLS; k++) {
		const ts_spill *sp = &d->spill[k];
		if (w->hbm[k] && sp->buf < s->nbuf && sp->prod != TS_NONE && sp->prod < s->nop) {
			int64_t a = q->w.op_pos[sp->prod];
			hole[sp->buf] = (life){a + 1, next_touch(&q->w, sp->buf, a)};
		}
	}
	for (ts_id i = 0; i < s->nbuf; i++)
		foot[i] = s->buf[i].layout.slice_bytes;
	bool ringed = false;
	for (uint32_t k = 0; k < d->n; k++) {
		const ts_buf *u = &s->buf[d->buf[k]];
		int64_t one = spread(s->m, hbm_bytes(u) / (u->slots ? u->slots : 1), u->layout.nslices);
		if (w->mode == TS_W_SINGLE || (w->mode == TS_W_STREAM && !d->stream[k]))
			foot[d->buf[k]] = one;
		else if (w->mode == TS_W_STREAM) { /* the ring in the first streamed buffer's place */
			foot[d->buf[k]] = ringed ? -1 : spread(s->m, w->ring * d->tile_bytes, u->layout.nslices);
			ringed = true;
		}
	}
	for (uint32_t k = 0; k < d->nspill && k < TS_MAX_SPILLS; k++)
		if (w->hbm[k] && d->spill[k].buf < s->nbuf && d->spill[k].prod == TS_NONE)
			foot[d->spill[k].buf] = d->spill[k].stage;
}

/* Whether every on-chip buffer fits with plan w's footprints; the
 * schedule's offsets are restored. */
static bool fits(planner *q, const ts_wdemand *d, const ts_wplan *w, int64_t *foot)
{
	tcp_sched *s = q->P.s;
	life *hole = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *hole);
	footprints(q, d, w, foot, hole);
	q->P.hole = hole;
	int64_t *off = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *off);
	bool *was = ctx_alloc(s->ctx, s->nbuf + 1);
	for (ts_id i = 0; i < s->nbuf; i++)
		off[i] = s->buf[i].offset, was[i] = q->P.placed[i];
	q->P.foot = foot;
	q->P.quiet = true;
	q->P.trial = true;
	bool ok = place_chip(&q->P);
	q->P.foot = NULL;
	q->P.hole = NULL;
	q->P.quiet = false;
	q->P.trial = false;
	ctx_free(s->ctx, hole, (s->nbuf + 1) * sizeof *hole);
	for (ts_id i = 0; i < s->nbuf; i++)
		s->buf[i].offset = off[i], q->P.placed[i] = was[i];
	ctx_free(s->ctx, off, (s->nbuf + 1) * sizeof *off);
	ctx_free(s->ctx, was, s->nbuf + 1);
	return ok;
}

/* The cycles a spill's HBM residence adds: its round trip's bytes at the
 * machine's HBM rate. */
static int64_t benefit(const moe_tcp_machine *m, const ts_spill *sp)
{
	double bpc = m->hbm_bytes_per_s > 0 && m->clock_hz > 0 ? m->hbm_bytes_per_s / m->clock_hz : 1.0;
	double c = (double)sp->extra / bpc;
	return c > 9e18 ? INT64_MAX : (int64_t)c;
}

/* Plan w's residences, its mandatory set (every spill in HBM) fitting:
 * the spills by benefit, largest first, each moved into DM if it fits. */
static void residences(planner *q, const ts_wdemand *d, ts_wplan *w, int64_t *foot)
{
	const tcp_sched *s = q->P.s;
	uint32_t order[TS_MAX_SPILLS], n = d->nspill < TS_MAX_SPILLS ? d->nspill : TS_MAX_SPILLS;
	int64_t ben[TS_MAX_SPILLS];
	for (uint32_t k = 0; k < n; k++) {
		order[k] = k;
		ben[k] = benefit(s->m, &d->spill[k]);
	}
	for (uint32_t a = 1; a < n; a++) /* insertion sort: benefit down, build order on ties */
		for (uint32_t b = a; b > 0 && ben[order[b]] > ben[order[b - 1]]; b--) {
			uint32_t t = order[b];
			order[b] = order[b - 1];
			order[b - 1] = t;
		}
	for (uint32_t k = 0; k < n; k++) {
		w->hbm[order[k]] = false;
		if (!fits(q, d, w, foot))
			w->hbm[order[k]] = true;
	}
}

static uint32_t plans(tcp_sched *s, const ts_wdemand *d, ts_wplan out[TS_MAX_PLANS])
{
	memset(out, 0, TS_MAX_PLANS * sizeof *out);
	planner q;
	if (!planner_new(s, &q)) {
		out[0].mode = TS_W_DOUBLE;
		return 0;
	}
	bool any = false;
	for (uint32_t k = 0; k < d->n; k++)
		any |= d->stream[k];
	int64_t *foot = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *foot);
	static const int order[5][2] = {{TS_W_DOUBLE, 0}, {TS_W_SINGLE, 0}, {TS_W_STREAM, TS_MAX_RING},
		{TS_W_STREAM, 4}, {TS_W_STREAM, 2}};
	uint32_t n = 0;
	bool whole = false, ring4 = false; /* a plan with whole experts, with a ring of at least four */
	for (int k = 0; k < 5; k++) {
		if (order[k][0] == TS_W_STREAM && !(any && d->tile_bytes > 0))
			continue;
		if (order[k][0] == TS_W_STREAM ? order[k][1] == 2 && ring4 : whole)
			continue; /* single only when double does not fit, ring 2 only when ring 4 does not */
		if (!d->n && k > 0)
			break; /* no loop weights: one plan */
		ts_wplan w;
		memset(&w, 0, sizeof w);
		w.mode = (uint8_t)order[k][0];
		w.ring = (uint8_t)order[k][1];
		for (uint32_t j = 0; j < d->nspill && j < TS_MAX_SPILLS; j++)
			w.hbm[j] = true;
		if (!fits(&q, d, &w, foot))
			continue;
		residences(&q, d, &w, foot);
		out[n++] = w;
		whole |= w.mode != TS_W_STREAM;
		ring4 |= w.mode == TS_W_STREAM && w.ring >= 4;
	}
	if (!n) {
		for (uint32_t j = 0; j < d->nspill && j < TS_MAX_SPILLS; j++)
			out[0].hbm[j] = true;
		out[0].mode = any && d->tile_bytes > 0 ? TS_W_STREAM : d->n ? TS_W_SINGLE : TS_W_DOUBLE;
		out[0].ring = out[0].mode == TS_W_STREAM ? 2 : 0;
	}
	ctx_free(s->ctx, foot, (s->nbuf + 1) * sizeof *foot);
	planner_free(&q);
	return n;
}

uint32_t tcp_dm_plans(tcp_sched *s, const ts_wdemand *d, ts_wplan out[TS_MAX_PLANS])
{
	CTX_GUARDED(s->ctx, uint32_t, 0, plans(s, d, out));
}

/* A quiet placement trial that leaves every offset as it was: -1 when the
 * buffers do not fit, else 0; placed, it predicts the cycles on each of the
 * n loads (NULL: the expected ones) into cy and returns the first. */
static int64_t trial_on(tcp_sched *s, const moe_tcp_loads *const *loads, int n, int64_t *cy)
{
	planner q;
	if (!planner_new(s, &q))
		return -1;
	int64_t *off = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *off);
	for (ts_id i = 0; i < s->nbuf; i++)
		off[i] = s->buf[i].offset;
	q.P.quiet = true;
	bool ok = place_hbm(s) && place_chip(&q.P);
	planner_free(&q);
	uint8_t reuse = s->reuse; /* priced as the chip runs it: shared bytes taken in turn */
	s->reuse = TS_REUSE_ORDERED;
	for (int k = 0; ok && k < n; k++)
		cy[k] = tcp_sched_predict(s->ctx, s, loads[k], NULL);
	s->reuse = reuse;
	for (ts_id i = 0; i < s->nbuf; i++)
		s->buf[i].offset = off[i];
	ctx_free(s->ctx, off, (s->nbuf + 1) * sizeof *off);
	return !ok ? -1 : n > 0 ? cy[0] : 0;
}

static int64_t trial(tcp_sched *s, bool predict)
{
	const moe_tcp_loads *expected = NULL;
	int64_t cy;
	return trial_on(s, &expected, predict ? 1 : 0, &cy);
}

static int64_t price(tcp_sched *s)
{
	return trial(s, true);
}

static bool placeable(tcp_sched *s)
{
	return trial(s, false) >= 0;
}

bool tcp_dm_placeable(tcp_sched *s)
{
	CTX_GUARDED(s->ctx, bool, false, placeable(s));
}

int64_t tcp_dm_price(tcp_sched *s)
{
	CTX_GUARDED(s->ctx, int64_t, -1, price(s));
}

int64_t tcp_dm_price_loads(tcp_sched *s, const moe_tcp_loads *const *loads, int n, int64_t *cycles)
{
	CTX_GUARDED(s->ctx, int64_t, -1, trial_on(s, loads, n, cycles));
}

bool tcp_dm_fits(const moe_tcp_machine *m, const ts_demand *d)
{
	if (!m || !d || d->n > TS_MAX_DEMAND)
		return false;
	int64_t S = tcp_slices(m), a = align_of(m, TCP_DM), top = cap_of(m, TCP_DM);
	for (uint32_t k = 0; k < d->n && top >= 0; k++) {
		int64_t b;
		if (d->bytes[k] < 0 || __builtin_mul_overflow(d->bytes[k], (int64_t)(d->slots[k] ? d->slots[k] : 1), &b) ||
			b / S > top)
			return false;
		top -= round_up(spread(m, b, S), a);
	}
	return top >= 0 && (d->span <= 0 || round_up(d->span, a) <= top);
}

/* The reservation graph passes decide by (dmplan.h): the loop's experts
 * take one share of DM in LOOP_SHARES, double-buffered whole (two experts
 * held whole); the rest is split
 * among SPAN_VALUES values live beside the loop (routing's, the tail's, a
 * block's paired value). Every decision the graph passes made by their own
 * fractions before is kept: the experts' half, each value's eighth. */
enum { LOOP_SHARES = 2, SPAN_VALUES = 4 };

int64_t tcp_dm_grant(const moe_tcp_machine *m, tcp_dm_ask ask)
{
	int64_t dm = cap_of(m, TCP_DM) * tcp_slices(m), share = dm / LOOP_SHARES;
	int64_t value = share * (LOOP_SHARES - 1) / SPAN_VALUES;
	switch (ask) {
	case TCP_DM_EXPERTS: return share;
	case TCP_DM_VALUE: return value;
	case TCP_DM_BLOCK:
	case TCP_DM_COMBINE: return dm - share;
	case TCP_DM_WIDE_BLOCK: return 2 * value;
	case TCP_DM_ROOMY: return share + 2 * value;
	case TCP_DM_PARTIALS: return dm / 3;
	default: return dm;
	}
}

int64_t tcp_space_bytes(const moe_tcp_machine *m, int sp)
{
	return cap_of(m, sp);
}

void tcp_dm_spread_side(const moe_tcp_machine *m, tcp_dma_load *c)
{
	int64_t dpc = tcp_dmns_per_cluster(m);
	c->dmns = m->clusters * dpc;
	c->pairs = m->clusters * ((dpc + 1) / 2); /* a cluster's DMNs pair up, an odd last one alone */
	for (int s = 0; s < 2; s++)
		c->clo[s] = 0, c->chi[s] = m->clusters - 1;
}
