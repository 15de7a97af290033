/* backend-tcp/multichip/multichip.c: N simulated TCP chips running the per-device
 * programs of an expert-parallel layer (docs/expert-parallel.md section 6).
 *
 * Each device's program is cut at its all_to_all nodes into phases: a node's
 * phase is the largest over its operands of the operand's phase, plus one
 * for an operand that is an exchange (an exchange runs at the end of the
 * phase of its operands). Every phase becomes a graph of its own whose
 * inputs are the values of earlier phases (input "ep.<id>"; one contraction
 * of phase 0 may be deferred to its readers' phase: defer_tail), compiled and
 * run on the simulator. The chips advance together, phase by phase
 * (bulk-synchronous): all chips run phase k, then the exchanges of round k
 * move rows between them in memory, costed by the link model:
 *     time of one all_to_all on chip d = latency + max(bytes out, bytes in) / bandwidth
 * (one full-duplex link per chip into a switch: the machine description's
 * interconnect section, docs/tcp-model.md section 1). The layer's time is the sum
 * over phases of the slowest chip plus the sum over rounds of the slowest
 * link.
 *
 * Every phase's commands are kept (the simulator's events): each round is
 * measured end to end against its bound (moe_tcp_ep_round), and --trace
 * writes them as one Chrome trace, a process per chip. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/sim/sim_int.h"
#include "ir/graph_keys.h"
#include "moec/io.h"
#include "moec/passes.h"

#define PH_MAX (MOE_TCP_EP_MAX_ROUNDS + 1)
#define PHASE_MAX_OUT 256 /* values one phase hands on */

typedef struct chip {
	const moe_graph *g;
	int *level;        /* per node: phase (leaves -1) */
	moe_tensor **val;  /* per node: value once computed (owned) */
	uint8_t *fake;     /* per node: its value is zeros of a timing-only phase */
	double seconds;    /* compute, summed over phases */
	int64_t out_bytes, in_bytes;
	double link_seconds;
	/* per phase: its commands (cycles), length, where packing starts (s from
	 * the phase's start; its length when nothing is packed), the time packing
	 * adds to the phase's critical path, the time the commands that read
	 * received rows add to it and their summed durations; per round: link
	 * time, bytes */
	tev *ev[PH_MAX];
	size_t nev[PH_MAX];
	double len[PH_MAX], pack_at[PH_MAX], pack_tail[PH_MAX], unpack[PH_MAX], unpack_sum[PH_MAX], link[PH_MAX];
	int64_t rbo[PH_MAX], rbi[PH_MAX];
} chip;

/* Is source node a of chip c read by an exchange? */
static bool sent(const chip *c, moe_id a)
{
	for (moe_id j = a + 1; j < c->g->nnodes; j++)
		if (N(c->g, j)->op == MOE_OP_ALL_TO_ALL && N(c->g, j)->args[0] == a)
			return true;
	return false;
}

static bool tensor_ok(const tcp_program *p, int32_t t)
{
	return t >= 0 && (uint32_t)t < p->nt;
}

/* Packing and unpacking in phase k's program p (outputs ids[0..nids-1]):
 * packing is the DMA commands that write an output sent by an exchange and,
 * backwards, the gathers and scatters writing their sources (the send
 * buffer's rows; not the copy of an input into DM, which the one-chip
 * program makes too); unpacking the DMA commands that read a received
 * tensor (an input "ep.<all_to_all>"). Each is measured as the time it adds
 * to the phase's critical path: following tev.pred back from the command
 * that ends last, a command adds end - max(start, its predecessor's end). */
