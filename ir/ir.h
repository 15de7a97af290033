/* ir/ir.h: internal view of the IR (structs, op table, builders); the
 * context, arena and overflow helpers it builds on are in support/support.h.
 * Code inside the library includes this; embedders use moec/ir.h only. */
#ifndef MOEC_IR_INTERNAL_H
#define MOEC_IR_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>

#include "moec/ir.h"
#include "support/support.h"

/* ---- op table ---- */
enum {
	OPF_LEAF = 1 << 0,
	OPF_ELEM = 1 << 1,
	OPF_COMM = 1 << 2,
	OPF_FLOAT = 1 << 3,
	OPF_INT = 1 << 4,
	OPF_CMP = 1 << 5,
	OPF_VALID = 1 << 6,
	OPF_IMPURE = 1 << 7,
};
typedef enum ir_shape_rule {
	SHAPE_LEAF, SHAPE_UNARY, SHAPE_BINARY, SHAPE_SELECT, SHAPE_CAST, SHAPE_BITCAST,
	SHAPE_REDUCE, SHAPE_SOFTMAX, SHAPE_CUMSUM, SHAPE_EINSUM, SHAPE_TOPK, SHAPE_ONE_HOT,
	SHAPE_FILTER, SHAPE_GATHER, SHAPE_TAKE_ALONG, SHAPE_SCATTER, SHAPE_RESHAPE,
	SHAPE_SLICE, SHAPE_CONCAT, SHAPE_BROADCAST, SHAPE_EXPERTS, SHAPE_DEQUANT, SHAPE_ALL_TO_ALL,
	SHAPE_BLOCK_LOOP
} ir_shape_rule;
typedef struct ir_opinfo {
	const char *name;
	int min_args, max_args; /* max -1: variadic */
	ir_shape_rule rule;
	unsigned flags;
} ir_opinfo;
extern const ir_opinfo ir_ops[MOE_OP_COUNT];
/* Ops whose `valid` mask must be a scalar counting rows of axis 0 kept from
 * operand 0 (reductions and softmax along another axis, take_along). */
static inline bool ir_valid_rows_only(unsigned op)
{
	return op == MOE_OP_REDUCE_SUM || op == MOE_OP_REDUCE_MAX || op == MOE_OP_REDUCE_MIN || op == MOE_OP_SOFTMAX ||
	       op == MOE_OP_TAKE_ALONG;
}

/* ---- attribute schema (ATTRS rows of moec/ops.def; ir/attrs.c) ---- */
typedef enum ir_attr_type { IR_AT_INT, IR_AT_NUM, IR_AT_STR, IR_AT_TYPE, IR_AT_INTS } ir_attr_type;
typedef struct ir_attrspec {
	const char *key; /* NULL ends a set */
	ir_attr_type type;
	bool required;
	int64_t idef;              /* IR_AT_INT default */
	double fdef;               /* IR_AT_NUM default */
	const char *sdef;          /* IR_AT_STR default (NULL: none) */
	const char *const *names;  /* IR_AT_STR: the allowed values, NULL-terminated; NULL: any */
} ir_attrspec;
const ir_attrspec *ir_op_attrs(moe_op op); /* the op's set, NULL-key terminated */
/* The spec of key on op: the op's own row, then the set of the target its
 * prefix names if registered on ctx and allowed on op; NULL otherwise. */
const ir_attrspec *ir_attr_spec(moe_ctx *ctx, moe_op op, const char *key);

/* Target attribute sets (docs/ir.md "Target attributes"). A target's keys
 * are spelled <prefix>_<name> ("tcp_fuse": prefix "tcp"); a set is an array
 * of rows ended by a NULL key. Readers and the verifier accept such a key only
 * where the target is registered on the context: with a registered prefix an
 * unknown name is an error, and a key under a prefix that names a target not
 * registered is an error naming the target. Registering a prefix twice is an
 * error (ir_target_attrs_registered tells first). */
typedef struct ir_target_attr {
	const char *key;     /* "<prefix>_<name>" */
	ir_attr_type type;   /* IR_AT_INT, IR_AT_NUM, IR_AT_STR (any string), IR_AT_TYPE or IR_AT_INTS */
	int64_t idef;        /* IR_AT_INT default */
	unsigned ops;        /* OPF_* class of ops that may carry it; 0: any op */
	const char *summary; /* what it means, one line (kept with the row) */
} ir_target_attr;
moe_status ir_target_attrs_register(moe_ctx *ctx, const char *prefix, const ir_target_attr *set);
bool ir_target_attrs_registered(moe_ctx *ctx, const char *prefix);
int ir_name_index(const char *const *names, const char *s);   /* -1 if absent */

