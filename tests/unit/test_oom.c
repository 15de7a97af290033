/* tests/unit/test_oom.c: the allocation-failure sweep (in the
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
#ifdef __GLIBC__
#include <malloc.h>
#endif

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
	char *text; /* moe_import_hf's (moe_free) */
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

/* The layer as printed IR text and JSON and as a .tcpb, made once with an
 * allocator that never refuses (inputs of the reading sweeps). */
static char *ir_text, *ir_json, *tcps;
static uint8_t *tcpb;
static size_t ir_text_len, ir_json_len, tcpb_len, tcps_len;

static void make_inputs(void)
{
	if (ir_text)
		return;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_parse_moe(c, "tiny.moe", layer_text, strlen(layer_text), NULL);
	assert_non_null(m);
	FILE *f = open_memstream(&ir_text, &ir_text_len);
	assert_int_equal(moe_module_print(m, f), MOE_OK);
	fclose(f);
	ir_json = moe_module_to_json(m);
	assert_non_null(ir_json);
	ir_json_len = strlen(ir_json);
	assert_int_equal(moe_run_pipeline_text(c, "tcp", m, NULL), MOE_OK);
	moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), NULL);
	assert_non_null(p);
	assert_int_equal(moe_tcp_to_binary(c, p, &tcpb, &tcpb_len), MOE_OK);
	assert_int_equal(moe_tcp_to_asm(c, p, &tcps, &tcps_len), MOE_OK);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_ctx_free(c);
}

static moe_status read_ir(flow *f)
{
	f->m = moe_module_parse_text(f->c, "tiny.moeir", ir_text, ir_text_len);
	if (!f->m)
		return null_status(f);
	moe_module_free(f->m);
	f->m = moe_module_parse_json(f->c, "tiny.json", ir_json, ir_json_len);
	return f->m ? MOE_OK : null_status(f);
}

static moe_status run_tcpb(flow *f)
{
	f->p = moe_tcp_from_binary(f->c, "tiny.tcpb", tcpb, tcpb_len, NULL);
	if (!f->p)
		return null_status(f);
	moe_status s = bind(f);
	if (s)
		return s;
	moe_tcp_stats st;
	return moe_tcp_run(f->c, f->p, f->bind, NULL, f->out, &st);
}

/* ---- loaders: an HF config, a sharded safetensors checkpoint, an .npy input,
 * written once into files_dir with an allocator that never refuses ---- */
static char files_dir[] = "/tmp/moec-oom-files-XXXXXX";
static bool files_made;

static const char hf_config[] = "{\"model_type\": \"mixtral\", \"hidden_size\": 8, \"num_local_experts\": 4,"
				"\"num_experts_per_tok\": 2, \"intermediate_size\": 8, \"torch_dtype\": \"float32\"}";

static char *file_path(const char *name)
{
	static char buf[4096];
	snprintf(buf, sizeof buf, "%s/%s", files_dir, name);
	return buf;
}

