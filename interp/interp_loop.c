/* interp/interp_loop.c: value storage (bindings in, outputs out) and the block_loop op (docs/ir.md
 * "Block loops"): the body runs once per block g < nblocks on the block's
 * rows of the loop's operands, and row g of the result is the value it
 * yields; the rows of blocks at and past nblocks are zero. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "interp/interp_int.h"

static size_t val_bytes(const val *v)
{
	return (size_t)(v->n ? v->n : 1) * 4;
}

void interp_val_free(moe_ctx *ctx, val *v)
{
	if (v->f)
		ctx_free(ctx, v->f, val_bytes(v));
	if (v->i)
		ctx_free(ctx, v->i, val_bytes(v));
	v->f = NULL;
	v->i = NULL;
}

bool interp_val_alloc(moe_ctx *ctx, val *v, const ir_node *n)
{
	v->n = ir_numel(n);
	if (moe_dtype_is_float((moe_dtype)n->dtype))
		v->f = ctx_try_alloc(ctx, val_bytes(v));
	else
		v->i = ctx_try_alloc(ctx, val_bytes(v));
	return v->f || v->i || !val_bytes(v);
}

void interp_load_binding(val *v, const moe_tensor *t)
{
	for (int64_t o = 0; o < v->n; o++) {
		switch (t->dtype) {
		case MOE_F32: memcpy(&v->f[o], (const char *)t->data + o * 4, 4); break;
		case MOE_BF16: {
			uint16_t h;
			memcpy(&h, (const char *)t->data + o * 2, 2);
			v->f[o] = moe_bf16_to_f32(h);
			break;
		}
		case MOE_I32: memcpy(&v->i[o], (const char *)t->data + o * 4, 4); break;
		case MOE_BOOL: v->i[o] = ((const unsigned char *)t->data)[o] != 0; break;
		case MOE_F8E4M3:
		case MOE_U8: v->i[o] = ((const unsigned char *)t->data)[o]; break; /* raw bytes */
		default: IR_ASSERT(!"reserved dtype in a verified graph");
		}
	}
}

moe_tensor *interp_store_output(moe_ctx *ctx, const ir_node *n, const val *v)
{
	moe_tensor *t = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
	if (!t)
		return NULL;
	for (int64_t o = 0; o < v->n; o++) {
		switch (n->dtype) {
		case MOE_F32: memcpy((char *)t->data + o * 4, &v->f[o], 4); break;
		case MOE_BF16: {
			uint16_t h = moe_f32_to_bf16(v->f[o]);
			memcpy((char *)t->data + o * 2, &h, 2);
			break;
		}
		case MOE_I32: memcpy((char *)t->data + o * 4, &v->i[o], 4); break;
		case MOE_BOOL: ((unsigned char *)t->data)[o] = (unsigned char)(v->i[o] != 0); break;
		case MOE_F8E4M3:
		case MOE_U8: ((unsigned char *)t->data)[o] = (unsigned char)v->i[o]; break;
		default: IR_ASSERT(!"reserved dtype in a verified graph");
		}
	}
	return t;
}

/* 4-byte elements [at, at + n) of v (either storage) */
static void *elems(const val *v, int64_t at)
{
	return v->f ? (void *)(v->f + at) : (void *)(v->i + at);
}

typedef struct loop {
	moe_ctx *ctx;
	const moe_graph *g;
	const ir_node *n;
	const char *kinds;
	const val *v;
} loop;

static moe_status fault(const loop *l, const char *fmt, ...) MOE_PRINTF(2, 3);

static moe_status fault(const loop *l, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	moe_diag(l->ctx, MOE_DIAG_ERROR, l->n->loc, "block_loop: %s", msg);
	return MOE_ERR_INVALID;
}

