/* backend-tcp/isa/cost.c: the machine's timing rules (isa/cost.h;
 * docs/tcp-model.md for each rule's reason). */
#include <math.h>
#include <string.h>

#include "backend-tcp/isa/cost.h"

static int64_t cdiv(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

void tcp_cm_init(tcp_cm *cm, const moe_tcp_machine *m)
{
	cm->m = m;
	cm->S = tcp_slices(m);
	cm->hbm_bpc = m->hbm_bytes_per_s / m->clock_hz;
	int64_t g = m->hbm_granule;
	cm->gshift = g > 0 && (g & (g - 1)) == 0 ? __builtin_ctzll((unsigned long long)g) + 1 : 0;
}

int64_t tcp_cost_issue(const tcp_cm *cm, int ctx)
{
	return ctx == TCP_CTX_DMA ? 0 : cm->m->issue_cycles;
}

int64_t tcp_cost_scalar(const tcp_cm *cm, int op)
{
	return op == TCP_OP_BR ? cm->m->branch_cycles : cm->m->scalar_cycles;
}

/* ---- DMA ---- */
void tcp_dma_load_init(tcp_dma_load *c)
{
	memset(c, 0, sizeof *c);
	c->last[0] = c->last[1] = -1;
	c->clo[0] = c->clo[1] = INT64_MAX;
	c->chi[0] = c->chi[1] = -1;
}

/* The HBM pattern rule (docs/tcp-model.md section 1): a request's channel
 * is taken as its address bits 8..12 (bit 8 the stack); a run shorter than
 * two granules that lands on the channel of the side's previous run but in
 * another row (address bits 21 and up) switches rows in that bank. */
/* x / g for x >= 0, a shift where g is a power of two (cm->gshift) */
static inline int64_t gdiv(const tcp_cm *cm, int64_t x, int64_t g)
{
	return cm->gshift && x >= 0 ? x >> (cm->gshift - 1) : x / g;
}

static void hbm_pattern(const tcp_cm *cm, tcp_dma_load *c, int64_t a, int64_t len, int64_t g, bool write)
{
	int64_t g0 = gdiv(cm, a, g), g1 = gdiv(cm, a + len - 1, g);
	if (g1 - g0 >= 31)
		c->chan = 0xffffffffu;
	else
		for (int64_t k = g0; k <= g1; k++)
			c->chan |= 1u << (k & 31);
	c->hreq += g1 - g0 + 1;
	int64_t pv = c->last[write];
	if (g1 == g0 && pv >= 0 && (((a ^ pv) >> 8) & 31) == 0 && (a >> 21) != (pv >> 21))
		c->conflicts++;
	c->last[write] = a;
}

/* HBM reads are charged whole requests of the access granule (a run
 * crossing a granule boundary costs one more request); HBM writes are
 * charged whole granules, a partial granule at the unaligned write factor
 * (its read-modify-write). A DM write whose address or size is not a
 * multiple of dm_alignment_bytes is a read-modify-write
 * (memory.dm_misaligned_write_factor). */
void tcp_dma_run(const tcp_cm *cm, tcp_dma_load *c, bool hbm, int64_t a, int64_t len, bool write)
{
	const moe_tcp_machine *m = cm->m;
	if (hbm) {
		int64_t g = m->hbm_granule, end = a + len, blocks = gdiv(cm, end + g - 1, g) - gdiv(cm, a, g);
		hbm_pattern(cm, c, a, len, g, write);
		if (!write) {
			c->hbm += (double)(blocks * g);
		} else {
			int64_t partial = (a - gdiv(cm, a, g) * g != 0) + (end - gdiv(cm, end, g) * g != 0);
			if (partial > blocks)
				partial = blocks;
			c->hbm += (double)((blocks - partial) * g) + (double)(partial * g) * m->hbm_unaligned_write;
		}
	} else if (write && (a % m->dm_align != 0 || len % m->dm_align != 0)) {
		c->rmw += len;
	}
}

/* HBM reads of runs longer than a granule never switch rows (the rule asks
 * for a run within one granule), so a run's charge is its granule count and
 * channel bits, both functions of its address modulo 32 granules: over runs
 * a + i * step they repeat with the period of step modulo that, and n runs
 * are charged as whole periods plus the first n % period runs. The HBM
 * bytes are then added at once, which equals adding them run by run where
 * every partial sum is an integer a double holds exactly (below 2^52). */
void tcp_dma_runs(const tcp_cm *cm, tcp_dma_load *c, bool hbm, int64_t a, int64_t len, int64_t step, int64_t n,
	bool write)
{
	int64_t g = cm->m->hbm_granule, M = 32 * g, left = INT64_C(1) << 52, last;
	bool fast = hbm && !write && cm->gshift && len > g && a >= 0 && step >= 0 && n > 1 && c->hbm >= 0 &&
		    c->hbm < (double)left && c->hbm == (double)(int64_t)c->hbm &&
		    !__builtin_mul_overflow(n - 1, step, &last) && !__builtin_add_overflow(last, a, &last) &&
		    last <= left - len;
	if (!fast) {
		for (int64_t i = 0; i < n; i++)
			tcp_dma_run(cm, c, hbm, a + i * step, len, write);
		return;
	}
	int64_t r = step % M, P = M;
	while (r) { /* P = M / gcd(step mod M, M) */
		int64_t x = P % r;
		P = r, r = x;
	}
	P = M / P;
	P = P < n ? P : n;
	int64_t per = 0, head = 0, rem = n % P;
	uint32_t chan = 0;
	for (int64_t i = 0; i < P; i++) {
		int64_t x = a + i * step, g0 = gdiv(cm, x, g), g1 = gdiv(cm, x + len - 1, g);
		if (g1 - g0 >= 31)
			chan = 0xffffffffu;
		else
			for (int64_t k = g0; k <= g1; k++)
				chan |= 1u << (k & 31);
		per += g1 - g0 + 1;
		head += i < rem ? g1 - g0 + 1 : 0;
	}
	int64_t total = n / P * per + head;
	if ((double)total * (double)g >= (double)left - c->hbm) {
		for (int64_t i = 0; i < n; i++)
			tcp_dma_run(cm, c, hbm, a + i * step, len, write);
		return;
	}
	c->chan |= chan;
	c->hreq += total;
	c->hbm += (double)(total * g);
	c->last[0] = last;
}

int64_t tcp_dma_requests(const tcp_cm *cm, int64_t rb)
{
	const moe_tcp_machine *m = cm->m;
	int64_t full = rb / m->dma_max_packet, rem = rb % m->dma_max_packet;
	return full * cdiv(m->dma_max_packet, m->dma_request) + cdiv(rem, m->dma_request);
}

void tcp_dma_engines(const tcp_cm *cm, tcp_dma_load *c, bool hbm2hbm)
{
	c->eng = hbm2hbm ? cm->m->hbm2hbm_engines : c->pairs;
	c->eng = c->eng < 1 ? 1 : c->eng > cm->m->dma_engines ? cm->m->dma_engines : c->eng;
}

/* Gather/scatter pay the row overhead per engine for every row of the index
 * list, the zero rows past a valid count included (docs/tcp-model.md, DMA). */
int64_t tcp_cost_dma(const tcp_cm *cm, const tcp_dma_load *c, bool dm2dm, int64_t rows, bool *overflow)
{
	const moe_tcp_machine *m = cm->m;
	double by = (double)c->bytes + (double)c->rmw * (m->dm_misaligned_write - 1), eng = (double)c->eng;
	double t = by / (eng * (double)m->dma_bytes_per_cycle);
	if (c->dmns > 0) {
		/* DM -> DM within a cluster serializes its reads and writes */
		bool within = dm2dm && c->clo[0] <= c->chi[1] && c->clo[1] <= c->chi[0];
		double dn = by / ((double)c->dmns * (double)m->dmn_bytes_per_cycle) * (within && m->dm_to_dm_serialized ? 2 : 1);
		t = t > dn ? t : dn;
	}
	bool stack = (c->chan & 0x55555555u) && (c->chan & 0xaaaaaaaau);
	double h = c->hbm / cm->hbm_bpc * (c->hreq > 1 && !stack ? m->hbm_no_stack_bit : 1);
	if (c->conflicts > 0) {
		int ch = __builtin_popcount(c->chan);
		h = h * (1 - (double)c->conflicts / (double)c->hreq) +
		    (double)c->conflicts * (double)m->hbm_row_conflict / (double)(ch ? ch : 1);
	}
	double rq = (double)c->requests / eng;
	t = t > h ? t : h;
	t = t > rq ? t : rq;
	if (!(t < 1e15)) { /* also NaN: the float->int conversion below must be defined */
		*overflow = true;
		t = 1e15;
	}
	return m->dma_setup + (int64_t)ceil(t) + (rows > 1 ? cdiv(rows, c->eng) * m->row_overhead : 0);
}

/* ---- the switch ---- */
int64_t tcp_cost_route(const tcp_cm *cm, int64_t bytes, int64_t used, int64_t *ring)
{
	if (bytes <= 0) {
		*ring = 0;
		return 0;
	}
	*ring = used < cm->m->max_ring ? used : cm->m->max_ring;
	return cdiv(bytes, cm->m->switch_bytes_per_cycle);
}

/* ---- Tensor Unit passes ---- */
/* The ALUs' time (the rate's elements per cycle, the chain's latency), the
 * commit, the switch and the fetch overlap; at most
 * fetch.max_interleaved_streams streams in one pass: each further group of
 * streams is one more pass through DM (its issue and fill/drain). */
tcp_cost tcp_cost_vec(const tcp_cm *cm, const tcp_vec_load *l)
{
	const moe_tcp_machine *m = cm->m;
	int64_t rate = l->fl ? m->vec_float_rate : m->vec_int_rate;
	int64_t comp = cdiv(l->pe, rate) + l->nstep * m->alu_latency;
	int64_t extra = l->streams > m->max_streams ? cdiv(l->streams, m->max_streams) - 1 : 0, ring;
	int64_t sw = tcp_cost_route(cm, l->route_bytes, l->route_used, &ring);
	int64_t t = comp > l->commit ? comp : l->commit, tail = m->fill_drain + (l->xslice ? m->inter_slice_reduce : 0);
	t = (t > sw ? t : sw) + ring;
	tail += extra * (m->issue_cycles + m->fill_drain);
	return (tcp_cost){(t > l->fetch ? t : l->fetch) + tail, comp};
}

/* The MACs, the streamed operand and the commit overlap (and the switch,
 * whose ring is paid once); then the adder tree and the fill/drain. */
tcp_cost tcp_cost_contract(const tcp_cm *cm, const tcp_mm_load *l)
{
	const moe_tcp_machine *m = cm->m;
	int64_t macs = l->rows * l->tile * l->I * (l->x3 ? 3 : 1);
	int64_t mac = l->tiles * cdiv(macs, m->lanes_per_slice * m->macs_per_lane[l->mt]);
	int64_t stream = l->tiles * cdiv(l->rows * l->I * l->a_bytes, m->stream_bytes_per_cycle);
	int64_t commit = l->tiles * cdiv(l->rows * l->tile * l->out_bytes, m->fetch_bytes), ring;
	if (l->rowdiv) { /* the scale's division, output by output, at the vector engine's float rate */
		int64_t div = l->tiles * cdiv(l->rows * l->tile, m->vec_float_rate);
		commit = commit > div ? commit : div;
	}
	int64_t sw = l->tiles * tcp_cost_route(cm, l->route_bytes, l->route_used, &ring);
	int64_t t = mac > stream ? mac : stream;
	t = t > commit ? t : commit;
	t = (t > sw ? t : sw) + ring + m->tree_latency[l->mt] + m->fill_drain;
	return (tcp_cost){t, mac};
}

int64_t tcp_cost_sub(const tcp_cm *cm, int64_t fp, int64_t own)
{
	return tcp_sub_load_cycles(cm->m, fp, own) + cm->m->fill_drain;
}

int64_t tcp_loads_slots(const moe_tcp_loads *l, int64_t B, int64_t *out)
{
	int64_t k = 0;
	for (int64_t b = 0; b < l->nblocks; b++)
		for (int64_t r = 0; r < l->block_rows[b] && r < B; r++, k++)
			if (out)
				out[k] = b * B + r;
	return k;
}
