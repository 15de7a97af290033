/* backend-tcp/compiler/sched.h: the schedule IR (docs/tcp-compiler.md section 4):
 * the level between the graph and tcp_insn. Buffers (the tensor table with
 * layout and lifetime), ops (one finished command each, with explicit
 * dependencies), scalars (control values) and structured regions (sequences,
 * guards, row-class switches, the block loop). Every object lives in arrays
 * of the schedule, referred to by dense 32-bit ids, allocated in the
 * schedule's arena. */
#ifndef MOEC_TCP_SCHED_H
#define MOEC_TCP_SCHED_H

#include <stdio.h>

#include "backend-tcp/isa/tcp_int.h"

typedef uint32_t ts_id;
#define TS_NONE UINT32_MAX

enum ts_phase { TS_PH_ROUTING, TS_PH_EXPERT, TS_PH_PREFETCH, TS_PH_COMBINE, TS_NPHASE };
enum ts_life { TS_LIFE_PROGRAM, TS_LIFE_SPAN, TS_LIFE_LOOP, TS_LIFE_BLOCK, TS_NLIFE };
enum ts_split { TS_SPLIT_FLIT, TS_SPLIT_ROWS, TS_SPLIT_COLS, TS_NSPLIT };
enum ts_weights { TS_W_DOUBLE, TS_W_SINGLE, TS_W_STREAM, TS_NWEIGHTS };
enum ts_sc_kind { TS_SC_CONST, TS_SC_SPM_LD, TS_SC_ALU, TS_SC_CMP, TS_SC_LOOPVAR, TS_SC_LOOPIDX, TS_NSC };
/* TS_REUSE_ORDERED: placement adds reuse edges (reuse.c) and the verifier
 * checks that every two conflicting accesses of distinct buffers on shared
 * bytes are ordered; printed as the header line `reuse ordered`. */
enum ts_reuse { TS_REUSE_UNORDERED, TS_REUSE_ORDERED };
enum ts_rg_kind { TS_RG_SEQ, TS_RG_GUARD, TS_RG_CLASSES, TS_RG_TIER, TS_RG_LOOP, TS_NRG };

/* A region's item: an op, a child region or a scalar definition, by id, its
 * kind in the top two bits. */
#define TS_ITEM_OP 0u
#define TS_ITEM_RG 0x40000000u
#define TS_ITEM_SC 0x80000000u
#define TS_ITEM_KIND(x) ((x) & 0xc0000000u)
#define TS_ITEM_ID(x) ((x) & 0x3fffffffu)

/* Input caps (the reader's and the builders'): ids stay below TS_ITEM_RG. */
#define TS_MAX_OBJECTS (1u << 18)  /* of each kind */
#define TS_MAX_DEPS 4096
#define TS_MAX_BOUNDS 1024
#define TS_MAX_TEXT_BYTES ((size_t)1 << 28)

extern const char *const ts_phase_names[TS_NPHASE];
extern const char *const ts_life_names[TS_NLIFE];
extern const char *const ts_split_names[TS_NSPLIT];
extern const char *const ts_weights_names[TS_NWEIGHTS];
extern const char *const ts_space_names[TCP_NSPACE];

typedef struct ts_layout {             /* where a DM/TRF/VRF buffer's bytes are; HBM: all 0 */
	uint16_t slice0, nslices, copies;  /* the slices holding one copy; replicas over row groups */
	uint8_t split;                 /* ts_split */
	int64_t slice_bytes;           /* one copy's share per slice, every slot, whole flits */
} ts_layout;

typedef struct ts_buf {
	const char *name, *source;     /* source: a weight's checkpoint name, else "" */
	uint8_t space, kind, dtype, rank;  /* TCP_HBM.., TCP_T_*, moe_dtype */
	int64_t shape[MOE_MAX_RANK];   /* one slot's logical shape */
	ts_layout layout;
	uint8_t slots, life;           /* 1, 2 (double buffer), 4 or 8 (ring): ts_slots_ok; ts_life */
	ts_id first, last;             /* SPAN: first writer and last reader (op ids); else TS_NONE */
	uint16_t feature;              /* the rewrite that owns it; 0: mandatory */
	int64_t offset;                /* per-slice offset (HBM: address); -1 until placed */
	moe_id node;                   /* the graph value it holds, for diagnostics; MOE_NONE */
} ts_buf;

