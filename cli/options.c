/* cli/options.c: the command and option tables of moec, the option
 * parser, every `--help` and docs/cli.md, all generated from the same rows
 * (options.def), so what the help says is what the parser accepts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const cli_command commands[] = {
	{"check", C_CHECK, "FILE [--set NAME=VALUE]...  |  moec check FILE.tcpb|FILE.tcps [--machine FILE.json]",
		"parse and verify a layer, or validate a compiled .tcpb or TCP assembly",
		"Parse FILE (.moe, .moeir or JSON IR) and check its names, shapes and types; or validate a compiled\n"
		"TCP binary (.tcpb) or TCP assembly (.tcps) completely and print its summary (version, sections,\n"
		"tensors). The kind of FILE is recognised by its content, not its name.",
		"moec check examples/mixtral_8x7b.moe --set T=1"},
	{"ir", C_IR, "FILE [--pipeline=P] [--print-ir-after=NAME|all] [--format=text|json|dot] [-o OUT]",
		"print the IR, optionally after a pass pipeline",
		"Print the IR of FILE, after running the pass pipeline P when one is given. The pass named by\n"
		"--print-ir-after/--print-ir-before must be one of the pipeline's (`moec passes` lists them).",
		"moec ir examples/mixtral_8x7b.moe --pipeline=host --print-ir-after=blockwise-dispatch"},
	{"stats", C_STATS, "FILE [--json] [--pipeline=P]",
		"dims, FLOPs, weight bytes, worst-case grid, host memory or TCP HBM fit and predicted time",
		"Print the layer's dims, FLOPs, weight bytes, the worst-case block grid (tight, seed and vLLM\n"
		"bounds with their block-buffer bytes) and the host's predicted peak memory: weights + packed\n"
		"copy (bf16 weights the AVX512-BF16 kernels read, on such a CPU) + workspace (the liveness plan\n"
		"of the layer function) + inputs and outputs; `moec run --stats` measures `peak_rss_bytes`.\n"
		"With --target=tcp the layer is compiled as `moec compile --target=tcp` compiles it (--set,\n"
		"--quant-act, --machine, block=auto, a serving layer's decode tier); where compile refuses,\n"
		"stats fails with compile's error. Then: the block size block=auto picks (its block-loop\n"
		"estimate), HBM needed against capacity (GiB), and the whole program's time predicted on\n"
		"expected loads (moe_tcp_predict, docs/api.md: the simulator's timeline and cost rules\n"
		"without data; each token routed to K distinct experts by a fixed seeded generator) with the\n"
		"roofline and their ratio; then the contract's floor (moe_tcp_floor, docs/tcp-isa.md section\n"
		"12: a lower bound on any program of the layer, for uniform routing's expected experts hit),\n"
		"its terms (roofline, chain, DMA context, main context) and the ratios predicted/floor and\n"
		"predicted/roofline. With --json, one JSON object: `host_memory` {`peak_bytes`,\n"
		"`weight_bytes`, `packed_bytes`, `packable_bytes`, `workspace_bytes`, `io_bytes`} (null when\n"
		"the host pipeline does not lower the layer; absent with --target=tcp), and with --target=tcp\n"
		"`tcp_block` {`B`, `auto`, `predicted_block_loop_seconds`}, `tcp_hbm` {`needed_bytes`,\n"
		"`weight_bytes`, `capacity_bytes`, `fits`} and `tcp_predict` {`loads` (\"expected\"),\n"
		"`seconds`, `roofline_seconds`, `roofline_ratio` (seconds / roofline), `nblocks`,\n"
		"`experts_hit`, `cycles`, `approximated_lds`, `approximated_index_lists`: reads the\n"
		"prediction approximated}, `tcp_floor` {`seconds`, `launch_end_seconds`, `roofline_seconds`,\n"
		"`chain_seconds`, `route_seconds`, `dma_seconds`, `main_seconds`, `binding` (the largest\n"
		"term: roofline, chain, dma or main), `loads` (\"expected\"), `tokens`, `experts_hit`,\n"
		"`weight_bytes`, `other_bytes`, `macs`, `mac_rate`, `vector_elements`, `dma_commands`,\n"
		"`main_commands`, `predicted_seconds`, `predicted_ratio` (predicted / floor),\n"
		"`roofline_ratio` (predicted / roofline)}. A run's own prediction and floor are `moec run\n"
		"--target=tcp --stats`'s `predicted_seconds` and `floor_seconds`. The sum of every IR value\n"
		"that the keys `buffers` and `buffer_bytes_total` gave is gone (no run holds them all at\n"
		"once).",
		"moec stats examples/mixtral_8x7b.moe --set T=512"},
	{"compile", C_COMPILE, "FILE -o OUT [--target=tcp|c|obj|llvm-ir]",
		"emit TCP code, C, a native object or LLVM IR",
		"Lower FILE with the target's pipeline and emit TCP assembly (.tcps) or a TCP binary (.tcpb),\n"
		"portable C (.c), a native object file (.o) or textual LLVM IR (.ll). Without --target the\n"
		"target follows the name of OUT; a --target that contradicts that name is an error. A TCP\n"
		"schedule (.tsched) compiles to TCP only: it is verified, placed and selected into a program.\n"
		"The schedule compiler rewrites the schedule by the rows of its rewrite table that predict a\n"
		"gain (`moec passes` lists them; docs/tcp-compiler.md 5.2), placed,\n"
		"and reordered by the list scheduler (the rewrite list-schedule, 5.4). --tcp-opt=-NAME switches\n"
		"a rewrite off, +NAME runs it wherever it applies; --tcp-opt=-list-schedule keeps sched-build's\n"
		"order, and MOEC_TCP_SCHEDULE=0 in the environment switches every rewrite off (compile, run and\n"
		"stats alike).",
		"moec compile examples/mixtral_8x7b.moe --set T=64 -o mixtral.tcpb"},
	{"run", C_RUN, "FILE --weights W.safetensors[,W2...] --input x.npy -o y.npy [--target=host|tcp]",
		"run a layer on the host or on the TCP simulator",
		"Run the layer of FILE (.moe, .moeir, JSON IR, a compiled .tcpb, TCP assembly .tcps or a TCP\n"
		"schedule .tsched) on the input and write its first output as f32 .npy. Every weight's shape and\n"
		"dtype is checked against the checkpoint's headers before any tensor data is read. With\n"
		"--target=tcp the per-expert weights are read, and packed, an expert at a time when the\n"
		"simulation first touches that expert.",
		"moec run mixtral.moe --weights model.safetensors --input x.npy -o y.npy --target=tcp --trace t.json"},
	{"import-hf", C_IMPORT, "CONFIG.json|MODEL_DIR -o FILE.moe [--layer N] [--tokens T] [--block B]  |  moec import-hf --list",
		"write the .moe of a HuggingFace MoE layer",
		"Write the .moe of one MoE layer of a HuggingFace checkpoint from its config.json, or the model\n"
		"directory holding it (the families are listed below and by --list); its weights bind to the\n"
		"checkpoint's tensor names, so `moec run --weights` takes the model's own safetensors (sharded\n"
		"ones through model.safetensors.index.json or their directory).",
		"moec import-hf config.json --layer 3 --tokens 32 -o layer3.moe"},
	{"passes", C_PASSES, "", "list the registered passes and the named pipelines",
		"List the registered passes, their options and the named pipelines.", "moec passes"},
};
#define NCOMMANDS (sizeof commands / sizeof *commands)

typedef struct cli_option {
	const char *name, *meta;
	size_t field;
	unsigned cmds;
	const char *only;
	unsigned inputs;
	const char *needs, *excludes, *help;
} cli_option;

static const cli_option options[] = {
#define OPT(name, meta, field, cmds, only, inputs, needs, excludes, help)                                            \
	{name, meta, offsetof(opts, field), cmds, only, inputs, needs, excludes, help},
#include "options.def"
#undef OPT
};
#define NOPTIONS (sizeof options / sizeof *options)

const cli_command *cli_command_find(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (!strcmp(name, commands[i].name))
			return &commands[i];
	return NULL;
}

int cli_fail(const char *fmt, const char *arg)
{
	fprintf(stderr, "moec: error: ");
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	return 1;
}

void cli_usage(FILE *f)
{
	fprintf(f, "usage: moec COMMAND [options] FILE\n\ncommands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\n`moec COMMAND --help` lists the options of a command; `moec --version` prints the version.\n");
}

static const char *inputs_text(unsigned inputs)
{
	return inputs == I_MOE ? "a .moe layer" : inputs == I_LAYER ? "a layer (.moe or IR)" :
	       inputs == I_TCPB ? "a compiled .tcpb" : "any input";
}

static void option_line(FILE *f, const cli_option *p)
{
	char head[80], rules[256] = "";
	snprintf(head, sizeof head, "%s%s%s", p->name, p->meta ? " " : "",
		p->meta ? p->meta : "");
	if (p->inputs != I_ALL && (p->cmds & (C_CHECK | C_RUN)))
		snprintf(rules + strlen(rules), sizeof rules - strlen(rules), "; FILE: %s", inputs_text(p->inputs));
	if (p->needs)
		snprintf(rules + strlen(rules), sizeof rules - strlen(rules), "; needs %s", p->needs);
	if (p->excludes)
		snprintf(rules + strlen(rules), sizeof rules - strlen(rules), "; not with %s", p->excludes);
	fprintf(f, "  %-30s %s%s%s%s%s%s%s\n", head, p->only ? "(" : "", p->only ? p->only : "", p->only ? ") " : "",
		p->help, *rules ? " [" : "", *rules ? rules + 2 : "", *rules ? "]" : "");
}

/* The model_types import-hf takes, from the importer's family table. */
static void family_names(FILE *f)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char *names = NULL;
	if (ctx && moe_import_hf_families(ctx, MOE_HF_LIST_NAMES, &names) == MOE_OK)
		fprintf(f, "\nmodel_types: %s\n", names);
	if (ctx)
		moe_free(ctx, names);
	moe_ctx_free(ctx);
}

