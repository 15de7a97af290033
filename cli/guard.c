/* cli/guard.c: checks on the paths of a moec command made before
 * anything is read or written: no output is the same file as an input or as
 * another output, and path lists fit their fixed tables. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

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

/* The paths the command reads (file, --machine, --weights, --input), in
 * in[ROOM]; the copies hold the split lists. False after an error. */
enum { ROOM = 2 * CLI_MAX_PATHS + 4 };
static int inputs(moe_ctx *ctx, const opts *o, const char **in, size_t *nin, char **wcopy, char **icopy)
{
	*nin = 0;
	int ok = add_list(ctx, "--weights", o->weights, 0, in, nin, ROOM, wcopy) &&
		 add_list(ctx, "--input", o->input, 1, in, nin, ROOM, icopy);
	if (o->file && strcmp(o->file, "-"))
		in[(*nin)++] = o->file;
	if (o->machine)
		in[(*nin)++] = o->machine;
	return ok;
}

int cli_guard_paths(moe_ctx *ctx, const opts *o)
{
	const char *in[ROOM], *out[4];
	size_t nin = 0, nout = 0;
	char *wcopy = NULL, *icopy = NULL;
	int ok = inputs(ctx, o, in, &nin, &wcopy, &icopy);
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

/* One output: written straight through (FIFO, character device), or a
 * regular file or a new name whose directory exists and can take the
 * temporary renamed onto it. A symbolic link is judged by its target, as the
 * output set writes beside the target. */
static int writable(moe_ctx *ctx, const char *opt, const char *path)
{
	struct stat st;
	char *real = NULL;
	const char *p = path;
	if (lstat(path, &st) == 0) {
		if (S_ISLNK(st.st_mode) && stat(path, &st) == 0 && S_ISREG(st.st_mode) && (real = realpath(path, NULL)))
			p = real;
		if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
			free(real);
			return 0;
		}
		if (S_ISDIR(st.st_mode)) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, path), "%s names a directory, not a file; nothing was read "
				"or written", opt);
			free(real);
			return 1;
		}
	}
	char dir[PATH_MAX];
	const char *slash = strrchr(p, '/');
	if (!slash)
		snprintf(dir, sizeof dir, ".");
	else
		snprintf(dir, sizeof dir, "%.*s", slash == p ? 1 : (int)(slash - p), p);
	free(real);
	const char *why = NULL;
	int e = 0;
	if (stat(dir, &st) != 0)
		e = errno, why = e == ENOENT ? "does not exist" : e == ENOTDIR ? "is not a directory (a part of it is a file)" :
								  "cannot be examined";
	else if (!S_ISDIR(st.st_mode))
		why = "is not a directory";
	else if (access(dir, W_OK | X_OK) != 0)
		e = errno, why = "is not writable";
	if (!why)
		return 0;
	moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, path), "%s: the directory '%s' %s%s%s; nothing was read or written",
		opt, dir, why, e && e != ENOENT && e != ENOTDIR ? ": " : "", e && e != ENOENT && e != ENOTDIR ? strerror(e) : "");
	return 1;
}

int cli_guard_writable(moe_ctx *ctx, const opts *o)
{
	const char *opt[] = {"-o", "--stats", "--trace", "--reproducer"};
	const char *path[] = {o->list ? NULL : o->out, o->stats, o->trace, o->reproducer};
	int bad = 0;
	for (size_t i = 0; i < sizeof path / sizeof *path; i++)
		if (path[i] && *path[i] && !cli_is_stdout(path[i]))
			bad |= writable(ctx, opt[i], path[i]);
	return bad;
}

int cli_guard_derived(moe_ctx *ctx, const opts *o, const char *const *outs, size_t n)
{
	const char *in[ROOM];
	size_t nin = 0;
	char *wcopy = NULL, *icopy = NULL;
	int ok = inputs(ctx, o, in, &nin, &wcopy, &icopy);
	/* one output at a time: only output-against-input matters here (the
	 * derived names are distinct by construction) */
	for (size_t j = 0; ok && j < n; j++)
		ok = moe_check_outputs(ctx, in, nin, &outs[j], 1) == MOE_OK;
	free(wcopy);
	free(icopy);
	return !ok;
}
