/* backend-tcp/compiler/tier.c: a serving program with a decode tier (docs/tcp-isa.md
 * section 7.4, "Decode tier").
 *
 * A serving program compiled for T_max runs every n <= T_max through its
 * guarded grid; at n = 1 its routing still pays a tile of every row-wise
 * pass and the T x K dispatch. The tier is the same layer compiled for T = 1
 * (the decode grid: K one-row blocks, no index generation), linked into the
 * serving program behind a guard on the staged n_tokens:
 *
 *   dma.spm n_tokens; ld rA, n_tokens; li rB, 0; br.eq rA, rB, HALT
 *   li rB, 1; br.ne rA, rB, GEN
 *   li rA, 0; li rB, 0
 *   tier code before its expert region         (routing)
 *   jmp TIER_EXPERTS
 *   GEN: li rA, 0; li rB, 0
 *   serving code                                (unchanged, relocated)
 *   HALT: halt
 *   TIER_EXPERTS: the tier's code from the branch that skips its block
 *               loop on (block loop, combine, halt)
 *
 * The two versions share the bound tensors (x, n_tokens, weights, packed
 * weights, the output): the tier reads row 0 of x and writes row 0 of the
 * output (both row-major, so the tier's [1, D] views are those rows); output
 * rows 1.. are the zeroed buffer the runtime binds, as for every serving run
 * (docs/tcp-isa.md 7.4). Its other tensors (DM, TRF, VRF, HBM scratch and
 * constants) are its own, appended to the table: its HBM scratch is moved
 * past the serving program's HBM (bound tensors persist between calls); its
 * DM, TRF and VRF bytes may overlap the serving version's, which never runs
 * in the same call. The layout keeps the
 * serving program's block body as the program's block body, so a
 * timing-only run computes the routing of both versions and neither's expert
 * arithmetic; tier_loop_pc and tier_bexp_t give the simulator the tier's
 * block loop for its statistics. */
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"

enum { RA = 12, RB = 13 }; /* guard registers; zeroed again on both paths */
#define HBM_ALIGN ((int64_t)1 << 20) /* the tier's HBM scratch starts on a MiB (a multiple of any granule) */

typedef struct tl {
	moe_ctx *ctx;
	const tcp_program *s, *d;
	tcp_program *p;
	int32_t *tmap;  /* tier tensor -> linked tensor, -1: unused */
	int64_t s_at;   /* first pc of the serving code */
	int64_t d_pre;  /* first pc of the tier's code before its split (routing) */
	int64_t d_post; /* first pc of the tier's code from its split on */
	int64_t d_split; /* the tier's first pc after the split: its expert region */
} tl;

static bool bound(int kind)
{
	return kind == TCP_T_INPUT || kind == TCP_T_WEIGHT || kind == TCP_T_OUTPUT || kind == TCP_T_PACKED;
}

static bool refuse(tl *c, const char *why, const char *name)
{
	moe_diag(c->ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: cannot link the decode tier: %s%s%s%s", why,
		name ? " ('" : "", name ? name : "", name ? "')" : "");
	return false;
}

static bool referenced(const tcp_program *p, int32_t t)
{
	if (t == p->nblocks_t || t == p->bexp_t)
		return true;
	for (uint32_t pc = 0; pc < p->ncode; pc++)
		for (int w = 0; w < TCP_NVIEW; w++)
			if (p->code[pc].v[w].t == t)
				return true;
	return false;
}

/* The serving tensor that tier tensor dt is bound as: same name and kind
 * and dtype; weights the same shape; token tensors (x, the output) the
 * serving shape with fewer rows (the tier's rows are its first rows). */
static int32_t shared_tensor(tl *c, const tcp_tensor *dt)
{
	for (uint32_t i = 0; i < c->s->nt; i++) {
		const tcp_tensor *st = &c->s->t[i];
		if (st->kind != dt->kind || strcmp(st->name, dt->name) || st->dtype != dt->dtype || st->rank != dt->rank)
			continue;
		bool ok = dt->rank == 0 || dt->shape[0] == st->shape[0] ||
			  ((dt->kind == TCP_T_INPUT || dt->kind == TCP_T_OUTPUT) && dt->shape[0] <= st->shape[0]);
		for (int k = 1; k < dt->rank; k++)
			ok &= dt->shape[k] == st->shape[k];
		return ok ? (int32_t)i : -2;
	}
	return -1;
}

