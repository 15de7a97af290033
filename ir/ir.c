/* ir/ir.c: op table, modules, graphs, nodes, attributes, builders. */
#include <string.h>

#include "ir/graph_keys.h"
#include "ir/ir.h"

const ir_opinfo ir_ops[MOE_OP_COUNT] = {
#define OP(id, name, mn, mx, rule, flags, attrs) [MOE_OP_##id] = {name, mn, mx, SHAPE_##rule, flags},
#include "moec/ops.def"
#undef OP
};
#define OP(id, name, mn, mx, rule, flags, attrs) +1
_Static_assert(0
#include "moec/ops.def"
	== MOE_OP_COUNT, "op table and enum disagree");
#undef OP

const char *const ir_experts_slot_names[EXP_NSLOTS] = {
	"x", "idx", "w", "gate", "up", "down", "gate_bias", "up_bias", "down_bias"};

static const char *const dtype_names[MOE_DTYPE_COUNT] = {"f32", "bf16", "i32", "bool", "f8e4m3", "i8", "u8"};
static const size_t dtype_sizes[MOE_DTYPE_COUNT] = {4, 2, 4, 1, 1, 1, 1};

const char *moe_op_name(moe_op op)
{
	return (unsigned)op < MOE_OP_COUNT ? ir_ops[op].name : "?";
}

int moe_op_from_name(const char *name)
{
	for (int i = 0; i < MOE_OP_COUNT; i++)
		if (!strcmp(ir_ops[i].name, name))
			return i;
	return -1;
}

const char *moe_dtype_name(moe_dtype t)
{
	return (unsigned)t < MOE_DTYPE_COUNT ? dtype_names[t] : "?";
}

int moe_dtype_from_name(const char *name)
{
	for (int i = 0; i < MOE_DTYPE_COUNT; i++)
		if (!strcmp(dtype_names[i], name))
			return i;
	return -1;
}

size_t moe_dtype_size(moe_dtype t)
{
	return (unsigned)t < MOE_DTYPE_COUNT ? dtype_sizes[t] : 0;
}

int moe_dtype_is_float(moe_dtype t)
{
	return t == MOE_F32 || t == MOE_BF16;
}

int moe_dtype_is_storage(moe_dtype t)
{
	return t == MOE_F8E4M3 || t == MOE_U8;
}

/* ---- modules and graphs ---- */
moe_module *moe_module_new(moe_ctx *ctx)
{
	moe_module *m = ctx_alloc(ctx, sizeof *m);
	m->ctx = ctx;
	return m;
}

void moe_module_free(moe_module *m)
{
	if (!m)
		return;
	for (uint32_t i = 0; i < m->ngraphs; i++)
		ir_graph_free(m->graphs[i]);
	ctx_free(m->ctx, m->graphs, m->gcap * sizeof *m->graphs);
	ctx_free(m->ctx, m, sizeof *m);
}

size_t moe_module_num_graphs(const moe_module *m)
{
	return m->ngraphs;
}

moe_graph *moe_module_graph(const moe_module *m, size_t i)
{
	return i < m->ngraphs ? m->graphs[i] : NULL;
}

moe_graph *moe_module_add_graph(moe_module *m, const char *name)
{
	moe_graph *g = ir_graph_new(m->ctx, name);
	ctx_grow(m->ctx, (void **)&m->graphs, &m->gcap, m->ngraphs + 1, sizeof *m->graphs);
	m->graphs[m->ngraphs++] = g;
	return g;
}

void ir_module_replace(moe_module *m, uint32_t i, moe_graph *g)
{
	IR_ASSERT(i < m->ngraphs);
	if (m->graphs[i] != g)
		ir_graph_free(m->graphs[i]);
	m->graphs[i] = g;
}

moe_graph *ir_graph_new(moe_ctx *ctx, const char *name)
{
	moe_graph *g = ctx_alloc(ctx, sizeof *g);
	g->ctx = ctx;
	ir_arena_init(&g->arena, ctx);
	g->name = ir_strdup(&g->arena, name ? name : "layer");
	g->dtype = MOE_F32;
	g->loc = moe_loc_none();
	g->meta.valid = MOE_NONE;
	g->meta.body = IR_NO_BODY;
	return g;
}

