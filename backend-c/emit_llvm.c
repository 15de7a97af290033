/* backend-c/emit_llvm.c: kernel form -> LLVM IR through the LLVM 19 C API.
 *
 * The translation mirrors emit_c.c construct for construct: the same
 * operations in the same order, no fast-math flags and no contraction, so the
 * JIT and the C engine agree bit for bit. Variables are allocas promoted by
 * the optimiser. The module is verified, optimised with "default<O3>" for the
 * host CPU with LLVM's loop unroller off, then written (textual IR, object
 * file) or JIT-compiled with ORC LLJIT. Every LLVM error or message becomes a
 * diagnostic and is disposed. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/ErrorHandling.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Object.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <sys/stat.h>

#include "backend-c/emit_llvm_int.h"
#include "moec/backend.h"
#include "moec/io.h"

static void llvm_fatal(const char *reason);
static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;
static int llvm_init_failed;

static void llvm_init(void)
{
	/* the asm parser assembles the inline assembly of emit_dotg.c's prefetches */
	llvm_init_failed = LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter() || LLVMInitializeNativeAsmParser();
	LLVMInstallFatalErrorHandler(llvm_fatal);
}

static moe_status diag_err(moe_ctx *ctx, const char *what, LLVMErrorRef err)
{
	char *m = LLVMGetErrorMessage(err); /* consumes err */
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "LLVM: %s: %s", what, m ? m : "(no message)");
	LLVMDisposeErrorMessage(m);
	return MOE_ERR_INTERNAL;
}

static moe_status diag_msg(moe_ctx *ctx, const char *what, char *msg)
{
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "LLVM: %s: %s", what, msg ? msg : "(no message)");
	if (msg)
		LLVMDisposeMessage(msg);
	return MOE_ERR_INTERNAL;
}

/* A target machine for the host CPU; NULL with a diagnostic. */
static LLVMTargetMachineRef host_tm(moe_ctx *ctx)
{
	pthread_once(&llvm_once, llvm_init);
	if (llvm_init_failed) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "LLVM: the native target is not available");
		return NULL;
	}
	char *triple = LLVMGetDefaultTargetTriple(), *err = NULL;
	LLVMTargetRef t;
	if (LLVMGetTargetFromTriple(triple, &t, &err)) {
		diag_msg(ctx, "no target for the host triple", err);
		LLVMDisposeMessage(triple);
		return NULL;
	}
	char *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
	LLVMTargetMachineRef tm = LLVMCreateTargetMachine(t, triple, cpu, feat, LLVMCodeGenLevelAggressive,
		LLVMRelocPIC, LLVMCodeModelDefault);
	LLVMDisposeMessage(cpu);
	LLVMDisposeMessage(feat);
	LLVMDisposeMessage(triple);
	if (!tm)
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "LLVM: cannot create a target machine for the host");
	return tm;
}

/* Does the host CPU have AVX512-BF16 (cpuid, through LLVM's feature list)? */
static bool host_has_bf16dot(void)
{
	char *feat = LLVMGetHostCPUFeatures();
	bool yes = feat && strstr(feat, "+avx512bf16") != NULL;
	LLVMDisposeMessage(feat);
	return yes;
}

static void scratch_new(cg_prog *p, eml_scratch *s)
{
	for (int k = 0; k < 2; k++) {
		s->vars[k] = ctx_alloc(p->ctx, (p->nvars + 1) * sizeof *s->vars[k]);
		s->bufs[k] = ctx_alloc(p->ctx, (p->nbufs + 1) * sizeof *s->bufs[k]);
	}
	s->used = ctx_alloc(p->ctx, p->nvars + 1);
}

static void scratch_free(cg_prog *p, eml_scratch *s)
{
	for (int k = 0; k < 2; k++) {
		ctx_free(p->ctx, s->vars[k], 0);
		ctx_free(p->ctx, s->bufs[k], 0);
	}
	ctx_free(p->ctx, s->used, 0);
}

static LLVMTypeRef lty(eml *E, cg_ty t)
{
	return t == CT_I64 ? E->i64 : t == CT_I32 ? E->i32 : t == CT_F32 ? E->f32 : E->f64;
}

static LLVMTypeRef mty(eml *E, moe_dtype t)
{
	switch (t) {
	case MOE_F32: return E->f32;
	case MOE_BF16: return E->i16;
	case MOE_I32: return E->i32;
	default: return E->i8;
	}
}

/* a builder placed before the entry block's terminator */
static LLVMBuilderRef entry_builder(eml *E)
{
	LLVMBuilderRef b = LLVMCreateBuilderInContext(E->c);
	LLVMPositionBuilderBefore(b, LLVMGetBasicBlockTerminator(E->entry));
	return b;
}

static LLVMValueRef var_ptr(eml *E, int v)
{
	if (!E->vars[v]) {
		LLVMBuilderRef b = entry_builder(E);
		LLVMTypeRef t = lty(E, (cg_ty)E->p->vars[v].ty);
		E->vars[v] = LLVMBuildAlloca(b, t, "");
		LLVMBuildStore(b, LLVMConstNull(t), E->vars[v]);
		LLVMDisposeBuilder(b);
	}
	return E->vars[v];
}

static LLVMValueRef buf_base(eml *E, int i)
{
	if (!E->bufs[i]) {
		LLVMBuilderRef b = entry_builder(E);
		const cg_buf *bf = &E->p->bufs[i];
		if (bf->kind == CB_WORK) {
			LLVMValueRef off = LLVMConstInt(E->i64, (unsigned long long)bf->offset, 0);
			E->bufs[i] = LLVMBuildInBoundsGEP2(b, E->i8, E->args[3], &off, 1, "");
		} else {
			unsigned arg = bf->kind == CB_INPUT ? 0 : bf->kind == CB_WEIGHT ? 1 : 2;
			LLVMValueRef idx = LLVMConstInt(E->i64, bf->index, 0);
			LLVMValueRef slot = LLVMBuildInBoundsGEP2(b, E->ptr, E->args[arg], &idx, 1, "");
			E->bufs[i] = LLVMBuildLoad2(b, E->ptr, slot, "");
		}
		LLVMDisposeBuilder(b);
	}
	return E->bufs[i];
}

static LLVMValueRef elem_ptr(eml *E, int buf, LLVMValueRef idx)
{
	LLVMTypeRef t = mty(E, (moe_dtype)E->p->bufs[buf].dtype);
	return LLVMBuildInBoundsGEP2(E->b, t, buf_base(E, buf), &idx, 1, "");
}

