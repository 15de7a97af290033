/* tests/unit/test_binding_api.c: the entry points a language binding needs
 * (python/moec): diagnostics as text (moe_diag_string, the bytes of
 * moe_diag_print) and a checkpoint over tensors in memory
 * (moe_checkpoint_open_tensors), whose weights bind exactly as the same
 * tensors from a safetensors file do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/moec.h"

static const char bad_layer[] = "layer bad {\n  dim T = 2\n  input x : [T, Q]\n  output x\n}\n";

static void diag_string_matches_print(void **state)
{
	(void)state;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *empty = moe_diag_string(c);
	assert_non_null(empty);
	assert_string_equal(empty, "");
	moe_free(c, empty);
	assert_null(moe_parse_moe(c, "bad.moe", bad_layer, strlen(bad_layer), NULL));
	char *s = moe_diag_string(c);
	assert_non_null(s);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	moe_diag_print(c, f);
	fclose(f);
	assert_string_equal(s, buf);
	/* located, with the source line and the caret under the column */
	assert_non_null(strstr(s, "bad.moe:3:"));
	assert_non_null(strstr(s, ": error: "));
	assert_non_null(strstr(s, "input x : [T, Q]"));
	assert_non_null(strchr(s, '^'));
	free(buf);
	moe_free(c, s);
	moe_ctx_free(c);
}

static const char layer_text[] =
	"layer tiny {\n"
	"  dim T = 3, D = 4, F = 2, E = 2, K = 1, B = 2\n"
	"  dtype bf16\n"
	"  input  x : [T, D]\n"
	"  weight router : [E, D] = \"r\"\n"
	"  weight w1 : [E, F, D] = \"e.{e}.w1\"\n"
	"  weight w3 : [E, F, D] = \"e.{e}.w3\"\n"
	"  weight w2 : [E, D, F] = \"e.{e}.w2\"\n"
	"  p   = softmax(cast(einsum(\"td,ed->te\", x, router), f32), axis=1)\n"
	"  idx = topk(p, k=K)\n"
	"  w   = take_along(p, idx, axis=1)\n"
	"  y   = experts(x, idx, w, gate=w1, up=w3, down=w2, act=\"swiglu\", block=B)\n"
	"  output y\n"
	"}\n";

