/* moec/ir.h: the static-shape MoE IR.
 *
 * A module holds layers; each layer is a graph. A graph owns an array of
 * nodes in topological order; every node produces one value and values are
 * referred to by their node id (moe_id). Shapes are static: every dimension is
 * a known positive integer. Ops come from the one table in moec/ops.def. */
#ifndef MOEC_IR_H
#define MOEC_IR_H

#include "moec/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint32_t moe_id;
#define MOE_NONE ((moe_id)0xffffffffu)
#define MOE_MAX_RANK 8
/* Largest dimension: indices are 32-bit signed in routing code. */
#define MOE_MAX_DIM ((int64_t)INT32_MAX)

typedef enum moe_op {
#define OP(id, name, mn, mx, rule, flags, attrs) MOE_OP_##id,
#include "moec/ops.def"
#undef OP
	MOE_OP_COUNT
} moe_op;

/* Element types. f8e4m3 and u8 hold the raw bytes of quantized weights: only
 * data movement (gather, reshape, slice, concat) and `dequant` read them. */
typedef enum moe_dtype {
	MOE_F32,
	MOE_BF16,
	MOE_I32,
	MOE_BOOL,
	MOE_F8E4M3, /* storage only: E4M3fn bytes of a quantized weight, read by dequant */
	MOE_I8,     /* reserved */
	MOE_U8,     /* storage only: packed bytes (MXFP4 E2M1 pairs, E8M0 scales), read by dequant */
	MOE_DTYPE_COUNT
} moe_dtype;

MOE_API const char *moe_op_name(moe_op op);
MOE_API int moe_op_from_name(const char *name); /* -1 if unknown */
MOE_API const char *moe_dtype_name(moe_dtype t);
MOE_API int moe_dtype_from_name(const char *name); /* -1 if unknown */
MOE_API size_t moe_dtype_size(moe_dtype t);        /* bytes per element in memory */
MOE_API int moe_dtype_is_float(moe_dtype t);     /* f32, bf16 */
MOE_API int moe_dtype_is_storage(moe_dtype t);   /* f8e4m3, u8: raw bytes of quantized weights */

typedef enum moe_attr_kind { MOE_ATTR_INT, MOE_ATTR_FLOAT, MOE_ATTR_STR, MOE_ATTR_INTS } moe_attr_kind;

typedef struct moe_module moe_module;
typedef struct moe_graph moe_graph;

/* ---- modules ---- */
MOE_API moe_module *moe_module_new(moe_ctx *ctx);
MOE_API void moe_module_free(moe_module *m);
MOE_API size_t moe_module_num_graphs(const moe_module *m);
MOE_API moe_graph *moe_module_graph(const moe_module *m, size_t i);
/* Adds a new empty graph owned by the module. */
MOE_API moe_graph *moe_module_add_graph(moe_module *m, const char *name);

/* The optional i32 scalar input of a serving layer: the number n of real
 * tokens, 0 <= n <= T; rows of x at and past n are padding (docs/semantics.md
 * section 7). */
#define MOE_TOKENS_INPUT "n_tokens"

/* ---- graphs ---- */
MOE_API const char *moe_graph_name(const moe_graph *g);
MOE_API uint32_t moe_graph_num_nodes(const moe_graph *g);
MOE_API uint32_t moe_graph_num_outputs(const moe_graph *g);
MOE_API moe_id moe_graph_output(const moe_graph *g, uint32_t i);
MOE_API void moe_graph_add_output(moe_graph *g, moe_id v);
/* Named integer dimensions and parameters recorded for printing and stats. */
MOE_API void moe_graph_set_dim(moe_graph *g, const char *name, int64_t value);
MOE_API int moe_graph_get_dim(const moe_graph *g, const char *name, int64_t *value);
/* Integer graph attributes recorded by passes (e.g. grid_blocks_max). */
MOE_API void moe_graph_set_attr_int(moe_graph *g, const char *key, int64_t v);
MOE_API int moe_graph_get_attr_int(const moe_graph *g, const char *key, int64_t *v);
MOE_API moe_dtype moe_graph_dtype(const moe_graph *g);
MOE_API void moe_graph_set_dtype(moe_graph *g, moe_dtype t);

/* ---- building nodes ----
 * moe_node_new appends a node whose operands already exist (ids < the new
 * id), sets its attributes afterwards with moe_node_set_*, then moe_node_infer
 * computes dtype and shape from the op's shape rule (reporting diagnostics at
 * the node's location); leaves take their dtype/shape from moe_node_set_type. */