static LLVMValueRef ci32(eml *E, uint32_t v)
{
	return LLVMConstInt(E->i32, v, 0);
}

static LLVMValueRef call1(eml *E, LLVMTypeRef ft, LLVMValueRef f, LLVMValueRef x)
{
	return LLVMBuildCall2(E->b, ft, f, &x, 1, "");
}

static LLVMValueRef bool32(eml *E, LLVMValueRef c)
{
	return LLVMBuildZExt(E->b, c, E->i32, "");
}

static LLVMValueRef is_nan(eml *E, LLVMValueRef x)
{
	return LLVMBuildFCmp(E->b, LLVMRealUNO, x, x, "");
}

static LLVMValueRef rbf16(eml *E, LLVMValueRef x)
{
	LLVMBuilderRef b = E->b;
	LLVMValueRef u = LLVMBuildBitCast(b, x, E->i32, "");
	LLVMValueRef nan = LLVMBuildICmp(b, LLVMIntUGT, LLVMBuildAnd(b, u, ci32(E, 0x7fffffffu), ""),
		ci32(E, 0x7f800000u), "");
	LLVMValueRef q = LLVMBuildAnd(b, LLVMBuildOr(b, u, ci32(E, 0x00400000u), ""), ci32(E, 0xffff0000u), "");
	LLVMValueRef lsb = LLVMBuildAnd(b, LLVMBuildLShr(b, u, ci32(E, 16), ""), ci32(E, 1), "");
	LLVMValueRef r = LLVMBuildAdd(b, LLVMBuildAdd(b, u, ci32(E, 0x7fffu), ""), lsb, "");
	r = LLVMBuildAnd(b, r, ci32(E, 0xffff0000u), "");
	return LLVMBuildBitCast(b, LLVMBuildSelect(b, nan, q, r, ""), E->f32, "");
}

/* bf16 bits (i16) to f32; a signalling NaN is quieted */
static LLVMValueRef widen_bf16(eml *E, LLVMValueRef v)
{
	LLVMBuilderRef b = E->b;
	LLVMValueRef h = LLVMBuildZExt(b, v, E->i32, "");
	LLVMValueRef snan = LLVMBuildICmp(b, LLVMIntUGT, LLVMBuildAnd(b, h, ci32(E, 0x7fffu), ""), ci32(E, 0x7f80u), "");
	LLVMValueRef u = LLVMBuildShl(b, h, ci32(E, 16), "");
	u = LLVMBuildOr(b, u, LLVMBuildSelect(b, snan, ci32(E, 0x00400000u), ci32(E, 0), ""), "");
	return LLVMBuildBitCast(b, u, E->f32, "");
}

static LLVMValueRef ex(eml *E, const cg_expr *e);

static LLVMValueRef minmax(eml *E, bool max, LLVMValueRef a, LLVMValueRef bb, cg_ty t)
{
	LLVMBuilderRef b = E->b;
	if (t == CT_F32) {
		LLVMValueRef pick = LLVMBuildSelect(b, LLVMBuildFCmp(b, max ? LLVMRealOGT : LLVMRealOLT, bb, a, ""), bb, a, "");
		pick = LLVMBuildSelect(b, is_nan(E, bb), bb, pick, "");
		return LLVMBuildSelect(b, is_nan(E, a), a, pick, "");
	}
	return LLVMBuildSelect(b, LLVMBuildICmp(b, max ? LLVMIntSGT : LLVMIntSLT, bb, a, ""), bb, a, "");
}

/* Scoped alias metadata for lookup tables (cg_buf.table): a table's loads are
 * in the table scope, every other buffer access is noalias with it. A table
 * has a workspace slice of its own and is read only after its fill loop, so
 * this is true; it lets LLVM vectorise a loop that looks a table up by a
 * computed index (the SwiGLU's sigmoid), whose accesses it cannot bound. */
static void alias_md(eml *E, LLVMValueRef inst, int buf)
{
	const cg_buf *bf = &E->p->bufs[buf];
	if (bf->table)
		LLVMSetMetadata(inst, E->md_scope, E->tab_scope);
	else
		LLVMSetMetadata(inst, E->md_noalias, E->tab_scope);
}

static void alias_md_init(eml *E)
{
	LLVMMetadataRef dn = LLVMMDStringInContext2(E->c, "moec.workspace", 14);
	LLVMMetadataRef dom = LLVMMDNodeInContext2(E->c, &dn, 1);
	LLVMMetadataRef so[2] = {LLVMMDStringInContext2(E->c, "moec.tables", 11), dom};
	LLVMMetadataRef scope = LLVMMDNodeInContext2(E->c, so, 2);
	E->tab_scope = LLVMMetadataAsValue(E->c, LLVMMDNodeInContext2(E->c, &scope, 1));
	E->md_scope = LLVMGetMDKindIDInContext(E->c, "alias.scope", 11);
	E->md_noalias = LLVMGetMDKindIDInContext(E->c, "noalias", 7);
}

