/* backend-tcp/plan_fusion.c: the `tcp-plan-fusion` pass, a pass of the TCP
 * target (registered by moe_tcp_register_passes, since passes/ sits below
 * backend-tcp and the rule needs the block region and the machine), and the
 * lowering's reader of its marks.
 *
 * The pass computes the fusion plan exactly as the lowering would, on the
 * graph the lowering sees (the device graph of the weight-packing split, the
 * block region found), by the rule of lower_fuse.c, and records it on the
 * nodes (ir/graph_keys.h: tcp_fuse, tcp_view, tcp_hbm, tcp_ggrid) plus the
 * graph attribute tcp_fusion_plan, the fingerprint of the machine facts the
 * rule read. It changes no value. The lowering takes the plan from the marks
 * when the fingerprint is its machine's, and applies the rule itself
 * otherwise (a graph from a pipeline without the pass), so both give the same
 * program. Not planned (no marks): a block-FP8 layer whose gate and up are
 * fetched as one pair, which the lowering rewrites first (quant_pack.c). */
#include "backend-tcp/compiler/legacy/lower_int.h"
#include "moec/tcp.h"
#include "passes/pass.h"

/* The machine facts tcpl_fusion_rule reads: the size from which a gather
 * stays in HBM, and the float ALUs a vector pass can chain on. */
static int64_t fingerprint(const moe_tcp_machine *m)
{
	return (m->dm_bytes_per_slice / 8 * tcp_slices(m)) * 32 + (m->float_alus & 31) + 1;
}

static bool is_reduce(const ir_node *n)
{
	return n->op == MOE_OP_REDUCE_SUM || n->op == MOE_OP_REDUCE_MAX || n->op == MOE_OP_REDUCE_MIN;
}

/* A group member (not its last node): elementwise or a reshape, read once, by
 * a node of its group. */
static bool member_ok(const moe_graph *g, moe_id i, int64_t k)
{
	const ir_node *n = N(g, i);
	if (!(ir_ops[n->op].flags & OPF_ELEM) && n->op != MOE_OP_RESHAPE)
		return false;
	uint32_t uses = 0;
	bool in_group = true;
	for (moe_id u = i + 1; u < g->nnodes; u++) {
		const ir_node *un = N(g, u);
		for (uint32_t a = 0; a <= un->nargs; a++)
			if ((a < un->nargs ? un->args[a] : un->valid) == i) {
				uses++;
				in_group &= ir_attr_int(un, IR_NK_TCP_FUSE, -1) == k;
			}
	}
	for (uint32_t o = 0; o < g->nout; o++)
		uses += 2 * (g->outputs[o] == i);
	return uses == 1 && in_group;
}

/* Is tcp_fuse = k on node i a group of this graph? */
static bool group_ok(const moe_graph *g, moe_id i, int64_t k, const moe_id *root)
{
	const ir_node *n = N(g, i);
	if (k < 0)
		return true;
	if (k >= (int64_t)g->nnodes || root[k] == MOE_NONE || (ir_ops[n->op].flags & OPF_LEAF))
		return false;
	if (root[k] == i)
		return (ir_ops[n->op].flags & OPF_ELEM) || is_reduce(n);
	return member_ok(g, i, k);
}

/* A mark on a node that cannot take it: false with a diagnostic. */
static bool marks_ok(lw *c, const moe_id *root)
{
	const moe_graph *g = c->g;
	for (moe_id i = 0; i < g->nnodes && !c->failed; i++) {
		const ir_node *n = N(g, i);
		int64_t k = ir_attr_int(n, IR_NK_TCP_FUSE, -1);
		if (!group_ok(g, i, k, root))
			tcpl_err(c, i, "%s=%lld: not a fusion group of this graph (one vector pass: elementwise nodes, each read "
				"once, by the group)", IR_NK_TCP_FUSE, (long long)k);
		else if (ir_attr_int(n, IR_NK_TCP_VIEW, 0) > 0 && n->op != MOE_OP_CAST && n->op != MOE_OP_BITCAST)
			tcpl_err(c, i, "%s marks a cast or a bitcast only", IR_NK_TCP_VIEW);
		else if (ir_attr_int(n, IR_NK_TCP_VIEW, 0) > 0 && n->op == MOE_OP_CAST && n->dtype == MOE_BF16 &&
			 (N(g, n->args[0])->dtype != MOE_F32 || !is_reduce(N(g, n->args[0]))))
			tcpl_err(c, i, "%s on a cast to bf16 marks a cast of an f32 reduce only", IR_NK_TCP_VIEW);
		else if (ir_attr_int(n, IR_NK_TCP_HBM, 0) > 0 && n->op != MOE_OP_GATHER)
			tcpl_err(c, i, "%s marks a gather only", IR_NK_TCP_HBM);
		else if (ir_attr_int(n, IR_NK_TCP_GGRID, 0) > 0 &&
			 (n->op != MOE_OP_SCATTER || n->nargs < 3 || N(g, n->args[2])->op != MOE_OP_GATHER))
			tcpl_err(c, i, "%s marks a scatter of a gather only", IR_NK_TCP_GGRID);
	}
	return !c->failed;
}

