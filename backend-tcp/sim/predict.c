/* backend-tcp/sim/predict.c: the prediction of a program's time (moe_tcp_predict).
 *
 * A prediction is a simulator run in predict mode: the same instruction loop,
 * timeline (sim_sched.c) and cost rules (isa/cost.c) as a run, but no tensor
 * has storage and no command computes. The control path's only
 * data-dependent inputs are the scalars staged into SPM before the block
 * loop (the block loop's staging, docs/tcp-isa.md 7.4: descriptors s0.. in the order nblocks,
 * block experts, block rows; nblocks absent where the count is a
 * compile-time one, a decode grid). In predict mode that staging writes the
 * loads: the caller's, or the expected loads generated here. Every other
 * value a command would read is approximated, and counted:
 *   - an ld of another tensor reads 0, except a serving program's n_tokens
 *     input and its one-element copies (dma.copy), which read the loads'
 *     n_tokens (T when none is given);
 *   - a gather's or scatter's index list reads the staged loads where it is
 *     one of them (a decode's expert list); with the caller's loads, a list
 *     into a block grid's slots (rows = the loads' grid x B) whose n equals
 *     the rows the loads fill names those slots (slot_row); else n valid
 *     positions of a group name n distinct rows spread evenly over the
 *     group's rows (position j: row j x rows / n), as a block's token list
 *     is spread over x.
 * In a run with moe_tcp_run_opts.observed the staging's values are recorded
 * instead, so that the run can be predicted on its own loads. */
#include <stdlib.h>

#include "backend-tcp/sim/sim_int.h"

struct tcps_pred {
	const moe_tcp_loads *given; /* NULL: expected loads */
	int64_t n_tokens;           /* what an ld of the n_tokens input reads */
	int stagings;
	bool refused; /* caller loads staged a second time */
	int order_bytes; /* moe_tcp_run_opts.order_bytes of the predicted run */
	tcp_staged d[3];
	int nd;
	int32_t nbr[3]; /* the block count's descriptor's values (tcp_staged_counts) */
	int32_t *gen_e, *gen_r; /* the expected loads' arrays (malloc'd) */
	int64_t gen_nblocks;
	int64_t approx_ld, approx_idx;
	/* the DM copies of the n_tokens input (a dma.copy of it before its
	 * staging): element el of tensor t holds it */
	struct {
		int32_t t;
		int64_t el;
	} tok[8];
	int ntok;
	/* the grid slots the caller's loads fill, ascending (slot_row) */
	int64_t *slots, nslots;
	bool slots_done;
};

/* ---- the staging command ---- */

/* The descriptor of the block experts in staging command `in` (a view of the
 * block loop's or the decode tier's expert tensor), or -1: not a staging. */
static int bexp_desc(const sim *s, const tcp_insn *in)
{
	for (int w = TCP_V_S0; w <= TCP_V_S2; w++) {
		int32_t t = in->v[w].t;
		if (t >= 0 && (t == s->p->bexp_t || t == s->p->tier_bexp_t))
			return w;
	}
	return -1;
}

static bool is_tokens_input(const sim *s, int32_t t)
{
	const tcp_tensor *x = &s->p->t[t];
	return x->kind == TCP_T_INPUT && x->name && !strcmp(x->name, MOE_TOKENS_INPUT);
}

