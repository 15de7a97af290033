/* backend-tcp/compiler/auto_block.c: block=auto, the block size B of the
 * expert grid (docs/tcp-isa.md 7.8, docs/tcp-compiler.md 6.1): a model of
 * the block loop ranks the candidate Bs, and the schedule compiler compiles
 * and prices its pick on the schedule's timeline. */
#include <math.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/schedule.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "backend-tcp/isa/cost.h"
#include "moec/passes.h"

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* The plans of one block=auto call: every candidate B prices its row
 * classes with the same (rows, O, I) several times over (tcp_plan_contract
 * tries every TRF row count, so its result is worth keeping). An open
 * addressing table; a full one plans afresh. */
enum { MEMO_SLOTS = 4096 };
typedef struct plan_memo {
	struct {
		int64_t M, O, I;
		int wdt;
		bool used;
		cplan pl;
	} e[MEMO_SLOTS];
} plan_memo;

/* tcp_plan_contract(m, M, O, I, wdt), kept in pm (NULL: none). */
static cplan plan_of(const moe_tcp_machine *m, plan_memo *pm, int64_t M, int64_t O, int64_t I, int wdt)
{
	if (!pm)
		return tcp_plan_contract(m, M, O, I, wdt, NULL);
	uint64_t h = (uint64_t)M * 0x9e3779b97f4a7c15ull ^ (uint64_t)O * 0xc2b2ae3d27d4eb4full ^
		     (uint64_t)I * 0x165667b19e3779f9ull ^ (uint64_t)wdt;
	for (uint64_t k = 0; k < MEMO_SLOTS; k++) {
		size_t i = (size_t)((h + k) % MEMO_SLOTS);
		if (!pm->e[i].used) {
			pm->e[i].M = M, pm->e[i].O = O, pm->e[i].I = I, pm->e[i].wdt = wdt, pm->e[i].used = true;
			pm->e[i].pl = tcp_plan_contract(m, M, O, I, wdt, NULL);
			return pm->e[i].pl;
		}
		if (pm->e[i].M == M && pm->e[i].O == O && pm->e[i].I == I && pm->e[i].wdt == wdt)
			return pm->e[i].pl;
	}
	return tcp_plan_contract(m, M, O, I, wdt, NULL);
}

/* A block of `rows` rows (at most h) runs the contraction planned for h rows
 * in the row tiles (docs/tcp-isa.md 7.4) that start below `rows`: [0, first),
 * [first, 2 first), ... or, with a step, [first, first + step), ... (first
 * = 0: h whole). Its cycles. */
static int64_t tiled_cycles(const moe_tcp_machine *m, plan_memo *pm, int64_t h, int64_t first, int64_t step,
	int64_t rows, int64_t O, int64_t I, int wdt)
{
	cplan pl = plan_of(m, pm, h, O, I, wdt);
	int64_t tiles[64] = {0};
	int nt = 0;
	if (first < 1 || h <= first)
		tiles[nt++] = h;
	else
		for (int64_t s = 0, len = first; s < h && s < rows && nt < 64; s += len, len = step > 0 ? step : s)
			tiles[nt++] = h - s < len ? h - s : len;
	return tcp_contract_cycles(m, pl.Os, pl.It, O, I, wdt, tiles, nt);
}

/* The sizes block=auto looks at: the experts op of a layer before the
 * pipeline (x [T, D], idx [T, K], up [E, F, D]). */
typedef struct layer_dims {
	int64_t T, D, F, E, K, B, nproj;
	int xdt, wdt;
	int acts;  /* vector passes of the activation per block (after tcp-plan-fusion's chains) */
	bool pair; /* gate and up contracted as one (pair_gate_up.c) */
	double wbytes; /* HBM bytes per weight element: the dtype's, or a quantized weight's stored bytes */
	double shared; /* main cycles of a shared expert run in pieces inside the loop (docs/tcp-isa.md 7.4), or 0 */
	plan_memo *memo; /* the call's plans, or NULL */
	moe_id ex;       /* the experts op */
} layer_dims;

/* Stored bytes per element of a weight: a dequant's packed values and scales
 * (under the slices and transposes import-hf puts after it), else its dtype. */
static double weight_bytes(const moe_graph *g, moe_id w)
{
	moe_id d = w;
	for (int k = 0; k < 8 && (N(g, d)->op == MOE_OP_SLICE || N(g, d)->op == MOE_OP_RESHAPE ||
				       (N(g, d)->op == MOE_OP_EINSUM && N(g, d)->nargs == 1)); k++)
		d = N(g, d)->args[0];
	const ir_node *n = N(g, d);
	if (n->op != MOE_OP_DEQUANT || ir_numel(n) <= 0)
		return (double)moe_dtype_size((moe_dtype)N(g, w)->dtype);
	return (double)(ir_bytes(N(g, n->args[0])) + ir_bytes(N(g, n->args[1]))) / (double)ir_numel(n);
}

