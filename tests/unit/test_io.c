/* Unit tests of runtime file I/O: safetensors (fixtures and malformed files),
 * sharded checkpoints, weight binding, .npy reading/writing, atomic output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir/ir.h"
#include "moec/io.h"

#define FIX MOEC_SOURCE_DIR "/tests/fixtures/hf/"
static const char *const fams[] = {"mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3", "llama4"};
#define NFAMS (sizeof fams / sizeof *fams)

/* ---- helpers ---- */

#define SCRATCH_NAME "moec_io"
#include "scratch_dir.h"

/* The first error message, asserting there is one. */
static const char *first_error(moe_ctx *c)
{
	assert_true(moe_error_count(c) > 0);
	const char *msg;
	moe_diag_get(c, 0, NULL, NULL, &msg);
	return msg;
}

/* A safetensors image: length field (hl_override if nonzero), header, data bytes. */
static unsigned char *mk_st(const char *hdr, size_t datalen, uint64_t hl_override, size_t *len)
{
	size_t hl = strlen(hdr);
	*len = 8 + hl + datalen;
	unsigned char *b = calloc(1, *len + 1);
	uint64_t v = hl_override ? hl_override : hl;
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	memcpy(b + 8, hdr, hl);
	for (size_t i = 0; i < datalen; i++)
		b[8 + hl + i] = (unsigned char)i;
	return b;
}

static void write_bytes(const char *path, const void *d, size_t n)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(d, 1, n, f), n);
	fclose(f);
}

/* ---- fixtures ---- */

static void test_fixture_safetensors(void **st)
{
	(void)st;
	for (size_t i = 0; i < NFAMS; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		char p[512];
		snprintf(p, sizeof p, FIX "%s/model.safetensors", fams[i]);
		moe_safetensors *s = moe_safetensors_open(c, p);
		assert_non_null(s);
		assert_int_equal(moe_error_count(c), 0);
		assert_true(moe_safetensors_count(s) > 10);
		assert_string_equal(moe_safetensors_metadata(s, "format"), "pt");
		const moe_st_tensor *t = moe_safetensors_find(s, "lm_head.weight");
		assert_non_null(t);
		assert_int_equal(t->dtype, MOE_ST_F32);
		assert_int_equal(t->rank, 2);
		assert_int_equal(t->shape[0], 256);
		assert_int_equal(t->shape[1], 48);
		assert_int_equal(t->nbytes, 256 * 48 * 4);
		assert_null(moe_safetensors_find(s, "no.such.tensor"));
		moe_safetensors_close(s);
		moe_ctx_free(c);
	}
}

static void test_fixture_npy(void **st)
{
	(void)st;
	static const char *const cases[] = {"x_float32_T1", "x_float32_T5", "x_float32_T64", "y_float32_T1",
		"y_float32_T5", "y_float32_T64"};
	for (size_t i = 0; i < NFAMS; i++)
		for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
			moe_ctx *c = moe_ctx_new(NULL, NULL);
			char p[512];
			snprintf(p, sizeof p, FIX "%s/%s.npy", fams[i], cases[k]);
			moe_tensor *t = moe_npy_read(c, p, MOE_F32);
			assert_non_null(t);
			assert_int_equal(t->rank, 2);
			assert_int_equal(t->shape[1], 48);
			int64_t T = strstr(cases[k], "T64") ? 64 : strstr(cases[k], "T5") ? 5 : 1;
			assert_int_equal(t->shape[0], T);
			moe_tensor_free(c, t);
			moe_ctx_free(c);
		}
	/* bf16 runs stored as f32 copies of bf16 values: reading as bf16 is exact */
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tensor *f = moe_npy_read(c, FIX "mixtral/x_bfloat16_T5.npy", MOE_F32);
	moe_tensor *h = moe_npy_read(c, FIX "mixtral/x_bfloat16_T5.npy", MOE_BF16);
	assert_non_null(f);
	assert_non_null(h);
	assert_int_equal(h->dtype, MOE_BF16);
	for (int64_t i = 0; i < moe_tensor_numel(f); i++) {
		uint32_t u;
		memcpy(&u, &((float *)f->data)[i], 4);
		assert_int_equal(u & 0xffff, 0);
		assert_int_equal(u >> 16, ((uint16_t *)h->data)[i]);
	}
	moe_tensor_free(c, f);
	moe_tensor_free(c, h);
	moe_ctx_free(c);
}

/* ---- malformed safetensors ---- */

