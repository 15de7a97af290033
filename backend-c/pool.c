/* backend-c/pool.c: the host thread pool behind parallel loops (cgen_par).
 *
 * nthreads - 1 workers wait for a generation number to change; the calling
 * thread publishes a loop (body, env, [next, hi)), and every thread, the
 * caller included, takes chunks of iterations (about 8 chunks per thread)
 * from an atomic counter until none is left. Which thread runs an iteration never changes what it
 * computes (cg_stmt.par), so results are the same for every thread count.
 * Workers spin briefly before sleeping, since a layer runs hundreds of short
 * parallel loops back to back. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend-c/cgen.h"

enum { POOL_SPIN = 20000 }; /* polls of the generation before a worker sleeps */

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct cgen_pool {
	moe_ctx *ctx;
	int nthreads, started;
	pthread_t *th;
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	atomic_uint_fast64_t gen; /* bumped under mu for each loop */
	int pending;              /* workers still in the current loop (mu) */
	bool quit;                /* (mu) */
	/* the current loop, written under mu before gen changes */
	cgen_par_body body;
	void *env;
	int64_t hi, grain;
	atomic_int_fast64_t next;
};

static void take_iterations(cgen_pool *P, cgen_par_body body, void *env, int64_t hi, int64_t grain)
{
	for (;;) {
		int64_t i = atomic_fetch_add_explicit(&P->next, grain, memory_order_relaxed);
		if (i >= hi)
			return;
		body(env, i, i + grain < hi ? i + grain : hi);
	}
}

static void *worker(void *arg)
{
	cgen_pool *P = arg;
	uint64_t seen = 0;
	for (;;) {
		for (int k = 0; k < POOL_SPIN && atomic_load_explicit(&P->gen, memory_order_acquire) == seen; k++)
			cpu_relax();
		pthread_mutex_lock(&P->mu);
		while (!P->quit && atomic_load_explicit(&P->gen, memory_order_relaxed) == seen)
			pthread_cond_wait(&P->go, &P->mu);
		if (P->quit) {
			pthread_mutex_unlock(&P->mu);
			return NULL;
		}
		seen = atomic_load_explicit(&P->gen, memory_order_relaxed);
		cgen_par_body body = P->body;
		void *env = P->env;
		int64_t hi = P->hi, grain = P->grain;
		pthread_mutex_unlock(&P->mu);
		take_iterations(P, body, env, hi, grain);
		pthread_mutex_lock(&P->mu);
		if (--P->pending == 0)
			pthread_cond_signal(&P->done);
		pthread_mutex_unlock(&P->mu);
	}
}

void cgen_pool_run(void *pool, cgen_par_body body, void *env, int64_t lo, int64_t hi)
{
	cgen_pool *P = pool;
	if (!P || P->started == 0 || hi - lo <= 1) {
		if (lo < hi)
			body(env, lo, hi);
		return;
	}
	pthread_mutex_lock(&P->mu);
	P->body = body;
	P->env = env;
	P->hi = hi;
	/* about 8 chunks per thread: few hand-outs, and still balanced */
	int64_t grain = (hi - lo) / (8 * (int64_t)P->nthreads);
	P->grain = grain = grain < 1 ? 1 : grain;
	atomic_store_explicit(&P->next, lo, memory_order_relaxed);
	P->pending = P->started;
	atomic_fetch_add_explicit(&P->gen, 1, memory_order_release);
	pthread_cond_broadcast(&P->go);
	pthread_mutex_unlock(&P->mu);
	take_iterations(P, body, env, hi, grain);
	pthread_mutex_lock(&P->mu);
	while (P->pending > 0)
		pthread_cond_wait(&P->done, &P->mu);
	pthread_mutex_unlock(&P->mu);
}

cgen_pool *cgen_pool_create(moe_ctx *ctx, int nthreads)
{
	cgen_pool *P = ctx_alloc(ctx, sizeof *P);
	memset(P, 0, sizeof *P);
	P->ctx = ctx;
	P->nthreads = nthreads < 1 ? 1 : nthreads;
	pthread_mutex_init(&P->mu, NULL);
	pthread_cond_init(&P->go, NULL);
	pthread_cond_init(&P->done, NULL);
	atomic_init(&P->gen, 0);
	atomic_init(&P->next, 0);
	int nw = P->nthreads - 1;
	P->th = ctx_alloc(ctx, (size_t)(nw + 1) * sizeof *P->th);
	for (int i = 0; i < nw; i++) {
		int rc = pthread_create(&P->th[i], NULL, worker, P);
		if (rc) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "cannot start host thread %d of %d: %s", i + 2,
				P->nthreads, strerror(rc));
			cgen_pool_free(P);
			return NULL;
		}
		P->started++;
	}
	return P;
}

void cgen_pool_free(cgen_pool *P)
{
	if (!P)
		return;
	pthread_mutex_lock(&P->mu);
	P->quit = true;
	pthread_cond_broadcast(&P->go);
	pthread_mutex_unlock(&P->mu);
	for (int i = 0; i < P->started; i++)
		pthread_join(P->th[i], NULL);
	pthread_mutex_destroy(&P->mu);
	pthread_cond_destroy(&P->go);
	pthread_cond_destroy(&P->done);
	ctx_free(P->ctx, P->th, (size_t)P->nthreads * sizeof *P->th);
	ctx_free(P->ctx, P, sizeof *P);
}

int cgen_cores(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0) {
		int n = CPU_COUNT(&set);
		if (n > 0)
			return n;
	}
	return 1;
}
