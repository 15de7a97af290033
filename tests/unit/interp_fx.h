/* Fixture shared by test_interp.c and test_interp_route.c: one context,
 * one graph, its bindings and outputs, and expectations on output tensors. */
#ifndef MOEC_TESTS_INTERP_FX_H
#define MOEC_TESTS_INTERP_FX_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "interp/interp.h"

typedef struct fx {
	moe_ctx *c;
	moe_graph *g;
	moe_tensor_map *m;
	moe_tensor *out[8];
} fx;

static inline fx *fx_new(void)
{
	fx *t = calloc(1, sizeof *t);
	t->c = moe_ctx_new(NULL, NULL);
	t->g = ir_graph_new(t->c, "t");
	t->m = moe_tensor_map_new(t->c);
	return t;
}

static inline void fx_free(fx *t)
{
	for (int i = 0; i < 8; i++)
		moe_tensor_free(t->c, t->out[i]);
	moe_tensor_map_free(t->m);
	ir_graph_free(t->g);
	moe_ctx_free(t->c);
	free(t);
}

static inline size_t numel(int rank, const int64_t *shape)
{
	size_t n = 1;
	for (int i = 0; i < rank; i++)
		n *= (size_t)shape[i];
	return n;
}

/* An input node named `name`, bound to a tensor holding data. */
static inline moe_id input(fx *t, const char *name, moe_dtype dt, int rank, const int64_t *shape, const void *data)
{
	moe_id id = ir_emit(t->g, MOE_OP_INPUT, dt, rank, shape, NULL, 0, moe_loc_none());
	moe_node_set_name(t->g, id, name);
	moe_tensor *x = moe_tensor_new(t->c, dt, rank, shape);
	assert_non_null(x);
	memcpy(x->data, data, numel(rank, shape) * moe_dtype_size(dt));
	moe_tensor_map_set(t->m, name, x);
	return id;
}

static inline moe_id weight(fx *t, const char *name, moe_dtype dt, int rank, const int64_t *shape, const void *data)
{
	moe_id id = ir_emit(t->g, MOE_OP_WEIGHT, dt, rank, shape, NULL, 0, moe_loc_none());
	moe_node_set_name(t->g, id, name);
	moe_node_set_str(t->g, id, "source", name);
	moe_tensor *x = moe_tensor_new(t->c, dt, rank, shape);
	assert_non_null(x);
	memcpy(x->data, data, numel(rank, shape) * moe_dtype_size(dt));
	moe_tensor_map_set(t->m, name, x);
	return id;
}

/* A node whose attributes the caller sets before done(). */
static inline moe_id mk(fx *t, moe_op op, int nargs, moe_id a, moe_id b, moe_id c)
{
	moe_id args[3] = {a, b, c};
	return moe_node_new(t->g, op, args, (uint32_t)nargs, moe_loc_none());
}

static inline moe_id done(fx *t, moe_id id)
{
	if (moe_node_infer(t->g, id) != MOE_OK) {
		moe_diag_print(t->c, stderr);
		fail();
	}
	return id;
}

static inline moe_status run(fx *t)
{
	return moe_interp_run(t->c, t->g, t->m, t->out);
}

static inline moe_status run1(fx *t, moe_id o)
{
	moe_graph_add_output(t->g, o);
	moe_status st = run(t);
	if (st == MOE_OK)
		assert_non_null(t->out[0]);
	return st;
}

static inline bool has_diag(fx *t, const char *needle)
{
	for (size_t i = 0; i < moe_diag_count(t->c); i++) {
		const char *msg;
		moe_diag_get(t->c, i, NULL, NULL, &msg);
		if (strstr(msg, needle))
			return true;
	}
	return false;
}

static inline uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

/* bitwise equality (any NaN equals any NaN) */
static inline void expect_f32(const moe_tensor *o, const float *want, size_t n)
{
	assert_int_equal(o->dtype, MOE_F32);
	assert_int_equal(o->nbytes, n * 4);
	const float *got = o->data;
	for (size_t i = 0; i < n; i++) {
		if (isnan(want[i]) && isnan(got[i]))
			continue;
		if (fbits(want[i]) != fbits(got[i]))
			fail_msg("element %zu: got %.9g (0x%08x), want %.9g (0x%08x)", i, got[i], fbits(got[i]), want[i],
				fbits(want[i]));
	}
}

static inline void expect_near(const moe_tensor *o, const double *want, size_t n, double rel)
{
	assert_int_equal(o->dtype, MOE_F32);
	const float *got = o->data;
	for (size_t i = 0; i < n; i++)
		if (fabs(got[i] - want[i]) > rel * fabs(want[i]) + 1e-30)
			fail_msg("element %zu: got %.9g, want %.9g", i, got[i], want[i]);
}

static inline void expect_i32(const moe_tensor *o, const int32_t *want, size_t n)
{
	assert_int_equal(o->dtype, MOE_I32);
	assert_int_equal(o->nbytes, n * 4);
	const int32_t *got = o->data;
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i])
			fail_msg("element %zu: got %d, want %d", i, got[i], want[i]);
}

static inline void expect_bool(const moe_tensor *o, const unsigned char *want, size_t n)
{
	assert_int_equal(o->dtype, MOE_BOOL);
	assert_int_equal(o->nbytes, n);
	assert_memory_equal(o->data, want, n);
}

static inline void expect_bf16(const moe_tensor *o, const uint16_t *want, size_t n)
{
	assert_int_equal(o->dtype, MOE_BF16);
	assert_int_equal(o->nbytes, n * 2);
	const uint16_t *got = o->data;
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i])
			fail_msg("element %zu: got 0x%04x, want 0x%04x", i, got[i], want[i]);
}

static inline float bitsf(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

#endif
