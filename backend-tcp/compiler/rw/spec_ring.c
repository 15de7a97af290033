/* backend-tcp/compiler/rw/spec_ring.c: rewrite `spec-ring` (rewrites.def,
 * docs/tcp-compiler.md 5.2).
 *
 * spec-fetch for streamed weights. With a ring of weight tiles each block
 * copies its expert's first tile into the ring's first slot at its start
 * (`dma.copy ... s0=W+$e*step`, one per case of a row-classes region), and
 * block 0's first contraction waits for that copy and the tile's TRF load,
 * which wait for routing to stage the block list: on the one in-order DMA
 * context the copy runs after routing and after block 0's row gather. Blocks
 * run in expert order, so block 0's expert is expert 0 unless no token picks
 * it. The rewrite copies expert 0's first tile into the first slot where the
 * DMA context would otherwise wait for routing (ts_spec_insert_at, as
 * spec-fetch), and the body's first-tile copies run only when the block is
 * not block 0 of expert 0 (a guard on $g + $e != 0). Values are unchanged:
 * block 0's first slot holds its expert's first tile either way; every op
 * that waited for a guarded copy, or writes the ring, waits for the
 * speculative one too (ts_spec_waiters); the ring is live from the
 * speculative copy on (a span, widened by the planner to the loop), so
 * routing's buffers do not share its bytes, and where DM cannot hold both
 * the trial fails.
 *
 * The ring copies standing right after the first-tile copies in the body
 * (ring-lead's, each a run of tiles into fixed slots, waiting only for the
 * previous blocks' readers of those slots) may be speculated too, in order:
 * each one copies expert 0's tiles into its slots before the loop, after
 * the speculative first tile, and stands in the body in the same guard. How
 * many is priced by trials (ts_rw_spec_ring_apply): they fill the time the
 * DMA context would wait after the first tile for routing's vector passes.
 *
 * Applies to one block loop with streamed weights whose body's first ring
 * fetches (the first op writing the ring in the body, or in each case of a
 * classes region standing directly in the body) all copy the same rows of
 * one HBM weight no op writes, moved by the loop's expert scalar, into the
 * ring's first slot, and when a miss is unlikely under uniform routing:
 * T K >= 4 E. A miss costs the copy's time on the DMA context; the
 * prediction on expected loads decides. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { SR_MAX = 256 };

typedef struct sr {
	ts_id ring;          /* the ring buffer */
	ts_id f[SR_MAX];     /* the body's first-tile copies, one per case */
	uint32_t n;
	uint32_t at;         /* the body item holding them (the copy, or its classes region) */
	ts_id nx[SR_MAX];    /* the ring fetches standing right after it in the body */
	uint32_t nnx;
} sr;

/* whether op o copies rows of an HBM weight moved by the loop's expert
 * scalar into slot 0 of a ring of l's slots */
static bool first_tile(const tcp_sched *s, const ts_loop *l, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
	if (in->op != TCP_OP_DMA_COPY || in->flags || in->vreg >= 0 || d->t < 0 || a->t < 0 || d->reg >= 0 ||
		a->reg < 0 || (ts_id)a->reg != l->expert || in->v[TCP_V_S1].t >= 0 || d->base != 0)
		return false;
	const ts_buf *r = &s->buf[d->t], *h = &s->buf[a->t];
	return r->space == TCP_DM && r->slots == l->ring && r->life == TS_LIFE_LOOP && h->space == TCP_HBM &&
	       !ts_buf_written(s, (ts_id)a->t);
}

/* whether op o, an item of the body, is a ring fetch that block 0 may issue
 * before the loop: a copy of an HBM weight no op writes, moved by the loop's
 * expert scalar, into a fixed place of ring r, waiting only for earlier
 * blocks (each dependency a loop-carried one) */
