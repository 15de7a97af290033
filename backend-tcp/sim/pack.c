/* backend-tcp/sim/pack.c: the packed weights of a run (docs/tcp-isa.md
 * section 7, item 5): the program's prep graph evaluated by the reference
 * interpreter on the bound weights when they are bound, outside the
 * simulated time. */
#include "backend-tcp/sim/sim_int.h"
#include "ir/graph_keys.h"
#include "ir/quant.h"

/* Binds each packed tensor of p in table order: out[k] when given (taken),
 * else a tensor without data (shape only). */
static moe_status bind_packed(moe_ctx *ctx, const tcp_program *p, moe_tensor **out, const bool *none,
	moe_tensor_map *packed)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->kind != TCP_T_PACKED)
			continue;
		moe_tensor *h = none[k] ? moe_tensor_new_shape(ctx, (moe_dtype)t->dtype, t->rank, t->shape) : out[k];
		if (!none[k])
			out[k] = NULL;
		k++;
		if (!h)
			return MOE_ERR_INVALID;
		moe_tensor_map_set(packed, t->name, h);
	}
	return MOE_OK;
}

/* The graph of g's outputs that do not depend on a weight in `absent`
 * (none[k] set for the others), or NULL when all or none do. */
static moe_graph *present_part(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *bind, bool *none, bool *all)
{
	uint32_t nn = g->nnodes;
	bool *dep = ctx_alloc(ctx, (nn + 1) * sizeof *dep);
	moe_id *map = ctx_alloc(ctx, (nn + 1) * sizeof *map);
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		const moe_tensor *w = n->op == MOE_OP_WEIGHT && bind ? moe_tensor_map_get(bind, n->name) : NULL;
		dep[i] = w && !w->data;
		for (uint32_t a = 0; a < n->nargs; a++)
			dep[i] |= n->args[a] != MOE_NONE && dep[n->args[a]];
	}
	uint32_t nd = 0;
	for (uint32_t k = 0; k < g->nout; k++)
		nd += none[k] = dep[g->outputs[k]];
	*all = nd == g->nout;
	moe_graph *r = NULL;
	if (nd && nd < g->nout) {
		r = ir_graph_clone_empty(g);
		for (moe_id i = 0; i < nn; i++)
			map[i] = dep[i] ? MOE_NONE : ir_copy_node(r, g, i, map);
		for (uint32_t k = 0; k < g->nout; k++)
			if (!none[k])
				moe_graph_add_output(r, map[g->outputs[k]]);
	}
	ctx_free(ctx, dep, (nn + 1) * sizeof *dep);
	ctx_free(ctx, map, (nn + 1) * sizeof *map);
	return r;
}

/* Whether the TCP program's integer-rate MXFP4 decode of E2M1 code c under
 * E8M0 scale s gives the host's f32 product qt_e2m1(c) x qt_e8m0(s) bit for
 * bit. The program (backend-tcp/compiler/recipe_quant.c, on canonical bytes)
 * keeps a zero word and adds (s << 23) - (127 << 23) modulo 2^32 to any
 * other: exact for s in 2..252, where no product leaves the normal range.
 * Outside it the add wraps the exponent; it is still exact where the code is
 * zero (s below 255), the product stays normal, the add reaches the same
 * infinity or a NaN, or the product is subnormal and the add gives the zero
 * of its sign, the flush every float use of the weight applies (A9). */
static bool e8m0_exact(uint32_t s, uint32_t c)
{
	float v = qt_e2m1(c), h = v * qt_e8m0(s);
	uint32_t w, hw;
	memcpy(&w, &v, sizeof w);
	memcpy(&hw, &h, sizeof hw);
	if (w << 1)
		w += (s << 23) - (127u << 23);
	memcpy(&v, &w, sizeof v);
	if (fpclassify(h) == FP_SUBNORMAL) /* the float ALUs' flush of it (docs/tcp-isa.md A9) */
		hw &= 0x80000000u;
	return w == hw || (isnan(v) && isnan(h)); /* any NaN is the semantics' NaN */
}

/* The weight holding the E8M0 scales of prep node o's canonical MXFP4
 * bytes, named after it by tcp-split-weights; "" for any other node. */
const char *tcp_e8m0_scales(const ir_node *o)
{
	size_t n = strlen(MOE_TCP_E8M0_NAME);
	return o->name && !strncmp(o->name, MOE_TCP_E8M0_NAME, n) ? o->name + n : "";
}

int32_t tcp_weight_named(const tcp_program *p, const char *name)
{
	for (uint32_t i = 0; *name && i < p->nt; i++)
		if (p->t[i].kind == TCP_T_WEIGHT && !strcmp(p->t[i].name, name))
			return (int32_t)i;
	return -1;
}

/* Where scales weight sn of p came from, for a diagnostic: " (checkpoint
 * tensor 'KEY' in FILE)" with its source's {e} read as expert ex (-1: not
 * per expert), the file where ck (may be NULL) holds that key; "" for a
 * weight without a source. */
static void scales_from(const tcp_program *p, moe_checkpoint *ck, const char *sn, int64_t ex, char *buf, size_t n)
{
	int32_t t = p ? tcp_weight_named(p, sn) : -1;
	const char *src = t >= 0 ? p->t[t].source : "";
	buf[0] = 0;
	if (!*src)
		return;
	char key[256];
	const char *e = strstr(src, "{e}");
	if (e && ex >= 0)
		snprintf(key, sizeof key, "%.*s%lld%s", (int)(e - src), src, (long long)ex, e + 3);
	else
		snprintf(key, sizeof key, "%s", src);
	const char *file = NULL;
	if (ck && !moe_checkpoint_find(ck, key, &file))
		file = NULL;
	snprintf(buf, n, " (checkpoint tensor '%s'%s%s)", key, file ? " in " : "", file ? file : "");
}

