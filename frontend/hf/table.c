/* frontend/hf/table.c: the family table as text - `moec import-hf --list`,
 * docs/families.md (checked against this by a test) and the list of
 * model_types in messages. Everything here is generated from hf_families[]. */
#include <stdlib.h>

#include "frontend/hf/hf.h"
#include "runtime/rt_io.h"

static const struct {
	unsigned bit;
	const char *keys;
} layer_keys[] = {
	{HF_L_TYPES, "mlp_layer_types"},
	{HF_L_BLOCKS, "layers_block_type / hybrid_override_pattern"},
	{HF_L_MLP_ONLY, "mlp_only_layers"},
	{HF_L_SPARSE_STEP, "decoder_sparse_step"},
	{HF_L_FIRST_K, "first_k_dense_replace"},
	{HF_L_FREQ, "moe_layer_freq"},
	{HF_L_LLAMA4, "moe_layers / interleave_moe_layer_step"},
	{HF_L_JAMBA, "expert_layer_period / expert_layer_offset"},
	{HF_L_ERNIE, "moe_layer_start_index / moe_layer_end_index / moe_layer_interval"},
};

static void layers_text(rt_buf *b, unsigned bits)
{
	if (!bits) {
		rt_buf_printf(b, "every layer");
		return;
	}
	bool first = true;
	for (size_t i = 0; i < sizeof layer_keys / sizeof *layer_keys; i++)
		if (bits & layer_keys[i].bit) {
			rt_buf_printf(b, "%s%s", first ? "" : ", ", layer_keys[i].keys);
			first = false;
		}
}

/* before the layout of a checkpoint the text model class wrote (hf_family.f_own) */
#define OWN " (image-text checkpoint); where config.json is the text model's own: "

void hf_names(rt_buf *b)
{
	for (unsigned i = 0; i < hf_nfamilies; i++)
		for (const char *p = hf_families[i].types; *p;) {
			size_t n = strcspn(p, " ");
			rt_buf_printf(b, "%s%.*s", b->len ? ", " : "", (int)n, p);
			p += n + (p[n] == ' ');
		}
}

static void markdown(rt_buf *b)
{
	rt_buf_printf(b, "| model_type | HF block | MoE layers | routing | experts | shared expert |\n"
			 "|---|---|---|---|---|---|\n");
	for (unsigned i = 0; i < hf_nfamilies; i++) {
		const hf_family *f = &hf_families[i];
		rt_buf_printf(b, "| %s | %s | ", f->types, f->block);
		layers_text(b, f->layers);
		rt_buf_printf(b, " | %s | %s%s%s | %s%s |\n", f->r->summary, f->f->summary, f->f_own ? OWN : "",
			f->f_own ? f->f_own->summary : "", f->s->summary,
			f->post_norm ? "; then an RMSNorm of the block's output" : "");
	}
}

static void plain(rt_buf *b)
{
	for (unsigned i = 0; i < hf_nfamilies; i++) {
		const hf_family *f = &hf_families[i];
		rt_buf_printf(b, "%s\n  block:   %s\n  layers:  ", f->types, f->block);
		layers_text(b, f->layers);
		rt_buf_printf(b, "\n  routing: %s\n  experts: %s%s%s\n  shared:  %s\n", f->r->summary, f->f->summary,
			f->f_own ? OWN : "", f->f_own ? f->f_own->summary : "", f->s->summary);
		if (f->post_norm)
			rt_buf_printf(b, "  output:  an RMSNorm of the block's output\n");
	}
}

moe_status moe_import_hf_families(moe_ctx *ctx, moe_hf_list_format format, char **text)
{
	*text = NULL;
	rt_buf b = {0};
	switch (format) {
	case MOE_HF_LIST_TEXT: plain(&b); break;
	case MOE_HF_LIST_MARKDOWN: markdown(&b); break;
	case MOE_HF_LIST_NAMES: hf_names(&b); break;
	default:
		rt_err_at(ctx, "moe_import_hf_families", -1, "unknown list format %d", (int)format);
		return MOE_ERR_INVALID;
	}
	if (b.oom || !b.s) {
		rt_buf_free(&b);
		rt_err_at(ctx, "moe_import_hf_families", -1, "out of memory");
		return MOE_ERR_NOMEM;
	}
	*text = b.s;
	return MOE_OK;
}
