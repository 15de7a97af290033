/* backend-c/emit_c.c: kernel form -> portable C11 (ABI in docs/abi.md).
 *
 * The emitted file depends on <stdint.h>, <stddef.h>, <string.h> and
 * <math.h> only. Signed i32 arithmetic goes through unsigned helpers so that
 * wrap-around is defined; float arithmetic is written operation by operation
 * (compile with -ffp-contract=off so that no multiply-add is fused). */
#include <math.h>
#include <string.h>

#include "backend-c/cgen.h"

static const char *const prelude =
	"#ifndef MOE_EMIT_PRELUDE\n"
	"#define MOE_EMIT_PRELUDE 1\n"
	"#include <math.h>\n"
	"#include <stddef.h>\n"
	"#include <stdint.h>\n"
	"#include <string.h>\n"
	"\n"
	"/* One tensor of a layer's signature. dtype: \"f32\", \"bf16\" (uint16_t\n"
	" * holding the upper half of an f32), \"i32\", \"bool\" (uint8_t 0/1). */\n"
	"typedef struct moe_abi_tensor {\n"
	"\tconst char *name;\n"
	"\tconst char *dtype;\n"
	"\tint rank;\n"
	"\tint64_t shape[8];\n"
	"\tconst char *source; /* weights: the checkpoint tensor name, else NULL */\n"
	"} moe_abi_tensor;\n"
	"\n"
	"enum { MOE_FAULT_INDEX = 1, MOE_FAULT_DIV0 = 2 };\n"
	"\n"
	"#if defined(__GNUC__)\n"
	"#define MOE_HELPER static inline __attribute__((unused))\n"
	"#else\n"
	"#define MOE_HELPER static inline\n"
	"#endif\n"
	"MOE_HELPER float moe_f32_of_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }\n"
	"MOE_HELPER uint32_t moe_bits_of_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }\n"
	"MOE_HELPER int32_t moe_wrap(uint32_t u)\n"
	"{\n"
	"\treturn u <= 0x7fffffffu ? (int32_t)u : (int32_t)(u - 0x80000000u) - 0x7fffffff - 1;\n"
	"}\n"
	"/* round an f32 to bf16 precision, nearest even; NaN stays NaN (quieted) */\n"
	"MOE_HELPER float moe_rbf16(float x)\n"
	"{\n"
	"\tuint32_t u = moe_bits_of_f32(x);\n"
	"\tif ((u & 0x7fffffffu) > 0x7f800000u)\n"
	"\t\tu = (u | 0x00400000u) & 0xffff0000u;\n"
	"\telse\n"
	"\t\tu = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;\n"
	"\treturn moe_f32_of_bits(u);\n"
	"}\n"
	"/* widen bf16 to f32; a signalling NaN is quieted */\n"
	"MOE_HELPER float moe_ld_bf16(uint16_t h)\n"
	"{\n"
	"\treturn moe_f32_of_bits(((uint32_t)h << 16) | ((h & 0x7fffu) > 0x7f80u ? 0x00400000u : 0u));\n"
	"}\n"
	"MOE_HELPER uint16_t moe_st_bf16(float x) { return (uint16_t)(moe_bits_of_f32(x) >> 16); }\n"
	"MOE_HELPER int32_t moe_add_i32(int32_t a, int32_t b) { return moe_wrap((uint32_t)a + (uint32_t)b); }\n"
	"MOE_HELPER int32_t moe_sub_i32(int32_t a, int32_t b) { return moe_wrap((uint32_t)a - (uint32_t)b); }\n"
	"MOE_HELPER int32_t moe_mul_i32(int32_t a, int32_t b) { return moe_wrap((uint32_t)a * (uint32_t)b); }\n"
	"MOE_HELPER int32_t moe_neg_i32(int32_t a) { return moe_wrap(0u - (uint32_t)a); }\n"
	"MOE_HELPER int32_t moe_abs_i32(int32_t a) { return a < 0 ? moe_neg_i32(a) : a; }\n"
	"/* b != 0 is checked by the caller; INT32_MIN / -1 wraps */\n"
	"MOE_HELPER int32_t moe_div_i32(int32_t a, int32_t b) { return b == -1 ? moe_neg_i32(a) : a / b; }\n"
	"MOE_HELPER int32_t moe_shl_i32(int32_t a, int32_t b) { return moe_wrap((uint32_t)a << (b & 31)); }\n"
	"MOE_HELPER int32_t moe_lshr_i32(int32_t a, int32_t b) { return moe_wrap((uint32_t)a >> (b & 31)); }\n"
	"MOE_HELPER int32_t moe_ashr_i32(int32_t a, int32_t b)\n"
	"{\n"
	"\treturn a < 0 ? ~(~a >> (b & 31)) : a >> (b & 31);\n"
	"}\n"
	"MOE_HELPER int32_t moe_min_i32(int32_t a, int32_t b) { return b < a ? b : a; }\n"
	"MOE_HELPER int32_t moe_max_i32(int32_t a, int32_t b) { return b > a ? b : a; }\n"
	"MOE_HELPER int64_t moe_min_i64(int64_t a, int64_t b) { return b < a ? b : a; }\n"
	"MOE_HELPER int64_t moe_max_i64(int64_t a, int64_t b) { return b > a ? b : a; }\n"
	"/* NaN if either operand is NaN */\n"
	"MOE_HELPER float moe_min_f32(float a, float b) { return a != a ? a : b != b ? b : b < a ? b : a; }\n"
	"MOE_HELPER float moe_max_f32(float a, float b) { return a != a ? a : b != b ? b : b > a ? b : a; }\n"
	"/* truncation toward 0, NaN -> 0, saturating */\n"
	"MOE_HELPER int32_t moe_f32_to_i32(float x)\n"
	"{\n"
	"\treturn x != x ? 0 : x >= 2147483648.0f ? INT32_MAX : x < -2147483648.0f ? INT32_MIN : (int32_t)x;\n"
	"}\n"
	"#endif /* MOE_EMIT_PRELUDE */\n";

