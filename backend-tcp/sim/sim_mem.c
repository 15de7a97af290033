/* backend-tcp/sim/sim_mem.c: the TCP simulator's data movement: DMA copies, gathers,
 * scatters and SPM staging with their cost (docs/tcp-isa.md section 10), sub
 * loads into TRF/VRF, and the checks on values of absent weights. */
#include "backend-tcp/sim/sim_int.h"

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

/* The HBM bytes the meter charged, counted in the statistics. */
static void hbm_stats(sim *s)
{
	acc_sat(s, &s->st->hbm_read_bytes, s->mt.hbm_read);
	acc_sat(s, &s->st->hbm_write_bytes, s->mt.hbm_write);
	s->mt.hbm_read = s->mt.hbm_write = 0;
}

/* One contiguous run of len bytes at byte address a of tensor t, read or
 * written: charged to the command and counted in the HBM statistics. */
static void dma_run(sim *s, tcp_dma_load *c, int32_t t, int64_t a, int64_t len, bool write)
{
	tcp_meter_run(&s->mt, c, t, a, len, write);
	hbm_stats(s);
}

/* The contiguous runs of a view over dims (elements of size e); returns the
 * run length in elements. */
static int64_t dma_runs(sim *s, tcp_dma_load *c, const tcp_view *v, int nd, const int64_t *dim, int64_t e, bool write)
{
	int64_t run = tcp_meter_runs(&s->mt, c, v, vbase(s, v), nd, dim, e, write);
	hbm_stats(s);
	return run;
}

static int64_t dma_time(sim *s, const tcp_dma_load *c, bool dm2dm, int64_t rows)
{
	return tcp_cost_dma(&s->cm, c, dm2dm, rows, &s->cycles_overflow);
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
	return !s->pr && !(s->o->timing_only && s->p->block_body_pc >= 0 && (int32_t)pc >= s->p->block_body_pc);
}

void tcps_control_tensors(sim *s)
{
	const tcp_program *p = s->p;
	for (uint32_t pc = 0; pc < p->ncode; pc++) {
		const tcp_insn *in = &p->code[pc];
		int32_t t[3] = {-1, -1, -1};
		switch ((tcp_opcode)in->op) {
		case TCP_OP_LD: t[0] = in->v[TCP_V_S0].t; break;
		case TCP_OP_DMA_SPM: t[0] = in->v[TCP_V_S0].t, t[1] = in->v[TCP_V_S1].t, t[2] = in->v[TCP_V_S2].t; break;
		case TCP_OP_DMA_GATHER:
		case TCP_OP_DMA_SCATTER: t[0] = in->v[TCP_V_S1].t; break;
		default: break;
		}
		for (int k = 0; k < 3; k++)
			if (t[k] >= 0)
				s->ctl[t[k]] = 1;
	}
	/* the operands of any command writing a control tensor are read too
	 * (wherever it lies: one before the block body computes) */
	for (bool more = true; more;) {
		more = false;
		for (uint32_t pc = 0; pc < p->ncode; pc++) {
			const tcp_insn *in = &p->code[pc];
			int32_t d = in->v[TCP_V_DST].t;
			if (tcp_op_ctx[in->op] == TCP_CTX_CTL || d < 0 || !s->ctl[d])
				continue;
			for (int w = 0; w < TCP_NVIEW; w++) {
				int32_t src = in->v[w].t;
				if (w != TCP_V_DST && src >= 0 && !s->ctl[src])
					s->ctl[src] = 1, more = true;
			}
		}
	}
}

/* A timing-only run skips the arithmetic from the block body on (A12), and
 * with it the data movement there into tensors the control path never reads:
 * their values would never be used, and writing them would commit memory for
 * buffers as large as the worst-case grid (docs/tcp-isa.md section 10, A12). */
