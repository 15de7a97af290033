/* passes/pass.h: the built-in passes (one per file, one signature). */
#ifndef MOEC_PASS_H
#define MOEC_PASS_H

#include "ir/graph_keys.h"
#include "ir/ir.h"
#include "moec/passes.h"

#define PASS(fn) moe_status fn(moe_ctx *ctx, moe_graph *g, const moe_pass_opts *opts, void *ud)
PASS(pass_infer_shapes);
PASS(pass_canonicalize);
PASS(pass_cse);
PASS(pass_dce);
PASS(pass_lower_topk);
PASS(pass_blockwise_dispatch);
PASS(pass_flatten_blocks);
PASS(pass_grid_bound);
PASS(pass_expert_parallel);
PASS(pass_lower_exchange);
PASS(pass_tcp_split_weights);

/* tcp-split-weights (passes/tcp_split_weights.c): pack[i] for every node the
 * TCP program binds as a packed weight; returns their count. The backend
 * asks it for a graph no tcp-split-weights ran on. */
uint32_t pass_tcp_pack_plan(moe_ctx *ctx, const moe_graph *g, bool *pack);
/* ... whether node id is a block-FP8 dequant with act="fp8" (128 x 128
 * blocks dividing both dims, rank 2, not an output) that a TCP contraction
 * can read from its fp8 bytes: the nodes tcp-fp8-act-rows marks */
bool pass_tcp_fp8_act_dequant(const moe_graph *g, moe_id id);

/* An f32 einsum of two bf16 values each widened by a cast (DeepSeek-V3's
 * router): every product of the widened values is exact in f32, so a TCP
 * contraction of the bf16 values with its f32 accumulator computes the same
 * sums, where the f32 operands took the bf16x3 split at three times the
 * MACs (docs/tcp-isa.md section 7, item 2). Such a cast of a weight, read by
 * these einsums only, is not packed: it stays a view of the bf16 weight. */
bool pass_tcp_widened_einsum(const moe_graph *g, moe_id id);

/* A block grid of blockwise-dispatch: blocks [G, B, D] of the compute type,
 * rows [G] the valid rows of each block, nblocks the blocks in use (a
 * scalar), bexp [G] the expert of each block. */
typedef struct pass_blocks {
	moe_id blocks, rows, nblocks, bexp;
	int64_t G, B;
} pass_blocks;
/* The expert FFN of experts node ex (of the source graph; s its operands
 * mapped into d) over every block of b, as blockwise-dispatch computes it:
 * [G, B, D], padding rows and blocks past nblocks skipped. */
/* Does n keep the expert dimension first (a slice past axis 0, an einsum
 * permutation that leaves its first letter first)? (blockwise_dispatch.c) */
bool pass_keeps_expert_axis(const ir_node *n);
moe_id pass_expert_ffn(moe_graph *d, const ir_node *ex, const moe_id *s, const pass_blocks *b);
/* The same as one block_loop whose body computes one block (the schedule
 * compiler's form, docs/tcp-compiler.md 2.1): [G, B, D]. */
moe_id pass_expert_loop(moe_graph *d, const ir_node *ex, const moe_id *s, const pass_blocks *b);

/* Serving layers (passes/token_rows.c): the n_tokens input of g or
 * MOE_NONE; the token-row kind of every node (false with an error when the
 * experts or an output are not row-wise) and row offset; the real-row
 * counts n_tokens - offset, built first; valid(count) on the row-wise nodes
 * of the rebuilt graph. */
moe_id token_count_input(const moe_graph *g);
bool token_rows_classify(moe_ctx *ctx, const moe_graph *g, int64_t T, moe_id ntok, uint8_t *kinds, int64_t *off);
void token_rows_counts(moe_graph *dst, const moe_graph *src, const uint8_t *kinds, const int64_t *off,
	moe_id ntok_dst, moe_id *counts);
void token_rows_mask(moe_graph *dst, const moe_graph *src, const uint8_t *kinds, const moe_id *map,
	const moe_id *counts);

/* Option `key` of pass `pass` as a positive count in *out (def when absent);
 * false with a diagnostic when it is not a positive decimal integer. */
bool pass_opt_count(moe_ctx *ctx, const moe_pass_opts *o, const char *pass, const char *key, int64_t def,
	int64_t *out);

/* Helpers shared by passes: a rebuild copies every node of g into a fresh
 * graph through `map`, letting a pass replace some nodes by new ones. */
typedef struct rebuild {
	moe_graph *src, *dst;
	moe_id *map; /* src id -> dst id */
} rebuild;
void rebuild_begin(rebuild *r, moe_graph *g);
/* Copy node i unchanged (operands mapped). */
moe_id rebuild_copy(rebuild *r, moe_id i);
/* Abandon a rebuild (g unchanged). */
void rebuild_abort(rebuild *r);
/* Finish: outputs mapped, g takes the new contents. */
void rebuild_end(rebuild *r);

#endif
