/* backend-tcp/lower.c: a graph after the `tcp` pipeline -> a TCP program.
 *
 * Placement: graph inputs, weights and outputs live in HBM; the dispatch
 * grid and the block results the combine reads back live in HBM; every other
 * value lives in DM, allocated first-fit per slice with liveness (freed after
 * its last use) and checked against the DM capacity.
 * Ops: elementwise ops, reductions, scans, softmax, one_hot and filter become
 * vector-engine passes (tu.vec) whose ALU chain respects the fixed stage
 * order; einsums become contraction passes with the second operand stationary
 * in TRF (double-buffered tiles loaded by the sub context); gather,
 * take_along and scatter become DMA gathers/scatters with index lists;
 * reshape, slice, broadcast are sequencer views (no data moves).
 * Blocks: nodes masked by the per-block valid rows (and the per-block weight
 * gathers masked by nblocks) form the block region, emitted once as a loop
 * over g < nblocks (a run-time count: blocks past it are skipped). Inside,
 * the next block's weights and rows are prefetched by DMA into the other half
 * of double buffers while the current block computes; when consecutive
 * blocks share an expert its weights are not fetched again. When two whole
 * experts per weight do not fit (half of DM), the weights feeding block
 * contractions are streamed: each TRF tile is DMA'd from HBM into a small
 * double buffer just before its sub load (tiling along F; docs 7.4). */
#include <string.h>

#include "backend-tcp/tcp_int.h"
/* TEMP-UNSPLIT */
bool tcpl_weight_leaf(const moe_graph *g, moe_id id);
typedef struct lw lw;
typedef struct val val;
bool tcpl_quant_in_region(const lw *c, moe_id id);
bool tcpl_quant_is_view(const lw *c, moe_id id);
bool tcpl_quant_no_buffer(const lw *c, moe_id id);
void tcpl_lower_qview(lw *c, moe_id id);
void tcpl_lower_dequant(lw *c, moe_id id);
bool tcpl_lower_fp8_einsum(lw *c, moe_id id);

enum { VK_NONE, VK_IMM, VK_IOTA, VK_VIEW };

/* Where a node's value is: an immediate, an iota, or a view of a tensor. */
typedef struct val {
	int kind;
	uint32_t imm;    /* VK_IMM: lane word (f32 bits or i32) */
	int axis;        /* VK_IOTA */
	int32_t t;       /* VK_VIEW */
	int64_t base;
	int64_t stride[MOE_MAX_RANK];
	moe_id owner;    /* node whose tensor this is (for liveness) */
	bool region;     /* per-block view: offset by a loop register */
	int reg;
	int64_t scale;
} val;

typedef struct dmblk {
	int64_t off, size;
	int32_t t;
} dmblk;

typedef struct lw {
	moe_ctx *ctx;
	const moe_graph *g;
	const moe_tcp_machine *m;
	tcp_program *p;
	int64_t S;
	val *v;
	bool *inreg;      /* node in the block region */
	bool *dep;        /* depends on the block region */
	bool *hbm_home;   /* value must live in HBM */
	bool *is_out;
	int64_t *last;    /* last emission position of an owner's uses */
	int64_t *pos;     /* emission position of each node */
	dmblk *live;
	uint32_t nlive, lcap;
	int64_t dm_peak;
	int64_t hbm_top;
	int next_reg;
	int trf_k;
	int32_t trf[2];
	int64_t trf_rows_cap, trf_cols;
	bool failed;
	/* fusions chosen before emission (plan_fusions) */
	bool *alias_cast;  /* a bf16 -> f32 cast read only by vector passes: a view of its source */
	moe_id *fused_into; /* mul (and the reshape after it) folded into this reduce_sum, or MOE_NONE */
	/* block region */
	moe_id rows, nblocks, bexp;
	bool *wstream;     /* per-block weight gather streamed in TRF-tile chunks (not held per expert) */
	/* dispatch by gather (plan_fusions): the grid scatter(0, pos, gather(x, tok))
	 * and the reshapes of it the block loop reads become an i32 list of each
	 * grid row's token, and every block gathers its rows of x directly.
	 * ggrid[i] = the scatter + 1 for those nodes, 0 otherwise; gdefer marks
	 * the token-row gather, which is never materialised. */
	moe_id *ggrid;
	bool *gdefer;
	int64_t G;
	int vreg_rows;
} lw;

enum { R_NB = 1, R_G, R_SLOT, R_E, R_NEXT, R_E2, R_S2, R_ROWS, R_T, R_IN, R_IN2, R_GMAX, R_FREE };

static void lerr(lw *c, moe_id n, const char *fmt, ...) MOE_PRINTF(3, 4);
static void lerr(lw *c, moe_id n, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!c->failed)
		moe_diag(c->ctx, MOE_DIAG_ERROR, n == MOE_NONE ? c->g->loc : N(c->g, n)->loc, "tcp: %s", msg);
	c->failed = true;
}

static int64_t rup(int64_t a, int64_t b)
{
	return (a + b - 1) / b * b;
}

static int64_t esz(int dt)
{
	return (int64_t)moe_dtype_size((moe_dtype)dt);
}

/* ---- memory ---- */
static int32_t hbm_tensor(lw *c, const char *name, int kind, moe_dtype dt, int rank, const int64_t *shape)
{
	int32_t t = tcp_add_tensor(c->p, name, TCP_HBM, kind, dt, rank, shape);
	tcp_tensor *tt = &c->p->t[t];
	tt->addr = c->hbm_top;
	c->hbm_top = rup(c->hbm_top + tt->numel * esz(dt), c->m->hbm_granule);
	return t;
}

static int32_t dm_tensor(lw *c, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape)
{
	int32_t t = tcp_add_tensor(c->p, name, TCP_DM, TCP_T_SCRATCH, dt, rank, shape);
	tcp_tensor *tt = &c->p->t[t];
	int64_t need = rup((tt->numel * esz(dt) + c->S - 1) / c->S, c->m->flit_bytes);
	/* first fit between live blocks (kept sorted by offset) */
	int64_t off = 0;
	uint32_t i = 0;
	for (; i < c->nlive; i++) {
		if (c->live[i].off - off >= need)
			break;
		off = c->live[i].off + c->live[i].size;
	}
	if (off + need > c->m->dm_bytes_per_slice) {
		lerr(c, at, "DM capacity exceeded: '%s' needs %lld bytes per slice at offset %lld, %lld per slice exist",
			name, (long long)need, (long long)off, (long long)c->m->dm_bytes_per_slice);
		off = 0;
	}
	ctx_grow(c->ctx, (void **)&c->live, &c->lcap, c->nlive + 1, sizeof *c->live);
	memmove(&c->live[i + 1], &c->live[i], (c->nlive - i) * sizeof *c->live);
	c->live[i] = (dmblk){off, need, t};
	c->nlive++;
	tt->addr = off;
	tt->slice_bytes = need;
	if (off + need > c->dm_peak)
		c->dm_peak = off + need;
	return t;
}

static void dm_free(lw *c, int32_t t)
{
	for (uint32_t i = 0; i < c->nlive; i++)
		if (c->live[i].t == t) {
			memmove(&c->live[i], &c->live[i + 1], (c->nlive - i - 1) * sizeof *c->live);
			c->nlive--;
			return;
		}
}

static int new_reg(lw *c, moe_id at)
{
	if (c->next_reg >= TCP_NREG) {
		lerr(c, at, "out of scalar registers");
		return R_T;
	}
	return c->next_reg++;
}

/* ---- views ---- */
static void contiguous(const int64_t *shape, int rank, int64_t *stride)
{
	int64_t s = 1;
	for (int i = rank - 1; i >= 0; i--) {
		stride[i] = shape[i] == 1 ? 0 : s;
		s *= shape[i];
	}
}

static bool is_contig(const val *v, const ir_node *n)
{
	int64_t s = 1;
	for (int i = n->rank - 1; i >= 0; i--) {
		if (n->shape[i] != 1 && v->stride[i] != s)
			return false;
		s *= n->shape[i];
	}
	return true;
}

static val tview(int32_t t, moe_id owner, const ir_node *n)
{
	val v;
	memset(&v, 0, sizeof v);
	v.kind = VK_VIEW;
	v.t = t;
	v.owner = owner;
	v.reg = -1;
	contiguous(n->shape, n->rank, v.stride);
	return v;
}

/* A sequencer view of value v (of node shape n) broadcast into iteration
 * dims: iteration dim k maps to node dim map[k] (-1: broadcast). */
static tcp_view mkview(const val *v, const ir_node *n, int ndim, const int *map)
{
	tcp_view tv = tcp_view_none();
	tv.t = v->t;
	tv.base = v->base;
	tv.reg = v->region ? v->reg : -1;
	tv.scale = v->region ? v->scale : 0;
	for (int k = 0; k < ndim; k++)
		tv.stride[k] = map[k] >= 0 && n->shape[map[k]] > 1 ? v->stride[map[k]] : 0;
	return tv;
}

/* numpy broadcasting: node dim for each of ndim iteration dims (aligned right) */
static void bmap(const ir_node *n, int ndim, int *map)
{
	for (int k = 0; k < ndim; k++) {
		int d = k - (ndim - n->rank);
		map[k] = d >= 0 ? d : -1;
	}
}

static uint32_t imm_of(const ir_node *n, double v)
{
	if (moe_dtype_is_float((moe_dtype)n->dtype)) {
		float f = (float)v;
		if (n->dtype == MOE_BF16)
			f = moe_bf16_to_f32(moe_f32_to_bf16(f));
		uint32_t u;
		memcpy(&u, &f, 4);
		return u;
	}
	return (uint32_t)(int32_t)v;
}

/* ---- emission helpers ---- */
static void emit(lw *c, tcp_insn *in)
{
	tcp_emit(c->p, in);
}

static void li(lw *c, int rd, int64_t v)
{
	tcp_insn in = tcp_insn_init(TCP_OP_LI);
	in.rd = (uint8_t)rd;
	in.imm = v;
	emit(c, &in);
}

static void alui(lw *c, tcp_sop op, int rd, int ra, int rb, int64_t imm)
{
	tcp_insn in = tcp_insn_init(TCP_OP_ALU);
	in.sop = (uint8_t)op;
	in.rd = (uint8_t)rd;
	in.ra = (uint8_t)ra;
	in.rb = (uint8_t)rb;
	in.imm = imm;
	emit(c, &in);
}

static uint32_t br(lw *c, tcp_cond cc, int ra, int rb)
{
	tcp_insn in = tcp_insn_init(TCP_OP_BR);
	in.sop = (uint8_t)cc;
	in.ra = (uint8_t)ra;
	in.rb = (uint8_t)rb;
	in.target = -1;
	emit(c, &in);
	return c->p->ncode - 1;
}

static uint32_t jmp(lw *c)
{
	tcp_insn in = tcp_insn_init(TCP_OP_JMP);
	in.target = -1;
	emit(c, &in);
	return c->p->ncode - 1;
}

static void patch(lw *c, uint32_t at)
{
	c->p->code[at].target = (int32_t)c->p->ncode;
}

static void ld(lw *c, int rd, int32_t t, int reg, int64_t base, int64_t scale)
{
	tcp_insn in = tcp_insn_init(TCP_OP_LD);
	in.rd = (uint8_t)rd;
	in.v[TCP_V_S0].t = t;
	in.v[TCP_V_S0].base = base;
	in.v[TCP_V_S0].reg = reg;
	in.v[TCP_V_S0].scale = reg >= 0 ? scale : 0;
	emit(c, &in);
}

/* Linear DMA of a contiguous run of n elements. */
static void dma_copy(lw *c, int32_t dt, int64_t dbase, int dreg, int64_t dscale, int32_t st, int64_t sbase, int sreg,
	int64_t sscale, int64_t n)
{
	tcp_insn in = tcp_insn_init(TCP_OP_DMA_COPY);
	in.ndim = 1;
	in.dim[0] = n;
	tcp_view *d = &in.v[TCP_V_DST], *s = &in.v[TCP_V_S0];
	d->t = dt;
	d->base = dbase;
	d->reg = dreg;
	d->scale = dreg >= 0 ? dscale : 0;
	d->stride[0] = 1;
	s->t = st;
	s->base = sbase;
	s->reg = sreg;
	s->scale = sreg >= 0 ? sscale : 0;
	s->stride[0] = 1;
	emit(c, &in);
}

/* The value of node id as a view in DM, copying from HBM if needed. */
static val *need_view(lw *c, moe_id id);
static val *dm_view(lw *c, moe_id id);

