/* backend-tcp/compiler/quant_act.c: the activations' type of block-FP8
 * experts' contractions (moe_tcp_quant_act, docs/tcp-isa.md 7.10). */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/quant.h"
#include "moec/tcp.h"

/* A dequant the option chooses for: block FP8 in 128 x 128 blocks dividing
 * its rows and columns, the weights the lowering can contract fp8 x fp8;
 * every other format is dequantized in DM alike. */
static bool block_fp8(const moe_graph *g, moe_id n, qt_info *qi)
{
	return moe_node_op(g, n) == MOE_OP_DEQUANT && ir_dequant_info(g, N(g, n), qi) && qi->fmt == QT_FP8 &&
	       qi->bn == 128 && qi->bk == 128 && qi->N % 128 == 0 && qi->K % 128 == 0;
}

/* The error for a module without a block-FP8 dequant: the formats of its
 * quantized weights, at the first one's dequant (else at file). */
static void not_applicable(moe_ctx *ctx, const moe_module *m, const char *act, const char *file)
{
	char fmts[160] = "";
	bool w8a8 = false; /* int8 weights contracted with int8 activations (act="int8") */
	moe_loc at = moe_loc_file(ctx, file ? file : "<module>");
	for (size_t i = 0; i < moe_module_num_graphs(m); i++) {
		const moe_graph *g = moe_module_graph(m, i);
		for (moe_id n = 0; n < moe_graph_num_nodes(g); n++) {
			qt_info qi;
			if (moe_node_op(g, n) != MOE_OP_DEQUANT || !ir_dequant_info(g, N(g, n), &qi))
				continue;
			const char *a = moe_node_get_str(g, n, "act");
			w8a8 |= qi.fmt == QT_INT8 && a && !strcmp(a, "int8");
			char one[64];
			snprintf(one, sizeof one, "%s in [%lld, %lld] blocks", moe_node_get_str(g, n, "format"), (long long)qi.bn,
				(long long)qi.bk);
			if (!*fmts)
				at = moe_node_loc(g, n);
			if (!strstr(fmts, one) && strlen(fmts) + strlen(one) + 3 < sizeof fmts)
				snprintf(fmts + strlen(fmts), sizeof fmts - strlen(fmts), "%s%s", *fmts ? ", " : "", one);
		}
	}
	moe_diag(ctx, MOE_DIAG_ERROR, at,
		"--quant-act=%s applies to block-FP8 experts (fp8 in 128 x 128 blocks dividing the weight); %s%s%s", act,
		*fmts ? "this layer's quantized weights are " : "this layer has no quantized weights", fmts,
		!*fmts ? "" : w8a8 ? ": W8A8, whose int8 activations the layer declares (act=\"int8\"), runs without the option"
				   : ": they are dequantized in DM without the option");
}

moe_status moe_tcp_quant_act(moe_ctx *ctx, moe_module *m, const char *act, const char *file)
{
	if (!act || (strcmp(act, "bf16") && strcmp(act, "fp8"))) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, file ? file : "<module>"),
			"--quant-act takes bf16 or fp8, not '%s'", act ? act : "(null)");
		return MOE_ERR_INVALID;
	}
	bool any = false;
	for (size_t i = 0; i < moe_module_num_graphs(m); i++) {
		moe_graph *g = moe_module_graph(m, i);
		qt_info qi;
		for (moe_id n = 0; n < moe_graph_num_nodes(g); n++)
			if (block_fp8(g, n, &qi)) {
				any = true;
				if (!strcmp(act, "fp8"))
					moe_node_set_str(g, n, "act", "fp8");
			}
	}
	if (!any) {
		not_applicable(ctx, m, act, file);
		return MOE_ERR_INVALID;
	}
	return MOE_OK;
}
