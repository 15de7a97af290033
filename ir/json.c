/* ir/json.c: the JSON interchange form of the IR (docs/ir.md), with cJSON.
 *
 * Writer: integers beyond +-2^53 (which a double cannot hold) are written as
 * decimal strings, non-finite floats as the strings "inf", "-inf", "nan",
 * "-nan"; other numbers are written exactly (raw text). The reader accepts
 * these forms back and validates the type of every field; a diagnostic names
 * the file and the JSON path of the offending value (`layers[0].nodes[3].op`).
 * Unknown fields are rejected so that a typo cannot pass silently. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "ir/serial.h"

#define JSON_INT_EXACT ((int64_t)1 << 53)

/* ---- writer ---- */
typedef struct jw {
	bool oom;
} jw;

/* Adds item under key (or to an array when key is NULL); NULL items or failed
 * insertions mark the writer out of memory. */
static cJSON *put(jw *w, cJSON *parent, const char *key, cJSON *item)
{
	if (!item || !parent) {
		cJSON_Delete(item);
		w->oom = true;
		return NULL;
	}
	cJSON_bool ok = key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item);
	if (!ok) {
		cJSON_Delete(item);
		w->oom = true;
		return NULL;
	}
	return item;
}

static cJSON *j_int(int64_t v)
{
	char b[32];
	snprintf(b, sizeof b, "%lld", (long long)v);
	if (v < -JSON_INT_EXACT || v > JSON_INT_EXACT)
		return cJSON_CreateString(b);
	return cJSON_CreateRaw(b);
}

static cJSON *j_float(double v)
{
	char b[IR_FLOAT_BUF];
	ir_fmt_float(v, b);
	return isfinite(v) ? cJSON_CreateRaw(b) : cJSON_CreateString(b);
}

static cJSON *j_attrs(jw *w, const ir_node *n)
{
	cJSON *o = cJSON_CreateObject();
	for (uint32_t i = 0; o && i < n->nattrs; i++) {
		const ir_attr *a = &n->attrs[i];
		cJSON *t = put(w, o, a->key, cJSON_CreateObject());
		switch (a->kind) {
		case MOE_ATTR_INT: put(w, t, "int", j_int(a->v.i)); break;
		case MOE_ATTR_FLOAT: put(w, t, "float", j_float(a->v.f)); break;
		case MOE_ATTR_STR: put(w, t, "str", cJSON_CreateString(a->v.s ? a->v.s : "")); break;
		case MOE_ATTR_INTS: {
			cJSON *l = put(w, t, "ints", cJSON_CreateArray());
			for (int k = 0; l && k < a->count; k++)
				put(w, l, NULL, j_int(a->v.ints[k]));
			break;
		}
		}
	}
	return o;
}

static cJSON *j_node(jw *w, const moe_graph *g, moe_id id);

/* A block_loop's body: {"nodes": [...], "yield": N} */
static cJSON *j_body(jw *w, const moe_graph *b)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *nodes = put(w, o, "nodes", cJSON_CreateArray());
	for (moe_id i = 0; nodes && i < b->nnodes; i++)
		put(w, nodes, NULL, j_node(w, b, i));
	if (b->nout == 1)
		put(w, o, "yield", j_int(b->outputs[0]));
	return o;
}

static cJSON *j_node(jw *w, const moe_graph *g, moe_id id)
{
	const ir_node *n = N(g, id);
	cJSON *o = cJSON_CreateObject();
	put(w, o, "id", j_int(id));
	put(w, o, "op", cJSON_CreateString(moe_op_name((moe_op)n->op)));
	if (n->name)
		put(w, o, "name", cJSON_CreateString(n->name));
	cJSON *args = put(w, o, "args", cJSON_CreateArray());
	for (uint32_t i = 0; args && i < n->nargs; i++)
		put(w, args, NULL, n->args[i] == MOE_NONE ? cJSON_CreateNull() : j_int(n->args[i]));
	if (n->valid != MOE_NONE)
		put(w, o, "valid", j_int(n->valid));
	put(w, o, "dtype", cJSON_CreateString(moe_dtype_name((moe_dtype)n->dtype)));
	cJSON *shape = put(w, o, "shape", cJSON_CreateArray());
	for (int i = 0; shape && i < n->rank; i++)
		put(w, shape, NULL, j_int(n->shape[i]));
	put(w, o, "attrs", j_attrs(w, n));
	if (ir_node_body(g, n))
		put(w, o, "body", j_body(w, ir_node_body(g, n)));
	if (n->loc.file || n->loc.line > 0) {
		cJSON *l = put(w, o, "loc", cJSON_CreateObject());
		if (n->loc.file)
			put(w, l, "file", cJSON_CreateString(n->loc.file));
		put(w, l, "line", j_int(n->loc.line));
		put(w, l, "col", j_int(n->loc.col));
	}
	return o;
}

