/* tests/fuzz/fuzz_util.h: shared pieces of the reader fuzz harnesses.
 *
 * Every harness defines LLVMFuzzerTestOneInput. It is linked either with
 * libFuzzer (MOEC_FUZZ builds: fuzz_<name>) or with replay_main.c (every
 * build: replay_<name>, run by ctest over the seed corpus and regressions).
 *
 * The invariants checked on every input, beyond what the sanitizers see:
 * - a context built on a counting allocator ends with no live block once
 *   everything the reader returned has been freed (leaks without LSan);
 * - a reader that rejects its input has reported at least one error, and a
 *   reader that accepts it has reported none;
 * - the diagnostics print (with source quoting) without fault; with
 *   MOEC_FUZZ_VERBOSE set in the environment they go to stderr.
 * A broken invariant aborts with a message, which libFuzzer records as a crash. */
#ifndef MOEC_FUZZ_UTIL_H
#define MOEC_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "moec/base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz_heap {
	long blocks; /* live blocks handed out through the context's allocator */
} fz_heap;

static inline void *fz_alloc(void *ud, void *p, size_t osize, size_t nsize)
{
	fz_heap *h = ud;
	(void)osize;
	if (nsize == 0) {
		if (p)
			h->blocks--;
		free(p);
		return NULL;
	}
	void *q = realloc(p, nsize);
	if (q && !p)
		h->blocks++;
	return q;
}

#define FZ_FAIL(...)                                                          \
	do {                                                                  \
		fprintf(stderr, "fuzz invariant broken (%s:%d): ", __FILE__, __LINE__); \
		fprintf(stderr, __VA_ARGS__);                                 \
		fputc('\n', stderr);                                          \
		abort();                                                      \
	} while (0)

static inline FILE *fz_sink(void)
{
	static FILE *sink;
	if (!sink && getenv("MOEC_FUZZ_VERBOSE"))
		sink = stderr;
	if (!sink && !(sink = fopen("/dev/null", "w")))
		abort();
	return sink;
}

static inline moe_ctx *fz_ctx_new(fz_heap *h)
{
	h->blocks = 0;
	moe_ctx *ctx = moe_ctx_new(fz_alloc, h);
	if (!ctx)
		abort();
	return ctx;
}

/* Check the accept/reject invariant of one reader call; errs_before is
 * moe_error_count before the call. */
static inline void fz_check_result(moe_ctx *ctx, int errs_before, int accepted, const char *what)
{
	int errs = moe_error_count(ctx) - errs_before;
	if (!accepted && errs == 0)
		FZ_FAIL("%s rejected its input without an error diagnostic", what);
	if (accepted && errs != 0)
		FZ_FAIL("%s accepted its input but reported %d error(s)", what, errs);
	moe_diag_print(ctx, fz_sink());
}

static inline void fz_ctx_free(moe_ctx *ctx, fz_heap *h)
{
	moe_ctx_free(ctx);
	if (h->blocks != 0)
		FZ_FAIL("%ld block(s) still live after moe_ctx_free", h->blocks);
}

#endif
