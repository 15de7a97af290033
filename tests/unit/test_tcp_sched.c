/* The schedule IR (backend-tcp/compiler/sched.h, docs/tcp-compiler.md 4):
 * schedules built in C print, read back and print identically (ids kept
 * when program order differs from id order), and the verifier refuses each
 * broken rule that the text form cannot even express (regions not a tree,
 * an op in no region or in two, a command with a register, a wrong
 * context), naming the object. Every prefix of a printed schedule is read
 * without a crash: accepted, or refused with an error. A copy of a copy is
 * that copy field for field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "backend-tcp/compiler/sched.h"

typedef struct fx {
	moe_ctx *ctx;
	moe_tcp_machine *m;
	tcp_sched *s;
	ts_id x, xd, yd, w, wd, cnt;
	ts_id nb, g, e, cls;
	int loop;
} fx;

static tcp_insn copy(ts_id dst, int64_t doff, ts_id src, int64_t soff, int64_t n)
{
	tcp_insn in = tcp_insn_init(TCP_OP_DMA_COPY);
	in.ndim = 1;
	in.dim[0] = n;
	in.v[TCP_V_DST].t = (int32_t)dst;
	in.v[TCP_V_DST].base = doff;
	in.v[TCP_V_DST].stride[0] = 1;
	in.v[TCP_V_S0].t = (int32_t)src;
	in.v[TCP_V_S0].base = soff;
	in.v[TCP_V_S0].stride[0] = 1;
	return in;
}

static ts_id dm_buf(tcp_sched *s, const char *name, moe_dtype dt, int64_t n, int64_t slice_bytes, int64_t at)
{
	int64_t shape[1] = {n};
	ts_id b = ts_add_buf(s, name, TCP_DM, TCP_T_SCRATCH, dt, 1, shape);
	s->buf[b].layout = (ts_layout){0, 4, 1, TS_SPLIT_FLIT, slice_bytes};
	s->buf[b].offset = at;
	return b;
}

/* A small schedule with every kind of object: a routing copy, a block loop
 * whose body prefetches the next expert's weights (a loop-carried
 * dependency), a row-class switch and a guard, and a combine pass. */