static bool find_experts(const moe_graph *g, layer_dims *d)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_EXPERTS || n->args[EXP_UP] == MOE_NONE)
			continue;
		const ir_node *x = N(g, n->args[EXP_X]), *idx = N(g, n->args[EXP_IDX]), *up = N(g, n->args[EXP_UP]);
		if (x->rank != 2 || idx->rank != 2 || up->rank != 3)
			return false;
		*d = (layer_dims){.ex = i, .T = x->shape[0], .D = x->shape[1], .F = up->shape[1], .E = up->shape[0],
			.K = idx->shape[1], .B = ir_attr_int(n, "block", 1), .nproj = n->args[EXP_GATE] != MOE_NONE ? 3 : 2,
			.xdt = x->dtype, .wdt = up->dtype, .wbytes = weight_bytes(g, n->args[EXP_UP])};
		/* swiglu's silu(g) x u is one pass; gpt-oss's clamps, biases and scaled
		 * sigmoid take eight (measured on gpt-oss-20b); the others about two */
		const char *act = ir_attr_str(n, "act", "swiglu");
		d->acts = !strcmp(act, "swiglu") || !strcmp(act, "none") ? 1 : !strcmp(act, "gpt_oss") ? 8 : 2;
		const ir_node *gt = n->args[EXP_GATE] != MOE_NONE ? N(g, n->args[EXP_GATE]) : NULL;
		d->pair = gt && gt->op == MOE_OP_WEIGHT && up->op == MOE_OP_WEIGHT && gt->dtype == up->dtype &&
			  (up->dtype == MOE_BF16 || up->dtype == MOE_F32) && !memcmp(gt->shape, up->shape, sizeof up->shape);
		return d->T > 0 && d->E > 0 && d->K > 0 && d->K <= d->E;
	}
	return false;
}

/* A shared expert: contractions of a weight that neither feed the experts
 * op nor read its result. When the tail runs in row chunks (its widest
 * contraction's f32 rows past one value's grant of DM, TCP_DM_VALUE) and 64
 * chunks hold at least 4 rows each (rowchunk.c), a shared expert runs in 64
 * pieces of T / 64 rows inside the block loop, its weights held in the
 * experts' share: their contraction cycles, else 0. */
static double shared_cycles(const moe_tcp_machine *m, const moe_graph *g, const layer_dims *d)
{
	uint32_t nn = g->nnodes;
	moe_id ex = MOE_NONE;
	for (moe_id i = 0; i < nn && ex == MOE_NONE; i++)
		ex = N(g, i)->op == MOE_OP_EXPERTS ? i : MOE_NONE;
	if (ex == MOE_NONE || d->T % 64 || d->T / 64 < 4)
		return 0;
	bool *anc = ctx_alloc(g->ctx, nn + 1), *dep = ctx_alloc(g->ctx, nn + 1);
	anc[ex] = true;
	for (moe_id i = ex + 1; i-- > 0;)
		for (uint32_t k = 0; anc[i] && k < N(g, i)->nargs; k++)
			if (N(g, i)->args[k] != MOE_NONE)
				anc[N(g, i)->args[k]] = true;
	double cyc = 0, wb = 0, widest = 0;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		dep[i] = i == ex;
		for (uint32_t k = 0; k < n->nargs; k++)
			dep[i] |= n->args[k] != MOE_NONE && dep[n->args[k]];
		ir_einsum e;
		char msg[96];
		if (anc[i] || dep[i] || n->op != MOE_OP_EINSUM || n->nargs != 2 || N(g, n->args[1])->op != MOE_OP_WEIGHT ||
			n->rank < 1 || n->shape[0] != d->T || !ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg))
			continue;
		const ir_node *a = N(g, n->args[0]), *w = N(g, n->args[1]);
		int64_t O = ir_numel(n) / d->T, I = ir_numel(a) / d->T;
		cyc += 64.0 * (double)tiled_cycles(m, d->memo, d->T / 64, 0, 0, d->T / 64, O, I, w->dtype);
		wb += (double)ir_bytes(w);
		widest = fmax(widest, (double)O * (double)(moe_dtype_size((moe_dtype)n->dtype) + 4));
	}
	ctx_free(g->ctx, anc, nn + 1);
	ctx_free(g->ctx, dep, nn + 1);
	return wb <= (double)tcp_dm_grant(m, TCP_DM_EXPERTS) && (double)d->T * widest > (double)tcp_dm_grant(m, TCP_DM_VALUE)
		? cyc
		: 0;
}

/* What one block costs on the main context, by its row count: a block of
 * at most h rows (h = f, 4f, 16f, ... below B, the row classes of
 * docs/tcp-isa.md 7.4) runs the contractions planned for h rows (above f in two
 * row tiles, the second only for more than h / 2 rows), a fuller one those
 * planned for B. Index k < ncls: class h[k]; the last entry is B. */
