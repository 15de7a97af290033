/* tests/unit/test_reader_caps.c: every reader refuses an input that would
 * cost far more memory than its size before parsing it (docs/robustness.md,
 * "Size caps"). Each case runs in a child process; the parent reads the
 * child's peak RSS and time from wait4, so one case cannot hide another's. */
#define _GNU_SOURCE /* wait4 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moec/moec.h"

#define SCRATCH_NAME "moec-caps"
#include "scratch_dir.h"

/* The first diagnostic of a failed call, into msg. */
static void first_diag(moe_ctx *c, char *msg, size_t n)
{
	const char *m = "";
	if (moe_diag_count(c))
		moe_diag_get(c, 0, NULL, NULL, &m);
	snprintf(msg, n, "%s", m);
}

typedef int (*case_fn)(const char *path, char *msg, size_t n);

/* Runs fn(path) in a child; the child writes its first diagnostic to a pipe.
 * Checks the call failed with want in its message, within 10 s of wall time
 * and 1 GB of peak RSS; returns the peak RSS in MiB. */
static long run_child(case_fn fn, const char *path, const char *want)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		char msg[600];
		int failed = fn(path, msg, sizeof msg);
		ssize_t w = write(fds[1], msg, strlen(msg));
		(void)w;
		_exit(failed ? 0 : 1);
	}
	close(fds[1]);
	char got[600] = "";
	ssize_t r = read(fds[0], got, sizeof got - 1);
	got[r > 0 ? r : 0] = 0;
	close(fds[0]);
	int status;
	struct rusage ru;
	assert_int_equal(wait4(pid, &status, 0, &ru), pid);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	long mib = ru.ru_maxrss / 1024;
	print_message("  %s: %.2f s, peak RSS %ld MiB: %s\n", path, secs, mib, got);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status))
		fail_msg("%s was accepted", path);
	if (!strstr(got, want))
		fail_msg("got '%s', want '%s'", got, want);
	assert_true(secs < 10);
	assert_true(mib < 1024);
	return mib;
}

static int import_file(const char *path, char *msg, size_t n)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *text = NULL;
	moe_status s = moe_import_hf(c, path, NULL, &text);
	first_diag(c, msg, n);
	moe_free(c, text);
	moe_ctx_free(c);
	return s != MOE_OK;
}

/* the text API: the file read whole first, with no cap of its own */
static int import_text(const char *path, char *msg, size_t n)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *data = NULL, *text = NULL;
	size_t len;
	moe_status s = moe_read_file(c, path, &data, &len);
	if (!s)
		s = moe_import_hf_text(c, path, data, len, NULL, &text);
	first_diag(c, msg, n);
	moe_free(c, data);
	moe_free(c, text);
	moe_ctx_free(c);
	return s != MOE_OK;
}

static int open_st(const char *path, char *msg, size_t n)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_safetensors *st = moe_safetensors_open(c, path);
	first_diag(c, msg, n);
	moe_safetensors_close(st);
	moe_ctx_free(c);
	return st == NULL;
}

static int open_npy(const char *path, char *msg, size_t n)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_tensor *t = moe_npy_read(c, path, MOE_F32);
	first_diag(c, msg, n);
	moe_ctx_free(c);
	return t == NULL;
}

/* the JSON IR API: a library caller (or standard input) hands the text over */
static int parse_ir_json(const char *path, char *msg, size_t n)
{
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	char *data = NULL;
	size_t len;
	moe_module *m = NULL;
	if (!moe_read_file(c, path, &data, &len))
		m = moe_module_parse_json(c, path, data, len);
	first_diag(c, msg, n);
	moe_module_free(m);
	moe_free(c, data);
	moe_ctx_free(c);
	return m == NULL;
}

/* Writes a file of head, then reps copies of unit, then tail. */
static void write_rep(const char *path, const char *head, const char *unit, size_t reps, const char *tail)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	fputs(head, f);
	size_t ul = strlen(unit), chunk = 1 << 16;
	char *buf = malloc(ul * chunk);
	assert_non_null(buf);
	for (size_t i = 0; i < chunk; i++)
		memcpy(buf + i * ul, unit, ul);
	for (size_t done = 0; done < reps; done += chunk)
		fwrite(buf, ul, reps - done < chunk ? reps - done : chunk, f);
	fputs(tail, f);
	free(buf);
	assert_int_equal(fclose(f), 0);
}

#define CFG_HEAD "{\"model_type\": \"mixtral\", \"hidden_size\": 64, \"num_local_experts\": 4, " \
		 "\"num_experts_per_tok\": 2, \"intermediate_size\": 32, \"num_hidden_layers\": 1, \"pad\": ["

/* A 250 MiB config.json (the reproducer took 10.5 GB): refused by its size
 * before it is read, through the file API and (read whole) the text API. */
