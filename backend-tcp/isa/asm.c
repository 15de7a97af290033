/* backend-tcp/isa/asm.c: the .tcps text assembly (docs/tcp-isa.md section 9).
 * The printer writes every field that can differ from its default, so
 * parse(print(p)) prints identically and encodes to the same binary. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"
#include "backend-tcp/isa/text.h"

static const char *const space_names[TCP_NSPACE] = {"hbm", "dm", "trf", "vrf"};

static void print_insn(tcp_sb *b, const tcp_insn *in)
{
	const char *nm = tcp_op_names[in->op];
	if (in->op == TCP_OP_ALU)
		tcp_sbf(b, "alu.%s", in->sop < TCP_S_COUNT ? tcp_sop_names[in->sop] : "?");
	else if (in->op == TCP_OP_BR)
		tcp_sbf(b, "br.%s", in->sop < TCP_C_COUNT ? tcp_cond_names[in->sop] : "?");
	else
		tcp_sbf(b, "%s", nm);
	if (in->op == TCP_OP_SIG || in->op == TCP_OP_WAIT)
		tcp_sbf(b, " ctx=%s tok=%d", in->sop < TCP_NCTX ? tcp_ctx_names[in->sop] : "?", in->target);
	if (in->rd != TCP_NOREG)
		tcp_sbf(b, " rd=r%d", in->rd);
	if (in->ra != TCP_NOREG)
		tcp_sbf(b, " ra=r%d", in->ra);
	if (in->rb != TCP_NOREG)
		tcp_sbf(b, " rb=r%d", in->rb);
	if (in->imm)
		tcp_sbf(b, " imm=%" PRId64, in->imm);
	if (in->op == TCP_OP_BR || in->op == TCP_OP_JMP)
		tcp_sbf(b, " target=@%d", in->target);
	if (in->ndim) {
		tcp_sbf(b, " dims=[");
		for (int k = 0; k < in->ndim; k++)
			tcp_sbf(b, "%s%" PRId64, k ? "," : "", in->dim[k]);
		tcp_sbf(b, "]");
	}
	if (in->flags)
		tcp_sbf(b, " flags=%s%s%s%s%s%s%s%s", in->flags & TCP_F_BF16X3 ? "bf16x3," : "", in->flags & TCP_F_ACC ? "acc," : "",
			in->flags & TCP_F_XSLICE ? "xslice," : "", in->flags & TCP_F_JOIN ? (tcp_op_ctx[in->op] == TCP_CTX_MAIN ? "switch," : "join,") : "",
			in->flags & TCP_F_E2M1 ? (in->op == TCP_OP_TU_CONTRACT ? "rowdiv," : "e2m1,") : "", in->flags & TCP_F_I4 ? "i4," : "",
			in->flags & TCP_F_SCALED ? "scaled," : "", in->flags & TCP_F_VROWS ? "vrows," : "");
	if (in->vreg >= 0)
		tcp_sbf(b, " valid=r%d", in->vreg);
	tcp_sb_insn_tail(b, in, NULL);
	if (in->phase)
		tcp_sbf(b, " ph=%s", in->phase < TCP_PH_COUNT ? tcp_phase_names[in->phase] : "?");
	tcp_sbf(b, "\n");
}

static void print_prog(tcp_sb *b, const tcp_program *p)
{
	tcp_sbf(b, "tcps 1\n");
	tcp_sbf(b,
		"meta T=%" PRId64 " K=%" PRId64 " D=%" PRId64 " F=%" PRId64 " E=%" PRId64 " B=%" PRId64 " G=%" PRId64
		" nproj=%" PRId64 " router_e=%" PRId64 " wexp=%" PRId64 " act=%" PRId64 " rmacs=%" PRId64
		" dtype=%u nblocks=%d bexp=%d loop=%d body=%d",
		p->moe_T, p->moe_K, p->moe_D, p->moe_F, p->moe_E, p->moe_B, p->moe_G, p->nproj, p->router_E,
		p->weight_bytes_per_expert, p->act_bytes, p->router_macs, p->dtype, p->nblocks_t, p->bexp_t,
		p->block_loop_pc, p->block_body_pc);
	if (p->tier_n > 0) /* a decode tier (tier.c) */
		tcp_sbf(b, " tier=%" PRId64 " tier_loop=%d tier_bexp=%d", p->tier_n, p->tier_loop_pc, p->tier_bexp_t);
	tcp_sbf(b, "\n");
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		tcp_sbf(b, "tensor %%%u %s %s %s [", i, t->space < TCP_NSPACE ? space_names[t->space] : "?",
			t->kind < TCP_NKIND ? tcp_kind_names[t->kind] : "?", moe_dtype_name((moe_dtype)t->dtype));
		for (int k = 0; k < t->rank; k++)
			tcp_sbf(b, "%s%" PRId64, k ? "," : "", t->shape[k]);
		tcp_sbf(b, "] addr=%" PRId64 " slice=%" PRId64 " const=%" PRId64 " ", t->addr, t->slice_bytes, t->const_off);
		if (t->part_bytes != 0 || t->copies != 1) /* the spread layout in one copy is the default */
			tcp_sbf(b, "layout=%" PRId64 "x%d ", t->part_bytes, t->copies);
		tcp_sb_quoted(b, t->name);
		if (t->source[0]) {
			tcp_sbf(b, " src=");
			tcp_sb_quoted(b, t->source);
		}
		tcp_sbf(b, "\n");
	}
	if (p->prep_len) /* compact IR JSON: one line */
		tcp_sbf(b, "prep %.*s\n", (int)p->prep_len, p->prep);
	for (int64_t i = 0; i < p->nconst; i += 32) {
		tcp_sbf(b, "const ");
		for (int64_t k = i; k < p->nconst && k < i + 32; k++)
			tcp_sbf(b, "%02x", p->consts[k]);
		tcp_sbf(b, "\n");
	}
	for (uint32_t i = 0; i < p->ncode; i++) {
		tcp_sbf(b, "@%u: ", i);
		print_insn(b, &p->code[i]);
	}
}