static val *dm_copy_of(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	val *v = &c->v[id];
	if (!is_contig(v, n)) {
		/* a strided or broadcast view (a bias read by every row): copy the
		 * whole HBM tensor once and keep the view's strides on the copy */
		const tcp_tensor *ht = &c->p->t[v->t];
		int64_t sh[MOE_MAX_RANK];
		memcpy(sh, ht->shape, sizeof sh);
		int32_t t = dm_tensor(c, id, "hbm-copy", (moe_dtype)ht->dtype, ht->rank, sh);
		dma_copy(c, t, 0, -1, 0, v->t, 0, -1, 0, c->p->t[t].numel);
		v->t = t;
		v->owner = id;
		v->region = false;
		return v;
	}
	/* the copy keeps the HBM tensor's element type: an aliased bf16 -> f32
	 * cast is a view of bf16 data (the fetch widens), so DMA moves bf16 */
	int32_t t = dm_tensor(c, id, "hbm-copy", (moe_dtype)c->p->t[v->t].dtype, n->rank, n->shape);
	dma_copy(c, t, 0, -1, 0, v->t, v->base, -1, 0, ir_numel(n));
	val nv = tview(t, v->owner, n);
	nv.owner = id;
	*v = nv;
	return v;
}

/* ---- vector passes ---- */
typedef struct vpass {
	int ndim;
	int64_t dim[TCP_MAXD];
	tcp_insn in;
	int nstream;
	int ctr; /* the iteration dimension the chain's counter operand reads, -1: none yet */
} vpass;

static void vp_init(vpass *vp, int ndim, const int64_t *dim)
{
	memset(vp, 0, sizeof *vp);
	vp->in = tcp_insn_init(TCP_OP_TU_VEC);
	vp->ctr = -1;
	vp->ndim = ndim;
	vp->in.ndim = (uint8_t)ndim;
	for (int k = 0; k < ndim; k++)
		vp->dim[k] = vp->in.dim[k] = dim[k];
}

/* An operand source for node id with its node dims mapped to iteration dims. */
typedef struct src {
	uint8_t s;
	uint32_t imm;
	uint8_t ctr;
} src;

/* force: fetch it as a stream even when it is an immediate or an iota */
static src vp_operand_f(lw *c, vpass *vp, moe_id id, const int *map, bool force)
{
	const ir_node *n = N(c->g, id);
	val *v = &c->v[id];
	src r = {TCP_SRC_NONE, 0, 0};
	if (force) {
		/* fall through to the stream below */
	} else if (v->kind == VK_IMM) {
		r.s = TCP_SRC_IMM;
		r.imm = v->imm;
		return r;
	}
	if (v->kind == VK_IOTA) {
		int k = 0;
		while (k < vp->ndim && !(map[k] == v->axis && n->shape[v->axis] > 1))
			k++;
		if (k == vp->ndim) {
			r.s = TCP_SRC_IMM; /* an iota along a dimension of size 1 is 0 */
			return r;
		}
		if (vp->ctr < 0 || vp->ctr == k) {
			vp->ctr = k;
			r.s = TCP_SRC_CTR;
			r.ctr = (uint8_t)k;
			return r;
		}
		/* a step reads one loop counter: a second iota along another
		 * dimension (iota(i) < iota(j)) is fetched as a tensor */
	}
	v = dm_view(c, id); /* tensor-unit passes fetch from DM */
	if (vp->nstream >= 3) {
		lerr(c, id, "a vector pass fetches at most three streams");
		return r;
	}
	vp->in.v[TCP_V_S0 + vp->nstream] = mkview(v, n, vp->ndim, map);
	r.s = (uint8_t)(TCP_SRC_S0 + vp->nstream++);
	return r;
}

static src vp_operand(lw *c, vpass *vp, moe_id id, const int *map)
{
	return vp_operand_f(c, vp, id, map, false);
}

static void vp_step(lw *c, vpass *vp, tcp_vop op, src x, src y, moe_id at)
{
	if (vp->in.nstep >= TCP_MAXSTEP) {
		lerr(c, at, "vector chain too long");
		return;
	}
	if (x.s == TCP_SRC_IMM && y.s == TCP_SRC_IMM && x.imm != y.imm) {
		lerr(c, at, "a vector step holds one immediate");
		return;
	}
	if (x.s == TCP_SRC_CTR && y.s == TCP_SRC_CTR && x.ctr != y.ctr) {
		lerr(c, at, "a vector step reads one loop counter");
		return;
	}
	tcp_step *s = &vp->in.step[vp->in.nstep++];
	s->op = (uint8_t)op;
	s->x = x.s;
	s->y = y.s;
	s->imm = x.s == TCP_SRC_IMM ? x.imm : y.imm;
	s->ctr = x.s == TCP_SRC_CTR ? x.ctr : y.ctr;
}

static src SV(void)
{
	return (src){TCP_SRC_V, 0, 0};
}

static src SI(uint32_t imm)
{
	return (src){TCP_SRC_IMM, imm, 0};
}

static src SN(void)
{
	return (src){TCP_SRC_NONE, 0, 0};
}

/* Commit to a fresh DM tensor for node id (out shape), with dst strides per dim. */
static void vp_commit(lw *c, vpass *vp, moe_id id, const tcp_view *dst, int vreg)
{
	vp->in.v[TCP_V_DST] = *dst;
	vp->in.vreg = vreg;
	emit(c, &vp->in);
}

static uint32_t f32bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

/* Destination value for node id: per-block buffer inside the region, a fresh DM tensor otherwise. */
static val *out_val(lw *c, moe_id id, moe_dtype dt);
static int valid_reg(lw *c, moe_id id);

/* Elementwise node -> one pass. */
static void lower_elem(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	vpass vp;
	vp_init(&vp, n->rank, n->shape);
	if (n->rank == 0) {
		vp.ndim = 1;
		vp.in.ndim = 1;
		vp.dim[0] = vp.in.dim[0] = 1;
	}
	src a[3];
	int map[TCP_MAXD];
	for (uint32_t i = 0; i < n->nargs; i++) {
		const ir_node *o = N(c->g, n->args[i]);
		if (n->rank == 0)
			map[0] = -1;
		else
			bmap(o, n->rank, map);
		a[i] = vp_operand(c, &vp, n->args[i], map);
		/* a step holds one immediate: a second, different one is fetched
		 * (div(iota over a size-1 axis, 1) at T = 1) */
		for (uint32_t j = 0; j < i && a[i].s == TCP_SRC_IMM; j++)
			if (a[j].s == TCP_SRC_IMM && a[j].imm != a[i].imm)
				a[i] = vp_operand_f(c, &vp, n->args[i], map, true);
	}
	moe_dtype at = (moe_dtype)N(c->g, n->args[0])->dtype;
	bool fl = moe_dtype_is_float(at);
	tcp_vop op = TCP_V_COUNT;
	switch ((moe_op)n->op) {
	case MOE_OP_ADD: op = fl ? TCP_V_FADD : TCP_V_IADD; break;
	case MOE_OP_SUB: op = fl ? TCP_V_FSUB : TCP_V_ISUB; break;
	case MOE_OP_MUL: op = fl ? TCP_V_FMUL : TCP_V_IMUL; break;
	case MOE_OP_DIV: op = fl ? TCP_V_FDIV : TCP_V_IDIV; break;
	case MOE_OP_MIN: op = fl ? TCP_V_FMIN : TCP_V_IMIN; break;
	case MOE_OP_MAX: op = fl ? TCP_V_FMAX : TCP_V_IMAX; break;
	case MOE_OP_AND: op = TCP_V_AND; break;
	case MOE_OP_OR: op = TCP_V_OR; break;
	case MOE_OP_XOR: op = TCP_V_XOR; break;
	case MOE_OP_SHL: op = TCP_V_SHL; break;
	case MOE_OP_SHR: op = TCP_V_SHR; break;
	case MOE_OP_SAR: op = TCP_V_SAR; break;
	case MOE_OP_EQ: op = fl ? TCP_V_FTEQ : TCP_V_TEQ; break;
	case MOE_OP_NE: op = fl ? TCP_V_FTNE : TCP_V_TNE; break;
	case MOE_OP_LT: op = fl ? TCP_V_FTLT : TCP_V_TLT; break;
	case MOE_OP_LE: op = fl ? TCP_V_FTLE : TCP_V_TLE; break;
	case MOE_OP_GT: op = fl ? TCP_V_FTGT : TCP_V_TGT; break;
	case MOE_OP_GE: op = fl ? TCP_V_FTGE : TCP_V_TGE; break;
	default: break;
	}
	if (op != TCP_V_COUNT) {
		vp_step(c, &vp, op, a[0], a[1], id);
	} else {
		switch ((moe_op)n->op) {
		case MOE_OP_NEG:
			if (fl)
				vp_step(c, &vp, TCP_V_FNEG, a[0], SN(), id);
			else
				vp_step(c, &vp, TCP_V_ISUB, SI(0), a[0], id);
			break;
		case MOE_OP_ABS:
			if (fl) {
				vp_step(c, &vp, TCP_V_FABS, a[0], SN(), id);
			} else {
				vp_step(c, &vp, TCP_V_ISUB, SI(0), a[0], id);
				vp_step(c, &vp, TCP_V_IMAX, a[0], SV(), id);
			}
			break;
		case MOE_OP_EXP: vp_step(c, &vp, TCP_V_FEXP, a[0], SN(), id); break;
		case MOE_OP_LOG: vp_step(c, &vp, TCP_V_FLOG, a[0], SN(), id); break;
		case MOE_OP_SQRT: vp_step(c, &vp, TCP_V_FSQRT, a[0], SN(), id); break;
		case MOE_OP_TANH: vp_step(c, &vp, TCP_V_FTANH, a[0], SN(), id); break;
		case MOE_OP_ERF: vp_step(c, &vp, TCP_V_FERF, a[0], SN(), id); break;
		case MOE_OP_SIGMOID: vp_step(c, &vp, TCP_V_FSIGM, a[0], SN(), id); break;
		case MOE_OP_RSQRT:
			vp_step(c, &vp, TCP_V_FSQRT, a[0], SN(), id);
			vp_step(c, &vp, TCP_V_FDIV, SI(f32bits(1.0f)), SV(), id);
			break;
		case MOE_OP_NOT: vp_step(c, &vp, TCP_V_XOR, a[0], SI(at == MOE_BOOL ? 1u : 0xffffffffu), id); break;
		case MOE_OP_SELECT:
			if (a[1].s == TCP_SRC_IMM && a[2].s == TCP_SRC_IMM && a[1].imm != a[2].imm) {
				/* one immediate per step: the tag compares with 0 (no immediate) */
				vp_step(c, &vp, TCP_V_TNE, a[0], SI(0), id);
				lerr(c, id, "select between two different immediates is not lowered");
				break;
			}
			vp_step(c, &vp, at == MOE_BOOL || !fl ? TCP_V_TNE : TCP_V_FTNE, a[0], SI(0), id);
			vp_step(c, &vp, TCP_V_MERGE, a[1], a[2], id);
			break;
		case MOE_OP_CAST: {
			moe_dtype to = (moe_dtype)n->dtype;
			bool tf = moe_dtype_is_float(to);
			if (to == MOE_BOOL && at != MOE_BOOL)
				vp_step(c, &vp, fl ? TCP_V_FTNE : TCP_V_TNE, a[0], SI(0), id);
			else if (fl && !tf)
				vp_step(c, &vp, TCP_V_FTOI, a[0], SN(), id);
			else if (!fl && tf)
				vp_step(c, &vp, TCP_V_ITOF, a[0], SN(), id);
			else if (a[0].s == TCP_SRC_IMM || a[0].s == TCP_SRC_CTR)
				vp_step(c, &vp, TCP_V_OR, a[0], SI(0), id);
			break; /* float->float and int->int: the commit narrows */
		}
		case MOE_OP_BITCAST:
			if (a[0].s == TCP_SRC_IMM || a[0].s == TCP_SRC_CTR)
				vp_step(c, &vp, TCP_V_OR, a[0], SI(0), id);
			break; /* the lane word is copied unchanged */
		default: lerr(c, id, "op '%s' has no vector-engine lowering", moe_op_name((moe_op)n->op)); return;
		}
	}
	/* a chain must start from a fetched stream or compute v */
	if (vp.in.nstep == 0 && vp.nstream == 0)
		vp_step(c, &vp, TCP_V_OR, SI(0), SI(0), id);
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	int idm[TCP_MAXD];
	for (int k = 0; k < vp.ndim; k++)
		idm[k] = n->rank ? k : -1;
	tcp_view d = mkview(o, n, vp.ndim, idm);
	vp_commit(c, &vp, id, &d, valid_reg(c, id));
}

/* Reduction, scan, compaction, softmax pieces: dims = others + [axis]. */
static void axis_order(const ir_node *n, int axis, int *order)
{
	int r = 0;
	for (int i = 0; i < n->rank; i++)
		if (i != axis)
			order[r++] = i;
	order[r] = axis;
}

/* One pass over src node (or a tensor view) moving `axis` innermost.
 * keep_out: the output keeps the axis (scan/compact/elementwise) or drops it (reduce). */
