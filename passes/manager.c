/* passes/manager.c: pass registry, pipeline text (parse/print), the runner
 * with verification, IR dumps before/after passes and failure reproducers. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "moec/io.h"
#include "passes/pass.h"

static const moe_pass_option topk_opts[] = {
	{"mode", MOE_PASS_OPT_ENUM, "packed16|exact", "packed16 for bf16 scores, exact otherwise",
		"how scores are ranked: 16-bit packed keys or exact f32 comparisons"},
	{"chunk", MOE_PASS_OPT_COUNT, NULL, "33554432", "split the rows so each rank compare has at most N elements"},
	{"select", MOE_PASS_OPT_ENUM, "rank|iter|auto", "auto", "rank: the E x E compare; iter: K rounds of max, lowest "
		"index and mask over E; auto: the one moving fewer elements"},
	{NULL, 0, NULL, NULL, NULL},
};
static const moe_pass_option dispatch_opts[] = {
	{"grid", MOE_PASS_OPT_ENUM, "tight|seed|vllm", "tight", "the worst-case block grid bound (docs/semantics.md)"},
	{"chunk", MOE_PASS_OPT_COUNT, NULL, "33554432", "combine in token chunks of at most N gathered elements (default: "
		"33554432, or the graph's combine_chunk where that is less: a target's bound, such as tcp-combine-chunk's)"},
	{"combine", MOE_PASS_OPT_ENUM, "reduce|chain", "reduce", "chain: a combine chunk of at least 2^17 row elements sums "
		"over K by K adds in slot order (the same sums; TCP fetches each slot's rows contiguously)"},
	{"counts", MOE_PASS_OPT_ENUM, "reduce|scan", "reduce", "scan: tokens per expert = the last row of the pairs' "
		"exclusive scan plus the last pair (one pass over [T K, E] instead of two)"},
	{"decode", MOE_PASS_OPT_ENUM, "0|1", "0", "1: a T = 1 layer's K pairs are K one-row blocks in slot order (no index "
		"generation)"},
	{"rank", MOE_PASS_OPT_ENUM, "pairs|tokens", "pairs", "tokens: each pair's row within its expert from a scan over "
		"the T tokens' expert counts [T, E] instead of the T K pairs' one-hot [T K, E] (the same rows)"},
	{"tail", MOE_PASS_OPT_COUNT, NULL, NULL, "N: of two or more combine chunks, the last one's last 1/N tokens are a "
		"chunk of their own (a small output part after the last sums)"},
	{"balance", MOE_PASS_OPT_ENUM, "0|1", "0", "1: each expert's rows are spread evenly over its ceil(count / B) "
		"blocks (ceil(count / blocks) rows each, the last fewer) instead of full blocks and a remainder (default: 0, "
		"or the graph's block_balance: a target's choice, such as tcp-block-balance's)"},
	{NULL, 0, NULL, NULL, NULL},
};

static const moe_pass_option ep_opts[] = {
	{"ep", MOE_PASS_OPT_COUNT, NULL, "1", "the devices the experts are spread over"},
	{"rank", MOE_PASS_OPT_TEXT, NULL, "0", "the device whose program this is, 0..ep-1"},
	{"tokens", MOE_PASS_OPT_COUNT, NULL, "ep x the layer's T", "the tokens of the whole batch (the layer holds this "
		"device's floor(T/ep), the last device the remainder)"},
	{"placement", MOE_PASS_OPT_TEXT, NULL, "contiguous ranges", "the device of each expert, '.'-separated (0.0.1.1)"},
	{"loop", MOE_PASS_OPT_ENUM, "0|1", "0", "1: the local experts' FFN as a block_loop (the schedule compiler's form), "
		"0: flattened under the blocks' valid rows"},
	{NULL, 0, NULL, NULL, NULL},
};

static const moe_pass_info builtin[] = {
	{"infer-shapes", "re-derive every node's dtype and shape from its operands", NULL, pass_infer_shapes, NULL},
	{"canonicalize", "remove identity casts/reshapes/broadcasts, fold integer constants, expand composite ops",
		NULL, pass_canonicalize, NULL},
	{"cse", "merge nodes computing the same value", NULL, pass_cse, NULL},
	{"dce", "drop nodes no output depends on", NULL, pass_dce, NULL},
	{"lower-topk", "rewrite topk into the branchless pack/rank/filter form", NULL, pass_lower_topk, NULL},
	{"blockwise-dispatch", "lower experts() to expert-centric blockwise dispatch over a G x B grid", NULL,
		pass_blockwise_dispatch, NULL},
	{"flatten-blocks", "rewrite each block_loop into the equivalent nodes over all blocks ([G, ...], valid masks)",
		NULL, pass_flatten_blocks, NULL},
	{"grid-bound", "record the tight worst-case block count and the seed/vLLM bounds", NULL, pass_grid_bound,
		NULL},
	{"expert-parallel", "split experts() into one device's program of an expert-parallel layer (all_to_all)", NULL,
		pass_expert_parallel, NULL},
	{"lower-exchange", "rewrite single-device all_to_all into slices and selects", NULL, pass_lower_exchange, NULL},
	{"tcp-split-weights", "mark the weight-only values the TCP program binds as packed weights (tcp_pack)", NULL,
		pass_tcp_split_weights, NULL},
};
/* The option rows of builtin[i] (NULL: none). */
static const moe_pass_option *const builtin_rows[] = {
	NULL, NULL, NULL, NULL, topk_opts, dispatch_opts, NULL, NULL, ep_opts, NULL, NULL};
