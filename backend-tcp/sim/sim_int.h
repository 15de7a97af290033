/* backend-tcp/sim/sim_int.h: state shared by the files of the TCP simulator
 * (sim.c: binding, the instruction loop, statistics and trace; sim_sched.c:
 * view ranges, hazards and the command scheduler; sim_mem.c: DMA and sub
 * loads with their cost model; sim_exec.c: the vector engine and the
 * contraction). Lane-word helpers are static inline here (hot loops);
 * everything else crossing files is tcps_*. */
#ifndef MOEC_TCP_SIM_INT_H
#define MOEC_TCP_SIM_INT_H

#include <math.h>
#include <string.h>

#include "backend-tcp/sim/sim_quant.h"
#include "backend-tcp/isa/cost.h"
#include "backend-tcp/isa/tcp_int.h"
#include "ir/scalar.h"
#include "moec/io.h"

#define NHAZ 64
#define TCP_MAX_EVENTS 2000000 /* commands recorded for a trace; later ones are not */
#define TCP_MAX_CYCLES ((int64_t)1 << 60)
/* An event reference: the recorded event's index + 1, 0 for none (the
 * critical path's links, tev.pred). */
typedef int32_t evref;
typedef struct haz_rec {
	int64_t lo, hi, end;
	/* DM/TRF/VRF: the per-slice byte offsets [blo, bhi] the element range
	 * [lo, hi] maps to (tcps_byte_span); seq: the command's position in
	 * program order */
	int64_t blo, bhi, seq;
	uint32_t pc; /* the command's instruction */
	bool write;
	evref ev; /* the command that ends at `end` */
} haz_rec;
typedef struct haz {
	haz_rec r[NHAZ];
	int n;
	int64_t floor_w, floor_r; /* conservative summary of evicted records */
	evref floor_w_ev, floor_r_ev;
	int64_t last_end;  /* the latest end of any access noted */
	int64_t last_wseq; /* the seq of the last write noted, -1: none */
} haz;

/* One command's run. pred: the recorded command whose end released it (the
 * latest of: the issue path's last wait, its context's previous command, the
 * commands it has hazards on; for a joined DMA whose end follows the command
 * it joins, that command), -1 when none was recorded or it waited on nothing.
 * Following pred from the last command gives the critical path: each command
 * adds end - max(start, pred's end), the rest is command issue. */
typedef struct tev {
	int ctx;
	uint8_t op;
	uint32_t pc;
	int64_t start, end;
	int32_t pred;
} tev;

typedef struct sim {
	moe_ctx *ctx;
	const tcp_program *p;
	const moe_tcp_machine *m;
	const moe_tcp_run_opts *o;
	uint8_t **data;  /* per tensor */
	bool *borrowed;  /* bound inputs/weights are read in place */
	/* per tensor: the length of the anonymous mapping holding it, 0: none
	 * (sim.c, bind: large scratch and outputs, whose untouched pages cost no
	 * memory); unmapped by tcps_unmap, also when an allocation throws */
	size_t *mapped;
	uint32_t unmap_defer;
	bool unmap_deferred;
	/* timing-only runs: per tensor, whether the control path reads its values
	 * (tcps_moves); NULL in other runs */
	uint8_t *ctl;
	/* Timing-only runs may bind weights without data (absent from the
	 * checkpoint): absent[t] marks tensors whose values derive from one.
	 * Copies carry the mark (the index of that weight + 1); a computation that
	 * needs such values faults. */
	int32_t *absent;
	haz *hz;
	int64_t reg[TCP_NREG];
	int64_t tc, cfree[TCP_NCTX], tok[TCP_NTOK];
	int64_t dma_start; /* when the last DMA command started (dma.setup_overlaps_previous) */
	bool hold_main;    /* the command being scheduled also occupies the main context */
	uint64_t work;     /* the commands' work so far (tcp_command_work) */
	/* DMA placement scratch: a stamp per DMN (the command that last touched it) */
	uint32_t *dmn_stamp;
	tcp_meter mt; /* DMA loads measured on the program's tensors (isa/cost.h) */
	/* the critical path's links (evref): the command whose end cfree[ctx] is,
	 * that raised tc last (an ld waiting for SPM), that a token holds, that
	 * released the last DMA command (a joined one starts beside it) */
	evref cev[TCP_NCTX], tcev, tokev[TCP_NTOK], dma_pred;
	moe_tcp_stats *st;
	tev *ev;
	size_t nev, evcap;
	bool keep_ev; /* record events without a trace file (tcp_run_events) */
	bool fault;
	bool cycles_overflow; /* a command's duration or end passed TCP_MAX_CYCLES */
	int64_t S;
	uint8_t *route; /* per pc: a routed pass's remote operands (tcp_pass_remote) | 0x80, 0: not yet known */
	tcp_cm cm; /* the machine's timing rules (isa/cost.h) */
	uint8_t *seen; /* experts whose blocks ran */
	/* SPM: per tensor, the element range staged by dma.spm and when it
	 * arrived (-1: none); `ld` reads only staged elements */
	int64_t (*spm)[4]; /* [3]: the staging command (evref) */
	/* for the progress report: the last instruction before the combine's
	 * first (-1: none) */
	int64_t xhi;
	int64_t nblocks; /* the run-time block count, once loaded */
	int64_t (*xiv)[2];
	size_t nxiv, xivcap;
	/* weights read on first use (sim_lazy.c), NULL: none; no_fill: the view
	 * checked reads rows the command fills itself (a gather's source) */
	struct tcps_lazy *lz;
	bool no_fill;
	/* sim_alias.c: per DM/TRF/VRF tensor t, the other tensors of its space
	 * whose per-slice regions [addr, addr + slice_bytes) overlap its own:
	 * al[alo[t]] .. al[alo[t + 1] - 1] (NULL: none computed); order_bytes:
	 * commands also wait for conflicting accesses of those tensors to the
	 * same per-slice bytes (moe_tcp_run_opts.order_tensor zero) */
	int32_t *alo, *al;
	bool order_bytes;
	/* predict mode (predict.c): no tensor storage (data[] all NULL), no
	 * arithmetic; ld and index lists read the loads the staging wrote */
	struct tcps_pred *pr;
} sim;

