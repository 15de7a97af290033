/* backend-tcp/compiler/rw/copy_views.c: rewrite `copy-views` (rewrites.def,
 * docs/tcp-compiler.md 5.2).
 *
 * sched-build makes a cast that changes no value (bf16 -> f32, a bitcast
 * between 32-bit words) a pass of its own: a tu.vec without steps, whose
 * commit stores the lane word its fetch read. A vector stream reads a bf16
 * element as the f32 word of its bits (the fetch widens it exactly) and a
 * 32-bit element as its word, and the commit into an f32 or i32 buffer
 * stores the word as it is, so every word of the copy is the word its
 * source's element gives a stream. The rewrite drops such a copy where only
 * vector streams read it: each reader's stream reads the source in place
 * (the copy's source and destination stepping alike, element e of the copy
 * being element base + e of the source). Values are unchanged when no op
 * writes the source between the copy and the reader, which the rewrite
 * requires in program order; the dependencies follow: a reader waits for
 * what the copy waited for, and whatever waited for the copy (the source's
 * next writer) waits for each reader as well. A copy under a row count
 * (valid=$rows) writes only the count's rows, so its readers must run under
 * the same count, over the same dimensions, through the copy's own view.
 * The NaN fix of a float result (x != x ? the canonical NaN : x) is such a
 * copy where every writer of its source is a float ALU's commit, whose NaNs
 * are the canonical word already (the routers' softmax before top-k). */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* whether a stream reading a buffer of dtype dt yields the word that a
 * stepless commit into a buffer of dtype into stored */
static bool word_exact(int dt, int into)
{
	return (into == MOE_F32 || into == MOE_I32) && (dt == MOE_F32 || dt == MOE_I32 || dt == MOE_BF16);
}

/* whether every op writing buffer t is a vector pass whose value is its
 * last step's, a float ALU's result (rounded, flushed, every NaN the
 * canonical 0x7fc00000), committed to f32 as it is */
static bool canonical(const tcp_sched *s, int32_t t)
{
	if (s->buf[t].dtype != MOE_F32)
		return false;
	for (ts_id q = 0; q < s->nop; q++) {
		const tcp_insn *in = &s->op[q].in;
		if (in->v[TCP_V_DST].t != t)
			continue;
		if (in->op != TCP_OP_TU_VEC || !in->nstep)
			return false;
		int op = in->step[in->nstep - 1].op, st = tcp_vop_stage[op];
		if (!(st == TCP_ST_FLOAT || op == TCP_V_FDIV || op == TCP_V_ITOF || op == TCP_V_FRSUM ||
			    op == TCP_V_FRMAX || op == TCP_V_FRMIN || op == TCP_V_FMIN || op == TCP_V_FMAX))
			return false;
	}
	return true;
}

/* whether the steps of in copy s0's words: none, or the NaN fix (x != x ?
 * NaN : x, all three streams the same view) of a source whose NaNs are
 * canonical already */
static bool copies_words(const tcp_sched *s, const tcp_insn *in)
{
	const tcp_view *a = &in->v[TCP_V_S0];
	if (!in->nstep)
		return in->v[TCP_V_S1].t < 0 && in->v[TCP_V_S2].t < 0;
	const tcp_step *t = in->step, *m = in->step + 1;
	return in->nstep == 2 && t->op == TCP_V_FTNE && t->x == TCP_SRC_S0 && t->y == TCP_SRC_S1 && m->op == TCP_V_MERGE &&
	       m->x == TCP_SRC_IMM && m->imm == 0x7fc00000u && m->y == TCP_SRC_S2 &&
	       ts_same_view(a, &in->v[TCP_V_S1], in->ndim) && ts_same_view(a, &in->v[TCP_V_S2], in->ndim) &&
	       canonical(s, a->t);
}

/* whether op o copies words into the whole of one-slot DM buffer dst from a
 * DM source stepping as dst does */
static bool word_copy(const tcp_sched *s, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_TU_VEC || (in->flags & ~TCP_F_ROUTE) || d->t < 0 || a->t < 0 || d->t == a->t ||
		d->reg >= 0 || d->base || !copies_words(s, in))
		return false;
	const ts_buf *db = &s->buf[d->t], *ab = &s->buf[a->t];
	if (db->space != TCP_DM || ab->space != TCP_DM || db->slots != 1 || !word_exact(ab->dtype, db->dtype))
		return false;
	int64_t n = 1;
	for (int k = in->ndim - 1; k >= 0; k--) {
		if (in->dim[k] > 1 && (d->stride[k] != n || a->stride[k] != n))
			return false;
		n *= in->dim[k];
	}
	return n == ts_buf_numel(db);
}

/* Whether reader r's streams of copy o's destination may read its source:
 * a tu.vec after o in o's region, whose views of it are streams (no 4-bit
 * s0) that take the source's register, or, when o runs under a row count,
 * its own view under that count over its dims; no op writes the source
 * between them. */
