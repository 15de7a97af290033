/* Helpers shared by test_hostile.c and test_hostile_run.c. */
#ifndef MOEC_TESTS_HOSTILE_UTIL_H
#define MOEC_TESTS_HOSTILE_UTIL_H

#include <time.h>

#include "moec/moec.h"

/* The first error diagnostic of c ("" when there is none). */
static inline const char *last_error(moe_ctx *c)
{
	const char *m = "";
	for (size_t i = 0; i < moe_diag_count(c); i++) {
		moe_diag_kind k;
		moe_diag_get(c, i, &k, NULL, &m);
		if (k == MOE_DIAG_ERROR)
			return m;
	}
	return m;
}

/* Monotonic seconds. */
static inline double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#endif
