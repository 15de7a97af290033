/* Misuse of the C API (docs/api.md, "Diagnostics, not exits"): every case
 * returns a documented value or aborts with "moec: internal error at
 * FILE:LINE", never a SIGFPE, a SIGSEGV, signed overflow or a heap overflow.
 * Run under ASan and UBSan in CI.
 *
 * - the grid bounds with B = 0 (was SIGFPE) or another argument <= 0: 0;
 * - the grid and expert-parallel bounds where T*K passes 2^63 (was signed
 *   overflow): the exact bound when it fits in int64_t (values computed with
 *   Python's integers), else -1;
 * - NULL path, tensor or context to moe_npy_write, NULL arrays or context to
 *   moe_check_outputs (was SIGSEGV), a negative count to moe_node_set_ints (was
 *   a heap overflow): the internal-error abort. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moec/moec.h"

static void test_grid_bounds_degenerate(void **st)
{
	(void)st;
	const int64_t bad[][4] = {{5, 2, 8, 0}, {0, 2, 8, 4}, {5, 0, 8, 4}, {5, 2, 0, 4}, {-5, 2, 8, 4}, {5, 2, 8, -4},
		{INT64_MIN, 2, 8, 4}, {5, 2, 8, INT64_MIN}};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		const int64_t *a = bad[i];
		assert_int_equal(moe_grid_blocks_max(a[0], a[1], a[2], a[3]), 0);
		assert_int_equal(moe_grid_blocks_seed(a[0], a[1], a[2], a[3]), 0);
		assert_int_equal(moe_grid_blocks_vllm(a[0], a[1], a[2], a[3]), 0);
		assert_int_equal(moe_ep_grid_blocks_max(a[0], a[1], a[2], a[3]), 0);
		if (a[3] > 0)
			assert_int_equal(moe_ep_recv_rows_max(a[0], a[1], a[2]), 0);
	}
	/* small values keep the documented formulas (docs/semantics.md section 5) */
	assert_int_equal(moe_grid_blocks_max(16, 2, 8, 64), 8);   /* min(8 + 24/64, 8 * 1) */
	assert_int_equal(moe_grid_blocks_max(100, 2, 8, 16), 20);  /* min(8 + 192/16, 8 * 7) */
	assert_int_equal(moe_grid_blocks_seed(100, 2, 8, 16), 20); /* (200 - 8)/16 + 8 */
	assert_int_equal(moe_grid_blocks_vllm(100, 2, 8, 16), 20); /* ceil((200 + 120)/16) */
	assert_int_equal(moe_grid_blocks_vllm(1, 2, 8, 16), 2);    /* n < E: ceil(min(32, 122)/16) */
	assert_int_equal(moe_ep_recv_rows_max(10, 4, 2), 20);
	assert_int_equal(moe_ep_grid_blocks_max(10, 4, 2, 4), moe_grid_blocks_max(10, 2, 2, 4));
}

static void test_grid_bounds_large(void **st)
{
	(void)st;
	const int64_t T = INT64_MAX;
	/* T*K is about 2^66; the bounds fit (expected values from Python's exact integers) */
	assert_int_equal(moe_grid_blocks_max(T, 8, 8, 1 << 20), 70368744177664LL);
	assert_int_equal(moe_grid_blocks_seed(T, 8, 8, 1 << 20), 70368744177671LL);
	assert_int_equal(moe_grid_blocks_vllm(T, 8, 8, 1 << 20), 70368744177672LL);
	assert_int_equal(moe_ep_grid_blocks_max(T, 64, 8, 1 << 20), 70368744177664LL);
	/* T*K just past 2^63 where the bound M*ceil(T/B) is small */
	assert_int_equal(moe_grid_blocks_max(3037000500LL, 3037000500LL, 16, 1), 48592008000LL);
	assert_int_equal(moe_grid_blocks_max(INT64_C(1) << 62, 2, 64, INT64_C(1) << 40), 8388671);
	assert_int_equal(moe_grid_blocks_seed(INT64_C(1) << 62, 2, 64, INT64_C(1) << 40), 8388671);
	assert_int_equal(moe_grid_blocks_vllm(INT64_C(1) << 62, 2, 64, INT64_C(1) << 40), 8388672);
	/* bounds that do not fit: -1 */
	assert_int_equal(moe_grid_blocks_max(T, 4, T, 1), -1); /* 4 * (2^63 - 1) */
	assert_int_equal(moe_grid_blocks_seed(T, 2, 1, 1), -1);
	assert_int_equal(moe_grid_blocks_vllm(T, 2, 1, 1), -1);
	assert_int_equal(moe_ep_recv_rows_max(T, 8, 8), -1);
	assert_int_equal(moe_ep_grid_blocks_max(T, 4, T, 1), -1);
	assert_int_equal(moe_ep_recv_rows_max(T, 1, 8), T);
}