_Static_assert(sizeof builtin_rows / sizeof *builtin_rows == sizeof builtin / sizeof *builtin,
	"one option-row entry per built-in pass");

const moe_pass_option *moe_pass_options(const moe_pass_info *p)
{
	for (size_t i = 0; i < sizeof builtin / sizeof *builtin; i++)
		if (p == &builtin[i])
			return builtin_rows[i];
	return NULL;
}
#define NBUILTIN (sizeof builtin / sizeof *builtin)

/* The TCP target's graph passes in their order (docs/tcp-compiler.md section
 * 3): the tail of the tcp pipeline, and the pipeline multichip runs on each
 * chip's phase graph. Named tcp-graph; the one list both expand. */
#define TCP_GRAPH_PIPELINE \
	"tcp-w8a8-act-once,tcp-pair-gate-up,tcp-pair-down,tcp-pack-bias,tcp-einsum-canon,tcp-fp8-act-rows,tcp-split-weights," \
	"tcp-plan-fusion"

#define TCP_PIPELINE \
	"infer-shapes,canonicalize,lower-topk,tcp-combine-chunk,tcp-block-balance," \
	"blockwise-dispatch{decode=1,combine=chain,counts=scan,rank=tokens,tail=4},lower-exchange," \
	"grid-bound,canonicalize,cse,dce," TCP_GRAPH_PIPELINE

static const struct {
	const char *name, *text;
} named[] = {
	/* The graph the schedule compiler reads (moe_tcp_compile): the block loop
	 * kept, the loop's pairings, the packed weights marked
	 * (tcp-split-weights) and the fusion marks. tcp-sched names it too. */
	{"tcp", TCP_PIPELINE},
	{"host", "infer-shapes,canonicalize,blockwise-dispatch,flatten-blocks,lower-exchange,grid-bound,canonicalize,cse,"
		 "dce"},
	{"tcp-sched", TCP_PIPELINE},
	/* the graph passes alone, on a graph whose experts are already a
	 * block_loop (multichip's phases) */
	{"tcp-graph", TCP_GRAPH_PIPELINE},
};

/* Passes a target registers (moe_tcp_register_passes): a pipeline naming one
 * that is not registered skips it, as its target's backend runs the pass
 * itself on a graph that has not been through it (tcp-combine-chunk, which
 * only bounds blockwise-dispatch, excepted: skipped, the generic bound
 * stands). */
static const char *const target_passes[] = {
	"tcp-combine-chunk", "tcp-block-balance", "tcp-w8a8-act-once", "tcp-pair-gate-up", "tcp-pair-down", "tcp-pack-bias", "tcp-einsum-canon", "tcp-fp8-act-rows",
	"tcp-plan-fusion"};

