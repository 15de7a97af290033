/* backend-c/emit_dotg.c: the register-blocked vdpbf16ps kernel for a whole
 * group of packed tiles (cgen.h, CS_DOT with group > 1; layout in pack.c).
 *
 * A tile alone needs one broadcast pair of A per vdpbf16ps: the loads, not
 * the dot products, bound it. Here each broadcast pair of a row of A feeds
 * the group's G tiles at once, and DOTG_ROWS rows share each loaded vector of
 * W pairs: DOTG_ROWS x G accumulators stay in registers over a block of
 * DOTG_KB k (per k pair G vector loads and DOTG_ROWS broadcasts for
 * DOTG_ROWS x G vdpbf16ps). The k blocks keep the group's W of a block
 * (G * DOT_LANES * DOTG_KB bf16, 32 KB) in L1 while the row groups reuse it.
 *
 * Every element is summed as by the single-tile vdpbf16ps kernel: from
 * -0.0, one vdpbf16ps per pair of k, pairs in ascending k, with the same
 * operands. Results are bitwise those of emit_dot.c's dot_bf16. */
#include "backend-c/emit_llvm_int.h"

enum { DOTG_ROWS = 6, DOTG_KB = 256, DOTG_MAXG = 4 };
/* row groups of at least this many rows prefetch W's next k block, or in the
 * last k block the next group's first, to L1; smaller ones (decode: a row or
 * two per expert) leave it to the hardware prefetcher. The n row groups of a
 * k block share the work: at k pair j of its pass, row group i prefetches
 * line j of each tile of the next block only when j % n == i, so every line
 * is asked for once and the requests are spread over the whole block instead
 * of all issued by the first row group (which left them to queue behind each
 * other: W streams from memory at T = 512). A branch per k pair skips the
 * prefetches of the other row groups' lines (pf_share; prefetching the line
 * being read instead, to keep the step free of branches, cost most of the
 * gain). */
enum { DOTG_PF_ROWS = 4 };

LLVMValueRef cgl_dot_group_packed(eml *E, const cg_dot *t)
{
	const cg_prog *p = E->p;
	int slot = E->wpack ? E->wpack[t->wbuf] : -1;
	if (!E->bf16dot || slot < 0 || p->bufs[t->wbuf].dtype != MOE_BF16 || p->bufs[t->abuf].dtype != MOE_BF16 ||
		t->K % (2 * DOT_LANES) != 0 || t->group > DOTG_MAXG)
		return NULL;
	LLVMValueRef ix = LLVMConstInt(E->i64, (unsigned long long)(p->nweights + (uint32_t)slot), 0);
	return LLVMBuildLoad2(E->b, E->ptr, LLVMBuildInBoundsGEP2(E->b, E->ptr, E->args[1], &ix, 1, ""), "");
}

static LLVMValueRef c64(eml *E, int64_t v)
{
	return LLVMConstInt(E->i64, (unsigned long long)v, 1);
}

static LLVMValueRef gep16(eml *E, LLVMTypeRef elt, LLVMValueRef base, int64_t off)
{
	LLVMValueRef o = c64(E, off);
	return LLVMBuildInBoundsGEP2(E->b, elt, base, &o, 1, "");
}

/* k pair p of a step: prefetch its lines of the G tiles at wpf to L1 when
 * c == gi. The test and the prefetches are one inline assembly statement: as
 * a branch in the IR it splits the step into blocks, and LLVM then sank the
 * step's vdpbf16ps below all of its loads and spilled them. */