static void write_bytes(const char *name, const void *a, size_t na, const void *b, size_t nb)
{
	FILE *f = fopen(file_path(name), "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(a, 1, na, f), na);
	if (nb)
		assert_int_equal(fwrite(b, 1, nb, f), nb);
	assert_int_equal(fclose(f), 0);
}

/* A safetensors shard holding n f32 tensors of the given shapes (values i / 100). */
static void write_shard(const char *file, int n, const char *const *names, const char *const *shapes,
	const int *numel)
{
	char hdr[1024];
	size_t at = 0, off = 0;
	at += (size_t)snprintf(hdr + at, sizeof hdr - at, "{");
	for (int i = 0; i < n; i++) {
		at += (size_t)snprintf(hdr + at, sizeof hdr - at, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": %s, "
			"\"data_offsets\": [%zu, %zu]}", i ? ", " : "", names[i], shapes[i], off, off + 4 * (size_t)numel[i]);
		off += 4 * (size_t)numel[i];
	}
	at += (size_t)snprintf(hdr + at, sizeof hdr - at, "}");
	unsigned char *buf = malloc(8 + at + off);
	assert_non_null(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)((uint64_t)at >> (8 * i));
	memcpy(buf + 8, hdr, at);
	for (size_t k = 0; k < off / 4; k++) {
		float v = (float)(k % 200) / 100.0f - 1.0f;
		memcpy(buf + 8 + at + 4 * k, &v, 4);
	}
	write_bytes(file, buf, 8 + at + off, NULL, 0);
	free(buf);
}

static void make_files(void)
{
	if (files_made)
		return;
	assert_non_null(mkdtemp(files_dir));
	write_bytes("config.json", hf_config, strlen(hf_config), NULL, 0);
	write_shard("a.safetensors", 2, (const char *const[]){"router", "w1"}, (const char *const[]){"[4, 4]", "[4, 4, 4]"},
		(const int[]){16, 64});
	write_shard("b.safetensors", 2, (const char *const[]){"w3", "w2"}, (const char *const[]){"[4, 4, 4]", "[4, 4, 4]"},
		(const int[]){64, 64});
	static const char idx[] = "{\"metadata\": {}, \"weight_map\": {\"router\": \"a.safetensors\", \"w1\": "
				  "\"a.safetensors\", \"w3\": \"b.safetensors\", \"w2\": \"b.safetensors\"}}";
	write_bytes("model.safetensors.index.json", idx, strlen(idx), NULL, 0);
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 2, (const int64_t[]){3, 4});
	for (int k = 0; k < 12; k++)
		((float *)x->data)[k] = (float)k / 8.0f - 0.5f;
	assert_int_equal(moe_npy_write(c, file_path("x.npy"), x), MOE_OK);
	moe_tensor_free(c, x);
	moe_ctx_free(c);
	files_made = true;
}

static void remove_files(void)
{
	if (!files_made)
		return;
	static const char *const names[] = {"config.json", "a.safetensors", "b.safetensors",
		"model.safetensors.index.json", "x.npy"};
	for (size_t i = 0; i < sizeof names / sizeof *names; i++)
		unlink(file_path(names[i]));
	rmdir(files_dir);
}

/* moe_import_hf, then the .moe text it wrote is parsed. */
static moe_status import_hf(flow *f)
{
	moe_import_opts o = {0};
	o.dtype = MOE_F32;
	moe_status s = moe_import_hf(f->c, file_path("config.json"), &o, &f->text);
	if (s)
		return s;
	f->m = moe_parse_moe(f->c, "config.moe", f->text, strlen(f->text), NULL);
	return f->m ? MOE_OK : null_status(f);
}

/* A run as `moec run --weights model.safetensors.index.json --input x.npy` does it. */
static moe_status load_and_run(flow *f)
{
	moe_status s = parse(f, NULL);
	if (s)
		return s;
	f->bind = moe_tensor_map_new(f->c);
	if (!f->bind)
		return null_status(f);
	const char *paths[1] = {file_path("model.safetensors.index.json")};
	s = moe_weights_load(f->c, moe_module_graph(f->m, 0), paths, 1, f->bind);
	if (s)
		return s;
	moe_tensor *x = moe_npy_read(f->c, file_path("x.npy"), MOE_F32);
	if (!x)
		return null_status(f);
	s = moe_tensor_map_set(f->bind, "x", x);
	return s ? s : moe_interp_run(f->c, moe_module_graph(f->m, 0), f->bind, f->out);
}

/* A checkpoint opened before the call (the embedder's): a refusal while its
 * shards open lazily must leave it usable, so the loop retries to success. */
