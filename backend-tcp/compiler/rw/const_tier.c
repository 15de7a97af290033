/* backend-tcp/compiler/rw/const_tier.c: rewrite `const-tier` (rewrites.def,
 * docs/tcp-compiler.md 5.2).
 *
 * Before the block loop, the ops computed from constants alone (the decode
 * grid's token list and byte offsets, top-k's iotas and index compare) and the
 * DMA commands that read only those and the layer's HBM inputs (the dispatch's
 * gather of x's rows by a constant list, its scatter into the grid, the grid's
 * staged copy) do not depend on the router. sched-build emits them in node
 * order, after routing, so on the in-order DMA context they sit between the
 * staging of the experts and the loop's first weight fetch. The rewrite
 * issues them right after the region's leading dependency-free ops (the copies
 * of x and the router weights): the main context runs the constant passes
 * while those copies are in flight, and the dispatch's DMA commands run while
 * the DMA context would wait for routing.
 *
 * The tier T of the top region's items before its first child region: an op
 * that reads no scalar, whose every dependency is in T, that writes no buffer
 * a scalar `ld` reads, and that reads only buffers whose every writer is in T
 * (at least one writer) or constants; a DMA command (not `dma.spm`) may also
 * read an HBM buffer that no op writes (an input, a weight) when it reads a
 * buffer of T too. New order: the leading scalars and ops without
 * dependencies, T, the rest, each in its order. Every hazard is an explicit dependency (5.1), so
 * an op of T has none on a later-moved op: the new order keeps every
 * dependency. Spans are renewed to the new positions. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct tier {
	const tcp_sched *s;
	bool *in;        /* per op: in T */
	uint32_t *nwr;   /* per buffer: ops writing it */
	bool *wr_out;    /* per buffer: written by an op not in T (so far: any op) */
	uint32_t lead;   /* the top region's leading scalars and dependency-free ops */
	uint32_t end;    /* the top region's first child region (or nitem) */
} tier;

static bool is_dma(int op)
{
	return op == TCP_OP_DMA_COPY || op == TCP_OP_DMA_GATHER || op == TCP_OP_DMA_SCATTER;
}

static bool reads_view(int w)
{
	return w != TCP_V_DST;
}

/* whether op o of the top region may join T (its dependencies judged by c->in) */
static bool joins(const tier *c, ts_id o)
{
	const tcp_sched *s = c->s;
	const ts_op *op = &s->op[o];
	const tcp_insn *in = &op->in;
	if (in->vreg >= 0 || in->op == TCP_OP_DMA_SPM || op->ctx >= TCP_NCTX)
		return false;
	for (uint32_t d = 0; d < op->ndep; d++)
		if (op->dist[d] != 0 || !c->in[op->dep[d]])
			return false;
	bool tier_src = false, input_src = false;
	for (int w = 0; w < TCP_NVIEW; w++) {
		const tcp_view *v = &in->v[w];
		if (v->t < 0)
			continue;
		if (v->reg >= 0)
			return false;
		const ts_buf *b = &s->buf[v->t];
		for (ts_id k = 0; k < s->nsc; k++)
			if (s->sc[k].kind == TS_SC_SPM_LD && s->sc[k].buf == (ts_id)v->t)
				return false;
		if (!reads_view(w)) {
			if (b->kind == TCP_T_OUTPUT)
				return false;
			continue;
		}
		if (b->kind == TCP_T_CONST)
			continue;
		if (c->nwr[v->t] == 0) {
			if (!is_dma(in->op) || b->space != TCP_HBM)
				return false;
			input_src = true;
		} else if (c->wr_out[v->t])
			return false;
		else
			tier_src = true;
	}
	return !input_src || tier_src;
}

/* per buffer: writers counted; wr_out: some writer outside ops[from, end) of the top
 * region that is not in T */
static void count_writers(tier *c)
{
	const tcp_sched *s = c->s;
	memset(c->nwr, 0, s->nbuf * sizeof *c->nwr);
	memset(c->wr_out, 0, s->nbuf);
	for (ts_id o = 0; o < s->nop; o++) {
		int32_t t = s->op[o].in.v[TCP_V_DST].t;
		if (t < 0)
			continue;
		c->nwr[t]++;
		if (!c->in[o])
			c->wr_out[t] = true;
	}
}

/* T as a fixed point: ops join in region order (a dependency precedes its
 * user); a buffer counts as T's while no writer outside T is known, so the
 * walk repeats until nothing leaves. */
