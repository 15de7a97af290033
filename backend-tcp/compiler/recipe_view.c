/* backend-tcp/compiler/recipe_view.c: sched-build's recipe for reshape,
 * slice and broadcast: views of the operand's buffer (no data moves); a
 * reshape of a strided view that is not only a change of size-1 dimensions
 * copies the operand into a contiguous buffer first. */
#include <string.h>

#include "backend-tcp/compiler/sched_build_int.h"

static void contiguous(const int64_t *shape, int rank, int64_t *stride)
{
	int64_t st = 1;
	for (int k = rank - 1; k >= 0; k--) {
		stride[k] = st;
		st *= shape[k];
	}
}

/* A reshape that only adds or drops dimensions of size 1 keeps the strides. */
static bool squeeze_view(const sb_val *sv, const ir_node *s, const ir_node *n, sb_val *v)
{
	int j = 0;
	for (int i = 0; i < n->rank; i++) {
		if (n->shape[i] == 1) {
			v->stride[i] = 0;
			continue;
		}
		while (j < s->rank && s->shape[j] == 1)
			j++;
		if (j >= s->rank || s->shape[j] != n->shape[i])
			return false;
		v->stride[i] = sv->stride[j++];
	}
	while (j < s->rank && s->shape[j] == 1)
		j++;
	return j == s->rank;
}

void sb_view_op(sb *b, moe_id id)
{
	const ir_node *n = SBN(b, id), *s = SBN(b, n->args[0]);
	sb_val *sv = &b->v[n->args[0]];
	if (sv->kind == SV_IMM) {
		b->v[id] = *sv;
		return;
	}
	if (sv->kind == SV_IOTA && n->op == MOE_OP_BROADCAST) { /* broadcast keeps trailing alignment */
		b->v[id] = *sv;
		b->v[id].axis = sv->axis + (n->rank - s->rank);
		return;
	}
	if (sv->kind == SV_IOTA)
		sv = sb_dm_val(b, n->args[0]);
	if (!sv)
		return;
	sb_val v = *sv;
	switch ((moe_op)n->op) {
	case MOE_OP_RESHAPE:
		if (sb_contig(sv, s)) {
			contiguous(n->shape, n->rank, v.stride);
			break;
		}
		if (!squeeze_view(sv, s, n, &v)) {
			sb_val *cv = sb_copy_contig(b, n->args[0]);
			if (!cv)
				return;
			v = *cv;
			contiguous(n->shape, n->rank, v.stride);
		}
		break;
	case MOE_OP_SLICE: {
		int axis = sb_axis(n, s, 0);
		int64_t start = ir_attr_int(n, "start", 0), st = ir_attr_int(n, "step", 1);
		if (start < 0)
			start += s->shape[axis];
		v.base += start * sv->stride[axis];
		v.stride[axis] = sv->stride[axis] * st;
		break;
	}
	case MOE_OP_BROADCAST: {
		int off = n->rank - s->rank;
		for (int k = n->rank - 1; k >= 0; k--) {
			int d = k - off;
			v.stride[k] = d >= 0 && s->shape[d] > 1 ? sv->stride[d] : 0;
		}
		break;
	}
	default: break;
	}
	b->v[id] = v;
}
