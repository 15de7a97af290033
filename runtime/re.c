/* runtime/re.c: a Python `re` subset compiled to a Pike VM (rt_re.h).
 *
 * The pattern is parsed into a tree (nodes and class ranges in two growable
 * arrays, indices only), sized, and emitted as CHAR / ANY / CLASS / ASSERT /
 * SPLIT / JMP / MATCH instructions. Matching keeps one thread per program
 * counter per position, so a match costs at most program size x (name
 * length + 1) thread steps, each charged to the caller's budget. Only
 * re.match's yes/no answer is computed: greedy and lazy repeats accept the
 * same names, so laziness is parsed and ignored. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_re.h"

enum { N_CHAR, N_ANY, N_CLASS, N_ASSERT, N_CAT, N_ALT, N_REP };
enum { A_BEGIN, A_END, A_ENDZ, A_WORDB, A_NWORDB };
enum { K_RANGE, K_D, K_ND, K_W, K_NW, K_S, K_NS };
enum { I_CHAR, I_ANY, I_CLASS, I_ASSERT, I_SPLIT, I_JMP, I_MATCH };

typedef struct crange {
	uint32_t lo, hi;
	uint8_t kind;
} crange;

typedef struct node {
	uint8_t type;
	bool neg;
	uint32_t c;    /* N_CHAR code point, N_ASSERT kind */
	int cls, ncls; /* N_CLASS ranges */
	int kid, next; /* first child, next sibling; -1 none */
	int min, max;  /* N_REP; max -1 unbounded */
} node;

typedef struct inst {
	uint8_t op;
	bool neg;
	uint32_t c;
	int x, y; /* SPLIT/JMP targets; CLASS range offset and count */
} inst;

struct rt_re {
	inst *prog;
	int n;
	crange *rg;
	int nr;
};

typedef struct parser {
	uint32_t *p;
	size_t n, i;
	node *nd;
	int nn, ncap;
	crange *rg;
	int nr, rcap;
	int depth;
	bool failed;
	char *err;
	size_t errn;
} parser;

/* UTF-8 -> code points; a byte that starts no valid sequence stands for itself. */
static size_t decode(const char *s, size_t len, uint32_t *out)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0, k = 0;
	while (i < len) {
		uint32_t c = u[i];
		int m = c < 0x80 ? 0 : c < 0xc2 ? -1 : c < 0xe0 ? 1 : c < 0xf0 ? 2 : c < 0xf5 ? 3 : -1;
		bool ok = m > 0;
		uint32_t v = m == 1 ? c & 0x1f : m == 2 ? c & 0x0f : c & 0x07;
		for (int j = 1; ok && j <= m; j++) {
			if (i + (size_t)j >= len || (u[i + j] & 0xc0) != 0x80)
				ok = false;
			else
				v = v << 6 | (u[i + j] & 0x3f);
		}
		if (ok) {
			out[k++] = v;
			i += (size_t)m + 1;
		} else {
			out[k++] = c;
			i++;
		}
	}
	return k;
}

static void fail(parser *ps, const char *fmt, ...)
{
	if (ps->failed)
		return;
	ps->failed = true;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ps->err, ps->errn, fmt, ap);
	va_end(ap);
}

static int new_node(parser *ps, int type)
{
	if (ps->failed)
		return -1;
	if (ps->nn == ps->ncap) {
		int cap = ps->ncap ? ps->ncap * 2 : 64;
		node *q = realloc(ps->nd, (size_t)cap * sizeof *q);
		if (!q) {
			fail(ps, "out of memory");
			return -1;
		}
		ps->nd = q;
		ps->ncap = cap;
	}
	ps->nd[ps->nn] = (node){.type = (uint8_t)type, .kid = -1, .next = -1};
	return ps->nn++;
}