typedef struct ts_op {
	tcp_insn in;                   /* views name buffers (t = buffer id) and scalars
	                                * (reg = scalar id; vreg likewise) */
	uint8_t ctx, phase;            /* TCP_CTX_* (tcp_op_ctx of the opcode); ts_phase */
	uint16_t feature;              /* the rewrite that made it; 0: the build */
	ts_id region;                  /* the region holding it */
	ts_id *dep; uint8_t *dist; uint32_t ndep; /* must finish first; dist 1: previous block's */
	int64_t cost;                  /* tcp_cost_insn(in).total, cached; 0 until costed */
	moe_id node;                   /* origin graph node; MOE_NONE */
} ts_op;

typedef struct ts_scalar {             /* control-path values; isel gives them registers */
	const char *name;              /* unique, printed as $name */
	uint8_t kind, op;              /* ts_sc_kind; ALU: tcp_sop, CMP: tcp_cond */
	ts_id a, b, buf;               /* CONST: imm; SPM_LD: buf[a | imm]; ALU/CMP: a op (b | imm);
	                                * LOOPVAR: init a, next b; LOOPIDX: loop imm */
	int64_t imm;
	ts_id region;                  /* the region holding its definition */
} ts_scalar;

typedef struct ts_region {
	uint8_t kind;                  /* ts_rg_kind */
	ts_id parent, pred;            /* GUARD: pred; CLASSES: the row-count scalar */
	ts_id *item; uint32_t nitem, cap;  /* TS_ITEM_*; CLASSES: one SEQ per bound */
	int64_t *bound; uint32_t nbound;   /* CLASSES: the row classes, increasing */
	uint32_t loop;                 /* LOOP: index into tcp_sched.loop */
} ts_region;

typedef struct ts_loop {
	int64_t G;                     /* static trip count: the worst-case grid */
	ts_id nb, expert, rows, g;     /* scalars (expert, rows: TS_NONE when absent) */
	ts_id region;                  /* the LOOP region standing in its parent */
	ts_id prologue, body, epilogue;    /* SEQ regions; the body runs under g < nb */
	uint8_t weights, prefetch;     /* ts_weights; weight look-ahead in blocks */
	uint8_t ring, row_slots;       /* streamed tiles in flight; row buffer slots */
} ts_loop;

/* The roofline dims and the prep graph, as tcp_program records them. */
typedef struct ts_meta {
	int64_t T, K, D, F, E, B, G, nproj, router_E;
	int64_t wexp, act, rmacs;      /* weight bytes per expert, activation bytes, router MACs */
	uint8_t dtype;
	const char *prep;              /* the weight-packing graph (IR JSON, one line) or NULL */
} ts_meta;

/* The roofline dims of x into program p's fields (moe_T .. router_macs, dtype). */
void ts_meta_dims(const ts_meta *x, tcp_program *p);

typedef struct tcp_sched {
	moe_ctx *ctx; const moe_tcp_machine *m;   /* m may be NULL: no capacity checks */
	ir_arena arena;
	ts_buf *buf; ts_op *op; ts_scalar *sc; ts_region *rg;
	uint32_t nbuf, nop, nsc, nrg;
	uint32_t cbuf, cop, csc, crg;  /* capacities */
	ts_loop loop[2]; int nloop;    /* the block loop (and a decode tier's) */
	ts_id top;                     /* the root SEQ region */
	uint64_t granted, refused;     /* features, one bit per rewrite row */
	uint64_t ran;                  /* the rewrites that ran, bit k: row k of rewrites.def */
	uint8_t reuse;                 /* TS_REUSE_*: whether placement orders shared bytes (5.3) */
	ts_meta meta;
	const char *machine_name;      /* as printed; the machine's name when built */
	uint32_t *hash, hcap;          /* scalar names (sched.c) */
	/* Reader only: the line each object was read from (NULL when built in C),
	 * for the verifier's file:line diagnostics. */
	const char *file;
	int *buf_line, *op_line, *sc_line, *rg_line;
} tcp_sched;

/* ---- construction (sched.c). Ids are dense and never reused; a region's
 * items are appended in program order. Allocation failure throws (support.h). */
