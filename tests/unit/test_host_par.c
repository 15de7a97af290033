/* Unit tests of the host backend's thread pool, bf16 dot-product kernels and
 * JIT cache (backend-c/pool.c, emit_llvm.c, jit_cache.c):
 * - a Qwen3-shaped MoE layer (examples/qwen3_30b_a3b.moe at small dims, bf16
 *   and f32) gives bitwise the same output on 1, 2 and 3 threads, and with
 *   portable kernels on 1 and 3 threads bitwise the C engine's output;
 * - the vdpbf16ps dot tile stays within the bound of docs/abi.md of the
 *   portable tile, computed here in double from the operands;
 * - packed bf16 weights (pack.c): the layout element by element, the tile
 *   reading them bitwise equal to the tile reading W as stored, and read
 *   exactly for whole tiles starting at a multiple of 16 rows;
 * - groups of tiles: the register-blocked vdpbf16ps kernel (emit_dotg.c)
 *   bitwise equal to the single-tile kernel, within the bound of the
 *   portable tiles, for whole and partial groups;
 * - the JIT cache: a miss then a hit with the same output, a truncated and a
 *   corrupted entry detected ("bad"), recompiled and rewritten, --no-cache.
 * tests/tsan/run.sh also runs this test under ThreadSanitizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend-c/cgen.h"
#include "interp/interp.h"
#include "moec/backend.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "host_layer.h"

static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	assert_true(fread(buf, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* The Qwen3 example at small dims through the host pipeline. With T = 37 the
 * dispatch grid has 8 blocks or more and the expert blocks are the parallel
 * loop of the projections; with T = 1 and K = 4 it has fewer and each block's
 * groups of tiles are (lower.c, BLOCK_PAR_MIN). The native top-k's rows run in
 * parallel in tests/unit/test_topk_host.c. */
static moe_graph *qwen3_small(moe_ctx *c, const char *dtype, const char *T, moe_module **mod)
{
	size_t len;
	char *text = read_all(MOEC_SOURCE_DIR "/examples/qwen3_30b_a3b.moe", &len);
	moe_setting sets[] = {{"T", T}, {"D", "96"}, {"F", "80"}, {"E", "64"}, {"K", "4"}, {"B", "8"}, {"dtype", dtype}};
	moe_settings ss = {sets, sizeof sets / sizeof *sets};
	moe_graph *g = host_layer(c, "qwen3_30b_a3b.moe", text, len, &ss, mod);
	free(text);
	return g;
}

/* runs with the same kernels share one compilation through a cache in cdir */
static moe_tensor *run1(moe_ctx *c, moe_graph *g, moe_tensor_map *bind, moe_host_engine en, int threads,
	int portable, const char *cdir, moe_host_stats *st)
{
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.engine = en;
	o.threads = threads;
	o.portable = portable;
	o.cache_dir = cdir;
	moe_tensor *out[1] = {NULL};
	moe_status s = moe_host_run_opts(c, g, bind, &o, out, st);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	return out[0];
}

static void assert_same(const moe_tensor *a, const moe_tensor *b, const char *what)
{
	assert_int_equal(a->nbytes, b->nbytes);
	if (memcmp(a->data, b->data, a->nbytes))
		fail_msg("%s: outputs differ", what);
}