/* The upper row classes of a block pass over B rows whose first tile is f
 * rows (docs/tcp-isa.md 7.4, "Upper row classes"): with the weights held
 * whole in DM, the rows between hl (the largest f 4^k below B) and B get a
 * class every step rows (8, coarser for large B), each planned for its h
 * rows; at most max of them; returns their count. */
enum { TCP_MAX_UPPER = 32 };
static int upper_classes(int64_t B, int64_t f, int64_t *out, int max)
{
	if (f < 1 || B <= f)
		return 0;
	int64_t hl = f;
	while (hl * 4 < B)
		hl *= 4;
	int64_t s = B >= 512 ? 8 * (B / 256) : 8;
	int n = 0;
	for (int64_t h = hl + s; h < B && n < max; h += s)
		out[n++] = h;
	return n;
}

enum { MAXCLS = 8 + TCP_MAX_UPPER, NSTEP = 5 };
typedef struct block_costs {
	int64_t B, h[MAXCLS];
	double lo[MAXCLS], hi[MAXCLS], dma, wfetch; /* lo: at most h / 2 rows; hi: more */
	int ncls;    /* entries, B's included */
	bool stream; /* weights streamed per block: a block takes the longer of its main and DMA work */
	/* streamed weights (fine row tiles, docs/tcp-isa.md 7.4): main cycles of
	 * class k with j tiles of h / 8 past h / 2 (the last entry: a block
	 * short of B), of a full block; DMA cycles fixed and per row moved */
	double fine[MAXCLS][NSTEP], full, sdma, drow;
	double share; /* a shared expert's pieces, spread over the blocks: main cycles per block */
} block_costs;

/* The main-context cycles of the block at the rows of its class; with
 * streamed weights the longer of those and its DMA work (the expert's
 * weights, its token rows, its result's rows: h of its class). */
static double class_cost(const block_costs *bc, int64_t rows)
{
	int k = 0;
	while (k < bc->ncls - 1 && rows > bc->h[k])
		k++;
	int64_t h = bc->h[k];
	if (!bc->stream)
		return (2 * rows > h ? bc->hi[k] : bc->lo[k]) + bc->share;
	int64_t j = k == 0 || 2 * rows <= h ? 0 : (rows - h / 2 + h / 8 - 1) / (h / 8);
	double mm = (rows >= bc->B ? bc->full : bc->fine[k][j < NSTEP ? j : NSTEP - 1]) + bc->share;
	double dm = bc->sdma + (double)(rows + h) * bc->drow;
	return dm > mm ? dm : mm;
}

/* Expert loads: an expert's token count n is Binomial(T, K/E x l), where
 * l is the expert's load relative to uniform routing: l = 1 when the router
 * is balanced (cv = 0), else lognormal with mean 1 and coefficient of
 * variation cv, taken at its 8 equally likely octile midpoints (assumption
 * A15). Accumulates the expected number of experts hit, E P(n > 0), of
 * blocks, E E[ceil(n/B)], and of the blocks' main-context cycles, each full
 * block at B's cost and the last at its row class's (each binomial over the
 * mass within 10 standard deviations of its mean). */
typedef struct loop_sums {
	double hit, nb, cyc;
} loop_sums;

static void binom_blocks(double T, double p, const block_costs *bc, loop_sums *s)
{
	double mu = T * p, sd = sqrt(T * p * (1 - p));
	int64_t lo = (int64_t)fmax(0, floor(mu - 10 * sd - 1)), hi = (int64_t)fmin(T, ceil(mu + 10 * sd + 1));
	int64_t B = bc->B;
	double full = class_cost(bc, B);
	for (int64_t n = lo; n <= hi; n++) {
		double lp = lgamma(T + 1) - lgamma((double)n + 1) - lgamma(T - (double)n + 1) + (double)n * log(p) +
			    (T - (double)n) * log1p(-p);
		double pr = p >= 1 ? (n == (int64_t)T) : exp(lp);
		int64_t rem = n % B;
		s->hit += n > 0 ? pr : 0;
		s->nb += pr * (double)((n + B - 1) / B);
		s->cyc += pr * ((double)(n / B) * full + (rem ? class_cost(bc, rem) : 0));
	}
}

/* An expert's load relative to uniform routing at the i-th of 8 equally
 * likely octile midpoints of the lognormal of mean 1 and coefficient of
 * variation cv (1 for cv 0). */
static double load_factor(double cv, int i)
{
	/* standard normal quantiles at (2i + 1) / 16 */
	static const double z[8] = {-1.5341, -0.8871, -0.4888, -0.1573, 0.1573, 0.4888, 0.8871, 1.5341};
	double s2 = log1p(cv * cv);
	return cv > 0 ? exp(z[i] * sqrt(s2) - s2 / 2) : 1;
}

