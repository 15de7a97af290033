/* interp/interp.h: helpers around the reference interpreter for tests and passes.
 *
 * A pass is checked by running the graph before and after it on the same
 * deterministic random bindings and comparing the outputs:
 *
 *     ir_diff d;
 *     if (ir_interp_compare(ctx, before, after, 1, &d) != MOE_OK) ...
 *     if (d.ndiff) ... (not bitwise equal); d.max_abs gives the size of the gap.
 */
#ifndef MOEC_INTERP_H
#define MOEC_INTERP_H

#include "ir/ir.h"
#include "moec/runtime.h"

/* Bindings for every input and weight node of g, named as the interpreter
 * looks them up, deterministic in seed:
 *   floats: approximately N(0, 1) (sum of uniforms), rounded to the dtype;
 *   bool:   0 or 1; f8e4m3, u8 (quantized weight bytes): any byte;
 *   i32:    an input used directly as the `idx` of `experts` gets, per row,
 *           distinct experts in [0, E); one used as an index operand (gather,
 *           take_along, scatter) or as a `valid` mask gets values in range for
 *           every such use ([0, n) for indices, [0, n] for masks); any other
 *           i32 value is drawn from [-8, 8).
 * *out is a new map (caller frees) or NULL on error. */
moe_status ir_interp_random_bindings(moe_ctx *ctx, const moe_graph *g, uint64_t seed, moe_tensor_map **out);

/* Difference between two tensors of one dtype and shape. */
typedef struct ir_diff {
	int64_t ndiff;        /* elements whose values differ bitwise (any two NaNs count as equal) */
	int64_t nnan;         /* elements that are NaN on one side only */
	double max_abs;       /* largest |a - b|; inf where only one side is NaN, or infs differ */
	double max_rel;       /* largest |a - b| / max(|a|, |b|) over finite nonzero pairs */
	uint32_t worst_output; /* output (ir_interp_compare) holding the largest difference */
	int64_t worst_index;   /* row-major element index of it, -1 when equal */
} ir_diff;

/* Accumulates the difference of a and b into *d (which the caller zeroes
 * first, with worst_index -1). MOE_ERR_INVALID with a diagnostic when the
 * tensors differ in dtype or shape. */
moe_status ir_tensor_diff(moe_ctx *ctx, const moe_tensor *a, const moe_tensor *b, uint32_t output, ir_diff *d);

/* Runs a and b on ir_interp_random_bindings(ctx, a, seed) and compares their
 * outputs pairwise into *d. The graphs must have the same number of outputs
 * with matching types. b may use a subset of a's inputs and weights. */
moe_status ir_interp_compare(moe_ctx *ctx, const moe_graph *a, const moe_graph *b, uint64_t seed, ir_diff *d);

/* Runs g on the given bindings and returns its outputs in a new array of
 * moe_graph_num_outputs(g) tensors (free with ir_interp_free_outputs). */
moe_status ir_interp_run_alloc(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_tensor ***out);
void ir_interp_free_outputs(moe_ctx *ctx, const moe_graph *g, moe_tensor **out);

/* moe_interp_run_ex on a graph already verified: allocates only from ctx,
 * never from the graph's own context, so that the devices of a simulated
 * expert-parallel run (interp/ep_sim.c) can share graphs of one context. */
moe_status ir_interp_run_verified(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	const moe_exchange *x, moe_tensor **out);

/* interp_util.c: the rows of a result below a scalar valid count v (clamped),
 * its other rows zeroed (f or i, the buffer in use) */
int64_t interp_rows_below(float *f, int32_t *i, int64_t n, int64_t rows, int64_t v);
void interp_split_axis(const ir_node *x, int ax, int64_t *outer, int64_t *len, int64_t *inner);

#endif