/* The plan from the marks (c's region found); false when g carries none for c's machine. */
static bool read_marks(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	if (ir_graph_attr_int(g, IR_GK_TCP_FUSION_PLAN, 0) != fingerprint(c->m))
		return false;
	moe_id *root = ctx_alloc(c->ctx, (nn + 1) * sizeof *root);
	for (moe_id i = 0; i < nn; i++)
		root[i] = MOE_NONE;
	for (moe_id i = 0; i < nn; i++) {
		int64_t k = ir_attr_int(N(g, i), IR_NK_TCP_FUSE, -1);
		if (k >= 0 && k < (int64_t)nn)
			root[k] = i; /* the group's last node */
	}
	if (marks_ok(c, root))
		for (moe_id i = 0; i < nn; i++) {
			const ir_node *n = N(g, i);
			int64_t k = ir_attr_int(n, IR_NK_TCP_FUSE, -1);
			c->fused_into[i] = k >= 0 && root[k] != i ? root[k] : MOE_NONE;
			bool view = ir_attr_int(n, IR_NK_TCP_VIEW, 0) > 0;
			c->alias_cast[i] |= view;
			if (view && n->op == MOE_OP_CAST && n->dtype == MOE_BF16)
				c->store_dt[n->args[0]] = MOE_BF16; /* the reduce's pass commits the cast's bf16 */
			c->hbm_home[i] |= ir_attr_int(n, IR_NK_TCP_HBM, 0) > 0;
			if (ir_attr_int(n, IR_NK_TCP_GGRID, 0) <= 0)
				continue;
			tcpl_mark_ggrid(c, i);
		}
	ctx_free(c->ctx, root, (nn + 1) * sizeof *root);
	return true;
}

void tcpl_plan_fusions(lw *c)
{
	if (!read_marks(c))
		tcpl_fusion_rule(c);
}

/* Sets key on node i to v, or back to none where an earlier run left it. */
static void set_mark(moe_graph *g, moe_id i, const char *key, int64_t v, int64_t none)
{
	if (v != none || ir_attr_find(N(g, i), key))
		moe_node_set_int(g, i, key, v);
}

/* The plan of c (on the device graph, dev_of: g's ids there) as marks on g. */
static void write_marks(moe_graph *g, const lw *c, const moe_id *dev_of, const bool *hbm0)
{
	uint32_t nd = c->g->nnodes;
	int64_t *gid = ctx_alloc(c->ctx, (nd + 1) * sizeof *gid);
	for (moe_id d = 0; d < nd; d++)
		gid[d] = -1;
	for (moe_id d = 0; d < nd; d++)
		if (c->fused_into[d] != MOE_NONE)
			gid[c->fused_into[d]] = 0;
	int64_t k = 0;
	for (moe_id d = 0; d < nd; d++)
		if (gid[d] == 0)
			gid[d] = ++k; /* roots in node order, from 1 (0: a root not numbered yet) */
	for (moe_id i = 0; i < g->nnodes; i++) {
		moe_id d = dev_of[i];
		bool in = d != MOE_NONE;
		int64_t grp = !in ? -1 : c->fused_into[d] != MOE_NONE ? gid[c->fused_into[d]] - 1 : gid[d] > 0 ? gid[d] - 1 : -1;
		set_mark(g, i, IR_NK_TCP_FUSE, grp, -1);
		set_mark(g, i, IR_NK_TCP_VIEW, in && c->alias_cast[d], 0);
		set_mark(g, i, IR_NK_TCP_HBM, in && c->hbm_home[d] && !hbm0[d], 0);
		set_mark(g, i, IR_NK_TCP_GGRID, in && c->ggrid[d] == d + 1, 0);
	}
	ir_graph_set_attr_int(g, IR_GK_TCP_FUSION_PLAN, fingerprint(c->m));
	ctx_free(c->ctx, gid, (nd + 1) * sizeof *gid);
}