typedef struct emc {
	cg_prog *p;
	FILE *o;
} emc;

static const char *ctype(cg_ty t)
{
	return t == CT_I64 ? "int64_t" : t == CT_I32 ? "int32_t" : t == CT_F32 ? "float" : "double";
}

static const char *mtype(moe_dtype t)
{
	switch (t) {
	case MOE_F32: return "float";
	case MOE_BF16: return "uint16_t";
	case MOE_I32: return "int32_t";
	default: return "uint8_t";
	}
}

static void fconst(FILE *o, double d, cg_ty t)
{
	if (t == CT_F64) {
		IR_ASSERT(isfinite(d));
		fprintf(o, "%a", d);
		return;
	}
	float f = (float)d;
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7f800000u) == 0x7f800000u || f == 0.0f)
		fprintf(o, "moe_f32_of_bits(0x%08xu)", u); /* inf, NaN, and the sign of zero */
	else
		fprintf(o, "%af", (double)f);
}

static void ex(emc *c, const cg_expr *e)
{
	FILE *o = c->o;
	switch ((cg_eop)e->op) {
	case CE_ICONST:
		if (e->ty == CT_I64)
			fprintf(o, "INT64_C(%lld)", (long long)e->i);
		else if (e->i == INT32_MIN)
			fprintf(o, "INT32_MIN");
		else
			fprintf(o, e->i < 0 ? "(%lld)" : "%lld", (long long)e->i);
		return;
	case CE_FCONST: fconst(o, e->d, (cg_ty)e->ty); return;
	case CE_VAR: fprintf(o, "v%d", e->var); return;
	case CE_LOAD: {
		moe_dtype t = (moe_dtype)c->p->bufs[e->buf].dtype;
		bool byte = t == MOE_BOOL || moe_dtype_is_storage(t); /* raw bytes load as their i32 value */
		fprintf(o, t == MOE_BF16 ? "moe_ld_bf16(b%d[" : byte ? "((int32_t)b%d[" : "b%d[", e->buf);
		ex(c, e->a);
		fprintf(o, t == MOE_BF16 || byte ? "])" : "]");
		return;
	}
	default: break;
	}
	const char *inl = NULL, *fn = NULL;
	switch ((cg_eop)e->op) {
	case CE_ADD: if (e->ty != CT_I32) inl = "+"; else fn = "moe_add_i32"; break;
	case CE_SUB: if (e->ty != CT_I32) inl = "-"; else fn = "moe_sub_i32"; break;
	case CE_MUL: if (e->ty != CT_I32) inl = "*"; else fn = "moe_mul_i32"; break;
	case CE_FDIV: inl = "/"; break;
	case CE_SDIV: fn = "moe_div_i32"; break;
	case CE_SREM: inl = "%"; break;
	case CE_AND: inl = "&"; break;
	case CE_OR: inl = "|"; break;
	case CE_XOR: inl = "^"; break;
	case CE_SHL: fn = "moe_shl_i32"; break;
	case CE_LSHR: fn = "moe_lshr_i32"; break;
	case CE_ASHR: fn = "moe_ashr_i32"; break;
	case CE_MIN: fn = e->ty == CT_F32 ? "moe_min_f32" : e->ty == CT_I32 ? "moe_min_i32" : "moe_min_i64"; break;
	case CE_MAX: fn = e->ty == CT_F32 ? "moe_max_f32" : e->ty == CT_I32 ? "moe_max_i32" : "moe_max_i64"; break;
	case CE_EQ: inl = "=="; break;
	case CE_NE: inl = "!="; break;
	case CE_LT: inl = "<"; break;
	case CE_LE: inl = "<="; break;
	case CE_GT: inl = ">"; break;
	case CE_GE: inl = ">="; break;
	default: break;
	}
	if (inl) {
		bool cmp = e->op >= CE_EQ && e->op <= CE_GE;
		fprintf(o, cmp ? "(int32_t)(" : "(");
		ex(c, e->a);
		fprintf(o, " %s ", inl);
		ex(c, e->b);
		fprintf(o, ")");
		return;
	}
	if (fn) {
		fprintf(o, "%s(", fn);
		ex(c, e->a);
		fprintf(o, ", ");
		ex(c, e->b);
		fprintf(o, ")");
		return;
	}
	switch ((cg_eop)e->op) {
	case CE_NEG: fn = e->ty == CT_I32 ? "moe_neg_i32" : "-"; break;
	case CE_ABS: fn = e->ty == CT_I32 ? "moe_abs_i32" : e->ty == CT_F32 ? "fabsf" : "fabs"; break;
	case CE_NOT: fn = "~"; break;
	case CE_EXP: fn = e->ty == CT_F32 ? "expf" : "exp"; break;
	case CE_LOG: fn = e->ty == CT_F32 ? "logf" : "log"; break;
	case CE_SQRT: fn = e->ty == CT_F32 ? "sqrtf" : "sqrt"; break;
	case CE_TANH: fn = e->ty == CT_F32 ? "tanhf" : "tanh"; break;
	case CE_ERF: fn = e->ty == CT_F32 ? "erff" : "erf"; break;
	case CE_RBF16: fn = "moe_rbf16"; break;
	case CE_SELECT:
		fprintf(o, "(");
		ex(c, e->a);
		fprintf(o, " ? ");
		ex(c, e->b);
		fprintf(o, " : ");
		ex(c, e->c);
		fprintf(o, ")");
		return;
	case CE_ISNAN:
		fprintf(o, "(int32_t)(");
		ex(c, e->a);
		fprintf(o, " != ");
		ex(c, e->a);
		fprintf(o, ")");
		return;
	case CE_CONV:
		if (e->a->ty == CT_F32 && e->ty == CT_I32)
			fn = "moe_f32_to_i32";
		else {
			fprintf(o, "((%s)", ctype((cg_ty)e->ty));
			ex(c, e->a);
			fprintf(o, ")");
			return;
		}
		break;
	case CE_BITS: fn = e->ty == CT_I32 ? "moe_wrap(moe_bits_of_f32" : "moe_f32_of_bits((uint32_t)"; break;
	default: IR_ASSERT(!"unknown expression"); return;
	}
	fprintf(o, "%s(", fn);
	ex(c, e->a);
	fprintf(o, e->op == CE_BITS ? "))" : ")");
}

