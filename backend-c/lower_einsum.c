/* backend-c/lower_einsum.c: einsum -> kernel form. A float two-operand
 * contraction takes the fast path (packed A panels, CS_DOT tiles or packed
 * B column panels); anything else the generic loop nest. Both add each
 * output element's products in increasing k order, so their sums agree bit
 * for bit. */
#include "backend-c/lower_int.h"


typedef struct ein {
	ir_einsum e;
	int64_t size[26];
	int64_t st[2][26]; /* per operand: stride of each letter (0 if absent) */
	int64_t ost[26];   /* output stride per letter */
} ein;

static void ein_setup(lw *L, const ir_node *n, ein *E)
{
	char msg[160];
	memset(E, 0, sizeof *E);
	bool ok = ir_einsum_parse(ir_attr_str(n, "eq", ""), &E->e, msg, sizeof msg);
	IR_ASSERT(ok);
	for (int i = 0; i < E->e.nin; i++) {
		const ir_node *a = nd(L, n->args[i]);
		int64_t s[MOE_MAX_RANK];
		strides_of(a, s);
		for (int d = 0; d < a->rank; d++) {
			E->size[E->e.in[i][d] - 'a'] = a->shape[d];
			E->st[i][E->e.in[i][d] - 'a'] = s[d];
		}
	}
	int64_t s[MOE_MAX_RANK];
	strides_of(n, s);
	for (int d = 0; d < E->e.out_rank; d++)
		E->ost[E->e.out[d] - 'a'] = s[d];
}

/* Generic contraction: output nest (with mask), then the summed letters in
 * first-seen order; acc starts at 0 and adds each product in turn. */
static void lower_einsum_generic(lw *L, cg_block *b, const ir_node *n, int out, const ein *E)
{
	int iv[MOE_MAX_RANK], lv[26];
	for (int i = 0; i < 26; i++)
		lv[i] = -1;
	cg_block *in = nest(L, b, n, out, n->rank, iv);
	for (int d = 0; d < n->rank; d++)
		lv[E->e.out[d] - 'a'] = iv[d];
	cg_ty t = val_ty((moe_dtype)n->dtype);
	int acc = newvar(L, t);
	/* -0 + p == p for every p: the same as starting from the first product */
	set(L, in, acc, t == CT_F32 ? fc(L, -0.0f) : ic32(L, 0));
	cg_block *body = in;
	for (int i = 0; i < E->e.nletters; i++) {
		int l = E->e.letters[i] - 'a';
		if (lv[l] >= 0)
			continue;
		body = loopv(L, body, &lv[l], ic(L, 0), ic(L, E->size[l]));
	}
	cg_expr *prod = NULL;
	for (int k = 0; k < E->e.nin; k++) {
		cg_expr *idx = NULL;
		for (int d = 0; d < E->e.rank[k]; d++) {
			int l = E->e.in[k][d] - 'a';
			idx = add64(L, idx, mul64(L, vr(L, lv[l]), E->st[k][l]));
		}
		cg_expr *v = ld(L, L->p->node_buf[n->args[k]], idx ? idx : ic(L, 0));
		prod = prod ? bin(L, CE_MUL, prod, v) : v;
	}
	set(L, body, acc, bin(L, CE_ADD, vr(L, acc), prod));
	int64_t os[MOE_MAX_RANK];
	strides_of(n, os);
	store(L, in, out, lin(L, iv, os, n->rank, NULL), vr(L, acc));
}

/* Letters of one role, in output order (or operand order for k). */
typedef struct group {
	int n;
	int l[MOE_MAX_RANK];
	int64_t size; /* product */
} group;

static void group_add(group *g, int l, int64_t size)
{
	g->l[g->n++] = l;
	g->size *= size;
}

/* Role analysis of a float two-operand contraction of the form
 * out[batch.., m.., n..] = sum_k A[..] B[..] (any operand layouts). */
typedef struct ein_plan {
	int ia, ib;
	char role[26];
	group gb, gm, gn, gk;
	bool mask_batch, mask_m;
} ein_plan;

