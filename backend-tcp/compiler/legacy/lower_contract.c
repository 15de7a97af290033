/* backend-tcp/lower_contract.c: TCP lowering of einsums to contraction passes: the
 * second operand stationary in double-buffered TRF tiles, streamed from HBM
 * tile by tile when it does not fit in DM. */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"
#include "passes/pass.h"

/* ---- contraction ---- */
static cplan plan_contract(lw *c, int64_t M, int64_t O, int64_t I, int wdt)
{
	return tcp_plan_contract(c->m, M, O, I, wdt, NULL);
}

/* dst[m, o] = sum_i a[m, i] w[o, i]: a (DM view, strides am, ai), w (DM view, wo, wi).
 * areg/wreg: loop offset registers for region views. */
static void emit_contract(lw *c, moe_id at, const cplan *pl, const tcp_view *a, int64_t am, int64_t ai,
	const tcp_view *w, int64_t wo, int64_t wi, const tcp_view *dst, int64_t dm_, int64_t do_, int wdt, int vreg,
	bool stream, int64_t tiles, int64_t step)
{
	int64_t nchunks = (pl->I + pl->It - 1) / pl->It, npass = (pl->O + pl->Opass - 1) / pl->Opass;
	int32_t acc = -1, wb = -1;
	int64_t wtile = pl->Opass * pl->It, wk = 0, nwb = 2;
	if (stream) {
		/* w is the expert's weights in HBM: each TRF tile's [on, inn] part is
		 * DMA'd into one slot of a ring just before its sub load: two slots,
		 * four in the block loop when they take at most 1/8 of DM, so the
		 * weight stream runs further ahead of a block whose rows make it
		 * MAC-bound (into the next block's tiles: docs/tcp-isa.md 7.4) */
		if (c->inreg[at] && 4 * wtile * esz(wdt) * 8 <= c->m->dm_bytes_per_slice * c->S)
			nwb = 4;
		int64_t sh[2] = {nwb, wtile};
		wb = tcpl_dm_tensor(c, at, "wbuf", (moe_dtype)wdt, 2, sh);
	}
	if (nchunks > 1) {
		int64_t sh[2] = {pl->M, pl->O};
		acc = tcpl_dm_tensor(c, at, "contract.acc", MOE_F32, 2, sh);
	}
	int64_t trf_need = pl->Opass * pl->It;
	int64_t fp_need = rup(pl->Os * pl->It * esz(wdt), c->m->flit_bytes),
		share_need = rup((trf_need * esz(wdt) + c->S - 1) / c->S, c->m->flit_bytes);
	fp_need = fp_need > share_need ? fp_need : share_need;
	/* the TRF tiles are (re)declared for this tiling: a sub load costs the declared footprint */
	if (c->trf[0] < 0 || trf_need > c->trf_rows_cap || wdt != c->p->t[c->trf[0]].dtype ||
		c->p->t[c->trf[0]].slice_bytes != fp_need) {
		/* (re)declare the two TRF tiles large enough for this contraction */
		int64_t sh[2] = {pl->Opass, pl->It};
		int64_t e = wdt == MOE_F32 ? 4 : 2;
		int64_t half = tcp_trf_bytes(c->m) / 2;
		for (int k = 0; k < 2; k++) {
			c->trf[k] = tcp_add_tensor(c->p, k ? "trf.1" : "trf.0", TCP_TRF, TCP_T_SCRATCH, (moe_dtype)wdt, 2, sh);
			c->p->t[c->trf[k]].addr = k * half;
			int64_t fp = rup(pl->Os * pl->It * e, c->m->flit_bytes);
			int64_t share = rup((trf_need * esz(wdt) + c->S - 1) / c->S, c->m->flit_bytes);
			c->p->t[c->trf[k]].slice_bytes = fp > share ? fp : share;
		}
		c->trf_rows_cap = trf_need;
	}
	for (int64_t ps = 0; ps < npass; ps++) {
		int64_t o0 = ps * pl->Opass, on = pl->O - o0 < pl->Opass ? pl->O - o0 : pl->Opass;
		for (int64_t ch = 0; ch < nchunks; ch++) {
			int64_t i0 = ch * pl->It, inn = pl->I - i0 < pl->It ? pl->I - i0 : pl->It;
			int32_t tt = c->trf[c->trf_k];
			c->trf_k ^= 1;
			tcp_insn ld_ = tcp_insn_init(TCP_OP_SUB_TRF);
			ld_.ndim = 2;
			ld_.dim[0] = on;
			ld_.dim[1] = inn;
			ld_.v[TCP_V_DST].t = tt;
			ld_.v[TCP_V_DST].stride[0] = inn;
			ld_.v[TCP_V_DST].stride[1] = 1;
			ld_.v[TCP_V_S0] = *w;
			ld_.v[TCP_V_S0].base += o0 * wo + i0 * wi;
			ld_.v[TCP_V_S0].stride[0] = wo;
			ld_.v[TCP_V_S0].stride[1] = wi;
			if (stream) {
				const int64_t ddim[2] = {on, inn}, dst[2] = {inn, 1};
				tcp_insn dm = tcp_b_dma_copy(2, ddim, tcp_b_view(wb, wk * wtile, 2, dst), ld_.v[TCP_V_S0]);
				/* the contraction's tiles form one descriptor list; in the
				 * block loop it joins the DMA command before it, so its setup
				 * overlaps that one's transfer (the hazards still order it) */
				if (ps > 0 || ch > 0 || c->inreg[at])
					dm.flags |= TCP_F_JOIN;
				emit(c, &dm);
				ld_.v[TCP_V_S0] = dm.v[TCP_V_DST];
				wk = (wk + 1) % nwb;
			}
			emit(c, &ld_);
			tcp_insn in = tcp_insn_init(TCP_OP_TU_CONTRACT);
			in.ndim = 3;
			in.dim[0] = pl->M;
			in.dim[1] = on;
			in.dim[2] = inn;
			in.tile = pl->Os < on ? pl->Os : on;
			in.vreg = vreg;
			if (wdt == MOE_F32)
				in.flags |= TCP_F_BF16X3;
			tcp_view *s0 = &in.v[TCP_V_S0];
			*s0 = *a;
			s0->base += i0 * ai;
			s0->stride[0] = am;
			s0->stride[1] = 0;
			s0->stride[2] = ai;
			if (c->achunk) { /* the rows' chunk ch, a DM tensor [M, inn] of its own (chunked_rows) */
				*s0 = tcp_view_none();
				s0->t = c->achunk[ch];
				s0->stride[0] = inn;
				s0->stride[2] = 1;
			}
			tcp_view *s1 = &in.v[TCP_V_S1];
			s1->t = tt;
			s1->stride[0] = 0;
			s1->stride[1] = inn;
			s1->stride[2] = 1;
			bool last = ch == nchunks - 1;
			tcp_view *d = &in.v[TCP_V_DST];
			if (last) {
				*d = *dst;
				d->base += o0 * do_;
				d->stride[0] = dm_;
				d->stride[1] = do_;
			} else {
				*d = tcp_view_none();
				d->t = acc;
				d->base = o0;
				d->stride[0] = pl->O;
				d->stride[1] = 1;
			}
			d->stride[2] = 0;
			if (ch > 0) {
				in.flags |= TCP_F_ACC;
				tcp_view *s2 = &in.v[TCP_V_S2];
				*s2 = tcp_view_none();
				s2->t = acc;
				s2->base = o0;
				s2->stride[0] = pl->O;
				s2->stride[1] = 1;
			}
			if (tiles > 0) /* guarded row tiles (lower_rows.c) */
				tcpl_emit_row_steps(c, &in, tiles, step);
			else
				emit(c, &in);
		}
	}
	if (acc >= 0)
		tcpl_dm_free(c, acc);
	if (wb >= 0)
		tcpl_dm_free(c, wb);
}

