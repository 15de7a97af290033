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

/* The host memory a run of g takes (g lowered by the host pipeline), predicted
 * from its lowering: the weights as bound, the inputs and outputs, the
 * workspace, and the packed copies of the bf16 weights the vdpbf16ps kernels
 * read (packable_bytes: on a CPU with AVX512-BF16; packed_bytes: those this run
 * makes, 0 with portable kernels, the C engine or another CPU). peak_bytes is
 * their sum; the process adds its code, the loaded checkpoint's index and
 * allocator slack. o may be NULL for the defaults. */
typedef struct moe_host_memory {
	size_t weight_bytes, io_bytes, workspace_bytes, packable_bytes, packed_bytes, peak_bytes;
} moe_host_memory;

typedef enum moe_host_engine {
	MOE_HOST_LLVM, /* LLVM ORC LLJIT in process */
	MOE_HOST_C     /* emit C, compile with $MOEC_CC (default cc) into a temp dir, dlopen */
} moe_host_engine;

/* Options of a host run; moe_host_opts_init fills the defaults. */
#define MOE_HOST_MAX_THREADS 1024
typedef struct moe_host_opts {
	moe_host_engine engine; /* default MOE_HOST_LLVM */
	int repeat;             /* calls timed, >= 1 (default 1) */
	int threads;            /* 0 (default): the cores this process may run on; else 1 ..
	                         * MOE_HOST_MAX_THREADS.
	                         * The result is bitwise the same for every count. Only the LLVM
	                         * engine runs parallel loops; the C engine runs on one thread. */
	int portable;           /* 1: portable kernels only, never the CPU's bf16 dot-product
	                         * instructions; then the LLVM engine equals the C engine bit
	                         * for bit. 0 (default): chosen from cpuid (docs/abi.md bounds
	                         * the difference). */
	int no_cache;           /* 1: neither read nor write the JIT cache */
	const char *cache_dir;  /* NULL (default): $XDG_CACHE_HOME/moec, else $HOME/.cache/moec */
	int cold;               /* 1: before every call, read MOE_HOST_COLD_BYTES of memory of
	                         * its own (not timed), evicting the layer's weights from the CPU's
	                         * caches: each call then reads them from memory, as a decode step
	                         * of a model whose other layers ran in between does */
	const char *weights_id; /* what identifies the bytes of the bound weights (moec run: each
	                         * checkpoint file's path, device, inode, size, modification time
	                         * and header digest), or NULL (default). Given, and with the cache
	                         * on (no_cache 0), the bf16 weights packed for the vdpbf16ps
	                         * kernels are kept in the cache (under cache_dir) and a later run
	                         * with the same id reads them instead of packing again
	                         * (docs/robustness.md, "The packed-weight cache") */
} moe_host_opts;

#define MOE_HOST_COLD_BYTES ((size_t)256 << 20)

MOE_API void moe_host_opts_init(moe_host_opts *o);
MOE_API moe_status moe_host_memory_plan(moe_ctx *ctx, const moe_graph *g, const moe_host_opts *o,
	moe_host_memory *m);

/* Where the compiled layer came from (moe_host_stats.cache). */
typedef enum moe_host_cache {
	MOE_CACHE_OFF,  /* not used: the C engine, no_cache, or no usable directory */
	MOE_CACHE_MISS, /* compiled, then stored */
	MOE_CACHE_HIT,  /* loaded from the cache */
	MOE_CACHE_BAD   /* an entry was there but failed verification: compiled and rewritten */
} moe_host_cache;

typedef struct moe_host_stats {
	double compute_seconds; /* median over `repeat` calls of the layer function alone */
	double compile_seconds; /* lowering + code generation (or the cache's object) + loading */
	double pack_seconds;    /* copying bf16 weights into the layout of the vdpbf16ps kernels, once per
	                         * run (0 when no weight is packed) */
	int repeat;             /* calls made */
	size_t workspace_bytes;
	/* Block statistics, over the distinct rank-1 `valid` masks of einsum nodes
	 * (the block masks written by blockwise-dispatch), read after the last
	 * call: a block g of mask v is executed iff v[g] > 0, else skipped. */
	int64_t blocks_executed;
	int64_t blocks_skipped;
	int64_t rows_executed;   /* sum over those masks of clamp(v[g], 0, rows per block) */
	int64_t grid_blocks_max; /* graph attribute grid_blocks_max, -1 when unset */
	int threads;             /* threads the layer ran on */
	moe_host_cache cache;
	const char *kernels;     /* the dot-product kernel set selected (static string): "portable", or
	                          * "avx512bf16" where the CPU has it and portable was not asked for;
	                          * vdpbf16ps then serves the bf16 x bf16 dot products, and a layer
	                          * without any (f32) runs the portable kernels all the same */
	double setup_seconds;    /* binding the tensors and allocating the zeroed workspace, once per run
	                          * (not part of compile_seconds) */
	moe_host_cache pack_cache; /* where the packed weights came from: OFF (no weights_id, no usable
	                            * cache, or nothing packed), MISS (packed, then stored), HIT (every
	                            * one read from the cache), BAD (an entry failed verification:
	                            * packed and rewritten) */
} moe_host_stats;

/* Runs layer g on the host. Inputs and weights are bound by node name from
 * bind (dtype and shape must match); out[0 .. moe_graph_num_outputs-1]
 * receive new tensors the caller frees. repeat >= 1 calls are timed; stats may
 * be NULL. A fault of the layer (index out of range, integer division by
 * zero) is a diagnostic and MOE_ERR_RUNTIME. */
MOE_API moe_status moe_host_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	moe_host_engine engine, int repeat, moe_tensor **out, moe_host_stats *stats);
/* The same with every option; o may be NULL for the defaults. */
MOE_API moe_status moe_host_run_opts(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	const moe_host_opts *o, moe_tensor **out, moe_host_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
