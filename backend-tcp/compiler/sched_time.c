/* backend-tcp/compiler/sched_time.c: the schedule's timeline (sched_time.h).
 *
 * Each command is priced by sched_price.c (isa/cost.h's rules on loads
 * measured from the schedule's buffers). The start rule is the simulator's:
 * the control processor's clock advances by each instruction's scalar cost
 * (the control code isel emits for scalars, guards, row-class switches and
 * the loop is counted instruction for instruction), an `ld` of a staged
 * buffer waits for its staging, a command starts at the latest of its issue,
 * its context's end and its dependencies' ends, and a sub load routed over
 * the switch holds the main context when the machine does not run both at
 * once. Dependencies stand for the simulator's hazard records (the verifier
 * makes them cover every conflict); DMA setups never overlap (revision 3). */
#include <string.h>

#include "backend-tcp/compiler/sched_time_int.h"

/* ---- the walk ---- */
static void scalar_insn(tl *t, int op)
{
	t->tc += tcp_cost_scalar(&t->cm, op);
}

/* The slot of a two-slot buffer view w of `in` stays in, as a static
 * test: 0 or 1 for a fixed view inside that slot, 2 for a view moved by a
 * scalar in steps of one slot from inside slot 0, -1 otherwise. Its extent
 * is taken over the command's dims, which every view of a copy, a TRF/VRF
 * load or a vector pass walks and which bound a contraction's views. */
static int slot_view(const tcp_sched *s, const tcp_insn *in, int w)
{
	const tcp_view *v = &in->v[w];
	bool walks = in->op == TCP_OP_DMA_COPY || in->op == TCP_OP_SUB_TRF || in->op == TCP_OP_SUB_VRF ||
		     in->op == TCP_OP_TU_CONTRACT || (in->op == TCP_OP_TU_VEC && !(in->flags & (TCP_F_E2M1 | TCP_F_I4))) ||
		     (in->op == TCP_OP_DMA_GATHER && w == TCP_V_DST && ts_group_half(s, v->reg));
	if (v->t < 0 || (uint32_t)v->t >= s->nbuf || s->buf[v->t].slots != 2 || !walks)
		return -1;
	int64_t S = ts_buf_numel(&s->buf[v->t]), lo = v->base, hi = v->base;
	for (int k = 0; k < in->ndim && k < TCP_MAXD; k++) {
		int64_t x = v->stride[k] * (in->dim[k] - 1);
		*(x < 0 ? &lo : &hi) += x;
	}
	if (S <= 0 || lo < 0)
		return -1;
	if (v->reg >= 0)
		return (v->scale == S && hi < S) || (v->scale > 0 && S % v->scale == 0 && hi < v->scale && ts_group_slot(s, v->reg, 2 * S / v->scale))
			       ? 2
			       : -1;
	return lo / S == hi / S && hi < 2 * S ? (int)(lo / S) : -1;
}

/* sbuf, sview of op i (sched_time_int.h) */
static void slot_op(tl *t, ts_id i)
{
	const tcp_insn *in = &t->s->op[i].in;
	t->sbuf[i] = TS_NONE;
	for (int w = 0; w < TCP_NVIEW; w++) {
		if (slot_view(t->s, in, w) < 0)
			continue;
		if (t->sbuf[i] != TS_NONE) {
			t->sbuf[i] = TS_NONE;
			return;
		}
		t->sbuf[i] = (ts_id)in->v[w].t, t->sview[i] = (uint8_t)w;
	}
	for (int w = 0; w < TCP_NVIEW && t->sbuf[i] != TS_NONE; w++)
		if (w != t->sview[i] && (ts_id)in->v[w].t == t->sbuf[i])
			t->sbuf[i] = TS_NONE; /* a second view on that buffer */
}

/* The units [*lo, *hi] of its buffer that op i's slot view touches in this
 * run; false when they leave the buffer's two slots. */
static bool run_units(const tl *t, ts_id i, int *lo, int *hi)
{
	const tcp_insn *in = &t->s->op[i].in;
	const tcp_view *v = &in->v[t->sview[i]];
	int64_t S = ts_buf_numel(&t->s->buf[t->sbuf[i]]), U = t->uel[t->sbuf[i]];
	int64_t a = v->base + (v->reg >= 0 && !t->zero ? t->val[v->reg] * v->scale : 0), z = a;
	for (int k = 0; k < in->ndim && k < TCP_MAXD; k++) {
		int64_t x = v->stride[k] * (in->dim[k] - 1);
		*(x < 0 ? &a : &z) += x;
	}
	if (a < 0 || z >= 2 * S)
		return false;
	*lo = (int)(a / U), *hi = (int)(z / U);
	return true;
}

