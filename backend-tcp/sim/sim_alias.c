/* backend-tcp/sim/sim_alias.c: tensors of one on-chip space that share
 * per-slice bytes (docs/tcp-isa.md section 2). The simulator keeps each
 * tensor's values apart; this file maps an access to the per-slice bytes it
 * touches, orders accesses of aliasing tensors by those bytes (with
 * moe_tcp_run_opts.order_bytes) and faults on a read of bytes that an
 * aliasing tensor overwrote after the reader's own last write to them. */
#include "backend-tcp/sim/sim_int.h"

static int64_t lo_of(const tcp_tensor *t)
{
	return t->addr;
}

static int64_t hi_of(const tcp_tensor *t)
{
	return t->addr + (t->slice_bytes > 0 ? t->slice_bytes : 1) - 1;
}

typedef struct {
	int64_t lo;
	int32_t t;
} by_lo;

static int cmp_lo(const void *a, const void *b)
{
	const by_lo *x = a, *y = b;
	return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : x->t - y->t;
}

/* Two passes over the tensors of each space sorted by address: count, then
 * fill. A tensor's aliases are those of its space whose regions overlap its
 * own; a tensor with slice_bytes 0 holds no bytes and aliases nothing. */
bool tcps_alias_setup(sim *s)
{
	const tcp_program *p = s->p;
	uint32_t nt = p->nt;
	by_lo *ord = ctx_try_alloc(s->ctx, (nt + 1) * sizeof *ord);
	int64_t *cnt = ctx_try_alloc(s->ctx, (nt + 1) * sizeof *cnt);
	s->alo = ctx_try_alloc(s->ctx, (nt + 2) * sizeof *s->alo);
	bool ok = ord && cnt && s->alo;
	for (uint32_t i = 0; ok && i <= nt; i++)
		s->hz[i].last_wseq = -1;
	for (int pass = 0; ok && pass < 2; pass++) {
		for (int sp = TCP_DM; sp < TCP_NSPACE; sp++) {
			uint32_t n = 0;
			for (uint32_t i = 0; i < nt; i++)
				if (p->t[i].space == sp && p->t[i].slice_bytes > 0)
					ord[n++] = (by_lo){p->t[i].addr, (int32_t)i};
			qsort(ord, n, sizeof *ord, cmp_lo);
			for (uint32_t i = 0; i < n; i++) {
				const tcp_tensor *a = &p->t[ord[i].t];
				for (uint32_t j = i + 1; j < n && ord[j].lo <= hi_of(a); j++) {
					int32_t x = ord[i].t, y = ord[j].t;
					if (pass == 0) {
						cnt[x]++, cnt[y]++;
					} else {
						s->al[s->alo[x] + cnt[x]++] = y;
						s->al[s->alo[y] + cnt[y]++] = x;
					}
				}
			}
		}
		if (pass == 0) {
			int64_t tot = 0;
			for (uint32_t i = 0; i <= nt; i++) {
				if (tot > INT32_MAX - cnt[i]) {
					ok = false;
					break;
				}
				s->alo[i] = (int32_t)tot;
				tot += cnt[i];
				cnt[i] = 0;
			}
			s->alo[nt + 1] = (int32_t)tot;
			s->al = ok ? ctx_try_alloc(s->ctx, ((size_t)tot + 1) * sizeof *s->al) : NULL;
			ok = ok && s->al;
		}
	}
	ctx_free(s->ctx, ord, 0);
	ctx_free(s->ctx, cnt, 0);
	if (!ok) {
		moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: out of memory for the simulator's alias sets");
		tcps_alias_free(s);
	}
	return ok;
}

void tcps_alias_free(sim *s)
{
	ctx_free(s->ctx, s->alo, 0);
	ctx_free(s->ctx, s->al, 0);
	s->alo = s->al = NULL;
}

/* Byte b of the tensor's flat bytes lies in unit i = b / u, held at per-slice
 * offset addr + (i / G) u + b mod u (docs/tcp-isa.md section 1). Units of one
 * row i / G sit at the same offsets on different slices, so the lowest offset
 * is unit i0's byte unless a later unit of its row is touched too (then the
 * row's first byte), and likewise the highest. */