/* Activations of `experts` (attribute act): one enum, one name table. */
/* experts activations; NONE and RELU2 take no gate weight */
typedef enum ir_act {
	IR_ACT_SWIGLU,
	IR_ACT_GEGLU,
	IR_ACT_GEGLU_TANH,
	IR_ACT_GPT_OSS,
	IR_ACT_NONE,
	IR_ACT_RELU2,
	IR_ACT_COUNT
} ir_act;
extern const char *const ir_act_names[IR_ACT_COUNT + 1]; /* NULL-terminated */
extern const char *const ir_scatter_modes[];             /* scatter mode: set, add */
extern const char *const ir_dequant_acts[];              /* dequant act: bf16, fp8 (TCP), int8 (W8A8) */
extern const char *const ir_dequant_gscales[];           /* dequant nvfp4 global scale: div, mul */
extern const char *const ir_weight_on_names[];           /* experts weight_on: output, input */

/* block_loop (docs/ir.md "Block loops"). Operands 0-2 are the control
 * values: nblocks (i32 scalar), the block experts (i32 [G]) and the valid
 * rows of each block (i32 [G]); then the data operands, one per letter of
 * the `kinds` attribute (two for IR_BK_ROWS: source [N, D] and list [G, B]).
 * A blockarg's `role` names what it reads of block g: its valid rows, its
 * expert, g itself, or data input `index` (the k-th letter of kinds). */
enum { IR_BL_NBLOCKS, IR_BL_EXPERTS, IR_BL_ROWS, IR_BL_NCTRL };
enum { IR_BK_BLOCK = 'b', IR_BK_EXPERT = 'e', IR_BK_ROWS = 'r', IR_BK_INVARIANT = 'i' };
typedef enum ir_blockarg_role { IR_BA_ROWS, IR_BA_EXPERT, IR_BA_INDEX, IR_BA_IN, IR_BA_COUNT } ir_blockarg_role;
extern const char *const ir_blockarg_roles[IR_BA_COUNT + 1]; /* NULL-terminated */
#define IR_NO_BODY UINT32_MAX
#define IR_BODY_MAX_INPUTS 32 /* data inputs a builder gives a loop (the readers take 64 operands) */

/* Operand slots of `experts` (absent optional slots hold MOE_NONE). */
enum { EXP_X, EXP_IDX, EXP_W, EXP_GATE, EXP_UP, EXP_DOWN, EXP_B_GATE, EXP_B_UP, EXP_B_DOWN, EXP_NSLOTS };
extern const char *const ir_experts_slot_names[EXP_NSLOTS];

/* ---- nodes and graphs ---- */
typedef struct ir_attr {
	const char *key; /* interned in the graph arena */
	moe_attr_kind kind;
	int count; /* MOE_ATTR_INTS */
	union {
		int64_t i;
		double f;
		const char *s;
		int64_t *ints;
	} v;
} ir_attr;

typedef struct ir_node {
	uint16_t op;
	uint8_t dtype;
	uint8_t rank;
	int64_t shape[MOE_MAX_RANK];
	uint32_t nargs;
	moe_id *args;
	uint32_t nattrs, attrcap;
	ir_attr *attrs;
	moe_id valid; /* MOE_NONE, or a scalar / vector limiting computed rows */
	uint32_t body; /* block_loop: index into the graph's bodies[]; IR_NO_BODY otherwise */
	const char *name;
	moe_loc loc;
} ir_node;

typedef struct ir_dim {
	const char *name;
	int64_t value;
} ir_dim;

struct moe_graph {
	moe_ctx *ctx;
	ir_arena arena;
	const char *name;
	moe_dtype dtype; /* the layer's compute type */
	moe_loc loc;
	ir_node *nodes;
	uint32_t nnodes, ncap;
	moe_id *outputs;
	uint32_t nout, outcap;
	ir_dim *dims; /* dimensions and integer parameters, in declaration order */
	uint32_t ndims, dimcap;
	ir_node meta; /* graph-level attributes live in meta.attrs */
	/* the bodies of this graph's block_loop nodes, owned (freed and cloned
	 * with it); a body is a graph of its own ids whose one output is the
	 * value it yields, and holds no body itself */
	struct moe_graph **bodies;
	uint32_t nbodies, bodycap;
	bool is_body;
};

