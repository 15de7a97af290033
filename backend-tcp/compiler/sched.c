/* backend-tcp/compiler/sched.c: building a schedule (sched.h). Every array
 * lives in the schedule's arena and grows by doubling; nothing is allocated
 * per op outside it. */
#include <string.h>

#include "backend-tcp/compiler/rewrites.h"
#include "backend-tcp/compiler/sched.h"
#include "ir/serial.h"

const char *const ts_phase_names[TS_NPHASE] = {"routing", "expert", "prefetch", "combine"};
const char *const ts_life_names[TS_NLIFE] = {"program", "span", "loop", "block"};
const char *const ts_split_names[TS_NSPLIT] = {"flit", "rows", "cols"};
const char *const ts_weights_names[TS_NWEIGHTS] = {"double", "single", "stream"};
const char *const ts_space_names[TCP_NSPACE] = {"hbm", "dm", "trf", "vrf"};

/* Grow *arr (n used, *cap slots of esz bytes) in the arena to hold n + 1. */
static void grow(tcp_sched *s, void **arr, uint32_t n, uint32_t *cap, size_t esz)
{
	if (n < *cap)
		return;
	IR_ASSERT(n < TS_MAX_OBJECTS);
	uint32_t nc = *cap ? *cap * 2 : 16;
	void *na = ir_alloc(&s->arena, (size_t)nc * esz);
	if (*arr)
		memcpy(na, *arr, (size_t)n * esz);
	*arr = na;
	*cap = nc;
}

tcp_sched *tcp_sched_new(moe_ctx *ctx, const moe_tcp_machine *m)
{
	tcp_sched *s = ctx_alloc(ctx, sizeof *s);
	s->ctx = ctx;
	s->m = m;
	ir_arena_init(&s->arena, ctx);
	s->machine_name = ir_strdup(&s->arena, m ? m->name : "");
	s->meta.dtype = MOE_BF16;
	s->top = ts_add_region(s, TS_NONE, TS_RG_SEQ, TS_NONE);
	return s;
}

void tcp_sched_free(tcp_sched *s)
{
	if (!s)
		return;
	moe_ctx *ctx = s->ctx;
	ir_arena_free(&s->arena);
	ctx_free(ctx, s, sizeof *s);
}

ts_id ts_add_buf(tcp_sched *s, const char *name, int space, int kind, moe_dtype dt, int rank, const int64_t *shape)
{
	grow(s, (void **)&s->buf, s->nbuf, &s->cbuf, sizeof *s->buf);
	ts_buf *b = &s->buf[s->nbuf];
	memset(b, 0, sizeof *b);
	b->name = ir_strdup(&s->arena, name ? name : "");
	b->source = "";
	b->space = (uint8_t)space;
	b->kind = (uint8_t)kind;
	b->dtype = (uint8_t)dt;
	b->rank = (uint8_t)(rank < 0 ? 0 : rank > MOE_MAX_RANK ? MOE_MAX_RANK : rank);
	for (int k = 0; k < b->rank; k++)
		b->shape[k] = shape[k];
	b->slots = 1;
	b->life = TS_LIFE_PROGRAM;
	b->first = b->last = TS_NONE;
	b->offset = -1;
	b->node = MOE_NONE;
	return s->nbuf++;
}

void ts_set_source(tcp_sched *s, ts_id b, const char *source)
{
	IR_ASSERT(b < s->nbuf);
	s->buf[b].source = ir_strdup(&s->arena, source ? source : "");
}

void ts_region_push(tcp_sched *s, ts_id rg, uint32_t item)
{
	IR_ASSERT(rg < s->nrg);
	ts_region *r = &s->rg[rg];
	grow(s, (void **)&r->item, r->nitem, &r->cap, sizeof *r->item);
	r->item[r->nitem++] = item;
}

void ts_region_insert(tcp_sched *s, ts_id rg, uint32_t at, uint32_t item)
{
	IR_ASSERT(rg < s->nrg && at <= s->rg[rg].nitem);
	ts_region_push(s, rg, item);
	ts_region *r = &s->rg[rg];
	memmove(r->item + at + 1, r->item + at, (r->nitem - 1 - at) * sizeof *r->item);
	r->item[at] = item;
}

uint32_t ts_region_unlink(tcp_sched *s, ts_id rg, uint32_t item)
{
	ts_region *r = &s->rg[rg];
	uint32_t k = 0;
	while (k < r->nitem && r->item[k] != item)
		k++;
	if (k == r->nitem)
		return UINT32_MAX;
	memmove(r->item + k, r->item + k + 1, (r->nitem - k - 1) * sizeof *r->item);
	r->nitem--;
	return k;
}

void ts_region_move_tail(tcp_sched *s, ts_id rg, uint32_t at, uint32_t n)
{
	ts_region *r = &s->rg[rg];
	IR_ASSERT(rg < s->nrg && n <= 8 && at + n <= r->nitem);
	uint32_t tail[8];
	memcpy(tail, r->item + r->nitem - n, n * sizeof *tail);
	memmove(r->item + at + n, r->item + at, (r->nitem - n - at) * sizeof *r->item);
	memcpy(r->item + at, tail, n * sizeof *tail);
}

ts_id ts_add_op(tcp_sched *s, ts_id rg, const tcp_insn *in, int phase)
{
	grow(s, (void **)&s->op, s->nop, &s->cop, sizeof *s->op);
	ts_op *o = &s->op[s->nop];
	memset(o, 0, sizeof *o);
	o->in = *in;
	o->ctx = in->op < TCP_OP_COUNT ? tcp_op_ctx[in->op] : TCP_CTX_CTL;
	o->phase = (uint8_t)phase;
	o->region = rg;
	o->node = MOE_NONE;
	if (rg != TS_NONE)
		ts_region_push(s, rg, TS_ITEM_OP | s->nop);
	return s->nop++;
}

