/* backend-tcp/compiler/rw/combine_in_loop.c: rewrite `combine-in-loop`
 * (rewrites.def, docs/tcp-compiler.md 5.2; docs/tcp-isa.md 7.4, "The
 * combine in the loop").
 *
 * In a decode (the block count the constant G) after `grid-combine`, the
 * combine after the loop reads the blocks' DM grid in place:
 *
 *   M: p[g, j] = grid[g, j] x w[g]        (f.mul, committed f32)
 *   R: s[j]    = sum over g of p[g, j]    (r.fsum, in g order, f32)
 *   C: y[j]    = s[j]                     (a stepless pass: the commit
 *                                          rounds to y's dtype; optional)
 *
 * three passes after the last block's down projection, on the critical
 * path. The rewrite runs the sum as the blocks finish, in the same order:
 *
 *   prologue:        s = -0.0                    (l.or of an immediate)
 *   block g < G - 1: s = s + grid[g] x w[g]      (f.mul, f.add; commit f32)
 *   block G - 1:     y = s + grid[g] x w[g]      (the commit rounds to y's)
 *
 * and M, R and C go. The values are the combine's bit for bit: r.fsum's
 * first term is its first element and each later one adds the next in f32
 * (each step rounded as the ALU rounds, flushed, NaN canonical); -0.0 + t is
 * t for every t, so block 0's add gives the first term, and each later add
 * is the reduce's next one (addition commutes exactly); the last block's
 * commit stores the word R's commit stored and C re-committed. Without C
 * (s is the result) every block's pass writes s. The K - 1 accumulations run
 * on the main context while the next expert's weights stream; the last one
 * follows the block's last grid writer in place of the three passes. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

typedef struct cl {
	ts_id m, r, c;           /* the combine's passes (c: TS_NONE when absent) */
	int32_t grid, w, p, sum, y; /* buffers: grid, weights, products, sum, result (y: sum without c) */
	int64_t n, np, wbase, ws; /* row elements, grid row pitch; w's base and stride along g */
} cl;

static bool plain(const tcp_view *v)
{
	return v->t >= 0 && v->reg < 0;
}

static bool dm1(const tcp_sched *s, int32_t t)
{
	return s->buf[t].space == TCP_DM && s->buf[t].slots == 1;
}

/* whether the only dimension of in above 1 (of n elements) steps by 1 in
 * view v from base 0 */
static bool flat_n(const tcp_insn *in, const tcp_view *v, int64_t n)
{
	int64_t e = 1;
	for (int k = 0; k < in->ndim; k++) {
		if (in->dim[k] > 1 && v->stride[k] != 1)
			return false;
		e *= in->dim[k];
	}
	return plain(v) && v->base == 0 && e == n;
}

/* the ops touching buffer t, besides the ones given: at most one, its id in
 * *o (TS_NONE when none); false when more */
static bool other_toucher(const tcp_sched *s, int32_t t, ts_id a, ts_id b, ts_id *o)
{
	*o = TS_NONE;
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == a || q == b)
			continue;
		for (int w = 0; w < TCP_NVIEW; w++)
			if (s->op[q].in.v[w].t == t) {
				if (*o != TS_NONE && *o != q)
					return false;
				*o = q;
			}
	}
	return true;
}

/* M: a product pass over [G, n] of the grid's rows (pitch np) and a weight
 * per row, outside the loop, into a one-slot f32 DM buffer [G, n] */