struct moe_module {
	moe_ctx *ctx;
	moe_graph **graphs;
	uint32_t ngraphs, gcap;
};

static inline ir_node *ir_node_at(const moe_graph *g, moe_id id)
{
	IR_ASSERT(id < g->nnodes);
	return &g->nodes[id];
}
#define N(g, id) ir_node_at((g), (id))

moe_graph *ir_graph_new(moe_ctx *ctx, const char *name);
void ir_graph_free(moe_graph *g);
/* An empty graph with the same name, dtype, dims and graph attributes. */
moe_graph *ir_graph_clone_empty(const moe_graph *g);
/* Replace graph i of the module by g (the old one is freed). */
void ir_module_replace(moe_module *m, uint32_t i, moe_graph *g);
moe_graph *ir_graph_clone(const moe_graph *g);
/* Move ng's contents into g (pointers to g stay valid) and free the old contents. */
void ir_graph_take(moe_graph *g, moe_graph *ng);

/* ---- block loop bodies ---- */
/* A new empty body of g (the graph's dtype), its index in *index; attach it
 * to a block_loop with n->body = *index. */
moe_graph *ir_body_new(moe_graph *g, uint32_t *index);
/* The body of block_loop n of g, or NULL. */
moe_graph *ir_node_body(const moe_graph *g, const ir_node *n);
/* The value a body yields (its one output), MOE_NONE if it has none. */
moe_id ir_body_yield(const moe_graph *body);
/* Operand index of data input k of a loop with these kinds (-1 past the end),
 * and the number of operands the kinds need. */
int ir_block_loop_arg(const char *kinds, int k);
int ir_block_loop_nargs(const char *kinds);
ir_blockarg_role ir_blockarg_role_of(const ir_node *n); /* IR_BA_COUNT if unknown */
bool ir_graph_has_block_loop(const moe_graph *g);
/* g's first block_loop node, or NULL. */
const ir_node *ir_graph_block_loop(const moe_graph *g);
/* The rule of block_loop (ir/block_loop.c), and the isolation rules every
 * node obeys (a blockarg only in a body; no input, weight, impure op or
 * block_loop in one); diagnostics at the node. */
moe_status ir_infer_block_loop(moe_ctx *ctx, moe_graph *g, moe_id id);
moe_status ir_body_node_check(moe_ctx *ctx, const moe_graph *g, const ir_node *n);

/* Append a node with explicit type; no inference. */
moe_id ir_emit(moe_graph *g, moe_op op, moe_dtype t, int rank, const int64_t *shape,
	const moe_id *args, uint32_t nargs, moe_loc loc);
/* Copy node `sn` of src into dst with operands (and valid) mapped through map. */
moe_id ir_copy_node(moe_graph *dst, const moe_graph *src, moe_id sn, const moe_id *map);

ir_attr *ir_attr_find(const ir_node *n, const char *key);
int64_t ir_attr_int(const ir_node *n, const char *key, int64_t def);
double ir_attr_float(const ir_node *n, const char *key, double def);
const char *ir_attr_str(const ir_node *n, const char *key, const char *def);
int ir_attr_ints(const ir_node *n, const char *key, const int64_t **out); /* count or -1 */
/* Checks attribute a of an op against the op's set (known key, kind, allowed
 * value); false with an error at loc otherwise. */
bool ir_attr_check(moe_ctx *ctx, moe_op op, const ir_attr *a, moe_loc loc);
bool ir_node_attrs_check(moe_ctx *ctx, const ir_node *n); /* every attribute, at the node's loc */
ir_act ir_node_act(const ir_node *n); /* IR_ACT_COUNT for an unknown name */
void ir_attr_set(moe_graph *g, ir_node *n, const ir_attr *a); /* copies strings/lists */
void ir_graph_set_attr_int(moe_graph *g, const char *key, int64_t v);
int64_t ir_graph_attr_int(const moe_graph *g, const char *key, int64_t def);
/* Removes graph attribute key (none: nothing), the others kept in order. */
void ir_graph_drop_attr(moe_graph *g, const char *key);