/* The latest end of op d's runs (as of now, or of the block before) in
 * units [lo, hi] of its slot buffer. */
static int64_t units_end(const tl *t, ts_id d, int lo, int hi, bool before)
{
	const int64_t *u = (before ? t->sprev : t->send) + t->uofs[d];
	int64_t e = -1;
	for (int j = lo; j <= hi && j < t->nunit[d]; j++)
		e = u[j] > e ? u[j] : e;
	return e;
}

/* Whether op a's dependency on d stands for conflicts in one two-slot
 * buffer alone, both inside one slot each run: then a waits for d's latest
 * run in a's slot, as the simulator's hazards on element ranges do, not
 * for d's latest run in the other slot (a weight fetch into the next slot
 * after a block whose expert repeats, rewrite same-expert). Distinct
 * buffers of one on-chip space may share bytes that an ordered schedule's
 * dependencies order: such a pair keeps the dependency whole. */
static bool slot_only(const tl *t, ts_id a, ts_id d)
{
	const tcp_sched *s = t->s;
	ts_id b = t->sbuf[a];
	if (b == TS_NONE || d >= s->nop || t->sbuf[d] != b)
		return false;
	const tcp_insn *x = &s->op[a].in, *y = &s->op[d].in;
	bool found = false;
	for (int i = 0; i < TCP_NVIEW; i++)
		for (int j = 0; j < TCP_NVIEW; j++) {
			int32_t p = x->v[i].t, q = y->v[j].t;
			if (p < 0 || q < 0 || (i != TCP_V_DST && j != TCP_V_DST))
				continue;
			if (p == q && (ts_id)p == b)
				found = true;
			else if (p == q || (s->reuse == TS_REUSE_ORDERED && s->buf[p].space == s->buf[q].space &&
						   s->buf[p].space != TCP_HBM))
				return false;
		}
	return found;
}

#define DEPS_NONE UINT32_MAX      /* dfirst: the op has not run */
#define DEPS_ONCE (UINT32_MAX - 1) /* it has run once, its dependencies read as they are */

/* Each two-slot buffer's unit: a slot, or where group-fetch reads one
 * entry of a slot per block (a view moved by the group's slot scalar in
 * steps of one entry), the entry, so a reader waits for the run that wrote
 * its own entry; each slot op's ends per unit (uofs, nunit, send, sprev). */
static void units(tl *t)
{
	const tcp_sched *s = t->s;
	for (ts_id b = 0; b < s->nbuf; b++)
		t->uel[b] = s->buf[b].slots == 2 ? ts_buf_numel(&s->buf[b]) : 1;
	for (ts_id i = 0; i < s->nop; i++)
		for (int w = 0; w < TCP_NVIEW; w++) {
			const tcp_view *v = &s->op[i].in.v[w];
			if (v->t < 0 || (uint32_t)v->t >= s->nbuf || s->buf[v->t].slots != 2 || v->reg < 0 || v->scale <= 0)
				continue;
			int64_t S = ts_buf_numel(&s->buf[v->t]);
			if (S % v->scale == 0 && 2 * S / v->scale <= TS_MAX_UNITS && v->scale < t->uel[v->t] &&
				ts_group_slot(s, v->reg, 2 * S / v->scale))
				t->uel[v->t] = v->scale;
		}
	/* an entry's unit cut where a slot op's view starts or ends inside it
	 * (one projection's weights of a packed expert, a gather of part of
	 * each entry), while the units stay within TS_MAX_UNITS; a view that
	 * still cuts a unit touches all of it (run_units), a later wait */
	for (ts_id i = 0; i < s->nop; i++) {
		ts_id b = t->sbuf[i];
		if (b == TS_NONE)
			continue;
		int64_t S = ts_buf_numel(&s->buf[b]), U = t->uel[b], lo, hi;
		if (U >= S)
			continue;
		ts_view_span(&s->op[i].in, &s->op[i].in.v[t->sview[i]], &lo, &hi);
		int64_t g = tcp_gcd(tcp_gcd(U, lo % U), hi % U);
		if (g < U && S % g == 0 && 2 * S / g <= TS_MAX_UNITS)
			t->uel[b] = g;
	}
	uint32_t n = 0;
	for (ts_id i = 0; i < s->nop; i++) {
		t->uofs[i] = n;
		t->nunit[i] = t->sbuf[i] == TS_NONE ? 0 : (uint8_t)(2 * ts_buf_numel(&s->buf[t->sbuf[i]]) / t->uel[t->sbuf[i]]);
		n += t->nunit[i];
	}
	t->send = ctx_alloc(t->ctx, ((size_t)n + 1) * sizeof *t->send);
	t->sprev = ctx_alloc(t->ctx, ((size_t)n + 1) * sizeof *t->sprev);
	for (uint32_t j = 0; j < n; j++)
		t->send[j] = t->sprev[j] = -1;
}