static bool ein_analyze(lw *L, const ir_node *n, const ein *E0, ein_plan *P)
{
	if (E0->e.nin != 2 || !moe_dtype_is_float((moe_dtype)n->dtype))
		return false;
	const ein *E = E0;
	memset(P, 0, sizeof *P);
	P->ia = 0;
	P->ib = 1;
	char *role = P->role;
	for (int i = 0; i < E->e.nletters; i++) {
		int l = E->e.letters[i] - 'a';
		bool a = memchr(E->e.in[0], 'a' + l, (size_t)E->e.rank[0]) != NULL;
		bool bb = memchr(E->e.in[1], 'a' + l, (size_t)E->e.rank[1]) != NULL;
		bool o = memchr(E->e.out, 'a' + l, (size_t)E->e.out_rank) != NULL;
		if (a && bb && o)
			role[l] = 'g';
		else if (a && o)
			role[l] = 'm';
		else if (bb && o)
			role[l] = 'n';
		else if (a && bb)
			role[l] = 'k';
		else
			return false; /* summed over one operand only */
	}
	group gb = {0, {0}, 1}, gm = {0, {0}, 1}, gn = {0, {0}, 1}, gk = {0, {0}, 1};
	int d = 0;
	while (d < E->e.out_rank && role[E->e.out[d] - 'a'] == 'g')
		group_add(&gb, E->e.out[d] - 'a', E->size[E->e.out[d] - 'a']), d++;
	if (d == E->e.out_rank)
		return false;
	char first = role[E->e.out[d] - 'a'];
	if (first == 'n') { /* B's free letters come first: swap roles (a*b == b*a exactly) */
		P->ia = 1;
		P->ib = 0;
		for (int l = 0; l < 26; l++)
			role[l] = role[l] == 'm' ? 'n' : role[l] == 'n' ? 'm' : role[l];
	}
	while (d < E->e.out_rank && role[E->e.out[d] - 'a'] == 'm')
		group_add(&gm, E->e.out[d] - 'a', E->size[E->e.out[d] - 'a']), d++;
	while (d < E->e.out_rank && role[E->e.out[d] - 'a'] == 'n')
		group_add(&gn, E->e.out[d] - 'a', E->size[E->e.out[d] - 'a']), d++;
	if (d != E->e.out_rank || gm.n == 0 || gn.n == 0)
		return false;
	/* k letters in first-seen order: the generic loop's summation order */
	for (int i = 0; i < E->e.nletters; i++)
		if (role[E->e.letters[i] - 'a'] == 'k')
			group_add(&gk, E->e.letters[i] - 'a', E->size[E->e.letters[i] - 'a']);
	if (gk.n == 0 || gn.size < 4)
		return false;
	/* masks: scalar on the first batch letter (or on m0 without batch);
	 * vector over the single batch letter, counting m0 rows */
	int md = mask_depth(L, n);
	if (md == 1) {
		if (gb.n >= 1)
			P->mask_batch = true;
		else
			P->mask_m = true;
	} else if (md == 2) {
		if (gb.n != 1)
			return false;
		P->mask_m = true;
	}
	P->gb = gb;
	P->gm = gm;
	P->gn = gn;
	P->gk = gk;
	return true;
}

/* The dot-tile path: one summed letter, contiguous in B. */
static bool ein_dot_ok(const ein *E, const ein_plan *P)
{
	return P->gk.n == 1 && E->st[P->ib][P->gk.l[0]] == 1;
}

/* Is node g (a gather) read by einsum n as its B operand through a dot tile,
 * indexing the gathered tensor's first dimension by a batch letter? Then the
 * einsum reads x[i[g]] directly and the gather is not materialised. */
