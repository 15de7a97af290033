/* tests/unit/test_diag_limit.c: the context keeps at most 20 errors (like
 * cc): the 20th is followed by one "too many errors" note, later diagnostics
 * are dropped but still counted, and the limit can be changed or removed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "moec/moec.h"

static void errors(moe_ctx *c, int n)
{
	for (int i = 0; i < n; i++)
		moe_diag(c, MOE_DIAG_ERROR, moe_loc_file(c, "f.moe"), "error %d", i);
}

static void default_limit(void **state)
{
	(void)state;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	errors(c, 19);
	assert_false(moe_diag_limit_reached(c));
	assert_int_equal(moe_diag_count(c), 19);
	errors(c, 1);
	assert_true(moe_diag_limit_reached(c));
	assert_int_equal(moe_diag_count(c), 21); /* 20 errors + the note */
	moe_diag_kind k;
	const char *msg;
	moe_diag_get(c, 20, &k, NULL, &msg);
	assert_int_equal(k, MOE_DIAG_NOTE);
	assert_string_equal(msg, "too many errors; stopping");
	errors(c, 50);
	moe_diag(c, MOE_DIAG_WARNING, moe_loc_none(), "dropped");
	assert_int_equal(moe_diag_count(c), 21);
	assert_int_equal(moe_error_count(c), 70);
	moe_diag_clear(c);
	assert_false(moe_diag_limit_reached(c));
	moe_ctx_free(c);
}

static void other_limits(void **state)
{
	(void)state;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_diag_set_limit(c, 0);
	errors(c, 100);
	assert_false(moe_diag_limit_reached(c));
	assert_int_equal(moe_diag_count(c), 100);
	moe_diag_clear(c);
	moe_diag_set_limit(c, 3);
	errors(c, 5);
	assert_int_equal(moe_diag_count(c), 4);
	assert_int_equal(moe_error_count(c), 5);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(default_limit), cmocka_unit_test(other_limits)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
