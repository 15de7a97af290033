/* backend-tcp/compiler/gpass/gpass.c: the TCP target's graph passes (docs/tcp-compiler.md
 * section 3), their registration, and the driver's check that a graph went
 * through them for the machine it is compiled for.
 *
 * Every rewrite of the graph that the TCP program depends on is a pass of
 * the `tcp` pipeline, shown by --print-ir-after, run in this order:
 *   tcp-combine-chunk  the combine's chunk bound from the machine's DM, before blockwise-dispatch (below)
 *   tcp-w8a8-act-once  W8A8's per-token activation quantization before the dispatch (w8a8_act.c)
 *   tcp-pair-gate-up   bf16 / f32 gate and up as one einsum of 2F rows (pair_gate_up.c)
 *   tcp-pair-down      the pair and down (unpaired: the projections) in one packed weight per expert (pair_down.c)
 *   tcp-pack-bias      an expert's bias vectors side by side, one fetch (pack_bias.c)
 *   tcp-einsum-canon   every einsum as the one contraction and views (einsum_canon.c)
 *   tcp-fp8-act-rows   the rows an act=fp8 dequant is contracted for from its fp8 bytes (fp8_rows.c)
 *   tcp-split-weights  which weight-only values are packed at load time (passes/)
 *   tcp-plan-fusion    the schedule compiler's fusion groups as marks (plan_fusion.c), last
 * Every structural pass matches the block_loop blockwise-dispatch writes (its
 * body, by structure); a graph without one (a flattened graph, which the
 * schedule compiler does not lower) is left as it is.
 * Each structural pass records its decision as a graph attribute (the key
 * of its row in gpasses[]: 1 applied, 0 not) and the fingerprint of the
 * machine it decided for (tcp_machine). A key's presence says the pass ran,
 * and it does not run again; a pass without a key (tcp-einsum-canon) is
 * idempotent and runs where its rewrite is needed. The schedule compiler
 * reads the rewritten graph and the attributes; it decides none of this
 * again.
 *
 * The machine is the one moe_tcp_set_pass_machine gave this context (the
 * CLI: --machine), else the built-in one. moe_tcp_compile runs, on a clone,
 * the pairings whose record is missing (a graph from a pipeline that named
 * them not, or ran before the target registered them), for its own machine;
 * a structural rewrite made for another machine is kept (it preserves
 * values), the fusion marks are planned again. One code path: the same
 * functions as the passes. */
#include <math.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "passes/pass.h"

#define GK_W8A8_ACT "tcp_w8a8_act_once"
#define GK_PAIR_GATE_UP "tcp_pair_gate_up"
#define GK_PAIR_DOWN "tcp_pair_down"
#define GK_PACK_BIAS "tcp_pack_bias"
#define GK_MACHINE "tcp_machine"

typedef struct tcp_target tcp_target;

/* The machine facts the graph passes read: DM per slice, the slices and the
 * float ALUs (a nonzero 53-bit value, printed and read back exactly). */
static int64_t machine_fp(const moe_tcp_machine *m)
{
	uint64_t h = 1469598103934665603ull;
	const int64_t f[3] = {tcp_space_bytes(m, TCP_DM), tcp_slices(m), m->float_alus};
	for (int i = 0; i < 3; i++)
		for (int b = 0; b < 8; b++) {
			h ^= (uint64_t)f[i] >> (8 * b) & 0xff;
			h *= 1099511628211ull;
		}
	return (int64_t)(h >> 11) | 1;
}

static bool has_key(const moe_graph *g, const char *key)
{
	return ir_attr_find(&g->meta, key) != NULL;
}

/* g's nodes were rewritten: fusion marks planned before no longer hold. */
static void marks_stale(moe_graph *g)
{
	if (ir_graph_attr_int(g, IR_GK_TCP_FUSION_PLAN, 0))
		ir_graph_set_attr_int(g, IR_GK_TCP_FUSION_PLAN, 0);
}

static void record(moe_graph *g, const char *key, moe_graph *rewritten, int64_t v, const moe_tcp_machine *m)
{
	if (rewritten) {
		ir_graph_take(g, rewritten);
		marks_stale(g);
	}
	ir_graph_set_attr_int(g, key, v);
	ir_graph_set_attr_int(g, GK_MACHINE, machine_fp(m));
}

static moe_status w8a8_act_once(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	moe_graph *r = tcp_w8a8_act_once(ctx, g, m);
	record(g, GK_W8A8_ACT, r, r != NULL, m);
	return MOE_OK;
}