static void measure(moe_ctx *ctx, chip *c, int k, const tcp_program *p, const moe_id *ids, uint32_t nids, double hz)
{
	uint8_t *in = ctx_alloc(ctx, p->nt + 1), *rv = ctx_alloc(ctx, p->nt + 1), *pk = ctx_alloc(ctx, p->ncode + 1);
	/* an output named "output<j>" (a hand-written program) is output j; the
	 * schedule compiler names it after its node and makes the output tensors
	 * in output order */
	unsigned nth = 0;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		unsigned j;
		if (t->kind == TCP_T_OUTPUT) {
			if (sscanf(t->name, "output%u", &j) != 1)
				j = nth;
			nth++;
			in[i] = j < nids && sent(c, ids[j]);
		}
		if (t->kind == TCP_T_INPUT && sscanf(t->name, "ep.%u", &j) == 1 && j < c->g->nnodes &&
			N(c->g, j)->op == MOE_OP_ALL_TO_ALL)
			rv[i] = 1;
	}
	for (uint32_t pc = p->ncode; pc-- > 0;) {
		const tcp_insn *in_ = &p->code[pc];
		int32_t dt = in_->v[TCP_V_DST].t;
		if (tcp_op_ctx[in_->op] != TCP_CTX_DMA || !tensor_ok(p, dt) || !in[dt] ||
			(in_->op != TCP_OP_DMA_GATHER && in_->op != TCP_OP_DMA_SCATTER && p->t[dt].kind != TCP_T_OUTPUT))
			continue;
		pk[pc] = 1;
		if (tensor_ok(p, in_->v[TCP_V_S0].t))
			in[in_->v[TCP_V_S0].t] = 1;
	}
	int64_t first = -1, un = 0, last = -1;
	const tev *ev = c->ev[k];
	for (size_t i = 0; i < c->nev[k]; i++) {
		const tcp_insn *in_ = &p->code[ev[i].pc];
		if (pk[ev[i].pc] && (first < 0 || ev[i].start < first))
			first = ev[i].start;
		if (tcp_op_ctx[in_->op] == TCP_CTX_DMA && tensor_ok(p, in_->v[TCP_V_S0].t) && rv[in_->v[TCP_V_S0].t])
			un += ev[i].end - ev[i].start;
		if (last < 0 || ev[i].end > ev[last].end)
			last = (int64_t)i;
	}
	/* the critical path, back from the command that ends last */
	int64_t cp_pack = 0, cp_un = 0;
	for (int64_t i = last; i >= 0; i = ev[i].pred < i ? ev[i].pred : -1) {
		const tcp_insn *in_ = &p->code[ev[i].pc];
		int64_t from = ev[i].pred >= 0 && ev[ev[i].pred].end > ev[i].start ? ev[ev[i].pred].end : ev[i].start;
		int64_t own = ev[i].end > from ? ev[i].end - from : 0;
		if (pk[ev[i].pc])
			cp_pack += own;
		if (tcp_op_ctx[in_->op] == TCP_CTX_DMA && tensor_ok(p, in_->v[TCP_V_S0].t) && rv[in_->v[TCP_V_S0].t])
			cp_un += own;
	}
	c->pack_at[k] = first >= 0 ? (double)first / hz : c->len[k];
	c->pack_tail[k] = (double)cp_pack / hz;
	c->unpack[k] = (double)cp_un / hz;
	c->unpack_sum[k] = (double)un / hz;
	ctx_free(ctx, in, p->nt + 1);
	ctx_free(ctx, rv, p->nt + 1);
	ctx_free(ctx, pk, p->ncode + 1);
}

/* Phase k of chip c compiled on ro's machine by the schedule compiler: *mp
 * its graph, *pp its program (both NULL when the phase computes nothing),
 * ids[0..*nids-1] the source node of each output. The phase is read as the
 * tcp pipeline leaves a layer (its block_loop kept, the loop's pairings, the
 * packed weights marked): its graph passes are the named pipeline tcp-graph,
 * the tcp pipeline's own list. */