static bool is_target_pass(const char *name)
{
	for (size_t i = 0; i < sizeof target_passes / sizeof *target_passes; i++)
		if (!strcmp(target_passes[i], name))
			return true;
	return false;
}

const char *moe_pipeline_named(const char *name)
{
	for (size_t i = 0; i < sizeof named / sizeof *named; i++)
		if (!strcmp(named[i].name, name))
			return named[i].text;
	return NULL;
}

bool pass_opt_count(moe_ctx *ctx, const moe_pass_opts *o, const char *pass, const char *key, int64_t def,
	int64_t *out)
{
	const char *v = moe_pass_opt(o, key);
	*out = def;
	if (!v)
		return true;
	char *end;
	errno = 0;
	long long n = strtoll(v, &end, 10);
	if (end == v || *end || n < 1 || errno) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "%s: %s must be a positive count, got '%s'", pass, key, v);
		return false;
	}
	*out = n;
	return true;
}

const char *moe_pass_opt(const moe_pass_opts *o, const char *key)
{
	for (int i = 0; o && i < o->count; i++)
		if (!strcmp(o->key[i], key))
			return o->value[i];
	return NULL;
}

size_t moe_pass_count(moe_ctx *ctx)
{
	return NBUILTIN + ctx_passes(ctx)->n;
}

const moe_pass_info *moe_pass_get(moe_ctx *ctx, size_t i)
{
	if (i < NBUILTIN)
		return &builtin[i];
	ctx_vec *v = ctx_passes(ctx);
	i -= NBUILTIN;
	return i < v->n ? ((moe_pass_info **)v->data)[i] : NULL;
}

const moe_pass_info *moe_pass_find(moe_ctx *ctx, const char *name)
{
	for (size_t i = 0, n = moe_pass_count(ctx); i < n; i++)
		if (!strcmp(moe_pass_get(ctx, i)->name, name))
			return moe_pass_get(ctx, i);
	return NULL;
}

static bool valid_pass_name(const char *s)
{
	if (!s || !*s)
		return false;
	for (; *s; s++)
		if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '-' || *s == '_'))
			return false;
	return true;
}

static moe_status pass_register(moe_ctx *ctx, const moe_pass_info *info)
{
	if (!info || !valid_pass_name(info->name) || !info->run) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "pass registration needs a name of [a-z0-9_-] and a run function");
		return MOE_ERR_INVALID;
	}
	if (moe_pass_find(ctx, info->name)) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "a pass named '%s' is already registered", info->name);
		return MOE_ERR_INVALID;
	}
	ctx_vec *v = ctx_passes(ctx);
	/* each row is its own block: parsed pipelines keep pointers to rows,
	 * which must survive later registrations growing the table */
	moe_pass_info *d = ctx_alloc(ctx, sizeof *d);
	*d = *info;
	d->name = ctx_intern(ctx, info->name);
	d->summary = ctx_intern(ctx, info->summary ? info->summary : "");
	d->options = info->options ? ctx_intern(ctx, info->options) : NULL;
	v->esz = sizeof(moe_pass_info *);
	v->row = sizeof(moe_pass_info);
	ctx_grow(ctx, &v->data, &v->cap, v->n + 1, v->esz); /* the last allocation: then the table changes */
	ctx_commit_point(ctx);
	ctx_keep(ctx, v->data);
	ctx_keep(ctx, d);
	((moe_pass_info **)v->data)[v->n++] = d;
	return MOE_OK;
}

moe_status moe_pass_register(moe_ctx *ctx, const moe_pass_info *info)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, pass_register(ctx, info));
}

/* ---- pipelines ---- */
typedef struct pstep {
	const moe_pass_info *info;
	moe_pass_opts opts;
} pstep;

struct moe_pipeline {
	moe_ctx *ctx;
	pstep *steps;
	uint32_t n, cap;
};

void moe_pipeline_free(moe_pipeline *p)
{
	if (!p)
		return;
	ctx_free(p->ctx, p->steps, p->cap * sizeof *p->steps);
	ctx_free(p->ctx, p, sizeof *p);
}

