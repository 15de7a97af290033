/* Data placement (docs/tcp-isa.md section 1): the layout queries the
 * simulator and the validator share, on machine.json's 512 slices and 32-byte
 * flits, and what they mean for a DMA's cost: a spread tensor's flits are
 * interleaved over every slice, so each half of a double buffer lies on every
 * DMN pair, where consecutive parts put each half on a few slices. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"

static tcp_tensor dm(moe_dtype dt, int64_t numel, int64_t part, int32_t copies)
{
	tcp_tensor t;
	memset(&t, 0, sizeof t);
	t.space = TCP_DM;
	t.dtype = (uint8_t)dt;
	t.rank = 1;
	t.shape[0] = t.numel = numel;
	t.part_bytes = part;
	t.copies = copies;
	return t;
}

static void test_spread_interleaves_flits(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	assert_non_null(m);
	/* 1 MiB: 32768 flits, 64 on each of the 512 slices */
	tcp_tensor a = dm(MOE_BF16, 524288, 0, 1);
	assert_int_equal(tcp_layout_unit(m, &a), 32);
	assert_int_equal(tcp_layout_group(m, &a), 512);
	assert_int_equal(tcp_slice_holds(m, &a, 0), 2048);
	assert_int_equal(tcp_slice_holds(m, &a, 511), 2048);
	assert_true(tcp_slice_has(m, &a, 3, 3 * 32 + 31));
	assert_true(tcp_slice_has(m, &a, 3, (512 + 3) * 32));
	assert_false(tcp_slice_has(m, &a, 4, 3 * 32));
	/* the second half (flits 16384..32767) lies on every slice too */
	assert_true(tcp_slice_has(m, &a, 0, 524288));
	assert_true(tcp_slice_has(m, &a, 511, 524288 + 511 * 32));
	/* 4010 bytes: 125 whole flits and 10 bytes on slice 125, none past it */
	tcp_tensor b = dm(MOE_U8, 4010, 0, 1);
	assert_int_equal(tcp_slice_holds(m, &b, 0), 32);
	assert_int_equal(tcp_slice_holds(m, &b, 124), 32);
	assert_int_equal(tcp_slice_holds(m, &b, 125), 10);
	assert_int_equal(tcp_slice_holds(m, &b, 126), 0);
	assert_false(tcp_slice_has(m, &b, 125, 4010));
	/* 8 copies: groups of 64 slices, copy k on slices 64k..64k+63 */
	tcp_tensor c = dm(MOE_U8, 4096, 0, 8);
	assert_int_equal(tcp_layout_group(m, &c), 64);
	assert_int_equal(tcp_slice_holds(m, &c, 0), 64);
	assert_int_equal(tcp_slice_holds(m, &c, 64 + 5), 64);
	assert_true(tcp_slice_has(m, &c, 7 * 64 + 5, (64 + 5) * 32));
	assert_false(tcp_slice_has(m, &c, 6, 5 * 32));
	assert_int_equal(tcp_dm_side_bytes(&c, 100), 800);
	moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
}

static void test_parts_are_consecutive(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	/* 16 MiB in parts of 256 KiB: slices 0..63, part q on slice q */
	tcp_tensor a = dm(MOE_U8, 16777216, 262144, 1);
	assert_int_equal(tcp_layout_unit(m, &a), 262144);
	assert_int_equal(tcp_layout_group(m, &a), 64);
	assert_int_equal(tcp_slice_holds(m, &a, 63), 262144);
	assert_int_equal(tcp_slice_holds(m, &a, 64), 0);
	assert_true(tcp_slice_has(m, &a, 1, 262144));
	assert_true(tcp_slice_has(m, &a, 1, 2 * 262144 - 1));
	assert_false(tcp_slice_has(m, &a, 2, 262144));
	/* the whole tensor on each of slices 0..255 */
	tcp_tensor b = dm(MOE_U8, 1600, 1600, 256);
	assert_int_equal(tcp_slice_holds(m, &b, 255), 1600);
	assert_int_equal(tcp_slice_holds(m, &b, 256), 0);
	assert_true(tcp_slice_has(m, &b, 200, 1599));
	assert_int_equal(tcp_dm_side_bytes(&b, 1600), 409600);
	moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
}

/* Cycles of a program with DM tensor "buf" bf16 [2, 65536] (two 128 KiB
 * slots) of the given layout and one HBM -> DM copy of 128 KiB into slot
 * `slot`. */
