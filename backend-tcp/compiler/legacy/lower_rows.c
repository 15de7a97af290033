/* backend-tcp/lower_rows.c: row sub-tiles guarded by a run-time row count
 * (docs/tcp-isa.md section 7.4, "Row sub-tiles").
 *
 * A pass whose outermost loop runs over rows with a run-time valid count
 * (`valid=rN`: a block's rows inside the block loop, a serving layer's
 * n_tokens outside it) is charged for every row of its static extent, the
 * rows past the count included (they are written as zero). When that extent
 * is large and the count is often small (a block of 256 rows holding one
 * decode token), the pass is emitted as static row tiles of growing size,
 * [0, f), [f, 2f), [2f, 4f), ... each guarded by the count: a tile whose
 * first row is at or past the count is skipped and costs only its guard
 * (an `li` and a run-time branch); a tile that runs is charged for all its
 * rows, its own rows past the count included, with the count less the
 * tile's first row as its valid count. Rows of skipped tiles are not
 * written, so only values whose every reader reads them through the same
 * tiles (or not at all) are tiled; the callers decide that. */
#include "backend-tcp/compiler/legacy/lower_int.h"

/* May `in` be split along its outermost loop? Every view must step rows
 * along dim 0 only by its stride, and no step may read the dim-0 counter or
 * reduce / scan / compact along dim 0 (the innermost loop of a 1-D pass). */
static bool splittable(const tcp_insn *in)
{
	if (in->ndim < 2 || in->vreg < 0)
		return false;
	if (in->op == TCP_OP_TU_VEC) {
		if (in->flags)
			return false;
		for (int i = 0; i < in->nstep; i++)
			if ((in->step[i].x == TCP_SRC_CTR || in->step[i].y == TCP_SRC_CTR) && in->step[i].ctr == 0)
				return false;
		return true;
	}
	if (in->op == TCP_OP_DMA_GATHER || in->op == TCP_OP_DMA_SCATTER)
		return (in->flags & TCP_F_VROWS) != 0; /* the count is of groups (dim 0) */
	return in->op == TCP_OP_TU_CONTRACT && !(in->flags & TCP_F_SCALED);
}

/* Emits `in` (valid count in in->vreg) as guarded row tiles starting at
 * `first` rows, or as it is when it cannot be split or is not larger than
 * one tile. */
void tcpl_emit_row_tiles(lw *c, const tcp_insn *in, int64_t first)
{
	tcpl_emit_row_steps(c, in, first, 0);
}

/* ... the tiles after the first of `step` rows each (0: growing, each as
 * long as the rows before it). */
void tcpl_emit_row_steps(lw *c, const tcp_insn *in, int64_t first, int64_t step)
{
	int64_t M = in->dim[0];
	if (!splittable(in) || first < 1 || M <= first) {
		tcp_insn cp = *in;
		emit(c, &cp);
		return;
	}
	uint32_t skip[64];
	int ns = 0;
	for (int64_t s = 0, len = first; s < M && ns < 64; s += len, len = step > 0 ? step : s) {
		int64_t n = M - s < len ? M - s : len;
		/* guard: a tile whose first row is at or past the count is skipped,
		 * and so are the later ones (nested ifs: one guard skips them all) */
		li(c, R_ROWT, s);
		skip[ns++] = br(c, TCP_C_GE, R_ROWT, in->vreg);
		tcp_insn t = *in;
		t.dim[0] = n;
		for (int w = 0; w < TCP_NVIEW; w++)
			if (t.v[w].t >= 0)
				t.v[w].base += s * t.v[w].stride[0];
		if (s > 0) {
			alui(c, TCP_S_SUB, R_ROWT, in->vreg, TCP_NOREG, s);
			t.vreg = R_ROWT;
		}
		emit(c, &t);
	}
	for (int k = 0; k < ns; k++)
		patch(c, skip[k]);
}

/* Does a tile of `rows` rows of vector pass `in` take longer than a pass's
 * fixed part (its issue, fill/drain and the switch's ring)? A class's second,
 * guarded tile saves at most the first's time on the blocks that skip it
 * and costs that fixed part on those that run it, so only then does the
 * split pay. The work is estimated as section 10 charges it: the busiest
 * slice's elements at the float rate, each DM stream and the commit at the
 * fetch width, the slowest of the three. */