/* key is one of the pass's option rows (or, for an external pass, appears
 * as "key=" in its options text). */
static bool opt_key_allowed(const moe_pass_info *pi, const char *key)
{
	const moe_pass_option *rows = moe_pass_options(pi);
	if (rows) {
		for (const moe_pass_option *o = rows; o->key; o++)
			if (!strcmp(o->key, key))
				return true;
		return false;
	}
	if (!pi->options)
		return false;
	size_t kl = strlen(key);
	for (const char *s = pi->options; (s = strstr(s, key)); s++)
		if ((s == pi->options || s[-1] == ' ' || s[-1] == ',') && s[kl] == '=')
			return true;
	return false;
}

static moe_pipeline *parse_err(moe_ctx *ctx, moe_pipeline *p, const char *text, size_t at, const char *fmt,
	const char *arg)
{
	char msg[256];
	snprintf(msg, sizeof msg, fmt, arg);
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "invalid pipeline '%s' at column %zu: %s", text, at + 1, msg);
	moe_pipeline_free(p);
	return NULL;
}

/* Reads [a-z0-9_-]+ or a value token into buf. */
static size_t scan_word(const char *s, size_t i, char *buf, size_t blen, bool value)
{
	size_t k = 0;
	while (s[i] && (isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '_' ||
			       (value && (s[i] == '.' || s[i] == '+')))) {
		if (k + 1 < blen)
			buf[k++] = s[i];
		i++;
	}
	buf[k] = 0;
	return i;
}

static moe_pipeline *parse_into(moe_ctx *ctx, moe_pipeline *p, const char *text, int depth)
{
	size_t i = 0;
	char word[64];
	while (1) {
		while (text[i] == ' ')
			i++;
		size_t start = i;
		i = scan_word(text, i, word, sizeof word, false);
		if (i == start)
			return parse_err(ctx, p, text, i, "expected a pass name%s", "");
		const char *sub = moe_pipeline_named(word);
		if (sub && depth == 0 && text[i] != '{') {
			if (!parse_into(ctx, p, sub, depth + 1))
				return NULL;
		} else {
			const moe_pass_info *pi = moe_pass_find(ctx, word);
			if (!pi && is_target_pass(word) && text[i] != '{')
				goto next; /* not registered: its backend applies the rule */
			if (!pi)
				return parse_err(ctx, p, text, start, "unknown pass '%s' (see 'moec passes')", word);
			ctx_grow(ctx, (void **)&p->steps, &p->cap, p->n + 1, sizeof *p->steps);
			pstep *st = &p->steps[p->n++];
			memset(st, 0, sizeof *st);
			st->info = pi;
			if (text[i] == '{') {
				i++;
				while (1) {
					char key[64], val[64];
					size_t ks = i;
					i = scan_word(text, i, key, sizeof key, false);
					if (i == ks || text[i] != '=')
						return parse_err(ctx, p, text, i, "expected key=value in pass options%s", "");
					if (!opt_key_allowed(pi, key))
						return parse_err(ctx, p, text, ks, "pass '%s' has no option of this name", pi->name);
					size_t vs = ++i;
					i = scan_word(text, i, val, sizeof val, true);
					if (i == vs)
						return parse_err(ctx, p, text, i, "expected an option value%s", "");
					if (st->opts.count == 16)
						return parse_err(ctx, p, text, i, "too many options%s", "");
					st->opts.key[st->opts.count] = ctx_intern(ctx, key);
					st->opts.value[st->opts.count++] = ctx_intern(ctx, val);
					if (text[i] == ',') {
						i++;
						continue;
					}
					if (text[i] == '}') {
						i++;
						break;
					}
					return parse_err(ctx, p, text, i, "expected ',' or '}'%s", "");
				}
			}
		}
	next:
		while (text[i] == ' ')
			i++;
		if (!text[i])
			return p;
		if (text[i] != ',')
			return parse_err(ctx, p, text, i, "expected ',' between passes%s", "");
		i++;
	}
}

static moe_pipeline *pipeline_parse(moe_ctx *ctx, const char *text)
{
	moe_pipeline *p = ctx_alloc(ctx, sizeof *p);
	p->ctx = ctx;
	if (!text) {
		moe_pipeline_free(p);
		return NULL;
	}
	if (!*text)
		return p; /* the empty pipeline does nothing */
	return parse_into(ctx, p, text, 0);
}

