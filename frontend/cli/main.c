/* frontend/main.c: the moec command line, a thin client of the library.
 * moec COMMAND [options] FILE; every error is a diagnostic on stderr and a
 * non-zero exit status. Output files are written to a temporary name and
 * renamed into place. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/frontend.h"
#include "moec/ir.h"
#include "moec/passes.h"

#include "frontend/cli/cli.h"

static const struct command {
	const char *name, *usage, *help;
	int ready;
} commands[] = {
	{"check", "moec check FILE [--set NAME=VALUE]...\n       moec check FILE.tcpb [--machine FILE.json]",
		"Parse FILE (.moe, .moeir or .json IR) and check names, shapes and types; or validate a compiled\n"
		"TCP binary completely and print its summary (version, sections, tensors).\n", 1},
	{"ir", "moec ir FILE [--pipeline=P] [--print-ir-after=NAME|all] [--print-ir-before=NAME|all]\n"
	       "        [--format=text|json|dot] [-o OUT] [--set NAME=VALUE]...",
		"Print the IR of FILE, after running the pass pipeline P (default: none).\n", 1},
	{"stats", "moec stats FILE --json [--pipeline=P] [--set NAME=VALUE]...",
		"Print one JSON object: dims, FLOPs, weight bytes, the worst-case block grid (tight, seed and vLLM\n"
		"bounds with their block-buffer bytes) and the bytes of every intermediate buffer after lowering.\n", 1},
	{"compile", "moec compile FILE --target=tcp|c|obj|llvm-ir -o OUT [--set NAME=VALUE]...",
		"Lower FILE with the target's pipeline and emit TCP assembly/binary (.tcps/.tcpb by the extension\n"
		"of OUT), portable C, a native object file or textual LLVM IR.\n", 1},
	{"run", "moec run FILE --weights W.safetensors[,W2...] --input x.npy -o y.npy [--target=host|tcp]\n"
		"        [--engine=llvm|c|interp] [--stats FILE.json] [--repeat N] [--trace FILE.json]\n"
		"        [--machine FILE.json] [--no-skip] [--timing-only] [--threads N] [--kernels=auto|portable]\n"
		"        [--no-cache] [--set NAME=VALUE]...",
		"Run the layer of FILE (.moe, or a compiled .tcpb) on the input and write its output as f32 .npy.\n"
		"\n"
		"  --timing-only  (tcp) simulate the cycle counts only: the arithmetic of the expert blocks and of\n"
		"                 the combine is skipped, no output is written (no -o), and weights absent from the\n"
		"                 checkpoint (e.g. all expert weights) are allowed as long as routing does not\n"
		"                 need them; the cycle counts equal those of a full run.\n", 1},
	{"import-hf", "moec import-hf CONFIG.json [--layer N] [--tokens T] [--block B] [--set dtype=f32|bf16]\n"
		      "        [--ignore-quantization] -o FILE.moe\n"
		      "       moec import-hf --list [--markdown]",
		"Write the .moe of one MoE layer of a HuggingFace checkpoint; weights bind to the checkpoint's\n"
		"tensor names. --list prints the supported families and their recipes.\n", 1},
	{"passes", "moec passes", "List the registered passes, their options and the named pipelines.\n", 1},
};
#define NCOMMANDS (sizeof commands / sizeof *commands)

static void usage(FILE *f)
{
	fprintf(f, "usage: moec COMMAND [options] FILE\n\ncommands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-10s %s", commands[i].name, commands[i].help);
	fprintf(f, "\noptions for every command:\n"
		   "  --set NAME=VALUE  override a dim or param of the .moe file, or dtype=f32|bf16\n"
		   "  --help            help for the command\n"
		   "  --version         print the version\n");
}

static void cmd_help(const struct command *c)
{
	printf("usage: %s\n\n%s", c->usage, c->help);
	printf("\n  --set NAME=VALUE  override a dim or param (.moe input only); dtype=f32|bf16\n");
	if (!strcmp(c->name, "ir"))
		printf("  --pipeline=P      comma-separated passes to run\n"
		       "  --print-ir-after=NAME|all, --print-ir-before=NAME|all\n"
		       "                    print the IR around the named pass (to stderr)\n"
		       "  --reproducer=FILE if a pass fails, write the pipeline and its input IR to FILE\n"
		       "  --format=F        text (default), json or dot\n"
		       "  -o OUT            write to OUT instead of standard output\n");
	if (!strcmp(c->name, "import-hf")) {
		printf("  --layer N         the decoder layer (default 0); a dense layer's error names the nearest MoE layer\n"
		       "  --tokens T, --block B   the static token count (16) and expert block size (64)\n"
		       "  --set dtype=f32|bf16    the compute type (default: the config's torch_dtype / dtype)\n"
		       "  --ignore-quantization   import a quantized checkpoint's layer as if unquantized (its\n"
		       "                    shapes; without it, quantized experts are read by dequant)\n"
		       "  --list [--markdown]     print the family table (docs/families.md is --markdown)\n");
		moe_ctx *ctx = moe_ctx_new(NULL, NULL);
		char *names = NULL;
		if (ctx && moe_import_hf_families(ctx, MOE_HF_LIST_NAMES, &names) == MOE_OK)
			printf("\nmodel_types: %s\n", names);
		if (ctx)
			moe_free(ctx, names);
		moe_ctx_free(ctx);
	}
}

int cli_fail(const char *fmt, const char *arg)
{
	fprintf(stderr, "moec: ");
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	return 1;
}

/* Value of --opt=V or --opt V; advances *i. NULL when arg is not opt. */
static const char *optval(int argc, char **argv, int *i, const char *opt, int *bad)
{
	size_t n = strlen(opt);
	const char *a = argv[*i];
	if (strncmp(a, opt, n))
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n])
		return NULL;
	if (*i + 1 >= argc) {
		*bad = 1;
		cli_fail("option %s needs a value", opt);
		return NULL;
	}
	return argv[++*i];
}

