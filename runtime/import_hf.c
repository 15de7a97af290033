/* runtime/import_hf.c: HuggingFace config.json -> .moe text (moec import-hf).
 *
 * One layer per call. The generated program reproduces the family's MoE block
 * as HF computes it (moe/SEMANTICS.md sections 1-2): router math in f32 where
 * HF upcasts, the same selection score and weight formula, fused checkpoint
 * tensors rearranged to the canonical experts layout (up/gate [E, F, D], down
 * [E, D, F]) with einsum and slice, and shared experts written out. Weight
 * sources are the checkpoint's tensor names with {layer} and {e} templates.
 *
 * The text does not depend on the import dtype except for its `dtype` line:
 * every cast back to the compute type is written `cast(v, dtype)`, and f32
 * routing math is spelled `f32`, so `--set dtype=` on the generated file gives
 * the same layer as importing with that dtype. Routing weights stay f32 where
 * HF keeps them f32 (mixtral, deepseek_v3) and are cast to the compute type
 * where HF's router casts them back (qwen2_moe, qwen3_moe, olmoe, gpt_oss,
 * llama4); tests/ref/README.md records the same choices. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>

#include "runtime/rt_io.h"

typedef enum family { FAM_MIXTRAL, FAM_QWEN2, FAM_QWEN3, FAM_OLMOE, FAM_GPTOSS, FAM_DEEPSEEK, FAM_LLAMA4 } family;

static const struct {
	const char *model_type;
	family fam;
	const char *block; /* HF module class */
} families[] = {
	{"mixtral", FAM_MIXTRAL, "MixtralSparseMoeBlock"},
	{"qwen2_moe", FAM_QWEN2, "Qwen2MoeSparseMoeBlock"},
	{"qwen3_moe", FAM_QWEN3, "Qwen3MoeSparseMoeBlock"},
	{"olmoe", FAM_OLMOE, "OlmoeSparseMoeBlock"},
	{"gpt_oss", FAM_GPTOSS, "GptOssMLP"},
	{"deepseek_v3", FAM_DEEPSEEK, "DeepseekV3MoE"},
	{"llama4", FAM_LLAMA4, "Llama4TextMoe"},
	{"llama4_text", FAM_LLAMA4, "Llama4TextMoe"},
};
#define NFAMILIES (sizeof families / sizeof *families)

typedef struct cfg {
	moe_ctx *ctx;
	const char *file;
	const cJSON *obj;
	bool bad;
} cfg;

static void cerr(cfg *c, const char *fmt, ...) MOE_PRINTF(2, 3);
static void cerr(cfg *c, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	rt_err_at(c->ctx, c->file, -1, "%s", msg);
	c->bad = true;
}

/* A key present with a non-null value. */
static const cJSON *item(const cfg *c, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->obj, key);
	return v && !cJSON_IsNull(v) ? v : NULL;
}

/* The first present alias, as an integer in [lo, hi]; the aliases present must agree. */
static int64_t get_int(cfg *c, const char *const *keys, bool required, int64_t def, int64_t lo, int64_t hi)
{
	const char *found = NULL;
	int64_t val = def;
	for (const char *const *k = keys; *k; k++) {
		const cJSON *v = item(c, *k);
		if (!v)
			continue;
		double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
		if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) {
			cerr(c, "config key '%s' must be an integer in %lld..%lld", *k, (long long)lo, (long long)hi);
			return def;
		}
		if (found && (int64_t)d != val) {
			cerr(c, "config keys '%s' (%lld) and '%s' (%lld) disagree", found, (long long)val, *k, (long long)d);
			return def;
		}
		found = *k;
		val = (int64_t)d;
	}
	if (!found && required) {
		char list[256] = "";
		size_t at = 0;
		for (const char *const *k = keys; *k && at < sizeof list; k++)
			at += (size_t)snprintf(list + at, sizeof list - at, "%s'%s'", k == keys ? "" : " / ", *k);
		cerr(c, "config lacks %s", list);
	}
	return val;
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define INT_MAX_DIM ((int64_t)INT32_MAX)

static double get_num(cfg *c, const char *key, double def)
{
	const cJSON *v = item(c, key);
	if (!v)
		return def;
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
		cerr(c, "config key '%s' must be a number", key);
		return def;
	}
	return v->valuedouble;
}