static cJSON *j_graph(jw *w, const moe_graph *g)
{
	cJSON *o = cJSON_CreateObject();
	put(w, o, "name", cJSON_CreateString(g->name ? g->name : ""));
	put(w, o, "dtype", cJSON_CreateString(moe_dtype_name(g->dtype)));
	cJSON *dims = put(w, o, "dims", cJSON_CreateArray());
	for (uint32_t i = 0; dims && i < g->ndims; i++) {
		cJSON *d = put(w, dims, NULL, cJSON_CreateObject());
		put(w, d, "name", cJSON_CreateString(g->dims[i].name));
		put(w, d, "value", j_int(g->dims[i].value));
	}
	put(w, o, "attrs", j_attrs(w, &g->meta));
	cJSON *nodes = put(w, o, "nodes", cJSON_CreateArray());
	for (moe_id i = 0; nodes && i < g->nnodes; i++)
		put(w, nodes, NULL, j_node(w, g, i));
	cJSON *outs = put(w, o, "outputs", cJSON_CreateArray());
	for (uint32_t i = 0; outs && i < g->nout; i++)
		put(w, outs, NULL, j_int(g->outputs[i]));
	return o;
}

char *moe_module_to_json(const moe_module *m)
{
	if (!m)
		return NULL;
	jw w = {false};
	cJSON *root = cJSON_CreateObject();
	put(&w, root, "format", cJSON_CreateString("moeir"));
	put(&w, root, "version", j_int(IR_TEXT_VERSION));
	cJSON *layers = put(&w, root, "layers", cJSON_CreateArray());
	for (uint32_t i = 0; layers && i < m->ngraphs; i++)
		put(&w, layers, NULL, j_graph(&w, m->graphs[i]));
	char *s = w.oom ? NULL : cJSON_Print(root);
	cJSON_Delete(root);
	return s;
}

/* ---- reader ---- */
typedef struct jr {
	moe_ctx *ctx;
	const char *file; /* interned */
	const char *text; /* the document, for the line and column of a path */
	size_t len;
	char path[512];   /* JSON path of the value being read */
	size_t plen;
	moe_id *args;
	uint32_t argcap;
	int64_t *ints;
	uint32_t intcap;
} jr;

/* ---- where a JSON path is in the text (cJSON keeps no positions) ---- */
static const char *jws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

/* Past the string or value starting at p (p < e). */
static const char *jskip_str(const char *p, const char *e)
{
	for (p++; p < e && *p != '"'; p++)
		if (*p == '\\')
			p++;
	return p < e ? p + 1 : e;
}