void ir_graph_free(moe_graph *g)
{
	if (!g)
		return;
	moe_ctx *c = g->ctx;
	for (uint32_t i = 0; i < g->nbodies; i++)
		ir_graph_free(g->bodies[i]);
	ctx_free(c, g->bodies, g->bodycap * sizeof *g->bodies);
	ctx_free(c, g->nodes, g->ncap * sizeof *g->nodes);
	ctx_free(c, g->outputs, g->outcap * sizeof *g->outputs);
	ctx_free(c, g->dims, g->dimcap * sizeof *g->dims);
	ir_arena_free(&g->arena);
	ctx_free(c, g, sizeof *g);
}

moe_graph *ir_graph_clone_empty(const moe_graph *g)
{
	moe_graph *n = ir_graph_new(g->ctx, g->name);
	n->dtype = g->dtype;
	n->loc = g->loc;
	n->is_body = g->is_body;
	for (uint32_t i = 0; i < g->ndims; i++)
		moe_graph_set_dim(n, g->dims[i].name, g->dims[i].value);
	for (uint32_t i = 0; i < g->meta.nattrs; i++)
		ir_attr_set(n, &n->meta, &g->meta.attrs[i]);
	return n;
}

void ir_graph_take(moe_graph *g, moe_graph *ng)
{
	moe_graph tmp = *g;
	*g = *ng;
	*ng = tmp;
	ir_graph_free(ng);
}

moe_graph *ir_graph_clone(const moe_graph *g)
{
	moe_graph *n = ir_graph_clone_empty(g);
	moe_id *map = ctx_alloc(g->ctx, (g->nnodes + 1) * sizeof *map);
	for (uint32_t i = 0; i < g->nnodes; i++)
		map[i] = ir_copy_node(n, g, i, map);
	for (uint32_t i = 0; i < g->nout; i++)
		moe_graph_add_output(n, map[g->outputs[i]]);
	ctx_free(g->ctx, map, (g->nnodes + 1) * sizeof *map);
	return n;
}

const char *moe_graph_name(const moe_graph *g) { return g->name; }
uint32_t moe_graph_num_nodes(const moe_graph *g) { return g->nnodes; }
uint32_t moe_graph_num_outputs(const moe_graph *g) { return g->nout; }
moe_dtype moe_graph_dtype(const moe_graph *g) { return g->dtype; }
void moe_graph_set_dtype(moe_graph *g, moe_dtype t) { g->dtype = t; }

moe_id moe_graph_output(const moe_graph *g, uint32_t i)
{
	return i < g->nout ? g->outputs[i] : MOE_NONE;
}

void moe_graph_add_output(moe_graph *g, moe_id v)
{
	IR_ASSERT(v < g->nnodes);
	ctx_grow(g->ctx, (void **)&g->outputs, &g->outcap, g->nout + 1, sizeof *g->outputs);
	g->outputs[g->nout++] = v;
}

void moe_graph_set_dim(moe_graph *g, const char *name, int64_t value)
{
	for (uint32_t i = 0; i < g->ndims; i++)
		if (!strcmp(g->dims[i].name, name)) {
			g->dims[i].value = value;
			return;
		}
	ctx_grow(g->ctx, (void **)&g->dims, &g->dimcap, g->ndims + 1, sizeof *g->dims);
	g->dims[g->ndims++] = (ir_dim){ir_strdup(&g->arena, name), value};
}

int moe_graph_get_dim(const moe_graph *g, const char *name, int64_t *value)
{
	for (uint32_t i = 0; i < g->ndims; i++)
		if (!strcmp(g->dims[i].name, name)) {
			if (value)
				*value = g->dims[i].value;
			return 1;
		}
	return 0;
}

void ir_graph_set_attr_int(moe_graph *g, const char *key, int64_t v)
{
	ir_attr a = {.key = key, .kind = MOE_ATTR_INT, .v.i = v};
	ir_attr_set(g, &g->meta, &a);
}

void moe_graph_set_attr_int(moe_graph *g, const char *key, int64_t v)
{
	ir_graph_set_attr_int(g, key, v);
}