void tcps_byte_span(const sim *s, int32_t t, int64_t lo, int64_t hi, int64_t *blo, int64_t *bhi)
{
	const tcp_tensor *T = &s->p->t[t];
	int64_t esz = esz_of(s, t), u = tcp_layout_unit(s->m, T), G = tcp_layout_group(s->m, T);
	int64_t b0 = lo * esz, b1 = hi * esz + esz - 1, i0 = b0 / u, i1 = b1 / u;
	*blo = T->addr + i0 / G * u + (i0 < i1 && (i0 + 1) / G == i0 / G ? 0 : b0 % u);
	*bhi = T->addr + i1 / G * u + (i1 > i0 && (i1 - 1) / G == i1 / G ? u - 1 : b1 % u);
}

int64_t tcps_alias_wait(const sim *s, int32_t t, int64_t blo, int64_t bhi, bool write, evref *ev, int64_t start)
{
	for (int32_t k = s->alo[t]; k < s->alo[t + 1]; k++) {
		int32_t x = s->al[k];
		const haz *h = &s->hz[x];
		if (h->last_end <= start)
			continue;
		const tcp_tensor *X = &s->p->t[x];
		if (bhi < lo_of(X) || blo > hi_of(X))
			continue;
		/* the floor summarises evicted accesses anywhere in x's bytes */
		if (h->floor_w > start)
			start = h->floor_w, *ev = h->floor_w_ev;
		if (write && h->floor_r > start)
			start = h->floor_r, *ev = h->floor_r_ev;
		for (int i = 0; i < h->n; i++) {
			const haz_rec *r = &h->r[i];
			if (r->end <= start || r->bhi < blo || r->blo > bhi || (!write && !r->write))
				continue;
			start = r->end, *ev = r->ev;
		}
	}
	return start;
}

/* The seq of t's last recorded write overlapping [lo, hi], -1: none. */
static int64_t last_write(const haz *h, int64_t lo, int64_t hi)
{
	int64_t q = -1;
	for (int i = 0; i < h->n; i++)
		if (h->r[i].write && h->r[i].blo <= hi && lo <= h->r[i].bhi && h->r[i].seq > q)
			q = h->r[i].seq;
	return q;
}

/* Only writes still recorded are compared (an evicted one is not seen: the
 * check may miss a clobber, never reports one that did not happen). */
bool tcps_alias_read_ok(sim *s, uint32_t pc, int32_t t, int64_t blo, int64_t bhi)
{
	const haz *ht = &s->hz[t];
	if (ht->last_wseq < 0)
		return true;
	int64_t first = INT64_MAX;
	for (int i = 0; i < ht->n; i++)
		if (ht->r[i].write && ht->r[i].blo <= bhi && blo <= ht->r[i].bhi && ht->r[i].seq < first)
			first = ht->r[i].seq;
	if (first == INT64_MAX)
		return true;
	for (int32_t k = s->alo[t]; k < s->alo[t + 1]; k++) {
		const haz *h = &s->hz[s->al[k]];
		if (h->last_wseq <= first)
			continue;
		for (int i = 0; i < h->n; i++) {
			const haz_rec *r = &h->r[i];
			if (!r->write || r->seq <= first || r->bhi < blo || r->blo > bhi)
				continue;
			int64_t lo = r->blo > blo ? r->blo : blo, hi = r->bhi < bhi ? r->bhi : bhi;
			int64_t mine = last_write(ht, lo, hi);
			if (mine < 0 || mine > r->seq)
				continue;
			const tcp_tensor *T = &s->p->t[t], *W = &s->p->t[s->al[k]];
			FAULT(s, pc,
				"reads %s tensor '%s' at per-slice bytes [%lld, %lld], which tensor '%s' overwrote at "
				"instruction %u (%s) after '%s' last wrote them: the value read is destroyed",
				T->space == TCP_DM ? "DM" : T->space == TCP_TRF ? "TRF" : "VRF", T->name, (long long)lo,
				(long long)hi, W->name, (unsigned)r->pc, tcp_op_names[s->p->code[r->pc].op], T->name);
			return false;
		}
	}
	return true;
}
