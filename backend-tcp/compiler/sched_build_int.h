/* backend-tcp/compiler/sched_build_int.h: what sched_build.c and its recipes
 * (recipe_*.c) share: the build context, the value of each graph node, and the
 * helpers that add buffers and ops with their dependencies. Only sched-build's
 * files include it. */
#ifndef MOEC_TCP_SCHED_BUILD_INT_H
#define MOEC_TCP_SCHED_BUILD_INT_H

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/sched.h"
#include "backend-tcp/compiler/sched_build.h"
#include "backend-tcp/compiler/tcp_compile.h"
#include "backend-tcp/isa/build.h"
#include "ir/ir.h"

/* Where a node's value is: a splat immediate (a lane word), an iota along
 * one axis (the pass's loop counter), or a view of a buffer (node dim k
 * steps stride[k] elements; reg: a scalar offset times scale, TS_NONE). */
enum { SV_NONE, SV_IMM, SV_IOTA, SV_VIEW };
typedef struct sb_val {
	uint8_t kind;
	int axis;
	uint32_t imm;
	ts_id buf, reg;
	int64_t base, scale;
	int64_t stride[MOE_MAX_RANK];
} sb_val;

/* One control value of a block loop: a const scalar, or an SPM-staged i32
 * view read at an index. */
typedef struct ctl {
	bool imm;
	uint32_t k;
	sb_val v;
} ctl;

/* Per buffer: the last op that wrote it and the ops that read it since. */
typedef struct sb_track {
	ts_id w;
	ts_id *rd;
	uint32_t nrd, crd;
} sb_track;

typedef struct sb {
	moe_ctx *ctx;
	tcp_sched *s;
	const moe_tcp_machine *m;
	const moe_graph *g;  /* the graph being built: the layer, or a loop's body */
	sb_val *v;           /* g's values, one per node */
	sb_val *dmv;         /* per node: its DM copy once made (kind SV_NONE: none) */
	ts_id rg;            /* the region ops are appended to */
	int phase;
	int64_t S;           /* slices */
	sb_track *tr;
	uint32_t ntr;
	ts_id rows;          /* in a loop body: the block's valid rows scalar; else TS_NONE */
	ctl ctl[2];          /* the block loop being built: its experts and rows */
	uint8_t weights, ring; /* the loop's weights mode (ts_weights) and ring, as planned */
	ts_wdemand wd;       /* what the loop's weights need, for the planner */
	int64_t tile_bytes;  /* streamed: the ring slot's bytes (the planner's demand) */
	ts_id wring;         /* streamed: the loop's ring of weight tiles, TS_NONE until made */
	uint32_t wnext;      /* its next slot, counted over the body's tiles */
	ts_id wrd[TS_MAX_RING]; /* per ring slot: the sub load that last read it */
	uint8_t trf_next;    /* the TRF half the next contraction's first tile takes */
	ts_id trf_last[2];   /* the last contraction's TRF tiles when they fit a half, else TS_NONE */
	bool top_stream;     /* the top graph's contractions read their weights from HBM through rings */
	const moe_graph *top; /* the layer's graph (g is a loop's body while it is built) */
	const moe_id *hbm;   /* the top graph's spillable nodes kept in HBM (the planner's) */
	uint32_t nhbm;
	ts_id *vcount;       /* per top graph node: the scalar of it as a valid count, TS_NONE */
	bool failed;
} sb;

#define SBN(b, id) (&(b)->g->nodes[id])

/* recipe_contract.c: a contraction's TRF tiles (two when it loads more than one) of
 * shape sh = {Opass, It} with os TRF rows per slice; it sizes their footprint per slice */
void sb_trf_tiles(sb *b, moe_id id, int64_t nload, int64_t os, moe_dtype dt, const int64_t sh[2], ts_id *trf);
/* after a loop body (its buffers from nbuf0 on) is built: its last contraction's tiles
 * take the half its first does not begin with, where they can */
void sb_trf_wrap(sb *b, ts_id nbuf0);

/* sched_build.c */
void sb_err(sb *b, moe_id at, const char *fmt, ...) MOE_PRINTF(3, 4);
/* "the schedule compiler does not lower WHAT yet" at node at */
void sb_refuse(sb *b, moe_id at, const char *what);
void sb_spread(sb *b, ts_id buf);  /* its layout, from its shape and slots */
ts_id sb_dm_buf(sb *b, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape);
ts_id sb_hbm_buf(sb *b, moe_id at, const char *name, int kind, moe_dtype dt, int rank, const int64_t *shape);
/* Appends in (views naming buffers and scalars) to the current region, with a
 * dependency on every earlier op whose access of the same buffers conflicts. */
