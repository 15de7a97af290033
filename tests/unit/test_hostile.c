/* tests/unit/test_hostile.c: hostile inputs and faults (issue 21): outputs
 * over FIFOs, devices, symlinks and inputs; inputs that would block or never
 * end; temporaries on SIGTERM; deep and long .moe sources; machine fields out
 * of range; TCP programs that never terminate; inf in TCP f32 contractions;
 * JSON read as Python reads it; safetensors offsets; a NULL context. */
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

#include "backend-tcp/tcp_int.h"
#include "moec/moec.h"

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

static const char *last_error(moe_ctx *c)
{
	const char *m = "";
	for (size_t i = 0; i < moe_diag_count(c); i++) {
		moe_diag_kind k;
		moe_diag_get(c, i, &k, NULL, &m);
		if (k == MOE_DIAG_ERROR)
			return m;
	}
	return m;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
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

/* ---- the frontend (items 3 and 9) ---- */

static moe_module *parse(moe_ctx *c, const char *text)
{
	return moe_parse_moe(c, "t.moe", text, strlen(text), NULL);
}

static void test_deep_expressions(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t n = 30000, cap = 4 * n + 200;
	char *s = malloc(cap), *p = s;
	p += sprintf(p, "layer s {\n  dim T = 4, D = 8\n  input x : [T, D]\n  y = x");
	for (size_t i = 1; i < n; i++)
		p += sprintf(p, " + x");
	sprintf(p, "\n  output y\n}\n");
	assert_null(parse(c, s));
	assert_non_null(strstr(last_error(c), "nested too deeply"));
	/* 20,000 open brackets: our message, not Bison's "memory exhausted" */
	moe_diag_clear(c);
	p = s + sprintf(s, "layer s {\n  dim T = 4\n  input x : [T]\n  y = ");
	for (int i = 0; i < 20000; i++)
		*p++ = '(';
	sprintf(p, "x\n  output y\n}\n");
	assert_null(parse(c, s));
	assert_non_null(strstr(last_error(c), "brackets nested too deeply"));
	assert_int_equal(moe_error_count(c), 1);
	/* 999 levels still lower */
	moe_diag_clear(c);
	p = s + sprintf(s, "layer s {\n  dim T = 4\n  input x : [T]\n  y = x");
	for (int i = 1; i < 999; i++)
		p += sprintf(p, " + x");
	sprintf(p, "\n  output y\n}\n");
	moe_module *m = parse(c, s);
	assert_non_null(m);
	moe_module_free(m);
	free(s);
	moe_ctx_free(c);
}

/* 100,000 statements: lowering is linear (hashed names). Must-show 3. */
static void test_100k_statements(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t n = 100000;
	char *s = malloc(40 * n + 200), *p = s;
	p += sprintf(p, "layer big {\n  dim T = 4, D = 8\n  input x : [T, D]\n  a0 = x\n");
	for (size_t i = 1; i < n; i++)
		p += sprintf(p, "  a%zu = a%zu + x\n", i, i - 1);
	sprintf(p, "  output a%zu\n}\n", n - 1);
	/* CPU time of this process: ctest -j runs other tests beside it */
	struct timespec a, b;
	double w0 = now();
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
	moe_module *m = parse(c, s);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
	double dt = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec), wall = now() - w0;
	assert_non_null(m);
	print_message("100000 statements parsed and lowered in %.3f s of CPU time (%.3f s wall)\n", dt, wall);
#if defined(__SANITIZE_ADDRESS__) || defined(__OPTIMIZE__) == 0
	assert_true(dt < 5.0); /* sanitizer or -O0 builds: 40k took 15.7 s before */
#else
	assert_true(dt < 1.0);
#endif
	moe_module_free(m);
	free(s);
	moe_ctx_free(c);
}

/* ---- the machine description (item 3) ---- */

static moe_tcp_machine *machine_with(moe_ctx *c, const char *from, const char *to)
{
	const char *d = tcp_default_machine_json, *at_ = strstr(d, from);
	assert_non_null(at_);
	size_t n = strlen(d) + strlen(to) + 1;
	char *buf = malloc(n);
	snprintf(buf, n, "%.*s%s%s", (int)(at_ - d), d, to, at_ + strlen(from));
	moe_tcp_machine *m = moe_tcp_machine_parse(c, "m.json", buf, strlen(buf));
	free(buf);
	return m;
}

