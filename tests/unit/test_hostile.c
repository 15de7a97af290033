/* tests/unit/test_hostile.c: hostile inputs and faults in files:
 * outputs over FIFOs, devices, symlinks and inputs; inputs that would block
 * or never end; temporaries on SIGTERM; JSON read as Python reads it;
 * safetensors offsets; a NULL context. The compiler and simulator side is in
 * test_hostile_run.c. */
#define _XOPEN_SOURCE 700 /* mknod */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend-tcp/isa/tcp_int.h"
#include "moec/moec.h"
#include "hostile_util.h"

static char dir[256];

static int setup(void **st)
{
	(void)st;
	const char *t = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/moec-hostile-XXXXXX", t && *t ? t : "/tmp");
	return mkdtemp(dir) ? 0 : -1;
}

/* Removes the directory's files; fails when a temporary (*.tmp.*) is among them. */
static int teardown(void **st)
{
	(void)st;
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[600];
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.' || (e->d_name[1] && strcmp(e->d_name, ".."))) {
			snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
			unlink(p);
		}
	if (d)
		closedir(d);
	return rmdir(dir);
}

static char *at(char *buf, const char *name)
{
	snprintf(buf, 600, "%s/%s", dir, name);
	return buf;
}

static int temporaries(void)
{
	int n = 0;
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d)))
		n += strstr(e->d_name, ".tmp.") != NULL;
	closedir(d);
	return n;
}

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}


/* ---- outputs (items 1, 2, 6, 10: NAME_MAX) ---- */