static void indent(FILE *o, int d)
{
	for (int i = 0; i < d; i++)
		fputc('\t', o);
}

/* CS_DOT as plain loops (cgen.h gives the semantics). */
static void dot(emc *c, const cg_dot *t, int d)
{
	FILE *o = c->o;
	bool bf = c->p->bufs[t->wbuf].dtype == MOE_BF16, abf = c->p->bufs[t->abuf].dtype == MOE_BF16;
	fprintf(o, "{\n");
	indent(o, d + 1);
	fprintf(o, "const int64_t rows = ");
	ex(c, t->rows);
	fprintf(o, ", lanes = ");
	ex(c, t->lanes);
	fprintf(o, ", ai = ");
	ex(c, t->ai);
	fprintf(o, ", wi0 = ");
	ex(c, t->wi);
	fprintf(o, ", di0 = ");
	ex(c, t->di);
	fprintf(o, ";\n");
	/* the group's tiles, one after the other (cgen.h) */
	indent(o, d + 1);
	fprintf(o, "for (int64_t u = 0; u < %lld && lanes > u * %d; u++) {\n", (long long)(t->group > 1 ? t->group : 1),
		DOT_LANES);
	d++;
	indent(o, d + 1);
	fprintf(o, "const int64_t last = (lanes - u * %d < %d ? lanes - u * %d : %d) - 1;\n", DOT_LANES, DOT_LANES,
		DOT_LANES, DOT_LANES);
	indent(o, d + 1);
	fprintf(o, "const int64_t wi = wi0 + u * INT64_C(%lld), di = di0 + u * INT64_C(%lld);\n",
		(long long)(DOT_LANES * t->wstride), (long long)t->dstep);
	indent(o, d + 1);
	fprintf(o, "for (int64_t r = 0; r < rows; r++)\n");
	indent(o, d + 2);
	fprintf(o, "for (int64_t j = 0; j < %d; j++) {\n", DOT_LANES);
	indent(o, d + 3);
	fprintf(o, "const %s *a = b%d + ai + r * INT64_C(%lld);\n", abf ? "uint16_t" : "float", t->abuf,
		(long long)t->astride);
	indent(o, d + 3);
	fprintf(o, "const %s *w = b%d + wi + (j < last ? j : last) * INT64_C(%lld);\n", bf ? "uint16_t" : "float",
		t->wbuf, (long long)t->wstride);
	indent(o, d + 3);
	fprintf(o, "float s = moe_f32_of_bits(0x80000000u);\n");
	indent(o, d + 3);
	fprintf(o, "for (int64_t k = 0; k < INT64_C(%lld); k++)\n", (long long)t->K);
	indent(o, d + 4);
	fprintf(o, "s = s + %s * %s;\n", abf ? "moe_ld_bf16(a[k])" : "a[k]", bf ? "moe_ld_bf16(w[k])" : "w[k]");
	indent(o, d + 3);
	fprintf(o, "b%d[di + r * INT64_C(%lld) + j] = s;\n", t->dbuf, (long long)(t->drow > 0 ? t->drow : DOT_LANES));
	indent(o, d + 2);
	fprintf(o, "}\n");
	d--;
	indent(o, d + 1);
	fprintf(o, "}\n");
	indent(o, d);
	fprintf(o, "}\n");
}