int moe_graph_get_attr_int(const moe_graph *g, const char *key, int64_t *v)
{
	ir_attr *a = ir_attr_find(&g->meta, key);
	if (!a || a->kind != MOE_ATTR_INT)
		return 0;
	if (v)
		*v = a->v.i;
	return 1;
}

int64_t ir_graph_attr_int(const moe_graph *g, const char *key, int64_t def)
{
	return ir_attr_int(&g->meta, key, def);
}

void ir_graph_drop_attr(moe_graph *g, const char *key)
{
	ir_node *n = &g->meta;
	for (uint32_t i = 0; i < n->nattrs; i++)
		if (!strcmp(n->attrs[i].key, key)) {
			memmove(&n->attrs[i], &n->attrs[i + 1], (n->nattrs - i - 1) * sizeof *n->attrs);
			n->nattrs--;
			return;
		}
}

/* ---- nodes ---- */
moe_id ir_emit(moe_graph *g, moe_op op, moe_dtype t, int rank, const int64_t *shape,
	const moe_id *args, uint32_t nargs, moe_loc loc)
{
	IR_ASSERT(rank >= 0 && rank <= MOE_MAX_RANK);
	IR_ASSERT(g->nnodes < MOE_NONE - 1);
	ctx_grow(g->ctx, (void **)&g->nodes, &g->ncap, g->nnodes + 1, sizeof *g->nodes);
	moe_id id = g->nnodes++;
	ir_node *n = &g->nodes[id];
	memset(n, 0, sizeof *n);
	n->op = (uint16_t)op;
	n->dtype = (uint8_t)t;
	n->rank = (uint8_t)rank;
	for (int i = 0; i < rank; i++)
		n->shape[i] = shape[i];
	n->nargs = nargs;
	if (nargs) {
		n->args = ir_alloc(&g->arena, nargs * sizeof *n->args);
		for (uint32_t i = 0; i < nargs; i++) {
			IR_ASSERT(args[i] == MOE_NONE || args[i] < id);
			n->args[i] = args[i];
		}
	}
	n->valid = MOE_NONE;
	n->body = IR_NO_BODY;
	n->loc = loc;
	return id;
}

moe_id ir_copy_node(moe_graph *dst, const moe_graph *src, moe_id sn, const moe_id *map)
{
	const ir_node *s = N(src, sn);
	moe_id args[64];
	IR_ASSERT(s->nargs <= 64);
	for (uint32_t i = 0; i < s->nargs; i++)
		args[i] = s->args[i] == MOE_NONE ? MOE_NONE : map[s->args[i]];
	moe_id id = ir_emit(dst, s->op, s->dtype, s->rank, s->shape, args, s->nargs, s->loc);
	ir_node *d = N(dst, id);
	for (uint32_t i = 0; i < s->nattrs; i++)
		ir_attr_set(dst, d, &s->attrs[i]);
	d->name = ir_strdup(&dst->arena, s->name);
	d->valid = s->valid == MOE_NONE ? MOE_NONE : map[s->valid];
	if (s->body != IR_NO_BODY && s->body < src->nbodies) { /* the copy owns a copy of the body */
		moe_graph *b = ir_graph_clone(src->bodies[s->body]);
		ctx_grow(dst->ctx, (void **)&dst->bodies, &dst->bodycap, dst->nbodies + 1, sizeof *dst->bodies);
		dst->bodies[dst->nbodies] = b;
		N(dst, id)->body = dst->nbodies++;
	}
	return id;
}

moe_id moe_node_new(moe_graph *g, moe_op op, const moe_id *args, uint32_t nargs, moe_loc loc)
{
	int64_t none[1] = {0};
	return ir_emit(g, op, MOE_F32, 0, none, args, nargs, loc);
}

void moe_node_set_type(moe_graph *g, moe_id id, moe_dtype t, const int64_t *shape, int rank)
{
	ir_node *n = N(g, id);
	IR_ASSERT(rank >= 0 && rank <= MOE_MAX_RANK);
	n->dtype = (uint8_t)t;
	n->rank = (uint8_t)rank;
	for (int i = 0; i < rank; i++)
		n->shape[i] = shape[i];
}

void moe_node_set_name(moe_graph *g, moe_id id, const char *name)
{
	N(g, id)->name = ir_strdup(&g->arena, name);
}

