/* backend-tcp/lower_mem.c: TCP lowering: diagnostics, DM and HBM placement (first-fit DM
 * allocation per slice), operand views in DM, output placement and valid masks. */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"

void tcpl_err(lw *c, moe_id n, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!c->failed && !c->quiet) /* quiet: a lowering that is tried again (lower_try) */
		moe_diag(c->ctx, MOE_DIAG_ERROR, n == MOE_NONE ? c->g->loc : N(c->g, n)->loc, "tcp: %s", msg);
	c->failed = true;
}

/* ---- memory ---- */
int32_t tcpl_hbm_tensor(lw *c, const char *name, int kind, moe_dtype dt, int rank, const int64_t *shape)
{
	int32_t t = tcp_add_tensor(c->p, name, TCP_HBM, kind, dt, rank, shape);
	tcp_tensor *tt = &c->p->t[t];
	tt->addr = c->hbm_top;
	c->hbm_top = rup(c->hbm_top + tt->numel * esz(dt), c->m->hbm_granule);
	return t;
}

/* Tensor t placed at offset off (need bytes per slice) as live block i of
 * the offset-sorted list. */
void tcpl_dm_place(lw *c, int32_t t, uint32_t i, int64_t off, int64_t need)
{
	ctx_grow(c->ctx, (void **)&c->live, &c->lcap, c->nlive + 1, sizeof *c->live);
	memmove(&c->live[i + 1], &c->live[i], (c->nlive - i) * sizeof *c->live);
	c->live[i] = (dmblk){off, need, t};
	c->nlive++;
	c->p->t[t].addr = off;
	c->p->t[t].slice_bytes = need;
	if (off + need > c->dm_peak)
		c->dm_peak = off + need;
}

int32_t tcpl_dm_tensor(lw *c, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape)
{
	int32_t t = tcp_add_tensor(c->p, name, TCP_DM, TCP_T_SCRATCH, dt, rank, shape);
	tcp_tensor *tt = &c->p->t[t];
	int64_t need = rup((tt->numel * esz(dt) + c->S - 1) / c->S, c->m->flit_bytes);
	/* first fit between live blocks (kept sorted by offset) */
	int64_t off = 0;
	uint32_t i = 0;
	for (; i < c->nlive; i++) {
		if (c->live[i].off - off >= need)
			break;
		off = c->live[i].off + c->live[i].size;
	}
	if (off + need > c->m->dm_bytes_per_slice) {
		tcpl_err(c, at, "DM capacity exceeded: '%s' needs %lld bytes per slice at offset %lld, %lld per slice exist",
			name, (long long)need, (long long)off, (long long)c->m->dm_bytes_per_slice);
		off = 0;
	}
	tcpl_dm_place(c, t, i, off, need);
	return t;
}

/* As tcpl_dm_tensor, but at the top of the highest gap that holds it: a
 * tensor live through the block loop and after it (lower_shared.c's
 * `shared`) leaves the gaps below to the loop's buffers, allocated later. */
int32_t tcpl_dm_tensor_top(lw *c, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape)
{
	int32_t t = tcp_add_tensor(c->p, name, TCP_DM, TCP_T_SCRATCH, dt, rank, shape);
	tcp_tensor *tt = &c->p->t[t];
	int64_t need = rup((tt->numel * esz(dt) + c->S - 1) / c->S, c->m->flit_bytes);
	int64_t off = -1;
	uint32_t at_i = 0;
	for (uint32_t i = 0; i <= c->nlive; i++) {
		int64_t lo = i ? c->live[i - 1].off + c->live[i - 1].size : 0;
		int64_t hi = i < c->nlive ? c->live[i].off : c->m->dm_bytes_per_slice;
		if (hi - lo >= need)
			off = (hi - need) / c->m->flit_bytes * c->m->flit_bytes, at_i = i;
	}
	if (off < 0) {
		tcpl_err(c, at, "DM capacity exceeded: '%s' needs %lld bytes per slice, no gap holds it", name,
			(long long)need);
		off = 0;
	}
	tcpl_dm_place(c, t, at_i, off, need);
	return t;
}

