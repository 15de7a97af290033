/* backend-tcp/sim.c: the instruction-level simulator.
 *
 * Functional: instructions run in program order on per-tensor storage; the
 * hazard scheduler below guarantees that the timed, concurrent execution
 * would observe the same values. Numerics: the vector engine works on 32-bit
 * lane words (i32 or f32); float ALUs flush subnormal inputs and results to
 * signed zero and return the canonical NaN 0x7fc00000; the contraction
 * multiplies bf16 operands (f32 operands as a bf16x3 split) and accumulates
 * in f32 in index order.
 * Timing (MODEL.md section 4): the control processor issues instructions in
 * order; each command starts when its context is free, the control processor
 * has issued it and every earlier command touching an overlapping region with
 * a read/write hazard has finished. Program time is the latest finish. */
#include <math.h>
#include <string.h>

#include "backend-tcp/tcp_int.h"
#include "ir/scalar.h"
#include "backend-tcp/sim_quant.h"
#include "moec/io.h"

#define NHAZ 8
#define TCP_MAX_CYCLES ((int64_t)1 << 60)
typedef struct haz_rec {
	int64_t lo, hi, end;
	bool write;
} haz_rec;
typedef struct haz {
	haz_rec r[NHAZ];
	int n;
	int64_t floor_w, floor_r; /* conservative summary of evicted records */
} haz;

typedef struct tev {
	int ctx;
	uint8_t op;
	uint32_t pc;
	int64_t start, end;
} tev;

typedef struct sim {
	moe_ctx *ctx;
	const tcp_program *p;
	const moe_tcp_machine *m;
	const moe_tcp_run_opts *o;
	uint8_t **data;  /* per tensor */
	bool *borrowed;  /* bound inputs/weights are read in place */
	/* Timing-only runs may bind weights without data (absent from the
	 * checkpoint): absent[t] marks tensors whose values derive from one.
	 * Copies carry the mark (the index of that weight + 1); a computation that
	 * needs such values faults. */
	int32_t *absent;
	haz *hz;
	int64_t reg[TCP_NREG];
	int64_t tc, cfree[TCP_NCTX], tok[TCP_NTOK];
	int64_t dma_start; /* when the last DMA command started (a joined one sets up beside it) */
	moe_tcp_stats *st;
	tev *ev;
	size_t nev, evcap;
	bool fault;
	bool cycles_overflow; /* a command's duration or end passed TCP_MAX_CYCLES */
	int64_t S;
	double hbm_bpc; /* the one HBM pool, bytes per cycle */
	uint8_t *seen; /* experts whose blocks ran */
	/* SPM: per tensor, the element range staged by dma.spm and when it
	 * arrived (-1: none); `ld` reads only staged elements */
	int64_t (*spm)[3];
	/* expert work: the block loop and the fetch before it, pc in [xlo, xhi];
	 * the wall-clock intervals of its commands */
	int64_t xlo, xhi;
	int64_t nblocks; /* the run-time block count, once loaded */
	int64_t (*xiv)[2];
	size_t nxiv, xivcap;
} sim;

static bool in_experts(const sim *s, uint32_t pc)
{
	return (int64_t)pc >= s->xlo && (int64_t)pc <= s->xhi;
}

/* Counters saturate at TCP_MAX_CYCLES; reaching it stops the run with a fault. */
static void acc_sat(sim *s, int64_t *acc, int64_t v)
{
	if (v > TCP_MAX_CYCLES - *acc) {
		*acc = TCP_MAX_CYCLES;
		s->cycles_overflow = true;
	} else {
		*acc += v;
	}
}

/* busy cycles of an engine, also counted as routing outside the expert region */
static void busy(sim *s, uint32_t pc, int engine, int64_t cycles)
{
	acc_sat(s, &s->st->busy_cycles[engine], cycles);
	if (!in_experts(s, pc))
		acc_sat(s, &s->st->routing_busy_cycles[engine], cycles);
}