static void row_pass(lw *c, moe_id id, const ir_node *srcn, const val *srcv, const val *src2, const ir_node *s2n,
	int axis, const tcp_vop *ops, const src *xs, const src *ys, int nops, uint8_t flags0, const val *dst,
	const ir_node *dstn, bool dst_keeps_axis)
{
	int order[MOE_MAX_RANK];
	axis_order(srcn, axis, order);
	vpass vp;
	int64_t dim[TCP_MAXD];
	for (int k = 0; k < srcn->rank; k++)
		dim[k] = srcn->shape[order[k]];
	vp_init(&vp, srcn->rank, dim);
	int map[TCP_MAXD];
	for (int k = 0; k < srcn->rank; k++)
		map[k] = order[k];
	vp.in.v[TCP_V_S0] = mkview(srcv, srcn, vp.ndim, map);
	vp.nstream = 1;
	if (src2) {
		int map2[TCP_MAXD];
		for (int k = 0; k < srcn->rank; k++) {
			int d = order[k] - (srcn->rank - s2n->rank);
			map2[k] = d >= 0 ? d : -1;
		}
		vp.in.v[TCP_V_S1] = mkview(src2, s2n, vp.ndim, map2);
		vp.nstream = 2;
	}
	for (int i = 0; i < nops; i++) {
		vp_step(c, &vp, ops[i], xs[i], ys[i], id);
		if (i == 0)
			vp.in.step[0].flags = flags0;
	}
	/* destination: same iteration order; a dropped axis has stride 0 */
	int dmap[TCP_MAXD];
	for (int k = 0; k < srcn->rank; k++) {
		int d = order[k];
		if (!dst_keeps_axis) {
			if (d == axis)
				d = -1;
			else if (dstn->rank < srcn->rank && d > axis)
				d--;
		}
		dmap[k] = d;
	}
	tcp_view dv = mkview(dst, dstn, vp.ndim, dmap);
	if (!dst_keeps_axis)
		dv.stride[vp.ndim - 1] = 0;
	if (axis == 0 && srcn->rank >= 2)
		vp.in.flags |= TCP_F_XSLICE; /* the axis is the one spread over slices */
	vp_commit(c, &vp, id, &dv, -1);
}

static int norm_axis(const ir_node *n, const ir_node *src, int64_t def)
{
	int64_t a = ir_attr_int(n, "axis", def);
	return ir_norm_axis((int)a, src->rank);
}

/* Operand k of the fused mul m, viewed in the shape of the reshape r that
 * follows m ([a*b, rest] -> [a, b, rest]). */
static bool fused_operand(lw *c, moe_id m, moe_id r, int k, val *out)
{
	const ir_node *mn = N(c->g, m), *rn = N(c->g, r), *on = N(c->g, mn->args[k]);
	val *v = dm_view(c, mn->args[k]);
	if (v->kind != VK_VIEW || v->region)
		return false;
	int map[MOE_MAX_RANK];
	bmap(on, mn->rank, map);
	int64_t st[MOE_MAX_RANK] = {0};
	for (int d = 0; d < mn->rank; d++)
		st[d] = map[d] >= 0 && on->shape[map[d]] > 1 ? v->stride[map[d]] : 0;
	*out = *v;
	out->stride[0] = st[0] * rn->shape[1];
	out->stride[1] = st[0];
	for (int d = 1; d < mn->rank; d++)
		out->stride[d + 1] = st[d];
	return true;
}

static void lower_reduce(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	int axis = norm_axis(n, s, -1);
	if (c->fused_into[n->args[0]] == id) {
		/* reduce_sum(reshape(mul(a, b))): one pass, f.mul then r.fsum, so the
		 * product (the size of the combine's gathered rows) never exists */
		moe_id r = n->args[0], m = N(c->g, r)->args[0];
		val a, b;
		if (!fused_operand(c, m, r, 0, &a) || !fused_operand(c, m, r, 1, &b)) {
			lerr(c, id, "fused multiply-reduce operands are not views");
			return;
		}
		val *o = out_val(c, id, (moe_dtype)n->dtype);
		tcp_vop ops[2] = {TCP_V_FMUL, TCP_V_FRSUM};
		src xs[2] = {{TCP_SRC_S0, 0, 0}, SV()}, ys[2] = {{TCP_SRC_S1, 0, 0}, SN()};
		row_pass(c, id, s, &a, &b, s, axis, ops, xs, ys, 2, 0, o, n, n->rank == s->rank);
		return;
	}
	bool fl = moe_dtype_is_float((moe_dtype)s->dtype);
	tcp_vop op = n->op == MOE_OP_REDUCE_SUM ? (fl ? TCP_V_FRSUM : TCP_V_RSUM)
		: n->op == MOE_OP_REDUCE_MAX   ? (fl ? TCP_V_FRMAX : TCP_V_RMAX)
					       : (fl ? TCP_V_FRMIN : TCP_V_RMIN);
	val *sv = dm_view(c, n->args[0]);
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	/* keepdims: the output has the axis with size 1, which mkview maps to stride 0 */
	src x = SV(), y = SN();
	x.s = TCP_SRC_S0;
	row_pass(c, id, s, sv, NULL, NULL, axis, &op, &x, &y, 1, 0, o, n, n->rank == s->rank);
}

static void lower_cumsum(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	int axis = norm_axis(n, s, 0);
	bool fl = moe_dtype_is_float((moe_dtype)s->dtype);
	tcp_vop op = fl ? TCP_V_FSCAN : TCP_V_ISCAN;
	val *sv = dm_view(c, n->args[0]);
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	src x = {TCP_SRC_S0, 0, 0}, y = SN();
	row_pass(c, id, s, sv, NULL, NULL, axis, &op, &x, &y, 1, ir_attr_int(n, "exclusive", 0) ? TCP_STEP_EXCL : 0, o,
		n, true);
}

static void lower_filter(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *mk = N(c->g, n->args[0]), *vn = N(c->g, n->args[1]);
	if (!ir_same_shape(mk, vn)) {
		/* broadcast operands: materialize through views of the output shape */
	}
	val *mv = dm_view(c, n->args[0]);
	val *vv = dm_view(c, n->args[1]);
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	tcp_vop ops[2] = {moe_dtype_is_float((moe_dtype)mk->dtype) ? TCP_V_FTNE : TCP_V_TNE, TCP_V_COMPACT};
	src xs[2] = {{TCP_SRC_S0, 0, 0}, {TCP_SRC_S1, 0, 0}};
	src ys[2] = {SI(0), SI(imm_of(n, ir_attr_float(n, "fill", (double)ir_attr_int(n, "fill", 0))))};
	row_pass(c, id, n, mv, vv, vn, n->rank - 1, ops, xs, ys, 2, 0, o, n, true);
	(void)vn;
}

static void lower_softmax(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	int axis = norm_axis(n, n, -1);
	val *xv = dm_view(c, n->args[0]);
	val xs = *xv;
	/* m = max along axis (kept as size 1), z = x - m, e = exp z, s = sum e, y = e / s */
	int64_t ks[MOE_MAX_RANK];
	memcpy(ks, n->shape, sizeof ks);
	ks[axis] = 1;
	ir_node kn = *n, fn = *n;
	memcpy(kn.shape, ks, sizeof ks);
	kn.dtype = fn.dtype = MOE_F32;
	int32_t tm = dm_tensor(c, id, "softmax.max", MOE_F32, n->rank, ks);
	int32_t tz = dm_tensor(c, id, "softmax.z", MOE_F32, n->rank, n->shape);
	int32_t ts = dm_tensor(c, id, "softmax.sum", MOE_F32, n->rank, ks);
	val vm = tview(tm, id, &kn), vz = tview(tz, id, &fn), vs = tview(ts, id, &kn);
	src s0 = {TCP_SRC_S0, 0, 0}, s1 = {TCP_SRC_S1, 0, 0}, sn = SN();
	tcp_vop op = TCP_V_FRMAX;
	row_pass(c, id, n, &xs, NULL, NULL, axis, &op, &s0, &sn, 1, 0, &vm, &kn, true);
	op = TCP_V_FSUB;
	row_pass(c, id, n, &xs, &vm, &kn, axis, &op, &s0, &s1, 1, 0, &vz, &fn, true);
	op = TCP_V_FEXP;
	row_pass(c, id, n, &vz, NULL, NULL, axis, &op, &s0, &sn, 1, 0, &vz, &fn, true);
	op = TCP_V_FRSUM;
	row_pass(c, id, n, &vz, NULL, NULL, axis, &op, &s0, &sn, 1, 0, &vs, &kn, true);
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	op = TCP_V_FDIV;
	row_pass(c, id, n, &vz, &vs, &kn, axis, &op, &s0, &s1, 1, 0, o, n, true);
	dm_free(c, tm);
	dm_free(c, tz);
	dm_free(c, ts);
}

static void lower_one_hot(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	vpass vp;
	vp_init(&vp, n->rank, n->shape);
	int map[TCP_MAXD];
	for (int k = 0; k < n->rank; k++)
		map[k] = k < n->rank - 1 ? k : -1;
	src a = vp_operand(c, &vp, n->args[0], map);
	src ct = {TCP_SRC_CTR, 0, (uint8_t)(n->rank - 1)};
	vp_step(c, &vp, TCP_V_TEQ, a, ct, id);
	val *o = out_val(c, id, MOE_I32);
	int idm[TCP_MAXD];
	for (int k = 0; k < n->rank; k++)
		idm[k] = k;
	tcp_view d = mkview(o, n, n->rank, idm);
	vp_commit(c, &vp, id, &d, -1);
}

/* Leaves used as tensors (a const or iota that must exist in memory). */
static void materialize(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	val keep = c->v[id];
	vpass vp;
	int64_t one = 1;
	vp_init(&vp, n->rank ? n->rank : 1, n->rank ? n->shape : &one);
	if (keep.kind == VK_IMM)
		vp_step(c, &vp, TCP_V_OR, SI(keep.imm), SI(keep.imm), id);
	else
		vp_step(c, &vp, TCP_V_IADD, (src){TCP_SRC_CTR, 0, (uint8_t)keep.axis}, SI(0), id);
	int32_t t = dm_tensor(c, id, "materialized", (moe_dtype)n->dtype, n->rank, n->shape);
	c->v[id] = tview(t, id, n);
	int idm[TCP_MAXD];
	for (int k = 0; k < vp.ndim; k++)
		idm[k] = n->rank ? k : -1;
	tcp_view d = mkview(&c->v[id], n, vp.ndim, idm);
	vp_commit(c, &vp, id, &d, -1);
}

static val *need_view(lw *c, moe_id id)
{
	val *v = &c->v[id];
	if (v->kind == VK_IMM || v->kind == VK_IOTA)
		materialize(c, id);
	v = &c->v[id];
	if (v->kind == VK_VIEW && !v->region && c->p->t[v->t].space == TCP_HBM) {
		/* TU passes read DM only */
		return v;
	}
	return v;
}

/* A DM view for a tensor-unit operand. */
static val *dm_view(lw *c, moe_id id)
{
	val *v = need_view(c, id);
	if (v->kind == VK_VIEW && c->p->t[v->t].space == TCP_HBM)
		v = dm_copy_of(c, id);
	return v;
}

/* ---- gathers and scatters ---- */
static void dma_gs(lw *c, tcp_opcode op, moe_id at, const val *dst, const val *srcv, const val *idx, int64_t groups,
	int64_t nidx, int64_t rows, int64_t row, int64_t sgstride, int64_t srstride, int64_t dgstride, int64_t drstride,
	int64_t igstride, int64_t istride, int vreg)
{
	tcp_insn in = tcp_insn_init(op);
	in.ndim = 3;
	in.dim[0] = groups;
	in.dim[1] = nidx;
	in.dim[2] = row;
	in.rows = rows;
	in.vreg = vreg;
	tcp_view *d = &in.v[TCP_V_DST], *s = &in.v[TCP_V_S0], *ix = &in.v[TCP_V_S1];
	d->t = dst->t;
	d->base = dst->base;
	d->stride[0] = dgstride;
	d->stride[1] = drstride;
	d->stride[2] = 1;
	s->t = srcv->t;
	s->base = srcv->base;
	s->stride[0] = sgstride;
	s->stride[1] = srstride;
	s->stride[2] = 1;
	ix->t = idx->t;
	ix->base = idx->base;
	ix->stride[0] = igstride;
	ix->stride[1] = istride;
	(void)at;
	emit(c, &in);
}

static int64_t prod(const int64_t *s, int a, int b)
{
	int64_t r = 1;
	for (int i = a; i < b; i++)
		r *= s[i];
	return r;
}

