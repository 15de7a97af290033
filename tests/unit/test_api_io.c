/* Direct tests of public functions of moec/io.h against their documented
 * contracts (io.h, docs/api.md): reading a stream, opening and writing
 * outputs, removing temporaries, safetensors dtype names and paths, and
 * binding weights from an open checkpoint (whole or a row at a time).
 * Expected values are written out by hand. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "moec/io.h"

#define SCRATCH_NAME "moec_api_io"
#include "scratch_dir.h"

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *buf = malloc(1 << 20);
	*len = fread(buf, 1, 1 << 20, f);
	fclose(f);
	return buf;
}

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* The diagnostic text, asserting there is an error. */
static char *diags(moe_ctx *c)
{
	assert_true(moe_error_count(c) > 0);
	return moe_diag_string(c);
}

static void assert_diag(moe_ctx *c, const char *want)
{
	char *s = diags(c);
	if (!strstr(s, want))
		fail_msg("wanted '%s' in:\n%s", want, s);
	moe_free(c, s);
	moe_diag_clear(c);
}

/* ---- moe_read_stream ---- */

static void test_read_stream(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	int p[2];
	char *data;
	size_t len;

	/* a pipe to its end: the bytes, a NUL after them */
	assert_int_equal(pipe(p), 0);
	assert_int_equal(write(p[1], "hello\0world", 11), 11);
	close(p[1]);
	assert_int_equal(moe_read_stream(c, "<stdin>", p[0], 0, &data, &len), MOE_OK);
	close(p[0]);
	assert_int_equal(len, 11);
	assert_memory_equal(data, "hello\0world", 12);
	moe_free(c, data);

	/* an empty stream: an empty NUL-terminated buffer */
	assert_int_equal(pipe(p), 0);
	close(p[1]);
	assert_int_equal(moe_read_stream(c, "<stdin>", p[0], 0, &data, &len), MOE_OK);
	close(p[0]);
	assert_int_equal(len, 0);
	assert_non_null(data);
	assert_int_equal(data[0], 0);
	moe_free(c, data);

	/* max: exactly max bytes pass, one more is an error naming the stream */
	for (int extra = 0; extra < 2; extra++) {
		assert_int_equal(pipe(p), 0);
		assert_int_equal(write(p[1], "abcdef", 5 + (size_t)extra), 5 + extra);
		close(p[1]);
		moe_status s = moe_read_stream(c, "<pipe>", p[0], 5, &data, &len);
		close(p[0]);
		if (!extra) {
			assert_int_equal(s, MOE_OK);
			assert_string_equal(data, "abcde");
			moe_free(c, data);
		} else {
			assert_int_equal(s, MOE_ERR_IO);
			assert_null(data);
			assert_int_equal(len, 0);
			assert_diag(c, "<pipe>: error: more than 5 bytes: input too large");
		}
	}

	/* a descriptor of a regular file, larger than one read buffer */
	char path[PATH_MAX];
	tpath(path, sizeof path, "big.bin");
	FILE *f = fopen(path, "wb");
	for (int i = 0; i < 200000; i++)
		fputc('a' + i % 26, f);
	fclose(f);
	int fd = open(path, O_RDONLY);
	assert_int_equal(moe_read_stream(c, path, fd, 0, &data, &len), MOE_OK);
	close(fd);
	assert_int_equal(len, 200000);
	for (int i = 0; i < 200000; i++)
		if (data[i] != 'a' + i % 26)
			fail_msg("byte %d differs", i);
	assert_int_equal(data[len], 0);
	moe_free(c, data);
	unlink(path);

	/* a bad descriptor: a read error with the name */
	assert_int_equal(moe_read_stream(c, "<closed>", -1, 0, &data, &len), MOE_ERR_IO);
	assert_null(data);
	assert_diag(c, "<closed>: error: read failed: ");
	moe_ctx_free(c);
}

/* ---- moe_output_open and moe_write_output ---- */

