/* backend-c/emit_dot.c: CS_DOT tiles in LLVM IR (cgen.h): the portable
 * kernel (W rows transposed in registers, f32 FMAs in the generic order) and
 * the vdpbf16ps kernels, reading W either as stored or, for a weight packed
 * at run time (cgen_pack_plan, backend-c/pack.c), from its packed copy. */
#include <string.h>

#include "backend-c/emit_llvm_int.h"

/* part of the JIT cache key, like emit_llvm.c's own build time */
const char cgl_dot_built[] = __DATE__ " " __TIME__;

/* ---- CS_DOT: counted loops with phi induction variables ---- */

LLVMValueRef dloop_begin(eml *E, dloop *l, LLVMValueRef lo, LLVMValueRef hi)
{
	LLVMBuilderRef b = E->b;
	LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
	l->head = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.head");
	LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.body");
	l->exit = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.exit");
	LLVMBuildBr(b, l->head);
	LLVMPositionBuilderAtEnd(b, l->head);
	l->iv = LLVMBuildPhi(b, E->i64, "");
	LLVMAddIncoming(l->iv, &lo, &pre, 1);
	LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, l->iv, hi, ""), body, l->exit);
	LLVMPositionBuilderAtEnd(b, body);
	return l->iv;
}

void dloop_end(eml *E, dloop *l, int64_t step)
{
	LLVMBuilderRef b = E->b;
	LLVMValueRef next = LLVMBuildAdd(b, l->iv, LLVMConstInt(E->i64, (unsigned long long)step, 0), "");
	LLVMBasicBlockRef cur = LLVMGetInsertBlock(b);
	LLVMBuildBr(b, l->head);
	LLVMAddIncoming(l->iv, &next, &cur, 1);
	LLVMPositionBuilderAtEnd(b, l->exit);
}

static LLVMValueRef splat32(eml *E, LLVMTypeRef elt, uint64_t v)
{
	LLVMValueRef c[DOT_LANES];
	for (int i = 0; i < DOT_LANES; i++)
		c[i] = LLVMConstInt(elt, v, 0);
	return LLVMConstVector(c, DOT_LANES);
}

/* widen a vector of bf16 (i16) or f32 to f32 lanes, quieting signalling NaNs
 * exactly like the scalar load */
static LLVMValueRef dot_widen(eml *E, LLVMValueRef v, bool bf)
{
	if (!bf)
		return v;
	LLVMBuilderRef b = E->b;
	LLVMTypeRef vi = LLVMVectorType(E->i32, DOT_LANES);
	LLVMValueRef h = LLVMBuildZExt(b, v, vi, "");
	LLVMValueRef snan = LLVMBuildICmp(b, LLVMIntUGT, LLVMBuildAnd(b, h, splat32(E, E->i32, 0x7fffu), ""),
		splat32(E, E->i32, 0x7f80u), "");
	LLVMValueRef u = LLVMBuildShl(b, h, splat32(E, E->i32, 16), "");
	u = LLVMBuildOr(b, u, LLVMBuildSelect(b, snan, splat32(E, E->i32, 0x00400000u), splat32(E, E->i32, 0), ""), "");
	return LLVMBuildBitCast(b, u, LLVMVectorType(E->f32, DOT_LANES), "");
}

static LLVMValueRef dot_splat(eml *E, LLVMValueRef x)
{
	LLVMTypeRef vf = LLVMVectorType(E->f32, DOT_LANES);
	LLVMValueRef v = LLVMBuildInsertElement(E->b, LLVMGetUndef(vf), x, LLVMConstInt(E->i32, 0, 0), "");
	LLVMValueRef z[DOT_LANES];
	for (int i = 0; i < DOT_LANES; i++)
		z[i] = LLVMConstInt(E->i32, 0, 0);
	return LLVMBuildShuffleVector(E->b, v, LLVMGetUndef(vf), LLVMConstVector(z, DOT_LANES), "");
}