/* moe_tcp_run that also hands back every command's run (cycles; at most
 * TCP_MAX_EVENTS, *nev of them; the caller frees *ev with ctx_free(ctx, *ev, 0)):
 * the expert-parallel runner's per-phase measurement and trace (multichip.c). */
moe_status tcp_run_events(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *b, const moe_tcp_run_opts *opts,
	moe_tensor **out, moe_tcp_stats *stats, tev **ev, size_t *nev);

/* The trace's tracks (sim.c): per command context (and, on several chips,
 * the link: track TCP_NCTX), lanes such that the slices put on one lane
 * never overlap (a DMA command set up beside the previous transfer takes a
 * second lane). Times are whole nanoseconds. */
#define TCP_TRACE_TRACKS (TCP_NCTX + 1)
#define TCP_TRACE_LANES 64
typedef struct tcp_trace_lanes {
	int64_t end[TCP_TRACE_TRACKS][TCP_TRACE_LANES]; /* the latest end on each lane; -1: unused */
} tcp_trace_lanes;
void tcps_lanes_init(tcp_trace_lanes *l);
/* The first lane of `track` free at `start` (the last one when none is),
 * taken until `end`. */
int tcps_lane(tcp_trace_lanes *l, int track, int64_t start, int64_t end);
int64_t tcps_ns(double seconds);
int tcps_lane_tid(int track, int lane);
/* Writes a thread_name and a thread_sort_index for every lane taken. */
void tcps_trace_tracks(FILE *f, int pid, const tcp_trace_lanes *l);
/* Writes an "X" event [t0, t1] ns up to its "dur" (the caller closes it). */
void tcps_trace_slice(FILE *f, const char *name, int pid, int tid, int64_t t0, int64_t t1);

/* expert work (the statistics' expert time): the instructions the compiler
 * tagged expert or prefetch */
static inline bool in_experts(const sim *s, uint32_t pc)
{
	uint8_t ph = s->p->code[pc].phase;
	return ph == TCP_PH_EXPERT || ph == TCP_PH_PREFETCH;
}

/* Counters saturate at TCP_MAX_CYCLES; reaching it stops the run with a fault. */
static inline void acc_sat(sim *s, int64_t *acc, int64_t v)
{
	if (v > TCP_MAX_CYCLES - *acc) {
		*acc = TCP_MAX_CYCLES;
		s->cycles_overflow = true;
	} else {
		*acc += v;
	}
}

/* busy cycles of an engine, also counted as routing outside the expert region */
static inline void busy(sim *s, uint32_t pc, int engine, int64_t cycles)
{
	acc_sat(s, &s->st->busy_cycles[engine], cycles);
	if (!in_experts(s, pc))
		acc_sat(s, &s->st->routing_busy_cycles[engine], cycles);
}

