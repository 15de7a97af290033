/* moec/passes.h: the pass registry, text pipelines and the pass manager.
 *
 * A pipeline is text: `infer-shapes,lower-topk{mode=exact},blockwise-dispatch,
 * grid-bound,cse,dce`. Named pipelines (`tcp`, `host`) stand for such strings.
 * Passes run on every graph of a module; the verifier may run after each. */
#ifndef MOEC_PASSES_H
#define MOEC_PASSES_H

#include "moec/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of one pass instance: key=value strings in pipeline order. */
typedef struct moe_pass_opts {
	int count;
	const char *key[16];
	const char *value[16];
} moe_pass_opts;

/* Returns the value of key, or NULL. */
MOE_API const char *moe_pass_opt(const moe_pass_opts *o, const char *key);

typedef moe_status (*moe_pass_fn)(moe_ctx *ctx, moe_graph *g, const moe_pass_opts *opts, void *ud);

/* One option a pass accepts: its key, the kind of value, the default (as
 * text) and a line of help. A pipeline naming a key that is not one of the
 * pass's rows is rejected when it is parsed; the pass checks the value. */
typedef enum moe_pass_opt_kind {
	MOE_PASS_OPT_COUNT, /* a positive decimal integer */
	MOE_PASS_OPT_ENUM,  /* one of `values`, "a|b|c" */
	MOE_PASS_OPT_TEXT   /* any value token */
} moe_pass_opt_kind;
typedef struct moe_pass_option {
	const char *key;
	moe_pass_opt_kind kind;
	const char *values; /* MOE_PASS_OPT_ENUM: the accepted values, "a|b|c" */
	const char *def;    /* the default, as text (how it is chosen when it depends) */
	const char *help;
} moe_pass_option;

/* One registry row. The built-in passes declare their options as
 * moe_pass_option rows (moe_pass_options); an external pass lists its keys in
 * `options`, e.g. "mode=packed16|exact" (a key is accepted when it appears
 * there followed by '='), NULL when it takes none. */
typedef struct moe_pass_info {
	const char *name;
	const char *summary;
	const char *options;
	moe_pass_fn run;
	void *ud; /* handed to run: an external pass's own state */
} moe_pass_info;

/* The option rows of a built-in pass (ended by a row with a NULL key), or
 * NULL for a pass without rows. */
MOE_API const moe_pass_option *moe_pass_options(const moe_pass_info *p);

/* Built-in passes then passes registered on this context. */
MOE_API size_t moe_pass_count(moe_ctx *ctx);
MOE_API const moe_pass_info *moe_pass_get(moe_ctx *ctx, size_t i);
MOE_API const moe_pass_info *moe_pass_find(moe_ctx *ctx, const char *name);
/* Register an external pass on ctx (copied). Fails if the name is taken. */
MOE_API moe_status moe_pass_register(moe_ctx *ctx, const moe_pass_info *info);

/* Named pipelines. */
MOE_API const char *moe_pipeline_named(const char *name); /* NULL if not a name */

typedef struct moe_pipeline moe_pipeline;
/* Parse a pipeline string; NULL with a diagnostic (column of the error) if invalid. */
MOE_API moe_pipeline *moe_pipeline_parse(moe_ctx *ctx, const char *text);
MOE_API void moe_pipeline_free(moe_pipeline *p);
/* Canonical text; parse(print(p)) prints identically. Caller frees with moe_free. */
MOE_API char *moe_pipeline_print(const moe_pipeline *p);

typedef struct moe_run_opts {
	int verify;                /* run the verifier after every pass */
	const char *print_before;  /* pass name, "all", or NULL */
	const char *print_after;   /* pass name, "all", or NULL */
	FILE *print_to;            /* where IR dumps go (stderr if NULL) */
	const char *reproducer;    /* on failure write pipeline + input IR here (NULL: none) */
} moe_run_opts;

MOE_API moe_status moe_pipeline_run(moe_ctx *ctx, const moe_pipeline *p, moe_module *m, const moe_run_opts *opts);
/* Parse and run in one call. */
MOE_API moe_status moe_run_pipeline_text(moe_ctx *ctx, const char *text, moe_module *m, const moe_run_opts *opts);

/* ---- analyses ---- */
/* The grid and receive bounds below are exact for any int64_t arguments: 0
 * when an argument is <= 0, -1 when the bound exceeds INT64_MAX. */
/* The tight worst-case number of B-row blocks (docs/semantics.md section 5):
 * min(M + floor((n - M)/B), M*ceil(T/B)), n = T*K, M = min(E, n). */
MOE_API int64_t moe_grid_blocks_max(int64_t T, int64_t K, int64_t E, int64_t B);
/* Expert parallelism (docs/expert-parallel.md): the most rows a device
 * holding Ed of the experts can receive when T tokens pick K experts each,
 * T * min(K, Ed), and the tight block grid over them,
 * moe_grid_blocks_max(T, min(K, Ed), Ed, B). */
MOE_API int64_t moe_ep_recv_rows_max(int64_t T, int64_t K, int64_t Ed);
MOE_API int64_t moe_ep_grid_blocks_max(int64_t T, int64_t K, int64_t Ed, int64_t B);
/* An expert-parallel device program g cut at its all_to_all nodes into
 * phases (passes/ep_phases.c): moe_ep_phases writes each node's phase into
 * level[0 .. nnodes-1] (-1: depends on leaves alone, recomputed where used)
 * and returns the phase count; moe_ep_phase_graph builds phase k as a module
 * of one graph whose inputs "ep.<id>" are node <id>'s value (of an earlier
 * phase or an exchange) and whose outputs are what later phases, exchanges
 * and g's outputs read, ids[j] the node of output j (*nids of them; only the
 * first cap are made outputs: more than cap is the caller's error). Its nodes
 * that read no exchange result come first, then the others, each in g's
 * order. level may place a node later than moe_ep_phases does (no earlier
 * than its operands). */
MOE_API int moe_ep_phases(const moe_graph *g, int *level);
MOE_API moe_module *moe_ep_phase_graph(moe_ctx *ctx, const moe_graph *g, const int *level, int k, moe_id *ids,
	uint32_t cap, uint32_t *nids);
/* The seed design's (T*K - E)/B + E (its first term; n < E gives E). */
MOE_API int64_t moe_grid_blocks_seed(int64_t T, int64_t K, int64_t E, int64_t B);
/* vLLM moe_align_block_size: ceil(P / B), P = n + E*(B-1), P = min(n*B, P) if n < E. */
MOE_API int64_t moe_grid_blocks_vllm(int64_t T, int64_t K, int64_t E, int64_t B);

/* `moec stats`: one JSON object per module (malloc'd, free with moe_free):
 * dims, flops (multiply-adds x 2 actually needed: router and the K experts of
 * each token), flops_grid_max (what the lowered program computes with every
 * block of the worst-case grid full), weight_bytes, grid_blocks_max with the
 * seed and vLLM bounds and their block-buffer bytes, and `buffers`: the bytes
 * of every intermediate value of the layer lowered by `pipeline` (NULL: tcp
 * with its block loop flattened, tcp,flatten-blocks).
 * Several layers: the first layer's keys plus "layers": [...]. */
MOE_API char *moe_module_stats_json(moe_ctx *ctx, const moe_module *m, const char *pipeline);

#ifdef __cplusplus
}
#endif
#endif