void cli_command_help(FILE *f, const cli_command *c)
{
	fprintf(f, "usage: moec %s%s%s\n\n%s\n", c->name, *c->synopsis ? " " : "", c->synopsis, c->text);
	int any = 0;
	for (size_t i = 0; i < NOPTIONS; i++)
		if (options[i].cmds & c->bit) {
			if (!any++)
				fprintf(f, "\noptions:\n");
			option_line(f, &options[i]);
		}
	fprintf(f, "  %-30s %s\n", "--help", "print this help");
	if (c->bit == C_IMPORT)
		family_names(f);
	fprintf(f, "\nexample:\n  %s\n", c->example);
}

/* The meta of an enumerated value ("a|b|c", lower case) or NULL. */
static int enumerated(const char *meta)
{
	return meta && strchr(meta, '|') && strspn(meta, "abcdefghijklmnopqrstuvwxyz0123456789-|") == strlen(meta);
}

/* The edit distance of a and b (insert, delete, substitute, transpose), at
 * most 64 characters each compared; large when longer. */
static size_t edit_distance(const char *a, const char *b)
{
	size_t n = strlen(a), m = strlen(b);
	if (n > 64 || m > 64)
		return 1000;
	size_t d[65][65];
	for (size_t i = 0; i <= n; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= m; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= n; i++)
		for (size_t j = 1; j <= m; j++) {
			size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
			if (d[i - 1][j] + 1 < best)
				best = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < best)
				best = d[i][j - 1] + 1;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
				best = d[i - 2][j - 2] + 1;
			d[i][j] = best;
		}
	return d[n][m];
}

