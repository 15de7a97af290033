/* backend-tcp/legal_dma.c: the lowering's last step, which makes its indirect
 * DMA and sub loads what the machine has (docs/tcp-isa.md sections 7 and 9).
 *
 * A gather moves HBM rows into DM, a scatter DM rows to HBM at the byte
 * offsets of an HBM index list, and a sub load reads its own slice's DM
 * unless it takes the switch. The lowering's passes build gathers and
 * scatters between any two spaces; this pass rewrites each other form
 * through HBM, moving the same bytes to the same places:
 * - a gather from a DM tensor whose every writer is a whole copy of a
 *   read-only HBM tensor (x's DM copy) reads that HBM tensor instead;
 * - a gather from any other DM tensor reads an HBM shadow of it, copied
 *   from it right before;
 * - a gather into HBM gathers into a DM scratch and copies that to HBM;
 * - a scatter into DM scatters into an HBM shadow of its destination, which
 *   is copied from it before and back into it after (the rows it does not
 *   write keep their bytes);
 * - a scatter's DM list of row positions becomes an HBM list of byte
 *   offsets: one vector pass multiplies it by the row stride in bytes into a
 *   DM scratch, one copy moves that to HBM;
 * - a sub load that a slice cannot serve from its own DM takes the switch;
 *   so does a Tensor Unit pass whose computing slices fetch or commit bytes
 *   they do not hold (flags=switch).
 * The scratch tensors are placed where no other tensor of their space ever
 * is (above every HBM tensor; in DM, the lowest gap), so they share no byte
 * with one. Branch targets and the program's instruction
 * marks follow the inserted instructions (a jump to a rewritten instruction
 * lands on the first instruction inserted before it). */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

enum { MAX_IKEYS = 32 };

typedef struct lg {
	moe_ctx *ctx;
	tcp_program *p;
	const moe_tcp_machine *m;
	int32_t *pure;       /* per tensor: the read-only HBM tensor it is a whole copy of, or -1 */
	int32_t *shadow;     /* per DM tensor: its HBM shadow, or -1 */
	int64_t hbm_top;
	int32_t idx_hbm; /* shared HBM scratch of per-scatter scaled lists */
	int64_t idx_n;   /* its elements */
	tcp_insn *code;
	uint32_t n, cap;
	bool failed;
	/* per DM tensor scattered into: the instructions [lo, hi] through which
	 * its HBM shadow holds its bytes (copied in before lo, out before hi + 1),
	 * lo = -1 when each scatter copies in and out itself */
	int64_t *rlo, *rhi;
	uint32_t nt0; /* the tensors before this pass (rlo, rhi, pure, shadow) */
	/* an index list that scatters read with row stride rb, scaled once into
	 * HBM before the region [lo, hi] of those scatters, which does not write
	 * it (lo = -1: each scatter scales its own list) */
	struct ikey {
		int32_t idx, hbm;
		int64_t rb, lo, hi;
	} ik[MAX_IKEYS];
	int nik;
	/* DM placement of the scratch: the original tensors' live spans (old
	 * instructions), the old instruction before which code is inserted now,
	 * and each new tensor's (-1: not in DM) */
	int64_t *slo, *shi, cur, *newq;
	uint32_t nnewq;
} lg;

static void put(lg *L, const tcp_insn *in)
{
	ctx_grow(L->ctx, (void **)&L->code, &L->cap, L->n + 1, sizeof *L->code);
	L->code[L->n++] = *in;
}

static bool read_only(const tcp_tensor *t)
{
	return t->space == TCP_HBM && (t->kind == TCP_T_INPUT || t->kind == TCP_T_WEIGHT || t->kind == TCP_T_CONST ||
					      t->kind == TCP_T_PACKED);
}

static bool same_view(const tcp_view *a, const tcp_view *b, int nd)
{
	if (a->base != b->base || a->reg != b->reg || (a->reg >= 0 && a->scale != b->scale))
		return false;
	for (int k = 0; k < nd; k++)
		if (a->stride[k] != b->stride[k])
			return false;
	return true;
}

/* pure[t]: every instruction writing DM tensor t copies the same elements of
 * one read-only HBM tensor of t's size in bytes (element for element). */
