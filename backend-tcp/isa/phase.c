/* backend-tcp/isa/phase.c: the phase of each instruction (tcp_phase), from
 * the program's loops, for a compiler that does not tag what it emits and
 * for programs stored without phases. */
#include "backend-tcp/isa/tcp_int.h"

const char *const tcp_phase_names[TCP_PH_COUNT] = {"routing", "expert", "prefetch", "combine"};

/* The expert region of the block loop at loop_pc: from the branch that
 * skips the whole loop to the loop's back branch ([-1, -1]: none). */
static void expert_region(const tcp_program *p, int32_t loop_pc, int64_t *lo, int64_t *hi)
{
	*lo = *hi = -1;
	if (loop_pc < 0)
		return;
	for (uint32_t i = (uint32_t)loop_pc; i < p->ncode; i++)
		if (p->code[i].op == TCP_OP_BR && p->code[i].target == loop_pc)
			*hi = i;
	for (int32_t i = loop_pc; *hi >= 0 && i-- > 0;)
		if (p->code[i].op == TCP_OP_BR && p->code[i].target == *hi + 1) {
			*lo = i;
			break;
		}
	if (*lo < 0)
		*hi = -1;
}

/* Block loop work issued before the loop: a copy from an expert weight
 * (spec_fetch.c) or a gather of an input's rows (spec_rows.c) into a DM
 * tensor that a copy or gather of the loop from the same source writes too;
 * expert work like the fetch it stands for. Up to four, the rest -1. */
static void expert_prefetch(const tcp_program *p, int64_t lo, int64_t hi, int64_t *pre)
{
	int np = 0;
	for (int k = 0; k < 4; k++)
		pre[k] = -1;
	for (int64_t i = 0; lo >= 0 && i < lo && np < 4; i++) {
		const tcp_insn *in = &p->code[i];
		int32_t d = in->v[TCP_V_DST].t, src = in->v[TCP_V_S0].t;
		if ((in->op != TCP_OP_DMA_COPY && in->op != TCP_OP_DMA_GATHER) || d < 0 || src < 0 ||
			(uint32_t)d >= p->nt || (uint32_t)src >= p->nt || p->t[d].space != TCP_DM)
			continue;
		int kind = p->t[src].kind;
		if (in->op == TCP_OP_DMA_COPY ? kind != TCP_T_WEIGHT && kind != TCP_T_PACKED : kind != TCP_T_INPUT)
			continue;
		for (int64_t k = lo; k <= hi; k++)
			if (p->code[k].op == in->op && p->code[k].v[TCP_V_DST].t == d && p->code[k].v[TCP_V_S0].t == src) {
				pre[np++] = i;
				break;
			}
	}
}

void tcp_phase_infer(tcp_program *p)
{
	int64_t xlo, xhi, tlo, thi, pre[4];
	expert_region(p, p->block_loop_pc, &xlo, &xhi);
	expert_region(p, p->tier_loop_pc, &tlo, &thi);
	expert_prefetch(p, xlo, xhi, pre);
	for (uint32_t i = 0; i < p->ncode; i++) {
		int64_t pc = i;
		uint8_t ph = TCP_PH_ROUTING;
		if ((pc >= xlo && pc <= xhi) || (pc >= tlo && pc <= thi))
			ph = TCP_PH_EXPERT;
		else if (pc == pre[0] || pc == pre[1] || pc == pre[2] || pc == pre[3])
			ph = TCP_PH_PREFETCH;
		else if (xhi >= 0 && pc > xhi)
			ph = TCP_PH_COMBINE;
		p->code[i].phase = ph;
	}
}

bool tcp_phase_tagged(const tcp_program *p)
{
	for (uint32_t i = 0; i < p->ncode; i++)
		if (p->code[i].phase != TCP_PH_ROUTING)
			return true;
	return false;
}
