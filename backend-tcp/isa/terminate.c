/* backend-tcp/terminate.c: why a TCP program ends. A loop without an exit is
 * rejected when the program is loaded; every run has an instruction budget
 * derived from the program, which the simulator (sim.c) enforces. */
#include "backend-tcp/isa/tcp_int.h"

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

/* The work of one command: the elements of its iteration space plus
 * TCP_WORK_PER_COMMAND for its fixed cost (the simulator's host time per
 * command), saturating at 2^62. */
uint64_t tcp_command_work(const tcp_insn *in)
{
	uint64_t w = 1, cap = (uint64_t)1 << 62;
	for (int k = 0; k < in->ndim && k < TCP_MAXD; k++) {
		uint64_t d = in->dim[k] > 0 ? (uint64_t)in->dim[k] : 1;
		if (__builtin_mul_overflow(w, d, &w) || w > cap)
			return cap;
	}
	return w + TCP_WORK_PER_COMMAND;
}

/* The last instruction of the loop that starts at loop_pc: its back
 * branch (-1: none). */
static int64_t loop_end(const tcp_program *p, int32_t loop_pc)
{
	int64_t end = -1;
	for (uint32_t i = 0; loop_pc >= 0 && i < p->ncode; i++)
		if ((p->code[i].op == TCP_OP_BR || p->code[i].op == TCP_OP_JMP) && p->code[i].target == loop_pc && i >= (uint32_t)loop_pc)
			end = i;
	return end;
}

/* The work budget of a run, from the program: its static work, every
 * command's work (tcp_command_work) once, those of the block loop (and of
 * the decode tier's) once per block of the worst-case grid G it declares,
 * those of any other loop TCP_WORK_LOOP times, all times TCP_WORK_FACTOR; at
 * least 2^24 and at most 2^42. */
uint64_t tcp_work_budget(const tcp_program *p)
{
	uint64_t g = p->moe_G > 0 && p->moe_G < ((int64_t)1 << 24) ? (uint64_t)p->moe_G : 1, sum = 0;
	uint64_t lo = (uint64_t)1 << 24, hi = (uint64_t)1 << 42;
	int64_t be = loop_end(p, p->block_loop_pc), te = loop_end(p, p->tier_loop_pc);
	for (uint32_t pc = 0; pc < p->ncode && sum < hi; pc++) {
		if (tcp_op_ctx[p->code[pc].op] == TCP_CTX_CTL)
			continue;
		bool grid = ((int64_t)pc >= p->block_loop_pc && (int64_t)pc <= be) ||
			    ((int64_t)pc >= p->tier_loop_pc && (int64_t)pc <= te);
		uint64_t mult = grid ? g : 1;
		for (uint32_t j = pc; j < p->ncode; j++) { /* any other loop around pc */
			const tcp_insn *b = &p->code[j];
			if ((b->op == TCP_OP_BR || b->op == TCP_OP_JMP) && b->target >= 0 && (uint32_t)b->target <= pc &&
				b->target != p->block_loop_pc && b->target != p->tier_loop_pc) {
				mult *= TCP_WORK_LOOP;
				break;
			}
		}
		uint64_t w;
		if (__builtin_mul_overflow(tcp_command_work(&p->code[pc]), mult, &w) || w > hi)
			return hi;
		sum += w;
	}
	uint64_t b;
	if (sum >= hi || __builtin_mul_overflow(sum, (uint64_t)TCP_WORK_FACTOR, &b) || b > hi)
		return hi;
	return b < lo ? lo : b;
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
