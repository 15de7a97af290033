/* backend-tcp/compiler/sched_build.c: sched-build (docs/tcp-compiler.md 5.1).
 * One walk of the graph in node order: leaves become HBM buffers, immediates
 * or iotas, every other node is built by the recipe of its family
 * (recipe_*.c) into ops of the current region, the block_loop into a ts_loop
 * (recipe_loop.c). Each op depends on every earlier op whose access of one of
 * its buffers conflicts (read after write, write after read or write), so the
 * dependencies cover every hazard. Before the loop the phase is routing, in it
 * expert, after it combine. */
#include <stdarg.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/sched_build_int.h"

void sb_err(sb *b, moe_id at, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!b->failed)
		moe_diag(b->ctx, MOE_DIAG_ERROR, at == MOE_NONE ? b->g->loc : SBN(b, at)->loc, "tcp: %s", msg);
	b->failed = true;
}

void sb_refuse(sb *b, moe_id at, const char *what)
{
	sb_err(b, at, "the schedule compiler does not lower %s yet", what);
}

static int64_t rup(int64_t x, int64_t a)
{
	return (x + a - 1) / a * a;
}

/* A DM buffer spread in one copy over every slice, flit by flit (the
 * layout of docs/tcp-isa.md 7.1), every slot. */
void sb_spread(sb *b, ts_id id)
{
	ts_buf *t = &b->s->buf[id];
	int64_t n = 1;
	for (int k = 0; k < t->rank; k++)
		n *= t->shape[k];
	int64_t bytes = n * (int64_t)moe_dtype_size((moe_dtype)t->dtype) * t->slots;
	t->layout.slice0 = 0;
	t->layout.nslices = (uint16_t)b->S;
	t->layout.copies = 1;
	t->layout.split = TS_SPLIT_FLIT;
	t->layout.slice_bytes = rup((bytes + b->S - 1) / b->S, b->m->flit_bytes);
	if (t->layout.slice_bytes == 0)
		t->layout.slice_bytes = b->m->flit_bytes;
}

ts_id sb_dm_buf(sb *b, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape)
{
	const int64_t one = 1;
	ts_id id = ts_add_buf(b->s, name, TCP_DM, TCP_T_SCRATCH, dt, rank ? rank : 1, rank ? shape : &one);
	b->s->buf[id].node = at;
	sb_spread(b, id);
	return id;
}

ts_id sb_hbm_buf(sb *b, moe_id at, const char *name, int kind, moe_dtype dt, int rank, const int64_t *shape)
{
	const int64_t one = 1;
	ts_id id = ts_add_buf(b->s, name, TCP_HBM, kind, dt, rank ? rank : 1, rank ? shape : &one);
	b->s->buf[id].node = at;
	return id;
}

/* ---- dependencies ---- */
static sb_track *track(sb *b, ts_id buf)
{
	if (buf >= b->ntr) {
		uint32_t n = b->s->nbuf > buf + 1 ? b->s->nbuf : buf + 1;
		n = n < 2 * b->ntr ? 2 * b->ntr : n;
		sb_track *t = ctx_alloc(b->ctx, n * sizeof *t);
		if (b->ntr)
			memcpy(t, b->tr, b->ntr * sizeof *t);
		for (uint32_t k = b->ntr; k < n; k++)
			t[k] = (sb_track){TS_NONE, NULL, 0, 0};
		ctx_free(b->ctx, b->tr, b->ntr * sizeof *b->tr);
		b->tr = t;
		b->ntr = n;
	}
	return &b->tr[buf];
}

static void dep(sb *b, ts_id op, ts_id on)
{
	if (on == TS_NONE || on == op)
		return;
	const ts_op *o = &b->s->op[op];
	for (uint32_t k = 0; k < o->ndep; k++)
		if (o->dep[k] == on)
			return;
	ts_add_dep(b->s, op, on, 0);
}

