/* backend-tcp/compiler/plan.c: the tiling of a contraction chosen with the
 * machine's cost rules (docs/tcp-isa.md section 6), as the W8A8 recipes, the
 * pairing passes and block=auto's model use it. */
#include <math.h>
#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"
#include "backend-tcp/isa/cost.h"

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

static int64_t rup(int64_t a, int64_t b)
{
	return cdiv(a, b) * b;
}

/* The cycles of a contraction of M rows with `os` TRF rows per slice and
 * reduction chunks of `it`, O x I, in its passes and chunks: per chunk the
 * main-context pass over each row tile of `tiles` (MACs, streamed packets,
 * commit, its latency and issue) against the sub-context TRF load, which
 * overlap, plus the first load (*load: one chunk's). `tiles` row counts
 * (NULL: one tile of M rows) are guarded row tiles (docs/tcp-isa.md 7.4), all
 * on one TRF tile. */
int64_t tcp_contract_cycles(const moe_tcp_machine *m, int64_t os, int64_t it, int64_t O, int64_t I, int wdt,
	const int64_t *tiles, int ntiles)
{
	/* f8 x f8 at the fp8 rate (act=fp8), i8 x i8 at the i8 rate (W8A8) */
	int mt = wdt == MOE_F8E4M3 ? TCP_MT_F8 : wdt == MOE_I8 ? TCP_MT_I8 : TCP_MT_BF16;
	int64_t S = tcp_slices(m), e = wdt == MOE_F32 ? 4 : wdt == MOE_F8E4M3 || wdt == MOE_I8 ? 1 : 2;
	tcp_cm cm;
	tcp_cm_init(&cm, m);
	int64_t issue = tcp_cost_issue(&cm, TCP_CTX_MAIN);
	int64_t opass = O < S * os ? O : S * os, npass = cdiv(O, opass), nch = cdiv(I, it);
	int64_t cg = cdiv(opass, os), R = S / cg > 0 ? S / cg : 1, total = 0;
	for (int last = 0; last < 2; last++) { /* the nch - 1 whole chunks, then the last */
		int64_t in = last ? I - (nch - 1) * it : it, main_ = 0;
		for (int k = 0; k < ntiles; k++) {
			/* one pass over the tile, accumulating in f32 (8 bytes committed per output) */
			tcp_mm_load l = {cdiv(tiles[k], R), os, in, 1, mt, wdt == MOE_F32, e, 8, 0, 0, false};
			main_ += tcp_cost_contract(&cm, &l).total + issue;
		}
		int64_t fp = rup(os * in * e, m->flit_bytes), load = tcp_cost_sub(&cm, fp, cdiv(fp, R)) + issue;
		total += (last ? 1 : nch - 1) * (main_ > load ? main_ : load);
	}
	int64_t fp0 = rup(os * it * e, m->flit_bytes), load0 = tcp_cost_sub(&cm, fp0, cdiv(fp0, R)) + issue;
	return npass * total + load0;
}

int tcp_chunk_tries(const moe_tcp_machine *m, int64_t os, int64_t I, int64_t e, bool aligned, int64_t its[4])
{
	int64_t fit = tcp_trf_bytes(m) / 2 / (os * e), ge = m->hbm_granule / e;
	if (fit < 1)
		return 0;
	bool gran = ge > 32 && fit >= ge; /* chunks of whole granules fit */
	int n = 0;
	for (int u = 0; u < 1 + (gran && !aligned); u++) { /* the granule's multiples, then 32's */
		int64_t unit = gran && !u ? ge : 32, it = fit < I && fit >= unit ? fit / unit * unit : fit;
		it = it < I ? it : I;
		int64_t even = rup(cdiv(I, cdiv(I, it)), unit);
		its[n++] = it;
		if (even < it && it < I)
			its[n++] = even;
	}
	return n;
}

/* For each number of TRF rows per slice (Os) and each reduction chunk (It)
 * tcp_chunk_tries gives, estimate the contraction (tcp_contract_cycles) and
 * take the tiling with the smallest total. Few rows per slice reload TRF for
 * little work; many starve the stream. bf16 and f32 weights whose rows are
 * not whole granules also try multiples of 32, as recipe_contract.c's plan
 * does; f8 and i8 chunks stay whole granules (the scaled contractions'
 * 128-wide scale chunks). */
cplan tcp_plan_contract(const moe_tcp_machine *m, int64_t M, int64_t O, int64_t I, int wdt, int64_t *cycles)
{
	cplan best = {M, O, I, 0, 0, 0};
	int64_t S = tcp_slices(m), best_t = -1;
	int64_t e = wdt == MOE_F32 ? 4 : wdt == MOE_F8E4M3 || wdt == MOE_I8 ? 1 : 2, its[4];
	bool aligned = e == 1 || I * e % m->hbm_granule == 0;
	tcp_cm cm;
	tcp_cm_init(&cm, m);
	int64_t issue = tcp_cost_issue(&cm, TCP_CTX_MAIN);
	for (int64_t os = 1; os <= O; os++) {
		/* every chunk os tries is at most fit, so it takes at least
		 * cdiv(I, fit) chunks, each one main-context pass paying its issue
		 * (tcp_contract_cycles): a bound that only grows with os */
		int64_t fit = tcp_trf_bytes(m) / 2 / (os * e);
		if (best_t >= 0 && fit >= 1 && cdiv(I, fit < I ? fit : I) * issue >= best_t)
			break;
		int n = tcp_chunk_tries(m, os, I, e, aligned, its);
		if (n == 0)
			break;
		for (int v = 0; v < n; v++) {
			int64_t t = tcp_contract_cycles(m, os, its[v], O, I, wdt, &M, 1);
			if (best_t < 0 || t < best_t) {
				best_t = t;
				best.It = its[v];
				best.Os = os;
				best.Opass = O < S * os ? O : S * os;
			}
		}
	}
	if (cycles)
		*cycles = best_t;
	return best;
}
