/* backend-tcp/compiler/sched_verify.c: the schedule verifier
 * (docs/tcp-compiler.md 5.6), the rules that need no cost model: ids in
 * range, regions a tree holding every op and scalar once, scalars defined
 * before use, buffers and layouts consistent, each op's views inside their
 * buffers and in the spaces its command reads and writes, dependencies
 * acyclic and each distance-0 one on an earlier op in program order, every
 * pair of ops that touch the same bytes (one writing) ordered by a
 * dependency path, and no two placed buffers sharing bytes
 * while both are live; with reuse ordered, the accesses of two buffers on
 * shared bytes ordered too (context order counting as a path). */
#include <inttypes.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/sched.h"

enum { V_BUF, V_OP, V_SC, V_RG, V_NONE };
/* VMAX_DEPTH: the reader's nesting cap, so that a verified schedule prints and reads back */
enum { VMAX_ERRORS = 20, VMAX_DEPTH = 64, VMAX_HAZARD_OPS = 8192 };

typedef struct vs {
	const tcp_sched *s;
	int errors;
	/* the walk (program order) */
	uint8_t *op_seen, *sc_seen, *rg_seen;
	uint8_t *visible;      /* scalars defined on the path walked so far */
	ts_id *def_stack;      /* scalars in definition order, popped on leaving a region */
	uint32_t ndef;
	uint32_t *op_pos;      /* program position of each op */
	int8_t *op_loop;       /* the loop an op runs in, -1 */
	uint32_t pos;
	uint32_t loop_lo[2], loop_hi[2];
	int64_t body_lo[2], body_hi[2]; /* the body's ops, inclusive (hi < lo: none) */
	bool reach_done; /* check_deps filled check_hazards' closure */
	ts_id *ctx_prev; /* reuse ordered: the op before each on its context (not exclusive with it), TS_NONE */
	ts_excl excl;    /* ts_ops_exclusive by region pair, once the structure checks passed */
} vs;


static void verr(vs *v, int kind, uint32_t id, const char *fmt, ...) MOE_PRINTF(4, 5);
static void verr(vs *v, int kind, uint32_t id, const char *fmt, ...)
{
	const tcp_sched *s = v->s;
	if (++v->errors > VMAX_ERRORS)
		return;
	char msg[400], who[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	int *lines[4] = {s->buf_line, s->op_line, s->sc_line, s->rg_line};
	uint32_t n[4] = {s->nbuf, s->nop, s->nsc, s->nrg};
	switch (kind) {
	case V_BUF: snprintf(who, sizeof who, "buffer %%%u: ", id); break;
	case V_OP: snprintf(who, sizeof who, "op @%u: ", id); break;
	case V_SC: snprintf(who, sizeof who, "scalar $%s: ", id < s->nsc ? s->sc[id].name : "?"); break;
	case V_RG: snprintf(who, sizeof who, "region #%u: ", id); break;
	default: who[0] = 0; break;
	}
	moe_loc loc = moe_loc_none();
	if (s->file && kind < V_NONE && lines[kind] && id < n[kind])
		loc = moe_loc_at(s->ctx, s->file, lines[kind][id], 1);
	moe_diag(s->ctx, MOE_DIAG_ERROR, loc, "%s%s", who, msg);
}

/* true when a * b (a + b) does not fit int64 */
static bool mul_ovf(int64_t a, int64_t b, int64_t *r)
{
	return __builtin_mul_overflow(a, b, r);
}

static bool add_ovf(int64_t a, int64_t b, int64_t *r)
{
	return __builtin_add_overflow(a, b, r);
}

static int64_t buf_numel(const ts_buf *b)
{
	int64_t n = 1;
	for (int k = 0; k < b->rank; k++)
		if (mul_ovf(n, b->shape[k], &n))
			return -1;
	return n;
}

/* Bytes of every slot, -1 on overflow. */
static int64_t buf_bytes(const ts_buf *b)
{
	int64_t n = buf_numel(b), r;
	if (n < 0 || mul_ovf(n, (int64_t)moe_dtype_size((moe_dtype)b->dtype), &r) || mul_ovf(r, b->slots, &r))
		return -1;
	return r;
}

static void check_layout(vs *v, ts_id i)
{
	const ts_buf *b = &v->s->buf[i];
	const ts_layout *l = &b->layout;
	const moe_tcp_machine *m = v->s->m;
	if (b->space == TCP_HBM) {
		if (l->nslices || l->copies || l->slice_bytes || l->slice0 || l->split)
			verr(v, V_BUF, i, "an HBM buffer has no slice layout");
		return;
	}
	if (l->split >= TS_NSPLIT || l->nslices < 1 || l->copies < 1) {
		verr(v, V_BUF, i, "a %s buffer needs a layout over >= 1 slice and >= 1 copy", ts_space_names[b->space]);
		return;
	}
	int64_t need = buf_bytes(b), have;
	if (need < 0 || mul_ovf(l->slice_bytes, l->nslices, &have) || have < need)
		verr(v, V_BUF, i, "layout holds %" PRId64 " bytes per copy (%u slices x %" PRId64 "), the buffer needs %" PRId64,
			mul_ovf(l->slice_bytes, l->nslices, &have) ? -1 : have, l->nslices, l->slice_bytes, need);
	if (!m)
		return;
	int64_t S = tcp_slices(m), used = (int64_t)l->nslices * l->copies;
	if (l->slice0 + used > S)
		verr(v, V_BUF, i, "layout uses slices %u..%" PRId64 ", the machine has %" PRId64, l->slice0, l->slice0 + used - 1, S);
	if (m->flit_bytes > 0 && l->slice_bytes % m->flit_bytes)
		verr(v, V_BUF, i, "a slice's share of %" PRId64 " bytes is not whole %" PRId64 "-byte flits", l->slice_bytes,
			m->flit_bytes);
	int64_t cap = tcp_space_bytes(m, b->space);
	int64_t end;
	if (b->offset >= 0 && (add_ovf(b->offset, l->slice_bytes, &end) || end > cap))
		verr(v, V_BUF, i, "placed at %" PRId64 " with %" PRId64 " bytes per slice, past the %" PRId64 " bytes of %s",
			b->offset, l->slice_bytes, cap, ts_space_names[b->space]);
}

static void check_bufs(vs *v)
{
	const tcp_sched *s = v->s;
	for (ts_id i = 0; i < s->nbuf; i++) {
		const ts_buf *b = &s->buf[i];
		if (b->space >= TCP_NSPACE || b->kind >= TCP_NKIND || b->dtype >= MOE_DTYPE_COUNT ||
			(b->rank < 1 && (b->space != TCP_HBM || b->kind != TCP_T_INPUT)) || b->rank > MOE_MAX_RANK) {
			verr(v, V_BUF, i, "bad space, kind, dtype or rank");
			continue;
		}
		for (int k = 0; k < b->rank; k++)
			if (b->shape[k] < 1)
				verr(v, V_BUF, i, "shape size %d is %" PRId64 " (>= 1)", k, b->shape[k]);
		if (buf_bytes(b) < 0)
			verr(v, V_BUF, i, "its size overflows");
		if (b->kind != TCP_T_SCRATCH && b->space != TCP_HBM)
			verr(v, V_BUF, i, "%s buffers live in HBM, not %s", tcp_kind_names[b->kind], ts_space_names[b->space]);
		if (b->kind != TCP_T_WEIGHT && b->kind != TCP_T_PACKED && b->source[0])
			verr(v, V_BUF, i, "only a weight has a checkpoint source");
		if (!ts_slots_ok(b->slots))
			verr(v, V_BUF, i, "slots must be 1, 2, 4 or 8, not %u", b->slots);
		if (b->life >= TS_NLIFE)
			verr(v, V_BUF, i, "bad lifetime %u", b->life);
		else if (b->life == TS_LIFE_SPAN && (b->first >= s->nop || b->last >= s->nop))
			verr(v, V_BUF, i, "its span names op @%u..@%u of %u ops", b->first, b->last, s->nop);
		else if (b->life != TS_LIFE_SPAN && (b->first != TS_NONE || b->last != TS_NONE))
			verr(v, V_BUF, i, "only a span lifetime names its first and last op");
		if ((b->life == TS_LIFE_LOOP || b->life == TS_LIFE_BLOCK) && s->nloop == 0)
			verr(v, V_BUF, i, "a %s lifetime without a loop", ts_life_names[b->life]);
		if (b->offset < -1)
			verr(v, V_BUF, i, "offset %" PRId64 " (-1: not placed)", b->offset);
		check_layout(v, i);
	}
}

static void check_scalars(vs *v)
{
	const tcp_sched *s = v->s;
	for (ts_id i = 0; i < s->nsc; i++) {
		const ts_scalar *c = &s->sc[i];
		bool ok = true;
		switch (c->kind) {
		case TS_SC_CONST: ok = c->a == TS_NONE && c->b == TS_NONE; break;
		case TS_SC_SPM_LD:
			ok = c->buf < s->nbuf && (c->a == TS_NONE || c->a < s->nsc) && c->b == TS_NONE;
			if (ok && s->buf[c->buf].dtype != MOE_I32)
				verr(v, V_SC, i, "ld reads i32 buffers, '%s' is %s", s->buf[c->buf].name,
					moe_dtype_name((moe_dtype)s->buf[c->buf].dtype));
			break;
		case TS_SC_ALU:
		case TS_SC_CMP:
			ok = c->a < s->nsc && (c->b == TS_NONE || c->b < s->nsc) &&
			     c->op < (c->kind == TS_SC_ALU ? TCP_S_COUNT : TCP_C_COUNT);
			break;
		case TS_SC_LOOPVAR: ok = c->a < s->nsc && c->b < s->nsc; break;
		case TS_SC_LOOPIDX: ok = c->imm >= 0 && c->imm < s->nloop; break;
		default: ok = false; break;
		}
		if (!ok)
			verr(v, V_SC, i, "bad kind, operation or operand (an id out of range)");
	}
}

/* ---- the walk in program order: the tree, definitions before uses ---- */
static bool visible(vs *v, ts_id sc)
{
	return sc < v->s->nsc && v->visible[sc];
}

static void need_scalar(vs *v, int kind, uint32_t id, ts_id sc, const char *what)
{
	if (sc >= v->s->nsc)
		verr(v, kind, id, "%s names scalar %u of %u", what, sc, v->s->nsc);
	else if (!visible(v, sc))
		verr(v, kind, id, "%s uses $%s before its definition (or outside the region defining it)", what,
			v->s->sc[sc].name);
}

static void walk_op(vs *v, ts_id r, ts_id id, int loop)
{
	const tcp_sched *s = v->s;
	if (id >= s->nop)
		return verr(v, V_RG, r, "holds op @%u of %u", id, s->nop);
	if (v->op_seen[id]++)
		return verr(v, V_OP, id, "appears twice in the regions");
	if (s->op[id].region != r)
		verr(v, V_OP, id, "its region is #%u, it stands in #%u", s->op[id].region, r);
	v->op_pos[id] = v->pos++;
	v->op_loop[id] = (int8_t)loop;
	static const char *const vn[TCP_NVIEW] = {"view dst", "view s0", "view s1", "view s2"};
	const tcp_insn *in = &s->op[id].in;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && in->v[w].reg >= 0)
			need_scalar(v, V_OP, id, (ts_id)in->v[w].reg, vn[w]);
	if (in->vreg >= 0)
		need_scalar(v, V_OP, id, (ts_id)in->vreg, "valid");
}

