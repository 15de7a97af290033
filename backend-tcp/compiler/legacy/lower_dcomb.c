/* backend-tcp/lower_dcomb.c: a decode's combine accumulated in the block loop
 * (docs/tcp-isa.md 7.4, "The combine in the loop").
 *
 * At T = 1 the grid is the K pairs in slot order, one row per block, and the
 * combine after the loop is y = sum_k w[k] x out[k] (f32 products summed in
 * slot order, one pass over the K block results, its commit rounding to y's
 * dtype). Each block's down projection writes out[g] to the DM grid, so the
 * sum can run as the blocks finish, in the same order:
 *
 *   before the loop:  acc = -0.0                       (tu.vec, l.or of an immediate)
 *   block g < G - 1:  acc = acc + out[g] x w[g]        (f.mul, f.add; commit f32)
 *   block G - 1:      y   = acc + out[g] x w[g]        (the commit rounds to y's dtype)
 *
 * -0.0 + t = t for every t, so block 0's add gives the reduce's first term
 * exactly (a sum of -0.0 alone stays -0.0), and each later add is the
 * reduce's next one: y is bitwise the combine's. The K - 1 accumulations run
 * on the main context while the next expert's weights stream; the last one
 * follows down's last contraction in place of the combine pass (a pass of D
 * elements rather than of K x D), and y's copy out follows it. */
#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

/* Through views: casts the fetch performs (bf16 -> f32, or planned as
 * aliases), reshapes, and slices that keep every element. */
static moe_id through(const lw *c, moe_id id)
{
	for (int k = 0; k < 16; k++) {
		const ir_node *n = N(c->g, id), *a = n->nargs ? N(c->g, n->args[0]) : NULL;
		bool widen = n->op == MOE_OP_CAST && a && n->dtype == MOE_F32 && (a->dtype == MOE_BF16 || c->alias_cast[id]);
		if (!widen && n->op != MOE_OP_RESHAPE && !(n->op == MOE_OP_SLICE && ir_numel(n) == ir_numel(a)))
			return id;
		id = n->args[0];
	}
	return id;
}

static bool in_grid(moe_id x, const int32_t *dmhome, int ndh)
{
	for (int k = 0; k < ndh; k++)
		if (dmhome[k] == (int32_t)x)
			return true;
	return false;
}

/* The per-block weight w: a DM view lowered before the loop with G
 * elements along one axis; its base and the stride of that axis. */
static bool weight_view(const lw *c, moe_id w, int64_t G)
{
	const ir_node *n = N(c->g, w);
	const val *v = &c->v[w];
	if (c->inreg[w] || c->dep[w] || v->kind != VK_VIEW || v->region || c->p->t[v->t].space != TCP_DM ||
		ir_numel(n) != G)
		return false;
	for (int i = 0; i < n->rank; i++)
		if (n->shape[i] == G) {
			((lw *)c)->dc.wstride = v->stride[i];
			return true;
		}
	return G == 1;
}

/* Whether reduce_sum `r` is the decode's combine: sum over the G blocks of
 * mul(block result [G, D] from a DM grid, weights [G, 1]), fused into one
 * pass; fills c->dc (but the tensors) when it is. */
static bool is_combine(lw *c, moe_id r, const int32_t *dmhome, int ndh)
{
	const moe_graph *g = c->g;
	const ir_node *n = N(g, r);
	if (n->op != MOE_OP_REDUCE_SUM || c->inreg[r] || n->valid != MOE_NONE || n->dtype != MOE_F32)
		return false;
	moe_id in = n->args[0], m = in;
	if (N(g, in)->op == MOE_OP_RESHAPE && c->fused_into[in] == r)
		m = N(g, in)->args[0];
	const ir_node *mn = N(g, m), *an = N(g, in);
	int ax = norm_axis(n, an, -1);
	if (mn->op != MOE_OP_MUL || c->fused_into[m] != r || mn->rank != 2 || an->rank < 2 || ax != an->rank - 2 ||
		an->shape[ax] != c->G || mn->shape[0] != c->G || mn->shape[1] != an->shape[an->rank - 1] ||
		ir_numel(n) != mn->shape[1])
		return false;
	for (int k = 0; k < 2; k++) {
		const ir_node *a = N(g, mn->args[k]), *b = N(g, mn->args[1 - k]);
		if (a->rank != 2 || a->shape[0] != c->G || a->shape[1] != mn->shape[1] || b->rank != 2 || b->shape[1] != 1)
			continue;
		moe_id x = through(c, mn->args[k]), w = through(c, mn->args[1 - k]);
		const ir_node *xn = N(g, x);
		if (!in_grid(x, dmhome, ndh) || ir_numel(xn) != ir_numel(a) || xn->shape[0] != c->G ||
			c->v[x].kind != VK_VIEW || !c->v[x].region || c->v[x].scale != a->shape[1] ||
			!moe_dtype_is_float((moe_dtype)xn->dtype) || !moe_dtype_is_float((moe_dtype)N(g, w)->dtype) ||
			!weight_view(c, w, c->G))
			continue;
		c->dc.red = r;
		c->dc.grid = c->v[x].t;
		c->dc.gbase = c->v[x].base;
		c->dc.gscale = c->v[x].scale;
		c->dc.w = c->v[w].t;
		c->dc.wbase = c->v[w].base;
		c->dc.n = mn->shape[1];
		return true;
	}
	return false;
}

