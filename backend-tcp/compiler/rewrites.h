/* backend-tcp/compiler/rewrites.h: the schedule rewrite table
 * (docs/tcp-compiler.md 5.2; the rows are rewrites.def, the code of each
 * compiler/rw/<id>.c) and the driver step that runs it. */
#ifndef MOEC_TCP_REWRITES_H
#define MOEC_TCP_REWRITES_H

#include "backend-tcp/compiler/sched.h"

enum { TS_RW_STRUCT, TS_RW_PEEP };

/* What a rewrite sees besides the schedule: the machine and the switches
 * (bit k: row k). */
typedef struct ts_env {
	moe_ctx *ctx;
	const moe_tcp_machine *m;
	uint64_t on, off; /* --tcp-opt: +name forces row k on (no benefit asked), -name off */
	uint8_t reuse;    /* --tcp-opt's reuse=ordered|unordered: the schedule's TS_REUSE_* */
} ts_env;

typedef struct ts_rewrite {
	const char *name, *summary;
	uint8_t stage;          /* TS_RW_STRUCT (before placement) or TS_RW_PEEP (placed) */
	const char *needs;      /* a row that must have run first, or NULL */
	bool (*applies)(const tcp_sched *s, const ts_env *e);
	double (*benefit)(const tcp_sched *s, const ts_env *e, int row); /* predicted cycles saved */
	/* MOE_OK: applied; MOE_ERR_UNSUPPORTED: declined, s unchanged (none of
	 * the rewrite's own choices places: a forced row is then skipped, with
	 * the rewrite's note); anything else: a moec bug */
	moe_status (*apply)(tcp_sched *s, const ts_env *e, uint16_t feature);
} ts_rewrite;

#define REWRITE(id, name, stage, needs, benefit, summary)                                   \
	bool ts_rw_##id##_applies(const tcp_sched *s, const ts_env *e);                     \
	moe_status ts_rw_##id##_apply(tcp_sched *s, const ts_env *e, uint16_t feature);
#include "backend-tcp/compiler/rewrites.def"
#undef REWRITE

extern const ts_rewrite ts_rewrites[];
extern const int ts_nrewrites;

/* the row named name[0..len), or -1 */
int ts_rewrite_find(const char *name, size_t len);
/* Row `name` applied to trial copy c where it is switched on and applies: a
 * later row that finishes what an earlier one starts, so that the earlier
 * row's trials price each choice finished. False where it applies and fails. */
bool ts_rw_finish(tcp_sched *c, const ts_env *e, const char *name);

/* The default benefit: row applied to a copy of s (read back from its text),
 * the copy and the unchanged one placed (tcp_dm_place) and predicted on
 * expected loads (tcp_sched_predict); the cycles saved, <= 0 when the copy
 * does not apply, verify or place. */
double ts_benefit_by_prediction(const tcp_sched *s, const ts_env *e, int row);
/* As ts_benefit_by_prediction, but 0.5 where the two predictions are equal
 * (and both trials succeed): for a rewrite that saves HBM bytes or commands
 * beside the cycles, applied unless the prediction says it is slower. */
double ts_benefit_not_slower(const tcp_sched *s, const ts_env *e, int row);
/* For a rewrite that keeps only what the prediction gains itself: 1. */
double ts_benefit_self(const tcp_sched *s, const ts_env *e, int row);
/* The predicted cycles of s as it stands, placed on a copy (-1 where that
 * fails): the stage's kept base trial where s has not changed since it was
 * priced, so a row that prices its own choices need not place s again. */
int64_t ts_rw_base_cycles(const tcp_sched *s, const ts_env *e);
/* A rewrite applied with one chosen parameter (a part count, a depth, a
 * lead, a flag) to schedule c; false where it cannot be. */
typedef bool (*ts_param_fn)(tcp_sched *c, const ts_env *e, uint16_t feature, int64_t param);
/* The predicted cycles of a copy of s with fn(copy, e, feature, param)
 * applied (a priced trial, ts_trial_for): -1 where fn, placement or
 * verification fails. A row choosing its parameter by trials calls it once
 * per candidate and keeps its own stop and tie rule. */
int64_t ts_price_param(const tcp_sched *s, const ts_env *e, const char *what, ts_param_fn fn, uint16_t feature,
	int64_t param);
/* The parameter lo, lo + 1, ... hi priced in turn (ts_price_param) until one
 * that places is no faster than the fastest before it: the fastest (ties:
 * the smaller), lo where none places or hi < lo. */
int64_t ts_price_ascending(const tcp_sched *s, const ts_env *e, const char *what, ts_param_fn fn, uint16_t feature,
	int64_t lo, int64_t hi);
/* group-fetch's (rw/group_fetch.c): each choice priced with the row that
 * finishes it, as ts_benefit_by_prediction otherwise. */
