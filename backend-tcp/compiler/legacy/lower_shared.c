/* backend-tcp/lower_shared.c: TCP lowering: a shared expert of a row-chunked
 * tail runs in pieces inside the block loop (docs/tcp-isa.md 7.4, "The
 * shared expert inside the block loop").
 *
 * At large T the tail is computed in row chunks after the loop (rowchunk.c);
 * a shared expert's part of each chunk (the nodes that read only x's rows
 * and weights) used to run there too, on a contraction engine the
 * HBM-bound loop had left idle for milliseconds, copying its weights into
 * DM again for every chunk. Here, when every chunk's part is the same code
 * on the next T / P rows (rowchunk.c makes P = 64 equal chunks), chunk 0's
 * part is lowered once as the *piece*: its weights are copied into DM once
 * in the loop's prologue and stay there; the piece's copy of x's rows and
 * its result's copy to an HBM tensor (`shared`, [T, ...]) are offset by a
 * piece register. The loop body runs the piece in P of its blocks, spread
 * over the run-time block count by an accumulator (add P per block, run a
 * piece and subtract the count when it reaches the count: scalar adds and a
 * guard, no division); pieces left over (fewer blocks than pieces) run in
 * a loop after the block loop. The tail's chunks read their rows of
 * `shared` from HBM. Every row is computed by the same operations in the same
 * order as before, so the outputs do not change. When the weights and the
 * piece's values do not fit in the DM the loop leaves, every piece runs in
 * the loop after the block loop instead (the weights still copied once).
 * Where `shared` itself fits beside the loop too (tried quietly first,
 * c->sh_dm), it is a DM tensor at the top of DM: each piece writes its rows
 * in place and the tail reads them there, no copy out or in per piece. */
#include "backend-tcp/compiler/legacy/lower_int.h"

struct tcpl_shared {
	bool *chain;     /* a node of some chunk's part */
	moe_id *node0;   /* chunk 0's part, in node order */
	uint32_t n0;
	moe_id *root;    /* per chunk: the node of its part that the tail reads */
	moe_id x;        /* the input whose rows the parts read */
	int64_t P, R, xrow, rrow; /* pieces, rows per piece, elements per row of x and of a root */
	int32_t ys;      /* the roots' tensor: HBM, or DM through the loop and the tail (dm) */
	int32_t yb;      /* the body piece's root, in DM through the loop (its copy out deferred), or -1 */
	int rp, ra, rn, r1; /* registers: piece index, accumulator, P, 1 */
	bool late;       /* every piece after the loop */
	bool dm;         /* ys in DM: each piece writes its rows in place, the tail reads them there */
};

static bool plain_leaf(const lw *c, moe_id a)
{
	return (ir_ops[N(c->g, a)->op].flags & OPF_LEAF) != 0;
}

/* Chain candidates: nodes after the loop that read only leaves and other candidates. */
static bool candidate(const lw *c, const bool *chain, moe_id i)
{
	const ir_node *n = N(c->g, i);
	if (!c->after[i] || c->dep[i] || c->inreg[i] || c->is_out[i] || plain_leaf(c, i) || n->valid != MOE_NONE ||
		n->op == MOE_OP_GATHER || n->op == MOE_OP_SCATTER || n->op == MOE_OP_TAKE_ALONG || n->op == MOE_OP_CONCAT ||
		c->cat_of[i] != MOE_NONE)
		return false;
	for (uint32_t k = 0; k < n->nargs; k++)
		if (n->args[k] == MOE_NONE || (!plain_leaf(c, n->args[k]) && !chain[n->args[k]]))
			return false;
	if (n->op == MOE_OP_EINSUM && (n->nargs != 2 || N(c->g, n->args[1])->op != MOE_OP_WEIGHT))
		return false; /* weights copied into DM once: the contraction reads a weight itself */
	return true;
}

/* Chunk of each chain node (-1: none): a row slice of the input starts
 * chunk start / R; others take their chain operands' chunk. */