static const char *jskip(const char *p, const char *e)
{
	if (*p == '"')
		return jskip_str(p, e);
	int depth = 0;
	for (; p < e; p++) {
		if (*p == '"') {
			p = jskip_str(p, e) - 1;
		} else if (*p == '{' || *p == '[') {
			depth++;
		} else if (*p == '}' || *p == ']') {
			if (depth-- == 0)
				return p;
			if (depth == 0)
				return p + 1;
		} else if (depth == 0 && (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) {
			return p;
		}
	}
	return e;
}

/* In the object or array at p, the key (its opening quote) or element i. */
static const char *jchild(const char *p, const char *e, const char *key, size_t klen, long idx)
{
	if (p >= e || *p != (key ? '{' : '['))
		return NULL;
	p++;
	for (long i = 0;; i++) {
		p = jws(p, e);
		if (p >= e || *p == '}' || *p == ']')
			return NULL;
		if (key) {
			const char *k = p;
			if (*p != '"')
				return NULL;
			p = jskip_str(p, e);
			if ((size_t)(p - k) == klen + 2 && !memcmp(k + 1, key, klen))
				return k;
			p = jws(p, e);
			if (p >= e || *p != ':')
				return NULL;
			p = jws(p + 1, e);
		} else if (i == idx) {
			return p;
		}
		if (p >= e)
			return NULL;
		p = jws(jskip(p, e), e);
		if (p >= e || *p != ',')
			return NULL;
		p++;
	}
}

/* The position of r->path in the text: a key's opening quote or an element. */
static const char *jfind(const jr *r)
{
	const char *e = r->text + r->len, *p = jws(r->text, e), *at = p;
	const char *s = r->path;
	while (*s && p && p < e) {
		if (*s == '.')
			s++;
		if (*s == '[') {
			char *end;
			long i = strtol(s + 1, &end, 10);
			s = *end == ']' ? end + 1 : end;
			p = at = jchild(p, e, NULL, 0, i);
		} else {
			size_t n = strcspn(s, ".[");
			at = jchild(p, e, s, n, 0);
			s += n;
			p = at ? jws(jskip_str(at, e), e) : NULL;
			p = p && p < e && *p == ':' ? jws(p + 1, e) : NULL;
		}
	}
	return *s || !at ? NULL : at;
}

/* file:line:col of the value at r->path, or the whole file when not found. */
static moe_loc jloc(const jr *r)
{
	const char *at = r->plen && r->text ? jfind(r) : NULL;
	if (!at)
		return moe_loc_file(r->ctx, r->file);
	int line = 1, col = 1;
	for (const char *p = r->text; p < at; p++, col++)
		if (*p == '\n')
			line++, col = 0;
	return moe_loc_at(r->ctx, r->file, line, col);
}

static void jerr(jr *r, const char *fmt, ...) MOE_PRINTF(2, 3);

static void jerr(jr *r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	moe_diag(r->ctx, MOE_DIAG_ERROR, jloc(r), "%s: %s", r->plen ? r->path : "(document)", msg);
}

/* Path segments: push returns the old length for pop. */
static size_t push_key(jr *r, const char *key)
{
	size_t old = r->plen;
	if (r->plen < sizeof r->path) {
		int n = snprintf(r->path + r->plen, sizeof r->path - r->plen, "%s%s", r->plen ? "." : "", key);
		r->plen += n > 0 ? (size_t)n : 0;
		if (r->plen >= sizeof r->path)
			r->plen = sizeof r->path - 1;
	}
	return old;
}

static size_t push_index(jr *r, size_t i)
{
	size_t old = r->plen;
	if (r->plen < sizeof r->path) {
		int n = snprintf(r->path + r->plen, sizeof r->path - r->plen, "[%zu]", i);
		r->plen += n > 0 ? (size_t)n : 0;
		if (r->plen >= sizeof r->path)
			r->plen = sizeof r->path - 1;
	}
	return old;
}

static void pop(jr *r, size_t old)
{
	r->plen = old;
	r->path[old] = 0;
}

static const char *jtype(const cJSON *v)
{
	if (!v)
		return "nothing";
	if (cJSON_IsObject(v))
		return "an object";
	if (cJSON_IsArray(v))
		return "an array";
	if (cJSON_IsString(v))
		return "a string";
	if (cJSON_IsNumber(v))
		return "a number";
	if (cJSON_IsBool(v))
		return "a boolean";
	if (cJSON_IsNull(v))
		return "null";
	return "an unknown value";
}

/* Checks that o is an object whose keys are all in `fields` (NULL-ended),
 * none twice, and that every required field (names starting with '!') is
 * present. Reports at the current path. */
static bool check_object(jr *r, const cJSON *o, const char *const *fields)
{
	if (!cJSON_IsObject(o)) {
		jerr(r, "expected an object, got %s", jtype(o));
		return false;
	}
	unsigned seen = 0;
	for (const cJSON *c = o->child; c; c = c->next) {
		int k = -1;
		for (int i = 0; fields[i]; i++) {
			const char *f = fields[i][0] == '!' ? fields[i] + 1 : fields[i];
			if (c->string && !strcmp(c->string, f))
				k = i;
		}
		if (k < 0) {
			jerr(r, "unknown field '%s'", c->string ? c->string : "");
			return false;
		}
		if (seen & (1u << k)) {
			jerr(r, "field '%s' appears twice", c->string);
			return false;
		}
		seen |= 1u << k;
	}
	for (int i = 0; fields[i]; i++)
		if (fields[i][0] == '!' && !(seen & (1u << i))) {
			jerr(r, "missing field '%s'", fields[i] + 1);
			return false;
		}
	return true;
}

/* An integer in [lo, hi]: a JSON number, or when `str_ok` a decimal string
 * (the writer's form for integers beyond 2^53). */
static bool read_int(jr *r, const cJSON *v, int64_t lo, int64_t hi, bool str_ok, int64_t *out)
{
	int64_t x;
	if (cJSON_IsNumber(v)) {
		double d = v->valuedouble;
		if (!isfinite(d) || d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0) {
			jerr(r, "expected an integer, got %.17g", d);
			return false;
		}
		x = (int64_t)d;
	} else if (str_ok && cJSON_IsString(v) && v->valuestring) {
		const char *s = v->valuestring;
		bool neg = *s == '-';
		uint64_t m = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
		const char *d = s + neg;
		if (!*d) {
			jerr(r, "expected an integer, got the string \"%.40s\"", s);
			return false;
		}
		for (; *d; d++) {
			if (*d < '0' || *d > '9' || m > (lim - (uint64_t)(*d - '0')) / 10) {
				jerr(r, "expected a 64-bit integer, got the string \"%.40s\"", s);
				return false;
			}
			m = m * 10 + (uint64_t)(*d - '0');
		}
		x = neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
	} else {
		jerr(r, "expected an integer, got %s", jtype(v));
		return false;
	}
	if (x < lo || x > hi) {
		jerr(r, "%lld is outside %lld..%lld", (long long)x, (long long)lo, (long long)hi);
		return false;
	}
	*out = x;
	return true;
}

/* Field `key` of object o as an integer; absent fields keep *out. */
static bool field_int(jr *r, const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!v)
		return true;
	size_t old = push_key(r, key);
	bool ok = read_int(r, v, lo, hi, false, out);
	pop(r, old);
	return ok;
}