static void expected_blocks(const layer_dims *d, const block_costs *bc, double cv, loop_sums *out)
{
	double p0 = (double)d->K / (double)d->E;
	int q = cv > 0 ? 8 : 1;
	loop_sums acc = {0, 0, 0};
	for (int i = 0; i < q; i++) {
		double p = fmin(1, p0 * load_factor(cv, i));
		binom_blocks((double)d->T, p, bc, &acc);
	}
	out->hit = (double)d->E * acc.hit / q;
	out->nb = (double)d->E * acc.nb / q;
	out->cyc = (double)d->E * acc.cyc / q;
}

/* Cycles of one DMA of `bytes` with one HBM side, as the block loop's sketch
 * counts it: a setup and a command issue, the bytes at the slower of the HBM
 * pool and the engines, the row overhead of a gather of `rows` rows. Not the
 * cost module's rule (tcp_cost_dma): it ranks the candidates, and the pick
 * is priced on the schedule (docs/tcp-compiler.md 6.1, "As built"). */
static double dma_cycles(const moe_tcp_machine *m, double bytes, double rows)
{
	double hbm = m->hbm_bytes_per_s / m->clock_hz, eng = (double)(m->dma_engines * m->dma_bytes_per_cycle);
	double t = bytes / (hbm < eng ? hbm : eng);
	double er = rows < (double)m->dma_engines ? (rows < 1 ? 1 : rows) : (double)m->dma_engines;
	return (double)(m->dma_setup + m->issue_cycles) + t + (rows > 1 ? ceil(rows / er) * (double)m->row_overhead : 0);
}

/* Main-context cycles of a block of `rows` rows run with the plans for h
 * rows (in row tiles from `first`, docs/tcp-isa.md 7.4): its contractions and the
 * activation passes (the contractions and the passes priced by the cost
 * module); *tiles: the TRF tiles streamed weights take (one DMA each). */
static double block_main(const moe_tcp_machine *m, const layer_dims *d, int64_t B, int64_t h, int64_t first,
	int64_t step, int64_t rows, double *tiles)
{
	double S = (double)tcp_slices(m);
	/* tcp-pair-gate-up: the paired [B, 2F] f32 value and its partials within one value's grant */
	bool pair = d->pair && 16.0 * (double)B * (double)d->F <= (double)tcp_dm_grant(m, TCP_DM_VALUE);
	int64_t np1 = pair ? 1 : d->nproj - 1, F1 = pair ? 2 * d->F : d->F; /* the projections on x */
	int64_t c1 = tiled_cycles(m, d->memo, h, first, step, rows, F1, d->D, d->wdt),
		c2 = tiled_cycles(m, d->memo, h, first, step, rows, d->D, d->F, d->wdt);
	if (tiles) {
		cplan p1 = plan_of(m, d->memo, h, F1, d->D, d->wdt), p2 = plan_of(m, d->memo, h, d->D, d->F, d->wdt);
		*tiles = (double)np1 * (double)(cdiv(p1.O, p1.Opass) * cdiv(p1.I, p1.It)) +
			 (double)(cdiv(p2.O, p2.Opass) * cdiv(p2.I, p2.It));
	}
	/* an activation pass: six float steps over a block's [h, F] values, two
	 * f32 streams read and one bf16 result committed per element */
	tcp_cm cm;
	tcp_cm_init(&cm, m);
	int64_t pe = cdiv(h * d->F, (int64_t)S);
	tcp_vec_load vl = {.pe = pe, .fl = true, .nstep = 6, .fetch = 2 * cdiv(4 * pe, m->fetch_bytes), .streams = 2,
		.commit = cdiv(2 * pe, m->fetch_bytes)};
	double vpass = (double)(tcp_cost_vec(&cm, &vl).total + tcp_cost_issue(&cm, TCP_CTX_MAIN));
	return (double)np1 * (double)c1 + (double)c2 + (double)d->acts * vpass;
}

/* The upper row classes pay off through a larger B (one block per expert).
 * A larger B's buffers can push the block results kept in pair order out of
 * DM (docs/tcp-isa.md 7.3: when the T K result rows take at most the experts'
 * share of it), and the combine then gathers them after the loop, which this
 * model does not price; so they are priced only while those rows, the
 * double-buffered experts and B's buffers (the estimate of auto_candidates)
 * fit the planner's TCP_DM_ROOMY (Qwen3-30B-A3B at B = 304: 61% of DM;
 * gpt-oss-20b, whose pair rows fit only at its B = 496 of main: 80% at
 * B = 256, not roomy). */
static bool pairs_roomy(const moe_tcp_machine *m, const layer_dims *d, int64_t B)
{
	double xe = (double)moe_dtype_size((moe_dtype)d->xdt);
	double pairs = (double)d->T * (double)d->K * (double)d->D * xe;
	if (pairs > (double)tcp_dm_grant(m, TCP_DM_EXPERTS))
		return true; /* no pair-order results: the combine gathers anyway */
	double row = 4 * (double)d->D * xe + 4 * (double)d->D + 4 * (double)(d->nproj + 1) * (double)d->F;
	double w = 2 * (double)d->nproj * (double)d->D * (double)d->F * d->wbytes;
	return pairs + w + (double)B * row <= (double)tcp_dm_grant(m, TCP_DM_ROOMY);
}