static bool chunks_of(const lw *c, struct tcpl_shared *s, int64_t *ch)
{
	const moe_graph *g = c->g;
	int64_t T = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		ch[i] = -1;
		if (!s->chain[i])
			continue;
		if (n->op == MOE_OP_SLICE && N(g, n->args[0])->op == MOE_OP_INPUT) {
			const ir_node *x = N(g, n->args[0]);
			int64_t st = ir_attr_int(n, "start", 0), R = n->shape[0];
			if ((s->x != MOE_NONE && s->x != n->args[0]) || norm_axis(n, x, 0) != 0 || ir_attr_int(n, "step", 1) != 1 ||
				st < 0 || R < 1 || (s->R && R != s->R) || st % R)
				return false;
			s->x = n->args[0], s->R = R, T = x->shape[0];
			ch[i] = st / R;
			continue;
		}
		for (uint32_t k = 0; k < n->nargs; k++) {
			int64_t a = ch[n->args[k]];
			if (a >= 0 && ch[i] >= 0 && a != ch[i])
				return false;
			if (a >= 0)
				ch[i] = a;
		}
		if (ch[i] < 0)
			return false;
	}
	if (!s->R || T % s->R || T / s->R < 2)
		return false;
	s->P = T / s->R;
	s->xrow = ir_numel(N(g, s->x)) / T;
	return true;
}

/* Node b of chunk k does what node a of chunk 0 does (idx: index in its chunk's list). */
static bool same_step(const lw *c, moe_id a, moe_id b, const uint32_t *idx)
{
	const ir_node *na = N(c->g, a), *nb = N(c->g, b);
	if (na->op != nb->op || na->dtype != nb->dtype || na->rank != nb->rank || na->nargs != nb->nargs ||
		memcmp(na->shape, nb->shape, sizeof(int64_t) * na->rank) != 0 || c->alias_cast[a] != c->alias_cast[b] ||
		c->store_dt[a] != c->store_dt[b] || (c->fused_into[a] == MOE_NONE) != (c->fused_into[b] == MOE_NONE))
		return false;
	if (na->op == MOE_OP_EINSUM && strcmp(ir_attr_str(na, "eq", ""), ir_attr_str(nb, "eq", "")) != 0)
		return false;
	for (uint32_t k = 0; k < na->nargs; k++) {
		moe_id x = na->args[k], y = nb->args[k];
		bool lx = plain_leaf(c, x), ly = plain_leaf(c, y);
		if (lx != ly || (lx && x != y) || (!lx && idx[x] != idx[y]))
			return false;
	}
	return true;
}

/* Every chunk's part the same steps as chunk 0's, each with one root
 * (the node the rest of the tail reads). */