void moe_node_set_arg(moe_graph *g, moe_id id, uint32_t i, moe_id v)
{
	ir_node *n = N(g, id);
	IR_ASSERT(i < n->nargs && (v == MOE_NONE || v < g->nnodes));
	n->args[i] = v;
}

uint32_t moe_graph_replace_uses(moe_graph *g, moe_id old, moe_id v)
{
	IR_ASSERT(old < g->nnodes && v < g->nnodes);
	/* v and what it is computed from keep reading old (v = f(old) is the
	 * usual replacement) */
	uint8_t *spare = ctx_alloc(g->ctx, g->nnodes + 1);
	moe_id *stack = ctx_alloc(g->ctx, (g->nnodes + 1) * sizeof *stack);
	uint32_t sp = 0;
	spare[v] = 1;
	stack[sp++] = v;
	while (sp) {
		const ir_node *n = N(g, stack[--sp]);
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE && a != old && !spare[a]) {
				spare[a] = 1;
				stack[sp++] = a;
			}
		}
	}
	uint32_t count = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (spare[i])
			continue;
		ir_node *n = N(g, i);
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] == old) {
				n->args[k] = v;
				count++;
			}
		if (n->valid == old) {
			n->valid = v;
			count++;
		}
	}
	for (uint32_t i = 0; i < g->nout; i++)
		if (g->outputs[i] == old) {
			g->outputs[i] = v;
			count++;
		}
	ctx_free(g->ctx, stack, (g->nnodes + 1) * sizeof *stack);
	ctx_free(g->ctx, spare, g->nnodes + 1);
	return count;
}

/* Emit node root after its operands, depth first with an explicit stack
 * (state 1 = on the stack, 2 = emitted); false at a cycle, *cyc its node. */
static bool compact_visit(moe_graph *dst, const moe_graph *g, moe_id root, uint8_t *state, moe_id *map,
	moe_id *stack, uint32_t *next, moe_id *cyc)
{
	if (state[root] == 2)
		return true;
	uint32_t sp = 0;
	stack[sp] = root;
	next[sp++] = 0;
	state[root] = 1;
	while (sp) {
		moe_id i = stack[sp - 1];
		const ir_node *n = N(g, i);
		if (next[sp - 1] <= n->nargs) {
			uint32_t k = next[sp - 1]++;
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a == MOE_NONE || state[a] == 2)
				continue;
			if (state[a] == 1) {
				*cyc = a;
				return false;
			}
			state[a] = 1;
			stack[sp] = a;
			next[sp++] = 0;
			continue;
		}
		state[i] = 2;
		map[i] = ir_copy_node(dst, g, i, map);
		sp--;
	}
	return true;
}

moe_status moe_graph_compact(moe_ctx *ctx, moe_graph *g, moe_id *map)
{
	uint32_t nn = g->nnodes;
	uint8_t *live = ctx_alloc(ctx, nn + 1), *state = ctx_alloc(ctx, nn + 1);
	moe_id *m = ctx_alloc(ctx, (nn + 1) * sizeof *m);
	for (moe_id i = 0; i < nn; i++)
		m[i] = MOE_NONE;
	/* live: reachable from the outputs, and every input (the layer's
	 * calling convention, as dce keeps it) */
	moe_id *stack = ctx_alloc(ctx, (nn + 1) * sizeof *stack);
	uint32_t sp = 0;
	for (uint32_t i = 0; i < g->nout; i++)
		if (!live[g->outputs[i]]) {
			live[g->outputs[i]] = 1;
			stack[sp++] = g->outputs[i];
		}
	for (moe_id i = 0; i < nn; i++)
		if (N(g, i)->op == MOE_OP_INPUT)
			live[i] = 1;
	while (sp) {
		const ir_node *n = N(g, stack[--sp]);
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE && !live[a]) {
				live[a] = 1;
				stack[sp++] = a;
			}
		}
	}
	moe_graph *dst = ir_graph_clone_empty(g);
	moe_id cyc = MOE_NONE;
	bool ok = true;
	uint32_t *next = ctx_alloc(ctx, (nn + 1) * sizeof *next);
	for (moe_id i = 0; i < nn && ok; i++)
		if (live[i])
			ok = compact_visit(dst, g, i, state, m, stack, next, &cyc);
	ctx_free(ctx, next, (nn + 1) * sizeof *next);
	if (ok) {
		for (uint32_t i = 0; i < g->nout; i++)
			moe_graph_add_output(dst, m[g->outputs[i]]);
		ir_graph_take(g, dst);
		if (map)
			memcpy(map, m, nn * sizeof *m);
	} else {
		moe_diag(ctx, MOE_DIAG_ERROR, N(g, cyc)->loc, "graph compaction: node %%%u depends on itself (a cycle)", cyc);
		ir_graph_free(dst);
	}
	ctx_free(ctx, stack, (nn + 1) * sizeof *stack);
	ctx_free(ctx, m, (nn + 1) * sizeof *m);
	ctx_free(ctx, state, nn + 1);
	ctx_free(ctx, live, nn + 1);
	return ok ? MOE_OK : MOE_ERR_INVALID;
}