/* Blockarg b's value for block g into a (allocated by the caller). */
static moe_status fill_arg(const loop *l, const ir_node *b, int64_t g, val *a)
{
	const int32_t *bexp = l->v[l->n->args[IR_BL_EXPERTS]].i, *rows = l->v[l->n->args[IR_BL_ROWS]].i;
	switch (ir_blockarg_role_of(b)) {
	case IR_BA_ROWS: a->i[0] = rows[g]; return MOE_OK;
	case IR_BA_EXPERT: a->i[0] = bexp[g]; return MOE_OK;
	case IR_BA_INDEX: a->i[0] = (int32_t)g; return MOE_OK;
	default: break;
	}
	int k = (int)ir_attr_int(b, "index", 0), at = ir_block_loop_arg(l->kinds, k);
	const ir_node *xn = N(l->g, l->n->args[at]);
	const val *x = &l->v[l->n->args[at]];
	size_t row = (size_t)a->n * 4;
	switch (l->kinds[k]) {
	case IR_BK_BLOCK: memcpy(elems(a, 0), elems(x, g * a->n), row); return MOE_OK;
	case IR_BK_INVARIANT: memcpy(elems(a, 0), elems(x, 0), row); return MOE_OK;
	case IR_BK_EXPERT:
		if (bexp[g] < 0 || bexp[g] >= xn->shape[0])
			return fault(l, "block %lld's expert %d is outside 0..%lld", (long long)g, bexp[g],
				(long long)xn->shape[0] - 1);
		memcpy(elems(a, 0), elems(x, bexp[g] * a->n), row);
		return MOE_OK;
	default: break;
	}
	/* rows by list: src[list[g, j]] for j < rows[g], zero after */
	const int32_t *list = l->v[l->n->args[at + 1]].i;
	int64_t B = N(l->g, l->n->args[at + 1])->shape[1], D = xn->shape[1];
	memset(elems(a, 0), 0, row);
	for (int64_t j = 0; j < B && j < rows[g]; j++) {
		int32_t r = list[g * B + j];
		if (r < 0 || r >= xn->shape[0])
			return fault(l, "block %lld, row %lld: source row %d is outside 0..%lld", (long long)g, (long long)j, r,
				(long long)xn->shape[0] - 1);
		memcpy(elems(a, j * D), elems(x, r * D), (size_t)D * 4);
	}
	return MOE_OK;
}

moe_status interp_block_loop(moe_ctx *ctx, const moe_graph *g, moe_id id, const val *v, const moe_exchange *x,
	val *out)
{
	const ir_node *n = N(g, id);
	const moe_graph *body = ir_node_body(g, n);
	loop l = {ctx, g, n, ir_attr_str(n, "kinds", ""), v};
	int64_t G = n->shape[0], per = out->n / G, nb = v[n->args[IR_BL_NBLOCKS]].i[0];
	if (nb > G)
		nb = G;
	memset(elems(out, 0), 0, (size_t)out->n * 4);
	val *args = ctx_alloc(ctx, ((size_t)body->nnodes + 1) * sizeof *args);
	moe_status st = MOE_OK;
	for (int64_t b = 0; b < nb && !st; b++) {
		for (moe_id i = 0; i < body->nnodes && !st; i++) {
			const ir_node *bn = N(body, i);
			if (bn->op != MOE_OP_BLOCKARG)
				continue;
			if (!interp_val_alloc(ctx, &args[i], bn))
				st = MOE_ERR_NOMEM;
			else
				st = fill_arg(&l, bn, b, &args[i]);
		}
		val res = {0};
		if (!st)
			st = interp_run_body(ctx, body, args, x, &res);
		if (!st)
			memcpy(elems(out, b * per), elems(&res, 0), (size_t)per * 4);
		interp_val_free(ctx, &res);
		for (moe_id i = 0; i < body->nnodes; i++)
			interp_val_free(ctx, &args[i]);
	}
	ctx_free(ctx, args, ((size_t)body->nnodes + 1) * sizeof *args);
	return st;
}
