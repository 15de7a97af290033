/* runtime/tensor_tmp.c: TEMPORARY minimal tensor and tensor-map functions so
 * that branch rtio links and tests before branch interp (runtime/tensor.c) is
 * merged. Delete this file when merging interp. */
#include <string.h>

#include "ir/ir.h"
#include "moec/runtime.h"

moe_tensor *moe_tensor_new(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape)
{
	int64_t bytes = (int64_t)moe_dtype_size(t);
	for (int i = 0; i < rank; i++)
		if (shape[i] < 0 || !ir_mul_ov(bytes, shape[i], &bytes)) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tensor size overflows");
			return NULL;
		}
	moe_tensor *tn = ctx_alloc(ctx, sizeof *tn);
	tn->dtype = t;
	tn->rank = rank;
	memcpy(tn->shape, shape, (size_t)rank * sizeof *shape);
	tn->nbytes = (size_t)bytes;
	tn->data = ctx_alloc(ctx, tn->nbytes ? tn->nbytes : 1);
	tn->owned = 1;
	return tn;
}

void moe_tensor_free(moe_ctx *ctx, moe_tensor *t)
{
	if (!t)
		return;
	if (t->owned)
		ctx_free(ctx, t->data, t->nbytes ? t->nbytes : 1);
	ctx_free(ctx, t, sizeof *t);
}

int64_t moe_tensor_numel(const moe_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->rank; i++)
		n *= t->shape[i];
	return n;
}

struct moe_tensor_map {
	moe_ctx *ctx;
	char **names;
	moe_tensor **ts;
	uint32_t n, cap;
};

moe_tensor_map *moe_tensor_map_new(moe_ctx *ctx)
{
	moe_tensor_map *m = ctx_alloc(ctx, sizeof *m);
	m->ctx = ctx;
	return m;
}

void moe_tensor_map_free(moe_tensor_map *m)
{
	if (!m)
		return;
	for (uint32_t i = 0; i < m->n; i++) {
		ctx_free(m->ctx, m->names[i], strlen(m->names[i]) + 1);
		moe_tensor_free(m->ctx, m->ts[i]);
	}
	ctx_free(m->ctx, m->names, m->cap * sizeof *m->names);
	ctx_free(m->ctx, m->ts, m->cap * sizeof *m->ts);
	ctx_free(m->ctx, m, sizeof *m);
}

void moe_tensor_map_set(moe_tensor_map *m, const char *name, moe_tensor *t)
{
	for (uint32_t i = 0; i < m->n; i++)
		if (!strcmp(m->names[i], name)) {
			moe_tensor_free(m->ctx, m->ts[i]);
			m->ts[i] = t;
			return;
		}
	uint32_t c1 = m->cap, c2 = m->cap;
	ctx_grow(m->ctx, (void **)&m->names, &c1, m->n + 1, sizeof *m->names);
	ctx_grow(m->ctx, (void **)&m->ts, &c2, m->n + 1, sizeof *m->ts);
	m->cap = c1;
	size_t len = strlen(name) + 1;
	m->names[m->n] = ctx_alloc(m->ctx, len);
	memcpy(m->names[m->n], name, len);
	m->ts[m->n++] = t;
}

moe_tensor *moe_tensor_map_get(const moe_tensor_map *m, const char *name)
{
	for (uint32_t i = 0; i < m->n; i++)
		if (!strcmp(m->names[i], name))
			return m->ts[i];
	return NULL;
}

uint16_t moe_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float moe_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