static bool match_chunks(lw *c, struct tcpl_shared *s, const int64_t *ch)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes, *cnt = ctx_alloc(c->ctx, sizeof *cnt * (size_t)(s->P + 1));
	uint32_t *idx = ctx_alloc(c->ctx, sizeof *idx * (nn + 1));
	moe_id **lists = ctx_alloc(c->ctx, sizeof *lists * (size_t)(s->P + 1));
	bool ok = true;
	for (moe_id i = 0; i < nn; i++)
		if (ch[i] >= 0)
			idx[i] = cnt[ch[i]]++;
	for (int64_t k = 0; k < s->P && ok; k++) {
		ok = cnt[k] == cnt[0] && cnt[0] > 0;
		lists[k] = ok ? ctx_alloc(c->ctx, sizeof **lists * cnt[0]) : NULL;
	}
	for (moe_id i = 0; i < nn && ok; i++)
		if (ch[i] >= 0)
			lists[ch[i]][idx[i]] = i;
	for (int64_t k = 1; k < s->P && ok; k++)
		for (uint32_t j = 0; j < cnt[0] && ok; j++)
			ok = same_step(c, lists[0][j], lists[k][j], idx);
	/* roots: read by a node outside the chain (the tail) */
	for (int64_t k = 0; k < s->P; k++)
		s->root[k] = MOE_NONE;
	for (moe_id u = 0; u < nn && ok; u++) {
		const ir_node *n = N(g, u);
		for (uint32_t k = 0; k <= n->nargs && ok && !s->chain[u]; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a == MOE_NONE || !s->chain[a])
				continue;
			ok = c->after[u] && (s->root[ch[a]] == MOE_NONE || s->root[ch[a]] == a);
			s->root[ch[a]] = a;
		}
	}
	for (int64_t k = 0; k < s->P && ok; k++)
		ok = s->root[k] != MOE_NONE && idx[s->root[k]] == idx[s->root[0]] && N(g, s->root[k])->rank >= 1 &&
		     N(g, s->root[k])->shape[0] == s->R;
	if (ok) {
		s->n0 = cnt[0];
		s->node0 = ctx_alloc(c->ctx, sizeof *s->node0 * cnt[0]);
		memcpy(s->node0, lists[0], sizeof *s->node0 * cnt[0]);
		s->rrow = ir_numel(N(g, s->root[0])) / s->R;
	}
	for (int64_t k = 0; k < s->P; k++)
		if (lists[k])
			ctx_free(c->ctx, lists[k], sizeof **lists * cnt[0]);
	ctx_free(c->ctx, lists, sizeof *lists * (size_t)(s->P + 1));
	ctx_free(c->ctx, cnt, sizeof *cnt * (size_t)(s->P + 1));
	ctx_free(c->ctx, idx, sizeof *idx * (nn + 1));
	return ok;
}

static void drop(lw *c, struct tcpl_shared *s)
{
	if (!s)
		return;
	uint32_t nn = c->g->nnodes;
	ctx_free(c->ctx, s->chain, nn + 1);
	ctx_free(c->ctx, s->root, sizeof *s->root * (size_t)(s->P + 1));
	if (s->node0)
		ctx_free(c->ctx, s->node0, sizeof *s->node0 * s->n0);
	ctx_free(c->ctx, s, sizeof *s);
	c->sh = NULL;
}

/* Emit node i of the order after the loop (in[]: still to emit), its
 * operands among those first, in their order (order1 is topological). */
static void emit_with_operands(lw *c, moe_id i, uint8_t *in, moe_id *out, uint32_t *n)
{
	const ir_node *nd = N(c->g, i);
	in[i] = 0;
	for (uint32_t k = 0; k <= nd->nargs; k++) {
		moe_id a = k < nd->nargs ? nd->args[k] : nd->valid;
		if (a != MOE_NONE && in[a])
			emit_with_operands(c, a, in, out, n);
	}
	out[(*n)++] = i;
}

/* The combine's row gathers after the loop: each token chunk's gather is
 * emitted right after the previous chunk's, so the in-order DMA context
 * streams chunk c + 1's pair results while the main context combines chunk
 * c (the gather held behind chunk c's copies out before: 8 x about 17 us
 * of idle HBM on DeepSeek-V3 at T = 4096). Two gather buffers live at once. */
static void gathers_ahead(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes, n = 0, ng = 0;
	uint8_t *in = ctx_alloc(c->ctx, nn + 1);
	moe_id *out = ctx_alloc(c->ctx, sizeof *out * (c->norder1 + 1));
	moe_id *gs = ctx_alloc(c->ctx, sizeof *gs * (c->norder1 + 1));
	for (uint32_t k = 0; k < c->norder1; k++) {
		in[c->order1[k]] = 1;
		if (N(g, c->order1[k])->op == MOE_OP_GATHER)
			gs[ng++] = c->order1[k];
	}
	for (uint32_t k = 0, next = 0; k < c->norder1; k++) {
		moe_id i = c->order1[k];
		bool ahead = N(g, i)->op == MOE_OP_GATHER; /* at each gather's own place, emitted ahead or not */
		if (!in[i] && !ahead)
			continue;
		if (in[i])
			emit_with_operands(c, i, in, out, &n);
		while (next < ng && !in[gs[next]])
			next++; /* the gathers emitted so far */
		if (N(g, i)->op == MOE_OP_GATHER && next < ng)
			emit_with_operands(c, gs[next], in, out, &n);
	}
	memcpy(c->order1, out, sizeof *out * n);
	ctx_free(c->ctx, in, nn + 1);
	ctx_free(c->ctx, out, sizeof *out * (c->norder1 + 1));
	ctx_free(c->ctx, gs, sizeof *gs * (c->norder1 + 1));
}

