/* backend-tcp/compiler/rw/trf_parity.c: rewrite `trf-parity`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * A contraction's TRF tiles sit at the two halves of TRF, and its loads
 * alternate between them, so that a load waits only for the pass before the
 * last on its half (sb_trf_tiles). A block body that loads an odd count L of
 * tiles cannot keep that rhythm from block to block with one placement: its
 * last load and the next block's first would share a half. sb_trf_wrap then
 * moves the body's last contraction onto the half of the one before it, and
 * that last load (down's, in a SwiGLU expert) waits in every block for the
 * contraction before it to end.
 *
 * The rewrite gives the body's TRF work two versions, chosen by the block's
 * parity: a classes region keyed on `($g & 1) + 1` with bounds [1, 2]
 * (ts_split_classes, no dimension cut) in place of the run of ops from the
 * first to the last that touch a TRF tile, in each region that holds such
 * ops (the body itself or each case of its row classes). The even blocks'
 * version (the copies, with their own TRF tiles) loads its k-th tile into
 * half k & 1, the odd blocks' (the originals) into half (k + 1) & 1, so
 * that the global load index alternates halves through every block. The
 * placement's reuse edges then order each load after the last reader of its
 * half: at distance 0 inside a block, at distance 1 across blocks (the two
 * versions are cases of one classes region, exclusive in one pass).
 *
 * Legality: one block loop; every TRF tile any body op touches is touched
 * only in the body, is one slot, lives as a span within one such run, and
 * fits one half; the runs are the body or pairwise exclusive cases, each a
 * run of ops only, each with an odd count of TRF loads, every tile's loads
 * at one parity of the load index; no dependency list longer than half the
 * cap (the copies at most double one); not applied twice; the layer's
 * floor bound by its main context (main_bound). Values are unchanged:
 * both versions run the same commands on the same data, only the tiles'
 * halves differ. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { TP_MAX = 512 };

typedef struct tp {
	ts_id unit[TP_MAX]; /* SEQ regions holding the TRF work */
	uint32_t i0[TP_MAX], m[TP_MAX];
	uint32_t n;
} tp;

static bool is_trf(const tcp_sched *s, int32_t t)
{
	return t >= 0 && (ts_id)t < s->nbuf && s->buf[t].space == TCP_TRF;
}

static bool op_trf(const tcp_sched *s, const ts_op *p)
{
	for (int w = 0; w < TCP_NVIEW; w++)
		if (is_trf(s, p->in.v[w].t))
			return true;
	return false;
}

/* whether scalar x is `alu.add (alu.and $g, 1), 1` */
static bool parity_key(const tcp_sched *s, ts_id x, ts_id g)
{
	if (x >= s->nsc || s->sc[x].kind != TS_SC_ALU || s->sc[x].op != TCP_S_ADD || s->sc[x].b != TS_NONE ||
		s->sc[x].imm != 1)
		return false;
	const ts_scalar *a = s->sc[x].a < s->nsc ? &s->sc[s->sc[x].a] : NULL;
	return a && a->kind == TS_SC_ALU && a->op == TCP_S_AND && a->a == g && a->b == TS_NONE && a->imm == 1;
}

/* the run of region u from its first to its last op touching TRF: ops only,
 * an odd count of loads, each tile's loads at one parity; mark[t] records
 * 1 + the parity of tile t's loads */
