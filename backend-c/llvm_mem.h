/* backend-c/llvm_mem.h: what the LLVM emitter needs so that running out
 * of memory never unwinds past a live LLVM object (docs/abi.md, "Out of
 * memory"): its scratch blocks, taken before the LLVM context exists, and
 * the clean-up of the objects alive while the output file is written. */
#ifndef MOEC_BACKEND_C_LLVM_MEM_H
#define MOEC_BACKEND_C_LLVM_MEM_H

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "backend-c/cgen.h"

/* vars/bufs [0]: the layer function, [1]: an outlined body (outlining does
 * not nest); used: the variables an outlined body reads. */
typedef struct cgen_scratch {
	LLVMValueRef *vars[2], *bufs[2];
	uint8_t *used;
} cgen_scratch;

void cgen_scratch_new(cg_prog *p, cgen_scratch *s);
void cgen_scratch_free(cg_prog *p, cgen_scratch *s);

/* The LLVM objects alive while the output is written. */
typedef struct cgen_llvm_live {
	LLVMContextRef c;
	LLVMModuleRef m;
	LLVMTargetMachineRef tm;
	LLVMMemoryBufferRef buf;
	char *text;
} cgen_llvm_live;

/* moe_write_output with the objects of l disposed if it throws. */
moe_status cgen_write_live(cg_prog *p, const char *path, unsigned flags, const void *data, size_t n, cgen_llvm_live *l);

#endif
