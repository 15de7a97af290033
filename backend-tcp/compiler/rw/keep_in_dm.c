/* backend-tcp/compiler/rw/keep_in_dm.c: rewrite `keep-in-dm`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * The DM planner chooses each spillable value's residence when sched-build
 * first builds the layer (5.3, "Spillable buffers"): a value kept in HBM is
 * copied from its DM buffer P into an HBM buffer H right after its producer
 * and copied back into a DM buffer Q before its first reader. A rewrite
 * run after that choice can leave the value's neighbours elsewhere
 * (shared-first moves a shared expert, whose buffers made DeepSeek-V3's
 * routed y spill, before the block loop), so the round trip may no longer
 * be needed. The rewrite drops it where the prediction gains, which
 * includes the placement fitting: Q's readers read P, P lives up to its
 * last reader, and the two copies go.
 *
 * Taken are: outside any loop, a dma.copy A of the whole of a DM buffer P
 * into the whole of an HBM scratch buffer H, a dma.copy B of the whole of H
 * into the whole of a DM buffer Q of P's type and layout, A writing H alone
 * and B alone reading it, B alone writing Q, every op writing P standing
 * before A and waited for by it (through distance-0 dependencies); no ld
 * reads P, H or Q. Values are
 * unchanged: element i of Q is element i of P, which no op writes after A.
 * Each op that waited for A or B waits for what A waited for (P's writers)
 * instead; Q, read by nothing now, holds one element at its first former
 * reader. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct kd {
	ts_id a, b;    /* the copies out and back */
	ts_id p, h, q; /* the buffers */
} kd;

static bool whole(const tcp_sched *s, const tcp_insn *in, const tcp_view *v)
{
	return v->t >= 0 && v->reg < 0 && v->base == 0 && ts_view_contiguous(v, in->ndim, in->dim) &&
	       ts_insn_numel(in) == ts_buf_numel(&s->buf[v->t]);
}

static bool copy_of(const tcp_sched *s, ts_id o, int dspace, int sspace)
{
	const tcp_insn *in = &s->op[o].in;
	return in->op == TCP_OP_DMA_COPY && in->vreg < 0 && !(in->flags & TCP_F_JOIN) && s->op[o].region == s->top &&
	       whole(s, in, &in->v[TCP_V_DST]) && whole(s, in, &in->v[TCP_V_S0]) &&
	       s->buf[in->v[TCP_V_DST].t].space == dspace && s->buf[in->v[TCP_V_S0].t].space == sspace;
}

static bool same_layout(const ts_buf *x, const ts_buf *y)
{
	return x->dtype == y->dtype && x->slots == 1 && y->slots == 1 && x->layout.slice0 == y->layout.slice0 &&
	       x->layout.nslices == y->layout.nslices && x->layout.copies == y->layout.copies &&
	       x->layout.split == y->layout.split && x->layout.slice_bytes == y->layout.slice_bytes;
}

static bool legal(const tcp_sched *s, kd *x, const uint32_t *pos)
{
	if (x->p == x->q || s->buf[x->h].kind != TCP_T_SCRATCH || !same_layout(&s->buf[x->p], &s->buf[x->q]) ||
		ts_buf_spm_read(s, x->p) || ts_buf_spm_read(s, x->h) || ts_buf_spm_read(s, x->q) || pos[x->a] >= pos[x->b])
		return false;
	/* waits[o]: A waits for o through distance-0 dependencies */
	uint8_t *waits = ctx_alloc(s->ctx, s->nop + 1);
	ts_id *stack = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *stack);
	uint32_t n = 0;
	stack[n++] = x->a;
	while (n) {
		const ts_op *p = &s->op[stack[--n]];
		for (uint32_t k = 0; k < p->ndep; k++)
			if (!p->dist[k] && !waits[p->dep[k]]) {
				waits[p->dep[k]] = 1;
				stack[n++] = p->dep[k];
			}
	}
	bool read = false, ok = true;
	for (ts_id o = 0; o < s->nop && ok; o++) {
		const ts_op *p = &s->op[o];
		read |= o != x->b && ts_op_reads(p, (int32_t)x->q);
		if ((o != x->a && ts_op_writes(p, (int32_t)x->h)) || (o != x->b && ts_op_reads(p, (int32_t)x->h)) ||
			(o != x->b && ts_op_writes(p, (int32_t)x->q)))
			ok = false;
		if (ts_op_writes(p, (int32_t)x->p) && (pos[o] >= pos[x->a] || !waits[o]))
			ok = false;
	}
	ctx_free(s->ctx, stack, 0);
	ctx_free(s->ctx, waits, 0);
	return ok && read;
}

static bool find(const tcp_sched *s, kd *x)
{
	uint32_t *pos = NULL;
	bool ok = false;
	for (ts_id a = 0; a < s->nop && !ok; a++) {
		if (!copy_of(s, a, TCP_HBM, TCP_DM))
			continue;
		ts_id h = (ts_id)s->op[a].in.v[TCP_V_DST].t;
		for (ts_id b = 0; b < s->nop && !ok; b++) {
			if (b == a || !copy_of(s, b, TCP_DM, TCP_HBM) || (ts_id)s->op[b].in.v[TCP_V_S0].t != h)
				continue;
			*x = (kd){a, b, (ts_id)s->op[a].in.v[TCP_V_S0].t, h, (ts_id)s->op[b].in.v[TCP_V_DST].t};
			if (!pos) {
				pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
				ts_op_positions(s, pos);
			}
			ok = legal(s, x, pos);
		}
	}
	if (pos)
		ctx_free(s->ctx, pos, 0);
	return ok;
}

static void fuse(tcp_sched *s, const kd *x, uint16_t feature)
{
	(void)feature;
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	ts_id first = TS_NONE, last = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		ts_op *p = &s->op[o];
		if (o == x->a || o == x->b)
			continue;
		if (ts_op_reads(p, (int32_t)x->q)) {
			for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
				if (p->in.v[w].t == (int32_t)x->q)
					p->in.v[w].t = (int32_t)x->p;
			first = first == TS_NONE || pos[o] < pos[first] ? o : first;
			last = last == TS_NONE || pos[o] > pos[last] ? o : last;
		}
		/* what waited for a copy waits for what the copy out waited for */
		bool waits = false;
		for (int dist = 0; dist < 2; dist++)
			waits |= ts_op_has_dep(p, x->a, dist) || ts_op_has_dep(p, x->b, dist);
		if (waits)
			for (uint32_t k = 0; k < s->op[x->a].ndep; k++)
				if (s->op[x->a].dep[k] != o)
					ts_add_dep_once(s, o, s->op[x->a].dep[k], s->op[x->a].dist[k]);
	}
	ts_buf *P = &s->buf[x->p], *Q = &s->buf[x->q];
	if (P->life == TS_LIFE_SPAN && last != TS_NONE && (P->last == TS_NONE || pos[P->last] < pos[last]))
		P->last = last;
	ts_id at = first; /* Q has a reader (legal) */
	Q->rank = 1;
	Q->shape[0] = 1;
	Q->layout.slice_bytes = s->m ? s->m->flit_bytes : 32;
	Q->life = TS_LIFE_SPAN;
	Q->first = Q->last = at;
	uint8_t *drop = ctx_alloc(s->ctx, s->nop + 1);
	drop[x->a] = drop[x->b] = 1;
	ts_drop_ops_to(s, drop, at, pos);
	ctx_free(s->ctx, drop, 0);
	ctx_free(s->ctx, pos, 0);
}

TS_RW_EACH_SITE(keep_in_dm, kd, fuse)
