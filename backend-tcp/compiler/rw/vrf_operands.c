/* backend-tcp/compiler/rw/vrf_operands.c: rewrite `vrf-operands`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * A vector pass fetches at most fetch.max_interleaved_streams (2) DM
 * streams in one pass through DM; a third is a second pass, its command
 * issue and fill/drain paid again (docs/tcp-isa.md 10, A11). VRF operands
 * are not DM streams, and each slice reads its own VRF (no switch). The
 * rewrite gives such a pass's small operand a copy in VRF: a VRF buffer
 * replicated on every slice (one copy per slice), loaded by one sub.ldvrf
 * (flags=xslice: the bytes a slice does not hold cross the sub context's
 * switch channel) just before the pass (before the loop where the pass
 * stands in it), waiting for the operand's only writer, and the pass
 * reads the copy through the same views. Values are unchanged: the copy
 * holds the operand's bytes at the same element offsets.
 *
 * A site: a tu.vec reading at least three DM streams, one of them a view
 * of a DM buffer of one slot, of at most a quarter of a slice's VRF, that
 * the pass does not write, that no ld reads, whose one writer stands
 * before the block loop (in the top region) ahead of the pass. The pass
 * then waits for the load, and the load for the writer. Each site is
 * priced alone on a copy of the schedule (placed and predicted) and taken
 * where that copy is faster than the schedule as it stands: a load standing
 * on the critical path between the writer and the pass can cost what the
 * second pass did. */
#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/isa/build.h"

typedef struct site {
	ts_id op, buf, w; /* the pass, the operand's buffer, its writer */
} site;

static bool dm_stream(const tcp_sched *s, const tcp_view *v)
{
	return v->t >= 0 && s->buf[v->t].space == TCP_DM;
}

/* whether buffer b of reader op o can have a VRF copy; its writer in *w */
static bool operand_ok(const tcp_sched *s, ts_id o, ts_id b, ts_id *w)
{
	const ts_buf *u = &s->buf[b];
	int64_t S = s->m ? tcp_slices(s->m) : 0, cap = s->m ? s->m->vrf_bytes_per_slice : 0;
	int64_t bytes = ts_buf_numel(u) * (int64_t)moe_dtype_size((moe_dtype)u->dtype);
	if (u->space != TCP_DM || u->slots != 1 || S < 1 || S > UINT16_MAX || bytes <= 0 || bytes > cap / 4 ||
		s->op[o].in.v[TCP_V_DST].t == (int32_t)b || ts_buf_spm_read(s, b))
		return false;
	uint32_t nw, nr;
	ts_id lw, lr;
	ts_buf_uses(s, b, &nw, &nr, &lw, &lr);
	if (nw != 1 || s->op[lw].region != s->top || ts_op_in_loop(s, lw))
		return false;
	int64_t wi = ts_op_index(s, s->top, lw), oi = ts_op_index(s, s->top, o);
	if (wi < 0 || oi < 0 || wi >= oi)
		return false;
	*w = lw;
	return true;
}

/* the sites from op o0 on, in op order: the first into *x */
static bool find_from(const tcp_sched *s, ts_id o0, site *x)
{
	for (ts_id o = o0; o < s->nop; o++) {
		const tcp_insn *in = &s->op[o].in;
		if (in->op != TCP_OP_TU_VEC)
			continue;
		int n = 0;
		for (int v = TCP_V_S0; v < TCP_NVIEW; v++)
			n += dm_stream(s, &in->v[v]);
		if (n <= (s->m ? s->m->max_streams : 2))
			continue;
		for (int v = TCP_V_S0; v < TCP_NVIEW; v++) {
			ts_id w;
			if (dm_stream(s, &in->v[v]) && operand_ok(s, o, (ts_id)in->v[v].t, &w)) {
				*x = (site){o, (ts_id)in->v[v].t, w};
				return true;
			}
		}
	}
	return false;
}

/* The load of a VRF copy of buffer b this rewrite made, or TS_NONE. */
static ts_id copy_of(const tcp_sched *s, ts_id b, uint16_t feature)
{
	for (ts_id o = 0; o < s->nop; o++)
		if (s->op[o].in.op == TCP_OP_SUB_VRF && s->op[o].feature == feature && s->op[o].in.v[TCP_V_S0].t == (int32_t)b)
			return o;
	return TS_NONE;
}

