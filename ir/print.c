/* ir/print.c: the textual IR printer (`.moeir`, docs/ir.md) and the float and
 * type formatting shared with the JSON and dot writers.
 *
 * Names that are not plain identifiers (layer names, attribute keys, dim
 * names) print as quoted strings, escaped like every string, so that no name
 * changes the structure of the text; ir/parse.c accepts both spellings of an
 * attribute key, and rejects layer, dim and value names that break the rules
 * of ir_name_problem. Character classes are ASCII whatever the locale. */
#include <math.h>
#include <string.h>

#include "ir/serial.h"

const char *ir_fmt_float(double v, char buf[IR_FLOAT_BUF])
{
	if (isnan(v)) {
		snprintf(buf, IR_FLOAT_BUF, "%s", signbit(v) ? "-nan" : "nan");
		return buf;
	}
	if (isinf(v)) {
		snprintf(buf, IR_FLOAT_BUF, "%s", v < 0 ? "-inf" : "inf");
		return buf;
	}
	for (int p = 1; p <= 17; p++) {
		snprintf(buf, IR_FLOAT_BUF, "%.*g", p, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	/* %g may print an integral value without '.' or exponent: mark it float */
	if (!strpbrk(buf, ".eE"))
		strcat(buf, ".0");
	return buf;
}

void ir_fmt_type(moe_dtype t, int rank, const int64_t *shape, char *buf, size_t len)
{
	size_t o = 0;
	int w = snprintf(buf, len, "%s[", moe_dtype_name(t));
	o = w > 0 ? (size_t)w : 0;
	for (int i = 0; i < rank && o < len; i++) {
		w = snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
		o += w > 0 ? (size_t)w : 0;
	}
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static void put_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		switch (*p) {
		case '"': fputs("\\\"", f); break;
		case '\\': fputs("\\\\", f); break;
		case '\n': fputs("\\n", f); break;
		case '\t': fputs("\\t", f); break;
		default:
			if (*p < 0x20 || *p == 0x7f)
				fprintf(f, "\\x%02x", *p);
			else
				fputc(*p, f);
		}
	}
	fputc('"', f);
}

static bool id_start(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static bool id_char(unsigned char c)
{
	return id_start(c) || (c >= '0' && c <= '9');
}

static bool is_ident(const char *s)
{
	if (!s || !id_start((unsigned char)*s))
		return false;
	for (s++; *s; s++)
		if (!id_char((unsigned char)*s))
			return false;
	return true;
}

const char *ir_name_problem(ir_name_kind k, const char *s)
{
	if (!s || !*s)
		return "is empty";
	if (strlen(s) > IR_NAME_MAX)
		return "is longer than 256 bytes";
	if (!id_start((unsigned char)*s))
		return k == IR_NAME_VALUE ? "does not start with a letter or '_'"
					  : "is not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
	for (const unsigned char *p = (const unsigned char *)s + 1; *p; p++)
		if (!id_char(*p) && !(k == IR_NAME_VALUE && (*p == '.' || *p == '+' || *p == '-')))
			return k == IR_NAME_VALUE ? "holds a byte other than a letter, a digit, '_', '.', '+' or '-'"
						  : "is not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
	return NULL;
}

/* an identifier, or a quoted string when the name is not one */
static void put_key(FILE *f, const char *s)
{
	if (is_ident(s))
		fputs(s, f);
	else
		put_str(f, s);
}

static void put_attr_value(FILE *f, const ir_attr *a)
{
	char fb[IR_FLOAT_BUF];
	switch (a->kind) {
	case MOE_ATTR_INT: fprintf(f, "%lld", (long long)a->v.i); break;
	case MOE_ATTR_FLOAT: fputs(ir_fmt_float(a->v.f, fb), f); break;
	case MOE_ATTR_STR: put_str(f, a->v.s); break;
	case MOE_ATTR_INTS:
		fputc('[', f);
		for (int i = 0; i < a->count; i++)
			fprintf(f, "%s%lld", i ? ", " : "", (long long)a->v.ints[i]);
		fputc(']', f);
		break;
	}
}

static void put_attrs(FILE *f, const ir_node *n)
{
	for (uint32_t i = 0; i < n->nattrs; i++) {
		if (i)
			fputs(", ", f);
		put_key(f, n->attrs[i].key);
		fputc('=', f);
		put_attr_value(f, &n->attrs[i]);
	}
}

static void put_body(FILE *f, const moe_graph *g, const ir_node *n, int indent);

static void put_node(FILE *f, const moe_graph *g, moe_id id, int indent)
{
	const ir_node *n = N(g, id);
	fprintf(f, "%*s%%%u = %s", indent, "", id, moe_op_name((moe_op)n->op));
	if (n->name) {
		fputc(' ', f);
		put_str(f, n->name);
	}
	if (n->nargs) {
		fputc('(', f);
		for (uint32_t i = 0; i < n->nargs; i++) {
			if (i)
				fputs(", ", f);
			if (n->args[i] == MOE_NONE)
				fputc('_', f);
			else
				fprintf(f, "%%%u", n->args[i]);
		}
		fputc(')', f);
	}
	if (n->valid != MOE_NONE)
		fprintf(f, " valid(%%%u)", n->valid);
	if (n->nattrs) {
		fputs(" {", f);
		put_attrs(f, n);
		fputc('}', f);
	}
	fprintf(f, " : %s[", moe_dtype_name((moe_dtype)n->dtype));
	for (int i = 0; i < n->rank; i++)
		fprintf(f, "%s%lld", i ? ", " : "", (long long)n->shape[i]);
	fputc(']', f);
	if (ir_node_body(g, n))
		put_body(f, g, n, indent);
	fputc('\n', f);
}

/* ` body { nodes  yield %N }`, the body's nodes two spaces deeper */
static void put_body(FILE *f, const moe_graph *g, const ir_node *n, int indent)
{
	const moe_graph *b = ir_node_body(g, n);
	fputs(" body {\n", f);
	for (moe_id i = 0; i < b->nnodes; i++)
		put_node(f, b, i, indent + 2);
	for (uint32_t i = 0; i < b->nout; i++)
		fprintf(f, "%*syield %%%u\n", indent + 2, "", b->outputs[i]);
	fprintf(f, "%*s}", indent, "");
}

static bool is_bare_layer_name(const char *s)
{
	if (!s || !*s)
		return false;
	for (; *s; s++)
		if (!(id_char((unsigned char)*s) || *s == '.' || *s == '-'))
			return false;
	return true;
}

static void put_graph(FILE *f, const moe_graph *g)
{
	fputs("layer @", f);
	if (is_bare_layer_name(g->name))
		fputs(g->name, f);
	else
		put_str(f, g->name);
	fprintf(f, " dtype=%s {\n", moe_dtype_name(g->dtype));
	if (g->ndims) {
		fputs("  dims ", f);
		for (uint32_t i = 0; i < g->ndims; i++) {
			if (i)
				fputs(", ", f);
			put_key(f, g->dims[i].name);
			fprintf(f, "=%lld", (long long)g->dims[i].value);
		}
		fputc('\n', f);
	}
	if (g->meta.nattrs) {
		fputs("  attrs ", f);
		put_attrs(f, &g->meta);
		fputc('\n', f);
	}
	for (moe_id i = 0; i < g->nnodes; i++)
		put_node(f, g, i, 2);
	if (g->nout) {
		fputs("  output ", f);
		for (uint32_t i = 0; i < g->nout; i++)
			fprintf(f, "%s%%%u", i ? ", " : "", g->outputs[i]);
		fputc('\n', f);
	}
	fputs("}\n", f);
}

moe_status moe_module_print(const moe_module *m, FILE *out)
{
	if (!m || !out)
		return MOE_ERR_INVALID;
	fprintf(out, "moeir %d\n", IR_TEXT_VERSION);
	for (uint32_t i = 0; i < m->ngraphs; i++)
		put_graph(out, m->graphs[i]);
	return ferror(out) ? MOE_ERR_IO : MOE_OK;
}
