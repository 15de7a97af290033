/* tests/unit/test_hostile_run.c: hostile inputs and faults in the
 * compiler and the simulator: deep and long .moe sources; machine fields out
 * of range; TCP programs that never terminate and counters that would wrap;
 * inf in TCP f32 contractions; allocations the allocator refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend-tcp/isa/tcp_int.h"
#include "moec/moec.h"
#include "hostile_util.h"


static moe_module *parse(moe_ctx *c, const char *text)
{
	return moe_parse_moe(c, "t.moe", text, strlen(text), NULL);
}

/* ---- the frontend (items 3 and 9) ---- */

static void test_deep_expressions(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t n = 30000, cap = 4 * n + 200;
	char *s = malloc(cap), *p = s;
	p += sprintf(p, "layer s {\n  dim T = 4, D = 8\n  input x : [T, D]\n  y = x");
	for (size_t i = 1; i < n; i++)
		p += sprintf(p, " + x");
	sprintf(p, "\n  output y\n}\n");
	assert_null(parse(c, s));
	assert_non_null(strstr(last_error(c), "nested too deeply"));
	/* 20,000 open brackets: our message, not Bison's "memory exhausted" */
	moe_diag_clear(c);
	p = s + sprintf(s, "layer s {\n  dim T = 4\n  input x : [T]\n  y = ");
	for (int i = 0; i < 20000; i++)
		*p++ = '(';
	sprintf(p, "x\n  output y\n}\n");
	assert_null(parse(c, s));
	assert_non_null(strstr(last_error(c), "brackets nested too deeply"));
	assert_int_equal(moe_error_count(c), 1);
	/* 999 levels still lower */
	moe_diag_clear(c);
	p = s + sprintf(s, "layer s {\n  dim T = 4\n  input x : [T]\n  y = x");
	for (int i = 1; i < 999; i++)
		p += sprintf(p, " + x");
	sprintf(p, "\n  output y\n}\n");
	moe_module *m = parse(c, s);
	assert_non_null(m);
	moe_module_free(m);
	free(s);
	moe_ctx_free(c);
}

/* 100,000 statements: lowering is linear (hashed names). Must-show 3. */
static void test_100k_statements(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t n = 100000;
	char *s = malloc(40 * n + 200), *p = s;
	p += sprintf(p, "layer big {\n  dim T = 4, D = 8\n  input x : [T, D]\n  a0 = x\n");
	for (size_t i = 1; i < n; i++)
		p += sprintf(p, "  a%zu = a%zu + x\n", i, i - 1);
	sprintf(p, "  output a%zu\n}\n", n - 1);
	/* CPU time of this process: ctest -j runs other tests beside it */
	struct timespec a, b;
	double w0 = now();
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
	moe_module *m = parse(c, s);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
	double dt = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec), wall = now() - w0;
	assert_non_null(m);
	print_message("100000 statements parsed and lowered in %.3f s of CPU time (%.3f s wall)\n", dt, wall);
#if defined(__SANITIZE_ADDRESS__) || defined(__OPTIMIZE__) == 0
	assert_true(dt < 5.0); /* sanitizer or -O0 builds: 40k took 15.7 s before */
#else
	assert_true(dt < 1.0);
#endif
	moe_module_free(m);
	free(s);
	moe_ctx_free(c);
}

/* ---- the machine description (item 3) ---- */

static moe_tcp_machine *machine_with(moe_ctx *c, const char *from, const char *to)
{
	const char *d = tcp_default_machine_json, *at_ = strstr(d, from);
	assert_non_null(at_);
	size_t n = strlen(d) + strlen(to) + 1;
	char *buf = malloc(n);
	snprintf(buf, n, "%.*s%s%s", (int)(at_ - d), d, to, at_ + strlen(from));
	moe_tcp_machine *m = moe_tcp_machine_parse(c, "m.json", buf, strlen(buf));
	free(buf);
	return m;
}

