/* ir/attrs.c: the attribute schema of every op (the ATTRS rows of
 * moec/ops.def), the attribute sets targets register on a context, the one
 * name table of experts activations, and the check that every reader (.moe
 * lowering, textual IR, JSON) and the verifier apply to each attribute: the
 * op's own row first, then the set of the target the key's prefix names. */
#include <ctype.h>
#include <string.h>

#include "ir/ir.h"

const char *const ir_act_names[IR_ACT_COUNT + 1] = {
	[IR_ACT_SWIGLU] = "swiglu",
	[IR_ACT_GEGLU] = "geglu",
	[IR_ACT_GEGLU_TANH] = "geglu_tanh",
	[IR_ACT_GPT_OSS] = "gpt_oss",
	[IR_ACT_NONE] = "none",
	[IR_ACT_RELU2] = "relu2",
	[IR_ACT_COUNT] = NULL,
};
const char *const ir_scatter_modes[] = {"set", "add", NULL};
const char *const ir_dequant_acts[] = {"bf16", "fp8", "int8", NULL};
const char *const ir_dequant_gscales[] = {"div", "mul", NULL};
const char *const ir_weight_on_names[] = {"output", "input", NULL};

#define A_INT(k, d) {#k, IR_AT_INT, false, (d), 0, NULL, NULL},
#define A_NUM(k, d) {#k, IR_AT_NUM, false, 0, (d), NULL, NULL},
#define A_STR(k, d, v) {#k, IR_AT_STR, false, 0, 0, (d), (v)},
#define A_TYPE(k) {#k, IR_AT_TYPE, false, 0, 0, NULL, NULL},
#define A_INTS(k) {#k, IR_AT_INTS, false, 0, 0, NULL, NULL},
#define REQ_A_INT(k, d) {#k, IR_AT_INT, true, (d), 0, NULL, NULL},
#define REQ_A_NUM(k, d) {#k, IR_AT_NUM, true, 0, (d), NULL, NULL},
#define REQ_A_STR(k, d, v) {#k, IR_AT_STR, true, 0, 0, (d), (v)},
#define REQ_A_TYPE(k) {#k, IR_AT_TYPE, true, 0, 0, NULL, NULL},
#define REQ_A_INTS(k) {#k, IR_AT_INTS, true, 0, 0, NULL, NULL},
#define A_REQ(row) REQ_##row
#define A_OPEN {"*", IR_AT_INT, false, 0, 0, NULL, NULL},
#define ATTRS(name, rows) static const ir_attrspec attrs_##name[] = {rows{NULL, IR_AT_INT, false, 0, 0, NULL, NULL}};
#define OP(id, name, mn, mx, rule, flags, attrs)
#include "moec/ops.def"
#undef OP
#undef ATTRS

static const ir_attrspec *const op_attrs[MOE_OP_COUNT] = {
#define OP(id, name, mn, mx, rule, flags, attrs) [MOE_OP_##id] = attrs_##attrs,
#include "moec/ops.def"
#undef OP
};

const ir_attrspec *ir_op_attrs(moe_op op)
{
	IR_ASSERT((unsigned)op < MOE_OP_COUNT);
	return op_attrs[op];
}

/* Prefixes reserved for targets: a key under one of them is a target's
 * attribute, accepted only where that target registered its set. A prefix a
 * target registers is a target prefix too. */
static const char *const target_prefixes[] = {"tcp", NULL};

/* One registered attribute: a row of the context's ctx_target_attrs. */
typedef struct trow {
	const char *prefix; /* interned */
	ir_attrspec spec;   /* key interned */
	unsigned ops;
	const char *summary;
} trow;

static const ir_attrspec *own_spec(moe_op op, const char *key)
{
	for (const ir_attrspec *s = ir_op_attrs(op); s->key; s++)
		if (!strcmp(s->key, key))
			return s;
	return NULL;
}

/* The prefix of key (the text before its first '_') into buf; false if key
 * has no '_' or the prefix does not fit. */
static bool key_prefix(const char *key, char *buf, size_t len)
{
	const char *u = strchr(key, '_');
	if (!u || u == key || (size_t)(u - key) >= len)
		return false;
	memcpy(buf, key, (size_t)(u - key));
	buf[u - key] = 0;
	return true;
}

static const trow *row_at(moe_ctx *ctx, uint32_t i)
{
	return ((trow **)ctx_target_attrs(ctx)->data)[i];
}

bool ir_target_attrs_registered(moe_ctx *ctx, const char *prefix)
{
	ctx_vec *v = ctx_target_attrs(ctx);
	for (uint32_t i = 0; prefix && i < v->n; i++)
		if (!strcmp(row_at(ctx, i)->prefix, prefix))
			return true;
	return false;
}

