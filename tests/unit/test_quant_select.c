/* tests/unit/test_quant_select.c: which modules a quantization_config leaves
 * unconverted (runtime/rt_re.h). The tables are the frameworks' own rules:
 * transformers' should_convert_module (an entry excludes a module when
 * re.match(entry + "\\.", m), re.match(entry, m) or m.endswith(entry)) with
 * the examples of its comments, and compressed-tensors' _match_name ("re:P"
 * is re.match(P, m), anything else must equal m). The regex subset is checked
 * against answers Python 3.11's re.match gives for the same pairs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "moec/moec.h"
#include "runtime/rt_quant.h"
#include "runtime/rt_re.h"

typedef struct sel_case {
	const char *entry, *module;
	int excluded; /* 1 not converted, 0 converted */
} sel_case;

/* modules_to_not_convert (fp8, fbgemm_fp8) */
static const sel_case hf_cases[] = {
	/* the examples in should_convert_module's comments */
	{"model.decoder.layer.11.", "model.decoder.layer.11.attn.weight", 1},
	{"lm_head", "lm_head", 1},
	{"model.decoder.layer.*", "model.decoder.layer.11.attn.weight", 1},
	{"fc1", "model.decoder.layers.23.fc1", 1},
	/* MiniMax-M2's list: the router goes, the experts' projections stay quantized */
	{"gate", "model.layers.0.block_sparse_moe.gate", 1},
	{"gate", "model.layers.0.block_sparse_moe.experts.0.w1", 0},
	{"gate", "model.layers.0.mlp.experts.0.gate_proj", 0},
	{"gate", "model.layers.0.mlp.gate_proj", 0},
	{"e_score_correction_bias", "model.layers.0.block_sparse_moe.experts.0.w1", 0},
	{"lm_head", "model.layers.0.mlp.experts.0.gate_proj", 0},
	/* the suffix is a plain string suffix, not one at a dot */
	{"gate", "model.layers.0.mlp.up_gate", 1},
	/* a suffix is literal text, a prefix is a regex anchored at the start */
	{"mlp.gate", "model.layers.0.mlp.gate", 1},
	{"mlp.gate", "model.layers.0.mlpXgate", 0},
	{"model.layers.0.mlp", "model.layers.0.mlp.experts.3.down_proj", 1},
	{"model.layers.0", "model.layers.10.mlp.gate", 0},
	{"model.layers.1", "model.layers.10.mlp.gate", 1}, /* re.match("model.layers.1") is a prefix of it */
	{"model.layers.*.self_attn", "model.layers.3.self_attn", 1},
	{"model.layers.*.self_attn", "model.layers.3.self_attn.q_proj", 1},
	{"self_attn", "model.layers.3.self_attn.q_proj", 0}, /* neither prefix nor suffix */
	{"feed_forward.router", "language_model.model.layers.0.feed_forward.router", 1},
	{"model\\.layers\\.[0-2]\\.mlp", "model.layers.2.mlp.experts.0.up_proj", 1},
	{"model\\.layers\\.[0-2]\\.mlp", "model.layers.3.mlp.experts.0.up_proj", 0},
	{"(model|lm)\\.layers\\.0\\.mlp\\.experts\\.\\d+\\.(gate|up)_proj$", "model.layers.0.mlp.experts.17.up_proj", 1},
	{"(model|lm)\\.layers\\.0\\.mlp\\.experts\\.\\d+\\.(gate|up)_proj$", "model.layers.0.mlp.experts.17.down_proj", 0},
	{"re:.*gate", "model.layers.0.mlp.gate", 0}, /* "re:" means nothing to transformers */
};

