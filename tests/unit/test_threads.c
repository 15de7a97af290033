/* Separate contexts used from separate threads at the same time.
 *
 * Every thread owns one context (with its own counting allocator and its own
 * external pass) and, for every .moe file in examples/ (made small with
 * settings), reads and parses the file, runs `tcp` plus the external pass,
 * prints the IR to memory, round-trips it through the textual parser, exports
 * JSON, emits C and LLVM IR (to a file of its own), interprets the layer on
 * fixed inputs; for one layer it also runs it on the host through the LLVM
 * JIT. The threads start
 * together on a barrier and must produce byte-identical results, equal to a
 * run on the main thread before any thread started, with the same allocator
 * traffic. Built with -DMOEC_TSAN=ON (tests/tsan/run.sh) it must be clean
 * under ThreadSanitizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moec/moec.h"

#define NTHREADS 2
#define ROUNDS 2
#define MAXFILES 32

/* ---- results: one growing byte string per run ---- */
typedef struct buf {
	char *p;
	size_t n, cap;
} buf;

static void buf_add(buf *b, const void *data, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->n + n)
			cap *= 2;
		char *q = realloc(b->p, cap);
		if (!q)
			abort();
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->n, data, n);
	b->n += n;
}

static void buf_str(buf *b, const char *tag, const char *s, size_t n)
{
	buf_add(b, tag, strlen(tag) + 1);
	buf_add(b, s, n);
}

/* ---- per-context allocator: must only ever be called for its own context ---- */
typedef struct alloc_stats {
	size_t live, peak, calls;
	pthread_t owner;
	int foreign; /* calls from another thread than the owner */
} alloc_stats;

static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
	alloc_stats *s = ud;
	if (!pthread_equal(pthread_self(), s->owner))
		s->foreign++;
	s->calls++;
	if (nsize == 0) {
		free(ptr);
		s->live -= osize;
		return NULL;
	}
	void *q = realloc(ptr, nsize);
	if (!q)
		return NULL;
	s->live = s->live - osize + nsize;
	if (s->live > s->peak)
		s->peak = s->live;
	return q;
}

/* ---- an external pass with per-context state ---- */
typedef struct probe {
	pthread_t owner;
	unsigned runs, foreign;
	uint64_t nodes; /* sum over runs of the node count it saw */
} probe;

static moe_status probe_pass(moe_ctx *ctx, moe_graph *g, const moe_pass_opts *opts, void *ud)
{
	probe *p = ud;
	if (!pthread_equal(pthread_self(), p->owner))
		p->foreign++;
	p->runs++;
	p->nodes += moe_graph_num_nodes(g);
	return MOE_OK;
}

/* ---- the work of one run ---- */
typedef struct job {
	char files[MAXFILES][1024];
	int nfiles;
	pthread_barrier_t *start; /* NULL for the baseline run */
	char dir[256];            /* a temporary directory of its own */
	/* results */
	buf out;
	alloc_stats as;
	probe pr;
	char err[512];
} job;

static uint32_t hash(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/* Inputs and weights: a fixed pattern seeded by the node's name. */
static moe_tensor_map *bindings(moe_ctx *ctx, const moe_graph *g)
{
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++) {
		moe_op op = moe_node_op(g, i);
		if (op != MOE_OP_INPUT && op != MOE_OP_WEIGHT)
			continue;
		moe_tensor *t = moe_tensor_new(ctx, moe_node_dtype(g, i), moe_node_rank(g, i), moe_node_shape(g, i));
		if (!t)
			break;
		uint32_t s = hash(moe_node_name(g, i));
		for (int64_t k = 0; k < moe_tensor_numel(t); k++) {
			s = s * 1664525u + 1013904223u;
			float v = ((float)(s >> 8) / 16777216.0f - 0.5f) * (op == MOE_OP_INPUT ? 2.0f : 0.25f);
			if (t->dtype == MOE_F32)
				((float *)t->data)[k] = v;
			else if (t->dtype == MOE_BF16)
				((uint16_t *)t->data)[k] = moe_f32_to_bf16(v);
			else if (t->dtype == MOE_I32)
				((int32_t *)t->data)[k] = (int32_t)(s >> 28);
			else
				((uint8_t *)t->data)[k] = (uint8_t)(s >> 31);
		}
		moe_tensor_map_set(b, moe_node_name(g, i), t);
	}
	return b;
}

#define FAIL(...)                                                                                                  \
	do {                                                                                                       \
		snprintf(j->err, sizeof j->err, __VA_ARGS__);                                                      \
		goto done;                                                                                         \
	} while (0)

/* llvm: also emit LLVM IR and run on the host (seconds per layer at O3: done
 * for one layer in one round). */