/* After order_after: find the parts; they leave the emission order after the loop. */
void tcpl_shared_plan(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	if (!c->sink || c->rows == MOE_NONE)
		return;
	for (moe_id i = 0; i < nn; i++) /* a serving layer (valid counts) may skip the loop */
		if (!c->inreg[i] && N(g, i)->valid != MOE_NONE)
			return;
	struct tcpl_shared *s = ctx_alloc(c->ctx, sizeof *s);
	c->sh = s;
	s->chain = ctx_alloc(c->ctx, nn + 1);
	s->x = MOE_NONE;
	s->ys = s->yb = -1;
	for (moe_id i = 0; i < nn; i++)
		s->chain[i] = candidate(c, s->chain, i);
	bool any = false;
	int64_t wb = 0; /* its weights, held in DM: at most half of it (else streamed as before) */
	bool *seen = ctx_alloc(c->ctx, nn + 1);
	for (moe_id i = 0; i < nn; i++)
		if (s->chain[i] && N(g, i)->op == MOE_OP_EINSUM) {
			moe_id w = N(g, i)->args[1];
			any = true;
			wb += seen[w] ? 0 : ir_bytes(N(g, w));
			seen[w] = true;
		}
	ctx_free(c->ctx, seen, nn + 1);
	any &= wb <= c->m->dm_bytes_per_slice * c->S / 2;
	int64_t *ch = ctx_alloc(c->ctx, sizeof *ch * (nn + 1));
	bool ok = any && chunks_of(c, s, ch);
	s->root = ctx_alloc(c->ctx, sizeof *s->root * (size_t)(s->P + 1));
	ok = ok && match_chunks(c, s, ch);
	ctx_free(c->ctx, ch, sizeof *ch * (nn + 1));
	if (!ok) {
		drop(c, s);
		return;
	}
	for (int64_t k = 0; k < s->P; k++) /* a root is a value of its own, not folded into the tail's pass */
		c->fused_into[s->root[k]] = MOE_NONE;
	uint32_t n1 = 0;
	for (uint32_t k = 0; k < c->norder1; k++)
		if (!s->chain[c->order1[k]])
			c->order1[n1++] = c->order1[k];
	c->norder1 = n1;
	gathers_ahead(c);
}

/* plan_order: the parts sit at the loop's position; their values and the
 * weights they copy are freed here (tcpl_shared_after), not by release. */
void tcpl_shared_pos(lw *c, int64_t loop_pos)
{
	for (moe_id i = 0; c->sh && i < c->g->nnodes; i++)
		if (c->sh->chain[i])
			c->pos[i] = loop_pos;
}

void tcpl_shared_liveness(lw *c)
{
	struct tcpl_shared *s = c->sh;
	for (moe_id i = 0; s && i < c->g->nnodes; i++) {
		const ir_node *n = N(c->g, i);
		if (!s->chain[i])
			continue;
		c->last[i] = -2;
		if (n->op == MOE_OP_EINSUM)
			c->last[n->args[1]] = -2;
	}
}

