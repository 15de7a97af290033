/* moec/base.h: context, allocator hook, status codes and diagnostics.
 *
 * Every moec call takes a moe_ctx. The library keeps no global state: two
 * contexts may be used from two threads at once. Errors found in user input
 * become diagnostics collected in the context; calls return a moe_status. */
#ifndef MOEC_BASE_H
#define MOEC_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MOE_API __attribute__((visibility("default")))
#define MOE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MOE_API
#define MOE_PRINTF(f, a)
#endif

typedef enum moe_status {
	MOE_OK = 0,
	MOE_ERR_INVALID,     /* bad argument or input rejected with diagnostics */
	MOE_ERR_IO,          /* a file could not be read or written */
	MOE_ERR_FORMAT,      /* a file is malformed (safetensors, npy, tcpb, json) */
	MOE_ERR_UNSUPPORTED, /* a valid request moec does not implement */
	MOE_ERR_NOMEM,       /* the allocator failed */
	MOE_ERR_RUNTIME,     /* a fault while running a program */
	MOE_ERR_INTERNAL     /* an invariant of moec itself failed */
} moe_status;

MOE_API const char *moe_status_string(moe_status s);

/* Allocator hook, Lua style: nsize == 0 frees ptr, otherwise (re)allocates.
 * osize is the old size (0 for a fresh block). Must be thread safe if contexts
 * sharing it are used from several threads. */
typedef void *(*moe_alloc_fn)(void *ud, void *ptr, size_t osize, size_t nsize);

typedef struct moe_ctx moe_ctx;

/* alloc may be NULL for malloc/realloc/free. When it refuses, a guarded
 * call returns MOE_ERR_NOMEM (or NULL) with nothing leaked (docs/abi.md,
 * "Out of memory"). */
MOE_API moe_ctx *moe_ctx_new(moe_alloc_fn alloc, void *ud);
MOE_API void moe_ctx_free(moe_ctx *ctx);
MOE_API const char *moe_version_string(void);

/* Source location. line/col are 1-based; line == 0 means "the whole file"
 * (a binary or generated input), in which case offset may give a byte. */
typedef struct moe_loc {
	const char *file; /* interned in the context, or NULL */
	int line, col;
	int64_t offset; /* byte offset for binary inputs, -1 when unknown */
} moe_loc;

MOE_API moe_loc moe_loc_none(void);
MOE_API moe_loc moe_loc_file(moe_ctx *ctx, const char *file);
MOE_API moe_loc moe_loc_at(moe_ctx *ctx, const char *file, int line, int col);

typedef enum moe_diag_kind { MOE_DIAG_ERROR, MOE_DIAG_WARNING, MOE_DIAG_NOTE } moe_diag_kind;

/* Report a diagnostic. Errors are counted; notes attach to the previous one. */
MOE_API void moe_diag(moe_ctx *ctx, moe_diag_kind kind, moe_loc loc, const char *fmt, ...)
	MOE_PRINTF(4, 5);
MOE_API int moe_error_count(const moe_ctx *ctx);
/* Like cc, a context keeps at most MOE_DIAG_MAX_ERRORS errors: the one that
 * reaches the limit is followed by the note "too many errors; stopping", and
 * later diagnostics are dropped (errors are still counted by
 * moe_error_count). max_errors <= 0 removes the limit. The .moe parser stops
 * once moe_diag_limit_reached. */
#define MOE_DIAG_MAX_ERRORS 20
MOE_API void moe_diag_set_limit(moe_ctx *ctx, int max_errors);
MOE_API int moe_diag_limit_reached(const moe_ctx *ctx);
MOE_API size_t moe_diag_count(const moe_ctx *ctx);
/* Read diagnostic i; message pointer lives until moe_diag_clear or ctx free. */
MOE_API void moe_diag_get(const moe_ctx *ctx, size_t i, moe_diag_kind *kind, moe_loc *loc,
	const char **message);
MOE_API void moe_diag_clear(moe_ctx *ctx);
/* The name a diagnostic without a file is printed under (`NAME: error:
 * message`): the embedding program's own (the moec command sets "moec");
 * "libmoec" until set. Copied; at most 63 bytes kept. */
MOE_API void moe_ctx_set_diag_prefix(moe_ctx *ctx, const char *name);
/* Print all diagnostics as `file:line:col: error: message`, then the source
 * line and a caret when the source text was registered. */
MOE_API void moe_diag_print(const moe_ctx *ctx, FILE *out);
/* The same text as moe_diag_print, as a NUL-terminated string the caller
 * frees with moe_free ("" when there is no diagnostic); NULL when memory for
 * the text cannot be had. For embedders without a FILE (language bindings). */
MOE_API char *moe_diag_string(const moe_ctx *ctx);

/* Free a string the library returned (JSON, printed pipelines, stats). */
MOE_API void moe_free(moe_ctx *ctx, void *p);

/* Register source text so diagnostics can quote it. The text is copied. */
MOE_API void moe_ctx_add_source(moe_ctx *ctx, const char *file, const char *text, size_t len);

#ifdef __cplusplus
}
#endif
#endif
