/* The host backend's elementwise chains (backend-c/lower.c): elementwise nodes
 * computed inside their users' loops instead of stored, and transcendentals of
 * a bf16 value looked up in a table of their 2^16 results once enough elements
 * are computed. Both must give bitwise the reference interpreter's values.
 *
 * Layer 1: x holds every bf16 bit pattern twice (NaNs of both kinds and
 * signs, +-inf, +-0, subnormals), so the table of each op is read at every
 * entry; u is random. Outputs: exp of a bf16 node (bf16 result) and
 * tanh/erf/sqrt/log/rsqrt of x cast to f32; the SwiGLU chain of x (sigmoid,
 * two products, a cast back to bf16, as the experts' hidden layer), and the
 * same sigmoid on half the rows (below the table threshold: computed per
 * element). For a NaN x, g * sigmoid(g) multiplies two NaNs of opposite sign
 * (sigmoid's goes through -g): the result is the first operand's NaN by the
 * rule of docs/abi.md, whichever operand order the compilers chose.
 * Layer 2: a SwiGLU `experts` layer whose hidden layer has T*K*F = 2^17 valid
 * elements under the block mask (the table is chosen at run time from the
 * valid rows).
 * Engines: LLVM on 1, 2 and 3 threads, LLVM with portable kernels, the C
 * engine; all against the interpreter (layer 2 with the vdpbf16ps kernels
 * only among the thread counts, since those kernels' dot products have their
 * own bound, docs/abi.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/backend.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "moec/runtime.h"
#include "host_layer.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

static moe_graph *layer(moe_ctx *c, const char *text, moe_module **mod)
{
	return host_layer(c, "el.moe", text, strlen(text), NULL, mod);
}

static moe_tensor *tensor(moe_ctx *c, int rank, const int64_t *shape, int pattern, float scale)
{
	moe_tensor *x = moe_tensor_new(c, MOE_BF16, rank, shape);
	assert_non_null(x);
	uint16_t *d = x->data;
	for (size_t i = 0; i < x->nbytes / 2; i++)
		d[i] = pattern ? (uint16_t)i : moe_f32_to_bf16(scale * ((float)(int)(next32() % 2001) - 1000.0f) / 1000.0f);
	return x;
}

static void run_all(moe_ctx *c, moe_graph *g, moe_tensor_map *b, int nout, bool vs_interp_fast)
{
	moe_tensor *ref[8] = {NULL};
	assert_int_equal(moe_interp_run(c, g, b, ref), MOE_OK);
	static const struct {
		moe_host_engine en;
		int threads, portable;
		const char *what;
	} runs[] = {{MOE_HOST_LLVM, 1, 0, "llvm 1 thread"}, {MOE_HOST_LLVM, 2, 0, "llvm 2 threads"},
		{MOE_HOST_LLVM, 3, 0, "llvm 3 threads"}, {MOE_HOST_LLVM, 2, 1, "llvm portable"},
		{MOE_HOST_C, 0, 0, "c engine"}};
	moe_tensor *first[8] = {NULL};
	int bad = 0;
	for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
		moe_host_opts o;
		moe_host_opts_init(&o);
		o.engine = runs[r].en;
		o.threads = runs[r].threads;
		o.portable = runs[r].portable;
		o.no_cache = 1;
		moe_tensor *out[8] = {NULL};
		moe_status s = moe_host_run_opts(c, g, b, &o, out, NULL);
		if (s)
			moe_diag_print(c, stderr);
		assert_int_equal(s, MOE_OK);
		bool fast = runs[r].en == MOE_HOST_LLVM && !runs[r].portable;
		for (int i = 0; i < nout; i++) {
			assert_int_equal(out[i]->nbytes, ref[i]->nbytes);
			/* the vdpbf16ps kernels: the thread counts agree among themselves */
			const moe_tensor *want = fast && !vs_interp_fast ? (first[i] ? first[i] : out[i]) : ref[i];
			if (memcmp(out[i]->data, want->data, want->nbytes)) {
				size_t k = 0, w = out[i]->dtype == MOE_BF16 ? 2 : 4;
				while (!memcmp((char *)out[i]->data + k * w, (char *)want->data + k * w, w))
					k++;
				uint32_t gv = 0, wv = 0;
				memcpy(&gv, (char *)out[i]->data + k * w, w);
				memcpy(&wv, (char *)want->data + k * w, w);
				print_message("%s: output %d differs from %s at element %zu: 0x%x, want 0x%x", runs[r].what, i,
					want == ref[i] ? "the interpreter" : "1 thread", k, gv, wv);
				bad++;
			}
			if (fast && !first[i])
				first[i] = out[i];
			else
				moe_tensor_free(c, out[i]);
		}
	}
	for (int i = 0; i < nout; i++) {
		moe_tensor_free(c, ref[i]);
		moe_tensor_free(c, first[i]);
	}
	assert_int_equal(bad, 0);
}