#define FAULT(s, pc, ...)                                                                                  \
	do {                                                                                                 \
		char _m[400];                                                                                    \
		snprintf(_m, sizeof _m, __VA_ARGS__);                                                            \
		moe_diag((s)->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp run-time fault at instruction %u (%s): %s", \
			(unsigned)(pc), tcp_op_names[(s)->p->code[pc].op], _m);                                       \
		(s)->fault = true;                                                                               \
	} while (0)

/* ---- lane words ---- */
static float w2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint32_t f2w(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float flush(float f)
{
	if (f != 0 && fabsf(f) < 1.17549435e-38f)
		return copysignf(0.0f, f);
	return f;
}

/* flush() without the branch on zero (fabsf(0) < FLT_MIN gives copysign(0, 0)
 * = the same zero): the contraction's inner loop vectorizes */
static inline float flush_fast(float f)
{
	return fabsf(f) < 1.17549435e-38f ? copysignf(0.0f, f) : f;
}

static uint32_t fres(float f)
{
	if (isnan(f))
		return 0x7fc00000u;
	return f2w(flush(f));
}

static float fin(uint32_t u)
{
	return flush(w2f(u));
}

static uint32_t load_word(const sim *s, int32_t t, int64_t i)
{
	const uint8_t *d = s->data[t];
	switch (s->p->t[t].dtype) {
	case MOE_BF16: {
		uint16_t h;
		memcpy(&h, d + 2 * i, 2);
		return (uint32_t)h << 16;
	}
	case MOE_BOOL: return d[i] ? 1u : 0u;
	case MOE_F8E4M3: return tcpq_bits(qt_e4m3(d[i])); /* the fetch widens f8 to f32 */
	case MOE_U8: return d[i];
	default: {
		uint32_t u;
		memcpy(&u, d + 4 * i, 4);
		return u;
	}
	}
}

static void store_word(sim *s, int32_t t, int64_t i, uint32_t w)
{
	uint8_t *d = s->data[t];
	switch (s->p->t[t].dtype) {
	case MOE_BF16: {
		uint16_t h = moe_f32_to_bf16(w2f(w));
		memcpy(d + 2 * i, &h, 2);
		break;
	}
	case MOE_BOOL: d[i] = w != 0; break;
	case MOE_F8E4M3: d[i] = tcpq_to_e4m3(w2f(w)); break; /* the cast stage narrows f32 to f8 */
	case MOE_U8: d[i] = (uint8_t)w; break;
	default: memcpy(d + 4 * i, &w, 4); break;
	}
}

static int64_t esz_of(const sim *s, int32_t t)
{
	return (int64_t)moe_dtype_size((moe_dtype)s->p->t[t].dtype);
}

/* ---- views ---- */
static int64_t vbase(const sim *s, const tcp_view *v)
{
	return v->base + (v->reg >= 0 ? s->reg[v->reg] * v->scale : 0);
}

/* The element range a view touches, checked against its tensor. */
static bool vrange(sim *s, uint32_t pc, const tcp_view *v, int nd, const int64_t *dim, int64_t *lo, int64_t *hi)
{
	int64_t a = vbase(s, v), b = a;
	for (int k = 0; k < nd; k++) {
		int64_t x = v->stride[k] * (dim[k] - 1);
		if (x < 0)
			a += x;
		else
			b += x;
	}
	*lo = a;
	*hi = b;
	const tcp_tensor *t = &s->p->t[v->t];
	if (a < 0 || b >= t->numel) {
		FAULT(s, pc, "%s overflow: elements [%lld, %lld] outside tensor '%s' (%lld elements)",
			t->space == TCP_HBM ? "HBM" : t->space == TCP_DM ? "DM" : t->space == TCP_TRF ? "TRF" : "VRF",
			(long long)a, (long long)b, t->name, (long long)t->numel);
		return false;
	}
	return true;
}

/* vrange for a view in 4-bit elements of its tensor's bytes; lo, hi in elements of the tensor. */
static bool nib_range(sim *s, uint32_t pc, const tcp_view *v, int nd, const int64_t *dim, int64_t *lo, int64_t *hi)
{
	tcp_view b = *v;
	int64_t per = 2 * esz_of(s, v->t), a = vbase(s, v), z = a;
	for (int k = 0; k < nd; k++) {
		int64_t x = v->stride[k] * (dim[k] - 1);
		*(x < 0 ? &a : &z) += x;
	}
	if (a < 0 || z >= s->p->t[v->t].numel * per) {
		b.reg = -1;
		b.base = a < 0 ? a : s->p->t[v->t].numel; /* reported as an overflow by vrange */
		return vrange(s, pc, &b, 0, dim, lo, hi);
	}
	*lo = a / per;
	*hi = z / per;
	return true;
}

/* ---- hazards ---- */
static int64_t haz_wait(const sim *s, int32_t t, int64_t lo, int64_t hi, bool write)
{
	const haz *h = &s->hz[t];
	int64_t w = write ? (h->floor_w > h->floor_r ? h->floor_w : h->floor_r) : h->floor_w;
	for (int i = 0; i < h->n; i++) {
		const haz_rec *r = &h->r[i];
		if (r->hi < lo || r->lo > hi || (!write && !r->write))
			continue;
		if (r->end > w)
			w = r->end;
	}
	return w;
}

static void haz_note(sim *s, int32_t t, int64_t lo, int64_t hi, bool write, int64_t end)
{
	haz *h = &s->hz[t];
	if (h->n == NHAZ) {
		/* evict the earliest-ending record into the floor */
		int k = 0;
		for (int i = 1; i < h->n; i++)
			if (h->r[i].end < h->r[k].end)
				k = i;
		if (h->r[k].write)
			h->floor_w = h->floor_w > h->r[k].end ? h->floor_w : h->r[k].end;
		else
			h->floor_r = h->floor_r > h->r[k].end ? h->floor_r : h->r[k].end;
		h->r[k] = h->r[--h->n];
	}
	h->r[h->n++] = (haz_rec){lo, hi, end, write};
}

typedef struct acc {
	int32_t t[6];
	int64_t lo[6], hi[6];
	bool w[6];
	int n;
} acc;

static void acc_add(acc *a, int32_t t, int64_t lo, int64_t hi, bool w)
{
	a->t[a->n] = t;
	a->lo[a->n] = lo;
	a->hi[a->n] = hi;
	a->w[a->n++] = w;
}

static void event(sim *s, uint32_t pc, int ctx, int64_t start, int64_t end)
{
	if (!s->o->trace_path || s->nev >= 2000000)
		return;
	if (s->nev == s->evcap) {
		size_t nc = s->evcap ? s->evcap * 2 : 4096;
		tev *ne = realloc(s->ev, nc * sizeof *ne);
		if (!ne)
			return;
		s->ev = ne;
		s->evcap = nc;
	}
	s->ev[s->nev++] = (tev){ctx, s->p->code[pc].op, pc, start, end};
}

/* Schedule a command of `dur` cycles in its context after its hazards;
 * `dur_sub_busy` when the sub context is still busy at its start (a tensor
 * pass whose fetch then cannot use the dual channel). */
static void schedule_alt(sim *s, uint32_t pc, const acc *a, int64_t dur, int64_t dur_sub_busy)
{
	int ctx = tcp_op_ctx[s->p->code[pc].op];
	/* a joined DMA sets up beside the command it joins: only its transfer
	 * (and issue) follows that command's end */
	bool join = ctx == TCP_CTX_DMA && (s->p->code[pc].flags & TCP_F_JOIN);
	int64_t prev_end = s->cfree[ctx];
	s->tc += s->m->scalar_cycles;
	int64_t start = s->tc > (join ? s->dma_start : s->cfree[ctx]) ? s->tc : (join ? s->dma_start : s->cfree[ctx]);
	for (int i = 0; i < a->n; i++) {
		int64_t w = haz_wait(s, a->t[i], a->lo[i], a->hi[i], a->w[i]);
		if (w > start)
			start = w;
	}
	if (s->cfree[TCP_CTX_SUB] > start)
		dur = dur_sub_busy;
	dur += s->m->issue_cycles;
	if (dur > TCP_MAX_CYCLES - start) {
		s->cycles_overflow = true;
		dur = TCP_MAX_CYCLES - start;
	}
	int64_t end = start + dur;
	if (join && end < prev_end + dur - s->m->dma_setup)
		end = prev_end + dur - s->m->dma_setup;
	if (ctx == TCP_CTX_DMA)
		s->dma_start = start;
	s->cfree[ctx] = end;
	for (int i = 0; i < a->n; i++)
		haz_note(s, a->t[i], a->lo[i], a->hi[i], a->w[i], end);
	busy(s, pc, ctx == TCP_CTX_MAIN ? MOE_TCP_ENGINE_MAIN : ctx == TCP_CTX_SUB ? MOE_TCP_ENGINE_SUB : MOE_TCP_ENGINE_DMA,
		dur);
	if (in_experts(s, pc)) {
		if (s->nxiv == s->xivcap) {
			size_t nc = s->xivcap ? s->xivcap * 2 : 1024;
			int64_t(*ni)[2] = realloc(s->xiv, nc * sizeof *ni);
			if (!ni) {
				FAULT(s, pc, "out of host memory");
				return;
			}
			s->xiv = ni;
			s->xivcap = nc;
		}
		s->xiv[s->nxiv][0] = start;
		s->xiv[s->nxiv++][1] = end;
	}
	s->st->commands++;
	event(s, pc, ctx, start, end);
}

static void schedule(sim *s, uint32_t pc, const acc *a, int64_t dur)
{
	schedule_alt(s, pc, a, dur, dur);
}

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* Bytes per cycle a fetch or commit sequencer moves for a view over dims:
 * min(max_fetch_bytes, the largest power of two dividing the contiguous run
 * in bytes); *elems is how many elements it reads (a stride-0 innermost loop
 * re-reads one element per row, fetched once). */
static int64_t read_size(const sim *s, const tcp_view *v, int nd, const int64_t *dim, int64_t e, int64_t *elems)
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
	while (rs < s->m->fetch_bytes && b % (rs * 2) == 0)
		rs *= 2;
	return rs;
}

/* ---- DMA ---- */
static bool writable(sim *s, uint32_t pc, int32_t t)
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
 * engine for the rows it moves. */
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
static bool needs_values(sim *s, uint32_t pc, int32_t t)
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
static bool computes(const sim *s, uint32_t pc)
{
	return !(s->o->timing_only && s->p->block_body_pc >= 0 && (int32_t)pc >= s->p->block_body_pc);
}

/* Before a pass computes: its sources must have values; its destination gets
 * fresh ones. False after a fault. */
static bool take_values(sim *s, uint32_t pc, const tcp_insn *in)
{
	for (int w = 0; w < TCP_NVIEW; w++)
		if (w != TCP_V_DST && !needs_values(s, pc, in->v[w].t))
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

static void run_dma_copy(sim *s, uint32_t pc, const tcp_insn *in)
{
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t dlo, dhi, slo, shi;
	if (!vrange(s, pc, d, in->ndim, in->dim, &dlo, &dhi) || !vrange(s, pc, sv, in->ndim, in->dim, &slo, &shi) ||
		!writable(s, pc, d->t))
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
	schedule(s, pc, &a, dma_time(s, &dc, s->p->t[d->t].space == TCP_DM && s->p->t[sv->t].space == TCP_DM, 1));
}

static void run_dma_gs(sim *s, uint32_t pc, const tcp_insn *in)
{
	bool gather = in->op == TCP_OP_DMA_GATHER;
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0], *iv = &in->v[TCP_V_S1];
	int64_t G = in->dim[0], n = in->dim[1], row = in->dim[2], rows = in->rows;
	int64_t d3[3] = {G, gather ? n : rows, row}, s3[3] = {G, gather ? rows : n, row};
	int64_t dlo, dhi, slo, shi, ilo, ihi;
	if (!vrange(s, pc, d, 3, d3, &dlo, &dhi) || !vrange(s, pc, sv, 3, s3, &slo, &shi) ||
		!vrange(s, pc, iv, 2, in->dim, &ilo, &ihi) || !writable(s, pc, d->t))
		return;
	int64_t cnt = in->vreg >= 0 ? s->reg[in->vreg] : n;
	int64_t e = esz_of(s, d->t), db = vbase(s, d), sb = vbase(s, sv), ib = vbase(s, iv), moved = 0;
	if (!needs_values(s, pc, iv->t))
		return;
	if (s->absent[sv->t])
		s->absent[d->t] = s->absent[sv->t];
	bool copy = s->data[sv->t] != NULL;
	dmac dc = {0, 0, 0, 0, 0};
	int64_t sa0 = s->p->t[sv->t].addr, da0 = s->p->t[d->t].addr, rb = d->stride[2] == 1 && sv->stride[2] == 1 ? row * e : e;
	for (int64_t g = 0; g < G && !s->fault; g++)
		for (int64_t j = 0; j < n; j++) {
			if (j >= cnt) {
				if (gather)
					for (int64_t x = 0; x < row; x++)
						memset(s->data[d->t] + (db + g * d->stride[0] + j * d->stride[1] + x) * e, 0, (size_t)e);
				continue;
			}
			int32_t ix = (int32_t)load_word(s, iv->t, ib + g * iv->stride[0] + j * iv->stride[1]);
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
	schedule(s, pc, &a, dma_time(s, &dc, s->p->t[d->t].space == TCP_DM && s->p->t[sv->t].space == TCP_DM, G * n));
}

/* Stages up to three i32 views into SPM, one descriptor each on its own
 * engine (they run side by side): the run-time scalars the control path reads
 * with ld (MODEL.md section 3). */
static void run_dma_spm(sim *s, uint32_t pc, const tcp_insn *in)
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
		if (!vrange(s, pc, v, in->ndim, in->dim, &lo[w], &hi[w]) || !needs_values(s, pc, v->t))
			return;
		acc_add(&a, v->t, lo[w], hi[w], false);
		int64_t el = hi[w] - lo[w] + 1 < n ? hi[w] - lo[w] + 1 : n;
		most = el * 4 > most ? el * 4 : most;
		dc.packets++;
		dma_runs(s, &dc, v, in->ndim, in->dim, 4, false);
	}
	dc.bytes = most * dc.packets;
	schedule(s, pc, &a, dma_time(s, &dc, false, 1));
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
	}
}

