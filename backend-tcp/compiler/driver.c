/* backend-tcp/compiler/driver.c: the schedule compiler's driver: sched-build,
 * the verifier, placement (dmplan.c) on the build order, the op costs
 * (sched_time.c), the list scheduler (schedule.c) unless the environment sets
 * MOEC_TCP_SCHEDULE=0, the verifier again, then instruction selection. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/isel.h"
#include "backend-tcp/compiler/sched_build.h"
#include "backend-tcp/compiler/sched_time.h"
#include "backend-tcp/compiler/schedule.h"
#include "moec/io.h"

/* MOEC_TCP_SCHEDULE=0 (or "off") keeps the build order, for comparison */
static bool scheduling(void)
{
	const char *v = getenv("MOEC_TCP_SCHEDULE");
	return !v || (strcmp(v, "0") && strcmp(v, "off"));
}

/* the verified schedule of g, or NULL with a diagnostic */
static tcp_sched *built(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	tcp_sched *s = tcp_sched_build(ctx, g, m);
	if (s && tcp_sched_verify(s) != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "tcp: the schedule built for this layer does not verify (a moec bug)");
		tcp_sched_free(s);
		return NULL;
	}
	if (s && (tcp_dm_place(s) != MOE_OK || tcp_sched_cost(ctx, s) != MOE_OK)) {
		tcp_sched_free(s);
		return NULL;
	}
	if (s && scheduling() && (tcp_sched_schedule(ctx, s) != MOE_OK || tcp_sched_verify(s) != MOE_OK)) {
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "tcp: the scheduled schedule does not verify (a moec bug)");
		tcp_sched_free(s);
		return NULL;
	}
	return s;
}

tcp_program *tcp_compile_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	tcp_sched *s = built(ctx, g, m);
	if (!s)
		return NULL;
	tcp_program *p = tcp_sched_isel(ctx, s);
	tcp_sched_free(s);
	return p;
}

static moe_status emit_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const char *path)
{
	tcp_sched *s = built(ctx, g, m);
	if (!s)
		return MOE_ERR_INVALID;
	char *text = NULL;
	size_t len = 0;
	moe_status st = tcp_sched_print(s, &text, &len);
	tcp_sched_free(s);
	if (st == MOE_OK)
		st = moe_write_output(ctx, path, 0, text, len);
	if (text)
		ctx_free(ctx, text, len + 1);
	return st;
}

/* machine NULL: the built-in one, as moe_tcp_compile takes it */
static tcp_program *compile_default(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	moe_tcp_machine *def = m ? NULL : moe_tcp_machine_default(ctx);
	if (!m && !def)
		return NULL;
	tcp_program *p = tcp_compile_sched(ctx, g, m ? m : def);
	moe_tcp_machine_free(ctx, def);
	return p;
}

static moe_status emit_default(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const char *path)
{
	moe_tcp_machine *def = m ? NULL : moe_tcp_machine_default(ctx);
	if (!m && !def)
		return MOE_ERR_INVALID;
	moe_status st = emit_sched(ctx, g, m ? m : def, path);
	moe_tcp_machine_free(ctx, def);
	return st;
}

moe_tcp_program *moe_tcp_compile_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine)
{
	CTX_GUARDED(ctx, tcp_program *, NULL, compile_default(ctx, g, machine));
}

moe_status moe_tcp_emit_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine, const char *path)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, emit_default(ctx, g, machine, path));
}
