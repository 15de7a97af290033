/* runtime/outset.c: outputs as a set, committed all or none
 * (moe_output_set in moec/io.h). Every target gets a temporary beside it (TARGET.set.XXXXXX, its
 * symbolic links resolved first) before anything is computed; the writers
 * write to the temporaries (the library's writers replace them atomically);
 * moe_output_set_commit renames them onto their targets in the order they
 * were added, only when every one was written, and moe_output_set_abort (or
 * a signal: they are listed as temporaries, file.c) removes them. An existing FIFO or character device
 * (/dev/null) is written straight through and takes no part in the commit. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/rt_io.h"

typedef struct item {
	char *target; /* the file replaced: symbolic links resolved */
	char *tmp;    /* NULL: written straight through */
	int slot;
	dev_t dev;    /* the empty temporary made by add: a writer replaces it */
	ino_t ino;
} item;

struct moe_output_set {
	moe_ctx *ctx;
	item *v;
	size_t n, cap;
};

moe_output_set *moe_output_set_new(moe_ctx *ctx)
{
	moe_output_set *s = calloc(1, sizeof *s);
	if (!s)
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "out of memory");
	else
		s->ctx = ctx;
	return s;
}

static int oops(moe_output_set *s, const char *path, const char *what, int e)
{
	moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_file(s->ctx, path), "%s%s%s", what, e ? ": " : "", e ? strerror(e) : "");
	return 1;
}

/* The target of path (symbolic links resolved) and whether it is written
 * straight through; 1 after an error. */
static int resolve(moe_output_set *s, const char *path, char **target, int *through)
{
	struct stat st;
	*through = 0;
	if (lstat(path, &st) != 0) {
		if (errno != ENOENT)
			return oops(s, path, "cannot stat the output", errno);
		*target = strdup(path);
		return *target ? 0 : oops(s, path, "out of memory", 0);
	}
	if (S_ISLNK(st.st_mode)) {
		if (stat(path, &st) != 0)
			return oops(s, path, "the output is a symbolic link that cannot be resolved", errno);
		*target = S_ISREG(st.st_mode) ? realpath(path, NULL) : strdup(path);
	} else {
		*target = strdup(path);
	}
	if (!*target)
		return oops(s, path, "cannot resolve the output", errno);
	if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))
		*through = 1;
	else if (S_ISDIR(st.st_mode))
		return oops(s, path, "the output is a directory", 0);
	else if (!S_ISREG(st.st_mode))
		return oops(s, path, "the output is not a regular file; moec replaces only regular files", 0);
	return 0;
}

const char *moe_output_set_add(moe_output_set *s, const char *path)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 8;
		item *v = realloc(s->v, cap * sizeof *v);
		if (!v) {
			oops(s, path, "out of memory", 0);
			return NULL;
		}
		s->v = v, s->cap = cap;
	}
	item *it = &s->v[s->n];
	int through;
	*it = (item){NULL, NULL, -1, 0, 0};
	if (resolve(s, path, &it->target, &through)) {
		free(it->target);
		return NULL;
	}
	if (through) {
		s->n++;
		return it->target;
	}
	static const char suffix[] = ".set.XXXXXX";
	const char *slash = strrchr(it->target, '/');
	size_t dir = slash ? (size_t)(slash - it->target) + 1 : 0, base = strlen(it->target) - dir;
	if (base > NAME_MAX - (sizeof suffix - 1))
		base = NAME_MAX - (sizeof suffix - 1); /* the base name shortened to fit NAME_MAX */
	it->tmp = malloc(dir + base + sizeof suffix);
	int fd = -1;
	if (it->tmp) {
		memcpy(it->tmp, it->target, dir + base);
		memcpy(it->tmp + dir + base, suffix, sizeof suffix);
		fd = moe_temp_file(it->tmp, &it->slot);
	}
	if (fd < 0) {
		oops(s, path, "cannot create a temporary file beside it", it->tmp ? errno : ENOMEM);
		free(it->tmp);
		free(it->target);
		return NULL;
	}
	(void)fchmod(fd, rt_output_mode()); /* mkstemp makes 0600; outputs are ordinary files */
	struct stat st;
	if (fstat(fd, &st) == 0)
		it->dev = st.st_dev, it->ino = st.st_ino;
	close(fd);
	s->n++;
	return it->tmp;
}

static void release(moe_output_set *s, bool remove_them)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->v[i].tmp && remove_them)
			unlink(s->v[i].tmp);
		moe_temp_forget(s->v[i].slot);
		free(s->v[i].tmp);
		free(s->v[i].target);
	}
	free(s->v);
	free(s);
}

void moe_output_set_abort(moe_output_set *s)
{
	if (s)
		release(s, true);
}

moe_status moe_output_set_commit(moe_output_set *s)
{
	int bad = 0;
	/* every temporary must have been replaced by a written regular file
	 * before any is renamed */
	for (size_t i = 0; i < s->n && !bad; i++) {
		struct stat st;
		if (!s->v[i].tmp)
			continue;
		if (lstat(s->v[i].tmp, &st) != 0 || !S_ISREG(st.st_mode))
			bad = oops(s, s->v[i].target, "its temporary is gone; nothing was written", errno);
		else if (st.st_dev == s->v[i].dev && st.st_ino == s->v[i].ino)
			bad = oops(s, s->v[i].target, "this output was not written; nothing was written", 0);
	}
	for (size_t i = 0; i < s->n && !bad; i++) {
		if (!s->v[i].tmp)
			continue;
		if (rename(s->v[i].tmp, s->v[i].target) != 0) {
			bad = oops(s, s->v[i].target, "cannot rename the temporary into place", errno);
			break;
		}
		moe_temp_forget(s->v[i].slot);
		s->v[i].slot = -1;
		free(s->v[i].tmp);
		s->v[i].tmp = NULL;
		rt_sync_dir(s->v[i].target);
	}
	release(s, true);
	return bad ? MOE_ERR_IO : MOE_OK;
}