static void test_machine_fields_bounded(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	static const char *const cases[][3] = {
		{"\"flit_bytes\": 32", "\"flit_bytes\": 2", "multiple of 4"},
		{"\"flit_bytes\": 32", "\"flit_bytes\": 3", "multiple of 4"},
		{"\"clusters\": 2", "\"clusters\": 4294967296", "clusters"},
		{"\"slices_per_cluster\": 256", "\"slices_per_cluster\": 65536", "65536 slices"},
		{"\"clock_hz\": 1.0e9", "\"clock_hz\": 1e300", "clock_hz"},
		{"\"hbm_bytes_per_s\": 1.5e12", "\"hbm_bytes_per_s\": 1", "hbm_bytes_per_s"},
		{"\"setup_cycles\": 500", "\"setup_cycles\": 1e15", "setup_cycles"},
		{"\"hbm_unaligned_write_factor\": 50.0", "\"hbm_unaligned_write_factor\": 1e30", "unaligned"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		moe_diag_clear(c);
		assert_null(machine_with(c, cases[i][0], cases[i][1]));
		if (!strstr(last_error(c), cases[i][2]))
			fail_msg("case %zu: '%s'", i, last_error(c));
	}
	moe_ctx_free(c);
}

/* ---- TCP programs that never end (item 5) ---- */

#define META "tcps 1\nmeta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 " \
	     "nblocks=-1 bexp=-1 loop=-1 body=-1\n"

static void test_tcp_loops(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	/* a bare jmp @0, and a 196,608-element copy in a jmp loop: rejected at load */
	const char *jmp0 = META "@0: jmp target=@0\n";
	assert_null(moe_tcp_from_asm(c, "j.tcps", jmp0, strlen(jmp0), NULL));
	assert_non_null(strstr(last_error(c), "cannot terminate"));
	const char *copy = META "tensor %0 hbm scratch f32 [196608] addr=0 slice=0 const=0 \"a\"\n"
				"tensor %1 hbm scratch f32 [196608] addr=1048576 slice=0 const=0 \"b\"\n"
				"@0: dma.copy dims=[196608] dst=%1+0:[1] s0=%0+0:[1]\n"
				"@1: jmp target=@0\n";
	moe_diag_clear(c);
	assert_null(moe_tcp_from_asm(c, "c.tcps", copy, strlen(copy), NULL));
	assert_non_null(strstr(last_error(c), "cannot terminate"));
	/* a loop whose exit is never taken: the budget from the program ends it quickly */
	const char *spin = META "@0: li rd=r1 imm=1\n"
				"@1: br.lt ra=r1 rb=r2 target=@3\n"
				"@2: jmp target=@1\n"
				"@3: halt\n";
	moe_diag_clear(c);
	moe_tcp_program *p = moe_tcp_from_asm(c, "s.tcps", spin, strlen(spin), NULL);
	assert_non_null(p);
	double t0 = now();
	assert_int_equal(moe_tcp_run(c, p, NULL, NULL, NULL, NULL), MOE_ERR_RUNTIME);
	assert_true(now() - t0 < 2.0);
	assert_non_null(strstr(last_error(c), "instruction budget"));
	moe_tcp_program_free(p);
	/* The parse-time ranges keep a DMA far below 1e15 cycles (an 8 MB HBM write at
	 * 1e6 B/s and 1e11 Hz: 8e11); a machine built past them in memory (the
	 * struct is the library's own) must still fault, not wrap float->int64. */
	moe_tcp_machine *slow = moe_tcp_machine_default(c);
	assert_non_null(slow);
	slow->hbm_bytes_per_s = 1e-3;
	const char *big = META "tensor %0 hbm scratch f32 [2097152] addr=0 slice=0 const=0 \"a\"\n"
			       "tensor %1 hbm scratch f32 [2097152] addr=8388608 slice=0 const=0 \"b\"\n"
			       "@0: dma.copy dims=[2097152] dst=%1+0:[1] s0=%0+0:[1]\n"
			       "@1: halt\n";
	moe_diag_clear(c);
	p = moe_tcp_from_asm(c, "big.tcps", big, strlen(big), slow);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	moe_tcp_run_opts ro = {.machine = slow};
	moe_tcp_stats stats;
	assert_int_equal(moe_tcp_run(c, p, NULL, &ro, NULL, &stats), MOE_ERR_RUNTIME);
	assert_non_null(strstr(last_error(c), "passed 2^60"));
	assert_true(stats.cycles >= 0);
	moe_tcp_program_free(p);
	moe_tcp_machine_free(c, slow);
	moe_ctx_free(c);
}

/* ---- inf in an f32 contraction on TCP (item 7) ---- */

static void test_tcp_f32_inf_like_ieee(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *src = "layer l {\n  dim T = 4, D = 8, E = 4\n  dtype f32\n  input x : [T, D]\n"
			  "  weight w : [E, D] = \"w\"\n  y = einsum(\"td,ed->te\", x, w)\n  output y\n}\n";
	moe_module *orig = parse(c, src), *m = parse(c, src);
	assert_non_null(orig);
	assert_int_equal(moe_run_pipeline_text(c, "tcp", m, NULL), MOE_OK);
	moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	int64_t xs[2] = {4, 8}, ws[2] = {4, 8};
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 2, xs), *w = moe_tensor_new(c, MOE_F32, 2, ws);
	float *xd = x->data, *wd = w->data;
	for (int i = 0; i < 32; i++) {
		xd[i] = (float)i / 10.0f - 1.0f; /* lo parts non-zero: the old cross terms gave inf x 0 */
		wd[i] = 0.5f;
	}
	xd[1 * 8 + 3] = 0.0f; /* inf x 0 = NaN in IEEE too */
	wd[0 * 8 + 3] = INFINITY;
	wd[2 * 8 + 5] = -INFINITY;
	moe_tensor_map *b = moe_tensor_map_new(c);
	moe_tensor_map_set(b, "x", x);
	moe_tensor_map_set(b, "w", w);
	moe_tensor *host[1] = {0}, *tcp[1] = {0};
	assert_int_equal(moe_interp_run(c, moe_module_graph(orig, 0), b, host), MOE_OK);
	assert_int_equal(moe_tcp_run(c, p, b, NULL, tcp, NULL), MOE_OK);
	const float *h = host[0]->data, *t = tcp[0]->data;
	int nonfinite = 0;
	for (int i = 0; i < 16; i++) {
		if (!isfinite(h[i])) {
			nonfinite++;
			if (isnan(h[i]))
				assert_true(isnan(t[i]));
			else
				assert_true(t[i] == h[i]); /* same infinity */
		} else {
			assert_true(fabsf(t[i] - h[i]) <= 1e-4f * (1.0f + fabsf(h[i])));
		}
	}
	assert_int_equal(nonfinite, 8); /* columns 0 and 2 of every row */
	moe_tensor_free(c, host[0]);
	moe_tensor_free(c, tcp[0]);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_module_free(orig);
	moe_ctx_free(c);
}