/* the einsum's letters as [b]mi,[b]oi->[b]mo: pos_x[k] is the dim index in
 * a, w and the output of b, m, o, i (-1 if absent); *cbp the batch letter */
static bool classify_einsum(lw *c, moe_id id, const ir_einsum *ep, int pos_a[4], int pos_w[4], int pos_o[4], int *cbp)
{
	const ir_node *n = N(c->g, id);
	const ir_einsum e = *ep;
	int cb = -1;
	/* classify: batch (a, w, out), m (a, out), o (w, out), i (a, w) */
	int cm = -1, co = -1, ci_ = -1, nb = 0, nm = 0, no = 0, ni = 0;
	for (int l = 0; l < e.nletters; l++) {
		char ch = e.letters[l];
		bool ia = memchr(e.in[0], ch, (size_t)e.rank[0]) != NULL, iw = memchr(e.in[1], ch, (size_t)e.rank[1]) != NULL,
		     io = memchr(e.out, ch, (size_t)e.out_rank) != NULL;
		if (ia && iw && io)
			cb = l, nb++;
		else if (ia && io)
			cm = l, nm++;
		else if (iw && io)
			co = l, no++;
		else if (ia && iw)
			ci_ = l, ni++;
		else {
			tcpl_err(c, id, "einsum '%s': a letter summed from one operand only is not lowered", ir_attr_str(n, "eq", ""));
			return false;
		}
	}
	if (nb > 1 || nm != 1 || no != 1 || ni != 1) {
		tcpl_err(c, id, "einsum '%s' is not of the form [b]mi,[b]oi->[b]mo", ir_attr_str(n, "eq", ""));
		return false;
	}
	int letters[4] = {cb, cm, co, ci_};
	for (int k = 0; k < 4; k++) {
		pos_a[k] = pos_w[k] = pos_o[k] = -1;
		if (letters[k] < 0)
			continue;
		char ch = e.letters[letters[k]];
		const char *pa = memchr(e.in[0], ch, (size_t)e.rank[0]), *pw = memchr(e.in[1], ch, (size_t)e.rank[1]),
			   *po = memchr(e.out, ch, (size_t)e.out_rank);
		pos_a[k] = pa ? (int)(pa - e.in[0]) : -1;
		pos_w[k] = pw ? (int)(pw - e.in[1]) : -1;
		pos_o[k] = po ? (int)(po - e.out) : -1;
	}
	*cbp = cb;
	return true;
}

