/* backend-tcp/sim/sim_lazy.c: weights read on first use. A run given the
 * checkpoint (moe_tcp_run_opts.lazy_weights) binds the per-expert weights
 * the loader deferred (MOE_WEIGHTS_DEFER) and the packed weights computed
 * from them to anonymous mappings, whose pages take no memory until written;
 * a row (one expert) is read, and packed, the first time a command reads an
 * element of it. The values are those an eager load and pack give: the same
 * conversion, the same weight-packing graph run on one row. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <sys/mman.h>

#include "backend-tcp/sim/sim_int.h"
#include "moec/io.h"

typedef struct lazy_t {
	int64_t rows;     /* 0: not lazy */
	size_t row_bytes; /* bytes of one row */
	size_t bytes;     /* the mapping's length */
	uint8_t *filled;  /* per row */
	uint8_t *data;    /* the mapping */
	moe_id wid;       /* a deferred weight's node in the interface graph; MOE_NONE: a packed weight */
} lazy_t;

struct tcps_lazy {
	lazy_t *of;            /* per tensor */
	moe_checkpoint *ck;
	const moe_tensor_map *b;
	moe_module *iface;     /* the program's interface: deferred weights' sources */
	moe_module *prep;      /* the weight-packing graph as stored */
	moe_module *rowprep;   /* the same on one row (leading dimension 1) */
	int32_t *packed_t;     /* the tensor of each output of the prep graph */
	uint32_t npacked;
	uint32_t defer;        /* unmap() registered with the context */
};

/* The mappings undone (also when an allocation throws: the context's defer). */
static void unmap(void *arg)
{
	sim *s = arg;
	for (uint32_t i = 0; s->lz->of && i < s->p->nt; i++)
		if (s->lz->of[i].rows) {
			munmap(s->lz->of[i].data, s->lz->of[i].bytes);
			s->lz->of[i].rows = 0;
		}
}

/* Whether node n computes each row of its leading dimension (of size R) from
 * the same row of its operands alone: then the graph runs on one row. A
 * scalar constant is the same for every row (MXFP4's canonical bytes: and,
 * eq and select against scalars); an elementwise op qualifies when each
 * operand is such a scalar or a row-wise value of its rank (an operand of
 * lower rank would broadcast over the rows, and its leading dimension is not
 * R). */
static bool row_wise(const moe_graph *g, const ir_node *n, int64_t R)
{
	if (n->op == MOE_OP_CONST && n->rank == 0)
		return true;
	if (n->rank < 1 || n->shape[0] != R || n->valid != MOE_NONE)
		return false;
	if ((ir_ops[n->op].flags & OPF_ELEM) && n->op != MOE_OP_CAST && n->op != MOE_OP_BITCAST) {
		bool ok = true;
		for (uint32_t k = 0; ok && k < n->nargs; k++) {
			const ir_node *a = N(g, n->args[k]);
			ok = (a->op == MOE_OP_CONST && a->rank == 0) || (a->rank == n->rank && a->shape[0] == R);
		}
		return ok;
	}
	int64_t ax = ir_attr_int(n, "axis", 0);
	ax = ax < 0 ? ax + n->rank : ax;
	switch (n->op) {
	case MOE_OP_WEIGHT: return !ir_attr_find(n, "layout") && !ir_attr_find(n, "transpose");
	case MOE_OP_CAST:
	case MOE_OP_BITCAST: return true;
	case MOE_OP_CONCAT: return ax >= 1;
	case MOE_OP_SLICE: return ax >= 1;
	case MOE_OP_RESHAPE: {
		const ir_attr *a = ir_attr_find(n, "shape");
		return n->nargs == 1 && N(g, n->args[0])->rank >= 1 && N(g, n->args[0])->shape[0] == R && a &&
		       a->kind == MOE_ATTR_INTS && a->count == n->rank && a->v.ints[0] == R;
	}
	default: return false;
	}
}

/* The prep graph on one row, or NULL (no diagnostic) when one of its nodes
 * does not work row by row. */
