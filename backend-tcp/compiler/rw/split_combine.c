/* backend-tcp/compiler/rw/split_combine.c: rewrite `split-combine`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After the loop the combine gathers the T K result rows of the pairs, in
 * pair order (row t K + k), from HBM into DM with one dma.gather, and then
 * K passes each read column k of that buffer (rows t K + k over every t)
 * into y's running sum. Every pass waits for the whole gather, so the main
 * context idles while it runs and the DMA context idles while the passes
 * run. The rewrite gathers the pairs in two commands, columns [0, K/2) into
 * the buffer (now [T, K/2, D]) then [K/2, K) into a buffer of their own
 * (dims [T, n, D]: group t, the index list's row t read from its column 0 or
 * K/2), each pass reads its column where it now lies and waits for the
 * command that brings it: the first half's passes run while the second half
 * arrives, for one more DMA setup. Each pass reads the same values: y is
 * unchanged.
 *
 * Applies to a dma.gather of [1, T K, D] after the loop into the whole of a
 * DM buffer (rows contiguous) by a contiguous list, whose every other
 * reader is an op each of whose views of it stays within one column k (its
 * base at row k of the first token, every stride a multiple of a token's K
 * rows or within one row), and that nothing else writes. A peephole row:
 * the prediction prices the scheduled program as it stands. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

typedef struct sc {
	ts_id ga, buf;
	int64_t T, K, D;
} sc;

/* The column k of view v over op in's dims (D elements a row, K rows a
 * token), or -1 when it reaches more than one. */
static int64_t column(const tcp_insn *in, const tcp_view *v, int64_t K, int64_t D)
{
	if (v->reg >= 0 || v->base < 0)
		return -1;
	int64_t in_row = v->base % D, tok = K * D;
	for (int m = 0; m < in->ndim; m++) {
		if (in->dim[m] <= 1 || v->stride[m] == 0 || v->stride[m] % tok == 0)
			continue;
		if (v->stride[m] < 0)
			return -1;
		in_row += v->stride[m] * (in->dim[m] - 1);
	}
	return in_row < D ? (v->base % tok) / D : -1;
}

static bool find(const tcp_sched *s, sc *x)
{
	memset(x, 0, sizeof *x);
	if (s->nloop != 1)
		return false;
	const ts_loop *l = &s->loop[0];
	int64_t lp = ts_item_index(s, s->top, s->top, TS_ITEM_RG | l->region), K = s->meta.K, T = s->meta.T;
	if (lp < 0 || K < 2 || T < 1)
		return false;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		const tcp_view *d = &in->v[TCP_V_DST], *y = &in->v[TCP_V_S0], *i = &in->v[TCP_V_S1];
		if (in->op != TCP_OP_DMA_GATHER || in->flags || in->vreg >= 0 || in->ndim != 3 || in->dim[0] != 1 ||
			in->dim[1] != T * K || s->op[o].region != s->top || ts_op_index(s, s->top, o) <= lp || d->t < 0 ||
			y->t < 0 || i->t < 0 || d->reg >= 0 || y->reg >= 0 || i->reg >= 0 || d->base || i->stride[1] != 1 ||
			d->stride[1] != in->dim[2] || d->stride[2] != 1)
			continue;
		int64_t D = in->dim[2];
		const ts_buf *b = &s->buf[d->t];
		if (b->space != TCP_DM || b->slots != 1 || ts_buf_numel(b) != T * K * D || ts_buf_spm_read(s, (ts_id)d->t))
			continue;
		bool ok = true;
		for (ts_id q = 0; q < s->nop && ok; q++) {
			if (q == o)
				continue;
			const tcp_insn *r = &s->op[q].in;
			ok = r->v[TCP_V_DST].t != d->t;
			for (int k = TCP_V_S0; k < TCP_NVIEW && ok; k++)
				ok = r->v[k].t != d->t || (r->op == TCP_OP_TU_VEC && column(r, &r->v[k], K, D) >= 0);
		}
		if (!ok)
			continue;
		x->ga = o, x->buf = (ts_id)d->t;
		x->T = T, x->K = K, x->D = D;
		return true;
	}
	return false;
}

bool ts_rw_split_combine_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sc x;
	return find(s, &x);
}

/* View v of column k of the pair-order buffer (K columns a token) moved to
 * a buffer t of n columns a token, its column k - off. */