/* the buffers an instruction reads (views other than dst; a contraction's s2
 * only when it accumulates or reads its scales) */
static int reads_of(const tcp_insn *in, ts_id *out)
{
	int n = 0;
	for (int w = TCP_V_S0; w <= TCP_V_S2; w++) {
		if (in->v[w].t < 0)
			continue;
		if (in->op == TCP_OP_TU_CONTRACT && w == TCP_V_S2 && !(in->flags & (TCP_F_ACC | TCP_F_SCALED)))
			continue;
		out[n++] = (ts_id)in->v[w].t;
	}
	return n;
}

ts_id sb_emit(sb *b, const tcp_insn *in, moe_id at)
{
	ts_id op = ts_add_op(b->s, b->rg, in, b->phase);
	b->s->op[op].node = at;
	ts_id rd[3];
	int nr = reads_of(in, rd);
	for (int k = 0; k < nr; k++)
		dep(b, op, track(b, rd[k])->w);
	if (in->v[TCP_V_DST].t >= 0) {
		sb_track *t = track(b, (ts_id)in->v[TCP_V_DST].t);
		dep(b, op, t->w);
		for (uint32_t k = 0; k < t->nrd; k++)
			dep(b, op, t->rd[k]);
	}
	for (int k = 0; k < nr; k++) {
		sb_track *t = track(b, rd[k]);
		if (t->nrd && t->rd[t->nrd - 1] == op)
			continue;
		ctx_grow(b->ctx, (void **)&t->rd, &t->crd, t->nrd + 1, sizeof *t->rd);
		t->rd[t->nrd++] = op;
	}
	if (in->v[TCP_V_DST].t >= 0) {
		sb_track *t = track(b, (ts_id)in->v[TCP_V_DST].t);
		t->w = op;
		t->nrd = 0;
	}
	return op;
}

/* ---- values ---- */
sb_val sb_view_of(ts_id buf, const ir_node *n)
{
	sb_val v;
	memset(&v, 0, sizeof v);
	v.kind = SV_VIEW;
	v.buf = buf;
	v.reg = TS_NONE;
	int64_t st = 1;
	for (int k = n->rank - 1; k >= 0; k--) {
		v.stride[k] = st;
		st *= n->shape[k];
	}
	return v;
}

bool sb_contig(const sb_val *v, const ir_node *n)
{
	int64_t st = 1;
	for (int k = n->rank - 1; k >= 0; k--) {
		if (n->shape[k] > 1 && v->stride[k] != st)
			return false;
		st *= n->shape[k];
	}
	return v->kind == SV_VIEW;
}

tcp_view sb_view_at(const sb_val *v, int64_t base, int nd, const int64_t *st)
{
	tcp_view tv = tcp_view_none();
	tv.t = (int32_t)v->buf;
	tv.base = v->base + base;
	if (v->reg != TS_NONE) {
		tv.reg = (int32_t)v->reg;
		tv.scale = v->scale;
	}
	for (int k = 0; k < nd; k++)
		tv.stride[k] = st[k];
	return tv;
}

tcp_view sb_mkview(const sb_val *v, const ir_node *n, int ndim, const int *map)
{
	tcp_view tv = sb_view_at(v, 0, 0, NULL);
	for (int k = 0; k < ndim; k++)
		tv.stride[k] = map[k] >= 0 && n->shape[map[k]] > 1 ? v->stride[map[k]] : 0;
	return tv;
}

int sb_axis(const ir_node *n, const ir_node *src, int64_t def)
{
	return ir_norm_axis((int)ir_attr_int(n, "axis", def), src->rank);
}

uint32_t sb_imm_of(moe_dtype dt, double v)
{
	if (moe_dtype_is_float(dt)) {
		float f = (float)v;
		if (dt == MOE_BF16)
			f = moe_bf16_to_f32(moe_f32_to_bf16(f));
		uint32_t u;
		memcpy(&u, &f, 4);
		return u;
	}
	return (uint32_t)(int32_t)v;
}