bool cgen_gather_fusable_into(lw *L, moe_id gid, const ir_node *n)
{
	const ir_node *g = nd(L, gid);
	if (n->op != MOE_OP_EINSUM || g->op != MOE_OP_GATHER)
		return false;
	const ir_node *x = nd(L, g->args[0]), *ix = nd(L, g->args[1]);
	if (ir_norm_axis((int)ir_attr_int(g, "axis", 0), x->rank) != 0 || ix->rank != 1)
		return false;
	if (g->valid != MOE_NONE && nd(L, g->valid)->rank != 0)
		return false;
	if (!moe_dtype_is_float((moe_dtype)g->dtype))
		return false;
	ein E;
	ein_plan P;
	ein_setup(L, n, &E);
	if (!ein_analyze(L, n, &E, &P) || !ein_dot_ok(&E, &P))
		return false;
	if (n->args[P.ib] != gid || n->args[P.ia] == gid)
		return false;
	return P.role[E.e.in[P.ib][0] - 'a'] == 'g';
}

/* index of the accumulator of row r, column j of a tile of NT columns: an
 * [M, NT] panel, per batch element when the batch loop is the parallel one
 * (bat >= 0, its variable), else per tile for dot tiles (groups of DOT_GROUP
 * tiles of DOT_LANES columns, CS_DOT), else shared */
static cg_expr *accidx(lw *L, int bat, bool dot, int tile, int64_t M, int64_t NT, int r, int j)
{
	cg_expr *in = add64(L, mul64(L, vr(L, r), NT), vr(L, j));
	if (bat >= 0)
		return add64(L, mul64(L, vr(L, bat), M * NT), in);
	return dot ? add64(L, mul64(L, vr(L, tile), M * NT), in) : in;
}

/* A block einsum (one batch letter: the expert blocks of a dispatch) with at
 * least this many batch elements runs its batch loop in parallel, each block
 * on one thread with its own A panel and accumulators, instead of the tiles of
 * one block after another: at T = 512 the Qwen3 layer's 190 blocks each hold
 * about 32 rows, and splitting every block's 12 groups of tiles over the
 * threads cost a barrier per block and per projection (bench/NOTES.md 1); at
 * T = 1 its 8 blocks (one per routed expert) are streamed whole by the
 * threads, 3 barriers instead of 24. A decode step is bound by memory, which
 * a few cores' streams saturate on common hosts, so 8 blocks keep up to 8
 * threads busy enough. Smaller grids (top-1 or top-2 routing at T = 1) keep
 * the tiles as the parallel unit, so that every thread still streams. */
enum { BLOCK_PAR_MIN = 8 };

/* The fast path's state, shared by its stages: the analysis, the operand
 * and scratch buffers, the tile sizes and the loop variables (lv: per
 * letter). */
typedef struct fe {
	lw *L;
	const ir_node *n, *gnode; /* gnode: the fused gather read as B, or NULL */
	ein E;
	ein_plan P;
	int out, A, B, apan, bpan, acc;
	int lv[26];
	int64_t M, K, NL, NT, AS, ntiles, m0rest;
	int64_t os[MOE_MAX_RANK];
	int lastn;
	bool dot, abf, bpar, fused, zero_ahead;
	int bat;       /* the parallel block loop's variable, or -1 */
	cg_expr *aoff; /* the block's slice of the A panel when blocks run in parallel */
	int mcnt, rows;
} fe;

/* The rows past each batch element's count are zeros: with one batch letter
 * they are written by a parallel loop of their own before the blocks,
 * instead of by the serial block loop (the down projection of a block
 * dispatch: 8064 of 12160 rows, 33 MB, for the Qwen3 layer at T = 512). */
static void fe_zero_ahead(fe *f, cg_block *b)
{
	lw *L = f->L;
	const ein E = f->E;
	const group gb = f->P.gb, gm = f->P.gm;
	int g, c = newvar(L, CT_I64);
	int64_t rowst = E.ost[gm.l[0]];
	cg_block *zb = loopv(L, b, &g, ic(L, 0), ic(L, E.size[gb.l[0]]));
	par_if_big(b, ir_numel(f->n));
	set(L, zb, c, clamp_count(L, ld(L, L->p->node_buf[f->n->valid], vr(L, g)), E.size[gm.l[0]]));
	cg_expr *slab = mul64(L, vr(L, g), f->os[0]);
	zero_range(L, zb, f->out, add64(L, slab, mul64(L, vr(L, c), rowst)),
		add64(L, mul64(L, vr(L, g), f->os[0]), ic(L, E.size[gm.l[0]] * rowst)));
}

