/* backend-c/pack.c: bf16 weights packed once per run for the vdpbf16ps tiles.
 *
 * A CS_DOT tile reads DOT_LANES rows of W (wstride apart) and, per step of
 * 2 * DOT_LANES k, needs them as DOT_LANES vectors of bf16 pairs: vector p
 * holds, for each lane j, the pair W[row j, k0 + 2p .. k0 + 2p + 1]. Read as
 * stored, that is 16 loads 4 KB or more apart and a 16 x 16 transpose in
 * registers per step; the loads from 16 rows at once defeat the hardware
 * prefetcher, so a tile over weights in memory streams them at a fraction of
 * the memory bandwidth (Qwen3-30B-A3B, T = 32: 3.2 GB/s on one core).
 *
 * The packed copy holds each tile of DOT_LANES rows as one contiguous run of
 * the same length, in exactly the order the kernel consumes it:
 *   packed[(r / L) * L * K + (k / 2L) * 2L * L + ((k % 2L) / 2) * 2L + (r % L) * 2 + k % 2]
 *     = W[r * K + k]                                   (L = DOT_LANES)
 * so a tile whose first row is a multiple of L starts at the same element
 * index in both copies and each step is 16 aligned 64-byte loads in a row.
 * The products, their pairing and the order of the additions are those of
 * the unpacked vdpbf16ps kernel: results are bitwise the same. */
#include <stdint.h>
#include <string.h>

#include "backend-c/cgen.h"

enum { PACK_UNSEEN = 0, PACK_OK = 1, PACK_NO = 2 };

static void plan_block(const cg_prog *p, const cg_block *blk, uint8_t *st, int64_t *kof)
{
	for (const cg_stmt *s = blk->first; s; s = s->next) {
		if (s->kind == CS_DOT && s->dot) {
			const cg_dot *d = s->dot;
			const cg_buf *w = &p->bufs[d->wbuf], *a = &p->bufs[d->abuf];
			bool ok = w->kind == CB_WEIGHT && w->dtype == MOE_BF16 && a->dtype == MOE_BF16 && d->K > 0 &&
				d->K % (2 * DOT_LANES) == 0 && d->wstride == d->K && w->numel % (DOT_LANES * d->K) == 0 &&
				(st[d->wbuf] == PACK_UNSEEN || kof[d->wbuf] == d->K);
			if (st[d->wbuf] != PACK_NO)
				st[d->wbuf] = ok ? PACK_OK : PACK_NO;
			kof[d->wbuf] = d->K;
		}
		plan_block(p, &s->body, st, kof);
		plan_block(p, &s->els, st, kof);
	}
}

int cgen_pack_plan(const cg_prog *p, int *slot, int64_t *rowlen)
{
	uint8_t *st = ctx_alloc(p->ctx, p->nbufs + 1);
	int64_t *kof = ctx_alloc(p->ctx, (p->nbufs + 1) * sizeof *kof);
	memset(st, 0, p->nbufs + 1);
	memset(kof, 0, (p->nbufs + 1) * sizeof *kof);
	plan_block(p, &p->body, st, kof);
	int n = 0;
	for (uint32_t i = 0; i < p->nbufs; i++) {
		slot[i] = st[i] == PACK_OK ? n++ : -1;
		rowlen[i] = st[i] == PACK_OK ? kof[i] : 0;
	}
	ctx_free(p->ctx, st, p->nbufs + 1);
	ctx_free(p->ctx, kof, (p->nbufs + 1) * sizeof *kof);
	return n;
}

void cgen_pack_tiles(const uint16_t *src, uint16_t *dst, int64_t K, int64_t t0, int64_t t1)
{
	enum { L = DOT_LANES };
	/* pairs of bf16 move as 32-bit words; row by row, so that the reads
	 * stream and the writes stay in one tile (L * K elements, in L2) */
	for (int64_t t = t0; t < t1; t++)
		for (int j = 0; j < L; j++) {
			const uint16_t *s = src + (t * L + j) * K;
			uint16_t *d = dst + t * L * K + 2 * j;
			for (int64_t k = 0; k < K; k += 2) {
				uint32_t w;
				memcpy(&w, s + k, sizeof w);
				memcpy(d + (k / (2 * L)) * 2 * L * L + ((k % (2 * L)) / 2) * 2 * L, &w, sizeof w);
			}
		}
}