void moe_node_set_valid(moe_graph *g, moe_id id, moe_id valid)
{
	IR_ASSERT(valid == MOE_NONE || valid < id);
	N(g, id)->valid = valid;
}

ir_attr *ir_attr_find(const ir_node *n, const char *key)
{
	for (uint32_t i = 0; i < n->nattrs; i++)
		if (!strcmp(n->attrs[i].key, key))
			return &n->attrs[i];
	return NULL;
}

void ir_attr_set(moe_graph *g, ir_node *n, const ir_attr *a)
{
	ir_attr *d = ir_attr_find(n, a->key);
	if (!d) {
		if (n->nattrs == n->attrcap) {
			uint32_t nc = n->attrcap ? n->attrcap * 2 : 4;
			ir_attr *na = ir_alloc(&g->arena, nc * sizeof *na);
			if (n->nattrs)
				memcpy(na, n->attrs, n->nattrs * sizeof *na);
			n->attrs = na;
			n->attrcap = nc;
		}
		d = &n->attrs[n->nattrs++];
		d->key = ir_strdup(&g->arena, a->key);
	}
	d->kind = a->kind;
	d->count = a->count;
	d->v = a->v;
	if (a->kind == MOE_ATTR_STR)
		d->v.s = ir_strdup(&g->arena, a->v.s);
	else if (a->kind == MOE_ATTR_INTS) {
		d->v.ints = ir_alloc(&g->arena, (size_t)(a->count ? a->count : 1) * sizeof(int64_t));
		if (a->count)
			memcpy(d->v.ints, a->v.ints, (size_t)a->count * sizeof(int64_t));
	}
}

int64_t ir_attr_int(const ir_node *n, const char *key, int64_t def)
{
	ir_attr *a = ir_attr_find(n, key);
	if (!a)
		return def;
	if (a->kind == MOE_ATTR_INT)
		return a->v.i;
	/* a float read as an integer truncates; NaN and values beyond int64 (which
	 * a read file may hold) would be undefined to convert: give def */
	if (a->kind == MOE_ATTR_FLOAT && a->v.f > -9223372036854775808.0 && a->v.f < 9223372036854775808.0)
		return (int64_t)a->v.f;
	return def;
}

double ir_attr_float(const ir_node *n, const char *key, double def)
{
	ir_attr *a = ir_attr_find(n, key);
	if (!a)
		return def;
	return a->kind == MOE_ATTR_FLOAT ? a->v.f : a->kind == MOE_ATTR_INT ? (double)a->v.i : def;
}

const char *ir_attr_str(const ir_node *n, const char *key, const char *def)
{
	ir_attr *a = ir_attr_find(n, key);
	return a && a->kind == MOE_ATTR_STR ? a->v.s : def;
}

int ir_attr_ints(const ir_node *n, const char *key, const int64_t **out)
{
	ir_attr *a = ir_attr_find(n, key);
	if (!a || a->kind != MOE_ATTR_INTS)
		return -1;
	*out = a->v.ints;
	return a->count;
}

void moe_node_set_int(moe_graph *g, moe_id n, const char *key, int64_t v)
{
	ir_attr a = {.key = key, .kind = MOE_ATTR_INT, .v.i = v};
	ir_attr_set(g, N(g, n), &a);
}

