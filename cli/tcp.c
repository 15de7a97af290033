/* cli/tcp.c: the TCP target of moec compile and moec run. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "moec/passes.h"

static moe_tcp_machine *machine(moe_ctx *ctx, const opts *o)
{
	return o->machine ? moe_tcp_machine_load(ctx, o->machine) : moe_tcp_machine_default(ctx);
}

/* --machine: the machine the TCP graph passes of the `tcp` pipeline plan for
 * (moe_tcp_set_pass_machine); 1 after a diagnostic when it cannot be loaded. */
int cli_pass_machine(moe_ctx *ctx, const opts *o)
{
	if (!o->machine)
		return 0;
	moe_tcp_machine *m = moe_tcp_machine_load(ctx, o->machine);
	moe_status st = m ? moe_tcp_set_pass_machine(ctx, m) : MOE_ERR_INVALID;
	moe_tcp_machine_free(ctx, m);
	return st != MOE_OK;
}

/* block=auto (docs/tcp-isa.md 7.8): for the TCP target, a .moe layer with
 * a dim B is loaded again with the block size moe_tcp_auto_block picks,
 * unless --set B= forces one; --quant-act applies first. *chosen: the B
 * picked (0: none, the file's or the forced one stands); *pred: its
 * predicted time (moe_tcp_auto_block's). */
static moe_module *load_tcp(moe_ctx *ctx, const opts *o, int64_t *chosen, double *pred);

int cli_quant_act(moe_ctx *ctx, const opts *o, moe_module *m)
{
	return m && o->quant_act && moe_tcp_quant_act(ctx, m, o->quant_act, o->file) != MOE_OK;
}

static moe_module *load_with_b(moe_ctx *ctx, const opts *o, int64_t B);

moe_module *cli_load_tcp(moe_ctx *ctx, const opts *o, int64_t *chosen, double *pred)
{
	*chosen = 0;
	*pred = 0;
	if (cli_pass_machine(ctx, o))
		return NULL;
	return load_tcp(ctx, o, chosen, pred);
}

moe_module *cli_load_tcp_b(moe_ctx *ctx, const opts *o, int64_t B)
{
	return cli_pass_machine(ctx, o) ? NULL : load_with_b(ctx, o, B);
}

static moe_module *load_tcp(moe_ctx *ctx, const opts *o, int64_t *chosen, double *pred)
{
	*chosen = 0;
	*pred = 0;
	moe_module *m = cli_load(ctx, o);
	if (cli_quant_act(ctx, o, m)) { /* before block=auto, which prices the layer as it runs */
		moe_module_free(m);
		return NULL;
	}
	if (!m || o->kind != K_MOE || moe_module_num_graphs(m) != 1 || o->nsets >= MAX_SETS)
		return m;
	for (size_t i = 0; i < o->nsets; i++)
		if (!strcmp(o->sets[i].name, "B"))
			return m;
	const moe_graph *g = moe_module_graph(m, 0);
	int64_t cur = 0;
	bool hasb = moe_graph_get_dim(g, "B", &cur) != 0;
	moe_tcp_machine *mach = hasb ? machine(ctx, o) : NULL;
	int64_t B = mach ? moe_tcp_auto_block(ctx, g, mach, pred) : 0;
	moe_tcp_machine_free(ctx, mach);
	if (B <= 0 || B == cur) {
		*chosen = B;
		return m;
	}
	moe_module_free(m);
	*chosen = B;
	return load_with_b(ctx, o, B);
}

/* The layer of o loaded again with --set B=B added (o has room: load_tcp
 * checked nsets), --quant-act applied. */
static moe_module *load_with_b(moe_ctx *ctx, const opts *o, int64_t B)
{
	static opts o2; /* large; one load at a time */
	o2 = *o;
	snprintf(o2.setnames[o2.nsets], sizeof o2.setnames[0], "B");
	char val[32];
	snprintf(val, sizeof val, "%lld", (long long)B);
	o2.sets[o2.nsets].name = o2.setnames[o2.nsets];
	o2.sets[o2.nsets].value = val;
	for (size_t i = 0; i < o2.nsets; i++)
		o2.sets[i].name = o2.setnames[i];
	o2.nsets++;
	moe_module *m = cli_load(ctx, &o2);
	if (cli_quant_act(ctx, o, m)) {
		moe_module_free(m);
		return NULL;
	}
	return m;
}

