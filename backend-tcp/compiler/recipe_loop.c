/* backend-tcp/compiler/recipe_loop.c: sched-build's recipe for the
 * block_loop (docs/tcp-compiler.md 2.1 and 5.1): one ts_loop of G blocks
 * whose body runs for g < nblocks.
 * - The control values: those that are not constants are staged by one
 *   dma.spm (nblocks, the block experts, the valid rows: one descriptor
 *   each), then read by `ld` into the loop's scalars $nb, $e, $rows;
 *   constants are `const` scalars.
 * - A `b` operand (per block) read from HBM is copied into a DM buffer of one
 *   row at the top of the body; one in DM is a view of block $g's row in place.
 * - An `e` operand (per expert) by the loop's weights mode (b->weights, the
 *   DM planner's): double, a DM buffer of two slots, block 0's expert copied
 *   into slot 0 in the prologue and block g + 1's into slot (g + 1) & 1 in
 *   block g's body (under g + 1 < nb), the body reading slot g & 1; single,
 *   one slot filled at the top of the body; stream, a view of row $e in HBM
 *   when only contractions read it (recipe_contract.c copies its tiles into
 *   the loop's ring), else single.
 * - The body's nodes are built into the body region (phase expert); the value
 *   it yields is copied into row $g of the loop's result, an HBM buffer
 *   [G, ...] that starts zeroed (the rows of blocks past nblocks stay zero).
 * A write in the body depends on the previous block's accesses of the same
 * buffer (distance 1); a prefetch depends on nothing in its block. */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"

static int64_t row_numel(const ir_node *n)
{
	int64_t r = 1;
	for (int k = 1; k < n->rank; k++)
		r *= n->shape[k];
	return r;
}

static int64_t numel(const ir_node *n)
{
	int64_t r = 1;
	for (int k = 0; k < n->rank; k++)
		r *= n->shape[k];
	return r;
}

static bool control(sb *b, moe_id id, moe_id arg, bool vec, ctl *c)
{
	const ir_node *n = SBN(b, arg);
	sb_val *v = &b->v[arg];
	memset(c, 0, sizeof *c);
	if (v->kind == SV_IMM) {
		c->imm = true;
		c->k = v->imm;
		return true;
	}
	if (v->kind == SV_IOTA || (v->kind == SV_VIEW && vec && (v->stride[0] != 1 || v->base != 0 || v->reg != TS_NONE)))
		v = sb_copy_contig(b, arg);
	if (!v || v->kind != SV_VIEW || n->dtype != MOE_I32) {
		if (!b->failed)
			sb_refuse(b, id, "a block loop control value that is not an i32 tensor");
		return false;
	}
	c->v = *v;
	return true;
}

static ts_id ctl_scalar(sb *b, const char *name, const ctl *c, ts_id at)
{
	if (c->imm)
		return ts_add_scalar(b->s, b->rg, name, TS_SC_CONST, 0, TS_NONE, TS_NONE, (int32_t)c->k);
	ts_id s = ts_add_scalar(b->s, b->rg, name, TS_SC_SPM_LD, 0, at, TS_NONE, at == TS_NONE ? c->v.base : 0);
	b->s->sc[s].buf = c->v.buf;
	return s;
}

/* the staging of the values that are not constants, $nb and $g (the block's
 * expert and rows are read in the body: b->ctl); the loop's index */
static int stage(sb *b, moe_id id, int64_t G, ts_id *nb, ts_id *g)
{
	const ir_node *n = SBN(b, id);
	ctl c[3];
	for (int k = 0; k < 3; k++)
		if (!control(b, id, n->args[k], k > 0, &c[k]))
			return -1;
	tcp_view sv[3] = {tcp_view_none(), tcp_view_none(), tcp_view_none()};
	int ns = 0;
	for (int k = 0; k < 3; k++) {
		if (c[k].imm)
			continue;
		const int64_t st = k ? 1 : 0;
		sv[ns++] = tcp_b_view((int32_t)c[k].v.buf, c[k].v.base, 1, &st);
	}
	if (ns) {
		tcp_insn in = tcp_b_dma_spm(1, &G, sv[0], sv[1], sv[2]);
		sb_emit(b, &in, id);
	}
	*nb = ctl_scalar(b, "nb", &c[0], TS_NONE);
	int li = b->s->nloop;
	*g = ts_add_scalar(b->s, b->rg, "g", TS_SC_LOOPIDX, 0, TS_NONE, TS_NONE, li);
	b->ctl[0] = c[1];
	b->ctl[1] = c[2];
	return li;
}