static void test_elem_chains(void **state)
{
	(void)state;
	static const char text[] = "layer el {\n"
				   "  dim R = 512, C = 256, H = 256\n"
				   "  input x : bf16[R, C]\n"
				   "  input u : bf16[R, C]\n"
				   "  g = cast(x, f32)\n"
				   "  h = cast(cast(u, f32) * (g * sigmoid(g)), bf16)\n"
				   "  e = exp(x)\n"
				   "  t = tanh(g) + erf(g) * sqrt(g) - log(g) * rsqrt(g)\n"
				   "  gh = cast(slice(x, axis=0, start=0, stop=H), f32)\n"
				   "  sh = gh * sigmoid(gh)\n"
				   "  output h, e, t, sh\n"
				   "}\n";
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_graph *g = layer(c, text, &m);
	moe_tensor_map *b = moe_tensor_map_new(c);
	int64_t shape[2] = {512, 256};
	assert_int_equal(moe_tensor_map_set(b, "x", tensor(c, 2, shape, 1, 0)), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "u", tensor(c, 2, shape, 0, 4.0f)), MOE_OK);
	run_all(c, g, b, 4, true);
	/* the rule itself, on the reference (every engine equals it above): for a
	 * NaN x, h is x's NaN (sign and payload), quieted */
	moe_tensor *ref[4] = {NULL};
	assert_int_equal(moe_interp_run(c, g, b, ref), MOE_OK);
	const uint16_t *hx = moe_tensor_map_get(b, "x")->data, *hh = ref[0]->data;
	int nans = 0;
	for (size_t i = 0; i < ref[0]->nbytes / 2; i++)
		if ((hx[i] & 0x7fff) > 0x7f80) {
			assert_int_equal(hh[i], hx[i] | 0x0040);
			nans++;
		}
	assert_int_equal(nans, 2 * 2 * 127);
	for (int i = 0; i < 4; i++)
		moe_tensor_free(c, ref[i]);
	moe_tensor_map_free(b);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_elem_experts(void **state)
{
	(void)state;
	static const char text[] = "layer ex {\n"
				   "  dim T = 64, D = 64, F = 1024, E = 4, K = 2, B = 32\n"
				   "  dtype bf16\n"
				   "  input x : [T, D]\n"
				   "  weight router : [E, D] = \"r\"\n"
				   "  weight gate : [E, F, D] = \"g\"\n"
				   "  weight up : [E, F, D] = \"u\"\n"
				   "  weight down : [E, D, F] = \"d\"\n"
				   "  logits = einsum(\"td,ed->te\", x, router)\n"
				   "  p = softmax(cast(logits, f32), axis=1)\n"
				   "  idx = topk(p, K)\n"
				   "  w = take_along(p, idx, axis=1)\n"
				   "  y = experts(x, idx, cast(w, dtype), gate=gate, up=up, down=down, act=\"swiglu\", block=B)\n"
				   "  output y\n"
				   "}\n";
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_graph *g = layer(c, text, &m);
	moe_tensor_map *b = moe_tensor_map_new(c);
	int64_t xs[2] = {64, 64}, rs[2] = {4, 64}, gs[3] = {4, 1024, 64}, ds[3] = {4, 64, 1024};
	assert_int_equal(moe_tensor_map_set(b, "x", tensor(c, 2, xs, 0, 2.0f)), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "router", tensor(c, 2, rs, 0, 0.5f)), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "gate", tensor(c, 3, gs, 0, 0.5f)), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "up", tensor(c, 3, gs, 0, 0.5f)), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "down", tensor(c, 3, ds, 0, 0.1f)), MOE_OK);
	run_all(c, g, b, 1, false);
	moe_tensor_map_free(b);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* Layer 3: the MoE combine, a row reduction over a reshape [A, K, C] of a
 * product of [A K, C] (backend-c/lower.c mark_inline): the product is
 * computed in the reduction's loop, not stored (the emitted C has no loop of
 * its own for it), with bitwise the interpreter's sums on every engine. */
static void test_elem_combine(void **state)
{
	(void)state;
	static const char text[] = "layer cb {\n"
				   "  dim A = 256, K = 8, C = 64, R = 2048\n"
				   "  input d : bf16[R, C]\n"
				   "  input w : bf16[R, 1]\n"
				   "  p = cast(d, f32) * cast(w, f32)\n"
				   "  s = reduce_sum(reshape(p, [A, K, C]), axis=1)\n"
				   "  m = reduce_max(reshape(cast(d, f32) - cast(w, f32), [A, K, C]), axis=1)\n"
				   "  output s, m\n"
				   "}\n";
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m;
	moe_graph *g = layer(c, text, &m);
	moe_tensor_map *b = moe_tensor_map_new(c);
	int64_t ds[2] = {2048, 64}, ws[2] = {2048, 1};
	assert_int_equal(moe_tensor_map_set(b, "d", tensor(c, 2, ds, 0, 3.0f)), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "w", tensor(c, 2, ws, 0, 1.0f)), MOE_OK);
	run_all(c, g, b, 2, true);
	char *src = NULL;
	assert_int_equal(moe_emit_c_string(c, g, &src), MOE_OK);
	assert_non_null(strstr(src, "= reduce_sum */"));
	assert_non_null(strstr(src, "= reduce_max */"));
	assert_null(strstr(src, "= mul */"));
	assert_null(strstr(src, "= sub */"));
	moe_free(c, src);
	moe_tensor_map_free(b);
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_elem_chains),
		cmocka_unit_test(test_elem_experts),
		cmocka_unit_test(test_elem_combine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