static bool get_bool(cfg *c, const char *key, bool def)
{
	const cJSON *v = item(c, key);
	if (!v)
		return def;
	if (!cJSON_IsBool(v)) {
		cerr(c, "config key '%s' must be true or false", key);
		return def;
	}
	return cJSON_IsTrue(v);
}

static const char *get_str(cfg *c, const char *key, const char *def)
{
	const cJSON *v = item(c, key);
	if (!v)
		return def;
	if (!cJSON_IsString(v)) {
		cerr(c, "config key '%s' must be a string", key);
		return def;
	}
	return v->valuestring;
}

/* 1 if the integer list `key` contains value, 0 if not, -1 if absent. */
static int list_has(cfg *c, const char *key, int64_t value)
{
	const cJSON *v = item(c, key);
	if (!v)
		return -1;
	if (!cJSON_IsArray(v)) {
		cerr(c, "config key '%s' must be a list of layer indices", key);
		return -1;
	}
	for (const cJSON *e = v->child; e; e = e->next) {
		if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble)) {
			cerr(c, "config key '%s' must be a list of layer indices", key);
			return -1;
		}
		if (e->valuedouble == (double)value) /* no cast: the entry may exceed int64 */
			return 1;
	}
	return 0;
}

/* ---- the model ---- */

typedef struct model {
	family fam;
	const char *model_type, *block;
	bool nested;
	int64_t L, T, D, E, K, F, B, S; /* S: shared expert width, 0 = none */
	int64_t n_group, topk_group;
	bool norm;
	double scale, limit;
	const char *act, *act_fn; /* experts act attr; the library function for shared experts */
	moe_dtype dt;
} model;

static bool is_moe_layer(cfg *c, model *m)
{
	int64_t L = m->L;
	int64_t nl = get_int(c, KEYS("num_hidden_layers"), false, -1, 1, INT_MAX_DIM);
	if (nl >= 0 && L >= nl) {
		cerr(c, "layer %lld does not exist: the model has num_hidden_layers = %lld", (long long)L, (long long)nl);
		return false;
	}
	switch (m->fam) {
	case FAM_QWEN2:
	case FAM_QWEN3: {
		int64_t step = get_int(c, KEYS("decoder_sparse_step"), false, 1, 1, INT_MAX_DIM);
		int in_mlp_only = list_has(c, "mlp_only_layers", L);
		if (in_mlp_only == 1) {
			cerr(c, "layer %lld is a dense MLP layer (listed in mlp_only_layers), not an MoE layer", (long long)L);
			return false;
		}
		if ((L + 1) % step != 0) {
			cerr(c, "layer %lld is a dense MLP layer: with decoder_sparse_step = %lld only layers with "
				"(layer + 1) %% %lld == 0 are MoE", (long long)L, (long long)step, (long long)step);
			return false;
		}
		break;
	}
	case FAM_DEEPSEEK: {
		int64_t k = get_int(c, KEYS("first_k_dense_replace"), false, 0, 0, INT_MAX_DIM);
		int64_t freq = get_int(c, KEYS("moe_layer_freq"), false, 1, 1, INT_MAX_DIM);
		if (L < k) {
			cerr(c, "layer %lld is a dense MLP layer: the first %lld layers are dense (first_k_dense_replace)",
				(long long)L, (long long)k);
			return false;
		}
		if (L % freq != 0) {
			cerr(c, "layer %lld is a dense MLP layer: moe_layer_freq = %lld", (long long)L, (long long)freq);
			return false;
		}
		break;
	}
	case FAM_LLAMA4: {
		int has = list_has(c, "moe_layers", L);
		if (has == 0) {
			cerr(c, "layer %lld is a dense MLP layer (intermediate_size_mlp): it is not in moe_layers", (long long)L);
			return false;
		}
		if (has < 0) {
			int64_t step = get_int(c, KEYS("interleave_moe_layer_step"), false, 1, 1, INT_MAX_DIM);
			if ((L + 1) % step != 0) {
				cerr(c, "layer %lld is a dense MLP layer: with interleave_moe_layer_step = %lld only layers with "
					"(layer + 1) %% %lld == 0 are MoE", (long long)L, (long long)step, (long long)step);
				return false;
			}
		}
		break;
	}
	default:
		break;
	}
	return !c->bad;
}

