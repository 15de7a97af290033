/* backend-tcp/compiler/rw/split_last_pass.c: rewrite `split-last-pass`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * After the loop the layer's value (y) is written in DM by one vector pass
 * (the combine's last) and copied into HBM by one dma.copy that waits for
 * the whole pass: the DMA context idles while the pass runs, then the main
 * context idles while the copy runs, and both stand at the end of the run.
 * The rewrite cuts the pass into n pieces of whole rows and the copy into n
 * copies of the same rows, copy i waiting for piece i (and for what the
 * copy waited for but the pass): the copy of one piece runs while the next
 * computes, for n - 1 more DMA setups. n is taken by trials (2, 4, 8:
 * each copy placed and predicted, the fastest kept).
 *
 * Applies to a dma.copy outside the loop of the whole of a one-slot DM
 * buffer spread over the slices by flits in one copy (rows of n elements,
 * contiguous) into the same rows of an HBM buffer, where the DM buffer has one writer besides and no other reader:
 * a tu.vec over [N, n] writing it row-major from element 0, in the copy's
 * region and before it, that reads no scalar (no register view, no valid
 * count), no iteration counter and reduces nothing (each output row reads
 * only its own row of every view), moves nothing across slices and decodes
 * nothing. Pieces start at multiples of q rows, q the fewest rows that fill
 * whole rounds of the buffer's layout (slices x flit) and whole 256-byte HBM
 * granules, so every piece's operands lie on the slices they did and no
 * copy writes part of a granule. Each piece computes its rows exactly as
 * the pass did: y is the same bit for bit. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

enum { SP_MAX = 8 };

typedef struct slp {
	ts_id w, c;   /* the pass, the copy */
	int64_t N, n; /* rows, elements a row */
	int64_t q;    /* pieces start at multiples of q rows */
} slp;

/* the fewest rows of n elements of es bytes filling k units of `unit` bytes */
static int64_t rows_for(int64_t n, int64_t es, int64_t unit)
{
	int64_t b = n * es;
	return unit / tcp_gcd(b, unit);
}

static bool row_major(const tcp_insn *in, const tcp_view *v, int64_t N, int64_t n)
{
	return v->t >= 0 && v->reg < 0 && v->base == 0 && in->ndim == 2 && in->dim[0] == N && in->dim[1] == n &&
	       v->stride[0] == n && v->stride[1] == 1;
}

/* whether each output row of pass in reads only its own row of every view */
static bool rowwise(const tcp_insn *in)
{
	if (in->op != TCP_OP_TU_VEC || in->ndim != 2 || in->vreg >= 0 ||
		(in->flags & (TCP_F_XSLICE | TCP_F_E2M1 | TCP_F_I4 | TCP_F_VROWS)))
		return false;
	for (int k = 0; k < in->nstep; k++) {
		const tcp_step *st = &in->step[k];
		if (st->x == TCP_SRC_CTR || st->y == TCP_SRC_CTR || tcp_vop_stage[st->op] == TCP_ST_REDUCE)
			return false;
	}
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && in->v[w].reg >= 0)
			return false;
	return true;
}

static bool find(const tcp_sched *s, slp *x)
{
	uint32_t *pos = NULL;
	for (ts_id c = 0; c < s->nop; c++) {
		const tcp_insn *in = &s->op[c].in;
		const tcp_view *d = &in->v[TCP_V_DST], *a = &in->v[TCP_V_S0];
		if (in->op != TCP_OP_DMA_COPY || in->ndim != 2 || in->vreg >= 0 || in->dim[0] < 2 ||
			(s->nloop && ts_op_in_loop(s, c)))
			continue;
		int64_t N = in->dim[0], n = in->dim[1];
		if (!row_major(in, d, N, n) || !row_major(in, a, N, n))
			continue;
		const ts_buf *db = &s->buf[d->t], *ab = &s->buf[a->t];
		if (db->space != TCP_HBM || ab->space != TCP_DM || ab->slots != 1 || ts_buf_numel(ab) != N * n ||
			ab->layout.split != TS_SPLIT_FLIT || ab->layout.copies != 1 || ab->layout.nslices < 1 ||
			s->m->hbm_granule < 1)
			continue;
		uint32_t nw, nr;
		ts_id w, r;
		ts_buf_uses(s, (ts_id)a->t, &nw, &nr, &w, &r);
		if (nw != 1 || nr != 1 || r != c || w == c || s->op[w].region != s->op[c].region ||
			!rowwise(&s->op[w].in) || !row_major(&s->op[w].in, &s->op[w].in.v[TCP_V_DST], N, n))
			continue;
		if (!pos) {
			pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
			ts_op_positions(s, pos);
		}
		if (pos[w] >= pos[c])
			continue;
		int64_t es = (int64_t)moe_dtype_size((moe_dtype)ab->dtype);
		int64_t round = (int64_t)ab->layout.nslices * s->m->flit_bytes, q1 = rows_for(n, es, round);
		int64_t q2 = rows_for(n, (int64_t)moe_dtype_size((moe_dtype)db->dtype), s->m->hbm_granule);
		int64_t q = q1 / tcp_gcd(q1, q2) * q2;
		if (q < 1 || N < 2 * q)
			continue;
		*x = (slp){w, c, N, n, q};
		ctx_free(s->ctx, pos, 0);
		return true;
	}
	if (pos)
		ctx_free(s->ctx, pos, 0);
	return false;
}