static LLVMValueRef ex(eml *E, const cg_expr *e)
{
	LLVMBuilderRef b = E->b;
	cg_ty t = (cg_ty)e->ty;
	bool fl;
	LLVMValueRef x, y;
	switch ((cg_eop)e->op) {
	case CE_ICONST: return LLVMConstInt(lty(E, t), (unsigned long long)e->i, 1);
	case CE_FCONST: {
		if (t == CT_F64) {
			uint64_t u;
			memcpy(&u, &e->d, 8);
			return LLVMConstBitCast(LLVMConstInt(E->i64, u, 0), E->f64);
		}
		float f = (float)e->d;
		uint32_t u;
		memcpy(&u, &f, 4);
		return LLVMConstBitCast(LLVMConstInt(E->i32, u, 0), E->f32);
	}
	case CE_VAR: return LLVMBuildLoad2(b, lty(E, t), var_ptr(E, e->var), "");
	case CE_LOAD: {
		moe_dtype dt = (moe_dtype)E->p->bufs[e->buf].dtype;
		LLVMValueRef v = LLVMBuildLoad2(b, mty(E, dt), elem_ptr(E, e->buf, ex(E, e->a)), "");
		alias_md(E, v, e->buf);
		if (dt == MOE_BF16)
			return widen_bf16(E, v);
		if (dt == MOE_BOOL || moe_dtype_is_storage(dt)) /* raw bytes load as their i32 value */
			return LLVMBuildZExt(b, v, E->i32, "");
		return v;
	}
	default: break;
	}
	x = ex(E, e->a);
	fl = e->a->ty == CT_F32 || e->a->ty == CT_F64;
	int w = t == CT_F64;
	switch ((cg_eop)e->op) {
	case CE_NEG: return fl ? LLVMBuildFNeg(b, x, "") : LLVMBuildSub(b, LLVMConstInt(lty(E, t), 0, 0), x, "");
	case CE_ABS:
		if (fl)
			return call1(E, E->t_f1[w], E->f_fabs[w], x);
		return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, x, LLVMConstInt(E->i32, 0, 0), ""),
			LLVMBuildSub(b, LLVMConstInt(E->i32, 0, 0), x, ""), x, "");
	case CE_NOT: return LLVMBuildNot(b, x, "");
	case CE_EXP: return call1(E, E->t_f1[w], E->f_exp[w], x);
	case CE_LOG: return call1(E, E->t_f1[w], E->f_log[w], x);
	case CE_SQRT: return call1(E, E->t_f1[w], E->f_sqrt[w], x);
	case CE_TANH: return call1(E, E->t_f1[w], E->f_tanh[w], x);
	case CE_ERF: return call1(E, E->t_f1[w], E->f_erf[w], x);
	case CE_RBF16: return rbf16(E, x);
	case CE_ISNAN: return bool32(E, is_nan(E, x));
	case CE_BITS: return LLVMBuildBitCast(b, x, lty(E, t), "");
	case CE_CONV:
		if (e->a->ty == CT_F32 && t == CT_F64)
			return LLVMBuildFPExt(b, x, E->f64, "");
		if (e->a->ty == CT_F64 && t == CT_F32)
			return LLVMBuildFPTrunc(b, x, E->f32, "");
		if (e->a->ty == CT_F32)
			return call1(E, E->t_sat, E->f_sat, x);
		IR_ASSERT(e->a->ty != CT_F64);
		if (t == CT_F32 || t == CT_F64)
			return LLVMBuildSIToFP(b, x, lty(E, t), "");
		if (t == CT_I64)
			return LLVMBuildSExt(b, x, E->i64, "");
		return LLVMBuildTrunc(b, x, E->i32, "");
	case CE_SELECT: {
		LLVMValueRef c = LLVMBuildICmp(b, LLVMIntNE, x, ci32(E, 0), "");
		LLVMValueRef p = ex(E, e->b), q = ex(E, e->c);
		return LLVMBuildSelect(b, c, p, q, "");
	}
	default: break;
	}
	y = ex(E, e->b);
	switch ((cg_eop)e->op) {
	case CE_ADD: return fl ? LLVMBuildFAdd(b, x, y, "") : LLVMBuildAdd(b, x, y, "");
	case CE_SUB: return fl ? LLVMBuildFSub(b, x, y, "") : LLVMBuildSub(b, x, y, "");
	case CE_MUL: return fl ? LLVMBuildFMul(b, x, y, "") : LLVMBuildMul(b, x, y, "");
	case CE_FDIV: return LLVMBuildFDiv(b, x, y, "");
	case CE_SDIV: {
		/* y != 0 checked by the caller; y == -1 gives the wrapping negation */
		LLVMValueRef m1 = LLVMBuildICmp(b, LLVMIntEQ, y, LLVMConstInt(E->i32, (unsigned long long)-1, 1), "");
		LLVMValueRef d = LLVMBuildSelect(b, m1, ci32(E, 1), y, "");
		LLVMValueRef q = LLVMBuildSDiv(b, x, d, "");
		return LLVMBuildSelect(b, m1, LLVMBuildSub(b, ci32(E, 0), x, ""), q, "");
	}
	case CE_SREM: return LLVMBuildSRem(b, x, y, "");
	case CE_AND: return LLVMBuildAnd(b, x, y, "");
	case CE_OR: return LLVMBuildOr(b, x, y, "");
	case CE_XOR: return LLVMBuildXor(b, x, y, "");
	case CE_SHL: return LLVMBuildShl(b, x, LLVMBuildAnd(b, y, ci32(E, 31), ""), "");
	case CE_LSHR: return LLVMBuildLShr(b, x, LLVMBuildAnd(b, y, ci32(E, 31), ""), "");
	case CE_ASHR: return LLVMBuildAShr(b, x, LLVMBuildAnd(b, y, ci32(E, 31), ""), "");
	case CE_MIN: return minmax(E, false, x, y, t);
	case CE_MAX: return minmax(E, true, x, y, t);
	case CE_EQ: return bool32(E, fl ? LLVMBuildFCmp(b, LLVMRealOEQ, x, y, "") : LLVMBuildICmp(b, LLVMIntEQ, x, y, ""));
	case CE_NE: return bool32(E, fl ? LLVMBuildFCmp(b, LLVMRealUNE, x, y, "") : LLVMBuildICmp(b, LLVMIntNE, x, y, ""));
	case CE_LT: return bool32(E, fl ? LLVMBuildFCmp(b, LLVMRealOLT, x, y, "") : LLVMBuildICmp(b, LLVMIntSLT, x, y, ""));
	case CE_LE: return bool32(E, fl ? LLVMBuildFCmp(b, LLVMRealOLE, x, y, "") : LLVMBuildICmp(b, LLVMIntSLE, x, y, ""));
	case CE_GT: return bool32(E, fl ? LLVMBuildFCmp(b, LLVMRealOGT, x, y, "") : LLVMBuildICmp(b, LLVMIntSGT, x, y, ""));
	case CE_GE: return bool32(E, fl ? LLVMBuildFCmp(b, LLVMRealOGE, x, y, "") : LLVMBuildICmp(b, LLVMIntSGE, x, y, ""));
	default: break;
	}
	IR_ASSERT(!"unknown expression");
	return NULL;
}

static void block(eml *E, const cg_block *blk);

static LLVMBasicBlockRef bb(eml *E, const char *name)
{
	return LLVMAppendBasicBlockInContext(E->c, E->fn, name);
}

/* branch to `to` unless the current block already ends */
static void br(eml *E, LLVMBasicBlockRef to)
{
	if (!LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(E->b)))
		LLVMBuildBr(E->b, to);
}

