/* backend-tcp/compiler/sched_build.h: sched-build (docs/tcp-compiler.md 5.1):
 * one walk of a graph that went through the `tcp-sched` pipeline (its block
 * loop kept) into a schedule: each node by the recipe of its family
 * (recipe_*.c), the block_loop as a ts_loop. Nothing optional is built. */
#ifndef MOEC_TCP_SCHED_BUILD_H
#define MOEC_TCP_SCHED_BUILD_H

#include "backend-tcp/compiler/sched.h"

/* The schedule of g for machine m (not NULL), unverified; NULL with an error
 * at the node that has no recipe ("the schedule compiler does not lower ...
 * yet"). Built with double-buffered loop weights and every spillable buffer
 * in DM; the DM planner's plans (tcp_dm_plans: weights mode, residences)
 * other than that are built too, and of two the faster on the timeline
 * (tcp_dm_price) is kept. Free it with tcp_sched_free. */
tcp_sched *tcp_sched_build(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);

/* The driver (driver.c): build, verify, and select instructions. NULL with a
 * diagnostic. */
tcp_program *tcp_compile_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
/* The public entries moe_tcp_compile_sched and moe_tcp_emit_sched are in
 * moec/tcp.h. */

#endif
