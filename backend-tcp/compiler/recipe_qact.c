/* backend-tcp/compiler/recipe_qact.c: sched-build's recipe for a block
 * einsum `[M, I] x dequant [O, I] -> [M, O]` whose activations are quantized
 * (docs/tcp-isa.md 7.10): act=fp8 here, W8A8 (act="int8") below. act=fp8 is
 * DeepSeek-V3's fp8_gemm. The dequant
 * emits nothing (sb_dequant leaves its value unset); the contraction reads
 * the expert's fp8 bytes q [O, I] from their per-block buffer straight into
 * TRF and its block scales s [O/128, I/128] in place:
 *   sa[m, c]   = max_i |x[m, 128c + i]| / 448            tu.vec: f.abs, r.fmax, d.div
 *   xq[m, i]   = e4m3(x[m, i] / sa[m, i / 128])          tu.vec: d.div; the commit rounds to e4m3
 *   C[m, c, o] = sa[m, c] x s[o / 128, c]                 tu.vec: f.mul per weight block, then a copy
 *   y[m, o]    = sum_c C[m, c, o] x sum_{i in c} xq[m, i] q[o, i]   tu.contract flags=scaled
 * The passes and their steps are those of docs/tcp-isa.md 7.10. A scaled
 * contraction takes no partial sum (no acc), so one command sums the chunks
 * of its reduction in chunk order; the reduction is one command, or (where
 * fp8_split predicts it shorter: few TRF rows per slice starve the MACs) cut
 * into parts of whole chunks, each contracted into an f32 partial, the
 * partials added in part order by vector passes: y's rounding then depends
 * on that cut, not on the tiling over O. Two einsums that read the
 * same activation (gate and up) share its sa and xq (the first one makes
 * them); each makes its own C. In a loop body a node masked by the block's
 * rows computes them under valid=$rows. */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"
#include "backend-tcp/isa/cost.h"
#include "ir/quant.h"

/* QA_MAX_PARTS: the most parts an act=fp8 contraction's reduction is cut
 * into (fp8_split) */
enum { QA_CHUNK = 128, QA_MAX_PARTS = 16 };

static tcp_view buf_view(ts_id t, int nd, const int64_t *st)
{
	return tcp_b_view((int32_t)t, 0, nd, st);
}

static tcp_insn pass(sb *b, moe_id id, int nd, const int64_t *dim)
{
	tcp_insn in = tcp_insn_init(TCP_OP_TU_VEC);
	in.ndim = (uint8_t)nd;
	for (int k = 0; k < nd; k++)
		in.dim[k] = dim[k];
	in.vreg = SBN(b, id)->valid != MOE_NONE ? (int32_t)b->rows : -1;
	in.flags = TCP_F_ROUTE; /* the slices' bytes by the switch stage, as every recipe's passes */
	return in;
}

static void step(tcp_insn *in, tcp_vop op, int x, int y, uint32_t imm)
{
	tcp_b_step(in, (uint8_t)op, (uint8_t)x, (uint8_t)y, imm);
}

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static bool fp8_dequant(const moe_graph *g, const ir_node *n, qt_info *qi)
{
	return ir_dequant_info(g, n, qi) && !strcmp(ir_attr_str(n, "act", "bf16"), "fp8") && qi->fmt == QT_FP8 &&
	       qi->bn == QA_CHUNK && qi->bk == QA_CHUNK && qi->N % QA_CHUNK == 0 && qi->K % QA_CHUNK == 0 &&
	       n->nargs == 2;
}

static bool fp8_weight(const sb *b, moe_id d, qt_info *qi)
{
	return fp8_dequant(b->g, SBN(b, d), qi);
}

/* sb_qact_dequant on g (act=fp8 also on the top graph: tcp-split-weights) */
static bool qact_dequant(const moe_graph *g, moe_id d, const char **act)
{
	const ir_node *n = &g->nodes[d];
	qt_info qi;
	if (n->op != MOE_OP_DEQUANT || !ir_dequant_info(g, n, &qi))
		return false;
	const char *a = ir_attr_str(n, "act", "bf16");
	if (act)
		*act = a;
	bool i8 = !strcmp(a, "int8") && qi.fmt == QT_INT8 && qi.bn == 1 && qi.bk == qi.K && g->is_body;
	if (!i8 && !fp8_dequant(g, n, &qi))
		return false;
	for (moe_id u = d + 1; u < g->nnodes; u++) {
		const ir_node *un = &g->nodes[u];
		for (uint32_t k = 0; k < un->nargs; k++)
			if (un->args[k] == d && (un->op != MOE_OP_EINSUM || k != 1 || un->nargs != 2))
				return false;
	}
	return true;
}

/* Whether dequant d of a loop body is contracted with quantized activations:
 * act="fp8" on block FP8 in 128 x 128 blocks dividing N and K, or act="int8"
 * on per-channel int8, read only as the weight of two-operand einsums (an
 * act=fp8 dequant read otherwise is dequantized in DM). */
bool sb_qact_dequant(const sb *b, moe_id d, const char **act)
{
	return qact_dequant(b->g, d, act);
}

/* The loop operand index of the scales that body dequant d reads (a
 * blockarg), else -1. */
static int64_t scale_operand(const moe_graph *bg, moe_id d)
{
	const ir_node *n = &bg->nodes[d];
	const ir_node *s = n->nargs > 1 && n->args[1] != MOE_NONE ? &bg->nodes[n->args[1]] : NULL;
	if (!s || s->op != MOE_OP_BLOCKARG || ir_blockarg_role_of(s) != IR_BA_IN)
		return -1;
	return ir_attr_int(s, "index", -1);
}

/* Block scales staged whole (docs/tcp-isa.md 7.10): when the act=fp8 dequants'
 * scale operands of the loop take at most 4 MiB together, each is copied into
 * DM once before the loop (at few blocks gathered: recipe_qgather.c) and read at
 * $e, so no block fetches a scale (each fetch a DMA setup on the weights' context). */
enum { QA_STAGE_BYTES = 4 << 20 };

/* W8A8's per-channel scales ws [E, O, 1] staged whole as a table [2 E O]:
 * expert e's scales at e O and a slot for the block's row factors R at E O +
 * e O, so a scaled i8 contraction divides ws by R itself (flags=rowdiv:
 * both factors read through one view, docs/tcp-isa.md 6), no C pass; when
 * the loop's int8 scale operands take at most 2 MiB together (the tables
 * twice that) and every weight has at least as many rows as a block (the
 * slot holds the block's M rows). */
enum { QA_STAGE_W8A8_BYTES = 2 << 20 };

static const char QA_TABLE[] = "w8a8.dscale";

static bool stage_w8a8(sb *b, const moe_graph *bg, moe_id loop, uint32_t k, ts_id e, sb_val *out)
{
	const ir_node *ln = SBN(b, loop);
	const char *kinds = ir_attr_str(ln, "kinds", "");
	int64_t bytes = 0;
	bool mine = false, fit = true;
	for (moe_id d = 0; d < bg->nnodes; d++) {
		const char *act = "bf16";
		int64_t j = qact_dequant(bg, d, &act) && !strcmp(act, "int8") ? scale_operand(bg, d) : -1;
		if (j < 0 || j >= (int64_t)strlen(kinds) || kinds[j] != 'e')
			continue;
		const ir_node *sn = SBN(b, ln->args[3 + j]);
		bytes += ir_bytes(sn);
		mine |= j == (int64_t)k;
		for (moe_id u = d + 1; u < bg->nnodes; u++) /* the einsums' rows against the weight's */
			if (bg->nodes[u].op == MOE_OP_EINSUM && bg->nodes[u].nargs == 2 && bg->nodes[u].args[1] == d)
				fit &= bg->nodes[u].rank == 2 && bg->nodes[u].shape[0] <= bg->nodes[d].shape[0];
		fit &= sn->rank == 3 && sn->shape[2] == 1 && sn->dtype == MOE_F32;
	}
	moe_id w = ln->args[3 + k];
	const sb_val *v = &b->v[w];
	if (!mine || !fit || bytes > QA_STAGE_W8A8_BYTES || v->kind != SV_VIEW || v->reg != TS_NONE ||
		v->stride[0] != SBN(b, w)->shape[1] || v->stride[1] != 1)
		return false;
	const ir_node *wn = SBN(b, w);
	int64_t EO = wn->shape[0] * wn->shape[1];
	if (b->dmv[w].kind != SV_VIEW) { /* the table and the copy, once */
		const int64_t n2 = 2 * EO, one[1] = {1};
		ts_id t = sb_dm_buf(b, w, QA_TABLE, MOE_F32, 1, &n2);
		tcp_insn in = tcp_b_dma_copy(1, &EO, buf_view(t, 1, one), sb_view_at(v, 0, 1, one));
		sb_emit(b, &in, w);
		b->dmv[w] = *v;
		b->dmv[w].buf = t;
		b->dmv[w].base = 0;
	}
	if (out) {
		*out = b->dmv[w];
		out->reg = e;
		out->scale = wn->shape[1];
		memmove(out->stride, out->stride + 1, sizeof(int64_t) * (MOE_MAX_RANK - 1));
	}
	return true;
}