static void walk_scalar(vs *v, ts_id r, ts_id id)
{
	const tcp_sched *s = v->s;
	if (id >= s->nsc)
		return verr(v, V_RG, r, "holds scalar %u of %u", id, s->nsc);
	if (v->sc_seen[id]++)
		return verr(v, V_SC, id, "defined twice in the regions");
	const ts_scalar *c = &s->sc[id];
	if (c->region != r)
		verr(v, V_SC, id, "its region is #%u, it stands in #%u", c->region, r);
	if (c->kind == TS_SC_ALU || c->kind == TS_SC_CMP || c->kind == TS_SC_LOOPVAR ||
		(c->kind == TS_SC_SPM_LD && c->a != TS_NONE))
		need_scalar(v, V_SC, id, c->a, "operand a");
	if ((c->kind == TS_SC_ALU || c->kind == TS_SC_CMP) && c->b != TS_NONE)
		need_scalar(v, V_SC, id, c->b, "operand b");
	v->visible[id] = 1;
	v->def_stack[v->ndef++] = id;
}

static void walk_region(vs *v, ts_id r, ts_id parent, int depth, int loop);

static void walk_items(vs *v, ts_id r, int depth, int loop)
{
	const ts_region *g = &v->s->rg[r];
	for (uint32_t k = 0; k < g->nitem && v->errors <= VMAX_ERRORS; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		switch (TS_ITEM_KIND(it)) {
		case TS_ITEM_OP: walk_op(v, r, id, loop); break;
		case TS_ITEM_SC: walk_scalar(v, r, id); break;
		case TS_ITEM_RG:
			if (id >= v->s->nrg)
				verr(v, V_RG, r, "holds region #%u of %u", id, v->s->nrg);
			else
				walk_region(v, id, r, depth + 1, loop);
			break;
		default: verr(v, V_RG, r, "item %u has no kind", k); break;
		}
	}
}

