/* backend-c/host.c: public entry points of the host backend (moec/backend.h):
 * emitting C / LLVM files and running a layer in process, either through the
 * ORC JIT or by compiling the emitted C with the system compiler and loading
 * it with dlopen. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "moec/io.h"
#include <unistd.h>

#include "backend-c/cgen.h"
#include "ir/graph_keys.h"
#include "runtime/rt_io.h"
#include "moec/backend.h"

extern char **environ;

static moe_status emit_c(moe_ctx *ctx, const moe_graph *g, FILE *out)
{
	cg_prog *p = cgen_lower(ctx, g);
	if (!p)
		return MOE_ERR_INVALID;
	moe_status s = cgen_emit_c(p, out);
	cgen_free(p);
	return s;
}

moe_status moe_emit_c(moe_ctx *ctx, const moe_graph *g, FILE *out)
{
	if (!ctx || !g || !out)
		return MOE_ERR_INVALID;
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, emit_c(ctx, g, out));
}

typedef struct memstream {
	FILE *f;
	char *buf;
	size_t len;
} memstream;

static void memstream_unwind(void *arg)
{
	memstream *m = arg;
	fclose(m->f);
	free(m->buf);
	m->f = NULL;
}

/* The stream is libc's (open_memstream): a throw closes it. */
static moe_status emit_c_string(moe_ctx *ctx, const moe_graph *g, memstream *m)
{
	uint32_t h = ctx_defer(ctx, memstream_unwind, m);
	moe_status s = emit_c(ctx, g, m->f);
	ctx_undefer(ctx, h);
	return s;
}

static moe_status emit_c_string_guarded(moe_ctx *ctx, const moe_graph *g, memstream *m)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, emit_c_string(ctx, g, m));
}

moe_status moe_emit_c_string(moe_ctx *ctx, const moe_graph *g, char **out)
{
	if (!out)
		return MOE_ERR_INVALID;
	*out = NULL;
	if (!ctx || !g)
		return MOE_ERR_INVALID;
	memstream m = {NULL, NULL, 0};
	m.f = open_memstream(&m.buf, &m.len);
	if (!m.f)
		return MOE_ERR_NOMEM;
	moe_status s = emit_c_string_guarded(ctx, g, &m);
	if (!m.f) /* unwound: closed and freed */
		return s;
	if (fclose(m.f) != 0 && !s)
		s = MOE_ERR_NOMEM;
	if (s) {
		free(m.buf);
		return s;
	}
	*out = m.buf; /* malloc'd: moe_free releases it */
	return MOE_OK;
}

moe_status cgen_write_atomic(moe_ctx *ctx, const char *path, moe_status (*write)(void *ud, FILE *f), void *ud)
{
	moe_atomic_file *af = moe_atomic_open(ctx, path);
	if (!af)
		return MOE_ERR_IO;
	errno = 0;
	moe_status s = write(ud, moe_atomic_stream(af));
	if (s) {
		int e = errno;
		moe_atomic_abort(af);
		if (s == MOE_ERR_IO)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, path), "write failed: %s", strerror(e ? e : EIO));
		return s;
	}
	return moe_atomic_commit(af);
}

static moe_status write_c(void *ud, FILE *f)
{
	return cgen_emit_c(ud, f);
}

static moe_status emit_c_file(moe_ctx *ctx, const moe_graph *g, const char *path)
{
	cg_prog *p = cgen_lower(ctx, g);
	if (!p)
		return MOE_ERR_INVALID;
	moe_status s = cgen_write_atomic(ctx, path, write_c, p);
	cgen_free(p);
	return s;
}

moe_status moe_emit_c_file(moe_ctx *ctx, const moe_graph *g, const char *path)
{
	if (!ctx || !g || !path)
		return MOE_ERR_INVALID;
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, emit_c_file(ctx, g, path));
}

static moe_status emit_llvm_guarded(moe_ctx *ctx, const moe_graph *g, const char *path, int kind);

static moe_status emit_llvm(moe_ctx *ctx, const moe_graph *g, const char *path, int kind)
{
	if (!ctx || !g || !path)
		return MOE_ERR_INVALID;
	return emit_llvm_guarded(ctx, g, path, kind);
}

