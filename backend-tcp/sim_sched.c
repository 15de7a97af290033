/* backend-tcp/sim_sched.c: the TCP simulator's timing core: the element range of a
 * view, read/write hazard records per tensor, and the scheduler that starts
 * each command when its context is free and its hazards have finished
 * (MODEL.md section 4). */
#include "backend-tcp/sim_int.h"

/* The element range a view touches, checked against its tensor. */
bool tcps_vrange(sim *s, uint32_t pc, const tcp_view *v, int nd, const int64_t *dim, int64_t *lo, int64_t *hi)
{
	int64_t a = vbase(s, v), b = a;
	for (int k = 0; k < nd; k++) {
		int64_t x = v->stride[k] * (dim[k] - 1);
		if (x < 0)
			a += x;
		else
			b += x;
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
	return true;
}

/* ---- hazards ---- */
static int64_t haz_wait(const sim *s, int32_t t, int64_t lo, int64_t hi, bool write)
{
	const haz *h = &s->hz[t];
	int64_t w = write ? (h->floor_w > h->floor_r ? h->floor_w : h->floor_r) : h->floor_w;
	for (int i = 0; i < h->n; i++) {
		const haz_rec *r = &h->r[i];
		if (r->hi < lo || r->lo > hi || (!write && !r->write))
			continue;
		if (r->end > w)
			w = r->end;
	}
	return w;
}

static void haz_note(sim *s, int32_t t, int64_t lo, int64_t hi, bool write, int64_t end)
{
	haz *h = &s->hz[t];
	if (h->n == NHAZ) {
		/* evict the earliest-ending record into the floor */
		int k = 0;
		for (int i = 1; i < h->n; i++)
			if (h->r[i].end < h->r[k].end)
				k = i;
		if (h->r[k].write)
			h->floor_w = h->floor_w > h->r[k].end ? h->floor_w : h->r[k].end;
		else
			h->floor_r = h->floor_r > h->r[k].end ? h->floor_r : h->r[k].end;
		h->r[k] = h->r[--h->n];
	}
	h->r[h->n++] = (haz_rec){lo, hi, end, write};
}

static void event(sim *s, uint32_t pc, int ctx, int64_t start, int64_t end)
{
	if ((!s->o->trace_path && !s->keep_ev) || s->nev >= TCP_MAX_EVENTS)
		return;
	if (s->nev == s->evcap) {
		size_t nc = s->evcap ? s->evcap * 2 : 4096;
		tev *ne = ctx_realloc(s->ctx, s->ev, 0, nc * sizeof *ne); /* guarded: refused is MOE_ERR_NOMEM */
		if (!ne)
			return;
		s->ev = ne;
		s->evcap = nc;
	}
	s->ev[s->nev++] = (tev){ctx, s->p->code[pc].op, pc, start, end};
}

/* Schedule a command of `dur` cycles in its context after its hazards;
 * `dur_sub_busy` when the sub context is still busy at its start (a tensor
 * pass whose fetch then cannot use the dual channel). */
void tcps_schedule_alt(sim *s, uint32_t pc, const acc *a, int64_t dur, int64_t dur_sub_busy)
{
	int ctx = tcp_op_ctx[s->p->code[pc].op];
	/* a joined DMA sets up beside the command it joins: only its transfer
	 * (and issue) follows that command's end */
	bool join = ctx == TCP_CTX_DMA && (s->p->code[pc].flags & TCP_F_JOIN);
	int64_t prev_end = s->cfree[ctx];
	s->tc += s->m->scalar_cycles;
	int64_t start = s->tc > (join ? s->dma_start : s->cfree[ctx]) ? s->tc : (join ? s->dma_start : s->cfree[ctx]);
	for (int i = 0; i < a->n; i++) {
		int64_t w = haz_wait(s, a->t[i], a->lo[i], a->hi[i], a->w[i]);
		if (w > start)
			start = w;
	}
	if (s->cfree[TCP_CTX_SUB] > start)
		dur = dur_sub_busy;
	dur += s->m->issue_cycles;
	if (dur > TCP_MAX_CYCLES - start) {
		s->cycles_overflow = true;
		dur = TCP_MAX_CYCLES - start;
	}
	int64_t end = start + dur;
	if (join && end < prev_end + dur - s->m->dma_setup)
		end = prev_end + dur - s->m->dma_setup;
	if (ctx == TCP_CTX_DMA)
		s->dma_start = start;
	s->cfree[ctx] = end;
	for (int i = 0; i < a->n; i++)
		haz_note(s, a->t[i], a->lo[i], a->hi[i], a->w[i], end);
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
	event(s, pc, ctx, start, end);
}

void tcps_schedule(sim *s, uint32_t pc, const acc *a, int64_t dur)
{
	tcps_schedule_alt(s, pc, a, dur, dur);
}