static int parse_opts(int argc, char **argv, opts *o, const struct command *c)
{
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i], *v;
		int bad = 0;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			cmd_help(c);
			return -1;
		}
		if ((v = optval(argc, argv, &i, "--set", &bad))) {
			if (o->nsets == MAX_SETS)
				return cli_fail("too many --set options", "");
			if (!moe_setting_split(v, o->setnames[o->nsets], sizeof o->setnames[0], &o->sets[o->nsets].value))
				return cli_fail("--set needs NAME=VALUE, got '%s'", v);
			o->sets[o->nsets].name = o->setnames[o->nsets];
			o->nsets++;
		} else if ((v = optval(argc, argv, &i, "--pipeline", &bad))) {
			o->pipeline = v;
		} else if ((v = optval(argc, argv, &i, "--reproducer", &bad))) {
			o->reproducer = v;
		} else if ((v = optval(argc, argv, &i, "--print-ir-after", &bad))) {
			o->after = v;
		} else if ((v = optval(argc, argv, &i, "--print-ir-before", &bad))) {
			o->before = v;
		} else if ((v = optval(argc, argv, &i, "--format", &bad))) {
			o->format = v;
		} else if ((v = optval(argc, argv, &i, "-o", &bad))) {
			o->out = v;
		} else if ((v = optval(argc, argv, &i, "--weights", &bad))) {
			o->weights = v;
		} else if ((v = optval(argc, argv, &i, "--input", &bad))) {
			o->input = v;
		} else if ((v = optval(argc, argv, &i, "--target", &bad))) {
			o->target = v;
		} else if ((v = optval(argc, argv, &i, "--engine", &bad))) {
			o->engine = v;
		} else if ((v = optval(argc, argv, &i, "--stats", &bad))) {
			o->stats = v;
		} else if ((v = optval(argc, argv, &i, "--trace", &bad))) {
			o->trace = v;
		} else if ((v = optval(argc, argv, &i, "--machine", &bad))) {
			o->machine = v;
		} else if ((v = optval(argc, argv, &i, "--repeat", &bad))) {
			o->repeat = v;
		} else if ((v = optval(argc, argv, &i, "--threads", &bad))) {
			o->threads = v;
		} else if ((v = optval(argc, argv, &i, "--kernels", &bad))) {
			o->kernels = v;
		} else if (!strcmp(a, "--no-cache")) {
			o->no_cache = 1;
		} else if ((v = optval(argc, argv, &i, "--layer", &bad))) {
			o->layer = v;
		} else if ((v = optval(argc, argv, &i, "--tokens", &bad))) {
			o->tokens = v;
		} else if ((v = optval(argc, argv, &i, "--block", &bad))) {
			o->block = v;
		} else if (!strcmp(a, "--no-skip")) {
			o->no_skip = 1;
		} else if (!strcmp(a, "--timing-only")) {
			o->timing_only = 1;
		} else if (!strcmp(a, "--json")) {
			o->json = 1;
		} else if (!strcmp(c->name, "import-hf") && !strcmp(a, "--list")) {
			o->list = 1;
		} else if (!strcmp(c->name, "import-hf") && !strcmp(a, "--markdown")) {
			o->markdown = 1;
		} else if (!strcmp(c->name, "import-hf") && !strcmp(a, "--ignore-quantization")) {
			o->ignore_quantization = 1;
		} else if (bad) {
			return 1;
		} else if (a[0] == '-' && a[1]) {
			return cli_fail("unknown option '%s' (see moec COMMAND --help)", a);
		} else if (o->file) {
			return cli_fail("more than one input file ('%s')", a);
		} else {
			o->file = a;
		}
		if (bad)
			return 1;
	}
	if (!o->file && strcmp(c->name, "passes") && !o->list)
		return cli_fail("%s: no input file (see moec COMMAND --help)", c->name);
	if (o->format && strcmp(o->format, "text") && strcmp(o->format, "json") && strcmp(o->format, "dot"))
		return cli_fail("--format must be text, json or dot, got '%s'", o->format);
	if (strcmp(c->name, "ir") && (o->after || o->before || o->format))
		return cli_fail("--print-ir-* and --format apply to 'moec ir' only%s", "");
	if (strcmp(c->name, "ir") && strcmp(c->name, "stats") && o->pipeline)
		return cli_fail("--pipeline applies to 'moec ir' and 'moec stats' only%s", "");
	return 0;
}

