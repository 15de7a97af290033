/* backend-tcp/compiler/rw/list_schedule.c: rewrite `list-schedule`
 * (rewrites.def): the list scheduler (schedule.c, docs/tcp-compiler.md 5.4)
 * as a peephole row. It needs placed buffers (the driver places before the
 * peephole rows) and keeps a region's new order only when the whole
 * schedule's prediction drops, so its benefit is its own (ts_benefit_self). */
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/schedule.h"

bool ts_rw_list_schedule_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	for (ts_id i = 0; i < s->nbuf; i++)
		if (s->buf[i].offset < 0)
			return false;
	return s->nop > 0;
}

moe_status ts_rw_list_schedule_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature;
	return tcp_sched_schedule(e->ctx, s);
}
