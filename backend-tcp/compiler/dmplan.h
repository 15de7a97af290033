/* backend-tcp/compiler/dmplan.h: the DM planner (docs/tcp-compiler.md 5.3),
 * the only code that knows the on-chip spaces' sizes. First version: a
 * placement of what is not placed, without features and without retry. */
#ifndef MOEC_TCP_DMPLAN_H
#define MOEC_TCP_DMPLAN_H

#include "backend-tcp/compiler/sched.h"

/* Gives every unplaced buffer (offset -1) an offset. DM/TRF/VRF: first fit
 * over lifetimes measured in program order (PROGRAM: the whole program; SPAN:
 * its first..last op; LOOP/BLOCK: the loop's extent): loop and block buffers
 * from the top of the space down, the others from offset 0 up, every offset
 * a multiple of dm_align (DM) or 64 bytes. A buffer's footprint is its
 * layout's slice_bytes (every slot). HBM scratch: bump-allocated after the
 * highest placed HBM byte, 256-byte aligned. Buffers already placed keep
 * their offsets and are avoided. MOE_OK, or MOE_ERR_INVALID with a
 * diagnostic when a space overflows (naming the largest buffers live at
 * the peak); needs s->m. */
moe_status tcp_dm_place(tcp_sched *s);

#endif