/* The batch loops (the first bounded by the valid count when the batch is
 * masked); returns the innermost body. */
static cg_block *fe_batch_loops(fe *f, cg_block *b)
{
	lw *L = f->L;
	const ein E = f->E;
	const group gb = f->P.gb;
	cg_block *in = b;
	for (int i = 0; i < gb.n; i++) {
		int l = gb.l[i];
		cg_expr *hi = ic(L, E.size[l]);
		if (i == 0 && f->P.mask_batch) {
			int cnt = newvar(L, CT_I64);
			set(L, in, cnt, clamp_count(L, ld(L, L->p->node_buf[f->n->valid], ic(L, 0)), E.size[l]));
			hi = vr(L, cnt);
			cg_block *body = loopv(L, in, &f->lv[l], ic(L, 0), hi);
			if (!L->nozero[L->cur])
				zero_range(L, in, f->out, mul64(L, vr(L, cnt), f->os[0]), ic(L, ir_numel(f->n)));
			in = body;
			continue;
		}
		cg_block *outer = in;
		in = loopv(L, in, &f->lv[l], ic(L, 0), hi);
		if (f->bpar) /* blocks write disjoint panels, accumulators and outputs */
			outer->last->par = true;
	}
	return in;
}

/* The batch element's m0 row count (f->mcnt; rows past it zeroed unless
 * done ahead) and the branch taken when it has rows; returns its body, in
 * which f->rows is the panel's row count. */
static cg_block *fe_rows(fe *f, cg_block *in)
{
	lw *L = f->L;
	const ein E = f->E;
	const group gb = f->P.gb;
	int m0 = f->P.gm.l[0];
	f->mcnt = newvar(L, CT_I64);
	if (f->P.mask_m) {
		cg_expr *v = ld(L, L->p->node_buf[f->n->valid], gb.n ? vr(L, f->lv[gb.l[0]]) : ic(L, 0));
		set(L, in, f->mcnt, clamp_count(L, v, E.size[m0]));
		/* zero rows m0 >= mcnt of this batch element's output slab */
		cg_expr *slab = gb.n ? mul64(L, vr(L, f->lv[gb.l[0]]), f->os[0]) : NULL;
		int64_t rowst = E.ost[m0];
		if (!L->nozero[L->cur] && !f->zero_ahead)
			zero_range(L, in, f->out, add64(L, slab, mul64(L, vr(L, f->mcnt), rowst)),
				add64(L, slab, ic(L, E.size[m0] * rowst)));
	} else {
		set(L, in, f->mcnt, ic(L, E.size[m0]));
	}
	cg_stmt *blk = iff(L, in, bin(L, CE_GT, vr(L, f->mcnt), ic(L, 0)));
	cg_block *bb = &blk->body;
	comment(L, in, "block with rows: pack, multiply, store");
	f->rows = newvar(L, CT_I64);
	set(L, bb, f->rows, mul64(L, vr(L, f->mcnt), f->m0rest));
	return bb;
}

/* Packs A's valid rows into the panel: rows in m-group order, k in k-group
 * order; with one m and one k letter the row and column are the loop
 * variables, and the rows a parallel loop when the panel is big. */
