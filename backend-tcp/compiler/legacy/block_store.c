/* backend-tcp/block_store.c: the block loop's result stores (docs/tcp-isa.md
 * 7.4, "Deferred result stores").
 *
 * A block result read after the loop (the down projection's rows, gathered
 * by the combine) is copied from its DM buffer to its slot of the HBM grid.
 * The DMA context runs its commands in order, and that copy must wait for
 * the block's last contraction; issued at the end of block g, it holds every
 * later DMA (the weights of block g + 1) until block g's arithmetic is done,
 * and the weight stream stops at every block boundary. So block g's copy is
 * issued in block g + 1, after its first contraction: the DMA context
 * streams block g + 1's first weights while block g finishes, and the copy
 * then finds its data ready. The hazards order block g + 1's write of the
 * buffer after the copy's read. The last block (g + 1 = nblocks) copies its
 * own result at its end. R_PG holds the block whose copy is pending (-1:
 * none), R_PROWS its row count. */
#include "backend-tcp/compiler/legacy/lower_int.h"

/* A block's value of `rows` rows of `rowlen` elements copied from its DM
 * buffer to its slot (greg) of the HBM grid, by the row count in creg: a
 * block of at most h rows (h = f, 4f, ... below rows) copies h rows, a
 * fuller one all of them (the rows past its count are never read back: the
 * combine gathers real pairs only); with streamed weights (s->fine) the
 * rows of the row tiles its contractions ran (lower_contract.c). */
static void copy_part(lw *c, const tcpl_bstore *s, int greg, int64_t r0, int64_t rows)
{
	dma_copy(c, s->home, r0 * s->rowlen, greg, s->rows * s->rowlen, s->src, r0 * s->rowlen, -1, 0, rows * s->rowlen);
	c->p->code[c->p->ncode - 1].flags |= TCP_F_JOIN; /* sets up while the DMA before it transfers */
}

/* Rows [0, h / 2) of a block, then tiles of h / 8 up to h while the count
 * in creg reaches them (the row tiles of a streamed contraction). */
static void step_copy(lw *c, const tcpl_bstore *s, int greg, int creg, int64_t h)
{
	uint32_t skip[8];
	int ns = 0;
	copy_part(c, s, greg, 0, h / 2);
	for (int64_t r0 = h / 2; r0 < h && ns < 8; r0 += h / 8) {
		li(c, R_ROWT, r0);
		skip[ns++] = br(c, TCP_C_GE, R_ROWT, creg); /* this tile and the later ones */
		copy_part(c, s, greg, r0, h - r0 < h / 8 ? h - r0 : h / 8);
	}
	for (int k = 0; k < ns; k++)
		patch(c, skip[k]);
}

static void class_copy(lw *c, const tcpl_bstore *s, int greg, int creg)
{
	uint32_t end[9 + TCP_MAX_UPPER];
	int ne = 0;
	int64_t f = tcpl_row_tile(s->rows);
	for (int64_t h = f; h < s->rows && ne < 8; h *= 4) {
		li(c, R_ROWT, h);
		uint32_t more = br(c, TCP_C_LT, R_ROWT, creg);
		if (s->fine && h > f)
			step_copy(c, s, greg, creg, h);
		else
			copy_part(c, s, greg, 0, h);
		end[ne++] = jmp(c);
		patch(c, more);
	}
	int64_t up[TCP_MAX_UPPER]; /* weights held in DM: the upper row classes (row_classes.c) */
	int nu = s->fine ? 0 : tcp_upper_classes(s->rows, f, up, TCP_MAX_UPPER);
	for (int k = 0; k < nu && ne < 8 + TCP_MAX_UPPER; k++) {
		li(c, R_ROWT, up[k]);
		uint32_t more = br(c, TCP_C_LT, R_ROWT, creg);
		copy_part(c, s, greg, 0, up[k]);
		end[ne++] = jmp(c);
		patch(c, more);
	}
	if (s->fine && s->rows >= 4 * f) { /* a block short of full */
		li(c, R_ROWT, s->rows);
		uint32_t full = br(c, TCP_C_GE, creg, R_ROWT);
		step_copy(c, s, greg, creg, s->rows);
		end[ne++] = jmp(c);
		patch(c, full);
	}
	copy_part(c, s, greg, 0, s->rows);
	for (int k = 0; k < ne; k++)
		patch(c, end[k]);
}

/* In block g's body, after its first contraction: block g - 1's results
 * (R_PG, R_PROWS), unless no block is pending. */
void tcpl_store_pending(lw *c, const tcpl_bstore *s, int ns)
{
	if (ns == 0)
		return;
	li(c, R_ROWT, 0);
	uint32_t none = br(c, TCP_C_LT, R_PG, R_ROWT);
	for (int k = 0; k < ns; k++)
		class_copy(c, &s[k], R_PG, R_PROWS);
	patch(c, none);
}

/* At the end of block g's body: the last block stores its own results,
 * any other leaves them pending for block g + 1. */
void tcpl_store_end(lw *c, const tcpl_bstore *s, int ns)
{
	if (ns == 0)
		return;
	uint32_t more = br(c, TCP_C_LT, R_NEXT, R_NB);
	for (int k = 0; k < ns; k++)
		class_copy(c, &s[k], R_G, R_ROWS);
	patch(c, more);
	alui(c, TCP_S_ADD, R_PG, R_G, TCP_NOREG, 0);
	alui(c, TCP_S_ADD, R_PROWS, R_ROWS, TCP_NOREG, 0);
}
