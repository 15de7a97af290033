/* frontend/cli/ep.c: `moec run --ep N`, one device of an expert-parallel
 * layer per MPI rank (docs/expert-parallel.md).
 *
 * Rank r builds the layer for its shard of the T tokens (--set T=T_r, one
 * dummy row when it has none), runs the pipeline with
 * expert-parallel{ep=N,rank=r,tokens=T}, loads only its experts' weights,
 * binds its rows of the input and runs its program on the interpreter, the
 * all_to_all nodes going through MPI (ep_mpi.c). Rank 0 gathers the rows of
 * the output in rank order and writes -o. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/cli/cli.h"
#include "moec/tcp.h"
#include "runtime/rt_io.h"

static int fail(moe_ctx *ctx, const char *fmt, const char *arg)
{
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), fmt, arg);
	return 1;
}

/* The options --ep takes, and N; 0 after an error. */
static int64_t ep_count(moe_ctx *ctx, const opts *o)
{
	char *end;
	errno = 0;
	long long n = strtoll(o->ep, &end, 10);
	if (errno || end == o->ep || *end || n < 1 || n > 4096)
		return fail(ctx, "--ep must be a device count in 1..4096, got '%s'", o->ep), 0;
	bool tcp = o->target && !strcmp(o->target, "tcp");
	bool jit_engine = !tcp && o->engine && strcmp(o->engine, "interp");
	const char *jit = o->repeat ? "--repeat" : o->stats ? "--stats" : o->threads ? "--threads" : o->kernels ? "--kernels"
			: o->no_cache ? "--no-cache" : o->cold ? "--cold" : NULL;
	if (o->repeat || (o->stats && !tcp))
		return fail(ctx, "%s does not apply to --ep on the host", o->repeat ? "--repeat" : "--stats"), 0;
	if (jit && !tcp && !jit_engine)
		return fail(ctx, "%s applies to --ep with --engine=llvm or c (the default runs the interpreter)", jit), 0;
	if (o->kind != K_MOE && o->kind != K_UNREAD)
		return fail(ctx, "--ep needs a .moe layer (its token count T is set per device), not %s", o->file), 0;
	return n;
}

/* The layer with T = rows (an extra --set). */
static moe_module *load_rows(moe_ctx *ctx, const opts *o, int64_t rows)
{
	opts *c = malloc(sizeof *c);
	if (!c || o->nsets >= MAX_SETS) {
		free(c);
		fail(ctx, "too many --set options%s", "");
		return NULL;
	}
	*c = *o;
	char v[24];
	snprintf(v, sizeof v, "%lld", (long long)rows);
	size_t at = c->nsets;
	for (size_t i = 0; i < c->nsets; i++)
		if (!strcmp(c->sets[i].name, "T"))
			at = i; /* the user's global T becomes this device's rows */
	c->sets[at] = (moe_setting){"T", v};
	if (at == c->nsets)
		c->nsets++;
	moe_module *m = cli_load(ctx, c);
	cli_quant_act(o, m); /* --quant-act, as cli_load_tcp sets it on one chip */
	free(c);
	return m;
}

/* The global token count: the layer's T after the user's --set. */
static int64_t global_tokens(moe_ctx *ctx, const opts *o)
{
	moe_module *m = cli_load(ctx, o);
	int64_t T = -1;
	if (m && moe_module_num_graphs(m) == 1 && !moe_graph_get_dim(moe_module_graph(m, 0), "T", &T))
		fail(ctx, "--ep shards the tokens of dim T, which %s does not declare", o->file);
	moe_module_free(m);
	return T;
}