static void build(fx *f)
{
	f->ctx = moe_ctx_new(NULL, NULL);
	f->m = moe_tcp_machine_default(f->ctx);
	assert_non_null(f->m);
	tcp_sched *s = f->s = tcp_sched_new(f->ctx, f->m);
	s->meta = (ts_meta){.T = 64, .K = 2, .D = 64, .F = 64, .E = 4, .B = 16, .G = 8, .nproj = 2, .dtype = MOE_BF16};
	int64_t sx[1] = {64}, sw[2] = {4, 64}, sc[1] = {8};
	f->x = ts_add_buf(s, "x", TCP_HBM, TCP_T_INPUT, MOE_BF16, 1, sx);
	s->buf[f->x].offset = 0;
	f->w = ts_add_buf(s, "w", TCP_HBM, TCP_T_WEIGHT, MOE_BF16, 2, sw);
	ts_set_source(s, f->w, "model.layers.{layer}.w\"q\"");
	f->cnt = ts_add_buf(s, "counts", TCP_HBM, TCP_T_SCRATCH, MOE_I32, 1, sc);
	f->xd = dm_buf(s, "xd", MOE_BF16, 64, 32, 0);
	f->yd = dm_buf(s, "yd", MOE_BF16, 64, 32, 32);
	f->wd = dm_buf(s, "wd", MOE_BF16, 64, 64, 64);
	s->buf[f->wd].slots = 2;
	s->buf[f->wd].life = TS_LIFE_LOOP;
	ts_id top = s->top;
	tcp_insn c0i = copy(f->xd, 0, f->x, 0, 64);
	ts_id c0 = ts_add_op(s, top, &c0i, TS_PH_ROUTING);
	f->nb = ts_add_scalar(s, top, "nb", TS_SC_SPM_LD, 0, TS_NONE, TS_NONE, 0);
	s->sc[f->nb].buf = f->cnt;
	f->g = ts_add_scalar(s, top, "g", TS_SC_LOOPIDX, 0, TS_NONE, TS_NONE, 0);
	f->loop = ts_add_loop(s, top, 8, f->nb, f->g);
	ts_loop *l = &s->loop[f->loop];
	tcp_insn pre = copy(f->wd, 0, f->w, 0, 64);
	ts_id p0 = ts_add_op(s, l->prologue, &pre, TS_PH_EXPERT);
	f->e = ts_add_scalar(s, l->body, "e", TS_SC_SPM_LD, 0, f->g, TS_NONE, 0);
	s->sc[f->e].buf = f->cnt;
	l->expert = f->e;
	tcp_insn nx = copy(f->wd, 64, f->w, 0, 64);
	nx.v[TCP_V_S0].reg = (int32_t)f->e;
	nx.v[TCP_V_S0].scale = 64;
	ts_id p1 = ts_add_op(s, l->body, &nx, TS_PH_PREFETCH);
	s->op[p1].feature = 3;
	tcp_insn vec = tcp_insn_init(TCP_OP_TU_VEC);
	vec.ndim = 1;
	vec.dim[0] = 64;
	vec.v[TCP_V_DST] = (tcp_view){(int32_t)f->yd, -1, 0, 0, {1}};
	vec.v[TCP_V_S0] = (tcp_view){(int32_t)f->wd, -1, 0, 0, {1}};
	vec.v[TCP_V_S1] = (tcp_view){(int32_t)f->xd, -1, 0, 0, {1}};
	vec.nstep = 1;
	vec.step[0] = (tcp_step){TCP_V_FMUL, TCP_SRC_S0, TCP_SRC_S1, 0, 0, 0};
	ts_id rows = ts_add_scalar(s, l->body, "rows", TS_SC_ALU, TCP_S_ADD, f->e, TS_NONE, 1);
	ts_id cls = ts_add_region(s, l->body, TS_RG_CLASSES, rows);
	ts_region_bounds(s, cls, (int64_t[]){4, 16}, 2);
	f->cls = cls;
	ts_id k0 = ts_add_region(s, cls, TS_RG_SEQ, TS_NONE), k1 = ts_add_region(s, cls, TS_RG_SEQ, TS_NONE);
	ts_id v0 = ts_add_op(s, k0, &vec, TS_PH_EXPERT), v1 = ts_add_op(s, k1, &vec, TS_PH_EXPERT);
	ts_id pred = ts_add_scalar(s, l->body, "p", TS_SC_CMP, TCP_C_LT, rows, f->nb, 0);
	ts_id gd = ts_add_region(s, l->body, TS_RG_GUARD, pred);
	tcp_insn back = copy(f->xd, 0, f->yd, 0, 64);
	ts_id b0 = ts_add_op(s, gd, &back, TS_PH_EXPERT);
	ts_add_dep(s, p1, p0, 0);
	ts_add_dep(s, p1, v0, 1);
	ts_add_dep(s, p1, v1, 1);
	for (ts_id v = v0; v <= v1; v++) {
		ts_add_dep(s, v, p0, 0);
		ts_add_dep(s, v, c0, 0);
	}
	ts_add_dep(s, b0, v0, 0);
	ts_add_dep(s, b0, v1, 0);
	ts_add_dep(s, b0, p1, 0);
	s->op[b0].cost = 77;
	s->granted = 0x9;
}

static void done(fx *f)
{
	tcp_sched_free(f->s);
	moe_tcp_machine_free(f->ctx, f->m);
	moe_ctx_free(f->ctx);
}

static void print(tcp_sched *s, char **t, size_t *n)
{
	assert_int_equal(tcp_sched_print(s, t, n), MOE_OK);
}

/* Whether some error diagnostic contains `what`. */
static bool has_error(moe_ctx *ctx, const char *what)
{
	for (size_t i = 0; i < moe_diag_count(ctx); i++) {
		moe_diag_kind k;
		moe_loc loc;
		const char *msg;
		moe_diag_get(ctx, i, &k, &loc, &msg);
		if (k == MOE_DIAG_ERROR && strstr(msg, what))
			return true;
	}
	return false;
}

