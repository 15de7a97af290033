/* backend-tcp/isa/tcp_int.h: moec's TCP model inside the library: the machine
 * description, the instruction set, programs, the binary container, the
 * lowering and the simulator. docs/tcp-isa.md is the contract for all of it. */
#ifndef MOEC_TCP_INT_H
#define MOEC_TCP_INT_H

#include <stdbool.h>

#include "ir/graph_keys.h"
#include "ir/ir.h"
#include "moec/tcp.h"

/* ---- machine description (fields of machine.json) ---- */
struct moe_tcp_machine {
	char name[96];
	double clock_hz;
	int64_t clusters, slices_per_cluster, lanes_per_slice, flit_bytes;
	double hbm_bytes, hbm_bytes_per_s; /* one pool shared by reads and writes */
	int64_t hbm_granule;
	double hbm_unaligned_read, hbm_unaligned_write;
	double hbm_no_stack_bit;     /* a pattern that never toggles address bit 8 */
	int64_t hbm_row_conflict;    /* cycles per request that switches rows in its bank */
	int64_t dm_bytes_per_slice, dm_bytes_per_cycle, dm_banks, dm_align, trf_bytes_per_lane, vrf_bytes_per_slice;
	int64_t dmns_per_cluster, dmn_bytes_per_cycle, dm_max_same_bank;
	double dm_misaligned_write; /* a DM write run not 8 B aligned: its write time x this */
	int64_t mac_bytes_per_lane;
	int64_t macs_per_lane[4]; /* TCP_MT_* */
	int64_t tree_latency[4];
	int64_t stream_bytes_per_cycle;
	double peak_ops[4];
	int64_t vec_int_rate, vec_float_rate, alu_latency, inter_slice_reduce;
	int64_t float_alus; /* bit k: ALU k of TCP_FALU_* present */
	int64_t fetch_bytes, max_streams, sub_read_bytes, sub_write_bytes;
	int64_t switch_bytes_per_cycle, max_ring;
	int64_t dma_queues, dma_engines, dma_bytes_per_cycle, dma_setup, dma_max_packet, dma_request, hbm2hbm_engines;
	int64_t index_bytes_per_pe;
	bool dm_to_dm_serialized, setup_overlaps, unscaled_scatter;
	int64_t pcie_bytes_per_cycle;
	double link_bytes_per_s, link_latency_s; /* interconnect (assumed) */
	/* assumed */
	int64_t issue_cycles, scalar_cycles, branch_cycles, row_overhead, fill_drain, launch_cycles, end_cycles;
	bool sub_switch_concurrent;
};
enum { TCP_MT_BF16, TCP_MT_F8, TCP_MT_I8, TCP_MT_I4 };
/* the float cluster's ALUs (vector.float_alus), each usable once per pass */
enum { TCP_FALU_FMA, TCP_FALU_FPU, TCP_FALU_EXP, TCP_FALU_MUL0, TCP_FALU_MUL1, TCP_NFALU };
int64_t tcp_slices(const moe_tcp_machine *m);
int64_t tcp_trf_bytes(const moe_tcp_machine *m); /* per slice */
/* DMNs per cluster as the machine has them (at most one per slice) and
 * slices per DMN */
int64_t tcp_dmns_per_cluster(const moe_tcp_machine *m);
int64_t tcp_slices_per_dmn(const moe_tcp_machine *m);
/* Cycles of a sub-context load of `fp` bytes per slice of which the slice's
 * own DM holds `own` (docs/tcp-model.md, sub-context loads), without issue
 * and fill/drain. */
int64_t tcp_sub_load_cycles(const moe_tcp_machine *m, int64_t fp, int64_t own);
extern const char tcp_default_machine_json[];

/* ---- memory spaces and tensors ---- */
enum { TCP_HBM, TCP_DM, TCP_TRF, TCP_VRF, TCP_NSPACE };
/* TCP_T_PACKED: a weight computed from the bound weights by the program's
 * weight-packing graph when it is bound (prep.c), then read like a weight. */
enum { TCP_T_SCRATCH, TCP_T_INPUT, TCP_T_WEIGHT, TCP_T_OUTPUT, TCP_T_CONST, TCP_T_PACKED, TCP_NKIND };
extern const char *const tcp_kind_names[TCP_NKIND];
enum { TCP_MAXD = 8, TCP_NREG = 32, TCP_NTOK = 16, TCP_MAXSTEP = 6 };

