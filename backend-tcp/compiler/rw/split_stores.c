/* backend-tcp/compiler/rw/split_stores.c: rewrite `split-stores`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After the loop a DM buffer whose rows several ops write, each its own
 * range of whole rows (the combine's pieces), is copied into an HBM buffer
 * by one dma.copy that waits for the last of them. The rewrite splits that
 * copy into one per writer's rows, each waiting for its writer (and what the
 * copy waited for but the other writers), so the first pieces' copies run
 * while the later pieces compute. Values are unchanged: each row is copied
 * once, after the one op that writes it. */
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

#define SS_MAX 64

typedef struct ss {
	ts_id c;          /* the copy */
	ts_id w[SS_MAX];  /* the writers of its source, in program order */
	uint32_t nw;
	int64_t n;        /* elements of a row */
} ss;

static bool plain(const tcp_view *v)
{
	return v->t >= 0 && v->reg < 0;
}

/* whether o writes rows of buffer t (rows of n) as a [rows, n] view; *r0, *nr */
static bool row_writer(const tcp_insn *in, int64_t n, int64_t *r0, int64_t *nr)
{
	const tcp_view *d = &in->v[TCP_V_DST];
	if (in->ndim != 2 || in->vreg >= 0 || !plain(d) || in->dim[1] != n || d->stride[1] != 1 ||
		(in->dim[0] > 1 && d->stride[0] != n) || d->base < 0 || d->base % n)
		return false;
	*r0 = d->base / n;
	*nr = in->dim[0];
	return true;
}

static bool try_copy(const tcp_sched *s, ts_id c, const uint32_t *pos, ss *x)
{
	const tcp_insn *in = &s->op[c].in;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->vreg >= 0 || !plain(d) || !plain(a) || d->base ||
		a->base || d->stride[0] != in->dim[1] || a->stride[0] != in->dim[1] || d->stride[1] != 1 ||
		a->stride[1] != 1 || (s->nloop && ts_region_within(s, s->op[c].region, s->loop[0].region)))
		return false;
	const ts_buf *db = &s->buf[d->t], *ab = &s->buf[a->t];
	int64_t N = in->dim[0], n = in->dim[1];
	if (db->space != TCP_HBM || ab->space != TCP_DM || ab->slots != 1 || ts_buf_numel(ab) != N * n)
		return false;
	int64_t covered = 0;
	uint8_t *row = calloc((size_t)N, 1);
	if (!row)
		return false;
	x->nw = 0;
	bool ok = true;
	for (ts_id o = 0; o < s->nop && ok; o++) {
		if (o == c)
			continue;
		if (ts_op_writes(&s->op[o], d->t)) {
			ok = false;
			break;
		}
		if (!ts_op_writes(&s->op[o], a->t))
			continue;
		int64_t r0 = 0, nr = 0;
		ok = x->nw < SS_MAX && s->op[o].region == s->op[c].region && pos[o] < pos[c] &&
		     row_writer(&s->op[o].in, n, &r0, &nr) && r0 + nr <= N;
		for (int64_t r = r0; ok && r < r0 + nr; r++)
			ok = !row[r]++;
		if (ok) {
			covered += nr;
			x->w[x->nw++] = o;
		}
	}
	free(row);
	if (!ok || x->nw < 2 || covered != N)
		return false;
	for (uint32_t i = 1; i < x->nw; i++) /* program order */
		for (uint32_t j = i; j > 0 && pos[x->w[j - 1]] > pos[x->w[j]]; j--) {
			ts_id t = x->w[j];
			x->w[j] = x->w[j - 1];
			x->w[j - 1] = t;
		}
	x->c = c;
	x->n = n;
	return true;
}

static bool find(const tcp_sched *s, ss *x)
{
	uint32_t *pos = malloc((s->nop + 1) * sizeof *pos);
	if (!pos)
		return false;
	ts_op_positions(s, pos);
	bool ok = false;
	for (ts_id c = 0; c < s->nop && !ok; c++)
		ok = try_copy(s, c, pos, x);
	free(pos);
	return ok;
}

bool ts_rw_split_stores_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	ss x;
	return find(s, &x);
}

static bool is_writer(const ss *x, ts_id o)
{
	for (uint32_t i = 0; i < x->nw; i++)
		if (x->w[i] == o)
			return true;
	return false;
}

moe_status ts_rw_split_stores_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	ss x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	ts_id c = x.c, rg = s->op[c].region, piece[SS_MAX];
	uint32_t at = 0;
	while (at < s->rg[rg].nitem && s->rg[rg].item[at] != (TS_ITEM_OP | c))
		at++;
	if (at == s->rg[rg].nitem)
		return MOE_ERR_INVALID;
	ts_id nold = s->nop;
	for (uint32_t i = 0; i < x.nw; i++) { /* the copy of writer i's rows; the last one is c */
		int64_t r0 = 0, nr = 0;
		row_writer(&s->op[x.w[i]].in, x.n, &r0, &nr);
		tcp_insn in = s->op[c].in;
		in.dim[0] = nr;
		in.v[TCP_V_DST].base = r0 * x.n;
		in.v[TCP_V_S0].base = r0 * x.n;
		ts_id p = c;
		if (i + 1 < x.nw) {
			p = ts_add_op(s, TS_NONE, &in, s->op[c].phase);
			s->op[p].region = rg;
			s->op[p].node = s->op[c].node;
			s->op[p].feature = feature;
			ts_region_insert(s, rg, at++, TS_ITEM_OP | p);
			for (uint32_t j = 0; j < s->op[c].ndep; j++)
				if (!is_writer(&x, s->op[c].dep[j]))
					ts_add_dep(s, p, s->op[c].dep[j], s->op[c].dist[j]);
			ts_add_dep(s, p, x.w[i], 0);
		} else {
			s->op[c].in = in;
			s->op[c].feature = feature;
			s->op[c].cost = 0;
			uint32_t k = 0;
			bool has = false;
			for (uint32_t j = 0; j < s->op[c].ndep; j++) {
				ts_id q = s->op[c].dep[j];
				if (is_writer(&x, q) && q != x.w[i])
					continue;
				has |= q == x.w[i];
				s->op[c].dep[k] = q;
				s->op[c].dist[k++] = s->op[c].dist[j];
			}
			s->op[c].ndep = k;
			if (!has)
				ts_add_dep(s, c, x.w[i], 0);
		}
		piece[i] = p;
	}
	/* whatever waited for the copy waits for every piece; a span starting at
	 * the copy starts at the first piece */
	for (ts_id o = 0; o < nold; o++) {
		if (o == c)
			continue;
		for (uint32_t j = 0; j < s->op[o].ndep; j++)
			if (s->op[o].dep[j] == c) {
				uint8_t dist = s->op[o].dist[j];
				for (uint32_t i = 0; i + 1 < x.nw; i++)
					ts_add_dep(s, o, piece[i], dist);
				break;
			}
	}
	for (ts_id b = 0; b < s->nbuf; b++)
		if (s->buf[b].life == TS_LIFE_SPAN && s->buf[b].first == c)
			s->buf[b].first = piece[0];
	return MOE_OK;
}