/* acc = -0.0 */
static void init_acc(lw *c)
{
	tcp_insn in = tcp_b_vec(1, &c->dc.n, tcp_b_flat(c->dc.acc));
	tcp_b_step(&in, TCP_V_OR, TCP_SRC_IMM, TCP_SRC_IMM, 0x80000000u);
	emit(c, &in);
}

/* dst = acc + out[g] x w[g], g = the block register */
static void acc_pass(lw *c, int32_t dst)
{
	tcp_insn in = tcp_insn_init(TCP_OP_TU_VEC);
	in.ndim = 1;
	in.dim[0] = c->dc.n;
	tcp_view *d = &in.v[TCP_V_DST], *a = &in.v[TCP_V_S0], *o = &in.v[TCP_V_S1], *w = &in.v[TCP_V_S2];
	d->t = dst;
	d->stride[0] = 1;
	a->t = c->dc.acc;
	a->stride[0] = 1;
	o->t = c->dc.grid;
	o->base = c->dc.gbase;
	o->reg = R_G;
	o->scale = c->dc.gscale;
	o->stride[0] = 1;
	w->t = c->dc.w;
	w->base = c->dc.wbase;
	w->reg = R_G;
	w->scale = c->dc.wstride;
	in.nstep = 2;
	in.step[0] = (tcp_step){.op = TCP_V_FMUL, .x = TCP_SRC_S1, .y = TCP_SRC_S2};
	in.step[1] = (tcp_step){.op = TCP_V_FADD, .x = TCP_SRC_S0, .y = TCP_SRC_V};
	emit(c, &in);
}

/* Before the loop (its block count a constant: a decode): find the combine,
 * allocate acc and y, and clear acc. */
void tcpl_dcomb_plan(lw *c, const int32_t *dmhome, int ndh)
{
	c->dc.red = MOE_NONE;
	const val *nb = &c->v[c->nblocks], *rw = &c->v[c->rows];
	if (ndh <= 0 || nb->kind != VK_IMM || (int64_t)(int32_t)nb->imm != c->G || rw->kind != VK_IMM || rw->imm != 1 ||
		c->p->moe_T != 1 || c->G < 1)
		return;
	for (moe_id i = 0; i < c->g->nnodes; i++)
		if (is_combine(c, i, dmhome, ndh))
			break;
	moe_id r = c->dc.red;
	if (r == MOE_NONE)
		return;
	const ir_node *n = N(c->g, r);
	int64_t sh[1] = {c->dc.n};
	c->dc.acc = tcpl_dm_tensor(c, r, "combine_acc", MOE_F32, 1, sh);
	c->dc.y = tcpl_dm_tensor(c, r, n->name ? n->name : "combine",
		c->store_dt[r] ? (moe_dtype)c->store_dt[r] : MOE_F32, n->rank, n->shape);
	init_acc(c);
}

/* In block g's body, after its math: the accumulation, into y for the last block. */
void tcpl_dcomb_step(lw *c)
{
	if (c->dc.red == MOE_NONE)
		return;
	uint32_t last = br(c, TCP_C_GE, R_NEXT, R_NB);
	acc_pass(c, c->dc.acc);
	uint32_t done = jmp(c);
	patch(c, last);
	acc_pass(c, c->dc.y);
	patch(c, done);
}

/* After the loop: the combine's value is y; acc dies. */
void tcpl_dcomb_finish(lw *c)
{
	if (c->dc.red == MOE_NONE)
		return;
	tcpl_dm_free(c, c->dc.acc);
	c->v[c->dc.red] = tview(c->dc.y, c->dc.red, N(c->g, c->dc.red));
}
