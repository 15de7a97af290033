/* The TCP-specific passes of the `tcp` pipeline (its block loop kept) and
 * the schedule compiler that reads what they record. tcp-plan-fusion
 * (registered by moe_tcp_register_passes) marks the fusion groups: with it
 * and without it (skipped when not registered, moe_tcp_compile running it)
 * the program is the same, and moe_tcp_compile_sched follows the marks it
 * is given. tcp-split-weights marks packed weights (tcp_pack); the compiler
 * splits the program at the marks and decides nothing itself: a mark taken
 * away keeps that value on the device, and a graph lowered without the pass
 * (the tcp pipeline less its last two passes) is planned by the pass's own
 * rule, so it compiles to the same program as the tcp pipeline's. The
 * pairings (tcp-pair-gate-up, tcp-pair-down) and tcp-pack-bias record their decisions on the
 * graph; moe_tcp_compile runs the ones a graph lacks, for its machine, and
 * never again the ones it has; the passes decide for the machine
 * moe_tcp_set_pass_machine gave. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moec/frontend.h"
#include "moec/ir.h"
#include "moec/passes.h"
#include "moec/tcp.h"

extern const char tcp_default_machine_json[]; /* backend-tcp/isa/machine.c */

/* gpt-oss's expert weights at toy size (tests/lit/passes/Inputs/packed.moe) */
static const char packed_moe[] =
	"layer packed {\n"
	"  dim T = 2, D = 4, F = 4, E = 4, K = 2, B = 2\n"
	"  dtype f32\n"
	"  input  x : [T, D]\n"
	"  weight router_w : [E, D]     = \"router.weight\"\n"
	"  weight gate_up  : [E, D, 2*F] = \"experts.gate_up_proj\"\n"
	"  weight gate_up_b : [E, 2*F]  = \"experts.gate_up_proj_bias\"\n"
	"  weight down_t   : [E, F, D]  = \"experts.down_proj\"\n"
	"  weight down_b   : [E, D]     = \"experts.down_proj_bias\"\n"
	"  logits = einsum(\"td,ed->te\", x, router_w)\n"
	"  idx    = topk(logits, K)\n"
	"  w      = softmax(take_along(logits, idx, axis=1), axis=1)\n"
	"  gu     = einsum(\"edf->efd\", gate_up)\n"
	"  gate   = slice(gu, axis=1, start=0, step=2)\n"
	"  up     = slice(gu, axis=1, start=1, step=2)\n"
	"  gate_b = slice(gate_up_b, axis=1, start=0, step=2)\n"
	"  up_b   = slice(gate_up_b, axis=1, start=1, step=2)\n"
	"  down   = einsum(\"efd->edf\", down_t)\n"
	"  y = experts(x, idx, w, gate=gate, up=up, down=down, gate_bias=gate_b, up_bias=up_b,\n"
	"              down_bias=down_b, act=\"gpt_oss\", block=B)\n"
	"  output y\n"
	"}\n";

static moe_module *lowered(moe_ctx *ctx, const char *pipeline)
{
	moe_module *m = moe_parse_moe(ctx, "packed.moe", packed_moe, strlen(packed_moe), NULL);
	assert_non_null(m);
	assert_int_equal(moe_run_pipeline_text(ctx, pipeline, m, NULL), MOE_OK);
	return m;
}

/* The TCP assembly of graph 0 of m (malloc'd). */
static char *assembly(moe_ctx *ctx, moe_module *m)
{
	moe_tcp_program *p = moe_tcp_compile(ctx, moe_module_graph(m, 0), NULL);
	if (!p)
		moe_diag_print(ctx, stderr);
	assert_non_null(p);
	char *s;
	size_t n;
	assert_int_equal(moe_tcp_to_asm(ctx, p, &s, &n), MOE_OK);
	moe_tcp_program_free(p);
	return s;
}

static moe_id node_named(const moe_graph *g, const char *name)
{
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++)
		if (moe_node_name(g, i) && !strcmp(moe_node_name(g, i), name))
			return i;
	fail_msg("no node '%s'", name);
	return MOE_NONE;
}