static bool tile_pays(const lw *c, const tcp_insn *in, int64_t rows)
{
	const moe_tcp_machine *m = c->m;
	int64_t S = tcp_slices(m), n = rows;
	for (int k = 1; k < in->ndim; k++)
		n *= in->dim[k];
	int64_t pe = (n + S - 1) / S, fetch = 0, commit = 0, fw = m->fetch_bytes > 0 ? m->fetch_bytes : 1;
	int64_t work = pe / (m->vec_float_rate > 0 ? m->vec_float_rate : 1) + in->nstep * m->alu_latency;
	for (int w = 0; w < TCP_NVIEW; w++) {
		const tcp_view *v = &in->v[w];
		if (v->t < 0 || c->p->t[v->t].space != TCP_DM)
			continue;
		int64_t cyc = (pe * esz((moe_dtype)c->p->t[v->t].dtype) + fw - 1) / fw;
		if (w == TCP_V_DST)
			commit = cyc;
		else
			fetch += cyc;
	}
	work = work > fetch ? work : fetch;
	work = work > commit ? work : commit;
	int64_t ring = S < m->max_ring ? S : m->max_ring;
	return work > m->issue_cycles + m->fill_drain + ring;
}

/* A pass over a block's rows (count R_ROWS) by the row classes of the
 * block's contractions (tcpl_lower_einsum): a block of at most h rows, h =
 * f, 4f, 16f, ... below the block's rows, runs it over h rows, above f in
 * two row tiles [0, h / 2) and [h / 2, h), the second guarded, when a tile's
 * work exceeds a pass's fixed part (tile_pays); a fuller
 * block over all of them (a prefill's full blocks pay the class guards
 * only). */
void tcpl_emit_block_pass(lw *c, const tcp_insn *in)
{
	int64_t M = in->dim[0], f = tcpl_row_tile(M);
	if (!splittable(in) || M <= f) {
		tcp_insn cp = *in;
		emit(c, &cp);
		return;
	}
	uint32_t end[8 + TCP_MAX_UPPER];
	int ne = 0;
	for (int64_t h = f; h < M && ne < 8; h *= 4) {
		uint32_t more = tcpl_block_rows_guard(c, h);
		tcp_insn t = *in;
		t.dim[0] = h;
		tcpl_emit_row_tiles(c, &t, h > f && tile_pays(c, &t, h / 2) ? h / 2 : 0);
		end[ne++] = jmp(c);
		patch(c, more);
	}
	int64_t up[TCP_MAX_UPPER];
	int nu = tcpl_upper_rows(c) ? tcp_upper_classes(M, f, up, TCP_MAX_UPPER) : 0;
	for (int k = 0; k < nu; k++) { /* row_classes.c */
		uint32_t more = tcpl_block_rows_guard(c, up[k]);
		tcp_insn t = *in;
		t.dim[0] = up[k];
		emit(c, &t);
		end[ne++] = jmp(c);
		patch(c, more);
	}
	tcp_insn t = *in;
	emit(c, &t);
	for (int k = 0; k < ne; k++)
		patch(c, end[k]);
}

/* Does the block loop hold every weight it reads whole in DM (no weight
 * streamed tile by tile)? Then its passes take the upper row classes of
 * row_classes.c. */
bool tcpl_upper_rows(const lw *c)
{
	for (moe_id i = 0; i < c->g->nnodes; i++)
		if (c->inreg[i] && c->wstream[i])
			return false;
	return true;
}

/* Branches past the code that follows when the block has more than f rows
 * (patch the returned branch where that code ends). */
uint32_t tcpl_block_rows_guard(lw *c, int64_t f)
{
	li(c, R_ROWT, f);
	return br(c, TCP_C_LT, R_ROWT, R_ROWS);
}

/* The first tile of a pass over `rows` rows: an eighth of them, at least 16
 * (a tile pays a command and a fill/drain; 4 tiles cover 256 rows). */
int64_t tcpl_row_tile(int64_t rows)
{
	int64_t f = rows / 32;
	return f < 8 ? 8 : f;
}

/* Does every pass that reads node x (through views that keep its rows)
 * mask the rows at and past count v itself? Such a reader writes zero
 * there whatever it reads, and below v reads only rows of x that a tile
 * which ran wrote; a reader that could fault on a stale row (an index, an
 * integer division) or reads x's rows elsewhere keeps x untiled. */
