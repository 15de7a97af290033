/* backend-c/pool.c: the host thread pool behind parallel loops (cgen_par).
 *
 * nthreads - 1 workers plus the calling thread take chunks of a loop's
 * iterations until none is left, each chunk a share (1 / (4 nthreads)) of the
 * iterations not yet taken (guided scheduling: big chunks first, single
 * iterations at the end, so uneven iterations such as expert blocks of
 * different sizes still end together); which thread runs
 * an iteration never changes what it computes (cg_stmt.par), so results are
 * the same for every thread count.
 *
 * One atomic word holds the loop's generation and the next unclaimed
 * iteration. The caller closes it (a new generation, no iteration to claim),
 * writes the loop's parameters, then opens it; a worker reads the parameters
 * between two reads of the word and uses them only if the generation did not
 * change (a sequence lock), and claims a chunk by compare-and-swap, which
 * fails once the generation has moved on. The caller waits for the claimed
 * iterations to be done, never for a worker to turn up: on a machine with
 * more runnable threads than cores, a worker that is not running when a loop
 * starts costs nothing, the caller does its share. A layer runs hundreds of
 * short loops back to back, so idle workers spin briefly before sleeping. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend-c/cgen.h"

enum { POOL_SPIN = 20000 }; /* polls of the word before a worker sleeps */

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* the word: generation << IX_BITS | next iteration; IX_CLOSED: none to claim */
#define IX_BITS 40
#define IX_MASK ((UINT64_C(1) << IX_BITS) - 1)
#define IX_CLOSED IX_MASK

struct cgen_pool {
	moe_ctx *ctx;
	int nthreads, started;
	pthread_t *th;
	pthread_mutex_t mu;
	pthread_cond_t go;
	int sleepers; /* (mu) */
	bool quit;    /* (mu); also read atomically below */
	atomic_bool stop;
	_Atomic uint64_t word;
	/* the current loop's parameters, written while the word is closed */
	_Atomic(cgen_par_body) body;
	_Atomic(void *) env;
	atomic_int_fast64_t hi, share;
	atomic_int_fast64_t done; /* iterations of the current loop finished */
};

/* Claims and runs chunks of the loop of generation gen until none is left or
 * the generation changes; returns the iterations it ran. A chunk is 1 / share
 * of the iterations left, at least one. */
static int64_t take(cgen_pool *P, uint64_t gen, cgen_par_body body, void *env, int64_t hi, int64_t share)
{
	int64_t ran = 0;
	uint64_t w = atomic_load_explicit(&P->word, memory_order_acquire);
	for (;;) {
		if (w >> IX_BITS != gen)
			return ran;
		int64_t i = (int64_t)(w & IX_MASK);
		if (i >= hi)
			return ran;
		int64_t n = (hi - i) / share;
		int64_t e = i + (n < 1 ? 1 : n);
		if (atomic_compare_exchange_weak_explicit(&P->word, &w, (gen << IX_BITS) | (uint64_t)e,
			    memory_order_acq_rel, memory_order_acquire)) {
			body(env, i, e);
			ran += e - i;
			w = atomic_load_explicit(&P->word, memory_order_acquire);
		}
	}
}

/* One attempt at the open loop, if any: reads its parameters (sequence lock),
 * runs chunks, reports them done. Returns the generation it took part in, or
 * seen when it found none open. */
static uint64_t join(cgen_pool *P, uint64_t seen)
{
	uint64_t w1 = atomic_load_explicit(&P->word, memory_order_acquire);
	if ((w1 & IX_MASK) == IX_CLOSED)
		return seen;
	cgen_par_body body = atomic_load_explicit(&P->body, memory_order_relaxed);
	void *env = atomic_load_explicit(&P->env, memory_order_relaxed);
	int64_t hi = atomic_load_explicit(&P->hi, memory_order_relaxed);
	int64_t share = atomic_load_explicit(&P->share, memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire);
	uint64_t w2 = atomic_load_explicit(&P->word, memory_order_relaxed);
	if (w2 >> IX_BITS != w1 >> IX_BITS)
		return seen;
	int64_t ran = take(P, w1 >> IX_BITS, body, env, hi, share);
	if (ran)
		atomic_fetch_add_explicit(&P->done, ran, memory_order_release);
	return w1 >> IX_BITS;
}

