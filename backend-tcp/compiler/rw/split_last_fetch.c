/* backend-tcp/compiler/rw/split_last_fetch.c: rewrite `split-last-fetch`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * With double weights, block g fetches block g + 1's expert into the other
 * slot in one dma.copy, and block g + 1's first weight load waits for all
 * of it. Every other block's fetch overlaps a block's compute; the last
 * block's does not: the body's compute waits for the whole fetch, then runs
 * alone. The rewrite splits the fetch for the last block (g + 1 = nb - 1)
 * in two at a point P of the expert's packed weights where the body's loads
 * of the slot divide into those reading below P (the first projections')
 * and those reading from P on; each load waits for its part, so the first
 * projections' loads and contractions run while the rest arrives. With a
 * fetch per projection, the one whose first load comes last is split; where
 * its loads are all of one node (one matrix loaded tile by tile), at the
 * tile boundary nearest its middle (a whole row of a two-dimensional fetch),
 * so the first tiles load while the rest arrives. Where they are of
 * several nodes (an expert's projections packed in one span), P is where
 * the last projection's weights begin, and that part may be cut once more
 * at its tiles' boundary (three parts; see the apply); trials may add one
 * cut below P as well, where the last block's compute outlasts its fetch
 * (cut_below). Every
 * other block keeps the one fetch (one more DMA command each would delay
 * the in-order DMA context's weight stream). Values are unchanged: the
 * parts copy the same bytes to the same places, and every reader of the
 * slot waits for the part holding what it reads. It is a peephole row: it
 * runs on the list scheduler's order and the placed buffers (the parts write
 * the fetch's slot; no buffer is added), so the order its benefit is
 * predicted on is the program's (priced before the scheduler, a split can
 * gain there and lose on the order the scheduler then makes). */
#include <stdint.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* The fetch and the split. */
typedef struct sf {
	ts_id f, gnext;        /* the body's fetch; the scalar g + 1 */
	int64_t p[3];          /* the cut points, elements, ascending */
	int np;                /* cut points used: 1, 2 (the last projection's weights cut too) or 3 (four parts) */
	int64_t row;           /* elements per row of a two-dimensional fetch (1: one-dimensional) */
} sf;

/* whether op o depends on op f */
static bool waits(const tcp_sched *s, ts_id o, ts_id f)
{
	for (uint32_t j = 0; j < s->op[o].ndep; j++)
		if (s->op[o].dep[j] == f)
			return true;
	return false;
}

/* The split points, multiples of `row` elements: the readers of the slot
 * that wait for the fetch, in program order, divide at the last reader of
 * another graph node whose predecessors all read below where it and its
 * successors start (p[0]: the body's last projection's weights from there
 * on, which the last contraction reads; a packed expert of three
 * projections, the first two before it). Where every reader is of one node
 * (one matrix, loaded tile by tile), p[0] is the such division nearest the
 * middle; else p[1] (0: none) is the division within the last node's
 * readers nearest the middle of [p[0], n), so its first tiles load while
 * the rest arrives. A reader of the node and span of an earlier one is a
 * copy of it in another case of a classes region (row-classes): one block
 * runs one case, so it is left out (it reads what the earlier one reads). */
