/* frontend/cli/tcp.c: the TCP target of moec compile and moec run. */
#include <stdlib.h>
#include <string.h>

#include <stdbool.h>

#include "frontend/cli/cli.h"

static moe_tcp_machine *machine(moe_ctx *ctx, const opts *o)
{
	return o->machine ? moe_tcp_machine_load(ctx, o->machine) : moe_tcp_machine_default(ctx);
}

int cli_compile_tcp(moe_ctx *ctx, const moe_graph *g, const opts *o)
{
	bool text = cli_ends_with(o->out, ".tcps"), bin = cli_ends_with(o->out, ".tcpb");
	if (!text && !bin) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->out),
			"--target=tcp writes assembly (.tcps) or a binary (.tcpb); name the output so");
		return 1;
	}
	moe_tcp_machine *m = machine(ctx, o);
	if (!m)
		return 1;
	moe_tcp_program *p = moe_tcp_compile(ctx, g, m);
	int status = !p || (text ? moe_tcp_write_asm(ctx, p, o->out) : moe_tcp_write_binary(ctx, p, o->out)) != MOE_OK;
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, m);
	return status;
}

static int run_program(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m, const moe_tensor_map *bind,
	const opts *o, moe_tensor **out, char **stats_json)
{
	moe_tcp_run_opts ro = {.machine = m, .no_skip = o->no_skip, .trace_path = o->trace};
	moe_tcp_stats st;
	if (moe_tcp_run(ctx, p, bind, &ro, out, &st) != MOE_OK)
		return 1;
	*stats_json = moe_tcp_stats_json(ctx, &st);
	return 0;
}

int cli_run_tcp(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const opts *o, int repeat,
	moe_tensor **out, char **stats_json)
{
	(void)repeat; /* the simulator is deterministic: one run gives the time */
	moe_tcp_machine *m = machine(ctx, o);
	if (!m)
		return 1;
	moe_tcp_program *p = moe_tcp_compile(ctx, g, m);
	int status = !p || run_program(ctx, p, m, bind, o, out, stats_json);
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, m);
	return status;
}

int cli_run_tcpb(moe_ctx *ctx, const opts *o, int repeat)
{
	(void)repeat;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "running .tcpb binaries is not available yet");
	return 1;
}
