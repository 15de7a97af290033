/* The DM planner's first placement (backend-tcp/compiler/dmplan.h,
 * docs/tcp-compiler.md 5.3): two buffers whose lifetimes are disjoint share
 * bytes, overlapping ones do not, loop buffers sit at the top of DM, buffers
 * placed before keep their offsets, HBM scratch follows the bound tensors,
 * and an overflow is one diagnostic naming the largest live buffers. Every
 * placement is also checked by the schedule verifier (no two live buffers
 * on the same bytes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "backend-tcp/compiler/dmplan.h"
#include "backend-tcp/isa/build.h"

typedef struct fx {
	moe_ctx *ctx;
	moe_tcp_machine *m;
	tcp_sched *s;
} fx;

static void open_fx(fx *f)
{
	f->ctx = moe_ctx_new(NULL, NULL);
	f->m = moe_tcp_machine_default(f->ctx);
	assert_non_null(f->m);
	f->s = tcp_sched_new(f->ctx, f->m);
}

static void close_fx(fx *f)
{
	tcp_sched_free(f->s);
	moe_tcp_machine_free(f->ctx, f->m);
	moe_ctx_free(f->ctx);
}

static ts_id hbm(tcp_sched *s, const char *name, int kind, int64_t n)
{
	int64_t shape[1] = {n};
	ts_id b = ts_add_buf(s, name, TCP_HBM, kind, MOE_F32, 1, shape);
	if (kind == TCP_T_WEIGHT)
		ts_set_source(s, b, name);
	return b;
}

/* f32[n] spread over every slice, slice_bytes per slice */
static ts_id dm(tcp_sched *s, const char *name, int64_t n, int64_t slice_bytes, int life)
{
	int64_t shape[1] = {n};
	ts_id b = ts_add_buf(s, name, TCP_DM, TCP_T_SCRATCH, MOE_F32, 1, shape);
	s->buf[b].layout = (ts_layout){0, (uint16_t)tcp_slices(s->m), 1, TS_SPLIT_FLIT, slice_bytes};
	s->buf[b].life = (uint8_t)life;
	return b;
}

static ts_id copy(tcp_sched *s, ts_id rg, ts_id dst, ts_id src, int64_t n)
{
	tcp_insn in = tcp_b_dma_copy_flat((int32_t)dst, (int32_t)src, n);
	return ts_add_op(s, rg, &in, TS_PH_ROUTING);
}

static void span(tcp_sched *s, ts_id b, ts_id first, ts_id last)
{
	s->buf[b].first = first;
	s->buf[b].last = last;
}

static bool disjoint(const ts_buf *a, const ts_buf *b)
{
	return a->offset + a->layout.slice_bytes <= b->offset || b->offset + b->layout.slice_bytes <= a->offset;
}

/* x -> a -> c -> b -> y: a (@0..@1) and b (@2..@3) never live together, c
 * (@1..@2) lives with each; a and b take 32 bytes per slice, c 64. With
 * dm_bytes per slice of DM, places them and checks what every placement
 * holds: c apart from a and b, on whole flits, the schedule verified. */
static void place_chain(fx *f, int64_t dm_bytes, ts_id *a, ts_id *b, ts_id *c)
{
	tcp_sched *s = f->s;
	f->m->dm_bytes_per_slice = dm_bytes;
	ts_id x = hbm(s, "x", TCP_T_INPUT, 4096), y = hbm(s, "y", TCP_T_OUTPUT, 4096);
	*a = dm(s, "a", 4096, 32, TS_LIFE_SPAN);
	*c = dm(s, "c", 4096, 64, TS_LIFE_SPAN);
	*b = dm(s, "b", 4096, 32, TS_LIFE_SPAN);
	ts_id o0 = copy(s, s->top, *a, x, 4096), o1 = copy(s, s->top, *c, *a, 4096);
	ts_id o2 = copy(s, s->top, *b, *c, 4096), o3 = copy(s, s->top, y, *b, 4096);
	ts_add_dep(s, o1, o0, 0);
	ts_add_dep(s, o2, o1, 0);
	ts_add_dep(s, o3, o2, 0);
	span(s, *a, o0, o1);
	span(s, *c, o1, o2);
	span(s, *b, o2, o3);
	assert_int_equal(tcp_dm_place(s), MOE_OK);
	assert_int_equal(s->buf[*a].offset, 0); /* the first from 0 */
	assert_true(disjoint(&s->buf[*c], &s->buf[*a]));
	assert_true(disjoint(&s->buf[*c], &s->buf[*b]));
	assert_int_equal(s->buf[*c].offset % f->m->flit_bytes, 0);
	assert_int_equal(tcp_sched_verify(s), MOE_OK);
}

