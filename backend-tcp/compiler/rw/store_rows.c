/* backend-tcp/compiler/rw/store_rows.c: rewrite `store-rows`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * The block loop saves each block's value, a DM buffer y of B rows of D
 * elements, into the block's B rows of the loop's HBM result: one dma.copy
 * of the whole of y to rows [g B, g B + B) in block g, or (defer-stores) to
 * block g - 1's rows in block g and to block nb - 1's in the epilogue. The
 * DMA pays for every row, but a block holds only its count of rows: the
 * other rows of the HBM result are never read, every op reading that buffer
 * being a dma.gather by the pairs' grid positions, each a row below its
 * block's count (docs/tcp-isa.md 7.4). The rewrite turns each such copy
 * into a copy of [B, D] rows in a classes region keyed on the stored
 * block's count (ts_split_classes; case h copies rows [0, h)): $rows for
 * block g's own store, else a loopvar $strows that takes $rows at each
 * block's end (so block g sees block g - 1's count, and the epilogue the last
 * executed block's). The bounds are every ceil(B / 32) rows, then B.
 * Values are unchanged: every row the gathers read is copied, by the same
 * command as before or by one of its cases. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { SR_MAX = 32, SR_CLASSES = 32 };

typedef struct sr {
	ts_id op[SR_MAX];
	bool own[SR_MAX]; /* keyed on $rows (block g's own rows), else on the loopvar */
	uint32_t n;
	int64_t B, D;
} sr;

/* whether scalar r is `alu.sub $x, 1` of scalar x */
static bool minus1(const tcp_sched *s, ts_id r, ts_id x)
{
	const ts_scalar *c = r < s->nsc ? &s->sc[r] : NULL;
	return c && c->kind == TS_SC_ALU && c->op == TCP_S_SUB && c->a == x && c->b == TS_NONE && c->imm == 1;
}

/* whether scalar x is defined at the top level of region r */
static bool defined_in(const tcp_sched *s, ts_id x, ts_id r)
{
	return x < s->nsc && s->sc[x].region == r;
}

/* The loop's stores of whole block values into the rows of an HBM result
 * read only by gathers: in the body at $g, at $g - 1 under a guard, in the
 * epilogue at $nb - 1 under a guard. */
static bool find(const tcp_sched *s, sr *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	if (l->rows == TS_NONE || l->g == TS_NONE || l->nb == TS_NONE || !defined_in(s, l->rows, l->body))
		return false;
	for (ts_id o = 0; o < s->nop; o++) {
		const ts_op *p = &s->op[o];
		const tcp_insn *in = &p->in;
		const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0];
		if (in->op != TCP_OP_DMA_COPY || in->ndim != 1 || in->vreg >= 0 || (in->flags & TCP_F_JOIN) || d->t < 0 ||
			y->t < 0 || d->reg < 0 || y->reg >= 0 || y->base != 0 || d->base != 0 || d->stride[0] != 1 ||
			y->stride[0] != 1)
			continue;
		const ts_buf *db = &s->buf[d->t], *yb = &s->buf[y->t];
		if (db->space != TCP_HBM || yb->space != TCP_DM || yb->slots > 1 || yb->rank != 2 || yb->shape[0] < 2 ||
			in->dim[0] != yb->shape[0] * yb->shape[1] || d->scale != in->dim[0] || !ts_buf_gathered_only(s, d->t))
			continue;
		ts_id r = (ts_id)d->reg;
		bool body = ts_region_within(s, p->region, l->body), epi = ts_region_within(s, p->region, l->epilogue);
		bool own = body && r == l->g, prev = body && minus1(s, r, l->g), last = epi && minus1(s, r, l->nb);
		if (!own && !prev && !last)
			continue;
		if (x->n == SR_MAX || (x->n && (x->B != yb->shape[0] || x->D != yb->shape[1])))
			return false;
		x->B = yb->shape[0];
		x->D = yb->shape[1];
		x->own[x->n] = own;
		x->op[x->n++] = o;
	}
	return x->n > 0;
}

bool ts_rw_store_rows_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sr x;
	int64_t b[SR_CLASSES + 1];
	return find(s, &x) && ts_even_bounds(x.B, SR_CLASSES, b) > 1;
}

moe_status ts_rw_store_rows_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	sr x;
	int64_t bound[SR_CLASSES + 1];
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	uint32_t n = ts_even_bounds(x.B, SR_CLASSES, bound);
	ts_loop *l = &s->loop[0];
	ts_id prev = TS_NONE;
	for (uint32_t k = 0; k < x.n; k++)
		if (!x.own[k] && prev == TS_NONE) { /* the stored block's count, stepped at each block's end */
			ts_id zero = ts_add_scalar(s, l->prologue, "strzero", TS_SC_CONST, 0, TS_NONE, TS_NONE, 0);
			prev = ts_add_scalar(s, l->prologue, "strows", TS_SC_LOOPVAR, 0, zero, l->rows, 0);
		}
	ts_id nop0 = s->nop; /* the stores' ids stay; their copies come after */
	uint8_t *cut = ctx_alloc(s->ctx, nop0 + 1);
	for (uint32_t k = 0; k < x.n; k++) {
		ts_id o = x.op[k];
		tcp_insn *in = &s->op[o].in;
		in->ndim = 2;
		in->dim[0] = x.B;
		in->dim[1] = x.D;
		for (int w = TCP_V_DST; w <= TCP_V_S0; w++) {
			in->v[w].stride[0] = x.D;
			in->v[w].stride[1] = 1;
		}
		memset(cut, 0, nop0 + 1);
		cut[o] = 1;
		ts_id rg = s->op[o].region;
		int64_t at = ts_op_index(s, rg, o);
		if (at < 0) {
			ctx_free(s->ctx, cut, 0);
			return MOE_ERR_INVALID;
		}
		ts_split_classes(s, rg, (uint32_t)at, 1, x.own[k] ? l->rows : prev, bound, n, cut, false, feature);
		l = &s->loop[0];
	}
	ctx_free(s->ctx, cut, 0);
	return MOE_OK;
}
