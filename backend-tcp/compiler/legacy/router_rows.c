/* backend-tcp/router_rows.c: the router's contraction in row chunks, each
 * behind its part of x's copy (docs/tcp-isa.md section 7.2, "Router in row
 * chunks").
 *
 * A prefill's router reads x copied whole into DM: one DMA of T x D
 * (Qwen3-30B-A3B at T = 4096: 16 MB, 12.2 us), and its contractions, which
 * read every row, waited for all of it while the main context had nothing
 * else to do (the router is the first contraction; routing's other passes
 * read its result). So when an einsum outside the block loop is lowered to
 * contractions that all read one DM tensor X as their streamed rows, X
 * being exactly one contiguous copy of a graph input of 1 MiB or more (a
 * decode's row-stationary router streams the weights instead: unchanged),
 * and the stationary
 * tiles are loaded once (one pass over the outputs, at most two TRF chunks:
 * each sub load fills its own TRF tile), the copy is split into R copies of
 * M / R rows each (one descriptor list, joined) and the contractions are
 * emitted per row chunk: the sub loads first, then for each chunk its
 * contractions in their order (the reduction chunks through the f32
 * partial sums). The simulator tracks element ranges, so chunk r's
 * contractions wait for copy r only and the router runs while the rest of
 * x streams in. Each output element is the same dot product in the same
 * order (the contraction's sums do not depend on the rows beside them), so
 * the logits are bitwise the same; each chunk pays a command issue and the
 * fill, drain and tree latency per contraction. */
#include <string.h>
#include "backend-tcp/compiler/legacy/lower_int.h"

enum { ROUTER_CHUNKS = 8 };

/* After einsum node i was lowered from code index at. */
void tcpl_router_rows(lw *c, moe_id i, uint32_t at)
{
	tcp_program *p = c->p;
	const ir_node *n = N(c->g, i);
	if (c->failed || n->op != MOE_OP_EINSUM || c->inreg[i] || c->rows == MOE_NONE || p->ncode <= at)
		return;
	/* [at, end): copies, then loads and contractions in turn */
	uint32_t end = p->ncode, nld = 0, ncon = 0;
	int32_t x = -1, trf[2] = {-1, -1};
	int64_t M = -1;
	for (uint32_t k = at; k < end; k++) {
		const tcp_insn *in = &p->code[k];
		if (in->op == TCP_OP_SUB_TRF) {
			if (nld >= 2 || in->v[TCP_V_DST].t == trf[0] || ncon != nld)
				return; /* each tile loaded once, in turn with the contractions */
			trf[nld++] = in->v[TCP_V_DST].t;
		} else if (in->op == TCP_OP_TU_CONTRACT) {
			const tcp_view *s0 = &in->v[TCP_V_S0];
			if (ncon >= nld || in->vreg >= 0 || s0->reg >= 0 || in->v[TCP_V_DST].reg >= 0 ||
				(x >= 0 && s0->t != x) || (M >= 0 && in->dim[0] != M) || in->v[TCP_V_S1].t != trf[ncon])
				return;
			x = s0->t;
			M = in->dim[0];
			ncon++;
		} else if (in->op != TCP_OP_DMA_COPY || nld > 0) {
			return; /* straight-line copies, loads and contractions only */
		}
	}
	if (x < 0 || ncon != nld || M % ROUTER_CHUNKS || M / ROUTER_CHUNKS < 8 || p->t[x].space != TCP_DM)
		return;
	/* the one write of X: a contiguous copy of all of it from HBM, with no
	 * branch anywhere after it (no target moves) */
	uint32_t cp = UINT32_MAX;
	for (uint32_t k = 0; k < end; k++) {
		const tcp_insn *in = &p->code[k];
		if (in->v[TCP_V_DST].t == x) {
			if (cp != UINT32_MAX)
				return;
			cp = k;
		}
		if ((in->op == TCP_OP_BR || in->op == TCP_OP_JMP || in->op == TCP_OP_HALT) && cp != UINT32_MAX)
			return;
		if ((in->op == TCP_OP_BR || in->op == TCP_OP_JMP) && in->target > 0 && cp == UINT32_MAX &&
			(uint32_t)in->target > k)
			return; /* a forward branch over the code that moves */
	}
	if (cp == UINT32_MAX || cp >= at + (end - at) - 2 * ncon)
		return;
	for (uint32_t k = cp + 1; k < at; k++) /* only this einsum's loads and contractions move */
		if (p->code[k].op == TCP_OP_SUB_TRF || p->code[k].op == TCP_OP_TU_CONTRACT)
			return;
	const tcp_insn *ci = &p->code[cp];
	int64_t am = -1;
	for (uint32_t k = at; k < end; k++)
		if (p->code[k].op == TCP_OP_TU_CONTRACT)
			am = p->code[k].v[TCP_V_S0].stride[0];
	if (ci->op != TCP_OP_DMA_COPY || ci->ndim != 1 || ci->dim[0] != p->t[x].numel || ci->dim[0] != M * am ||
		ci->v[TCP_V_DST].base != 0 || ci->v[TCP_V_DST].stride[0] != 1 || ci->v[TCP_V_S0].stride[0] != 1 ||
		ci->v[TCP_V_DST].reg >= 0 || ci->v[TCP_V_S0].reg >= 0 || ci->v[TCP_V_S0].t < 0 ||
		p->t[ci->v[TCP_V_S0].t].space != TCP_HBM || p->t[ci->v[TCP_V_S0].t].kind != TCP_T_INPUT ||
		ci->dim[0] * esz(p->t[x].dtype) < ((int64_t)1 << 20))
		return; /* the token rows of an input (not a decode's streamed router weights), 1 MiB or more */
	int64_t rows = M / ROUTER_CHUNKS, part = rows * am;
	uint32_t nb = end - cp;
	tcp_insn *code = ctx_alloc(c->ctx, sizeof *code * nb);
	if (!code)
		return;
	memcpy(code, &p->code[cp], sizeof *code * nb);
	p->ncode = cp;
	/* the copy as R joined copies of its rows */
	for (int r = 0; r < ROUTER_CHUNKS; r++) {
		tcp_insn in = code[0];
		in.dim[0] = part;
		in.v[TCP_V_DST].base += r * part;
		in.v[TCP_V_S0].base += r * part;
		if (r > 0)
			in.flags |= TCP_F_JOIN;
		emit(c, &in);
	}
	/* the code between, then the loads, then each chunk's contractions */
	for (uint32_t k = 1; k < nb; k++)
		if (code[k].op != TCP_OP_SUB_TRF && code[k].op != TCP_OP_TU_CONTRACT)
			emit(c, &code[k]);
	for (uint32_t k = 1; k < nb; k++)
		if (code[k].op == TCP_OP_SUB_TRF)
			emit(c, &code[k]);
	for (int r = 0; r < ROUTER_CHUNKS; r++)
		for (uint32_t k = 1; k < nb; k++) {
			if (code[k].op != TCP_OP_TU_CONTRACT)
				continue;
			tcp_insn in = code[k];
			in.dim[0] = rows;
			in.v[TCP_V_S0].base += r * rows * in.v[TCP_V_S0].stride[0];
			in.v[TCP_V_DST].base += r * rows * in.v[TCP_V_DST].stride[0];
			if (in.v[TCP_V_S2].t >= 0)
				in.v[TCP_V_S2].base += r * rows * in.v[TCP_V_S2].stride[0];
			emit(c, &in);
		}
	ctx_free(c->ctx, code, sizeof *code * nb);
}
