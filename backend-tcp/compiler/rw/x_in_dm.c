/* backend-tcp/compiler/rw/x_in_dm.c: rewrite `x-in-dm` (rewrites.def,
 * docs/tcp-compiler.md 5.2).
 *
 * An HBM input of one row (x at T = 1) is copied into DM whole by routing
 * (`dma.copy` dims [1, row], before the loop, the only writer of its DM
 * buffer C). After `decode-x-rows` the blocks' rows are a second copy of the
 * same row from HBM into DM rows (stage-rows' copy before the loop, or the
 * body's copy each block): one more command, its 500-cycle setup on the one
 * in-order DMA context. Every row that copy writes holds x's elements
 * [b, b + L), which C holds at the same offsets, so its readers read C
 * instead (row stride 0) and the copy goes.
 *
 * Values are unchanged: the copy (dims [n, L], source strides [0, 1] at base
 * b, destination strides [P, 1] at base d, P >= L) writes D[d + i P + j] =
 * x[b + j]; a reader's view into D that steps by multiples of P but in its
 * last dimension (stride 1) and reads within one row's L elements reads
 * x[b + (base - d) mod P + j] = C[b + (base - d) mod P + j]. Nothing else
 * writes D or C. A reader waits for C's copy where it waited for the dropped
 * one (distance 0); an op that waited for the dropped copy otherwise takes
 * its dependencies. C then lives up to its last reader. */
#include "backend-tcp/compiler/rewrites.h"

typedef struct xdm {
	ts_id cp, d, x, c, c0; /* the dropped copy, its DM buffer, x, x's DM copy C, C's copy */
	int64_t n, len, pitch, dbase, sbase;
} xdm;

/* the only op writing buffer b, or TS_NONE */
static ts_id writer(const tcp_sched *s, ts_id b)
{
	ts_id w = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++)
		if (ts_op_writes(&s->op[o], b)) {
			if (w != TS_NONE)
				return TS_NONE;
			w = o;
		}
	return w;
}

static bool plain(const tcp_view *v)
{
	return v->reg < 0;
}

/* whether op c0 copies the whole one-row HBM input xb into DM buffer cb
 * (element j of x to element j of cb), before the loop */
static bool whole_copy(const tcp_sched *s, ts_id c0, ts_id xb, ts_id cb, int64_t row)
{
	const tcp_insn *in = &s->op[c0].in;
	const tcp_view *sv = &in->v[TCP_V_S0], *dv = &in->v[TCP_V_DST];
	if (in->op != TCP_OP_DMA_COPY || in->vreg >= 0 || ts_op_in_loop(s, c0) || sv->t != (int32_t)xb ||
		dv->t != (int32_t)cb || !plain(sv) || !plain(dv) || sv->base != 0 || dv->base != 0)
		return false;
	int nd = in->ndim;
	if (nd < 1 || in->dim[nd - 1] != row || sv->stride[nd - 1] != 1 || dv->stride[nd - 1] != 1)
		return false;
	for (int k = 0; k + 1 < nd; k++)
		if (in->dim[k] != 1)
			return false;
	const ts_buf *c = &s->buf[cb];
	return c->space == TCP_DM && c->slots == 1 && c->dtype == s->buf[xb].dtype && ts_buf_numel(c) == row &&
	       !ts_buf_spm_read(s, cb);
}

/* whether view v of op o reads D within one of the copy's rows */
static bool row_view(const tcp_insn *in, const tcp_view *v, const xdm *x)
{
	int nd = in->ndim;
	if (nd < 1 || v->stride[nd - 1] != 1 || v->base < x->dbase)
		return false;
	if (v->reg >= 0 && v->scale % x->pitch != 0)
		return false;
	for (int k = 0; k + 1 < nd; k++)
		if (in->dim[k] != 1 && v->stride[k] % x->pitch != 0)
			return false;
	return (v->base - x->dbase) % x->pitch + in->dim[nd - 1] <= x->len;
}

static bool readers_ok(const tcp_sched *s, const xdm *x)
{
	bool any = false;
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == x->cp || !ts_op_reads(&s->op[o], x->d))
			continue;
		const tcp_insn *in = &s->op[o].in;
		if (in->v[TCP_V_DST].t == (int32_t)x->d)
			return false;
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
			if (in->v[w].t == (int32_t)x->d && !row_view(in, &in->v[w], x))
				return false;
		any = true;
	}
	return any;
}

