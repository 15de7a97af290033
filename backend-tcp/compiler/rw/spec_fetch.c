/* backend-tcp/compiler/rw/spec_fetch.c: rewrite `spec-fetch` (rewrites.def,
 * docs/tcp-compiler.md 5.2).
 *
 * With double weights the loop's prologue fetches block 0's expert into
 * slot 0 (`$e0 = ld experts[0]`, one dma.copy per packed weight). That
 * expert is known only when routing has staged the block list, so on the
 * one in-order DMA context the fetch runs after routing and after the
 * dispatch's commands, and the first block's loads wait for it. Blocks run
 * in expert order: block 0's expert is the lowest expert any pair routes
 * to, expert 0 unless no token picks it. The rewrite fetches expert 0's
 * weights into slot 0 where the DMA context would otherwise wait for routing
 * (after the DMA commands routing reads: ts_spec_insert_at), and the prologue's
 * fetches run only when $e0 != 0 (a guard). Values are unchanged: slot 0
 * holds block 0's expert either way; the prologue's fetches wait for the
 * speculative ones (both write slot 0), and every op that waited for a
 * prologue fetch waits for its speculative copy too (the guard may skip the
 * first).
 *
 * Applies to one block loop with double weights whose prologue fetches
 * read the expert's rows at $e0 (an `ld` of the loop's expert list) from
 * HBM buffers no op writes into slot 0 of DM buffers no op outside the loop
 * touches, and when a miss is unlikely under uniform routing: T K >= 4 E
 * (expert 0 unrouted with probability (1 - K / E)^T <= e^-4). A miss costs
 * the speculative copy's time on the DMA context; the cost model's
 * prediction (expected loads) decides. The slot's bytes are live from the
 * speculative fetch on (a span), so routing's buffers do not share them;
 * where DM cannot hold both the trial fails and the row is not applied. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

#define SF_MAX 8

typedef struct spec {
	ts_id e0;           /* the prologue's block-0 expert scalar */
	ts_id f[SF_MAX];    /* the prologue's fetches */
	uint32_t n;
} spec;

/* Whether prologue op o is a fetch of expert $e0's rows into slot 0. */
static bool fetch(const tcp_sched *s, ts_id o, ts_id e0)
{
	const ts_op *op = &s->op[o];
	const tcp_insn *in = &op->in;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->flags || in->vreg >= 0 || op->ndep || d->t < 0 || a->t < 0 || d->reg >= 0 ||
		a->reg < 0 || (ts_id)a->reg != e0 || in->v[TCP_V_S1].t >= 0)
		return false;
	const ts_buf *db = &s->buf[d->t], *sb = &s->buf[a->t];
	return db->space == TCP_DM && db->slots == 2 && db->kind == TCP_T_SCRATCH && sb->space == TCP_HBM &&
	       !ts_buf_written(s, (ts_id)a->t) && !ts_buf_touched_outside(s, (ts_id)d->t, s->loop[0].region);
}

static bool find(const tcp_sched *s, spec *x)
{
	memset(x, 0, sizeof *x);
	if (!s->m || s->nloop != 1 || s->loop[0].weights != TS_W_DOUBLE || s->loop[0].expert == TS_NONE)
		return false;
	const ts_meta *mt = &s->meta;
	if (mt->E < 1 || mt->K < 1 || mt->T < 1 || mt->T * mt->K < 4 * mt->E)
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_region *pro = &s->rg[l->prologue];
	x->e0 = TS_NONE;
	for (uint32_t k = 0; k < pro->nitem; k++) {
		uint32_t it = pro->item[k];
		if (TS_ITEM_KIND(it) == TS_ITEM_SC) {
			const ts_scalar *c = &s->sc[TS_ITEM_ID(it)];
			/* $e0: an ld of the body's expert list at a constant element 0 */
			const ts_scalar *ex = &s->sc[l->expert];
			if (x->e0 == TS_NONE && c->kind == TS_SC_SPM_LD && ex->kind == TS_SC_SPM_LD && c->buf == ex->buf &&
				c->a == TS_NONE && c->imm == 0)
				x->e0 = TS_ITEM_ID(it);
			continue;
		}
		if (TS_ITEM_KIND(it) != TS_ITEM_OP || x->e0 == TS_NONE || !fetch(s, TS_ITEM_ID(it), x->e0))
			continue;
		if (x->n == SF_MAX)
			return false;
		x->f[x->n++] = TS_ITEM_ID(it);
	}
	return x->n > 0;
}

bool ts_rw_spec_fetch_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	spec x;
	return find(s, &x);
}

moe_status ts_rw_spec_fetch_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	spec x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	const ts_loop *l = &s->loop[0];
	ts_id pro = l->prologue;
	uint32_t at = ts_spec_insert_at(s, e->ctx), nop0 = s->nop;
	ts_id sp[SF_MAX];
	for (uint32_t i = 0; i < x.n; i++) {
		tcp_insn in = s->op[x.f[i]].in;
		in.v[TCP_V_S0].reg = -1; /* expert 0: the rows at the view's base */
		in.v[TCP_V_S0].scale = 0;
		sp[i] = ts_spec_copy(s, &in, x.f[i], at + i, feature);
	}
	ts_spec_waiters(s, x.f, sp, x.n, nop0);
	/* the prologue's fetches only when block 0's expert is not 0 */
	ts_id nz = ts_add_scalar(s, pro, "spnz", TS_SC_CMP, TCP_C_NE, x.e0, TS_NONE, 0);
	ts_id gd = ts_add_region(s, pro, TS_RG_GUARD, nz);
	uint32_t gat = ts_spec_guard(s, pro, gd, x.f, sp, x.n);
	/* the scalar and the guard (appended last) stand where the first fetch stood */
	ts_region *r = &s->rg[pro];
	if (gat != UINT32_MAX && gat + 2 <= r->nitem) {
		uint32_t t0 = r->item[r->nitem - 2], t1 = r->item[r->nitem - 1];
		memmove(r->item + gat + 2, r->item + gat, (r->nitem - 2 - gat) * sizeof *r->item);
		r->item[gat] = t0;
		r->item[gat + 1] = t1;
	}
	return MOE_OK;
}
