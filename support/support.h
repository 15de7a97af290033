/* support/support.h: the bottom layer every directory builds on: the
 * context's memory (allocator hook), interned strings, registered sources,
 * diagnostics, the arena, growable vectors, a string table and overflow
 * helpers. It includes only public base types (moec/base.h); nothing here
 * knows about graphs, tensors or targets. The arena and overflow helpers keep
 * their historical ir_ prefix. */
#ifndef MOEC_SUPPORT_H
#define MOEC_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "moec/base.h"

/* ---- invariants ---- */
void ir_assert_fail(const char *file, int line, const char *expr);
#define IR_ASSERT(e) ((e) ? (void)0 : ir_assert_fail(__FILE__, __LINE__, #e))

/* ---- context memory ----
 * Every block comes from the context's allocator hook. When the hook
 * refuses, ctx_alloc, ctx_realloc, ctx_grow and ctx_intern do
 * not return: ctx_throw unwinds to the guarded public entry point
 * (CTX_GUARDED), freeing every block born inside it, running the clean-ups
 * registered with ctx_defer, and the entry point returns MOE_ERR_NOMEM (or
 * NULL) with the error "out of memory". A diagnostic (or a registered
 * source, or a location's file name) the allocator refuses never throws: it
 * is dropped and the guarded call fails with MOE_ERR_NOMEM when it returns
 * (so error paths need no care). Outside every guard (a builder call
 * made straight by an embedder) the failure aborts with a message. So: code
 * inside the library never checks these for NULL, but must not hold a
 * resource other than context blocks (a FILE, a thread, an LLVM object, a
 * malloc'd block) across a call that may allocate without ctx_defer, and an
 * entry point that changes an object the caller owns must do it so that a
 * throw leaves that object as it was (work on a copy, then swap: no block
 * born inside the guard may be linked into an older object before the last
 * allocation). docs/abi.md. */
void *ctx_alloc(moe_ctx *ctx, size_t n);             /* zeroed */
void *ctx_try_alloc(moe_ctx *ctx, size_t n);         /* zeroed; NULL when the allocator refuses */
/* Zeroed; when refused: a throw inside a guard, NULL outside one (for code
 * that may run both ways and holds nothing but context blocks). */
void *ctx_soft_alloc(moe_ctx *ctx, size_t n);
void *ctx_realloc(moe_ctx *ctx, void *p, size_t o, size_t n); /* o is ignored: blocks know their size */
void *ctx_try_realloc(moe_ctx *ctx, void *p, size_t n); /* NULL when refused (p unchanged) */
void ctx_free(moe_ctx *ctx, void *p, size_t n);      /* n is ignored */
/* The block p (from ctx_alloc) is the context's: a throw does not free it. */
void ctx_keep(moe_ctx *ctx, void *p);

typedef struct ctx_guard {
	jmp_buf jb;
	uint64_t mark;   /* blocks with a larger sequence number are freed by a throw */
	uint32_t ndefer; /* clean-ups registered before the guard */
} ctx_guard;
/* false when a guard is already active (the call then runs inside it). */
bool ctx_guard_begin(moe_ctx *ctx, ctx_guard *g);
void ctx_guard_end(moe_ctx *ctx, ctx_guard *g);
bool ctx_guarded(const moe_ctx *ctx);
/* Before a guarded call changes something that outlives it (swaps graphs
 * into the caller's module, renames an output into place): throw now if a
 * refused diagnostic already dooms the call. */
void ctx_commit_point(moe_ctx *ctx);
/* The allocator refused n bytes: unwind to the guard (abort without one). */
_Noreturn void ctx_throw(moe_ctx *ctx, size_t n);
/* Run fn(arg) if a throw unwinds past this point; ctx_undefer(h) once the
 * resource is released normally (last in, first out). At most 16 at once. */
uint32_t ctx_defer(moe_ctx *ctx, void (*fn)(void *), void *arg);
void ctx_undefer(moe_ctx *ctx, uint32_t h);

/* The body of a public entry point: `return call;` inside a guard, or
 * `return fail;` when an allocation inside it fails. A nested entry point
 * runs inside the outer guard. */
#define CTX_GUARDED(ctx, T, fail, call) \
	do { \
		ctx_guard g_; \
		if (!ctx_guard_begin((ctx), &g_)) \
			return call; \
		if (setjmp(g_.jb)) \
			return fail; \
		T r_ = call; \
		ctx_guard_end((ctx), &g_); \
		return r_; \
	} while (0)
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
ctx_vec *ctx_target_attrs(moe_ctx *ctx); /* rows of ir/attrs.c */
ctx_vec *ctx_target_state(moe_ctx *ctx);  /* a registered target's state rows (backend-tcp/compiler/gpass/gpass.c) */
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
/* What parsing a JSON text would build, counted in one pass without
 * allocating (support/json_measure.c): cJSON makes a node per value and a copy
 * of every string (keys included), so cost estimates its allocation as
 * CTX_JSON_NODE_BYTES per value plus CTX_JSON_STRING_BYTES per string plus the
 * text's length. */
#define CTX_JSON_NODE_BYTES 96 /* a cJSON node, the allocator's header, keep_last's record */
#define CTX_JSON_STRING_BYTES 32
typedef struct ctx_json_shape {
	size_t values, strings;
	size_t max_array; /* the most elements of one array */
	int depth;        /* the deepest nesting of arrays and objects */
	uint64_t cost;
} ctx_json_shape;
void ctx_json_measure(const char *text, size_t len, ctx_json_shape *sh);

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