/* whether op cp is a copy of x's row into DM rows that C already holds */
static bool copy_of(const tcp_sched *s, ts_id cp, xdm *x)
{
	const tcp_insn *in = &s->op[cp].in;
	const tcp_view *sv = &in->v[TCP_V_S0], *dv = &in->v[TCP_V_DST];
	if (in->op != TCP_OP_DMA_COPY || in->vreg >= 0 || sv->t < 0 || dv->t < 0 || !plain(sv) || !plain(dv))
		return false;
	int nd = in->ndim;
	if (nd < 1 || nd > 2 || sv->stride[nd - 1] != 1 || dv->stride[nd - 1] != 1)
		return false;
	x->cp = cp;
	x->x = (ts_id)sv->t;
	x->d = (ts_id)dv->t;
	x->len = in->dim[nd - 1];
	x->n = nd == 2 ? in->dim[0] : 1;
	x->pitch = nd == 2 && x->n > 1 ? dv->stride[0] : x->len;
	x->dbase = dv->base;
	x->sbase = sv->base;
	if (nd == 2 && x->n > 1 && sv->stride[0] != 0)
		return false;
	const ts_buf *xb = &s->buf[x->x], *db = &s->buf[x->d];
	int64_t row = ts_buf_numel(xb);
	if (xb->space != TCP_HBM || (xb->kind != TCP_T_INPUT && xb->kind != TCP_T_CONST) || writer(s, x->x) != TS_NONE ||
		db->space != TCP_DM || db->slots != 1 || db->dtype != xb->dtype || writer(s, x->d) != cp ||
		ts_buf_spm_read(s, x->d) || x->pitch < x->len || x->sbase < 0 || x->sbase + x->len > row || x->dbase < 0)
		return false;
	/* C: another DM buffer written only by a whole copy of x */
	for (ts_id c = 0; c < s->nbuf; c++) {
		if (c == x->d || s->buf[c].space != TCP_DM)
			continue;
		ts_id w = writer(s, c);
		if (w != TS_NONE && w != cp && whole_copy(s, w, x->x, c, row)) {
			x->c = c;
			x->c0 = w;
			return readers_ok(s, x);
		}
	}
	return false;
}

static bool find(const tcp_sched *s, xdm *x)
{
	for (ts_id o = 0; o < s->nop; o++)
		if (copy_of(s, o, x))
			return true;
	return false;
}

static void rewrite(tcp_sched *s, const xdm *x, uint16_t feature)
{
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	drop[x->cp] = 1;
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id last = s->buf[x->c].last;
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == x->cp)
			continue;
		ts_op *q = &s->op[o];
		bool reads = ts_op_reads(q, x->d);
		if (reads) {
			tcp_insn *in = &q->in;
			for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
				if (in->v[w].t == (int32_t)x->d)
					ts_view_fixed_row(in, &in->v[w], (int32_t)x->c,
						x->sbase + (in->v[w].base - x->dbase) % x->pitch);
			q->feature = feature;
			if (last == TS_NONE || pos[o] > pos[last])
				last = o;
		}
		if (!ts_op_has_dep(q, x->cp, 0) && !ts_op_has_dep(q, x->cp, 1))
			continue;
		ts_op_drop_deps(q, drop);
		if (reads) {
			ts_add_dep_once(s, o, x->c0, 0);
			continue;
		}
		/* an op ordered after the copy for another reason keeps that order
		 * through what the copy waited for */
		const ts_op *c = &s->op[x->cp];
		for (uint32_t j = 0; j < c->ndep; j++)
			if (c->dep[j] != o)
				ts_add_dep_once(s, o, c->dep[j], c->dist[j]);
	}
	ts_buf *cb = &s->buf[x->c];
	if (cb->life == TS_LIFE_SPAN)
		cb->last = last;
	/* D is read and written by nothing now: a span at C's copy */
	ts_buf *db = &s->buf[x->d];
	if (db->life == TS_LIFE_SPAN)
		db->first = db->last = x->c0;
	ts_drop_ops_to(s, drop, x->c0, pos);
	ctx_free(s->ctx, pos, 0);
	ctx_free(s->ctx, drop, 0);
}

TS_RW_EACH_SITE(x_in_dm, xdm, rewrite)
