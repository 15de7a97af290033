/* backend-tcp/compiler/dmplan.h: the DM planner (docs/tcp-compiler.md 5.3),
 * the only code that knows the on-chip spaces' sizes: the placement of what
 * is not placed, the block loop's weights mode and the residence (DM or HBM)
 * of spillable buffers, and the reuse edges (reuse.c); no features. */
#ifndef MOEC_TCP_DMPLAN_H
#define MOEC_TCP_DMPLAN_H

#include "backend-tcp/compiler/sched.h"
#include "backend-tcp/isa/cost.h"

/* Gives every unplaced buffer (offset -1) an offset. DM/TRF/VRF: first fit
 * over lifetimes measured in program order (PROGRAM: the whole program; SPAN:
 * its first..last op; LOOP/BLOCK: the loop's extent): loop and block buffers
 * from the top of the space down, then PROGRAM ones, then the others, from
 * offset 0 up (each pass in buffer order), every offset
 * a multiple of dm_align (DM) or 64 bytes. A buffer's footprint is its
 * layout's slice_bytes (every slot). HBM scratch: bump-allocated after the
 * highest placed HBM byte, 256-byte aligned. Buffers already placed keep
 * their offsets and are avoided. MOE_OK, or MOE_ERR_INVALID with a
 * diagnostic when a space overflows (naming the largest buffers live at
 * the peak); needs s->m. */
moe_status tcp_dm_place(tcp_sched *s);

/* Reuse edges (reuse.c, docs/tcp-compiler.md 5.3 item 4): for every two
 * placed DM/TRF/VRF buffers whose bytes and slices overlap, their accesses
 * in program order form runs of one buffer; each run's first access and
 * first write per context depend on the previous run's last access on every
 * other context (distance 1 from the last run to the first when both
 * buffers live inside one loop body). Existing dependencies are kept;
 * tcp_dm_place runs it when s->reuse is TS_REUSE_ORDERED. */
void ts_reuse_edges(tcp_sched *s);

/* A spillable buffer: one that sched-build can keep in HBM instead of DM.
 * Two kinds: a gather read only by scatters (prod TS_NONE), which then
 * moves chunk by chunk through DM staging buffers (footprint `stage`); and
 * a value with a gap between its producer and its next reader (prod: the
 * producer's last op), which is then copied to HBM after prod and back into
 * DM before its next reader (its DM bytes free in between). */
#define TS_MAX_SPILLS 32
typedef struct ts_spill {
	ts_id buf;        /* the buffer as built (in DM) */
	moe_id node;      /* the graph node whose value it holds (the top graph's) */
	ts_id prod;       /* a value spill: its producer's last op; TS_NONE: a staged gather */
	int64_t stage;    /* a staged gather: its DM footprint per slice when in HBM */
	int64_t extra;    /* the HBM bytes its HBM residence adds (the round trip) */
} ts_spill;

/* What a block loop's expert weights and the spillable buffers need
 * (sched-build fills it while it builds the layer with double-buffered
 * weights and every spillable buffer in DM). */
#define TS_MAX_WEIGHTS 16
typedef struct ts_wdemand {
	ts_id buf[TS_MAX_WEIGHTS];   /* the expert weight buffers as built: two slots each */
	bool stream[TS_MAX_WEIGHTS]; /* read only as a contraction's stationary operand */
	uint32_t n;
	int64_t tile_bytes;          /* the largest weight tile a streamed contraction loads */
	ts_spill spill[TS_MAX_SPILLS];
	uint32_t nspill;
} ts_wdemand;

/* One plan of the loop's weights and the spills' residence; tcp_dm_plans
 * lists at most TS_MAX_PLANS. */
enum { TS_MAX_PLANS = 8 };
typedef struct ts_wplan {
	uint8_t mode, ring;          /* TS_W_*; TS_MAX_RING, 4 or 2 when streamed, else 0 */
	bool hbm[TS_MAX_SPILLS];     /* per d->spill: kept in HBM */
} ts_wplan;

/* The plans whose buffers all fit beside every other buffer of s (placed as
 * tcp_dm_place would, without diagnostics), at most three: the first of
 * double, single; stream with a ring of TS_MAX_RING and with a ring of
 * four, else of two (docs/tcp-compiler.md 5.3 step 1), to be priced
 * against each other; in
 * each, the spills are placed in DM in order of predicted benefit (the
 * cycles their HBM round trip would cost at the machine's HBM rate; ties
 * by build order) while they fit, the rest kept in HBM. Returns how many
 * (at most 3) are in out; 0 when none fits: out[0] is then the last resort
 * (every spill in HBM, streamed with a ring of two when anything streams,
 * else single), whose placement reports the overflow. s is left as it was. */