/* Rows [first, first + n) of the input x (or one zero row when n = 0). */
static int bind_rows(moe_ctx *ctx, const moe_graph *g, const opts *o, int64_t T, int64_t first, int64_t n,
	moe_tensor_map *bind)
{
	moe_id in = MOE_NONE;
	int inputs = 0;
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++)
		if (moe_node_op(g, i) == MOE_OP_INPUT)
			in = i, inputs++;
	if (inputs != 1 || !o->input || strchr(o->input, ','))
		return fail(ctx, "--ep runs layers with one input, bound by --input x.npy%s", "");
	moe_tensor *x = moe_npy_read(ctx, o->input, moe_node_dtype(g, in));
	if (!x)
		return 1;
	const int64_t *s = moe_node_shape(g, in);
	if (x->rank != 2 || moe_node_rank(g, in) != 2 || x->shape[0] != T || x->shape[1] != s[1]) {
		moe_tensor_free(ctx, x);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->input), "--ep: the input must be [T, D] = [%lld, %lld]",
			(long long)T, (long long)s[1]);
		return 1;
	}
	moe_tensor *mine = moe_tensor_new(ctx, x->dtype, 2, s);
	if (mine && n)
		memcpy(mine->data, (char *)x->data + (size_t)first * (x->nbytes / (size_t)T), mine->nbytes);
	moe_tensor_free(ctx, x);
	if (!mine)
		return 1;
	moe_tensor_map_set(bind, moe_node_name(g, in), mine);
	return 0;
}

/* This rank's program; 0 when ready. */
static int build(moe_ctx *ctx, const opts *o, int64_t N, int rank, int64_t T, moe_module **mp)
{
	int64_t q = T / N, Td = rank < N - 1 ? q : T - q * (N - 1);
	moe_module *m = *mp = load_rows(ctx, o, Td ? Td : 1);
	if (!m)
		return 1;
	if (moe_module_num_graphs(m) != 1)
		return fail(ctx, "--ep runs a file with one layer%s", "");
	char pipe[1024], pl[512] = "";
	if (o->placement) {
		snprintf(pl, sizeof pl, ",placement=%s", o->placement);
		for (char *p = pl; *p; p++)
			if (*p == ',' && p != pl)
				*p = '.';
	}
	snprintf(pipe, sizeof pipe,
		"infer-shapes,canonicalize,lower-topk,expert-parallel{ep=%lld,rank=%d,tokens=%lld%s},blockwise-dispatch,"
		"grid-bound,canonicalize,cse,dce", (long long)N, rank, (long long)T, pl);
	moe_run_opts ro = {.verify = 1};
	return moe_run_pipeline_text(ctx, pipe, m, &ro) != MOE_OK;
}

/* This rank's program, weights and input; 0 when ready. */
static int prepare(moe_ctx *ctx, const opts *o, int64_t N, int rank, int64_t T, moe_module **mp, moe_tensor_map *bind)
{
	int64_t q = T / N, Td = rank < N - 1 ? q : T - q * (N - 1);
	if (build(ctx, o, N, rank, T, mp))
		return 1;
	moe_graph *g = moe_module_graph(*mp, 0);
	char *wcopy = strdup(o->weights);
	const char *paths[64];
	size_t np = 0;
	for (char *p = strtok(wcopy, ","); p && np < 64; p = strtok(NULL, ","))
		paths[np++] = p;
	int st = cli_load_weights(ctx, g, paths, np, o, bind) || bind_rows(ctx, g, o, T, q * rank, Td, bind);
	free(wcopy);
	return st;
}

/* Rank 0 writes the rows of every rank as one [T, D] output. */
static int gather_write(moe_ctx *ctx, const opts *o, int rank, int64_t N, int64_t T, const moe_tensor *y)
{
	int64_t q = T / N, Td = rank < N - 1 ? q : T - q * (N - 1);
	size_t row = y->rank == 2 && y->shape[0] ? y->nbytes / (size_t)y->shape[0] : 0;
	moe_tensor *all = NULL;
	if (rank == 0) {
		int64_t s[2] = {T, y->rank == 2 ? y->shape[1] : 0};
		all = moe_tensor_new(ctx, y->dtype, 2, s);
	}
	int st = cli_ep_net_agree(ctx, rank == 0 && !all);
	if (!st)
		st = cli_ep_net_gather(ctx, y->data, (size_t)Td * row, all ? all->data : NULL, all ? all->nbytes : 0);
	if (!st && rank == 0)
		st = moe_npy_write(ctx, o->out, all) != MOE_OK;
	moe_tensor_free(ctx, all);
	return st;
}

