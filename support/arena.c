/* support/arena.c: the per-graph arena and overflow-checked size arithmetic. */
#include <string.h>

#include "support/support.h"

/* ---- arena ---- */
struct ir_chunk {
	ir_chunk *next;
	size_t used, size;
	_Alignas(16) unsigned char data[];
};

void ir_arena_init(ir_arena *a, moe_ctx *ctx)
{
	a->ctx = ctx;
	a->head = NULL;
}

void ir_arena_free(ir_arena *a)
{
	for (ir_chunk *c = a->head, *n; c; c = n) {
		n = c->next;
		ctx_free(a->ctx, c, sizeof *c + c->size);
	}
	a->head = NULL;
}

void *ir_alloc(ir_arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	ir_chunk *c = a->head;
	if (!c || c->size - c->used < n) {
		size_t sz = n > 65536 ? n : 65536;
		c = ctx_alloc(a->ctx, sizeof *c + sz);
		c->size = sz;
		c->used = 0;
		c->next = a->head;
		a->head = c;
	}
	void *p = c->data + c->used;
	c->used += n;
	memset(p, 0, n);
	return p;
}

char *ir_strdup(ir_arena *a, const char *s)
{
	if (!s)
		return NULL;
	size_t n = strlen(s) + 1;
	char *p = ir_alloc(a, n);
	memcpy(p, s, n);
	return p;
}

bool ir_mul_ov(int64_t a, int64_t b, int64_t *r)
{
	return !__builtin_mul_overflow(a, b, r);
}

bool ir_add_ov(int64_t a, int64_t b, int64_t *r)
{
	return !__builtin_add_overflow(a, b, r);
}
