/* backend-tcp/sim/sim.c: the instruction-level simulator.
 *
 * Functional: instructions run in program order on per-tensor storage; the
 * hazard scheduler below guarantees that the timed, concurrent execution
 * would observe the same values. Numerics: the vector engine works on 32-bit
 * lane words (i32 or f32); float ALUs flush subnormal inputs and results to
 * signed zero and return the canonical NaN 0x7fc00000; the contraction
 * multiplies bf16 operands (f32 operands as a bf16x3 split) and accumulates
 * in f32 in index order.
 * Timing (docs/tcp-model.md section 4): the kernel launches
 * (assumed.kernel_launch_cycles) before the control processor issues its
 * first instruction; it issues in order; each command starts when its
 * context is free, the control processor has issued it and every earlier
 * command touching an overlapping region with a read/write hazard has
 * finished. Program time is the latest finish plus the kernel's end
 * (assumed.kernel_end_cycles). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "backend-tcp/sim/sim_int.h"
#include "moec/io.h"

/* ---- the trace ---- */
void tcps_lanes_init(tcp_trace_lanes *l)
{
	for (int t = 0; t < TCP_TRACE_TRACKS; t++)
		for (int k = 0; k < TCP_TRACE_LANES; k++)
			l->end[t][k] = -1;
}

int tcps_lane(tcp_trace_lanes *l, int track, int64_t start, int64_t end)
{
	int k = 0;
	while (k < TCP_TRACE_LANES - 1 && l->end[track][k] > start)
		k++;
	if (l->end[track][k] < end)
		l->end[track][k] = end;
	return k;
}

int64_t tcps_ns(double seconds)
{
	return (int64_t)llround(seconds * 1e9);
}

int tcps_lane_tid(int track, int lane)
{
	return lane * TCP_TRACE_TRACKS + track;
}

void tcps_trace_slice(FILE *f, const char *name, int pid, int tid, int64_t t0, int64_t t1)
{
	int64_t d = t1 - t0;
	fprintf(f, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld.%03lld,\"dur\":%lld.%03lld", name,
		pid, tid, (long long)(t0 / 1000), (long long)(t0 % 1000), (long long)(d / 1000), (long long)(d % 1000));
}

void tcps_trace_tracks(FILE *f, int pid, const tcp_trace_lanes *l)
{
	for (int t = 0; t < TCP_TRACE_TRACKS; t++)
		for (int k = 0; k < TCP_TRACE_LANES; k++) {
			if (l->end[t][k] < 0)
				continue;
			char name[32];
			snprintf(name, sizeof name, k ? "%s #%d" : "%s", t < TCP_NCTX ? tcp_ctx_names[t] : "link", k + 1);
			fprintf(f,
				"{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n"
				"{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}},\n",
				pid, tcps_lane_tid(t, k), name, pid, tcps_lane_tid(t, k), t * TCP_TRACE_LANES + k);
		}
}

/* A Chrome trace: a track per command context that ran commands (a lane
 * more where commands of one context overlap in time), times in whole
 * nanoseconds. */
static moe_status write_trace(sim *s, const char *path)
{
	moe_atomic_file *af = moe_atomic_open(s->ctx, path);
	if (!af)
		return MOE_ERR_IO;
	FILE *f = moe_atomic_stream(af);
	double hz = s->m->clock_hz;
	tcp_trace_lanes l;
	tcps_lanes_init(&l);
	for (size_t i = 0; i < s->nev; i++)
		tcps_lane(&l, s->ev[i].ctx, tcps_ns((double)s->ev[i].start / hz), tcps_ns((double)s->ev[i].end / hz));
	fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
	tcps_trace_tracks(f, 0, &l);
	tcps_lanes_init(&l);
	for (size_t i = 0; i < s->nev; i++) {
		const tev *e = &s->ev[i];
		int64_t t0 = tcps_ns((double)e->start / hz), t1 = tcps_ns((double)e->end / hz);
		tcps_trace_slice(f, tcp_op_names[e->op], 0, tcps_lane_tid(e->ctx, tcps_lane(&l, e->ctx, t0, t1)), t0, t1);
		fprintf(f, ",\"args\":{\"pc\":%u,\"start\":%lld,\"end\":%lld,\"pred\":%d}}%s\n", e->pc, (long long)e->start,
			(long long)e->end, (int)e->pred, i + 1 < s->nev ? "," : "");
	}
	fprintf(f, "]}\n");
	return moe_atomic_commit(af); /* reports its own error */
}