/* A widened einsum's rows operand x [M, I], an input in HBM, copied into DM
 * as one tensor per reduction chunk of plan pl ([M, It], strided DMAs of one
 * list): the contraction of chunk ch waits for its own chunk only (the
 * simulator's hazards are per tensor), so the copy of x overlaps the
 * router's contractions instead of preceding them (DeepSeek-V3 at T = 4096:
 * 42 us of x before the first of 7 contractions of 8.3 us). NULL when x is
 * not such an input. */
static int32_t *chunked_rows(lw *c, moe_id id, const cplan *pl, int64_t nch)
{
	const ir_node *n = N(c->g, id), *an = N(c->g, n->args[0]);
	val *v = &c->v[n->args[0]];
	if (nch < 2 || nch > 64 || an->rank != 2 || v->kind != VK_VIEW || v->region || c->p->t[v->t].space != TCP_HBM ||
		!is_contig(v, an) || tcpl_valid_reg(c, id) >= 0 || tcpl_input_rows_count(c, n->args[0]) != MOE_NONE)
		return NULL;
	int32_t *t = ctx_alloc(c->ctx, sizeof *t * (size_t)nch);
	for (int64_t ch = 0; ch < nch; ch++) {
		int64_t i0 = ch * pl->It, inn = pl->I - i0 < pl->It ? pl->I - i0 : pl->It, sh[2] = {pl->M, inn};
		t[ch] = tcpl_dm_tensor(c, id, "rows-chunk", (moe_dtype)c->p->t[v->t].dtype, 2, sh);
		const int64_t dst[2] = {inn, 1}, src[2] = {pl->I, 1};
		tcp_insn dm = tcp_b_dma_copy(2, sh, tcp_b_view(t[ch], 0, 2, dst), tcp_b_view(v->t, v->base + i0, 2, src));
		uint32_t at = c->p->ncode;
		emit(c, &dm);
		if (ch > 0)
			c->p->code[at].flags |= TCP_F_JOIN;
		else
			tcpl_join_adjacent(c, at);
	}
	return t;
}