void ts_add_dep(tcp_sched *s, ts_id op, ts_id on, int dist)
{
	IR_ASSERT(op < s->nop);
	ts_op *o = &s->op[op];
	IR_ASSERT(o->ndep < TS_MAX_DEPS);
	/* dep and dist grow together: capacities are the next power of two */
	if (o->ndep == 0 || (o->ndep >= 4 && (o->ndep & (o->ndep - 1)) == 0)) {
		uint32_t nc = o->ndep ? o->ndep * 2 : 4;
		ts_id *nd = ir_alloc(&s->arena, nc * sizeof *nd);
		uint8_t *nt = ir_alloc(&s->arena, nc);
		if (o->ndep) {
			memcpy(nd, o->dep, o->ndep * sizeof *nd);
			memcpy(nt, o->dist, o->ndep);
		}
		o->dep = nd;
		o->dist = nt;
	}
	o->dep[o->ndep] = on;
	o->dist[o->ndep++] = (uint8_t)dist;
}

static uint32_t name_hash(const char *n)
{
	uint32_t h = 2166136261u;
	for (; *n; n++)
		h = (h ^ (unsigned char)*n) * 16777619u;
	return h;
}

/* The scalar-name table: open addressing over ids + 1 (0: empty), at most
 * half full, rebuilt when it grows. */
static void name_insert(tcp_sched *s, ts_id id)
{
	if ((s->nsc + 1) * 2 > s->hcap) {
		uint32_t nc = s->hcap ? s->hcap * 2 : 64;
		s->hash = ir_alloc(&s->arena, nc * sizeof *s->hash);
		s->hcap = nc;
		for (uint32_t i = 0; i < s->nsc; i++)
			if (i != id)
				name_insert(s, i);
	}
	uint32_t k = name_hash(s->sc[id].name) & (s->hcap - 1);
	while (s->hash[k])
		k = (k + 1) & (s->hcap - 1);
	s->hash[k] = id + 1;
}

void ts_drop_scalars(tcp_sched *s, const uint8_t *drop)
{
	ts_id *map = ctx_alloc(s->ctx, (s->nsc + 1) * sizeof *map);
	ts_id n = 0;
	for (ts_id i = 0; i < s->nsc; i++)
		map[i] = drop[i] ? TS_NONE : n++;
#define SC_MAP(x) ((x) = (x) == TS_NONE || (x) >= s->nsc ? (x) : map[x])
	for (ts_id i = 0; i < s->nsc; i++) {
		if (map[i] == TS_NONE)
			continue;
		ts_scalar c = s->sc[i];
		SC_MAP(c.a);
		SC_MAP(c.b);
		if (s->sc_line)
			s->sc_line[map[i]] = s->sc_line[i];
		s->sc[map[i]] = c;
	}
	for (ts_id r = 0; r < s->nrg; r++) {
		ts_region *g = &s->rg[r];
		if (g->kind == TS_RG_GUARD || g->kind == TS_RG_CLASSES)
			SC_MAP(g->pred);
		uint32_t keep = 0;
		for (uint32_t k = 0; k < g->nitem; k++) {
			uint32_t it = g->item[k];
			if (TS_ITEM_KIND(it) == TS_ITEM_SC) {
				if (map[TS_ITEM_ID(it)] == TS_NONE)
					continue;
				it = TS_ITEM_SC | map[TS_ITEM_ID(it)];
			}
			g->item[keep++] = it;
		}
		g->nitem = keep;
	}
	for (int k = 0; k < s->nloop; k++) {
		ts_loop *l = &s->loop[k];
		SC_MAP(l->nb);
		SC_MAP(l->expert);
		SC_MAP(l->rows);
		SC_MAP(l->g);
	}
	for (ts_id o = 0; o < s->nop; o++) {
		tcp_insn *in = &s->op[o].in;
		if (in->vreg >= 0)
			in->vreg = (int32_t)map[in->vreg];
		for (int w = 0; w < TCP_NVIEW; w++)
			if (in->v[w].t >= 0 && in->v[w].reg >= 0)
				in->v[w].reg = (int32_t)map[in->v[w].reg];
	}
#undef SC_MAP
	s->nsc = n;
	if (s->hcap) {
		memset(s->hash, 0, s->hcap * sizeof *s->hash);
		for (ts_id i = 0; i < n; i++)
			name_insert(s, i);
	}
	ctx_free(s->ctx, map, 0);
}

bool ts_scalar_reads(const ts_scalar *y, ts_id id)
{
	bool two = y->kind == TS_SC_ALU || y->kind == TS_SC_CMP || y->kind == TS_SC_LOOPVAR;
	return (two && (y->a == id || y->b == id)) || (y->kind == TS_SC_SPM_LD && y->a == id);
}

bool ts_region_reads(const ts_region *r, ts_id id)
{
	return (r->kind == TS_RG_GUARD || r->kind == TS_RG_CLASSES) && r->pred == id;
}

bool ts_insn_reads(const tcp_insn *in, ts_id id)
{
	if (in->vreg >= 0 && (ts_id)in->vreg == id)
		return true;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (in->v[w].t >= 0 && in->v[w].reg >= 0 && (ts_id)in->v[w].reg == id)
			return true;
	return false;
}

