/* backend-tcp/list_rows.c: a block's row gather and its pair-order result
 * scatter by the row classes of its contractions (docs/tcp-isa.md 7.4,
 * "Index lists by row class").
 *
 * A dma.gather or dma.scatter pays the row overhead for every row of its
 * index list, the rows past its valid count included (A3): a block's token
 * rows (gathered from x) and its results (scattered into pair-rows) moved
 * by a list of B entries paid for B rows whatever the block's count. With
 * fast MACs the block loop is bound by the DMA context (Qwen3-30B-A3B at
 * T = 4096, B = 288, blocks of about 246 rows: 36 x 4 cycles per command
 * where 31 x 4 would do). So the command is emitted once per row class of
 * the block's contractions (f, 4f, ... below B, then the upper classes of
 * row_classes.c when the weights are held in DM), each guarded like theirs
 * (`li k, h; br.lt k, count`), with a list of h entries; a fuller block
 * runs the list of B. The rows a class leaves out, [h, B), are past the
 * block's count: the gather's list zeroes [count, h) as before, and rows
 * at and past h of the buffer keep an earlier block's values, which no
 * pass of class h reads (it runs over [0, h)) and every pass masks by the
 * count anyway (A6). The scatter moves the same real rows. */
#include "backend-tcp/compiler/legacy/lower_int.h"

static uint32_t class_cmd(lw *c, const tcp_insn *in, int kreg, int64_t h)
{
	li(c, kreg, h);
	uint32_t more = br(c, TCP_C_LT, kreg, in->vreg);
	tcp_insn t = *in;
	t.dim[1] = h;
	emit(c, &t);
	uint32_t end = jmp(c);
	patch(c, more);
	return end;
}

/* Emits `in` (dims [1, B, row], its count in in->vreg) with the list of the
 * smallest class of B holding the count; kreg is a scratch register other
 * than the count's. Another shape, no count or no kreg (-1): as it is. */
void tcpl_emit_list_rows(lw *c, const tcp_insn *in, int kreg)
{
	int64_t B = in->dim[1], f = tcpl_row_tile(B);
	uint32_t end[8 + TCP_MAX_UPPER];
	int ne = 0;
	if (in->ndim == 3 && in->dim[0] == 1 && in->vreg >= 0 && kreg >= 0 && in->vreg != kreg &&
		!(in->flags & TCP_F_VROWS)) {
		for (int64_t h = f; h < B && ne < 8; h *= 4)
			end[ne++] = class_cmd(c, in, kreg, h);
		int64_t up[TCP_MAX_UPPER];
		int nu = tcpl_upper_rows(c) ? tcp_upper_classes(B, f, up, TCP_MAX_UPPER) : 0;
		for (int k = 0; k < nu; k++)
			end[ne++] = class_cmd(c, in, kreg, up[k]);
	}
	tcp_insn t = *in;
	emit(c, &t);
	for (int k = 0; k < ne; k++)
		patch(c, end[k]);
}
