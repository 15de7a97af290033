/* backend-tcp/compiler/rw/early_dequant.c: rewrite `early-dequant`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * sched-build emits each dequant of the block loop's body where its graph
 * node stands: gpt-oss MXFP4's down weights are decoded after the gate and
 * up projections and the clamped SwiGLU, so the in-order main context runs
 * that vector pass while the sub context, done with the gate and up TRF
 * loads, waits for it, and the DM planner packs the decoded buffer over the
 * bytes of the SwiGLU's passes, which keeps it there for the list
 * scheduler. A decode pass reads only the expert's fetched slots: the
 * rewrite moves every later decode pass of the body (a tu.vec reading a
 * 4-bit stream, flags e2m1 or i4, or f8e4m3 values) whose distance-0
 * dependencies and scalars all stand before the body's first decode pass
 * to just after it, in their order (in each row-class case on its own); the planner then gives the decoded
 * buffer its own bytes from there on, and the list scheduler places the
 * pass where the main context is free while the sub context loads the
 * first projections' tiles. Values are unchanged: a moved pass depends on
 * what it depended on, nothing it skips over depends on it (the build's
 * dependencies cover every hazard, so nothing it skips touches its
 * buffers in conflict), and its loop-carried dependencies still order it
 * after the previous block's readers of its buffer. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* whether op o is a decode pass (its s0 a quantized stream) */
static bool decodes(const tcp_sched *s, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	if (in->op != TCP_OP_TU_VEC || in->v[TCP_V_S0].t < 0 || in->v[TCP_V_DST].t < 0)
		return false;
	return (in->flags & (TCP_F_E2M1 | TCP_F_I4)) || s->buf[in->v[TCP_V_S0].t].dtype == MOE_F8E4M3;
}

/* the index of item it in region rg, or nitem */
static uint32_t item_at(const tcp_sched *s, ts_id rg, uint32_t it)
{
	const ts_region *r = &s->rg[rg];
	uint32_t k = 0;
	while (k < r->nitem && r->item[k] != it)
		k++;
	return k;
}

/* whether scalar c is defined outside region seq or before its item at */
static bool defined_before(const tcp_sched *s, ts_id seq, ts_id c, uint32_t at)
{
	if (c == TS_NONE || c >= s->nsc)
		return true;
	ts_id rg = s->sc[c].region;
	if (!ts_region_within(s, rg, seq))
		return true;
	return rg == seq && item_at(s, seq, TS_ITEM_SC | c) < at;
}

/* whether decode pass m (an item of region seq after seq's first decode
 * pass f) may stand just after f: pos holds the program positions */
static bool movable(const tcp_sched *s, ts_id seq, ts_id f, ts_id m, const uint32_t *pos)
{
	const ts_op *o = &s->op[m];
	for (uint32_t j = 0; j < o->ndep; j++)
		if (o->dist[j] == 0 && pos[o->dep[j]] > pos[f])
			return false;
	uint32_t at = item_at(s, seq, TS_ITEM_OP | f);
	if (!defined_before(s, seq, o->in.vreg >= 0 ? (ts_id)o->in.vreg : TS_NONE, at))
		return false;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (o->in.v[w].t >= 0 && o->in.v[w].reg >= 0 && !defined_before(s, seq, (ts_id)o->in.v[w].reg, at))
			return false;
	for (ts_id x = 0; x < s->nop; x++) {
		if (pos[x] <= pos[f] || pos[x] >= pos[m])
			continue;
		for (uint32_t j = 0; j < s->op[x].ndep; j++)
			if (s->op[x].dep[j] == m && s->op[x].dist[j] == 0)
				return false;
	}
	return true;
}

/* In SEQ region rg (the body or a row-class case of it): its first decode
 * pass and the passes to move (in program order, at most cap); the count. */
static int find_in(const tcp_sched *s, ts_id rg, const uint32_t *pos, ts_id *first, ts_id *mv, int cap)
{
	const ts_region *r = &s->rg[rg];
	ts_id f = TS_NONE;
	int n = 0;
	uint32_t fk = 0;
	for (uint32_t k = 0; k < r->nitem && n < cap; k++) {
		uint32_t it = r->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP || !decodes(s, TS_ITEM_ID(it)))
			continue;
		ts_id o = TS_ITEM_ID(it);
		if (f == TS_NONE) {
			f = o;
			fk = k;
		} else if (k > fk + 1 + (uint32_t)n && movable(s, rg, f, o, pos)) {
			mv[n++] = o;
		}
	}
	*first = f;
	return n;
}

/* whether region rg is a SEQ region of the block loop's body */
static bool in_body(const tcp_sched *s, ts_id rg)
{
	return s->nloop >= 1 && s->rg[rg].kind == TS_RG_SEQ && ts_region_within(s, rg, s->loop[0].body);
}

enum { MAX_MOVE = 16 };

bool ts_rw_early_dequant_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id f, mv[MAX_MOVE];
	bool any = false;
	for (ts_id rg = 0; rg < s->nrg && !any; rg++)
		any = in_body(s, rg) && find_in(s, rg, pos, &f, mv, MAX_MOVE) > 0;
	ctx_free(s->ctx, pos, 0);
	return any;
}

moe_status ts_rw_early_dequant_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	uint32_t *old = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *old);
	ts_op_positions(s, old);
	bool any = false;
	for (ts_id rg = 0; rg < s->nrg; rg++) {
		ts_id f, mv[MAX_MOVE];
		int n = in_body(s, rg) ? find_in(s, rg, old, &f, mv, MAX_MOVE) : 0;
		ts_region *r = &s->rg[rg];
		for (int i = 0; i < n; i++) {
			uint32_t k = item_at(s, rg, TS_ITEM_OP | mv[i]);
			memmove(r->item + k, r->item + k + 1, (r->nitem - k - 1) * sizeof *r->item);
			r->nitem--;
			uint32_t at = item_at(s, rg, TS_ITEM_OP | (i ? mv[i - 1] : f)) + 1;
			ts_region_insert(s, rg, at, TS_ITEM_OP | mv[i]);
			s->op[mv[i]].feature = feature;
			any = true;
		}
	}
	if (any)
		ts_renew_spans(s, e->ctx, old);
	ctx_free(e->ctx, old, 0);
	return any ? MOE_OK : MOE_ERR_INVALID;
}
