/* Instruction selection (isel.h, docs/tcp-compiler.md 5.5): a verified
 * schedule becomes a tcp_program. Buffers become the tensor table in buffer
 * order (tensor i is buffer i, so an op's views keep their tensor numbers);
 * scalars get registers by a linear scan over program positions; regions
 * become branches:
 *
 *   guard $p            br.eq p, 0 -> end; items; end:
 *   classes $r [b0..bn] case k runs when b(k-1) < r <= b(k) (the last case
 *                       also when r exceeds every bound): per case but the
 *                       last, li t, b(k); br.lt t, r -> next; items; jmp end
 *   loop (grid G)       li g, 0; prologue; br.ge g, nb -> out;
 *                       top: br.ge g, nb -> step; body; loopvars; step:
 *                       alu.add g, g, 1; li t, G; br.lt g, t -> top; out:
 *                       epilogue
 *
 * A scalar is computed where its definition stands: li (const), ld (staged
 * element), alu, cmp (0 or 1: li d, 1; br.COND a, b -> +2; li d, 0), loopidx
 * (li 0 when it stands outside its loop; the loop sets it), loopvar (its
 * initial value; at the end of each block it takes its next value, which
 * must be defined in that loop's body at its top level). The last register
 * is isel's temporary (immediates of branches), the others hold scalars. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/compiler/isel.h"
#include "backend-tcp/isa/build.h"

#define TMP ((uint8_t)(TCP_NREG - 1))

typedef struct span {
	int64_t lo, hi;
} span;

typedef struct is {
	moe_ctx *ctx;
	tcp_sched *s;
	tcp_program *p;
	int64_t pos;
	int64_t *start, *end;  /* per scalar: positions of its definition and last use */
	span loop[2], body[2];
	uint8_t *reg;          /* per scalar */
	int ph, inloop;        /* the phase control code takes: in a loop expert, else the last op's */
	bool failed;
} is;

static moe_loc rg_loc(const is *c, ts_id r)
{
	const tcp_sched *s = c->s;
	return s->file && s->rg_line && r < s->nrg ? moe_loc_at(c->ctx, s->file, s->rg_line[r], 1) : moe_loc_none();
}

static moe_loc sc_loc(const is *c, ts_id i)
{
	const tcp_sched *s = c->s;
	return s->file && s->sc_line && i < s->nsc ? moe_loc_at(c->ctx, s->file, s->sc_line[i], 1) : moe_loc_none();
}

/* ---- positions and live ranges ---- */
static void use(is *c, ts_id sc)
{
	if (sc < c->s->nsc && c->pos > c->end[sc])
		c->end[sc] = c->pos;
}

static void pos_region(is *c, ts_id r, int depth);

static void pos_items(is *c, ts_id r, int depth)
{
	const tcp_sched *s = c->s;
	const ts_region *g = &s->rg[r];
	for (uint32_t k = 0; k < g->nitem; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		c->pos++;
		if (TS_ITEM_KIND(it) == TS_ITEM_RG) {
			pos_region(c, id, depth + 1);
		} else if (TS_ITEM_KIND(it) == TS_ITEM_OP) {
			const tcp_insn *in = &s->op[id].in;
			for (int w = 0; w < TCP_NVIEW; w++)
				if (in->v[w].t >= 0 && in->v[w].reg >= 0)
					use(c, (ts_id)in->v[w].reg);
			if (in->vreg >= 0)
				use(c, (ts_id)in->vreg);
		} else {
			const ts_scalar *x = &s->sc[id];
			c->start[id] = c->end[id] = c->pos;
			if (x->kind == TS_SC_ALU || x->kind == TS_SC_CMP || x->kind == TS_SC_LOOPVAR || x->kind == TS_SC_SPM_LD)
				use(c, x->a);
			if (x->kind == TS_SC_ALU || x->kind == TS_SC_CMP)
				use(c, x->b);
		}
	}
}

static void pos_region(is *c, ts_id r, int depth)
{
	const tcp_sched *s = c->s;
	const ts_region *g = &s->rg[r];
	c->pos++;
	if (g->kind == TS_RG_GUARD || g->kind == TS_RG_CLASSES)
		use(c, g->pred);
	if (g->kind == TS_RG_LOOP) {
		const ts_loop *l = &s->loop[g->loop];
		int64_t lo = c->pos;
		pos_region(c, l->prologue, depth + 1);
		int64_t blo = ++c->pos;
		pos_region(c, l->body, depth + 1);
		c->body[g->loop] = (span){blo, ++c->pos};
		pos_region(c, l->epilogue, depth + 1);
		c->loop[g->loop] = (span){lo, ++c->pos};
	}
	pos_items(c, r, depth);
	c->pos++;
}