static uint32_t find_tier(tier *c)
{
	const tcp_sched *s = c->s;
	const ts_region *top = &s->rg[s->top];
	for (uint32_t k = c->lead; k < c->end; k++)
		if (TS_ITEM_KIND(top->item[k]) == TS_ITEM_OP)
			c->in[TS_ITEM_ID(top->item[k])] = true;
	for (int round = 0; round < 64; round++) {
		count_writers(c);
		bool changed = false;
		for (uint32_t k = c->lead; k < c->end; k++) {
			uint32_t it = top->item[k];
			if (TS_ITEM_KIND(it) != TS_ITEM_OP || !c->in[TS_ITEM_ID(it)])
				continue;
			if (!joins(c, TS_ITEM_ID(it))) {
				c->in[TS_ITEM_ID(it)] = false;
				changed = true;
			}
		}
		if (!changed)
			break;
	}
	uint32_t n = 0;
	for (uint32_t k = c->lead; k < c->end; k++)
		n += TS_ITEM_KIND(top->item[k]) == TS_ITEM_OP && c->in[TS_ITEM_ID(top->item[k])];
	return n;
}

/* The tier of s; 0 ops when there is nothing to move (T empty, or T already
 * right after the leading ops). c->in is allocated by the caller. */
static uint32_t plan(tier *c)
{
	const tcp_sched *s = c->s;
	const ts_region *top = &s->rg[s->top];
	c->end = top->nitem;
	for (uint32_t k = 0; k < top->nitem; k++)
		if (TS_ITEM_KIND(top->item[k]) == TS_ITEM_RG) {
			c->end = k;
			break;
		}
	c->lead = 0;
	while (c->lead < c->end && (TS_ITEM_KIND(top->item[c->lead]) == TS_ITEM_SC ||
		(TS_ITEM_KIND(top->item[c->lead]) == TS_ITEM_OP && s->op[TS_ITEM_ID(top->item[c->lead])].ndep == 0)))
		c->lead++;
	memset(c->in, 0, s->nop + 1);
	uint32_t n = find_tier(c);
	/* nothing moves when T is already the run right after the leading ops */
	uint32_t k = c->lead, m = 0;
	while (k < c->end && TS_ITEM_KIND(top->item[k]) == TS_ITEM_OP && c->in[TS_ITEM_ID(top->item[k])])
		k++, m++;
	return m == n ? 0 : n;
}

static uint32_t with_tier(const tcp_sched *s, moe_ctx *ctx, tier *c)
{
	c->s = s;
	c->in = ctx_alloc(ctx, s->nop + 1);
	c->nwr = ctx_alloc(ctx, (s->nbuf + 1) * sizeof *c->nwr);
	c->wr_out = ctx_alloc(ctx, s->nbuf + 1);
	return plan(c);
}

static void tier_free(moe_ctx *ctx, tier *c)
{
	ctx_free(ctx, c->in, 0);
	ctx_free(ctx, c->nwr, 0);
	ctx_free(ctx, c->wr_out, 0);
}

bool ts_rw_const_tier_applies(const tcp_sched *s, const ts_env *e)
{
	if (s->nloop < 1 || s->nop == 0)
		return false;
	tier c;
	uint32_t n = with_tier(s, e->ctx, &c);
	tier_free(e->ctx, &c);
	return n > 0;
}

moe_status ts_rw_const_tier_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)feature; /* the rewrite adds nothing: it moves build ops */
	tier c;
	uint32_t n = with_tier(s, e->ctx, &c);
	if (n > 0) {
		ts_region *top = &s->rg[s->top];
		uint32_t len = c.end - c.lead, a = 0, b = n;
		uint32_t *moved = ctx_alloc(e->ctx, (len + 1) * sizeof *moved);
		uint32_t *old = ctx_alloc(e->ctx, (s->nop + 1) * sizeof *old);
		ts_op_positions(s, old);
		for (uint32_t k = c.lead; k < c.end; k++) {
			uint32_t it = top->item[k];
			bool t = TS_ITEM_KIND(it) == TS_ITEM_OP && c.in[TS_ITEM_ID(it)];
			moved[t ? a++ : b++] = it;
		}
		memcpy(&top->item[c.lead], moved, len * sizeof *moved);
		ctx_free(e->ctx, moved, 0);
		ts_renew_spans(s, e->ctx, old);
		ctx_free(e->ctx, old, 0);
	}
	tier_free(e->ctx, &c);
	return MOE_OK;
}
