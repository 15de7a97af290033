/* runtime/file.c: the one input and output module of moec.
 * Inputs: regular files only (FIFOs and devices are refused before a read
 * could block), with a size cap per kind; stdin through moe_read_stream.
 * Outputs: PATH.tmp.XXXXXX beside PATH, fsync, rename (removed on failure and,
 * through the registry below, on SIGINT/SIGTERM/SIGHUP); FIFOs and character
 * devices written straight through; outputs that are inputs refused. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/rt_io.h"

void rt_buf_printf(rt_buf *b, const char *fmt, ...)
{
	if (b->oom)
		return;
	va_list ap;
	for (;;) {
		size_t room = b->cap - b->len;
		va_start(ap, fmt);
		int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		size_t nc = b->cap ? b->cap * 2 : 1024;
		while (nc - b->len <= (size_t)n)
			nc *= 2;
		char *s = b->ctx ? ctx_try_realloc(b->ctx, b->s, nc) : realloc(b->s, nc);
		if (!s && b->ctx && ctx_guarded(b->ctx))
			ctx_throw(b->ctx, nc);
		if (!s) {
			b->oom = true;
			return;
		}
		b->s = s;
		b->cap = nc;
	}
}

void rt_buf_free(rt_buf *b)
{
	if (b->ctx)
		ctx_free(b->ctx, b->s, 0);
	else
		free(b->s);
	*b = (rt_buf){0};
}

/* 0644 less the umask. The umask is read from /proc/self/status, since
 * umask() can only be read by setting it (a race between threads); the
 * fallback does that. */
mode_t rt_output_mode(void)
{
	unsigned mask = 0;
	bool found = false;
	FILE *f = fopen("/proc/self/status", "r");
	if (f) {
		char line[128];
		while (!found && fgets(line, sizeof line, f))
			found = sscanf(line, "Umask: %o", &mask) == 1;
		fclose(f);
	}
	if (!found) {
		mode_t old = umask(022);
		umask(old);
		mask = (unsigned)old;
	}
	return (mode_t)(0644u & ~mask);
}

