/* Direct tests of public functions of moec/tcp.h against their documented
 * contracts (tcp.h, docs/api.md, docs/tcp-isa.md section 8.1,
 * docs/expert-parallel.md section 6), through the public API only: writing
 * assembly, bucketed .tcpb files, HBM figures, engine names, output counts,
 * a schedule's text compiled and run, the schedule compiler's round trip,
 * the contract's floor, and expert parallelism on simulated chips. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moec/frontend.h"
#include "moec/io.h"
#include "moec/passes.h"
#include "moec/tcp.h"

static char tmpdir[] = "/tmp/moec-api-tcp-XXXXXX";

static char *tpath(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", tmpdir, name);
	return buf;
}

static void assert_diag(moe_ctx *c, const char *want)
{
	assert_true(moe_error_count(c) > 0);
	char *s = moe_diag_string(c);
	if (!strstr(s, want))
		fail_msg("wanted '%s' in:\n%s", want, s);
	moe_free(c, s);
	moe_diag_clear(c);
}

/* A layer of E = 4 SwiGLU experts, D = F = 32, K = 2, B = 4, f32; serving
 * adds n_tokens; `extra` adds a second output (the routing probabilities). */
static const char *layer_fmt = "layer lay {\n"
			       "  dim T = %lld, D = 32, F = 32, E = 4, K = 2, B = 4\n"
			       "  dtype f32\n"
			       "  input  x : [T, D]\n"
			       "%s"
			       "  weight router : [E, D]    = \"r\"\n"
			       "  weight w1     : [E, F, D] = \"e.{e}.w1\"\n"
			       "  weight w3     : [E, F, D] = \"e.{e}.w3\"\n"
			       "  weight w2     : [E, D, F] = \"e.{e}.w2\"\n"
			       "  p      = softmax(einsum(\"td,ed->te\", x, router), axis=1)\n"
			       "  idx    = topk(p, k=K)\n"
			       "  w      = take_along(p, idx, axis=1)\n"
			       "  y      = experts(x, idx, w, gate=w1, up=w3, down=w2, act=\"swiglu\", block=B)\n"
			       "  output y%s\n"
			       "}\n";

static moe_module *layer(moe_ctx *c, int64_t T, int serving, int extra, const char *pipeline)
{
	char text[2048];
	snprintf(text, sizeof text, layer_fmt, (long long)T, serving ? "  input  n_tokens : i32[]\n" : "",
		extra ? ", p" : "");
	moe_module *m = moe_parse_moe(c, "lay.moe", text, strlen(text), NULL);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	moe_run_opts ro = {.verify = 1};
	moe_status s = moe_run_pipeline_text(c, pipeline, m, &ro);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	return m;
}

static moe_tcp_program *compile(moe_ctx *c, int64_t T, int serving, int extra)
{
	moe_module *m = layer(c, T, serving, extra, "tcp");
	moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	moe_module_free(m);
	return p;
}

static char *asm_of(moe_ctx *c, const moe_tcp_program *p, size_t *len)
{
	char *s;
	assert_int_equal(moe_tcp_to_asm(c, p, &s, len), MOE_OK);
	return s;
}

static uint8_t *file_bytes(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	uint8_t *b = malloc((size_t)n + 1);
	assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	b[n] = 0; /* callers search the text with strstr */
	*len = (size_t)n;
	return b;
}

/* ---- moe_tcp_write_asm ---- */

static void test_write_asm(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_program *p = compile(c, 8, 0, 0);
	char path[256];
	tpath(path, sizeof path, "p.tcps");
	assert_int_equal(moe_tcp_write_asm(c, p, path), MOE_OK);
	size_t flen, alen;
	uint8_t *text = file_bytes(path, &flen);
	char *want = asm_of(c, p, &alen);
	assert_int_equal(flen, alen);
	assert_memory_equal(text, want, alen);
	/* the file reads back as a program printing the same */
	moe_tcp_program *back = moe_tcp_from_asm(c, path, (const char *)text, flen, NULL);
	if (!back)
		moe_diag_print(c, stderr);
	assert_non_null(back);
	size_t blen;
	char *again = asm_of(c, back, &blen);
	assert_int_equal(blen, alen);
	assert_memory_equal(again, want, alen);
	free(again);
	moe_tcp_program_free(back);
	free(text);
	/* written over an existing file, through a temporary */
	FILE *f = fopen(path, "w");
	fputs("old", f);
	fclose(f);
	assert_int_equal(moe_tcp_write_asm(c, p, path), MOE_OK);
	text = file_bytes(path, &flen);
	assert_int_equal(flen, alen);
	free(text);
	free(want);
	unlink(path);
	/* a directory that does not exist: MOE_ERR_IO, nothing written */
	tpath(path, sizeof path, "missing/p.tcps");
	assert_int_equal(moe_tcp_write_asm(c, p, path), MOE_ERR_IO);
	assert_diag(c, "missing/p.tcps");
	assert_int_equal(access(path, F_OK), -1);
	moe_tcp_program_free(p);
	moe_ctx_free(c);
}

/* ---- bucketed .tcpb ---- */

