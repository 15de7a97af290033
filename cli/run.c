/* cli/run.c: moec passes, import-hf, compile and run. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static moe_loc floc(moe_ctx *ctx, const char *f)
{
	return moe_loc_file(ctx, f ? f : "moec");
}

static int err(moe_ctx *ctx, const char *file, const char *msg, const char *arg)
{
	moe_diag(ctx, MOE_DIAG_ERROR, floc(ctx, file), msg, arg);
	return 1;
}

/* An integer option (>= 1 for the token count and the block size, >= 0
 * otherwise); -1 when absent, -2 (with an error) when bad. */
static int64_t int_opt(moe_ctx *ctx, const char *name, const char *v)
{
	if (!v)
		return -1;
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	/* the token count and the block size must be positive (other options say so themselves) */
	long long lo = strstr(name, "tokens") || strstr(name, "block") || !strcmp(name, "--set T") ||
			       !strcmp(name, "--set B") ? 1 : 0;
	if (errno || *end || end == v || x < lo || x > INT32_MAX) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "%s must be an integer in %lld..2147483647, got '%s'", name, lo,
			v);
		return -2;
	}
	return x;
}

int cli_passes(moe_ctx *ctx)
{
	printf("passes:\n");
	for (size_t i = 0; i < moe_pass_count(ctx); i++) {
		const moe_pass_info *p = moe_pass_get(ctx, i);
		printf("  %-20s %s\n", p->name, p->summary);
		const moe_pass_option *rows = moe_pass_options(p);
		for (const moe_pass_option *o = rows; o && o->key; o++)
			printf("  %-20s   %s=%s (default %s): %s\n", "", o->key,
				o->kind == MOE_PASS_OPT_ENUM ? o->values : o->kind == MOE_PASS_OPT_COUNT ? "N" : "VALUE",
				o->def ? o->def : "none", o->help ? o->help : "");
		if (p->options && !rows)
			printf("  %-20s   options: %s\n", "", p->options);
	}
	printf("\nTCP schedule rewrites (--tcp-opt=-NAME,+NAME):\n");
	const char *name, *summary;
	for (uint32_t i = 0; moe_tcp_rewrite_info(i, &name, &summary); i++)
		printf("  %-20s %s\n", name, summary);
	printf("\nnamed pipelines:\n");
	static const char *const names[] = {"tcp", "tcp-sched", "tcp-graph", "host"};
	for (size_t i = 0; i < sizeof names / sizeof *names; i++)
		printf("  %-20s %s\n", names[i], moe_pipeline_named(names[i]));
	return 0;
}

