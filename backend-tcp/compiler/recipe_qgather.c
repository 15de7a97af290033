/* backend-tcp/compiler/recipe_qgather.c: act=fp8 block scales gathered by
 * the block list (sched-build, docs/tcp-compiler.md 5.1, "Quantized
 * activations"). */
#include "backend-tcp/compiler/sched_build_int.h"

/* A loop of few blocks (4 G <= E) reads few experts' scales: its prologue
 * gathers the block experts' rows of w [E, a, c] (f32, dense in HBM) into a
 * DM table [G, a, c] by the staged expert list (under $nb: blocks past it
 * unread), one DMA command of G a c words where the whole copy moves E a c
 * (DeepSeek-V3 at T = 1: 8 of 256 experts' rows, 2.75 MB), and the body reads
 * row $g in place. The first call (e = TS_NONE, before the loop) emits
 * nothing; where the list is a constant the whole copy goes in the prologue.
 * The values are the rows the whole copy gives at $e. */
bool sb_qact_gather(sb *b, moe_id loop, moe_id w, ts_id e, sb_val *out)
{
	const ir_node *wn = SBN(b, w);
	const sb_val *v = &b->v[w];
	int64_t G = SBN(b, loop)->shape[0], E = wn->shape[0], R = wn->rank == 3 ? wn->shape[1] * wn->shape[2] : 0;
	if (wn->rank != 3 || wn->dtype != MOE_F32 || 4 * G > E || v->kind != SV_VIEW || v->reg != TS_NONE ||
		b->s->buf[v->buf].space == TCP_DM || v->stride[0] != R || v->stride[1] != wn->shape[2] || v->stride[2] != 1)
		return false;
	if (e == TS_NONE || !out)
		return true;
	ts_loop *L = &b->s->loop[b->s->nloop - 1];
	ts_id body = b->rg;
	b->rg = L->prologue;
	if (b->ctl[0].imm) {
		const sb_val *c = sb_dm_val(b, w);
		b->rg = body;
		if (!c)
			return true;
		*out = *c;
		out->reg = e;
	} else {
		const int64_t sh[3] = {G, wn->shape[1], wn->shape[2]};
		ts_id t = sb_dm_buf(b, w, "fp8.bscale.rows", MOE_F32, 3, sh);
		b->s->buf[t].life = TS_LIFE_LOOP;
		const int64_t gd[3] = {1, G, R}, ds[3] = {G * R, R, 1}, ss[3] = {E * R, R, 1}, is[2] = {G, 1};
		tcp_insn in = tcp_b_dma_gather(3, gd, tcp_b_view((int32_t)t, 0, 3, ds),
			tcp_b_view((int32_t)v->buf, v->base, 3, ss),
			tcp_b_view((int32_t)b->ctl[0].v.buf, b->ctl[0].v.base, 2, is), E);
		in.vreg = (int32_t)L->nb; /* blocks past nb: their experts unread */
		sb_emit(b, &in, loop);
		b->rg = body;
		*out = sb_view_of(t, wn);
		out->reg = L->g;
	}
	out->scale = out->stride[0];
	for (int k = 0; k + 1 < MOE_MAX_RANK; k++)
		out->stride[k] = out->stride[k + 1];
	return true;
}