static bool readers_mask(const lw *c, moe_id x, moe_id v, int64_t rows, int depth)
{
	if (depth > 8 || c->is_out[x])
		return false;
	for (moe_id u = x + 1; u < c->g->nnodes; u++) {
		const ir_node *un = N(c->g, u);
		bool reads = false;
		for (uint32_t a = 0; a < un->nargs; a++)
			reads |= un->args[a] == x;
		if (!reads)
			continue;
		if (un->rank < 1 || un->shape[0] != rows || c->inreg[u])
			return false;
		if (c->alias_cast[u] || un->op == MOE_OP_RESHAPE || un->op == MOE_OP_BROADCAST) {
			if (!readers_mask(c, u, v, rows, depth + 1))
				return false;
			continue;
		}
		moe_id r = c->fused_into[u] != MOE_NONE ? c->fused_into[u] : u; /* the pass that reads x */
		const ir_node *rn = N(c->g, r);
		bool ok = (ir_ops[rn->op].flags & OPF_ELEM) || rn->op == MOE_OP_EINSUM || rn->op == MOE_OP_SOFTMAX ||
			  (rn->op == MOE_OP_TAKE_ALONG && un->args[0] == x) || /* not its indices: a gather reads them all */
			  rn->op == MOE_OP_REDUCE_SUM || rn->op == MOE_OP_REDUCE_MAX || rn->op == MOE_OP_REDUCE_MIN;
		if (!ok || rn->valid != v || rn->rank < 1 || rn->shape[0] != rows)
			return false;
		if ((un->op == MOE_OP_DIV || rn->op == MOE_OP_DIV) && !moe_dtype_is_float((moe_dtype)un->dtype))
			return false;
	}
	return true;
}

/* May node id's pass, outside the block loop and masked by a scalar count
 * (a serving layer's rows), be emitted as guarded row tiles? */
bool tcpl_tile_outside(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (c->inreg[id] || n->valid == MOE_NONE || N(c->g, n->valid)->rank != 0 || n->rank < 1 || c->hbm_home[id])
		return false;
	return readers_mask(c, id, n->valid, n->shape[0], 0);
}

/* A contiguous copy of `rows` rows of `rowlen` elements (dst, src: tensor
 * and base) as guarded row tiles by the count in register creg: rows of the
 * tiles that run are copied (their rows past the count included), the
 * others are not touched. */
void tcpl_copy_rows(lw *c, int32_t dt, int64_t dbase, int32_t st, int64_t sbase, int64_t rows, int64_t rowlen, int creg)
{
	int64_t first = tcpl_row_tile(rows);
	uint32_t skip[64];
	int ns = 0;
	for (int64_t s = 0, len = first; s < rows && ns < 64; s += len, len = s) {
		int64_t n = rows - s < len ? rows - s : len;
		li(c, R_ROWT, s);
		skip[ns++] = br(c, TCP_C_GE, R_ROWT, creg); /* this tile and the later ones */
		dma_copy(c, dt, dbase + s * rowlen, -1, 0, st, sbase + s * rowlen, -1, 0, n * rowlen);
	}
	for (int k = 0; k < ns; k++)
		patch(c, skip[k]);
}

/* The count by which a serving layer's token input x (rows [T, ...]) may be
 * copied into DM in row tiles: the mask of its readers, when every reader
 * masks the rows past it (the router einsum) or is the dispatch's deferred
 * gather of token rows (which reads the rows of real tokens only, and token
 * 0 for the grid's padding rows); MOE_NONE otherwise. */