/* for r < rows: acc = dst row r; acc += splat(A[r, k0 + kk]) * col[kk] for kk < n; store */
static void dot_rows(eml *E, const cg_dot *t, LLVMValueRef rows, LLVMValueRef ai, LLVMValueRef di, LLVMValueRef k0,
	LLVMValueRef *col, int n)
{
	LLVMBuilderRef b = E->b;
	LLVMTypeRef vf = LLVMVectorType(E->f32, DOT_LANES);
	dloop lr;
	LLVMValueRef r = dloop_begin(E, &lr, LLVMConstInt(E->i64, 0, 0), rows);
	LLVMValueRef di_r = LLVMBuildAdd(b, di, LLVMBuildMul(b, r, LLVMConstInt(E->i64, (unsigned long long)cgl_drow(t), 0), ""), "");
	LLVMValueRef dp = cgl_elem_ptr(E, t->dbuf, di_r);
	LLVMValueRef acc = LLVMBuildLoad2(b, vf, dp, "");
	LLVMSetAlignment(acc, 4);
	LLVMValueRef abase = LLVMBuildAdd(b, ai,
		LLVMBuildAdd(b, LLVMBuildMul(b, r, LLVMConstInt(E->i64, (unsigned long long)t->astride, 0), ""), k0, ""), "");
	for (int kk = 0; kk < n; kk++) {
		LLVMValueRef ix = LLVMBuildAdd(b, abase, LLVMConstInt(E->i64, (unsigned long long)kk, 0), "");
		bool abf = E->p->bufs[t->abuf].dtype == MOE_BF16;
		LLVMValueRef a = LLVMBuildLoad2(b, abf ? E->i16 : E->f32, cgl_elem_ptr(E, t->abuf, ix), "");
		if (abf)
			a = cgl_widen_bf16(E, a);
		acc = LLVMBuildFAdd(b, acc, LLVMBuildFMul(b, dot_splat(E, a), col[kk], ""), "");
	}
	LLVMValueRef stv = LLVMBuildStore(b, acc, dp);
	LLVMSetAlignment(stv, 4);
	dloop_end(E, &lr, 1);
}

/* rows of A per group in the vdpbf16ps tile: independent accumulator chains.
 * With W as stored its DOT_LANES pair vectors stay in registers beside the
 * accumulators; from a packed copy one is live at a time. */
enum { DOT_BF16_ROWS = 8, DOT_STORED_ROWS = 4 };

/* Transposes the DOT_LANES x DOT_LANES matrix of 32-bit elements whose rows
 * are m[0..DOT_LANES) (scratch tt of the same size); returns the rows of the
 * transpose, which is m or tt. */
static LLVMValueRef *transpose16(eml *E, LLVMValueRef *m, LLVMValueRef *tt)
{
	/* swap bit s of the row index with bit s of the column index, s = 3..0 */
	LLVMValueRef *src = m, *dst = tt;
	for (int d = DOT_LANES / 2; d >= 1; d /= 2) {
		LLVMValueRef mp[DOT_LANES], mq[DOT_LANES];
		for (int k = 0; k < DOT_LANES; k++) {
			mp[k] = LLVMConstInt(E->i32, (unsigned long long)((k & d) ? DOT_LANES + (k ^ d) : k), 0);
			mq[k] = LLVMConstInt(E->i32, (unsigned long long)((k & d) ? DOT_LANES + k : (k ^ d)), 0);
		}
		LLVMValueRef cp = LLVMConstVector(mp, DOT_LANES), cq = LLVMConstVector(mq, DOT_LANES);
		for (int p = 0; p < DOT_LANES; p++) {
			if (p & d)
				continue;
			dst[p] = LLVMBuildShuffleVector(E->b, src[p], src[p | d], cp, "");
			dst[p | d] = LLVMBuildShuffleVector(E->b, src[p], src[p | d], cq, "");
		}
		LLVMValueRef *x = src;
		src = dst;
		dst = x;
	}
	return src;
}

/* prefetch the rows of the next tile at k0, a tile ahead (a hint only; past
 * the buffer it is dropped harmlessly): they start cold in every page */