/* ---- the run ---- */
/* Scratch and output tensors of at least this many bytes live in anonymous
 * mappings: zero, like the context's blocks, but a page takes memory only
 * once written (reading an untouched page maps the shared zero page), so a
 * run's memory follows the elements it writes rather than the worst-case
 * grids the program declares. Smaller ones stay with the context's
 * allocator. */
#define TCPS_MAP_MIN ((size_t)1 << 20)

/* The mappings undone (also when an allocation throws: the context's defer). */
static void tcps_unmap(void *arg)
{
	sim *s = arg;
	for (uint32_t i = 0; s->mapped && i < s->p->nt; i++)
		if (s->mapped[i]) {
			munmap(s->data[i], s->mapped[i]);
			s->data[i] = NULL;
			s->mapped[i] = 0;
		}
}

/* Storage for a tensor the run writes: zeroed; NULL (with a diagnostic) when
 * refused. */
static uint8_t *scratch(sim *s, uint32_t i, size_t bytes)
{
	uint8_t *d = NULL;
	if (bytes >= TCPS_MAP_MIN) {
		void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m != MAP_FAILED)
			d = m, s->mapped[i] = bytes;
	} else {
		d = ctx_soft_alloc(s->ctx, bytes ? bytes : 1); /* guarded: a refusal throws (MOE_ERR_NOMEM) */
	}
	if (!d)
		moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: out of host memory for '%s' (%zu bytes)",
			s->p->t[i].name, bytes);
	return d;
}

static moe_status bind(sim *s, const moe_tensor_map *b, const moe_tensor_map *packed)
{
	const tcp_program *p = s->p;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		size_t bytes = (size_t)t->numel * moe_dtype_size((moe_dtype)t->dtype);
		if (tcps_lazy_bind(s, i))
			continue;
		if (t->kind == TCP_T_INPUT || t->kind == TCP_T_WEIGHT || t->kind == TCP_T_PACKED) {
			const moe_tensor_map *from = t->kind == TCP_T_PACKED ? packed : b;
			moe_tensor *h = from ? moe_tensor_map_get(from, t->name) : NULL;
			if (!h) {
				moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: no tensor bound for %s '%s'",
					tcp_kind_names[t->kind], t->name);
				return MOE_ERR_INVALID;
			}
			bool same = h->dtype == (moe_dtype)t->dtype && h->rank == t->rank && h->nbytes == bytes;
			for (int k = 0; same && k < t->rank; k++)
				same = h->shape[k] == t->shape[k];
			if (!same) {
				moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(),
					"tcp: tensor bound for '%s' has the wrong dtype or shape (want %s, %lld elements)", t->name,
					moe_dtype_name((moe_dtype)t->dtype), (long long)t->numel);
				return MOE_ERR_INVALID;
			}
			s->data[i] = h->data; /* NULL only in a timing-only run (checked in moe_tcp_run) */
			s->absent[i] = h->data ? 0 : (int32_t)i + 1;
			s->borrowed[i] = true;
			continue;
		}
		if (!(s->data[i] = scratch(s, i, bytes)))
			return MOE_ERR_NOMEM;
		if (t->kind == TCP_T_CONST)
			memcpy(s->data[i], p->consts + t->const_off, bytes);
	}
	return MOE_OK;
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
	end += s->m->end_cycles;
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
	st->expert_start_seconds = s->nxiv ? (double)s->xiv[0][0] / s->m->clock_hz : 0;
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
	double tf = st->flops / s->m->peak_ops[tcp_prog_mac_type(p, s->m)], tb = bytes / s->m->hbm_bytes_per_s;
	st->roofline_seconds = tf > tb ? tf : tb;
	st->roofline_ratio = st->roofline_seconds > 0 ? st->simulated_seconds / st->roofline_seconds : 0;
}

