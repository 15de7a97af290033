/* backend-tcp/compiler/sched_time.c: the schedule's timeline (sched_time.h).
 *
 * Each command is priced by isa/cost.h from a load measured from the
 * schedule's buffers (their placement and layout) and the current values of
 * its scalars: DMA runs and the DMNs they touch by isa/cost.h's tcp_meter,
 * the simulator's own measure; fetch and commit read sizes, the switch's
 * routed operands, a contraction's tiling here. The start rule is the simulator's: the
 * control processor's clock advances by each instruction's scalar cost (the
 * control code isel emits for scalars, guards, row-class switches and the
 * loop is counted instruction for instruction), an `ld` of a staged buffer
 * waits for its staging, a command starts at the latest of its issue, its
 * context's end and its dependencies' ends, and a sub load routed over the
 * switch holds the main context when the machine does not run both at once.
 * Dependencies stand for the simulator's hazard records (the verifier makes
 * them cover every conflict); DMA setups never overlap (revision 3). */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/isa/cost.h"

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

typedef struct tl {
	moe_ctx *ctx;
	ts_cost_cache *memo;
	const tcp_sched *s;
	const moe_tcp_machine *m;
	tcp_cm cm;
	tcp_program *p; /* the buffers as a tensor table (tensor i is buffer i) */
	int64_t S;
	int64_t tc, cfree[TCP_NCTX];
	int64_t cprev[TCP_NCTX]; /* cfree when the current block began */
	int64_t *val, *staged, *start, *end, *cost;
	int64_t *prev;     /* per op: its end in the block before its last one */
	int64_t *blk;      /* per op: the block of its last execution */
	int64_t block;     /* blocks begun so far (every loop) */
	uint8_t *route;
	uint32_t *dmn;
	tcp_meter mt;
	const moe_tcp_loads *given;
	const int32_t *gen_e, *gen_r;
	int64_t gen_nb, nblocks;
	int64_t sgen; /* stagings seen, in a run's own cost table's keys */
	bool own_memo;
	uint32_t *mlast; /* per op: the slot + 1 its last run in this prediction found */
	/* per op: the region whose items hold it and its index there (oreg
	 * TS_NONE: not known), its dependencies as the walk reads them
	 * (dfirst UINT32_MAX: not listed yet; dep_list) */
	ts_id *oreg;
	uint32_t *oidx, *dfirst, *dn;
	uint8_t *rloop; /* per region: a loop lies in it (its passes may span blocks) */
	/* per (region, context, distance): dep_list's group of that key in
	 * the list being built (gidx), valid where gstamp is the list's stamp */
	uint32_t *gidx, *gstamp, stamp;
	uint8_t *octx;  /* per op: its context */
	ts_id *dl;
	uint8_t *dd;
	size_t dlen, dcap;
	tcp_staged d[3];
	int nd;
	int32_t bexp;
	int64_t approx_ld, approx_idx;
	int64_t *slots, nslots; /* the grid slots the caller's loads fill (slot_row) */
	bool slots_done;
	bool zero; /* measuring with every scalar 0 */
	bool fail;
} tl;

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
static tcp_program *tensors(moe_ctx *ctx, const tcp_sched *s)
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

/* the operands some slice does not hold (bit w: view w), once per op */
static unsigned route_mask(tl *t, ts_id id, const tcp_insn *in)
{
	if (!(in->flags & TCP_F_ROUTE))
		return 0;
	if (!t->route[id]) {
		char why[8];
		t->route[id] = (uint8_t)(0x80u | tcp_pass_remote(t->p, t->m, in, why, sizeof why));
	}
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
static int64_t op_cycles(tl *t, ts_id id, bool *holds)
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
static void stage(tl *t, const tcp_insn *in)
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
		t->d[t->nd++] = (tcp_staged){v->t, vbase(t, v), 0, 1, NULL, (int32_t)nb};
	}
	t->d[t->nd++] = (tcp_staged){in->v[be].t, vbase(t, &in->v[be]), in->v[be].stride[0], G, ve, 0};
	if (rw >= 0)
		t->d[t->nd++] = (tcp_staged){in->v[rw].t, vbase(t, &in->v[rw]), in->v[rw].stride[0], G, vr, 0};
}

/* ---- the walk ---- */
static void scalar_insn(tl *t, int op)
{
	t->tc += tcp_cost_scalar(&t->cm, op);
}

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
 * copy or placement): the key is everything op_cycles reads of a command
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
	int64_t total;
	bool holds, used;
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

