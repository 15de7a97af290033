/* Serving (docs/semantics.md section 7): a layer compiled for T_max with an
 * n_tokens input, run for n in {0, 1, 7, T_max-1, T_max} on random x and
 * weights, against the same layer compiled for T = n:
 * - rows < n bitwise equal on the interpreter and the LLVM engine (portable
 *   kernels), and at n = 7 the C engine, each against itself;
 * - rows >= n all zero bytes;
 * - at n = 0 the host executes no block and no block row;
 * - n = -1 and n = T_max + 1 are refused with a located error;
 * - a layer whose output is not row-wise in the tokens is refused;
 * - a bucketed .tcpb of 1, 8, 64, 512, 4096 picks the smallest bucket >= n
 *   for every n in 0..4096 (none past 4096), is smaller than its programs
 *   apart, and a flipped byte in any bucket rejects it at load. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interp/interp.h"
#include "moec/backend.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "moec/tcp.h"

#define TMAX 37

static char cache_dir[] = "/tmp/moec-serving-test-XXXXXX";

static char *example(size_t *len, bool serving)
{
	FILE *f = fopen(MOEC_SOURCE_DIR "/examples/qwen3_30b_a3b.moe", "rb");
	assert_non_null(f);
	char *buf = calloc(1, 1 << 16);
	size_t n = fread(buf, 1, (1 << 16) - 64, f);
	fclose(f);
	buf[n] = 0;
	if (serving) { /* declare the token count after x */
		char *at = strstr(buf, "input  x : [T, D]\n");
		assert_non_null(at);
		at += strlen("input  x : [T, D]\n");
		const char *decl = "  input  n_tokens : i32[]\n";
		memmove(at + strlen(decl), at, strlen(at) + 1);
		memcpy(at, decl, strlen(decl));
	}
	*len = strlen(buf);
	return buf;
}

static moe_module *layer(moe_ctx *c, int64_t T, bool serving)
{
	size_t len;
	char *text = example(&len, serving);
	char tv[16];
	snprintf(tv, sizeof tv, "%lld", (long long)T);
	moe_setting sets[] = {{"T", tv}, {"D", "40"}, {"F", "24"}, {"E", "16"}, {"K", "4"}, {"B", "4"}};
	moe_settings ss = {sets, sizeof sets / sizeof *sets};
	moe_module *m = moe_parse_moe(c, "qwen3.moe", text, len, &ss);
	free(text);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	moe_run_opts ro = {.verify = 1};
	moe_status s = moe_run_pipeline_text(c, "host", m, &ro);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	return m;
}

/* engine 0: interpreter, 1: C, 2: LLVM (portable kernels, one thread) */
static moe_status run(moe_ctx *c, const moe_graph *g, const moe_tensor_map *b, int engine, moe_tensor **out,
	moe_host_stats *st)
{
	if (engine == 0)
		return moe_interp_run(c, g, b, out);
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.engine = engine == 1 ? MOE_HOST_C : MOE_HOST_LLVM;
	o.threads = 1;
	o.portable = 1;
	o.cache_dir = cache_dir; /* the serving layer compiles once for every n */
	return moe_host_run_opts(c, g, b, &o, out, st);
}

static moe_tensor *copy_rows(moe_ctx *c, const moe_tensor *t, int64_t rows)
{
	int64_t shape[2] = {rows, t->shape[1]};
	moe_tensor *r = moe_tensor_new(c, t->dtype, 2, shape);
	assert_non_null(r);
	memcpy(r->data, t->data, r->nbytes);
	return r;
}

static char *diag_text(moe_ctx *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	moe_diag_print(c, f);
	fclose(f);
	return buf;
}

static void set_tokens(moe_ctx *c, moe_tensor_map *b, int32_t n)
{
	moe_tensor *t = moe_tensor_new(c, MOE_I32, 0, NULL);
	assert_non_null(t);
	memcpy(t->data, &n, sizeof n);
	moe_tensor_map_set(b, "n_tokens", t);
}