/* for (var = lo; var < hi; var++) body, hi a value (hv) or an expression
 * evaluated before every iteration (he) */
static void for_loop(eml *E, int v, LLVMValueRef lo, LLVMValueRef hv, const cg_expr *he, const cg_block *body)
{
	LLVMBuilderRef b = E->b;
	LLVMValueRef var = var_ptr(E, v);
	LLVMBuildStore(b, lo, var);
	LLVMBasicBlockRef cond = bb(E, "for.cond"), bod = bb(E, "for.body"), done = bb(E, "for.end");
	LLVMBuildBr(b, cond);
	LLVMPositionBuilderAtEnd(b, cond);
	LLVMValueRef i = LLVMBuildLoad2(b, E->i64, var, "");
	LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, i, hv ? hv : ex(E, he), ""), bod, done);
	LLVMPositionBuilderAtEnd(b, bod);
	block(E, body);
	if (!LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(b))) {
		LLVMValueRef j = LLVMBuildLoad2(b, E->i64, var, "");
		LLVMBuildStore(b, LLVMBuildAdd(b, j, LLVMConstInt(E->i64, 1, 0), ""), var);
		LLVMBuildBr(b, cond);
	}
	LLVMPositionBuilderAtEnd(b, done);
}

/* ---- parallel loops: the body becomes a function run over the thread pool ---- */

/* Marks the variables an expression reads. */
static void mark_expr(const cg_expr *e, uint8_t *used)
{
	for (; e; e = e->c) {
		if (e->op == CE_VAR)
			used[e->var] = 1;
		mark_expr(e->a, used);
		mark_expr(e->b, used);
	}
}

/* Marks the variables a block uses; false if it can fault. */
static bool mark_block(const cg_block *blk, uint8_t *used)
{
	bool ok = true;
	for (const cg_stmt *s = blk->first; s; s = s->next) {
		if (s->kind == CS_FAULT)
			return false;
		if (s->var >= 0)
			used[s->var] = 1;
		mark_expr(s->a, used);
		mark_expr(s->b, used);
		if (s->dot) {
			const cg_dot *d = s->dot;
			mark_expr(d->rows, used);
			mark_expr(d->lanes, used);
			mark_expr(d->ai, used);
			mark_expr(d->wi, used);
			mark_expr(d->di, used);
		}
		ok = ok && mark_block(&s->body, used) && mark_block(&s->els, used);
	}
	return ok;
}

/* Starts function f: an entry block (allocas, buffer pointers) that falls
 * through to the code. */
static void begin_function(eml *E, LLVMValueRef f)
{
	E->fn = f;
	E->entry = LLVMAppendBasicBlockInContext(E->c, f, "entry");
	LLVMBasicBlockRef start = LLVMAppendBasicBlockInContext(E->c, f, "start");
	LLVMPositionBuilderAtEnd(E->b, E->entry);
	LLVMBuildBr(E->b, start);
	LLVMPositionBuilderAtEnd(E->b, start);
	memset(E->vars, 0, E->p->nvars * sizeof *E->vars);
	memset(E->bufs, 0, E->p->nbufs * sizeof *E->bufs);
}

/* Builds `void body(env, lo, hi)` running iterations [lo, hi) of loop s. The
 * environment holds the four layer arguments, then the variables in `used`,
 * in id order, one 8-byte slot each. */
static LLVMValueRef outline_body(eml *E, const cg_stmt *s, const uint8_t *used)
{
	cg_prog *p = E->p;
	char sym[200], name[240];
	cgen_symbol(p, NULL, sym, sizeof sym);
	snprintf(name, sizeof name, "%s.par%d", sym, E->npar++);
	LLVMTypeRef pt[3] = {E->ptr, E->i64, E->i64};
	LLVMValueRef f = LLVMAddFunction(E->m, name, LLVMFunctionType(LLVMVoidTypeInContext(E->c), pt, 3, 0));
	LLVMSetLinkage(f, LLVMInternalLinkage);
	unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
	LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(E->c, nounwind, 0));
	eml saved = *E;
	E->b = LLVMCreateBuilderInContext(E->c);
	E->vars = E->sc->vars[1];
	E->bufs = E->sc->bufs[1];
	memset(E->vars, 0, (p->nvars + 1) * sizeof *E->vars);
	memset(E->bufs, 0, (p->nbufs + 1) * sizeof *E->bufs);
	E->par = NULL;
	begin_function(E, f);
	LLVMBuilderRef eb = entry_builder(E);
	LLVMValueRef env = LLVMGetParam(f, 0);
	for (unsigned i = 0; i < 4; i++) {
		LLVMValueRef ix = LLVMConstInt(E->i64, i, 0);
		E->args[i] = LLVMBuildLoad2(eb, E->ptr, LLVMBuildInBoundsGEP2(eb, E->i64, env, &ix, 1, ""), "");
	}
	unsigned slot = 4;
	for (uint32_t v = 0; v < p->nvars; v++) {
		if (!used[v])
			continue;
		LLVMTypeRef t = lty(E, (cg_ty)p->vars[v].ty);
		LLVMValueRef ix = LLVMConstInt(E->i64, slot++, 0);
		E->vars[v] = LLVMBuildAlloca(eb, t, "");
		LLVMBuildStore(eb, LLVMBuildLoad2(eb, t, LLVMBuildInBoundsGEP2(eb, E->i64, env, &ix, 1, ""), ""), E->vars[v]);
	}
	LLVMDisposeBuilder(eb);
	for_loop(E, s->var, LLVMGetParam(f, 1), LLVMGetParam(f, 2), NULL, &s->body);
	LLVMBuildRetVoid(E->b);
	LLVMDisposeBuilder(E->b);
	int npar = E->npar;
	*E = saved;
	E->npar = npar;
	return f;
}

/* Emits parallel loop s as a call of par->run (or of its body directly when
 * the caller passed no cgen_par); false when s cannot be outlined. */
