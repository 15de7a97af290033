/* backend-tcp/compiler/recipe_contract.c: sched-build's recipe for einsum
 * `[M, I] x [O, I] -> [M, O]` (ir_einsum_form's MATMUL_NT without batch
 * letters): the second operand stationary in two TRF tiles that alternate,
 * tiled by plan(); each tile loaded by sub.ldtrf, then one
 * tu.contract per reduction chunk, the chunks after the first continuing the
 * f32 partial sums of an f32 DM buffer (flags=acc), the last committing the
 * node's dtype. Every output element is the sum of its products in index
 * order in f32, whatever the tiling. f32 operands
 * contract as bf16x3; a widened einsum (f32 of two bf16 values cast to f32,
 * the casts marked tcp_view by tcp-plan-fusion) contracts the bf16 values.
 * In a loop body a node masked by the block's rows
 * computes them under valid=$rows. */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"
#include "backend-tcp/isa/cost.h"

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

static int64_t rup(int64_t x, int64_t a)
{
	return cdiv(x, a) * a;
}

/* One command of contract(): `rows` rows per slice against t TRF rows of cg
 * column groups over R row groups, the chunk of `in` at i0 of I, priced as
 * the machine charges it (isa/cost.c, as sim_exec.c computes its load): the
 * streamed rows, the partial sums read (acc) and the outputs written (the
 * f32 partial, or ob bytes for the last chunk) all over the switch, which
 * the spread operands take, and its ring; its issue; against the
 * sub-context load of its TRF tile, which overlaps the previous command.
 * *load: that load's cycles. */
static int64_t chunk_cycles(const moe_tcp_machine *m, const tcp_cm *cm, int64_t rows, int64_t t, int64_t cg, int64_t R,
	int64_t e, int64_t ob, int64_t i0, int64_t in, int64_t I, int64_t *load)
{
	int64_t S = tcp_slices(m), issue = tcp_cost_issue(cm, TCP_CTX_MAIN), db = i0 + in == I ? ob : 4, sb = i0 ? 4 : 0;
	tcp_mm_load l = {rows, t, in, 1, TCP_MT_BF16, e == 4, e, db + sb, rows * (in * e + t * (db + sb)),
		S < cg * R ? S : cg * R, false};
	int64_t fp = rup(t * in * e, m->flit_bytes), run = tcp_cost_contract(cm, &l).total + issue;
	*load = tcp_cost_sub(cm, fp, cdiv(fp, R)) + issue;
	return run > *load ? run : *load;
}

/* The cycles of contract() for M rows with `os` TRF rows per slice and
 * reduction chunks of `it` (chunk_cycles per command; the full passes over
 * O alike, and the chunks between the first and the last alike). The first
 * TRF load adds its own cycles, except in a loop body (hidden: it runs
 * while the previous block computes). */
static int64_t plan_cycles(const moe_tcp_machine *m, const tcp_cm *cm, int64_t M, int64_t O, int64_t I, int64_t e,
	int64_t ob, int64_t os, int64_t it, bool hidden)
{
	int64_t S = tcp_slices(m), opass = O < S * os ? O : S * os, nch = cdiv(I, it), total = 0, load = 0;
	for (int part = 0; part < 2; part++) { /* the full passes, then the partial one */
		int64_t on = part ? O % opass : opass, np = part ? on > 0 : O / opass;
		if (np == 0)
			continue;
		int64_t t = os < on ? os : on, cg = cdiv(on, t), R = S / cg > 0 ? S / cg : 1, rows = cdiv(M, R), pass = 0;
		for (int64_t k = 0; k < nch; k = k == 0 && nch > 2 ? nch - 1 : k + 1) {
			int64_t i0 = k * it, in = I - i0 < it ? I - i0 : it, ld = 0;
			int64_t c = chunk_cycles(m, cm, rows, t, cg, R, e, ob, i0, in, I, &ld);
			pass += k == 0 && nch > 2 ? c + (nch - 2) * chunk_cycles(m, cm, rows, t, cg, R, e, ob, it, it, I, &ld) : c;
			if (k == 0 && !part)
				load = ld;
		}
		total += np * pass;
	}
	return total + (hidden ? 0 : load);
}