/* Binding refuses scales the program decodes wrongly: packed tensor v (the
 * canonical E2M1 bytes, u8 [.., N, K/2]) of prep node o named after its
 * scales (tcp_e8m0_scales) against sc, those scales
 * as bound (u8 [.., N, K/32]; v and sc may be rows e0.. of the expert
 * axis). False, with the first bad block named in msg (the weight, and
 * the checkpoint tensor and file p and ck (either may be NULL) name), when
 * a block holds a code that e8m0_exact refuses; true when fine or not such
 * a pair. */
bool tcp_e8m0_check(const ir_node *o, const moe_tensor *v, const moe_tensor *sc, int64_t e0, const tcp_program *p,
	moe_checkpoint *ck, char *msg, size_t n)
{
	const char *sn = tcp_e8m0_scales(o);
	bool fits = *sn && sc && v && sc->data && v->data && sc->dtype == MOE_U8 && v->dtype == MOE_U8 &&
		    sc->rank == v->rank && sc->rank >= 2 && v->shape[v->rank - 1] == 16 * sc->shape[sc->rank - 1];
	for (int d = 0; fits && d < sc->rank - 1; d++)
		fits = sc->shape[d] == v->shape[d];
	if (!fits)
		return true;
	const uint8_t *sp = sc->data, *vp = v->data;
	int64_t nb = sc->shape[sc->rank - 1], rows = sc->shape[sc->rank - 2], bad = 0, first = -1;
	uint32_t fc = 0;
	for (int64_t i = 0; i < (int64_t)sc->nbytes; i++) {
		if (sp[i] >= 2 && sp[i] <= 252)
			continue;
		uint32_t c = 0;
		for (int64_t j = 0; j < 16 && !c; j++) {
			uint32_t b = vp[i * 16 + j];
			c = !e8m0_exact(sp[i], b & 15u) ? (b & 15u) | 16u : !e8m0_exact(sp[i], b >> 4) ? (b >> 4) | 16u : 0;
		}
		if (c && !bad++)
			first = i, fc = c & 15u;
	}
	if (!bad)
		return true;
	uint32_t sv = sp[first];
	char what[64], at[64] = "", from[400];
	int64_t ex = sc->rank > 2 ? e0 + first / nb / rows : -1;
	scales_from(p, ck, sn, ex, from, sizeof from);
	if (sv == 255u)
		snprintf(what, sizeof what, "255 (NaN)");
	else
		snprintf(what, sizeof what, "%u (2^%d) with the E2M1 value %g", sv, (int)sv - 127, (double)qt_e2m1(fc));
	if (sc->rank > 2)
		snprintf(at, sizeof at, " expert %lld", (long long)ex);
	snprintf(msg, n,
		"weight '%s'%s%s row %lld block %lld: E8M0 scale %s is outside 2..252, which the TCP program decodes "
		"exactly (%lld such block%s%s; the host target decodes every scale)",
		sn, from, at, (long long)(first / nb % rows), (long long)(first % nb), what, (long long)bad, bad == 1 ? "" : "s",
		e0 >= 0 && sc->rank > 2 && sc->shape[0] == 1 ? " in this expert" : "");
	return false;
}

moe_status tcp_pack_weights(moe_ctx *ctx, const tcp_program *p, const moe_tensor_map *bind, moe_checkpoint *ck,
	bool timing_only, moe_tensor_map *packed)
{
	if (!p->prep_len)
		return MOE_OK;
	moe_module *m = tcp_prep_module(ctx, p, NULL);
	if (!m)
		return MOE_ERR_INVALID;
	const moe_graph *g = moe_module_graph(m, 0);
	/* timing only, with weights absent: the packed tensors computed from them
	 * are absent too (shape, no data; the simulator faults if it needs their
	 * values), the others are packed from the weights present */
	uint32_t no = g->nout;
	bool *none = ctx_alloc(ctx, (no + 1) * sizeof *none), all = false;
	moe_graph *part = timing_only ? present_part(ctx, g, bind, none, &all) : NULL;
	moe_tensor **out = ctx_alloc(ctx, (no + 1) * sizeof *out);
	moe_status rc = MOE_OK;
	if (!all) {
		moe_tensor **o = part ? ctx_alloc(ctx, (no + 1) * sizeof *o) : out;
		rc = moe_interp_run(ctx, part ? part : g, bind, o);
		for (uint32_t k = 0, j = 0; part && k < no; k++)
			out[k] = none[k] || rc != MOE_OK ? NULL : o[j++];
		if (part)
			ctx_free(ctx, o, (no + 1) * sizeof *o);
	}
	for (uint32_t k = 0; rc == MOE_OK && k < no; k++) {
		const ir_node *o = N(g, g->outputs[k]);
		char msg[1024];
		const moe_tensor *sc = bind ? moe_tensor_map_get(bind, tcp_e8m0_scales(o)) : NULL;
		if (out[k] && !tcp_e8m0_check(o, out[k], sc, 0, p, ck, msg, sizeof msg)) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: %s", msg);
			rc = MOE_ERR_INVALID;
		}
	}
	if (rc == MOE_OK)
		rc = bind_packed(ctx, p, out, none, packed);
	else
		moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_none(), "tcp: packing the weights failed");
	for (uint32_t k = 0; k < no; k++)
		moe_tensor_free(ctx, out[k]);
	ctx_free(ctx, out, (no + 1) * sizeof *out);
	ctx_free(ctx, none, (no + 1) * sizeof *none);
	if (part)
		ir_graph_free(part);
	moe_module_free(m);
	return rc;
}