static moe_module *one_row(moe_ctx *ctx, const tcp_program *p, int64_t R)
{
	moe_module *m = tcp_prep_module(ctx, p, NULL);
	moe_graph *g = m ? moe_module_graph(m, 0) : NULL;
	bool ok = g != NULL;
	for (moe_id i = 0; ok && i < g->nnodes; i++)
		ok = row_wise(g, N(g, i), R);
	for (moe_id i = 0; ok && i < g->nnodes; i++) {
		ir_node *n = N(g, i);
		if (n->rank < 1)
			continue;
		n->shape[0] = 1;
		if (n->op == MOE_OP_RESHAPE)
			ir_attr_find(n, "shape")->v.ints[0] = 1;
	}
	if (ok && moe_module_verify(ctx, m) != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: the weight-packing graph does not verify on one row");
		ok = false;
	}
	if (!ok) {
		moe_module_free(m);
		return NULL;
	}
	return m;
}

static moe_id weight_node(const moe_graph *g, const char *name)
{
	for (moe_id i = 0; g && i < g->nnodes; i++)
		if (N(g, i)->op == MOE_OP_WEIGHT && N(g, i)->name && !strcmp(N(g, i)->name, name))
			return i;
	return MOE_NONE;
}

/* An anonymous mapping for tensor t, its rows unfilled. */
static bool map_rows(moe_ctx *ctx, lazy_t *l, const tcp_tensor *t, moe_id wid)
{
	size_t bytes = (size_t)t->numel * moe_dtype_size((moe_dtype)t->dtype);
	void *d = t->rank >= 1 && t->shape[0] >= 1 && bytes
		? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
		: MAP_FAILED;
	if (d == MAP_FAILED) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: no address space for weight '%s' (%zu bytes)", t->name,
			bytes);
		return false;
	}
	l->data = d;
	l->bytes = bytes;
	l->rows = t->shape[0];
	l->row_bytes = bytes / (size_t)l->rows;
	l->filled = ctx_alloc(ctx, (size_t)l->rows);
	l->wid = wid;
	return true;
}

/* Rows of per-expert weights the prep graph reads: deferred (no data) ones
 * from the checkpoint, bound ones copied. out[k]: row `row` of each packed
 * weight. */
/* A row graph of weights, reshapes and concats only moves bytes: evaluated
 * here with copies (what the interpreter computes, without its per-element
 * walk); false when g holds another op (nothing done). */
static bool moves_bytes(moe_ctx *ctx, const moe_graph *g, const moe_tensor_map *rb, moe_tensor **out)
{
	for (moe_id i = 0; i < g->nnodes; i++)
		if (N(g, i)->op != MOE_OP_WEIGHT && N(g, i)->op != MOE_OP_RESHAPE && N(g, i)->op != MOE_OP_CONCAT)
			return false;
	uint8_t **buf = ctx_alloc(ctx, (g->nnodes + 1) * sizeof *buf);
	bool *own = ctx_alloc(ctx, g->nnodes + 1);
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_WEIGHT) {
			buf[i] = moe_tensor_map_get(rb, n->name)->data;
		} else if (n->op == MOE_OP_RESHAPE) {
			buf[i] = buf[n->args[0]];
		} else { /* concat on axis a >= 1 of a [1, ...] row: each operand's trailing block in turn */
			int64_t a = ir_attr_int(n, "axis", 0), outer = 1, es = (int64_t)moe_dtype_size((moe_dtype)n->dtype), at = 0;
			a = a < 0 ? a + n->rank : a;
			for (int64_t k = 0; k < a; k++)
				outer *= n->shape[k];
			int64_t total = es;
			for (int k = 0; k < n->rank; k++)
				total *= n->shape[k];
			buf[i] = ctx_alloc(ctx, (size_t)total);
			own[i] = true;
			for (int64_t o = 0; o < outer; o++)
				for (uint32_t k = 0; k < n->nargs; k++) {
					const ir_node *x = N(g, n->args[k]);
					int64_t blk = es;
					for (int d = (int)a; d < x->rank; d++)
						blk *= x->shape[d];
					memcpy(buf[i] + at, buf[n->args[k]] + o * blk, (size_t)blk);
					at += blk;
				}
		}
	}
	for (uint32_t k = 0; k < g->nout; k++) {
		const ir_node *n = N(g, g->outputs[k]);
		out[k] = moe_tensor_new(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		if (out[k])
			memcpy(out[k]->data, buf[g->outputs[k]], out[k]->nbytes);
	}
	for (moe_id i = 0; i < g->nnodes; i++)
		if (own[i])
			ctx_free(ctx, buf[i], 0);
	ctx_free(ctx, buf, 0);
	ctx_free(ctx, own, 0);
	return true;
}

