/* backend-tcp/compiler/sched_price.c: the price of each command of a
 * schedule on the timeline (sched_time_int.h).
 *
 * Each command is priced by isa/cost.h from a load measured from the
 * schedule's buffers (their placement and layout) and the current values of
 * its scalars: DMA runs and the DMNs they touch by isa/cost.h's tcp_meter,
 * the simulator's own measure; fetch and commit read sizes, the switch's
 * routed operands, a contraction's tiling here. The block loop's staging
 * writes the loads (the caller's or the expected ones) that gathers,
 * scatters and the loop's scalars read. Measured costs are kept per op and
 * per value of what they read (ts_cost_cache), and across predictions on a
 * thread per command. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/sched_time_int.h"

/* Measured costs: a hash table of (op, the scalar values its views and count
 * read, the staging generation) -> cost, grown by doubling. A command's cost
 * is a function of those and of the placement and the staged loads, so a
 * prediction keeps one table for its own run (the staging generation counts
 * the stagings it has seen), and the scheduler one across its predictions
 * on the same placement and expected loads (generation 0 throughout). */
#define MEMO_KEY (TCP_NVIEW + 2)
typedef struct memo_entry {
	int64_t key[MEMO_KEY], total;
	int64_t approx; /* the index lists the measure approximated (approx_idx) */
	uint32_t op;    /* UINT32_MAX: empty */
	uint32_t next;  /* a hint: the slot + 1 the op's next run found last time (0: none) */
	bool holds;
} memo_entry;
/* A prediction's ops see the values the one before saw, in the same order:
 * each op's first slot and each entry's next are tried before hashing (a
 * hint is only taken when its op and key match, so a stale one costs a
 * lookup, never a wrong cost). */
struct ts_cost_cache {
	memo_entry *e;
	size_t cap, n;
	uint32_t *first; /* per op: the slot + 1 its first run found (0: none) */
	size_t nfirst;
};

static int64_t cdiv(int64_t a, int64_t b)
{
	return b > 0 ? (a + b - 1) / b : a;
}

static int64_t esz(const tl *t, int32_t b)
{
	return (int64_t)moe_dtype_size((moe_dtype)t->p->t[b].dtype);
}

static int64_t vbase(const tl *t, const tcp_view *v)
{
	return v->base + (v->reg >= 0 && !t->zero ? t->val[v->reg] * v->scale : 0);
}

/* the element range [lo, hi] a view touches over dims */
static void vrange(const tl *t, const tcp_view *v, int nd, const int64_t *dim, int64_t *lo, int64_t *hi)
{
	int64_t a = vbase(t, v), b = a;
	for (int k = 0; k < nd; k++) {
		int64_t x = v->stride[k] * (dim[k] - 1);
		if (x < 0)
			a += x;
		else
			b += x;
	}
	*lo = a;
	*hi = b;
}

/* ---- the tensor table ---- */
/* The buffers as tensor records, for the cost rules and the meter, which
 * read places and sizes, never names: the records are unnamed (an empty
 * name costs no allocation, and a compile predicts many times). */
tcp_program *ts_tensors(moe_ctx *ctx, const tcp_sched *s)
{
	tcp_program *p = tcp_prog_new(ctx);
	ctx_grow(ctx, (void **)&p->t, &p->tcap, s->nbuf, sizeof *p->t);
	for (ts_id i = 0; i < s->nbuf; i++) {
		const ts_buf *b = &s->buf[i];
		int64_t shape[MOE_MAX_RANK];
		memcpy(shape, b->shape, sizeof shape);
		shape[0] *= b->slots ? b->slots : 1;
		int32_t t = tcp_add_tensor(p, NULL, b->space, b->kind, (moe_dtype)b->dtype, b->rank, shape);
		tcp_tensor *tt = &p->t[t];
		tt->addr = b->offset > 0 ? b->offset : 0;
		if (b->space == TCP_HBM)
			continue;
		tt->slice_bytes = b->layout.slice_bytes;
		tt->copies = b->layout.copies ? b->layout.copies : 1;
		if (b->layout.split == TS_SPLIT_ROWS && b->layout.nslices)
			tt->part_bytes = cdiv(tcp_tensor_bytes(tt), b->layout.nslices);
	}
	return p;
}

