/* frontend/hf/families.c: every MoE family moec imports, as data (see hf.h).
 *
 * Facts come from each family's HF modeling file (transformers 5.17): the
 * router math, the expert and shared-expert layouts, the checkpoint names the
 * model's save_pretrained writes. Parts first, then one row per family. */
#include <string.h>

#include "frontend/hf/hf.h"

/* ---- routing parts ---- */
static const hf_route R_SOFTMAX_F32W = {.score = HF_SOFTMAX, .norm = HF_N_ALWAYS, .keep_f32 = true,
	.summary = "softmax(E) f32, top-K, renormalise; weights stay f32"};
static const hf_route R_SOFTMAX = {.score = HF_SOFTMAX, .norm = HF_N_KEY,
	.summary = "softmax(E) f32, top-K, renormalise if norm key; weights in dtype"};
static const hf_route R_SOFTMAX_DT = {.score = HF_SOFTMAX, .norm = HF_N_KEY, .score_dt = true,
	.summary = "softmax(E) in dtype, top-K, renormalise (in dtype) if norm key"};
static const hf_route R_SOFTMAX_AFTER = {.score = HF_SOFTMAX, .after = true,
	.summary = "top-K logits, softmax(K) f32; weights in dtype"};
static const hf_route R_SOFTMAX_AFTER_BIAS = {.score = HF_SOFTMAX, .after = true, .router_bias = true,
	.summary = "biased router, top-K logits, softmax(K) f32; weights in dtype"};
static const hf_route R_SIGMOID_AFTER_INPUT = {.score = HF_SIGMOID, .after = true, .on_input = true,
	.summary = "top-K logits, sigmoid f32; weight on the expert input"};
static const hf_route R_SELECTABLE_AFTER = {.score = HF_SOFTMAX, .after = true, .norm = HF_N_KEY,
	.summary = "top-K logits, softmax(K) or sigmoid (score key; sigmoid renormalised if norm key); weights in dtype"};
static const hf_route R_DSV3 = {.score = HF_SIGMOID, .f32 = true, .sel_bias = true, .group = HF_G_TOP2SUM,
	.norm = HF_N_KEY, .eps = 1e-20, .scale = true, .keep_f32 = true,
	.summary = "f32 router, sigmoid, +correction bias for selection, groups by top-2 sum, renormalise (+1e-20) "
		   "if norm key, x scale; f32 weights"};
static const hf_route R_SIGMOID_BIAS = {.score = HF_SIGMOID, .f32 = true, .sel_bias = true, .norm = HF_N_ALWAYS,
	.eps = 1e-20, .scale = true, .keep_f32 = true,
	.summary = "f32 router, sigmoid, +correction bias for selection, renormalise (+1e-20), x scale; f32 weights"};
static const hf_route R_SIGMOID_BIAS_DT = {.score = HF_SIGMOID, .sel_bias = true, .sel_bias_dt = true,
	.norm = HF_N_ALWAYS, .keep_f32 = true,
	.summary = "router in dtype, sigmoid f32, +correction bias (held in dtype) for selection, renormalise; f32 weights"};
static const hf_route R_DSV2 = {.score = HF_SOFTMAX, .group = HF_G_MAX, .norm = HF_N_KEY, .eps = 1e-20,
	.scale = true, .keep_f32 = true,
	.summary = "softmax(E) f32, groups by their best (topk_method), renormalise (+1e-20) if norm key, x scale"};
static const hf_route R_SOFTMAX_GROUPS = {.score = HF_SOFTMAX, .group = HF_G_TOP2SUM, .norm = HF_N_KEY,
	.eps = 1e-20, .scale = true, .keep_f32 = true,
	.summary = "softmax(E) f32, groups by top-2 sum, renormalise (+1e-20) if norm key, x scale; f32 weights"};
static const hf_route R_SOFTMAX_F32 = {.score = HF_SOFTMAX, .norm = HF_N_KEY, .f32 = true, .f32_weight = true,
	.summary = "f32 router (weight kept f32), softmax(E), top-K, renormalise if norm key; weights in dtype"};
