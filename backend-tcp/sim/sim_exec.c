/* backend-tcp/sim/sim_exec.c: the TCP simulator's tensor unit: vector-engine passes
 * (the ALU chain on 32-bit lane words) and contractions (bf16 products,
 * bf16x3 for f32, f32 accumulation in index order), with their cost. */
#include "backend-tcp/sim/sim_int.h"

/* One element-wise ALU op (not reduce/scan/compact/merge). */
static bool alu(sim *s, uint32_t pc, int op, uint32_t x, uint32_t y, uint32_t *v, bool *tag)
{
	int32_t a = iw(x), b = iw(y);
	float fa = fin(x), fb = fin(y);
	switch (op) {
	case TCP_V_TEQ: *tag = a == b; break;
	case TCP_V_TNE: *tag = a != b; break;
	case TCP_V_TLT: *tag = a < b; break;
	case TCP_V_TLE: *tag = a <= b; break;
	case TCP_V_TGT: *tag = a > b; break;
	case TCP_V_TGE: *tag = a >= b; break;
	case TCP_V_FTEQ: *tag = fa == fb; break;
	case TCP_V_FTNE: *tag = !(fa == fb); break;
	case TCP_V_FTLT: *tag = fa < fb; break;
	case TCP_V_FTLE: *tag = fa <= fb; break;
	case TCP_V_FTGT: *tag = fa > fb; break;
	case TCP_V_FTGE: *tag = fa >= fb; break;
	case TCP_V_AND: *v = x & y; return true;
	case TCP_V_OR: *v = x | y; return true;
	case TCP_V_XOR: *v = x ^ y; return true;
	case TCP_V_SHL: *v = x << (y & 31); return true;
	case TCP_V_SHR: *v = x >> (y & 31); return true;
	case TCP_V_SAR: *v = (y & 31) ? (x >> (y & 31)) | (a < 0 ? ~(0xffffffffu >> (y & 31)) : 0) : x; return true;
	case TCP_V_IADD: *v = x + y; return true;
	case TCP_V_ISUB: *v = x - y; return true;
	case TCP_V_IMUL: *v = (uint32_t)((uint64_t)x * (uint64_t)y); return true;
	case TCP_V_IDIV:
		if (b == 0) {
			FAULT(s, pc, "integer division by zero");
			return false;
		}
		*v = (a == INT32_MIN && b == -1) ? x : wi(a / b);
		return true;
	case TCP_V_ITOF: *v = fres((float)a); return true;
	case TCP_V_FADD: *v = fres(fa + fb); return true;
	case TCP_V_FSUB: *v = fres(fa - fb); return true;
	case TCP_V_FMUL: *v = fres(fa * fb); return true;
	case TCP_V_FEXP: *v = fres(sc_exp(fa)); return true;
	case TCP_V_FLOG: *v = fres(sc_log(fa)); return true;
	case TCP_V_FSQRT: *v = fres(sc_sqrt(fa)); return true;
	case TCP_V_FTANH: *v = fres(sc_tanh(fa)); return true;
	case TCP_V_FERF: *v = fres(sc_erf(fa)); return true;
	case TCP_V_FSIGM: *v = fres(sc_sigmoid(fa)); return true;
	case TCP_V_FNEG: *v = fres(-fa); return true;
	case TCP_V_FABS: *v = fres(fabsf(fa)); return true;
	case TCP_V_FDIV: *v = fres(fa / fb); return true;
	case TCP_V_FTOI: *v = wi(sc_f2i(fa)); return true;
	case TCP_V_IMIN: *v = a < b ? x : y; return true;
	case TCP_V_IMAX: *v = a > b ? x : y; return true;
	case TCP_V_FMIN: *v = fres(sc_fmin(fa, fb)); return true;
	case TCP_V_FMAX: *v = fres(sc_fmax(fa, fb)); return true;
	default: return true;
	}
	*v = *tag ? 1u : 0u;
	return true;
}