int cli_ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

moe_module *cli_load(moe_ctx *ctx, const opts *o)
{
	size_t len = 0;
	char *text = NULL;
	/* stdin may be a pipe; a named input must be a regular file */
	if ((strcmp(o->file, "-") ? moe_read_file_max(ctx, o->file, CLI_MAX_SOURCE, &text, &len) :
				    moe_read_stream(ctx, "<stdin>", 0, CLI_MAX_SOURCE, &text, &len)) != MOE_OK)
		return NULL;
	const char *p = text;
	while (p < text + len && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
		p++;
	int json = cli_ends_with(o->file, ".json") || (!cli_ends_with(o->file, ".moe") && p < text + len && *p == '{');
	int moeir = cli_ends_with(o->file, ".moeir") ||
		(!cli_ends_with(o->file, ".moe") && (size_t)(text + len - p) >= 5 && !strncmp(p, "moeir", 5));
	moe_module *m;
	if (json || moeir) {
		if (o->nsets)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "--set applies only to .moe files");
		moe_ctx_add_source(ctx, o->file, text, len);
		m = o->nsets ? NULL :
		    json     ? moe_module_parse_json(ctx, o->file, text, len) :
		               moe_module_parse_text(ctx, o->file, text, len);
		if (m && moe_module_verify(ctx, m) != MOE_OK) {
			moe_module_free(m);
			m = NULL;
		}
	} else {
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
static int run_pipeline(moe_ctx *ctx, moe_module *m, const char *pipeline, const opts *o)
{
	if (!pipeline || !*pipeline)
		return 0;
	const char *named = moe_pipeline_named(pipeline);
	moe_run_opts ro = {.verify = 1, .print_before = o->before, .print_after = o->after, .print_to = stderr,
		.reproducer = o->reproducer};
	return moe_run_pipeline_text(ctx, named ? named : pipeline, m, &ro) != MOE_OK;
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
	if (!o->out || !strcmp(o->out, "-"))
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

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("moec %s\n", moe_version_string());
		return 0;
	}
	const struct command *c = NULL;
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (!strcmp(argv[1], commands[i].name))
			c = &commands[i];
	if (!c) {
		fprintf(stderr, "moec: unknown command '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}
	static opts o;
	o.cmd = c->name;
	int r = parse_opts(argc, argv, &o, c);
	if (r)
		return r < 0 ? 0 : 2;
	if (!c->ready) {
		fprintf(stderr, "moec: '%s' is not available yet\n", c->name);
		return 2;
	}
	moe_cleanup_on_signals(); /* temporaries are removed on SIGINT/SIGTERM */
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	if (!ctx)
		return cli_fail("out of memory%s", "");
	int status = 0;
	moe_module *m = NULL;
	int64_t autob = 0;
	double pred = 0;
	if (cli_guard_paths(ctx, &o))
		status = 1;
	else if (!strcmp(c->name, "passes"))
		status = cli_passes(ctx);
	else if (!strcmp(c->name, "import-hf"))
		status = cli_import_hf(ctx, &o);
	else if (!strcmp(c->name, "run"))
		status = cli_run(ctx, &o);
	else if (!strcmp(c->name, "compile"))
		status = cli_compile(ctx, &o);
	else if (!strcmp(c->name, "check") && cli_ends_with(o.file, ".tcpb"))
		status = cli_check_tcpb(ctx, &o);
	else if (!strcmp(c->name, "stats") && o.target && !strcmp(o.target, "tcp")) {
		m = cli_load_tcp(ctx, &o, &autob, &pred);
		status = m ? 0 : 1;
	} else {
		m = cli_load(ctx, &o);
		status = m ? 0 : 1;
	}
	if (m && !strcmp(c->name, "ir")) {
		status = run_pipeline(ctx, m, o.pipeline, &o);
		if (!status)
			status = write_output(ctx, m, &o);
	}
	if (m && !strcmp(c->name, "stats")) {
		const char *named = o.pipeline ? moe_pipeline_named(o.pipeline) : NULL;
		char *js = moe_module_stats_json(ctx, m, named ? named : o.pipeline);
		if (js && autob > 0 && js[0] == '{') /* block=auto: the choice and its predicted block-loop time */
			printf("{\n\t\"tcp_block\":\t{\"B\": %lld, \"auto\": true, \"predicted_block_loop_seconds\": %.6g},",
				(long long)autob, pred);
		status = !js || puts(js + (js && autob > 0 && js[0] == '{')) < 0;
		free(js);
	}
	moe_diag_print(ctx, stderr);
	moe_module_free(m);
	moe_ctx_free(ctx);
	return status;
}
