/* backend-c/jit_cache.c: the on-disk cache of JIT-compiled layers.
 *
 * An entry is the object file LLVM made for a layer. Loading one means
 * executing it, so the cache is a security boundary:
 * - the root is a directory owned by the effective user and writable by
 *   nobody else (else a warning and no cache); moec creates it, and for the
 *   default location the XDG directory above it, with mode 0700, and nothing
 *   further up; every later access is relative to the root's descriptor;
 * - an entry is opened without following a link and without blocking, and
 *   used only if it is a regular file of the user whose length (checked
 *   before anything is read or allocated) is the header, the key and at most
 *   CGEN_CACHE_MAX_OBJECT bytes of object;
 * - an entry's integrity is bound to what produced it by an HMAC-SHA256 under
 *   a per-user secret (the root's "key": 32 random bytes, mode 0600, owned by
 *   the user) over the key text and the object. Without the secret nobody can
 *   make an entry that verifies; a valid entry of another layer fails the key
 *   text comparison. A failed check is a miss, and the entry is rewritten.
 *
 * The key is the text that determines the object: moec's version and build,
 * the target triple, CPU and feature list, the kernel choice, and the layer's
 * kernel form printed as C (cgen_emit_c). An entry's name is the hex of the
 * first 16 bytes of the key's SHA-256. Entries are written to a temporary
 * name (O_EXCL) in the root and renamed.
 *
 * Layout: "MOECJIT2", u64 key length, u64 object length (little-endian), the
 * HMAC (32 bytes), the key, the object. */
#define _DEFAULT_SOURCE /* MAP_POPULATE */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend-c/cgen.h"
#include "runtime/rt_io.h"

static const char MAGIC[8] = {'M', 'O', 'E', 'C', 'J', 'I', 'T', '2'};
static const char KEYFILE[] = "key";

static void put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

void cgen_cache_mac(const unsigned char *secret, const char *key, size_t keylen, const void *obj, size_t len,
	unsigned char hdr[CGEN_CACHE_HDR])
{
	memcpy(hdr, MAGIC, 8);
	put64(hdr + 8, keylen);
	put64(hdr + 16, len);
	cgen_hmac h;
	cgen_hmac_init(&h, secret, CGEN_CACHE_SECRET);
	cgen_hmac_update(&h, hdr, 24);
	cgen_hmac_update(&h, key, keylen);
	cgen_hmac_update(&h, obj, len);
	cgen_hmac_final(&h, hdr + 24);
}

static bool random_bytes(unsigned char *p, size_t n)
{
	while (n) {
		ssize_t r = getrandom(p, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		p += r;
		n -= (size_t)r;
	}
	if (!n)
		return true;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	while (n) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		p += r;
		n -= (size_t)r;
	}
	close(fd);
	return n == 0;
}