tcp_sched *tcp_sched_new(moe_ctx *ctx, const moe_tcp_machine *m);
void tcp_sched_free(tcp_sched *s);
ts_id ts_add_buf(tcp_sched *s, const char *name, int space, int kind, moe_dtype dt, int rank, const int64_t *shape);
void ts_set_source(tcp_sched *s, ts_id b, const char *source);
/* An op from a finished instruction, appended to region rg (ctx from the opcode). */
ts_id ts_add_op(tcp_sched *s, ts_id rg, const tcp_insn *in, int phase);
void ts_add_dep(tcp_sched *s, ts_id op, ts_id on, int dist);
/* A scalar appended to region rg; name is made unique by a suffix (.1, .2, ...). */
ts_id ts_add_scalar(tcp_sched *s, ts_id rg, const char *name, int kind, int op, ts_id a, ts_id b, int64_t imm);
ts_id ts_add_region(tcp_sched *s, ts_id parent, int kind, ts_id pred);
void ts_region_bounds(tcp_sched *s, ts_id rg, const int64_t *bound, uint32_t n);
/* A classes region keyed on scalar rows, with n bounds (increasing) and one
 * empty SEQ case per bound (its items in bound order), standing at position
 * at of parent's items (at == its item count: appended). */
ts_id ts_add_classes(tcp_sched *s, ts_id parent, uint32_t at, ts_id rows, const int64_t *bound, uint32_t n);
/* A block loop appended to region parent: its LOOP region and three SEQ regions. */
int ts_add_loop(tcp_sched *s, ts_id parent, int64_t G, ts_id nb, ts_id g);
/* Internal: append an item to a region (the reader uses it). */
void ts_region_push(tcp_sched *s, ts_id rg, uint32_t item);
/* Inserts an item at position at (<= the item count) of a region's items. */
void ts_region_insert(tcp_sched *s, ts_id rg, uint32_t at, uint32_t item);
/* Item `item` removed from region rg: its former index, UINT32_MAX where absent. */
uint32_t ts_region_unlink(tcp_sched *s, ts_id rg, uint32_t item);
/* The last n (at most 8) items of region rg moved to position at, in order. */
void ts_region_move_tail(tcp_sched *s, ts_id rg, uint32_t at, uint32_t n);
ts_id ts_find_scalar(const tcp_sched *s, const char *name); /* TS_NONE if absent */
/* Removes the scalars with drop[id] set, which nothing may read (no scalar,
 * predicate, loop field or view names them): the others renumbered in order
 * everywhere, their region items kept in place. */
void ts_drop_scalars(tcp_sched *s, const uint8_t *drop);
/* Readers of scalar id (a valid id): scalar y (an operand, or an SPM load's
 * index), region r (a guard's or a row-class switch's predicate), command in
 * (its count register or a view's register). */
bool ts_scalar_reads(const ts_scalar *y, ts_id id);
bool ts_region_reads(const ts_region *r, ts_id id);
bool ts_insn_reads(const tcp_insn *in, ts_id id);
/* Whether region rg is region in or stands below it. */
bool ts_region_within(const tcp_sched *s, ts_id rg, ts_id in);
/* Whether ops a and b sit in different cases of one classes region (one
 * pass of it never runs both). */
bool ts_ops_exclusive(const tcp_sched *s, ts_id a, ts_id b);
/* ts_ops_exclusive answered by region pair (it reads only the two ops'
 * regions), each pair asked once; valid while no region and no op's region
 * changes. ts_excl_init allocates from s->ctx (it may throw). */
typedef struct ts_excl {
	const tcp_sched *s;
	uint8_t *t; /* nrg x nrg: 0 not asked, else 1 + the answer; NULL: ask every time */
} ts_excl;
void ts_excl_init(ts_excl *x, const tcp_sched *s);
void ts_excl_free(ts_excl *x);
/* ts_excl_ops(x, a, b) where ra and rb are a's and b's regions */
/* The slot counts a buffer may have: one, a double buffer, a ring of 4 or
 * TS_MAX_RING. */
enum { TS_MAX_RING = 8 };
static inline bool ts_slots_ok(unsigned n)
{
	return n == 1 || n == 2 || n == 4 || n == TS_MAX_RING;
}

