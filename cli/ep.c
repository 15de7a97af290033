/* cli/ep.c: `moec run --ep N`, one device of an expert-parallel
 * layer per MPI rank (docs/expert-parallel.md).
 *
 * Rank r builds the layer for its shard of the T tokens (--set T=T_r, one
 * dummy row when it has none), runs the pipeline with
 * expert-parallel{ep=N,rank=r,tokens=T}, loads only its experts' weights,
 * binds its rows of the input and runs its program on the engine of a plain
 * run (LLVM unless --engine says otherwise), the all_to_all nodes going
 * through MPI (ep_mpi.c). Rank 0 gathers the rows of the output in rank order
 * and writes -o, and with --stats every rank's figures, as one output set. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "moec/tcp.h"

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
	bool jit_engine = !tcp && (!o->engine || strcmp(o->engine, "interp"));
	const char *jit = o->stats ? "--stats" : o->threads ? "--threads" : o->kernels ? "--kernels"
			: o->no_cache ? "--no-cache" : o->cold ? "--cold" : NULL;
	if (o->repeat && !tcp)
		return fail(ctx, "%s does not apply to --ep on the host", "--repeat"), 0;
	if (jit && !tcp && !jit_engine)
		return fail(ctx, "%s applies to --ep with --engine=llvm or c, not the interpreter", jit), 0;
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
	free(c);
	if (cli_quant_act(ctx, o, m)) { /* --quant-act, as cli_load_tcp sets it on one chip */
		moe_module_free(m);
		return NULL;
	}
	return m;
}

/* The layer after the user's --set (NULL after an error) and its T. */
static moe_module *load_global(moe_ctx *ctx, const opts *o, int64_t *T)
{
	moe_module *m = cli_load(ctx, o);
	*T = -1;
	if (m && moe_module_num_graphs(m) != 1)
		fail(ctx, "--ep runs a file with one layer%s", "");
	else if (m && !moe_graph_get_dim(moe_module_graph(m, 0), "T", T))
		fail(ctx, "--ep shards the tokens of dim T, which %s does not declare", o->file);
	if (*T < 1) {
		moe_module_free(m);
		return NULL;
	}
	return m;
}

static int64_t global_tokens(moe_ctx *ctx, const opts *o)
{
	int64_t T;
	moe_module_free(load_global(ctx, o, &T));
	return T;
}

/* The rows the devices share: --tokens N (0..T), else the layer's T; -1
 * after an error. One process with --tokens N computes its first N rows as
 * if the others were absent, so the devices shard those N rows. */
static int64_t shared_rows(moe_ctx *ctx, const opts *o, int64_t T)
{
	int64_t n = cli_tokens(ctx, o);
	if (n == -2 || T < 1)
		return -1;
	if (n > T) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "--tokens %lld exceeds the layer's T = %lld",
			(long long)n, (long long)T);
		return -1;
	}
	return n < 0 ? T : n;
}

/* The pipeline of rank `rank` (-1: the text every rank shares, for the
 * ranks' check) over G rows; sched: for TCP chips compiled by the schedule
 * compiler, which reads the local experts as a block_loop (loop=1), the
 * combine's chunks bounded by the chip's DM (tcp-combine-chunk, on the
 * machine cli_pass_machine set). */
static void ep_pipeline(const opts *o, int64_t N, int rank, int64_t G, bool sched, char *pipe, size_t cap)
{
	char pl[512] = "", rk[16] = "*";
	if (o->placement && rank >= 0) { /* the ranks compare placements as a field of their own */
		snprintf(pl, sizeof pl, ",placement=%s", o->placement);
		for (char *p = pl; *p; p++)
			if (*p == ',' && p != pl)
				*p = '.';
	}
	if (rank >= 0)
		snprintf(rk, sizeof rk, "%d", rank);
	snprintf(pipe, cap,
		"infer-shapes,canonicalize,lower-topk,expert-parallel{ep=%lld,rank=%s,tokens=%lld%s%s},%sblockwise-dispatch,"
		"grid-bound,canonicalize,cse,dce", (long long)N, rk, (long long)G, pl, sched ? ",loop=1" : "",
		sched ? "tcp-combine-chunk," : "");
}

/* Rows [first, first + n) of the input x (or one zero row when n = 0); x
 * has the layer's T rows or the G rows shared (--tokens). */
