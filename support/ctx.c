/* support/ctx.c: the context (allocator, interned strings, sources, diagnostics). */
#include <stdarg.h>
#include <string.h>

#include "support/support.h"

typedef struct diag {
	moe_diag_kind kind;
	moe_loc loc;
	char *msg;
} diag;

typedef struct source {
	const char *file; /* interned */
	char *text;
	size_t len;
} source;

typedef struct strnode {
	struct strnode *next;
	char s[];
} strnode;

struct moe_ctx {
	moe_alloc_fn alloc;
	void *ud;
	diag *diags;
	uint32_t ndiags, dcap;
	int nerrors;
	int max_errors; /* errors kept before "too many errors" (0: no limit) */
	source *srcs;
	uint32_t nsrcs, scap;
	strnode *strs;
	ctx_vec passes; /* externally registered passes (moe_pass_info) */
};

static void *default_alloc(void *ud, void *p, size_t o, size_t n)
{
	(void)ud;
	(void)o;
	if (n == 0) {
		free(p);
		return NULL;
	}
	return realloc(p, n);
}

void ir_assert_fail(const char *file, int line, const char *expr)
{
	fprintf(stderr, "moec: internal error at %s:%d: assertion '%s' failed\n", file, line, expr);
	abort();
}

moe_ctx *moe_ctx_new(moe_alloc_fn alloc, void *ud)
{
	if (!alloc)
		alloc = default_alloc;
	moe_ctx *c = alloc(ud, NULL, 0, sizeof *c);
	if (!c)
		return NULL;
	memset(c, 0, sizeof *c);
	c->alloc = alloc;
	c->ud = ud;
	c->max_errors = MOE_DIAG_MAX_ERRORS;
	return c;
}

void moe_ctx_free(moe_ctx *c)
{
	if (!c)
		return;
	moe_diag_clear(c);
	ctx_free(c, c->diags, c->dcap * sizeof(diag));
	for (uint32_t i = 0; i < c->nsrcs; i++)
		ctx_free(c, c->srcs[i].text, c->srcs[i].len + 1);
	ctx_free(c, c->srcs, c->scap * sizeof(source));
	for (uint32_t i = 0; c->passes.row && i < c->passes.n; i++)
		ctx_free(c, ((void **)c->passes.data)[i], c->passes.row);
	ctx_free(c, c->passes.data, (size_t)c->passes.cap * c->passes.esz);
	for (strnode *s = c->strs, *n; s; s = n) {
		n = s->next;
		ctx_free(c, s, sizeof *s + strlen(s->s) + 1);
	}
	c->alloc(c->ud, c, sizeof *c, 0);
}

const char *moe_version_string(void)
{
#ifdef MOEC_VERSION_STRING
	return MOEC_VERSION_STRING;
#else
	return "unknown";
#endif
}

const char *moe_status_string(moe_status s)
{
	switch (s) {
	case MOE_OK: return "ok";
	case MOE_ERR_INVALID: return "invalid input";
	case MOE_ERR_IO: return "i/o error";
	case MOE_ERR_FORMAT: return "malformed file";
	case MOE_ERR_UNSUPPORTED: return "unsupported";
	case MOE_ERR_NOMEM: return "out of memory";
	case MOE_ERR_RUNTIME: return "run-time fault";
	case MOE_ERR_INTERNAL: return "internal error";
	}
	return "unknown status";
}

void *ctx_alloc(moe_ctx *c, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (n == 0)
		n = 1;
	void *p = c->alloc(c->ud, NULL, 0, n);
	if (!p) {
		fprintf(stderr, "moec: out of memory allocating %zu bytes\n", n);
		abort();
	}
	memset(p, 0, n);
	return p;
}

void *ctx_try_alloc(moe_ctx *c, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	void *p = c->alloc(c->ud, NULL, 0, n ? n : 1);
	if (p)
		memset(p, 0, n ? n : 1);
	return p;
}

void *ctx_realloc(moe_ctx *c, void *p, size_t o, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	void *q = c->alloc(c->ud, p, o, n);
	if (!q && n) {
		fprintf(stderr, "moec: out of memory allocating %zu bytes\n", n);
		abort();
	}
	if (n > o)
		memset((char *)q + o, 0, n - o);
	return q;
}