static void walk_loop(vs *v, ts_id r, int depth)
{
	const tcp_sched *s = v->s;
	uint32_t li = s->rg[r].loop;
	if (li >= (uint32_t)s->nloop || s->loop[li].region != r)
		return verr(v, V_RG, r, "a loop region names loop %u, which is not its own", li);
	const ts_loop *l = &s->loop[li];
	if (s->rg[r].nitem)
		verr(v, V_RG, r, "a loop region holds its three parts, not items");
	if (l->G < 1)
		verr(v, V_RG, r, "loop %u: grid %" PRId64 " (>= 1)", li, l->G);
	need_scalar(v, V_RG, r, l->nb, "the loop's block count nb");
	if (l->g >= s->nsc || s->sc[l->g].kind != TS_SC_LOOPIDX || s->sc[l->g].imm != (int64_t)li)
		verr(v, V_RG, r, "loop %u: g must be a 'loopidx %u' scalar", li, li);
	if ((l->expert != TS_NONE && l->expert >= s->nsc) || (l->rows != TS_NONE && l->rows >= s->nsc))
		verr(v, V_RG, r, "loop %u: expert or rows names no scalar", li);
	if (l->weights >= TS_NWEIGHTS)
		verr(v, V_RG, r, "loop %u: bad weights mode %u", li, l->weights);
	else if ((l->weights == TS_W_STREAM) != (l->ring == 2 || l->ring == 4 || l->ring == TS_MAX_RING) || (l->weights != TS_W_STREAM && l->ring))
		verr(v, V_RG, r, "loop %u: ring=%u with weights=%s (streamed weights have a ring of 2, 4 or 8 tiles, others none)",
			li, l->ring, ts_weights_names[l->weights]);
	else if (l->prefetch > 1 || (l->prefetch && l->weights != TS_W_DOUBLE))
		verr(v, V_RG, r, "loop %u: prefetch=%u with weights=%s (only double-buffered weights are prefetched, one block ahead)",
			li, l->prefetch, ts_weights_names[l->weights]);
	v->loop_lo[li] = v->pos;
	ts_id part[3] = {l->prologue, l->body, l->epilogue};
	for (int k = 0; k < 3; k++) {
		if (part[k] >= s->nrg || s->rg[part[k]].kind != TS_RG_SEQ) {
			verr(v, V_RG, r, "loop %u: its prologue, body and epilogue are sequence regions", li);
			continue;
		}
		if (k == 1)
			v->body_lo[li] = v->pos;
		walk_region(v, part[k], r, depth + 1, (int)li);
		if (k == 1)
			v->body_hi[li] = (int64_t)v->pos - 1;
	}
	/* the loop's last op, inclusive (the next op's position is not the loop's) */
	v->loop_hi[li] = v->pos > v->loop_lo[li] ? v->pos - 1 : v->loop_lo[li];
}

static void walk_classes(vs *v, ts_id r, int depth, int loop)
{
	const ts_region *g = &v->s->rg[r];
	if (g->nbound < 1 || g->nitem != g->nbound)
		verr(v, V_RG, r, "classes: %u bound(s) and %u case(s); one case per bound, at least one", g->nbound, g->nitem);
	for (uint32_t k = 0; k < g->nbound; k++)
		if (g->bound[k] < 1 || (k && g->bound[k] <= g->bound[k - 1]))
			verr(v, V_RG, r, "classes: bounds increase from >= 1 (bound %u is %" PRId64 ")", k, g->bound[k]);
	for (uint32_t k = 0; k < g->nitem; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) != TS_ITEM_RG || id >= v->s->nrg || v->s->rg[id].kind != TS_RG_SEQ) {
			verr(v, V_RG, r, "classes: case %u is not a sequence region", k);
			continue;
		}
		uint32_t mark = v->ndef;
		walk_region(v, id, r, depth + 1, loop);
		while (v->ndef > mark) /* a case's scalars are not defined after it */
			v->visible[v->def_stack[--v->ndef]] = 0;
	}
}

static void walk_region(vs *v, ts_id r, ts_id parent, int depth, int loop)
{
	const tcp_sched *s = v->s;
	const ts_region *g = &s->rg[r];
	if (depth > VMAX_DEPTH)
		return verr(v, V_RG, r, "regions nested deeper than %d", VMAX_DEPTH);
	if (v->rg_seen[r]++)
		return verr(v, V_RG, r, "appears twice: the regions are not a tree");
	if (g->parent != parent)
		verr(v, V_RG, r, "its parent is #%u, it stands in #%u", g->parent, parent);
	if (g->kind >= TS_NRG)
		return verr(v, V_RG, r, "bad kind %u", g->kind);
	if (g->kind == TS_RG_GUARD || g->kind == TS_RG_CLASSES)
		need_scalar(v, V_RG, r, g->pred, g->kind == TS_RG_GUARD ? "the guard's predicate" : "the classes' row count");
	else if (g->pred != TS_NONE)
		verr(v, V_RG, r, "only a guard or classes region has a scalar");
	if (g->kind != TS_RG_CLASSES && g->nbound)
		verr(v, V_RG, r, "only a classes region has bounds");
	uint32_t mark = v->ndef;
	if (g->kind == TS_RG_LOOP)
		walk_loop(v, r, depth);
	else if (g->kind == TS_RG_CLASSES)
		walk_classes(v, r, depth, loop);
	else
		walk_items(v, r, depth, loop);
	/* a guard's or a loop's scalars may not have run: not defined after it */
	if (g->kind == TS_RG_GUARD || g->kind == TS_RG_LOOP)
		while (v->ndef > mark)
			v->visible[v->def_stack[--v->ndef]] = 0;
}

static void walk(vs *v)
{
	const tcp_sched *s = v->s;
	if (s->top >= s->nrg || s->rg[s->top].kind != TS_RG_SEQ)
		return verr(v, V_NONE, 0, "the root region #%u is not a sequence region", s->top);
	walk_region(v, s->top, TS_NONE, 0, -1);
	for (ts_id i = 0; i < s->nop && v->errors <= VMAX_ERRORS; i++)
		if (!v->op_seen[i])
			verr(v, V_OP, i, "stands in no region reached from the root");
	for (ts_id i = 0; i < s->nsc && v->errors <= VMAX_ERRORS; i++)
		if (!v->sc_seen[i])
			verr(v, V_SC, i, "stands in no region reached from the root");
	for (ts_id i = 0; i < s->nrg && v->errors <= VMAX_ERRORS; i++)
		if (!v->rg_seen[i])
			verr(v, V_RG, i, "is not reached from the root region");
}

/* ---- ops: fields, views and the spaces each command reads and writes ---- */
typedef struct access {
	ts_id op, buf;
	int64_t lo, hi;        /* bytes of the buffer (every slot), inclusive */
	bool write;
	uint8_t ctx;           /* the op's context and region */
	ts_id rg;
	int64_t blk, blo, bhi; /* blk > 0: a view moved by loop 0's $g in steps of blk bytes,
	                        * within one step: bytes g blk + [blo, bhi] (lo, hi: all) */
} access;

typedef struct acc_list {
	access *a;
	uint32_t n, cap;
} acc_list;

#define SP(x) (1u << (x))

/* The iteration space a view walks (isa.c's validator uses the same). */
static int view_space(const tcp_insn *in, int w, int64_t d[TCP_MAXD])
{
	memcpy(d, in->dim, sizeof in->dim);
	bool gs = in->op == TCP_OP_DMA_GATHER || in->op == TCP_OP_DMA_SCATTER;
	if (gs && w == TCP_V_S1)
		return 2;
	if (gs) {
		bool g = in->op == TCP_OP_DMA_GATHER;
		d[1] = (w == TCP_V_DST) == g ? in->dim[1] : in->rows;
		return 3;
	}
	if (in->op == TCP_OP_TU_CONTRACT) {
		int zero = w == TCP_V_DST || (w == TCP_V_S2 && !(in->flags & TCP_F_SCALED)) ? 2 : w == TCP_V_S0 ? 1 : 0;
		/* scaled: f8 chunks of 128 along I; an i8 pair's one scale per
		 * output has its third stride 0 (rowdiv: the row factors' offset) */
		if (w == TCP_V_S2 && (in->flags & TCP_F_SCALED))
			d[2] = (in->flags & TCP_F_ROWDIV) ? 2
			       : in->dim[2] >= TCP_SCALE_CHUNK ? in->dim[2] / TCP_SCALE_CHUNK : 1;
		else
			d[zero] = 1;
		return 3;
	}
	return in->ndim;
}