sb_val *sb_out_val(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	ts_id t = sb_dm_buf(b, id, n->name ? n->name : moe_op_name((moe_op)n->op), (moe_dtype)n->dtype, n->rank, n->shape);
	b->v[id] = sb_view_of(t, n);
	return &b->v[id];
}

sb_val *sb_dm_val(sb *b, moe_id id)
{
	if (b->failed)
		return NULL;
	sb_val *v = &b->v[id];
	if (v->kind == SV_IMM || v->kind == SV_IOTA) {
		sb_materialize(b, id);
		return b->failed ? NULL : v;
	}
	if (v->kind != SV_VIEW) { /* a block's row count (a scalar register) */
		sb_refuse(b, id, "the block's row count read as a tensor");
		return NULL;
	}
	if (b->s->buf[v->buf].space == TCP_DM)
		return v;
	if (b->dmv[id].kind == SV_VIEW)
		return &b->dmv[id];
	/* an HBM value: one copy into a contiguous DM buffer */
	const ir_node *n = SBN(b, id);
	ts_id t = sb_dm_buf(b, id, n->name ? n->name : "copy", (moe_dtype)n->dtype, n->rank, n->shape);
	sb_val d = sb_view_of(t, n);
	int map[TCP_MAXD], nd = n->rank ? n->rank : 1;
	int64_t dim[TCP_MAXD];
	for (int k = 0; k < nd; k++) {
		map[k] = n->rank ? k : -1;
		dim[k] = n->rank ? n->shape[k] : 1;
	}
	if (nd > TCP_MAXD) {
		sb_refuse(b, id, "a copy of more than 8 dimensions");
		return NULL;
	}
	tcp_insn in = tcp_b_dma_copy(nd, dim, sb_mkview(&d, n, nd, map), sb_mkview(v, n, nd, map));
	sb_emit(b, &in, id);
	b->dmv[id] = d;
	return &b->dmv[id];
}

/* ---- the walk ---- */
static void leaf(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	sb_val *v = &b->v[id];
	switch ((moe_op)n->op) {
	case MOE_OP_CONST:
		if (ir_attr_ints(n, "value", &(const int64_t *){NULL}) > 1) {
			sb_refuse(b, id, "a constant that is not one value");
			return;
		}
		v->kind = SV_IMM;
		v->imm = sb_imm_of((moe_dtype)n->dtype, ir_attr_float(n, "value", (double)ir_attr_int(n, "value", 0)));
		return;
	case MOE_OP_IOTA:
		v->kind = SV_IOTA;
		v->axis = sb_axis(n, n, 0);
		return;
	case MOE_OP_INPUT:
	case MOE_OP_WEIGHT: {
		/* a packed weight (the device graph's leaf k of a tcp_pack mark,
		 * prep.c) is bound by the program's prep graph, not by a source;
		 * leaves are built in node order, so the packed buffers are in
		 * the order of k, the order the prep graph's outputs bind them */
		bool w = n->op == MOE_OP_WEIGHT, packed = w && ir_attr_int(n, "tcp_packed", -1) >= 0;
		ts_id t = sb_hbm_buf(b, id, n->name ? n->name : "", packed ? TCP_T_PACKED : w ? TCP_T_WEIGHT : TCP_T_INPUT,
			(moe_dtype)n->dtype, n->rank, n->shape);
		if (w && !packed) {
			char *src = tcp_resolve_source(b->ctx, b->g, ir_attr_str(n, "source", ""));
			ts_set_source(b->s, t, src);
			ctx_free(b->ctx, src, strlen(src) + 1);
		}
		if (!w && n->rank == 0)
			b->s->buf[t].rank = 0; /* a scalar input (n_tokens) binds as the host's rank-0 tensor */
		*v = sb_view_of(t, n);
		return;
	}
	case MOE_OP_BLOCKARG:
		return; /* set by the loop (recipe_loop.c) */
	default: sb_refuse(b, id, moe_op_name((moe_op)n->op)); return;
	}
}