static void test_roundtrip(void **st)
{
	(void)st;
	fx f;
	build(&f);
	if (tcp_sched_verify(f.s) != MOE_OK)
		moe_diag_print(f.ctx, stderr);
	assert_int_equal(tcp_sched_verify(f.s), MOE_OK);
	size_t n1, n2;
	char *t1 = NULL;
	print(f.s, &t1, &n1);
	tcp_sched *p = tcp_sched_parse(f.ctx, f.m, "built", t1, n1);
	if (!p)
		moe_diag_print(f.ctx, stderr);
	assert_non_null(p);
	char *t2 = NULL;
	print(p, &t2, &n2);
	assert_int_equal(n1, n2);
	assert_memory_equal(t1, t2, n1);
	/* the objects, not only the text */
	assert_int_equal(p->nop, f.s->nop);
	assert_int_equal(p->nbuf, f.s->nbuf);
	assert_int_equal(p->nloop, 1);
	assert_int_equal(p->loop[0].expert, ts_find_scalar(p, "e"));
	assert_string_equal(p->buf[f.w].source, "model.layers.{layer}.w\"q\"");
	assert_int_equal(p->op[1].ndep, 0);
	assert_int_equal(p->op[2].ndep, 3);
	assert_int_equal(p->op[2].dist[1], 1);
	assert_int_equal(p->op[5].cost, 77);
	assert_int_equal(p->granted, 0x9);
	assert_non_null(strstr(t1, "src=\"model.layers.{layer}.w\\\"q\\\"\""));
	assert_non_null(strstr(t1, "deps=[@1,@3^1,@4^1]"));
	ctx_free(f.ctx, t1, n1);
	ctx_free(f.ctx, t2, n2);
	tcp_sched_free(p);
	done(&f);
}

/* Two combine copies whose program order differs from their id order (as
 * after scheduling): *b (y's bytes into x) stands before *a (x into y). */
static void out_of_order(fx *f, ts_id *a, ts_id *b)
{
	tcp_sched *s = f->s;
	tcp_insn ai = copy(f->yd, 0, f->x, 0, 64), bi = copy(f->x, 0, f->xd, 0, 64);
	*a = ts_add_op(s, TS_NONE, &ai, TS_PH_COMBINE);
	*b = ts_add_op(s, TS_NONE, &bi, TS_PH_COMBINE);
	s->op[*a].region = s->op[*b].region = s->top;
	ts_region_push(s, s->top, TS_ITEM_OP | *b);
	ts_region_push(s, s->top, TS_ITEM_OP | *a);
	for (ts_id o = 0; o < *a; o++)
		ts_add_dep(s, *b, o, 0);
	ts_add_dep(s, *a, *b, 0);
	ts_add_dep(s, *a, 5, 0);
	s->buf[f->x].kind = TCP_T_SCRATCH; /* written by op b */
}

/* Program order differs from id order (as after scheduling): ids survive. */
static void test_ids_kept_out_of_order(void **st)
{
	(void)st;
	fx f;
	build(&f);
	tcp_sched *s = f.s;
	ts_id a, b;
	out_of_order(&f, &a, &b);
	assert_int_equal(tcp_sched_verify(s), MOE_OK);
	size_t n1, n2;
	char *t1 = NULL;
	print(s, &t1, &n1);
	size_t ib = (size_t)(strstr(t1, "op @7") - t1), ia = (size_t)(strstr(t1, "op @6") - t1);
	assert_true(ib < n1 && ia < n1 && ib < ia);
	tcp_sched *p = tcp_sched_parse(f.ctx, f.m, "built", t1, n1);
	assert_non_null(p);
	char *t2 = NULL;
	print(p, &t2, &n2);
	assert_int_equal(n1, n2);
	assert_memory_equal(t1, t2, n1);
	assert_int_equal(p->op[a].phase, TS_PH_COMBINE);
	assert_int_equal(p->op[a].in.v[TCP_V_DST].t, (int32_t)f.yd);
	assert_int_equal(p->op[a].dep[0], b);
	ctx_free(f.ctx, t1, n1);
	ctx_free(f.ctx, t2, n2);
	tcp_sched_free(p);
	done(&f);
}

/* A copy (ts_clone) prints as the schedule does, and a copy of a copy is
 * that copy field for field: the rewrite driver starts a stage from a copy
 * so that every trial's copy of it is the schedule itself (ts_same) and a
 * priced row's copy can stand for the row applied again. Checked on the
 * built schedule and on one whose program order differs from id order. */