typedef struct tcp_tensor {
	char *name;      /* binding name (input/weight/output) or a debug name */
	char *source;    /* weights: checkpoint tensor name, {layer} resolved, {e} per expert; "" otherwise */
	uint8_t space;   /* TCP_HBM .. */
	uint8_t kind;    /* TCP_T_* */
	uint8_t dtype;   /* moe_dtype */
	uint8_t rank;
	int64_t shape[MOE_MAX_RANK]; /* the logical shape (binding checks it) */
	int64_t numel;
	int64_t addr;       /* HBM: byte address; DM/TRF/VRF: byte offset inside every slice */
	int64_t slice_bytes;/* DM/TRF/VRF: footprint per slice; HBM: 0 */
	int64_t const_off;  /* TCP_T_CONST: byte offset into the constants section */
	/* Placement (DM/TRF/VRF; docs/tcp-isa.md section 1): the tensor's
	 * bytes in flat order are cut into units of u bytes (the last may be
	 * shorter); unit i is held by the slices i mod G + k G, k < copies.
	 * part_bytes 0 (spread): u = flit_bytes and G = floor(S / copies), the
	 * flits interleaved over every slice of a copy group; part_bytes > 0:
	 * u = part_bytes and G = ceil(bytes / u), one consecutive part per
	 * slice. HBM tensors: 0 and 1. */
	int64_t part_bytes;
	int32_t copies;
} tcp_tensor;

/* Placement queries (isa.c). Bytes are offsets into the tensor's flat
 * bytes. tcp_layout_unit: u (>= 1); tcp_layout_group: G (>= 1), the slices
 * of one copy; tcp_slice_holds: how many bytes slice s holds (0: none; slice
 * 0 holds the most); tcp_slice_has: whether slice s holds byte b;
 * tcp_dm_side_bytes: what a DMA writing n bytes of t moves on the DM side
 * (every copy). */
int64_t tcp_tensor_bytes(const tcp_tensor *t);
int64_t tcp_layout_unit(const moe_tcp_machine *m, const tcp_tensor *t);
int64_t tcp_layout_group(const moe_tcp_machine *m, const tcp_tensor *t);
int64_t tcp_slice_holds(const moe_tcp_machine *m, const tcp_tensor *t, int64_t s);
bool tcp_slice_has(const moe_tcp_machine *m, const tcp_tensor *t, int64_t s, int64_t b);
int64_t tcp_dm_side_bytes(const tcp_tensor *t, int64_t n);
/* dma.index_bytes_per_pe: the bytes of an unscaled gather's DM index list
 * that one slice may hold */
int64_t tcp_index_bytes_per_pe(const moe_tcp_machine *m);

/* ---- instructions ---- */
#define TCP_OPS(X) \
	X(HALT, "halt", CTL) X(LI, "li", CTL) X(ALU, "alu", CTL) X(LD, "ld", CTL) \
	X(BR, "br", CTL) X(JMP, "jmp", CTL) X(SIG, "sig", CTL) X(WAIT, "wait", CTL) \
	X(DMA_COPY, "dma.copy", DMA) X(DMA_GATHER, "dma.gather", DMA) X(DMA_SCATTER, "dma.scatter", DMA) \
	X(SUB_TRF, "sub.ldtrf", SUB) X(SUB_VRF, "sub.ldvrf", SUB) \
	X(TU_VEC, "tu.vec", MAIN) X(TU_CONTRACT, "tu.contract", MAIN) X(DMA_SPM, "dma.spm", DMA)
typedef enum tcp_opcode {
#define X(id, s, c) TCP_OP_##id,
	TCP_OPS(X)
#undef X
	TCP_OP_COUNT
} tcp_opcode;
enum { TCP_CTX_CTL, TCP_CTX_MAIN, TCP_CTX_SUB, TCP_CTX_DMA, TCP_NCTX };
extern const char *const tcp_op_names[TCP_OP_COUNT];
extern const uint8_t tcp_op_ctx[TCP_OP_COUNT];
extern const char *const tcp_ctx_names[TCP_NCTX];