static int bind_rows(moe_ctx *ctx, const moe_graph *g, const opts *o, int64_t T, int64_t G, int64_t first, int64_t n,
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
	if (x->rank != 2 || moe_node_rank(g, in) != 2 || (x->shape[0] != T && x->shape[0] != G) || x->shape[0] < 1 ||
		x->shape[1] != s[1]) {
		moe_tensor_free(ctx, x);
		char alt[64] = "";
		if (G != T)
			snprintf(alt, sizeof alt, " or [--tokens, D] = [%lld, %lld]", (long long)G, (long long)s[1]);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->input), "--ep: the input must be [T, D] = [%lld, %lld]%s",
			(long long)T, (long long)s[1], alt);
		return 1;
	}
	moe_tensor *mine = moe_tensor_new(ctx, x->dtype, 2, s);
	if (mine && n)
		memcpy(mine->data, (char *)x->data + (size_t)first * (x->nbytes / (size_t)x->shape[0]), mine->nbytes);
	moe_tensor_free(ctx, x);
	if (!mine)
		return 1;
	moe_tensor_map_set(bind, moe_node_name(g, in), mine);
	return 0;
}

/* This rank's program (sched: ep_pipeline's); 0 when ready. */
static int build(moe_ctx *ctx, const opts *o, int64_t N, int rank, int64_t T, bool sched, moe_module **mp)
{
	int64_t q = T / N, Td = rank < N - 1 ? q : T - q * (N - 1);
	moe_module *m = *mp = load_rows(ctx, o, Td ? Td : 1);
	if (!m)
		return 1;
	if (moe_module_num_graphs(m) != 1)
		return fail(ctx, "--ep runs a file with one layer%s", "");
	char pipe[1024];
	ep_pipeline(o, N, rank, T, sched, pipe, sizeof pipe);
	if (sched && cli_pass_machine(ctx, o))
		return 1;
	moe_run_opts ro = {.verify = 1};
	return moe_run_pipeline_text(ctx, pipe, m, &ro) != MOE_OK;
}

/* This rank's program, weights and input over the T rows shared (Tl: the layer's); 0 when ready. */
static int prepare(moe_ctx *ctx, const opts *o, int64_t N, int rank, int64_t T, int64_t Tl, bool sched,
	moe_module **mp, moe_tensor_map *bind)
{
	int64_t q = T / N, Td = rank < N - 1 ? q : T - q * (N - 1);
	if (build(ctx, o, N, rank, T, sched, mp))
		return 1;
	moe_graph *g = moe_module_graph(*mp, 0);
	char *wcopy = strdup(o->weights);
	const char *paths[64];
	size_t np = 0;
	for (char *p = strtok(wcopy, ","); p && np < 64; p = strtok(NULL, ","))
		paths[np++] = p;
	int st = cli_load_weights(ctx, g, paths, np, o, bind, NULL) || bind_rows(ctx, g, o, Tl, T, q * rank, Td, bind);
	free(wcopy);
	return st;
}

/* Rank 0 writes the rows of every rank as one [T, D] output. */
static int gather_write(moe_ctx *ctx, const char *out, int rank, int64_t N, int64_t T, const moe_tensor *y)
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
		st = moe_npy_write(ctx, out, all) != MOE_OK;
	moe_tensor_free(ctx, all);
	return st;
}