/* Live ranges across loops: a loop's g and nb for all of it, a loopvar and
 * its next value to the end of the body, anything defined before a loop's
 * body (before the loop or in its prologue) and used in the body to the
 * body's end, since the next block reads it again. */
static bool extend(is *c)
{
	tcp_sched *s = c->s;
	for (int k = 0; k < s->nloop; k++) {
		const ts_loop *l = &s->loop[k];
		if (c->start[l->g] > c->loop[k].lo)
			c->start[l->g] = c->loop[k].lo;
		if (c->end[l->g] < c->loop[k].hi)
			c->end[l->g] = c->loop[k].hi;
		if (c->end[l->nb] < c->loop[k].hi)
			c->end[l->nb] = c->loop[k].hi;
	}
	for (ts_id i = 0; i < s->nsc; i++) {
		const ts_scalar *x = &s->sc[i];
		if (x->kind != TS_SC_LOOPVAR)
			continue;
		int k = 0;
		while (k < s->nloop && s->loop[k].body != s->sc[x->b].region)
			k++;
		if (k == s->nloop) {
			moe_diag(c->ctx, MOE_DIAG_ERROR, sc_loc(c, i),
				"loopvar $%s: its next value $%s is not defined at the top level of a loop's body", x->name,
				s->sc[x->b].name);
			return false;
		}
		c->end[i] = c->end[i] > c->loop[k].hi ? c->end[i] : c->loop[k].hi;
		c->end[x->b] = c->end[x->b] > c->body[k].hi ? c->end[x->b] : c->body[k].hi;
	}
	for (int k = 0; k < s->nloop; k++)
		for (ts_id i = 0; i < s->nsc; i++)
			if (c->start[i] < c->body[k].lo && c->end[i] >= c->body[k].lo && c->end[i] < c->body[k].hi)
				c->end[i] = c->body[k].hi;
	return true;
}

static int by_start(const void *x, const void *y)
{
	const int64_t *a = x, *b = y; /* {start, id} */
	return a[0] != b[0] ? (a[0] > b[0]) - (a[0] < b[0]) : (a[1] > b[1]) - (a[1] < b[1]);
}

/* Linear scan: scalars by start, the lowest free register, freed after the
 * last use (a register is not reused at the position that frees it). */
static bool allocate(is *c)
{
	tcp_sched *s = c->s;
	int64_t (*order)[2] = ctx_alloc(c->ctx, (s->nsc + 1) * sizeof *order);
	ts_id holder[TCP_NREG];
	for (int r = 0; r < TCP_NREG; r++)
		holder[r] = TS_NONE;
	for (ts_id i = 0; i < s->nsc; i++)
		order[i][0] = c->start[i], order[i][1] = i;
	qsort(order, s->nsc, sizeof *order, by_start);
	bool ok = true;
	for (ts_id k = 0; k < s->nsc && ok; k++) {
		ts_id i = (ts_id)order[k][1];
		int free_r = -1, live = 0;
		for (int r = 0; r < TMP; r++) {
			if (holder[r] != TS_NONE && c->end[holder[r]] < c->start[i])
				holder[r] = TS_NONE;
			if (holder[r] == TS_NONE && free_r < 0)
				free_r = r;
			live += holder[r] != TS_NONE;
		}
		if (free_r < 0) {
			static const char *const kinds[TS_NRG] = {"sequence", "guard", "classes", "tier", "loop"};
			ts_id r = s->sc[i].region;
			moe_diag(c->ctx, MOE_DIAG_ERROR, sc_loc(c, i),
				"isel: registers exhausted in region #%u (%s): $%s is defined while %d scalars are live (the ISA "
				"has %d registers, one kept for isel's immediates)",
				r, r < s->nrg && s->rg[r].kind < TS_NRG ? kinds[s->rg[r].kind] : "?", s->sc[i].name, live, TCP_NREG);
			ok = false;
			break;
		}
		holder[free_r] = i;
		c->reg[i] = (uint8_t)free_r;
	}
	ctx_free(c->ctx, order, (s->nsc + 1) * sizeof *order);
	return ok;
}