static void run_sub(sim *s, uint32_t pc, const tcp_insn *in)
{
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t dlo, dhi, slo, shi;
	if (!vrange(s, pc, d, in->ndim, in->dim, &dlo, &dhi) || !vrange(s, pc, sv, in->ndim, in->dim, &slo, &shi))
		return;
	int64_t e = esz_of(s, d->t), n = 1;
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	int64_t db = vbase(s, d), sb = vbase(s, sv);
	(void)n;
	if (computes(s, pc))
		copy_elems(s, in, d, sv, e, db, sb);
	/* every slice reads its footprint of the tile from DM: TRF through
	 * Collect at trf_load_bytes_per_cycle_per_slice (assumed), VRF at the
	 * sub context's read width */
	int64_t per = s->p->t[d->t].slice_bytes;
	int64_t rate = in->op == TCP_OP_SUB_TRF ? s->m->trf_load_bytes : s->m->sub_read_bytes;
	acc a = {0};
	acc_add(&a, d->t, dlo, dhi, true);
	acc_add(&a, sv->t, slo, shi, false);
	schedule(s, pc, &a, cdiv(per, rate) + s->m->fill_drain);
}

/* ---- vector engine ---- */
static int32_t iw(uint32_t u)
{
	int32_t i;
	memcpy(&i, &u, 4);
	return i;
}

static uint32_t wi(int32_t i)
{
	uint32_t u;
	memcpy(&u, &i, 4);
	return u;
}