/* Before the loop's skip branch: the piece registers. */
void tcpl_shared_regs(lw *c)
{
	struct tcpl_shared *s = c->sh;
	if (!s)
		return;
	s->rp = tcpl_new_reg(c, s->root[0]);
	s->ra = tcpl_new_reg(c, s->root[0]);
	s->rn = tcpl_new_reg(c, s->root[0]);
	s->r1 = tcpl_new_reg(c, s->root[0]);
	li(c, s->rp, 0);
	li(c, s->rn, s->P);
	li(c, s->r1, 1);
	alui(c, TCP_S_ADD, s->ra, R_NB, TCP_NOREG, 0); /* the first block runs piece 0 */
}

/* Per-slice DM bytes of tensor bytes b (as tcpl_dm_tensor rounds them). */
static int64_t per_slice(const lw *c, int64_t b)
{
	int64_t f = c->m->flit_bytes, q = (b + c->S - 1) / c->S;
	return (q + f - 1) / f * f;
}

/* The weights in DM, and room for the piece's values and `extra` bytes per
 * slice beside what is live now? */
static bool piece_fits(const lw *c, int64_t extra)
{
	const struct tcpl_shared *s = c->sh;
	int64_t cap, need = 0;
	int64_t top = tcpl_dm_live_top(c, &cap); /* (below the early row buffer, spec_rows.c) */
	for (uint32_t j = 0; j < s->n0; j++) {
		const ir_node *n = N(c->g, s->node0[j]);
		need += per_slice(c, ir_bytes(n) * (n->dtype == MOE_F32 || n->op == MOE_OP_EINSUM ? 3 : 1));
		if (n->op == MOE_OP_EINSUM)
			need += per_slice(c, ir_bytes(N(c->g, n->args[1])));
	}
	need += per_slice(c, s->R * s->xrow * esz(N(c->g, s->x)->dtype));
	return top + need + extra <= cap;
}

/* The dtype the roots are stored in. */
static moe_dtype root_dtype(const lw *c)
{
	const struct tcpl_shared *s = c->sh;
	return (moe_dtype)(c->store_dt[s->root[0]] ? c->store_dt[s->root[0]] : N(c->g, s->root[0])->dtype);
}

/* The roots' rows of every piece, [P R, ...] of the root's shape. */
static void ys_shape(const lw *c, int64_t *sh)
{
	const struct tcpl_shared *s = c->sh;
	const ir_node *rn = N(c->g, s->root[0]);
	memcpy(sh, rn->shape, sizeof(int64_t) * MOE_MAX_RANK);
	sh[0] = s->R * s->P;
}

static void copy_weights(lw *c)
{
	const struct tcpl_shared *s = c->sh;
	for (uint32_t j = 0; j < s->n0 && !c->failed; j++) {
		const ir_node *n = N(c->g, s->node0[j]);
		if (n->op == MOE_OP_EINSUM && c->p->t[c->v[n->args[1]].t].space == TCP_HBM)
			tcpl_dm_view(c, n->args[1]);
	}
}

/* In the loop's prologue: the weights into DM, once (or, when the piece
 * does not fit beside the loop, every piece after the loop). */
void tcpl_shared_prologue(lw *c)
{
	struct tcpl_shared *s = c->sh;
	if (!s)
		return;
	s->late = !piece_fits(c, 0);
	if (s->late)
		return;
	const ir_node *rn = N(c->g, s->root[0]);
	int64_t sh[MOE_MAX_RANK], ysz = 1;
	ys_shape(c, sh);
	for (int d = 0; d < rn->rank; d++)
		ysz *= sh[d];
	/* where it fits (tried quietly first, c->sh_dm: the combine after the
	 * loop needs its DM too), `shared` is a DM tensor that each piece's last
	 * contraction writes in place: no copy out per piece, no copy in per
	 * tail chunk after the loop */
	s->dm = c->sh_dm && piece_fits(c, per_slice(c, ysz * esz(root_dtype(c))));
	copy_weights(c);
	if (s->dm)
		s->ys = tcpl_dm_tensor_top(c, s->root[0], "shared", root_dtype(c), rn->rank, sh);
	else
		s->yb = tcpl_dm_tensor(c, s->root[0], "shared-piece", root_dtype(c), rn->rank, rn->shape);
}