/* The per-block costs of block size B: main work by row class, and the DMA
 * work (its token rows, its result and, for streamed weights, its expert's
 * tiles at one setup each; whole experts' weights are fetched once per expert
 * hit when two experts' weights fit the experts' share of DM). */
static void block_costs_of(const moe_tcp_machine *m, const layer_dims *d, int64_t B, block_costs *bc)
{
	double xe = (double)moe_dtype_size((moe_dtype)d->xdt), we = d->wbytes;
	double tiles = 0, W = (double)d->nproj * (double)d->D * (double)d->F * we;
	memset(bc, 0, sizeof *bc);
	bc->B = B;
	int64_t f = B / 32 < 8 ? 8 : B / 32; /* the first row tile */
	bc->stream = !(2 * W <= (double)tcp_dm_grant(m, TCP_DM_EXPERTS));
	for (int64_t h = f; h < B && bc->ncls < 8; h *= 4) {
		int64_t first = h > f ? h / 2 : 0; /* a class above f runs in two row tiles */
		bc->h[bc->ncls] = h;
		bc->lo[bc->ncls] = block_main(m, d, B, h, first, 0, h / 2, NULL);
		bc->hi[bc->ncls] = block_main(m, d, B, h, first, 0, h, NULL);
		for (int j = 0; bc->stream && j < NSTEP; j++)
			bc->fine[bc->ncls][j] = block_main(m, d, B, h, first, h > f ? h / 8 : 0, h / 2 + j * (h / 8), NULL);
		bc->ncls++;
	}
	/* weights held in DM: the upper classes, each whole (row_classes.c); not
	 * priced for packed low-precision experts, whose dequantized buffers this
	 * model's DM bound does not see (a larger B would not fit) */
	int64_t up[TCP_MAX_UPPER];
	bool plain = (d->wdt == MOE_BF16 || d->wdt == MOE_F32) &&
		     d->wbytes >= (double)moe_dtype_size((moe_dtype)d->wdt);
	int nu = bc->stream || !plain || !pairs_roomy(m, d, B) ? 0 : upper_classes(B, f, up, TCP_MAX_UPPER);
	for (int k = 0; k < nu; k++, bc->ncls++) {
		bc->h[bc->ncls] = up[k];
		bc->lo[bc->ncls] = bc->hi[bc->ncls] = block_main(m, d, B, up[k], 0, 0, up[k], NULL);
	}
	bc->h[bc->ncls] = B;
	bc->lo[bc->ncls] = bc->hi[bc->ncls] = bc->full = block_main(m, d, B, B, 0, 0, B, &tiles);
	for (int j = 0; bc->stream && j < NSTEP; j++) /* a block short of B (B >= 4f) */
		bc->fine[bc->ncls][j] = B >= 4 * f ? block_main(m, d, B, B, B / 2, B / 8, B / 2 + j * (B / 8), NULL) : bc->full;
	bc->ncls++;
	bc->dma = dma_cycles(m, (double)B * (double)d->D * xe, (double)B) + dma_cycles(m, (double)B * (double)d->D * 4, 1);
	for (int64_t p = 0; p < d->nproj; p++)
		bc->wfetch += dma_cycles(m, W / (double)d->nproj, 1);
	if (bc->stream) /* every block streams its expert, one tile per DMA, the tiles of a contraction joined */
		bc->dma += dma_cycles(m, W, 1) + (tiles - 1) * (double)m->issue_cycles;
	/* ... and in the loop every block's DMA list joins the one before it
	 * (block_store.c): the setups hide; its token rows and its result's
	 * rows by its count */
	bc->sdma = dma_cycles(m, W, 1) + (tiles + 2) * (double)m->issue_cycles;
	bc->drow = (double)d->D * xe / fmin(m->hbm_bytes_per_s / m->clock_hz, (double)(m->dma_engines * m->dma_bytes_per_cycle));
}

/* Predicted cycles of the block loop with block size B: the blocks each hit
 * expert needs, each block's main-context work at its row class against
 * the DMA work, whichever is longer, plus the guard of every skipped block
 * of the worst-case grid. */
static double predict_loop(const moe_tcp_machine *m, const layer_dims *d, int64_t B, double cv)
{
	block_costs bc;
	block_costs_of(m, d, B, &bc);
	loop_sums s;
	expected_blocks(d, &bc, cv, &s);
	if (d->shared > 0 && s.nb > 0) { /* the pieces ride on the blocks (docs/tcp-isa.md 7.4) */
		bc.share = d->shared / s.nb;
		expected_blocks(d, &bc, cv, &s);
	}
	int64_t gm = moe_grid_blocks_max(d->T, d->K, d->E, B);
	double loop;
	if (!bc.stream) {
		double dtot = s.nb * bc.dma + s.hit * bc.wfetch;
		loop = s.cyc > dtot ? s.cyc : dtot;
	} else {
		loop = s.cyc; /* each block already the longer of its main and DMA work */
	}
	tcp_cm cm;
	tcp_cm_init(&cm, m);
	double guard = (double)(2 * tcp_cost_scalar(&cm, TCP_OP_BR) + tcp_cost_scalar(&cm, TCP_OP_JMP)); /* a skipped block */
	return loop + (double)(gm > s.nb ? gm - (int64_t)s.nb : 0) * guard;
}