static bool next_fetch(const tcp_sched *s, const ts_loop *l, ts_id r, ts_id o)
{
	const ts_op *q = &s->op[o];
	const tcp_insn *in = &q->in;
	const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
	if (q->region != l->body || in->op != TCP_OP_DMA_COPY || in->flags || in->vreg >= 0 || d->t != (int32_t)r ||
		d->reg >= 0 || a->t < 0 || a->reg < 0 || (ts_id)a->reg != l->expert || in->v[TCP_V_S1].t >= 0 ||
		s->buf[a->t].space != TCP_HBM || ts_buf_written(s, (ts_id)a->t))
		return false;
	for (uint32_t j = 0; j < q->ndep; j++)
		if (!q->dist[j])
			return false;
	return true;
}

/* The first op of region rg writing buffer b (items in order, nested
 * regions walked), or TS_NONE. */
static ts_id first_writer(const tcp_sched *s, ts_id rg, ts_id b)
{
	const ts_region *r = &s->rg[rg];
	for (uint32_t k = 0; k < r->nitem; k++) {
		uint32_t it = r->item[k];
		if (TS_ITEM_KIND(it) == TS_ITEM_OP) {
			if (ts_op_writes(&s->op[TS_ITEM_ID(it)], (int32_t)b))
				return TS_ITEM_ID(it);
		} else if (TS_ITEM_KIND(it) == TS_ITEM_RG) {
			ts_id w = first_writer(s, TS_ITEM_ID(it), b);
			if (w != TS_NONE)
				return w;
		}
	}
	return TS_NONE;
}

static bool same_copy(const tcp_insn *a, const tcp_insn *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (int k = 0; k < a->ndim; k++)
		if (a->dim[k] != b->dim[k])
			return false;
	for (int w = TCP_V_DST; w <= TCP_V_S0; w++) {
		const tcp_view *x = &a->v[w], *y = &b->v[w];
		if (x->t != y->t || x->base != y->base || x->reg != y->reg || x->scale != y->scale)
			return false;
		for (int k = 0; k < a->ndim; k++)
			if (x->stride[k] != y->stride[k])
				return false;
	}
	return true;
}

/* x's next fetches: the body's items after x->at while each is one */
static void next_fetches(const tcp_sched *s, const ts_loop *l, sr *x)
{
	const ts_region *body = &s->rg[l->body];
	for (uint32_t k = x->at + 1; k < body->nitem && x->nnx < SR_MAX; k++) {
		uint32_t it = body->item[k];
		if (TS_ITEM_KIND(it) != TS_ITEM_OP || !next_fetch(s, l, x->ring, TS_ITEM_ID(it)))
			break;
		x->nx[x->nnx++] = TS_ITEM_ID(it);
	}
}

static bool find(const tcp_sched *s, sr *x)
{
	memset(x, 0, sizeof *x);
	if (!s->m || s->nloop != 1 || s->loop[0].weights != TS_W_STREAM || s->loop[0].expert == TS_NONE ||
		s->loop[0].ring < 2)
		return false;
	const ts_meta *mt = &s->meta;
	if (mt->E < 1 || mt->K < 1 || mt->T < 1 || mt->T * mt->K < 4 * mt->E)
		return false;
	const ts_loop *l = &s->loop[0];
	const ts_region *body = &s->rg[l->body];
	/* the body's first item writing a ring: an op, or a classes region each
	 * of whose cases' first ring writer is a first-tile copy */
	for (uint32_t k = 0; k < body->nitem; k++) {
		uint32_t it = body->item[k];
		if (TS_ITEM_KIND(it) == TS_ITEM_OP) {
			ts_id o = TS_ITEM_ID(it);
			const tcp_view *d = &s->op[o].in.v[TCP_V_DST];
			if (d->t < 0 || s->buf[d->t].slots != l->ring || s->buf[d->t].life != TS_LIFE_LOOP)
				continue;
			if (!first_tile(s, l, o))
				return false;
			x->ring = (ts_id)d->t, x->f[x->n++] = o, x->at = k;
			next_fetches(s, l, x);
			return true;
		}
		if (TS_ITEM_KIND(it) != TS_ITEM_RG)
			continue;
		const ts_region *c = &s->rg[TS_ITEM_ID(it)];
		if (c->kind != TS_RG_CLASSES || c->nitem > SR_MAX)
			return false;
		for (uint32_t j = 0; j < c->nitem; j++) {
			ts_id o = TS_NONE;
			for (ts_id b = 0; b < s->nbuf && o == TS_NONE; b++)
				if (s->buf[b].slots == l->ring && s->buf[b].life == TS_LIFE_LOOP && s->buf[b].space == TCP_DM)
					o = first_writer(s, TS_ITEM_ID(c->item[j]), b);
			if (o == TS_NONE)
				return false;
			if (!first_tile(s, l, o) || (x->n && !same_copy(&s->op[o].in, &s->op[x->f[0]].in)))
				return false;
			x->f[x->n++] = o;
		}
		if (!x->n)
			return false;
		x->ring = (ts_id)s->op[x->f[0]].in.v[TCP_V_DST].t;
		x->at = k;
		next_fetches(s, l, x);
		return true;
	}
	return false;
}

