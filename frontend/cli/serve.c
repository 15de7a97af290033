/* frontend/cli/serve.c: `moec run --tokens N`, a serving layer run on its
 * first N token rows (docs/semantics.md section 7). The layer gets the
 * n_tokens input when it does not declare one; N is bound to it; an x of N
 * rows is padded with zero rows to T; the output keeps the first N rows. */
#include <stdlib.h>
#include <string.h>

#include "frontend/cli/cli.h"

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