/* The stats of a multichip TCP run as JSON (malloc'ed). */
static char *tcp_stats_json(const moe_tcp_ep_stats *s, int64_t T)
{
	size_t cap = 4096 + (size_t)s->ep * 256 + (size_t)s->rounds * 512, at = 0;
	char *j = malloc(cap);
	if (!j)
		return NULL;
	at += (size_t)snprintf(j + at, cap - at, "{\n  \"target\": \"tcp\",\n  \"ep\": %d,\n  \"tokens\": %lld,\n"
		"  \"simulated_seconds\": %.9g,\n  \"compute_seconds\": %.9g,\n  \"link_seconds\": %.9g,\n"
		"  \"exchanges\": %d,\n  \"link_bytes_per_s\": %.9g,\n  \"link_latency_s\": %.9g,\n  \"chips\": [",
		s->ep, (long long)T, s->simulated_seconds, s->compute_seconds, s->link_seconds, s->exchanges,
		s->link_bytes_per_s, s->link_latency_s);
	for (int d = 0; d < s->ep; d++)
		at += (size_t)snprintf(j + at, cap - at, "%s\n    {\"chip\": %d, \"compute_seconds\": %.9g, "
			"\"link_seconds\": %.9g, \"link_bytes_out\": %lld, \"link_bytes_in\": %lld}", d ? "," : "", d,
			s->chip_seconds[d], s->chip_link_seconds[d], (long long)s->chip_link_bytes_out[d],
			(long long)s->chip_link_bytes_in[d]);
	at += (size_t)snprintf(j + at, cap - at, "\n  ],\n  \"rounds\": [");
	for (int k = 0; k < s->rounds; k++) {
		const moe_tcp_ep_round *r = &s->round[k];
		at += (size_t)snprintf(j + at, cap - at, "%s\n    {\"round\": %d, \"exchanges\": %d, \"chip\": %d, "
			"\"bytes_out\": %lld, \"bytes_in\": %lld, \"bound_seconds\": %.9g, \"seconds\": %.9g, "
			"\"pack_seconds\": %.9g, \"pack_span_seconds\": %.9g, \"link_seconds\": %.9g, \"unpack_seconds\": %.9g, "
			"\"unpack_sum_seconds\": %.9g, "
			"\"wait_seconds\": %.9g}", k ? "," : "", k, r->exchanges, r->chip, (long long)r->bytes_out,
			(long long)r->bytes_in, r->bound_seconds, r->seconds, r->pack_seconds, r->pack_span_seconds, r->link_seconds,
			r->unpack_seconds, r->unpack_sum_seconds, r->wait_seconds);
	}
	snprintf(j + at, cap - at, "\n  ]\n}\n");
	return j;
}

/* --target=tcp --ep N: N simulated chips in this process. */
static int run_tcp_chips(moe_ctx *ctx, const opts *o, int64_t N)
{
	if (N > MOE_TCP_EP_MAX)
		return fail(ctx, "--ep on TCP simulates at most 64 chips%s", "");
	int64_t T = global_tokens(ctx, o);
	moe_module *m[MOE_TCP_EP_MAX] = {0};
	moe_tensor_map *bind[MOE_TCP_EP_MAX] = {0};
	const moe_graph *g[MOE_TCP_EP_MAX];
	moe_tensor *outv[MOE_TCP_EP_MAX] = {0}, **out[MOE_TCP_EP_MAX];
	moe_tcp_machine *mach = o->machine ? moe_tcp_machine_load(ctx, o->machine) : NULL;
	int st = T < 1 || (o->machine && !mach);
	for (int d = 0; d < N && !st; d++) {
		bind[d] = moe_tensor_map_new(ctx);
		st = prepare(ctx, o, N, d, T, &m[d], bind[d]);
		if (!st) {
			g[d] = moe_module_graph(m[d], 0);
			out[d] = &outv[d];
			st = moe_graph_num_outputs(g[d]) != 1 && fail(ctx, "--ep runs layers with one output%s", "");
		}
	}
	moe_tcp_ep_stats s;
	moe_tcp_run_opts ro = {.machine = mach, .no_skip = o->no_skip != NULL, .timing_only = o->timing_only != NULL,
		.trace_path = o->trace};
	if (!st)
		st = moe_tcp_ep_run(ctx, (int)N, g, (const moe_tensor_map *const *)bind, &ro, out, &s) != MOE_OK;
	moe_tensor *y = NULL;
	if (!st) { /* the chips' rows, in chip order */
		int64_t q = T / N, sh[2] = {T, outv[0]->shape[1]};
		y = moe_tensor_new(ctx, outv[0]->dtype, 2, sh);
		size_t row = y ? y->nbytes / (size_t)T : 0, at = 0;
		for (int d = 0; y && d < N; d++) {
			size_t n = (size_t)(d < N - 1 ? q : T - q * (N - 1)) * row;
			memcpy((char *)y->data + at, outv[d]->data, n);
			at += n;
		}
		st = !y || (!o->timing_only && moe_npy_write(ctx, o->out, y) != MOE_OK);
	}
	if (!st && o->stats) {
		char *j = tcp_stats_json(&s, T);
		st = !j || moe_write_file_atomic(ctx, o->stats, j, strlen(j)) != MOE_OK;
		free(j);
	}
	moe_tensor_free(ctx, y);
	for (int d = 0; d < N; d++) {
		moe_tensor_free(ctx, outv[d]);
		moe_tensor_map_free(bind[d]);
		moe_module_free(m[d]);
	}
	if (mach)
		moe_tcp_machine_free(ctx, mach);
	return st;
}

