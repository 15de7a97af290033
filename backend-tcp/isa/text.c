/* backend-tcp/isa/text.c: the string builder and lexing helpers shared by the
 * TCP text forms (text.h). */
#include "backend-tcp/isa/text.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const tcp_sop_names[TCP_S_COUNT] = {
#define X(id, s) s,
	TCP_SOPS(X)
#undef X
};
const char *const tcp_cond_names[TCP_C_COUNT] = {
#define X(id, s) s,
	TCP_CONDS(X)
#undef X
};
const char *const tcp_src_names[TCP_SRC_NONE + 1] = {"v", "s0", "s1", "s2", "imm", "ctr", "_"};

void tcp_sbf(tcp_sb *b, const char *fmt, ...)
{
	if (b->bad)
		return;
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0) {
			b->bad = true;
			return;
		}
		if (b->s && b->n + (size_t)k < b->cap) {
			b->n += (size_t)k;
			return;
		}
		size_t nc = b->cap ? b->cap * 2 : b->first ? b->first : 4096;
		while (nc < b->n + (size_t)k + 1)
			nc *= 2;
		char *ns = b->ctx ? ctx_try_realloc(b->ctx, b->s, nc) : realloc(b->s, nc);
		if (!ns) {
			b->bad = true;
			return;
		}
		b->s = ns;
		b->cap = nc;
	}
}

void tcp_sb_quoted(tcp_sb *b, const char *s)
{
	tcp_sbf(b, "\"");
	for (const char *c = s; *c; c++)
		tcp_sbf(b, *c == '"' || *c == '\\' ? "\\%c" : *c >= 0x20 && *c < 0x7f ? "%c" : "\\x%02x", (unsigned char)*c);
	tcp_sbf(b, "\"");
}

void tcp_sb_view(tcp_sb *b, const char *key, const tcp_view *v, int nd, const char *reg_name)
{
	if (v->t < 0)
		return;
	int n = nd;
	for (int k = nd; k < TCP_MAXD; k++)
		if (v->stride[k])
			n = k + 1;
	tcp_sbf(b, " %s=%%%d%+" PRId64, key, v->t, v->base);
	if (v->reg >= 0 && reg_name)
		tcp_sbf(b, "+$%s*%" PRId64, reg_name, v->scale);
	else if (v->reg >= 0)
		tcp_sbf(b, "+r%d*%" PRId64, v->reg, v->scale);
	tcp_sbf(b, ":[");
	for (int k = 0; k < n; k++)
		tcp_sbf(b, "%s%" PRId64, k ? "," : "", v->stride[k]);
	tcp_sbf(b, "]");
}

void tcp_sb_insn_tail(tcp_sb *b, const tcp_insn *in, const char *const *reg_names)
{
	if (in->tile)
		tcp_sbf(b, " tile=%" PRId64, in->tile);
	if (in->rows)
		tcp_sbf(b, " rows=%" PRId64, in->rows);
	static const char *const vk[TCP_NVIEW] = {"dst", "s0", "s1", "s2"};
	for (int w = 0; w < TCP_NVIEW; w++)
		tcp_sb_view(b, vk[w], &in->v[w], in->ndim, reg_names ? reg_names[w] : NULL);
	if (in->nstep) {
		tcp_sbf(b, " chain=[");
		for (int k = 0; k < in->nstep && k < TCP_MAXSTEP; k++) {
			const tcp_step *st = &in->step[k];
			tcp_sbf(b, "%s%s(%s,%s,#0x%08x,c%u,%u)", k ? "," : "", st->op < TCP_V_COUNT ? tcp_vop_names[st->op] : "?",
				st->x <= TCP_SRC_NONE ? tcp_src_names[st->x] : "?", st->y <= TCP_SRC_NONE ? tcp_src_names[st->y] : "?",
				st->imm, st->ctr, st->flags);
		}
		tcp_sbf(b, "]");
	}
}

static bool pint_base(const char **s, int64_t *v, int base)
{
	char *e;
	errno = 0;
	long long x = strtoll(*s, &e, base);
	if (e == *s || errno)
		return false;
	*v = x;
	*s = e;
	return true;
}

bool tcp_pint(const char **s, int64_t *v)
{
	return pint_base(s, v, 0);
}

bool tcp_pdec(const char **s, int64_t *v)
{
	return pint_base(s, v, 10);
}

bool tcp_lit(const char **s, const char *l)
{
	size_t n = strlen(l);
	if (strncmp(*s, l, n))
		return false;
	*s += n;
	return true;
}