/* The closest of names[0..n) to word within a third of its length (at least
 * 1, at most 3 edits), or NULL. */
static const char *closest(const char *word, const char *const *names, size_t n)
{
	size_t len = strlen(word), limit = len / 3 < 1 ? 1 : len / 3 > 3 ? 3 : len / 3, best = limit + 1;
	const char *pick = NULL;
	for (size_t i = 0; i < n; i++) {
		size_t d = edit_distance(word, names[i]);
		if (d < best)
			best = d, pick = names[i];
	}
	return pick;
}

static int check_enum(const cli_option *p, const char *v)
{
	size_t n = strlen(v);
	for (const char *s = p->meta; *s;) {
		size_t k = strcspn(s, "|");
		if (k == n && !strncmp(s, v, n))
			return 0;
		s += k + (s[k] == '|');
	}
	char list[128] = "";
	for (const char *s = p->meta; *s;) {
		size_t k = strcspn(s, "|");
		snprintf(list + strlen(list), sizeof list - strlen(list), "%s%.*s", !*list ? "" : s[k] ? ", " : " or ",
			(int)k, s);
		s += k + (s[k] == '|');
	}
	const char *names[16];
	char words[16][32];
	size_t nn = 0;
	for (const char *s = p->meta; *s && nn < 16;) {
		size_t k = strcspn(s, "|");
		snprintf(words[nn], sizeof words[nn], "%.*s", (int)k, s);
		names[nn] = words[nn], nn++;
		s += k + (s[k] == '|');
	}
	const char *near = closest(v, names, nn);
	if (near)
		fprintf(stderr, "moec: error: %s must be %s, got '%s'; did you mean '%s'?\n", p->name, list, v, near);
	else
		fprintf(stderr, "moec: error: %s must be %s, got '%s'\n", p->name, list, v);
	return 1;
}