/* Whether operand k of the loop is read in body bg only as the stationary
 * (second) operand of two-operand einsums: its tiles can be streamed. */
static bool streamable(const moe_graph *bg, int64_t k)
{
	bool used = false;
	for (moe_id i = 0; i < bg->nnodes; i++) {
		const ir_node *a = &bg->nodes[i];
		if (a->op != MOE_OP_BLOCKARG || ir_blockarg_role_of(a) != IR_BA_IN || ir_attr_int(a, "index", -1) != k)
			continue;
		for (moe_id u = i + 1; u < bg->nnodes; u++) {
			const ir_node *n = &bg->nodes[u];
			for (uint32_t j = 0; j < n->nargs; j++)
				if (n->args[j] == i) {
					used = true;
					if (n->op != MOE_OP_EINSUM || n->nargs != 2 || j != 1 || n->args[0] == i)
						return false;
				}
		}
	}
	return used;
}

/* The copy of one expert's (or block's) row from HBM view ov (row scalar
 * row) into DM buffer t at slot view dst (its reg and scale set by the caller). */
static tcp_insn row_copy(const sb_val *ov, const ir_node *rn, ts_id t, const sb_val *out, ts_id row)
{
	int nd = rn->rank ? rn->rank : 1;
	int64_t dim[TCP_MAXD];
	for (int k = 0; k < nd; k++)
		dim[k] = rn->rank ? rn->shape[k] : 1;
	tcp_view src = tcp_b_view((int32_t)ov->buf, ov->base, nd, rn->rank ? ov->stride + 1 : &(const int64_t){1});
	src.reg = (int32_t)row;
	src.scale = ov->stride[0];
	tcp_view dst = tcp_b_view((int32_t)t, 0, nd, rn->rank ? out->stride : &(const int64_t){1});
	return tcp_b_dma_copy(nd, dim, dst, src);
}

/* The loop being built: its expert weights' prefetches (double mode). */
typedef struct lctx {
	ts_loop *l;
	ts_id g, e, slot, e0;
	moe_id at;
	ts_id pf_buf[TS_MAX_WEIGHTS];
	const sb_val *pf_src[TS_MAX_WEIGHTS];
	ir_node pf_row[TS_MAX_WEIGHTS];
	uint32_t npf;
	ts_id pf_op[TS_MAX_WEIGHTS];
} lctx;

/* The body's view of data operand k (kind kd) of loop id, its fetch ops
 * appended: a `b` row copied in the body (or viewed in place in DM); an `e`
 * row by the weights mode: double, two slots, block 0's fetched in the
 * prologue and block g + 1's by the prefetch (prefetch()); single, one slot
 * fetched at the top of the body; streamed (`st`), a view of row $e in HBM
 * whose tiles the contraction recipe copies. */
