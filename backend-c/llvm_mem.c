/* backend-c/llvm_mem.c: the LLVM emitter's scratch blocks and the
 * clean-up of its objects when writing the output runs out of memory. */
#include <string.h>

#include "backend-c/llvm_mem.h"
#include "moec/io.h"

void cgen_scratch_new(cg_prog *p, cgen_scratch *s)
{
	for (int k = 0; k < 2; k++) {
		s->vars[k] = ctx_alloc(p->ctx, (p->nvars + 1) * sizeof *s->vars[k]);
		s->bufs[k] = ctx_alloc(p->ctx, (p->nbufs + 1) * sizeof *s->bufs[k]);
	}
	s->used = ctx_alloc(p->ctx, p->nvars + 1);
}

void cgen_scratch_free(cg_prog *p, cgen_scratch *s)
{
	for (int k = 0; k < 2; k++) {
		ctx_free(p->ctx, s->vars[k], 0);
		ctx_free(p->ctx, s->bufs[k], 0);
	}
	ctx_free(p->ctx, s->used, 0);
}

static void llvm_unwind(void *arg)
{
	cgen_llvm_live *l = arg;
	if (l->text)
		LLVMDisposeMessage(l->text);
	if (l->buf)
		LLVMDisposeMemoryBuffer(l->buf);
	LLVMDisposeModule(l->m);
	LLVMDisposeTargetMachine(l->tm);
	LLVMContextDispose(l->c);
}

moe_status cgen_write_live(cg_prog *p, const char *path, unsigned flags, const void *data, size_t n, cgen_llvm_live *l)
{
	uint32_t h = ctx_defer(p->ctx, llvm_unwind, l);
	moe_status s = moe_write_output(p->ctx, path, flags, data, n);
	ctx_undefer(p->ctx, h);
	return s;
}