int cli_import_hf(moe_ctx *ctx, const opts *o)
{
	if (o->list) {
		char *text = NULL;
		if (moe_import_hf_families(ctx, o->markdown ? MOE_HF_LIST_MARKDOWN : MOE_HF_LIST_TEXT, &text) != MOE_OK)
			return 1;
		int bad = fputs(text, stdout) == EOF || fflush(stdout) != 0;
		moe_free(ctx, text);
		return bad ? err(ctx, NULL, "cannot write the family list%s", "") : 0;
	}
	moe_import_opts io = {0};
	io.dtype = MOE_F32;
	io.config_dtype = 1; /* unless --set dtype= */
	io.ignore_quantization = o->ignore_quantization != NULL;
	int64_t layer = int_opt(ctx, "--layer", o->layer), T = int_opt(ctx, "--tokens", o->tokens),
		B = int_opt(ctx, "--block", o->block);
	for (size_t i = 0; i < o->nsets; i++) {
		const char *n = o->sets[i].name, *v = o->sets[i].value;
		if (!strcmp(n, "dtype")) {
			int t = moe_dtype_from_name(v);
			if (t != MOE_F32 && t != MOE_BF16)
				return err(ctx, NULL, "--set dtype= takes f32 or bf16, got '%s'", v);
			io.dtype = (moe_dtype)t;
			io.config_dtype = 0;
		} else if (!strcmp(n, "layer"))
			layer = int_opt(ctx, "--set layer", v);
		else if (!strcmp(n, "T"))
			T = int_opt(ctx, "--set T", v);
		else if (!strcmp(n, "B"))
			B = int_opt(ctx, "--set B", v);
		else
			return err(ctx, NULL, "import-hf takes --set dtype, layer, T or B; not '%s'", n);
	}
	if (layer == -2 || T == -2 || B == -2)
		return 1;
	if (T == 0 || B == 0)
		return err(ctx, NULL, "the token count and the block size must be positive%s", "");
	io.layer = layer < 0 ? 0 : (int)layer;
	io.first_moe_layer = layer == -1; /* no --layer: the first MoE layer */
	io.tokens = T < 0 ? 0 : T;
	io.block = B < 0 ? 0 : B;
	if (!o->out)
		return err(ctx, NULL, "import-hf needs -o FILE.moe%s", "");
	/* a model directory stands for its config.json */
	char cfg[4096];
	const char *file = o->file;
	struct stat st;
	if (stat(file, &st) == 0 && S_ISDIR(st.st_mode)) {
		snprintf(cfg, sizeof cfg, "%s%sconfig.json", file, cli_ends_with(file, "/") ? "" : "/");
		file = cfg;
	}
	char *text = NULL;
	if (moe_import_hf(ctx, file, &io, &text) != MOE_OK)
		return 1;
	/* never write a file moec itself would reject */
	moe_module *m = moe_parse_moe(ctx, o->out, text, strlen(text), NULL);
	int status = !m || moe_module_verify(ctx, m) != MOE_OK;
	moe_module_free(m);
	if (status)
		moe_diag(ctx, MOE_DIAG_NOTE, floc(ctx, file), "the generated layer did not compile; nothing was written");
	else if (cli_is_stdout(o->out))
		status = fputs(text, stdout) < 0 || fflush(stdout) != 0;
	else
		status = moe_write_file_atomic(ctx, o->out, text, strlen(text)) != MOE_OK;
	free(text);
	return status;
}

/* The single layer of a module, or an error naming the layers. */
static moe_graph *one_layer(moe_ctx *ctx, const moe_module *m, const char *file)
{
	if (moe_module_num_graphs(m) == 1)
		return moe_module_graph(m, 0);
	moe_diag(ctx, MOE_DIAG_ERROR, floc(ctx, file), "holds %zu layers; run and compile take a file with one layer",
		moe_module_num_graphs(m));
	return NULL;
}

static int lower(moe_ctx *ctx, moe_module *m, const char *pipeline)
{
	moe_run_opts ro = {.verify = 1};
	return moe_run_pipeline_text(ctx, pipeline, m, &ro) != MOE_OK;
}

/* The target an output name implies (and what it is): NULL when the name says nothing. */
static const char *target_of(const char *out, const char **what)
{
	static const struct {
		const char *ext, *target, *what;
	} exts[] = {{".tcpb", "tcp", "a TCP binary"}, {".tcps", "tcp", "TCP assembly"}, {".tsched", "tcp", "a TCP schedule"},
		{".c", "c", "C source"},
		{".o", "obj", "an object file"}, {".ll", "llvm-ir", "LLVM IR"}};
	for (size_t i = 0; i < sizeof exts / sizeof *exts; i++)
		if (cli_ends_with(out, exts[i].ext)) {
			*what = exts[i].what;
			return exts[i].target;
		}
	return NULL;
}

/* --target and -o agree, or one decides; NULL after an error. */
static const char *compile_target(moe_ctx *ctx, const opts *o)
{
	if (!o->out) {
		err(ctx, NULL, "compile needs -o OUT (.tcpb, .tcps, .c, .o or .ll; - for standard output)%s", "");
		return NULL;
	}
	const char *what = NULL, *named = cli_is_stdout(o->out) ? NULL : target_of(o->out, &what);
	if (!o->target && !named && o->kind == K_TSCHED && cli_is_stdout(o->out))
		return "tcp"; /* a schedule's assembly */
	if (!o->target && !named) {
		if (cli_is_stdout(o->out))
			err(ctx, NULL, "-o - needs --target=c, llvm-ir or tcp (TCP assembly)%s", "");
		else
			err(ctx, NULL, "cannot tell the target from the name '%s' (.tcpb, .tcps, .c, .o, .ll): give --target",
				o->out);
		return NULL;
	}
	if (o->target && named && strcmp(o->target, named)) {
		moe_diag(ctx, MOE_DIAG_ERROR, floc(ctx, "moec"), "-o %s names %s (--target=%s), not --target=%s output",
			o->out, what, named, o->target);
		return NULL;
	}
	const char *t = o->target ? o->target : named;
	if (cli_is_stdout(o->out) && !strcmp(t, "obj")) {
		err(ctx, NULL, "--target=obj writes a binary object file: -o - takes text forms only; name a file%s", "");
		return NULL;
	}
	return t;
}