static int divisions(const tcp_sched *s, ts_id f, int32_t w, int64_t n, int64_t row, ts_id *rd, int *nrd, int64_t *cut,
	int *kc, int64_t *node)
{
	*node = 0;
	*nrd = 0;
	uint32_t *pos = ctx_alloc(s->ctx, s->nop * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id *all = ctx_alloc(s->ctx, s->nop * sizeof *all);
	uint32_t na = 0;
	for (ts_id o = 0; o < s->nop; o++)
		if (o != f && waits(s, o, f) && s->op[o].in.v[TCP_V_S0].t == w)
			all[na++] = o;
	for (uint32_t i = 1; i < na; i++) /* by program position */
		for (uint32_t j = i; j > 0 && pos[all[j]] < pos[all[j - 1]]; j--) {
			ts_id t = all[j];
			all[j] = all[j - 1];
			all[j - 1] = t;
		}
	ctx_free(s->ctx, pos, 0);
	/* the distinct readers, copies in later cases left out; at most 64 */
	int64_t lo[64], hi[64];
	int nr = 0;
	bool full = false;
	for (uint32_t i = 0; i < na && !full; i++) {
		int64_t a, b;
		ts_view_span(&s->op[all[i]].in, &s->op[all[i]].in.v[TCP_V_S0], &a, &b);
		bool copy = false;
		for (int k = 0; k < nr && !copy; k++)
			copy = s->op[rd[k]].node == s->op[all[i]].node && lo[k] == a && hi[k] == b;
		if (copy)
			continue;
		if (nr == 64)
			full = true;
		else
			lo[nr] = a, hi[nr] = b, rd[nr++] = all[i];
	}
	ctx_free(s->ctx, all, 0);
	if (full || nr < 2)
		return 0;
	*nrd = nr;
	int64_t below = hi[0];
	int c = 0;
	for (int k = 1; k < nr; k++) {
		int64_t above = lo[k];
		for (int i = k; i < nr; i++)
			above = lo[i] < above ? lo[i] : above;
		if (below <= above && above > 0 && above < n && above % row == 0) {
			if (s->op[rd[k]].node != s->op[rd[k - 1]].node)
				*node = above;
			kc[c] = k, cut[c++] = above;
		}
		below = hi[k] > below ? hi[k] : below;
	}
	return c;
}

static void split_at(const tcp_sched *s, ts_id f, int32_t w, int64_t n, int64_t row, int64_t *p)
{
	p[0] = p[1] = p[2] = 0;
	ts_id rd[64];
	int64_t cut[64], node = 0, mid = 0;
	int kc[64], nr = 0;
	int c = divisions(s, f, w, n, row, rd, &nr, cut, kc, &node);
	/* the division nearest the middle of [p[0], n), of the readers from p[0] on */
	for (int i = 0; i < c; i++) {
		int64_t h = (node + n) / 2;
		if (cut[i] <= node || (node && s->op[rd[kc[i]]].node != s->op[rd[nr - 1]].node))
			continue;
		if (!mid || (cut[i] > h ? cut[i] - h : h - cut[i]) < (mid > h ? mid - h : h - mid))
			mid = cut[i];
	}
	p[0] = node ? node : mid;
	p[1] = node ? mid : 0;
}

static bool find(const tcp_sched *s, sf *x)
{
	if (s->nloop != 1 || s->loop[0].G < 2 || s->loop[0].weights != TS_W_DOUBLE || s->loop[0].prefetch != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	x->f = TS_NONE;
	uint32_t *pos = ctx_alloc(s->ctx, s->nop * sizeof *pos), last = 0;
	ts_op_positions(s, pos);
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
		int64_t row = in->ndim == 2 ? in->dim[1] : 1;
		if (in->op != TCP_OP_DMA_COPY || in->ndim < 1 || in->ndim > 2 || in->vreg >= 0 || d->t < 0 || a->t < 0 ||
			d->reg < 0 || a->reg < 0 || d->stride[in->ndim - 1] != 1 || a->stride[in->ndim - 1] != 1 ||
			d->stride[0] != row || a->stride[0] != row ||
			!ts_region_within(s, s->op[o].region, l->body) || s->op[o].region == l->body)
			continue;
		const ts_buf *wb = &s->buf[d->t];
		if (wb->space != TCP_DM || wb->slots != 2 || d->base != 0 || ts_buf_numel(wb) != in->dim[0] * row)
			continue;
		/* the source row is the expert of block g + 1 */
		const ts_scalar *e = &s->sc[a->reg];
		if (e->kind != TS_SC_SPM_LD || e->a == TS_NONE)
			continue;
		const ts_scalar *gn = &s->sc[e->a];
		if (gn->kind != TS_SC_ALU || gn->op != TCP_S_ADD || gn->a != l->g || gn->b != TS_NONE || gn->imm != 1)
			continue;
		/* of several fetches, the one whose first reader comes last: the
		 * last block's compute waits for it alone at the end */
		uint32_t first = UINT32_MAX;
		for (ts_id q = 0; q < s->nop; q++)
			if (q != o && waits(s, q, o) && s->op[q].in.v[TCP_V_S0].t == d->t && pos[q] < first)
				first = pos[q];
		if (first == UINT32_MAX || (x->f != TS_NONE && first <= last))
			continue;
		last = first;
		x->f = o;
		x->gnext = e->a;
		x->row = row;
	}
	ctx_free(s->ctx, pos, 0);
	if (x->f == TS_NONE)
		return false;
	const tcp_insn *in = &s->op[x->f].in;
	split_at(s, x->f, in->v[TCP_V_DST].t, in->dim[0] * x->row, x->row, x->p);
	x->np = x->p[1] > 0 ? 2 : 1;
	return x->p[0] > 0;
}

bool ts_rw_split_last_fetch_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sf x;
	return find(s, &x);
}