/* ---- DMA loads, measured as the simulator measures them (tcp_meter) ---- */
static void dma_run(tl *t, tcp_dma_load *c, int32_t b, int64_t a, int64_t len, bool write)
{
	tcp_meter_run(&t->mt, c, b, a, len, write);
}

static int64_t dma_runs(tl *t, tcp_dma_load *c, const tcp_view *v, int nd, const int64_t *dim, int64_t e, bool write)
{
	return tcp_meter_runs(&t->mt, c, v, vbase(t, v), nd, dim, e, write);
}

static int64_t dma_time(tl *t, const tcp_dma_load *c, bool dm2dm, int64_t rows)
{
	bool ovf = false;
	return tcp_cost_dma(&t->cm, c, dm2dm, rows, &ovf);
}

static bool dm2dm(const tl *t, const tcp_insn *in)
{
	return t->p->t[in->v[TCP_V_DST].t].space == TCP_DM && t->p->t[in->v[TCP_V_S0].t].space == TCP_DM;
}

static int64_t cost_copy(tl *t, const tcp_insn *in)
{
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t dlo, dhi, slo, shi, e = esz(t, d->t), n = 1;
	vrange(t, d, in->ndim, in->dim, &dlo, &dhi);
	vrange(t, sv, in->ndim, in->dim, &slo, &shi);
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	tcp_dma_load dc;
	tcp_dma_load_init(&dc);
	int64_t rs = dma_runs(t, &dc, sv, in->ndim, in->dim, e, false), rd = dma_runs(t, &dc, d, in->ndim, in->dim, e, true);
	int64_t run = rs < rd ? rs : rd;
	dc.requests = n / run * tcp_dma_requests(&t->cm, run * e);
	tcp_meter_dm_sides(&t->mt, &dc, d, dlo, dhi, sv, slo, shi, n * e);
	return dma_time(t, &dc, dm2dm(t, in), 1);
}

/* Row j of an n-row list into a block grid's slots (rows = the caller's
 * loads' grid x B, n = the slots those loads fill): the filled slots
 * ascending (tcp_loads_slots, isa/cost.h), as the simulator's predict mode
 * names them; -1 when the list is not one, or the loads are expected ones. */
static int64_t slot_row(tl *t, int64_t rows, int64_t n, int64_t j)
{
	const moe_tcp_loads *l = t->given;
	int64_t B = t->s->meta.B;
	if (!l || !l->block_rows || B < 1 || rows != l->grid * B)
		return -1;
	if (!t->slots_done) {
		t->slots_done = true;
		int64_t filled = tcp_loads_slots(l, B, NULL);
		t->slots = ctx_alloc(t->ctx, (size_t)(filled > 0 ? filled : 1) * sizeof *t->slots);
		t->nslots = tcp_loads_slots(l, B, t->slots);
	}
	return t->nslots > 0 && n == t->nslots && j < n ? t->slots[j] : -1;
}

/* the row a gather's or scatter's position (g, j) names: the staged loads
 * where the list is one, the caller's loads' slots where it names a grid's
 * slots, else n valid positions spread evenly over the rows */
static int64_t index_row(tl *t, const tcp_insn *in, int64_t g, int64_t j, int64_t cnt)
{
	const tcp_view *iv = &in->v[TCP_V_S1];
	int64_t rows = in->rows > 0 ? in->rows : 1;
	int32_t w;
	if (!(in->flags & TCP_F_HBMIDX) && tcp_staged_find(t->d, t->nd, iv->t, vbase(t, iv) + g * iv->stride[0] + j * iv->stride[1], &w))
		return w < 0 ? 0 : w >= rows ? rows - 1 : w;
	int64_t n = cnt > 0 ? cnt : 1, sl = slot_row(t, rows, n, j);
	if (sl >= 0)
		return sl;
	if (g == 0 && j == 0)
		t->approx_idx++;
	return n >= rows ? j % rows : j * rows / n;
}