/* Allowed spaces of view w of a command (0: the view must be absent), and
 * whether it must be present. */
static unsigned view_spaces(const tcp_insn *in, int w, bool *need)
{
	unsigned dmh = SP(TCP_HBM) | SP(TCP_DM);
	*need = w == TCP_V_DST || w == TCP_V_S0;
	switch ((tcp_opcode)in->op) {
	case TCP_OP_DMA_COPY: return w <= TCP_V_S0 ? dmh : 0;
	case TCP_OP_DMA_GATHER:
		*need = w <= TCP_V_S1;
		return w == TCP_V_DST ? SP(TCP_DM) : w == TCP_V_S0 ? SP(TCP_HBM) : w == TCP_V_S1 ? dmh : 0;
	case TCP_OP_DMA_SCATTER:
		*need = w <= TCP_V_S1;
		return w == TCP_V_DST ? SP(TCP_HBM) : w == TCP_V_S0 ? SP(TCP_DM) : w == TCP_V_S1 ? dmh : 0;
	case TCP_OP_DMA_SPM: *need = w == TCP_V_S0; return w == TCP_V_DST ? 0 : dmh;
	case TCP_OP_SUB_TRF: return w == TCP_V_DST ? SP(TCP_TRF) : w == TCP_V_S0 ? SP(TCP_DM) : 0;
	case TCP_OP_SUB_VRF: return w == TCP_V_DST ? SP(TCP_VRF) : w == TCP_V_S0 ? SP(TCP_DM) : 0;
	case TCP_OP_TU_VEC:
		*need = w == TCP_V_DST || (w == TCP_V_S0 && in->nstep == 0);
		return w == TCP_V_DST ? SP(TCP_DM) : SP(TCP_DM) | SP(TCP_VRF);
	case TCP_OP_TU_CONTRACT:
		*need = w <= TCP_V_S1 || (w == TCP_V_S2 && (in->flags & (TCP_F_ACC | TCP_F_SCALED)));
		return w == TCP_V_S1 ? SP(TCP_TRF) : SP(TCP_DM);
	default: return 0;
	}
}

/* The slot a scalar selects in a block: 0 for `alu.and $g, 1` (the block's
 * own slot of a two-slot buffer) or `alu.and $x, 1` where $x is `alu.add
 * $p, $c` of a loopvar $p and a scalar $c (the own slot carried from the
 * previous block, rewrite same-expert), 1 for `alu.and $n, 1` where $n is
 * `alu.add $o, 1` of $g or of an own-slot scalar $o (the other slot), -1 for
 * any other scalar. */
static int slot_of(const tcp_sched *s, int32_t reg)
{
	const ts_scalar *c = reg >= 0 && (uint32_t)reg < s->nsc ? &s->sc[reg] : NULL;
	if (!c || c->kind != TS_SC_ALU || c->op != TCP_S_AND || c->b != TS_NONE || c->imm != 1 || c->a >= s->nsc)
		return -1;
	const ts_scalar *x = &s->sc[c->a];
	if (x->kind == TS_SC_LOOPIDX)
		return 0;
	if (x->kind != TS_SC_ALU || x->op != TCP_S_ADD || x->a >= s->nsc)
		return -1;
	if (x->b != TS_NONE)
		return s->sc[x->a].kind == TS_SC_LOOPVAR && x->b < s->nsc ? 0 : -1;
	bool next = x->imm == 1 && (s->sc[x->a].kind == TS_SC_LOOPIDX || slot_of(s, (int32_t)x->a) == 0);
	return next ? 1 : -1;
}

/* The bytes a view may touch: its static extent, or the whole buffer when
 * an offset scalar moves it, except a view inside one slot of a two-slot
 * buffer moved by a slot scalar (slot_of): that slot, numbered as one block
 * sees it (the block's own slot 0, the next block's 1; a static view of
 * slot 0 is block 0's, which the prologue fills); [*ea, *ez] its elements
 * before any offset scalar. False (with a diagnostic) when out of bounds. */
static bool view_bytes(vs *v, ts_id id, int w, int64_t *lo, int64_t *hi, int64_t *ea, int64_t *ez)
{
	static const char *const vn[TCP_NVIEW] = {"dst", "s0", "s1", "s2"};
	const tcp_insn *in = &v->s->op[id].in;
	const tcp_view *vw = &in->v[w];
	const ts_buf *b = &v->s->buf[vw->t];
	int64_t d[TCP_MAXD], a = vw->base, z = vw->base, t;
	int nd = view_space(in, w, d);
	for (int k = 0; k < nd; k++)
		if (d[k] < 1 || mul_ovf(vw->stride[k], d[k] - 1, &t) || (t < 0 ? add_ovf(a, t, &a) : add_ovf(z, t, &z)))
			return verr(v, V_OP, id, "view %s: its extent overflows", vn[w]), false;
	*ea = a;
	*ez = z;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)b->dtype), bytes = buf_bytes(b);
	bool nib = in->op == TCP_OP_TU_VEC && w == TCP_V_S0 && (in->flags & (TCP_F_E2M1 | TCP_F_I4));
	int64_t units = nib ? bytes * 2 : bytes / es; /* elements of every slot */
	if (vw->reg < 0 && (a < 0 || z >= units))
		return verr(v, V_OP, id, "view %s: elements [%" PRId64 ", %" PRId64 "] outside buffer %%%d '%s' of %" PRId64,
			       vn[w], a, z, vw->t, b->name, units),
		       false;
	int64_t wide;
	if (vw->reg >= 0 && (__builtin_sub_overflow(z, a, &wide) || wide >= units || a > units))
		return verr(v, V_OP, id,
			       "view %s: elements [%" PRId64 ", %" PRId64 "] (plus its offset) do not fit buffer %%%d '%s' of %" PRId64,
			       vn[w], a, z, vw->t, b->name, units),
		       false;
	int slot = b->slots == 2 && vw->reg >= 0 ? slot_of(v->s, vw->reg) : -1;
	if (b->slots == 2 && vw->reg >= 0 && ts_group_half(v->s, vw->reg))
		slot = 1; /* the next group's half (group-fetch) */
	if (b->slots == 2 && vw->reg >= 0 && !nib && vw->scale > 0 && units % (2 * vw->scale) == 0 && a >= 0 &&
		z < vw->scale && ts_group_slot(v->s, vw->reg, units / vw->scale)) {
		/* an entry of the block's own group: its half, numbered 0 */
		*lo = 0;
		*hi = units / 2 * es - 1;
	} else if (slot >= 0 && vw->scale * 2 == units && a >= 0 && z < vw->scale) {
		*lo = nib ? (slot * vw->scale + a) / 2 : (slot * vw->scale + a) * es;
		*hi = nib ? (slot * vw->scale + z) / 2 : (slot * vw->scale + z) * es + es - 1;
	} else if (vw->reg >= 0) {
		*lo = 0;
		*hi = bytes - 1;
	} else {
		*lo = nib ? a / 2 : a * es;
		*hi = nib ? z / 2 : z * es + es - 1;
	}
	return true;
}