static void node(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id);
	if (ir_ops[n->op].flags & OPF_LEAF) {
		leaf(b, id);
		return;
	}
	if (sb_qact_skip(b, id)) /* recipe_qact.c */
		return;
	switch ((moe_op)n->op) {
	case MOE_OP_NEG: case MOE_OP_ABS: case MOE_OP_EXP: case MOE_OP_LOG: case MOE_OP_SQRT:
	case MOE_OP_RSQRT: case MOE_OP_TANH: case MOE_OP_ERF: case MOE_OP_SIGMOID: case MOE_OP_NOT:
	case MOE_OP_ADD: case MOE_OP_SUB: case MOE_OP_MUL: case MOE_OP_DIV: case MOE_OP_MIN:
	case MOE_OP_MAX: case MOE_OP_AND: case MOE_OP_OR: case MOE_OP_XOR: case MOE_OP_SHL:
	case MOE_OP_SHR: case MOE_OP_SAR: case MOE_OP_EQ: case MOE_OP_NE: case MOE_OP_LT:
	case MOE_OP_LE: case MOE_OP_GT: case MOE_OP_GE: case MOE_OP_SELECT: case MOE_OP_CAST:
	case MOE_OP_BITCAST: sb_elem(b, id); return;
	case MOE_OP_RESHAPE:
	case MOE_OP_SLICE:
	case MOE_OP_BROADCAST: sb_view_op(b, id); return;
	case MOE_OP_REDUCE_SUM:
	case MOE_OP_REDUCE_MAX:
	case MOE_OP_REDUCE_MIN: sb_reduce(b, id); return;
	case MOE_OP_CUMSUM: sb_cumsum(b, id); return;
	case MOE_OP_CONCAT: sb_concat(b, id); return;
	case MOE_OP_SOFTMAX: sb_softmax(b, id); return;
	case MOE_OP_ONE_HOT: sb_one_hot(b, id); return;
	case MOE_OP_FILTER: sb_filter(b, id); return;
	case MOE_OP_EINSUM: sb_einsum(b, id); return;
	case MOE_OP_DEQUANT: sb_dequant(b, id); return;
	case MOE_OP_GATHER: sb_gather(b, id); return;
	case MOE_OP_TAKE_ALONG: sb_take_along(b, id); return;
	case MOE_OP_SCATTER: sb_scatter(b, id); return;
	case MOE_OP_BLOCK_LOOP:
		if (b->g->is_body) {
			sb_refuse(b, id, "a block_loop inside a body");
			return;
		}
		sb_block_loop(b, id);
		b->phase = TS_PH_COMBINE;
		return;
	default: sb_refuse(b, id, moe_op_name((moe_op)n->op)); return;
	}
}

void sb_build_nodes(sb *b)
{
	for (moe_id id = 0; id < b->g->nnodes && !b->failed; id++) {
		node(b, id);
		sb_spill_value(b, id);
	}
}

/* Each output copied from its value into an HBM output buffer. */
static void outputs(sb *b)
{
	const moe_graph *g = b->g;
	for (uint32_t k = 0; k < g->nout && !b->failed; k++) {
		moe_id id = g->outputs[k];
		const ir_node *n = SBN(b, id);
		sb_val *v = b->v[id].kind == SV_VIEW ? &b->v[id] : sb_dm_val(b, id); /* a copy from either space */
		if (!v)
			return;
		ts_id t = sb_hbm_buf(b, id, n->name ? n->name : "y", TCP_T_OUTPUT, (moe_dtype)n->dtype, n->rank, n->shape);
		sb_val o = sb_view_of(t, n);
		int nd = n->rank ? n->rank : 1, map[TCP_MAXD];
		int64_t dim[TCP_MAXD];
		for (int d = 0; d < nd; d++) {
			map[d] = n->rank ? d : -1;
			dim[d] = n->rank ? n->shape[d] : 1;
		}
		tcp_insn in = tcp_b_dma_copy(nd, dim, sb_mkview(&o, n, nd, map), sb_mkview(v, n, nd, map));
		sb_emit(b, &in, id);
	}
}