/* Emits to `path`, or for -o - to a temporary file copied to stdout. */
static int emit_host(moe_ctx *ctx, const moe_graph *g, const char *t, const char *path)
{
	if (!strcmp(t, "c"))
		return moe_emit_c_file(ctx, g, path) != MOE_OK;
	if (!strcmp(t, "obj"))
		return moe_emit_object(ctx, g, path) != MOE_OK;
	return moe_emit_llvm_ir(ctx, g, path) != MOE_OK;
}

static int emit_target(moe_ctx *ctx, const moe_graph *g, const char *t, const opts *o)
{
	if (cli_is_stdout(o->out) && !strcmp(t, "c"))
		return moe_emit_c(ctx, g, stdout) != MOE_OK || fflush(stdout) != 0;
	char tmp[64] = "";
	const char *path = o->out;
	int slot[2] = {-1, -1}; /* the directory and the file in it, removed on SIGINT/SIGTERM */
	if (cli_is_stdout(o->out)) {
		const char *td = getenv("TMPDIR");
		char dir[40];
		snprintf(dir, sizeof dir, "%s/moec.XXXXXX", td && *td && strlen(td) < 24 ? td : "/tmp");
		if (!moe_temp_dir(dir, &slot[0]))
			return err(ctx, NULL, "cannot make a temporary directory: %s", strerror(errno));
		snprintf(tmp, sizeof tmp, "%s/out.%s", dir, strcmp(t, "tcp") ? "ll" : "tcps");
		slot[1] = moe_temp_track(tmp);
		path = tmp;
	}
	int status = strcmp(t, "tcp") ? emit_host(ctx, g, t, path) : cli_compile_tcp(ctx, g, o, path);
	if (*tmp) {
		status |= cli_cat_and_remove(ctx, tmp);
		moe_temp_forget(slot[1]);
		moe_temp_forget(slot[0]);
	}
	return status;
}

int cli_compile(moe_ctx *ctx, const opts *o)
{
	const char *t = compile_target(ctx, o);
	if (!t || cli_check_target(ctx, o, !strcmp(t, "tcp") ? "tcp" : "host"))
		return 1;
	if (o->buckets)
		return cli_compile_buckets(ctx, o, o->out);
	if (o->ep)
		return cli_compile_ep(ctx, o);
	if (o->kind == K_TSCHED) {
		if (strcmp(t, "tcp"))
			return err(ctx, NULL, "a schedule (.tsched) compiles to --target=tcp only, not '%s'", t);
		return cli_compile_tsched(ctx, o);
	}
	int64_t autob = 0;
	double pred = 0;
	moe_module *m = strcmp(t, "tcp") ? cli_load(ctx, o) : cli_load_tcp(ctx, o, &autob, &pred);
	if (!m)
		return 1;
	int status = 1;
	moe_graph *g = one_layer(ctx, m, o->file);
	if (g && !lower(ctx, m, strcmp(t, "tcp") ? "host" : "tcp"))
		status = emit_target(ctx, g, t, o);
	moe_module_free(m);
	return status;
}

int cli_cat_and_remove(moe_ctx *ctx, const char *tmp)
{
	/* removed before the copy, so a closed pipe (SIGPIPE) leaves nothing */
	FILE *f = fopen(tmp, "rb");
	remove(tmp);
	char dir[64];
	snprintf(dir, sizeof dir, "%s", tmp);
	char *slash = strrchr(dir, '/');
	if (slash) {
		*slash = 0;
		rmdir(dir);
	}
	if (!f)
		return 1; /* the emitter has reported why */
	int status = 0;
	char buf[1 << 16];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		status |= fwrite(buf, 1, n, stdout) != n;
	status |= ferror(f);
	fclose(f);
	status |= fflush(stdout) != 0;
	if (status)
		err(ctx, NULL, "cannot write to standard output%s", "");
	return status;
}