/* Runs f(arg) in a child with stderr to a file: it must abort (SIGABRT) after
 * printing "moec: internal error at ". */
static void expect_internal_error(void (*f)(void *), void *arg, const char *what)
{
	char path[] = "/tmp/moec-misuse-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fd, 2);
		f(arg);
		_exit(0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	char text[4096] = "";
	FILE *r = fopen(path, "r");
	assert_non_null(r);
	size_t n = fread(text, 1, sizeof text - 1, r);
	text[n] = 0;
	fclose(r);
	close(fd);
	unlink(path);
	if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT || !strstr(text, "moec: internal error at "))
		fail_msg("%s: status %d (signal %d), stderr: %s", what, status, WIFSIGNALED(status) ? WTERMSIG(status) : 0,
			text);
}

typedef struct npy_case {
	moe_ctx *ctx;
	const char *path;
	const moe_tensor *t;
} npy_case;

static void npy_call(void *a)
{
	npy_case *c = a;
	moe_npy_write(c->ctx, c->path, c->t);
}

static void test_npy_write_null(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	int64_t s[1] = {3};
	moe_tensor *t = moe_tensor_new(ctx, MOE_F32, 1, s);
	char dir[] = "/tmp/moec-misuse-npy-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[64];
	snprintf(path, sizeof path, "%s/y.npy", dir);
	npy_case cases[] = {{ctx, NULL, t}, {ctx, path, NULL}, {NULL, path, t}, {NULL, NULL, NULL}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char what[64];
		snprintf(what, sizeof what, "moe_npy_write case %zu", i);
		expect_internal_error(npy_call, &cases[i], what);
	}
	assert_int_not_equal(access(path, F_OK), 0); /* nothing was written */
	assert_int_equal(moe_npy_write(ctx, path, t), MOE_OK);
	assert_int_equal(access(path, F_OK), 0);
	unlink(path);
	rmdir(dir);
	moe_tensor_free(ctx, t);
	moe_ctx_free(ctx);
}

typedef struct out_case {
	moe_ctx *ctx;
	const char *const *in;
	size_t nin;
	const char *const *out;
	size_t nout;
} out_case;

static void out_call(void *a)
{
	out_case *c = a;
	moe_check_outputs(c->ctx, c->in, c->nin, c->out, c->nout);
}

static void test_check_outputs_null(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char file[] = "/tmp/moec-misuse-in-XXXXXX";
	int fd = mkstemp(file);
	assert_true(fd >= 0);
	close(fd);
	const char *in[1] = {file}, *out[1] = {"/tmp/moec-misuse-out.npy"};
	out_case cases[] = {{NULL, in, 1, out, 1}, {ctx, NULL, 1, out, 1}, {ctx, in, 1, NULL, 1}, {NULL, NULL, 0, NULL, 0}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char what[64];
		snprintf(what, sizeof what, "moe_check_outputs case %zu", i);
		expect_internal_error(out_call, &cases[i], what);
	}
	/* empty arrays may be NULL; NULL entries are skipped */
	assert_int_equal(moe_check_outputs(ctx, NULL, 0, NULL, 0), MOE_OK);
	const char *holes[2] = {NULL, NULL};
	assert_int_equal(moe_check_outputs(ctx, holes, 2, holes, 2), MOE_OK);
	assert_int_equal(moe_check_outputs(ctx, in, 1, in, 1), MOE_ERR_INVALID);
	unlink(file);
	moe_ctx_free(ctx);
}

typedef struct ints_case {
	moe_graph *g;
	const int64_t *v;
	int count;
} ints_case;

static void ints_call(void *a)
{
	ints_case *c = a;
	moe_node_set_ints(c->g, 0, "k", c->v, c->count);
}

static void test_set_ints_negative(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(ctx);
	moe_graph *g = moe_module_add_graph(m, "l");
	moe_id x = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	int64_t s[1] = {2}, v[3] = {1, 2, 3};
	moe_node_set_type(g, x, MOE_F32, s, 1);
	ints_case cases[] = {{g, v, -1}, {g, v, INT32_MIN}, {g, NULL, 3}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char what[64];
		snprintf(what, sizeof what, "moe_node_set_ints case %zu", i);
		expect_internal_error(ints_call, &cases[i], what);
	}
	/* an empty list (even from NULL) and a real one are set */
	moe_node_set_ints(g, x, "empty", NULL, 0);
	moe_node_set_ints(g, x, "three", v, 3);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_int_equal(moe_module_print(m, f), MOE_OK);
	fclose(f);
	assert_non_null(strstr(buf, "{empty=[], three=[1, 2, 3]}"));
	free(buf);
	moe_module_free(m);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grid_bounds_degenerate),
		cmocka_unit_test(test_grid_bounds_large),
		cmocka_unit_test(test_npy_write_null),
		cmocka_unit_test(test_check_outputs_null),
		cmocka_unit_test(test_set_ints_negative),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
