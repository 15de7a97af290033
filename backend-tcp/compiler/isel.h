/* backend-tcp/compiler/isel.h: a schedule's program (docs/tcp-compiler.md
 * 5.5): placement of what is not placed, registers for scalars, branches for
 * regions, views renamed to tensors and registers, phases, halt, validation. */
#ifndef MOEC_TCP_ISEL_H
#define MOEC_TCP_ISEL_H

#include "backend-tcp/compiler/sched.h"

/* The program of schedule s: every buffer not yet placed gets an offset (dmplan.c's first
 * placement), scalars get registers, regions become branches, each op's views are renamed to
 * tensor/register numbers, each insn's phase is the op's, halt is appended, and the program is
 * validated (tcp_validate) against s->m. NULL with a diagnostic on failure (a DM overflow names
 * the largest buffers live at the peak). s is not modified except the buffers' offsets. */
tcp_program *tcp_sched_isel(moe_ctx *ctx, tcp_sched *s);

#endif