static void find_pure(lg *L)
{
	const tcp_program *p = L->p;
	for (uint32_t t = 0; t < p->nt; t++)
		L->pure[t] = -2; /* not written yet */
	for (uint32_t k = 0; k < p->ncode; k++) {
		const tcp_insn *in = &p->code[k];
		int32_t d = in->v[TCP_V_DST].t;
		if (d < 0 || tcp_op_ctx[in->op] == TCP_CTX_CTL || in->op == TCP_OP_SUB_TRF || in->op == TCP_OP_SUB_VRF)
			continue;
		int32_t s = in->v[TCP_V_S0].t;
		bool ok = in->op == TCP_OP_DMA_COPY && s >= 0 && p->t[d].space == TCP_DM && read_only(&p->t[s]) &&
			  p->t[s].numel == p->t[d].numel && esz(p->t[s].dtype) == esz(p->t[d].dtype) &&
			  same_view(&in->v[TCP_V_DST], &in->v[TCP_V_S0], in->ndim) && (L->pure[d] == -2 || L->pure[d] == s);
		L->pure[d] = ok ? s : -1;
	}
	for (uint32_t t = 0; t < p->nt; t++)
		if (L->pure[t] == -2)
			L->pure[t] = -1;
}

static void note_new(lg *L, int32_t t, int64_t q);

static int32_t hbm_tensor(lg *L, const char *name, moe_dtype dt, int64_t n)
{
	int32_t t = tcp_add_tensor(L->p, name, TCP_HBM, TCP_T_SCRATCH, dt, 1, &n);
	note_new(L, t, -1);
	int64_t g = L->m->hbm_granule;
	L->p->t[t].addr = L->hbm_top;
	L->hbm_top = (L->hbm_top + n * esz(dt) + g - 1) / g * g;
	return t;
}

/* Whether DM tensor t may hold bytes while code is inserted before old
 * instruction L->cur: a tensor of the lowering live at it or at the one
 * before, a constant, or a scratch of this pass inserted there too. */
static bool busy_now(const lg *L, uint32_t t)
{
	const tcp_tensor *x = &L->p->t[t];
	if (x->space != TCP_DM)
		return false;
	if (t >= L->nt0)
		return L->newq[t - L->nt0] == L->cur;
	return x->kind != TCP_T_SCRATCH || (L->slo[t] >= 0 && L->slo[t] <= L->cur && L->shi[t] >= L->cur - 1);
}

/* The lowest offset of fp bytes per slice (aligned) that no busy DM tensor
 * occupies, or -1. */
static int64_t dm_gap(const lg *L, int64_t fp, int64_t a)
{
	const tcp_program *p = L->p;
	for (int64_t at = 0; at + fp <= L->m->dm_bytes_per_slice;) {
		int64_t next = -1;
		for (uint32_t t = 0; t < p->nt; t++) {
			const tcp_tensor *x = &p->t[t];
			if (busy_now(L, t) && x->addr < at + fp && at < x->addr + x->slice_bytes && x->addr + x->slice_bytes > next)
				next = x->addr + x->slice_bytes;
		}
		if (next < 0)
			return at;
		at = (next + a - 1) / a * a;
	}
	return -1;
}

/* Records new tensor t's insertion point (-1: not in DM). */
static void note_new(lg *L, int32_t t, int64_t q)
{
	uint32_t i = (uint32_t)t - L->nt0;
	ctx_grow(L->ctx, (void **)&L->newq, &L->nnewq, i + 1, sizeof *L->newq);
	L->newq[i] = q;
}

/* A DM scratch live only at the instructions inserted before L->cur. */
static int32_t dm_tensor(lg *L, const char *name, moe_dtype dt, int64_t n)
{
	/* spread: flit-interleaved over the slices, ceil(flits / S) of them each */
	int64_t S = tcp_slices(L->m), a = L->m->dm_align > 0 ? L->m->dm_align : 8, f = L->m->flit_bytes;
	int64_t fp = ((n * esz(dt) + f * S - 1) / (f * S) * f + a - 1) / a * a, at = dm_gap(L, fp, a);
	if (at < 0) {
		moe_diag(L->ctx, MOE_DIAG_ERROR, moe_loc_none(),
			"tcp: no DM left for the %lld bytes per slice of '%s' (a gather or scatter rewritten through HBM)",
			(long long)fp, name);
		L->failed = true;
		at = 0;
	}
	int32_t t = tcp_add_tensor(L->p, name, TCP_DM, TCP_T_SCRATCH, dt, 1, &n);
	L->p->t[t].addr = at;
	L->p->t[t].slice_bytes = fp;
	note_new(L, t, L->cur);
	return t;
}