static int64_t cost_gs(tl *t, const tcp_insn *in)
{
	bool gather = in->op == TCP_OP_DMA_GATHER;
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t G = in->dim[0], n = in->dim[1], row = in->dim[2], rows = in->rows;
	int64_t d3[3] = {G, gather ? n : rows, row}, s3[3] = {G, gather ? rows : n, row};
	int64_t dlo, dhi, slo, shi;
	vrange(t, d, 3, d3, &dlo, &dhi);
	vrange(t, sv, 3, s3, &slo, &shi);
	bool vrows = in->flags & TCP_F_VROWS;
	int64_t v = in->vreg >= 0 && !t->zero ? t->val[in->vreg] : -1;
	int64_t cnt = in->vreg >= 0 && !vrows ? (v < 0 ? n : v) : n, gcnt = in->vreg >= 0 && vrows ? (v < 0 ? G : v) : G;
	int64_t e = esz(t, d->t), db = vbase(t, d), sb = vbase(t, sv), moved = 0;
	tcp_dma_load dc;
	tcp_dma_load_init(&dc);
	int64_t sa0 = t->p->t[sv->t].addr, da0 = t->p->t[d->t].addr, rb = d->stride[2] == 1 && sv->stride[2] == 1 ? row * e : e;
	for (int64_t g = 0; g < G; g++)
		for (int64_t j = 0; j < n; j++) {
			if (j >= cnt || g >= gcnt)
				continue;
			int64_t ix = index_row(t, in, g, j, vrows ? n : cnt);
			int64_t da = db + g * d->stride[0] + (gather ? j : ix) * d->stride[1];
			int64_t sa = sb + g * sv->stride[0] + (gather ? ix : j) * sv->stride[1];
			for (int64_t x = 0; x < row; x += rb / e) {
				dma_run(t, &dc, sv->t, sa0 + (sa + x * sv->stride[2]) * e, rb, false);
				dma_run(t, &dc, d->t, da0 + (da + x * d->stride[2]) * e, rb, true);
			}
			moved++;
		}
	dc.requests = (moved ? moved : 1) * (row * e / rb) * tcp_dma_requests(&t->cm, rb);
	tcp_meter_dm_sides(&t->mt, &dc, d, dlo, dhi, sv, slo, shi, (moved ? moved : 1) * row * e);
	return dma_time(t, &dc, dm2dm(t, in), G * n);
}

static int64_t cost_spm(tl *t, const tcp_insn *in)
{
	int64_t n = 1, most = 0;
	tcp_dma_load dc;
	tcp_dma_load_init(&dc);
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	for (int w = TCP_V_S0; w <= TCP_V_S2; w++) {
		const tcp_view *v = &in->v[w];
		if (v->t < 0)
			continue;
		int64_t lo, hi;
		vrange(t, v, in->ndim, in->dim, &lo, &hi);
		int64_t el = hi - lo + 1 < n ? hi - lo + 1 : n;
		most = el * 4 > most ? el * 4 : most;
		dc.eng++;
		dc.requests += tcp_dma_requests(&t->cm, el * 4);
		dma_runs(t, &dc, v, in->ndim, in->dim, 4, false);
	}
	dc.bytes = most * dc.eng;
	return dma_time(t, &dc, false, 1);
}

/* a sub load: its cycles; *holds: it holds the main context (routed over the
 * switch on a machine whose sub loads and switch do not run at once) */
static int64_t cost_sub(tl *t, const tcp_insn *in, bool *holds)
{
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t slo, shi, n = 1;
	vrange(t, sv, in->ndim, in->dim, &slo, &shi);
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	int64_t per = t->p->t[d->t].slice_bytes, own = per;
	if (in->flags & TCP_F_SWITCH) {
		int64_t e = esz(t, sv->t), bytes = (shi - slo + 1 < n ? shi - slo + 1 : n) * e;
		own = bytes;
		if (t->p->t[sv->t].space == TCP_DM) {
			int64_t first, ns, P;
			tcp_meter_slices(&t->mt, sv->t, slo * e, (shi + 1) * e - 1, &first, &ns, &P);
			int64_t most = tcp_slice_holds(t->m, &t->p->t[sv->t], 0);
			own = cdiv(bytes, ns);
			own = own < most ? own : most;
		}
	}
	*holds = own < per && !t->m->sub_switch_concurrent;
	return tcp_cost_sub(&t->cm, per, own);
}