static moe_status gate_up_paired(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	moe_graph *r = tcp_pair_gate_up(ctx, g, m);
	record(g, GK_PAIR_GATE_UP, r, r != NULL, m);
	return MOE_OK;
}

/* After tcp-pair-gate-up paired gate and up: the pair and down; where it
 * did not, the projections' weights side by side (tcp_pack_experts). */
static moe_status down_paired(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	moe_graph *r = ir_graph_attr_int(g, GK_PAIR_GATE_UP, 0) > 0 ? tcp_pair_down(ctx, g, m) : tcp_pack_experts(ctx, g, m);
	record(g, GK_PAIR_DOWN, r, r != NULL, m);
	return MOE_OK;
}

static moe_status bias_packed(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	moe_graph *r = tcp_pack_bias(ctx, g, m);
	record(g, GK_PACK_BIAS, r, r != NULL, m);
	return MOE_OK;
}

static moe_status einsum_canon(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	(void)m;
	bool changed = false;
	moe_status s = tcp_einsum_canon(ctx, g, &changed);
	if (changed)
		marks_stale(g);
	return s;
}

/* Marks only, for m (idempotent, no key): read by tcp-split-weights. */
static moe_status fp8_act_rows(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	return tcp_fp8_act_rows(ctx, g, m);
}

static moe_status plan_fusion(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	moe_status s = tcp_plan_fusion(ctx, g, m);
	if (s == MOE_OK)
		ir_graph_set_attr_int(g, GK_MACHINE, machine_fp(m));
	return s;
}

/* The most 2-byte elements one combine chunk gathers into DM, the planner's
 * grant (TCP_DM_COMBINE), as the graph's bound for blockwise-dispatch (which
 * lowers its `chunk` default to it where it is less; an explicit option
 * wins). */
static moe_status combine_chunk(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	(void)ctx;
	int64_t n = tcp_dm_grant(m, TCP_DM_COMBINE) / 2;
	ir_graph_set_attr_int(g, IR_GK_COMBINE_CHUNK, n > 0 ? n : 1);
	return MOE_OK;
}

/* Whether blockwise-dispatch spreads an expert's rows evenly over its blocks
 * (its `balance` default, the graph's block_balance): where the block loop
 * streams its weights (two experts' weights do not fit the planner's
 * TCP_DM_EXPERTS share, as block=auto's model has it), every block of an
 * expert fetches them again, so a block holding an expert's last few rows
 * costs a whole fetch for little compute, while even shares cost no more
 * fetches and leave every block compute to hide its fetch; and where an
 * expert is expected to need more than one block under uniform routing (its
 * tokens' mean plus three standard deviations, T K / E and T (K / E)
 * (1 - K / E), above B). Elsewhere the shares' index arithmetic is routing
 * time for nothing. One expert's weights: its gate, up and down operands as
 * the experts() node reads them. */
static moe_status block_balance(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m)
{
	(void)ctx;
	bool on = false;
	for (moe_id i = 0; i < g->nnodes && !on; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_EXPERTS || n->args[EXP_X] == MOE_NONE || n->args[EXP_IDX] == MOE_NONE)
			continue;
		const ir_node *x = N(g, n->args[EXP_X]), *idx = N(g, n->args[EXP_IDX]);
		double W = 0, E = 0;
		for (int k = EXP_GATE; k <= EXP_DOWN; k++) {
			if (n->args[k] == MOE_NONE)
				continue;
			const ir_node *w = N(g, n->args[k]);
			double el = 1;
			for (int a = 1; a < w->rank; a++)
				el *= (double)w->shape[a];
			W += el * (double)moe_dtype_size((moe_dtype)w->dtype);
			E = (double)w->shape[0];
		}
		double T = (double)x->shape[0], K = idx->rank > 1 ? (double)idx->shape[1] : 1, B = (double)ir_attr_int(n, "block", 1);
		if (E < 1 || K > E)
			continue;
		double p = K / E, mean = T * p, sd = sqrt(T * p * (1 - p));
		on = 2 * W > (double)tcp_dm_grant(m, TCP_DM_EXPERTS) && mean + 3 * sd > B;
	}
	if (on)
		ir_graph_set_attr_int(g, IR_GK_BLOCK_BALANCE, 1);
	return MOE_OK;
}

typedef moe_status (*gpass_fn)(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m);

