/* moec/frontend.h: the .moe language frontend (docs/language.md).
 *
 * moe_parse_moe turns the text of a .moe file into an IR module with one
 * graph per `layer`. Settings (the command line's --set NAME=VALUE) override
 * dims, params and the compute dtype. Errors become diagnostics in the
 * context, located in the registered source text; the result is then NULL. */
#ifndef MOEC_FRONTEND_H
#define MOEC_FRONTEND_H

#include "moec/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One override: a dim or param name (or "dtype") and its value as text. */
typedef struct moe_setting {
	const char *name;
	const char *value;
} moe_setting;

typedef struct moe_settings {
	const moe_setting *items;
	size_t count;
} moe_settings;

/* Parse and lower a .moe file. file names the source in diagnostics; text
 * need not be NUL-terminated. sets may be NULL. Returns NULL on any error
 * (every error is reported, the whole file is checked). Free the module with
 * moe_module_free. */
MOE_API moe_module *moe_parse_moe(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const moe_settings *sets);

/* Split "NAME=VALUE" as given to --set. Returns 0 on a malformed argument. The
 * name is copied into name (at most namelen bytes with the NUL); *value points
 * into arg. */
MOE_API int moe_setting_split(const char *arg, char *name, size_t namelen, const char **value);

#ifdef __cplusplus
}
#endif
#endif