static void pf_share(eml *E, const cg_dot *t, int G, int p, LLVMValueRef c, LLVMValueRef gi, LLVMValueRef wpf)
{
	char text[512];
	int at = snprintf(text, sizeof text, "cmpq $1, $0\n\tjne 1f");
	for (int u = 0; u < G; u++)
		at += snprintf(text + at, sizeof text - (size_t)at, "\n\tprefetcht0 %lld($2)",
			(long long)(2 * (u * DOT_LANES * t->K + p * 2 * DOT_LANES)));
	at += snprintf(text + at, sizeof text - (size_t)at, "\n1:");
	static const char cons[] = "r,r,r,~{dirflag},~{fpsr},~{flags}";
	LLVMTypeRef ty = LLVMFunctionType(LLVMVoidTypeInContext(E->c), (LLVMTypeRef[]){E->i64, E->i64, E->ptr}, 3, 0);
	LLVMValueRef fn = LLVMGetInlineAsm(ty, text, (size_t)at, cons, sizeof cons - 1, 1, 0, LLVMInlineAsmDialectATT, 0);
	LLVMBuildCall2(E->b, ty, fn, (LLVMValueRef[]){c, gi, wpf}, 3, "");
}

/* one step of 2 * DOT_LANES k at k0 for R rows: the accumulators acc[q * G + u] */
static void group_step(eml *E, const cg_dot *t, int G, int R, LLVMValueRef a0, LLVMValueRef pw, LLVMValueRef pat,
	LLVMValueRef k0, LLVMValueRef pfo, LLVMValueRef gi, LLVMValueRef ng, LLVMValueRef *acc)
{
	LLVMBuilderRef b = E->b;
	LLVMTypeRef vi = LLVMVectorType(E->i32, DOT_LANES);
	LLVMTypeRef vbf = LLVMVectorType(LLVMBFloatTypeInContext(E->c), 2 * DOT_LANES);
	LLVMValueRef zero[DOT_LANES];
	for (int i = 0; i < DOT_LANES; i++)
		zero[i] = LLVMConstInt(E->i32, 0, 0);
	LLVMValueRef zmask = LLVMConstVector(zero, DOT_LANES);
	LLVMValueRef ak = LLVMBuildInBoundsGEP2(b, E->i16, a0, &k0, 1, "");
	LLVMValueRef wp = LLVMBuildInBoundsGEP2(b, E->i16, pw, &pat, 1, "");
	LLVMValueRef wpf = LLVMBuildGEP2(b, E->i16, wp, &pfo, 1, ""); /* may point past W: only prefetched */
	/* c = j % ng for the step's k pair j = k0 / 2 + p, kept by increments */
	LLVMValueRef c = R >= DOTG_PF_ROWS ? LLVMBuildURem(b, LLVMBuildLShr(b, k0, c64(E, 1), ""), ng, "") : NULL;
	for (int p = 0; p < DOT_LANES; p++) {
		LLVMValueRef w[DOTG_MAXG];
		if (R >= DOTG_PF_ROWS) { /* this row group's share of the next k block's lines, to L1 (a hint: never faults) */
			if (p) {
				c = LLVMBuildAdd(b, c, c64(E, 1), "");
				c = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, c, ng, ""), c64(E, 0), c, "");
			}
			pf_share(E, t, G, p, c, gi, wpf);
		}
		for (int u = 0; u < G; u++) {
			LLVMValueRef v = LLVMBuildLoad2(b, vi, gep16(E, E->i16, wp, u * DOT_LANES * t->K + p * 2 * DOT_LANES), "");
			LLVMSetAlignment(v, 64);
			w[u] = LLVMBuildBitCast(b, v, vbf, "");
		}
		for (int q = 0; q < R; q++) {
			LLVMValueRef a = LLVMBuildLoad2(b, E->i32, gep16(E, E->i16, ak, q * t->astride + 2 * p), "");
			LLVMSetAlignment(a, 2);
			LLVMValueRef av = LLVMBuildInsertElement(b, LLVMGetUndef(vi), a, LLVMConstInt(E->i32, 0, 0), "");
			av = LLVMBuildBitCast(b, LLVMBuildShuffleVector(b, av, LLVMGetUndef(vi), zmask, ""), vbf, "");
			for (int u = 0; u < G; u++) {
				LLVMValueRef args[3] = {acc[q * G + u], av, w[u]};
				acc[q * G + u] = LLVMBuildCall2(b, E->t_dpbf16, E->f_dpbf16, args, 3, "");
			}
		}
	}
}