/* Splits "a,b,c" into at most 64 paths (pointers into a copy). */
static size_t split_paths(char *s, const char **out, size_t max)
{
	size_t n = 0;
	for (char *p = strtok(s, ","); p && n < max; p = strtok(NULL, ","))
		out[n++] = p;
	return n;
}

/* Binds --input: one input node takes x.npy; several take name=path,... */
int cli_bind_inputs(moe_ctx *ctx, const moe_graph *g, const char *spec, moe_tensor_map *bind, int64_t tokens)
{
	uint32_t ninputs = 0;
	moe_id last = MOE_NONE;
	for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++)
		if (moe_node_op(g, i) == MOE_OP_INPUT && !moe_tensor_map_get(bind, moe_node_name(g, i)))
			ninputs++, last = i; /* n_tokens is bound already under --tokens */
	if (!spec)
		return err(ctx, NULL, "run needs --input x.npy%s", "");
	char *copy = strdup(spec);
	const char *items[64];
	size_t n = split_paths(copy, items, 64);
	int status = 0;
	for (size_t k = 0; k < n && !status; k++) {
		const char *eq = strchr(items[k], '=');
		moe_id node = MOE_NONE;
		const char *path = items[k];
		if (eq) {
			for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++)
				if (moe_node_op(g, i) == MOE_OP_INPUT && !strncmp(moe_node_name(g, i), items[k], (size_t)(eq - items[k])) &&
					!moe_node_name(g, i)[eq - items[k]])
					node = i;
			path = eq + 1;
			if (node == MOE_NONE)
				status = err(ctx, NULL, "--input names no input of the layer: '%s'", items[k]);
		} else if (ninputs == 1 && n == 1) {
			node = last;
		} else {
			status = err(ctx, NULL, "the layer has several inputs: give --input NAME=x.npy,... (got '%s')", items[k]);
		}
		if (status)
			break;
		moe_tensor *t = moe_npy_read(ctx, path, moe_node_dtype(g, node));
		if (!t) {
			status = 1;
			break;
		}
		int rank = moe_node_rank(g, node);
		const int64_t *shape = moe_node_shape(g, node);
		if (!(t = cli_serve_pad(ctx, t, shape, tokens))) {
			status = 1;
			break;
		}
		bool same = t->rank == rank;
		for (int d = 0; same && d < rank; d++)
			same = t->shape[d] == shape[d];
		if (!same) {
			char want[128] = "", got[128] = "";
			for (int d = 0; d < rank; d++)
				snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "", (long long)shape[d]);
			for (int d = 0; d < t->rank; d++)
				snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
			int rows = rank == 2 && t->rank == 2 && t->shape[1] == shape[1];
			char hint[160] = "";
			if (rows && t->shape[0] < shape[0] && tokens < 0)
				snprintf(hint, sizeof hint, " (give --tokens %lld to serve its %lld real rows with this layer of T = %lld, or "
					"use --set T=... for a .moe)", (long long)t->shape[0], (long long)t->shape[0], (long long)shape[0]);
			else if (rows)
				snprintf(hint, sizeof hint, " (use --set T=... for a .moe, or recompile a .tcpb)");
			moe_diag(ctx, MOE_DIAG_ERROR, floc(ctx, path), "shape [%s] does not match input '%s' [%s]%s", got,
				moe_node_name(g, node), want, hint);
			moe_tensor_free(ctx, t);
			status = 1;
			break;
		}
		if (moe_tensor_map_set(bind, moe_node_name(g, node), t) != MOE_OK) {
			status = 1; /* out of memory, reported */
			break;
		}
	}
	for (uint32_t i = 0; !status && i < moe_graph_num_nodes(g); i++)
		if (moe_node_op(g, i) == MOE_OP_INPUT && !moe_tensor_map_get(bind, moe_node_name(g, i)))
			status = err(ctx, NULL, "input '%s' of the layer is not bound by --input", moe_node_name(g, i));
	free(copy);
	return status;
}