static const trow *target_row(moe_ctx *ctx, const char *key)
{
	ctx_vec *v = ctx_target_attrs(ctx);
	for (uint32_t i = 0; i < v->n; i++)
		if (!strcmp(row_at(ctx, i)->spec.key, key))
			return row_at(ctx, i);
	return NULL;
}

static bool op_in(moe_op op, unsigned ops)
{
	return !ops || (ir_ops[op].flags & ops);
}

const ir_attrspec *ir_attr_spec(moe_ctx *ctx, moe_op op, const char *key)
{
	const ir_attrspec *s = own_spec(op, key);
	if (s)
		return s;
	const trow *r = target_row(ctx, key);
	return r && op_in(op, r->ops) ? &r->spec : NULL;
}

static bool valid_ident(const char *s)
{
	if (!s || !(islower((unsigned char)*s)))
		return false;
	for (; *s; s++)
		if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '_'))
			return false;
	return true;
}

/* The rows of set are well formed: keys <prefix>_<name>, each once, a kind
 * a reader can check. */
static bool set_ok(moe_ctx *ctx, const char *prefix, const ir_target_attr *set, uint32_t *n)
{
	size_t pl = prefix ? strlen(prefix) : 0;
	if (!valid_ident(prefix) || strchr(prefix, '_') || !set || !set[0].key) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
			"a target attribute set needs a prefix of [a-z0-9] and at least one attribute");
		return false;
	}
	for (*n = 0; set[*n].key; (*n)++) {
		const ir_target_attr *a = &set[*n];
		bool dup = false;
		for (uint32_t j = 0; j < *n; j++)
			dup |= !strcmp(set[j].key, a->key);
		if (!valid_ident(a->key) || strncmp(a->key, prefix, pl) || a->key[pl] != '_' || !a->key[pl + 1] || dup ||
			(unsigned)a->type > IR_AT_INTS) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
				"target '%s': attribute '%s' is not a new key %s_<name> of [a-z0-9_] with a known kind", prefix,
				a->key, prefix);
			return false;
		}
	}
	if (ir_target_attrs_registered(ctx, prefix)) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "the attributes of target '%s' are already registered", prefix);
		return false;
	}
	return true;
}

static moe_status attrs_register(moe_ctx *ctx, const char *prefix, const ir_target_attr *set)
{
	uint32_t n;
	if (!set_ok(ctx, prefix, set, &n))
		return MOE_ERR_INVALID;
	ctx_vec *v = ctx_target_attrs(ctx);
	trow **rows = ctx_alloc(ctx, n * sizeof *rows);
	const char *pi = ctx_intern(ctx, prefix);
	for (uint32_t i = 0; i < n; i++) {
		rows[i] = ctx_alloc(ctx, sizeof **rows);
		*rows[i] = (trow){pi, {ctx_intern(ctx, set[i].key), set[i].type, false, set[i].idef, 0, NULL, NULL},
			set[i].ops, ctx_intern(ctx, set[i].summary ? set[i].summary : "")};
	}
	v->esz = sizeof(trow *);
	v->row = sizeof(trow);
	ctx_grow(ctx, &v->data, &v->cap, v->n + n, v->esz); /* the last allocation: then the table changes */
	ctx_commit_point(ctx);
	ctx_keep(ctx, v->data);
	for (uint32_t i = 0; i < n; i++) {
		ctx_keep(ctx, rows[i]);
		((trow **)v->data)[v->n++] = rows[i];
	}
	ctx_free(ctx, rows, n * sizeof *rows);
	return MOE_OK;
}

moe_status ir_target_attrs_register(moe_ctx *ctx, const char *prefix, const ir_target_attr *set)
{
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, attrs_register(ctx, prefix, set));
}

static bool is_open(moe_op op)
{
	return own_spec(op, "*") != NULL;
}

int ir_name_index(const char *const *names, const char *s)
{
	for (int i = 0; names[i]; i++)
		if (!strcmp(names[i], s))
			return i;
	return -1;
}

ir_act ir_node_act(const ir_node *n)
{
	int a = ir_name_index(ir_act_names, ir_attr_str(n, "act", ir_act_names[IR_ACT_SWIGLU]));
	return a < 0 ? IR_ACT_COUNT : (ir_act)a;
}