static moe_status emit_llvm_body(moe_ctx *ctx, const moe_graph *g, const char *path, int kind)
{
	cg_prog *p = cgen_lower(ctx, g);
	if (!p)
		return MOE_ERR_INVALID;
	moe_status s = cgen_emit_llvm_file(p, path, kind);
	cgen_free(p);
	return s;
}

static moe_status emit_llvm_guarded(moe_ctx *ctx, const moe_graph *g, const char *path, int kind)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, emit_llvm_body(ctx, g, path, kind));
}

moe_status moe_emit_llvm_ir(moe_ctx *ctx, const moe_graph *g, const char *path)
{
	return emit_llvm(ctx, g, path, 0);
}

moe_status moe_emit_object(moe_ctx *ctx, const moe_graph *g, const char *path)
{
	return emit_llvm(ctx, g, path, 1);
}

moe_status moe_host_workspace_size(moe_ctx *ctx, const moe_graph *g, size_t *bytes)
{
	if (!ctx || !g || !bytes)
		return MOE_ERR_INVALID;
	cg_prog *p = cgen_lower(ctx, g);
	if (!p)
		return MOE_ERR_INVALID;
	*bytes = (size_t)p->workspace;
	cgen_free(p);
	return MOE_OK;
}

/* ---------------- the C engine: cc + dlopen ---------------- */

typedef struct cc_mod {
	char dir[256], src[300], lib[300], log[300];
	int slot[4]; /* their places in the table of temporaries (runtime/file.c) */
	void *dl;
} cc_mod;

static void cc_cleanup(cc_mod *m)
{
	if (m->dl)
		dlclose(m->dl);
	m->dl = NULL;
	if (m->src[0])
		unlink(m->src);
	if (m->lib[0])
		unlink(m->lib);
	if (m->log[0])
		unlink(m->log);
	if (m->dir[0])
		rmdir(m->dir);
	for (int i = 0; i < 4; i++)
		moe_temp_forget(m->slot[i]);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Compile p's C with $MOEC_CC (default "cc") and load it. */
static moe_status cc_load(cg_prog *p, cc_mod *m, cgen_layer_fn *fn)
{
	moe_ctx *ctx = p->ctx;
	const char *tmpdir = getenv("TMPDIR");
	snprintf(m->dir, sizeof m->dir, "%s/moec-cc-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
	if (!moe_temp_dir(m->dir, &m->slot[0])) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "cannot create a temporary directory: %s", strerror(errno));
		m->dir[0] = 0;
		return MOE_ERR_IO;
	}
	snprintf(m->src, sizeof m->src, "%s/layer.c", m->dir);
	snprintf(m->lib, sizeof m->lib, "%s/layer.so", m->dir);
	snprintf(m->log, sizeof m->log, "%s/cc.log", m->dir);
	m->slot[1] = moe_temp_track(m->src);
	m->slot[2] = moe_temp_track(m->lib);
	m->slot[3] = moe_temp_track(m->log);
	moe_status s = cgen_write_atomic(ctx, m->src, write_c, p);
	if (s)
		return s;
	const char *cc = getenv("MOEC_CC");
	if (!cc || !*cc)
		cc = "cc";
	char *argv[] = {(char *)cc, "-std=c11", "-O3", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared", "-o",
		m->lib, m->src, "-lm", NULL};
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, m->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	pid_t pid;
	int rc = posix_spawnp(&pid, cc, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "cannot run the C compiler '%s': %s", cc, strerror(rc));
		return MOE_ERR_IO;
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		char text[2048] = "";
		FILE *f = fopen(m->log, "r");
		if (f) {
			size_t n = fread(text, 1, sizeof text - 1, f);
			text[n] = 0;
			fclose(f);
		}
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the C compiler '%s' failed on the emitted layer:\n%s", cc, text);
		return MOE_ERR_INTERNAL;
	}
	m->dl = dlopen(m->lib, RTLD_NOW | RTLD_LOCAL);
	if (!m->dl) {
		const char *e = dlerror();
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "cannot load the compiled layer: %s", e ? e : "?");
		return MOE_ERR_IO;
	}
	char sym[200];
	cgen_symbol(p, NULL, sym, sizeof sym);
	void *f = dlsym(m->dl, sym);
	if (!f) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the compiled layer lacks the symbol %s", sym);
		return MOE_ERR_INTERNAL;
	}
	memcpy(fn, &f, sizeof *fn); /* POSIX: dlsym results convert to function pointers */
	return MOE_OK;
}

