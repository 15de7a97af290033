/* Shared by the host backend's unit tests (test_host_par.c, test_topk_host.c,
 * test_elem_host.c): parse a .moe text and run the host pipeline on it, so the
 * test gets the graph the host engines compile. Include after cmocka.h and the
 * moec headers. */
#ifndef MOEC_TESTS_HOST_LAYER_H
#define MOEC_TESTS_HOST_LAYER_H

static inline moe_graph *host_layer(moe_ctx *c, const char *name, const char *text, size_t len,
	const moe_settings *ss, moe_module **mod)
{
	moe_module *m = moe_parse_moe(c, name, text, len, ss);
	if (!m)
		moe_diag_print(c, stderr);
	assert_non_null(m);
	moe_run_opts ro = {.verify = 1};
	if (moe_run_pipeline_text(c, "host", m, &ro) != MOE_OK)
		moe_diag_print(c, stderr);
	*mod = m;
	return moe_module_graph(m, 0);
}

#endif