static moe_status pack_row(sim *s, int64_t row, moe_tensor **out)
{
	tcps_lazy *z = s->lz;
	moe_ctx *ctx = s->ctx;
	const moe_graph *full = moe_module_graph(z->prep, 0), *g = moe_module_graph(z->rowprep, 0);
	moe_tensor_map *rb = moe_tensor_map_new(ctx);
	moe_status rc = MOE_OK;
	for (moe_id i = 0; i < g->nnodes && rc == MOE_OK; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_WEIGHT)
			continue;
		const moe_tensor *h = moe_tensor_map_get(z->b, n->name);
		bool here = h && h->data;
		moe_tensor *t = (here ? moe_tensor_new_shape : moe_tensor_new)(ctx, (moe_dtype)n->dtype, n->rank, n->shape);
		if (!h || !t || (here && h->nbytes != t->nbytes * (size_t)N(full, i)->shape[0])) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tcp: no tensor of the right size bound for weight '%s'",
				n->name);
			moe_tensor_free(ctx, t);
			rc = MOE_ERR_INVALID;
			break;
		}
		if (here) { /* borrowed: the row in place */
			t->data = (uint8_t *)h->data + (size_t)row * t->nbytes;
			t->owned = 0;
		} else {
			rc = moe_weights_load_row(ctx, full, i, z->ck, row, t->data, t->nbytes);
		}
		if (moe_tensor_map_set(rb, n->name, t) != MOE_OK && rc == MOE_OK)
			rc = MOE_ERR_NOMEM;
	}
	if (rc == MOE_OK && !moves_bytes(ctx, g, rb, out))
		rc = moe_interp_run(ctx, g, rb, out);
	moe_tensor_map_free(rb);
	return rc;
}

/* Row `row` of packed output k (v) checked against row `row` of the E8M0
 * scales its prep node names (tcp_e8m0_check), those filled first when
 * lazy; a fault naming the block when the program would decode it wrongly. */
static bool e8m0_row(sim *s, uint32_t pc, uint32_t k, const moe_tensor *v, int64_t row)
{
	const ir_node *o = N(moe_module_graph(s->lz->rowprep, 0), moe_module_graph(s->lz->rowprep, 0)->outputs[k]);
	const char *sn = tcp_e8m0_scales(o);
	int32_t ts = tcp_weight_named(s->p, sn);
	const tcp_tensor *t = ts >= 0 ? &s->p->t[ts] : NULL;
	if (!t || t->rank < 1 || t->shape[0] <= row)
		return true;
	int64_t per = t->numel / t->shape[0];
	const lazy_t *l = &s->lz->of[ts];
	const moe_tensor *h = moe_tensor_map_get(s->lz->b, sn);
	moe_tensor sc = {.dtype = (moe_dtype)t->dtype, .rank = t->rank, .nbytes = (size_t)per};
	memcpy(sc.shape, t->shape, sizeof sc.shape);
	sc.shape[0] = 1;
	if (l->rows) {
		if (!tcps_fill(s, pc, ts, row * per, row * per))
			return false;
		sc.data = l->data + (size_t)row * l->row_bytes;
	} else if (h && h->data && h->nbytes == (size_t)t->numel) {
		sc.data = (uint8_t *)h->data + (size_t)row * (size_t)per;
	}
	char msg[1024];
	if (tcp_e8m0_check(o, v, &sc, row, s->p, s->lz->ck, msg, sizeof msg))
		return true;
	FAULT(s, pc, "%s", msg);
	return false;
}

static bool fill_row(sim *s, uint32_t pc, int32_t t, int64_t row)
{
	tcps_lazy *z = s->lz;
	lazy_t *l = &z->of[t];
	if (l->wid != MOE_NONE) {
		if (moe_weights_load_row(s->ctx, moe_module_graph(z->iface, 0), l->wid, z->ck, row,
			    l->data + (size_t)row * l->row_bytes, l->row_bytes) != MOE_OK) {
			FAULT(s, pc, "cannot read row %lld of weight '%s'", (long long)row, s->p->t[t].name);
			return false;
		}
		l->filled[row] = 1;
		return true;
	}
	moe_tensor **out = ctx_alloc(s->ctx, (z->npacked + 1) * sizeof *out);
	moe_status rc = pack_row(s, row, out);
	bool ok = true;
	for (uint32_t k = 0; k < z->npacked; k++) {
		lazy_t *o = &z->of[z->packed_t[k]];
		ok = ok && (rc != MOE_OK || !out[k] || e8m0_row(s, pc, k, out[k], row));
		if (ok && rc == MOE_OK && out[k] && out[k]->nbytes == o->row_bytes && !o->filled[row]) {
			memcpy(o->data + (size_t)row * o->row_bytes, out[k]->data, o->row_bytes);
			o->filled[row] = 1;
		}
		moe_tensor_free(s->ctx, out[k]);
	}
	ctx_free(s->ctx, out, 0);
	if (!ok)
		return false;
	if (!l->filled[row]) {
		FAULT(s, pc, "packing row %lld of weight '%s' failed", (long long)row, s->p->t[t].name);
		return false;
	}
	return true;
}