static uint32_t src_word(const tcp_step *st, int which, uint32_t v, const uint32_t *sw, const int64_t *idx)
{
	switch (which) {
	case TCP_SRC_V: return v;
	case TCP_SRC_S0: return sw[0];
	case TCP_SRC_S1: return sw[1];
	case TCP_SRC_S2: return sw[2];
	case TCP_SRC_IMM: return st->imm;
	case TCP_SRC_CTR: return (uint32_t)idx[st->ctr];
	default: return 0;
	}
}

static bool is_rowop(int op)
{
	return tcp_vop_stage[op] == TCP_ST_REDUCE || op == TCP_V_ISCAN || op == TCP_V_FSCAN || op == TCP_V_COMPACT;
}

/* The lane word of stream w (s0..s2) at element off; s0 may be 4-bit. */
static uint32_t stream_word(const sim *s, const tcp_insn *in, int w, int64_t off, unsigned nib)
{
	if (in->v[w].t < 0)
		return 0;
	return nib && w == TCP_V_S0 ? tcpq_nibble_word(s->data[in->v[w].t], off, nib) : load_word(s, in->v[w].t, off);
}

/* tcps_vrange for a view in 4-bit elements of its tensor's bytes (flags
 * e2m1, i4); lo, hi in elements of the tensor, for the hazards. */
static bool nib_range(sim *s, uint32_t pc, const tcp_view *v, int nd, const int64_t *dim, int64_t *lo, int64_t *hi)
{
	int64_t per = 2 * esz_of(s, v->t), a, z;
	if (!tcps_vbase_ok(s, pc, v, &a))
		return false;
	z = a;
	for (int k = 0; k < nd; k++) {
		int64_t x;
		if (__builtin_mul_overflow(v->stride[k], dim[k] - 1, &x) || __builtin_add_overflow(x < 0 ? a : z, x, x < 0 ? &a : &z)) {
			FAULT(s, pc, "address overflow: stride %lld x %lld past 64 bits", (long long)v->stride[k],
				(long long)(dim[k] - 1));
			return false;
		}
	}
	if (a < 0 || z >= s->p->t[v->t].numel * per) {
		tcp_view b = *v; /* reported as an overflow by tcps_vrange */
		b.reg = -1;
		b.base = a < 0 ? a : s->p->t[v->t].numel;
		return tcps_vrange(s, pc, &b, 0, dim, lo, hi);
	}
	*lo = a / per;
	*hi = z / per;
	return true;
}

/* The switch stage of a pass with flags=switch (docs/tcp-model.md): the
 * operands some slice does not hold (bit w: view w; computed once per
 * instruction); their cycles are tcp_cost_route's. */
static unsigned route_mask(sim *s, uint32_t pc, const tcp_insn *in)
{
	if (!(in->flags & TCP_F_ROUTE))
		return 0;
	if (!s->route[pc]) {
		char why[256];
		s->route[pc] = (uint8_t)(0x80u | tcp_pass_remote(s->p, s->m, in, why, sizeof why));
	}
	return s->route[pc] & 0x7fu;
}

/* The time of a tu.vec pass of n elements (rows of L for a row op rop >= 0;
 * fl: float ALUs) and its scheduling. */