static void add_access(vs *v, acc_list *L, access a)
{
	ctx_grow(v->s->ctx, (void **)&L->a, &L->cap, L->n + 1, sizeof *L->a);
	L->a[L->n++] = a;
}

/* A view of a one-slot buffer moved by loop 0's index $g (scale elements
 * per block) whose element extent [lo, hi] (view_bytes') stays within one
 * step: a->blk, blo, bhi. */
static void block_view(vs *v, ts_id id, int w, int64_t lo, int64_t hi, access *a)
{
	const tcp_sched *s = v->s;
	const tcp_insn *in = &s->op[id].in;
	const tcp_view *vw = &in->v[w];
	if (!s->nloop || vw->reg < 0 || (ts_id)vw->reg != s->loop[0].g || vw->scale <= 0 ||
		s->buf[vw->t].slots != 1 || (in->op == TCP_OP_TU_VEC && w == TCP_V_S0 && (in->flags & (TCP_F_E2M1 | TCP_F_I4))) ||
		lo < 0 || hi >= vw->scale)
		return;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)s->buf[vw->t].dtype);
	a->blk = vw->scale * es;
	a->blo = lo * es;
	a->bhi = hi * es + es - 1;
}

/* The least $g of loop 0 under which op o runs, from the classes regions
 * above it keyed on $g + d (`alu.add $g, d`, `alu.sub $g, -d`, or $g): a case
 * past the first runs only where the key exceeds the bound before it. */
static int64_t g_least(const tcp_sched *s, ts_id o)
{
	int64_t least = 0;
	ts_id r = s->op[o].region;
	for (int depth = 0; r < s->nrg && depth < VMAX_DEPTH; depth++) {
		ts_id up = s->rg[r].parent;
		if (up >= s->nrg)
			break;
		const ts_region *c = &s->rg[up];
		if (c->kind == TS_RG_CLASSES && c->pred < s->nsc) {
			const ts_scalar *k = &s->sc[c->pred];
			bool keyed = c->pred == s->loop[0].g;
			int64_t off = 0; /* key = $g + off */
			if (!keyed && k->kind == TS_SC_ALU && (k->op == TCP_S_ADD || k->op == TCP_S_SUB) &&
				k->a == s->loop[0].g && k->b == TS_NONE && k->imm > -(1ll << 40) && k->imm < (1ll << 40)) {
				keyed = true;
				off = k->op == TCP_S_ADD ? k->imm : -k->imm;
			}
			uint32_t i = 0;
			while (i < c->nitem && c->item[i] != (TS_ITEM_RG | r))
				i++;
			if (keyed && i > 0 && i < c->nitem && i <= c->nbound && c->bound[i - 1] - off + 1 > least)
				least = c->bound[i - 1] - off + 1;
		}
		r = up;
	}
	return least;
}

/* Whether accesses a and b of one buffer, both in loop 0's body, never meet
 * in one block: one moved by $g (block_view), the other a fixed range below
 * block g's bytes for every g the two run under. */
static bool below_block(const vs *v, const access *a, const access *b)
{
	const tcp_sched *s = v->s;
	if (!s->nloop || (a->blk > 0) == (b->blk > 0))
		return false;
	const access *m = a->blk > 0 ? a : b, *f = a->blk > 0 ? b : a;
	ts_id body = s->loop[0].body;
	if (!ts_region_within(s, m->rg, body) || !ts_region_within(s, f->rg, body))
		return false;
	int64_t g = g_least(s, m->op), gf = g_least(s, f->op);
	if (gf > g)
		g = gf;
	return f->hi < g * m->blk + m->blo;
}

static void check_views(vs *v, ts_id id, acc_list *L)
{
	static const char *const vn[TCP_NVIEW] = {"dst", "s0", "s1", "s2"};
	const tcp_insn *in = &v->s->op[id].in;
	for (int w = 0; w < TCP_NVIEW; w++) {
		bool need;
		unsigned sp = view_spaces(in, w, &need);
		const tcp_view *vw = &in->v[w];
		if (vw->t < 0) {
			if (need)
				verr(v, V_OP, id, "%s needs view %s", tcp_op_names[in->op], vn[w]);
			continue;
		}
		if ((uint32_t)vw->t >= v->s->nbuf) {
			verr(v, V_OP, id, "view %s names buffer %%%d of %u", vn[w], vw->t, v->s->nbuf);
			continue;
		}
		const ts_buf *b = &v->s->buf[vw->t];
		if (b->space >= TCP_NSPACE || b->rank < 1 || buf_bytes(b) <= 0)
			continue; /* reported with the buffer */
		if (!(sp & SP(b->space))) {
			verr(v, V_OP, id, "view %s: %s %s %s buffer %%%d '%s'", vn[w], tcp_op_names[in->op],
				sp ? "cannot use the" : "has no such view; it names the", ts_space_names[b->space], vw->t, b->name);
			continue;
		}
		int64_t lo, hi, ea, ez;
		if (view_bytes(v, id, w, &lo, &hi, &ea, &ez)) {
			access a = {id, (ts_id)vw->t, lo, hi, w == TCP_V_DST, v->s->op[id].ctx, v->s->op[id].region, 0, 0, 0};
			block_view(v, id, w, ea, ez, &a);
			add_access(v, L, a);
		}
	}
}

static void check_op(vs *v, ts_id id, acc_list *L)
{
	const ts_op *o = &v->s->op[id];
	const tcp_insn *in = &o->in;
	if (in->op >= TCP_OP_COUNT || tcp_op_ctx[in->op] == TCP_CTX_CTL)
		return verr(v, V_OP, id, "opcode %u is not a command (control is scalars and regions)", in->op);
	if (o->ctx != tcp_op_ctx[in->op])
		verr(v, V_OP, id, "context %u, %s runs on %s", o->ctx, tcp_op_names[in->op], tcp_ctx_names[tcp_op_ctx[in->op]]);
	if (o->phase >= TS_NPHASE)
		verr(v, V_OP, id, "bad phase %u", o->phase);
	if (in->rd != TCP_NOREG || in->ra != TCP_NOREG || in->rb != TCP_NOREG || in->sop || in->target)
		verr(v, V_OP, id, "a command has no register, condition or target fields");
	if (in->vreg >= 0 && (uint32_t)in->vreg >= v->s->nsc)
		verr(v, V_OP, id, "valid names scalar %d of %u", in->vreg, v->s->nsc);
	if (in->ndim < 1 || in->ndim > TCP_MAXD || in->nstep > TCP_MAXSTEP)
		return verr(v, V_OP, id, "%u dimensions and %u steps (1..%d, 0..%d)", in->ndim, in->nstep, TCP_MAXD, TCP_MAXSTEP);
	for (int k = 0; k < in->ndim; k++)
		if (in->dim[k] < 1 || in->dim[k] > ((int64_t)1 << 31))
			return verr(v, V_OP, id, "dimension %d size %" PRId64 " outside [1, 2^31]", k, in->dim[k]);
	bool gs = in->op == TCP_OP_DMA_GATHER || in->op == TCP_OP_DMA_SCATTER;
	if ((gs && (in->ndim != 3 || in->rows < 1)) || (in->op == TCP_OP_TU_CONTRACT && in->ndim != 3))
		return verr(v, V_OP, id, "%s needs 3 dimensions%s", tcp_op_names[in->op], gs ? " and rows >= 1" : "");
	for (int k = 0; k < in->nstep; k++)
		if (in->step[k].op >= TCP_V_COUNT || in->step[k].x > TCP_SRC_NONE || in->step[k].y > TCP_SRC_NONE)
			verr(v, V_OP, id, "chain step %d: bad operation or source", k);
	if (in->nstep && in->op != TCP_OP_TU_VEC)
		verr(v, V_OP, id, "only tu.vec has a chain");
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && in->v[w].reg >= 0 && (uint32_t)in->v[w].reg >= v->s->nsc)
			return verr(v, V_OP, id, "a view's offset names scalar %d of %u", in->v[w].reg, v->s->nsc);
	check_views(v, id, L);
}

