/* backend-tcp/isa/meter.c: what the simulator and the schedule's timeline
 * both measure of a command before isa/cost.c prices it (isa/cost.h): a DMA
 * command's runs and DM sides, a sequencer's read size, and the staged
 * values a predictor stands in for a run's. */
#include <string.h>

#include "backend-tcp/isa/cost.h"

int64_t tcp_meter_stamps(const moe_tcp_machine *m)
{
	return 2 * m->clusters * tcp_dmns_per_cluster(m) + 1;
}

void tcp_meter_init(tcp_meter *mt, const tcp_cm *cm, const tcp_program *p, uint32_t *stamps)
{
	*mt = (tcp_meter){.cm = cm, .p = p, .dmn = stamps, .ndmn = cm->m->clusters * tcp_dmns_per_cluster(cm->m)};
}

void tcp_meter_run(tcp_meter *mt, tcp_dma_load *c, int32_t t, int64_t a, int64_t len, bool write)
{
	if (len <= 0)
		return;
	bool hbm = mt->p->t[t].space == TCP_HBM;
	tcp_dma_run(mt->cm, c, hbm, a, len, write);
	if (hbm)
		*(write ? &mt->hbm_write : &mt->hbm_read) += len;
}

/* The runs in the order of the view's elements; those of the innermost
 * dimension outside the contiguous tail, a fixed step apart, in one
 * tcp_dma_runs. */
int64_t tcp_meter_runs(tcp_meter *mt, tcp_dma_load *c, const tcp_view *v, int64_t base, int nd, const int64_t *dim,
	int64_t e, bool write)
{
	int64_t run = 1;
	int k = nd - 1;
	while (k >= 0 && (v->stride[k] == run || dim[k] == 1))
		run *= dim[k--];
	int64_t at = mt->p->t[v->t].addr + base * e, idx[TCP_MAXD] = {0}, outer = 1, len = run * e;
	for (int j = 0; j < k; j++)
		outer *= dim[j];
	int64_t n = k >= 0 ? dim[k] : 1, step = k >= 0 ? v->stride[k] * e : 0;
	bool hbm = mt->p->t[v->t].space == TCP_HBM;
	if (len <= 0 || n <= 0)
		return run;
	for (int64_t o = 0; o < outer; o++) {
		int64_t a = at;
		for (int j = 0; j < k; j++)
			a += idx[j] * v->stride[j] * e;
		tcp_dma_runs(mt->cm, c, hbm, a, len, step, n, write);
		for (int j = k - 1; j >= 0 && ++idx[j] == dim[j]; j--)
			idx[j] = 0;
	}
	if (hbm)
		*(write ? &mt->hbm_write : &mt->hbm_read) += outer * n * len;
	return run;
}

void tcp_meter_slices(const tcp_meter *mt, int32_t t, int64_t lo, int64_t hi, int64_t *first, int64_t *n, int64_t *P)
{
	const tcp_tensor *tt = &mt->p->t[t];
	int64_t S = mt->cm->S, u = tcp_layout_unit(mt->cm->m, tt), f0 = lo / u, f1 = hi / u;
	*P = tcp_layout_group(mt->cm->m, tt);
	*P = *P < 1 ? 1 : *P > S ? S : *P;
	*first = f0 % *P;
	*n = f1 - f0 + 1 < *P ? f1 - f0 + 1 : *P;
}

/* Marks the DMNs (and DMN pairs) that hold bytes [lo, hi] of DM tensor t,
 * in every copy, for side w of the command (stamp: this command). */
