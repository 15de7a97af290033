/* Unit tests of the IR printers and readers: text and JSON round trips of a
 * module that uses every op of ops.def, and malformed inputs that must give a
 * located diagnostic and NULL without crashing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "graph_fx.h"

/* A leaf with no source attribute, its name optional (block arguments have none). */
static moe_id bare_leaf(moe_graph *g, moe_op op, moe_dtype t, int rank, const int64_t *s, const char *name)
{
	moe_id id = moe_node_new(g, op, NULL, 0, moe_loc_none());
	moe_node_set_type(g, id, t, s, rank);
	if (name)
		moe_node_set_name(g, id, name);
	return id;
}

static moe_id op1(moe_graph *g, moe_op op, moe_id a)
{
	return ir_b1(g, op, a, moe_loc_none());
}

static moe_id op2(moe_graph *g, moe_op op, moe_id a, moe_id b)
{
	return ir_b2(g, op, a, b, moe_loc_none());
}

/* A layer that uses every op of ops.def legally. */
/* The input x [T, D], the router weight [E, D] and a constant, with
 * attributes of every kind whose spelling must survive both round trips
 * (escapes, empty and extreme integer lists, float spellings). */
static void leaves_and_attrs(moe_graph *g, const int64_t *td, const int64_t *ed, moe_id *xo, moe_id *rwo, moe_id *co)
{
	moe_loc nl = moe_loc_none();
	*xo = bare_leaf(g, MOE_OP_INPUT, MOE_F32, 2, td, "x");
	moe_id rw = *rwo = bare_leaf(g, MOE_OP_WEIGHT, MOE_F32, 2, ed, "router");
	moe_node_set_str(g, rw, "source", "model.layers.0.block_sparse_moe.gate.weight");
	moe_node_set_str(g, rw, "layout", "row\"major\\ \n\t\x01\x7f caf\xc3\xa9");
	int64_t tr[2] = {1, 0};
	moe_node_set_ints(g, rw, "transpose", tr, 2);
	moe_node_set_ints(g, rw, "empty_list", NULL, 0);
	int64_t big[3] = {INT64_MIN, INT64_MAX, ((int64_t)1 << 53) + 1};
	moe_node_set_ints(g, rw, "big", big, 3);
	moe_node_set_int(g, rw, "bigint", INT64_MIN);
	moe_id c = *co = ir_b_const(g, MOE_F32, 0.1, nl);
	/* float spellings that must survive both round trips */
	moe_node_set_float(g, c, "negzero", -0.0);
	moe_node_set_float(g, c, "pinf", INFINITY);
	moe_node_set_float(g, c, "ninf", -INFINITY);
	moe_node_set_float(g, c, "qnan", NAN);
	moe_node_set_float(g, c, "denorm", 5e-324);
	moe_node_set_float(g, c, "huge", 1.7976931348623157e308);
	moe_node_set_float(g, c, "third", 1.0 / 3.0);
	moe_node_set_float(g, c, "integral", 3.0);
	moe_node_set_float(g, c, "e20", 1e20);
	moe_node_set_str(g, c, "odd key!", "");
}