/* One element-wise ALU op (not reduce/scan/compact/merge). */
static bool alu(sim *s, uint32_t pc, int op, uint32_t x, uint32_t y, uint32_t *v, bool *tag)
{
	int32_t a = iw(x), b = iw(y);
	float fa = fin(x), fb = fin(y);
	switch (op) {
	case TCP_V_TEQ: *tag = a == b; break;
	case TCP_V_TNE: *tag = a != b; break;
	case TCP_V_TLT: *tag = a < b; break;
	case TCP_V_TLE: *tag = a <= b; break;
	case TCP_V_TGT: *tag = a > b; break;
	case TCP_V_TGE: *tag = a >= b; break;
	case TCP_V_FTEQ: *tag = fa == fb; break;
	case TCP_V_FTNE: *tag = !(fa == fb); break;
	case TCP_V_FTLT: *tag = fa < fb; break;
	case TCP_V_FTLE: *tag = fa <= fb; break;
	case TCP_V_FTGT: *tag = fa > fb; break;
	case TCP_V_FTGE: *tag = fa >= fb; break;
	case TCP_V_AND: *v = x & y; return true;
	case TCP_V_OR: *v = x | y; return true;
	case TCP_V_XOR: *v = x ^ y; return true;
	case TCP_V_SHL: *v = x << (y & 31); return true;
	case TCP_V_SHR: *v = x >> (y & 31); return true;
	case TCP_V_SAR: *v = (y & 31) ? (x >> (y & 31)) | (a < 0 ? ~(0xffffffffu >> (y & 31)) : 0) : x; return true;
	case TCP_V_IADD: *v = x + y; return true;
	case TCP_V_ISUB: *v = x - y; return true;
	case TCP_V_IMUL: *v = (uint32_t)((uint64_t)x * (uint64_t)y); return true;
	case TCP_V_IDIV:
		if (b == 0) {
			FAULT(s, pc, "integer division by zero");
			return false;
		}
		*v = (a == INT32_MIN && b == -1) ? x : wi(a / b);
		return true;
	case TCP_V_ITOF: *v = fres((float)a); return true;
	case TCP_V_FADD: *v = fres(fa + fb); return true;
	case TCP_V_FSUB: *v = fres(fa - fb); return true;
	case TCP_V_FMUL: *v = fres(fa * fb); return true;
	case TCP_V_FEXP: *v = fres(sc_exp(fa)); return true;
	case TCP_V_FLOG: *v = fres(sc_log(fa)); return true;
	case TCP_V_FSQRT: *v = fres(sc_sqrt(fa)); return true;
	case TCP_V_FTANH: *v = fres(sc_tanh(fa)); return true;
	case TCP_V_FERF: *v = fres(sc_erf(fa)); return true;
	case TCP_V_FSIGM: *v = fres(sc_sigmoid(fa)); return true;
	case TCP_V_FNEG: *v = fres(-fa); return true;
	case TCP_V_FABS: *v = fres(fabsf(fa)); return true;
	case TCP_V_FDIV: *v = fres(fa / fb); return true;
	case TCP_V_FTOI: *v = wi(sc_f2i(fa)); return true;
	case TCP_V_IMIN: *v = a < b ? x : y; return true;
	case TCP_V_IMAX: *v = a > b ? x : y; return true;
	case TCP_V_FMIN: *v = fres(sc_fmin(fa, fb)); return true;
	case TCP_V_FMAX: *v = fres(sc_fmax(fa, fb)); return true;
	default: return true;
	}
	*v = *tag ? 1u : 0u;
	return true;
}

static uint32_t src_word(const tcp_step *st, int which, uint32_t v, const uint32_t *sw, const int64_t *idx)
{
	switch (which) {
	case TCP_SRC_V: return v;
	case TCP_SRC_S0: return sw[0];
	case TCP_SRC_S1: return sw[1];
	case TCP_SRC_S2: return sw[2];
	case TCP_SRC_IMM: return st->imm;
	case TCP_SRC_CTR: return (uint32_t)idx[st->ctr];
	default: return 0;
	}
}

static bool is_rowop(int op)
{
	return tcp_vop_stage[op] == TCP_ST_REDUCE || op == TCP_V_ISCAN || op == TCP_V_FSCAN || op == TCP_V_COMPACT;
}

static void run_vec(sim *s, uint32_t pc, const tcp_insn *in)
{
	const moe_tcp_machine *m = s->m;
	int nd = in->ndim;
	int64_t lo[TCP_NVIEW], hi[TCP_NVIEW];
	acc a = {0};
	unsigned nib = in->flags & (TCP_F_E2M1 | TCP_F_I4); /* s0 in 4-bit elements */
	for (int w = 0; w < TCP_NVIEW; w++) {
		if (in->v[w].t < 0)
			continue;
		if (!(nib && w == TCP_V_S0 ? nib_range(s, pc, &in->v[w], nd, in->dim, &lo[w], &hi[w])
					   : vrange(s, pc, &in->v[w], nd, in->dim, &lo[w], &hi[w])))
			return;
		acc_add(&a, in->v[w].t, lo[w], hi[w], w == TCP_V_DST);
	}
	if (!writable(s, pc, in->v[TCP_V_DST].t))
		return;
	int rop = -1;
	bool fl = false;
	for (int i = 0; i < in->nstep; i++) {
		if (is_rowop(in->step[i].op))
			rop = i;
		int stg = tcp_vop_stage[in->step[i].op];
		if (stg >= TCP_ST_FXP2FP && stg <= TCP_ST_FP2FXP)
			fl = true;
		if (in->step[i].op >= TCP_V_FTEQ && in->step[i].op <= TCP_V_FTGE)
			fl = true;
		if (in->step[i].op == TCP_V_FMIN || in->step[i].op == TCP_V_FMAX)
			fl = true;
	}
	int64_t n = 1;
	for (int k = 0; k < nd; k++)
		n *= in->dim[k];
	int64_t L = nd ? in->dim[nd - 1] : 1;
	int64_t cnt = in->vreg >= 0 ? s->reg[in->vreg] : INT64_MAX;
	bool compute = computes(s, pc);
	if (compute && !take_values(s, pc, in))
		return;
	int64_t vb[TCP_NVIEW];
	for (int w = 0; w < TCP_NVIEW; w++)
		vb[w] = in->v[w].t >= 0 ? vbase(s, &in->v[w]) : 0;
	const tcp_view *dv = &in->v[TCP_V_DST];
	int64_t idx[TCP_MAXD] = {0};
	uint32_t racc = 0, keep_n = 0;
	uint32_t *kept = NULL;
	if (rop >= 0 && in->step[rop].op == TCP_V_COMPACT && compute) {
		kept = malloc(sizeof *kept * (size_t)L);
		if (!kept) {
			FAULT(s, pc, "out of host memory");
			return;
		}
	}
	for (int64_t e = 0; e < n && compute && !s->fault; e++) {
		int64_t off[TCP_NVIEW];
		for (int w = 0; w < TCP_NVIEW; w++) {
			off[w] = vb[w];
			if (in->v[w].t >= 0)
				for (int k = 0; k < nd; k++)
					off[w] += idx[k] * in->v[w].stride[k];
		}
		uint32_t sw[3];
		for (int w = 0; w < 3; w++)
			sw[w] = in->v[w + 1].t < 0 ? 0
				: nib && w == 0 ? tcpq_nibble_word(s->data[in->v[1].t], off[1], nib)
						: load_word(s, in->v[w + 1].t, off[w + 1]);
		bool masked = nd > 0 && idx[0] >= cnt;
		int64_t j = nd ? idx[nd - 1] : 0;
		bool first = j == 0, lastel = j == L - 1;
		uint32_t v = in->v[TCP_V_S0].t >= 0 ? sw[0] : 0;
		bool tag = false, out_now = true;
		for (int i = 0; i < in->nstep && !s->fault; i++) {
			const tcp_step *st = &in->step[i];
			uint32_t x = src_word(st, st->x, v, sw, idx), y = src_word(st, st->y, v, sw, idx);
			if (i == rop) {
				switch (st->op) {
				case TCP_V_RSUM: racc = first ? x : racc + x; break;
				case TCP_V_RMAX: racc = first || iw(x) > iw(racc) ? x : racc; break;
				case TCP_V_RMIN: racc = first || iw(x) < iw(racc) ? x : racc; break;
				case TCP_V_FRSUM: racc = first ? fres(fin(x)) : fres(fin(racc) + fin(x)); break;
				case TCP_V_FRMAX: racc = first ? fres(fin(x)) : fres(sc_fmax(fin(racc), fin(x))); break;
				case TCP_V_FRMIN: racc = first ? fres(fin(x)) : fres(sc_fmin(fin(racc), fin(x))); break;
				case TCP_V_ISCAN:
				case TCP_V_FSCAN: {
					uint32_t prev = first ? (st->op == TCP_V_ISCAN ? 0u : 0u) : racc;
					uint32_t nx = st->op == TCP_V_ISCAN ? (first ? x : racc + x)
									    : (first ? fres(fin(x)) : fres(fin(racc) + fin(x)));
					racc = nx;
					v = (st->flags & TCP_STEP_EXCL) ? prev : nx;
					continue;
				}
				case TCP_V_COMPACT:
					if (first)
						keep_n = 0;
					if (tag)
						kept[keep_n++] = x;
					out_now = false;
					if (lastel) {
						/* the row's kept values go to the front, the rest is the fill */
						int64_t rowoff = off[TCP_V_DST] - j * dv->stride[nd - 1];
						for (int64_t q = 0; q < L; q++)
							store_word(s, dv->t, rowoff + q * dv->stride[nd - 1],
								masked ? 0 : q < keep_n ? kept[q] : st->imm);
					}
					continue;
				default: break;
				}
				if (!lastel) {
					out_now = false;
					break;
				}
				v = racc;
				continue;
			}
			if (st->op == TCP_V_MERGE) {
				v = tag ? x : y;
				continue;
			}
			alu(s, pc, st->op, x, y, &v, &tag);
		}
		if (out_now)
			store_word(s, dv->t, off[TCP_V_DST], masked ? 0 : v);
		for (int k = nd - 1; k >= 0 && ++idx[k] == in->dim[k]; k--)
			idx[k] = 0;
	}
	free(kept);
	/* cost: rows (for row ops) or flits spread over the slices */
	int64_t S = s->S, units = rop >= 0 ? n / L : cdiv(n, m->flit_bytes / 4), per = rop >= 0 ? L : m->flit_bytes / 4;
	int64_t used = units < S ? units : S;
	int64_t pe = cdiv(units, used) * per;
	int64_t rate = fl ? m->vec_float_rate : m->vec_int_rate;
	int64_t comp = cdiv(pe, rate) + in->nstep * m->alu_latency;
	/* fetch: each DM stream at its read size; two or more streams share one
	 * channel, or use the dual channel when the sub context is idle */
	int64_t fsum = 0, fmax = 0, ns = 0;
	for (int w = 1; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && s->p->t[in->v[w].t].space == TCP_DM) {
			bool n4 = nib && w == TCP_V_S0; /* 4-bit elements: half a byte each */
			int64_t el = pe, e = n4 ? 1 : esz_of(s, in->v[w].t), rs = read_size(s, &in->v[w], nd, in->dim, e, &el);
			int64_t cyc = n4 ? cdiv(cdiv(el, 2), rs) : cdiv(el * e, rs);
			fsum += cyc;
			fmax = cyc > fmax ? cyc : fmax;
			ns++;
		}
	int64_t fdual = ns > 1 ? cdiv(fsum * m->fetch_bytes, m->dual_fetch_bytes) : fsum;
	fdual = fdual > fmax ? fdual : fmax;
	int64_t outs = rop >= 0 && tcp_vop_stage[in->step[rop].op] == TCP_ST_REDUCE ? pe / L : pe, ol = outs;
	int64_t crs = read_size(s, dv, rop >= 0 && tcp_vop_stage[in->step[rop].op] == TCP_ST_REDUCE ? nd - 1 : nd,
		in->dim, esz_of(s, dv->t), &ol);
	int64_t commit = cdiv(outs * esz_of(s, dv->t), crs);
	int64_t t = comp > commit ? comp : commit, tail = m->fill_drain + ((in->flags & TCP_F_XSLICE) ? m->inter_slice_reduce : 0);
	busy(s, pc, MOE_TCP_ENGINE_VECTOR, comp);
	schedule_alt(s, pc, &a, (t > fdual ? t : fdual) + tail, (t > fsum ? t : fsum) + tail);
}