static const hf_route R_ERNIE = {.score = HF_SOFTMAX, .f32 = true, .f32_weight = true, .sel_bias = true, .norm = HF_N_ALWAYS, .eps = 1e-12,
	.eps_clamp = true,
	.summary = "f32 router (weight kept f32), softmax(E), +correction bias for selection, renormalise (sum "
		   "clamped >= moe_norm_min)"};
static const hf_mlp_router MLP_ZAYA = {"gate.down_proj.weight", "gate.down_proj.bias", "gate.router_states_scale",
	"gate.router_mlp.norm.weight", "gate.router_mlp.fc1.weight", "gate.router_mlp.fc1.bias",
	"gate.router_mlp.fc2.weight", "gate.router_mlp.fc2.bias", "gate.router_mlp.out_proj.weight",
	"gate.balancing_biases", .k_width = "router_hidden_size", .k_eps = "rms_norm_eps"};
static const hf_route R_ZAYA = {.score = HF_MLP, .mlp = &MLP_ZAYA,
	.summary = "MLP router (down-projection + carried state, RMSNorm, two GELU layers) over E + 1 classes "
		   "(the last a skip class), softmax, top-K with balancing biases, skip weight 0; weights in dtype"};
static const hf_route R_SPARSEMIXER = {.score = HF_SPARSEMIXER,
	.summary = "sparsemixer: two argmax rounds, each a softmax over the logits within a relative threshold"};

/* ---- expert FFN parts ---- */
static const hf_ffn F_W123 = {HF_SPLIT, "experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight",
	.summary = "gated; per-expert w1 (gate), w3 (up), w2 (down)"};
static const hf_ffn F_PROJ = {HF_SPLIT, "experts.{e}.gate_proj.weight", "experts.{e}.up_proj.weight",
	"experts.{e}.down_proj.weight", .summary = "gated; per-expert gate_proj, up_proj, down_proj"};
static const hf_ffn F_GU = {HF_GU, "experts.gate_up_proj", NULL, "experts.down_proj",
	.summary = "gated; fused gate_up_proj [E, 2F, D], down_proj [E, D, F]"};
static const hf_ffn F_GU_T = {HF_GU_T, "experts.gate_up_proj", NULL, "experts.down_proj",
	.summary = "gated; fused gate_up_proj [E, D, 2F], down_proj [E, F, D]"};
static const hf_ffn F_GPTOSS = {HF_GU_T_IL, "experts.gate_up_proj", NULL, "experts.down_proj",
	.gate_up_bias = "experts.gate_up_proj_bias", .down_bias = "experts.down_proj_bias", .act = "gpt_oss",
	.summary = "gated, clamped; interleaved gate_up_proj [E, D, 2F] with biases"};
static const hf_ffn F_LINEAR = {HF_GU, "input_linear.weight", NULL, "output_linear.weight",
	.summary = "gated; parallel experts input_linear [E, 2F, D], output_linear [E, D, F]"};
static const hf_ffn F_JETMOE = {HF_GU, "input_linear.weight", NULL, "output_linear.weight", .out_bias = "bias",
	.summary = "gated; input_linear [E, 2F, D], output_linear [E, D, F], output bias [D]"};
static const hf_ffn F_FC = {HF_GU_T, "experts.fc1.weight", NULL, "experts.fc2.weight",
	.summary = "gated; grouped fc1 [E, D, 2F], fc2 [E, F, D]"};
static const hf_ffn F_DBRX = {HF_DBRX, "experts.mlp.w1", "experts.mlp.v1", "experts.mlp.w2",
	.summary = "gated; w1, v1, w2 each [E*F, D]"};
static const hf_ffn F_UP_RELU2 = {HF_UP, NULL, "experts.{e}.up_proj.weight", "experts.{e}.down_proj.weight",
	.act = "relu2", .summary = "not gated, squared ReLU; per-expert up_proj, down_proj"};

