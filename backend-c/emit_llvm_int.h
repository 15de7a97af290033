/* backend-c/emit_llvm_int.h: the LLVM emitter's state, shared by
 * emit_llvm.c (statements, functions, the JIT) and emit_dot.c (CS_DOT). */
#ifndef MOEC_EMIT_LLVM_INT_H
#define MOEC_EMIT_LLVM_INT_H

#include <stdbool.h>

#include <llvm-c/Core.h>

#include "backend-c/cgen.h"

/* Every block code generation needs, taken before the LLVM context exists:
 * an allocation that fails while LLVM objects are alive would leak them
 * (docs/abi.md). vars/bufs [0]: the layer function, [1]: an outlined body
 * (outlining does not nest). */
typedef struct eml_scratch {
	LLVMValueRef *vars[2], *bufs[2];
	uint8_t *used;
} eml_scratch;

typedef struct eml {
	eml_scratch *sc;
	cg_prog *p;
	LLVMContextRef c;
	LLVMModuleRef m;
	LLVMBuilderRef b;
	LLVMValueRef fn;
	LLVMTypeRef i1, i8, i16, i32, i64, f32, f64, ptr;
	LLVMValueRef *vars; /* allocas, made on first use in the entry block */
	LLVMValueRef *bufs; /* base pointers, likewise */
	LLVMBasicBlockRef entry; /* the current function's entry: allocas and buffer pointers */
	LLVMValueRef args[4];    /* the layer function's four arguments (docs/abi.md) */
	LLVMValueRef par;        /* its cgen_par argument; NULL inside an outlined body */
	int npar;                /* outlined bodies so far */
	/* [0]: f32 functions, [1]: f64 */
	LLVMValueRef f_exp[2], f_log[2], f_tanh[2], f_erf[2], f_sqrt[2], f_fabs[2], f_sat, f_prefetch, f_dpbf16;
	LLVMTypeRef t_f1[2], t_sat, t_prefetch, t_dpbf16;
	bool bf16dot; /* bf16 x bf16 dot tiles use vdpbf16ps (cgen.h, CS_DOT) */
	const int *wpack; /* NULL, or per buffer the slot of its packed copy (cgen_jit_opts.wpack) */
	unsigned md_scope, md_noalias; /* metadata kinds !alias.scope, !noalias */
	LLVMValueRef tab_scope;        /* !{table scope}: the loads of table buffers (cg_buf.table) */
} eml;

/* emit_llvm.c */
LLVMValueRef cgl_ex(eml *E, const cg_expr *e);
LLVMValueRef cgl_buf_base(eml *E, int i);
LLVMValueRef cgl_elem_ptr(eml *E, int buf, LLVMValueRef idx);
LLVMValueRef cgl_ci32(eml *E, uint32_t v);
LLVMValueRef cgl_widen_bf16(eml *E, LLVMValueRef v);
/* emit_dot.c */
/* the row stride of a CS_DOT's dst */
static inline int64_t cgl_drow(const cg_dot *t)
{
	return t->drow > 0 ? t->drow : DOT_LANES;
}
void cgl_dot(eml *E, const cg_dot *t);
/* a counted loop: iv from lo while iv < hi (signed), step given at the end */
typedef struct dloop {
	LLVMBasicBlockRef head, exit;
	LLVMValueRef iv;
} dloop;
LLVMValueRef dloop_begin(eml *E, dloop *l, LLVMValueRef lo, LLVMValueRef hi);
void dloop_end(eml *E, dloop *l, int64_t step);
/* emit_dotg.c: NULL, or the packed copy of t's W when a whole group may run
 * the register-blocked vdpbf16ps kernel; that kernel, for rows of A */
LLVMValueRef cgl_dot_group_packed(eml *E, const cg_dot *t);
void cgl_dot_group(eml *E, const cg_dot *t, int64_t G, LLVMValueRef rows, LLVMValueRef ai, LLVMValueRef wi,
	LLVMValueRef di, LLVMValueRef pw);
extern const char cgl_dot_built[]; /* its build date and time */

#endif