moe_tcp_program *cli_tcp_program(moe_ctx *ctx, const opts *o, const moe_graph *g, const moe_tcp_machine *m)
{
	return moe_tcp_compile_sched(ctx, g, m, o->sched_opts);
}

int cli_tcp_fit(moe_ctx *ctx, const opts *o, cli_fit *fit)
{
	memset(fit, 0, sizeof *fit);
	fit->total = -1;
	int64_t b;
	double pr;
	moe_module *m = cli_load_tcp(ctx, o, &b, &pr);
	if (!m)
		return 1;
	fit->auto_b = b, fit->auto_pred = pr;
	if (moe_module_num_graphs(m) != 1) { /* compile refuses these itself */
		moe_module_free(m);
		return 0;
	}
	int st = 1;
	moe_run_opts ro = {.verify = 1};
	moe_tcp_machine *mach = moe_run_pipeline_text(ctx, "tcp", m, &ro) == MOE_OK ? machine(ctx, o) : NULL;
	moe_tcp_program *p = mach ? cli_tcp_program(ctx, o, moe_module_graph(m, 0), mach) : NULL;
	if (p && cli_serve_tier(ctx, o, moe_module_graph(m, 0), mach, &p)) {
		moe_tcp_program_free(p);
		p = NULL;
	}
	if (p) {
		moe_tcp_program_hbm(p, &fit->total, &fit->weights);
		fit->capacity = moe_tcp_machine_hbm_capacity(ctx, mach);
		st = 0;
		/* a fault on expected loads is a fault any run with such loads
		 * meets: the command fails with it */
		st = moe_tcp_predict(ctx, p, mach, NULL, &fit->pred) != MOE_OK;
		fit->predicted = !st;
		fit->floored = !st && moe_tcp_floor(ctx, p, mach, 0, -1, &fit->floor) == MOE_OK;
		if (st)
			moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_file(ctx, o->file),
				"the TCP program compile writes for this layer faults on expected loads (uniform routing: "
				"moe_tcp_predict); a run with such loads faults alike");
	}
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, mach);
	moe_module_free(m);
	return st;
}

int cli_compile_tcp(moe_ctx *ctx, const moe_graph *g, const opts *o, const char *out)
{
	bool text = cli_ends_with(out, ".tcps"), bin = cli_ends_with(out, ".tcpb");
	if (!o->emit && cli_ends_with(out, ".tsched")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, out), "a .tsched output is a schedule: give --emit=tcp-sched");
		return 1;
	}
	if (o->emit) {
		moe_tcp_machine *m = machine(ctx, o);
		int st = !m || moe_tcp_emit_sched(ctx, g, m, o->sched_opts, out) != MOE_OK;
		moe_tcp_machine_free(ctx, m);
		return st;
	}
	if (!text && !bin) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, out),
			"--target=tcp writes assembly (.tcps) or a binary (.tcpb); name the output so");
		return 1;
	}
	moe_tcp_machine *m = machine(ctx, o);
	if (!m)
		return 1;
	moe_tcp_program *p = cli_tcp_program(ctx, o, g, m);
	int status = !p || cli_serve_tier(ctx, o, g, m, &p) || (text ? moe_tcp_write_asm(ctx, p, out) : moe_tcp_write_binary(ctx, p, out)) != MOE_OK;
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, m);
	return status;
}

/* Progress of a simulation: one line on stderr, redrawn at most every
 * 0.2 s and erased at the end: a bar over the whole run (routing before the block loop, the
 * blocks, the combine after it) and the time left, extrapolated from the
 * time so far. */
