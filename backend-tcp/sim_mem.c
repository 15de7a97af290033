/* backend-tcp/sim_mem.c: the TCP simulator's data movement: DMA copies, gathers,
 * scatters and SPM staging with their cost (docs/tcp-isa.md section 10), sub
 * loads into TRF/VRF, and the checks on values of absent weights. */
#include "backend-tcp/sim_int.h"

/* ---- DMA ---- */
bool tcps_writable(sim *s, uint32_t pc, int32_t t)
{
	if (s->p->t[t].kind == TCP_T_INPUT || s->p->t[t].kind == TCP_T_WEIGHT || s->p->t[t].kind == TCP_T_CONST ||
		s->p->t[t].kind == TCP_T_PACKED) {
		FAULT(s, pc, "write to read-only tensor '%s'", s->p->t[t].name);
		return false;
	}
	return true;
}

/* What one DMA command moves, for its cost (docs/tcp-isa.md section 10). */
typedef struct dmac {
	int64_t bytes, runs, packets, dm_rmw;
	double hbm; /* bytes charged to the one HBM pool, reads and writes together */
} dmac;

/* One contiguous run of len bytes at byte address a of tensor t, read or
 * written. HBM reads are charged whole requests of the access granule (a run
 * crossing a granule boundary costs one more request); HBM writes are charged
 * whole granules, a partial granule at the unaligned write factor (its
 * read-modify-write). A DM write whose address or size is not a multiple of
 * dm_alignment_bytes is one read-modify-write (A16). */
static void dma_run(sim *s, dmac *c, int32_t t, int64_t a, int64_t len, bool write)
{
	const moe_tcp_machine *m = s->m;
	if (len <= 0)
		return;
	if (s->p->t[t].space == TCP_HBM) {
		int64_t g = m->hbm_granule, end = a + len, blocks = (end + g - 1) / g - a / g;
		if (!write) {
			c->hbm += (double)(blocks * g);
			acc_sat(s, &s->st->hbm_read_bytes, len);
		} else {
			int64_t partial = (a % g != 0) + (end % g != 0);
			if (partial > blocks)
				partial = blocks;
			c->hbm += (double)((blocks - partial) * g) + (double)(partial * g) * m->hbm_unaligned_write;
			acc_sat(s, &s->st->hbm_write_bytes, len);
		}
	} else if (write && (a % m->dm_align != 0 || len % m->dm_align != 0)) {
		c->dm_rmw++;
	}
}

/* The contiguous runs of a view over dims (elements of size e), each passed
 * to dma_run; returns the run length in elements. */
static int64_t dma_runs(sim *s, dmac *c, const tcp_view *v, int nd, const int64_t *dim, int64_t e, bool write)
{
	int64_t run = 1;
	int k = nd - 1;
	while (k >= 0 && (v->stride[k] == run || dim[k] == 1))
		run *= dim[k--];
	int64_t base = s->p->t[v->t].addr + vbase(s, v) * e, idx[TCP_MAXD] = {0}, outer = 1;
	for (int j = 0; j <= k; j++)
		outer *= dim[j];
	for (int64_t o = 0; o < outer; o++) {
		int64_t a = base;
		for (int j = 0; j <= k; j++)
			a += idx[j] * v->stride[j] * e;
		dma_run(s, c, v->t, a, run * e, write);
		for (int j = k; j >= 0 && ++idx[j] == dim[j]; j--)
			idx[j] = 0;
	}
	return run;
}

/* setup + the longer of the engines' time and the HBM pool's time; DM -> DM
 * serializes its reads and writes; gather/scatter pay the row overhead per
 * engine for every row of the index list, the zero rows past a valid count
 * included (docs/tcp-isa.md A3). */