static void threads_case(const char *dtype, const char *T)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_graph *g = qwen3_small(c, dtype, T, &m);
	moe_tensor_map *bind = NULL;
	assert_int_equal(ir_interp_random_bindings(c, g, 7, &bind), MOE_OK);
	char dir[] = "/tmp/moec-par-test-XXXXXX";
	assert_non_null(mkdtemp(dir));
	moe_host_stats st;
	moe_tensor *t1 = run1(c, g, bind, MOE_HOST_LLVM, 1, 0, dir, &st);
	assert_int_equal(st.threads, 1);
	/* the grid is on the intended side of BLOCK_PAR_MIN */
	if (atoi(T) > 1)
		assert_true(st.grid_blocks_max >= 8);
	else
		assert_true(st.grid_blocks_max > 0 && st.grid_blocks_max < 8);
	for (int n = 2; n <= 3; n++) {
		moe_tensor *tn = run1(c, g, bind, MOE_HOST_LLVM, n, 0, dir, &st);
		assert_int_equal(st.threads, n);
		assert_same(t1, tn, "auto kernels, 1 thread vs more");
		moe_tensor_free(c, tn);
	}
	moe_tensor *p1 = run1(c, g, bind, MOE_HOST_LLVM, 1, 1, dir, &st);
	assert_string_equal(st.kernels, "portable");
	moe_tensor *p3 = run1(c, g, bind, MOE_HOST_LLVM, 3, 1, dir, NULL);
	moe_tensor *cc = run1(c, g, bind, MOE_HOST_C, 0, 0, NULL, &st);
	assert_int_equal(st.threads, 1);
	assert_same(p1, p3, "portable kernels, 1 vs 3 threads");
	assert_same(p1, cc, "portable LLVM vs the C engine");
	moe_tensor_free(c, t1);
	moe_tensor_free(c, p1);
	moe_tensor_free(c, p3);
	moe_tensor_free(c, cc);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	moe_ctx_free(c);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_threads_bf16(void **state)
{
	(void)state;
	threads_case("bf16", "37");
	threads_case("bf16", "1");
}

static void test_threads_f32(void **state)
{
	(void)state;
	threads_case("f32", "37");
	threads_case("f32", "1");
}

/* ---- the dot tile bound ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next32(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

/* a random bf16 of either sign with exponent spread over 2^-20 .. 2^4 */
static uint16_t rand_bf16(void)
{
	uint32_t u = next32();
	uint32_t e = 127 - 20 + u % 25, mant = (u >> 8) & 0x7f, sign = (u >> 20) & 1;
	return (uint16_t)(sign << 15 | e << 7 | mant);
}

