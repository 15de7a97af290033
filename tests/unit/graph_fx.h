/* Helpers for tests that build graphs through the public API: a leaf node
 * (an input or a weight whose source is its name) and a module's text. */
#ifndef MOEC_TESTS_GRAPH_FX_H
#define MOEC_TESTS_GRAPH_FX_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>

#include "moec/ir.h"

/* A leaf of type t[s], named name; a weight reads the tensor of that name. */
static inline moe_id leaf(moe_graph *g, moe_op op, moe_dtype t, int rank, const int64_t *s, const char *name)
{
	moe_id id = moe_node_new(g, op, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, rank);
	moe_node_set_name(g, id, name);
	if (op == MOE_OP_WEIGHT)
		moe_node_set_str(g, id, "source", name);
	return id;
}

/* m's text form (moe_module_print), malloc'ed. */
static inline char *print_module(const moe_module *m)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	assert_int_equal(moe_module_print(m, f), MOE_OK);
	fclose(f);
	return buf;
}

#endif
