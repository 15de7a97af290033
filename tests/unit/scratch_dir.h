/* A scratch directory for tests that write files: created by a cmocka group
 * setup, emptied and removed by its teardown (the entries directly inside
 * it, files or empty directories). One per test program. */
#ifndef MOEC_TESTS_SCRATCH_DIR_H
#define MOEC_TESTS_SCRATCH_DIR_H

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The test program defines SCRATCH_NAME, the directory's name prefix. */
#ifndef SCRATCH_NAME
#error "define SCRATCH_NAME before including scratch_dir.h"
#endif

static char tmpdir[256];

static int setup_dir(void **st)
{
	(void)st;
	const char *t = getenv("TMPDIR");
	int n = snprintf(tmpdir, sizeof tmpdir, "%s/" SCRATCH_NAME "-XXXXXX", t && *t ? t : "/tmp");
	return n > 0 && (size_t)n < sizeof tmpdir && mkdtemp(tmpdir) ? 0 : -1;
}

/* Entries of tmpdir whose name contains `part` (every entry for NULL). */
static inline int count_entries(const char *part)
{
	DIR *d = opendir(tmpdir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && (!part || strstr(e->d_name, part));
	if (d)
		closedir(d);
	return n;
}

static int teardown_dir(void **st)
{
	(void)st;
	DIR *d = opendir(tmpdir);
	if (d) {
		struct dirent *e;
		char p[sizeof tmpdir + 256];
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
				snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
				if (unlink(p) != 0)
					rmdir(p);
			}
		closedir(d);
	}
	return rmdir(tmpdir) == 0 ? 0 : -1;
}

/* tmpdir/name into buf. */
static inline char *tpath(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", tmpdir, name);
	return buf;
}

#endif