static moe_status compile_phase(moe_ctx *ctx, const chip *c, int k, const moe_tcp_run_opts *ro, moe_module **mp,
	moe_tcp_program **pp, moe_id *ids, uint32_t *nids)
{
	*nids = 0;
	*pp = NULL;
	moe_module *m = *mp = moe_ep_phase_graph(ctx, c->g, c->level, k, ids, PHASE_MAX_OUT, nids);
	moe_graph *g = moe_module_graph(m, 0);
	if (*nids > PHASE_MAX_OUT) {
		moe_diag(ctx, MOE_DIAG_ERROR, c->g->loc, "phase %d hands on %u values, at most %d are supported", k, *nids,
			PHASE_MAX_OUT);
		return MOE_ERR_UNSUPPORTED;
	}
	if (moe_graph_num_outputs(g) == 0) {
		moe_module_free(m);
		*mp = NULL;
		return MOE_OK;
	}
	/* the chip's block grid: the run's instruction and work budgets
	 * (docs/tcp-isa.md section 9) count the phase's block loop that many
	 * times */
	ir_graph_set_attr_int(g, IR_GK_GRID_BLOCKS, ir_graph_attr_int(c->g, IR_GK_GRID_BLOCKS, 0));
	moe_run_opts po = {.verify = 1};
	moe_status st = moe_run_pipeline_text(ctx, "infer-shapes,canonicalize,cse,dce,tcp-graph", m, &po);
	if (st == MOE_OK)
		*pp = moe_tcp_compile_sched(ctx, g, ro->machine, ro->sched_opts);
	return st == MOE_OK && !*pp ? MOE_ERR_INVALID : st;
}

static moe_status run_phase(moe_ctx *ctx, chip *c, int k, const moe_tensor_map *bind, const moe_tcp_run_opts *ro)
{
	moe_id ids[PHASE_MAX_OUT];
	uint32_t nids = 0;
	moe_module *m;
	moe_tcp_program *p;
	moe_status st = compile_phase(ctx, c, k, ro, &m, &p, ids, &nids);
	if (st == MOE_OK && !m)
		return MOE_OK;
	moe_graph *g = m ? moe_module_graph(m, 0) : NULL;
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	bool absent = false;
	for (moe_id i = 0; st == MOE_OK && i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_INPUT && n->op != MOE_OP_WEIGHT)
			continue;
		const moe_tensor *t = NULL;
		unsigned src;
		if (!strncmp(n->name, "ep.", 3) && sscanf(n->name + 3, "%u", &src) == 1)
			t = c->val[src];
		else
			t = moe_tensor_map_get(bind, n->name);
		if (t)
			moe_tensor_map_set(b, n->name, moe_tensor_view(ctx, t));
		absent |= t && !t->data;
	}
	moe_tensor *out[PHASE_MAX_OUT] = {0};
	moe_tcp_stats s;
	/* timing-only: a phase whose weights are all present (routing, combine) runs in
	 * full, so the exchanges move the real counts; one without (the experts) is
	 * timed only and its outputs are zeros of their shapes */
	moe_tcp_run_opts o = *ro;
	o.timing_only = ro->timing_only && absent;
	o.trace_path = NULL; /* the chips' trace is written at the end */
	if (st == MOE_OK)
		st = tcp_run_events(ctx, p, b, &o, o.timing_only ? NULL : out, &s, &c->ev[k], &c->nev[k]);
	if (st == MOE_OK) {
		c->len[k] = s.simulated_seconds;
		measure(ctx, c, k, p, ids, nids, ro->machine->clock_hz);
	}
	for (uint32_t j = 0; st == MOE_OK && o.timing_only && j < nids; j++) {
		const ir_node *n = N(c->g, ids[j]);
		out[j] = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		if (!out[j])
			st = MOE_ERR_NOMEM;
	}
	if (st == MOE_OK) {
		c->seconds += s.simulated_seconds;
		for (uint32_t j = 0; j < nids; j++)
			c->val[ids[j]] = out[j], out[j] = NULL, c->fake[ids[j]] = o.timing_only;
	}
	for (uint32_t j = 0; j < nids; j++)
		moe_tensor_free(ctx, out[j]);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	if (m)
		moe_module_free(m);
	return st;
}

/* The value of an exchange operand: computed by a phase, or a constant; a
 * reshape that a timing-only phase left as zeros is taken again from its
 * operand (the return's counts: the received counts, reshaped). */