/* ---- shared expert parts ---- */
static const hf_shared S_NONE = {HF_SH_NONE, .summary = "-"};
static const hf_shared S_QWEN = {HF_SH_SPLIT, "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight",
	"shared_expert.down_proj.weight", .sgate = "shared_expert_gate.weight",
	.summary = "shared_expert, scaled by sigmoid(shared_expert_gate)"};
static const hf_shared S_SHARED_EXPERTS = {HF_SH_SPLIT, "shared_experts.gate_proj.weight",
	"shared_experts.up_proj.weight", "shared_experts.down_proj.weight", .summary = "shared_experts, added"};
static const hf_shared S_SHARED_EXPERT = {HF_SH_SPLIT, "shared_expert.gate_proj.weight",
	"shared_expert.up_proj.weight", "shared_expert.down_proj.weight", .summary = "shared_expert, added"};
static const hf_shared S_SHARED_MLP = {HF_SH_SPLIT, "shared_mlp.gate_proj.weight", "shared_mlp.up_proj.weight",
	"shared_mlp.down_proj.weight", .summary = "shared_mlp, added"};
static const hf_shared S_GRANITE = {HF_SH_FUSED, "~shared_mlp.input_linear.weight", NULL,
	"~shared_mlp.output_linear.weight", .summary = "layer's shared_mlp (fused input_linear), added"};
static const hf_shared S_UP_RELU2 = {HF_SH_UP, NULL, "shared_experts.up_proj.weight",
	"shared_experts.down_proj.weight", .summary = "shared_experts (not gated), added"};

#define DS_LAYERS (HF_L_FIRST_K | HF_L_FREQ | HF_L_TYPES)
#define QWEN_LAYERS (HF_L_MLP_ONLY | HF_L_SPARSE_STEP)