/* What a path names, for messages. */
static const char *kind_of(mode_t m)
{
	return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* Open a regular file for reading; -1 with a diagnostic otherwise. O_NONBLOCK
 * keeps open() from waiting for a FIFO's writer; the fstat then rejects it
 * (and devices such as /dev/zero) before anything is read. max > 0 caps the
 * size. */
static int open_regular(moe_ctx *ctx, const char *path, uint64_t max, off_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		rt_err_at(ctx, path, -1, "cannot open: %s", strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		rt_err_at(ctx, path, -1, "cannot stat: %s", strerror(errno));
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		rt_err_at(ctx, path, -1, "is %s, not a regular file; moec reads inputs from regular files only",
			kind_of(st.st_mode));
		close(fd);
		return -1;
	}
	if (max && (uint64_t)st.st_size > max) {
		rt_err_at(ctx, path, -1, "file of %lld bytes exceeds the limit of %llu bytes for this kind of input",
			(long long)st.st_size, (unsigned long long)max);
		close(fd);
		return -1;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	*size = st.st_size;
	return fd;
}

/* Reads fd to its end, or to max + 1 bytes, into a NUL-terminated buffer;
 * 1 when it holds more than max bytes, -1 on a read error (errno set). */
static int read_capped(int fd, size_t max, char **data, size_t *len)
{
	size_t cap = 0, n = 0;
	char *buf = NULL;
	for (;;) {
		if (n == cap) {
			if (cap > max)
				break;
			size_t nc = cap ? cap * 2 : 65536;
			if (nc > max + 1)
				nc = max + 1;
			char *nb = realloc(buf, nc + 1);
			if (!nb) {
				free(buf);
				return errno = ENOMEM, -1;
			}
			buf = nb;
			cap = nc;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			free(buf);
			errno = e;
			return -1;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	buf[n] = 0;
	*data = buf;
	*len = n;
	return n > max;
}

moe_status moe_read_stream(moe_ctx *ctx, const char *name, int fd, size_t max, char **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	char *buf;
	size_t n;
	int r = read_capped(fd, max ? max : MOE_READ_MAX_DEFAULT, &buf, &n);
	if (r < 0) {
		rt_err_at(ctx, name, -1, "read failed: %s", strerror(errno));
		return errno == ENOMEM ? MOE_ERR_NOMEM : MOE_ERR_IO;
	}
	if (r > 0) {
		free(buf);
		rt_err_at(ctx, name, -1, "more than %zu bytes: input too large", max ? max : (size_t)MOE_READ_MAX_DEFAULT);
		return MOE_ERR_IO;
	}
	*data = buf;
	*len = n;
	return MOE_OK;
}

moe_status moe_read_file_max(moe_ctx *ctx, const char *path, size_t max, char **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	off_t size;
	int fd = open_regular(ctx, path, max ? max : MOE_READ_MAX_DEFAULT, &size);
	if (fd < 0)
		return MOE_ERR_IO;
	char *buf = malloc((size_t)size + 1);
	if (!buf) {
		close(fd);
		rt_err_at(ctx, path, -1, "out of memory reading %lld bytes", (long long)size);
		return MOE_ERR_NOMEM;
	}
	size_t got = 0;
	while (got < (size_t)size) {
		ssize_t r = read(fd, buf + got, (size_t)size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rt_err_at(ctx, path, (int64_t)got, "read failed: %s", r < 0 ? strerror(errno) : "file shrank");
			free(buf);
			close(fd);
			return MOE_ERR_IO;
		}
		got += (size_t)r;
	}
	close(fd);
	buf[got] = 0;
	*data = buf;
	*len = got;
	return MOE_OK;
}

moe_status moe_read_file(moe_ctx *ctx, const char *path, char **data, size_t *len)
{
	return moe_read_file_max(ctx, path, 0, data, len);
}

moe_status rt_map_file(moe_ctx *ctx, const char *path, rt_map *m)
{
	*m = (rt_map){0};
	off_t size;
	int fd = open_regular(ctx, path, 0, &size);
	if (fd < 0)
		return MOE_ERR_IO;
	if ((uint64_t)size > SIZE_MAX) {
		close(fd);
		rt_err_at(ctx, path, -1, "file too large to map");
		return MOE_ERR_IO;
	}
	if (size > 0) {
		void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (p == MAP_FAILED) {
			rt_err_at(ctx, path, -1, "cannot map: %s", strerror(errno));
			close(fd);
			return MOE_ERR_IO;
		}
		m->data = p;
		m->len = (size_t)size;
		m->mapped = true;
	}
	close(fd);
	return MOE_OK;
}

void rt_unmap(rt_map *m)
{
	if (m->mapped)
		munmap((void *)m->data, m->len);
	*m = (rt_map){0};
}

void rt_convert_float(void *dst, moe_dtype to, const unsigned char *src, rt_src from, size_t n)
{
	float *df = dst;
	uint16_t *dh = dst;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* the same type: the bytes as stored, NaN payloads included */
	if ((from == RT_SRC_BF16 && to == MOE_BF16) || (from == RT_SRC_F32 && to == MOE_F32)) {
		memcpy(dst, src, n * (to == MOE_BF16 ? 2 : 4));
		return;
	}
#endif
	for (size_t i = 0; i < n; i++) {
		float f;
		if (from == RT_SRC_F32) {
			uint32_t u = rt_ld32(src + 4 * i);
			memcpy(&f, &u, 4);
		} else if (from == RT_SRC_BF16) {
			uint16_t h = rt_ld16(src + 2 * i);
			if (to == MOE_BF16) {
				dh[i] = h; /* bit-exact copy, NaN payloads included */
				continue;
			}
			f = rt_bf16_to_f32(h);
		} else {
			f = rt_f16_to_f32(rt_ld16(src + 2 * i));
		}
		if (to == MOE_F32)
			df[i] = f;
		else
			dh[i] = rt_f32_to_bf16(f);
	}
}

/* ---- temporaries removed on a signal ----
 * Signals are process-wide, so this registry is the one global state of the
 * library: a fixed table of the paths of live temporaries (files and
 * directories), written under a lock and read by the signal handler without
 * one (a slot's path is complete before its flag is set). */
#define RT_NTEMPS 1280
static char *temp_path[RT_NTEMPS]; /* PATH_MAX bytes each, made on first use, never freed */
static volatile sig_atomic_t temp_used[RT_NTEMPS];
static pthread_mutex_t temp_lock = PTHREAD_MUTEX_INITIALIZER;

int moe_temp_track(const char *path)
{
	size_t n = strlen(path);
	if (n >= PATH_MAX)
		return -1;
	int slot = -1;
	sigset_t old;
	rt_block_signals(true, &old);
	pthread_mutex_lock(&temp_lock);
	for (int i = 0; i < RT_NTEMPS && slot < 0; i++)
		if (!temp_used[i] && (temp_path[i] || (temp_path[i] = malloc(PATH_MAX)))) {
			memcpy(temp_path[i], path, n + 1);
			atomic_signal_fence(memory_order_seq_cst); /* the path is whole before it is listed */
			temp_used[i] = 1;
			slot = i;
		}
	pthread_mutex_unlock(&temp_lock);
	rt_block_signals(false, &old);
	return slot;
}

void moe_temp_forget(int slot)
{
	if (slot < 0 || slot >= RT_NTEMPS)
		return;
	pthread_mutex_lock(&temp_lock);
	temp_used[slot] = 0;
	pthread_mutex_unlock(&temp_lock);
}

/* Async-signal-safe: files first, then (now empty) directories. */
void moe_remove_temporaries(void)
{
	for (int i = 0; i < RT_NTEMPS; i++)
		if (temp_used[i] && unlink(temp_path[i]) == 0)
			temp_used[i] = 0;
	for (int i = 0; i < RT_NTEMPS; i++)
		if (temp_used[i] && rmdir(temp_path[i]) == 0)
			temp_used[i] = 0;
}

static void on_signal(int sig)
{
	moe_remove_temporaries();
	_exit(128 + sig);
}

void rt_signals_install(void (*handler)(int))
{
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handler;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
		sigaddset(&sa.sa_mask, sigs[i]);
	for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
		struct sigaction old;
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
			continue;
		sigaction(sigs[i], &sa, NULL);
	}
}

void moe_cleanup_on_signals(void)
{
	rt_signals_install(on_signal);
}

void rt_block_signals(bool on, sigset_t *old)
{
	if (on) {
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGINT);
		sigaddset(&set, SIGTERM);
		sigaddset(&set, SIGHUP);
		pthread_sigmask(SIG_BLOCK, &set, old);
	} else {
		pthread_sigmask(SIG_SETMASK, old, NULL);
	}
}

int moe_temp_file(char *tmpl, int *slot)
{
	sigset_t old;
	rt_block_signals(true, &old);
	int fd = mkstemp(tmpl);
	*slot = fd >= 0 ? moe_temp_track(tmpl) : -1;
	rt_block_signals(false, &old);
	return fd;
}

char *moe_temp_dir(char *tmpl, int *slot)
{
	sigset_t old;
	rt_block_signals(true, &old);
	char *d = mkdtemp(tmpl);
	*slot = d ? moe_temp_track(tmpl) : -1;
	rt_block_signals(false, &old);
	return d;
}

/* ---- output files ----
 * A regular (or new) target gets TARGET.tmp.XXXXXX beside it, fsync and
 * rename; a symbolic link is followed to its target first. An existing FIFO
 * or character device is written straight through (binary formats are
 * refused on a terminal); other kinds of file are refused. */

struct moe_atomic_file {
	moe_ctx *ctx;
	char *path; /* the file written: the target, symbolic links resolved */
	char *tmp;  /* NULL when written straight through */
	FILE *fp;
	int slot;
	int defer; /* its ctx_defer handle when opened inside a guard, else -1 */
};

static void atomic_free(moe_atomic_file *f)
{
	if (f->defer >= 0)
		ctx_undefer(f->ctx, (uint32_t)f->defer);
	ctx_free(f->ctx, f->path, 0);
	ctx_free(f->ctx, f->tmp, 0);
	ctx_free(f->ctx, f, sizeof *f);
}

/* A copy of s in the context's memory; NULL (with an error) when refused. */
static char *out_strdup(moe_ctx *ctx, const char *path, const char *s, size_t n)
{
	char *p = ctx_soft_alloc(ctx, n + 1);
	if (!p) {
		rt_err_at(ctx, path, -1, "out of memory");
		return NULL;
	}
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

/* The file a write to path lands on: path itself, or a symbolic link's
 * resolved target. NULL with a diagnostic; *st is valid when *exists. */
static char *output_target(moe_ctx *ctx, const char *path, struct stat *st, bool *exists)
{
	*exists = false;
	if (lstat(path, st) != 0) {
		if (errno != ENOENT) {
			rt_err_at(ctx, path, -1, "cannot stat the output: %s", strerror(errno));
			return NULL;
		}
		return out_strdup(ctx, path, path, strlen(path));
	}
	*exists = true;
	if (!S_ISLNK(st->st_mode))
		return out_strdup(ctx, path, path, strlen(path));
	char *r = realpath(path, NULL); /* libc's malloc: copied below */
	if (!r && stat(path, st) == 0 && !S_ISREG(st->st_mode) && !S_ISDIR(st->st_mode)) {
		/* /dev/stdout -> /proc/self/fd/1 -> "pipe:[N]": not a path, but open() follows it */
		return out_strdup(ctx, path, path, strlen(path));
	}
	if (!r) {
		rt_err_at(ctx, path, -1, "the output is a symbolic link that cannot be resolved: %s", strerror(errno));
		return NULL;
	}
	if (stat(r, st) != 0) {
		rt_err_at(ctx, path, -1, "cannot stat the output: %s", strerror(errno));
		free(r);
		return NULL;
	}
	char *c = out_strdup(ctx, path, r, strlen(r));
	free(r);
	return c;
}

/* TARGET.tmp.XXXXXX, the base name shortened so that it fits NAME_MAX. */
static char *temp_name(moe_ctx *ctx, const char *target)
{
	static const char suffix[] = ".tmp.XXXXXX";
	const char *slash = strrchr(target, '/');
	size_t dir = slash ? (size_t)(slash - target) + 1 : 0, base = strlen(target) - dir;
	if (base > NAME_MAX - (sizeof suffix - 1))
		base = NAME_MAX - (sizeof suffix - 1);
	char *t = ctx_soft_alloc(ctx, dir + base + sizeof suffix);
	if (t) {
		memcpy(t, target, dir + base);
		memcpy(t + dir + base, suffix, sizeof suffix);
	}
	return t;
}

/* Straight through to an existing FIFO or character device. */
static bool open_through(moe_atomic_file *f, const char *path, unsigned flags)
{
	/* O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) */
	int fd = open(f->path, O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		rt_err_at(f->ctx, path, -1, "cannot open the output: %s",
			errno == ENXIO ? "it is a FIFO with no reader" : strerror(errno));
		return false;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	if ((flags & MOE_OUTPUT_BINARY) && isatty(fd)) {
		rt_err_at(f->ctx, path, -1, "refusing to write a binary file to a terminal");
		close(fd);
		return false;
	}
	f->fp = fdopen(fd, "wb");
	if (!f->fp) {
		rt_err_at(f->ctx, path, -1, "cannot open a stream: %s", strerror(errno));
		close(fd);
		return false;
	}
	return true;
}

static bool open_temp(moe_atomic_file *f, const char *path)
{
	f->tmp = temp_name(f->ctx, f->path);
	if (!f->tmp) {
		rt_err_at(f->ctx, path, -1, "out of memory");
		return false;
	}
	int fd = moe_temp_file(f->tmp, &f->slot);
	if (fd < 0) {
		rt_err_at(f->ctx, path, -1, "cannot create a temporary file beside it: %s", strerror(errno));
		return false;
	}
	/* mkstemp makes 0600; outputs are ordinary files */
	(void)fchmod(fd, rt_output_mode());
	f->fp = fdopen(fd, "wb");
	if (!f->fp) {
		rt_err_at(f->ctx, path, -1, "cannot open a stream: %s", strerror(errno));
		close(fd);
		unlink(f->tmp);
		moe_temp_forget(f->slot);
		return false;
	}
	return true;
}

static void drop_temp(moe_atomic_file *f);

/* A throw unwinds past an open output: close it and remove the temporary
 * (the blocks of f are freed by the unwinding). */
static void atomic_unwind(void *arg)
{
	moe_atomic_file *f = arg;
	if (f->fp)
		fclose(f->fp);
	drop_temp(f);
}

moe_atomic_file *moe_output_open(moe_ctx *ctx, const char *path, unsigned flags)
{
	moe_atomic_file *f = ctx_soft_alloc(ctx, sizeof *f);
	if (!f) {
		rt_err_at(ctx, path, -1, "out of memory");
		return NULL;
	}
	f->ctx = ctx;
	f->slot = -1;
	f->defer = -1;
	struct stat st;
	bool exists, ok = false;
	f->path = output_target(ctx, path, &st, &exists);
	if (!f->path)
		;
	else if (exists && S_ISDIR(st.st_mode))
		rt_err_at(ctx, path, -1, "the output is a directory");
	else if (exists && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)))
		ok = open_through(f, path, flags);
	else if (exists && !S_ISREG(st.st_mode))
		rt_err_at(ctx, path, -1, "the output is %s; moec replaces only regular files", kind_of(st.st_mode));
	else
		ok = open_temp(f, path);
	if (!ok) {
		atomic_free(f);
		return NULL;
	}
	/* inside a guarded call, out of memory before commit or abort drops the temporary */
	if (ctx_guarded(ctx))
		f->defer = (int)ctx_defer(ctx, atomic_unwind, f);
	return f;
}

moe_atomic_file *moe_atomic_open(moe_ctx *ctx, const char *path)
{
	return moe_output_open(ctx, path, 0);
}

FILE *moe_atomic_stream(moe_atomic_file *f)
{
	return f->fp;
}

static void drop_temp(moe_atomic_file *f)
{
	if (f->tmp) {
		unlink(f->tmp);
		moe_temp_forget(f->slot);
	}
}

void moe_atomic_abort(moe_atomic_file *f)
{
	if (!f)
		return;
	if (f->fp)
		fclose(f->fp);
	drop_temp(f);
	atomic_free(f);
}

void rt_sync_dir(const char *path)
{
	const char *slash = strrchr(path, '/');
	char dir[PATH_MAX] = ".";
	if (slash) {
		size_t n = slash == path ? 1 : (size_t)(slash - path);
		if (n >= sizeof dir)
			return;
		memcpy(dir, path, n);
		dir[n] = 0;
	}
	int fd = open(dir, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
}

moe_status moe_atomic_commit(moe_atomic_file *f)
{
	moe_ctx *ctx = f->ctx;
	ctx_commit_point(ctx); /* a doomed guarded call renames nothing into place */
	int err = 0;
	const char *what = NULL;
	errno = 0;
	if (ferror(f->fp)) {
		what = "write failed";
		err = errno ? errno : EIO;
	} else if (fflush(f->fp) != 0) {
		what = "write failed";
		err = errno;
	} else if (f->tmp && fsync(fileno(f->fp)) != 0) {
		what = "fsync failed";
		err = errno;
	}
	int rc = fclose(f->fp);
	f->fp = NULL;
	if (!what && rc != 0) {
		what = "close failed";
		err = errno;
	}
	if (!what && f->tmp && rename(f->tmp, f->path) != 0) {
		what = "cannot rename the temporary into place";
		err = errno;
	}
	if (what) {
		rt_err_at(ctx, f->path, -1, "%s: %s", what, strerror(err ? err : EIO));
		drop_temp(f);
		atomic_free(f);
		return MOE_ERR_IO;
	}
	if (f->tmp) {
		moe_temp_forget(f->slot);
		rt_sync_dir(f->path);
	}
	atomic_free(f);
	return MOE_OK;
}

moe_status moe_write_output(moe_ctx *ctx, const char *path, unsigned flags, const void *data, size_t len)
{
	moe_atomic_file *f = moe_output_open(ctx, path, flags);
	if (!f)
		return MOE_ERR_IO;
	if (len && fwrite(data, 1, len, f->fp) != len) {
		int e = errno;
		rt_err_at(ctx, path, -1, "write failed: %s", strerror(e ? e : EIO));
		moe_atomic_abort(f);
		return MOE_ERR_IO;
	}
	return moe_atomic_commit(f);
}

moe_status moe_write_file_atomic(moe_ctx *ctx, const char *path, const void *data, size_t len)
{
	return moe_write_output(ctx, path, 0, data, len);
}

/* ---- outputs that would overwrite inputs ---- */

/* Identity of a path: (dev, ino) of an existing regular file; for a path that
 * does not exist, its directory's real path and its base name. */
typedef struct file_id {
	bool exists, regular;
	dev_t dev;
	ino_t ino;
	char *canon;
} file_id;

static file_id identify(const char *path)
{
	file_id id = {0};
	struct stat st;
	if (stat(path, &st) == 0) {
		id.exists = true;
		id.regular = S_ISREG(st.st_mode);
		id.dev = st.st_dev;
		id.ino = st.st_ino;
		return id;
	}
	const char *slash = strrchr(path, '/');
	char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
	char *real = dir ? realpath(dir, NULL) : NULL;
	const char *base = slash ? slash + 1 : path;
	if (real) {
		size_t n = strlen(real) + strlen(base) + 2;
		id.canon = malloc(n);
		if (id.canon)
			snprintf(id.canon, n, "%s/%s", real, base);
	}
	free(real);
	free(dir);
	return id;
}

static bool same_file(const file_id *a, const file_id *b)
{
	if (a->exists && b->exists)
		return a->regular && b->regular && a->dev == b->dev && a->ino == b->ino;
	return !a->exists && !b->exists && a->canon && b->canon && !strcmp(a->canon, b->canon);
}

moe_status moe_check_outputs(moe_ctx *ctx, const char *const *inputs, size_t nin, const char *const *outputs,
	size_t nout)
{
	IR_ASSERT(ctx && (inputs || nin == 0) && (outputs || nout == 0)); /* API misuse: docs/api.md */
	bool bad = false;
	file_id *in = calloc(nin + 1, sizeof *in), *out = calloc(nout + 1, sizeof *out);
	if (!in || !out) {
		free(in);
		free(out);
		rt_err_at(ctx, "moec", -1, "out of memory");
		return MOE_ERR_NOMEM;
	}
	for (size_t i = 0; i < nin; i++)
		if (inputs[i])
			in[i] = identify(inputs[i]);
	for (size_t j = 0; j < nout; j++) {
		if (!outputs[j])
			continue;
		out[j] = identify(outputs[j]);
		for (size_t i = 0; i < nin && !bad; i++)
			if (inputs[i] && in[i].exists && same_file(&out[j], &in[i])) {
				rt_err_at(ctx, outputs[j], -1, "the output is the input file %s; refusing to overwrite it",
					inputs[i]);
				bad = true;
			}
		for (size_t k = 0; k < j && !bad; k++)
			if (outputs[k] && same_file(&out[j], &out[k])) {
				rt_err_at(ctx, outputs[j], -1, "the same file is named by two outputs (also %s)", outputs[k]);
				bad = true;
			}
	}
	for (size_t i = 0; i < nin; i++)
		free(in[i].canon);
	for (size_t j = 0; j < nout; j++)
		free(out[j].canon);
	free(in);
	free(out);
	return bad ? MOE_ERR_INVALID : MOE_OK;
}

/* ---- small utilities ---- */

char *rt_strdup(moe_ctx *ctx, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = ctx_alloc(ctx, n);
	memcpy(p, s, n);
	return p;
}

void rt_strfree(moe_ctx *ctx, char *s)
{
	if (s)
		ctx_free(ctx, s, strlen(s) + 1);
}
