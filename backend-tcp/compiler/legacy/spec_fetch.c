/* backend-tcp/spec_fetch.c: the first expert's weights fetched while the
 * router runs (docs/tcp-isa.md section 7.4, "Speculative first fetch").
 *
 * A prefill's block loop starts with the weights of block 0's expert, which
 * routing names only at its end: the DMA context, idle while the router and
 * top-k run on the main context after x is copied in, then streamed block
 * 0's expert (Qwen3-30B-A3B at T = 4096: 9.4 MB, 6.3 us) behind the
 * dispatch scatter, and the first contraction waited for both. Blocks are in
 * expert order and block 0's expert is the lowest hit, expert 0 for nearly
 * every prefill of more than a few tokens. So expert 0's weights are copied
 * into weight slot 0 right after the inputs routing reads first, and the
 * loop's prologue fetches block 0's weights only when its expert is not 0
 * (`li r13, 0; br.eq r4, r13`). When it is not, the copy was wasted HBM
 * time, never a wrong result: block 0's own fetch overwrites the slot, in
 * order on the DMA context. The copy is inserted into code already emitted,
 * so it is made only where that is safe: straight-line code before it (no
 * branch whose target would move), and no DM tensor read or written between
 * its place and the loop overlapping the weight buffer (the allocator reuses
 * routing's DM for the loop's buffers; the simulator's hazards are per
 * tensor, so such an overlap would not be caught). */
#include <string.h>
#include "backend-tcp/compiler/legacy/lower_int.h"

static bool overlaps(const tcp_tensor *a, const tcp_tensor *b)
{
	return a->space == TCP_DM && b->space == TCP_DM && a->addr < b->addr + b->slice_bytes &&
	       b->addr < a->addr + a->slice_bytes;
}

/* Inserts a copy of n elements of weight tensor st at sbase into DM buffer
 * buf at dbase after the last DMA before the first contraction (the router's),
 * when that is safe; true when inserted. */
bool tcpl_spec_fetch(lw *c, int32_t buf, int64_t dbase, int64_t n, int32_t st, int64_t sbase)
{
	tcp_program *p = c->p;
	uint32_t at = p->ncode, q = 0;
	if (buf < 0 || p->t[buf].space != TCP_DM || p->block_loop_pc >= 0 || p->tier_loop_pc >= 0)
		return false;
	for (uint32_t k = 0; k < at; k++)
		if (p->code[k].op == TCP_OP_BR || p->code[k].op == TCP_OP_JMP || p->code[k].op == TCP_OP_HALT)
			return false;
	for (uint32_t k = 0; k < at && p->code[k].op != TCP_OP_TU_CONTRACT; k++)
		if (tcp_op_ctx[p->code[k].op] == TCP_CTX_DMA)
			q = k + 1;
	if (q == 0)
		return false;
	for (uint32_t k = q; k < at; k++)
		for (int w = 0; w < TCP_NVIEW; w++) {
			int32_t t = p->code[k].v[w].t;
			if (t >= 0 && t != buf && overlaps(&p->t[t], &p->t[buf]))
				return false;
		}
	dma_copy(c, buf, dbase, -1, 0, st, sbase, -1, 0, n);
	tcp_insn cp = p->code[at];
	cp.flags |= TCP_F_JOIN; /* sets up beside the copy before it */
	memmove(&p->code[q + 1], &p->code[q], (at - q) * sizeof *p->code);
	p->code[q] = cp;
	return true;
}