/* The row for argument a of command c; *val its value (from "=V" or the next
 * argument). NULL with *err set on an error; NULL otherwise when a is not an
 * option of any command. */
static const cli_option *match(const char *a, const cli_command *c, int *err)
{
	const cli_option *other = NULL;
	for (size_t i = 0; i < NOPTIONS; i++) {
		const cli_option *p = &options[i];
		size_t n = strlen(p->name);
		if (strncmp(a, p->name, n) || (a[n] && !(a[n] == '=' && p->meta)))
			continue;
		if (p->cmds & c->bit)
			return p;
		other = p;
	}
	if (other) {
		char users[96] = "";
		for (size_t i = 0; i < NOPTIONS; i++)
			for (size_t k = 0; k < NCOMMANDS; k++)
				if (!strcmp(options[i].name, other->name) && (options[i].cmds & commands[k].bit) &&
					!strstr(users, commands[k].name))
					snprintf(users + strlen(users), sizeof users - strlen(users), "%s%s", *users ? ", " : "",
						commands[k].name);
		fprintf(stderr, "moec: error: %s does not apply to moec %s (it is an option of moec %s)\n", other->name,
			c->name, users);
		*err = 1;
	}
	return NULL;
}

static int add_set(opts *o, const char *v)
{
	if (o->nsets == MAX_SETS)
		return cli_fail("too many --set options%s", "");
	if (!moe_setting_split(v, o->setnames[o->nsets], sizeof o->setnames[0], &o->sets[o->nsets].value))
		return cli_fail("--set needs NAME=VALUE, got '%s'", v);
	o->sets[o->nsets].name = o->setnames[o->nsets];
	o->nsets++;
	return 0;
}

static int take(int argc, char **argv, int *i, opts *o, const cli_option *p)
{
	const char *a = argv[*i], *v = p->name;
	size_t n = strlen(p->name);
	if (p->meta) {
		if (a[n] == '=')
			v = a + n + 1;
		else if (*i + 1 < argc)
			v = argv[++*i];
		else
			return cli_fail("option %s needs a value", p->name);
	}
	const char **slot = (const char **)((char *)o + p->field);
	if (!strcmp(p->name, "--set"))
		return add_set(o, v);
	if (*slot)
		return cli_fail("option %s is given twice", p->name);
	if (enumerated(p->meta) && check_enum(p, v))
		return 1;
	*slot = v;
	return 0;
}

const char *cli_suggest_command(const char *word)
{
	const char *names[NCOMMANDS];
	for (size_t i = 0; i < NCOMMANDS; i++)
		names[i] = commands[i].name;
	return closest(word, names, NCOMMANDS);
}

/* The option of command c closest to a (its "=value" left out), or NULL. */
static const char *suggest_option(const char *a, const cli_command *c)
{
	char word[72];
	snprintf(word, sizeof word, "%.*s", (int)strcspn(a, "="), a);
	const char *names[NOPTIONS];
	size_t n = 0;
	for (size_t i = 0; i < NOPTIONS; i++)
		if (options[i].cmds & c->bit)
			names[n++] = options[i].name;
	return closest(word, names, n);
}

