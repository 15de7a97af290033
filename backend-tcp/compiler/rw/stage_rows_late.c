/* backend-tcp/compiler/rw/stage_rows_late.c: rewrite `stage-rows-late`
 * (rewrites.def, docs/tcp-compiler.md 5.2).
 *
 * `stage-rows` is priced where its row stands, before the rows that fold
 * the body's copies (`copy-views`, `fold-copies`) run. A loop whose body is
 * bound by the main context until those copies go gains nothing then from
 * relieving the DMA context of the block's row copy, and the row is
 * declined; once they are gone the DMA context may bind (W8A8 at T = 512:
 * a block's weight fetch, row copy and store against its contractions and
 * passes). This row prices the same rewrite again on the schedule as the
 * rows before it left it, and applies it (`stage-rows`' code, unchanged)
 * where the prediction gains. Switched off with `stage-rows` too. */
#include "backend-tcp/compiler/rewrites.h"

static bool staging_on(const tcp_sched *s, const ts_env *e)
{
	int k = ts_rewrite_find("stage-rows", 10);
	return k >= 0 && !(e->off >> k & 1) && !(s->ran >> k & 1);
}

bool ts_rw_stage_rows_late_applies(const tcp_sched *s, const ts_env *e)
{
	return staging_on(s, e) && ts_rw_stage_rows_applies(s, e);
}

moe_status ts_rw_stage_rows_late_apply(tcp_sched *s, const ts_env *e, uint16_t feature)
{
	return staging_on(s, e) ? ts_rw_stage_rows_apply(s, e, feature) : MOE_ERR_INVALID;
}
