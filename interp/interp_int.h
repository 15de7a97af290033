/* interp/interp_int.h: the interpreter's value storage and the block loop,
 * shared by interp.c and interp_loop.c (internal to interp/). */
#ifndef MOEC_INTERP_INT_H
#define MOEC_INTERP_INT_H

#include "interp/interp.h"

/* A node's value: one float per element of a float dtype (exactly
 * representable in it), one int32_t per element of the others. */
typedef struct val {
	float *f;   /* float dtypes */
	int32_t *i; /* i32, bool and the storage types' bytes */
	int64_t n;  /* elements */
} val;

void interp_val_free(moe_ctx *ctx, val *v);
/* The value's zeroed storage; false (nothing allocated) when refused. */
bool interp_val_alloc(moe_ctx *ctx, val *v, const ir_node *n);
/* A bound tensor's elements into v (its storage allocated), and a value out
 * as a new tensor of node n's type (NULL when refused). */
void interp_load_binding(val *v, const moe_tensor *t);
moe_tensor *interp_store_output(moe_ctx *ctx, const ir_node *n, const val *v);

/* Runs a block_loop body on the blockarg values args[id] into *res (the
 * value it yields, allocated). */
moe_status interp_run_body(moe_ctx *ctx, const moe_graph *body, const val *args, const moe_exchange *x, val *res);
/* block_loop id of g on the operand values v (per node of g) into out:
 * the body's value for each block g < nblocks, zero for the others. */
moe_status interp_block_loop(moe_ctx *ctx, const moe_graph *g, moe_id id, const val *v, const moe_exchange *x,
	val *out);

#endif
