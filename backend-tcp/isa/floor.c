/* backend-tcp/isa/floor.c: the contract's floor for a compiled layer
 * (moe_tcp_floor; its derivation is docs/tcp-isa.md section 12). Every term
 * counts only work that the machine contract forces on any correct program
 * of the layer for the given routing outcome, at the most favourable rate the
 * contract allows, so the simulated time of any program is at least the
 * floor. Nothing here reads moec's schedule: only the layer's dimensions the
 * program records, the contractions' operand types it uses and the machine. */
#include <math.h>
#include <string.h>

#include "moec/tcp.h"

#include "backend-tcp/isa/tcp_int.h"

/* The MAC type of contraction `in`, and whether its f32 operands run as
 * bf16x3 (three bf16 products per MAC). */
static int contract_type(const tcp_program *p, const tcp_insn *in, bool *x3)
{
	int dt = p->t[in->v[TCP_V_S0].t].dtype;
	*x3 = (in->flags & TCP_F_BF16X3) != 0;
	return dt == MOE_F8E4M3 ? TCP_MT_F8 : dt == MOE_I8 ? TCP_MT_I8 : TCP_MT_BF16;
}

static bool is_contract(const tcp_program *p, const tcp_insn *in)
{
	return in->op == TCP_OP_TU_CONTRACT && in->v[TCP_V_S0].t >= 0 && (uint32_t)in->v[TCP_V_S0].t < p->nt;
}

int tcp_prog_mac_type(const tcp_program *p, const moe_tcp_machine *m)
{
	int best = TCP_MT_BF16;
	for (uint32_t pc = 0; pc < p->ncode; pc++) {
		bool x3;
		int mt = is_contract(p, &p->code[pc]) ? contract_type(p, &p->code[pc], &x3) : TCP_MT_BF16;
		best = m->macs_per_lane[mt] > m->macs_per_lane[best] ? mt : best;
	}
	return best;
}

/* The fastest MAC rate (MACs per cycle per lane) among the program's
 * contractions: f8 x f8 and i8 x i8 at their rates, f32 operands (bf16x3) at a
 * third of bf16's. A program without a contraction: bf16's. */
static double mac_rate_per_lane(const tcp_program *p, const moe_tcp_machine *m)
{
	double best = 0;
	for (uint32_t pc = 0; pc < p->ncode; pc++) {
		bool x3;
		if (!is_contract(p, &p->code[pc]))
			continue;
		int mt = contract_type(p, &p->code[pc], &x3);
		double r = (double)m->macs_per_lane[mt] / (x3 ? 3.0 : 1.0);
		best = r > best ? r : best;
	}
	return best > 0 ? best : (double)m->macs_per_lane[TCP_MT_BF16];
}

static double dmax(double a, double b)
{
	return a > b ? a : b;
}