/* The tiling (docs/tcp-isa.md 6): for every number of TRF rows per slice
 * `os`, each reduction chunk tcp_chunk_tries gives (`aligned`: the weight
 * rows are whole HBM granules); the tiling with the fewest cycles
 * (plan_cycles) wins. A chunk boundary only moves where the f32 partial sums
 * are stored and read back, so every tiling sums each output's products in
 * the same order. */
static cplan plan(const moe_tcp_machine *m, int64_t M, int64_t O, int64_t I, int wdt, int64_t ob, bool hidden,
	bool aligned)
{
	cplan best = {M, O, I, 0, 0, 0};
	int64_t S = tcp_slices(m), e = wdt == MOE_F32 ? 4 : 2, best_t = -1, its[4];
	tcp_cm cm;
	tcp_cm_init(&cm, m);
	for (int64_t os = 1; os <= O; os++) {
		int n = tcp_chunk_tries(m, os, I, e, aligned, its);
		if (n == 0)
			break;
		for (int v = 0; v < n; v++) {
			int64_t t = plan_cycles(m, &cm, M, O, I, e, ob, os, its[v], hidden);
			if (best_t < 0 || t < best_t) {
				best_t = t;
				best.It = its[v];
				best.Os = os;
				best.Opass = O < S * os ? O : S * os;
			}
		}
	}
	return best;
}

static tcp_view vview(const sb_val *v, int64_t base, int64_t s0, int64_t s1, int64_t s2)
{
	return sb_view_at(v, base, 3, (const int64_t[3]){s0, s1, s2});
}

typedef struct cargs {
	const sb_val *a, *w, *d;
	int64_t am, ai, wo, wi, dm, dn;
	int wdt;
	ts_id acc, trf[2];
	ts_id ring;           /* streamed weights: the loop's ring of weight tiles in DM, else TS_NONE */
	int64_t nring, wtile; /* its slots and elements per slot */
} cargs;

/* The TRF tiles of a contraction that loads nload tiles of dtype dt and
 * shape sh = {Opass, It} with os TRF rows per slice (two tiles when it loads
 * more than one), placed at the two halves of TRF. A tile's footprint per
 * slice, whole flits, is the larger of its os rows of It elements and its
 * even share of all Opass rows over the S slices. Loads alternate between
 * the tiles, and the next contraction's first tile takes the half this
 * one's last load did not, so that its first load does not wait for this
 * one's last pass (two tiles on the same bytes are ordered by a reuse edge).
 * A tile larger than a half takes all of TRF. */
void sb_trf_tiles(sb *b, moe_id id, int64_t nload, int64_t os, moe_dtype dt, const int64_t sh[2], ts_id *trf)
{
	int64_t e = moe_dtype_size(dt), flit = b->m->flit_bytes;
	int64_t rows = rup(os * sh[1] * e, flit), share = rup((sh[0] * sh[1] * e + b->S - 1) / b->S, flit);
	int64_t foot = rows > share ? rows : share;
	int ntile = nload > 1 ? 2 : 1, first = b->trf_next & 1;
	int64_t half = tcp_trf_bytes(b->m) / 2;
	trf[1] = TS_NONE;
	for (int k = 0; k < ntile; k++) {
		trf[k] = ts_add_buf(b->s, k ? "trf.1" : "trf.0", TCP_TRF, TCP_T_SCRATCH, dt, 2, sh);
		ts_buf *t = &b->s->buf[trf[k]];
		t->node = id;
		t->layout = (ts_layout){0, (uint16_t)b->S, 1, TS_SPLIT_FLIT, foot};
		t->offset = foot <= half ? ((first + k) & 1) * half : k * half;
	}
	b->trf_last[0] = foot <= half ? trf[0] : TS_NONE;
	b->trf_last[1] = foot <= half ? trf[1] : TS_NONE;
	if (foot <= half) /* the last load used tile (nload - 1) % ntile */
		b->trf_next = (uint8_t)(((first + (nload - 1) % ntile) & 1) ^ 1);
}

/* Block g + 1's first TRF load waits for block g's last reader of that
 * half. When the body (its buffers from nbuf0 on) ends its last contraction
 * on the half its first contraction begins with, the last contraction's
 * tiles swap halves: its first load then shares a half with the contraction
 * before it, whose output it reads through the body's passes, an order the
 * data gives anyway. */
