/* tests/unit/test_oom.c: the allocation-failure sweep (issue 15, in the
 * manner of SQLite's malloc tests). An allocator hook refuses the k-th
 * request; for a compile of a tiny layer (C, LLVM object, TCP with its .tcpb)
 * and for a run (interpreter, host LLVM JIT, TCP simulator), k goes 1, 2, ...
 * until the operation succeeds without a refusal. Every k that refuses must
 * end in MOE_ERR_NOMEM (or NULL with the error "out of memory") from the
 * call that met it, with every block returned to the hook once the objects
 * and the context are freed (the hook counts live bytes; ASan/LSan check the
 * rest in the sanitizer build) and no file left in the output directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moec/moec.h"

static const char layer_text[] =
	"layer tiny {\n"
	"  dim T = 3, D = 4, F = 4, E = 4, K = 2, B = 2\n"
	"  dtype f32\n"
	"  input  x : [T, D]\n"
	"  weight router : [E, D] = \"router\"\n"
	"  weight w1 : [E, F, D] = \"w1\"\n"
	"  weight w3 : [E, F, D] = \"w3\"\n"
	"  weight w2 : [E, D, F] = \"w2\"\n"
	"  p   = softmax(einsum(\"td,ed->te\", x, router), axis=1)\n"
	"  idx = topk(p, k=K)\n"
	"  top = take_along(p, idx, axis=1)\n"
	"  w   = top / reduce_sum(top, axis=1, keepdims=1)\n"
	"  y   = experts(x, idx, w, gate=w1, up=w3, down=w2, act=\"swiglu\", block=B)\n"
	"  output y\n"
	"}\n";

/* ---- the hook: refuses request number fail_at (1-based), once ---- */
typedef struct hook {
	long calls, fail_at;
	int failed;
	long long live; /* bytes handed out and not yet returned */
} hook;

static void *alloc_hook(void *ud, void *p, size_t o, size_t n)
{
	hook *h = ud;
	if (n == 0) {
		if (p)
			h->live -= (long long)o;
		free(p);
		return NULL;
	}
	if (++h->calls == h->fail_at) {
		h->failed = 1;
		return NULL;
	}
	void *q = realloc(p, n);
	if (q)
		h->live += (long long)n - (long long)(p ? o : 0);
	return q;
}

/* ---- one operation; MOE_ERR_NOMEM from the step that met the refusal ---- */
typedef struct flow {
	moe_ctx *c;
	const char *dir;
	moe_module *m;
	moe_tcp_program *p;
	moe_tensor_map *bind;
	moe_tensor *out[2];
} flow;

static bool said_oom(moe_ctx *c)
{
	for (size_t i = 0; i < moe_diag_count(c); i++) {
		moe_diag_kind k;
		const char *msg;
		moe_diag_get(c, i, &k, NULL, &msg);
		if (k == MOE_DIAG_ERROR && strstr(msg, "out of memory"))
			return true;
	}
	return false;
}

/* A NULL result: out of memory, or a failure the sweep does not expect. */
static moe_status null_status(flow *f)
{
	return said_oom(f->c) ? MOE_ERR_NOMEM : MOE_ERR_INTERNAL;
}

static moe_status parse(flow *f, const char *pipeline)
{
	f->m = moe_parse_moe(f->c, "tiny.moe", layer_text, strlen(layer_text), NULL);
	if (!f->m)
		return null_status(f);
	return pipeline ? moe_run_pipeline_text(f->c, pipeline, f->m, NULL) : MOE_OK;
}

static moe_status bind(flow *f)
{
	static const struct {
		const char *name;
		int rank;
		int64_t shape[3];
	} t[] = {{"x", 2, {3, 4}}, {"router", 2, {4, 4}}, {"w1", 3, {4, 4, 4}}, {"w3", 3, {4, 4, 4}},
		{"w2", 3, {4, 4, 4}}};
	f->bind = moe_tensor_map_new(f->c);
	if (!f->bind)
		return null_status(f);
	uint32_t seed = 7;
	for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
		moe_tensor *x = moe_tensor_new(f->c, MOE_F32, t[i].rank, t[i].shape);
		if (!x)
			return null_status(f);
		for (int64_t k = 0; k < moe_tensor_numel(x); k++) {
			seed = seed * 1103515245u + 12345u;
			((float *)x->data)[k] = (float)((seed >> 16) % 2001) / 1000.0f - 1.0f;
		}
		moe_status s = moe_tensor_map_set(f->bind, t[i].name, x);
		if (s != MOE_OK)
			return s;
	}
	return MOE_OK;
}

static char *out_path(const flow *f, const char *name)
{
	static char buf[4096];
	snprintf(buf, sizeof buf, "%s/%s", f->dir, name);
	return buf;
}

static moe_status compile_c(flow *f)
{
	moe_status s = parse(f, "host");
	return s ? s : moe_emit_c_file(f->c, moe_module_graph(f->m, 0), out_path(f, "tiny.c"));
}

static moe_status compile_llvm(flow *f)
{
	moe_status s = parse(f, "host");
	return s ? s : moe_emit_object(f->c, moe_module_graph(f->m, 0), out_path(f, "tiny.o"));
}

