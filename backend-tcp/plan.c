/* backend-tcp/plan.c: compile-time choices made with the machine's cost
 * rules: the tiling of a contraction, and block=auto, the block size of the
 * expert grid (docs/tcp-isa.md section 6 and 7.8). */
#include <math.h>
#include <string.h>

#include "backend-tcp/tcp_int.h"
#include "moec/passes.h"

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

static int64_t rup(int64_t a, int64_t b)
{
	return cdiv(a, b) * b;
}

/* For each number of TRF rows per slice (Os) and reduction chunk (It, a
 * multiple of the HBM granule's elements, or of 32, filling at most half the TRF so the next tile loads while
 * this one computes), estimate per chunk the main-context pass (MACs,
 * streamed packets, commit) and the sub-context TRF load, which overlap; take
 * the tiling with the smallest total. Few rows per slice reload TRF for little
 * work; many starve the stream. */
cplan tcp_plan_contract(const moe_tcp_machine *m, int64_t M, int64_t O, int64_t I, int wdt, int64_t *cycles)
{
	cplan best = {M, O, I, 0, 0, 0};
	int mt = wdt == MOE_F8E4M3 ? TCP_MT_F8 : TCP_MT_BF16; /* f8 x f8 at the fp8 rate (act=fp8) */
	int64_t S = tcp_slices(m), e = wdt == MOE_F32 ? 4 : wdt == MOE_F8E4M3 ? 1 : 2, x = wdt == MOE_F32 ? 3 : 1;
	int64_t budget = tcp_trf_bytes(m) / 2;
	int64_t macs = m->lanes_per_slice * m->macs_per_lane[mt], over = m->fill_drain + m->issue_cycles;
	int64_t best_t = -1;
	for (int64_t os = 1; os <= O; os++) {
		int64_t it = budget / (os * e);
		if (it < 1)
			break;
		int64_t ge = m->hbm_granule / e; /* streamed tiles: whole HBM requests per row */
		if (it < I)
			it = ge > 32 && it >= ge ? it / ge * ge : it >= 32 ? it / 32 * 32 : it;
		it = it < I ? it : I;
		int64_t opass = O < S * os ? O : S * os, npass = cdiv(O, opass), nch = cdiv(I, it);
		int64_t cg = cdiv(opass, os), R = S / cg > 0 ? S / cg : 1, bs = cdiv(M, R);
		int64_t mac = cdiv(bs * os * it * x, macs), stream = cdiv(bs * it * e, m->stream_bytes_per_cycle);
		int64_t commit = cdiv(bs * os * 8, m->fetch_bytes);
		int64_t main_ = (mac > stream ? mac : stream) > commit ? (mac > stream ? mac : stream) : commit;
		main_ += m->tree_latency[mt] + over;
		int64_t load = cdiv(rup(os * it * e, m->flit_bytes), m->trf_load_bytes) + over;
		int64_t t = npass * nch * (main_ > load ? main_ : load) + load;
		if (best_t < 0 || t < best_t) {
			best_t = t;
			best.It = it;
			best.Os = os;
			best.Opass = opass;
		}
	}
	if (cycles)
		*cycles = best_t;
	return best;
}

/* The sizes block=auto looks at: the experts op of a layer before the
 * pipeline (x [T, D], idx [T, K], up [E, F, D]). */
typedef struct layer_dims {
	int64_t T, D, F, E, K, B, nproj;
	int xdt, wdt;
	double wbytes; /* HBM bytes per weight element: the dtype's, or a quantized weight's stored bytes */
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
		*d = (layer_dims){x->shape[0], x->shape[1], up->shape[1], up->shape[0], idx->shape[1],
			ir_attr_int(n, "block", 1), n->args[EXP_GATE] != MOE_NONE ? 3 : 2, x->dtype, up->dtype,
			weight_bytes(g, n->args[EXP_UP])};
		return d->T > 0 && d->E > 0 && d->K > 0 && d->K <= d->E;
	}
	return false;
}

/* Expert loads: an expert's token count n is Binomial(T, K/E x l), where
 * l is the expert's load relative to uniform routing: l = 1 when the router
 * is balanced (cv = 0), else lognormal with mean 1 and coefficient of
 * variation cv, taken at its 8 equally likely octile midpoints (assumption
 * A15). The expected number of experts hit, E P(n > 0), and of blocks,
 * E E[ceil(n/B)] (each binomial over the mass within 10 standard deviations
 * of its mean). */
static void binom_blocks(double T, double p, int64_t B, double *h, double *b)
{
	double mu = T * p, sd = sqrt(T * p * (1 - p));
	int64_t lo = (int64_t)fmax(0, floor(mu - 10 * sd - 1)), hi = (int64_t)fmin(T, ceil(mu + 10 * sd + 1));
	*h = *b = 0;
	for (int64_t n = lo; n <= hi; n++) {
		double lp = lgamma(T + 1) - lgamma((double)n + 1) - lgamma(T - (double)n + 1) + (double)n * log(p) +
			    (T - (double)n) * log1p(-p);
		double pr = p >= 1 ? (n == (int64_t)T) : exp(lp);
		*h += n > 0 ? pr : 0;
		*b += pr * (double)((n + B - 1) / B);
	}
}