static bool outline(eml *E, const cg_stmt *s)
{
	cg_prog *p = E->p;
	uint8_t *used = E->sc->used;
	memset(used, 0, p->nvars + 1);
	bool ok = mark_block(&s->body, used);
	used[s->var] = 0;
	if (!ok)
		return false;
	LLVMBuilderRef b = E->b;
	LLVMValueRef lo = ex(E, s->a), hi = ex(E, s->b);
	unsigned n = 4;
	for (uint32_t v = 0; v < p->nvars; v++)
		n += used[v];
	LLVMBuilderRef eb = entry_builder(E);
	LLVMValueRef env = LLVMBuildAlloca(eb, LLVMArrayType(E->i64, n), "env");
	LLVMDisposeBuilder(eb);
	unsigned slot = 0;
	for (; slot < 4; slot++) {
		LLVMValueRef ix = LLVMConstInt(E->i64, slot, 0);
		LLVMBuildStore(b, E->args[slot], LLVMBuildInBoundsGEP2(b, E->i64, env, &ix, 1, ""));
	}
	for (uint32_t v = 0; v < p->nvars; v++) {
		if (!used[v])
			continue;
		LLVMValueRef ix = LLVMConstInt(E->i64, slot++, 0);
		LLVMValueRef x = LLVMBuildLoad2(b, lty(E, (cg_ty)p->vars[v].ty), var_ptr(E, v), "");
		LLVMBuildStore(b, x, LLVMBuildInBoundsGEP2(b, E->i64, env, &ix, 1, ""));
	}
	LLVMValueRef f = outline_body(E, s, used);
	LLVMTypeRef pt[3] = {E->ptr, E->i64, E->i64};
	LLVMTypeRef bodyt = LLVMFunctionType(LLVMVoidTypeInContext(E->c), pt, 3, 0);
	LLVMTypeRef rt[5] = {E->ptr, E->ptr, E->ptr, E->i64, E->i64};
	LLVMTypeRef runt = LLVMFunctionType(LLVMVoidTypeInContext(E->c), rt, 5, 0);
	LLVMBasicBlockRef direct = bb(E, "par.direct"), pool = bb(E, "par.pool"), done = bb(E, "par.done");
	LLVMBuildCondBr(b, LLVMBuildIsNull(b, E->par, ""), direct, pool);
	LLVMPositionBuilderAtEnd(b, direct);
	LLVMValueRef da[3] = {env, lo, hi};
	LLVMBuildCall2(b, bodyt, f, da, 3, "");
	LLVMBuildBr(b, done);
	LLVMPositionBuilderAtEnd(b, pool);
	LLVMValueRef one = LLVMConstInt(E->i64, 1, 0);
	LLVMValueRef run = LLVMBuildLoad2(b, E->ptr, E->par, "");
	LLVMValueRef pp = LLVMBuildLoad2(b, E->ptr, LLVMBuildInBoundsGEP2(b, E->ptr, E->par, &one, 1, ""), "");
	LLVMValueRef ra[5] = {pp, f, env, lo, hi};
	LLVMBuildCall2(b, runt, run, ra, 5, "");
	LLVMBuildBr(b, done);
	LLVMPositionBuilderAtEnd(b, done);
	return true;
}

static void stmt(eml *E, const cg_stmt *s)
{
	LLVMBuilderRef b = E->b;
	switch ((cg_sk)s->kind) {
	case CS_SET: LLVMBuildStore(b, ex(E, s->a), var_ptr(E, s->var)); break;
	case CS_STORE: {
		moe_dtype dt = (moe_dtype)E->p->bufs[s->buf].dtype;
		LLVMValueRef v = ex(E, s->b);
		if (dt == MOE_BF16)
			v = LLVMBuildTrunc(b, LLVMBuildLShr(b, LLVMBuildBitCast(b, v, E->i32, ""), ci32(E, 16), ""), E->i16, "");
		else if (dt == MOE_BOOL || moe_dtype_is_storage(dt))
			v = LLVMBuildTrunc(b, v, E->i8, "");
		alias_md(E, LLVMBuildStore(b, v, elem_ptr(E, s->buf, ex(E, s->a))), s->buf);
		break;
	}
	case CS_FOR:
		if (s->par && E->par && outline(E, s))
			break;
		for_loop(E, s->var, ex(E, s->a), NULL, s->b, &s->body);
		break;
	case CS_IF: {
		LLVMBasicBlockRef th = bb(E, "if.then"), el = bb(E, "if.else"), done = bb(E, "if.end");
		LLVMValueRef c = LLVMBuildICmp(b, LLVMIntNE, ex(E, s->a), ci32(E, 0), "");
		LLVMBuildCondBr(b, c, th, el);
		LLVMPositionBuilderAtEnd(b, th);
		block(E, &s->body);
		br(E, done);
		LLVMPositionBuilderAtEnd(b, el);
		block(E, &s->els);
		br(E, done);
		LLVMPositionBuilderAtEnd(b, done);
		break;
	}
	case CS_FAULT:
		LLVMBuildRet(b, ci32(E, (uint32_t)s->code));
		LLVMPositionBuilderAtEnd(b, bb(E, "dead"));
		break;
	case CS_DOT: cgl_dot(E, s->dot); break;
	}
}

static void block(eml *E, const cg_block *blk)
{
	for (const cg_stmt *s = blk->first; s; s = s->next)
		stmt(E, s);
}

static LLVMValueRef declare(eml *E, const char *name, LLVMTypeRef ft)
{
	LLVMValueRef f = LLVMGetNamedFunction(E->m, name);
	return f ? f : LLVMAddFunction(E->m, name, ft);
}