/* The VRF copy of x.buf (made once: a later pass reading the same buffer
 * reads the same copy), loaded before the pass, the pass reading it. */
static bool give_vrf(tcp_sched *s, const site *x, uint16_t feature)
{
	const ts_buf *u = &s->buf[x->buf];
	ts_id l = copy_of(s, x->buf, feature), vb;
	if (l == TS_NONE) {
		int64_t n = ts_buf_numel(u), S = tcp_slices(s->m), bytes = n * (int64_t)moe_dtype_size((moe_dtype)u->dtype);
		int64_t flit = s->m->flit_bytes > 0 ? s->m->flit_bytes : 32;
		vb = ts_add_buf(s, "vrf", TCP_VRF, TCP_T_SCRATCH, (moe_dtype)u->dtype, u->rank, u->shape);
		ts_buf *b = &s->buf[vb];
		b->layout = (ts_layout){.slice0 = 0, .nslices = 1, .copies = (uint16_t)S, .split = TS_SPLIT_FLIT,
			.slice_bytes = (bytes + flit - 1) / flit * flit};
		b->node = s->buf[x->buf].node;
		b->feature = feature;
		tcp_insn ld = tcp_b_ldvrf(1, &n, tcp_b_flat((int32_t)vb), tcp_b_flat((int32_t)x->buf), true);
		l = ts_add_op(s, TS_NONE, &ld, s->op[x->w].phase);
		s->op[l].region = s->top;
		s->op[l].node = s->op[x->w].node;
		s->op[l].feature = feature;
		ts_region_insert(s, s->top, (uint32_t)ts_op_index(s, s->top, x->op), TS_ITEM_OP | l);
		ts_add_dep(s, l, x->w, 0);
		b = &s->buf[vb];
		b->life = TS_LIFE_SPAN;
		b->first = b->last = l;
	} else {
		vb = (ts_id)s->op[l].in.v[TCP_V_DST].t;
	}
	tcp_insn *in = &s->op[x->op].in;
	for (int v = TCP_V_S0; v < TCP_NVIEW; v++)
		if (in->v[v].t == (int32_t)x->buf)
			in->v[v].t = (int32_t)vb;
	ts_set_insn(s, x->op, NULL, feature);
	ts_add_dep_once(s, x->op, l, 0);
	/* the copy lives up to its last reader; the operand's span ends at its
	 * last reader now (the load, at least) */
	uint32_t *pos = ctx_alloc(s->ctx, (s->nop + 1) * sizeof *pos);
	ts_op_positions(s, pos);
	ts_buf *b = &s->buf[vb], *ob = &s->buf[x->buf];
	if (pos[x->op] > pos[b->last])
		b->last = x->op;
	if (ob->life == TS_LIFE_SPAN && ob->last == x->op) {
		ts_id last = l;
		for (ts_id o = 0; o < s->nop; o++)
			if (ts_op_reads(&s->op[o], (int32_t)x->buf) && pos[o] > pos[last])
				last = o;
		ob->last = last;
	}
	ctx_free(s->ctx, pos, 0);
	return true;
}

typedef struct vo_arg {
	site x;
	uint16_t feature;
} vo_arg;

static bool vrf_copy(tcp_sched *c, void *arg)
{
	const vo_arg *a = arg;
	return give_vrf(c, &a->x, a->feature);
}

bool ts_rw_vrf_operands_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	site x;
	return s->m && find_from(s, 0, &x);
}

/* Each site in op order, priced alone against the schedule as it stands
 * (with the sites taken before it); taken where faster. */
moe_status ts_rw_vrf_operands_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	site x;
	if (!s->m || !find_from(s, 0, &x))
		return MOE_ERR_INVALID;
	int64_t base = ts_rw_base_cycles(s, e);
	bool any = false;
	for (ts_id from = 0; base >= 0 && find_from(s, from, &x); from = x.op + 1) {
		vo_arg a = {x, feature};
		ts_trial t = ts_trial_for(e, "<vrf-operands trial>", vrf_copy, &a, true);
		t.verify_at = base - 1;
		int64_t c = ts_trial_of(s, &t);
		if (c >= 0 && c < base) {
			give_vrf(s, &x, feature);
			base = c;
			any = true;
		}
	}
	return any ? MOE_OK : MOE_ERR_UNSUPPORTED;
}