MOE_API moe_id moe_node_new(moe_graph *g, moe_op op, const moe_id *args, uint32_t nargs, moe_loc loc);
MOE_API void moe_node_set_type(moe_graph *g, moe_id n, moe_dtype t, const int64_t *shape, int rank);
MOE_API void moe_node_set_name(moe_graph *g, moe_id n, const char *name);
MOE_API void moe_node_set_valid(moe_graph *g, moe_id n, moe_id valid);
MOE_API void moe_node_set_int(moe_graph *g, moe_id n, const char *key, int64_t v);
MOE_API void moe_node_set_float(moe_graph *g, moe_id n, const char *key, double v);
MOE_API void moe_node_set_str(moe_graph *g, moe_id n, const char *key, const char *v);
/* count >= 0 (v may be NULL when it is 0); a negative count is API misuse (abort). */
MOE_API void moe_node_set_ints(moe_graph *g, moe_id n, const char *key, const int64_t *v, int count);
MOE_API moe_status moe_node_infer(moe_graph *g, moe_id n);

/* ---- rewriting a graph (external passes) ----
 * A rewrite appends its new nodes, points the users of the old value at them
 * (moe_graph_replace_uses, or moe_node_set_arg for one operand), then calls
 * moe_graph_compact, which puts the nodes back in an order where operands
 * precede their users and drops every node no output needs. Between the
 * edits and the compaction an operand may refer to a later node; nothing but
 * these three functions may run on the graph then. */
MOE_API void moe_node_set_arg(moe_graph *g, moe_id n, uint32_t i, moe_id v);
/* Every operand, valid mask and graph output that is `old` becomes `v`,
 * except in v and the nodes v is computed from (so v = f(old) keeps reading
 * old); returns how many were changed. */
MOE_API uint32_t moe_graph_replace_uses(moe_graph *g, moe_id old, moe_id v);
/* Reorders the nodes so operands precede uses (the order is kept where it
 * already does) and drops nodes that no output reaches (inputs stay: they
 * are the layer's calling convention). map, when not NULL,
 * has room for the old node count and receives each old id's new id
 * (MOE_NONE when dropped). A cycle is an error (diagnostic, graph unchanged). */
MOE_API moe_status moe_graph_compact(moe_ctx *ctx, moe_graph *g, moe_id *map);

/* ---- reading nodes ---- */
MOE_API moe_op moe_node_op(const moe_graph *g, moe_id n);
MOE_API moe_dtype moe_node_dtype(const moe_graph *g, moe_id n);
MOE_API int moe_node_rank(const moe_graph *g, moe_id n);
MOE_API const int64_t *moe_node_shape(const moe_graph *g, moe_id n);
MOE_API uint32_t moe_node_num_args(const moe_graph *g, moe_id n);
MOE_API moe_id moe_node_arg(const moe_graph *g, moe_id n, uint32_t i);
MOE_API const char *moe_node_name(const moe_graph *g, moe_id n);
MOE_API moe_id moe_node_valid(const moe_graph *g, moe_id n);
MOE_API moe_loc moe_node_loc(const moe_graph *g, moe_id n);
MOE_API int moe_node_get_int(const moe_graph *g, moe_id n, const char *key, int64_t *v);
MOE_API int moe_node_get_float(const moe_graph *g, moe_id n, const char *key, double *v);
MOE_API const char *moe_node_get_str(const moe_graph *g, moe_id n, const char *key);

/* ---- checking, printing, parsing ---- */
MOE_API moe_status moe_graph_verify(moe_ctx *ctx, const moe_graph *g);
MOE_API moe_status moe_module_verify(moe_ctx *ctx, const moe_module *m);
/* Textual IR: print -> parse -> print is identical. */
MOE_API moe_status moe_module_print(const moe_module *m, FILE *out);
MOE_API moe_module *moe_module_parse_text(moe_ctx *ctx, const char *file, const char *text, size_t len);
/* JSON interchange (cJSON), {"format":"moeir","version":N,...}. Caller frees
 * the returned string with moe_free. */
MOE_API char *moe_module_to_json(const moe_module *m);
MOE_API moe_module *moe_module_parse_json(moe_ctx *ctx, const char *file, const char *text, size_t len);
/* Graphviz dot. */
MOE_API moe_status moe_module_print_dot(const moe_module *m, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