static void clone_fixed_point(fx *f)
{
	assert_int_equal(tcp_sched_verify(f->s), MOE_OK);
	tcp_sched *c1 = ts_clone(f->s), *c2 = c1 ? ts_clone(c1) : NULL;
	assert_non_null(c2);
	assert_true(ts_same(c1, c2));
	size_t n0, n1;
	char *t0 = NULL, *t1 = NULL;
	print(f->s, &t0, &n0);
	print(c1, &t1, &n1);
	assert_int_equal(n0, n1);
	assert_memory_equal(t0, t1, n0);
	ctx_free(f->ctx, t0, n0);
	ctx_free(f->ctx, t1, n1);
	tcp_sched_free(c2);
	tcp_sched_free(c1);
}

static void test_clone_fixed_point(void **st)
{
	(void)st;
	fx f;
	build(&f);
	clone_fixed_point(&f);
	ts_id a, b;
	out_of_order(&f, &a, &b);
	clone_fixed_point(&f);
	done(&f);
}

static void test_scalar_names_unique(void **st)
{
	(void)st;
	fx f;
	build(&f);
	ts_id a = ts_add_scalar(f.s, f.s->top, "nb", TS_SC_CONST, 0, TS_NONE, TS_NONE, 3);
	ts_id b = ts_add_scalar(f.s, f.s->top, "nb", TS_SC_CONST, 0, TS_NONE, TS_NONE, 4);
	assert_string_equal(f.s->sc[a].name, "nb.1");
	assert_string_equal(f.s->sc[b].name, "nb.2");
	assert_int_equal(ts_find_scalar(f.s, "nb.2"), b);
	for (int i = 0; i < 300; i++) /* the name table grows */
		ts_add_scalar(f.s, f.s->top, "t", TS_SC_CONST, 0, TS_NONE, TS_NONE, i);
	assert_int_equal(ts_find_scalar(f.s, "t.299"), f.s->nsc - 1);
	assert_int_equal(ts_find_scalar(f.s, "nb.2"), b);
	assert_int_equal(tcp_sched_verify(f.s), MOE_OK);
	done(&f);
}

/* One broken schedule per case: break(f) then the verifier's message. */
typedef void (*breaker)(fx *f);
static void op_in_no_region(fx *f)
{
	tcp_insn in = copy(f->yd, 0, f->x, 0, 64);
	ts_add_op(f->s, TS_NONE, &in, TS_PH_COMBINE);
}
static void op_twice(fx *f)
{
	ts_region_push(f->s, f->s->top, TS_ITEM_OP | 0);
}
static void region_two_parents(fx *f)
{
	ts_id r = ts_add_region(f->s, f->s->top, TS_RG_SEQ, TS_NONE);
	ts_region_push(f->s, f->s->loop[0].epilogue, TS_ITEM_RG | r);
}
static void region_cycle(fx *f)
{
	ts_id r = ts_add_region(f->s, f->s->top, TS_RG_SEQ, TS_NONE);
	ts_region_push(f->s, r, TS_ITEM_RG | f->s->top);
}
static void wrong_ctx(fx *f)
{
	f->s->op[0].ctx = TCP_CTX_MAIN;
}
static void with_register(fx *f)
{
	f->s->op[0].in.rd = 3;
}
static void ctl_op(fx *f)
{
	f->s->op[0].in.op = TCP_OP_LI;
}
static void use_before_def(fx *f)
{
	/* $e's definition moves after the op that reads it */
	ts_region *b = &f->s->rg[f->s->loop[0].body];
	uint32_t t = b->item[0];
	b->item[0] = b->item[1];
	b->item[1] = t;
}
static void case_scalar_leaks(fx *f)
{
	ts_id k0 = TS_ITEM_ID(f->s->rg[f->cls].item[0]);
	ts_id q = ts_add_scalar(f->s, k0, "q", TS_SC_CONST, 0, TS_NONE, TS_NONE, 1);
	tcp_insn in = copy(f->yd, 0, f->x, 0, 64);
	in.vreg = (int32_t)q;
	ts_add_op(f->s, f->s->top, &in, TS_PH_COMBINE);
}
static void bad_dist(fx *f)
{
	f->s->op[2].dist[0] = 2;
}
static void span_range(fx *f)
{
	f->s->buf[f->yd].life = TS_LIFE_SPAN;
	f->s->buf[f->yd].first = 1;
	f->s->buf[f->yd].last = 99;
}
static void missing_dep(fx *f)
{
	f->s->op[5].ndep = 2; /* drops b0's dependency on the prefetch, which writes wd... */
	f->s->op[5].in.v[TCP_V_S0].t = (int32_t)f->wd; /* ...that b0 now reads */
	f->s->op[5].in.v[TCP_V_S0].base = 64;
}
static void view_scalar_range(fx *f)
{
	f->s->op[0].in.v[TCP_V_DST].reg = 999;
}
static void classes_not_seq(fx *f)
{
	ts_region *c = &f->s->rg[f->cls];
	f->s->rg[TS_ITEM_ID(c->item[1])].kind = TS_RG_TIER;
}
static void loop_items(fx *f)
{
	ts_region_push(f->s, f->s->loop[0].region, TS_ITEM_OP | 0);
}
static void guard_without_pred(fx *f)
{
	ts_add_region(f->s, f->s->top, TS_RG_GUARD, TS_NONE);
}