static void test_machine_fields_bounded(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	static const char *const cases[][3] = {
		{"\"flit_bytes\": 32", "\"flit_bytes\": 2", "multiple of 4"},
		{"\"flit_bytes\": 32", "\"flit_bytes\": 3", "multiple of 4"},
		{"\"clusters\": 2", "\"clusters\": 4294967296", "clusters"},
		{"\"slices_per_cluster\": 256", "\"slices_per_cluster\": 65536", "65536 slices"},
		{"\"clock_hz\": 1.0e9", "\"clock_hz\": 1e300", "clock_hz"},
		{"\"hbm_bytes_per_s\": 1.5e12", "\"hbm_bytes_per_s\": 1", "hbm_bytes_per_s"},
		{"\"setup_cycles\": 500", "\"setup_cycles\": 1e15", "setup_cycles"},
		{"\"hbm_unaligned_write_factor\": 50.0", "\"hbm_unaligned_write_factor\": 1e30", "unaligned"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		moe_diag_clear(c);
		assert_null(machine_with(c, cases[i][0], cases[i][1]));
		if (!strstr(last_error(c), cases[i][2]))
			fail_msg("case %zu: '%s'", i, last_error(c));
	}
	moe_ctx_free(c);
}

/* ---- TCP programs that never end (item 5) ---- */

#define META "tcps 1\nmeta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 " \
	     "nblocks=-1 bexp=-1 loop=-1 body=-1\n"

static void test_tcp_loops(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	/* a bare jmp @0, and a 196,608-element copy in a jmp loop: rejected at load */
	const char *jmp0 = META "@0: jmp target=@0\n";
	assert_null(moe_tcp_from_asm(c, "j.tcps", jmp0, strlen(jmp0), NULL));
	assert_non_null(strstr(last_error(c), "cannot terminate"));
	const char *copy = META "tensor %0 hbm scratch f32 [196608] addr=0 slice=0 const=0 \"a\"\n"
				"tensor %1 hbm scratch f32 [196608] addr=1048576 slice=0 const=0 \"b\"\n"
				"@0: dma.copy dims=[196608] dst=%1+0:[1] s0=%0+0:[1]\n"
				"@1: jmp target=@0\n";
	moe_diag_clear(c);
	assert_null(moe_tcp_from_asm(c, "c.tcps", copy, strlen(copy), NULL));
	assert_non_null(strstr(last_error(c), "cannot terminate"));
	/* a loop whose exit is never taken: the budget from the program ends it quickly */
	const char *spin = META "@0: li rd=r1 imm=1\n"
				"@1: br.lt ra=r1 rb=r2 target=@3\n"
				"@2: jmp target=@1\n"
				"@3: halt\n";
	moe_diag_clear(c);
	moe_tcp_program *p = moe_tcp_from_asm(c, "s.tcps", spin, strlen(spin), NULL);
	assert_non_null(p);
	double t0 = now();
	assert_int_equal(moe_tcp_run(c, p, NULL, NULL, NULL, NULL), MOE_ERR_RUNTIME);
	assert_true(now() - t0 < 2.0);
	assert_non_null(strstr(last_error(c), "instruction budget"));
	moe_tcp_program_free(p);
	/* The parse-time ranges keep a DMA far below 1e15 cycles (an 8 MB HBM write at
	 * 1e6 B/s and 1e11 Hz: 8e11); a machine built past them in memory (the
	 * struct is the library's own) must still fault, not wrap float->int64. */
	moe_tcp_machine *slow = moe_tcp_machine_default(c);
	assert_non_null(slow);
	slow->hbm_bytes_per_s = 1e-3;
	const char *big = META "tensor %0 hbm scratch f32 [2097152] addr=0 slice=0 const=0 \"a\"\n"
			       "tensor %1 hbm scratch f32 [2097152] addr=8388608 slice=0 const=0 \"b\"\n"
			       "@0: dma.copy dims=[2097152] dst=%1+0:[1] s0=%0+0:[1]\n"
			       "@1: halt\n";
	moe_diag_clear(c);
	p = moe_tcp_from_asm(c, "big.tcps", big, strlen(big), slow);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	moe_tcp_run_opts ro = {.machine = slow};
	moe_tcp_stats stats;
	assert_int_equal(moe_tcp_run(c, p, NULL, &ro, NULL, &stats), MOE_ERR_RUNTIME);
	assert_non_null(strstr(last_error(c), "passed 2^60"));
	assert_true(stats.cycles >= 0);
	moe_tcp_program_free(p);
	moe_tcp_machine_free(c, slow);
	moe_ctx_free(c);
}

/* ---- inf in an f32 contraction on TCP (item 7) ---- */

static void test_tcp_f32_inf_like_ieee(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *src = "layer l {\n  dim T = 4, D = 8, E = 4\n  dtype f32\n  input x : [T, D]\n"
			  "  weight w : [E, D] = \"w\"\n  y = einsum(\"td,ed->te\", x, w)\n  output y\n}\n";
	moe_module *orig = parse(c, src), *m = parse(c, src);
	assert_non_null(orig);
	assert_int_equal(moe_run_pipeline_text(c, "tcp", m, NULL), MOE_OK);
	moe_tcp_program *p = moe_tcp_compile(c, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(c, stderr);
	assert_non_null(p);
	int64_t xs[2] = {4, 8}, ws[2] = {4, 8};
	moe_tensor *x = moe_tensor_new(c, MOE_F32, 2, xs), *w = moe_tensor_new(c, MOE_F32, 2, ws);
	float *xd = x->data, *wd = w->data;
	for (int i = 0; i < 32; i++) {
		xd[i] = (float)i / 10.0f - 1.0f; /* lo parts non-zero: the old cross terms gave inf x 0 */
		wd[i] = 0.5f;
	}
	xd[1 * 8 + 3] = 0.0f; /* inf x 0 = NaN in IEEE too */
	wd[0 * 8 + 3] = INFINITY;
	wd[2 * 8 + 5] = -INFINITY;
	moe_tensor_map *b = moe_tensor_map_new(c);
	moe_tensor_map_set(b, "x", x);
	moe_tensor_map_set(b, "w", w);
	moe_tensor *host[1] = {0}, *tcp[1] = {0};
	assert_int_equal(moe_interp_run(c, moe_module_graph(orig, 0), b, host), MOE_OK);
	assert_int_equal(moe_tcp_run(c, p, b, NULL, tcp, NULL), MOE_OK);
	const float *h = host[0]->data, *t = tcp[0]->data;
	int nonfinite = 0;
	for (int i = 0; i < 16; i++) {
		if (!isfinite(h[i])) {
			nonfinite++;
			if (isnan(h[i]))
				assert_true(isnan(t[i]));
			else
				assert_true(t[i] == h[i]); /* same infinity */
		} else {
			assert_true(fabsf(t[i] - h[i]) <= 1e-4f * (1.0f + fabsf(h[i])));
		}
	}
	assert_int_equal(nonfinite, 8); /* columns 0 and 2 of every row */
	moe_tensor_free(c, host[0]);
	moe_tensor_free(c, tcp[0]);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_module_free(m);
	moe_module_free(orig);
	moe_ctx_free(c);
}

/* ---- allocation failures are errors, not aborts (item 4) ---- */

/* An allocator hook that refuses any block over 64 MiB. */
static void *small_alloc(void *ud, void *p, size_t o, size_t n)
{
	(void)ud;
	(void)o;
	if (!n) {
		free(p);
		return NULL;
	}
	return n > ((size_t)64 << 20) ? NULL : realloc(p, n);
}

static void test_refused_allocations(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(small_alloc, NULL);
	int64_t shape[2] = {8, (int64_t)1 << 30};
	assert_null(moe_tensor_new(c, MOE_F32, 2, shape));
	assert_non_null(strstr(last_error(c), "out of memory"));
	/* one_hot(i, 2147483647) on the host: the output cannot be allocated */
	moe_diag_clear(c);
	const char *src = "layer l {\n  dim T = 4, D = 8, E = 4\n  dtype f32\n  input x : [T, D]\n"
			  "  weight w : [E, D] = \"w\"\n  s = einsum(\"td,ed->te\", x, w)\n  i = topk(s, k=1)\n"
			  "  h = one_hot(i, 2147483647)\n  output h\n}\n";
	moe_module *m = parse(c, src);
	assert_non_null(m);
	assert_int_equal(moe_run_pipeline_text(c, "host", m, NULL), MOE_OK);
	int64_t xs[2] = {4, 8};
	moe_tensor_map *b = moe_tensor_map_new(c);
	moe_tensor_map_set(b, "x", moe_tensor_new(c, MOE_F32, 2, xs));
	moe_tensor_map_set(b, "w", moe_tensor_new(c, MOE_F32, 2, xs));
	moe_tensor *out[1] = {0};
	moe_host_stats hs;
	assert_int_not_equal(moe_host_run(c, moe_module_graph(m, 0), b, MOE_HOST_LLVM, 1, out, &hs), MOE_OK);
	assert_null(out[0]);
	assert_non_null(strstr(last_error(c), "out of memory"));
	moe_tensor_map_free(b);
	moe_module_free(m);
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
		cmocka_unit_test(test_deep_expressions),
		cmocka_unit_test(test_100k_statements),
		cmocka_unit_test(test_machine_fields_bounded),
		cmocka_unit_test(test_tcp_loops),
		cmocka_unit_test(test_tcp_f32_inf_like_ieee),
		cmocka_unit_test(test_refused_allocations),
		cmocka_unit_test(test_config_json_like_python),
		cmocka_unit_test(test_safetensors_offsets_and_nul),
		cmocka_unit_test(test_null_ctx_aborts),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
