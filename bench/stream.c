/* bench/stream.c: a small STREAM-like memory bandwidth probe for bench/run.
 *
 * Single-threaded on purpose: moec's host code and the PyTorch baseline both run on one
 * thread, so the roofline that matters is what one core can pull from DRAM.
 * Kernels over arrays far larger than the caches (default 256 MiB each):
 *   read   s += a[i]            (bytes: 8 per element)      -- the decode case: weights are only read
 *   copy   c[i] = a[i]          (16 per element)
 *   triad  a[i] = b[i] + q*c[i] (24 per element)
 * Each kernel runs N times; best and median are printed as one JSON object (GB = 1e9 B).
 * usage: stream [MiB per array] [N]
 */
#define _POSIX_C_SOURCE 200809L
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

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
	int reps = argc > 2 ? atoi(argv[2]) : 10;
	if (mib < 16 || reps < 1 || reps > 1000) {
		fprintf(stderr, "usage: stream [MiB per array >= 16] [repetitions 1..1000]\n");
		return 2;
	}
	size_t n = mib * 1024 * 1024 / 8;
	double *a = aligned_alloc(64, n * 8), *b = aligned_alloc(64, n * 8), *c = aligned_alloc(64, n * 8);
	if (!a || !b || !c) {
		fprintf(stderr, "stream: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < n; i++)
		a[i] = 1.0, b[i] = 2.0, c[i] = 0.5;
	double *t[3];
	for (int k = 0; k < 3; k++)
		t[k] = malloc(sizeof(double) * (size_t)reps);
	volatile uint64_t sink = 0;
	for (int r = 0; r < reps; r++) {
		double t0 = now();
		uint64_t bits;
		memcpy(&bits, &a[r % 7], 8);
		sink += read_kernel((const uint64_t *)(const void *)a, n) + bits;
		double t1 = now();
		copy_kernel(c, a, n);
		double t2 = now();
		triad_kernel(a, b, c, 0.5 + 1e-9 * r, n);
		double t3 = now();
		t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2;
	}
	const char *names[3] = {"read", "copy", "triad"};
	const double bytes[3] = {8.0 * n, 16.0 * n, 24.0 * n};
	printf("{\"threads\": 1, \"array_mib\": %zu, \"repetitions\": %d", mib, reps);
	for (int k = 0; k < 3; k++) {
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
