/* The DM planner's first placement (dmplan.h). */
#include "backend-tcp/compiler/dmplan.h"

moe_status tcp_dm_place(tcp_sched *s)
{
	moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp_dm_place: not yet built");
	return MOE_ERR_UNSUPPORTED;
}