/* ---------------- running ---------------- */

static bool same_type(const moe_tensor *t, const ir_node *n)
{
	if (t->dtype != (moe_dtype)n->dtype || t->rank != n->rank)
		return false;
	for (int d = 0; d < n->rank; d++)
		if (t->shape[d] != n->shape[d])
			return false;
	return true;
}

static void fmt_type(char *buf, size_t len, moe_dtype t, int rank, const int64_t *shape)
{
	size_t o = (size_t)snprintf(buf, len, "%s[", moe_dtype_name(t));
	for (int d = 0; d < rank && o < len; d++)
		o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static moe_status bind_all(moe_ctx *ctx, const cg_prog *p, const moe_tensor_map *bind, const void **ins,
	const void **ws)
{
	moe_status s = MOE_OK;
	for (int pass = 0; pass < 2; pass++) {
		uint32_t n = pass ? p->nweights : p->ninputs;
		const moe_id *ids = pass ? p->weights : p->inputs;
		for (uint32_t i = 0; i < n; i++) {
			const ir_node *nd = N(p->g, ids[i]);
			const char *name = nd->name ? nd->name : "";
			const moe_tensor *t = bind ? moe_tensor_map_get(bind, name) : NULL;
			if (!t) {
				moe_diag(ctx, MOE_DIAG_ERROR, nd->loc, "no tensor bound for %s '%s'", pass ? "weight" : "input", name);
				s = MOE_ERR_INVALID;
				continue;
			}
			if (!same_type(t, nd)) {
				char want[160], got[160];
				fmt_type(want, sizeof want, (moe_dtype)nd->dtype, nd->rank, nd->shape);
				fmt_type(got, sizeof got, t->dtype, t->rank, t->shape);
				moe_diag(ctx, MOE_DIAG_ERROR, nd->loc, "%s '%s' is %s but the bound tensor is %s",
					pass ? "weight" : "input", name, want, got);
				s = MOE_ERR_INVALID;
				continue;
			}
			if (!t->data) {
				moe_diag(ctx, MOE_DIAG_ERROR, nd->loc,
					"%s '%s' is bound without data (absent from the checkpoint); only a timing-only TCP run "
					"accepts that", pass ? "weight" : "input", name);
				s = MOE_ERR_INVALID;
				continue;
			}
			(pass ? ws : ins)[i] = t->data;
		}
	}
	return s;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static const void *buf_data(const cg_prog *p, int b, const void **ins, const void **ws, moe_tensor **out,
	const unsigned char *work)
{
	const cg_buf *bf = &p->bufs[b];
	switch ((cg_bk)bf->kind) {
	case CB_INPUT: return ins[bf->index];
	case CB_WEIGHT: return ws[bf->index];
	case CB_OUTPUT: return out[bf->index]->data;
	case CB_WORK: return work + bf->offset;
	}
	return NULL;
}

static const char *fault_text(int code)
{
	switch (code) {
	case CG_FAULT_INDEX: return "an index is out of range (gather, take_along, scatter or a g_idx of dequant)";
	case CG_FAULT_DIV0: return "integer division by zero";
	default: return "unknown fault";
	}
}

void moe_host_opts_init(moe_host_opts *o)
{
	if (!o)
		return;
	memset(o, 0, sizeof *o);
	o->engine = MOE_HOST_LLVM;
	o->repeat = 1;
}

moe_status moe_host_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_host_engine engine,
	int repeat, moe_tensor **out, moe_host_stats *stats)
{
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.engine = engine;
	o.repeat = repeat;
	return moe_host_run_opts(ctx, g, bind, &o, out, stats);
}

/* The buffers of one run and the loaded layer. */
typedef struct host_run {
	const void **ins, **ws;
	void **outs;
	void *work, *work_block; /* work: 64-byte aligned inside work_block */
	double *times;
	size_t nin, nw, no;
	cgen_jit *jit;
	cc_mod ccm;
	cgen_layer_fn fn;
	cgen_layer_par_fn pfn;
	cgen_pool *pool;
	cgen_jit_opts jo;
	int *wpack;         /* per buffer: slot of its packed copy (cgen_pack_plan), or NULL */
	int64_t *rowlen;    /* per buffer: the K it is packed with */
	int npack;
	void **packed;      /* the packed copies, weights[nweights + slot] */
	cgen_pack_entry *cached; /* per slot: the cache entry read in place of a copy */
} host_run;

static moe_status run_setup(moe_ctx *ctx, const moe_graph *g, const cg_prog *p, const moe_tensor_map *bind,
	const moe_host_opts *o, host_run *R, moe_tensor **out)
{
	R->nin = p->ninputs + 1, R->nw = p->nweights + (size_t)R->npack + 1, R->no = p->noutputs + 1;
	R->ins = ctx_alloc(ctx, R->nin * sizeof *R->ins);
	R->ws = ctx_alloc(ctx, R->nw * sizeof *R->ws);
	R->outs = ctx_alloc(ctx, R->no * sizeof *R->outs);
	R->times = ctx_alloc(ctx, (size_t)o->repeat * sizeof *R->times);
	moe_status s = bind_all(ctx, p, bind, R->ins, R->ws);
	for (uint32_t j = 0; !s && j < g->nout; j++) {
		const ir_node *n = N(g, g->outputs[j]);
		out[j] = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		if (!out[j])
			s = MOE_ERR_NOMEM;
		else
			R->outs[j] = out[j]->data;
	}
	if (!s && p->workspace > 0) {
		size_t sz = ((size_t)p->workspace + 63) & ~(size_t)63;
		R->work_block = sz < SIZE_MAX - 64 ? ctx_try_alloc(ctx, sz + 64) : NULL; /* 64-byte aligned inside */
		R->work = R->work_block ? (void *)(((uintptr_t)R->work_block + 63) & ~(uintptr_t)63) : NULL;
		if (!R->work) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory allocating %zu bytes of workspace", sz);
			s = MOE_ERR_NOMEM;
		}
	}
	return s;
}

