/* frontend/hf/import_hf.c: HuggingFace config.json -> .moe text (moec import-hf).
 *
 * One layer per call. The family row (families.c) says which keys to read and
 * which recipe parts the block is made of; this file reads the config into a
 * `model` and writes the parts out as .moe (moe/SEMANTICS.md sections 1-2):
 * router math in f32 where HF upcasts, the same selection score and weight
 * formula, fused checkpoint tensors rearranged to the canonical experts
 * layout (up/gate [E, F, D], down [E, D, F]) with einsum, slice and reshape,
 * and shared experts written out.
 *
 * The text does not depend on the import dtype except for its `dtype` line:
 * every cast back to the compute type is written `cast(v, dtype)`, and f32
 * routing math is spelled `f32`, so `--set dtype=` on the generated file gives
 * the same layer as importing with that dtype. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "frontend/hf/hf_cfg.h"
#include "runtime/rt_io.h"
#include "runtime/rt_quant.h"

typedef struct model {
	const hf_family *f;
	const char *model_type;
	bool nested;
	int64_t L, T, D, E, K, F, B, S; /* S: shared expert width, 0 = none */
	int64_t n_group, topk_group;
	int64_t R;                /* an MLP router's state width (HF_MLP) */
	double router_eps, post_eps; /* the RMSNorm epsilons of an MLP router and of an output norm */
	int score, group;
	bool norm, average;
	double eps, scale, limit, jitter;
	const char *act, *act_fn; /* experts act attr; the library function for shared experts */
	moe_dtype dt;
} model;

#define DEF(v, d) ((v) ? (v) : (d))

/* ---- reading ---- */

/* The first MoE layer (of nl, -1 unknown), said in a note; false after an error. */
static bool first_moe(hf_cfg *c, model *m, int64_t nl)
{
	char why[256], kind[64], first_why[256] = "", first_kind[64] = "";
	int64_t lim = nl >= 0 ? nl : 4096;
	for (int64_t L = 0; L < lim; L++) {
		int k = hf_layer_kind(c, m->f, L, nl, true, why, sizeof why, kind, sizeof kind);
		if (k == 1) {
			m->L = c->layer = L;
			if (L == 0)
				moe_diag(c->ctx, MOE_DIAG_NOTE, moe_loc_file(c->ctx, c->file),
					"no layer asked for: importing layer 0, the config's first MoE layer");
			else
				moe_diag(c->ctx, MOE_DIAG_NOTE, moe_loc_file(c->ctx, c->file),
					"no layer asked for: importing layer %lld, the config's first MoE layer (layer 0 is %s: %s)",
					(long long)L, first_kind, first_why);
			return true;
		}
		if (k < 0) /* the config error itself, said at layer L */
			return hf_layer_kind(c, m->f, L, nl, false, why, sizeof why, kind, sizeof kind), false;
		if (L == 0) {
			snprintf(first_why, sizeof first_why, "%s", why);
			snprintf(first_kind, sizeof first_kind, "%s", kind);
		}
	}
	hf_err(c, "the config has no MoE layer in layers 0..%lld (layer 0 is %s: %s)", (long long)lim - 1, first_kind,
		first_why);
	return false;
}

static bool check_layer(hf_cfg *c, model *m, bool first)
{
	const hf_family *f = m->f;
	int64_t nl = hf_int(c, DEF(f->k_layers, "num_hidden_layers"), false, -1, 1, HF_MAX_DIM);
	if (c->bad)
		return false;
	if (first)
		return first_moe(c, m, nl) && !c->bad;
	if (nl >= 0 && m->L >= nl) {
		hf_err(c, "layer %lld does not exist: the model has %lld layers", (long long)m->L, (long long)nl);
		return false;
	}
	char why[256] = "", tmp[256], kind[64];
	int k = hf_layer_kind(c, f, m->L, nl, false, why, sizeof why, kind, sizeof kind);
	if (k != 0)
		return k == 1 && !c->bad;
	/* the nearest MoE layer, searching both ways (the lower one first on a tie) */
	int64_t lim = nl >= 0 ? nl : m->L + 4096, near = -1;
	for (int64_t d = 1; near < 0 && (m->L - d >= 0 || m->L + d < lim); d++) {
		if (m->L - d >= 0 && hf_layer_kind(c, f, m->L - d, nl, true, tmp, sizeof tmp, NULL, 0) == 1)
			near = m->L - d;
		else if (m->L + d < lim && hf_layer_kind(c, f, m->L + d, nl, true, tmp, sizeof tmp, NULL, 0) == 1)
			near = m->L + d;
	}
	if (near >= 0)
		hf_err(c, "layer %lld is %s, not an MoE layer (%s); the nearest MoE layer is %lld "
			"(--layer %lld)", (long long)m->L, kind, why, (long long)near, (long long)near);
	else
		hf_err(c, "layer %lld is %s, not an MoE layer (%s); the config has no MoE layer",
			(long long)m->L, kind, why);
	return false;
}