/* the fetch x.f of s in x.np + 1 parts */
static void split(tcp_sched *s, const sf *x, uint16_t feature)
{
	const ts_loop *l = &s->loop[0];
	ts_id f = x->f, rg = s->op[f].region;
	ts_region *r = &s->rg[rg];
	uint32_t at = 0;
	while (at < r->nitem && r->item[at] != (TS_ITEM_OP | f))
		at++;
	memmove(r->item + at, r->item + at + 1, (r->nitem - at - 1) * sizeof *r->item);
	r->nitem--;
	/* g + 2 == nb: this block fetches the last block's expert */
	ts_id g2 = ts_add_scalar(s, rg, "sfnext2", TS_SC_ALU, TCP_S_ADD, x->gnext, TS_NONE, 1);
	ts_id last = ts_add_scalar(s, rg, "sflast", TS_SC_CMP, TCP_C_EQ, g2, l->nb, 0);
	ts_id other = ts_add_scalar(s, rg, "sfother", TS_SC_CMP, TCP_C_NE, g2, l->nb, 0);
	ts_id ro = ts_add_region(s, rg, TS_RG_GUARD, other);
	ts_id rl = ts_add_region(s, rg, TS_RG_GUARD, last);
	ts_region_move_tail(s, rg, at, 5);
	ts_region_push(s, ro, TS_ITEM_OP | f);
	s->op[f].region = ro;
	/* the parts: [c[k], c[k + 1]) of the slot */
	tcp_insn in = s->op[f].in;
	int64_t n = in.dim[0] * x->row, c[5];
	int np = x->np + 1;
	c[0] = 0, c[np] = n;
	for (int k = 0; k < x->np; k++)
		c[k + 1] = x->p[k];
	ts_id part[4];
	for (int k = 0; k < np; k++) {
		tcp_insn pi = in;
		pi.dim[0] = (c[k + 1] - c[k]) / x->row;
		pi.v[TCP_V_DST].base += c[k];
		pi.v[TCP_V_S0].base += c[k];
		part[k] = ts_add_op(s, rl, &pi, s->op[f].phase);
		s->op[part[k]].feature = feature;
		s->op[part[k]].node = s->op[f].node;
		for (uint32_t j = 0; j < s->op[f].ndep; j++)
			ts_add_dep(s, part[k], s->op[f].dep[j], s->op[f].dist[j]);
		/* the first part after the other guard's fetch (it never runs in
		 * the same block: the order only tells the verifier the writes do
		 * not overlap), each later part after the one before */
		ts_add_dep(s, part[k], k ? part[k - 1] : f, 0);
	}
	/* each waiter of the fetch waits for the parts it reads (every part
	 * where it does not read the slot) */
	int32_t w = s->op[f].in.v[TCP_V_DST].t;
	for (ts_id o = 0; o < s->nop; o++) {
		bool own = o == f;
		for (int k = 0; k < np; k++)
			own |= o == part[k];
		int dist = -1;
		for (uint32_t j = 0; !own && j < s->op[o].ndep; j++)
			if (s->op[o].dep[j] == f)
				dist = s->op[o].dist[j];
		if (dist < 0)
			continue;
		int64_t lo = 0, hi = n;
		if (s->op[o].in.v[TCP_V_S0].t == w && s->op[o].in.v[TCP_V_DST].t != w)
			ts_view_span(&s->op[o].in, &s->op[o].in.v[TCP_V_S0], &lo, &hi);
		for (int k = 0; k < np; k++)
			if (lo < c[k + 1] && hi > c[k])
				ts_add_dep(s, o, part[k], dist);
	}
}