/* The terms for tokens n (<= the program's T) and h experts hit, in cycles. */
static void floor_terms(const tcp_program *p, const moe_tcp_machine *m, int64_t n, double h, moe_tcp_floor_terms *f)
{
	double S = (double)tcp_slices(m), clk = m->clock_hz;
	double row = (double)p->moe_D * (double)moe_dtype_size((moe_dtype)p->dtype);
	/* the bytes: the hit experts' weights as the program stores them in HBM
	 * (packed layouts included, docs/tcp-isa.md A13), and the rest the
	 * program records (x, y, the weights outside the block loop), its x and
	 * y rows counted for the n tokens present */
	double W = h * (double)p->weight_bytes_per_expert;
	double X = (double)p->act_bytes - 2.0 * (double)(p->moe_T - n) * row;
	X = X > 0 ? X : 0;
	double xb = (double)n * row, yb = (double)n * row;
	/* the DMA context's best rate: the HBM pool, every engine, every DMN */
	double dmns = (double)m->clusters * (double)tcp_dmns_per_cluster(m);
	double rho = (double)(m->dma_engines * m->dma_bytes_per_cycle), pool = m->hbm_bytes_per_s / clk;
	/* the pool bounds a command's time when no request is charged below its
	 * granule's time: a row conflict replaces it by hbm_row_conflict_cycles
	 * over at most 32 channels */
	if ((double)m->hbm_row_conflict / 32.0 >= (double)m->hbm_granule / pool)
		rho = pool < rho ? pool : rho;
	rho = rho < dmns * (double)m->dmn_bytes_per_cycle ? rho : dmns * (double)m->dmn_bytes_per_cycle;
	/* a command's fixed cost on the main context; a DMA's setup (one per
	 * command; a machine whose setups overlap the previous transfer hides all
	 * but the first) */
	double cmd = (double)(m->issue_cycles + m->fill_drain), setup = (double)m->dma_setup;
	/* DMA commands: x in, the weights in (no command writes more DM than the
	 * chip has), y out */
	double dm = S * (double)m->dm_bytes_per_slice;
	double wcmds = W > dm ? ceil(W / dm) : 1;
	double n_in = 1 + wcmds;
	double s_in = m->setup_overlaps ? setup : n_in * setup, s_all = m->setup_overlaps ? setup : (n_in + 1) * setup;
	f->macs = (double)n * (double)p->moe_K * (double)p->moe_D * (double)p->moe_F * (double)p->nproj +
		  (double)p->router_macs * (double)n / (double)(p->moe_T > 0 ? p->moe_T : 1);
	f->vector_elements = (double)n * (double)p->moe_K * (double)p->moe_F + (double)n * (double)p->moe_E;
	double lane_rate = mac_rate_per_lane(p, m);
	f->mac_rate = S * (double)m->lanes_per_slice * lane_rate;
	/* weight-only quantized experts (stored in fewer bytes per element than
	 * the layer's dtype) under a contraction of the layer's dtype: only a
	 * vector pass turns a stored element into a contraction operand */
	double el = (double)p->nproj * (double)p->moe_D * (double)p->moe_F;
	if (lane_rate <= (double)m->macs_per_lane[TCP_MT_BF16] &&
	    (double)p->weight_bytes_per_expert < el * (double)moe_dtype_size((moe_dtype)p->dtype))
		f->vector_elements += h * el;
	f->weight_bytes = W;
	f->other_bytes = X;
	f->dma_commands = (int64_t)(n_in + 1);
	f->main_commands = 3;
	double mac_t = f->macs / f->mac_rate, vec_t = f->vector_elements / (S * (double)m->vec_int_rate);
	/* R1: the roofline at the contract's own rates */
	double r1 = dmax(mac_t, (W + X) / rho);
	/* R2: the chain. The last token's routing (x in DM, then two commands:
	 * the logits, the selection that compares them) or the last input byte in
	 * DM and one command consuming it; then the DMA writing y */
	double route = setup + xb / rho + 2 * cmd;
	double in = s_in + (W + X - yb > 0 ? W + X - yb : 0) / rho;
	double r2 = dmax(route, in + cmd) + setup;
	/* R3: the DMA context moves every byte, one command at a time */
	double r3 = s_all + (W + X) / rho;
	/* R4: the main context, after the first DMA and before the last: the
	 * MACs, the activations and the routing scores through the vector
	 * engine, three commands (x-side contraction, activation, down) */
	double r4 = 2 * setup + 3 * cmd + mac_t + vec_t;
	double lz = (double)(m->launch_cycles + m->end_cycles);
	double t[4] = {r1, r2, r3, r4}, best = 0;
	f->binding = 0;
	for (int k = 0; k < 4; k++)
		if (t[k] > best)
			best = t[k], f->binding = k;
	f->launch_end_seconds = lz / clk;
	f->roofline_seconds = r1 / clk;
	f->chain_seconds = r2 / clk;
	f->route_seconds = route / clk;
	f->dma_seconds = r3 / clk;
	f->main_seconds = r4 / clk;
	f->seconds = (lz + best) / clk;
}

moe_status moe_tcp_floor(moe_ctx *ctx, const moe_tcp_program *p, const moe_tcp_machine *machine, int64_t tokens,
	double experts_hit, moe_tcp_floor_terms *out)
{
	if (!p || !out) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "moe_tcp_floor: %s is NULL", p ? "out" : "the program");
		return MOE_ERR_INVALID;
	}
	memset(out, 0, sizeof *out);
	if (p->moe_E <= 0 || p->moe_K <= 0 || p->moe_T <= 0 || p->moe_D <= 0)
		return MOE_ERR_UNSUPPORTED; /* no experts op: no layer dimensions recorded */
	int64_t n = tokens > 0 ? tokens : p->moe_T;
	if (n > p->moe_T) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "moe_tcp_floor: %lld tokens, but the program holds at most %lld",
			(long long)n, (long long)p->moe_T);
		return MOE_ERR_INVALID;
	}
	double most = (double)(n * p->moe_K < p->moe_E ? n * p->moe_K : p->moe_E);
	if (!(experts_hit < 0) && !(experts_hit <= most)) { /* NaN too */
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(),
			"moe_tcp_floor: %g experts hit, but %lld tokens choosing %lld of %lld experts hit at most %.0f",
			experts_hit, (long long)n, (long long)p->moe_K, (long long)p->moe_E, most);
		return MOE_ERR_INVALID;
	}
	out->expected = experts_hit < 0;
	if (out->expected) /* uniform routing: each expert missed by every token with probability (1 - K/E)^n */
		experts_hit = (double)p->moe_E * (1.0 - pow(1.0 - (double)p->moe_K / (double)p->moe_E, (double)n));
	out->experts_hit = experts_hit;
	out->tokens = n;
	moe_tcp_machine *own = machine ? NULL : moe_tcp_machine_default(ctx);
	const moe_tcp_machine *m = machine ? machine : own;
	if (!m)
		return MOE_ERR_NOMEM;
	floor_terms(p, m, n, experts_hit, out);
	moe_tcp_machine_free(ctx, own);
	return MOE_OK;
}
