/* frontend/cli/cli.h: shared state of the moec command's subcommands. */
#ifndef MOEC_CLI_H
#define MOEC_CLI_H

#include "moec/moec.h"

#define MAX_SETS 256

typedef struct opts {
	const char *cmd;
	const char *file;
	const char *out;      /* -o */
	const char *pipeline; /* --pipeline */
	const char *after, *before;
	const char *reproducer; /* --reproducer */
	const char *format;   /* text, json, dot */
	int json;             /* stats --json */
	const char *weights, *input, *target, *engine, *stats, *trace, *machine, *repeat;
	const char *layer, *tokens, *block; /* import-hf */
	int list, markdown, ignore_quantization; /* import-hf --list, --markdown, --ignore-quantization */
	int no_skip;
	int timing_only; /* run --timing-only */
	const char *threads, *kernels; /* run --threads N, --kernels=auto|portable (host) */
	int no_cache;                  /* run --no-cache (host JIT cache) */
	moe_setting sets[MAX_SETS];
	char setnames[MAX_SETS][128];
	size_t nsets;
} opts;

#define CLI_MAX_PATHS 64               /* --weights and --input items */
#define CLI_MAX_SOURCE ((size_t)256 << 20) /* a .moe, .moeir or IR .json */

int cli_fail(const char *fmt, const char *arg);
/* Before any input is read: outputs that are inputs or each other, and path
 * lists longer than CLI_MAX_PATHS, are errors (1). */
int cli_guard_paths(moe_ctx *ctx, const opts *o);
int cli_ends_with(const char *s, const char *suf);
moe_module *cli_load(moe_ctx *ctx, const opts *o);
/* Binds the graph's inputs from --input (x.npy, or NAME=x.npy,...); checks shapes. */
int cli_bind_inputs(moe_ctx *ctx, const moe_graph *g, const char *spec, moe_tensor_map *bind);
/* Binds the weights from the checkpoint files; with --timing-only, absent ones
 * are bound without values (MOE_WEIGHTS_ALLOW_ABSENT) and counted on stderr. */
int cli_load_weights(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t np, const opts *o,
	moe_tensor_map *bind);

int cli_passes(moe_ctx *ctx);
int cli_import_hf(moe_ctx *ctx, const opts *o);
int cli_run(moe_ctx *ctx, const opts *o);
int cli_compile(moe_ctx *ctx, const opts *o);

/* TCP target (frontend/cli/tcp.c). */
moe_module *cli_load_tcp(moe_ctx *ctx, const opts *o, int64_t *chosen, double *pred);
int cli_compile_tcp(moe_ctx *ctx, const moe_graph *g, const opts *o);
int cli_run_tcp(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const opts *o, int repeat,
	moe_tensor **out, char **stats_json);
int cli_run_tcpb(moe_ctx *ctx, const opts *o, int repeat);
int cli_check_tcpb(moe_ctx *ctx, const opts *o);

#endif
