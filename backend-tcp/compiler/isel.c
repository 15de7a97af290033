/* Instruction selection (isel.h): a schedule's program. */
#include "backend-tcp/compiler/isel.h"

tcp_program *tcp_sched_isel(moe_ctx *ctx, tcp_sched *s)
{
	(void)s;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp_sched_isel: not yet built");
	return NULL;
}