static void vec_cost(sim *s, uint32_t pc, const tcp_insn *in, const acc *a, int rop, bool fl, int64_t n, int64_t L)
{
	const moe_tcp_machine *m = s->m;
	int nd = in->ndim;
	const tcp_view *dv = &in->v[TCP_V_DST];
	/* cost: rows (for row ops) or flits spread over the slices */
	int64_t S = s->S, units = rop >= 0 ? n / L : cdiv(n, m->flit_bytes / 4), per = rop >= 0 ? L : m->flit_bytes / 4;
	int64_t used = units < S ? units : S;
	int64_t pe = cdiv(units, used) * per;
	/* fetch: each DM stream at its read size, the streams interleaved on the
	 * one fetch channel (their cycles add up) */
	int64_t fsum = 0, ns = 0, rbytes = 0;
	unsigned rm = route_mask(s, pc, in);
	for (int w = 1; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && s->p->t[in->v[w].t].space == TCP_DM) {
			bool n4 = (in->flags & (TCP_F_E2M1 | TCP_F_I4)) && w == TCP_V_S0; /* 4-bit: half a byte each */
			int64_t el = pe, e = n4 ? 1 : esz_of(s, in->v[w].t), rs = tcp_meter_read_size(s->m, &in->v[w], nd, in->dim, e, &el);
			fsum += n4 ? cdiv(cdiv(el, 2), rs) : cdiv(el * e, rs);
			rbytes += (rm >> w & 1u) ? (n4 ? cdiv(el, 2) : el * e) : 0;
			ns++;
		}
	int64_t outs = rop >= 0 && tcp_vop_stage[in->step[rop].op] == TCP_ST_REDUCE ? pe / L : pe, ol = outs;
	int64_t crs = tcp_meter_read_size(s->m, dv, rop >= 0 && tcp_vop_stage[in->step[rop].op] == TCP_ST_REDUCE ? nd - 1 : nd,
		in->dim, esz_of(s, dv->t), &ol);
	int64_t commit = cdiv(outs * esz_of(s, dv->t), crs);
	rbytes += (rm & 1u) ? outs * esz_of(s, dv->t) : 0;
	tcp_cost c = tcp_cost_vec(&s->cm, &(tcp_vec_load){pe, fl, in->nstep, fsum, ns, commit, rbytes, used,
						      (in->flags & TCP_F_XSLICE) != 0});
	busy(s, pc, MOE_TCP_ENGINE_VECTOR, c.engine);
	tcps_schedule(s, pc, a, c.total);
}

