/* backend-tcp/compiler/rw/split_decode.c: rewrite `split-decode`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * A decode pass of the block loop's body (a tu.vec reading a 4-bit stream,
 * flags e2m1 or i4, or f8e4m3 values: recipe_quant.c's block pass over
 * [row blocks, rows, column blocks, columns]) writes the whole decoded
 * weight before any TRF load of it may start: the simulator orders a load
 * after every earlier command whose element range meets the load's
 * (docs/tcp-isa.md section 2), and the pass's range is the whole buffer.
 * The first load of the weight (gpt-oss MXFP4's gate_up: the first tile of
 * gate, rows 1, 3, ... 3071 of 5760) reads a prefix of its rows. The
 * rewrite cuts the pass at the first whole row block past that load's last
 * element: one pass for the prefix, one for the rest, back to back on the
 * main context; the load and every other reader lying inside the prefix
 * wait for the first pass alone, so the sub context starts the TRF loads
 * while the main context decodes the rest. Values are unchanged: the two
 * passes run the same steps on the same elements (the cut falls between
 * whole scale blocks, so each element reads the same scale), every reader
 * waits for the pass writing what it reads, and the second pass keeps every
 * dependency of the first (and follows it). */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"

/* The pass, its first reader and the cut. */
typedef struct sd {
	ts_id d;    /* the decode pass */
	int64_t n1; /* row blocks in the first part */
} sd;

/* whether op o is a decode pass (its s0 a quantized stream) */
static bool decodes(const tcp_sched *s, ts_id o)
{
	const tcp_insn *in = &s->op[o].in;
	if (in->op != TCP_OP_TU_VEC || in->v[TCP_V_S0].t < 0 || in->v[TCP_V_DST].t < 0)
		return false;
	return (in->flags & (TCP_F_E2M1 | TCP_F_I4)) || s->buf[in->v[TCP_V_S0].t].dtype == MOE_F8E4M3;
}

/* whether op o depends on op f at distance 0 */
static bool waits(const tcp_sched *s, ts_id o, ts_id f)
{
	for (uint32_t j = 0; j < s->op[o].ndep; j++)
		if (s->op[o].dep[j] == f && s->op[o].dist[j] == 0)
			return true;
	return false;
}

/* Whether decode pass d can be cut: four loops over a DM destination with
 * no register, every stride positive and one row block's elements inside
 * the outer stride (so a prefix of row blocks is a prefix of elements),
 * no valid count. */
static bool cuttable(const tcp_sched *s, ts_id d)
{
	const tcp_insn *in = &s->op[d].in;
	const tcp_view *v = &in->v[TCP_V_DST];
	if (!decodes(s, d) || in->ndim != 4 || in->vreg >= 0 || in->dim[0] < 2 || v->reg >= 0 ||
		s->buf[v->t].space != TCP_DM)
		return false;
	int64_t inner = 0;
	for (int k = 0; k < 4; k++) {
		if (v->stride[k] <= 0)
			return false;
		if (k)
			inner += (in->dim[k] - 1) * v->stride[k];
	}
	return inner < v->stride[0];
}

/* The cut of pass d: its readers at distance 0 in program order; the first
 * sub.ldtrf among them reads rows below the cut. 0: none. */
static int64_t cut_of(const tcp_sched *s, ts_id d, const uint32_t *pos)
{
	const tcp_insn *in = &s->op[d].in;
	const tcp_view *v = &in->v[TCP_V_DST];
	ts_id first = TS_NONE;
	for (ts_id o = 0; o < s->nop; o++) {
		const tcp_insn *x = &s->op[o].in;
		if (o == d || x->op != TCP_OP_SUB_TRF || x->v[TCP_V_S0].t != v->t || x->v[TCP_V_S0].reg >= 0 ||
			!waits(s, o, d))
			continue;
		if (first == TS_NONE || pos[o] < pos[first])
			first = o;
	}
	if (first == TS_NONE)
		return 0;
	int64_t lo, hi;
	ts_view_span(&s->op[first].in, &s->op[first].in.v[TCP_V_S0], &lo, &hi);
	if (lo < v->base)
		return 0;
	int64_t n1 = (hi - v->base + v->stride[0] - 1) / v->stride[0];
	return n1 >= 1 && n1 < in->dim[0] ? n1 : 0;
}

