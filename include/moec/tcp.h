/* moec/tcp.h: the TCP (RNGD) target: compile a lowered graph to a TCP
 * program, write it as assembly (.tcps) or binary (.tcpb), load and validate
 * a binary, and run it on the instruction-level simulator.
 *
 * moec models TCP after the public Virtual ISA (docs/tcp-isa.md); the cost
 * numbers come from a machine description with the fields of machine.json
 * (a copy is built in). */
#ifndef MOEC_TCP_H
#define MOEC_TCP_H

#include "moec/ir.h"
#include "moec/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_tcp_machine moe_tcp_machine;
typedef struct moe_tcp_program moe_tcp_program;

/* The built-in machine (the shipped machine.json). Free with moe_tcp_machine_free. */
MOE_API moe_tcp_machine *moe_tcp_machine_default(moe_ctx *ctx);
/* Registers the TCP target in ctx: its graph passes (tcp-w8a8-act-once,
 * tcp-pair-gate-up, tcp-pair-down, tcp-einsum-canon, tcp-plan-fusion: steps
 * of the `tcp` pipeline, on its block_loop, skipped where they are not
 * registered; moe_tcp_compile then runs the pairings, the einsums' canonical
 * form and the fusion marks itself) and its node attributes (tcp_pack, tcp_fuse, ...: IR
 * carrying them reads and verifies only in a context where the target is
 * registered). Registering twice is harmless. */
MOE_API moe_status moe_tcp_register_passes(moe_ctx *ctx);
/* The machine the TCP graph passes of ctx plan for (copied; NULL: the
 * built-in one, the default). Registers the passes if needed. A graph whose
 * passes planned for another machine than moe_tcp_compile's keeps its
 * rewrites (they preserve values) and has its fusion marks planned again. */
MOE_API moe_status moe_tcp_set_pass_machine(moe_ctx *ctx, const moe_tcp_machine *m);
/* Parse a machine JSON text / file; NULL with a diagnostic naming the bad field. */
MOE_API moe_tcp_machine *moe_tcp_machine_parse(moe_ctx *ctx, const char *file, const char *text, size_t len);
MOE_API moe_tcp_machine *moe_tcp_machine_load(moe_ctx *ctx, const char *path);
MOE_API void moe_tcp_machine_free(moe_ctx *ctx, moe_tcp_machine *m);

/* Compile one graph that went through the `tcp` pipeline with the schedule
 * compiler (moe_tcp_compile_sched with every rewrite by its benefit), after
 * running on a clone the TCP graph passes the graph lacks for machine (the
 * pairings when their records are missing, the fusion marks when they were
 * not planned for machine: a graph lowered in a context without the target
 * registered compiles to the same program). machine may be NULL (the
 * default); the program stays runnable on any machine whose capacities it
 * fits. */
MOE_API moe_tcp_program *moe_tcp_compile(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine);
/* `--quant-act`: the activations' type of block-FP8 experts' contractions
 * (docs/tcp-isa.md 7.10). act "fp8" sets act="fp8" on every dequant of m
 * that holds fp8 in 128 x 128 blocks dividing its rows and columns (the
 * weights TCP contracts fp8 x fp8); "bf16" changes nothing. Either way m
 * must have such a dequant: else MOE_ERR_INVALID with a diagnostic naming
 * its quantized formats (at the first one's dequant, else at file). Call it
 * on the parsed module, before the `tcp` pipeline. */
MOE_API moe_status moe_tcp_quant_act(moe_ctx *ctx, moe_module *m, const char *act, const char *file);
/* The schedule compiler (docs/tcp-compiler.md sections 4-5; `moec compile --target=tcp`):
 * g, after the `tcp` pipeline (its block_loop kept), built into a schedule,
 * rewritten (the rewrite table, 5.2), verified and selected into a program for
 * machine (NULL: the default). opts switches rewrites as `--tcp-opt` does:
 * "-NAME,+NAME,..." (-: off; +: on whatever its predicted benefit, where it
 * applies), NULL or "": every rewrite by its benefit; an unknown name is an
 * error naming it and the known ones. NULL with a diagnostic, also at the node
 * it does not lower yet (docs/tcp-compiler.md 5.1 lists them). */
MOE_API moe_tcp_program *moe_tcp_compile_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine,
	const char *opts);