static void test_output_open_regular(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char path[PATH_MAX];
	tpath(path, sizeof path, "out.txt");
	/* a new file: written to out.txt.tmp.XXXXXX beside it, renamed on commit */
	moe_atomic_file *f = moe_output_open(c, path, MOE_OUTPUT_BINARY);
	assert_non_null(f);
	fputs("first", moe_atomic_stream(f));
	assert_int_equal(count_entries("out.txt.tmp."), 1);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(moe_atomic_commit(f), MOE_OK);
	assert_int_equal(count_entries("out.txt.tmp."), 0);
	size_t len;
	char *got = slurp(path, &len);
	assert_int_equal(len, 5);
	assert_memory_equal(got, "first", 5);
	free(got);
	/* an existing file: replaced only on commit; abort leaves it */
	f = moe_output_open(c, path, 0);
	fputs("second", moe_atomic_stream(f));
	moe_atomic_abort(f);
	got = slurp(path, &len);
	assert_memory_equal(got, "first", 5);
	free(got);
	assert_int_equal(count_entries(".tmp."), 0);

	/* a symbolic link: its target is replaced, the link stays */
	char link[PATH_MAX];
	tpath(link, sizeof link, "link.txt");
	assert_int_equal(symlink(path, link), 0);
	assert_int_equal(moe_write_output(c, link, 0, "via link", 8), MOE_OK);
	struct stat sb;
	assert_int_equal(lstat(link, &sb), 0);
	assert_true(S_ISLNK(sb.st_mode));
	got = slurp(path, &len);
	assert_int_equal(len, 8);
	assert_memory_equal(got, "via link", 8);
	free(got);
	unlink(link);

	/* a long base name: the temporary's name is shortened to fit NAME_MAX */
	char name[NAME_MAX + 1];
	memset(name, 'n', NAME_MAX);
	name[NAME_MAX] = 0;
	char lpath[PATH_MAX];
	tpath(lpath, sizeof lpath, name);
	f = moe_output_open(c, lpath, 0);
	assert_non_null(f);
	assert_int_equal(count_entries(".tmp."), 1);
	fputs("x", moe_atomic_stream(f));
	assert_int_equal(moe_atomic_commit(f), MOE_OK);
	got = slurp(lpath, &len);
	assert_int_equal(len, 1);
	free(got);
	unlink(lpath);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

static void test_output_open_refused(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char path[PATH_MAX];
	/* a directory */
	tpath(path, sizeof path, "adir");
	assert_int_equal(mkdir(path, 0700), 0);
	assert_null(moe_output_open(c, path, 0));
	assert_diag(c, "adir: error: the output is a directory");
	assert_int_equal(moe_write_output(c, path, 0, "x", 1), MOE_ERR_IO);
	assert_diag(c, "the output is a directory");
	rmdir(path);
	/* a socket */
	tpath(path, sizeof path, "sock");
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	assert_true(strlen(path) < sizeof sa.sun_path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_null(moe_output_open(c, path, 0));
	assert_diag(c, "moec replaces only regular files");
	close(s);
	unlink(path);
	/* a directory that does not exist: nothing is created */
	tpath(path, sizeof path, "nodir/out.bin");
	assert_int_equal(moe_write_output(c, path, MOE_OUTPUT_BINARY, "x", 1), MOE_ERR_IO);
	assert_diag(c, "cannot create a temporary file beside it");
	assert_int_equal(count_entries("nodir"), 0);
	/* a FIFO without a reader: an error at once, never a hang */
	tpath(path, sizeof path, "fifo");
	assert_int_equal(mkfifo(path, 0600), 0);
	assert_null(moe_output_open(c, path, 0));
	assert_diag(c, "it is a FIFO with no reader");
	moe_ctx_free(c);
}

/* A FIFO with a reader and a character device are written straight through,
 * never replaced; with MOE_OUTPUT_BINARY a terminal is refused. */
static void test_output_open_through(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char path[PATH_MAX];
	tpath(path, sizeof path, "fifo2");
	assert_int_equal(mkfifo(path, 0600), 0);
	int rd = open(path, O_RDONLY | O_NONBLOCK);
	assert_true(rd >= 0);
	assert_int_equal(moe_write_output(c, path, MOE_OUTPUT_BINARY, "piped", 5), MOE_OK);
	char buf[16] = {0};
	assert_int_equal(read(rd, buf, sizeof buf), 5);
	assert_string_equal(buf, "piped");
	close(rd);
	struct stat sb;
	assert_int_equal(lstat(path, &sb), 0);
	assert_true(S_ISFIFO(sb.st_mode)); /* not replaced by a regular file */
	assert_int_equal(count_entries(".tmp."), 0);
	unlink(path);

	assert_int_equal(moe_write_output(c, "/dev/null", MOE_OUTPUT_BINARY, "gone", 4), MOE_OK);
	assert_int_equal(stat("/dev/null", &sb), 0);
	assert_true(S_ISCHR(sb.st_mode));

	/* a terminal: a pseudo-terminal's slave side */
	int m = posix_openpt(O_RDWR | O_NOCTTY);
	if (m < 0 || grantpt(m) || unlockpt(m)) {
		if (m >= 0)
			close(m);
		moe_ctx_free(c);
		skip(); /* no pseudo-terminals here */
	}
	const char *tty = ptsname(m);
	assert_non_null(tty);
	assert_null(moe_output_open(c, tty, MOE_OUTPUT_BINARY));
	assert_diag(c, "refusing to write a binary file to a terminal");
	assert_int_equal(moe_write_output(c, tty, MOE_OUTPUT_BINARY, "bin", 3), MOE_ERR_IO);
	assert_diag(c, "refusing to write a binary file to a terminal");
	/* text may go to a terminal */
	moe_atomic_file *f = moe_output_open(c, tty, 0);
	assert_non_null(f);
	fputs("text\n", moe_atomic_stream(f));
	assert_int_equal(moe_atomic_commit(f), MOE_OK);
	close(m);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

static void test_write_output(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char path[PATH_MAX];
	tpath(path, sizeof path, "w.bin");
	static const unsigned char bytes[5] = {0, 1, 0xff, '\n', 0};
	assert_int_equal(moe_write_output(c, path, MOE_OUTPUT_BINARY, bytes, sizeof bytes), MOE_OK);
	size_t len;
	char *got = slurp(path, &len);
	assert_int_equal(len, 5);
	assert_memory_equal(got, bytes, 5);
	free(got);
	/* an ordinary file's mode, not mkstemp's 0600 (umask permitting) */
	struct stat sb;
	assert_int_equal(stat(path, &sb), 0);
	mode_t um = umask(0);
	umask(um);
	assert_int_equal(sb.st_mode & 0777, 0666 & ~um);
	/* len 0: an empty file replaces the old one */
	assert_int_equal(moe_write_output(c, path, 0, NULL, 0), MOE_OK);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_size, 0);
	assert_int_equal(count_entries(".tmp."), 0);
	unlink(path);
	assert_int_equal(moe_error_count(c), 0);
	moe_ctx_free(c);
}

/* moe_remove_temporaries removes the temporaries that exist; the output's
 * commit then fails and PATH stays as it was. */
static void test_remove_temporaries(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char path[PATH_MAX];
	tpath(path, sizeof path, "keep.txt");
	put_file(path, "old");
	moe_atomic_file *a = moe_output_open(c, path, 0);
	char path2[PATH_MAX];
	tpath(path2, sizeof path2, "new.txt");
	moe_atomic_file *b = moe_output_open(c, path2, 0);
	assert_non_null(a);
	assert_non_null(b);
	fputs("replacement", moe_atomic_stream(a));
	assert_int_equal(count_entries(".tmp."), 2);
	moe_remove_temporaries();
	assert_int_equal(count_entries(".tmp."), 0);
	moe_remove_temporaries(); /* nothing left: harmless */
	assert_int_equal(moe_atomic_commit(a), MOE_ERR_IO);
	assert_diag(c, "cannot rename the temporary into place");
	size_t len;
	char *got = slurp(path, &len);
	assert_int_equal(len, 3);
	assert_memory_equal(got, "old", 3);
	free(got);
	moe_atomic_abort(b);
	assert_int_equal(access(path2, F_OK), -1);
	/* a committed output is no longer a temporary: not removed */
	assert_int_equal(moe_write_output(c, path2, 0, "kept", 4), MOE_OK);
	moe_remove_temporaries();
	assert_int_equal(access(path2, F_OK), 0);
	unlink(path2);
	unlink(path);
	moe_ctx_free(c);
}

/* moe_temp_file / moe_temp_dir make listed temporaries (a file of mode
 * 0600, a directory), moe_temp_track lists an existing path, and
 * moe_remove_temporaries removes what is listed and not forgotten; the
 * table holds 1280 at once. */
static void test_temp_table(void **st)
{
	(void)st;
	char f[PATH_MAX], d[PATH_MAX], t[PATH_MAX + 16], kept[PATH_MAX];
	int sf, sd, sk;
	snprintf(f, sizeof f, "%s/file.XXXXXX", tmpdir);
	int fd = moe_temp_file(f, &sf);
	assert_true(fd >= 0);
	assert_true(sf >= 0);
	assert_null(strstr(f, "XXXXXX")); /* completed in place */
	struct stat sb;
	assert_int_equal(fstat(fd, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0600);
	close(fd);
	snprintf(d, sizeof d, "%s/dir.XXXXXX", tmpdir);
	assert_ptr_equal(moe_temp_dir(d, &sd), d);
	assert_true(sd >= 0);
	assert_int_equal(stat(d, &sb), 0);
	assert_true(S_ISDIR(sb.st_mode));
	snprintf(t, sizeof t, "%s/out.ll", d); /* a file in the directory, listed by name */
	put_file(t, "x");
	assert_true(moe_temp_track(t) >= 0);
	snprintf(kept, sizeof kept, "%s/kept.XXXXXX", tmpdir);
	fd = moe_temp_file(kept, &sk);
	assert_true(fd >= 0);
	close(fd);
	moe_temp_forget(sk); /* renamed or kept by its owner: not removed */
	moe_temp_forget(-1); /* a no-op */
	moe_remove_temporaries();
	assert_int_equal(access(f, F_OK), -1);
	assert_int_equal(access(t, F_OK), -1);
	assert_int_equal(access(d, F_OK), -1); /* emptied first, then removed */
	assert_int_equal(access(kept, F_OK), 0);
	unlink(kept);
	/* 1280 listed at once, then -1 */
	static int slots[1281];
	for (int i = 0; i < 1280; i++) {
		slots[i] = moe_temp_track("/nonexistent/moec-api-io-temp");
		assert_true(slots[i] >= 0);
	}
	assert_int_equal(moe_temp_track("/nonexistent/moec-api-io-temp"), -1);
	for (int i = 0; i < 1280; i++)
		moe_temp_forget(slots[i]);
	int again = moe_temp_track("/nonexistent/moec-api-io-temp");
	assert_true(again >= 0);
	moe_temp_forget(again);
}

/* Writes text over the temporary an output set gave (as the library's
 * writers do: a new file renamed over it). */
static void replace_temp(const char *tmp, const char *text)
{
	char w[PATH_MAX];
	snprintf(w, sizeof w, "%s.w", tmp);
	put_file(w, text);
	assert_int_equal(rename(w, tmp), 0);
}

/* moe_output_set: every output is renamed into place only when all were
 * written; one unwritten fails the commit and leaves every target as it
 * was; abort removes the temporaries; a directory is refused. */
static void test_output_set(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char a[PATH_MAX], b[PATH_MAX];
	tpath(a, sizeof a, "a.out");
	tpath(b, sizeof b, "b.out");
	put_file(a, "old a");
	moe_output_set *s = moe_output_set_new(c);
	assert_non_null(s);
	const char *ta = moe_output_set_add(s, a), *tb = moe_output_set_add(s, b);
	assert_non_null(ta);
	assert_non_null(tb);
	assert_non_null(strstr(ta, "a.out.set."));
	assert_int_equal(count_entries(".set."), 2);
	replace_temp(ta, "new a");
	replace_temp(tb, "new b");
	assert_int_equal(moe_output_set_commit(s), MOE_OK);
	assert_int_equal(count_entries(".set."), 0);
	size_t len;
	char *got = slurp(a, &len);
	assert_int_equal(len, 5);
	assert_memory_equal(got, "new a", 5);
	free(got);
	got = slurp(b, &len);
	assert_int_equal(len, 5);
	assert_memory_equal(got, "new b", 5);
	free(got);
	/* b left unwritten: nothing is renamed */
	s = moe_output_set_new(c);
	ta = moe_output_set_add(s, a);
	assert_non_null(moe_output_set_add(s, b));
	replace_temp(ta, "third a");
	assert_int_equal(moe_output_set_commit(s), MOE_ERR_IO);
	assert_diag(c, "this output was not written; nothing was written");
	assert_int_equal(count_entries(".set."), 0);
	got = slurp(a, &len);
	assert_int_equal(len, 5);
	assert_memory_equal(got, "new a", 5);
	free(got);
	/* abort */
	s = moe_output_set_new(c);
	assert_non_null(moe_output_set_add(s, a));
	assert_int_equal(count_entries(".set."), 1);
	moe_output_set_abort(s);
	assert_int_equal(count_entries(".set."), 0);
	moe_output_set_abort(NULL);
	/* a directory */
	s = moe_output_set_new(c);
	assert_null(moe_output_set_add(s, tmpdir));
	assert_diag(c, "the output is a directory");
	moe_output_set_abort(s);
	unlink(a);
	unlink(b);
	moe_ctx_free(c);
}

/* ---- safetensors ---- */

/* A safetensors image of one tensor "t" of dtype `dt`, shape [n], nbytes of data. */
static unsigned char *mk_st(const char *dt, int n, size_t nbytes, size_t *len)
{
	char hdr[256];
	int hl = snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[0,%zu]}}", dt, n,
		nbytes);
	*len = 8 + (size_t)hl + nbytes;
	unsigned char *b = calloc(1, *len);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, hdr, (size_t)hl);
	return b;
}