/* compressed-tensors ignore */
static const sel_case ct_cases[] = {
	{"lm_head", "lm_head", 1},
	{"lm_head", "model.lm_head", 0},
	{"gate", "model.layers.0.mlp.gate", 0}, /* names match exactly */
	{"model.layers.0.mlp.gate", "model.layers.0.mlp.gate", 1},
	{"model.layers.0.mlp", "model.layers.0.mlp.experts.0.gate_proj", 0},
	{"re:.*mlp\\.gate$", "model.layers.0.mlp.gate", 1},
	{"re:.*mlp\\.gate$", "model.layers.0.mlp.gate_proj", 0},
	{"re:.*self_attn.*", "model.layers.1.self_attn.q_proj", 1},
	{"re:.*shared_experts.*", "model.layers.1.mlp.shared_experts.down_proj", 1},
	{"re:.*shared_experts.*", "model.layers.1.mlp.experts.0.down_proj", 0},
	{"re:model.layers.0.mlp.experts", "model.layers.0.mlp.experts.7.gate_proj", 1}, /* re.match: a prefix */
	{"re:mlp.gate", "model.layers.0.mlp.gate", 0},                                  /* anchored at the start */
	{"re:.*experts\\.[0-9]+\\.(gate|up)_proj", "model.layers.0.mlp.experts.12.up_proj", 1},
	{"re:.*experts\\.[0-9]+\\.(gate|up)_proj", "model.layers.0.mlp.experts.12.down_proj", 0},
	{"re:^model\\.layers\\.(0|1)\\.", "model.layers.1.mlp.gate", 1},
	{"re:^model\\.layers\\.(0|1)\\.", "model.layers.11.mlp.gate", 0},
};

static void run_table(const sel_case *t, size_t n, bool ct)
{
	for (size_t i = 0; i < n; i++) {
		long budget = RT_RE_STEPS;
		char err[200] = "";
		int m = ct ? rt_sel_ct(t[i].entry, t[i].module, &budget, err, sizeof err)
			   : rt_sel_hf(t[i].entry, t[i].module, &budget, err, sizeof err);
		if (m != t[i].excluded)
			fail_msg("%s rule: '%s' on '%s' gave %d (%s), want %d", ct ? "compressed-tensors" : "transformers",
				t[i].entry, t[i].module, m, err, t[i].excluded);
	}
}

static void test_hf_rule(void **st)
{
	(void)st;
	run_table(hf_cases, sizeof hf_cases / sizeof *hf_cases, false);
}

static void test_ct_rule(void **st)
{
	(void)st;
	run_table(ct_cases, sizeof ct_cases / sizeof *ct_cases, true);
}

/* re.match answers (1 match, 0 none, -1 an error) as Python 3.11 gives them. */
static const struct {
	const char *pat, *s;
	int want;
} re_cases[] = {
	{"a*", "", 1}, {"^a", "ba", 0}, {"a$", "a\n", 1}, {"a\\Z", "a\n", 0}, {"a.c", "a\nc", 0},
	{"x{2,3}y", "xxy", 1}, {"x{2,3}y", "xy", 0}, {"x{,2}y", "y", 1}, {"a{", "a{", 1}, {"a{x}", "a{x}", 1},
	{"a{1,", "a{1,", 1}, {"[]a]", "]", 1}, {"[a-]", "-", 1}, {"[^a-c]+x", "dx", 1}, {"[^a-c]+x", "ax", 0},
	{"\\bgate\\b", "gate x", 1}, {"\\Bate", "gate", 0}, {"(?:ab)+$", "abab", 1}, {"(?P<n>x)y", "xy", 1},
	{"(?#note)x", "x", 1}, {"\\x41\\101\\u0041", "AAA", 1}, {"a|", "b", 1}, {"()*b", "b", 1},
	{"(a*)*b", "aab", 1}, {"[\\w.]+$", "model.layers.0", 1}, {"[^\\W\\d]+$", "ab_", 1}, {"[\\s\\S]", "\n", 1},
	{".$", "\xc3\xa9", 1}, /* one code point */
	{"*a", "a", -1}, {"a**", "a", -1}, {"(", "", -1}, {")", "", -1}, {"[", "", -1}, {"[z-a]", "", -1},
	{"a{3,2}", "", -1}, {"^*", "", -1}, {"\\q", "", -1}, {"[\\d-z]", "", -1},
	/* outside the subset: Python reads them, moec refuses them */
	{"(?=x)", "x", -1}, {"(?i)x", "x", -1}, {"(a)\\1", "aa", -1}, {"a*+", "a", -1},
};