static void *worker(void *arg)
{
	cgen_pool *P = arg;
	uint64_t seen = 0; /* the last generation joined */
	while (!atomic_load_explicit(&P->stop, memory_order_acquire)) {
		int k = 0;
		for (; k < POOL_SPIN; k++) {
			uint64_t w = atomic_load_explicit(&P->word, memory_order_acquire);
			if (w >> IX_BITS != seen && (w & IX_MASK) != IX_CLOSED)
				break;
			if (atomic_load_explicit(&P->stop, memory_order_relaxed))
				return NULL;
			cpu_relax();
		}
		if (k == POOL_SPIN) {
			pthread_mutex_lock(&P->mu);
			P->sleepers++;
			for (;;) {
				uint64_t w = atomic_load_explicit(&P->word, memory_order_acquire);
				if (P->quit || (w >> IX_BITS != seen && (w & IX_MASK) != IX_CLOSED))
					break;
				pthread_cond_wait(&P->go, &P->mu);
			}
			P->sleepers--;
			pthread_mutex_unlock(&P->mu);
			continue;
		}
		seen = join(P, seen);
	}
	return NULL;
}

void cgen_pool_run(void *pool, cgen_par_body body, void *env, int64_t lo, int64_t hi)
{
	cgen_pool *P = pool;
	if (!P || P->started == 0 || hi - lo <= 1 || lo < 0 || hi >= (int64_t)IX_CLOSED) {
		if (lo < hi)
			body(env, lo, hi);
		return;
	}
	uint64_t gen = ((atomic_load_explicit(&P->word, memory_order_relaxed) >> IX_BITS) + 1) &
		((UINT64_C(1) << (64 - IX_BITS)) - 1);
	if (gen == 0)
		gen = 1; /* workers start having seen generation 0 */
	atomic_store_explicit(&P->word, (gen << IX_BITS) | IX_CLOSED, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	/* guided chunks: about 4 nthreads ln(iterations) hand-outs */
	int64_t share = 4 * (int64_t)P->nthreads;
	atomic_store_explicit(&P->body, body, memory_order_relaxed);
	atomic_store_explicit(&P->env, env, memory_order_relaxed);
	atomic_store_explicit(&P->hi, hi, memory_order_relaxed);
	atomic_store_explicit(&P->share, share, memory_order_relaxed);
	atomic_store_explicit(&P->done, 0, memory_order_relaxed);
	atomic_store_explicit(&P->word, (gen << IX_BITS) | (uint64_t)lo, memory_order_release);
	pthread_mutex_lock(&P->mu);
	if (P->sleepers)
		pthread_cond_broadcast(&P->go);
	pthread_mutex_unlock(&P->mu);
	int64_t ran = take(P, gen, body, env, hi, share);
	/* every iteration is claimed now; wait for the ones other threads run */
	int64_t want = hi - lo - ran;
	for (int k = 0; atomic_load_explicit(&P->done, memory_order_acquire) < want; k++) {
		if (k < POOL_SPIN)
			cpu_relax();
		else
			sched_yield();
	}
}

cgen_pool *cgen_pool_create(moe_ctx *ctx, int nthreads)
{
	cgen_pool *P = ctx_alloc(ctx, sizeof *P);
	memset(P, 0, sizeof *P);
	P->ctx = ctx;
	P->nthreads = nthreads < 1 ? 1 : nthreads;
	pthread_mutex_init(&P->mu, NULL);
	pthread_cond_init(&P->go, NULL);
	atomic_init(&P->stop, false);
	atomic_init(&P->word, IX_CLOSED); /* generation 0, closed */
	atomic_init(&P->body, NULL);
	atomic_init(&P->env, NULL);
	atomic_init(&P->hi, 0);
	atomic_init(&P->share, 1);
	atomic_init(&P->done, 0);
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
	atomic_store_explicit(&P->stop, true, memory_order_release);
	pthread_cond_broadcast(&P->go);
	pthread_mutex_unlock(&P->mu);
	for (int i = 0; i < P->started; i++)
		pthread_join(P->th[i], NULL);
	pthread_mutex_destroy(&P->mu);
	pthread_cond_destroy(&P->go);
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
