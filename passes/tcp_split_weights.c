/* passes/tcp_split_weights.c: the `tcp-split-weights` pass (docs/tcp-isa.md
 * section 7, item 5): which values the TCP program binds as *packed
 * weights*, computed once when weights are loaded instead of on the device.
 *
 * A node computed from weights and constants only (at least one weight, no
 * impure op), whose value the rest of the layer or an output reads, is packed
 * unless it is a free view of one weight (a chain of reshape / broadcast,
 * which stays a device view) or a bf16 -> f32 cast of one that only widened
 * einsums read (pass_tcp_widened_einsum: the TCP contraction reads the bf16
 * weight itself), or an act=fp8 block-FP8 dequant that only einsums of few
 * rows read (fp8_act_weight: a shared expert contracted from its fp8 bytes;
 * how few, the machine's mark tcp_fp8_rows says):
 * gpt-oss's and Llama 4's fused gate_up
 * (a permuting einsum, then a strided or half slice), a transposed down, a
 * sliced bias. The pass records the choice on the graph: each packed node gets
 * `tcp_pack = k` (k = 0, 1, ... in node order). It changes no value (but the
 * sign of a zero MXFP4 weight, mxfp4_canon_at_bind), so every executor still
 * runs the graph; the TCP backend (backend-tcp/compiler/prep.c) reads
 * the marks and splits the graph into the device program, where each packed
 * node is a weight leaf, and the prep graph that computes them. GPTQ
 * dequants of expert weights in a block_loop's body are first rewritten to
 * be computed from the weights alone (gptq_loops_at_bind), so they are
 * packed too; MXFP4 values a loop reads are rewritten without the E2M1 code 8
 * (mxfp4_canon_at_bind). */
#include <string.h>

#include "ir/quant.h"
#include "passes/pass.h"

enum { C_DEV, C_CONST, C_WEIGHT };

static bool free_view(const moe_graph *g, moe_id id)
{
	for (;;) {
		const ir_node *n = N(g, id);
		if (n->op == MOE_OP_WEIGHT)
			return true;
		if (n->op != MOE_OP_RESHAPE && n->op != MOE_OP_BROADCAST)
			return false;
		id = n->args[0];
	}
}

bool pass_tcp_widened_einsum(const moe_graph *g, moe_id id)
{
	const ir_node *n = N(g, id);
	if (n->op != MOE_OP_EINSUM || n->nargs != 2 || n->dtype != MOE_F32)
		return false;
	for (uint32_t k = 0; k < 2; k++) {
		const ir_node *a = N(g, n->args[k]);
		if (a->op != MOE_OP_CAST || a->dtype != MOE_F32 || N(g, a->args[0])->dtype != MOE_BF16)
			return false;
	}
	return true;
}

bool pass_tcp_fp8_act_dequant(const moe_graph *g, moe_id id)
{
	const ir_node *n = N(g, id);
	qt_info qi;
	if (n->op != MOE_OP_DEQUANT || n->nargs != 2 || n->rank != 2 || strcmp(ir_attr_str(n, "act", "bf16"), "fp8") ||
		!ir_dequant_info(g, n, &qi) || qi.fmt != QT_FP8 || qi.bn != 128 || qi.bk != 128 || qi.N % 128 ||
		qi.K % 128)
		return false;
	for (uint32_t o = 0; o < g->nout; o++)
		if (g->outputs[o] == id)
			return false;
	return true;
}

/* An act=fp8 dequant (pass_tcp_fp8_act_dequant) that only two-operand rank-2
 * `md,nd->mn` einsums of at most tcp_fp8_rows rows read as their weight
 * (the mark the TCP target's tcp-fp8-act-rows pass writes for the machine
 * the layer is compiled for: below it the bf16 contraction of the weight is
 * bound by the weight's bytes; no mark: none): the TCP contraction
 * quantizes its activations and reads the stored fp8 bytes and block scales
 * itself (backend-tcp/compiler/recipe_qact.c), so the dequant is not packed
 * (a packed one is the bf16 copy, twice the bytes). */
