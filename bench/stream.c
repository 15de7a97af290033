/* bench/stream.c: a small STREAM-like memory bandwidth probe for bench/run.
 *
 * With THREADS threads (default 1) each kernel is split into THREADS contiguous slices,
 * one per thread, and timed from before the threads start to after the last joins: the
 * roofline for moec and PyTorch run with the same thread count.
 * Kernels over arrays of MiB each (default 256: far larger than the caches; bench/run also
 * runs it at the size of what the Qwen3 layer reads at T=1, see there):
 *   read   s += a[i]            (bytes: 8 per element)      -- the decode case: weights are only read
 *   copy   c[i] = a[i]          (16 per element)
 *   triad  a[i] = b[i] + q*c[i] (24 per element)
 * Each kernel runs N times; best and median are printed as one JSON object (GB = 1e9 B).
 * With a fourth argument "read" only the read kernel runs, N times back to back over the
 * same array (copy and triad, which would stir the caches in between, are left out).
 * usage: stream [MiB per array] [N] [THREADS] [read]
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

/* Integer sum: freely vectorised, no floating-point reassociation question. */
static uint64_t read_kernel(const uint64_t *restrict a, size_t n)
{
	uint64_t s = 0;
	for (size_t i = 0; i < n; i++)
		s += a[i];
	return s;
}

static void copy_kernel(double *restrict c, const double *restrict a, size_t n)
{
	for (size_t i = 0; i < n; i++)
		c[i] = a[i];
}

static void triad_kernel(double *restrict a, const double *restrict b, const double *restrict c, double q, size_t n)
{
	for (size_t i = 0; i < n; i++)
		a[i] = b[i] + q * c[i];
}

/* one thread's slice [lo, hi) of one kernel */
typedef struct job {
	int kernel; /* 0 read, 1 copy, 2 triad, 3 initialise */
	double *a, *b, *c, q;
	size_t lo, hi;
	uint64_t sum;
} job;

static void *run_job(void *arg)
{
	job *j = arg;
	size_t n = j->hi - j->lo;
	switch (j->kernel) {
	case 0: j->sum = read_kernel((const uint64_t *)(const void *)(j->a + j->lo), n); break;
	case 1: copy_kernel(j->c + j->lo, j->a + j->lo, n); break;
	case 2: triad_kernel(j->a + j->lo, j->b + j->lo, j->c + j->lo, j->q, n); break;
	default:
		for (size_t i = j->lo; i < j->hi; i++)
			j->a[i] = 1.0, j->b[i] = 2.0, j->c[i] = 0.5;
	}
	return NULL;
}

/* runs kernel k over n elements on nt threads; returns the read sum */
static uint64_t run_kernel(int k, double *a, double *b, double *c, double q, size_t n, int nt)
{
	job jobs[64];
	pthread_t th[64];
	for (int i = 0; i < nt; i++)
		jobs[i] = (job){k, a, b, c, q, n * (size_t)i / (size_t)nt, n * (size_t)(i + 1) / (size_t)nt, 0};
	for (int i = 1; i < nt; i++)
		if (pthread_create(&th[i], NULL, run_job, &jobs[i]) != 0) {
			fprintf(stderr, "stream: cannot start a thread\n");
			exit(1);
		}
	run_job(&jobs[0]);
	uint64_t s = jobs[0].sum;
	for (int i = 1; i < nt; i++) {
		pthread_join(th[i], NULL);
		s += jobs[i].sum;
	}
	return s;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
	int reps = argc > 2 ? atoi(argv[2]) : 10;
	int nt = argc > 3 ? atoi(argv[3]) : 1;
	int only_read = argc > 4 && !strcmp(argv[4], "read");
	if (mib < 16 || reps < 1 || reps > 1000 || nt < 1 || nt > 64 || (argc > 4 && !only_read)) {
		fprintf(stderr, "usage: stream [MiB per array >= 16] [repetitions 1..1000] [threads 1..64] [read]\n");
		return 2;
	}
	size_t n = mib * 1024 * 1024 / 8;
	double *a = aligned_alloc(64, n * 8), *b = aligned_alloc(64, n * 8), *c = aligned_alloc(64, n * 8);
	if (!a || !b || !c) {
		fprintf(stderr, "stream: out of memory\n");
		return 1;
	}
	run_kernel(3, a, b, c, 0, n, nt); /* each thread first touches its own slice */
	double *t[3];
	for (int k = 0; k < 3; k++)
		t[k] = malloc(sizeof(double) * (size_t)reps);
	volatile uint64_t sink = 0;
	for (int r = 0; r < reps; r++) {
		double t0 = now();
		uint64_t bits;
		memcpy(&bits, &a[r % 7], 8);
		sink += run_kernel(0, a, b, c, 0, n, nt) + bits;
		double t1 = now();
		t[0][r] = t1 - t0;
		if (only_read)
			continue;
		run_kernel(1, a, b, c, 0, n, nt);
		double t2 = now();
		run_kernel(2, a, b, c, 0.5 + 1e-9 * r, n, nt);
		double t3 = now();
		t[1][r] = t2 - t1, t[2][r] = t3 - t2;
	}
	const char *names[3] = {"read", "copy", "triad"};
	const double bytes[3] = {8.0 * n, 16.0 * n, 24.0 * n};
	printf("{\"threads\": %d, \"array_mib\": %zu, \"repetitions\": %d", nt, mib, reps);
	for (int k = 0; k < (only_read ? 1 : 3); k++) {
		qsort(t[k], (size_t)reps, sizeof(double), cmp);
		double med = reps % 2 ? t[k][reps / 2] : 0.5 * (t[k][reps / 2 - 1] + t[k][reps / 2]);
		printf(", \"%s_best_gbs\": %.3f, \"%s_median_gbs\": %.3f", names[k], bytes[k] / t[k][0] / 1e9, names[k],
			bytes[k] / med / 1e9);
	}
	printf(", \"checksum\": %llu}\n", (unsigned long long)(sink & 0xffff));
	free(a), free(b), free(c);
	for (int k = 0; k < 3; k++)
		free(t[k]);
	return 0;
}