static bool unit_run(const tcp_sched *s, ts_id u, uint32_t *i0, uint32_t *m, uint8_t *mark)
{
	const ts_region *r = &s->rg[u];
	uint32_t a = UINT32_MAX, b = 0;
	for (uint32_t k = 0; k < r->nitem; k++) {
		uint32_t it = r->item[k];
		if (TS_ITEM_KIND(it) == TS_ITEM_OP && op_trf(s, &s->op[TS_ITEM_ID(it)])) {
			a = a == UINT32_MAX ? k : a;
			b = k + 1;
		}
	}
	if (a == UINT32_MAX)
		return false;
	uint32_t L = 0;
	for (uint32_t k = a; k < b; k++) {
		uint32_t it = r->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP)
			return false;
		const ts_op *p = &s->op[TS_ITEM_ID(it)];
		int32_t d = p->in.v[TCP_V_DST].t;
		if (!is_trf(s, d))
			continue;
		if (p->in.op != TCP_OP_SUB_TRF)
			return false;
		uint8_t want = (uint8_t)(1 + (L & 1));
		if (mark[d] && mark[d] != want)
			return false;
		mark[d] = want;
		L++;
	}
	*i0 = a;
	*m = b - a;
	return L & 1;
}

/* Whether the layer's floor (isa/floor.c, from the schedule's roofline
 * dims) is bound by its main context rather than by its DMA queue: where
 * every HBM byte takes longer than every MAC, a TRF load's wait on the
 * contraction engine hides under the weights' fetch and the copy, which
 * doubles the body's TRF work for every later prediction, gains nothing. */
static bool main_bound(const tcp_sched *s)
{
	const ts_meta *x = &s->meta;
	tcp_program *p = tcp_prog_new(s->ctx);
	if (!p)
		return false;
	ts_meta_dims(x, p);
	moe_tcp_floor_terms f;
	size_t n0 = moe_diag_count(s->ctx);
	bool ok = moe_tcp_floor(s->ctx, p, s->m, -1, -1.0, &f) == MOE_OK && f.main_seconds >= f.dma_seconds;
	ts_diag_truncate(s->ctx, n0);
	tcp_prog_free(p);
	return ok;
}

static bool find(const tcp_sched *s, tp *x)
{
	memset(x, 0, sizeof *x);
	if (!s->m || s->nloop != 1 || s->loop[0].g == TS_NONE || !main_bound(s))
		return false;
	const ts_loop *l = &s->loop[0];
	int64_t half = tcp_trf_bytes(s->m) / 2;
	bool ok = true;
	uint8_t *inbody = ctx_alloc(s->ctx, s->nbuf + 1), *mark = ctx_alloc(s->ctx, s->nbuf + 1);
	memset(inbody, 0, s->nbuf + 1);
	memset(mark, 0, s->nbuf + 1);
	/* the units: the regions of body ops touching TRF */
	for (ts_id o = 0; o < s->nop && ok; o++) {
		const ts_op *p = &s->op[o];
		if (!op_trf(s, p) || !ts_region_within(s, p->region, l->body))
			continue;
		for (int w = 0; w < TCP_NVIEW; w++)
			if (is_trf(s, p->in.v[w].t))
				inbody[p->in.v[w].t] = 1;
		uint32_t j = 0;
		while (j < x->n && x->unit[j] != p->region)
			j++;
		if (j == x->n) {
			const ts_region *r = &s->rg[p->region];
			if (x->n == TP_MAX || r->kind != TS_RG_SEQ)
				ok = false;
			else if (r->parent < s->nrg && s->rg[r->parent].kind == TS_RG_CLASSES &&
				 parity_key(s, s->rg[r->parent].pred, l->g))
				ok = false; /* applied already */
			else
				x->unit[x->n++] = p->region;
		}
	}
	/* the body's tiles: used only in the body, one slot, one half, spans;
	 * the copies at most double a dependency list */
	for (ts_id o = 0; o < s->nop && ok; o++) {
		const ts_op *p = &s->op[o];
		if (p->ndep + 1 > TS_MAX_DEPS / 2)
			ok = false;
		for (int w = 0; w < TCP_NVIEW; w++)
			if (is_trf(s, p->in.v[w].t) && inbody[p->in.v[w].t] && !ts_region_within(s, p->region, l->body))
				ok = false;
	}
	for (ts_id t = 0; t < s->nbuf && ok; t++) {
		const ts_buf *b = &s->buf[t];
		if (inbody[t] && (b->slots != 1 || b->life != TS_LIFE_SPAN || b->layout.slice_bytes > half ||
				     (b->offset != 0 && b->offset != half) || b->first >= s->nop || b->last >= s->nop))
			ok = false;
	}
	for (uint32_t j = 0; j < x->n && ok; j++) {
		ok = unit_run(s, x->unit[j], &x->i0[j], &x->m[j], mark);
		for (uint32_t i = 0; i < j && ok; i++)
			ok = ts_ops_exclusive(s, TS_ITEM_ID(s->rg[x->unit[i]].item[x->i0[i]]),
				TS_ITEM_ID(s->rg[x->unit[j]].item[x->i0[j]]));
	}
	/* each tile's span within its unit's run */
	for (ts_id t = 0; t < s->nbuf && ok; t++) {
		if (!inbody[t])
			continue;
		ts_id u = s->op[s->buf[t].first].region;
		uint32_t j = 0;
		while (j < x->n && x->unit[j] != u)
			j++;
		int64_t f = j < x->n ? ts_op_index(s, u, s->buf[t].first) : -1;
		int64_t e = j < x->n ? ts_op_index(s, u, s->buf[t].last) : -1;
		ok = j < x->n && s->op[s->buf[t].last].region == u && f >= x->i0[j] && e >= f && e < x->i0[j] + x->m[j];
	}
	ctx_free(s->ctx, inbody, 0);
	ctx_free(s->ctx, mark, 0);
	return ok && x->n > 0;
}

