/* Instruction builders (build.h): fill tcp_insn structs from tcp_insn_init. */
#include "backend-tcp/isa/build.h"

tcp_view tcp_b_view(int32_t t, int64_t base, int ndim, const int64_t *stride)
{
	tcp_view v = tcp_view_none();
	v.t = t;
	v.base = base;
	for (int k = 0; k < ndim && k < TCP_MAXD; k++)
		v.stride[k] = stride[k];
	return v;
}

tcp_view tcp_b_flat(int32_t t)
{
	const int64_t one = 1;
	return tcp_b_view(t, 0, 1, &one);
}

/* the shape of a command over dims[0..ndim) */
static tcp_insn shaped(tcp_opcode op, int ndim, const int64_t *dim)
{
	tcp_insn in = tcp_insn_init(op);
	if (ndim > TCP_MAXD)
		ndim = TCP_MAXD;
	in.ndim = (uint8_t)ndim;
	for (int k = 0; k < ndim; k++)
		in.dim[k] = dim[k];
	return in;
}

tcp_insn tcp_b_dma_copy(int ndim, const int64_t *dim, tcp_view dst, tcp_view src)
{
	tcp_insn in = shaped(TCP_OP_DMA_COPY, ndim, dim);
	in.v[TCP_V_DST] = dst;
	in.v[TCP_V_S0] = src;
	return in;
}

tcp_insn tcp_b_dma_copy_flat(int32_t dst, int32_t src, int64_t n)
{
	return tcp_b_dma_copy(1, &n, tcp_b_flat(dst), tcp_b_flat(src));
}

static tcp_insn indexed(tcp_opcode op, int ndim, const int64_t *dim, tcp_view dst, tcp_view src,
	tcp_view idx, int64_t rows)
{
	tcp_insn in = shaped(op, ndim, dim);
	in.v[TCP_V_DST] = dst;
	in.v[TCP_V_S0] = src;
	in.v[TCP_V_S1] = idx;
	in.rows = rows;
	return in;
}

tcp_insn tcp_b_dma_gather(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, tcp_view idx,
	int64_t rows)
{
	return indexed(TCP_OP_DMA_GATHER, ndim, dim, dst, src, idx, rows);
}

tcp_insn tcp_b_dma_scatter(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, tcp_view idx,
	int64_t rows)
{
	return indexed(TCP_OP_DMA_SCATTER, ndim, dim, dst, src, idx, rows);
}

tcp_insn tcp_b_vec(int ndim, const int64_t *dim, tcp_view dst)
{
	tcp_insn in = shaped(TCP_OP_TU_VEC, ndim, dim);
	in.v[TCP_V_DST] = dst;
	return in;
}

bool tcp_b_step(tcp_insn *in, uint8_t op, uint8_t x, uint8_t y, uint32_t imm)
{
	if (in->nstep >= TCP_MAXSTEP)
		return false;
	in->step[in->nstep++] = (tcp_step){op, x, y, 0, 0, imm};
	return true;
}

tcp_insn tcp_b_li(uint8_t rd, int64_t imm)
{
	tcp_insn in = tcp_insn_init(TCP_OP_LI);
	in.rd = rd;
	in.imm = imm;
	return in;
}

tcp_insn tcp_b_alu(uint8_t sop, uint8_t rd, uint8_t ra, uint8_t rb, int64_t imm)
{
	tcp_insn in = tcp_insn_init(TCP_OP_ALU);
	in.sop = sop;
	in.rd = rd;
	in.ra = ra;
	in.rb = rb;
	in.imm = imm;
	return in;
}

tcp_insn tcp_b_ld(uint8_t rd, tcp_view src)
{
	tcp_insn in = tcp_insn_init(TCP_OP_LD);
	in.rd = rd;
	in.v[TCP_V_S0] = src;
	return in;
}

tcp_insn tcp_b_br(uint8_t cond, uint8_t ra, uint8_t rb, int32_t target)
{
	tcp_insn in = tcp_insn_init(TCP_OP_BR);
	in.sop = cond;
	in.ra = ra;
	in.rb = rb;
	in.target = target;
	return in;
}

tcp_insn tcp_b_jmp(int32_t target)
{
	tcp_insn in = tcp_insn_init(TCP_OP_JMP);
	in.target = target;
	return in;
}

tcp_insn tcp_b_halt(void)
{
	return tcp_insn_init(TCP_OP_HALT);
}

tcp_insn tcp_b_dma_spm(int ndim, const int64_t *dim, tcp_view s0, tcp_view s1, tcp_view s2)
{
	tcp_insn in = shaped(TCP_OP_DMA_SPM, ndim, dim);
	in.v[TCP_V_S0] = s0;
	in.v[TCP_V_S1] = s1;
	in.v[TCP_V_S2] = s2;
	return in;
}

static tcp_insn sub_load(int op, int ndim, const int64_t *dim, tcp_view dst, tcp_view src, bool xslice)
{
	tcp_insn in = shaped(op, ndim, dim);
	in.v[TCP_V_DST] = dst;
	in.v[TCP_V_S0] = src;
	if (xslice)
		in.flags |= TCP_F_XSLICE;
	return in;
}

tcp_insn tcp_b_ldtrf(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, bool xslice)
{
	return sub_load(TCP_OP_SUB_TRF, ndim, dim, dst, src, xslice);
}

tcp_insn tcp_b_ldvrf(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, bool xslice)
{
	return sub_load(TCP_OP_SUB_VRF, ndim, dim, dst, src, xslice);
}

tcp_insn tcp_b_contract(const int64_t dim[3], tcp_view dst, tcp_view s0, tcp_view s1, tcp_view s2, int64_t tile)
{
	tcp_insn in = shaped(TCP_OP_TU_CONTRACT, 3, dim);
	in.v[TCP_V_DST] = dst;
	in.v[TCP_V_S0] = s0;
	in.v[TCP_V_S1] = s1;
	in.v[TCP_V_S2] = s2;
	in.tile = tile;
	if (s2.t >= 0)
		in.flags |= TCP_F_ACC;
	return in;
}