moe_status moe_tcp_to_asm(moe_ctx *ctx, const moe_tcp_program *p, char **out, size_t *len)
{
	(void)ctx;
	tcp_sb b = {.first = 65536};
	print_prog(&b, p);
	if (b.bad || !b.s) {
		free(b.s);
		return MOE_ERR_NOMEM;
	}
	*out = b.s;
	*len = b.n;
	return MOE_OK;
}

/* ---- parser ---- */
typedef struct ap {
	moe_ctx *ctx;
	const char *file;
	int line;
	bool bad;
} ap;

static void perr(ap *a, const char *fmt, ...) MOE_PRINTF(2, 3);
static void perr(ap *a, const char *fmt, ...)
{
	if (a->bad)
		return;
	char msg[300];
	va_list v;
	va_start(v, fmt);
	vsnprintf(msg, sizeof msg, fmt, v);
	va_end(v);
	moe_diag(a->ctx, MOE_DIAG_ERROR, moe_loc_at(a->ctx, a->file, a->line, 1), "%s", msg);
	a->bad = true;
}

static bool pint(const char **s, int64_t *v)
{
	return tcp_pint(s, v);
}

static bool preg(const char **s, int *r)
{
	int64_t v;
	if (!tcp_lit(s, "r") || !pint(s, &v) || v < 0 || v >= 255)
		return false;
	*r = (int)v;
	return true;
}

static int plist(const char **s, int64_t *out, int max)
{
	if (!tcp_lit(s, "["))
		return -1;
	int n = 0;
	while (**s != ']') {
		if (n && !tcp_lit(s, ","))
			return -1;
		if (n >= max || !pint(s, &out[n]))
			return -1;
		n++;
	}
	(*s)++;
	return n;
}

