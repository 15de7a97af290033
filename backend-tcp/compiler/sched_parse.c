/* backend-tcp/compiler/sched_parse.c: the schedule's text form read back
 * (docs/tcp-compiler.md 4.2). Hand-written, line by line; every error is
 * `file:line:col: error:` and stops the read. Hostile input: the text, the
 * objects of each kind, the dependencies, the bounds and the nesting are
 * capped; names follow the .moeir reader's rule (ir_name_problem); quoted
 * strings reject NUL. The schedule read is then verified (sched_verify.c). */
#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/sched.h"
#include "backend-tcp/isa/text.h"
#include "ir/serial.h"

enum { PS_MAX_DEPTH = 64, PS_MAX_QUOTED = 4096 };
enum { FIX_SC_B, FIX_LOOP_NB, FIX_LOOP_G, FIX_LOOP_EXPERT, FIX_LOOP_ROWS };

typedef struct fixup {
	uint8_t kind;
	uint32_t idx;       /* scalar or loop index */
	const char *name;   /* arena copy */
	int line, col;
} fixup;

typedef struct frame {
	ts_id rg;
	uint8_t mode;       /* 0: items; 1: classes (cases); 2: loop (parts) */
	uint32_t parts;
	int loop;
} frame;

typedef struct ps {
	moe_ctx *ctx;
	tcp_sched *s;
	const char *file;
	const char *line;   /* the current line (NUL-terminated copy) */
	int ln;
	bool bad;
	frame st[PS_MAX_DEPTH + 1];
	int depth;
	uint32_t *given;    /* op ids as written, by reading order */
	uint32_t ngiven, cgiven;
	fixup *fix;
	uint32_t nfix, cfix;
	int *lines[4];      /* buf, op, sc, rg lines while reading */
	uint32_t lcap[4];
} ps;

static void perr(ps *p, const char *at, const char *fmt, ...) MOE_PRINTF(3, 4);
static void perr(ps *p, const char *at, const char *fmt, ...)
{
	if (p->bad)
		return;
	char msg[400];
	va_list v;
	va_start(v, fmt);
	vsnprintf(msg, sizeof msg, fmt, v);
	va_end(v);
	int col = at && p->line ? (int)(at - p->line) + 1 : 1;
	moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_at(p->ctx, p->file, p->ln, col), "%s", msg);
	p->bad = true;
}

/* ---- lexing: each helper advances *s on success only ---- */
static void ws(const char **s)
{
	while (**s == ' ' || **s == '\t')
		(*s)++;
}

static bool pint(const char **s, int64_t *v)
{
	/* a digit or a signed digit first: no leading blanks, unlike strtoll */
	if (!isdigit((unsigned char)**s) && !((**s == '-' || **s == '+') && isdigit((unsigned char)(*s)[1])))
		return false;
	return tcp_pint(s, v);
}

static bool prange(const char **s, int64_t *v, int64_t lo, int64_t hi)
{
	const char *t = *s;
	if (!pint(&t, v) || *v < lo || *v > hi)
		return false;
	*s = t;
	return true;
}

static bool pu64(const char **s, uint64_t *v)
{
	if (!isdigit((unsigned char)**s))
		return false;
	char *e;
	errno = 0;
	unsigned long long x = strtoull(*s, &e, 0);
	if (e == *s || errno)
		return false;
	*v = x;
	*s = e;
	return true;
}

static bool word_char(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '.';
}

/* A keyword (letters, digits, '_', '.') into w (cap n); false when empty or too long. */
static bool pword(const char **s, char *w, size_t n)
{
	size_t k = 0;
	while (word_char((*s)[k]))
		k++;
	if (!k || k >= n)
		return false;
	memcpy(w, *s, k);
	w[k] = 0;
	*s += k;
	return true;
}

static int lookup(const char *const *names, int n, const char *w)
{
	for (int i = 0; i < n; i++)
		if (names[i] && !strcmp(names[i], w))
			return i;
	return -1;
}

/* "..." with \" \\ \xHH escapes (no NUL), at most PS_MAX_QUOTED bytes, into buf. */
static bool pquoted(ps *p, const char **sp, char *buf, size_t cap, const char *what)
{
	const char *s = *sp;
	if (*s++ != '"') {
		perr(p, *sp, "expected a quoted %s", what);
		return false;
	}
	size_t nl = 0;
	while (*s && *s != '"') {
		if (nl + 1 >= cap) {
			perr(p, *sp, "%s longer than %zu bytes", what, cap - 1);
			return false;
		}
		if (*s == '\\') {
			s++;
			unsigned x = 0;
			if (*s == 'x') {
				if (!isxdigit((unsigned char)s[1]) || !isxdigit((unsigned char)s[2]) || sscanf(s + 1, "%2x", &x) != 1 ||
					!x) {
					perr(p, s - 1, "bad escape in %s (\\xHH, not \\x00)", what);
					return false;
				}
				buf[nl++] = (char)x;
				s += 3;
				continue;
			}
			if (*s != '"' && *s != '\\') {
				perr(p, s - 1, "bad escape in %s", what);
				return false;
			}
		}
		buf[nl++] = *s++;
	}
	if (*s != '"') {
		perr(p, *sp, "unterminated %s", what);
		return false;
	}
	buf[nl] = 0;
	*sp = s + 1;
	return true;
}

/* $name of an existing scalar, or (fix >= 0) one defined later, recorded
 * for the end of the read. */
