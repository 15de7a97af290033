/* cli/serve.c: `moec run --tokens N`, a serving layer run on its
 * first N token rows (docs/semantics.md section 7). The layer gets the
 * n_tokens input when it does not declare one; N is bound to it; an x of N
 * rows is padded with zero rows to T; the output keeps the first N rows. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static moe_id tokens_node(const moe_graph *g)
{
	for (uint32_t i = 0; i < moe_graph_num_nodes(g); i++)
		if (moe_node_op(g, i) == MOE_OP_INPUT && !strcmp(moe_node_name(g, i), MOE_TOKENS_INPUT))
			return i;
	return MOE_NONE;
}

int64_t cli_tokens(moe_ctx *ctx, const opts *o)
{
	if (!o->serve_tokens)
		return -1;
	char *end;
	long long v = strtoll(o->serve_tokens, &end, 10);
	if (*o->serve_tokens < '0' || *o->serve_tokens > '9' || *end || v > 2147483647) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--tokens must be an integer in 0..2147483647, got '%s'",
			o->serve_tokens);
		return -2;
	}
	return v;
}

int cli_serve_prepare(moe_ctx *ctx, moe_graph *g, const opts *o)
{
	int64_t n = cli_tokens(ctx, o);
	if (n == -2)
		return 1;
	if (n < 0 || tokens_node(g) != MOE_NONE)
		return 0;
	moe_id id = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, MOE_I32, NULL, 0);
	moe_node_set_name(g, id, MOE_TOKENS_INPUT);
	return 0;
}

int cli_serve_bind(moe_ctx *ctx, const moe_graph *g, const opts *o, moe_tensor_map *bind)
{
	int64_t n = cli_tokens(ctx, o);
	if (n == -2)
		return 1;
	if (n < 0)
		return 0;
	if (tokens_node(g) == MOE_NONE) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "--tokens: this program has no '%s' input (compile it "
			"with the input declared: input n_tokens : i32[])", MOE_TOKENS_INPUT);
		return 1;
	}
	moe_tensor *t = moe_tensor_new(ctx, MOE_I32, 0, NULL);
	if (!t)
		return 1;
	int32_t v = (int32_t)n;
	memcpy(t->data, &v, sizeof v);
	moe_tensor_map_set(bind, MOE_TOKENS_INPUT, t);
	return 0;
}

moe_tensor *cli_serve_pad(moe_ctx *ctx, moe_tensor *t, const int64_t *shape, int64_t tokens)
{
	if (tokens < 0 || t->rank < 1 || t->shape[0] != tokens || tokens > shape[0])
		return t;
	for (int d = 1; d < t->rank; d++)
		if (t->shape[d] != shape[d])
			return t;
	moe_tensor *p = moe_tensor_new(ctx, t->dtype, t->rank, shape);
	if (p) /* rows past the real tokens stay zero */
		memcpy(p->data, t->data, t->nbytes);
	moe_tensor_free(ctx, t);
	return p;
}

moe_tensor *cli_serve_rows(moe_ctx *ctx, moe_tensor *y, int64_t tokens)
{
	if (tokens < 0 || !y || y->rank < 1 || tokens >= y->shape[0])
		return y;
	int64_t shape[MOE_MAX_RANK];
	memcpy(shape, y->shape, sizeof shape);
	shape[0] = tokens;
	moe_tensor *r = moe_tensor_new(ctx, y->dtype, y->rank, shape);
	if (r && r->nbytes)
		memcpy(r->data, y->data, r->nbytes);
	moe_tensor_free(ctx, y);
	return r;
}

/* ---- the decode tier ---- */

/* The options of o with T set to 1 and no --tokens (into *d, whose set
 * names are its own). */
static void tier_opts(const opts *o, opts *d)
{
	*d = *o;
	size_t k = d->nsets;
	for (size_t i = 0; i < d->nsets; i++) {
		d->sets[i].name = d->setnames[i];
		if (!strcmp(d->setnames[i], "T"))
			k = i;
	}
	if (k == d->nsets) {
		snprintf(d->setnames[k], sizeof d->setnames[0], "T");
		d->sets[k].name = d->setnames[k];
		d->nsets++;
	}
	d->sets[k].value = "1";
	d->serve_tokens = NULL;
}

int cli_serve_tier(moe_ctx *ctx, const opts *o, const moe_graph *g, const moe_tcp_machine *m, moe_tcp_program **p)
{
	int64_t T = 0;
	if (o->kind != K_MOE || (o->decode_tier && !strcmp(o->decode_tier, "off")) || tokens_node(g) == MOE_NONE ||
		!moe_graph_get_dim(g, "T", &T) || T <= 1 || o->nsets >= MAX_SETS)
		return 0;
	static opts o1; /* large; one tier at a time */
	tier_opts(o, &o1);
	int64_t autob;
	double pred;
	moe_module *mod = cli_load_tcp(ctx, &o1, &autob, &pred);
	moe_graph *g1 = mod && moe_module_num_graphs(mod) == 1 ? moe_module_graph(mod, 0) : NULL;
	moe_id nt = g1 ? tokens_node(g1) : MOE_NONE;
	if (nt != MOE_NONE) /* declared by the .moe: the tier is the layer without it (its input is left unused) */
		moe_node_set_name(g1, nt, MOE_TOKENS_INPUT ".tier");
	moe_run_opts ro = {.verify = 1};
	moe_tcp_program *d = g1 && moe_run_pipeline_text(ctx, "tcp", mod, &ro) == MOE_OK
				     ? moe_tcp_compile_sched(ctx, g1, m, o1.sched_opts)
				     : NULL;
	int errors = moe_error_count(ctx);
	moe_tcp_program *linked = d ? moe_tcp_link_tier(ctx, *p, d) : NULL;
	int alone = d && !linked && moe_error_count(ctx) == errors; /* a note: no tier for this layer */
	moe_tcp_program_free(d);
	moe_module_free(mod);
	if (!linked)
		return !alone;
	moe_tcp_program_free(*p);
	*p = linked;
	return 0;
}