/* Builds the module for p in context c; NULL with a diagnostic. */
static LLVMModuleRef build_module(cg_prog *p, eml_scratch *sc, LLVMContextRef c, LLVMTargetMachineRef tm,
	bool bf16dot, const int *wpack)
{
	eml E0 = {0}, *E = &E0;
	E->sc = sc;
	E->p = p;
	E->c = c;
	E->bf16dot = bf16dot;
	E->wpack = bf16dot ? wpack : NULL;
	alias_md_init(E);
	E->m = LLVMModuleCreateWithNameInContext(p->cname, c);
	char *triple = LLVMGetTargetMachineTriple(tm);
	LLVMSetTarget(E->m, triple);
	LLVMDisposeMessage(triple);
	LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
	LLVMSetModuleDataLayout(E->m, td);
	LLVMDisposeTargetData(td);
	E->i1 = LLVMInt1TypeInContext(c);
	E->i8 = LLVMInt8TypeInContext(c);
	E->i16 = LLVMInt16TypeInContext(c);
	E->i32 = LLVMInt32TypeInContext(c);
	E->i64 = LLVMInt64TypeInContext(c);
	E->f32 = LLVMFloatTypeInContext(c);
	E->f64 = LLVMDoubleTypeInContext(c);
	E->ptr = LLVMPointerTypeInContext(c, 0);
	E->b = LLVMCreateBuilderInContext(c);
	E->t_f1[0] = LLVMFunctionType(E->f32, &E->f32, 1, 0);
	E->t_f1[1] = LLVMFunctionType(E->f64, &E->f64, 1, 0);
	E->t_sat = LLVMFunctionType(E->i32, &E->f32, 1, 0);
	static const char *const names[6][2] = {{"expf", "exp"}, {"logf", "log"}, {"tanhf", "tanh"}, {"erff", "erf"},
		{"llvm.sqrt.f32", "llvm.sqrt.f64"}, {"llvm.fabs.f32", "llvm.fabs.f64"}};
	for (int w = 0; w < 2; w++) {
		E->f_exp[w] = declare(E, names[0][w], E->t_f1[w]);
		E->f_log[w] = declare(E, names[1][w], E->t_f1[w]);
		E->f_tanh[w] = declare(E, names[2][w], E->t_f1[w]);
		E->f_erf[w] = declare(E, names[3][w], E->t_f1[w]);
		E->f_sqrt[w] = declare(E, names[4][w], E->t_f1[w]);
		E->f_fabs[w] = declare(E, names[5][w], E->t_f1[w]);
	}
	E->f_sat = declare(E, "llvm.fptosi.sat.i32.f32", E->t_sat);
	LLVMTypeRef pf[4] = {E->ptr, E->i32, E->i32, E->i32};
	E->t_prefetch = LLVMFunctionType(LLVMVoidTypeInContext(c), pf, 4, 0);
	E->f_prefetch = declare(E, "llvm.prefetch.p0", E->t_prefetch);
	if (E->bf16dot) {
		LLVMTypeRef vf = LLVMVectorType(E->f32, DOT_LANES), vbf = LLVMVectorType(LLVMBFloatTypeInContext(c), 2 * DOT_LANES);
		LLVMTypeRef dp[3] = {vf, vbf, vbf};
		E->t_dpbf16 = LLVMFunctionType(vf, dp, 3, 0);
		E->f_dpbf16 = declare(E, "llvm.x86.avx512bf16.dpbf16ps.512", E->t_dpbf16);
	}

	char sym[200];
	/* size_t moe_L_workspace_size(void) */
	cgen_symbol(p, "_workspace_size", sym, sizeof sym);
	LLVMValueRef wf = LLVMAddFunction(E->m, sym, LLVMFunctionType(E->i64, NULL, 0, 0));
	LLVMPositionBuilderAtEnd(E->b, LLVMAppendBasicBlockInContext(c, wf, "entry"));
	LLVMBuildRet(E->b, LLVMConstInt(E->i64, (unsigned long long)p->workspace, 0));

	/* int moe_L_par(const void *const *in, const void *const *w, void *const *out, void *ws,
	 *               const cgen_par *par) */
	LLVMTypeRef params[5] = {E->ptr, E->ptr, E->ptr, E->ptr, E->ptr};
	unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
	cgen_symbol(p, "_par", sym, sizeof sym);
	LLVMTypeRef part = LLVMFunctionType(E->i32, params, 5, 0);
	LLVMValueRef pfn = LLVMAddFunction(E->m, sym, part);
	LLVMAddAttributeAtIndex(pfn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(c, nounwind, 0));
	E->vars = sc->vars[0];
	E->bufs = sc->bufs[0];
	begin_function(E, pfn);
	for (unsigned i = 0; i < 4; i++)
		E->args[i] = LLVMGetParam(pfn, i);
	E->par = LLVMGetParam(pfn, 4);
	block(E, &p->body);
	if (!LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(E->b)))
		LLVMBuildRet(E->b, ci32(E, 0));
	/* int moe_L(in, w, out, ws): moe_L_par without a thread pool */
	cgen_symbol(p, NULL, sym, sizeof sym);
	LLVMValueRef lf = LLVMAddFunction(E->m, sym, LLVMFunctionType(E->i32, params, 4, 0));
	LLVMAddAttributeAtIndex(lf, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(c, nounwind, 0));
	LLVMPositionBuilderAtEnd(E->b, LLVMAppendBasicBlockInContext(c, lf, "entry"));
	LLVMValueRef a5[5];
	for (unsigned i = 0; i < 4; i++)
		a5[i] = LLVMGetParam(lf, i);
	a5[4] = LLVMConstNull(E->ptr);
	LLVMBuildRet(E->b, LLVMBuildCall2(E->b, part, pfn, a5, 5, ""));
	LLVMDisposeBuilder(E->b);

	char *msg = NULL;
	if (LLVMVerifyModule(E->m, LLVMReturnStatusAction, &msg)) {
		diag_msg(p->ctx, "the generated module does not verify", msg);
		LLVMDisposeModule(E->m);
		return NULL;
	}
	if (msg)
		LLVMDisposeMessage(msg);
	return E->m;
}

static moe_status optimize(cg_prog *p, LLVMModuleRef m, LLVMTargetMachineRef tm)
{
	LLVMPassBuilderOptionsRef o = LLVMCreatePassBuilderOptions();
	LLVMPassBuilderOptionsSetLoopVectorization(o, 1);
	LLVMPassBuilderOptionsSetSLPVectorization(o, 1);
	/* The hot loops are tiled by the kernel form already; LLVM's unroller
	 * only multiplied small constant-trip loops (T = 1 routing), which took
	 * compile time from 0.4 s to 1.9 s with no measurable gain at run time
	 * (Qwen3-30B-A3B bf16, T = 1, 32, 512). The vectoriser still interleaves. */
	LLVMPassBuilderOptionsSetLoopUnrolling(o, 0);
	LLVMErrorRef err = LLVMRunPasses(m, "default<O3>", tm, o);
	LLVMDisposePassBuilderOptions(o);
	if (err)
		return diag_err(p->ctx, "optimisation failed", err);
	return MOE_OK;
}

/* A module ready for code generation, with the target machine it was
 * optimised for. */
static moe_status make_module(cg_prog *p, eml_scratch *sc, LLVMContextRef c, bool bf16dot, const int *wpack,
	LLVMModuleRef *m,
	LLVMTargetMachineRef *tm)
{
	*m = NULL;
	*tm = host_tm(p->ctx);
	if (!*tm)
		return MOE_ERR_UNSUPPORTED;
	*m = build_module(p, sc, c, *tm, bf16dot, wpack);
	moe_status s = *m ? optimize(p, *m, *tm) : MOE_ERR_INTERNAL;
	if (s) {
		if (*m)
			LLVMDisposeModule(*m);
		LLVMDisposeTargetMachine(*tm);
		*m = NULL;
		*tm = NULL;
	}
	return s;
}