static bool pscalar_ref(ps *p, const char **s, ts_id *out, int fix, uint32_t idx)
{
	const char *at = *s;
	if (!tcp_lit(s, "$")) {
		perr(p, at, "expected a scalar ($name)");
		return false;
	}
	size_t k = 0;
	while (word_char((*s)[k]) || (*s)[k] == '+' || (*s)[k] == '-')
		k++;
	char name[IR_NAME_MAX + 2];
	if (k > IR_NAME_MAX) {
		perr(p, at, "scalar name longer than %d bytes", IR_NAME_MAX);
		return false;
	}
	memcpy(name, *s, k);
	name[k] = 0;
	*s += k;
	*out = ts_find_scalar(p->s, name);
	if (*out != TS_NONE)
		return true;
	if (fix < 0) {
		perr(p, at, "use of undefined scalar '$%s'", name);
		return false;
	}
	if (p->nfix >= TS_MAX_OBJECTS) {
		perr(p, at, "too many forward references");
		return false;
	}
	ctx_grow(p->ctx, (void **)&p->fix, &p->cfix, p->nfix + 1, sizeof *p->fix);
	p->fix[p->nfix++] = (fixup){(uint8_t)fix, idx, ir_strdup(&p->s->arena, name), p->ln, (int)(at - p->line) + 1};
	return true;
}

static int plist(const char **s, int64_t *out, int max)
{
	if (!tcp_lit(s, "["))
		return -1;
	int n = 0;
	ws(s);
	while (**s != ']') {
		if (n && !tcp_lit(s, ","))
			return -1;
		ws(s);
		if (n >= max || !pint(s, &out[n]))
			return -1;
		ws(s);
		n++;
	}
	(*s)++;
	return n;
}

/* Record the line an object was read from. */
static void note_line(ps *p, int which, uint32_t id)
{
	ctx_grow(p->ctx, (void **)&p->lines[which], &p->lcap[which], id + 1, sizeof(int));
	p->lines[which][id] = p->ln;
}

static bool under_cap(ps *p, uint32_t n, const char *what)
{
	if (n < TS_MAX_OBJECTS)
		return true;
	perr(p, p->line, "more than %u %s", TS_MAX_OBJECTS, what);
	return false;
}

/* ---- header lines ---- */
static void parse_meta(ps *p, const char *s)
{
	static const char *const k[12] = {" T=", " K=", " D=", " F=", " E=", " B=", " G=", " nproj=", " router_e=", " wexp=",
		" act=", " rmacs="};
	ts_meta *m = &p->s->meta;
	int64_t *f[12] = {&m->T, &m->K, &m->D, &m->F, &m->E, &m->B, &m->G, &m->nproj, &m->router_E, &m->wexp, &m->act,
		&m->rmacs};
	for (int i = 0; i < 12; i++)
		if (!tcp_lit(&s, k[i]) || !prange(&s, f[i], 0, INT64_MAX))
			return perr(p, s, "malformed meta line at '%s' (a count >= 0)", k[i] + 1);
	char w[16] = "";
	const char *at = s;
	int d;
	if (!tcp_lit(&s, " dtype=") || !pword(&s, w, sizeof w) || (d = moe_dtype_from_name(w)) < 0)
		return perr(p, at, "malformed meta line at 'dtype' (a dtype name)");
	m->dtype = (uint8_t)d;
	if (*s)
		perr(p, s, "unexpected text after the meta line");
}

static void parse_features(ps *p, const char *s)
{
	if (!tcp_lit(&s, " granted=") || !pu64(&s, &p->s->granted) || !tcp_lit(&s, " refused=") || !pu64(&s, &p->s->refused) ||
		*s)
		perr(p, s, "malformed features line (features granted=BITS refused=BITS)");
}

/* rewrites NAME,NAME,...: the rows of rewrites.def that ran */
static void parse_rewrites(ps *p, const char *s)
{
	do {
		size_t n = strcspn(s, ",");
		int k = ts_rewrite_find(s, n);
		if (k < 0)
			return perr(p, s, "unknown rewrite '%.*s' in the rewrites line", (int)(n < 64 ? n : 64), s);
		if (p->s->ran >> k & 1)
			return perr(p, s, "rewrite '%s' named twice in the rewrites line", ts_rewrites[k].name);
		p->s->ran |= 1ull << k;
		s += n;
	} while (*s++ == ',');
}

static void parse_machine(ps *p, const char *s)
{
	char name[96];
	if (!tcp_lit(&s, " ")) {
		perr(p, s, "expected the machine's quoted name");
		return;
	}
	if (!pquoted(p, &s, name, sizeof name, "machine name"))
		return;
	if (*s)
		return perr(p, s, "unexpected text after the machine name");
	if (p->s->m && strcmp(name, p->s->m->name))
		return perr(p, p->line, "schedule made for machine \"%s\", compiling for \"%s\"", name, p->s->m->name);
	p->s->machine_name = ir_strdup(&p->s->arena, name);
}