static moe_status simulate(sim *s)
{
	const tcp_program *p = s->p;
	uint32_t pc = 0;
	uint64_t steps = 0, budget = tcp_step_budget(p), wbudget = tcp_work_budget(p);
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
		if (tcp_op_ctx[in->op] != TCP_CTX_CTL) {
			uint64_t w = tcp_command_work(in);
			if (w > wbudget - s->work) {
				FAULT(s, pc,
					"work budget of %llu reached (%d x the program's static work, its block loop %lld times: "
					"docs/tcp-isa.md section 9): the program does not terminate",
					(unsigned long long)wbudget, TCP_WORK_FACTOR, (long long)p->moe_G);
				break;
			}
			s->work += w;
		}
		if (((int32_t)pc == p->block_loop_pc + 1 && p->block_loop_pc >= 0) ||
			((int32_t)pc == p->tier_loop_pc + 1 && p->tier_loop_pc >= 0)) {
			s->st->blocks_executed++;
			if (s->o->progress)
				s->o->progress(s->o->progress_ud, "blocks", s->st->blocks_executed, s->nblocks > 0 ? s->nblocks : p->moe_G);
		} else if (s->o->progress && !in_experts(s, pc) && tcp_op_ctx[in->op] != TCP_CTX_CTL) {
			/* by the command's phase (a schedule may place expert-phase commands,
			 * such as a speculative first fetch, among routing's); the position
			 * counts from the phase's first command, within [0, total] */
			bool before = in->phase != TCP_PH_COMBINE;
			int64_t end = s->xhi >= 0 ? s->xhi + 1 : (int64_t)p->ncode;
			int64_t lo = before ? 0 : end, hi = before ? end : (int64_t)p->ncode;
			int64_t done = (int64_t)pc - lo;
			done = done < 0 ? 0 : done > hi - lo ? hi - lo : done;
			s->o->progress(s->o->progress_ud, before ? "routing" : "combine", done, hi - lo);
		}
		uint32_t next = pc + 1;
		switch ((tcp_opcode)in->op) {
		case TCP_OP_HALT: goto done;
		case TCP_OP_LI:
			s->reg[in->rd] = in->imm;
			s->tc += tcp_cost_scalar(&s->cm, in->op);
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
			s->tc += tcp_cost_scalar(&s->cm, in->op);
			break;
		}
		case TCP_OP_LD: {
			int64_t lo, hi;
			const tcp_view *v = &in->v[TCP_V_S0];
			if (!tcps_vrange(s, pc, v, 0, in->dim, &lo, &hi) || !tcps_needs_values(s, pc, v->t))
				break;
			const int64_t *sp = s->spm[v->t];
			if (sp[2] < 0 || lo < sp[0] || lo > sp[1]) {
				FAULT(s, pc, "element %lld of '%s' was not staged into SPM (dma.spm) before this ld", (long long)lo,
					p->t[v->t].name);
				break;
			}
			if (sp[2] > s->tc)
				s->tc = sp[2], s->tcev = (evref)sp[3];
			s->tc += tcp_cost_scalar(&s->cm, in->op);
			s->reg[in->rd] = iw(s->pr ? tcps_pred_word(s, v->t, lo) : load_word(s, v->t, lo));
			if ((v->t == p->bexp_t || v->t == p->tier_bexp_t) && v->t >= 0 && s->seen && s->reg[in->rd] >= 0 && s->reg[in->rd] < p->moe_E)
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
			s->tc += tcp_cost_scalar(&s->cm, in->op);
			if (t)
				next = (uint32_t)in->target;
			break;
		}
		case TCP_OP_JMP:
			s->tc += tcp_cost_scalar(&s->cm, in->op);
			next = (uint32_t)in->target;
			break;
		case TCP_OP_SIG:
			s->tok[in->target] = s->cfree[in->sop] > s->tc ? s->cfree[in->sop] : s->tc;
			s->tokev[in->target] = s->cfree[in->sop] > s->tc ? s->cev[in->sop] : s->tcev;
			s->tc += tcp_cost_scalar(&s->cm, in->op);
			break;
		case TCP_OP_WAIT:
			if (s->tok[in->target] > s->cfree[in->sop])
				s->cfree[in->sop] = s->tok[in->target], s->cev[in->sop] = s->tokev[in->target];
			s->tc += tcp_cost_scalar(&s->cm, in->op);
			break;
		case TCP_OP_DMA_COPY: tcps_run_dma_copy(s, pc, in); break;
		case TCP_OP_DMA_GATHER:
		case TCP_OP_DMA_SCATTER: tcps_run_dma_gs(s, pc, in); break;
		case TCP_OP_DMA_SPM: tcps_run_dma_spm(s, pc, in); break;
		case TCP_OP_SUB_TRF:
		case TCP_OP_SUB_VRF: tcps_run_sub(s, pc, in); break;
		case TCP_OP_TU_VEC: tcps_run_vec(s, pc, in); break;
		case TCP_OP_TU_CONTRACT: tcps_run_contract(s, pc, in); break;
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

/* The tensor of output k: the one named output<k> (the lowering may create a
 * later output first, when a gather writes it in place), else the k-th
 * output in table order. */
static uint32_t output_tensor(const moe_tcp_program *p, uint32_t k)
{
	uint32_t j = 0, at = p->nt;
	for (uint32_t i = 0; i < p->nt; i++) {
		unsigned x;
		char end;
		if (p->t[i].kind != TCP_T_OUTPUT)
			continue;
		if (p->t[i].name && sscanf(p->t[i].name, "output%u%c", &x, &end) == 1 && x == k)
			return i;
		if (j++ == k)
			at = i;
	}
	return at;
}

static moe_status tcp_run_guarded(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *b,
	const moe_tcp_run_opts *opts, moe_tensor **out, moe_tcp_stats *stats, tev **ev, size_t *nev, tcps_pred *pr);

/* A run, or with pr a prediction: nothing bound or packed, every tensor
 * without storage (predict.c). */
static moe_status tcp_run(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *b, const moe_tcp_run_opts *opts,
	moe_tensor **out, moe_tcp_stats *stats, tev **ev, size_t *nev, tcps_pred *pr)
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
	if (rc == MOE_OK && !pr)
		rc = tcp_tokens_check(ctx, p, b);
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
	s.keep_ev = ev != NULL;
	s.pr = pr;
	s.S = tcp_slices(m);
	tcp_cm_init(&s.cm, m);
	/* the simulator's memory is the context's (a throw frees it) */
	s.data = ctx_try_alloc(ctx, (p->nt + 1) * sizeof *s.data);
	s.borrowed = ctx_try_alloc(ctx, p->nt + 1);
	s.absent = ctx_try_alloc(ctx, (p->nt + 1) * sizeof *s.absent);
	s.hz = ctx_try_alloc(ctx, (p->nt + 1) * sizeof *s.hz);
	s.spm = ctx_try_alloc(ctx, (p->nt + 1) * sizeof *s.spm);
	s.dmn_stamp = ctx_try_alloc(ctx, (size_t)tcp_meter_stamps(m) * sizeof *s.dmn_stamp);
	tcp_meter_init(&s.mt, &s.cm, p, s.dmn_stamp);
	s.route = ctx_try_alloc(ctx, (size_t)p->ncode + 1);
	s.mapped = ctx_try_alloc(ctx, (p->nt + 1) * sizeof *s.mapped);
	if (o->timing_only && p->block_body_pc >= 0 && !pr)
		s.ctl = ctx_try_alloc(ctx, (size_t)p->nt + 1);
	s.tc = m->launch_cycles; /* the kernel launches before its first instruction */
	if (!s.data || !s.borrowed || !s.absent || !s.hz || !s.spm || !s.dmn_stamp || !s.route || !s.mapped ||
		(o->timing_only && p->block_body_pc >= 0 && !pr && !s.ctl)) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: out of memory for the simulator's tables");
		rc = MOE_ERR_NOMEM;
		goto out;
	}
	s.order_bytes = !o->order_tensor;
	if (!tcps_alias_setup(&s)) {
		rc = MOE_ERR_NOMEM;
		goto out;
	}
	s.unmap_defer = ctx_defer(ctx, tcps_unmap, &s);
	s.unmap_deferred = true;
	if (s.ctl)
		tcps_control_tensors(&s);
	for (uint32_t i = 0; i <= p->nt; i++)
		s.spm[i][0] = s.spm[i][1] = s.spm[i][2] = -1, s.spm[i][3] = 0;
	if (p->moe_E > 0 && p->moe_E < ((int64_t)1 << 24))
		s.seen = ctx_alloc(ctx, (size_t)p->moe_E); /* moe_tcp_run is guarded: a refusal is MOE_ERR_NOMEM */
	/* xhi: the last command before the combine's first (progress counts the combine from there) */
	s.xhi = -1;
	for (uint32_t i = 0; i < p->ncode && s.xhi < 0; i++)
		if (p->code[i].phase == TCP_PH_COMBINE)
			s.xhi = (int64_t)i - 1;
	/* a full run refuses weights without values before anything is packed */
	for (uint32_t i = 0; !pr && !o->timing_only && !o->lazy_weights && b && i < p->nt; i++) {
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
	packed = moe_tensor_map_new(ctx); /* guarded: never NULL */
	/* at load time: off the simulated clock */
	rc = pr ? MOE_OK
		: o->lazy_weights && !o->timing_only ? tcps_lazy_setup(&s, b, packed)
						     : tcp_pack_weights(ctx, p, b, o->lazy_weights, o->timing_only != 0, packed);
	if (rc != MOE_OK)
		goto out;
	if (pr) {
		for (uint32_t i = 0; i < p->nt; i++) /* no storage: data[i] stays NULL */
			s.borrowed[i] = true, s.absent[i] = 0;
	} else if ((rc = bind(&s, b, packed)) != MOE_OK) {
		goto out;
	}
	rc = simulate(&s);
	finish_stats(&s);
	if (rc == MOE_OK && o->trace_path)
		rc = write_trace(&s, o->trace_path);
	if (rc == MOE_OK && out && !pr) {
		for (uint32_t k = 0, n = moe_tcp_num_outputs(p); k < n; k++) {
			uint32_t i = output_tensor(p, k);
			const tcp_tensor *t = &p->t[i];
			moe_tensor *r = moe_tensor_new(ctx, (moe_dtype)t->dtype, t->rank, t->shape);
			if (!r) {
				rc = MOE_ERR_NOMEM;
				break;
			}
			memcpy(r->data, s.data[i], r->nbytes);
			out[k] = r;
		}
	}
out:
	tcps_lazy_free(&s);
	if (s.unmap_deferred) {
		tcps_unmap(&s);
		ctx_undefer(ctx, s.unmap_defer);
	}
	for (uint32_t i = 0; s.data && s.borrowed && i < p->nt; i++)
		if (!s.borrowed[i])
			ctx_free(ctx, s.data[i], 0);
	ctx_free(ctx, s.data, 0);
	ctx_free(ctx, s.borrowed, 0);
	ctx_free(ctx, s.absent, 0);
	ctx_free(ctx, s.hz, 0);
	tcps_alias_free(&s);
	ctx_free(ctx, s.spm, 0);
	ctx_free(ctx, s.dmn_stamp, 0);
	ctx_free(ctx, s.route, 0);
	ctx_free(ctx, s.mapped, 0);
	ctx_free(ctx, s.ctl, 0);
	ctx_free(ctx, s.seen, 0);
	if (ev && rc == MOE_OK) { /* handed to the caller */
		*ev = s.ev, *nev = s.nev;
		s.ev = NULL;
	}
	ctx_free(ctx, s.ev, 0);
	ctx_free(ctx, s.xiv, 0);
	if (packed)
		moe_tensor_map_free(packed);
	moe_tcp_machine_free(ctx, def);
	return rc;
}