/* whether region rg is a SEQ region of the block loop's body */
static bool in_body(const tcp_sched *s, ts_id rg)
{
	return s->nloop >= 1 && s->rg[rg].kind == TS_RG_SEQ && ts_region_within(s, rg, s->loop[0].body);
}

enum { MAX_CUT = 16 };

static int find(const tcp_sched *s, sd *x, int cap)
{
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	int n = 0;
	for (ts_id rg = 0; rg < s->nrg && n < cap; rg++) {
		if (!in_body(s, rg))
			continue;
		/* the region's first decode pass: the later ones run while the
		 * sub context loads the first one's tiles */
		const ts_region *r = &s->rg[rg];
		ts_id f = TS_NONE;
		for (uint32_t k = 0; k < r->nitem && f == TS_NONE; k++)
			if (TS_ITEM_KIND(r->item[k]) == TS_ITEM_OP && decodes(s, TS_ITEM_ID(r->item[k])))
				f = TS_ITEM_ID(r->item[k]);
		int64_t n1 = f != TS_NONE && cuttable(s, f) ? cut_of(s, f, pos) : 0;
		if (n1 > 0)
			x[n++] = (sd){f, n1};
	}
	ctx_free(s->ctx, pos, 0);
	return n;
}

bool ts_rw_split_decode_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	sd x[MAX_CUT];
	return find(s, x, MAX_CUT) > 0;
}

/* Cuts pass x->d in two: d keeps the first n1 row blocks, the new pass
 * (just after it in its region) takes the rest. */
static void cut(tcp_sched *s, const sd *x, uint16_t feature)
{
	ts_id d = x->d, rg = s->op[d].region;
	tcp_insn in = s->op[d].in;
	int64_t n1 = x->n1, nb = in.dim[0];
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in.v[w].t >= 0)
			in.v[w].base += n1 * in.v[w].stride[0];
	in.dim[0] = nb - n1;
	ts_id d2 = ts_add_op(s, rg, &in, s->op[d].phase);
	/* ts_add_op appended d2 to rg: move it to just after d */
	ts_region *r = &s->rg[rg];
	r->nitem--;
	uint32_t at = 0;
	while (at < r->nitem && r->item[at] != (TS_ITEM_OP | d))
		at++;
	ts_region_insert(s, rg, at + 1, TS_ITEM_OP | d2);
	s->op[d].in.dim[0] = n1;
	s->op[d].feature = feature;
	s->op[d2].feature = feature;
	s->op[d2].node = s->op[d].node;
	for (uint32_t j = 0; j < s->op[d].ndep; j++)
		ts_add_dep(s, d2, s->op[d].dep[j], s->op[d].dist[j]);
	ts_add_dep(s, d2, d, 0);
	/* every op that waited for d waits for d2 too, but a reader of the
	 * destination whose s0 lies inside the first part */
	int32_t t = in.v[TCP_V_DST].t;
	int64_t end = s->op[d].in.v[TCP_V_DST].base + n1 * in.v[TCP_V_DST].stride[0];
	for (ts_id o = 0; o < s->nop; o++) {
		if (o == d || o == d2)
			continue;
		const ts_op *q = &s->op[o];
		int dist = -1;
		for (uint32_t j = 0; j < q->ndep; j++)
			if (q->dep[j] == d && (dist < 0 || q->dist[j] < dist))
				dist = q->dist[j];
		if (dist < 0)
			continue;
		const tcp_view *rv = &q->in.v[TCP_V_S0];
		bool inside = false;
		if (dist == 0 && rv->t == t && rv->reg < 0 && q->in.v[TCP_V_DST].t != t && q->in.v[TCP_V_S1].t != t &&
			q->in.v[TCP_V_S2].t != t) {
			int64_t lo, hi;
			ts_view_span(&q->in, rv, &lo, &hi);
			inside = hi <= end;
		}
		if (!inside)
			ts_add_dep(s, o, d2, dist);
	}
	/* the buffers whose span ended at d end at d2 */
	for (ts_id b = 0; b < s->nbuf; b++)
		if (s->buf[b].life == TS_LIFE_SPAN && s->buf[b].last == d)
			s->buf[b].last = d2;
}

moe_status ts_rw_split_decode_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	sd x[MAX_CUT];
	int n = find(s, x, MAX_CUT);
	for (int i = 0; i < n; i++)
		cut(s, &x[i], feature);
	return n ? MOE_OK : MOE_ERR_INVALID;
}