uint32_t tcp_dm_plans(tcp_sched *s, const ts_wdemand *d, ts_wplan out[TS_MAX_PLANS]);

/* Whether tcp_dm_place would place s (quietly; s's offsets are left as
 * they were). */
bool tcp_dm_placeable(tcp_sched *s);

/* The predicted cycles (tcp_sched_predict on the expected loads) of s placed
 * by tcp_dm_place, quietly; s's offsets are left as they were. -1 when it
 * does not fit or cannot be predicted. */
int64_t tcp_dm_price(tcp_sched *s);
/* tcp_dm_price on each of n loads (NULL: the expected ones), placed once:
 * cycles[k] for loads[k]; returns cycles[0], -1 when s does not fit. */
int64_t tcp_dm_price_loads(tcp_sched *s, const moe_tcp_loads *const *loads, int n, int64_t *cycles);

/* A summary of a block loop's DM demand, for a graph pass that asks whether
 * a rewrite still fits (docs/tcp-compiler.md section 3, rule 3) without
 * building the layer: the loop's buffers (bytes of one slot, slots), each
 * spread over every slice as sched-build spreads a DM buffer, and the bytes
 * per slice of the widest span buffer live beside them (0: none). */
#define TS_MAX_DEMAND 64
typedef struct ts_demand {
	int64_t bytes[TS_MAX_DEMAND];
	uint8_t slots[TS_MAX_DEMAND];
	uint32_t n;
	int64_t span;
} ts_demand;

/* Whether d's loop buffers, placed together from the top of DM down (they
 * are all live across the loop), and then its span from offset 0 up, fit
 * m's DM: the placement's rule (every footprint whole flits and dm_align)
 * on the summary. A summary of more than TS_MAX_DEMAND buffers fits not. */
bool tcp_dm_fits(const moe_tcp_machine *m, const ts_demand *d);

/* Grants to graph passes (docs/tcp-compiler.md 5.3, "Grants to graph
 * passes"). A graph pass that decides before any layer is built, where it
 * cannot summarise the loop as a ts_demand (a flattened graph, or a value
 * beside the loop such as a W8A8 layer's dispatched rows),
 * asks how many bytes of DM (every slice together) one decision may take.
 * The planner's reservation: the loop's mandatory buffers first, its
 * experts double-buffered whole in a share of DM (TCP_DM_EXPERTS); what
 * remains is shared by the values live beside the loop, each granted an
 * equal part (TCP_DM_VALUE); TCP_DM_LAYER: the whole of DM (values that must
 * fit with nothing of the loop live). Derived from machine.json's
 * dm_bytes_per_slice, clusters and slices_per_cluster alone. */
typedef enum tcp_dm_ask {
	TCP_DM_LAYER,
	TCP_DM_EXPERTS,
	TCP_DM_VALUE,
	/* block=auto's questions before the layer is built (auto_block.c):
	 * TCP_DM_BLOCK, the buffers of one block of at most 256 rows (its token
	 * rows in and out, double-buffered, and its projections' f32 values):
	 * the share beside the experts; TCP_DM_WIDE_BLOCK, those of a larger
	 * block, which shares that room with the layer's pair-order results:
	 * two values' grants; TCP_DM_ROOMY, the double-buffered experts, a
	 * block's buffers and the T K result rows in pair order together,
	 * leaving the layer's other two values theirs */
	TCP_DM_BLOCK,
	TCP_DM_WIDE_BLOCK,
	TCP_DM_ROOMY,
	/* the f32 partial sums of a contraction reduced in parts (recipe_qact.c)
	 * held at once: a third of DM */
	TCP_DM_PARTIALS,
	/* the rows one combine chunk gathers (tcp-combine-chunk, ahead of
	 * blockwise-dispatch), live after the loop: the share beside the
	 * experts */
	TCP_DM_COMBINE,
} tcp_dm_ask;
int64_t tcp_dm_grant(const moe_tcp_machine *m, tcp_dm_ask ask);
/* The bytes per slice of space sp (TCP_DM, TCP_TRF, TCP_VRF) on m. */
int64_t tcp_space_bytes(const moe_tcp_machine *m, int sp);

/* The DM side of a DMA command whose DM buffer is spread over every slice
 * (as sched-build spreads a DM buffer): every DMN, each DMN pair and both
 * ends' clusters, as isa/meter.c counts them, set in c. */
void tcp_dm_spread_side(const moe_tcp_machine *m, tcp_dma_load *c);

#endif