/* ---- buffers ---- */
static bool buf_field(ps *p, ts_buf *u, const char **sp)
{
	const char *s = *sp, *at = s;
	int64_t v, w4[4];
	char w[16] = "";
	if (tcp_lit(&s, "src=")) {
		char src[PS_MAX_QUOTED + 1];
		if (!pquoted(p, &s, src, sizeof src, "buffer source"))
			return false;
		u->source = ir_strdup(&p->s->arena, src);
	} else if (tcp_lit(&s, "slots=")) {
		if (!prange(&s, &v, 1, 8) || !ts_slots_ok((unsigned)v))
			return perr(p, at, "slots must be 1, 2, 4 or 8"), false;
		u->slots = (uint8_t)v;
	} else if (tcp_lit(&s, "life=@")) {
		int64_t a, b;
		if (!prange(&s, &a, 0, TS_MAX_OBJECTS) || !tcp_lit(&s, "..@") || !prange(&s, &b, 0, TS_MAX_OBJECTS))
			return perr(p, at, "malformed span lifetime (life=@FIRST..@LAST)"), false;
		u->life = TS_LIFE_SPAN;
		u->first = (ts_id)a;
		u->last = (ts_id)b;
	} else if (tcp_lit(&s, "life=")) {
		int k = pword(&s, w, sizeof w) ? lookup(ts_life_names, TS_NLIFE, w) : -1;
		if (k < 0 || k == TS_LIFE_SPAN)
			return perr(p, at, "unknown lifetime (program, loop, block or @FIRST..@LAST)"), false;
		u->life = (uint8_t)k;
	} else if (tcp_lit(&s, "layout=")) {
		int k = pword(&s, w, sizeof w) ? lookup(ts_split_names, TS_NSPLIT, w) : -1;
		if (k < 0 || !tcp_lit(&s, "(") || !prange(&s, &w4[0], 0, UINT16_MAX) || !tcp_lit(&s, ",") ||
			!prange(&s, &w4[1], 0, UINT16_MAX) || !tcp_lit(&s, ",") || !prange(&s, &w4[2], 0, UINT16_MAX) ||
			!tcp_lit(&s, ",") || !prange(&s, &w4[3], 0, INT64_MAX) || !tcp_lit(&s, ")"))
			return perr(p, at, "malformed layout (layout=flit|rows|cols(SLICE0,NSLICES,COPIES,SLICE_BYTES))"), false;
		u->layout = (ts_layout){(uint16_t)w4[0], (uint16_t)w4[1], (uint16_t)w4[2], (uint8_t)k, w4[3]};
	} else if (tcp_lit(&s, "feature=")) {
		if (!prange(&s, &v, 1, UINT16_MAX))
			return perr(p, at, "feature must be 1..65535"), false;
		u->feature = (uint16_t)v;
	} else if (tcp_lit(&s, "node=")) {
		if (!prange(&s, &v, 0, (int64_t)MOE_NONE - 1))
			return perr(p, at, "bad node id"), false;
		u->node = (moe_id)v;
	} else if (tcp_lit(&s, "at=")) {
		if (!prange(&s, &v, 0, INT64_MAX))
			return perr(p, at, "a placed offset is >= 0"), false;
		u->offset = v;
	} else {
		return perr(p, at, "unknown buffer field"), false;
	}
	*sp = s;
	return true;
}

static void parse_buf(ps *p, const char *s)
{
	int64_t id, shape[MOE_MAX_RANK];
	const char *at = s;
	if (!tcp_lit(&s, "%") || !pint(&s, &id) || id != p->s->nbuf)
		return perr(p, at, "buffers are numbered in order: expected %%%u", p->s->nbuf);
	if (!under_cap(p, p->s->nbuf, "buffers"))
		return;
	char name[IR_NAME_MAX + 2], sp[16], kd[16], dt[16];
	if (!tcp_lit(&s, " ") || !pquoted(p, &s, name, sizeof name, "buffer name"))
		return;
	const char *why = ir_name_problem(IR_NAME_VALUE, name);
	if (why)
		return perr(p, at, "buffer name '%s' %s", name, why);
	at = s + 1;
	if (!tcp_lit(&s, " ") || !pword(&s, sp, sizeof sp) || !tcp_lit(&s, " ") || !pword(&s, kd, sizeof kd) ||
		!tcp_lit(&s, " ") || !pword(&s, dt, sizeof dt))
		return perr(p, at, "expected SPACE KIND DTYPE[SHAPE]");
	int space = lookup(ts_space_names, TCP_NSPACE, sp), kind = lookup(tcp_kind_names, TCP_NKIND, kd),
	    d = moe_dtype_from_name(dt);
	if (space < 0 || kind < 0 || d < 0)
		return perr(p, at, "unknown %s '%s'", space < 0 ? "space" : kind < 0 ? "buffer kind" : "dtype",
			space < 0 ? sp : kind < 0 ? kd : dt);
	const char *sh = s;
	int rank = plist(&s, shape, MOE_MAX_RANK);
	if (rank < 0 || (rank == 0 && (space != TCP_HBM || kind != TCP_T_INPUT)))
		return perr(p, sh, "bad shape (1 to %d sizes in [], none for a scalar HBM input)", MOE_MAX_RANK);
	for (int k = 0; k < rank; k++)
		if (shape[k] < 1 || shape[k] > ((int64_t)1 << 40))
			return perr(p, sh, "shape size %d outside [1, 2^40]", k);
	ts_id b = ts_add_buf(p->s, name, space, kind, (moe_dtype)d, rank, shape);
	note_line(p, 0, b);
	while (*s && !p->bad) {
		if (!tcp_lit(&s, " "))
			return perr(p, s, "expected a space before the next field");
		if (!buf_field(p, &p->s->buf[b], &s))
			return;
	}
}

/* ---- scalars ---- */
/* The operand after "a, ": a scalar or an integer immediate. */
static bool pscalar_or_imm(ps *p, const char **s, ts_id *b, int64_t *imm)
{
	*b = TS_NONE;
	if (**s == '$')
		return pscalar_ref(p, s, b, -1, 0);
	if (!pint(s, imm))
		return perr(p, *s, "expected a scalar or an integer"), false;
	return true;
}

