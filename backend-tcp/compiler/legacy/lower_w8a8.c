/* backend-tcp/lower_w8a8.c: W8A8's activation quantized before the dispatch
 * (tcp-w8a8-act-once, gpass/w8a8_act.c) on TCP (docs/tcp-isa.md 7.10): its
 * integers x.q held as i8 from their pass to the block loop's contraction,
 * their rounding in two passes, and their dispatch scattered from DM. The
 * block loop's contractions and the per-block quantization are
 * lower_quant.c's. */
#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static tcp_view v2(int32_t t, int64_t base, int64_t s0, int64_t s1)
{
	const int64_t st[2] = {s0, s1};
	return tcp_b_view(t, base, 2, st);
}

/* x.q (its value q = v rounded half away from zero, as blockwise-dispatch
 * writes it from v = xf R, R = 127 / m; tcp-w8a8-act-once) is lowered in two
 * passes, v = xf R (f32) and q = i8(cvt.ftoi(v + copysign(0.5 - 2^-25, v))),
 * as the block loop's quantization does (exact for |v| <= 127), where the
 * graph's rounding (trunc, |v - t| >= 0.5, the side of v) takes six. The
 * rounding's nodes, v among them, are fused into x.q: no [T, D] buffer of
 * theirs but v's. c->w8_v1, c->w8_r1: v and R + 1. */
static bool q_closure(const lw *c, moe_id id, moe_id v, bool *in)
{
	const ir_node *n = N(c->g, id);
	if (id == v || in[id])
		return true;
	if (!(ir_ops[n->op].flags & OPF_ELEM) && n->op != MOE_OP_CAST)
		return n->op == MOE_OP_CONST && n->rank == 0;
	in[id] = true;
	for (uint32_t k = 0; k < n->nargs; k++)
		if (n->args[k] == MOE_NONE || !q_closure(c, n->args[k], v, in))
			return false;
	return true;
}

/* The pass rounding f32 v half away from zero into i8 dst (rows of shape
 * sh): tag = v < 0; its sign bit on 0.5 - 2^-25; + v; truncated; the low
 * byte. */
static void round_pass(lw *c, const int64_t *sh, tcp_view dst, tcp_view v, int32_t vreg)
{
	tcp_insn p = tcp_b_vec(2, sh, dst);
	p.vreg = vreg;
	p.v[TCP_V_S0] = v;
	tcp_b_step(&p, TCP_V_FTLT, TCP_SRC_S0, TCP_SRC_IMM, 0);
	tcp_b_step(&p, TCP_V_SHL, TCP_SRC_V, TCP_SRC_IMM, 31);
	tcp_b_step(&p, TCP_V_IADD, TCP_SRC_V, TCP_SRC_IMM, fbits(0.5f - 0x1p-25f));
	tcp_b_step(&p, TCP_V_FADD, TCP_SRC_V, TCP_SRC_S0, 0);
	tcp_b_step(&p, TCP_V_FTOI, TCP_SRC_V, TCP_SRC_NONE, 0);
	emit(c, &p);
}