/* One rank's figures for run --ep --stats on the host. */
typedef struct rank_stats {
	double wall, compute, compile, setup, pack;
	int64_t blocks_executed, blocks_skipped, rows_executed, workspace, threads, cache;
} rank_stats;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every rank's figures gathered at rank 0, which writes them to path. */
static int gather_stats(moe_ctx *ctx, const char *path, const char *engine, int rank, int64_t N, int64_t T,
	const rank_stats *mine)
{
	rank_stats *all = rank == 0 ? calloc((size_t)N, sizeof *all) : NULL;
	int st = cli_ep_net_agree(ctx, rank == 0 && !all);
	if (!st)
		st = cli_ep_net_gather(ctx, mine, sizeof *mine, all, all ? (size_t)N * sizeof *all : 0);
	if (st || rank != 0) {
		free(all);
		return st;
	}
	static const char *const cache_names[] = {"off", "miss", "hit", "bad"};
	double wall = 0, compute = 0;
	for (int64_t r = 0; r < N; r++) {
		wall = all[r].wall > wall ? all[r].wall : wall;
		compute = all[r].compute > compute ? all[r].compute : compute;
	}
	size_t cap = 1024 + (size_t)N * 512, at = 0;
	char *j = malloc(cap);
	if (!j) {
		free(all);
		return fail(ctx, "out of memory%s", "");
	}
	at += (size_t)snprintf(j + at, cap - at, "{\n  \"target\": \"host\",\n  \"engine\": \"%s\",\n  \"ep\": %lld,\n"
		"  \"tokens\": %lld,\n  \"wall_seconds\": %.9g,\n  \"compute_seconds\": %.9g,\n  \"ranks\": [", engine,
		(long long)N, (long long)T, wall, compute);
	for (int64_t r = 0; r < N; r++) {
		const rank_stats *s = &all[r];
		at += (size_t)snprintf(j + at, cap - at, "%s\n    {\"rank\": %lld, \"wall_seconds\": %.9g, "
			"\"compute_seconds\": %.9g, \"compile_seconds\": %.9g, \"setup_seconds\": %.9g, \"pack_seconds\": %.9g, "
			"\"workspace_bytes\": %lld, \"blocks_executed\": %lld, \"blocks_skipped\": %lld, \"rows_executed\": %lld, "
			"\"threads\": %lld, \"cache\": \"%s\"}", r ? "," : "", (long long)r, s->wall, s->compute, s->compile,
			s->setup, s->pack, (long long)s->workspace, (long long)s->blocks_executed, (long long)s->blocks_skipped,
			(long long)s->rows_executed, (long long)s->threads,
			s->cache >= 0 && s->cache < 4 ? cache_names[s->cache] : "off");
	}
	snprintf(j + at, cap - at, "\n  ]\n}\n");
	st = moe_write_file_atomic(ctx, path, j, strlen(j)) != MOE_OK;
	free(j);
	free(all);
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

/* --tokens 0: the output of no rows, nothing computed. */
static int write_empty(moe_ctx *ctx, const opts *o, const moe_module *gm)
{
	const moe_graph *g = moe_module_graph(gm, 0);
	if (moe_graph_num_outputs(g) != 1)
		return fail(ctx, "--ep runs layers with one output%s", "");
	moe_id y = moe_graph_output(g, 0);
	int64_t s[2] = {0, moe_node_rank(g, y) == 2 ? moe_node_shape(g, y)[1] : 0};
	moe_tensor *t = moe_tensor_new(ctx, moe_node_dtype(g, y), 2, s);
	int st = !t || (o->out && moe_npy_write(ctx, o->out, t) != MOE_OK);
	moe_tensor_free(ctx, t);
	return st;
}

/* --target=tcp --ep N: N simulated chips in this process. */
static int run_tcp_chips(moe_ctx *ctx, const opts *o, int64_t N)
{
	if (N > MOE_TCP_EP_MAX)
		return fail(ctx, "--ep on TCP simulates at most 64 chips%s", "");
	int64_t Tl;
	moe_module *gm = load_global(ctx, o, &Tl);
	int64_t T = gm ? shared_rows(ctx, o, Tl) : -1;
	if (T == 0) {
		int e = o->stats || o->trace ? fail(ctx, "--tokens 0 computes nothing: drop --stats and --trace%s", "") :
					      write_empty(ctx, o, gm);
		moe_module_free(gm);
		return e;
	}
	moe_module_free(gm);
	moe_module *m[MOE_TCP_EP_MAX] = {0};
	moe_tensor_map *bind[MOE_TCP_EP_MAX] = {0};
	const moe_graph *g[MOE_TCP_EP_MAX];
	moe_tensor *outv[MOE_TCP_EP_MAX] = {0}, **out[MOE_TCP_EP_MAX];
	moe_tcp_machine *mach = o->machine ? moe_tcp_machine_load(ctx, o->machine) : NULL;
	int st = T < 1 || (o->machine && !mach);
	for (int d = 0; d < N && !st; d++) {
		bind[d] = moe_tensor_map_new(ctx);
		st = prepare(ctx, o, N, d, T, Tl, true, &m[d], bind[d]);
		if (!st) {
			g[d] = moe_module_graph(m[d], 0);
			out[d] = &outv[d];
			st = moe_graph_num_outputs(g[d]) != 1 && fail(ctx, "--ep runs layers with one output%s", "");
		}
	}
	moe_tcp_ep_stats s;
	moe_tcp_run_opts ro = {.machine = mach, .no_skip = o->no_skip != NULL, .timing_only = o->timing_only != NULL,
		.trace_path = o->trace, .sched_opts = o->sched_opts, .order_tensor = o->sim_order && !strcmp(o->sim_order, "tensor")};
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

/* The first collective: every rank's digest of what it runs (ep_digest.c)
 * against rank 0's. A rank that differs stops every rank with one message,
 * printed by rank 0, naming that rank and the fields; nonzero then (*quiet:
 * nothing more to print). *T: the rows shared, *Tl: the layer's T. */
static int agree_first(moe_ctx *ctx, const opts *o, int64_t N, int rank, int64_t *T, int64_t *Tl, int *quiet)
{
	moe_module *gm = load_global(ctx, o, Tl);
	*T = gm ? shared_rows(ctx, o, *Tl) : -1;
	uint64_t dg[CLI_EP_DIGESTS] = {0};
	char pipe[1024];
	int bad = *T < 0;
	if (!bad) {
		ep_pipeline(o, N, -1, *T, false, pipe, sizeof pipe);
		bad = cli_ep_digest(ctx, o, gm, N, pipe, *T, dg);
	}
	moe_module_free(gm);
	int who = -1;
	unsigned mask = 0;
	int c = cli_ep_net_compare(ctx, bad, dg, CLI_EP_DIGESTS, &who, &mask);
	if (c <= 0)
		return c < 0;
	/* the fields a more specific one explains are left out */
	if (mask & (1u << CLI_EP_DIMS | 1u << CLI_EP_DTYPE))
		mask &= ~(1u << CLI_EP_LAYER);
	if (mask & (1u << CLI_EP_PLACEMENT | 1u << CLI_EP_TOKENS))
		mask &= ~(1u << CLI_EP_PIPELINE);
	if (rank == 0) {
		char fields[256] = "";
		for (int f = 0; f < CLI_EP_DIGESTS; f++)
			if (mask & (1u << f))
				snprintf(fields + strlen(fields), sizeof fields - strlen(fields), "%s%s", *fields ? ", " : "",
					cli_ep_digest_names[f]);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "--ep: rank %d differs from rank 0 in: %s (every rank "
			"must run the same layer, --set, options, checkpoint and input; nothing was computed)", who, fields);
	}
	cli_ep_net_stop(ctx);
	*quiet = 1;
	return 1;
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
	int status = 1, quiet = 0;
	int64_t T = -1, Tl = -1;
	moe_module *m = NULL;
	moe_tensor_map *bind = moe_tensor_map_new(ctx);
	moe_tensor *out[16] = {0};
	if (size != N) {
		/* every rank sees the same mismatch: all stop, none waits */
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "rank %d: --ep %lld but %d MPI rank%s running (start "
			"it as mpirun -n %lld moec run --ep %lld ...)", rank, (long long)N, size, size == 1 ? " is" : "s are",
			(long long)N, (long long)N);
		/* the first collective of every path, so that a rank given another
		 * --ep meets the others' check; prints it before every rank stops */
		uint64_t none[CLI_EP_DIGESTS] = {0};
		int who;
		unsigned mask;
		cli_ep_net_compare(ctx, 1, none, CLI_EP_DIGESTS, &who, &mask);
		goto done;
	}
	if (agree_first(ctx, o, N, rank, &T, &Tl, &quiet))
		goto done;
	if (T == 0) { /* --tokens 0 */
		moe_module *gm = rank == 0 ? load_global(ctx, o, &Tl) : NULL;
		status = rank == 0 && (!gm || write_empty(ctx, o, gm));
		moe_module_free(gm);
		goto done;
	}
	int bad = prepare(ctx, o, N, rank, T, Tl, false, &m, bind);
	if (!bad && moe_graph_num_outputs(moe_module_graph(m, 0)) != 1)
		bad = fail(ctx, "--ep runs layers with one output%s", "");
	if (cli_ep_net_agree(ctx, bad))
		goto done;
	moe_exchange x = {(int)N, rank, cli_ep_all_to_all, NULL};
	const char *engine = o->engine ? o->engine : "llvm";
	rank_stats rs = {0};
	double t0 = now_s();
	if (strcmp(engine, "interp")) { /* compiled, phase by phase */
		moe_host_opts ho;
		moe_host_opts_init(&ho);
		ho.engine = !strcmp(engine, "c") ? MOE_HOST_C : MOE_HOST_LLVM;
		ho.threads = o->threads ? atoi(o->threads) : 0;
		ho.portable = o->kernels && !strcmp(o->kernels, "portable");
		ho.no_cache = o->no_cache != NULL;
		moe_host_stats hs;
		memset(&hs, 0, sizeof hs);
		bad = ho.threads < 0 || cli_ep_host_run(ctx, moe_module_graph(m, 0), bind, &ho, &x, out, &hs);
		rs = (rank_stats){0, hs.compute_seconds, hs.compile_seconds, hs.setup_seconds, hs.pack_seconds,
			hs.blocks_executed, hs.blocks_skipped, hs.rows_executed, (int64_t)hs.workspace_bytes, hs.threads, hs.cache};
	} else {
		bad = moe_interp_run_ex(ctx, moe_module_graph(m, 0), bind, &x, out) != MOE_OK;
	}
	rs.wall = now_s() - t0;
	if (cli_ep_net_agree(ctx, bad))
		goto done;
	/* rank 0's outputs are one set: -o and --stats renamed into place together */
	moe_output_set *set = rank == 0 ? moe_output_set_new(ctx) : NULL;
	const char *yo = set ? moe_output_set_add(set, o->out) : NULL, *so = set && o->stats ? moe_output_set_add(set, o->stats) : NULL;
	bad = rank == 0 && (!yo || (o->stats && !so));
	if (cli_ep_net_agree(ctx, bad)) {
		moe_output_set_abort(set);
		goto done;
	}
	status = gather_write(ctx, yo, rank, N, T, out[0]);
	if (!status && o->stats)
		status = gather_stats(ctx, so, engine, rank, N, T, &rs);
	if (set)
		status = status ? (moe_output_set_abort(set), 1) : (moe_output_set_commit(set) != MOE_OK);
done:
	if (status && !quiet && moe_error_count(ctx))
		fprintf(stderr, "moec: rank %d of %d failed\n", rank, size);
	for (int i = 0; i < 16; i++)
		moe_tensor_free(ctx, out[i]);
	moe_tensor_map_free(bind);
	moe_module_free(m);
	cli_ep_net_finish();
	return status;
}

