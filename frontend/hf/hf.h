/* frontend/hf/hf.h: the HuggingFace family table and its recipe parts.
 *
 * A family is one row of hf_families[] (families.c): the model_types it
 * answers to, the HF block class, the config keys it reads, which decoder
 * layers are MoE, tensor names, and three recipe parts - routing, expert FFN,
 * shared expert - each a small struct of choices shared between rows.
 * import_hf.c writes the .moe text of a layer from a row; nothing there is
 * specific to one family. A family whose block reuses existing parts is a new
 * row; new math adds a choice to a part.
 *
 * Tensor names are relative to the block's module path (`blk`, e.g. "mlp.");
 * a name starting with '~' is relative to the decoder layer instead. */
#ifndef MOEC_HF_H
#define MOEC_HF_H

#include <stdbool.h>

/* routing score */
enum { HF_SOFTMAX, HF_SIGMOID, HF_LOGITS, HF_SPARSEMIXER, HF_MLP };
/* group-limited selection: none, a group's score = sum of its 2 best (DeepSeek-V3) or its best (DeepSeek-V2) */
enum { HF_G_NONE, HF_G_TOP2SUM, HF_G_MAX };
/* renormalisation of the K weights: never, always, as the norm key says */
enum { HF_N_NEVER, HF_N_ALWAYS, HF_N_KEY };
/* expert weight layouts in the checkpoint */
enum {
	HF_SPLIT,   /* per-expert tensors ({e}): gate [F, D], up [F, D], down [D, F] */
	HF_GU,      /* gate_up [E, 2F, D] (gate = first F rows), down [E, D, F] */
	HF_GU_T,    /* gate_up [E, D, 2F] (gate = first F columns), down [E, F, D] */
	HF_GU_T_IL, /* gate_up [E, D, 2F] interleaved (gate = even columns), down [E, F, D], biases */
	HF_UP,      /* not gated: per-expert up [F, D], down [D, F] */
	HF_DBRX,    /* w1 (gate), v1 (up), w2 each [E*F, D]; down = w2 per expert transposed */
};
/* shared expert: none, gate/up/down Linears, one fused [2S, D] input Linear, up/down (not gated) */
enum { HF_SH_NONE, HF_SH_SPLIT, HF_SH_FUSED, HF_SH_UP };
/* MoE-layer selection keys a family reads (bits) */
enum {
	HF_L_MLP_ONLY = 1 << 0,    /* mlp_only_layers */
	HF_L_SPARSE_STEP = 1 << 1, /* decoder_sparse_step: MoE iff (L + 1) % step == 0 */
	HF_L_FIRST_K = 1 << 2,     /* first_k_dense_replace */
	HF_L_FREQ = 1 << 3,        /* moe_layer_freq: L % freq == 0, or a per-layer 0/1 list */
	HF_L_LLAMA4 = 1 << 4,      /* moe_layers list, else interleave_moe_layer_step */
	HF_L_TYPES = 1 << 5,       /* mlp_layer_types list of "sparse" / "dense" */
	HF_L_JAMBA = 1 << 6,       /* expert_layer_period / expert_layer_offset */
	HF_L_ERNIE = 1 << 7,       /* moe_layer_start_index / _end_index / _interval */
	HF_L_BLOCKS = 1 << 8,      /* layers_block_type list ("moe") or hybrid_override_pattern ('E') */
};

/* An MLP router (ZAYA1): a state h = down(x) + bias, plus (layers after the first) the state
 * carried from the layer before x a learned scale; logits = out(gelu(fc2(gelu(fc1(rmsnorm(h))))))
 * over E + 1 classes, the last a skip class that computes nothing; softmax, top-K on the
 * probabilities plus balancing biases (selection only); a skip pick gets weight 0. h is the
 * layer's second output, the next layer's carried state. Tensor names relative to blk. */
typedef struct hf_mlp_router {
	const char *down, *down_bias, *state_scale, *norm, *fc1, *fc1_bias, *fc2, *fc2_bias, *out, *balance;
	const char *k_width; /* the router state's width */
	const char *k_eps;   /* the RMSNorm's epsilon */
} hf_mlp_router;