static void test_bundle(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const int64_t T[3] = {1, 4, 8};
	moe_tcp_program *p[3];
	for (int i = 0; i < 3; i++)
		p[i] = compile(c, T[i], 1, 0);
	char path[256];
	tpath(path, sizeof path, "b.tcpb");
	assert_int_equal(moe_tcp_bundle_write(c, (const moe_tcp_program *const *)p, T, 3, path), MOE_OK);

	/* is_bundle: by the header */
	size_t len;
	uint8_t *buf = file_bytes(path, &len);
	assert_true(moe_tcp_is_bundle(buf, len));
	assert_false(moe_tcp_is_bundle(buf, 8));     /* magic alone */
	assert_false(moe_tcp_is_bundle(buf, 0));
	assert_false(moe_tcp_is_bundle(NULL, len));
	uint8_t hdr[24];
	memcpy(hdr, buf, sizeof hdr);
	hdr[0] ^= 1; /* another magic */
	assert_false(moe_tcp_is_bundle(hdr, sizeof hdr));
	memcpy(hdr, buf, sizeof hdr);
	hdr[8] = 0; /* bundle version 256 (an earlier moec's) */
	hdr[9] = 1;
	assert_false(moe_tcp_is_bundle(hdr, sizeof hdr));
	uint8_t *single;
	size_t slen;
	assert_int_equal(moe_tcp_to_binary(c, p[1], &single, &slen), MOE_OK);
	assert_false(moe_tcp_is_bundle(single, slen)); /* a plain .tcpb */

	/* load: every bucket, its T and a program equal to the one written */
	moe_tcp_bundle *b = moe_tcp_bundle_load(c, path, NULL);
	if (!b)
		moe_diag_print(c, stderr);
	assert_non_null(b);
	assert_int_equal(moe_tcp_bundle_count(b), 3);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(moe_tcp_bundle_tokens(b, i), T[i]);
		const moe_tcp_program *q = moe_tcp_bundle_program(b, i);
		assert_non_null(q);
		size_t l1, l2;
		char *a1 = asm_of(c, p[i], &l1), *a2 = asm_of(c, q, &l2);
		assert_int_equal(l1, l2);
		assert_memory_equal(a1, a2, l1);
		free(a1);
		free(a2);
		assert_int_equal(moe_tcp_num_outputs(q), 1);
	}
	/* out of range and NULL */
	assert_int_equal(moe_tcp_bundle_tokens(b, 3), -1);
	assert_int_equal(moe_tcp_bundle_tokens(b, UINT32_MAX), -1);
	assert_int_equal(moe_tcp_bundle_tokens(NULL, 0), -1);
	assert_null(moe_tcp_bundle_program(b, 3));
	assert_null(moe_tcp_bundle_program(NULL, 0));
	moe_tcp_bundle_free(b);
	/* with a machine given */
	moe_tcp_machine *mach = moe_tcp_machine_default(c);
	b = moe_tcp_bundle_load(c, path, mach);
	assert_non_null(b);
	assert_int_equal(moe_tcp_bundle_tokens(b, 2), 8);
	moe_tcp_bundle_free(b);

	/* a plain .tcpb, a corrupt bundle, a missing file: NULL with a diagnostic */
	char other[256];
	tpath(other, sizeof other, "single.tcpb");
	assert_int_equal(moe_write_file_atomic(c, other, single, slen), MOE_OK);
	assert_null(moe_tcp_bundle_load(c, other, NULL));
	assert_diag(c, "not a valid bucketed .tcpb: no bundle header (magic MOECTCPB, version 257)");
	buf[len - 9] ^= 0x40;
	assert_int_equal(moe_write_file_atomic(c, other, buf, len), MOE_OK);
	assert_null(moe_tcp_bundle_load(c, other, NULL));
	assert_diag(c, "single.tcpb");
	tpath(other, sizeof other, "none.tcpb");
	assert_null(moe_tcp_bundle_load(c, other, NULL));
	assert_diag(c, "none.tcpb");
	free(single);
	free(buf);
	moe_tcp_machine_free(c, mach);
	for (int i = 0; i < 3; i++)
		moe_tcp_program_free(p[i]);
	moe_ctx_free(c);
}

/* ---- HBM figures ---- */

static void test_hbm(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	/* the built-in RNGD: 48 GiB of HBM (docs/tcp-model.md, memory.hbm_bytes) */
	assert_true(moe_tcp_machine_hbm_capacity(c, NULL) == 51539607552.0);
	moe_tcp_machine *d = moe_tcp_machine_default(c);
	assert_true(moe_tcp_machine_hbm_capacity(c, d) == 51539607552.0);
	moe_tcp_machine_free(c, d);
	/* a machine description read from JSON: its own figure */
	size_t len;
	uint8_t *json = file_bytes(MOEC_SOURCE_DIR "/backend-tcp/isa/machine.json", &len);
	char *at = strstr((char *)json, "\"hbm_bytes\": 51539607552,");
	assert_non_null(at);
	memcpy(at, "\"hbm_bytes\": 1073741824, ", strlen("\"hbm_bytes\": 1073741824, "));
	moe_tcp_machine *m = moe_tcp_machine_parse(c, "small.json", (const char *)json, len);
	free(json);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	assert_true(moe_tcp_machine_hbm_capacity(c, m) == 1073741824.0);
	moe_tcp_machine_free(c, m);

	/* a program's HBM: its weights at least the layer's f32 weights
	 * (router E D, three [E, F, D]: 4 (4 32 + 3 4 32 32) bytes) and its end
	 * past its weights, inputs and outputs (x and y [8, 32] f32) */
	moe_tcp_program *p = compile(c, 8, 0, 0);
	int64_t total = -1, weights = -1;
	moe_tcp_program_hbm(p, &total, &weights);
	int64_t wbytes = 4 * (4 * 32 + 3 * 4 * 32 * 32);
	assert_true(weights >= wbytes);
	assert_true(total >= weights + 2 * 8 * 32 * 4);
	assert_true((double)total <= moe_tcp_machine_hbm_capacity(c, NULL));
	/* either output may be NULL */
	int64_t t2 = -1, w2 = -1;
	moe_tcp_program_hbm(p, &t2, NULL);
	moe_tcp_program_hbm(p, NULL, &w2);
	moe_tcp_program_hbm(p, NULL, NULL);
	assert_int_equal(t2, total);
	assert_int_equal(w2, weights);
	/* twice the tokens: the same weights, no less HBM in all */
	moe_tcp_program *p16 = compile(c, 16, 0, 0);
	int64_t t16, w16;
	moe_tcp_program_hbm(p16, &t16, &w16);
	assert_int_equal(w16, weights);
	assert_true(t16 >= total);
	moe_tcp_program_free(p16);
	/* NULL program: nothing placed */
	moe_tcp_program_hbm(NULL, &t2, &w2);
	assert_int_equal(t2, 0);
	assert_int_equal(w2, 0);
	moe_tcp_program_free(p);
	moe_ctx_free(c);
}

/* ---- engines and outputs ---- */

static void test_engine_name(void **st)
{
	(void)st;
	/* the engines of docs/tcp-isa.md, in the enum's order */
	assert_string_equal(moe_tcp_engine_name(MOE_TCP_ENGINE_CONTROL), "control");
	assert_string_equal(moe_tcp_engine_name(MOE_TCP_ENGINE_MAIN), "main");
	assert_string_equal(moe_tcp_engine_name(MOE_TCP_ENGINE_SUB), "sub");
	assert_string_equal(moe_tcp_engine_name(MOE_TCP_ENGINE_DMA), "dma");
	assert_string_equal(moe_tcp_engine_name(MOE_TCP_ENGINE_CONTRACTION), "contraction");
	assert_string_equal(moe_tcp_engine_name(MOE_TCP_ENGINE_VECTOR), "vector");
	assert_string_equal(moe_tcp_engine_name(MOE_TCP_NENGINES), "?");
	assert_string_equal(moe_tcp_engine_name(-1), "?");
	assert_string_equal(moe_tcp_engine_name(1000), "?");
}

static moe_tensor_map *bind_for(moe_ctx *c, const moe_tcp_program *p, moe_checkpoint *ck, const moe_tensor *x)
{
	moe_module *iface = moe_tcp_interface(c, p);
	assert_non_null(iface);
	moe_tensor_map *b = moe_tensor_map_new(c);
	if (moe_weights_load_from(c, moe_module_graph(iface, 0), ck, b) != MOE_OK)
		moe_diag_print(c, stderr);
	moe_tensor *xc = moe_tensor_new(c, x->dtype, x->rank, x->shape);
	memcpy(xc->data, x->data, x->nbytes);
	moe_tensor_map_set(b, "x", xc);
	moe_module_free(iface);
	return b;
}

