/* Unit tests of the block_loop op on the reference interpreter: a loop with
 * every kind of data input (b, e, i, r) and every blockarg role equals,
 * bit for bit, the flat graph written by hand from docs/ir.md's definition
 * (per-block rows under valid masks, the experts' weights gathered per block,
 * blocks past nblocks zero); a block past nblocks and rows past a block's
 * count are never read; a faulting expert index of a live block is an
 * error at the loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "interp/interp.h"
#include "ir/ir.h"
#include "moec/passes.h"

/* G = 3 blocks of B = 2 rows, D = 4, E = 4 experts of [O = 6, D] weights,
 * a source x of N = 5 rows read by list. */
#define DECLS \
	"  %0 = input \"nblocks\" : i32[]\n" \
	"  %1 = input \"bexp\" : i32[3]\n" \
	"  %2 = input \"rows\" : i32[3]\n" \
	"  %3 = input \"blocks\" : f32[3, 2, 4]\n" \
	"  %4 = weight \"up\" {source=\"up\"} : f32[4, 6, 4]\n" \
	"  %5 = input \"bias\" : f32[6]\n" \
	"  %6 = input \"x\" : f32[5, 4]\n" \
	"  %7 = input \"list\" : i32[3, 2]\n"

static const char loop_text[] =
	"moeir 1\nlayer @loop dtype=f32 {\n" DECLS
	"  %8 = block_loop(%0, %1, %2, %3, %4, %5, %6, %7) {kinds=\"beir\"} : f32[3, 2, 6] body {\n"
	"    %0 = blockarg {role=\"rows\"} : i32[]\n"
	"    %1 = blockarg {role=\"in\", index=0} : f32[2, 4]\n"
	"    %2 = blockarg {role=\"in\", index=1} : f32[6, 4]\n"
	"    %3 = blockarg {role=\"in\", index=2} : f32[6]\n"
	"    %4 = blockarg {role=\"in\", index=3} : f32[2, 4]\n"
	"    %5 = blockarg {role=\"expert\"} : i32[]\n"
	"    %6 = blockarg {role=\"index\"} : i32[]\n"
	"    %7 = einsum(%1, %2) valid(%0) {eq=\"bi,oi->bo\"} : f32[2, 6]\n"
	"    %8 = einsum(%4, %2) valid(%0) {eq=\"bi,oi->bo\"} : f32[2, 6]\n"
	"    %9 = add(%7, %8) valid(%0) : f32[2, 6]\n"
	"    %10 = add(%9, %3) valid(%0) : f32[2, 6]\n"
	"    %11 = mul(%5, %6) : i32[]\n"
	"    %12 = cast(%11) {to=\"f32\"} : f32[]\n"
	"    %13 = add(%10, %12) valid(%0) : f32[2, 6]\n"
	"    yield %13\n"
	"  }\n"
	"  output %8\n}\n";

/* The same by the definition: a block's rows count only while g < nblocks,
 * the expert weights are gathered per live block, the rows by list are the
 * source rows below the count, the expert and index are [G, 1, 1] values. */
static const char flat_text[] =
	"moeir 1\nlayer @flat dtype=f32 {\n" DECLS
	"  %8 = iota {axis=0} : i32[3]\n"
	"  %9 = lt(%8, %0) : bool[3]\n"
	"  %10 = const {value=0} : i32[]\n"
	"  %11 = select(%9, %2, %10) : i32[3]\n"
	"  %12 = gather(%4, %1) valid(%0) {axis=0} : f32[3, 6, 4]\n"
	"  %13 = einsum(%3, %12) valid(%11) {eq=\"gbi,goi->gbo\"} : f32[3, 2, 6]\n"
	"  %14 = gather(%6, %7) valid(%11) {axis=0} : f32[3, 2, 4]\n"
	"  %15 = einsum(%14, %12) valid(%11) {eq=\"gbi,goi->gbo\"} : f32[3, 2, 6]\n"
	"  %16 = add(%13, %15) valid(%11) : f32[3, 2, 6]\n"
	"  %17 = reshape(%5) {shape=[1, 1, 6]} : f32[1, 1, 6]\n"
	"  %18 = add(%16, %17) valid(%11) : f32[3, 2, 6]\n"
	"  %19 = mul(%1, %8) : i32[3]\n"
	"  %20 = cast(%19) {to=\"f32\"} : f32[3]\n"
	"  %21 = reshape(%20) {shape=[3, 1, 1]} : f32[3, 1, 1]\n"
	"  %22 = add(%18, %21) valid(%11) : f32[3, 2, 6]\n"
	"  output %22\n}\n";

static moe_module *parse(moe_ctx *c, const char *text)
{
	moe_module *m = moe_module_parse_text(c, "t.moeir", text, strlen(text));
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	assert_int_equal(moe_module_verify(c, m), MOE_OK);
	return m;
}

static void set_i32(moe_ctx *c, moe_tensor_map *b, const char *name, int rank, const int64_t *shape,
	const int32_t *v)
{
	moe_tensor *t = moe_tensor_new(c, MOE_I32, rank, shape);
	memcpy(t->data, v, t->nbytes);
	assert_int_equal(moe_tensor_map_set(b, name, t), MOE_OK);
}