/* moec compile --ep N: every chip's phase programs (moe_tcp_ep_compile) and
 * OUT.ep.json naming them (docs/expert-parallel.md section 6), one output
 * set: each file goes to a temporary as it is compiled, and only when every
 * one was written are they renamed into place, the manifest last. An old
 * manifest at OUT.ep.json is removed before the renames (a crash in between
 * leaves no manifest, never one naming a mix), and the files it named that
 * the new set does not have are removed before the new manifest goes in. */
#define EP_PHASES (MOE_TCP_EP_MAX_ROUNDS + 1)
typedef struct ep_out {
	moe_ctx *ctx;
	const char *ext;
	char stem[4096];
	const char *base; /* the stem's base name, in stem */
	moe_output_set *set;
	cJSON *programs;
	bool written[MOE_TCP_EP_MAX][EP_PHASES];
} ep_out;

static moe_status write_phase(void *ud, int chip, int phase, const moe_tcp_program *p, const moe_id *outputs,
	uint32_t n)
{
	ep_out *w = ud;
	if (!p)
		return MOE_OK;
	if (chip >= MOE_TCP_EP_MAX || phase >= EP_PHASES) {
		moe_diag(w->ctx, MOE_DIAG_ERROR, moe_loc_file(w->ctx, "moec"), "compile --ep: chip %d phase %d is past the "
			"names the inputs were checked against", chip, phase);
		return MOE_ERR_INVALID;
	}
	char path[4200];
	snprintf(path, sizeof path, "%s.chip%d.phase%d%s", w->stem, chip, phase, w->ext);
	const char *tmp = moe_output_set_add(w->set, path);
	if (!tmp)
		return MOE_ERR_IO;
	moe_status st = !strcmp(w->ext, ".tcps") ? moe_tcp_write_asm(w->ctx, p, tmp) : moe_tcp_write_binary(w->ctx, p, tmp);
	w->written[chip][phase] = st == MOE_OK;
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	cJSON *e = cJSON_CreateObject(), *outs = cJSON_CreateArray();
	cJSON_AddItemToArray(w->programs, e);
	cJSON_AddNumberToObject(e, "chip", chip);
	cJSON_AddNumberToObject(e, "phase", phase);
	cJSON_AddStringToObject(e, "file", base);
	cJSON_AddItemToObject(e, "outputs", outs);
	for (uint32_t j = 0; j < n; j++)
		cJSON_AddItemToArray(outs, cJSON_CreateNumber((double)outputs[j]));
	return st;
}