/* ---- four parts: the last tile cut in two ----
 *
 * At T = 1 the last block's compute after its last byte is the last TRF
 * tile's load and contraction, and the loads of that block's earlier tiles
 * run one after another on the sub context from when their part lands. The
 * four-part split cuts the slot's last load (its contraction one row of x:
 * a block of one row, as at T = 1) in two, the new last tile a quarter of
 * its rows (rounded up to 64) loaded into the TRF buffer of the same node's
 * load before it (whose contraction is then done), each with its own
 * contraction, and cuts the
 * fetch at the new tile's start and at one or two of the earlier divisions,
 * whichever the placed, predicted layer finds fastest: the last tile loads
 * while the rest of the run is short, and the earlier loads start sooner. */
typedef struct lt {
	ts_id l, c;  /* the slot's last load (by program order) and its contraction */
	ts_id p, cp; /* the same node's load before it into another TRF buffer, and its contraction */
	int64_t r;   /* rows of the new last tile */
} lt;

/* the one contraction reading the TRF buffer load l writes and waiting for l */
static ts_id contraction_of(const tcp_sched *s, ts_id l)
{
	int32_t t = s->op[l].in.v[TCP_V_DST].t;
	ts_id c = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++)
		if (o != l && ts_op_reads(&s->op[o], t)) {
			if (c != TS_NONE || s->op[o].in.op != TCP_OP_TU_CONTRACT || s->op[o].in.v[TCP_V_S1].t != t ||
				!waits(s, o, l))
				return TS_NONE;
			c = o;
		}
	return c;
}

static bool last_tile(const tcp_sched *s, const sf *x, lt *t)
{
	int32_t w = s->op[x->f].in.v[TCP_V_DST].t;
	uint32_t *pos = ctx_alloc(s->ctx, s->nop * sizeof *pos);
	ts_op_positions(s, pos);
	t->l = t->p = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++)
		if (o != x->f && waits(s, o, x->f) && s->op[o].in.v[TCP_V_S0].t == w && (t->l == TS_NONE || pos[o] > pos[t->l]))
			t->l = o;
	bool ok = t->l != TS_NONE;
	const tcp_insn *li = ok ? &s->op[t->l].in : NULL;
	ok = ok && li->op == TCP_OP_SUB_TRF && li->ndim == 2 && li->dim[0] >= 256 && li->v[TCP_V_DST].t >= 0 &&
	     s->buf[li->v[TCP_V_DST].t].space == TCP_TRF;
	t->c = ok ? contraction_of(s, t->l) : TS_NONE;
	const tcp_insn *ci = t->c != TS_NONE ? &s->op[t->c].in : NULL;
	ok = ok && ci && ci->ndim == 3 && ci->dim[0] == 1 && ci->dim[1] == li->dim[0] && ci->v[TCP_V_DST].t >= 0;
	for (ts_id o = 0; ok && o < s->nop; o++) {
		const tcp_insn *pi = &s->op[o].in;
		if (o != t->l && pi->op == TCP_OP_SUB_TRF && s->op[o].node == s->op[t->l].node && pi->v[TCP_V_DST].t >= 0 &&
			pi->v[TCP_V_DST].t != li->v[TCP_V_DST].t && pos[o] < pos[t->l] && (t->p == TS_NONE || pos[o] > pos[t->p]))
			t->p = o;
	}
	ok = ok && t->p != TS_NONE;
	t->cp = ok ? contraction_of(s, t->p) : TS_NONE;
	ok = ok && t->cp != TS_NONE && pos[t->cp] < pos[t->c] && s->op[t->p].region == s->op[t->l].region;
	if (ok) { /* the other buffer: written by p alone, read by its contraction alone, as large */
		int32_t tp = s->op[t->p].in.v[TCP_V_DST].t;
		ok = ts_buf_numel(&s->buf[tp]) >= ts_buf_numel(&s->buf[li->v[TCP_V_DST].t]);
		for (ts_id o = 0; ok && o < s->nop; o++)
			ok = o == t->p || o == t->cp || (!ts_op_reads(&s->op[o], tp) && !ts_op_writes(&s->op[o], tp));
	}
	ctx_free(s->ctx, pos, 0);
	t->r = ok ? (li->dim[0] / 4 + 63) / 64 * 64 : 0;
	return ok && t->r < li->dim[0];
}

