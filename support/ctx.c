/* support/ctx.c: the context (allocator, interned strings, sources, diagnostics).
 *
 * Out of memory (docs/abi.md): every block the library takes from the hook
 * carries a header that links it into the context's list of live blocks,
 * newest first, with a sequence number. A public entry point runs inside a
 * guard (CTX_GUARDED, support.h) that records the sequence number on entry;
 * when the hook refuses a block, ctx_throw runs the registered clean-ups
 * (files, threads, LLVM objects), frees every block born since the guard was
 * entered and longjmps back to the entry point, which returns
 * MOE_ERR_NOMEM. Blocks the context itself keeps (interned strings,
 * diagnostics, sources, registered passes and target attributes) have
 * sequence number 0 and survive. Lua's luaD_throw does the same with its garbage collector. */
#include <setjmp.h>
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

/* The header of every block (32 bytes: the payload stays 16-byte aligned). */
typedef struct blk {
	struct blk *prev, *next; /* the live list, newest first */
	uint64_t seq;            /* 0: kept by the context; else order of birth */
	size_t size;             /* payload bytes */
} blk;
_Static_assert(sizeof(blk) % 16 == 0, "block header breaks alignment");

#define MAX_DEFER 16

struct moe_ctx {
	moe_alloc_fn alloc;
	void *ud;
	blk *live;       /* every block, newest first */
	uint64_t seq;    /* last sequence number given */
	ctx_guard *guard; /* the outermost guard entered, or NULL */
	size_t pending;   /* > 0: a block of the context's own was refused inside the guard */
	struct {
		void (*fn)(void *);
		void *arg;
	} defer[MAX_DEFER];
	uint32_t ndefer;
	diag *diags;
	uint32_t ndiags, dcap;
	int nerrors;
	int max_errors; /* errors kept before "too many errors" (0: no limit) */
	source *srcs;
	uint32_t nsrcs, scap;
	strnode *strs;
	ctx_vec passes; /* externally registered passes (moe_pass_info) */
	ctx_vec tattrs; /* registered target attributes (ir/attrs.c rows) */
	ctx_vec tstate; /* registered targets' state blocks (backend-tcp's pass machine) */
	char prefix[64]; /* printed for a diagnostic without a file ("" : "libmoec") */
};

void moe_ctx_set_diag_prefix(moe_ctx *c, const char *name)
{
	IR_ASSERT(c != NULL);
	size_t n = 0;
	/* printable characters only: the prefix goes to a terminal */
	for (; name && name[n] && n + 1 < sizeof c->prefix; n++)
		c->prefix[n] = (unsigned char)name[n] < 0x20 || name[n] == 0x7f ? '?' : name[n];
	c->prefix[n] = 0;
}

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
	for (uint32_t i = 0; c->tattrs.row && i < c->tattrs.n; i++)
		ctx_free(c, ((void **)c->tattrs.data)[i], c->tattrs.row);
	ctx_free(c, c->tattrs.data, (size_t)c->tattrs.cap * c->tattrs.esz);
	for (uint32_t i = 0; c->tstate.row && i < c->tstate.n; i++)
		ctx_free(c, ((void **)c->tstate.data)[i], c->tstate.row);
	ctx_free(c, c->tstate.data, (size_t)c->tstate.cap * c->tstate.esz);
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

/* ---- blocks ---- */
static blk *hdr(void *p)
{
	return (blk *)p - 1;
}

static void free_blk(moe_ctx *c, blk *b)
{
	if (b->prev)
		b->prev->next = b->next;
	else
		c->live = b->next;
	if (b->next)
		b->next->prev = b->prev;
	c->alloc(c->ud, b, b->size + sizeof *b, 0);
}

/* A fresh zeroed block (p == NULL) or p resized, the new tail zeroed; NULL
 * when the hook refuses (p is then unchanged). A resized block keeps its
 * sequence number and its place in the live list. */
static void *blk_realloc(moe_ctx *c, void *p, size_t n, bool keep)
{
	if (n > SIZE_MAX - sizeof(blk) - 16)
		return NULL;
	blk *o = p ? hdr(p) : NULL;
	size_t osz = o ? o->size : 0;
	blk *b = c->alloc(c->ud, o, o ? osz + sizeof *b : 0, n + sizeof *b);
	if (!b)
		return NULL;
	if (o) {
		if (b->prev)
			b->prev->next = b;
		else
			c->live = b;
		if (b->next)
			b->next->prev = b;
	} else {
		b->seq = keep ? 0 : ++c->seq;
		b->prev = NULL;
		b->next = c->live;
		if (c->live)
			c->live->prev = b;
		c->live = b;
	}
	b->size = n;
	if (n > osz)
		memset((char *)(b + 1) + osz, 0, n - osz);
	return b + 1;
}