static double bf16_value(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

enum { DR = 5, DK = 1000, DLANES = 13 }; /* K not a multiple of 32: the tail takes the portable loop */

/* A program holding one CS_DOT from a bf16 [DR, DK] input and a bf16
 * [16, DK] weight into the f32 [DR, 16] output (the lowering's buffers of a
 * small graph; its body replaced by the tile). */
static cg_prog *dot_prog(moe_ctx *c, int rows, moe_module **mod)
{
	static const char *text = "moeir 1\n"
				  "layer @dotk dtype=bf16 {\n"
				  "  %0 = input \"a\" : bf16[5, 1000]\n"
				  "  %1 = weight \"w\" {source=\"w\"} : bf16[16, 1000]\n"
				  "  %2 = einsum(%0, %1) {eq=\"td,ed->te\"} : bf16[5, 16]\n"
				  "  %3 = cast(%2) {to=\"f32\"} : f32[5, 16]\n"
				  "  output %3\n"
				  "}\n";
	moe_module *m = moe_module_parse_text(c, "dotk.moeir", text, strlen(text));
	assert_non_null(m);
	*mod = m;
	cg_prog *p = cgen_lower(c, moe_module_graph(m, 0));
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	cg_dot *d = ir_alloc(&p->arena, sizeof *d);
	cg_expr *e = ir_alloc(&p->arena, 5 * sizeof *e);
	memset(e, 0, 5 * sizeof *e);
	int64_t v[5] = {rows, DLANES, 0, 0, 0};
	for (int i = 0; i < 5; i++)
		e[i].op = CE_ICONST, e[i].ty = CT_I64, e[i].i = v[i];
	*d = (cg_dot){p->node_buf[0], p->node_buf[1], p->node_buf[3], &e[0], &e[1], &e[2], &e[3], &e[4], DK, DK, DK, 1, 0, 0};
	cg_stmt *s = ir_alloc(&p->arena, sizeof *s);
	memset(s, 0, sizeof *s);
	s->kind = CS_DOT;
	s->var = s->buf = -1;
	s->dot = d;
	p->body.first = p->body.last = s;
	return p;
}

static void run_dot(cg_prog *p, int portable, const uint16_t *a, const uint16_t *w, float *y, const char **kernels)
{
	cgen_jit_opts o = {portable, 1, NULL, 0, NULL, NULL};
	cgen_jit *jit = NULL;
	cgen_layer_par_fn fn = NULL;
	assert_int_equal(cgen_jit_create(p, &o, &jit, &fn), MOE_OK);
	*kernels = o.kernels;
	const void *ins[1] = {a}, *ws[1] = {w};
	void *outs[1] = {y};
	void *work = malloc((size_t)p->workspace + 64);
	assert_int_equal(fn(ins, ws, outs, work, NULL), 0);
	free(work);
	cgen_jit_free(jit);
}

/* rows: DR takes groups of four rows and one single row, 2 only single rows */
static void dot_bound(int rows)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	cg_prog *p = dot_prog(c, rows, &m);
	static uint16_t a[DR * DK], w[16 * DK];
	for (int i = 0; i < DR * DK; i++)
		a[i] = rand_bf16();
	for (int i = 0; i < 16 * DK; i++)
		w[i] = rand_bf16();
	float yp[DR * 16], yf[DR * 16];
	const char *kp, *kf;
	run_dot(p, 1, a, w, yp, &kp);
	run_dot(p, 0, a, w, yf, &kf);
	assert_string_equal(kp, "portable");
	int differ = 0;
	double worst = 0; /* largest |difference| / bound */
	const double u = ldexp(1.0, -24), gamma = (DK - 1) * u / (1 - (DK - 1) * u);
	for (int r = 0; r < rows; r++)
		for (int j = 0; j < 16; j++) {
			int jj = j < DLANES - 1 ? j : DLANES - 1;
			double exact = 0, mag = 0;
			for (int k = 0; k < DK; k++) {
				double t = bf16_value(a[r * DK + k]) * bf16_value(w[jj * DK + k]);
				exact += t;
				mag += fabs(t);
			}
			double bound = 2 * gamma * mag + 2 * DK * ldexp(1.0, -126);
			float p1 = yp[r * 16 + j], f1 = yf[r * 16 + j];
			/* each kernel is within gamma * mag of the exact sum, so within
			 * the bound of each other */
			assert_true(fabs(p1 - exact) <= gamma * mag);
			if (fabs((double)f1 - (double)p1) > bound)
				fail_msg("row %d lane %d: %.9g vs %.9g, bound %.3g", r, j, f1, p1, bound);
			differ += f1 != p1;
			worst = fmax(worst, fabs((double)f1 - (double)p1) / bound);
		}
	if (strcmp(kf, "portable"))
		print_message("vdpbf16ps tile, %d rows: %d of %d sums differ from the portable tile, at most %.3g of the "
			      "bound\n", rows, differ, rows * 16, worst);
	else /* no AVX512-BF16 here: both runs are the portable tile */
		assert_int_equal(differ, 0);
	cgen_free(p);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_dot_bound(void **state)
{
	(void)state;
	dot_bound(DR);
	dot_bound(2);
}

/* ---- the JIT cache ---- */

static moe_host_cache cached_run(moe_ctx *c, moe_graph *g, moe_tensor_map *bind, const char *dir, int no_cache,
	moe_tensor **out, double *compile)
{
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.threads = 1;
	o.cache_dir = dir;
	o.no_cache = no_cache;
	moe_host_stats st;
	moe_status s = moe_host_run_opts(c, g, bind, &o, out, &st);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	*compile = st.compile_seconds;
	return st.cache;
}

/* the one entry in dir; its size */
static long entry(const char *dir, char *path, size_t len)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "ls %s/*.jit", dir);
	FILE *f = popen(cmd, "r");
	assert_non_null(f);
	assert_non_null(fgets(path, (int)len, f));
	assert_null(fgets(cmd, sizeof cmd, f)); /* exactly one entry */
	pclose(f);
	path[strcspn(path, "\n")] = 0;
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	return (long)st.st_size;
}