static void test_re_subset(void **st)
{
	(void)st;
	for (size_t i = 0; i < sizeof re_cases / sizeof *re_cases; i++) {
		long budget = RT_RE_STEPS;
		char err[200] = "";
		rt_re *re = rt_re_compile(re_cases[i].pat, &budget, err, sizeof err);
		int m = re ? rt_re_match(re, re_cases[i].s, &budget) : -1;
		rt_re_free(re);
		if (m != re_cases[i].want)
			fail_msg("re.match('%s', '%s') gave %d (%s), want %d", re_cases[i].pat, re_cases[i].s, m, err,
				re_cases[i].want);
		if (!re)
			assert_true(err[0]);
	}
}

/* 25 ".*" (exponential for a backtracking matcher) answer in few steps; a
 * 300,000-byte pattern and groups nested 100,000 deep are errors. */
static void test_hostile_patterns(void **st)
{
	(void)st;
	char pat[200] = "";
	for (int i = 0; i < 25; i++)
		strcat(pat, ".*");
	strcat(pat, "Q");
	const char *name = "model.layers.0.block_sparse_moe.experts.0.w1.weight.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
	long budget = RT_RE_STEPS;
	char err[200];
	assert_int_equal(rt_sel_hf(pat, name, &budget, err, sizeof err), 0);
	/* linear: about (pattern states x name bytes) steps, where a backtracking
	 * matcher takes on the order of 85^25 */
	assert_true(RT_RE_STEPS - budget < 100000);

	char *big = malloc(300001);
	assert_non_null(big);
	for (int i = 0; i < 300000; i += 2)
		memcpy(big + i, ".*", 2);
	big[300000] = 0;
	budget = RT_RE_STEPS;
	assert_int_equal(rt_sel_ct(big, name, &budget, err, sizeof err), 0); /* not "re:": compared, never compiled */
	assert_int_equal(rt_sel_hf(big, name, &budget, err, sizeof err), -1);
	assert_non_null(strstr(err, "more than the 4096"));
	memset(big, '(', 100000);
	big[100000] = 0;
	budget = RT_RE_STEPS;
	assert_int_equal(rt_sel_hf(big, name, &budget, err, sizeof err), -1);
	memset(big, '(', 1000);
	big[1000] = 0;
	budget = RT_RE_STEPS;
	assert_int_equal(rt_sel_hf(big, name, &budget, err, sizeof err), -1);
	assert_non_null(strstr(err, "nested more than"));
	/* an expansion past the program limit */
	budget = RT_RE_STEPS;
	assert_int_equal(rt_sel_hf("((a{1000}){1000}){1000}", name, &budget, err, sizeof err), -1);
	assert_non_null(strstr(err, "instructions"));
	free(big);
}

/* Many long patterns against many names exhaust the shared budget: an error
 * after a bounded number of steps (the budget counts VM steps, so the bound on
 * time follows from it without a clock in the test), not minutes of matching. */
static void test_budget(void **st)
{
	(void)st;
	char name[4000];
	memset(name, 'a', sizeof name - 1);
	name[sizeof name - 1] = 0;
	long budget = RT_RE_STEPS;
	char err[200];
	int m = 0, calls = 0;
	for (int i = 0; i < 100000 && m >= 0; i++, calls++)
		m = rt_sel_ct("re:(a*)*b", name, &budget, err, sizeof err);
	assert_int_equal(m, -1);
	assert_non_null(strstr(err, "budget"));
	assert_true(budget <= 0);
	/* each call costs at least one step per character of the name */
	assert_true((long)calls <= RT_RE_STEPS / (long)(sizeof name - 1) + 1);
}

static moe_status rewrite(const char *qc_json, char **text, char *msg, size_t n)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	cJSON *qc = cJSON_Parse(qc_json);
	assert_non_null(qc);
	moe_status s = rt_quant_rewrite(c, "config.json", qc, text);
	msg[0] = 0;
	if (moe_diag_count(c)) {
		const char *m;
		moe_diag_get(c, 0, NULL, NULL, &m);
		snprintf(msg, n, "%s", m);
	}
	cJSON_Delete(qc);
	moe_ctx_free(c);
	return s;
}