static void add_range(parser *ps, uint32_t lo, uint32_t hi, int kind)
{
	if (ps->failed)
		return;
	if (ps->nr == ps->rcap) {
		int cap = ps->rcap ? ps->rcap * 2 : 32;
		crange *q = realloc(ps->rg, (size_t)cap * sizeof *q);
		if (!q) {
			fail(ps, "out of memory");
			return;
		}
		ps->rg = q;
		ps->rcap = cap;
	}
	ps->rg[ps->nr++] = (crange){lo, hi, (uint8_t)kind};
}

static int hexval(uint32_t c)
{
	return c >= '0' && c <= '9' ? (int)(c - '0') : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
		: c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10) : -1;
}

static bool octal(uint32_t c)
{
	return c >= '0' && c <= '7';
}

/* An escape after the backslash at ps->i. Returns a code point, or -1-K for
 * the set K_* (\d ...), or -100-A for the assertion A_* (outside classes). */
static long escape(parser *ps, bool in_class)
{
	size_t at = ps->i;
	if (ps->i + 1 >= ps->n) {
		fail(ps, "bad escape (end of pattern) at position %zu", at);
		return 0;
	}
	uint32_t c = ps->p[ps->i + 1];
	ps->i += 2;
	switch (c) {
	case 'd': return -1 - K_D;
	case 'D': return -1 - K_ND;
	case 'w': return -1 - K_W;
	case 'W': return -1 - K_NW;
	case 's': return -1 - K_S;
	case 'S': return -1 - K_NS;
	case 'a': return 7;
	case 'f': return 12;
	case 'n': return 10;
	case 'r': return 13;
	case 't': return 9;
	case 'v': return 11;
	case 'b':
		return in_class ? 8 : -100 - A_WORDB;
	case 'A': case 'Z': case 'B':
		if (!in_class)
			return c == 'A' ? -100 - A_BEGIN : c == 'Z' ? -100 - A_ENDZ : -100 - A_NWORDB;
		break;
	case 'x': case 'u': case 'U': {
		int want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
		uint32_t v = 0;
		for (int k = 0; k < want; k++) {
			int h = ps->i < ps->n ? hexval(ps->p[ps->i]) : -1;
			if (h < 0) {
				fail(ps, "incomplete escape \\%c at position %zu", (char)c, at);
				return 0;
			}
			v = v << 4 | (uint32_t)h;
			ps->i++;
		}
		if (v > 0x10ffff) {
			fail(ps, "bad escape \\U at position %zu", at);
			return 0;
		}
		return v;
	}
	default:
		break;
	}
	if (c == '0') { /* up to two more octal digits */
		uint32_t v = 0;
		for (int k = 0; k < 2 && ps->i < ps->n && octal(ps->p[ps->i]); k++)
			v = v * 8 + (ps->p[ps->i++] - '0');
		return v;
	}
	if (c >= '1' && c <= '9') { /* three octal digits are a character, else a backreference */
		if (octal(c) && ps->i + 1 < ps->n && octal(ps->p[ps->i]) && octal(ps->p[ps->i + 1])) {
			uint32_t v = (c - '0') * 64 + (ps->p[ps->i] - '0') * 8 + (ps->p[ps->i + 1] - '0');
			ps->i += 2;
			if (v > 0377) {
				fail(ps, "octal escape value outside of range 0-0o377 at position %zu", at);
				return 0;
			}
			return v;
		}
		if (in_class)
			fail(ps, "bad escape \\%c at position %zu", (char)c, at);
		else
			fail(ps, "backreferences (\\%c at position %zu) are not supported", (char)c, at);
		return 0;
	}
	if (c < 128 && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) {
		fail(ps, "bad escape \\%c at position %zu", (char)c, at);
		return 0;
	}
	return c;
}

