/* The JIT cache as a security boundary (backend-c/jit_cache.c, sha256.c).
 *
 * - SHA-256 on the FIPS 180 examples and HMAC-SHA256 on the RFC 4231 test
 *   cases (the expected values are the published ones);
 * - the keyed check: an entry with a valid header and an FNV-style or wrong
 *   MAC, another layer's object under this layer's key, another layer's whole
 *   entry under this name, a v1 entry, a truncated one: each is a failed check
 *   (-1), never returned; a store rewrites it;
 * - an entry planted by another uid (a child process that drops to nobody)
 *   holding another layer's object: the run reports "bad", computes this
 *   layer's result (the other object never ran) and rewrites the entry;
 * - the root: owned by another user or writable by group/others, or a key file
 *   of the wrong mode: a warning and no cache; HOME=/nonexistent creates
 *   nothing; a FIFO entry does not block; an 8 GiB sparse entry is refused
 *   before a byte is read (peak RSS stays small); a symlink is not followed. */
#define _DEFAULT_SOURCE /* setgroups */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend-c/cgen.h"
#include "moec/moec.h"
#include "host_layer.h"
#include "hostile_util.h"

#define NOBODY 65534

static void hex(const unsigned char *d, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha(const void *m, size_t n, const char *want)
{
	cgen_sha256 s;
	unsigned char d[32];
	char h[65];
	cgen_sha256_init(&s);
	/* fed in uneven pieces, so the buffering is exercised */
	const unsigned char *p = m;
	for (size_t k = 0, step = 1; k < n; k += step, step = step * 3 % 97 + 1)
		cgen_sha256_update(&s, p + k, step < n - k ? step : n - k);
	cgen_sha256_final(&s, d);
	hex(d, 32, h);
	assert_string_equal(h, want);
}

static void test_sha256_fips(void **st)
{
	(void)st;
	check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	check_sha(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	char *ma = malloc(1000000);
	assert_non_null(ma);
	memset(ma, 'a', 1000000);
	check_sha(ma, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(ma);
}

static void test_hmac_rfc4231(void **st)
{
	(void)st;
	unsigned char k1[20], k3[20], d3[50], k4[25], d4[50], k5[20], k6[131];
	memset(k1, 0x0b, sizeof k1);
	memset(k3, 0xaa, sizeof k3);
	memset(d3, 0xdd, sizeof d3);
	for (int i = 0; i < 25; i++)
		k4[i] = (unsigned char)(i + 1);
	memset(d4, 0xcd, sizeof d4);
	memset(k5, 0x0c, sizeof k5);
	memset(k6, 0xaa, sizeof k6);
	const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
	const char *t7 = "This is a test using a larger than block-size key and a larger than block-size data. The key needs "
			 "to be hashed before being used by the HMAC algorithm.";
	const struct {
		const void *key;
		size_t klen;
		const void *data;
		size_t dlen;
		const char *mac; /* RFC 4231 section 4; case 5 is truncated to 128 bits */
	} tc[] = {
		{k1, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
		{"Jefe", 4, "what do ya want for nothing?", 28, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
		{k3, 20, d3, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
		{k4, 25, d4, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
		{k5, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b"},
		{k6, 131, t6, strlen(t6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
		{k6, 131, t7, strlen(t7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
	};
	for (size_t i = 0; i < sizeof tc / sizeof *tc; i++) {
		cgen_hmac h;
		unsigned char d[32];
		char s[65];
		cgen_hmac_init(&h, tc[i].key, tc[i].klen);
		cgen_hmac_update(&h, tc[i].data, tc[i].dlen / 2);
		cgen_hmac_update(&h, (const char *)tc[i].data + tc[i].dlen / 2, tc[i].dlen - tc[i].dlen / 2);
		cgen_hmac_final(&h, d);
		hex(d, 32, s);
		s[strlen(tc[i].mac)] = 0;
		if (strcmp(s, tc[i].mac))
			fail_msg("RFC 4231 case %zu: %s, want %s", i + 1, s, tc[i].mac);
	}
}

/* ---- helpers ---- */

static char *make_dir(void)
{
	char *d = strdup("/tmp/moec-jitcache-XXXXXX");
	assert_non_null(mkdtemp(d));
	return d;
}

static void remove_dir(char *d)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "chmod -R u+rwx %s; rm -rf %s", d, d);
	assert_int_equal(system(cmd), 0);
	free(d);
}

static void entry_path(const cgen_cache *c, char *p, size_t n)
{
	snprintf(p, n, "%s/%s", c->root, c->name);
}

static void put_file(const char *path, const void *a, size_t na, const void *b, size_t nb, const void *d, size_t nd)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(a, 1, na, f), na);
	assert_int_equal(fwrite(b, 1, nb, f), nb);
	assert_int_equal(fwrite(d, 1, nd, f), nd);
	assert_int_equal(fclose(f), 0);
}

/* The first warning of c ("" when none). */
static const char *warning(moe_ctx *c)
{
	for (size_t i = 0; i < moe_diag_count(c); i++) {
		moe_diag_kind k;
		const char *m;
		moe_diag_get(c, i, &k, NULL, &m);
		if (k == MOE_DIAG_WARNING)
			return m;
	}
	return "";
}

static int load(const cgen_cache *c, const char *want)
{
	void *obj;
	size_t len;
	int r = cgen_cache_load(c, &obj, &len);
	if (r == 1) {
		assert_int_equal(len, strlen(want));
		assert_memory_equal(obj, want, len);
		free(obj);
	}
	return r;
}

static void test_keyed_check(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char *d = make_dir();
	const char *ka = "key text of layer A", *kb = "key text of layer B";
	const char *oa = "\x7f" "ELF object of A", *ob = "\x7f" "ELF object of B, longer";
	cgen_cache a, b;
	assert_true(cgen_cache_open(ctx, &a, d, ka, strlen(ka)));
	assert_true(cgen_cache_open(ctx, &b, d, kb, strlen(kb)));
	assert_string_equal(warning(ctx), "");
	assert_memory_equal(a.secret, b.secret, CGEN_CACHE_SECRET); /* one key per root */
	{ /* the key file: 32 bytes, mode 0600 */
		char kp[512];
		snprintf(kp, sizeof kp, "%s/key", d);
		struct stat s;
		assert_int_equal(stat(kp, &s), 0);
		assert_int_equal(s.st_mode & 0777, 0600);
		assert_int_equal(s.st_size, CGEN_CACHE_SECRET);
	}
	assert_int_equal(load(&a, oa), 0);
	assert_true(cgen_cache_store(&a, oa, strlen(oa)));
	assert_true(cgen_cache_store(&b, ob, strlen(ob)));
	assert_int_equal(load(&a, oa), 1);
	assert_int_equal(load(&b, ob), 1);
	char pa[4200], pb[4200];
	entry_path(&a, pa, sizeof pa);
	entry_path(&b, pb, sizeof pb);
	{
		struct stat s;
		assert_int_equal(stat(pa, &s), 0);
		assert_int_equal(s.st_mode & 0777, 0600);
	}
	unsigned char hdr[CGEN_CACHE_HDR], zero[CGEN_CACHE_SECRET] = {0};
	/* 1. a valid header whose MAC is the object's FNV-1a (as the v1 format had it) */
	cgen_cache_mac(a.secret, ka, strlen(ka), ob, strlen(ob), hdr);
	uint64_t h = 0xcbf29ce484222325ull;
	for (const char *p = ob; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	memset(hdr + 24, 0, 32);
	memcpy(hdr + 24, &h, 8);
	put_file(pa, hdr, sizeof hdr, ka, strlen(ka), ob, strlen(ob));
	assert_int_equal(load(&a, oa), -1);
	/* 2. another layer's object under A's key text, MAC'd with a guessed secret */
	cgen_cache_mac(zero, ka, strlen(ka), ob, strlen(ob), hdr);
	put_file(pa, hdr, sizeof hdr, ka, strlen(ka), ob, strlen(ob));
	assert_int_equal(load(&a, oa), -1);
	/* 3. B's genuine entry copied under A's name: its key text is not A's */
	cgen_cache_mac(b.secret, kb, strlen(kb), ob, strlen(ob), hdr);
	put_file(pa, hdr, sizeof hdr, kb, strlen(kb), ob, strlen(ob));
	assert_int_equal(load(&a, oa), -1);
	/* 4. A's header and key with B's object (the MAC covers the object) */
	cgen_cache_mac(a.secret, ka, strlen(ka), oa, strlen(oa), hdr);
	put_file(pa, hdr, sizeof hdr, ka, strlen(ka), ob, strlen(ob));
	assert_int_equal(load(&a, oa), -1);
	/* 5. one flipped bit in a genuine entry's MAC; a truncated entry */
	cgen_cache_mac(a.secret, ka, strlen(ka), oa, strlen(oa), hdr);
	hdr[40] ^= 1;
	put_file(pa, hdr, sizeof hdr, ka, strlen(ka), oa, strlen(oa));
	assert_int_equal(load(&a, oa), -1);
	hdr[40] ^= 1;
	put_file(pa, hdr, sizeof hdr, ka, strlen(ka), oa, strlen(oa) - 1);
	assert_int_equal(load(&a, oa), -1);
	/* the genuine bytes load; a store rewrites a failed entry */
	put_file(pa, hdr, sizeof hdr, ka, strlen(ka), oa, strlen(oa));
	assert_int_equal(load(&a, oa), 1);
	put_file(pa, "junk", 4, "", 0, "", 0);
	assert_int_equal(load(&a, oa), -1);
	assert_true(cgen_cache_store(&a, oa, strlen(oa)));
	assert_int_equal(load(&a, oa), 1);
	/* a symbolic link is not followed, even to a genuine entry */
	assert_int_equal(unlink(pa), 0);
	assert_int_equal(symlink(pb, pa), 0);
	assert_int_equal(load(&a, oa), -1);
	assert_true(cgen_cache_store(&a, oa, strlen(oa))); /* replaces the link */
	assert_int_equal(load(&a, oa), 1);
	/* an entry owned by another user is not used */
	if (geteuid() == 0) {
		assert_int_equal(chown(pa, NOBODY, NOBODY), 0);
		assert_int_equal(load(&a, oa), -1);
	} else {
		fprintf(stderr, "skipped: an entry owned by another uid needs root to chown (running as uid %u)\n",
			(unsigned)geteuid());
	}
	/* no temporaries are left */
	char cmd[600];
	snprintf(cmd, sizeof cmd, "test -z \"$(ls %s | grep tmp)\"", d);
	assert_int_equal(system(cmd), 0);
	cgen_cache_close(&a);
	cgen_cache_close(&b);
	remove_dir(d);
	moe_ctx_free(ctx);
}

static void test_root_and_key_checks(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char *d = make_dir();
	char root[512], kp[600];
	snprintf(root, sizeof root, "%s/c", d);
	cgen_cache c;
	assert_true(cgen_cache_open(ctx, &c, root, "k", 1));
	cgen_cache_close(&c);
	/* writable by the group or others: warned, off */
	assert_int_equal(chmod(root, 0770), 0);
	assert_false(cgen_cache_open(ctx, &c, root, "k", 1));
	assert_non_null(strstr(warning(ctx), "writable by group or others: the cache is off"));
	moe_diag_clear(ctx);
	assert_int_equal(chmod(root, 0700), 0);
	/* the key file of the wrong mode, and not a regular file */
	snprintf(kp, sizeof kp, "%s/key", root);
	assert_int_equal(chmod(kp, 0644), 0);
	assert_false(cgen_cache_open(ctx, &c, root, "k", 1));
	assert_non_null(strstr(warning(ctx), "key file 'key' is not a 32-byte regular file of mode 0600"));
	moe_diag_clear(ctx);
	assert_int_equal(unlink(kp), 0);
	assert_int_equal(mkfifo(kp, 0600), 0);
	alarm(10); /* a FIFO must not block */
	assert_false(cgen_cache_open(ctx, &c, root, "k", 1));
	alarm(0);
	assert_non_null(strstr(warning(ctx), "key file"));
	moe_diag_clear(ctx);
	assert_int_equal(unlink(kp), 0);
	/* owned by another user */
	if (geteuid() == 0) {
		assert_int_equal(chown(root, NOBODY, NOBODY), 0);
		assert_false(cgen_cache_open(ctx, &c, root, "k", 1));
		assert_non_null(strstr(warning(ctx), "owned by another user: the cache is off"));
		moe_diag_clear(ctx);
		assert_int_equal(chown(root, 0, 0), 0);
	} else {
		fprintf(stderr, "skipped: a cache root of another uid needs root to chown\n");
	}
	assert_true(cgen_cache_open(ctx, &c, root, "k", 1)); /* a new key is made */
	cgen_cache_close(&c);
	/* the default location: only the XDG directory and the root are made, below an existing one */
	char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL, *xdg = getenv("XDG_CACHE_HOME") ?
		strdup(getenv("XDG_CACHE_HOME")) : NULL;
	unsetenv("XDG_CACHE_HOME");
	setenv("HOME", "/nonexistent-moec-home", 1);
	assert_false(cgen_cache_open(ctx, &c, NULL, "k", 1));
	struct stat s;
	assert_int_not_equal(stat("/nonexistent-moec-home", &s), 0);
	assert_string_equal(warning(ctx), "");
	char xd[600];
	snprintf(xd, sizeof xd, "%s/x/y", d);
	setenv("XDG_CACHE_HOME", xd, 1); /* its parent d/x does not exist */
	assert_false(cgen_cache_open(ctx, &c, NULL, "k", 1));
	snprintf(xd, sizeof xd, "%s/x", d);
	assert_int_not_equal(stat(xd, &s), 0);
	setenv("XDG_CACHE_HOME", xd, 1);
	assert_true(cgen_cache_open(ctx, &c, NULL, "k", 1));
	snprintf(root, sizeof root, "%s/x/moec", d);
	assert_string_equal(c.root, root);
	assert_int_equal(stat(root, &s), 0);
	assert_int_equal(s.st_mode & 0777, 0700);
	cgen_cache_close(&c);
	if (home)
		setenv("HOME", home, 1);
	else
		unsetenv("HOME");
	if (xdg)
		setenv("XDG_CACHE_HOME", xdg, 1);
	else
		unsetenv("XDG_CACHE_HOME");
	free(home);
	free(xdg);
	remove_dir(d);
	moe_ctx_free(ctx);
}

static void test_fifo_and_huge_entries(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char *d = make_dir();
	cgen_cache c;
	assert_true(cgen_cache_open(ctx, &c, d, "fifo key", 8));
	char p[4200];
	entry_path(&c, p, sizeof p);
	/* a FIFO with no writer: refused at once, then replaced by a store */
	assert_int_equal(mkfifo(p, 0600), 0);
	alarm(10);
	assert_int_equal(load(&c, "obj"), -1);
	alarm(0);
	assert_true(cgen_cache_store(&c, "obj", 3));
	assert_int_equal(load(&c, "obj"), 1);
	/* an 8 GiB sparse entry: refused from its length, before a byte is read */
	int fd = open(p, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)8 << 30), 0);
	close(fd);
	double t0 = now();
	assert_int_equal(load(&c, "obj"), -1);
	double t = now() - t0;
	struct rusage ru;
	assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
	fprintf(stderr, "8 GiB sparse entry refused in %.6f s; peak RSS of the test %ld MiB\n", t, ru.ru_maxrss / 1024);
	assert_true(t < 1.0);
	assert_true(ru.ru_maxrss < 1024 * 1024); /* KiB: under 1 GiB */
	/* the largest object an entry may hold, plus one byte: refused likewise */
	fd = open(p, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)(CGEN_CACHE_HDR + 8 + CGEN_CACHE_MAX_OBJECT + 1)), 0);
	close(fd);
	assert_int_equal(load(&c, "obj"), -1);
	assert_true(cgen_cache_store(&c, "obj", 3));
	assert_int_equal(load(&c, "obj"), 1);
	cgen_cache_close(&c);
	remove_dir(d);
	moe_ctx_free(ctx);
}

/* ---- a planted entry through a real run ---- */

static const char layer_a[] = "layer l {\n  dim T = 4\n  input x : [T]\n  y = x + x\n  output y\n}\n";
static const char layer_b[] = "layer l {\n  dim T = 4\n  input x : [T]\n  y = x * x\n  output y\n}\n";

static moe_host_cache run(moe_ctx *c, moe_graph *g, const char *dir, float *y)
{
	moe_tensor_map *b = moe_tensor_map_new(c);
	int64_t s[1] = {4};
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 1, s);
	for (int i = 0; i < 4; i++)
		((float *)x->data)[i] = (float)(i + 1);
	assert_int_equal(moe_tensor_map_set(b, "x", x), MOE_OK);
	moe_host_opts o;
	moe_host_opts_init(&o);
	o.threads = 1;
	o.cache_dir = dir;
	moe_host_stats stt;
	moe_tensor *out[1] = {NULL};
	moe_status r = moe_host_run_opts(c, g, b, &o, out, &stt);
	if (r)
		moe_diag_print(c, stderr);
	assert_int_equal(r, MOE_OK);
	memcpy(y, out[0]->data, 4 * sizeof *y);
	moe_tensor_free(c, out[0]);
	moe_tensor_map_free(b);
	return stt.cache;
}

static unsigned char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *b = malloc(*n);
	assert_non_null(b);
	assert_int_equal(fread(b, 1, *n, f), *n);
	fclose(f);
	return b;
}

/* the .jit entries of dir, in the order ls gives */
static int entries(const char *dir, char names[2][512])
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "ls -t %s/*.jit", dir);
	FILE *f = popen(cmd, "r");
	assert_non_null(f);
	int n = 0;
	while (n < 2 && fgets(names[n], 512, f))
		names[n][strcspn(names[n], "\n")] = 0, n++;
	pclose(f);
	return n;
}

static void test_planted_entry_never_runs(void **st)
{
	(void)st;
	if (geteuid() != 0) {
		fprintf(stderr, "skipped: planting an entry as another uid needs root (to setuid to nobody); running as uid "
				"%u\n",
			(unsigned)geteuid());
		skip();
	}
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *d = make_dir();
	char root[512];
	snprintf(root, sizeof root, "%s/cache", d);
	moe_module *ma, *mb;
	moe_graph *ga = host_layer(c, "a.moe", layer_a, strlen(layer_a), NULL, &ma);
	moe_graph *gb = host_layer(c, "b.moe", layer_b, strlen(layer_b), NULL, &mb);
	float ya[4], yb[4], y[4];
	assert_int_equal(run(c, gb, root, yb), MOE_CACHE_MISS);
	char names[2][512];
	assert_int_equal(entries(root, names), 1);
	char pb[512];
	strcpy(pb, names[0]);
	assert_int_equal(run(c, ga, root, ya), MOE_CACHE_MISS);
	assert_int_equal(entries(root, names), 2);
	char pa[512];
	strcpy(pa, strcmp(names[0], pb) ? names[0] : names[1]);
	for (int i = 0; i < 4; i++) {
		assert_true(ya[i] == 2.0f * (float)(i + 1));
		assert_true(yb[i] == (float)((i + 1) * (i + 1)));
	}
	/* A's entry with B's object, a valid header and an FNV-1a where the MAC goes, written by nobody */
	size_t na, nb;
	unsigned char *ea = slurp(pa, &na), *eb = slurp(pb, &nb);
	uint64_t kla, klb;
	memcpy(&kla, ea + 8, 8);
	memcpy(&klb, eb + 8, 8);
	const unsigned char *objb = eb + CGEN_CACHE_HDR + klb;
	uint64_t olb = nb - CGEN_CACHE_HDR - klb, h = 0xcbf29ce484222325ull;
	for (uint64_t i = 0; i < olb; i++)
		h = (h ^ objb[i]) * 0x100000001b3ull;
	unsigned char hdr[CGEN_CACHE_HDR] = {0};
	memcpy(hdr, ea, 16);
	memcpy(hdr + 16, &olb, 8);
	memcpy(hdr + 24, &h, 8);
	assert_int_equal(chmod(d, 0711), 0);
	assert_int_equal(chmod(root, 0777), 0); /* so that nobody can write there */
	assert_int_equal(unlink(pa), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))
			_exit(2);
		char kp[600];
		snprintf(kp, sizeof kp, "%s/key", root);
		if (open(kp, O_RDONLY) >= 0 || errno != EACCES) /* the secret is out of its reach */
			_exit(3);
		FILE *f = fopen(pa, "wb");
		if (!f || fwrite(hdr, 1, sizeof hdr, f) != sizeof hdr || fwrite(ea + CGEN_CACHE_HDR, 1, kla, f) != kla ||
			fwrite(objb, 1, olb, f) != olb || fclose(f))
			_exit(4);
		_exit(0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	struct stat s;
	assert_int_equal(stat(pa, &s), 0);
	assert_int_equal(s.st_uid, NOBODY);
	/* while the root is writable by others, there is no cache at all */
	assert_int_equal(run(c, ga, root, y), MOE_CACHE_OFF);
	assert_memory_equal(y, ya, sizeof y);
	assert_non_null(strstr(warning(c), "writable by group or others"));
	moe_diag_clear(c);
	assert_int_equal(chmod(root, 0700), 0);
	/* the planted entry fails the checks (owner, MAC): A's own result, not B's */
	assert_int_equal(run(c, ga, root, y), MOE_CACHE_BAD);
	assert_memory_equal(y, ya, sizeof y);
	/* the same bytes owned by the user still fail (the MAC) */
	put_file(pa, hdr, sizeof hdr, ea + CGEN_CACHE_HDR, kla, objb, olb);
	assert_int_equal(run(c, ga, root, y), MOE_CACHE_BAD);
	assert_memory_equal(y, ya, sizeof y);
	/* rewritten by that run: a hit, owned by the user */
	assert_int_equal(run(c, ga, root, y), MOE_CACHE_HIT);
	assert_memory_equal(y, ya, sizeof y);
	assert_int_equal(stat(pa, &s), 0);
	assert_int_equal(s.st_uid, 0);
	free(ea);
	free(eb);
	moe_module_free(ma);
	moe_module_free(mb);
	remove_dir(d);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha256_fips),
		cmocka_unit_test(test_hmac_rfc4231),
		cmocka_unit_test(test_keyed_check),
		cmocka_unit_test(test_root_and_key_checks),
		cmocka_unit_test(test_fifo_and_huge_entries),
		cmocka_unit_test(test_planted_entry_never_runs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