void tcps_run_vec(sim *s, uint32_t pc, const tcp_insn *in)
{
	int nd = in->ndim;
	int64_t lo[TCP_NVIEW], hi[TCP_NVIEW];
	acc a = {0};
	unsigned nib = in->flags & (TCP_F_E2M1 | TCP_F_I4); /* s0 in 4-bit elements */
	for (int w = 0; w < TCP_NVIEW; w++) {
		if (in->v[w].t < 0)
			continue;
		if (!(nib && w == TCP_V_S0 ? nib_range : tcps_vrange)(s, pc, &in->v[w], nd, in->dim, &lo[w], &hi[w]))
			return;
		acc_add(&a, in->v[w].t, lo[w], hi[w], w == TCP_V_DST);
	}
	if (!tcps_writable(s, pc, in->v[TCP_V_DST].t))
		return;
	int rop = -1;
	bool fl = false;
	for (int i = 0; i < in->nstep; i++) {
		if (is_rowop(in->step[i].op))
			rop = i;
		int stg = tcp_vop_stage[in->step[i].op];
		if (stg >= TCP_ST_FXP2FP && stg <= TCP_ST_FP2FXP)
			fl = true;
		if (in->step[i].op >= TCP_V_FTEQ && in->step[i].op <= TCP_V_FTGE)
			fl = true;
		if (in->step[i].op == TCP_V_FMIN || in->step[i].op == TCP_V_FMAX)
			fl = true;
	}
	int64_t n = 1;
	for (int k = 0; k < nd; k++)
		n *= in->dim[k];
	int64_t L = nd ? in->dim[nd - 1] : 1;
	int64_t cnt = in->vreg >= 0 ? s->reg[in->vreg] : INT64_MAX;
	bool compute = tcps_computes(s, pc);
	if (compute && !tcps_take_values(s, pc, in))
		return;
	int64_t vb[TCP_NVIEW];
	for (int w = 0; w < TCP_NVIEW; w++)
		vb[w] = in->v[w].t >= 0 ? vbase(s, &in->v[w]) : 0;
	const tcp_view *dv = &in->v[TCP_V_DST];
	int64_t idx[TCP_MAXD] = {0};
	uint32_t racc = 0, keep_n = 0;
	uint32_t *kept = NULL;
	if (rop >= 0 && in->step[rop].op == TCP_V_COMPACT && compute) {
		kept = ctx_alloc(s->ctx, sizeof *kept * (size_t)L); /* guarded: refused is MOE_ERR_NOMEM */
		if (!kept) {
			FAULT(s, pc, "out of host memory");
			return;
		}
	}
	for (int64_t e = 0; e < n && compute && !s->fault; e++) {
		int64_t off[TCP_NVIEW];
		for (int w = 0; w < TCP_NVIEW; w++) {
			off[w] = vb[w];
			if (in->v[w].t >= 0)
				for (int k = 0; k < nd; k++)
					off[w] += idx[k] * in->v[w].stride[k];
		}
		uint32_t sw[3];
		for (int w = 0; w < 3; w++)
			sw[w] = stream_word(s, in, w + 1, off[w + 1], nib);
		bool masked = nd > 0 && idx[0] >= cnt;
		int64_t j = nd ? idx[nd - 1] : 0;
		bool first = j == 0, lastel = j == L - 1;
		uint32_t v = in->v[TCP_V_S0].t >= 0 ? sw[0] : 0;
		bool tag = false, out_now = true;
		for (int i = 0; i < in->nstep && !s->fault; i++) {
			const tcp_step *st = &in->step[i];
			uint32_t x = src_word(st, st->x, v, sw, idx), y = src_word(st, st->y, v, sw, idx);
			if (i == rop) {
				switch (st->op) {
				case TCP_V_RSUM: racc = first ? x : racc + x; break;
				case TCP_V_RMAX: racc = first || iw(x) > iw(racc) ? x : racc; break;
				case TCP_V_RMIN: racc = first || iw(x) < iw(racc) ? x : racc; break;
				case TCP_V_FRSUM: racc = first ? fres(fin(x)) : fres(fin(racc) + fin(x)); break;
				case TCP_V_FRMAX: racc = first ? fres(fin(x)) : fres(sc_fmax(fin(racc), fin(x))); break;
				case TCP_V_FRMIN: racc = first ? fres(fin(x)) : fres(sc_fmin(fin(racc), fin(x))); break;
				case TCP_V_ISCAN:
				case TCP_V_FSCAN: {
					uint32_t prev = first ? (st->op == TCP_V_ISCAN ? 0u : 0u) : racc;
					uint32_t nx = st->op == TCP_V_ISCAN ? (first ? x : racc + x)
									    : (first ? fres(fin(x)) : fres(fin(racc) + fin(x)));
					racc = nx;
					v = (st->flags & TCP_STEP_EXCL) ? prev : nx;
					continue;
				}
				case TCP_V_COMPACT:
					if (first)
						keep_n = 0;
					if (tag)
						kept[keep_n++] = x;
					out_now = false;
					if (lastel) {
						/* the row's kept values go to the front, the rest is the fill */
						int64_t rowoff = off[TCP_V_DST] - j * dv->stride[nd - 1];
						for (int64_t q = 0; q < L; q++)
							store_word(s, dv->t, rowoff + q * dv->stride[nd - 1],
								masked ? 0 : q < keep_n ? kept[q] : st->imm);
					}
					continue;
				default: break;
				}
				if (!lastel) {
					out_now = false;
					break;
				}
				v = racc;
				continue;
			}
			if (st->op == TCP_V_MERGE) {
				v = tag ? x : y;
				continue;
			}
			alu(s, pc, st->op, x, y, &v, &tag);
		}
		if (out_now)
			store_word(s, dv->t, off[TCP_V_DST], masked ? 0 : v);
		for (int k = nd - 1; k >= 0 && ++idx[k] == in->dim[k]; k--)
			idx[k] = 0;
	}
	ctx_free(s->ctx, kept, 0);
	vec_cost(s, pc, in, &a, rop, fl, n, L);
}

/* ---- contraction ---- */
/* x = hi + lo (+ a remainder below bf16x3's precision). A finite x next to
 * FLT_MAX, which bf16 rounding would carry to inf, is split from its
 * truncation instead; inf and NaN are hi alone. */