static const moe_tensor *operand(moe_ctx *ctx, chip *c, moe_id a)
{
	const ir_node *n = N(c->g, a);
	if (c->fake[a] && n->op == MOE_OP_RESHAPE && c->val[a]) {
		const moe_tensor *s = operand(ctx, c, n->args[0]);
		if (s && !c->fake[n->args[0]] && s->nbytes == c->val[a]->nbytes) {
			memcpy(c->val[a]->data, s->data, s->nbytes);
			c->fake[a] = 0;
		}
	}
	if (!c->val[a] && n->op == MOE_OP_CONST) {
		moe_tensor *t = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		double v = ir_attr_float(n, "value", 0);
		for (int64_t i = 0; t && i < moe_tensor_numel(t); i++) {
			if (n->dtype == MOE_I32)
				((int32_t *)t->data)[i] = (int32_t)v;
			else if (n->dtype == MOE_F32)
				((float *)t->data)[i] = (float)v;
			else if (n->dtype == MOE_BF16)
				((uint16_t *)t->data)[i] = moe_f32_to_bf16((float)v);
		}
		c->val[a] = t;
	}
	return c->val[a];
}

/* The exchange of node x (an all_to_all of every chip's program) among the chips. */
static moe_status exchange(moe_ctx *ctx, chip *c, int ep, const moe_id *xs)
{
	for (int d = 0; d < ep; d++) {
		const ir_node *n = N(c[d].g, xs[d]);
		moe_tensor *t = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		if (!t)
			return MOE_ERR_NOMEM;
		c[d].val[xs[d]] = t;
	}
	for (int d = 0; d < ep; d++) {
		moe_id x = xs[d];
		const ir_node *n = N(c[d].g, x);
		const moe_tensor *src = operand(ctx, &c[d], n->args[0]), *cnt = operand(ctx, &c[d], n->args[1]);
		if (cnt && c[d].fake[n->args[1]]) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "chip %d: timing only: the counts of all_to_all %%%u depend on weights "
				"absent from the checkpoint", d, x);
			return MOE_ERR_UNSUPPORTED;
		}
		if (!src || !cnt || cnt->dtype != MOE_I32) {
			moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "chip %d: all_to_all %%%u: operand %s is neither computed nor a constant", d, x, !src ? moe_op_name((moe_op)N(c[d].g, n->args[0])->op) : moe_op_name((moe_op)N(c[d].g, n->args[1])->op));
			return MOE_ERR_UNSUPPORTED;
		}
		size_t row = src->shape[0] ? src->nbytes / (size_t)src->shape[0] : 0;
		const int32_t *k = cnt->data;
		int64_t off = 0, out = 0;
		for (int j = 0; j < ep; j++) {
			moe_tensor *dst = c[j].val[xs[j]];
			size_t drow = dst->shape[0] ? dst->nbytes / (size_t)dst->shape[0] : 0;
			int64_t at = 0;
			for (int s = 0; s < d; s++) /* rows already received by j from devices before d */
				at += ((const int32_t *)operand(ctx, &c[s], N(c[s].g, xs[s])->args[1])->data)[j];
			if (k[j] < 0 || off + k[j] > src->shape[0] || at + k[j] > dst->shape[0] || drow != row) {
				moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "chip %d: all_to_all sends %d rows to chip %d, more than fit",
					d, k[j], j);
				return MOE_ERR_RUNTIME;
			}
			memcpy((char *)dst->data + (size_t)at * row, (const char *)src->data + (size_t)off * row,
				(size_t)k[j] * row);
			if (j != d) {
				out += k[j] * (int64_t)row;
				c[j].in_bytes += k[j] * (int64_t)row;
			}
			off += k[j];
		}
		c[d].out_bytes += out;
	}
	return MOE_OK;
}