void moe_node_set_float(moe_graph *g, moe_id n, const char *key, double v)
{
	ir_attr a = {.key = key, .kind = MOE_ATTR_FLOAT, .v.f = v};
	ir_attr_set(g, N(g, n), &a);
}

void moe_node_set_str(moe_graph *g, moe_id n, const char *key, const char *v)
{
	ir_attr a = {.key = key, .kind = MOE_ATTR_STR, .v.s = v};
	ir_attr_set(g, N(g, n), &a);
}

void moe_node_set_ints(moe_graph *g, moe_id n, const char *key, const int64_t *v, int count)
{
	IR_ASSERT(g && key && count >= 0 && (v || count == 0)); /* API misuse: docs/api.md */
	ir_attr a = {.key = key, .kind = MOE_ATTR_INTS, .count = count, .v.ints = (int64_t *)v};
	ir_attr_set(g, N(g, n), &a);
}

moe_status moe_node_infer(moe_graph *g, moe_id n)
{
	return ir_infer(g->ctx, g, n);
}

moe_op moe_node_op(const moe_graph *g, moe_id n) { return (moe_op)N(g, n)->op; }
moe_dtype moe_node_dtype(const moe_graph *g, moe_id n) { return (moe_dtype)N(g, n)->dtype; }
int moe_node_rank(const moe_graph *g, moe_id n) { return N(g, n)->rank; }
const int64_t *moe_node_shape(const moe_graph *g, moe_id n) { return N(g, n)->shape; }
uint32_t moe_node_num_args(const moe_graph *g, moe_id n) { return N(g, n)->nargs; }
const char *moe_node_name(const moe_graph *g, moe_id n) { return N(g, n)->name; }
moe_id moe_node_valid(const moe_graph *g, moe_id n) { return N(g, n)->valid; }
moe_loc moe_node_loc(const moe_graph *g, moe_id n) { return N(g, n)->loc; }

moe_id moe_node_arg(const moe_graph *g, moe_id n, uint32_t i)
{
	const ir_node *x = N(g, n);
	return i < x->nargs ? x->args[i] : MOE_NONE;
}

int moe_node_get_int(const moe_graph *g, moe_id n, const char *key, int64_t *v)
{
	ir_attr *a = ir_attr_find(N(g, n), key);
	if (!a || (a->kind != MOE_ATTR_INT && a->kind != MOE_ATTR_FLOAT))
		return 0;
	*v = ir_attr_int(N(g, n), key, 0);
	return 1;
}

int moe_node_get_float(const moe_graph *g, moe_id n, const char *key, double *v)
{
	ir_attr *a = ir_attr_find(N(g, n), key);
	if (!a || (a->kind != MOE_ATTR_INT && a->kind != MOE_ATTR_FLOAT))
		return 0;
	*v = ir_attr_float(N(g, n), key, 0);
	return 1;
}

const char *moe_node_get_str(const moe_graph *g, moe_id n, const char *key)
{
	return ir_attr_str(N(g, n), key, NULL);
}

int64_t ir_numel(const ir_node *n)
{
	int64_t e = 1;
	for (int i = 0; i < n->rank; i++)
		e *= n->shape[i];
	return e;
}

int64_t ir_bytes(const ir_node *n)
{
	return ir_numel(n) * (int64_t)moe_dtype_size((moe_dtype)n->dtype);
}

bool ir_same_shape(const ir_node *a, const ir_node *b)
{
	if (a->rank != b->rank)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}

int ir_norm_axis(int axis, int rank)
{
	if (axis < 0)
		axis += rank;
	return axis >= 0 && axis < rank ? axis : -1;
}

/* ---- builders ---- */
moe_id ir_b(moe_graph *g, moe_op op, const moe_id *args, uint32_t nargs, moe_loc loc)
{
	moe_id id = moe_node_new(g, op, args, nargs, loc);
	if (ir_infer(g->ctx, g, id) != MOE_OK) {
		moe_diag_print(g->ctx, stderr);
		ir_assert_fail(__FILE__, __LINE__, "pass built an ill-typed node");
	}
	return id;
}

moe_id ir_b1(moe_graph *g, moe_op op, moe_id a, moe_loc loc)
{
	return ir_b(g, op, &a, 1, loc);
}