/* op_cycles through the thread's table; false where the command is not kept there */
static int64_t op_cycles_kept(tl *t, ts_id id, const int64_t *val, bool *holds)
{
	const tcp_insn *in = &t->s->op[id].in;
	if (in->op == TCP_OP_DMA_GATHER || in->op == TCP_OP_DMA_SCATTER)
		return op_cycles(t, id, holds);
	xkey k;
	memset(&k, 0, sizeof k);
	memcpy(k.val, val, sizeof k.val);
	memcpy(&k.in, in, sizeof *in);
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0) {
			memcpy(&k.t[w], &t->p->t[in->v[w].t], sizeof k.t[w]);
			k.t[w].name = k.t[w].source = NULL;
			k.in.v[w].t = 0;
		}
	xcache *c = &xc;
	if (!c->e || memcmp(&c->m, t->m, sizeof c->m) || 2 * (c->n + 1) > c->cap) {
		if (!c->e)
			c->e = malloc(XCACHE_CAP * sizeof *c->e);
		if (!c->e)
			return op_cycles(t, id, holds);
		c->cap = XCACHE_CAP;
		c->n = 0;
		memcpy(&c->m, t->m, sizeof c->m);
		for (size_t i = 0; i < c->cap; i++)
			c->e[i].used = false;
	}
	size_t i = xhash(&k) & (c->cap - 1);
	while (c->e[i].used && memcmp(&c->e[i].k, &k, sizeof k))
		i = (i + 1) & (c->cap - 1);
	if (!c->e[i].used) {
		c->e[i].total = op_cycles(t, id, &c->e[i].holds);
		c->e[i].k = k;
		c->e[i].used = true;
		c->n++;
	}
	*holds = c->e[i].holds;
	return c->e[i].total;
}