moe_status moe_tcp_run(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *b, const moe_tcp_run_opts *opts,
	moe_tensor **out, moe_tcp_stats *stats)
{
	return tcp_run_events(ctx, p, b, opts, out, stats, NULL, NULL);
}

moe_status tcp_run_events(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *b, const moe_tcp_run_opts *opts,
	moe_tensor **out, moe_tcp_stats *stats, tev **ev, size_t *nev)
{
	moe_status s = tcp_run_guarded(ctx, p, b, opts, out, stats, ev, nev, NULL);
	if (s == MOE_ERR_NOMEM && out) /* the outputs were freed with the rest */
		for (uint32_t i = 0; i < moe_tcp_num_outputs(p); i++)
			out[i] = NULL;
	return s;
}

static moe_status tcp_run_guarded(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *b,
	const moe_tcp_run_opts *opts, moe_tensor **out, moe_tcp_stats *stats, tev **ev, size_t *nev, tcps_pred *pr)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, tcp_run(ctx, p, b, opts, out, stats, ev, nev, pr));
}

moe_status tcps_run_predict(moe_ctx *ctx, const tcp_program *p, const moe_tcp_machine *m, tcps_pred *pr,
	moe_tcp_stats *stats)
{
	moe_tcp_run_opts o = {.machine = m, .timing_only = 1, .order_tensor = !tcps_pred_order_bytes(pr)};
	return tcp_run_guarded(ctx, p, NULL, &o, NULL, stats, NULL, NULL, pr);
}