static void to_half(tcp_insn *in, tcp_view *v, int32_t t, int64_t K, int64_t D, int64_t n, int64_t off)
{
	int64_t tok = K * D, t0 = v->base / tok, k = (v->base % tok) / D, r = v->base % D;
	v->t = t;
	v->base = t0 * n * D + (k - off) * D + r;
	for (int m = 0; m < in->ndim; m++)
		if (v->stride[m] && v->stride[m] % tok == 0)
			v->stride[m] = v->stride[m] / tok * n * D;
}

moe_status ts_rw_split_combine_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	sc x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	int64_t h = x.K / 2, h2 = x.K - h, ib = s->op[x.ga].in.v[TCP_V_S1].base;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)s->buf[x.buf].dtype), na = x.T * h * x.D, nb = x.T * h2 * x.D;
	/* columns [h, K) in a buffer of their own */
	ts_id hi = ts_add_buf(s, "gather.hi", TCP_DM, TCP_T_SCRATCH, (moe_dtype)s->buf[x.buf].dtype, 1, &nb);
	ts_buf *lo = &s->buf[x.buf], *hb = &s->buf[hi];
	hb->layout = ts_layout_spread(s, lo->layout, nb * es);
	hb->feature = feature;
	hb->node = lo->node;
	lo->rank = 1;
	memset(lo->shape, 0, sizeof lo->shape);
	lo->shape[0] = na;
	lo->layout = ts_layout_spread(s, lo->layout, na * es);
	tcp_insn *a = &s->op[x.ga].in;
	a->dim[0] = x.T;
	a->dim[1] = h;
	a->v[TCP_V_DST].stride[0] = h * x.D;
	a->v[TCP_V_S0].stride[0] = 0;
	a->v[TCP_V_S1].stride[0] = x.K;
	s->op[x.ga].feature = feature;
	s->op[x.ga].cost = 0;
	tcp_insn bi = *a;
	bi.dim[1] = h2;
	bi.v[TCP_V_DST].t = (int32_t)hi;
	bi.v[TCP_V_DST].stride[0] = h2 * x.D;
	bi.v[TCP_V_S1].base = ib + h;
	ts_id b = ts_add_op(s, TS_NONE, &bi, s->op[x.ga].phase);
	ts_op *bo = &s->op[b];
	bo->region = s->top;
	bo->feature = feature;
	bo->node = s->op[x.ga].node;
	for (uint32_t j = 0; j < s->op[x.ga].ndep; j++)
		ts_add_dep(s, b, s->op[x.ga].dep[j], s->op[x.ga].dist[j]);
	ts_region_insert(s, s->top, (uint32_t)ts_op_index(s, s->top, x.ga) + 1, TS_ITEM_OP | b);
	/* each reader reads its column in its half; the second half's wait for
	 * the second command */
	for (ts_id q = 0; q < s->nop; q++) {
		if (q == x.ga || q == b || !ts_op_reads(&s->op[q], (int32_t)x.buf))
			continue;
		tcp_insn *r = &s->op[q].in;
		bool first = false, second = false;
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++) {
			if (r->v[k].t != (int32_t)x.buf)
				continue;
			int64_t c = column(r, &r->v[k], x.K, x.D);
			first |= c < h;
			second |= c >= h;
			if (c < h)
				to_half(r, &r->v[k], (int32_t)x.buf, x.K, x.D, h, 0);
			else
				to_half(r, &r->v[k], (int32_t)hi, x.K, x.D, h2, h);
		}
		s->op[q].cost = 0;
		if (!second)
			continue;
		ts_op *p = &s->op[q];
		for (uint32_t j = 0; j < p->ndep && !first; j++)
			if (p->dep[j] == x.ga && !p->dist[j])
				p->dep[j] = b;
		if (first)
			ts_add_dep_once(s, q, b, 0);
	}
	/* spans: the second half's from its command to the first half's end; a
	 * span ending at the gather ends at the second command */
	hb = &s->buf[hi];
	hb->life = TS_LIFE_SPAN;
	hb->first = b;
	hb->last = s->buf[x.buf].life == TS_LIFE_SPAN ? s->buf[x.buf].last : b;
	for (ts_id t = 0; t < s->nbuf; t++)
		if (s->buf[t].life == TS_LIFE_SPAN && s->buf[t].last == x.ga)
			s->buf[t].last = b;
	return MOE_OK;
}