/* dma.copy of all of tensor s into all of tensor d (the same bytes). */
static void copy_whole(lg *L, int32_t d, int32_t s)
{
	tcp_insn c = tcp_b_dma_copy_flat(d, s, L->p->t[s].numel);
	put(L, &c);
}

static int32_t shadow_of(lg *L, int32_t t)
{
	if (L->shadow[t] < 0) {
		char nm[160];
		snprintf(nm, sizeof nm, "%.120s.hbm", L->p->t[t].name);
		L->shadow[t] = hbm_tensor(L, nm, (moe_dtype)L->p->t[t].dtype, L->p->t[t].numel);
	}
	return L->shadow[t];
}

/* The scatter's DM list of row positions as an HBM list of byte offsets
 * (the row stride of its HBM destination in bytes times each position). */
static void scale_index(lg *L, tcp_insn *in)
{
	int64_t G = in->dim[0], n = in->dim[1], rb = in->v[TCP_V_DST].stride[1] * esz(L->p->t[in->v[TCP_V_DST].t].dtype);
	if (L->idx_hbm < 0 || L->idx_n < G * n) { /* larger lists declare larger ones */
		L->idx_hbm = hbm_tensor(L, "index.bytes.hbm", MOE_I32, G * n);
		L->idx_n = G * n;
	}
	int32_t sd = dm_tensor(L, "index.bytes", MOE_I32, G * n), sh = L->idx_hbm;
	const int64_t vdim[2] = {G, n}, vst[2] = {n, 1};
	tcp_insn v = tcp_b_vec(2, vdim, tcp_b_view(sd, 0, 2, vst));
	v.v[TCP_V_S0] = in->v[TCP_V_S1];
	tcp_b_step(&v, TCP_V_IMUL, TCP_SRC_V, TCP_SRC_IMM, (uint32_t)rb);
	put(L, &v);
	tcp_insn c = tcp_b_dma_copy_flat(sh, sd, G * n);
	put(L, &c);
	in->v[TCP_V_S1] = tcp_view_none();
	in->v[TCP_V_S1].t = sh;
	in->v[TCP_V_S1].stride[0] = n;
	in->v[TCP_V_S1].stride[1] = 1;
	in->flags |= TCP_F_HBMIDX;
}

/* The row stride in bytes of a scatter's HBM side (its destination). */
static int64_t scatter_rb(const tcp_program *p, const tcp_insn *in)
{
	return in->v[TCP_V_DST].stride[1] * esz(p->t[in->v[TCP_V_DST].t].dtype);
}

static struct ikey *ikey_of(lg *L, int32_t idx, int64_t rb)
{
	for (int k = 0; k < L->nik; k++)
		if (L->ik[k].idx == idx && L->ik[k].rb == rb)
			return &L->ik[k];
	return NULL;
}

/* All of index tensor k.idx times k.rb into its HBM list (one vector pass
 * into a DM scratch, one copy). */
static void scale_whole(lg *L, struct ikey *k)
{
	int64_t n = L->p->t[k->idx].numel;
	int32_t sd = dm_tensor(L, "index.bytes", MOE_I32, n);
	if (k->hbm < 0)
		k->hbm = hbm_tensor(L, "index.bytes.hbm", MOE_I32, n);
	tcp_insn v = tcp_b_vec(1, &n, tcp_b_flat(sd));
	v.v[TCP_V_S0] = tcp_b_flat(k->idx);
	tcp_b_step(&v, TCP_V_IMUL, TCP_SRC_V, TCP_SRC_IMM, (uint32_t)k->rb);
	put(L, &v);
	tcp_insn c = tcp_b_dma_copy_flat(k->hbm, sd, n);
	put(L, &c);
}