static void test_rows_match_layer_of_n(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *sm = layer(c, TMAX, true);
	const moe_graph *sg = moe_module_graph(sm, 0);
	moe_tensor_map *bind = NULL;
	assert_int_equal(ir_interp_random_bindings(c, sg, 18, &bind), MOE_OK);
	const moe_tensor *x = moe_tensor_map_get(bind, "x");
	size_t row = x->nbytes / TMAX;
	const int64_t ns[] = {0, 1, 7, TMAX - 1, TMAX};
	for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
		int64_t n = ns[k];
		set_tokens(c, bind, (int32_t)n);
		moe_module *rm = n ? layer(c, n, false) : NULL;
		moe_tensor_map *rb = moe_tensor_map_new(c);
		static const char *const names[] = {"router", "gate", "up", "down"};
		for (int w = 0; w < 4; w++) { /* the same weights; x cut to n rows */
			const moe_tensor *t = moe_tensor_map_get(bind, names[w]);
			moe_tensor *cp = moe_tensor_new(c, t->dtype, t->rank, t->shape);
			memcpy(cp->data, t->data, t->nbytes);
			moe_tensor_map_set(rb, names[w], cp);
		}
		if (n)
			moe_tensor_map_set(rb, "x", copy_rows(c, x, n));
		for (int e = 0; e < 3; e++) {
			if (e == 1 && n != 7)
				continue; /* the C engine (slow to compile) at n = 7; portable LLVM is bitwise it */
			moe_tensor *ys[1] = {NULL}, *yr[1] = {NULL};
			moe_host_stats hs;
			moe_status s = run(c, sg, bind, e, ys, &hs);
			if (s)
				moe_diag_print(c, stderr);
			assert_int_equal(s, MOE_OK);
			if (rm) {
				assert_int_equal(run(c, moe_module_graph(rm, 0), rb, e, yr, NULL), MOE_OK);
				assert_int_equal(yr[0]->nbytes, (size_t)n * row);
				if (memcmp(ys[0]->data, yr[0]->data, yr[0]->nbytes))
					fail_msg("engine %d, n = %lld: rows below n differ from the layer compiled for T = n", e,
						(long long)n);
			}
			const unsigned char *p = (const unsigned char *)ys[0]->data;
			for (size_t b = (size_t)n * row; b < ys[0]->nbytes; b++)
				if (p[b])
					fail_msg("engine %d, n = %lld: byte %zu of a padded row is not zero", e, (long long)n, b);
			if (e && n == 0) { /* nothing but the zero output: no block, no block row */
				assert_int_equal(hs.blocks_executed, 0);
				assert_int_equal(hs.rows_executed, 0);
			}
			if (e && n == TMAX)
				assert_true(hs.blocks_executed > 0);
			moe_tensor_free(c, ys[0]);
			moe_tensor_free(c, yr[0]);
		}
		moe_tensor_map_free(rb);
		moe_module_free(rm);
	}
	/* out of range: a located error on every engine */
	const int32_t bad[] = {-1, TMAX + 1};
	for (int k = 0; k < 2; k++) {
		set_tokens(c, bind, bad[k]);
		for (int e = 0; e < 3; e++) {
			moe_tensor *ys[1] = {NULL};
			moe_diag_clear(c);
			assert_int_equal(run(c, sg, bind, e, ys, NULL), MOE_ERR_INVALID);
			assert_null(ys[0]);
			char *msg = diag_text(c);
			assert_non_null(strstr(msg, "qwen3.moe:"));
			assert_non_null(strstr(msg, "outside 0..37"));
			free(msg);
		}
	}
	moe_tensor_map_free(bind);
	moe_module_free(sm);
	moe_ctx_free(c);
}

/* An output that mixes tokens (a sum over the token axis) cannot have zero
 * rows past n: the dispatch refuses the serving layer. */
