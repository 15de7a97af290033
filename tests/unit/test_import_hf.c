/* Unit tests of moe_import_hf: for every fixture config the generated .moe
 * binds exactly the MoE block's tensors of the fixture checkpoint, with the
 * declared shapes; unsupported types and dense layers are clear errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/frontend.h"
#include "moec/io.h"

#define FIX MOEC_SOURCE_DIR "/tests/fixtures/hf/"
static const char *const fams[] = {"mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3", "llama4"};
#define NFAMS (sizeof fams / sizeof *fams)

typedef struct dimtab {
	char name[16][16];
	int64_t val[16];
	int n;
} dimtab;

static int64_t dim_of(const dimtab *d, const char *s, size_t n)
{
	if (isdigit((unsigned char)*s))
		return strtoll(s, NULL, 10);
	for (int i = 0; i < d->n; i++)
		if (strlen(d->name[i]) == n && !strncmp(d->name[i], s, n))
			return d->val[i];
	fail_msg("unknown dim %.*s", (int)n, s);
	return -1;
}

/* "A = 3, B = 2 * A, C = A / B, D = A + 1" (one operator at most) */
static void read_dims(dimtab *d, const char *line)
{
	const char *p = line;
	while (*p && *p != '\n' && *p != '#') {
		while (*p == ' ' || *p == ',')
			p++;
		if (!isalpha((unsigned char)*p))
			break;
		const char *nm = p;
		while (isalnum((unsigned char)*p))
			p++;
		size_t nl = (size_t)(p - nm);
		while (*p == ' ' || *p == '=')
			p++;
		const char *a = p;
		while (isalnum((unsigned char)*p))
			p++;
		int64_t v = dim_of(d, a, (size_t)(p - a));
		while (*p == ' ')
			p++;
		if (*p == '*' || *p == '/' || *p == '+') {
			char op = *p++;
			while (*p == ' ')
				p++;
			const char *b = p;
			while (isalnum((unsigned char)*p))
				p++;
			int64_t w = dim_of(d, b, (size_t)(p - b));
			v = op == '*' ? v * w : op == '+' ? v + w : v / w;
		}
		memcpy(d->name[d->n], nm, nl);
		d->name[d->n][nl] = 0;
		d->val[d->n++] = v;
	}
}

/* source with {layer} -> 0 and {e} -> e */
static void expand(char *out, size_t n, const char *src, size_t len, int e)
{
	size_t o = 0;
	for (size_t i = 0; i < len && o + 8 < n;) {
		if (!strncmp(src + i, "{layer}", 7)) {
			o += (size_t)snprintf(out + o, n - o, "0");
			i += 7;
		} else if (!strncmp(src + i, "{e}", 3)) {
			o += (size_t)snprintf(out + o, n - o, "%d", e);
			i += 3;
		} else {
			out[o++] = src[i++];
		}
	}
	out[o] = 0;
}

static void check_family(const char *fam)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char p[512];
	snprintf(p, sizeof p, FIX "%s/config.json", fam);
	moe_import_opts o = {.layer = 0, .tokens = 5, .block = 16, .dtype = MOE_F32, .prefix = NULL};
	char *text = NULL;
	assert_int_equal(moe_import_hf(c, p, &o, &text), MOE_OK);
	assert_non_null(text);
	snprintf(p, sizeof p, FIX "%s/model.safetensors", fam);
	moe_safetensors *st = moe_safetensors_open(c, p);
	assert_non_null(st);
	size_t n = moe_safetensors_count(st);
	bool *used = calloc(n, sizeof *used);
	dimtab d = {.n = 0};
	for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		while (*line == ' ')
			line++;
		if (!strncmp(line, "dim ", 4))
			read_dims(&d, line + 4);
		if (strncmp(line, "weight ", 7))
			continue;
		/* weight NAME : [dtype][DIMS] = "SOURCE" */
		const char *lb = strchr(line, '['), *rb = strchr(line, ']'), *q1 = strchr(line, '"');
		assert_non_null(lb);
		assert_non_null(q1);
		const char *q2 = strchr(q1 + 1, '"');
		int64_t shape[8];
		int rank = 0;
		for (const char *s = lb + 1; s < rb;) {
			while (*s == ' ' || *s == ',')
				s++;
			const char *b = s;
			while (isalnum((unsigned char)*s))
				s++;
			shape[rank++] = dim_of(&d, b, (size_t)(s - b));
		}
		bool stacked = false;
		for (const char *s = q1; s + 3 <= q2; s++)
			stacked |= !strncmp(s, "{e}", 3);
		int count = stacked ? (int)shape[0] : 1;
		for (int e = 0; e < count; e++) {
			char name[256];
			expand(name, sizeof name, q1 + 1, (size_t)(q2 - q1 - 1), e);
			const moe_st_tensor *t = moe_safetensors_find(st, name);
			if (!t)
				fail_msg("%s: generated source '%s' is not in the checkpoint", fam, name);
			int pr = stacked ? rank - 1 : rank;
			assert_int_equal(t->rank, pr);
			for (int i = 0; i < pr; i++)
				if (t->shape[i] != shape[i + stacked])
					fail_msg("%s: '%s' dim %d is %lld, .moe says %lld", fam, name, i, (long long)t->shape[i],
						(long long)shape[i + stacked]);
			used[t - moe_safetensors_at(st, 0)] = true;
		}
	}
	/* every tensor of the MoE block is bound */
	for (size_t i = 0; i < n; i++) {
		const char *nm = moe_safetensors_at(st, i)->name;
		bool block = !strncmp(nm, "model.layers.0.", 15) &&
			(strstr(nm, ".mlp.") || strstr(nm, ".block_sparse_moe.") || strstr(nm, ".feed_forward."));
		if (block && !used[i])
			fail_msg("%s: checkpoint tensor '%s' is not bound by the generated .moe", fam, nm);
	}
	free(used);
	moe_safetensors_close(st);
	moe_free(c, text);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