/* moe_checkpoint_id: one line per file of its real path, device, inode,
 * size, modification time and the FNV-1a-64 of its header (computed here
 * byte by byte); NULL for what is not a regular .safetensors file. */
static void test_checkpoint_id(void **st)
{
	(void)st;
	char p1[PATH_MAX], p2[PATH_MAX], other[PATH_MAX];
	tpath(p1, sizeof p1, "one.safetensors");
	tpath(p2, sizeof p2, "two.safetensors");
	tpath(other, sizeof other, "one.bin");
	size_t len;
	unsigned char *img = mk_st("F32", 2, 8, &len);
	FILE *f = fopen(p1, "wb");
	assert_int_equal(fwrite(img, 1, len, f), len);
	fclose(f);
	f = fopen(p2, "wb");
	assert_int_equal(fwrite(img, 1, len, f), len);
	fclose(f);
	uint64_t hl = 0;
	for (int i = 0; i < 8; i++)
		hl |= (uint64_t)img[i] << (8 * i);
	uint64_t h = 14695981039346656037ull;
	for (uint64_t i = 0; i < hl; i++) {
		h ^= img[8 + i];
		h *= 1099511628211ull;
	}
	char want[2 * PATH_MAX + 256] = "";
	const char *paths[] = {p1, p2};
	for (int k = 0; k < 2; k++) {
		char real[PATH_MAX];
		struct stat sb;
		assert_non_null(realpath(paths[k], real));
		assert_int_equal(stat(real, &sb), 0);
		snprintf(want + strlen(want), sizeof want - strlen(want),
			"file %s dev %llu ino %llu size %lld mtime %lld.%09ld header %016llx\n", real,
			(unsigned long long)sb.st_dev, (unsigned long long)sb.st_ino, (long long)sb.st_size,
			(long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec, (unsigned long long)h);
	}
	char *id = moe_checkpoint_id(paths, 2);
	assert_non_null(id);
	assert_string_equal(id, want);
	free(id);
	/* another header: another digest */
	free(img);
	img = mk_st("BF16", 4, 8, &len);
	f = fopen(p2, "wb");
	assert_int_equal(fwrite(img, 1, len, f), len);
	fclose(f);
	id = moe_checkpoint_id(paths, 2);
	assert_non_null(id);
	assert_string_not_equal(id, want);
	free(id);
	/* not a .safetensors name, a directory, a missing file */
	rename(p1, other);
	const char *bad[] = {other, tmpdir, p1};
	for (int k = 0; k < 3; k++)
		assert_null(moe_checkpoint_id(&bad[k], 1));
	free(img);
	unlink(other);
	unlink(p2);
}

static void test_st_dtype_name(void **st)
{
	(void)st;
	/* the dtype spellings of the safetensors header format */
	static const struct {
		moe_st_dtype t;
		const char *name;
		int bits;
	} want[] = {{MOE_ST_BOOL, "BOOL", 8}, {MOE_ST_U8, "U8", 8}, {MOE_ST_I8, "I8", 8}, {MOE_ST_I16, "I16", 16},
		{MOE_ST_U16, "U16", 16}, {MOE_ST_F16, "F16", 16}, {MOE_ST_BF16, "BF16", 16}, {MOE_ST_I32, "I32", 32},
		{MOE_ST_U32, "U32", 32}, {MOE_ST_F32, "F32", 32}, {MOE_ST_I64, "I64", 64}, {MOE_ST_U64, "U64", 64},
		{MOE_ST_F64, "F64", 64}, {MOE_ST_F8_E4M3, "F8_E4M3", 8}, {MOE_ST_F8_E5M2, "F8_E5M2", 8},
		{MOE_ST_F8_E8M0, "F8_E8M0", 8}, {MOE_ST_F4, "F4", 4}};
	assert_int_equal(sizeof want / sizeof *want, MOE_ST_DTYPE_COUNT);
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
		assert_string_equal(moe_st_dtype_name(want[i].t), want[i].name);
		/* the reader takes the same spelling to the same dtype */
		size_t len;
		unsigned char *img = mk_st(want[i].name, 4, (size_t)want[i].bits * 4 / 8, &len);
		moe_safetensors *s = moe_safetensors_open_mem(c, "mem.safetensors", img, len);
		if (!s)
			moe_diag_print(c, stderr);
		assert_non_null(s);
		assert_int_equal(moe_safetensors_at(s, 0)->dtype, want[i].t);
		moe_safetensors_close(s);
		free(img);
	}
	assert_string_equal(moe_st_dtype_name(MOE_ST_DTYPE_COUNT), "?");
	assert_string_equal(moe_st_dtype_name((moe_st_dtype)-1), "?");
	moe_ctx_free(c);
}

