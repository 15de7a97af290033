/* backend-tcp/isa/cost.h: the machine's timing rules (docs/tcp-model.md,
 * docs/tcp-compiler.md section 6), in one module that the simulator and the
 * compiler both call, so that a prediction and a simulation of the same
 * command cannot use different formulas.
 *
 * The caller measures what a command moves or computes (a *load*: the
 * simulator from the run's registers and the tensors' layout, the compiler
 * from the shapes it plans); the functions here turn a load into cycles from
 * the machine's fields. No function here reads a tensor, a register or the
 * clock of a run. Every result is in cycles of the machine's clock and
 * excludes the Tensor Unit's command issue (tcp_cost_issue), which the
 * context's timeline adds. */
#ifndef MOEC_TCP_COST_H
#define MOEC_TCP_COST_H

#include "backend-tcp/isa/tcp_int.h"

/* Rates derived once from a machine. */
typedef struct tcp_cm {
	const moe_tcp_machine *m;
	int64_t S;      /* slices */
	double hbm_bpc; /* the one HBM pool, bytes per cycle */
	int gshift;     /* log2 of hbm.granule + 1 when it is a power of two; 0: not */
} tcp_cm;
void tcp_cm_init(tcp_cm *cm, const moe_tcp_machine *m);

/* A command's time: `total` its context's busy time (issue excluded),
 * `engine` the cycles its engine computes (the vector ALUs, the MACs; 0 for
 * DMA and sub loads), counted in the statistics' busy cycles. */
typedef struct tcp_cost {
	int64_t total, engine;
} tcp_cost;

/* The Tensor Unit's issue of a command of context ctx (TCP_CTX_*):
 * assumed.command_issue_cycles for main and sub commands; a DMA command's
 * setup, in its tcp_cost_dma, holds its issue. */
int64_t tcp_cost_issue(const tcp_cm *cm, int ctx);
/* The control processor's cycles for one instruction of opcode op: a branch
 * assumed.runtime_branch_cycles, any other (a command's issue included)
 * assumed.scalar_op_cycles. */
int64_t tcp_cost_scalar(const tcp_cm *cm, int op);

/* ---- DMA (docs/tcp-model.md section 4) ---- */
/* What one DMA command moves. The caller sets bytes, requests and the DM
 * side (dmns, pairs, clo/chi), charges every contiguous run with
 * tcp_dma_run, and sets eng with tcp_dma_engines. */
typedef struct tcp_dma_load {
	int64_t bytes;    /* DM-side bytes, every copy counted (HBM -> HBM: the bytes moved) */
	int64_t requests; /* ceil(packet / dma.request_bytes) per packet (tcp_dma_requests) */
	int64_t rmw;      /* bytes of DM write runs that are not dm_alignment_bytes aligned */
	int64_t eng;      /* engines the command runs on */
	double hbm;       /* bytes charged to the one HBM pool, reads and writes together */
	/* the HBM pattern: address bits 8..12 of every granule touched, the
	 * requests and those that switch rows in their channel, each side's last
	 * run start */
	uint32_t chan;
	int64_t hreq, conflicts, last[2];
	/* the DM side: DMNs and DMN pairs touched, each side's clusters */
	int64_t dmns, pairs, clo[2], chi[2];
} tcp_dma_load;
void tcp_dma_load_init(tcp_dma_load *c);
/* Charges one contiguous run of len > 0 bytes at byte address a of an HBM
 * (hbm) or DM tensor, read or written. */
void tcp_dma_run(const tcp_cm *cm, tcp_dma_load *c, bool hbm, int64_t a, int64_t len, bool write);
/* n runs of len bytes at a, a + step, ..., charged as n tcp_dma_run calls
 * in that order (the same load; HBM reads of long runs without the walk). */
void tcp_dma_runs(const tcp_cm *cm, tcp_dma_load *c, bool hbm, int64_t a, int64_t len, int64_t step, int64_t n,
	bool write);
/* Requests of a run of rb bytes split into packets of at most dma.max_packet_bytes. */
int64_t tcp_dma_requests(const tcp_cm *cm, int64_t rb);
/* The engines of a command once its DM side is known: the DMN pairs it
 * touches (HBM -> HBM: dma.hbm_to_hbm_engines), within [1, dma.engines]. */
void tcp_dma_engines(const tcp_cm *cm, tcp_dma_load *c, bool hbm2hbm);
/* setup + the data time (the largest of the engines', the DMNs', the HBM
 * pool's and the requests' time) + the row overheads of a gather or scatter
 * of `rows` index rows. *overflow is set when the time is not finite or
 * passes 1e15 cycles (the time is then capped there). */
int64_t tcp_cost_dma(const tcp_cm *cm, const tcp_dma_load *c, bool dm2dm, int64_t rows, bool *overflow);

/* ---- measuring a DMA command on a tensor table ----
 * The load of a DMA command as the simulator and the schedule's timeline
 * both measure it (isa/meter.c): the contiguous runs of its views, charged
 * with tcp_dma_run, and its DM sides (the DMNs and DMN pairs its bytes lie
 * on, every copy of the tensor's layout). The caller owns the stamps (one
 * per DMN and DMN pair, tcp_meter_stamps of them, zeroed) and reads the HBM
 * bytes charged from hbm_read / hbm_write, which only grow. */
typedef struct tcp_meter {
	const tcp_cm *cm;
	const tcp_program *p;
	uint32_t *dmn, stamp;
	int64_t ndmn;
	int64_t hbm_read, hbm_write;
} tcp_meter;
int64_t tcp_meter_stamps(const moe_tcp_machine *m);
void tcp_meter_init(tcp_meter *mt, const tcp_cm *cm, const tcp_program *p, uint32_t *stamps);
/* One contiguous run of len bytes at byte address a of tensor t (none when len <= 0). */
void tcp_meter_run(tcp_meter *mt, tcp_dma_load *c, int32_t t, int64_t a, int64_t len, bool write);
/* The contiguous runs of view v, whose first element is element `base` of
 * its tensor, over dims (elements of e bytes), each charged; returns the
 * run length in elements. */
