/* backend-tcp/terminate.c: why a TCP program ends. A loop without an exit is
 * rejected when the program is loaded; every run has an instruction budget
 * derived from the program, which the simulator (sim.c) enforces. */
#include "backend-tcp/tcp_int.h"

/* The instruction budget of a run, from the program: every instruction once
 * per block of the worst-case grid it declares (G; two more for the routing
 * before and the combine after), times 1024 for the loops inside a block
 * (row chunks, top-k rounds), capped at 2^34. A compiled program runs within
 * a small fraction of it; a loop that never exits reaches it in seconds. */
uint64_t tcp_step_budget(const tcp_program *p)
{
	uint64_t cap = (uint64_t)1 << 34, g = p->moe_G > 0 && p->moe_G < ((int64_t)1 << 24) ? (uint64_t)p->moe_G : 0;
	uint64_t b = (uint64_t)p->ncode * (g + 2) * 1024;
	return b < cap ? b : cap;
}

/* A backward jump whose loop body holds no branch out of it and no halt
 * can never terminate; such a program is rejected when it is loaded. */
moe_status tcp_check_termination(moe_ctx *ctx, const tcp_program *p, const char *file)
{
	for (uint32_t pc = 0; pc < p->ncode; pc++) {
		const tcp_insn *in = &p->code[pc];
		if (in->op != TCP_OP_JMP || in->target < 0 || (uint32_t)in->target > pc)
			continue;
		bool exits = false;
		for (uint32_t k = (uint32_t)in->target; k <= pc && !exits; k++) {
			const tcp_insn *b = &p->code[k];
			exits = b->op == TCP_OP_HALT || ((b->op == TCP_OP_BR || b->op == TCP_OP_JMP) &&
								 (b->target < in->target || (uint32_t)b->target > pc));
		}
		if (!exits) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, file ? file : "<program>"),
				"instruction %u (jmp @%d): the loop of instructions %d..%u has no branch out and no halt: it "
				"cannot terminate",
				pc, in->target, in->target, pc);
			return MOE_ERR_INVALID;
		}
	}
	return MOE_OK;
}