/* pa and pb run on the same checkpoint and x: their y byte for byte equal. */
static void assert_same_y(moe_ctx *c, const moe_tcp_program *pa, const moe_tcp_program *pb, moe_checkpoint *ck,
	const moe_tensor *x)
{
	moe_tensor *ya[2] = {NULL, NULL}, *yb[2] = {NULL, NULL};
	moe_tensor_map *ba = bind_for(c, pa, ck, x), *bb = bind_for(c, pb, ck, x);
	assert_int_equal(moe_tcp_run(c, pa, ba, NULL, ya, NULL), MOE_OK);
	assert_int_equal(moe_tcp_run(c, pb, bb, NULL, yb, NULL), MOE_OK);
	assert_int_equal(ya[0]->nbytes, yb[0]->nbytes);
	assert_memory_equal(ya[0]->data, yb[0]->data, ya[0]->nbytes);
	moe_tensor_free(c, ya[0]);
	moe_tensor_free(c, yb[0]);
	moe_tensor_map_free(ba);
	moe_tensor_map_free(bb);
}

/* Random weights of the layer, as an in-memory checkpoint (arrays in *keep). */
static moe_checkpoint *random_ck(moe_ctx *c, float **keep)
{
	moe_st_tensor t[13];
	size_t n = 0, at = 0;
	float *all = *keep = malloc(sizeof(float) * (4 * 32 + 3 * 4 * 32 * 32));
	uint64_t s = 12345;
	for (size_t i = 0; i < 4 * 32 + 3 * 4 * 32 * 32; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		all[i] = ((float)(s >> 40) / (float)(1 << 24) - 0.5f) * 0.5f;
	}
	t[n++] = (moe_st_tensor){.name = "r", .dtype = MOE_ST_F32, .rank = 2, .shape = {4, 32}, .data = all,
		.nbytes = 4 * 32 * 4};
	at = 4 * 32;
	static char names[12][32];
	for (int e = 0; e < 4; e++)
		for (int k = 0; k < 3; k++) {
			char *nm = names[e * 3 + k];
			snprintf(nm, sizeof names[0], "e.%d.w%d", e, k == 0 ? 1 : k == 1 ? 3 : 2);
			t[n++] = (moe_st_tensor){.name = nm, .dtype = MOE_ST_F32, .rank = 2, .shape = {32, 32},
				.data = all + at, .nbytes = 32 * 32 * 4};
			at += 32 * 32;
		}
	moe_checkpoint *ck = moe_checkpoint_open_tensors(c, "random", t, n);
	assert_non_null(ck);
	return ck;
}

static moe_tensor *random_x(moe_ctx *c, int64_t T)
{
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 2, (int64_t[]){T, 32});
	uint64_t s = 777;
	for (int64_t i = 0; i < T * 32; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		((float *)x->data)[i] = (float)(s >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
	}
	return x;
}

static void test_num_outputs(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	float *keep;
	moe_checkpoint *ck = random_ck(c, &keep);
	moe_tensor *x = random_x(c, 8);
	for (int extra = 0; extra < 2; extra++) {
		moe_module *m = layer(c, 8, 0, extra, "tcp");
		assert_int_equal(moe_graph_num_outputs(moe_module_graph(m, 0)), 1 + extra);
		moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), NULL);
		assert_non_null(p);
		assert_int_equal(moe_tcp_num_outputs(p), 1 + extra);
		/* a run returns that many outputs, of the graph's outputs' shapes */
		moe_tensor_map *b = bind_for(c, p, ck, x);
		moe_tensor *out[3] = {NULL, NULL, NULL};
		moe_status s = moe_tcp_run(c, p, b, NULL, out, NULL);
		if (s)
			moe_diag_print(c, stderr);
		assert_int_equal(s, MOE_OK);
		for (int k = 0; k <= extra; k++) {
			moe_id o = moe_graph_output(moe_module_graph(m, 0), (uint32_t)k);
			assert_non_null(out[k]);
			assert_int_equal(out[k]->shape[1], moe_node_shape(moe_module_graph(m, 0), o)[1]);
			moe_tensor_free(c, out[k]);
		}
		assert_null(out[1 + extra]);
		/* the same count after a binary round trip */
		uint8_t *bin;
		size_t len;
		assert_int_equal(moe_tcp_to_binary(c, p, &bin, &len), MOE_OK);
		moe_tcp_program *q = moe_tcp_from_binary(c, "q.tcpb", bin, len, NULL);
		assert_int_equal(moe_tcp_num_outputs(q), 1 + extra);
		moe_tcp_program_free(q);
		free(bin);
		moe_tensor_map_free(b);
		moe_tcp_program_free(p);
		moe_module_free(m);
	}
	moe_tensor_free(c, x);
	moe_checkpoint_close(ck);
	free(keep);
	moe_ctx_free(c);
}

/* ---- a schedule's text form ---- */

/* x and w copied HBM -> DM, one vector pass y = x * w + 1.5, y copied out
 * (tests/lit/tcp/sched/straight.tsched without its comments). */
static const char sched_text[] =
	"tcpsched 1\n"
	"machine \"RNGD (TCP), one chip\"\n"
	"meta T=16 K=0 D=64 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=8192 rmacs=0 dtype=f32\n"
	"features granted=0x0 refused=0x0\n"
	"buf %0 \"x\" hbm input f32[16,64]\n"
	"buf %1 \"w\" hbm weight f32[16,64] src=\"model.w\"\n"
	"buf %2 \"y\" hbm output f32[16,64]\n"
	"buf %3 \"xd\" dm scratch f32[16,64] life=@0..@2 layout=flit(0,512,1,32)\n"
	"buf %4 \"wd\" dm scratch f32[16,64] life=@1..@2 layout=flit(0,512,1,32)\n"
	"buf %5 \"yd\" dm scratch f32[16,64] life=@2..@3 layout=flit(0,512,1,32)\n"
	"op @0 dma.copy ph=routing dims=[1024] dst=%3+0:[1] s0=%0+0:[1]\n"
	"op @1 dma.copy ph=routing dims=[1024] dst=%4+0:[1] s0=%1+0:[1]\n"
	"op @2 tu.vec ph=routing dims=[16,64] dst=%5+0:[64,1] s0=%3+0:[64,1] s1=%4+0:[64,1] "
	"chain=[f.mul(s0,s1,#0x0,c0,0),f.add(v,imm,#0x3fc00000,c0,0)] deps=[@0,@1]\n"
	"op @3 dma.copy ph=combine dims=[1024] dst=%2+0:[1] s0=%5+0:[1] deps=[@2]\n";

