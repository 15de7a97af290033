/* tests/fuzz/fuzz_tcprun.c: the TCP simulator on mutated valid programs.
 *
 * Input: u32 L (little endian), a .tcpb file of L bytes, then a mutation
 * script of 8-byte records {u16 pc, u8 what, u8 k, i32 value}, each applied to
 * instruction pc mod ncode of the loaded program: what mod 4 = 0 retargets a
 * branch or jump, 1 sets a scalar register field (rd, ra, rb or a view's
 * offset register), 2 sets a view's stride or scale, 3 sets an `li`
 * immediate or a view's base. A mutated program that the validator and the
 * termination check accept runs on the simulator with every input and
 * weight bound to zeros. The invariants: the run ends (a result or a
 * run-time fault with a diagnostic, never a crash or a sanitizer report),
 * within the work budget that the simulator enforces (docs/tcp-isa.md
 * section 9) and within MOEC_FUZZ_RUN_SECONDS (default 60) of wall time. */
#include <string.h>
#include <time.h>

#include "backend-tcp/isa/tcp_int.h"
#include "moec/runtime.h"
#include "tests/fuzz/fuzz_util.h"

static void mutate(tcp_program *p, const uint8_t *r)
{
	tcp_insn *in = &p->code[(r[0] | (uint32_t)r[1] << 8) % p->ncode];
	uint8_t what = r[2] % 4, k = r[3];
	int32_t v;
	memcpy(&v, r + 4, 4);
	tcp_view *vw = &in->v[k % TCP_NVIEW];
	switch (what) {
	case 0:
		if (in->op == TCP_OP_BR || in->op == TCP_OP_JMP)
			in->target = (int32_t)((uint32_t)v % (p->ncode + 1));
		break;
	case 1:
		if (k % 4 == 0)
			in->rd = (uint8_t)((uint32_t)v % TCP_NREG);
		else if (k % 4 == 1)
			in->ra = (uint8_t)((uint32_t)v % TCP_NREG);
		else if (k % 4 == 2 && in->rb != TCP_NOREG)
			in->rb = (uint8_t)((uint32_t)v % TCP_NREG);
		else if (vw->t >= 0)
			vw->reg = (int32_t)((uint32_t)v % (TCP_NREG + 1)) - 1;
		break;
	case 2:
		if (vw->t >= 0 && k / TCP_NVIEW % (TCP_MAXD + 1) == TCP_MAXD)
			vw->scale = (int64_t)v * (v < 0 ? 65536 : 1); /* large products too */
		else if (vw->t >= 0)
			vw->stride[k / TCP_NVIEW % (TCP_MAXD + 1)] = v;
		break;
	default:
		if (in->op == TCP_OP_LI)
			in->imm = (int64_t)((uint64_t)(int64_t)v << (k % 40));
		else if (vw->t >= 0)
			vw->base = v;
		break;
	}
}

/* Zero tensors for every input and weight; false when they would be large. */
static bool bind_zeros(moe_ctx *ctx, const tcp_program *p, moe_tensor_map *b)
{
	int64_t total = 0;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->kind != TCP_T_INPUT && t->kind != TCP_T_WEIGHT)
			continue;
		total += t->numel * (int64_t)moe_dtype_size((moe_dtype)t->dtype);
		if (total > ((int64_t)64 << 20))
			return false;
		moe_tensor *x = moe_tensor_new(ctx, (moe_dtype)t->dtype, t->rank, t->shape);
		if (!x || moe_tensor_map_set(b, t->name, x) != MOE_OK)
			return false;
	}
	return true;
}

static void run_one(moe_ctx *ctx, tcp_program *p)
{
	moe_tcp_machine *m = moe_tcp_machine_default(ctx);
	if (!m)
		FZ_FAIL("the built-in machine does not parse");
	bool ok = tcp_validate(ctx, p, m, "mutated") == MOE_OK && tcp_check_termination(ctx, p, "mutated") == MOE_OK;
	moe_tensor_map *b = moe_tensor_map_new(ctx);
	if (ok && bind_zeros(ctx, p, b)) {
		moe_tcp_run_opts o = {0};
		o.machine = m;
		o.timing_only = 1;
		moe_tcp_stats st;
		const char *lim = getenv("MOEC_FUZZ_RUN_SECONDS");
		double secs = lim ? atof(lim) : 60;
		int e0 = moe_error_count(ctx);
		clock_t c0 = clock();
		moe_status rc = moe_tcp_run(ctx, p, b, &o, NULL, &st);
		double took = (double)(clock() - c0) / CLOCKS_PER_SEC;
		fz_check_result(ctx, e0, rc == MOE_OK, "moe_tcp_run (mutated)");
		if (took > secs)
			FZ_FAIL("a mutated program ran %.1f s (limit %.0f s; %llu instructions)", took, secs,
				(unsigned long long)st.instructions);
	}
	moe_tensor_map_free(b);
	moe_tcp_machine_free(ctx, m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 4)
		return 0;
	uint32_t L = data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
	if (L > size - 4)
		return 0;
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	moe_tcp_program *p = moe_tcp_from_binary(ctx, "seed.tcpb", data + 4, L, NULL);
	if (p && p->ncode > 0) {
		for (size_t at = 4 + (size_t)L; at + 8 <= size && at < 4 + (size_t)L + 8 * 64; at += 8)
			mutate(p, data + at);
		moe_diag_clear(ctx);
		run_one(ctx, p);
	}
	moe_tcp_program_free(p);
	fz_ctx_free(ctx, &h);
	return 0;
}