/* Round k along the critical path (moe_tcp_ep_round): what packing adds to
 * the critical path of phase k on the chip that ends it last, the round's
 * link time (the bound: the link model charges exactly latency + bytes /
 * bandwidth), the most unpacking adds to the critical path of phase k + 1
 * on any chip. */
static void rounds(moe_tcp_ep_stats *s, const chip *c, int ep, int phases, const double *len, const double *link,
	const int *nx)
{
	s->rounds = 0;
	for (int k = 0; k + 1 < phases && s->rounds < MOE_TCP_EP_MAX_ROUNDS; k++) {
		if (!nx[k])
			continue;
		moe_tcp_ep_round *r = &s->round[s->rounds++];
		int last = 0, busy = 0;
		double un = 0, unsum = 0, wait = 0;
		for (int d = 0; d < ep; d++) {
			last = c[d].len[k] > c[last].len[k] ? d : last;
			busy = c[d].rbo[k] + c[d].rbi[k] > c[busy].rbo[k] + c[busy].rbi[k] ? d : busy;
			un = c[d].unpack[k + 1] > un ? c[d].unpack[k + 1] : un;
			unsum = c[d].unpack_sum[k + 1] > unsum ? c[d].unpack_sum[k + 1] : unsum;
			wait = len[k] - c[d].len[k] > wait ? len[k] - c[d].len[k] : wait;
		}
		double pack = c[last].pack_tail[k];
		*r = (moe_tcp_ep_round){last, nx[k], c[busy].rbo[k], c[busy].rbi[k], link[k], pack,
			c[last].len[k] - c[last].pack_at[k], link[k], un, unsum, wait, pack + link[k] + un};
	}
}

/* The slices of every chip, phase after phase: phase k starts on every chip
 * when round k - 1 ends; a command context per track and a link track
 * (TCP_NCTX) with the round's wait and all_to_all. Lanes are taken in l
 * (one per chip); with f NULL nothing is written. */
static void trace_slices(FILE *f, tcp_trace_lanes *l, const chip *c, int ep, int phases, const double *len,
	const double *link, double hz)
{
	int64_t at = 0; /* ns */
	for (int k = 0; k < phases; k++) {
		for (int d = 0; d < ep; d++) {
			for (size_t i = 0; i < c[d].nev[k]; i++) {
				const tev *e = &c[d].ev[k][i];
				int64_t t0 = at + tcps_ns((double)e->start / hz), t1 = at + tcps_ns((double)e->end / hz);
				int tid = tcps_lane_tid(e->ctx, tcps_lane(&l[d], e->ctx, t0, t1));
				if (f) {
					tcps_trace_slice(f, tcp_op_names[e->op], d, tid, t0, t1);
					fprintf(f, ",\"args\":{\"phase\":%d,\"pc\":%u,\"event\":%zu,\"pred\":%d}},\n", k, e->pc, i,
						e->pred);
				}
			}
			if (k + 1 < phases && link[k] > 0) {
				int64_t mine = at + tcps_ns(c[d].len[k]), all = at + tcps_ns(len[k]), lk = tcps_ns(c[d].link[k]);
				if (all > mine) {
					int tid = tcps_lane_tid(TCP_NCTX, tcps_lane(&l[d], TCP_NCTX, mine, all));
					if (f)
						tcps_trace_slice(f, "wait", d, tid, mine, all), fprintf(f, "},\n");
				}
				int tid = tcps_lane_tid(TCP_NCTX, tcps_lane(&l[d], TCP_NCTX, all, all + lk));
				if (f) {
					tcps_trace_slice(f, "all_to_all", d, tid, all, all + lk);
					fprintf(f, ",\"args\":{\"round\":%d,\"bytes_out\":%lld,\"bytes_in\":%lld}},\n", k,
						(long long)c[d].rbo[k], (long long)c[d].rbi[k]);
				}
			}
		}
		at += tcps_ns(len[k]) + tcps_ns(link[k]);
	}
	if (f)
		fprintf(f, "{\"name\":\"end\",\"ph\":\"i\",\"pid\":0,\"ts\":%lld.%03lld,\"s\":\"g\"}\n", (long long)(at / 1000),
			(long long)(at % 1000));
}