static bool read_model(cfg *c, const moe_import_opts *o, model *m)
{
	m->T = o->tokens ? o->tokens : 16;
	m->B = o->block ? o->block : 64;
	m->L = o->layer;
	m->dt = o->dtype;
	if (m->T < 1 || m->T > INT_MAX_DIM || m->B < 1 || m->B > INT_MAX_DIM || m->L < 0) {
		cerr(c, "import options: tokens and block must be 1..2^31-1 and layer >= 0");
		return false;
	}
	if (m->dt != MOE_F32 && m->dt != MOE_BF16) {
		cerr(c, "import options: dtype must be f32 or bf16, not %s", moe_dtype_name(m->dt));
		return false;
	}
	if (!is_moe_layer(c, m))
		return false;
	m->D = get_int(c, KEYS("hidden_size"), true, 0, 1, INT_MAX_DIM);
	m->E = get_int(c, KEYS("num_experts", "num_local_experts", "n_routed_experts"), true, 0, 1, INT_MAX_DIM);
	m->K = get_int(c, KEYS("num_experts_per_tok"), true, 0, 1, INT_MAX_DIM);
	bool moe_width = m->fam == FAM_QWEN2 || m->fam == FAM_QWEN3 || m->fam == FAM_DEEPSEEK;
	m->F = moe_width ? get_int(c, KEYS("moe_intermediate_size"), true, 0, 1, INT_MAX_DIM) :
			   get_int(c, KEYS("intermediate_size"), true, 0, 1, INT_MAX_DIM);
	if (c->bad)
		return false;
	if (m->K > m->E) {
		cerr(c, "num_experts_per_tok = %lld exceeds the %lld experts", (long long)m->K, (long long)m->E);
		return false;
	}
	/* HF's defaults when the key is absent */
	bool norm_default = m->fam == FAM_DEEPSEEK;
	m->norm = m->fam == FAM_MIXTRAL ? true : get_bool(c, "norm_topk_prob", norm_default);
	const char *ha = get_str(c, "hidden_act", "silu");
	if (!strcmp(ha, "silu") || !strcmp(ha, "swish")) {
		m->act = "swiglu";
		m->act_fn = "silu";
	} else if (!strcmp(ha, "gelu")) {
		m->act = "geglu";
		m->act_fn = "gelu";
	} else if (!strcmp(ha, "gelu_pytorch_tanh") || !strcmp(ha, "gelu_new") || !strcmp(ha, "gelu_fast")) {
		m->act = "geglu_tanh";
		m->act_fn = "gelu_tanh";
	} else if (m->fam != FAM_GPTOSS) {
		cerr(c, "hidden_act '%s' is not supported (silu, gelu, gelu_pytorch_tanh)", ha);
		return false;
	}
	switch (m->fam) {
	case FAM_QWEN2:
		m->S = get_int(c, KEYS("shared_expert_intermediate_size"), true, 0, 1, INT_MAX_DIM);
		break;
	case FAM_DEEPSEEK: {
		int64_t ns = get_int(c, KEYS("n_shared_experts"), false, 0, 0, INT_MAX_DIM);
		if (ns && !ir_mul_ov(ns, m->F, &m->S)) {
			cerr(c, "n_shared_experts x moe_intermediate_size overflows");
			return false;
		}
		if (m->S > INT_MAX_DIM) {
			cerr(c, "shared expert width %lld exceeds 2^31-1", (long long)m->S);
			return false;
		}
		m->n_group = get_int(c, KEYS("n_group"), false, 1, 1, INT_MAX_DIM);
		m->topk_group = get_int(c, KEYS("topk_group"), false, 1, 1, INT_MAX_DIM);
		m->scale = get_num(c, "routed_scaling_factor", 1.0);
		const char *sf = get_str(c, "scoring_func", "sigmoid");
		const char *tm = get_str(c, "topk_method", "noaux_tc");
		if (c->bad)
			return false;
		if (strcmp(sf, "sigmoid") || strcmp(tm, "noaux_tc")) {
			cerr(c, "deepseek_v3 routing with scoring_func '%s' / topk_method '%s' is not supported (sigmoid, noaux_tc)",
				sf, tm);
			return false;
		}
		if (m->E % m->n_group) {
			cerr(c, "n_routed_experts = %lld is not divisible by n_group = %lld", (long long)m->E,
				(long long)m->n_group);
			return false;
		}
		if (m->topk_group > m->n_group) {
			cerr(c, "topk_group = %lld exceeds n_group = %lld", (long long)m->topk_group, (long long)m->n_group);
			return false;
		}
		if (m->n_group > 1 && m->E / m->n_group < 2) {
			cerr(c, "group-limited routing needs at least 2 experts per group (n_routed_experts / n_group = %lld)",
				(long long)(m->E / m->n_group));
			return false;
		}
		if (m->K > m->topk_group * (m->E / m->n_group)) {
			cerr(c, "num_experts_per_tok = %lld exceeds the %lld experts of the topk_group = %lld kept groups",
				(long long)m->K, (long long)(m->topk_group * (m->E / m->n_group)), (long long)m->topk_group);
			return false;
		}
		break;
	}
	case FAM_GPTOSS:
		m->limit = get_num(c, "swiglu_limit", 7.0);
		if (!(m->limit > 0)) {
			cerr(c, "swiglu_limit must be positive");
			return false;
		}
		if (2 * m->F > INT_MAX_DIM) {
			cerr(c, "2 x intermediate_size exceeds 2^31-1");
			return false;
		}
		break;
	case FAM_LLAMA4:
		m->S = m->F; /* Llama4TextMLP of intermediate_size */
		if (2 * m->F > INT_MAX_DIM) {
			cerr(c, "2 x intermediate_size exceeds 2^31-1");
			return false;
		}
		break;
	default:
		break;
	}
	return !c->bad;
}

