/* Direct tests of public functions of moec/backend.h against their
 * documented contracts (backend.h, docs/api.md, docs/abi.md): moe_emit_c to
 * a stream (compiled by the system C compiler, loaded and called, its
 * results against the reference interpreter) and moe_host_memory_plan
 * (sizes worked out by hand). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moec/backend.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "graph_fx.h"

/* y = x * w + x over f32[3, 4], x an input, w a weight; layer "my-layer.v2". */
static moe_module *small_layer(moe_ctx *c)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "my-layer.v2");
	moe_graph_set_dtype(g, MOE_F32);
	moe_id x = leaf(g, MOE_OP_INPUT, MOE_F32, 2, (int64_t[]){3, 4}, "x");
	moe_id w = leaf(g, MOE_OP_WEIGHT, MOE_F32, 2, (int64_t[]){3, 4}, "w");
	moe_id p = moe_node_new(g, MOE_OP_MUL, (moe_id[]){x, w}, 2, moe_loc_none());
	assert_int_equal(moe_node_infer(g, p), MOE_OK);
	moe_id y = moe_node_new(g, MOE_OP_ADD, (moe_id[]){p, x}, 2, moe_loc_none());
	assert_int_equal(moe_node_infer(g, y), MOE_OK);
	moe_graph_add_output(g, y);
	return m;
}

static char *stream_text(FILE *f, size_t *len)
{
	long n = ftell(f);
	assert_true(n >= 0);
	rewind(f);
	char *s = malloc((size_t)n + 1);
	assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
	s[n] = 0;
	*len = (size_t)n;
	return s;
}

typedef int (*layer_fn)(const void *const *, const void *const *, void *const *, void *);
typedef size_t (*ws_fn)(void);