bool sb_qact_stage(sb *b, const moe_graph *bg, moe_id loop, uint32_t k, ts_id e, sb_val *out)
{
	if (stage_w8a8(b, bg, loop, k, e, out))
		return true;
	const ir_node *ln = SBN(b, loop);
	const char *kinds = ir_attr_str(ln, "kinds", "");
	int64_t bytes = 0;
	bool mine = false;
	for (moe_id d = 0; d < bg->nnodes; d++) {
		const char *act = "bf16";
		int64_t j = qact_dequant(bg, d, &act) && !strcmp(act, "fp8") ? scale_operand(bg, d) : -1;
		if (j < 0 || j >= (int64_t)strlen(kinds) || kinds[j] != 'e')
			continue;
		bytes += ir_bytes(SBN(b, ln->args[3 + j]));
		mine |= j == (int64_t)k;
	}
	if (!mine || bytes > QA_STAGE_BYTES)
		return false;
	if (sb_qact_gather(b, loop, ln->args[3 + k], e, out))
		return true;
	const sb_val *v = sb_dm_val(b, ln->args[3 + k]); /* the copy, once: later calls find it */
	if (!v || !out)
		return true;
	*out = *v;
	out->reg = e;
	out->scale = v->stride[0];
	memmove(out->stride, v->stride + 1, sizeof(int64_t) * (MOE_MAX_RANK - 1));
	return true;
}

/* The scratch buffer named name that an earlier einsum of the body with
 * quantized activations made for activation a (the first einsum that reads
 * it), else TS_NONE. */
static ts_id shared_buf(const sb *b, moe_id id, const char *name)
{
	moe_id a = SBN(b, id)->args[0];
	for (moe_id p = 0; p < id; p++) {
		const ir_node *pn = SBN(b, p);
		if (pn->op != MOE_OP_EINSUM || pn->nargs != 2 || pn->args[0] != a || !sb_qact_dequant(b, pn->args[1], NULL))
			continue;
		for (ts_id t = b->s->nbuf; t-- > 0;)
			if (b->s->buf[t].node == p && b->s->buf[t].name && !strcmp(b->s->buf[t].name, name))
				return t;
		return TS_NONE;
	}
	return TS_NONE;
}

/* sa and xq of activation x [M, I]: two passes (the division needs the
 * finished maximum); the commit's cast to e4m3 rounds to nearest even. */
static void quantize(sb *b, moe_id id, const sb_val *x, int64_t M, int64_t I, ts_id *sa, ts_id *xq)
{
	int64_t nk = I / QA_CHUNK;
	const int64_t shs[2] = {M, nk}, shx[2] = {M, I}, dim[3] = {M, nk, QA_CHUNK};
	const int64_t xs[3] = {x->stride[0], QA_CHUNK * x->stride[1], x->stride[1]};
	const int64_t sas[3] = {nk, 1, 0}, xqs[3] = {I, QA_CHUNK, 1};
	*sa = sb_dm_buf(b, id, "act.scale", MOE_F32, 2, shs);
	*xq = sb_dm_buf(b, id, "act.fp8", MOE_F8E4M3, 2, shx);
	tcp_insn p1 = pass(b, id, 3, dim);
	p1.v[TCP_V_S0] = sb_view_at(x, 0, 3, xs);
	p1.v[TCP_V_DST] = buf_view(*sa, 3, sas);
	step(&p1, TCP_V_FABS, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p1, TCP_V_FRMAX, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p1, TCP_V_FDIV, TCP_SRC_V, TCP_SRC_IMM, fbits(448.0f));
	sb_emit(b, &p1, id);
	tcp_insn p2 = pass(b, id, 3, dim);
	p2.v[TCP_V_S0] = sb_view_at(x, 0, 3, xs);
	p2.v[TCP_V_S1] = buf_view(*sa, 3, sas);
	p2.v[TCP_V_DST] = buf_view(*xq, 3, xqs);
	step(&p2, TCP_V_FDIV, TCP_SRC_V, TCP_SRC_S1, 0);
	sb_emit(b, &p2, id);
}

static void rows_layout(sb *b, ts_id t);

/* C[m, c, o] = sa[m, c] x s[o / 128, c] of a scaled f8 contraction, made
 * where its parts read it: first the distinct products Cs[m, c, o / 128]
 * for every chunk (one pass over 1/128 of C, before the contraction), then,
 * before the first part of each group of gp parts, a copy of the group's
 * chunks to their 128 outputs each, C_g [M, chunks, O] (a pass without ALU
 * steps: the lane words unchanged, at the integer rate, its one stream read
 * once per 128 outputs), so that the operands repeat along the innermost
 * loop. Groups bound C's DM to a third of each slice's (the weights'
 * double buffers take most of the rest at DeepSeek-V3's paired gate and
 * up); one group is C whole. C's bits are the products'. gp = 0: v is the
 * scales' view for every part (W8A8). */
typedef struct qa_cs {
	tcp_view v;
	ts_id Cs;
	int64_t M, O, nk, kp, gp, P;
} qa_cs;

static qa_cs chunk_products(sb *b, moe_id id, ts_id sa, const sb_val *s, int64_t M, int64_t O, int64_t nk)
{
	int64_t nb = O / QA_CHUNK;
	const int64_t shs[3] = {M, nk, nb}, sas[3] = {nk, 1, 0}, ss[3] = {0, s->stride[1], s->stride[0]};
	const int64_t css[3] = {nk * nb, nb, 1};
	qa_cs c = {tcp_view_none(), sb_dm_buf(b, id, "fp8.bscale", MOE_F32, 3, shs), M, O, nk, nk, 1, 1};
	/* the copies give each slice 1/S of C in order and read the products
	 * of those outputs: both laid out in parts, they need no switch */
	rows_layout(b, c.Cs);
	tcp_insn in = pass(b, id, 3, shs);
	in.v[TCP_V_S0] = buf_view(sa, 3, sas);
	in.v[TCP_V_S1] = sb_view_at(s, 0, 3, ss);
	in.v[TCP_V_DST] = buf_view(c.Cs, 3, css);
	step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	sb_emit(b, &in, id);
	return c;
}

/* The scales' view [m, o, chunk] at part p's first chunk; at a group's
 * first part, the group's copy first. */
static tcp_view part_scales(sb *b, moe_id id, qa_cs *c, int64_t p)
{
	if (!c->gp)
		return c->v;
	int64_t nb = c->O / QA_CHUNK, g0 = p - p % c->gp, nc = (c->P - g0 < c->gp ? c->P - g0 : c->gp) * c->kp;
	if (p == g0) {
		const int64_t shc[3] = {c->M, nc, c->O}, dim[4] = {c->M, nc, nb, QA_CHUNK};
		const int64_t cw[4] = {c->nk * nb, nb, 1, 0}, cs[4] = {nc * c->O, c->O, QA_CHUNK, 1}, v[3] = {nc * c->O, 1, c->O};
		ts_id C = sb_dm_buf(b, id, "fp8.scale", MOE_F32, 3, shc);
		rows_layout(b, C);
		tcp_insn cp = pass(b, id, 4, dim);
		cp.v[TCP_V_S0] = buf_view(c->Cs, 4, cw);
		cp.v[TCP_V_S0].base = g0 * c->kp * nb;
		cp.v[TCP_V_DST] = buf_view(C, 4, cs);
		sb_emit(b, &cp, id);
		c->v = buf_view(C, 3, v);
	}
	tcp_view r = c->v;
	r.base += (p - g0) * c->kp * c->O;
	return r;
}