/* The same schedule, verified, printed as text (.tsched, docs/tcp-compiler.md 4.2) to
 * path ("-": stdout; a file is written to a temporary renamed into place), which
 * moe_tcp_from_sched reads back into the same program. Its `rewrites` line names
 * the rewrites that ran. */
MOE_API moe_status moe_tcp_emit_sched(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine,
	const char *opts, const char *path);
/* Row i of the schedule compiler's rewrite table (`moec passes` lists them): 1
 * and its name and one-line summary (either pointer may be NULL), or 0 past the
 * last row. */
MOE_API int moe_tcp_rewrite_info(uint32_t i, const char **name, const char **summary);
MOE_API void moe_tcp_program_free(moe_tcp_program *p);

/* block=auto: the block size B of the expert grid for layer g (before the
 * pipeline; its experts op, with --quant-act's marks when it runs with them)
 * on machine (NULL: the default); 0 when g has no experts op. A model of the
 * block loop ranks the candidates (T below 8, then 8, 16, 32, 48, 64, 96,
 * 128, 192 and multiples of 16 from 256 to 1024 whose buffers fit); its pick
 * is built by the schedule compiler (the `tcp` pipeline on a clone, with the
 * pass machine of ctx) and priced on the schedule's timeline, halved until
 * it builds and places, and for packed weights halved while the predicted
 * time stays near the best (docs/tcp-compiler.md 6.1). *predicted_s (may be
 * NULL): the predicted time of the layer's schedule at that B before the
 * rewrites, on expected loads, or the model's block-loop time when no
 * candidate builds. The trials' diagnostics are dropped. */
MOE_API int64_t moe_tcp_auto_block(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine,
	double *predicted_s);

/* Writers (temporary name + rename: no half-written file on failure). */
MOE_API moe_status moe_tcp_write_asm(moe_ctx *ctx, const moe_tcp_program *p, const char *path);
MOE_API moe_status moe_tcp_write_binary(moe_ctx *ctx, const moe_tcp_program *p, const char *path);
/* In-memory forms; *out is malloc'd (free with moe_free). */
MOE_API moe_status moe_tcp_to_asm(moe_ctx *ctx, const moe_tcp_program *p, char **out, size_t *len);
MOE_API moe_status moe_tcp_to_binary(moe_ctx *ctx, const moe_tcp_program *p, uint8_t **out, size_t *len);

/* Readers. The binary is validated completely (magic, version, checksum,
 * section bounds, every tensor, address, length, register, step and branch
 * target that can be checked statically, capacities against machine or the
 * default) before a program is returned; NULL plus diagnostics otherwise. */
MOE_API moe_tcp_program *moe_tcp_from_binary(moe_ctx *ctx, const char *file, const uint8_t *buf, size_t len,
	const moe_tcp_machine *machine);
MOE_API moe_tcp_program *moe_tcp_load_binary(moe_ctx *ctx, const char *path, const moe_tcp_machine *machine);
MOE_API moe_tcp_program *moe_tcp_from_asm(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const moe_tcp_machine *machine);
/* A schedule's text form (.tsched, docs/tcp-compiler.md 4.2) read, verified,
 * placed and selected into a program (docs/tcp-compiler.md 5.5), validated
 * against machine (NULL: the default); NULL plus `file:line:col` diagnostics
 * otherwise. */
MOE_API moe_tcp_program *moe_tcp_from_sched(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const moe_tcp_machine *machine);

/* A serving program with a decode tier (docs/tcp-isa.md section 7.4, "Decode tier"): the
 * serving program (an n_tokens input, T > 1) and the same layer compiled for
 * T = 1 without n_tokens, linked into one program whose first instructions
 * stage n_tokens and run the T = 1 code when it is 1, the serving code
 * otherwise. The versions share the bound tensors (the tier reads row 0 of
 * x and writes row 0 of the output). NULL plus an error when tier is not
 * such a program of the same layer; NULL plus only a note when the two
 * pack their weights differently (a quantized layer whose packing follows
 * the block size), which leaves the serving program to run alone. The
 * arguments stay the caller's. */
MOE_API moe_tcp_program *moe_tcp_link_tier(moe_ctx *ctx, const moe_tcp_program *serving, const moe_tcp_program *tier);

