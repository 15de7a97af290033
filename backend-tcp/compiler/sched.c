/* backend-tcp/compiler/sched.c: building a schedule (sched.h). Every array
 * lives in the schedule's arena and grows by doubling; nothing is allocated
 * per op outside it. */
#include <string.h>

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

int64_t ts_buf_numel(const ts_buf *b)
{
	int64_t n = 1;
	for (int k = 0; k < b->rank; k++)
		n *= b->shape[k];
	return n;
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