/* The part of a weight-packing graph (IR JSON of one layer) from its nodes
 * on: the computation. What precedes it, the layer's dims and graph
 * attributes, records T and the grid, which differ between the versions. */
static const char *prep_nodes(const tcp_program *p, size_t *len)
{
	static const char key[] = "\"nodes\":[";
	const char *s = p->prep_len ? strstr(p->prep, key) : NULL; /* NUL-terminated, none inside */
	*len = s ? p->prep_len - (size_t)(s - p->prep) : 0;
	return s;
}

/* Past a source location ("loc":{...}, no nested braces) at s, if one starts there. */
static const char *skip_loc(const char *s, const char *end)
{
	static const char key[] = "\"loc\":{";
	if ((size_t)(end - s) < sizeof key - 1 || memcmp(s, key, sizeof key - 1))
		return s;
	const char *c = memchr(s, '}', (size_t)(end - s));
	return c ? c + 1 : end;
}

/* The same computation: the texts equal but for the nodes' source
 * locations (a serving version declares n_tokens, which moves the lines). */
static bool same_packing(const tcp_program *a, const tcp_program *b)
{
	size_t na, nb;
	const char *pa = prep_nodes(a, &na), *pb = prep_nodes(b, &nb);
	if (!a->prep_len || !b->prep_len)
		return a->prep_len == b->prep_len;
	if (!pa || !pb)
		return false;
	const char *ea = pa + na, *eb = pb + nb;
	while (pa < ea && pb < eb) {
		pa = skip_loc(pa, ea);
		pb = skip_loc(pb, eb);
		if (pa == ea || pb == eb || *pa != *pb)
			break;
		pa++;
		pb++;
	}
	return pa == ea && pb == eb;
}

static bool map_tensors(tl *c)
{
	const tcp_program *d = c->d;
	if (!same_packing(d, c->s)) {
		/* not an error: the serving program stands alone (a note says why) */
		moe_diag(c->ctx, MOE_DIAG_NOTE, moe_loc_none(),
			"tcp: no decode tier: the T = 1 program packs its weights differently from the serving program");
		return false;
	}
	for (uint32_t i = 0; i < c->s->nt; i++) { /* the serving table first, unchanged */
		const tcp_tensor *st = &c->s->t[i];
		int32_t t = tcp_add_tensor(c->p, st->name, st->space, st->kind, (moe_dtype)st->dtype, st->rank, st->shape);
		tcp_set_source(c->p, t, st->source);
		c->p->t[t].addr = st->addr;
		c->p->t[t].slice_bytes = st->slice_bytes;
		c->p->t[t].const_off = st->const_off;
	}
	int64_t cbase = c->s->nconst, hend = 0, hmin = INT64_MAX;
	for (uint32_t i = 0; i < c->s->nt; i++) /* the end of the serving program's HBM */
		if (c->s->t[i].space == TCP_HBM) {
			int64_t e = c->s->t[i].addr + c->s->t[i].numel * (int64_t)moe_dtype_size((moe_dtype)c->s->t[i].dtype);
			hend = e > hend ? e : hend;
		}
	for (uint32_t i = 0; i < d->nt; i++)
		if (d->t[i].space == TCP_HBM && !bound(d->t[i].kind) && d->t[i].addr < hmin)
			hmin = d->t[i].addr;
	hend = (hend + HBM_ALIGN - 1) / HBM_ALIGN * HBM_ALIGN;
	for (uint32_t i = 0; i < d->nt; i++) {
		const tcp_tensor *dt = &d->t[i];
		c->tmap[i] = -1;
		if (!referenced(d, (int32_t)i))
			continue; /* the tier's own n_tokens input (renamed away) and the like */
		if (bound(dt->kind)) {
			c->tmap[i] = shared_tensor(c, dt);
			if (c->tmap[i] < 0)
				return refuse(c, c->tmap[i] == -1 ? "the tier binds a tensor the serving program does not have"
								  : "a tensor bound by both versions differs in shape",
					dt->name);
			continue;
		}
		int32_t t = tcp_add_tensor(c->p, dt->name, dt->space, dt->kind, (moe_dtype)dt->dtype, dt->rank, dt->shape);
		/* HBM scratch past the serving program's HBM, keeping its layout
		 * (the bound tensors stay where they are: both versions read them) */
		c->p->t[t].addr = dt->space == TCP_HBM ? hend + (dt->addr - hmin) : dt->addr;
		c->p->t[t].slice_bytes = dt->slice_bytes;
		c->p->t[t].const_off = dt->kind == TCP_T_CONST ? cbase + dt->const_off : dt->const_off;
		c->tmap[i] = t;
	}
	int64_t n = c->s->nconst + d->nconst;
	c->p->consts = ctx_alloc(c->ctx, n > 0 ? (size_t)n : 1);
	c->p->constcap = n > 0 ? n : 1;
	c->p->nconst = n;
	if (c->s->nconst)
		memcpy(c->p->consts, c->s->consts, (size_t)c->s->nconst);
	if (d->nconst)
		memcpy(c->p->consts + cbase, d->consts, (size_t)d->nconst);
	if (c->s->prep_len) {
		c->p->prep = ctx_alloc(c->ctx, c->s->prep_len + 1);
		memcpy(c->p->prep, c->s->prep, c->s->prep_len);
		c->p->prep_len = c->s->prep_len;
	}
	return true;
}