/* chunked_rows for a widened einsum whose casts are views (pos_w: the
 * weight's dims of b m o i), planned as bf16. */
static int32_t *widened_rows(lw *c, moe_id id, const int pos_w[4])
{
	const ir_node *n = N(c->g, id), *an = N(c->g, n->args[0]), *wn = N(c->g, n->args[1]);
	if (!c->alias_cast[n->args[0]] || !c->alias_cast[n->args[1]] || !pass_tcp_widened_einsum(c->g, id))
		return NULL;
	cplan pw = plan_contract(c, an->shape[0], wn->shape[pos_w[2]], an->shape[1], MOE_BF16);
	return chunked_rows(c, id, &pw, (pw.I + pw.It - 1) / pw.It);
}

static void free_rows(lw *c, int32_t *achunk, int64_t nch)
{
	for (int64_t ch = 0; ch < nch; ch++)
		tcpl_dm_free(c, achunk[ch]);
	ctx_free(c->ctx, achunk, sizeof *achunk * (size_t)nch);
}

/* The contraction's dtype *cdt: bf16 for a widened einsum whose casts are
 * views of bf16 tensors in DM (or its rows' chunks); false (an error) when
 * they are views of anything else (`other`: in the loop or streamed). */
static bool widened_dtype(lw *c, moe_id id, bool other, const val *avs, const val *wvs, const int32_t *achunk, int *cdt)
{
	const ir_node *n = N(c->g, id);
	if (!c->alias_cast[n->args[0]] || !c->alias_cast[n->args[1]] || !pass_tcp_widened_einsum(c->g, id))
		return true;
	if (other || avs->kind != VK_VIEW || wvs->kind != VK_VIEW || c->p->t[achunk ? achunk[0] : avs->t].dtype != MOE_BF16 ||
		c->p->t[wvs->t].dtype != MOE_BF16) {
		tcpl_err(c, id, "widened einsum: its casts are views but not of bf16 tensors in DM");
		return false;
	}
	*cdt = MOE_BF16;
	return true;
}