static void touch(tcp_meter *mt, tcp_dma_load *c, int32_t t, int64_t lo, int64_t hi, int w)
{
	const moe_tcp_machine *m = mt->cm->m;
	int64_t S = mt->cm->S, first, n, P, spc = m->slices_per_cluster, dpc = tcp_dmns_per_cluster(m),
		spd = tcp_slices_per_dmn(m);
	tcp_meter_slices(mt, t, lo, hi, &first, &n, &P);
	int64_t ppc = (dpc + 1) / 2, npair0 = mt->ndmn; /* pair stamps follow the DMN stamps */
	for (int64_t k = 0, copies = tcp_dm_side_bytes(&mt->p->t[t], 1); k < copies && k * P < S; k++)
		for (int part = 0; part < 2; part++) {
			int64_t a = part ? 0 : first, b = part ? first + n - P - 1 : (first + n - 1 < P ? first + n - 1 : P - 1);
			a += k * P;
			b += k * P;
			b = b < S - 1 ? b : S - 1;
			if (b < a)
				continue;
			int64_t d0 = a / spc * dpc + a % spc / spd, d1 = b / spc * dpc + b % spc / spd;
			for (int64_t d = d0; d <= d1; d++) {
				int64_t cl = d / dpc, pr = npair0 + cl * ppc + d % dpc / 2;
				c->clo[w] = cl < c->clo[w] ? cl : c->clo[w];
				c->chi[w] = cl > c->chi[w] ? cl : c->chi[w];
				if (mt->dmn[d] != mt->stamp)
					mt->dmn[d] = mt->stamp, c->dmns++;
				if (mt->dmn[pr] != mt->stamp)
					mt->dmn[pr] = mt->stamp, c->pairs++;
			}
		}
}

void tcp_meter_dm_sides(tcp_meter *mt, tcp_dma_load *c, const tcp_view *d, int64_t dlo, int64_t dhi, const tcp_view *sv,
	int64_t slo, int64_t shi, int64_t moved)
{
	const tcp_tensor *td = &mt->p->t[d->t], *ts = &mt->p->t[sv->t];
	if (++mt->stamp == 0) { /* wrapped: clear every stamp */
		memset(mt->dmn, 0, sizeof *mt->dmn * (size_t)(2 * mt->ndmn + 1));
		mt->stamp = 1;
	}
	int64_t copies = td->space == TCP_DM ? tcp_dm_side_bytes(td, 1) : 1;
	int64_t de = (int64_t)moe_dtype_size((moe_dtype)td->dtype), se = (int64_t)moe_dtype_size((moe_dtype)ts->dtype);
	if (td->space == TCP_DM)
		touch(mt, c, d->t, dlo * de, (dhi + 1) * de - 1, 0);
	if (ts->space == TCP_DM)
		touch(mt, c, sv->t, slo * se, (shi + 1) * se - 1, 1);
	c->bytes = moved * copies;
	tcp_dma_engines(mt->cm, c, td->space == TCP_HBM && ts->space == TCP_HBM);
}

int64_t tcp_meter_read_size(const moe_tcp_machine *m, const tcp_view *v, int nd, const int64_t *dim, int64_t e,
	int64_t *elems)
{
	int64_t run = 1;
	int k = nd - 1;
	if (nd > 0 && v->stride[nd - 1] == 0 && dim[nd - 1] > 1) {
		*elems /= dim[nd - 1];
		return e;
	}
	while (k >= 0 && (v->stride[k] == run || dim[k] == 1))
		run *= dim[k--];
	int64_t b = run * e, rs = 1;
	while (rs < m->fetch_bytes && b % (rs * 2) == 0)
		rs *= 2;
	return rs;
}

tcp_staged tcp_staged_counts(int32_t t, int64_t base, const tcp_view *v, int64_t nb, const int32_t *ve, int32_t nbr[3])
{
	if (v->stride[0] == 0)
		return (tcp_staged){t, base, 0, 1, NULL, (int32_t)nb};
	int32_t runs = 0, gap = -1;
	for (int64_t g = 0; g < nb; g++)
		if (g == 0 || ve[g] != ve[g - 1]) {
			if (gap < 0 && ve[g] != runs)
				gap = runs;
			runs++;
		}
	nbr[0] = (int32_t)nb, nbr[1] = runs, nbr[2] = gap < 0 ? runs : gap;
	return (tcp_staged){t, base, v->stride[0], 3, nbr, 0};
}

bool tcp_staged_find(const tcp_staged *d, int nd, int32_t t, int64_t el, int32_t *w)
{
	for (int i = 0; i < nd; i++, d++) {
		if (d->t != t)
			continue;
		if (d->stride == 0 || !d->v) {
			if (el == d->base) {
				*w = d->v ? d->v[0] : d->scalar;
				return true;
			}
			continue;
		}
		int64_t off = el - d->base;
		if (off % d->stride == 0 && off / d->stride >= 0 && off / d->stride < d->n) {
			*w = d->v[off / d->stride];
			return true;
		}
	}
	return false;
}