static void memory_checkpoint_binds(void **state)
{
	(void)state;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_parse_moe(c, "tiny.moe", layer_text, strlen(layer_text), NULL);
	assert_non_null(m);
	const moe_graph *g = moe_module_graph(m, 0);
	float r[8], w13[4][8], w2[2][8];
	for (int i = 0; i < 8; i++) {
		r[i] = 0.25f * (float)(i - 3);
		for (int k = 0; k < 4; k++)
			w13[k][i] = 0.125f * (float)(i + k) - 0.3f;
		for (int k = 0; k < 2; k++)
			w2[k][i] = 0.0625f * (float)(i * (k + 1)) - 0.2f;
	}
	moe_st_tensor e[7];
	memset(e, 0, sizeof e);
	e[0] = (moe_st_tensor){.name = "r", .dtype = MOE_ST_F32, .rank = 2, .shape = {2, 4}, .data = r, .nbytes = 32};
	static const char *const names[6] = {"e.0.w1", "e.1.w1", "e.0.w3", "e.1.w3", "e.0.w2", "e.1.w2"};
	for (int k = 0; k < 6; k++) {
		int down = k >= 4;
		e[1 + k] = (moe_st_tensor){.name = names[k], .dtype = MOE_ST_F32, .rank = 2,
			.shape = {down ? 4 : 2, down ? 2 : 4}, .data = down ? w2[k - 4] : w13[k], .nbytes = 32};
	}
	moe_checkpoint *ck = moe_checkpoint_open_tensors(c, "state_dict", e, 7);
	assert_non_null(ck);
	moe_tensor_map *bind = moe_tensor_map_new(c);
	assert_int_equal(moe_weights_load_from(c, g, ck, bind), MOE_OK);
	/* converted to the node dtype (bf16) and stacked over {e}, as from a file */
	moe_tensor *t = moe_tensor_map_get(bind, "w1");
	assert_non_null(t);
	assert_int_equal(t->dtype, MOE_BF16);
	assert_int_equal(t->shape[0], 2);
	const uint16_t *h = t->data;
	assert_int_equal(h[8], moe_f32_to_bf16(w13[1][0]));
	assert_int_equal(moe_bf16_to_f32(((const uint16_t *)moe_tensor_map_get(bind, "router")->data)[7]), r[7]);
	moe_tensor_map_free(bind);
	moe_checkpoint_close(ck);

	/* bad entries: a byte size that does not fit, and a name given twice */
	e[0].nbytes = 31;
	assert_null(moe_checkpoint_open_tensors(c, "state_dict", e, 1));
	assert_true(moe_error_count(c) > 0);
	char *s = moe_diag_string(c);
	assert_non_null(strstr(s, "state_dict: error: tensor 0 ('r')"));
	moe_free(c, s);
	moe_diag_clear(c);
	e[0].nbytes = 32;
	e[1] = e[0];
	assert_null(moe_checkpoint_open_tensors(c, NULL, e, 2));
	s = moe_diag_string(c);
	assert_non_null(strstr(s, "<memory>: error: tensor 'r' is given twice"));
	moe_free(c, s);
	moe_diag_clear(c);
	/* a missing tensor names the in-memory source */
	ck = moe_checkpoint_open_tensors(c, "state_dict", e, 1);
	assert_non_null(ck);
	bind = moe_tensor_map_new(c);
	assert_int_equal(moe_weights_load_from(c, g, ck, bind), MOE_ERR_INVALID);
	s = moe_diag_string(c);
	assert_non_null(strstr(s, "tensor 'e.0.w1' not found in state_dict"));
	moe_free(c, s);
	moe_tensor_map_free(bind);
	moe_checkpoint_close(ck);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* A refused allocation inside moe_checkpoint_open_tensors: NULL, "out of
 * memory", and every block returned. */
typedef struct hook {
	long calls, fail_at;
	long long live;
} hook;

static void *alloc_hook(void *ud, void *p, size_t o, size_t n)
{
	hook *h = ud;
	if (n == 0) {
		if (p)
			h->live -= (long long)o;
		free(p);
		return NULL;
	}
	if (++h->calls == h->fail_at)
		return NULL;
	void *q = realloc(p, n);
	if (q)
		h->live += (long long)n - (long long)(p ? o : 0);
	return q;
}

static void memory_checkpoint_oom(void **state)
{
	(void)state;
	float r[8] = {0};
	moe_st_tensor e = {.name = "r", .dtype = MOE_ST_F32, .rank = 2, .shape = {2, 4}, .data = r, .nbytes = 32};
	for (long k = 1;; k++) {
		hook h = {0, 0, 0};
		moe_ctx *c = moe_ctx_new(alloc_hook, &h);
		assert_non_null(c);
		h.fail_at = h.calls + k;
		moe_checkpoint *ck = moe_checkpoint_open_tensors(c, "m", &e, 1);
		int refused = h.calls >= h.fail_at;
		if (refused) {
			assert_null(ck);
		} else {
			assert_non_null(ck);
			assert_non_null(moe_checkpoint_find(ck, "r", NULL));
		}
		moe_checkpoint_close(ck);
		moe_ctx_free(c);
		assert_int_equal(h.live, 0);
		if (!refused)
			break;
	}
}

/* A diagnostic without a file is printed under the embedder's name, never
 * the moec command's: "libmoec" until moe_ctx_set_diag_prefix names one. */
static void diag_prefix_is_the_callers(void **state)
{
	(void)state;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_diag(c, MOE_DIAG_ERROR, moe_loc_none(), "no file here");
	char *s = moe_diag_string(c);
	assert_string_equal(s, "libmoec: error: no file here\n");
	moe_free(c, s);
	moe_ctx_set_diag_prefix(c, "myapp\x1b[31m");
	s = moe_diag_string(c);
	assert_string_equal(s, "myapp?[31m: error: no file here\n");
	moe_free(c, s);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(diag_string_matches_print), cmocka_unit_test(diag_prefix_is_the_callers),
		cmocka_unit_test(memory_checkpoint_binds), cmocka_unit_test(memory_checkpoint_oom)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