bool tcps_fill(sim *s, uint32_t pc, int32_t t, int64_t lo, int64_t hi)
{
	lazy_t *l = &s->lz->of[t];
	if (!l->rows)
		return true;
	int64_t per = s->p->t[t].numel / l->rows;
	if (hi < lo) {
		int64_t x = lo;
		lo = hi, hi = x;
	}
	for (int64_t r = lo / per; r <= hi / per && r < l->rows; r++)
		if (!l->filled[r] && !fill_row(s, pc, t, r))
			return false;
	return true;
}

/* The packed weights of p, all of them lazy (true), or none (false, with
 * no diagnostic: the caller packs them eagerly). */
static bool lazy_packed(sim *s)
{
	tcps_lazy *z = s->lz;
	const tcp_program *p = s->p;
	int64_t R = -1;
	for (uint32_t i = 0; i < p->nt; i++)
		if (p->t[i].kind == TCP_T_PACKED) {
			if (p->t[i].rank < 1 || (R >= 0 && p->t[i].shape[0] != R))
				return false;
			R = p->t[i].shape[0];
			z->npacked++;
		}
	if (!z->npacked || !(z->prep = tcp_prep_module(s->ctx, p, NULL)))
		return false;
	/* only a prep graph reading a deferred weight is worth running row by row */
	const moe_graph *g = moe_module_graph(z->prep, 0);
	bool deferred = false;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const moe_tensor *h = N(g, i)->op == MOE_OP_WEIGHT ? moe_tensor_map_get(z->b, N(g, i)->name) : NULL;
		deferred |= h && !h->data;
	}
	if (!deferred || !(z->rowprep = one_row(s->ctx, p, R)))
		return false;
	z->packed_t = ctx_alloc(s->ctx, (z->npacked + 1) * sizeof *z->packed_t);
	for (uint32_t i = 0, k = 0; i < p->nt; i++)
		if (p->t[i].kind == TCP_T_PACKED) {
			z->packed_t[k++] = (int32_t)i;
			if (!map_rows(s->ctx, &z->of[i], &p->t[i], MOE_NONE))
				return false;
		}
	return true;
}

/* Every deferred weight the program reads itself: lazy when its interface
 * node is a per-expert weight of its shape. */
static bool lazy_weights(sim *s)
{
	tcps_lazy *z = s->lz;
	const tcp_program *p = s->p;
	const moe_graph *ig = NULL;
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		const moe_tensor *h = t->kind == TCP_T_WEIGHT ? moe_tensor_map_get(z->b, t->name) : NULL;
		if (!h || h->data)
			continue;
		if (!z->iface && !(z->iface = moe_tcp_interface(s->ctx, (const moe_tcp_program *)p)))
			return false;
		ig = moe_module_graph(z->iface, 0);
		moe_id w = weight_node(ig, t->name);
		const ir_node *n = w != MOE_NONE ? N(ig, w) : NULL;
		const char *src = n ? ir_attr_str(n, "source", "") : "";
		bool same = n && strstr(src, "{e}") && n->rank == t->rank && n->dtype == t->dtype && h->rank == t->rank;
		for (int k = 0; same && k < t->rank; k++)
			same = n->shape[k] == t->shape[k] && h->shape[k] == t->shape[k];
		if (!same) {
			moe_diag(s->ctx, MOE_DIAG_ERROR, moe_loc_none(),
				"tcp: '%s' is bound without data and is not a per-expert weight of the checkpoint", t->name);
			return false;
		}
		if (!map_rows(s->ctx, &z->of[i], t, w))
			return false;
	}
	return true;
}

/* Weight `name` into w: bound data borrowed, a deferred one read whole
 * (every row) as node i of g (a graph that names its source; none: left
 * out). */