/* A bucketed .tcpb (docs/tcp-isa.md section 8.1): one program per token
 * bucket T_1 < T_2 < ... (each with an n_tokens input), equal sections
 * stored once. Writing takes the programs in increasing T (at most 16).
 * Loading checks the index checksum and loads every bucket as
 * moe_tcp_from_binary does (its checksum, full validation): any corrupt
 * bucket rejects the file. pick: the smallest bucket with T >= n, or -1. */
typedef struct moe_tcp_bundle moe_tcp_bundle;
MOE_API moe_status moe_tcp_bundle_write(moe_ctx *ctx, const moe_tcp_program *const *progs, const int64_t *T,
	uint32_t n, const char *path);
MOE_API moe_tcp_bundle *moe_tcp_bundle_from_binary(moe_ctx *ctx, const char *file, const uint8_t *buf, size_t len,
	const moe_tcp_machine *machine);
MOE_API moe_tcp_bundle *moe_tcp_bundle_load(moe_ctx *ctx, const char *path, const moe_tcp_machine *machine);
MOE_API void moe_tcp_bundle_free(moe_tcp_bundle *b);
MOE_API uint32_t moe_tcp_bundle_count(const moe_tcp_bundle *b);
MOE_API int64_t moe_tcp_bundle_tokens(const moe_tcp_bundle *b, uint32_t i);
MOE_API const moe_tcp_program *moe_tcp_bundle_program(const moe_tcp_bundle *b, uint32_t i);
MOE_API int moe_tcp_bundle_pick(const moe_tcp_bundle *b, int64_t n);
/* True when buf holds a bucketed .tcpb (by its header). */
MOE_API int moe_tcp_is_bundle(const uint8_t *buf, size_t len);

/* What a program binds, as a module with one graph of leaves: an `input`
 * node per program input and a `weight` node per checkpoint weight it needs
 * (name, dtype, shape and the checkpoint `source`, {e} per expert), the
 * weights read by its weight-packing graph included. Feed it to
 * moe_weights_load and bind inputs by name, then moe_tcp_run. NULL plus a
 * diagnostic when a weight has no recorded source. */
MOE_API moe_module *moe_tcp_interface(moe_ctx *ctx, const moe_tcp_program *p);

/* The HBM a compiled program places: *total the bytes up to the end of its
 * last HBM tensor (what the lowering checks against the machine's HBM),
 * *weights those of its weights and packed weights; and the machine's HBM
 * capacity in bytes (m NULL: the built-in RNGD's). */
MOE_API void moe_tcp_program_hbm(const moe_tcp_program *p, int64_t *total, int64_t *weights);
MOE_API double moe_tcp_machine_hbm_capacity(moe_ctx *ctx, const moe_tcp_machine *m);

/* Summary for `moec check`: version, sections, tensors, instruction counts. */
MOE_API moe_status moe_tcp_print_summary(const moe_tcp_program *p, FILE *out);

/* ---- running ---- */
enum { MOE_TCP_ENGINE_CONTROL, MOE_TCP_ENGINE_MAIN, MOE_TCP_ENGINE_SUB, MOE_TCP_ENGINE_DMA,
	MOE_TCP_ENGINE_CONTRACTION, MOE_TCP_ENGINE_VECTOR, MOE_TCP_NENGINES };
MOE_API const char *moe_tcp_engine_name(int engine);

typedef struct moe_tcp_stats {
	double simulated_seconds;
	double roofline_seconds; /* docs/tcp-model.md section 7 */
	double roofline_ratio;   /* simulated / roofline */
	int64_t cycles;
	int64_t busy_cycles[MOE_TCP_NENGINES];
	int64_t hbm_read_bytes, hbm_write_bytes;
	int64_t blocks_executed, blocks_skipped, blocks_max;
	int64_t commands, instructions;
	int64_t experts_hit;
	double flops; /* needed multiply-adds x 2 */
	/* Routing (router, top-k, index generation, dispatch and combine: every
	 * command outside the block loop) against expert work (the block loop and
	 * the fetch of its first block). */
	double expert_seconds;  /* wall time with at least one expert command in flight */
	double routing_seconds; /* simulated_seconds - expert_seconds: routing not hidden under expert work */
	int64_t routing_busy_cycles[MOE_TCP_NENGINES]; /* the busy cycles of routing commands (control: 0) */
	int timing_only;        /* the run was timing-only (its outputs were not computed) */
	double expert_start_seconds; /* when the first expert command starts (0: none ran) */
} moe_tcp_stats;

