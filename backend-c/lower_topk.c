/* backend-c/lower_topk.c: topk lowered natively for the host (cgen.h form),
 * instead of the pass lower-topk's [.., E, E] rank tensors.
 *
 * Per row of E scores each element gets an i32 key whose signed order is
 * the score order of docs/semantics.md (the key of lower-topk's exact mode:
 * -0 -> +0, every NaN -> +qNaN above +inf; integer scores are their own
 * key), then c_j = key_j * E + (E - 1 - j), unique per element, larger for a
 * higher score and, among equal scores, for the lower index. Slot s takes
 * the largest c below slot s - 1's: K branchless passes over the row (a
 * compare and two selects per element), O(rows x E x K) instead of
 * O(rows x E^2). It only selects, so the indices are exactly the
 * interpreter's and lower-topk's. Rows are a parallel loop. */
#include "backend-c/lower_int.h"

/* the key of an f32 value (bf16 is widened exactly on load) */
static cg_expr *score_key(lw *L, cg_expr *f)
{
	cg_expr *z = sel(L, bin(L, CE_EQ, f, fc(L, 0.0f)), fc(L, 0.0f), f);
	cg_expr *bits = mk(L, CE_BITS, CT_I32, z, NULL, NULL);
	cg_expr *flip = bin(L, CE_XOR, bits, bin(L, CE_AND, bin(L, CE_ASHR, bits, ic32(L, 31)), ic32(L, 0x7fffffff)));
	return sel(L, un(L, CE_ISNAN, f), ic32(L, 0x7fc00000), flip);
}

void cgen_lower_topk(lw *L, cg_block *b, const ir_node *n, int out)
{
	const ir_node *x = nd(L, n->args[0]);
	int xb = L->p->node_buf[n->args[0]], iv[MOE_MAX_RANK];
	int64_t E = x->shape[x->rank - 1], K = n->shape[n->rank - 1], rows = ir_numel(n) / (K > 0 ? K : 1);
	if (E <= 0 || K <= 0 || rows <= 0)
		return;
	int keys = cgen_scratch(L, MOE_I32, rows * E);
	int64_t s[MOE_MAX_RANK];
	strides_of(n, s);
	for (int d = 0; d < n->rank - 1; d++)
		s[d] /= K; /* strides of the leading dims in rows */
	int md = mask_depth(L, n);
	int depth = n->rank - 1 > md ? n->rank - 1 : md;
	cg_block *in = nest(L, b, n, out, depth, iv);
	if (md == 0 && depth > 0)
		par_if_big(b, rows * E * K);
	cg_expr *row = lin(L, iv, s, n->rank - 1, NULL);
	cg_expr *xrow = mul64(L, row, E);
	int j;
	cg_block *kl = loopv(L, in, &j, ic(L, 0), ic(L, E));
	cg_expr *xv = ld(L, xb, add64(L, xrow, vr(L, j)));
	store(L, kl, keys, add64(L, xrow, vr(L, j)), xv->ty == CT_F32 ? score_key(L, xv) : xv);
	/* every c lies in [-2^31 E, (2^31 - 1) E + E - 1]: these bounds are outside */
	int prev = newvar(L, CT_I64), best = newvar(L, CT_I64), bj = newvar(L, CT_I64), c = newvar(L, CT_I64),
	    up = newvar(L, CT_I32), slot;
	set(L, in, prev, ic(L, (INT64_C(1) << 31) * E + E));
	cg_block *sl = loopv(L, in, &slot, ic(L, 0), ic(L, K));
	set(L, sl, best, ic(L, -((INT64_C(1) << 31) + 1) * E));
	set(L, sl, bj, ic(L, 0));
	cg_block *el = loopv(L, sl, &j, ic(L, 0), ic(L, E));
	cg_expr *key = conv(L, ld(L, keys, add64(L, xrow, vr(L, j))), CT_I64);
	set(L, el, c, add64(L, mul64(L, key, E), bin(L, CE_SUB, ic(L, E - 1), vr(L, j))));
	set(L, el, up, bin(L, CE_AND, bin(L, CE_LT, vr(L, c), vr(L, prev)), bin(L, CE_GT, vr(L, c), vr(L, best))));
	set(L, el, best, sel(L, vr(L, up), vr(L, c), vr(L, best)));
	set(L, el, bj, sel(L, vr(L, up), vr(L, j), vr(L, bj)));
	store(L, sl, out, add64(L, mul64(L, row, K), vr(L, slot)), conv(L, vr(L, bj), CT_I32));
	set(L, sl, prev, vr(L, best));
}