static void test_safetensors_path(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t len;
	unsigned char *img = mk_st("F32", 2, 8, &len);
	char path[PATH_MAX];
	tpath(path, sizeof path, "model.safetensors");
	FILE *f = fopen(path, "wb");
	fwrite(img, 1, len, f);
	fclose(f);
	/* the path as given, also through a relative spelling */
	moe_safetensors *s = moe_safetensors_open(c, path);
	assert_non_null(s);
	assert_string_equal(moe_safetensors_path(s), path);
	moe_safetensors_close(s);
	char rel[PATH_MAX];
	snprintf(rel, sizeof rel, "%s/../%s/model.safetensors", tmpdir, strrchr(tmpdir, '/') + 1);
	s = moe_safetensors_open(c, rel);
	assert_non_null(s);
	assert_string_equal(moe_safetensors_path(s), rel);
	moe_safetensors_close(s);
	/* in memory: the name given, which the diagnostics use too */
	char name[] = "shard-3.safetensors";
	s = moe_safetensors_open_mem(c, name, img, len);
	name[0] = 'X'; /* copied */
	assert_string_equal(moe_safetensors_path(s), "shard-3.safetensors");
	moe_safetensors_close(s);
	img[8] = '['; /* a header that is not an object */
	assert_null(moe_safetensors_open_mem(c, "shard-3.safetensors", img, len));
	assert_diag(c, "shard-3.safetensors");
	free(img);
	unlink(path);
	moe_ctx_free(c);
}

