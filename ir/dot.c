/* ir/dot.c: Graphviz view of a module. One cluster per layer; a node's label
 * is its id, op, name and result type; edges run from operand to user (the
 * valid mask dashed, absent `experts` slots omitted) and into one `output`
 * node per layer. */
#include "ir/serial.h"

/* the inside of a double-quoted dot string */
static void dot_str(FILE *f, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", f);
		else if (*p < 0x20 || *p == 0x7f)
			fputc(' ', f);
		else
			fputc(*p, f);
	}
}

moe_status moe_module_print_dot(const moe_module *m, FILE *out)
{
	if (!m || !out)
		return MOE_ERR_INVALID;
	fputs("digraph moeir {\n  node [shape=box, fontname=\"monospace\"];\n", out);
	for (uint32_t li = 0; li < m->ngraphs; li++) {
		const moe_graph *g = m->graphs[li];
		fprintf(out, "  subgraph cluster_%u {\n    label=\"", li);
		dot_str(out, g->name);
		fprintf(out, " (%s)\";\n", moe_dtype_name(g->dtype));
		for (moe_id i = 0; i < g->nnodes; i++) {
			const ir_node *n = N(g, i);
			char ty[160];
			ir_fmt_type((moe_dtype)n->dtype, n->rank, n->shape, ty, sizeof ty);
			fprintf(out, "    l%u_n%u [label=\"%%%u = %s", li, i, i, moe_op_name((moe_op)n->op));
			if (n->name) {
				fputs(" \\\"", out);
				dot_str(out, n->name);
				fputs("\\\"", out);
			}
			fprintf(out, "\\n%s\"%s];\n", ty, (ir_ops[n->op].flags & OPF_LEAF) ? ", style=rounded" : "");
		}
		for (moe_id i = 0; i < g->nnodes; i++) {
			const ir_node *n = N(g, i);
			for (uint32_t a = 0; a < n->nargs; a++)
				if (n->args[a] != MOE_NONE)
					fprintf(out, "    l%u_n%u -> l%u_n%u;\n", li, n->args[a], li, i);
			if (n->valid != MOE_NONE)
				fprintf(out, "    l%u_n%u -> l%u_n%u [style=dashed, label=\"valid\"];\n", li, n->valid, li, i);
		}
		if (g->nout) {
			fprintf(out, "    l%u_out [label=\"output\", shape=ellipse];\n", li);
			for (uint32_t o = 0; o < g->nout; o++)
				fprintf(out, "    l%u_n%u -> l%u_out;\n", li, g->outputs[o], li);
		}
		fputs("  }\n", out);
	}
	fputs("}\n", out);
	return ferror(out) ? MOE_ERR_IO : MOE_OK;
}