bool ts_rw_trf_parity_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	tp x;
	return find(s, &x);
}

/* the k-th TRF load of case region c into half (k + p) & 1 */
static void halves(tcp_sched *s, ts_id c, int p)
{
	int64_t half = tcp_trf_bytes(s->m) / 2;
	const ts_region *r = &s->rg[c];
	uint32_t k = 0;
	for (uint32_t i = 0; i < r->nitem; i++) {
		const ts_op *q = &s->op[TS_ITEM_ID(r->item[i])];
		if (q->in.op == TCP_OP_SUB_TRF && is_trf(s, q->in.v[TCP_V_DST].t))
			s->buf[q->in.v[TCP_V_DST].t].offset = (int64_t)((k++ + (uint32_t)p) & 1) * half;
	}
}

moe_status ts_rw_trf_parity_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	tp *x = ctx_alloc(s->ctx, sizeof *x);
	if (!find(s, x)) {
		ctx_free(s->ctx, x, 0);
		return MOE_ERR_INVALID;
	}
	ts_loop *l = &s->loop[0];
	ts_id body = l->body;
	/* the key, first in the body: 1 in even blocks, 2 in odd ones */
	ts_id par = ts_add_scalar(s, TS_NONE, "tpar", TS_SC_ALU, TCP_S_AND, l->g, TS_NONE, 1);
	s->sc[par].region = body;
	ts_region_insert(s, body, 0, TS_ITEM_SC | par);
	ts_id key = ts_add_scalar(s, TS_NONE, "tsel", TS_SC_ALU, TCP_S_ADD, par, TS_NONE, 1);
	s->sc[key].region = body;
	ts_region_insert(s, body, 1, TS_ITEM_SC | key);
	static const int64_t bound[2] = {1, 2};
	for (uint32_t j = 0; j < x->n; j++) {
		uint32_t i0 = x->i0[j] + (x->unit[j] == body ? 2 : 0);
		uint8_t *cut = ctx_alloc(s->ctx, s->nop + 1);
		memset(cut, 0, s->nop + 1);
		ts_split_classes(s, x->unit[j], i0, x->m[j], key, bound, 2, cut, true, feature);
		ctx_free(s->ctx, cut, 0);
		ts_id cls = TS_ITEM_ID(s->rg[x->unit[j]].item[i0]);
		halves(s, TS_ITEM_ID(s->rg[cls].item[0]), 0);
		halves(s, TS_ITEM_ID(s->rg[cls].item[1]), 1);
	}
	ctx_free(s->ctx, x, 0);
	return MOE_OK;
}