static int64_t spc(const tl *c, int64_t pc)
{
	return c->s_at + pc;
}

static int64_t dpc(const tl *c, int64_t pc)
{
	return pc < c->d_split ? c->d_pre + pc : c->d_post + (pc - c->d_split);
}

/* The tier's split: the branch before its block loop that skips the whole
 * loop (the start of its expert region, as the simulator finds it), else
 * its block body. */
static int64_t tier_split(const tcp_program *d)
{
	int64_t hi = -1;
	for (uint32_t i = (uint32_t)d->block_loop_pc; i < d->ncode; i++)
		if (d->code[i].op == TCP_OP_BR && d->code[i].target == d->block_loop_pc)
			hi = i;
	for (int32_t i = d->block_loop_pc; hi >= 0 && i-- > 0;)
		if (d->code[i].op == TCP_OP_BR && d->code[i].target == hi + 1)
			return i;
	return d->block_body_pc;
}

/* Instruction in of the serving (tier false) or tier version, relocated. */
static void copy_insn(tl *c, const tcp_insn *in, bool tier)
{
	tcp_insn r = *in;
	if (in->op == TCP_OP_BR || in->op == TCP_OP_JMP)
		r.target = (int32_t)(tier ? dpc(c, in->target) : spc(c, in->target));
	for (int w = 0; w < TCP_NVIEW && tier; w++)
		if (r.v[w].t >= 0)
			r.v[w].t = c->tmap[r.v[w].t];
	tcp_emit(c->p, &r);
}

static void li0(tcp_program *p, int r, int64_t v)
{
	tcp_insn in = tcp_insn_init(TCP_OP_LI);
	in.rd = (uint8_t)r;
	in.imm = v;
	tcp_emit(p, &in);
}

static void jump(tcp_program *p, tcp_opcode op, int cond, int64_t target)
{
	tcp_insn in = tcp_insn_init(op);
	if (op == TCP_OP_BR) {
		in.sop = (uint8_t)cond;
		in.ra = RA;
		in.rb = RB;
	}
	in.target = (int32_t)target;
	tcp_emit(p, &in);
}

static void emit_code(tl *c, int32_t ntok)
{
	const tcp_program *s = c->s, *d = c->d;
	int64_t dbody = c->d_split;
	c->d_pre = 8; /* after the guards (6) and the zeroing (2) */
	int64_t gen = c->d_pre + dbody + 1;
	c->s_at = gen + 2;
	c->d_post = c->s_at + s->ncode + 1;
	tcp_insn spm = tcp_insn_init(TCP_OP_DMA_SPM);
	spm.ndim = 1;
	spm.dim[0] = 1;
	spm.v[TCP_V_S0].t = ntok;
	tcp_emit(c->p, &spm);
	tcp_insn ld = tcp_insn_init(TCP_OP_LD);
	ld.rd = RA;
	ld.v[TCP_V_S0].t = ntok;
	tcp_emit(c->p, &ld);
	li0(c->p, RB, 0); /* n = 0: nothing to compute, the output is the zeroed buffer */
	jump(c->p, TCP_OP_BR, TCP_C_EQ, c->d_post - 1);
	li0(c->p, RB, 1);
	jump(c->p, TCP_OP_BR, TCP_C_NE, gen);
	li0(c->p, RA, 0);
	li0(c->p, RB, 0);
	IR_ASSERT((int64_t)c->p->ncode == c->d_pre);
	for (int64_t pc = 0; pc < dbody; pc++)
		copy_insn(c, &d->code[pc], true);
	jump(c->p, TCP_OP_JMP, 0, c->d_post);
	IR_ASSERT((int64_t)c->p->ncode == gen);
	li0(c->p, RA, 0);
	li0(c->p, RB, 0);
	for (uint32_t pc = 0; pc < s->ncode; pc++)
		copy_insn(c, &s->code[pc], false);
	tcp_insn h = tcp_insn_init(TCP_OP_HALT);
	tcp_emit(c->p, &h);
	IR_ASSERT((int64_t)c->p->ncode == c->d_post);
	for (uint32_t pc = (uint32_t)dbody; pc < d->ncode; pc++)
		copy_insn(c, &d->code[pc], true);
}

