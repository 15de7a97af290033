/* backend-tcp/isa/layout.c: whether a sub-context load reads only bytes that
 * each receiving slice holds (docs/tcp-isa.md sections 1 and 9): the
 * validator's rule for a load without the switch, and the lowering's test
 * for when a load needs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"

/* Whether every slice that holds destination unit qd (of D) holds source
 * unit qs (of T): unit i of a tensor is held by slices i mod G + k G. */
static bool parts_agree(const moe_tcp_machine *m, const tcp_tensor *D, const tcp_tensor *T, int64_t qd, int64_t qs)
{
	int64_t S = tcp_slices(m), Pd = tcp_layout_group(m, D), Ps = tcp_layout_group(m, T);
	for (int64_t k = 0; k < D->copies; k++) {
		int64_t s = qd % Pd + k * Pd;
		if (s >= S)
			break;
		if (s >= Ps * T->copies || s % Ps != qs % Ps)
			return false;
	}
	return true;
}

enum { WALK_CAP = 1 << 22, SEEN_CAP = 1 << 12 };

/* The number of consecutive elements after which a walk with element stride
 * st (bytes per element e) meets the same unit of a layout with period R
 * bytes again: R / gcd(R, |st| e). */
static int64_t walk_period(int64_t R, int64_t st, int64_t e)
{
	int64_t b = st * e;
	b = b < 0 ? -b : b;
	return b == 0 ? 1 : R / tcp_gcd(R, b);
}

/* The elements of a row worth walking: past lcm(pi, qi) (the periods of its
 * two sides, in elements) the row repeats the pairs of units it met. */
static int64_t row_span(int64_t inner, int64_t pi, int64_t qi)
{
	int64_t g = tcp_gcd(pi, qi);
	return pi / g <= INT64_MAX / qi && pi / g * qi < inner ? pi / g * qi : inner;
}

/* Rows of a load differ only in their first bytes: where a row starts within
 * each side's layout period decides which slices every byte of it lands on
 * and comes from, so a row starting where an earlier one did is not walked
 * again. A small open-addressed set of those start pairs, forgetting nothing
 * and refusing to grow past SEEN_CAP (then rows are simply walked). */
typedef struct {
	int64_t key[SEEN_CAP][2];
	unsigned char used[SEEN_CAP];
	int n;
} seen_rows;

/* An empty set (NULL when out of memory: every row is walked); only the
 * used marks are cleared, keys are written before they are read. */
static seen_rows *seen_new(void)
{
	seen_rows *h = malloc(sizeof *h);
	if (h) {
		memset(h->used, 0, sizeof h->used);
		h->n = 0;
	}
	return h;
}

static bool seen_add(seen_rows *h, int64_t a, int64_t b)
{
	uint64_t x = (uint64_t)a * 0x9E3779B97F4A7C15ull ^ (uint64_t)b * 0xC2B2AE3D27D4EB4Full;
	for (unsigned i = (unsigned)(x >> 40) % SEEN_CAP, n = 0; n < SEEN_CAP; i = (i + 1) % SEEN_CAP, n++) {
		if (!h->used[i]) {
			if (h->n >= SEEN_CAP / 2)
				return false;
			h->used[i] = 1;
			h->key[i][0] = a;
			h->key[i][1] = b;
			h->n++;
			return false;
		}
		if (h->key[i][0] == a && h->key[i][1] == b)
			return true;
	}
	return false;
}