static void fe_pack_a(fe *f, cg_block *bb)
{
	lw *L = f->L;
	const ein E = f->E;
	const group gm = f->P.gm, gk = f->P.gk;
	int *lv = f->lv, ia = f->P.ia;
	bool direct = gm.n == 1 && gk.n == 1;
	cg_block *pb = bb;
	int r = -1, kk = -1;
	if (!direct) {
		r = newvar(L, CT_I64);
		set(L, pb, r, ic(L, 0));
	}
	for (int i = 0; i < gm.n; i++)
		pb = loopv(L, pb, &lv[gm.l[i]], ic(L, 0), i == 0 ? vr(L, f->mcnt) : ic(L, E.size[gm.l[i]]));
	if (direct && !f->bpar)
		par_if_big(bb, f->M * f->K);
	else {
		kk = newvar(L, CT_I64);
		set(L, pb, kk, ic(L, 0));
	}
	cg_block *kb = pb;
	for (int i = 0; i < gk.n; i++)
		kb = loopv(L, kb, &lv[gk.l[i]], ic(L, 0), ic(L, E.size[gk.l[i]]));
	cg_expr *ai = NULL;
	for (int dd = 0; dd < E.e.rank[ia]; dd++) {
		int l = E.e.in[ia][dd] - 'a';
		ai = add64(L, ai, mul64(L, vr(L, lv[l]), E.st[ia][l]));
	}
	cg_expr *pr = vr(L, direct ? lv[gm.l[0]] : r), *pk = vr(L, direct ? lv[gk.l[0]] : kk);
	store(L, kb, f->apan, add64(L, f->aoff, add64(L, mul64(L, pr, f->AS), pk)), ld(L, f->A, ai));
	comment(L, bb, f->abf ? "pack A rows (bf16 stays bf16)" : "pack A rows to f32");
	if (!direct) {
		set(L, kb, kk, add64(L, vr(L, kk), ic(L, 1)));
		set(L, pb, r, add64(L, vr(L, r), ic(L, 1)));
	}
}

/* One group of dot tiles of the column tile at n0 (nt columns) straight
 * from B (through the fused gather's index widx when B is gathered). */
static void fe_dot(fe *f, cg_block *nb, int widx, int tile, int n0, int nt)
{
	lw *L = f->L;
	const ein E = f->E;
	int ib = f->P.ib;
	cg_prog *p = L->p;
	cg_expr *wi = NULL;
	for (int dd = 0; dd < E.e.rank[ib]; dd++) {
		int l = E.e.in[ib][dd] - 'a';
		cg_expr *pos = f->fused && dd == 0 ? vr(L, widx) :
			       l == f->lastn	       ? vr(L, n0) :
			       f->P.role[l] == 'k'     ? NULL :
							 vr(L, f->lv[l]);
		if (pos)
			wi = add64(L, wi, mul64(L, pos, E.st[ib][l]));
	}
	cg_stmt *s = st(L, nb, CS_DOT);
	cg_dot *d = ir_alloc(&p->arena, sizeof *d);
	cg_expr *di = mul64(L, vr(L, f->bpar ? f->bat : tile), f->M * f->NT);
	*d = (cg_dot){f->apan, f->B, f->acc, vr(L, f->rows), vr(L, nt), f->aoff ? f->aoff : ic(L, 0), wi ? wi : ic(L, 0),
		di, f->K, f->AS, E.st[ib][f->lastn], DOT_GROUP, DOT_LANES, f->NT};
	s->dot = d;
	comment(L, nb, "a group of tiles of dot products, k ascending per element");
}

/* Without dot tiles: B's column panel [K, NT] widened to f32, the
 * accumulators zeroed, then acc[r, j] += A[r, k] * B[k, j], k ascending in
 * tiles of EIN_KT. */