static void test_marks_and_plan_agree(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	char unmarked[1024];
	snprintf(unmarked, sizeof unmarked, "%s", moe_pipeline_named("tcp"));
	char *last = strstr(unmarked, ",tcp-split-weights");
	assert_non_null(last);
	*last = 0;
	moe_module *t = lowered(ctx, "tcp"), *h = lowered(ctx, unmarked);
	const moe_graph *g = moe_module_graph(t, 0);
	static const char *const packed[] = {"gate", "up", "gate_b", "up_b", "down"};
	for (int i = 0; i < 5; i++) {
		int64_t k = -1;
		assert_true(moe_node_get_int(g, node_named(g, packed[i]), "tcp_pack", &k));
		assert_int_equal(k, i);
	}
	int64_t k;
	assert_false(moe_node_get_int(g, node_named(g, "gu"), "tcp_pack", &k));
	assert_false(moe_node_get_int(moe_module_graph(h, 0), node_named(moe_module_graph(h, 0), "down"), "tcp_pack", &k));
	/* the compile's own tcp-pair-down and tcp-pack-bias pack the projections
	 * and the biases (their records are missing) and plan the packed values
	 * again by the rule */
	char *a = assembly(ctx, t), *b = assembly(ctx, h);
	assert_non_null(strstr(a, "\"packed.0.up+gate+down\""));
	assert_non_null(strstr(a, "\"packed.1.up_b+gate_b+down_b\""));
	assert_null(strstr(a, "packed.4.down"));
	assert_string_equal(a, b);
	free(a);
	free(b);
	moe_module_free(t);
	moe_module_free(h);
	moe_ctx_free(ctx);
}

/* The compiler follows the marks, deciding nothing itself: on the graph
 * the target's passes planned with the biases left apart (tcp-pack-bias's
 * record set to 0 before it runs: a recorded decision is not made again),
 * with the mark on up's bias slice taken away, up_b stays a device value
 * (read through a strided view of gate_up_b), and the program binds no
 * packed up_b. */
static void test_backend_reads_marks(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	assert_int_equal(moe_tcp_register_passes(ctx), MOE_OK);
	char head[1024];
	snprintf(head, sizeof head, "%s", moe_pipeline_named("tcp"));
	char *cut = strstr(head, ",tcp-pack-bias,");
	assert_non_null(cut);
	const char *tail = moe_pipeline_named("tcp") + (cut - head) + 1;
	*cut = 0;
	moe_module *t = lowered(ctx, head);
	moe_graph *g = moe_module_graph(t, 0);
	moe_graph_set_attr_int(g, "tcp_pack_bias", 0);
	assert_int_equal(moe_run_pipeline_text(ctx, tail, t, NULL), MOE_OK);
	char *a = assembly(ctx, t);
	assert_non_null(strstr(a, "\"packed.1.up_b\""));
	assert_null(strstr(a, "up_b+gate_b"));
	moe_node_set_int(g, node_named(g, "up_b"), "tcp_pack", -1);
	char *b = assembly(ctx, t);
	assert_null(strstr(b, "packed.1.up_b"));
	assert_non_null(strstr(b, "\"packed.0.gate_b\""));
	assert_non_null(strstr(b, ".up+gate+down\""));
	free(a);
	free(b);
	moe_module_free(t);
	moe_ctx_free(ctx);
}

static int64_t count_marks(const moe_graph *g, const char *key, bool clear)
{
	int64_t n = 0, v;
	for (moe_id i = 0; i < moe_graph_num_nodes(g); i++)
		if (moe_node_get_int(g, i, key, &v) && v >= 0) {
			n++;
			if (clear)
				moe_node_set_int((moe_graph *)g, i, key, -1);
		}
	return n;
}

/* The TCP assembly of graph 0 of m compiled by moe_tcp_compile_sched, which
 * follows the marks it is given (NULL with a diagnostic where one is bad). */
static char *sched_assembly(moe_ctx *ctx, moe_module *m)
{
	moe_tcp_program *p = moe_tcp_compile_sched(ctx, moe_module_graph(m, 0), NULL, NULL);
	if (!p)
		return NULL;
	char *s;
	size_t n;
	assert_int_equal(moe_tcp_to_asm(ctx, p, &s, &n), MOE_OK);
	moe_tcp_program_free(p);
	return s;
}