void tcpl_lower_einsum(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (tcpl_lower_fp8_einsum(c, id))
		return;
	if (n->nargs != 2) {
		tcpl_err(c, id, "one-operand einsum has no TCP lowering");
		return;
	}
	ir_einsum e;
	char msg[128];
	if (!ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg)) {
		tcpl_err(c, id, "einsum: %s", msg);
		return;
	}
	int pos_a[4], pos_w[4], pos_o[4], cb; /* b m o i -> dim index */
	if (!classify_einsum(c, id, &e, pos_a, pos_w, pos_o, &cb))
		return;
	const ir_node *an = N(c->g, n->args[0]), *wn = N(c->g, n->args[1]);
	if (an->dtype != MOE_BF16 && an->dtype != MOE_F32) {
		tcpl_err(c, id, "contraction operands must be bf16 or f32");
		return;
	}
	bool region = c->inreg[id];
	if (region && cb >= 0) {
		/* per block the leading batch letter (the block index) is gone */
		if (pos_a[0] != 0 || pos_w[0] != 0 || pos_o[0] != 0) {
			tcpl_err(c, id, "block einsum must have the block index first");
			return;
		}
		for (int k = 1; k < 4; k++) {
			pos_a[k] -= pos_a[k] >= 0;
			pos_w[k] -= pos_w[k] >= 0;
			pos_o[k] -= pos_o[k] >= 0;
		}
	}
	/* one row against weights outside the loop (a decode's router): the row
	 * is the stationary operand and the weights stream past it, so the TRF
	 * load of the row overlaps the weights' copy (x is copied first) */
	bool swap = !region && cb < 0 && an->shape[pos_a[1]] == 1 && tcpl_valid_reg(c, id) < 0 &&
		    ir_bytes(wn) * 8 < c->m->dm_bytes_per_slice * c->S;
	if (!region && cb < 0 && ir_bytes(wn) * 8 < c->m->dm_bytes_per_slice * c->S && !swap)
		(void)tcpl_dm_view(c, n->args[1]); /* the stationary operand's copy first: its TRF load waits for it only */
	int32_t *achunk = !region && !swap && cb < 0 && pos_a[1] == 0 && pos_a[3] == 1 ? widened_rows(c, id, pos_w) : NULL;
	val *av = achunk ? &c->v[n->args[0]] : tcpl_dm_view(c, n->args[0]);
	val avs = *av;
	bool stream = region && c->wstream[n->args[1]];
	/* a large weight outside the block loop (a shared expert) is streamed
	 * from HBM tile by tile instead of copied whole into DM */
	val *hv = !region && wn->op == MOE_OP_WEIGHT && cb < 0 && ir_bytes(wn) * 8 >= c->m->dm_bytes_per_slice * c->S ?
		tcpl_need_view(c, n->args[1]) : NULL;
	bool hstream = hv && hv->kind == VK_VIEW && c->p->t[hv->t].space == TCP_HBM;
	stream |= hstream;
	val *wv = hstream ? hv : stream ? &c->v[n->args[1]] : tcpl_dm_view(c, n->args[1]);
	val wvs = *wv;
	val *ov = tcpl_out_val(c, id, (moe_dtype)n->dtype);
	val ovs = *ov;
	int64_t M = an->shape[pos_a[1]], I = an->shape[pos_a[3]], O = wn->shape[pos_w[2]];
	/* a widened einsum whose casts are views of bf16 tensors contracts them
	 * as bf16 into its f32 accumulator: the same products, exact in f32, added
	 * in the same order, at a third of bf16x3's MACs (docs/tcp-isa.md 7.2) */
	int cdt = an->dtype;
	if (!widened_dtype(c, id, region || stream, &avs, &wvs, achunk, &cdt))
		return;
	cplan pl = plan_contract(c, M, O, I, cdt);
	if (swap && !stream) {
		int dimmap[TCP_MAXD];
		for (int k = 0; k < TCP_MAXD; k++)
			dimmap[k] = k;
		tcp_view a = mkview(&avs, an, an->rank, dimmap), w = mkview(&wvs, wn, wn->rank, dimmap);
		tcp_view d = mkview(&ovs, n, n->rank, dimmap);
		cplan ps = plan_contract(c, O, M, I, cdt); /* dst[o, m] = sum_i w[o, i] x[m, i] */
		emit_contract(c, id, &ps, &w, wvs.stride[pos_w[2]], wvs.stride[pos_w[3]], &a, avs.stride[pos_a[1]],
			avs.stride[pos_a[3]], &d, ovs.stride[pos_o[2]], ovs.stride[pos_o[1]], cdt, -1, false, 0, 0);
		c->p->router_macs += M * O * I;
		return;
	}
	int64_t nbat = cb >= 0 && !region ? an->shape[pos_a[0]] : 1;
	for (int64_t b = 0; b < nbat; b++) {
		int dimmap[TCP_MAXD];
		for (int k = 0; k < an->rank; k++)
			dimmap[k] = k;
		tcp_view a = mkview(&avs, an, an->rank, dimmap), w = mkview(&wvs, wn, wn->rank, dimmap);
		tcp_view d = mkview(&ovs, n, n->rank, dimmap);
		int64_t am = avs.stride[pos_a[1]], ai = avs.stride[pos_a[3]], wo = wvs.stride[pos_w[2]],
			wi = wvs.stride[pos_w[3]], dmm = ovs.stride[pos_o[1]], doo = ovs.stride[pos_o[2]];
		if (cb >= 0 && !region) {
			a.base += b * avs.stride[pos_a[0]];
			w.base += b * wvs.stride[pos_w[0]];
			d.base += b * ovs.stride[pos_o[0]];
		}
		int vreg = tcpl_valid_reg(c, id);
		int64_t f = tcpl_row_tile(M);
		if (vreg == R_ROWS && M > f) {
			/* a block's rows (lower_rows.c): a block of at most h rows, h = f,
			 * 4f, 16f, ... below B, runs a contraction planned for h rows,
			 * above f in two row tiles, [0, h / 2) and [h / 2, h) (it has more
			 * than h / 4 rows), the second guarded; a larger block the one
			 * planned for B, whole. With streamed weights the block is bound
			 * by the weight stream unless its rows make it MAC-bound: the
			 * rows past h / 2 (B / 2 for a block short of B) run in guarded
			 * tiles of h / 8 (docs/tcp-isa.md 7.4, "Fine row tiles") */
			uint32_t end[9 + TCP_MAX_UPPER];
			int ne = 0;
			for (int64_t h = f; h < M && ne < 8; h *= 4) {
				cplan ph = plan_contract(c, h, O, I, cdt);
				uint32_t more = tcpl_block_rows_guard(c, h);
				emit_contract(c, id, &ph, &a, am, ai, &w, wo, wi, &d, dmm, doo, cdt, vreg, stream,
					h > f ? h / 2 : 0, stream && h > f ? h / 8 : 0);
				end[ne++] = jmp(c);
				patch(c, more);
			}
			int64_t up[TCP_MAX_UPPER]; /* weights held in DM: classes up to B (row_classes.c) */
			int nu = !stream && tcpl_upper_rows(c) ? tcp_upper_classes(M, f, up, TCP_MAX_UPPER) : 0;
			for (int k = 0; k < nu; k++) {
				cplan pu = plan_contract(c, up[k], O, I, cdt);
				uint32_t more = tcpl_block_rows_guard(c, up[k]);
				emit_contract(c, id, &pu, &a, am, ai, &w, wo, wi, &d, dmm, doo, cdt, vreg, false, 0, 0);
				end[ne++] = jmp(c);
				patch(c, more);
			}
			if (stream && M >= 4 * f) {
				li(c, R_ROWT, M);
				uint32_t full = br(c, TCP_C_GE, R_ROWS, R_ROWT);
				emit_contract(c, id, &pl, &a, am, ai, &w, wo, wi, &d, dmm, doo, cdt, vreg, stream, M / 2,
					M / 8);
				end[ne++] = jmp(c);
				patch(c, full);
			}
			emit_contract(c, id, &pl, &a, am, ai, &w, wo, wi, &d, dmm, doo, cdt, vreg, stream, 0, 0);
			for (int k = 0; k < ne; k++)
				patch(c, end[k]);
		} else {
			bool tiles = vreg >= 0 && vreg != R_ROWS && tcpl_tile_outside(c, id);
			c->achunk = achunk;
			emit_contract(c, id, &pl, &a, am, ai, &w, wo, wi, &d, dmm, doo, cdt, vreg, stream,
				tiles ? tcpl_row_tile(M) : 0, 0);
			c->achunk = NULL;
		}
	}
	if (achunk) /* read by these contractions only (program order orders the reuse) */
		free_rows(c, achunk, (pl.I + pl.It - 1) / pl.It);
	if (!region)
		c->p->router_macs += nbat * M * O * I;
	else
		c->p->nproj += tcpl_region_projections(c, id);
}