static void test_from_sched(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tcp_program *p = moe_tcp_from_sched(c, "s.tsched", sched_text, sizeof sched_text - 1, NULL);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	assert_int_equal(moe_tcp_num_outputs(p), 1);
	/* run it: y = x * w + 1.5, every element computed here in f32 */
	int64_t shape[2] = {16, 64};
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 2, shape), *w = moe_tensor_new(c, MOE_F32, 2, shape);
	float *xf = x->data, *wf = w->data;
	for (int i = 0; i < 16 * 64; i++) {
		xf[i] = (float)(i % 37) * 0.25f - 3.0f;
		wf[i] = (float)(i % 11) * 0.5f - 2.0f;
	}
	moe_tensor_map *b = moe_tensor_map_new(c);
	assert_int_equal(moe_tensor_map_set(b, "x", x), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "w", w), MOE_OK);
	moe_tensor *out[2] = {NULL, NULL};
	moe_status s = moe_tcp_run(c, p, b, NULL, out, NULL);
	if (s)
		moe_diag_print(c, stderr);
	assert_int_equal(s, MOE_OK);
	assert_non_null(out[0]);
	const float *y = out[0]->data;
	for (int i = 0; i < 16 * 64; i++)
		assert_true(y[i] == xf[i] * wf[i] + 1.5f);
	moe_tensor_free(c, out[0]);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	/* a bad line: NULL with the file, line and column of the problem */
	char bad[sizeof sched_text];
	memcpy(bad, sched_text, sizeof sched_text);
	char *at = strstr(bad, "tu.vec");
	memcpy(at, "tu.vex", 6);
	assert_null(moe_tcp_from_sched(c, "bad.tsched", bad, sizeof bad - 1, NULL));
	assert_diag(c, "bad.tsched:13:");
	/* a schedule whose op reads past its buffer fails verification, named by its line */
	memcpy(bad, sched_text, sizeof sched_text);
	at = strstr(bad, "dims=[1024] dst=%2");
	memcpy(at, "dims=[2048]", 11);
	assert_null(moe_tcp_from_sched(c, "big.tsched", bad, sizeof bad - 1, NULL));
	assert_diag(c, "big.tsched:14");
	moe_ctx_free(c);
}

/* ---- moe_tcp_floor (docs/tcp-isa.md section 12) ---- */

/* The floor of sched_text's program with a layer's meta line, worked by hand
 * from the built-in machine's fields: 1 GHz; DMA rate min(HBM 1.5e12 B/s,
 * 8 engines x 256 B, 16 DMNs x 128 B) = 1500 B/cycle; setup 500; a command's
 * issue and fill/drain 240 + 32; launch 2000 + end 600; 512 slices x 8 lanes
 * x 32 bf16 MACs (no contraction in the program: bf16's rate); vector 8
 * elements per cycle per slice. Layer: T 16, K 2, D 64, F 32, E 4, three
 * projections, f32 rows of 256 B; an expert 24576 B, 9216 B outside the
 * loop, 4096 router MACs. */
static void test_floor(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char text[sizeof sched_text + 256];
	const char *meta = "meta T=16 K=2 D=64 F=32 E=4 B=0 G=0 nproj=3 router_e=4 wexp=24576 act=9216 rmacs=4096 "
			   "dtype=f32\n";
	const char *from = strstr(sched_text, "meta "), *to = strchr(from, '\n') + 1;
	snprintf(text, sizeof text, "%.*s%s%s", (int)(from - sched_text), sched_text, meta, to);
	moe_tcp_program *p = moe_tcp_from_sched(c, "f.tsched", text, strlen(text), NULL);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	moe_tcp_floor_terms f;
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, 3, &f), MOE_OK);
	double W = 3 * 24576.0, X = 9216, rho = 1500, cmd = 272, setup = 500;
	double macs = 16 * 2 * 64 * 32 * 3 + 4096, vec = 16 * 2 * 32 + 16 * 4;
	assert_int_equal(f.tokens, 16);
	assert_false(f.expected);
	assert_true(f.experts_hit == 3 && f.weight_bytes == W && f.other_bytes == X && f.macs == macs);
	assert_true(f.mac_rate == 131072 && f.vector_elements == vec);
	assert_int_equal(f.dma_commands, 3);
	assert_int_equal(f.main_commands, 3);
	/* R1, R3, R4 and R2 (x in DM + logits + selection, or every read byte in
	 * DM after two setups and one command; then y's setup) */
	double r1 = (W + X) / rho, r3 = 3 * setup + (W + X) / rho, r4 = 2 * setup + 3 * cmd + macs / 131072 + vec / 4096;
	double route = setup + 4096 / rho + 2 * cmd, in = 2 * setup + (W + X - 4096) / rho;
	double r2 = (route > in + cmd ? route : in + cmd) + setup;
	assert_true(fabs(f.roofline_seconds - r1 * 1e-9) < 1e-15);
	assert_true(fabs(f.dma_seconds - r3 * 1e-9) < 1e-15);
	assert_true(fabs(f.main_seconds - r4 * 1e-9) < 1e-15);
	assert_true(fabs(f.route_seconds - route * 1e-9) < 1e-15);
	assert_true(fabs(f.chain_seconds - r2 * 1e-9) < 1e-15);
	/* here the chain binds: 1824.6 cycles against R4's 1817.8 */
	assert_int_equal(f.binding, 1);
	assert_true(fabs(f.launch_end_seconds - 2600e-9) < 1e-15);
	assert_true(fabs(f.seconds - (2600 + r2) * 1e-9) < 1e-15);
	/* expected experts under uniform routing: E (1 - (1 - K/E)^T) */
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, -1, &f), MOE_OK);
	assert_true(f.expected);
	assert_true(fabs(f.experts_hit - 4 * (1 - pow(0.5, 16))) < 1e-12);
	/* fewer tokens: x and y rows and the MACs for those only */
	assert_int_equal(moe_tcp_floor(c, p, NULL, 1, 2, &f), MOE_OK);
	assert_int_equal(f.tokens, 1);
	assert_true(f.other_bytes == 9216 - 2 * 15 * 256 && f.macs == 2 * 64 * 32 * 3 + 256);
	/* bad requests: a clear error each */
	assert_int_equal(moe_tcp_floor(c, p, NULL, 17, -1, &f), MOE_ERR_INVALID);
	assert_diag(c, "17 tokens, but the program holds at most 16");
	assert_int_equal(moe_tcp_floor(c, p, NULL, 1, 3, &f), MOE_ERR_INVALID);
	assert_diag(c, "3 experts hit, but 1 tokens choosing 2 of 4 experts hit at most 2");
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, NAN, &f), MOE_ERR_INVALID);
	assert_diag(c, "experts hit");
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, 1, NULL), MOE_ERR_INVALID);
	assert_diag(c, "out is NULL");
	assert_int_equal(moe_tcp_floor(c, NULL, NULL, 0, 1, &f), MOE_ERR_INVALID);
	assert_diag(c, "the program is NULL");
	moe_tcp_program_free(p);
	/* experts stored in one byte per element (weight-only quantized) under
	 * the layer's own contraction: each element of the 3 experts hit passes
	 * through the vector engine too */
	const char *qmeta = "meta T=16 K=2 D=64 F=32 E=4 B=0 G=0 nproj=3 router_e=4 wexp=6144 act=9216 rmacs=4096 "
			    "dtype=f32\n";
	snprintf(text, sizeof text, "%.*s%s%s", (int)(from - sched_text), sched_text, qmeta, to);
	p = moe_tcp_from_sched(c, "q.tsched", text, strlen(text), NULL);
	assert_non_null(p);
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, 3, &f), MOE_OK);
	assert_true(f.weight_bytes == 3 * 6144.0 && f.vector_elements == vec + 3 * 3 * 64 * 32);
	moe_tcp_program_free(p);
	/* a program without an experts op has no floor, and that is no error */
	p = moe_tcp_from_sched(c, "s.tsched", sched_text, sizeof sched_text - 1, NULL);
	assert_non_null(p);
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, -1, &f), MOE_ERR_UNSUPPORTED);
	assert_int_equal(moe_error_count(c), 0);
	moe_tcp_program_free(p);

	/* a compiled layer run on the simulator takes no less than its floor,
	 * for the experts it hit; more experts never lower the floor */
	float *keep;
	moe_checkpoint *ck = random_ck(c, &keep);
	moe_tensor *x = random_x(c, 8);
	p = compile(c, 8, 0, 0);
	moe_tensor_map *b = bind_for(c, p, ck, x);
	moe_tensor *out[2] = {NULL, NULL};
	moe_tcp_stats s;
	assert_int_equal(moe_tcp_run(c, p, b, NULL, out, &s), MOE_OK);
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, (double)s.experts_hit, &f), MOE_OK);
	assert_true(f.seconds > f.launch_end_seconds && f.seconds <= s.simulated_seconds);
	moe_tcp_floor_terms g, h;
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, 2, &g), MOE_OK);
	assert_int_equal(moe_tcp_floor(c, p, NULL, 0, 4, &h), MOE_OK);
	assert_true(g.seconds <= f.seconds && f.seconds <= h.seconds && g.weight_bytes < h.weight_bytes);
	moe_tensor_free(c, out[0]);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_tensor_free(c, x);
	moe_checkpoint_close(ck);
	free(keep);
	moe_ctx_free(c);
}