typedef struct moe_tcp_run_opts {
	const moe_tcp_machine *machine; /* NULL: the built-in default */
	int no_skip;                    /* run every block of the worst-case grid */
	const char *trace_path;         /* Chrome trace-event JSON, or NULL */
	int timing_only;                /* cycle counts only; outputs are not computed */
	/* For a progress display (NULL: none): called before each command
	 * outside the block loop with phase "routing" (before the loop) or
	 * "combine" (after it) and done/total counting those commands' positions
	 * in the program, and at each block with phase "blocks" and the blocks
	 * run / the run-time block count (the worst-case grid until the program
	 * loads it). Cheap calls; the caller throttles. */
	void (*progress)(void *ud, const char *phase, int64_t done, int64_t total);
	void *progress_ud;
	/* The checkpoint the weights were loaded from, or NULL. Given, weights
	 * bound without data that moe_weights_load_ex deferred
	 * (MOE_WEIGHTS_DEFER: per-expert weights) are read from it an expert at
	 * a time when the run first reads that expert, and the packed weights
	 * computed from them are packed an expert at a time likewise: a run
	 * holds only the experts it touches. It must stay open for the run. */
	struct moe_checkpoint *lazy_weights;
	/* NULL, or loads to fill with what the run's block-loop staging wrote
	 * (moe_tcp_loads below): the observed loads to predict the run with
	 * (moe_tcp_predict). The caller releases them with moe_tcp_loads_free. */
	struct moe_tcp_loads *observed;
	/* The rewrites moe_tcp_ep_run and moe_tcp_ep_compile_ex compile each
	 * phase with (moe_tcp_compile_sched's opts; the chips' local experts a
	 * block_loop: expert-parallel{loop=1}). moe_tcp_run ignores it. */
	const char *sched_opts;
	/* 0 (the default): a command waits for every conflicting access (RAW,
	 * WAR, WAW) of its space (DM, TRF, VRF) to the same per-slice bytes,
	 * whatever the tensor, as the chip runs it; nonzero: accesses are
	 * ordered per tensor only (`moec run --sim-order=tensor`), optimistic
	 * where a program reuses bytes without ordering the reuse
	 * (docs/tcp-isa.md section 2). */
	int order_tensor;
} moe_tcp_run_opts;

/* Bind inputs by input name and weights by weight name from bind, run, and
 * return the outputs (out[0..moe_tcp_num_outputs-1], caller frees) and stats.
 * Faults (an index out of range, a DM overflow) are diagnostics and
 * MOE_ERR_RUNTIME; out may be NULL with timing_only. */
MOE_API moe_status moe_tcp_run(moe_ctx *ctx, const moe_tcp_program *p, const moe_tensor_map *bind,
	const moe_tcp_run_opts *opts, moe_tensor **out, moe_tcp_stats *stats);
MOE_API uint32_t moe_tcp_num_outputs(const moe_tcp_program *p);
/* Stats as a JSON object (malloc'd; moe_free). */
MOE_API char *moe_tcp_stats_json(moe_ctx *ctx, const moe_tcp_stats *s);

/* ---- expert parallelism on N simulated chips (docs/expert-parallel.md) ----
 * g[d] is chip d's program from the expert-parallel pass (and the rest of the
 * pipeline), bind[d] its inputs and weights. The programs are cut at their
 * all_to_all nodes into phases run on the simulator chip by chip, the chips
 * advancing together; the exchanges move rows in memory and are costed by the
 * machine's interconnect (latency + max(bytes out, bytes in) / bandwidth per
 * chip). out[d] receives chip d's outputs (caller frees). With
 * ro->timing_only, phases whose weights are all bound with data (routing,
 * combine) run in full so that the exchanges carry the real counts, the
 * others are timed only, and the outputs are not meaningful. ro->trace_path
 * writes one Chrome trace of all chips (a process per chip, the phases and
 * links on one clock). */