static int32_t tokens_tensor(const tcp_program *p)
{
	for (uint32_t i = 0; i < p->nt; i++)
		if (p->t[i].kind == TCP_T_INPUT && !strcmp(p->t[i].name, MOE_TOKENS_INPUT) && p->t[i].dtype == MOE_I32 &&
			p->t[i].rank == 0 && p->t[i].space == TCP_HBM)
			return (int32_t)i;
	return -1;
}

static tcp_program *link_tier(moe_ctx *ctx, const tcp_program *s, const tcp_program *d)
{
	tl c = {.ctx = ctx, .s = s, .d = d};
	int32_t ntok = tokens_tensor(s);
	if (ntok < 0 || s->moe_T <= 1 || s->tier_n) {
		refuse(&c, "the program is not a serving program of T > 1 without a tier", NULL);
		return NULL;
	}
	if (d->moe_T != 1 || tokens_tensor(d) >= 0 || d->tier_n || d->block_body_pc < 0 || d->block_loop_pc < 0 ||
		s->block_body_pc < 0 || d->moe_D != s->moe_D || d->moe_E != s->moe_E || d->moe_K != s->moe_K ||
		d->dtype != s->dtype) {
		refuse(&c, "the tier must be the same layer compiled for T = 1 without n_tokens", NULL);
		return NULL;
	}
	for (uint32_t pc = 0; pc < s->ncode; pc++)
		if ((s->code[pc].op == TCP_OP_BR || s->code[pc].op == TCP_OP_JMP) && s->code[pc].target >= (int32_t)s->ncode) {
			refuse(&c, "a branch of the serving program leaves its code", NULL);
			return NULL;
		}
	c.d_split = tier_split(d);
	c.p = tcp_prog_new(ctx);
	c.tmap = ctx_alloc(ctx, (d->nt + 1) * sizeof *c.tmap);
	bool ok = map_tensors(&c);
	int32_t tbexp = ok && d->bexp_t >= 0 ? c.tmap[d->bexp_t] : -1;
	if (ok)
		emit_code(&c, ntok);
	ctx_free(ctx, c.tmap, (d->nt + 1) * sizeof *c.tmap);
	if (!ok) {
		tcp_prog_free(c.p);
		return NULL;
	}
	tcp_program *p = c.p;
	p->moe_T = s->moe_T, p->moe_K = s->moe_K, p->moe_D = s->moe_D, p->moe_F = s->moe_F, p->moe_E = s->moe_E;
	p->moe_B = s->moe_B, p->moe_G = s->moe_G, p->nproj = s->nproj, p->router_E = s->router_E;
	p->dtype = s->dtype;
	p->nblocks_t = s->nblocks_t;
	p->bexp_t = s->bexp_t;
	p->weight_bytes_per_expert = s->weight_bytes_per_expert;
	p->act_bytes = s->act_bytes;
	p->router_macs = s->router_macs;
	p->block_loop_pc = s->block_loop_pc >= 0 ? (int32_t)spc(&c, s->block_loop_pc) : -1;
	p->block_body_pc = (int32_t)spc(&c, s->block_body_pc);
	p->tier_n = 1;
	p->tier_loop_pc = (int32_t)dpc(&c, d->block_loop_pc);
	p->tier_bexp_t = tbexp;
	tcp_phase_infer(p); /* the linked program's loops, both grids' expert work */
	return p;
}

moe_tcp_program *moe_tcp_link_tier(moe_ctx *ctx, const moe_tcp_program *serving, const moe_tcp_program *tier)
{
	if (!ctx || !serving || !tier)
		return NULL;
	CTX_GUARDED(ctx, moe_tcp_program *, NULL, link_tier(ctx, serving, tier));
}