/* ---- the tensor table ---- */
static bool tensor_of(is *c, ts_id i)
{
	const ts_buf *b = &c->s->buf[i];
	const moe_tcp_machine *m = c->s->m;
	int64_t shape[MOE_MAX_RANK];
	memcpy(shape, b->shape, sizeof shape);
	shape[0] *= b->slots ? b->slots : 1; /* the slots follow one another */
	int32_t t = tcp_add_tensor(c->p, b->name, b->space, b->kind, (moe_dtype)b->dtype, b->rank, shape);
	tcp_tensor *tt = &c->p->t[t];
	tcp_set_source(c->p, t, b->source);
	tt->addr = b->offset;
	if (b->kind == TCP_T_CONST) {
		moe_diag(c->ctx, MOE_DIAG_ERROR, moe_loc_none(), "buffer %%%u '%s': constant buffers are not selected yet", i,
			b->name);
		return false;
	}
	if (b->space == TCP_HBM)
		return true;
	const ts_layout *l = &b->layout;
	int64_t S = tcp_slices(m), bytes = tcp_tensor_bytes(tt);
	tt->slice_bytes = l->slice_bytes;
	tt->copies = l->copies;
	bool ok = l->slice0 == 0;
	if (l->split == TS_SPLIT_FLIT)
		ok &= l->nslices == S / l->copies;
	else if (l->split == TS_SPLIT_ROWS)
		tt->part_bytes = (bytes + l->nslices - 1) / l->nslices, ok &= tcp_layout_group(m, tt) == l->nslices;
	else
		ok = false;
	if (!ok)
		moe_diag(c->ctx, MOE_DIAG_ERROR, moe_loc_none(),
			"buffer %%%u '%s': layout %s(%u,%u,%u,%" PRId64 ") has no tensor-table form (flit over all slices of "
			"a copy, or rows from slice 0)",
			i, b->name, ts_split_names[l->split < TS_NSPLIT ? l->split : 0], l->slice0, l->nslices, l->copies,
			l->slice_bytes);
	return ok;
}

/* Whether every ld of nb's buffer reads nb's element: the simulator treats
 * each ld of the program's block-count tensor as the count (--no-skip
 * replaces it by G), so only such a buffer is named as that tensor. */
static bool count_only(const tcp_sched *s, ts_id nb)
{
	const ts_scalar *n = &s->sc[nb];
	for (ts_id i = 0; i < s->nsc; i++) {
		const ts_scalar *x = &s->sc[i];
		if (x->kind == TS_SC_SPM_LD && x->buf == n->buf && (x->a != TS_NONE || x->imm != n->imm))
			return false;
	}
	return n->a == TS_NONE;
}

static void meta(is *c)
{
	const ts_meta *x = &c->s->meta;
	tcp_program *p = c->p;
	ts_meta_dims(x, p);
	if (x->prep) {
		size_t n = strlen(x->prep);
		p->prep = ctx_alloc(c->ctx, n + 1);
		memcpy(p->prep, x->prep, n);
		p->prep_len = n;
	}
	if (c->s->nloop > 0) { /* the block loop's staged count and experts, for the statistics */
		const ts_loop *l = &c->s->loop[0];
		if (c->s->sc[l->nb].kind == TS_SC_SPM_LD && count_only(c->s, l->nb))
			p->nblocks_t = (int32_t)c->s->sc[l->nb].buf;
		if (l->expert != TS_NONE && c->s->sc[l->expert].kind == TS_SC_SPM_LD)
			p->bexp_t = (int32_t)c->s->sc[l->expert].buf;
	}
}

/* ---- emission ---- */
static uint32_t emit(is *c, tcp_insn in, int phase)
{
	in.phase = (uint8_t)phase;
	return tcp_emit(c->p, &in);
}

static void patch(is *c, uint32_t at)
{
	c->p->code[at].target = (int32_t)c->p->ncode;
}

static uint8_t R(const is *c, ts_id sc)
{
	return c->reg[sc];
}

static void emit_op(is *c, ts_id id)
{
	const ts_op *o = &c->s->op[id];
	tcp_insn in = o->in;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in.v[w].t >= 0 && in.v[w].reg >= 0)
			in.v[w].reg = R(c, (ts_id)in.v[w].reg);
	if (in.vreg >= 0)
		in.vreg = R(c, (ts_id)in.vreg);
	emit(c, in, o->phase);
	if (!c->inloop)
		c->ph = o->phase;
}