const hf_family hf_families[] = {
	{.types = "mixtral", .block = "MixtralSparseMoeBlock", .blk = "block_sparse_moe.",
		.defaults = "hidden_size=4096\0" "intermediate_size=14336\0" "num_hidden_layers=32\0" "hidden_act=silu\0" "num_experts_per_tok=2\0" "num_local_experts=8\0",
		.k_width = "intermediate_size", .r = &R_SOFTMAX_F32W, .f = &F_W123, .s = &S_NONE},
	{.types = "minimax", .block = "MiniMaxSparseMoeBlock", .blk = "block_sparse_moe.",
		.k_width = "intermediate_size", .r = &R_SOFTMAX_F32W, .f = &F_W123, .s = &S_NONE},
	{.types = "phimoe", .block = "PhimoeSparseMoeBlock", .blk = "block_sparse_moe.",
		.k_width = "intermediate_size", .k_jitter = "router_jitter_noise", .r = &R_SPARSEMIXER, .f = &F_W123,
		.s = &S_NONE},
	{.types = "jamba", .block = "JambaSparseMoeBlock", .blk = "feed_forward.", .router = "router.weight",
		.k_width = "intermediate_size", .layers = HF_L_JAMBA, .r = &R_SOFTMAX, .f = &F_PROJ, .s = &S_NONE},
	{.types = "olmoe", .block = "OlmoeSparseMoeBlock",
		.defaults = "hidden_size=2048\0" "intermediate_size=2048\0" "num_hidden_layers=16\0" "hidden_act=silu\0" "num_experts_per_tok=8\0" "num_experts=64\0" "norm_topk_prob=false\0", .k_width = "intermediate_size", .r = &R_SOFTMAX,
		.f = &F_PROJ, .s = &S_NONE},
	{.types = "flex_olmo", .block = "FlexOlmoSparseMoeBlock", .k_width = "intermediate_size", .r = &R_SOFTMAX,
		.f = &F_PROJ, .s = &S_NONE},
	{.types = "qwen2_moe", .block = "Qwen2MoeSparseMoeBlock",
		.defaults = "hidden_size=2048\0" "num_hidden_layers=24\0" "hidden_act=silu\0" "decoder_sparse_step=1\0" "moe_intermediate_size=1408\0" "shared_expert_intermediate_size=5632\0" "num_experts_per_tok=4\0" "num_experts=60\0" "norm_topk_prob=false\0", .k_shared_width = "shared_expert_intermediate_size",
		.layers = QWEN_LAYERS, .r = &R_SOFTMAX, .f = &F_PROJ, .s = &S_QWEN},
	{.types = "qwen3_moe", .block = "Qwen3MoeSparseMoeBlock",
		.defaults = "hidden_size=2048\0" "num_hidden_layers=24\0" "hidden_act=silu\0" "decoder_sparse_step=1\0" "moe_intermediate_size=768\0" "num_experts_per_tok=8\0" "num_experts=128\0" "norm_topk_prob=false\0", .layers = QWEN_LAYERS, .r = &R_SOFTMAX,
		.f = &F_PROJ, .s = &S_NONE},
	{.types = "qwen3_next", .block = "Qwen3NextSparseMoeBlock", .norm_default = true,
		.k_shared_width = "shared_expert_intermediate_size", .layers = QWEN_LAYERS, .r = &R_SOFTMAX,
		.f = &F_PROJ, .s = &S_QWEN},
	{.types = "qwen3_vl_moe qwen3_vl_moe_text", .block = "Qwen3VLMoeTextSparseMoeBlock", .norm_default = true,
		.layers = QWEN_LAYERS, .r = &R_SOFTMAX, .f = &F_GU, .s = &S_NONE},
	{.types = "qwen3_5_moe qwen3_5_moe_text", .block = "Qwen3_5MoeSparseMoeBlock", .norm_default = true,
		.k_shared_width = "shared_expert_intermediate_size", .layers = QWEN_LAYERS, .r = &R_SOFTMAX,
		.f = &F_PROJ, .s = &S_QWEN},
	{.types = "deepseek_v2", .block = "DeepseekV2Moe", .k_shared_count = "n_shared_experts", .k_score = "scoring_func",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV2, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "deepseek_v3", .block = "DeepseekV3MoE",
		.defaults = "hidden_size=7168\0" "moe_intermediate_size=2048\0" "num_hidden_layers=61\0" "n_shared_experts=1\0" "n_routed_experts=256\0" "routed_scaling_factor=2.5\0" "n_group=8\0" "topk_group=4\0" "num_experts_per_tok=8\0" "first_k_dense_replace=3\0" "norm_topk_prob=true\0" "hidden_act=silu\0", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "axk1", .block = "AXK1MoE", .post_norm = "~post_mlp_layernorm.weight",
		.defaults = "hidden_size=7168\0" "moe_intermediate_size=2048\0" "num_hidden_layers=61\0" "n_shared_experts=1\0"
			"n_routed_experts=192\0" "routed_scaling_factor=2.5\0" "n_group=8\0" "topk_group=4\0"
			"num_experts_per_tok=8\0" "first_k_dense_replace=1\0" "norm_topk_prob=true\0" "hidden_act=silu\0"
			"rms_norm_eps=1e-6\0", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = HF_L_FIRST_K, .r = &R_DSV3, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "deepseek_v32", .block = "DeepseekV32MoE", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "kimi_k2", .block = "DeepseekV3MoE", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ, .s = &S_SHARED_EXPERTS},
	{.types = "glm4_moe", .block = "Glm4MoeMoE", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "glm4_moe_lite", .block = "Glm4MoeLiteMoE", .norm_default = true,
		.k_shared_count = "n_shared_experts", .k_scale = "routed_scaling_factor", .layers = DS_LAYERS,
		.r = &R_DSV3, .f = &F_PROJ, .s = &S_SHARED_EXPERTS},
	/* the image-text class writes the experts one by one, its text model class fused */
	{.types = "glm4v_moe glm4v_moe_text", .block = "Glm4vMoeTextMoE", .norm_default = true,
		.k_shared_count = "n_shared_experts", .k_scale = "routed_scaling_factor", .layers = DS_LAYERS,
		.r = &R_DSV3, .f = &F_PROJ, .f_own = &F_GU, .s = &S_SHARED_EXPERTS},
	{.types = "glm_moe_dsa", .block = "GlmMoeDsaMoE", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "solar_open", .block = "SolarOpenMoE", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "exaone_moe", .block = "ExaoneMoeSparseMoEBlock", .sel_bias = "e_score_correction_bias", .norm_default = true,
		.k_shared_count = "num_shared_experts", .k_scale = "routed_scaling_factor", .layers = DS_LAYERS,
		.r = &R_DSV3, .f = &F_PROJ, .s = &S_SHARED_EXPERTS},
	{.types = "dots1", .block = "Dots1MoE", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "mimo_v2_flash", .block = "MiMoV2FlashMoE", .norm_default = true, .k_scale = "routed_scaling_factor",
		.layers = DS_LAYERS, .r = &R_DSV3, .f = &F_PROJ, .s = &S_NONE},
	{.types = "mistral4", .block = "Mistral4MoE", .nested = "language_model.model.layers.{layer}.", .norm_default = true, .k_shared_count = "n_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_SOFTMAX_GROUPS, .f = &F_GU,
		.s = &S_SHARED_EXPERTS},
	{.types = "kimi_linear", .block = "KimiLinearSparseMoeBlock", .blk = "block_sparse_moe.", .k_topk = "num_experts_per_token|num_experts_per_tok",
		.k_norm = "moe_renormalize", .norm_default = true, .k_score = "moe_router_activation_func",
		.k_group = "num_expert_group|n_group", .k_shared_count = "num_shared_experts",
		.k_scale = "routed_scaling_factor", .layers = DS_LAYERS, .r = &R_DSV3, .f = &F_W123,
		.s = &S_SHARED_EXPERTS},
	{.types = "minimax_m2", .block = "MiniMaxM2SparseMoeBlock", .blk = "block_sparse_moe.",
		.sel_bias = "e_score_correction_bias", .k_width = "intermediate_size", .r = &R_SIGMOID_BIAS_DT, .f = &F_W123,
		.s = &S_NONE},
	{.types = "hy_v3", .block = "HYV3MoE", .router = "router.gate.weight", .sel_bias = "expert_bias",
		.k_shared_count = "num_shared_experts", .k_scale = "router_scaling_factor", .layers = HF_L_TYPES,
		.r = &R_SIGMOID_BIAS, .f = &F_PROJ, .s = &S_SHARED_MLP},
	{.types = "ernie4_5_moe", .block = "Ernie4_5_MoeSparseMoeBlock", .sel_bias = "moe_statics.e_score_correction_bias",
		.sel_bias_dims = "1, E", .k_experts = "moe_num_experts", .k_topk = "moe_k", .k_eps = "moe_norm_min",
		.k_shared_count = "moe_num_shared_experts", .layers = HF_L_ERNIE, .r = &R_ERNIE, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
	{.types = "hunyuan_v1_moe hunyuan", .block = "HunYuanMoEV1Moe",
		.defaults = "hidden_size=4096\0" "intermediate_size=11008\0" "moe_intermediate_size=@intermediate_size\0"
			"num_hidden_layers=32\0" "hidden_act=silu\0" "num_experts=1\0" "moe_topk=1\0", .router = "gate.wg.weight", .k_topk = "moe_topk",
		.k_shared_count = "num_shared_expert", .k_shared_base = "intermediate_size", .norm_default = true,
		.r = &R_SOFTMAX_F32, .f = &F_PROJ, .s = &S_SHARED_MLP},
	{.types = "granitemoe", .block = "GraniteMoeMoE", .blk = "block_sparse_moe.", .router = "router.layer.weight",
		.k_width = "intermediate_size", .r = &R_SOFTMAX_AFTER, .f = &F_LINEAR, .s = &S_NONE},
	{.types = "granitemoeshared", .block = "GraniteMoeSharedMoE", .blk = "block_sparse_moe.",
		.router = "router.layer.weight", .k_width = "intermediate_size", .k_shared_width = "shared_intermediate_size",
		.r = &R_SOFTMAX_AFTER, .f = &F_LINEAR, .s = &S_GRANITE},
	{.types = "jetmoe", .block = "JetMoeMoE", .router = "router.layer.weight", .k_width = "intermediate_size",
		.k_act = "activation_function", .r = &R_SOFTMAX_AFTER, .f = &F_JETMOE, .s = &S_NONE},
	{.types = "dbrx", .block = "DbrxFFN", .prefix = "transformer.blocks.{layer}.", .blk = "ffn.",
		.router = "router.layer.weight", .k_experts = "ffn_config.moe_num_experts", .k_topk = "ffn_config.moe_top_k",
		.k_width = "ffn_config.ffn_hidden_size", .k_hidden = "d_model", .k_layers = "n_layers",
		.k_act = "ffn_config.ffn_act_fn.name", .r = &R_SOFTMAX_DT, .k_norm = "ffn_config.moe_normalize_expert_weights",
		.f = &F_DBRX, .s = &S_NONE},
	{.types = "llama4 llama4_text", .block = "Llama4TextMoe", .nested = "language_model.model.layers.{layer}.",
		.blk = "feed_forward.", .router = "router.weight", .k_width = "intermediate_size",
		.k_shared_base = "intermediate_size", .layers = HF_L_LLAMA4, .r = &R_SIGMOID_AFTER_INPUT, .f = &F_GU_T,
		.s = &S_SHARED_EXPERT},
	{.types = "gpt_oss", .block = "GptOssMLP",
		.defaults = "num_hidden_layers=36\0" "num_local_experts=128\0" "hidden_size=2880\0" "intermediate_size=2880\0" "num_experts_per_tok=4\0" "swiglu_limit=7.0\0", .router = "router.weight", .router_bias = "router.bias",
		.k_width = "intermediate_size", .k_limit = "swiglu_limit", .r = &R_SOFTMAX_AFTER_BIAS, .f = &F_GPTOSS,
		.s = &S_NONE},
	{.types = "nemotron_h", .block = "NemotronHMoE", .prefix = "backbone.layers.{layer}.", .blk = "mixer.",
		.k_act = "mlp_hidden_act", .act_default = "relu2", .norm_default = true,
		.k_shared_width = "moe_shared_expert_intermediate_size", .k_scale = "routed_scaling_factor",
		.layers = HF_L_BLOCKS, .r = &R_DSV3, .f = &F_UP_RELU2, .s = &S_UP_RELU2},
	{.types = "aria aria_text", .block = "AriaTextMoELayer", .nested = "language_model.model.layers.{layer}.", .router = "router.weight",
		.k_experts = "moe_num_experts", .k_topk = "moe_topk", .k_width = "intermediate_size",
		.k_shared_count = "moe_num_shared_experts", .r = &R_SOFTMAX_AFTER, .f = &F_FC, .s = &S_SHARED_EXPERTS},
	{.types = "zaya", .block = "ZayaSparseMoeBlock",
		.defaults = "hidden_size=2048\0" "num_hidden_layers=40\0" "hidden_act=silu\0" "moe_intermediate_size=2048\0"
			"num_experts_per_tok=1\0" "num_experts=16\0" "router_hidden_size=256\0" "rms_norm_eps=1e-5\0",
		.r = &R_ZAYA, .f = &F_GU, .s = &S_NONE},
	{.types = "cohere2_moe", .block = "Cohere2MoeSparseMoeBlock", .k_width = "moe_intermediate_size|intermediate_size",
		.k_score = "expert_selection_fn", .k_shared_count = "num_shared_experts",
		.k_shared_base = "intermediate_size", .layers = HF_L_TYPES, .r = &R_SELECTABLE_AFTER, .f = &F_PROJ,
		.s = &S_SHARED_EXPERTS},
};
const unsigned hf_nfamilies = sizeof hf_families / sizeof *hf_families;

bool hf_has_word(const char *list, const char *w)
{
	size_t n = strlen(w);
	for (const char *p = list; *p;) {
		const char *e = strchr(p, ' ');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (len == n && !strncmp(p, w, n))
			return true;
		p += len + (e != NULL);
	}
	return false;
}

const hf_family *hf_family_find(const char *model_type)
{
	for (unsigned i = 0; i < hf_nfamilies; i++)
		if (hf_has_word(hf_families[i].types, model_type))
			return &hf_families[i];
	return NULL;
}