static void prefetch_next_tile(eml *E, const cg_dot *t, LLVMTypeRef welt, LLVMValueRef wi, LLVMValueRef k0)
{
	LLVMBuilderRef b = E->b;
	for (int j = 0; j < DOT_LANES; j++) {
		LLVMValueRef ix = LLVMBuildAdd(b, LLVMBuildAdd(b, wi, k0, ""),
			LLVMConstInt(E->i64, (unsigned long long)((DOT_LANES + j) * t->wstride), 0), "");
		LLVMValueRef ptr = LLVMBuildGEP2(b, welt, cgl_buf_base(E, t->wbuf), &ix, 1, "");
		LLVMValueRef args[4] = {ptr, cgl_ci32(E, 0), cgl_ci32(E, 2), cgl_ci32(E, 1)};
		LLVMBuildCall2(b, E->t_prefetch, E->f_prefetch, args, 4, "");
	}
}

/* elements of a packed copy prefetched ahead of the step being read: the
 * steps of a tile, then the next tile, lie one after the other */
enum { DOT_PACK_AHEAD = 16 * 2 * DOT_LANES * DOT_LANES };

/* pair vector p of the step at element pat of the packed copy pw (pack.c) */
static LLVMValueRef wpair_packed(eml *E, LLVMValueRef pw, LLVMValueRef pat, int p)
{
	LLVMBuilderRef b = E->b;
	LLVMValueRef ix = LLVMBuildAdd(b, pat, LLVMConstInt(E->i64, (unsigned long long)(p * 2 * DOT_LANES), 0), "");
	LLVMValueRef v = LLVMBuildLoad2(b, LLVMVectorType(E->i32, DOT_LANES), LLVMBuildInBoundsGEP2(b, E->i16, pw, &ix, 1, ""), "");
	LLVMSetAlignment(v, 64);
	return LLVMBuildBitCast(b, v, LLVMVectorType(LLVMBFloatTypeInContext(E->c), 2 * DOT_LANES), "");
}

/* the step at element pat of a packed copy: its 16 cache lines prefetched
 * DOT_PACK_AHEAD elements ahead */
static void prefetch_packed(eml *E, LLVMValueRef pw, LLVMValueRef pat)
{
	LLVMBuilderRef b = E->b;
	for (int p = 0; p < DOT_LANES; p++) {
		LLVMValueRef ix = LLVMBuildAdd(b, pat, LLVMConstInt(E->i64, (unsigned long long)(p * 2 * DOT_LANES + DOT_PACK_AHEAD), 0), "");
		LLVMValueRef args[4] = {LLVMBuildGEP2(b, E->i16, pw, &ix, 1, ""), cgl_ci32(E, 0), cgl_ci32(E, 3), cgl_ci32(E, 1)};
		LLVMBuildCall2(b, E->t_prefetch, E->f_prefetch, args, 4, "");
	}
}

/* rows [r0, r0 + g) of a vdpbf16ps step at k0: the g accumulators are
 * independent chains, interleaved so that the instruction's latency is hidden.
 * The pairs of W are wv, or when wv is NULL loaded one at a time from the
 * packed copy pw at element pat (then only one is live at a time, leaving the
 * registers to the accumulators of more rows). */