/* Where each op stands in the regions' current orders. */
static void positions(tl *t)
{
	const tcp_sched *s = t->s;
	for (ts_id i = 0; i <= s->nop; i++)
		t->oreg[i] = TS_NONE, t->oidx[i] = 0, t->dfirst[i] = DEPS_NONE;
	for (ts_id i = 0; i < s->nop; i++) {
		t->octx[i] = (uint8_t)tcp_op_ctx[s->op[i].in.op];
		slot_op(t, i);
	}
	units(t);
	uint8_t *seen = ctx_alloc(t->ctx, s->nop + 1);
	memset(seen, 0, s->nop + 1);
	for (ts_id r = 0; r < s->nrg; r++)
		for (uint32_t k = 0; k < s->rg[r].nitem; k++) {
			uint32_t it = s->rg[r].item[k], id = TS_ITEM_ID(it);
			if (TS_ITEM_KIND(it) != TS_ITEM_OP || id >= s->nop)
				continue;
			t->oreg[id] = seen[id]++ ? TS_NONE : r; /* held twice: not known */
			t->oidx[id] = k;
		}
	ctx_free(t->ctx, seen, s->nop + 1);
	ts_id *par = ctx_alloc(t->ctx, (s->nrg + 1) * sizeof *par);
	for (ts_id r = 0; r <= s->nrg; r++)
		par[r] = TS_NONE, t->rloop[r] = 0;
	for (ts_id r = 0; r < s->nrg; r++) {
		const ts_region *g = &s->rg[r];
		for (uint32_t k = 0; k < g->nitem; k++)
			if (TS_ITEM_KIND(g->item[k]) == TS_ITEM_RG && TS_ITEM_ID(g->item[k]) < s->nrg)
				par[TS_ITEM_ID(g->item[k])] = r;
		if (g->kind == TS_RG_LOOP && s->nloop > 0 && g->loop < (uint32_t)s->nloop) {
			const ts_loop *l = &s->loop[g->loop];
			ts_id in[3] = {l->prologue, l->body, l->epilogue};
			for (int k = 0; k < 3; k++)
				if (in[k] < s->nrg)
					par[in[k]] = r;
		}
	}
	for (ts_id r = 0; r < s->nrg; r++)
		if (s->rg[r].kind == TS_RG_LOOP)
			for (ts_id x = r, depth = 0; x != TS_NONE && depth <= s->nrg; x = par[x], depth++)
				t->rloop[x] = 1;
	ctx_free(t->ctx, par, (s->nrg + 1) * sizeof *par);
}

/* Op a's dependencies as its start reads them, the latest of their ends,
 * with those that cannot be the latest left out. A context's end never
 * decreases (each command starts after it) and a dependency's end read is
 * of a run already issued, so one on a's own context is covered by a's
 * start waiting for that context. Two on one other context that are items
 * of one region, run in the same passes of it in item order, keep their
 * order: of distance-0 ones that are earlier items of a's region (run in
 * its current pass) only the last counts, and likewise of distance-1 ones
 * in a region holding no loop (each of its passes lies in one block, so
 * the last run before this block is of one pass for both). */
#define DEP_GROUPS 32
/* A dependency's end as read is at most its context's end (cfree: the
 * ends on one context never decrease), and one read at distance 1, of a
 * run before the current block, at most that context's end when the block
 * began (cprev). The list from `from` is reordered by (context, distance)
 * behind a header each (dd DEP_HDR | context << 1 | distance, dl: the
 * entries it heads), so that run_op skips the entries of a context whose
 * bound does not pass the start found so far: the latest end is unchanged. */
#define DEP_HDR 0x80u
#define DEP_SLOT 0x40u /* slot_only: the end read is of a's slot */