static void fe_panels(fe *f, cg_block *nb, int n0, int nt)
{
	lw *L = f->L;
	const ein E = f->E;
	const group gk = f->P.gk;
	int ib = f->P.ib, *lv = f->lv;
	int64_t NT = f->NT, K = f->K, KT = EIN_KT;
	{ /* pack B panel: [K, NT] */
		int kk = newvar(L, CT_I64), j;
		set(L, nb, kk, ic(L, 0));
		cg_block *kb = nb;
		for (int i = 0; i < gk.n; i++)
			kb = loopv(L, kb, &lv[gk.l[i]], ic(L, 0), ic(L, E.size[gk.l[i]]));
		cg_block *jb = loopv(L, kb, &j, ic(L, 0), vr(L, nt));
		cg_expr *bi = NULL;
		for (int dd = 0; dd < E.e.rank[ib]; dd++) {
			int l = E.e.in[ib][dd] - 'a';
			cg_expr *pos = l == f->lastn ? add64(L, vr(L, n0), vr(L, j)) : vr(L, lv[l]);
			bi = add64(L, bi, mul64(L, pos, E.st[ib][l]));
		}
		store(L, jb, f->bpan, add64(L, mul64(L, vr(L, kk), NT), vr(L, j)), ld(L, f->B, bi));
		set(L, kb, kk, add64(L, vr(L, kk), ic(L, 1)));
		comment(L, nb, "pack a B column panel to f32");
	}
	{ /* zero accumulators */
		int r, j;
		cg_block *rb = loopv(L, nb, &r, ic(L, 0), vr(L, f->rows));
		cg_block *jb = loopv(L, rb, &j, ic(L, 0), vr(L, nt));
		store(L, jb, f->acc, add64(L, mul64(L, vr(L, r), NT), vr(L, j)), fc(L, -0.0f));
	}
	{ /* acc[r, j] += A[r, k] * B[k, j], k ascending */
		int kt, r, k, j, kend = newvar(L, CT_I64), av = newvar(L, CT_F32);
		int64_t nkt = (K + KT - 1) / KT;
		cg_block *tb = loopv(L, nb, &kt, ic(L, 0), ic(L, nkt));
		set(L, tb, kend, bin(L, CE_MIN, add64(L, mul64(L, vr(L, kt), KT), ic(L, KT)), ic(L, K)));
		cg_block *rb = loopv(L, tb, &r, ic(L, 0), vr(L, f->rows));
		cg_block *kb = loopv(L, rb, &k, mul64(L, vr(L, kt), KT), vr(L, kend));
		set(L, kb, av, ld(L, f->apan, add64(L, mul64(L, vr(L, r), f->AS), vr(L, k))));
		cg_block *jb = loopv(L, kb, &j, ic(L, 0), vr(L, nt));
		cg_expr *ai = add64(L, mul64(L, vr(L, r), NT), vr(L, j));
		cg_expr *prod = bin(L, CE_MUL, vr(L, av), ld(L, f->bpan, add64(L, mul64(L, vr(L, k), NT), vr(L, j))));
		store(L, jb, f->acc, ai, bin(L, CE_ADD, ld(L, f->acc, ai), prod));
		comment(L, nb, "multiply the panel, k ascending per element");
	}
}

/* Where the fused gather's block is past its count (zb), B is +0: the same
 * sums of zero products, tile by tile (*tile: the new tile loop's
 * variable), into the accumulators; returns the tile loop's body. */
static cg_block *fe_zero_b(fe *f, cg_block *zb, int *tile, int n0, int nt)
{
	lw *L = f->L;
	const ein E = f->E;
	const group gn = f->P.gn;
	int64_t NT = f->NT, K = f->K;
	cg_block *sbase = zb;
	for (int i = 0; i < gn.n - 1; i++)
		sbase = loopv(L, sbase, &f->lv[gn.l[i]], ic(L, 0), ic(L, E.size[gn.l[i]]));
	sbase = loopv(L, sbase, tile, ic(L, 0), ic(L, f->ntiles));
	set(L, sbase, n0, mul64(L, vr(L, *tile), NT));
	set(L, sbase, nt, bin(L, CE_MIN, bin(L, CE_SUB, ic(L, f->NL), vr(L, n0)), ic(L, NT)));
	int r, j, k, sv = newvar(L, CT_F32);
	cg_block *rb = loopv(L, sbase, &r, ic(L, 0), vr(L, f->rows));
	cg_block *jb = loopv(L, rb, &j, ic(L, 0), vr(L, nt));
	set(L, jb, sv, fc(L, -0.0f));
	cg_block *kb = loopv(L, jb, &k, ic(L, 0), ic(L, K));
	set(L, kb, sv,
		bin(L, CE_ADD, vr(L, sv),
			bin(L, CE_MUL, ld(L, f->apan, add64(L, f->aoff, add64(L, mul64(L, vr(L, r), f->AS), vr(L, k)))),
				fc(L, 0.0f))));
	store(L, jb, f->acc, accidx(L, f->bat, f->dot, *tile, f->M, NT, r, j), vr(L, sv));
	return sbase;
}