static unsigned route_kept(tl *t, const tcp_insn *in);

/* the operands some slice does not hold (bit w: view w), once per op */
static unsigned route_mask(tl *t, ts_id id, const tcp_insn *in)
{
	if (!(in->flags & TCP_F_ROUTE))
		return 0;
	if (!t->route[id])
		t->route[id] = (uint8_t)(0x80u | route_kept(t, in));
	return t->route[id] & 0x7fu;
}

static bool is_rowop(int op)
{
	return tcp_vop_stage[op] == TCP_ST_REDUCE || op == TCP_V_ISCAN || op == TCP_V_FSCAN || op == TCP_V_COMPACT;
}

static int64_t cost_vec(tl *t, ts_id id, const tcp_insn *in)
{
	const moe_tcp_machine *m = t->m;
	int nd = in->ndim, rop = -1;
	bool fl = false;
	for (int i = 0; i < in->nstep; i++) {
		int op = in->step[i].op, stg = tcp_vop_stage[op];
		rop = is_rowop(op) ? i : rop;
		fl |= (stg >= TCP_ST_FXP2FP && stg <= TCP_ST_FP2FXP) || (op >= TCP_V_FTEQ && op <= TCP_V_FTGE) ||
		      op == TCP_V_FMIN || op == TCP_V_FMAX;
	}
	int64_t n = 1;
	for (int k = 0; k < nd; k++)
		n *= in->dim[k];
	int64_t L = nd ? in->dim[nd - 1] : 1;
	const tcp_view *dv = &in->v[TCP_V_DST];
	int64_t units = rop >= 0 ? n / L : cdiv(n, m->flit_bytes / 4), per = rop >= 0 ? L : m->flit_bytes / 4;
	int64_t used = units < t->S ? units : t->S;
	int64_t pe = cdiv(units, used) * per;
	int64_t fsum = 0, ns = 0, rbytes = 0;
	unsigned rm = route_mask(t, id, in);
	for (int w = 1; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && t->p->t[in->v[w].t].space == TCP_DM) {
			bool n4 = (in->flags & (TCP_F_E2M1 | TCP_F_I4)) && w == TCP_V_S0;
			int64_t el = pe, e = n4 ? 1 : esz(t, in->v[w].t), rs = tcp_meter_read_size(t->m, &in->v[w], nd, in->dim, e, &el);
			fsum += n4 ? cdiv(cdiv(el, 2), rs) : cdiv(el * e, rs);
			rbytes += (rm >> w & 1u) ? (n4 ? cdiv(el, 2) : el * e) : 0;
			ns++;
		}
	bool red = rop >= 0 && tcp_vop_stage[in->step[rop].op] == TCP_ST_REDUCE;
	int64_t outs = red ? pe / L : pe, ol = outs;
	int64_t crs = tcp_meter_read_size(t->m, dv, red ? nd - 1 : nd, in->dim, esz(t, dv->t), &ol);
	int64_t commit = cdiv(outs * esz(t, dv->t), crs);
	rbytes += (rm & 1u) ? outs * esz(t, dv->t) : 0;
	return tcp_cost_vec(&t->cm, &(tcp_vec_load){pe, fl, in->nstep, fsum, ns, commit, rbytes, used,
					    (in->flags & TCP_F_XSLICE) != 0})
		.total;
}

