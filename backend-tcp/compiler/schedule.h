/* backend-tcp/compiler/schedule.h: the list scheduler (docs/tcp-compiler.md
 * 5.4): it chooses the program order of each region's items. */
#ifndef MOEC_TCP_SCHEDULE_H
#define MOEC_TCP_SCHEDULE_H

#include "backend-tcp/compiler/sched.h"

/* Reorders every region's items, innermost regions first: a ready list over
 * the region's items (ops, scalar definitions, child regions as one macro
 * item each), picking the ready item whose predicted start on the region's
 * timeline is earliest, ties by the bottom level (the cost-weighted longest
 * path to the region's end), then by the original position. An item is ready
 * once every item it must follow is placed: its distance-0 dependencies, the
 * definitions of the scalars it reads, the staging of a buffer an `ld` reads,
 * and, for two buffers placed on shared bytes, every earlier access of the
 * other one (the planner's reuse order). Needs placed buffers (tcp_dm_place);
 * sets every op's cost (tcp_sched_cost). Among the list orders (and moves of
 * an op before its context's previous op) a region keeps one only when the
 * whole schedule's timeline prediction (expected loads) drops. A span
 * buffer's first and last op are renewed for the new order. Values are
 * unchanged: no dependency is broken. */
moe_status tcp_sched_schedule(moe_ctx *ctx, tcp_sched *s);

/* The schedule compiler's schedule of g (driver.c) before isel: built,
 * verified, its roofline dims set and, with `schedule`, placed,
 * list-scheduled (which costs the ops) and verified again. NULL with a
 * diagnostic. */
tcp_sched *tcp_sched_compiled(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, bool schedule);

#endif