static moe_status load_from_open_checkpoint(flow *f)
{
	moe_status s = parse(f, NULL);
	if (s)
		return s;
	f->bind = moe_tensor_map_new(f->c);
	if (!f->bind)
		return null_status(f);
	const char *paths[1] = {file_path("model.safetensors.index.json")};
	moe_checkpoint *ck = moe_checkpoint_open(f->c, paths, 1);
	if (!ck)
		return null_status(f);
	s = moe_weights_load_from(f->c, moe_module_graph(f->m, 0), ck, f->bind);
	if (s == MOE_ERR_NOMEM) { /* the map and the checkpoint are as they were: a second try succeeds */
		if (moe_tensor_map_get(f->bind, "w1")) {
			moe_checkpoint_close(ck);
			return MOE_ERR_INTERNAL;
		}
		moe_status s2 = moe_weights_load_from(f->c, moe_module_graph(f->m, 0), ck, f->bind);
		if (s2 != MOE_OK || !moe_tensor_map_get(f->bind, "w1"))
			s = MOE_ERR_INTERNAL;
	}
	moe_checkpoint_close(ck);
	return s;
}

static moe_status read_npy(flow *f)
{
	f->out[0] = moe_npy_read(f->c, file_path("x.npy"), MOE_F32);
	return f->out[0] ? MOE_OK : null_status(f);
}

/* The built-in machine description, the layer's TCP assembly checked against
 * it, and the program's interface (its inputs and checkpoint weights). */
static moe_status read_asm(flow *f)
{
	moe_tcp_machine *mach = moe_tcp_machine_default(f->c);
	if (!mach)
		return null_status(f);
	f->p = moe_tcp_from_asm(f->c, "tiny.tcps", tcps, tcps_len, mach);
	moe_tcp_machine_free(f->c, mach);
	if (!f->p)
		return null_status(f);
	f->m = moe_tcp_interface(f->c, f->p); /* what `moec run FILE.tcpb` binds */
	return f->m ? MOE_OK : null_status(f);
}

static void flow_free(flow *f)
{
	moe_free(f->c, f->text);
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

static void test_read_ir(void **st)
{
	(void)st;
	make_inputs();
	assert_true(sweep("read IR text + JSON", read_ir) > 20);
}

static void test_run_tcpb(void **st)
{
	(void)st;
	make_inputs();
	assert_true(sweep("load .tcpb + run tcp simulator", run_tcpb) > 20);
}

static void test_import_hf(void **st)
{
	(void)st;
	make_files();
	assert_true(sweep("import HF config + parse", import_hf) > 20);
}

static void test_load_weights_npy_run(void **st)
{
	(void)st;
	make_files();
	assert_true(sweep("load sharded weights + .npy input + run interp", load_and_run) > 20);
}

static void test_load_from_open_checkpoint(void **st)
{
	(void)st;
	make_files();
	assert_true(sweep("load weights from an open checkpoint (retried)", load_from_open_checkpoint) > 20);
}

static void test_read_asm(void **st)
{
	(void)st;
	make_inputs();
	assert_true(sweep("machine.json + read .tcps + interface", read_asm) > 20);
}

static void test_read_npy(void **st)
{
	(void)st;
	make_files();
	assert_true(sweep("read .npy", read_npy) >= 1);
}

int main(void)
{
#ifdef __GLIBC__
	/* Each refusal frees a compile's whole heap; glibc would give the top of
	 * it back to the kernel and take it again for the next k (most of the
	 * sweep's time, in the kernel). Keep it. */
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	mallopt(M_TOP_PAD, 64 << 20);
#endif
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_import_hf),
		cmocka_unit_test(test_load_weights_npy_run),
		cmocka_unit_test(test_load_from_open_checkpoint),
		cmocka_unit_test(test_read_npy),
		cmocka_unit_test(test_read_asm),
		cmocka_unit_test(test_run_interp),
		cmocka_unit_test(test_compile_c),
		cmocka_unit_test(test_compile_tcp),
		cmocka_unit_test(test_run_tcp),
		cmocka_unit_test(test_compile_llvm),
		cmocka_unit_test(test_run_host),
		cmocka_unit_test(test_read_ir),
		cmocka_unit_test(test_run_tcpb),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	remove_files();
	free(ir_text);
	free(ir_json); /* cJSON's: malloc'd */
	free(tcps);
	free(tcpb);
	return r;
}