typedef struct progress {
	double start, last;
	bool shown;
} progress;

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void show_progress(void *ud, const char *phase, int64_t done, int64_t total)
{
	progress *pr = ud;
	double t = now_s();
	if (pr->shown && t - pr->last < 0.2)
		return;
	pr->last = t;
	pr->shown = true;
	/* the share of the run: routing 5%, blocks 90%, combine 5% */
	double part = total > 0 ? (double)(done < total ? done : total) / (double)total : 0;
	double f = !strcmp(phase, "blocks") ? 0.05 + 0.9 * part : !strcmp(phase, "combine") ? 0.95 + 0.05 * part : 0.05 * part;
	char bar[21];
	int filled = (int)(f * 20);
	for (int k = 0; k < 20; k++)
		bar[k] = k < filled ? '#' : '.';
	bar[20] = 0;
	char left[32] = "";
	double el = t - pr->start;
	if (f > 0.02 && el > 0.5)
		snprintf(left, sizeof left, ", %.0f s left", el * (1 - f) / f + 0.5);
	if (!strcmp(phase, "blocks"))
		fprintf(stderr, "\rmoec: simulating [%s] %3d%% block %lld of %lld%s    ", bar, (int)(f * 100), (long long)done,
			(long long)total, left);
	else
		fprintf(stderr, "\rmoec: simulating [%s] %3d%% %s%s    ", bar, (int)(f * 100), phase, left);
	fflush(stderr);
}

/* Whether to show progress: --progress, else $MOEC_PROGRESS, else auto (a
 * terminal on stderr). A bad $MOEC_PROGRESS is a warning (the option's
 * values are checked by the table). */
static bool want_progress(moe_ctx *ctx, const opts *o)
{
	const char *v = o->progress, *env = getenv("MOEC_PROGRESS");
	if (!v && env && *env) {
		if (strcmp(env, "auto") && strcmp(env, "on") && strcmp(env, "off"))
			moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_none(), "MOEC_PROGRESS='%.40s' is not auto, on or off; using auto",
				env);
		else
			v = env;
	}
	if (v && !strcmp(v, "off"))
		return false;
	return (v && !strcmp(v, "on")) || isatty(STDERR_FILENO);
}

/* The run's stats JSON with predicted_seconds added: the prediction of the
 * program on the loads the run staged (moe_tcp_predict; design 6.3: its
 * difference from simulated_seconds is the predictor's residue), and
 * predicted_approximated_reads; without the field when the run staged no
 * loads or more than one loop's, or the prediction failed (a warning). */
static char *add_prediction(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m, const moe_tcp_loads *seen,
	bool no_skip, int order_bytes, char *js)
{
	if (seen->stagings > 1 || (seen->stagings == 1 && !seen->block_expert))
		return js;
	moe_tcp_prediction pd;
	moe_tcp_loads l = *seen;
	if (no_skip) /* the run's loop ran the whole grid: so does the prediction */
		l.nblocks = l.grid;
	int errs = moe_error_count(ctx);
	/* no staging: a run without a block loop, or a serving run stopped by
	 * its guards before one (n_tokens 0), which the prediction repeats */
	moe_status rc = moe_tcp_predict_order(ctx, p, m, seen->stagings || seen->n_tokens >= 0 ? &l : NULL, order_bytes, &pd);
	cJSON *j = rc == MOE_OK ? cJSON_Parse(js) : NULL;
	if (rc != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_none(), "no predicted_seconds in the stats: the prediction failed%s",
			moe_error_count(ctx) > errs ? " (above)" : "");
		return js;
	}
	if (!j)
		return js;
	cJSON_AddNumberToObject(j, "predicted_seconds", pd.seconds);
	cJSON_AddNumberToObject(j, "predicted_approximated_reads",
		(double)(pd.approximated_lds + pd.approximated_index_lists));
	char *out = cJSON_Print(j);
	cJSON_Delete(j);
	if (!out)
		return js;
	free(js); /* cJSON_Print's, as moe_tcp_stats_json's */
	return out;
}

/* The run's stats JSON with floor_seconds added: the contract's floor
 * (moe_tcp_floor, docs/tcp-isa.md section 12) for the tokens the run routed
 * and the experts it hit; unchanged for a program without an experts op. */
