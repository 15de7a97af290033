/* cli/ep_digest.c: what every rank of `moec run --ep N` must agree
 * on before it computes (docs/expert-parallel.md, "Ranks agree"). Each field
 * is an FNV-1a-64 hash of a canonical serialisation; the ranks exchange the
 * vectors in their first collective, so a mismatch names the field. It is a
 * check against mistakes (a rank given another layer, option or checkpoint),
 * not against an adversary:
 *   dims      the layer's dims after --set (the `dims` line of its textual IR)
 *   dtype     the dtype of every input and weight node
 *   layer     the whole textual IR of the layer after --set
 *   pipeline  the expert-parallel pipeline (without the rank)
 *   placement the device of each expert: --placement's list as numbers, or
 *             the default ranges written out (the same placement spelled
 *             either way agrees)
 *   engine    --engine and --kernels
 *   tokens    --tokens and the global token count
 *   weights   per weight tensor the layer binds: its name, dtype, shape and
 *             byte size in the checkpoint, and 3 x 256 of its bytes (its
 *             start, middle and end), read with pread
 *   input     the bytes of --input */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

const char *const cli_ep_digest_names[CLI_EP_DIGESTS] = {"dims", "dtype", "layer", "pipeline", "placement", "engine",
	"tokens", "weights", "input"};

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static void fnv(uint64_t *h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		*h ^= b[i];
		*h *= FNV_PRIME;
	}
}

/* A string and its terminating NUL, so that fields never run together. */
static void fnv_str(uint64_t *h, const char *s)
{
	fnv(h, s ? s : "", strlen(s ? s : "") + 1);
}

static void fnv_i64(uint64_t *h, int64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)v >> (8 * i)); /* little-endian whatever the host */
	fnv(h, b, sizeof b);
}

/* The layer's textual IR; its dims line; the dtypes of inputs and weights. */
static int layer_fields(moe_ctx *ctx, const moe_module *m, uint64_t *d)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f || moe_module_print(m, f) != MOE_OK || fclose(f) != 0) {
		free(text);
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, "moec"), "--ep: cannot print the layer for the ranks' check");
		return 1;
	}
	fnv(&d[CLI_EP_LAYER], text, len);
	const char *dims = strstr(text, "\n  dims ");
	if (dims)
		fnv(&d[CLI_EP_DIMS], dims, strcspn(dims + 1, "\n") + 1);
	free(text);
	const moe_graph *g = moe_module_graph(m, 0);
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++) {
		moe_op op = moe_node_op(g, i);
		if (op != MOE_OP_INPUT && op != MOE_OP_WEIGHT)
			continue;
		fnv_str(&d[CLI_EP_DTYPE], moe_node_name(g, i));
		fnv_str(&d[CLI_EP_DTYPE], moe_dtype_name(moe_node_dtype(g, i)));
	}
	return 0;
}

/* Up to 256 bytes of the file at off. */
static void sample(uint64_t *h, int fd, int64_t off, size_t n)
{
	unsigned char buf[256];
	if (n > sizeof buf)
		n = sizeof buf;
	ssize_t got = fd >= 0 ? pread(fd, buf, n, (off_t)off) : -1;
	fnv_i64(h, got);
	if (got > 0)
		fnv(h, buf, (size_t)got);
}

typedef struct wctx {
	moe_checkpoint *ck;
	char path[4096]; /* the file open as fd */
	int fd;
} wctx;

static void tensor(wctx *w, uint64_t *h, const char *name)
{
	const char *file = NULL;
	const moe_st_tensor *t = moe_checkpoint_find(w->ck, name, &file);
	fnv_str(h, name);
	if (!t) {
		fnv_str(h, "absent");
		return;
	}
	fnv_str(h, moe_st_dtype_name(t->dtype));
	fnv_i64(h, t->rank);
	for (int k = 0; k < t->rank; k++)
		fnv_i64(h, t->shape[k]);
	fnv_i64(h, (int64_t)t->nbytes);
	if (file && strcmp(file, w->path)) {
		if (w->fd >= 0)
			close(w->fd);
		snprintf(w->path, sizeof w->path, "%s", file);
		w->fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	}
	int64_t n = (int64_t)t->nbytes, mid = n / 2 > 128 ? n / 2 - 128 : 0, end = n > 256 ? n - 256 : 0;
	sample(h, w->fd, t->offset, (size_t)n);
	sample(h, w->fd, t->offset + mid, (size_t)(n - mid));
	sample(h, w->fd, t->offset + end, (size_t)(n - end));
}