static void test_emit_c(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = small_layer(c);
	const moe_graph *g = moe_module_graph(m, 0);
	FILE *f = tmpfile();
	assert_non_null(f);
	assert_int_equal(moe_emit_c(c, g, f), MOE_OK);
	size_t len;
	char *text = stream_text(f, &len);
	fclose(f);
	/* the same text as the string form */
	char *s = NULL;
	assert_int_equal(moe_emit_c_string(c, g, &s), MOE_OK);
	assert_string_equal(text, s);
	moe_free(c, s);
	/* the ABI's entry points, the name's '-' and '.' as '_' */
	assert_non_null(strstr(text, "moe_my_layer_v2("));
	assert_non_null(strstr(text, "moe_my_layer_v2_workspace_size("));

	/* compiled as C11 by the system compiler, loaded, called */
	char dir[] = "/tmp/moec_api_emit_XXXXXX";
	assert_non_null(mkdtemp(dir));
	char src[256], so[256], cmd[1024];
	snprintf(src, sizeof src, "%s/layer.c", dir);
	snprintf(so, sizeof so, "%s/layer.so", dir);
	FILE *out = fopen(src, "w");
	fwrite(text, 1, len, out);
	fclose(out);
	const char *cc = getenv("MOEC_CC") ? getenv("MOEC_CC") : "cc";
	snprintf(cmd, sizeof cmd, "%s -std=c11 -O0 -fPIC -shared -o %s %s -lm", cc, so, src);
	int rc = system(cmd);
	assert_int_equal(rc, 0);
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	assert_non_null(h);
	layer_fn fn = (layer_fn)(uintptr_t)dlsym(h, "moe_my_layer_v2");
	ws_fn wsf = (ws_fn)(uintptr_t)dlsym(h, "moe_my_layer_v2_workspace_size");
	assert_non_null(fn);
	assert_non_null(wsf);
	size_t ws = 0;
	assert_int_equal(moe_host_workspace_size(c, g, &ws), MOE_OK);
	assert_int_equal(wsf(), ws);
	float x[12], w[12], y[12], want[12];
	for (int i = 0; i < 12; i++) {
		x[i] = (float)i - 5.5f;
		w[i] = 0.25f * (float)(i % 5);
		want[i] = x[i] * w[i] + x[i]; /* exact in f32 for these values */
	}
	void *work = calloc(1, ws ? ws : 1);
	const void *ins[] = {x}, *wts[] = {w};
	void *outs[] = {y};
	assert_int_equal(fn(ins, wts, outs, work), 0);
	assert_memory_equal(y, want, sizeof want);
	free(work);
	dlclose(h);
	unlink(so);
	unlink(src);
	rmdir(dir);
	free(text);

	/* a graph the backend does not take (experts not lowered): an error
	 * naming it, nothing written */
	static const char *moe = "layer raw {\n"
				 "  dim T = 2, D = 4, F = 4, E = 2, K = 1\n"
				 "  dtype f32\n"
				 "  input x : [T, D]\n"
				 "  weight r : [E, D] = \"r\"\n"
				 "  weight u : [E, F, D] = \"u.{e}\"\n"
				 "  weight d : [E, D, F] = \"d.{e}\"\n"
				 "  idx = topk(einsum(\"td,ed->te\", x, r), k=K)\n"
				 "  w = take_along(einsum(\"td,ed->te\", x, r), idx, axis=1)\n"
				 "  y = experts(x, idx, w, up=u, down=d, act=\"none\", block=2)\n"
				 "  output y\n"
				 "}\n";
	moe_module *raw = moe_parse_moe(c, "raw.moe", moe, strlen(moe), NULL);
	if (!raw)
		moe_diag_print(c, stderr);
	assert_non_null(raw);
	f = tmpfile();
	assert_int_not_equal(moe_emit_c(c, moe_module_graph(raw, 0), f), MOE_OK);
	assert_int_equal(ftell(f), 0);
	fclose(f);
	char *d = moe_diag_string(c);
	assert_non_null(strstr(d, "experts"));
	moe_free(c, d);
	moe_diag_clear(c);
	moe_module_free(raw);

	/* NULL arguments */
	assert_int_equal(moe_emit_c(c, g, NULL), MOE_ERR_INVALID);
	assert_int_equal(moe_emit_c(c, NULL, stdout), MOE_ERR_INVALID);
	assert_int_equal(moe_emit_c(NULL, g, stdout), MOE_ERR_INVALID);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* ---- moe_host_memory_plan ---- */

static const char *plan_moe = "layer plan {\n"
			      "  dim T = 4, D = 32, F = 32, E = 4, K = 2, B = 4\n"
			      "  dtype %s\n"
			      "  input  x : [T, D]\n"
			      "  weight router : [E, D]    = \"r\"\n"
			      "  weight w1     : [E, F, D] = \"e.{e}.w1\"\n"
			      "  weight w3     : [E, F, D] = \"e.{e}.w3\"\n"
			      "  weight w2     : [E, D, F] = \"e.{e}.w2\"\n"
			      "  logits = einsum(\"td,ed->te\", x, router)\n"
			      "  p      = softmax(cast(logits, f32), axis=1)\n"
			      "  idx    = topk(p, k=K)\n"
			      "  w      = take_along(p, idx, axis=1)\n"
			      "  y      = experts(x, idx, w, gate=w1, up=w3, down=w2, act=\"swiglu\", block=B)\n"
			      "  output y\n"
			      "}\n";

static moe_module *plan_layer(moe_ctx *c, const char *dtype, int lower)
{
	char text[2048];
	snprintf(text, sizeof text, plan_moe, dtype);
	moe_module *m = moe_parse_moe(c, "plan.moe", text, strlen(text), NULL);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	if (lower)
		assert_int_equal(moe_run_pipeline_text(c, "host", m, NULL), MOE_OK);
	return m;
}

static void test_host_memory_plan(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	/* f32: weights E D + 3 E F D elements of 4 bytes; x and y [T, D]; T = 4, D = F = 32, E = 4 */
	moe_module *m = plan_layer(c, "f32", 1);
	const moe_graph *g = moe_module_graph(m, 0);
	moe_host_memory mem;
	memset(&mem, 0xff, sizeof mem);
	assert_int_equal(moe_host_memory_plan(c, g, NULL, &mem), MOE_OK);
	assert_int_equal(mem.weight_bytes, 4 * (4 * 32 + 3 * 4 * 32 * 32));
	assert_int_equal(mem.io_bytes, 2 * 4 * 32 * 4);
	size_t ws;
	assert_int_equal(moe_host_workspace_size(c, g, &ws), MOE_OK);
	assert_int_equal(mem.workspace_bytes, ws);
	assert_int_equal(mem.packable_bytes, 0); /* no bf16 weight */
	assert_int_equal(mem.packed_bytes, 0);
	assert_int_equal(mem.peak_bytes, mem.weight_bytes + mem.io_bytes + mem.workspace_bytes);
	moe_module_free(m);

	/* bf16: half the weight and io bytes; packable bf16 weights; packed only
	 * where this run would pack them (LLVM engine, not portable, a CPU with
	 * AVX512-BF16) */
	m = plan_layer(c, "bf16", 1);
	g = moe_module_graph(m, 0);
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.portable = 1;
	assert_int_equal(moe_host_memory_plan(c, g, &o, &mem), MOE_OK);
	assert_int_equal(mem.weight_bytes, 2 * (4 * 32 + 3 * 4 * 32 * 32));
	assert_int_equal(mem.io_bytes, 2 * 4 * 32 * 2);
	/* packable (docs/abi.md): bf16 weights of whole 16-row tiles with K a
	 * multiple of 32: the three expert weights (32 rows of 32 per expert),
	 * not the router (4 rows) */
	assert_int_equal(mem.packable_bytes, 2 * 3 * 4 * 32 * 32);
	assert_int_equal(mem.packed_bytes, 0);
	assert_int_equal(mem.peak_bytes, mem.weight_bytes + mem.io_bytes + mem.workspace_bytes);
	size_t packable = mem.packable_bytes;
	o.portable = 0;
	o.engine = MOE_HOST_C;
	assert_int_equal(moe_host_memory_plan(c, g, &o, &mem), MOE_OK);
	assert_int_equal(mem.packed_bytes, 0);
	assert_int_equal(mem.packable_bytes, packable);
	o.engine = MOE_HOST_LLVM;
	assert_int_equal(moe_host_memory_plan(c, g, &o, &mem), MOE_OK);
	__builtin_cpu_init();
	assert_int_equal(mem.packed_bytes, __builtin_cpu_supports("avx512bf16") ? packable : 0);
	assert_int_equal(mem.peak_bytes, mem.weight_bytes + mem.io_bytes + mem.workspace_bytes + mem.packed_bytes);
	/* NULL options: the defaults, the same as moe_host_opts_init's */
	moe_host_memory dflt;
	assert_int_equal(moe_host_memory_plan(c, g, NULL, &dflt), MOE_OK);
	assert_memory_equal(&dflt, &mem, sizeof mem);
	moe_module_free(m);

	/* a graph not lowered by the host pipeline: an error with a diagnostic */
	m = plan_layer(c, "f32", 0);
	assert_int_not_equal(moe_host_memory_plan(c, moe_module_graph(m, 0), NULL, &mem), MOE_OK);
	assert_true(moe_error_count(c) > 0);
	moe_diag_clear(c);
	/* NULL arguments */
	assert_int_equal(moe_host_memory_plan(c, moe_module_graph(m, 0), NULL, NULL), MOE_ERR_INVALID);
	assert_int_equal(moe_host_memory_plan(c, NULL, NULL, &mem), MOE_ERR_INVALID);
	assert_int_equal(moe_host_memory_plan(NULL, moe_module_graph(m, 0), NULL, &mem), MOE_ERR_INVALID);
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_emit_c),
		cmocka_unit_test(test_host_memory_plan),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