static bool match_mul(const tcp_sched *s, ts_id o, cl *x)
{
	const ts_loop *l = &s->loop[0];
	const tcp_insn *in = &s->op[o].in;
	if (in->op != TCP_OP_TU_VEC || in->ndim != 2 || in->dim[0] != l->G || in->nstep != 1 || in->vreg >= 0 ||
		(in->flags & ~TCP_F_ROUTE) || in->v[TCP_V_S2].t >= 0 || ts_region_within(s, s->op[o].region, l->region))
		return false;
	const tcp_step *st = &in->step[0];
	bool xs = st->x == TCP_SRC_V || st->x == TCP_SRC_S0, ys = st->y == TCP_SRC_V || st->y == TCP_SRC_S0;
	if (st->op != TCP_V_FMUL || !((xs && st->y == TCP_SRC_S1) || (ys && st->x == TCP_SRC_S1)))
		return false;
	/* the grid's stream steps along the row, the weight's does not */
	bool swap = in->v[TCP_V_S0].stride[1] == 0;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[swap ? TCP_V_S1 : TCP_V_S0], *w = &in->v[swap ? TCP_V_S0 : TCP_V_S1];
	x->n = in->dim[1];
	if (!plain(d) || !plain(a) || !plain(w) || d->base || a->base || d->stride[0] != x->n || d->stride[1] != 1 ||
		a->stride[1] != 1 || w->stride[1] != 0 || !dm1(s, d->t) || !dm1(s, a->t) || !dm1(s, w->t) ||
		s->buf[d->t].dtype != MOE_F32 || ts_buf_numel(&s->buf[d->t]) != l->G * x->n || a->t == w->t)
		return false;
	x->m = o;
	x->p = d->t;
	x->grid = a->t;
	x->np = a->stride[0];
	x->w = w->t;
	x->wbase = w->base;
	x->ws = w->stride[0];
	return x->np >= x->n;
}

/* R: the sum over g of M's products, innermost, into a one-slot f32 DM
 * buffer of n elements; C: a stepless copy of it (or none) */
static bool match_sum(const tcp_sched *s, cl *x)
{
	const ts_loop *l = &s->loop[0];
	if (!other_toucher(s, x->p, x->m, TS_NONE, &x->r) || x->r == TS_NONE)
		return false;
	const tcp_insn *in = &s->op[x->r].in;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
	int nd = in->ndim;
	if (in->op != TCP_OP_TU_VEC || nd < 2 || in->nstep != 1 || in->step[0].op != TCP_V_FRSUM ||
		in->step[0].x != TCP_SRC_S0 || in->vreg >= 0 || (in->flags & ~TCP_F_ROUTE) || in->v[TCP_V_S1].t >= 0 ||
		in->v[TCP_V_S2].t >= 0 || a->t != x->p || !plain(a) || !plain(d) || a->base || d->base ||
		in->dim[nd - 1] != l->G || a->stride[nd - 1] != x->n || in->dim[nd - 2] != x->n || a->stride[nd - 2] != 1 ||
		d->stride[nd - 1] != 0 || (x->n > 1 && d->stride[nd - 2] != 1) || ts_region_within(s, s->op[x->r].region, l->region))
		return false;
	for (int k = 0; k < nd - 2; k++)
		if (in->dim[k] != 1)
			return false;
	x->sum = d->t;
	if (!dm1(s, x->sum) || s->buf[x->sum].dtype != MOE_F32 || ts_buf_numel(&s->buf[x->sum]) != x->n ||
		!other_toucher(s, x->sum, x->r, TS_NONE, &x->c))
		return false;
	x->y = x->sum;
	if (x->c == TS_NONE)
		return true;
	const tcp_insn *ci = &s->op[x->c].in;
	const tcp_view *cd = &ci->v[TCP_V_DST];
	if (ci->op != TCP_OP_TU_VEC || ci->nstep) { /* another reader: the sum is the result */
		bool reads_only = ci->v[TCP_V_DST].t != x->sum;
		x->c = TS_NONE;
		return reads_only;
	}
	if (ci->vreg >= 0 || (ci->flags & ~TCP_F_ROUTE) ||
		ci->v[TCP_V_S0].t != x->sum || ci->v[TCP_V_S1].t >= 0 || ci->v[TCP_V_S2].t >= 0 || cd->t < 0 ||
		cd->t == x->sum || !flat_n(ci, &ci->v[TCP_V_S0], x->n) || !flat_n(ci, cd, x->n) || !dm1(s, cd->t) ||
		ts_buf_numel(&s->buf[cd->t]) != x->n || ts_region_within(s, s->op[x->c].region, l->region))
		return false;
	x->y = cd->t;
	return true;
}