/* scalar ALU ops and branch conditions */
#define TCP_SOPS(X) X(ADD, "add") X(SUB, "sub") X(MUL, "mul") X(AND, "and") X(MIN, "min") X(MAX, "max")
typedef enum {
#define X(id, s) TCP_S_##id,
	TCP_SOPS(X)
#undef X
	TCP_S_COUNT
} tcp_sop;
#define TCP_CONDS(X) X(LT, "lt") X(GE, "ge") X(EQ, "eq") X(NE, "ne")
typedef enum {
#define X(id, s) TCP_C_##id,
	TCP_CONDS(X)
#undef X
	TCP_C_COUNT
} tcp_cond;

/* Vector engine ALU ops with their stage (the fixed stage order). */
enum {
	TCP_ST_TAG, TCP_ST_LOGIC, TCP_ST_FXP, TCP_ST_FXP2FP, TCP_ST_FLOAT, TCP_ST_REDUCE, TCP_ST_FPDIV,
	TCP_ST_FP2FXP, TCP_ST_CLIP, TCP_ST_FILTER, TCP_NSTAGE
};
extern const char *const tcp_stage_names[TCP_NSTAGE];
#define TCP_VOPS(X) \
	X(TEQ, "t.eq", TAG) X(TNE, "t.ne", TAG) X(TLT, "t.lt", TAG) X(TLE, "t.le", TAG) \
	X(TGT, "t.gt", TAG) X(TGE, "t.ge", TAG) \
	X(FTEQ, "t.feq", TAG) X(FTNE, "t.fne", TAG) X(FTLT, "t.flt", TAG) X(FTLE, "t.fle", TAG) \
	X(FTGT, "t.fgt", TAG) X(FTGE, "t.fge", TAG) \
	X(AND, "l.and", LOGIC) X(OR, "l.or", LOGIC) X(XOR, "l.xor", LOGIC) X(SHL, "l.shl", LOGIC) \
	X(SHR, "l.shr", LOGIC) X(SAR, "l.sar", LOGIC) \
	X(IADD, "x.add", FXP) X(ISUB, "x.sub", FXP) X(IMUL, "x.mul", FXP) X(IDIV, "x.div", FXP) \
	X(ISCAN, "x.scan", FXP) \
	X(ITOF, "cvt.itof", FXP2FP) \
	X(FADD, "f.add", FLOAT) X(FSUB, "f.sub", FLOAT) X(FMUL, "f.mul", FLOAT) X(FEXP, "f.exp", FLOAT) \
	X(FLOG, "f.log", FLOAT) X(FSQRT, "f.sqrt", FLOAT) X(FTANH, "f.tanh", FLOAT) X(FERF, "f.erf", FLOAT) \
	X(FSIGM, "f.sigmoid", FLOAT) X(FNEG, "f.neg", FLOAT) X(FABS, "f.abs", FLOAT) X(FSCAN, "f.scan", FLOAT) \
	X(RSUM, "r.sum", REDUCE) X(RMAX, "r.max", REDUCE) X(RMIN, "r.min", REDUCE) \
	X(FRSUM, "r.fsum", REDUCE) X(FRMAX, "r.fmax", REDUCE) X(FRMIN, "r.fmin", REDUCE) \
	X(FDIV, "d.div", FPDIV) \
	X(FTOI, "cvt.ftoi", FP2FXP) \
	X(IMIN, "c.min", CLIP) X(IMAX, "c.max", CLIP) X(FMIN, "c.fmin", CLIP) X(FMAX, "c.fmax", CLIP) \
	X(MERGE, "flt.merge", FILTER) X(COMPACT, "flt.compact", FILTER)
typedef enum {
#define X(id, s, st) TCP_V_##id,
	TCP_VOPS(X)
#undef X
	TCP_V_COUNT
} tcp_vop;
extern const char *const tcp_vop_names[TCP_V_COUNT];
extern const uint8_t tcp_vop_stage[TCP_V_COUNT];
bool tcp_vec_chain_ok(const moe_tcp_machine *m, const uint8_t *ops, int n);

/* Operand sources of a vector step. */
enum { TCP_SRC_V, TCP_SRC_S0, TCP_SRC_S1, TCP_SRC_S2, TCP_SRC_IMM, TCP_SRC_CTR, TCP_SRC_NONE };