static void parse_scalar(ps *p, ts_id rg, const char *s)
{
	const char *at = s;
	size_t k = 0;
	s++; /* '$' */
	while (word_char(s[k]) || s[k] == '+' || s[k] == '-')
		k++;
	char name[IR_NAME_MAX + 2];
	if (k > IR_NAME_MAX)
		return perr(p, at, "scalar name longer than %d bytes", IR_NAME_MAX);
	memcpy(name, s, k);
	name[k] = 0;
	s += k;
	const char *why = ir_name_problem(IR_NAME_VALUE, name);
	if (why)
		return perr(p, at, "scalar name '%s' %s", name, why);
	if (ts_find_scalar(p->s, name) != TS_NONE)
		return perr(p, at, "scalar '$%s' defined twice", name);
	if (!under_cap(p, p->s->nsc, "scalars"))
		return;
	if (!tcp_lit(&s, " = "))
		return perr(p, s, "expected ' = ' after the scalar's name");
	char w[16] = "";
	const char *op = s;
	if (!pword(&s, w, sizeof w))
		return perr(p, op, "expected const, ld, alu.OP, cmp.COND, loopvar or loopidx");
	ts_id a = TS_NONE, b = TS_NONE, buf = TS_NONE;
	int64_t imm = 0, v;
	int kind, sop = 0;
	if (!strcmp(w, "const") || !strcmp(w, "loopidx")) {
		kind = w[0] == 'c' ? TS_SC_CONST : TS_SC_LOOPIDX;
		if (!tcp_lit(&s, " ") || !pint(&s, &imm) || (kind == TS_SC_LOOPIDX && (imm < 0 || imm > 1)))
			return perr(p, s, kind == TS_SC_CONST ? "expected an integer" : "expected the loop's index (0 or 1)");
	} else if (!strcmp(w, "ld")) {
		kind = TS_SC_SPM_LD;
		if (!tcp_lit(&s, " %") || !prange(&s, &v, 0, TS_MAX_OBJECTS) || !tcp_lit(&s, "["))
			return perr(p, s, "expected ld %%BUF[INDEX]");
		buf = (ts_id)v;
		if (!pscalar_or_imm(p, &s, &a, &imm))
			return;
		if (!tcp_lit(&s, "]"))
			return perr(p, s, "expected ']'");
	} else if (!strncmp(w, "alu.", 4) || !strncmp(w, "cmp.", 4)) {
		kind = w[0] == 'a' ? TS_SC_ALU : TS_SC_CMP;
		sop = kind == TS_SC_ALU ? lookup(tcp_sop_names, TCP_S_COUNT, w + 4)
					: lookup(tcp_cond_names, TCP_C_COUNT, w + 4);
		if (sop < 0)
			return perr(p, op, "unknown %s '%s'", kind == TS_SC_ALU ? "ALU operation" : "condition", w);
		if (!tcp_lit(&s, " ") || !pscalar_ref(p, &s, &a, -1, 0))
			return;
		if (!tcp_lit(&s, ", "))
			return perr(p, s, "expected ', '");
		if (!pscalar_or_imm(p, &s, &b, &imm))
			return;
	} else if (!strcmp(w, "loopvar")) {
		kind = TS_SC_LOOPVAR;
		if (!tcp_lit(&s, " ") || !pscalar_ref(p, &s, &a, -1, 0))
			return;
		if (!tcp_lit(&s, ", "))
			return perr(p, s, "expected ', '");
		if (!pscalar_ref(p, &s, &b, FIX_SC_B, p->s->nsc))
			return;
	} else {
		return perr(p, op, "unknown scalar kind '%s'", w);
	}
	if (*s)
		return perr(p, s, "unexpected text after the scalar");
	ts_id id = ts_add_scalar(p->s, rg, name, kind, sop, a, b, imm);
	p->s->sc[id].buf = buf;
	note_line(p, 2, id);
}

/* ---- ops ---- */
static const char *const flag_names[9] = {"bf16x3", "acc", "xslice", "join", "e2m1", "i4", "scaled", "vrows", NULL};

/* %BUF+BASE[+$s*SCALE]:[STRIDES] */
static bool pview(ps *p, const char **s, tcp_view *v)
{
	int64_t t;
	*v = tcp_view_none();
	const char *at = *s;
	if (!tcp_lit(s, "%") || !prange(s, &t, 0, TS_MAX_OBJECTS) || !pint(s, &v->base))
		return perr(p, at, "malformed view (%%BUF+BASE[+$SCALAR*SCALE]:[STRIDES])"), false;
	v->t = (int32_t)t;
	if (tcp_lit(s, "+$")) {
		ts_id r;
		(*s)--;
		if (!pscalar_ref(p, s, &r, -1, 0))
			return false;
		if (!tcp_lit(s, "*") || !pint(s, &v->scale))
			return perr(p, *s, "expected *SCALE after the view's scalar"), false;
		v->reg = (int32_t)r;
	}
	if (!tcp_lit(s, ":") || plist(s, v->stride, TCP_MAXD) < 0)
		return perr(p, at, "malformed view strides (at most %d)", TCP_MAXD), false;
	return true;
}

