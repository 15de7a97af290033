/* cli/main.c: the moec command line, a thin client of the library.
 * moec COMMAND [options] FILE; every error is a diagnostic on stderr and
 * exit status 1. The options and every help come from one table
 * (options.def); the input's kind is recognised by its content (sniff.c).
 * Output files are written to a temporary name and renamed into place. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moec/frontend.h"
#include "moec/ir.h"
#include "moec/passes.h"
#include "moec/tcp.h"

#include "cli.h"

int cli_ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

int cli_is_stdout(const char *out)
{
	return out && !strcmp(out, "-");
}

/* --set layer=N feeds checkpoint tensor names: a non-negative integer. */
static int check_sets(moe_ctx *ctx, const opts *o)
{
	for (size_t i = 0; i < o->nsets; i++) {
		const char *n = o->sets[i].name, *v = o->sets[i].value;
		if (strcmp(n, "layer"))
			continue;
		char *end;
		errno = 0;
		long long x = strtoll(v, &end, 10);
		if (*v && !*end && !errno && x < 0) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"),
				"--set layer=%s: a layer index is at least 0", v);
			return 1;
		}
	}
	return 0;
}

moe_module *cli_load(moe_ctx *ctx, const opts *o)
{
	size_t len = 0;
	char *text = NULL;
	/* stdin may be a pipe; a named input must be a regular file */
	if ((strcmp(o->file, "-") ? moe_read_file_max(ctx, o->file, CLI_MAX_SOURCE, &text, &len) :
				    moe_read_stream(ctx, "<stdin>", 0, CLI_MAX_SOURCE, &text, &len)) != MOE_OK)
		return NULL;
	opts so = *o;
	so.kind = cli_sniff(text, len);
	if (cli_check_kind(ctx, &so) || so.kind == K_TCPB) {
		if (so.kind == K_TCPB)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "a .tcpb cannot be read from standard input");
		free(text);
		return NULL;
	}
	moe_module *m = NULL;
	if (so.kind != K_MOE) {
		if (o->nsets)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file),
				"--set applies only to .moe files (this is %s)", so.kind == K_MOEIR ? "textual IR" : "JSON IR");
		moe_ctx_add_source(ctx, o->file, text, len);
		m = o->nsets ? NULL :
		    so.kind == K_MOEIR ? moe_module_parse_text(ctx, o->file, text, len) :
		                         moe_module_parse_json(ctx, o->file, text, len);
		if (m && moe_module_verify(ctx, m) != MOE_OK) {
			moe_module_free(m);
			m = NULL;
		}
	} else if (!check_sets(ctx, o)) {
		moe_settings sets = {o->sets, o->nsets};
		m = moe_parse_moe(ctx, o->file, text, len, &sets);
	}
	free(text);
	return m;
}

/* ---- pass pipeline hook ----
 * Runs the pipeline text (a named pipeline or a pass list) through the
 * library's pass manager, verifying after every pass; an empty pipeline runs
 * nothing. IR dumps of --print-ir-before/after go to stderr. */
static const char *pipeline_text(const char *pipeline)
{
	const char *named = pipeline ? moe_pipeline_named(pipeline) : NULL;
	return named ? named : pipeline;
}

/* The pass named by --print-ir-after/--print-ir-before must run. */
static int check_print_pass(moe_ctx *ctx, const char *opt, const char *name, const char *pipeline)
{
	if (!name || !strcmp(name, "all"))
		return 0;
	moe_loc at = moe_loc_file(ctx, "moec");
	if (!moe_pass_find(ctx, name)) {
		moe_diag(ctx, MOE_DIAG_ERROR, at, "%s=%s: no pass has that name (`moec passes` lists them)", opt, name);
		return 1;
	}
	const char *text = pipeline_text(pipeline);
	if (!text || !*text) {
		moe_diag(ctx, MOE_DIAG_ERROR, at, "%s=%s: no pass runs without --pipeline (e.g. --pipeline=host)", opt, name);
		return 1;
	}
	size_t n = strlen(name);
	for (const char *p = text; (p = strstr(p, name)); p += n) {
		int left = p == text || p[-1] == ',', right = !p[n] || p[n] == ',' || p[n] == '{';
		if (left && right)
			return 0;
	}
	moe_diag(ctx, MOE_DIAG_ERROR, at, "%s=%s: the pipeline '%s' does not run that pass", opt, name, text);
	return 1;
}