static void dot_bf16_rows(eml *E, const cg_dot *t, LLVMValueRef r0, int g, LLVMValueRef ai, LLVMValueRef di,
	LLVMValueRef k0, const LLVMValueRef *wv, LLVMValueRef pw, LLVMValueRef pat)
{
	LLVMBuilderRef b = E->b;
	LLVMTypeRef vi = LLVMVectorType(E->i32, DOT_LANES), vf = LLVMVectorType(E->f32, DOT_LANES);
	LLVMTypeRef vbf = LLVMVectorType(LLVMBFloatTypeInContext(E->c), 2 * DOT_LANES);
	LLVMValueRef zero[DOT_LANES];
	for (int i = 0; i < DOT_LANES; i++)
		zero[i] = LLVMConstInt(E->i32, 0, 0);
	LLVMValueRef zmask = LLVMConstVector(zero, DOT_LANES);
	LLVMValueRef dp[DOT_BF16_ROWS], acc[DOT_BF16_ROWS];
	/* one base pointer each for the rows of dst and of A, the rows at constant offsets from it */
	LLVMValueRef d0 = cgl_elem_ptr(E, t->dbuf, LLVMBuildAdd(b, di, LLVMBuildMul(b, r0, LLVMConstInt(E->i64, (unsigned long long)cgl_drow(t), 0), ""), ""));
	LLVMValueRef a0 = cgl_elem_ptr(E, t->abuf, LLVMBuildAdd(b, ai,
		LLVMBuildAdd(b, LLVMBuildMul(b, r0, LLVMConstInt(E->i64, (unsigned long long)t->astride, 0), ""), k0, ""), ""));
	for (int q = 0; q < g; q++) {
		LLVMValueRef off = LLVMConstInt(E->i64, (unsigned long long)(q * cgl_drow(t)), 0);
		dp[q] = LLVMBuildInBoundsGEP2(b, E->f32, d0, &off, 1, "");
		acc[q] = LLVMBuildLoad2(b, vf, dp[q], "");
		LLVMSetAlignment(acc[q], 4);
	}
	for (int p = 0; p < DOT_LANES; p++) {
		LLVMValueRef w = wv ? wv[p] : wpair_packed(E, pw, pat, p);
		for (int q = 0; q < g; q++) {
			LLVMValueRef off = LLVMConstInt(E->i64, (unsigned long long)(q * t->astride + 2 * p), 0);
			LLVMValueRef a = LLVMBuildLoad2(b, E->i32, LLVMBuildInBoundsGEP2(b, E->i16, a0, &off, 1, ""), "");
			LLVMSetAlignment(a, 2);
			LLVMValueRef av = LLVMBuildInsertElement(b, LLVMGetUndef(vi), a, LLVMConstInt(E->i32, 0, 0), "");
			av = LLVMBuildShuffleVector(b, av, LLVMGetUndef(vi), zmask, "");
			LLVMValueRef args[3] = {acc[q], LLVMBuildBitCast(b, av, vbf, ""), w};
			acc[q] = LLVMBuildCall2(b, E->t_dpbf16, E->f_dpbf16, args, 3, "");
		}
	}
	for (int q = 0; q < g; q++) {
		LLVMValueRef stv = LLVMBuildStore(b, acc[q], dp[q]);
		LLVMSetAlignment(stv, 4);
	}
}

/* the DOT_LANES vectors of bf16 pairs of the step at k0 from W as stored:
 * the tile's rows as DOT_LANES x DOT_LANES pairs, transposed in registers */
static void wstep_rows(eml *E, const cg_dot *t, const LLVMValueRef *wrow, LLVMValueRef wi, LLVMValueRef k0,
	LLVMValueRef *wv)
{
	LLVMBuilderRef b = E->b;
	LLVMTypeRef vi = LLVMVectorType(E->i32, DOT_LANES);
	LLVMTypeRef vbf = LLVMVectorType(LLVMBFloatTypeInContext(E->c), 2 * DOT_LANES);
	prefetch_next_tile(E, t, E->i16, wi, k0);
	LLVMValueRef m[DOT_LANES], tt[DOT_LANES];
	for (int j = 0; j < DOT_LANES; j++) {
		LLVMValueRef v = LLVMBuildLoad2(b, vi, cgl_elem_ptr(E, t->wbuf, LLVMBuildAdd(b, wrow[j], k0, "")), "");
		LLVMSetAlignment(v, 2);
		m[j] = v;
	}
	LLVMValueRef *col = transpose16(E, m, tt);
	for (int p = 0; p < DOT_LANES; p++)
		wv[p] = LLVMBuildBitCast(b, col[p], vbf, "");
}

/* k in [0, K32) by vdpbf16ps: per step of 2 * DOT_LANES k, the tile's W as
 * DOT_LANES vectors of bf16 pairs (from W as stored, or from its packed copy
 * when pw is not NULL), then per row of A one vdpbf16ps per pair with that
 * pair of A broadcast; rows go by groups of DOT_BF16_ROWS, then one at a time. */