static void lower_gather(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *x = N(c->g, n->args[0]), *ix = N(c->g, n->args[1]);
	int axis = norm_axis(n, x, 0);
	val *xv = need_view(c, n->args[0]);
	if (!is_contig(xv, x)) {
		lerr(c, id, "gather from a strided view is not lowered");
		return;
	}
	val *iv = dm_view(c, n->args[1]);
	if (!is_contig(iv, ix)) {
		lerr(c, id, "gather with a strided index list is not lowered");
		return;
	}
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	int64_t groups = prod(x->shape, 0, axis), rows = x->shape[axis], row = prod(x->shape, axis + 1, x->rank);
	int64_t ni = ir_numel(ix);
	dma_gs(c, TCP_OP_DMA_GATHER, id, o, xv, iv, groups, ni, rows, row, rows * row, row, ni * row, row, 0, 1,
		valid_reg(c, id));
}

static void lower_take_along(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *x = N(c->g, n->args[0]), *ix = N(c->g, n->args[1]);
	int axis = norm_axis(n, x, -1);
	if (axis != x->rank - 1) {
		lerr(c, id, "take_along is lowered along the last axis only");
		return;
	}
	val *xv = need_view(c, n->args[0]);
	val *iv = dm_view(c, n->args[1]);
	if (!is_contig(xv, x) || !is_contig(iv, ix)) {
		lerr(c, id, "take_along of strided views is not lowered");
		return;
	}
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	int64_t groups = prod(x->shape, 0, axis), rows = x->shape[axis], k = ix->shape[ix->rank - 1];
	dma_gs(c, TCP_OP_DMA_GATHER, id, o, xv, iv, groups, k, rows, 1, rows, 1, k, 1, k, 1, -1);
}

static void lower_scatter(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *ix = N(c->g, n->args[1]);
	if (strcmp(ir_attr_str(n, "mode", "set"), "set")) {
		lerr(c, id, "scatter-add needs read-modify-write DMA, which is not modelled");
		return;
	}
	if (c->ggrid[id]) {
		/* dispatch by gather: row r of the grid is token rowlist[r] (0 for
		 * padding rows, which the block math masks) */
		const ir_node *xp = N(c->g, n->args[2]);
		int64_t rows = n->shape[0], ni = ir_numel(ix);
		ir_node rn = *n;
		rn.dtype = MOE_I32;
		rn.rank = 1;
		int32_t t = dm_tensor(c, id, "grid_rows", MOE_I32, 1, &rows);
		c->v[id] = tview(t, id, &rn);
		val *iv = dm_view(c, n->args[1]);
		val *tv = dm_view(c, xp->args[1]);
		if (!is_contig(iv, ix) || !is_contig(tv, N(c->g, xp->args[1]))) {
			lerr(c, id, "dispatch by gather with a strided index list is not lowered");
			return;
		}
		dma_gs(c, TCP_OP_DMA_SCATTER, id, &c->v[id], tv, iv, 1, ni, rows, 1, ni, 1, rows, 1, 0, 1, -1);
		return;
	}
	val *bv = &c->v[n->args[0]];
	bool zero_base = bv->kind == VK_IMM && bv->imm == 0;
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	if (!zero_base) {
		bv = need_view(c, n->args[0]);
		if (!is_contig(bv, N(c->g, n->args[0]))) {
			lerr(c, id, "scatter into a strided base is not lowered");
			return;
		}
		dma_copy(c, o->t, 0, -1, 0, bv->t, bv->base, -1, 0, ir_numel(n));
	}
	/* zero base: fresh tensors start zeroed (docs/tcp-isa.md, assumption A7) */
	val *iv = dm_view(c, n->args[1]);
	val *sv = need_view(c, n->args[2]);
	int64_t rows = n->shape[0], row = prod(n->shape, 1, n->rank), ni = ir_numel(ix);
	dma_gs(c, TCP_OP_DMA_SCATTER, id, o, sv, iv, 1, ni, rows, row, ni * row, row, rows * row, row, 0, 1, -1);
}

/* ---- contraction ---- */
static cplan plan_contract(lw *c, int64_t M, int64_t O, int64_t I, int wdt)
{
	return tcp_plan_contract(c->m, M, O, I, wdt, NULL);
}

/* dst[m, o] = sum_i a[m, i] w[o, i]: a (DM view, strides am, ai), w (DM view, wo, wi).
 * areg/wreg: loop offset registers for region views. */
static void emit_contract(lw *c, moe_id at, const cplan *pl, const tcp_view *a, int64_t am, int64_t ai,
	const tcp_view *w, int64_t wo, int64_t wi, const tcp_view *dst, int64_t dm_, int64_t do_, int wdt, int vreg,
	bool stream)
{
	int64_t nchunks = (pl->I + pl->It - 1) / pl->It, npass = (pl->O + pl->Opass - 1) / pl->Opass;
	int32_t acc = -1, wb = -1;
	int64_t wtile = pl->Opass * pl->It, wk = 0;
	if (stream) {
		/* w is the expert's weights in HBM: each TRF tile's [on, inn] part is
		 * DMA'd into one half of a double buffer just before its sub load */
		int64_t sh[2] = {2, wtile};
		wb = dm_tensor(c, at, "wbuf", (moe_dtype)wdt, 2, sh);
	}
	if (nchunks > 1) {
		int64_t sh[2] = {pl->M, pl->O};
		acc = dm_tensor(c, at, "contract.acc", MOE_F32, 2, sh);
	}
	int64_t trf_need = pl->Opass * pl->It;
	int64_t fp_need = rup(pl->Os * pl->It * esz(wdt), c->m->flit_bytes),
		share_need = rup((trf_need * esz(wdt) + c->S - 1) / c->S, c->m->flit_bytes);
	fp_need = fp_need > share_need ? fp_need : share_need;
	/* the TRF tiles are (re)declared for this tiling: a sub load costs the declared footprint */
	if (c->trf[0] < 0 || trf_need > c->trf_rows_cap || wdt != c->p->t[c->trf[0]].dtype ||
		c->p->t[c->trf[0]].slice_bytes != fp_need) {
		/* (re)declare the two TRF tiles large enough for this contraction */
		int64_t sh[2] = {pl->Opass, pl->It};
		int64_t e = wdt == MOE_F32 ? 4 : 2;
		int64_t half = tcp_trf_bytes(c->m) / 2;
		for (int k = 0; k < 2; k++) {
			c->trf[k] = tcp_add_tensor(c->p, k ? "trf.1" : "trf.0", TCP_TRF, TCP_T_SCRATCH, (moe_dtype)wdt, 2, sh);
			c->p->t[c->trf[k]].addr = k * half;
			int64_t fp = rup(pl->Os * pl->It * e, c->m->flit_bytes);
			int64_t share = rup((trf_need * esz(wdt) + c->S - 1) / c->S, c->m->flit_bytes);
			c->p->t[c->trf[k]].slice_bytes = fp > share ? fp : share;
		}
		c->trf_rows_cap = trf_need;
	}
	for (int64_t ps = 0; ps < npass; ps++) {
		int64_t o0 = ps * pl->Opass, on = pl->O - o0 < pl->Opass ? pl->O - o0 : pl->Opass;
		for (int64_t ch = 0; ch < nchunks; ch++) {
			int64_t i0 = ch * pl->It, inn = pl->I - i0 < pl->It ? pl->I - i0 : pl->It;
			int32_t tt = c->trf[c->trf_k];
			c->trf_k ^= 1;
			tcp_insn ld_ = tcp_insn_init(TCP_OP_SUB_TRF);
			ld_.ndim = 2;
			ld_.dim[0] = on;
			ld_.dim[1] = inn;
			ld_.v[TCP_V_DST].t = tt;
			ld_.v[TCP_V_DST].stride[0] = inn;
			ld_.v[TCP_V_DST].stride[1] = 1;
			ld_.v[TCP_V_S0] = *w;
			ld_.v[TCP_V_S0].base += o0 * wo + i0 * wi;
			ld_.v[TCP_V_S0].stride[0] = wo;
			ld_.v[TCP_V_S0].stride[1] = wi;
			if (stream) {
				tcp_insn dm = tcp_insn_init(TCP_OP_DMA_COPY);
				dm.ndim = 2;
				dm.dim[0] = on;
				dm.dim[1] = inn;
				dm.v[TCP_V_DST] = tcp_view_none();
				dm.v[TCP_V_DST].t = wb;
				dm.v[TCP_V_DST].base = wk * wtile;
				dm.v[TCP_V_DST].stride[0] = inn;
				dm.v[TCP_V_DST].stride[1] = 1;
				dm.v[TCP_V_S0] = ld_.v[TCP_V_S0];
				if (ps > 0 || ch > 0) /* the contraction's tiles form one descriptor list */
					dm.flags |= TCP_F_JOIN;
				emit(c, &dm);
				ld_.v[TCP_V_S0] = dm.v[TCP_V_DST];
				wk ^= 1;
			}
			emit(c, &ld_);
			tcp_insn in = tcp_insn_init(TCP_OP_TU_CONTRACT);
			in.ndim = 3;
			in.dim[0] = pl->M;
			in.dim[1] = on;
			in.dim[2] = inn;
			in.tile = pl->Os < on ? pl->Os : on;
			in.vreg = vreg;
			if (wdt == MOE_F32)
				in.flags |= TCP_F_BF16X3;
			tcp_view *s0 = &in.v[TCP_V_S0];
			*s0 = *a;
			s0->base += i0 * ai;
			s0->stride[0] = am;
			s0->stride[1] = 0;
			s0->stride[2] = ai;
			tcp_view *s1 = &in.v[TCP_V_S1];
			s1->t = tt;
			s1->stride[0] = 0;
			s1->stride[1] = inn;
			s1->stride[2] = 1;
			bool last = ch == nchunks - 1;
			tcp_view *d = &in.v[TCP_V_DST];
			if (last) {
				*d = *dst;
				d->base += o0 * do_;
				d->stride[0] = dm_;
				d->stride[1] = do_;
			} else {
				*d = tcp_view_none();
				d->t = acc;
				d->base = o0;
				d->stride[0] = pl->O;
				d->stride[1] = 1;
			}
			d->stride[2] = 0;
			if (ch > 0) {
				in.flags |= TCP_F_ACC;
				tcp_view *s2 = &in.v[TCP_V_S2];
				*s2 = tcp_view_none();
				s2->t = acc;
				s2->base = o0;
				s2->stride[0] = pl->O;
				s2->stride[1] = 1;
			}
			emit(c, &in);
		}
	}
	if (acc >= 0)
		dm_free(c, acc);
	if (wb >= 0)
		dm_free(c, wb);
}

