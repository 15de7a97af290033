/* backend-tcp/sim/sim_sched.c: the TCP simulator's timing core: the element range of a
 * view, read/write hazard records per tensor, and the scheduler that starts
 * each command when its context is free and its hazards have finished
 * (docs/tcp-model.md, section 4). */
#include "backend-tcp/sim/sim_int.h"

bool tcps_vbase_ok(sim *s, uint32_t pc, const tcp_view *v, int64_t *b)
{
	int64_t off = 0;
	if (v->reg >= 0 && (__builtin_mul_overflow(s->reg[v->reg], v->scale, &off) ||
				   __builtin_add_overflow(v->base, off, b))) {
		FAULT(s, pc, "address overflow: r%d (%lld) x %lld + %lld does not fit 64 bits", v->reg,
			(long long)s->reg[v->reg], (long long)v->scale, (long long)v->base);
		return false;
	}
	if (v->reg < 0)
		*b = v->base;
	return true;
}

/* The element range a view touches, checked against its tensor (every
 * product and sum checked: a register may hold anything). */
bool tcps_vrange(sim *s, uint32_t pc, const tcp_view *v, int nd, const int64_t *dim, int64_t *lo, int64_t *hi)
{
	int64_t a, b;
	if (!tcps_vbase_ok(s, pc, v, &a))
		return false;
	b = a;
	for (int k = 0; k < nd; k++) {
		int64_t x;
		if (__builtin_mul_overflow(v->stride[k], dim[k] - 1, &x) || __builtin_add_overflow(x < 0 ? a : b, x, x < 0 ? &a : &b)) {
			FAULT(s, pc, "address overflow: stride %lld x %lld past 64 bits", (long long)v->stride[k],
				(long long)(dim[k] - 1));
			return false;
		}
	}
	*lo = a;
	*hi = b;
	const tcp_tensor *t = &s->p->t[v->t];
	if (a < 0 || b >= t->numel) {
		FAULT(s, pc, "%s overflow: elements [%lld, %lld] outside tensor '%s' (%lld elements)",
			t->space == TCP_HBM ? "HBM" : t->space == TCP_DM ? "DM" : t->space == TCP_TRF ? "TRF" : "VRF",
			(long long)a, (long long)b, t->name, (long long)t->numel);
		return false;
	}
	return !s->lz || s->no_fill || tcps_fill(s, pc, v->t, a, b);
}

/* ---- hazards ---- */
static int64_t haz_wait(const sim *s, int32_t t, int64_t lo, int64_t hi, bool write, evref *ev)
{
	const haz *h = &s->hz[t];
	int64_t w = h->floor_w;
	*ev = h->floor_w_ev;
	if (write && h->floor_r > w)
		w = h->floor_r, *ev = h->floor_r_ev;
	for (int i = 0; i < h->n; i++) {
		const haz_rec *r = &h->r[i];
		if (r->hi < lo || r->lo > hi || (!write && !r->write))
			continue;
		if (r->end > w)
			w = r->end, *ev = r->ev;
	}
	return w;
}

static void haz_note(sim *s, int32_t t, const haz_rec *rec)
{
	haz *h = &s->hz[t];
	if (h->n == NHAZ) {
		/* evict the earliest-ending record into the floor */
		int k = 0;
		for (int i = 1; i < h->n; i++)
			if (h->r[i].end < h->r[k].end)
				k = i;
		if (h->r[k].write && h->r[k].end > h->floor_w)
			h->floor_w = h->r[k].end, h->floor_w_ev = h->r[k].ev;
		else if (!h->r[k].write && h->r[k].end > h->floor_r)
			h->floor_r = h->r[k].end, h->floor_r_ev = h->r[k].ev;
		h->r[k] = h->r[--h->n];
	}
	h->r[h->n++] = *rec;
	if (rec->end > h->last_end)
		h->last_end = rec->end;
	if (rec->write)
		h->last_wseq = rec->seq;
}

/* Records a command's run; its evref (0 when not recorded). */
static evref event(sim *s, uint32_t pc, int ctx, int64_t start, int64_t end, evref pred)
{
	if ((!s->o->trace_path && !s->keep_ev) || s->nev >= TCP_MAX_EVENTS)
		return 0;
	if (s->nev == s->evcap) {
		size_t nc = s->evcap ? s->evcap * 2 : 4096;
		tev *ne = ctx_realloc(s->ctx, s->ev, 0, nc * sizeof *ne); /* guarded: refused is MOE_ERR_NOMEM */
		if (!ne)
			return 0;
		s->ev = ne;
		s->evcap = nc;
	}
	s->ev[s->nev++] = (tev){ctx, s->p->code[pc].op, pc, start, end, pred - 1};
	return (evref)s->nev;
}

