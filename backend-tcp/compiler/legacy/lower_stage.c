/* backend-tcp/lower_stage.c: the received rows of an expert-parallel phase
 * program staged into DM once, in block order (docs/expert-parallel.md
 * section 6), instead of one gather per block from the receive buffer.
 *
 * The block loop's dispatch by gather (lower_region.c) reads block g's rows
 * from its source by the grid's row list, rows[g] of its B slots used. When
 * that source is a received buffer (an input "ep.<id>" of a phase program)
 * of R rows and R + B rows fit in 1/8 of DM, the rows are moved once before
 * the loop: the used slots of the row list are compacted in block order
 * (two vector passes: a slot's tag j < rows[g], then flt.compact over the
 * G x B slots), and one DMA gather copies the rows so listed, as many as
 * were received (the count staged beside the loop's scalars), into a DM
 * buffer of R + B rows. Block g's rows are then the rows[g] rows from the
 * sum of rows[g'] over g' < g, kept in a register that each block body
 * advances, and the block math reads them in place (its reads past the
 * block's count stay inside the B spare rows and are masked). One-chip
 * programs (no "ep." input) are unchanged. */
#include <string.h>

#include "backend-tcp/compiler/legacy/lower_int.h"
#include "backend-tcp/isa/build.h"

/* The source node of the grid scatter s's rows (a graph input). */
static const ir_node *stage_source(const lw *c, moe_id s)
{
	const ir_node *sn = N(c->g, s), *xp = N(c->g, sn->args[2]);
	return N(c->g, xp->args[0]);
}

/* The received row count of grid scatter s, whose positions are
 * select(lt(iota, total), pos, spare) (passes/expert_parallel.c); MOE_NONE
 * when they are not of that form. */
static moe_id stage_total(const lw *c, moe_id s)
{
	const ir_node *at = N(c->g, N(c->g, s)->args[1]);
	if (at->op != MOE_OP_SELECT || at->nargs != 3)
		return MOE_NONE;
	const ir_node *v = N(c->g, at->args[0]);
	if (v->op != MOE_OP_LT || v->nargs != 2)
		return MOE_NONE;
	const ir_node *tn = N(c->g, v->args[1]);
	return tn->rank == 0 && tn->dtype == MOE_I32 && c->v[v->args[1]].kind == VK_VIEW &&
			       c->p->t[c->v[v->args[1]].t].space == TCP_DM
		       ? v->args[1]
		       : MOE_NONE;
}

/* The register holding the received row count of grid scatter s, for the
 * staging gather's valid rows (rows past it are not moved): staged into SPM
 * by a descriptor joined to the DMA command before it (the loop's scalars)
 * and loaded once; the return's gather, which the count also limits, reuses
 * it. -1 when the count is not found. */
int tcpl_stage_count(lw *c, moe_id s)
{
	moe_id t = stage_total(c, s);
	if (t == MOE_NONE)
		return -1;
	for (int k = 0; k < c->nvc; k++)
		if (c->vc_id[k] == t)
			return c->vc_reg[k];
	if (c->nvc >= 16 || c->next_reg >= TCP_NREG)
		return -1;
	int r = tcpl_new_reg(c, s);
	tcp_insn spm = tcp_insn_init(TCP_OP_DMA_SPM);
	spm.ndim = 1;
	spm.dim[0] = 1;
	spm.v[TCP_V_S0].t = c->v[t].t;
	spm.v[TCP_V_S0].base = c->v[t].base;
	uint32_t q = c->p->ncode;
	while (q > 0 && tcp_op_ctx[c->p->code[q - 1].op] != TCP_CTX_DMA)
		q--;
	if (q > 0)
		spm.flags |= TCP_F_JOIN;
	emit(c, &spm);
	ld(c, r, c->v[t].t, -1, c->v[t].base, 0);
	c->vc_id[c->nvc] = t;
	c->vc_reg[c->nvc++] = r;
	return r;
}