static bool pview_(const char **s, tcp_view *v)
{
	int64_t t;
	*v = tcp_view_none();
	if (!tcp_lit(s, "%") || !pint(s, &t) || t < 0 || t > INT32_MAX || !pint(s, &v->base))
		return false;
	v->t = (int32_t)t;
	if (tcp_lit(s, "+")) {
		int r;
		if (!preg(s, &r) || !tcp_lit(s, "*") || !pint(s, &v->scale))
			return false;
		v->reg = r;
	}
	return tcp_lit(s, ":") && plist(s, v->stride, TCP_MAXD) >= 0;
}

static int lookup(const char *const *names, int n, const char *s, size_t len)
{
	for (int i = 0; i < n; i++)
		if (strlen(names[i]) == len && !strncmp(names[i], s, len))
			return i;
	return -1;
}

static bool pchain(const char **s, tcp_insn *in)
{
	if (!tcp_lit(s, "["))
		return false;
	while (**s != ']') {
		if (in->nstep && !tcp_lit(s, ","))
			return false;
		if (in->nstep >= TCP_MAXSTEP)
			return false;
		tcp_step *st = &in->step[in->nstep++];
		const char *p = strchr(*s, '(');
		if (!p)
			return false;
		int op = lookup(tcp_vop_names, TCP_V_COUNT, *s, (size_t)(p - *s));
		*s = p + 1;
		const char *q = strchr(*s, ',');
		int x = q ? lookup(tcp_src_names, TCP_SRC_NONE + 1, *s, (size_t)(q - *s)) : -1;
		*s = q ? q + 1 : *s;
		q = strchr(*s, ',');
		int y = q ? lookup(tcp_src_names, TCP_SRC_NONE + 1, *s, (size_t)(q - *s)) : -1;
		*s = q ? q + 1 : *s;
		int64_t imm, ctr, fl;
		if (op < 0 || x < 0 || y < 0 || !tcp_lit(s, "#") || !pint(s, &imm) || imm < 0 || imm > 0xffffffffLL ||
			!tcp_lit(s, ",c") || !pint(s, &ctr) || ctr < 0 || ctr > 255 || !tcp_lit(s, ",") || !pint(s, &fl) || fl < 0 ||
			fl > 255 || !tcp_lit(s, ")"))
			return false;
		st->op = (uint8_t)op;
		st->x = (uint8_t)x;
		st->y = (uint8_t)y;
		st->imm = (uint32_t)imm;
		st->ctr = (uint8_t)ctr;
		st->flags = (uint8_t)fl;
	}
	(*s)++;
	return true;
}