static void emit_scalar(is *c, ts_id id)
{
	int ph = c->ph;
	const tcp_sched *s = c->s;
	const ts_scalar *x = &s->sc[id];
	uint8_t d = R(c, id);
	switch (x->kind) {
	case TS_SC_CONST: emit(c, tcp_b_li(d, x->imm), ph); break;
	case TS_SC_SPM_LD: {
		tcp_view v = tcp_view_none();
		v.t = (int32_t)x->buf;
		v.base = x->a == TS_NONE ? x->imm : 0;
		if (x->a != TS_NONE)
			v.reg = R(c, x->a), v.scale = 1;
		emit(c, tcp_b_ld(d, v), ph);
		break;
	}
	case TS_SC_ALU: emit(c, tcp_b_alu(x->op, d, R(c, x->a), x->b == TS_NONE ? TCP_NOREG : R(c, x->b), x->imm), ph); break;
	case TS_SC_CMP: {
		uint8_t b = x->b == TS_NONE ? TMP : R(c, x->b);
		if (x->b == TS_NONE)
			emit(c, tcp_b_li(TMP, x->imm), ph);
		emit(c, tcp_b_li(d, 1), ph);
		emit(c, tcp_b_br(x->op, R(c, x->a), b, (int32_t)c->p->ncode + 2), ph);
		emit(c, tcp_b_li(d, 0), ph);
		break;
	}
	case TS_SC_LOOPVAR: emit(c, tcp_b_alu(TCP_S_ADD, d, R(c, x->a), TCP_NOREG, 0), ph); break;
	case TS_SC_LOOPIDX: {
		/* the loop sets its own index; outside it, g reads 0 */
		ts_id r = x->region;
		bool inside = false;
		for (int depth = 0; r != TS_NONE && r < s->nrg && depth < 70; depth++, r = s->rg[r].parent)
			inside |= s->rg[r].kind == TS_RG_LOOP && s->rg[r].loop == (uint32_t)x->imm;
		if (!inside)
			emit(c, tcp_b_li(d, 0), ph);
		break;
	}
	default: break;
	}
}

static void emit_region(is *c, ts_id r, int depth);

static void emit_items(is *c, ts_id r, int depth)
{
	const ts_region *g = &c->s->rg[r];
	for (uint32_t k = 0; k < g->nitem && !c->failed; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			emit_op(c, id);
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			emit_scalar(c, id);
		else
			emit_region(c, id, depth + 1);
	}
}

static void emit_classes(is *c, ts_id r, int depth)
{
	int ph = c->ph;
	const ts_region *g = &c->s->rg[r];
	uint32_t *to_end = ctx_alloc(c->ctx, (g->nitem + 1) * sizeof *to_end), n = 0;
	for (uint32_t k = 0; k < g->nitem; k++) {
		uint32_t next = UINT32_MAX;
		if (k + 1 < g->nitem) { /* rows > bound: the next case */
			emit(c, tcp_b_li(TMP, g->bound[k]), ph);
			next = emit(c, tcp_b_br(TCP_C_LT, TMP, R(c, g->pred), -1), ph);
		}
		emit_region(c, TS_ITEM_ID(g->item[k]), depth + 1);
		if (next != UINT32_MAX) {
			to_end[n++] = emit(c, tcp_b_jmp(-1), ph);
			patch(c, next);
		}
	}
	for (uint32_t k = 0; k < n; k++)
		patch(c, to_end[k]);
	ctx_free(c->ctx, to_end, (g->nitem + 1) * sizeof *to_end);
}

static void emit_loop(is *c, ts_id r, int depth)
{
	tcp_sched *s = c->s;
	uint32_t li = s->rg[r].loop;
	const ts_loop *l = &s->loop[li];
	int ph = TS_PH_EXPERT, saved = c->ph;
	c->ph = ph;
	c->inloop++;
	uint8_t g = R(c, l->g), nb = R(c, l->nb);
	emit(c, tcp_b_li(g, 0), ph);
	emit_region(c, l->prologue, depth + 1);
	uint32_t skip = emit(c, tcp_b_br(TCP_C_GE, g, nb, -1), ph);
	uint32_t top = c->p->ncode;
	uint32_t guard = emit(c, tcp_b_br(TCP_C_GE, g, nb, -1), ph);
	if (li == 0) {
		c->p->block_loop_pc = (int32_t)top;
		c->p->block_body_pc = (int32_t)c->p->ncode;
	}
	emit_region(c, l->body, depth + 1);
	for (ts_id i = 0; i < s->nsc; i++) /* loopvars take their next values */
		if (s->sc[i].kind == TS_SC_LOOPVAR && s->sc[s->sc[i].b].region == l->body)
			emit(c, tcp_b_alu(TCP_S_ADD, R(c, i), R(c, s->sc[i].b), TCP_NOREG, 0), ph);
	patch(c, guard);
	emit(c, tcp_b_alu(TCP_S_ADD, g, g, TCP_NOREG, 1), ph);
	emit(c, tcp_b_li(TMP, l->G), ph);
	emit(c, tcp_b_br(TCP_C_LT, g, TMP, (int32_t)top), ph);
	patch(c, skip);
	emit_region(c, l->epilogue, depth + 1);
	c->inloop--;
	c->ph = saved;
}