/* The rewrite table's rows by index, and the switches of
 * moe_tcp_compile_sched / moe_tcp_emit_sched: a rewrite switched off is
 * absent from the printed `rewrites` line and y does not change; an unknown
 * name is refused, naming it and the known rows. */
static void test_sched_rewrites(void **st)
{
	(void)st;
	const char *name = NULL, *summary = NULL;
	assert_int_equal(moe_tcp_rewrite_info(0, &name, &summary), 1);
	assert_string_equal(name, "list-schedule");
	assert_true(summary && strlen(summary) > 10);
	uint32_t n = 0;
	while (moe_tcp_rewrite_info(n, NULL, NULL))
		n++;
	assert_true(n >= 1 && n < 64);
	assert_int_equal(moe_tcp_rewrite_info(n, &name, NULL), 0);
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	float *keep;
	moe_checkpoint *ck = random_ck(c, &keep);
	moe_tensor *x = random_x(c, 8);
	moe_module *ms = layer(c, 8, 0, 0, "tcp-sched");
	const moe_graph *g = moe_module_graph(ms, 0);
	moe_tcp_program *pa = moe_tcp_compile_sched(c, g, NULL, ""), *pb = moe_tcp_compile_sched(c, g, NULL, "-list-schedule");
	assert_non_null(pa);
	assert_non_null(pb);
	assert_same_y(c, pa, pb, ck, x);
	char path[256];
	size_t len;
	tpath(path, sizeof path, "on.tsched");
	assert_int_equal(moe_tcp_emit_sched(c, g, NULL, "+list-schedule", path), MOE_OK);
	char *text = (char *)file_bytes(path, &len);
	assert_non_null(strstr(text, "\nrewrites list-schedule"));
	free(text);
	tpath(path, sizeof path, "off.tsched");
	assert_int_equal(moe_tcp_emit_sched(c, g, NULL, "+list-schedule,-list-schedule", path), MOE_OK);
	text = (char *)file_bytes(path, &len);
	assert_null(strstr(text, "list-schedule"));
	free(text);
	assert_null(moe_tcp_compile_sched(c, g, NULL, "-no-such-rewrite"));
	assert_diag(c, "unknown rewrite 'no-such-rewrite'");
	assert_null(moe_tcp_compile_sched(c, g, NULL, "list-schedule"));
	assert_diag(c, "malformed item 'list-schedule'");
	tpath(path, sizeof path, "bad.tsched");
	assert_int_not_equal(moe_tcp_emit_sched(c, g, NULL, "-x", path), MOE_OK);
	assert_diag(c, "list-schedule");
	assert_int_equal(access(path, F_OK), -1);
	moe_tcp_program_free(pa);
	moe_tcp_program_free(pb);
	moe_module_free(ms);
	moe_tensor_free(c, x);
	moe_checkpoint_close(ck);
	free(keep);
	moe_ctx_free(c);
}

/* The schedule compiler's printed schedule reads back into the same
 * program; moe_tcp_compile gives its y; a flattened graph is refused. */
static void test_compile_sched(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	float *keep;
	moe_checkpoint *ck = random_ck(c, &keep);
	moe_tensor *x = random_x(c, 8);
	moe_module *ml = layer(c, 8, 0, 0, "host"), *ms = layer(c, 8, 0, 0, "tcp");
	moe_tcp_program *ps = moe_tcp_compile_sched(c, moe_module_graph(ms, 0), NULL, NULL);
	if (!ps)
		moe_diag_print(c, stderr);
	assert_non_null(ps);
	/* the schedule printed, read back: the same program bytes */
	char path[256];
	tpath(path, sizeof path, "l.tsched");
	assert_int_equal(moe_tcp_emit_sched(c, moe_module_graph(ms, 0), NULL, NULL, path), MOE_OK);
	size_t tlen;
	uint8_t *text = file_bytes(path, &tlen);
	assert_true(tlen > 9 && !memcmp(text, "tcpsched 1", 10));
	moe_tcp_program *pr = moe_tcp_from_sched(c, path, (const char *)text, tlen, NULL);
	assert_non_null(pr);
	uint8_t *b1, *b2;
	size_t n1, n2;
	assert_int_equal(moe_tcp_to_binary(c, ps, &b1, &n1), MOE_OK);
	assert_int_equal(moe_tcp_to_binary(c, pr, &b2, &n2), MOE_OK);
	assert_int_equal(n1, n2);
	assert_memory_equal(b1, b2, n1);
	/* moe_tcp_compile is the schedule compiler, after the graph passes this
	 * context did not register (the pairings, the fusion marks): the same y */
	moe_tcp_program *pd = moe_tcp_compile(c, moe_module_graph(ms, 0), NULL);
	assert_non_null(pd);
	assert_same_y(c, ps, pd, ck, x);
	moe_tcp_program_free(pd);
	/* a graph that went through the flattening `host` pipeline has no block loop to build:
	 * refused with a diagnostic, and emit writes nothing */
	assert_null(moe_tcp_compile_sched(c, moe_module_graph(ml, 0), NULL, NULL));
	assert_diag(c, "the schedule compiler does not lower");
	tpath(path, sizeof path, "bad.tsched");
	assert_int_not_equal(moe_tcp_emit_sched(c, moe_module_graph(ml, 0), NULL, NULL, path), MOE_OK);
	assert_diag(c, "the schedule compiler does not lower");
	assert_int_equal(access(path, F_OK), -1);
	free(b1);
	free(b2);
	free(text);
	moe_tcp_program_free(pr);
	moe_tcp_program_free(ps);
	moe_module_free(ml);
	moe_module_free(ms);
	moe_tensor_free(c, x);
	moe_checkpoint_close(ck);
	free(keep);
	moe_ctx_free(c);
}