/* The root of piece rp - 1, held in yb, to its rows of `shared` (when rp > 0). */
static void copy_pending(lw *c)
{
	struct tcpl_shared *s = c->sh;
	if (s->dm)
		return;
	uint32_t none = br(c, TCP_C_LT, s->rp, s->r1);
	dma_copy(c, s->ys, -s->R * s->rrow, s->rp, s->R * s->rrow, s->yb, 0, -1, 0, ir_numel(N(c->g, s->root[0])));
	patch(c, none);
}

/* The piece: chunk 0's part, x's rows and the root's rows offset by the piece register. */
static void emit_piece(lw *c, bool body)
{
	struct tcpl_shared *s = c->sh;
	uint32_t at = c->p->ncode;
	if (s->dm) /* the result lands in its rows of `shared` (offset by the piece register below) */
		c->v[s->root[0]] = tview(s->ys, s->root[0], N(c->g, s->root[0]));
	else if (body) /* the result lands in yb; the copy out of the previous piece's goes first */
		c->v[s->root[0]] = tview(s->yb, s->root[0], N(c->g, s->root[0]));
	for (uint32_t j = 0; j < s->n0 && !c->failed; j++)
		tcpl_lower_node(c, s->node0[j]);
	if (c->failed)
		return;
	int32_t xt = c->leaf_t[s->x];
	for (uint32_t q = at; q < c->p->ncode; q++)
		for (int w = 0; w < TCP_NVIEW; w++) {
			tcp_view *v = &c->p->code[q].v[w];
			if (v->t == xt && xt >= 0 && v->reg < 0)
				v->reg = s->rp, v->scale = s->R * s->xrow;
			else if (s->dm && v->t == s->ys && v->reg < 0)
				v->reg = s->rp, v->scale = s->R * s->rrow;
		}
	if (s->dm) {
		val *v = &c->v[s->root[0]];
		if (v->kind != VK_VIEW || v->t != s->ys || v->base != 0)
			tcpl_err(c, s->root[0], "a shared expert's piece result is not in its rows of `shared`");
		return;
	}
	moe_id r0 = s->root[0];
	const ir_node *rn = N(c->g, r0);
	val *v = tcpl_need_view(c, r0);
	if (v->kind != VK_VIEW || !is_contig(v, rn) || c->p->t[v->t].dtype != rn->dtype)
		v = tcpl_copy_contig(c, r0);
	if (v->kind != VK_VIEW || !is_contig(v, rn) || c->p->t[v->t].space != TCP_DM) {
		tcpl_err(c, r0, "a shared expert's piece result is not a contiguous DM tensor");
		return;
	}
	if (s->ys < 0) {
		int64_t sh[MOE_MAX_RANK];
		memcpy(sh, rn->shape, sizeof sh);
		sh[0] = s->R * s->P;
		s->ys = tcpl_hbm_tensor(c, "shared", TCP_T_SCRATCH, (moe_dtype)c->p->t[v->t].dtype, rn->rank, sh);
	}
	if (!body) {
		dma_copy(c, s->ys, 0, s->rp, s->R * s->rrow, v->t, v->base, -1, 0, ir_numel(rn));
		return;
	}
	if (v->t != s->yb || v->base != 0) {
		tcpl_err(c, r0, "a shared expert's piece result is not in its DM buffer");
		return;
	}
	/* the copy out waits for the piece's last contraction: issued now it
	 * would hold the in-order DMA context (the next block's weights) behind
	 * it, so it goes out at the next piece's start, or after the loop */
	tcp_insn *code = c->p->code;
	uint32_t first = at;
	while (first < c->p->ncode && tcp_op_ctx[code[first].op] == TCP_CTX_DMA)
		first++; /* after the piece's own copies of x's rows */
	uint32_t n0 = c->p->ncode;
	copy_pending(c);
	uint32_t n = c->p->ncode - n0;
	tcp_insn tmp[4];
	memcpy(tmp, &code[n0], n * sizeof *tmp);
	memmove(&code[first + n], &code[first], (n0 - first) * sizeof *code);
	memcpy(&code[first], tmp, n * sizeof *tmp);
	for (uint32_t q = first; q < first + n; q++)
		if (code[q].op == TCP_OP_BR)
			code[q].target += (int32_t)first - (int32_t)n0;
	for (uint32_t q = first + n; q < c->p->ncode; q++)
		if ((code[q].op == TCP_OP_BR || code[q].op == TCP_OP_JMP) && code[q].target >= (int32_t)first)
			code[q].target += (int32_t)n;
}