/* ---- emission ---- */

/* A float literal that reads back exactly and is never taken for an integer. */
static const char *flit(char *buf, size_t n, double v)
{
	snprintf(buf, n, "%.17g", v);
	for (int prec = 1; prec < 17; prec++) {
		char t[40];
		snprintf(t, sizeof t, "%.*g", prec, v);
		if (strtod(t, NULL) == v) {
			snprintf(buf, n, "%s", t);
			break;
		}
	}
	if (!strpbrk(buf, ".eEn"))
		snprintf(buf + strlen(buf), n - strlen(buf), ".0");
	return buf;
}

typedef struct out {
	rt_buf b;
	const char *pfx; /* "model.layers.{layer}." */
	const model *m;
} out;

/* dtype NULL: the layer's compute type (the weight follows --set dtype). */
static void weight(out *o, const char *name, const char *dtype, const char *dims, const char *tensor)
{
	rt_buf_printf(&o->b, "  weight %-18s : %s[%s] = \"%s%s\"\n", name, dtype ? dtype : "", dims, o->pfx, tensor);
}

static void emit_header(out *o, const char *name)
{
	const model *m = o->m;
	rt_buf_printf(&o->b,
		"# Generated by moec import-hf from %s\n"
		"# model_type %s, decoder layer %lld: HF %s.\n"
		"# The compute type follows --set dtype=f32|bf16; routing math written f32 stays f32.\n"
		"layer %s_layer%lld {\n"
		"  dim T = %lld, D = %lld, F = %lld, E = %lld, K = %lld, B = %lld\n",
		name, m->model_type, (long long)m->L, m->block, m->model_type, (long long)m->L,
		(long long)m->T, (long long)m->D, (long long)m->F, (long long)m->E, (long long)m->K, (long long)m->B);
	if (m->S)
		rt_buf_printf(&o->b, "  dim S = %lld  # shared expert width\n", (long long)m->S);
	if (m->fam == FAM_GPTOSS || m->fam == FAM_LLAMA4)
		rt_buf_printf(&o->b, "  dim F2 = 2 * F  # fused gate_up width\n");
	if (m->fam == FAM_DEEPSEEK && m->n_group > 1 && m->topk_group < m->n_group)
		rt_buf_printf(&o->b, "  dim G = %lld, EG = E / G, TG = %lld  # groups, experts per group, groups kept\n",
			(long long)m->n_group, (long long)m->topk_group);
	rt_buf_printf(&o->b, "  param layer = %lld\n  dtype %s\n\n  input x : [T, D]\n", (long long)m->L,
		moe_dtype_name(m->dt));
}

/* Shared SwiGLU (or GeGLU) expert of width S on x; defines `shared`. */
static void emit_shared(out *o)
{
	rt_buf_printf(&o->b,
		"  sh_h   = %s(einsum(\"td,sd->ts\", x, shared_gate)) * einsum(\"td,sd->ts\", x, shared_up)\n"
		"  shared = einsum(\"ts,ds->td\", sh_h, shared_down)\n",
		o->m->act_fn);
}