moe_id ir_b2(moe_graph *g, moe_op op, moe_id a, moe_id b, moe_loc loc)
{
	moe_id x[2] = {a, b};
	return ir_b(g, op, x, 2, loc);
}

moe_id ir_b3(moe_graph *g, moe_op op, moe_id a, moe_id b, moe_id c, moe_loc loc)
{
	moe_id x[3] = {a, b, c};
	return ir_b(g, op, x, 3, loc);
}

moe_id ir_b_const(moe_graph *g, moe_dtype t, double value, moe_loc loc)
{
	moe_id id = ir_emit(g, MOE_OP_CONST, t, 0, NULL, NULL, 0, loc);
	if (moe_dtype_is_float(t))
		moe_node_set_float(g, id, "value", value);
	else
		moe_node_set_int(g, id, "value", (int64_t)value);
	return id;
}

moe_id ir_b_iota(moe_graph *g, int rank, const int64_t *shape, int axis, moe_loc loc)
{
	moe_id id = ir_emit(g, MOE_OP_IOTA, MOE_I32, rank, shape, NULL, 0, loc);
	moe_node_set_int(g, id, "axis", axis);
	return id;
}

moe_id ir_b_cast(moe_graph *g, moe_id a, moe_dtype t, moe_loc loc)
{
	if (N(g, a)->dtype == t)
		return a;
	moe_id id = moe_node_new(g, MOE_OP_CAST, &a, 1, loc);
	moe_node_set_str(g, id, "to", moe_dtype_name(t));
	IR_ASSERT(ir_infer(g->ctx, g, id) == MOE_OK);
	return id;
}

moe_id ir_b_bitcast(moe_graph *g, moe_id a, moe_dtype t, moe_loc loc)
{
	moe_id id = moe_node_new(g, MOE_OP_BITCAST, &a, 1, loc);
	moe_node_set_str(g, id, "to", moe_dtype_name(t));
	IR_ASSERT(ir_infer(g->ctx, g, id) == MOE_OK);
	return id;
}

moe_id ir_b_reshape(moe_graph *g, moe_id a, int rank, const int64_t *shape, moe_loc loc)
{
	moe_id id = moe_node_new(g, MOE_OP_RESHAPE, &a, 1, loc);
	moe_node_set_ints(g, id, "shape", shape, rank);
	IR_ASSERT(ir_infer(g->ctx, g, id) == MOE_OK);
	return id;
}

moe_id ir_b_reduce(moe_graph *g, moe_op op, moe_id a, int axis, bool keepdims, moe_loc loc)
{
	moe_id id = moe_node_new(g, op, &a, 1, loc);
	moe_node_set_int(g, id, "axis", axis);
	moe_node_set_int(g, id, "keepdims", keepdims);
	IR_ASSERT(ir_infer(g->ctx, g, id) == MOE_OK);
	return id;
}

moe_id ir_b_slice(moe_graph *g, moe_id a, int axis, int64_t start, int64_t stop, moe_loc loc)
{
	moe_id id = moe_node_new(g, MOE_OP_SLICE, &a, 1, loc);
	moe_node_set_int(g, id, "axis", axis);
	moe_node_set_int(g, id, "start", start);
	moe_node_set_int(g, id, "stop", stop);
	IR_ASSERT(ir_infer(g->ctx, g, id) == MOE_OK);
	return id;
}

moe_id ir_b_concat(moe_graph *g, const moe_id *parts, uint32_t n, int axis, moe_loc loc)
{
	moe_id id = moe_node_new(g, MOE_OP_CONCAT, parts, n, loc);
	moe_node_set_int(g, id, "axis", axis);
	IR_ASSERT(ir_infer(g->ctx, g, id) == MOE_OK);
	return id;
}

moe_id ir_b_einsum(moe_graph *g, const char *eq, moe_id a, moe_id b, moe_loc loc)
{
	moe_id x[2] = {a, b};
	moe_id id = moe_node_new(g, MOE_OP_EINSUM, x, b == MOE_NONE ? 1 : 2, loc);
	moe_node_set_str(g, id, "eq", eq);
	IR_ASSERT(ir_infer(g->ctx, g, id) == MOE_OK);
	return id;
}