static void emit_region(is *c, ts_id r, int depth)
{
	const ts_region *g = &c->s->rg[r];
	int ph = c->ph;
	switch (g->kind) {
	case TS_RG_SEQ: emit_items(c, r, depth); break;
	case TS_RG_GUARD: {
		emit(c, tcp_b_li(TMP, 0), ph);
		uint32_t skip = emit(c, tcp_b_br(TCP_C_EQ, R(c, g->pred), TMP, -1), ph);
		emit_items(c, r, depth);
		patch(c, skip);
		break;
	}
	case TS_RG_CLASSES: emit_classes(c, r, depth); break;
	case TS_RG_LOOP: emit_loop(c, r, depth); break;
	default:
		moe_diag(c->ctx, MOE_DIAG_ERROR, rg_loc(c, r), "isel: region #%u: a tier region is not selected yet", r);
		c->failed = true;
		break;
	}
}

/* ---- the whole ---- */
static tcp_program *isel(moe_ctx *ctx, tcp_sched *s)
{
	if (!s->m) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "isel needs a machine");
		return NULL;
	}
	if (tcp_sched_verify(s) != MOE_OK || tcp_dm_place(s) != MOE_OK || tcp_sched_verify(s) != MOE_OK)
		return NULL;
	is c = {ctx, s, tcp_prog_new(ctx), 0, NULL, NULL, {{0, 0}, {0, 0}}, {{0, 0}, {0, 0}}, NULL, TS_PH_ROUTING, 0, false};
	const ts_region *top = &s->rg[s->top];
	for (uint32_t k = 0; k < top->nitem; k++) /* control before the first op: that op's phase */
		if (TS_ITEM_KIND(top->item[k]) == TS_ITEM_OP) {
			c.ph = s->op[TS_ITEM_ID(top->item[k])].phase;
			break;
		}
	size_t ns = s->nsc + 1;
	c.start = ctx_alloc(ctx, ns * sizeof *c.start);
	c.end = ctx_alloc(ctx, ns * sizeof *c.end);
	c.reg = ctx_alloc(ctx, ns);
	pos_region(&c, s->top, 0);
	bool ok = extend(&c) && allocate(&c);
	for (ts_id i = 0; i < s->nbuf && ok; i++)
		ok = tensor_of(&c, i);
	if (ok) {
		meta(&c);
		emit_region(&c, s->top, 0);
		ok = !c.failed;
	}
	if (ok)
		emit(&c, tcp_b_halt(), c.p->ncode ? c.p->code[c.p->ncode - 1].phase : TS_PH_ROUTING);
	ctx_free(ctx, c.start, ns * sizeof *c.start);
	ctx_free(ctx, c.end, ns * sizeof *c.end);
	ctx_free(ctx, c.reg, ns);
	const char *file = s->file ? s->file : "<schedule>";
	if (ok && (tcp_validate(ctx, c.p, s->m, file) != MOE_OK || tcp_check_termination(ctx, c.p, file) != MOE_OK))
		ok = false;
	if (!ok) {
		tcp_prog_free(c.p);
		return NULL;
	}
	return c.p;
}

tcp_program *tcp_sched_isel(moe_ctx *ctx, tcp_sched *s)
{
	CTX_GUARDED(ctx, tcp_program *, NULL, isel(ctx, s));
}

static moe_tcp_program *from_sched(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const moe_tcp_machine *m)
{
	moe_tcp_machine *def = m ? NULL : moe_tcp_machine_default(ctx);
	tcp_sched *s = m || def ? tcp_sched_parse(ctx, m ? m : def, file, text, len) : NULL;
	tcp_program *p = s ? tcp_sched_isel(ctx, s) : NULL;
	tcp_sched_free(s);
	moe_tcp_machine_free(ctx, def);
	return p;
}

moe_tcp_program *moe_tcp_from_sched(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const moe_tcp_machine *m)
{
	CTX_GUARDED(ctx, moe_tcp_program *, NULL, from_sched(ctx, file, text, len, m));
}