ts_id ts_find_scalar(const tcp_sched *s, const char *name)
{
	if (!s->hcap)
		return TS_NONE;
	for (uint32_t k = name_hash(name) & (s->hcap - 1); s->hash[k]; k = (k + 1) & (s->hcap - 1))
		if (!strcmp(s->sc[s->hash[k] - 1].name, name))
			return s->hash[k] - 1;
	return TS_NONE;
}

bool ts_region_within(const tcp_sched *s, ts_id rg, ts_id in)
{
	for (int d = 0; rg < s->nrg && d < 256; d++, rg = s->rg[rg].parent)
		if (rg == in)
			return true;
	return false;
}

static int region_depth(const tcp_sched *s, ts_id r)
{
	int d = 0;
	for (; r < s->nrg && d < 256; r = s->rg[r].parent)
		d++;
	return d;
}

/* Their regions' innermost common region is a classes region, and each op
 * stands below a case of it (cx, cy: the regions just below it). */
bool ts_ops_exclusive(const tcp_sched *s, ts_id a, ts_id b)
{
	ts_id x = s->op[a].region, y = s->op[b].region, cx = TS_NONE, cy = TS_NONE;
	if (x == y)
		return false;
	int dx = region_depth(s, x), dy = region_depth(s, y);
	for (; dx > dy; dx--)
		cx = x, x = s->rg[x].parent;
	for (; dy > dx; dy--)
		cy = y, y = s->rg[y].parent;
	while (x != y && x < s->nrg && y < s->nrg) {
		cx = x, x = s->rg[x].parent;
		cy = y, y = s->rg[y].parent;
	}
	return x == y && x < s->nrg && s->rg[x].kind == TS_RG_CLASSES && cx != TS_NONE && cy != TS_NONE;
}

void ts_excl_init(ts_excl *x, const tcp_sched *s)
{
	*x = (ts_excl){s, NULL};
	if (!s->nrg || s->nrg > 2048)
		return;
	x->t = ctx_alloc(s->ctx, (size_t)s->nrg * s->nrg); /* zeroed: nothing asked */
}

void ts_excl_free(ts_excl *x)
{
	if (x->t)
		ctx_free(x->s->ctx, x->t, 0);
	x->t = NULL;
}

bool ts_op_has_dep(const ts_op *p, ts_id on, int dist)
{
	for (uint32_t k = 0; k < p->ndep; k++)
		if (p->dep[k] == on && p->dist[k] == dist)
			return true;
	return false;
}

void ts_add_dep_once(tcp_sched *s, ts_id op, ts_id on, int dist)
{
	if (!ts_op_has_dep(&s->op[op], on, dist))
		ts_add_dep(s, op, on, dist);
}

bool ts_op_in_loop(const tcp_sched *s, ts_id o)
{
	for (int l = 0; l < s->nloop; l++)
		if (ts_region_within(s, s->op[o].region, s->loop[l].region))
			return true;
	return false;
}

bool ts_buf_spm_read(const tcp_sched *s, ts_id b)
{
	for (ts_id k = 0; k < s->nsc; k++)
		if (s->sc[k].kind == TS_SC_SPM_LD && s->sc[k].buf == b)
			return true;
	return false;
}

int64_t ts_buf_numel(const ts_buf *b)
{
	int64_t n = 1;
	for (int k = 0; k < b->rank; k++)
		n *= b->shape[k];
	return n;
}

void ts_view_span(const tcp_insn *in, const tcp_view *v, int64_t *lo, int64_t *hi)
{
	int64_t a = v->base, b = v->base;
	for (int k = 0; k < in->ndim; k++) {
		int64_t d = (in->dim[k] - 1) * v->stride[k];
		if (d < 0)
			a += d;
		else
			b += d;
	}
	*lo = a;
	*hi = b + 1;
}

bool ts_views_may_meet(const tcp_insn *a, const tcp_view *va, const tcp_insn *b, const tcp_view *vb)
{
	if (va->reg >= 0 || vb->reg >= 0)
		return true;
	int64_t alo, ahi, blo, bhi;
	ts_view_span(a, va, &alo, &ahi);
	ts_view_span(b, vb, &blo, &bhi);
	return alo < bhi && blo < ahi;
}

static bool pow2(int64_t n)
{
	return n > 0 && !(n & (n - 1));
}

/* scalar reg as `alu.OP $x, imm` (b absent), or NULL */
static const ts_scalar *alu_imm(const tcp_sched *s, int32_t reg, int op)
{
	const ts_scalar *c = reg >= 0 && (uint32_t)reg < s->nsc ? &s->sc[reg] : NULL;
	return c && c->kind == TS_SC_ALU && c->op == op && c->b == TS_NONE && c->a < s->nsc ? c : NULL;
}

/* Whether scalar x numbers the blocks' groups: the loop index, or a run
 * index (rewrite group-runs): `alu.add $v, $c` where loop variable $v
 * steps to x itself. */
static bool group_index(const tcp_sched *s, ts_id x)
{
	const ts_scalar *c = x < s->nsc ? &s->sc[x] : NULL;
	if (c && c->kind == TS_SC_LOOPIDX)
		return true;
	const ts_scalar *v = c && c->kind == TS_SC_ALU && c->op == TCP_S_ADD && c->b != TS_NONE && c->a < s->nsc ? &s->sc[c->a] : NULL;
	return v && v->kind == TS_SC_LOOPVAR && v->b == x;
}

bool ts_group_slot(const tcp_sched *s, int32_t reg, int64_t n)
{
	const ts_scalar *c = alu_imm(s, reg, TCP_S_AND);
	return c && n >= 4 && pow2(n) && c->imm == n - 1 && group_index(s, c->a);
}