static int parse_class(parser *ps)
{
	size_t at = ps->i++;
	int k = new_node(ps, N_CLASS);
	if (k < 0)
		return -1;
	int start = ps->nr;
	if (ps->i < ps->n && ps->p[ps->i] == '^') {
		ps->nd[k].neg = true;
		ps->i++;
	}
	for (bool first = true; !ps->failed; first = false) {
		if (ps->i >= ps->n) {
			fail(ps, "unterminated character set at position %zu", at);
			break;
		}
		if (ps->p[ps->i] == ']' && !first) {
			ps->i++;
			break;
		}
		size_t here = ps->i;
		long lo = ps->p[ps->i] == '\\' ? escape(ps, true) : (long)ps->p[ps->i++];
		if (ps->failed)
			break;
		if (ps->i + 1 < ps->n && ps->p[ps->i] == '-' && ps->p[ps->i + 1] != ']') {
			ps->i++;
			long hi = ps->p[ps->i] == '\\' ? escape(ps, true) : (long)ps->p[ps->i++];
			if (ps->failed)
				break;
			if (lo < 0 || hi < 0 || hi < lo) {
				fail(ps, "bad character range at position %zu", here);
				break;
			}
			add_range(ps, (uint32_t)lo, (uint32_t)hi, K_RANGE);
		} else if (lo < 0) {
			add_range(ps, 0, 0, (int)(-1 - lo));
		} else {
			add_range(ps, (uint32_t)lo, (uint32_t)lo, K_RANGE);
		}
	}
	if (ps->failed)
		return -1;
	ps->nd[k].cls = start;
	ps->nd[k].ncls = ps->nr - start;
	return k;
}

static int parse_alt(parser *ps);

/* A group after its '('; returns its node, or -2 for a comment. */
static int parse_group(parser *ps)
{
	size_t at = ps->i++;
	if (ps->i < ps->n && ps->p[ps->i] == '?') {
		uint32_t c = ps->i + 1 < ps->n ? ps->p[ps->i + 1] : 0;
		if (c == ':') {
			ps->i += 2;
		} else if (c == '#') {
			while (ps->i < ps->n && ps->p[ps->i] != ')')
				ps->i++;
			if (ps->i >= ps->n) {
				fail(ps, "missing ), unterminated comment at position %zu", at);
				return -1;
			}
			ps->i++;
			return -2;
		} else if (c == 'P' && ps->i + 2 < ps->n && ps->p[ps->i + 2] == '<') {
			size_t j = ps->i + 3, s = j;
			while (j < ps->n && ps->p[j] != '>' &&
				(ps->p[j] == '_' || ps->p[j] >= 0x80 || ((ps->p[j] | 0x20) >= 'a' && (ps->p[j] | 0x20) <= 'z') ||
					(j > s && ps->p[j] >= '0' && ps->p[j] <= '9')))
				j++;
			if (j >= ps->n || ps->p[j] != '>' || j == s) {
				fail(ps, "bad group name at position %zu", at + 4);
				return -1;
			}
			ps->i = j + 1;
		} else {
			fail(ps, "group syntax '(?%c' at position %zu is not supported (lookaround, flags, "
				"backreferences)", c >= 32 && c < 127 ? (char)c : '?', at);
			return -1;
		}
	}
	if (++ps->depth > RT_RE_MAX_DEPTH) {
		fail(ps, "groups nested more than %d deep at position %zu", RT_RE_MAX_DEPTH, at);
		return -1;
	}
	int g = parse_alt(ps);
	ps->depth--;
	if (ps->failed)
		return -1;
	if (ps->i >= ps->n || ps->p[ps->i] != ')') {
		fail(ps, "missing ), unterminated subpattern at position %zu", at);
		return -1;
	}
	ps->i++;
	return g;
}

/* The decimal digits at *j (saturating at 10^6), -1 when there are none. */
static long number(const parser *ps, size_t *j)
{
	long v = -1;
	for (; *j < ps->n && ps->p[*j] >= '0' && ps->p[*j] <= '9'; ++*j)
		v = v < 0 ? (long)(ps->p[*j] - '0') : v * 10 + (long)(ps->p[*j] - '0') > 1000000 ? 1000000 : v * 10 + (long)(ps->p[*j] - '0');
	return v;
}

