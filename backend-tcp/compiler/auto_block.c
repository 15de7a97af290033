/* backend-tcp/compiler/auto_block.c: block=auto, the block size B of the
 * expert grid (docs/tcp-isa.md 7.8, docs/tcp-compiler.md 6.1): candidate Bs
 * built by the schedule compiler and priced on the schedule's timeline, the
 * cost model the compile and the simulator share. */
#include <math.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/schedule.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "moec/passes.h"

/* The sizes block=auto looks at: the experts op of a layer before the
 * pipeline (x [T, D], idx [T, K], up [E, F, D]). */
typedef struct layer_dims {
	int64_t T, D, F, E, K, B, nproj;
	int xdt, wdt;
	double wbytes; /* HBM bytes per weight element: the dtype's, or a quantized weight's stored bytes */
	moe_id ex;     /* the experts op */
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
		return d->T > 0 && d->E > 0 && d->K > 0 && d->K <= d->E;
	}
	return false;
}

/* Block sizes block=auto evaluates: the listed ones, and from 256 up to
 * 1024 every multiple of 16 (an expert of a prefill takes one block of
 * about its token count instead of a full block and a nearly empty one),
 * while one block's buffers (token rows in and out, double-buffered, and
 * the f32 values of its projections) take at most half of DM (a quarter
 * above 256); the smallest is always a candidate. */
static const int64_t auto_small[] = {8, 16, 32, 48, 64, 96, 128, 192};
#define NSMALL (sizeof auto_small / sizeof *auto_small)
enum { AUTO_STEP = 16, AUTO_MAX = 1024, NAUTO = NSMALL + (AUTO_MAX - 256) / AUTO_STEP + 2 };

static int auto_candidates(const moe_tcp_machine *m, const layer_dims *d, int64_t *out)
{
	int n = 0;
	double xe = (double)moe_dtype_size((moe_dtype)d->xdt);
	double row = 4 * (double)d->D * xe + 4 * (double)d->D + 4 * (double)(d->nproj + 1) * (double)d->F;
	double cap = (double)m->dm_bytes_per_slice * (double)tcp_slices(m) / 4;
	if (d->T >= 1 && d->T < auto_small[0]) /* no expert gets more than T rows: a decode's B = 1 */
		out[n++] = d->T;
	for (size_t i = 0; i < NSMALL; i++)
		if ((i == 0 && n == 0) || (double)auto_small[i] * row <= 2 * cap) /* on a small DM: those whose buffers fit half */
			out[n++] = auto_small[i];
	for (int64_t B = 256; B <= AUTO_MAX; B += AUTO_STEP)
		if ((double)B * row <= (B == 256 ? 2 : 1) * cap && (B == 256 || B < d->T * d->K))
			out[n++] = B;
	return n;
}

/* ---- pricing on the schedule compiler ----
 * Every B is priced by the one cost model: the layer built by the schedule
 * compiler's recipes for that B and predicted on the schedule's own timeline
 * (tcp_dm_price: placed as the compile places it, then tcp_sched_predict on
 * the expected loads, the rules the simulator runs by). A pricing build runs
 * the row-classes rewrite alone, forced where it applies: without it a
 * block of few rows costs a full block's passes, and every B above the
 * experts' row counts is priced as if its blocks were full. The other
 * rewrites and the list scheduler cost several times the build; packed
 * weights, whose rewrites (the dequant's pipelining) can reverse a ranking,
 * have their two best Bs priced again compiled in full. */

/* The predicted seconds of layer g (before the pipeline; its experts op ex)
 * with block size B: a clone through the `tcp` pipeline, built by the
 * schedule compiler (`full`: rewritten and list-scheduled as the compile
 * does; else a pricing build), placed and predicted; -1 when it does not
 * build or place (its diagnostics dropped). */
static double compiled_seconds(moe_ctx *ctx, const moe_graph *g, moe_id ex, const moe_tcp_machine *m, int64_t B,
	bool full)
{
	size_t n0 = moe_diag_count(ctx);
	int errs = moe_error_count(ctx);
	moe_module *mod = moe_module_new(ctx);
	moe_graph *w = mod && moe_module_add_graph(mod, moe_graph_name(g)) ? ir_graph_clone(g) : NULL;
	double s = -1;
	if (w) {
		ir_module_replace(mod, 0, w);
		moe_node_set_int(w, ex, "block", B);
		moe_graph_set_dim(w, "B", B);
		moe_run_opts ro = {.verify = 1};
		const moe_graph *pg = moe_module_graph(mod, 0);
		tcp_sched *ts = moe_tcp_register_passes(ctx) == MOE_OK && moe_run_pipeline_text(ctx, "tcp", mod, &ro) == MOE_OK
			? (full ? tcp_sched_compiled(ctx, pg, m, true) : tcp_sched_priced(ctx, pg, m, "+row-classes")) : NULL;
		int64_t cy = ts && moe_error_count(ctx) == errs ? tcp_dm_price(ts) : -1;
		s = cy > 0 ? (double)cy / m->clock_hz : -1;
		tcp_sched_free(ts);
	}
	moe_module_free(mod);
	ts_diag_truncate(ctx, n0);
	return s;
}