/* LLVM's fatal-error handler: an I/O or code generation failure inside LLVM
 * ends the process, but first this says why and removes moec's temporaries
 * (LLVM then exits). */
static void llvm_fatal(const char *reason)
{
	moe_remove_temporaries();
	fprintf(stderr, "moec: error: LLVM: %s\n", reason ? reason : "fatal error");
}

/* The module is generated into memory and written through the output module,
 * so that nothing exists at or beside path before code generation has
 * finished and no LLVM file stream can fail inside LLVM. */
/* The LLVM objects alive while the output is written (which may throw). */
typedef struct llvm_live {
	LLVMContextRef c;
	LLVMModuleRef m;
	LLVMTargetMachineRef tm;
	LLVMMemoryBufferRef buf;
	char *text;
} llvm_live;

static void llvm_unwind(void *arg)
{
	llvm_live *l = arg;
	if (l->text)
		LLVMDisposeMessage(l->text);
	if (l->buf)
		LLVMDisposeMemoryBuffer(l->buf);
	LLVMDisposeModule(l->m);
	LLVMDisposeTargetMachine(l->tm);
	LLVMContextDispose(l->c);
}

static moe_status write_live(cg_prog *p, const char *path, unsigned flags, const void *data, size_t n, llvm_live *l)
{
	uint32_t h = ctx_defer(p->ctx, llvm_unwind, l);
	moe_status s = moe_write_output(p->ctx, path, flags, data, n);
	ctx_undefer(p->ctx, h);
	return s;
}

moe_status cgen_emit_llvm_file(cg_prog *p, const char *path, int kind)
{
	eml_scratch sc;
	scratch_new(p, &sc);
	LLVMContextRef c = LLVMContextCreate();
	LLVMModuleRef m;
	LLVMTargetMachineRef tm;
	moe_status s = make_module(p, &sc, c, host_has_bf16dot(), NULL, &m, &tm);
	if (!s) {
		char *err = NULL;
		if (kind == 0) {
			char *text = LLVMPrintModuleToString(m);
			s = write_live(p, path, 0, text, strlen(text), &(llvm_live){c, m, tm, NULL, text});
			LLVMDisposeMessage(text);
		} else {
			LLVMMemoryBufferRef buf = NULL;
			if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &err, &buf)) {
				moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_file(p->ctx, path), "LLVM: code generation failed: %s",
					err ? err : "(no message)");
				s = MOE_ERR_INTERNAL;
			} else {
				s = write_live(p, path, MOE_OUTPUT_BINARY, LLVMGetBufferStart(buf), LLVMGetBufferSize(buf),
					&(llvm_live){c, m, tm, buf, NULL});
				LLVMDisposeMemoryBuffer(buf);
			}
		}
		if (err)
			LLVMDisposeMessage(err);
		LLVMDisposeModule(m);
		LLVMDisposeTargetMachine(tm);
	}
	LLVMContextDispose(c);
	scratch_free(p, &sc);
	return s;
}

struct cgen_jit {
	moe_ctx *ctx;
	LLVMOrcLLJITRef jit;
};

/* The cache key of p (jit_cache.c): what determines its object file. NULL
 * when out of memory; free() it. */
static char *cache_key(cg_prog *p, bool fast, const int *wpack, size_t *len)
{
	char *buf = NULL;
	*len = 0;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		return NULL;
	char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
	/* the build time stands for the emitters' code within one version */
	fprintf(f, "moec %s (built %s %s, %s)\ntarget %s %s %s\nkernels %s\n", MOEC_VERSION_STRING, __DATE__, __TIME__, cgl_dot_built,
		triple, cpu, feat, fast ? "avx512bf16" : "portable");
	LLVMDisposeMessage(triple);
	LLVMDisposeMessage(cpu);
	LLVMDisposeMessage(feat);
	/* which weights the vdpbf16ps tiles read packed (pack.c) */
	fputs("packed", f);
	for (uint32_t i = 0; fast && wpack && i < p->nbufs; i++)
		if (wpack[i] >= 0)
			fprintf(f, " b%u:%d", i, wpack[i]);
	fputc('\n', f);
	moe_status s = cgen_emit_c(p, f);
	if (fclose(f) != 0 || s) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* Compiles p to an object file in memory (malloc'd). */
static moe_status compile_object(cg_prog *p, bool fast, const int *wpack, void **obj, size_t *len)
{
	*obj = NULL;
	eml_scratch sc;
	scratch_new(p, &sc);
	LLVMContextRef c = LLVMContextCreate();
	LLVMModuleRef m;
	LLVMTargetMachineRef tm;
	moe_status s = make_module(p, &sc, c, fast, wpack, &m, &tm);
	if (!s) {
		char *err = NULL;
		LLVMMemoryBufferRef mb = NULL;
		if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &err, &mb)) {
			s = diag_msg(p->ctx, "cannot generate code", err);
			err = NULL;
		} else {
			*len = LLVMGetBufferSize(mb);
			*obj = malloc(*len ? *len : 1);
			if (*obj)
				memcpy(*obj, LLVMGetBufferStart(mb), *len);
			else
				s = MOE_ERR_NOMEM;
			LLVMDisposeMemoryBuffer(mb);
		}
		if (err)
			LLVMDisposeMessage(err);
		LLVMDisposeModule(m);
		LLVMDisposeTargetMachine(tm);
	}
	LLVMContextDispose(c);
	scratch_free(p, &sc);
	return s;
}

/* The layer's object: from the cache when a verified entry is there, else
 * compiled (and stored unless o->no_cache). */
static moe_status layer_object(cg_prog *p, cgen_jit_opts *o, bool fast, void **obj, size_t *len)
{
	size_t keylen = 0;
	char *key = o->no_cache ? NULL : cache_key(p, fast, o->wpack, &keylen);
	cgen_cache cc;
	bool usable = key && cgen_cache_open(p->ctx, &cc, o->cache_dir, key, keylen);
	int got = usable ? cgen_cache_load(&cc, obj, len) : 0;
	o->cache = !usable ? MOE_CACHE_OFF : got == 1 ? MOE_CACHE_HIT : got < 0 ? MOE_CACHE_BAD : MOE_CACHE_MISS;
	moe_status s = MOE_OK;
	if (got != 1) {
		s = compile_object(p, fast, o->wpack, obj, len);
		if (!s && usable)
			cgen_cache_store(&cc, *obj, *len);
	}
	if (usable)
		cgen_cache_close(&cc);
	free(key);
	return s;
}