/* Every fixture folder (one per family, written by HF transformers): the generated .moe binds
 * exactly the block's tensors with the checkpoint's shapes. */
static void test_fixture_configs(void **st)
{
	(void)st;
	DIR *d = opendir(FIX);
	assert_non_null(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));) {
		char p[512];
		snprintf(p, sizeof p, FIX "%s/config.json", e->d_name);
		FILE *f = e->d_name[0] != '.' ? fopen(p, "rb") : NULL;
		if (!f)
			continue;
		fclose(f);
		check_family(e->d_name);
		n++;
	}
	closedir(d);
	assert_true(n >= 38);
}

static char *gen(moe_ctx *c, const char *json, int layer, moe_dtype dt, moe_status want)
{
	moe_import_opts o = {.layer = layer, .tokens = 4, .block = 8, .dtype = dt, .prefix = NULL};
	char *text = NULL;
	moe_status s = moe_import_hf_text(c, "config.json", json, strlen(json), &o, &text);
	if (s != want)
		fail_msg("status %d, wanted %d", s, want);
	return text;
}

static void expect_error(const char *json, int layer, moe_status want, const char *needle)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *t = gen(c, json, layer, MOE_F32, want);
	assert_null(t);
	const char *msg;
	moe_loc loc;
	assert_true(moe_error_count(c) > 0);
	moe_diag_get(c, 0, NULL, &loc, &msg);
	if (!strstr(msg, needle))
		fail_msg("message '%s' lacks '%s'", msg, needle);
	assert_string_equal(loc.file, "config.json");
	moe_ctx_free(c);
}

