/* tests/unit/test_tcp_i8.c: the TCP simulator's i8 x i8 contraction (W8A8,
 * docs/tcp-isa.md section 6) on a hand-written program, against sums
 * computed here in 64-bit integers: operands at the extremes of int8 (rows
 * and columns all -128 or all 127) over a reduction of 4095, whose sums
 * (16129 x 4095 = 66,048,255, odd, past 2^24) an f32 accumulator could not
 * hold exactly, and pseudo-random bytes elsewhere. Unscaled, the contraction
 * writes the i32 sums; with flags=scaled, f32(sum) x s2[m, o]; with
 * flags=scaled,rowdiv, f32(sum) x f32(col[o] / row[m]), both factors read
 * through s2 (col at its base, row its third stride further). The validator
 * refuses mixed i8 / bf16 operands, an unscaled i8 contraction into f32, a
 * scaled one with acc and rowdiv without scaled. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "moec/runtime.h"
#include "moec/tcp.h"

enum { M = 4, O = 4, I = 4095 };

static const char *head =
	"tcps 1\n"
	"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 "
	"body=-1\n"
	"tensor %0 hbm input u8 [4,4095] addr=0 slice=0 const=0 \"a\"\n"
	"tensor %1 hbm input u8 [4,4095] addr=16384 slice=0 const=0 \"w\"\n"
	"tensor %2 hbm input f32 [4,4] addr=32768 slice=0 const=0 \"s\"\n"
	"tensor %3 hbm output i32 [4,4] addr=33024 slice=0 const=0 \"y\"\n"
	"tensor %4 hbm output f32 [4,4] addr=33280 slice=0 const=0 \"ys\"\n"
	"tensor %5 dm scratch i8 [4,4095] addr=0 slice=32 const=0 \"a.dm\"\n"
	"tensor %6 dm scratch i8 [4,4095] addr=32 slice=32 const=0 \"w.dm\"\n"
	"tensor %7 dm scratch f32 [4,4] addr=64 slice=32 const=0 \"s.dm\"\n"
	"tensor %8 dm scratch i32 [4,4] addr=96 slice=32 const=0 \"y.dm\"\n"
	"tensor %9 dm scratch f32 [4,4] addr=128 slice=32 const=0 \"ys.dm\"\n"
	"tensor %10 trf scratch i8 [4,4095] addr=0 slice=4096 const=0 \"t\"\n"
	"tensor %11 hbm input f32 [8] addr=33536 slice=0 const=0 \"sr\"\n"
	"tensor %12 hbm output f32 [4,4] addr=33792 slice=0 const=0 \"yr\"\n"
	"tensor %13 dm scratch f32 [8] addr=160 slice=32 const=0 \"sr.dm\"\n"
	"tensor %14 dm scratch f32 [4,4] addr=192 slice=32 const=0 \"yr.dm\"\n";

static const char *body =
	"@0: dma.copy dims=[16380] dst=%5+0:[1] s0=%0+0:[1]\n"
	"@1: dma.copy dims=[16380] dst=%6+0:[1] s0=%1+0:[1]\n"
	"@2: dma.copy dims=[16] dst=%7+0:[1] s0=%2+0:[1]\n"
	"@3: sub.ldtrf dims=[4,4095] flags=xslice, dst=%10+0:[4095,1] s0=%6+0:[4095,1]\n"
	"@4: tu.contract dims=[4,4,4095] flags=switch, tile=1 dst=%8+0:[4,1,0] s0=%5+0:[4095,0,1] "
	"s1=%10+0:[0,4095,1]\n"
	"@5: tu.contract dims=[4,4,4095] flags=switch,scaled, tile=1 dst=%9+0:[4,1,0] s0=%5+0:[4095,0,1] "
	"s1=%10+0:[0,4095,1] s2=%7+0:[4,1,0]\n"
	"@6: dma.copy dims=[16] dst=%3+0:[1] s0=%8+0:[1]\n"
	"@7: dma.copy dims=[16] dst=%4+0:[1] s0=%9+0:[1]\n"
	"@8: dma.copy dims=[8] dst=%13+0:[1] s0=%11+0:[1]\n"
	"@9: tu.contract dims=[4,4,4095] flags=switch,rowdiv,scaled, tile=1 dst=%14+0:[4,1,0] s0=%5+0:[4095,0,1] "
	"s1=%10+0:[0,4095,1] s2=%13+0:[1,1,4]\n"
	"@10: dma.copy dims=[16] dst=%12+0:[1] s0=%14+0:[1]\n"
	"@11: halt\n";

static moe_tcp_program *parse(moe_ctx *ctx, const char *tensors, const char *code)
{
	char prog[4096];
	snprintf(prog, sizeof prog, "%s%s", tensors, code);
	return moe_tcp_from_asm(ctx, "i8.tcps", prog, strlen(prog), NULL);
}

/* Row / column 0 all 127, 1 all -128, the rest bytes of a multiplicative hash. */
static int8_t operand(int which, int64_t r, int64_t i)
{
	if (r == 0)
		return 127;
	if (r == 1)
		return -128;
	uint32_t h = (uint32_t)((r * I + i) ^ (which ? 0x5bd1e995u : 0x2545f491u)) * 2654435761u;
	return (int8_t)(uint8_t)(h >> 24);
}