bool ts_group_half(const tcp_sched *s, int32_t reg)
{
	const ts_scalar *m = alu_imm(s, reg, TCP_S_MIN);
	const ts_scalar *a = m && m->imm == 1 ? alu_imm(s, (int32_t)m->a, TCP_S_AND) : NULL;
	const ts_scalar *g = a && a->imm >= 2 && pow2(a->imm) ? alu_imm(s, (int32_t)a->a, TCP_S_ADD) : NULL;
	return g && g->imm == a->imm && group_index(s, g->a);
}

static void positions(const tcp_sched *s, ts_id r, uint32_t *pos, uint32_t *n, int depth)
{
	if (depth > 70)
		return;
	const ts_region *g = &s->rg[r];
	if (g->kind == TS_RG_LOOP) {
		const ts_loop *l = &s->loop[g->loop];
		positions(s, l->prologue, pos, n, depth + 1);
		positions(s, l->body, pos, n, depth + 1);
		positions(s, l->epilogue, pos, n, depth + 1);
	}
	for (uint32_t i = 0; i < g->nitem; i++) {
		uint32_t it = g->item[i], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP)
			pos[id] = (*n)++;
		else if (TS_ITEM_KIND(it) == TS_ITEM_RG)
			positions(s, id, pos, n, depth + 1);
	}
}

void ts_op_positions(const tcp_sched *s, uint32_t *pos)
{
	uint32_t n = 0;
	positions(s, s->top, pos, &n, 0);
}

static bool op_touches(const ts_op *o, ts_id b)
{
	for (int w = 0; w < TCP_NVIEW; w++)
		if (o->in.v[w].t >= 0 && (ts_id)o->in.v[w].t == b)
			return true;
	return false;
}

void ts_renew_spans(tcp_sched *s, moe_ctx *ctx, const uint32_t *old)
{
	uint32_t *now = ctx_alloc(ctx, (s->nop + 1) * sizeof *now);
	ts_op_positions(s, now);
	for (ts_id b = 0; b < s->nbuf; b++) {
		ts_buf *x = &s->buf[b];
		if (x->life != TS_LIFE_SPAN || x->first >= s->nop || x->last >= s->nop)
			continue;
		uint32_t lo = old[x->first], hi = old[x->last];
		ts_id f = x->first, l = x->last;
		if (now[l] < now[f])
			f = x->last, l = x->first;
		for (ts_id i = 0; i < s->nop; i++)
			if (old[i] >= lo && old[i] <= hi && op_touches(&s->op[i], b)) {
				f = now[i] < now[f] ? i : f;
				l = now[i] > now[l] ? i : l;
			}
		x->first = f;
		x->last = l;
	}
	ctx_free(ctx, now, 0);
}

ts_id ts_add_scalar(tcp_sched *s, ts_id rg, const char *name, int kind, int op, ts_id a, ts_id b, int64_t imm)
{
	grow(s, (void **)&s->sc, s->nsc, &s->csc, sizeof *s->sc);
	char buf[IR_NAME_MAX + 16];
	snprintf(buf, sizeof buf, "%s", name && *name ? name : "s");
	for (int k = 1; ts_find_scalar(s, buf) != TS_NONE; k++)
		snprintf(buf, sizeof buf, "%.*s.%d", IR_NAME_MAX - 12, name && *name ? name : "s", k);
	ts_scalar *c = &s->sc[s->nsc];
	memset(c, 0, sizeof *c);
	c->name = ir_strdup(&s->arena, buf);
	c->kind = (uint8_t)kind;
	c->op = (uint8_t)op;
	c->a = a;
	c->b = b;
	c->buf = TS_NONE;
	c->imm = imm;
	c->region = rg;
	name_insert(s, s->nsc);
	if (rg != TS_NONE)
		ts_region_push(s, rg, TS_ITEM_SC | s->nsc);
	return s->nsc++;
}

ts_id ts_add_region(tcp_sched *s, ts_id parent, int kind, ts_id pred)
{
	grow(s, (void **)&s->rg, s->nrg, &s->crg, sizeof *s->rg);
	ts_region *r = &s->rg[s->nrg];
	memset(r, 0, sizeof *r);
	r->kind = (uint8_t)kind;
	r->parent = parent;
	r->pred = pred;
	r->loop = UINT32_MAX;
	ts_id id = s->nrg++;
	if (parent != TS_NONE)
		ts_region_push(s, parent, TS_ITEM_RG | id);
	return id;
}

void ts_region_bounds(tcp_sched *s, ts_id rg, const int64_t *bound, uint32_t n)
{
	IR_ASSERT(rg < s->nrg && n <= TS_MAX_BOUNDS);
	ts_region *r = &s->rg[rg];
	r->bound = ir_alloc(&s->arena, (n ? n : 1) * sizeof *r->bound);
	memcpy(r->bound, bound, n * sizeof *r->bound);
	r->nbound = n;
}

ts_id ts_add_classes(tcp_sched *s, ts_id parent, uint32_t at, ts_id rows, const int64_t *bound, uint32_t n)
{
	ts_id c = ts_add_region(s, TS_NONE, TS_RG_CLASSES, rows);
	s->rg[c].parent = parent;
	ts_region_insert(s, parent, at, TS_ITEM_RG | c);
	ts_region_bounds(s, c, bound, n);
	for (uint32_t k = 0; k < n; k++)
		ts_add_region(s, c, TS_RG_SEQ, TS_NONE);
	return c;
}