int cli_load_weights(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t np, const opts *o,
	moe_tensor_map *bind, moe_checkpoint **keep)
{
	size_t absent = 0;
	unsigned flags = o->timing_only ? MOE_WEIGHTS_ALLOW_ABSENT : 0;
	moe_checkpoint *ck = moe_checkpoint_open(ctx, paths, np);
	/* kept open for a run that reads per-expert weights as it touches them; a
	 * timing-only run never reads their values, so they stay on disk (checked,
	 * bound without data like absent ones) */
	if (keep)
		flags |= MOE_WEIGHTS_DEFER;
	if (!ck || moe_weights_load_from_ex(ctx, g, ck, flags, bind, &absent) != MOE_OK) {
		moe_checkpoint_close(ck);
		return 1;
	}
	if (keep && !o->timing_only)
		*keep = ck;
	else
		moe_checkpoint_close(ck);
	if (absent)
		fprintf(stderr, "moec: timing only: %zu weight%s absent from the checkpoint (bound without values)\n", absent,
			absent == 1 ? " is" : "s are");
	return 0;
}

double cli_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *cli_stats_add(char *js, double load_seconds, int64_t bucket)
{
	char *end = js ? strrchr(js, '}') : NULL;
	if (!end)
		return js;
	struct rusage ru;
	long long rss = getrusage(RUSAGE_SELF, &ru) == 0 ? (long long)ru.ru_maxrss * 1024 : -1;
	char add[256];
	int n = snprintf(add, sizeof add, ",\n  \"load_seconds\": %.9g,\n  \"peak_rss_bytes\": %lld", load_seconds, rss);
	if (bucket > 0)
		n += snprintf(add + n, sizeof add - (size_t)n, ",\n  \"bucket_tokens\": %lld", (long long)bucket);
	/* the fields go after the last member, before the closing brace */
	char *last = end;
	while (last > js && (last[-1] == '\n' || last[-1] == ' ' || last[-1] == '\t'))
		last--;
	size_t head = (size_t)(last - js), len = strlen(js);
	char *r = malloc(len + (size_t)n + 4);
	if (!r)
		return js;
	memcpy(r, js, head);
	memcpy(r + head, add, (size_t)n);
	snprintf(r + head + (size_t)n, len - head + 4, "\n}\n");
	free(js);
	return r;
}

static int write_stats(moe_ctx *ctx, const char *path, const char *json)
{
	return moe_write_file_atomic(ctx, path, json, strlen(json)) != MOE_OK;
}

/* The options of run that hold together, and the target; NULL after an error. */
static const char *run_target(moe_ctx *ctx, const opts *o)
{
	int tcpb = o->kind == K_TCPB || o->kind == K_TCPS || o->kind == K_TSCHED;
	const char *target = o->target ? o->target : tcpb ? "tcp" : "host";
	if (tcpb && strcmp(target, "tcp")) {
		moe_diag(ctx, MOE_DIAG_ERROR, floc(ctx, o->file), "a %s runs on --target=tcp only, not '%s'",
			o->kind == K_TSCHED ? "schedule (.tsched)" : o->kind == K_TCPS ? "TCP assembly (.tcps)" : ".tcpb", target);
		return NULL;
	}
	if (cli_check_target(ctx, o, target))
		return NULL;
	const char *engine = o->engine ? o->engine : "llvm";
	const char *jit = o->repeat ? "--repeat" : o->stats ? "--stats" : o->threads ? "--threads" : o->kernels ? "--kernels"
			: o->no_cache ? "--no-cache" : o->cold ? "--cold" : NULL;
	if (!strcmp(target, "host") && !strcmp(engine, "interp") && jit) {
		err(ctx, NULL, "%s applies to --engine=llvm or c, not the interpreter", jit);
		return NULL;
	}
	if (o->timing_only && o->out) {
		err(ctx, NULL, "--timing-only computes no output; drop -o (use --stats FILE.json for the times)%s", "");
		return NULL;
	}
	if (o->timing_only && !o->stats && !o->trace) {
		err(ctx, NULL, "--timing-only writes nothing but --stats FILE.json or --trace FILE.json; give one%s", "");
		return NULL;
	}
	if (!o->out && !o->timing_only) {
		err(ctx, NULL, "run needs -o y.npy%s", "");
		return NULL;
	}
	if (cli_is_stdout(o->out) || cli_is_stdout(o->stats) || cli_is_stdout(o->trace)) {
		err(ctx, NULL, "run writes .npy and JSON files: -o -, --stats - and --trace - are not supported; name files%s",
			"");
		return NULL;
	}
	if (!o->weights) {
		err(ctx, NULL, "run needs --weights W.safetensors[,W2...]%s", "");
		return NULL;
	}
	return target;
}