static void w8a8_q_plan(lw *c, moe_id xq)
{
	const moe_graph *g = c->g;
	moe_id v = MOE_NONE;
	for (moe_id i = 0; i < xq && v == MOE_NONE; i++) { /* v = mul(xf, div(127, m)) f32 [T, D] */
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_MUL || n->nargs != 2 || n->dtype != MOE_F32 || n->rank != 2 ||
			N(g, xq)->rank != 2 || n->shape[0] != N(g, xq)->shape[0] || n->shape[1] != N(g, xq)->shape[1])
			continue;
		const ir_node *r = N(g, n->args[1]), *k = r->op == MOE_OP_DIV ? N(g, r->args[0]) : NULL;
		if (k && k->op == MOE_OP_CONST && k->rank == 0 && ir_attr_float(k, "value", 0) == 127.0 &&
			N(g, n->args[0])->dtype == MOE_F32 && N(g, n->args[0])->rank == 2 && r->rank == 2 && r->shape[1] == 1 &&
			r->dtype == MOE_F32)
			v = i;
	}
	if (v == MOE_NONE || c->fused_into[xq] != MOE_NONE)
		return;
	bool *in = ctx_alloc(c->ctx, (g->nnodes + 1) * sizeof *in);
	memset(in, 0, (g->nnodes + 1) * sizeof *in);
	bool ok = q_closure(c, xq, v, in);
	in[v] = true;
	in[xq] = false;
	for (moe_id u = 0; u < g->nnodes && ok; u++) { /* nothing of it read elsewhere */
		moe_id f = c->fused_into[u]; /* the fusion plan may have joined nodes of it */
		if (in[u])
			ok = !c->is_out[u] && !c->inreg[u] && N(g, u)->valid == MOE_NONE &&
			     (f == MOE_NONE || f == xq || in[f]);
		for (uint32_t k = 0; k < N(g, u)->nargs && ok; k++) {
			moe_id a = N(g, u)->args[k];
			ok = a == MOE_NONE || !in[a] || in[u] || u == xq;
		}
	}
	if (ok) {
		for (moe_id u = 0; u < g->nnodes; u++)
			if (in[u])
				c->fused_into[u] = xq;
		c->w8_v1 = v + 1;
	}
	ctx_free(c->ctx, in, (g->nnodes + 1) * sizeof *in);
}