/* Schedule a command of `dur` cycles in its context after its hazards. A
 * Tensor Unit command (main, sub) adds assumed.command_issue_cycles; a DMA
 * command's dma.setup_cycles, in `dur`, includes its issue. DMA commands run
 * in one in-order queue: with dma.setup_overlaps_previous false (revision 3)
 * a command flagged join is an ordinary next command, its setup after the
 * previous transfer; only a machine that sets the field true lets it set up
 * beside that transfer (its transfer still follows that command's). */
void tcps_schedule(sim *s, uint32_t pc, const acc *a, int64_t dur)
{
	int ctx = tcp_op_ctx[s->p->code[pc].op];
	bool join = ctx == TCP_CTX_DMA && (s->p->code[pc].flags & TCP_F_JOIN) && s->m->setup_overlaps;
	int64_t prev_end = s->cfree[ctx];
	evref prev = s->cev[ctx];
	s->tc += tcp_cost_scalar(&s->cm, s->p->code[pc].op);
	int64_t from = join ? s->dma_start : s->cfree[ctx];
	int64_t start = s->tc > from ? s->tc : from;
	evref pred = s->tc > from ? s->tcev : (join ? s->dma_pred : prev);
	if (s->hold_main && s->cfree[TCP_CTX_MAIN] > start) /* a sub load on main's switch channel */
		start = s->cfree[TCP_CTX_MAIN], pred = s->cev[TCP_CTX_MAIN];
	for (int i = 0; i < a->n; i++) {
		evref hv;
		int64_t w = haz_wait(s, a->t[i], a->lo[i], a->hi[i], a->w[i], &hv);
		if (w > start)
			start = w, pred = hv;
	}
	/* DM/TRF/VRF operands: their per-slice bytes, checked against the
	 * tensors sharing them (sim_alias.c) */
	int64_t blo[6] = {0}, bhi[6] = {0};
	for (int i = 0; i < a->n; i++) {
		int32_t t = a->t[i];
		if (s->p->t[t].space == TCP_HBM)
			continue;
		tcps_byte_span(s, t, a->lo[i], a->hi[i], &blo[i], &bhi[i]);
		if (s->alo[t] == s->alo[t + 1])
			continue;
		if (!a->w[i] && !tcps_alias_read_ok(s, pc, t, blo[i], bhi[i]))
			return;
		if (s->order_bytes)
			start = tcps_alias_wait(s, t, blo[i], bhi[i], a->w[i], &pred, start);
	}
	dur += tcp_cost_issue(&s->cm, ctx);
	if (dur > TCP_MAX_CYCLES - start) {
		s->cycles_overflow = true;
		dur = TCP_MAX_CYCLES - start;
	}
	int64_t end = start + dur;
	evref started_by = pred;
	if (join && end < prev_end + dur - s->m->dma_setup)
		end = prev_end + dur - s->m->dma_setup, pred = prev;
	evref me = event(s, pc, ctx, start, end, pred);
	if (ctx == TCP_CTX_DMA)
		s->dma_start = start, s->dma_pred = started_by;
	s->cfree[ctx] = end;
	s->cev[ctx] = me;
	if (s->hold_main)
		s->cfree[TCP_CTX_MAIN] = end, s->cev[TCP_CTX_MAIN] = me;
	for (int i = 0; i < a->n; i++) {
		haz_rec r = {a->lo[i], a->hi[i], end, blo[i], bhi[i], s->st->commands, pc, a->w[i], me};
		haz_note(s, a->t[i], &r);
	}
	busy(s, pc, ctx == TCP_CTX_MAIN ? MOE_TCP_ENGINE_MAIN : ctx == TCP_CTX_SUB ? MOE_TCP_ENGINE_SUB : MOE_TCP_ENGINE_DMA,
		dur);
	if (in_experts(s, pc)) {
		if (s->nxiv == s->xivcap) {
			size_t nc = s->xivcap ? s->xivcap * 2 : 1024;
			int64_t(*ni)[2] = ctx_realloc(s->ctx, s->xiv, 0, nc * sizeof *ni);
			if (!ni) {
				FAULT(s, pc, "out of host memory");
				return;
			}
			s->xiv = ni;
			s->xivcap = nc;
		}
		s->xiv[s->nxiv][0] = start;
		s->xiv[s->nxiv++][1] = end;
	}
	s->st->commands++;
}
