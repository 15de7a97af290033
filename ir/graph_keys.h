/* ir/graph_keys.h: the graph attributes (moe_graph meta, integers) that
 * passes and backends exchange, declared once. The writer of each is named;
 * docs/ir.md ("Graph attributes") gives their meaning. */
#ifndef MOEC_IR_GRAPH_KEYS_H
#define MOEC_IR_GRAPH_KEYS_H

#include "ir/ir.h"

/* blockwise-dispatch: the layer's dims, for grid-bound, stats and the backends */
#define IR_GK_MOE_TOKENS "moe_tokens"       /* T */
#define IR_GK_MOE_K "moe_k"                 /* experts per token */
#define IR_GK_MOE_EXPERTS "moe_experts"     /* E */
#define IR_GK_MOE_BLOCK "moe_block"         /* B, rows per block */
#define IR_GK_MOE_ROW_BYTES "moe_row_bytes" /* D x element size */
#define IR_GK_GRID_BLOCKS "grid_blocks"     /* G, blocks allocated in the grid */
/* blockwise-dispatch, serving layers (an n_tokens input): T, the most real
 * tokens, for the executors' range check (runtime/tokens.c) */
#define IR_GK_SERVING_TOKENS_MAX "serving_tokens_max"
/* a target's bound on one combine chunk, in gathered 2-byte elements:
 * blockwise-dispatch's `chunk` default is lowered to it where it is less,
 * and the pass removes it (the TCP target's tcp-combine-chunk writes it from
 * the machine's DM) */
#define IR_GK_COMBINE_CHUNK "combine_chunk"
#define IR_GK_BLOCK_BALANCE "block_balance"
/* grid-bound: worst-case block counts and block-buffer sizes */
#define IR_GK_GRID_BLOCKS_MAX "grid_blocks_max"
#define IR_GK_GRID_BLOCKS_SEED "grid_blocks_seed"
#define IR_GK_GRID_BLOCKS_VLLM "grid_blocks_vllm"
#define IR_GK_BLOCK_BUFFER_BYTES "block_buffer_bytes"
#define IR_GK_BLOCK_BUFFER_BYTES_SEED "block_buffer_bytes_seed"
#define IR_GK_BLOCK_BUFFER_BYTES_VLLM "block_buffer_bytes_vllm"

/* Node attributes a pass leaves for a backend (the TCP target's registered
 * attribute set, backend-tcp's moe_tcp_register_passes; ir/attrs.c). tcp-split-weights: k >= 0 on the k-th value the
 * TCP program binds as a packed weight (backend-tcp/compiler/prep.c splits there). */
#define IR_NK_TCP_PACK "tcp_pack"
/* tcp-fp8-act-rows (backend-tcp/compiler/gpass/fp8_rows.c): on an act=fp8
 * block-FP8 dequant, the most rows of an einsum reading it for which the
 * TCP program contracts it from its fp8 bytes on the machine it was planned
 * for; tcp-split-weights reads it (no mark: none, the dequant is packed). */
#define IR_NK_TCP_FP8_ROWS "tcp_fp8_rows"
/* tcp-split-weights: the name prefix of the node making canonical MXFP4
 * bytes (mxfp4_canon_at_bind), followed by the name of the weight holding
 * their E8M0 scales; binding checks those scales against the bytes
 * (backend-tcp/sim/pack.c). A name, not an attribute: the prep graph keeps
 * no target attribute. */
#define MOE_TCP_E8M0_NAME "mxfp4_canon."
/* tcp-plan-fusion (backend-tcp/compiler/gpass/plan_fusion.c, registered by the TCP target):
 * the lowering's fusion choices. tcp_fuse = k (k >= 0) on every node of
 * fusion group k, computed by one vector pass, that of the group's last node
 * (its highest id); tcp_view = 1 on a cast or bitcast lowered as a view of its
 * operand (a cast to bf16: of a reduce, whose pass commits bf16); tcp_hbm = 1
 * on a gather kept in HBM; tcp_ggrid = 1 on a dispatch
 * scatter lowered as a gather by block (with its reshapes and its gather).
 * -1 / 0: none (a mark of an earlier run that no longer holds). */
#define IR_NK_TCP_FUSE "tcp_fuse"
#define IR_NK_TCP_VIEW "tcp_view"
#define IR_NK_TCP_HBM "tcp_hbm"
#define IR_NK_TCP_GGRID "tcp_ggrid"
/* tcp-plan-fusion: the machine facts its marks were planned for (a nonzero
 * fingerprint); a backend for another machine plans again by the rule. */
#define IR_GK_TCP_FUSION_PLAN "tcp_fusion_plan"

#endif