static char *add_floor(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m, const moe_tcp_loads *seen,
	const moe_tcp_stats *st, char *js)
{
	moe_tcp_floor_terms fl;
	int64_t n = seen->n_tokens > 0 ? seen->n_tokens : 0;
	if (seen->n_tokens == 0 || moe_tcp_floor(ctx, p, m, n, (double)st->experts_hit, &fl) != MOE_OK)
		return js;
	cJSON *j = cJSON_Parse(js);
	if (!j)
		return js;
	cJSON_AddNumberToObject(j, "floor_seconds", fl.seconds);
	char *out = cJSON_Print(j);
	cJSON_Delete(j);
	if (!out)
		return js;
	free(js);
	return out;
}

static int run_program(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *m, const moe_tensor_map *bind,
	moe_checkpoint *ck, const opts *o, moe_tensor **out, char **stats_json)
{
	moe_tcp_run_opts ro = {.machine = m, .no_skip = o->no_skip != NULL, .trace_path = o->trace,
		.timing_only = o->timing_only != NULL, .lazy_weights = ck,
		.order_tensor = o->sim_order && !strcmp(o->sim_order, "tensor")};
	progress pr = {now_s(), 0, false};
	if (want_progress(ctx, o)) {
		ro.progress = show_progress;
		ro.progress_ud = &pr;
	}
	moe_tcp_stats st;
	moe_tcp_loads seen = {.n_tokens = -1};
	if (o->stats)
		ro.observed = &seen;
	moe_status rc = moe_tcp_run(ctx, p, bind, &ro, o->timing_only ? NULL : out, &st);
	if (pr.shown)
		fprintf(stderr, "\r%90s\r", "");
	if (rc == MOE_OK)
		*stats_json = moe_tcp_stats_json(ctx, &st);
	if (rc == MOE_OK && o->stats && *stats_json)
		*stats_json = add_prediction(ctx, p, m, &seen, o->no_skip != NULL, !ro.order_tensor, *stats_json);
	if (rc == MOE_OK && o->stats && *stats_json)
		*stats_json = add_floor(ctx, p, m, &seen, &st, *stats_json);
	moe_tcp_loads_free(ctx, &seen);
	return rc != MOE_OK;
}

int cli_run_tcp(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_checkpoint *ck, const opts *o,
	moe_tensor **out, char **stats_json)
{
	moe_tcp_machine *m = machine(ctx, o);
	if (!m)
		return 1;
	moe_tcp_program *p = cli_tcp_program(ctx, o, g, m);
	int status = !p || cli_serve_tier(ctx, o, g, m, &p) || run_program(ctx, p, m, bind, ck, o, out, stats_json);
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, m);
	return status;
}

/* A schedule (.tsched): read, verified and selected into a program. */
static moe_tcp_program *load_tsched(moe_ctx *ctx, const char *file, const moe_tcp_machine *m)
{
	char *text = NULL;
	size_t len = 0;
	if (moe_read_file_max(ctx, file, CLI_MAX_SOURCE, &text, &len) != MOE_OK)
		return NULL;
	moe_ctx_add_source(ctx, file, text, len);
	moe_tcp_program *p = moe_tcp_from_sched(ctx, file, text, len, m);
	free(text);
	return p;
}

/* The program of a .tcpb, a schedule (.tsched) or TCP assembly (.tcps, parsed
 * and validated like a .tcpb), for m. */
static moe_tcp_program *load_program(moe_ctx *ctx, const opts *o, const moe_tcp_machine *m)
{
	if (o->kind == K_TSCHED)
		return load_tsched(ctx, o->file, m);
	if (o->kind != K_TCPS)
		return moe_tcp_load_binary(ctx, o->file, m);
	char *text = NULL;
	size_t len = 0;
	moe_tcp_program *p = NULL;
	if (moe_read_file_max(ctx, o->file, CLI_MAX_SOURCE, &text, &len) == MOE_OK)
		p = moe_tcp_from_asm(ctx, o->file, text, len, m);
	free(text);
	return p;
}