static moe_status compile_tcp(flow *f)
{
	moe_status s = parse(f, "tcp");
	if (s)
		return s;
	f->p = moe_tcp_compile(f->c, moe_module_graph(f->m, 0), NULL);
	if (!f->p)
		return null_status(f);
	return moe_tcp_write_binary(f->c, f->p, out_path(f, "tiny.tcpb"));
}

static moe_status run_interp(flow *f)
{
	moe_status s = parse(f, NULL);
	s = s ? s : bind(f);
	return s ? s : moe_interp_run(f->c, moe_module_graph(f->m, 0), f->bind, f->out);
}

static moe_status run_host(flow *f)
{
	moe_status s = parse(f, "host");
	s = s ? s : bind(f);
	if (s)
		return s;
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.threads = 2; /* the thread pool is a resource a failure must release */
	o.no_cache = 1;
	return moe_host_run_opts(f->c, moe_module_graph(f->m, 0), f->bind, &o, f->out, NULL);
}

static moe_status run_tcp(flow *f)
{
	moe_status s = parse(f, "tcp");
	s = s ? s : bind(f);
	if (s)
		return s;
	f->p = moe_tcp_compile(f->c, moe_module_graph(f->m, 0), NULL);
	if (!f->p)
		return null_status(f);
	moe_tcp_stats st;
	return moe_tcp_run(f->c, f->p, f->bind, NULL, f->out, &st);
}

static void flow_free(flow *f)
{
	for (int i = 0; i < 2; i++)
		moe_tensor_free(f->c, f->out[i]);
	moe_tensor_map_free(f->bind);
	moe_tcp_program_free(f->p);
	moe_module_free(f->m);
	moe_ctx_free(f->c);
}

static int dir_entries(const char *dir)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

/* Refuse request k = 1, 2, ... until op succeeds untouched; returns the
 * number of requests op makes. */
static long sweep(const char *what, moe_status (*op)(flow *))
{
	char dir[] = "/tmp/moec-oom-XXXXXX";
	assert_non_null(mkdtemp(dir));
	long k;
	/* MOEC_OOM_K=k starts the sweep at k (to debug one refusal) */
	const char *from = getenv("MOEC_OOM_K");
	for (k = from ? atol(from) : 1;; k++) {
		hook h = {0, k, 0, 0};
		flow f = {0};
		f.dir = dir;
		f.c = moe_ctx_new(alloc_hook, &h);
		moe_status s = f.c ? op(&f) : MOE_ERR_NOMEM;
		if (!h.failed && s != MOE_OK)
			moe_diag_print(f.c, stderr);
		if (h.failed && s != MOE_ERR_NOMEM) {
			fprintf(stderr, "%s: request %ld refused: status %s, not out of memory\n", what, k,
				moe_status_string(s));
			if (f.c)
				moe_diag_print(f.c, stderr);
			fail();
		}
		if (f.c && h.failed && !said_oom(f.c)) {
			fprintf(stderr, "%s: request %ld refused: no error says \"out of memory\"\n", what, k);
			moe_diag_print(f.c, stderr);
			fail();
		}
		flow_free(&f);
		if (h.live != 0)
			fprintf(stderr, "%s: request %ld refused: %lld bytes not returned\n", what, k, h.live);
		assert_int_equal(h.live, 0);
		if (!h.failed) {
			assert_int_equal(s, MOE_OK);
			break;
		}
		if (dir_entries(dir) != 0)
			fprintf(stderr, "%s: request %ld refused: a file was left in %s\n", what, k, dir);
		assert_int_equal(dir_entries(dir), 0);
	}
	for (int i = 0; i < 4; i++) { /* the successful compile's output */
		static const char *const names[] = {"tiny.c", "tiny.o", "tiny.tcpb", "x"};
		unlink(out_path(&(flow){.dir = dir}, names[i]));
	}
	assert_int_equal(rmdir(dir), 0);
	printf("%s: %ld allocation requests, each refused in turn\n", what, k - 1);
	return k - 1;
}

static void test_compile_c(void **st)
{
	(void)st;
	assert_true(sweep("compile host C", compile_c) > 20);
}

static void test_compile_llvm(void **st)
{
	(void)st;
	assert_true(sweep("compile host LLVM object", compile_llvm) > 20);
}

static void test_compile_tcp(void **st)
{
	(void)st;
	assert_true(sweep("compile tcp + .tcpb", compile_tcp) > 20);
}

static void test_run_interp(void **st)
{
	(void)st;
	assert_true(sweep("run interp", run_interp) > 20);
}

static void test_run_host(void **st)
{
	(void)st;
	assert_true(sweep("run host (LLVM JIT, 2 threads)", run_host) > 20);
}

static void test_run_tcp(void **st)
{
	(void)st;
	assert_true(sweep("run tcp simulator", run_tcp) > 20);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_run_interp),
		cmocka_unit_test(test_compile_c),
		cmocka_unit_test(test_compile_tcp),
		cmocka_unit_test(test_run_tcp),
		cmocka_unit_test(test_compile_llvm),
		cmocka_unit_test(test_run_host),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