/* The exchanges of chip d's program g, for the manifest. */
static void list_exchanges(cJSON *arr, const moe_graph *g, int d)
{
	cJSON *e = cJSON_CreateObject(), *x = cJSON_CreateArray();
	cJSON_AddItemToArray(arr, e);
	cJSON_AddNumberToObject(e, "chip", d);
	cJSON_AddItemToObject(e, "all_to_all", x);
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++) {
		if (moe_node_op(g, i) != MOE_OP_ALL_TO_ALL)
			continue;
		const char *nm = moe_node_name(g, i);
		cJSON *a = cJSON_CreateObject();
		cJSON_AddItemToArray(x, a);
		cJSON_AddNumberToObject(a, "node", i);
		cJSON_AddNumberToObject(a, "rows", moe_node_arg(g, i, 0));
		cJSON_AddNumberToObject(a, "counts", moe_node_arg(g, i, 1));
		cJSON_AddStringToObject(a, "name", nm ? nm : "");
	}
}

/* Every name compile --ep may write or remove (each chip and phase, both
 * extensions, the manifest) is checked against the inputs before anything
 * is read. */
static int guard_set(moe_ctx *ctx, const opts *o, const ep_out *w)
{
	enum { MAXN = MOE_TCP_EP_MAX * EP_PHASES * 2 + 1 };
	char(*names)[4200] = malloc(sizeof(*names) * MAXN);
	const char **v = malloc(sizeof *v * MAXN);
	int st = !names || !v;
	size_t n = 0;
	for (int d = 0; !st && d < MOE_TCP_EP_MAX; d++)
		for (int k = 0; k < EP_PHASES; k++)
			for (int e = 0; e < 2; e++) {
				snprintf(names[n], sizeof names[n], "%s.chip%d.phase%d%s", w->stem, d, k, e ? ".tcps" : ".tcpb");
				v[n] = names[n], n++;
			}
	if (!st) {
		snprintf(names[n], sizeof names[n], "%s.ep.json", w->stem);
		v[n] = names[n], n++;
		st = cli_guard_derived(ctx, o, v, n);
	} else {
		fail(ctx, "out of memory%s", "");
	}
	free(names);
	free(v);
	return st;
}