/* ---- weights from an open checkpoint ---- */

static moe_id weight(moe_graph *g, moe_dtype t, int rank, const int64_t *s, const char *name, const char *source)
{
	moe_id id = moe_node_new(g, MOE_OP_WEIGHT, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, rank);
	moe_node_set_name(g, id, name);
	moe_node_set_str(g, id, "source", source);
	return id;
}

/* up f32[2, 3, 2] and upb bf16[2, 3, 2] per expert from "ex.{e}.up", r bf16[2]
 * from "router", bias f32[3] from "bias". */
static moe_module *wlayer(moe_ctx *c, moe_id *up, moe_id *upb, moe_id *r)
{
	moe_module *m = moe_module_new(c);
	moe_graph *g = moe_module_add_graph(m, "w");
	*up = weight(g, MOE_F32, 3, (int64_t[]){2, 3, 2}, "up", "ex.{e}.up");
	*upb = weight(g, MOE_BF16, 3, (int64_t[]){2, 3, 2}, "upb", "ex.{e}.up");
	*r = weight(g, MOE_BF16, 1, (int64_t[]){2}, "r", "router");
	weight(g, MOE_F32, 1, (int64_t[]){3}, "bias", "bias");
	return m;
}

static const float e0[6] = {1, 2, 3, 4, 5, 6};
/* expert 1 stored as bf16: 0.5, -2, 3.25, 0, 1, 100 */
static const uint16_t e1_bf16[6] = {0x3F00, 0xC000, 0x4050, 0x0000, 0x3F80, 0x42C8};
static const float e1[6] = {0.5f, -2.0f, 3.25f, 0.0f, 1.0f, 100.0f};
/* 1 + 2^-8 and 1 + 3 * 2^-8: halfway cases, to nearest even bf16 0x3F80 and 0x3F82 */
static const float router[2] = {1.00390625f, 1.01171875f};
static const float bias[3] = {7, 8, 9};