typedef struct st_case {
	const char *hdr;
	size_t datalen;
	uint64_t hl;
	const char *expect; /* substring of the first error */
} st_case;

static void test_malformed_safetensors(void **st)
{
	(void)st;
	static const st_case cases[] = {
		{"{}", 0, 1000, "exceeds the"},                        /* lying header length */
		{"{}", 0, 200000000, "100 MB"},                        /* absurd header length */
		{"[1]", 0, 0, "not a JSON object"},
		{"{\"a\":", 0, 0, "not valid JSON"},
		{"{} x", 0, 0, "unexpected bytes"},
		{"{\"a\":1}", 0, 0, "not an object"},
		{"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, "lacks 'dtype'"},
		{"{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, "unknown dtype"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, 0, "shape is not an array"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0, "non-negative"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, 0, "non-negative"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, 0, "rank 9"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, 0,
			"overflows"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, 0, "out of order"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 2, 0, "outside the data section"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, 0, "need 8"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, 0, "two non-negative"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, "overlaps"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, "belong to no tensor"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, 0, "trailing data"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, "appears twice"},
		{"{\"__metadata__\":{\"k\":1}}", 0, 0, "not a string"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, 0, "unknown key"},
		{"{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4, 0, "need 6"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 4, 0,
			"two non-negative"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		size_t len;
		unsigned char *b = mk_st(cases[i].hdr, cases[i].datalen, cases[i].hl, &len);
		moe_safetensors *s = moe_safetensors_open_mem(c, "bad.safetensors", b, len);
		if (s || !strstr(first_error(c), cases[i].expect)) {
			print_error("case %zu: %s\n", i, s ? "accepted" : first_error(c));
			fail();
		}
		moe_loc loc;
		moe_diag_get(c, 0, NULL, &loc, NULL);
		assert_string_equal(loc.file, "bad.safetensors");
		free(b);
		moe_ctx_free(c);
	}
	/* too short for the length field, and an empty file on disk */
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	assert_null(moe_safetensors_open_mem(c, "short", "abc", 3));
	assert_non_null(strstr(first_error(c), "too short"));
	char p[512];
	write_bytes(tpath(p, sizeof p, "empty.safetensors"), "", 0);
	moe_diag_clear(c);
	assert_null(moe_safetensors_open(c, p));
	assert_non_null(strstr(first_error(c), "too short"));
	moe_diag_clear(c);
	assert_null(moe_safetensors_open(c, tmpdir));
	assert_non_null(strstr(first_error(c), "not a regular file"));
	moe_ctx_free(c);
	/* a valid in-memory file with metadata and a zero-size tensor */
	c = moe_ctx_new(NULL, NULL);
	size_t len;
	unsigned char *b = mk_st("{\"__metadata__\":{\"k\":\"v\"},\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],"
				 "\"data_offsets\":[0,0]},\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}  ",
		4, 0, &len);
	moe_safetensors *s = moe_safetensors_open_mem(c, "ok", b, len);
	assert_non_null(s);
	assert_int_equal(moe_safetensors_count(s), 2);
	assert_string_equal(moe_safetensors_metadata(s, "k"), "v");
	assert_int_equal(moe_safetensors_find(s, "z")->numel, 0);
	moe_safetensors_close(s);
	free(b);
	moe_ctx_free(c);
}

/* ---- weights ---- */

static moe_id add_weight(moe_graph *g, const char *name, const char *src, moe_dtype t, int rank, const int64_t *s)
{
	moe_id w = moe_node_new(g, MOE_OP_WEIGHT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, w, t, s, rank);
	moe_node_set_name(g, w, name);
	moe_node_set_str(g, w, "source", src);
	return w;
}

static float st_f32(const moe_st_tensor *t, size_t i)
{
	float f;
	memcpy(&f, (const char *)t->data + 4 * i, 4);
	return f;
}

static void test_weights_fixture(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "l");
	moe_graph_set_dim(g, "layer", 0);
	int64_t r[2] = {8, 48}, w1[3] = {8, 96, 48};
	add_weight(g, "router", "model.layers.{layer}.block_sparse_moe.gate.weight", MOE_F32, 2, r);
	add_weight(g, "w1", "model.layers.{layer}.block_sparse_moe.experts.{e}.w1.weight", MOE_F32, 3, w1);
	add_weight(g, "w1h", "model.layers.0.block_sparse_moe.experts.{e}.w1.weight", MOE_BF16, 3, w1);
	moe_tensor_map *out = moe_tensor_map_new(c);
	const char *paths[] = {FIX "mixtral"}; /* a directory */
	assert_int_equal(moe_weights_load(c, g, paths, 1, out), MOE_OK);
	assert_int_equal(moe_error_count(c), 0);
	moe_safetensors *s = moe_safetensors_open(c, FIX "mixtral/model.safetensors");
	moe_tensor *t = moe_tensor_map_get(out, "w1"), *h = moe_tensor_map_get(out, "w1h");
	assert_non_null(t);
	assert_int_equal(t->shape[0], 8);
	for (int e = 0; e < 8; e++) {
		char nm[128];
		snprintf(nm, sizeof nm, "model.layers.0.block_sparse_moe.experts.%d.w1.weight", e);
		const moe_st_tensor *x = moe_safetensors_find(s, nm);
		for (size_t i = 0; i < 96 * 48; i += 97) {
			float v = st_f32(x, i);
			assert_true(((float *)t->data)[(size_t)e * 96 * 48 + i] == v);
			assert_int_equal(((uint16_t *)h->data)[(size_t)e * 96 * 48 + i], moe_f32_to_bf16(v));
		}
	}
	const moe_st_tensor *rt = moe_safetensors_find(s, "model.layers.0.block_sparse_moe.gate.weight");
	assert_memory_equal(moe_tensor_map_get(out, "router")->data, rt->data, rt->nbytes);
	moe_safetensors_close(s);
	moe_tensor_map_free(out);
	moe_module_free(m);

	/* missing tensor, shape mismatch (both shapes printed), bad expert count */
	m = moe_module_new(c);
	g = moe_module_add_graph(m, "l");
	int64_t bad[2] = {8, 47}, many[3] = {9, 96, 48};
	add_weight(g, "nope", "model.layers.0.missing.weight", MOE_F32, 2, r);
	add_weight(g, "shp", "model.layers.0.block_sparse_moe.gate.weight", MOE_F32, 2, bad);
	add_weight(g, "nine", "model.layers.0.block_sparse_moe.experts.{e}.w1.weight", MOE_F32, 3, many);
	out = moe_tensor_map_new(c);
	const char *file[] = {FIX "mixtral/model.safetensors"};
	assert_int_not_equal(moe_weights_load(c, g, file, 1, out), MOE_OK);
	assert_int_equal(moe_error_count(c), 3);
	const char *msg;
	moe_diag_get(c, 0, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "'model.layers.0.missing.weight' not found in"));
	assert_non_null(strstr(msg, "mixtral/model.safetensors"));
	moe_diag_get(c, 1, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "[8, 48]"));
	assert_non_null(strstr(msg, "[8, 47]"));
	moe_diag_get(c, 2, NULL, NULL, &msg);
	assert_non_null(strstr(msg, "experts.8.w1.weight"));
	assert_null(moe_tensor_map_get(out, "nope"));
	moe_tensor_map_free(out);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* Two shards and an index; lookups through the index file and its directory. */