bool ts_rw_spec_ring_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sr x;
	return find(s, &x);
}

/* Copy o, an item of region rg, moved into a new guard on pred standing
 * where it stood. */
static void guard_op(tcp_sched *s, ts_id o, ts_id pred)
{
	ts_id rg = s->op[o].region;
	uint32_t at = ts_region_unlink(s, rg, TS_ITEM_OP | o);
	IR_ASSERT(at != UINT32_MAX);
	ts_id gd = ts_add_region(s, rg, TS_RG_GUARD, pred);
	ts_region_push(s, gd, TS_ITEM_OP | o);
	s->op[o].region = gd;
	ts_region_move_tail(s, rg, at, 1);
}

/* The rewrite with the first `depth` of x's next fetches speculated too. */
static bool spec(tcp_sched *s, const ts_env *e, uint16_t feature, int64_t depth)
{
	sr x;
	if (!find(s, &x) || depth > x.nnx)
		return false;
	const ts_loop *l = &s->loop[0];
	ts_id body = l->body, ex = l->expert, g = l->g;
	uint32_t at = ts_spec_insert_at(s, e->ctx), nop0 = s->nop;
	ts_id sp[SR_MAX];
	for (uint32_t i = 0; i <= depth; i++) {
		/* expert 0: the rows at the view's base */
		tcp_insn in = s->op[i ? x.nx[i - 1] : x.f[0]].in;
		in.v[TCP_V_S0].reg = -1;
		in.v[TCP_V_S0].scale = 0;
		sp[i] = ts_spec_copy(s, &in, i ? x.nx[i - 1] : x.f[0], at + i, feature);
	}
	ts_id sps[SR_MAX];
	for (uint32_t i = 0; i < x.n; i++)
		sps[i] = sp[0];
	ts_spec_waiters(s, x.f, sps, x.n, nop0);
	ts_spec_waiters(s, x.nx, sp + 1, depth, nop0);
	/* the body's copies only where the block is not block 0 of expert 0 */
	ts_id sum = ts_add_scalar(s, body, "srge", TS_SC_ALU, TCP_S_ADD, g, ex, 0);
	ts_id nz = ts_add_scalar(s, body, "srnz", TS_SC_CMP, TCP_C_NE, sum, TS_NONE, 0);
	ts_region_move_tail(s, body, x.at, 2);
	for (uint32_t i = 0; i < x.n; i++)
		guard_op(s, x.f[i], nz);
	for (uint32_t i = 0; i < depth; i++)
		guard_op(s, x.nx[i], nz);
	/* the ring is live from the speculative copies on */
	ts_buf *b = &s->buf[x.ring];
	b->life = TS_LIFE_SPAN;
	b->first = sp[0];
	b->last = x.f[0];
	return true;
}

/* The depth: none of the next fetches, then the first 1, 2, ... of them,
 * each speculated in a trial copy, placed and predicted, until one is no
 * faster than the fastest before it; the fastest taken (ties: the fewer).
 * Each one more moves the block list's staging and block 0's row gather
 * later on the DMA context by its copy: it gains while routing would leave
 * that context idle, and once it does not, a deeper one delays them more. */
moe_status ts_rw_spec_ring_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	sr x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	int64_t best = ts_price_ascending(s, e, "<spec-ring trial>", spec, feature, 0, x.nnx ? (int64_t)x.nnx : -1);
	return spec(s, e, feature, best) ? MOE_OK : MOE_ERR_INVALID;
}