static void dot_bf16(eml *E, const cg_dot *t, LLVMValueRef rows, LLVMValueRef ai, LLVMValueRef wi, LLVMValueRef di,
	const LLVMValueRef *wrow, int64_t K32, LLVMValueRef pw)
{
	LLVMBuilderRef b = E->b;
	dloop lk;
	LLVMValueRef k0 = dloop_begin(E, &lk, LLVMConstInt(E->i64, 0, 0), LLVMConstInt(E->i64, (unsigned long long)K32, 0));
	LLVMValueRef wv[DOT_LANES], pat = NULL;
	if (pw) {
		pat = LLVMBuildAdd(b, wi, LLVMBuildMul(b, k0, LLVMConstInt(E->i64, DOT_LANES, 0), ""), "");
		prefetch_packed(E, pw, pat);
	} else {
		wstep_rows(E, t, wrow, wi, k0, wv);
	}
	/* rows [0, rows): groups of DOT_BF16_ROWS, then at most one group of
	 * each smaller power of two, so that a few rows left over still run as
	 * independent chains */
	LLVMValueRef lo = LLVMConstInt(E->i64, 0, 0);
	for (int g = pw ? DOT_BF16_ROWS : DOT_STORED_ROWS; g >= 1; g /= 2) {
		LLVMValueRef hi = LLVMBuildSub(b, rows, LLVMBuildSRem(b, rows, LLVMConstInt(E->i64, (unsigned long long)g, 0), ""), "");
		dloop lg;
		LLVMValueRef r = dloop_begin(E, &lg, lo, hi);
		dot_bf16_rows(E, t, r, g, ai, di, k0, pw ? NULL : wv, pw, pat);
		dloop_end(E, &lg, g);
		lo = hi;
	}
	dloop_end(E, &lk, 2 * DOT_LANES);
}

/* lanes == n whole tiles and wi the start of a tile of W: the packed copy
 * holds exactly these columns */
static LLVMValueRef whole_tiles(eml *E, const cg_dot *t, int64_t n, LLVMValueRef lanes, LLVMValueRef wi)
{
	LLVMBuilderRef b = E->b;
	return LLVMBuildAnd(b,
		LLVMBuildICmp(b, LLVMIntEQ, lanes, LLVMConstInt(E->i64, (unsigned long long)(n * DOT_LANES), 0), ""),
		LLVMBuildICmp(b, LLVMIntEQ,
			LLVMBuildSRem(b, wi, LLVMConstInt(E->i64, (unsigned long long)(DOT_LANES * t->K), 0), ""),
			LLVMConstInt(E->i64, 0, 0), ""),
		"");
}

/* K32 by vdpbf16ps from W's packed copy when this tile is a whole aligned
 * one (lanes == DOT_LANES, wi a multiple of DOT_LANES * K), else from W */
static void dot_bf16_either(eml *E, const cg_dot *t, LLVMValueRef rows, LLVMValueRef lanes, LLVMValueRef ai,
	LLVMValueRef wi, LLVMValueRef di, const LLVMValueRef *wrow, int64_t K32)
{
	LLVMBuilderRef b = E->b;
	int slot = E->wpack ? E->wpack[t->wbuf] : -1;
	if (slot < 0 || K32 != t->K) {
		dot_bf16(E, t, rows, ai, wi, di, wrow, K32, NULL);
		return;
	}
	LLVMValueRef ix = LLVMConstInt(E->i64, (unsigned long long)(E->p->nweights + (uint32_t)slot), 0);
	LLVMValueRef pw = LLVMBuildLoad2(b, E->ptr, LLVMBuildInBoundsGEP2(b, E->ptr, E->args[1], &ix, 1, ""), "");
	LLVMValueRef whole = whole_tiles(E, t, 1, lanes, wi);
	LLVMBasicBlockRef yes = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.packed");
	LLVMBasicBlockRef no = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.stored");
	LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.done");
	LLVMBuildCondBr(b, whole, yes, no);
	LLVMPositionBuilderAtEnd(b, yes);
	dot_bf16(E, t, rows, ai, wi, di, wrow, K32, pw);
	LLVMBuildBr(b, done);
	LLVMPositionBuilderAtEnd(b, no);
	dot_bf16(E, t, rows, ai, wi, di, wrow, K32, NULL);
	LLVMBuildBr(b, done);
	LLVMPositionBuilderAtEnd(b, done);
}