static void block(emc *c, const cg_block *b, int d)
{
	FILE *o = c->o;
	for (const cg_stmt *s = b->first; s; s = s->next) {
		if (s->comment) {
			indent(o, d);
			fprintf(o, "/* %s */\n", s->comment);
		}
		indent(o, d);
		switch ((cg_sk)s->kind) {
		case CS_FOR:
			fprintf(o, "for (v%d = ", s->var);
			ex(c, s->a);
			fprintf(o, "; v%d < ", s->var);
			ex(c, s->b);
			/* the marker also makes the JIT cache key (jit_cache.c) see parallel loops */
			fprintf(o, s->par ? "; v%d++) { /* parallel */\n" : "; v%d++) {\n", s->var);
			block(c, &s->body, d + 1);
			indent(o, d);
			fprintf(o, "}\n");
			break;
		case CS_SET:
			fprintf(o, "v%d = ", s->var);
			ex(c, s->a);
			fprintf(o, ";\n");
			break;
		case CS_STORE: {
			moe_dtype t = (moe_dtype)c->p->bufs[s->buf].dtype;
			IR_ASSERT(c->p->bufs[s->buf].writable);
			fprintf(o, "b%d[", s->buf);
			ex(c, s->a);
			bool byte = t == MOE_BOOL || moe_dtype_is_storage(t);
			fprintf(o, t == MOE_BF16 ? "] = moe_st_bf16(" : byte ? "] = (uint8_t)(" : "] = ");
			ex(c, s->b);
			fprintf(o, t == MOE_BF16 || byte ? ");\n" : ";\n");
			break;
		}
		case CS_IF:
			fprintf(o, "if (");
			ex(c, s->a);
			fprintf(o, ") {\n");
			block(c, &s->body, d + 1);
			indent(o, d);
			if (s->els.first) {
				fprintf(o, "} else {\n");
				block(c, &s->els, d + 1);
				indent(o, d);
			}
			fprintf(o, "}\n");
			break;
		case CS_FAULT: fprintf(o, "return %d;\n", s->code); break;
		case CS_DOT: dot(c, s->dot, d); break;
		}
	}
}

/* A C string literal of s: '"' and '\\' escaped, '?' too (no trigraph such as
 * ??/ can form under -std=c11), every other byte outside printable ASCII as a
 * three-digit octal escape. */
static void cstr(FILE *o, const char *s)
{
	if (!s) {
		fprintf(o, "NULL");
		return;
	}
	fputc('"', o);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\' || ch == '?')
			fprintf(o, "\\%c", ch);
		else if (ch < 32 || ch >= 127)
			fprintf(o, "\\%03o", ch);
		else
			fputc(ch, o);
	}
	fputc('"', o);
}