bool tcpl_w8a8_lower_q(lw *c, moe_id id)
{
	if (!c->w8_v1 || c->store_dt[id] != MOE_I8 || c->fused_into[c->w8_v1 - 1] != id)
		return false;
	const ir_node *vn = N(c->g, c->w8_v1 - 1);
	int64_t T = vn->shape[0], D = vn->shape[1], shx[2] = {T, D};
	val *xv = tcpl_dm_view(c, vn->args[0]);
	if (c->failed)
		return true;
	val x = *xv;
	val *rv = tcpl_dm_view(c, vn->args[1]);
	if (c->failed)
		return true;
	val r = *rv;
	val *o = tcpl_out_val(c, id, (moe_dtype)N(c->g, id)->dtype);
	if (c->p->t[o->t].dtype != MOE_I8) {
		tcpl_err(c, id, "W8A8: the quantized rows' buffer is not an i8 tensor");
		return true;
	}
	int32_t vt = tcpl_dm_tensor(c, id, "act.v", MOE_F32, 2, shx);
	tcp_insn p = tcp_b_vec(2, shx, v2(vt, 0, D, 1));
	p.vreg = -1;
	p.v[TCP_V_S0] = v2(x.t, x.base, x.stride[0], x.stride[1]);
	p.v[TCP_V_S1] = v2(r.t, r.base, r.stride[0], 0);
	tcp_b_step(&p, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	emit(c, &p);
	round_pass(c, shx, v2(o->t, o->base, o->stride[0], o->stride[1]), v2(vt, 0, D, 1), -1);
	tcpl_dm_free(c, vt);
	return true;
}

/* The dispatch of W8A8's quantized rows or their scales (tcp-w8a8-act-once):
 * scatter(0, pos, gather(src, tok)) into the block grid, read as blocks.q or
 * blocks.scale, with tok = iota(T K) / K. Pair j's row is src's row j / K,
 * so the scatter reads src (in DM) in place, each row K times (its gather
 * fused into it: no [T K, row] copy through DM; tcpl_lower_scatter). */
static void w8a8_direct(lw *c, moe_id sc)
{
	const moe_graph *g = c->g;
	const ir_node *n = N(g, sc);
	if (n->op != MOE_OP_SCATTER || n->nargs != 3 || c->inreg[sc] || c->ggrid[sc] || n->valid != MOE_NONE ||
		n->rank != 2 || strcmp(ir_attr_str(n, "mode", "set"), "set") || N(g, n->args[0])->op != MOE_OP_CONST ||
		ir_attr_float(N(g, n->args[0]), "value", (double)ir_attr_int(N(g, n->args[0]), "value", 1)) != 0.0)
		return;
	moe_id ga = n->args[2];
	const ir_node *gn = N(g, ga);
	int64_t K;
	if (gn->op != MOE_OP_GATHER || gn->valid != MOE_NONE || c->inreg[ga] || c->is_out[ga] ||
		c->fused_into[ga] != MOE_NONE || ir_attr_int(gn, "axis", 0) != 0 || N(g, gn->args[0])->rank != 2 ||
		!tcp_w8a8_tok_major(g, gn->args[1], N(g, gn->args[0])->shape[0], &K))
		return;
	bool named = false;
	int users = 0;
	for (moe_id u = sc + 1; u < g->nnodes; u++)
		for (uint32_t k = 0; k < N(g, u)->nargs; k++)
			if (N(g, u)->args[k] == sc) {
				const ir_node *un = N(g, u);
				named = un->op == MOE_OP_RESHAPE && un->name &&
					(!strcmp(un->name, "blocks.q") || !strcmp(un->name, "blocks.scale"));
				if (!named)
					return;
			}
	for (moe_id u = ga + 1; u < g->nnodes; u++)
		for (uint32_t k = 0; k < N(g, u)->nargs; k++)
			users += N(g, u)->args[k] == ga;
	if (named && users == 1)
		c->fused_into[ga] = sc;
}

/* The readers of node id: how many, and whether each satisfies ok(c, reader, id). */
static bool readers_all(const lw *c, moe_id id, bool (*ok)(const lw *, moe_id, moe_id), int *count)
{
	*count = 0;
	for (moe_id u = id + 1; u < c->g->nnodes; u++)
		for (uint32_t k = 0; k < N(c->g, u)->nargs; k++)
			if (N(c->g, u)->args[k] == id) {
				++*count;
				if (!ok(c, u, id))
					return false;
			}
	return !c->is_out[id];
}

static bool fused_reader(const lw *c, moe_id u, moe_id id)
{
	(void)id;
	return c->fused_into[u] != MOE_NONE;
}

static bool grid_reader(const lw *c, moe_id u, moe_id id)
{
	const ir_node *n = N(c->g, u);
	int k = 0;
	return n->op == MOE_OP_RESHAPE && n->name && !strcmp(n->name, "blocks.q") && !c->inreg[u] &&
	       readers_all(c, u, fused_reader, &k) && k >= 1 && id == n->args[0];
}

static bool scatter_reader(const lw *c, moe_id u, moe_id id)
{
	const ir_node *n = N(c->g, u);
	int k = 0;
	return n->op == MOE_OP_SCATTER && n->nargs == 3 && n->args[2] == id && n->args[0] != id && n->args[1] != id &&
	       !strcmp(ir_attr_str(n, "mode", "set"), "set") && !c->ggrid[u] && !c->inreg[u] && n->valid == MOE_NONE &&
	       readers_all(c, u, grid_reader, &k) && k >= 1;
}

static bool gather_reader(const lw *c, moe_id u, moe_id id)
{
	const ir_node *n = N(c->g, u);
	int k = 0;
	return n->op == MOE_OP_GATHER && n->args[0] == id && !c->inreg[u] && n->valid == MOE_NONE &&
	       readers_all(c, u, scatter_reader, &k) && k == 1;
}

/* W8A8's activation quantized before the dispatch (tcp-w8a8-act-once): its
 * values x.q are integers of at most 127 in magnitude (in the compute type,
 * or f32), read only through their dispatch (gather, scatter into the block
 * grid, the grid's reshape blocks.q) by the int8 contractions, which take
 * them as i8. So x.q's pass converts them (exactly) and commits i8, and the
 * dispatch and the blocks' row fetches move those bytes: a quarter (f32) or
 * half (bf16) of the compute type's, and no per-block conversion pass. */
static void w8a8_i8_rows(lw *c)
{
	const moe_graph *g = c->g;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		int k = 0;
		if (!n->name || strcmp(n->name, "x.q") || c->inreg[i] || c->fused_into[i] != MOE_NONE ||
			(ir_ops[n->op].flags & OPF_LEAF) || n->op == MOE_OP_RESHAPE || n->op == MOE_OP_GATHER ||
			!moe_dtype_is_float((moe_dtype)n->dtype) || c->store_dt[i] || !readers_all(c, i, gather_reader, &k) ||
			k < 1)
			continue;
		c->store_dt[i] = MOE_I8;
		for (moe_id u = i + 1; u < g->nnodes; u++) {
			moe_id a0 = N(g, u)->nargs ? N(g, u)->args[0] : MOE_NONE, a2 = N(g, u)->nargs > 2 ? N(g, u)->args[2] : MOE_NONE;
			if ((N(g, u)->op == MOE_OP_GATHER && a0 != MOE_NONE && c->store_dt[a0] == MOE_I8) ||
				(N(g, u)->op == MOE_OP_SCATTER && a2 != MOE_NONE && c->store_dt[a2] == MOE_I8) ||
				(N(g, u)->op == MOE_OP_RESHAPE && a0 != MOE_NONE && c->store_dt[a0] == MOE_I8))
				c->store_dt[u] = MOE_I8;
		}
	}
}