/* Program order (a bijection onto 0..nop-1 once the walk passed) as the
 * topological order, when every dependency is in range, every distance-0
 * one runs earlier and every distance-1 one joins two ops of one loop (no
 * diagnostic); with reach (words per op), the distance-0 closure filled in
 * that order on the way (check_hazards). False (order and reach to be
 * redone) otherwise. */
static bool deps_in_order(vs *v, uint32_t *order, uint64_t *reach, uint32_t words)
{
	const tcp_sched *s = v->s;
	for (ts_id i = 0; i < s->nop; i++)
		order[v->op_pos[i]] = i;
	for (uint32_t k = 0; k < s->nop; k++) {
		ts_id i = order[k];
		const ts_op *o = &s->op[i];
		uint64_t *r = reach ? reach + (size_t)i * words : NULL;
		for (uint32_t j = 0; j < o->ndep; j++) {
			ts_id d = o->dep[j];
			if (d >= s->nop)
				return false;
			if (o->dist[j] == 1) {
				if (v->op_loop[i] < 0 || v->op_loop[i] != v->op_loop[d])
					return false;
				continue;
			}
			if (o->dist[j] || v->op_pos[d] >= k)
				return false;
			if (r) {
				const uint64_t *rd = reach + (size_t)d * words;
				for (uint32_t w = 0; w < words; w++)
					r[w] |= rd[w];
				r[d / 64] |= 1ull << (d % 64);
			}
		}
		ts_id p = v->ctx_prev ? v->ctx_prev[i] : TS_NONE;
		if (r && p != TS_NONE) { /* one context runs its commands in order */
			const uint64_t *rp = reach + (size_t)p * words;
			for (uint32_t w = 0; w < words; w++)
				r[w] |= rp[w];
			r[p / 64] |= 1ull << (p % 64);
		}
	}
	return true;
}

/* ---- dependencies: in range, acyclic (distance 0); the order found ---- */
static bool check_deps(vs *v, uint32_t *order, uint64_t *reach)
{
	const tcp_sched *s = v->s;
	uint32_t words = (s->nop + 63) / 64;
	if (deps_in_order(v, order, reach, words)) {
		v->reach_done = reach != NULL;
		return true;
	}
	if (reach)
		memset(reach, 0, (size_t)s->nop * words * sizeof *reach);
	bool ok = true;
	for (ts_id i = 0; i < s->nop; i++)
		for (uint32_t k = 0; k < s->op[i].ndep; k++) {
			ts_id d = s->op[i].dep[k];
			uint8_t dist = s->op[i].dist[k];
			if (d >= s->nop || dist > 1) {
				verr(v, V_OP, i, "dependency %u: @%u^%u (ops 0..%u, distance 0 or 1)", k, d, dist, s->nop - 1);
				ok = false;
			} else if (dist == 0 && d == i) {
				verr(v, V_OP, i, "depends on itself");
				ok = false;
			} else if (dist == 1 && (v->op_loop[i] < 0 || v->op_loop[i] != v->op_loop[d])) {
				verr(v, V_OP, i, "a loop-carried dependency (@%u^1) joins two ops of one loop", d);
			}
		}
	if (!ok)
		return false;
	/* Kahn's algorithm over distance-0 edges: dep -> op */
	uint32_t *indeg = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *indeg), n = 0, head = 0;
	for (ts_id i = 0; i < s->nop; i++)
		for (uint32_t k = 0; k < s->op[i].ndep; k++)
			indeg[i] += s->op[i].dist[k] == 0;
	/* successors by scanning: build a CSR of dist-0 edges */
	uint32_t *start = ctx_alloc(s->ctx, (s->nop + 2) * sizeof *start), *succ, *fill;
	for (ts_id i = 0; i < s->nop; i++)
		for (uint32_t k = 0; k < s->op[i].ndep; k++)
			if (s->op[i].dist[k] == 0)
				start[s->op[i].dep[k] + 1]++;
	for (uint32_t i = 0; i < s->nop; i++)
		start[i + 1] += start[i];
	succ = ctx_alloc(s->ctx, (start[s->nop] + 1) * sizeof *succ);
	fill = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *fill);
	memcpy(fill, start, s->nop * sizeof *fill);
	for (ts_id i = 0; i < s->nop; i++)
		for (uint32_t k = 0; k < s->op[i].ndep; k++)
			if (s->op[i].dist[k] == 0)
				succ[fill[s->op[i].dep[k]]++] = i;
	for (ts_id i = 0; i < s->nop; i++)
		if (!indeg[i])
			order[n++] = i;
	while (head < n) {
		ts_id o = order[head++];
		for (uint32_t k = start[o]; k < start[o + 1]; k++)
			if (--indeg[succ[k]] == 0)
				order[n++] = succ[k];
	}
	if (n < s->nop) {
		ts_id c = 0;
		while (c < s->nop && !indeg[c])
			c++;
		verr(v, V_OP, c, "is on a dependency cycle (%u op(s) wait on one another)", s->nop - n);
	}
	/* the control processor issues in program order and the machine orders
	 * by hazards in that order: a distance-0 dependency on a later op is
	 * never what runs */
	bool forward = false;
	for (ts_id i = 0; i < s->nop && n == s->nop; i++)
		for (uint32_t k = 0; k < s->op[i].ndep; k++)
			if (s->op[i].dist[k] == 0 && v->op_pos[s->op[i].dep[k]] > v->op_pos[i]) {
				verr(v, V_OP, i, "waits (distance 0) for op @%u, which stands after it in program order",
					s->op[i].dep[k]);
				forward = true;
			}
	ctx_free(s->ctx, indeg, 0);
	ctx_free(s->ctx, start, 0);
	ctx_free(s->ctx, succ, 0);
	ctx_free(s->ctx, fill, 0);
	return n == s->nop && !forward;
}

/* Whether ops a and b sit in different cases of one classes region (never
 * both run). */