moe_pipeline *moe_pipeline_parse(moe_ctx *ctx, const char *text)
{
	CTX_GUARDED(ctx, moe_pipeline *, NULL, pipeline_parse(ctx, text));
}

char *moe_pipeline_print(const moe_pipeline *p)
{
	size_t cap = 64, len = 0;
	char *s = malloc(cap);
	if (!s)
		return NULL;
	s[0] = 0;
	for (uint32_t i = 0; i < p->n; i++) {
		const pstep *st = &p->steps[i];
		char buf[1200];
		int o = snprintf(buf, sizeof buf, "%s%s", i ? "," : "", st->info->name);
		for (int k = 0; k < st->opts.count; k++)
			o += snprintf(buf + o, sizeof buf - (size_t)o, "%s%s=%s", k ? "," : "{", st->opts.key[k],
				st->opts.value[k]);
		if (st->opts.count)
			o += snprintf(buf + o, sizeof buf - (size_t)o, "}");
		while (len + (size_t)o + 1 > cap)
			cap *= 2;
		char *ns = realloc(s, cap);
		if (!ns) {
			free(s);
			return NULL;
		}
		s = ns;
		memcpy(s + len, buf, (size_t)o + 1);
		len += (size_t)o;
	}
	return s;
}

static bool wants_dump(const char *sel, const char *name)
{
	return sel && (!strcmp(sel, "all") || !strcmp(sel, name));
}

static void dump(const moe_module *m, FILE *out, const char *when, const char *name)
{
	fprintf(out, "// -----// IR Dump %s %s //----- //\n", when, name);
	moe_module_print(m, out);
}

static void write_reproducer(moe_ctx *ctx, const moe_pipeline *p, const moe_module *before, const char *path)
{
	moe_atomic_file *af = moe_atomic_open(ctx, path);
	if (!af) {
		moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_none(), "could not write the reproducer to '%s'", path);
		return;
	}
	char *text = moe_pipeline_print(p);
	FILE *f = moe_atomic_stream(af);
	fprintf(f, "# moec reproducer: run with\n#   moec ir %s --pipeline='%s'\n", path, text ? text : "");
	moe_module_print(before, f);
	free(text);
	bool ok = moe_atomic_commit(af) == MOE_OK;
	moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_none(), ok ? "reproducer written to '%s'" : "could not write '%s'", path);
}

/* Passes that run on every block_loop body too (a body is a graph of its
 * own ids); the bodies first, so the loop's type is inferred from them. */
static bool recurses(const moe_pass_info *p)
{
	return p->run == pass_infer_shapes || p->run == pass_canonicalize || p->run == pass_cse || p->run == pass_dce;
}

static moe_status run_step(moe_ctx *ctx, const pstep *st, moe_graph *g)
{
	moe_status s = MOE_OK;
	for (uint32_t b = 0; recurses(st->info) && b < g->nbodies && s == MOE_OK; b++)
		s = st->info->run(ctx, g->bodies[b], &st->opts, st->info->ud);
	return s == MOE_OK ? st->info->run(ctx, g, &st->opts, st->info->ud) : s;
}