/* moe_host_opts.cold: the eviction buffer read in 1 MiB pieces over the
 * thread pool, one load per 64-byte line. Read, not written: the caches are
 * left holding clean lines, so the call that follows pays no write-backs
 * (bench/stream.c's read probe pays none either). Every core's caches are
 * swept, and the workers are awake when the call starts, as they are
 * between back-to-back calls. */
typedef struct cold_env {
	const unsigned char *buf;
	_Atomic unsigned sink; /* keeps the loads */
} cold_env;

static void cold_body(void *env, int64_t lo, int64_t hi)
{
	cold_env *e = env;
	unsigned acc = 0;
	for (size_t i = (size_t)lo << 20; i < (size_t)hi << 20; i += 64)
		acc += ((const volatile unsigned char *)e->buf)[i];
	atomic_fetch_add_explicit(&e->sink, acc, memory_order_relaxed);
}

static void cold_evict(cgen_pool *pool, const unsigned char *buf)
{
	cold_env e = {buf, 0};
	cgen_pool_run(pool, cold_body, &e, 0, (int64_t)(MOE_HOST_COLD_BYTES >> 20));
}

/* Which bf16 weights the vdpbf16ps tiles read packed (pack.c). */
static void pack_plan(moe_ctx *ctx, const cg_prog *p, host_run *R)
{
	R->wpack = ctx_alloc(ctx, (p->nbufs + 1) * sizeof *R->wpack);
	R->rowlen = ctx_alloc(ctx, (p->nbufs + 1) * sizeof *R->rowlen);
	R->npack = cgen_pack_plan(p, R->wpack, R->rowlen);
	R->packed = ctx_alloc(ctx, (size_t)R->npack * sizeof *R->packed + 1);
	R->cached = ctx_alloc(ctx, (size_t)R->npack * sizeof *R->cached + 1);
	for (int i = 0; i < R->npack; i++)
		R->packed[i] = NULL;
	R->jo.wpack = R->npack ? R->wpack : NULL;
}

typedef struct pack_env {
	const uint16_t *src;
	uint16_t *dst;
	int64_t K;
} pack_env;

static void pack_body(void *env, int64_t lo, int64_t hi)
{
	const pack_env *e = env;
	cgen_pack_tiles(e->src, e->dst, e->K, lo, hi);
}