/* op_cycles through the cache when there is one */
static int64_t op_cost(tl *t, ts_id id, bool *holds)
{
	if (!t->memo)
		return op_cycles(t, id, holds);
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
		int64_t approx = t->approx_idx, total = t->own_memo ? op_cycles_kept(t, id, key, holds) : op_cycles(t, id, holds);
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

#define DEPS_NONE UINT32_MAX      /* dfirst: the op has not run */
#define DEPS_ONCE (UINT32_MAX - 1) /* it has run once, its dependencies read as they are */

/* Where each op stands in the regions' current orders. */
static void positions(tl *t)
{
	const tcp_sched *s = t->s;
	for (ts_id i = 0; i <= s->nop; i++)
		t->oreg[i] = TS_NONE, t->oidx[i] = 0, t->dfirst[i] = DEPS_NONE;
	for (ts_id i = 0; i < s->nop; i++)
		t->octx[i] = (uint8_t)tcp_op_ctx[s->op[i].in.op];
	uint8_t *seen = ctx_alloc(t->ctx, s->nop + 1);
	memset(seen, 0, s->nop + 1);
	for (ts_id r = 0; r < s->nrg; r++)
		for (uint32_t k = 0; k < s->rg[r].nitem; k++) {
			uint32_t it = s->rg[r].item[k], id = TS_ITEM_ID(it);
			if (TS_ITEM_KIND(it) != TS_ITEM_OP || id >= s->nop)
				continue;
			t->oreg[id] = seen[id]++ ? TS_NONE : r; /* held twice: not known */
			t->oidx[id] = k;
		}
	ctx_free(t->ctx, seen, s->nop + 1);
	ts_id *par = ctx_alloc(t->ctx, (s->nrg + 1) * sizeof *par);
	for (ts_id r = 0; r <= s->nrg; r++)
		par[r] = TS_NONE, t->rloop[r] = 0;
	for (ts_id r = 0; r < s->nrg; r++) {
		const ts_region *g = &s->rg[r];
		for (uint32_t k = 0; k < g->nitem; k++)
			if (TS_ITEM_KIND(g->item[k]) == TS_ITEM_RG && TS_ITEM_ID(g->item[k]) < s->nrg)
				par[TS_ITEM_ID(g->item[k])] = r;
		if (g->kind == TS_RG_LOOP && s->nloop > 0 && g->loop < (uint32_t)s->nloop) {
			const ts_loop *l = &s->loop[g->loop];
			ts_id in[3] = {l->prologue, l->body, l->epilogue};
			for (int k = 0; k < 3; k++)
				if (in[k] < s->nrg)
					par[in[k]] = r;
		}
	}
	for (ts_id r = 0; r < s->nrg; r++)
		if (s->rg[r].kind == TS_RG_LOOP)
			for (ts_id x = r, depth = 0; x != TS_NONE && depth <= s->nrg; x = par[x], depth++)
				t->rloop[x] = 1;
	ctx_free(t->ctx, par, (s->nrg + 1) * sizeof *par);
}

/* Op a's dependencies as its start reads them, the latest of their ends,
 * with those that cannot be the latest left out. A context's end never
 * decreases (each command starts after it) and a dependency's end read is
 * of a run already issued, so one on a's own context is covered by a's
 * start waiting for that context. Two on one other context that are items
 * of one region, run in the same passes of it in item order, keep their
 * order: of distance-0 ones that are earlier items of a's region (run in
 * its current pass) only the last counts, and likewise of distance-1 ones
 * in a region holding no loop (each of its passes lies in one block, so
 * the last run before this block is of one pass for both). */
#define DEP_GROUPS 32
/* A dependency's end as read is at most its context's end (cfree: the
 * ends on one context never decrease), and one read at distance 1, of a
 * run before the current block, at most that context's end when the block
 * began (cprev). The list from `from` is reordered by (context, distance)
 * behind a header each (dd DEP_HDR | context << 1 | distance, dl: the
 * entries it heads), so that run_op skips the entries of a context whose
 * bound does not pass the start found so far: the latest end is unchanged. */
#define DEP_HDR 0x80u

/* room for n more entries of the dependency lists */
static void dl_reserve(tl *t, size_t n)
{
	if (t->dlen + n > t->dcap) {
		size_t nc = (t->dlen + n) * 2;
		t->dl = ctx_realloc(t->ctx, t->dl, t->dcap * sizeof *t->dl, nc * sizeof *t->dl);
		t->dd = ctx_realloc(t->ctx, t->dd, t->dcap, nc);
		t->dcap = nc;
	}
}

static void group_deps(tl *t, size_t from)
{
	size_t n = t->dlen - from, cnt[2 * TCP_NCTX] = {0}, at[2 * TCP_NCTX], pos = from;
	dl_reserve(t, n + 2 * TCP_NCTX);
	ts_id *dl = t->dl + t->dlen + 2 * TCP_NCTX; /* a copy, past the grouped list's end */
	uint8_t *dd = t->dd + t->dlen + 2 * TCP_NCTX;
	memcpy(dl, t->dl + from, n * sizeof *dl);
	memcpy(dd, t->dd + from, n);
	for (size_t k = 0; k < n; k++)
		cnt[(dl[k] < t->s->nop ? t->octx[dl[k]] : 0) * 2 + dd[k]]++;
	for (int g = 0; g < 2 * TCP_NCTX; g++)
		if (cnt[g]) {
			t->dl[pos] = (ts_id)cnt[g], t->dd[pos] = (uint8_t)(DEP_HDR | (unsigned)g);
			at[g] = pos + 1;
			pos += cnt[g] + 1;
		}
	for (size_t k = 0; k < n; k++) {
		size_t g = (size_t)(dl[k] < t->s->nop ? t->octx[dl[k]] : 0) * 2 + dd[k];
		t->dl[at[g]] = dl[k], t->dd[at[g]++] = dd[k];
	}
	t->dlen = pos;
}

static void dep_list(tl *t, ts_id a)
{
	const tcp_sched *s = t->s;
	const ts_op *o = &s->op[a];
	int ca = tcp_op_ctx[o->in.op];
	struct {
		ts_id r, d;
		uint8_t ctx, dist;
	} grp[DEP_GROUPS];
	int ng = 0;
	if (++t->stamp == 0) {
		memset(t->gstamp, 0, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gstamp);
		t->stamp = 1;
	}
	dl_reserve(t, o->ndep);
	t->dfirst[a] = (uint32_t)t->dlen;
	for (uint32_t k = 0; k < o->ndep; k++) {
		ts_id d = o->dep[k], r = d < s->nop ? t->oreg[d] : TS_NONE;
		uint8_t dist = o->dist[k] != 0;
		int cd = d < s->nop ? t->octx[d] : -1;
		if (cd == ca)
			continue;
		bool ordered = r != TS_NONE &&
			       (dist ? !t->rloop[r] : r == t->oreg[a] && t->oidx[d] < t->oidx[a]);
		size_t key = ordered ? ((size_t)r * TCP_NCTX + (size_t)cd) * 2 + dist : 0;
		int j = ordered && t->gstamp[key] == t->stamp ? (int)t->gidx[key] : ng;
		if (ordered && j < ng) {
			if (t->oidx[d] > t->oidx[grp[j].d])
				grp[j].d = d;
			continue;
		}
		if (ordered && ng < DEP_GROUPS) {
			t->gstamp[key] = t->stamp, t->gidx[key] = (uint32_t)ng;
			grp[ng].r = r, grp[ng].d = d, grp[ng].ctx = (uint8_t)cd, grp[ng++].dist = dist;
			continue;
		}
		t->dl[t->dlen] = d;
		t->dd[t->dlen++] = dist;
	}
	for (int j = 0; j < ng; j++)
		t->dl[t->dlen] = grp[j].d, t->dd[t->dlen++] = grp[j].dist;
	group_deps(t, t->dfirst[a]);
	t->dn[a] = (uint32_t)(t->dlen - t->dfirst[a]);
}

static void run_op(tl *t, ts_id id)
{
	const ts_op *o = &t->s->op[id];
	int ctx = tcp_op_ctx[o->in.op];
	bool holds;
	int64_t dur = op_cost(t, id, &holds) + tcp_cost_issue(&t->cm, ctx);
	scalar_insn(t, o->in.op);
	int64_t start = t->tc > t->cfree[ctx] ? t->tc : t->cfree[ctx];
	if (holds && t->cfree[TCP_CTX_MAIN] > start)
		start = t->cfree[TCP_CTX_MAIN];
	/* an op run once reads its dependencies as they are (listing them costs
	 * as much); from its second run, its list */
	if (t->dfirst[id] == DEPS_ONCE)
		dep_list(t, id);
	bool once = t->dfirst[id] == DEPS_NONE;
	const ts_id *dl = once ? o->dep : t->dl + t->dfirst[id];
	const uint8_t *dd = once ? o->dist : t->dd + t->dfirst[id];
	t->dfirst[id] = once ? DEPS_ONCE : t->dfirst[id];
	for (uint32_t k = 0, n = once ? o->ndep : t->dn[id]; k < n; k++) {
		if (!once && (dd[k] & DEP_HDR)) {
			unsigned g = dd[k] & ~DEP_HDR;
			if ((g & 1u ? t->cprev : t->cfree)[g >> 1] <= start)
				k += dl[k];
			continue;
		}
		ts_id d = dl[k];
		/* distance 1: the previous block's run, even where d already ran in this one */
		int64_t e = d >= t->s->nop ? -1 : dd[k] && t->blk[d] == t->block ? t->prev[d] : t->end[d];
		start = e > start ? e : start;
	}
	int64_t end = start + dur;
	t->cfree[ctx] = end;
	if (holds)
		t->cfree[TCP_CTX_MAIN] = end;
	if (t->start[id] < 0)
		t->cost[id] = dur;
	if (t->blk[id] != t->block)
		t->prev[id] = t->end[id], t->blk[id] = t->block;
	t->start[id] = start;
	t->end[id] = end;
	if (o->in.op == TCP_OP_DMA_SPM) {
		stage(t, &o->in);
		for (int w = TCP_V_S0; w <= TCP_V_S2; w++)
			if (o->in.v[w].t >= 0)
				t->staged[o->in.v[w].t] = end;
	}
}

static bool inside_loop(const tcp_sched *s, ts_id r, uint32_t loop)
{
	for (int depth = 0; r != TS_NONE && r < s->nrg && depth < 70; depth++, r = s->rg[r].parent)
		if (s->rg[r].kind == TS_RG_LOOP && s->rg[r].loop == loop)
			return true;
	return false;
}

static void run_scalar(tl *t, ts_id id)
{
	const ts_scalar *x = &t->s->sc[id];
	int64_t *v = t->val, a = x->a != TS_NONE ? v[x->a] : 0, b = x->b != TS_NONE ? v[x->b] : x->imm;
	switch (x->kind) {
	case TS_SC_CONST: scalar_insn(t, TCP_OP_LI), v[id] = x->imm; break;
	case TS_SC_SPM_LD: {
		int64_t el = x->a != TS_NONE ? a : x->imm;
		int32_t w = 0;
		if (x->buf < t->s->nbuf && t->staged[x->buf] > t->tc)
			t->tc = t->staged[x->buf];
		scalar_insn(t, TCP_OP_LD);
		if (!tcp_staged_find(t->d, t->nd, (int32_t)x->buf, el, &w))
			t->approx_ld++;
		v[id] = w;
		break;
	}
	case TS_SC_ALU:
		scalar_insn(t, TCP_OP_ALU);
		v[id] = x->op == TCP_S_ADD ? (int64_t)((uint64_t)a + (uint64_t)b)
			: x->op == TCP_S_SUB ? (int64_t)((uint64_t)a - (uint64_t)b)
			: x->op == TCP_S_MUL ? (int64_t)((uint64_t)a * (uint64_t)b)
			: x->op == TCP_S_AND ? (a & b)
			: x->op == TCP_S_MIN ? (a < b ? a : b)
					     : (a > b ? a : b);
		break;
	case TS_SC_CMP: {
		bool c = x->op == TCP_C_LT ? a < b : x->op == TCP_C_GE ? a >= b : x->op == TCP_C_EQ ? a == b : a != b;
		if (x->b == TS_NONE)
			scalar_insn(t, TCP_OP_LI);
		scalar_insn(t, TCP_OP_LI);
		scalar_insn(t, TCP_OP_BR);
		if (!c)
			scalar_insn(t, TCP_OP_LI);
		v[id] = c;
		break;
	}
	case TS_SC_LOOPVAR: scalar_insn(t, TCP_OP_ALU), v[id] = a; break;
	case TS_SC_LOOPIDX:
		if (!inside_loop(t->s, x->region, (uint32_t)x->imm))
			scalar_insn(t, TCP_OP_LI), v[id] = 0;
		break;
	default: break;
	}
}

static void run_region(tl *t, ts_id r, int depth);

static void run_items(tl *t, ts_id r, int depth)
{
	const ts_region *g = &t->s->rg[r];
	for (uint32_t k = 0; k < g->nitem && !t->fail; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			run_op(t, id);
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			run_scalar(t, id);
		else
			run_region(t, id, depth + 1);
	}
}

static void run_loop(tl *t, ts_id r, int depth)
{
	const tcp_sched *s = t->s;
	const ts_loop *l = &s->loop[s->rg[r].loop];
	/* the body's loop-carried values, in scalar order */
	uint32_t nv = 0;
	for (ts_id i = 0; i < s->nsc; i++)
		nv += s->sc[i].kind == TS_SC_LOOPVAR && s->sc[s->sc[i].b].region == l->body;
	ts_id *lv = ctx_alloc(t->ctx, (nv + 1) * sizeof *lv);
	nv = 0;
	for (ts_id i = 0; i < s->nsc; i++)
		if (s->sc[i].kind == TS_SC_LOOPVAR && s->sc[s->sc[i].b].region == l->body)
			lv[nv++] = i;
	scalar_insn(t, TCP_OP_LI);
	t->val[l->g] = 0;
	run_region(t, l->prologue, depth + 1);
	scalar_insn(t, TCP_OP_BR);
	if (t->val[l->nb] > 0)
		for (int64_t g = 0; g < l->G && !t->fail; g++) {
			t->val[l->g] = g;
			scalar_insn(t, TCP_OP_BR);
			if (g < t->val[l->nb]) {
				t->block++;
				memcpy(t->cprev, t->cfree, sizeof t->cprev);
				run_region(t, l->body, depth + 1);
				for (uint32_t k = 0; k < nv; k++)
					scalar_insn(t, TCP_OP_ALU), t->val[lv[k]] = t->val[s->sc[lv[k]].b];
			}
			scalar_insn(t, TCP_OP_ALU);
			scalar_insn(t, TCP_OP_LI);
			scalar_insn(t, TCP_OP_BR);
		}
	ctx_free(t->ctx, lv, (nv + 1) * sizeof *lv);
	run_region(t, l->epilogue, depth + 1);
}

static void run_region(tl *t, ts_id r, int depth)
{
	const ts_region *g = &t->s->rg[r];
	if (depth > 70 || t->fail)
		return;
	switch (g->kind) {
	case TS_RG_SEQ: run_items(t, r, depth); break;
	case TS_RG_GUARD:
		scalar_insn(t, TCP_OP_LI);
		scalar_insn(t, TCP_OP_BR);
		if (t->val[g->pred])
			run_items(t, r, depth);
		break;
	case TS_RG_CLASSES:
		for (uint32_t k = 0; k < g->nitem; k++) {
			bool last = k + 1 == g->nitem;
			if (!last) {
				scalar_insn(t, TCP_OP_LI);
				scalar_insn(t, TCP_OP_BR);
				if (g->bound[k] < t->val[g->pred])
					continue;
			}
			run_region(t, TS_ITEM_ID(g->item[k]), depth + 1);
			if (!last)
				scalar_insn(t, TCP_OP_JMP);
			break;
		}
		break;
	case TS_RG_LOOP: run_loop(t, r, depth); break;
	default: run_items(t, r, depth); break;
	}
}

/* ---- the entries ---- */
static void release(tl *t)
{
	size_t n = t->s->nop + 1;
	ctx_free(t->ctx, t->val, 0);
	ctx_free(t->ctx, t->slots, 0);
	ctx_free(t->ctx, t->staged, 0);
	ctx_free(t->ctx, t->route, 0);
	ctx_free(t->ctx, t->dmn, 0);
	ctx_free(t->ctx, t->prev, 0);
	ctx_free(t->ctx, t->blk, 0);
	void *deps[] = {t->oreg, t->oidx, t->dfirst, t->dn, t->dl, t->dd, t->rloop, t->octx, t->mlast, t->gidx, t->gstamp};
	for (size_t k = 0; k < sizeof deps / sizeof *deps; k++)
		if (deps[k])
			ctx_free(t->ctx, deps[k], 0);
	if (t->start)
		ctx_free(t->ctx, t->start, n * sizeof *t->start);
	if (t->end)
		ctx_free(t->ctx, t->end, n * sizeof *t->end);
	if (t->cost)
		ctx_free(t->ctx, t->cost, n * sizeof *t->cost);
	if (t->own_memo)
		ts_cost_cache_free(t->ctx, t->memo);
	if (t->p)
		tcp_prog_free(t->p);
}

/* Runs the timeline; t's arrays stay allocated (release). */
static int64_t run(moe_ctx *ctx, const tcp_sched *s, const moe_tcp_loads *loads, tl *t, ts_cost_cache *memo)
{
	memset(t, 0, sizeof *t);
	t->ctx = ctx;
	t->memo = memo;
	t->own_memo = !memo;
	t->s = s;
	t->m = s->m;
	t->given = loads;
	if (!s->m) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the schedule's timeline needs a machine");
		return -1;
	}
	tcp_cm_init(&t->cm, s->m);
	if (t->own_memo)
		t->memo = ts_cost_cache_new(ctx);
	t->S = tcp_slices(s->m);
	t->p = tensors(ctx, s);
	size_t n = s->nop + 1;
	t->val = ctx_alloc(ctx, (s->nsc + 1) * sizeof *t->val);
	t->staged = ctx_alloc(ctx, (s->nbuf + 1) * sizeof *t->staged);
	t->route = ctx_alloc(ctx, n);
	t->dmn = ctx_alloc(ctx, (size_t)tcp_meter_stamps(s->m) * sizeof *t->dmn);
	t->start = ctx_alloc(ctx, n * sizeof *t->start);
	t->end = ctx_alloc(ctx, n * sizeof *t->end);
	t->cost = ctx_alloc(ctx, n * sizeof *t->cost);
	t->prev = ctx_alloc(ctx, n * sizeof *t->prev);
	t->blk = ctx_alloc(ctx, n * sizeof *t->blk);
	t->oreg = ctx_alloc(ctx, n * sizeof *t->oreg);
	t->oidx = ctx_alloc(ctx, n * sizeof *t->oidx);
	t->dfirst = ctx_alloc(ctx, n * sizeof *t->dfirst);
	t->dn = ctx_alloc(ctx, n * sizeof *t->dn);
	t->rloop = ctx_alloc(ctx, s->nrg + 1);
	t->gidx = ctx_alloc(ctx, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gidx);
	t->gstamp = ctx_alloc(ctx, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gstamp);
	memset(t->gstamp, 0, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gstamp);
	t->octx = ctx_alloc(ctx, n);
	t->mlast = ctx_alloc(ctx, n * sizeof *t->mlast);
	memset(t->mlast, 0, n * sizeof *t->mlast);
	positions(t);
	memset(t->val, 0, (s->nsc + 1) * sizeof *t->val);
	memset(t->route, 0, n);
	memset(t->dmn, 0, (size_t)tcp_meter_stamps(s->m) * sizeof *t->dmn);
	tcp_meter_init(&t->mt, &t->cm, t->p, t->dmn);
	for (size_t i = 0; i < n; i++)
		t->start[i] = t->end[i] = t->prev[i] = -1, t->cost[i] = 0, t->blk[i] = -1;
	for (ts_id i = 0; i <= s->nbuf; i++)
		t->staged[i] = -1;
	t->bexp = s->nloop > 0 && s->loop[0].expert != TS_NONE && s->sc[s->loop[0].expert].kind == TS_SC_SPM_LD
			  ? (int32_t)s->sc[s->loop[0].expert].buf
			  : -1;
	if (loads && (loads->grid < 0 || loads->nblocks < 0 || loads->nblocks > loads->grid ||
			     (loads->grid > 0 && !loads->block_expert))) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the loads need 0 <= nblocks <= grid and a block_expert array");
		return -1;
	}
	t->tc = s->m->launch_cycles;
	run_region(t, s->top, 0);
	if (t->fail)
		return -1;
	int64_t end = t->tc;
	for (int c = 0; c < TCP_NCTX; c++)
		end = end > t->cfree[c] ? end : t->cfree[c];
	return end + s->m->end_cycles;
}