static void lower_einsum(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (tcpl_lower_fp8_einsum(c, id))
		return;
	if (n->nargs != 2) {
		lerr(c, id, "one-operand einsum has no TCP lowering");
		return;
	}
	ir_einsum e;
	char msg[128];
	if (!ir_einsum_parse(ir_attr_str(n, "eq", ""), &e, msg, sizeof msg)) {
		lerr(c, id, "einsum: %s", msg);
		return;
	}
	/* classify: batch (a, w, out), m (a, out), o (w, out), i (a, w) */
	int cb = -1, cm = -1, co = -1, ci_ = -1, nb = 0, nm = 0, no = 0, ni = 0;
	for (int l = 0; l < e.nletters; l++) {
		char ch = e.letters[l];
		bool ia = memchr(e.in[0], ch, (size_t)e.rank[0]) != NULL, iw = memchr(e.in[1], ch, (size_t)e.rank[1]) != NULL,
		     io = memchr(e.out, ch, (size_t)e.out_rank) != NULL;
		if (ia && iw && io)
			cb = l, nb++;
		else if (ia && io)
			cm = l, nm++;
		else if (iw && io)
			co = l, no++;
		else if (ia && iw)
			ci_ = l, ni++;
		else {
			lerr(c, id, "einsum '%s': a letter summed from one operand only is not lowered", ir_attr_str(n, "eq", ""));
			return;
		}
	}
	if (nb > 1 || nm != 1 || no != 1 || ni != 1) {
		lerr(c, id, "einsum '%s' is not of the form [b]mi,[b]oi->[b]mo", ir_attr_str(n, "eq", ""));
		return;
	}
	const ir_node *an = N(c->g, n->args[0]), *wn = N(c->g, n->args[1]);
	if (an->dtype != MOE_BF16 && an->dtype != MOE_F32) {
		lerr(c, id, "contraction operands must be bf16 or f32");
		return;
	}
	int pos_a[4], pos_w[4], pos_o[4]; /* b m o i -> dim index */
	int letters[4] = {cb, cm, co, ci_};
	for (int k = 0; k < 4; k++) {
		pos_a[k] = pos_w[k] = pos_o[k] = -1;
		if (letters[k] < 0)
			continue;
		char ch = e.letters[letters[k]];
		const char *pa = memchr(e.in[0], ch, (size_t)e.rank[0]), *pw = memchr(e.in[1], ch, (size_t)e.rank[1]),
			   *po = memchr(e.out, ch, (size_t)e.out_rank);
		pos_a[k] = pa ? (int)(pa - e.in[0]) : -1;
		pos_w[k] = pw ? (int)(pw - e.in[1]) : -1;
		pos_o[k] = po ? (int)(po - e.out) : -1;
	}
	bool region = c->inreg[id];
	if (region && cb >= 0) {
		/* per block the leading batch letter (the block index) is gone */
		if (pos_a[0] != 0 || pos_w[0] != 0 || pos_o[0] != 0) {
			lerr(c, id, "block einsum must have the block index first");
			return;
		}
		for (int k = 1; k < 4; k++) {
			pos_a[k] -= pos_a[k] >= 0;
			pos_w[k] -= pos_w[k] >= 0;
			pos_o[k] -= pos_o[k] >= 0;
		}
	}
	val *av = dm_view(c, n->args[0]);
	val avs = *av;
	bool stream = region && c->wstream[n->args[1]];
	/* a large weight outside the block loop (a shared expert) is streamed
	 * from HBM tile by tile instead of copied whole into DM */
	val *hv = !region && wn->op == MOE_OP_WEIGHT && cb < 0 && ir_bytes(wn) * 8 >= c->m->dm_bytes_per_slice * c->S ?
		need_view(c, n->args[1]) : NULL;
	bool hstream = hv && hv->kind == VK_VIEW && c->p->t[hv->t].space == TCP_HBM;
	stream |= hstream;
	val *wv = hstream ? hv : stream ? &c->v[n->args[1]] : dm_view(c, n->args[1]);
	val wvs = *wv;
	val *ov = out_val(c, id, (moe_dtype)n->dtype);
	val ovs = *ov;
	int64_t M = an->shape[pos_a[1]], I = an->shape[pos_a[3]], O = wn->shape[pos_w[2]];
	cplan pl = plan_contract(c, M, O, I, an->dtype);
	int64_t nbat = cb >= 0 && !region ? an->shape[pos_a[0]] : 1;
	for (int64_t b = 0; b < nbat; b++) {
		int dimmap[TCP_MAXD];
		for (int k = 0; k < an->rank; k++)
			dimmap[k] = k;
		tcp_view a = mkview(&avs, an, an->rank, dimmap), w = mkview(&wvs, wn, wn->rank, dimmap);
		tcp_view d = mkview(&ovs, n, n->rank, dimmap);
		int64_t am = avs.stride[pos_a[1]], ai = avs.stride[pos_a[3]], wo = wvs.stride[pos_w[2]],
			wi = wvs.stride[pos_w[3]], dmm = ovs.stride[pos_o[1]], doo = ovs.stride[pos_o[2]];
		if (cb >= 0 && !region) {
			a.base += b * avs.stride[pos_a[0]];
			w.base += b * wvs.stride[pos_w[0]];
			d.base += b * ovs.stride[pos_o[0]];
		}
		emit_contract(c, id, &pl, &a, am, ai, &w, wo, wi, &d, dmm, doo, an->dtype, valid_reg(c, id),
			stream);
	}
	if (!region)
		c->p->router_macs += nbat * M * O * I;
	else
		c->p->nproj++;
}

/* ---- output placement, valid masks ---- */
static val *out_val(lw *c, moe_id id, moe_dtype dt)
{
	const ir_node *n = N(c->g, id);
	val *v = &c->v[id];
	if (v->kind == VK_VIEW)
		return v; /* preassigned (region buffers) */
	int32_t t;
	if (c->hbm_home[id])
		t = hbm_tensor(c, n->name ? n->name : "hbm", TCP_T_SCRATCH, dt, n->rank, n->shape);
	else
		t = dm_tensor(c, id, n->name ? n->name : moe_op_name((moe_op)n->op), dt, n->rank, n->shape);
	*v = tview(t, id, n);
	return v;
}

static int valid_reg(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (n->valid == MOE_NONE)
		return -1;
	if (c->inreg[id]) {
		if (n->valid == c->rows)
			return R_ROWS;
		return -1; /* nblocks: the loop bound already holds it */
	}
	const ir_node *vn = N(c->g, n->valid);
	if (vn->rank != 0) {
		lerr(c, id, "a per-row valid mask outside the block loop is not lowered");
		return -1;
	}
	int r = new_reg(c, id);
	val *vv = dm_view(c, n->valid);
	if (vv->kind != VK_VIEW) {
		li(c, r, 0);
		return r;
	}
	ld(c, r, vv->t, -1, vv->base, 0);
	return r;
}

/* ---- block region ---- */
static void find_region(lw *c)
{
	const moe_graph *g = c->g;
	c->rows = c->nblocks = c->bexp = MOE_NONE;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (n->valid == MOE_NONE)
			continue;
		const ir_node *vn = N(g, n->valid);
		if (vn->rank == 1 && n->rank >= 2 && n->shape[0] == vn->shape[0]) {
			c->rows = n->valid;
			c->G = vn->shape[0];
		}
		if (vn->rank == 0 && n->op == MOE_OP_GATHER && N(g, n->args[1])->rank == 1) {
			c->nblocks = n->valid;
			c->bexp = n->args[1];
		}
	}
	if (c->rows == MOE_NONE || c->nblocks == MOE_NONE || N(g, c->bexp)->shape[0] != c->G) {
		c->rows = c->nblocks = c->bexp = MOE_NONE;
		return;
	}
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		bool r = (n->valid == c->rows) ||
			(n->valid == c->nblocks && n->op == MOE_OP_GATHER && n->args[1] == c->bexp &&
				tcpl_weight_leaf(g, n->args[0])) || tcpl_quant_in_region(c, i);
		if (!r && n->op == MOE_OP_RESHAPE && c->inreg[n->args[0]] && n->rank >= 1 && n->shape[0] == c->G &&
			N(g, n->args[0])->shape[0] == c->G)
			r = true;
		c->inreg[i] = r;
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE && (c->inreg[n->args[k]] || c->dep[n->args[k]]))
				c->dep[i] = true;
		if (r)
			c->dep[i] = false;
	}
	/* region results read outside live in HBM; so do grids read inside */
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k < n->nargs; k++) {
			moe_id a = n->args[k];
			if (a == MOE_NONE)
				continue;
			if (c->inreg[i] && !c->inreg[a] && N(g, a)->rank >= 1 && N(g, a)->shape[0] == c->G &&
				N(g, a)->op != MOE_OP_WEIGHT) {
				moe_id s = a;
				while (N(g, s)->op == MOE_OP_RESHAPE)
					s = N(g, s)->args[0];
				c->hbm_home[s] = true;
			}
			if (!c->inreg[i] && c->inreg[a])
				c->hbm_home[a] = true;
		}
		if (c->inreg[i] && c->is_out[i])
			c->hbm_home[i] = true;
	}
}

static void lower_node(lw *c, moe_id id);

/* per-block shape of a region node: drop the leading G */
static ir_node block_node(const ir_node *n)
{
	ir_node b = *n;
	b.rank = (uint8_t)(n->rank - 1);
	memmove(b.shape, n->shape + 1, sizeof(int64_t) * (MOE_MAX_RANK - 1));
	return b;
}

/* Dispatch by gather: block blk's rows of x, by the grid's row list, into
 * slot `slot` of buf (n elements per block). */
static void block_gather(lw *c, int32_t buf, int slot, int64_t n, moe_id s, int blk)
{
	const ir_node *sn = N(c->g, s), *xp = N(c->g, sn->args[2]), *x = N(c->g, xp->args[0]);
	val *xv = need_view(c, xp->args[0]);
	int64_t D = sn->shape[1], rows = n / D, T = x->shape[0];
	tcp_insn in = tcp_insn_init(TCP_OP_DMA_GATHER);
	in.ndim = 3;
	in.dim[0] = 1;
	in.dim[1] = rows;
	in.dim[2] = D;
	in.rows = T;
	in.vreg = -1;
	tcp_view *d = &in.v[TCP_V_DST], *sv = &in.v[TCP_V_S0], *ix = &in.v[TCP_V_S1];
	d->t = buf;
	d->reg = slot;
	d->scale = n;
	d->stride[0] = n;
	d->stride[1] = D;
	d->stride[2] = 1;
	sv->t = xv->t;
	sv->base = xv->base;
	sv->stride[0] = T * D;
	sv->stride[1] = D;
	sv->stride[2] = 1;
	ix->t = c->v[s].t;
	ix->base = c->v[s].base;
	ix->reg = blk;
	ix->scale = rows;
	ix->stride[0] = rows;
	ix->stride[1] = 1;
	emit(c, &in);
}

static void lower_region(lw *c)
{
	const moe_graph *g = c->g;
	tcp_program *p = c->p;
	int32_t tnb = dm_view(c, c->nblocks)->t, tbe = dm_view(c, c->bexp)->t, trw = dm_view(c, c->rows)->t;
	int64_t nbbase = c->v[c->nblocks].base, bebase = c->v[c->bexp].base, rwbase = c->v[c->rows].base;
	int64_t bes = c->v[c->bexp].stride[0], rws = c->v[c->rows].stride[0];
	p->nblocks_t = tnb;
	p->bexp_t = tbe;
	/* per-block buffers: weights and grid rows double-buffered [2, ...] */
	typedef struct inp {
		moe_id src; /* node outside (weight leaf, or grid) */
		moe_id user; /* region node standing for it (gather), or MOE_NONE for a grid */
		int32_t buf;
		int64_t n;  /* elements per block */
		bool weight;
		moe_id gather; /* dispatch by gather: the grid scatter, else MOE_NONE */
	} inp;
	inp ins[32];
	int nin = 0;
	moe_id first = MOE_NONE;
	/* Block results read after the loop go to a grid of all G blocks: in DM
	 * when it is small (at most 1/16 of DM: a decode), where each block's
	 * math writes its slot directly and the combine reads it there, else in
	 * HBM through one copy per block. */
	int32_t dmhome[64];
	int ndh = 0;
	for (moe_id i = 0; i < g->nnodes && ndh < 64; i++) {
		const ir_node *n = N(g, i);
		if (!c->inreg[i] || !c->hbm_home[i] || n->op == MOE_OP_RESHAPE || c->is_out[i] ||
			ir_bytes(n) * 16 > c->m->dm_bytes_per_slice * c->S)
			continue;
		ir_node b = block_node(n);
		int32_t t = dm_tensor(c, i, n->name ? n->name : "block-out", (moe_dtype)n->dtype, n->rank, n->shape);
		val v = tview(t, i, &b);
		v.region = true;
		v.reg = R_G;
		v.scale = ir_numel(&b);
		c->v[i] = v;
		dmhome[ndh++] = (int32_t)i;
	}
	int32_t t_first = (int32_t)p->nt; /* tensors from here on belong to the loop */
	/* Whole experts' weights, double-buffered, take this much DM per slice.
	 * When that exceeds half of DM, every weight gather read only as the
	 * stationary operand of block contractions is streamed instead: its
	 * TRF tiles are fetched from HBM one at a time (docs/tcp-isa.md 7.4).
	 * But when one expert's weights fit in half of DM and the experts get
	 * two blocks or more on average (T K >= 2 E B), they are held whole in a
	 * single buffer: each expert is read once for all its blocks, and the
	 * next expert's fetch waits for the last block of the current one. */
	int64_t whole = 0;
	for (moe_id i = 0; i < g->nnodes; i++) {
		const ir_node *n = N(g, i);
		if (!c->inreg[i] || n->op != MOE_OP_GATHER || n->valid != c->nblocks)
			continue;
		ir_node b = block_node(n);
		whole += rup((2 * ir_numel(&b) * esz(n->dtype) + c->S - 1) / c->S, c->m->flit_bytes);
	}
	bool single = whole > c->m->dm_bytes_per_slice / 2 && whole <= c->m->dm_bytes_per_slice &&
		      p->moe_T * p->moe_K >= 2 * p->moe_E * p->moe_B && p->moe_E > 0 && p->moe_B > 0;
	if (whole > c->m->dm_bytes_per_slice / 2 && !single)
		for (moe_id i = 0; i < g->nnodes; i++) {
			const ir_node *n = N(g, i);
			if (!c->inreg[i] || n->op != MOE_OP_GATHER || n->valid != c->nblocks)
				continue;
			bool ok = true, used = false;
			for (moe_id u = i + 1; u < g->nnodes; u++) {
				const ir_node *un = N(g, u);
				for (uint32_t k = 0; k < un->nargs; k++)
					if (un->args[k] == i) {
						used = true;
						ok &= c->inreg[u] && un->op == MOE_OP_EINSUM && un->nargs == 2 && k == 1 &&
						      un->args[0] != i;
					}
			}
			c->wstream[i] = ok && used;
		}
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i])
			continue;
		if (first == MOE_NONE)
			first = i;
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_GATHER && n->valid == c->nblocks && c->wstream[i]) {
			/* streamed: a view of the expert's weights in HBM, offset by the expert register */
			ir_node b = block_node(n);
			val *sv = need_view(c, n->args[0]);
			if (sv->kind != VK_VIEW || !is_contig(sv, N(g, n->args[0])) || c->p->t[sv->t].space != TCP_HBM) {
				lerr(c, n->args[0], "per-block input must be a contiguous tensor");
				return;
			}
			val v = tview(sv->t, i, &b);
			v.base = sv->base;
			v.region = true;
			v.reg = R_E;
			v.scale = ir_numel(&b);
			c->v[i] = v;
			continue;
		}
		if (n->op == MOE_OP_GATHER && n->valid == c->nblocks) {
			ir_node b = block_node(n);
			int64_t sh[MOE_MAX_RANK + 1];
			sh[0] = single ? 1 : 2;
			memcpy(sh + 1, b.shape, sizeof(int64_t) * b.rank);
			int32_t t = dm_tensor(c, i, "wbuf", (moe_dtype)n->dtype, b.rank + 1, sh);
			if (nin < 32)
				ins[nin++] = (inp){n->args[0], i, t, ir_numel(&b), true, MOE_NONE};
			val v = tview(t, i, &b);
			v.region = true;
			v.reg = R_SLOT;
			v.scale = ir_numel(&b);
			c->v[i] = v;
			continue;
		}
		for (uint32_t k = 0; k < n->nargs; k++) {
			moe_id a = n->args[k];
			if (a == MOE_NONE || c->inreg[a] || c->v[a].kind == VK_IMM)
				continue;
			const ir_node *an = N(g, a);
			if (an->rank < 1 || an->shape[0] != c->G) {
				lerr(c, i, "a block op reads a value that is not per block");
				return;
			}
			bool seen = false;
			for (int j = 0; j < nin; j++)
				seen |= ins[j].src == a;
			if (seen)
				continue;
			ir_node b = block_node(an);
			int64_t sh[MOE_MAX_RANK + 1];
			sh[0] = 2;
			memcpy(sh + 1, b.shape, sizeof(int64_t) * b.rank);
			int32_t t = dm_tensor(c, i, "blkin", (moe_dtype)an->dtype, b.rank + 1, sh);
			if (nin < 32)
				ins[nin++] = (inp){a, MOE_NONE, t, ir_numel(&b), false, c->ggrid[a] ? c->ggrid[a] - 1 : MOE_NONE};
		}
	}
	if (nin >= 32) {
		lerr(c, first, "too many per-block inputs");
		return;
	}
	/* region node buffers */
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i] || c->v[i].kind == VK_VIEW || tcpl_quant_no_buffer(c, i))
			continue;
		const ir_node *n = N(g, i);
		ir_node b = block_node(n);
		if (n->op == MOE_OP_RESHAPE) {
			const val *sv = &c->v[n->args[0]];
			if (sv->kind != VK_VIEW) {
				lerr(c, i, "reshape of a block value before it exists");
				return;
			}
			val v = *sv;
			contiguous(b.shape, b.rank, v.stride);
			v.owner = i;
			c->v[i] = v;
			continue;
		}
		int32_t t = dm_tensor(c, i, n->name ? n->name : "block", (moe_dtype)n->dtype, b.rank, b.shape);
		c->v[i] = tview(t, i, &b);
	}
	/* loads of one block's inputs into slot `slot` for block `blk` with expert `ex` */
	/* one DMA command per group: the later copies join the first's descriptors */