/* The key text of buffer b's packed copy (cgen_pack_load), in ctx memory. */
static char *pack_key(moe_ctx *ctx, const moe_graph *g, const cg_buf *b, int64_t K, const char *id)
{
	const ir_node *n = b->node != MOE_NONE && b->node < g->nnodes ? N(g, b->node) : NULL;
	int64_t layer = -1;
	moe_graph_get_dim(g, "layer", &layer);
	const char *name = n && n->name ? n->name : "", *src = n ? ir_attr_str(n, "source", "") : "";
	size_t len = strlen(name) + strlen(src) + strlen(id) + 256;
	char *k = ctx_alloc(ctx, len);
	snprintf(k, len, "moec packed weight 1\nversion %s\nlanes %d\nK %lld\nnumel %lld\nweight %u %s\nsource %s\n"
		"layer %lld\n%s", moe_version_string(), DOT_LANES, (long long)K, (long long)b->numel, b->index, name, src,
		(long long)layer, id);
	return k;
}

/* The cache's outcome over the packed weights: OFF, then the worst seen. */
static void pack_outcome(moe_host_cache *c, moe_host_cache one)
{
	if (*c == MOE_CACHE_OFF || one == MOE_CACHE_BAD || (one == MOE_CACHE_MISS && *c == MOE_CACHE_HIT))
		*c = one;
}

/* The packed-weight cache's root, or false (with one warning when a root
 * exists but cannot be written: the cache is then off). */
static bool pack_cache_open(moe_ctx *ctx, const moe_host_opts *o, cgen_cache *c)
{
	if (!o->weights_id || o->no_cache || !cgen_cache_open(ctx, c, o->cache_dir, "pack", 4))
		return false;
	struct stat st;
	/* read-only: not writable by us, or its owner's write bit cleared (which root would pass) */
	if (faccessat(c->dir, ".", W_OK, AT_EACCESS) != 0 || fstat(c->dir, &st) != 0 || !(st.st_mode & S_IWUSR)) {
		moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_file(ctx, c->root),
			"the cache directory is not writable: the packed-weight cache is off (every run packs the weights)");
		cgen_cache_close(c);
		return false;
	}
	return true;
}

/* The packed copies, made over the thread pool: weights[nweights + slot]. */
static moe_status pack_weights(moe_ctx *ctx, const moe_graph *g, const cg_prog *p, const moe_host_opts *o, host_run *R,
	moe_host_cache *outcome)
{
	cgen_cache cc;
	bool cached = pack_cache_open(ctx, o, &cc);
	moe_status s = MOE_OK;
	for (uint32_t i = 0; i < p->nbufs && s == MOE_OK; i++) {
		int slot = R->wpack[i];
		if (slot < 0)
			continue;
		const cg_buf *b = &p->bufs[i];
		size_t bytes = (size_t)b->numel * 2;
		char *key = cached ? pack_key(ctx, g, b, R->rowlen[i], o->weights_id) : NULL;
		const char *why = NULL;
		int got = key ? cgen_pack_map(&cc, key, strlen(key), bytes, &R->cached[slot], &why) : 0;
		if (got == 1) {
			R->ws[p->nweights + (uint32_t)slot] = R->cached[slot].data;
			pack_outcome(outcome, MOE_CACHE_HIT);
			ctx_free(ctx, key, 0);
			continue;
		}
		if (posix_memalign(&R->packed[slot], 64, bytes ? bytes : 64) != 0) {
			R->packed[slot] = NULL;
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "cannot allocate %zu bytes for a packed weight", bytes);
			s = MOE_ERR_NOMEM;
			break;
		}
		R->ws[p->nweights + (uint32_t)slot] = R->packed[slot];
		if (got < 0)
			moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_file(ctx, cc.root),
				"packed-weight cache entry for weight '%s' is bad (%s): packed again and rewritten",
				b->node != MOE_NONE ? moe_node_name(g, b->node) : "?", why);
		pack_env e = {R->ws[b->index], R->packed[slot], R->rowlen[i]};
		cgen_pool_run(R->pool, pack_body, &e, 0, b->numel / (DOT_LANES * R->rowlen[i]));
		if (key) {
			cgen_pack_store(&cc, key, strlen(key), R->packed[slot], bytes);
			pack_outcome(outcome, got < 0 ? MOE_CACHE_BAD : MOE_CACHE_MISS);
		}
		ctx_free(ctx, key, 0);
	}
	if (cached)
		cgen_cache_close(&cc);
	return s;
}

