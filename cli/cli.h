/* cli/cli.h: shared state of the moec command's subcommands. */
#ifndef MOEC_CLI_H
#define MOEC_CLI_H

#include <stddef.h>

#include "moec/moec.h"

#define MAX_SETS 256

/* The commands, as bits of the option table's `commands` column. */
enum {
	C_CHECK = 1u << 0,
	C_IR = 1u << 1,
	C_STATS = 1u << 2,
	C_COMPILE = 1u << 3,
	C_RUN = 1u << 4,
	C_IMPORT = 1u << 5,
	C_PASSES = 1u << 6,
};

/* The kinds of input an option applies to (the table's `inputs` column). */
enum {
	I_MOE = 1u << 0,  /* .moe text (also standard input or a FIFO, whose kind is not known before it is read) */
	I_IR = 1u << 1,   /* textual or JSON IR */
	I_TCPB = 1u << 2, /* a compiled .tcpb */
	I_LAYER = I_MOE | I_IR,
	I_ALL = I_MOE | I_IR | I_TCPB,
};

/* What a file holds, by its content (cli/sniff.c). */
typedef enum cli_kind {
	K_UNREAD,       /* not a regular file (stdin, FIFO, device): its reader decides */
	K_MOE,          /* .moe text (anything not recognised as another kind) */
	K_MOEIR,        /* textual IR, also a --reproducer file */
	K_IR_JSON,      /* {"format": "moeir", ...} */
	K_JSON,         /* other JSON (or broken JSON): the command's reader decides */
	K_TCPB,         /* MOECTCPB magic */
	K_TCPS,         /* "tcps 1" TCP assembly */
	K_NPY,          /* \x93NUMPY */
	K_SAFETENSORS,  /* u64 header size + JSON header */
	K_CK_INDEX,     /* {"weight_map": ...} */
	K_HF_CONFIG,    /* {"model_type": ...} or {"architectures": ...} */
	K_MACHINE,      /* {"clock_hz": ..., "slices_per_cluster": ...} */
	K_TRACE,        /* {"traceEvents": ...} */
	K_C,            /* C source */
	K_LLVM_IR,      /* "; ModuleID" */
	K_ELF,          /* \x7fELF: an object file */
	K_BINARY,       /* other bytes that are not text */
	K_EP_MANIFEST,  /* {"ep": ..., "programs": ..., "exchanges": ...}: compile --ep's OUT.ep.json */
	K_TSCHED,       /* "tcpsched 1" after '#' comments: a TCP schedule (.tsched) */
} cli_kind;

/* Every value is a string; flags hold their own spelling when given. */
typedef struct opts {
	const char *cmd;
	unsigned cmdbit;
	const char *file;
	cli_kind kind;        /* of file, by content */
	const char *out;      /* -o */
	const char *pipeline; /* --pipeline */
	const char *after, *before;
	const char *reproducer; /* --reproducer */
	const char *format;     /* text, json, dot */
	const char *json;       /* stats --json */
	const char *weights, *input, *target, *engine, *stats, *trace, *machine, *repeat;
	const char *layer, *tokens, *block; /* import-hf */
	const char *no_skip;
	const char *timing_only; /* run --timing-only */
	const char *progress;    /* run --progress=auto|on|off (tcp) */
	const char *sim_order;   /* run --sim-order=tensor|bytes (tcp) */
	const char *quant_act;   /* --quant-act=bf16|fp8 (tcp) */
	const char *list, *markdown, *ignore_quantization; /* import-hf */
	const char *set;         /* the last --set (the table's field; all of them are in sets) */
	const char *threads, *kernels, *no_cache, *cold; /* run --threads N, --kernels=auto|portable, --no-cache, --cold (host) */
	const char *ep, *placement; /* run --ep N [--placement D0,D1,...] (expert parallelism) */
	const char *serve_tokens; /* run --tokens N */
	const char *buckets;      /* compile --buckets T1,T2,... */
	const char *decode_tier;  /* --decode-tier=on|off (tcp serving) */
	const char *emit;         /* compile --emit=tcp-sched (tcp) */
	const char *tcp_opt;      /* --tcp-opt=-NAME,+NAME (the schedule compiler's rewrites) */
	const char *tcp_reuse;    /* --tcp-reuse=ordered|unordered */
	const char *sched_opts;   /* what the schedule compiler reads: tcp_opt, with tcp_reuse as its `reuse=` item */
	moe_setting sets[MAX_SETS];
	char setnames[MAX_SETS][128];
	size_t nsets;
} opts;