/* room for n more entries of the dependency lists */
static void dl_reserve(tl *t, size_t n)
{
	if (t->dlen + n > t->dcap) {
		size_t nc = (t->dlen + n) * 2;
		t->dl = ctx_realloc(t->ctx, t->dl, t->dcap * sizeof *t->dl, nc * sizeof *t->dl);
		t->dd = ctx_realloc(t->ctx, t->dd, t->dcap, nc);
		t->dcap = nc;
	}
}

static void group_deps(tl *t, size_t from)
{
	size_t n = t->dlen - from, cnt[2 * TCP_NCTX] = {0}, at[2 * TCP_NCTX], pos = from;
	dl_reserve(t, n + 2 * TCP_NCTX);
	ts_id *dl = t->dl + t->dlen + 2 * TCP_NCTX; /* a copy, past the grouped list's end */
	uint8_t *dd = t->dd + t->dlen + 2 * TCP_NCTX;
	memcpy(dl, t->dl + from, n * sizeof *dl);
	memcpy(dd, t->dd + from, n);
	for (size_t k = 0; k < n; k++)
		cnt[(dl[k] < t->s->nop ? t->octx[dl[k]] : 0) * 2 + (dd[k] & 1u)]++;
	for (int g = 0; g < 2 * TCP_NCTX; g++)
		if (cnt[g]) {
			t->dl[pos] = (ts_id)cnt[g], t->dd[pos] = (uint8_t)(DEP_HDR | (unsigned)g);
			at[g] = pos + 1;
			pos += cnt[g] + 1;
		}
	for (size_t k = 0; k < n; k++) {
		size_t g = (size_t)(dl[k] < t->s->nop ? t->octx[dl[k]] : 0) * 2 + (dd[k] & 1u);
		t->dl[at[g]] = dl[k], t->dd[at[g]++] = dd[k];
	}
	t->dlen = pos;
}

static void dep_list(tl *t, ts_id a)
{
	const tcp_sched *s = t->s;
	const ts_op *o = &s->op[a];
	int ca = tcp_op_ctx[o->in.op];
	struct {
		ts_id r, d;
		uint8_t ctx, dist;
	} grp[DEP_GROUPS];
	int ng = 0;
	if (++t->stamp == 0) {
		memset(t->gstamp, 0, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gstamp);
		t->stamp = 1;
	}
	dl_reserve(t, o->ndep);
	t->dfirst[a] = (uint32_t)t->dlen;
	for (uint32_t k = 0; k < o->ndep; k++) {
		ts_id d = o->dep[k], r = d < s->nop ? t->oreg[d] : TS_NONE;
		uint8_t dist = o->dist[k] != 0;
		int cd = d < s->nop ? t->octx[d] : -1;
		if (cd == ca)
			continue;
		if (slot_only(t, a, d)) {
			t->dl[t->dlen] = d;
			t->dd[t->dlen++] = (uint8_t)(DEP_SLOT | dist);
			continue;
		}
		bool ordered = r != TS_NONE &&
			       (dist ? !t->rloop[r] : r == t->oreg[a] && t->oidx[d] < t->oidx[a]);
		size_t key = ordered ? ((size_t)r * TCP_NCTX + (size_t)cd) * 2 + dist : 0;
		int j = ordered && t->gstamp[key] == t->stamp ? (int)t->gidx[key] : ng;
		if (ordered && j < ng) {
			if (t->oidx[d] > t->oidx[grp[j].d])
				grp[j].d = d;
			continue;
		}
		if (ordered && ng < DEP_GROUPS) {
			t->gstamp[key] = t->stamp, t->gidx[key] = (uint32_t)ng;
			grp[ng].r = r, grp[ng].d = d, grp[ng].ctx = (uint8_t)cd, grp[ng++].dist = dist;
			continue;
		}
		t->dl[t->dlen] = d;
		t->dd[t->dlen++] = dist;
	}
	for (int j = 0; j < ng; j++)
		t->dl[t->dlen] = grp[j].d, t->dd[t->dlen++] = grp[j].dist;
	group_deps(t, t->dfirst[a]);
	t->dn[a] = (uint32_t)(t->dlen - t->dfirst[a]);
}