int ts_add_loop(tcp_sched *s, ts_id parent, int64_t G, ts_id nb, ts_id g)
{
	IR_ASSERT(s->nloop < 2);
	int li = s->nloop++;
	ts_loop *l = &s->loop[li];
	memset(l, 0, sizeof *l);
	l->G = G;
	l->nb = nb;
	l->g = g;
	l->expert = l->rows = TS_NONE;
	l->weights = TS_W_DOUBLE;
	l->row_slots = 1;
	l->region = ts_add_region(s, parent, TS_RG_LOOP, TS_NONE);
	s->rg[l->region].loop = (uint32_t)li;
	/* the three parts are the LOOP region's children, not its items */
	l->prologue = ts_add_region(s, TS_NONE, TS_RG_SEQ, TS_NONE);
	l->body = ts_add_region(s, TS_NONE, TS_RG_SEQ, TS_NONE);
	l->epilogue = ts_add_region(s, TS_NONE, TS_RG_SEQ, TS_NONE);
	s->rg[l->prologue].parent = s->rg[l->body].parent = s->rg[l->epilogue].parent = l->region;
	return li;
}

/* ---- a copy without text (ts_clone) ----
 * The copy is what tcp_sched_parse makes of tcp_sched_print's text: regions
 * and scalars numbered in program order (unreachable ones dropped), ops
 * under their ids, every field the text does not carry at the reader's
 * default. Wherever the text would not read back (an id out of range, a
 * name the reader refuses, a scalar used before its definition, ...) the
 * copy gives up and the caller takes the text. */
enum { CL_MAX_DEPTH = 60, CL_MAX_QUOTED = 4096 };

typedef struct cl {
	const tcp_sched *s;
	tcp_sched *c;
	ts_id *smap;     /* old scalar -> new, TS_NONE until defined */
	ts_id *given;    /* op ids by reading order */
	uint8_t *seen;   /* ops met */
	bool bad;
} cl;

static bool cl_name_ok(const char *n)
{
	return strlen(n) <= IR_NAME_MAX && !ir_name_problem(IR_NAME_VALUE, n);
}

static bool cl_dtype_ok(uint8_t d)
{
	const char *n = moe_dtype_name((moe_dtype)d);
	return n && moe_dtype_from_name(n) == (int)d;
}

/* old scalar id (defined earlier in program order) -> new; bad otherwise */
static ts_id cl_sc(cl *x, ts_id id)
{
	if (id >= x->s->nsc || x->smap[id] == TS_NONE) {
		x->bad = true;
		return TS_NONE;
	}
	return x->smap[id];
}

static void cl_scalar(cl *x, ts_id rg, ts_id id)
{
	const ts_scalar *o = &x->s->sc[id];
	if (x->smap[id] != TS_NONE || !cl_name_ok(o->name) || ts_find_scalar(x->c, o->name) != TS_NONE) {
		x->bad = true;
		return;
	}
	ts_id a = TS_NONE, b = TS_NONE, buf = TS_NONE;
	int64_t imm = 0;
	int op = 0;
	switch (o->kind) {
	case TS_SC_CONST: imm = o->imm; break;
	case TS_SC_LOOPIDX:
		imm = o->imm;
		x->bad |= imm < 0 || imm > 1;
		break;
	case TS_SC_SPM_LD:
		buf = o->buf;
		x->bad |= buf > TS_MAX_OBJECTS;
		if (o->a != TS_NONE)
			a = cl_sc(x, o->a);
		else
			imm = o->imm;
		break;
	case TS_SC_ALU:
	case TS_SC_CMP:
		op = o->op;
		x->bad |= op >= (o->kind == TS_SC_ALU ? TCP_S_COUNT : TCP_C_COUNT);
		a = cl_sc(x, o->a);
		if (o->b != TS_NONE)
			b = cl_sc(x, o->b);
		else
			imm = o->imm;
		break;
	case TS_SC_LOOPVAR: /* b may be defined later: resolved at the end */
		a = cl_sc(x, o->a);
		b = o->b;
		break;
	default: x->bad = true; return;
	}
	if (x->bad)
		return;
	ts_id n = ts_add_scalar(x->c, rg, o->name, o->kind, op, a, b, imm);
	x->c->sc[n].buf = buf;
	x->smap[id] = n;
}

static bool cl_view(cl *x, tcp_view *d, const tcp_view *v)
{
	*d = tcp_view_none();
	if (v->t < 0)
		return true;
	if (v->t > (int32_t)TS_MAX_OBJECTS)
		return false;
	d->t = v->t;
	d->base = v->base;
	if (v->reg >= 0) {
		d->reg = (int32_t)cl_sc(x, (ts_id)v->reg);
		d->scale = v->scale;
	}
	memcpy(d->stride, v->stride, sizeof d->stride);
	return !x->bad;
}

/* The op's instruction as the reader rebuilds it from its printed fields. */
static bool cl_insn(cl *x, tcp_insn *d, const tcp_insn *in)
{
	if (in->op >= TCP_OP_COUNT || tcp_op_ctx[in->op] == TCP_CTX_CTL || in->ndim > TCP_MAXD || in->nstep > TCP_MAXSTEP ||
		in->tile < 0 || in->rows < 0)
		return false;
	*d = tcp_insn_init((tcp_opcode)in->op);
	d->ndim = in->ndim;
	for (int k = 0; k < in->ndim; k++)
		d->dim[k] = in->dim[k];
	d->flags = in->flags;
	if (in->vreg >= 0)
		d->vreg = (int32_t)cl_sc(x, (ts_id)in->vreg);
	d->imm = in->imm;
	d->tile = in->tile;
	d->rows = in->rows;
	for (int w = 0; w < TCP_NVIEW; w++)
		if (!cl_view(x, &d->v[w], &in->v[w]))
			return false;
	d->nstep = in->nstep;
	for (int k = 0; k < in->nstep; k++) {
		const tcp_step *st = &in->step[k];
		if (st->op >= TCP_V_COUNT || st->x > TCP_SRC_NONE || st->y > TCP_SRC_NONE)
			return false;
		d->step[k] = (tcp_step){st->op, st->x, st->y, st->ctr, st->flags, st->imm};
	}
	return !x->bad;
}