typedef struct hf_route {
	unsigned char score; /* HF_SOFTMAX ... */
	bool after;          /* score the K selected logits (else select on the scores of all E) */
	bool f32;            /* the router Linear runs in f32 */
	bool f32_weight;     /* HF keeps the router weight itself in f32 (_keep_in_fp32_modules) */
	bool score_dt;       /* the score function over all E runs in the layer dtype, so selection and
	                      * renormalisation see rounded scores (DBRX: softmax(dtype=logits.dtype)) */
	bool router_bias;    /* the router Linear has a bias */
	bool sel_bias;       /* a correction bias is added to the scores for selection only */
	bool sel_bias_dt;    /* HF holds that bias in the model dtype (no _keep_in_fp32_modules), else f32 */
	unsigned char group; /* HF_G_* */
	unsigned char norm;  /* HF_N_* */
	double eps;          /* added to the renormalising sum */
	bool eps_clamp;      /* the sum is clamped below by eps instead (ERNIE) */
	bool scale;          /* multiplied by the scale key's value */
	bool keep_f32;       /* the weights stay f32 (else cast to the compute type) */
	bool on_input;       /* the weight multiplies the expert input (Llama 4) */
	const hf_mlp_router *mlp; /* score HF_MLP: the router's parts */
	const char *summary; /* for the table */
} hf_route;

typedef struct hf_ffn {
	unsigned char layout;               /* HF_SPLIT ... */
	const char *gate, *up, *down;       /* tensor names; fused layouts: gate = the gate_up tensor */
	const char *gate_up_bias, *down_bias; /* HF_GU_T_IL biases */
	const char *out_bias;               /* [D] added to the routed sum (JetMoE) */
	const char *act;                    /* fixed activation (experts act), NULL: from the act key */
	const char *summary;
} hf_ffn;

typedef struct hf_shared {
	unsigned char kind;           /* HF_SH_* */
	const char *gate, *up, *down; /* tensor names; HF_SH_FUSED: gate = the [2S, D] input, up unused */
	const char *sgate;            /* [1, D] sigmoid gate on the shared output (NULL: none) */
	const char *summary;
} hf_shared;

typedef struct hf_family {
	const char *types;  /* model_type and its aliases, space-separated; the first names the row */
	const char *block;  /* HF module class */
	const char *prefix; /* decoder layer {layer}; NULL: "model.layers.{layer}." */
	const char *nested; /* the same when the config nests the text model under text_config /
	                     * language_config; NULL: "model.language_model.layers.{layer}." */
	const char *blk;    /* the block's module path under the layer; NULL: "mlp." */
	const char *router, *router_bias, *sel_bias; /* NULL: "gate.weight", "gate.bias", "gate.e_score_correction_bias" */
	const char *sel_bias_dims;                   /* NULL: "E" */
	/* config keys, alternatives separated by '|', nested objects by '.'; NULL: the default named */
	const char *k_experts;      /* num_experts|num_local_experts|n_routed_experts */
	const char *k_topk;         /* num_experts_per_tok */
	const char *k_width;        /* moe_intermediate_size (required) */
	const char *k_hidden;       /* hidden_size */
	const char *k_layers;       /* num_hidden_layers */
	const char *k_act;          /* hidden_act */
	const char *act_default;    /* NULL: silu */
	const char *k_norm;         /* norm_topk_prob */
	bool norm_default;          /* when the norm key is absent */
	const char *k_eps;          /* overrides the part's eps when present */
	const char *k_scale;        /* routed_scaling_factor */
	const char *k_score;        /* a key naming the score function ("softmax" / "sigmoid"), NULL: none */
	const char *k_group, *k_topk_group; /* n_group, topk_group */
	const char *k_limit;        /* the gpt_oss clamp: swiglu_limit */
	const char *k_jitter;       /* sparsemixer threshold: router_jitter_noise */
	const char *k_shared_width; /* the shared expert's width */
	const char *k_shared_count; /* or a count of k_shared_base-width MLPs */
	const char *k_shared_base;  /* NULL: the expert width */
	const char *post_norm;      /* an RMSNorm weight [D] applied to the block's output (NULL: none) */
	const char *k_post_eps;     /* its epsilon: rms_norm_eps */
	const char *defaults;       /* the HF config class's defaults of the keys read, "key=value" strings each
	                             * ended by a NUL, the list by an empty one: a key absent from the config
	                             * takes its value here ("key=@other": other's value; NULL: none known) */
	unsigned layers;            /* HF_L_* */
	const hf_route *r;
	const hf_ffn *f;
	const hf_ffn *f_own; /* the experts' layout where the config is the text model's own (not
	                      * nested: a checkpoint the text model class wrote) and differs from
	                      * f's, which is then that of the image-text class's checkpoint; NULL: f */
	const hf_shared *s;
} hf_family;

extern const hf_family hf_families[];
extern const unsigned hf_nfamilies;

/* The row answering to model_type, or NULL. */
const hf_family *hf_family_find(const char *model_type);
struct rt_buf;
/* Appends every model_type, comma-separated. */
void hf_names(struct rt_buf *b);
/* Whether the space-separated word list `list` contains `w`. */
bool hf_has_word(const char *list, const char *w);

#endif