static void test_sharded(void **st)
{
	(void)st;
	char p[512], q[512];
	size_t len;
	/* shard 1: a = F32 [2] {1.5, -2}; shard 2: b = BF16 [2], c = F16 [1] */
	unsigned char *s1 = mk_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, &len);
	float av[2] = {1.5f, -2.0f};
	memcpy(s1 + len - 8, av, 8);
	write_bytes(tpath(p, sizeof p, "m-00001-of-00002.safetensors"), s1, len);
	free(s1);
	unsigned char *s2 = mk_st("{\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
				  "\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[4,6]}}", 6, 0, &len);
	uint16_t bv[3] = {0x3fc0, 0xc000, 0x3e00}; /* 1.5, -2 (bf16), 1.5 (f16) */
	memcpy(s2 + len - 6, bv, 6);
	write_bytes(tpath(p, sizeof p, "m-00002-of-00002.safetensors"), s2, len);
	free(s2);
	const char *idx = "{\"metadata\":{\"total_size\":14},\"weight_map\":{\"a\":\"m-00001-of-00002.safetensors\","
			  "\"b\":\"m-00002-of-00002.safetensors\",\"c\":\"m-00002-of-00002.safetensors\"}}";
	write_bytes(tpath(p, sizeof p, "model.safetensors.index.json"), idx, strlen(idx));
	for (int via_dir = 0; via_dir < 2; via_dir++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		moe_module *m = moe_module_new(c);
		moe_graph *g = moe_module_add_graph(m, "l");
		int64_t two[1] = {2}, one[1] = {1};
		add_weight(g, "A", "a", MOE_BF16, 1, two);
		add_weight(g, "B", "b", MOE_F32, 1, two);
		add_weight(g, "C", "c", MOE_F32, 1, one);
		moe_tensor_map *out = moe_tensor_map_new(c);
		const char *paths[] = {via_dir ? tmpdir : tpath(q, sizeof q, "model.safetensors.index.json")};
		assert_int_equal(moe_weights_load(c, g, paths, 1, out), MOE_OK);
		assert_int_equal(((uint16_t *)moe_tensor_map_get(out, "A")->data)[0], 0x3fc0);
		assert_true(((float *)moe_tensor_map_get(out, "B")->data)[1] == -2.0f);
		assert_true(((float *)moe_tensor_map_get(out, "C")->data)[0] == 1.5f);
		moe_tensor_map_free(out);
		moe_module_free(m);
		moe_ctx_free(c);
	}
	/* an index escaping its directory, and one naming a missing shard */
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *evil = "{\"weight_map\":{\"a\":\"../x.safetensors\"}}";
	write_bytes(tpath(p, sizeof p, "evil.index.json"), evil, strlen(evil));
	const char *ep[] = {p};
	assert_null(moe_checkpoint_open(c, ep, 1));
	assert_non_null(strstr(first_error(c), "relative file name"));
	moe_diag_clear(c);
	const char *gone = "{\"weight_map\":{\"a\":\"gone.safetensors\"}}";
	write_bytes(tpath(p, sizeof p, "gone.index.json"), gone, strlen(gone));
	moe_checkpoint *ck = moe_checkpoint_open(c, ep, 1);
	assert_non_null(ck);
	assert_null(moe_checkpoint_find(ck, "a", NULL));
	assert_true(moe_error_count(c) >= 1);
	assert_null(moe_checkpoint_find(ck, "zzz", NULL));
	moe_checkpoint_close(ck);
	moe_ctx_free(c);
	unlink(tpath(p, sizeof p, "evil.index.json"));
	unlink(tpath(p, sizeof p, "gone.index.json"));
}