/* The files an old manifest at path names that are this stem's programs
 * (STEM.chip<d>.phase<k>.tcpb|.tcps, nothing else): stale[d][k] bit 1 for
 * .tcpb, 2 for .tcps. An unreadable or foreign manifest names none. */
static void old_programs(const ep_out *w, const char *path, unsigned char stale[][EP_PHASES])
{
	moe_ctx *quiet = moe_ctx_new(NULL, NULL); /* its errors are not this command's */
	char *text = NULL;
	size_t len = 0;
	if (!quiet || moe_read_file_max(quiet, path, (size_t)16 << 20, &text, &len) != MOE_OK) {
		moe_ctx_free(quiet);
		return;
	}
	cJSON *j = cJSON_ParseWithLength(text, len);
	const cJSON *progs = cJSON_GetObjectItemCaseSensitive(j, "programs"), *e;
	size_t bl = strlen(w->base);
	cJSON_ArrayForEach(e, progs) {
		const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "file");
		const char *s = cJSON_IsString(f) ? f->valuestring : NULL;
		int d, k, end = 0;
		char ext[6] = "";
		if (!s || strncmp(s, w->base, bl) || sscanf(s + bl, ".chip%3d.phase%1d.%4[a-z]%n", &d, &k, ext, &end) != 3 ||
			s[bl + (size_t)end] || d < 0 || d >= MOE_TCP_EP_MAX || k < 0 || k >= EP_PHASES)
			continue;
		char canon[64];
		snprintf(canon, sizeof canon, ".chip%d.phase%d.%s", d, k, ext);
		if (strcmp(canon, s + bl)) /* no leading zeros or signs: the name moec writes */
			continue;
		if (!strcmp(ext, "tcpb"))
			stale[d][k] |= 1;
		else if (!strcmp(ext, "tcps"))
			stale[d][k] |= 2;
	}
	cJSON_Delete(j);
	moe_free(quiet, text);
	moe_ctx_free(quiet);
}

/* Commits the set: the old manifest goes first, then the programs are
 * renamed into place, the old manifest's programs that the new set lacks
 * removed, and the new manifest renamed in last (mset). */