/* ---- the option table and help (cli/options.c) ---- */
typedef struct cli_command {
	const char *name;
	unsigned bit;
	const char *synopsis; /* after "moec NAME " */
	const char *summary;  /* one line for `moec --help` */
	const char *text;     /* the paragraph of `moec NAME --help` */
	const char *example;
} cli_command;

const cli_command *cli_command_find(const char *name);
/* The command closest to a misspelt name (edit distance), or NULL. */
const char *cli_suggest_command(const char *word);
void cli_usage(FILE *f);
void cli_command_help(FILE *f, const cli_command *c);
/* docs/cli.md, generated from the tables. */
void cli_markdown(FILE *f);
/* Parses argv[2..]; 0 ok, -1 when help was printed, 1 after an error. */
int cli_parse(int argc, char **argv, opts *o, const cli_command *c);
/* Options given that apply only to another target than `target`: an error. */
int cli_check_target(moe_ctx *ctx, const opts *o, const char *target);
/* Options given that do not apply to the kind of FILE, that lack the option
 * they need, or that are given with one they exclude: an error each (1). */
int cli_check_applies(moe_ctx *ctx, const opts *o);
/* The option table as text, one row a line (moec help --option-table):
 * spelling, metavar, commands, target, inputs, needs, excludes, tab-separated. */
void cli_option_table(FILE *f);

/* ---- input recognition (cli/sniff.c) ---- */
cli_kind cli_sniff(const char *data, size_t len);
/* Reads the start of a regular file and classifies it (other files are left
 * to the reader: K_UNREAD); 1 after a diagnostic if it cannot be read. */
int cli_sniff_file(moe_ctx *ctx, const char *path, cli_kind *kind);
/* An error "this looks like ...; use `moec ...`" when `kind` is not what
 * the command takes; 0 when it is. */
int cli_check_kind(moe_ctx *ctx, const opts *o);
/* The same for the files of --weights and --input: one that is surely
 * another option's (an .npy given to --weights, a checkpoint to --input) is
 * an error naming what it looks like (1). */
int cli_check_values(moe_ctx *ctx, const opts *o);

#define CLI_MAX_PATHS 64               /* --weights and --input items */
#define CLI_MAX_SOURCE ((size_t)256 << 20) /* a .moe, .moeir or IR .json */

int cli_fail(const char *fmt, const char *arg);
/* Before any input is read: outputs that are inputs or each other, and path
 * lists longer than CLI_MAX_PATHS, are errors (1). */
int cli_guard_paths(moe_ctx *ctx, const opts *o);
/* Before any input is read: every output's directory exists and is
 * writable, and no output names a directory (1 after an error each). */
int cli_guard_writable(moe_ctx *ctx, const opts *o);
/* The same for outputs a command derives from -o (compile --ep's OUT.chip<d>...):
 * an error naming both when one is an input. */
int cli_guard_derived(moe_ctx *ctx, const opts *o, const char *const *outs, size_t n);
int cli_ends_with(const char *s, const char *suf);
/* True for "-o -": the output goes to standard output. */
int cli_is_stdout(const char *out);
moe_module *cli_load(moe_ctx *ctx, const opts *o);
/* Binds the graph's inputs from --input (x.npy, or NAME=x.npy,...); checks shapes. */
int cli_bind_inputs(moe_ctx *ctx, const moe_graph *g, const char *spec, moe_tensor_map *bind, int64_t tokens);

/* Serving, `run --tokens N` (cli/serve.c): N (-1 when absent, -2
 * after an error); the n_tokens input added to a layer without one (before
 * lowering); N bound to it; an input of N rows padded to the node's shape;
 * the first N rows of an output (the tensors given are freed). */
