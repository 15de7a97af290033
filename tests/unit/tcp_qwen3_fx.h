/* Fixture shared by test_tcp_predict.c and test_tcp_tier.c: the Qwen3
 * example layer at small sizes (D = 40, F = 24, E = 16, K = 4, B = 8),
 * optionally as a serving layer (an i32 input n_tokens declared after x),
 * compiled for TCP. */
#ifndef MOEC_TESTS_TCP_QWEN3_FX_H
#define MOEC_TESTS_TCP_QWEN3_FX_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/frontend.h"
#include "moec/passes.h"
#include "moec/tcp.h"

/* The layer for T tokens (a serving layer: n_tokens declared after x) run
 * through the named pipeline. */
static inline moe_module *tcp_fx_qwen3_module(moe_ctx *c, int64_t T, bool serving, const char *pipeline)
{
	FILE *f = fopen(MOEC_SOURCE_DIR "/examples/qwen3_30b_a3b.moe", "rb");
	assert_non_null(f);
	char *buf = calloc(1, 1 << 16);
	assert_non_null(buf);
	size_t n = fread(buf, 1, (1 << 16) - 64, f);
	fclose(f);
	assert_true(n > 0);
	if (serving) { /* declare the token count after x */
		char *at = strstr(buf, "input  x : [T, D]\n");
		assert_non_null(at);
		at += strlen("input  x : [T, D]\n");
		const char *decl = "  input  n_tokens : i32[]\n";
		memmove(at + strlen(decl), at, strlen(at) + 1);
		memcpy(at, decl, strlen(decl));
	}
	char tv[16];
	snprintf(tv, sizeof tv, "%lld", (long long)T);
	moe_setting sets[] = {{"T", tv}, {"D", "40"}, {"F", "24"}, {"E", "16"}, {"K", "4"}, {"B", "8"}};
	moe_settings ss = {sets, sizeof sets / sizeof *sets};
	moe_module *m = moe_parse_moe(c, "qwen3.moe", buf, strlen(buf), &ss);
	free(buf);
	assert_non_null(m);
	moe_run_opts ro = {.verify = 1};
	assert_int_equal(moe_run_pipeline_text(c, pipeline, m, &ro), MOE_OK);
	return m;
}

/* The layer for T tokens run through the tcp pipeline and compiled by the
 * schedule compiler; its module returned in *mod when mod is not NULL (else
 * freed). */
static inline moe_tcp_program *tcp_fx_qwen3(moe_ctx *c, int64_t T, bool serving, moe_module **mod)
{
	moe_module *m = tcp_fx_qwen3_module(c, T, serving, "tcp");
	moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	if (mod)
		*mod = m;
	else
		moe_module_free(m);
	return p;
}

/* b[n_tokens] = n, a scalar i32 */
static inline void tcp_fx_set_tokens(moe_ctx *c, moe_tensor_map *b, int32_t n)
{
	moe_tensor *t = moe_tensor_new(c, MOE_I32, 0, NULL);
	assert_non_null(t);
	memcpy(t->data, &n, sizeof n);
	moe_tensor_map_set(b, "n_tokens", t);
}

#endif