static int64_t slot_copy_cycles(const char *layout, int slot)
{
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char prog[2048];
	snprintf(prog, sizeof prog,
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %%0 hbm scratch bf16 [65536] addr=0 slice=0 const=0 \"w\"\n"
		"tensor %%1 dm scratch bf16 [2,65536] addr=0 slice=16384 const=0 %s\"buf\"\n"
		"@0: dma.copy dims=[65536] dst=%%1+%d:[1] s0=%%0+0:[1]\n@1: halt\n",
		layout, slot * 65536);
	moe_tcp_program *p = moe_tcp_from_asm(ctx, "slots.tcps", prog, strlen(prog), NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	moe_tcp_stats s;
	assert_int_equal(moe_tcp_run(ctx, p, NULL, NULL, NULL, &s), MOE_OK);
	moe_tcp_program_free(p);
	moe_ctx_free(ctx);
	return s.cycles;
}

/* A spread double buffer: each slot's 4096 flits lie on all 512 slices, so
 * either slot's copy takes the same cycles, those of a copy that reaches all
 * 8 engine pairs' worth of DMNs. In parts of 16 KiB (slices 0..15, one DMN)
 * a slot sits on 8 slices of one DMN, whose bound makes the copy slower. */
static void test_double_buffer_slots_on_every_slice(void **st)
{
	(void)st;
	int64_t s0 = slot_copy_cycles("", 0), s1 = slot_copy_cycles("", 1);
	assert_int_equal(s0, s1);
	int64_t p1 = slot_copy_cycles("layout=16384x1 ", 1);
	assert_true(p1 > s1 + 500);
}

/* flags=switch on a Tensor Unit pass is bit 8 of the flag byte (a DMA
 * command's join): it survives .tcps -> .tcpb -> .tcps unchanged, and so
 * does an instruction's phase (ph=, .tcpb version 5). */
static void test_switch_flag_round_trips(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	const char prog[] =
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=-1 body=-1\n"
		"tensor %0 dm scratch f32 [4104] addr=0 slice=64 const=0 \"src\"\n"
		"tensor %1 dm scratch f32 [4104] addr=64 slice=64 const=0 \"dst\"\n"
		"@0: tu.vec dims=[4096] flags=switch, dst=%1+0:[1] s0=%0+8:[1] ph=combine\n@1: halt\n";
	tcp_program *p = tcp_parse_asm(ctx, "sw.tcps", prog, strlen(prog));
	assert_non_null(p);
	assert_int_equal(p->code[0].flags, TCP_F_ROUTE);
	assert_int_equal(p->code[0].phase, TCP_PH_COMBINE);
	assert_int_equal(p->code[1].phase, TCP_PH_ROUTING);
	assert_int_equal(tcp_validate(ctx, p, m, "sw.tcps"), MOE_OK);
	uint8_t *buf = NULL;
	size_t n = 0;
	assert_int_equal(tcp_encode(p, &buf, &n), MOE_OK);
	assert_true(n > 8);
	uint32_t ver = buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
	assert_int_equal(ver, 5); /* the format version (binary.c) */
	tcp_program *q = tcp_decode(ctx, "sw.tcpb", buf, n);
	assert_non_null(q);
	assert_int_equal(q->code[0].flags, TCP_F_ROUTE);
	assert_int_equal(q->code[0].phase, TCP_PH_COMBINE);
	char *text = NULL;
	size_t tlen = 0;
	assert_int_equal(moe_tcp_to_asm(ctx, q, &text, &tlen), MOE_OK);
	assert_non_null(strstr(text, "tu.vec dims=[4096] flags=switch, dst="));
	assert_non_null(strstr(text, " ph=combine\n"));
	moe_free(ctx, text);
	/* without the flag the same pass is rejected */
	p->code[0].flags = 0;
	assert_int_equal(tcp_validate(ctx, p, m, "sw.tcps"), MOE_ERR_FORMAT);
	free(buf);
	tcp_prog_free(q);
	tcp_prog_free(p);
	moe_tcp_machine_free(ctx, m);
	moe_ctx_free(ctx);
}

/* A program stored without phases (text without ph=) is tagged by its loops
 * when it is loaded: the block loop's region, from the branch that skips it
 * to its back branch, expert; what follows combine; the rest routing. */
static void test_untagged_program_gets_phases(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	const char prog[] =
		"tcps 1\n"
		"meta T=0 K=0 D=0 F=0 E=0 B=0 G=0 nproj=0 router_e=0 wexp=0 act=0 rmacs=0 dtype=0 nblocks=-1 bexp=-1 loop=2 body=2\n"
		"@0: li rd=r1 imm=3\n@1: br.ge ra=r0 rb=r1 target=@4\n@2: alu.add rd=r0 ra=r0 imm=1\n"
		"@3: br.lt ra=r0 rb=r1 target=@2\n@4: li rd=r0 imm=0\n@5: halt\n";
	moe_tcp_program *p = moe_tcp_from_asm(ctx, "loop.tcps", prog, strlen(prog), NULL);
	assert_non_null(p);
	static const uint8_t want[] = {TCP_PH_ROUTING, TCP_PH_EXPERT, TCP_PH_EXPERT, TCP_PH_EXPERT, TCP_PH_COMBINE,
		TCP_PH_COMBINE};
	assert_int_equal(p->ncode, 6);
	for (uint32_t i = 0; i < 6; i++)
		assert_int_equal(p->code[i].phase, want[i]);
	moe_tcp_program_free(p);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_spread_interleaves_flits),
		cmocka_unit_test(test_parts_are_consecutive),
		cmocka_unit_test(test_double_buffer_slots_on_every_slice),
		cmocka_unit_test(test_switch_flag_round_trips),
		cmocka_unit_test(test_untagged_program_gets_phases),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