static void test_cache(void **state)
{
	(void)state;
	char dir[] = "/tmp/moec-cache-test-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char sub[64];
	snprintf(sub, sizeof sub, "%s/a", dir); /* created on first use */
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_graph *g = qwen3_small(c, "bf16", "37", &m);
	moe_tensor_map *bind = NULL;
	assert_int_equal(ir_interp_random_bindings(c, g, 3, &bind), MOE_OK);
	moe_tensor *y0[1], *y[1];
	double t;
	assert_int_equal(cached_run(c, g, bind, sub, 0, y0, &t), MOE_CACHE_MISS);
	char path[512];
	long size = entry(sub, path, sizeof path);
	assert_int_equal(cached_run(c, g, bind, sub, 0, y, &t), MOE_CACHE_HIT);
	assert_same(y0[0], y[0], "cache hit");
	moe_tensor_free(c, y[0]);
	assert_int_equal(truncate(path, size / 2), 0);
	assert_int_equal(cached_run(c, g, bind, sub, 0, y, &t), MOE_CACHE_BAD);
	assert_same(y0[0], y[0], "after a truncated entry");
	moe_tensor_free(c, y[0]);
	assert_int_equal(entry(sub, path, sizeof path), size); /* rewritten */
	{ /* one flipped bit in the object */
		FILE *f = fopen(path, "r+b");
		assert_non_null(f);
		fseek(f, size - 100, SEEK_SET);
		int ch = fgetc(f);
		fseek(f, size - 100, SEEK_SET);
		fputc(ch ^ 1, f);
		fclose(f);
	}
	assert_int_equal(cached_run(c, g, bind, sub, 0, y, &t), MOE_CACHE_BAD);
	moe_tensor_free(c, y[0]);
	assert_int_equal(cached_run(c, g, bind, sub, 0, y, &t), MOE_CACHE_HIT);
	assert_same(y0[0], y[0], "after a corrupted entry");
	moe_tensor_free(c, y[0]);
	assert_int_equal(cached_run(c, g, bind, sub, 1, y, &t), MOE_CACHE_OFF);
	moe_tensor_free(c, y[0]);
	moe_tensor_free(c, y0[0]);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	moe_ctx_free(c);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

/* ---- packed weights (backend-c/pack.c) ---- */

enum { PR = 31, PK = 256, PW = 48 }; /* 31 rows: groups of 8, 4, 2 and 1; W: three tiles of 16 rows */

/* a bf16 [PR, PK] x [PW, PK] einsum whose body is one CS_DOT of `rows` rows and `lanes` lanes at W row w0 */
static cg_prog *packed_prog(moe_ctx *c, int64_t rows, int64_t lanes, int64_t w0, moe_module **mod)
{
	static const char *text = "moeir 1\n"
				  "layer @dotp dtype=bf16 {\n"
				  "  %0 = input \"a\" : bf16[31, 256]\n"
				  "  %1 = weight \"w\" {source=\"w\"} : bf16[48, 256]\n"
				  "  %2 = einsum(%0, %1) {eq=\"td,ed->te\"} : bf16[31, 48]\n"
				  "  %3 = cast(%2) {to=\"f32\"} : f32[31, 48]\n"
				  "  output %3\n"
				  "}\n";
	moe_module *m = moe_module_parse_text(c, "dotp.moeir", text, strlen(text));
	assert_non_null(m);
	*mod = m;
	cg_prog *p = cgen_lower(c, moe_module_graph(m, 0));
	assert_non_null(p);
	cg_dot *d = ir_alloc(&p->arena, sizeof *d);
	cg_expr *e = ir_alloc(&p->arena, 5 * sizeof *e);
	memset(e, 0, 5 * sizeof *e);
	int64_t v[5] = {rows, lanes, 0, w0 * PK, 0};
	for (int i = 0; i < 5; i++)
		e[i].op = CE_ICONST, e[i].ty = CT_I64, e[i].i = v[i];
	*d = (cg_dot){p->node_buf[0], p->node_buf[1], p->node_buf[3], &e[0], &e[1], &e[2], &e[3], &e[4], PK, PK, PK, 1, 0, 0};
	cg_stmt *s = ir_alloc(&p->arena, sizeof *s);
	memset(s, 0, sizeof *s);
	s->kind = CS_DOT;
	s->var = s->buf = -1;
	s->dot = d;
	p->body.first = p->body.last = s;
	return p;
}

/* y = the tile with W read as stored (wpack NULL) or from the packed copy pw */
static const char *run_packed(cg_prog *p, const int *wpack, const uint16_t *a, const uint16_t *w, const uint16_t *pw,
	float *y)
{
	cgen_jit_opts o = {0, 1, NULL, 0, NULL, wpack};
	cgen_jit *jit = NULL;
	cgen_layer_par_fn fn = NULL;
	assert_int_equal(cgen_jit_create(p, &o, &jit, &fn), MOE_OK);
	const void *ins[1] = {a}, *ws[2] = {w, pw};
	void *outs[1] = {y};
	void *work = malloc((size_t)p->workspace + 64);
	memset(y, 0, PR * 16 * sizeof *y);
	assert_int_equal(fn(ins, ws, outs, work, NULL), 0);
	free(work);
	cgen_jit_free(jit);
	return o.kernels;
}

/* one tile: packed copy vs W as stored, bitwise; with a zeroed packed copy
 * the tile reads it exactly when it is a whole aligned one (packed) */
static void packed_case(int64_t rows, int64_t lanes, int64_t w0, bool packed, const uint16_t *a, const uint16_t *w,
	const uint16_t *pw, const uint16_t *zero)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	cg_prog *p = packed_prog(c, rows, lanes, w0, &m);
	int *slot = calloc(p->nbufs + 1, sizeof *slot);
	int64_t *rowlen = calloc(p->nbufs + 1, sizeof *rowlen);
	assert_int_equal(cgen_pack_plan(p, slot, rowlen), 1);
	assert_int_equal(slot[p->node_buf[1]], 0);
	assert_int_equal(rowlen[p->node_buf[1]], PK);
	assert_int_equal(slot[p->node_buf[0]], -1);
	static _Alignas(64) float ys[PR * 16], yp[PR * 16], yz[PR * 16];
	const char *k = run_packed(p, NULL, a, w, NULL, ys);
	run_packed(p, slot, a, w, pw, yp);
	run_packed(p, slot, a, w, zero, yz);
	if (strcmp(k, "portable")) {
		assert_memory_equal(ys, yp, sizeof ys);
		bool zeros = true;
		for (int i = 0; i < rows * 16; i++)
			zeros = zeros && yz[i] == 0;
		assert_true(zeros == packed);
		if (!packed)
			assert_memory_equal(ys, yz, sizeof ys);
	} else { /* no AVX512-BF16: packed copies are never read */
		print_message("no AVX512-BF16: the packed kernel is not run\n");
		assert_memory_equal(ys, yz, sizeof ys);
	}
	free(slot);
	free(rowlen);
	cgen_free(p);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_dot_packed(void **state)
{
	(void)state;
	/* packed copies are 64-byte aligned (moe_host_run allocates them so): the tile's loads rely on it */
	static _Alignas(64) uint16_t a[PR * PK], w[PW * PK], pw[PW * PK], zero[PW * PK];
	for (int i = 0; i < PR * PK; i++)
		a[i] = rand_bf16();
	for (int i = 0; i < PW * PK; i++)
		w[i] = rand_bf16();
	cgen_pack_tiles(w, pw, PK, 0, PW / 16);
	/* the layout of pack.c, element by element */
	for (int r = 0; r < PW; r++)
		for (int kk = 0; kk < PK; kk++)
			assert_int_equal(pw[(r / 16) * 16 * PK + (kk / 32) * 512 + ((kk % 32) / 2) * 32 + (r % 16) * 2 + kk % 2],
				w[r * PK + kk]);
	packed_case(PR, 16, 16, true, a, w, pw, zero);  /* tile 1, 8 + 8 + 8 + 4 + 2 + 1 rows */
	packed_case(1, 16, 32, true, a, w, pw, zero);   /* the last tile, one row */
	packed_case(PR, 13, 16, false, a, w, pw, zero); /* a partial tile reads W as stored */
	packed_case(5, 16, 8, false, a, w, pw, zero);   /* so does one not starting at a tile */
}

/* ---- groups of tiles (CS_DOT group > 1, backend-c/emit_dotg.c) ---- */

enum { GR = 31, GK = 288, GW = 64 }; /* K: a k block of 256 and one of 32; W: one group of 4 tiles */

/* a bf16 [GR, GK] x [GW, GK] einsum whose body is one CS_DOT group of `rows`
 * rows and `lanes` lanes writing y as [GR, GW] (drow GW, tiles DOT_LANES apart) */
static cg_prog *group_prog(moe_ctx *c, int64_t rows, int64_t lanes, moe_module **mod)
{
	static const char *text = "moeir 1\n"
				  "layer @dotg dtype=bf16 {\n"
				  "  %0 = input \"a\" : bf16[31, 288]\n"
				  "  %1 = weight \"w\" {source=\"w\"} : bf16[64, 288]\n"
				  "  %2 = einsum(%0, %1) {eq=\"td,ed->te\"} : bf16[31, 64]\n"
				  "  %3 = cast(%2) {to=\"f32\"} : f32[31, 64]\n"
				  "  output %3\n"
				  "}\n";
	moe_module *m = moe_module_parse_text(c, "dotg.moeir", text, strlen(text));
	assert_non_null(m);
	*mod = m;
	cg_prog *p = cgen_lower(c, moe_module_graph(m, 0));
	assert_non_null(p);
	cg_dot *d = ir_alloc(&p->arena, sizeof *d);
	cg_expr *e = ir_alloc(&p->arena, 5 * sizeof *e);
	memset(e, 0, 5 * sizeof *e);
	int64_t v[5] = {rows, lanes, 0, 0, 0};
	for (int i = 0; i < 5; i++)
		e[i].op = CE_ICONST, e[i].ty = CT_I64, e[i].i = v[i];
	*d = (cg_dot){p->node_buf[0], p->node_buf[1], p->node_buf[3], &e[0], &e[1], &e[2], &e[3], &e[4], GK, GK, GK,
		DOT_GROUP, DOT_LANES, GW};
	cg_stmt *s = ir_alloc(&p->arena, sizeof *s);
	memset(s, 0, sizeof *s);
	s->kind = CS_DOT;
	s->var = s->buf = -1;
	s->dot = d;
	p->body.first = p->body.last = s;
	return p;
}

static const char *run_group(cg_prog *p, int portable, const int *wpack, const uint16_t *a, const uint16_t *w,
	const uint16_t *pw, float *y)
{
	cgen_jit_opts o = {portable, 1, NULL, 0, NULL, wpack};
	cgen_jit *jit = NULL;
	cgen_layer_par_fn fn = NULL;
	assert_int_equal(cgen_jit_create(p, &o, &jit, &fn), MOE_OK);
	const void *ins[1] = {a}, *ws[2] = {w, pw};
	void *outs[1] = {y};
	void *work = malloc((size_t)p->workspace + 64);
	memset(y, 0, GR * GW * sizeof *y);
	assert_int_equal(fn(ins, ws, outs, work, NULL), 0);
	free(work);
	cgen_jit_free(jit);
	return o.kernels;
}

/* a group: the register-blocked kernel over the packed copy (whole groups)
 * bitwise equal to the single-tile vdpbf16ps kernels over W as stored, each
 * within the docs/abi.md bound of the portable tiles (test_dot_bound's
 * check, here against the C engine's loops run as LLVM portable code) */
static void group_case(int64_t rows, int64_t lanes, const uint16_t *a, const uint16_t *w, const uint16_t *pw)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	cg_prog *p = group_prog(c, rows, lanes, &m);
	int *slot = calloc(p->nbufs + 1, sizeof *slot);
	int64_t *rowlen = calloc(p->nbufs + 1, sizeof *rowlen);
	assert_int_equal(cgen_pack_plan(p, slot, rowlen), 1);
	static _Alignas(64) float yg[GR * GW], ys[GR * GW], yp[GR * GW];
	const char *k = run_group(p, 0, slot, a, w, pw, yg);
	run_group(p, 0, NULL, a, w, NULL, ys);
	run_group(p, 1, NULL, a, w, NULL, yp);
	assert_memory_equal(yg, ys, sizeof yg);
	int differ = 0;
	for (int r = 0; r < GR; r++)
		for (int j = 0; j < GW; j++) {
			float g = yg[r * GW + j], q = yp[r * GW + j];
			if (r >= rows || j >= (lanes + 15) / 16 * 16) { /* untouched */
				assert_true(g == 0 && q == 0);
				continue;
			}
			int jj = j < lanes ? j : (int)lanes - 1; /* a partial tile repeats its last lane (cgen.h) */
			double mag = 0;
			for (int kk = 0; kk < GK; kk++)
				mag += fabs(bf16_value(a[r * GK + kk]) * bf16_value(w[jj * GK + kk]));
			double gamma = (GK - 1) * ldexp(1.0, -24) / (1 - (GK - 1) * ldexp(1.0, -24)); /* as test_dot_bound */
			double bound = 2 * gamma * mag + 2 * GK * ldexp(1.0, -126);
			if (fabs((double)g - (double)q) > bound)
				fail_msg("row %d col %d: %.9g vs %.9g, bound %.3g", r, j, g, q, bound);
			differ += g != q;
		}
	if (!strcmp(k, "portable"))
		assert_int_equal(differ, 0);
	print_message("group of %lld rows, %lld lanes (%s): %d sums differ from the portable tiles\n", (long long)rows,
		(long long)lanes, k, differ);
	free(slot);
	free(rowlen);
	cgen_free(p);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_dot_group(void **state)
{
	(void)state;
	static _Alignas(64) uint16_t a[GR * GK], w[GW * GK], pw[GW * GK];
	for (int i = 0; i < GR * GK; i++)
		a[i] = rand_bf16();
	for (int i = 0; i < GW * GK; i++)
		w[i] = rand_bf16();
	cgen_pack_tiles(w, pw, GK, 0, GW / 16);
	/* row groups of 4 to 6 rows share the next k block's prefetches (emit_dotg.c
	 * pf_share: row group i of n takes the k pairs j with j % n == i), smaller
	 * ones have none; neither may change a bit */
	group_case(GR, GW, a, w, pw); /* whole: 6 + 5 + 5 + 5 + 5 + 5 rows, all prefetching */
	group_case(11, GW, a, w, pw); /* 6 + 5 */
	group_case(7, GW, a, w, pw);  /* 4 + 3: only the first prefetches its share */
	group_case(3, GW, a, w, pw);  /* 3: no prefetch */
	group_case(GR, 40, a, w, pw); /* a partial group: tiles of 16, 16 and 8 lanes, one at a time */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_bf16),
		cmocka_unit_test(test_threads_f32),
		cmocka_unit_test(test_dot_bound),
		cmocka_unit_test(test_dot_packed),
		cmocka_unit_test(test_dot_group),
		cmocka_unit_test(test_cache),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