int64_t cli_tokens(moe_ctx *ctx, const opts *o);
int cli_serve_prepare(moe_ctx *ctx, moe_graph *g, const opts *o);
int cli_serve_bind(moe_ctx *ctx, const moe_graph *g, const opts *o, moe_tensor_map *bind);
moe_tensor *cli_serve_pad(moe_ctx *ctx, moe_tensor *t, const int64_t *shape, int64_t tokens);
moe_tensor *cli_serve_rows(moe_ctx *ctx, moe_tensor *y, int64_t tokens);
/* The decode tier of a serving program p compiled from g (docs/tcp-isa.md
 * 7.4, "Decode tier"): *p is replaced by p with the layer compiled for T = 1 linked in, or
 * kept when the tier does not apply; 1 after an error. */
int cli_serve_tier(moe_ctx *ctx, const opts *o, const moe_graph *g, const moe_tcp_machine *m, moe_tcp_program **p);
/* --machine: the machine the TCP graph passes decide for (moe_tcp_set_pass_machine);
 * 1 after a diagnostic when it cannot be loaded, 0 without the option */
int cli_pass_machine(moe_ctx *ctx, const opts *o);
/* compile --buckets: one program per bucket into one .tcpb; is FILE a
 * bucketed .tcpb; the program of the smallest bucket >= --tokens (NULL with
 * an error when there is none). */
int cli_compile_buckets(moe_ctx *ctx, const opts *o, const char *out);
int cli_is_bundle_file(const char *path);
const moe_tcp_program *cli_bundle_pick(moe_ctx *ctx, const moe_tcp_bundle *b, const opts *o);
/* Binds the weights from the checkpoint files; with --timing-only, absent ones
 * are bound without values (MOE_WEIGHTS_ALLOW_ABSENT) and counted on stderr.
 * With keep (a TCP run computing outputs): per-expert weights are checked but
 * deferred (MOE_WEIGHTS_DEFER) and *keep is the open checkpoint the run reads
 * them from (the caller closes it). */
int cli_load_weights(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t np, const opts *o,
	moe_tensor_map *bind, moe_checkpoint **keep);
/* Monotonic seconds; a stats JSON object (malloc'ed, replaced) with
 * load_seconds, peak_rss_bytes (this process's, so far) and, when
 * bucket > 0, bucket_tokens added as its last members. */
double cli_now(void);
char *cli_stats_add(char *js, double load_seconds, int64_t bucket);
/* Copies the file written at tmp to standard output and removes it. */
int cli_cat_and_remove(moe_ctx *ctx, const char *tmp);

int cli_passes(moe_ctx *ctx);
int cli_import_hf(moe_ctx *ctx, const opts *o);
int cli_run(moe_ctx *ctx, const opts *o);
/* run --ep N (cli/ep.c) and its MPI transport (ep_mpi.c): init
 * reports this process's rank and the ranks running; agree returns nonzero
 * when any rank failed (failed: this one did), after which no collective
 * follows; gather collects each rank's bytes at rank 0, in rank order. */
int cli_run_ep(moe_ctx *ctx, const opts *o);
int cli_compile_ep(moe_ctx *ctx, const opts *o);
struct moe_host_opts;
int cli_ep_host_run(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, const struct moe_host_opts *ho,
	const moe_exchange *x, moe_tensor **out, struct moe_host_stats *sum);
int cli_ep_net_init(moe_ctx *ctx, int *rank, int *size);
/* Whether this process joined MPI (cli_ep_net_init succeeded). */
int cli_ep_net_started(void);
int cli_ep_net_agree(moe_ctx *ctx, int failed);
moe_status cli_ep_all_to_all(void *ud, moe_ctx *ctx, const void *send, const int64_t *counts, size_t row_bytes,
	void *recv, int64_t cap, int64_t *got);
int cli_ep_net_gather(moe_ctx *ctx, const void *mine, size_t bytes, void *all, size_t all_bytes);
void cli_ep_net_finish(void);
/* The ranks' agreement before computing (cli/ep_digest.c): a hash
 * per field of what every rank must share; the first collective gathers
 * every rank's vector and failure flag. compare: -1 when a rank failed (as
 * agree), 0 when every rank's vector equals rank 0's, 1 when one does not
 * (*rank: the first such rank, *mask: the fields that differ), after which
 * no collective follows but stop (prints this rank's diagnostics whole and
 * waits for every rank). */