bool tcp_load_local(const tcp_program *p, const moe_tcp_machine *m, const tcp_insn *in, char *why, size_t nwhy)
{
	const tcp_view *dv = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	const tcp_tensor *D = &p->t[dv->t], *T = &p->t[sv->t];
	if (dv->reg >= 0 || sv->reg >= 0) {
		snprintf(why, nwhy, "a view with an offset register cannot be shown to stay on the slices that hold it");
		return false;
	}
	int64_t ed = (int64_t)moe_dtype_size((moe_dtype)D->dtype), es = (int64_t)moe_dtype_size((moe_dtype)T->dtype);
	int64_t pd = tcp_layout_unit(m, D), ps = tcp_layout_unit(m, T), nd = in->ndim, inner = in->dim[nd - 1];
	int64_t Gd = tcp_layout_group(m, D), Gs = tcp_layout_group(m, T), Rd = pd * Gd, Rs = ps * Gs;
	int64_t outer = 1, idx[TCP_MAXD] = {0}, steps = 0, lqd = -1, lqs = -1;
	for (int k = 0; k < nd - 1; k++)
		outer *= in->dim[k];
	bool unit = dv->stride[nd - 1] == 1 && sv->stride[nd - 1] == 1;
	int64_t span = row_span(inner, walk_period(Rd, dv->stride[nd - 1], ed), walk_period(Rs, sv->stride[nd - 1], es));
	seen_rows *seen = outer > 1 ? seen_new() : NULL;
	bool ok = true;
	for (int64_t o = 0; o < outer && ok; o++) {
		int64_t da = dv->base, sa = sv->base;
		for (int k = 0; k < nd - 1; k++) {
			da += idx[k] * dv->stride[k];
			sa += idx[k] * sv->stride[k];
		}
		for (int k = nd - 2; k >= 0 && ++idx[k] == in->dim[k]; k--)
			idx[k] = 0;
		if (seen && seen_add(seen, ((da * ed) % Rd + Rd) % Rd, ((sa * es) % Rs + Rs) % Rs))
			continue;
		for (int64_t i = 0; i < span;) {
			if (++steps > WALK_CAP) {
				snprintf(why, nwhy, "the load is too irregular to show that each slice holds what it reads");
				ok = false;
				break;
			}
			int64_t db = (da + i * dv->stride[nd - 1]) * ed, sb = (sa + i * sv->stride[nd - 1]) * es;
			int64_t qd = db / pd % Gd, qs = sb / ps % Gs;
			if ((qd != lqd || qs != lqs) && !parts_agree(m, D, T, qd, qs)) {
				snprintf(why, nwhy, "%s byte %lld (on slice %lld) comes from '%s' byte %lld (on slice %lld), which the slices "
					"holding the former do not hold", D->name, (long long)db, (long long)qd, T->name, (long long)sb,
					(long long)qs);
				ok = false;
				break;
			}
			lqd = qd;
			lqs = qs;
			int64_t adv = 1;
			if (unit) { /* to the next unit boundary of either side */
				int64_t a = (pd - db % pd + ed - 1) / ed, b = (ps - sb % ps + es - 1) / es;
				adv = a < b ? a : b;
			}
			i += adv > 0 ? adv : 1;
		}
	}
	free(seen);
	return ok;
}

/* ---- main-context passes: which slice computes which element ----
 * (docs/tcp-isa.md sections 5, 6 and 9) A tu.vec pass cuts its iteration
 * space, in row-major order, into work units of flit_bytes / 4 iterations
 * (one flit of lane words), or of one row (the innermost loop) when its
 * chain has a reduce, scan or compaction; with q = ceil(units / S), slice s
 * runs units [s q, (s + 1) q): consecutive blocks of q units (cu = q units
 * of iterations below). A
 * tu.contract pass [M, O, I] splits O into Cg = ceil(O / tile) column groups
 * and M into row groups of Bs = ceil(M / (S / Cg)) rows: output (m, o) is
 * computed on slice ((m / Bs) Cg + o / tile) mod S, which streams all of row
 * m of s0, reads s2[m, o] and commits dst[m, o]. A slice fetches and commits
 * only the bytes of DM operands that it computes with. */
enum { PW_VEC, PW_OUT, PW_OUT3, PW_IN };
typedef struct pwalk {
	int kind;
	int64_t S, L, cu, Cg, Bs, tile, O, fan;
} pwalk;

/* The slice of element (row r, inner i) of an operand, c-th of its fan. */
static int64_t pw_slice(const pwalk *w, int64_t r, int64_t i, int64_t c)
{
	switch (w->kind) {
	case PW_VEC: return (r * w->L + i) / w->cu % w->S;
	case PW_OUT: return ((r / w->Bs) * w->Cg + i / w->tile) % w->S;
	case PW_OUT3: return ((r / w->O / w->Bs) * w->Cg + r % w->O / w->tile) % w->S;
	default: return ((r / w->Bs) * w->Cg + c) % w->S;
	}
}

/* What decides a row's slices (rows with equal keys meet the same slices). */
static int64_t pw_key(const pwalk *w, int64_t r)
{
	return w->kind == PW_VEC ? r * w->L % (w->cu * w->S) : pw_slice(w, r, 0, 0);
}

/* Iterations along the inner loop after which the slices repeat, and from i
 * until the slice changes. */
