/* runtime/rt_quant.h: import-hf's reading of quantization_config. */
#ifndef MOEC_RT_QUANT_H
#define MOEC_RT_QUANT_H

#include <cjson/cJSON.h>

#include "moec/io.h"

/* Rewrites the weight declarations of an imported .moe text (*text, malloc'ed;
 * replaced on success) for the checkpoint's quantization_config qc: every
 * quantized Linear weight becomes its packed values and scales bound by
 * `dequant`. An unsupported configuration is an error naming the file. */
moe_status rt_quant_rewrite(moe_ctx *ctx, const char *file, const cJSON *qc, char **text);

#endif