static void one_file(job *j, moe_ctx *ctx, const char *path, int llvm)
{
	char *text = NULL, *ir = NULL, *ir2 = NULL, *json = NULL, *csrc = NULL;
	size_t len = 0, irlen = 0, ir2len = 0;
	moe_module *m = NULL, *back = NULL;
	moe_tensor_map *b = NULL;
	moe_tensor *out[8] = {0}, *hout[8] = {0};
	char llpath[300];

	static const moe_setting small[] = {{"T", "8"}, {"D", "32"}, {"F", "24"}, {"B", "4"}};
	const moe_settings sets = {small, sizeof small / sizeof *small};
	if (moe_read_file(ctx, path, &text, &len) != MOE_OK)
		FAIL("%s: cannot read", path);
	if (!(m = moe_parse_moe(ctx, path, text, len, &sets)))
		FAIL("%s: does not parse", path);
	moe_run_opts ro = {.verify = 1};
	if (moe_run_pipeline_text(ctx, "tcp,flatten-blocks,thread-probe", m, &ro) != MOE_OK)
		FAIL("%s: the tcp pipeline failed", path);

	FILE *f = open_memstream(&ir, &irlen);
	if (!f)
		FAIL("open_memstream");
	moe_status st = moe_module_print(m, f);
	if (fclose(f) != 0 || st != MOE_OK)
		FAIL("%s: printing failed", path);
	if (strstr(ir, "= topk(") || strstr(ir, "= experts(") || !strstr(ir, "grid_blocks_max="))
		FAIL("%s: the pipeline did not lower the layer", path);
	if (!(back = moe_module_parse_text(ctx, path, ir, irlen)))
		FAIL("%s: printed IR does not parse", path);
	if (!(f = open_memstream(&ir2, &ir2len)))
		FAIL("open_memstream");
	st = moe_module_print(back, f);
	if (fclose(f) != 0 || st != MOE_OK || ir2len != irlen || memcmp(ir, ir2, irlen))
		FAIL("%s: print -> parse -> print differs", path);
	if (!(json = moe_module_to_json(m)))
		FAIL("%s: JSON export failed", path);
	buf_str(&j->out, "file", path, strlen(path) + 1);
	buf_str(&j->out, "ir", ir, irlen);
	buf_str(&j->out, "json", json, strlen(json));

	for (size_t gi = 0; gi < moe_module_num_graphs(m); gi++) {
		moe_graph *g = moe_module_graph(m, gi);
		if (moe_emit_c_string(ctx, g, &csrc) != MOE_OK)
			FAIL("%s: C emission failed", path);
		buf_str(&j->out, "c", csrc, strlen(csrc));
		moe_free(ctx, csrc);
		csrc = NULL;
		uint32_t no = moe_graph_num_outputs(g);
		if (no > sizeof out / sizeof *out)
			FAIL("%s: too many outputs", path);
		b = bindings(ctx, g);
		if (moe_interp_run(ctx, g, b, out) != MOE_OK)
			FAIL("%s: interpreting layer %s failed", path, moe_graph_name(g));
		for (uint32_t k = 0; k < no; k++) {
			int nonzero = 0;
			for (size_t i = 0; i < out[k]->nbytes; i++)
				nonzero |= ((const unsigned char *)out[k]->data)[i];
			if (!nonzero)
				FAIL("%s: output %u is all zero", path, k);
			buf_str(&j->out, "y", out[k]->data, out[k]->nbytes);
		}
		if (llvm) {
			snprintf(llpath, sizeof llpath, "%s/layer.ll", j->dir);
			size_t cl = 0;
			moe_status es = moe_emit_llvm_ir(ctx, g, llpath);
			if (es != MOE_OK || moe_read_file(ctx, llpath, &csrc, &cl) != MOE_OK)
				FAIL("%s: LLVM IR emission failed", path);
			remove(llpath);
			buf_str(&j->out, "ll", csrc, cl);
			moe_host_stats hs;
			moe_host_opts ho; /* no JIT cache: every run compiles, so allocations compare */
			moe_host_opts_init(&ho);
			ho.no_cache = 1;
			if (moe_host_run_opts(ctx, g, b, &ho, hout, &hs) != MOE_OK)
				FAIL("%s: running layer %s on the host failed", path, moe_graph_name(g));
			for (uint32_t k = 0; k < no; k++) {
				if (hout[k]->nbytes != out[k]->nbytes)
					FAIL("%s: host output %u has the wrong size", path, k);
				buf_str(&j->out, "host", hout[k]->data, hout[k]->nbytes);
			}
			int64_t blocks[2] = {hs.blocks_executed, hs.blocks_skipped};
			buf_str(&j->out, "blocks", (const char *)blocks, sizeof blocks);
		}
		for (size_t k = 0; k < sizeof out / sizeof *out; k++) {
			moe_tensor_free(ctx, out[k]);
			moe_tensor_free(ctx, hout[k]);
			out[k] = hout[k] = NULL;
		}
		moe_free(ctx, csrc);
		csrc = NULL;
		moe_tensor_map_free(b);
		b = NULL;
	}
done:
	if (j->err[0] && moe_diag_count(ctx)) {
		const char *msg;
		moe_diag_get(ctx, 0, NULL, NULL, &msg);
		size_t n = strlen(j->err);
		snprintf(j->err + n, sizeof j->err - n, " (%s)", msg);
	}
	for (size_t k = 0; k < sizeof out / sizeof *out; k++) {
		moe_tensor_free(ctx, out[k]);
		moe_tensor_free(ctx, hout[k]);
	}
	moe_tensor_map_free(b);
	moe_free(ctx, csrc);
	moe_free(ctx, json);
	free(ir);
	free(ir2);
	moe_module_free(back);
	moe_module_free(m);
	moe_free(ctx, text);
}