void tcpl_w8a8_act_plan(lw *c)
{
	const moe_graph *g = c->g;
	w8a8_i8_rows(c);
	for (moe_id i = 0; i < g->nnodes && !c->failed; i++)
		if (c->store_dt[i] == MOE_I8 && N(g, i)->name && !strcmp(N(g, i)->name, "x.q"))
			w8a8_q_plan(c, i);
	for (moe_id i = 0; i < g->nnodes && !c->failed; i++)
		w8a8_direct(c, i);
}

static int64_t cdiv64(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* The TRF rows per slice of a scaled i8 x i8 block contraction y [M, O] =
 * xq [M, I] w^T (the whole reduction in one tile: the scale is per output):
 * the count whose main-context pass is the shortest by the cost rules of
 * docs/tcp-isa.md section 10 (MACs, the streamed rows, the commit with its
 * scales, and the switch's bytes: every slice of a row group streams the
 * group's rows), at most half the TRF. The sub context's loads of the next
 * tile overlap the pass, so unlike the bf16 planner this one does not weigh
 * them. 0: none fits. */
int64_t tcpl_w8a8_tile(const lw *c, int64_t M, int64_t O, int64_t I, int64_t out_bytes)
{
	const moe_tcp_machine *m = c->m;
	int64_t S = tcp_slices(m), best = 0, best_t = -1;
	for (int64_t tile = 1; tile <= O && tile * I <= tcp_trf_bytes(m) / 2; tile++) {
		int64_t Cg = cdiv64(O, tile), R = S / Cg > 0 ? S / Cg : 1, Bs = cdiv64(M, R), tiles = cdiv64(Cg, S);
		int64_t mac = tiles * cdiv64(Bs * tile * I, m->lanes_per_slice * m->macs_per_lane[TCP_MT_I8]);
		int64_t stream = tiles * cdiv64(Bs * I, m->stream_bytes_per_cycle);
		int64_t commit = tiles * cdiv64(Bs * tile * (out_bytes + 4), m->fetch_bytes);
		int64_t route = tiles * cdiv64(Bs * I + Bs * tile * (out_bytes + 4), m->switch_bytes_per_cycle);
		int64_t t = mac > stream ? mac : stream;
		t = t > commit ? t : commit;
		t = t > route ? t : route;
		if (best_t < 0 || t < best_t) {
			best_t = t;
			best = tile;
		}
	}
	return best;
}

/* A block's per-token int8 rows xq [M, I] of xf [M, I] (x, a DM view) and
 * R = 127 / max(max_i |xf|, 1e-10) per row [M], in three passes:
 *   R[r]    = c.fmin(d.div(127, r.fmax(f.abs(xf))), f32(127 / 1e-10))
 *   v[r, i] = xf R                                          (f32)
 *   xq      = i8(cvt.ftoi(v + copysign(0.5 - 2^-25, v)))
 * The first is the reference's R exactly: f32 division is monotone, so
 * 127 / m is at most f32(127 / 1e-10) exactly when m >= 1e-10 (and m = 0, a
 * zero or padding row, gives inf, clipped to it); NaN propagates through
 * both. The contraction's scale is then C = ws / R (lower_quant.c): the
 * row's scale m / 127 is never formed. With rdst, R is written there (the
 * row-factor slot of down's staged scales, read by the contraction's
 * flags=rowdiv) and *R_ is -1. */
void tcpl_w8a8_quantize(lw *c, moe_id id, const val *x, int64_t M, int64_t I, int vreg, const tcp_view *rdst, int32_t *R_,
	int32_t *xq_)
{
	int64_t sh1[1] = {M}, shx[2] = {M, I};
	volatile float rmax = 127.0f; /* f32(127 / f32(1e-10)), rounded once as d.div rounds */
	rmax = rmax / 1e-10f;
	int32_t R = rdst ? -1 : tcpl_dm_tensor(c, id, "act.inv", MOE_F32, 1, sh1);
	tcp_view rv = rdst ? *rdst : v2(R, 0, 1, 0);
	rv.stride[0] = 1;
	rv.stride[1] = 0;
	int32_t v = tcpl_dm_tensor(c, id, "act.v", MOE_F32, 2, shx);
	int32_t xq = tcpl_dm_tensor(c, id, "act.i8", MOE_I8, 2, shx);
	tcp_view xv = tcp_view_none();
	xv.t = x->t;
	xv.base = x->base;
	xv.reg = x->region ? x->reg : -1;
	xv.scale = x->region ? x->scale : 0;
	xv.stride[0] = x->stride[0];
	xv.stride[1] = x->stride[1];
	tcp_insn p = tcp_b_vec(2, shx, rv);
	p.vreg = vreg;
	p.v[TCP_V_S0] = xv;
	tcp_b_step(&p, TCP_V_FABS, TCP_SRC_V, TCP_SRC_NONE, 0);
	tcp_b_step(&p, TCP_V_FRMAX, TCP_SRC_V, TCP_SRC_NONE, 0);
	tcp_b_step(&p, TCP_V_FDIV, TCP_SRC_IMM, TCP_SRC_V, fbits(127.0f));
	tcp_b_step(&p, TCP_V_FMIN, TCP_SRC_V, TCP_SRC_IMM, fbits(rmax));
	emit(c, &p);
	p = tcp_b_vec(2, shx, v2(v, 0, I, 1));
	p.vreg = vreg;
	p.v[TCP_V_S0] = xv;
	p.v[TCP_V_S1] = rv;
	tcp_b_step(&p, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	emit(c, &p);
	round_pass(c, shx, v2(xq, 0, I, 1), v2(v, 0, I, 1), vreg);
	tcpl_dm_free(c, v);
	*R_ = R;
	*xq_ = xq;
}

/* The HBM tensor and base of weight leaf w (staged into DM by a copy from
 * it, or still in HBM); false when neither. */
static bool hbm_source(const lw *c, moe_id w, int32_t *t, int64_t *base)
{
	const val *v = &c->v[w];
	if (v->kind != VK_VIEW)
		return false;
	if (c->p->t[v->t].space == TCP_HBM) {
		*t = v->t;
		*base = v->base;
		return true;
	}
	for (uint32_t k = 0; k < c->p->ncode; k++) {
		const tcp_insn *in = &c->p->code[k];
		if (in->op == TCP_OP_DMA_COPY && in->v[TCP_V_DST].t == v->t && in->v[TCP_V_DST].base == 0 &&
			in->v[TCP_V_S0].reg < 0 && c->p->t[in->v[TCP_V_S0].t].space == TCP_HBM) {
			*t = in->v[TCP_V_S0].t;
			*base = in->v[TCP_V_S0].base;
			return true;
		}
	}
	return false;
}

/* W8A8's gate/up scales C[g, r, o] = as[g M + r] x ws[bexp[g], o] for every
 * block g of the grid, made once, where each block made its own in one
 * vector pass (each pass's cost is mostly its fixed part: issue, fill/drain
 * and the switch's ring): before the loop, the grid of the rows' scales (64
 * equal copies per row, as dispatched) is copied into DM and the blocks'
 * channel scales are gathered by the block experts; the first block then
 * makes C in one pass of [G, M, 2F] (inside the loop's body, so that a
 * timing-only run skips its arithmetic as it skips every block's). The same
 * products as the per-block pass: no value changes. Each block's contraction
 * reads its rows of C through the block register, and the rows' scales are
 * not fetched per block. Only when C and its operands take at most 3/8 of DM
 * (Qwen3-30B-A3B: T <= 512). */
void tcpl_w8a8_bulk(lw *c, int32_t tbe, int64_t bebase, int64_t bes)
{
	moe_id bs, wsg, u;
	int64_t M = 0, O = 0;
	c->w8_c1 = 0;
	if (tbe < 0 || (u = tcpl_w8a8_pre_einsum(c, &bs, &M, &O, &wsg)) == MOE_NONE || c->next_reg >= TCP_NREG)
		return;
	const ir_node *bn = N(c->g, bs), *wn = N(c->g, N(c->g, wsg)->args[0]);
	const val *gv = &c->v[bs];
	int64_t G = c->G, w = bn->rank == 3 ? bn->shape[2] : 0, E = wn->rank >= 2 ? wn->shape[0] : 0;
	if (gv->kind != VK_VIEW || c->p->t[gv->t].space != TCP_HBM || gv->region || bn->rank != 3 || bn->shape[0] != G ||
		bn->shape[1] != M || gv->stride[0] != M * w || gv->stride[1] != w || gv->stride[2] != 1 ||
		ir_numel(wn) != E * O || E < 1)
		return;
	int32_t wh;
	int64_t wbase;
	double dm = (double)c->m->dm_bytes_per_slice * (double)c->S;
	if (!hbm_source(c, N(c->g, wsg)->args[0], &wh, &wbase) || 4.0 * (double)G * (double)(M * (O + w) + O) > dm * 3 / 8)
		return;
	int64_t sh_g[1] = {G * M * w}, sh_w[2] = {G, O}, sh_c[2] = {G * M, O}, one[1] = {1};
	int32_t C = tcpl_dm_tensor_top(c, u, "w8a8.scale", MOE_F32, 2, sh_c);
	int32_t sg = tcpl_dm_tensor(c, u, "w8a8.rowscale", MOE_F32, 1, sh_g);
	int32_t wb = tcpl_dm_tensor(c, u, "w8a8.wscale", MOE_F32, 2, sh_w);
	if (c->failed)
		return;
	tcp_insn in = tcp_b_dma_copy(1, sh_g, tcp_b_view(sg, 0, 1, one), tcp_b_view(gv->t, gv->base, 1, one));
	emit(c, &in);
	const int64_t gd[3] = {1, G, O}, ds[3] = {G * O, O, 1}, ss[3] = {E * O, O, 1}, is[2] = {G * bes, bes};
	in = tcp_b_dma_gather(3, gd, tcp_b_view(wb, 0, 3, ds), tcp_b_view(wh, wbase, 3, ss), tcp_b_view(tbe, bebase, 2, is),
		E);
	emit(c, &in);
	c->w8_zreg = tcpl_new_reg(c, u);
	li(c, c->w8_zreg, 0);
	c->w8_c1 = C + 1;
	c->w8_sg = sg;
	c->w8_wb = wb;
	c->w8_m = M;
	c->w8_w = w;
	c->w8_cstride = M * O;
	c->w8_bsc = bs;
}

/* In the loop's body, first: block 0 makes every block's C (tcpl_w8a8_bulk). */
void tcpl_w8a8_bulk_body(lw *c)
{
	if (!c->w8_c1)
		return;
	int64_t G = c->G, M = c->w8_m, w = c->w8_w, O = c->w8_cstride / M;
	uint32_t skip = br(c, TCP_C_NE, R_G, c->w8_zreg);
	const int64_t pd[3] = {G, M, O}, cs[3] = {M * O, O, 1}, s0[3] = {M * w, w, 0}, s1[3] = {O, 0, 1};
	tcp_insn in = tcp_b_vec(3, pd, tcp_b_view(c->w8_c1 - 1, 0, 3, cs));
	in.vreg = -1;
	in.v[TCP_V_S0] = tcp_b_view(c->w8_sg, 0, 3, s0);
	in.v[TCP_V_S1] = tcp_b_view(c->w8_wb, 0, 3, s1);
	tcp_b_step(&in, TCP_V_FMUL, TCP_SRC_V, TCP_SRC_S1, 0);
	emit(c, &in);
	patch(c, skip);
}

void tcpl_w8a8_bulk_end(lw *c)
{
	if (!c->w8_c1)
		return;
	tcpl_dm_free(c, c->w8_sg);
	tcpl_dm_free(c, c->w8_wb);
	tcpl_dm_free(c, c->w8_c1 - 1);
}

/* A W8A8 weight's per-channel scales ws [E, D, 1] (f32, in HBM; down's, and
 * gate and up's where their input is quantized per block), staged whole into DM
 * as [2 E, D]: expert e's scales at e D and its row-factor slot at E D + e D
 * (at least M elements). Each block's quantization writes its R there and
 * the contraction divides, output by output, ws[o] / R[m] (flags=rowdiv, one
 * view: the slot is a constant E D past the scales through the expert
 * register), where a pass made C = ws / R per block. The same quotient and
 * product: y does not change. False (nothing emitted) when the scales are
 * not f32 or contiguous, or D < M. */
bool tcpl_w8a8_stage_rowdiv(lw *c, moe_id w, int64_t M)
{
	const ir_node *n = N(c->g, w);
	val *v = &c->v[w];
	if (v->kind != VK_VIEW || v->region || c->p->t[v->t].space != TCP_HBM || c->p->t[v->t].dtype != MOE_F32 ||
		!is_contig(v, n) || n->rank < 2 || n->shape[0] < 1 || M < 1 || c->w8_rd1[1])
		return false;
	int64_t E = n->shape[0], D = ir_numel(n) / E, sh[2] = {2 * E, D}, ne[1] = {E * D}, one[1] = {1};
	if (D < M)
		return false;
	int32_t t = tcpl_dm_tensor(c, w, "w8a8.dscale", MOE_F32, 2, sh);
	if (c->failed)
		return true;
	uint32_t at = c->p->ncode;
	tcp_insn in = tcp_b_dma_copy(1, ne, tcp_b_view(t, 0, 1, one), tcp_b_view(v->t, v->base, 1, one));
	emit(c, &in);
	tcpl_join_adjacent(c, at);
	val nv = tview(t, v->owner, n);
	nv.owner = w;
	*v = nv;
	int k = c->w8_rd1[0] ? 1 : 0;
	c->w8_rd1[k] = t + 1;
	c->w8_rdoff[k] = E * D;
	return true;
}