/* the extent [lo, hi] of view v's elements over in's dims, its register at 0 */
static void extent(const tcp_insn *in, const tcp_view *v, int64_t *lo, int64_t *hi)
{
	*lo = *hi = v->base;
	for (int k = 0; k < in->ndim; k++) {
		int64_t e = (in->dim[k] - 1) * v->stride[k];
		*(e < 0 ? lo : hi) += e;
	}
}

/* The grid's writers and readers besides M are body ops reaching row $g
 * only (pitch np, within the row's n first elements for a writer, which
 * writes all its rows); the weights' writers run before the loop; nothing
 * between the loop and M, R, C writes what they read; no scalar loads them. */
static bool grid_ok(const tcp_sched *s, const cl *x, const uint32_t *pos)
{
	const ts_loop *l = &s->loop[0];
	uint32_t lo_loop = UINT32_MAX, hi_loop = 0;
	for (ts_id q = 0; q < s->nop; q++)
		if (ts_region_within(s, s->op[q].region, l->region)) {
			lo_loop = pos[q] < lo_loop ? pos[q] : lo_loop;
			hi_loop = pos[q] > hi_loop ? pos[q] : hi_loop;
		}
	if (!(pos[x->m] > hi_loop && pos[x->r] > pos[x->m] && (x->c == TS_NONE || pos[x->c] > pos[x->r])))
		return false;
	bool written = false;
	for (ts_id q = 0; q < s->nop; q++) {
		const tcp_insn *in = &s->op[q].in;
		bool body = ts_region_within(s, s->op[q].region, l->body);
		for (int w = 0; w < TCP_NVIEW; w++) {
			const tcp_view *v = &in->v[w];
			if (q == x->m || q == x->r || q == x->c)
				continue;
			if (v->t == x->grid) {
				int64_t lo, hi;
				extent(in, v, &lo, &hi);
				if (!body || v->reg != (int32_t)l->g || v->scale != x->np || lo < 0 || hi >= x->np ||
					(w == TCP_V_DST && hi >= x->n))
					return false;
				if (w == TCP_V_DST && in->vreg >= 0) {
					const ts_scalar *c = &s->sc[in->vreg];
					if (c->kind != TS_SC_CONST || c->imm < in->dim[0])
						return false;
				}
				written |= w == TCP_V_DST;
			}
			if (v->t == x->w && w == TCP_V_DST && pos[q] >= lo_loop)
				return false;
			if ((v->t == x->y || v->t == x->sum) && pos[q] < pos[x->m])
				return false;
		}
	}
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD && (s->sc[c].buf == (ts_id)x->grid || s->sc[c].buf == (ts_id)x->w ||
							  s->sc[c].buf == (ts_id)x->p || s->sc[c].buf == (ts_id)x->sum))
			return false;
	return written;
}

static bool find(const tcp_sched *s, cl *x)
{
	if (s->nloop != 1 || !s->m)
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_scalar *nb = &s->sc[l->nb];
	if (nb->kind != TS_SC_CONST || nb->imm != l->G || l->G < 1)
		return false;
	static const uint8_t ops[2] = {TCP_V_FMUL, TCP_V_FADD};
	if (!tcp_vec_chain_ok(s->m, ops, 2))
		return false;
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	bool ok = false;
	for (ts_id o = 0; o < s->nop && !ok; o++) {
		memset(x, 0, sizeof *x);
		ok = match_mul(s, o, x) && match_sum(s, x) && grid_ok(s, x, pos);
	}
	ctx_free(s->ctx, pos, 0);
	return ok;
}

/* The rows that make the combine read the grid in place, bit k of
 * tcp_sched.ran for row k: dm-results and grid-combine. Where their own
 * predictions refused them (the grid alone saves nothing when the store is
 * off the critical path: Mixtral-8x7B at T = 1), this rewrite applies them
 * first, unless switched off, and its prediction weighs the three. */