/* A {m}, {m,}, {,n} or {m,n} at ps->i: true and advanced past it, or false
 * (then the '{' is a literal, as in Python). */
static bool braces(parser *ps, int *min, int *max)
{
	size_t j = ps->i + 1;
	long lo = number(ps, &j), hi;
	if (j < ps->n && ps->p[j] == ',') {
		j++;
		hi = number(ps, &j);
	} else {
		if (lo < 0)
			return false; /* "{}" or "{x" */
		hi = lo;
	}
	if (j >= ps->n || ps->p[j] != '}')
		return false;
	*min = lo < 0 ? 0 : (int)lo;
	*max = hi < 0 ? -1 : (int)hi;
	ps->i = j + 1;
	return true;
}

static int parse_cat(parser *ps)
{
	int cat = new_node(ps, N_CAT), last = -1, prev = -1;
	while (!ps->failed && ps->i < ps->n && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
		uint32_t ch = ps->p[ps->i];
		size_t at = ps->i;
		int min = 0, max = -1, a;
		if (ch == '*' || ch == '+' || ch == '?' || (ch == '{' && braces(ps, &min, &max))) {
			if (ch != '{') {
				ps->i++;
				min = ch == '+';
				max = ch == '?' ? 1 : -1;
			}
			if (last < 0 || ps->nd[last].type == N_ASSERT) {
				fail(ps, "nothing to repeat at position %zu", at);
				break;
			}
			if (ps->nd[last].type == N_REP) {
				fail(ps, "multiple repeat at position %zu", at);
				break;
			}
			if (max >= 0 && max < min) {
				fail(ps, "min repeat greater than max repeat at position %zu", at + 1);
				break;
			}
			if (min > RT_RE_MAX_REPEAT || max > RT_RE_MAX_REPEAT) {
				fail(ps, "repeat count over %d at position %zu", RT_RE_MAX_REPEAT, at);
				break;
			}
			if (ps->i < ps->n && ps->p[ps->i] == '?') {
				ps->i++;
			} else if (ps->i < ps->n && ps->p[ps->i] == '+') {
				fail(ps, "possessive repeat at position %zu is not supported", ps->i);
				break;
			}
			int r = new_node(ps, N_REP);
			if (r < 0)
				break;
			ps->nd[r].kid = last;
			ps->nd[r].min = min;
			ps->nd[r].max = max;
			if (prev < 0)
				ps->nd[cat].kid = r;
			else
				ps->nd[prev].next = r;
			last = r;
			continue;
		}
		if (ch == '(') {
			a = parse_group(ps);
			if (a == -2)
				continue;
		} else if (ch == '[') {
			a = parse_class(ps);
		} else if (ch == '\\') {
			long e = escape(ps, false);
			if (ps->failed)
				break;
			if (e <= -100) {
				a = new_node(ps, N_ASSERT);
				if (a >= 0)
					ps->nd[a].c = (uint32_t)(-100 - e);
			} else if (e < 0) {
				a = new_node(ps, N_CLASS);
				if (a >= 0) {
					ps->nd[a].cls = ps->nr;
					ps->nd[a].ncls = 1;
					add_range(ps, 0, 0, (int)(-1 - e));
				}
			} else {
				a = new_node(ps, N_CHAR);
				if (a >= 0)
					ps->nd[a].c = (uint32_t)e;
			}
		} else {
			ps->i++;
			a = new_node(ps, ch == '.' ? N_ANY : ch == '^' || ch == '$' ? N_ASSERT : N_CHAR);
			if (a >= 0)
				ps->nd[a].c = ch == '^' ? A_BEGIN : ch == '$' ? A_END : ch;
		}
		if (a < 0 || ps->failed)
			break;
		if (last < 0)
			ps->nd[cat].kid = a;
		else
			ps->nd[last].next = a;
		prev = last;
		last = a;
	}
	return ps->failed ? -1 : cat;
}