int cli_parse(int argc, char **argv, opts *o, const cli_command *c)
{
	o->cmd = c->name;
	o->cmdbit = c->bit;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			cli_command_help(stdout, c);
			return -1;
		}
		int err = 0;
		const cli_option *p = match(a, c, &err);
		if (err)
			return 1;
		if (p) {
			if (take(argc, argv, &i, o, p))
				return 1;
		} else if (a[0] == '-' && a[1]) {
			const char *near = suggest_option(a, c);
			if (near)
				fprintf(stderr, "moec: error: unknown option '%s'; did you mean '%s'? (see moec %s --help)\n", a,
					near, c->name);
			else
				fprintf(stderr, "moec: error: unknown option '%s' (see moec %s --help)\n", a, c->name);
			return 1;
		} else if (o->file) {
			return cli_fail("more than one input file ('%s')", a);
		} else {
			o->file = a;
		}
	}
	if (o->file && (c->bit == C_PASSES || o->list))
		return cli_fail("this takes no file ('%s')", o->file);
	o->sched_opts = o->tcp_opt;
	if (o->tcp_reuse) { /* the schedule compiler reads it as a --tcp-opt item */
		static char joined[4096];
		snprintf(joined, sizeof joined, "%s%sreuse=%s", o->tcp_opt ? o->tcp_opt : "", o->tcp_opt ? "," : "",
			o->tcp_reuse);
		o->sched_opts = joined;
	}
	if (o->markdown && !o->list)
		return cli_fail("--markdown goes with --list%s", "");
	if (!o->file && c->bit != C_PASSES && !o->list) {
		fprintf(stderr, "moec: error: %s: no input file (see moec %s --help)\n", c->name, c->name);
		return 1;
	}
	return 0;
}

int cli_check_target(moe_ctx *ctx, const opts *o, const char *target)
{
	int bad = 0;
	for (size_t i = 0; i < NOPTIONS; i++) {
		const cli_option *p = &options[i];
		if (!(p->cmds & o->cmdbit) || !p->only || !strcmp(p->only, target) ||
			!*(const char *const *)((const char *)o + p->field))
			continue;
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "%s applies to --target=%s only, not %s", p->name,
			p->only, target);
		bad = 1;
	}
	return bad;
}

/* Whether the option of row p (a command of o's) was given. */
static int given(const opts *o, const cli_option *p)
{
	if (!strcmp(p->name, "--set"))
		return o->nsets > 0;
	return *(const char *const *)((const char *)o + p->field) != NULL;
}

/* The row of option `name` for command bit `cmd`, or NULL. */
static const cli_option *row_of(const char *name, size_t n, unsigned cmd)
{
	for (size_t i = 0; i < NOPTIONS; i++)
		if ((options[i].cmds & cmd) && strlen(options[i].name) == n && !strncmp(options[i].name, name, n))
			return &options[i];
	return NULL;
}

static unsigned input_of(cli_kind k)
{
	switch (k) {
	case K_UNREAD:
	case K_MOE: return I_MOE;
	case K_MOEIR:
	case K_IR_JSON: return I_IR;
	case K_TCPB:
	case K_TCPS:
	case K_TSCHED: return I_TCPB; /* a program's input: its sizes are fixed */
	default: return 0; /* not a layer: the command's own input (import-hf's config) */
	}
}

int cli_check_applies(moe_ctx *ctx, const opts *o)
{
	static const char *const kind_names[] = {[K_MOE] = "a .moe layer", [K_MOEIR] = "textual IR",
		[K_IR_JSON] = "JSON IR", [K_TCPB] = "a compiled .tcpb", [K_TCPS] = "TCP assembly (.tcps)",
		[K_TSCHED] = "a TCP schedule (.tsched)"};
	unsigned in = o->file ? input_of(o->kind) : 0;
	int bad = 0;
	for (size_t i = 0; i < NOPTIONS; i++) {
		const cli_option *p = &options[i];
		if (!(p->cmds & o->cmdbit) || !given(o, p))
			continue;
		if (in && !(p->inputs & in) && o->kind != K_UNREAD) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "%s does not apply to %s; it applies to %s only",
				p->name, kind_names[o->kind], inputs_text(p->inputs));
			bad = 1;
		}
		const cli_option *need = p->needs ? row_of(p->needs, strlen(p->needs), o->cmdbit) : NULL;
		if (need && !given(o, need)) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "%s needs %s%s%s (without it, it does nothing)",
				p->name, need->name, need->meta ? " " : "", need->meta ? need->meta : "");
			bad = 1;
		}
		for (const char *x = p->excludes; x && *x;) {
			size_t n = strcspn(x, ",");
			const cli_option *q = row_of(x, n, o->cmdbit);
			if (q && given(o, q)) {
				moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "%s does not go with %s (with %s, %s is not used)",
					p->name, q->name, p->name, q->name);
				bad = 1;
			}
			x += n + (x[n] == ',');
		}
	}
	return bad;
}