moe_id tcpl_input_rows_count(const lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (n->op != MOE_OP_INPUT || n->rank < 1 || c->is_out[id])
		return MOE_NONE;
	moe_id v = MOE_NONE;
	for (moe_id u = id + 1; u < c->g->nnodes && v == MOE_NONE; u++) {
		const ir_node *un = N(c->g, u);
		for (uint32_t a = 0; a < un->nargs; a++)
			if (un->args[a] == id && un->valid != MOE_NONE && !c->inreg[u] && N(c->g, un->valid)->rank == 0)
				v = un->valid;
	}
	if (v == MOE_NONE)
		return MOE_NONE;
	for (moe_id u = id + 1; u < c->g->nnodes; u++) {
		const ir_node *un = N(c->g, u);
		bool reads = false;
		for (uint32_t a = 0; a < un->nargs; a++)
			reads |= un->args[a] == id;
		if (!reads || c->gdefer[u])
			continue;
		if (c->alias_cast[u] || un->valid != v || un->rank < 1 || un->shape[0] != n->shape[0] || c->inreg[u])
			return MOE_NONE;
		moe_id r = c->fused_into[u] != MOE_NONE ? c->fused_into[u] : u;
		if (un->op != MOE_OP_EINSUM && !(ir_ops[un->op].flags & OPF_ELEM))
			return MOE_NONE;
		if (N(c->g, r)->valid != v || (un->op == MOE_OP_DIV && !moe_dtype_is_float((moe_dtype)un->dtype)))
			return MOE_NONE;
	}
	/* the token-row gather reads row 0 for padding: n >= 1 whenever a block runs */
	return v;
}

/* The part of output o (a serving layer's rows: o masked by a scalar count,
 * or a concatenation of token chunks each so masked) its tiles that hold
 * real rows copy to HBM tensor t; the other rows of t are not written, so a
 * serving program's output rows at and past n are those of the buffer the
 * runtime binds, which moe_tcp_run zero-fills (docs/tcp-isa.md 7.4). False
 * when o is not such an output (the caller copies it whole). */
bool tcpl_copy_out_rows(lw *c, moe_id o, int32_t t, const val *v)
{
	const ir_node *n = N(c->g, o);
	if (n->rank < 1 || c->inreg[o] || n->shape[0] < 2)
		return false;
	moe_id one = o;
	uint32_t np = 1;
	const moe_id *parts = &one;
	if (n->op == MOE_OP_CONCAT && n->valid == MOE_NONE && ir_attr_int(n, "axis", 0) == 0) {
		parts = n->args;
		np = n->nargs;
	}
	for (uint32_t k = 0; k < np; k++) {
		const ir_node *pn = N(c->g, parts[k]);
		if (pn->valid == MOE_NONE || N(c->g, pn->valid)->rank != 0 || pn->rank != n->rank || c->inreg[parts[k]])
			return false;
	}
	int64_t row = ir_numel(n) / n->shape[0], at = 0;
	for (uint32_t k = 0; k < np; k++) {
		const ir_node *pn = N(c->g, parts[k]);
		tcpl_copy_rows(c, t, at * row, v->t, v->base + at * row, pn->shape[0], row,
			tcpl_count_reg(c, o, pn->valid));
		at += pn->shape[0];
	}
	return true;
}

/* A count derived from another by a constant (n_tokens - t0, n_tokens x K,
 * n_tokens x K - p0: a serving layer's chunks and pairs) is computed from
 * that count's register by the control processor's ALU, instead of staging
 * the vector engine's result into SPM (whose `ld` would wait for every pass
 * before it). -1 when cnt is not such a count. */
int tcpl_count_alu(lw *c, moe_id id, moe_id cnt)
{
	const ir_node *n = N(c->g, cnt);
	if (n->rank != 0 || n->dtype != MOE_I32 || n->nargs != 2 || c->inreg[cnt] || c->nvc >= 16 ||
		(n->op != MOE_OP_ADD && n->op != MOE_OP_SUB && n->op != MOE_OP_MUL))
		return -1;
	const ir_node *k = N(c->g, n->args[1]);
	if (k->op != MOE_OP_CONST || k->rank != 0 || N(c->g, n->args[0])->rank != 0)
		return -1;
	int64_t v = ir_attr_int(k, "value", 0);
	int a = tcpl_count_reg(c, id, n->args[0]);
	if (a < 0 || c->next_reg >= TCP_NREG)
		return -1;
	int r = tcpl_new_reg(c, id);
	/* i32 counts: the 64-bit ALU agrees while they stay within i32 (at most T x K) */
	alui(c, n->op == MOE_OP_ADD ? TCP_S_ADD : n->op == MOE_OP_SUB ? TCP_S_SUB : TCP_S_MUL, r, a, TCP_NOREG, v);
	if (c->nvc < 16) {
		c->vc_id[c->nvc] = cnt;
		c->vc_reg[c->nvc++] = r;
	}
	return r;
}