static int cmp_access(const void *x, const void *y)
{
	const access *a = x, *b = y;
	if (a->buf != b->buf)
		return a->buf < b->buf ? -1 : 1;
	return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : a->op < b->op ? -1 : a->op > b->op;
}

/* Every two accesses of overlapping bytes, one a write, by different ops,
 * ordered by a path of distance-0 dependencies (within one block). */
static void check_hazards(vs *v, const uint32_t *order, acc_list *L, uint64_t *reach)
{
	const tcp_sched *s = v->s;
	uint32_t n = s->nop, words = (n + 63) / 64;
	if (!reach)
		return;
	for (uint32_t k = 0; k < n && !v->reach_done; k++) {
		ts_id o = order[k];
		uint64_t *r = reach + (size_t)o * words;
		for (uint32_t d = 0; d < s->op[o].ndep; d++) {
			if (s->op[o].dist[d])
				continue;
			ts_id p = s->op[o].dep[d];
			const uint64_t *rp = reach + (size_t)p * words;
			for (uint32_t w = 0; w < words; w++)
				r[w] |= rp[w];
			r[p / 64] |= 1ull << (p % 64);
		}
		ts_id p = v->ctx_prev ? v->ctx_prev[o] : TS_NONE;
		if (p != TS_NONE) {
			const uint64_t *rp = reach + (size_t)p * words;
			for (uint32_t w = 0; w < words; w++)
				r[w] |= rp[w];
			r[p / 64] |= 1ull << (p % 64);
		}
	}
	qsort(L->a, L->n, sizeof *L->a, cmp_access);
	for (uint32_t i = 0; i < L->n && v->errors <= VMAX_ERRORS; i++)
		for (uint32_t j = i + 1; j < L->n && L->a[j].buf == L->a[i].buf && L->a[j].lo <= L->a[i].hi; j++) {
			const access *a = &L->a[i], *b = &L->a[j];
			if (a->op == b->op || !(a->write || b->write) || ts_excl_regions(&v->excl, a->rg, b->rg, a->op, b->op) ||
				below_block(v, a, b))
				continue;
			bool ab = reach[(size_t)b->op * words + a->op / 64] >> (a->op % 64) & 1;
			bool ba = reach[(size_t)a->op * words + b->op / 64] >> (b->op % 64) & 1;
			if (!ab && !ba)
				verr(v, V_OP, b->op,
					"%s buffer %%%u '%s' (bytes %" PRId64 "..%" PRId64 ") that op @%u %s, with no "
					"dependency path between them",
					b->write ? "writes" : "reads", b->buf, s->buf[b->buf].name, b->lo, b->hi, a->op,
					a->write ? "writes" : "reads");
		}
}

/* ---- placement: placed buffers sharing bytes are never live together ---- */
typedef struct placed {
	ts_id buf;
	uint8_t space;
	int64_t lo, hi;            /* bytes (per slice outside HBM), inclusive */
	uint32_t s0, s1;           /* slices, inclusive (HBM: 0, 0) */
	uint32_t t0, t1;           /* live between these program positions, inclusive */
} placed;

static int cmp_placed(const void *x, const void *y)
{
	const placed *a = x, *b = y;
	if (a->space != b->space)
		return a->space < b->space ? -1 : 1;
	return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : a->buf < b->buf ? -1 : a->buf > b->buf;
}

static bool live_range(vs *v, ts_id i, uint32_t *t0, uint32_t *t1)
{
	const tcp_sched *s = v->s;
	const ts_buf *b = &s->buf[i];
	*t0 = 0;
	*t1 = UINT32_MAX;
	if (b->life == TS_LIFE_SPAN) {
		*t0 = v->op_pos[b->first];
		*t1 = v->op_pos[b->last];
		if (*t0 > *t1) {
			verr(v, V_BUF, i, "its span's first op @%u runs after its last op @%u", b->first, b->last);
			return false;
		}
		/* a span live in part of a loop and not inside its body is live
		 * through the whole loop: a value live into or out of the body is
		 * live across all its blocks (the DM planner's rule, dmplan.c) */
		for (int l = 0; l < s->nloop && l < 2; l++)
			if (*t0 <= v->loop_hi[l] && v->loop_lo[l] <= *t1 && !(*t0 >= v->body_lo[l] && *t1 <= v->body_hi[l])) {
				*t0 = *t0 < v->loop_lo[l] ? *t0 : v->loop_lo[l];
				*t1 = *t1 > v->loop_hi[l] ? *t1 : v->loop_hi[l];
			}
	} else if (b->life == TS_LIFE_LOOP || b->life == TS_LIFE_BLOCK) {
		*t0 = v->loop_lo[0];
		*t1 = v->loop_hi[0];
		if (s->nloop > 1) {
			*t0 = *t0 < v->loop_lo[1] ? *t0 : v->loop_lo[1];
			*t1 = *t1 > v->loop_hi[1] ? *t1 : v->loop_hi[1];
		}
	}
	return true;
}

static void check_placement(vs *v)
{
	const tcp_sched *s = v->s;
	placed *P = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *P);
	uint32_t n = 0;
	for (ts_id i = 0; i < s->nbuf; i++) {
		const ts_buf *b = &s->buf[i];
		int64_t bytes = buf_bytes(b);
		if (b->offset < 0 || bytes <= 0 || b->space >= TCP_NSPACE)
			continue;
		placed p = {i, b->space, b->offset, 0, 0, 0, 0, 0};
		bool hbm = b->space == TCP_HBM;
		int64_t len = hbm ? bytes : b->layout.slice_bytes;
		if (len < 1 || add_ovf(b->offset, len - 1, &p.hi) || !live_range(v, i, &p.t0, &p.t1))
			continue;
		if (!hbm) {
			p.s0 = b->layout.slice0;
			p.s1 = b->layout.slice0 + (uint32_t)b->layout.nslices * b->layout.copies - 1;
		}
		P[n++] = p;
	}
	qsort(P, n, sizeof *P, cmp_placed);
	for (uint32_t i = 0; i < n && v->errors <= VMAX_ERRORS; i++)
		for (uint32_t j = i + 1; j < n && P[j].space == P[i].space && P[j].lo <= P[i].hi; j++) {
			const placed *a = &P[i], *b = &P[j];
			if (a->s1 < b->s0 || b->s1 < a->s0 || a->t1 < b->t0 || b->t1 < a->t0)
				continue;
			verr(v, V_BUF, b->buf, "shares %s bytes %" PRId64 "..%" PRId64 " with buffer %%%u '%s' while both are live",
				ts_space_names[a->space], b->lo, a->hi < b->hi ? a->hi : b->hi, a->buf, s->buf[a->buf].name);
		}
	ctx_free(s->ctx, P, 0);
}

/* ---- reuse ordered: distinct buffers on shared bytes, their accesses ordered ---- */
/* ctx_prev[op]: the nearest earlier op (program order) on its context that
 * is not in another case of a row-class switch, however far back: a context
 * runs its commands in program order, so that op runs before this one. */
