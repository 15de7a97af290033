/* backend-tcp/compiler/sched_print.c: the schedule's text form
 * (docs/tcp-compiler.md 4.2). Every field that can differ from its default is
 * printed, so parse(print(s)) prints identically. Names and sources are
 * quoted with escapes: a name never changes the meaning of the text. */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/sched.h"
#include "backend-tcp/isa/text.h"

static void indent(tcp_sb *b, int d)
{
	for (int i = 0; i < d; i++)
		tcp_sbf(b, "  ");
}

static const char *scname(const tcp_sched *s, ts_id id)
{
	return id < s->nsc ? s->sc[id].name : "?";
}

static void print_header(tcp_sb *b, const tcp_sched *s)
{
	const ts_meta *m = &s->meta;
	tcp_sbf(b, "tcpsched 1\nmachine ");
	tcp_sb_quoted(b, s->machine_name ? s->machine_name : "");
	tcp_sbf(b,
		"\nmeta T=%" PRId64 " K=%" PRId64 " D=%" PRId64 " F=%" PRId64 " E=%" PRId64 " B=%" PRId64 " G=%" PRId64
		" nproj=%" PRId64 " router_e=%" PRId64 " wexp=%" PRId64 " act=%" PRId64 " rmacs=%" PRId64 " dtype=%s\n",
		m->T, m->K, m->D, m->F, m->E, m->B, m->G, m->nproj, m->router_E, m->wexp, m->act, m->rmacs,
		moe_dtype_name((moe_dtype)m->dtype));
	tcp_sbf(b, "features granted=0x%" PRIx64 " refused=0x%" PRIx64 "\n", s->granted, s->refused);
	for (int k = 0, n = 0; k < ts_nrewrites; k++)
		if (s->ran >> k & 1)
			tcp_sbf(b, "%s%s", n++ ? "," : "rewrites ", ts_rewrites[k].name);
	if (s->ran)
		tcp_sbf(b, "\n");
	if (s->reuse == TS_REUSE_ORDERED)
		tcp_sbf(b, "reuse ordered\n");
	if (m->prep)
		tcp_sbf(b, "prep %s\n", m->prep);
}

static void print_buf(tcp_sb *b, const tcp_sched *s, ts_id i)
{
	const ts_buf *u = &s->buf[i];
	tcp_sbf(b, "buf %%%u ", i);
	tcp_sb_quoted(b, u->name);
	tcp_sbf(b, " %s %s %s[", u->space < TCP_NSPACE ? ts_space_names[u->space] : "?",
		u->kind < TCP_NKIND ? tcp_kind_names[u->kind] : "?", moe_dtype_name((moe_dtype)u->dtype));
	for (int k = 0; k < u->rank; k++)
		tcp_sbf(b, "%s%" PRId64, k ? "," : "", u->shape[k]);
	tcp_sbf(b, "]");
	if (u->source[0]) {
		tcp_sbf(b, " src=");
		tcp_sb_quoted(b, u->source);
	}
	if (u->slots != 1)
		tcp_sbf(b, " slots=%u", u->slots);
	if (u->life == TS_LIFE_SPAN)
		tcp_sbf(b, " life=@%u..@%u", u->first, u->last);
	else if (u->life != TS_LIFE_PROGRAM)
		tcp_sbf(b, " life=%s", u->life < TS_NLIFE ? ts_life_names[u->life] : "?");
	const ts_layout *l = &u->layout;
	if (l->nslices || l->copies || l->slice_bytes || l->slice0 || l->split)
		tcp_sbf(b, " layout=%s(%u,%u,%u,%" PRId64 ")", l->split < TS_NSPLIT ? ts_split_names[l->split] : "?", l->slice0,
			l->nslices, l->copies, l->slice_bytes);
	if (u->feature)
		tcp_sbf(b, " feature=%u", u->feature);
	if (u->node != MOE_NONE)
		tcp_sbf(b, " node=%u", u->node);
	if (u->offset >= 0)
		tcp_sbf(b, " at=%" PRId64, u->offset);
	tcp_sbf(b, "\n");
}

static const char *const flag_names[8] = {"bf16x3", "acc", "xslice", "join", "e2m1", "i4", "scaled", "vrows"};