void tcpl_dm_free(lw *c, int32_t t)
{
	for (uint32_t i = 0; i < c->nlive; i++)
		if (c->live[i].t == t) {
			memmove(&c->live[i], &c->live[i + 1], (c->nlive - i - 1) * sizeof *c->live);
			c->nlive--;
			return;
		}
}

int tcpl_new_reg(lw *c, moe_id at)
{
	if (c->next_reg >= TCP_NREG) {
		tcpl_err(c, at, "out of scalar registers");
		return R_T;
	}
	return c->next_reg++;
}

/* A copy emitted right after another DMA copy joins its descriptor list
 * (two HBM reads that routing needs first, x and the router weights, set up
 * side by side). */
void tcpl_join_adjacent(lw *c, uint32_t at)
{
	if (at > 0 && at < c->p->ncode && c->p->code[at - 1].op == TCP_OP_DMA_COPY &&
		c->p->code[at].op == TCP_OP_DMA_COPY)
		c->p->code[at].flags |= TCP_F_JOIN;
}

/* An output's copy emitted right after a DMA copy, gather or scatter joins
 * its list (the outputs copied out one after another, or after the gather
 * that wrote another output in place). */
void tcpl_join_output(lw *c, uint32_t at)
{
	tcp_opcode prev = at > 0 && at < c->p->ncode ? (tcp_opcode)c->p->code[at - 1].op : TCP_OP_COUNT;
	if ((prev == TCP_OP_DMA_COPY || prev == TCP_OP_DMA_GATHER || prev == TCP_OP_DMA_SCATTER) &&
		c->p->code[at].op == TCP_OP_DMA_COPY)
		c->p->code[at].flags |= TCP_F_JOIN;
}

/* A gather or scatter emitted right after another DMA command (copy, gather
 * or scatter) joins its descriptor list: its setup runs beside that
 * command's transfer (the send buffers' rows and experts, scattered one
 * after the other). */
void tcpl_join_gs(lw *c, uint32_t at)
{
	tcp_opcode prev = at > 0 && at < c->p->ncode ? (tcp_opcode)c->p->code[at - 1].op : TCP_OP_COUNT;
	if ((prev == TCP_OP_DMA_COPY || prev == TCP_OP_DMA_GATHER || prev == TCP_OP_DMA_SCATTER) &&
		(c->p->code[at].op == TCP_OP_DMA_GATHER || c->p->code[at].op == TCP_OP_DMA_SCATTER))
		c->p->code[at].flags |= TCP_F_JOIN;
}

/* The value of node id as a view in DM, copying from HBM if needed. */
static val *dm_copy_of(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	val *v = &c->v[id];
	uint32_t at = c->p->ncode;
	if (!is_contig(v, n)) {
		/* a strided or broadcast view (a bias read by every row): copy the
		 * whole HBM tensor once and keep the view's strides on the copy */
		const tcp_tensor *ht = &c->p->t[v->t];
		int64_t sh[MOE_MAX_RANK];
		memcpy(sh, ht->shape, sizeof sh);
		int32_t t = tcpl_dm_tensor(c, id, "hbm-copy", (moe_dtype)ht->dtype, ht->rank, sh);
		dma_copy(c, t, 0, -1, 0, v->t, 0, -1, 0, c->p->t[t].numel);
		tcpl_join_adjacent(c, at);
		v->t = t;
		v->owner = id;
		v->region = false;
		return v;
	}
	/* the copy keeps the HBM tensor's element type: an aliased bf16 -> f32
	 * cast is a view of bf16 data (the fetch widens), so DMA moves bf16 */
	int32_t t = tcpl_dm_tensor(c, id, "hbm-copy", (moe_dtype)c->p->t[v->t].dtype, n->rank, n->shape);
	moe_id cnt = tcpl_input_rows_count(c, id);
	if (cnt != MOE_NONE && n->shape[0] > 1) /* a serving layer's tokens: the real rows' tiles (lower_rows.c) */
		tcpl_copy_rows(c, t, 0, v->t, v->base, n->shape[0], ir_numel(n) / n->shape[0], tcpl_count_reg(c, id, cnt));
	else
		dma_copy(c, t, 0, -1, 0, v->t, v->base, -1, 0, ir_numel(n));
	tcpl_join_adjacent(c, at);
	val nv = tview(t, v->owner, n);
	nv.owner = id;
	*v = nv;
	return v;
}