static bool write_all(int fd, const void *data, size_t n)
{
	const unsigned char *p = data;
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

static bool read_all(int fd, void *data, size_t n)
{
	unsigned char *p = data;
	while (n) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

/* Opens name in the root for reading: no link followed, no wait on a FIFO
 * (O_NONBLOCK, cleared once open), fstat'ed into st. -1 with errno. */
static int open_entry(int dir, const char *name, struct stat *st)
{
	int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 || fstat(fd, st) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* A new file in the root under a fresh temporary name (O_EXCL, mode 0600),
 * registered for removal on SIGINT/SIGTERM (*slot). -1 on failure. */
static int make_temp(const cgen_cache *c, const char *base, char *tmp, size_t tlen, int *slot)
{
	unsigned char r[6];
	if (!random_bytes(r, sizeof r))
		return -1;
	snprintf(tmp, tlen, "%s.tmp%02x%02x%02x%02x%02x%02x", base, r[0], r[1], r[2], r[3], r[4], r[5]);
	int fd = openat(c->dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	char full[PATH_MAX + 64];
	snprintf(full, sizeof full, "%s/%s", c->root, tmp);
	*slot = moe_temp_track(full);
	return fd;
}

static void drop_temp(const cgen_cache *c, const char *tmp, int slot)
{
	unlinkat(c->dir, tmp, 0);
	moe_temp_forget(slot);
}

typedef struct part {
	const void *p;
	size_t n;
} part;

/* Writes parts in order to a fresh temporary in the root and renames it to
 * name, replacing whatever is there (a failed entry, another user's file, a
 * FIFO): a reader sees the old entry or the whole new one. st, when not
 * NULL, receives the written file's identity as renamed (a rename may set
 * the status-change time). false on any failure, the temporary removed. */
static bool write_entry(const cgen_cache *c, const char *name, const part *parts, int nparts, struct stat *st)
{
	char tmp[96];
	int slot;
	int fd = make_temp(c, name, tmp, sizeof tmp, &slot);
	if (fd < 0)
		return false;
	bool ok = true;
	for (int i = 0; ok && i < nparts; i++)
		ok = write_all(fd, parts[i].p, parts[i].n);
	ok = ok && renameat(c->dir, tmp, c->dir, name) == 0;
	ok = ok && (!st || fstat(fd, st) == 0);
	ok = close(fd) == 0 && ok;
	if (ok)
		moe_temp_forget(slot);
	else
		drop_temp(c, tmp, slot);
	return ok;
}

/* The root's secret: read from its key file, or made (random bytes written to
 * a temporary and linked to the name, so that a reader never sees a partial
 * key and two racing processes agree). */
/* An entry's file name: the first 16 bytes of the key's SHA-256 in hex, then ext
 * (".jit" or ".pack"); name holds 48 bytes. */
static void entry_name(const char *key, size_t keylen, const char *ext, char name[48])
{
	unsigned char h[CGEN_SHA256_LEN];
	cgen_sha256 s;
	cgen_sha256_init(&s);
	cgen_sha256_update(&s, key, keylen);
	cgen_sha256_final(&s, h);
	for (int i = 0; i < 16; i++)
		snprintf(name + 2 * i, 3, "%02x", h[i]);
	strcpy(name + 32, ext);
}

static bool secret(moe_ctx *ctx, cgen_cache *c)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		struct stat st;
		int fd = open_entry(c->dir, KEYFILE, &st);
		if (fd >= 0) {
			bool ok = S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077) &&
				  st.st_size == CGEN_CACHE_SECRET && read_all(fd, c->secret, CGEN_CACHE_SECRET);
			close(fd);
			if (!ok)
				moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_file(ctx, c->root),
					"the JIT cache key file '%s' is not a %d-byte regular file of mode 0600 owned by uid %u: "
					"the cache is off",
					KEYFILE, CGEN_CACHE_SECRET, (unsigned)geteuid());
			return ok;
		}
		if (errno != ENOENT) {
			moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_file(ctx, c->root),
				"cannot open the JIT cache key file '%s': %s: the cache is off", KEYFILE, strerror(errno));
			return false;
		}
		char tmp[64];
		int slot;
		unsigned char k[CGEN_CACHE_SECRET];
		fd = make_temp(c, KEYFILE, tmp, sizeof tmp, &slot);
		if (fd < 0)
			return false;
		bool ok = random_bytes(k, sizeof k) && write_all(fd, k, sizeof k);
		ok = close(fd) == 0 && ok;
		/* linkat fails with EEXIST when another process made the key first: read theirs */
		ok = ok && linkat(c->dir, tmp, c->dir, KEYFILE, 0) == 0;
		int e = errno;
		drop_temp(c, tmp, slot);
		if (ok) {
			memcpy(c->secret, k, sizeof k);
			return true;
		}
		if (e != EEXIST)
			return false;
	}
	return false;
}

/* The root's path and, for the default location, the XDG directory above it
 * (base, "" for an explicit dir). false when there is no default. */
static bool root_path(const char *dir, char *root, size_t rlen, char *base, size_t blen)
{
	int w;
	base[0] = 0;
	if (dir && *dir) {
		w = snprintf(root, rlen, "%s", dir);
	} else {
		const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
		if (x && x[0] == '/')
			w = snprintf(base, blen, "%s", x);
		else if (home && home[0] == '/')
			w = snprintf(base, blen, "%s/.cache", home);
		else
			return false;
		if (w < 0 || (size_t)w >= blen)
			return false;
		w = snprintf(root, rlen, "%s/moec", base);
	}
	return w > 0 && (size_t)w < rlen;
}