static bool pchain(ps *p, const char **s, tcp_insn *in)
{
	const char *at = *s;
	if (!tcp_lit(s, "["))
		return perr(p, at, "expected chain=[...]"), false;
	while (**s != ']') {
		at = *s;
		if ((in->nstep && !tcp_lit(s, ",")) || in->nstep >= TCP_MAXSTEP)
			return perr(p, at, "malformed chain (at most %d steps)", TCP_MAXSTEP), false;
		tcp_step *st = &in->step[in->nstep++];
		char w[16], x[8], y[8];
		int64_t imm, ctr, fl;
		int op = pword(s, w, sizeof w) ? lookup(tcp_vop_names, TCP_V_COUNT, w) : -1, xs = -1, ys = -1;
		if (op >= 0 && tcp_lit(s, "(") && pword(s, x, sizeof x) && tcp_lit(s, ","))
			xs = lookup(tcp_src_names, TCP_SRC_NONE + 1, x);
		if (xs >= 0 && pword(s, y, sizeof y) && tcp_lit(s, ","))
			ys = lookup(tcp_src_names, TCP_SRC_NONE + 1, y);
		if (ys < 0 || !tcp_lit(s, "#") || !prange(s, &imm, 0, 0xffffffffLL) || !tcp_lit(s, ",c") ||
			!prange(s, &ctr, 0, 255) || !tcp_lit(s, ",") || !prange(s, &fl, 0, 255) || !tcp_lit(s, ")"))
			return perr(p, at, "malformed chain step (OP(X,Y,#IMM,cCTR,FLAGS))"), false;
		*st = (tcp_step){(uint8_t)op, (uint8_t)xs, (uint8_t)ys, (uint8_t)ctr, (uint8_t)fl, (uint32_t)imm};
	}
	(*s)++;
	return true;
}

static bool pflags(ps *p, const char **s, uint8_t *flags)
{
	const char *at = *s;
	do {
		char w[16];
		int k = pword(s, w, sizeof w) ? lookup(flag_names, 8, w) : -1;
		if (k < 0)
			return perr(p, at, "unknown flag"), false;
		*flags |= (uint8_t)(1u << k);
	} while (tcp_lit(s, ","));
	return true;
}

static bool pdeps(ps *p, const char **s, ts_id op)
{
	const char *at = *s;
	if (!tcp_lit(s, "["))
		return perr(p, at, "expected deps=[@OP,...]"), false;
	while (**s != ']') {
		int64_t v;
		at = *s;
		if ((p->s->op[op].ndep && !tcp_lit(s, ",")) || !tcp_lit(s, "@") || !prange(s, &v, 0, TS_MAX_OBJECTS - 1))
			return perr(p, at, "malformed dependency (@OP or @OP^1)"), false;
		if (p->s->op[op].ndep >= TS_MAX_DEPS)
			return perr(p, at, "more than %d dependencies", TS_MAX_DEPS), false;
		ts_add_dep(p->s, op, (ts_id)v, tcp_lit(s, "^1") ? 1 : 0);
	}
	(*s)++;
	return true;
}

/* One key=value of an op into o (op id oid). */
static bool op_field(ps *p, ts_op *o, ts_id oid, const char **s)
{
	const char *at = *s;
	int64_t v;
	tcp_insn *in = &o->in;
	if (tcp_lit(s, "feature=")) {
		if (!prange(s, &v, 1, UINT16_MAX))
			return perr(p, at, "feature must be 1..65535"), false;
		o->feature = (uint16_t)v;
	} else if (tcp_lit(s, "node=")) {
		if (!prange(s, &v, 0, (int64_t)MOE_NONE - 1))
			return perr(p, at, "bad node id"), false;
		o->node = (moe_id)v;
	} else if (tcp_lit(s, "cost=")) {
		if (!prange(s, &o->cost, 0, INT64_MAX))
			return perr(p, at, "a cost is >= 0"), false;
	} else if (tcp_lit(s, "dims=")) {
		int n = plist(s, in->dim, TCP_MAXD);
		if (n < 1)
			return perr(p, at, "malformed dims (1 to %d sizes)", TCP_MAXD), false;
		in->ndim = (uint8_t)n;
	} else if (tcp_lit(s, "flags=")) {
		return pflags(p, s, &in->flags);
	} else if (tcp_lit(s, "valid=")) {
		ts_id r;
		if (!pscalar_ref(p, s, &r, -1, 0))
			return false;
		in->vreg = (int32_t)r;
	} else if (tcp_lit(s, "imm=")) {
		if (!pint(s, &in->imm))
			return perr(p, at, "malformed imm"), false;
	} else if (tcp_lit(s, "tile=") || tcp_lit(s, "rows=")) {
		if (!prange(s, at[0] == 't' ? &in->tile : &in->rows, 1, INT64_MAX))
			return perr(p, at, "%s must be >= 1", at[0] == 't' ? "tile" : "rows"), false;
	} else if (tcp_lit(s, "dst=") || tcp_lit(s, "s0=") || tcp_lit(s, "s1=") || tcp_lit(s, "s2=")) {
		int w = at[0] == 'd' ? TCP_V_DST : at[1] - '0' + 1;
		if (in->v[w].t >= 0)
			return perr(p, at, "view given twice"), false;
		return pview(p, s, &in->v[w]);
	} else if (tcp_lit(s, "chain=")) {
		return pchain(p, s, in);
	} else if (tcp_lit(s, "deps=")) {
		return pdeps(p, s, oid);
	} else {
		return perr(p, at, "unknown op field"), false;
	}
	return true;
}

