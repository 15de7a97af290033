/* moec/runtime.h: host tensors, name->tensor maps, the reference interpreter.
 *
 * A moe_tensor is a dense row-major array. bf16 elements are stored as their
 * 16-bit patterns (uint16_t); bool as one byte (0/1). */
#ifndef MOEC_RUNTIME_H
#define MOEC_RUNTIME_H

#include "moec/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_tensor {
	moe_dtype dtype;
	int rank;
	int64_t shape[MOE_MAX_RANK];
	void *data;
	size_t nbytes;
	int owned; /* data is freed with the tensor */
} moe_tensor;

/* Zero-filled tensor; NULL (with a diagnostic) if the size overflows or the
 * context's allocator refuses the data (out of memory). */
MOE_API moe_tensor *moe_tensor_new(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape);
/* A tensor with a dtype and shape but no data (data == NULL): a weight absent
 * from a checkpoint (MOE_WEIGHTS_ALLOW_ABSENT, moec/io.h). */
MOE_API moe_tensor *moe_tensor_new_shape(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape);
/* A tensor sharing t's data (not owned: freeing it leaves t's data alone);
 * NULL if the allocator refuses the header. */
MOE_API moe_tensor *moe_tensor_view(moe_ctx *ctx, const moe_tensor *t);
MOE_API void moe_tensor_free(moe_ctx *ctx, moe_tensor *t);
MOE_API int64_t moe_tensor_numel(const moe_tensor *t);

/* bf16 <-> f32: round to nearest even, NaN preserved (quieted). */
MOE_API uint16_t moe_f32_to_bf16(float f);
MOE_API float moe_bf16_to_f32(uint16_t h);

/* A set of named tensors: graph inputs by input name, weights by weight name. */
typedef struct moe_tensor_map moe_tensor_map;
MOE_API moe_tensor_map *moe_tensor_map_new(moe_ctx *ctx);
MOE_API void moe_tensor_map_free(moe_tensor_map *m); /* frees the tensors it owns */
/* Takes ownership of t; replaces (and frees) an earlier tensor of that name.
 * MOE_ERR_NOMEM (t freed, the map unchanged) when the allocator refuses. */
MOE_API moe_status moe_tensor_map_set(moe_tensor_map *m, const char *name, moe_tensor *t);
MOE_API moe_tensor *moe_tensor_map_get(const moe_tensor_map *m, const char *name);

/* A serving layer (an i32 scalar input named MOE_TOKENS_INPUT, "n_tokens")
 * runs on the first n token rows: every executor calls this before running
 * and refuses n < 0 or n > T with a located error (MOE_ERR_INVALID). *n_out
 * (may be NULL) receives n, or -1 for a layer without the input. To run a
 * serving layer, bind a rank-0 i32 tensor holding n under "n_tokens". */
MOE_API moe_status moe_tokens_check(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, int64_t *n_out);

/* The reference interpreter: the executable definition of every op
 * (docs/ir.md). Slow and obviously correct. Binds every input and weight node
 * by name from `bind` (dtype and shape must match the node) and returns the
 * graph outputs in out[0 .. moe_graph_num_outputs-1] (caller frees). Run-time
 * faults (an index out of range, an integer division by zero) are
 * diagnostics and MOE_ERR_RUNTIME. */
MOE_API moe_status moe_interp_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	moe_tensor **out);

/* Expert parallelism (docs/expert-parallel.md): how the `all_to_all` nodes of
 * one device's program reach the other ep - 1 devices. all_to_all sends rows
 * [0, sum counts) of `send`, grouped by destination (counts[j] rows of
 * row_bytes bytes to device j, counts has ep entries), and receives into
 * `recv` (room for cap rows) the rows every device sends to this one, in
 * device order; *got is the number received. Every device calls it for the
 * same nodes in the same order. It returns MOE_OK, or an error with a
 * diagnostic on ctx (then every device must see an error, never a hang). */
typedef struct moe_exchange {
	int ep, rank;
	moe_status (*all_to_all)(void *ud, moe_ctx *ctx, const void *send, const int64_t *counts, size_t row_bytes,
		void *recv, int64_t cap, int64_t *got);
	void *ud;
} moe_exchange;

/* moe_interp_run for one device of an expert-parallel program: its
 * all_to_all nodes go through x (NULL: only ep = 1 exchanges, which keep
 * the rows on this device). */
MOE_API moe_status moe_interp_run_ex(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	const moe_exchange *x, moe_tensor **out);

/* A simulated run of the ep per-device programs g[0 .. ep-1] (from the
 * expert-parallel pass, one per rank) on the interpreter, one thread per
 * device, the exchanges done in memory. out[d] receives device d's outputs
 * (caller frees each tensor and the arrays are the caller's: out[d] must
 * have room for moe_graph_num_outputs(g[d]) tensors). Diagnostics of every
 * device are copied to ctx, prefixed with the device. */
MOE_API moe_status moe_ep_sim_run(moe_ctx *ctx, int ep, const moe_graph *const *g,
	const moe_tensor_map *const *bind, moe_tensor **const *out);

#ifdef __cplusplus
}
#endif
#endif