enum { CLI_EP_DIMS, CLI_EP_DTYPE, CLI_EP_LAYER, CLI_EP_PIPELINE, CLI_EP_PLACEMENT, CLI_EP_ENGINE, CLI_EP_TOKENS,
	CLI_EP_WEIGHTS, CLI_EP_INPUT, CLI_EP_DIGESTS };
extern const char *const cli_ep_digest_names[CLI_EP_DIGESTS];
int cli_ep_digest(moe_ctx *ctx, const opts *o, const moe_module *m, int64_t N, const char *pipeline, int64_t tokens,
	uint64_t d[CLI_EP_DIGESTS]);
int cli_ep_net_compare(moe_ctx *ctx, int failed, const uint64_t *d, int nd, int *rank, unsigned *mask);
void cli_ep_net_stop(moe_ctx *ctx);
int cli_compile(moe_ctx *ctx, const opts *o);
/* The HBM a layer's TCP program places (total < 0: not compiled) against
 * the machine's capacity, in bytes. */
typedef struct cli_fit {
	int64_t total, weights;
	double capacity;
	/* the whole program's time predicted on expected loads (moe_tcp_predict;
	 * predicted 0: not predicted) */
	int predicted;
	moe_tcp_prediction pred;
	/* the contract's floor on expected loads (moe_tcp_floor; floored 0: none) */
	int floored;
	moe_tcp_floor_terms floor;
	/* the B block=auto chose for the layer (0: none) and its predicted
	 * block-loop seconds, as cli_load_tcp gives them */
	int64_t auto_b;
	double auto_pred;
} cli_fit;
/* stats --target=tcp: the layer compiled as `compile` compiles it (its
 * decode tier linked), so a layer compile refuses fails here with the same
 * error (1); then its time predicted. */
int cli_tcp_fit(moe_ctx *ctx, const opts *o, cli_fit *fit);
/* autob > 0: the block size block=auto chose, pred its predicted block-loop
 * seconds; fit: the TCP program's HBM, or NULL. */
int cli_stats(moe_ctx *ctx, const moe_module *m, const opts *o, int64_t autob, double pred, const cli_fit *fit);

/* TCP target (cli/tcp.c). */
/* block=auto for the TCP target; *chosen: the B picked (0: none). */
moe_module *cli_load_tcp(moe_ctx *ctx, const opts *o, int64_t *chosen, double *pred);
/* The layer as cli_load_tcp loads it when block=auto chose B > 0 (without
 * choosing again). */
moe_module *cli_load_tcp_b(moe_ctx *ctx, const opts *o, int64_t B);
/* --quant-act: an error (1) unless m has a block-FP8 dequant; =fp8 sets act=fp8 on
 * every one (also each chip's layer under --ep). */
int cli_quant_act(moe_ctx *ctx, const opts *o, moe_module *m);
/* The program of g (after the tcp pipeline) for m by the schedule compiler,
 * its rewrites switched by --tcp-opt (NULL after an error). */
moe_tcp_program *cli_tcp_program(moe_ctx *ctx, const opts *o, const moe_graph *g, const moe_tcp_machine *m);
int cli_compile_tcp(moe_ctx *ctx, const moe_graph *g, const opts *o, const char *out);
/* ck: the checkpoint deferred weights are read from (cli_load_weights), or NULL. */
int cli_run_tcp(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, moe_checkpoint *ck, const opts *o,
	moe_tensor **out, char **stats_json);
int cli_run_tcpb(moe_ctx *ctx, const opts *o);
int cli_check_tcpb(moe_ctx *ctx, const opts *o);
/* compile FILE.tsched: the schedule read, verified and selected into a
 * program (moe_tcp_from_sched), written to -o (.tcpb, .tcps or - for its
 * assembly). */
int cli_compile_tsched(moe_ctx *ctx, const opts *o);
/* moec check OUT.ep.json: the manifest and every program it names, each
 * validated as a .tcpb; a line per chip. */
int cli_check_ep_manifest(moe_ctx *ctx, const opts *o);

#endif