int cli_run_ep(moe_ctx *ctx, const opts *o)
{
	int64_t N = ep_count(ctx, o);
	if (!N)
		return 1;
	if (o->target && !strcmp(o->target, "tcp"))
		return run_tcp_chips(ctx, o, N);
	int rank = 0, size = 1;
	if (cli_ep_net_init(ctx, &rank, &size))
		return 1;
	int status = 1;
	moe_module *m = NULL;
	moe_tensor_map *bind = moe_tensor_map_new(ctx);
	moe_tensor *out[16] = {0};
	if (size != N) {
		/* every rank sees the same mismatch: all stop, none waits */
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "rank %d: --ep %lld but %d MPI rank%s running (start "
			"it as mpirun -n %lld moec run --ep %lld ...)", rank, (long long)N, size, size == 1 ? " is" : "s are",
			(long long)N, (long long)N);
		cli_ep_net_agree(ctx, 1); /* prints it before every rank stops */
		goto done;
	}
	int64_t T = global_tokens(ctx, o);
	int bad = T < 1 || prepare(ctx, o, N, rank, T, &m, bind);
	if (!bad && moe_graph_num_outputs(moe_module_graph(m, 0)) != 1)
		bad = fail(ctx, "--ep runs layers with one output%s", "");
	if (cli_ep_net_agree(ctx, bad))
		goto done;
	moe_exchange x = {(int)N, rank, cli_ep_all_to_all, NULL};
	if (o->engine && strcmp(o->engine, "interp")) { /* compiled, phase by phase */
		moe_host_opts ho;
		moe_host_opts_init(&ho);
		ho.engine = !strcmp(o->engine, "c") ? MOE_HOST_C : MOE_HOST_LLVM;
		ho.threads = o->threads ? atoi(o->threads) : 0;
		ho.portable = o->kernels && !strcmp(o->kernels, "portable");
		ho.no_cache = o->no_cache != NULL;
		bad = ho.threads < 0 || cli_ep_host_run(ctx, moe_module_graph(m, 0), bind, &ho, &x, out);
	} else {
		bad = moe_interp_run_ex(ctx, moe_module_graph(m, 0), bind, &x, out) != MOE_OK;
	}
	if (cli_ep_net_agree(ctx, bad))
		goto done;
	status = gather_write(ctx, o, rank, N, T, out[0]);
done:
	if (status && moe_error_count(ctx))
		fprintf(stderr, "moec: rank %d of %d failed\n", rank, size);
	for (int i = 0; i < 16; i++)
		moe_tensor_free(ctx, out[i]);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	cli_ep_net_finish();
	return status;
}

/* moec compile --ep N: every chip's phase programs (moe_tcp_ep_compile) and
 * OUT.ep.json, written last, naming them (docs/expert-parallel.md section 6). */
typedef struct ep_out {
	moe_ctx *ctx;
	const char *ext;
	char stem[4096];
	char *json;
	size_t len, cap;
	bool nomem;
} ep_out;

static void jadd(ep_out *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || w->len + (size_t)n + 1 > w->cap) {
		size_t cap = (w->cap + (size_t)(n > 0 ? n : 0) + 1) * 2;
		char *j = realloc(w->json, cap);
		if (!j) {
			w->nomem = true;
			return;
		}
		w->json = j, w->cap = cap;
	}
	va_start(ap, fmt);
	w->len += (size_t)vsnprintf(w->json + w->len, w->cap - w->len, fmt, ap);
	va_end(ap);
}