/* A scatter from HBM: its source copied whole into a DM scratch first. */
static void source_to_dm(lg *L, tcp_insn *in)
{
	const tcp_tensor *t = &L->p->t[in->v[TCP_V_S0].t];
	int32_t d = dm_tensor(L, "scatter.src", (moe_dtype)t->dtype, t->numel);
	copy_whole(L, d, in->v[TCP_V_S0].t);
	in->v[TCP_V_S0].t = d;
}

static void rewrite_scatter(lg *L, tcp_insn in)
{
	const tcp_program *p = L->p;
	int32_t d = in.v[TCP_V_DST].t;
	bool dm_dst = p->t[d].space == TCP_DM;
	if (p->t[in.v[TCP_V_S0].t].space != TCP_DM)
		source_to_dm(L, &in);
	bool own = dm_dst && L->rlo[d] < 0; /* no region: this scatter copies in and out */
	if (own)
		copy_whole(L, shadow_of(L, d), d);
	if (dm_dst)
		in.v[TCP_V_DST].t = shadow_of(L, d);
	struct ikey *k = ikey_of(L, in.v[TCP_V_S1].t, scatter_rb(p, &in));
	if (!(in.flags & TCP_F_HBMIDX) && k && k->lo >= 0) { /* the list scaled before the region */
		in.v[TCP_V_S1].t = k->hbm;
		in.flags |= TCP_F_HBMIDX;
	} else if (!(in.flags & TCP_F_HBMIDX)) {
		scale_index(L, &in);
	}
	put(L, &in);
	if (own)
		copy_whole(L, d, shadow_of(L, d));
}