static int64_t cost_contract(tl *t, ts_id id, const tcp_insn *in)
{
	int64_t M = in->dim[0], O = in->dim[1], I = in->dim[2];
	const tcp_view *dv = &in->v[TCP_V_DST], *av = &in->v[TCP_V_S0];
	bool x3 = in->flags & TCP_F_BF16X3, i8 = t->p->t[av->t].dtype == MOE_I8;
	int64_t Cg = cdiv(O, in->tile), R = t->S / Cg > 0 ? t->S / Cg : 1, Bs = cdiv(M, R), tiles = cdiv(Cg, t->S);
	int mt = t->p->t[av->t].dtype == MOE_F8E4M3 ? TCP_MT_F8 : i8 ? TCP_MT_I8 : TCP_MT_BF16;
	int64_t ae = x3 ? 4 : mt != TCP_MT_BF16 ? 1 : 2;
	int64_t sc_bytes = (in->flags & TCP_F_SCALED) ? 4 * (i8 ? 1 : I / TCP_SCALE_CHUNK) : 0;
	unsigned rm = route_mask(t, id, in);
	int64_t ob = esz(t, dv->t);
	int64_t rbytes = ((rm >> TCP_V_S0 & 1u) ? Bs * I * ae : 0) + ((rm & 1u) ? Bs * in->tile * ob : 0) +
			 ((rm >> TCP_V_S2 & 1u) ? Bs * in->tile * ((in->flags & TCP_F_ACC) ? 4 : sc_bytes) : 0);
	return tcp_cost_contract(&t->cm, &(tcp_mm_load){Bs, in->tile, I, tiles, mt, x3, ae,
						ob + ((in->flags & TCP_F_ACC) ? 4 : 0) + sc_bytes, rbytes,
						t->S < Cg * R ? t->S : Cg * R, (in->flags & TCP_F_ROWDIV) != 0})
		.total;
}

/* op id's busy time on its context, issue excluded */
int64_t ts_op_cycles(tl *t, ts_id id, bool *holds)
{
	const tcp_insn *in = &t->s->op[id].in;
	*holds = false;
	switch (in->op) {
	case TCP_OP_DMA_COPY: return cost_copy(t, in);
	case TCP_OP_DMA_GATHER:
	case TCP_OP_DMA_SCATTER: return cost_gs(t, in);
	case TCP_OP_DMA_SPM: return cost_spm(t, in);
	case TCP_OP_SUB_TRF:
	case TCP_OP_SUB_VRF: return cost_sub(t, in, holds);
	case TCP_OP_TU_VEC: return cost_vec(t, id, in);
	case TCP_OP_TU_CONTRACT: return cost_contract(t, id, in);
	default: return 0;
	}
}

/* ---- the loads ---- */
static uint64_t next_u64(uint64_t *st)
{
	uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* moe_tcp_predict's expected loads of a grid of G blocks into ge, gr (the
 * same fixed generator and order, so both predict the same routing): the
 * blocks written, -1 when out of host memory */
static int64_t generate(int64_t E, int64_t K, int64_t B, int64_t ntok, int64_t G, bool decode, int32_t *ge, int32_t *gr)
{
	int64_t *cnt = calloc((size_t)E, sizeof *cnt);
	int32_t *perm = malloc((size_t)E * sizeof *perm);
	bool ok = cnt && perm;
	for (int64_t e = 0; e < E && ok; e++)
		perm[e] = (int32_t)e;
	uint64_t st = 0x6d6f65632d707265ull;
	int64_t nb = 0;
	for (int64_t i = 0; i < ntok && ok; i++)
		for (int64_t k = 0; k < K; k++) {
			int64_t j = k + (int64_t)(next_u64(&st) % (uint64_t)(E - k));
			int32_t y = perm[k];
			perm[k] = perm[j];
			perm[j] = y;
			cnt[perm[k]]++;
			if (decode && nb < G)
				ge[nb] = perm[k], gr[nb++] = 1;
		}
	for (int64_t e = 0; e < E && !decode && ok; e++)
		for (int64_t left = cnt[e]; left > 0 && nb < G; left -= B)
			ge[nb] = (int32_t)e, gr[nb++] = (int32_t)(left < B ? left : B);
	free(cnt);
	free(perm);
	return ok ? nb : -1;
}

/* The expected loads last generated on this thread: a function of (E, K, B,
 * T, G, decode) only, asked for by every prediction of a compile. */
typedef struct gen_loads {
	int64_t E, K, B, ntok, G, nb;
	bool decode, valid;
	int32_t *e, *r;
} gen_loads;
static _Thread_local gen_loads last_loads;