static void shared_weights(out *o, const char *base)
{
	char t[3][160];
	snprintf(t[0], sizeof t[0], "%sgate_proj.weight", base);
	snprintf(t[1], sizeof t[1], "%sup_proj.weight", base);
	snprintf(t[2], sizeof t[2], "%sdown_proj.weight", base);
	weight(o, "shared_gate", NULL, "S, D", t[0]);
	weight(o, "shared_up", NULL, "S, D", t[1]);
	weight(o, "shared_down", NULL, "D, S", t[2]);
}

/* Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE: softmax_f32 -> top-K (-> renormalise). */
static void emit_softmax_family(out *o)
{
	const model *m = o->m;
	bool mix = m->fam == FAM_MIXTRAL;
	const char *blk = mix ? "block_sparse_moe." : "mlp.";
	char t[4][160];
	snprintf(t[0], sizeof t[0], "%sgate.weight", blk);
	snprintf(t[1], sizeof t[1], "%sexperts.{e}.%s.weight", blk, mix ? "w1" : "gate_proj");
	snprintf(t[2], sizeof t[2], "%sexperts.{e}.%s.weight", blk, mix ? "w3" : "up_proj");
	snprintf(t[3], sizeof t[3], "%sexperts.{e}.%s.weight", blk, mix ? "w2" : "down_proj");
	weight(o, "router", NULL, "E, D", t[0]);
	weight(o, "gate", NULL, "E, F, D", t[1]);
	weight(o, "up", NULL, "E, F, D", t[2]);
	weight(o, "down", NULL, "E, D, F", t[3]);
	if (m->fam == FAM_QWEN2) {
		shared_weights(o, "mlp.shared_expert.");
		weight(o, "shared_expert_gate", NULL, "1, D", "mlp.shared_expert_gate.weight");
	}
	rt_buf_printf(&o->b,
		"\n  logits = einsum(\"td,ed->te\", x, router)      # the router Linear, in the layer dtype\n"
		"  p      = softmax(cast(logits, f32), axis=1)   # softmax over all E in f32\n"
		"  idx    = topk(p, k=K)\n"
		"  top    = take_along(p, idx, axis=1)\n");
	const char *w = "top";
	if (m->norm) {
		rt_buf_printf(&o->b, "  top_n  = top / reduce_sum(top, axis=1, keepdims=1)   # norm_topk_prob\n");
		w = "top_n";
	}
	if (mix) {
		rt_buf_printf(&o->b, "  # the routing weights stay f32, like HF's Mixtral\n");
	} else {
		/* Qwen/OLMoE routers return the weights in the logits' dtype */
		rt_buf_printf(&o->b, "  w      = cast(%s, dtype)   # back to the compute type, like HF\n", w);
		w = "w";
	}
	rt_buf_printf(&o->b, "  routed = experts(x, idx, %s, gate=gate, up=up, down=down, act=\"%s\", block=B)\n", w,
		m->act);
	if (m->fam == FAM_QWEN2) {
		emit_shared(o);
		rt_buf_printf(&o->b,
			"  sg     = sigmoid(einsum(\"td,od->to\", x, shared_expert_gate))   # [T, 1]\n"
			"  y      = routed + sg * shared\n");
	} else {
		rt_buf_printf(&o->b, "  y      = routed\n");
	}
}