static void meta(tcp_sched *s, const moe_graph *g)
{
	ts_meta *m = &s->meta;
	m->T = ir_graph_attr_int(g, "moe_tokens", 0);
	m->K = ir_graph_attr_int(g, "moe_k", 0);
	m->E = ir_graph_attr_int(g, "moe_experts", 0);
	m->B = ir_graph_attr_int(g, "moe_block", 0);
	m->G = ir_graph_attr_int(g, "grid_blocks", 0);
	m->D = ir_graph_attr_int(g, "moe_row_bytes", 0) / (int64_t)moe_dtype_size(g->dtype);
	m->dtype = (uint8_t)g->dtype;
}

/* Program positions of ops, in region order (a loop: prologue, body, epilogue). */
static void positions(const tcp_sched *s, ts_id r, int64_t *pos, int64_t *at, int depth)
{
	if (r >= s->nrg || depth > 64)
		return;
	const ts_region *g = &s->rg[r];
	if (g->kind == TS_RG_LOOP && g->loop < (uint32_t)s->nloop) {
		const ts_loop *l = &s->loop[g->loop];
		positions(s, l->prologue, pos, at, depth + 1);
		positions(s, l->body, pos, at, depth + 1);
		positions(s, l->epilogue, pos, at, depth + 1);
	}
	for (uint32_t k = 0; k < g->nitem; k++) {
		uint32_t it = g->item[k];
		if (TS_ITEM_KIND(it) == TS_ITEM_RG)
			positions(s, TS_ITEM_ID(it), pos, at, depth + 1);
		else if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			pos[TS_ITEM_ID(it)] = (*at)++;
	}
}

/* Each on-chip scratch buffer that lives the whole program (the default)
 * and that no `ld` reads lives from the first op touching it to the last
 * (a span), so the DM planner may give its bytes to another buffer outside
 * that span. */
static void spans(sb *b)
{
	tcp_sched *s = b->s;
	int64_t *pos = ctx_alloc(b->ctx, (s->nop + 1) * sizeof *pos), at = 0;
	ts_id *lo = ctx_alloc(b->ctx, (s->nbuf + 1) * sizeof *lo), *hi = ctx_alloc(b->ctx, (s->nbuf + 1) * sizeof *hi);
	bool *ld = ctx_alloc(b->ctx, s->nbuf + 1);
	positions(s, s->top, pos, &at, 0);
	for (ts_id i = 0; i < s->nbuf; i++)
		lo[i] = hi[i] = TS_NONE, ld[i] = false;
	for (ts_id c = 0; c < s->nsc; c++)
		if (s->sc[c].kind == TS_SC_SPM_LD && s->sc[c].buf < s->nbuf)
			ld[s->sc[c].buf] = true;
	for (ts_id o = 0; o < s->nop; o++)
		for (int w = 0; w < TCP_NVIEW; w++) {
			int32_t t = s->op[o].in.v[w].t;
			if (t < 0 || (uint32_t)t >= s->nbuf)
				continue;
			if (lo[t] == TS_NONE || pos[o] < pos[lo[t]])
				lo[t] = o;
			if (hi[t] == TS_NONE || pos[o] > pos[hi[t]])
				hi[t] = o;
		}
	for (ts_id i = 0; i < s->nbuf; i++) {
		ts_buf *u = &s->buf[i];
		if (u->space != TCP_HBM && u->kind == TCP_T_SCRATCH && u->life == TS_LIFE_PROGRAM && !ld[i] &&
			lo[i] != TS_NONE) {
			u->life = TS_LIFE_SPAN;
			u->first = lo[i];
			u->last = hi[i];
		}
	}
	ctx_free(b->ctx, pos, (s->nop + 1) * sizeof *pos);
	ctx_free(b->ctx, lo, (s->nbuf + 1) * sizeof *lo);
	ctx_free(b->ctx, hi, (s->nbuf + 1) * sizeof *hi);
	ctx_free(b->ctx, ld, s->nbuf + 1);
}

