/* backend-tcp/isa/text.h: the string builder and lexing helpers shared by the
 * TCP text forms: the .tcps assembly (asm.c) and the schedule's text form
 * (compiler/sched_print.c, sched_parse.c). */
#ifndef MOEC_TCP_TEXT_H
#define MOEC_TCP_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "backend-tcp/isa/tcp_int.h"
#include "support/support.h"

/* The spellings of tcp_sop (alu.OP), tcp_cond (br.COND / cmp.COND) and a
 * chain step's sources (TCP_SRC_*, "_" for none), by value. */
extern const char *const tcp_sop_names[TCP_S_COUNT];
extern const char *const tcp_cond_names[TCP_C_COUNT];
extern const char *const tcp_src_names[TCP_SRC_NONE + 1];

/* A growing NUL-terminated string. With ctx, the block is the context's
 * (ctx_try_realloc; free with ctx_free); without, it is malloc's (free).
 * first: the first capacity (0: 4096). Once bad (a format or allocation
 * failure) every later append is dropped; s is then to be freed, never used. */
typedef struct tcp_sb {
	moe_ctx *ctx;
	char *s;
	size_t n, cap, first;
	bool bad;
} tcp_sb;

void tcp_sbf(tcp_sb *b, const char *fmt, ...) MOE_PRINTF(2, 3);
/* s in double quotes: '"' and '\\' escaped with '\\', bytes outside
 * 0x20..0x7e as \xHH; the text never ends the quotes early. */
void tcp_sb_quoted(tcp_sb *b, const char *s);

/* " KEY=%T+BASE[+REG*SCALE]:[STRIDES]": the view v (nothing when v->t < 0),
 * its strides past nd up to the last nonzero one. REG is "r<v->reg>" when
 * reg_name is NULL, else "$<reg_name>". */
void tcp_sb_view(tcp_sb *b, const char *key, const tcp_view *v, int nd, const char *reg_name);

/* " tile=N rows=N" (each when nonzero), the views dst, s0, s1, s2 as
 * tcp_sb_view (reg_names NULL: every register as rN; else the name of view
 * w's register in reg_names[w]) and " chain=[OP(X,Y,#0xIMM,cCTR,FLAGS),...]". */
void tcp_sb_insn_tail(tcp_sb *b, const tcp_insn *in, const char *const *reg_names);

/* A strtoll number (base 0) at *s: false, *s unchanged, when none or out of range. */
bool tcp_pint(const char **s, int64_t *v);
/* A decimal integer only: where an `x` follows (a layout's PARTxCOPIES),
 * "0x512" must read as 0, then x, then 512. */
bool tcp_pdec(const char **s, int64_t *v);
/* The literal l at *s: advances *s past it when present, else leaves it. */
bool tcp_lit(const char **s, const char *l);

#endif
