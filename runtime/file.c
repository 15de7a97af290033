/* runtime/file.c: whole-file reading, read-only mappings and atomic output
 * (write PATH.tmp.XXXXXX beside PATH, fsync, rename; remove it on failure). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
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
		char *s = realloc(b->s, nc);
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

/* Open a regular file for reading; -1 with a diagnostic otherwise. */
static int open_regular(moe_ctx *ctx, const char *path, off_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
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
		rt_err_at(ctx, path, -1, "not a regular file");
		close(fd);
		return -1;
	}
	*size = st.st_size;
	return fd;
}

moe_status moe_read_file(moe_ctx *ctx, const char *path, char **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	off_t size;
	int fd = open_regular(ctx, path, &size);
	if (fd < 0)
		return MOE_ERR_IO;
	if ((uint64_t)size >= SIZE_MAX) {
		close(fd);
		rt_err_at(ctx, path, -1, "file too large");
		return MOE_ERR_IO;
	}
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

moe_status rt_map_file(moe_ctx *ctx, const char *path, rt_map *m)
{
	*m = (rt_map){0};
	off_t size;
	int fd = open_regular(ctx, path, &size);
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

/* ---- atomic output ---- */

struct moe_atomic_file {
	moe_ctx *ctx;
	char *path, *tmp;
	FILE *fp;
};

static void atomic_free(moe_atomic_file *f)
{
	free(f->path);
	free(f->tmp);
	free(f);
}

moe_atomic_file *moe_atomic_open(moe_ctx *ctx, const char *path)
{
	static const char suffix[] = ".tmp.XXXXXX";
	size_t n = strlen(path);
	moe_atomic_file *f = calloc(1, sizeof *f);
	if (!f || !(f->path = malloc(n + 1)) || !(f->tmp = malloc(n + sizeof suffix))) {
		if (f)
			atomic_free(f);
		rt_err_at(ctx, path, -1, "out of memory");
		return NULL;
	}
	f->ctx = ctx;
	memcpy(f->path, path, n + 1);
	memcpy(f->tmp, path, n);
	memcpy(f->tmp + n, suffix, sizeof suffix);
	int fd = mkstemp(f->tmp);
	if (fd < 0) {
		rt_err_at(ctx, path, -1, "cannot create a temporary file beside it: %s", strerror(errno));
		atomic_free(f);
		return NULL;
	}
	/* mkstemp makes 0600; outputs are ordinary files */
	(void)fchmod(fd, rt_output_mode());
	f->fp = fdopen(fd, "wb");
	if (!f->fp) {
		rt_err_at(ctx, path, -1, "cannot open a stream: %s", strerror(errno));
		close(fd);
		unlink(f->tmp);
		atomic_free(f);
		return NULL;
	}
	return f;
}

FILE *moe_atomic_stream(moe_atomic_file *f)
{
	return f->fp;
}

void moe_atomic_abort(moe_atomic_file *f)
{
	if (!f)
		return;
	if (f->fp)
		fclose(f->fp);
	unlink(f->tmp);
	atomic_free(f);
}

/* fsync the directory holding path so the rename is durable; best effort. */
static void sync_dir(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir;
	if (!slash) {
		dir = strdup(".");
	} else {
		size_t n = slash == path ? 1 : (size_t)(slash - path);
		dir = malloc(n + 1);
		if (dir) {
			memcpy(dir, path, n);
			dir[n] = 0;
		}
	}
	if (!dir)
		return;
	int fd = open(dir, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
	free(dir);
}

moe_status moe_atomic_commit(moe_atomic_file *f)
{
	moe_ctx *ctx = f->ctx;
	int err = 0;
	const char *what = NULL;
	if (ferror(f->fp)) {
		what = "write failed";
		err = errno ? errno : EIO;
	} else if (fflush(f->fp) != 0) {
		what = "write failed";
		err = errno;
	} else if (fsync(fileno(f->fp)) != 0) {
		what = "fsync failed";
		err = errno;
	}
	int rc = fclose(f->fp);
	f->fp = NULL;
	if (!what && rc != 0) {
		what = "close failed";
		err = errno;
	}
	if (!what && rename(f->tmp, f->path) != 0) {
		what = "cannot rename the temporary into place";
		err = errno;
	}
	if (what) {
		rt_err_at(ctx, f->path, -1, "%s: %s", what, strerror(err));
		unlink(f->tmp);
		atomic_free(f);
		return MOE_ERR_IO;
	}
	sync_dir(f->path);
	atomic_free(f);
	return MOE_OK;
}

moe_status moe_write_file_atomic(moe_ctx *ctx, const char *path, const void *data, size_t len)
{
	moe_atomic_file *f = moe_atomic_open(ctx, path);
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
