/* Instruction builders: each returns a fully initialised tcp_insn of one
 * command family (every field the encoder reads is set: views not given are
 * unused (t = -1), registers none, no steps, no flags). They carry no
 * compiler policy: the caller decides shapes, tensors and phases; a builder
 * only fills the struct. Views are built with tcp_b_view / tcp_b_flat. */
#ifndef MOEC_TCP_BUILD_H
#define MOEC_TCP_BUILD_H

#include "backend-tcp/isa/tcp_int.h"

/* View of tensor t at element offset base with the given strides (ndim of
 * them; the rest zero), no offset register. */
tcp_view tcp_b_view(int32_t t, int64_t base, int ndim, const int64_t *stride);
/* View of tensor t from element 0 with stride 1 along dimension 0. */
tcp_view tcp_b_flat(int32_t t);

/* dma.copy over dims[0..ndim) from src into dst. */
tcp_insn tcp_b_dma_copy(int ndim, const int64_t *dim, tcp_view dst, tcp_view src);
/* dma.copy of n elements, both sides flat (tcp_b_flat). */
tcp_insn tcp_b_dma_copy_flat(int32_t dst, int32_t src, int64_t n);
/* dma.gather / dma.scatter: idx (i32) is the index list view in s1, rows
 * the rows per group. */
tcp_insn tcp_b_dma_gather(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, tcp_view idx,
	int64_t rows);
tcp_insn tcp_b_dma_scatter(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, tcp_view idx,
	int64_t rows);
/* tu.vec over dims[0..ndim) writing dst, no streams and no steps yet: add
 * them with the v[] fields and tcp_b_step. */
tcp_insn tcp_b_vec(int ndim, const int64_t *dim, tcp_view dst);
/* Appends one chain step (op, left x, right y, immediate) to a tu.vec; false
 * when the chain is full (TCP_MAXSTEP), leaving the instruction unchanged. */
bool tcp_b_step(tcp_insn *in, uint8_t op, uint8_t x, uint8_t y, uint32_t imm);

/* Scalar and control commands. */
tcp_insn tcp_b_li(uint8_t rd, int64_t imm);
tcp_insn tcp_b_alu(uint8_t sop, uint8_t rd, uint8_t ra, uint8_t rb, int64_t imm);
/* ld rd = one staged i32 element of view src (its t, base, reg and scale). */
tcp_insn tcp_b_ld(uint8_t rd, tcp_view src);
/* br.COND ra, rb to instruction target (-1: patched later); jmp likewise. */
tcp_insn tcp_b_br(uint8_t cond, uint8_t ra, uint8_t rb, int32_t target);
tcp_insn tcp_b_jmp(int32_t target);
tcp_insn tcp_b_halt(void);

/* dma.spm over dims[0..ndim): stages the i32 views s0 and, when their t >= 0,
 * s1 and s2 into the control processor's SPM (no dst). */
tcp_insn tcp_b_dma_spm(int ndim, const int64_t *dim, tcp_view s0, tcp_view s1, tcp_view s2);
/* sub.ldtrf over dims[0..ndim) from DM view src into TRF view dst; xslice:
 * the bytes a slice does not hold arrive over the switch. */
tcp_insn tcp_b_ldtrf(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, bool xslice);
/* sub.ldvrf likewise, into VRF view dst. */
tcp_insn tcp_b_ldvrf(int ndim, const int64_t *dim, tcp_view dst, tcp_view src, bool xslice);
/* tu.contract dims=[M, O, I]: dst[m, o] = (s2 if its t >= 0: flags=acc) +
 * sum_i s0[m, i] s1[o, i], s1 in TRF, tile TRF rows per slice. */
tcp_insn tcp_b_contract(const int64_t dim[3], tcp_view dst, tcp_view s0, tcp_view s1, tcp_view s2, int64_t tile);

#endif