static void run_teardown(moe_ctx *ctx, const cg_prog *p, host_run *R, int repeat)
{
	for (int i = 0; i < R->npack; i++) {
		free(R->packed[i]);
		cgen_pack_unmap(&R->cached[i]);
	}
	if (R->wpack) {
		ctx_free(ctx, R->cached, 0);
		ctx_free(ctx, R->packed, (size_t)R->npack * sizeof *R->packed + 1);
		ctx_free(ctx, R->wpack, (p->nbufs + 1) * sizeof *R->wpack);
		ctx_free(ctx, R->rowlen, (p->nbufs + 1) * sizeof *R->rowlen);
	}
	cgen_pool_free(R->pool);
	cgen_jit_free(R->jit);
	cc_cleanup(&R->ccm);
	ctx_free(ctx, R->work_block, 0);
	ctx_free(ctx, R->times, (size_t)repeat * sizeof *R->times);
	ctx_free(ctx, R->ins, R->nin * sizeof *R->ins);
	ctx_free(ctx, R->ws, R->nw * sizeof *R->ws);
	ctx_free(ctx, R->outs, R->no * sizeof *R->outs);
}

static void fill_stats(const cg_prog *p, const moe_graph *g, host_run *R, const moe_host_opts *o, int threads,
	moe_tensor **out, moe_host_stats *stats)
{
	int repeat = o->repeat;
	double *times = R->times;
	qsort(times, (size_t)repeat, sizeof *times, cmp_double);
	stats->compute_seconds = repeat % 2 ? times[repeat / 2] : 0.5 * (times[repeat / 2 - 1] + times[repeat / 2]);
	stats->repeat = repeat;
	stats->workspace_bytes = (size_t)p->workspace;
	stats->grid_blocks_max = ir_graph_attr_int(g, IR_GK_GRID_BLOCKS_MAX, -1);
	stats->threads = threads;
	stats->cache = R->jo.cache;
	stats->kernels = R->jo.kernels ? R->jo.kernels : "portable";
	for (uint32_t k = 0; k < p->nmasks; k++) {
		const int32_t *v = buf_data(p, p->masks[k].buf, R->ins, R->ws, out, R->work);
		for (int64_t i = 0; i < p->masks[k].len; i++) {
			int64_t c = v[i] < 0 ? 0 : v[i] > p->masks[k].rows ? p->masks[k].rows : v[i];
			if (c > 0)
				stats->blocks_executed++, stats->rows_executed += c;
			else
				stats->blocks_skipped++;
		}
	}
}

/* A throw during the run: the threads, the JIT and the C engine's
 * temporaries go (the blocks go with the unwinding). */
static void run_unwind(void *arg)
{
	host_run *R = arg;
	for (int i = 0; R->packed && i < R->npack; i++) {
		free(R->packed[i]); /* posix_memalign'd or mapped: the unwinding does not know them */
		R->packed[i] = NULL;
		if (R->cached)
			cgen_pack_unmap(&R->cached[i]);
	}
	cgen_pool_free(R->pool);
	cgen_jit_free(R->jit);
	cc_cleanup(&R->ccm);
}