static bool fp8_act_weight(const moe_graph *g, moe_id id)
{
	if (!pass_tcp_fp8_act_dequant(g, id))
		return false;
	int64_t rows = ir_attr_int(N(g, id), IR_NK_TCP_FP8_ROWS, -1);
	bool read = false;
	for (moe_id u = id + 1; u < g->nnodes; u++) {
		const ir_node *un = N(g, u);
		int batch = 0;
		for (uint32_t k = 0; k <= un->nargs; k++) {
			moe_id a = k < un->nargs ? un->args[k] : un->valid;
			if (a != id)
				continue;
			if (un->op != MOE_OP_EINSUM || k != 1 || un->nargs != 2 || un->rank != 2 ||
				N(g, un->args[0])->rank != 2 || N(g, un->args[0])->shape[0] > rows ||
				ir_node_einsum_form(un, &batch) != IR_EIN_MATMUL_NT || batch)
				return false;
			read = true;
		}
	}
	return read;
}

/* Each node's class: device, constant, or weight (weights and constants only). */
static void classify(const moe_graph *g, uint8_t *cls)
{
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (ir_ops[n->op].flags & OPF_LEAF) {
			cls[i] = n->op == MOE_OP_WEIGHT ? C_WEIGHT : (n->op == MOE_OP_CONST || n->op == MOE_OP_IOTA) ? C_CONST : C_DEV;
			continue;
		}
		uint8_t c = C_CONST;
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a == MOE_NONE)
				continue;
			if (cls[a] == C_DEV)
				c = C_DEV;
			else if (cls[a] == C_WEIGHT && c == C_CONST)
				c = C_WEIGHT;
		}
		if (ir_ops[n->op].flags & OPF_IMPURE)
			c = C_DEV;
		cls[i] = c;
	}
}

uint32_t pass_tcp_pack_plan(moe_ctx *ctx, const moe_graph *g, bool *pack)
{
	uint32_t nn = g->nnodes;
	uint8_t *cls = ctx_alloc(ctx, nn + 1);
	bool *used_dev = ctx_alloc(ctx, nn + 1);
	bool *wide_only = ctx_alloc(ctx, nn + 1); /* read only as a widened einsum's operand */
	classify(g, cls);
	for (moe_id i = 0; i < nn; i++)
		wide_only[i] = true;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		bool wide = pass_tcp_widened_einsum(g, i);
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE && !wide)
				wide_only[n->args[k]] = false;
		if (n->valid != MOE_NONE)
			wide_only[n->valid] = false;
	}
	for (uint32_t o = 0; o < g->nout; o++)
		wide_only[g->outputs[o]] = false;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		if (cls[i] == C_WEIGHT)
			continue;
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE)
				used_dev[a] = true;
		}
	}
	for (uint32_t o = 0; o < g->nout; o++)
		used_dev[g->outputs[o]] = true;
	uint32_t npack = 0;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		bool widen = n->op == MOE_OP_CAST && n->dtype == MOE_F32 && N(g, n->args[0])->dtype == MOE_BF16 &&
			     wide_only[i] && free_view(g, n->args[0]);
		pack[i] = cls[i] == C_WEIGHT && n->op != MOE_OP_WEIGHT && used_dev[i] && !free_view(g, i) && !widen &&
			  !fp8_act_weight(g, i);
		npack += pack[i];
	}
	ctx_free(ctx, wide_only, nn + 1);
	ctx_free(ctx, cls, nn + 1);
	ctx_free(ctx, used_dev, nn + 1);
	return npack;
}

/* The data input a body node reads when it is a blockarg of one, else -1. */
static int in_index(const ir_node *n)
{
	return n->op == MOE_OP_BLOCKARG && ir_blockarg_role_of(n) == IR_BA_IN ? (int)ir_attr_int(n, "index", -1) : -1;
}

/* The `e` input a body node reads when it is a blockarg of one, else -1. */
static int e_input(const char *kinds, const moe_graph *body, moe_id a)
{
	int k = in_index(N(body, a));
	return k >= 0 && k < (int)strlen(kinds) && kinds[k] == IR_BK_EXPERT ? k : -1;
}

/* A GPTQ dequant of body node d whose four operands are `e` inputs of loop l
 * that are weights (or free views of one). */
static bool gptq_of_inputs(const moe_graph *g, const ir_node *l, const moe_graph *body, moe_id d)
{
	const ir_node *n = N(body, d);
	const char *kinds = ir_attr_str(l, "kinds", "");
	if (n->op != MOE_OP_DEQUANT || strcmp(ir_attr_str(n, "format", ""), "gptq") || n->nargs != 4)
		return false;
	for (uint32_t k = 0; k < 4; k++) {
		int e = e_input(kinds, body, n->args[k]);
		if (e < 0 || !free_view(g, l->args[ir_block_loop_arg(kinds, e)]))
			return false;
	}
	return true;
}