/* Binds the control values and the list; the float data come from seed. */
static moe_tensor_map *bindings(moe_ctx *c, const moe_graph *g, uint64_t seed, int32_t nblocks,
	const int32_t *bexp, const int32_t *rows, const int32_t *list)
{
	moe_tensor_map *b = NULL;
	assert_int_equal(ir_interp_random_bindings(c, g, seed, &b), MOE_OK);
	int64_t g3 = 3, gl[2] = {3, 2};
	set_i32(c, b, "nblocks", 0, NULL, &nblocks);
	set_i32(c, b, "bexp", 1, &g3, bexp);
	set_i32(c, b, "rows", 1, &g3, rows);
	set_i32(c, b, "list", 2, gl, list);
	return b;
}

static void run_both(moe_ctx *c, const moe_tensor_map *b, moe_tensor **lo, moe_tensor **fo)
{
	moe_module *lm = parse(c, loop_text), *fm = parse(c, flat_text);
	if (moe_interp_run(c, moe_module_graph(lm, 0), b, lo) != MOE_OK ||
		moe_interp_run(c, moe_module_graph(fm, 0), b, fo) != MOE_OK) {
		moe_diag_print(c, stderr);
		fail_msg("the interpreter failed");
	}
	moe_module_free(lm);
	moe_module_free(fm);
}

static void test_loop_equals_flat(void **st)
{
	(void)st;
	static const struct {
		int32_t nblocks, bexp[3], rows[3], list[6];
	} cases[] = {
		{3, {2, 0, 3}, {2, 1, 2}, {4, 0, 3, 3, 1, 2}},
		{2, {1, 1, 0}, {1, 2, 2}, {0, 1, 4, 2, 3, 3}}, /* block 2 past nblocks: zero */
		{0, {3, 2, 1}, {2, 2, 2}, {0, 0, 0, 0, 0, 0}}, /* no block */
		{1, {3, 0, 0}, {0, 0, 0}, {1, 2, 3, 4, 0, 1}}, /* a block with no valid row */
	};
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
		for (uint64_t seed = 1; seed <= 3; seed++) {
			moe_ctx *c = moe_ctx_new(NULL, NULL);
			moe_module *lm = parse(c, loop_text);
			moe_tensor_map *b = bindings(c, moe_module_graph(lm, 0), seed, cases[k].nblocks, cases[k].bexp,
				cases[k].rows, cases[k].list);
			moe_module_free(lm);
			moe_tensor *lo[1] = {NULL}, *fo[1] = {NULL};
			run_both(c, b, lo, fo);
			assert_int_equal(lo[0]->nbytes, fo[0]->nbytes);
			assert_memory_equal(lo[0]->data, fo[0]->data, lo[0]->nbytes);
			/* some value is nonzero where a block computes, so the comparison bites */
			const float *y = lo[0]->data;
			bool any = false;
			for (int i = 0; i < 36; i++)
				any |= y[i] != 0;
			assert_true(any == (cases[k].nblocks > 0 && (cases[k].rows[0] > 0 || cases[k].nblocks > 1)));
			moe_tensor_free(c, lo[0]);
			moe_tensor_free(c, fo[0]);
			moe_tensor_map_free(b);
			moe_ctx_free(c);
		}
}

/* Past nblocks nothing is read (a block's expert 99 and list rows 99 are
 * garbage there), nor past a block's row count; a live block's expert out
 * of range is an error at the loop. */
static void test_loop_reads_only_live_rows(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *lm = parse(c, loop_text);
	const moe_graph *g = moe_module_graph(lm, 0);
	moe_tensor_map *b = bindings(c, g, 7, 2, (const int32_t[]){1, 2, 99}, (const int32_t[]){2, 1, 2},
		(const int32_t[]){0, 4, 2, 99, 99, 99});
	moe_tensor *lo[1] = {NULL};
	assert_int_equal(moe_interp_run(c, g, b, lo), MOE_OK);
	const float *y = lo[0]->data;
	for (int i = 24; i < 36; i++) /* block 2 */
		assert_true(y[i] == 0);
	for (int i = 18; i < 24; i++) /* block 1, row 1 */
		assert_true(y[i] == 0);
	moe_tensor_free(c, lo[0]);
	moe_tensor_map_free(b);

	b = bindings(c, g, 7, 3, (const int32_t[]){1, 2, 9}, (const int32_t[]){2, 1, 2}, (const int32_t[]){0, 4, 2, 1, 1, 1});
	lo[0] = NULL;
	assert_int_equal(moe_interp_run(c, g, b, lo), MOE_ERR_INVALID);
	assert_null(lo[0]);
	const char *msg;
	moe_diag_get(c, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "block 2's expert 9 is outside 0..3"));
	moe_tensor_map_free(b);
	moe_module_free(lm);
	moe_ctx_free(c);
}

/* The body survives clone, the passes that recurse into it and a rebuild,
 * and is freed with its graph (the sanitizer builds check the frees). */
static void test_body_clone_and_passes(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = parse(c, loop_text);
	moe_graph *g = moe_module_graph(m, 0);
	moe_graph *k = ir_graph_clone(g);
	assert_int_equal(k->nbodies, 1);
	assert_ptr_not_equal(k->bodies[0], g->bodies[0]);
	assert_int_equal(k->bodies[0]->nnodes, g->bodies[0]->nnodes);
	assert_true(k->bodies[0]->is_body);
	ir_graph_free(k);
	assert_int_equal(moe_run_pipeline_text(c, "infer-shapes,canonicalize,cse,dce", m, NULL), MOE_OK);
	g = moe_module_graph(m, 0);
	assert_int_equal(g->nbodies, 1);
	assert_int_equal(moe_graph_verify(c, g), MOE_OK);
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loop_equals_flat),
		cmocka_unit_test(test_loop_reads_only_live_rows),
		cmocka_unit_test(test_body_clone_and_passes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