static inline bool ts_excl_regions(ts_excl *x, ts_id ra, ts_id rb, ts_id a, ts_id b)
{
	const tcp_sched *s = x->s;
	if (ra == rb)
		return false;
	if (!x->t || ra >= s->nrg || rb >= s->nrg)
		return ts_ops_exclusive(s, a, b);
	uint8_t *e = &x->t[(size_t)ra * s->nrg + rb];
	if (!*e)
		*e = (uint8_t)(1 + ts_ops_exclusive(s, a, b));
	return *e == 2;
}
static inline bool ts_excl_ops(ts_excl *x, ts_id a, ts_id b)
{
	return ts_excl_regions(x, x->s->op[a].region, x->s->op[b].region, a, b);
}
/* Whether op p depends on op `on` at distance dist. */
bool ts_op_has_dep(const ts_op *p, ts_id on, int dist);
/* ts_add_dep unless op already has (on, dist). */
void ts_add_dep_once(tcp_sched *s, ts_id op, ts_id on, int dist);
/* Whether op o stands in a block loop's region. */
bool ts_op_in_loop(const tcp_sched *s, ts_id o);
/* Whether a scalar ld reads buffer b (SPM). */
bool ts_buf_spm_read(const tcp_sched *s, ts_id b);
/* Group slots of a two-slot buffer (rewrites group-fetch, group-runs):
 * whether scalar reg is `alu.and $g, n - 1`, n >= 4 a power of two (block
 * g's entry of a buffer of n entries, two halves of n / 2), or
 * ts_group_half: `alu.min (alu.and (alu.add $g, k), k), 1` (the half of the
 * group from g + k, k >= 2 a power of two); $g the loop index or a run
 * index (`alu.add $v, $c`, loop variable $v stepped to it). */
bool ts_group_slot(const tcp_sched *s, int32_t reg, int64_t n);
bool ts_group_half(const tcp_sched *s, int32_t reg);
/* Elements of one slot of a buffer. */
int64_t ts_buf_numel(const ts_buf *b);
/* [lo, hi) of the elements view v of in reaches from its base (its register
 * not counted). */
void ts_view_span(const tcp_insn *in, const tcp_view *v, int64_t *lo, int64_t *hi);
/* Whether two views of one buffer, of ops a and b, may reach a common
 * element: a view moved by a register may reach any. */
bool ts_views_may_meet(const tcp_insn *a, const tcp_view *va, const tcp_insn *b, const tcp_view *vb);
/* pos[op] = the op's position in program order (loops: prologue, body,
 * epilogue); pos holds nop entries. */
void ts_op_positions(const tcp_sched *s, uint32_t *pos);
/* After ops moved: each span's first and last op become the earliest and
 * latest, in the new order, of its old first and last and of every op touching
 * the buffer between them in the old order (old: ts_op_positions before the
 * move). */
void ts_renew_spans(tcp_sched *s, moe_ctx *ctx, const uint32_t *old);

/* A deep copy of s in its own arena, the same as tcp_sched_parse of
 * tcp_sched_print's text gives when s verifies: regions and scalars
 * renumbered in program order (unreachable ones dropped), the fields the
 * text does not carry at the reader's defaults, no source lines. NULL (no
 * diagnostic) where the text would not read back: take the text then. */
tcp_sched *ts_clone(const tcp_sched *s);
/* Exchange the contents of a and b (of one context). */
void ts_swap(tcp_sched *a, tcp_sched *b);
/* Whether two copies made by ts_clone print the same text. */
bool ts_same(const tcp_sched *a, const tcp_sched *b);

/* ---- text form (sched_print.c, sched_parse.c; docs/tcp-compiler.md 4.2) ---- */
/* The text, NUL-terminated, in *out (ctx_alloc'd; ctx_free it). */
moe_status tcp_sched_print(const tcp_sched *s, char **out, size_t *len);
moe_status tcp_sched_fprint(const tcp_sched *s, FILE *f);
/* A schedule read back; NULL with `file:line:col: error:` diagnostics. The
 * reader checks the syntax, the names and the caps, then runs the verifier. */
tcp_sched *tcp_sched_parse(moe_ctx *ctx, const moe_tcp_machine *m, const char *file, const char *text, size_t len);

/* ---- verifier (sched_verify.c; docs/tcp-compiler.md 5.6, the checks that need
 * no cost model): MOE_OK, or MOE_ERR_INVALID with an error diagnostic per
 * broken rule, each naming the object ("op @3: ...") and, for a schedule
 * read from text, the line it was read from. */
moe_status tcp_sched_verify(const tcp_sched *s);

#endif
