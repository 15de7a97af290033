/* backend-tcp/compiler/rw/merge_streams.c: rewrite `merge-streams`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * The vector recipes give each operand of a chain its own stream, so a pass
 * that reads one value twice (SwiGLU's sigmoid(g) x g, the NaN fix's
 * x != x ? NaN : x, a select whose value is its condition's operand)
 * fetches the same elements two or three times, and a pass's time grows
 * with its streams. The rewrite drops a stream s1 or s2 whose view is an
 * earlier stream's (buffer, base, register and scale, a stride per
 * dimension): the steps that read it read the earlier one. Every stream
 * yields the word of its element at each iteration, so the steps see the
 * same words and the values are unchanged. A 4-bit s0 (flags e2m1, i4) is
 * decoded, not read as a word, and is no stream's match. */
#include "backend-tcp/compiler/rewrites.h"

/* the earlier stream that stream w of op o repeats, or -1 */
static int repeats(const tcp_insn *in, int w)
{
	if (in->op != TCP_OP_TU_VEC || in->v[w].t < 0)
		return -1;
	for (int u = TCP_V_S0; u < w; u++) {
		if (u == TCP_V_S0 && (in->flags & (TCP_F_E2M1 | TCP_F_I4)))
			continue;
		if (in->v[u].t >= 0 && ts_same_view(&in->v[u], &in->v[w], in->ndim))
			return u;
	}
	return -1;
}

bool ts_rw_merge_streams_applies(const tcp_sched *s, const ts_env *e)
{
	(void)e;
	for (ts_id o = 0; o < s->nop; o++)
		for (int w = TCP_V_S1; w < TCP_NVIEW; w++)
			if (repeats(&s->op[o].in, w) >= 0)
				return true;
	return false;
}

moe_status ts_rw_merge_streams_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	(void)e;
	bool any = false;
	for (ts_id o = 0; o < s->nop; o++) {
		tcp_insn *in = &s->op[o].in;
		for (int w = TCP_V_S2; w >= TCP_V_S1; w--) {
			int u = repeats(in, w);
			if (u < 0)
				continue;
			/* stream w is source TCP_SRC_S0 + (w - TCP_V_S0) of the steps */
			uint8_t from = (uint8_t)(TCP_SRC_S0 + (w - TCP_V_S0)), to = (uint8_t)(TCP_SRC_S0 + (u - TCP_V_S0));
			for (int k = 0; k < in->nstep; k++) {
				if (in->step[k].x == from)
					in->step[k].x = to;
				if (in->step[k].y == from)
					in->step[k].y = to;
			}
			in->v[w] = tcp_view_none();
			s->op[o].feature = feature;
			s->op[o].cost = 0;
			any = true;
		}
		if (in->v[TCP_V_S1].t < 0 && in->v[TCP_V_S2].t >= 0) { /* s2 moves up to s1 */
			in->v[TCP_V_S1] = in->v[TCP_V_S2];
			in->v[TCP_V_S2] = tcp_view_none();
			for (int k = 0; k < in->nstep; k++) {
				if (in->step[k].x == TCP_SRC_S2)
					in->step[k].x = TCP_SRC_S1;
				if (in->step[k].y == TCP_SRC_S2)
					in->step[k].y = TCP_SRC_S1;
			}
		}
	}
	return any ? MOE_OK : MOE_ERR_INVALID;
}