/* A checkpoint in memory; which: bit 0 expert 0, bit 1 expert 1, bit 2 router, bit 3 bias. */
static moe_checkpoint *wck(moe_ctx *c, unsigned which)
{
	moe_st_tensor t[4];
	size_t n = 0;
	if (which & 1)
		t[n++] = (moe_st_tensor){.name = "ex.0.up", .dtype = MOE_ST_F32, .rank = 2, .shape = {3, 2}, .data = e0,
			.nbytes = sizeof e0};
	if (which & 2)
		t[n++] = (moe_st_tensor){.name = "ex.1.up", .dtype = MOE_ST_BF16, .rank = 2, .shape = {3, 2},
			.data = e1_bf16, .nbytes = sizeof e1_bf16};
	if (which & 4)
		t[n++] = (moe_st_tensor){.name = "router", .dtype = MOE_ST_F32, .rank = 1, .shape = {2}, .data = router,
			.nbytes = sizeof router};
	if (which & 8)
		t[n++] = (moe_st_tensor){.name = "bias", .dtype = MOE_ST_F32, .rank = 1, .shape = {3}, .data = bias,
			.nbytes = sizeof bias};
	moe_checkpoint *ck = moe_checkpoint_open_tensors(c, "mem", t, n);
	assert_non_null(ck);
	return ck;
}