static int64_t pw_period(const pwalk *w)
{
	return w->kind == PW_VEC ? w->cu * w->S : w->kind == PW_OUT ? w->tile * w->S : 1;
}

static int64_t pw_run(const pwalk *w, int64_t r, int64_t i)
{
	if (w->kind == PW_VEC)
		return w->cu - (r * w->L + i) % w->cu;
	return w->kind == PW_OUT ? w->tile - i % w->tile : INT64_MAX;
}

static bool pw_holds(const moe_tcp_machine *m, const tcp_tensor *T, int64_t s, int64_t q)
{
	int64_t G = tcp_layout_group(m, T);
	return s < G * T->copies && s % G == q % G;
}

/* Whether every slice that computes with an element of view v (dims nd, dim;
 * nib: 4-bit elements) holds its byte; false: *why names the first that does not. */
static bool pw_view(const tcp_program *p, const moe_tcp_machine *m, const pwalk *w, const tcp_view *v, int nd,
	const int64_t *dim, bool nib, bool commit, char *why, size_t nwhy)
{
	const tcp_tensor *T = &p->t[v->t];
	if (v->reg >= 0) {
		snprintf(why, nwhy, "'%s': a view with an offset register cannot be shown to stay on the slices that hold it",
			T->name);
		return false;
	}
	/* byte of element x: x num / den */
	int64_t num = nib ? 1 : (int64_t)moe_dtype_size((moe_dtype)T->dtype), den = nib ? 2 : 1;
	int64_t u = tcp_layout_unit(m, T), G = tcp_layout_group(m, T), Rs = u * G, inner = dim[nd - 1];
	int64_t st = v->stride[nd - 1], outer = 1, idx[TCP_MAXD] = {0}, steps = 0;
	for (int k = 0; k < nd - 1; k++)
		outer *= dim[k];
	int64_t span = row_span(inner, pw_period(w), walk_period(Rs * den, st, num));
	int64_t fan = w->fan < w->S ? w->fan : w->S;
	if (fan > T->copies) {
		snprintf(why, nwhy, "'%s' byte %lld is fetched by %lld slices (one per column group) and held by %d", T->name,
			(long long)(v->base * num / den), (long long)fan, T->copies);
		return false;
	}
	seen_rows *seen = outer > 1 ? seen_new() : NULL;
	bool ok = true;
	for (int64_t r = 0; r < outer && ok; r++) {
		int64_t a = v->base;
		for (int k = 0; k < nd - 1; k++)
			a += idx[k] * v->stride[k];
		for (int k = nd - 2; k >= 0 && ++idx[k] == dim[k]; k--)
			idx[k] = 0;
		if (seen && seen_add(seen, pw_key(w, r), ((a * num / den) % Rs + Rs) % Rs))
			continue;
		for (int64_t i = 0; i < span && ok;) {
			if (++steps > WALK_CAP) {
				snprintf(why, nwhy, "'%s': the pass is too irregular to show that each slice holds what it reads",
					T->name);
				ok = false;
				break;
			}
			int64_t x = a + i * st, b = x * num / den, q = b / u;
			for (int64_t c = 0; c < fan; c++) {
				int64_t s = pw_slice(w, r, i, c);
				if (!pw_holds(m, T, s, q)) {
					snprintf(why, nwhy, "'%s' byte %lld (on slice %lld) is %s slice %lld, which does not hold it", T->name,
						(long long)b, (long long)(q % G), commit ? "committed by" : "fetched by", (long long)s);
					ok = false;
					break;
				}
			}
			int64_t adv = 1;
			if (st == 1) { /* to the next unit boundary or slice change */
				int64_t nb = ((q + 1) * u * den + num - 1) / num - x, rn = pw_run(w, r, i);
				adv = nb < rn ? nb : rn;
			} else if (st == 0) { /* one byte for the whole row: to the next slice change */
				adv = pw_run(w, r, i);
			}
			if (adv < 1)
				adv = 1;
			i += adv < span - i ? adv : span - i;
		}
	}
	free(seen);
	return ok;
}

/* One operand of a pass: its bit in the mask and, for the first that breaks
 * the rule, the message. */