static int64_t dma_time(sim *s, const dmac *c, bool dm2dm, int64_t rows)
{
	const moe_tcp_machine *m = s->m;
	int64_t eng = c->packets < m->dma_engines ? c->packets : m->dma_engines;
	if (eng < 1)
		eng = 1;
	double t = (double)c->bytes / (double)(m->dma_bytes_per_cycle * eng);
	if (dm2dm && m->dm_to_dm_serialized)
		t *= 2;
	double h = c->hbm / s->hbm_bpc;
	t = t > h ? t : h;
	if (!(t < 1e15)) { /* also NaN: the float->int conversion below must be defined */
		s->cycles_overflow = true;
		t = 1e15;
	}
	return m->dma_setup + (int64_t)ceil(t) + (rows > 1 ? cdiv(rows, eng) * m->row_overhead : 0) +
	       cdiv(c->dm_rmw, eng) * m->row_overhead;
}

/* False (with a fault) when the values of tensor t are needed but derive
 * from a weight absent from the checkpoint. */
bool tcps_needs_values(sim *s, uint32_t pc, int32_t t)
{
	if (t < 0 || !s->absent[t])
		return true;
	const tcp_tensor *w = &s->p->t[s->absent[t] - 1];
	FAULT(s, pc, "this timing-only run needs the values of '%s', which come from %s '%s', absent from the "
		"checkpoint (only expert weights, whose arithmetic is skipped, may be left out)", s->p->t[t].name,
		w->kind == TCP_T_PACKED ? "packed weight" : "weight", w->name);
	return false;
}

/* Timing-only runs skip the arithmetic from the block body on (A12). */
bool tcps_computes(const sim *s, uint32_t pc)
{
	return !(s->o->timing_only && s->p->block_body_pc >= 0 && (int32_t)pc >= s->p->block_body_pc);
}

/* Before a pass computes: its sources must have values; its destination gets
 * fresh ones. False after a fault. */
bool tcps_take_values(sim *s, uint32_t pc, const tcp_insn *in)
{
	for (int w = 0; w < TCP_NVIEW; w++)
		if (w != TCP_V_DST && !tcps_needs_values(s, pc, in->v[w].t))
			return false;
	s->absent[in->v[TCP_V_DST].t] = 0;
	return true;
}

/* dst[idx] = src[idx] over dims, element size e; runs that are contiguous on
 * both sides along the innermost loop move with one memcpy. */
static void copy_elems(sim *s, const tcp_insn *in, const tcp_view *d, const tcp_view *sv, int64_t e, int64_t db,
	int64_t sb)
{
	int nd = in->ndim;
	if (s->absent[sv->t])
		s->absent[d->t] = s->absent[sv->t];
	if (nd == 0 || !s->data[sv->t])
		return;
	int64_t inner = in->dim[nd - 1];
	bool run = d->stride[nd - 1] == 1 && sv->stride[nd - 1] == 1;
	int64_t outer = 1;
	for (int k = 0; k < nd - 1; k++)
		outer *= in->dim[k];
	int64_t idx[TCP_MAXD] = {0};
	for (int64_t o = 0; o < outer; o++) {
		int64_t da = db, sa = sb;
		for (int k = 0; k < nd - 1; k++) {
			da += idx[k] * d->stride[k];
			sa += idx[k] * sv->stride[k];
		}
		if (run) {
			memmove(s->data[d->t] + da * e, s->data[sv->t] + sa * e, (size_t)(inner * e));
		} else {
			for (int64_t i = 0; i < inner; i++)
				memcpy(s->data[d->t] + (da + i * d->stride[nd - 1]) * e, s->data[sv->t] + (sa + i * sv->stride[nd - 1]) * e,
					(size_t)e);
		}
		for (int k = nd - 2; k >= 0 && ++idx[k] == in->dim[k]; k--)
			idx[k] = 0;
	}
}