int64_t tcp_meter_runs(tcp_meter *mt, tcp_dma_load *c, const tcp_view *v, int64_t base, int nd, const int64_t *dim,
	int64_t e, bool write);
/* The slices holding bytes [lo, hi] of DM tensor t in its first copy: the
 * first and a count, modulo the P slices of one copy (tcp_slice_has). */
void tcp_meter_slices(const tcp_meter *mt, int32_t t, int64_t lo, int64_t hi, int64_t *first, int64_t *n, int64_t *P);
/* A command's DM sides: destination elements [dlo, dhi] of d, source
 * elements [slo, shi] of sv, `moved` bytes (times the destination's copies
 * when it is in DM), then its engines (tcp_dma_engines). */
void tcp_meter_dm_sides(tcp_meter *mt, tcp_dma_load *c, const tcp_view *d, int64_t dlo, int64_t dhi, const tcp_view *sv,
	int64_t slo, int64_t shi, int64_t moved);

/* A fetch or commit sequencer's bytes per cycle for view v over dims
 * (elements of e bytes): min(max_fetch_bytes, the largest power of two
 * dividing the contiguous run in bytes); *elems is how many elements it
 * reads (a stride-0 innermost loop re-reads one element per row, fetched
 * once). */
int64_t tcp_meter_read_size(const moe_tcp_machine *m, const tcp_view *v, int nd, const int64_t *dim, int64_t e,
	int64_t *elems);

/* The values a block loop's staging writes, as a predictor stands them in
 * for a run's: element base + k x stride of tensor t is v[k] (k < n); v
 * NULL: the one value `scalar` at base. */
typedef struct tcp_staged {
	int32_t t;
	int64_t base, stride, n;
	const int32_t *v;
	int32_t scalar;
} tcp_staged;
/* Whether element el of tensor t is one of the nd descriptors' values (*w). */
bool tcp_staged_find(const tcp_staged *d, int nd, int32_t t, int64_t el, int32_t *w);
/* The descriptor of a block loop staging's block count, view v of tensor t
 * from element base: one element, nb; or, where the view walks elements
 * (a stride), three: nb, the loads' runs (the number of distinct experts
 * among block experts ve[0..nb) in block order) and the first expert index
 * that no block names, counted up the distinct experts from 0 (the runs
 * where they are 0, 1, ... runs - 1; rewrite spec-group's pass computes it
 * from the per-expert block counts, docs/tcp-isa.md 7.4). The values are
 * kept in nbr, which must outlive the descriptor. */
tcp_staged tcp_staged_counts(int32_t t, int64_t base, const tcp_view *v, int64_t nb, const int32_t *ve, int32_t nbr[3]);

/* ---- the switch ---- */
/* Cycles to route `bytes` per slice over a ring of `used` slices: one flit
 * per cycle into each slice; *ring the ring's latency (at most
 * switch.max_ring_size), paid once. */
int64_t tcp_cost_route(const tcp_cm *cm, int64_t bytes, int64_t used, int64_t *ring);

/* ---- Tensor Unit passes ---- */
/* A tu.vec pass. */
typedef struct tcp_vec_load {
	int64_t pe;          /* elements (row ops: rows x L) of the busiest slice */
	bool fl;             /* on the float ALUs */
	int nstep;           /* ALU steps in the chain */
	int64_t fetch;       /* fetch cycles: each DM stream at its read size, summed */
	int64_t streams;     /* DM streams read */
	int64_t commit;      /* commit cycles of the results at their write size */
	int64_t route_bytes; /* bytes per slice over the switch (flags=switch), and the */
	int64_t route_used;  /* slices of the ring */
	bool xslice;         /* the reduction crosses slices */
} tcp_vec_load;
tcp_cost tcp_cost_vec(const tcp_cm *cm, const tcp_vec_load *l);

/* A tu.contract pass: `rows` rows per slice against `tile` output rows of
 * each column group, reduction length I, in `tiles` rounds over the column
 * groups. */
typedef struct tcp_mm_load {
	int64_t rows, tile, I, tiles;
	int mt;              /* TCP_MT_*: the MAC rate and tree latency */
	bool x3;             /* f32: three bf16 products */
	int64_t a_bytes;     /* bytes per streamed element */
	int64_t out_bytes;   /* bytes committed per output element (accumulator and scales included) */
	int64_t route_bytes; /* bytes per slice over the switch per round, and the */
	int64_t route_used;  /* slices of the ring */
	bool rowdiv;         /* flags=rowdiv: one f32 division per output on the vector stage behind the engine */
} tcp_mm_load;
tcp_cost tcp_cost_contract(const tcp_cm *cm, const tcp_mm_load *l);

/* A sub-context load of fp bytes per slice of which `own` are in the slice's
 * own DM (sub.ldtrf / sub.ldvrf): the load and the fill/drain. */
int64_t tcp_cost_sub(const tcp_cm *cm, int64_t fp, int64_t own);

/* The block grid's slots the loads l fill (block b's first min(rows[b], B)
 * of its B slots, b * B + r), ascending into out (NULL: only counted);
 * returns their count. The rule both predicted timelines (sim/predict.c,
 * compiler/sched_time.c) name a dispatch list's rows by, given loads. */
int64_t tcp_loads_slots(const moe_tcp_loads *l, int64_t B, int64_t *out);

#endif