static int prereq(int k)
{
	static const char *const name[2] = {"dm-results", "grid-combine"};
	return ts_rewrite_find(name[k], strlen(name[k]));
}

/* applies the prerequisite rows that have not run; false when one that has
 * not run is switched off or does not apply */
static bool run_prereqs(tcp_sched *s, const ts_env *e)
{
	for (int k = 0; k < 2; k++) {
		int row = prereq(k);
		if (row < 0)
			return false;
		if (s->ran >> row & 1)
			continue;
		if (e->off >> row & 1 || !ts_rewrites[row].applies(s, e) ||
			ts_rewrites[row].apply(s, e, (uint16_t)(row + 1)) != MOE_OK)
			return false;
		s->ran |= 1ull << row;
	}
	return true;
}

/* the prerequisites run on a copy, which then holds the pattern */
static bool prereqs_found(tcp_sched *c, void *arg)
{
	cl x;
	return run_prereqs(c, arg) && find(c, &x);
}

bool ts_rw_combine_in_loop_applies(const tcp_sched *s, const ts_env *e)
{
	cl x;
	if (find(s, &x))
		return true;
	int gc = prereq(1);
	if (gc < 0 || s->ran >> gc & 1)
		return false;
	/* a copy with the prerequisites applied */
	ts_trial t = ts_trial_for(e, "<combine-in-loop trial>", prereqs_found, (void *)e, false);
	return ts_trial_of(s, &t) == 0;
}

/* the accumulation of block g into dst: s + grid[g] x w[g] */
static ts_id acc_op(tcp_sched *s, ts_id rg, const cl *x, int32_t dst, uint16_t feature)
{
	const ts_loop *l = &s->loop[0];
	tcp_insn in = tcp_b_vec(1, &x->n, tcp_b_flat(dst));
	in.v[TCP_V_S0] = tcp_b_flat(x->sum);
	in.v[TCP_V_S1] = tcp_b_flat(x->grid);
	in.v[TCP_V_S1].reg = (int32_t)l->g;
	in.v[TCP_V_S1].scale = x->np;
	in.v[TCP_V_S2] = tcp_b_view(x->w, x->wbase, 1, (const int64_t[]){0});
	in.v[TCP_V_S2].reg = (int32_t)l->g;
	in.v[TCP_V_S2].scale = x->ws;
	tcp_b_step(&in, TCP_V_FMUL, TCP_SRC_S1, TCP_SRC_S2, 0);
	tcp_b_step(&in, TCP_V_FADD, TCP_SRC_S0, TCP_SRC_V, 0);
	in.flags |= TCP_F_ROUTE;
	ts_id o = ts_add_op(s, rg, &in, TS_PH_COMBINE);
	s->op[o].feature = feature;
	s->op[o].node = s->op[x->r].node;
	return o;
}