static void test_weights_load_from_ex(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_id up, upb, r;
	moe_module *m = wlayer(c, &up, &upb, &r);
	const moe_graph *g = moe_module_graph(m, 0);

	/* everything present, flags 0: every weight converted to its node's dtype */
	moe_checkpoint *full = wck(c, 15);
	moe_tensor_map *out = moe_tensor_map_new(c);
	size_t absent = 99;
	assert_int_equal(moe_weights_load_from_ex(c, g, full, 0, out, &absent), MOE_OK);
	assert_int_equal(absent, 0);
	const moe_tensor *t = moe_tensor_map_get(out, "up");
	assert_int_equal(t->dtype, MOE_F32);
	assert_memory_equal(t->data, e0, sizeof e0);
	assert_memory_equal((const float *)t->data + 6, e1, sizeof e1);
	t = moe_tensor_map_get(out, "upb");
	static const uint16_t upb_want[12] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x3F00, 0xC000, 0x4050,
		0x0000, 0x3F80, 0x42C8};
	assert_memory_equal(t->data, upb_want, sizeof upb_want);
	t = moe_tensor_map_get(out, "r");
	assert_int_equal(((const uint16_t *)t->data)[0], 0x3F80);
	assert_int_equal(((const uint16_t *)t->data)[1], 0x3F82);
	assert_memory_equal(moe_tensor_map_get(out, "bias")->data, bias, sizeof bias);
	moe_tensor_map_free(out);

	/* bias absent: an error naming it without the flag, out unchanged */
	moe_checkpoint *nobias = wck(c, 7);
	out = moe_tensor_map_new(c);
	assert_int_equal(moe_weights_load_from_ex(c, g, nobias, 0, out, &absent), MOE_ERR_INVALID);
	assert_null(moe_tensor_map_get(out, "up"));
	assert_diag(c, "weight 'bias': tensor 'bias' not found in");
	/* with MOE_WEIGHTS_ALLOW_ABSENT: bound without data, counted */
	assert_int_equal(moe_weights_load_from_ex(c, g, nobias, MOE_WEIGHTS_ALLOW_ABSENT, out, &absent), MOE_OK);
	assert_int_equal(absent, 1);
	t = moe_tensor_map_get(out, "bias");
	assert_non_null(t);
	assert_null(t->data);
	assert_int_equal(t->dtype, MOE_F32);
	assert_int_equal(t->rank, 1);
	assert_int_equal(t->shape[0], 3);
	assert_non_null(moe_tensor_map_get(out, "up")->data);
	moe_tensor_map_free(out);
	/* absent may be NULL */
	out = moe_tensor_map_new(c);
	assert_int_equal(moe_weights_load_from_ex(c, g, nobias, MOE_WEIGHTS_ALLOW_ABSENT, out, NULL), MOE_OK);
	moe_tensor_map_free(out);

	/* a template with some of its experts present is not absent: an error */
	moe_checkpoint *half = wck(c, 1 | 4 | 8);
	out = moe_tensor_map_new(c);
	assert_int_equal(moe_weights_load_from_ex(c, g, half, MOE_WEIGHTS_ALLOW_ABSENT, out, &absent), MOE_ERR_INVALID);
	assert_diag(c, "'ex.1.up' not found");
	/* none of a template's experts present: absent (up and upb) */
	moe_checkpoint *noexp = wck(c, 4 | 8);
	assert_int_equal(moe_weights_load_from_ex(c, g, noexp, MOE_WEIGHTS_ALLOW_ABSENT, out, &absent), MOE_OK);
	assert_int_equal(absent, 2);
	assert_null(moe_tensor_map_get(out, "up")->data);
	assert_null(moe_tensor_map_get(out, "upb")->data);
	assert_non_null(moe_tensor_map_get(out, "r")->data);
	moe_tensor_map_free(out);

	/* MOE_WEIGHTS_DEFER: per-expert weights checked, bound without data (not
	 * absent); the others read */
	out = moe_tensor_map_new(c);
	assert_int_equal(moe_weights_load_from_ex(c, g, full, MOE_WEIGHTS_DEFER, out, &absent), MOE_OK);
	assert_int_equal(absent, 0);
	assert_null(moe_tensor_map_get(out, "up")->data);
	assert_int_equal(moe_tensor_map_get(out, "up")->shape[0], 2);
	assert_null(moe_tensor_map_get(out, "upb")->data);
	assert_non_null(moe_tensor_map_get(out, "r")->data);
	assert_non_null(moe_tensor_map_get(out, "bias")->data);
	moe_tensor_map_free(out);
	/* deferred weights are still checked: an expert missing is an error */
	out = moe_tensor_map_new(c);
	assert_int_equal(moe_weights_load_from_ex(c, g, half, MOE_WEIGHTS_DEFER, out, &absent), MOE_ERR_INVALID);
	assert_diag(c, "'ex.1.up' not found");
	moe_tensor_map_free(out);

	/* the checkpoint stays open and usable after every call */
	assert_non_null(moe_checkpoint_find(full, "router", NULL));
	moe_checkpoint_close(full);
	moe_checkpoint_close(nobias);
	moe_checkpoint_close(half);
	moe_checkpoint_close(noexp);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_weights_load_row(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_id up, upb, r;
	moe_module *m = wlayer(c, &up, &upb, &r);
	const moe_graph *g = moe_module_graph(m, 0);
	moe_checkpoint *full = wck(c, 15);
	float row[6];
	uint16_t hrow[6];
	assert_int_equal(moe_weights_load_row(c, g, up, full, 0, row, sizeof row), MOE_OK);
	assert_memory_equal(row, e0, sizeof e0);
	assert_int_equal(moe_weights_load_row(c, g, up, full, 1, row, sizeof row), MOE_OK);
	assert_memory_equal(row, e1, sizeof e1); /* bf16 widened exactly */
	assert_int_equal(moe_weights_load_row(c, g, upb, full, 0, hrow, sizeof hrow), MOE_OK);
	static const uint16_t h0[6] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0};
	assert_memory_equal(hrow, h0, sizeof h0);
	assert_int_equal(moe_error_count(c), 0);

	/* rows outside 0..E-1, a weight that is not per-expert, a non-weight */
	int64_t rows[] = {-1, 2, INT64_MAX};
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(moe_weights_load_row(c, g, up, full, rows[i], row, sizeof row), MOE_ERR_INVALID);
		char want[96];
		snprintf(want, sizeof want, "is not a per-expert ({e}) weight with a row %lld", (long long)rows[i]);
		assert_diag(c, want);
	}
	assert_int_equal(moe_weights_load_row(c, g, r, full, 0, hrow, 4), MOE_ERR_INVALID);
	assert_diag(c, "is not a per-expert ({e}) weight");
	/* a wrong byte count: checked, dst untouched */
	memset(row, 0x55, sizeof row);
	assert_int_equal(moe_weights_load_row(c, g, up, full, 0, row, sizeof row - 4), MOE_ERR_INVALID);
	assert_diag(c, "tensor 'ex.0.up' no longer has the shape of one row of weight 'up'");
	for (size_t i = 0; i < sizeof row; i++)
		assert_int_equal(((unsigned char *)row)[i], 0x55);
	/* the tensor missing from this checkpoint */
	moe_checkpoint *half = wck(c, 1);
	assert_int_equal(moe_weights_load_row(c, g, up, half, 0, row, sizeof row), MOE_OK);
	assert_int_equal(moe_weights_load_row(c, g, up, half, 1, row, sizeof row), MOE_ERR_INVALID);
	assert_diag(c, "weight 'up': tensor 'ex.1.up' not found in");
	/* a tensor whose shape changed since the weights were loaded */
	static const float wide[8] = {0};
	moe_st_tensor bad = {.name = "ex.1.up", .dtype = MOE_ST_F32, .rank = 2, .shape = {4, 2}, .data = wide,
		.nbytes = sizeof wide};
	moe_checkpoint *other = moe_checkpoint_open_tensors(c, "other", &bad, 1);
	assert_int_equal(moe_weights_load_row(c, g, up, other, 1, row, sizeof row), MOE_ERR_INVALID);
	assert_diag(c, "tensor 'ex.1.up' no longer has the shape of one row of weight 'up'");
	/* and a dtype that does not convert */
	static const int32_t ints[6] = {0};
	bad = (moe_st_tensor){.name = "ex.1.up", .dtype = MOE_ST_I32, .rank = 2, .shape = {3, 2}, .data = ints,
		.nbytes = sizeof ints};
	moe_checkpoint *ick = moe_checkpoint_open_tensors(c, "ints", &bad, 1);
	assert_int_equal(moe_weights_load_row(c, g, up, ick, 1, row, sizeof row), MOE_ERR_INVALID);
	assert_diag(c, "ex.1.up");
	moe_checkpoint_close(ick);
	moe_checkpoint_close(other);
	moe_checkpoint_close(half);
	moe_checkpoint_close(full);
	moe_module_free(m);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_stream),
		cmocka_unit_test(test_output_open_regular),
		cmocka_unit_test(test_output_open_refused),
		cmocka_unit_test(test_output_open_through),
		cmocka_unit_test(test_write_output),
		cmocka_unit_test(test_remove_temporaries),
		cmocka_unit_test(test_temp_table),
		cmocka_unit_test(test_output_set),
		cmocka_unit_test(test_st_dtype_name),
		cmocka_unit_test(test_checkpoint_id),
		cmocka_unit_test(test_safetensors_path),
		cmocka_unit_test(test_weights_load_from_ex),
		cmocka_unit_test(test_weights_load_row),
	};
	return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
