/* backend-tcp/lower_check.c: a check of the lowering's DM allocation.
 *
 * The simulator keeps each tensor's data apart, so two DM tensors the
 * allocator placed on the same bytes while both are live would give right
 * answers in simulation and wrong ones on a chip. This check finds them in
 * the program itself: a DM scratch tensor is live from the first instruction
 * that names it to the last, widened to a whole loop when it is named both
 * inside and outside the loop (a loop body runs again after its last
 * instruction); two tensors whose byte ranges in a slice meet may not be
 * live at once. Instruction order is program order: the engines' overlap is
 * ordered by the tokens the lowering emits with the uses. */
#include "backend-tcp/compiler/legacy/lower_int.h"

typedef struct span {
	int64_t lo, hi; /* first and last instruction naming the tensor, -1: none */
} span;

static void widen_to_loops(const tcp_program *p, span *s)
{
	for (bool again = true; again;) {
		again = false;
		for (uint32_t k = 0; k < p->ncode; k++) {
			const tcp_insn *in = &p->code[k];
			if ((in->op != TCP_OP_BR && in->op != TCP_OP_JMP) || in->target < 0 || (uint32_t)in->target > k)
				continue;
			int64_t a = in->target, b = k; /* a loop: body [a, b] */
			for (uint32_t t = 0; t < p->nt; t++) {
				if (s[t].lo < 0 || s[t].hi < a || s[t].lo > b || (s[t].lo >= a && s[t].hi <= b))
					continue;
				/* named inside and outside the loop: live through all of it */
				if (s[t].lo > a)
					s[t].lo = a, again = true;
				if (s[t].hi < b)
					s[t].hi = b, again = true;
			}
		}
	}
}

static void spans(const tcp_program *p, span *s)
{
	for (uint32_t t = 0; t < p->nt; t++)
		s[t] = (span){-1, -1};
	for (uint32_t k = 0; k < p->ncode; k++)
		for (int w = 0; w < TCP_NVIEW; w++) {
			int32_t t = p->code[k].v[w].t;
			if (t < 0 || (uint32_t)t >= p->nt)
				continue;
			if (s[t].lo < 0)
				s[t].lo = k;
			s[t].hi = k;
		}
	widen_to_loops(p, s);
}

void tcpl_live_spans(moe_ctx *ctx, const tcp_program *p, int64_t *lo, int64_t *hi)
{
	span *s = ctx_alloc(ctx, (p->nt + 1) * sizeof *s);
	spans(p, s);
	for (uint32_t t = 0; t < p->nt; t++) {
		lo[t] = s[t].lo;
		hi[t] = s[t].hi;
	}
	ctx_free(ctx, s, (p->nt + 1) * sizeof *s);
}

int tcpl_check_dm(moe_ctx *ctx, const tcp_program *p, moe_loc loc)
{
	span *s = ctx_alloc(ctx, (p->nt + 1) * sizeof *s);
	spans(p, s);
	int bad = 0;
	for (uint32_t a = 0; a < p->nt && bad < 4; a++) {
		const tcp_tensor *ta = &p->t[a];
		if (ta->space != TCP_DM || ta->kind != TCP_T_SCRATCH || s[a].lo < 0)
			continue;
		for (uint32_t b = a + 1; b < p->nt && bad < 4; b++) {
			const tcp_tensor *tb = &p->t[b];
			if (tb->space != TCP_DM || tb->kind != TCP_T_SCRATCH || s[b].lo < 0)
				continue;
			bool bytes = ta->addr < tb->addr + tb->slice_bytes && tb->addr < ta->addr + ta->slice_bytes;
			bool live = s[a].lo <= s[b].hi && s[b].lo <= s[a].hi;
			if (!bytes || !live)
				continue;
			moe_diag(ctx, MOE_DIAG_ERROR, loc,
				 "tcp: DM tensors '%s' (%%%u, @%lld..@%lld) and '%s' (%%%u, @%lld..@%lld) share bytes "
				 "%lld..%lld of each slice while both are live (a moec bug)",
				 ta->name, a, (long long)s[a].lo, (long long)s[a].hi, tb->name, b, (long long)s[b].lo,
				 (long long)s[b].hi, (long long)(ta->addr > tb->addr ? ta->addr : tb->addr),
				 (long long)((ta->addr + ta->slice_bytes < tb->addr + tb->slice_bytes ? ta->addr + ta->slice_bytes
												: tb->addr + tb->slice_bytes) - 1));
			bad++;
		}
	}
	ctx_free(ctx, s, (p->nt + 1) * sizeof *s);
	return bad;
}
