/* Unit tests of ir_einsum_form: the forms passes match instead of equation
 * strings, for the spellings moec writes and for near misses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "ir/ir.h"

static void check(const char *eq, ir_ein_form want, int want_batch)
{
	ir_einsum e;
	char msg[128];
	if (!ir_einsum_parse(eq, &e, msg, sizeof msg))
		fail_msg("%s: %s", eq, msg);
	int batch = -1;
	ir_ein_form f = ir_einsum_form(&e, &batch);
	if (f != want || batch != want_batch)
		fail_msg("%s: form %d batch %d, expected form %d batch %d", eq, f, batch, want, want_batch);
	assert_int_equal(ir_einsum_form(&e, NULL), want);
}

static void test_forms(void **st)
{
	(void)st;
	/* nn.Linear: the weight [out, in] transposed */
	check("td,ed->te", IR_EIN_MATMUL_NT, 0);
	check("bi,oi->bo", IR_EIN_MATMUL_NT, 0);
	check("gbi,goi->gbo", IR_EIN_MATMUL_NT, 1);
	check("xmk,xnk->xmn", IR_EIN_MATMUL_NT, 1);
	check("abmk,abnk->abmn", IR_EIN_MATMUL_NT, 2);
	check("ts,ds->td", IR_EIN_MATMUL_NT, 0);
	check(" t d , e d -> t e ", IR_EIN_MATMUL_NT, 0);
	check("mk,kn->mn", IR_EIN_MATMUL_NN, 0);
	check("gmk,gkn->gmn", IR_EIN_MATMUL_NN, 1);
	check("edf->efd", IR_EIN_PERMUTE, 1);
	check("ab->ba", IR_EIN_PERMUTE, 0);
	check("abc->acb", IR_EIN_PERMUTE, 1);
	check("abc->abc", IR_EIN_IDENTITY, 3);
	check("a->a", IR_EIN_IDENTITY, 1);
	/* near misses */
	check("mk,nk->nm", IR_EIN_OTHER, 0);      /* the output transposed */
	check("km,nk->mn", IR_EIN_OTHER, 0);      /* the left operand transposed */
	check("gbi,goi->bgo", IR_EIN_OTHER, 0);   /* the batch letter out of place */
	check("gbi,hoi->gbo", IR_EIN_OTHER, 0);   /* a letter summed that is no batch */
	check("bij,oij->bo", IR_EIN_OTHER, 0);    /* two contracted letters */
	check("bi,oj->bo", IR_EIN_OTHER, 0);      /* an outer product with reductions */
	check("bi,oi->bio", IR_EIN_OTHER, 0);     /* nothing contracted */
	check("ab->a", IR_EIN_OTHER, 0);          /* a reduction */
	check("ab,b->ab", IR_EIN_OTHER, 0);       /* a broadcast product */
}

static void test_node_form(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "t");
	int64_t td[2] = {3, 4}, od[2] = {5, 4};
	moe_id x = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, x, MOE_F32, td, 2);
	moe_id w = moe_node_new(g, MOE_OP_INPUT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, w, MOE_F32, od, 2);
	moe_id y = ir_b_einsum(g, "td,od->to", x, w, moe_loc_none());
	int batch = -1;
	assert_int_equal(ir_node_einsum_form(N(g, y), &batch), IR_EIN_MATMUL_NT);
	assert_int_equal(batch, 0);
	assert_int_equal(ir_node_einsum_form(N(g, x), &batch), IR_EIN_OTHER);
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_forms),
		cmocka_unit_test(test_node_form),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
