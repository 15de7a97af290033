/* backend-tcp/layout.c: whether a sub-context load reads only bytes that
 * each receiving slice holds (docs/tcp-isa.md sections 1 and 9): the
 * validator's rule for a load without the switch, and the lowering's test
 * for when a load needs it. */
#include <stdio.h>

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

enum { WALK_CAP = 1 << 22 };

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
	int64_t outer = 1, idx[TCP_MAXD] = {0}, steps = 0, lqd = -1, lqs = -1;
	for (int k = 0; k < nd - 1; k++)
		outer *= in->dim[k];
	bool unit = dv->stride[nd - 1] == 1 && sv->stride[nd - 1] == 1;
	for (int64_t o = 0; o < outer; o++) {
		int64_t da = dv->base, sa = sv->base;
		for (int k = 0; k < nd - 1; k++) {
			da += idx[k] * dv->stride[k];
			sa += idx[k] * sv->stride[k];
		}
		for (int64_t i = 0; i < inner;) {
			if (++steps > WALK_CAP) {
				snprintf(why, nwhy, "the load is too irregular to show that each slice holds what it reads");
				return false;
			}
			int64_t db = (da + i * dv->stride[nd - 1]) * ed, sb = (sa + i * sv->stride[nd - 1]) * es;
			int64_t qd = db / pd % tcp_layout_group(m, D), qs = sb / ps % tcp_layout_group(m, T);
			if ((qd != lqd || qs != lqs) && !parts_agree(m, D, T, qd, qs)) {
				snprintf(why, nwhy, "%s byte %lld (on slice %lld) comes from '%s' byte %lld (on slice %lld), which the slices "
					"holding the former do not hold", D->name, (long long)db, (long long)qd, T->name, (long long)sb,
					(long long)qs);
				return false;
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
		for (int k = nd - 2; k >= 0 && ++idx[k] == in->dim[k]; k--)
			idx[k] = 0;
	}
	return true;
}