static void build_all_ops(moe_module *m, bool *used)
{
	moe_graph *g = moe_module_add_graph(m, "all_ops");
	moe_loc nl = moe_loc_none();
	const int64_t T = 4, D = 8, E = 3, K = 2, F = 16;
	moe_graph_set_dim(g, "T", T);
	moe_graph_set_dim(g, "D", D);
	moe_graph_set_dim(g, "E", E);
	moe_graph_set_dim(g, "K", K);
	moe_graph_set_dim(g, "F", F);
	ir_graph_set_attr_int(g, "grid_blocks_max", 4);
	int64_t td[2] = {T, D}, ed[2] = {E, D}, te[2] = {T, E}, efd[3] = {E, F, D}, edf[3] = {E, D, F}, ef[2] = {E, F};

	moe_id x, rw, c;
	leaves_and_attrs(g, td, ed, &x, &rw, &c);
	moe_id io = ir_b_iota(g, 2, te, 1, nl);

	moe_id u[] = {op1(g, MOE_OP_NEG, x), op1(g, MOE_OP_ABS, x), op1(g, MOE_OP_EXP, x), op1(g, MOE_OP_LOG, x),
		op1(g, MOE_OP_SQRT, x), op1(g, MOE_OP_RSQRT, x), op1(g, MOE_OP_TANH, x), op1(g, MOE_OP_ERF, x),
		op1(g, MOE_OP_SIGMOID, x)};
	op1(g, MOE_OP_NOT, io);
	op1(g, MOE_OP_RELU2, x);
	moe_op fbin[] = {MOE_OP_ADD, MOE_OP_SUB, MOE_OP_MUL, MOE_OP_DIV, MOE_OP_MIN, MOE_OP_MAX, MOE_OP_EQ, MOE_OP_NE,
		MOE_OP_LT, MOE_OP_LE, MOE_OP_GT, MOE_OP_GE};
	moe_id cmp = MOE_NONE;
	for (size_t i = 0; i < sizeof fbin / sizeof *fbin; i++)
		cmp = op2(g, fbin[i], u[i % 9], c);
	moe_op ibin[] = {MOE_OP_AND, MOE_OP_OR, MOE_OP_XOR, MOE_OP_SHL, MOE_OP_SHR, MOE_OP_SAR};
	for (size_t i = 0; i < sizeof ibin / sizeof *ibin; i++)
		op2(g, ibin[i], io, io);
	ir_b3(g, MOE_OP_SELECT, cmp, x, u[1], nl);
	ir_b_cast(g, x, MOE_BF16, nl);
	ir_b_bitcast(g, x, MOE_I32, nl);
	ir_b_reduce(g, MOE_OP_REDUCE_SUM, x, -1, false, nl);
	ir_b_reduce(g, MOE_OP_REDUCE_MAX, x, 0, true, nl);
	ir_b_reduce(g, MOE_OP_REDUCE_MIN, x, 1, false, nl);
	moe_id logits = ir_b_einsum(g, "td,ed->te", x, rw, nl);
	ir_b_einsum(g, "td->dt", x, MOE_NONE, nl);
	moe_id sm = op1(g, MOE_OP_SOFTMAX, logits);
	moe_id cs = moe_node_new(g, MOE_OP_CUMSUM, &io, 1, nl);
	moe_node_set_int(g, cs, "axis", 1);
	moe_node_set_int(g, cs, "exclusive", 1);
	assert_int_equal(moe_node_infer(g, cs), MOE_OK);
	moe_id tk = moe_node_new(g, MOE_OP_TOPK, &logits, 1, nl);
	moe_node_set_int(g, tk, "k", K);
	assert_int_equal(moe_node_infer(g, tk), MOE_OK);
	moe_id oh = moe_node_new(g, MOE_OP_ONE_HOT, &tk, 1, nl);
	moe_node_set_int(g, oh, "n", E);
	assert_int_equal(moe_node_infer(g, oh), MOE_OK);
	moe_id fl = op2(g, MOE_OP_FILTER, io, logits);
	moe_node_set_float(g, fl, "fill", -1.5);
	moe_id ga = op2(g, MOE_OP_GATHER, x, tk); /* [T, K, D] */
	moe_id tw = op2(g, MOE_OP_TAKE_ALONG, sm, tk); /* [T, K] */
	moe_id sc = ir_b3(g, MOE_OP_SCATTER, x, tk, ga, nl);
	moe_node_set_str(g, sc, "mode", "add");
	int64_t rs[2] = {2, 16};
	ir_b_reshape(g, x, 2, rs, nl);
	moe_id sl = moe_node_new(g, MOE_OP_SLICE, &x, 1, nl);
	moe_node_set_int(g, sl, "axis", 1);
	moe_node_set_int(g, sl, "start", 1);
	moe_node_set_int(g, sl, "stop", 7);
	moe_node_set_int(g, sl, "step", 2);
	assert_int_equal(moe_node_infer(g, sl), MOE_OK);
	moe_id cc[3] = {x, x, x};
	moe_id cat = ir_b(g, MOE_OP_CONCAT, cc, 3, nl);
	(void)cat;
	moe_id bc = moe_node_new(g, MOE_OP_BROADCAST, &c, 1, nl);
	moe_node_set_ints(g, bc, "shape", td, 2);
	assert_int_equal(moe_node_infer(g, bc), MOE_OK);
	/* a valid mask on an elementwise op */
	moe_id vlen = ir_b_const(g, MOE_I32, 3, nl);
	moe_id masked = moe_node_new(g, MOE_OP_ADD, (moe_id[]){x, bc}, 2, nl);
	moe_node_set_valid(g, masked, vlen);
	assert_int_equal(moe_node_infer(g, masked), MOE_OK);
	moe_id gw = bare_leaf(g, MOE_OP_WEIGHT, MOE_F32, 3, efd, "gate");
	moe_node_set_str(g, gw, "source", "experts.{e}.w1.weight");
	moe_id uw = bare_leaf(g, MOE_OP_WEIGHT, MOE_F32, 3, efd, "up");
	moe_node_set_str(g, uw, "source", "experts.{e}.w3.weight");
	moe_id dw = bare_leaf(g, MOE_OP_WEIGHT, MOE_F32, 3, edf, "down");
	moe_node_set_str(g, dw, "source", "experts.{e}.w2.weight");
	moe_id ub = bare_leaf(g, MOE_OP_WEIGHT, MOE_F32, 2, ef, "up_bias");
	moe_node_set_str(g, ub, "source", "experts.{e}.b3");
	moe_id ex_args[9] = {masked, tk, tw, gw, uw, dw, MOE_NONE, ub, MOE_NONE};
	moe_id ex = moe_node_new(g, MOE_OP_EXPERTS, ex_args, 9, nl);
	moe_node_set_str(g, ex, "act", "gpt_oss");
	moe_node_set_int(g, ex, "block", 16);
	moe_node_set_float(g, ex, "alpha", 1.702);
	moe_node_set_float(g, ex, "limit", 7.0);
	assert_int_equal(moe_node_infer(g, ex), MOE_OK);
	int64_t qd[3] = {E, 4, 4}, sd[3] = {E, 1, 1}, qb[2] = {4, 4};
	moe_id qw = bare_leaf(g, MOE_OP_WEIGHT, MOE_F8E4M3, 3, qd, "q");
	moe_node_set_str(g, qw, "source", "experts.{e}.q");
	moe_id qs = bare_leaf(g, MOE_OP_WEIGHT, MOE_F32, 3, sd, "qs");
	moe_node_set_str(g, qs, "source", "experts.{e}.qs");
	moe_id dq = moe_node_new(g, MOE_OP_DEQUANT, (moe_id[]){qw, qs}, 2, nl);
	moe_node_set_str(g, dq, "format", "fp8");
	moe_node_set_ints(g, dq, "block", qb, 2);
	assert_int_equal(moe_node_infer(g, dq), MOE_OK);
	moe_graph_add_output(g, dq);
	int64_t one = 1;
	moe_id cnt = bare_leaf(g, MOE_OP_INPUT, MOE_I32, 1, &one, "a2a_counts");
	moe_id a2a = moe_node_new(g, MOE_OP_ALL_TO_ALL, (moe_id[]){x, cnt}, 2, nl);
	moe_node_set_int(g, a2a, "ep", 1);
	moe_node_set_int(g, a2a, "rows", 2 * T);
	assert_int_equal(moe_node_infer(g, a2a), MOE_OK);
	moe_graph_add_output(g, a2a);
	moe_graph_add_output(g, ex);
	moe_graph_add_output(g, sc);
	/* a block loop of two blocks: up[expert] x x (invariant) */
	int64_t two = 2;
	moe_id bnb = bare_leaf(g, MOE_OP_INPUT, MOE_I32, 0, NULL, "nblocks");
	moe_id bex = bare_leaf(g, MOE_OP_INPUT, MOE_I32, 1, &two, "bexp");
	moe_id brows = bare_leaf(g, MOE_OP_INPUT, MOE_I32, 1, &two, "brows");
	moe_id bl = moe_node_new(g, MOE_OP_BLOCK_LOOP, (moe_id[]){bnb, bex, brows, uw, x}, 5, nl);
	moe_node_set_str(g, bl, "kinds", "ei");
	uint32_t bi;
	moe_graph *body = ir_body_new(g, &bi);
	N(g, bl)->body = bi;
	int64_t fd[2] = {F, D};
	moe_id bw = bare_leaf(body, MOE_OP_BLOCKARG, MOE_F32, 2, fd, NULL);
	moe_node_set_str(body, bw, "role", "in");
	moe_node_set_int(body, bw, "index", 0);
	moe_id bx = bare_leaf(body, MOE_OP_BLOCKARG, MOE_F32, 2, td, NULL);
	moe_node_set_str(body, bx, "role", "in");
	moe_node_set_int(body, bx, "index", 1);
	moe_graph_add_output(body, ir_b_einsum(body, "td,fd->tf", bx, bw, nl));
	assert_int_equal(moe_node_infer(g, bl), MOE_OK);
	moe_graph_add_output(g, bl);

	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++)
		used[moe_node_op(g, i)] = true;
	for (moe_id i = 0; i < moe_graph_num_nodes(body); i++)
		used[moe_node_op(body, i)] = true;

	/* a second, small layer (names that are not identifiers: test_hostile_emit.c) */
	moe_graph *h = moe_module_add_graph(m, "layer_2");
	moe_graph_set_dtype(h, MOE_BF16);
	moe_graph_set_dim(h, "neg_dim", -7);
	moe_id s = bare_leaf(h, MOE_OP_INPUT, MOE_BF16, 0, NULL, "s");
	moe_graph_add_output(h, op1(h, MOE_OP_TANH, s));
}