/* op of instruction in, right after op `after` in its region */
static ts_id insert_after(tcp_sched *s, ts_id after, const tcp_insn *in, uint16_t feature)
{
	ts_id rg = s->op[after].region;
	ts_id o = ts_add_op(s, rg, in, s->op[after].phase);
	ts_region *r = &s->rg[rg];
	uint32_t at = 0;
	while (at < r->nitem && r->item[at] != (TS_ITEM_OP | after))
		at++;
	memmove(r->item + at + 2, r->item + at + 1, (r->nitem - at - 2) * sizeof *r->item);
	r->item[at + 1] = TS_ITEM_OP | o;
	s->op[o].node = s->op[after].node;
	s->op[o].feature = feature;
	return o;
}

/* t's last tile cut in two; returns the new load */
static ts_id retile(tcp_sched *s, const lt *t, uint16_t feature)
{
	ts_id l = t->l, c = t->c, n0 = s->nop;
	int64_t keep = s->op[l].in.dim[0] - t->r;
	int32_t tp = s->op[t->p].in.v[TCP_V_DST].t;
	tcp_insn li = s->op[l].in, ci = s->op[c].in;
	s->op[l].in.dim[0] = keep;
	s->op[c].in.dim[1] = keep;
	s->op[l].cost = s->op[c].cost = 0;
	li.dim[0] = t->r;
	li.v[TCP_V_S0].base += keep * li.v[TCP_V_S0].stride[0];
	li.v[TCP_V_DST].t = tp;
	ci.dim[1] = t->r;
	ci.v[TCP_V_DST].base += keep * ci.v[TCP_V_DST].stride[1];
	ci.v[TCP_V_S1].t = tp;
	ts_id l2 = insert_after(s, l, &li, feature), c2 = insert_after(s, c, &ci, feature);
	/* every op waiting for l or c waits for its second part too (the
	 * slot's writers for the new load, the result's readers for the new
	 * contraction), at the same distance */
	for (ts_id o = 0; o < n0; o++) {
		uint32_t nd = s->op[o].ndep;
		for (uint32_t j = 0; j < nd; j++) {
			ts_id d = s->op[o].dep[j];
			int dist = s->op[o].dist[j];
			if (d == l && o != c)
				ts_add_dep_once(s, o, l2, dist);
			else if (d == c)
				ts_add_dep_once(s, o, c2, dist);
		}
	}
	for (uint32_t j = 0; j < s->op[l].ndep; j++)
		ts_add_dep_once(s, l2, s->op[l].dep[j], s->op[l].dist[j]);
	for (uint32_t j = 0; j < s->op[c].ndep; j++)
		if (s->op[c].dep[j] != l)
			ts_add_dep_once(s, c2, s->op[c].dep[j], s->op[c].dist[j]);
	ts_add_dep_once(s, l2, t->cp, 0); /* the other buffer read before it is loaded again */
	ts_add_dep_once(s, c2, l2, 0);
	ts_add_dep_once(s, c2, c, 0);
	ts_add_dep_once(s, t->p, c2, 1); /* the next block's load of that buffer after the new contraction */
	if (s->buf[tp].life == TS_LIFE_SPAN)
		s->buf[tp].last = c2; /* its last reader now */
	return l2;
}

typedef struct four_arg {
	int i, j; /* the earlier cuts: divisions i and j (j < 0: none) of those below the new tile */
	uint16_t feature;
} four_arg;

static bool four_copy(tcp_sched *c, void *arg)
{
	const four_arg *a = arg;
	sf x;
	lt t;
	if (!find(c, &x) || !last_tile(c, &x, &t))
		return false;
	ts_id l2 = retile(c, &t, a->feature);
	const tcp_insn *in = &c->op[x.f].in;
	ts_id rd[64];
	int64_t cut[64], node, n = in->dim[0] * x.row, lo, hi;
	int kc[64], nr;
	int m = divisions(c, x.f, in->v[TCP_V_DST].t, n, x.row, rd, &nr, cut, kc, &node);
	ts_view_span(&c->op[l2].in, &c->op[l2].in.v[TCP_V_S0], &lo, &hi);
	if (m < 2 || cut[m - 1] != lo || a->i >= m - 1 || a->j >= m - 1)
		return false;
	x.np = 0;
	x.p[x.np++] = cut[a->i];
	if (a->j >= 0)
		x.p[x.np++] = cut[a->j];
	x.p[x.np++] = cut[m - 1];
	split(c, &x, a->feature);
	return tcp_sched_verify(c) == MOE_OK;
}