/* ---- expert parallelism on simulated chips ---- */

#define NCHIP 2
#define TALL 8

/* loop: its local experts a block_loop (expert-parallel{loop=1}), the form
 * the schedule compiler reads */
static moe_module *chip_program_loop(moe_ctx *c, int rank, int loop)
{
	char pipe[512];
	snprintf(pipe, sizeof pipe,
		"infer-shapes,canonicalize,lower-topk,expert-parallel{ep=%d,rank=%d,tokens=%d,loop=%d},blockwise-dispatch,"
		"grid-bound,canonicalize,cse,dce", NCHIP, rank, TALL, loop);
	return layer(c, TALL / NCHIP, 0, 0, pipe);
}

/* chip rank's program for the default emitter (its experts a block_loop) */
static moe_module *chip_program(moe_ctx *c, int rank)
{
	return chip_program_loop(c, rank, 1);
}

static moe_tensor *rows(moe_ctx *c, const moe_tensor *x, int64_t first, int64_t n)
{
	moe_tensor *r = moe_tensor_new(c, x->dtype, 2, (int64_t[]){n, x->shape[1]});
	size_t row = x->nbytes / (size_t)x->shape[0];
	memcpy(r->data, (const char *)x->data + (size_t)first * row, (size_t)n * row);
	return r;
}

static void test_ep_run(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	float *keep;
	moe_checkpoint *ck = random_ck(c, &keep);
	moe_tensor *x = random_x(c, TALL);

	/* one chip, the whole layer */
	moe_tcp_program *one = compile(c, TALL, 0, 0);
	moe_tensor_map *b1 = bind_for(c, one, ck, x);
	moe_tensor *y1 = NULL;
	assert_int_equal(moe_tcp_run(c, one, b1, NULL, &y1, NULL), MOE_OK);
	float ymax = 0;
	for (int64_t i = 0; i < TALL * 32; i++)
		ymax = fmaxf(ymax, fabsf(((float *)y1->data)[i]));
	assert_true(ymax > 0);

	/* two chips, four tokens each, two experts each */
	moe_module *m[NCHIP];
	const moe_graph *g[NCHIP];
	moe_tensor_map *bind[NCHIP];
	moe_tensor *outv[NCHIP] = {0}, **out[NCHIP];
	for (int d = 0; d < NCHIP; d++) {
		m[d] = chip_program(c, d);
		g[d] = moe_module_graph(m[d], 0);
		bind[d] = moe_tensor_map_new(c);
		assert_int_equal(moe_weights_load_from(c, g[d], ck, bind[d]), MOE_OK);
		moe_tensor_map_set(bind[d], "x", rows(c, x, d * (TALL / NCHIP), TALL / NCHIP));
		out[d] = &outv[d];
	}
	moe_tcp_ep_stats s;
	memset(&s, 0xff, sizeof s);
	moe_tcp_run_opts ro = {0};
	moe_status rc = moe_tcp_ep_run(c, NCHIP, g, (const moe_tensor_map *const *)bind, &ro, out, &s);
	if (rc)
		moe_diag_print(c, stderr);
	assert_int_equal(rc, MOE_OK);
	/* chip d's rows are the one chip's rows of its tokens */
	for (int d = 0; d < NCHIP; d++) {
		assert_non_null(outv[d]);
		assert_int_equal(outv[d]->shape[0], TALL / NCHIP);
		const float *a = outv[d]->data, *b = (const float *)y1->data + d * (TALL / NCHIP) * 32;
		for (int64_t i = 0; i < (TALL / NCHIP) * 32; i++)
			if (fabsf(a[i] - b[i]) > 1e-6f * ymax)
				fail_msg("chip %d element %lld: %g, one chip %g", d, (long long)i, a[i], b[i]);
		moe_tensor_free(c, outv[d]);
		outv[d] = NULL;
	}
	/* the stats account for every chip and exchange */
	assert_int_equal(s.ep, NCHIP);
	assert_true(s.exchanges >= 2); /* dispatch and combine */
	assert_true(s.compute_seconds > 0 && s.link_seconds > 0);
	assert_true(fabs(s.simulated_seconds - (s.compute_seconds + s.link_seconds)) <= 1e-9 * s.simulated_seconds);
	int64_t sent = 0, got = 0;
	for (int d = 0; d < NCHIP; d++) {
		sent += s.chip_link_bytes_out[d];
		got += s.chip_link_bytes_in[d];
		assert_true(s.chip_seconds[d] > 0);
	}
	assert_int_equal(sent, got);
	assert_true(sent > 0);
	assert_true(s.rounds >= 1 && s.rounds <= MOE_TCP_EP_MAX_ROUNDS);
	for (int r = 0; r < s.rounds; r++)
		assert_true(s.round[r].seconds >= s.round[r].bound_seconds * (1 - 1e-9));

	/* timing only: outputs not meaningful, the time still counted */
	ro.timing_only = 1;
	assert_int_equal(moe_tcp_ep_run(c, NCHIP, g, (const moe_tensor_map *const *)bind, &ro, out, &s), MOE_OK);
	assert_true(s.simulated_seconds > 0);
	for (int d = 0; d < NCHIP; d++) {
		moe_tensor_free(c, outv[d]);
		outv[d] = NULL;
	}

	/* a chip without its bindings: an error, no outputs, no hang */
	moe_tensor_map *empty = moe_tensor_map_new(c);
	moe_tensor_map *bad[NCHIP] = {bind[0], empty};
	ro.timing_only = 0;
	assert_int_not_equal(moe_tcp_ep_run(c, NCHIP, g, (const moe_tensor_map *const *)bad, &ro, out, &s), MOE_OK);
	assert_true(moe_error_count(c) > 0);
	for (int d = 0; d < NCHIP; d++)
		assert_null(outv[d]);
	moe_diag_clear(c);
	/* a chip count the programs were not made for, or past MOE_TCP_EP_MAX */
	assert_int_equal(moe_tcp_ep_run(c, 1, g, (const moe_tensor_map *const *)bind, &ro, out, &s), MOE_ERR_INVALID);
	assert_diag(c, "lay.moe:12:12: error: chip 0: all_to_all %");
	moe_tcp_ep_run(c, 1, g, (const moe_tensor_map *const *)bind, &ro, out, &s);
	assert_diag(c, " exchanges over 2 chips, the run has 1");
	/* API misuse: a chip count outside 1..MOE_TCP_EP_MAX, NULL options or stats */
	const moe_tensor_map *const *cb = (const moe_tensor_map *const *)bind;
	assert_int_equal(moe_tcp_ep_run(c, MOE_TCP_EP_MAX + 1, g, cb, &ro, out, &s), MOE_ERR_INVALID);
	assert_int_equal(moe_tcp_ep_run(c, 0, g, cb, &ro, out, &s), MOE_ERR_INVALID);
	assert_int_equal(moe_tcp_ep_run(c, NCHIP, g, cb, NULL, out, &s), MOE_ERR_INVALID);
	assert_int_equal(moe_tcp_ep_run(c, NCHIP, g, cb, &ro, out, NULL), MOE_ERR_INVALID);
	for (int d = 0; d < NCHIP; d++)
		assert_null(outv[d]);
	moe_tensor_map_free(empty);
	for (int d = 0; d < NCHIP; d++) {
		moe_tensor_map_free(bind[d]);
		moe_module_free(m[d]);
	}
	moe_tensor_map_free(b1);
	moe_tensor_free(c, y1);
	moe_tcp_program_free(one);
	moe_tensor_free(c, x);
	moe_checkpoint_close(ck);
	free(keep);
	moe_ctx_free(c);
}