/* Block sizes block=auto evaluates: the listed ones, and from 256 up to
 * 1024 every multiple of 16 (an expert of a prefill takes one block of
 * about its token count instead of a full block and a nearly empty one),
 * while one block's buffers (token rows in and out, double-buffered, and
 * the f32 values of its projections) fit the planner's grant for a block
 * (TCP_DM_BLOCK; above 256 rows TCP_DM_WIDE_BLOCK); the smallest is always
 * a candidate. */
static const int64_t auto_small[] = {8, 16, 32, 48, 64, 96, 128, 192};
#define NSMALL (sizeof auto_small / sizeof *auto_small)
enum { AUTO_STEP = 16, AUTO_MAX = 1024, NAUTO = NSMALL + (AUTO_MAX - 256) / AUTO_STEP + 2 };

static int auto_candidates(const moe_tcp_machine *m, const layer_dims *d, int64_t *out)
{
	int n = 0;
	double xe = (double)moe_dtype_size((moe_dtype)d->xdt);
	double row = 4 * (double)d->D * xe + 4 * (double)d->D + 4 * (double)(d->nproj + 1) * (double)d->F;
	double blk = (double)tcp_dm_grant(m, TCP_DM_BLOCK), wide = (double)tcp_dm_grant(m, TCP_DM_WIDE_BLOCK);
	if (d->T >= 1 && d->T < auto_small[0]) /* no expert gets more than T rows: a decode's B = 1 */
		out[n++] = d->T;
	for (size_t i = 0; i < NSMALL; i++)
		if ((i == 0 && n == 0) || (double)auto_small[i] * row <= blk) /* on a small DM: those whose buffers fit */
			out[n++] = auto_small[i];
	for (int64_t B = 256; B <= AUTO_MAX; B += AUTO_STEP)
		if ((double)B * row <= (B == 256 ? blk : wide) && (B == 256 || B < d->T * d->K))
			out[n++] = B;
	return n;
}

/* ---- pricing on the schedule compiler ----
 * The model above is a sketch: it prices bf16 and f32 contractions, not
 * packed weights' dequantization, their scales or fp8 x fp8 contractions,
 * nor the DM the rest of the layer takes. The B it picks is therefore built
 * by the schedule compiler's recipes and priced on that schedule's own
 * timeline (tcp_dm_price: placed as the compile places it, then
 * tcp_sched_predict on the expected loads, the cost rules the simulator
 * runs by); for packed weights smaller Bs are priced the same way. The
 * schedules are priced before the rewrites and the list scheduler, which
 * cost several times the build; only a B that would replace the model's
 * pick is priced after them, against that pick. */

/* A build of layer g at block size B: a clone through the `tcp` pipeline,
 * built by the schedule compiler (with `schedule`, rewritten and
 * list-scheduled as the compile does). NULL when it does not build; the
 * build's diagnostics are dropped by build_close. */
typedef struct trial_build {
	moe_module *mod;
	size_t n0;
} trial_build;

static tcp_sched *build_open(moe_ctx *ctx, const moe_graph *g, moe_id ex, const moe_tcp_machine *m, int64_t B,
	bool schedule, trial_build *tb)
{
	tb->n0 = moe_diag_count(ctx);
	int errs = moe_error_count(ctx);
	tb->mod = moe_module_new(ctx);
	moe_graph *w = tb->mod && moe_module_add_graph(tb->mod, moe_graph_name(g)) ? ir_graph_clone(g) : NULL;
	if (!w)
		return NULL;
	ir_module_replace(tb->mod, 0, w);
	moe_node_set_int(w, ex, "block", B);
	moe_graph_set_dim(w, "B", B);
	moe_run_opts ro = {.verify = 1};
	tcp_sched *ts = moe_tcp_register_passes(ctx) == MOE_OK && moe_run_pipeline_text(ctx, "tcp", tb->mod, &ro) == MOE_OK
		? tcp_sched_compiled(ctx, moe_module_graph(tb->mod, 0), m, schedule) : NULL;
	if (ts && moe_error_count(ctx) != errs) {
		tcp_sched_free(ts);
		ts = NULL;
	}
	return ts;
}

static void build_close(moe_ctx *ctx, tcp_sched *ts, trial_build *tb)
{
	tcp_sched_free(ts);
	moe_module_free(tb->mod);
	ts_diag_truncate(ctx, tb->n0);
}

/* The predicted seconds of layer g (before the pipeline; its experts op ex)
 * with block size B (build_open), placed and predicted; -1 when it does not
 * build or place. */
