/* frontend/cli/tcp.c: the TCP target of moec compile and moec run. */
#include "frontend/cli/cli.h"

int cli_compile_tcp(moe_ctx *ctx, const moe_graph *g, const opts *o)
{
	(void)g;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--target=tcp is not available yet (%s)", o->file);
	return 1;
}

int cli_run_tcp(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const opts *o, int repeat,
	moe_tensor **out, char **stats_json)
{
	(void)g, (void)bind, (void)repeat, (void)out, (void)stats_json;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--target=tcp is not available yet (%s)", o->file);
	return 1;
}

int cli_run_tcpb(moe_ctx *ctx, const opts *o, int repeat)
{
	(void)repeat;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "running .tcpb binaries is not available yet");
	return 1;
}