typedef struct gloop {
	const ir_node *l;
	const moe_graph *body;
	const char *kinds;
	bool *hoist;  /* body node: a GPTQ dequant read from a new `e` input */
	bool *keep;   /* data input: read by a node that stays in the body */
	int *newk;    /* data input k, hoisted body node i at nk + i: its index in the new loop */
	int nk;       /* data inputs of the loop */
} gloop;

/* The new loop's operands and kinds: at each data input's place, first the
 * dequantized weights of the hoisted dequants whose values it is, then the
 * input itself when it is kept. deq[i]: the outer dequant of hoisted body
 * node i. */
static uint32_t gloop_operands(const rebuild *r, gloop *c, const moe_id *deq, moe_id *args, char *kinds)
{
	uint32_t na = IR_BL_NCTRL;
	int at = 0; /* the new loop's data inputs so far */
	for (uint32_t k = 0; k < IR_BL_NCTRL; k++)
		args[k] = r->map[c->l->args[k]];
	for (int k = 0; c->kinds[k]; k++) {
		for (moe_id i = 0; i < c->body->nnodes; i++)
			if (c->hoist[i] && e_input(c->kinds, c->body, N(c->body, i)->args[0]) == k) {
				c->newk[c->nk + i] = at;
				kinds[at++] = IR_BK_EXPERT;
				args[na++] = deq[i];
			}
		if (!c->keep[k])
			continue;
		c->newk[k] = at;
		kinds[at++] = c->kinds[k];
		int a = ir_block_loop_arg(c->kinds, k), w = c->kinds[k] == IR_BK_ROWS ? 2 : 1;
		for (int j = 0; j < w; j++)
			args[na++] = r->map[c->l->args[a + j]];
	}
	kinds[at] = 0;
	return na;
}

/* The new body: each hoisted dequant a blockarg of its new input, the
 * dropped inputs' blockargs gone, the kept ones renumbered. */
static void gloop_body(const gloop *c, moe_graph *nb, moe_id *bmap)
{
	const moe_graph *body = c->body;
	for (moe_id i = 0; i < body->nnodes; i++) {
		const ir_node *n = N(body, i);
		bmap[i] = MOE_NONE;
		if (c->hoist[i]) {
			bmap[i] = ir_emit(nb, MOE_OP_BLOCKARG, (moe_dtype)n->dtype, n->rank, n->shape, NULL, 0, n->loc);
			moe_node_set_str(nb, bmap[i], "role", "in");
			moe_node_set_int(nb, bmap[i], "index", c->newk[c->nk + i]);
			continue;
		}
		int k = in_index(n);
		if (k >= 0 && !c->keep[k])
			continue;
		bmap[i] = ir_copy_node(nb, body, i, bmap);
		if (k >= 0)
			moe_node_set_int(nb, bmap[i], "index", c->newk[k]);
	}
	moe_graph_add_output(nb, bmap[ir_body_yield(body)]);
}

/* Loop l of r->src, copied with each GPTQ dequant of weights' `e` inputs in
 * its body computed outside, from the weights themselves, and read by the
 * body as an `e` input; inputs read by such dequants only are dropped. */