moe_status ts_rw_combine_in_loop_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	cl x;
	if (!find(s, &x) && (!run_prereqs(s, e) || !find(s, &x)))
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	ts_id body = l->body, gn = TS_NONE, more = TS_NONE, last = TS_NONE;
	/* s = -0.0 at the end of the prologue */
	tcp_insn ii = tcp_b_vec(1, &x.n, tcp_b_flat(x.sum));
	tcp_b_step(&ii, TCP_V_OR, TCP_SRC_IMM, TCP_SRC_IMM, 0x80000000u);
	ii.flags |= TCP_F_ROUTE;
	ts_id init = ts_add_op(s, l->prologue, &ii, TS_PH_COMBINE);
	s->op[init].feature = feature;
	s->op[init].node = s->op[x.r].node;
	/* the body's passes: every block's into s without C; else the last
	 * block's into y */
	ts_id acc, fin;
	if (x.c == TS_NONE) {
		acc = fin = acc_op(s, body, &x, x.sum, feature);
	} else {
		gn = ts_add_scalar(s, body, "cinext", TS_SC_ALU, TCP_S_ADD, l->g, TS_NONE, 1);
		more = ts_add_scalar(s, body, "cimore", TS_SC_CMP, TCP_C_LT, gn, l->nb, 0);
		last = ts_add_scalar(s, body, "cilast", TS_SC_CMP, TCP_C_GE, gn, l->nb, 0);
		acc = acc_op(s, ts_add_region(s, body, TS_RG_GUARD, more), &x, x.sum, feature);
		fin = acc_op(s, ts_add_region(s, body, TS_RG_GUARD, last), &x, x.y, feature);
	}
	/* each waits for the block's grid writers, the weights' writers (what M
	 * waited for outside the loop), the previous block's accumulation and
	 * the initialisation */
	ts_id both[2] = {acc, fin};
	for (int k = 0; k < (acc == fin ? 1 : 2); k++) {
		ts_id o = both[k];
		ts_add_dep_once(s, o, init, 0);
		if (o != acc)
			ts_add_dep_once(s, o, acc, 0); /* never in one block: the order of the accesses of s */
		ts_add_dep_once(s, o, acc, 1);
		if (fin != acc)
			ts_add_dep_once(s, o, fin, 1);
		for (ts_id q = 0; q < s->nop; q++)
			if (ts_region_within(s, s->op[q].region, body) && s->op[q].in.v[TCP_V_DST].t == x.grid)
				ts_add_dep_once(s, o, q, 0);
		for (uint32_t j = 0; j < s->op[x.m].ndep; j++) {
			ts_id p = s->op[x.m].dep[j];
			if (!ts_region_within(s, s->op[p].region, l->region))
				ts_add_dep_once(s, o, p, 0);
		}
	}
	/* the grid's next writers wait for the block's reads */
	for (ts_id q = 0; q < s->nop; q++)
		if (ts_region_within(s, s->op[q].region, body) && s->op[q].in.v[TCP_V_DST].t == x.grid) {
			ts_add_dep_once(s, q, acc, 1);
			if (fin != acc)
				ts_add_dep_once(s, q, fin, 1);
		}
	/* whatever waited for M, R or C waits for the last accumulation */
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	drop[x.m] = drop[x.r] = 1;
	if (x.c != TS_NONE)
		drop[x.c] = 1;
	ts_id after = TS_NONE;
	for (ts_id q = 0; q < s->nop; q++) {
		if (drop[q])
			continue;
		for (uint32_t j = 0; j < s->op[q].ndep; j++)
			if (drop[s->op[q].dep[j]]) {
				ts_add_dep_once(s, q, fin, 0);
				after = after == TS_NONE ? q : after;
			}
	}
	/* spans: s from the initialisation to the last accumulation, y from the
	 * last accumulation on, the grid and the weights to it; the products,
	 * read by nothing, at the first op that waited for the combine (else the
	 * last accumulation) */
	ts_id pin = after == TS_NONE ? fin : after;
	ts_buf *b;
	if ((b = &s->buf[x.sum])->life == TS_LIFE_SPAN)
		b->first = init, b->last = x.c == TS_NONE && b->last != TS_NONE && !drop[b->last] ? b->last : fin;
	if (x.c != TS_NONE && (b = &s->buf[x.y])->life == TS_LIFE_SPAN)
		b->first = fin;
	if ((b = &s->buf[x.grid])->life == TS_LIFE_SPAN && b->last != TS_NONE && drop[b->last])
		b->last = fin;
	if ((b = &s->buf[x.w])->life == TS_LIFE_SPAN && b->last != TS_NONE && drop[b->last])
		b->last = fin;
	if ((b = &s->buf[x.p])->life == TS_LIFE_SPAN)
		b->first = b->last = pin;
	for (ts_id q = 0; q < s->nbuf; q++) {
		b = &s->buf[q];
		if (b->life == TS_LIFE_SPAN && b->first != TS_NONE && drop[b->first])
			b->first = pin;
		if (b->life == TS_LIFE_SPAN && b->last != TS_NONE && drop[b->last])
			b->last = pin;
	}
	ts_drop_ops(s, drop);
	ctx_free(s->ctx, drop, 0);
	return MOE_OK;
}