/* One Chrome trace of every chip: process d is chip d, with a track per
 * command context and one for its link that hold slices (sim.c's lanes). */
static moe_status write_trace(moe_ctx *ctx, const char *path, const chip *c, int ep, int phases, const double *len,
	const double *link, double hz)
{
	tcp_trace_lanes *l = ctx_soft_alloc(ctx, (size_t)ep * sizeof *l); /* guarded: NULL is MOE_ERR_NOMEM */
	if (!l)
		return MOE_ERR_NOMEM;
	moe_atomic_file *af = moe_atomic_open(ctx, path);
	if (!af) {
		ctx_free(ctx, l, 0);
		return MOE_ERR_IO;
	}
	FILE *f = moe_atomic_stream(af);
	for (int d = 0; d < ep; d++)
		tcps_lanes_init(&l[d]);
	trace_slices(NULL, l, c, ep, phases, len, link, hz);
	fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
	for (int d = 0; d < ep; d++) {
		fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"chip %d\"}},\n", d, d);
		tcps_trace_tracks(f, d, &l[d]);
		tcps_lanes_init(&l[d]);
	}
	trace_slices(f, l, c, ep, phases, len, link, hz);
	fprintf(f, "]}\n");
	ctx_free(ctx, l, 0);
	return moe_atomic_commit(af);
}

/* A contraction of phase 0 (it depends on no exchange) whose every consumer
 * is in a later phase runs in the earliest of its consumers' phases: the
 * shared expert's down projection, in the combine. Its weight stream, issued
 * before the combine's gather of the returned rows (moe_ep_phase_graph puts
 * a phase's work that reads no exchange first), hides that gather, while its
 * gate and up projections stay in phase 0 beside routing and hide the
 * dispatch's packing (docs/expert-parallel.md section 6). */
static void defer_tail(const moe_graph *g, int *level)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (level[i] != 0 || N(g, i)->op != MOE_OP_EINSUM)
			continue;
		int to = -1;
		bool out = false;
		for (uint32_t o = 0; o < g->nout; o++)
			out |= g->outputs[o] == i;
		for (moe_id j = i + 1; j < g->nnodes && !out; j++)
			for (uint32_t a = 0; a <= N(g, j)->nargs; a++)
				if ((a < N(g, j)->nargs ? N(g, j)->args[a] : N(g, j)->valid) == i)
					to = to < 0 || level[j] < to ? level[j] : to;
		if (!out && to > 0)
			level[i] = to;
	}
}

/* The chips' programs cut into phases (*phases each). The schedule
 * compiler reads a chip's local experts as a block_loop
 * (expert-parallel{loop=1}); the flattened form (loop=0) is the host's,
 * refused here rather than deep in a phase's compile. */
static moe_status setup_chips(moe_ctx *ctx, int ep, const moe_graph *const *g, chip *c, int *phases)
{
	for (int d = 0; d < ep; d++) {
		if (!ir_graph_block_loop(g[d])) {
			moe_diag(ctx, MOE_DIAG_ERROR, g[d]->loc,
				"chip %d: its experts are not a block_loop (expert-parallel{loop=0}, the host's form); the TCP "
				"schedule compiler compiles chips made by expert-parallel{loop=1}",
				d);
			return MOE_ERR_UNSUPPORTED;
		}
		c[d].g = g[d];
		c[d].level = calloc(g[d]->nnodes, sizeof *c[d].level);
		c[d].val = calloc(g[d]->nnodes, sizeof *c[d].val);
		c[d].fake = calloc(g[d]->nnodes, 1);
		if (!c[d].level || !c[d].val || !c[d].fake)
			return MOE_ERR_NOMEM;
		for (moe_id i = 0; i < g[d]->nnodes; i++) /* an exchange meant for other chips would lose rows */
			if (N(g[d], i)->op == MOE_OP_ALL_TO_ALL && ir_attr_int(N(g[d], i), "ep", 1) != ep) {
				moe_diag(ctx, MOE_DIAG_ERROR, N(g[d], i)->loc,
					"chip %d: all_to_all %%%u exchanges over %lld chips, the run has %d", d, i,
					(long long)ir_attr_int(N(g[d], i), "ep", 1), ep);
				return MOE_ERR_INVALID;
			}
		int p = moe_ep_phases(g[d], c[d].level);
		defer_tail(g[d], c[d].level);
		if (p > PH_MAX) {
			moe_diag(ctx, MOE_DIAG_ERROR, g[d]->loc, "chip %d: its program has %d exchange rounds, at most %d are run",
				d, p - 1, MOE_TCP_EP_MAX_ROUNDS);
			return MOE_ERR_UNSUPPORTED;
		}
		if (d && (p != *phases || g[d]->nnodes < 1)) {
			moe_diag(ctx, MOE_DIAG_ERROR, g[d]->loc, "chip %d: its program has %d phases, chip 0's %d", d, p, *phases);
			return MOE_ERR_INVALID;
		}
		*phases = p;
	}
	return MOE_OK;
}