static void test_config_250mib(void **st)
{
	(void)st;
	char path[300];
	snprintf(path, sizeof path, "%s/big_config.json", tmpdir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	const char head[] = CFG_HEAD;
	assert_int_equal(write(fd, head, sizeof head - 1), (ssize_t)(sizeof head - 1));
	assert_int_equal(ftruncate(fd, (off_t)250 << 20), 0); /* sparse: the rest reads as NULs */
	close(fd);
	long rss = run_child(import_file, path, "file of 262144000 bytes exceeds the limit of 8388608 bytes");
	assert_true(rss < 64);
	/* the text API gets the whole 250 MiB (the read itself costs that) and refuses it unparsed */
	rss = run_child(import_text, path, "JSON document of 262144000 bytes exceeds the limit of 8388608 bytes for a "
					   "config.json");
	assert_true(rss < 400);
}

/* Under the size cap, 3.5 M tiny values: refused by the estimate of what
 * parsing would allocate (over 300 MiB), not parsed. */
static void test_config_values(void **st)
{
	(void)st;
	char path[300];
	snprintf(path, sizeof path, "%s/values.json", tmpdir);
	write_rep(path, CFG_HEAD, "0,", 3500000, "0]}");
	long rss = run_child(import_file, path, "parsing it would take about");
	assert_true(rss < 64);
}

/* A 95 MB safetensors header of a rank-40M shape (the reproducer took 3.8 GB
 * before the rank check) and one of 10 M tiny entries: refused before cJSON. */
static void test_safetensors_header(void **st)
{
	(void)st;
	char path[300];
	snprintf(path, sizeof path, "%s/rank.safetensors", tmpdir);
	const char head[] = "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4],\"shape\":[";
	size_t reps = (95000000 - sizeof head) / 2;
	uint64_t hl = sizeof head - 1 + reps * 2 + 3;
	char lenb[9] = {0};
	for (int i = 0; i < 8; i++)
		lenb[i] = (char)(hl >> (8 * i));
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	fwrite(lenb, 1, 8, f);
	fclose(f);
	/* append the header */
	char tmp[300];
	snprintf(tmp, sizeof tmp, "%s/hdr", tmpdir);
	write_rep(tmp, head, "1,", reps, "1]}");
	char cmd[1400];
	snprintf(cmd, sizeof cmd, "cat '%s' >> '%s' && printf 'abcd' >> '%s' && rm '%s'", tmp, path, path, tmp);
	assert_int_equal(system(cmd), 0);
	long rss = run_child(open_st, path, "parsing it would take about");
	assert_true(rss < 300);

	/* 10 M entries "a":{}: within the 100 MB limit, and 24 x its size of nodes */
	snprintf(path, sizeof path, "%s/many.safetensors", tmpdir);
	reps = 9000000;
	hl = 1 + reps * 9 + 8;
	for (int i = 0; i < 8; i++)
		lenb[i] = (char)(hl >> (8 * i));
	f = fopen(path, "wb");
	fwrite(lenb, 1, 8, f);
	fclose(f);
	write_rep(tmp, "{", "\"a\":{},\n ", reps, "\"b\":{}}\n");
	snprintf(cmd, sizeof cmd, "cat '%s' >> '%s' && rm '%s'", tmp, path, tmp);
	assert_int_equal(system(cmd), 0);
	rss = run_child(open_st, path, "parsing it would take about");
	assert_true(rss < 300);
}

/* A shape array longer than any rank: refused before parsing. */
static void test_safetensors_array(void **st)
{
	(void)st;
	char path[300];
	snprintf(path, sizeof path, "%s/arr.safetensors", tmpdir);
	const char hdr[] = "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4],\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
			   "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}}";
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	uint64_t hl = sizeof hdr - 1;
	for (int i = 0; i < 8; i++)
		fputc((int)(hl >> (8 * i)) & 0xff, f);
	fputs(hdr, f);
	fputs("abcd", f);
	fclose(f);
	run_child(open_st, path, "header holds an array of 67 elements; shapes have at most 8 dims");
}

/* An .npy whose 2.0 header claims 3 GB: refused by the header cap, not scanned. */
/* JSON IR of 3.5 M tiny values in 7 MB through moe_module_parse_json (the
 * CLI's 8 MiB file cap does not see text given by a caller or on standard
 * input): refused by the estimate before cJSON builds a tree. */
static void test_ir_json_values(void **st)
{
	(void)st;
	char path[300];
	snprintf(path, sizeof path, "%s/values.moeir.json", tmpdir);
	write_rep(path, "{\"format\": \"moec-ir\", \"pad\": [", "0,", 3500000, "0]}");
	long rss = run_child(parse_ir_json, path, "more than the 256 MiB moec allows JSON IR");
	assert_true(rss < 64);
}

static void test_npy_header(void **st)
{
	(void)st;
	char path[300];
	snprintf(path, sizeof path, "%s/big.npy", tmpdir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	unsigned char h[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0, 0, 0xb0};
	assert_int_equal(write(fd, h, sizeof h), 12);
	assert_int_equal(ftruncate(fd, (off_t)3 << 30), 0);
	close(fd);
	run_child(open_npy, path, "header length 2952790016 exceeds the 1048576-byte limit");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_250mib),
		cmocka_unit_test(test_config_values),
		cmocka_unit_test(test_safetensors_header),
		cmocka_unit_test(test_safetensors_array),
		cmocka_unit_test(test_npy_header),
		cmocka_unit_test(test_ir_json_values),
	};
	return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