static int run_pipeline(moe_ctx *ctx, moe_module *m, const char *pipeline, const opts *o)
{
	const char *text = pipeline_text(pipeline);
	if (!text || !*text)
		return 0;
	moe_run_opts ro = {.verify = 1, .print_before = o->before, .print_after = o->after, .print_to = stderr,
		.reproducer = o->reproducer};
	return moe_run_pipeline_text(ctx, text, m, &ro) != MOE_OK;
}

static int emit(moe_ctx *ctx, const moe_module *m, const char *format, FILE *f)
{
	if (format && !strcmp(format, "json")) {
		char *s = moe_module_to_json(m);
		if (!s)
			return 1;
		int r = fputs(s, f) < 0 || fputc('\n', f) == EOF;
		moe_free(ctx, s);
		return r;
	}
	if (format && !strcmp(format, "dot"))
		return moe_module_print_dot(m, f) != MOE_OK;
	return moe_module_print(m, f) != MOE_OK;
}

/* Writes to a temporary beside OUT, then renames it over OUT. */
static int write_output(moe_ctx *ctx, const moe_module *m, const opts *o)
{
	if (!o->out || cli_is_stdout(o->out))
		return emit(ctx, m, o->format, stdout) || fflush(stdout) != 0;
	moe_atomic_file *af = moe_atomic_open(ctx, o->out);
	if (!af)
		return 1;
	if (emit(ctx, m, o->format, moe_atomic_stream(af))) {
		moe_atomic_abort(af);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->out), "cannot write: %s", strerror(errno));
		return 1;
	}
	return moe_atomic_commit(af) != MOE_OK;
}

/* Reads the kind of FILE and checks that the command takes it. */
static int classify(moe_ctx *ctx, opts *o)
{
	if (!o->file)
		return 0;
	if (cli_sniff_file(ctx, o->file, &o->kind))
		return 1;
	return cli_check_kind(ctx, o) | cli_check_values(ctx, o);
}

static int cmd_ir(moe_ctx *ctx, const opts *o)
{
	if (o->reproducer && !o->pipeline)
		return cli_fail("--reproducer needs --pipeline (no pass runs without one)%s", "");
	/* a dump asked for without a pipeline is of the default one, host */
	const char *pipeline = o->pipeline ? o->pipeline : o->after || o->before ? "host" : NULL;
	if (check_print_pass(ctx, "--print-ir-after", o->after, pipeline) |
		check_print_pass(ctx, "--print-ir-before", o->before, pipeline))
		return 1;
	if (cli_pass_machine(ctx, o))
		return 1;
	moe_module *m = cli_load(ctx, o);
	int status = !m || run_pipeline(ctx, m, pipeline, o) || write_output(ctx, m, o);
	moe_module_free(m);
	return status;
}

static int cmd_check(moe_ctx *ctx, const opts *o)
{
	if (o->kind == K_TCPB || o->kind == K_TCPS || o->kind == K_TSCHED) {
		if (o->nsets)
			return cli_fail("--set does not apply to a compiled .tcpb or .tcps (its sizes are fixed)%s", "");
		return cli_check_tcpb(ctx, o);
	}
	if (o->kind == K_EP_MANIFEST)
		return o->nsets ? cli_fail("--set does not apply to a manifest of compiled programs%s", "") :
				  cli_check_ep_manifest(ctx, o);
	if (o->machine)
		return cli_fail("--machine applies to a .tcpb only; %s is a layer", o->file);
	moe_module *m = cli_load(ctx, o);
	moe_module_free(m);
	return !m;
}