static int parse_alt(parser *ps)
{
	int first = parse_cat(ps);
	if (first < 0 || ps->i >= ps->n || ps->p[ps->i] != '|')
		return first;
	int alt = new_node(ps, N_ALT), last = first;
	if (alt < 0)
		return -1;
	ps->nd[alt].kid = first;
	while (!ps->failed && ps->i < ps->n && ps->p[ps->i] == '|') {
		ps->i++;
		int b = parse_cat(ps);
		if (b < 0)
			return -1;
		ps->nd[last].next = b;
		last = b;
	}
	return ps->failed ? -1 : alt;
}

/* Instructions node k emits, saturating past RT_RE_MAX_PROG. */
static long size_of(const parser *ps, int k)
{
	const node *d = &ps->nd[k];
	long s = 0, cap = RT_RE_MAX_PROG + 1L;
	int cnt = 0;
	switch (d->type) {
	case N_CAT:
	case N_ALT:
		for (int c = d->kid; c >= 0; c = ps->nd[c].next, cnt++) {
			s += size_of(ps, c);
			s = s > cap ? cap : s;
		}
		if (d->type == N_ALT)
			s += 2L * (cnt - 1);
		break;
	case N_REP: {
		long b = size_of(ps, d->kid);
		s = b * d->min + (d->max < 0 ? b + 2 : (long)(d->max - d->min) * (b + 1));
		break;
	}
	default:
		s = 1;
	}
	return s > cap ? cap : s;
}

static int put(rt_re *re, int op, uint32_t c, int x, int y)
{
	re->prog[re->n] = (inst){(uint8_t)op, false, c, x, y};
	return re->n++;
}

static void emit(const parser *ps, rt_re *re, int k)
{
	const node *d = &ps->nd[k];
	switch (d->type) {
	case N_CHAR: put(re, I_CHAR, d->c, 0, 0); break;
	case N_ANY: put(re, I_ANY, 0, 0, 0); break;
	case N_ASSERT: put(re, I_ASSERT, d->c, 0, 0); break;
	case N_CLASS: re->prog[put(re, I_CLASS, 0, d->cls, d->ncls)].neg = d->neg; break;
	case N_CAT:
		for (int c = d->kid; c >= 0; c = ps->nd[c].next)
			emit(ps, re, c);
		break;
	case N_ALT: {
		int chain = -1; /* the JMPs to the end, linked through x */
		for (int c = d->kid; c >= 0; c = ps->nd[c].next) {
			if (ps->nd[c].next < 0) {
				emit(ps, re, c);
				break;
			}
			int sp = put(re, I_SPLIT, 0, re->n + 1, 0);
			emit(ps, re, c);
			chain = put(re, I_JMP, 0, chain, 0);
			re->prog[sp].y = re->n;
		}
		while (chain >= 0) {
			int nx = re->prog[chain].x;
			re->prog[chain].x = re->n;
			chain = nx;
		}
		break;
	}
	case N_REP: {
		for (int m = 0; m < d->min; m++)
			emit(ps, re, d->kid);
		if (d->max < 0) {
			int sp = put(re, I_SPLIT, 0, re->n + 1, 0);
			emit(ps, re, d->kid);
			put(re, I_JMP, 0, sp, 0);
			re->prog[sp].y = re->n;
			break;
		}
		int chain = -1; /* the SPLITs' exits, linked through y */
		for (int m = d->min; m < d->max; m++) {
			chain = put(re, I_SPLIT, 0, re->n + 1, chain);
			emit(ps, re, d->kid);
		}
		while (chain >= 0) {
			int nx = re->prog[chain].y;
			re->prog[chain].y = re->n;
			chain = nx;
		}
		break;
	}
	}
}

void rt_re_free(rt_re *re)
{
	if (re) {
		free(re->prog);
		free(re->rg);
		free(re);
	}
}