typedef struct sunk {
	moe_ctx *ctx;
	const moe_graph *const *g;
	int calls, stop_at;
	int chip[32], phase[32], has_program[32];
	uint32_t nout[32];
	moe_id out[32][16];
	int bad_input; /* an input named neither x nor ep.<id of g[chip]> */
} sunk;

static moe_status sink(void *ud, int chip, int phase, const moe_tcp_program *p, const moe_id *outputs, uint32_t n)
{
	sunk *s = ud;
	int k = s->calls++;
	if (k < 32) {
		s->chip[k] = chip, s->phase[k] = phase, s->has_program[k] = p != NULL, s->nout[k] = n;
		for (uint32_t j = 0; j < n && j < 16; j++)
			s->out[k][j] = outputs[j];
	}
	if (p) {
		moe_module *iface = moe_tcp_interface(s->ctx, p);
		const moe_graph *ig = moe_module_graph(iface, 0);
		for (moe_id i = 0; i < moe_graph_num_nodes(ig); i++) {
			if (moe_node_op(ig, i) != MOE_OP_INPUT)
				continue;
			const char *nm = moe_node_name(ig, i);
			unsigned id;
			if (!strcmp(nm, "x"))
				continue;
			if (sscanf(nm, "ep.%u", &id) != 1 || id >= moe_graph_num_nodes(s->g[chip]))
				s->bad_input++;
		}
		moe_module_free(iface);
	}
	return s->calls == s->stop_at ? MOE_ERR_IO : MOE_OK;
}

static void test_ep_compile(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m[NCHIP];
	const moe_graph *g[NCHIP];
	for (int d = 0; d < NCHIP; d++) {
		m[d] = chip_program(c, d);
		g[d] = moe_module_graph(m[d], 0);
	}
	sunk s = {.ctx = c, .g = g, .stop_at = -1};
	moe_status rc = moe_tcp_ep_compile(c, NCHIP, g, NULL, sink, &s);
	if (rc)
		moe_diag_print(c, stderr);
	assert_int_equal(rc, MOE_OK);
	/* chip by chip, phase by phase: the phases of moe_ep_phases, the outputs
	 * of moe_ep_phase_graph */
	int k = 0, progs = 0;
	for (int d = 0; d < NCHIP; d++) {
		int level[512];
		assert_true(moe_graph_num_nodes(g[d]) <= 512);
		int nph = moe_ep_phases(g[d], level);
		assert_true(nph >= 3); /* routing, experts, combine */
		for (int ph = 0; ph < nph; ph++, k++) {
			assert_true(k < s.calls);
			assert_int_equal(s.chip[k], d);
			assert_int_equal(s.phase[k], ph);
			moe_id ids[64];
			uint32_t n;
			moe_module *pm = moe_ep_phase_graph(c, g[d], level, ph, ids, 64, &n);
			if (s.has_program[k]) {
				assert_int_equal(s.nout[k], n);
				for (uint32_t j = 0; j < n && j < 16; j++)
					assert_int_equal(s.out[k][j], ids[j]);
				progs++;
			} else {
				assert_int_equal(s.nout[k], 0);
			}
			moe_module_free(pm);
		}
	}
	assert_int_equal(s.calls, k);
	assert_true(progs >= 2 * NCHIP);
	assert_int_equal(s.bad_input, 0);
	/* programs made for another chip count: refused before any sink call */
	sunk s1 = {.ctx = c, .g = g, .stop_at = -1};
	assert_int_equal(moe_tcp_ep_compile(c, 1, g, NULL, sink, &s1), MOE_ERR_INVALID);
	assert_int_equal(s1.calls, 0);
	assert_diag(c, "exchanges over 2 chips, the run has 1");
	/* API misuse */
	assert_int_equal(moe_tcp_ep_compile(c, 0, g, NULL, sink, &s), MOE_ERR_INVALID);
	assert_int_equal(moe_tcp_ep_compile(c, NCHIP, g, NULL, NULL, &s), MOE_ERR_INVALID);

	/* a sink's error stops the compile and is returned */
	sunk s2 = {.ctx = c, .g = g, .stop_at = 2};
	assert_int_equal(moe_tcp_ep_compile(c, NCHIP, g, NULL, sink, &s2), MOE_ERR_IO);
	assert_int_equal(s2.calls, 2);
	/* with a machine given: the same calls */
	moe_tcp_machine *mach = moe_tcp_machine_default(c);
	sunk s3 = {.ctx = c, .g = g, .stop_at = -1};
	assert_int_equal(moe_tcp_ep_compile(c, NCHIP, g, mach, sink, &s3), MOE_OK);
	assert_int_equal(s3.calls, s.calls);
	moe_tcp_machine_free(c, mach);
	for (int d = 0; d < NCHIP; d++)
		moe_module_free(m[d]);
	moe_ctx_free(c);
}

/* The schedule compiler's phases on chip programs whose experts are a
 * block_loop (expert-parallel{loop=1}): moe_tcp_ep_compile_ex without options
 * hands the sink as many phases as moe_tcp_ep_compile, and reports a bad
 * sched_opts with a diagnostic. The flattened chips (expert-parallel{loop=0},
 * the host's form) are refused, by run and by compile, naming the chip and
 * the loop=1 form. */