/* DeepSeek-V3: sigmoid scores, bias-corrected group-limited top-K selection. */
static void emit_deepseek(out *o)
{
	const model *m = o->m;
	/* the router weight is held in the compute type and upcast (as HF does);
	 * the correction bias is an f32 buffer in HF whatever the model dtype */
	weight(o, "router", NULL, "E, D", "mlp.gate.weight");
	weight(o, "score_bias", "f32", "E", "mlp.gate.e_score_correction_bias");
	weight(o, "gate", NULL, "E, F, D", "mlp.experts.{e}.gate_proj.weight");
	weight(o, "up", NULL, "E, F, D", "mlp.experts.{e}.up_proj.weight");
	weight(o, "down", NULL, "E, D, F", "mlp.experts.{e}.down_proj.weight");
	if (m->S)
		shared_weights(o, "mlp.shared_experts.");
	rt_buf_printf(&o->b,
		"\n  logits = einsum(\"td,ed->te\", cast(x, f32), cast(router, f32))   # HF's router runs in f32\n"
		"  s      = sigmoid(logits)                 # weights come from these\n"
		"  c      = s + score_bias                  # selection uses the corrected scores\n");
	const char *sel = "c";
	if (m->n_group > 1 && m->topk_group < m->n_group) {
		rt_buf_printf(&o->b,
			"  c3     = reshape(c, shape=[T, G, EG])\n"
			"  g2     = topk(c3, k=2)                                    # two best per group\n"
			"  gscore = reduce_sum(take_along(c3, g2, axis=2), axis=2)  # [T, G]\n"
			"  gidx   = topk(gscore, k=TG)                              # groups kept\n"
			"  keep   = reshape(reduce_sum(one_hot(gidx, G), axis=1), shape=[T, G, 1]) != 0\n"
			"  # experts of the other groups are masked to -inf: every kept expert, even\n"
			"  # with a negative biased score, ranks above them (K <= TG * EG)\n"
			"  masked = reshape(select(keep, c3, -inf), shape=[T, E])\n");
		sel = "masked";
	}
	rt_buf_printf(&o->b,
		"  idx    = topk(%s, k=K)\n"
		"  sw     = take_along(s, idx, axis=1)\n", sel);
	char sc[48];
	flit(sc, sizeof sc, m->scale);
	if (m->norm)
		rt_buf_printf(&o->b, "  w      = sw / (reduce_sum(sw, axis=1, keepdims=1) + 1e-20) * %s   # f32, like HF\n",
			sc);
	else
		rt_buf_printf(&o->b, "  w      = sw * %s   # routed_scaling_factor; f32, like HF\n", sc);
	rt_buf_printf(&o->b, "  routed = experts(x, idx, w, gate=gate, up=up, down=down, act=\"%s\", block=B)\n", m->act);
	if (m->S) {
		emit_shared(o);
		rt_buf_printf(&o->b, "  y      = routed + shared\n");
	} else {
		rt_buf_printf(&o->b, "  y      = routed\n");
	}
}

/* gpt-oss: biased router, softmax over the K selected logits, fused interleaved gate_up. */
static void emit_gptoss(out *o)
{
	const model *m = o->m;
	char lim[48];
	weight(o, "router", NULL, "E, D", "mlp.router.weight");
	weight(o, "router_bias", NULL, "E", "mlp.router.bias");
	weight(o, "gate_up", NULL, "E, D, F2", "mlp.experts.gate_up_proj");
	weight(o, "gate_up_bias", NULL, "E, F2", "mlp.experts.gate_up_proj_bias");
	weight(o, "down_t", NULL, "E, F, D", "mlp.experts.down_proj");
	weight(o, "down_bias", NULL, "E, D", "mlp.experts.down_proj_bias");
	rt_buf_printf(&o->b,
		"\n  logits = einsum(\"td,ed->te\", x, router) + router_bias   # in the compute type, like HF\n"
		"  idx    = topk(logits, k=K)\n"
		"  # softmax over the K selected logits in f32, cast back to the compute type like HF\n"
		"  w      = cast(softmax(cast(take_along(logits, idx, axis=1), f32), axis=1), dtype)\n"
		"  # gate_up is [E, D, 2F] with gate and up interleaved along the last axis\n"
		"  gu     = einsum(\"edf->efd\", gate_up)\n"
		"  gate   = slice(gu, axis=1, start=0, step=2)\n"
		"  up     = slice(gu, axis=1, start=1, step=2)\n"
		"  gate_b = slice(gate_up_bias, axis=1, start=0, step=2)\n"
		"  up_b   = slice(gate_up_bias, axis=1, start=1, step=2)\n"
		"  down   = einsum(\"efd->edf\", down_t)\n"
		"  y      = experts(x, idx, w, gate=gate, up=up, down=down, gate_bias=gate_b, up_bias=up_b,\n"
		"                   down_bias=down_bias, act=\"gpt_oss\", alpha=1.702, limit=%s, block=B)\n",
		flit(lim, sizeof lim, m->limit));
}