static void test_output_fifo_symlink_device(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char fifo[600], got[600], real[600], link[600];
	/* a FIFO without a reader: an error at once, not a wait */
	assert_int_equal(mkfifo(at(fifo, "ff"), 0600), 0);
	double t0 = now();
	assert_int_not_equal(moe_write_file_atomic(c, fifo, "abc", 3), MOE_OK);
	assert_true(now() - t0 < 1.0);
	assert_non_null(strstr(last_error(c), "no reader"));
	/* with a reader: written straight through, the FIFO stays a FIFO */
	pid_t pid = fork();
	if (pid == 0) {
		int in = open(fifo, O_RDONLY), out = open(at(got, "got"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
		char b[64];
		ssize_t n = read(in, b, sizeof b);
		_exit(n == 5 && write(out, b, 5) == 5 ? 0 : 1);
	}
	moe_diag_clear(c);
	moe_status rc = MOE_ERR_IO;
	for (int i = 0; i < 200 && rc != MOE_OK; i++) { /* until the child has opened its end */
		rc = moe_write_file_atomic(c, fifo, "hello", 5);
		if (rc != MOE_OK)
			nanosleep(&(struct timespec){0, 10000000}, NULL);
	}
	assert_int_equal(rc, MOE_OK);
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	struct stat sb;
	assert_int_equal(lstat(fifo, &sb), 0);
	assert_true(S_ISFIFO(sb.st_mode));
	/* a symlink: its target is replaced, the link stays */
	put_file(at(real, "real.txt"), "old");
	assert_int_equal(symlink("real.txt", at(link, "link.txt")), 0);
	moe_diag_clear(c);
	assert_int_equal(moe_write_file_atomic(c, link, "new!", 4), MOE_OK);
	assert_int_equal(lstat(link, &sb), 0);
	assert_true(S_ISLNK(sb.st_mode));
	assert_int_equal(stat(real, &sb), 0);
	assert_int_equal(sb.st_size, 4);
	/* /dev/full: the write error is reported, nothing is replaced */
	assert_int_equal(moe_write_file_atomic(c, "/dev/full", "x", 1), MOE_ERR_IO);
	assert_non_null(strstr(last_error(c), "No space"));
	assert_int_equal(stat("/dev/full", &sb), 0);
	assert_true(S_ISCHR(sb.st_mode));
	/* a stand-in device node (root only): written through, still a device */
	char dev[600];
	if (mknod(at(dev, "null"), S_IFCHR | 0666, makedev(1, 3)) == 0) {
		moe_diag_clear(c);
		assert_int_equal(moe_write_file_atomic(c, dev, "data", 4), MOE_OK);
		assert_int_equal(lstat(dev, &sb), 0);
		assert_true(S_ISCHR(sb.st_mode));
	} else {
		print_message("mknod not permitted (not root): stand-in device case skipped\n");
	}
	/* a directory is refused before any temporary exists */
	assert_int_equal(moe_write_file_atomic(c, dir, "x", 1), MOE_ERR_IO);
	assert_int_equal(temporaries(), 0);
	moe_ctx_free(c);
}

static void test_output_names_and_inputs(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char in[600], out[600], lnk[600], longp[600], name[256];
	put_file(at(in, "src.moe"), "layer");
	/* the output is the input: by the same name, through a symlink, through ./ */
	const char *ins[] = {in};
	const char *o1[] = {in};
	assert_int_equal(moe_check_outputs(c, ins, 1, o1, 1), MOE_ERR_INVALID);
	assert_int_equal(symlink(in, at(lnk, "alias.moe")), 0);
	const char *o2[] = {lnk};
	assert_int_equal(moe_check_outputs(c, ins, 1, o2, 1), MOE_ERR_INVALID);
	/* two outputs naming one new file; a NULL output is skipped */
	const char *o3[] = {at(out, "y.npy"), NULL, out};
	moe_diag_clear(c);
	assert_int_equal(moe_check_outputs(c, ins, 1, o3, 3), MOE_ERR_INVALID);
	assert_non_null(strstr(last_error(c), "two outputs"));
	const char *o4[] = {out, NULL};
	moe_diag_clear(c);
	assert_int_equal(moe_check_outputs(c, ins, 1, o4, 2), MOE_OK);
	/* a 250-character name: its temporary must still fit NAME_MAX */
	memset(name, 'a', 250);
	name[250] = 0;
	assert_int_equal(moe_write_file_atomic(c, at(longp, name), "x", 1), MOE_OK);
	struct stat sb;
	assert_int_equal(stat(longp, &sb), 0);
	assert_int_equal(temporaries(), 0);
	moe_ctx_free(c);
}

/* SIGTERM while an atomic output is open: the temporary goes, exit 128+15. */
static void test_sigterm_removes_temporaries(void **st)
{
	(void)st;
	pid_t pid = fork();
	if (pid == 0) {
		moe_cleanup_on_signals();
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		char p[600];
		moe_atomic_file *f = moe_atomic_open(c, at(p, "half.npy"));
		if (!f || fputs("partial", moe_atomic_stream(f)) < 0 || fflush(moe_atomic_stream(f)))
			_exit(1);
		raise(SIGTERM);
		_exit(2); /* not reached */
	}
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 128 + SIGTERM);
	assert_int_equal(temporaries(), 0);
	char p[600];
	assert_int_not_equal(access(at(p, "half.npy"), F_OK), 0);
}

/* ---- inputs (item 5: FIFOs, /dev/zero; item 4: --machine /dev/zero) ---- */

static void test_inputs_never_block(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char fifo[600], big[600];
	assert_int_equal(mkfifo(at(fifo, "in.fifo"), 0600), 0);
	char *data = NULL;
	size_t len = 0;
	double t0 = now();
	assert_int_equal(moe_read_file(c, fifo, &data, &len), MOE_ERR_IO);
	assert_non_null(strstr(last_error(c), "FIFO"));
	assert_null(moe_safetensors_open(c, fifo));
	assert_null(moe_npy_read(c, fifo, MOE_F32));
	assert_null(moe_tcp_machine_load(c, fifo));
	assert_null(moe_tcp_load_binary(c, fifo, NULL));
	const char *paths[] = {fifo};
	assert_null(moe_checkpoint_open(c, paths, 1));
	assert_int_not_equal(moe_import_hf(c, fifo, NULL, &data), MOE_OK);
	/* /dev/zero never ends: refused before a read */
	moe_diag_clear(c);
	assert_null(moe_tcp_machine_load(c, "/dev/zero"));
	assert_non_null(strstr(last_error(c), "character device"));
	assert_true(now() - t0 < 2.0);
	/* size caps per kind */
	FILE *f = fopen(at(big, "machine.json"), "wb");
	assert_non_null(f);
	for (int i = 0; i < (2 << 20) / 16; i++)
		fputs("                ", f);
	fclose(f);
	moe_diag_clear(c);
	assert_null(moe_tcp_machine_load(c, big));
	assert_non_null(strstr(last_error(c), "exceeds the limit"));
	assert_int_equal(moe_read_file_max(c, big, 100, &data, &len), MOE_ERR_IO);
	moe_ctx_free(c);
}

/* ---- JSON, safetensors, NULL ctx (item 10) ---- */

static void test_config_json_like_python(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *cfg;
	size_t len;
	assert_int_equal(moe_read_file(c, MOEC_SOURCE_DIR "/tests/fixtures/hf/mixtral/config.json", &cfg, &len), MOE_OK);
	char *o = strchr(cfg, '{');
	assert_non_null(o);
	size_t n = len + 128;
	char *t = malloc(n), *moe = NULL;
	/* the last of two model_type keys wins, as in Python's json */
	snprintf(t, n, "{\"model_type\": \"gpt2\",%s", o + 1);
	assert_int_equal(moe_import_hf_text(c, "dup.json", t, strlen(t), NULL, &moe), MOE_OK);
	moe_free(c, moe);
	snprintf(t, n, "%.*s, \"model_type\": \"gpt2\"}", (int)(strrchr(cfg, '}') - cfg), cfg); /* last: gpt2 */
	assert_int_not_equal(moe_import_hf_text(c, "dup2.json", t, strlen(t), NULL, &moe), MOE_OK);
	/* trailing garbage after the object */
	moe_diag_clear(c);
	snprintf(t, n, "%s xyz", cfg);
	assert_int_not_equal(moe_import_hf_text(c, "trail.json", t, strlen(t), NULL, &moe), MOE_OK);
	assert_non_null(strstr(last_error(c), "after the JSON"));
	/* "mixtral\u0000x" is not mixtral */
	moe_diag_clear(c);
	snprintf(t, n, "{\"model_type\": \"mixtral\\u0000x\",%s", o + 1);
	assert_int_not_equal(moe_import_hf_text(c, "nul.json", t, strlen(t), NULL, &moe), MOE_OK);
	assert_non_null(strstr(last_error(c), "\\u0000"));
	free(t);
	moe_free(c, cfg);
	moe_ctx_free(c);
}

static unsigned char *st_file(const char *hdr, size_t datalen, size_t *len)
{
	size_t hl = strlen(hdr);
	*len = 8 + hl + datalen;
	unsigned char *b = calloc(1, *len);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, hdr, hl);
	return b;
}