rt_re *rt_re_compile(const char *pat, long *budget, char *err, size_t n)
{
	size_t bl = strlen(pat);
	if (bl > RT_RE_MAX_PATTERN + 2) {
		snprintf(err, n, "pattern is %zu bytes long, more than the %d moec reads", bl, RT_RE_MAX_PATTERN);
		return NULL;
	}
	if ((*budget -= (long)bl) < 0) {
		snprintf(err, n, "matching ran past its budget of %ld steps", RT_RE_STEPS);
		return NULL;
	}
	parser ps = {.err = err, .errn = n};
	rt_re *re = NULL;
	ps.p = malloc((bl + 1) * sizeof *ps.p);
	if (!ps.p) {
		snprintf(err, n, "out of memory");
		return NULL;
	}
	ps.n = decode(pat, bl, ps.p);
	int root = parse_alt(&ps);
	if (!ps.failed && ps.i < ps.n)
		fail(&ps, "unbalanced parenthesis at position %zu", ps.i);
	long size = ps.failed ? 0 : size_of(&ps, root) + 1;
	if (!ps.failed && size > RT_RE_MAX_PROG)
		fail(&ps, "pattern expands to more than %d instructions", RT_RE_MAX_PROG);
	if (!ps.failed && (*budget -= size) < 0)
		fail(&ps, "matching ran past its budget of %ld steps", RT_RE_STEPS);
	if (!ps.failed) {
		re = calloc(1, sizeof *re);
		if (re)
			re->prog = malloc((size_t)size * sizeof *re->prog);
		if (!re || !re->prog) {
			rt_re_free(re);
			re = NULL;
			fail(&ps, "out of memory");
		}
	}
	if (re) {
		emit(&ps, re, root);
		put(re, I_MATCH, 0, 0, 0);
		re->rg = ps.rg;
		re->nr = ps.nr;
		ps.rg = NULL;
	}
	free(ps.p);
	free(ps.nd);
	free(ps.rg);
	return re;
}

static bool is_word(uint32_t c)
{
	return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c >= 0xaa;
}