static bool operand(sb *b, lctx *L, const sb_val *ov, const ir_node *on, char kd, bool st, sb_val *out, moe_id at)
{
	int64_t n = row_numel(on);
	ir_node rn = *on;
	rn.rank = (uint8_t)(on->rank - 1);
	memmove(rn.shape, on->shape + 1, sizeof(int64_t) * (MOE_MAX_RANK - 1));
	if (ov->kind != SV_VIEW || ov->reg != TS_NONE || rn.rank > TCP_MAXD) {
		sb_refuse(b, at, "a block loop operand that is not a view of a tensor of at most 9 dimensions");
		return false;
	}
	bool dm = b->s->buf[ov->buf].space == TCP_DM;
	if (kd == 'e' && st && !dm && b->wring == TS_NONE) { /* the loop's ring, where the first streamed expert was */
		int64_t es = (int64_t)moe_dtype_size((moe_dtype)on->dtype), tn = b->tile_bytes / es;
		b->wring = sb_dm_buf(b, at, "wring", (moe_dtype)on->dtype, 1, &tn);
		b->s->buf[b->wring].life = TS_LIFE_LOOP;
		b->s->buf[b->wring].slots = b->ring;
		sb_spread(b, b->wring);
	}
	if ((kd == 'b' && dm) || (kd == 'e' && st && !dm)) { /* a row in place: block g's, or expert e's in HBM */
		*out = *ov;
		out->reg = kd == 'b' ? L->g : L->e;
		out->scale = ov->stride[0];
		memmove(out->stride, ov->stride + 1, sizeof(int64_t) * (MOE_MAX_RANK - 1));
		return true;
	}
	moe_dtype dt = b->s->buf[ov->buf].dtype == MOE_I8 ? MOE_I8 : (moe_dtype)on->dtype; /* W8A8's x.q (recipe_qact.c) */
	ts_id t = sb_dm_buf(b, at, on->name ? on->name : kd == 'e' ? "expert" : "block", dt, rn.rank, rn.shape);
	ts_buf *tb = &b->s->buf[t];
	tb->life = TS_LIFE_LOOP;
	bool dbl = kd == 'e' && b->weights == TS_W_DOUBLE;
	if (dbl) {
		if (b->wd.n >= TS_MAX_WEIGHTS || L->npf >= TS_MAX_WEIGHTS) {
			sb_refuse(b, at, "a block loop with more than 16 expert operands");
			return false;
		}
		b->wd.stream[b->wd.n] = st;
		b->wd.buf[b->wd.n++] = t;
		tb->slots = 2;
		sb_spread(b, t);
	}
	*out = sb_view_of(t, &rn);
	ts_id row = kd == 'e' ? L->e : L->g;
	if (dbl) { /* block 0's expert in the prologue into slot 0 */
		ts_id body = b->rg;
		b->rg = L->l->prologue;
		if (L->e0 == TS_NONE)
			L->e0 = ctl_scalar(b, "e0", &b->ctl[0], TS_NONE);
		ts_id e0 = L->e0;
		tcp_insn in = row_copy(ov, &rn, t, out, e0);
		sb_emit(b, &in, at);
		b->rg = body;
		L->pf_buf[L->npf] = t;
		L->pf_src[L->npf] = ov;
		L->pf_row[L->npf++] = rn;
		out->reg = L->slot;
		out->scale = n;
		return true;
	}
	tcp_insn in = row_copy(ov, &rn, t, out, row);
	sb_emit(b, &in, at);
	return true;
}

/* Double mode: block g + 1's experts fetched in block g's body into slot
 * (g + 1) & 1, under g + 1 < nb, the expert read from the staged list. The
 * ops' dependencies are set by hand (carried()): none within the block, the
 * previous block's reads of that slot before them (distance 1). */
static void prefetch(sb *b, lctx *L)
{
	if (!L->npf)
		return;
	tcp_sched *s = b->s;
	ts_id body = b->rg;
	ts_id g1 = ts_add_scalar(s, body, "gnext", TS_SC_ALU, TCP_S_ADD, L->g, TS_NONE, 1);
	ts_id more = ts_add_scalar(s, body, "more", TS_SC_CMP, TCP_C_LT, g1, L->l->nb, 0);
	ts_id gd = ts_add_region(s, body, TS_RG_GUARD, more);
	ts_id en = L->e;
	if (!b->ctl[0].imm) {
		en = ts_add_scalar(s, gd, "enext", TS_SC_SPM_LD, 0, g1, TS_NONE, 0);
		s->sc[en].buf = b->ctl[0].v.buf;
	}
	ts_id ns = ts_add_scalar(s, gd, "nslot", TS_SC_ALU, TCP_S_AND, g1, TS_NONE, 1);
	for (uint32_t k = 0; k < L->npf; k++) {
		sb_val out = sb_view_of(L->pf_buf[k], &L->pf_row[k]);
		tcp_insn in = row_copy(L->pf_src[k], &L->pf_row[k], L->pf_buf[k], &out, en);
		in.v[TCP_V_DST].reg = (int32_t)ns;
		in.v[TCP_V_DST].scale = numel(&L->pf_row[k]);
		L->pf_op[k] = ts_add_op(s, gd, &in, TS_PH_EXPERT);
		s->op[L->pf_op[k]].node = L->at;
	}
	L->l->prefetch = 1;
}

/* distance-1 dependencies: each write in the body on the previous block's
 * accesses of its elements (ops [first, last) are the body's; a view moved
 * by a register may reach any of its buffer's) */