static moe_status gptq_loop(moe_ctx *ctx, rebuild *r, moe_id l)
{
	const moe_graph *g = r->src;
	gloop c = {.l = N(g, l), .kinds = ir_attr_str(N(g, l), "kinds", "")};
	c.body = ir_node_body(g, c.l);
	uint32_t bn = c.body->nnodes, nk = (uint32_t)strlen(c.kinds);
	c.nk = (int)nk;
	c.hoist = ctx_alloc(ctx, bn + 1);
	c.keep = ctx_alloc(ctx, nk + 1);
	c.newk = ctx_alloc(ctx, ((size_t)nk + bn + 1) * sizeof *c.newk);
	moe_id *deq = ctx_alloc(ctx, ((size_t)bn + 1) * sizeof *deq);
	moe_id *bmap = ctx_alloc(ctx, ((size_t)bn + 1) * sizeof *bmap);
	moe_status st = MOE_OK;
	for (moe_id i = 0; i < bn; i++)
		c.hoist[i] = gptq_of_inputs(g, c.l, c.body, i);
	for (uint32_t k = 0; k < nk; k++)
		c.keep[k] = true;
	for (moe_id i = 0; i < bn; i++)
		for (uint32_t k = 0; c.hoist[i] && k < 4; k++)
			c.keep[e_input(c.kinds, c.body, N(c.body, i)->args[k])] = false;
	for (moe_id i = 0; i < bn; i++) {
		const ir_node *n = N(c.body, i);
		for (uint32_t k = 0; !c.hoist[i] && k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE && in_index(N(c.body, a)) >= 0)
				c.keep[in_index(N(c.body, a))] = true;
		}
	}
	for (moe_id i = 0; i < bn && st == MOE_OK; i++) {
		if (!c.hoist[i])
			continue;
		const ir_node *n = N(c.body, i);
		moe_id w[4];
		for (uint32_t k = 0; k < 4; k++)
			w[k] = r->map[c.l->args[ir_block_loop_arg(c.kinds, e_input(c.kinds, c.body, n->args[k]))]];
		deq[i] = moe_node_new(r->dst, MOE_OP_DEQUANT, w, 4, n->loc);
		for (uint32_t a = 0; a < n->nattrs; a++)
			ir_attr_set(r->dst, N(r->dst, deq[i]), &n->attrs[a]);
		st = ir_infer(ctx, r->dst, deq[i]);
	}
	if (st == MOE_OK) {
		moe_id args[IR_BL_NCTRL + 2 * IR_BODY_MAX_INPUTS];
		char kinds[2 * IR_BODY_MAX_INPUTS + 1];
		uint32_t na = gloop_operands(r, &c, deq, args, kinds), bi;
		gloop_body(&c, ir_body_new(r->dst, &bi), bmap);
		moe_id id = moe_node_new(r->dst, MOE_OP_BLOCK_LOOP, args, na, c.l->loc);
		for (uint32_t a = 0; a < c.l->nattrs; a++)
			ir_attr_set(r->dst, N(r->dst, id), &c.l->attrs[a]);
		moe_node_set_str(r->dst, id, "kinds", kinds);
		if (c.l->valid != MOE_NONE)
			moe_node_set_valid(r->dst, id, r->map[c.l->valid]);
		N(r->dst, id)->body = bi;
		st = ir_infer(ctx, r->dst, id);
		r->map[l] = id;
	}
	ctx_free(ctx, c.hoist, bn + 1);
	ctx_free(ctx, c.keep, nk + 1);
	ctx_free(ctx, c.newk, ((size_t)nk + bn + 1) * sizeof *c.newk);
	ctx_free(ctx, deq, ((size_t)bn + 1) * sizeof *deq);
	ctx_free(ctx, bmap, ((size_t)bn + 1) * sizeof *bmap);
	return st;
}

/* A block_loop whose body holds a GPTQ dequant of weights' `e` inputs. */
static bool gptq_in_loop(const moe_graph *g, moe_id l)
{
	const ir_node *n = N(g, l);
	const moe_graph *body = n->op == MOE_OP_BLOCK_LOOP ? ir_node_body(g, n) : NULL;
	for (moe_id i = 0; body && i < body->nnodes; i++)
		if (gptq_of_inputs(g, n, body, i))
			return true;
	return false;
}

/* GPTQ on TCP is dequantized when the weights are bound: g_idx maps every
 * input channel to its group, so a per-block decode would need each column's
 * scale and zero point (the expanded scales alone, f32 per weight, outweigh
 * the dequantized weight's 2 bytes in bf16) or a per-expert permutation of
 * the activation's columns, which the DMA and vector engines cannot do. Each
 * such dequant of a loop body becomes an `e` input that is the dequant of
 * the weights, computed from weights only and packed below. */
static moe_status gptq_loops_at_bind(moe_ctx *ctx, moe_graph *g)
{
	uint32_t nn = g->nnodes;
	bool any = false;
	for (moe_id i = 0; i < nn && !any; i++)
		any = gptq_in_loop(g, i);
	if (!any)
		return MOE_OK;
	rebuild r;
	rebuild_begin(&r, g);
	moe_status st = MOE_OK;
	for (moe_id i = 0; i < nn && st == MOE_OK; i++)
		if (gptq_in_loop(g, i))
			st = gptq_loop(ctx, &r, i);
		else
			rebuild_copy(&r, i);
	if (st != MOE_OK) {
		rebuild_abort(&r);
		return st;
	}
	rebuild_end(&r);
	return MOE_OK;
}