/* the expected loads of a grid of G blocks (generate), t's to read */
static bool expected(tl *t, int64_t G, bool decode)
{
	const ts_meta *x = &t->s->meta;
	int64_t E = x->E > 0 ? x->E : 1, K = x->K < E ? x->K : E, B = x->B > 0 ? x->B : 1;
	int64_t ntok = decode ? 1 : x->T;
	gen_loads *q = &last_loads;
	if (!(q->valid && q->E == E && q->K == K && q->B == B && q->ntok == ntok && q->G == G && q->decode == decode)) {
		free(q->e);
		free(q->r);
		*q = (gen_loads){E, K, B, ntok, G, 0, decode, false, NULL, NULL};
		q->e = calloc((size_t)(G > 0 ? G : 1), sizeof *q->e);
		q->r = calloc((size_t)(G > 0 ? G : 1), sizeof *q->r);
		if (!q->e || !q->r)
			return false;
		q->nb = generate(E, K, B, ntok, G, decode, q->e, q->r);
		if (q->nb < 0)
			return false;
		q->valid = true;
	}
	t->gen_e = q->e;
	t->gen_r = q->r;
	t->gen_nb = q->nb;
	return true;
}

/* A dma.spm staging the block loop's experts writes the loads (as the
 * simulator's predict mode: descriptors nb, experts, rows). */