static void parse_insn(ap *a, tcp_program *p, const char *s)
{
	tcp_insn in = tcp_insn_init(TCP_OP_HALT);
	const char *sp = s;
	while (*sp && *sp != ' ')
		sp++;
	size_t ml = (size_t)(sp - s);
	int op = lookup(tcp_op_names, TCP_OP_COUNT, s, ml);
	if (op < 0 && ml > 4 && !strncmp(s, "alu.", 4)) {
		op = TCP_OP_ALU;
		int k = lookup(tcp_sop_names, TCP_S_COUNT, s + 4, ml - 4);
		if (k < 0)
			return perr(a, "unknown ALU operation '%.*s'", (int)ml, s);
		in.sop = (uint8_t)k;
	} else if (op < 0 && ml > 3 && !strncmp(s, "br.", 3)) {
		op = TCP_OP_BR;
		int k = lookup(tcp_cond_names, TCP_C_COUNT, s + 3, ml - 3);
		if (k < 0)
			return perr(a, "unknown condition '%.*s'", (int)ml, s);
		in.sop = (uint8_t)k;
	}
	if (op < 0)
		return perr(a, "unknown instruction '%.*s'", (int)ml, s);
	in.op = (uint8_t)op;
	s = sp;
	while (*s == ' ')
		s++;
	while (*s && !a->bad) {
		const char *eq = strchr(s, '=');
		if (!eq)
			return perr(a, "expected key=value near '%.20s'", s);
		size_t kl = (size_t)(eq - s);
		const char *key = s;
		s = eq + 1;
		bool ok = true;
		int r = 0;
		int64_t v = 0;
#define KEY(k) (kl == strlen(k) && !strncmp(key, k, kl))
		if (KEY("rd") || KEY("ra") || KEY("rb")) {
			ok = preg(&s, &r);
			if (ok)
				*(key[1] == 'd' ? &in.rd : key[1] == 'a' ? &in.ra : &in.rb) = (uint8_t)r;
		} else if (KEY("imm")) {
			ok = pint(&s, &in.imm);
		} else if (KEY("target")) {
			ok = tcp_lit(&s, "@") && pint(&s, &v) && v >= INT32_MIN && v <= INT32_MAX;
			in.target = (int32_t)v;
		} else if (KEY("tok")) {
			ok = pint(&s, &v) && v >= INT32_MIN && v <= INT32_MAX;
			in.target = (int32_t)v;
		} else if (KEY("ctx")) {
			const char *e = s;
			while (*e && *e != ' ')
				e++;
			int k = lookup(tcp_ctx_names, TCP_NCTX, s, (size_t)(e - s));
			ok = k >= 0;
			in.sop = (uint8_t)k;
			s = e;
		} else if (KEY("dims")) {
			int n = plist(&s, in.dim, TCP_MAXD);
			ok = n >= 0;
			in.ndim = (uint8_t)(n > 0 ? n : 0);
		} else if (KEY("flags")) {
			while (*s && *s != ' ') {
				if (tcp_lit(&s, "bf16x3,"))
					in.flags |= TCP_F_BF16X3;
				else if (tcp_lit(&s, "acc,"))
					in.flags |= TCP_F_ACC;
				else if (tcp_lit(&s, "xslice,"))
					in.flags |= TCP_F_XSLICE;
				else if (tcp_lit(&s, "join,"))
					in.flags |= TCP_F_JOIN;
				else if (tcp_lit(&s, "switch,"))
					in.flags |= TCP_F_ROUTE;
				else if (in.op != TCP_OP_TU_CONTRACT && tcp_lit(&s, "e2m1,"))
					in.flags |= TCP_F_E2M1;
				else if (in.op == TCP_OP_TU_CONTRACT && tcp_lit(&s, "rowdiv,")) /* the same bit */
					in.flags |= TCP_F_ROWDIV;
				else if (tcp_lit(&s, "i4,"))
					in.flags |= TCP_F_I4;
				else if (tcp_lit(&s, "scaled,"))
					in.flags |= TCP_F_SCALED;
				else if (tcp_lit(&s, "vrows,"))
					in.flags |= TCP_F_VROWS;
				else {
					ok = false;
					break;
				}
			}
		} else if (KEY("valid")) {
			ok = preg(&s, &r);
			in.vreg = r;
		} else if (KEY("tile")) {
			ok = pint(&s, &in.tile);
		} else if (KEY("rows")) {
			ok = pint(&s, &in.rows);
		} else if (KEY("dst") || KEY("s0") || KEY("s1") || KEY("s2")) {
			int w = KEY("dst") ? 0 : key[1] - '0' + 1;
			ok = pview_(&s, &in.v[w]);
		} else if (KEY("chain")) {
			ok = pchain(&s, &in);
		} else if (KEY("ph")) {
			const char *e = s;
			while (*e && *e != ' ')
				e++;
			int k = lookup(tcp_phase_names, TCP_PH_COUNT, s, (size_t)(e - s));
			ok = k >= 0;
			in.phase = (uint8_t)(k > 0 ? k : 0);
			s = e;
		} else {
			return perr(a, "unknown field '%.*s'", (int)kl, key);
		}
#undef KEY
		if (!ok || (*s && *s != ' '))
			return perr(a, "malformed value of '%.*s'", (int)kl, key);
		while (*s == ' ')
			s++;
	}
	tcp_emit(p, &in);
}

