/* backend-tcp/compiler/sched_time.h: the schedule's timeline (docs/tcp-compiler.md
 * 6.3): each op's predicted start and end on its context, by the issue rules of
 * docs/tcp-isa.md section 2 (the control processor issues in program order, a
 * command starts when it is issued, its context is free and its dependencies
 * have finished) and isa/cost.h's price of each command, measured from the
 * schedule's buffers as the simulator measures it from a run. */
#ifndef MOEC_TCP_SCHED_TIME_H
#define MOEC_TCP_SCHED_TIME_H

#include "backend-tcp/compiler/sched.h"

typedef struct ts_timeline {
	int64_t cycles;           /* launch to end, as the simulator counts a run */
	int64_t nblocks;          /* the block count predicted with */
	int64_t *start, *end;     /* [nop]: each op's last predicted start and end; -1: never issued */
	int64_t *cost;            /* [nop]: its context's busy time at its first issue (issue included) */
	int64_t approx_ld, approx_idx; /* reads no load gives (as moe_tcp_predict counts them) */
} ts_timeline;

/* The predicted cycles of schedule s (its buffers placed: tcp_dm_place) run
 * from launch to end: the regions walked in program order with their scalars
 * evaluated, the block loop's staging writing `loads` (NULL: the expected
 * loads moe_tcp_predict generates: T tokens each picking K distinct experts
 * by its fixed seeded generator, blocks in expert order), guards and
 * row-class cases taken by those values, the loop costed block by block.
 * Approximated as moe_tcp_predict does: an ld of anything but the staged
 * loads reads 0; a gather's or scatter's index list names evenly spread
 * distinct rows. out may be NULL; its arrays are ctx_alloc'd
 * (ts_timeline_free). -1 with a diagnostic on failure. */
int64_t tcp_sched_predict(moe_ctx *ctx, const tcp_sched *s, const moe_tcp_loads *loads, ts_timeline *out);
void ts_timeline_free(moe_ctx *ctx, const tcp_sched *s, ts_timeline *t);

/* Sets every op's `cost` to its first issue's busy time on the expected
 * loads (an op never issued there: measured with every scalar 0). */
moe_status tcp_sched_cost(moe_ctx *ctx, tcp_sched *s);

/* Predictions of one schedule on its expected loads, many times over (the
 * scheduler's): a command's measured cost is kept per op and per value of
 * the scalars it reads, which the order of the items does not change (the
 * placement stays). The cache belongs to schedule s as it is placed. */
typedef struct ts_cost_cache ts_cost_cache;
ts_cost_cache *ts_cost_cache_new(moe_ctx *ctx);
void ts_cost_cache_free(moe_ctx *ctx, ts_cost_cache *c);
/* entered (NULL, or nrg + 1 bytes): 1 for each region the walk entered, 0
 * for the others. The prediction reads nothing of a region it does not
 * enter (its ops never run, so their ends read as never run), so it is the
 * same for every order of such a region's items. */
int64_t tcp_sched_predict_cached(moe_ctx *ctx, const tcp_sched *s, ts_cost_cache *c, uint8_t *entered);
/* tcp_sched_cost through the cache; the prediction's cycles, -1 on failure. */
int64_t tcp_sched_cost_cached(moe_ctx *ctx, tcp_sched *s, ts_cost_cache *c, uint8_t *entered);

#endif