static void run_op(tl *t, ts_id id)
{
	const ts_op *o = &t->s->op[id];
	int ctx = tcp_op_ctx[o->in.op];
	bool holds;
	int64_t dur = ts_op_cost(t, id, &holds) + tcp_cost_issue(&t->cm, ctx);
	scalar_insn(t, o->in.op);
	int64_t start = t->tc > t->cfree[ctx] ? t->tc : t->cfree[ctx];
	if (holds && t->cfree[TCP_CTX_MAIN] > start)
		start = t->cfree[TCP_CTX_MAIN];
	/* an op run once reads its dependencies as they are (listing them costs
	 * as much); from its second run, its list */
	if (t->dfirst[id] == DEPS_ONCE)
		dep_list(t, id);
	bool once = t->dfirst[id] == DEPS_NONE;
	int alo = 0, ahi = 0; /* the units this run touches */
	bool aslot = t->sbuf[id] != TS_NONE && run_units(t, id, &alo, &ahi);
	const ts_id *dl = once ? o->dep : t->dl + t->dfirst[id];
	const uint8_t *dd = once ? o->dist : t->dd + t->dfirst[id];
	t->dfirst[id] = once ? DEPS_ONCE : t->dfirst[id];
	for (uint32_t k = 0, n = once ? o->ndep : t->dn[id]; k < n; k++) {
		if (!once && (dd[k] & DEP_HDR)) {
			unsigned g = dd[k] & ~DEP_HDR;
			if ((g & 1u ? t->cprev : t->cfree)[g >> 1] <= start)
				k += dl[k];
			continue;
		}
		ts_id d = dl[k];
		bool dist = dd[k] & 1u;
		bool sl = aslot && d < t->s->nop && (once ? slot_only(t, id, d) : (dd[k] & DEP_SLOT) != 0);
		/* distance 1: the previous block's run, even where d already ran in this one */
		bool before = dist && d < t->s->nop && t->blk[d] == t->block;
		int64_t e = d >= t->s->nop ? -1
			    : sl	  ? units_end(t, d, alo, ahi, before)
			    : before	  ? t->prev[d]
					  : t->end[d];
		start = e > start ? e : start;
	}
	int64_t end = start + dur;
	t->cfree[ctx] = end;
	if (holds)
		t->cfree[TCP_CTX_MAIN] = end;
	if (t->start[id] < 0)
		t->cost[id] = dur;
	if (t->blk[id] != t->block) {
		t->prev[id] = t->end[id], t->blk[id] = t->block;
		memcpy(t->sprev + t->uofs[id], t->send + t->uofs[id], t->nunit[id] * sizeof *t->send);
	}
	for (int j = alo; aslot && j <= ahi && j < t->nunit[id]; j++)
		t->send[t->uofs[id] + j] = end;
	t->start[id] = start;
	t->end[id] = end;
	if (o->in.op == TCP_OP_DMA_SPM) {
		ts_stage(t, &o->in);
		for (int w = TCP_V_S0; w <= TCP_V_S2; w++)
			if (o->in.v[w].t >= 0)
				t->staged[o->in.v[w].t] = end;
	}
}

static bool inside_loop(const tcp_sched *s, ts_id r, uint32_t loop)
{
	for (int depth = 0; r != TS_NONE && r < s->nrg && depth < 70; depth++, r = s->rg[r].parent)
		if (s->rg[r].kind == TS_RG_LOOP && s->rg[r].loop == loop)
			return true;
	return false;
}

static void run_scalar(tl *t, ts_id id)
{
	const ts_scalar *x = &t->s->sc[id];
	int64_t *v = t->val, a = x->a != TS_NONE ? v[x->a] : 0, b = x->b != TS_NONE ? v[x->b] : x->imm;
	switch (x->kind) {
	case TS_SC_CONST: scalar_insn(t, TCP_OP_LI), v[id] = x->imm; break;
	case TS_SC_SPM_LD: {
		int64_t el = x->a != TS_NONE ? a : x->imm;
		int32_t w = 0;
		if (x->buf < t->s->nbuf && t->staged[x->buf] > t->tc)
			t->tc = t->staged[x->buf];
		scalar_insn(t, TCP_OP_LD);
		if (!tcp_staged_find(t->d, t->nd, (int32_t)x->buf, el, &w))
			t->approx_ld++;
		v[id] = w;
		break;
	}
	case TS_SC_ALU:
		scalar_insn(t, TCP_OP_ALU);
		v[id] = x->op == TCP_S_ADD ? (int64_t)((uint64_t)a + (uint64_t)b)
			: x->op == TCP_S_SUB ? (int64_t)((uint64_t)a - (uint64_t)b)
			: x->op == TCP_S_MUL ? (int64_t)((uint64_t)a * (uint64_t)b)
			: x->op == TCP_S_AND ? (a & b)
			: x->op == TCP_S_MIN ? (a < b ? a : b)
					     : (a > b ? a : b);
		break;
	case TS_SC_CMP: {
		bool c = x->op == TCP_C_LT ? a < b : x->op == TCP_C_GE ? a >= b : x->op == TCP_C_EQ ? a == b : a != b;
		if (x->b == TS_NONE)
			scalar_insn(t, TCP_OP_LI);
		scalar_insn(t, TCP_OP_LI);
		scalar_insn(t, TCP_OP_BR);
		if (!c)
			scalar_insn(t, TCP_OP_LI);
		v[id] = c;
		break;
	}
	case TS_SC_LOOPVAR: scalar_insn(t, TCP_OP_ALU), v[id] = a; break;
	case TS_SC_LOOPIDX:
		if (!inside_loop(t->s, x->region, (uint32_t)x->imm))
			scalar_insn(t, TCP_OP_LI), v[id] = 0;
		break;
	default: break;
	}
}