static void print_insn(tcp_sb *b, const tcp_sched *s, const tcp_insn *in)
{
	if (in->ndim) {
		tcp_sbf(b, " dims=[");
		for (int k = 0; k < in->ndim && k < TCP_MAXD; k++)
			tcp_sbf(b, "%s%" PRId64, k ? "," : "", in->dim[k]);
		tcp_sbf(b, "]");
	}
	if (in->flags) {
		tcp_sbf(b, " flags=");
		for (int k = 0, n = 0; k < 8; k++)
			if (in->flags & (1u << k))
				tcp_sbf(b, "%s%s", n++ ? "," : "", flag_names[k]);
	}
	if (in->vreg >= 0)
		tcp_sbf(b, " valid=$%s", scname(s, (ts_id)in->vreg));
	if (in->imm)
		tcp_sbf(b, " imm=%" PRId64, in->imm);
	const char *reg[TCP_NVIEW];
	for (int w = 0; w < TCP_NVIEW; w++)
		reg[w] = in->v[w].reg >= 0 ? scname(s, (ts_id)in->v[w].reg) : NULL;
	tcp_sb_insn_tail(b, in, reg);
}

static void print_op(tcp_sb *b, const tcp_sched *s, ts_id i, int d)
{
	const ts_op *o = &s->op[i];
	indent(b, d);
	tcp_sbf(b, "op @%u %s ph=%s", i, o->in.op < TCP_OP_COUNT ? tcp_op_names[o->in.op] : "?",
		o->phase < TS_NPHASE ? ts_phase_names[o->phase] : "?");
	if (o->feature)
		tcp_sbf(b, " feature=%u", o->feature);
	if (o->node != MOE_NONE)
		tcp_sbf(b, " node=%u", o->node);
	if (o->cost)
		tcp_sbf(b, " cost=%" PRId64, o->cost);
	print_insn(b, s, &o->in);
	if (o->ndep) {
		tcp_sbf(b, " deps=[");
		for (uint32_t k = 0; k < o->ndep; k++)
			tcp_sbf(b, "%s@%u%s", k ? "," : "", o->dep[k], o->dist[k] ? "^1" : "");
		tcp_sbf(b, "]");
	}
	tcp_sbf(b, "\n");
}


static void print_scalar(tcp_sb *b, const tcp_sched *s, ts_id i, int d)
{
	const ts_scalar *c = &s->sc[i];
	indent(b, d);
	tcp_sbf(b, "$%s = ", c->name);
	switch (c->kind) {
	case TS_SC_CONST: tcp_sbf(b, "const %" PRId64, c->imm); break;
	case TS_SC_SPM_LD:
		tcp_sbf(b, "ld %%%u[", c->buf);
		if (c->a != TS_NONE)
			tcp_sbf(b, "$%s]", scname(s, c->a));
		else
			tcp_sbf(b, "%" PRId64 "]", c->imm);
		break;
	case TS_SC_ALU:
	case TS_SC_CMP:
		if (c->kind == TS_SC_ALU)
			tcp_sbf(b, "alu.%s $%s, ", c->op < TCP_S_COUNT ? tcp_sop_names[c->op] : "?", scname(s, c->a));
		else
			tcp_sbf(b, "cmp.%s $%s, ", c->op < TCP_C_COUNT ? tcp_cond_names[c->op] : "?", scname(s, c->a));
		if (c->b != TS_NONE)
			tcp_sbf(b, "$%s", scname(s, c->b));
		else
			tcp_sbf(b, "%" PRId64, c->imm);
		break;
	case TS_SC_LOOPVAR: tcp_sbf(b, "loopvar $%s, $%s", scname(s, c->a), scname(s, c->b)); break;
	case TS_SC_LOOPIDX: tcp_sbf(b, "loopidx %" PRId64, c->imm); break;
	default: tcp_sbf(b, "?"); break;
	}
	tcp_sbf(b, "\n");
}

static void print_region(tcp_sb *b, const tcp_sched *s, ts_id r, int d, int depth);

static void print_items(tcp_sb *b, const tcp_sched *s, ts_id r, int d, int depth)
{
	const ts_region *g = &s->rg[r];
	for (uint32_t k = 0; k < g->nitem && !b->bad; k++) {
		uint32_t it = g->item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP && id < s->nop)
			print_op(b, s, id, d);
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC && id < s->nsc)
			print_scalar(b, s, id, d);
		else if (TS_ITEM_KIND(it) == TS_ITEM_RG && id < s->nrg)
			print_region(b, s, id, d, depth + 1);
		else {
			indent(b, d);
			tcp_sbf(b, "?\n");
		}
	}
}