double ts_rw_group_fetch_benefit(const tcp_sched *s, const ts_env *e, int row);

/* Reads a --tcp-opt list ("-name,+name", NULL or "": none) into e->on/off
 * (and an item reuse=ordered or reuse=unordered into e->reuse);
 * MOE_ERR_INVALID with a diagnostic naming an unknown name and the known
 * ones. */
moe_status ts_rewrite_opts(moe_ctx *ctx, const char *opts, ts_env *e);

/* Runs the rows of `stage` in table order: a row runs when it is not
 * switched off, what it needs has run, it applies and (unless forced on) its
 * benefit is > 0; each that runs sets its bit in s->ran and the schedule is
 * verified after it. MOE_ERR_INVALID with a diagnostic when a rewrite or the
 * verifier after it fails (a moec bug). */
moe_status ts_rewrites_run(tcp_sched *s, const ts_env *e, int stage);
/* Whether some row of `stage` may run under e's switches. */
bool ts_rewrites_enabled(const ts_env *e, int stage);

/* The run of ops at items [i0, i0 + m) of region `region` into a classes
 * region keyed on scalar `count` with n bounds (ts_add_classes), standing
 * where the run stood: case k holds a copy of every op of the run whose
 * dimension 0 is cut to bound[k] where cut[op] (the last case holds the
 * originals, uncut). The copies depend as their originals do (within the
 * run, on the same case's copies; a loop-carried dependency on every case),
 * every other op waiting for an op of the run waits for its copies too, and
 * a span starting in the run starts at its first case's copy. With
 * case_bufs, a span buffer living within the run is one per case (the
 * cases' spans do not overlap). The copies carry feature. */
void ts_split_classes(tcp_sched *s, ts_id region, uint32_t i0, uint32_t m, ts_id count, const int64_t *bound,
	uint32_t n, const uint8_t *cut, bool case_bufs, uint16_t feature);

/* Op o, item `at` of region rg, whose dimension 0 runs over the loop's G
 * blocks, into a classes region keyed on $nb (ts_split_classes): case h
 * copies the first h blocks, the bounds every ceil(G / 32) blocks, then G.
 * The copies carry feature. */
void ts_split_on_nb(tcp_sched *s, ts_id rg, uint32_t at, ts_id o, uint16_t feature);

/* Removes the ops with drop[op] set: the others
 * renumbered in order, dependencies on removed ops dropped, region items and
 * span ends renumbered. A span must not start or end at a removed op. */
void ts_drop_ops(tcp_sched *s, const uint8_t *drop);
/* ts_drop_ops for ops whose spans may end there: a span's end at a dropped
 * op moves to op `to` (kept), then a span whose last op stands before its
 * first (pos: ts_op_positions before the drop) ends at its first. */
void ts_drop_ops_to(tcp_sched *s, const uint8_t *drop, ts_id to, const uint32_t *pos);
/* A new op `in` standing at item `at` of op like's region, with like's
 * phase, node and dependencies (but those on op skip; TS_NONE: every one),
 * carrying feature: a piece of like, cut by a rewrite. */
ts_id ts_op_sibling(tcp_sched *s, ts_id like, const tcp_insn *in, uint32_t at, ts_id skip, uint16_t feature);
/* Removes from q the dependencies on ops with drop[op] set. */
void ts_op_drop_deps(ts_op *q, const uint8_t *drop);
/* The index in region rg of the item standing for what sits in region r
 * (item `it` itself when r is rg, else the child region of rg holding r);
 * -1 when r is not below rg. ts_op_index: that of op o. */
int64_t ts_item_index(const tcp_sched *s, ts_id rg, ts_id r, uint32_t it);
int64_t ts_op_index(const tcp_sched *s, ts_id rg, ts_id o);
/* Removes the buffers b with cand[b] set that no op or scalar names; the
 * others are renumbered in every view and SPM read. */
void ts_drop_unused_bufs(tcp_sched *s, const uint8_t *cand);
/* Where speculative fetches go in the top region (spec-fetch, spec-group):
 * right after the last DMA command that stands before the first DMA
 * command depending, directly or through other ops, on a contraction or on
 * staging scalars; 0 when there is none. */
uint32_t ts_spec_insert_at(const tcp_sched *s, moe_ctx *ctx);
/* spec-fetch, spec-group: a speculative copy `in` in the top region at item
 * position at, with op like's phase and node, carrying feature. */
ts_id ts_spec_copy(tcp_sched *s, const tcp_insn *in, ts_id like, uint32_t at, uint16_t feature);
/* Every op below nop0 that waits for prologue fetch ops[i] (at either
 * distance), writes its destination, or is that fetch, waits for its
 * speculative copy sp[i] (distance 0). */