/* Stores the tile's rows of the accumulators into the output. */
static void fe_store(fe *f, cg_block *sbase, int tile, int n0, int nt)
{
	lw *L = f->L;
	const ein E = f->E;
	const group gm = f->P.gm;
	int r = newvar(L, CT_I64), j;
	set(L, sbase, r, ic(L, 0));
	cg_block *sb = sbase;
	for (int i = 0; i < gm.n; i++)
		sb = loopv(L, sb, &f->lv[gm.l[i]], ic(L, 0), i == 0 ? vr(L, f->mcnt) : ic(L, E.size[gm.l[i]]));
	cg_block *jb = loopv(L, sb, &j, ic(L, 0), vr(L, nt));
	cg_expr *oi = NULL;
	for (int dd = 0; dd < E.e.out_rank; dd++) {
		int l = E.e.out[dd] - 'a';
		cg_expr *pos = l == f->lastn ? add64(L, vr(L, n0), vr(L, j)) : vr(L, f->lv[l]);
		oi = add64(L, oi, mul64(L, pos, E.ost[l]));
	}
	store(L, jb, f->out, oi, ld(L, f->acc, accidx(L, f->bat, f->dot, tile, f->M, f->NT, r, j)));
	set(L, sb, r, add64(L, vr(L, r), ic(L, 1)));
}

/* The buffers and sizes of the fast path for n (f->E, f->P set). */
static void fe_setup(fe *f, lw *L, const ir_node *n, int out)
{
	cg_prog *p = L->p;
	const ein E = f->E;
	const ein_plan *P = &f->P;
	f->L = L, f->n = n, f->out = out;
	f->dot = ein_dot_ok(&E, P);
	moe_id bnode = n->args[P->ib];
	f->fused = L->fused[bnode];
	IR_ASSERT(!f->fused || f->dot);
	f->gnode = f->fused ? nd(L, bnode) : NULL;
	f->A = p->node_buf[n->args[P->ia]], f->B = f->fused ? p->node_buf[f->gnode->args[0]] : p->node_buf[bnode];
	for (int i = 0; i < 26; i++)
		f->lv[i] = -1;
	f->M = P->gm.size, f->K = P->gk.size;
	f->lastn = P->gn.l[P->gn.n - 1];
	f->NL = E.size[f->lastn];
	f->NT = f->dot ? DOT_GROUP * DOT_LANES : f->NL < EIN_NT ? f->NL : EIN_NT;
	f->ntiles = (f->NL + f->NT - 1) / f->NT;
	/* bf16 times bf16 dot tiles keep A in bf16 (exact): the LLVM emitter may
	 * then use the CPU's bf16 dot-product instructions (cgen.h, CS_DOT) */
	f->abf = f->dot && p->bufs[f->A].dtype == MOE_BF16 && p->bufs[f->B].dtype == MOE_BF16;
	/* a bf16 panel's rows are K + 32 elements apart: with K * 2 bytes a
	 * multiple of 4 KB, the rows a tile reads at one k would all fall in one
	 * set of the L1 cache and evict each other */
	f->AS = f->abf ? f->K + 32 : f->K;
	f->bpar = f->dot && P->gb.n == 1 && !P->mask_batch && E.size[P->gb.l[0]] >= BLOCK_PAR_MIN;
	int64_t nbat = f->bpar ? E.size[P->gb.l[0]] : 1;
	f->apan = cgen_scratch(L, f->abf ? MOE_BF16 : MOE_F32, nbat * f->M * f->AS);
	f->bpan = f->dot ? -1 : cgen_scratch(L, MOE_F32, f->K * f->NT);
	/* parallel blocks or dot tiles are independent: each has its own accumulators */
	int64_t accsz = f->bpar ? nbat * f->M * f->NT : f->M * f->NT * (f->dot ? f->ntiles : 1);
	f->acc = cgen_scratch(L, MOE_F32, accsz);
	strides_of(n, f->os);
	f->m0rest = f->M / E.size[P->gm.l[0]]; /* rows per m0 index */
	f->zero_ahead = P->mask_m && P->gb.n == 1 && !L->nozero[L->cur];
}