/* rows [r0, r0 + R), k in [kb, kend): accumulators loaded from dst, kept in
 * registers (phis) over the steps, stored back */
static void group_rows(eml *E, const cg_dot *t, int G, int R, LLVMValueRef r0, LLVMValueRef ai, LLVMValueRef wi,
	LLVMValueRef di, LLVMValueRef pw, LLVMValueRef kb, LLVMValueRef kend, LLVMValueRef pfo, LLVMValueRef gi,
	LLVMValueRef ng)
{
	LLVMBuilderRef b = E->b;
	LLVMTypeRef vf = LLVMVectorType(E->f32, DOT_LANES);
	LLVMValueRef d0 = cgl_elem_ptr(E, t->dbuf, LLVMBuildAdd(b, di, LLVMBuildMul(b, r0, c64(E, cgl_drow(t)), ""), ""));
	LLVMValueRef a0 = cgl_elem_ptr(E, t->abuf, LLVMBuildAdd(b, ai, LLVMBuildMul(b, r0, c64(E, t->astride), ""), ""));
	LLVMValueRef dp[DOTG_ROWS * DOTG_MAXG], init[DOTG_ROWS * DOTG_MAXG], acc[DOTG_ROWS * DOTG_MAXG];
	int n = R * G;
	for (int q = 0; q < R; q++)
		for (int u = 0; u < G; u++) {
			int i = q * G + u;
			dp[i] = gep16(E, E->f32, d0, u * t->dstep + q * cgl_drow(t));
			init[i] = LLVMBuildLoad2(b, vf, dp[i], "");
			LLVMSetAlignment(init[i], 4);
		}
	LLVMBasicBlockRef pre = LLVMGetInsertBlock(b);
	LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.k");
	LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.kbody");
	LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.kexit");
	LLVMBuildBr(b, head);
	LLVMPositionBuilderAtEnd(b, head);
	LLVMValueRef k0 = LLVMBuildPhi(b, E->i64, "");
	LLVMAddIncoming(k0, &kb, &pre, 1);
	LLVMValueRef phi[DOTG_ROWS * DOTG_MAXG];
	for (int i = 0; i < n; i++) {
		phi[i] = LLVMBuildPhi(b, vf, "");
		LLVMAddIncoming(phi[i], &init[i], &pre, 1);
		acc[i] = phi[i];
	}
	LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, k0, kend, ""), body, exit);
	LLVMPositionBuilderAtEnd(b, body);
	/* tile 0's step at k0 in the packed copy: wi + k0 * DOT_LANES (pack.c) */
	LLVMValueRef pat = LLVMBuildAdd(b, wi, LLVMBuildMul(b, k0, c64(E, DOT_LANES), ""), "");
	group_step(E, t, G, R, a0, pw, pat, k0, pfo, gi, ng, acc);
	LLVMValueRef next = LLVMBuildAdd(b, k0, c64(E, 2 * DOT_LANES), "");
	LLVMBasicBlockRef cur = LLVMGetInsertBlock(b);
	LLVMBuildBr(b, head);
	LLVMAddIncoming(k0, &next, &cur, 1);
	for (int i = 0; i < n; i++)
		LLVMAddIncoming(phi[i], &acc[i], &cur, 1);
	LLVMPositionBuilderAtEnd(b, exit);
	for (int i = 0; i < n; i++) {
		LLVMValueRef s = LLVMBuildStore(b, phi[i], dp[i]);
		LLVMSetAlignment(s, 4);
	}
}