/* The schedule of g with the block loop's weights in mode weights (ring
 * tiles when streamed), the top graph's weights streamed when top_stream;
 * *wd: what the double mode's weights need. */
static tcp_sched *build(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, int weights, int ring,
	int64_t tile_bytes, const moe_id *hbm, uint32_t nhbm, bool top_stream, ts_wdemand *wd)
{
	tcp_sched *s = tcp_sched_new(ctx, m);
	if (!s)
		return NULL;
	meta(s, g);
	sb b;
	memset(&b, 0, sizeof b);
	b.ctx = ctx;
	b.s = s;
	b.m = m;
	b.g = g;
	b.S = tcp_slices(m);
	b.rg = s->top;
	b.phase = TS_PH_ROUTING;
	b.rows = TS_NONE;
	b.weights = (uint8_t)weights;
	b.ring = (uint8_t)ring;
	b.tile_bytes = tile_bytes;
	b.wring = TS_NONE;
	b.top = g;
	b.hbm = hbm;
	b.nhbm = nhbm;
	b.top_stream = top_stream;
	for (int k = 0; k < TS_MAX_RING; k++)
		b.wrd[k] = TS_NONE;
	size_t vn = (size_t)(g->nnodes ? g->nnodes : 1) * sizeof(sb_val);
	b.v = ctx_alloc(ctx, vn);
	b.dmv = ctx_alloc(ctx, vn);
	memset(b.v, 0, vn);
	memset(b.dmv, 0, vn);
	size_t cn = (size_t)(g->nnodes ? g->nnodes : 1) * sizeof(ts_id);
	b.vcount = ctx_alloc(ctx, cn);
	for (moe_id k = 0; k < g->nnodes; k++)
		b.vcount[k] = TS_NONE;
	sb_build_nodes(&b);
	if (!b.failed)
		outputs(&b);
	if (!b.failed)
		spans(&b);
	for (uint32_t k = 0; k < b.ntr; k++)
		ctx_free(ctx, b.tr[k].rd, b.tr[k].crd * sizeof *b.tr[k].rd);
	ctx_free(ctx, b.tr, b.ntr * sizeof *b.tr);
	ctx_free(ctx, b.v, vn);
	ctx_free(ctx, b.dmv, vn);
	ctx_free(ctx, b.vcount, cn);
	if (b.failed) {
		tcp_sched_free(s);
		return NULL;
	}
	*wd = b.wd;
	return s;
}

/* The plan's build: the spills it keeps in HBM, by node. */
static tcp_sched *planned(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, const ts_wdemand *d,
	const ts_wplan *w, bool top_stream)
{
	moe_id hbm[TS_MAX_SPILLS];
	uint32_t n = 0;
	for (uint32_t k = 0; k < d->nspill && k < TS_MAX_SPILLS; k++)
		if (w->hbm[k])
			hbm[n++] = d->spill[k].node;
	ts_wdemand wd;
	return build(ctx, g, m, w->mode, w->ring, d->tile_bytes, hbm, n, top_stream, &wd);
}

/* Built with double-buffered weights and every spillable buffer in DM; the
 * DM planner lists the plans (weights mode, spills' residence) that fit
 * (tcp_dm_plans); when that build is not the only one, each plan is built
 * and priced on the timeline (tcp_dm_price) and the fastest kept (ties: the
 * planner's order). When none fits (*fits false), the last resort is built
 * and its placement reports the overflow. */