/* "..." with \" \\ \xHH escapes, at most 4096 bytes, into buf (4097 bytes) */
static bool pquoted(const char **sp, char *buf)
{
	const char *s = *sp;
	if (*s++ != '"')
		return false;
	size_t nl = 0;
	while (*s && *s != '"') {
		if (nl >= 4096)
			return false;
		if (*s == '\\') {
			s++;
			if (*s == 'x') {
				unsigned x;
				if (!isxdigit((unsigned char)s[1]) || !isxdigit((unsigned char)s[2]) || sscanf(s + 1, "%2x", &x) != 1 ||
					!x)
					return false;
				buf[nl++] = (char)x;
				s += 3;
				continue;
			}
			if (!*s)
				return false;
		}
		buf[nl++] = *s++;
	}
	buf[nl] = 0;
	if (*s != '"')
		return false;
	*sp = s + 1;
	return true;
}

static void parse_tensor(ap *a, tcp_program *p, const char *s)
{
	int64_t id, shape[MOE_MAX_RANK];
	char sp[16], kd[16], dt[16];
	int n = 0;
	if (!tcp_lit(&s, "%") || !pint(&s, &id) || id != p->nt || sscanf(s, " %15s %15s %15s %n", sp, kd, dt, &n) != 3)
		return perr(a, "malformed tensor line (tensors are numbered in order)");
	s += n;
	int space = lookup(space_names, TCP_NSPACE, sp, strlen(sp)), kind = lookup(tcp_kind_names, TCP_NKIND, kd, strlen(kd)),
	    d = moe_dtype_from_name(dt);
	int rank = plist(&s, shape, MOE_MAX_RANK);
	if (space < 0 || kind < 0 || d < 0 || rank < 0)
		return perr(a, "bad tensor space, kind, dtype or shape");
	for (int k = 0; k < rank; k++)
		if (shape[k] < 1 || shape[k] > ((int64_t)1 << 40))
			return perr(a, "bad tensor shape");
	int64_t addr, sl, co;
	if (!tcp_lit(&s, " addr=") || !pint(&s, &addr) || !tcp_lit(&s, " slice=") || !pint(&s, &sl) ||
		!tcp_lit(&s, " const=") || !pint(&s, &co) || !tcp_lit(&s, " "))
		return perr(a, "malformed tensor fields");
	int64_t part = 0, copies = 1;
	if (tcp_lit(&s, "layout=") && (!tcp_pdec(&s, &part) || !tcp_lit(&s, "x") || !tcp_pdec(&s, &copies) || !tcp_lit(&s, " ") ||
					  part < 0 || copies < 1 || copies > 65536))
		return perr(a, "malformed layout (layout=PARTxCOPIES: part bytes, 0 for spread, and 1..65536 copies)");
	char name[4097], source[4097] = "";
	if (!pquoted(&s, name))
		return perr(a, "bad or unterminated tensor name");
	if (tcp_lit(&s, " src=") && !pquoted(&s, source))
		return perr(a, "bad or unterminated tensor source");
	if (*s)
		return perr(a, "unexpected text after the tensor name");
	int32_t t = tcp_add_tensor(p, name, space, kind, (moe_dtype)d, rank, shape);
	tcp_set_source(p, t, source);
	p->t[t].addr = addr;
	p->t[t].slice_bytes = sl;
	p->t[t].const_off = co;
	p->t[t].part_bytes = part;
	p->t[t].copies = (int32_t)copies;
}