#define LOAD_INPUTS(blk, slot, ex, weights_only, grids_only)                                                     \
	for (int j = 0, first_ = 1; j < nin; j++) {                                                                \
		if ((ins[j].weight && (grids_only)) || (!ins[j].weight && (weights_only)))                             \
			continue;                                                                                      \
		val *sv = &c->v[ins[j].src];                                                                       \
		if (ins[j].gather != MOE_NONE)                                                                     \
			block_gather(c, ins[j].buf, slot, ins[j].n, ins[j].gather, blk);                               \
		else                                                                                               \
			dma_copy(c, ins[j].buf, 0, slot, ins[j].n, sv->t, sv->base, ins[j].weight ? ex : blk, ins[j].n, \
				ins[j].n);                                                                         \
		if (!first_)                                                                                       \
			c->p->code[c->p->ncode - 1].flags |= TCP_F_JOIN;                                               \
		first_ = 0;                                                                                        \
	}
	for (int j = 0; j < nin; j++) {
		if (ins[j].gather != MOE_NONE)
			continue;
		val *sv = need_view(c, ins[j].src);
		if (sv->kind != VK_VIEW || !is_contig(sv, N(g, ins[j].src))) {
			lerr(c, ins[j].src, "per-block input must be a contiguous tensor");
			return;
		}
	}
	/* the run-time scalars reach the control path through SPM (one DMA of
	 * three descriptors); the loop runs the worst-case G blocks, each body
	 * guarded by g < nblocks (docs/tcp-isa.md 7.4) */
	tcp_insn spm = tcp_insn_init(TCP_OP_DMA_SPM);
	spm.ndim = 1;
	spm.dim[0] = c->G;
	spm.v[TCP_V_S0].t = tnb;
	spm.v[TCP_V_S0].base = nbbase;
	spm.v[TCP_V_S1].t = tbe;
	spm.v[TCP_V_S1].base = bebase;
	spm.v[TCP_V_S1].stride[0] = bes;
	spm.v[TCP_V_S2].t = trw;
	spm.v[TCP_V_S2].base = rwbase;
	spm.v[TCP_V_S2].stride[0] = rws;
	emit(c, &spm);
	ld(c, R_NB, tnb, -1, nbbase, 0);
	li(c, R_G, 0);
	li(c, R_GMAX, c->G);
	li(c, R_SLOT, 0);
	li(c, R_IN, 0);
	uint32_t skip_all = br(c, TCP_C_GE, R_G, R_NB);
	ld(c, R_E, tbe, R_G, bebase, bes);
	LOAD_INPUTS(R_G, R_SLOT, R_E, false, false)
	p->block_loop_pc = (int32_t)p->ncode;
	uint32_t loop = p->ncode;
	uint32_t guard = br(c, TCP_C_GE, R_G, R_NB);
	ld(c, R_ROWS, trw, R_G, rwbase, rws);
	alui(c, TCP_S_ADD, R_NEXT, R_G, TCP_NOREG, 1);
	uint32_t nopref = br(c, TCP_C_GE, R_NEXT, R_NB);
	ld(c, R_E2, tbe, R_NEXT, bebase, bes);
	li(c, R_T, 1);
	alui(c, TCP_S_SUB, R_IN2, R_T, R_IN, 0);
	LOAD_INPUTS(R_NEXT, R_IN2, R_E2, false, true)
	if (!single) {
		uint32_t same = br(c, TCP_C_EQ, R_E2, R_E);
		alui(c, TCP_S_SUB, R_S2, R_T, R_SLOT, 0);
		LOAD_INPUTS(R_NEXT, R_S2, R_E2, true, false)
		uint32_t done = jmp(c);
		patch(c, same);
		alui(c, TCP_S_ADD, R_S2, R_SLOT, TCP_NOREG, 0);
		patch(c, done);
	}
	patch(c, nopref);
	p->block_body_pc = (int32_t)p->ncode;
	/* the grid inputs are read through the input slot register */
	for (int j = 0; j < nin; j++) {
		if (ins[j].weight)
			continue;
		ir_node b = block_node(N(g, ins[j].src));
		val v = tview(ins[j].buf, ins[j].src, &b);
		v.region = true;
		v.reg = R_IN;
		v.scale = ins[j].n;
		for (moe_id i = 0; i < g->nnodes; i++)
			if (c->inreg[i])
				for (uint32_t k = 0; k < N(g, i)->nargs; k++)
					if (N(g, i)->args[k] == ins[j].src)
						c->v[ins[j].src] = v;
	}
	for (moe_id i = 0; i < g->nnodes && !c->failed; i++) {
		if (!c->inreg[i])
			continue;
		const ir_node *n = N(g, i);
		if (n->op == MOE_OP_GATHER || n->op == MOE_OP_RESHAPE)
			continue;
		/* lower with the per-block view of every operand: temporarily narrow shapes */
		ir_node *mn = (ir_node *)n;
		ir_node saved = *mn;
		ir_node saved_args[16];
		for (uint32_t k = 0; k < n->nargs && k < 16; k++) {
			ir_node *an = (ir_node *)N(g, n->args[k]);
			saved_args[k] = *an;
			if (c->v[n->args[k]].kind == VK_VIEW && an->rank >= 1 && an->shape[0] == c->G &&
				(c->inreg[n->args[k]] || c->v[n->args[k]].region))
				*an = block_node(an);
		}
		*mn = block_node(n);
		lower_node(c, i);
		for (uint32_t k = n->nargs; k-- > 0;)
			if (k < 16)
				*(ir_node *)N(g, n->args[k]) = saved_args[k];
		*mn = saved;
	}
	/* store region results read outside the loop (those in a DM grid are there) */
	for (moe_id i = 0; i < g->nnodes; i++) {
		bool indm = false;
		for (int k = 0; k < ndh; k++)
			indm |= dmhome[k] == (int32_t)i;
		if (!c->inreg[i] || !c->hbm_home[i] || N(g, i)->op == MOE_OP_RESHAPE || indm)
			continue;
		const ir_node *n = N(g, i);
		ir_node b = block_node(n);
		int32_t home = hbm_tensor(c, n->name ? n->name : "block-out", TCP_T_SCRATCH, (moe_dtype)n->dtype, n->rank,
			n->shape);
		dma_copy(c, home, 0, R_G, ir_numel(&b), c->v[i].t, 0, -1, 0, ir_numel(&b));
		c->v[i] = tview(home, i, n);
	}
	if (single) {
		/* the next expert's weights, after this block's reads of the buffer */
		uint32_t last = br(c, TCP_C_GE, R_NEXT, R_NB);
		uint32_t same = br(c, TCP_C_EQ, R_E2, R_E);
		LOAD_INPUTS(R_NEXT, R_SLOT, R_E2, true, false)
		patch(c, last);
		patch(c, same);
	}
	if (!single)
		alui(c, TCP_S_ADD, R_SLOT, R_S2, TCP_NOREG, 0);
	alui(c, TCP_S_ADD, R_E, R_E2, TCP_NOREG, 0);
	alui(c, TCP_S_ADD, R_IN, R_IN2, TCP_NOREG, 0);
	patch(c, guard);
	alui(c, TCP_S_ADD, R_G, R_G, TCP_NOREG, 1);
	uint32_t back = br(c, TCP_C_LT, R_G, R_GMAX);
	p->code[back].target = (int32_t)loop;
	patch(c, skip_all);
	for (int k = 0; k < ndh; k++)
		c->v[dmhome[k]] = tview(c->v[dmhome[k]].t, dmhome[k], N(g, dmhome[k]));
	/* the loop's DM buffers die with it (results read after it went to HBM or to a DM grid) */
	for (int j = 0; j < nin; j++)
		dm_free(c, ins[j].buf);
	for (moe_id i = 0; i < g->nnodes; i++)
		if (c->inreg[i] && c->v[i].kind == VK_VIEW && c->v[i].t >= t_first && c->p->t[c->v[i].t].space == TCP_DM)
			dm_free(c, c->v[i].t);
	/* views of region results for the consumers outside: reshapes follow their source */
	for (moe_id i = 0; i < g->nnodes; i++) {
		if (!c->inreg[i] || N(g, i)->op != MOE_OP_RESHAPE)
			continue;
		const val *sv = &c->v[N(g, i)->args[0]];
		bool dmgrid = false;
		for (int k = 0; k < ndh; k++)
			dmgrid |= sv->kind == VK_VIEW && sv->t == c->v[dmhome[k]].t;
		if (sv->kind == VK_VIEW && (c->p->t[sv->t].space == TCP_HBM || dmgrid)) {
			val v = *sv;
			contiguous(N(g, i)->shape, N(g, i)->rank, v.stride);
			c->v[i] = v;
		}
	}
	for (int j = 0; j < nin; j++)
		if (!ins[j].weight)
			c->v[ins[j].src] = tview(c->p->t[ins[j].buf].space == TCP_HBM ? ins[j].buf : c->v[ins[j].src].t,
				ins[j].src, N(g, ins[j].src));
#undef LOAD_INPUTS
}

/* ---- per node ---- */
/* A reshape that only adds or drops dimensions of size 1 keeps the strides. */
static bool squeeze_view(const val *sv, const ir_node *s, const ir_node *n, val *v)
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

/* A contiguous DM copy of a strided view (a pass with no ALU steps). */
static val *copy_contig(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	vpass vp;
	int64_t one = 1;
	vp_init(&vp, n->rank ? n->rank : 1, n->rank ? n->shape : &one);
	int map[TCP_MAXD];
	for (int k = 0; k < vp.ndim; k++)
		map[k] = n->rank ? k : -1;
	vp_operand(c, &vp, id, map);
	int32_t t = dm_tensor(c, id, "contiguous", (moe_dtype)n->dtype, n->rank, n->shape);
	moe_id owner = c->v[id].owner;
	c->v[id] = tview(t, owner, n);
	tcp_view d = mkview(&c->v[id], n, vp.ndim, map);
	vp_commit(c, &vp, id, &d, -1);
	return &c->v[id];
}