static tcp_sched *build_planned(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, bool ts, bool *fits)
{
	ts_wdemand wd;
	tcp_sched *s = build(ctx, g, m, TS_W_DOUBLE, 0, 0, NULL, 0, ts, &wd);
	*fits = true;
	if (s && m && ts && !(s->nloop && wd.n) && !wd.nspill)
		*fits = tcp_dm_placeable(s);
	if (!s || !m || (!(s->nloop && wd.n) && !wd.nspill))
		return s;
	ts_wplan w[TS_MAX_PLANS];
	uint32_t n = tcp_dm_plans(s, &wd, w);
	*fits = n > 0;
	bool asbuilt = n == 1 && w[0].mode == TS_W_DOUBLE;
	for (uint32_t k = 0; asbuilt && k < wd.nspill && k < TS_MAX_SPILLS; k++)
		asbuilt = !w[0].hbm[k];
	if (asbuilt)
		return s;
	if (n <= 1) {
		tcp_sched_free(s);
		s = planned(ctx, g, m, &wd, &w[0], ts);
		*fits = n == 1 || (s && tcp_dm_placeable(s)); /* the last resort may place: the trials are conservative */
		return s;
	}
	tcp_sched *best = NULL;
	int64_t bt = -1;
	for (uint32_t k = 0; k < n; k++) {
		bool same = w[k].mode == TS_W_DOUBLE;
		for (uint32_t j = 0; same && j < wd.nspill && j < TS_MAX_SPILLS; j++)
			same = !w[k].hbm[j];
		tcp_sched *c = same ? s : planned(ctx, g, m, &wd, &w[k], ts);
		if (same)
			s = NULL;
		if (!c)
			continue;
		int64_t t = tcp_dm_price(c);
		if (t >= 0 && (!best || t < bt)) {
			tcp_sched_free(best);
			best = c;
			bt = t;
		} else {
			tcp_sched_free(c);
		}
	}
	tcp_sched_free(s);
	return best ? best : planned(ctx, g, m, &wd, &w[0], ts);
}

/* The first build that fits of: g, then g with its wide row-wise values
 * in row chunks (tcp_row_chunk_wide), the fewest of 2, 4, ... 64 chunks;
 * top_stream: the top graph's weights streamed through rings (*fits false:
 * none fits, the unchunked build is returned). */
static tcp_sched *build_chunked(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, bool top_stream,
	bool *fits)
{
	tcp_sched *s = build_planned(ctx, g, m, top_stream, fits);
	for (uint32_t nch = 2; s && !*fits && nch <= 64; nch *= 2) {
		uint32_t got = 0;
		size_t n0 = moe_diag_count(ctx);
		moe_graph *c = tcp_row_chunk_wide(ctx, g, nch, &got);
		if (!c)
			break;
		tcp_sched *t = build_planned(ctx, c, m, top_stream, fits);
		ir_graph_free(c);
		if (!t) {
			ts_diag_truncate(ctx, n0); /* the chunked graph is not built: the layer's error stands */
			*fits = false;
			break;
		}
		if (*fits) {
			tcp_sched_free(s);
			s = t;
		} else {
			tcp_sched_free(t);
		}
	}
	return s;
}

/* The layer as built with the top graph's weights in DM, in row chunks when
 * it does not fit whole; when no chunking fits either (a shared expert whose
 * weights take most of DM), the same with the top graph's weights streamed
 * from HBM; none fitting, the first unchunked build, whose placement reports
 * the overflow. */
tcp_sched *tcp_sched_build(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m)
{
	bool fits = true;
	tcp_sched *s = build_chunked(ctx, g, m, false, &fits);
	if (!s || fits || !m)
		return s;
	size_t n0 = moe_diag_count(ctx);
	tcp_sched *t = build_chunked(ctx, g, m, true, &fits);
	if (t && fits) {
		tcp_sched_free(s);
		return t;
	}
	tcp_sched_free(t);
	ts_diag_truncate(ctx, n0);
	return s;
}