/* At the end of the block body: a piece when the accumulator reaches the block count. */
void tcpl_shared_body(lw *c)
{
	struct tcpl_shared *s = c->sh;
	if (!s || s->late)
		return;
	uint32_t lt = br(c, TCP_C_LT, s->ra, R_NB), done = br(c, TCP_C_GE, s->rp, s->rn);
	emit_piece(c, true);
	alui(c, TCP_S_SUB, s->ra, s->ra, R_NB, 0);
	alui(c, TCP_S_ADD, s->rp, s->rp, TCP_NOREG, 1);
	patch(c, lt);
	patch(c, done);
	alui(c, TCP_S_ADD, s->ra, s->ra, TCP_NOREG, s->P);
}

/* The DM of chunk 0's values (and, with weights, of the weight copies),
 * freed; those values are read no more (a weight two contractions share:
 * freed once). */
static void free_piece(lw *c, bool weights)
{
	const struct tcpl_shared *s = c->sh;
	for (uint32_t j = 0; j < s->n0; j++) {
		const ir_node *n = N(c->g, s->node0[j]);
		moe_id own[2] = {s->node0[j], weights && n->op == MOE_OP_EINSUM ? n->args[1] : MOE_NONE};
		for (int k = 0; k < 2; k++) {
			val *v = own[k] != MOE_NONE ? &c->v[own[k]] : NULL;
			if (v && v->kind == VK_VIEW && !v->region && v->owner == own[k] && c->p->t[v->t].space == TCP_DM &&
				!(s->dm && v->t == s->ys))
				tcpl_dm_free(c, v->t);
			if (v && (k == 0 || (v->kind == VK_VIEW && c->p->t[v->t].space == TCP_DM)))
				v->kind = VK_NONE;
		}
	}
}

/* After the loop (its DM released): the pieces left, in a loop of their own
 * (lowered again: a tensor the body's piece names outside the loop too
 * would hold its DM through the whole loop), their DM freed, and the roots
 * as views of their rows of `shared`. */
void tcpl_shared_after(lw *c)
{
	struct tcpl_shared *s = c->sh;
	if (!s || c->failed)
		return;
	if (s->late) {
		copy_weights(c);
	} else {
		copy_pending(c); /* the last piece of the loop */
		free_piece(c, false);
	}
	uint32_t top = br(c, TCP_C_GE, s->rp, s->rn);
	int64_t macs = c->p->router_macs;
	emit_piece(c, false);
	/* the statistics' MACs outside the block loop: P pieces, the code of one
	 * lowered here and (not late) once in the body */
	c->p->router_macs += (c->p->router_macs - macs) * (s->P - (s->late ? 1 : 2));
	alui(c, TCP_S_ADD, s->rp, s->rp, TCP_NOREG, 1);
	uint32_t back = jmp(c); /* (jmp may move the code array) */
	c->p->code[back].target = (int32_t)top;
	patch(c, top);
	free_piece(c, true);
	for (int64_t k = 0; k < s->P; k++) {
		val v = tview(s->ys, s->root[k], N(c->g, s->root[k]));
		v.base = k * s->R * s->rrow;
		c->v[s->root[k]] = v;
	}
	drop(c, s);
}

void tcpl_shared_fini(lw *c)
{
	drop(c, c->sh);
}