typedef struct tcp_step {
	uint8_t op;        /* tcp_vop */
	uint8_t x, y;      /* TCP_SRC_*: x is the left operand, y the right */
	uint8_t ctr;       /* the iteration dimension read by TCP_SRC_CTR */
	uint8_t flags;     /* TCP_STEP_EXCL for scans */
	uint32_t imm;      /* 32-bit immediate (i32 or f32 bits) */
} tcp_step;
enum { TCP_STEP_EXCL = 1 };

/* A sequencer view of a tensor: element (i0..i_{n-1}) of the iteration
 * space lies at base + reg*scale + sum_k i_k * stride[k] (elements). */
typedef struct tcp_view {
	int32_t t;      /* tensor index, -1: unused */
	int32_t reg;    /* offset register, -1: none */
	int64_t base, scale;
	int64_t stride[TCP_MAXD];
} tcp_view;

enum { TCP_V_DST, TCP_V_S0, TCP_V_S1, TCP_V_S2, TCP_NVIEW };
/* TCP_F_JOIN (DMA): the command is one more descriptor of the preceding DMA
 * command's list; its setup runs on other engines while that one transfers */
/* TCP_F_E2M1, TCP_F_I4 (tu.vec): stream s0 is read in 4-bit elements of its
 * tensor's bytes (element i: byte i / 2, low nibble when i is even), decoded
 * by the fetch unit: E2M1 through its table to f8e4m3 and widened to f32;
 * i4 with the zero point 8 subtracted, widened to i32 (docs/tcp-isa.md 5). */
/* TCP_F_SCALED (tu.contract, f8e4m3 operands, act=fp8): the reduction runs in
 * chunks of 128 along I; each chunk's f32 sum is multiplied by the f32 scale
 * s2[m, o, chunk] and added to the row's f32 sum (DeepSeek's fp8_gemm). On i8
 * operands (W8A8): the exact i32 sum times the f32 scale s2[m, o]. */
/* TCP_F_VROWS (dma.gather / dma.scatter): the valid count limits the groups
 * (dim 0), not the indices of each group: groups at and past it are not
 * moved (a gather writes them as zero) */
enum { TCP_F_BF16X3 = 1, TCP_F_ACC = 2, TCP_F_XSLICE = 4, TCP_F_JOIN = 8, TCP_F_E2M1 = 16, TCP_F_I4 = 32,
	TCP_F_SCALED = 64, TCP_F_VROWS = 128 };
enum { TCP_SCALE_CHUNK = 128 };
/* An i8 reduction is at most TCP_I8_MAX_REDUCTION long so no i32 sum of
 * products (each at most 2^14 in magnitude) overflows. */
enum { TCP_I8_MAX_REDUCTION = 131071 };
/* TCP_F_SWITCH (sub.ldtrf / sub.ldvrf; printed "xslice"): the slices receive
 * the bytes they load from the slices that hold them, over the sub context's
 * switch channel; without it a load reads only its own slice's DM. */
enum { TCP_F_SWITCH = TCP_F_XSLICE };
/* TCP_F_HBMIDX (dma.gather / dma.scatter; printed "scaled"): the scaled form,
 * whose index list s1 is an i32 HBM tensor of byte offsets (row j at byte
 * s1[g, j] from the HBM side's group base, a multiple of its row stride);
 * without it the list is a DM tensor of row positions (gather only). */
enum { TCP_F_HBMIDX = TCP_F_SCALED };
/* TCP_F_ROUTE (tu.vec / tu.contract; printed "switch"): the pass's fetches
 * and commits route bytes between the slice that holds them and the slice
 * that computes with them through the switch stage (charged: docs/tcp-model.md);
 * without it each slice fetches and commits only bytes its own DM holds. */
enum { TCP_F_ROUTE = TCP_F_JOIN };
/* TCP_F_ROWDIV (tu.contract, scaled i8 x i8; printed "rowdiv"; the bit e2m1
 * takes on a tu.vec): output (m, o)'s scale is a column factor divided by a
 * row factor, both read through s2: col[o] = s2[0, o, 0] (the view's base,
 * its second stride) and row[m] = s2[m, 0, 1] (base + its third stride, its
 * first stride); dst[m, o] = f32(sum) x f32(col[o] / row[m]), each product
 * and the quotient rounded once in f32 (W8A8's down: w_scale / R). */