static void test_errors(void **st)
{
	(void)st;
	expect_error("{\"model_type\":\"llama\"}", 0, MOE_ERR_UNSUPPORTED, "supported: mixtral");
	expect_error("{\"hidden_size\":8}", 0, MOE_ERR_UNSUPPORTED, "no model_type");
	expect_error("[1]", 0, MOE_ERR_FORMAT, "not a JSON object");
	expect_error("{\"model_type\":\"granitemoe\",\"num_local_experts\":4,\"num_experts_per_tok\":2,"
		     "\"intermediate_size\":8}", 0, MOE_ERR_INVALID, "'hidden_size'");
	expect_error("{\"model_type\":\"mixtral\",\"hidden_size\":8,\"num_local_experts\":4,\"num_experts\":5,"
		     "\"num_experts_per_tok\":2,\"intermediate_size\":8}", 0, MOE_ERR_INVALID, "disagree");
	expect_error("{\"model_type\":\"mixtral\",\"hidden_size\":8,\"num_local_experts\":4,"
		     "\"num_experts_per_tok\":5,\"intermediate_size\":8}", 0, MOE_ERR_INVALID, "exceeds");
	expect_error("{\"model_type\":\"mixtral\",\"hidden_size\":8,\"num_local_experts\":4,\"num_hidden_layers\":2,"
		     "\"num_experts_per_tok\":2,\"intermediate_size\":8}", 2, MOE_ERR_INVALID, "does not exist");
	expect_error("{\"model_type\":\"deepseek_v3\",\"hidden_size\":8,\"n_routed_experts\":8,\"first_k_dense_replace\":3,"
		     "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}", 1, MOE_ERR_INVALID, "first_k_dense_replace");
	expect_error("{\"model_type\":\"qwen2_moe\",\"hidden_size\":8,\"num_experts\":8,\"mlp_only_layers\":[0,1],"
		     "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"shared_expert_intermediate_size\":8}", 1,
		MOE_ERR_INVALID, "mlp_only_layers");
	expect_error("{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"num_experts\":8,\"decoder_sparse_step\":2,"
		     "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}", 0, MOE_ERR_INVALID, "decoder_sparse_step");
	expect_error("{\"model_type\":\"llama4\",\"text_config\":{\"model_type\":\"llama4_text\",\"hidden_size\":8,"
		     "\"num_local_experts\":4,\"num_experts_per_tok\":1,\"intermediate_size\":8,\"moe_layers\":[1,3]}}", 0,
		MOE_ERR_INVALID, "moe_layers");
	expect_error("{\"model_type\":\"llama4_text\",\"hidden_size\":8,\"num_local_experts\":4,\"num_experts_per_tok\":1,"
		     "\"intermediate_size\":8,\"interleave_moe_layer_step\":2}", 0, MOE_ERR_INVALID, "interleave_moe_layer_step");
	expect_error("{\"model_type\":\"deepseek_v3\",\"hidden_size\":8,\"first_k_dense_replace\":0,\"n_routed_experts\":8,\"n_group\":3,"
		     "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}", 0, MOE_ERR_INVALID, "divisible");
	expect_error("{\"model_type\":\"olmoe\",\"hidden_size\":8,\"num_experts\":8,\"hidden_act\":\"relu2\","
		     "\"num_experts_per_tok\":2,\"intermediate_size\":8}", 0, MOE_ERR_INVALID, "hidden_act");
	expect_error("{\"model_type\":\"olmoe\",\"hidden_size\":8.5,\"num_experts\":8,"
		     "\"num_experts_per_tok\":2,\"intermediate_size\":8}", 0, MOE_ERR_INVALID, "integer");
}