/* The source of weight node i with {layer} replaced, into buf. */
static void source_of(const moe_graph *g, moe_id i, char *buf, size_t cap)
{
	const char *s = moe_node_get_str(g, i, "source");
	int64_t layer = 0;
	const char *at = s ? strstr(s, "{layer}") : NULL;
	if (at && moe_graph_get_dim(g, "layer", &layer))
		snprintf(buf, cap, "%.*s%lld%s", (int)(at - s), s, (long long)layer, at + 7);
	else
		snprintf(buf, cap, "%s", s ? s : moe_node_name(g, i));
}

static int weight_fields(moe_ctx *ctx, const moe_module *m, const char *const *paths, size_t np, uint64_t *h)
{
	int errors = moe_error_count(ctx);
	wctx w = {.ck = moe_checkpoint_open(ctx, paths, np), .fd = -1};
	if (!w.ck)
		return 1;
	const moe_graph *g = moe_module_graph(m, 0);
	char src[1024], name[1200];
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++) {
		if (moe_node_op(g, i) != MOE_OP_WEIGHT)
			continue;
		source_of(g, i, src, sizeof src);
		const char *e = strstr(src, "{e}");
		int64_t E = e && moe_node_rank(g, i) > 0 ? moe_node_shape(g, i)[0] : 0;
		if (!e) {
			tensor(&w, h, src);
			continue;
		}
		for (int64_t k = 0; k < E; k++) {
			snprintf(name, sizeof name, "%.*s%lld%s", (int)(e - src), src, (long long)k, e + 3);
			tensor(&w, h, name);
		}
	}
	if (w.fd >= 0)
		close(w.fd);
	moe_checkpoint_close(w.ck);
	return moe_error_count(ctx) != errors;
}

static int input_field(moe_ctx *ctx, const char *path, uint64_t *h)
{
	int fd = path ? open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
	if (fd < 0)
		return 0; /* the reader reports it */
	unsigned char buf[1 << 16];
	ssize_t n;
	while ((n = read(fd, buf, sizeof buf)) > 0)
		fnv(h, buf, (size_t)n);
	(void)ctx;
	close(fd);
	return 0;
}

/* The device of every expert: the list given (as numbers), or the default
 * contiguous ranges (the first E mod N devices one more). */
static void placement_field(const opts *o, const moe_module *m, int64_t N, uint64_t *h)
{
	int64_t E = 0;
	if (o->placement || !moe_graph_get_dim(moe_module_graph(m, 0), "E", &E) || E < 1 || N < 1) {
		const char *p = o->placement ? o->placement : "";
		while (*p) {
			char *end;
			long long v = strtoll(p, &end, 10);
			if (end == p) { /* not a number: its text (the pass reports it) */
				fnv_str(h, p);
				return;
			}
			fnv_i64(h, v);
			p = *end == ',' ? end + 1 : end;
			if (*end && *end != ',') {
				fnv_str(h, end);
				return;
			}
		}
		return;
	}
	int64_t q = E / N, r = E % N, e = 0;
	for (int64_t dev = 0; dev < N; dev++)
		for (int64_t k = 0; k < q + (dev < r); k++, e++)
			fnv_i64(h, dev);
}

int cli_ep_digest(moe_ctx *ctx, const opts *o, const moe_module *m, int64_t N, const char *pipeline, int64_t tokens,
	uint64_t d[CLI_EP_DIGESTS])
{
	for (int i = 0; i < CLI_EP_DIGESTS; i++)
		d[i] = FNV_OFFSET;
	fnv_str(&d[CLI_EP_PIPELINE], pipeline);
	placement_field(o, m, N, &d[CLI_EP_PLACEMENT]);
	fnv_str(&d[CLI_EP_ENGINE], o->engine ? o->engine : "interp");
	fnv_str(&d[CLI_EP_ENGINE], o->kernels ? o->kernels : "auto");
	fnv_str(&d[CLI_EP_ENGINE], o->target ? o->target : "host");
	fnv_str(&d[CLI_EP_TOKENS], o->serve_tokens);
	fnv_i64(&d[CLI_EP_TOKENS], tokens);
	if (layer_fields(ctx, m, d))
		return 1;
	char *wcopy = o->weights ? strdup(o->weights) : NULL;
	const char *paths[CLI_MAX_PATHS];
	size_t np = 0;
	char *save = NULL;
	for (char *p = wcopy ? strtok_r(wcopy, ",", &save) : NULL; p && np < CLI_MAX_PATHS; p = strtok_r(NULL, ",", &save))
		paths[np++] = p;
	int st = np && weight_fields(ctx, m, paths, np, &d[CLI_EP_WEIGHTS]);
	free(wcopy);
	return st || input_field(ctx, o->input, &d[CLI_EP_INPUT]);
}
