/* backend-c/host_mem.c: the host memory a run of a layer takes, predicted
 * from its lowering (moe_host_memory_plan, include/moec/backend.h). */
#include <string.h>

#include "backend-c/cgen.h"
#include "moec/backend.h"

/* Whether the LLVM engine picks the vdpbf16ps kernels here (host.c packs
 * their bf16 weights then): the CPU's AVX512-BF16, as LLVM's host features
 * report it to the emitter. */
static bool packs_here(const moe_host_opts *o)
{
	return o->engine == MOE_HOST_LLVM && !o->portable && __builtin_cpu_supports("avx512bf16");
}

moe_status moe_host_memory_plan(moe_ctx *ctx, const moe_graph *g, const moe_host_opts *o, moe_host_memory *m)
{
	if (!ctx || !g || !m)
		return MOE_ERR_INVALID;
	moe_host_opts def;
	if (!o) {
		moe_host_opts_init(&def);
		o = &def;
	}
	memset(m, 0, sizeof *m);
	cg_prog *p = cgen_lower(ctx, g);
	if (!p)
		return MOE_ERR_INVALID;
	m->workspace_bytes = (size_t)p->workspace;
	for (uint32_t i = 0; i < p->nbufs; i++) {
		const cg_buf *b = &p->bufs[i];
		size_t bytes = (size_t)b->numel * moe_dtype_size((moe_dtype)b->dtype);
		if (b->kind == CB_WEIGHT)
			m->weight_bytes += bytes;
		else if (b->kind == CB_INPUT || b->kind == CB_OUTPUT)
			m->io_bytes += bytes;
	}
	int *slot = ctx_alloc(ctx, (p->nbufs + 1) * sizeof *slot);
	int64_t *rowlen = ctx_alloc(ctx, (p->nbufs + 1) * sizeof *rowlen);
	if (cgen_pack_plan(p, slot, rowlen) > 0)
		for (uint32_t i = 0; i < p->nbufs; i++)
			if (slot[i] >= 0)
				m->packable_bytes += (size_t)p->bufs[i].numel * 2; /* bf16 */
	m->packed_bytes = packs_here(o) ? m->packable_bytes : 0;
	ctx_free(ctx, slot, 0);
	ctx_free(ctx, rowlen, 0);
	cgen_free(p);
	m->peak_bytes = m->weight_bytes + m->packed_bytes + m->workspace_bytes + m->io_bytes;
	return MOE_OK;
}