static const char layer_text[] =
	"layer l {\n"
	"  dim D = 64, F = 32, E = 8\n"
	"  param layer = 0\n"
	"  weight router : [E, D] = \"model.layers.{layer}.block_sparse_moe.gate.weight\"\n"
	"  weight score_bias : [E] = \"model.layers.{layer}.block_sparse_moe.e_score_correction_bias\"\n"
	"  weight gate : [E, F, D] = \"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight\"\n"
	"  weight down : [E, D, F] = \"model.layers.{layer}.block_sparse_moe.experts.{e}.w2.weight\"\n"
	"  y = x\n"
	"}\n";

/* Through the importer's rewrite: MiniMax-M2's list quantizes every expert
 * projection; a bad pattern is an error naming the key, its index and the pattern. */
static void test_rewrite(void **st)
{
	(void)st;
	char msg[400], *text = strdup(layer_text);
	assert_int_equal(rewrite("{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],"
				 "\"modules_to_not_convert\":[\"gate\",\"e_score_correction_bias\",\"lm_head\"]}",
				 &text, msg, sizeof msg),
		MOE_OK);
	assert_non_null(strstr(text, "weight gate_q : f8e4m3[E, F, D] = \"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight\""));
	assert_non_null(strstr(text, "weight down_q : f8e4m3"));
	assert_non_null(strstr(text, "weight router : [E, D]"));
	free(text);

	/* w2 excluded by a pattern: down stays unquantized, gate is converted */
	text = strdup(layer_text);
	assert_int_equal(rewrite("{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],"
				 "\"modules_to_not_convert\":[\"experts\\\\.\\\\d+\\\\.w2\", \"model.layers.0.block_sparse_moe.experts.0\"]}",
				 &text, msg, sizeof msg),
		MOE_OK);
	assert_non_null(strstr(text, "weight down : [E, D, F]"));
	assert_non_null(strstr(text, "weight gate_q"));
	free(text);

	/* NVFP4 (ModelOpt and compressed-tensors) and W8A8: the declarations and the dequant */
	text = strdup(layer_text);
	assert_int_equal(rewrite("{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\",\"group_size\":16}", &text,
				 msg, sizeof msg),
		MOE_OK);
	assert_non_null(strstr(text, "weight gate_q : u8[E, F, D / 2] = \"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight\""));
	assert_non_null(strstr(text, "weight gate_s : f8e4m3[E, F, D / 16] = \"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight_scale\""));
	assert_non_null(strstr(text, "weight gate_g : f32[E, 1] = \"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight_scale_2\""));
	assert_non_null(strstr(text, "dequant(gate_q, gate_s, gate_g, format=\"nvfp4\", block=[1, 16], gscale=\"mul\""));
	free(text);
	text = strdup(layer_text);
	assert_int_equal(rewrite("{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
				 "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4,\"type\":\"float\","
				 "\"strategy\":\"tensor_group\",\"group_size\":16}}}}",
				 &text, msg, sizeof msg),
		MOE_OK);
	assert_non_null(strstr(text, "weight down_g : f32[E, 1] = \"model.layers.{layer}.block_sparse_moe.experts.{e}.w2.weight_global_scale\""));
	assert_non_null(strstr(text, "format=\"nvfp4\", block=[1, 16], gscale=\"div\""));
	free(text);
	text = strdup(layer_text);
	assert_int_equal(rewrite("{\"quant_method\":\"compressed-tensors\",\"format\":\"int-quantized\","
				 "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,\"type\":\"int\",\"symmetric\":true,"
				 "\"strategy\":\"channel\"},\"input_activations\":{\"num_bits\":8,\"type\":\"int\","
				 "\"symmetric\":true,\"dynamic\":true,\"strategy\":\"token\"}}}}",
				 &text, msg, sizeof msg),
		MOE_OK);
	assert_non_null(strstr(text, "weight down_q : u8[E, D, F] = \"model.layers.{layer}.block_sparse_moe.experts.{e}.w2.weight\""));
	assert_non_null(strstr(text, "weight down_s : f32[E, D, 1]"));
	assert_non_null(strstr(text, "dequant(down_q, down_s, format=\"int8\", block=[1, F], act=\"int8\""));
	free(text);

	static const struct {
		const char *qc, *want;
	} bad[] = {
		{"{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],\"modules_to_not_convert\":[\"lm_head\",\"(a\"]}",
			"quantization_config.modules_to_not_convert[1]: pattern '(a': missing ), unterminated subpattern"},
		{"{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],\"ignored_layers\":[\"x\",\"y\",\"(?=a)\"]}",
			"quantization_config.ignored_layers[2]: pattern '(?=a)': group syntax '(?=' at position 0 is not "
			"supported"},
		{"{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],\"modules_to_not_convert\":\"lm_head\"}",
			"quantization_config.modules_to_not_convert: not a list of module names"},
		{"{\"quant_method\":\"fbgemm_fp8\",\"modules_to_not_convert\":[3]}",
			"quantization_config.modules_to_not_convert[0]: not a string"},
		{"{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\",\"ignore\":[\"re:*gate\"],"
		 "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"channel\"}}}}",
			"quantization_config.ignore[0]: pattern 're:*gate': nothing to repeat at position 0"},
		/* a non-string method names the key and every method moec reads */
		{"{\"quant_method\":3}", "quantization_config: quant_method must be a string; it names the format, one "
					"of: fp8, fbgemm_fp8, compressed-tensors, mxfp4, gptq, awq"},
		{"{\"bits\":4}", "quantization_config: quant_method is missing; it names the format, one of: fp8, "
				"fbgemm_fp8, compressed-tensors, mxfp4, gptq, awq"},
		{"{\"quant_method\":\"hqq\"}", "quant_method 'hqq' is not supported (fp8, fbgemm_fp8, compressed-tensors, "
					      "mxfp4, gptq, awq, modelopt)"},
		{"{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128,\"version\":\"gemv\"}",
			"awq is read for version gemm only"},
		{"{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,\"checkpoint_format\":\"marlin\"}",
			"gptq checkpoint_format must be"},
		{"{\"quant_method\":\"gptq\",\"bits\":3,\"group_size\":128}", "gptq is read for bits 4 only"},
		{"{\"quant_method\":\"modelopt\",\"quant_algo\":\"FP8\"}", "modelopt is read for quant_algo \"NVFP4\" only"},
		{"{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\",\"group_size\":32}",
			"modelopt NVFP4 is read for group_size 16 only"},
		{"{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\",\"config_groups\":{\"g\":{"
		 "\"weights\":{\"num_bits\":4,\"type\":\"float\",\"strategy\":\"group\",\"group_size\":16}}}}",
			"nvfp4-pack-quantized is read for 4-bit float weights, strategy tensor_group, group_size 16 only"},
		{"{\"quant_method\":\"compressed-tensors\",\"format\":\"int-quantized\",\"config_groups\":{\"g\":{"
		 "\"weights\":{\"num_bits\":8,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"channel\"}}}}",
			"int-quantized is read with input_activations of 8-bit int, dynamic, symmetric, strategy token only"},
		{"{\"quant_method\":\"compressed-tensors\",\"format\":\"int-quantized\",\"config_groups\":{\"g\":{"
		 "\"weights\":{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"channel\"}}}}",
			"int-quantized is read for 8-bit int weights, symmetric, strategy channel only"},
		{"{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":0}", "gptq needs group_size"},
		/* sizes are integers: 128.9 was truncated to 128 */
		{"{\"quant_method\":\"fp8\",\"weight_block_size\":[128.9,128]}",
			"fp8 needs weight_block_size [rows, cols] of integers in 1..1048576"},
		{"{\"quant_method\":\"fp8\",\"weight_block_size\":[128,0]}",
			"fp8 needs weight_block_size [rows, cols] of integers in 1..1048576"},
		{"{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"g\":{"
		 "\"weights\":{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"group\",\"group_size\":32.5}}}}",
			"group_size must be an integer in 1..1048576"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		text = strdup(layer_text);
		assert_int_equal(rewrite(bad[i].qc, &text, msg, sizeof msg), MOE_ERR_INVALID);
		if (!strstr(msg, bad[i].want))
			fail_msg("got '%s', want '%s'", msg, bad[i].want);
		assert_string_equal(text, layer_text);
		free(text);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hf_rule),
		cmocka_unit_test(test_ct_rule),
		cmocka_unit_test(test_re_subset),
		cmocka_unit_test(test_hostile_patterns),
		cmocka_unit_test(test_budget),
		cmocka_unit_test(test_rewrite),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