static void cl_op(cl *x, ts_id rg, ts_id id)
{
	const ts_op *o = &x->s->op[id];
	tcp_insn in;
	if (x->seen[id]++ || o->phase >= TS_NPHASE || o->cost < 0 || o->ndep > TS_MAX_DEPS || !cl_insn(x, &in, &o->in)) {
		x->bad = true;
		return;
	}
	ts_id n = ts_add_op(x->c, rg, &in, o->phase);
	ts_op *p = &x->c->op[n];
	p->feature = o->feature;
	p->node = o->node;
	p->cost = o->cost;
	x->given[n] = id;
	if (!o->ndep)
		return;
	/* the lists ts_add_dep would build, at the capacity it would leave:
	 * the next power of two, at least 4 */
	uint32_t cap = 4;
	while (cap < o->ndep)
		cap *= 2;
	p->dep = ir_alloc(&x->c->arena, cap * sizeof *p->dep);
	p->dist = ir_alloc(&x->c->arena, cap);
	p->ndep = o->ndep;
	memcpy(p->dep, o->dep, o->ndep * sizeof *p->dep);
	for (uint32_t k = 0; k < o->ndep; k++) {
		x->bad |= o->dep[k] >= TS_MAX_OBJECTS;
		p->dist[k] = o->dist[k] ? 1 : 0;
	}
}

static void cl_items(cl *x, ts_id from, ts_id to, int depth);

static void cl_region(cl *x, ts_id to, ts_id r, int depth)
{
	const tcp_sched *s = x->s;
	const ts_region *g = &s->rg[r];
	tcp_sched *c = x->c;
	if (depth > CL_MAX_DEPTH) {
		x->bad = true;
		return;
	}
	if (g->kind == TS_RG_CLASSES) {
		ts_id pred = cl_sc(x, g->pred);
		if (x->bad || g->nbound < 1 || g->nbound > TS_MAX_BOUNDS || g->nitem != g->nbound) {
			x->bad = true;
			return;
		}
		ts_id n = ts_add_region(c, to, TS_RG_CLASSES, pred);
		ts_region_bounds(c, n, g->bound, g->nbound);
		for (uint32_t k = 0; k < g->nitem && !x->bad; k++) {
			uint32_t it = g->item[k];
			if (TS_ITEM_KIND(it) != TS_ITEM_RG || TS_ITEM_ID(it) >= s->nrg) {
				x->bad = true;
				return;
			}
			cl_items(x, TS_ITEM_ID(it), ts_add_region(c, n, TS_RG_SEQ, TS_NONE), depth + 2);
		}
		return;
	}
	if (g->kind == TS_RG_LOOP) {
		const ts_loop *l = g->loop < (uint32_t)s->nloop ? &s->loop[g->loop] : NULL;
		if (!l || g->loop != (uint32_t)c->nloop || l->G < 1 || l->G > ((int64_t)1 << 40) || l->weights >= TS_NWEIGHTS ||
			l->prologue >= s->nrg || l->body >= s->nrg || l->epilogue >= s->nrg) {
			x->bad = true;
			return;
		}
		int li = ts_add_loop(c, to, l->G, l->nb, l->g); /* scalars resolved at the end */
		ts_loop *d = &c->loop[li];
		d->expert = l->expert;
		d->rows = l->rows;
		d->weights = l->weights;
		d->prefetch = l->prefetch;
		d->ring = l->ring;
		d->row_slots = l->row_slots;
		cl_items(x, l->prologue, d->prologue, depth + 2);
		cl_items(x, l->body, c->loop[li].body, depth + 2);
		cl_items(x, l->epilogue, c->loop[li].epilogue, depth + 2);
		return;
	}
	ts_id pred = TS_NONE;
	int kind = g->kind == TS_RG_GUARD || g->kind == TS_RG_TIER ? g->kind : TS_RG_SEQ;
	if (kind == TS_RG_GUARD)
		pred = cl_sc(x, g->pred);
	if (!x->bad)
		cl_items(x, r, ts_add_region(c, to, kind, pred), depth + 1);
}

static void cl_items(cl *x, ts_id from, ts_id to, int depth)
{
	const tcp_sched *s = x->s;
	for (uint32_t k = 0; k < s->rg[from].nitem && !x->bad; k++) {
		uint32_t it = s->rg[from].item[k], id = TS_ITEM_ID(it);
		if (TS_ITEM_KIND(it) == TS_ITEM_OP && id < s->nop)
			cl_op(x, to, id);
		else if (TS_ITEM_KIND(it) == TS_ITEM_SC && id < s->nsc)
			cl_scalar(x, to, id);
		else if (TS_ITEM_KIND(it) == TS_ITEM_RG && id < s->nrg)
			cl_region(x, to, id, depth);
		else
			x->bad = true;
	}
}

