/* backend-tcp/compiler/dmplan.h: the DM planner (docs/tcp-compiler.md 5.3),
 * the only code that knows the on-chip spaces' sizes: the placement of what
 * is not placed, and the block loop's weights mode; no features, no reuse
 * edges. */
#ifndef MOEC_TCP_DMPLAN_H
#define MOEC_TCP_DMPLAN_H

#include "backend-tcp/compiler/sched.h"

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

/* What a block loop's expert weights need (sched-build fills it while it
 * builds the loop with double-buffered weights). */
#define TS_MAX_WEIGHTS 16
typedef struct ts_wdemand {
	ts_id buf[TS_MAX_WEIGHTS];   /* the expert weight buffers as built: two slots each */
	bool stream[TS_MAX_WEIGHTS]; /* read only as a contraction's stationary operand */
	uint32_t n;
	int64_t tile_bytes;          /* the largest weight tile a streamed contraction loads */
} ts_wdemand;

/* The weights mode of the schedule's block loop (docs/tcp-compiler.md 5.3
 * step 1), in a fixed order of preference: double-buffered whole experts
 * (as built), else single-buffered, else streamed through a ring of four
 * tiles, else of two; the first whose buffers all fit beside every other
 * buffer of s (placed as tcp_dm_place would, without diagnostics) wins;
 * when none fits, streaming with a ring of two (the placement then reports
 * the overflow). s is left as it was. *ring: 4 or 2 when streamed, else 0. */
int tcp_dm_weights(tcp_sched *s, const ts_wdemand *d, uint8_t *ring);

#endif