/* The fusion marks and the rule give one program; the compiler follows the marks. */
static void test_fusion_marks(void **st)
{
	(void)st;
	moe_ctx *rule = moe_ctx_new(NULL, NULL), *ctx = moe_ctx_new(NULL, NULL);
	assert_int_equal(moe_tcp_register_passes(ctx), MOE_OK);
	assert_int_equal(moe_tcp_register_passes(ctx), MOE_OK); /* twice: harmless */
	assert_non_null(moe_pass_find(ctx, "tcp-plan-fusion"));
	assert_null(moe_pass_find(rule, "tcp-plan-fusion"));
	moe_module *t = lowered(ctx, "tcp"), *h = lowered(rule, "tcp");
	moe_graph *g = moe_module_graph(t, 0);
	assert_int_equal(count_marks(moe_module_graph(h, 0), "tcp_fuse", false), 0);
	/* the top-k rank compare and the routing's chains outside the loop */
	assert_true(count_marks(g, "tcp_fuse", false) >= 4);
	char *a = assembly(ctx, t), *b = assembly(rule, h), *s = sched_assembly(ctx, t);
	assert_string_equal(a, b);
	assert_string_equal(a, s);
	/* no group marked: every node its own vector pass, a longer program */
	count_marks(g, "tcp_fuse", true);
	char *c = sched_assembly(ctx, t);
	assert_non_null(c);
	assert_true(strlen(c) > strlen(a));
	/* moe_tcp_compile plans them again */
	char *d = assembly(ctx, t);
	assert_string_equal(a, d);
	free(a);
	free(b);
	free(c);
	free(d);
	free(s);
	moe_module_free(t);
	moe_module_free(h);
	moe_ctx_free(ctx);
	moe_ctx_free(rule);
}

/* bf16 experts whose gate and up pair (Qwen3-like, few and narrow) */
static const char paired_moe[] =
	"layer paired {\n"
	"  dim T = 4, D = 2048, F = 64, E = 4, K = 2, B = 4\n"
	"  dtype bf16\n"
	"  input  x : [T, D]\n"
	"  weight router : [E, D]   = \"router\"\n"
	"  weight gate   : [E, F, D] = \"gate\"\n"
	"  weight up     : [E, F, D] = \"up\"\n"
	"  weight down   : [E, D, F] = \"down\"\n"
	"  logits = einsum(\"td,ed->te\", x, router)\n"
	"  idx    = topk(logits, K)\n"
	"  w      = softmax(take_along(logits, idx, axis=1), axis=1)\n"
	"  y = experts(x, idx, w, gate=gate, up=up, down=down, act=\"swiglu\", block=B)\n"
	"  output y\n"
	"}\n";

static moe_module *paired(moe_ctx *ctx)
{
	moe_module *m = moe_parse_moe(ctx, "paired.moe", paired_moe, strlen(paired_moe), NULL);
	assert_non_null(m);
	assert_int_equal(moe_run_pipeline_text(ctx, "tcp", m, NULL), MOE_OK);
	return m;
}

static int64_t graph_int(const moe_graph *g, const char *key)
{
	int64_t v = -99;
	return moe_graph_get_attr_int(g, key, &v) ? v : -99;
}

/* The tcp pipeline's passes and moe_tcp_compile's own run of them give one
 * program; the records of a graph that went through them are read, not
 * decided again (a compile changes no record of the caller's graph). */