bool ctx_guard_begin(moe_ctx *c, ctx_guard *g)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (c->guard)
		return false;
	g->mark = c->seq;
	g->ndefer = c->ndefer;
	c->guard = g;
	c->pending = 0;
	return true;
}

void ctx_guard_end(moe_ctx *c, ctx_guard *g)
{
	IR_ASSERT(c->guard == g);
	IR_ASSERT(c->ndefer == g->ndefer); /* every ctx_defer undone */
	if (c->pending)
		ctx_throw(c, c->pending);
	c->guard = NULL;
}

void ctx_commit_point(moe_ctx *c)
{
	if (c->guard && c->pending)
		ctx_throw(c, c->pending);
}

bool ctx_guarded(const moe_ctx *c)
{
	return c->guard != NULL;
}

void ctx_throw(moe_ctx *c, size_t n)
{
	ctx_guard *g = c->guard;
	if (!g) {
		/* a builder call outside every guarded entry point (docs/abi.md) */
		fprintf(stderr, "moec: out of memory allocating %zu bytes\n", n);
		abort();
	}
	c->guard = NULL; /* a clean-up that allocates and fails aborts */
	c->pending = 0;
	while (c->ndefer > g->ndefer) {
		c->ndefer--;
		c->defer[c->ndefer].fn(c->defer[c->ndefer].arg);
	}
	for (blk *b = c->live, *nx; b && (b->seq == 0 || b->seq > g->mark); b = nx) {
		nx = b->next;
		if (b->seq)
			free_blk(c, b);
	}
	moe_diag(c, MOE_DIAG_ERROR, moe_loc_none(), "out of memory (the allocator refused %zu bytes)", n);
	longjmp(g->jb, 1);
}

uint32_t ctx_defer(moe_ctx *c, void (*fn)(void *), void *arg)
{
	IR_ASSERT(c->ndefer < MAX_DEFER);
	c->defer[c->ndefer].fn = fn;
	c->defer[c->ndefer].arg = arg;
	return c->ndefer++;
}

void ctx_undefer(moe_ctx *c, uint32_t h)
{
	IR_ASSERT(c->ndefer > 0 && h == c->ndefer - 1);
	c->ndefer--;
}

void ctx_keep(moe_ctx *c, void *p)
{
	(void)c;
	if (p)
		hdr(p)->seq = 0;
}

void *ctx_alloc(moe_ctx *c, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	void *p = blk_realloc(c, NULL, n, false);
	if (!p)
		ctx_throw(c, n);
	return p;
}

void *ctx_try_alloc(moe_ctx *c, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return blk_realloc(c, NULL, n, false);
}

void *ctx_soft_alloc(moe_ctx *c, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	void *p = blk_realloc(c, NULL, n, false);
	if (!p && c->guard)
		ctx_throw(c, n);
	return p;
}

void *ctx_realloc(moe_ctx *c, void *p, size_t o, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	(void)o; /* the header knows the size */
	if (!n) {
		ctx_free(c, p, 0);
		return NULL;
	}
	void *q = blk_realloc(c, p, n, false);
	if (!q)
		ctx_throw(c, n);
	return q;
}

void *ctx_try_realloc(moe_ctx *c, void *p, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return blk_realloc(c, p, n ? n : 1, false);
}

void ctx_free(moe_ctx *c, void *p, size_t n)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	(void)n;
	if (p)
		free_blk(c, hdr(p));
}

static uint32_t grow_cap(uint32_t cap, uint32_t need)
{
	uint64_t nc = cap ? cap : 8;
	while (nc < need)
		nc *= 2;
	return nc > UINT32_MAX ? UINT32_MAX : (uint32_t)nc;
}

void ctx_grow(moe_ctx *c, void **arr, uint32_t *cap, uint32_t need, size_t esz)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (need <= *cap)
		return;
	uint32_t nc = grow_cap(*cap, need);
	if ((size_t)nc > SIZE_MAX / esz)
		ctx_throw(c, SIZE_MAX);
	*arr = ctx_realloc(c, *arr, (size_t)*cap * esz, (size_t)nc * esz);
	*cap = nc;
}