/* one tile of the statement's group (cgen.h, CS_DOT) */
static void dot_tile(eml *E, const cg_dot *t, LLVMValueRef rows, LLVMValueRef lanes, LLVMValueRef ai, LLVMValueRef wi,
	LLVMValueRef di)
{
	LLVMBuilderRef b = E->b;
	bool bf = E->p->bufs[t->wbuf].dtype == MOE_BF16;
	bool fast = E->bf16dot && bf && E->p->bufs[t->abuf].dtype == MOE_BF16;
	LLVMTypeRef welt = bf ? E->i16 : E->f32, vf = LLVMVectorType(E->f32, DOT_LANES);
	LLVMTypeRef vw = LLVMVectorType(welt, DOT_LANES);
	LLVMValueRef last = LLVMBuildSub(b, lanes, LLVMConstInt(E->i64, 1, 0), "");
	LLVMValueRef wrow[DOT_LANES]; /* element index of each lane's row of W */
	for (int j = 0; j < DOT_LANES; j++) {
		LLVMValueRef jj = LLVMConstInt(E->i64, (unsigned long long)j, 0);
		LLVMValueRef lane = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, jj, last, ""), jj, last, "");
		wrow[j] = LLVMBuildAdd(b, wi, LLVMBuildMul(b, lane, LLVMConstInt(E->i64, (unsigned long long)t->wstride, 0), ""), "");
	}
	{ /* every accumulator starts at -0.0 */
		dloop lr;
		LLVMValueRef r = dloop_begin(E, &lr, LLVMConstInt(E->i64, 0, 0), rows);
		LLVMValueRef di_r = LLVMBuildAdd(b, di, LLVMBuildMul(b, r, LLVMConstInt(E->i64, (unsigned long long)cgl_drow(t), 0), ""), "");
		LLVMValueRef st = LLVMBuildStore(b, LLVMBuildBitCast(b, splat32(E, E->i32, 0x80000000u), vf, ""),
			cgl_elem_ptr(E, t->dbuf, di_r));
		LLVMSetAlignment(st, 4);
		dloop_end(E, &lr, 1);
	}
	int64_t K0 = fast ? t->K / (2 * DOT_LANES) * (2 * DOT_LANES) : 0;
	if (K0 > 0)
		dot_bf16_either(E, t, rows, lanes, ai, wi, di, wrow, K0);
	int64_t K16 = t->K / DOT_LANES * DOT_LANES;
	if (K16 > K0) { /* DOT_LANES x DOT_LANES tiles of W, transposed in registers */
		dloop lk;
		LLVMValueRef k0 = dloop_begin(E, &lk, LLVMConstInt(E->i64, (unsigned long long)K0, 0),
			LLVMConstInt(E->i64, (unsigned long long)K16, 0));
		LLVMValueRef m[DOT_LANES], tt[DOT_LANES];
		prefetch_next_tile(E, t, welt, wi, k0);
		for (int j = 0; j < DOT_LANES; j++) {
			LLVMValueRef v = LLVMBuildLoad2(b, vw, cgl_elem_ptr(E, t->wbuf, LLVMBuildAdd(b, wrow[j], k0, "")), "");
			LLVMSetAlignment(v, bf ? 2 : 4);
			m[j] = dot_widen(E, v, bf);
		}
		LLVMValueRef *src = transpose16(E, m, tt);
		dot_rows(E, t, rows, ai, di, k0, src, DOT_LANES);
		dloop_end(E, &lk, DOT_LANES);
	}
	if (K16 < t->K) { /* the last k, one column at a time */
		dloop lk;
		LLVMValueRef k = dloop_begin(E, &lk, LLVMConstInt(E->i64, (unsigned long long)K16, 0),
			LLVMConstInt(E->i64, (unsigned long long)t->K, 0));
		LLVMValueRef v = LLVMGetUndef(vw);
		for (int j = 0; j < DOT_LANES; j++) {
			LLVMValueRef x = LLVMBuildLoad2(b, welt, cgl_elem_ptr(E, t->wbuf, LLVMBuildAdd(b, wrow[j], k, "")), "");
			v = LLVMBuildInsertElement(b, v, x, LLVMConstInt(E->i32, (unsigned long long)j, 0), "");
		}
		LLVMValueRef col = dot_widen(E, v, bf);
		dot_rows(E, t, rows, ai, di, k, &col, 1);
		dloop_end(E, &lk, 1);
	}
}