val *tcpl_need_view(lw *c, moe_id id)
{
	val *v = &c->v[id];
	if (v->kind == VK_IMM || v->kind == VK_IOTA)
		tcpl_materialize(c, id);
	v = &c->v[id];
	if (v->kind == VK_VIEW && !v->region && c->p->t[v->t].space == TCP_HBM) {
		/* TU passes read DM only */
		return v;
	}
	return v;
}

/* A DM view for a tensor-unit operand. */
val *tcpl_dm_view(lw *c, moe_id id)
{
	val *v = tcpl_need_view(c, id);
	if (v->kind == VK_VIEW && c->p->t[v->t].space == TCP_HBM)
		v = dm_copy_of(c, id);
	return v;
}

/* ---- output placement, valid masks ---- */
val *tcpl_out_val(lw *c, moe_id id, moe_dtype dt)
{
	const ir_node *n = N(c->g, id);
	val *v = &c->v[id];
	if (v->kind == VK_VIEW)
		return v; /* preassigned (region buffers) */
	if (c->store_dt[id])
		dt = (moe_dtype)c->store_dt[id]; /* the pass commits its narrowing cast's dtype */
	int32_t t;
	if (c->hbm_home[id])
		t = tcpl_hbm_tensor(c, n->name ? n->name : "hbm", TCP_T_SCRATCH, dt, n->rank, n->shape);
	else
		t = tcpl_dm_tensor(c, id, n->name ? n->name : moe_op_name((moe_op)n->op), dt, n->rank, n->shape);
	*v = tview(t, id, n);
	return v;
}

int tcpl_valid_reg(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (n->valid == MOE_NONE)
		return -1;
	if (c->inreg[id]) {
		if (n->valid == c->rows)
			return R_ROWS;
		return -1; /* nblocks: the loop bound already holds it */
	}
	const ir_node *vn = N(c->g, n->valid);
	if (vn->rank != 0) {
		tcpl_err(c, id, "a per-row valid mask outside the block loop is not lowered");
		return -1;
	}
	return tcpl_count_reg(c, id, n->valid);
}

/* A register holding the run-time scalar count (i32 node cnt), staged into
 * SPM and loaded the first time (for node id's code). */
int tcpl_count_reg(lw *c, moe_id id, moe_id cnt)
{
	for (int k = 0; k < c->nvc; k++)
		if (c->vc_id[k] == cnt)
			return c->vc_reg[k];
	int r = tcpl_count_alu(c, id, cnt);
	if (r >= 0)
		return r;
	r = tcpl_new_reg(c, id);
	val *vv = tcpl_dm_view(c, cnt);
	if (vv->kind != VK_VIEW) {
		li(c, r, 0);
		return r;
	}
	/* the control path reads a run-time scalar (a serving layer's token
	 * count, or a count derived from it) only from SPM: stage it first */
	tcp_insn spm = tcp_insn_init(TCP_OP_DMA_SPM);
	spm.ndim = 1;
	spm.dim[0] = 1;
	spm.v[TCP_V_S0].t = vv->t;
	spm.v[TCP_V_S0].base = vv->base;
	emit(c, &spm);
	ld(c, r, vv->t, -1, vv->base, 0);
	if (c->nvc < 16) {
		c->vc_id[c->nvc] = cnt;
		c->vc_reg[c->nvc++] = r;
	}
	return r;
}