/* concat: one copy pass per part into its slice of the output (lower-topk
 * concatenates the ranks of row chunks). */
static void lower_concat(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	int axis = norm_axis(n, n, 0);
	val *o = out_val(c, id, (moe_dtype)n->dtype);
	int64_t off = 0;
	for (uint32_t i = 0; i < n->nargs && !c->failed; i++) {
		const ir_node *a = N(c->g, n->args[i]);
		vpass vp;
		int map[TCP_MAXD];
		vp_init(&vp, a->rank, a->shape);
		for (int k = 0; k < a->rank; k++)
			map[k] = k;
		vp_operand(c, &vp, n->args[i], map);
		tcp_view d = mkview(o, n, vp.ndim, map);
		d.base += off * o->stride[axis];
		vp_commit(c, &vp, id, &d, -1);
		off += a->shape[axis];
	}
}

static void lower_view_op(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id), *s = N(c->g, n->args[0]);
	val *sv = &c->v[n->args[0]];
	if (sv->kind == VK_IMM) {
		c->v[id] = *sv;
		return;
	}
	if (sv->kind == VK_IOTA && n->op != MOE_OP_BROADCAST)
		sv = need_view(c, n->args[0]);
	if (sv->kind == VK_IOTA) { /* broadcast keeps trailing alignment */
		c->v[id] = *sv;
		c->v[id].axis = sv->axis + (n->rank - s->rank);
		return;
	}
	val v = *sv;
	switch ((moe_op)n->op) {
	case MOE_OP_RESHAPE:
		if (is_contig(sv, s)) {
			contiguous(n->shape, n->rank, v.stride);
			break;
		}
		if (!squeeze_view(sv, s, n, &v)) {
			/* copy into a contiguous tensor, then view that */
			val *cv = copy_contig(c, n->args[0]);
			v = *cv;
			contiguous(n->shape, n->rank, v.stride);
		}
		break;
	case MOE_OP_SLICE: {
		int axis = norm_axis(n, s, 0);
		int64_t start = ir_attr_int(n, "start", 0), step = ir_attr_int(n, "step", 1);
		if (start < 0)
			start += s->shape[axis];
		v.base += start * sv->stride[axis];
		v.stride[axis] = sv->stride[axis] * step;
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
	v.owner = sv->owner;
	c->v[id] = v;
}

static void lower_leaf(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	switch ((moe_op)n->op) {
	case MOE_OP_CONST: {
		c->v[id].kind = VK_IMM;
		c->v[id].imm = imm_of(n, ir_attr_float(n, "value", (double)ir_attr_int(n, "value", 0)));
		break;
	}
	case MOE_OP_IOTA:
		c->v[id].kind = VK_IOTA;
		c->v[id].axis = norm_axis(n, n, 0);
		break;
	default: {
		bool w = n->op == MOE_OP_WEIGHT, packed = w && ir_attr_int(n, "tcp_packed", -1) >= 0;
		int32_t t = hbm_tensor(c, n->name ? n->name : "", packed ? TCP_T_PACKED : w ? TCP_T_WEIGHT : TCP_T_INPUT,
			(moe_dtype)n->dtype, n->rank, n->shape);
		if (w && !packed) {
			char *src = tcp_resolve_source(c->ctx, c->g, ir_attr_str(n, "source", ""));
			tcp_set_source(c->p, t, src);
			ctx_free(c->ctx, src, strlen(src) + 1);
		}
		c->v[id] = tview(t, id, n);
		c->p->act_bytes += w ? 0 : ir_bytes(n);
		break;
	}
	}
}

static void lower_node(lw *c, moe_id id)
{
	const ir_node *n = N(c->g, id);
	if (c->failed)
		return;
	if (ir_ops[n->op].flags & OPF_LEAF) {
		lower_leaf(c, id);
		return;
	}
	if (c->fused_into[id] != MOE_NONE || c->gdefer[id])
		return; /* computed inside the reduce it feeds; or gathered per block */
	if (c->ggrid[id] && n->op == MOE_OP_RESHAPE) {
		c->v[id] = c->v[n->args[0]]; /* the grid's row list; the block loop gathers */
		return;
	}
	if (c->alias_cast[id]) {
		c->v[id] = c->v[n->args[0]]; /* the fetch widens bf16 to the f32 lane word */
		if (c->v[id].kind != VK_VIEW)
			lerr(c, id, "aliased cast of a value that is not a tensor view");
		return;
	}
	if (tcpl_quant_is_view(c, id)) {
		tcpl_lower_qview(c, id);
		return;
	}
	switch ((moe_op)n->op) {
	case MOE_OP_RESHAPE:
	case MOE_OP_SLICE:
	case MOE_OP_BROADCAST: lower_view_op(c, id); return;
	case MOE_OP_DEQUANT: tcpl_lower_dequant(c, id); return;
	case MOE_OP_REDUCE_SUM:
	case MOE_OP_REDUCE_MAX:
	case MOE_OP_REDUCE_MIN: lower_reduce(c, id); return;
	case MOE_OP_CUMSUM: lower_cumsum(c, id); return;
	case MOE_OP_SOFTMAX: lower_softmax(c, id); return;
	case MOE_OP_EINSUM: lower_einsum(c, id); return;
	case MOE_OP_ONE_HOT: lower_one_hot(c, id); return;
	case MOE_OP_FILTER: lower_filter(c, id); return;
	case MOE_OP_GATHER: lower_gather(c, id); return;
	case MOE_OP_TAKE_ALONG: lower_take_along(c, id); return;
	case MOE_OP_SCATTER: lower_scatter(c, id); return;
	case MOE_OP_CONCAT: lower_concat(c, id); return;
	case MOE_OP_TOPK:
	case MOE_OP_EXPERTS:
		lerr(c, id, "op '%s' must be lowered by the tcp pipeline first", moe_op_name((moe_op)n->op));
		return;
	default:
		if (ir_ops[n->op].flags & OPF_ELEM) {
			lower_elem(c, id);
			return;
		}
		lerr(c, id, "op '%s' has no TCP lowering", moe_op_name((moe_op)n->op));
	}
}

/* Free DM tensors whose owner saw its last use at position q. */
static void release(lw *c, int64_t q)
{
	for (moe_id i = 0; i < c->g->nnodes; i++)
		if (c->last[i] == q && c->v[i].kind == VK_VIEW && !c->v[i].region && c->v[i].owner == i &&
			c->p->t[c->v[i].t].space == TCP_DM && !c->inreg[i])
			dm_free(c, c->v[i].t);
}

/* Choices that keep real-size layers inside DM (a prefill's combine gathers
 * T x K rows of D): bf16 -> f32 casts read only by vector passes are views
 * (the fetch widens); reduce_sum(reshape(mul)) is one pass; a large gather
 * whose rows only feed a scatter stays in HBM (DMA on both sides). */
static void plan_fusions(lw *c)
{
	const moe_graph *g = c->g;
	uint32_t nn = g->nnodes;
	uint32_t *nuse = ctx_alloc(c->ctx, (nn + 1) * sizeof *nuse);
	moe_id *user = ctx_alloc(c->ctx, (nn + 1) * sizeof *user);
	for (moe_id i = 0; i < nn; i++)
		c->fused_into[i] = MOE_NONE;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k <= n->nargs; k++) {
			moe_id a = k < n->nargs ? n->args[k] : n->valid;
			if (a != MOE_NONE)
				nuse[a]++, user[a] = i;
		}
	}
	for (moe_id i = 0; i < nn; i++)
		if (c->is_out[i])
			nuse[i] += 2; /* never folded away */
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		if (c->inreg[i] || c->is_out[i])
			continue;
		if (n->op == MOE_OP_REDUCE_SUM && n->dtype == MOE_F32) {
			moe_id r = n->args[0];
			const ir_node *rn = N(g, r);
			if (rn->op != MOE_OP_RESHAPE || nuse[r] != 1 || c->inreg[r])
				continue;
			moe_id m = rn->args[0];
			const ir_node *mn = N(g, m);
			if (mn->op != MOE_OP_MUL || mn->dtype != MOE_F32 || nuse[m] != 1 || c->inreg[m] || mn->valid != MOE_NONE ||
				rn->rank != mn->rank + 1 || rn->shape[0] * rn->shape[1] != mn->shape[0] || mn->rank + 1 > TCP_MAXD)
				continue;
			bool tail = true;
			for (int d = 1; d < mn->rank; d++)
				tail &= rn->shape[d + 1] == mn->shape[d];
			if (tail)
				c->fused_into[m] = c->fused_into[r] = i;
		}
	}
	int64_t big = c->m->dm_bytes_per_slice / 8 * c->S;
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		if (c->inreg[i] || c->is_out[i] || n->valid != MOE_NONE)
			continue;
		if (n->op == MOE_OP_CAST && n->dtype == MOE_F32 && N(g, n->args[0])->dtype == MOE_BF16 && nuse[i] >= 1) {
			bool ok = true;
			for (moe_id u = i + 1; u < nn && ok; u++) {
				const ir_node *un = N(g, u);
				bool reads = false;
				for (uint32_t k = 0; k < un->nargs; k++)
					reads |= un->args[k] == i;
				if (!reads && un->valid != i)
					continue;
				bool vec = un->valid != i && !c->inreg[u] &&
					(((ir_ops[un->op].flags & OPF_ELEM) && un->op != MOE_OP_BITCAST && un->op != MOE_OP_CAST &&
						 c->fused_into[u] == MOE_NONE) ||
						(c->fused_into[u] != MOE_NONE && un->op == MOE_OP_MUL) || un->op == MOE_OP_REDUCE_SUM ||
						un->op == MOE_OP_REDUCE_MAX || un->op == MOE_OP_REDUCE_MIN || un->op == MOE_OP_SOFTMAX ||
						un->op == MOE_OP_CUMSUM);
				ok = vec;
			}
			c->alias_cast[i] = ok;
		}
		if (n->op == MOE_OP_GATHER && ir_bytes(n) >= big && nuse[i] >= 1) {
			bool only_scatter = true;
			for (moe_id u = i + 1; u < nn && only_scatter; u++) {
				const ir_node *un = N(g, u);
				for (uint32_t k = 0; k < un->nargs; k++)
					if (un->args[k] == i && (un->op != MOE_OP_SCATTER || k != 2))
						only_scatter = false;
				if (un->valid == i)
					only_scatter = false;
			}
			if (only_scatter)
				c->hbm_home[i] = true;
		}
	}
	/* dispatch by gather: scatter(0, pos, gather(x, tok)) read only through
	 * reshapes that only the block loop reads */
	for (moe_id i = 0; i < nn && c->rows != MOE_NONE; i++) {
		const ir_node *n = N(g, i);
		if (n->op != MOE_OP_SCATTER || c->inreg[i] || c->is_out[i] || n->valid != MOE_NONE || n->rank != 2 ||
			strcmp(ir_attr_str(n, "mode", "set"), "set"))
			continue;
		const ir_node *z = N(g, n->args[0]), *xp = N(g, n->args[2]);
		if (z->op != MOE_OP_CONST || ir_attr_float(z, "value", (double)ir_attr_int(z, "value", 1)) != 0.0 ||
			xp->op != MOE_OP_GATHER || nuse[n->args[2]] != 1 || c->is_out[n->args[2]] || xp->valid != MOE_NONE ||
			ir_attr_int(xp, "axis", 0) != 0 || N(g, xp->args[0])->rank != 2 || N(g, xp->args[1])->rank != 1 ||
			N(g, xp->args[0])->op != MOE_OP_INPUT || N(g, xp->args[0])->dtype != n->dtype)
			continue;
		bool ok = nuse[i] >= 1;
		for (moe_id u = i + 1; u < nn && ok; u++) {
			const ir_node *un = N(g, u);
			for (uint32_t k = 0; k < un->nargs && ok; k++) {
				if (un->args[k] != i)
					continue;
				ok = un->op == MOE_OP_RESHAPE && !c->inreg[u] && !c->is_out[u] && un->rank >= 2 &&
				     un->shape[0] == c->G && nuse[u] >= 1;
				for (moe_id w = u + 1; w < nn && ok; w++)
					for (uint32_t q = 0; q < N(g, w)->nargs; q++)
						if (N(g, w)->args[q] == u && !c->inreg[w])
							ok = false;
			}
			if (un->valid == i)
				ok = false;
		}
		if (!ok || n->shape[0] % c->G)
			continue;
		c->ggrid[i] = i + 1;
		c->gdefer[n->args[2]] = true;
		for (moe_id u = i + 1; u < nn; u++)
			if (N(g, u)->op == MOE_OP_RESHAPE && N(g, u)->args[0] == i)
				c->ggrid[u] = i + 1;
	}
	ctx_free(c->ctx, nuse, (nn + 1) * sizeof *nuse);
	ctx_free(c->ctx, user, (nn + 1) * sizeof *user);
}