static void carried(sb *b, ts_id first, ts_id last, const lctx *L)
{
	for (ts_id op = first; op < last; op++) {
		int32_t t = b->s->op[op].in.v[TCP_V_DST].t;
		bool pf = b->s->op[op].region == L->l->prologue;
		for (uint32_t k = 0; k < L->npf; k++)
			pf |= L->pf_op[k] == op;
		if (t < 0 || pf)
			continue;
		for (ts_id q = op; q < last; q++) {
			const tcp_insn *in = &b->s->op[q].in;
			const ts_op *o = &b->s->op[op];
			bool hit = false;
			for (int w = 0; w < TCP_NVIEW; w++)
				hit |= in->v[w].t == t && ts_views_may_meet(&o->in, &o->in.v[TCP_V_DST], in, &in->v[w]);
			for (uint32_t d = 0; d < o->ndep && hit; d++)
				hit = !(o->dep[d] == q && o->dist[d] == 1);
			if (hit && q != op)
				ts_add_dep(b->s, op, q, 1);
		}
	}
}

typedef struct saved {
	const moe_graph *g;
	sb_val *v, *dmv;
	ts_id rg, rows;
	int phase;
} saved;

static bool body(sb *b, moe_id id, const moe_graph *bg, const ts_loop *l, const sb_val *in_v, uint32_t nin)
{
	size_t vn = (size_t)(bg->nnodes ? bg->nnodes : 1) * sizeof(sb_val);
	saved sv = {b->g, b->v, b->dmv, b->rg, b->rows, b->phase};
	b->g = bg;
	b->v = ctx_alloc(b->ctx, vn);
	b->dmv = ctx_alloc(b->ctx, vn);
	b->rg = l->body;
	b->rows = l->rows;
	b->phase = TS_PH_EXPERT;
	for (moe_id i = 0; i < bg->nnodes && !b->failed; i++) {
		const ir_node *n = &bg->nodes[i];
		if (n->op != MOE_OP_BLOCKARG)
			continue;
		ir_blockarg_role r = ir_blockarg_role_of(n);
		int64_t k = ir_attr_int(n, "index", -1);
		if (r == IR_BA_IN && k >= 0 && k < (int64_t)nin)
			b->v[i] = in_v[k];
		else if (r == IR_BA_IN)
			sb_err(b, i, "blockarg index %lld is not an operand of the loop", (long long)k);
		else if (r != IR_BA_ROWS)
			sb_refuse(b, i, "a blockarg of role expert or index");
	}
	ts_id nbuf0 = b->s->nbuf;
	b->trf_next = 0;
	b->trf_last[0] = b->trf_last[1] = TS_NONE;
	if (!b->failed)
		sb_build_nodes(b);
	if (!b->failed)
		sb_trf_wrap(b, nbuf0);
	moe_id y = ir_body_yield(bg);
	const sb_val *yp = y != MOE_NONE && !b->failed ? sb_dm_val(b, y) : NULL;
	sb_val yv = yp ? *yp : (sb_val){0};
	bool ok = yp && sb_contig(&yv, &bg->nodes[y]);
	if (!b->failed && !ok)
		sb_refuse(b, y, "a loop body whose value is not a contiguous tensor");
	ctx_free(b->ctx, b->v, vn);
	ctx_free(b->ctx, b->dmv, vn);
	b->g = sv.g, b->v = sv.v, b->dmv = sv.dmv, b->rows = sv.rows, b->phase = sv.phase;
	if (!ok) {
		b->rg = sv.rg;
		return false;
	}
	/* the block's value into row g of the result */
	const ir_node *n = SBN(b, id);
	ts_id t = sb_hbm_buf(b, id, n->name ? n->name : "block_results", TCP_T_SCRATCH, (moe_dtype)n->dtype, n->rank,
		n->shape);
	int64_t rn = row_numel(n);
	tcp_view dst = tcp_b_flat((int32_t)t);
	dst.reg = (int32_t)l->g;
	dst.scale = rn;
	tcp_view src = tcp_b_view((int32_t)yv.buf, yv.base, 1, &(const int64_t){1});
	if (yv.reg != TS_NONE)
		src.reg = (int32_t)yv.reg, src.scale = yv.scale;
	tcp_insn c = tcp_b_dma_copy(1, &rn, dst, src);
	b->phase = TS_PH_EXPERT;
	sb_emit(b, &c, id);
	b->rg = sv.rg;
	b->v[id] = sb_view_of(t, n);
	return true;
}