void tcps_run_dma_copy(sim *s, uint32_t pc, const tcp_insn *in)
{
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t dlo, dhi, slo, shi;
	if (!tcps_vrange(s, pc, d, in->ndim, in->dim, &dlo, &dhi) || !tcps_vrange(s, pc, sv, in->ndim, in->dim, &slo, &shi) ||
		!tcps_writable(s, pc, d->t))
		return;
	int64_t e = esz_of(s, d->t), n = 1;
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	int64_t db = vbase(s, d), sb = vbase(s, sv);
	copy_elems(s, in, d, sv, e, db, sb);
	dmac dc = {n * e, 0, 0, 0, 0};
	int64_t rs = dma_runs(s, &dc, sv, in->ndim, in->dim, e, false), rd = dma_runs(s, &dc, d, in->ndim, in->dim, e, true);
	int64_t run = rs < rd ? rs : rd;
	dc.packets = n / run * cdiv(run * e, s->m->dma_max_packet);
	acc a = {0};
	acc_add(&a, d->t, dlo, dhi, true);
	acc_add(&a, sv->t, slo, shi, false);
	tcps_schedule(s, pc, &a, dma_time(s, &dc, s->p->t[d->t].space == TCP_DM && s->p->t[sv->t].space == TCP_DM, 1));
}

void tcps_run_dma_gs(sim *s, uint32_t pc, const tcp_insn *in)
{
	bool gather = in->op == TCP_OP_DMA_GATHER;
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1];
	int64_t G = in->dim[0], n = in->dim[1], row = in->dim[2], rows = in->rows;
	int64_t d3[3] = {G, gather ? n : rows, row}, s3[3] = {G, gather ? rows : n, row};
	int64_t dlo, dhi, slo, shi, ilo, ihi;
	if (!tcps_vrange(s, pc, d, 3, d3, &dlo, &dhi) || !tcps_vrange(s, pc, sv, 3, s3, &slo, &shi) ||
		!tcps_vrange(s, pc, iv, 2, in->dim, &ilo, &ihi) || !tcps_writable(s, pc, d->t))
		return;
	bool vrows = in->flags & TCP_F_VROWS; /* the count limits the groups */
	int64_t cnt = in->vreg >= 0 && !vrows ? s->reg[in->vreg] : n, gcnt = in->vreg >= 0 && vrows ? s->reg[in->vreg] : G;
	int64_t e = esz_of(s, d->t), db = vbase(s, d), sb = vbase(s, sv), ib = vbase(s, iv), moved = 0;
	if (!tcps_needs_values(s, pc, iv->t))
		return;
	if (s->absent[sv->t])
		s->absent[d->t] = s->absent[sv->t];
	bool copy = s->data[sv->t] != NULL;
	dmac dc = {0, 0, 0, 0, 0};
	int64_t sa0 = s->p->t[sv->t].addr, da0 = s->p->t[d->t].addr, rb = d->stride[2] == 1 && sv->stride[2] == 1 ? row * e : e;
	for (int64_t g = 0; g < G && !s->fault; g++)
		for (int64_t j = 0; j < n; j++) {
			if (j >= cnt || g >= gcnt) {
				if (gather)
					for (int64_t x = 0; x < row; x++)
						memset(s->data[d->t] + (db + g * d->stride[0] + j * d->stride[1] + x) * e, 0, (size_t)e);
				continue;
			}
			int32_t ix = (int32_t)load_word(s, iv->t, ib + g * iv->stride[0] + j * iv->stride[1]);
			if (in->flags & TCP_F_HBMIDX) { /* a byte offset of whole rows of the HBM side */
				int64_t rb = (gather ? sv : d)->stride[1] * e;
				if (rb < 1 || ix % rb) {
					FAULT(s, pc, "%s byte offset %d at position %lld is not a multiple of the row stride (%lld bytes)",
						gather ? "gather" : "scatter", ix, (long long)(g * n + j), (long long)rb);
					return;
				}
				ix = (int32_t)(ix / rb);
			}
			if (ix < 0 || ix >= rows) {
				FAULT(s, pc, "%s index %d at position %lld outside [0, %lld)", gather ? "gather" : "scatter", ix,
					(long long)(g * n + j), (long long)rows);
				return;
			}
			int64_t da = db + g * d->stride[0] + (gather ? j : ix) * d->stride[1];
			int64_t sa = sb + g * sv->stride[0] + (gather ? ix : j) * sv->stride[1];
			for (int64_t x = 0; copy && x < row; x++)
				memcpy(s->data[d->t] + (da + x * d->stride[2]) * e, s->data[sv->t] + (sa + x * sv->stride[2]) * e,
					(size_t)e);
			for (int64_t x = 0; x < row; x += rb / e) {
				dma_run(s, &dc, sv->t, sa0 + (sa + x * sv->stride[2]) * e, rb, false);
				dma_run(s, &dc, d->t, da0 + (da + x * d->stride[2]) * e, rb, true);
			}
			moved++;
		}
	acc a = {0};
	acc_add(&a, d->t, dlo, dhi, true);
	acc_add(&a, sv->t, slo, shi, false);
	acc_add(&a, iv->t, ilo, ihi, false);
	dc.bytes = (moved ? moved : 1) * row * e;
	dc.packets = G * n * cdiv(row * e, s->m->dma_max_packet);
	tcps_schedule(s, pc, &a, dma_time(s, &dc, s->p->t[d->t].space == TCP_DM && s->p->t[sv->t].space == TCP_DM, G * n));
}