bool tcps_moves(const sim *s, uint32_t pc, int32_t t)
{
	return !s->ctl || s->ctl[t] || tcps_computes(s, pc);
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
static void copy_elems(sim *s, uint32_t pc, const tcp_insn *in, const tcp_view *d, const tcp_view *sv, int64_t e,
	int64_t db, int64_t sb)
{
	int nd = in->ndim;
	if (s->absent[sv->t])
		s->absent[d->t] = s->absent[sv->t];
	if (nd == 0 || !s->data[sv->t] || !tcps_moves(s, pc, d->t))
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
	copy_elems(s, pc, in, d, sv, e, db, sb);
	if (s->pr)
		tcps_pred_copy(s, in, db, sb);
	tcp_dma_load dc;
	tcp_dma_load_init(&dc);
	int64_t rs = dma_runs(s, &dc, sv, in->ndim, in->dim, e, false), rd = dma_runs(s, &dc, d, in->ndim, in->dim, e, true);
	int64_t run = rs < rd ? rs : rd;
	dc.requests = n / run * tcp_dma_requests(&s->cm, run * e);
	tcp_meter_dm_sides(&s->mt, &dc, d, dlo, dhi, sv, slo, shi, n * e);
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
	s->no_fill = gather; /* the rows gathered are filled one by one below */
	bool ok = tcps_vrange(s, pc, d, 3, d3, &dlo, &dhi) && tcps_vrange(s, pc, sv, 3, s3, &slo, &shi);
	s->no_fill = false;
	if (!ok || !tcps_vrange(s, pc, iv, 2, in->dim, &ilo, &ihi) || !tcps_writable(s, pc, d->t))
		return;
	bool vrows = in->flags & TCP_F_VROWS; /* the count limits the groups */
	int64_t cnt = in->vreg >= 0 && !vrows ? s->reg[in->vreg] : n, gcnt = in->vreg >= 0 && vrows ? s->reg[in->vreg] : G;
	int64_t e = esz_of(s, d->t), db = vbase(s, d), sb = vbase(s, sv), ib = vbase(s, iv), moved = 0;
	if (!tcps_needs_values(s, pc, iv->t))
		return;
	if (s->absent[sv->t])
		s->absent[d->t] = s->absent[sv->t];
	bool move = tcps_moves(s, pc, d->t), copy = move && s->data[sv->t] != NULL;
	tcp_dma_load dc;
	tcp_dma_load_init(&dc);
	int64_t sa0 = s->p->t[sv->t].addr, da0 = s->p->t[d->t].addr, rb = d->stride[2] == 1 && sv->stride[2] == 1 ? row * e : e;
	for (int64_t g = 0; g < G && !s->fault; g++)
		for (int64_t j = 0; j < n; j++) {
			if (j >= cnt || g >= gcnt) {
				if (gather && move && s->data[d->t])
					for (int64_t x = 0; x < row; x++)
						memset(s->data[d->t] + (db + g * d->stride[0] + j * d->stride[1] + x) * e, 0, (size_t)e);
				continue;
			}
			int32_t ix = s->pr ? (int32_t)tcps_pred_index(s, in, g, j, vrows ? n : cnt)
					   : (int32_t)load_word(s, iv->t, ib + g * iv->stride[0] + j * iv->stride[1]);
			if ((in->flags & TCP_F_HBMIDX) && !s->pr) { /* a byte offset of whole rows of the HBM side */
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
			if (s->lz && gather && !tcps_fill(s, pc, sv->t, sa, sa + (row - 1) * sv->stride[2]))
				return;
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
	dc.requests = (moved ? moved : 1) * (row * e / rb) * tcp_dma_requests(&s->cm, rb);
	tcp_meter_dm_sides(&s->mt, &dc, d, dlo, dhi, sv, slo, shi, (moved ? moved : 1) * row * e);
	tcps_schedule(s, pc, &a, dma_time(s, &dc, s->p->t[d->t].space == TCP_DM && s->p->t[sv->t].space == TCP_DM, G * n));
}

/* Stages up to three i32 views into SPM, one descriptor each on its own
 * engine (they run side by side): the run-time scalars the control path reads
 * with ld (docs/tcp-model.md section 6). */
void tcps_run_dma_spm(sim *s, uint32_t pc, const tcp_insn *in)
{
	int64_t lo[TCP_NVIEW], hi[TCP_NVIEW], n = 1, most = 0;
	acc a = {0};
	tcp_dma_load dc;
	tcp_dma_load_init(&dc);
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
		dc.eng++;
		dc.requests += tcp_dma_requests(&s->cm, el * 4);
		dma_runs(s, &dc, v, in->ndim, in->dim, 4, false);
	}
	dc.bytes = most * dc.eng;
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
	tcps_staged(s, pc, in);
}

/* The bytes of a sub load's source view (elements [lo, hi] of a DM tensor,
 * n elements read) that one slice holding them holds: the distinct bytes
 * over the slices they lie in (tcp_meter_slices). */
static int64_t sub_own_bytes(const sim *s, const tcp_view *v, int64_t lo, int64_t hi, int64_t n)
{
	int64_t first, ns, P, e = esz_of(s, v->t), bytes = (hi - lo + 1 < n ? hi - lo + 1 : n) * e;
	if (s->p->t[v->t].space != TCP_DM)
		return bytes;
	tcp_meter_slices(&s->mt, v->t, lo * e, (hi + 1) * e - 1, &first, &ns, &P);
	int64_t own = cdiv(bytes, ns), most = tcp_slice_holds(s->m, &s->p->t[v->t], 0);
	return own < most ? own : most;
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
	if (tcps_computes(s, pc))
		copy_elems(s, pc, in, d, sv, e, db, sb);
	/* every slice loads its footprint of the tile: what its own DM holds at
	 * the sub context's read width, the rest over the switch (flags=xslice);
	 * a load without the switch reads only what its slice holds (the
	 * validator checks it: docs/tcp-isa.md section 9) */
	int64_t per = s->p->t[d->t].slice_bytes;
	int64_t own = (in->flags & TCP_F_SWITCH) ? sub_own_bytes(s, sv, slo, shi, n) : per;
	s->hold_main = own < per && !s->m->sub_switch_concurrent;
	acc a = {0};
	acc_add(&a, d->t, dlo, dhi, true);
	acc_add(&a, sv->t, slo, shi, false);
	tcps_schedule(s, pc, &a, tcp_cost_sub(&s->cm, per, own));
	s->hold_main = false;
}