void ctx_free(moe_ctx *c, void *p, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (p)
		c->alloc(c->ud, p, n, 0);
}

void ctx_grow(moe_ctx *c, void **arr, uint32_t *cap, uint32_t need, size_t esz)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (need <= *cap)
		return;
	uint32_t nc = *cap ? *cap : 8;
	while (nc < need)
		nc *= 2;
	*arr = ctx_realloc(c, *arr, (size_t)*cap * esz, (size_t)nc * esz);
	*cap = nc;
}

ctx_vec *ctx_passes(moe_ctx *c)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return &c->passes;
}

void moe_free(moe_ctx *c, void *p)
{
	(void)c;
	free(p); /* strings returned by cJSON-based printers use malloc */
}

const char *ctx_intern(moe_ctx *c, const char *s)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (!s)
		return NULL;
	for (strnode *n = c->strs; n; n = n->next)
		if (!strcmp(n->s, s))
			return n->s;
	size_t len = strlen(s);
	strnode *n = ctx_alloc(c, sizeof *n + len + 1);
	memcpy(n->s, s, len + 1);
	n->next = c->strs;
	c->strs = n;
	return n->s;
}

moe_loc moe_loc_none(void)
{
	return (moe_loc){NULL, 0, 0, -1};
}

moe_loc moe_loc_file(moe_ctx *c, const char *file)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return (moe_loc){ctx_intern(c, file), 0, 0, -1};
}

moe_loc moe_loc_at(moe_ctx *c, const char *file, int line, int col)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return (moe_loc){ctx_intern(c, file), line, col, -1};
}

void moe_ctx_add_source(moe_ctx *c, const char *file, const char *text, size_t len)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	ctx_grow(c, (void **)&c->srcs, &c->scap, c->nsrcs + 1, sizeof(source));
	source *s = &c->srcs[c->nsrcs++];
	s->file = ctx_intern(c, file);
	s->text = ctx_alloc(c, len + 1);
	memcpy(s->text, text, len);
	s->len = len;
}

const char *ctx_source_line(const moe_ctx *c, const char *file, int line, size_t *len)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (!file || line <= 0)
		return NULL;
	for (uint32_t i = c->nsrcs; i-- > 0;) {
		const source *s = &c->srcs[i];
		if (strcmp(s->file, file))
			continue;
		const char *p = s->text, *end = s->text + s->len;
		for (int l = 1; l < line && p < end; p++)
			if (*p == '\n')
				l++;
		if (p >= end && line > 1)
			return NULL;
		const char *e = memchr(p, '\n', (size_t)(end - p));
		*len = e ? (size_t)(e - p) : (size_t)(end - p);
		return p;
	}
	return NULL;
}

static void diag_push(moe_ctx *c, moe_diag_kind kind, moe_loc loc, char *msg)
{
	ctx_grow(c, (void **)&c->diags, &c->dcap, c->ndiags + 1, sizeof(diag));
	c->diags[c->ndiags++] = (diag){kind, loc, msg};
}

/* The error that reaches the limit is followed by the note "too many
 * errors; stopping"; past it every diagnostic is dropped (errors are still
 * counted), since readers stop there. */
void ctx_vdiag(moe_ctx *c, moe_diag_kind kind, moe_loc loc, const char *fmt, va_list ap)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (c->max_errors > 0 && c->nerrors >= c->max_errors) {
		if (kind == MOE_DIAG_ERROR)
			c->nerrors++;
		return;
	}
	va_list aq;
	va_copy(aq, ap);
	int n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n < 0)
		n = 0;
	char *msg = ctx_alloc(c, (size_t)n + 1);
	vsnprintf(msg, (size_t)n + 1, fmt, ap);
	diag_push(c, kind, loc, msg);
	if (kind == MOE_DIAG_ERROR && ++c->nerrors == c->max_errors) {
		static const char stop[] = "too many errors; stopping";
		char *m = ctx_alloc(c, sizeof stop);
		memcpy(m, stop, sizeof stop);
		moe_loc at = moe_loc_none();
		at.file = loc.file;
		diag_push(c, MOE_DIAG_NOTE, at, m);
	}
}