static void split3(float x, float *hi, float *lo)
{
	*hi = moe_bf16_to_f32(moe_f32_to_bf16(x));
	if (isinf(*hi) && isfinite(x)) {
		uint32_t u;
		memcpy(&u, &x, 4);
		u &= 0xffff0000u;
		memcpy(hi, &u, 4);
	}
	*lo = isfinite(*hi) ? moe_bf16_to_f32(moe_f32_to_bf16(x - *hi)) : 0.0f;
}

/* One row of a scaled contraction (act=fp8): per 128-wide chunk of I, the
 * chunk's f32 sum of products times s2[r, o, chunk], added in chunk order.
 * sum holds 2 O floats (the total, then the chunk's sum). */
static void scaled_row(sim *s, const tcp_insn *in, int64_t r, const float *arow, const float *wt, float *sum, int64_t pb)
{
	int64_t O = in->dim[1], I = in->dim[2];
	const tcp_view *pv = &in->v[TCP_V_S2];
	float *part = sum + O;
	for (int64_t c0 = 0; c0 < I; c0 += TCP_SCALE_CHUNK) {
		for (int64_t o = 0; o < O; o++)
			part[o] = 0.0f;
		for (int64_t i = c0; i < c0 + TCP_SCALE_CHUNK && i < I; i++)
			for (int64_t o = 0; o < O; o++)
				part[o] = flush_fast(part[o] + arow[i] * wt[i * O + o]);
		for (int64_t o = 0; o < O; o++) {
			float sc = fin(load_word(s, pv->t, pb + r * pv->stride[0] + o * pv->stride[1] +
								 c0 / TCP_SCALE_CHUNK * pv->stride[2]));
			sum[o] = flush_fast(sum[o] + flush_fast(part[o] * sc));
		}
	}
}

/* i8 x i8 (W8A8): products exact, summed exactly in i32 (the validator bounds
 * I so that no sum can overflow); dst = the i32 sum (+ the i32 partial s2
 * with acc), or with `scaled` f32(sum) x s2[m, o] rounded to dst's type. */
static void contract_i8(sim *s, const tcp_insn *in, int64_t cnt, int64_t db, int64_t ab, int64_t wb, int64_t pb)
{
	const tcp_view *dv = &in->v[TCP_V_DST], *av = &in->v[TCP_V_S0], *wv = &in->v[TCP_V_S1], *pv = &in->v[TCP_V_S2];
	int64_t M = in->dim[0], O = in->dim[1], I = in->dim[2];
	for (int64_t r = 0; r < M; r++)
		for (int64_t o = 0; o < O; o++) {
			uint32_t out = 0;
			if (r < cnt) {
				int64_t sum = (in->flags & TCP_F_ACC) ? iw(load_word(s, pv->t, pb + r * pv->stride[0] +
										       o * pv->stride[1]))
								      : 0;
				for (int64_t i = 0; i < I; i++)
					sum += (int64_t)iw(load_word(s, av->t, ab + r * av->stride[0] + i * av->stride[2])) *
					       iw(load_word(s, wv->t, wb + o * wv->stride[1] + i * wv->stride[2]));
				out = (uint32_t)sum; /* i32 wrap-around (the validator bounds I so it cannot) */
				if (in->flags & TCP_F_SCALED) { /* rowdiv: the quotient rounded (and flushed) as d.div's */
					float sc = (in->flags & TCP_F_ROWDIV)
							   ? fin(fres(fin(load_word(s, pv->t, pb + o * pv->stride[1])) /
								      fin(load_word(s, pv->t, pb + pv->stride[2] + r * pv->stride[0]))))
							   : fin(load_word(s, pv->t, pb + r * pv->stride[0] + o * pv->stride[1]));
					out = fres((float)iw(out) * sc);
				}
			}
			store_word(s, dv->t, db + r * dv->stride[0] + o * dv->stride[1], out);
		}
}