static bool is_space(uint32_t c)
{
	return (c >= 9 && c <= 13) || c == ' ' || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static bool in_class(const rt_re *re, const inst *in, uint32_t c)
{
	bool hit = false;
	for (int k = 0; k < in->y && !hit; k++) {
		const crange *r = &re->rg[in->x + k];
		switch (r->kind) {
		case K_RANGE: hit = c >= r->lo && c <= r->hi; break;
		case K_D: hit = c >= '0' && c <= '9'; break;
		case K_ND: hit = !(c >= '0' && c <= '9'); break;
		case K_W: hit = is_word(c); break;
		case K_NW: hit = !is_word(c); break;
		case K_S: hit = is_space(c); break;
		default: hit = !is_space(c); break;
		}
	}
	return hit != in->neg;
}

typedef struct vm {
	const rt_re *re;
	const uint32_t *s;
	size_t n;
	int *mark, *stack;
	long *budget;
} vm;

static bool holds(const vm *v, uint32_t kind, size_t i)
{
	bool before = i > 0 && is_word(v->s[i - 1]), after = i < v->n && is_word(v->s[i]);
	switch (kind) {
	case A_BEGIN: return i == 0;
	case A_END: return i == v->n || (i + 1 == v->n && v->s[i] == '\n');
	case A_ENDZ: return i == v->n;
	case A_WORDB: return before != after;
	default: return before == after;
	}
}

/* Adds pc's epsilon closure at position i to list; 1 when it reaches MATCH,
 * -1 when the budget ran out, else 0. */
static int add(const vm *v, int *list, int *cnt, int pc, size_t i)
{
	int sp = 0, stamp = (int)i + 1;
	v->stack[sp++] = pc;
	while (sp) {
		pc = v->stack[--sp];
		if (v->mark[pc] == stamp)
			continue;
		v->mark[pc] = stamp;
		if (--*v->budget < 0)
			return -1;
		const inst *in = &v->re->prog[pc];
		switch (in->op) {
		case I_JMP: v->stack[sp++] = in->x; break;
		case I_SPLIT:
			v->stack[sp++] = in->y;
			v->stack[sp++] = in->x;
			break;
		case I_ASSERT:
			if (holds(v, in->c, i))
				v->stack[sp++] = pc + 1;
			break;
		case I_MATCH: return 1;
		default: list[(*cnt)++] = pc;
		}
	}
	return 0;
}

int rt_re_match(const rt_re *re, const char *s, long *budget)
{
	size_t bl = strlen(s);
	if (bl > RT_RE_MAX_NAME || *budget < 0)
		return -1;
	size_t np = (size_t)re->n;
	uint32_t *u = malloc((bl + 1) * sizeof *u);
	int *mem = malloc((np * 5 + 2) * sizeof *mem);
	if (!u || !mem) {
		free(u);
		free(mem);
		return -1;
	}
	/* a pc is marked once per position and pushes at most two others: the
	 * stack holds at most 2 np + 1 */
	vm v = {re, u, decode(s, bl, u), mem, mem + 3 * np, budget};
	int *cl = mem + np, *nl = mem + 2 * np, ncl = 0, r;
	memset(v.mark, 0, np * sizeof *v.mark);
	r = add(&v, cl, &ncl, 0, 0);
	for (size_t i = 0; !r && ncl && i < v.n; i++) {
		int nnl = 0;
		for (int t = 0; t < ncl && !r; t++) {
			const inst *in = &re->prog[cl[t]];
			uint32_t c = u[i];
			bool ok = in->op == I_CHAR ? c == in->c : in->op == I_ANY ? c != '\n' : in_class(re, in, c);
			if (--*budget < 0)
				r = -1;
			else if (ok)
				r = add(&v, nl, &nnl, cl[t] + 1, i + 1);
		}
		int *tmp = cl;
		cl = nl;
		nl = tmp;
		ncl = nnl;
	}
	free(u);
	free(mem);
	return r;
}

static int compiled_match(const char *pat, const char *module, long *budget, char *err, size_t n)
{
	rt_re *re = rt_re_compile(pat, budget, err, n);
	if (!re)
		return -1;
	int m = rt_re_match(re, module, budget);
	rt_re_free(re);
	if (m < 0)
		snprintf(err, n, "matching ran past its budget of %ld steps", RT_RE_STEPS);
	return m;
}

int rt_sel_hf(const char *entry, const char *module, long *budget, char *err, size_t n)
{
	size_t el = strlen(entry), ml = strlen(module);
	if (el > RT_RE_MAX_PATTERN) {
		snprintf(err, n, "pattern is %zu bytes long, more than the %d moec reads", el, RT_RE_MAX_PATTERN);
		return -1;
	}
	char *dot = malloc(el + 3);
	if (!dot) {
		snprintf(err, n, "out of memory");
		return -1;
	}
	memcpy(dot, entry, el);
	memcpy(dot + el, "\\.", 3);
	int m = compiled_match(dot, module, budget, err, n);
	free(dot);
	if (!m)
		m = compiled_match(entry, module, budget, err, n);
	return m ? m : ml >= el && !strcmp(module + ml - el, entry);
}

int rt_sel_ct(const char *entry, const char *module, long *budget, char *err, size_t n)
{
	if (strncmp(entry, "re:", 3))
		return !strcmp(entry, module);
	if (strlen(entry + 3) > RT_RE_MAX_PATTERN) {
		snprintf(err, n, "pattern is %zu bytes long, more than the %d moec reads", strlen(entry + 3),
			RT_RE_MAX_PATTERN);
		return -1;
	}
	return compiled_match(entry + 3, module, budget, err, n);
}