void sb_trf_wrap(sb *b, ts_id nbuf0)
{
	tcp_sched *s = b->s;
	int64_t half = tcp_trf_bytes(b->m) / 2;
	ts_id first = TS_NONE, *t = b->trf_last;
	for (ts_id i = nbuf0; i < s->nbuf && first == TS_NONE; i++)
		if (s->buf[i].space == TCP_TRF)
			first = i;
	if (first == TS_NONE || t[0] == TS_NONE || t[0] < nbuf0 || t[0] == first ||
		s->buf[first].layout.slice_bytes > half)
		return;
	int64_t last = (int64_t)((b->trf_next & 1) ^ 1) * half;
	if (last != s->buf[first].offset)
		return;
	for (int k = 0; k < 2; k++)
		if (t[k] != TS_NONE)
			s->buf[t[k]].offset = half - s->buf[t[k]].offset;
	b->trf_next ^= 1;
}

static void trf_tiles(sb *b, moe_id id, const cplan *pl, int wdt, ts_id *trf)
{
	int64_t nload = (pl->I + pl->It - 1) / pl->It * ((pl->O + pl->Opass - 1) / pl->Opass);
	int64_t sh[2] = {pl->Opass, pl->It};
	sb_trf_tiles(b, id, nload, pl->Os, (moe_dtype)wdt, sh, trf);
}

/* the lifetime of buffer t: the ops [first, last] of this contraction */
static void span(sb *b, ts_id t, ts_id first, ts_id last)
{
	b->s->buf[t].life = TS_LIFE_SPAN;
	b->s->buf[t].first = first;
	b->s->buf[t].last = last;
}

/* the passes; span[k] receives TRF tile k's first writer and last reader.
 * Streamed weights: each TRF tile's part of the weights is copied from HBM
 * into the loop ring's next slot (counted over the block's tiles) just
 * before its sub load, after the load that read that slot before. */
static void contract(sb *b, moe_id id, const cplan *pl, const cargs *c, ts_id span[2][2])
{
	int64_t nch = (pl->I + pl->It - 1) / pl->It, npass = (pl->O + pl->Opass - 1) / pl->Opass;
	int k = 0;
	for (int64_t ps = 0; ps < npass && !b->failed; ps++) {
		int64_t o0 = ps * pl->Opass, on = pl->O - o0 < pl->Opass ? pl->O - o0 : pl->Opass;
		for (int64_t ch = 0; ch < nch; ch++) {
			int64_t i0 = ch * pl->It, inn = pl->I - i0 < pl->It ? pl->I - i0 : pl->It;
			int cur = k;
			ts_id tt = c->trf[cur];
			k = c->trf[1] != TS_NONE ? k ^ 1 : 0;
			const int64_t ld_dim[2] = {on, inn}, ld_st[2] = {inn, 1};
			tcp_view wsrc = vview(c->w, o0 * c->wo + i0 * c->wi, c->wo, c->wi, 0);
			ts_id fetch = TS_NONE;
			int64_t rs = b->wnext % (c->nring ? c->nring : 1);
			if (c->ring != TS_NONE) { /* the tile into the ring's next slot, after that slot's last reader */
				tcp_view rv = tcp_b_view((int32_t)c->ring, rs * c->wtile, 2, ld_st);
				tcp_insn dm = tcp_b_dma_copy(2, ld_dim, rv, wsrc);
				fetch = ts_add_op(b->s, b->rg, &dm, b->phase);
				b->s->op[fetch].node = id;
				if (b->wrd[rs] != TS_NONE)
					ts_add_dep(b->s, fetch, b->wrd[rs], 0);
				b->wnext++;
				wsrc = rv;
			}
			tcp_insn ld = tcp_b_ldtrf(2, ld_dim, tcp_b_view((int32_t)tt, 0, 2, ld_st), wsrc, true);
			ts_id lo = sb_emit(b, &ld, id);
			if (fetch != TS_NONE) {
				ts_add_dep(b->s, lo, fetch, 0);
				b->wrd[rs] = lo;
			}
			if (span[cur][0] == TS_NONE)
				span[cur][0] = lo;
			bool last = ch == nch - 1;
			tcp_view dst = last ? vview(c->d, o0 * c->dn, c->dm, c->dn, 0) : tcp_b_view((int32_t)c->acc, o0, 2,
				(const int64_t[2]){pl->O, 1});
			tcp_view s2 = tcp_view_none();
			if (ch > 0)
				s2 = tcp_b_view((int32_t)c->acc, o0, 2, (const int64_t[2]){pl->O, 1});
			const int64_t cdim[3] = {pl->M, on, inn};
			tcp_insn in = tcp_b_contract(cdim, dst, vview(c->a, i0 * c->ai, c->am, 0, c->ai),
				tcp_b_view((int32_t)tt, 0, 3, (const int64_t[3]){0, inn, 1}), s2, pl->Os < on ? pl->Os : on);
			in.flags |= TCP_F_ROUTE | (c->wdt == MOE_F32 ? TCP_F_BF16X3 : 0);
			if (SBN(b, id)->valid != MOE_NONE)
				in.vreg = (int32_t)sb_valid(b, id);
			span[cur][1] = sb_emit(b, &in, id);
		}
	}
}