static moe_status add_whole(sim *s, moe_tensor_map *w, const char *name, const moe_graph *g, moe_id i)
{
	const ir_node *n = g && i != MOE_NONE ? N(g, i) : NULL;
	const moe_tensor *h = moe_tensor_map_get(s->lz->b, name);
	if (!h || moe_tensor_map_get(w, name) || (!h->data && !n))
		return MOE_OK; /* the pack reports a missing one */
	moe_tensor *t = (h->data ? moe_tensor_new_shape : moe_tensor_new)(s->ctx, h->dtype, h->rank, h->shape);
	if (!t)
		return MOE_ERR_NOMEM;
	moe_status rc = MOE_OK;
	if (h->data) {
		t->data = h->data;
		t->owned = 0;
	} else {
		size_t rb = n->rank >= 1 && n->shape[0] > 0 ? t->nbytes / (size_t)n->shape[0] : 0;
		for (int64_t r = 0; rb && r < n->shape[0] && rc == MOE_OK; r++)
			rc = moe_weights_load_row(s->ctx, g, i, s->lz->ck, r, (uint8_t *)t->data + (size_t)r * rb, rb);
	}
	if (moe_tensor_map_set(w, name, t) != MOE_OK && rc == MOE_OK)
		rc = MOE_ERR_NOMEM;
	return rc;
}

/* The weights the prep graph reads, and the E8M0 scales its outputs name
 * (tcp_pack_weights checks them), for a prep graph that does not run row by
 * row. */
static moe_tensor_map *whole(sim *s)
{
	tcps_lazy *z = s->lz;
	moe_ctx *ctx = s->ctx;
	moe_module *m = tcp_prep_module(ctx, s->p, NULL);
	const moe_graph *g = m ? moe_module_graph(m, 0) : NULL;
	const moe_graph *ig = z->iface ? moe_module_graph(z->iface, 0) : NULL;
	moe_tensor_map *w = g ? moe_tensor_map_new(ctx) : NULL;
	moe_status rc = g ? MOE_OK : MOE_ERR_INVALID;
	for (moe_id i = 0; g && i < g->nnodes && rc == MOE_OK; i++)
		if (N(g, i)->op == MOE_OP_WEIGHT)
			rc = add_whole(s, w, N(g, i)->name, g, i);
	for (uint32_t k = 0; g && k < g->nout && rc == MOE_OK; k++) {
		const char *sn = tcp_e8m0_scales(N(g, g->outputs[k]));
		if (*sn)
			rc = add_whole(s, w, sn, ig, weight_node(ig, sn));
	}
	moe_module_free(m);
	if (rc != MOE_OK) {
		moe_tensor_map_free(w);
		return NULL;
	}
	return w;
}

moe_status tcps_lazy_setup(sim *s, const moe_tensor_map *b, moe_tensor_map *packed)
{
	tcps_lazy *z = ctx_alloc(s->ctx, sizeof *z);
	z->of = ctx_alloc(s->ctx, (s->p->nt + 1) * sizeof *z->of);
	s->lz = z;
	z->defer = ctx_defer(s->ctx, unmap, s);
	z->ck = s->o->lazy_weights;
	z->b = b;
	if (!lazy_weights(s))
		return MOE_ERR_INVALID;
	if (!s->p->prep_len)
		return MOE_OK;
	int errs = moe_error_count(s->ctx);
	if (lazy_packed(s) || moe_error_count(s->ctx) != errs)
		return moe_error_count(s->ctx) != errs ? MOE_ERR_INVALID : MOE_OK;
	moe_tensor_map *w = whole(s);
	moe_status rc = w ? tcp_pack_weights(s->ctx, s->p, w, z->ck, false, packed) : MOE_ERR_INVALID;
	moe_tensor_map_free(w);
	return rc;
}

bool tcps_lazy_bind(sim *s, uint32_t i)
{
	if (!s->lz || !s->lz->of[i].rows)
		return false;
	s->data[i] = s->lz->of[i].data;
	s->absent[i] = 0;
	s->borrowed[i] = true;
	return true;
}

void tcps_lazy_free(sim *s)
{
	tcps_lazy *z = s->lz;
	if (!z)
		return;
	for (uint32_t i = 0; i < s->p->nt; i++)
		ctx_free(s->ctx, z->of[i].filled, 0);
	unmap(s);
	ctx_undefer(s->ctx, z->defer);
	moe_module_free(z->iface);
	moe_module_free(z->prep);
	moe_module_free(z->rowprep);
	ctx_free(s->ctx, z->packed_t, 0);
	ctx_free(s->ctx, z->of, 0);
	ctx_free(s->ctx, z, 0);
	s->lz = NULL;
}