static void run_region(tl *t, ts_id r, int depth);

static void run_items(tl *t, ts_id r, int depth)
{
	const ts_region *g = &t->s->rg[r];
	for (uint32_t k = 0; k < g->nitem && !t->fail; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			run_op(t, id);
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC)
			run_scalar(t, id);
		else
			run_region(t, id, depth + 1);
	}
}

static void run_loop(tl *t, ts_id r, int depth)
{
	const tcp_sched *s = t->s;
	const ts_loop *l = &s->loop[s->rg[r].loop];
	/* the body's loop-carried values, in scalar order */
	uint32_t nv = 0;
	for (ts_id i = 0; i < s->nsc; i++)
		nv += s->sc[i].kind == TS_SC_LOOPVAR && s->sc[s->sc[i].b].region == l->body;
	ts_id *lv = ctx_alloc(t->ctx, (nv + 1) * sizeof *lv);
	nv = 0;
	for (ts_id i = 0; i < s->nsc; i++)
		if (s->sc[i].kind == TS_SC_LOOPVAR && s->sc[s->sc[i].b].region == l->body)
			lv[nv++] = i;
	scalar_insn(t, TCP_OP_LI);
	t->val[l->g] = 0;
	run_region(t, l->prologue, depth + 1);
	scalar_insn(t, TCP_OP_BR);
	if (t->val[l->nb] > 0)
		for (int64_t g = 0; g < l->G && !t->fail; g++) {
			t->val[l->g] = g;
			scalar_insn(t, TCP_OP_BR);
			if (g < t->val[l->nb]) {
				t->block++;
				memcpy(t->cprev, t->cfree, sizeof t->cprev);
				run_region(t, l->body, depth + 1);
				for (uint32_t k = 0; k < nv; k++)
					scalar_insn(t, TCP_OP_ALU), t->val[lv[k]] = t->val[s->sc[lv[k]].b];
			}
			scalar_insn(t, TCP_OP_ALU);
			scalar_insn(t, TCP_OP_LI);
			scalar_insn(t, TCP_OP_BR);
		}
	ctx_free(t->ctx, lv, (nv + 1) * sizeof *lv);
	run_region(t, l->epilogue, depth + 1);
}

static void run_region(tl *t, ts_id r, int depth)
{
	const ts_region *g = &t->s->rg[r];
	if (depth > 70 || t->fail)
		return;
	if (t->entered)
		t->entered[r] = 1;
	switch (g->kind) {
	case TS_RG_SEQ: run_items(t, r, depth); break;
	case TS_RG_GUARD:
		scalar_insn(t, TCP_OP_LI);
		scalar_insn(t, TCP_OP_BR);
		if (t->val[g->pred])
			run_items(t, r, depth);
		break;
	case TS_RG_CLASSES:
		for (uint32_t k = 0; k < g->nitem; k++) {
			bool last = k + 1 == g->nitem;
			if (!last) {
				scalar_insn(t, TCP_OP_LI);
				scalar_insn(t, TCP_OP_BR);
				if (g->bound[k] < t->val[g->pred])
					continue;
			}
			run_region(t, TS_ITEM_ID(g->item[k]), depth + 1);
			if (!last)
				scalar_insn(t, TCP_OP_JMP);
			break;
		}
		break;
	case TS_RG_LOOP: run_loop(t, r, depth); break;
	default: run_items(t, r, depth); break;
	}
}

