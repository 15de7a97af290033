/* ir/shape.c: dtype and shape inference, one rule per op family (ops.def).
 * Every rule reports user-facing diagnostics at the node's location. */
#include <string.h>

#include "ir/ir.h"

typedef struct infer {
	moe_ctx *ctx;
	moe_graph *g;
	ir_node *n;
	const char *op;
} infer;

#define ERR(c, ...) (moe_diag((c)->ctx, MOE_DIAG_ERROR, (c)->n->loc, __VA_ARGS__), MOE_ERR_INVALID)

static ir_node *arg(infer *c, uint32_t i)
{
	return N(c->g, c->n->args[i]);
}

static void fmt_shape(const ir_node *n, char *buf, size_t len)
{
	size_t o = 0;
	o += (size_t)snprintf(buf + o, len - o, "%s[", moe_dtype_name((moe_dtype)n->dtype));
	for (int i = 0; i < n->rank && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)n->shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static void set_out(infer *c, moe_dtype t, int rank, const int64_t *shape)
{
	c->n->dtype = (uint8_t)t;
	c->n->rank = (uint8_t)rank;
	for (int i = 0; i < rank; i++)
		c->n->shape[i] = shape[i];
}

static moe_status want_float(infer *c, const ir_node *a)
{
	if (!moe_dtype_is_float((moe_dtype)a->dtype))
		return ERR(c, "'%s' needs a floating-point operand, got %s", c->op, moe_dtype_name((moe_dtype)a->dtype));
	return MOE_OK;
}

static moe_status want_int(infer *c, const ir_node *a)
{
	if (a->dtype != MOE_I32 && a->dtype != MOE_BOOL)
		return ERR(c, "'%s' needs an integer or bool operand, got %s", c->op, moe_dtype_name((moe_dtype)a->dtype));
	return MOE_OK;
}

static moe_status get_axis(infer *c, int rank, const char *key, int def, int *axis)
{
	int64_t a = ir_attr_int(c->n, key, def);
	int r = ir_norm_axis((int)a, rank);
	if (a < -MOE_MAX_RANK || a > MOE_MAX_RANK || r < 0)
		return ERR(c, "'%s': axis %lld out of range for rank %d", c->op, (long long)a, rank);
	*axis = r;
	return MOE_OK;
}

/* numpy broadcasting of several operands into out */
static moe_status broadcast(infer *c, ir_node **xs, int nx, int *rank, int64_t *shape)
{
	int r = 0;
	for (int i = 0; i < nx; i++)
		if (xs[i]->rank > r)
			r = xs[i]->rank;
	for (int d = 0; d < r; d++) {
		int64_t s = 1;
		for (int i = 0; i < nx; i++) {
			int k = d - (r - xs[i]->rank);
			if (k < 0)
				continue;
			int64_t v = xs[i]->shape[k];
			if (v == 1 || v == s)
				continue;
			if (s != 1) {
				char a[128], b[128];
				fmt_shape(xs[0], a, sizeof a);
				fmt_shape(xs[i], b, sizeof b);
				return ERR(c, "'%s': shapes %s and %s do not broadcast", c->op, a, b);
			}
			s = v;
		}
		shape[d] = s;
	}
	*rank = r;
	return MOE_OK;
}

static moe_status r_leaf(infer *c)
{
	ir_node *n = c->n;
	if (n->op == MOE_OP_IOTA) {
		int ax;
		if (n->rank == 0)
			return ERR(c, "'iota' needs a shape of rank >= 1");
		if (get_axis(c, n->rank, "axis", 0, &ax))
			return MOE_ERR_INVALID;
		n->dtype = MOE_I32;
	}
	if (n->op == MOE_OP_CONST && !ir_attr_find(n, "value"))
		return ERR(c, "'const' needs a value");
	return MOE_OK;
}

static moe_status r_unary(infer *c)
{
	ir_node *a = arg(c, 0);
	unsigned f = ir_ops[c->n->op].flags;
	if ((f & OPF_FLOAT) && want_float(c, a))
		return MOE_ERR_INVALID;
	if ((f & OPF_INT) && want_int(c, a))
		return MOE_ERR_INVALID;
	if (a->dtype == MOE_BOOL && (c->n->op == MOE_OP_NEG || c->n->op == MOE_OP_ABS))
		return ERR(c, "'%s' is not defined on bool", c->op);
	set_out(c, (moe_dtype)a->dtype, a->rank, a->shape);
	return MOE_OK;
}

static moe_status r_binary(infer *c)
{
	ir_node *xs[2] = {arg(c, 0), arg(c, 1)};
	unsigned f = ir_ops[c->n->op].flags;
	if (xs[0]->dtype != xs[1]->dtype)
		return ERR(c, "'%s': operand types differ (%s and %s); insert a cast", c->op,
			moe_dtype_name((moe_dtype)xs[0]->dtype), moe_dtype_name((moe_dtype)xs[1]->dtype));
	if ((f & OPF_INT) && want_int(c, xs[0]))
		return MOE_ERR_INVALID;
	moe_op op = (moe_op)c->n->op;
	if (xs[0]->dtype == MOE_BOOL && !(f & OPF_INT) && op != MOE_OP_EQ && op != MOE_OP_NE)
		return ERR(c, "'%s' is not defined on bool", c->op);
	if (xs[0]->dtype == MOE_BOOL && (op == MOE_OP_SHL || op == MOE_OP_SHR || op == MOE_OP_SAR))
		return ERR(c, "'%s' is not defined on bool", c->op);
	int r;
	int64_t s[MOE_MAX_RANK];
	if (broadcast(c, xs, 2, &r, s))
		return MOE_ERR_INVALID;
	set_out(c, (f & OPF_CMP) ? MOE_BOOL : (moe_dtype)xs[0]->dtype, r, s);
	return MOE_OK;
}

static moe_status r_select(infer *c)
{
	ir_node *xs[3] = {arg(c, 0), arg(c, 1), arg(c, 2)};
	if (xs[0]->dtype != MOE_BOOL)
		return ERR(c, "'select': the condition must be bool, got %s", moe_dtype_name((moe_dtype)xs[0]->dtype));
	if (xs[1]->dtype != xs[2]->dtype)
		return ERR(c, "'select': branch types differ (%s and %s)", moe_dtype_name((moe_dtype)xs[1]->dtype),
			moe_dtype_name((moe_dtype)xs[2]->dtype));
	int r;
	int64_t s[MOE_MAX_RANK];
	if (broadcast(c, xs, 3, &r, s))
		return MOE_ERR_INVALID;
	set_out(c, (moe_dtype)xs[1]->dtype, r, s);
	return MOE_OK;
}

static moe_status get_dtype_attr(infer *c, moe_dtype *t)
{
	const char *to = ir_attr_str(c->n, "to", NULL);
	int d = to ? moe_dtype_from_name(to) : -1;
	if (d < 0)
		return ERR(c, "'%s': unknown target type '%s'", c->op, to ? to : "(none)");
	/* a cast of i32 byte values back to u8 writes raw bytes (a load-time rewrite of packed values) */
	bool bytes = d == MOE_U8 && c->n->op == MOE_OP_CAST && c->n->nargs == 1 && arg(c, 0)->dtype == MOE_I32;
	if ((d == MOE_F8E4M3 || d == MOE_I8 || d == MOE_U8) && !bytes)
		return ERR(c, "'%s': type %s is storage only (quantized weights are read by dequant)", c->op, to);
	*t = (moe_dtype)d;
	return MOE_OK;
}

static moe_status r_cast(infer *c)
{
	moe_dtype t;
	if (get_dtype_attr(c, &t))
		return MOE_ERR_INVALID;
	ir_node *a = arg(c, 0);
	set_out(c, t, a->rank, a->shape);
	return MOE_OK;
}

static moe_status r_bitcast(infer *c)
{
	moe_dtype t;
	if (get_dtype_attr(c, &t))
		return MOE_ERR_INVALID;
	ir_node *a = arg(c, 0);
	if (moe_dtype_size(t) != moe_dtype_size((moe_dtype)a->dtype) || t == MOE_BOOL || a->dtype == MOE_BOOL)
		return ERR(c, "'bitcast' from %s to %s changes the element size", moe_dtype_name((moe_dtype)a->dtype),
			moe_dtype_name(t));
	set_out(c, t, a->rank, a->shape);
	return MOE_OK;
}

static moe_status r_reduce(infer *c)
{
	ir_node *a = arg(c, 0);
	int ax;
	if (a->rank == 0)
		return ERR(c, "'%s' needs an operand of rank >= 1", c->op);
	if (get_axis(c, a->rank, "axis", -1, &ax))
		return MOE_ERR_INVALID;
	bool keep = ir_attr_int(c->n, "keepdims", 0) != 0;
	int64_t s[MOE_MAX_RANK];
	int r = 0;
	for (int i = 0; i < a->rank; i++) {
		if (i == ax && !keep)
			continue;
		s[r++] = i == ax ? 1 : a->shape[i];
	}
	moe_dtype t = a->dtype == MOE_BOOL ? MOE_I32 : (moe_dtype)a->dtype;
	set_out(c, t, r, s);
	return MOE_OK;
}

static moe_status r_softmax(infer *c)
{
	ir_node *a = arg(c, 0);
	int ax;
	if (want_float(c, a))
		return MOE_ERR_INVALID;
	if (a->rank == 0)
		return ERR(c, "'softmax' needs an operand of rank >= 1");
	if (get_axis(c, a->rank, "axis", -1, &ax))
		return MOE_ERR_INVALID;
	set_out(c, (moe_dtype)a->dtype, a->rank, a->shape);
	return MOE_OK;
}

static moe_status r_cumsum(infer *c)
{
	ir_node *a = arg(c, 0);
	int ax;
	if (a->rank == 0)
		return ERR(c, "'cumsum' needs an operand of rank >= 1");
	if (get_axis(c, a->rank, "axis", -1, &ax))
		return MOE_ERR_INVALID;
	set_out(c, a->dtype == MOE_BOOL ? MOE_I32 : (moe_dtype)a->dtype, a->rank, a->shape);
	return MOE_OK;
}

bool ir_einsum_parse(const char *eq, ir_einsum *e, char *msg, size_t ml)
{
	memset(e, 0, sizeof *e);
	const char *arrow = eq ? strstr(eq, "->") : NULL;
	if (!arrow) {
		snprintf(msg, ml, "einsum equation '%s' has no '->'", eq ? eq : "");
		return false;
	}
	int which = 0, k = 0;
	bool seen_out[26] = {0};
	for (const char *p = eq; p < arrow; p++) {
		if (*p == ' ')
			continue;
		if (*p == ',') {
			if (which == 1) {
				snprintf(msg, ml, "einsum takes at most two operands");
				return false;
			}
			e->rank[which++] = k;
			k = 0;
			continue;
		}
		if (*p < 'a' || *p > 'z') {
			snprintf(msg, ml, "einsum index '%c' is not a lower-case letter", *p);
			return false;
		}
		if (k == MOE_MAX_RANK) {
			snprintf(msg, ml, "einsum operand has more than %d indices", MOE_MAX_RANK);
			return false;
		}
		for (int j = 0; j < k; j++)
			if (e->in[which][j] == *p) {
				snprintf(msg, ml, "einsum index '%c' repeats within one operand (diagonals are not supported)", *p);
				return false;
			}
		e->in[which][k++] = *p;
		if (!memchr(e->letters, *p, (size_t)e->nletters))
			e->letters[e->nletters++] = *p;
	}
	e->rank[which] = k;
	e->nin = which + 1;
	k = 0;
	for (const char *p = arrow + 2; *p; p++) {
		if (*p == ' ')
			continue;
		if (*p < 'a' || *p > 'z') {
			snprintf(msg, ml, "einsum output index '%c' is not a lower-case letter", *p);
			return false;
		}
		if (seen_out[*p - 'a']) {
			snprintf(msg, ml, "einsum output index '%c' repeats", *p);
			return false;
		}
		seen_out[*p - 'a'] = true;
		if (!memchr(e->letters, *p, (size_t)e->nletters)) {
			snprintf(msg, ml, "einsum output index '%c' appears in no operand", *p);
			return false;
		}
		if (k == MOE_MAX_RANK) {
			snprintf(msg, ml, "einsum output has more than %d indices", MOE_MAX_RANK);
			return false;
		}
		e->out[k++] = *p;
	}
	e->out_rank = k;
	return true;
}

static moe_status r_einsum(infer *c)
{
	const char *eq = ir_attr_str(c->n, "eq", NULL);
	ir_einsum e;
	char msg[160];
	if (!ir_einsum_parse(eq, &e, msg, sizeof msg))
		return ERR(c, "%s", msg);
	if (e.nin != (int)c->n->nargs)
		return ERR(c, "einsum equation '%s' names %d operand(s) but %u were given", eq, e.nin, c->n->nargs);
	int64_t size[26];
	for (int i = 0; i < 26; i++)
		size[i] = -1;
	moe_dtype t = (moe_dtype)arg(c, 0)->dtype;
	for (int i = 0; i < e.nin; i++) {
		ir_node *a = arg(c, (uint32_t)i);
		if (a->dtype != t)
			return ERR(c, "einsum operand types differ (%s and %s); insert a cast", moe_dtype_name(t),
				moe_dtype_name((moe_dtype)a->dtype));
		if (a->rank != e.rank[i]) {
			char s[128];
			fmt_shape(a, s, sizeof s);
			return ERR(c, "einsum operand %d has %d indices in '%s' but its shape is %s", i + 1, e.rank[i], eq, s);
		}
		for (int d = 0; d < a->rank; d++) {
			int l = e.in[i][d] - 'a';
			if (size[l] >= 0 && size[l] != a->shape[d])
				return ERR(c, "einsum index '%c' in '%s' has size %lld in one place and %lld in another",
					e.in[i][d], eq, (long long)size[l], (long long)a->shape[d]);
			size[l] = a->shape[d];
		}
	}
	if (t == MOE_BOOL)
		return ERR(c, "einsum is not defined on bool");
	int64_t s[MOE_MAX_RANK];
	for (int d = 0; d < e.out_rank; d++)
		s[d] = size[e.out[d] - 'a'];
	set_out(c, t, e.out_rank, s);
	return MOE_OK;
}

static moe_status r_topk(infer *c)
{
	ir_node *a = arg(c, 0);
	if (a->rank == 0)
		return ERR(c, "'topk' needs an operand of rank >= 1");
	if (a->dtype == MOE_BOOL)
		return ERR(c, "'topk' is not defined on bool");
	ir_attr *ka = ir_attr_find(c->n, "k");
	if (!ka)
		return ERR(c, "'topk' needs k");
	int64_t k = ir_attr_int(c->n, "k", 0), n = a->shape[a->rank - 1];
	if (k <= 0)
		return ERR(c, "'topk': k must be positive, got %lld", (long long)k);
	if (k > n)
		return ERR(c, "'topk': k = %lld exceeds the %lld candidates (K > E)", (long long)k, (long long)n);
	int64_t s[MOE_MAX_RANK];
	memcpy(s, a->shape, sizeof s);
	s[a->rank - 1] = k;
	set_out(c, MOE_I32, a->rank, s);
	return MOE_OK;
}

static moe_status r_one_hot(infer *c)
{
	ir_node *a = arg(c, 0);
	if (want_int(c, a))
		return MOE_ERR_INVALID;
	int64_t n = ir_attr_int(c->n, "n", 0);
	if (n <= 0)
		return ERR(c, "'one_hot' needs a positive depth n");
	if (a->rank == MOE_MAX_RANK)
		return ERR(c, "'one_hot' result would exceed rank %d", MOE_MAX_RANK);
	int64_t s[MOE_MAX_RANK];
	memcpy(s, a->shape, sizeof s);
	s[a->rank] = n;
	set_out(c, MOE_I32, a->rank + 1, s);
	return MOE_OK;
}

static moe_status r_filter(infer *c)
{
	ir_node *m = arg(c, 0), *v = arg(c, 1);
	if (want_int(c, m))
		return MOE_ERR_INVALID;
	if (!ir_same_shape(m, v) || v->rank == 0)
		return ERR(c, "'filter': the mask and the values must have one shape of rank >= 1");
	set_out(c, (moe_dtype)v->dtype, v->rank, v->shape);
	return MOE_OK;
}

static moe_status want_index(infer *c, const ir_node *i)
{
	if (i->dtype != MOE_I32)
		return ERR(c, "'%s': indices must be i32, got %s", c->op, moe_dtype_name((moe_dtype)i->dtype));
	return MOE_OK;
}

/* all_to_all(x [S, ...], counts i32 [ep]) -> [rows, ...] of x's dtype. */
static moe_status r_all_to_all(infer *c)
{
	ir_node *x = arg(c, 0), *k = arg(c, 1);
	int64_t ep = ir_attr_int(c->n, "ep", 0), rows = ir_attr_int(c->n, "rows", -1);
	if (ep < 1 || ep > 4096)
		return ERR(c, "'all_to_all' needs ep in 1..4096, got %lld", (long long)ep);
	if (rows < 0 || rows > MOE_MAX_DIM)
		return ERR(c, "'all_to_all' needs rows in 0..%lld, got %lld", (long long)MOE_MAX_DIM, (long long)rows);
	if (x->rank < 1)
		return ERR(c, "'all_to_all' needs rows to send: x of rank >= 1");
	if (k->dtype != MOE_I32 || k->rank != 1 || k->shape[0] != ep)
		return ERR(c, "'all_to_all' counts must be i32[%lld] (one per device)", (long long)ep);
	int64_t s[MOE_MAX_RANK];
	memcpy(s, x->shape, sizeof s);
	s[0] = rows;
	set_out(c, (moe_dtype)x->dtype, x->rank, s);
	return MOE_OK;
}

static moe_status r_gather(infer *c)
{
	ir_node *x = arg(c, 0), *i = arg(c, 1);
	int ax;
	if (want_index(c, i))
		return MOE_ERR_INVALID;
	if (x->rank == 0)
		return ERR(c, "'gather' needs a source of rank >= 1");
	if (get_axis(c, x->rank, "axis", 0, &ax))
		return MOE_ERR_INVALID;
	if (x->rank - 1 + i->rank > MOE_MAX_RANK)
		return ERR(c, "'gather' result would exceed rank %d", MOE_MAX_RANK);
	int64_t s[MOE_MAX_RANK];
	int r = 0;
	for (int d = 0; d < ax; d++)
		s[r++] = x->shape[d];
	for (int d = 0; d < i->rank; d++)
		s[r++] = i->shape[d];
	for (int d = ax + 1; d < x->rank; d++)
		s[r++] = x->shape[d];
	set_out(c, (moe_dtype)x->dtype, r, s);
	return MOE_OK;
}

static moe_status r_take_along(infer *c)
{
	ir_node *x = arg(c, 0), *i = arg(c, 1);
	int ax;
	if (want_index(c, i))
		return MOE_ERR_INVALID;
	if (x->rank == 0 || x->rank != i->rank)
		return ERR(c, "'take_along': source and indices must have one rank >= 1");
	if (get_axis(c, x->rank, "axis", -1, &ax))
		return MOE_ERR_INVALID;
	for (int d = 0; d < x->rank; d++)
		if (d != ax && x->shape[d] != i->shape[d])
			return ERR(c, "'take_along': source and indices differ in dimension %d (%lld and %lld)", d,
				(long long)x->shape[d], (long long)i->shape[d]);
	set_out(c, (moe_dtype)x->dtype, i->rank, i->shape);
	return MOE_OK;
}

static moe_status r_scatter(infer *c)
{
	ir_node *b = arg(c, 0), *i = arg(c, 1), *s = arg(c, 2);
	if (want_index(c, i))
		return MOE_ERR_INVALID;
	if (b->rank == 0)
		return ERR(c, "'scatter' needs a destination of rank >= 1");
	if (b->dtype != s->dtype)
		return ERR(c, "'scatter': destination and source types differ");
	if (s->rank != i->rank + b->rank - 1)
		return ERR(c, "'scatter': source must have shape indices.shape + destination.shape[1:]");
	for (int d = 0; d < i->rank; d++)
		if (s->shape[d] != i->shape[d])
			return ERR(c, "'scatter': source must have shape indices.shape + destination.shape[1:]");
	for (int d = 1; d < b->rank; d++)
		if (s->shape[i->rank + d - 1] != b->shape[d])
			return ERR(c, "'scatter': source must have shape indices.shape + destination.shape[1:]");
	const char *mode = ir_attr_str(c->n, "mode", "set");
	if (strcmp(mode, "set") && strcmp(mode, "add"))
		return ERR(c, "'scatter': mode must be set or add, got '%s'", mode);
	set_out(c, (moe_dtype)b->dtype, b->rank, b->shape);
	return MOE_OK;
}

static moe_status r_reshape(infer *c)
{
	ir_node *a = arg(c, 0);
	const int64_t *s;
	int r = ir_attr_ints(c->n, "shape", &s);
	if (r < 0 || r > MOE_MAX_RANK)
		return ERR(c, "'reshape' needs a shape of rank <= %d", MOE_MAX_RANK);
	int64_t e = 1;
	for (int i = 0; i < r; i++)
		if (s[i] <= 0 || !ir_mul_ov(e, s[i], &e))
			return ERR(c, "'reshape': bad target shape");
	if (e != ir_numel(a))
		return ERR(c, "'reshape' from %lld elements to %lld", (long long)ir_numel(a), (long long)e);
	set_out(c, (moe_dtype)a->dtype, r, s);
	return MOE_OK;
}

static moe_status r_slice(infer *c)
{
	ir_node *a = arg(c, 0);
	int ax;
	if (a->rank == 0)
		return ERR(c, "'slice' needs an operand of rank >= 1");
	if (get_axis(c, a->rank, "axis", 0, &ax))
		return MOE_ERR_INVALID;
	int64_t n = a->shape[ax];
	int64_t start = ir_attr_int(c->n, "start", 0), stop = ir_attr_int(c->n, "stop", n),
		step = ir_attr_int(c->n, "step", 1);
	if (step <= 0 || start < 0 || stop > n || start >= stop)
		return ERR(c, "'slice' [%lld:%lld:%lld] is empty or outside 0..%lld", (long long)start, (long long)stop,
			(long long)step, (long long)n);
	int64_t s[MOE_MAX_RANK];
	memcpy(s, a->shape, sizeof s);
	s[ax] = (stop - start - 1) / step + 1; /* ceil((stop - start) / step) without overflow */
	set_out(c, (moe_dtype)a->dtype, a->rank, s);
	return MOE_OK;
}

static moe_status r_concat(infer *c)
{
	ir_node *a = arg(c, 0);
	int ax;
	if (a->rank == 0)
		return ERR(c, "'concat' needs operands of rank >= 1");
	if (get_axis(c, a->rank, "axis", 0, &ax))
		return MOE_ERR_INVALID;
	int64_t s[MOE_MAX_RANK];
	memcpy(s, a->shape, sizeof s);
	for (uint32_t i = 1; i < c->n->nargs; i++) {
		ir_node *b = arg(c, i);
		if (b->dtype != a->dtype || b->rank != a->rank)
			return ERR(c, "'concat' operands differ in type or rank");
		for (int d = 0; d < a->rank; d++)
			if (d != ax && b->shape[d] != a->shape[d])
				return ERR(c, "'concat' operands differ in dimension %d", d);
		if (!ir_add_ov(s[ax], b->shape[ax], &s[ax]))
			return ERR(c, "'concat' size overflows");
	}
	set_out(c, (moe_dtype)a->dtype, a->rank, s);
	return MOE_OK;
}

static moe_status r_broadcast(infer *c)
{
	ir_node *a = arg(c, 0);
	const int64_t *s;
	int r = ir_attr_ints(c->n, "shape", &s);
	if (r < a->rank || r > MOE_MAX_RANK)
		return ERR(c, "'broadcast' needs a target shape of rank between %d and %d", a->rank, MOE_MAX_RANK);
	for (int d = 0; d < a->rank; d++) {
		int64_t v = a->shape[d], t = s[r - a->rank + d];
		if (v != 1 && v != t)
			return ERR(c, "'broadcast': dimension %d of size %lld cannot become %lld", d, (long long)v, (long long)t);
	}
	set_out(c, (moe_dtype)a->dtype, r, s);
	return MOE_OK;
}

static moe_status r_experts(infer *c)
{
	moe_id *s = c->n->args;
	for (int i = 0; i < EXP_NSLOTS; i++) {
		bool opt = i == EXP_GATE || i >= EXP_B_GATE;
		if (s[i] == MOE_NONE && !opt)
			return ERR(c, "'experts' needs the operand '%s'", ir_experts_slot_names[i]);
	}
	ir_node *x = N(c->g, s[EXP_X]), *idx = N(c->g, s[EXP_IDX]), *w = N(c->g, s[EXP_W]);
	ir_node *up = N(c->g, s[EXP_UP]), *down = N(c->g, s[EXP_DOWN]);
	if (x->rank != 2)
		return ERR(c, "'experts': x must be [T, D]");
	int64_t T = x->shape[0], D = x->shape[1];
	if (want_index(c, idx))
		return MOE_ERR_INVALID;
	if (idx->rank != 2 || idx->shape[0] != T)
		return ERR(c, "'experts': idx must be [T, K] with T = %lld", (long long)T);
	int64_t K = idx->shape[1];
	if (w->rank != 2 || w->shape[0] != T || w->shape[1] != K || !moe_dtype_is_float((moe_dtype)w->dtype))
		return ERR(c, "'experts': w must be float [%lld, %lld] like idx", (long long)T, (long long)K);
	if (up->rank != 3 || up->shape[2] != D)
		return ERR(c, "'experts': up must be [E, F, D] with D = %lld (Linear [out, in] per expert)", (long long)D);
	int64_t E = up->shape[0], F = up->shape[1];
	if (K > E)
		return ERR(c, "'experts': K = %lld exceeds E = %lld", (long long)K, (long long)E);
	if (s[EXP_GATE] != MOE_NONE && !ir_same_shape(N(c->g, s[EXP_GATE]), up))
		return ERR(c, "'experts': gate must have the shape of up, [%lld, %lld, %lld]", (long long)E, (long long)F,
			(long long)D);
	if (down->rank != 3 || down->shape[0] != E || down->shape[1] != D || down->shape[2] != F)
		return ERR(c, "'experts': down must be [E, D, F] = [%lld, %lld, %lld]", (long long)E, (long long)D,
			(long long)F);
	int64_t bs[3][2] = {{E, F}, {E, F}, {E, D}};
	for (int i = 0; i < 3; i++) {
		moe_id b = s[EXP_B_GATE + i];
		if (b == MOE_NONE)
			continue;
		ir_node *bn = N(c->g, b);
		if (bn->rank != 2 || bn->shape[0] != bs[i][0] || bn->shape[1] != bs[i][1])
			return ERR(c, "'experts': %s must be [%lld, %lld]", ir_experts_slot_names[EXP_B_GATE + i],
				(long long)bs[i][0], (long long)bs[i][1]);
	}
	if (s[EXP_B_GATE] != MOE_NONE && s[EXP_GATE] == MOE_NONE)
		return ERR(c, "'experts': gate_bias given without gate");
	for (int i = 0; i < EXP_NSLOTS; i++) {
		if (i == EXP_IDX || i == EXP_W || s[i] == MOE_NONE)
			continue;
		if (N(c->g, s[i])->dtype != x->dtype)
			return ERR(c, "'experts': operand '%s' is %s but x is %s; insert a cast", ir_experts_slot_names[i],
				moe_dtype_name((moe_dtype)N(c->g, s[i])->dtype), moe_dtype_name((moe_dtype)x->dtype));
	}
	if (!moe_dtype_is_float((moe_dtype)x->dtype))
		return ERR(c, "'experts': x must be floating point");
	const char *act = ir_attr_str(c->n, "act", ir_act_names[IR_ACT_SWIGLU]);
	if (ir_node_act(c->n) == IR_ACT_COUNT)
		return ERR(c, "'experts': unknown activation '%s' (swiglu, geglu, geglu_tanh, gpt_oss, none, relu2)", act);
	bool gated = ir_node_act(c->n) != IR_ACT_NONE && ir_node_act(c->n) != IR_ACT_RELU2;
	if (gated != (s[EXP_GATE] != MOE_NONE))
		return ERR(c, gated ? "'experts': activation '%s' needs a gate weight" :
				      "'experts': activation '%s' takes no gate weight", act);
	const char *on = ir_attr_str(c->n, "weight_on", "output");
	if (strcmp(on, "output") && strcmp(on, "input"))
		return ERR(c, "'experts': weight_on must be output or input, got '%s'", on);
	int64_t B = ir_attr_int(c->n, "block", 0);
	if (B <= 0)
		return ERR(c, "'experts': block size B must be positive, got %lld", (long long)B);
	set_out(c, (moe_dtype)x->dtype, 2, x->shape);
	return MOE_OK;
}

static moe_status check_valid(infer *c)
{
	ir_node *n = c->n;
	if (n->valid == MOE_NONE)
		return MOE_OK;
	if (!(ir_ops[n->op].flags & OPF_VALID))
		return ERR(c, "'%s' does not take a valid mask", c->op);
	if (n->valid >= (moe_id)(n - c->g->nodes))
		return ERR(c, "valid mask must be defined before its use");
	ir_node *v = N(c->g, n->valid);
	if (v->dtype != MOE_I32 || v->rank > 1)
		return ERR(c, "a valid mask must be an i32 scalar or vector");
	if (v->rank == 0 && n->rank < 1)
		return ERR(c, "a scalar valid mask needs a result of rank >= 1");
	if (n->op == MOE_OP_SCATTER && v->rank != 0)
		return ERR(c, "'scatter' takes only a scalar valid mask (it counts the index rows applied)");
	if (ir_valid_rows_only(n->op)) {
		/* rows of the result are rows of the operand: a reduction or softmax
		 * along another axis, a take_along */
		const ir_node *x = N(c->g, n->args[0]);
		if (v->rank != 0)
			return ERR(c, "'%s' takes only a scalar valid mask", c->op);
		if (n->op != MOE_OP_TAKE_ALONG && x->rank >= 1 && ir_norm_axis((int)ir_attr_int(n, "axis", -1), x->rank) == 0)
			return ERR(c, "'%s' along axis 0 takes no valid mask (the mask counts rows of axis 0)", c->op);
	}
	if (v->rank == 1 && (n->rank < 2 || v->shape[0] != n->shape[0]))
		return ERR(c, "a vector valid mask [%lld] needs a result of rank >= 2 with that leading dimension",
			(long long)v->shape[0]);
	return MOE_OK;
}

moe_status ir_infer(moe_ctx *ctx, moe_graph *g, moe_id id)
{
	ir_node *n = N(g, id);
	const ir_opinfo *oi = &ir_ops[n->op];
	infer c = {ctx, g, n, oi->name};
	if ((int)n->nargs < oi->min_args || (oi->max_args >= 0 && (int)n->nargs > oi->max_args)) {
		if (oi->min_args == oi->max_args)
			return ERR(&c, "'%s' takes %d operand(s), got %u", oi->name, oi->min_args, n->nargs);
		return ERR(&c, "'%s' takes %d to %d operands, got %u", oi->name, oi->min_args, oi->max_args, n->nargs);
	}
	for (uint32_t i = 0; i < n->nargs; i++) {
		if (n->args[i] == MOE_NONE) {
			if (n->op == MOE_OP_EXPERTS)
				continue;
			return ERR(&c, "'%s': operand %u is missing", oi->name, i + 1);
		}
		if (n->args[i] >= id)
			return ERR(&c, "'%s': operand %%%u is not defined before its use", oi->name, n->args[i]);
	}
	/* the raw bytes of quantized weights are moved and dequantized, never computed on */
	if ((g->is_body || n->op == MOE_OP_BLOCKARG) && ir_body_node_check(ctx, g, n) != MOE_OK)
		return MOE_ERR_INVALID;
	bool moves = n->op == MOE_OP_GATHER || n->op == MOE_OP_RESHAPE || n->op == MOE_OP_SLICE ||
		n->op == MOE_OP_CONCAT || n->op == MOE_OP_DEQUANT || n->op == MOE_OP_BLOCK_LOOP ||
		(n->op == MOE_OP_CAST && n->nargs == 1 && N(g, n->args[0])->dtype == MOE_U8); /* a byte's value, exact */
	for (uint32_t i = 0; i < n->nargs && !moves; i++)
		if (n->args[i] != MOE_NONE && moe_dtype_is_storage((moe_dtype)N(g, n->args[i])->dtype))
			return ERR(&c, "'%s': operand %u is %s, the raw bytes of a quantized weight; only dequant, gather, "
				"reshape, slice, concat and a cast of u8 read it", oi->name, i + 1, moe_dtype_name((moe_dtype)N(g, n->args[i])->dtype));
	moe_status st = MOE_OK;
	switch (oi->rule) {
	case SHAPE_LEAF: st = r_leaf(&c); break;
	case SHAPE_UNARY: st = r_unary(&c); break;
	case SHAPE_BINARY: st = r_binary(&c); break;
	case SHAPE_SELECT: st = r_select(&c); break;
	case SHAPE_CAST: st = r_cast(&c); break;
	case SHAPE_BITCAST: st = r_bitcast(&c); break;
	case SHAPE_REDUCE: st = r_reduce(&c); break;
	case SHAPE_SOFTMAX: st = r_softmax(&c); break;
	case SHAPE_CUMSUM: st = r_cumsum(&c); break;
	case SHAPE_EINSUM: st = r_einsum(&c); break;
	case SHAPE_TOPK: st = r_topk(&c); break;
	case SHAPE_ONE_HOT: st = r_one_hot(&c); break;
	case SHAPE_FILTER: st = r_filter(&c); break;
	case SHAPE_GATHER: st = r_gather(&c); break;
	case SHAPE_TAKE_ALONG: st = r_take_along(&c); break;
	case SHAPE_SCATTER: st = r_scatter(&c); break;
	case SHAPE_RESHAPE: st = r_reshape(&c); break;
	case SHAPE_SLICE: st = r_slice(&c); break;
	case SHAPE_CONCAT: st = r_concat(&c); break;
	case SHAPE_BROADCAST: st = r_broadcast(&c); break;
	case SHAPE_EXPERTS: st = r_experts(&c); break;
	case SHAPE_DEQUANT: st = ir_infer_dequant(ctx, g, id); break;
	case SHAPE_ALL_TO_ALL: st = r_all_to_all(&c); break;
	case SHAPE_BLOCK_LOOP: st = ir_infer_block_loop(ctx, g, id); break;
	}
	if (st)
		return st;
	/* every result must be addressable: dims fit i32, byte size fits int64 */
	int64_t e = (int64_t)moe_dtype_size((moe_dtype)n->dtype);
	for (int i = 0; i < n->rank; i++) {
		if (n->shape[i] <= 0)
			return ERR(&c, "'%s' result has a non-positive dimension %lld", oi->name, (long long)n->shape[i]);
		if (n->shape[i] > MOE_MAX_DIM)
			return ERR(&c, "'%s' result dimension %lld exceeds the limit %lld", oi->name, (long long)n->shape[i],
				(long long)MOE_MAX_DIM);
		if (!ir_mul_ov(e, n->shape[i], &e))
			return ERR(&c, "'%s' result size overflows 64 bits", oi->name);
	}
	return check_valid(&c);
}