/* MXFP4 at bind: E2M1 has two zero codes, 0 (+0) and 8 (-0), whose f32
 * words are 0 and 0x80000000; the TCP recipe's integer-rate decode (an
 * exponent add on the word, zeros kept by one equality tag) is exact only
 * when one of them never occurs. Each `e` input of a block loop that the body
 * reads only as MXFP4 dequants' packed values, computed from weights only, is
 * replaced by the same bytes with code 8 made code 0 in both nibbles (the
 * same size; a -0 weight becomes +0), and those dequants get
 * `tcp_e2m1_canon = 1`. The rewrite is in the program's prep graph, so a
 * program whose decode relies on it never reads the raw bytes. */
static moe_id i32_const(moe_graph *g, int64_t v, moe_loc loc)
{
	moe_id c = ir_emit(g, MOE_OP_CONST, MOE_I32, 0, NULL, NULL, 0, loc);
	moe_node_set_int(g, c, "value", v);
	return c;
}

static moe_id op_of(moe_graph *g, moe_op op, const moe_id *x, uint32_t n, moe_loc loc)
{
	moe_id id = moe_node_new(g, op, x, n, loc);
	moe_node_infer(g, id);
	return id;
}

static moe_id bin(moe_graph *g, moe_op op, moe_id a, moe_id b, moe_loc loc)
{
	const moe_id x[2] = {a, b};
	return op_of(g, op, x, 2, loc);
}

static moe_id sel(moe_graph *g, moe_id c, moe_id a, moe_id b, moe_loc loc)
{
	const moe_id x[3] = {c, a, b};
	return op_of(g, MOE_OP_SELECT, x, 3, loc);
}

static moe_id cast(moe_graph *g, moe_id a, moe_dtype t, moe_loc loc)
{
	moe_id id = moe_node_new(g, MOE_OP_CAST, &a, 1, loc);
	moe_node_set_str(g, id, "to", moe_dtype_name(t));
	moe_node_infer(g, id);
	return id;
}

/* u8 x with each nibble 8 made 0 (on the bytes' values as i32) */
static moe_id e2m1_canon(moe_graph *g, moe_id x8, moe_loc loc)
{
	moe_id x = cast(g, x8, MOE_I32, loc);
	moe_id lo = bin(g, MOE_OP_AND, x, i32_const(g, 0x0f, loc), loc);
	moe_id hi = bin(g, MOE_OP_AND, x, i32_const(g, 0xf0, loc), loc);
	moe_id x1 = sel(g, bin(g, MOE_OP_EQ, lo, i32_const(g, 0x08, loc), loc), hi, x, loc);
	moe_id lo1 = bin(g, MOE_OP_AND, x1, i32_const(g, 0x0f, loc), loc);
	return cast(g, sel(g, bin(g, MOE_OP_EQ, hi, i32_const(g, 0x80, loc), loc), lo1, x1, loc), MOE_U8, loc);
}

/* Whether body input k of loop l is read, and read only, as the packed
 * values of MXFP4 dequants not yet marked; mark: set tcp_e2m1_canon on them. */
static bool e2m1_only(const moe_graph *g, const ir_node *l, int k, bool mark)
{
	moe_graph *body = ir_node_body(g, l);
	bool any = false;
	for (moe_id i = 0; i < body->nnodes; i++) {
		const ir_node *n = N(body, i);
		for (uint32_t a = 0; a <= n->nargs; a++) {
			moe_id v = a < n->nargs ? n->args[a] : n->valid;
			if (v == MOE_NONE || in_index(N(body, v)) != k)
				continue;
			if (a || n->op != MOE_OP_DEQUANT || strcmp(ir_attr_str(n, "format", ""), "mxfp4") ||
			    (!mark && ir_attr_int(n, "tcp_e2m1_canon", 0) == 1)) /* rewritten by an earlier run */
				return false;
			any = true;
			if (mark)
				moe_node_set_int(body, i, "tcp_e2m1_canon", 1);
		}
	}
	for (uint32_t o = 0; o < body->nout; o++)
		if (in_index(N(body, body->outputs[o])) == k)
			return false;
	return any;
}