/* A contraction outside the loop whose weights stay in HBM (the top graph's
 * weights streamed, b->top_stream): each TRF tile's part of them is copied
 * into a ring of two tiles of its own, live over this contraction only, as
 * the loop's ring is filled (contract()); the loop's ring state is kept
 * aside meanwhile. The tiles, their loads and the contractions are those of
 * the weights held whole in DM, so the values are the same. */
static void top_streamed(sb *b, moe_id id, const cplan *pl, cargs *c, ts_id sp[2][2])
{
	uint32_t wnext = b->wnext;
	ts_id wrd[TS_MAX_RING];
	memcpy(wrd, b->wrd, sizeof wrd);
	for (int k = 0; k < TS_MAX_RING; k++)
		b->wrd[k] = TS_NONE;
	b->wnext = 0;
	c->ring = sb_dm_buf(b, id, "wbuf", (moe_dtype)c->wdt, 1, &c->wtile);
	b->s->buf[c->ring].slots = 2;
	sb_spread(b, c->ring);
	c->nring = 2;
	ts_id op0 = b->s->nop;
	contract(b, id, pl, c, sp);
	b->wnext = wnext;
	memcpy(b->wrd, wrd, sizeof wrd);
	if (b->failed)
		return;
	span(b, c->ring, op0, b->s->nop - 1);
	for (int k = 0; k < 2; k++)
		if (c->trf[k] != TS_NONE)
			span(b, c->trf[k], sp[k][0], sp[k][1]);
}

/* A one-operand einsum that reorders letters: a view with the strides permuted. */
static void permute(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	ir_einsum e;
	char msg[128];
	const sb_val *v = &b->v[n->args[0]];
	if (v->kind != SV_VIEW)
		v = sb_dm_val(b, n->args[0]);
	if (!v)
		return;
	if (!ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg)) {
		sb_err(b, id, "einsum: %s", msg);
		return;
	}
	sb_val r = *v;
	for (int k = 0; k < e.out_rank; k++) {
		const char *p = memchr(e.in[0], e.out[k], (size_t)e.rank[0]);
		r.stride[k] = p ? v->stride[p - e.in[0]] : 0;
	}
	b->v[id] = r;
}