/* The target passes in pipeline order; key: the record of a structural one. */
static const struct gpass {
	const char *name, *summary, *key;
	gpass_fn fn;
} gpasses[] = {
	{"tcp-combine-chunk", "bound the combine's token chunks (blockwise-dispatch's `chunk` default, the graph's "
			      "combine_chunk) by the DM the planner grants them on the machine (tcp target)",
		NULL, combine_chunk},
	{"tcp-block-balance", "spread each expert's rows evenly over its blocks (blockwise-dispatch's `balance` default, "
			      "the graph's block_balance) where the block loop streams its weights and an expert is "
			      "expected to span more than one block (tcp target)",
		NULL, block_balance},
	{"tcp-w8a8-act-once", "quantize a W8A8 layer's input per token once, before the dispatch, and dispatch the "
			      "int8 values and scales (tcp target)",
		GK_W8A8_ACT, w8a8_act_once},
	{"tcp-pair-gate-up", "contract a bf16/f32 or W8A8 int8 expert's gate and up in a block_loop as one einsum of 2F rows "
			     "over their weights side by side, when the loop's buffers fit DM and a block, priced on the cost "
			     "model, is no slower (tcp target)",
		GK_PAIR_GATE_UP, gate_up_paired},
	{"tcp-pair-down", "lay a block_loop expert's paired gate/up and down (or, gate and up not paired, its "
			  "projections' weights) out as one packed weight (one fetch), when the loop's buffers fit DM and a "
			  "full block is bound by its fetch (tcp target)",
		GK_PAIR_DOWN, down_paired},
	{"tcp-pack-bias", "lay a block_loop expert's bias vectors (its vector `e` operands of one type) out side by "
			  "side as one operand (one fetch), when the loop's buffers fit DM and the block's fetch is "
			  "shorter (tcp target)",
		GK_PACK_BIAS, bias_packed},
	{"tcp-einsum-canon", "rewrite every einsum other than a permutation and the contraction [M, I] x [O, I] -> "
			     "[M, O] into those, reshape, slice, concat and reduce_sum (tcp target)",
		NULL, einsum_canon},
	{"tcp-fp8-act-rows", "mark each act=fp8 block-FP8 dequant with the most rows for which contracting it from its "
			     "fp8 bytes pays, from the machine's HBM and MAC rates (tcp_fp8_rows; tcp target)",
		NULL, fp8_act_rows},
	{"tcp-plan-fusion", "record the schedule compiler's fusions (vector-pass chains, the casts a widened einsum "
			    "reads as views) as marks (tcp target)",
		NULL, plan_fusion},
};
enum { NGPASS = sizeof gpasses / sizeof *gpasses };

/* One registered pass: its row and its context's target (the pass's ud). */
typedef struct gpass_ud {
	const struct gpass *p;
	tcp_target *t;
} gpass_ud;

/* The TCP target's state in one context (its ctx_target_state row, freed
 * with the context): the machine its passes plan for
 * (moe_tcp_set_pass_machine) and the registered passes' ud. */
struct tcp_target {
	moe_tcp_machine m;
	bool set;
	gpass_ud u[NGPASS];
};

static PASS(run_gpass)
{
	(void)opts;
	const gpass_ud *u = ud;
	if (u->p->key && has_key(g, u->p->key))
		return MOE_OK; /* decided once: a graph read back keeps its rewrites */
	if (u->t->set)
		return u->p->fn(ctx, g, &u->t->m);
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	if (!m)
		return MOE_ERR_INTERNAL;
	moe_status s = u->p->fn(ctx, g, m);
	moe_tcp_machine_free(ctx, m);
	return s;
}

/* w (g's working clone, NULL while no pass rewrote g) with fusion's marks
 * planned again for m (marks edited after the pass are not trusted; the
 * rule is cheap and gives the pass's marks); NULL with *st set when a pass
 * failed (w freed). */
static moe_graph *with_fusion(moe_ctx *ctx, const moe_graph *g, moe_graph *w, const moe_tcp_machine *m,
	moe_status *st)
{
	if (*st == MOE_OK) {
		if (!w)
			w = ir_graph_clone(g);
		*st = plan_fusion(ctx, w, m);
	}
	if (*st != MOE_OK && w) {
		ir_graph_free(w);
		w = NULL;
	}
	return w;
}

/* The schedule compiler's graph passes (the `tcp` pipeline's on a
 * block_loop): the pairings whose records g lacks, the einsums' canonical
 * form where g needs it, the act=fp8 rows where g lacks them, then the
 * fusion marks where g's were not planned for m. */