/* No plan on g (marks of an earlier run set back to none): the lowering applies the rule. */
static void clear_marks(moe_graph *g)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		set_mark(g, i, IR_NK_TCP_FUSE, -1, -1);
		set_mark(g, i, IR_NK_TCP_VIEW, 0, 0);
		set_mark(g, i, IR_NK_TCP_HBM, 0, 0);
		set_mark(g, i, IR_NK_TCP_GGRID, 0, 0);
	}
	if (ir_graph_attr_int(g, IR_GK_TCP_FUSION_PLAN, 0))
		ir_graph_set_attr_int(g, IR_GK_TCP_FUSION_PLAN, 0);
}

/* The rule on d (g itself, or its device graph), marks written on g. */
static moe_status plan_on(moe_ctx *ctx, moe_graph *g, const moe_graph *d, const moe_id *dev_of,
	const moe_tcp_machine *m)
{
	lw c;
	tcpl_init(&c, ctx, d, m);
	for (uint32_t o = 0; o < d->nout; o++)
		c.is_out[d->outputs[o]] = true;
	tcpl_find_region(&c);
	bool *hbm0 = ctx_alloc(ctx, d->nnodes + 1); /* HBM homes the region chose, not the plan */
	memcpy(hbm0, c.hbm_home, d->nnodes);
	if (!c.failed) {
		tcpl_fusion_rule(&c);
		write_marks(g, &c, dev_of, hbm0);
	}
	bool failed = c.failed;
	ctx_free(ctx, hbm0, d->nnodes + 1);
	tcp_prog_free(c.p);
	tcpl_fini(&c);
	return failed ? MOE_ERR_INVALID : MOE_OK;
}

static PASS(pass_tcp_plan_fusion)
{
	(void)opts;
	(void)ud;
	/* a block-FP8 layer whose gate and up the lowering fetches as one pair
	 * (quant_pack.c) is lowered from a rewritten graph: not planned here */
	moe_graph *gu = tcp_pack_gate_up(ctx, g);
	if (gu) {
		ir_graph_free(gu);
		clear_marks(g);
		return MOE_OK;
	}
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	if (!m)
		return MOE_ERR_INTERNAL;
	uint32_t nn = g->nnodes;
	moe_id *dev_of = ctx_alloc(ctx, (nn + 1) * sizeof *dev_of);
	for (moe_id i = 0; i < nn; i++)
		dev_of[i] = i;
	char *prep = NULL;
	size_t plen = 0;
	int errs = moe_error_count(ctx);
	moe_graph *dev = tcp_split_weights(ctx, g, &prep, &plen, dev_of);
	if (prep)
		ctx_free(ctx, prep, plen + 1);
	moe_status s = moe_error_count(ctx) != errs ? MOE_ERR_INVALID : plan_on(ctx, g, dev ? dev : g, dev_of, m);
	if (dev)
		ir_graph_free(dev);
	ctx_free(ctx, dev_of, (nn + 1) * sizeof *dev_of);
	moe_tcp_machine_free(ctx, m);
	return s;
}

static const moe_pass_info plan_fusion_info = {"tcp-plan-fusion",
	"record the TCP lowering's fusions (vector-pass chains, cast views, gathers kept in HBM, dispatch by gather) "
	"as marks (tcp target)",
	NULL, pass_tcp_plan_fusion, NULL};

moe_status moe_tcp_register_passes(moe_ctx *ctx)
{
	/* The TCP target's node attributes (docs/ir.md "Target attributes"). */
	static const ir_target_attr attrs[] = {
		{"tcp_pack", IR_AT_INT, -1, 0, "k >= 0: the k-th value bound as a packed weight (tcp-split-weights)"},
		{"tcp_fuse", IR_AT_INT, -1, 0, "k >= 0: a node of fusion group k (tcp-plan-fusion)"},
		{"tcp_view", IR_AT_INT, 0, 0, "1: a cast or bitcast lowered as a view of its operand (tcp-plan-fusion)"},
		{"tcp_hbm", IR_AT_INT, 0, 0, "1: a gather read only by scatters, kept in HBM (tcp-plan-fusion)"},
		{"tcp_ggrid", IR_AT_INT, 0, 0, "1: a dispatch scatter lowered as a gather by block (tcp-plan-fusion)"},
		{"tcp_packed", IR_AT_INT, -1, OPF_LEAF, "k >= 0: a weight the program binds as packed weight k"},
		{NULL, IR_AT_INT, 0, 0, NULL},
	};
	moe_status st = ir_target_attrs_registered(ctx, "tcp") ? MOE_OK : ir_target_attrs_register(ctx, "tcp", attrs);
	if (st != MOE_OK)
		return st;
	if (moe_pass_find(ctx, plan_fusion_info.name))
		return MOE_OK;
	return moe_pass_register(ctx, &plan_fusion_info);
}