static const char *field_str(jr *r, const cJSON *o, const char *key, bool null_ok)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	if (cJSON_IsString(v) && v->valuestring)
		return v->valuestring;
	if (null_ok && cJSON_IsNull(v))
		return "";
	size_t old = push_key(r, key);
	jerr(r, "expected a string, got %s", jtype(v));
	pop(r, old);
	return NULL;
}

/* A layer, dim or value name (ir_name_problem), reported at field `key` of the current path. */
static bool check_name(jr *r, const char *key, ir_name_kind k, const char *what, const char *name)
{
	const char *why = ir_name_problem(k, name);
	if (why) {
		size_t old = push_key(r, key);
		jerr(r, "%s \"%.40s%s\" %s", what, name, strlen(name) > 40 ? "..." : "", why);
		pop(r, old);
	}
	return !why;
}

static bool field_dtype(jr *r, const cJSON *o, moe_dtype *t)
{
	const char *s = field_str(r, o, "dtype", false);
	if (!s)
		return false;
	int d = moe_dtype_from_name(s);
	if (d < 0) {
		size_t old = push_key(r, "dtype");
		jerr(r, "unknown element type '%.40s' (f32, bf16, i32, bool, f8e4m3, i8, u8)", s);
		pop(r, old);
		return false;
	}
	*t = (moe_dtype)d;
	return true;
}

static bool read_float(jr *r, const cJSON *v, double *out)
{
	if (cJSON_IsNumber(v)) {
		*out = v->valuedouble;
		return true;
	}
	if (cJSON_IsString(v) && v->valuestring) {
		const char *s = v->valuestring;
		bool neg = *s == '-';
		if (!strcmp(s + neg, "inf")) {
			*out = neg ? -INFINITY : INFINITY;
			return true;
		}
		if (!strcmp(s + neg, "nan")) {
			*out = copysign(NAN, neg ? -1.0 : 1.0);
			return true;
		}
	}
	jerr(r, "expected a number or \"inf\", \"-inf\", \"nan\", \"-nan\", got %s", jtype(v));
	return false;
}

