/* ir/graph_keys.c: graph attributes that name nodes, kept valid across rewrites. */
#include <string.h>

#include "ir/graph_keys.h"

const char *const ir_node_keys[IR_NNODE_KEYS] = {IR_GK_BLOCK_ROWS, IR_GK_NBLOCKS, IR_GK_BLOCK_EXPERT};

moe_id ir_graph_node_attr(const moe_graph *g, const char *key)
{
	int64_t v = ir_graph_attr_int(g, key, -1);
	return v >= 0 && v < (int64_t)g->nnodes ? (moe_id)v : MOE_NONE;
}

void ir_graph_remap_node_keys(moe_graph *dst, const moe_graph *src, const moe_id *map)
{
	for (int k = 0; k < IR_NNODE_KEYS; k++) {
		const char *key = ir_node_keys[k];
		if (ir_attr_find(&dst->meta, key) || !ir_attr_find(&src->meta, key))
			continue;
		moe_id old = ir_graph_node_attr(src, key);
		moe_id now = old == MOE_NONE ? MOE_NONE : map[old];
		ir_graph_set_attr_int(dst, key, now == MOE_NONE ? -1 : (int64_t)now);
	}
}

void ir_graph_drop_node_keys(moe_graph *g)
{
	ir_node *m = &g->meta;
	for (int k = 0; k < IR_NNODE_KEYS; k++)
		for (uint32_t i = 0; i < m->nattrs; i++)
			if (!strcmp(m->attrs[i].key, ir_node_keys[k])) {
				memmove(&m->attrs[i], &m->attrs[i + 1], (m->nattrs - i - 1) * sizeof *m->attrs);
				m->nattrs--;
				break;
			}
}