static void *run_job(void *arg)
{
	job *j = arg;
	j->as.owner = j->pr.owner = pthread_self();
	if (j->start)
		pthread_barrier_wait(j->start);
	moe_ctx *ctx = moe_ctx_new(counting_alloc, &j->as);
	if (!ctx) {
		snprintf(j->err, sizeof j->err, "moe_ctx_new failed");
		return NULL;
	}
	const char *tmp = getenv("TMPDIR");
	snprintf(j->dir, sizeof j->dir, "%s/moec-threads.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(j->dir))
		snprintf(j->err, sizeof j->err, "mkdtemp %s failed", j->dir);
	moe_pass_info info = {.name = "thread-probe", .summary = "records which thread runs it", .run = probe_pass,
		.ud = &j->pr};
	if (moe_pass_register(ctx, &info) != MOE_OK)
		snprintf(j->err, sizeof j->err, "moe_pass_register failed");
	/* the tcp pipeline marks nodes with the TCP target's attributes */
	if (moe_tcp_register_passes(ctx) != MOE_OK)
		snprintf(j->err, sizeof j->err, "moe_tcp_register_passes failed");
	for (int r = 0; r < ROUNDS && !j->err[0]; r++)
		for (int i = 0; i < j->nfiles && !j->err[0]; i++)
			one_file(j, ctx, j->files[i], r == 0 && strstr(j->files[i], "/seed.moe"));
	if (!j->err[0] && moe_error_count(ctx))
		snprintf(j->err, sizeof j->err, "%d errors left in the context", moe_error_count(ctx));
	if (!j->err[0] && rmdir(j->dir) != 0)
		snprintf(j->err, sizeof j->err, "%s is not empty", j->dir);
	moe_ctx_free(ctx);
	return NULL;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* The .moe files of examples/, sorted. */
static int list_examples(job *j)
{
	char dir[512];
	snprintf(dir, sizeof dir, "%s/examples", MOEC_SOURCE_DIR);
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	struct dirent *e;
	while ((e = readdir(d)) && j->nfiles < MAXFILES) {
		size_t n = strlen(e->d_name);
		if (n <= 4 || strcmp(e->d_name + n - 4, ".moe"))
			continue;
		int w = snprintf(j->files[j->nfiles], sizeof j->files[0], "%s/%s", dir, e->d_name);
		if (w < 0 || (size_t)w >= sizeof j->files[0])
			break; /* path too long: the count check fails */
		j->nfiles++;
	}
	closedir(d);
	qsort(j->files, (size_t)j->nfiles, sizeof j->files[0], cmp_str);
	return j->nfiles;
}

static void check_job(const job *j, const char *who)
{
	if (j->err[0])
		fail_msg("%s: %s", who, j->err);
	assert_int_equal(j->as.live, 0); /* everything went back through the hook */
	assert_int_equal(j->as.foreign, 0);
	assert_int_equal(j->pr.foreign, 0);
	assert_int_equal(j->pr.runs, (unsigned)(ROUNDS * j->nfiles)); /* one graph per example */
}

static void test_two_contexts_two_threads(void **st)
{
	(void)st;
	static job base, jobs[NTHREADS];
	assert_true(list_examples(&base) >= 5);

	run_job(&base); /* the reference, on this thread alone */
	check_job(&base, "main thread");
	assert_true(base.out.n > 100000);

	pthread_barrier_t bar;
	assert_int_equal(pthread_barrier_init(&bar, NULL, NTHREADS), 0);
	pthread_t th[NTHREADS];
	for (int i = 0; i < NTHREADS; i++) {
		memcpy(jobs[i].files, base.files, sizeof base.files);
		jobs[i].nfiles = base.nfiles;
		jobs[i].start = &bar;
		assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++)
		assert_int_equal(pthread_join(th[i], NULL), 0);
	pthread_barrier_destroy(&bar);

	for (int i = 0; i < NTHREADS; i++) {
		char who[32];
		snprintf(who, sizeof who, "thread %d", i);
		check_job(&jobs[i], who);
		/* identical results, and the same work done through the allocator */
		assert_int_equal(jobs[i].out.n, base.out.n);
		assert_memory_equal(jobs[i].out.p, base.out.p, base.out.n);
		assert_int_equal(jobs[i].as.calls, base.as.calls);
		assert_int_equal(jobs[i].as.peak, base.as.peak);
		assert_int_equal(jobs[i].pr.nodes, base.pr.nodes);
	}
	free(base.out.p);
	for (int i = 0; i < NTHREADS; i++)
		free(jobs[i].out.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_contexts_two_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