/* Fast path for float two-operand contractions: per batch element the valid
 * A rows are widened to f32 into a packed [M, K] panel. With one summed letter
 * contiguous in B, tiles of DOT_LANES output columns are computed by CS_DOT
 * straight from B (a gathered B operand is read through its index). Otherwise
 * B is widened into [K, NT] column panels and the inner loop runs along a
 * contiguous panel row. Either way every output element accumulates its
 * products in increasing k order, exactly as the generic loop. Returns false
 * when the equation does not fit. */
static bool lower_einsum_fast(lw *L, cg_block *b, const ir_node *n, int out, const ein *E0)
{
	fe st = {0}, *f = &st;
	if (!ein_analyze(L, n, E0, &f->P))
		return false;
	f->E = *E0;
	fe_setup(f, L, n, out);
	const group gb = f->P.gb, gn = f->P.gn;
	if (f->zero_ahead)
		fe_zero_ahead(f, b);
	cg_block *in = fe_batch_loops(f, b);
	f->bat = f->bpar ? f->lv[gb.l[0]] : -1;
	f->aoff = f->bpar ? mul64(L, vr(L, f->bat), f->M * f->AS) : NULL;
	cg_block *bb = fe_rows(f, in);
	fe_pack_a(f, bb);
	/* a fused gather: slab bexp[g] of its source, for g below its count */
	int widx = -1;
	cg_block *nb = bb;
	cg_block *zb = NULL; /* blocks past the gather's count: B is all +0 */
	if (f->fused) {
		int l0 = f->E.e.in[f->P.ib][0] - 'a';
		cg_expr *okc = NULL;
		if (f->gnode->valid != MOE_NONE)
			okc = bin(L, CE_LT, vr(L, f->lv[l0]),
				conv(L, ld(L, L->p->node_buf[f->gnode->valid], ic(L, 0)), CT_I64));
		widx = newvar(L, CT_I64);
		if (okc) {
			cg_stmt *s = iff(L, nb, okc);
			nb = &s->body;
			zb = &s->els;
		}
		set(L, nb, widx, conv(L, ld(L, L->p->node_buf[f->gnode->args[1]], vr(L, f->lv[l0])), CT_I64));
	}
	/* column panels: outer n letters, then tiles of the last n letter */
	for (int i = 0; i < gn.n - 1; i++)
		nb = loopv(L, nb, &f->lv[gn.l[i]], ic(L, 0), ic(L, f->E.size[gn.l[i]]));
	int n0, nt = newvar(L, CT_I64);
	int tile;
	cg_block *tb = nb;
	nb = loopv(L, nb, &tile, ic(L, 0), ic(L, f->ntiles));
	if (f->dot && !f->bpar) /* tiles write disjoint accumulators and output columns; no faults */
		tb->last->par = true;
	n0 = newvar(L, CT_I64);
	set(L, nb, n0, mul64(L, vr(L, tile), f->NT));
	set(L, nb, nt, bin(L, CE_MIN, bin(L, CE_SUB, ic(L, f->NL), vr(L, n0)), ic(L, f->NT)));
	if (f->dot)
		fe_dot(f, nb, widx, tile, n0, nt);
	else
		fe_panels(f, nb, n0, nt);
	fe_store(f, nb, tile, n0, nt);
	if (zb) {
		cg_block *sbase = fe_zero_b(f, zb, &tile, n0, nt);
		fe_store(f, sbase, tile, n0, nt);
	}
	return true;
}

void cgen_lower_einsum(lw *L, cg_block *b, const ir_node *n, int out)
{
	ein E;
	ein_setup(L, n, &E);
	if (!lower_einsum_fast(L, b, n, out, &E))
		lower_einsum_generic(L, b, n, out, &E);
}
