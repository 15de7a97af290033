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
 * K/2), or, where its trial is faster and K >= 4, in four commands of K/4
 * columns each (rounded); each pass reads its column where it now lies and
 * waits for the command that brings it: the earlier parts' passes run while
 * the later parts arrive, for one more DMA setup a part. Each pass reads the
 * same values: y is unchanged.
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
static void to_part(tcp_insn *in, tcp_view *v, int32_t t, int64_t K, int64_t D, int64_t n, int64_t off)
{
	int64_t tok = K * D, t0 = v->base / tok, k = (v->base % tok) / D, r = v->base % D;
	v->t = t;
	v->base = t0 * n * D + (k - off) * D + r;
	for (int m = 0; m < in->ndim; m++)
		if (v->stride[m] && v->stride[m] % tok == 0)
			v->stride[m] = v->stride[m] / tok * n * D;
}

enum { SC_MAX_PARTS = 8 };

/* The gather in `parts` commands, part j the columns [c_j, c_{j+1}),
 * c_j = j K / parts; part 0 in the gather's buffer, each other in one of
 * its own. */
static bool split(tcp_sched *s, const ts_env *e, uint16_t feature, int64_t nparts)
{
	(void)e;
	uint32_t parts = (uint32_t)nparts;
	sc x;
	if (!find(s, &x) || parts < 2 || parts > SC_MAX_PARTS || (int64_t)parts > x.K)
		return false;
	int64_t c[SC_MAX_PARTS + 1], ib = s->op[x.ga].in.v[TCP_V_S1].base;
	for (uint32_t j = 0; j <= parts; j++)
		c[j] = (int64_t)j * x.K / parts;
	int64_t es = (int64_t)moe_dtype_size((moe_dtype)s->buf[x.buf].dtype);
	ts_id buf[SC_MAX_PARTS], ga[SC_MAX_PARTS];
	buf[0] = x.buf;
	ga[0] = x.ga;
	const tcp_insn whole = s->op[x.ga].in;
	uint32_t at = (uint32_t)ts_op_index(s, s->top, x.ga) + 1;
	for (uint32_t j = 0; j < parts; j++) {
		int64_t w = c[j + 1] - c[j], n = x.T * w * x.D;
		if (j) {
			buf[j] = ts_add_buf(s, "gather.hi", TCP_DM, TCP_T_SCRATCH, (moe_dtype)s->buf[x.buf].dtype, 1, &n);
			ts_buf *lo = &s->buf[x.buf], *hb = &s->buf[buf[j]];
			hb->layout = ts_layout_spread(s, lo->layout, n * es);
			hb->feature = feature;
			hb->node = lo->node;
		}
		tcp_insn in = whole;
		in.dim[0] = x.T;
		in.dim[1] = w;
		in.v[TCP_V_DST].t = (int32_t)buf[j];
		in.v[TCP_V_DST].stride[0] = w * x.D;
		in.v[TCP_V_S0].stride[0] = 0;
		in.v[TCP_V_S1].stride[0] = x.K;
		in.v[TCP_V_S1].base = ib + c[j];
		if (!j) {
			s->op[x.ga].in = in;
			s->op[x.ga].feature = feature;
			s->op[x.ga].cost = 0;
			continue;
		}
		ts_id b = ts_add_op(s, TS_NONE, &in, s->op[x.ga].phase);
		ts_op *bo = &s->op[b];
		bo->region = s->top;
		bo->feature = feature;
		bo->node = s->op[x.ga].node;
		for (uint32_t d = 0; d < s->op[x.ga].ndep; d++)
			ts_add_dep(s, b, s->op[x.ga].dep[d], s->op[x.ga].dist[d]);
		ts_region_insert(s, s->top, at++, TS_ITEM_OP | b);
		ga[j] = b;
	}
	ts_buf *lo = &s->buf[x.buf];
	int64_t n0 = x.T * c[1] * x.D;
	lo->rank = 1;
	memset(lo->shape, 0, sizeof lo->shape);
	lo->shape[0] = n0;
	lo->layout = ts_layout_spread(s, lo->layout, n0 * es);
	/* each reader reads its columns in their parts and waits for the
	 * commands that bring them */
	for (ts_id q = 0; q < s->nop; q++) {
		bool gather = false;
		for (uint32_t j = 0; j < parts; j++)
			gather |= q == ga[j];
		if (gather || !ts_op_reads(&s->op[q], (int32_t)x.buf))
			continue;
		tcp_insn *r = &s->op[q].in;
		bool reads[SC_MAX_PARTS] = {false};
		for (int k = TCP_V_S0; k < TCP_NVIEW; k++) {
			if (r->v[k].t != (int32_t)x.buf)
				continue;
			int64_t col = column(r, &r->v[k], x.K, x.D);
			uint32_t j = 0;
			while (j + 1 < parts && col >= c[j + 1])
				j++;
			reads[j] = true;
			to_part(r, &r->v[k], (int32_t)buf[j], x.K, x.D, c[j + 1] - c[j], c[j]);
		}
		s->op[q].cost = 0;
		/* the entry on the gather stands for the first part read */
		uint32_t first = 0;
		while (first < parts && !reads[first])
			first++;
		ts_op *p = &s->op[q];
		for (uint32_t d = 0; d < p->ndep && first < parts; d++)
			if (p->dep[d] == x.ga && !p->dist[d])
				p->dep[d] = ga[first];
		for (uint32_t j = first + 1; j < parts; j++)
			if (reads[j])
				ts_add_dep_once(s, q, ga[j], 0);
	}
	/* spans: each part's buffer from its command to the first part's end;
	 * a span ending at the gather ends at the last command */
	for (uint32_t j = 1; j < parts; j++) {
		ts_buf *hb = &s->buf[buf[j]];
		hb->life = TS_LIFE_SPAN;
		hb->first = ga[j];
		hb->last = s->buf[x.buf].life == TS_LIFE_SPAN ? s->buf[x.buf].last : ga[j];
	}
	for (ts_id t = 0; t < s->nbuf; t++)
		if (s->buf[t].life == TS_LIFE_SPAN && s->buf[t].last == x.ga)
			s->buf[t].last = ga[parts - 1];
	return true;
}

/* The parts: two, then four (where K has four columns or more), each in a
 * trial copy, placed and predicted; the fastest taken (ties: fewer). */
moe_status ts_rw_split_combine_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	sc x;
	if (!find(s, &x))
		return MOE_ERR_INVALID;
	uint32_t best = 2;
	if (x.K >= 4) {
		int64_t cy[2];
		for (uint32_t k = 0; k < 2; k++)
			cy[k] = ts_price_param(s, e, "<split-combine trial>", split, feature, 2 << k);
		if (cy[1] >= 0 && (cy[0] < 0 || cy[1] < cy[0]))
			best = 4;
	}
	return split(s, e, feature, best) ? MOE_OK : MOE_ERR_INVALID;
}