/* Llama 4: top-K logits, sigmoid weight applied to the expert input, shared expert. */
static void emit_llama4(out *o)
{
	const model *m = o->m;
	weight(o, "router", NULL, "E, D", "feed_forward.router.weight");
	weight(o, "gate_up", NULL, "E, D, F2", "feed_forward.experts.gate_up_proj");
	weight(o, "down_t", NULL, "E, F, D", "feed_forward.experts.down_proj");
	shared_weights(o, "feed_forward.shared_expert.");
	rt_buf_printf(&o->b,
		"\n  logits = einsum(\"td,ed->te\", x, router)\n"
		"  idx    = topk(logits, k=K)\n"
		"  w      = cast(sigmoid(cast(take_along(logits, idx, axis=1), f32)), dtype)   # sigmoid in f32\n"
		"  # gate_up is [E, D, 2F]: gate = the first F columns, up = the rest\n"
		"  gu     = einsum(\"edf->efd\", gate_up)\n"
		"  gate   = slice(gu, axis=1, start=0, stop=F)\n"
		"  up     = slice(gu, axis=1, start=F, stop=F2)\n"
		"  down   = einsum(\"efd->edf\", down_t)\n"
		"  routed = experts(x, idx, w, gate=gate, up=up, down=down, act=\"%s\", weight_on=\"input\", block=B)\n",
		m->act);
	emit_shared(o);
	rt_buf_printf(&o->b, "  y      = shared + routed\n");
}

moe_status moe_import_hf_text(moe_ctx *ctx, const char *name, const char *json, size_t len,
	const moe_import_opts *opts, char **moe_text)
{
	*moe_text = NULL;
	cJSON *root = rt_json_doc(ctx, name, json, len); /* Python json's reading; reports its errors */
	cfg c = {ctx, name, root, false};
	if (!root)
		return MOE_ERR_FORMAT;
	if (!cJSON_IsObject(root)) {
		cerr(&c, "not a JSON object");
		cJSON_Delete(root);
		return MOE_ERR_FORMAT;
	}
	model m = {0};
	m.model_type = get_str(&c, "model_type", NULL);
	const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
	if (m.model_type && !strcmp(m.model_type, "llama4") && cJSON_IsObject(tc)) {
		c.obj = tc;
		m.nested = true;
	}
	int fi = -1;
	for (size_t i = 0; m.model_type && i < NFAMILIES; i++)
		if (!strcmp(m.model_type, families[i].model_type))
			fi = (int)i;
	if (fi < 0) {
		if (!c.bad)
			cerr(&c, "model_type %s%s%s is not supported; supported: mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss, "
				"deepseek_v3, llama4, llama4_text", m.model_type ? "'" : "", m.model_type ? m.model_type : "(missing)",
				m.model_type ? "'" : "");
		cJSON_Delete(root);
		return MOE_ERR_UNSUPPORTED;
	}
	m.fam = families[fi].fam;
	m.block = families[fi].block;
	moe_import_opts def = {0};
	if (!read_model(&c, opts ? opts : &def, &m)) {
		cJSON_Delete(root);
		return MOE_ERR_INVALID;
	}
	out o = {{0}, opts && opts->prefix ? opts->prefix :
			     m.nested ? "language_model.model.layers.{layer}." : "model.layers.{layer}.", &m};
	emit_header(&o, name);
	switch (m.fam) {
	case FAM_MIXTRAL:
	case FAM_QWEN2:
	case FAM_QWEN3:
	case FAM_OLMOE: emit_softmax_family(&o); break;
	case FAM_DEEPSEEK: emit_deepseek(&o); break;
	case FAM_GPTOSS: emit_gptoss(&o); break;
	case FAM_LLAMA4: emit_llama4(&o); break;
	}
	rt_buf_printf(&o.b, "  output y\n}\n");
	cJSON_Delete(root);
	if (o.b.oom) {
		rt_buf_free(&o.b);
		rt_err_at(ctx, name, -1, "out of memory");
		return MOE_ERR_NOMEM;
	}
	*moe_text = o.b.s;
	return MOE_OK;
}

moe_status moe_import_hf(moe_ctx *ctx, const char *config_path, const moe_import_opts *opts, char **moe_text)
{
	*moe_text = NULL;
	char *text;
	size_t len;
	moe_status s = moe_read_file(ctx, config_path, &text, &len);
	if (s)
		return s;
	s = moe_import_hf_text(ctx, config_path, text, len, opts, moe_text);
	free(text);
	return s;
}