static bool reader_ok(const tcp_sched *s, ts_id o, ts_id r, const uint32_t *pos)
{
	const tcp_insn *ci = &s->op[o].in, *in = &s->op[r].in;
	const tcp_view *d = &ci->v[TCP_V_DST], *a = &ci->v[TCP_V_S0];
	if (in->op != TCP_OP_TU_VEC || s->op[r].region != s->op[o].region || pos[r] < pos[o] ||
		in->v[TCP_V_DST].t == d->t || ((in->flags & (TCP_F_E2M1 | TCP_F_I4)) && in->v[TCP_V_S0].t == d->t))
		return false;
	if (ci->vreg >= 0 && (in->vreg != ci->vreg || in->ndim != ci->ndim ||
				     memcmp(in->dim, ci->dim, (size_t)ci->ndim * sizeof *ci->dim)))
		return false;
	for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
		const tcp_view *v = &in->v[w];
		if (v->t != d->t)
			continue;
		if ((v->reg >= 0 && a->reg >= 0) || (ci->vreg >= 0 && !ts_same_view(v, d, ci->ndim)))
			return false;
	}
	for (ts_id q = 0; q < s->nop; q++)
		if (s->op[q].in.v[TCP_V_DST].t == a->t && pos[q] > pos[o] && pos[q] < pos[r])
			return false;
	return true;
}

/* The first copy the rewrite drops, or TS_NONE: every other op touching its
 * destination is a reader_ok reader, at least one; no scalar loads it. */
static ts_id find(const tcp_sched *s, const uint32_t *pos)
{
	for (ts_id o = 0; o < s->nop; o++) {
		if (!word_copy(s, o))
			continue;
		int32_t dt = s->op[o].in.v[TCP_V_DST].t;
		bool ok = true;
		uint32_t nr = 0;
		for (ts_id r = 0; r < s->nop && ok; r++) {
			const tcp_insn *in = &s->op[r].in;
			bool reads = false;
			for (int w = 0; w < TCP_NVIEW; w++)
				reads |= in->v[w].t == dt;
			if (r == o || !reads)
				continue;
			ok = reader_ok(s, o, r, pos);
			nr++;
		}
		for (ts_id c = 0; c < s->nsc && ok; c++)
			ok = !(s->sc[c].kind == TS_SC_SPM_LD && s->sc[c].buf == (ts_id)dt);
		if (ok && nr)
			return o;
	}
	return TS_NONE;
}

bool ts_rw_copy_views_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id o = find(s, pos);
	ctx_free(s->ctx, pos, 0);
	return o != TS_NONE;
}

/* q waits for what op o waited for */
static void inherit(tcp_sched *s, ts_id q, ts_id o)
{
	for (uint32_t j = 0; j < s->op[o].ndep; j++)
		if (!ts_op_has_dep(&s->op[q], s->op[o].dep[j], s->op[o].dist[j]))
			ts_add_dep(s, q, s->op[o].dep[j], s->op[o].dist[j]);
}

/* Copy o's readers read its source; o goes (the caller drops it). */
static void drop_copy(tcp_sched *s, ts_id o, const uint32_t *pos, uint16_t feature)
{
	const tcp_view a = s->op[o].in.v[TCP_V_S0];
	int32_t dt = s->op[o].in.v[TCP_V_DST].t;
	uint8_t *rd = ctx_alloc(s->ctx, s->nop + 1);
	ts_id first = TS_NONE, last = TS_NONE;
	for (ts_id r = 0; r < s->nop; r++) {
		ts_op *p = &s->op[r];
		for (int w = TCP_V_S0; w < TCP_NVIEW; w++) {
			tcp_view *v = &p->in.v[w];
			if (r == o || v->t != dt)
				continue;
			v->t = a.t;
			v->base += a.base;
			if (a.reg >= 0)
				v->reg = a.reg, v->scale = a.scale;
			rd[r] = 1;
		}
		if (!rd[r])
			continue;
		p->feature = feature;
		p->cost = 0;
		first = first == TS_NONE || pos[r] < pos[first] ? r : first;
		last = last == TS_NONE || pos[r] > pos[last] ? r : last;
		inherit(s, r, o);
	}
	/* what waited for the copy (the source's next writer) waits for every
	 * reader; one that runs before a reader in the copy's block, for what
	 * the copy waited for */
	for (ts_id q = 0; q < s->nop; q++) {
		int dist = -1;
		for (uint32_t j = 0; j < s->op[q].ndep; j++)
			if (s->op[q].dep[j] == o)
				dist = s->op[q].dist[j];
		if (dist < 0 || q == o || rd[q])
			continue;
		if (dist == 0 && pos[q] < pos[last]) {
			inherit(s, q, o);
			continue;
		}
		for (ts_id r = 0; r < s->nop; r++)
			if (rd[r] && !ts_op_has_dep(&s->op[q], r, dist))
				ts_add_dep(s, q, r, dist);
	}
	/* the source lives to the last reader; the destination, touched by
	 * nothing, only at the first; a span pinned to the copy, at the first */
	ts_buf *sb = &s->buf[a.t], *db = &s->buf[dt];
	if (sb->life == TS_LIFE_SPAN && (sb->last == o || (sb->last != TS_NONE && pos[sb->last] < pos[last])))
		sb->last = last;
	if (db->life == TS_LIFE_SPAN)
		db->first = db->last = first;
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *f = &s->buf[b];
		if (f->life == TS_LIFE_SPAN && f->first == o)
			f->first = first;
		if (f->life == TS_LIFE_SPAN && f->last == o)
			f->last = first;
	}
	ctx_free(s->ctx, rd, 0);
}

moe_status ts_rw_copy_views_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	int n = 0;
	for (ts_id o; (o = (ts_op_positions(s, pos), find(s, pos))) != TS_NONE; n++) {
		drop_copy(s, o, pos, feature);
		memset(drop, 0, s->nop + 1);
		drop[o] = 1;
		ts_drop_ops(s, drop);
	}
	ctx_free(s->ctx, drop, 0);
	ctx_free(s->ctx, pos, 0);
	return n ? MOE_OK : MOE_ERR_INVALID;
}