static void test_safetensors_offsets_and_nul(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t len;
	/* the error points at the bad entry's key, not at byte 8 */
	const char *h = "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
			"\"bad\": {\"dtype\": \"F128\", \"shape\": [1], \"data_offsets\": [4, 8]}}";
	unsigned char *b = st_file(h, 8, &len);
	assert_null(moe_safetensors_open_mem(c, "o.safetensors", b, len));
	moe_loc loc;
	moe_diag_get(c, 0, NULL, &loc, NULL);
	assert_int_equal(loc.offset, 8 + (int64_t)(strstr(h, "\"bad\"") - h));
	free(b);
	/* a key with \u0000 would compare as its prefix "a" */
	moe_diag_clear(c);
	h = "{\"a\\u0000b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
	b = st_file(h, 4, &len);
	assert_null(moe_safetensors_open_mem(c, "n.safetensors", b, len));
	assert_non_null(strstr(last_error(c), "\\u0000"));
	free(b);
	moe_ctx_free(c);
}

static void test_null_ctx_aborts(void **st)
{
	(void)st;
	pid_t pid = fork();
	if (pid == 0) {
		if (!freopen("/dev/null", "w", stderr))
			_exit(3);
		const char *t = "layer a {\n dim T = 1\n input x : [T]\n output x\n}\n";
		moe_parse_moe(NULL, "a.moe", t, strlen(t), NULL);
		_exit(0);
	}
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGABRT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_output_fifo_symlink_device, setup, teardown),
		cmocka_unit_test_setup_teardown(test_output_names_and_inputs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sigterm_removes_temporaries, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inputs_never_block, setup, teardown),
		cmocka_unit_test(test_config_json_like_python),
		cmocka_unit_test(test_safetensors_offsets_and_nul),
		cmocka_unit_test(test_null_ctx_aborts),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