/* ---- contraction ---- */
/* x = hi + lo (+ a remainder below bf16x3's precision). A finite x next to
 * FLT_MAX, which bf16 rounding would carry to inf, is split from its
 * truncation instead; inf and NaN are hi alone. */
static void split3(float x, float *hi, float *lo)
{
	*hi = moe_bf16_to_f32(moe_f32_to_bf16(x));
	if (isinf(*hi) && isfinite(x)) {
		uint32_t u;
		memcpy(&u, &x, 4);
		u &= 0xffff0000u;
		memcpy(hi, &u, 4);
	}
	*lo = isfinite(*hi) ? moe_bf16_to_f32(moe_f32_to_bf16(x - *hi)) : 0.0f;
}

/* One row of a scaled contraction (act=fp8): per 128-wide chunk of I, the
 * chunk's f32 sum of products times s2[r, o, chunk], added in chunk order.
 * sum holds 2 O floats (the total, then the chunk's sum). */
static void scaled_row(sim *s, const tcp_insn *in, int64_t r, const float *arow, const float *wt, float *sum, int64_t pb)
{
	int64_t O = in->dim[1], I = in->dim[2];
	const tcp_view *pv = &in->v[TCP_V_S2];
	float *part = sum + O;
	for (int64_t c0 = 0; c0 < I; c0 += TCP_SCALE_CHUNK) {
		for (int64_t o = 0; o < O; o++)
			part[o] = 0.0f;
		for (int64_t i = c0; i < c0 + TCP_SCALE_CHUNK && i < I; i++)
			for (int64_t o = 0; o < O; o++)
				part[o] = flush_fast(part[o] + arow[i] * wt[i * O + o]);
		for (int64_t o = 0; o < O; o++) {
			float sc = fin(load_word(s, pv->t, pb + r * pv->stride[0] + o * pv->stride[1] +
								 c0 / TCP_SCALE_CHUNK * pv->stride[2]));
			sum[o] = flush_fast(sum[o] + flush_fast(part[o] * sc));
		}
	}
}