static int commit_set(moe_ctx *ctx, ep_out *w, const char *manifest, moe_output_set *mset)
{
	static unsigned char stale[MOE_TCP_EP_MAX][EP_PHASES];
	memset(stale, 0, sizeof stale);
	struct stat st;
	bool old = lstat(manifest, &st) == 0 && S_ISREG(st.st_mode);
	if (old)
		old_programs(w, manifest, stale);
	if (old && unlink(manifest) != 0) {
		moe_output_set_abort(w->set);
		moe_output_set_abort(mset);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, manifest), "cannot remove the old manifest: %s", strerror(errno));
		return 1;
	}
	if (moe_output_set_commit(w->set) != MOE_OK) {
		moe_output_set_abort(mset);
		return 1;
	}
	bool tcps = !strcmp(w->ext, ".tcps");
	for (int d = 0; d < MOE_TCP_EP_MAX; d++)
		for (int k = 0; k < EP_PHASES; k++)
			for (int e = 0; e < 2; e++) {
				if (!(stale[d][k] & (1u << e)) || (w->written[d][k] && e == tcps))
					continue;
				char path[4200];
				snprintf(path, sizeof path, "%s.chip%d.phase%d%s", w->stem, d, k, e ? ".tcps" : ".tcpb");
				if (unlink(path) != 0 && errno != ENOENT)
					moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_file(ctx, path),
						"the old manifest named this file, which the new set does not have; cannot remove it: %s",
						strerror(errno));
			}
	return moe_output_set_commit(mset) != MOE_OK;
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
	static ep_out w; /* large; one compile at a time */
	memset(&w, 0, sizeof w);
	w.ctx = ctx;
	w.ext = asm_ ? ".tcps" : ".tcpb";
	snprintf(w.stem, sizeof w.stem, "%.*s", (int)(strlen(o->out) - 5), o->out);
	w.base = strrchr(w.stem, '/') ? strrchr(w.stem, '/') + 1 : w.stem;
	char manifest[4200];
	snprintf(manifest, sizeof manifest, "%s.ep.json", w.stem);
	if (guard_set(ctx, o, &w))
		return 1;
	int64_t T = global_tokens(ctx, o);
	moe_module *m[MOE_TCP_EP_MAX] = {0};
	const moe_graph *g[MOE_TCP_EP_MAX];
	moe_tcp_machine *mach = o->machine ? moe_tcp_machine_load(ctx, o->machine) : NULL;
	int st = T < 1 || (o->machine && !mach);
	for (int d = 0; d < N && !st; d++) {
		st = build(ctx, o, N, d, T, true, &m[d]);
		if (!st)
			g[d] = moe_module_graph(m[d], 0);
	}
	moe_tcp_run_opts ro = {.machine = mach, .sched_opts = o->sched_opts};
	cJSON *man = cJSON_CreateObject(), *ex = cJSON_CreateArray();
	w.programs = cJSON_CreateArray();
	cJSON_AddNumberToObject(man, "ep", (double)N);
	cJSON_AddNumberToObject(man, "tokens", (double)T);
	cJSON_AddItemToObject(man, "programs", w.programs);
	cJSON_AddItemToObject(man, "exchanges", ex);
	w.set = st ? NULL : moe_output_set_new(ctx);
	if (!st)
		st = !w.set || moe_tcp_ep_compile_ex(ctx, (int)N, g, &ro, write_phase, &w) != MOE_OK;
	for (int d = 0; d < N && !st; d++)
		list_exchanges(ex, g[d], d);
	char *text = st ? NULL : cJSON_Print(man);
	if (!st && !text)
		st = fail(ctx, "out of memory for the manifest%s", "");
	moe_output_set *mset = st ? NULL : moe_output_set_new(ctx);
	const char *tmp = mset ? moe_output_set_add(mset, manifest) : NULL;
	if (!st && (!tmp || moe_write_file_atomic(ctx, tmp, text, strlen(text)) != MOE_OK))
		st = 1;
	if (!st) {
		st = commit_set(ctx, &w, manifest, mset);
	} else {
		moe_output_set_abort(w.set);
		moe_output_set_abort(mset);
	}
	cJSON_free(text);
	cJSON_Delete(man);
	for (int d = 0; d < N; d++)
		moe_module_free(m[d]);
	if (mach)
		moe_tcp_machine_free(ctx, mach);
	return st;
}