static void print_part(tcp_sb *b, const tcp_sched *s, const char *name, ts_id r, int d, int depth)
{
	indent(b, d);
	tcp_sbf(b, "%s {\n", name);
	if (r < s->nrg)
		print_items(b, s, r, d + 1, depth + 1);
	indent(b, d);
	tcp_sbf(b, "}\n");
}

/* depth bounds the recursion: a schedule the verifier has not accepted may
 * hold a cycle of regions (a verified one nests at most 64 deep) */
static void print_region(tcp_sb *b, const tcp_sched *s, ts_id r, int d, int depth)
{
	const ts_region *g = &s->rg[r];
	indent(b, d);
	if (depth > 256) {
		tcp_sbf(b, "...\n");
		return;
	}
	switch (g->kind) {
	case TS_RG_GUARD: tcp_sbf(b, "guard $%s {\n", scname(s, g->pred)); break;
	case TS_RG_TIER: tcp_sbf(b, "tier {\n"); break;
	case TS_RG_CLASSES:
		tcp_sbf(b, "classes $%s [", scname(s, g->pred));
		for (uint32_t k = 0; k < g->nbound; k++)
			tcp_sbf(b, "%s%" PRId64, k ? ", " : "", g->bound[k]);
		tcp_sbf(b, "] {\n");
		for (uint32_t k = 0; k < g->nitem; k++) {
			uint32_t it = g->item[k];
			char nm[32];
			snprintf(nm, sizeof nm, "case %" PRId64, k < g->nbound ? g->bound[k] : -1);
			print_part(b, s, nm, TS_ITEM_KIND(it) == TS_ITEM_RG ? TS_ITEM_ID(it) : TS_NONE, d + 1, depth);
		}
		indent(b, d);
		tcp_sbf(b, "}\n");
		return;
	case TS_RG_LOOP: {
		const ts_loop *l = g->loop < (uint32_t)s->nloop ? &s->loop[g->loop] : NULL;
		if (!l) {
			tcp_sbf(b, "loop ?\n");
			return;
		}
		tcp_sbf(b, "loop %u grid=%" PRId64 " nb=$%s g=$%s", g->loop, l->G, scname(s, l->nb), scname(s, l->g));
		if (l->expert != TS_NONE)
			tcp_sbf(b, " expert=$%s", scname(s, l->expert));
		if (l->rows != TS_NONE)
			tcp_sbf(b, " rows=$%s", scname(s, l->rows));
		tcp_sbf(b, " weights=%s prefetch=%u ring=%u row_slots=%u {\n",
			l->weights < TS_NWEIGHTS ? ts_weights_names[l->weights] : "?", l->prefetch, l->ring, l->row_slots);
		print_part(b, s, "prologue", l->prologue, d + 1, depth);
		print_part(b, s, "body", l->body, d + 1, depth);
		print_part(b, s, "epilogue", l->epilogue, d + 1, depth);
		indent(b, d);
		tcp_sbf(b, "}\n");
		return;
	}
	default: tcp_sbf(b, "seq {\n"); break;
	}
	print_items(b, s, r, d + 1, depth);
	indent(b, d);
	tcp_sbf(b, "}\n");
}

static void print_sched(tcp_sb *b, const tcp_sched *s)
{
	print_header(b, s);
	for (ts_id i = 0; i < s->nbuf; i++)
		print_buf(b, s, i);
	if (s->top < s->nrg)
		print_items(b, s, s->top, 0, 0);
}

moe_status tcp_sched_print(const tcp_sched *s, char **out, size_t *len)
{
	tcp_sb b = {.ctx = s->ctx};
	print_sched(&b, s);
	if (b.bad || !b.s) {
		ctx_free(s->ctx, b.s, b.cap);
		return MOE_ERR_NOMEM;
	}
	*out = b.s;
	*len = b.n;
	return MOE_OK;
}

moe_status tcp_sched_fprint(const tcp_sched *s, FILE *f)
{
	char *t;
	size_t n;
	moe_status st = tcp_sched_print(s, &t, &n);
	if (st != MOE_OK)
		return st;
	size_t w = fwrite(t, 1, n, f);
	ctx_free(s->ctx, t, n);
	return w == n ? MOE_OK : MOE_ERR_IO;
}
