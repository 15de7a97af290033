/* The DM planner's first placement (dmplan.h): lifetimes by program
 * position, loop buffers from the top of their space down, the others first
 * fit from offset 0 up, HBM scratch bumped after the bound tensors. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"

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

/* The lifetime of buffer b: by its kind (docs/tcp-compiler.md 5.3; a loop or
 * block buffer: the extent of every loop), widened to every op touching it
 * and to the whole of any loop it is live in part of, unless it lies inside
 * the loop's body (a value live into or out of a body is live across all
 * its blocks). */
static life lifetime(const walk *w, ts_id b)
{
	const tcp_sched *s = w->s;
	const ts_buf *u = &s->buf[b];
	life L = {INT64_MAX, INT64_MIN};
	if (u->life == TS_LIFE_PROGRAM)
		L = (life){0, w->pos};
	else if (u->life == TS_LIFE_SPAN && u->first < s->nop && u->last < s->nop)
		L = (life){w->op_pos[u->first], w->op_pos[u->last]};
	for (ts_id o = 0; o < s->nop; o++) {
		if (!touches(&s->op[o].in, b))
			continue;
		int64_t p = w->op_pos[o];
		L.lo = p < L.lo ? p : L.lo;
		L.hi = p > L.hi ? p : L.hi;
	}
	for (ts_id c = 0; c < s->nsc; c++) /* an ld reads the buffer's element when it runs */
		if (s->sc[c].kind == TS_SC_SPM_LD && s->sc[c].buf == b) {
			int64_t p = w->sc_pos[c];
			L.lo = p < L.lo ? p : L.lo;
			L.hi = p > L.hi ? p : L.hi;
		}
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
} plan;

/* Whether placed buffer j conflicts with buffer b at [off, off + n). */
static bool clash(const plan *P, ts_id b, ts_id j, int64_t off, int64_t n)
{
	const ts_buf *u = &P->s->buf[b], *v = &P->s->buf[j];
	if (!P->placed[j] || j == b || v->space != u->space || !overlaps(P->L[b], P->L[j]))
		return false;
	int64_t ua = u->layout.slice0, ub = ua + (int64_t)u->layout.nslices * u->layout.copies;
	int64_t va = v->layout.slice0, vb = va + (int64_t)v->layout.nslices * v->layout.copies;
	if (ub <= va || vb <= ua)
		return false;
	return off < v->offset + v->layout.slice_bytes && v->offset < off + n;
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

/* First fit of buffer b: from the top down or from 0 up. */
static bool place_one(plan *P, ts_id b, bool top)
{
	tcp_sched *s = P->s;
	ts_buf *u = &s->buf[b];
	int64_t cap = cap_of(s->m, u->space), al = align_of(s->m, u->space), n = u->layout.slice_bytes;
	if (n < 0 || n > cap) {
		overflow(P, b, cap);
		return false;
	}
	int64_t off = top ? (cap - n) / al * al : 0;
	for (bool moved = true; moved && off >= 0 && off + n <= cap;) {
		moved = false;
		for (ts_id j = 0; j < s->nbuf && !moved; j++) {
			if (!clash(P, b, j, off, n))
				continue;
			const ts_buf *v = &s->buf[j];
			off = top ? v->offset - n : v->offset + v->layout.slice_bytes;
			off = top ? (off < 0 ? -1 : off / al * al) : (off + al - 1) / al * al;
			moved = true;
		}
	}
	if (off < 0 || n > cap || off + n > cap) {
		overflow(P, b, cap);
		return false;
	}
	u->offset = off;
	P->placed[b] = true;
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

static moe_status place(tcp_sched *s)
{
	if (!s->m) {
		moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "placement needs a machine");
		return MOE_ERR_INVALID;
	}
	walk w = {s, 0, ctx_alloc(s->ctx, (s->nop + 1) * sizeof(int64_t)), ctx_alloc(s->ctx, (s->nsc + 1) * sizeof(int64_t)),
		{{0, 0}, {0, 0}}, {{0, 0}, {0, 0}}};
	if (s->top < s->nrg)
		walk_region(&w, s->top, 0);
	plan P = {s, ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof(life)), ctx_alloc(s->ctx, s->nbuf + 1)};
	for (ts_id i = 0; i < s->nbuf; i++) {
		P.L[i] = lifetime(&w, i);
		P.placed[i] = s->buf[i].space != TCP_HBM && s->buf[i].offset >= 0;
	}
	bool ok = place_hbm(s);
	/* the loop's buffers first, from the top; then the rest from 0 */
	for (int pass = 0; pass < 2 && ok; pass++)
		for (ts_id i = 0; i < s->nbuf && ok; i++) {
			const ts_buf *u = &s->buf[i];
			bool looped = u->life == TS_LIFE_LOOP || u->life == TS_LIFE_BLOCK;
			if (u->space != TCP_HBM && u->offset < 0 && looped == (pass == 0))
				ok = place_one(&P, i, looped);
		}
	ctx_free(s->ctx, w.op_pos, (s->nop + 1) * sizeof(int64_t));
	ctx_free(s->ctx, w.sc_pos, (s->nsc + 1) * sizeof(int64_t));
	ctx_free(s->ctx, P.L, (s->nbuf + 1) * sizeof(life));
	ctx_free(s->ctx, P.placed, s->nbuf + 1);
	return ok ? MOE_OK : MOE_ERR_INVALID;
}

moe_status tcp_dm_place(tcp_sched *s)
{
	CTX_GUARDED(s->ctx, moe_status, MOE_ERR_NOMEM, place(s));
}