static void run_contract(sim *s, uint32_t pc, const tcp_insn *in)
{
	const moe_tcp_machine *m = s->m;
	int64_t M = in->dim[0], O = in->dim[1], I = in->dim[2];
	acc a = {0};
	int64_t lo, hi;
	for (int w = 0; w < TCP_NVIEW; w++) {
		if (in->v[w].t < 0)
			continue;
		int64_t d[3] = {w == TCP_V_S1 ? 1 : M, w == TCP_V_S0 ? 1 : O, (w == TCP_V_S0 || w == TCP_V_S1) ? I : 1};
		if (w == TCP_V_S2 && (in->flags & TCP_F_SCALED))
			d[2] = I / TCP_SCALE_CHUNK; /* one scale per (row, output, chunk) */
		if (!vrange(s, pc, &in->v[w], 3, d, &lo, &hi))
			return;
		acc_add(&a, in->v[w].t, lo, hi, w == TCP_V_DST);
	}
	if (!writable(s, pc, in->v[TCP_V_DST].t))
		return;
	bool x3 = in->flags & TCP_F_BF16X3;
	int64_t cnt = in->vreg >= 0 ? s->reg[in->vreg] : M;
	bool compute = computes(s, pc);
	if (compute && !take_values(s, pc, in))
		return;
	const tcp_view *dv = &in->v[TCP_V_DST], *av = &in->v[TCP_V_S0], *wv = &in->v[TCP_V_S1], *pv = &in->v[TCP_V_S2];
	int64_t db = vbase(s, dv), ab = vbase(s, av), wb = vbase(s, wv), pb = pv->t >= 0 ? vbase(s, pv) : 0;
	/* The stationary tile is unpacked once, transposed to [i][o] (hi and lo
	 * parts for bf16x3), so each row's O running sums advance together; every
	 * sum still adds its products in index order, as the hardware's
	 * accumulator does. */
	size_t wn = (size_t)(compute ? O * I : 0);
	float *wt = compute ? malloc(sizeof(float) * (x3 ? 2 : 1) * (wn ? wn : 1)) : NULL;
	float *arow = compute ? malloc(sizeof(float) * 2 * (size_t)(I ? I : 1)) : NULL;
	float *sum = compute ? malloc(sizeof(float) * 2 * (size_t)(O ? O : 1)) : NULL;
	if (compute && (!wt || !arow || !sum)) {
		free(wt);
		free(arow);
		free(sum);
		FAULT(s, pc, "out of host memory");
		return;
	}
	float *wlo = x3 && wt ? wt + wn : NULL;
	bool wfin = true; /* every stationary value finite: the three-product form is exact */
	for (int64_t o = 0; o < O && compute; o++)
		for (int64_t i = 0; i < I; i++) {
			float f = fin(load_word(s, wv->t, wb + o * wv->stride[1] + i * wv->stride[2]));
			if (x3)
				split3(f, &wt[i * O + o], &wlo[i * O + o]);
			else
				wt[i * O + o] = f;
			wfin &= isfinite(f) != 0;
		}
	for (int64_t r = 0; r < M && compute; r++) {
		if (r >= cnt) {
			for (int64_t o = 0; o < O; o++)
				store_word(s, dv->t, db + r * dv->stride[0] + o * dv->stride[1], 0);
			continue;
		}
		for (int64_t i = 0; i < I; i++) {
			float f = fin(load_word(s, av->t, ab + r * av->stride[0] + i * av->stride[2]));
			if (x3)
				split3(f, &arow[i], &arow[I + i]);
			else
				arow[i] = f;
		}
		for (int64_t o = 0; o < O; o++)
			sum[o] = (in->flags & TCP_F_ACC) ? fin(load_word(s, pv->t, pb + r * pv->stride[0] + o * pv->stride[1])) : 0.0f;
		if (in->flags & TCP_F_SCALED) {
			scaled_row(s, in, r, arow, wt, sum, pb);
			for (int64_t o = 0; o < O; o++)
				store_word(s, dv->t, db + r * dv->stride[0] + o * dv->stride[1], fres(sum[o]));
			continue;
		}
		for (int64_t i = 0; i < I; i++) {
			const float a = arow[i], *w = wt + i * O;
			if (x3 && isfinite(a) && wfin) {
				const float al = arow[I + i], *wl = wlo + i * O;
				for (int64_t o = 0; o < O; o++)
					sum[o] = flush_fast(sum[o] + (a * w[o] + (a * wl[o] + al * w[o])));
			} else if (x3) {
				/* an inf or NaN operand: its product is hi x hi alone, as IEEE f32
				 * gives it (inf x finite = inf, inf x 0 = NaN); the cross terms
				 * would add inf x 0 = NaN */
				const float al = arow[I + i], *wl = wlo + i * O;
				for (int64_t o = 0; o < O; o++) {
					float pr = isfinite(a) && isfinite(w[o]) ? a * w[o] + (a * wl[o] + al * w[o]) : a * w[o];
					sum[o] = flush_fast(sum[o] + pr);
				}
			} else {
				for (int64_t o = 0; o < O; o++)
					sum[o] = flush_fast(sum[o] + a * w[o]);
			}
		}
		for (int64_t o = 0; o < O; o++)
			store_word(s, dv->t, db + r * dv->stride[0] + o * dv->stride[1], fres(sum[o]));
	}
	free(wt);
	free(arow);
	free(sum);
	/* cost: O split over column groups of `tile` rows each, rows over the remaining slices */
	int64_t S = s->S, Cg = cdiv(O, in->tile), R = S / Cg > 0 ? S / Cg : 1, Bs = cdiv(M, R);
	int64_t tiles = cdiv(Cg, S);
	int mt = s->p->t[av->t].dtype == MOE_F8E4M3 ? TCP_MT_F8 : TCP_MT_BF16; /* f8 x f8 at the fp8 rate */
	int64_t macs = Bs * in->tile * I * (x3 ? 3 : 1);
	int64_t mac = tiles * cdiv(macs, m->lanes_per_slice * m->macs_per_lane[mt]);
	int64_t ae = x3 ? 4 : mt == TCP_MT_F8 ? 1 : 2;
	int64_t stream = tiles * cdiv(Bs * I * ae, m->stream_bytes_per_cycle);
	int64_t sc_bytes = (in->flags & TCP_F_SCALED) ? 4 * (I / TCP_SCALE_CHUNK) : 0; /* the chunk scales read */
	int64_t commit = tiles * cdiv(Bs * in->tile * (esz_of(s, dv->t) + ((in->flags & TCP_F_ACC) ? 4 : 0) + sc_bytes),
		m->fetch_bytes);
	int64_t t = mac > stream ? mac : stream;
	t = t > commit ? t : commit;
	t += m->tree_latency[mt] + m->fill_drain;
	busy(s, pc, MOE_TCP_ENGINE_CONTRACTION, mac);
	schedule(s, pc, &a, t);
}

/* ---- the run ---- */
static moe_status write_trace(sim *s, const char *path)
{
	moe_atomic_file *af = moe_atomic_open(s->ctx, path);
	if (!af)
		return MOE_ERR_IO;
	FILE *f = moe_atomic_stream(af);
	double us = 1e6 / s->m->clock_hz;
	fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
	for (int c = 0; c < TCP_NCTX; c++)
		fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n", c,
			tcp_ctx_names[c]);
	for (size_t i = 0; i < s->nev; i++) {
		const tev *e = &s->ev[i];
		fprintf(f, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.4f,\"dur\":%.4f,\"args\":{\"pc\":%u}}%s\n",
			tcp_op_names[e->op], e->ctx, (double)e->start * us, (double)(e->end - e->start) * us, e->pc,
			i + 1 < s->nev ? "," : "");
	}
	fprintf(f, "]}\n");
	return moe_atomic_commit(af); /* reports its own error */
}