static void test_verifier_rejects(void **st)
{
	(void)st;
	static const struct {
		breaker brk;
		const char *msg;
	} cases[] = {
		{op_in_no_region, "op @6: stands in no region reached from the root"},
		{op_twice, "op @0: appears twice in the regions"},
		{region_two_parents, "appears twice: the regions are not a tree"},
		{region_cycle, "region #0: appears twice: the regions are not a tree"},
		{wrong_ctx, "op @0: context 1, dma.copy runs on dma"},
		{with_register, "op @0: a command has no register, condition or target fields"},
		{ctl_op, "op @0: opcode 1 is not a command"},
		{use_before_def, "op @2: view s0 uses $e before its definition"},
		{case_scalar_leaks, "op @6: valid uses $q before its definition (or outside the region defining it)"},
		{bad_dist, "op @2: dependency 0: @1^2"},
		{span_range, "buffer %4: its span names op @1..@99 of 6 ops"},
		{missing_dep, "op @5: reads buffer %5 'wd' (bytes 128..255) that op @2 writes, with no dependency path"},
		{view_scalar_range, "op @0: view dst names scalar 999 of 5"},
		{classes_not_seq, "region #5: classes: case 1 is not a sequence region"},
		{loop_items, "a loop region holds its three parts, not items"},
		{guard_without_pred, "the guard's predicate names scalar 4294967295 of 5"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		fx f;
		build(&f);
		cases[i].brk(&f);
		if (tcp_sched_verify(f.s) != MOE_ERR_INVALID)
			fail_msg("case %zu (\"%s\") was accepted", i, cases[i].msg);
		if (!has_error(f.ctx, cases[i].msg)) {
			moe_diag_print(f.ctx, stderr);
			fail_msg("case %zu: no error containing \"%s\"", i, cases[i].msg);
		}
		done(&f);
	}
}

/* Every prefix of a printed schedule, and the whole text with one byte
 * changed at each position, is read without a crash: accepted, or refused
 * with at least one error. */
static void test_prefixes_and_bytes(void **st)
{
	(void)st;
	fx f;
	build(&f);
	size_t n;
	char *t = NULL;
	print(f.s, &t, &n);
	char *buf = malloc(n + 1);
	assert_non_null(buf);
	int accepted = 0;
	for (size_t k = 0; k <= n; k++) {
		for (int pass = 0; pass < 2; pass++) {
			moe_ctx *c = moe_ctx_new(NULL, NULL);
			memcpy(buf, t, n);
			size_t len = pass ? n : k;
			if (pass && k < n)
				buf[k] = (char)(buf[k] == '9' ? '}' : buf[k] + 1);
			tcp_sched *p = tcp_sched_parse(c, f.m, "cut", buf, len);
			assert_true(p != NULL || moe_error_count(c) > 0);
			assert_true(p == NULL || moe_error_count(c) == 0);
			accepted += p != NULL;
			tcp_sched_free(p);
			moe_ctx_free(c);
		}
	}
	assert_true(accepted >= 2); /* the whole text, at least */
	free(buf);
	ctx_free(f.ctx, t, n);
	done(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_ids_kept_out_of_order),
		cmocka_unit_test(test_clone_fixed_point),
		cmocka_unit_test(test_scalar_names_unique),
		cmocka_unit_test(test_verifier_rejects),
		cmocka_unit_test(test_prefixes_and_bytes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
