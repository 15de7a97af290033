/* backend-c/jit_cache.c: the on-disk cache of JIT-compiled layers.
 *
 * An entry is the object file LLVM made for a layer, stored under a name
 * hashed from its key. The key is the text that determines the object: moec's
 * version and build, the target triple, CPU and feature list, the kernel
 * choice, and the layer's kernel form printed as C (cgen_emit_c, which marks
 * parallel loops: everything the LLVM emitter reads is in that text). The entry
 * holds the whole key, so a load compares it byte for byte (a hash collision
 * is a miss, never a wrong layer), and a checksum and length of the object,
 * so a truncated or corrupted entry is detected, ignored and rewritten.
 * Entries are written to a temporary name in the directory and renamed.
 *
 * Layout: "MOECJIT1", u64 key length, u64 object length, u64 FNV-1a of the
 * object, the key, the object (integers little-endian as on the host). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend-c/cgen.h"
#include "runtime/rt_io.h"

static const char MAGIC[8] = {'M', 'O', 'E', 'C', 'J', 'I', 'T', '1'};
enum { HDR = 32 };

uint64_t cgen_fnv1a(const void *data, size_t n, uint64_t h)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* mkdir -p with mode 0700; false when dir is not a usable directory */
static bool make_dirs(const char *dir)
{
	char buf[PATH_MAX];
	size_t n = strlen(dir);
	if (n == 0 || n >= sizeof buf)
		return false;
	memcpy(buf, dir, n + 1);
	for (char *s = buf + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(buf, 0700) != 0 && errno != EEXIST)
			return false;
		*s = '/';
	}
	if (mkdir(buf, 0700) != 0 && errno != EEXIST)
		return false;
	struct stat st;
	return stat(buf, &st) == 0 && S_ISDIR(st.st_mode);
}

bool cgen_cache_open(cgen_cache *c, const char *dir, const char *key, size_t keylen)
{
	memset(c, 0, sizeof *c);
	char def[PATH_MAX];
	if (!dir || !*dir) {
		const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
		if (x && x[0] == '/')
			snprintf(def, sizeof def, "%s/moec", x);
		else if (home && home[0] == '/')
			snprintf(def, sizeof def, "%s/.cache/moec", home);
		else
			return false;
		dir = def;
	}
	if (!make_dirs(dir))
		return false;
	uint64_t h = cgen_fnv1a(key, keylen, 0xcbf29ce484222325ull);
	int w = snprintf(c->path, sizeof c->path, "%s/%016llx.jit", dir, (unsigned long long)h);
	if (w < 0 || (size_t)w >= sizeof c->path)
		return false;
	c->key = key;
	c->keylen = keylen;
	return true;
}

static uint64_t rd64(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

int cgen_cache_load(const cgen_cache *c, void **obj, size_t *len)
{
	*obj = NULL;
	*len = 0;
	FILE *f = fopen(c->path, "rb");
	if (!f)
		return 0;
	int rc = -1;
	unsigned char hdr[HDR];
	char *key = NULL;
	void *data = NULL;
	if (fread(hdr, 1, HDR, f) != HDR || memcmp(hdr, MAGIC, 8))
		goto out;
	uint64_t kl = rd64(hdr + 8), ol = rd64(hdr + 16), sum = rd64(hdr + 24);
	struct stat st;
	if (fstat(fileno(f), &st) != 0 || kl != c->keylen || ol == 0 || ol > (uint64_t)st.st_size ||
		(uint64_t)st.st_size != HDR + kl + ol)
		goto out;
	key = malloc(kl ? kl : 1);
	data = malloc(ol);
	if (!key || !data || fread(key, 1, kl, f) != kl || memcmp(key, c->key, kl) ||
		fread(data, 1, ol, f) != ol || cgen_fnv1a(data, ol, 0xcbf29ce484222325ull) != sum)
		goto out;
	*obj = data;
	*len = ol;
	data = NULL;
	rc = 1;
out:
	free(key);
	free(data);
	fclose(f);
	return rc;
}

bool cgen_cache_store(const cgen_cache *c, const void *obj, size_t len)
{
	char tmp[PATH_MAX + 16];
	snprintf(tmp, sizeof tmp, "%s.tmpXXXXXX", c->path);
	int slot; /* in the table of temporaries removed on SIGINT/SIGTERM (runtime/file.c) */
	int fd = rt_mkstemp(tmp, &slot);
	if (fd < 0)
		return false;
	FILE *f = fdopen(fd, "wb");
	if (!f) {
		close(fd);
		unlink(tmp);
		rt_temp_forget(slot);
		return false;
	}
	unsigned char hdr[HDR];
	uint64_t kl = c->keylen, ol = len, sum = cgen_fnv1a(obj, len, 0xcbf29ce484222325ull);
	memcpy(hdr, MAGIC, 8);
	memcpy(hdr + 8, &kl, 8);
	memcpy(hdr + 16, &ol, 8);
	memcpy(hdr + 24, &sum, 8);
	bool ok = fwrite(hdr, 1, HDR, f) == HDR && fwrite(c->key, 1, kl, f) == kl && fwrite(obj, 1, len, f) == len;
	ok = fflush(f) == 0 && ok;
	ok = fclose(f) == 0 && ok;
	if (ok)
		ok = rename(tmp, c->path) == 0;
	if (!ok)
		unlink(tmp);
	rt_temp_forget(slot);
	return ok;
}