static bool read_attr(jr *r, moe_graph *g, ir_node *n, const cJSON *c)
{
	static const char *const tags[] = {"int", "float", "str", "ints", NULL};
	if (!check_object(r, c, tags))
		return false;
	const cJSON *v = c->child;
	if (!v || v->next) {
		jerr(r, "an attribute value is an object with exactly one of \"int\", \"float\", \"str\", \"ints\"");
		return false;
	}
	ir_attr a = {.key = c->string};
	size_t old = push_key(r, v->string);
	bool ok = true;
	if (!strcmp(v->string, "int")) {
		a.kind = MOE_ATTR_INT;
		ok = read_int(r, v, INT64_MIN, INT64_MAX, true, &a.v.i);
	} else if (!strcmp(v->string, "float")) {
		a.kind = MOE_ATTR_FLOAT;
		ok = read_float(r, v, &a.v.f);
	} else if (!strcmp(v->string, "str")) {
		a.kind = MOE_ATTR_STR;
		a.v.s = cJSON_IsString(v) ? v->valuestring : NULL;
		if (!a.v.s) {
			jerr(r, "expected a string, got %s", jtype(v));
			ok = false;
		}
	} else {
		a.kind = MOE_ATTR_INTS;
		if (!cJSON_IsArray(v)) {
			jerr(r, "expected an array of integers, got %s", jtype(v));
			ok = false;
		}
		uint32_t k = 0;
		for (const cJSON *e = ok ? v->child : NULL; e; e = e->next, k++) {
			if (k >= (uint32_t)INT32_MAX / 2) {
				jerr(r, "integer list is too long");
				ok = false;
				break;
			}
			ctx_grow(r->ctx, (void **)&r->ints, &r->intcap, k + 1, sizeof *r->ints);
			size_t o2 = push_index(r, k);
			ok = read_int(r, e, INT64_MIN, INT64_MAX, true, &r->ints[k]);
			pop(r, o2);
			if (!ok)
				break;
		}
		a.count = (int)k;
		a.v.ints = r->ints;
	}
	pop(r, old);
	if (ok && n != &g->meta && !ir_attr_check(r->ctx, (moe_op)n->op, &a, jloc(r)))
		ok = false;
	if (ok)
		ir_attr_set(g, n, &a);
	return ok;
}

/* Attribute object of node id (MOE_NONE: the graph's attrs). */
static bool read_attrs(jr *r, moe_graph *g, moe_id id, const cJSON *o)
{
	if (!o)
		return true;
	size_t old = push_key(r, "attrs");
	bool ok = cJSON_IsObject(o);
	if (!ok)
		jerr(r, "expected an object, got %s", jtype(o));
	for (const cJSON *c = ok ? o->child : NULL; c; c = c->next) {
		ir_node *n = id == MOE_NONE ? &g->meta : N(g, id);
		size_t o2 = push_key(r, c->string ? c->string : "");
		if (!c->string || ir_attr_find(n, c->string)) {
			jerr(r, "duplicate attribute");
			ok = false;
		} else {
			ok = read_attr(r, g, n, c);
		}
		pop(r, o2);
		if (!ok)
			break;
	}
	pop(r, old);
	return ok;
}

static bool read_loc(jr *r, const cJSON *o, moe_loc *loc)
{
	static const char *const fields[] = {"file", "line", "col", NULL};
	*loc = moe_loc_none();
	if (!o)
		return true;
	size_t old = push_key(r, "loc");
	bool ok = check_object(r, o, fields);
	int64_t line = 0, col = 0;
	const char *file = NULL;
	if (ok && cJSON_GetObjectItemCaseSensitive(o, "file"))
		ok = (file = field_str(r, o, "file", false)) != NULL;
	ok = ok && field_int(r, o, "line", 0, INT32_MAX, &line) && field_int(r, o, "col", 0, INT32_MAX, &col);
	pop(r, old);
	if (ok)
		*loc = moe_loc_at(r->ctx, file, (int)line, (int)col);
	return ok;
}

static bool read_node(jr *r, moe_graph *g, const cJSON *o);

/* o's "nodes" array into g, in order (what: "layer" or "body", for the message). */
static bool read_nodes(jr *r, moe_graph *g, const cJSON *o, const char *what)
{
	const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(o, "nodes");
	size_t old = push_key(r, "nodes");
	if (!cJSON_IsArray(nodes)) {
		jerr(r, "expected an array, got %s", jtype(nodes));
		return false;
	}
	size_t i = 0;
	for (const cJSON *n = nodes->child; n; n = n->next, i++) {
		if (i >= (size_t)INT32_MAX) {
			jerr(r, "too many nodes in one %s", what);
			return false;
		}
		size_t o2 = push_index(r, i);
		if (!read_node(r, g, n))
			return false;
		pop(r, o2);
	}
	pop(r, old);
	return true;
}

/* The "body" of block_loop id: {"nodes": [...], "yield": N}, ids of its own. */
static bool read_body(jr *r, moe_graph *g, moe_id id, const cJSON *o)
{
	static const char *const fields[] = {"!nodes", "!yield", NULL};
	size_t old = push_key(r, "body");
	if (!o) {
		jerr(r, "a block_loop needs its body");
		return false;
	}
	if (g->is_body) {
		jerr(r, "'block_loop' inside a block_loop body (bodies do not nest)");
		return false;
	}
	if (!check_object(r, o, fields))
		return false;
	uint32_t bi;
	moe_graph *b = ir_body_new(g, &bi);
	N(g, id)->body = bi;
	if (!read_nodes(r, b, o, "body"))
		return false;
	size_t o2 = push_key(r, "yield");
	int64_t y;
	if (!read_int(r, cJSON_GetObjectItemCaseSensitive(o, "yield"), 0, INT64_MAX, false, &y))
		return false;
	if (y >= (int64_t)b->nnodes) {
		jerr(r, "%%%lld is not a node of this body", (long long)y);
		return false;
	}
	moe_graph_add_output(b, (moe_id)y);
	pop(r, o2);
	pop(r, old);
	return true;
}