static void test_ep_sched(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	float *keep;
	moe_checkpoint *ck = random_ck(c, &keep);
	moe_tensor *x = random_x(c, TALL);
	moe_module *m[2][NCHIP];
	const moe_graph *g[2][NCHIP];
	moe_tensor_map *bind[NCHIP];
	moe_tensor *outv[NCHIP] = {0}, **out[NCHIP];
	moe_tcp_ep_stats s;
	for (int e = 0; e < 2; e++)
		for (int d = 0; d < NCHIP; d++) {
			m[e][d] = chip_program_loop(c, d, e);
			g[e][d] = moe_module_graph(m[e][d], 0);
		}
	for (int d = 0; d < NCHIP; d++) {
		bind[d] = moe_tensor_map_new(c);
		assert_int_equal(moe_weights_load_from(c, g[0][d], ck, bind[d]), MOE_OK);
		moe_tensor_map_set(bind[d], "x", rows(c, x, d * (TALL / NCHIP), TALL / NCHIP));
		out[d] = &outv[d];
	}
	moe_tcp_run_opts rs = {0};
	assert_int_equal(moe_tcp_ep_run(c, NCHIP, g[0], (const moe_tensor_map *const *)bind, &rs, out, &s),
		MOE_ERR_UNSUPPORTED);
	assert_diag(c, "chip 0: its experts are not a block_loop (expert-parallel{loop=0}");
	sunk sf = {.ctx = c, .g = g[0], .stop_at = -1};
	assert_int_equal(moe_tcp_ep_compile(c, NCHIP, g[0], NULL, sink, &sf), MOE_ERR_UNSUPPORTED);
	assert_int_equal(sf.calls, 0);
	assert_diag(c, "expert-parallel{loop=1}");
	sunk s0 = {.ctx = c, .g = g[1], .stop_at = -1}, s1 = {.ctx = c, .g = g[1], .stop_at = -1};
	moe_tcp_run_opts ro = {0};
	assert_int_equal(moe_tcp_ep_compile_ex(c, NCHIP, g[1], &ro, sink, &s0), MOE_OK);
	assert_int_equal(moe_tcp_ep_compile(c, NCHIP, g[1], NULL, sink, &s1), MOE_OK);
	assert_true(s0.calls > 0);
	assert_int_equal(s1.calls, s0.calls);
	assert_int_equal(s1.bad_input, 0);
	sunk s2 = {.ctx = c, .g = g[1], .stop_at = -1};
	ro.sched_opts = "-nosuch";
	assert_int_equal(moe_tcp_ep_compile_ex(c, NCHIP, g[1], &ro, sink, &s2), MOE_ERR_INVALID);
	assert_int_equal(s2.calls, 0);
	assert_diag(c, "unknown rewrite 'nosuch'");
	assert_int_equal(moe_tcp_ep_compile_ex(c, NCHIP, g[1], NULL, sink, &s2), MOE_ERR_INVALID);
	for (int d = 0; d < NCHIP; d++) {
		moe_tensor_free(c, outv[d]);
		moe_tensor_map_free(bind[d]);
		for (int e = 0; e < 2; e++)
			moe_module_free(m[e][d]);
	}
	moe_tensor_free(c, x);
	moe_checkpoint_close(ck);
	free(keep);
	moe_ctx_free(c);
}

/* moe_tcp_quant_act: "fp8" marks exactly the block-FP8 dequants whose
 * 128 x 128 blocks divide the weight (act="fp8"), "bf16" marks none; a
 * layer without one, or another act, is refused with a diagnostic. */
static const char qa_fmt[] = "layer l {\n"
			     "  dim T = 4, D = 256, F = %d, E = 2, K = 1, B = 4\n"
			     "  input x : [T, D]\n"
			     "  weight r : [E, D] = \"router.weight\"\n"
			     "  weight gq : f8e4m3[E, F, D] = \"e.{e}.gate.weight\"\n"
			     "  weight gs : f32[E, (F + 127) / 128, D / 128] = \"e.{e}.gate.scale\"\n"
			     "  weight uq : f8e4m3[E, F, D] = \"e.{e}.up.weight\"\n"
			     "  weight us : f32[E, (F + 127) / 128, D / 128] = \"e.{e}.up.scale\"\n"
			     "  weight dq : i32[E, D, F / 8] = \"e.{e}.down.weight_packed\"\n"
			     "  weight ds : bf16[E, D, F / 32] = \"e.{e}.down.weight_scale\"\n"
			     "  gate = dequant(gq, gs, format=\"fp8\", block=[128, 128])\n"
			     "  up   = dequant(uq, us, format=\"fp8\", block=[128, 128])\n"
			     "  down = dequant(dq, ds, format=\"int4\", block=[1, 32], k=F)\n"
			     "  idx = topk(einsum(\"td,ed->te\", x, r), k=K)\n"
			     "  y = experts(x, idx, take_along(einsum(\"td,ed->te\", x, r), idx, axis=1), gate=gate, up=up, "
			     "down=down, block=B)\n"
			     "  output y\n"
			     "}\n";

static moe_module *qa_layer(moe_ctx *c, int F)
{
	char text[2048];
	snprintf(text, sizeof text, qa_fmt, F);
	moe_module *m = moe_parse_moe(c, "qa.moe", text, strlen(text), NULL);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	return m;
}

/* The act attribute of each dequant of m, in node order, joined by ','. */
static void qa_acts(const moe_module *m, char *out, size_t n)
{
	const moe_graph *g = moe_module_graph(m, 0);
	*out = 0;
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++)
		if (moe_node_op(g, i) == MOE_OP_DEQUANT) {
			const char *a = moe_node_get_str(g, i, "act");
			snprintf(out + strlen(out), n - strlen(out), "%s%s", *out ? "," : "", a ? a : "-");
		}
}

static const char *last_diag(const moe_ctx *c)
{
	const char *msg = NULL;
	moe_diag_get(c, moe_diag_count(c) - 1, NULL, NULL, &msg);
	return msg;
}

static void test_quant_act(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char acts[128];
	moe_module *m = qa_layer(c, 128);
	assert_int_equal(moe_tcp_quant_act(c, m, "bf16", "qa.moe"), MOE_OK);
	qa_acts(m, acts, sizeof acts);
	assert_string_equal(acts, "-,-,-");
	assert_int_equal(moe_tcp_quant_act(c, m, "fp8", "qa.moe"), MOE_OK);
	qa_acts(m, acts, sizeof acts);
	assert_string_equal(acts, "fp8,fp8,-"); /* gate and up; the int4 down stays */
	assert_int_equal(moe_error_count(c), 0);
	assert_int_equal(moe_tcp_quant_act(c, m, "int4", "qa.moe"), MOE_ERR_INVALID);
	assert_non_null(strstr(last_diag(c), "takes bf16 or fp8, not 'int4'"));
	moe_module_free(m);
	/* F = 64: the 128 x 128 blocks do not divide the weights */
	m = qa_layer(c, 64);
	assert_int_equal(moe_tcp_quant_act(c, m, "fp8", "qa.moe"), MOE_ERR_INVALID);
	const char *msg = last_diag(c);
	assert_non_null(strstr(msg, "--quant-act=fp8 applies to block-FP8 experts"));
	assert_non_null(strstr(msg, "fp8 in [128, 128] blocks, int4 in [1, 32] blocks"));
	qa_acts(m, acts, sizeof acts);
	assert_string_equal(acts, "-,-,-");
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	if (!mkdtemp(tmpdir))
		return 1;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_asm),
		cmocka_unit_test(test_bundle),
		cmocka_unit_test(test_hbm),
		cmocka_unit_test(test_engine_name),
		cmocka_unit_test(test_num_outputs),
		cmocka_unit_test(test_from_sched),
		cmocka_unit_test(test_compile_sched),
		cmocka_unit_test(test_sched_rewrites),
		cmocka_unit_test(test_floor),
		cmocka_unit_test(test_ep_run),
		cmocka_unit_test(test_ep_compile),
		cmocka_unit_test(test_ep_sched),
		cmocka_unit_test(test_quant_act),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	char cmd[96];
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
	if (system(cmd) != 0)
		rc = 1;
	return rc;
}