static moe_module *all_ops_module(moe_ctx *c)
{
	moe_module *m = moe_module_new(c);
	bool used[MOE_OP_COUNT] = {0};
	build_all_ops(m, used);
	for (int i = 0; i < MOE_OP_COUNT; i++)
		if (!used[i])
			fail_msg("op '%s' is not exercised", moe_op_name((moe_op)i));
	assert_int_equal(moe_module_verify(c, m), MOE_OK);
	return m;
}

static void test_text_round_trip(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = all_ops_module(c);
	char *t1 = print_module(m);
	moe_module *m2 = moe_module_parse_text(c, "a.moeir", t1, strlen(t1));
	if (!m2) {
		moe_diag_print(c, stderr);
		fail_msg("printed module does not parse:\n%s", t1);
	}
	assert_int_equal(moe_module_verify(c, m2), MOE_OK);
	char *t2 = print_module(m2);
	assert_string_equal(t1, t2);
	/* spot checks of the format */
	assert_non_null(strstr(t1, "moeir 1\nlayer @all_ops dtype=f32 {\n  dims T=4, D=8, E=3, K=2, F=16\n"));
	assert_non_null(strstr(t1, "  attrs grid_blocks_max=4\n"));
	assert_non_null(strstr(t1, "  %0 = input \"x\" : f32[4, 8]\n"));
	assert_non_null(strstr(t1, "layout=\"row\\\"major\\\\ \\n\\t\\x01\\x7f caf\xc3\xa9\""));
	assert_non_null(strstr(t1, "negzero=-0.0, pinf=inf, ninf=-inf, qnan=nan, denorm=5e-324"));
	assert_non_null(strstr(t1, "third=0.3333333333333333, integral=3.0, e20=1e+20, \"odd key!\"=\"\""));
	assert_non_null(strstr(t1, "big=[-9223372036854775808, 9223372036854775807, 9007199254740993]"));
	assert_non_null(strstr(t1, "empty_list=[]"));
	assert_non_null(strstr(t1, " valid(%"));
	assert_non_null(strstr(t1, ", _, %"));
	assert_non_null(strstr(t1, "layer @layer_2 dtype=bf16 {\n  dims neg_dim=-7\n"));
	assert_non_null(strstr(t1, "= input \"s\" : bf16[]\n"));
	/* parsed nodes are located in the .moeir text */
	moe_graph *g = moe_module_graph(m2, 0);
	moe_loc l = moe_node_loc(g, 0);
	assert_string_equal(l.file, "a.moeir");
	assert_int_equal(l.line, 5);
	assert_int_equal(l.col, 3);
	free(t1);
	free(t2);
	moe_module_free(m2);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_json_round_trip(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = all_ops_module(c);
	moe_node_set_name(moe_module_graph(m, 0), 1, "router");
	/* a location survives the JSON form */
	moe_module_graph(m, 0)->nodes[0].loc = moe_loc_at(c, "a.moe", 3, 9);
	char *j = moe_module_to_json(m);
	assert_non_null(j);
	moe_module *m2 = moe_module_parse_json(c, "a.json", j, strlen(j));
	if (!m2) {
		moe_diag_print(c, stderr);
		fail_msg("JSON does not parse:\n%s", j);
	}
	char *t1 = print_module(m), *t2 = print_module(m2);
	assert_string_equal(t1, t2);
	moe_loc l = moe_node_loc(moe_module_graph(m2, 0), 0);
	assert_string_equal(l.file, "a.moe");
	assert_int_equal(l.line, 3);
	assert_int_equal(l.col, 9);
	assert_null(moe_node_loc(moe_module_graph(m2, 0), 1).file);
	/* JSON -> JSON is stable too */
	char *j2 = moe_module_to_json(m2);
	assert_string_equal(j, j2);
	assert_non_null(strstr(j, "\"format\":\t\"moeir\""));
	assert_non_null(strstr(j, "\"-9223372036854775808\""));
	assert_non_null(strstr(j, "{\n\t\t\t\t\t\t\t\"float\":\t\"-inf\""));
	moe_free(c, j);
	moe_free(c, j2);
	free(t1);
	free(t2);
	moe_module_free(m2);
	moe_module_free(m);
	moe_ctx_free(c);
}

static void test_dot(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = all_ops_module(c);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_int_equal(moe_module_print_dot(m, f), MOE_OK);
	fclose(f);
	assert_non_null(strstr(buf, "digraph moeir {"));
	assert_non_null(strstr(buf, "subgraph cluster_0 {"));
	assert_non_null(strstr(buf, "subgraph cluster_1 {"));
	assert_non_null(strstr(buf, "l0_n0 [label=\"%0 = input \\\"x\\\"\\nf32[4, 8]\""));
	assert_non_null(strstr(buf, "l0_n0 -> l0_n"));
	assert_non_null(strstr(buf, "[style=dashed, label=\"valid\"]"));
	free(buf);
	moe_module_free(m);
	moe_ctx_free(c);
}

/* ---- malformed inputs ---- */
typedef struct bad_case {
	const char *text;
	const char *msg; /* expected substring of the first error */
	int line, col;   /* expected location (0: line only checked > 0 for text) */
} bad_case;

#define HDR "moeir 1\nlayer @l dtype=f32 {\n"
#define X0 "  %0 = input \"x\" : f32[4, 8]\n"

static const bad_case bad_text[] = {
	{"", "expected the header", 1, 1},
	{"moeir", "expected a format version", 1, 6},
	{"moeir 2\n", "unsupported moeir version 2", 1, 7},
	{"moeir 1\nlayer", "expected a layer name", 2, 6},
	{"moeir 1\nlayer @l dtype=f64 {}", "unknown element type 'f64'", 2, 16},
	{HDR "  %0 = frob \"x\" : f32[4]\n}\n", "unknown op 'frob'", 3, 8},
	{HDR X0 "  %2 = neg(%0) : f32[4, 8]\n}\n", "expected node id %1, found %2", 4, 3},
	{HDR X0 "  %1 = add(%0, %1) : f32[4, 8]\n}\n", "%1 is not defined before its use", 4, 16},
	{HDR X0 "  %1 = neg(%5) : f32[4, 8]\n}\n", "%5 is not defined before its use", 4, 12},
	{HDR X0 "  %1 = neg(%0) : f32[4, 9]\n}\n", "written with type f32[4, 9] but its operands give f32[4, 8]", 4, 3},
	{HDR X0 "  %1 = neg(%0) : i32[4, 8]\n}\n", "written with type i32[4, 8]", 4, 3},
	{HDR "  %0 = input \"x\\q\" : f32[4]\n}\n", "unknown escape '\\q'", 3, 16},
	{HDR "  %0 = input \"x\\x0\" : f32[4]\n}\n", "two hex digits", 3, 16},
	{HDR "  %0 = input \"x\\x00\" : f32[4]\n}\n", "'\\x00' is not allowed", 3, 16},
	{HDR "  %0 = input \"x : f32[4]\n}\n", "unterminated string", 3, 14},
	{HDR X0, "expected a node, 'output' or '}'", 4, 1},
	{HDR "  %0 = input \"x\" : f32[4, ", "expected a dimension", 3, 27},
	{HDR "  %0 = input \"x\" : f32[4, 0]\n}\n", "dimension 0 is outside 1..2147483647", 3, 27},
	{HDR "  %0 = input \"x\" : f32[2147483648]\n}\n", "dimension 2147483648 is outside", 3, 24},
	{HDR "  %0 = input \"x\" : f32[99999999999999999999]\n}\n", "out of the 64-bit range", 3, 24},
	{HDR "  %0 = input \"x\" : f32[1,1,1,1,1,1,1,1,1]\n}\n", "rank exceeds the limit of 8", 3, 40},
	{HDR "  %0 = input \"x\" : i32[2147483647, 2147483647, 2147483647]\n}\n", "result size overflows", 3, 3},
	{HDR "  %0 = const {value=1e999} : f32[]\n}\n", "out of range", 3, 21},
	{HDR "  %0 = const {value=1.5.2} : f32[]\n}\n", "malformed number", 3, 21},
	{HDR "  %0 = const {value=1, value=2} : f32[]\n}\n", "duplicate attribute 'value'", 3, 24},
	{HDR "  %0 = const {value=[1.5]} : f32[]\n}\n", "integers only", 3, 22},
	{HDR "  %0 = const {value=[[1]]} : f32[]\n}\n", "expected an integer", 3, 22},
	{HDR "  %0 = const : f32[]\n}\n", "'const' needs a value", 3, 3},
	{HDR X0 "  %1 = neg(_) : f32[4, 8]\n}\n", "operand 1 is missing", 4, 3},
	{HDR X0 "  %1 = neg(%0) valid(%0) : f32[4, 8]\n}\n", "valid mask must be an i32", 4, 3},
	{HDR X0 "  output %1\n}\n", "%1 is not defined", 4, 10},
	{HDR "  dims T=1, T=2\n}\n", "duplicate dimension 'T'", 3, 13},
	{HDR "  %0 = input \"x\" : f32[4] $\n}\n", "unexpected character '$'", 3, 27},
	{HDR "  %0 = input \"x\" : f32[4]\n}\n\x01", "unexpected byte 0x01", 5, 1},
	{HDR "  %99999999999 = input \"x\" : f32[4]\n}\n", "node id is too large", 3, 3},
	{HDR "  %0 = topk(%0) {k=2} : i32[4, 2]\n}\n", "%0 is not defined before its use", 3, 13},
	{"moeir 1\n# comment only\nlayer @l dtype=f32 { garbage }", "expected 'dims', 'attrs', a node, 'output' or '}'",
		3, 22},
};

static void test_bad_text(void **st)
{
	(void)st;
	int nbad = 0;
	for (size_t i = 0; i < sizeof bad_text / sizeof *bad_text; i++) {
		const bad_case *b = &bad_text[i];
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		moe_module *m = moe_module_parse_text(c, "bad.moeir", b->text, strlen(b->text));
		if (m || moe_error_count(c) < 1) {
			moe_module_free(m);
			moe_ctx_free(c);
			fail_msg("case %zu: accepted:\n%s", i, b->text);
		}
		const char *msg;
		moe_loc loc;
		moe_diag_kind k;
		moe_diag_get(c, 0, &k, &loc, &msg);
		if (k != MOE_DIAG_ERROR || !strstr(msg, b->msg) || !loc.file || strcmp(loc.file, "bad.moeir") ||
			loc.line != b->line || loc.col != b->col) {
			fprintf(stderr, "case %zu: got %s:%d:%d: %s\n  want '%s' at %d:%d\n", i, loc.file ? loc.file : "?",
				loc.line, loc.col, msg, b->msg, b->line, b->col);
			nbad++;
		}
		moe_ctx_free(c);
	}
	assert_int_equal(nbad, 0);
}

/* Every prefix of a valid module, and every single-byte corruption of it,
 * must be rejected or accepted without a crash, and never leak. */
static void test_truncations_and_mutations(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	moe_module *m = all_ops_module(c);
	char *t = print_module(m);
	size_t n = strlen(t);
	char *j = moe_module_to_json(m);
	size_t jn = strlen(j);
	moe_module_free(m);
	for (size_t i = 0; i < n; i++) {
		moe_module *p = moe_module_parse_text(c, "t.moeir", t, i);
		moe_module_free(p);
		moe_diag_clear(c);
	}
	for (size_t i = 0; i < jn; i += 7) {
		moe_module *p = moe_module_parse_json(c, "t.json", j, i);
		assert_null(p);
		moe_diag_clear(c);
	}
	static const char repl[] = "%_[]{}(),=:\"\\-9.ex@#\n\x00\xff";
	char *mut = malloc(n + 1);
	for (size_t i = 0; i < n; i += 3) {
		for (size_t r = 0; r < sizeof repl - 1; r++) {
			memcpy(mut, t, n + 1);
			mut[i] = repl[r];
			moe_module *p = moe_module_parse_text(c, "t.moeir", mut, n);
			if (p) { /* what parses must print back to something that parses identically */
				char *a = print_module(p);
				moe_module *q = moe_module_parse_text(c, "u.moeir", a, strlen(a));
				assert_non_null(q);
				char *b = print_module(q);
				assert_string_equal(a, b);
				free(a);
				free(b);
				moe_module_free(q);
			}
			moe_module_free(p);
			moe_diag_clear(c);
		}
	}
	static const char jrepl[] = "[]{}\":,-0e.n\\x\x00";
	char *jm = malloc(jn + 1);
	for (size_t i = 0; i < jn; i += 11) {
		for (size_t r = 0; r < sizeof jrepl - 1; r++) {
			memcpy(jm, j, jn + 1);
			jm[i] = jrepl[r];
			moe_module *p = moe_module_parse_json(c, "t.json", jm, jn);
			if (p) {
				char *a = moe_module_to_json(p);
				moe_module *q = moe_module_parse_json(c, "u.json", a, strlen(a));
				assert_non_null(q);
				moe_free(c, a);
				moe_module_free(q);
			}
			moe_module_free(p);
			moe_diag_clear(c);
		}
	}
	free(jm);
	free(mut);
	free(t);
	moe_free(c, j);
	moe_ctx_free(c);
}

#define JHEAD "{\"format\": \"moeir\", \"version\": 1, \"layers\": ["
#define JL(body) JHEAD "{\"name\": \"l\", \"dtype\": \"f32\", " body "}]}"
#define JX "{\"id\": 0, \"op\": \"input\", \"name\": \"x\", \"args\": [], \"dtype\": \"f32\", \"shape\": [4, 8]}"

static const struct {
	const char *text;
	const char *msg; /* substring of the first error, which names the JSON path */
} bad_json[] = {
	{"", "empty input"},
	{"{\"format\": \"moeir\",", "malformed JSON"},
	{"{\"format\": \"moeir\"} x", "unexpected text after the JSON document"},
	{"[1]", "(document): expected an object, got an array"},
	{"{\"format\": \"onnx\", \"version\": 1, \"layers\": []}", "format: not a moeir document"},
	{"{\"format\": \"moeir\", \"version\": 2, \"layers\": []}", "version: unsupported moeir JSON version 2"},
	{"{\"format\": \"moeir\", \"version\": \"1\", \"layers\": []}", "version: expected an integer, got a string"},
	{"{\"format\": \"moeir\", \"version\": 1}", "missing field 'layers'"},
	{"{\"format\": \"moeir\", \"version\": 1, \"layers\": {}}", "layers: expected an array, got an object"},
	{JHEAD "3]}", "layers[0]: expected an object, got a number"},
	{JL("\"nodes\": [], \"outputs\": [], \"extra\": 1"), "layers[0]: unknown field 'extra'"},
	{JL("\"nodes\": [], \"outputs\": [], \"nodes\": []"), "layers[0]: field 'nodes' appears twice"},
	{JL("\"nodes\": [" JX "], \"outputs\": [1]"), "layers[0].outputs[0]: output %1 is not a node"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": 5, \"args\": [], \"dtype\": \"f32\", \"shape\": []}], \"outputs\": []"),
		"layers[0].nodes[0].op: expected a string, got a number"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"frob\", \"args\": [], \"dtype\": \"f32\", \"shape\": []}], \"outputs\": []"),
		"layers[0].nodes[0].op: unknown op 'frob'"},
	{JL("\"nodes\": [{\"id\": 1, \"op\": \"input\", \"args\": [], \"dtype\": \"f32\", \"shape\": []}], \"outputs\": []"),
		"layers[0].nodes[0].id: expected id 0, got 1"},
	{JL("\"nodes\": [" JX ", {\"id\": 1, \"op\": \"neg\", \"args\": [1], \"dtype\": \"f32\", \"shape\": [4, 8]}],"
		"\"outputs\": []"), "layers[0].nodes[1].args[0]: %1 is not defined before its use"},
	{JL("\"nodes\": [" JX ", {\"id\": 1, \"op\": \"neg\", \"args\": [0.5], \"dtype\": \"f32\", \"shape\": [4, 8]}],"
		"\"outputs\": []"), "layers[0].nodes[1].args[0]: expected an integer, got 0.5"},
	{JL("\"nodes\": [" JX ", {\"id\": 1, \"op\": \"neg\", \"args\": [0], \"dtype\": \"f32\", \"shape\": [4, 9]}],"
		"\"outputs\": []"), "written with type f32[4, 9] but its operands give f32[4, 8]"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"input\", \"args\": [], \"dtype\": \"f32\", \"shape\": [0]}], \"outputs\": []"),
		"layers[0].nodes[0].shape[0]: 0 is outside 1..2147483647"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"input\", \"args\": [], \"dtype\": \"f32\", \"shape\": \"4\"}], \"outputs\": []"),
		"layers[0].nodes[0].shape: expected an array, got a string"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"input\", \"args\": [], \"dtype\": \"f16\", \"shape\": []}], \"outputs\": []"),
		"layers[0].nodes[0].dtype: unknown element type 'f16'"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"const\", \"args\": [], \"dtype\": \"f32\", \"shape\": [],"
		"\"attrs\": {\"value\": 1}}], \"outputs\": []"),
		"layers[0].nodes[0].attrs.value: expected an object, got a number"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"const\", \"args\": [], \"dtype\": \"f32\", \"shape\": [],"
		"\"attrs\": {\"value\": {\"int\": 1, \"float\": 2}}}], \"outputs\": []"), "exactly one of"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"const\", \"args\": [], \"dtype\": \"f32\", \"shape\": [],"
		"\"attrs\": {\"value\": {\"float\": \"one\"}}}], \"outputs\": []"),
		"layers[0].nodes[0].attrs.value.float: expected a number or \"inf\""},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"const\", \"args\": [], \"dtype\": \"f32\", \"shape\": [],"
		"\"attrs\": {\"value\": {\"ints\": [1, \"x\"]}}}], \"outputs\": []"),
		"layers[0].nodes[0].attrs.value.ints[1]: expected a 64-bit integer"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"const\", \"args\": [], \"dtype\": \"f32\", \"shape\": [],"
		"\"attrs\": {\"value\": {\"int\": 1e300}}}], \"outputs\": []"),
		"layers[0].nodes[0].attrs.value.int: expected an integer"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"const\", \"args\": [], \"dtype\": \"f32\", \"shape\": [],"
		"\"attrs\": {\"value\": {\"int\": 1}, \"value\": {\"int\": 2}}}], \"outputs\": []"),
		"layers[0].nodes[0].attrs.value: duplicate attribute"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"input\", \"args\": [], \"dtype\": \"f32\", \"shape\": [],"
		"\"loc\": {\"line\": \"3\"}}], \"outputs\": []"), "layers[0].nodes[0].loc.line: expected an integer"},
	{JL("\"dims\": [{\"name\": \"T\", \"value\": 1}, {\"name\": \"T\", \"value\": 2}], \"nodes\": [], \"outputs\": []"),
		"layers[0].dims[1]: duplicate dimension 'T'"},
	{JL("\"nodes\": [{\"id\": 0, \"op\": \"iota\", \"args\": [], \"dtype\": \"i32\", \"shape\": [4],"
		"\"attrs\": {\"axis\": {\"int\": 5}}}], \"outputs\": []"), "'iota': axis 5 out of range"},
};