static void rewrite_gather(lg *L, tcp_insn in)
{
	const tcp_program *p = L->p;
	int32_t s = in.v[TCP_V_S0].t, d = in.v[TCP_V_DST].t;
	if (p->t[in.v[TCP_V_S1].t].space != TCP_DM || (in.flags & TCP_F_HBMIDX)) {
		moe_diag(L->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: a gather by an HBM list has no rewrite (a moec bug)");
		L->failed = true;
		return;
	}
	if (p->t[s].space == TCP_DM) {
		if (L->pure[s] >= 0) {
			in.v[TCP_V_S0].t = L->pure[s];
		} else {
			copy_whole(L, shadow_of(L, s), s);
			in.v[TCP_V_S0].t = shadow_of(L, s);
		}
	}
	if (p->t[d].space == TCP_DM) {
		put(L, &in);
		return;
	}
	/* into a DM scratch of the gathered rows [G, n, row], then to HBM */
	int64_t G = in.dim[0], n = in.dim[1], row = in.dim[2];
	tcp_view dv = in.v[TCP_V_DST], sv = tcp_view_none();
	sv.t = dm_tensor(L, "gather.rows", (moe_dtype)p->t[d].dtype, G * n * row);
	sv.stride[0] = n * row;
	sv.stride[1] = row;
	sv.stride[2] = 1;
	in.v[TCP_V_DST] = sv;
	put(L, &in);
	const int64_t cdim[3] = {G, n, row};
	tcp_insn c = tcp_b_dma_copy(3, cdim, dv, sv);
	put(L, &c);
}

static bool is_branch(const tcp_insn *in)
{
	return (in->op == TCP_OP_BR || in->op == TCP_OP_JMP) && in->target >= 0;
}

static bool gs_legal(const tcp_program *p, const tcp_insn *in)
{
	int s = p->t[in->v[TCP_V_S0].t].space, d = p->t[in->v[TCP_V_DST].t].space;
	if (in->op == TCP_OP_DMA_GATHER)
		return s == TCP_HBM && d == TCP_DM;
	return s == TCP_DM && d == TCP_HBM && (in->flags & TCP_F_HBMIDX);
}

/* Branch targets and marks to the new positions: a jump to old instruction
 * a lands on the first instruction inserted before it, except a jump from
 * inside a region that starts at a, which lands past the region's copy in
 * (old[k]: the old instruction of new instruction k). */
static void fix_marks(const lg *L, tcp_program *p, const uint32_t *at, const uint32_t *after_in, const int64_t *old)
{
	for (uint32_t k = 0; k < p->ncode; k++) {
		if (!is_branch(&p->code[k]))
			continue;
		int64_t a = p->code[k].target, b = old[k];
		bool inside = false;
		for (uint32_t t = 0; t < L->nt0 && !inside; t++)
			inside = L->rlo[t] == a && b >= L->rlo[t] && b <= L->rhi[t];
		for (int i = 0; i < L->nik && !inside; i++)
			inside = L->ik[i].lo == a && b >= L->ik[i].lo && b <= L->ik[i].hi;
		p->code[k].target = (int32_t)(inside ? after_in[a] : at[a]);
	}
	int32_t *pcs[] = {&p->block_loop_pc, &p->block_body_pc, &p->tier_loop_pc};
	for (int k = 0; k < 3; k++) /* a loop's first instruction: past a region's copy in */
		if (*pcs[k] >= 0)
			*pcs[k] = (int32_t)after_in[*pcs[k]];
}

/* Widens [*lo, *hi] until control enters it only at lo and leaves it only
 * to hi + 1, and every loop meeting it lies inside it. */
static void close_region(const tcp_program *p, int64_t *lo, int64_t *hi)
{
	for (bool again = true; again;) {
		again = false;
		for (uint32_t b = 0; b < p->ncode; b++) {
			if (!is_branch(&p->code[b]))
				continue;
			int64_t a = p->code[b].target, l = *lo, h = *hi;
			bool in_b = b >= l && b <= h;
			if (a <= b && a <= h && b >= l) { /* a loop meeting the region */
				l = a < l ? a : l;
				h = (int64_t)b > h ? b : h;
			} else if (!in_b && a > l && a <= h + 1) { /* entered past lo, or at the exit from outside */
				l = b < l ? b : l;
				h = (int64_t)b > h ? b : h;
			} else if (in_b && (a < l || a > h + 1)) { /* left other than to hi + 1 */
				l = a < l ? a : l;
				h = a > h + 1 ? a - 1 : h;
			}
			if (l != *lo || h != *hi) {
				*lo = l;
				*hi = h;
				again = true;
			}
		}
	}
}

/* Whether an instruction in [lo, hi] writes tensor t. */
static bool writes_in(const tcp_program *p, int32_t t, int64_t lo, int64_t hi)
{
	for (int64_t k = lo; k <= hi; k++) {
		const tcp_insn *in = &p->code[k];
		if (tcp_op_ctx[in->op] != TCP_CTX_CTL && in->v[TCP_V_DST].t == t)
			return true;
	}
	return false;
}

/* The unscaled scatters' index lists by (list, row stride), each with the
 * region of its scatters when the region does not write the list. */
static void find_index_regions(lg *L)
{
	const tcp_program *p = L->p;
	for (uint32_t k = 0; k < p->ncode; k++) {
		const tcp_insn *in = &p->code[k];
		if (in->op != TCP_OP_DMA_SCATTER || (in->flags & TCP_F_HBMIDX) || p->t[in->v[TCP_V_S1].t].space != TCP_DM)
			continue;
		struct ikey *e = ikey_of(L, in->v[TCP_V_S1].t, scatter_rb(p, in));
		if (!e && L->nik < MAX_IKEYS) {
			e = &L->ik[L->nik++];
			*e = (struct ikey){in->v[TCP_V_S1].t, -1, scatter_rb(p, in), k, k};
		}
		if (e)
			e->hi = k;
	}
	for (int i = 0; i < L->nik; i++) {
		struct ikey *e = &L->ik[i];
		close_region(p, &e->lo, &e->hi);
		if (e->rb < 1 || writes_in(p, e->idx, e->lo, e->hi))
			e->lo = e->hi = -1;
	}
}

/* Widens tensor t's live span over old instructions [a, b]. */
static void live_at(lg *L, uint32_t t, int64_t a, int64_t b)
{
	if (L->slo[t] < 0 || a < L->slo[t])
		L->slo[t] = a;
	if (b > L->shi[t])
		L->shi[t] = b;
}

/* For each DM tensor that scatters write: a region in which nothing else
 * names it, so that its HBM shadow holds it there (one copy in, one out). */
static void find_regions(lg *L)
{
	const tcp_program *p = L->p;
	for (uint32_t t = 0; t < p->nt; t++)
		L->rlo[t] = L->rhi[t] = -1;
	for (uint32_t k = 0; k < p->ncode; k++) {
		const tcp_insn *in = &p->code[k];
		int32_t d = in->v[TCP_V_DST].t;
		if (in->op != TCP_OP_DMA_SCATTER || p->t[d].space != TCP_DM)
			continue;
		if (L->rlo[d] < 0)
			L->rlo[d] = k;
		L->rhi[d] = k;
	}
	for (uint32_t t = 0; t < p->nt; t++) {
		if (L->rlo[t] < 0)
			continue;
		close_region(p, &L->rlo[t], &L->rhi[t]);
		bool alone = L->rhi[t] + 1 < (int64_t)p->ncode;
		for (int64_t k = L->rlo[t]; k <= L->rhi[t] && alone; k++) {
			const tcp_insn *in = &p->code[k];
			bool mine = in->op == TCP_OP_DMA_SCATTER && in->v[TCP_V_DST].t == (int32_t)t;
			for (int w = 0; w < TCP_NVIEW && !mine; w++)
				alone = in->v[w].t != (int32_t)t;
		}
		if (!alone)
			L->rlo[t] = L->rhi[t] = -1;
	}
	find_index_regions(L);
	/* regions that start at one instruction must end at one too (a jump
	 * from inside one to that start skips all their copies in) */
	for (uint32_t t = 0; t < p->nt; t++)
		for (int i = 0; i < L->nik; i++)
			if (L->rlo[t] >= 0 && L->ik[i].lo == L->rlo[t] && L->ik[i].hi != L->rhi[t])
				L->ik[i].lo = L->ik[i].hi = -1;
	for (uint32_t a = 0; a < p->nt; a++)
		for (uint32_t b = a + 1; b < p->nt && L->rlo[a] >= 0; b++)
			if (L->rlo[b] == L->rlo[a] && L->rhi[b] != L->rhi[a])
				L->rlo[b] = L->rhi[b] = -1;
	for (int i = 0; i < L->nik; i++)
		for (int j = i + 1; j < L->nik && L->ik[i].lo >= 0; j++)
			if (L->ik[j].lo == L->ik[i].lo && L->ik[j].hi != L->ik[i].hi)
				L->ik[j].lo = L->ik[j].hi = -1;
	/* the copies in and out, and the scaling, name their tensors there */
	for (uint32_t t = 0; t < p->nt; t++)
		if (L->rlo[t] >= 0)
			live_at(L, t, L->rlo[t], L->rhi[t] + 1);
	for (int i = 0; i < L->nik; i++)
		if (L->ik[i].lo >= 0)
			live_at(L, (uint32_t)L->ik[i].idx, L->ik[i].lo, L->ik[i].lo);
}

/* Before old instruction k: the regions' copies out (ending at k - 1), then
 * in (starting at k); *after_in: where a jump from inside a region starting
 * at k lands (past its copy in). */
static void region_copies(lg *L, uint32_t k, uint32_t *after_in)
{
	for (uint32_t t = 0; t < L->nt0; t++)
		if (L->rlo[t] >= 0 && L->rhi[t] + 1 == (int64_t)k)
			copy_whole(L, (int32_t)t, shadow_of(L, (int32_t)t));
	for (uint32_t t = 0; t < L->nt0; t++)
		if (L->rlo[t] == (int64_t)k)
			copy_whole(L, shadow_of(L, (int32_t)t), (int32_t)t);
	for (int i = 0; i < L->nik; i++)
		if (L->ik[i].lo == (int64_t)k)
			scale_whole(L, &L->ik[i]);
	*after_in = L->n;
}

/* The new code replaces p's (the branch targets and marks follow it). */
static void install(lg *L, const uint32_t *at, const uint32_t *after_in)
{
	tcp_program *p = L->p;
	int64_t *old = ctx_alloc(L->ctx, (L->n + 1) * sizeof *old);
	for (uint32_t k = 0, j = 0; k < L->n; k++) {
		while (j + 1 < p->ncode && at[j + 1] <= k)
			j++;
		old[k] = j;
	}
	ctx_free(L->ctx, p->code, p->ccap * sizeof *p->code);
	p->code = L->code;
	p->ncode = L->n;
	p->ccap = L->cap;
	fix_marks(L, p, at, after_in, old);
	ctx_free(L->ctx, old, (L->n + 1) * sizeof *old);
}

bool tcpl_legalize(moe_ctx *ctx, tcp_program *p, const moe_tcp_machine *m, int64_t *hbm_top)
{
	lg L = {.ctx = ctx, .p = p, .m = m, .hbm_top = *hbm_top, .idx_hbm = -1, .nt0 = p->nt};
	uint32_t nt0 = p->nt, nc0 = p->ncode;
	size_t tsz = (nt0 + 1) * sizeof(int64_t), csz = (nc0 + 1) * sizeof(uint32_t);
	L.pure = ctx_alloc(ctx, (nt0 + 1) * sizeof *L.pure);
	L.shadow = ctx_alloc(ctx, (nt0 + 1) * sizeof *L.shadow);
	L.rlo = ctx_alloc(ctx, tsz);
	L.rhi = ctx_alloc(ctx, tsz);
	L.slo = ctx_alloc(ctx, tsz);
	L.shi = ctx_alloc(ctx, tsz);
	tcpl_live_spans(ctx, p, L.slo, L.shi); /* before find_regions, which widens them */
	for (uint32_t t = 0; t < nt0; t++) {
		const tcp_tensor *x = &p->t[t];
		int64_t g = m->hbm_granule, end = (x->addr + x->numel * esz(x->dtype) + g - 1) / g * g;
		L.shadow[t] = -1;
		if (x->space == TCP_HBM && end > L.hbm_top)
			L.hbm_top = end;
	}
	find_pure(&L);
	find_regions(&L);
	uint32_t *at = ctx_alloc(ctx, csz), *after_in = ctx_alloc(ctx, csz);
	for (uint32_t k = 0; k <= nc0 && !L.failed; k++) {
		at[k] = L.n;
		L.cur = k;
		region_copies(&L, k, &after_in[k]);
		if (k == nc0)
			break;
		tcp_insn in = p->code[k];
		char why[256];
		if ((in.op == TCP_OP_SUB_TRF || in.op == TCP_OP_SUB_VRF) && !(in.flags & TCP_F_SWITCH) &&
			!tcp_load_local(p, m, &in, why, sizeof why))
			in.flags |= TCP_F_SWITCH;
		bool gs = in.op == TCP_OP_DMA_GATHER || in.op == TCP_OP_DMA_SCATTER;
		if (gs && !gs_legal(p, &in) && in.op == TCP_OP_DMA_GATHER)
			rewrite_gather(&L, in);
		else if (gs && !gs_legal(p, &in))
			rewrite_scatter(&L, in);
		else
			put(&L, &in);
	}
	if (!L.failed) {
		install(&L, at, after_in);
		*hbm_top = L.hbm_top;
		/* a pass whose slices fetch or commit bytes they do not hold routes them
		 * through the switch (docs/tcp-isa.md section 9) */
		for (uint32_t k = 0; k < p->ncode; k++) {
			tcp_insn *in = &p->code[k];
			char why[256];
			if ((in->op == TCP_OP_TU_VEC || in->op == TCP_OP_TU_CONTRACT) && !(in->flags & TCP_F_ROUTE) &&
				tcp_pass_remote(p, m, in, why, sizeof why))
				in->flags |= TCP_F_ROUTE;
		}
	} else {
		ctx_free(ctx, L.code, L.cap * sizeof *L.code);
	}
	ctx_free(ctx, at, csz);
	ctx_free(ctx, after_in, csz);
	ctx_free(ctx, L.rlo, tsz);
	ctx_free(ctx, L.rhi, tsz);
	ctx_free(ctx, L.slo, tsz);
	ctx_free(ctx, L.shi, tsz);
	ctx_free(ctx, L.newq, L.nnewq * sizeof *L.newq);
	ctx_free(ctx, L.pure, (nt0 + 1) * sizeof *L.pure);
	ctx_free(ctx, L.shadow, (nt0 + 1) * sizeof *L.shadow);
	return !L.failed;
}