static moe_status host_run_opts(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const moe_host_opts *opts,
	moe_tensor **out, moe_host_stats *stats)
{
	moe_host_opts o;
	if (opts)
		o = *opts;
	else
		moe_host_opts_init(&o);
	if (!ctx || !g || !out || o.repeat < 1 || o.threads < 0 || (o.engine != MOE_HOST_LLVM && o.engine != MOE_HOST_C))
		return MOE_ERR_INVALID;
	if (o.threads > MOE_HOST_MAX_THREADS) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the thread count must be at most %d, got %d",
			MOE_HOST_MAX_THREADS, o.threads);
		return MOE_ERR_INVALID;
	}
	for (uint32_t j = 0; j < g->nout; j++)
		out[j] = NULL;
	if (moe_tokens_check(ctx, g, bind, NULL) != MOE_OK)
		return MOE_ERR_INVALID;
	double t0 = now();
	cg_prog *p = cgen_lower(ctx, g);
	if (!p)
		return MOE_ERR_INVALID;
	host_run R;
	memset(&R, 0, sizeof R);
	for (int i = 0; i < 4; i++)
		R.ccm.slot[i] = -1; /* no temporaries registered yet */
	R.jo.portable = o.portable;
	R.jo.no_cache = o.no_cache;
	R.jo.cache_dir = o.cache_dir;
	uint32_t unwind = ctx_defer(ctx, run_unwind, &R);
	if (o.engine == MOE_HOST_LLVM && !o.portable)
		pack_plan(ctx, p, &R);
	int threads = o.engine == MOE_HOST_C ? 1 : o.threads ? o.threads : cgen_cores();
	double tl = now();
	moe_status s = run_setup(ctx, g, p, bind, &o, &R, out);
	double ts = now();
	if (!s)
		s = o.engine == MOE_HOST_LLVM ? cgen_jit_create(p, &R.jo, &R.jit, &R.pfn) : cc_load(p, &R.ccm, &R.fn);
	double t1 = now();
	if (!s && threads > 1 && !(R.pool = cgen_pool_create(ctx, threads)))
		s = MOE_ERR_INTERNAL;
	double t2 = now();
	moe_host_cache pack_cache = MOE_CACHE_OFF;
	if (!s && R.npack && R.jo.kernels && strcmp(R.jo.kernels, "portable"))
		s = pack_weights(ctx, g, p, &o, &R, &pack_cache);
	double t3 = now();
	cgen_par par = {cgen_pool_run, R.pool};
	unsigned char *evict = NULL;
	if (!s && o.cold) {
		if (!(evict = ctx_try_alloc(ctx, MOE_HOST_COLD_BYTES))) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory allocating the %zu bytes of cold runs",
				MOE_HOST_COLD_BYTES);
			s = MOE_ERR_NOMEM;
		} else {
			memset(evict, 1, MOE_HOST_COLD_BYTES); /* real pages, not the shared zero page */
		}
	}
	for (int r = 0; !s && r < o.repeat; r++) {
		if (evict)
			cold_evict(R.pool, evict);
		double a = now();
		int rc = R.pfn ? R.pfn(R.ins, R.ws, R.outs, R.work, R.pool ? &par : NULL) : R.fn(R.ins, R.ws, R.outs, R.work);
		R.times[r] = now() - a;
		if (rc) {
			moe_diag(ctx, MOE_DIAG_ERROR, g->loc, "run-time fault in layer '%s' (code %d): %s", g->name ? g->name : "",
				rc, fault_text(rc));
			s = MOE_ERR_RUNTIME;
		}
	}
	if (!s && stats) {
		memset(stats, 0, sizeof *stats);
		stats->compile_seconds = (tl - t0) + (t1 - ts); /* the binding and workspace are not compilation */
		stats->setup_seconds = ts - tl;
		stats->pack_seconds = R.npack && (R.packed[0] || R.cached[0].map) ? t3 - t2 : 0;
		fill_stats(p, g, &R, &o, threads, out, stats);
		stats->pack_cache = pack_cache;
	}
	if (evict)
		ctx_free(ctx, evict, MOE_HOST_COLD_BYTES);
	ctx_undefer(ctx, unwind);
	run_teardown(ctx, p, &R, o.repeat);
	cgen_free(p);
	if (s) {
		for (uint32_t j = 0; j < g->nout; j++) {
			moe_tensor_free(ctx, out[j]);
			out[j] = NULL;
		}
	}
	return s;
}

static moe_status host_run_guarded(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind,
	const moe_host_opts *opts, moe_tensor **out, moe_host_stats *stats)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, host_run_opts(ctx, g, bind, opts, out, stats));
}

moe_status moe_host_run_opts(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const moe_host_opts *opts,
	moe_tensor **out, moe_host_stats *stats)
{
	if (!ctx || !g || !out)
		return MOE_ERR_INVALID;
	moe_status s = host_run_guarded(ctx, g, bind, opts, out, stats);
	if (s == MOE_ERR_NOMEM) /* the outputs were freed with the rest */
		for (uint32_t j = 0; j < g->nout; j++)
			out[j] = NULL;
	return s;
}