static bool cl_buf(cl *x, ts_id i)
{
	const ts_buf *u = &x->s->buf[i];
	if (!cl_name_ok(u->name) || strlen(u->source) >= CL_MAX_QUOTED || u->space >= TCP_NSPACE || u->kind >= TCP_NKIND ||
		!cl_dtype_ok(u->dtype) || u->rank > MOE_MAX_RANK || !ts_slots_ok(u->slots) ||
		u->life >= TS_NLIFE || u->layout.split >= TS_NSPLIT || u->layout.slice_bytes < 0)
		return false;
	if (u->rank == 0 && (u->space != TCP_HBM || u->kind != TCP_T_INPUT))
		return false;
	for (int k = 0; k < u->rank; k++)
		if (u->shape[k] < 1 || u->shape[k] > ((int64_t)1 << 40))
			return false;
	if (u->life == TS_LIFE_SPAN && (u->first > TS_MAX_OBJECTS || u->last > TS_MAX_OBJECTS))
		return false;
	ts_id b = ts_add_buf(x->c, u->name, u->space, u->kind, (moe_dtype)u->dtype, u->rank, u->shape);
	ts_buf *d = &x->c->buf[b];
	if (u->source[0])
		d->source = ir_strdup(&x->c->arena, u->source);
	d->slots = u->slots;
	d->life = u->life;
	if (u->life == TS_LIFE_SPAN)
		d->first = u->first, d->last = u->last;
	d->layout = u->layout;
	d->feature = u->feature;
	d->node = u->node;
	d->offset = u->offset >= 0 ? u->offset : -1;
	return true;
}

static bool cl_header(cl *x)
{
	const tcp_sched *s = x->s;
	tcp_sched *c = x->c;
	const ts_meta *m = &s->meta;
	const char *mn = s->machine_name ? s->machine_name : "";
	if (strlen(mn) > 90 || (s->m && strcmp(mn, s->m->name)) || !cl_dtype_ok(m->dtype))
		return false;
	const int64_t f[12] = {m->T, m->K, m->D, m->F, m->E, m->B, m->G, m->nproj, m->router_E, m->wexp, m->act, m->rmacs};
	for (int k = 0; k < 12; k++)
		if (f[k] < 0)
			return false;
	if (m->prep) {
		size_t n = strlen(m->prep);
		if (!n || m->prep[0] == ' ' || m->prep[0] == '\t' || m->prep[n - 1] == ' ' || m->prep[n - 1] == '\t')
			return false;
		for (size_t k = 0; k < n; k++)
			if ((unsigned char)m->prep[k] < 0x20 || m->prep[k] == 0x7f)
				return false;
	}
	c->machine_name = ir_strdup(&c->arena, mn);
	c->meta = *m;
	c->meta.prep = m->prep ? ir_strdup(&c->arena, m->prep) : NULL;
	c->granted = s->granted;
	c->refused = s->refused;
	c->ran = s->ran & (ts_nrewrites < 64 ? (1ull << ts_nrewrites) - 1 : ~0ull);
	c->reuse = s->reuse;
	return true;
}

/* The scalars a loop or a loopvar may name before their definition. */
static void cl_resolve(cl *x)
{
	tcp_sched *c = x->c;
	for (ts_id i = 0; i < c->nsc && !x->bad; i++)
		if (c->sc[i].kind == TS_SC_LOOPVAR)
			c->sc[i].b = cl_sc(x, c->sc[i].b);
	for (int l = 0; l < c->nloop && !x->bad; l++) {
		ts_loop *d = &c->loop[l];
		d->nb = cl_sc(x, d->nb);
		d->g = cl_sc(x, d->g);
		if (d->expert != TS_NONE)
			d->expert = cl_sc(x, d->expert);
		if (d->rows != TS_NONE)
			d->rows = cl_sc(x, d->rows);
	}
}

/* Ops were appended in program order: each goes to its id, as the reader
 * places them; every op must have been met once. */
static void cl_place_ops(cl *x)
{
	tcp_sched *c = x->c;
	uint32_t n = c->nop;
	if (n != x->s->nop) {
		x->bad = true;
		return;
	}
	ts_op *ops = ir_alloc(&c->arena, (n ? n : 1) * sizeof *ops);
	for (uint32_t i = 0; i < n; i++)
		ops[x->given[i]] = c->op[i];
	c->op = ops;
	c->cop = n;
	for (uint32_t r = 0; r < c->nrg; r++)
		for (uint32_t k = 0; k < c->rg[r].nitem; k++)
			if (TS_ITEM_KIND(c->rg[r].item[k]) == TS_ITEM_OP)
				c->rg[r].item[k] = TS_ITEM_OP | x->given[TS_ITEM_ID(c->rg[r].item[k])];
}

tcp_sched *ts_clone(const tcp_sched *s)
{
	moe_ctx *ctx = s->ctx;
	cl x = {.s = s, .c = tcp_sched_new(ctx, s->m)};
	x.smap = ctx_alloc(ctx, (s->nsc + 1) * sizeof *x.smap);
	x.given = ctx_alloc(ctx, (s->nop + 1) * sizeof *x.given);
	x.seen = ctx_alloc(ctx, s->nop + 1);
	memset(x.smap, 0xff, (s->nsc + 1) * sizeof *x.smap);
	x.bad = s->top >= s->nrg || s->nbuf > TS_MAX_OBJECTS || !cl_header(&x);
	for (ts_id i = 0; i < s->nbuf && !x.bad; i++)
		x.bad = !cl_buf(&x, i);
	if (!x.bad)
		cl_items(&x, s->top, x.c->top, 0);
	if (!x.bad)
		cl_resolve(&x);
	if (!x.bad)
		cl_place_ops(&x);
	ctx_free(ctx, x.smap, 0);
	ctx_free(ctx, x.given, 0);
	ctx_free(ctx, x.seen, 0);
	if (x.bad) {
		tcp_sched_free(x.c);
		return NULL;
	}
	return x.c;
}

void ts_swap(tcp_sched *a, tcp_sched *b)
{
	tcp_sched t = *a;
	*a = *b;
	*b = t;
}

