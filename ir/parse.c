/* ir/parse.c: recursive-descent reader of the textual IR (`.moeir`,
 * docs/ir.md), and the node check shared with the JSON reader.
 *
 * The reader stops at the first error: it reports `file:line:col: error:`
 * through the context and returns NULL. Every node is built with ir_emit,
 * inferred with ir_infer and its inferred type compared with the written one.
 * The only recursion is a block_loop's body, one level deep (a block_loop
 * inside a body is refused before its body is read); all
 * numbers are range-checked before they reach the IR. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "ir/serial.h"

moe_status ir_read_finish_node(moe_ctx *ctx, moe_graph *g, moe_id id, moe_dtype t, int rank,
	const int64_t *shape)
{
	ir_node *n = N(g, id);
	IR_ASSERT(rank >= 0 && rank <= MOE_MAX_RANK);
	n->dtype = (uint8_t)t;
	n->rank = (uint8_t)rank;
	for (int i = 0; i < rank; i++)
		n->shape[i] = shape[i];
	if (ir_infer(ctx, g, id) != MOE_OK)
		return MOE_ERR_INVALID;
	n = N(g, id);
	bool same = n->dtype == t && n->rank == rank;
	for (int i = 0; same && i < rank; i++)
		same = n->shape[i] == shape[i];
	if (!same) {
		char want[160], got[160];
		ir_fmt_type(t, rank, shape, want, sizeof want);
		ir_fmt_type((moe_dtype)n->dtype, n->rank, n->shape, got, sizeof got);
		moe_diag(ctx, MOE_DIAG_ERROR, n->loc, "'%s' %%%u is written with type %s but its operands give %s",
			moe_op_name((moe_op)n->op), id, want, got);
		return MOE_ERR_INVALID;
	}
	return MOE_OK;
}

/* ---- lexer ---- */
enum { TK_EOF = 256, TK_IDENT, TK_INT, TK_FLOAT, TK_STR, TK_VAL, TK_AT, TK_ERR };

typedef struct tok {
	int kind;      /* TK_* or a punctuation character */
	const char *p; /* first byte in the text */
	size_t len;
	int line, col;
	int64_t i; /* TK_INT, TK_VAL */
	double f;  /* TK_FLOAT */
	/* TK_STR, TK_AT: decoded text in rd.sbuf */
} tok;

typedef struct rd {
	moe_ctx *ctx;
	const char *file; /* interned */
	const char *p, *end;
	int line, col;
	tok t;
	bool failed;
	moe_module *m;
	char *sbuf; /* decoded string of the current token */
	uint32_t slen, scap;
	char *kbuf; /* attribute key or node name being parsed */
	uint32_t kcap;
	moe_id *args;
	uint32_t argcap;
	int64_t *ints;
	uint32_t intcap;
} rd;

#define MAX_NUM_LEN 400
#define MAX_STR_LEN ((uint32_t)1 << 30)

static void err_at(rd *r, int line, int col, const char *fmt, ...) MOE_PRINTF(4, 5);

static void err_at(rd *r, int line, int col, const char *fmt, ...)
{
	if (r->failed)
		return;
	va_list ap;
	va_start(ap, fmt);
	ctx_vdiag(r->ctx, MOE_DIAG_ERROR, moe_loc_at(r->ctx, r->file, line, col), fmt, ap);
	va_end(ap);
	r->failed = true;
}

#define ERR_TOK(r, ...) err_at((r), (r)->t.line, (r)->t.col, __VA_ARGS__)

/* A layer, dim or value name read at line:col must follow ir_name_problem's rules. */
static bool check_name(rd *r, int line, int col, ir_name_kind k, const char *what, const char *name)
{
	const char *why = ir_name_problem(k, name);
	if (why)
		err_at(r, line, col, "%s \"%.40s%s\" %s", what, name, strlen(name) > 40 ? "..." : "", why);
	return !why;
}

static void adv(rd *r)
{
	if (*r->p == '\n') {
		r->line++;
		r->col = 1;
	} else {
		r->col++;
	}
	r->p++;
}

static void skip_space(rd *r)
{
	while (r->p < r->end) {
		char c = *r->p;
		if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
			adv(r);
		} else if (c == '#') {
			while (r->p < r->end && *r->p != '\n')
				adv(r);
		} else {
			break;
		}
	}
}