moe_status moe_tcp_ep_compile(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tcp_machine *machine,
	moe_tcp_ep_sink sink, void *ud)
{
	moe_tcp_run_opts o = {.machine = machine};
	return moe_tcp_ep_compile_ex(ctx, ep, g, &o, sink, ud);
}

moe_status moe_tcp_ep_compile_ex(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tcp_run_opts *opts,
	moe_tcp_ep_sink sink, void *ud)
{
	if (!ctx || ep < 1 || ep > MOE_TCP_EP_MAX || !g || !sink || !opts)
		return MOE_ERR_INVALID;
	moe_tcp_machine *def = opts->machine ? NULL : moe_tcp_machine_default(ctx);
	moe_tcp_run_opts o = *opts; /* the phases compile for the resolved machine */
	o.machine = opts->machine ? opts->machine : def;
	if (!o.machine)
		return MOE_ERR_INVALID;
	chip c[MOE_TCP_EP_MAX];
	memset(c, 0, sizeof c);
	int phases = 0;
	moe_status st = setup_chips(ctx, ep, g, c, &phases);
	for (int d = 0; st == MOE_OK && d < ep; d++)
		for (int k = 0; st == MOE_OK && k < phases; k++) {
			moe_id ids[PHASE_MAX_OUT];
			uint32_t nids;
			moe_module *m;
			moe_tcp_program *p;
			st = compile_phase(ctx, &c[d], k, &o, &m, &p, ids, &nids);
			if (st == MOE_OK)
				st = sink(ud, d, k, p, p ? ids : NULL, p ? nids : 0);
			moe_tcp_program_free(p);
			if (m)
				moe_module_free(m);
		}
	for (int d = 0; d < ep; d++) {
		free(c[d].val);
		free(c[d].fake);
		free(c[d].level);
	}
	if (def)
		moe_tcp_machine_free(ctx, def);
	return st;
}