static void expected_blocks(const layer_dims *d, int64_t B, double cv, double *hit, double *nb)
{
	/* standard normal quantiles at (2i + 1) / 16 */
	static const double z[8] = {-1.5341, -0.8871, -0.4888, -0.1573, 0.1573, 0.4888, 0.8871, 1.5341};
	double s2 = log1p(cv * cv), p0 = (double)d->K / (double)d->E, h = 0, b = 0;
	int q = cv > 0 ? 8 : 1;
	for (int i = 0; i < q; i++) {
		double l = cv > 0 ? exp(z[i] * sqrt(s2) - s2 / 2) : 1, p = fmin(1, p0 * l), hi = 0, bi = 0;
		binom_blocks((double)d->T, p, B, &hi, &bi);
		h += hi / q;
		b += bi / q;
	}
	*hit = (double)d->E * h;
	*nb = (double)d->E * b;
}

/* Cycles of one DMA of `bytes` with one HBM side (docs/tcp-isa.md 10). */
static double dma_cycles(const moe_tcp_machine *m, double bytes, double rows)
{
	double hbm = m->hbm_bytes_per_s / m->clock_hz, eng = (double)(m->dma_engines * m->dma_bytes_per_cycle);
	double t = bytes / (hbm < eng ? hbm : eng);
	double er = rows < (double)m->dma_engines ? (rows < 1 ? 1 : rows) : (double)m->dma_engines;
	return (double)(m->dma_setup + m->issue_cycles) + t + (rows > 1 ? ceil(rows / er) * (double)m->row_overhead : 0);
}

/* Predicted cycles of the block loop with block size B under uniform routing
 * (every token picks K of the E experts alike): the blocks each hit expert
 * needs, each block's main-context work (its contractions with their tiling,
 * the activation passes) against its DMA work (its token rows, its result,
 * and its expert's weights: once per expert when two experts' weights fit
 * half of DM, per block when they are streamed), whichever is longer, plus the
 * guard of every skipped block of the worst-case grid. */
static double predict_loop(const moe_tcp_machine *m, const layer_dims *d, int64_t B, double cv)
{
	double S = (double)tcp_slices(m), xe = (double)moe_dtype_size((moe_dtype)d->xdt), we = d->wbytes;
	double hit = 0, nb = 0;
	expected_blocks(d, B, cv, &hit, &nb);
	int64_t gm = moe_grid_blocks_max(d->T, d->K, d->E, B);
	int64_t c1 = 0, c2 = 0;
	cplan p1 = tcp_plan_contract(m, B, d->F, d->D, d->wdt, &c1), p2 = tcp_plan_contract(m, B, d->D, d->F, d->wdt, &c2);
	/* streamed weights come one TRF tile per DMA */
	double tiles = (double)(d->nproj - 1) * (double)(cdiv(p1.O, p1.Opass) * cdiv(p1.I, p1.It)) +
		       (double)(cdiv(p2.O, p2.Opass) * cdiv(p2.I, p2.It));
	double vpass = ceil((double)B * (double)d->F / (S * (double)m->vec_float_rate)) + 6 +
		       (double)(m->fill_drain + m->issue_cycles);
	double main_ = (double)(d->nproj - 1) * (double)c1 + (double)c2 + 6 * vpass;
	double W = (double)d->nproj * (double)d->D * (double)d->F * we;
	bool whole = 2 * W / S <= (double)m->dm_bytes_per_slice / 2;
	double dma = dma_cycles(m, (double)B * (double)d->D * xe, (double)B) + dma_cycles(m, (double)B * (double)d->D * 4, 1);
	double wfetch = 0;
	for (int64_t p = 0; p < d->nproj; p++)
		wfetch += dma_cycles(m, W / (double)d->nproj, 1);
	if (!whole) /* every block streams its expert, one tile per DMA, the tiles of a contraction joined */
		dma += dma_cycles(m, W, 1) + (tiles - 1) * (double)m->issue_cycles;
	double loop;
	if (whole) {
		double dtot = nb * dma + hit * wfetch, mtot = nb * main_;
		loop = mtot > dtot ? mtot : dtot;
	} else {
		loop = nb * (main_ > dma ? main_ : dma);
	}
	return loop + (double)(gm > nb ? gm - (int64_t)nb : 0) * (double)(2 * m->branch_cycles + m->scalar_cycles);
}

static const int64_t auto_blocks[] = {8, 16, 32, 48, 64, 96, 128, 192, 256};
#define NAUTO (sizeof auto_blocks / sizeof *auto_blocks)

/* The router's balance is not known when the layer compiles: block=auto
 * predicts every candidate B under uniform expert loads and under loads of
 * coefficient of variation 0.5 (assumption A15), and takes the B whose
 * worse ratio to the best B of the same load is smallest (ties: the faster
 * under uniform loads). */
static const double load_cv[2] = {0, 0.5};

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
	double t[2][NAUTO], best[2] = {0, 0};
	for (int l = 0; l < 2; l++)
		for (size_t i = 0; i < NAUTO; i++) {
			t[l][i] = predict_loop(m, &d, auto_blocks[i], load_cv[l]);
			best[l] = i == 0 || t[l][i] < best[l] ? t[l][i] : best[l];
		}
	size_t pick = 0;
	double pr = 0;
	for (size_t i = 0; i < NAUTO; i++) {
		double r = fmax(t[0][i] / best[0], t[1][i] / best[1]);
		if (i == 0 || r < pr || (r == pr && t[0][i] < t[0][pick])) {
			pick = i;
			pr = r;
		}
	}
	if (predicted_s)
		*predicted_s = t[0][pick] / m->clock_hz;
	moe_tcp_machine_free(ctx, def);
	return auto_blocks[pick];
}