static double compiled_seconds(moe_ctx *ctx, const moe_graph *g, moe_id ex, const moe_tcp_machine *m, int64_t B,
	bool schedule)
{
	trial_build tb;
	tcp_sched *ts = build_open(ctx, g, ex, m, B, schedule, &tb);
	int64_t cy = ts ? tcp_dm_price(ts) : -1;
	build_close(ctx, ts, &tb);
	return cy > 0 ? (double)cy / m->clock_hz : -1;
}

/* The B to compile: the model's pick b0 when it compiles, else the first
 * compiling one of b0 halved (multiples of 8, at least 8), else b0 (whose
 * compile reports the error). With packed weights (`refine`), b0 / 2,
 * b0 / 4, ... are priced while each is within REFINE_SLACK of the best so
 * far: the time is not monotone in B, since an expert's rows take one more
 * block whenever B drops below their count (docs/tcp-compiler.md 6.1). The
 * fastest replaces the first B only when it is faster compiled in full too.
 * *secs: the predicted seconds of the B returned, 0 when none compiled. */
#define REFINE_SLACK 1.10
static int64_t priced_block(moe_ctx *ctx, const moe_graph *g, moe_id ex, const moe_tcp_machine *m, int64_t b0,
	bool refine, double *secs)
{
	int64_t best = b0, B = b0;
	double t = compiled_seconds(ctx, g, ex, m, B, false);
	while (t < 0 && B > 8) {
		B = B / 2 / 8 * 8;
		if (B < 8)
			break;
		t = compiled_seconds(ctx, g, ex, m, B, false);
	}
	*secs = t > 0 ? t : 0;
	if (t < 0)
		return b0;
	best = B;
	for (int64_t b = B / 2 / 8 * 8; refine && b >= 8; b = b / 2 / 8 * 8) {
		double tb = compiled_seconds(ctx, g, ex, m, b, false);
		if (tb < 0 || tb > REFINE_SLACK * *secs)
			break;
		if (tb < *secs) {
			best = b;
			*secs = tb;
		}
	}
	if (best == B)
		return B;
	/* the rewrites and the list scheduler can reverse a ranking: the two
	 * are priced again as compiled in full, the faster kept */
	double tB = compiled_seconds(ctx, g, ex, m, B, true), tbest = compiled_seconds(ctx, g, ex, m, best, true);
	if (tbest < 0 || (tB > 0 && tB <= tbest)) {
		*secs = tB > 0 ? tB : *secs;
		return B;
	}
	*secs = tbest;
	return best;
}

/* Loads of assumption A15 for a grid of G blocks of B rows: expert i takes
 * T K / E x l rows, l the lognormal (mean 1, coefficient of variation cv)
 * at its octile midpoints in turn over the experts (1 for cv 0), rounded
 * so that the rows sum to T K and no expert exceeds T (a routing that
 * exists, so its blocks fit the tight grid). Arrays from ctx; false when
 * they do not fit G. */
static bool cv_loads(moe_ctx *ctx, const layer_dims *d, int64_t B, int64_t G, double cv, moe_tcp_loads *l)
{
	double mean = (double)d->T * (double)d->K / (double)d->E;
	int64_t *n = ctx_alloc(ctx, (size_t)d->E * sizeof *n), left = d->T * d->K, nb = 0;
	for (int64_t e = 0; e < d->E; e++) {
		double x = mean * load_factor(cv, (int)(e % 8));
		n[e] = (int64_t)fmin((double)d->T, fmin((double)left, floor(x)));
		left -= n[e];
	}
	for (int64_t e = 0; left > 0 && e < d->E; e = (e + 1) % d->E)
		if (n[e] < d->T)
			n[e]++, left--;
	for (int64_t e = 0; e < d->E; e++)
		nb += cdiv(n[e], B);
	memset(l, 0, sizeof *l);
	l->n_tokens = -1;
	bool ok = nb <= G && G > 0;
	if (ok) {
		l->grid = G, l->nblocks = nb;
		l->block_expert = ctx_alloc(ctx, (size_t)G * sizeof *l->block_expert);
		l->block_rows = ctx_alloc(ctx, (size_t)G * sizeof *l->block_rows);
		int64_t g = 0;
		for (int64_t e = 0; e < d->E; e++)
			for (int64_t r = n[e]; r > 0; r -= B, g++)
				l->block_expert[g] = (int32_t)e, l->block_rows[g] = (int32_t)(r < B ? r : B);
		for (; g < G; g++)
			l->block_expert[g] = 0, l->block_rows[g] = 0;
	}
	ctx_free(ctx, n, (size_t)d->E * sizeof *n);
	return ok;
}

/* The cycles of layer g (before the pipeline) with block size B compiled in
 * full (rewrites and list scheduler), placed and predicted on the expected
 * loads (cy[0]) and on loads of cv 0.5 (cy[1]); false when it does not
 * build or place. */