bool ts_rw_split_last_pass_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	slp x;
	return s->m && find(s, &x);
}

/* the item index of op o in its region */
static uint32_t item_at(const tcp_sched *s, ts_id o)
{
	return (uint32_t)ts_op_index(s, s->op[o].region, o);
}

/* op o cut to rows [r0, r0 + nr) of its [N, n] iteration */
static tcp_insn rows_of(const tcp_insn *in, int64_t r0, int64_t nr)
{
	tcp_insn c = *in;
	c.dim[0] = nr;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (c.v[w].t >= 0)
			c.v[w].base += r0 * c.v[w].stride[0];
	return c;
}

/* o cut into n pieces of rows (bounds b): new ops for pieces 0..n-2
 * standing before o (each with o's dependencies but `skip`), o itself the
 * last; each op that waited for o waits for every piece (the caller narrows
 * the copies' to their own piece) */
static void cut(tcp_sched *s, ts_id o, const int64_t *b, uint32_t n, ts_id skip, ts_id *piece, uint16_t feature)
{
	ts_id nold = s->nop;
	uint32_t at = item_at(s, o);
	tcp_insn whole = s->op[o].in;
	for (uint32_t i = 0; i < n; i++) {
		int64_t r0 = i ? b[i - 1] : 0;
		tcp_insn in = rows_of(&whole, r0, b[i] - r0);
		if (i + 1 == n) {
			piece[i] = o;
			s->op[o].in = in;
			s->op[o].feature = feature;
			s->op[o].cost = 0;
			break;
		}
		piece[i] = ts_op_sibling(s, o, &in, at++, skip, feature);
	}
	for (ts_id q = 0; q < nold; q++) {
		if (q == o)
			continue;
		for (uint32_t j = 0; j < s->op[q].ndep; j++)
			if (s->op[q].dep[j] == o) {
				uint8_t dist = s->op[q].dist[j];
				for (uint32_t i = 0; i + 1 < n; i++)
					ts_add_dep(s, q, piece[i], dist);
				break;
			}
	}
	for (ts_id k = 0; k < s->nbuf; k++)
		if (s->buf[k].life == TS_LIFE_SPAN && s->buf[k].first == o)
			s->buf[k].first = piece[0];
}

static bool split(tcp_sched *s, const ts_env *e, uint16_t feature, int64_t nparts)
{
	(void)e;
	uint32_t parts = (uint32_t)nparts;
	slp x;
	if (!find(s, &x) || parts < 2 || parts > SP_MAX)
		return false;
	int64_t units = x.N / x.q, b[SP_MAX];
	if (units < (int64_t)parts)
		return false;
	for (uint32_t i = 0; i < parts; i++) /* even in units of q rows; the last takes the rest */
		b[i] = i + 1 == parts ? x.N : units * (int64_t)(i + 1) / (int64_t)parts * x.q;
	ts_id wp[SP_MAX], cp[SP_MAX];
	cut(s, x.w, b, parts, TS_NONE, wp, feature);
	/* the copies: each waits for its own piece, not the others */
	cut(s, x.c, b, parts, x.w, cp, feature);
	for (uint32_t i = 0; i < parts; i++) {
		ts_op *c = &s->op[cp[i]];
		uint32_t k = 0;
		for (uint32_t j = 0; j < c->ndep; j++) {
			bool pass = false;
			for (uint32_t m = 0; m < parts; m++)
				pass |= c->dep[j] == wp[m];
			if (!pass) {
				c->dep[k] = c->dep[j];
				c->dist[k++] = c->dist[j];
			}
		}
		c->ndep = k;
		ts_add_dep(s, cp[i], wp[i], 0);
	}
	return true;
}

moe_status ts_rw_split_last_pass_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	static const uint32_t tries[] = {2, 4, 8};
	uint32_t best = 0;
	int64_t least = -1;
	for (size_t k = 0; k < sizeof tries / sizeof *tries; k++) {
		int64_t c = ts_price_param(s, e, "<split-last-pass trial>", split, feature, tries[k]);
		if (c >= 0 && (least < 0 || c < least)) {
			least = c;
			best = tries[k];
		}
	}
	if (!best)
		return MOE_ERR_UNSUPPORTED; /* no trial placed and verified: declined */
	return split(s, e, feature, best) ? MOE_OK : MOE_ERR_INVALID;
}