#define MOE_TCP_EP_MAX 64
#define MOE_TCP_EP_MAX_ROUNDS 8
/* One exchange round (the all_to_alls after a phase) measured end to end
 * along the critical path against its bound (docs/expert-parallel.md
 * section 6): pack = the time the packing commands (the DMA gathers,
 * scatters and copies that assemble and write out the send buffers) add to
 * the critical path of the phase on the chip that ends it last, pack_span =
 * from its first packing command to the phase's end (packing overlaps
 * routing there); link = the round's link time; unpack = the most the
 * commands that read received rows into DM add to the critical path of the
 * next phase on any chip (unpack_sum: their summed durations, an upper bound
 * that counts what overlaps other work). A command adds to a phase's
 * critical path its end less the later of its start and the end of the
 * command that released it (the simulator's hazards and contexts). The
 * bound is the sum over the round's exchanges of latency + max(bytes out,
 * bytes in) / bandwidth on the busiest chip. wait = the longest any chip
 * waits for the last one (load imbalance, not counted in seconds). */
typedef struct moe_tcp_ep_round {
	int chip, exchanges;           /* chip: the one that ends the phase last */
	int64_t bytes_out, bytes_in;   /* the busiest chip's, over the round */
	double bound_seconds;
	double pack_seconds, pack_span_seconds, link_seconds, unpack_seconds, unpack_sum_seconds, wait_seconds;
	double seconds;                /* pack + link + unpack */
} moe_tcp_ep_round;
typedef struct moe_tcp_ep_stats {
	int ep, exchanges;
	double simulated_seconds; /* compute_seconds + link_seconds */
	double compute_seconds;   /* sum over phases of the slowest chip */
	double link_seconds;      /* sum over exchanges of the slowest chip's link */
	double link_bytes_per_s, link_latency_s;
	double chip_seconds[MOE_TCP_EP_MAX], chip_link_seconds[MOE_TCP_EP_MAX];
	int64_t chip_link_bytes_out[MOE_TCP_EP_MAX], chip_link_bytes_in[MOE_TCP_EP_MAX];
	int rounds;
	moe_tcp_ep_round round[MOE_TCP_EP_MAX_ROUNDS];
} moe_tcp_ep_stats;
MOE_API moe_status moe_tcp_ep_run(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tensor_map *const *bind,
	const moe_tcp_run_opts *ro, moe_tensor **const *out, moe_tcp_ep_stats *stats);
/* Compiles the phases moe_tcp_ep_run runs: sink gets, chip by chip and phase
 * by phase, the program (NULL for a phase with nothing to compute on that
 * chip) and the node of chip's program g[chip] that each of its outputs
 * output<j> holds (outputs[j]). A phase program's inputs are named after the
 * node they hold, "ep.<id>": a value of an earlier phase or an all_to_all's
 * result; its weights and the layer input keep their names. A non-MOE_OK
 * return from sink stops and is returned. */
typedef moe_status (*moe_tcp_ep_sink)(void *ud, int chip, int phase, const moe_tcp_program *p, const moe_id *outputs,
	uint32_t noutputs);
MOE_API moe_status moe_tcp_ep_compile(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tcp_machine *machine,
	moe_tcp_ep_sink sink, void *ud);
/* The same with the machine and the emitter of opts (opts->machine,
 * opts->sched_opts; the rest is unused). */
MOE_API moe_status moe_tcp_ep_compile_ex(moe_ctx *ctx, int ep, const moe_graph *const *g, const moe_tcp_run_opts *opts,
	moe_tcp_ep_sink sink, void *ud);

/* ---- prediction: the simulator's timeline without data (docs/api.md) ----
 * The loads of a program's block loop: what its staging command (the dma.spm
 * before the loop, docs/tcp-isa.md section 7) writes for the control path to
 * read: the run-time block count and, per block of the grid (G entries, the
 * staged command's length), its expert and its valid rows. */
typedef struct moe_tcp_loads {
	int64_t grid;          /* entries of the arrays: the staged grid G */
	int64_t nblocks;       /* the run-time block count (the compile-time one of a decode grid) */
	int32_t *block_expert; /* [grid] the expert of block g (entries past nblocks as staged) */
	int32_t *block_rows;   /* [grid] block g's valid rows, or NULL (a decode grid: one row each) */
	int64_t n_tokens;      /* a serving program's n_tokens input; -1: none (T) */
	int stagings;          /* observed: how many staging commands the run executed */
} moe_tcp_loads;
/* Releases the arrays of loads filled by a run (moe_tcp_run_opts.observed);
 * the struct itself is the caller's. */