static int run_layer(moe_ctx *ctx, const opts *o, const char *target, int64_t repeat);

/* run's outputs (-o, --stats, --trace) are one output set: the command
 * writes them to temporaries and they are renamed into place together, only
 * when the run succeeded. Under --ep on the host only rank 0 writes, -o. */
int cli_run(moe_ctx *ctx, const opts *o)
{
	const char *target = run_target(ctx, o);
	if (!target)
		return 1;
	int64_t repeat = int_opt(ctx, "--repeat", o->repeat);
	if (repeat == -2 || repeat == 0)
		return repeat == 0 ? err(ctx, NULL, "--repeat must be at least 1%s", "") : 1;
	if (repeat < 0)
		repeat = 1;
	if (o->placement && !o->ep)
		return err(ctx, NULL, "--placement needs --ep N%s", "");
	if (o->ep && strcmp(target, "tcp"))
		return cli_run_ep(ctx, o);
	static opts t; /* large; the options with the outputs' temporaries */
	t = *o;
	for (size_t i = 0; i < t.nsets; i++)
		t.sets[i].name = t.setnames[i];
	moe_output_set *set = moe_output_set_new(ctx);
	int bad = !set;
	if (!bad && o->out && !o->timing_only)
		bad = !(t.out = moe_output_set_add(set, o->out));
	if (!bad && o->stats)
		bad = !(t.stats = moe_output_set_add(set, o->stats));
	if (!bad && o->trace)
		bad = !(t.trace = moe_output_set_add(set, o->trace));
	if (!bad)
		bad = o->kind == K_TCPB || o->kind == K_TCPS || o->kind == K_TSCHED ? cli_run_tcpb(ctx, &t) : o->ep ? cli_run_ep(ctx, &t) : run_layer(ctx, &t, target, repeat);
	if (bad) {
		moe_output_set_abort(set);
		return 1;
	}
	return moe_output_set_commit(set) != MOE_OK;
}