static void parse_op(ps *p, ts_id rg, const char *s)
{
	int64_t id;
	const char *at = s;
	if (!tcp_lit(&s, "@") || !prange(&s, &id, 0, TS_MAX_OBJECTS - 1) || !tcp_lit(&s, " "))
		return perr(p, at, "expected op @ID OPCODE");
	if (!under_cap(p, p->s->nop, "ops"))
		return;
	char w[16] = "";
	at = s;
	int opc = pword(&s, w, sizeof w) ? lookup(tcp_op_names, TCP_OP_COUNT, w) : -1;
	if (opc < 0 || tcp_op_ctx[opc] == TCP_CTX_CTL)
		return perr(p, at, "'%.*s' is not a command (dma.*, sub.*, tu.*): control is scalars and regions",
			(int)strcspn(at, " "), at);
	at = s;
	int ph = tcp_lit(&s, " ph=") && pword(&s, w, sizeof w) ? lookup(ts_phase_names, TS_NPHASE, w) : -1;
	if (ph < 0)
		return perr(p, at, "expected ph=routing|expert|prefetch|combine");
	tcp_insn in = tcp_insn_init((tcp_opcode)opc);
	ts_id o = ts_add_op(p->s, rg, &in, ph);
	note_line(p, 1, o);
	ctx_grow(p->ctx, (void **)&p->given, &p->cgiven, p->ngiven + 1, sizeof *p->given);
	p->given[p->ngiven++] = (uint32_t)id;
	while (*s && !p->bad) {
		if (!tcp_lit(&s, " "))
			return perr(p, s, "expected a space before the next field");
		if (!op_field(p, &p->s->op[o], o, &s))
			return;
		if (*s && *s != ' ')
			return perr(p, s, "unexpected text after the field");
	}
}

/* ---- regions ---- */
static void push(ps *p, ts_id rg, int mode, int loop)
{
	if (p->depth >= PS_MAX_DEPTH)
		return perr(p, p->line, "regions nested deeper than %d", PS_MAX_DEPTH);
	p->st[++p->depth] = (frame){rg, (uint8_t)mode, 0, loop};
}

static void new_region(ps *p, ts_id parent, int kind, ts_id pred, int mode)
{
	if (!under_cap(p, p->s->nrg, "regions"))
		return;
	ts_id r = ts_add_region(p->s, parent, kind, pred);
	note_line(p, 3, r);
	push(p, r, mode, -1);
}

static void parse_classes(ps *p, ts_id parent, const char *s)
{
	ts_id pred;
	if (!pscalar_ref(p, &s, &pred, -1, 0))
		return;
	int64_t *b = ctx_alloc(p->ctx, TS_MAX_BOUNDS * sizeof *b);
	const char *at = s + 1;
	int n = tcp_lit(&s, " ") ? plist(&s, b, TS_MAX_BOUNDS) : -1;
	if (n < 1 || !tcp_lit(&s, " {") || *s) {
		ctx_free(p->ctx, b, 0);
		return perr(p, at, "expected classes $SCALAR [BOUND, ...] { (1 to %d bounds)", TS_MAX_BOUNDS);
	}
	new_region(p, parent, TS_RG_CLASSES, pred, 1);
	if (!p->bad)
		ts_region_bounds(p->s, p->st[p->depth].rg, b, (uint32_t)n);
	ctx_free(p->ctx, b, 0);
}

static bool loop_field(ps *p, ts_loop *l, int li, const char **s)
{
	const char *at = *s;
	int64_t v;
	char w[16] = "";
	if (tcp_lit(s, "expert="))
		return pscalar_ref(p, s, &l->expert, FIX_LOOP_EXPERT, (uint32_t)li);
	if (tcp_lit(s, "rows="))
		return pscalar_ref(p, s, &l->rows, FIX_LOOP_ROWS, (uint32_t)li);
	if (tcp_lit(s, "weights=")) {
		int k = pword(s, w, sizeof w) ? lookup(ts_weights_names, TS_NWEIGHTS, w) : -1;
		if (k < 0)
			return perr(p, at, "weights must be double, single or stream"), false;
		l->weights = (uint8_t)k;
		return true;
	}
	uint8_t *f = tcp_lit(s, "prefetch=") ? &l->prefetch
		     : tcp_lit(s, "ring=")   ? &l->ring
		     : tcp_lit(s, "row_slots=") ? &l->row_slots
					    : NULL;
	if (!f)
		return perr(p, at, "unknown loop field"), false;
	if (!prange(s, &v, 0, 255))
		return perr(p, at, "a loop count is 0..255"), false;
	*f = (uint8_t)v;
	return true;
}

static void parse_loop(ps *p, ts_id parent, const char *s)
{
	int64_t li, G;
	const char *at = s;
	if (!prange(&s, &li, 0, 1) || li != p->s->nloop)
		return perr(p, at, "loops are numbered in order from 0 (at most 2): expected loop %d", p->s->nloop);
	at = s;
	if (!tcp_lit(&s, " grid=") || !prange(&s, &G, 1, (int64_t)1 << 40) || !tcp_lit(&s, " nb="))
		return perr(p, at, "expected grid=G (>= 1) nb=$SCALAR g=$SCALAR");
	if (p->s->nrg + 4 >= TS_MAX_OBJECTS)
		return perr(p, at, "more than %u regions", TS_MAX_OBJECTS);
	int l = ts_add_loop(p->s, parent, G, TS_NONE, TS_NONE);
	ts_loop *lp = &p->s->loop[l];
	note_line(p, 3, lp->region);
	note_line(p, 3, lp->prologue);
	note_line(p, 3, lp->body);
	note_line(p, 3, lp->epilogue);
	if (!pscalar_ref(p, &s, &lp->nb, FIX_LOOP_NB, (uint32_t)l))
		return;
	if (!tcp_lit(&s, " g="))
		return perr(p, s, "expected g=$SCALAR");
	if (!pscalar_ref(p, &s, &lp->g, FIX_LOOP_G, (uint32_t)l))
		return;
	while (!p->bad && !tcp_lit(&s, " {")) {
		if (!tcp_lit(&s, " "))
			return perr(p, s, "expected a loop field or ' {'");
		if (!loop_field(p, lp, l, &s))
			return;
	}
	if (*s)
		return perr(p, s, "unexpected text after '{'");
	push(p, lp->region, 2, l);
}

