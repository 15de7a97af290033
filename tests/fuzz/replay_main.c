/* tests/fuzz/replay_main.c: run a fuzz harness over files without libFuzzer.
 *
 * usage: replay_<name> PATH...   (a PATH is a file or a directory of files)
 * Each file is fed once to LLVMFuzzerTestOneInput, directories in name
 * order. A harness signals a failure by aborting (or a sanitizer report), so
 * reaching the end means every input passed. Exit status 2 on a bad PATH or
 * when no input at all was found. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	size_t cap = 4096, len = 0;
	uint8_t *buf = malloc(cap);
	if (!buf)
		abort();
	size_t n;
	while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap && !(buf = realloc(buf, cap *= 2)))
			abort();
	}
	int bad = ferror(f);
	fclose(f);
	if (bad) {
		fprintf(stderr, "replay: %s: read error\n", path);
		free(buf);
		return -1;
	}
	/* An exact-size copy so reads past the end are caught under ASan. */
	uint8_t *exact = malloc(len ? len : 1);
	if (!exact)
		abort();
	memcpy(exact, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, long *count)
{
	DIR *d = opendir(dir);
	if (!d) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	char **names = NULL;
	size_t nn = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (nn == cap && !(names = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names)))
			abort();
		size_t l = strlen(dir) + strlen(e->d_name) + 2;
		if (!(names[nn] = malloc(l)))
			abort();
		snprintf(names[nn++], l, "%s/%s", dir, e->d_name);
	}
	closedir(d);
	qsort(names, nn, sizeof *names, by_name);
	int rc = 0;
	for (size_t i = 0; i < nn; i++) {
		struct stat st;
		if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
			if (run_file(names[i]) < 0)
				rc = -1;
			else
				(*count)++;
		}
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	long count = 0;
	int rc = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) != 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			rc = 2;
		} else if (S_ISDIR(st.st_mode)) {
			if (run_dir(argv[i], &count) < 0)
				rc = 2;
		} else if (run_file(argv[i]) < 0) {
			rc = 2;
		} else {
			count++;
		}
	}
	printf("replay: %ld input(s) passed\n", count);
	if (count == 0)
		rc = 2;
	return rc;
}