static bool read_act(hf_cfg *c, model *m)
{
	const hf_family *f = m->f;
	if (f->f->act && strcmp(f->f->act, "relu2")) {
		m->act = f->f->act;
		return true;
	}
	const char *ha = hf_str(c, DEF(f->k_act, "hidden_act"), DEF(f->act_default, "silu"));
	static const struct {
		const char *hf, *act, *fn;
	} acts[] = {
		{"silu", "swiglu", "silu"},
		{"swish", "swiglu", "silu"},
		{"gelu", "geglu", "gelu"},
		{"gelu_pytorch_tanh", "geglu_tanh", "gelu_tanh"},
		{"gelu_new", "geglu_tanh", "gelu_tanh"},
		{"gelu_fast", "geglu_tanh", "gelu_tanh"},
		{"relu2", "relu2", "relu2"},
	};
	for (size_t i = 0; i < sizeof acts / sizeof *acts; i++)
		if (!strcmp(ha, acts[i].hf)) {
			bool ungated = f->f->layout == HF_UP;
			if (ungated != !strcmp(acts[i].act, "relu2"))
				break;
			m->act = acts[i].act;
			m->act_fn = acts[i].fn;
			return true;
		}
	if (!c->bad)
		hf_err(c, "%s '%s' is not supported for %s (%s)", DEF(f->k_act, "hidden_act"), ha, m->model_type,
			f->f->layout == HF_UP ? "relu2" : "silu, gelu, gelu_pytorch_tanh");
	return false;
}

static bool read_routing(hf_cfg *c, model *m)
{
	const hf_family *f = m->f;
	const hf_route *r = f->r;
	m->score = r->score;
	if (f->k_score) {
		const char *s = hf_str(c, f->k_score, NULL);
		if (s && !strcmp(s, "softmax"))
			m->score = HF_SOFTMAX;
		else if (s && !strcmp(s, "sigmoid"))
			m->score = HF_SIGMOID;
		else if (s) {
			hf_err(c, "%s '%s' is not supported (softmax, sigmoid)", f->k_score, s);
			return false;
		}
	}
	m->group = r->group;
	const char *tm = m->group ? hf_str(c, "topk_method", NULL) : NULL;
	if (tm && !strcmp(tm, "greedy"))
		m->group = HF_G_NONE;
	else if (tm && !strcmp(tm, "group_limited_greedy"))
		m->group = HF_G_MAX;
	else if (tm && !strcmp(tm, "noaux_tc"))
		m->group = HF_G_TOP2SUM;
	else if (tm) {
		hf_err(c, "topk_method '%s' is not supported (greedy, group_limited_greedy, noaux_tc)", tm);
		return false;
	}
	if (r->norm == HF_N_KEY) {
		const char *nk = DEF(f->k_norm, "norm_topk_prob");
		const cJSON *v = hf_item(c, nk, NULL, 0);
		if (cJSON_IsNumber(v)) { /* DBRX: the p of a p-norm; 1 = the sum */
			if (v->valuedouble != 1.0) {
				hf_err(c, "%s = %g is not supported (1)", nk, v->valuedouble);
				return false;
			}
			m->norm = true;
		} else {
			m->norm = hf_bool(c, nk, f->norm_default);
		}
	} else {
		m->norm = r->norm == HF_N_ALWAYS;
	}
	m->eps = f->k_eps ? hf_num(c, f->k_eps, r->eps) : r->eps;
	m->scale = r->scale && f->k_scale ? hf_num(c, f->k_scale, 1.0) : 1.0;
	m->jitter = f->k_jitter ? hf_num(c, f->k_jitter, 0.01) : 0;
	if (m->score == HF_SPARSEMIXER && m->K != 2) {
		hf_err(c, "sparsemixer routing selects 2 experts; the config has num_experts_per_tok = %lld", (long long)m->K);
		return false;
	}
	if (!m->group)
		return !c->bad;
	m->n_group = hf_int(c, DEF(f->k_group, "n_group"), false, 1, 1, HF_MAX_DIM);
	m->topk_group = hf_int(c, DEF(f->k_topk_group, "topk_group"), false, 1, 1, HF_MAX_DIM);
	if (c->bad)
		return false;
	if (m->E % m->n_group) {
		hf_err(c, "%lld experts are not divisible into n_group = %lld groups", (long long)m->E, (long long)m->n_group);
		return false;
	}
	if (m->topk_group > m->n_group) {
		hf_err(c, "topk_group = %lld exceeds n_group = %lld", (long long)m->topk_group, (long long)m->n_group);
		return false;
	}
	if (m->group == HF_G_TOP2SUM && m->n_group > 1 && m->E / m->n_group < 2) {
		hf_err(c, "group-limited routing needs at least 2 experts per group (experts / n_group = %lld)",
			(long long)(m->E / m->n_group));
		return false;
	}
	if (m->K > m->topk_group * (m->E / m->n_group)) {
		hf_err(c, "num_experts_per_tok = %lld exceeds the %lld experts of the topk_group = %lld kept groups",
			(long long)m->K, (long long)(m->topk_group * (m->E / m->n_group)), (long long)m->topk_group);
		return false;
	}
	if (m->n_group == 1 || m->topk_group == m->n_group)
		m->group = HF_G_NONE; /* every group is kept */
	return true;
}

static bool read_shared(hf_cfg *c, model *m)
{
	const hf_family *f = m->f;
	if (f->s->kind == HF_SH_NONE)
		return true;
	if (f->k_shared_width) {
		m->S = hf_int(c, f->k_shared_width, false, 0, 0, HF_MAX_DIM);
	} else {
		int64_t base = m->F, n = 1;
		if (f->k_shared_base)
			base = hf_int(c, f->k_shared_base, true, 0, 1, HF_MAX_DIM);
		if (f->k_shared_count)
			n = hf_int(c, f->k_shared_count, false, 0, 0, HF_MAX_DIM);
		if (c->bad)
			return false;
		if (!ir_mul_ov(n, base, &m->S) || m->S > HF_MAX_DIM) {
			hf_err(c, "the shared expert width %s x %lld exceeds 2^31-1", f->k_shared_count, (long long)base);
			return false;
		}
	}
	if (f->s->kind == HF_SH_FUSED && 2 * m->S > HF_MAX_DIM) {
		hf_err(c, "2 x the shared expert width exceeds 2^31-1");
		return false;
	}
	const char *comb = hf_str(c, "shared_expert_combination_strategy", "sum");
	m->average = !strcmp(comb, "average");
	if (!m->average && strcmp(comb, "sum")) {
		hf_err(c, "shared_expert_combination_strategy '%s' is not supported (sum, average)", comb);
		return false;
	}
	return !c->bad;
}