moe_status moe_tcp_ep_run(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tensor_map *const *bind,
	const moe_tcp_run_opts *ro, moe_tensor **const *out, moe_tcp_ep_stats *stats)
{
	if (!ctx || ep < 1 || ep > MOE_TCP_EP_MAX || !g || !bind || !ro || !out || !stats)
		return MOE_ERR_INVALID;
	moe_tcp_machine *def = ro->machine ? NULL : moe_tcp_machine_default(ctx);
	const moe_tcp_machine *mach = ro->machine ? ro->machine : def;
	if (!mach)
		return MOE_ERR_INVALID;
	double bw = mach->link_bytes_per_s, lat = mach->link_latency_s;
	moe_tcp_run_opts rom = *ro; /* the phases run on the resolved machine */
	rom.machine = mach;
	memset(stats, 0, sizeof *stats);
	stats->ep = ep;
	chip c[MOE_TCP_EP_MAX];
	memset(c, 0, sizeof c);
	double phase_len[PH_MAX] = {0}, round_len[PH_MAX] = {0};
	int nx[PH_MAX] = {0};
	int phases = 0;
	moe_status st = setup_chips(ctx, ep, g, c, &phases);
	for (int k = 0; st == MOE_OK && k < phases; k++) {
		double slow = 0, before[MOE_TCP_EP_MAX];
		for (int d = 0; st == MOE_OK && d < ep; d++) {
			before[d] = c[d].seconds;
			st = run_phase(ctx, &c[d], k, bind[d], &rom);
			if (c[d].seconds - before[d] > slow)
				slow = c[d].seconds - before[d];
		}
		stats->compute_seconds += slow;
		phase_len[k] = slow;
		double link0 = stats->link_seconds;
		/* round k: the exchanges whose operands are of phase k, in node order; the
		 * programs differ in node ids (folded constants), not in their exchanges */
		int64_t bo[MOE_TCP_EP_MAX], bi[MOE_TCP_EP_MAX];
		moe_id at[MOE_TCP_EP_MAX] = {0}, xs[MOE_TCP_EP_MAX];
		for (;;) {
			int found = 0;
			for (int d = 0; d < ep; d++) {
				while (at[d] < g[d]->nnodes &&
					(N(g[d], at[d])->op != MOE_OP_ALL_TO_ALL || c[d].level[at[d]] != k))
					at[d]++;
				found += at[d] < g[d]->nnodes;
				xs[d] = at[d]++;
			}
			if (st != MOE_OK || found == 0)
				break;
			if (found != ep) {
				moe_diag(ctx, MOE_DIAG_ERROR, g[0]->loc, "the chips' programs do not exchange alike in phase %d", k);
				st = MOE_ERR_INVALID;
				break;
			}
			for (int d = 0; d < ep; d++)
				bo[d] = c[d].out_bytes, bi[d] = c[d].in_bytes;
			st = exchange(ctx, c, ep, xs);
			double t = 0;
			for (int d = 0; st == MOE_OK && d < ep; d++) {
				int64_t o = c[d].out_bytes - bo[d], i = c[d].in_bytes - bi[d];
				double td = lat + (double)(o > i ? o : i) / bw;
				c[d].link_seconds += td;
				c[d].link[k] += td, c[d].rbo[k] += o, c[d].rbi[k] += i;
				if (td > t)
					t = td;
			}
			stats->link_seconds += t;
			stats->exchanges++;
			nx[k]++;
		}
		round_len[k] = stats->link_seconds - link0;
	}
	if (st == MOE_OK)
		rounds(stats, c, ep, phases, phase_len, round_len, nx);
	if (st == MOE_OK && ro->trace_path)
		st = write_trace(ctx, ro->trace_path, c, ep, phases, phase_len, round_len, mach->clock_hz);
	for (int d = 0; d < ep; d++) {
		if (st == MOE_OK)
			for (uint32_t o = 0; o < g[d]->nout; o++) {
				out[d][o] = c[d].val[g[d]->outputs[o]];
				c[d].val[g[d]->outputs[o]] = NULL;
			}
		stats->chip_seconds[d] = c[d].seconds;
		stats->chip_link_seconds[d] = c[d].link_seconds;
		stats->chip_link_bytes_out[d] = c[d].out_bytes;
		stats->chip_link_bytes_in[d] = c[d].in_bytes;
		for (moe_id i = 0; c[d].val && i < g[d]->nnodes; i++)
			moe_tensor_free(ctx, c[d].val[i]);
		for (int k = 0; k < PH_MAX; k++)
			ctx_free(ctx, c[d].ev[k], 0);
		free(c[d].val);
		free(c[d].fake);
		free(c[d].level);
	}
	stats->simulated_seconds = stats->compute_seconds + stats->link_seconds;
	stats->link_bytes_per_s = bw;
	stats->link_latency_s = lat;
	if (def)
		moe_tcp_machine_free(ctx, def);
	return st;
}