MOE_API void moe_tcp_loads_free(moe_ctx *ctx, moe_tcp_loads *loads);

typedef struct moe_tcp_prediction {
	moe_tcp_stats stats;     /* as a run's: simulated_seconds is the predicted time */
	double seconds;          /* = stats.simulated_seconds */
	int64_t nblocks;         /* the block count predicted with */
	/* reads whose values no load gives (an ld of another tensor, an index
	 * list of a gather or scatter): approximated by the rules of docs/api.md */
	int64_t approximated_lds, approximated_index_lists;
} moe_tcp_prediction;
/* Predicts program p's time on machine m (NULL: the default) by running
 * its commands on the simulator's own timeline and cost rules without data:
 * no tensor storage, no arithmetic. The block loop's staging writes `loads`
 * (checked against the staged grid), or with loads NULL the expected loads:
 * each of the program's T tokens (n_tokens for a serving program) picks K
 * distinct experts by a fixed seeded generator, blocks in expert order.
 * A program that stages a block loop twice in one run with caller loads is
 * refused (MOE_ERR_UNSUPPORTED with a diagnostic). */
MOE_API moe_status moe_tcp_predict(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m,
	const moe_tcp_loads *loads, moe_tcp_prediction *out);
/* moe_tcp_predict timing the accesses in a run's order: order_bytes
 * nonzero orders accesses of tensors sharing per-slice bytes too (a run
 * with moe_tcp_run_opts.order_tensor 0), 0 orders them per tensor only;
 * moe_tcp_predict is order_bytes 1. */
MOE_API moe_status moe_tcp_predict_order(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m,
	const moe_tcp_loads *loads, int order_bytes, moe_tcp_prediction *out);

/* ---- the contract's floor (docs/tcp-isa.md section 12) ----
 * A lower bound on the time of every correct program of p's layer under the
 * machine contract, for one routing outcome: launch and end plus the largest
 * of four terms, each counting only work the contract forces, at the most
 * favourable rate it allows. Not a property of p's schedule: p gives only the
 * layer's dimensions, its dtype, the bytes of an expert's weights as stored in
 * HBM, the bytes outside the block loop, and the fastest contraction it uses. */
typedef struct moe_tcp_floor_terms {
	double seconds;            /* launch_end_seconds + the largest term */
	double launch_end_seconds; /* assumed.kernel_launch_cycles + kernel_end_cycles */
	double roofline_seconds;   /* R1: max(MACs / MAC rate, bytes / DMA rate) */
	double chain_seconds;      /* R2: max(routing chain, every input byte in DM) + one command + y's setup */
	double route_seconds;      /* R2's routing chain: x in DM, router contraction, selection pass */
	double dma_seconds;        /* R3: the DMA context's setups and every HBM byte */
	double main_seconds;       /* R4: the main context's MACs, vector elements and commands */
	int binding;               /* the largest term: 0 R1, 1 R2, 2 R3, 3 R4 */
	int expected;              /* 1: experts_hit is uniform routing's expectation */
	int64_t tokens;            /* the tokens routed */
	double experts_hit;        /* as given, or E (1 - (1 - K/E)^tokens) */
	double weight_bytes;       /* W: experts_hit x an expert's stored weight bytes */
	double other_bytes;        /* X: x, y and the weights outside the block loop */
	double macs, mac_rate;     /* multiply-adds and the chip's MACs per cycle */
	double vector_elements;    /* activations and routing scores the vector engine must produce */
	int64_t dma_commands, main_commands; /* the fewest each context can run */
} moe_tcp_floor_terms;
/* The floor of program p on machine (NULL: the built-in one) for `tokens`
 * tokens (<= 0: the program's T; a serving program's n_tokens otherwise) and
 * experts_hit distinct experts hit (< 0: the expectation under uniform
 * routing). MOE_ERR_UNSUPPORTED, without a diagnostic, for a program
 * without an experts op (it has no floor); MOE_ERR_INVALID with a diagnostic
 * for more tokens than p holds or more experts hit than the tokens reach. */
MOE_API moe_status moe_tcp_floor(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *machine, int64_t tokens,
	double experts_hit, moe_tcp_floor_terms *out);

#ifdef __cplusplus
}
#endif
#endif