/* place_chain at one size of DM: where c and b land. With room for all
 * three, next fit puts b after c, on bytes no buffer used; with 96 bytes per
 * slice, b fits only over a's bytes (their lifetimes are disjoint), where
 * next fit wraps to the first fit from 0. */
typedef struct spans_case {
	const char *name;
	int64_t dm_bytes;  /* DM bytes per slice */
	int64_t c_offset;  /* c's offset */
	int64_t b_offset;  /* b's offset */
	bool b_on_a;       /* b shares a's bytes, else no buffer's */
} spans_case;

static const spans_case spans_cases[] = {
	{"test_spans_spread", 524288, 32, 96, false},
	{"test_spans_share_bytes", 96, 32, 0, true},
};

static void test_spans(void **state)
{
	const spans_case *k = *state;
	fx f;
	open_fx(&f);
	ts_id a, b, c;
	place_chain(&f, k->dm_bytes, &a, &b, &c);
	const ts_buf *bb = &f.s->buf[b];
	assert_int_equal(f.s->buf[c].offset, k->c_offset);
	assert_int_equal(bb->offset, k->b_offset);
	if (k->b_on_a)
		assert_int_equal(bb->offset, f.s->buf[a].offset);
	else
		assert_true(disjoint(bb, &f.s->buf[a])); /* and c's: place_chain */
	close_fx(&f);
}

/* A loop buffer at the top of DM, a program buffer from 0, one placed by
 * hand kept where it is and avoided. */
static void test_loop_at_top(void **state)
{
	(void)state;
	fx f;
	open_fx(&f);
	tcp_sched *s = f.s;
	int64_t cap = f.m->dm_bytes_per_slice;
	ts_id x = hbm(s, "x", TCP_T_INPUT, 4096), w = hbm(s, "w", TCP_T_WEIGHT, 4096);
	ts_id p = dm(s, "p", 4096, 64, TS_LIFE_PROGRAM), fixed = dm(s, "fixed", 4096, 64, TS_LIFE_PROGRAM);
	ts_id wl = dm(s, "wl", 4096, 256, TS_LIFE_LOOP), wb = dm(s, "wb", 4096, 128, TS_LIFE_BLOCK);
	s->buf[fixed].offset = 0;
	copy(s, s->top, p, x, 4096);
	copy(s, s->top, fixed, x, 4096);
	ts_id nb = ts_add_scalar(s, s->top, "nb", TS_SC_CONST, 0, TS_NONE, TS_NONE, 2);
	ts_id g = ts_add_scalar(s, s->top, "g", TS_SC_LOOPIDX, 0, TS_NONE, TS_NONE, 0);
	int li = ts_add_loop(s, s->top, 4, nb, g);
	ts_id pre = copy(s, s->loop[li].prologue, wl, w, 4096);
	ts_add_dep(s, copy(s, s->loop[li].body, wb, wl, 4096), pre, 0);
	assert_int_equal(tcp_dm_place(s), MOE_OK);
	assert_int_equal(s->buf[fixed].offset, 0);
	assert_int_equal(s->buf[p].offset, 64); /* after the placed one */
	assert_int_equal(s->buf[wl].offset + 256, cap); /* the first loop buffer: the top */
	assert_int_equal(s->buf[wb].offset + 128, s->buf[wl].offset); /* the next one: under it */
	assert_int_equal(tcp_sched_verify(s), MOE_OK);
	close_fx(&f);
}

/* HBM: inputs, weights and outputs first (buffer order), then scratch,
 * each after the last, granule aligned; a placed one is kept. */