static void test_i8_contraction_exact(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_program *p = parse(ctx, head, body);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	int64_t sh[2] = {M, I}, ss[2] = {M, O}, s8[1] = {O + M};
	moe_tensor *a = moe_tensor_new(ctx, MOE_U8, 2, sh), *w = moe_tensor_new(ctx, MOE_U8, 2, sh),
		   *s = moe_tensor_new(ctx, MOE_F32, 2, ss), *sr = moe_tensor_new(ctx, MOE_F32, 1, s8);
	assert_true(a && w && s && sr);
	float *col = sr->data, *row = col + O; /* channel scales, then the rows' 127 / m */
	for (int64_t k = 0; k < O; k++)
		col[k] = 0.0037f * (float)(k + 3);
	for (int64_t k = 0; k < M; k++)
		row[k] = 127.0f / (0.3f + 1.7f * (float)k);
	for (int64_t r = 0; r < M; r++)
		for (int64_t i = 0; i < I; i++) {
			((int8_t *)a->data)[r * I + i] = operand(0, r, i);
			((int8_t *)w->data)[r * I + i] = operand(1, r, i);
		}
	for (int64_t k = 0; k < M * O; k++)
		((float *)s->data)[k] = 0.001f * (float)(k + 1) * (k & 1 ? -1.0f : 1.0f);
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	assert_int_equal(moe_tensor_map_set(b, "a", a), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "w", w), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "s", s), MOE_OK);
	assert_int_equal(moe_tensor_map_set(b, "sr", sr), MOE_OK);
	moe_tensor *out[3] = {NULL, NULL, NULL};
	moe_tcp_stats stats;
	moe_status rc = moe_tcp_run(ctx, p, b, NULL, out, &stats);
	if (rc != MOE_OK)
		moe_diag_print(ctx, stderr);
	assert_int_equal(rc, MOE_OK);
	const int32_t *y = out[0]->data;
	const float *ys = out[1]->data, *yr = out[2]->data;
	for (int64_t m = 0; m < M; m++)
		for (int64_t o = 0; o < O; o++) {
			int64_t ref = 0;
			for (int64_t i = 0; i < I; i++)
				ref += (int64_t)operand(0, m, i) * operand(1, o, i);
			assert_int_equal(y[m * O + o], ref);
			float sref = (float)ref * ((const float *)s->data)[m * O + o];
			assert_true(ys[m * O + o] == sref);
			volatile float q = col[o] / row[m]; /* rounded to f32 before the product */
			float rref = (float)ref * q;
			assert_true(yr[m * O + o] == rref);
		}
	/* the extremes: 127 x 127, 127 x -128, -128 x -128 summed 4095 times */
	assert_int_equal(y[0], 16129 * 4095);
	assert_int_equal(y[1], -16256 * 4095);
	assert_int_equal(y[O + 1], 16384 * 4095);
	assert_true(stats.cycles > 0);
	moe_tensor_free(ctx, out[0]);
	moe_tensor_free(ctx, out[1]);
	moe_tensor_free(ctx, out[2]);
	moe_tensor_map_free(b);
	moe_tcp_program_free(p);
	moe_ctx_free(ctx);
}

/* Programs the validator refuses: each parses to NULL with the rule's message. */
static void test_i8_contraction_rules(void **st)
{
	(void)st;
	static const struct {
		const char *tensors, *code, *msg;
	} bad[] = {
		{"tensor %15 dm scratch bf16 [4,4095] addr=224 slice=64 const=0 \"bf\"\n",
			"@0: tu.contract dims=[4,4,4095] flags=switch, tile=1 dst=%8+0:[4,1,0] s0=%15+0:[4095,0,1] "
			"s1=%10+0:[0,4095,1]\n@1: halt\n",
			"both i8"},
		{"", "@0: tu.contract dims=[4,4,4095] flags=switch, tile=1 dst=%9+0:[4,1,0] s0=%5+0:[4095,0,1] "
		     "s1=%10+0:[0,4095,1]\n@1: halt\n",
			"writes its i32 sums"},
		{"", "@0: tu.contract dims=[4,4,4095] flags=switch,acc,scaled, tile=1 dst=%9+0:[4,1,0] s0=%5+0:[4095,0,1] "
		     "s1=%10+0:[0,4095,1] s2=%7+0:[4,1,0]\n@1: halt\n",
			"no acc"},
		{"", "@0: tu.contract dims=[4,4,4095] flags=switch,rowdiv, tile=1 dst=%8+0:[4,1,0] s0=%5+0:[4095,0,1] "
		     "s1=%10+0:[0,4095,1] s2=%13+0:[1,1,4]\n@1: halt\n",
			"rowdiv divides the scale"},
	};
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		moe_ctx *ctx = moe_ctx_new(NULL, NULL);
		char tensors[4096];
		snprintf(tensors, sizeof tensors, "%s%s", head, bad[k].tensors);
		moe_tcp_program *p = parse(ctx, tensors, bad[k].code);
		assert_null(p);
		bool found = false;
		for (size_t d = 0; d < moe_diag_count(ctx); d++) {
			const char *msg;
			moe_diag_get(ctx, d, NULL, NULL, &msg);
			found |= strstr(msg, bad[k].msg) != NULL;
		}
		if (!found)
			moe_diag_print(ctx, stderr);
		assert_true(found);
		moe_ctx_free(ctx);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_i8_contraction_exact),
		cmocka_unit_test(test_i8_contraction_rules),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