static ts_id *context_order(vs *v)
{
	const tcp_sched *s = v->s;
	ts_id *prev = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *prev), *order = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *order);
	ts_id *same = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *same), last[256];
	for (int c = 0; c < 256; c++)
		last[c] = TS_NONE;
	for (ts_id i = 0; i < s->nop; i++)
		order[v->op_pos[i]] = i;
	for (uint32_t k = 0; k < s->nop; k++) {
		ts_id o = order[k];
		same[o] = last[s->op[o].ctx]; /* the op before it on its context, exclusive or not */
		last[s->op[o].ctx] = o;
		prev[o] = TS_NONE;
		for (ts_id q = same[o]; q != TS_NONE; q = same[q])
			if (!ts_excl_ops(&v->excl, q, o)) {
				prev[o] = q;
				break;
			}
	}
	ctx_free(s->ctx, same, 0);
	ctx_free(s->ctx, order, 0);
	return prev;
}

static bool ordered(const vs *v, const uint64_t *reach, ts_id a, ts_id b)
{
	uint32_t words = (v->s->nop + 63) / 64;
	return (reach[(size_t)b * words + a / 64] >> (a % 64) & 1) || (reach[(size_t)a * words + b / 64] >> (b % 64) & 1);
}

/* Two placed DM/TRF/VRF buffers whose bytes and slices overlap: every access
 * of one and every access of the other, one of them a write, run on one
 * context or are ordered by a path of distance-0 dependencies and context
 * order (L: sorted by buffer). */
static void check_reuse(vs *v, const acc_list *L, const uint64_t *reach)
{
	const tcp_sched *s = v->s;
	uint32_t *at = ctx_alloc(s->ctx, (s->nbuf + 2) * sizeof *at);
	for (uint32_t i = 0; i < L->n; i++)
		at[L->a[i].buf + 1]++;
	for (ts_id b = 0; b < s->nbuf; b++)
		at[b + 1] += at[b];
	/* one[b]: the region of every access of b, TS_NONE where they differ or b has none */
	ts_id *one = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *one);
	for (ts_id b = 0; b < s->nbuf; b++) {
		one[b] = at[b] < at[b + 1] ? L->a[at[b]].rg : TS_NONE;
		for (uint32_t p = at[b]; p < at[b + 1] && one[b] != TS_NONE; p++)
			if (L->a[p].rg != one[b])
				one[b] = TS_NONE;
	}
	placed *P = ctx_alloc(s->ctx, (s->nbuf + 1) * sizeof *P);
	uint32_t n = 0;
	for (ts_id i = 0; i < s->nbuf; i++) {
		const ts_buf *b = &s->buf[i];
		if (b->offset < 0 || b->space == TCP_HBM || b->space >= TCP_NSPACE || b->layout.slice_bytes < 1)
			continue;
		uint32_t s0 = b->layout.slice0, ns = (uint32_t)b->layout.nslices * b->layout.copies;
		P[n++] = (placed){i, b->space, b->offset, b->offset + b->layout.slice_bytes - 1, s0, s0 + (ns ? ns : 1) - 1, 0, 0};
	}
	qsort(P, n, sizeof *P, cmp_placed);
	for (uint32_t i = 0; i < n && v->errors <= VMAX_ERRORS; i++)
		for (uint32_t j = i + 1; j < n && P[j].space == P[i].space && P[j].lo <= P[i].hi; j++) {
			const placed *x = &P[i], *y = &P[j];
			if (x->s1 < y->s0 || y->s1 < x->s0)
				continue;
			if (one[x->buf] != TS_NONE && one[y->buf] != TS_NONE &&
				ts_excl_regions(&v->excl, one[x->buf], one[y->buf], L->a[at[x->buf]].op, L->a[at[y->buf]].op))
				continue; /* every access pair exclusive */
			bool bad = false;
			for (uint32_t p = at[x->buf]; p < at[x->buf + 1] && !bad; p++)
				for (uint32_t q = at[y->buf]; q < at[y->buf + 1] && !bad; q++) {
					const access *a = &L->a[p], *b = &L->a[q];
					if (a->op == b->op || !(a->write || b->write) || a->ctx == b->ctx ||
						ts_excl_regions(&v->excl, a->rg, b->rg, a->op, b->op) || ordered(v, reach, a->op, b->op))
						continue;
					bad = true;
					if (v->op_pos[a->op] > v->op_pos[b->op]) {
						const access *c = a;
						a = b, b = c;
					}
					verr(v, V_OP, b->op,
						"%s buffer %%%u '%s', which shares %s bytes %" PRId64 "..%" PRId64 " with buffer %%%u '%s' "
						"that op @%u %s, with no dependency path between them (reuse ordered)",
						b->write ? "writes" : "reads", b->buf, s->buf[b->buf].name, ts_space_names[x->space], y->lo,
						x->hi < y->hi ? x->hi : y->hi, a->buf, s->buf[a->buf].name, a->op, a->write ? "writes" : "reads");
				}
		}
	ctx_free(s->ctx, P, 0);
	ctx_free(s->ctx, one, 0);
	ctx_free(s->ctx, at, 0);
}

static moe_status verify(const tcp_sched *s)
{
	vs v = {.s = s};
	uint32_t no = s->nop + 1, ns = s->nsc + 1;
	v.op_seen = ctx_alloc(s->ctx, no);
	v.sc_seen = ctx_alloc(s->ctx, ns);
	v.rg_seen = ctx_alloc(s->ctx, s->nrg + 1);
	v.visible = ctx_alloc(s->ctx, ns);
	v.def_stack = ctx_alloc(s->ctx, ns * sizeof *v.def_stack);
	v.op_pos = ctx_alloc(s->ctx, no * sizeof *v.op_pos);
	v.op_loop = ctx_alloc(s->ctx, no);
	uint32_t *order = ctx_alloc(s->ctx, no * sizeof *order);
	acc_list L = {0};
	check_bufs(&v);
	check_scalars(&v);
	if (!v.errors)
		walk(&v);
	if (!v.errors)
		for (ts_id i = 0; i < s->nop; i++)
			check_op(&v, i, &L);
	/* the closure of distance-0 dependencies, for the hazards' check */
	uint64_t *reach = NULL;
	if (!v.errors && s->nop <= VMAX_HAZARD_OPS && L.n)
		reach = ctx_alloc(s->ctx, (size_t)s->nop * ((s->nop + 63) / 64) * sizeof *reach);
	if (!v.errors)
		ts_excl_init(&v.excl, s);
	if (reach && s->reuse == TS_REUSE_ORDERED)
		v.ctx_prev = context_order(&v);
	if (!v.errors && check_deps(&v, order, reach) && !v.errors)
		check_hazards(&v, order, &L, reach);
	if (!v.errors && reach && v.ctx_prev)
		check_reuse(&v, &L, reach);
	if (!v.errors)
		check_placement(&v);
	void *blocks[] = {v.op_seen, v.sc_seen, v.rg_seen, v.visible, v.def_stack, v.op_pos, v.op_loop, order, L.a, reach,
		v.ctx_prev};
	for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++)
		ctx_free(s->ctx, blocks[k], 0);
	ts_excl_free(&v.excl);
	return v.errors ? MOE_ERR_INVALID : MOE_OK;
}

moe_status tcp_sched_verify(const tcp_sched *s)
{
	CTX_GUARDED(s->ctx, moe_status, MOE_ERR_NOMEM, verify(s));
}