/* MOEC_PERF_MAP=1: write /tmp/perf-PID.map with the JIT-compiled functions of
 * the layer (profiling with perf). The object's .text is linked as one block,
 * so every symbol is placed at the looked-up entry's address plus its offset
 * from that entry in the object. */
static void perf_map(const void *obj, size_t len, const char *sym, uint64_t addr)
{
	const char *env = getenv("MOEC_PERF_MAP");
	if (!env || !*env)
		return;
	LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRange(obj, len, "perf", 0);
	char *msg = NULL;
	LLVMBinaryRef bin = LLVMCreateBinary(mb, NULL, &msg);
	if (!bin) {
		LLVMDisposeMessage(msg);
		LLVMDisposeMemoryBuffer(mb);
		return;
	}
	uint64_t base = 0;
	LLVMSymbolIteratorRef it = LLVMObjectFileCopySymbolIterator(bin);
	for (; !LLVMObjectFileIsSymbolIteratorAtEnd(bin, it); LLVMMoveToNextSymbol(it))
		if (!strcmp(LLVMGetSymbolName(it), sym))
			base = addr - LLVMGetSymbolAddress(it);
	LLVMDisposeSymbolIterator(it);
	char path[64];
	snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
	/* not through a link another user may have planted in /tmp */
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	FILE *f = fd >= 0 ? fdopen(fd, "a") : NULL;
	if (fd >= 0 && !f)
		close(fd);
	it = LLVMObjectFileCopySymbolIterator(bin);
	for (; f && !LLVMObjectFileIsSymbolIteratorAtEnd(bin, it); LLVMMoveToNextSymbol(it))
		if (LLVMGetSymbolSize(it) > 0)
			fprintf(f, "%llx %llx %s\n", (unsigned long long)(base + LLVMGetSymbolAddress(it)),
				(unsigned long long)LLVMGetSymbolSize(it), LLVMGetSymbolName(it));
	LLVMDisposeSymbolIterator(it);
	if (f)
		fclose(f);
	LLVMDisposeBinary(bin);
	LLVMDisposeMemoryBuffer(mb);
}

moe_status cgen_jit_create(cg_prog *p, cgen_jit_opts *o, cgen_jit **out, cgen_layer_par_fn *fn)
{
	*out = NULL;
	*fn = NULL;
	o->cache = MOE_CACHE_OFF;
	pthread_once(&llvm_once, llvm_init);
	bool fast = !o->portable && host_has_bf16dot();
	o->kernels = fast ? "avx512bf16" : "portable";
	void *obj = NULL;
	size_t len = 0;
	cgen_jit *j = ctx_alloc(p->ctx, sizeof *j); /* before any LLVM object */
	moe_status s = layer_object(p, o, fast, &obj, &len);
	if (s) {
		ctx_free(p->ctx, j, sizeof *j);
		return s;
	}
	LLVMTargetMachineRef jtm = host_tm(p->ctx);
	if (!jtm) {
		free(obj);
		ctx_free(p->ctx, j, sizeof *j);
		return MOE_ERR_UNSUPPORTED;
	}
	LLVMOrcLLJITBuilderRef jb = LLVMOrcCreateLLJITBuilder();
	LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(jb, LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(jtm));
	LLVMOrcLLJITRef jit = NULL;
	LLVMErrorRef err = LLVMOrcCreateLLJIT(&jit, jb); /* consumes jb */
	if (err) {
		free(obj);
		ctx_free(p->ctx, j, sizeof *j);
		return diag_err(p->ctx, "cannot create the JIT", err);
	}
	LLVMOrcDefinitionGeneratorRef gen = NULL;
	err = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL);
	if (err) {
		free(obj);
		LLVMOrcDisposeLLJIT(jit);
		ctx_free(p->ctx, j, sizeof *j);
		return diag_err(p->ctx, "cannot expose process symbols to the JIT", err);
	}
	LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);
	LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, len, p->cname);
	err = LLVMOrcLLJITAddObjectFile(jit, LLVMOrcLLJITGetMainJITDylib(jit), mb); /* takes mb */
	if (err) {
		free(obj);
		LLVMOrcDisposeLLJIT(jit);
		ctx_free(p->ctx, j, sizeof *j);
		return diag_err(p->ctx, "cannot add the object file to the JIT", err);
	}
	char sym[200];
	cgen_symbol(p, "_par", sym, sizeof sym);
	LLVMOrcExecutorAddress addr = 0;
	err = LLVMOrcLLJITLookup(jit, &addr, sym);
	if (!err)
		perf_map(obj, len, sym, addr);
	free(obj);
	if (err) {
		LLVMOrcDisposeLLJIT(jit);
		ctx_free(p->ctx, j, sizeof *j);
		return diag_err(p->ctx, "cannot link the layer function", err);
	}
	j->ctx = p->ctx;
	j->jit = jit;
	*out = j;
	/* converting the executor address to a function pointer: POSIX guarantees
	 * object and function pointers share a representation */
	uintptr_t a = (uintptr_t)addr;
	memcpy(fn, &a, sizeof *fn);
	return MOE_OK;
}

void cgen_jit_free(cgen_jit *j)
{
	if (!j)
		return;
	LLVMErrorRef err = LLVMOrcDisposeLLJIT(j->jit);
	if (err)
		diag_err(j->ctx, "disposing the JIT", err);
	ctx_free(j->ctx, j, sizeof *j);
}

/* for emit_dot.c */
LLVMValueRef cgl_ex(eml *E, const cg_expr *e) { return ex(E, e); }
LLVMValueRef cgl_buf_base(eml *E, int i) { return buf_base(E, i); }
LLVMValueRef cgl_elem_ptr(eml *E, int buf, LLVMValueRef idx) { return elem_ptr(E, buf, idx); }
LLVMValueRef cgl_ci32(eml *E, uint32_t v) { return ci32(E, v); }
LLVMValueRef cgl_widen_bf16(eml *E, LLVMValueRef v) { return widen_bf16(E, v); }