void tcps_run_contract(sim *s, uint32_t pc, const tcp_insn *in)
{
	int64_t M = in->dim[0], O = in->dim[1], I = in->dim[2];
	acc a = {0};
	int64_t lo, hi;
	bool i8 = in->v[TCP_V_S0].t >= 0 && s->p->t[in->v[TCP_V_S0].t].dtype == MOE_I8;
	for (int w = 0; w < TCP_NVIEW; w++) {
		if (in->v[w].t < 0)
			continue;
		int64_t d[3] = {w == TCP_V_S1 ? 1 : M, w == TCP_V_S0 ? 1 : O, (w == TCP_V_S0 || w == TCP_V_S1) ? I : 1};
		if (w == TCP_V_S2 && (in->flags & TCP_F_SCALED) && !i8)
			d[2] = I / TCP_SCALE_CHUNK; /* one scale per (row, output, chunk) */
		if (w == TCP_V_S2 && (in->flags & TCP_F_ROWDIV)) { /* the row factors s2[m, 0, 1]; below the columns' */
			tcp_view rv = in->v[w];
			int64_t dr[3] = {M, 1, 1};
			rv.base += rv.stride[2];
			if (!tcps_vrange(s, pc, &rv, 3, dr, &lo, &hi))
				return;
			acc_add(&a, rv.t, lo, hi, false);
			d[0] = 1;
		}
		if (!tcps_vrange(s, pc, &in->v[w], 3, d, &lo, &hi))
			return;
		acc_add(&a, in->v[w].t, lo, hi, w == TCP_V_DST);
	}
	if (!tcps_writable(s, pc, in->v[TCP_V_DST].t))
		return;
	bool x3 = in->flags & TCP_F_BF16X3;
	int64_t cnt = in->vreg >= 0 ? s->reg[in->vreg] : M;
	bool compute = tcps_computes(s, pc);
	if (compute && !tcps_take_values(s, pc, in))
		return;
	const tcp_view *dv = &in->v[TCP_V_DST], *av = &in->v[TCP_V_S0], *wv = &in->v[TCP_V_S1], *pv = &in->v[TCP_V_S2];
	int64_t db = vbase(s, dv), ab = vbase(s, av), wb = vbase(s, wv), pb = pv->t >= 0 ? vbase(s, pv) : 0;
	/* The stationary tile is unpacked once, transposed to [i][o] (hi and lo
	 * parts for bf16x3), so each row's O running sums advance together; every
	 * sum still adds its products in index order, as the hardware's
	 * accumulator does. */
	if (i8 && compute)
		contract_i8(s, in, cnt, db, ab, wb, pb);
	compute &= !i8;
	size_t wn = (size_t)(compute ? O * I : 0);
	float *wt = compute ? ctx_alloc(s->ctx, sizeof(float) * (x3 ? 2 : 1) * (wn ? wn : 1)) : NULL;
	float *arow = compute ? ctx_alloc(s->ctx, sizeof(float) * 2 * (size_t)(I ? I : 1)) : NULL;
	float *sum = compute ? ctx_alloc(s->ctx, sizeof(float) * 2 * (size_t)(O ? O : 1)) : NULL;
	if (compute && (!wt || !arow || !sum)) {
		ctx_free(s->ctx, wt, 0);
		ctx_free(s->ctx, arow, 0);
		ctx_free(s->ctx, sum, 0);
		FAULT(s, pc, "out of host memory");
		return;
	}
	float *wlo = x3 && wt ? wt + wn : NULL;
	bool wfin = true; /* every stationary value finite: the three-product form is exact */
	for (int64_t o = 0; o < O && compute; o++)
		for (int64_t i = 0; i < I; i++) {
			float f = fin(load_word(s, wv->t, wb + o * wv->stride[1] + i * wv->stride[2]));
			if (x3)
				split3(f, &wt[i * O + o], &wlo[i * O + o]);
			else
				wt[i * O + o] = f;
			wfin &= isfinite(f) != 0;
		}
	for (int64_t r = 0; r < M && compute; r++) {
		if (r >= cnt) {
			for (int64_t o = 0; o < O; o++)
				store_word(s, dv->t, db + r * dv->stride[0] + o * dv->stride[1], 0);
			continue;
		}
		for (int64_t i = 0; i < I; i++) {
			float f = fin(load_word(s, av->t, ab + r * av->stride[0] + i * av->stride[2]));
			if (x3)
				split3(f, &arow[i], &arow[I + i]);
			else
				arow[i] = f;
		}
		for (int64_t o = 0; o < O; o++)
			sum[o] = (in->flags & TCP_F_ACC) ? fin(load_word(s, pv->t, pb + r * pv->stride[0] + o * pv->stride[1])) : 0.0f;
		if (in->flags & TCP_F_SCALED) {
			scaled_row(s, in, r, arow, wt, sum, pb);
			for (int64_t o = 0; o < O; o++)
				store_word(s, dv->t, db + r * dv->stride[0] + o * dv->stride[1], fres(sum[o]));
			continue;
		}
		for (int64_t i = 0; i < I; i++) {
			const float a = arow[i], *w = wt + i * O;
			if (x3 && isfinite(a) && wfin) {
				const float al = arow[I + i], *wl = wlo + i * O;
				for (int64_t o = 0; o < O; o++)
					sum[o] = flush_fast(sum[o] + (a * w[o] + (a * wl[o] + al * w[o])));
			} else if (x3) {
				/* an inf or NaN operand: its product is hi x hi alone, as IEEE f32
				 * gives it (inf x finite = inf, inf x 0 = NaN); the cross terms
				 * would add inf x 0 = NaN */
				const float al = arow[I + i], *wl = wlo + i * O;
				for (int64_t o = 0; o < O; o++) {
					float pr = isfinite(a) && isfinite(w[o]) ? a * w[o] + (a * wl[o] + al * w[o]) : a * w[o];
					sum[o] = flush_fast(sum[o] + pr);
				}
			} else {
				for (int64_t o = 0; o < O; o++)
					sum[o] = flush_fast(sum[o] + a * w[o]);
			}
		}
		for (int64_t o = 0; o < O; o++)
			store_word(s, dv->t, db + r * dv->stride[0] + o * dv->stride[1], fres(sum[o]));
	}
	ctx_free(s->ctx, wt, 0);
	ctx_free(s->ctx, arow, 0);
	ctx_free(s->ctx, sum, 0);
	/* cost: O split over column groups of `tile` rows each, rows over the remaining slices */
	int64_t S = s->S, Cg = cdiv(O, in->tile), R = S / Cg > 0 ? S / Cg : 1, Bs = cdiv(M, R);
	int64_t tiles = cdiv(Cg, S);
	/* f8 x f8 at the fp8 rate, i8 x i8 at the i8 rate */
	int mt = s->p->t[av->t].dtype == MOE_F8E4M3 ? TCP_MT_F8 : i8 ? TCP_MT_I8 : TCP_MT_BF16;
	int64_t ae = x3 ? 4 : mt != TCP_MT_BF16 ? 1 : 2;
	/* the scales read: one per chunk (f8), one per output (i8) */
	int64_t sc_bytes = (in->flags & TCP_F_SCALED) ? 4 * (i8 ? 1 : I / TCP_SCALE_CHUNK) : 0;
	unsigned rm = route_mask(s, pc, in);
	int64_t rbytes = ((rm >> TCP_V_S0 & 1u) ? Bs * I * ae : 0) + ((rm & 1u) ? Bs * in->tile * esz_of(s, dv->t) : 0) +
			 ((rm >> TCP_V_S2 & 1u) ? Bs * in->tile * ((in->flags & TCP_F_ACC) ? 4 : sc_bytes) : 0);
	tcp_cost c = tcp_cost_contract(&s->cm, &(tcp_mm_load){Bs, in->tile, I, tiles, mt, x3, ae,
							esz_of(s, dv->t) + ((in->flags & TCP_F_ACC) ? 4 : 0) + sc_bytes, rbytes,
							S < Cg * R ? S : Cg * R, (in->flags & TCP_F_ROWDIV) != 0});
	busy(s, pc, MOE_TCP_ENGINE_CONTRACTION, c.engine);
	tcps_schedule(s, pc, &a, c.total);
}