int cli_compile_tsched(moe_ctx *ctx, const opts *o)
{
	moe_tcp_machine *m = machine(ctx, o);
	moe_tcp_program *p = m ? load_tsched(ctx, o->file, m) : NULL;
	int status = !p;
	if (p && cli_is_stdout(o->out)) {
		char *s = NULL;
		size_t n = 0;
		status = moe_tcp_to_asm(ctx, p, &s, &n) != MOE_OK || fwrite(s, 1, n, stdout) != n || fflush(stdout) != 0;
		moe_free(ctx, s);
	} else if (p) {
		status = (cli_ends_with(o->out, ".tcps") ? moe_tcp_write_asm(ctx, p, o->out) : moe_tcp_write_binary(ctx, p, o->out)) !=
			 MOE_OK;
	}
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, m);
	return status;
}

/* A .tcpb in place of the .moe: the binary is loaded and validated against the
 * machine completely before any weight is read; its tensor table names the
 * inputs and the weights' checkpoint sources. */
int cli_run_tcpb(moe_ctx *ctx, const opts *o)
{
	if (o->nsets) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file),
			"--set does not apply to a compiled .tcpb (its sizes are fixed); recompile the .moe");
		return 1;
	}
	moe_tcp_machine *m = machine(ctx, o);
	if (!m)
		return 1;
	int status = 1;
	bool bundle = cli_is_bundle_file(o->file);
	moe_tcp_bundle *bun = bundle ? moe_tcp_bundle_load(ctx, o->file, m) : NULL;
	moe_tcp_program *own = bundle ? NULL : load_program(ctx, o, m);
	const moe_tcp_program *p = bun ? cli_bundle_pick(ctx, bun, o) : own;
	moe_module *iface = p ? moe_tcp_interface(ctx, p) : NULL;
	moe_tensor_map *bind = moe_tensor_map_new(ctx);
	moe_checkpoint *ck = NULL;
	moe_tensor *out[16] = {0};
	char *stats = NULL;
	char *wcopy = strdup(o->weights);
	const char *paths[64];
	size_t np = 0;
	for (char *w = strtok(wcopy, ","); w && np < 64; w = strtok(NULL, ","))
		paths[np++] = w;
	if (!iface)
		goto done;
	if (moe_tcp_num_outputs(p) > 16) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "a program with more than 16 outputs cannot be run");
		goto done;
	}
	const moe_graph *g = moe_module_graph(iface, 0);
	double t0 = cli_now();
	if (cli_load_weights(ctx, g, paths, np, o, bind, &ck) || cli_serve_bind(ctx, g, o, bind) ||
		cli_bind_inputs(ctx, g, o->input, bind, cli_tokens(ctx, o)))
		goto done;
	double load_seconds = cli_now() - t0;
	if (run_program(ctx, p, m, bind, ck, o, out, &stats))
		goto done;
	if (stats) { /* a bundle's: the bucket run */
		int64_t bucket = 0;
		for (uint32_t i = 0; bun && i < moe_tcp_bundle_count(bun); i++)
			if (moe_tcp_bundle_program(bun, i) == p)
				bucket = moe_tcp_bundle_tokens(bun, i);
		stats = cli_stats_add(stats, load_seconds, bucket);
	}
	if (!o->timing_only && !(out[0] = cli_serve_rows(ctx, out[0], cli_tokens(ctx, o))))
		goto done;
	status = !o->timing_only && moe_npy_write(ctx, o->out, out[0]) != MOE_OK;
	if (!status && o->stats && stats)
		status = moe_write_file_atomic(ctx, o->stats, stats, strlen(stats)) != MOE_OK;
done:
	for (int i = 0; i < 16; i++)
		moe_tensor_free(ctx, out[i]);
	free(stats);
	free(wcopy);
	moe_tensor_map_free(bind);
	moe_checkpoint_close(ck);
	moe_module_free(iface);
	moe_tcp_program_free(own);
	moe_tcp_bundle_free(bun);
	moe_tcp_machine_free(ctx, m);
	return status;
}