int64_t ir_numel(const ir_node *n);      /* shapes are verified not to overflow */
int64_t ir_bytes(const ir_node *n);      /* numel * element size */
bool ir_same_shape(const ir_node *a, const ir_node *b);
int ir_norm_axis(int axis, int rank);     /* negative axes count from the end; -1 if bad */

/* Shape inference for one node; diagnostics at the node's loc. */
moe_status ir_infer(moe_ctx *ctx, moe_graph *g, moe_id id);
/* The rule of `dequant` (ir/quant.c) and the geometry of a verified one. */
struct qt_info;
moe_status ir_infer_dequant(moe_ctx *ctx, moe_graph *g, moe_id id);
bool ir_dequant_info(const moe_graph *g, const ir_node *n, struct qt_info *qi);

/* ---- builders for passes: create + infer, abort on internal errors ---- */
moe_id ir_b(moe_graph *g, moe_op op, const moe_id *args, uint32_t nargs, moe_loc loc);
moe_id ir_b1(moe_graph *g, moe_op op, moe_id a, moe_loc loc);
moe_id ir_b2(moe_graph *g, moe_op op, moe_id a, moe_id b, moe_loc loc);
moe_id ir_b3(moe_graph *g, moe_op op, moe_id a, moe_id b, moe_id c, moe_loc loc);
moe_id ir_b_const(moe_graph *g, moe_dtype t, double value, moe_loc loc);   /* rank-0 */
moe_id ir_b_iota(moe_graph *g, int rank, const int64_t *shape, int axis, moe_loc loc); /* i32 */
moe_id ir_b_cast(moe_graph *g, moe_id a, moe_dtype t, moe_loc loc);
moe_id ir_b_bitcast(moe_graph *g, moe_id a, moe_dtype t, moe_loc loc);
moe_id ir_b_reshape(moe_graph *g, moe_id a, int rank, const int64_t *shape, moe_loc loc);
moe_id ir_b_reduce(moe_graph *g, moe_op op, moe_id a, int axis, bool keepdims, moe_loc loc);
moe_id ir_b_einsum(moe_graph *g, const char *eq, moe_id a, moe_id b, moe_loc loc);
moe_id ir_b_slice(moe_graph *g, moe_id a, int axis, int64_t start, int64_t stop, moe_loc loc);
moe_id ir_b_concat(moe_graph *g, const moe_id *parts, uint32_t n, int axis, moe_loc loc);

/* ---- einsum equation parsing, shared by shapes, interpreter and backends ---- */
typedef struct ir_einsum {
	int nin;                          /* 1 or 2 */
	int rank[2], out_rank;
	char in[2][MOE_MAX_RANK], out[MOE_MAX_RANK]; /* index letters */
	char letters[26];                 /* all distinct letters, in first-seen order */
	int nletters;
} ir_einsum;
/* Parses "ab,bc->ac". Returns false with msg set on a malformed equation. */
bool ir_einsum_parse(const char *eq, ir_einsum *e, char *msg, size_t msglen);

/* The form of a parsed equation (ir/einsum.c). `batch` leading letters are
 * shared, in place, by the operands and the output; after them:
 *   IDENTITY   one operand, written back unchanged ("ab->ab");
 *   PERMUTE    one operand, its letters reordered ("edf->efd");
 *   MATMUL_NT  [M, I] x [O, I] -> [M, O], the right operand transposed, as an
 *              nn.Linear weight is stored ("bi,oi->bo", "gbi,goi->gbo": batch 1);
 *   MATMUL_NN  [M, I] x [I, O] -> [M, O];
 *   OTHER      anything else (several contracted letters, outer products,
 *              reductions, broadcasts, a batch letter out of place).
 * M, I and O are three distinct letters. Passes match these forms, never an
 * equation's spelling. */
typedef enum ir_ein_form {
	IR_EIN_OTHER,
	IR_EIN_IDENTITY,
	IR_EIN_PERMUTE,
	IR_EIN_MATMUL_NT,
	IR_EIN_MATMUL_NN,
} ir_ein_form;
ir_ein_form ir_einsum_form(const ir_einsum *e, int *batch);
/* The form of einsum node n (OTHER for another op or a malformed equation). */
ir_ein_form ir_node_einsum_form(const ir_node *n, int *batch);

#endif