void ts_spec_waiters(tcp_sched *s, const ts_id *ops, const ts_id *sp, uint32_t n, ts_id nop0);
/* spec-fetch, spec-group: the loop prologue's fetches ops[0..n) (items of
 * region rg) moved into guard gd, in order; each one's destination buffer,
 * where it lives for the loop or a block, becomes a span from its
 * speculative copy sp[i] on. Returns the position in rg's items where the
 * first of them stood (after the removal), UINT32_MAX where none was there. */
uint32_t ts_spec_guard(tcp_sched *s, ts_id rg, ts_id gd, const ts_id *ops, const ts_id *sp, uint32_t n);
/* Class bounds over [1, n]: every ceil(n / parts), then n, into b (at most
 * parts + 1 entries); their count. */
uint32_t ts_even_bounds(int64_t n, int64_t parts, int64_t *b);
/* Whether some op outside region rg (and the regions below it) reads or
 * writes buffer b; whether some op writes b. */
bool ts_buf_touched_outside(const tcp_sched *s, ts_id b, ts_id rg);
bool ts_buf_written(const tcp_sched *s, ts_id b);
/* The number of distinct (op, distance) dependencies of ops[0..n) together:
 * what one op standing for them all would wait for. mark: 2 x (nop + 1)
 * bytes, zero on entry and on return. */
uint32_t ts_deps_union(const tcp_sched *s, const ts_id *ops, uint32_t n, uint8_t *mark);
/* Whether every op reading buffer t is a dma.gather and no ld reads it. */
bool ts_buf_gathered_only(const tcp_sched *s, int32_t t);
/* Writers and readers of buffer b among all ops (an op both reading and
 * writing it counts as both); the last of each in *w / *r (TS_NONE: none). */
void ts_buf_uses(const tcp_sched *s, ts_id b, uint32_t *nw, uint32_t *nr, ts_id *w, ts_id *r);
/* The dispatch's byte offsets into HBM list ibh: its one writer a dma.copy
 * (*cp) from a DM buffer (*ib) that no ld reads, written once by a tu.vec
 * (*vb) multiplying n positions by row_bytes, and read by the copy alone. */
bool ts_offsets_pass(const tcp_sched *s, ts_id ibh, int64_t row_bytes, int64_t n, ts_id *cp, ts_id *ib, ts_id *vb);
/* Whether every op touching buffer t, but those with skip[op] set, reads it
 * in loop l's body through a view moved by $g one block stride p per block,
 * within that block, and no ld reads t. */
bool ts_buf_read_per_block(const tcp_sched *s, const ts_loop *l, int32_t t, int64_t p, const uint8_t *skip);
/* Whether view v's first n strides are st[0..n). */
bool ts_view_strides(const tcp_view *v, int n, const int64_t *st);
/* The i32 words of one HBM access granule (at least 1): a scattered row of
 * a whole granule is written without a read-modify-write. */
int64_t ts_granule_words(const tcp_sched *s);
/* Op o's instruction becomes in (NULL: its own, changed in place): its
 * phase kept, its context taken from the opcode, its cost to be priced
 * again, feature set. */
void ts_set_insn(tcp_sched *s, ts_id o, const tcp_insn *in, uint16_t feature);
/* Layout lay, its slices and copies kept, resized to hold n bytes (whole
 * flits per slice, at least one). */
ts_layout ts_layout_spread(const tcp_sched *s, ts_layout lay, int64_t n);
/* Points source view v of in at buffer t from element base, one row read
 * for every iteration (no register, every stride but the innermost 0). */
void ts_view_fixed_row(const tcp_insn *in, tcp_view *v, int32_t t, int64_t base);

/* A rewrite applied while it finds a site: defines ts_rw_<id>_applies and
 * _apply from `static bool find(const tcp_sched *, T *)` and
 * `static void fn(tcp_sched *, const T *, uint16_t feature)`. */
#define TS_RW_EACH_SITE(id, T, fn)                                                          \
	bool ts_rw_##id##_applies(const tcp_sched *s, const ts_env *e)                      \
	{                                                                                   \
		(void)e;                                                                    \
		T x;                                                                        \
		return find(s, &x);                                                         \
	}                                                                                   \
	moe_status ts_rw_##id##_apply(tcp_sched *s, const ts_env *e, uint16_t feature)      \
	{                                                                                   \
		(void)e;                                                                    \
		T x;                                                                        \
		if (!find(s, &x))                                                           \
			return MOE_ERR_INVALID;                                             \
		do                                                                          \
			fn(s, &x, feature);                                                 \
		while (find(s, &x));                                                        \
		return MOE_OK;                                                              \
	}

/* Whether views x and y name the same buffer, base, register (and its scale)
 * and strides over nd dimensions. */