/* "a, b, c" from a NULL-terminated list into buf. */
static const char *join(const char *const *names, char *buf, size_t len)
{
	size_t o = 0;
	buf[0] = 0;
	for (int i = 0; names[i] && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", names[i]);
	return buf;
}

static const char *keys_of(moe_op op, char *buf, size_t len)
{
	const char *names[16];
	int n = 0;
	for (const ir_attrspec *s = ir_op_attrs(op); s->key && n < 15; s++)
		if (strcmp(s->key, "*"))
			names[n++] = s->key;
	names[n] = NULL;
	return n ? join(names, buf, len) : "none";
}

static const char *kind_text(ir_attr_type t)
{
	switch (t) {
	case IR_AT_INT: return "an integer";
	case IR_AT_NUM: return "a number";
	case IR_AT_STR: return "a string";
	case IR_AT_TYPE: return "a type name (f32, bf16, i32, bool)";
	case IR_AT_INTS: return "a list of integers";
	}
	return "?";
}

static bool kind_ok(const ir_attrspec *s, const ir_attr *a)
{
	switch (s->type) {
	case IR_AT_INT: return a->kind == MOE_ATTR_INT;
	case IR_AT_NUM: return a->kind == MOE_ATTR_INT || a->kind == MOE_ATTR_FLOAT;
	case IR_AT_STR: return a->kind == MOE_ATTR_STR;
	case IR_AT_TYPE: return a->kind == MOE_ATTR_STR && moe_dtype_from_name(a->v.s) >= 0;
	case IR_AT_INTS: return a->kind == MOE_ATTR_INTS;
	}
	return false;
}

static const char *target_keys(moe_ctx *ctx, const char *prefix, char *buf, size_t len)
{
	size_t o = 0;
	ctx_vec *v = ctx_target_attrs(ctx);
	buf[0] = 0;
	for (uint32_t i = 0; i < v->n && o < len; i++)
		if (!strcmp(row_at(ctx, i)->prefix, prefix))
			o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", row_at(ctx, i)->spec.key);
	return buf;
}

/* The spec of a key that is not in op's own row: the registered target's,
 * or NULL with *said when that is an error already reported, or NULL
 * without *said when no target claims the key. */
static const ir_attrspec *target_spec(moe_ctx *ctx, moe_op op, const char *key, moe_loc loc, bool *said)
{
	char pfx[32], buf[256];
	*said = false;
	if (!key_prefix(key, pfx, sizeof pfx))
		return NULL;
	if (ir_target_attrs_registered(ctx, pfx)) {
		const trow *r = target_row(ctx, key);
		*said = true;
		if (!r)
			moe_diag(ctx, MOE_DIAG_ERROR, loc, "target '%s' has no attribute '%s' (its attributes: %s)", pfx, key,
				target_keys(ctx, pfx, buf, sizeof buf));
		else if (!op_in(op, r->ops))
			moe_diag(ctx, MOE_DIAG_ERROR, loc, "attribute '%s' of target '%s' is not allowed on '%s'", key, pfx,
				moe_op_name(op));
		else
			*said = false;
		return *said ? NULL : &r->spec;
	}
	if (ir_name_index(target_prefixes, pfx) >= 0) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc,
			"attribute %s belongs to the target '%s', which is not registered in this context", key, pfx);
		*said = true;
	}
	return NULL;
}

bool ir_attr_check(moe_ctx *ctx, moe_op op, const ir_attr *a, moe_loc loc)
{
	const char *on = moe_op_name(op);
	char buf[256];
	const ir_attrspec *s = own_spec(op, a->key);
	if (!s) {
		bool said;
		s = target_spec(ctx, op, a->key, loc, &said);
		if (said)
			return false;
	}
	if (!s && is_open(op))
		return true;
	if (!s || !strcmp(a->key, "*")) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "'%s' has no attribute '%s' (its attributes: %s)", on, a->key,
			keys_of(op, buf, sizeof buf));
		return false;
	}
	if (!kind_ok(s, a)) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "attribute '%s' of '%s' must be %s", a->key, on, kind_text(s->type));
		return false;
	}
	if (s->type == IR_AT_STR && s->names && ir_name_index(s->names, a->v.s) < 0) {
		moe_diag(ctx, MOE_DIAG_ERROR, loc, "attribute '%s' of '%s' must be one of %s, got '%s'", a->key, on,
			join(s->names, buf, sizeof buf), a->v.s);
		return false;
	}
	return true;
}

bool ir_node_attrs_check(moe_ctx *ctx, const ir_node *n)
{
	bool ok = true;
	for (uint32_t i = 0; i < n->nattrs; i++)
		ok &= ir_attr_check(ctx, (moe_op)n->op, &n->attrs[i], n->loc);
	return ok;
}