/* The scales of the MXFP4 dequants that read body input k of loop l: one
 * `e` operand of l that is a weight leaf, else MOE_NONE (different ones, or
 * one computed). The canonical bytes are named after it (MOE_TCP_E8M0_NAME
 * and its name, kept by the prep graph), so that binding checks the scales
 * the integer decode meets (backend-tcp/sim/pack.c). */
static moe_id e8m0_scales(const moe_graph *g, const ir_node *l, int k)
{
	moe_graph *body = ir_node_body(g, l);
	const char *kinds = ir_attr_str(l, "kinds", "");
	moe_id w = MOE_NONE;
	for (moe_id i = 0; i < body->nnodes; i++) {
		const ir_node *n = N(body, i);
		if (n->op != MOE_OP_DEQUANT || n->nargs < 2 || in_index(N(body, n->args[0])) != k)
			continue;
		int ks = e_input(kinds, body, n->args[1]);
		moe_id s = ks >= 0 ? l->args[ir_block_loop_arg(kinds, ks)] : MOE_NONE;
		if (s == MOE_NONE || N(g, s)->op != MOE_OP_WEIGHT || !N(g, s)->name || (w != MOE_NONE && w != s))
			return MOE_NONE;
		w = s;
	}
	return w;
}

static moe_status mxfp4_canon_at_bind(moe_ctx *ctx, moe_graph *g)
{
	uint32_t nn = g->nnodes;
	uint8_t *cls = ctx_alloc(ctx, nn + 1);
	moe_id *canon = ctx_alloc(ctx, (nn + 1) * sizeof *canon); /* one per value: a value read twice is fetched once */
	classify(g, cls);
	for (moe_id i = 0; i < nn; i++)
		canon[i] = MOE_NONE;
	bool any = false;
	for (moe_id i = 0; i < nn; i++) {
		int nk = N(g, i)->op == MOE_OP_BLOCK_LOOP ? (int)strlen(ir_attr_str(N(g, i), "kinds", "")) : 0;
		for (int k = 0; k < nk; k++) {
			const ir_node *l = N(g, i); /* again: the canonical bytes' nodes are appended */
			const char *kinds = ir_attr_str(l, "kinds", "");
			int a = ir_block_loop_arg(kinds, k);
			moe_id x = kinds[k] == IR_BK_EXPERT ? l->args[a] : MOE_NONE;
			if (x == MOE_NONE || cls[x] != C_WEIGHT || N(g, x)->dtype != MOE_U8 || !e2m1_only(g, l, k, false))
				continue;
			moe_id sw = e8m0_scales(g, l, k);
			const char *sn = sw != MOE_NONE ? N(g, sw)->name : NULL;
			char name[200];
			snprintf(name, sizeof name, "%s%s", MOE_TCP_E8M0_NAME, sn ? sn : "");
			if (!sn || strlen(sn) > 160 || (canon[x] != MOE_NONE && strcmp(N(g, canon[x])->name, name)))
				continue; /* scales binding cannot check: the float-rate decode */
			e2m1_only(g, l, k, true);
			if (canon[x] == MOE_NONE) {
				canon[x] = e2m1_canon(g, x, l->loc);
				moe_node_set_name(g, canon[x], name);
			}
			moe_node_set_arg(g, i, (uint32_t)a, canon[x]);
			any = true;
		}
	}
	ctx_free(ctx, cls, nn + 1);
	ctx_free(ctx, canon, (nn + 1) * sizeof *canon);
	return any ? moe_graph_compact(ctx, g, NULL) : MOE_OK;
}

PASS(pass_tcp_split_weights)
{
	(void)opts;
	(void)ud;
	moe_status st = gptq_loops_at_bind(ctx, g);
	if (st == MOE_OK)
		st = mxfp4_canon_at_bind(ctx, g);
	if (st != MOE_OK)
		return st;
	uint32_t nn = g->nnodes;
	bool *pack = ctx_alloc(ctx, nn + 1);
	pass_tcp_pack_plan(ctx, g, pack);
	int64_t k = 0;
	for (moe_id i = 0; i < nn; i++)
		if (pack[i])
			moe_node_set_int(g, i, IR_NK_TCP_PACK, k++);
		else if (ir_attr_find(N(g, i), IR_NK_TCP_PACK))
			moe_node_set_int(g, i, IR_NK_TCP_PACK, -1); /* a mark of an earlier run that no longer holds */
	ctx_free(ctx, pack, nn + 1);
	return MOE_OK;
}
