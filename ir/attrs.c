/* ir/attrs.c: the attribute schema of every op (the ATTRS rows of
 * moec/ops.def), the one name table of experts activations, and the check
 * that every reader (.moe lowering, textual IR, JSON) and the verifier apply
 * to each attribute. */
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
const char *const ir_dequant_acts[] = {"bf16", "fp8", NULL};
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

const ir_attrspec *ir_attr_spec(moe_op op, const char *key)
{
	for (const ir_attrspec *s = ir_op_attrs(op); s->key; s++)
		if (!strcmp(s->key, key))
			return s;
	for (const ir_attrspec *s = attrs_ANY; s->key; s++) /* keys of every op */
		if (!strcmp(s->key, key))
			return s;
	return NULL;
}

static bool is_open(moe_op op)
{
	return ir_attr_spec(op, "*") != NULL;
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

bool ir_attr_check(moe_ctx *ctx, moe_op op, const ir_attr *a, moe_loc loc)
{
	const char *on = moe_op_name(op);
	char buf[256];
	const ir_attrspec *s = ir_attr_spec(op, a->key);
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