enum { TCP_F_ROWDIV = TCP_F_E2M1 };

/* The part of the layer an instruction belongs to, for the statistics: the
 * routing (and anything outside the others), the block loop's expert work,
 * that work issued before the loop (a speculative weight fetch, a gather of
 * the loop's rows), and the combine after the loop. Set by the compiler;
 * printed as ph=NAME (none for routing). */
typedef enum tcp_phase {
	TCP_PH_ROUTING,
	TCP_PH_EXPERT,
	TCP_PH_PREFETCH,
	TCP_PH_COMBINE,
	TCP_PH_COUNT
} tcp_phase;
extern const char *const tcp_phase_names[TCP_PH_COUNT];

typedef struct tcp_insn {
	uint8_t op;
	uint8_t sop;     /* ALU: tcp_sop; BR: tcp_cond */
	uint8_t ndim;    /* iteration rank of the pass / DMA */
	uint8_t nstep;
	uint8_t flags;   /* TCP_F_* */
	uint8_t rd, ra, rb;   /* scalar registers (0xff: none) */
	uint8_t phase;   /* tcp_phase: the part of the layer the command does (statistics) */
	int32_t vreg;    /* valid-count register, -1: none */
	int32_t target;  /* BR/JMP: instruction index; SIG/WAIT: token; WAIT/SIG: ctx in sop */
	int64_t imm;     /* LI value; ALU immediate when rb == 0xff; LD element offset */
	int64_t dim[TCP_MAXD];
	tcp_view v[TCP_NVIEW];
	tcp_step step[TCP_MAXSTEP];
	/* contraction: rows per slice resident in TRF (the tiling) */
	int64_t tile;
	/* DMA gather/scatter: index list view in v[S1] (i32), rows per group */
	int64_t rows;
} tcp_insn;
#define TCP_NOREG 0xff
/* input size caps: a machine description, a .tcpb (constants included) */
#define TCP_MAX_MACHINE_BYTES ((size_t)1 << 20)
#define TCP_MAX_BINARY_BYTES ((size_t)1 << 30)

typedef struct moe_tcp_program tcp_program;
struct moe_tcp_program {
	moe_ctx *ctx;
	tcp_tensor *t;
	uint32_t nt, tcap;
	tcp_insn *code;
	uint32_t ncode, ccap;
	uint8_t *consts;
	int64_t nconst, constcap;
	/* roofline inputs recorded by the lowering (docs/tcp-model.md section 7) */
	int64_t moe_T, moe_K, moe_D, moe_F, moe_E, moe_B, moe_G, nproj, router_E;
	uint8_t dtype;
	int32_t nblocks_t;  /* tensor holding nblocks (stats), -1 */
	int32_t bexp_t;     /* tensor holding block experts, -1 */
	int64_t weight_bytes_per_expert;
	int64_t act_bytes; /* inputs, outputs and the weights outside the block loop */
	int64_t router_macs;
	int32_t block_loop_pc, block_body_pc; /* first instruction of the loop, -1 */
	/* decode tier (tier.c): the most tokens it serves (0: none), its block
	 * loop's first instruction and its block-expert tensor (-1: none) */
	int64_t tier_n;
	int32_t tier_loop_pc, tier_bexp_t;
	/* the weight-packing graph (IR JSON, one layer; its outputs are the
	 * TCP_T_PACKED tensors in table order), or prep_len == 0 */
	char *prep;
	size_t prep_len;
};

tcp_program *tcp_prog_new(moe_ctx *ctx);
/* The MAC type (TCP_MT_*) of the program's fastest contraction on m: f8 x f8
 * (act=fp8) or i8 x i8 (W8A8) where it has one, else bf16 (isa/floor.c).
 * The roofline's compute bound and the floor take the layer's MACs at its
 * rate: the rate of the contraction the layer uses. */
int tcp_prog_mac_type(const tcp_program *p, const moe_tcp_machine *m);
void tcp_prog_free(tcp_program *p);
int32_t tcp_add_tensor(tcp_program *p, const char *name, int space, int kind, moe_dtype dt, int rank,
	const int64_t *shape);