bool cgen_cache_open(moe_ctx *ctx, cgen_cache *c, const char *dir, const char *key, size_t keylen)
{
	memset(c, 0, sizeof *c);
	c->dir = -1;
	char base[PATH_MAX];
	if (!root_path(dir, c->root, sizeof c->root, base, sizeof base))
		return false;
	/* only the root and the XDG directory are made, and only below an existing directory */
	if (base[0] && mkdir(base, 0700) != 0 && errno != EEXIST)
		return false;
	if (mkdir(c->root, 0700) != 0 && errno != EEXIST)
		return false;
	c->dir = open(c->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat st;
	if (c->dir < 0 || fstat(c->dir, &st) != 0) {
		cgen_cache_close(c);
		return false;
	}
	if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
		moe_diag(ctx, MOE_DIAG_WARNING, moe_loc_file(ctx, c->root),
			"the JIT cache directory is %s: the cache is off (it must be owned by uid %u and writable by "
			"nobody else)",
			st.st_uid != geteuid() ? "owned by another user" : "writable by group or others", (unsigned)geteuid());
		cgen_cache_close(c);
		return false;
	}
	if (!secret(ctx, c)) {
		cgen_cache_close(c);
		return false;
	}
	entry_name(key, keylen, ".jit", c->name);
	c->key = key;
	c->keylen = keylen;
	return true;
}

void cgen_cache_close(cgen_cache *c)
{
	if (c->dir >= 0)
		close(c->dir);
	c->dir = -1;
	memset(c->secret, 0, sizeof c->secret);
}

int cgen_cache_load(const cgen_cache *c, void **obj, size_t *len)
{
	*obj = NULL;
	*len = 0;
	struct stat st;
	int fd = open_entry(c->dir, c->name, &st);
	if (fd < 0)
		return errno == ENOENT ? 0 : -1; /* a symbolic link (ELOOP) is a failed check */
	int rc = -1;
	char *key = NULL;
	unsigned char *data = NULL;
	unsigned char hdr[CGEN_CACHE_HDR], want[CGEN_CACHE_HDR];
	/* what it is and how long, before a byte is read or allocated */
	uint64_t fixed = CGEN_CACHE_HDR + (uint64_t)c->keylen;
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (uint64_t)st.st_size <= fixed ||
		(uint64_t)st.st_size - fixed > CGEN_CACHE_MAX_OBJECT)
		goto out;
	uint64_t ol = (uint64_t)st.st_size - fixed;
	if (!read_all(fd, hdr, sizeof hdr) || memcmp(hdr, MAGIC, 8) || get64(hdr + 8) != c->keylen ||
		get64(hdr + 16) != ol)
		goto out;
	key = malloc(c->keylen ? c->keylen : 1);
	data = malloc((size_t)ol);
	if (!key || !data || !read_all(fd, key, c->keylen) || memcmp(key, c->key, c->keylen) ||
		!read_all(fd, data, (size_t)ol))
		goto out;
	cgen_cache_mac(c->secret, c->key, c->keylen, data, (size_t)ol, want);
	unsigned diff = 0; /* the whole MAC is compared, whatever differs first */
	for (size_t i = 0; i < sizeof hdr; i++)
		diff |= hdr[i] ^ want[i];
	if (diff)
		goto out;
	*obj = data;
	*len = (size_t)ol;
	data = NULL;
	rc = 1;
out:
	free(key);
	free(data);
	close(fd);
	return rc;
}

bool cgen_cache_store(const cgen_cache *c, const void *obj, size_t len)
{
	if (c->dir < 0 || len == 0 || (uint64_t)len > CGEN_CACHE_MAX_OBJECT)
		return false;
	unsigned char hdr[CGEN_CACHE_HDR];
	cgen_cache_mac(c->secret, c->key, c->keylen, obj, len, hdr);
	part parts[] = {{hdr, sizeof hdr}, {c->key, c->keylen}, {obj, len}};
	return write_entry(c, c->name, parts, 3, NULL);
}

/* ---- packed weights ----
 * An entry holds one packed bf16 weight (pack.c), named by the hex of the
 * first 16 bytes of its key's SHA-256 with ".pack". The key text names what
 * the bytes are computed from: the packing (its version, DOT_LANES, K, the
 * element count), the weight (name, source, layer) and the checkpoint's
 * identity as the caller gives it (moe_host_opts.weights_id). The root and
 * its rules are the JIT cache's. An entry is checked before use: a regular
 * file of the user, of exactly the header, key and data lengths expected
 * (checked before anything is read), the key text equal, an HMAC under the
 * root's secret over the header and key (bytes nobody without the secret
 * can forge), and a 64-bit checksum of the mapped data equal to the
 * header's. A failed check is a miss: the weight
 * is packed and the entry rewritten.
 *
 * A verified entry is mapped (read-only) and read in place.
 *
 * Layout: "MOECPAK1", u64 key length, u64 data length, u64 checksum, the
 * HMAC (32 bytes) over those 32 bytes and the key, the key, zeros to a
 * multiple of 64 bytes, the data. */