void ts_stage(tl *t, const tcp_insn *in)
{
	int be = -1;
	for (int w = TCP_V_S0; w <= TCP_V_S2 && be < 0; w++)
		if (in->v[w].t >= 0 && in->v[w].t == t->bexp)
			be = w;
	if (be < 0 || (be > TCP_V_S0 && in->v[be - 1].t < 0))
		return;
	int64_t G = in->dim[0];
	bool decode = be == TCP_V_S0;
	int rw = be < TCP_V_S2 && in->v[be + 1].t >= 0 ? be + 1 : -1;
	const moe_tcp_loads *l = t->given;
	if (l && (l->grid != G || (rw >= 0 && !l->block_rows))) {
		moe_diag(t->ctx, MOE_DIAG_ERROR, moe_loc_none(), "the loads give %lld grid entries; this schedule stages %lld",
			(long long)l->grid, (long long)G);
		t->fail = true;
		return;
	}
	if (!l && !expected(t, G, decode)) {
		moe_diag(t->ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of host memory for the expected loads");
		t->fail = true;
		return;
	}
	t->sgen += t->own_memo;
	const int32_t *ve = l ? l->block_expert : t->gen_e, *vr = l ? l->block_rows : t->gen_r;
	int64_t nb = l ? l->nblocks : t->gen_nb;
	t->nblocks = decode ? G : nb;
	t->nd = 0;
	if (!decode) {
		const tcp_view *v = &in->v[be - 1];
		t->d[t->nd++] = tcp_staged_counts(v->t, vbase(t, v), v, nb, ve, t->nbr);
	}
	t->d[t->nd++] = (tcp_staged){in->v[be].t, vbase(t, &in->v[be]), in->v[be].stride[0], G, ve, 0};
	if (rw >= 0)
		t->d[t->nd++] = (tcp_staged){in->v[rw].t, vbase(t, &in->v[rw]), in->v[rw].stride[0], G, vr, 0};
}

/* ---- measured costs kept ---- */
static uint64_t memo_hash(uint32_t op, const int64_t *key)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ op;
	for (int k = 0; k < MEMO_KEY; k++)
		h = (h ^ (uint64_t)key[k]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

static memo_entry *memo_slot(ts_cost_cache *c, uint32_t op, const int64_t *key)
{
	size_t i = memo_hash(op, key) & (c->cap - 1);
	while (c->e[i].op != UINT32_MAX && (c->e[i].op != op || memcmp(c->e[i].key, key, sizeof c->e[i].key)))
		i = (i + 1) & (c->cap - 1);
	return &c->e[i];
}

static void memo_grow(moe_ctx *ctx, ts_cost_cache *c)
{
	memo_entry *old = c->e;
	size_t oc = c->cap;
	c->cap = oc * 2;
	c->e = ctx_alloc(ctx, c->cap * sizeof *c->e);
	for (size_t i = 0; i < c->cap; i++)
		c->e[i].op = UINT32_MAX;
	for (size_t i = 0; i < oc; i++)
		if (old[i].op != UINT32_MAX)
			*memo_slot(c, old[i].op, old[i].key) = old[i];
	ctx_free(ctx, old, oc * sizeof *old);
}

/* Costs kept across predictions on a thread, for the predictions without the
 * scheduler's cache (the planner's and the rewrite driver's, each on its own
 * copy or placement): the key is everything ts_op_cycles reads of a command
 * other than a gather's or scatter's (those read the staged loads), the
 * command with each view's buffer replaced by its tensor record (names
 * left out), the scalar values its views and count read; the machine's
 * record is the table's. */
typedef struct xkey {
	int64_t val[TCP_NVIEW + 1];
	tcp_insn in;
	tcp_tensor t[TCP_NVIEW];
} xkey;
typedef struct xentry {
	xkey k;
	int64_t total; /* op_cycles_kept's table: the cycles and whether the command holds */
	bool holds, used;
	uint8_t mask;  /* route_kept's table: the remote operands */
} xentry;
typedef struct xcache {
	moe_tcp_machine m;
	xentry *e;
	size_t cap, n;
} xcache;
static _Thread_local xcache xc;
#define XCACHE_CAP 8192 /* slots; the table is emptied when half full */

static uint64_t xhash(const xkey *k)
{
	uint64_t h = 0xcbf29ce484222325ull, w;
	const unsigned char *b = (const unsigned char *)k;
	for (size_t i = 0; i + 8 <= sizeof *k; i += 8) {
		memcpy(&w, b + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
	}
	return h ^ (h >> 31);
}

/* the key of command in with scalar values val (NULL: every value 0) */
static void xkey_of(const tl *t, const tcp_insn *in, const int64_t *val, xkey *k)
{
	memset(k, 0, sizeof *k);
	if (val)
		memcpy(k->val, val, sizeof k->val);
	memcpy(&k->in, in, sizeof *in);
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0) {
			memcpy(&k->t[w], &t->p->t[in->v[w].t], sizeof k->t[w]);
			k->t[w].name = k->t[w].source = NULL;
			k->in.v[w].t = 0;
		}
}

/* The slot of key k in table c (of cap slots, for machine m): *fresh when
 * the key was not there (the slot is then k's, its value the caller's to
 * fill); the table is emptied first when another key would fill it past half
 * or m is not its machine. NULL when the table cannot be allocated. */
static xentry *xcache_slot(xcache *c, size_t cap, const moe_tcp_machine *m, const xkey *k, bool *fresh)
{
	if (!c->e || memcmp(&c->m, m, sizeof c->m) || 2 * (c->n + 1) > c->cap) {
		if (!c->e)
			c->e = malloc(cap * sizeof *c->e);
		if (!c->e)
			return NULL;
		c->cap = cap;
		c->n = 0;
		memcpy(&c->m, m, sizeof c->m);
		for (size_t i = 0; i < c->cap; i++)
			c->e[i].used = false;
	}
	size_t i = xhash(k) & (c->cap - 1);
	while (c->e[i].used && memcmp(&c->e[i].k, k, sizeof *k))
		i = (i + 1) & (c->cap - 1);
	*fresh = !c->e[i].used;
	if (*fresh) {
		c->e[i].k = *k;
		c->e[i].used = true;
		c->n++;
	}
	return &c->e[i];
}

/* A routed pass's remote operands (tcp_pass_remote) kept across predictions
 * on a thread: they are a function of the command, its views' tensor records
 * (names aside: they only word the reason) and the machine, never of a
 * scalar's value (a view moved by a register is remote whatever it holds). */
static _Thread_local xcache rc;
#define RCACHE_CAP 1024 /* slots; the table is emptied when half full */

static unsigned route_kept(tl *t, const tcp_insn *in)
{
	char why[8];
	xkey k;
	xkey_of(t, in, NULL, &k);
	bool fresh;
	xentry *e = xcache_slot(&rc, RCACHE_CAP, t->m, &k, &fresh);
	if (!e)
		return tcp_pass_remote(t->p, t->m, in, why, sizeof why);
	if (fresh)
		e->mask = (uint8_t)tcp_pass_remote(t->p, t->m, in, why, sizeof why);
	return e->mask;
}

/* ts_op_cycles through the thread's table; false where the command is not kept there */
static int64_t op_cycles_kept(tl *t, ts_id id, const int64_t *val, bool *holds)
{
	const tcp_insn *in = &t->s->op[id].in;
	if (in->op == TCP_OP_DMA_GATHER || in->op == TCP_OP_DMA_SCATTER)
		return ts_op_cycles(t, id, holds);
	xkey k;
	xkey_of(t, in, val, &k);
	bool fresh;
	xentry *e = xcache_slot(&xc, XCACHE_CAP, t->m, &k, &fresh);
	if (!e)
		return ts_op_cycles(t, id, holds);
	if (fresh)
		e->total = ts_op_cycles(t, id, &e->holds);
	*holds = e->holds;
	return e->total;
}

/* ts_op_cycles through the cache when there is one */
int64_t ts_op_cost(tl *t, ts_id id, bool *holds)
{
	if (!t->memo)
		return ts_op_cycles(t, id, holds);
	const tcp_insn *in = &t->s->op[id].in;
	int64_t key[MEMO_KEY] = {0};
	for (int w = 0; w < TCP_NVIEW; w++)
		key[w] = in->v[w].t >= 0 && in->v[w].reg >= 0 ? t->val[in->v[w].reg] : 0;
	key[TCP_NVIEW] = in->vreg >= 0 ? t->val[in->vreg] : 0;
	key[TCP_NVIEW + 1] = t->sgen;
	ts_cost_cache *c = t->memo;
	uint32_t last = t->mlast[id], hint = last ? c->e[last - 1].next : id < c->nfirst ? c->first[id] : 0;
	memo_entry *e = hint && hint <= c->cap ? &c->e[hint - 1] : NULL;
	if (!e || e->op != id || memcmp(e->key, key, sizeof key))
		e = memo_slot(c, id, key);
	if (e->op != id) {
		int64_t approx = t->approx_idx, total = t->own_memo ? op_cycles_kept(t, id, key, holds) : ts_op_cycles(t, id, holds);
		if (2 * (c->n + 1) > c->cap) {
			memo_grow(t->ctx, c);
			e = memo_slot(c, id, key);
		}
		*e = (memo_entry){.total = total, .approx = t->approx_idx - approx, .op = id, .holds = *holds};
		memcpy(e->key, key, sizeof key);
		c->n++;
	}
	uint32_t at = (uint32_t)(e - c->e) + 1;
	if (last && last <= c->cap)
		c->e[last - 1].next = at;
	else if (!last) {
		if (id >= c->nfirst) {
			size_t nf = (size_t)id * 2 + 16;
			c->first = ctx_realloc(t->ctx, c->first, c->nfirst * sizeof *c->first, nf * sizeof *c->first);
			memset(c->first + c->nfirst, 0, (nf - c->nfirst) * sizeof *c->first);
			c->nfirst = nf;
		}
		c->first[id] = at;
	}
	t->mlast[id] = at;
	*holds = e->holds;
	t->approx_idx += e->approx;
	return e->total;
}

/* ---- the cost cache (sched_time.h) ---- */
ts_cost_cache *ts_cost_cache_new(moe_ctx *ctx)
{
	ts_cost_cache *c = ctx_alloc(ctx, sizeof *c);
	c->cap = 1024;
	c->n = 0;
	c->e = ctx_alloc(ctx, c->cap * sizeof *c->e);
	for (size_t i = 0; i < c->cap; i++)
		c->e[i].op = UINT32_MAX;
	c->first = NULL;
	c->nfirst = 0;
	return c;
}

void ts_cost_cache_free(moe_ctx *ctx, ts_cost_cache *c)
{
	if (!c)
		return;
	ctx_free(ctx, c->e, c->cap * sizeof *c->e);
	ctx_free(ctx, c->first, c->nfirst * sizeof *c->first);
	ctx_free(ctx, c, sizeof *c);
}