static int dispatch(moe_ctx *ctx, const opts *o)
{
	switch (o->cmdbit) {
	case C_PASSES: return cli_passes(ctx);
	case C_IMPORT: return cli_import_hf(ctx, o);
	case C_RUN: return cli_run(ctx, o);
	case C_COMPILE: return cli_compile(ctx, o);
	case C_CHECK: return cmd_check(ctx, o);
	case C_IR: return cmd_ir(ctx, o);
	default: break;
	}
	if (cli_check_target(ctx, o, o->target ? o->target : "host"))
		return 1;
	int64_t autob = 0;
	double pred = 0;
	int tcp = o->target && !strcmp(o->target, "tcp");
	cli_fit fit = {.total = -1};
	if (tcp && cli_tcp_fit(ctx, o, &fit))
		return 1; /* the error compile gives */
	if (fit.auto_b > 0) /* block=auto ran in cli_tcp_fit: its choice stands */
		autob = fit.auto_b, pred = fit.auto_pred;
	moe_module *m = !tcp ? cli_load(ctx, o) : autob > 0 ? cli_load_tcp_b(ctx, o, autob) : cli_load_tcp(ctx, o, &autob, &pred);
	int status = !m || cli_stats(ctx, m, o, autob, pred, tcp && fit.total >= 0 ? &fit : NULL);
	moe_module_free(m);
	return status;
}

/* A rank other than 0 of `mpirun ... moec run --ep N` on the host that
 * stopped before joining MPI: its errors come from the command line every
 * rank shares (options, paths, FILE), which rank 0 reports too, so they are
 * printed once, by rank 0. Such a rank waits before it exits: mpirun ends
 * the job when the first rank fails, and a rank 1 exiting first would take
 * rank 0 down before its message is out. A rank still alive after the wait
 * (rank 0 did not fail the same way) prints its own errors, so none is lost.
 * After MPI started each rank prints its own. */
enum { QUIET_RANK_WAIT_S = 20 };

static int quiet_rank(const opts *o)
{
	if (o->cmdbit != C_RUN || !o->ep || (o->target && !strcmp(o->target, "tcp")) || cli_ep_net_started())
		return 0;
	const char *v = getenv("OMPI_COMM_WORLD_RANK");
	if (!v)
		v = getenv("PMI_RANK");
	if (!v)
		v = getenv("PMIX_RANK");
	return v && atoi(v) > 0;
}

static int help(int argc, char **argv)
{
	if (argc == 2) {
		cli_usage(stdout);
		return 0;
	}
	if (!strcmp(argv[2], "--markdown")) {
		cli_markdown(stdout);
		return 0;
	}
	if (!strcmp(argv[2], "--option-table")) {
		cli_option_table(stdout);
		return 0;
	}
	const cli_command *c = cli_command_find(argv[2]);
	if (!c)
		return cli_fail("no command named '%s' (see moec --help)", argv[2]);
	cli_command_help(stdout, c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		cli_usage(stderr);
		return 1;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
		return help(argc, argv);
	if (!strcmp(argv[1], "--version")) {
		printf("moec %s\n", moe_version_string());
		return 0;
	}
	const cli_command *c = cli_command_find(argv[1]);
	if (!c) {
		const char *near = cli_suggest_command(argv[1]);
		if (near)
			fprintf(stderr, "moec: error: unknown command '%s'; did you mean '%s'? (see moec --help)\n", argv[1], near);
		else
			fprintf(stderr, "moec: error: unknown command '%s' (see moec --help)\n", argv[1]);
		return 1;
	}
	static opts o;
	int r = cli_parse(argc, argv, &o, c);
	if (r)
		return r < 0 ? 0 : 1;
	moe_cleanup_on_signals(); /* temporaries are removed on SIGINT/SIGTERM/SIGHUP */
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	if (!ctx)
		return cli_fail("out of memory%s", "");
	moe_ctx_set_diag_prefix(ctx, "moec");
	int status = moe_tcp_register_passes(ctx) != MOE_OK || cli_guard_paths(ctx, &o) || cli_guard_writable(ctx, &o) || classify(ctx, &o) ||
		     cli_check_applies(ctx, &o) || dispatch(ctx, &o);
	if (status && quiet_rank(&o))
		sleep(QUIET_RANK_WAIT_S);
	moe_diag_print(ctx, stderr);
	moe_ctx_free(ctx);
	return status ? 1 : 0;
}
