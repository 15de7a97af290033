/* backend-tcp/compiler/tcp_compile.h: what the compiler's files share beyond
 * the instruction set (isa/tcp_int.h): the contraction tiling, the row
 * classes, the lowering's entry, and the graph rewrites of gpass/ with their
 * helpers. Only the compiler layer may include it. */
#ifndef MOEC_TCP_COMPILE_H
#define MOEC_TCP_COMPILE_H

#include "backend-tcp/isa/tcp_int.h"

/* planning (plan.c): the tiling of one contraction [M, O] x [O, I] with
 * weights of dtype wdt, chosen with the cost rules (docs/tcp-isa.md sections 6
 * and 10); *cycles, when given, the estimated cycles of all its passes */
typedef struct cplan {
	int64_t M, O, I, It, Os, Opass;
} cplan;
cplan tcp_plan_contract(const moe_tcp_machine *m, int64_t M, int64_t O, int64_t I, int wdt, int64_t *cycles);
/* plan.c: the reduction chunks a tiling with `os` TRF rows per slice tries,
 * for weights of e bytes an element over I (docs/tcp-isa.md 6): the largest
 * that fills half the TRF, then as many chunks of an even size; a chunk that
 * splits I is a multiple of the HBM granule's elements (a streamed tile's
 * rows whole requests) or of 32, and weight rows that are not whole granules
 * (aligned false) also try multiples of 32. Up to 4 in its, in the order to
 * try them; 0 when none fits (nor for any larger os). */
int tcp_chunk_tries(const moe_tcp_machine *m, int64_t os, int64_t I, int64_t e, bool aligned, int64_t its[4]);
/* plan.c: the estimated cycles of that contraction with `os` TRF rows per
 * slice and reduction chunks of `it`, run in the row tiles `tiles` (ntiles
 * row counts) on one TRF tile */
int64_t tcp_contract_cycles(const moe_tcp_machine *m, int64_t os, int64_t it, int64_t O, int64_t I, int wdt,
	const int64_t *tiles, int ntiles);

/* rowchunk.c: g with its wide row-wise values (the schedule compiler's
 * regions, rowchunk.c) computed in nch row chunks, or NULL (*nchunks 0) when
 * it has none */
moe_graph *tcp_row_chunk_wide(moe_ctx *ctx, const moe_graph *g, uint32_t nch, uint32_t *nchunks);

/* weight packing (prep.c): the device graph (NULL when nothing is packed or
 * on error, see moe_error_count) and the prep graph as IR JSON (ctx_alloc'd);
 * dev_of (nnodes entries, or NULL) receives each node's id in the device graph
 * when one is made (MOE_NONE: not in it) */
moe_graph *tcp_split_weights(moe_ctx *ctx, const moe_graph *g, char **prep_json, size_t *prep_len, moe_id *dev_of);
/* prep.c: whether g's weights fit m's HBM; if not, the error (sizes and a
 * hint, at the largest weight) both emitters give before any placement */
