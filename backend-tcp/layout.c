/* backend-tcp/layout.c: whether a sub-context load reads only bytes that
 * each receiving slice holds (docs/tcp-isa.md sections 1 and 9): the
 * validator's rule for a load without the switch, and the lowering's test
 * for when a load needs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend-tcp/tcp_int.h"

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

static int64_t gcd64(int64_t a, int64_t b)
{
	while (b) {
		int64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* The number of consecutive elements after which a walk with element stride
 * st (bytes per element e) meets the same unit of a layout with period R
 * bytes again: R / gcd(R, |st| e). */
static int64_t walk_period(int64_t R, int64_t st, int64_t e)
{
	int64_t b = st * e;
	b = b < 0 ? -b : b;
	return b == 0 ? 1 : R / gcd64(R, b);
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
	/* Past this many elements a row repeats the pairs of units it met. */
	int64_t pi = walk_period(Rd, dv->stride[nd - 1], ed), qi = walk_period(Rs, sv->stride[nd - 1], es);
	int64_t g = gcd64(pi, qi), span = inner;
	if (pi / g <= INT64_MAX / qi && pi / g * qi < span)
		span = pi / g * qi;
	seen_rows *seen = outer > 1 ? calloc(1, sizeof *seen) : NULL;
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