int cli_check_tcpb(moe_ctx *ctx, const opts *o)
{
	moe_tcp_machine *m = machine(ctx, o);
	if (!m)
		return 1;
	if (cli_is_bundle_file(o->file)) {
		moe_tcp_bundle *b = moe_tcp_bundle_load(ctx, o->file, m);
		for (uint32_t i = 0; b && i < moe_tcp_bundle_count(b); i++) {
			printf("bucket T=%lld: ", (long long)moe_tcp_bundle_tokens(b, i));
			moe_tcp_print_summary(moe_tcp_bundle_program(b, i), stdout);
		}
		moe_tcp_machine_free(ctx, m);
		moe_tcp_bundle_free(b);
		return !b;
	}
	moe_tcp_program *p = load_program(ctx, o, m);
	int status = !p || moe_tcp_print_summary(p, stdout) != MOE_OK;
	moe_tcp_program_free(p);
	moe_tcp_machine_free(ctx, m);
	return status;
}

/* A manifest's "file" must name a file beside it: no directory part. */
static int plain_name(const char *s)
{
	return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

int cli_check_ep_manifest(moe_ctx *ctx, const opts *o)
{
	char *text = NULL;
	size_t len = 0;
	if (moe_read_file_max(ctx, o->file, CLI_MAX_SOURCE, &text, &len) != MOE_OK)
		return 1;
	cJSON *j = cJSON_ParseWithLength(text, len);
	free(text);
	const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "ep"), *T = cJSON_GetObjectItemCaseSensitive(j, "tokens"),
		    *progs = cJSON_GetObjectItemCaseSensitive(j, "programs");
	moe_loc at = moe_loc_file(ctx, o->file);
	if (!cJSON_IsNumber(ep) || !cJSON_IsArray(progs) || ep->valuedouble < 1 || ep->valuedouble > MOE_TCP_EP_MAX) {
		moe_diag(ctx, MOE_DIAG_ERROR, at, "not a manifest of compile --ep: it needs \"ep\" (1..%d) and \"programs\"",
			MOE_TCP_EP_MAX);
		cJSON_Delete(j);
		return 1;
	}
	int N = (int)ep->valuedouble, bad = 0, count[MOE_TCP_EP_MAX] = {0};
	moe_tcp_machine *m = machine(ctx, o);
	const char *slash = strrchr(o->file, '/');
	int dir = slash ? (int)(slash - o->file) + 1 : 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, progs)
	{
		const cJSON *chip = cJSON_GetObjectItemCaseSensitive(e, "chip"), *file = cJSON_GetObjectItemCaseSensitive(e, "file");
		if (!cJSON_IsNumber(chip) || chip->valuedouble < 0 || chip->valuedouble >= N || !cJSON_IsString(file) ||
			!plain_name(file->valuestring)) {
			moe_diag(ctx, MOE_DIAG_ERROR, at, "a program entry needs a chip in 0..%d and a file name beside the manifest",
				N - 1);
			bad = 1;
			continue;
		}
		char path[4200];
		snprintf(path, sizeof path, "%.*s%s", dir, o->file, file->valuestring);
		moe_tcp_program *p = !m ? NULL :
				     cli_ends_with(path, ".tcps") ? NULL : moe_tcp_load_binary(ctx, path, m);
		if (m && cli_ends_with(path, ".tcps")) {
			char *asmtext = NULL;
			size_t alen = 0;
			if (moe_read_file_max(ctx, path, CLI_MAX_SOURCE, &asmtext, &alen) == MOE_OK)
				p = moe_tcp_from_asm(ctx, path, asmtext, alen, m);
			free(asmtext);
		}
		bad |= !p;
		count[(int)chip->valuedouble] += p != NULL;
		moe_tcp_program_free(p);
	}
	if (!bad) {
		printf("expert-parallel manifest: %d chips, %lld tokens\n", N, cJSON_IsNumber(T) ? (long long)T->valuedouble : -1LL);
		for (int d = 0; d < N; d++)
			printf("  chip %d: %d program%s, each valid\n", d, count[d], count[d] == 1 ? "" : "s");
	}
	moe_tcp_machine_free(ctx, m);
	cJSON_Delete(j);
	return bad || !m;
}