static bool read_node(jr *r, moe_graph *g, const cJSON *o)
{
	static const char *const fields[] = {"!id", "!op", "name", "!args", "valid", "!dtype", "!shape", "attrs",
		"body", "loc", NULL};
	moe_id id = g->nnodes;
	if (!check_object(r, o, fields))
		return false;
	int64_t v;
	if (!field_int(r, o, "id", 0, INT64_MAX, &v))
		return false;
	if (v != (int64_t)id) {
		size_t old = push_key(r, "id");
		jerr(r, "expected id %u, got %lld (ids are dense and in order)", id, (long long)v);
		pop(r, old);
		return false;
	}
	const char *ops = field_str(r, o, "op", false);
	if (!ops)
		return false;
	int op = moe_op_from_name(ops);
	if (op < 0) {
		size_t old = push_key(r, "op");
		jerr(r, "unknown op '%.40s'", ops);
		pop(r, old);
		return false;
	}
	const char *name = NULL;
	if (cJSON_GetObjectItemCaseSensitive(o, "name")) {
		if (!(name = field_str(r, o, "name", true)))
			return false;
		if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "name")))
			name = NULL;
		else if (!check_name(r, "name", IR_NAME_VALUE, "value name", name))
			return false;
	}
	const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "args");
	size_t old = push_key(r, "args");
	if (!cJSON_IsArray(args)) {
		jerr(r, "expected an array, got %s", jtype(args));
		return false;
	}
	uint32_t nargs = 0;
	for (const cJSON *a = args->child; a; a = a->next, nargs++) {
		if (nargs == IR_MAX_ARGS) {
			jerr(r, "more than %d operands", IR_MAX_ARGS);
			return false;
		}
		ctx_grow(r->ctx, (void **)&r->args, &r->argcap, nargs + 1, sizeof *r->args);
		if (cJSON_IsNull(a)) {
			r->args[nargs] = MOE_NONE;
			continue;
		}
		size_t o2 = push_index(r, nargs);
		if (!read_int(r, a, 0, INT64_MAX, false, &v))
			return false;
		if (v >= (int64_t)id) {
			jerr(r, "%%%lld is not defined before its use (operands must refer to earlier nodes)", (long long)v);
			return false;
		}
		pop(r, o2);
		r->args[nargs] = (moe_id)v;
	}
	pop(r, old);
	moe_id valid = MOE_NONE;
	const cJSON *vj = cJSON_GetObjectItemCaseSensitive(o, "valid");
	if (vj && !cJSON_IsNull(vj)) {
		old = push_key(r, "valid");
		if (!read_int(r, vj, 0, INT64_MAX, false, &v))
			return false;
		if (v >= (int64_t)id) {
			jerr(r, "%%%lld is not defined before its use", (long long)v);
			return false;
		}
		pop(r, old);
		valid = (moe_id)v;
	}
	moe_dtype t;
	if (!field_dtype(r, o, &t))
		return false;
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
	int64_t shape[MOE_MAX_RANK];
	int rank = 0;
	old = push_key(r, "shape");
	if (!cJSON_IsArray(sh)) {
		jerr(r, "expected an array, got %s", jtype(sh));
		return false;
	}
	for (const cJSON *d = sh->child; d; d = d->next, rank++) {
		if (rank == MOE_MAX_RANK) {
			jerr(r, "rank exceeds the limit of %d", MOE_MAX_RANK);
			return false;
		}
		size_t o2 = push_index(r, (size_t)rank);
		if (!read_int(r, d, 1, MOE_MAX_DIM, false, &shape[rank]))
			return false;
		pop(r, o2);
	}
	pop(r, old);
	moe_loc loc;
	if (!read_loc(r, cJSON_GetObjectItemCaseSensitive(o, "loc"), &loc))
		return false;
	ir_emit(g, (moe_op)op, MOE_F32, 0, NULL, r->args, nargs, loc);
	if (name)
		moe_node_set_name(g, id, name);
	N(g, id)->valid = valid;
	if (!read_attrs(r, g, id, cJSON_GetObjectItemCaseSensitive(o, "attrs")))
		return false;
	const cJSON *body = cJSON_GetObjectItemCaseSensitive(o, "body");
	if (op == MOE_OP_BLOCK_LOOP ? !read_body(r, g, id, body) : body != NULL) {
		if (body && op != MOE_OP_BLOCK_LOOP) {
			size_t o2 = push_key(r, "body");
			jerr(r, "only a block_loop has a body");
			pop(r, o2);
		}
		return false;
	}
	/* diagnostics of inference go to the node's source location, or to this
	 * file when it has none; a note gives the JSON path */
	if (!loc.file && loc.line <= 0)
		N(g, id)->loc = jloc(r);
	if (ir_read_finish_node(r->ctx, g, id, t, rank, shape) != MOE_OK) {
		moe_diag(r->ctx, MOE_DIAG_NOTE, jloc(r), "%s: in this node", r->path);
		return false;
	}
	N(g, id)->loc = loc;
	return true;
}