static int64_t predict(moe_ctx *ctx, const tcp_sched *s, const moe_tcp_loads *loads, ts_timeline *out)
{
	tl t;
	int64_t cycles = run(ctx, s, loads, &t, NULL);
	if (out) {
		memset(out, 0, sizeof *out);
		out->cycles = cycles;
		out->nblocks = t.nblocks;
		out->approx_ld = t.approx_ld;
		out->approx_idx = t.approx_idx;
		if (cycles >= 0) {
			out->start = t.start, out->end = t.end, out->cost = t.cost;
			t.start = t.end = t.cost = NULL;
		}
	}
	release(&t);
	return cycles;
}

int64_t tcp_sched_predict(moe_ctx *ctx, const tcp_sched *s, const moe_tcp_loads *loads, ts_timeline *out)
{
	CTX_GUARDED(ctx, int64_t, -1, predict(ctx, s, loads, out));
}

void ts_timeline_free(moe_ctx *ctx, const tcp_sched *s, ts_timeline *t)
{
	size_t n = s->nop + 1;
	if (t->start)
		ctx_free(ctx, t->start, n * sizeof *t->start);
	if (t->end)
		ctx_free(ctx, t->end, n * sizeof *t->end);
	if (t->cost)
		ctx_free(ctx, t->cost, n * sizeof *t->cost);
	t->start = t->end = t->cost = NULL;
}