static void test_variants(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	/* nested Llama 4: text_config and the multimodal checkpoint prefix */
	char *t = gen(c, "{\"model_type\":\"llama4\",\"text_config\":{\"model_type\":\"llama4_text\",\"hidden_size\":8,"
			 "\"num_local_experts\":4,\"num_experts_per_tok\":1,\"intermediate_size\":8,\"moe_layers\":[0]}}",
		0, MOE_BF16, MOE_OK);
	assert_non_null(strstr(t, "\"language_model.model.layers.{layer}.feed_forward.experts.gate_up_proj\""));
	assert_non_null(strstr(t, "weight_on=\"input\""));
	assert_non_null(strstr(t, "dtype bf16"));
	assert_non_null(strstr(t, "sw     = sigmoid(cast(take_along(logits, idx, axis=1), f32))"));
	assert_non_null(strstr(t, "w      = cast(sw, dtype)"));
	moe_free(c, t);
	/* Qwen3 in bf16: router weights cast back to the compute type; gelu_pytorch_tanh */
	t = gen(c, "{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"num_experts\":8,\"norm_topk_prob\":true,"
		   "\"hidden_act\":\"gelu_pytorch_tanh\",\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}",
		3, MOE_BF16, MOE_OK);
	assert_non_null(strstr(t, "w      = cast(sw_n, dtype)"));
	assert_non_null(strstr(t, "act=\"geglu_tanh\""));
	assert_non_null(strstr(t, "param layer = 3"));
	moe_free(c, t);
	/* DeepSeek without group limits, no renormalisation, router in f32 */
	t = gen(c, "{\"model_type\":\"deepseek_v3\",\"hidden_size\":8,\"first_k_dense_replace\":0,\"n_routed_experts\":8,\"n_group\":1,"
		   "\"topk_group\":1,\"norm_topk_prob\":false,\"routed_scaling_factor\":1,\"n_shared_experts\":2,"
		   "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}", 0, MOE_BF16, MOE_OK);
	assert_null(strstr(t, "reshape"));
	assert_non_null(strstr(t, "w      = sw   #"));
	assert_null(strstr(t, "sw_n"));
	assert_non_null(strstr(t, "dim S = 16"));
	assert_non_null(strstr(t, "weight router             : [E, D]"));
	assert_non_null(strstr(t, "weight score_bias         : f32[E]"));
	assert_non_null(strstr(t, "cast(x, f32), cast(router, f32))"));
	assert_null(strstr(t, "cast(w"));      /* DeepSeek's weights stay f32 */
	moe_free(c, t);
	/* gpt-oss limit */
	t = gen(c, "{\"model_type\":\"gpt_oss\",\"hidden_size\":8,\"num_local_experts\":4,\"swiglu_limit\":5,"
		   "\"num_experts_per_tok\":2,\"intermediate_size\":8}", 0, MOE_F32, MOE_OK);
	assert_non_null(strstr(t, "limit=5.0"));
	moe_free(c, t);
	/* an explicit prefix */
	moe_import_opts o = {.layer = 0, .tokens = 4, .block = 8, .dtype = MOE_F32, .prefix = "blocks.{layer}."};
	const char *js = "{\"model_type\":\"olmoe\",\"hidden_size\":8,\"num_experts\":8,\"num_experts_per_tok\":2,"
			 "\"intermediate_size\":8}";
	assert_int_equal(moe_import_hf_text(c, "c.json", js, strlen(js), &o, &t), MOE_OK);
	assert_non_null(strstr(t, "\"blocks.{layer}.mlp.gate.weight\""));
	moe_free(c, t);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

/* The textual IR of the one-layer module of text (with dtype set when given). */
static char *lowered(moe_ctx *c, const char *text, const char *dtype)
{
	moe_setting set = {"dtype", dtype};
	moe_settings sets = {&set, 1};
	moe_module *m = moe_parse_moe(c, "layer.moe", text, strlen(text), dtype ? &sets : NULL);
	if (!m) {
		moe_diag_print(c, stderr);
		fail_msg("the generated .moe does not parse");
	}
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	assert_int_equal(moe_module_print(m, f), MOE_OK);
	fclose(f);
	moe_module_free(m);
	return buf;
}

/* One generated file serves both compute types: importing for bf16 differs
 * from importing for f32 only in the `dtype` line, and `--set dtype=bf16` on
 * the f32 file lowers to the very IR of the bf16 import (and back). */
static void test_dtype_follows_set(void **st)
{
	(void)st;
	for (size_t i = 0; i < NFAMS; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		char p[512];
		snprintf(p, sizeof p, FIX "%s/config.json", fams[i]);
		moe_import_opts o32 = {.layer = 0, .tokens = 5, .block = 4, .dtype = MOE_F32, .prefix = NULL},
				 o16 = {.layer = 0, .tokens = 5, .block = 4, .dtype = MOE_BF16, .prefix = NULL};
		char *t32 = NULL, *t16 = NULL;
		assert_int_equal(moe_import_hf(c, p, &o32, &t32), MOE_OK);
		assert_int_equal(moe_import_hf(c, p, &o16, &t16), MOE_OK);
		/* the texts agree line by line except "  dtype f32" / "  dtype bf16" */
		const char *a = t32, *b = t16;
		int dtype_lines = 0;
		while (*a || *b) {
			size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
			if (la != lb || strncmp(a, b, la)) {
				if (la == 11 && lb == 12 && !strncmp(a, "  dtype f32", 11) && !strncmp(b, "  dtype bf16", 12))
					dtype_lines++;
				else
					fail_msg("%s: f32 and bf16 imports differ: '%.*s' vs '%.*s'", fams[i], (int)la, a, (int)lb, b);
			}
			a += la + (a[la] == '\n');
			b += lb + (b[lb] == '\n');
		}
		assert_int_equal(dtype_lines, 1);
		/* no cast names a fixed compute type: only `dtype` or the f32 of routing math */
		assert_null(strstr(t32, ", bf16)"));
		char *ir16 = lowered(c, t16, NULL), *ir32to16 = lowered(c, t32, "bf16");
		char *ir32 = lowered(c, t32, NULL), *ir16to32 = lowered(c, t16, "f32");
		if (strcmp(ir16, ir32to16))
			fail_msg("%s: --set dtype=bf16 on the f32 import lowers differently from the bf16 import", fams[i]);
		if (strcmp(ir32, ir16to32))
			fail_msg("%s: --set dtype=f32 on the bf16 import lowers differently from the f32 import", fams[i]);
		assert_non_null(strstr(ir16, "dtype=bf16"));
		free(ir16);
		free(ir32to16);
		free(ir32);
		free(ir16to32);
		moe_free(c, t32);
		moe_free(c, t16);
		assert_int_equal(moe_error_count(c), 0);
		moe_ctx_free(c);
	}
}

/* DeepSeek's group-limited selection masks the dropped groups with -inf. */
static void test_deepseek_group_mask(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *t = gen(c, "{\"model_type\":\"deepseek_v3\",\"hidden_size\":8,\"first_k_dense_replace\":0,\"n_routed_experts\":8,\"n_group\":4,"
			 "\"topk_group\":2,\"num_experts_per_tok\":3,\"moe_intermediate_size\":8}", 0, MOE_F32, MOE_OK);
	assert_non_null(strstr(t, "masked = reshape(select(keep, c3, -inf), shape=[T, E])"));
	assert_non_null(strstr(t, "idx    = topk(masked, k=K)"));
	assert_null(strstr(t, "reduce_min"));
	assert_non_null(strstr(t, "+ 1e-20)"));
	moe_free(c, t);
	/* every group kept: no mask at all */
	t = gen(c, "{\"model_type\":\"deepseek_v3\",\"hidden_size\":8,\"first_k_dense_replace\":0,\"n_routed_experts\":8,\"n_group\":4,"
		   "\"topk_group\":4,\"num_experts_per_tok\":3,\"moe_intermediate_size\":8}", 0, MOE_F32, MOE_OK);
	assert_null(strstr(t, "masked"));
	assert_non_null(strstr(t, "idx    = topk(c, k=K)"));
	moe_free(c, t);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	char *buf = malloc(1 << 20);
	assert_non_null(buf);
	size_t n = fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	buf[n] = 0;
	return buf;
}

/* docs/families.md holds the table `moec import-hf --list --markdown` prints, verbatim. */
static void test_families_doc(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *table = NULL, *names = NULL;
	assert_int_equal(moe_import_hf_families(c, MOE_HF_LIST_MARKDOWN, &table), MOE_OK);
	assert_int_equal(moe_import_hf_families(c, MOE_HF_LIST_NAMES, &names), MOE_OK);
	char *doc = read_all(MOEC_SOURCE_DIR "/docs/families.md");
	const char *b = strstr(doc, "<!-- generated: moec import-hf --list --markdown -->\n");
	const char *e = strstr(doc, "<!-- end generated -->");
	assert_non_null(b);
	assert_non_null(e);
	b = strchr(b, '\n') + 1;
	if ((size_t)(e - b) != strlen(table) || strncmp(b, table, strlen(table)))
		fail_msg("docs/families.md differs from `moec import-hf --list --markdown`; regenerate it");
	/* the 38 families docs/families.md lists, each answered by a row */
	static const char *const want[] = {"mixtral", "phimoe", "jamba", "olmoe", "flex_olmo", "qwen2_moe", "qwen3_moe",
		"qwen3_next", "qwen3_vl_moe", "qwen3_5_moe", "deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2",
		"kimi_linear", "glm4_moe", "glm4_moe_lite", "glm4v_moe", "glm_moe_dsa", "mistral4", "dots1",
		"ernie4_5_moe", "exaone_moe", "granitemoe", "granitemoeshared", "hunyuan_v1_moe", "hy_v3", "jetmoe",
		"dbrx", "minimax", "minimax_m2", "mimo_v2_flash", "solar_open", "llama4", "gpt_oss", "nemotron_h", "aria",
		"cohere2_moe"};
	for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
		char row[64];
		snprintf(row, sizeof row, "| %s", want[i]);
		if (!strstr(table, row))
			fail_msg("no row for %s", want[i]);
	}
	assert_non_null(strstr(names, "qwen3_vl_moe_text"));
	free(doc);
	moe_free(c, table);
	moe_free(c, names);
	moe_ctx_free(c);
}