static bool read_layer(jr *r, moe_module *m, const cJSON *o)
{
	static const char *const fields[] = {"!name", "!dtype", "dims", "attrs", "!nodes", "!outputs", NULL};
	if (!check_object(r, o, fields))
		return false;
	const char *name = field_str(r, o, "name", false);
	moe_dtype t;
	if (!name || !check_name(r, "name", IR_NAME_LAYER, "layer name", name) || !field_dtype(r, o, &t))
		return false;
	moe_graph *g = moe_module_add_graph(m, name);
	g->dtype = t;
	g->loc = moe_loc_file(r->ctx, r->file);
	const cJSON *dims = cJSON_GetObjectItemCaseSensitive(o, "dims");
	if (dims) {
		static const char *const dfields[] = {"!name", "!value", NULL};
		size_t old = push_key(r, "dims");
		if (!cJSON_IsArray(dims)) {
			jerr(r, "expected an array, got %s", jtype(dims));
			return false;
		}
		size_t i = 0;
		for (const cJSON *d = dims->child; d; d = d->next, i++) {
			size_t o2 = push_index(r, i);
			if (!check_object(r, d, dfields))
				return false;
			const char *dn = field_str(r, d, "name", false);
			int64_t v;
			if (!dn || !check_name(r, "name", IR_NAME_DIM, "dimension name", dn))
				return false;
			size_t o3 = push_key(r, "value");
			if (!read_int(r, cJSON_GetObjectItemCaseSensitive(d, "value"), INT64_MIN, INT64_MAX, true, &v))
				return false;
			pop(r, o3);
			if (moe_graph_get_dim(g, dn, NULL)) {
				jerr(r, "duplicate dimension '%.40s'", dn);
				return false;
			}
			moe_graph_set_dim(g, dn, v);
			pop(r, o2);
		}
		pop(r, old);
	}
	if (!read_attrs(r, g, MOE_NONE, cJSON_GetObjectItemCaseSensitive(o, "attrs")))
		return false;
	if (!read_nodes(r, g, o, "layer"))
		return false;
	const cJSON *outs = cJSON_GetObjectItemCaseSensitive(o, "outputs");
	size_t old = push_key(r, "outputs");
	if (!cJSON_IsArray(outs)) {
		jerr(r, "expected an array, got %s", jtype(outs));
		return false;
	}
	size_t i = 0;
	for (const cJSON *v = outs->child; v; v = v->next, i++) {
		size_t o2 = push_index(r, i);
		int64_t x;
		if (!read_int(r, v, 0, INT64_MAX, false, &x))
			return false;
		if (x >= (int64_t)g->nnodes) {
			jerr(r, "output %%%lld is not a node of this layer", (long long)x);
			return false;
		}
		moe_graph_add_output(g, (moe_id)x);
		pop(r, o2);
	}
	pop(r, old);
	return true;
}