void sb_einsum(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	int batch = 0;
	ir_ein_form form = ir_node_einsum_form(n, &batch);
	if (n->nargs == 1 && (form == IR_EIN_PERMUTE || form == IR_EIN_IDENTITY)) {
		permute(b, id);
		return;
	}
	if (sb_qact_einsum(b, id)) /* recipe_qact.c */
		return;
	if (n->nargs != 2 || ir_node_einsum_form(n, &batch) != IR_EIN_MATMUL_NT || batch != 0) {
		/* outside a loop body tcp-einsum-canon (gpass/einsum_canon.c) rewrote every other form */
		sb_refuse(b, id, b->rows != TS_NONE ? "an einsum other than [M, I] x [O, I] -> [M, O] in a loop body"
						    : "an einsum other than [M, I] x [O, I] -> [M, O] (run tcp-einsum-canon)");
		return;
	}
	moe_id aid = n->args[0], wid = n->args[1];
	bool wa = sb_widened_operand(b, aid), ww = sb_widened_operand(b, wid);
	if (wa != ww || (wa && n->dtype != MOE_F32)) {
		sb_err(b, id, "%s: a widened einsum is f32 of two casts of bf16 values, both marked", IR_NK_TCP_VIEW);
		return;
	}
	if (wa) /* the bf16 values into the f32 accumulator (the casts are views) */
		aid = SBN(b, aid)->args[0], wid = SBN(b, wid)->args[0];
	const ir_node *an = SBN(b, aid), *wn = SBN(b, wid);
	if (an->dtype != wn->dtype || (an->dtype != MOE_BF16 && an->dtype != MOE_F32)) {
		sb_refuse(b, id, "a contraction whose operands are not both bf16 or both f32");
		return;
	}
	cargs c;
	memset(&c, 0, sizeof c);
	const sb_val *wv = &b->v[wid];
	/* a streamed expert: a view of its row in HBM, moved by the block's expert */
	bool stream = b->weights == TS_W_STREAM && b->rows != TS_NONE && wv->kind == SV_VIEW && wv->reg != TS_NONE &&
		      b->s->buf[wv->buf].space == TCP_HBM;
	/* outside the loop, with the top graph's weights streamed: a weight in HBM read in place */
	bool tstream = b->top_stream && b->rows == TS_NONE && wv->kind == SV_VIEW && wv->reg == TS_NONE &&
		       b->s->buf[wv->buf].space == TCP_HBM && b->s->buf[wv->buf].kind != TCP_T_SCRATCH;
	c.w = stream || tstream ? wv : sb_dm_val(b, wid); /* the stationary operand's copy first */
	c.a = c.w ? sb_dm_val(b, aid) : NULL;
	if (!c.a)
		return;
	c.d = sb_out_val(b, id);
	c.wdt = an->dtype;
	int64_t M = an->shape[0], I = an->shape[1], O = wn->shape[0];
	c.am = c.a->stride[0], c.ai = c.a->stride[1], c.wo = c.w->stride[0], c.wi = c.w->stride[1];
	c.dm = c.d->stride[0], c.dn = c.d->stride[1];
	/* in a loop body, priced at the mean of valid rows spread evenly over [1, M]
	 * (row-classes runs a block at its class; most blocks hold far fewer than M) */
	bool body = b->rows != TS_NONE;
	/* weight rows that start on granule boundaries (a chunk of whole granules keeps them whole) */
	int64_t wrow = c.wo * (c.wdt == MOE_F32 ? 4 : 2);
	cplan pl = plan(b->m, body ? (M + 1) / 2 : M, O, I, c.wdt, (int64_t)moe_dtype_size(n->dtype), body,
		wrow % b->m->hbm_granule == 0);
	pl.M = M;
	c.acc = TS_NONE;
	if ((pl.I + pl.It - 1) / pl.It > 1) {
		int64_t sh[2] = {M, O};
		c.acc = sb_dm_buf(b, id, "contract.acc", MOE_F32, 2, sh);
	}
	trf_tiles(b, id, &pl, c.wdt, c.trf);
	c.ring = TS_NONE;
	c.wtile = pl.Opass * pl.It;
	for (uint32_t k = 0; k < b->wd.n && !stream; k++) /* a double-buffered expert: what streaming it would need */
		if (b->wd.buf[k] == c.w->buf && b->wd.stream[k]) {
			int64_t tb = c.wtile * (int64_t)moe_dtype_size((moe_dtype)c.wdt);
			b->wd.tile_bytes = tb > b->wd.tile_bytes ? tb : b->wd.tile_bytes;
		}
	if (stream) {
		const ts_buf *r = b->wring != TS_NONE ? &b->s->buf[b->wring] : NULL;
		if (!r || r->dtype != c.wdt || r->shape[0] < c.wtile) {
			sb_refuse(b, id, "streamed weights whose tiles do not fit the loop's ring");
			return;
		}
		c.ring = b->wring;
		c.nring = r->slots;
		c.wtile = r->shape[0];
	}
	ts_id sp[2][2] = {{TS_NONE, TS_NONE}, {TS_NONE, TS_NONE}};
	if (tstream) {
		top_streamed(b, id, &pl, &c, sp);
		return;
	}
	contract(b, id, &pl, &c, sp);
	if (b->failed)
		return;
	for (int k = 0; k < 2; k++)
		if (c.trf[k] != TS_NONE)
			span(b, c.trf[k], sp[k][0], sp[k][1]);
}