/* Stages up to three i32 views into SPM, one descriptor each on its own
 * engine (they run side by side): the run-time scalars the control path reads
 * with ld (MODEL.md section 3). */
void tcps_run_dma_spm(sim *s, uint32_t pc, const tcp_insn *in)
{
	int64_t lo[TCP_NVIEW], hi[TCP_NVIEW], n = 1, most = 0;
	acc a = {0};
	dmac dc = {0, 0, 0, 0, 0};
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	for (int w = TCP_V_S0; w <= TCP_V_S2; w++) {
		const tcp_view *v = &in->v[w];
		if (v->t < 0)
			continue;
		if (!tcps_vrange(s, pc, v, in->ndim, in->dim, &lo[w], &hi[w]) || !tcps_needs_values(s, pc, v->t))
			return;
		acc_add(&a, v->t, lo[w], hi[w], false);
		int64_t el = hi[w] - lo[w] + 1 < n ? hi[w] - lo[w] + 1 : n;
		most = el * 4 > most ? el * 4 : most;
		dc.packets++;
		dma_runs(s, &dc, v, in->ndim, in->dim, 4, false);
	}
	dc.bytes = most * dc.packets;
	tcps_schedule(s, pc, &a, dma_time(s, &dc, false, 1));
	for (int w = TCP_V_S0; w <= TCP_V_S2; w++) {
		int32_t t = in->v[w].t;
		if (t < 0)
			continue;
		int64_t *sp = s->spm[t];
		if (sp[2] >= 0) {
			sp[0] = sp[0] < lo[w] ? sp[0] : lo[w];
			sp[1] = sp[1] > hi[w] ? sp[1] : hi[w];
		} else {
			sp[0] = lo[w];
			sp[1] = hi[w];
		}
		sp[2] = s->cfree[TCP_CTX_DMA];
		sp[3] = s->cev[TCP_CTX_DMA];
	}
}

void tcps_run_sub(sim *s, uint32_t pc, const tcp_insn *in)
{
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t dlo, dhi, slo, shi;
	if (!tcps_vrange(s, pc, d, in->ndim, in->dim, &dlo, &dhi) || !tcps_vrange(s, pc, sv, in->ndim, in->dim, &slo, &shi))
		return;
	int64_t e = esz_of(s, d->t), n = 1;
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	int64_t db = vbase(s, d), sb = vbase(s, sv);
	(void)n;
	if (tcps_computes(s, pc))
		copy_elems(s, in, d, sv, e, db, sb);
	/* every slice reads its footprint of the tile from DM: TRF through
	 * Collect at trf_load_bytes_per_cycle_per_slice (assumed), VRF at the
	 * sub context's read width */
	int64_t per = s->p->t[d->t].slice_bytes;
	int64_t rate = in->op == TCP_OP_SUB_TRF ? s->m->trf_load_bytes : s->m->sub_read_bytes;
	acc a = {0};
	acc_add(&a, d->t, dlo, dhi, true);
	acc_add(&a, sv->t, slo, shi, false);
	tcps_schedule(s, pc, &a, cdiv(per, rate) + s->m->fill_drain);
}