/* The tiling of a scaled contraction: the whole reduction in one TRF tile,
 * as many rows per slice as the planner would take within that. */
static cplan qa_plan(const sb *b, int64_t M, int64_t O, int64_t I, moe_dtype dt)
{
	cplan pl = tcp_plan_contract(b->m, M, O, I, dt, NULL);
	if (pl.It < I) {
		int64_t os = tcp_trf_bytes(b->m) / 2 / I;
		pl.Os = os < 1 ? 1 : os < O ? os : O;
		pl.It = I;
		pl.Opass = O < b->S * pl.Os ? O : b->S * pl.Os;
	}
	return pl;
}

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* The tiling of a scaled i8 x i8 contraction y [M, O] = xq [M, I] w^T
 * (W8A8; the whole reduction in one TRF tile, the scale being per output):
 * the TRF rows per slice whose main-context pass is the shortest by the cost
 * rules of docs/tcp-isa.md section 10 (the MACs, the streamed rows, the
 * commit with its scales, and the switch's bytes: every slice of a row group
 * streams the group's rows), at most half the TRF. The sub context's loads of the next tile
 * overlap the pass, so they are not weighed. ob: bytes per output. */
static cplan w8a8_plan(const sb *b, int64_t M, int64_t O, int64_t I, int64_t ob)
{
	const moe_tcp_machine *m = b->m;
	cplan pl = qa_plan(b, M, O, I, MOE_I8);
	int64_t S = tcp_slices(m), best = 0, best_t = -1;
	for (int64_t os = 1; os <= O && os * I <= tcp_trf_bytes(m) / 2; os++) {
		int64_t cg = cdiv(O, os), R = S / cg > 0 ? S / cg : 1, bs = cdiv(M, R), tiles = cdiv(cg, S);
		int64_t mac = tiles * cdiv(bs * os * I, m->lanes_per_slice * m->macs_per_lane[TCP_MT_I8]);
		int64_t stream = tiles * cdiv(bs * I, m->stream_bytes_per_cycle);
		int64_t commit = tiles * cdiv(bs * os * (ob + 4), m->fetch_bytes);
		int64_t route = tiles * cdiv(bs * I + bs * os * (ob + 4), m->switch_bytes_per_cycle);
		int64_t t = mac > stream ? mac : stream;
		t = t > commit ? t : commit;
		t = t > route ? t : route;
		if (best_t < 0 || t < best_t) {
			best_t = t;
			best = os;
		}
	}
	if (best > 0) {
		pl.It = I;
		pl.Os = best;
		pl.Opass = O < S * best ? O : S * best;
	}
	return pl;
}

/* The TRF tiles of 1-byte [Opass, I] tiles (sb_trf_tiles). */
static void qa_trf(sb *b, moe_id id, const cplan *pl, moe_dtype dt, ts_id *trf)
{
	int64_t nload = (pl->O + pl->Opass - 1) / pl->Opass * (pl->I / pl->It), sh[2] = {pl->Opass, pl->It};
	sb_trf_tiles(b, id, nload, pl->Os, dt, sh, trf);
}

/* y = xq q^T scaled by C (views over (m, o, chunk)): per part of the
 * reduction (pl->It elements; one part unless fp8_split cut it) and per pass
 * of O a sub load of q's rows and one scaled contraction, part p into d[p]. */
static void contract(sb *b, moe_id id, const cplan *pl, const ts_id *trf, const sb_val *q, tcp_view xq, qa_cs *cs,
	const sb_val *const *d, bool rowdiv)
{
	ts_id first[2] = {TS_NONE, TS_NONE}, last[2] = {TS_NONE, TS_NONE};
	int64_t I = pl->It;
	int k = 0;
	for (int64_t i0 = 0, p = 0; i0 < pl->I && !b->failed; i0 += I, p++)
		for (int64_t o0 = 0; o0 < pl->O && !b->failed; o0 += pl->Opass) {
			int64_t on = pl->O - o0 < pl->Opass ? pl->O - o0 : pl->Opass;
			int cur = k;
			k = trf[1] != TS_NONE ? k ^ 1 : 0;
			const int64_t ld_dim[2] = {on, I}, ld_st[2] = {I, 1}, qs[2] = {q->stride[0], q->stride[1]};
			tcp_insn ld = tcp_b_ldtrf(2, ld_dim, buf_view(trf[cur], 2, ld_st),
				sb_view_at(q, o0 * q->stride[0] + i0 * q->stride[1], 2, qs), true);
			tcp_view s2 = o0 ? cs->v : part_scales(b, id, cs, p), a = xq;
			if (o0 && cs->gp)
				s2.base += (p % cs->gp) * cs->kp * cs->O;
			ts_id lo = sb_emit(b, &ld, id);
			if (first[cur] == TS_NONE)
				first[cur] = lo;
			const int64_t cdim[3] = {pl->M, on, I}, ts[3] = {0, I, 1}, ds[2] = {d[p]->stride[0], d[p]->stride[1]};
			int64_t cst = s2.stride[1];
			s2.base += o0 * cst;
			a.base += i0 * xq.stride[2];
			if (rowdiv) /* the row factors stay where they are */
				s2.stride[2] -= o0 * cst;
			tcp_insn in = tcp_b_contract(cdim, sb_view_at(d[p], o0 * d[p]->stride[1], 2, ds), a,
				buf_view(trf[cur], 3, ts), tcp_view_none(), pl->Os < on ? pl->Os : on);
			in.v[TCP_V_S2] = s2;
			in.flags = TCP_F_SCALED | TCP_F_ROUTE | (rowdiv ? TCP_F_ROWDIV : 0);
			in.vreg = SBN(b, id)->valid != MOE_NONE ? (int32_t)b->rows : -1;
			last[cur] = sb_emit(b, &in, id);
		}
	for (int t = 0; t < 2; t++)
		if (trf[t] != TS_NONE && first[t] != TS_NONE) {
			b->s->buf[trf[t]].life = TS_LIFE_SPAN;
			b->s->buf[trf[t]].first = first[t];
			b->s->buf[trf[t]].last = last[t];
		}
}

/* The main context's cycles of the scaled f8 contractions of one part of
 * pl's reduction (pl->It elements; every operand over the switch, as the
 * recipe's passes take them), by the cost rules of docs/tcp-isa.md 10.
 * ob: bytes per output committed. */
static int64_t part_cycles(const sb *b, const tcp_cm *cm, const cplan *pl, int64_t ob)
{
	int64_t S = b->S, total = 0, out = ob + 4 * (pl->It / QA_CHUNK);
	for (int64_t o0 = 0; o0 < pl->O; o0 += pl->Opass) {
		int64_t on = pl->O - o0 < pl->Opass ? pl->O - o0 : pl->Opass, t = pl->Os < on ? pl->Os : on;
		int64_t cg = cdiv(on, t), R = S / cg > 0 ? S / cg : 1, bs = cdiv(pl->M, R);
		tcp_mm_load l = {bs, t, pl->It, cdiv(cg, S), TCP_MT_F8, false, 1, out, bs * pl->It + bs * t * out,
			S < cg * R ? S : cg * R, false};
		total += tcp_cost_contract(cm, &l).total + tcp_cost_issue(cm, TCP_CTX_MAIN);
	}
	return total;
}

/* The cycles of one pass adding two f32 [M, O] values into ob-byte outputs. */
static int64_t add_cycles(const sb *b, const tcp_cm *cm, int64_t M, int64_t O, int64_t ob)
{
	int64_t lw = b->m->flit_bytes / 4, units = cdiv(M * O, lw), used = units < b->S ? units : b->S;
	int64_t pe = cdiv(units, used) * lw, rd = cdiv(pe * 4, b->m->fetch_bytes);
	tcp_vec_load l = {pe, true, 1, 2 * rd, 2, cdiv(pe * ob, b->m->fetch_bytes), pe * (8 + ob), used, false};
	return tcp_cost_vec(cm, &l).total + tcp_cost_issue(cm, TCP_CTX_MAIN);
}

/* The tiling of an act=fp8 contraction [M, O, I]: the whole reduction in one
 * TRF tile (qa_plan), or cut into parts of whole 128-chunks contracted into
 * f32 partials that passes then add in part order, with the parts and the
 * TRF rows per slice (at most half the TRF) whose predicted main-context
 * time is the shortest (few TRF rows per slice leave the contraction waiting
 * on its streamed rows; rows that leave slices idle put more outputs, each
 * with its chunks' scales, on the others). A part's sum is the same chunk-ordered sum over its chunks;
 * the parts' sums are added in order, so the cut changes y's rounding only
 * by that association. ob: the output's bytes. */
static cplan fp8_split(const sb *b, int64_t M, int64_t O, int64_t I, int64_t ob)
{
	tcp_cm cm;
	tcp_cm_init(&cm, b->m);
	cplan best = qa_plan(b, M, O, I, MOE_F8E4M3);
	int64_t nk = I / QA_CHUNK, half = tcp_trf_bytes(b->m) / 2, best_t = part_cycles(b, &cm, &best, ob);
	for (int64_t P = 1; P <= nk && P <= QA_MAX_PARTS; P++) {
		int64_t It = I / P, most = half / It < O ? half / It : O;
		for (int64_t os = 1; os <= most && nk % P == 0; os++) {
			cplan pl = best;
			pl.It = It;
			pl.Os = os;
			pl.Opass = O < b->S * os ? O : b->S * os;
			int64_t t = P * part_cycles(b, &cm, &pl, P > 1 ? 4 : ob) + (P - 1) * add_cycles(b, &cm, M, O, ob);
			if (t < best_t) {
				best_t = t;
				best = pl;
			}
		}
	}
	return best;
}

/* Buffer t laid out in parts, slice s holding bytes [s p, (s + 1) p), when
 * that is where a pass over all of it (which gives each slice 1/S of the
 * elements in order) reads and writes them, so that the passes adding the
 * partials need no switch for it; else left spread. */
static void rows_layout(sb *b, ts_id t)
{
	ts_buf *tb = &b->s->buf[t];
	int64_t bytes = ts_buf_numel(tb) * (int64_t)moe_dtype_size((moe_dtype)tb->dtype);
	if (tb->slots == 1 && bytes % (b->S * b->m->flit_bytes) == 0) {
		tb->layout.split = TS_SPLIT_ROWS;
		tb->layout.slice_bytes = bytes / b->S;
	}
}

/* An f32 [M, O] partial or running sum (rows_layout). */
static ts_id sum_buf(sb *b, moe_id id, const char *name, const int64_t *sh)
{
	ts_id t = sb_dm_buf(b, id, name, MOE_F32, 2, sh);
	rows_layout(b, t);
	return t;
}

static void fp8_einsum(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *an = SBN(b, n->args[0]), *dn = SBN(b, n->args[1]);
	int64_t M = an->shape[0], I = an->shape[1], O = dn->shape[0], nk = I / QA_CHUNK;
	const sb_val *q = sb_dm_val(b, dn->args[0]);
	const sb_val *s = q ? sb_dm_val(b, dn->args[1]) : NULL;
	const sb_val *x = s ? sb_dm_val(b, n->args[0]) : NULL;
	if (!x)
		return;
	cplan pl = fp8_split(b, M, O, I, (int64_t)moe_dtype_size((moe_dtype)n->dtype));
	if (pl.Os * pl.It > tcp_trf_bytes(b->m) / 2) {
		sb_err(b, id, "act=fp8: a reduction of %lld does not fit half of TRF", (long long)I);
		return;
	}
	ts_id sa = shared_buf(b, id, "act.scale"), xq = shared_buf(b, id, "act.fp8");
	if (sa == TS_NONE || xq == TS_NONE)
		quantize(b, id, x, M, I, &sa, &xq);
	qa_cs cs = chunk_products(b, id, sa, s, M, O, nk);
	int64_t P = I / pl.It, part_bytes = M * (pl.It / QA_CHUNK) * O * 4 / b->S;
	cs.kp = pl.It / QA_CHUNK;
	cs.P = P;
	cs.gp = tcp_dm_grant(b->m, TCP_DM_PARTIALS) / b->S / (part_bytes > 0 ? part_bytes : 1);
	cs.gp = cs.gp < 1 ? 1 : cs.gp > P ? P : cs.gp;
	const sb_val *d = sb_out_val(b, id);
	if (P > 1)
		rows_layout(b, d->buf);
	const sb_val *dst[QA_MAX_PARTS] = {0};
	sb_val part[QA_MAX_PARTS] = {0};
	const int64_t shp[2] = {M, O};
	for (int64_t p = 0; p < P; p++) {
		part[p] = P == 1 ? *d : sb_view_of(sum_buf(b, id, "fp8.part", shp), n);
		dst[p] = &part[p];
	}
	ts_id trf[2];
	qa_trf(b, id, &pl, MOE_F8E4M3, trf);
	const int64_t xs[3] = {I, 0, 1};
	contract(b, id, &pl, trf, q, buf_view(xq, 3, xs), &cs, dst, false);
	/* y = ((p0 + p1) + p2) ...: each running sum in a buffer of its own, the
	 * last into y */
	const int64_t st[2] = {O, 1};
	sb_val acc = part[0];
	for (int64_t p = 1; p < P && !b->failed; p++) {
		sb_val sum = p == P - 1 ? *d : sb_view_of(sum_buf(b, id, "fp8.sum", shp), n);
		tcp_insn in = pass(b, id, 2, shp);
		in.v[TCP_V_S0] = sb_view_at(&acc, 0, 2, st);
		in.v[TCP_V_S1] = sb_view_at(&part[p], 0, 2, st);
		in.v[TCP_V_DST] = sb_view_at(&sum, 0, 2, st);
		step(&in, TCP_V_FADD, TCP_SRC_V, TCP_SRC_S1, 0);
		sb_emit(b, &in, id);
		acc = sum;
	}
}

/* ---- W8A8 (act="int8"): int8 activations per token, i8 x i8 contractions ----
 * blockwise-dispatch writes the reference's activation quantization on the
 * block rows xf: m = max(max_i |xf[r, i]|, 1e-10), x' = round(xf 127 / m) x
 * m / 127, and the einsum contracts x' with the dequantized int8 weight. The
 * chain is not read node by node: per block
 *   R[r]    = c.fmin(d.div(127, r.fmax(f.abs(xf))), f32(127 / 1e-10))  (m < 1e-10 exactly when R exceeds it)
 *   v[r, i] = xf R
 *   xq      = i8(ftoi(v + copysign(0.5 - 2^-25, v)))   (half away from zero, exact for |v| <= 127)
 *   C[r, o] = ws[o] / R[r]                              (docs/semantics.md: W8A8 on TCP)
 *   y[r, o] = f32(sum_i xq[r, i] q[o, i]) x C[r, o]     (tu.contract flags=scaled, i8 x i8)
 * R and xq are shared by the einsums that read the same x' (gate and up). */

/* *xf: the block rows the W8A8 chain ending at a quantizes (f32); false when
 * a is not that chain. */
static bool w8a8_chain(const sb *b, moe_id a, moe_id *xf)
{
	const ir_node *n = SBN(b, a);
	if (n->op == MOE_OP_CAST)
		n = SBN(b, n->args[0]);
	if (n->op != MOE_OP_MUL || n->nargs != 2)
		return false;
	const ir_node *s = SBN(b, n->args[SBN(b, n->args[1])->op != MOE_OP_DIV ? 0 : 1]);
	if (s->op != MOE_OP_DIV || s->nargs != 2)
		return false;
	const ir_node *m = SBN(b, s->args[0]);
	if (m->op != MOE_OP_MAX || m->nargs != 2)
		return false;
	const ir_node *r = SBN(b, m->args[SBN(b, m->args[0])->op != MOE_OP_REDUCE_MAX ? 1 : 0]);
	if (r->op != MOE_OP_REDUCE_MAX || SBN(b, r->args[0])->op != MOE_OP_ABS)
		return false;
	*xf = SBN(b, r->args[0])->args[0];
	return SBN(b, *xf)->dtype == MOE_F32 && SBN(b, *xf)->rank == 2;
}

/* The rows the passes read for block rows xf: x0 when xf = cast(x0) widens
 * bf16 to f32 (exact: the fetch widens it the same way), else xf. */
static moe_id rows_src(const sb *b, moe_id xf)
{
	const ir_node *n = SBN(b, xf);
	return n->op == MOE_OP_CAST && n->nargs == 1 && SBN(b, n->args[0])->dtype == MOE_BF16 &&
			       SBN(b, n->args[0])->rank == 2 ? n->args[0] : xf;
}

/* R [M] (into the view rv, strides [1, 0]) and xq [M, I] i8 of the block
 * rows x [M, I]: three passes. */
static void w8a8_quantize(sb *b, moe_id id, const sb_val *x, int64_t M, int64_t I, tcp_view rv, ts_id *xq)
{
	volatile float rmax = 127.0f; /* f32(127 / f32(1e-10)), rounded once as d.div rounds */
	rmax = rmax / 1e-10f;
	const int64_t shx[2] = {M, I}, xs[2] = {x->stride[0], x->stride[1]}, vs[2] = {I, 1};
	ts_id v = sb_dm_buf(b, id, "act.v", MOE_F32, 2, shx);
	*xq = sb_dm_buf(b, id, "act.i8", MOE_I8, 2, shx);
	tcp_insn p = pass(b, id, 2, shx);
	p.v[TCP_V_S0] = sb_view_at(x, 0, 2, xs);
	p.v[TCP_V_DST] = rv;
	step(&p, TCP_V_FABS, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p, TCP_V_FRMAX, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p, TCP_V_FDIV, TCP_SRC_IMM, TCP_SRC_V, fbits(127.0f));
	step(&p, TCP_V_FMIN, TCP_SRC_V, TCP_SRC_IMM, fbits(rmax));
	sb_emit(b, &p, id);
	p = pass(b, id, 2, shx);
	p.v[TCP_V_S0] = sb_view_at(x, 0, 2, xs);
	p.v[TCP_V_S1] = rv;
	p.v[TCP_V_DST] = buf_view(v, 2, vs);
	step(&p, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	sb_emit(b, &p, id);
	p = pass(b, id, 2, shx); /* v + copysign(0.5 - 2^-25, v), truncated */
	p.v[TCP_V_S0] = buf_view(v, 2, vs);
	p.v[TCP_V_DST] = buf_view(*xq, 2, vs);
	step(&p, TCP_V_FTLT, TCP_SRC_S0, TCP_SRC_IMM, 0);
	step(&p, TCP_V_SHL, TCP_SRC_V, TCP_SRC_IMM, 31);
	step(&p, TCP_V_IADD, TCP_SRC_V, TCP_SRC_IMM, fbits(0.5f - 0x1p-25f));
	step(&p, TCP_V_FADD, TCP_SRC_V, TCP_SRC_S0, 0);
	step(&p, TCP_V_FTOI, TCP_SRC_V, TCP_SRC_NONE, 0);
	sb_emit(b, &p, id);
}

/* The slot of einsum u's row factors in its weight's staged scale table
 * (stage_w8a8), as a view over [M] with strides [1, 0]; false when its
 * scales are not staged so. */
static bool rslot(sb *b, moe_id u, tcp_view *rv, int64_t *EO)
{
	const sb_val *s = &b->v[SBN(b, SBN(b, u)->args[1])->args[1]];
	if (s->kind != SV_VIEW || s->reg == TS_NONE || !b->s->buf[s->buf].name ||
		strcmp(b->s->buf[s->buf].name, QA_TABLE))
		return false;
	*EO = b->s->buf[s->buf].shape[0] / 2;
	const int64_t rs[2] = {1, 0};
	*rv = sb_view_at(s, *EO, 2, rs);
	return true;
}

/* The first einsum of the body that reads id's W8A8 activation (id itself
 * when none before it does). */
static moe_id first_reader(const sb *b, moe_id id)
{
	moe_id a = SBN(b, id)->args[0];
	for (moe_id p = 0; p < id; p++) {
		const ir_node *pn = SBN(b, p);
		if (pn->op == MOE_OP_EINSUM && pn->nargs == 2 && pn->args[0] == a && sb_qact_dequant(b, pn->args[1], NULL))
			return p;
	}
	return id;
}

/* ---- W8A8 quantized once per token (tcp-w8a8-act-once, loop form) ----
 * The body's activation is a = cast(mul(cast(q), as)): q the block's rows of
 * x.q, whose buffers hold i8 (the quantization below stores them so), as
 * their scales [M, 1]. The contraction reads q as fetched and scales by
 *   C[r, o] = as[r] x ws[o]                              (one pass per einsum)
 * as for the layer's input (docs/semantics.md:
 * W8A8 on TCP). *q, *as: the nodes; *qf, *mul: the chain's others. */
static bool once_chain(const sb *b, moe_id a, moe_id *q, moe_id *as, moe_id *qf, moe_id *mul)
{
	const ir_node *n = SBN(b, a);
	if (n->op != MOE_OP_CAST || n->nargs != 1 || SBN(b, n->args[0])->op != MOE_OP_MUL)
		return false;
	*mul = n->args[0];
	const ir_node *m = SBN(b, *mul);
	if (m->nargs != 2)
		return false;
	int k = SBN(b, m->args[0])->op == MOE_OP_CAST ? 0 : 1;
	*qf = m->args[k];
	*as = m->args[1 - k];
	const ir_node *c = SBN(b, *qf), *sn = SBN(b, *as);
	if (c->op != MOE_OP_CAST || c->nargs != 1 || c->dtype != MOE_F32 || sn->dtype != MOE_F32 || sn->rank != 2 ||
		sn->shape[1] != 1)
		return false;
	*q = c->args[0];
	const sb_val *v = &b->v[*q];
	return v->kind == SV_VIEW && b->s->buf[v->buf].dtype == MOE_I8;
}

/* The HBM tensor a staged scale table was copied from (stage_w8a8's copy),
 * as a view of [E, O]; false when there is none. */
static bool table_source(const sb *b, ts_id t, tcp_view *src)
{
	for (ts_id op = 0; op < b->s->nop; op++) {
		const tcp_insn *in = &b->s->op[op].in;
		if (in->op == TCP_OP_DMA_COPY && in->v[TCP_V_DST].t == (int32_t)t && in->v[TCP_V_S0].reg < 0 &&
			b->s->buf[in->v[TCP_V_S0].t].space == TCP_HBM) {
			*src = in->v[TCP_V_S0];
			return true;
		}
	}
	return false;
}

/* The columns of every C that the body's einsums make from the rows'
 * scales einsum id reads (gate's and up's O, or the pair's 2F). */
static int64_t once_cols(const sb *b, moe_id id)
{
	moe_id q, as, qf, mul, q2, as2;
	int64_t cols = 0;
	if (!once_chain(b, SBN(b, id)->args[0], &q, &as, &qf, &mul))
		return 0;
	for (moe_id p = 0; p < b->g->nnodes; p++) {
		const ir_node *pn = SBN(b, p);
		if (pn->op == MOE_OP_EINSUM && pn->nargs == 2 && pn->rank == 2 && sb_qact_dequant(b, pn->args[1], NULL) &&
			once_chain(b, pn->args[0], &q2, &as2, &qf, &mul) && as2 == as)
			cols += pn->shape[1];
	}
	return cols;
}

/* Every block's C = as x ws at once:
 * in the loop's prologue the block experts' channel scales are gathered
 * [G, O] (by the staged expert list, under nb), and block 0 makes C [G, M,
 * O] in one pass from the grid of the rows' scales, which the loop reads in
 * place; each
 * block's contraction reads its rows of C at $g. The same products as a
 * pass per block. Where the rows' scales are a DM grid, the weight's scales
 * a staged table and every C made from those rows' scales with its
 * gathered scales (once_cols), at 8/3 of their bytes (the rest of the loop
 * beside them: 3/8 of DM), fit DM. *cv: C's view for
 * the block. */
static bool once_bulk(sb *b, moe_id id, const sb_val *as, const sb_val *s, int64_t M, int64_t O, tcp_view *cv)
{
	if (!b->s->nloop || b->ctl[0].imm)
		return false;
	ts_loop *L = &b->s->loop[b->s->nloop - 1];
	int64_t G = L->G;
	tcp_view src;
	if (as->kind != SV_VIEW || as->reg != L->g || b->s->buf[as->buf].space != TCP_DM || as->scale != M * as->stride[0] ||
		s->kind != SV_VIEW || !b->s->buf[s->buf].name || strcmp(b->s->buf[s->buf].name, QA_TABLE) ||
		!table_source(b, s->buf, &src))
		return false;
	ts_demand d;
	memset(&d, 0, sizeof d);
	d.n = 1;
	d.bytes[0] = 4 * G * once_cols(b, id) * (M + 1) * 8 / 3;
	if (!tcp_dm_fits(b->m, &d))
		return false;
	ts_id body = b->rg;
	b->rg = L->prologue;
	const int64_t shw[2] = {G, O}, shc[3] = {G, M, O};
	ts_id wg = sb_dm_buf(b, id, "w8a8.wscale", MOE_F32, 2, shw), C = sb_dm_buf(b, id, "w8a8.scale", MOE_F32, 3, shc);
	b->s->buf[wg].life = b->s->buf[C].life = TS_LIFE_LOOP;
	int64_t E = ts_buf_numel(&b->s->buf[src.t]) / O;
	const int64_t gd[3] = {1, G, O}, ds[3] = {G * O, O, 1}, ss[3] = {E * O, O, 1}, is[2] = {G, 1};
	tcp_insn in = tcp_b_dma_gather(3, gd, buf_view(wg, 3, ds), tcp_b_view(src.t, src.base, 3, ss),
		tcp_b_view((int32_t)b->ctl[0].v.buf, b->ctl[0].v.base, 2, is), E);
	in.vreg = (int32_t)L->nb; /* blocks past nb: their experts unread, their rows zero */
	sb_emit(b, &in, id);
	/* the pass in block 0's body, so that a timing-only run skips its
	 * arithmetic (the scales' values) as it skips every block's */
	ts_id zero = ts_add_scalar(b->s, body, "zero", TS_SC_CONST, 0, TS_NONE, TS_NONE, 0);
	ts_id first = ts_add_scalar(b->s, body, "first", TS_SC_CMP, TCP_C_EQ, L->g, zero, 0);
	b->rg = ts_add_region(b->s, body, TS_RG_GUARD, first);
	const int64_t sa[3] = {as->scale, as->stride[0], 0}, sw[3] = {O, 0, 1}, cs[3] = {M * O, O, 1};
	tcp_insn p = pass(b, id, 3, shc);
	p.vreg = -1;
	p.v[TCP_V_S0] = tcp_b_view((int32_t)as->buf, as->base, 3, sa);
	p.v[TCP_V_S1] = buf_view(wg, 3, sw);
	p.v[TCP_V_DST] = buf_view(C, 3, cs);
	step(&p, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0); /* C = as x ws */
	sb_emit(b, &p, id);
	b->rg = body;
	const int64_t cb[3] = {O, 1, 0};
	*cv = buf_view(C, 3, cb);
	cv->reg = (int32_t)L->g;
	cv->scale = M * O;
	return true;
}

static void once_einsum(sb *b, moe_id id, moe_id qn, moe_id asn)
{
	const ir_node *n = SBN(b, id), *dn = SBN(b, n->args[1]);
	int64_t M = n->shape[0], O = n->shape[1], I = SBN(b, qn)->shape[1];
	const sb_val *q = sb_dm_val(b, dn->args[0]);
	const sb_val *s = q ? sb_dm_val(b, dn->args[1]) : NULL;
	const sb_val *x = s ? sb_dm_val(b, qn) : NULL;
	const sb_val *as = x ? sb_dm_val(b, asn) : NULL;
	if (!as)
		return;
	cplan pl = w8a8_plan(b, M, O, I, (int64_t)moe_dtype_size((moe_dtype)n->dtype));
	if (pl.Os * I > tcp_trf_bytes(b->m) / 2) {
		sb_err(b, id, "act=int8: a reduction of %lld does not fit half of TRF", (long long)I);
		return;
	}
	tcp_view cv;
	if (!once_bulk(b, id, as, s, M, O, &cv)) {
		const int64_t shc[2] = {M, O}, sa[2] = {as->stride[0], 0}, ss[2] = {0, s->stride[0]}, cs2[2] = {O, 1};
		const int64_t cs[3] = {O, 1, 0};
		ts_id C = sb_dm_buf(b, id, "w8a8.scale", MOE_F32, 2, shc);
		tcp_insn p = pass(b, id, 2, shc);
		p.v[TCP_V_S0] = sb_view_at(as, 0, 2, sa);
		p.v[TCP_V_S1] = sb_view_at(s, 0, 2, ss);
		p.v[TCP_V_DST] = buf_view(C, 2, cs2);
		step(&p, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0); /* C = as x ws */
		sb_emit(b, &p, id);
		cv = buf_view(C, 3, cs);
	}
	const sb_val *d = sb_out_val(b, id);
	ts_id trf[2];
	qa_trf(b, id, &pl, MOE_I8, trf);
	const int64_t xs[3] = {x->stride[0], 0, x->stride[1]};
	qa_cs cs = {cv, TS_NONE, 0, 0, 0, 0, 0, 1};
	contract(b, id, &pl, trf, q, sb_view_at(x, 0, 3, xs), &cs, &d, false);
}

static void w8a8_einsum(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *dn = SBN(b, n->args[1]);
	moe_id xf, qn, asn, qf, mul;
	if (once_chain(b, n->args[0], &qn, &asn, &qf, &mul)) {
		once_einsum(b, id, qn, asn);
		return;
	}
	if (!w8a8_chain(b, n->args[0], &xf)) {
		sb_refuse(b, id, "a W8A8 contraction whose activation is not the per-token int8 quantization");
		return;
	}
	int64_t M = n->shape[0], O = n->shape[1], I = SBN(b, xf)->shape[1], EO = 0;
	const sb_val *q = sb_dm_val(b, dn->args[0]);
	const sb_val *s = q ? sb_dm_val(b, dn->args[1]) : NULL;
	if (!s)
		return;
	/* R: in the first reader's table slot (staged scales), else a buffer */
	moe_id f = first_reader(b, id);
	tcp_view rv;
	bool slot = rslot(b, f, &rv, &EO), rowdiv = slot && f == id;
	ts_id xq = shared_buf(b, id, "act.i8");
	if (!slot) {
		ts_id R = shared_buf(b, id, "act.inv");
		const int64_t sh1[1] = {M}, rs[2] = {1, 0};
		if (R == TS_NONE)
			R = sb_dm_buf(b, id, "act.inv", MOE_F32, 1, sh1);
		rv = buf_view(R, 2, rs);
	}
	if (f == id) {
		const sb_val *x = sb_dm_val(b, rows_src(b, xf));
		if (!x)
			return;
		w8a8_quantize(b, id, x, M, I, rv, &xq);
	} else if (xq == TS_NONE) {
		sb_err(b, id, "W8A8: the quantized rows of the einsum before are missing");
		return;
	}
	cplan pl = w8a8_plan(b, M, O, I, (int64_t)moe_dtype_size((moe_dtype)n->dtype));
	if (pl.Os * I > tcp_trf_bytes(b->m) / 2) {
		sb_err(b, id, "act=int8: a reduction of %lld does not fit half of TRF", (long long)I);
		return;
	}
	tcp_view cv;
	if (rowdiv) { /* col[o] = ws[o], row[m] = R[m] in the slot, E O further */
		const int64_t cst[3] = {1, s->stride[0], EO};
		cv = sb_view_at(s, 0, 3, cst);
	} else {
		const int64_t shc[2] = {M, O}, ss[2] = {0, s->stride[0]}, cs2[2] = {O, 1}, cs[3] = {O, 1, 0};
		ts_id C = sb_dm_buf(b, id, "w8a8.scale", MOE_F32, 2, shc);
		tcp_insn p = pass(b, id, 2, shc);
		p.v[TCP_V_S0] = rv;
		p.v[TCP_V_S1] = sb_view_at(s, 0, 2, ss);
		p.v[TCP_V_DST] = buf_view(C, 2, cs2);
		step(&p, TCP_V_FDIV, TCP_SRC_S1, TCP_SRC_V, 0); /* C = ws / R */
		sb_emit(b, &p, id);
		cv = buf_view(C, 3, cs);
	}
	const sb_val *d = sb_out_val(b, id);
	ts_id trf[2];
	qa_trf(b, id, &pl, MOE_I8, trf);
	const int64_t xs[3] = {I, 0, 1};
	qa_cs cs = {cv, TS_NONE, 0, 0, 0, 0, 0, 1};
	contract(b, id, &pl, trf, q, buf_view(xq, 3, xs), &cs, &d, rowdiv);
}

/* The chain of einsum u's W8A8 activation: in[i] for every node of (xf, a]
 * that a depends on; false when a is not such a chain or when a node of it
 * is read outside it (but a by einsums with quantized activations). */
static bool chain_nodes(const sb *b, moe_id u, bool *in)
{
	moe_id a = SBN(b, u)->args[0], xf;
	if (!w8a8_chain(b, a, &xf))
		return false;
	in[a] = true;
	for (moe_id i = a + 1; i-- > xf + 1;) {
		const ir_node *n = SBN(b, i);
		if (!in[i])
			continue;
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE && n->args[k] > xf && !(ir_ops[SBN(b, n->args[k])->op].flags & OPF_LEAF))
				in[n->args[k]] = true;
	}
	for (moe_id i = xf + 1; i < b->g->nnodes; i++) {
		const ir_node *n = SBN(b, i);
		bool qe = n->op == MOE_OP_EINSUM && n->nargs == 2 && n->args[0] == a && sb_qact_dequant(b, n->args[1], NULL);
		for (uint32_t k = 0; k < n->nargs && !in[i] && !qe; k++)
			if (n->args[k] != MOE_NONE && in[n->args[k]])
				return false;
		if (n->valid != MOE_NONE && in[n->valid] && !in[i])
			return false;
	}
	/* a widening cast that only the chain reads is not built either */
	bool only = rows_src(b, xf) != xf;
	for (moe_id i = xf + 1; i < b->g->nnodes && only; i++)
		for (uint32_t k = 0; k < SBN(b, i)->nargs; k++)
			only &= SBN(b, i)->args[k] != xf || in[i];
	in[xf] = only;
	return true;
}

/* ---- the layer's input quantized once (tcp-w8a8-act-once, outside the loop) ----
 * x.q = cast(q) with q the per-token rounding of v = xf (127 / m), m =
 * max(max_i |xf|, 1e-10), read only by gathers (its dispatch), and x.scale
 * = m / 127. The chain is not built node by node: at x.q, five passes
 *   m[t]    = c.fmax(r.fmax(f.abs(xf)), 1e-10)     [T, D] -> [T]
 *   R[t]    = d.div(127, m)                         [T]
 *   as[t]   = d.div(m, 127)                         [T]: x.scale
 *   v[t, i] = xf R                                  [T, D] f32
 *   xq      = i8(ftoi(v + copysign(0.5 - 2^-25, v)))  (half away from zero)
 * each the graph's node's operation, so the values are the graph's. x.q's buffers hold the integers
 * as i8 (exact: |q| <= 127), a quarter of the f32 bytes; its dispatch
 * (recipe_route.c) and the loop's rows keep that type, and the body's
 * contraction reads them as fetched (once_einsum). The rows go to HBM once,
 * since revision 3 gathers only from HBM (docs/tcp-isa.md 7). */
typedef struct topq {
	moe_id x, xf, m, r, v, s, c1, c127;
} topq;

static bool is_const(const sb *b, moe_id c)
{
	return SBN(b, c)->op == MOE_OP_CONST && b->v[c].kind == SV_IMM;
}

/* v = mul(xf, div(127, max(reduce_max(abs(xf)), c))) (either order) */
static bool top_v(const sb *b, moe_id v, topq *t)
{
	const ir_node *n = SBN(b, v);
	if (n->op != MOE_OP_MUL || n->nargs != 2 || n->dtype != MOE_F32 || n->rank != 2)
		return false;
	for (int k = 0; k < 2; k++) {
		const ir_node *r = SBN(b, n->args[1 - k]);
		if (r->op != MOE_OP_DIV || r->nargs != 2 || !is_const(b, r->args[0]))
			continue;
		const ir_node *m = SBN(b, r->args[1]);
		if (m->op != MOE_OP_MAX || m->nargs != 2)
			continue;
		int j = SBN(b, m->args[0])->op == MOE_OP_REDUCE_MAX ? 0 : 1;
		const ir_node *rm = SBN(b, m->args[j]);
		if (rm->op != MOE_OP_REDUCE_MAX || !is_const(b, m->args[1 - j]) ||
			SBN(b, rm->args[0])->op != MOE_OP_ABS || SBN(b, rm->args[0])->args[0] != n->args[k])
			continue;
		t->v = v;
		t->xf = n->args[k];
		t->r = n->args[1 - k];
		t->m = r->args[1];
		t->c127 = r->args[0];
		t->c1 = m->args[1 - j];
		return true;
	}
	return false;
}

/* in[]: the nodes of x.q's chain (x.q excluded); false when xq is not one. */
static bool top_chain(const sb *b, moe_id xq, topq *t, bool *in)
{
	const moe_graph *g = b->g;
	const ir_node *n = SBN(b, xq);
	if (n->op != MOE_OP_CAST || n->nargs != 1 || n->rank != 2 || SBN(b, n->args[0])->dtype != MOE_F32)
		return false;
	bool used = false;
	for (moe_id u = xq + 1; u < g->nnodes; u++)
		for (uint32_t k = 0; k < SBN(b, u)->nargs; k++)
			if (SBN(b, u)->args[k] == xq) {
				used = true;
				if (SBN(b, u)->op != MOE_OP_GATHER || k != 0)
					return false;
			}
	for (uint32_t k = 0; k < g->nout; k++)
		used &= g->outputs[k] != xq;
	t->v = MOE_NONE;
	in[n->args[0]] = true; /* the rounding: elementwise nodes back to v */
	for (moe_id i = n->args[0] + 1; i-- > 0 && used;) {
		if (!in[i])
			continue;
		const ir_node *c = SBN(b, i);
		if (t->v == MOE_NONE && top_v(b, i, t)) {
			in[t->r] = in[t->m] = true;
			in[SBN(b, t->m)->args[0]] = in[SBN(b, t->m)->args[1]] = true;
			in[t->c1] = in[t->c127] = false;
			moe_id rm = SBN(b, t->m)->args[SBN(b, SBN(b, t->m)->args[0])->op == MOE_OP_REDUCE_MAX ? 0 : 1];
			in[SBN(b, rm)->args[0]] = true;
			continue;
		}
		if (i == t->r || i == t->m || (t->v != MOE_NONE && i < t->v))
			continue;
		if (!(ir_ops[c->op].flags & OPF_ELEM) && c->op != MOE_OP_CAST)
			return false;
		for (uint32_t k = 0; k < c->nargs; k++)
			if (!(ir_ops[SBN(b, c->args[k])->op].flags & OPF_LEAF))
				in[c->args[k]] = true;
			else if (!is_const(b, c->args[k]))
				return false;
	}
	if (!used || t->v == MOE_NONE)
		return false;
	t->s = MOE_NONE; /* x.scale = div(m, 127) */
	for (moe_id u = t->m + 1; u < g->nnodes; u++) {
		const ir_node *un = SBN(b, u);
		if (!in[u] && un->op == MOE_OP_DIV && un->nargs == 2 && un->args[0] == t->m && is_const(b, un->args[1]))
			t->s = u;
	}
	if (t->s == MOE_NONE)
		return false;
	in[t->s] = true;
	for (moe_id u = 0; u < g->nnodes; u++) /* read only inside, x.q and x.scale's readers aside */
		for (uint32_t k = 0; k < SBN(b, u)->nargs; k++) {
			moe_id a = SBN(b, u)->args[k];
			if (a != MOE_NONE && a != t->s && in[a] && !in[u] && u != xq)
				return false;
		}
	for (uint32_t k = 0; k < g->nout; k++)
		if (in[g->outputs[k]])
			return false;
	/* xf, a widening of x read only by the chain, is not built either */
	t->x = rows_src(b, t->xf);
	bool only = t->x != t->xf;
	for (moe_id u = t->xf + 1; u < g->nnodes && only; u++)
		for (uint32_t k = 0; k < SBN(b, u)->nargs; k++)
			only &= SBN(b, u)->args[k] != t->xf || in[u];
	in[t->xf] = only;
	if (!only)
		t->x = t->xf;
	return true;
}

/* The five passes and x.q's copy to HBM (the gather's source). */
static void top_build(sb *b, moe_id xq, const topq *t)
{
	const ir_node *xn = SBN(b, t->x);
	int64_t T = xn->shape[0], D = xn->shape[1];
	const sb_val *x = sb_dm_val(b, t->x);
	if (!x)
		return;
	const int64_t sh1[1] = {T}, shs[2] = {T, 1}, shx[2] = {T, D}, xs[2] = {x->stride[0], x->stride[1]};
	const int64_t r2[2] = {1, 0}, vs[2] = {D, 1};
	ts_id m = sb_dm_buf(b, xq, "act.max", MOE_F32, 1, sh1), r = sb_dm_buf(b, xq, "act.inv", MOE_F32, 1, sh1);
	ts_id s = sb_dm_buf(b, t->s, "x.scale", MOE_F32, 2, shs);
	tcp_insn p = pass(b, xq, 2, shx);
	p.v[TCP_V_S0] = sb_view_at(x, 0, 2, xs);
	p.v[TCP_V_DST] = buf_view(m, 2, r2);
	step(&p, TCP_V_FABS, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p, TCP_V_FRMAX, TCP_SRC_V, TCP_SRC_NONE, 0);
	step(&p, TCP_V_FMAX, TCP_SRC_V, TCP_SRC_IMM, b->v[t->c1].imm);
	sb_emit(b, &p, xq);
	const int64_t one[1] = {1};
	p = pass(b, xq, 1, sh1);
	p.v[TCP_V_S0] = buf_view(m, 1, one);
	p.v[TCP_V_DST] = buf_view(r, 1, one);
	step(&p, TCP_V_FDIV, TCP_SRC_IMM, TCP_SRC_S0, b->v[t->c127].imm);
	sb_emit(b, &p, xq);
	p = pass(b, t->s, 1, sh1);
	p.v[TCP_V_S0] = buf_view(m, 1, one);
	p.v[TCP_V_DST] = buf_view(s, 1, one);
	step(&p, TCP_V_FDIV, TCP_SRC_S0, TCP_SRC_IMM, b->v[SBN(b, t->s)->args[1]].imm);
	sb_emit(b, &p, t->s);
	b->v[t->s] = sb_view_of(s, SBN(b, t->s));
	ts_id v = sb_dm_buf(b, xq, "act.v", MOE_F32, 2, shx), q = sb_dm_buf(b, xq, "x.q", MOE_I8, 2, shx);
	p = pass(b, xq, 2, shx);
	p.v[TCP_V_S0] = sb_view_at(x, 0, 2, xs);
	p.v[TCP_V_S1] = buf_view(r, 2, r2);
	p.v[TCP_V_DST] = buf_view(v, 2, vs);
	step(&p, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	sb_emit(b, &p, xq);
	p = pass(b, xq, 2, shx); /* v + copysign(0.5 - 2^-25, v), truncated */
	p.v[TCP_V_S0] = buf_view(v, 2, vs);
	p.v[TCP_V_DST] = buf_view(q, 2, vs);
	step(&p, TCP_V_FTLT, TCP_SRC_S0, TCP_SRC_IMM, 0);
	step(&p, TCP_V_SHL, TCP_SRC_V, TCP_SRC_IMM, 31);
	step(&p, TCP_V_IADD, TCP_SRC_V, TCP_SRC_IMM, fbits(0.5f - 0x1p-25f));
	step(&p, TCP_V_FADD, TCP_SRC_V, TCP_SRC_S0, 0);
	step(&p, TCP_V_FTOI, TCP_SRC_V, TCP_SRC_NONE, 0);
	sb_emit(b, &p, xq);
	ts_id h = sb_hbm_buf(b, xq, "x.q", TCP_T_SCRATCH, MOE_I8, 2, shx);
	tcp_insn c = tcp_b_dma_copy_flat((int32_t)h, (int32_t)q, T * D);
	sb_emit(b, &c, xq);
	b->dmv[xq] = sb_view_of(q, SBN(b, xq));
	b->v[xq] = sb_view_of(h, SBN(b, xq));
}

/* A node of the top graph in x.q's chain: not built; x.q itself: built
 * with the chain (top_build). */
static bool top_skip(sb *b, moe_id id)
{
	const moe_graph *g = b->g;
	const ir_node *n = SBN(b, id);
	if (ir_graph_attr_int(g, "tcp_w8a8_act_once", 0) <= 0 ||
		(n->dtype != MOE_F32 && n->op != MOE_OP_CAST && n->dtype != MOE_BOOL && n->dtype != MOE_I32))
		return false; /* only where the pass moved the quantization here */
	size_t bytes = (size_t)g->nnodes * sizeof(bool);
	bool *in = ctx_alloc(b->ctx, bytes), hit = false;
	for (moe_id u = id; u < g->nnodes && !hit; u++) {
		const ir_node *un = SBN(b, u);
		if (un->op != MOE_OP_CAST || un->dtype == MOE_F32 || un->rank != 2)
			continue;
		topq t;
		memset(in, 0, bytes);
		if (!top_chain(b, u, &t, in) || (u != id && !in[id]))
			continue;
		hit = true;
		if (u == id)
			top_build(b, id, &t);
	}
	ctx_free(b->ctx, in, bytes);
	return hit;
}

/* Whether body node id is qf, mul or a of an act-once chain read only by
 * W8A8 einsums (each of its nodes read only by the next). */
static bool once_skip(const sb *b, moe_id id)
{
	const moe_graph *g = b->g;
	for (moe_id u = id + 1; u < g->nnodes; u++) {
		const ir_node *un = SBN(b, u);
		const char *act = "bf16";
		moe_id q, as, qf, mul, a = un->nargs == 2 ? un->args[0] : MOE_NONE;
		if (un->op != MOE_OP_EINSUM || a == MOE_NONE || !sb_qact_dequant(b, un->args[1], &act) ||
			strcmp(act, "int8") || !once_chain(b, a, &q, &as, &qf, &mul) || (id != a && id != qf && id != mul))
			continue;
		for (moe_id r = qf + 1; r < g->nnodes; r++) { /* no other reader */
			const ir_node *rn = SBN(b, r);
			bool qe = rn->op == MOE_OP_EINSUM && rn->nargs == 2 && rn->args[0] == a &&
				  sb_qact_dequant(b, rn->args[1], NULL);
			for (uint32_t k = 0; k < rn->nargs; k++)
				if ((rn->args[k] == qf && r != mul) || (rn->args[k] == mul && r != a) || (rn->args[k] == a && !qe))
					return false;
		}
		return true;
	}
	return false;
}

bool sb_qact_skip(sb *b, moe_id id)
{
	if (ir_ops[SBN(b, id)->op].flags & OPF_LEAF)
		return false;
	if (!b->g->is_body)
		return top_skip(b, id);
	if (once_skip(b, id))
		return true;
	bool skip = false;
	size_t bytes = (size_t)b->g->nnodes * sizeof(bool);
	bool *in = ctx_alloc(b->ctx, bytes);
	for (moe_id u = id + 1; u < b->g->nnodes && !skip; u++) {
		const ir_node *un = SBN(b, u);
		const char *act = "bf16";
		if (un->op != MOE_OP_EINSUM || un->nargs != 2 || !sb_qact_dequant(b, un->args[1], &act) || strcmp(act, "int8"))
			continue;
		memset(in, 0, bytes);
		skip = chain_nodes(b, u, in) && in[id];
	}
	ctx_free(b->ctx, in, bytes);
	return skip;
}

bool sb_qact_einsum(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	const char *act = "bf16";
	if (n->nargs != 2 || !sb_qact_dequant(b, n->args[1], &act))
		return false;
	qt_info qi;
	const ir_node *an = SBN(b, n->args[0]);
	int batch = 0;
	bool i8 = !strcmp(act, "int8");
	if ((!b->g->is_body && i8) || (!i8 && !fp8_weight(b, n->args[1], &qi)) || an->rank != 2 || n->rank != 2 ||
		SBN(b, n->args[1])->rank != 2 || ir_node_einsum_form(n, &batch) != IR_EIN_MATMUL_NT || batch != 0) {
		char what[96];
		snprintf(what, sizeof what, "quantized activations (dequant act=\"%s\") here", act);
		sb_refuse(b, id, what);
		return true;
	}
	if (i8)
		w8a8_einsum(b, id);
	else
		fp8_einsum(b, id);
	return true;
}