#define FAULT(s, pc, ...)                                                                                  \
	do {                                                                                                 \
		char _m[1024];                                                                                   \
		snprintf(_m, sizeof _m, __VA_ARGS__);                                                            \
		moe_diag((s)->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp run-time fault at instruction %u (%s): %s", \
			(unsigned)(pc), tcp_op_names[(s)->p->code[pc].op], _m);                                       \
		(s)->fault = true;                                                                               \
	} while (0)

/* ---- lane words ---- */
static inline float w2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint32_t f2w(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float flush(float f)
{
	if (f != 0 && fabsf(f) < 1.17549435e-38f)
		return copysignf(0.0f, f);
	return f;
}

/* flush() without the branch on zero (fabsf(0) < FLT_MIN gives copysign(0, 0)
 * = the same zero): the contraction's inner loop vectorizes */
static inline float flush_fast(float f)
{
	return fabsf(f) < 1.17549435e-38f ? copysignf(0.0f, f) : f;
}

static inline uint32_t fres(float f)
{
	if (isnan(f))
		return 0x7fc00000u;
	return f2w(flush(f));
}

static inline float fin(uint32_t u)
{
	return flush(w2f(u));
}

static inline uint32_t load_word(const sim *s, int32_t t, int64_t i)
{
	const uint8_t *d = s->data[t];
	switch (s->p->t[t].dtype) {
	case MOE_BF16: {
		uint16_t h;
		memcpy(&h, d + 2 * i, 2);
		return (uint32_t)h << 16;
	}
	case MOE_BOOL: return d[i] ? 1u : 0u;
	case MOE_F8E4M3: return tcpq_bits(qt_e4m3(d[i])); /* the fetch widens f8 to f32 */
	case MOE_U8: return d[i];
	case MOE_I8: return (uint32_t)(int32_t)(int8_t)d[i]; /* sign-extended */
	default: {
		uint32_t u;
		memcpy(&u, d + 4 * i, 4);
		return u;
	}
	}
}

static inline void store_word(sim *s, int32_t t, int64_t i, uint32_t w)
{
	uint8_t *d = s->data[t];
	switch (s->p->t[t].dtype) {
	case MOE_BF16: {
		uint16_t h = moe_f32_to_bf16(w2f(w));
		memcpy(d + 2 * i, &h, 2);
		break;
	}
	case MOE_BOOL: d[i] = w != 0; break;
	case MOE_F8E4M3: d[i] = tcpq_to_e4m3(w2f(w)); break; /* the cast stage narrows f32 to f8 */
	case MOE_U8:
	case MOE_I8: d[i] = (uint8_t)w; break; /* the low byte */
	default: memcpy(d + 4 * i, &w, 4); break;
	}
}

static inline int64_t esz_of(const sim *s, int32_t t)
{
	return (int64_t)moe_dtype_size((moe_dtype)s->p->t[t].dtype);
}

/* ---- views ---- */
/* A view's base element: base + reg x scale. Only after tcps_vbase_ok (or
 * tcps_vrange) accepted the view: a register may hold anything. */
static inline int64_t vbase(const sim *s, const tcp_view *v)
{
	return v->base + (v->reg >= 0 ? s->reg[v->reg] * v->scale : 0);
}

static inline int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* ---- vector engine ---- */
static inline int32_t iw(uint32_t u)
{
	int32_t i;
	memcpy(&i, &u, 4);
	return i;
}

static inline uint32_t wi(int32_t i)
{
	uint32_t u;
	memcpy(&u, &i, 4);
	return u;
}

typedef struct acc {
	int32_t t[6];
	int64_t lo[6], hi[6];
	bool w[6];
	int n;
} acc;

static inline void acc_add(acc *a, int32_t t, int64_t lo, int64_t hi, bool w)
{
	a->t[a->n] = t;
	a->lo[a->n] = lo;
	a->hi[a->n] = hi;
	a->w[a->n++] = w;
}

/* sim_sched.c */
/* base + reg x scale without overflow (a fault naming the instruction). */
bool tcps_vbase_ok(sim *s, uint32_t pc, const tcp_view *v, int64_t *b);
/* The element range a view touches, checked against its tensor. */
bool tcps_vrange(sim *s, uint32_t pc, const tcp_view *v, int nd, const int64_t *dim, int64_t *lo, int64_t *hi);
/* Schedule a command of `dur` cycles in its context after its hazards. */
void tcps_schedule(sim *s, uint32_t pc, const acc *a, int64_t dur);

/* sim_alias.c */
/* Computes s->alo and s->al (false: out of memory, a diagnostic given). */
bool tcps_alias_setup(sim *s);
void tcps_alias_free(sim *s);
/* The per-slice byte offsets [*blo, *bhi] that elements [lo, hi] of DM/TRF/VRF
 * tensor t occupy in the slices holding them (a hull: every byte in between
 * that some slice holds at that offset is inside). */
void tcps_byte_span(const sim *s, int32_t t, int64_t lo, int64_t hi, int64_t *blo, int64_t *bhi);
/* The latest end (>= start) of a conflicting access (RAW, WAR, WAW) of a
 * tensor aliasing t to per-slice bytes [blo, bhi]; *ev its command. */
int64_t tcps_alias_wait(const sim *s, int32_t t, int64_t blo, int64_t bhi, bool write, evref *ev, int64_t start);
/* A read of t's per-slice bytes [blo, bhi]: faults (false) when a tensor
 * aliasing t wrote some of them after t's last write to them. */
bool tcps_alias_read_ok(sim *s, uint32_t pc, int32_t t, int64_t blo, int64_t bhi);

/* sim_lazy.c */
typedef struct tcps_lazy tcps_lazy;
/* With moe_tcp_run_opts.lazy_weights: maps the deferred weights and the
 * packed weights computed from them (rows filled on first read), or packs
 * into `packed` eagerly where the packing does not run row by row. */
moe_status tcps_lazy_setup(sim *s, const moe_tensor_map *b, moe_tensor_map *packed);
/* Binds tensor i to its mapping when it is lazy (true). */
bool tcps_lazy_bind(sim *s, uint32_t i);
/* Fills the rows holding elements [lo, hi] of lazy tensor t; false after a fault. */
bool tcps_fill(sim *s, uint32_t pc, int32_t t, int64_t lo, int64_t hi);
void tcps_lazy_free(sim *s);

/* sim_mem.c */
bool tcps_writable(sim *s, uint32_t pc, int32_t t);
/* Marks s->ctl: the sources of ld and dma.spm, the index lists of gathers
 * and scatters, and every operand of a command writing one of those. */
void tcps_control_tensors(sim *s);
/* Whether a command at pc moves data into tensor t (values it writes that
 * something may read). */
bool tcps_moves(const sim *s, uint32_t pc, int32_t t);
bool tcps_needs_values(sim *s, uint32_t pc, int32_t t);
bool tcps_computes(const sim *s, uint32_t pc);
bool tcps_take_values(sim *s, uint32_t pc, const tcp_insn *in);
void tcps_run_dma_copy(sim *s, uint32_t pc, const tcp_insn *in);
void tcps_run_dma_gs(sim *s, uint32_t pc, const tcp_insn *in);
void tcps_run_dma_spm(sim *s, uint32_t pc, const tcp_insn *in);
void tcps_run_sub(sim *s, uint32_t pc, const tcp_insn *in);

/* sim_exec.c */
void tcps_run_vec(sim *s, uint32_t pc, const tcp_insn *in);
void tcps_run_contract(sim *s, uint32_t pc, const tcp_insn *in);

/* predict.c */
typedef struct tcps_pred tcps_pred;
/* After a dma.spm was scheduled: in predict mode the block loop's staging
 * writes the loads (a fault when they do not fit the staged grid); in a run
 * with opts.observed it records what the staging wrote. */
void tcps_staged(sim *s, uint32_t pc, const tcp_insn *in);
/* Predict mode: a dma.copy from view base sb to db (no data moves; a copy of
 * n_tokens is followed). */
void tcps_pred_copy(sim *s, const tcp_insn *in, int64_t db, int64_t sb);
/* Predict mode: the word an ld reads at element el of tensor t. */
uint32_t tcps_pred_word(sim *s, int32_t t, int64_t el);
/* Predict mode: the row index at position (g, j) of gather/scatter in's
 * list, cnt of the group's n positions valid; in [0, in->rows). */
int64_t tcps_pred_index(sim *s, const tcp_insn *in, int64_t g, int64_t j, int64_t cnt);
/* sim.c: runs p in predict mode (no binding, no packing) with pr. */
/* the order of accesses a prediction times (moe_tcp_run_opts.order_tensor zero) */
int tcps_pred_order_bytes(const tcps_pred *pr);
moe_status tcps_run_predict(moe_ctx *ctx, const tcp_program *p, const moe_tcp_machine *m, tcps_pred *pr,
	moe_tcp_stats *stats);

/* pack.c: evaluates the prep graph on the bound weights (A13). With timing_only and a
 * weight bound without data, binds every packed tensor without data instead. */
const char *tcp_e8m0_scales(const ir_node *o);
/* The index of p's weight tensor named name, -1 when none (or name is ""). */
int32_t tcp_weight_named(const tcp_program *p, const char *name);
bool tcp_e8m0_check(const ir_node *o, const moe_tensor *v, const moe_tensor *sc, int64_t e0, const tcp_program *p,
	moe_checkpoint *ck, char *msg, size_t n);
moe_status tcp_pack_weights(moe_ctx *ctx, const tcp_program *p, const moe_tensor_map *bind, moe_checkpoint *ck,
	bool timing_only, moe_tensor_map *packed);

#endif