static int run_layer(moe_ctx *ctx, const opts *o, const char *target, int64_t repeat)
{
	int64_t autob = 0;
	double pred = 0;
	moe_module *m = strcmp(target, "tcp") ? cli_load(ctx, o) : cli_load_tcp(ctx, o, &autob, &pred);
	if (!m)
		return 1;
	int status = 1;
	moe_tensor_map *bind = moe_tensor_map_new(ctx);
	moe_checkpoint *ck = NULL;
	moe_tensor *out[16] = {0};
	char *wcopy = strdup(o->weights);
	const char *paths[64];
	size_t np = split_paths(wcopy, paths, 64);
	moe_graph *g = one_layer(ctx, m, o->file);
	if (!g || cli_serve_prepare(ctx, g, o) || lower(ctx, m, strcmp(target, "tcp") ? "host" : "tcp"))
		goto done;
	if (moe_graph_num_outputs(g) > 16) {
		err(ctx, o->file, "a layer with more than 16 outputs cannot be run%s", "");
		goto done;
	}
	double t0 = cli_now();
	bool tcp = !strcmp(target, "tcp");
	if (cli_load_weights(ctx, g, paths, np, o, bind, tcp ? &ck : NULL) || cli_serve_bind(ctx, g, o, bind) ||
		cli_bind_inputs(ctx, g, o->input, bind, cli_tokens(ctx, o)))
		goto done;
	double load_seconds = cli_now() - t0;
	char *stats = NULL;
	if (tcp) {
		status = cli_run_tcp(ctx, g, bind, ck, o, out, &stats);
	} else {
		const char *engine = o->engine ? o->engine : "llvm";
		if (!strcmp(engine, "interp")) {
			status = moe_interp_run(ctx, g, bind, out) != MOE_OK;
		} else if (!strcmp(engine, "llvm") || !strcmp(engine, "c")) {
			moe_host_stats hs;
			moe_host_opts ho;
			moe_host_opts_init(&ho);
			ho.engine = !strcmp(engine, "c") ? MOE_HOST_C : MOE_HOST_LLVM;
			ho.repeat = (int)repeat;
			ho.no_cache = o->no_cache != NULL;
			char *wid = ho.no_cache ? NULL : moe_checkpoint_id(paths, np);
			ho.weights_id = wid;
			ho.cold = o->cold != NULL;
			int64_t th = int_opt(ctx, "--threads", o->threads);
			if (th == 0) {
				err(ctx, NULL, "--threads must be at least 1 (leave it out for every core)%s", "");
				th = -2;
			}
			if (o->kernels && strcmp(o->kernels, "auto") && strcmp(o->kernels, "portable")) {
				err(ctx, NULL, "--kernels must be auto or portable, got '%s'", o->kernels);
				th = -2;
			}
			long cores = sysconf(_SC_NPROCESSORS_ONLN);
			if (th > 0 && th <= 1024 && cores > 0 && th > cores)
				moe_diag(ctx, MOE_DIAG_WARNING, floc(ctx, "moec"), "--threads %lld is more than the %ld cores available; "
					"the extra threads share them", (long long)th, cores);
			ho.threads = th < 0 ? 0 : (int)th;
			ho.portable = o->kernels && !strcmp(o->kernels, "portable");
			static const char *const cache_names[] = {"off", "miss", "hit", "bad"};
			status = th == -2 || moe_host_run_opts(ctx, g, bind, &ho, out, &hs) != MOE_OK;
			free(wid);
			if (!status && ho.engine == MOE_HOST_LLVM && !ho.no_cache && hs.cache == MOE_CACHE_OFF)
				moe_diag(ctx, MOE_DIAG_WARNING, floc(ctx, "moec"), "the JIT cache is off: no usable cache directory "
					"($XDG_CACHE_HOME/moec or ~/.cache/moec cannot be made or written); every run compiles the layer again");
			if (!status && o->stats) {
				size_t cap = 1024;
				stats = malloc(cap);
				snprintf(stats, cap,
					"{\n  \"target\": \"host\",\n  \"engine\": \"%s\",\n  \"compute_seconds\": %.9g,\n"
					"  \"compile_seconds\": %.9g,\n  \"setup_seconds\": %.9g,\n  \"pack_seconds\": %.9g,\n  \"repeat\": %d,\n  \"workspace_bytes\": %zu,\n"
					"  \"blocks_executed\": %lld,\n  \"blocks_skipped\": %lld,\n  \"rows_executed\": %lld,\n"
					"  \"grid_blocks_max\": %lld,\n  \"threads\": %d,\n  \"cache\": \"%s\",\n"
					"  \"kernels\": \"%s\",\n  \"pack_cache\": \"%s\"\n}\n",
					engine, hs.compute_seconds, hs.compile_seconds, hs.setup_seconds, hs.pack_seconds, hs.repeat, hs.workspace_bytes,
					(long long)hs.blocks_executed, (long long)hs.blocks_skipped, (long long)hs.rows_executed,
					(long long)hs.grid_blocks_max, hs.threads, cache_names[hs.cache], hs.kernels, cache_names[hs.pack_cache]);
			}
		}
	}
	if (!status && !o->timing_only && !(out[0] = cli_serve_rows(ctx, out[0], cli_tokens(ctx, o))))
		status = 1;
	if (!status && !o->timing_only)
		status = moe_npy_write(ctx, o->out, out[0]) != MOE_OK;
	if (!status && o->stats && stats)
		status = write_stats(ctx, o->stats, stats = cli_stats_add(stats, load_seconds, 0));
	free(stats);
done:
	for (uint32_t i = 0; i < 16; i++)
		moe_tensor_free(ctx, out[i]);
	free(wcopy);
	moe_tensor_map_free(bind);
	moe_checkpoint_close(ck);
	moe_module_free(m);
	return status;
}