/* The search's state: the candidates (ascending) and the price of each (0:
 * not priced yet, -1: does not build or place), the best so far. */
typedef struct search {
	moe_ctx *ctx;
	const moe_graph *g;
	const moe_tcp_machine *m;
	moe_id ex;
	int n, best;
	int64_t cand[NAUTO];
	double t[NAUTO];
} search;

/* The price of candidate i (priced once); -1 when it does not compile. */
static double price(search *s, int i)
{
	if (i < 0 || i >= s->n)
		return -1;
	if (s->t[i] == 0)
		s->t[i] = compiled_seconds(s->ctx, s->g, s->ex, s->m, s->cand[i], false);
	if (s->t[i] > 0 && (s->best < 0 || s->t[i] < s->t[s->best]))
		s->best = i;
	return s->t[i];
}

/* The candidate nearest to B (ties: the smaller). */
static int nearest(const search *s, double B)
{
	int k = 0;
	for (int i = 1; i < s->n; i++)
		if (fabs((double)s->cand[i] - B) < fabs((double)s->cand[k] - B))
			k = i;
	return k;
}

/* The search. An expert's row count n is about Binomial(T, K / E); the
 * time falls as B grows until most experts' rows take one block (past
 * that, more rows per block only add guard and padding work). Seeds: the
 * candidates nearest to n's mean and to its mean plus three standard
 * deviations; then from the best, its neighbours among the candidates while
 * one of them is faster. Packed weights' time is not monotone below that
 * (an expert's rows take one more block when B drops below their count,
 * docs/tcp-compiler.md 6.1): B also halves from the best while each stays
 * within REFINE_SLACK of the best so far. */
#define REFINE_SLACK 1.10
static void search_block(search *s, const layer_dims *d, bool packed)
{
	double p = (double)d->K / (double)d->E, mu = (double)d->T * p, sd = sqrt((double)d->T * p * (1 - p));
	price(s, nearest(s, mu));
	price(s, nearest(s, mu + 3 * sd));
	for (int b = -1; s->best >= 0 && s->best != b;) {
		b = s->best;
		price(s, b - 1);
		price(s, b + 1);
	}
	for (int i = s->best; packed && i >= 0;) {
		int j = nearest(s, (double)s->cand[i] / 2);
		double tj = j == i ? -1 : price(s, j);
		if (tj < 0 || tj > REFINE_SLACK * s->t[s->best])
			break;
		i = j;
	}
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
	search *s = ctx_alloc(ctx, sizeof *s);
	memset(s, 0, sizeof *s);
	*s = (search){.ctx = ctx, .g = g, .m = m, .ex = d.ex, .best = -1};
	s->n = auto_candidates(m, &d, s->cand);
	/* packed weights: dequantized or int8 experts */
	bool packed = !((d.wdt == MOE_BF16 || d.wdt == MOE_F32) && d.wbytes >= (double)moe_dtype_size((moe_dtype)d.wdt));
	search_block(s, &d, packed);
	int64_t B = s->best >= 0 ? s->cand[s->best] : s->cand[0]; /* none compiles: the smallest reports why */
	double secs = s->best >= 0 ? s->t[s->best] : 0;
	int second = -1;
	for (int i = 0; packed && s->best >= 0 && i < s->n; i++)
		if (i != s->best && s->t[i] > 0 && (second < 0 || s->t[i] < s->t[second]))
			second = i;
	if (second >= 0 && s->t[second] <= REFINE_SLACK * secs) {
		/* the rewrites and the list scheduler can reverse a close ranking */
		double tb = compiled_seconds(ctx, g, d.ex, m, B, true), t2 = compiled_seconds(ctx, g, d.ex, m, s->cand[second], true);
		if (t2 > 0 && (tb < 0 || t2 < tb))
			B = s->cand[second], secs = t2;
		else if (tb > 0)
			secs = tb;
	}
	ctx_free(ctx, s, sizeof *s);
	if (predicted_s)
		*predicted_s = secs;
	moe_tcp_machine_free(ctx, def);
	return B;
}