/* Does the dispatch by gather of grid scatter s (n elements per block) stage its rows? */
bool tcpl_stage_fits(const lw *c, moe_id s, int64_t n)
{
	const ir_node *sn = N(c->g, s), *x = stage_source(c, s);
	if (x->op != MOE_OP_INPUT || !x->name || strncmp(x->name, "ep.", 3) || x->rank != 2 || sn->rank != 2 ||
		c->rows == MOE_NONE || c->v[c->rows].kind == VK_IMM || c->v[s].kind != VK_VIEW)
		return false;
	int64_t D = sn->shape[1], B = D > 0 ? n / D : 0, R = x->shape[0];
	if (B < 1 || sn->shape[0] != c->G * B || R > c->G * B)
		return false;
	return (R + B) * D * esz(x->dtype) * 8 <= c->m->dm_bytes_per_slice * c->S;
}

/* The staging buffer of grid scatter s, [R + B, D] in DM; tmp receives the
 * two index lists of G B slots that the staging uses (freed with the loop's
 * buffers). */
int32_t tcpl_stage_buffer(lw *c, moe_id s, int64_t n, int32_t *tmp)
{
	const ir_node *sn = N(c->g, s), *x = stage_source(c, s);
	int64_t D = sn->shape[1], GB = sn->shape[0], sh[2] = {x->shape[0] + n / D, D};
	tmp[0] = tcpl_dm_tensor(c, s, "slot_used", MOE_I32, 1, &GB);
	tmp[1] = tcpl_dm_tensor(c, s, "staged_rows", MOE_I32, 1, &GB);
	return tcpl_dm_tensor(c, s, "staged", (moe_dtype)x->dtype, 2, sh);
}

/* The staging before the loop: the used slots compacted, then one gather of
 * the R received rows into buf (rows tensor trw at rwbase, stride rws; tmp
 * from tcpl_stage_buffer). */
void tcpl_stage_emit(lw *c, moe_id s, int32_t buf, int64_t n, int32_t trw, int64_t rwbase, int64_t rws,
	const int32_t *tmp)
{
	const ir_node *sn = N(c->g, s), *x = stage_source(c, s);
	int64_t D = sn->shape[1], B = n / D, GB = sn->shape[0], R = x->shape[0];
	val *list = &c->v[s];
	val *xv = tcpl_need_view(c, N(c->g, sn->args[2])->args[0]);
	int32_t used = tmp[0], order = tmp[1];
	/* used[g B + j] = j < rows[g] */
	tcp_insn u = tcp_insn_init(TCP_OP_TU_VEC);
	u.ndim = 2;
	u.dim[0] = c->G;
	u.dim[1] = B;
	u.v[TCP_V_DST].t = used;
	u.v[TCP_V_DST].stride[0] = B;
	u.v[TCP_V_DST].stride[1] = 1;
	u.v[TCP_V_S0].t = trw;
	u.v[TCP_V_S0].base = rwbase;
	u.v[TCP_V_S0].stride[0] = rws;
	u.nstep = 1;
	u.step[0] = (tcp_step){TCP_V_TLT, TCP_SRC_CTR, TCP_SRC_S0, 1, 0, 0};
	emit(c, &u);
	/* order = the row list's used slots, in block order, then 0 */
	tcp_insn k = tcp_b_vec(1, &GB, tcp_b_flat(order));
	k.v[TCP_V_S0] = tcp_b_flat(used);
	k.v[TCP_V_S1] = tcp_b_view(list->t, list->base, 1, list->stride);
	tcp_b_step(&k, TCP_V_TNE, TCP_SRC_S0, TCP_SRC_IMM, 0);
	tcp_b_step(&k, TCP_V_COMPACT, TCP_SRC_S1, TCP_SRC_IMM, 0);
	emit(c, &k);
	/* buf[i] = x[order[i]], i < R (R <= G B: the used slots are the R received rows at most) */
	const int64_t gdim[3] = {1, R, D}, rows[3] = {R * D, D, 1}, ist[2] = {R, 1};
	tcp_insn in = tcp_b_dma_gather(3, gdim, tcp_b_view(buf, 0, 3, rows), tcp_b_view(xv->t, xv->base, 3, rows),
		tcp_b_view(order, 0, 2, ist), R);
	in.vreg = tcpl_stage_count(c, s);
	emit(c, &in);
}