/* The new import errors: a dense layer names the nearest MoE layer, a quantized config is refused
 * (unless asked), per-layer lists need an entry for the layer. */
static void test_new_errors(void **st)
{
	(void)st;
	expect_error("{\"model_type\":\"deepseek_v3\",\"hidden_size\":8,\"n_routed_experts\":8,\"num_hidden_layers\":6,"
		     "\"first_k_dense_replace\":3,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}", 1, MOE_ERR_INVALID,
		"the nearest MoE layer is 3 (--layer 3)");
	expect_error("{\"model_type\":\"glm4_moe_lite\",\"hidden_size\":8,\"n_routed_experts\":8,\"num_hidden_layers\":3,"
		     "\"mlp_layer_types\":[\"dense\",\"dense\",\"sparse\"],\"num_experts_per_tok\":2,"
		     "\"moe_intermediate_size\":8}", 0, MOE_ERR_INVALID, "mlp_layer_types[0] is 'dense'");
	expect_error("{\"model_type\":\"jamba\",\"hidden_size\":8,\"num_experts\":8,\"num_hidden_layers\":4,"
		     "\"num_experts_per_tok\":2,\"intermediate_size\":8}", 2, MOE_ERR_INVALID, "nearest MoE layer is 1");
	expect_error("{\"model_type\":\"nemotron_h\",\"hidden_size\":8,\"n_routed_experts\":8,"
		     "\"hybrid_override_pattern\":\"M-M\",\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}", 0,
		MOE_ERR_INVALID, "the config has no MoE layer");
	expect_error("{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"num_experts\":8,\"num_experts_per_tok\":2,"
		     "\"moe_intermediate_size\":8,\"quantization_config\":{\"quant_method\":\"fp8\"}}", 0, MOE_ERR_INVALID,
		"fp8 needs weight_block_size");
	expect_error("{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"num_experts\":8,\"num_experts_per_tok\":2,"
		     "\"moe_intermediate_size\":8,\"quantization_config\":{\"quant_method\":\"hqq\"}}", 0, MOE_ERR_INVALID,
		"quant_method 'hqq' is not supported");
	expect_error("{\"model_type\":\"hunyuan_v1_moe\",\"hidden_size\":8,\"num_experts\":8,\"moe_topk\":[2],"
		     "\"num_hidden_layers\":2,\"moe_intermediate_size\":8}", 1, MOE_ERR_INVALID, "'moe_topk' lists 1");
	expect_error("{\"model_type\":\"deepseek_v2\",\"hidden_size\":8,\"n_routed_experts\":8,\"topk_method\":\"x\","
		     "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}", 0, MOE_ERR_INVALID, "topk_method 'x'");
	expect_error("{\"model_type\":\"phimoe\",\"hidden_size\":8,\"num_local_experts\":8,\"num_experts_per_tok\":3,"
		     "\"intermediate_size\":8}", 0, MOE_ERR_INVALID, "sparsemixer");
}