/* ---- allocation failures are errors, not aborts (item 4) ---- */

/* An allocator hook that refuses any block over 64 MiB. */
static void *small_alloc(void *ud, void *p, size_t o, size_t n)
{
	(void)ud;
	(void)o;
	if (!n) {
		free(p);
		return NULL;
	}
	return n > ((size_t)64 << 20) ? NULL : realloc(p, n);
}

static void test_refused_allocations(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(small_alloc, NULL);
	int64_t shape[2] = {8, (int64_t)1 << 30};
	assert_null(moe_tensor_new(c, MOE_F32, 2, shape));
	assert_non_null(strstr(last_error(c), "out of memory"));
	/* one_hot(i, 2147483647) on the host: the output cannot be allocated */
	moe_diag_clear(c);
	const char *src = "layer l {\n  dim T = 4, D = 8, E = 4\n  dtype f32\n  input x : [T, D]\n"
			  "  weight w : [E, D] = \"w\"\n  s = einsum(\"td,ed->te\", x, w)\n  i = topk(s, k=1)\n"
			  "  h = one_hot(i, 2147483647)\n  output h\n}\n";
	moe_module *m = parse(c, src);
	assert_non_null(m);
	assert_int_equal(moe_run_pipeline_text(c, "host", m, NULL), MOE_OK);
	int64_t xs[2] = {4, 8};
	moe_tensor_map *b = moe_tensor_map_new(c);
	moe_tensor_map_set(b, "x", moe_tensor_new(c, MOE_F32, 2, xs));
	moe_tensor_map_set(b, "w", moe_tensor_new(c, MOE_F32, 2, xs));
	moe_tensor *out[1] = {0};
	moe_host_stats hs;
	assert_int_not_equal(moe_host_run(c, moe_module_graph(m, 0), b, MOE_HOST_LLVM, 1, out, &hs), MOE_OK);
	assert_null(out[0]);
	assert_non_null(strstr(last_error(c), "out of memory"));
	/* the reference interpreter: the same refusal is an error, not an abort */
	moe_diag_clear(c);
	assert_int_equal(moe_interp_run(c, moe_module_graph(m, 0), b, out), MOE_ERR_NOMEM);
	assert_null(out[0]);
	assert_non_null(strstr(last_error(c), "out of memory allocating"));
	moe_tensor_map_free(b);
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deep_expressions),
		cmocka_unit_test(test_100k_statements),
		cmocka_unit_test(test_machine_fields_bounded),
		cmocka_unit_test(test_tcp_loops),
		cmocka_unit_test(test_tcp_f32_inf_like_ieee),
		cmocka_unit_test(test_refused_allocations),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