/* ---- buckets: compile --buckets, and run/check of a bucketed .tcpb ---- */

/* Parses "1,8,64" into increasing sizes; the count, or -1 after an error. */
static int parse_buckets(moe_ctx *ctx, const char *s, int64_t *T, int max)
{
	int n = 0;
	const char *p = s;
	while (*p) {
		char *end;
		long long v = strtoll(p, &end, 10);
		if (end == p || v < 1 || v > 2147483647 || (*end && *end != ',') || n == max || (n && v <= T[n - 1])) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
				"--buckets takes at most %d increasing token counts >= 1 separated by commas, got '%s'", max, s);
			return -1;
		}
		T[n++] = v;
		p = *end ? end + 1 : end;
	}
	if (!n)
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--buckets needs at least one token count%s", "");
	return n ? n : -1;
}

int cli_compile_buckets(moe_ctx *ctx, const opts *o, const char *out)
{
	int64_t T[16];
	int n = parse_buckets(ctx, o->buckets, T, 16);
	if (n < 0)
		return 1;
	if (o->kind != K_MOE || !cli_ends_with(out, ".tcpb")) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file),
			"--buckets compiles a .moe layer into one .tcpb (-o NAME.tcpb)");
		return 1;
	}
	for (size_t i = 0; i < o->nsets; i++)
		if (!strcmp(o->sets[i].name, "T")) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "--buckets sets T itself: drop --set T=%s", "");
			return 1;
		}
	moe_tcp_machine *m = o->machine ? moe_tcp_machine_load(ctx, o->machine) : moe_tcp_machine_default(ctx);
	moe_tcp_program *p[16] = {0};
	int status = !m;
	static opts ob; /* large; the options with T set per bucket */
	for (int b = 0; b < n && !status; b++) {
		ob = *o;
		for (size_t i = 0; i < ob.nsets; i++)
			ob.sets[i].name = ob.setnames[i];
		char val[24];
		snprintf(ob.setnames[ob.nsets], sizeof ob.setnames[0], "T");
		snprintf(val, sizeof val, "%lld", (long long)T[b]);
		ob.sets[ob.nsets].name = ob.setnames[ob.nsets];
		ob.sets[ob.nsets].value = val;
		ob.nsets++;
		ob.serve_tokens = "0"; /* every bucket gets the n_tokens input */
		int64_t autob;
		double pred;
		moe_module *mod = cli_load_tcp(ctx, &ob, &autob, &pred);
		moe_graph *g = mod && moe_module_num_graphs(mod) == 1 ? moe_module_graph(mod, 0) : NULL;
		moe_run_opts ro = {.verify = 1};
		/* the bucket's program, and the decode tier on it */
		status = !g || cli_serve_prepare(ctx, g, &ob) ||
			 moe_run_pipeline_text(ctx, "tcp", mod, &ro) != MOE_OK ||
			 !(p[b] = cli_tcp_program(ctx, &ob, g, m)) || cli_serve_tier(ctx, &ob, g, m, &p[b]);
		moe_module_free(mod);
	}
	if (!status)
		status = moe_tcp_bundle_write(ctx, (const moe_tcp_program *const *)p, T, (uint32_t)n, out) != MOE_OK;
	for (int b = 0; b < n; b++)
		moe_tcp_program_free(p[b]);
	moe_tcp_machine_free(ctx, m);
	return status;
}

int cli_is_bundle_file(const char *path)
{
	uint8_t h[24];
	FILE *f = fopen(path, "rb");
	size_t n = f ? fread(h, 1, sizeof h, f) : 0;
	if (f)
		fclose(f);
	return moe_tcp_is_bundle(h, n);
}

const moe_tcp_program *cli_bundle_pick(moe_ctx *ctx, const moe_tcp_bundle *b, const opts *o)
{
	int64_t n = cli_tokens(ctx, o);
	if (n == -1) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file),
			"a bucketed .tcpb runs with --tokens N (it picks the smallest bucket >= N)");
		return NULL;
	}
	int i = n < 0 ? -1 : moe_tcp_bundle_pick(b, n);
	if (i < 0) {
		if (n >= 0)
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, o->file), "--tokens %lld exceeds the largest bucket, T=%lld",
				(long long)n, (long long)moe_tcp_bundle_tokens(b, moe_tcp_bundle_count(b) - 1));
		return NULL;
	}
	fprintf(stderr, "moec: %lld tokens run on the bucket T=%lld\n", (long long)n,
		(long long)moe_tcp_bundle_tokens(b, (uint32_t)i));
	return moe_tcp_bundle_program(b, (uint32_t)i);
}