/* The context's own arrays: kept across guards; false when refused. */
static bool keep_grow(moe_ctx *c, void **arr, uint32_t *cap, uint32_t need, size_t esz)
{
	if (need <= *cap)
		return true;
	uint32_t nc = grow_cap(*cap, need);
	void *q = blk_realloc(c, *arr, (size_t)nc * esz, true);
	if (!q)
		return false;
	*arr = q;
	*cap = nc;
	return true;
}

ctx_vec *ctx_passes(moe_ctx *c)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return &c->passes;
}

ctx_vec *ctx_target_attrs(moe_ctx *c)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return &c->tattrs;
}

ctx_vec *ctx_target_state(moe_ctx *c)
{
	IR_ASSERT(c != NULL);
	return &c->tstate;
}

void moe_free(moe_ctx *c, void *p)
{
	(void)c;
	free(p); /* strings returned by cJSON-based printers use malloc */
}

char *moe_diag_string(const moe_ctx *c)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	moe_diag_print(c, f);
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* A block of the context's own refused (a diagnostic, a source, a file
 * name of a location): the caller drops what it was keeping; inside a guard
 * the call still fails, when it leaves the guard (ctx_guard_end throws),
 * so that the code that met it need not be a safe point to unwind from
 * (it may hold an LLVM object). */
static void keep_refused(moe_ctx *c, size_t n)
{
	if (c->guard && !c->pending)
		c->pending = n;
}

/* NULL when the allocator refuses (outside a guard). */
static const char *try_intern(moe_ctx *c, const char *s)
{
	for (strnode *n = c->strs; n; n = n->next)
		if (!strcmp(n->s, s))
			return n->s;
	size_t len = strlen(s);
	strnode *n = blk_realloc(c, NULL, sizeof *n + len + 1, true);
	if (!n) {
		keep_refused(c, sizeof *n + len + 1);
		return NULL;
	}
	memcpy(n->s, s, len + 1);
	n->next = c->strs;
	c->strs = n;
	return n->s;
}

const char *ctx_intern(moe_ctx *c, const char *s)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	if (!s)
		return NULL;
	const char *r = try_intern(c, s);
	if (!r) {
		c->pending = 0;
		ctx_throw(c, strlen(s) + 1);
	}
	return r;
}

moe_loc moe_loc_none(void)
{
	return (moe_loc){NULL, 0, 0, -1};
}

moe_loc moe_loc_file(moe_ctx *c, const char *file)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return (moe_loc){file ? try_intern(c, file) : NULL, 0, 0, -1}; /* no file name on OOM outside a guard */
}

moe_loc moe_loc_at(moe_ctx *c, const char *file, int line, int col)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	return (moe_loc){file ? try_intern(c, file) : NULL, line, col, -1};
}

void moe_ctx_add_source(moe_ctx *c, const char *file, const char *text, size_t len)
{
	IR_ASSERT(c != NULL); /* API misuse: abort with a message, not a crash */
	/* out of memory: the source is not kept (diagnostics lose the quote) */
	const char *f = file ? try_intern(c, file) : NULL;
	char *text_copy = len < SIZE_MAX ? blk_realloc(c, NULL, len + 1, true) : NULL;
	if (!f || !text_copy || !keep_grow(c, (void **)&c->srcs, &c->scap, c->nsrcs + 1, sizeof(source))) {
		ctx_free(c, text_copy, 0);
		keep_refused(c, len + 1);
		return;
	}
	source *s = &c->srcs[c->nsrcs++];
	s->file = f;
	s->text = text_copy;
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

/* Out of memory: the call fails inside a guard; outside one the diagnostic
 * is dropped (its error is still counted). */
static void diag_push(moe_ctx *c, moe_diag_kind kind, moe_loc loc, char *msg)
{
	if (!msg || !keep_grow(c, (void **)&c->diags, &c->dcap, c->ndiags + 1, sizeof(diag))) {
		ctx_free(c, msg, 0);
		keep_refused(c, sizeof(diag));
		return;
	}
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
	char *msg = blk_realloc(c, NULL, (size_t)n + 1, true);
	if (msg)
		vsnprintf(msg, (size_t)n + 1, fmt, ap);
	diag_push(c, kind, loc, msg);
	if (kind == MOE_DIAG_ERROR && ++c->nerrors == c->max_errors) {
		static const char stop[] = "too many errors; stopping";
		char *m = blk_realloc(c, NULL, sizeof stop, true);
		if (m)
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
		const char *file = d->loc.file ? d->loc.file : c->prefix[0] ? c->prefix : "libmoec";
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