static bool same_str(const char *a, const char *b)
{
	return a == b || (a && b && !strcmp(a, b));
}

static bool same_insn(const tcp_insn *a, const tcp_insn *b)
{
	if (a->op != b->op || a->sop != b->sop || a->ndim != b->ndim || a->nstep != b->nstep || a->flags != b->flags ||
		a->rd != b->rd || a->ra != b->ra || a->rb != b->rb || a->phase != b->phase || a->vreg != b->vreg ||
		a->target != b->target || a->imm != b->imm || a->tile != b->tile || a->rows != b->rows ||
		memcmp(a->dim, b->dim, sizeof a->dim))
		return false;
	for (int w = 0; w < TCP_NVIEW; w++) {
		const tcp_view *x = &a->v[w], *y = &b->v[w];
		if (x->t != y->t || x->reg != y->reg || x->base != y->base || x->scale != y->scale ||
			memcmp(x->stride, y->stride, sizeof x->stride))
			return false;
	}
	for (int k = 0; k < TCP_MAXSTEP; k++) {
		const tcp_step *x = &a->step[k], *y = &b->step[k];
		if (x->op != y->op || x->x != y->x || x->y != y->y || x->ctr != y->ctr || x->flags != y->flags || x->imm != y->imm)
			return false;
	}
	return true;
}

static bool same_buf(const ts_buf *a, const ts_buf *b)
{
	const ts_layout *x = &a->layout, *y = &b->layout;
	return same_str(a->name, b->name) && same_str(a->source, b->source) && a->space == b->space && a->kind == b->kind &&
	       a->dtype == b->dtype && a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof a->shape) &&
	       a->slots == b->slots && a->life == b->life && a->first == b->first && a->last == b->last &&
	       x->slice0 == y->slice0 && x->nslices == y->nslices && x->copies == y->copies && x->split == y->split &&
	       x->slice_bytes == y->slice_bytes && a->feature == b->feature && a->offset == b->offset && a->node == b->node;
}

static bool same_op(const ts_op *a, const ts_op *b)
{
	return a->ctx == b->ctx && a->phase == b->phase && a->feature == b->feature && a->region == b->region &&
	       a->ndep == b->ndep && a->cost == b->cost && a->node == b->node &&
	       (!a->ndep || (!memcmp(a->dep, b->dep, a->ndep * sizeof *a->dep) && !memcmp(a->dist, b->dist, a->ndep))) &&
	       same_insn(&a->in, &b->in);
}

static bool same_region(const ts_region *a, const ts_region *b)
{
	return a->kind == b->kind && a->parent == b->parent && a->pred == b->pred && a->nitem == b->nitem &&
	       a->nbound == b->nbound && a->loop == b->loop &&
	       (!a->nitem || !memcmp(a->item, b->item, a->nitem * sizeof *a->item)) &&
	       (!a->nbound || !memcmp(a->bound, b->bound, a->nbound * sizeof *a->bound));
}

static bool same_loop(const ts_loop *a, const ts_loop *b)
{
	return a->G == b->G && a->nb == b->nb && a->expert == b->expert && a->rows == b->rows && a->g == b->g &&
	       a->region == b->region && a->prologue == b->prologue && a->body == b->body && a->epilogue == b->epilogue &&
	       a->weights == b->weights && a->prefetch == b->prefetch && a->ring == b->ring && a->row_slots == b->row_slots;
}

bool ts_same(const tcp_sched *a, const tcp_sched *b)
{
	const ts_meta *x = &a->meta, *y = &b->meta;
	if (a->nbuf != b->nbuf || a->nop != b->nop || a->nsc != b->nsc || a->nrg != b->nrg || a->nloop != b->nloop ||
		a->top != b->top || a->granted != b->granted || a->refused != b->refused || a->ran != b->ran || a->reuse != b->reuse ||
		!same_str(a->machine_name, b->machine_name) || x->T != y->T || x->K != y->K || x->D != y->D || x->F != y->F ||
		x->E != y->E || x->B != y->B || x->G != y->G || x->nproj != y->nproj || x->router_E != y->router_E ||
		x->wexp != y->wexp || x->act != y->act || x->rmacs != y->rmacs || x->dtype != y->dtype ||
		!same_str(x->prep, y->prep))
		return false;
	for (ts_id i = 0; i < a->nbuf; i++)
		if (!same_buf(&a->buf[i], &b->buf[i]))
			return false;
	for (ts_id i = 0; i < a->nsc; i++) {
		const ts_scalar *p = &a->sc[i], *q = &b->sc[i];
		if (!same_str(p->name, q->name) || p->kind != q->kind || p->op != q->op || p->a != q->a || p->b != q->b ||
			p->buf != q->buf || p->imm != q->imm || p->region != q->region)
			return false;
	}
	for (ts_id i = 0; i < a->nrg; i++)
		if (!same_region(&a->rg[i], &b->rg[i]))
			return false;
	for (int l = 0; l < a->nloop; l++)
		if (!same_loop(&a->loop[l], &b->loop[l]))
			return false;
	for (ts_id i = 0; i < a->nop; i++)
		if (!same_op(&a->op[i], &b->op[i]))
			return false;
	return true;
}

void ts_meta_dims(const ts_meta *x, tcp_program *p)
{
	p->moe_T = x->T, p->moe_K = x->K, p->moe_D = x->D, p->moe_F = x->F, p->moe_E = x->E;
	p->moe_B = x->B, p->moe_G = x->G, p->nproj = x->nproj, p->router_E = x->router_E;
	p->dtype = x->dtype;
	p->weight_bytes_per_expert = x->wexp;
	p->act_bytes = x->act;
	p->router_macs = x->rmacs;
}