/* A line that opens a part of the enclosing classes or loop region. */
static void parse_part(ps *p, const char *s)
{
	frame *f = &p->st[p->depth];
	if (f->mode == 1) {
		const ts_region *r = &p->s->rg[f->rg];
		int64_t b;
		const char *at = s;
		if (!tcp_lit(&s, "case ") || !pint(&s, &b) || !tcp_lit(&s, " {") || *s)
			return perr(p, at, "expected 'case BOUND {' inside classes");
		if (f->parts >= r->nbound || r->bound[f->parts] != b)
			return perr(p, at, "case %lld: the cases follow the classes' bounds in order", (long long)b);
		f->parts++;
		return new_region(p, f->rg, TS_RG_SEQ, TS_NONE, 0);
	}
	static const char *const parts[3] = {"prologue {", "body {", "epilogue {"};
	if (f->parts >= 3 || strcmp(s, parts[f->parts]))
		return perr(p, s, "expected '%s' inside the loop", f->parts < 3 ? parts[f->parts] : "}");
	const ts_loop *l = &p->s->loop[f->loop];
	ts_id r = f->parts == 0 ? l->prologue : f->parts == 1 ? l->body : l->epilogue;
	f->parts++;
	push(p, r, 0, -1);
}

static void close_region(ps *p)
{
	frame *f = &p->st[p->depth];
	if (p->depth == 0)
		return perr(p, p->line, "'}' closes no region");
	if (f->mode == 1 && f->parts != p->s->rg[f->rg].nbound)
		return perr(p, p->line, "classes: %u case(s) for %u bound(s)", f->parts, p->s->rg[f->rg].nbound);
	if (f->mode == 2 && f->parts != 3)
		return perr(p, p->line, "a loop has a prologue, a body and an epilogue");
	p->depth--;
}

/* One line of the body (after the header lines): s is trimmed. */
static void parse_item(ps *p, const char *s)
{
	frame *f = &p->st[p->depth];
	if (!strcmp(s, "}"))
		return close_region(p);
	if (f->mode)
		return parse_part(p, s);
	if (*s == '$')
		return parse_scalar(p, f->rg, s);
	if (tcp_lit(&s, "op "))
		return parse_op(p, f->rg, s);
	if (tcp_lit(&s, "buf "))
		return perr(p, s - 4, "buffers come before the first op, scalar or region");
	if (!strcmp(s, "seq {") || !strcmp(s, "tier {"))
		return new_region(p, f->rg, s[0] == 's' ? TS_RG_SEQ : TS_RG_TIER, TS_NONE, 0);
	if (tcp_lit(&s, "guard ")) {
		ts_id pred;
		if (!pscalar_ref(p, &s, &pred, -1, 0))
			return;
		if (!tcp_lit(&s, " {") || *s)
			return perr(p, s, "expected 'guard $SCALAR {'");
		return new_region(p, f->rg, TS_RG_GUARD, pred, 0);
	}
	if (tcp_lit(&s, "classes "))
		return parse_classes(p, f->rg, s);
	if (tcp_lit(&s, "loop "))
		return parse_loop(p, f->rg, s);
	perr(p, s, "unexpected line (op, $scalar, seq, guard, classes, tier, loop or '}')");
}