void cgl_dot_group(eml *E, const cg_dot *t, int64_t G, LLVMValueRef rows, LLVMValueRef ai, LLVMValueRef wi,
	LLVMValueRef di, LLVMValueRef pw)
{
	LLVMBuilderRef b = E->b;
	LLVMValueRef mz[DOT_LANES];
	for (int i = 0; i < DOT_LANES; i++)
		mz[i] = LLVMConstReal(E->f32, -0.0);
	LLVMValueRef negz = LLVMConstVector(mz, DOT_LANES);
	{ /* every accumulator of the group starts at -0.0 */
		dloop lr;
		LLVMValueRef r = dloop_begin(E, &lr, c64(E, 0), rows);
		LLVMValueRef d0 = LLVMBuildAdd(b, di, LLVMBuildMul(b, r, c64(E, cgl_drow(t)), ""), "");
		for (int64_t u = 0; u < G; u++) {
			LLVMValueRef st = LLVMBuildStore(b, negz, cgl_elem_ptr(E, t->dbuf, LLVMBuildAdd(b, d0, c64(E, u * t->dstep), "")));
			LLVMSetAlignment(st, 4);
		}
		dloop_end(E, &lr, 1);
	}
	dloop lk;
	LLVMValueRef kb = dloop_begin(E, &lk, c64(E, 0), c64(E, t->K));
	LLVMValueRef kend = LLVMBuildAdd(b, kb, c64(E, DOTG_KB), "");
	kend = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, kend, c64(E, t->K), ""), kend, c64(E, t->K), "");
	/* what the row groups prefetch, relative to the W they read: the next k
	 * block; in the last block the next group's first block (its tiles follow
	 * in the packed copy: pack.c) */
	LLVMValueRef pfo = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, kend, c64(E, t->K), ""), c64(E, DOTG_KB * DOT_LANES),
		LLVMBuildSub(b, c64(E, G * DOT_LANES * t->K), LLVMBuildMul(b, kb, c64(E, DOT_LANES), ""), ""), "");
	/* rows in n = ceil(rows / DOTG_ROWS) groups of as even a size as can be:
	 * group i has base + (i < extra) rows, base = rows / n, extra = rows % n,
	 * so no group is left with a row or two when rows > DOTG_ROWS */
	LLVMValueRef n = LLVMBuildSDiv(b, LLVMBuildAdd(b, rows, c64(E, DOTG_ROWS - 1), ""), c64(E, DOTG_ROWS), "");
	LLVMValueRef nz = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSGT, n, c64(E, 0), ""), n, c64(E, 1), "");
	LLVMValueRef base = LLVMBuildSDiv(b, rows, nz, ""), extra = LLVMBuildSRem(b, rows, nz, "");
	dloop lg;
	LLVMValueRef i = dloop_begin(E, &lg, c64(E, 0), n);
	LLVMValueRef lt = LLVMBuildICmp(b, LLVMIntSLT, i, extra, "");
	LLVMValueRef size = LLVMBuildAdd(b, base, LLVMBuildZExt(b, lt, E->i64, ""), "");
	LLVMValueRef r0 = LLVMBuildAdd(b, LLVMBuildMul(b, i, base, ""),
		LLVMBuildSelect(b, lt, i, extra, ""), "");
	LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.join");
	LLVMValueRef sw = LLVMBuildSwitch(b, size, join, DOTG_ROWS);
	for (int R = 1; R <= DOTG_ROWS; R++) {
		LLVMBasicBlockRef cb = LLVMAppendBasicBlockInContext(E->c, E->fn, "dotg.rows");
		LLVMAddCase(sw, c64(E, R), cb);
		LLVMPositionBuilderAtEnd(b, cb);
		group_rows(E, t, (int)G, R, r0, ai, wi, di, pw, kb, kend, pfo, i, nz);
		LLVMBuildBr(b, join);
	}
	LLVMPositionBuilderAtEnd(b, join);
	dloop_end(E, &lg, 1);
	dloop_end(E, &lk, DOTG_KB);
}