static void test_structural_passes(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL), *bare = moe_ctx_new(NULL, NULL);
	assert_int_equal(moe_tcp_register_passes(ctx), MOE_OK);
	moe_module *t = paired(ctx), *h = paired(bare);
	const moe_graph *g = moe_module_graph(t, 0), *hg = moe_module_graph(h, 0);
	assert_int_equal(graph_int(g, "tcp_pair_gate_up"), 1);
	assert_int_equal(graph_int(g, "tcp_pair_down"), 0); /* on the loop: a block is not bound by its fetch */
	assert_true(graph_int(g, "tcp_machine") > 0);
	moe_id pair = node_named(g, "up+gate");
	int64_t k = -1;
	assert_true(moe_node_get_int(g, pair, "tcp_pack", &k) && k == 0);
	/* without the registered target the pipeline skips them and the compile runs them */
	assert_int_equal(graph_int(hg, "tcp_pair_gate_up"), -99);
	assert_int_equal(graph_int(hg, "tcp_machine"), -99);
	uint32_t nn = moe_graph_num_nodes(g);
	char *a = assembly(ctx, t), *b = assembly(bare, h);
	assert_non_null(strstr(a, "\"packed.0.up+gate\""));
	assert_string_equal(a, b);
	assert_int_equal(graph_int(hg, "tcp_pair_gate_up"), -99);
	assert_int_equal(moe_graph_num_nodes(g), nn);
	/* the pipeline run again decides nothing again */
	assert_int_equal(moe_run_pipeline_text(ctx, "tcp-pair-gate-up,tcp-pair-down", t, NULL), MOE_OK);
	assert_int_equal(moe_graph_num_nodes(moe_module_graph(t, 0)), nn);
	char *c = assembly(ctx, t);
	assert_string_equal(a, c);
	free(a);
	free(b);
	free(c);
	moe_module_free(t);
	moe_module_free(h);
	moe_ctx_free(ctx);
	moe_ctx_free(bare);
}

/* The passes decide for the machine moe_tcp_set_pass_machine gave (their
 * record names it); a compile for another machine keeps the rewrites and
 * leaves the caller's records as they are. (Which pairing a loop takes on
 * which machine is tests/lit/tcp/sched/pair_loop.test's.) */
static void test_pass_machine(void **st)
{
	(void)st;
	moe_ctx *ctx = moe_ctx_new(NULL, NULL);
	moe_tcp_machine *def = moe_tcp_machine_default(ctx);
	const char *js = tcp_default_machine_json;
	char *small = malloc(strlen(js) + 1);
	strcpy(small, js);
	char *at = strstr(small, "\"dm_bytes_per_slice\": 524288");
	assert_non_null(at);
	memcpy(at, "\"dm_bytes_per_slice\":   4096", strlen("\"dm_bytes_per_slice\":   4096"));
	moe_tcp_machine *sm = moe_tcp_machine_parse(ctx, "small.json", small, strlen(small));
	assert_non_null(sm);
	free(small);
	assert_int_equal(moe_tcp_set_pass_machine(ctx, sm), MOE_OK);
	moe_module *t = paired(ctx);
	const moe_graph *g = moe_module_graph(t, 0);
	assert_int_equal(graph_int(g, "tcp_pair_gate_up"), 1);
	assert_int_equal(graph_int(g, "tcp_pair_down"), 0);
	int64_t fp = graph_int(g, "tcp_machine"), plan = graph_int(g, "tcp_fusion_plan");
	uint32_t nn = moe_graph_num_nodes(g);
	moe_tcp_program *p = moe_tcp_compile(ctx, g, sm);
	assert_non_null(p);
	moe_tcp_program_free(p);
	p = moe_tcp_compile(ctx, g, def);
	assert_non_null(p);
	moe_tcp_program_free(p);
	assert_int_equal(graph_int(g, "tcp_machine"), fp);
	assert_int_equal(graph_int(g, "tcp_fusion_plan"), plan);
	assert_int_equal(moe_graph_num_nodes(g), nn);
	/* back to the built-in machine: its own record */
	assert_int_equal(moe_tcp_set_pass_machine(ctx, NULL), MOE_OK);
	moe_module *d = paired(ctx);
	assert_int_equal(graph_int(moe_module_graph(d, 0), "tcp_pair_gate_up"), 1);
	assert_true(graph_int(moe_module_graph(d, 0), "tcp_machine") != fp);
	moe_module_free(d);
	moe_module_free(t);
	moe_tcp_machine_free(ctx, sm);
	moe_tcp_machine_free(ctx, def);
	moe_ctx_free(ctx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fusion_marks),
		cmocka_unit_test(test_marks_and_plan_agree),
		cmocka_unit_test(test_backend_reads_marks),
		cmocka_unit_test(test_structural_passes),
		cmocka_unit_test(test_pass_machine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