/* ---- the whole text ---- */
/* Header lines in order: tcpsched, machine, meta, features, [rewrites], [reuse], [prep], bufs. */
static void parse_header_line(ps *p, int *stage, const char *s)
{
	static const char *const want[4] = {"tcpsched 1", "machine", "meta", "features"};
	if (*stage < 4) {
		const char *t = s;
		if (!tcp_lit(&t, want[*stage]) || (*stage == 0 && *t))
			return perr(p, s, "expected the '%s' line", want[*stage]);
		switch ((*stage)++) {
		case 1: return parse_machine(p, t);
		case 2: return parse_meta(p, t);
		case 3: return parse_features(p, t);
		default: return;
		}
	}
	if (*stage == 6)
		return parse_item(p, s);
	if (tcp_lit(&s, "rewrites ")) {
		if (*stage != 4 || p->s->nbuf || p->s->ran || p->s->reuse)
			return perr(p, s - 9, "one rewrites line, after features and before prep and the buffers");
		return parse_rewrites(p, s);
	}
	if (tcp_lit(&s, "reuse ")) {
		if (*stage != 4 || p->s->nbuf || p->s->reuse || strcmp(s, "ordered"))
			return perr(p, s - 6, "one 'reuse ordered' line, after features and rewrites, before prep and the buffers");
		p->s->reuse = TS_REUSE_ORDERED;
		return;
	}
	if (tcp_lit(&s, "prep ")) {
		if (*stage != 4 || p->s->nbuf)
			return perr(p, s - 5, "one prep line, after features and before the buffers");
		for (const char *c = s; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				return perr(p, c, "control byte in the prep line");
		p->s->meta.prep = ir_strdup(&p->s->arena, s);
		*stage = 5;
		return;
	}
	if (tcp_lit(&s, "buf "))
		return parse_buf(p, s);
	*stage = 6;
	parse_item(p, s);
}

/* Ops are read in program order under the ids written: place each at its id. */
static void place_ops(ps *p)
{
	tcp_sched *s = p->s;
	uint32_t n = s->nop;
	uint32_t *seen = ctx_alloc(p->ctx, (n ? n : 1) * sizeof *seen);
	for (uint32_t i = 0; i < n && !p->bad; i++) {
		p->ln = p->lines[1][i];
		if (p->given[i] >= n)
			perr(p, p->line, "op @%u: ids are 0..%u, one per op", p->given[i], n - 1);
		else if (seen[p->given[i]]++)
			perr(p, p->line, "op @%u defined twice", p->given[i]);
	}
	ctx_free(p->ctx, seen, 0);
	if (p->bad)
		return;
	ts_op *ops = ir_alloc(&s->arena, (n ? n : 1) * sizeof *ops);
	int *ol = ir_alloc(&s->arena, (n ? n : 1) * sizeof *ol);
	for (uint32_t i = 0; i < n; i++) {
		ops[p->given[i]] = s->op[i];
		ol[p->given[i]] = p->lines[1][i];
	}
	s->op = ops;
	s->cop = n;
	s->op_line = ol;
	for (uint32_t r = 0; r < s->nrg; r++)
		for (uint32_t k = 0; k < s->rg[r].nitem; k++)
			if (TS_ITEM_KIND(s->rg[r].item[k]) == TS_ITEM_OP)
				s->rg[r].item[k] = TS_ITEM_OP | p->given[TS_ITEM_ID(s->rg[r].item[k])];
}

static void resolve_fixups(ps *p)
{
	for (uint32_t i = 0; i < p->nfix && !p->bad; i++) {
		const fixup *f = &p->fix[i];
		ts_id id = ts_find_scalar(p->s, f->name);
		if (id == TS_NONE) {
			p->ln = f->line;
			moe_diag(p->ctx, MOE_DIAG_ERROR, moe_loc_at(p->ctx, p->file, f->line, f->col), "use of undefined scalar '$%s'",
				f->name);
			p->bad = true;
			return;
		}
		ts_loop *l = f->kind == FIX_SC_B ? NULL : &p->s->loop[f->idx];
		switch (f->kind) {
		case FIX_SC_B: p->s->sc[f->idx].b = id; break;
		case FIX_LOOP_NB: l->nb = id; break;
		case FIX_LOOP_G: l->g = id; break;
		case FIX_LOOP_EXPERT: l->expert = id; break;
		default: l->rows = id; break;
		}
	}
}

/* Lines into the schedule's own arrays (sized to their objects). */
static void keep_lines(ps *p)
{
	tcp_sched *s = p->s;
	int **dst[3] = {&s->buf_line, &s->sc_line, &s->rg_line};
	const int which[3] = {0, 2, 3};
	const uint32_t n[3] = {s->nbuf, s->nsc, s->nrg};
	for (int k = 0; k < 3; k++) {
		*dst[k] = ir_alloc(&s->arena, (n[k] ? n[k] : 1) * sizeof(int));
		if (n[k])
			memcpy(*dst[k], p->lines[which[k]], n[k] * sizeof(int));
	}
	s->file = ir_strdup(&s->arena, p->file);
}

static void parse_lines(ps *p, const char *text, size_t len)
{
	size_t pos = 0, lcap = 0;
	char *line = NULL;
	int stage = 0;
	while (pos < len && !p->bad) {
		size_t e = pos;
		while (e < len && text[e] != '\n')
			e++;
		size_t n = e - pos;
		if (n + 1 > lcap) {
			line = ctx_realloc(p->ctx, line, lcap, n + 1);
			lcap = n + 1;
		}
		memcpy(line, text + pos, n);
		line[n] = 0;
		pos = e + 1;
		p->ln++;
		p->line = line;
		if (n && line[n - 1] == '\r')
			line[--n] = 0;
		const char *nul = memchr(line, 0, n);
		if (nul) {
			perr(p, nul, "NUL byte in the schedule text");
			break;
		}
		const char *s = line;
		ws(&s);
		if (!*s || *s == '#')
			continue;
		for (size_t k = strlen(s); k && (s[k - 1] == ' ' || s[k - 1] == '\t'); k--)
			line[s - line + (ptrdiff_t)k - 1] = 0;
		parse_header_line(p, &stage, s);
	}
	if (!p->bad && stage < 4)
		perr(p, NULL, "the schedule ends before its '%s' line",
			stage == 0 ? "tcpsched 1" : stage == 1 ? "machine" : stage == 2 ? "meta" : "features");
	if (!p->bad && p->depth > 0)
		perr(p, NULL, "the schedule ends inside a region (a '}' is missing)");
	p->line = NULL;
	ctx_free(p->ctx, line, lcap);
}

static tcp_sched *parse(moe_ctx *ctx, const moe_tcp_machine *m, const char *file, const char *text, size_t len)
{
	ps p = {.ctx = ctx, .file = file ? file : "<tsched>"};
	if (len > TS_MAX_TEXT_BYTES) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, p.file), "schedule text of %zu bytes (at most %zu)", len,
			TS_MAX_TEXT_BYTES);
		return NULL;
	}
	moe_ctx_add_source(ctx, p.file, text, len);
	p.s = tcp_sched_new(ctx, m);
	p.s->machine_name = "";
	note_line(&p, 3, p.s->top);
	parse_lines(&p, text, len);
	if (!p.bad)
		resolve_fixups(&p);
	if (!p.bad)
		place_ops(&p);
	if (!p.bad)
		keep_lines(&p);
	ctx_free(ctx, p.given, 0);
	ctx_free(ctx, p.fix, 0);
	for (int k = 0; k < 4; k++)
		ctx_free(ctx, p.lines[k], 0);
	if (p.bad || tcp_sched_verify(p.s) != MOE_OK) {
		tcp_sched_free(p.s);
		return NULL;
	}
	return p.s;
}

tcp_sched *tcp_sched_parse(moe_ctx *ctx, const moe_tcp_machine *m, const char *file, const char *text, size_t len)
{
	CTX_GUARDED(ctx, tcp_sched *, NULL, parse(ctx, m, file, text, len));
}