moe_graph *tcp_loop_graph_passes(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, moe_status *st)
{
	static const gpass_fn loop_passes[] = {gate_up_paired, down_paired, bias_packed};
	moe_graph *w = NULL;
	*st = MOE_OK;
	for (int i = 0; i < NGPASS && *st == MOE_OK; i++) {
		bool on = false;
		for (size_t k = 0; k < sizeof loop_passes / sizeof *loop_passes; k++)
			on |= gpasses[i].fn == loop_passes[k];
		if (!on || has_key(w ? w : g, gpasses[i].key))
			continue;
		if (!w)
			w = ir_graph_clone(g);
		*st = gpasses[i].fn(ctx, w, m);
	}
	if (*st == MOE_OK && tcp_einsum_canon_needed(w ? w : g)) {
		if (!w)
			w = ir_graph_clone(g);
		*st = einsum_canon(ctx, w, m);
	}
	if (*st == MOE_OK && tcp_fp8_act_rows_needed(w ? w : g)) { /* read where g carries no tcp_pack */
		if (!w)
			w = ir_graph_clone(g);
		*st = fp8_act_rows(ctx, w, m);
	}
	return with_fusion(ctx, g, w, m, st);
}

static tcp_target *target_of(moe_ctx *ctx)
{
	ctx_vec *v = ctx_target_state(ctx);
	return v->n && v->row == sizeof(tcp_target) ? ((tcp_target **)v->data)[0] : NULL;
}

static moe_status register_passes(moe_ctx *ctx)
{
	/* The TCP target's node attributes (docs/ir.md "Target attributes"). */
	static const ir_target_attr attrs[] = {
		{"tcp_pack", IR_AT_INT, -1, 0, "k >= 0: the k-th value bound as a packed weight (tcp-split-weights)"},
		{"tcp_fp8_rows", IR_AT_INT, -1, 0, "r >= 0: an act=fp8 dequant contracted from its fp8 bytes by einsums of at most r rows (tcp-fp8-act-rows)"},
		{"tcp_fuse", IR_AT_INT, -1, 0, "k >= 0: a node of fusion group k (tcp-plan-fusion)"},
		{"tcp_view", IR_AT_INT, 0, 0, "1: a bf16 -> f32 cast a widened einsum reads as a view of its operand (tcp-plan-fusion)"},
		{"tcp_hbm", IR_AT_INT, 0, 0, "1: a gather read only by scatters, kept in HBM (no pass writes it; read by none)"},
		{"tcp_ggrid", IR_AT_INT, 0, 0, "1: a dispatch scatter lowered as a gather by block (no pass writes it; read by none)"},
		{"tcp_e2m1_canon", IR_AT_INT, 0, 0, "1: an MXFP4 dequant whose bytes the prep graph made canonical, E2M1 code 8 (-0) as 0 (tcp-split-weights)"},
		{"tcp_packed", IR_AT_INT, -1, OPF_LEAF, "k >= 0: a weight the program binds as packed weight k"},
		{NULL, IR_AT_INT, 0, 0, NULL},
	};
	moe_status st = ir_target_attrs_registered(ctx, "tcp") ? MOE_OK : ir_target_attrs_register(ctx, "tcp", attrs);
	tcp_target *t = st == MOE_OK ? target_of(ctx) : NULL;
	if (st == MOE_OK && !t) {
		ctx_vec *v = ctx_target_state(ctx);
		t = ctx_alloc(ctx, sizeof *t);
		for (int i = 0; i < NGPASS; i++)
			t->u[i] = (gpass_ud){&gpasses[i], t};
		v->esz = sizeof(tcp_target *);
		v->row = sizeof(tcp_target);
		ctx_grow(ctx, &v->data, &v->cap, v->n + 1, v->esz); /* the last allocation: then the table changes */
		ctx_commit_point(ctx);
		ctx_keep(ctx, v->data);
		ctx_keep(ctx, t);
		((tcp_target **)v->data)[v->n++] = t;
	}
	for (int i = 0; i < NGPASS && st == MOE_OK; i++) {
		moe_pass_info pi = {gpasses[i].name, gpasses[i].summary, NULL, run_gpass, &t->u[i]};
		st = moe_pass_find(ctx, pi.name) ? MOE_OK : moe_pass_register(ctx, &pi);
	}
	return st;
}

moe_status moe_tcp_register_passes(moe_ctx *ctx)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, register_passes(ctx));
}

moe_status moe_tcp_set_pass_machine(moe_ctx *ctx, const moe_tcp_machine *m)
{
	moe_status st = moe_tcp_register_passes(ctx);
	tcp_target *t = st == MOE_OK ? target_of(ctx) : NULL;
	if (!t)
		return st == MOE_OK ? MOE_ERR_INTERNAL : st;
	t->set = m != NULL;
	if (m)
		t->m = *m;
	return MOE_OK;
}