static bool compiled_both(moe_ctx *ctx, const layer_dims *d, const moe_graph *g, const moe_tcp_machine *m, int64_t B,
	int64_t cy[2])
{
	trial_build tb;
	tcp_sched *ts = build_open(ctx, g, d->ex, m, B, true, &tb);
	moe_tcp_loads l;
	bool ok = false;
	if (ts && ts->nloop > 0 && cv_loads(ctx, d, B, ts->loop[0].G, 0.5, &l)) {
		const moe_tcp_loads *ls[2] = {NULL, &l};
		ok = tcp_dm_price_loads(ts, ls, 2, cy) > 0 && cy[1] > 0;
		ctx_free(ctx, l.block_expert, (size_t)l.grid * sizeof *l.block_expert);
		ctx_free(ctx, l.block_rows, (size_t)l.grid * sizeof *l.block_rows);
	}
	build_close(ctx, ts, &tb);
	return ok;
}

/* The block size that holds an expert's rows under uniform routing in one
 * block (mean + 2 standard deviations of Binomial(T, K / E)), rounded up to
 * a candidate; past the candidates (whose DM estimate leaves out a B the
 * planner may still place, and which stop at AUTO_MAX), to a multiple of
 * AUTO_STEP, at most T. Whether it places is the full compile's to say
 * (compiled_both). 0 when it would exceed T. */
static int64_t one_block_B(const layer_dims *d, const int64_t *cand, int nc)
{
	double p = (double)d->K / (double)d->E, mu = (double)d->T * p, want = mu + 2 * sqrt(mu * (1 - p));
	for (int i = 0; i < nc; i++)
		if ((double)cand[i] >= want)
			return cand[i];
	int64_t b = cdiv((int64_t)ceil(want), AUTO_STEP) * AUTO_STEP;
	return b <= d->T ? b : 0;
}

/* The router's balance is not known when the layer compiles: block=auto
 * predicts every candidate B under uniform expert loads and under loads of
 * coefficient of variation 0.5 (assumption A15), and takes the B whose
 * worse ratio to the best B of the same load is smallest (ties: the faster
 * under uniform loads). */
static const double load_cv[2] = {0, 0.5};

/* a's worse ratio, over the two loads, to the faster of a and b */
static double regret(const int64_t a[2], const int64_t b[2])
{
	double r = 0;
	for (int l = 0; l < 2; l++) {
		int64_t lo = a[l] < b[l] ? a[l] : b[l];
		r = fmax(r, lo > 0 ? (double)a[l] / (double)lo : 1);
	}
	return r;
}

int64_t moe_tcp_auto_block(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine, double *predicted_s)
{
	moe_tcp_machine *def = NULL;
	const moe_tcp_machine *m = machine;
	if (predicted_s)
		*predicted_s = 0;
	layer_dims d;
	if (!g || !find_experts(g, &d))
		return 0;
	if (!m && !(m = def = moe_tcp_machine_default(ctx)))
		return 0;
	d.memo = ctx_alloc(ctx, sizeof *d.memo);
	memset(d.memo, 0, sizeof *d.memo);
	d.shared = shared_cycles(m, g, &d);
	int64_t cand[NAUTO];
	int nc = auto_candidates(m, &d, cand);
	double t[2][NAUTO], best[2] = {0, 0};
	for (int l = 0; l < 2; l++)
		for (int i = 0; i < nc; i++) {
			t[l][i] = predict_loop(m, &d, cand[i], load_cv[l]);
			best[l] = i == 0 || t[l][i] < best[l] ? t[l][i] : best[l];
		}
	int pick = 0;
	double pr = 0;
	for (int i = 0; i < nc; i++) {
		double r = fmax(t[0][i] / best[0], t[1][i] / best[1]);
		if (i == 0 || r < pr || (r == pr && t[0][i] < t[0][pick])) {
			pick = i;
			pr = r;
		}
	}
	ctx_free(ctx, d.memo, sizeof *d.memo);
	/* packed weights: the model does not price their dequantization */
	bool plain = (d.wdt == MOE_BF16 || d.wdt == MOE_F32) && d.wbytes >= (double)moe_dtype_size((moe_dtype)d.wdt);
	double secs = 0;
	int64_t B = priced_block(ctx, g, d.ex, m, cand[pick], !plain, &secs);
	/* a larger B that keeps an expert's rows in one block replaces it where
	 * the one cost model, compiled in full, prefers it by the rule above:
	 * its worse ratio to the faster of the two under each load is smaller */
	int64_t b1 = one_block_B(&d, cand, nc), c0[2], c1[2];
	if (b1 > B && compiled_both(ctx, &d, g, m, b1, c1) && compiled_both(ctx, &d, g, m, B, c0) &&
	    regret(c1, c0) < regret(c0, c1)) {
		B = b1;
		secs = (double)c1[0] / m->clock_hz;
	}
	if (predicted_s)
		*predicted_s = secs > 0 ? secs : t[0][pick] / m->clock_hz;
	moe_tcp_machine_free(ctx, def);
	return B;
}