/* Config-driven options: torch_dtype, nested text configs, per-layer lists, --ignore-quantization. */
static void test_config_options(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_import_opts o = {.tokens = 4, .block = 8, .dtype = MOE_F32, .config_dtype = 1};
	const char *js = "{\"model_type\":\"qwen3_vl_moe\",\"torch_dtype\":\"bfloat16\",\"text_config\":{\"model_type\":"
			 "\"qwen3_vl_moe_text\",\"hidden_size\":8,\"num_experts\":8,\"num_experts_per_tok\":2,"
			 "\"moe_intermediate_size\":8}}";
	char *t = NULL;
	assert_int_equal(moe_import_hf_text(c, "c.json", js, strlen(js), &o, &t), MOE_OK);
	assert_non_null(strstr(t, "dtype bf16"));
	assert_non_null(strstr(t, "\"model.language_model.layers.{layer}.mlp.experts.gate_up_proj\""));
	moe_free(c, t);
	o.config_dtype = 0; /* --set dtype= wins */
	assert_int_equal(moe_import_hf_text(c, "c.json", js, strlen(js), &o, &t), MOE_OK);
	assert_non_null(strstr(t, "dtype f32"));
	moe_free(c, t);
	o.layer = 1;
	js = "{\"model_type\":\"hunyuan_v1_moe\",\"hidden_size\":8,\"num_experts\":8,\"moe_topk\":[2,3],"
	     "\"intermediate_size\":8,\"moe_intermediate_size\":[8,12],\"num_shared_expert\":[1,2],"
	     "\"quantization_config\":{\"quant_method\":\"fp8\"}}";
	o.ignore_quantization = 1;
	assert_int_equal(moe_import_hf_text(c, "c.json", js, strlen(js), &o, &t), MOE_OK);
	assert_non_null(strstr(t, "F = 12, E = 8, K = 3"));
	assert_non_null(strstr(t, "dim S = 16"));
	assert_non_null(strstr(t, "router             : f32[E, D]"));
	moe_free(c, t);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixture_configs),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_variants),
		cmocka_unit_test(test_dtype_follows_set),
		cmocka_unit_test(test_deepseek_group_mask),
		cmocka_unit_test(test_families_doc),
		cmocka_unit_test(test_new_errors),
		cmocka_unit_test(test_config_options),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