static void names_of(FILE *f, unsigned cmds)
{
	int any = 0;
	for (size_t k = 0; k < NCOMMANDS; k++)
		if (cmds & commands[k].bit)
			fprintf(f, "%s%s", any++ ? "," : "", commands[k].name);
}

void cli_option_table(FILE *f)
{
	for (size_t i = 0; i < NOPTIONS; i++) {
		const cli_option *p = &options[i];
		fprintf(f, "%s\t%s\t", p->name, p->meta ? p->meta : "-");
		names_of(f, p->cmds);
		char in[16] = "";
		snprintf(in, sizeof in, "%s%s%s", p->inputs & I_MOE ? ",moe" : "", p->inputs & I_IR ? ",ir" : "",
			p->inputs & I_TCPB ? ",tcpb" : "");
		fprintf(f, "\t%s\t%s\t%s\t%s\n", p->only ? p->only : "-", in + 1, p->needs ? p->needs : "-",
			p->excludes ? p->excludes : "-");
	}
}

/* ---- docs/cli.md ---- */
static const char *const md_intro =
	"# The moec command line\n"
	"\n"
	"<!-- Generated by `moec help --markdown` from cli/options.def and\n"
	"     cli/options.c; tests/lit/cli/help.test keeps this file equal to it. -->\n"
	"\n"
	"`moec COMMAND [options] FILE`. Every option belongs to the commands listed under it;\n"
	"an option given to another command, an option for another target (`--trace` on the\n"
	"host, `--engine` on TCP), an option given twice, or a value outside its list is an error.\n"
	"So is an option given for a kind of FILE it does not apply to (`[FILE: a .moe layer]`:\n"
	"not a compiled `.tcpb`), without the option it needs (`[needs --ep]`) or with one it\n"
	"excludes (`[not with ...]`): no option is accepted and ignored. The rules are one table\n"
	"(cli/options.def; `moec help --option-table` prints it).\n"
	"Errors are printed as `file:line:col: error: message` (with the source line when there\n"
	"is one); moec stops after 20 errors and exits with status 1.\n"
	"\n"
	"Input files are recognised by their content before their name: `.moe` text, textual IR\n"
	"(`moeir 1`, also a `--reproducer` file), JSON IR (`\"format\": \"moeir\"`), a compiled\n"
	"`.tcpb` (magic `MOECTCPB`), a TCP schedule (`tcpsched 1` after any `#` comment lines,\n"
	"`.tsched`, docs/tcp-compiler.md 4.2: `check`, `compile` and `run` read it on the TCP target,\n"
	"verify it, place its buffers and select it into a program, then treat that program as a\n"
	"`.tcpb`; the options of a `.tcpb` apply to it). A file of another kind (a NumPy array, a safetensors\n"
	"checkpoint or its index, a HuggingFace `config.json`, a machine description, a trace,\n"
	"TCP assembly, C, LLVM IR, an object file) gets one line naming what it looks like and\n"
	"which command takes it.\n"
	"\n"
	"`-o -` writes text outputs (IR, C, LLVM IR, TCP assembly, `.moe`) to standard output.\n"
	"Every file moec writes goes to a temporary name and is renamed into place, with mode\n"
	"0644 less the umask. A command that writes several files (`run`'s `-o`, `--stats` and\n"
	"`--trace`; `compile --ep`'s programs and manifest) writes them all to temporaries and\n"
	"renames them only when every one was written, a manifest last; an error or a signal\n"
	"removes them. No output, nor a name derived from `-o`, may be an input.\n";

void cli_markdown(FILE *f)
{
	fputs(md_intro, f);
	fprintf(f, "\n| command | what it does |\n|---|---|\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "| [`moec %s`](#moec-%s) | %s |\n", commands[i].name, commands[i].name, commands[i].summary);
	for (size_t i = 0; i < NCOMMANDS; i++) {
		fprintf(f, "\n## moec %s\n\n```text\n", commands[i].name);
		cli_command_help(f, &commands[i]);
		fprintf(f, "```\n");
	}
}