/* ---- npy ---- */

/* A .npy image: version major, header text (padded to 64 by the caller's choice), data. */
static unsigned char *mk_npy(int major, const char *hdr, const void *data, size_t dlen, long hl_override, size_t *len)
{
	size_t hl = strlen(hdr), pre = major == 1 ? 10 : 12;
	*len = pre + hl + dlen;
	unsigned char *b = calloc(1, *len + 1);
	memcpy(b, "\x93NUMPY", 6);
	b[6] = (unsigned char)major;
	b[7] = 0;
	size_t v = hl_override >= 0 ? (size_t)hl_override : hl;
	b[8] = (unsigned char)v;
	b[9] = (unsigned char)(v >> 8);
	if (major > 1) {
		b[10] = (unsigned char)(v >> 16);
		b[11] = (unsigned char)(v >> 24);
	}
	memcpy(b + pre, hdr, hl);
	if (dlen)
		memcpy(b + pre + hl, data, dlen);
	return b;
}

static void test_malformed_npy(void **st)
{
	(void)st;
	float d[6] = {1, 2, 3, 4, 5, 6};
	static const struct {
		int major;
		const char *hdr;
		size_t dlen;
		long hl;
		moe_dtype want;
		const char *expect;
	} cases[] = {
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24, 200, MOE_F32, "past the end"},
		{1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", 24, -1, MOE_F32, "fortran_order True"},
		{1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24, -1, MOE_F32, "not supported"},
		{1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }\n", 24, -1, MOE_F32, "not supported"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", 24, -1, MOE_F32, "unexpected key"},
		{1, "{'descr': '<f4', 'fortran_order': False}\n", 24, -1, MOE_F32, "missing key 'shape'"},
		{1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}\n", 24, -1, MOE_F32, "twice"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 20, -1, MOE_F32, "truncated"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }\n", 24, -1, MOE_F32, "trailing"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2000000000, 2000000000, 2000000000), }\n", 24, -1, MOE_F32,
			"overflows"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 24, -1, MOE_F32,
			"overflows"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6), }\n", 24, -1, MOE_F32, "(n,)"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 6), }\n", 0, -1, MOE_F32, "zero dimension"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }\n", 24, -1, MOE_F32, "non-negative"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } junk\n", 24, -1, MOE_F32, "after the header"},
		{1, "{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }\n", 24, -1, MOE_F32, "cannot be read as f32"},
		{1, "{'descr': '|b1', 'fortran_order': False, 'shape': (6,), }\n", 6, -1, MOE_BOOL, "not 0 or 1"},
		{4, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\n", 24, -1, MOE_F32, "version 4.0"},
		{1, "['descr']\n", 24, -1, MOE_F32, "expected '{'"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		size_t len;
		unsigned char *b = mk_npy(cases[i].major, cases[i].hdr, d, cases[i].dlen, cases[i].hl, &len);
		if (i == 16)
			b[len - 1] = 7; /* a bool byte that is neither 0 nor 1 */
		moe_tensor *t = moe_npy_parse(c, "bad.npy", b, len, cases[i].want);
		if (t || !strstr(first_error(c), cases[i].expect)) {
			print_error("npy case %zu: %s\n", i, t ? "accepted" : first_error(c));
			fail();
		}
		moe_loc loc;
		moe_diag_get(c, 0, NULL, &loc, NULL);
		assert_string_equal(loc.file, "bad.npy");
		free(b);
		moe_ctx_free(c);
	}
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	assert_null(moe_npy_parse(c, "m", "\x93NUMPX\x01\x00\x00\x00", 10, MOE_F32));
	assert_non_null(strstr(first_error(c), "bad magic"));
	moe_diag_clear(c);
	assert_null(moe_npy_parse(c, "m", "\x93NU", 3, MOE_F32));
	assert_non_null(strstr(first_error(c), "too short"));
	moe_diag_clear(c);
	/* the truncation error carries the data offset */
	size_t len;
	const char *h6 = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\n";
	unsigned char *b = mk_npy(1, h6, d, 8, -1, &len);
	assert_null(moe_npy_parse(c, "m", b, len, MOE_F32));
	moe_loc loc;
	moe_diag_get(c, 0, NULL, &loc, NULL);
	assert_int_equal(loc.offset, 10 + (int64_t)strlen(h6));
	free(b);
	/* version 2.0, f16 and bf16-bits descrs, rank 0 */
	moe_diag_clear(c);
	uint16_t h[2] = {0x3c00, 0xc000}; /* f16 1.0, -2.0 */
	b = mk_npy(2, "{'descr': '<f2', 'fortran_order': False, 'shape': (2,)}\n", h, 4, -1, &len);
	moe_tensor *t = moe_npy_parse(c, "m", b, len, MOE_F32);
	assert_non_null(t);
	assert_true(((float *)t->data)[0] == 1.0f && ((float *)t->data)[1] == -2.0f);
	moe_tensor_free(c, t);
	free(b);
	uint16_t bf[2] = {0x3f80, 0x4040}; /* bf16 1.0, 3.0 */
	b = mk_npy(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }\n", bf, 4, -1, &len);
	t = moe_npy_parse(c, "m", b, len, MOE_F32);
	assert_true(((float *)t->data)[1] == 3.0f);
	moe_tensor_free(c, t);
	free(b);
	b = mk_npy(3, "{'descr': '<f4', 'fortran_order': False, 'shape': ()}\n", d, 4, -1, &len);
	t = moe_npy_parse(c, "m", b, len, MOE_F32);
	assert_non_null(t);
	assert_int_equal(t->rank, 0);
	moe_tensor_free(c, t);
	free(b);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

static void test_npy_roundtrip(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char p[512];
	int before = count_entries(NULL);
	int64_t s[3] = {2, 3, 5};
	moe_tensor *t = moe_tensor_new(c, MOE_F32, 3, s);
	for (int i = 0; i < 30; i++)
		((float *)t->data)[i] = (float)i * 0.37f - 4.0f;
	assert_int_equal(moe_npy_write(c, tpath(p, sizeof p, "a.npy"), t), MOE_OK);
	struct stat sb;
	assert_int_equal(stat(p, &sb), 0);
	assert_int_equal(sb.st_size, 128 + 30 * 4);
	moe_tensor *r = moe_npy_read(c, p, MOE_F32);
	assert_non_null(r);
	assert_int_equal(r->rank, 3);
	assert_int_equal(r->shape[2], 5);
	assert_memory_equal(r->data, t->data, 120);
	moe_tensor *rb = moe_npy_read(c, p, MOE_BF16);
	assert_int_equal(((uint16_t *)rb->data)[7], moe_f32_to_bf16(((float *)t->data)[7]));
	/* a bf16 tensor is written widened to f32 */
	assert_int_equal(moe_npy_write(c, tpath(p, sizeof p, "b.npy"), rb), MOE_OK);
	moe_tensor *rf = moe_npy_read(c, p, MOE_F32);
	assert_true(((float *)rf->data)[7] == moe_bf16_to_f32(((uint16_t *)rb->data)[7]));
	int64_t one[1] = {4};
	moe_tensor *iv = moe_tensor_new(c, MOE_I32, 1, one);
	((int32_t *)iv->data)[3] = -7;
	assert_int_equal(moe_npy_write(c, tpath(p, sizeof p, "i.npy"), iv), MOE_OK);
	moe_tensor *ir = moe_npy_read(c, p, MOE_I32);
	assert_int_equal(((int32_t *)ir->data)[3], -7);
	assert_int_equal(count_entries(NULL), before + 3);
	unlink(tpath(p, sizeof p, "a.npy"));
	unlink(tpath(p, sizeof p, "b.npy"));
	unlink(tpath(p, sizeof p, "i.npy"));
	moe_tensor_free(c, t);
	moe_tensor_free(c, r);
	moe_tensor_free(c, rb);
	moe_tensor_free(c, rf);
	moe_tensor_free(c, iv);
	moe_tensor_free(c, ir);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

/* ---- atomic output ---- */

static void test_atomic(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char p[512], buf[64];
	int before = count_entries(NULL);
	/* success: exactly the file, no temporary left */
	assert_int_equal(moe_write_file_atomic(c, tpath(p, sizeof p, "out.txt"), "hello", 5), MOE_OK);
	assert_int_equal(count_entries(NULL), before + 1);
	FILE *f = fopen(p, "rb");
	assert_int_equal(fread(buf, 1, sizeof buf, f), 5);
	fclose(f);
	assert_memory_equal(buf, "hello", 5);
	/* replacing: old content until commit, new after */
	moe_atomic_file *a = moe_atomic_open(c, p);
	assert_non_null(a);
	fputs("new content", moe_atomic_stream(a));
	fflush(moe_atomic_stream(a));
	assert_int_equal(count_entries(NULL), before + 2); /* the temporary exists meanwhile */
	f = fopen(p, "rb");
	assert_int_equal(fread(buf, 1, sizeof buf, f), 5);
	fclose(f);
	assert_int_equal(moe_atomic_commit(a), MOE_OK);
	assert_int_equal(count_entries(NULL), before + 1);
	/* abort: the temporary disappears, the old file stays */
	a = moe_atomic_open(c, p);
	fputs("discarded", moe_atomic_stream(a));
	moe_atomic_abort(a);
	assert_int_equal(count_entries(NULL), before + 1);
	f = fopen(p, "rb");
	assert_int_equal(fread(buf, 1, sizeof buf, f), 11);
	fclose(f);
	/* a directory as the output is refused before any temporary exists */
	char d[512], inner[600];
	mkdir(tpath(d, sizeof d, "sub"), 0755);
	snprintf(inner, sizeof inner, "%s/x", d);
	write_bytes(inner, "x", 1);
	assert_int_equal(moe_error_count(c), 0);
	assert_int_equal(moe_write_file_atomic(c, d, "data", 4), MOE_ERR_IO);
	assert_non_null(strstr(first_error(c), "directory"));
	assert_int_equal(count_entries(NULL), before + 2); /* out.txt and sub only */
	unlink(inner);
	rmdir(d);
	/* a directory that does not exist: an error, no file */
	moe_diag_clear(c);
	assert_int_equal(moe_write_file_atomic(c, "/nonexistent-moec-dir/out.bin", "x", 1), MOE_ERR_IO);
	assert_non_null(strstr(first_error(c), "temporary"));
	int64_t s1[1] = {3};
	moe_tensor *t = moe_tensor_new(c, MOE_F32, 1, s1);
	assert_int_not_equal(moe_npy_write(c, "/nonexistent-moec-dir/y.npy", t), MOE_OK);
	moe_tensor_free(c, t);
	unlink(p);
	assert_int_equal(count_entries(NULL), before);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixture_safetensors),
		cmocka_unit_test(test_fixture_npy),
		cmocka_unit_test(test_malformed_safetensors),
		cmocka_unit_test(test_weights_fixture),
		cmocka_unit_test(test_sharded),
		cmocka_unit_test(test_malformed_npy),
		cmocka_unit_test(test_npy_roundtrip),
		cmocka_unit_test(test_atomic),
	};
	return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