typedef struct cuts_arg {
	int np;
	int64_t p[3];
	uint16_t feature;
} cuts_arg;

/* the split at the given cut points in a copy (found again: a copy's ids
 * are its own) */
static bool cuts_copy(tcp_sched *c, void *arg)
{
	const cuts_arg *a = arg;
	sf x;
	if (!find(c, &x))
		return false;
	x.np = a->np;
	memcpy(x.p, a->p, sizeof x.p);
	split(c, &x, a->feature);
	return tcp_sched_verify(c) == MOE_OK;
}

/* One more cut below x's first, at one of the divisions there, where the
 * placed, predicted layer is faster than `best` with it: the first
 * projections' first loads then wait for a shorter part (where the last
 * block's compute, not its fetch, is the longer, it starts sooner). x
 * gets the cuts; returns the cycles (best where none is faster). */
static int64_t cut_below(tcp_sched *s, const ts_env *e, sf *x, int64_t best, uint16_t feature)
{
	ts_id rd[64];
	int64_t cut[64], node;
	int kc[64], nr;
	const tcp_insn *in = &s->op[x->f].in;
	int m = divisions(s, x->f, in->v[TCP_V_DST].t, in->dim[0] * x->row, x->row, rd, &nr, cut, kc, &node);
	cuts_arg win = {0, {0, 0, 0}, feature};
	for (int i = 0; i < m && x->np < 3; i++) {
		if (cut[i] >= x->p[0])
			continue;
		cuts_arg a = {x->np + 1, {cut[i], x->p[0], x->p[1]}, feature};
		ts_trial tr = ts_trial_for(e, "<split-last-fetch trial>", cuts_copy, &a, true);
		int64_t v = ts_trial_of(s, &tr);
		if (v >= 0 && v < best)
			best = v, win = a;
	}
	if (win.np) {
		x->np = win.np;
		memcpy(x->p, win.p, sizeof x->p);
	}
	return best;
}

/* With a second cut point, the three parts are kept where the placed,
 * predicted layer with them is faster than with two (one more DMA setup
 * on the in-order queue against the last projection's first tiles loaded
 * while the rest arrives). */
moe_status ts_rw_split_last_fetch_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	sf x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	lt t;
	bool four = last_tile(s, &x, &t);
	cuts_arg a = {1, {x.p[0], x.p[1], 0}, feature};
	ts_trial tr = ts_trial_for(e, "<split-last-fetch trial>", cuts_copy, &a, true);
	int64_t best = ts_trial_of(s, &tr), two = best;
	if (x.np > 1) {
		a.np = 2;
		int64_t three = ts_trial_of(s, &tr);
		if (three < 0 || (two >= 0 && two <= three))
			x.np = 1;
		else
			best = three;
	}
	int64_t below = best >= 0 ? cut_below(s, e, &x, best, feature) : best;
	if (four && best >= 0 && below == best) {
		ts_id rd[64];
		int64_t cut[64], node;
		int kc[64], nr;
		const tcp_insn *in = &s->op[x.f].in;
		int m = divisions(s, x.f, in->v[TCP_V_DST].t, in->dim[0] * x.row, x.row, rd, &nr, cut, kc, &node);
		size_t len = 0;
		char *text = ts_trial_text(s, &len);
		four_arg win = {-1, -1, feature};
		for (int i = 0; text && i < m; i++)
			for (int j = i; j < m; j++) {
				four_arg b = {i, j == i ? -1 : j, feature};
				ts_trial tr = ts_trial_for(e, "<split-last-fetch trial>", four_copy, &b, true);
				int64_t v = ts_trial_run(s, text, len, &tr);
				if (v >= 0 && v < best)
					best = v, win = b;
			}
		if (text)
			ctx_free(s->ctx, text, len + 1);
		if (win.i >= 0)
			return four_copy(s, &win) ? MOE_OK : MOE_ERR_INVALID;
	}
	split(s, &x, feature);
	return MOE_OK;
}