void moe_diag_set_limit(moe_ctx *c, int max_errors)
{
	c->max_errors = max_errors > 0 ? max_errors : 0;
}

int moe_diag_limit_reached(const moe_ctx *c)
{
	return c->max_errors > 0 && c->nerrors >= c->max_errors;
}

void moe_diag(moe_ctx *c, moe_diag_kind kind, moe_loc loc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ctx_vdiag(c, kind, loc, fmt, ap);
	va_end(ap);
}

void ctx_err_at(moe_ctx *c, const char *file, int64_t offset, const char *fmt, ...)
{
	moe_loc loc = moe_loc_file(c, file);
	loc.offset = offset < 0 ? -1 : offset;
	va_list ap;
	va_start(ap, fmt);
	ctx_vdiag(c, MOE_DIAG_ERROR, loc, fmt, ap);
	va_end(ap);
}

int moe_error_count(const moe_ctx *c)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return c->nerrors;
}

size_t moe_diag_count(const moe_ctx *c)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return c->ndiags;
}

void moe_diag_get(const moe_ctx *c, size_t i, moe_diag_kind *kind, moe_loc *loc, const char **msg)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	IR_ASSERT(i < c->ndiags);
	if (kind)
		*kind = c->diags[i].kind;
	if (loc)
		*loc = c->diags[i].loc;
	if (msg)
		*msg = c->diags[i].msg;
}

void moe_diag_clear(moe_ctx *c)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	for (uint32_t i = 0; i < c->ndiags; i++)
		ctx_free(c, c->diags[i].msg, strlen(c->diags[i].msg) + 1);
	c->ndiags = 0;
	c->nerrors = 0;
}

static const char *kind_name(moe_diag_kind k)
{
	return k == MOE_DIAG_ERROR ? "error" : k == MOE_DIAG_WARNING ? "warning" : "note";
}

/* Text from files goes to a terminal: control bytes but tab (an ESC would
 * start an escape sequence) are printed as '?'. */
static void put_safe(FILE *out, const char *s, size_t n)
{
	for (size_t i = 0; i < n && s[i]; i++)
		fputc(((unsigned char)s[i] < 0x20 && s[i] != '\t') || s[i] == 0x7f ? '?' : s[i], out);
}

/* The quoted source line: at most QUOTE bytes around the column. */
#define QUOTE 160
static void put_quote(FILE *out, const char *line, size_t len, int col)
{
	size_t c = col > 0 ? (size_t)col - 1 : 0, from = c > QUOTE / 2 ? c - QUOTE / 2 : 0;
	size_t n = len - from < QUOTE ? len - from : QUOTE;
	fputs(from ? "..." : "", out);
	put_safe(out, line + from, n);
	fputs(from + n < len ? "...\n" : "\n", out);
	for (size_t k = from ? from - 3 : 0; k < c && k < len; k++)
		fputc(k >= from && line[k] == '\t' ? '\t' : ' ', out);
	fputs("^\n", out);
}

void moe_diag_print(const moe_ctx *c, FILE *out)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	for (uint32_t i = 0; i < c->ndiags; i++) {
		const diag *d = &c->diags[i];
		const char *file = d->loc.file ? d->loc.file : "moec";
		if (d->loc.line > 0)
			fprintf(out, "%s:%d:%d: %s: ", file, d->loc.line, d->loc.col, kind_name(d->kind));
		else
			fprintf(out, "%s: %s: ", file, kind_name(d->kind));
		put_safe(out, d->msg, strlen(d->msg));
		if (d->loc.line <= 0 && d->loc.offset >= 0)
			fprintf(out, " (at byte %lld)", (long long)d->loc.offset);
		fputc('\n', out);
		size_t len;
		const char *line = ctx_source_line(c, d->loc.file, d->loc.line, &len);
		if (line)
			put_quote(out, line, len, d->loc.col);
	}
}