uint32_t tcp_emit(tcp_program *p, const tcp_insn *in);
tcp_insn tcp_insn_init(tcp_opcode op);
tcp_view tcp_view_none(void);

/* text assembly */
tcp_program *tcp_parse_asm(moe_ctx *ctx, const char *file, const char *text, size_t len);
/* binary container */
#define TCP_TCPB_VERSION 5u
moe_status tcp_encode(const tcp_program *p, uint8_t **buf, size_t *len);
tcp_program *tcp_decode(moe_ctx *ctx, const char *file, const uint8_t *buf, size_t len);
/* layout.c: whether sub load `in` reads only bytes that every slice holding
 * its destination's bytes holds (false: *why says which byte does not) */
bool tcp_load_local(const tcp_program *p, const moe_tcp_machine *m, const tcp_insn *in, char *why, size_t nwhy);
/* layout.c: the DM operands of a tu.vec / tu.contract pass (bit w: view w)
 * whose bytes some computing slice does not hold (docs/tcp-isa.md sections 5,
 * 6 and 9); *why names the first such byte (empty when none) */
unsigned tcp_pass_remote(const tcp_program *p, const moe_tcp_machine *m, const tcp_insn *in, char *why, size_t nwhy);
/* static validation against a machine; diagnostics name the instruction */
moe_status tcp_validate(moe_ctx *ctx, const tcp_program *p, const moe_tcp_machine *m, const char *file);
uint32_t tcp_crc32(const uint8_t *p, size_t n);
/* phase.c: tags every instruction of p by its loops: the block loop's and
 * the decode tier's expert regions (from the branch that skips a loop to its
 * back branch) expert, the copies of an expert weight and the gathers of an
 * input's rows before the block loop that a loop command repeats into the
 * same DM tensor (at most four) prefetch, what follows the block loop
 * combine, the rest routing. The rule of programs compiled before phases
 * were stored (.tcpb before version 5, text without ph=). */
void tcp_phase_infer(tcp_program *p);
/* Whether any instruction of p carries a phase other than routing. */
bool tcp_phase_tagged(const tcp_program *p);
/* the checkpoint source of tensor t (isa.c) */
void tcp_set_source(tcp_program *p, int32_t t, const char *source);
/* prep_graph.c: the program's weight-packing graph, parsed and checked against
 * its packed tensors (NULL plus a diagnostic otherwise, or when it has none);
 * a checkpoint source with {layer} resolved from g's `layer` param ({e} kept). */
moe_module *tcp_prep_module(moe_ctx *ctx, const tcp_program *p, const char *file);
char *tcp_resolve_source(moe_ctx *ctx, const moe_graph *g, const char *src);

/* terminate.c (enforced by sim.c): the instruction budget of a run; a loop without exit is an error */
uint64_t tcp_step_budget(const tcp_program *p);
/* The work budget (docs/tcp-isa.md section 9): the program's static work
 * (the block loop's commands G times, any other loop's TCP_WORK_LOOP times)
 * x TCP_WORK_FACTOR, in [2^24, 2^42]; a run stops with a fault before the
 * command that would pass it. */
#define TCP_WORK_FACTOR 8
#define TCP_WORK_LOOP 64
#define TCP_WORK_PER_COMMAND 4096
uint64_t tcp_command_work(const tcp_insn *in);
uint64_t tcp_work_budget(const tcp_program *p);
moe_status tcp_check_termination(moe_ctx *ctx, const tcp_program *p, const char *file);

/* A serving program's n_tokens binding outside 0..T: a diagnostic and
 * MOE_ERR_INVALID (backend-tcp/sim/serve.c). */
moe_status tcp_tokens_check(moe_ctx *ctx, const tcp_program *p, const moe_tensor_map *b);

/* Bucketed .tcpb (backend-tcp/isa/bundle.c): the version word that marks one,
 * and the most buckets it holds. */
#define TCP_BUNDLE_VERSION 257u
#define TCP_MAX_BUCKETS 16
bool tcp_is_bundle(const uint8_t *buf, size_t len);

/* The greatest common divisor of a and b (a when b is 0). */
static inline int64_t tcp_gcd(int64_t a, int64_t b)
{
	while (b) {
		int64_t r = a % b;
		a = b;
		b = r;
	}
	return a;
}

#endif