/* Text from an input inside a C comment: letters, digits, space and "_.+-"
 * as they are, any other byte as \xHH, so that nothing (a closing star-slash,
 * a line splice, a trigraph) can end the comment or join lines. */
static void ctext(FILE *o, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		bool keep = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
			    (*p && strchr(" _.+-", *p));
		if (keep)
			fputc(*p, o);
		else
			fprintf(o, "\\x%02x", *p);
	}
}

static void table_row(FILE *o, const moe_graph *g, moe_id id, const char *name, const char *source)
{
	const ir_node *n = N(g, id);
	fprintf(o, "\t{");
	cstr(o, name);
	fprintf(o, ", \"%s\", %d, {", moe_dtype_name((moe_dtype)n->dtype), n->rank);
	for (int d = 0; d < MOE_MAX_RANK; d++)
		fprintf(o, "%s%lld", d ? ", " : "", d < n->rank ? (long long)n->shape[d] : 0LL);
	fprintf(o, "}, ");
	cstr(o, source);
	fprintf(o, "},\n");
}

static void table(emc *c, const char *what, uint32_t count, const moe_id *ids, bool out)
{
	cg_prog *p = c->p;
	FILE *o = c->o;
	char sym[200];
	cgen_symbol(p, what, sym, sizeof sym);
	fprintf(o, "const unsigned %s_count = %u;\n", sym, count);
	fprintf(o, "const moe_abi_tensor %s[%u] = {\n", sym, count + 1);
	for (uint32_t i = 0; i < count; i++) {
		moe_id id = out ? p->g->outputs[i] : ids[i];
		const ir_node *n = N(p->g, id);
		char dflt[32];
		snprintf(dflt, sizeof dflt, "output%u", i);
		const char *name = n->name ? n->name : out ? dflt : "";
		if (out && n->op == MOE_OP_INPUT)
			name = dflt; /* an input passed through keeps the input's name on the input side */
		table_row(o, p->g, id, name, n->op == MOE_OP_WEIGHT ? ir_attr_str(n, "source", NULL) : NULL);
	}
	fprintf(o, "\t{NULL, NULL, 0, {0, 0, 0, 0, 0, 0, 0, 0}, NULL}\n};\n\n");
}

moe_status cgen_emit_c(cg_prog *p, FILE *o)
{
	emc c = {p, o};
	char fn[200];
	cgen_symbol(p, NULL, fn, sizeof fn);
	fprintf(o, "/* Generated by moec %s from layer '", moe_version_string());
	ctext(o, p->g->name);
	fputs("'. Portable C11; see docs/abi.md. */\n", o);
	fputs(prelude, o);
	fprintf(o, "\n/* ---- layer %s ---- */\n", p->cname);
	table(&c, "_inputs", p->ninputs, p->inputs, false);
	table(&c, "_weights", p->nweights, p->weights, false);
	table(&c, "_outputs", p->noutputs, NULL, true);
	fprintf(o, "size_t %s_workspace_size(void)\n{\n\treturn %lld;\n}\n\n", fn, (long long)p->workspace);
	fprintf(o, "int %s(const void *const *inputs, const void *const *weights, void *const *outputs, void *workspace)\n{\n",
		fn);
	fprintf(o, "\t(void)inputs;\n\t(void)weights;\n\t(void)outputs;\n\t(void)workspace;\n");
	for (uint32_t i = 0; i < p->nbufs; i++) {
		const cg_buf *b = &p->bufs[i];
		const char *t = mtype((moe_dtype)b->dtype);
		switch ((cg_bk)b->kind) {
		case CB_INPUT: fprintf(o, "\tconst %s *b%u = (const %s *)inputs[%u];\n", t, i, t, b->index); break;
		case CB_WEIGHT: fprintf(o, "\tconst %s *b%u = (const %s *)weights[%u];\n", t, i, t, b->index); break;
		case CB_OUTPUT: fprintf(o, "\t%s *b%u = (%s *)outputs[%u];\n", t, i, t, b->index); break;
		case CB_WORK:
			fprintf(o, "\t%s *b%u = (%s *)((char *)workspace + %lld);\n", t, i, t, (long long)b->offset);
			break;
		}
		fprintf(o, "\t(void)b%u;\n", i);
	}
	for (uint32_t i = 0; i < p->nvars; i++)
		fprintf(o, "\t%s v%u = 0;\n", ctype((cg_ty)p->vars[i].ty), i);
	for (uint32_t i = 0; i < p->nvars; i++)
		fprintf(o, "\t(void)v%u;\n", i);
	block(&c, &p->body, 1);
	fprintf(o, "\treturn 0;\n}\n");
	return ferror(o) ? MOE_ERR_IO : MOE_OK;
}