bool ts_same_view(const tcp_view *x, const tcp_view *y, int nd);
/* The elements of in's iteration space (the product of its dims). */
int64_t ts_insn_numel(const tcp_insn *in);
/* Whether view v over dims dim[0..nd) is row-major contiguous. */
bool ts_view_contiguous(const tcp_view *v, int nd, const int64_t *dim);
/* Whether op q writes buffer t (its destination) / reads it (a source view). */
static inline bool ts_op_writes(const ts_op *q, int32_t t)
{
	return q->in.v[TCP_V_DST].t == t;
}
static inline bool ts_op_reads(const ts_op *q, int32_t t)
{
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
		if (q->in.v[w].t == t)
			return true;
	return false;
}

/* A trial: a copy of a schedule read back from its text (the round trip is
 * exact), fn(copy, arg) applied when fn is set (false: the trial fails);
 * with price, the copy placed (tcp_dm_place), verified and predicted on
 * expected loads. Diagnostics reported by a trial are dropped. */
typedef struct ts_trial {
	const char *what; /* the copy's file name in diagnostics */
	bool (*fn)(tcp_sched *c, void *arg);
	void *arg;
	bool price;
	/* the TS_REUSE_* the copy is placed and priced with where the schedule's
	 * is unordered (trial_on takes the stronger of the two); ts_trial_for
	 * sets it */
	uint8_t reuse;
	/* -1: the placed copy is verified before it is predicted; else it is
	 * verified only where its prediction is at most verify_at (a copy
	 * predicted slower is not taken whether or not it verifies, and the
	 * trial returns its unverified cycles) */
	int64_t verify_at;
} ts_trial;
/* The trial of a rewrite run with env e. Its reuse is e's at either stage:
 * before placement (TS_RW_STRUCT) the schedule is unordered, and its copy
 * is placed and priced with the reuse edges the compile will place; after
 * placement (TS_RW_PEEP) the schedule carries e's mode already (the driver
 * sets it before placing), so the copy keeps its own. */
static inline ts_trial ts_trial_for(const ts_env *e, const char *what, bool (*fn)(tcp_sched *c, void *arg), void *arg,
	bool price)
{
	return (ts_trial){what, fn, arg, price, e->reuse, -1};
}
/* s's text for trials (ctx_alloc'd, *len + 1 bytes); NULL where it does not
 * print. An allocator's refusal throws (out of memory): a refusal fails the
 * compile and never yields a program that merely lacks a rewrite. */
char *ts_trial_text(const tcp_sched *s, size_t *len);
/* The trial t on text (s's, from ts_trial_text): -1 where reading, fn,
 * placement or verification (t->verify_at) fails; else the predicted
 * cycles with t->price, 0 without. */
int64_t ts_trial_run(const tcp_sched *s, const char *text, size_t len, const ts_trial *t);
/* ts_trial_text and ts_trial_run in one: -1 also where s does not print. */
int64_t ts_trial_of(const tcp_sched *s, const ts_trial *t);

/* The top region's items before its first child region (the block loop's
 * region): returns end, with *lead past the leading scalars and
 * dependency-free ops, so [lead, end) is the segment that routing and the
 * dispatch occupy before the loop. */
uint32_t ts_loop_segment(const tcp_sched *s, uint32_t *lead);

/* Where ts_segment_reorder puts a moved op: just after the last of its
 * dependencies, or just after the moved ops before it (their order kept). */
typedef enum { TS_LAND_AFTER_DEPS, TS_LAND_IN_ORDER } ts_land;

/* The items of [lead, end) of the top region, in out, with every op marked
 * in mv moved earlier by the rule land, never above a scalar item before
 * it; the others keep their order. Returns how many items stand elsewhere
 * than before (0: out is the segment as it is). */
uint32_t ts_segment_reorder(const tcp_sched *s, uint32_t lead, uint32_t end, const uint8_t *mv, ts_land land,
	uint32_t *out);

/* early-passes and shared-first (rw/early_passes.c): the ops standing in
 * the top region after the block loop that read no scalar and depend, at
 * distance 0, only on ops before the loop or on ops moved with them, moved
 * in their order to just before the loop (ahead of the scalars and the other
 * contexts' commands right before it): tu.vec passes only, or with any ops
 * of every context where at least one of them is a DMA command. */
bool ts_hoist_before_loop_applies(const tcp_sched *s, const ts_env *e, bool any);
moe_status ts_hoist_before_loop(tcp_sched *s, const ts_env *e, bool any);
/* The same with only the first `limit` ops of the set (in item order) moved. */
moe_status ts_hoist_before_loop_n(tcp_sched *s, const ts_env *e, bool any, uint32_t limit);
/* The set's ops in item order into ops (s->nop entries); their count (0 where
 * the rewrite does not apply). */
uint32_t ts_hoist_before_loop_set(const tcp_sched *s, const ts_env *e, bool any, ts_id *ops);

/* Drops the diagnostics reported since the first n (keeps those). */
void ts_diag_truncate(moe_ctx *ctx, size_t n);

#endif