static void test_hbm_bump(void **state)
{
	(void)state;
	fx f;
	open_fx(&f);
	tcp_sched *s = f.s;
	int64_t gr = f.m->hbm_granule;
	ts_id t = hbm(s, "tmp", TCP_T_SCRATCH, 10), x = hbm(s, "x", TCP_T_INPUT, 100);
	ts_id w = hbm(s, "w", TCP_T_WEIGHT, 1000), y = hbm(s, "y", TCP_T_OUTPUT, 3);
	s->buf[x].offset = 4 * gr;
	assert_int_equal(tcp_dm_place(s), MOE_OK);
	assert_int_equal(s->buf[x].offset, 4 * gr);
	int64_t after_x = (4 * gr + 400 + gr - 1) / gr * gr;
	assert_int_equal(s->buf[w].offset, after_x);
	int64_t after_w = (after_x + 4000 + gr - 1) / gr * gr;
	assert_int_equal(s->buf[y].offset, after_w);
	assert_int_equal(s->buf[t].offset, after_w + gr); /* scratch last */
	close_fx(&f);
}

/* Three program buffers that cannot all fit: one error naming the largest
 * live ones, and nothing placed for the one that failed. */
static void test_overflow(void **state)
{
	(void)state;
	fx f;
	open_fx(&f);
	tcp_sched *s = f.s;
	int64_t cap = f.m->dm_bytes_per_slice;
	dm(s, "big", 16, cap / 2, TS_LIFE_PROGRAM);
	dm(s, "mid", 16, cap / 4, TS_LIFE_PROGRAM);
	ts_id last = dm(s, "last", 16, cap / 2, TS_LIFE_PROGRAM);
	assert_int_equal(tcp_dm_place(s), MOE_ERR_INVALID);
	assert_int_equal(s->buf[last].offset, -1);
	assert_int_equal(moe_error_count(f.ctx), 1);
	moe_diag_kind k;
	moe_loc loc;
	const char *msg;
	moe_diag_get(f.ctx, 0, &k, &loc, &msg);
	assert_non_null(strstr(msg, "DM overflow: buffer %2 'last'"));
	assert_non_null(strstr(msg, "(largest: 'big' (262144 B), 'mid' (131072 B))"));
	close_fx(&f);
}

/* The fit query on a loop's summary (tcp_dm_fits): the buffers' slots
 * spread over every slice in whole flits, then the span beside them; one
 * flit more than DM holds does not fit, nor a negative size. */
static void test_fits_summary(void **state)
{
	(void)state;
	fx f;
	open_fx(&f);
	int64_t S = tcp_slices(f.m), cap = f.m->dm_bytes_per_slice, fl = f.m->flit_bytes;
	ts_demand d;
	memset(&d, 0, sizeof d);
	d.bytes[0] = cap / 4 * S; /* two slots: half of DM */
	d.slots[0] = 2;
	d.bytes[1] = 1; /* one flit per slice */
	d.slots[1] = 1;
	d.n = 2;
	d.span = cap / 2 - fl;
	d.span = cap / 2 - fl;
	assert_true(tcp_dm_fits(f.m, &d));
	d.span += 1; /* rounded up to a flit: one flit over */
	assert_false(tcp_dm_fits(f.m, &d));
	d.span = 0;
	d.slots[0] = 4; /* the whole of DM, and the flit of buffer 1 over */
	assert_false(tcp_dm_fits(f.m, &d));
	d.slots[0] = 2;
	d.bytes[1] = -1;
	assert_false(tcp_dm_fits(f.m, &d));
	d.bytes[1] = INT64_MAX;
	assert_false(tcp_dm_fits(f.m, &d));
	close_fx(&f);
}

/* a spans case as a test of its own name */
#define SPANS_CASE(i) {spans_cases[i].name, test_spans, NULL, NULL, (void *)&spans_cases[i]}

int main(void)
{
	_Static_assert(sizeof spans_cases / sizeof *spans_cases == 2, "main runs every spans case");
	const struct CMUnitTest tests[] = {
		SPANS_CASE(0),
		SPANS_CASE(1),
		cmocka_unit_test(test_loop_at_top),
		cmocka_unit_test(test_hbm_bump),
		cmocka_unit_test(test_overflow),
		cmocka_unit_test(test_fits_summary),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