/* TEMP-UNSPLIT wrappers */
void tcpl_err(lw *c, moe_id n, const char *fmt, ...);
void tcpl_err(lw *c, moe_id n, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	lerr(c, n, "%s", msg);
}
int32_t tcpl_dm_tensor(lw *c, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape);
int32_t tcpl_dm_tensor(lw *c, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape) { return dm_tensor(c, at, name, dt, rank, shape); }
void tcpl_dm_free(lw *c, int32_t t);
void tcpl_dm_free(lw *c, int32_t t) { dm_free(c, t); }
val *tcpl_dm_view(lw *c, moe_id id);
val *tcpl_dm_view(lw *c, moe_id id) { return dm_view(c, id); }
val *tcpl_out_val(lw *c, moe_id id, moe_dtype dt);
val *tcpl_out_val(lw *c, moe_id id, moe_dtype dt) { return out_val(c, id, dt); }
int tcpl_valid_reg(lw *c, moe_id id);
int tcpl_valid_reg(lw *c, moe_id id) { return valid_reg(c, id); }

tcp_program *tcp_lower(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m, char *prep, size_t prep_len)
{
	uint32_t nn = g->nnodes;
	/* weights beyond HBM: the same clear error as after lowering, before any DM limit is met */
	double wsum = 0;
	moe_id big = MOE_NONE; /* the largest weight names the place */
	for (moe_id i = 0; i < nn; i++)
		if (N(g, i)->op == MOE_OP_WEIGHT) {
			wsum += (double)ir_bytes(N(g, i));
			if (big == MOE_NONE || ir_bytes(N(g, i)) > ir_bytes(N(g, big)))
				big = i;
		}
	if (wsum > m->hbm_bytes) {
		moe_diag(ctx, MOE_DIAG_ERROR, big != MOE_NONE ? N(g, big)->loc : g->loc,
			"tcp: the layer needs at least %.2f GB of HBM for its weights but the machine has %.2f GB; use bf16 "
			"(--set dtype=bf16) or fp8 weights, or split the experts over chips (--ep)", wsum / 1e9, m->hbm_bytes / 1e9);
		if (prep)
			ctx_free(ctx, prep, prep_len + 1);
		return NULL;
	}
	lw c = {0};
	c.ctx = ctx;
	c.g = g;
	c.m = m;
	c.p = tcp_prog_new(ctx);
	c.S = tcp_slices(m);
	c.next_reg = R_FREE;
	c.trf[0] = c.trf[1] = -1;
	c.v = ctx_alloc(ctx, sizeof *c.v * (nn + 1));
	c.inreg = ctx_alloc(ctx, nn + 1);
	c.dep = ctx_alloc(ctx, nn + 1);
	c.hbm_home = ctx_alloc(ctx, nn + 1);
	c.is_out = ctx_alloc(ctx, nn + 1);
	c.last = ctx_alloc(ctx, sizeof(int64_t) * (nn + 1));
	c.pos = ctx_alloc(ctx, sizeof(int64_t) * (nn + 1));
	c.alias_cast = ctx_alloc(ctx, nn + 1);
	c.wstream = ctx_alloc(ctx, nn + 1);
	c.fused_into = ctx_alloc(ctx, sizeof(moe_id) * (nn + 1));
	c.ggrid = ctx_alloc(ctx, sizeof(moe_id) * (nn + 1));
	c.gdefer = ctx_alloc(ctx, nn + 1);
	tcp_program *p = c.p;
	p->prep = prep; /* owned by the program from here on */
	p->prep_len = prep_len;
	p->dtype = (uint8_t)g->dtype;
	p->moe_T = ir_graph_attr_int(g, "moe_tokens", 0);
	p->moe_K = ir_graph_attr_int(g, "moe_k", 0);
	p->moe_E = ir_graph_attr_int(g, "moe_experts", 0);
	p->moe_B = ir_graph_attr_int(g, "moe_block", 0);
	p->moe_G = ir_graph_attr_int(g, "grid_blocks", 0);
	for (uint32_t i = 0; i < g->nout; i++)
		c.is_out[g->outputs[i]] = true;
	find_region(&c);
	plan_fusions(&c);
	/* emission order: independent of the region, the loop, then the rest */
	int64_t q = 0, loop_pos = -1;
	for (moe_id i = 0; i < nn; i++)
		if (!c.inreg[i] && !c.dep[i])
			c.pos[i] = q++;
	if (c.rows != MOE_NONE)
		loop_pos = q++;
	for (moe_id i = 0; i < nn; i++) {
		if (c.inreg[i])
			c.pos[i] = loop_pos;
		else if (c.dep[i])
			c.pos[i] = q++;
	}
	/* liveness: last use of each owner (views pass uses to their source) */
	moe_id *own = ctx_alloc(ctx, sizeof(moe_id) * (nn + 1));
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		own[i] = i;
		c.last[i] = c.pos[i];
		if ((n->op == MOE_OP_RESHAPE || n->op == MOE_OP_SLICE || n->op == MOE_OP_BROADCAST || c.alias_cast[i]) &&
			!c.inreg[i])
			own[i] = own[n->args[0]];
	}
	for (moe_id i = 0; i < nn; i++) {
		const ir_node *n = N(g, i);
		for (uint32_t k = 0; k < n->nargs; k++)
			if (n->args[k] != MOE_NONE && c.pos[i] > c.last[own[n->args[k]]])
				c.last[own[n->args[k]]] = c.pos[i];
		if (n->valid != MOE_NONE && c.pos[i] > c.last[own[n->valid]])
			c.last[own[n->valid]] = c.pos[i];
		if (c.fused_into[i] != MOE_NONE) /* read when the reduce runs */
			for (uint32_t k = 0; k < n->nargs; k++)
				if (c.pos[c.fused_into[i]] > c.last[own[n->args[k]]])
					c.last[own[n->args[k]]] = c.pos[c.fused_into[i]];
		if (c.is_out[i])
			c.last[own[i]] = INT64_MAX;
	}
	/* the loop reads nblocks, rows and bexp */
	if (c.rows != MOE_NONE) {
		c.last[own[c.rows]] = c.last[own[c.rows]] > loop_pos ? c.last[own[c.rows]] : loop_pos;
		c.last[own[c.nblocks]] = c.last[own[c.nblocks]] > loop_pos ? c.last[own[c.nblocks]] : loop_pos;
		c.last[own[c.bexp]] = c.last[own[c.bexp]] > loop_pos ? c.last[own[c.bexp]] : loop_pos;
	}
	/* dispatch by gather: the scatter reads the token list of the gather it replaces */
	for (moe_id i = 0; i < nn; i++)
		if (c.ggrid[i] == i + 1) {
			moe_id tok = own[N(g, N(g, i)->args[2])->args[1]];
			if (c.last[tok] < c.pos[i])
				c.last[tok] = c.pos[i];
		}
	for (moe_id i = 0; i < nn; i++)
		if (own[i] != i)
			c.last[i] = -2; /* views never free */
	ctx_free(ctx, own, sizeof(moe_id) * (nn + 1));
	for (int pass = 0; pass < 2 && !c.failed; pass++) {
		for (moe_id i = 0; i < nn && !c.failed; i++) {
			if (c.inreg[i] || (pass == 0) == c.dep[i])
				continue;
			lower_node(&c, i);
			release(&c, c.pos[i]);
		}
		if (pass == 0 && c.rows != MOE_NONE && !c.failed) {
			lower_region(&c);
			release(&c, loop_pos);
		}
	}
	/* outputs to HBM */
	for (uint32_t i = 0; i < g->nout && !c.failed; i++) {
		moe_id o = g->outputs[i];
		const ir_node *n = N(g, o);
		char name[64];
		snprintf(name, sizeof name, "output%u", i);
		int32_t t = hbm_tensor(&c, n->name ? n->name : name, TCP_T_OUTPUT, (moe_dtype)n->dtype, n->rank, n->shape);
		c.p->t[t].name[0] = 0;
		ctx_free(ctx, c.p->t[t].name, 1);
		c.p->t[t].name = ctx_alloc(ctx, strlen(name) + 1);
		memcpy(c.p->t[t].name, name, strlen(name));
		val *v = need_view(&c, o);
		if (v->kind == VK_VIEW && !is_contig(v, n))
			v = copy_contig(&c, o);
		if (v->kind != VK_VIEW || !is_contig(v, n)) {
			lerr(&c, o, "output is not a contiguous tensor");
			break;
		}
		dma_copy(&c, t, 0, -1, 0, v->t, v->base, -1, 0, ir_numel(n));
		c.p->act_bytes += ir_bytes(n);
	}
	tcp_insn h = tcp_insn_init(TCP_OP_HALT);
	tcp_emit(p, &h);
	if (c.rows != MOE_NONE) {
		/* roofline dims from the block contractions: up [F, D] */
		p->moe_D = ir_graph_attr_int(g, "moe_row_bytes", 0) / (int64_t)moe_dtype_size(g->dtype);
		int64_t wb = 0;
		for (moe_id i = 0; i < nn; i++)
			if (c.inreg[i] && N(g, i)->op == MOE_OP_GATHER && N(g, i)->valid == c.nblocks) {
				ir_node b = block_node(N(g, i));
				wb += ir_bytes(&b);
				if (b.rank == 2 && b.shape[1] == p->moe_D && !p->moe_F)
					p->moe_F = b.shape[0];
			}
		p->weight_bytes_per_expert = wb;
	}
	ctx_free(ctx, c.v, sizeof *c.v * (nn + 1));
	ctx_free(ctx, c.inreg, nn + 1);
	ctx_free(ctx, c.dep, nn + 1);
	ctx_free(ctx, c.hbm_home, nn + 1);
	ctx_free(ctx, c.is_out, nn + 1);
	ctx_free(ctx, c.last, sizeof(int64_t) * (nn + 1));
	ctx_free(ctx, c.pos, sizeof(int64_t) * (nn + 1));
	ctx_free(ctx, c.alias_cast, nn + 1);
	ctx_free(ctx, c.wstream, nn + 1);
	ctx_free(ctx, c.fused_into, sizeof(moe_id) * (nn + 1));
	ctx_free(ctx, c.ggrid, sizeof(moe_id) * (nn + 1));
	ctx_free(ctx, c.gdefer, nn + 1);
	ctx_free(ctx, c.live, c.lcap * sizeof *c.live);
	if (c.failed) {
		tcp_prog_free(p);
		return NULL;
	}
	if ((double)c.hbm_top > m->hbm_bytes) {
		/* the tensors bound in HBM (weights first) exceed the chip: a clear error, not a bad program */
		double w = 0;
		for (uint32_t i = 0; i < p->nt; i++)
			if (p->t[i].space == TCP_HBM && (p->t[i].kind == TCP_T_WEIGHT || p->t[i].kind == TCP_T_PACKED))
				w += (double)p->t[i].numel * (double)esz(p->t[i].dtype);
		moe_diag(ctx, MOE_DIAG_ERROR, g->loc,
			"tcp: the layer needs %.2f GB of HBM (weights %.2f GB, inputs, outputs and scratch %.2f GB) but the "
			"machine has %.2f GB; use bf16 (--set dtype=bf16) or fp8 weights, or split the experts over chips (--ep)",
			(double)c.hbm_top / 1e9, w / 1e9, ((double)c.hbm_top - w) / 1e9, m->hbm_bytes / 1e9);
		tcp_prog_free(p);
		return NULL;
	}
	if (tcp_validate(ctx, p, m, "<lowered program>") != MOE_OK) {
		moe_diag(ctx, MOE_DIAG_NOTE, g->loc, "tcp: the lowering produced an invalid program (a moec bug)");
		tcp_prog_free(p);
		return NULL;
	}
	return p;
}

moe_tcp_program *moe_tcp_compile(moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *machine)
{
	moe_tcp_machine *def = NULL;
	if (!machine) {
		def = moe_tcp_machine_default(ctx);
		if (!def)
			return NULL;
		machine = def;
	}
	/* weights packed at load time (prep.c): the device program sees them as leaves */
	char *prep = NULL;
	size_t plen = 0;
	int errs = moe_error_count(ctx);
	moe_graph *dev = tcp_split_weights(ctx, g, &prep, &plen);
	tcp_program *p = NULL;
	if (moe_error_count(ctx) == errs) {
		if (dev)
			p = tcp_lower(ctx, dev, machine, prep, plen);
		else
			p = tcp_lower(ctx, g, machine, NULL, 0);
	}
	if (dev)
		ir_graph_free(dev);
	moe_tcp_machine_free(ctx, def);
	return p;
}