/* splitmix64: the expected routing's fixed generator */
static uint64_t next_u64(uint64_t *st)
{
	uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The expected loads of a grid of G blocks: ntok tokens each pick K distinct
 * of E experts (a partial Fisher-Yates shuffle per token from one seeded
 * generator); a decode grid (no block-count descriptor) takes the one
 * token's picks in order, one row each; else the blocks go expert by
 * expert, ceil(count / B) per expert, rows min(B, what is left). Entries
 * past the block count: expert 0, rows 0. False when memory is refused. */
static bool expected(sim *s, tcps_pred *pr, int64_t G, bool decode)
{
	const tcp_program *p = s->p;
	int64_t E = p->moe_E > 0 ? p->moe_E : 1, K = p->moe_K < E ? p->moe_K : E, B = p->moe_B > 0 ? p->moe_B : 1;
	int64_t ntok = decode ? 1 : pr->n_tokens;
	free(pr->gen_e);
	free(pr->gen_r);
	pr->gen_e = calloc((size_t)(G > 0 ? G : 1), sizeof *pr->gen_e);
	pr->gen_r = calloc((size_t)(G > 0 ? G : 1), sizeof *pr->gen_r);
	int64_t *cnt = calloc((size_t)E, sizeof *cnt);
	int32_t *perm = malloc((size_t)E * sizeof *perm);
	if (!pr->gen_e || !pr->gen_r || !cnt || !perm) {
		free(cnt);
		free(perm);
		return false;
	}
	for (int64_t e = 0; e < E; e++)
		perm[e] = (int32_t)e;
	uint64_t st = 0x6d6f65632d707265ull; /* fixed: every prediction of a program routes alike */
	int64_t nb = 0;
	for (int64_t t = 0; t < ntok; t++)
		for (int64_t k = 0; k < K; k++) {
			int64_t j = k + (int64_t)(next_u64(&st) % (uint64_t)(E - k));
			int32_t x = perm[k];
			perm[k] = perm[j];
			perm[j] = x;
			cnt[perm[k]]++;
			if (decode && nb < G)
				pr->gen_e[nb] = perm[k], pr->gen_r[nb++] = 1;
		}
	for (int64_t e = 0; e < E && !decode; e++)
		for (int64_t left = cnt[e]; left > 0 && nb < G; left -= B)
			pr->gen_e[nb] = (int32_t)e, pr->gen_r[nb++] = (int32_t)(left < B ? left : B);
	pr->gen_nblocks = nb;
	free(cnt);
	free(perm);
	return true;
}

/* Predict mode: the staging writes the loads over its descriptors. */
static void stage_loads(sim *s, uint32_t pc, const tcp_insn *in, int be)
{
	tcps_pred *pr = s->pr;
	int64_t G = in->dim[0];
	bool decode = be == TCP_V_S0; /* no block-count descriptor: a compile-time count */
	int rw = be < TCP_V_S2 && in->v[be + 1].t >= 0 ? be + 1 : -1;
	const moe_tcp_loads *l = pr->given;
	if (l && ++pr->stagings > 1) {
		FAULT(s, pc, "the program stages a block loop a second time; one set of loads predicts one loop");
		pr->refused = true;
		return;
	}
	if (l && (l->grid != G || (rw >= 0 && !l->block_rows))) {
		FAULT(s, pc, "the loads give %lld grid entries%s; this program's block loop stages %lld%s", (long long)l->grid,
			rw >= 0 && !l->block_rows ? " and no block rows" : "", (long long)G, rw >= 0 ? " with their rows" : "");
		return;
	}
	if (!l && !expected(s, pr, G, decode)) {
		FAULT(s, pc, "out of host memory for the expected loads");
		return;
	}
	const int32_t *ve = l ? l->block_expert : pr->gen_e, *vr = l ? l->block_rows : pr->gen_r;
	int64_t nb = l ? l->nblocks : pr->gen_nblocks;
	pr->nd = 0;
	if (!decode) {
		const tcp_view *v = &in->v[be - 1];
		pr->d[pr->nd++] = tcp_staged_counts(v->t, vbase(s, v), v, nb, ve, pr->nbr);
	}
	pr->d[pr->nd++] = (tcp_staged){in->v[be].t, vbase(s, &in->v[be]), in->v[be].stride[0], G, ve, 0};
	if (rw >= 0)
		pr->d[pr->nd++] = (tcp_staged){in->v[rw].t, vbase(s, &in->v[rw]), in->v[rw].stride[0], G, vr, 0};
}

/* A run with opts.observed: the staging's values, read back. */
static void capture(sim *s, uint32_t pc, const tcp_insn *in, int be)
{
	moe_tcp_loads *l = s->o->observed;
	int64_t G = in->dim[0];
	bool decode = be == TCP_V_S0;
	int rw = be < TCP_V_S2 && in->v[be + 1].t >= 0 ? be + 1 : -1;
	l->stagings++;
	if (!s->data[in->v[be].t] || (rw >= 0 && !s->data[in->v[rw].t]) || (!decode && !s->data[in->v[be - 1].t]))
		return; /* values absent: nothing to record */
	free(l->block_expert);
	free(l->block_rows);
	l->block_expert = malloc((size_t)(G > 0 ? G : 1) * sizeof *l->block_expert);
	l->block_rows = rw >= 0 ? malloc((size_t)(G > 0 ? G : 1) * sizeof *l->block_rows) : NULL;
	if (!l->block_expert || (rw >= 0 && !l->block_rows)) {
		FAULT(s, pc, "out of host memory for the observed loads");
		return;
	}
	l->grid = G;
	l->nblocks = decode ? G : iw(load_word(s, in->v[be - 1].t, vbase(s, &in->v[be - 1])));
	for (int64_t k = 0; k < G; k++) {
		l->block_expert[k] = iw(load_word(s, in->v[be].t, vbase(s, &in->v[be]) + k * in->v[be].stride[0]));
		if (rw >= 0)
			l->block_rows[k] = iw(load_word(s, in->v[rw].t, vbase(s, &in->v[rw]) + k * in->v[rw].stride[0]));
	}
}

void tcps_staged(sim *s, uint32_t pc, const tcp_insn *in)
{
	if (!s->pr && !s->o->observed)
		return;
	if (!s->pr) /* a serving program's n_tokens, staged for its guards */
		for (int w = TCP_V_S0; w <= TCP_V_S2; w++)
			if (in->v[w].t >= 0 && is_tokens_input(s, in->v[w].t) && s->data[in->v[w].t])
				s->o->observed->n_tokens = iw(load_word(s, in->v[w].t, vbase(s, &in->v[w])));
	int be = bexp_desc(s, in);
	if (be < 0 || (be > TCP_V_S0 && in->v[be - 1].t < 0))
		return;
	if (s->pr)
		stage_loads(s, pc, in, be);
	else
		capture(s, pc, in, be);
}

/* Whether element el of tensor t holds the n_tokens input (or a copy). */
static bool holds_tokens(const sim *s, int32_t t, int64_t el)
{
	if (is_tokens_input(s, t))
		return el == 0;
	for (int i = 0; i < s->pr->ntok; i++)
		if (s->pr->tok[i].t == t && s->pr->tok[i].el == el)
			return true;
	return false;
}

void tcps_pred_copy(sim *s, const tcp_insn *in, int64_t db, int64_t sb)
{
	tcps_pred *pr = s->pr;
	const tcp_view *d = &in->v[TCP_V_DST], *sv = &in->v[TCP_V_S0];
	int64_t n = 1;
	for (int k = 0; k < in->ndim; k++)
		n *= in->dim[k];
	if (n != 1 || !holds_tokens(s, sv->t, sb))
		return;
	for (int i = 0; i < pr->ntok; i++)
		if (pr->tok[i].t == d->t && pr->tok[i].el == db)
			return;
	if (pr->ntok < (int)(sizeof pr->tok / sizeof *pr->tok))
		pr->tok[pr->ntok].t = d->t, pr->tok[pr->ntok++].el = db;
}

uint32_t tcps_pred_word(sim *s, int32_t t, int64_t el)
{
	int32_t w;
	if (tcp_staged_find(s->pr->d, s->pr->nd, t, el, &w))
		return wi(w);
	if (holds_tokens(s, t, el))
		return wi((int32_t)s->pr->n_tokens);
	s->pr->approx_ld++;
	return 0;
}

/* Row j of an n-row list into a block grid's slots: the caller's loads fill
 * rows b x B .. b x B + rows[b] - 1 of each block b < nblocks, and the
 * dispatch that writes them (and the combine that reads them back) names
 * each filled slot once, so the list's rows are those slots. They are taken
 * ascending: the run's order is the routing's, which the cost rules read
 * only for the row conflicts of consecutive single-granule rows. -1: rows
 * is not the loads' grid x B, or the loads fill another number of slots
 * than n (not a dispatch list). Expected loads keep the even spread, so
 * that compile-time predictions do not depend on this rule. */
static int64_t slot_row(sim *s, int64_t rows, int64_t n, int64_t j)
{
	tcps_pred *pr = s->pr;
	const moe_tcp_loads *l = pr->given;
	int64_t B = s->p->moe_B;
	if (!l || !l->block_rows || B < 1 || rows != l->grid * B)
		return -1;
	if (!pr->slots_done) {
		pr->slots_done = true;
		int64_t filled = tcp_loads_slots(l, B, NULL);
		pr->slots = malloc((size_t)(filled > 0 ? filled : 1) * sizeof *pr->slots);
		pr->nslots = pr->slots ? tcp_loads_slots(l, B, pr->slots) : 0;
	}
	return pr->nslots > 0 && n == pr->nslots && j < n ? pr->slots[j] : -1;
}

int64_t tcps_pred_index(sim *s, const tcp_insn *in, int64_t g, int64_t j, int64_t cnt)
{
	const tcp_view *iv = &in->v[TCP_V_S1];
	int64_t rows = in->rows > 0 ? in->rows : 1;
	int32_t w;
	if (!(in->flags & TCP_F_HBMIDX) &&
		tcp_staged_find(s->pr->d, s->pr->nd, iv->t, vbase(s, iv) + g * iv->stride[0] + j * iv->stride[1], &w))
		return w < 0 ? 0 : w >= rows ? rows - 1 : w;
	int64_t n = cnt > 0 ? cnt : 1, sl = slot_row(s, rows, n, j);
	if (sl >= 0)
		return sl;
	if (g == 0 && j == 0)
		s->pr->approx_idx++;
	return n >= rows ? j % rows : j * rows / n;
}

void moe_tcp_loads_free(moe_ctx *ctx, moe_tcp_loads *l)
{
	(void)ctx;
	if (!l)
		return;
	free(l->block_expert);
	free(l->block_rows);
	l->block_expert = l->block_rows = NULL;
	l->grid = l->nblocks = 0;
}

int tcps_pred_order_bytes(const tcps_pred *pr)
{
	return pr->order_bytes;
}

moe_status moe_tcp_predict(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m, const moe_tcp_loads *loads,
	moe_tcp_prediction *out)
{
	return moe_tcp_predict_order(ctx, p, m, loads, 1, out);
}

moe_status moe_tcp_predict_order(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m,
	const moe_tcp_loads *loads, int order_bytes, moe_tcp_prediction *out)
{
	memset(out, 0, sizeof *out);
	if (loads && (loads->grid < 0 || loads->nblocks < 0 || loads->nblocks > loads->grid ||
			     (loads->grid > 0 && !loads->block_expert))) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
			"moe_tcp_predict: loads need 0 <= nblocks (%lld) <= grid (%lld) and a block_expert array",
			(long long)loads->nblocks, (long long)loads->grid);
		return MOE_ERR_INVALID;
	}
	tcps_pred pr = {0};
	pr.given = loads;
	pr.order_bytes = order_bytes != 0;
	pr.n_tokens = loads && loads->n_tokens >= 0 ? loads->n_tokens : p->moe_T;
	moe_status rc = tcps_run_predict(ctx, p, m, &pr, &out->stats);
	free(pr.gen_e);
	free(pr.gen_r);
	free(pr.slots);
	if (pr.refused)
		rc = MOE_ERR_UNSUPPORTED;
	out->seconds = out->stats.simulated_seconds;
	out->nblocks = loads ? loads->nblocks : pr.gen_nblocks;
	out->approximated_lds = pr.approx_ld;
	out->approximated_index_lists = pr.approx_idx;
	return rc;
}