/* The prefetches' distance-1 edges: each on the previous block's reads of
 * its buffer, and each read of the buffer in the body on the previous
 * block's prefetch (the slot it reads). */
static void prefetch_deps(sb *b, const lctx *L, ts_id first, ts_id last)
{
	for (uint32_t k = 0; k < L->npf; k++)
		for (ts_id q = first; q < last; q++) {
			const tcp_insn *in = &b->s->op[q].in;
			bool rd = false;
			for (int w = TCP_V_S0; w < TCP_NVIEW; w++)
				rd |= in->v[w].t >= 0 && (ts_id)in->v[w].t == L->pf_buf[k];
			if (!rd || q == L->pf_op[k])
				continue;
			ts_add_dep(b->s, L->pf_op[k], q, 1);
			ts_add_dep(b->s, q, L->pf_op[k], 1);
		}
}

void sb_block_loop(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	const moe_graph *bg = ir_node_body(b->g, n);
	const char *kinds = ir_attr_str(n, "kinds", "");
	uint32_t nin = n->nargs - 3;
	if (!bg || strlen(kinds) != nin || strspn(kinds, "be") != nin || n->rank < 1) {
		sb_refuse(b, id, "a block loop with operands of kind r or i");
		return;
	}
	for (uint32_t k = 0; k < nin && !b->failed; k++) /* expert scales staged whole, before the loop */
		if (kinds[k] == 'e')
			sb_qact_stage(b, bg, id, k, TS_NONE, NULL);
	if (b->failed)
		return;
	ts_id nb, g;
	int64_t G = n->shape[0];
	int li = stage(b, id, G, &nb, &g);
	if (li < 0)
		return;
	ts_add_loop(b->s, b->rg, G, nb, g);
	lctx L;
	memset(&L, 0, sizeof L);
	L.l = &b->s->loop[li];
	L.g = g;
	L.e0 = TS_NONE;
	L.at = id;
	L.l->weights = b->weights;
	L.l->ring = b->weights == TS_W_STREAM ? b->ring : 0;
	ts_id outer = b->rg, first = b->s->nop;
	b->rg = L.l->body;
	b->phase = TS_PH_EXPERT;
	/* the block's expert and rows, read at the top of the body */
	L.l->expert = L.e = ctl_scalar(b, "e", &b->ctl[0], g);
	L.l->rows = ctl_scalar(b, "rows", &b->ctl[1], g);
	if (b->weights == TS_W_DOUBLE)
		L.slot = ts_add_scalar(b->s, b->rg, "slot", TS_SC_ALU, TCP_S_AND, g, TS_NONE, 1);
	sb_val *in_v = ctx_alloc(b->ctx, (nin ? nin : 1) * sizeof *in_v);
	bool ok = true;
	/* the block's rows first, then the experts, then block g + 1's prefetch */
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t k = 0; k < nin && ok; k++)
			if ((kinds[k] == 'e') == (pass == 1)) {
				uint32_t j = 0; /* an expert operand given twice is fetched once */
				while (kinds[k] == 'e' && j < k && !(kinds[j] == 'e' && n->args[3 + j] == n->args[3 + k]))
					j++;
				if (kinds[k] == 'e' && j < k) {
					in_v[k] = in_v[j];
					continue;
				}
				if (kinds[k] == 'e' && sb_qact_stage(b, bg, id, k, L.e, &in_v[k])) {
					ok = !b->failed; /* staged whole (recipe_qact.c) */
					continue;
				}
				bool st = kinds[k] == 'e' && streamable(bg, (int64_t)k);
				ok = operand(b, &L, &b->v[n->args[3 + k]], SBN(b, n->args[3 + k]), kinds[k],
					st && b->weights == TS_W_STREAM, &in_v[k], id);
				if (ok && b->weights == TS_W_DOUBLE && b->wd.n && kinds[k] == 'e')
					b->wd.stream[b->wd.n - 1] = st;
			}
	if (ok)
		prefetch(b, &L);
	b->rg = outer;
	if (ok)
		ok = body(b, id, bg, L.l, in_v, nin);
	ctx_free(b->ctx, in_v, (nin ? nin : 1) * sizeof *in_v);
	b->rg = outer;
	if (!ok)
		return;
	carried(b, first, b->s->nop, &L);
	prefetch_deps(b, &L, first, b->s->nop);
}
