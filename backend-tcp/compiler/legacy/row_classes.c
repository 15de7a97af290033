/* backend-tcp/row_classes.c: the upper row classes of a block pass
 * (docs/tcp-isa.md section 7.4, "Upper row classes").
 *
 * A pass over a block's rows is charged for every row of its static extent
 * (A6), so a block runs the plan of the smallest row class that holds its
 * rows: h = f, 4f, 16f, ... below B (lower_rows.c) and B itself. Between
 * the largest of those, hl, and B there were no classes, so a prefill's
 * expert of a few rows fewer than B paid for B rows: Qwen3-30B-A3B at T =
 * 4096 (B = 272, loads 212..296) computed 2300 padding rows, 7% of its MACs.
 * When a block's weights are held whole in DM (not streamed tile by tile,
 * whose blocks run fine row tiles instead), the rows between hl and B get
 * classes every `step` rows, each planned and run whole for its h rows: a
 * class costs the block only its guard (an `li` and a branch on the control
 * path, which runs ahead of the contraction engine). The lowering
 * (lower_contract.c, lower_rows.c, block_store.c) and block=auto's cost
 * model (plan.c) take the classes from here. */
#include "backend-tcp/isa/tcp_int.h"

/* The step between upper classes of a pass over B rows: 8 rows (a whole
 * row per slice group of the contraction plans), coarser for large B. */
int64_t tcp_upper_step(int64_t B)
{
	return B >= 512 ? 8 * (B / 256) : 8;
}

/* The upper classes of a pass over B rows whose first tile is f rows
 * (hl + step, hl + 2 step, ... below B, hl the largest f 4^k below B), at
 * most max of them; returns their count. */
int tcp_upper_classes(int64_t B, int64_t f, int64_t *out, int max)
{
	if (f < 1 || B <= f)
		return 0;
	int64_t hl = f;
	while (hl * 4 < B)
		hl *= 4;
	int64_t s = tcp_upper_step(B);
	int n = 0;
	for (int64_t h = hl + s; h < B && n < max; h += s)
		out[n++] = h;
	return n;
}