static void pw_check(const tcp_program *p, const moe_tcp_machine *m, const pwalk *w, int v, const tcp_view *x, int nd,
	const int64_t *dim, bool nib, unsigned *mask, char *why, size_t nwhy)
{
	static const char *const vn[TCP_NVIEW] = {"dst", "s0", "s1", "s2"};
	char one[224];
	if (!pw_view(p, m, w, x, nd, dim, nib, v == TCP_V_DST, one, sizeof one)) {
		if (!*mask)
			snprintf(why, nwhy, "%s %s", vn[v], one);
		*mask |= 1u << v;
	}
}

unsigned tcp_pass_remote(const tcp_program *p, const moe_tcp_machine *m, const tcp_insn *in, char *why, size_t nwhy)
{
	pwalk w = {.S = tcp_slices(m), .fan = 1};
	unsigned mask = 0;
	if (nwhy)
		why[0] = 0;
	if (in->op == TCP_OP_TU_VEC) {
		int nd = in->ndim, row = 0;
		for (int i = 0; i < in->nstep; i++) {
			int op = in->step[i].op;
			row |= tcp_vop_stage[op] == TCP_ST_REDUCE || op == TCP_V_ISCAN || op == TCP_V_FSCAN || op == TCP_V_COMPACT;
		}
		w.kind = PW_VEC;
		w.L = nd ? in->dim[nd - 1] : 1;
		int64_t per = row ? w.L : (m->flit_bytes / 4 > 0 ? m->flit_bytes / 4 : 1), n = 1;
		for (int k = 0; k < nd; k++)
			n = n > INT64_MAX / in->dim[k] ? INT64_MAX : n * in->dim[k];
		/* units of per iterations; slice s runs units [s q, (s + 1) q) */
		int64_t units = row ? n / w.L : n / per + (n % per != 0), q = (units + w.S - 1) / w.S;
		w.cu = per * (q > 0 ? q : 1);
		for (int v = 0; v < TCP_NVIEW && nd > 0; v++) {
			const tcp_view *x = &in->v[v];
			if (x->t >= 0 && p->t[x->t].space == TCP_DM)
				pw_check(p, m, &w, v, x, nd, in->dim, v == TCP_V_S0 && (in->flags & (TCP_F_E2M1 | TCP_F_I4)), &mask,
					why, nwhy);
		}
		return mask;
	}
	if (in->op != TCP_OP_TU_CONTRACT || in->ndim != 3 || in->tile < 1)
		return 0;
	int64_t M = in->dim[0], O = in->dim[1], I = in->dim[2];
	w.Cg = (O + in->tile - 1) / in->tile;
	int64_t R = w.S / w.Cg > 0 ? w.S / w.Cg : 1;
	w.Bs = (M + R - 1) / R;
	w.tile = in->tile;
	w.O = O;
	for (int v = 0; v < TCP_NVIEW; v++) {
		const tcp_view *x = &in->v[v];
		if (x->t < 0 || p->t[x->t].space != TCP_DM)
			continue;
		tcp_view y = *x;
		if (v == TCP_V_S2 && (in->flags & TCP_F_ROWDIV)) { /* output (m, o) reads col[o] and row[m] */
			int64_t d3[3] = {M, O, 1};
			tcp_view col = *x, row = *x;
			col.stride[0] = col.stride[2] = 0;
			row.base += row.stride[2];
			row.stride[1] = row.stride[2] = 0;
			w.kind = PW_OUT3;
			w.fan = 1;
			pw_check(p, m, &w, v, &col, 3, d3, false, &mask, why, nwhy);
			pw_check(p, m, &w, v, &row, 3, d3, false, &mask, why, nwhy);
			continue;
		}
		if (v == TCP_V_S2 && (in->flags & TCP_F_SCALED)) { /* [m, o, chunk]: rows (m, o) */
			int64_t d3[3] = {M, O, I / TCP_SCALE_CHUNK};
			w.kind = PW_OUT3;
			w.fan = 1;
			pw_check(p, m, &w, v, x, 3, d3, false, &mask, why, nwhy);
			continue;
		}
		int64_t d2[2] = {M, v == TCP_V_S0 ? I : O};
		w.kind = v == TCP_V_S0 ? PW_IN : PW_OUT;
		w.fan = v == TCP_V_S0 ? w.Cg : 1;
		if (v == TCP_V_S0)
			y.stride[1] = x->stride[2];
		pw_check(p, m, &w, v, &y, 2, d2, false, &mask, why, nwhy);
	}
	return mask;
}
