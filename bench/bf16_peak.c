/* bench/bf16_peak.c: the bf16 dot-product peak of one core (bench/REPORT.md
 * section 1). 24 independent accumulators, no memory operands: first
 * vdpbf16ps zmm (16 lanes x 2 bf16 products = 64 flops each), then
 * vfmadd231ps zmm (16 FMAs = 32 flops) for comparison. Prints instructions
 * per second and GFLOP/s of the calling thread (CPU time, so other processes
 * on the core cost little). Not part of the build; needs AVX512-BF16 and
 * clang (gcc 12 keeps the accumulator array in memory, which measures the
 * store-to-load latency instead):
 *   clang -O3 -mavx512f -mavx512bf16 -o /tmp/bf16_peak bench/bf16_peak.c && /tmp/bf16_peak */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

enum { ACC = 24 };

static double cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void)
{
	const long n = 20000000;
	__m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
	__m512 acc[ACC];
	for (int i = 0; i < ACC; i++)
		acc[i] = _mm512_set1_ps((float)i);
	double t = cpu_now();
	for (long r = 0; r < n; r++) {
		for (int i = 0; i < ACC; i++)
			acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
		__asm__ volatile("" : "+v"(a), "+v"(b)); /* keeps the operands opaque */
	}
	t = cpu_now() - t;
	float s = 0;
	for (int i = 0; i < ACC; i++)
		s += _mm512_reduce_add_ps(acc[i]);
	double ips = (double)n * ACC / t;
	printf("vdpbf16ps zmm: %.2f G/s = %.1f GFLOP/s (64 flops each)  [%g]\n", ips / 1e9, ips * 64 / 1e9, (double)s);

	__m512 c = _mm512_set1_ps(1.0001f), f[ACC];
	for (int i = 0; i < ACC; i++)
		f[i] = _mm512_set1_ps((float)i);
	t = cpu_now();
	for (long r = 0; r < n; r++) {
		for (int i = 0; i < ACC; i++)
			f[i] = _mm512_fmadd_ps(f[i], c, c);
		__asm__ volatile("" : "+v"(c));
	}
	t = cpu_now() - t;
	s = 0;
	for (int i = 0; i < ACC; i++)
		s += _mm512_reduce_add_ps(f[i]);
	ips = (double)n * ACC / t;
	printf("vfmadd zmm:    %.2f G/s = %.1f GFLOP/s (32 flops each)  [%g]\n", ips / 1e9, ips * 32 / 1e9, (double)s);
	return 0;
}