static bool read_model(hf_cfg *c, const moe_import_opts *o, model *m)
{
	const hf_family *f = m->f;
	m->T = o->tokens ? o->tokens : 16;
	m->B = o->block ? o->block : 64;
	m->L = o->layer;
	c->layer = m->L;
	if (m->T < 1 || m->T > HF_MAX_DIM || m->B < 1 || m->B > HF_MAX_DIM || m->L < 0) {
		hf_err(c, "import options: tokens and block must be 1..2^31-1 and layer >= 0");
		return false;
	}
	if (!check_layer(c, m, o->first_moe_layer))
		return false;
	m->D = hf_int(c, DEF(f->k_hidden, "hidden_size"), true, 0, 1, HF_MAX_DIM);
	m->E = hf_int(c, DEF(f->k_experts, "num_experts|num_local_experts|n_routed_experts"), true, 0, 1, HF_MAX_DIM);
	m->K = hf_int(c, DEF(f->k_topk, "num_experts_per_tok"), true, 0, 1, HF_MAX_DIM);
	m->F = hf_int(c, DEF(f->k_width, "moe_intermediate_size"), true, 0, 1, HF_MAX_DIM);
	if (c->bad)
		return false;
	if (m->K > m->E) {
		hf_err(c, "num_experts_per_tok = %lld exceeds the %lld experts", (long long)m->K, (long long)m->E);
		return false;
	}
	int64_t ef;
	if (2 * m->F > HF_MAX_DIM || (f->f->layout == HF_DBRX && (!ir_mul_ov(m->E, m->F, &ef) || ef > HF_MAX_DIM))) {
		hf_err(c, "the fused expert width exceeds 2^31-1");
		return false;
	}
	if (!read_act(c, m) || !read_routing(c, m) || !read_shared(c, m))
		return false;
	if (f->post_norm)
		m->post_eps = hf_num(c, DEF(f->k_post_eps, "rms_norm_eps"), 1e-6);
	if (f->r->score == HF_MLP) {
		m->R = hf_int(c, f->r->mlp->k_width, true, 0, 1, HF_MAX_DIM);
		m->router_eps = hf_num(c, f->r->mlp->k_eps, 1e-5);
		if (c->bad)
			return false;
		if (m->E + 1 > HF_MAX_DIM) {
			hf_err(c, "the router's %lld experts + 1 skip class exceed 2^31-1", (long long)m->E);
			return false;
		}
	}
	if ((f->post_norm && !(m->post_eps >= 0)) || (f->r->score == HF_MLP && !(m->router_eps >= 0))) {
		hf_err(c, "config key 'rms_norm_eps' must not be negative");
		return false;
	}
	if (f->k_limit) {
		m->limit = hf_num(c, f->k_limit, 7.0);
		if (!(m->limit > 0)) {
			hf_err(c, "%s must be positive", f->k_limit);
			return false;
		}
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

#define P(...) rt_buf_printf(&o->b, __VA_ARGS__)

/* dtype NULL: the layer's compute type (the weight follows --set dtype). */
static void weight(out *o, const char *name, const char *dtype, const char *dims, const char *tensor)
{
	const char *blk = DEF(o->m->f->blk, "mlp.");
	if (*tensor == '~')
		tensor++, blk = "";
	P("  weight %-18s : %s[%s] = \"", name, dtype ? dtype : "", dims);
	for (const char *c = o->pfx; *c; c++) /* control bytes were refused (import_text) */
		P(*c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
	P("%s%s\"\n", blk, tensor);
}

/* Text from an input (the config's path) in a # comment: a control byte as \xHH,
 * so that it cannot end the comment and start a line of the layer. */
static void comment_text(out *o, const char *s)
{
	for (const unsigned char *c = (const unsigned char *)s; *c; c++)
		P(*c < 0x20 || *c == 0x7f ? "\\x%02x" : "%c", *c);
}

static void emit_header(out *o, const char *name)
{
	const model *m = o->m;
	const hf_family *f = m->f;
	P("# Generated by moec import-hf from ");
	comment_text(o, name);
	P("\n# model_type %s, decoder layer %lld: HF %s.\n"
	  "# The compute type follows --set dtype=f32|bf16; routing math written f32 stays f32.\n"
	  "layer %s_layer%lld {\n"
	  "  dim T = %lld, D = %lld, F = %lld, E = %lld, K = %lld, B = %lld\n",
		m->model_type, (long long)m->L, f->block, m->model_type, (long long)m->L, (long long)m->T,
		(long long)m->D, (long long)m->F, (long long)m->E, (long long)m->K, (long long)m->B);
	if (m->S)
		P("  dim S = %lld  # shared expert width\n", (long long)m->S);
	if (m->S && f->s->kind == HF_SH_FUSED)
		P("  dim S2 = 2 * S  # fused shared gate_up width\n");
	if (f->f->layout == HF_GU || f->f->layout == HF_GU_T || f->f->layout == HF_GU_T_IL)
		P("  dim F2 = 2 * F  # fused gate_up width\n");
	if (f->f->layout == HF_DBRX)
		P("  dim EF = E * F  # experts stacked in one matrix\n");
	if (m->group)
		P("  dim G = %lld, EG = E / G, TG = %lld  # groups, experts per group, groups kept\n", (long long)m->n_group,
			(long long)m->topk_group);
	if (f->r->score == HF_MLP)
		P("  dim R = %lld, E1 = E + 1  # router state width; router classes, the last the skip class\n",
			(long long)m->R);
	P("  param layer = %lld\n  dtype %s\n\n  input x : [T, D]\n", (long long)m->L, moe_dtype_name(m->dt));
	if (f->r->score == HF_MLP && m->L > 0)
		P("  input router_state : [T, R]   # the router state layer %lld's block outputs\n", (long long)m->L - 1);
}

static void emit_weights(out *o)
{
	const model *m = o->m;
	const hf_family *f = m->f;
	const hf_ffn *fp = f->f;
	const hf_mlp_router *mr = f->r->mlp;
	if (f->r->score == HF_MLP) {
		weight(o, "rdown", NULL, "R, D", mr->down);
		weight(o, "rdown_b", NULL, "R", mr->down_bias);
		if (m->L > 0) /* HF's first layer has no carried state */
			weight(o, "rscale", NULL, "R", mr->state_scale);
		weight(o, "rnorm", NULL, "R", mr->norm);
		weight(o, "fc1", NULL, "R, R", mr->fc1);
		weight(o, "fc1_b", NULL, "R", mr->fc1_bias);
		weight(o, "fc2", NULL, "R, R", mr->fc2);
		weight(o, "fc2_b", NULL, "R", mr->fc2_bias);
		weight(o, "rout", NULL, "E1, R", mr->out);
		weight(o, "balance", "f32", "E1", mr->balance); /* an f32 buffer in HF */
	} else {
		weight(o, "router", f->r->f32_weight ? "f32" : NULL, "E, D", DEF(f->router, "gate.weight"));
	}
	if (f->r->router_bias)
		weight(o, "router_bias", NULL, "E", DEF(f->router_bias, "gate.bias"));
	if (f->r->sel_bias) /* an f32 buffer in HF unless the family lets it follow the model dtype */
		weight(o, "score_bias", f->r->sel_bias_dt ? NULL : "f32", DEF(f->sel_bias_dims, "E"),
			DEF(f->sel_bias, "gate.e_score_correction_bias"));
	switch (fp->layout) {
	case HF_SPLIT:
		weight(o, "gate", NULL, "E, F, D", fp->gate);
		weight(o, "up", NULL, "E, F, D", fp->up);
		weight(o, "down", NULL, "E, D, F", fp->down);
		break;
	case HF_GU:
		weight(o, "gate_up", NULL, "E, F2, D", fp->gate);
		weight(o, "down", NULL, "E, D, F", fp->down);
		break;
	case HF_GU_T:
	case HF_GU_T_IL:
		weight(o, "gate_up", NULL, "E, D, F2", fp->gate);
		if (fp->gate_up_bias)
			weight(o, "gate_up_bias", NULL, "E, F2", fp->gate_up_bias);
		weight(o, "down_t", NULL, "E, F, D", fp->down);
		if (fp->down_bias)
			weight(o, "down_bias", NULL, "E, D", fp->down_bias);
		break;
	case HF_UP:
		weight(o, "up", NULL, "E, F, D", fp->up);
		weight(o, "down", NULL, "E, D, F", fp->down);
		break;
	case HF_DBRX:
		weight(o, "w1", NULL, "EF, D", fp->gate);
		weight(o, "v1", NULL, "EF, D", fp->up);
		weight(o, "w2", NULL, "EF, D", fp->down);
		break;
	}
	if (fp->out_bias)
		weight(o, "out_bias", NULL, "D", fp->out_bias);
	const hf_shared *s = f->s;
	if (!m->S)
		return;
	if (s->kind == HF_SH_FUSED) {
		weight(o, "shared_in", NULL, "S2, D", s->gate);
	} else {
		if (s->kind == HF_SH_SPLIT)
			weight(o, "shared_gate", NULL, "S, D", s->gate);
		weight(o, "shared_up", NULL, "S, D", s->up);
	}
	weight(o, "shared_down", NULL, "D, S", s->down);
	if (s->sgate)
		weight(o, "shared_expert_gate", NULL, "1, D", s->sgate);
}

static void emit_post_norm_weight(out *o)
{
	if (o->m->f->post_norm)
		weight(o, "post_norm", NULL, "D", o->m->f->post_norm);
}

static const char *score_fn(int score)
{
	return score == HF_SIGMOID ? "sigmoid" : "softmax";
}

/* Selection on the scores of all E experts: defines idx and sw (the weights before renormalisation). */
static void emit_select_all(out *o)
{
	const model *m = o->m;
	const hf_route *r = m->f->r;
	if (m->score == HF_SOFTMAX && r->score_dt)
		P("  s      = softmax(logits, axis=1)   # over all E in the layer dtype, like HF: a bf16 layer "
		  "selects on bf16 scores\n");
	else if (m->score == HF_SOFTMAX)
		P("  s      = softmax(cast(logits, f32), axis=1)   # over all E in f32\n");
	else
		P("  s      = sigmoid(cast(logits, f32))\n");
	const char *sel = "s";
	if (r->sel_bias) {
		P("  c      = s + %s   # the correction bias steers selection only\n",
			r->sel_bias_dt ? "cast(score_bias, f32)" : "score_bias");
		sel = "c";
	}
	if (m->group) {
		P("  c3     = reshape(%s, shape=[T, G, EG])\n", sel);
		if (m->group == HF_G_TOP2SUM)
			P("  g2     = topk(c3, k=2)                                    # two best per group\n"
			  "  gscore = reduce_sum(take_along(c3, g2, axis=2), axis=2)  # [T, G]\n");
		else
			P("  gscore = reduce_max(c3, axis=2)                           # a group's best, [T, G]\n");
		P("  gidx   = topk(gscore, k=TG)                              # groups kept\n"
		  "  keep   = reshape(reduce_sum(one_hot(gidx, G), axis=1), shape=[T, G, 1]) != 0\n"
		  "  # experts of the other groups are masked to -inf: every kept expert ranks above them\n"
		  "  masked = reshape(select(keep, c3, -inf), shape=[T, E])\n");
		sel = "masked";
	}
	P("  idx    = topk(%s, k=K)\n  sw     = take_along(s, idx, axis=1)\n", sel);
}

/* PhiMoE's sparsemixer (eval): two rounds, each the argmax of the remaining logits and a softmax
 * over the logits within a relative threshold of it; all in the compute type, like HF. */
static void emit_sparsemixer(out *o)
{
	char e2[48];
	flit(e2, sizeof e2, 2 * o->m->jitter);
	P("  mx1    = reduce_max(logits, axis=1, keepdims=1)\n"
	  "  i1     = topk(logits, k=1)                          # the argmax\n"
	  "  m1     = (mx1 - logits) / max(abs(logits), mx1) > %s   # 2 x router_jitter_noise\n"
	  "  w1     = take_along(softmax(select(m1, -inf, logits), axis=1), i1, axis=1)\n"
	  "  first  = reshape(one_hot(i1, E), shape=[T, E]) != 0\n"
	  "  rest   = select(first, -inf, logits)                # the first expert masked out\n"
	  "  mx2    = reduce_max(rest, axis=1, keepdims=1)\n"
	  "  i2     = topk(rest, k=1)\n"
	  "  m2     = (mx2 - logits) / max(abs(logits), mx2) > %s\n"
	  "  w2     = take_along(softmax(select(m2, -inf, rest), axis=1), i2, axis=1)\n"
	  "  idx    = concat(i1, i2, axis=1)\n"
	  "  w      = concat(w1, w2, axis=1)\n", e2, e2);
}

/* RMSNorm of v [T, N] over its last axis as HF computes it: in f32, rounded back to the
 * layer dtype, then times the weight. */
static void emit_rmsnorm(out *o, const char *dst, const char *v, const char *n, double eps, const char *wt)
{
	char num[48];
	P("  %s_f = cast(%s, f32)\n"
	  "  %s_r = rsqrt(reduce_sum(%s_f * %s_f, axis=1, keepdims=1) / %s + %s)   # RMSNorm in f32, like HF\n"
	  "  %s = cast(%s_f * %s_r, dtype) * %s\n",
		v, v, v, v, v, n, flit(num, sizeof num, eps), dst, v, v, wt);
}

/* The MLP router (hf_mlp_router): defines rstate (the state passed on), idx (the top-K classes),
 * eidx and w (the experts' indices and weights, a skip pick as expert 0 with weight 0). */
static void emit_mlp_router(out *o)
{
	const model *m = o->m;
	P("\n  # the router's Linears (with a bias) round once to the layer dtype, like HF's fused addmm\n"
	  "  rh     = cast(einsum(\"td,rd->tr\", cast(x, f32), cast(rdown, f32)) + cast(rdown_b, f32), dtype)\n");
	if (m->L > 0)
		P("  rstate = rh + router_state * rscale   # plus the state carried from the layer before\n");
	else
		P("  rstate = rh   # the first layer has no carried state\n");
	emit_rmsnorm(o, "rn", "rstate", "R", m->router_eps, "rnorm");
	P("  # two GELU (erf) layers, each computed in f32 from the rounded Linear and rounded again, like HF\n"
	  "  h1     = cast(einsum(\"tr,sr->ts\", cast(rn, f32), cast(fc1, f32)) + cast(fc1_b, f32), dtype)\n"
	  "  a1     = cast(gelu(cast(h1, f32)), dtype)\n"
	  "  h2     = cast(einsum(\"tr,sr->ts\", cast(a1, f32), cast(fc2, f32)) + cast(fc2_b, f32), dtype)\n"
	  "  a2     = cast(gelu(cast(h2, f32)), dtype)\n"
	  "  logits = einsum(\"tr,cr->tc\", a2, rout)   # [T, E1]\n"
	  "  p      = cast(softmax(cast(logits, f32), axis=1), dtype)   # over E + 1 classes, in the layer dtype\n"
	  "  c      = cast(p, f32) + balance   # the balancing biases steer selection only\n"
	  "  idx    = topk(c, k=K)\n"
	  "  sw     = take_along(p, idx, axis=1)\n"
	  "  skip   = idx == E   # the skip class computes nothing: weight 0, expert 0 in its place\n"
	  "  w      = select(skip, 0.0, sw)\n"
	  "  eidx   = select(skip, 0, idx)\n");
}

static void emit_routing(out *o)
{
	const model *m = o->m;
	const hf_route *r = m->f->r;
	char num[48];
	if (m->score == HF_MLP) {
		emit_mlp_router(o);
		return;
	}
	if (r->f32)
		P("\n  logits = einsum(\"td,ed->te\", cast(x, f32), cast(router, f32))   # HF's router runs in f32\n");
	else
		P("\n  logits = einsum(\"td,ed->te\", x, router)%s   # the router Linear, in the layer dtype\n",
			r->router_bias ? " + router_bias" : "");
	if (m->score == HF_SPARSEMIXER) {
		emit_sparsemixer(o);
		return;
	}
	if (r->after) {
		P("  idx    = topk(logits, k=K)\n"
		  "  sw     = %s(cast(take_along(logits, idx, axis=1), f32)%s)   # over the K selected, in f32\n",
			score_fn(m->score), m->score == HF_SOFTMAX ? ", axis=1" : "");
	} else {
		emit_select_all(o);
	}
	const char *w = "sw";
	if (m->norm) {
		if (r->eps_clamp)
			P("  sw_n   = sw / max(reduce_sum(sw, axis=1, keepdims=1), %s)   # renormalised\n",
				flit(num, sizeof num, m->eps));
		else if (m->eps > 0)
			P("  sw_n   = sw / (reduce_sum(sw, axis=1, keepdims=1) + %s)   # renormalised\n",
				flit(num, sizeof num, m->eps));
		else
			P("  sw_n   = sw / reduce_sum(sw, axis=1, keepdims=1)   # renormalised\n");
		w = "sw_n";
	}
	if (r->scale && m->scale != 1.0) {
		P("  sw_s   = %s * %s   # scaling factor\n", w, flit(num, sizeof num, m->scale));
		w = "sw_s";
	}
	if (r->keep_f32)
		P("  w      = %s   # the routing weights stay f32, like HF\n", w);
	else
		P("  w      = cast(%s, dtype)   # back to the compute type, like HF\n", w);
}

static void emit_experts(out *o)
{
	const model *m = o->m;
	const hf_ffn *fp = m->f->f;
	const char *ops = "gate=gate, up=up, down=down";
	switch (fp->layout) {
	case HF_GU:
		P("  # gate_up is [E, 2F, D]: gate = the first F rows, up = the rest\n"
		  "  gate   = slice(gate_up, axis=1, start=0, stop=F)\n"
		  "  up     = slice(gate_up, axis=1, start=F, stop=F2)\n");
		break;
	case HF_GU_T:
		P("  # gate_up is [E, D, 2F]: gate = the first F columns, up = the rest\n"
		  "  gu     = einsum(\"edf->efd\", gate_up)\n"
		  "  gate   = slice(gu, axis=1, start=0, stop=F)\n"
		  "  up     = slice(gu, axis=1, start=F, stop=F2)\n"
		  "  down   = einsum(\"efd->edf\", down_t)\n");
		break;
	case HF_GU_T_IL:
		P("  # gate_up is [E, D, 2F] with gate and up interleaved along the last axis\n"
		  "  gu     = einsum(\"edf->efd\", gate_up)\n"
		  "  gate   = slice(gu, axis=1, start=0, step=2)\n"
		  "  up     = slice(gu, axis=1, start=1, step=2)\n"
		  "  gate_b = slice(gate_up_bias, axis=1, start=0, step=2)\n"
		  "  up_b   = slice(gate_up_bias, axis=1, start=1, step=2)\n"
		  "  down   = einsum(\"efd->edf\", down_t)\n");
		ops = "gate=gate, up=up, down=down, gate_bias=gate_b, up_bias=up_b, down_bias=down_bias";
		break;
	case HF_UP:
		ops = "up=up, down=down";
		break;
	case HF_DBRX:
		P("  # w1, v1, w2 stack the experts' [F, D] matrices; down is w2's transpose\n"
		  "  gate   = reshape(w1, shape=[E, F, D])\n"
		  "  up     = reshape(v1, shape=[E, F, D])\n"
		  "  down   = einsum(\"efd->edf\", reshape(w2, shape=[E, F, D]))\n");
		break;
	default:
		break;
	}
	char extra[96] = "";
	if (!strcmp(m->act, "gpt_oss")) {
		char lim[48];
		snprintf(extra, sizeof extra, ", alpha=1.702, limit=%s", flit(lim, sizeof lim, m->limit));
	}
	P("  routed = experts(x, %s, w, %s, act=\"%s\"%s%s, block=B)%s\n", m->score == HF_MLP ? "eidx" : "idx", ops, m->act, extra,
		m->f->r->on_input ? ", weight_on=\"input\"" : "", fp->out_bias ? " + out_bias" : "");
}

/* Defines the block's sum `y` (`yb` when an output norm follows). */
static void emit_shared(out *o)
{
	const model *m = o->m;
	const hf_shared *s = m->f->s;
	const char *y = m->f->post_norm ? "yb" : "y ";
	if (!m->S) {
		P("  %s     = routed\n", y);
		return;
	}
	if (s->kind == HF_SH_FUSED)
		P("  sgu    = einsum(\"td,sd->ts\", x, shared_in)   # [T, 2S]: gate, then up\n"
		  "  sh_h   = %s(slice(sgu, axis=1, start=0, stop=S)) * slice(sgu, axis=1, start=S, stop=S2)\n",
			m->act_fn);
	else if (s->kind == HF_SH_UP)
		P("  sh_h   = %s(einsum(\"td,sd->ts\", x, shared_up))\n", m->act_fn);
	else
		P("  sh_h   = %s(einsum(\"td,sd->ts\", x, shared_gate)) * einsum(\"td,sd->ts\", x, shared_up)\n", m->act_fn);
	P("  shared = einsum(\"ts,ds->td\", sh_h, shared_down)\n");
	if (s->sgate)
		P("  sg     = sigmoid(einsum(\"td,od->to\", x, shared_expert_gate))   # [T, 1]\n"
		  "  %s     = routed + sg * shared\n", y);
	else if (m->average)
		P("  %s     = (routed + shared) / 2.0   # shared_expert_combination_strategy = average\n", y);
	else
		P("  %s     = routed + shared\n", y);
}

/* The block's output: y, after the output RMSNorm where the family has one. */
static void emit_output(out *o)
{
	const model *m = o->m;
	if (m->f->post_norm)
		emit_rmsnorm(o, "y", "yb", "D", m->post_eps, "post_norm");
	P("  output y%s\n}\n", m->score == HF_MLP ? ", rstate   # rstate: the router state the next layer takes" : "");
}

/* ---- entry ---- */

/* The text model's config: root, or root's text_config / language_config when that names a family. */
static const cJSON *text_obj(const cJSON *root, const char **type, bool *nested)
{
	static const char *const subs[] = {"text_config", "language_config"};
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
	*type = cJSON_IsString(mt) ? mt->valuestring : NULL;
	*nested = false;
	for (size_t i = 0; i < 2; i++) {
		const cJSON *sub = cJSON_GetObjectItemCaseSensitive(root, subs[i]);
		if (!cJSON_IsObject(sub))
			continue;
		const cJSON *st = cJSON_GetObjectItemCaseSensitive(sub, "model_type");
		bool known = cJSON_IsString(st) && hf_family_find(st->valuestring);
		if (known || (*type && hf_family_find(*type) && cJSON_GetObjectItemCaseSensitive(sub, "hidden_size"))) {
			if (known)
				*type = st->valuestring;
			*nested = true;
			return sub;
		}
	}
	return root;
}

static void unsupported(hf_cfg *c, const char *type)
{
	rt_buf b = {0};
	hf_names(&b);
	if (type)
		hf_err(c, "model_type '%s' is not supported; supported: %s (moec import-hf --list)", type,
			b.s ? b.s : "");
	else
		hf_err(c, "config has no model_type; supported: %s (moec import-hf --list)", b.s ? b.s : "");
	rt_buf_free(&b);
}

/* The compute type: the option's, or the config's torch_dtype / dtype when asked to follow it. */
static bool pick_dtype(hf_cfg *c, const moe_import_opts *o, model *m)
{
	m->dt = o->dtype;
	if (m->dt != MOE_F32 && m->dt != MOE_BF16) {
		hf_err(c, "import options: dtype must be f32 or bf16, not %s", moe_dtype_name(m->dt));
		return false;
	}
	if (!o->config_dtype)
		return true;
	const cJSON *v = hf_item(c, "torch_dtype|dtype", NULL, 0);
	if (!v) {
		hf_cfg top = *c;
		top.obj = c->root;
		v = hf_item(&top, "torch_dtype|dtype", NULL, 0);
	}
	if (!v) {
		moe_diag(c->ctx, MOE_DIAG_NOTE, moe_loc_file(c->ctx, c->file),
			"the config has no torch_dtype: the layer computes in f32 (--set dtype=bf16 for bf16)");
		return true;
	}
	if (!cJSON_IsString(v)) {
		hf_err(c, "config key 'torch_dtype' must be a string");
		return false;
	}
	if (!strcmp(v->valuestring, "bfloat16"))
		m->dt = MOE_BF16;
	else if (!strcmp(v->valuestring, "float32") || !strcmp(v->valuestring, "float16"))
		m->dt = MOE_F32; /* f16 weights compute in f32: moec has no f16 compute type */
	return true;
}

/* The quantization_config (of text_config for nested configs, else the root's), or NULL. */
static const cJSON *quant_config(const hf_cfg *c)
{
	const cJSON *q = cJSON_GetObjectItemCaseSensitive(c->obj, "quantization_config");
	if (!q || cJSON_IsNull(q))
		q = cJSON_GetObjectItemCaseSensitive(c->root, "quantization_config");
	return q && !cJSON_IsNull(q) ? q : NULL;
}

static moe_status emit(moe_ctx *ctx, const char *name, const moe_import_opts *opts, const model *m, char **moe_text)
{
	out o = {{0}, opts->prefix ? opts->prefix : m->nested ? DEF(m->f->nested, "model.language_model.layers.{layer}.") :
		DEF(m->f->prefix, "model.layers.{layer}."), m};
	o.b.ctx = ctx; /* the text grows in context memory; the caller's copy is malloc'd (moe_free) */
	emit_header(&o, name);
	emit_weights(&o);
	emit_post_norm_weight(&o);
	emit_routing(&o);
	emit_experts(&o);
	emit_shared(&o);
	emit_output(&o);
	ctx_commit_point(ctx); /* nothing of the context's is taken after the copy */
	*moe_text = o.b.oom ? NULL : malloc(o.b.len + 1);
	if (*moe_text)
		memcpy(*moe_text, o.b.s, o.b.len + 1);
	rt_buf_free(&o.b);
	if (!*moe_text) {
		rt_err_at(ctx, name, -1, "out of memory");
		return MOE_ERR_NOMEM;
	}
	return MOE_OK;
}

/* The tensor name prefix is written into .moe strings: no control byte. */
static bool prefix_ok(hf_cfg *c, const moe_import_opts *opts)
{
	for (const unsigned char *p = (const unsigned char *)(opts->prefix ? opts->prefix : ""); *p; p++)
		if (*p < 0x20 || *p == 0x7f) {
			hf_err(c, "import option 'prefix' holds the control byte 0x%02x", *p);
			return false;
		}
	return true;
}

/* ctx_defer clean-ups: the cJSON tree, the malloc'd text */
static void json_unwind(void *root)
{
	cJSON_Delete(root);
}

static void text_unwind(void *p)
{
	char **t = p;
	free(*t);
	*t = NULL;
}

/* ModelOpt's hf_quant_config.json beside config.json (text hq, NULL when
 * absent): its "quantization" object read as quant_method "modelopt"; NULL
 * (reported) when it is not an object, or absent. */
static cJSON *modelopt_config(moe_ctx *ctx, const char *hq_name, const char *hq, size_t hq_len, bool *bad)
{
	*bad = false;
	if (!hq)
		return NULL;
	cJSON *doc = rt_json_doc(ctx, hq_name, hq, hq_len);
	const cJSON *qz = doc ? cJSON_GetObjectItemCaseSensitive(doc, "quantization") : NULL;
	cJSON *q = cJSON_IsObject(qz) ? cJSON_Duplicate(qz, 1) : NULL;
	cJSON_Delete(doc);
	if (q && cJSON_GetObjectItemCaseSensitive(q, "quant_method"))
		cJSON_DeleteItemFromObjectCaseSensitive(q, "quant_method");
	if (!q || !cJSON_AddStringToObject(q, "quant_method", "modelopt")) {
		if (doc && !q)
			rt_err_at(ctx, hq_name, -1, "no \"quantization\" object (ModelOpt's hf_quant_config.json has one)");
		cJSON_Delete(q);
		*bad = true;
		return NULL;
	}
	return q;
}

static moe_status import_text(moe_ctx *ctx, const char *name, const char *json, size_t len,
	const moe_import_opts *opts, char **moe_text, const char *hq_name, const char *hq, size_t hq_len)
{
	moe_import_opts def = {0};
	if (!opts)
		opts = &def;
	cJSON *root = rt_json_doc(ctx, name, json, len); /* read as Python's json reads it; reports its errors */
	hf_cfg c = {ctx, name, root, root, 0, false, NULL};
	if (!root)
		return MOE_ERR_FORMAT;
	if (!cJSON_IsObject(root)) {
		hf_err(&c, "not a JSON object");
		cJSON_Delete(root);
		return MOE_ERR_FORMAT;
	}
	model m = {0};
	c.obj = text_obj(root, &m.model_type, &m.nested);
	m.f = m.model_type ? hf_family_find(m.model_type) : NULL;
	c.defaults = m.f ? m.f->defaults : NULL;
	if (!m.f) {
		unsupported(&c, m.model_type);
		cJSON_Delete(root);
		return MOE_ERR_UNSUPPORTED;
	}
	hf_family own;
	if (!m.nested && m.f->f_own) {
		own = *m.f;
		own.f = m.f->f_own;
		m.f = &own;
	}
	moe_status st = MOE_ERR_INVALID;
	uint32_t dj = ctx_defer(ctx, json_unwind, root);
	if (prefix_ok(&c, opts) && pick_dtype(&c, opts, &m) && read_model(&c, opts, &m))
		st = emit(ctx, name, opts, &m, moe_text);
	uint32_t dt = ctx_defer(ctx, text_unwind, moe_text);
	/* quantized experts: packed values and scales read by dequant (runtime/quant_import.c) */
	const cJSON *q = quant_config(&c);
	cJSON *mo = NULL;
	bool bad = false;
	if (st == MOE_OK && !q && !opts->ignore_quantization && (mo = modelopt_config(ctx, hq_name, hq, hq_len, &bad)))
		q = mo, name = hq_name;
	uint32_t dm = ctx_defer(ctx, json_unwind, mo);
	if (st == MOE_OK && bad)
		st = MOE_ERR_INVALID;
	if (st == MOE_OK && q && !opts->ignore_quantization && (st = rt_quant_rewrite(ctx, name, q, moe_text)) != MOE_OK) {
		free(*moe_text);
		*moe_text = NULL;
	}
	if (st != MOE_OK && *moe_text) {
		free(*moe_text);
		*moe_text = NULL;
	}
	ctx_undefer(ctx, dm);
	cJSON_Delete(mo);
	ctx_commit_point(ctx); /* a refused diagnostic fails the call here, the text still covered */
	ctx_undefer(ctx, dt);
	ctx_undefer(ctx, dj);
	cJSON_Delete(root);
	return st;
}

moe_status moe_import_hf_text(moe_ctx *ctx, const char *name, const char *json, size_t len,
	const moe_import_opts *opts, char **moe_text)
{
	*moe_text = NULL;
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, import_text(ctx, name, json, len, opts, moe_text, NULL, NULL, 0));
}

static moe_status import_file(moe_ctx *ctx, const char *config_path, const moe_import_opts *opts, char **moe_text)
{
	char *text;
	size_t len;
	moe_status s = moe_read_file_max(ctx, config_path, RT_JSON_CONFIG_MAX_BYTES, &text, &len);
	if (s)
		return s;
	uint32_t d = ctx_defer(ctx, free, text);
	/* ModelOpt writes its quantization config beside config.json */
	const char *slash = strrchr(config_path, '/');
	int dir = slash ? (int)(slash - config_path + 1) : 0;
	char hq_name[4096], *hq = NULL;
	size_t hq_len = 0;
	int w = snprintf(hq_name, sizeof hq_name, "%.*shf_quant_config.json", dir, config_path);
	/* probed without opening it (a FIFO there would block an open); the
	 * reader then refuses anything but a regular file of bounded size */
	if (w > 0 && (size_t)w < sizeof hq_name && access(hq_name, F_OK) == 0)
		s = moe_read_file_max(ctx, hq_name, RT_JSON_CONFIG_MAX_BYTES, &hq, &hq_len);
	uint32_t dq = ctx_defer(ctx, free, hq);
	if (s == MOE_OK)
		s = import_text(ctx, config_path, text, len, opts, moe_text, hq_name, hq, hq_len);
	ctx_undefer(ctx, dq);
	free(hq);
	ctx_undefer(ctx, d);
	free(text);
	return s;
}

moe_status moe_import_hf(moe_ctx *ctx, const char *config_path, const moe_import_opts *opts, char **moe_text)
{
	*moe_text = NULL;
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, import_file(ctx, config_path, opts, moe_text));
}