static void parse_meta(ap *a, tcp_program *p, const char *s)
{
	int64_t v[17];
	static const char *const k[17] = {" T=", " K=", " D=", " F=", " E=", " B=", " G=", " nproj=", " router_e=", " wexp=",
		" act=", " rmacs=", " dtype=", " nblocks=", " bexp=", " loop=", " body="};
	for (int i = 0; i < 17; i++)
		if (!tcp_lit(&s, k[i]) || !pint(&s, &v[i]))
			return perr(a, "malformed meta line at '%s'", k[i] + 1);
	int64_t *f[12] = {&p->moe_T, &p->moe_K, &p->moe_D, &p->moe_F, &p->moe_E, &p->moe_B, &p->moe_G, &p->nproj,
		&p->router_E, &p->weight_bytes_per_expert, &p->act_bytes, &p->router_macs};
	for (int i = 0; i < 12; i++)
		*f[i] = v[i];
	if (v[12] < 0 || v[12] >= MOE_DTYPE_COUNT)
		return perr(a, "bad dtype");
	for (int i = 13; i < 17; i++)
		if (v[i] < -1 || v[i] > INT32_MAX)
			return perr(a, "bad meta index");
	p->dtype = (uint8_t)v[12];
	p->nblocks_t = (int32_t)v[13];
	p->bexp_t = (int32_t)v[14];
	p->block_loop_pc = (int32_t)v[15];
	p->block_body_pc = (int32_t)v[16];
	int64_t t[3];
	if (!tcp_lit(&s, " tier="))
		return;
	if (!pint(&s, &t[0]) || !tcp_lit(&s, " tier_loop=") || !pint(&s, &t[1]) || !tcp_lit(&s, " tier_bexp=") ||
		!pint(&s, &t[2]) || t[0] < 1 || t[1] < -1 || t[1] > INT32_MAX || t[2] < -1 || t[2] > INT32_MAX)
		return perr(a, "malformed meta line at '%s'", "tier");
	p->tier_n = t[0];
	p->tier_loop_pc = (int32_t)t[1];
	p->tier_bexp_t = (int32_t)t[2];
}

tcp_program *tcp_parse_asm(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	ap a = {ctx, file ? file : "<asm>", 0, false};
	tcp_program *p = tcp_prog_new(ctx);
	size_t pos = 0;
	char *line = NULL;
	size_t lcap = 0;
	bool header = false;
	while (pos < len && !a.bad) {
		size_t e = pos;
		while (e < len && text[e] != '\n')
			e++;
		size_t n = e - pos;
		if (n + 1 > lcap) {
			line = ctx_realloc(ctx, line, lcap, n + 1);
			lcap = n + 1;
		}
		memcpy(line, text + pos, n);
		line[n] = 0;
		pos = e + 1;
		a.line++;
		if (memchr(line, 0, n)) {
			perr(&a, "NUL byte in assembly");
			break;
		}
		const char *s = line;
		while (*s == ' ' || *s == '\t')
			s++;
		if (!*s || *s == '#')
			continue;
		if (!header) {
			if (strcmp(s, "tcps 1"))
				perr(&a, "expected the header 'tcps 1'");
			header = true;
		} else if (tcp_lit(&s, "meta")) {
			parse_meta(&a, p, s);
		} else if (tcp_lit(&s, "tensor ")) {
			parse_tensor(&a, p, s);
		} else if (tcp_lit(&s, "prep ")) {
			if (p->prep_len) {
				perr(&a, "a second prep line");
				break;
			}
			p->prep_len = strlen(s);
			p->prep = ctx_alloc(ctx, p->prep_len + 1);
			memcpy(p->prep, s, p->prep_len);
		} else if (tcp_lit(&s, "const ")) {
			size_t h = strlen(s);
			if (h % 2) {
				perr(&a, "odd number of hex digits");
				break;
			}
			for (size_t i = 0; i < h; i += 2) {
				unsigned x;
				if (!isxdigit((unsigned char)s[i]) || !isxdigit((unsigned char)s[i + 1]) || sscanf(s + i, "%2x", &x) != 1) {
					perr(&a, "bad hex digit");
					break;
				}
				if (p->nconst + 1 > p->constcap) {
					int64_t nc = p->constcap ? p->constcap * 2 : 256;
					p->consts = ctx_realloc(ctx, p->consts, (size_t)p->constcap, (size_t)nc);
					p->constcap = nc;
				}
				p->consts[p->nconst++] = (uint8_t)x;
			}
		} else if (*s == '@') {
			int64_t at;
			s++;
			if (!pint(&s, &at) || at != p->ncode || !tcp_lit(&s, ": "))
				perr(&a, "instruction labels must count up from @0");
			else
				parse_insn(&a, p, s);
		} else {
			perr(&a, "unexpected line");
		}
	}
	ctx_free(ctx, line, lcap);
	if (!header && !a.bad)
		perr(&a, "empty assembly");
	if (a.bad) {
		tcp_prog_free(p);
		return NULL;
	}
	return p;
}