bool tcp_weights_fit_hbm(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
/* prep.c: pack[i] (nnodes entries) for the values bound as packed weights: from
 * the tcp_pack marks, or by tcp-split-weights' rule when g carries none */
uint32_t tcp_packed_nodes(moe_ctx *ctx, const moe_graph *g, bool *pack);
/* gpass.c: the schedule compiler's graph (a block_loop kept) with the
 * structural passes its records say have not run for m (the pairings), the
 * einsums in canonical form and the fusion marks (a clone; NULL: none
 * needed, or an error) */
moe_graph *tcp_loop_graph_passes(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, moe_status *st);
/* einsum_canon.c: the tcp-einsum-canon pass on g (*changed: it rewrote g),
 * and whether g has an einsum it would rewrite */
moe_status tcp_einsum_canon(moe_ctx *ctx, moe_graph *g, bool *changed);
bool tcp_einsum_canon_needed(const moe_graph *g);
/* fp8_rows.c: the tcp-fp8-act-rows pass on g for machine m (tcp_fp8_rows on
 * every act=fp8 dequant pass_tcp_fp8_act_dequant accepts), and whether g has
 * such a dequant without the mark */
moe_status tcp_fp8_act_rows(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m);
bool tcp_fp8_act_rows_needed(const moe_graph *g);
/* plan_fusion.c: the tcp-plan-fusion pass on g for machine m */
moe_status tcp_plan_fusion(moe_ctx *ctx, moe_graph *g, const moe_tcp_machine *m);
/* ... the node whose fetched lane word is node id's value (a bitcast between
 * f32 and i32, a widening of bf16 to f32: their operand), or MOE_NONE */
moe_id tcp_lane_src(const moe_graph *g, moe_id id);
/* w8a8_act.c: the graph with a W8A8 layer's per-token activation quantization
 * moved out of its block_loop's body, computed once on x before the dispatch
 * (NULL: no block_loop of such a layer, or its values would not fit m's DM
 * grants, dmplan.h) */
moe_graph *tcp_w8a8_act_once(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
/* ... whether tok is iota(T K) / K (pair j's token j / K, token-major pairs); *K its K */
bool tcp_w8a8_tok_major(const moe_graph *g, moe_id tok, int64_t T, int64_t *K);
/* pair_gate_up.c: the graph with a bf16 / f32 (or W8A8) expert's gate and up
 * einsums in its block_loop's body contracted as one over their weights side
 * by side (NULL: no block_loop, no such pair, or unless the loop fits DM and
 * a block is no slower, tcp_loop_fits and tcp_loop_block_cycles) */
moe_graph *tcp_pair_gate_up(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
/* pair_down.c: the block_loop's pair and down in one packed weight per expert (one
 * DMA descriptor), only when it fits DM and a full block is bound by its fetch;
 * tcp_pack_experts: the same for a loop whose gate and up were not paired, its
 * projections' weights (biases apart) side by side */
moe_graph *tcp_pair_down(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
moe_graph *tcp_pack_experts(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
/* pair_down.c: where tcp-split-weights marked r before a merge, r's packed values
 * planned again by its rule (no mark: nothing done) */
void tcp_pack_marks_again(moe_ctx *ctx, moe_graph *r);
/* pack_bias.c: the block_loop's vector `e` operands of one type (an expert's
 * biases) as one operand, each expert's vectors side by side (one DMA command),
 * only when the merged loop fits DM and the expected block's fetch is shorter */
moe_graph *tcp_pack_bias(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
/* pair_gate_up.c: a merge of block_loop `loop`'s data operands ka < kb (both `e`;
 * tcp_loop_merge_n: the n operands ks[0] < ks[1] < ..., ka = ks[0]) into one operand at ka: `outer` emits the merged value in dev (before the
 * loop; MOE_NONE: failed), `views` runs in the new body nb when its blockarg q
 * is emitted (where the first of the two old blockargs was) and maps them in
 * bm, `body` (may be NULL) is offered every other body node j of ob first
 * (1: it emitted j, 0: copy j, -1: failed); skip_outer: a node of g read only
 * by the loop's old operands, dropped. NULL when it does not type. */
typedef struct tcp_loop_hooks {
	moe_id (*outer)(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, void *ud, const moe_id *map);
	bool (*views)(moe_ctx *ctx, moe_graph *nb, moe_id q, const moe_graph *ob, moe_id *bm, void *ud);
	int (*body)(moe_ctx *ctx, moe_graph *nb, const moe_graph *ob, moe_id j, moe_id q, moe_id *bm, void *ud);
	void *ud;
	moe_id skip_outer;
} tcp_loop_hooks;
moe_graph *tcp_loop_merge(moe_ctx *ctx, const moe_graph *g, moe_id loop, int ka, int kb, const tcp_loop_hooks *h);
moe_graph *tcp_loop_merge_n(moe_ctx *ctx, const moe_graph *g, moe_id loop, const int *ks, int n,
	const tcp_loop_hooks *h);
/* pair_down.c: the step of tcp_pack_experts and tcp_pack_bias. The first
 * block_loop of g with the operands `find` chooses (into a tcp_packed, which
 * the hooks h read as their ud) merged by tcp_loop_merge_n with h, kept
 * where `pays` finds the merged graph worth it, its pack marks planned
 * again (tcp_pack_marks_again); NULL where find or pays declines. */
enum { TCP_PACK_MAX = 8 };
typedef struct tcp_packed {
	int n, k[TCP_PACK_MAX];                  /* the loop operands, ascending */
	moe_id w[TCP_PACK_MAX], b[TCP_PACK_MAX]; /* in span order: outer operand, old blockarg */
	int64_t off[TCP_PACK_MAX + 1];           /* span offsets, elements */
} tcp_packed;
/* Operand n of p: outer w, blockarg b, loop operand k, len elements. */
void tcp_packed_add(tcp_packed *p, moe_id w, moe_id b, int k, int64_t len);
typedef struct tcp_pack_rule {
	bool (*find)(const moe_graph *g, moe_id loop, tcp_packed *p);
	bool (*pays)(const moe_graph *g, const moe_graph *r, const moe_tcp_machine *m);
	tcp_loop_hooks h; /* h.ud is set to the tcp_packed */
} tcp_pack_rule;
moe_graph *tcp_pack_loop(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const tcp_pack_rule *rule);
/* pair_gate_up.c: the pairings' decision on the graph's first block_loop (docs/tcp-compiler.md
 * 3, rule 3), without compiling the layer. tcp_loop_fits: its buffers, the expert operands
 * double-buffered whole and a block's values, fit m's DM (tcp_dm_fits on their summary).
 * tcp_loop_rows: its block rows B, or (expected) the rows a block holds on uniform
 * routing, ceil(T K / E) within [1, B]. tcp_loop_block_cycles: one block of `rows` rows on
 * the cost module: its contractions' cycles (tcp_plan_contract; -1: no loop), *fetch its
 * expert operands' fetches (one dma.copy each), *last the cycles of the contractions that
 * read the last operand fetched (the loop's drain after its last fetch). tcp_loop_blocks:
 * the blocks in use on uniform routing, min(T K, E) experts of ceil(rows / B) blocks,
 * at most G. */
bool tcp_loop_fits(const moe_graph *g, const moe_tcp_machine *m);
int64_t tcp_loop_rows(const moe_graph *g, bool expected);
int64_t tcp_loop_block_cycles(const moe_graph *g, const moe_tcp_machine *m, int64_t rows, int64_t *fetch,
	int64_t *last);
int64_t tcp_loop_blocks(const moe_graph *g);
/* pair_gate_up.c: the outer operand of `loop` that body blockarg v of body bg reads when v
 * reads an `e` operand given to the loop once (*k: its data operand index), else MOE_NONE */
moe_id tcp_loop_e_arg(const moe_graph *g, const ir_node *loop, const moe_graph *bg, moe_id v, int *k);
/* pair_gate_up.c: each node's read count, (nnodes + 1) entries, outputs counted twice (ctx_free it). */
uint32_t *tcp_use_counts(moe_ctx *ctx, const moe_graph *g);
/* pair_gate_up.c: a rewrite of g into a new graph: *dev an empty clone, the returned map
 * (nnodes + 1 entries, all MOE_NONE) from g's ids to dev's; tcp_rewrite_end adds the
 * outputs and node keys when ok and returns dev, else frees dev and returns NULL
 * (it frees the map either way). */
moe_id *tcp_rewrite_begin(moe_ctx *ctx, const moe_graph *g, moe_graph **dev);
moe_graph *tcp_rewrite_end(moe_ctx *ctx, moe_graph *dev, const moe_graph *g, moe_id *map, bool ok);

#endif