static bool read_module(jr *r, moe_module *m, const cJSON *root)
{
	static const char *const fields[] = {"!format", "!version", "!layers", NULL};
	if (!check_object(r, root, fields))
		return false;
	const char *fmt = field_str(r, root, "format", false);
	if (!fmt)
		return false;
	if (strcmp(fmt, "moeir")) {
		size_t old = push_key(r, "format");
		jerr(r, "not a moeir document (format \"%.40s\", expected \"moeir\")", fmt);
		pop(r, old);
		return false;
	}
	int64_t version = 0;
	if (!field_int(r, root, "version", INT64_MIN, INT64_MAX, &version))
		return false;
	if (version != IR_TEXT_VERSION) {
		size_t old = push_key(r, "version");
		jerr(r, "unsupported moeir JSON version %lld (this moec reads version %d)", (long long)version,
			IR_TEXT_VERSION);
		pop(r, old);
		return false;
	}
	const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
	size_t old = push_key(r, "layers");
	if (!cJSON_IsArray(layers)) {
		jerr(r, "expected an array, got %s", jtype(layers));
		return false;
	}
	size_t i = 0;
	for (const cJSON *l = layers->child; l; l = l->next, i++) {
		size_t o2 = push_index(r, i);
		if (!read_layer(r, m, l))
			return false;
		pop(r, o2);
	}
	pop(r, old);
	return true;
}

/* The first NUL a string of the document would decode to (a raw NUL byte or
 * the escape \u0000): cJSON would cut the string there, so that the value read
 * is not the value written. NULL when there is none. */
static const char *string_nul(const char *text, size_t len)
{
	const char *e = text + len;
	bool in = false;
	for (const char *p = text; p < e; p++) {
		if (!in) {
			in = *p == '"';
			continue;
		}
		if (*p == '"')
			in = false;
		else if (*p == 0)
			return p;
		else if (*p == '\\' && p + 1 < e) {
			if (p[1] == 'u' && e - p >= 6 && !memcmp(p + 2, "0000", 4))
				return p;
			p++;
		}
	}
	return NULL;
}

static void delete_json(void *root)
{
	cJSON_Delete(root);
}

/* What parsing JSON IR may allocate (ctx_json_measure's estimate), checked
 * before cJSON runs, whoever passes the text (a file, standard input, a
 * library caller): the largest committed JSON IR costs a few MiB. */
#define IR_JSON_MAX_COST ((uint64_t)256 << 20)

static moe_module *parse_json(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	if (!text)
		text = "", len = 0;
	if (!file)
		file = "<input>";
	moe_ctx_add_source(ctx, file, text, len);
	jr r = {.ctx = ctx, .file = ctx_intern(ctx, file), .text = text, .len = len};
	ctx_json_shape sh;
	ctx_json_measure(text, len, &sh);
	if (sh.cost > IR_JSON_MAX_COST) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_at(ctx, file, 1, 1),
			"JSON IR holds %zu values and %zu strings: parsing it would take about %llu MiB, more than the "
			"%llu MiB moec allows JSON IR", sh.values, sh.strings, (unsigned long long)(sh.cost >> 20),
			(unsigned long long)(IR_JSON_MAX_COST >> 20));
		return NULL;
	}
	const char *nul = string_nul(text, len);
	const char *end = NULL;
	cJSON *root = len && !nul ? cJSON_ParseWithLengthOpts(text, len, &end, 0) : NULL;
	const char *tail = root && end ? end : NULL;
	while (tail && tail < text + len && (*tail == ' ' || *tail == '\t' || *tail == '\r' || *tail == '\n'))
		tail++;
	if (!root || (tail && tail < text + len)) {
		const char *at = nul ? nul : root ? tail : end;
		if (!at || at < text || at > text + len)
			at = text + len;
		int line = 1, col = 1;
		for (const char *p = text; p < at; p++) {
			if (*p == '\n') {
				line++;
				col = 1;
			} else {
				col++;
			}
		}
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_at(ctx, file, line, col),
			nul ? "a NUL byte in a JSON string (names and strings cannot hold one)" :
			root ? "unexpected text after the JSON document" :
			len ? "malformed JSON" : "empty input (expected a JSON document)");
		cJSON_Delete(root);
		return NULL;
	}
	uint32_t h = ctx_defer(ctx, delete_json, root); /* cJSON's memory is libc's */
	moe_module *m = moe_module_new(ctx);
	bool ok = read_module(&r, m, root);
	ctx_undefer(ctx, h);
	cJSON_Delete(root);
	ctx_free(ctx, r.args, r.argcap * sizeof *r.args);
	ctx_free(ctx, r.ints, r.intcap * sizeof *r.ints);
	if (!ok) {
		moe_module_free(m);
		return NULL;
	}
	return m;
}

moe_module *moe_module_parse_json(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	if (!ctx)
		return NULL;
	CTX_GUARDED(ctx, moe_module *, NULL, parse_json(ctx, file, text, len));
}
