/* frontend/cli/guard.c: checks on the paths of a moec command made before
 * anything is read or written: no output is the same file as an input or as
 * another output, and path lists fit their fixed tables. */
#include <stdlib.h>
#include <string.h>

#include "frontend/cli/cli.h"

/* Appends the items of a comma-separated list (the path after '=' for
 * NAME=path items when named is set); false when there are more than room. */
static int add_list(moe_ctx *ctx, const char *opt, const char *list, int named, const char **v, size_t *n,
	size_t room, char **copy)
{
	if (!list)
		return 1;
	*copy = strdup(list);
	if (!*copy)
		return 0;
	size_t k = 0;
	for (char *save = NULL, *p = strtok_r(*copy, ",", &save); p; p = strtok_r(NULL, ",", &save), k++) {
		if (k == CLI_MAX_PATHS) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "%s lists more than %d paths", opt, CLI_MAX_PATHS);
			return 0;
		}
		const char *eq = named ? strchr(p, '=') : NULL;
		if (*n < room)
			v[(*n)++] = eq ? eq + 1 : p;
	}
	return 1;
}

int cli_guard_paths(moe_ctx *ctx, const opts *o)
{
	enum { ROOM = 2 * CLI_MAX_PATHS + 4 };
	const char *in[ROOM], *out[4];
	size_t nin = 0, nout = 0;
	char *wcopy = NULL, *icopy = NULL;
	int ok = add_list(ctx, "--weights", o->weights, 0, in, &nin, ROOM, &wcopy) &&
		 add_list(ctx, "--input", o->input, 1, in, &nin, ROOM, &icopy);
	if (o->file && strcmp(o->file, "-"))
		in[nin++] = o->file;
	if (o->machine)
		in[nin++] = o->machine;
	if (o->out && strcmp(o->out, "-"))
		out[nout++] = o->out;
	out[nout++] = o->stats;
	out[nout++] = o->trace;
	out[nout++] = o->reproducer;
	if (ok)
		ok = moe_check_outputs(ctx, in, nin, out, nout) == MOE_OK;
	free(wcopy);
	free(icopy);
	return !ok;
}