/* the group's tiles one at a time: tile u while lanes > u * DOT_LANES */
static void dot_tiles(eml *E, const cg_dot *t, int64_t G, LLVMValueRef rows, LLVMValueRef lanes, LLVMValueRef ai,
	LLVMValueRef wi, LLVMValueRef di)
{
	LLVMBuilderRef b = E->b;
	dloop lu;
	LLVMValueRef u = dloop_begin(E, &lu, LLVMConstInt(E->i64, 0, 0), LLVMConstInt(E->i64, (unsigned long long)G, 0));
	LLVMValueRef rest = LLVMBuildSub(b, lanes, LLVMBuildMul(b, u, LLVMConstInt(E->i64, DOT_LANES, 0), ""), "");
	LLVMBasicBlockRef yes = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.tile");
	LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(E->c, E->fn, "dot.tnext");
	LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSGT, rest, LLVMConstInt(E->i64, 0, 0), ""), yes, next);
	LLVMPositionBuilderAtEnd(b, yes);
	LLVMValueRef lu_n = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, rest, LLVMConstInt(E->i64, DOT_LANES, 0), ""),
		rest, LLVMConstInt(E->i64, DOT_LANES, 0), "");
	LLVMValueRef wi_u = LLVMBuildAdd(b, wi, LLVMBuildMul(b, u, LLVMConstInt(E->i64, (unsigned long long)(DOT_LANES * t->wstride), 0), ""), "");
	LLVMValueRef di_u = LLVMBuildAdd(b, di, LLVMBuildMul(b, u, LLVMConstInt(E->i64, (unsigned long long)t->dstep, 0), ""), "");
	dot_tile(E, t, rows, lu_n, ai, wi_u, di_u);
	LLVMBuildBr(b, next);
	LLVMPositionBuilderAtEnd(b, next);
	dloop_end(E, &lu, 1);
}

void cgl_dot(eml *E, const cg_dot *t)
{
	LLVMBuilderRef b = E->b;
	int64_t G = t->group > 1 ? t->group : 1;
	LLVMValueRef rows = cgl_ex(E, t->rows), lanes = cgl_ex(E, t->lanes), ai = cgl_ex(E, t->ai), wi = cgl_ex(E, t->wi),
		     di = cgl_ex(E, t->di);
	if (G == 1) {
		dot_tile(E, t, rows, lanes, ai, wi, di);
		return;
	}
	LLVMValueRef pw = cgl_dot_group_packed(E, t);
	if (!pw) {
		dot_tiles(E, t, G, rows, lanes, ai, wi, di);
		return;
	}
	/* a whole group of packed tiles: the register-blocked kernel (emit_dotg.c) */
	LLVMValueRef whole = whole_tiles(E, t, G, lanes, wi);
	LLVMBasicBlockRef yes = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.whole");
	LLVMBasicBlockRef no = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.tiles");
	LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.done");
	LLVMBuildCondBr(b, whole, yes, no);
	LLVMPositionBuilderAtEnd(b, yes);
	cgl_dot_group(E, t, G, rows, ai, wi, di, pw);
	LLVMBuildBr(b, done);
	LLVMPositionBuilderAtEnd(b, no);
	dot_tiles(E, t, G, rows, lanes, ai, wi, di);
	LLVMBuildBr(b, done);
	LLVMPositionBuilderAtEnd(b, done);
}