static bool bind(sim *s, const moe_tensor_map *b, const moe_tensor_map *packed)
{
	const tcp_program *p = s->p;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		size_t bytes = (size_t)t->numel * moe_dtype_size((moe_dtype)t->dtype);
		if (t->kind == TCP_T_INPUT || t->kind == TCP_T_WEIGHT || t->kind == TCP_T_PACKED) {
			const moe_tensor_map *from = t->kind == TCP_T_PACKED ? packed : b;
			moe_tensor *h = from ? moe_tensor_map_get(from, t->name) : NULL;
			if (!h) {
				moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: no tensor bound for %s '%s'",
					tcp_kind_names[t->kind], t->name);
				return false;
			}
			bool same = h->dtype == (moe_dtype)t->dtype && h->rank == t->rank && h->nbytes == bytes;
			for (int k = 0; same && k < t->rank; k++)
				same = h->shape[k] == t->shape[k];
			if (!same) {
				moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(),
					"tcp: tensor bound for '%s' has the wrong dtype or shape (want %s, %lld elements)", t->name,
					moe_dtype_name((moe_dtype)t->dtype), (long long)t->numel);
				return false;
			}
			s->data[i] = h->data; /* NULL only in a timing-only run (checked in moe_tcp_run) */
			s->absent[i] = h->data ? 0 : (int32_t)i + 1;
			s->borrowed[i] = true;
			continue;
		}
		s->data[i] = calloc(bytes ? bytes : 1, 1);
		if (!s->data[i]) {
			moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: out of host memory for '%s' (%zu bytes)", t->name,
				bytes);
			return false;
		}
		if (t->kind == TCP_T_CONST)
			memcpy(s->data[i], p->consts + t->const_off, bytes);
	}
	return true;
}

static int cmp_iv(const void *a, const void *b)
{
	int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
	return x < y ? -1 : x > y;
}

static void finish_stats(sim *s)
{
	const tcp_program *p = s->p;
	moe_tcp_stats *st = s->st;
	int64_t end = s->tc;
	for (int c = 0; c < TCP_NCTX; c++)
		end = end > s->cfree[c] ? end : s->cfree[c];
	st->cycles = end;
	st->busy_cycles[MOE_TCP_ENGINE_CONTROL] = s->tc;
	st->timing_only = s->o->timing_only != 0;
	/* wall time covered by expert commands: the union of their intervals */
	if (s->nxiv)
		qsort(s->xiv, s->nxiv, sizeof *s->xiv, cmp_iv);
	int64_t covered = 0, lo = 0, hi = -1;
	for (size_t i = 0; i < s->nxiv; i++) {
		if (s->xiv[i][0] > hi) {
			covered += hi > lo ? hi - lo : 0;
			lo = s->xiv[i][0];
			hi = s->xiv[i][1];
		} else if (s->xiv[i][1] > hi) {
			hi = s->xiv[i][1];
		}
	}
	covered += hi > lo ? hi - lo : 0;
	st->expert_seconds = (double)covered / s->m->clock_hz;
	st->routing_seconds = (double)(end - covered) / s->m->clock_hz;
	st->simulated_seconds = (double)end / s->m->clock_hz;
	st->blocks_max = p->moe_G;
	st->blocks_skipped = p->moe_G > st->blocks_executed ? p->moe_G - st->blocks_executed : 0;
	/* experts hit: distinct experts the block loop loaded */
	int64_t hit = 0;
	for (int64_t e = 0; s->seen && e < p->moe_E; e++)
		hit += s->seen[e];
	st->experts_hit = hit;
	st->flops = 2.0 * (double)p->moe_T * (double)p->moe_K * (double)p->moe_D * (double)p->moe_F * (double)p->nproj +
		2.0 * (double)p->router_macs;
	double bytes = (double)hit * (double)p->weight_bytes_per_expert + (double)p->act_bytes;
	double tf = st->flops / s->m->peak_ops[TCP_MT_BF16], tb = bytes / s->m->hbm_bytes_per_s;
	st->roofline_seconds = tf > tb ? tf : tb;
	st->roofline_ratio = st->roofline_seconds > 0 ? st->simulated_seconds / st->roofline_seconds : 0;
}

static moe_status simulate(sim *s)
{
	const tcp_program *p = s->p;
	const moe_tcp_machine *m = s->m;
	uint32_t pc = 0;
	uint64_t steps = 0, budget = tcp_step_budget(p);
	while (!s->fault) {
		if (++steps > budget) {
			FAULT(s, pc,
				"instruction budget of %llu reached (%u instructions x (%lld blocks + 2) x 1024): the program "
				"does not terminate",
				(unsigned long long)budget, p->ncode, (long long)p->moe_G);
			break;
		}
		if (s->cycles_overflow) {
			FAULT(s, pc, "a cycle or byte counter passed 2^60 (the machine's bandwidths or latencies are out of "
				     "scale for this program)");
			break;
		}
		const tcp_insn *in = &p->code[pc];
		s->st->instructions++;
		if ((int32_t)pc == p->block_loop_pc + 1 && p->block_loop_pc >= 0) {
			s->st->blocks_executed++;
			if (s->o->progress)
				s->o->progress(s->o->progress_ud, "blocks", s->st->blocks_executed, s->nblocks);
		} else if (s->o->progress && !in_experts(s, pc) && tcp_op_ctx[in->op] != TCP_CTX_CTL) {
			bool before = s->xlo < 0 || (int64_t)pc < s->xlo;
			int64_t lo = before ? 0 : s->xhi + 1, hi = before ? (s->xlo < 0 ? (int64_t)p->ncode : s->xlo) : p->ncode;
			s->o->progress(s->o->progress_ud, before ? "routing" : "combine", (int64_t)pc - lo, hi - lo);
		}
		uint32_t next = pc + 1;
		switch ((tcp_opcode)in->op) {
		case TCP_OP_HALT: goto done;
		case TCP_OP_LI:
			s->reg[in->rd] = in->imm;
			s->tc += m->scalar_cycles;
			break;
		case TCP_OP_ALU: {
			int64_t a = s->reg[in->ra], b = in->rb == TCP_NOREG ? in->imm : s->reg[in->rb], r = 0;
			switch (in->sop) {
			case TCP_S_ADD: r = (int64_t)((uint64_t)a + (uint64_t)b); break;
			case TCP_S_SUB: r = (int64_t)((uint64_t)a - (uint64_t)b); break;
			case TCP_S_MUL: r = (int64_t)((uint64_t)a * (uint64_t)b); break;
			case TCP_S_AND: r = a & b; break;
			case TCP_S_MIN: r = a < b ? a : b; break;
			default: r = a > b ? a : b; break;
			}
			s->reg[in->rd] = r;
			s->tc += m->scalar_cycles;
			break;
		}
		case TCP_OP_LD: {
			int64_t lo, hi;
			const tcp_view *v = &in->v[TCP_V_S0];
			if (!vrange(s, pc, v, 0, in->dim, &lo, &hi) || !needs_values(s, pc, v->t))
				break;
			const int64_t *sp = s->spm[v->t];
			if (sp[2] < 0 || lo < sp[0] || lo > sp[1]) {
				FAULT(s, pc, "element %lld of '%s' was not staged into SPM (dma.spm) before this ld", (long long)lo,
					p->t[v->t].name);
				break;
			}
			s->tc = (s->tc > sp[2] ? s->tc : sp[2]) + m->scalar_cycles;
			s->reg[in->rd] = iw(load_word(s, v->t, lo));
			if (v->t == p->bexp_t && s->seen && s->reg[in->rd] >= 0 && s->reg[in->rd] < p->moe_E)
				s->seen[s->reg[in->rd]] = 1;
			if (s->o->no_skip && v->t == p->nblocks_t && p->moe_G > 0)
				s->reg[in->rd] = p->moe_G; /* no skipping: run the whole worst-case grid */
			if (v->t == p->nblocks_t)
				s->nblocks = s->reg[in->rd];
			break;
		}
		case TCP_OP_BR: {
			int64_t a = s->reg[in->ra], b = s->reg[in->rb];
			bool t = in->sop == TCP_C_LT ? a < b : in->sop == TCP_C_GE ? a >= b : in->sop == TCP_C_EQ ? a == b : a != b;
			s->tc += m->branch_cycles;
			if (t)
				next = (uint32_t)in->target;
			break;
		}
		case TCP_OP_JMP:
			s->tc += m->scalar_cycles;
			next = (uint32_t)in->target;
			break;
		case TCP_OP_SIG:
			s->tok[in->target] = s->cfree[in->sop] > s->tc ? s->cfree[in->sop] : s->tc;
			s->tc += m->scalar_cycles;
			break;
		case TCP_OP_WAIT:
			if (s->tok[in->target] > s->cfree[in->sop])
				s->cfree[in->sop] = s->tok[in->target];
			s->tc += m->scalar_cycles;
			break;
		case TCP_OP_DMA_COPY: run_dma_copy(s, pc, in); break;
		case TCP_OP_DMA_GATHER:
		case TCP_OP_DMA_SCATTER: run_dma_gs(s, pc, in); break;
		case TCP_OP_DMA_SPM: run_dma_spm(s, pc, in); break;
		case TCP_OP_SUB_TRF:
		case TCP_OP_SUB_VRF: run_sub(s, pc, in); break;
		case TCP_OP_TU_VEC: run_vec(s, pc, in); break;
		case TCP_OP_TU_CONTRACT: run_contract(s, pc, in); break;
		case TCP_OP_COUNT: break;
		}
		pc = next;
	}
done:
	return s->fault ? MOE_ERR_RUNTIME : MOE_OK;
}