static void test_bad_json(void **st)
{
	(void)st;
	for (size_t i = 0; i < sizeof bad_json / sizeof *bad_json; i++) {
		moe_ctx *c = moe_ctx_new(NULL, NULL);
		const char *t = bad_json[i].text;
		moe_module *m = moe_module_parse_json(c, "bad.json", t, strlen(t));
		if (m || moe_error_count(c) < 1) {
			moe_module_free(m);
			moe_ctx_free(c);
			fail_msg("case %zu: accepted:\n%s", i, t);
		}
		const char *msg;
		moe_loc loc;
		moe_diag_get(c, 0, NULL, &loc, &msg);
		if (!strstr(msg, bad_json[i].msg) || !loc.file || strcmp(loc.file, "bad.json")) {
			fprintf(stderr, "case %zu: got %s:%d:%d: %s\n", i, loc.file ? loc.file : "?", loc.line, loc.col, msg);
			moe_ctx_free(c);
			fail_msg("case %zu: wrong diagnostic (want '%s')", i, bad_json[i].msg);
		}
		moe_ctx_free(c);
	}
}

/* Diagnostics print as file:line:col: error: with the source line quoted. */
static void test_diag_print(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	const char *t = HDR "  %0 = frob : f32[]\n}\n";
	assert_null(moe_module_parse_text(c, "d.moeir", t, strlen(t)));
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	moe_diag_print(c, f);
	fclose(f);
	assert_string_equal(buf, "d.moeir:3:8: error: unknown op 'frob'\n  %0 = frob : f32[]\n       ^\n");
	free(buf);
	moe_ctx_free(c);
}

/* Deep nesting and huge inputs of JSON are rejected, not recursed into. */
static void test_json_nesting(void **st)
{
	(void)st;
	moe_ctx *c = moe_ctx_new(NULL, NULL);
	size_t n = 200000;
	char *t = malloc(2 * n + 1);
	memset(t, '[', n);
	memset(t + n, ']', n);
	t[2 * n] = 0;
	assert_null(moe_module_parse_json(c, "deep.json", t, 2 * n));
	assert_true(moe_error_count(c) >= 1);
	free(t);
	moe_ctx_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text_round_trip),
		cmocka_unit_test(test_json_round_trip),
		cmocka_unit_test(test_dot),
		cmocka_unit_test(test_bad_text),
		cmocka_unit_test(test_bad_json),
		cmocka_unit_test(test_diag_print),
		cmocka_unit_test(test_json_nesting),
		cmocka_unit_test(test_truncations_and_mutations),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