/* ---- the entries ---- */
static void release(tl *t)
{
	size_t n = t->s->nop + 1;
	ctx_free(t->ctx, t->val, 0);
	ctx_free(t->ctx, t->slots, 0);
	ctx_free(t->ctx, t->staged, 0);
	ctx_free(t->ctx, t->route, 0);
	ctx_free(t->ctx, t->dmn, 0);
	ctx_free(t->ctx, t->prev, 0);
	ctx_free(t->ctx, t->blk, 0);
	void *deps[] = {t->oreg, t->oidx, t->dfirst, t->dn, t->dl, t->dd, t->rloop, t->octx, t->mlast, t->gidx, t->gstamp,
		t->sbuf, t->sview, t->send, t->sprev, t->uofs, t->nunit, t->uel};
	for (size_t k = 0; k < sizeof deps / sizeof *deps; k++)
		if (deps[k])
			ctx_free(t->ctx, deps[k], 0);
	if (t->start)
		ctx_free(t->ctx, t->start, n * sizeof *t->start);
	if (t->end)
		ctx_free(t->ctx, t->end, n * sizeof *t->end);
	if (t->cost)
		ctx_free(t->ctx, t->cost, n * sizeof *t->cost);
	if (t->own_memo)
		ts_cost_cache_free(t->ctx, t->memo);
	if (t->p)
		tcp_prog_free(t->p);
}

/* Runs the timeline; t's arrays stay allocated (release). */
static int64_t run(moe_ctx *ctx, const tcp_sched *s, const moe_tcp_loads *loads, tl *t, ts_cost_cache *memo,
	uint8_t *entered)
{
	memset(t, 0, sizeof *t);
	t->ctx = ctx;
	t->entered = entered;
	if (entered)
		memset(entered, 0, s->nrg + 1);
	t->memo = memo;
	t->own_memo = !memo;
	t->s = s;
	t->m = s->m;
	t->given = loads;
	if (!s->m) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the schedule's timeline needs a machine");
		return -1;
	}
	tcp_cm_init(&t->cm, s->m);
	if (t->own_memo)
		t->memo = ts_cost_cache_new(ctx);
	t->S = tcp_slices(s->m);
	t->p = ts_tensors(ctx, s);
	size_t n = s->nop + 1;
	t->val = ctx_alloc(ctx, (s->nsc + 1) * sizeof *t->val);
	t->staged = ctx_alloc(ctx, (s->nbuf + 1) * sizeof *t->staged);
	t->route = ctx_alloc(ctx, n);
	t->dmn = ctx_alloc(ctx, (size_t)tcp_meter_stamps(s->m) * sizeof *t->dmn);
	t->start = ctx_alloc(ctx, n * sizeof *t->start);
	t->end = ctx_alloc(ctx, n * sizeof *t->end);
	t->cost = ctx_alloc(ctx, n * sizeof *t->cost);
	t->prev = ctx_alloc(ctx, n * sizeof *t->prev);
	t->blk = ctx_alloc(ctx, n * sizeof *t->blk);
	t->oreg = ctx_alloc(ctx, n * sizeof *t->oreg);
	t->oidx = ctx_alloc(ctx, n * sizeof *t->oidx);
	t->dfirst = ctx_alloc(ctx, n * sizeof *t->dfirst);
	t->dn = ctx_alloc(ctx, n * sizeof *t->dn);
	t->rloop = ctx_alloc(ctx, s->nrg + 1);
	t->gidx = ctx_alloc(ctx, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gidx);
	t->gstamp = ctx_alloc(ctx, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gstamp);
	memset(t->gstamp, 0, (s->nrg + 1) * 2 * TCP_NCTX * sizeof *t->gstamp);
	t->octx = ctx_alloc(ctx, n);
	t->sbuf = ctx_alloc(ctx, n * sizeof *t->sbuf);
	t->sview = ctx_alloc(ctx, n);
	t->uofs = ctx_alloc(ctx, n * sizeof *t->uofs);
	t->nunit = ctx_alloc(ctx, n);
	t->uel = ctx_alloc(ctx, (s->nbuf + 1) * sizeof *t->uel);
	t->mlast = ctx_alloc(ctx, n * sizeof *t->mlast);
	memset(t->mlast, 0, n * sizeof *t->mlast);
	positions(t);
	memset(t->val, 0, (s->nsc + 1) * sizeof *t->val);
	memset(t->route, 0, n);
	memset(t->dmn, 0, (size_t)tcp_meter_stamps(s->m) * sizeof *t->dmn);
	tcp_meter_init(&t->mt, &t->cm, t->p, t->dmn);
	for (size_t i = 0; i < n; i++)
		t->start[i] = t->end[i] = t->prev[i] = -1, t->cost[i] = 0, t->blk[i] = -1;
	for (ts_id i = 0; i <= s->nbuf; i++)
		t->staged[i] = -1;
	t->bexp = s->nloop > 0 && s->loop[0].expert != TS_NONE && s->sc[s->loop[0].expert].kind == TS_SC_SPM_LD
			  ? (int32_t)s->sc[s->loop[0].expert].buf
			  : -1;
	if (loads && (loads->grid < 0 || loads->nblocks < 0 || loads->nblocks > loads->grid ||
			     (loads->grid > 0 && !loads->block_expert))) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the loads need 0 <= nblocks <= grid and a block_expert array");
		return -1;
	}
	t->tc = s->m->launch_cycles;
	run_region(t, s->top, 0);
	if (t->fail)
		return -1;
	int64_t end = t->tc;
	for (int c = 0; c < TCP_NCTX; c++)
		end = end > t->cfree[c] ? end : t->cfree[c];
	return end + s->m->end_cycles;
}

