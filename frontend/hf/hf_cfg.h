/* frontend/hf/hf_cfg.h: reading an HF config.json for the importer (config.c).
 *
 * Keys are given as alternatives separated by '|' (aliases: the first present
 * wins, the present ones must agree) and paths into nested objects by '.'.
 * An integer key whose value is a list is read per layer (element `layer`). */
#ifndef MOEC_HF_CFG_H
#define MOEC_HF_CFG_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "frontend/hf/hf.h"
#include "moec/io.h"

typedef struct hf_cfg {
	moe_ctx *ctx;
	const char *file;
	const cJSON *root, *obj; /* obj: the text model's config (root, or its text_config / language_config) */
	int64_t layer;           /* the element of per-layer lists */
	bool bad;
	const char *defaults;    /* the family's HF config class defaults (hf_family.defaults), or NULL */
} hf_cfg;

#define HF_MAX_DIM ((int64_t)INT32_MAX)

void hf_err(hf_cfg *c, const char *fmt, ...) MOE_PRINTF(2, 3);
/* The HF config class default of the first alternative of spec that has one (its text), or NULL;
 * *which = its name. */
const char *hf_default(const hf_cfg *c, const char *spec, char *which, size_t n);
/* The value of the first present alternative of spec (non-null), or NULL; *which = its name. */
const cJSON *hf_item(const hf_cfg *c, const char *spec, char *which, size_t n);
int64_t hf_int(hf_cfg *c, const char *spec, bool required, int64_t def, int64_t lo, int64_t hi);
double hf_num(hf_cfg *c, const char *spec, double def);
bool hf_bool(hf_cfg *c, const char *spec, bool def);
const char *hf_str(hf_cfg *c, const char *spec, const char *def);

/* Whether layer L (of nl, -1 unknown) is an MoE layer of family f: 1 yes, 0 not (why says by which
 * key, kind what the layer is instead, e.g. "a dense MLP layer", "a mamba layer"), -1 config error.
 * quiet: no diagnostics (used to look for the nearest MoE layer). */
int hf_layer_kind(hf_cfg *c, const hf_family *f, int64_t L, int64_t nl, bool quiet, char *why, size_t n,
	char *kind, size_t kn);

#endif