static moe_status write_phase(void *ud, int chip, int phase, const moe_tcp_program *p, const moe_id *outputs,
	uint32_t n)
{
	ep_out *w = ud;
	if (!p)
		return MOE_OK;
	char path[4200];
	snprintf(path, sizeof path, "%s.chip%d.phase%d%s", w->stem, chip, phase, w->ext);
	moe_status st = !strcmp(w->ext, ".tcps") ? moe_tcp_write_asm(w->ctx, p, path) : moe_tcp_write_binary(w->ctx, p, path);
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	jadd(w, "%s\n    {\"chip\": %d, \"phase\": %d, \"file\": \"%s\", \"outputs\": [",
		w->json[w->len - 1] == '[' ? "" : ",", chip, phase, base);
	for (uint32_t j = 0; j < n; j++)
		jadd(w, "%s%u", j ? ", " : "", (unsigned)outputs[j]);
	jadd(w, "]}");
	return st;
}

/* The exchanges of chip d's program g, for the manifest. */
static void list_exchanges(ep_out *w, const moe_graph *g, int d)
{
	jadd(w, "%s\n    {\"chip\": %d, \"all_to_all\": [", d ? "," : "", d);
	for (moe_id i = 0, k = 0; i < moe_graph_num_nodes(g); i++) {
		if (moe_node_op(g, i) != MOE_OP_ALL_TO_ALL)
			continue;
		const char *nm = moe_node_name(g, i);
		jadd(w, "%s{\"node\": %u, \"rows\": %u, \"counts\": %u, \"name\": \"%s\"}", k++ ? ", " : "", (unsigned)i,
			(unsigned)moe_node_arg(g, i, 0), (unsigned)moe_node_arg(g, i, 1), nm ? nm : "");
	}
	jadd(w, "]}");
}

int cli_compile_ep(moe_ctx *ctx, const opts *o)
{
	int64_t N = ep_count(ctx, o);
	if (!N)
		return 1;
	if (N > MOE_TCP_EP_MAX)
		return fail(ctx, "--ep on TCP compiles at most 64 chips%s", "");
	bool asm_ = cli_ends_with(o->out, ".tcps");
	if ((!asm_ && !cli_ends_with(o->out, ".tcpb")) || strlen(o->out) >= 4000)
		return fail(ctx, "compile --ep writes TCP programs: name -o OUT.tcpb or OUT.tcps (a file, not %s)", o->out);
	ep_out w = {.ctx = ctx, .ext = asm_ ? ".tcps" : ".tcpb"};
	snprintf(w.stem, sizeof w.stem, "%.*s", (int)(strlen(o->out) - 5), o->out);
	int64_t T = global_tokens(ctx, o);
	moe_module *m[MOE_TCP_EP_MAX] = {0};
	const moe_graph *g[MOE_TCP_EP_MAX];
	moe_tcp_machine *mach = o->machine ? moe_tcp_machine_load(ctx, o->machine) : NULL;
	int st = T < 1 || (o->machine && !mach);
	for (int d = 0; d < N && !st; d++) {
		st = build(ctx, o, N, d, T, &m[d]);
		if (!st)
			g[d] = moe_module_graph(m[d], 0);
	}
	jadd(&w, "{\n  \"ep\": %lld,\n  \"tokens\": %lld,\n  \"programs\": [", (long long)N, (long long)T);
	if (!st)
		st = moe_tcp_ep_compile(ctx, (int)N, g, mach, write_phase, &w) != MOE_OK;
	jadd(&w, "\n  ],\n  \"exchanges\": [");
	for (int d = 0; d < N && !st; d++)
		list_exchanges(&w, g[d], d);
	jadd(&w, "\n  ]\n}\n");
	if (!st && w.nomem)
		st = fail(ctx, "out of memory for the manifest%s", "");
	if (!st) {
		char path[4200];
		snprintf(path, sizeof path, "%s.ep.json", w.stem);
		st = moe_write_file_atomic(ctx, path, w.json, w.len) != MOE_OK;
	}
	free(w.json);
	for (int d = 0; d < N; d++)
		moe_module_free(m[d]);
	if (mach)
		moe_tcp_machine_free(ctx, mach);
	return st;
}