static bool is_id_start(char c)
{
	return isalpha((unsigned char)c) || c == '_';
}

static bool is_id_char(char c)
{
	return isalnum((unsigned char)c) || c == '_';
}

static void sbuf_put(rd *r, char c)
{
	ctx_grow(r->ctx, (void **)&r->sbuf, &r->scap, r->slen + 2, 1);
	r->sbuf[r->slen++] = c;
	r->sbuf[r->slen] = 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decodes a string literal at r->p (on the opening quote) into sbuf. */
static bool lex_string(rd *r)
{
	int line = r->line, col = r->col;
	r->slen = 0;
	sbuf_put(r, 0);
	r->slen = 0;
	adv(r);
	for (;;) {
		if (r->p >= r->end || *r->p == '\n') {
			err_at(r, line, col, "unterminated string");
			return false;
		}
		char c = *r->p;
		if (c == '"') {
			adv(r);
			return true;
		}
		if (c == 0) {
			err_at(r, r->line, r->col, "NUL byte inside a string");
			return false;
		}
		if (r->slen >= MAX_STR_LEN) {
			err_at(r, line, col, "string longer than %u bytes", MAX_STR_LEN);
			return false;
		}
		if (c != '\\') {
			sbuf_put(r, c);
			adv(r);
			continue;
		}
		int el = r->line, ec = r->col;
		adv(r);
		char e = r->p < r->end ? *r->p : 0;
		switch (e) {
		case '"': sbuf_put(r, '"'); adv(r); break;
		case '\\': sbuf_put(r, '\\'); adv(r); break;
		case 'n': sbuf_put(r, '\n'); adv(r); break;
		case 't': sbuf_put(r, '\t'); adv(r); break;
		case 'x': {
			adv(r);
			int h1 = r->p < r->end ? hexval(*r->p) : -1;
			int h2 = r->p + 1 < r->end ? hexval(r->p[1]) : -1;
			if (h1 < 0 || h2 < 0) {
				err_at(r, el, ec, "'\\x' must be followed by two hex digits");
				return false;
			}
			if (h1 == 0 && h2 == 0) {
				err_at(r, el, ec, "'\\x00' is not allowed in strings");
				return false;
			}
			sbuf_put(r, (char)(h1 * 16 + h2));
			adv(r);
			adv(r);
			break;
		}
		default:
			if (isprint((unsigned char)e))
				err_at(r, el, ec, "unknown escape '\\%c' (use \\\" \\\\ \\n \\t or \\xHH)", e);
			else
				err_at(r, el, ec, "unknown escape in string (use \\\" \\\\ \\n \\t or \\xHH)");
			return false;
		}
	}
}

/* Numbers: -?digits(.digits)?([eE][+-]?digits)?, and -inf / -nan. */
static void lex_number(rd *r, tok *t)
{
	const char *q = r->p;
	bool neg = *q == '-', isfloat = false;
	if (neg)
		q++;
	if (q < r->end && isalpha((unsigned char)*q)) {
		const char *w = q;
		while (q < r->end && is_id_char(*q))
			q++;
		size_t wl = (size_t)(q - w);
		if (wl == 3 && !memcmp(w, "inf", 3))
			t->f = -INFINITY;
		else if (wl == 3 && !memcmp(w, "nan", 3))
			t->f = copysign(NAN, -1.0);
		else {
			ERR_TOK(r, "malformed number");
			t->kind = TK_ERR;
			return;
		}
		t->kind = TK_FLOAT;
		while (r->p < q)
			adv(r);
		t->len = (size_t)(q - t->p);
		return;
	}
	bool bad = false;
	while (q < r->end && isdigit((unsigned char)*q))
		q++;
	if (q < r->end && *q == '.') {
		isfloat = true;
		q++;
		if (q >= r->end || !isdigit((unsigned char)*q))
			bad = true;
		while (q < r->end && isdigit((unsigned char)*q))
			q++;
	}
	if (q < r->end && (*q == 'e' || *q == 'E')) {
		isfloat = true;
		q++;
		if (q < r->end && (*q == '+' || *q == '-'))
			q++;
		if (q >= r->end || !isdigit((unsigned char)*q))
			bad = true;
		while (q < r->end && isdigit((unsigned char)*q))
			q++;
	}
	if (q < r->end && (is_id_char(*q) || *q == '.'))
		bad = true;
	if (bad) {
		ERR_TOK(r, "malformed number");
		t->kind = TK_ERR;
		return;
	}
	size_t len = (size_t)(q - r->p);
	if (len > MAX_NUM_LEN) {
		ERR_TOK(r, "numeric literal longer than %d characters", MAX_NUM_LEN);
		t->kind = TK_ERR;
		return;
	}
	char buf[MAX_NUM_LEN + 1];
	memcpy(buf, r->p, len);
	buf[len] = 0;
	if (isfloat) {
		errno = 0;
		double v = strtod(buf, NULL);
		if (isinf(v)) {
			ERR_TOK(r, "float literal %s is out of range (write inf)", buf);
			t->kind = TK_ERR;
			return;
		}
		t->kind = TK_FLOAT;
		t->f = v;
	} else {
		/* accumulate the magnitude unsigned; INT64_MIN is allowed */
		uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
		for (const char *d = buf + neg; *d; d++) {
			unsigned dg = (unsigned)(*d - '0');
			if (v > (lim - dg) / 10) {
				ERR_TOK(r, "integer literal %s is out of the 64-bit range", buf);
				t->kind = TK_ERR;
				return;
			}
			v = v * 10 + dg;
		}
		t->kind = TK_INT;
		t->i = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
	}
	while (r->p < q)
		adv(r);
	t->len = len;
}

static void lex(rd *r)
{
	tok *t = &r->t;
	if (r->failed) {
		t->kind = TK_ERR;
		return;
	}
	skip_space(r);
	memset(t, 0, sizeof *t);
	t->p = r->p;
	t->line = r->line;
	t->col = r->col;
	if (r->p >= r->end) {
		t->kind = TK_EOF;
		return;
	}
	char c = *r->p;
	if (is_id_start(c)) {
		while (r->p < r->end && is_id_char(*r->p))
			adv(r);
		t->kind = TK_IDENT;
		t->len = (size_t)(r->p - t->p);
		return;
	}
	if (isdigit((unsigned char)c) ||
		(c == '-' && r->p + 1 < r->end && (isdigit((unsigned char)r->p[1]) || isalpha((unsigned char)r->p[1])))) {
		lex_number(r, t);
		return;
	}
	if (c == '"') {
		t->kind = lex_string(r) ? TK_STR : TK_ERR;
		t->len = (size_t)(r->p - t->p);
		return;
	}
	if (c == '%') {
		adv(r);
		if (r->p >= r->end || !isdigit((unsigned char)*r->p)) {
			ERR_TOK(r, "'%%' must be followed by a node id");
			t->kind = TK_ERR;
			return;
		}
		int64_t v = 0;
		while (r->p < r->end && isdigit((unsigned char)*r->p)) {
			v = v * 10 + (*r->p - '0');
			if (v >= (int64_t)MOE_NONE - 1) {
				ERR_TOK(r, "node id is too large");
				t->kind = TK_ERR;
				return;
			}
			adv(r);
		}
		if (r->p < r->end && is_id_char(*r->p)) {
			ERR_TOK(r, "malformed node id");
			t->kind = TK_ERR;
			return;
		}
		t->kind = TK_VAL;
		t->i = v;
		t->len = (size_t)(r->p - t->p);
		return;
	}
	if (c == '@') {
		adv(r);
		if (r->p < r->end && *r->p == '"') {
			t->kind = lex_string(r) ? TK_AT : TK_ERR;
		} else {
			r->slen = 0;
			sbuf_put(r, 0);
			r->slen = 0;
			while (r->p < r->end && (is_id_char(*r->p) || *r->p == '.' || *r->p == '-')) {
				if (r->slen >= MAX_STR_LEN)
					break;
				sbuf_put(r, *r->p);
				adv(r);
			}
			if (!r->slen) {
				ERR_TOK(r, "'@' must be followed by a layer name");
				t->kind = TK_ERR;
				return;
			}
			t->kind = TK_AT;
		}
		t->len = (size_t)(r->p - t->p);
		return;
	}
	if (c && strchr("=,(){}[]:", c)) {
		adv(r);
		t->kind = c;
		t->len = 1;
		return;
	}
	if (isprint((unsigned char)c))
		ERR_TOK(r, "unexpected character '%c'", c);
	else
		ERR_TOK(r, "unexpected byte 0x%02x", (unsigned char)c);
	t->kind = TK_ERR;
}

/* ---- parser helpers ---- */
static const char *describe(const tok *t, char *buf, size_t n)
{
	switch (t->kind) {
	case TK_EOF: return "end of input";
	case TK_IDENT:
		snprintf(buf, n, "'%.*s'", t->len > 40 ? 40 : (int)t->len, t->p);
		return buf;
	case TK_INT:
	case TK_FLOAT: return "a number";
	case TK_STR: return "a string";
	case TK_VAL: snprintf(buf, n, "'%%%lld'", (long long)t->i); return buf;
	case TK_AT: return "a layer name";
	case TK_ERR: return "an error";
	default: snprintf(buf, n, "'%c'", t->kind); return buf;
	}
}

static bool fail_expected(rd *r, const char *what)
{
	char b[64];
	ERR_TOK(r, "expected %s, found %s", what, describe(&r->t, b, sizeof b));
	return false;
}

static bool is_kw(const rd *r, const char *kw)
{
	size_t n = strlen(kw);
	return r->t.kind == TK_IDENT && r->t.len == n && !memcmp(r->t.p, kw, n);
}

static bool accept(rd *r, int kind)
{
	if (r->t.kind != kind)
		return false;
	lex(r);
	return true;
}

static bool expect(rd *r, int kind, const char *what)
{
	if (r->t.kind == TK_ERR)
		return false;
	if (accept(r, kind))
		return !r->failed;
	return fail_expected(r, what);
}

static bool expect_kw(rd *r, const char *kw)
{
	if (r->t.kind == TK_ERR)
		return false;
	if (is_kw(r, kw)) {
		lex(r);
		return !r->failed;
	}
	char w[48];
	snprintf(w, sizeof w, "'%s'", kw);
	return fail_expected(r, w);
}

/* Copies the current identifier or string into kbuf (NUL-terminated). */
static void take_key(rd *r)
{
	const char *s = r->t.kind == TK_IDENT ? r->t.p : r->sbuf;
	size_t n = r->t.kind == TK_IDENT ? r->t.len : r->slen;
	IR_ASSERT(n < MAX_STR_LEN);
	ctx_grow(r->ctx, (void **)&r->kbuf, &r->kcap, (uint32_t)n + 1, 1);
	memcpy(r->kbuf, s, n);
	r->kbuf[n] = 0;
}

/* A name: an identifier or a string. Leaves it in kbuf. */
static bool parse_key(rd *r, const char *what)
{
	if (r->t.kind != TK_IDENT && r->t.kind != TK_STR)
		return r->t.kind == TK_ERR ? false : fail_expected(r, what);
	take_key(r);
	lex(r);
	return !r->failed;
}

static bool parse_dtype(rd *r, moe_dtype *t)
{
	if (r->t.kind != TK_IDENT)
		return r->t.kind == TK_ERR ? false : fail_expected(r, "an element type");
	char name[16];
	int d = -1;
	if (r->t.len < sizeof name) {
		memcpy(name, r->t.p, r->t.len);
		name[r->t.len] = 0;
		d = moe_dtype_from_name(name);
	}
	if (d < 0) {
		ERR_TOK(r, "unknown element type '%.*s' (f32, bf16, i32, bool, f8e4m3, i8, u8)",
			r->t.len > 40 ? 40 : (int)r->t.len, r->t.p);
		return false;
	}
	*t = (moe_dtype)d;
	lex(r);
	return !r->failed;
}

/* ---- attributes ---- */
static bool parse_value(rd *r, ir_attr *a)
{
	memset(a, 0, sizeof *a);
	switch (r->t.kind) {
	case TK_INT:
		a->kind = MOE_ATTR_INT;
		a->v.i = r->t.i;
		break;
	case TK_FLOAT:
		a->kind = MOE_ATTR_FLOAT;
		a->v.f = r->t.f;
		break;
	case TK_STR:
		a->kind = MOE_ATTR_STR;
		a->v.s = r->sbuf;
		break;
	case TK_IDENT:
		if (is_kw(r, "inf") || is_kw(r, "nan")) {
			a->kind = MOE_ATTR_FLOAT;
			a->v.f = *r->t.p == 'i' ? INFINITY : NAN;
			break;
		}
		return fail_expected(r, "an attribute value");
	case '[': {
		lex(r);
		uint32_t n = 0;
		if (r->t.kind != ']') {
			for (;;) {
				if (r->t.kind != TK_INT) {
					if (r->t.kind == TK_FLOAT)
						ERR_TOK(r, "attribute lists hold integers only");
					return r->t.kind == TK_ERR || r->t.kind == TK_FLOAT ? false :
						fail_expected(r, "an integer");
				}
				if (n >= (uint32_t)INT32_MAX / 2) {
					ERR_TOK(r, "integer list is too long");
					return false;
				}
				ctx_grow(r->ctx, (void **)&r->ints, &r->intcap, n + 1, sizeof *r->ints);
				r->ints[n++] = r->t.i;
				lex(r);
				if (!accept(r, ','))
					break;
			}
		}
		if (r->t.kind != ']')
			return r->t.kind == TK_ERR ? false : fail_expected(r, "',' or ']'");
		a->kind = MOE_ATTR_INTS;
		a->count = (int)n;
		a->v.ints = r->ints;
		break;
	}
	case TK_ERR: return false;
	default: return fail_expected(r, "an attribute value");
	}
	return true;
}

/* key=value (, key=value)*, into node n (a graph's meta node for `attrs`). */
static bool parse_attr_list(rd *r, moe_graph *g, moe_id id)
{
	for (;;) {
		int line = r->t.line, col = r->t.col;
		if (!parse_key(r, "an attribute name"))
			return false;
		if (!expect(r, '=', "'='"))
			return false;
		ir_attr a;
		if (!parse_value(r, &a))
			return false;
		a.key = r->kbuf;
		ir_node *n = id == MOE_NONE ? &g->meta : N(g, id);
		if (ir_attr_find(n, a.key)) {
			err_at(r, line, col, "duplicate attribute '%s'", a.key);
			return false;
		}
		if (id != MOE_NONE && !ir_attr_check(r->ctx, (moe_op)n->op, &a, moe_loc_at(r->ctx, r->file, line, col))) {
			r->failed = true;
			return false;
		}
		ir_attr_set(g, n, &a);
		lex(r); /* past the value: sbuf/ints were copied by ir_attr_set */
		if (r->failed)
			return false;
		if (!accept(r, ','))
			return true;
	}
}

/* ---- nodes ---- */
static bool parse_ref(rd *r, moe_id cur, moe_id *out, bool allow_absent)
{
	if (allow_absent && is_kw(r, "_")) {
		*out = MOE_NONE;
		lex(r);
		return !r->failed;
	}
	if (r->t.kind != TK_VAL)
		return r->t.kind == TK_ERR ? false :
			fail_expected(r, allow_absent ? "an operand ('%N' or '_')" : "a node id '%N'");
	if ((uint64_t)r->t.i >= cur) {
		ERR_TOK(r, "%%%lld is not defined before its use (operands must refer to earlier nodes)",
			(long long)r->t.i);
		return false;
	}
	*out = (moe_id)r->t.i;
	lex(r);
	return !r->failed;
}

static bool parse_shape(rd *r, int *rank, int64_t *shape)
{
	if (!expect(r, '[', "'['"))
		return false;
	*rank = 0;
	if (accept(r, ']'))
		return !r->failed;
	for (;;) {
		if (r->t.kind != TK_INT)
			return r->t.kind == TK_ERR ? false : fail_expected(r, "a dimension");
		if (*rank == MOE_MAX_RANK) {
			ERR_TOK(r, "rank exceeds the limit of %d", MOE_MAX_RANK);
			return false;
		}
		if (r->t.i < 1 || r->t.i > MOE_MAX_DIM) {
			ERR_TOK(r, "dimension %lld is outside 1..%lld", (long long)r->t.i, (long long)MOE_MAX_DIM);
			return false;
		}
		shape[(*rank)++] = r->t.i;
		lex(r);
		if (!accept(r, ','))
			break;
	}
	return expect(r, ']', "',' or ']'");
}

static bool parse_node(rd *r, moe_graph *g);

/* ` body { nodes yield %N }` of block_loop id: a graph of its own ids. */
static bool parse_body(rd *r, moe_graph *g, moe_id id)
{
	if (!expect_kw(r, "body") || !expect(r, '{', "'{'"))
		return false;
	uint32_t bi;
	moe_graph *b = ir_body_new(g, &bi);
	N(g, id)->body = bi;
	while (r->t.kind == TK_VAL)
		if (!parse_node(r, b))
			return false;
	if (!is_kw(r, "yield"))
		return r->t.kind == TK_ERR ? false : fail_expected(r, "a node or 'yield'");
	lex(r);
	moe_id v;
	if (!parse_ref(r, b->nnodes, &v, false))
		return false;
	moe_graph_add_output(b, v);
	return expect(r, '}', "'}'");
}

static bool parse_node(rd *r, moe_graph *g)
{
	moe_id id = g->nnodes;
	int line = r->t.line, col = r->t.col;
	if (r->t.i != (int64_t)id) {
		ERR_TOK(r, "expected node id %%%u, found %%%lld (ids are dense and in order)", id, (long long)r->t.i);
		return false;
	}
	if (id >= (moe_id)INT32_MAX) {
		ERR_TOK(r, "too many nodes in one layer");
		return false;
	}
	lex(r);
	if (!expect(r, '=', "'='"))
		return false;
	if (r->t.kind != TK_IDENT)
		return r->t.kind == TK_ERR ? false : fail_expected(r, "an op name");
	int op = -1;
	char name[32];
	if (r->t.len < sizeof name) {
		memcpy(name, r->t.p, r->t.len);
		name[r->t.len] = 0;
		op = moe_op_from_name(name);
	}
	if (op < 0) {
		ERR_TOK(r, "unknown op '%.*s'", r->t.len > 40 ? 40 : (int)r->t.len, r->t.p);
		return false;
	}
	if (op == MOE_OP_BLOCK_LOOP && g->is_body) {
		ERR_TOK(r, "'block_loop' inside a block_loop body (bodies do not nest)");
		return false;
	}
	lex(r);
	bool named = false;
	if (r->t.kind == TK_STR) {
		take_key(r);
		named = true;
		if (!check_name(r, r->t.line, r->t.col, IR_NAME_VALUE, "value name", r->kbuf))
			return false;
		lex(r);
	}
	uint32_t nargs = 0;
	if (accept(r, '(') && !accept(r, ')')) {
		for (;;) {
			if (nargs == IR_MAX_ARGS) {
				ERR_TOK(r, "more than %d operands", IR_MAX_ARGS);
				return false;
			}
			ctx_grow(r->ctx, (void **)&r->args, &r->argcap, nargs + 1, sizeof *r->args);
			if (!parse_ref(r, id, &r->args[nargs], true))
				return false;
			nargs++;
			if (!accept(r, ','))
				break;
		}
		if (!expect(r, ')', "',' or ')'"))
			return false;
	}
	if (r->failed)
		return false;
	moe_loc loc = moe_loc_at(r->ctx, r->file, line, col);
	ir_emit(g, (moe_op)op, MOE_F32, 0, NULL, r->args, nargs, loc);
	if (named)
		moe_node_set_name(g, id, r->kbuf);
	if (is_kw(r, "valid")) {
		lex(r);
		moe_id v;
		if (!expect(r, '(', "'('") || !parse_ref(r, id, &v, false) || !expect(r, ')', "')'"))
			return false;
		N(g, id)->valid = v;
	}
	if (accept(r, '{') && !accept(r, '}')) {
		if (!parse_attr_list(r, g, id) || !expect(r, '}', "',' or '}'"))
			return false;
	}
	if (!expect(r, ':', "':' and the result type"))
		return false;
	moe_dtype t;
	int rank;
	int64_t shape[MOE_MAX_RANK];
	if (!parse_dtype(r, &t) || !parse_shape(r, &rank, shape))
		return false;
	if (op == MOE_OP_BLOCK_LOOP && !parse_body(r, g, id))
		return false;
	if (ir_read_finish_node(r->ctx, g, id, t, rank, shape) != MOE_OK) {
		r->failed = true;
		return false;
	}
	return true;
}

/* ---- layers and the module ---- */
static bool parse_layer(rd *r)
{
	moe_loc loc = moe_loc_at(r->ctx, r->file, r->t.line, r->t.col);
	lex(r);
	if (r->t.kind != TK_AT)
		return r->t.kind == TK_ERR ? false : fail_expected(r, "a layer name '@name'");
	if (!check_name(r, r->t.line, r->t.col, IR_NAME_LAYER, "layer name", r->sbuf))
		return false;
	moe_graph *g = moe_module_add_graph(r->m, r->sbuf);
	g->loc = loc;
	lex(r);
	moe_dtype t;
	if (!expect_kw(r, "dtype") || !expect(r, '=', "'='") || !parse_dtype(r, &t))
		return false;
	g->dtype = t;
	if (!expect(r, '{', "'{'"))
		return false;
	if (is_kw(r, "dims")) {
		lex(r);
		for (;;) {
			int line = r->t.line, col = r->t.col;
			if (!parse_key(r, "a dimension name") ||
				!check_name(r, line, col, IR_NAME_DIM, "dimension name", r->kbuf) || !expect(r, '=', "'='"))
				return false;
			if (r->t.kind != TK_INT)
				return r->t.kind == TK_ERR ? false : fail_expected(r, "an integer");
			if (moe_graph_get_dim(g, r->kbuf, NULL)) {
				err_at(r, line, col, "duplicate dimension '%s'", r->kbuf);
				return false;
			}
			moe_graph_set_dim(g, r->kbuf, r->t.i);
			lex(r);
			if (!accept(r, ','))
				break;
		}
	}
	if (is_kw(r, "attrs")) {
		lex(r);
		if (!parse_attr_list(r, g, MOE_NONE))
			return false;
	}
	while (r->t.kind == TK_VAL)
		if (!parse_node(r, g))
			return false;
	if (is_kw(r, "output")) {
		lex(r);
		for (;;) {
			moe_id v;
			if (!parse_ref(r, g->nnodes, &v, false))
				return false;
			moe_graph_add_output(g, v);
			if (!accept(r, ','))
				break;
		}
	}
	return expect(r, '}', g->nnodes ? "a node, 'output' or '}'" : "'dims', 'attrs', a node, 'output' or '}'");
}

static bool parse_module(rd *r)
{
	if (!is_kw(r, "moeir"))
		return r->t.kind == TK_ERR ? false : fail_expected(r, "the header 'moeir 1'");
	lex(r);
	if (r->t.kind != TK_INT)
		return r->t.kind == TK_ERR ? false : fail_expected(r, "a format version");
	if (r->t.i != IR_TEXT_VERSION) {
		ERR_TOK(r, "unsupported moeir version %lld (this moec reads version %d)", (long long)r->t.i,
			IR_TEXT_VERSION);
		return false;
	}
	lex(r);
	while (is_kw(r, "layer"))
		if (!parse_layer(r))
			return false;
	if (r->t.kind != TK_EOF)
		return r->t.kind == TK_ERR ? false : fail_expected(r, "'layer' or the end of input");
	return !r->failed;
}

static moe_module *parse_text(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	if (!text)
		text = "", len = 0;
	if (!file)
		file = "<input>";
	moe_ctx_add_source(ctx, file, text, len);
	rd r = {.ctx = ctx, .file = ctx_intern(ctx, file), .p = text, .end = text + len, .line = 1, .col = 1};
	r.m = moe_module_new(ctx);
	lex(&r);
	bool ok = parse_module(&r);
	ctx_free(ctx, r.sbuf, r.scap);
	ctx_free(ctx, r.kbuf, r.kcap);
	ctx_free(ctx, r.args, r.argcap * sizeof *r.args);
	ctx_free(ctx, r.ints, r.intcap * sizeof *r.ints);
	if (!ok || r.failed) {
		moe_module_free(r.m);
		return NULL;
	}
	return r.m;
}

moe_module *moe_module_parse_text(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	if (!ctx)
		return NULL;
	CTX_GUARDED(ctx, moe_module *, NULL, parse_text(ctx, file, text, len));
}
