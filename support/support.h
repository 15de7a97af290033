/* support/support.h: the bottom layer every directory builds on: the
 * context's memory (allocator hook), interned strings, registered sources,
 * diagnostics, the arena, growable vectors, a string table and overflow
 * helpers. It includes only public base types (moec/base.h); nothing here
 * knows about graphs, tensors or targets. The arena and overflow helpers keep
 * their historical ir_ prefix. */
#ifndef MOEC_SUPPORT_H
#define MOEC_SUPPORT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "moec/base.h"

/* ---- invariants ---- */
void ir_assert_fail(const char *file, int line, const char *expr);
#define IR_ASSERT(e) ((e) ? (void)0 : ir_assert_fail(__FILE__, __LINE__, #e))

/* ---- context memory ---- */
void *ctx_alloc(moe_ctx *ctx, size_t n);             /* zeroed; aborts on OOM */
void *ctx_try_alloc(moe_ctx *ctx, size_t n);         /* zeroed; NULL when the allocator refuses */
void *ctx_realloc(moe_ctx *ctx, void *p, size_t o, size_t n);
void ctx_free(moe_ctx *ctx, void *p, size_t n);
const char *ctx_intern(moe_ctx *ctx, const char *s); /* lives as long as ctx */
const char *ctx_source_line(const moe_ctx *ctx, const char *file, int line, size_t *len);
/* A growable array owned by the context (freed with it). */
typedef struct ctx_vec {
	void *data;
	uint32_t n, cap;
	size_t esz;
	size_t row; /* > 0: data holds n pointers to rows of this size, freed with it */
} ctx_vec;
ctx_vec *ctx_passes(moe_ctx *ctx);
/* Grow *arr (elements of size esz) to hold at least need elements. */
void ctx_grow(moe_ctx *ctx, void **arr, uint32_t *cap, uint32_t need, size_t esz);

/* ---- arena: everything of one graph lives here and is freed at once ---- */
typedef struct ir_chunk ir_chunk;
typedef struct ir_arena {
	moe_ctx *ctx;
	ir_chunk *head;
} ir_arena;
void ir_arena_init(ir_arena *a, moe_ctx *ctx);
void ir_arena_free(ir_arena *a);
void *ir_alloc(ir_arena *a, size_t n); /* zeroed, 16-byte aligned */
char *ir_strdup(ir_arena *a, const char *s);

/* ---- overflow-checked size arithmetic: return false on overflow ---- */
bool ir_mul_ov(int64_t a, int64_t b, int64_t *r);
bool ir_add_ov(int64_t a, int64_t b, int64_t *r);

/* ---- diagnostics: the one formatter every wrapper goes through ---- */
void ctx_vdiag(moe_ctx *ctx, moe_diag_kind kind, moe_loc loc, const char *fmt, va_list ap);
/* An error at a byte offset of a file (offset < 0: the whole file). */
void ctx_err_at(moe_ctx *ctx, const char *file, int64_t offset, const char *fmt, ...) MOE_PRINTF(4, 5);

/* ---- a string -> index hash table; keys are borrowed (must outlive it) ---- */
typedef struct ctx_strtab {
	moe_ctx *ctx;
	const char **keys;
	size_t *vals;
	size_t cap, n;
} ctx_strtab;
void ctx_strtab_init(ctx_strtab *t, moe_ctx *ctx, size_t expect);
/* false if the key is already present (the table is unchanged). */
bool ctx_strtab_put(ctx_strtab *t, const char *key, size_t val);
bool ctx_strtab_get(const ctx_strtab *t, const char *key, size_t *val);
void ctx_strtab_free(ctx_strtab *t);

#endif
