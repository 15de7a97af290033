/* backend-tcp/compiler/sched_time_int.h: what the schedule's timeline
 * (sched_time.c: the start rule, the walk of the regions) and the pricing of
 * its commands (sched_price.c: the cost rules' loads measured from the
 * buffers, the staged loads, the kept costs) share: the state of one run of
 * the timeline. Only those two files include it. */
#ifndef MOEC_TCP_SCHED_TIME_INT_H
#define MOEC_TCP_SCHED_TIME_INT_H

#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/isa/cost.h"


enum { TS_MAX_UNITS = 64 }; /* units of one two-slot buffer the timeline tells apart */

typedef struct tl {
	moe_ctx *ctx;
	ts_cost_cache *memo;
	const tcp_sched *s;
	const moe_tcp_machine *m;
	tcp_cm cm;
	tcp_program *p; /* the buffers as a tensor table (tensor i is buffer i) */
	int64_t S;
	int64_t tc, cfree[TCP_NCTX];
	int64_t cprev[TCP_NCTX]; /* cfree when the current block began */
	int64_t *val, *staged, *start, *end, *cost;
	int64_t *prev;     /* per op: its end in the block before its last one */
	int64_t *blk;      /* per op: the block of its last execution */
	int64_t block;     /* blocks begun so far (every loop) */
	uint8_t *route;
	uint32_t *dmn;
	tcp_meter mt;
	const moe_tcp_loads *given;
	const int32_t *gen_e, *gen_r;
	int64_t gen_nb, nblocks;
	int64_t sgen; /* stagings seen, in a run's own cost table's keys */
	bool own_memo;
	uint32_t *mlast; /* per op: the slot + 1 its last run in this prediction found */
	/* per op: the region whose items hold it and its index there (oreg
	 * TS_NONE: not known), its dependencies as the walk reads them
	 * (dfirst UINT32_MAX: not listed yet; dep_list) */
	ts_id *oreg;
	uint32_t *oidx, *dfirst, *dn;
	uint8_t *rloop; /* per region: a loop lies in it (its passes may span blocks) */
	/* per (region, context, distance): dep_list's group of that key in
	 * the list being built (gidx), valid where gstamp is the list's stamp */
	uint32_t *gidx, *gstamp, stamp;
	uint8_t *octx;  /* per op: its context */
	/* per op: the two-slot buffer one of its views reads or writes inside
	 * one slot (TS_NONE: none, or more than one such view), that view, and
	 * the end of its latest run in each unit of that buffer (uel[b]
	 * elements: a slot, or a group's entry; sched_time.c units), as of now
	 * (send) and as of the block before its last run's (sprev): nunit[op]
	 * entries from uofs[op] */
	ts_id *sbuf;
	uint8_t *sview, *nunit;
	uint32_t *uofs;
	int64_t *send, *sprev, *uel;
	ts_id *dl;
	uint8_t *dd;
	size_t dlen, dcap;
	tcp_staged d[3];
	int nd;
	int32_t nbr[3]; /* the block count's descriptor's values (tcp_staged_counts) */
	int32_t bexp;
	int64_t approx_ld, approx_idx;
	int64_t *slots, nslots; /* the grid slots the caller's loads fill (slot_row) */
	bool slots_done;
	uint8_t *entered; /* per region, set to 1 when the walk enters it (NULL: not kept) */
	bool zero; /* measuring with every scalar 0 */
	bool fail;
} tl;

/* The buffers as tensor records (tensor i is buffer i), for the cost rules
 * and the meter, which read places and sizes, never names. */
tcp_program *ts_tensors(moe_ctx *ctx, const tcp_sched *s);

/* op id's busy time on its context, issue excluded, measured from the
 * current scalar values (every scalar 0 where t->zero); *holds: it holds the
 * main context while it runs */
int64_t ts_op_cycles(tl *t, ts_id id, bool *holds);
/* ts_op_cycles through t's cost cache (t->memo) when there is one */
int64_t ts_op_cost(tl *t, ts_id id, bool *holds);

/* A dma.spm staging the block loop's experts writes the loads (the
 * caller's, else the expected ones); sets t->fail with a diagnostic when
 * they do not fit the schedule. */
void ts_stage(tl *t, const tcp_insn *in);

#endif