static moe_status pipeline_run(moe_ctx *ctx, const moe_pipeline *p, moe_module *m, const moe_run_opts *ro)
{
	moe_run_opts none = {0};
	if (!ro)
		ro = &none;
	FILE *out = ro->print_to ? ro->print_to : stderr;
	for (uint32_t i = 0; i < p->n; i++) {
		const pstep *st = &p->steps[i];
		if (wants_dump(ro->print_before, st->info->name))
			dump(m, out, "Before", st->info->name);
		/* keep the input of each pass for a reproducer */
		moe_module *saved = NULL;
		if (ro->reproducer) {
			saved = moe_module_new(ctx);
			for (uint32_t k = 0; k < m->ngraphs; k++) {
				ctx_grow(ctx, (void **)&saved->graphs, &saved->gcap, saved->ngraphs + 1, sizeof *saved->graphs);
				saved->graphs[saved->ngraphs++] = ir_graph_clone(m->graphs[k]);
			}
		}
		moe_status st_ = MOE_OK;
		for (uint32_t k = 0; k < m->ngraphs && st_ == MOE_OK; k++) {
			st_ = run_step(ctx, st, m->graphs[k]);
			if (st_ == MOE_OK && ro->verify && moe_graph_verify(ctx, m->graphs[k]) != MOE_OK) {
				moe_diag(ctx, MOE_DIAG_ERROR, m->graphs[k]->loc, "the IR does not verify after pass '%s'",
					st->info->name);
				st_ = MOE_ERR_INTERNAL;
			}
		}
		if (st_ != MOE_OK) {
			moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_none(), "pass '%s' (step %u of the pipeline) failed",
				st->info->name, i + 1);
			if (saved)
				write_reproducer(ctx, p, saved, ro->reproducer);
			moe_module_free(saved);
			return st_;
		}
		moe_module_free(saved);
		if (wants_dump(ro->print_after, st->info->name))
			dump(m, out, "After", st->info->name);
	}
	return MOE_OK;
}

/* The passes run on a copy of m's graphs, swapped in at the end (no
 * allocation after): out of memory leaves m as it was. */
static moe_status pipeline_run_copy(moe_ctx *ctx, const moe_pipeline *p, moe_module *m, const moe_run_opts *ro)
{
	moe_module *w = moe_module_new(ctx);
	for (uint32_t k = 0; k < m->ngraphs; k++) {
		ctx_grow(ctx, (void **)&w->graphs, &w->gcap, w->ngraphs + 1, sizeof *w->graphs);
		w->graphs[w->ngraphs++] = ir_graph_clone(m->graphs[k]);
	}
	moe_status s = pipeline_run(ctx, p, w, ro);
	ctx_commit_point(ctx); /* no throw once m holds blocks born in the guard */
	for (uint32_t k = 0; k < m->ngraphs; k++) {
		moe_graph tmp = *m->graphs[k];
		*m->graphs[k] = *w->graphs[k];
		*w->graphs[k] = tmp;
	}
	moe_module_free(w);
	return s;
}

moe_status moe_pipeline_run(moe_ctx *ctx, const moe_pipeline *p, moe_module *m, const moe_run_opts *ro)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, pipeline_run_copy(ctx, p, m, ro));
}

static moe_status run_pipeline_text(moe_ctx *ctx, const char *text, moe_module *m, const moe_run_opts *ro)
{
	moe_pipeline *p = moe_pipeline_parse(ctx, text);
	if (!p)
		return MOE_ERR_INVALID;
	moe_status s = moe_pipeline_run(ctx, p, m, ro);
	moe_pipeline_free(p);
	return s;
}

moe_status moe_run_pipeline_text(moe_ctx *ctx, const char *text, moe_module *m, const moe_run_opts *ro)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, run_pipeline_text(ctx, text, m, ro));
}

/* ---- rebuild helper ---- */
void rebuild_begin(rebuild *r, moe_graph *g)
{
	r->src = g;
	r->dst = ir_graph_clone_empty(g);
	r->map = ctx_alloc(g->ctx, ((size_t)g->nnodes + 1) * sizeof *r->map);
	for (uint32_t i = 0; i < g->nnodes; i++)
		r->map[i] = MOE_NONE;
}

moe_id rebuild_copy(rebuild *r, moe_id i)
{
	return r->map[i] = ir_copy_node(r->dst, r->src, i, r->map);
}

void rebuild_abort(rebuild *r)
{
	ctx_free(r->src->ctx, r->map, ((size_t)r->src->nnodes + 1) * sizeof *r->map);
	ir_graph_free(r->dst);
}

void rebuild_end(rebuild *r)
{
	for (uint32_t i = 0; i < r->src->nout; i++)
		moe_graph_add_output(r->dst, r->map[r->src->outputs[i]]);
	ctx_free(r->src->ctx, r->map, ((size_t)r->src->nnodes + 1) * sizeof *r->map);
	ir_graph_take(r->src, r->dst);
}