static const char PMAGIC[8] = {'M', 'O', 'E', 'C', 'P', 'A', 'K', '1'};
#define PHDR (32 + CGEN_SHA256_LEN)

/* Eight lanes of xor-multiply over 8-byte words, mixed at the end with
 * the tail bytes and the length: catches truncation, garbling and moved
 * blocks (it is no defence against a forger: the HMAC'd header is). Cheap
 * enough to run over every byte of an entry at memory speed. */
static uint64_t pack_checksum(const void *data, size_t n, uint64_t seed)
{
	const unsigned char *p = data;
	uint64_t a[8];
	for (int k = 0; k < 8; k++)
		a[k] = seed * 0x9e3779b97f4a7c15ull + (uint64_t)k;
	size_t i = 0;
	for (; i + 64 <= n; i += 64)
		for (int k = 0; k < 8; k++) {
			uint64_t w;
			memcpy(&w, p + i + 8 * k, 8);
			a[k] = (a[k] ^ w) * 0x100000001b3ull;
		}
	uint64_t h = n;
	for (int k = 0; k < 8; k++)
		h = (h ^ a[k]) * 0x100000001b3ull;
	for (; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static void pack_hdr(const unsigned char *secret, const char *key, size_t keylen, size_t len, uint64_t sum,
	unsigned char hdr[PHDR])
{
	memcpy(hdr, PMAGIC, 8);
	put64(hdr + 8, keylen);
	put64(hdr + 16, len);
	put64(hdr + 24, sum);
	cgen_hmac h;
	cgen_hmac_init(&h, secret, CGEN_CACHE_SECRET);
	cgen_hmac_update(&h, hdr, 32);
	cgen_hmac_update(&h, key, keylen);
	cgen_hmac_final(&h, hdr + 32);
}

/* The data's offset: the header and key, padded to 64 bytes (the kernels'
 * aligned loads read the data in place). */
static uint64_t pack_data_at(size_t keylen)
{
	return (PHDR + (uint64_t)keylen + 63) / 64 * 64;
}

/* ---- verified stamps ----
 * Checksumming a packed entry reads every byte (about 0.3 s for the 1.2 GB of
 * a Qwen3-30B-A3B layer). Once an entry's data has matched its checksum (it
 * was written by this process, or verified in full), a stamp beside it
 * ("<hex>.pkok") records the file's identity then: device, inode, size,
 * modification and status-change times (ns), and the checksum, under an HMAC
 * with the root's key over those bytes and the entry's name. A later run whose
 * fstat of the entry gives the same identity skips the data checksum: any
 * write to the file, truncation or replacement changes its status-change
 * time, inode or size (the kernel sets ctime on every change, and no user can
 * set it back), and a stamp cannot be forged without the key. What a stamp
 * does not catch is a change below the file system (a disk's bit rot). */
static const char SMAGIC[8] = {'M', 'O', 'E', 'C', 'P', 'O', 'K', '1'};
enum { SFIELDS = 8, SBODY = 8 + 8 * SFIELDS, SLEN = SBODY + CGEN_SHA256_LEN };

static void stamp_body(const struct stat *st, uint64_t sum, unsigned char b[SBODY])
{
	const uint64_t f[SFIELDS] = {(uint64_t)st->st_dev, (uint64_t)st->st_ino, (uint64_t)st->st_size,
		(uint64_t)st->st_mtim.tv_sec, (uint64_t)st->st_mtim.tv_nsec, (uint64_t)st->st_ctim.tv_sec,
		(uint64_t)st->st_ctim.tv_nsec, sum};
	memcpy(b, SMAGIC, 8);
	for (int i = 0; i < SFIELDS; i++)
		put64(b + 8 + 8 * i, f[i]);
}

static void stamp_mac(const cgen_cache *c, const char *entry, const unsigned char b[SBODY], unsigned char mac[CGEN_SHA256_LEN])
{
	cgen_hmac h;
	cgen_hmac_init(&h, c->secret, CGEN_CACHE_SECRET);
	cgen_hmac_update(&h, b, SBODY);
	cgen_hmac_update(&h, entry, strlen(entry));
	cgen_hmac_final(&h, mac);
}

static void stamp_name(const char *entry, char name[48])
{
	memcpy(name, entry, 32);
	strcpy(name + 32, ".pkok");
}

/* Does the stamp of entry say its data, now of identity st, matched sum? */
static bool stamp_ok(const cgen_cache *c, const char *entry, const struct stat *st, uint64_t sum)
{
	char name[48];
	stamp_name(entry, name);
	struct stat ss;
	int fd = open_entry(c->dir, name, &ss);
	if (fd < 0)
		return false;
	unsigned char have[SLEN], want[SLEN];
	bool ok = S_ISREG(ss.st_mode) && ss.st_uid == geteuid() && ss.st_size == SLEN && read_all(fd, have, SLEN);
	close(fd);
	if (!ok)
		return false;
	stamp_body(st, sum, want);
	stamp_mac(c, entry, want, want + SBODY);
	unsigned diff = 0;
	for (size_t i = 0; i < SLEN; i++)
		diff |= have[i] ^ want[i];
	return diff == 0;
}

/* Writes entry's stamp for identity st (temporary and rename); failure only
 * costs a later run its checksum. */
static void stamp_write(const cgen_cache *c, const char *entry, const struct stat *st, uint64_t sum)
{
	char name[48];
	stamp_name(entry, name);
	unsigned char b[SLEN];
	stamp_body(st, sum, b);
	stamp_mac(c, entry, b, b + SBODY);
	part parts[] = {{b, SLEN}};
	write_entry(c, name, parts, 1, NULL);
}

int cgen_pack_map(const cgen_cache *c, const char *key, size_t keylen, size_t len, cgen_pack_entry *e, const char **why)
{
	memset(e, 0, sizeof *e);
	char name[48];
	entry_name(key, keylen, ".pack", name);
	struct stat st;
	int fd = open_entry(c->dir, name, &st);
	*why = "not a regular file of the user";
	if (fd < 0)
		return errno == ENOENT ? 0 : -1;
	int rc = -1;
	char *k = NULL;
	unsigned char hdr[PHDR], want[PHDR];
	uint64_t at = pack_data_at(keylen), total = at + (uint64_t)len;
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid())
		goto out;
	*why = "its length is not the header, key and packed weight's";
	if ((uint64_t)st.st_size != total || len == 0)
		goto out;
	*why = "its header or key does not verify";
	if (!read_all(fd, hdr, sizeof hdr) || memcmp(hdr, PMAGIC, 8) || get64(hdr + 8) != keylen || get64(hdr + 16) != len)
		goto out;
	k = malloc(keylen ? keylen : 1);
	if (!k || !read_all(fd, k, keylen) || memcmp(k, key, keylen))
		goto out;
	pack_hdr(c->secret, key, keylen, len, get64(hdr + 24), want);
	unsigned diff = 0; /* the whole MAC is compared, whatever differs first */
	for (size_t i = 0; i < sizeof hdr; i++)
		diff |= hdr[i] ^ want[i];
	if (diff)
		goto out;
	/* a stamped entry is mapped lazily: a run reads only the pages it uses */
	bool stamped = stamp_ok(c, name, &st, get64(hdr + 24));
	*why = "it cannot be mapped";
	void *m = mmap(NULL, (size_t)total, PROT_READ, MAP_PRIVATE | (stamped ? 0 : MAP_POPULATE), fd, 0);
	if (m == MAP_FAILED)
		goto out;
	*why = "its data does not match its checksum";
	if (!stamped) {
		if (pack_checksum((const unsigned char *)m + at, len, keylen) != get64(hdr + 24)) {
			munmap(m, (size_t)total);
			goto out;
		}
		stamp_write(c, name, &st, get64(hdr + 24));
	}
	e->map = m;
	e->maplen = (size_t)total;
	e->data = (const unsigned char *)m + at;
	rc = 1;
out:
	free(k);
	close(fd);
	return rc;
}

void cgen_pack_unmap(cgen_pack_entry *e)
{
	if (e->map)
		munmap(e->map, e->maplen);
	memset(e, 0, sizeof *e);
}

bool cgen_pack_store(const cgen_cache *c, const char *key, size_t keylen, const void *data, size_t len)
{
	if (c->dir < 0)
		return false;
	char name[48];
	entry_name(key, keylen, ".pack", name);
	unsigned char hdr[PHDR];
	uint64_t sum = pack_checksum(data, len, keylen);
	pack_hdr(c->secret, key, keylen, len, sum, hdr);
	static const unsigned char zero[64];
	part parts[] = {{hdr, sizeof hdr}, {key, keylen}, {zero, (size_t)(pack_data_at(keylen) - PHDR - keylen)}, {data, len}};
	/* the bytes just written are the data summed: their inode is stamped */
	struct stat st;
	if (!write_entry(c, name, parts, 4, &st))
		return false;
	stamp_write(c, name, &st, sum);
	return true;
}