uint32_t moe_tcp_num_outputs(const moe_tcp_program *p)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < p->nt; i++)
		n += p->t[i].kind == TCP_T_OUTPUT;
	return n;
}

moe_status moe_tcp_run(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *b, const moe_tcp_run_opts *opts,
	moe_tensor **out, moe_tcp_stats *stats)
{
	moe_tcp_run_opts defo = {0};
	const moe_tcp_run_opts *o = opts ? opts : &defo;
	moe_tcp_machine *def = NULL;
	const moe_tcp_machine *m = o->machine;
	if (!m) {
		def = moe_tcp_machine_default(ctx);
		if (!def)
			return MOE_ERR_INTERNAL;
		m = def;
	}
	moe_tcp_stats local;
	moe_tcp_stats *st = stats ? stats : &local;
	memset(st, 0, sizeof *st);
	/* a program may have been built for another machine: check its capacities again */
	moe_status rc = tcp_validate(ctx, p, m, "<program>");
	if (rc != MOE_OK) {
		moe_tcp_machine_free(ctx, def);
		return rc;
	}
	sim s = {0};
	moe_tensor_map *packed = NULL;
	s.ctx = ctx;
	s.p = p;
	s.m = m;
	s.o = o;
	s.st = st;
	s.S = tcp_slices(m);
	s.hbm_bpc = m->hbm_bytes_per_s / m->clock_hz;
	s.data = calloc(p->nt + 1, sizeof *s.data);
	s.borrowed = calloc(p->nt + 1, 1);
	s.absent = calloc(p->nt + 1, sizeof *s.absent);
	s.hz = calloc(p->nt + 1, sizeof *s.hz);
	s.spm = malloc((p->nt + 1) * sizeof *s.spm);
	if (!s.data || !s.borrowed || !s.absent || !s.hz || !s.spm) {
		rc = MOE_ERR_NOMEM;
		goto out;
	}
	for (uint32_t i = 0; i <= p->nt; i++)
		s.spm[i][0] = s.spm[i][1] = s.spm[i][2] = -1;
	if (p->moe_E > 0 && p->moe_E < ((int64_t)1 << 24))
		s.seen = calloc((size_t)p->moe_E, 1);
	/* the expert region: from the branch that skips the whole loop to the loop's back branch */
	s.xlo = s.xhi = -1;
	if (p->block_loop_pc >= 0) {
		for (uint32_t i = (uint32_t)p->block_loop_pc; i < p->ncode; i++)
			if (p->code[i].op == TCP_OP_BR && p->code[i].target == p->block_loop_pc)
				s.xhi = i;
		for (int32_t i = p->block_loop_pc; s.xhi >= 0 && i-- > 0;)
			if (p->code[i].op == TCP_OP_BR && p->code[i].target == s.xhi + 1) {
				s.xlo = i;
				break;
			}
		if (s.xlo < 0)
			s.xhi = -1;
	}
	/* a full run refuses weights without values before anything is packed */
	for (uint32_t i = 0; !o->timing_only && b && i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		const moe_tensor *h = t->kind == TCP_T_INPUT || t->kind == TCP_T_WEIGHT ? moe_tensor_map_get(b, t->name) : NULL;
		if (h && !h->data) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
				"tcp: '%s' is bound without data (absent from the checkpoint); only a timing-only run accepts that",
				t->name);
			rc = MOE_ERR_INVALID;
			goto out;
		}
	}
	packed = moe_tensor_map_new(ctx);
	rc = tcp_pack_weights(ctx, p, b, o->timing_only != 0, packed); /* at load time: off the simulated clock */
	if (rc != MOE_OK)
		goto out;
	if (!bind(&s, b, packed)) {
		rc = MOE_ERR_INVALID;
		goto out;
	}
	rc = simulate(&s);
	finish_stats(&s);
	if (rc == MOE_OK && o->trace_path)
		rc = write_trace(&s, o->trace_path);
	if (rc == MOE_OK && out) {
		uint32_t k = 0;
		for (uint32_t i = 0; i < p->nt; i++) {
			const tcp_tensor *t = &p->t[i];
			if (t->kind != TCP_T_OUTPUT)
				continue;
			moe_tensor *r = moe_tensor_new(ctx, (moe_dtype)t->dtype, t->rank, t->shape);
			if (!r) {
				rc = MOE_ERR_NOMEM;
				break;
			}
			memcpy(r->data, s.data[i], r->nbytes);
			out[k++] = r;
		}
	}
out:
	for (uint32_t i = 0; s.data && i < p->nt; i++)
		if (!s.borrowed[i])
			free(s.data[i]);
	free(s.data);
	free(s.borrowed);
	free(s.absent);
	free(s.hz);
	free(s.spm);
	free(s.seen);
	free(s.ev);
	free(s.xiv);
	if (packed)
		moe_tensor_map_free(packed);
	moe_tcp_machine_free(ctx, def);
	return rc;
}
