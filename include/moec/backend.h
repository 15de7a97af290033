/* moec/backend.h: the host backend: portable C, LLVM (object file, textual
 * IR, in-process JIT) and host execution of one layer.
 *
 * Every emitter lowers the graph once to one loop-level kernel form, so the C
 * and the LLVM code perform the same operations in the same order and give
 * bit-identical results. Graphs must have been through the host pipeline: the
 * backend rejects `topk` and `experts` with a diagnostic. The layer function's
 * ABI (argument order, name tables, workspace, fault codes) is in docs/abi.md. */
#ifndef MOEC_BACKEND_H
#define MOEC_BACKEND_H

#include "moec/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Portable C11 for one layer, to a stream or to a malloc'd string that the
 * caller frees with moe_free. */
MOE_API moe_status moe_emit_c(moe_ctx *ctx, const moe_graph *g, FILE *out);
MOE_API moe_status moe_emit_c_string(moe_ctx *ctx, const moe_graph *g, char **out);
/* Writes the C file to path through a temporary name and a rename. */
MOE_API moe_status moe_emit_c_file(moe_ctx *ctx, const moe_graph *g, const char *path);

/* LLVM for the host CPU (LLVMGetHostCPUName/Features), optimised with
 * "default<O3>": textual IR or an object file; both written to a temporary
 * name and renamed. */
MOE_API moe_status moe_emit_llvm_ir(moe_ctx *ctx, const moe_graph *g, const char *path);
MOE_API moe_status moe_emit_object(moe_ctx *ctx, const moe_graph *g, const char *path);

/* Bytes of workspace the layer function needs (liveness-planned). */
MOE_API moe_status moe_host_workspace_size(moe_ctx *ctx, const moe_graph *g, size_t *bytes);

typedef enum moe_host_engine {
	MOE_HOST_LLVM, /* LLVM ORC LLJIT in process */
	MOE_HOST_C     /* emit C, compile with $MOEC_CC (default cc) into a temp dir, dlopen */
} moe_host_engine;

typedef struct moe_host_stats {
	double compute_seconds; /* median over `repeat` calls of the layer function alone */
	double compile_seconds; /* lowering + code generation + loading */
	int repeat;             /* calls made */
	size_t workspace_bytes;
	/* Block statistics, over the distinct rank-1 `valid` masks of einsum nodes
	 * (the block masks written by blockwise-dispatch), read after the last
	 * call: a block g of mask v is executed iff v[g] > 0, else skipped. */
	int64_t blocks_executed;
	int64_t blocks_skipped;
	int64_t rows_executed;   /* sum over those masks of clamp(v[g], 0, rows per block) */
	int64_t grid_blocks_max; /* graph attribute grid_blocks_max, -1 when unset */
} moe_host_stats;

/* Runs layer g on the host. Inputs and weights are bound by node name from
 * bind (dtype and shape must match); out[0 .. moe_graph_num_outputs-1]
 * receive new tensors the caller frees. repeat >= 1 calls are timed; stats may
 * be NULL. A fault of the layer (index out of range, integer division by
 * zero) is a diagnostic and MOE_ERR_RUNTIME. */
MOE_API moe_status moe_host_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	moe_host_engine engine, int repeat, moe_tensor **out, moe_host_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