ts_id sb_emit(sb *b, const tcp_insn *in, moe_id at);
sb_val sb_view_of(ts_id buf, const ir_node *n);     /* contiguous, base 0 */
bool sb_contig(const sb_val *v, const ir_node *n);
tcp_view sb_mkview(const sb_val *v, const ir_node *n, int ndim, const int *map);
/* a view of v from element base (past v's own) with strides st[0..nd), the rest 0 */
tcp_view sb_view_at(const sb_val *v, int64_t base, int nd, const int64_t *st);
int sb_axis(const ir_node *n, const ir_node *src, int64_t def);
uint32_t sb_imm_of(moe_dtype dt, double v);
/* node id's value in DM (an immediate or iota materialized, an HBM value
 * copied), or NULL after an error */
sb_val *sb_dm_val(sb *b, moe_id id);
/* node id's output: a fresh contiguous DM buffer */
sb_val *sb_out_val(sb *b, moe_id id);

/* recipe_vec.c */
void sb_elem(sb *b, moe_id id);
/* Fusion groups (tcp_fuse, recipe_vec.c): whether node id is computed in its
 * group's pass (not its last node); the chain of group r's nodes before r
 * (r a reduce) as streams and steps of `in`, whose iteration dimension k is
 * dimension pmap[k] of `shape`, false with a diagnostic when the marks are
 * not such a chain. */
bool sb_fused_member(const sb *b, moe_id id);
/* a cast of bf16 to f32 marked tcp_view: a widened einsum's operand, not built */
bool sb_widened_operand(const sb *b, moe_id id);
bool sb_chain_into(sb *b, moe_id r, const ir_node *shape, const int *pmap, tcp_insn *in);
void sb_materialize(sb *b, moe_id id);
sb_val *sb_copy_contig(sb *b, moe_id id);
void sb_concat(sb *b, moe_id id);
/* recipe_reduce.c */
void sb_reduce(sb *b, moe_id id);
void sb_cumsum(sb *b, moe_id id);
void sb_filter(sb *b, moe_id id);
void sb_one_hot(sb *b, moe_id id);
void sb_softmax(sb *b, moe_id id);
/* recipe_contract.c */
void sb_einsum(sb *b, moe_id id);
/* recipe_quant.c */
void sb_dequant(sb *b, moe_id id);
/* recipe_qact.c: whether dequant d's activations are quantized (act other
 * than bf16; *act: its act); the block einsum id over such a dequant, true
 * when it is one (built, or refused with a diagnostic) */
bool sb_qact_dequant(const sb *b, moe_id d, const char **act);
bool sb_qact_einsum(sb *b, moe_id id);
/* Whether node id belongs to a W8A8 activation's quantization chain, which
 * the einsums reading it compute from its rows themselves, or (outside the
 * loop) to the layer input's quantization, built at its last node: not built. */
bool sb_qact_skip(sb *b, moe_id id);
/* Whether loop operand k (an expert operand) of block loop `loop` with body
 * bg is an act=fp8 dequant's scales staged whole: copied into DM once, in
 * the current region, by the first call (out NULL, before the loop); *out
 * its row $e in place. True also after an error (b->failed). */
bool sb_qact_stage(sb *b, const moe_graph *bg, moe_id loop, uint32_t k, ts_id e, sb_val *out);
/* recipe_qgather.c: sb_qact_stage's scales w gathered by the block list in
 * the loop's prologue at few blocks (*out: row $g); false where not */
bool sb_qact_gather(sb *b, moe_id loop, moe_id w, ts_id e, sb_val *out);
/* recipe_route.c */
/* Whether node id of the top graph is a spill the planner keeps in HBM. */
bool sb_in_hbm(const sb *b, moe_id id);
void sb_gather(sb *b, moe_id id);
void sb_take_along(sb *b, moe_id id);
/* After node id is built: a spillable value recorded for the planner, or
 * copied to HBM when the planner keeps it there. */
void sb_spill_value(sb *b, moe_id id);
void sb_scatter(sb *b, moe_id id);
/* recipe_view.c */
void sb_view_op(sb *b, moe_id id);
/* recipe_serving.c */
/* The scalar counting the rows node id computes (its valid mask), TS_NONE
 * when it has none (or after a diagnostic): the block's rows in a loop body,
 * a scalar count of the layer's graph outside it (made once per count). */
ts_id sb_valid(sb *b, moe_id id);
/* count less off (a part of the rows starting at row off), an alu scalar */
ts_id sb_valid_less(sb *b, moe_id id, ts_id count, int64_t off);
/* recipe_loop.c */
void sb_block_loop(sb *b, moe_id id);
/* sched_build.c: build every node of b->g in node order */
void sb_build_nodes(sb *b);

#endif