/* the op costs on the expected loads; the run's cycles, -1 on failure */
static int64_t cost(moe_ctx *ctx, tcp_sched *s, ts_cost_cache *memo)
{
	tl t;
	int64_t cycles = run(ctx, s, NULL, &t, memo);
	if (cycles < 0) {
		release(&t);
		return -1;
	}
	t.zero = true;
	for (ts_id i = 0; i < s->nop; i++) {
		bool holds;
		s->op[i].cost = t.start[i] >= 0 ? t.cost[i] : op_cycles(&t, i, &holds) + tcp_cost_issue(&t.cm, s->op[i].ctx);
	}
	release(&t);
	return cycles;
}

static moe_status cost_status(moe_ctx *ctx, tcp_sched *s)
{
	return cost(ctx, s, NULL) < 0 ? MOE_ERR_INVALID : MOE_OK;
}

moe_status tcp_sched_cost(moe_ctx *ctx, tcp_sched *s)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, cost_status(ctx, s));
}

int64_t tcp_sched_cost_cached(moe_ctx *ctx, tcp_sched *s, ts_cost_cache *c)
{
	CTX_GUARDED(ctx, int64_t, -1, cost(ctx, s, c));
}

/* ---- predictions on the expected loads with a cost cache ---- */
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

static int64_t predict_cached(moe_ctx *ctx, const tcp_sched *s, ts_cost_cache *memo)
{
	tl t;
	int64_t cycles = run(ctx, s, NULL, &t, memo);
	release(&t);
	return cycles;
}

int64_t tcp_sched_predict_cached(moe_ctx *ctx, const tcp_sched *s, ts_cost_cache *memo)
{
	CTX_GUARDED(ctx, int64_t, -1, predict_cached(ctx, s, memo));
}