static int64_t predict(moe_ctx *ctx, const tcp_sched *s, const moe_tcp_loads *loads, ts_timeline *out)
{
	tl t;
	int64_t cycles = run(ctx, s, loads, &t, NULL, NULL);
	if (out) {
		memset(out, 0, sizeof *out);
		out->cycles = cycles;
		out->nblocks = t.nblocks;
		out->approx_ld = t.approx_ld;
		out->approx_idx = t.approx_idx;
		if (cycles >= 0) {
			out->start = t.start, out->end = t.end, out->cost = t.cost;
			t.start = t.end = t.cost = NULL;
		}
	}
	release(&t);
	return cycles;
}

int64_t tcp_sched_predict(moe_ctx *ctx, const tcp_sched *s, const moe_tcp_loads *loads, ts_timeline *out)
{
	CTX_GUARDED(ctx, int64_t, -1, predict(ctx, s, loads, out));
}

void ts_timeline_free(moe_ctx *ctx, const tcp_sched *s, ts_timeline *t)
{
	size_t n = s->nop + 1;
	if (t->start)
		ctx_free(ctx, t->start, n * sizeof *t->start);
	if (t->end)
		ctx_free(ctx, t->end, n * sizeof *t->end);
	if (t->cost)
		ctx_free(ctx, t->cost, n * sizeof *t->cost);
	t->start = t->end = t->cost = NULL;
}

/* the op costs on the expected loads; the run's cycles, -1 on failure */
static int64_t cost(moe_ctx *ctx, tcp_sched *s, ts_cost_cache *memo, uint8_t *entered)
{
	tl t;
	int64_t cycles = run(ctx, s, NULL, &t, memo, entered);
	if (cycles < 0) {
		release(&t);
		return -1;
	}
	t.zero = true;
	for (ts_id i = 0; i < s->nop; i++) {
		bool holds;
		s->op[i].cost = t.start[i] >= 0 ? t.cost[i] : ts_op_cycles(&t, i, &holds) + tcp_cost_issue(&t.cm, s->op[i].ctx);
	}
	release(&t);
	return cycles;
}

static moe_status cost_status(moe_ctx *ctx, tcp_sched *s)
{
	return cost(ctx, s, NULL, NULL) < 0 ? MOE_ERR_INVALID : MOE_OK;
}

moe_status tcp_sched_cost(moe_ctx *ctx, tcp_sched *s)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, cost_status(ctx, s));
}

int64_t tcp_sched_cost_cached(moe_ctx *ctx, tcp_sched *s, ts_cost_cache *c, uint8_t *entered)
{
	CTX_GUARDED(ctx, int64_t, -1, cost(ctx, s, c, entered));
}

/* ---- predictions on the expected loads with a cost cache ---- */
static int64_t predict_cached(moe_ctx *ctx, const tcp_sched *s, ts_cost_cache *memo, uint8_t *entered)
{
	tl t;
	int64_t cycles = run(ctx, s, NULL, &t, memo, entered);
	release(&t);
	return cycles;
}

int64_t tcp_sched_predict_cached(moe_ctx *ctx, const tcp_sched *s, ts_cost_cache *memo, uint8_t *entered)
{
	CTX_GUARDED(ctx, int64_t, -1, predict_cached(ctx, s, memo, entered));
}