static void test_cross_token_output_refused(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *text = "layer bad {\n  dim T = 8, D = 4, F = 4, E = 4, K = 2, B = 2\n  input x : [T, D]\n"
			   "  input n_tokens : i32[]\n  weight r : [E, D] = \"r\"\n  weight g : [E, F, D] = \"g.{e}\"\n"
			   "  weight u : [E, F, D] = \"u.{e}\"\n  weight d : [E, D, F] = \"d.{e}\"\n"
			   "  l = einsum(\"td,ed->te\", x, r)\n  idx = topk(l, K)\n  w = take_along(l, idx, axis=1)\n"
			   "  y = experts(x, idx, w, gate=g, up=u, down=d, block=B)\n  s = cumsum(y, axis=0)\n  output s\n}\n";
	moe_module *m = moe_parse_moe(c, "bad.moe", text, strlen(text), NULL);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	moe_run_opts ro = {.verify = 1};
	assert_int_not_equal(moe_run_pipeline_text(c, "host", m, &ro), MOE_OK);
	char *msg = diag_text(c);
	if (!strstr(msg, "bad.moe:13:"))
		fail_msg("%s", msg);
	assert_non_null(strstr(msg, "serving (n_tokens): output 's'"));
	free(msg);
	moe_module_free(m);
	moe_ctx_free(c);
}

static moe_tcp_program *tcp_bucket(moe_ctx *c, const moe_tcp_machine *mach, int64_t T, size_t *bytes)
{
	size_t len;
	char *text = example(&len, true);
	char tv[16];
	snprintf(tv, sizeof tv, "%lld", (long long)T);
	moe_setting sets[] = {{"T", tv}, {"D", "40"}, {"F", "24"}, {"E", "16"}, {"K", "4"}, {"B", "8"}};
	moe_settings ss = {sets, sizeof sets / sizeof *sets};
	moe_module *m = moe_parse_moe(c, "qwen3.moe", text, len, &ss);
	free(text);
	assert_non_null(m);
	moe_run_opts ro = {.verify = 1};
	assert_int_equal(moe_run_pipeline_text(c, "tcp", m, &ro), MOE_OK);
	moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), mach);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	uint8_t *bin;
	assert_int_equal(moe_tcp_to_binary(c, p, &bin, bytes), MOE_OK);
	free(bin);
	moe_module_free(m);
	return p;
}

static void test_buckets(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *mach = moe_tcp_machine_default(c);
	const int64_t T[] = {1, 8, 64, 512, 4096};
	moe_tcp_program *p[5];
	size_t sum = 0;
	for (int b = 0; b < 5; b++) {
		size_t n;
		p[b] = tcp_bucket(c, mach, T[b], &n);
		sum += n;
	}
	char path[96];
	snprintf(path, sizeof path, "%s/b.tcpb", cache_dir);
	assert_int_equal(moe_tcp_bundle_write(c, (const moe_tcp_program *const *)p, T, 5, path), MOE_OK);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static uint8_t buf[1 << 21];
	size_t len = fread(buf, 1, sizeof buf, f);
	fclose(f);
	assert_true(len > 0 && len < sizeof buf);
	if (len >= sum)
		fail_msg("bucketed .tcpb of %zu bytes, the programs apart %zu", len, sum);
	moe_tcp_bundle *bu = moe_tcp_bundle_from_binary(c, path, buf, len, mach);
	if (!bu)
		moe_diag_print(c, stderr);
	assert_non_null(bu);
	assert_int_equal(moe_tcp_bundle_count(bu), 5);
	for (int64_t n = 0; n <= 4097; n++) { /* the smallest bucket >= n */
		int want = -1;
		for (int b = 4; b >= 0; b--)
			if (T[b] >= n)
				want = b;
		assert_int_equal(moe_tcp_bundle_pick(bu, n), want);
	}
	moe_tcp_bundle_free(bu);
	/* a flipped byte anywhere past the header is rejected */
	for (size_t at = 30; at < len; at += len / 7) {
		buf[at] ^= 0x10;
		moe_diag_clear(c);
		bu = moe_tcp_bundle_from_binary(c, path, buf, len, mach);
		if (bu)
			fail_msg("a flipped byte at %zu of %zu was not detected", at, len);
		buf[at] ^= 0x10;
	}
	for (int b = 0; b < 5; b++)
		moe_tcp_program_free(p[b]);
	moe_tcp_machine_free(c, mach);
	moe_ctx_free(c);
}

int main(void)
{
	if (!mkdtemp(cache_dir))
		return 1;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rows_match_layer_of_n),
		cmocka_unit_test(test_cross_token_output_refused),
		cmocka_unit_test(test_buckets),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	char cmd[96];
	snprintf(cmd, sizeof cmd, "rm -rf %s", cache_dir);
	if (system(cmd) != 0)
		rc = 1;
	return rc;
}
