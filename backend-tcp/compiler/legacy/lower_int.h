/* backend-tcp/lower_int.h: state shared by the files of the TCP lowering
 * (lower.c is the driver; lower_mem.c DM/HBM placement and operand views,
 * lower_vec.c vector-engine passes, lower_route.c gathers, scatters and
 * sequencer views, lower_contract.c contractions, lower_region.c the block
 * loop, lower_fuse.c fusion planning). The small emission and view helpers
 * are static inline here; everything else crossing files is tcpl_*. */
#ifndef MOEC_TCP_LOWER_INT_H
#define MOEC_TCP_LOWER_INT_H

#include <string.h>

#include "backend-tcp/compiler/tcp_compile.h"

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
	/* scalar valid counts outside the block loop already in a register
	 * (staged and loaded once: a serving layer masks many nodes by them) */
	moe_id vc_id[16];
	int vc_reg[16], nvc;
	int trf_k;
	int32_t trf[2];
	int64_t trf_rows_cap, trf_cols;
	bool failed;
	/* fusions chosen before emission (tcpl_fusion_rule) */
	bool *alias_cast;  /* a bf16 -> f32 cast read only by vector passes: a view of its source */
	moe_id *fused_into; /* mul (and the reshape after it) folded into this reduce_sum, or MOE_NONE */
	/* block region */
	moe_id rows, nblocks, bexp;
	bool *wstream;     /* per-block weight gather streamed in TRF-tile chunks (not held per expert) */
	/* dispatch by gather (tcpl_fusion_rule): the grid scatter(0, pos, gather(x, tok))
	 * and the reshapes of it the block loop reads become an i32 list of each
	 * grid row's token, and every block gathers its rows of x directly.
	 * ggrid[i] = the scatter + 1 for those nodes, 0 otherwise; gdefer marks
	 * the token-row gather, which is never materialised. */
	moe_id *ggrid;
	bool *gdefer;
	uint8_t *tier;     /* emission tier of a node before the loop (plan_order): 0 first; 3: in the loop's
	                    * prologue (lower_preexp.c) */
	uint8_t *store_dt; /* nonzero: the node's tensor holds this dtype (a reduce read only by its narrowing cast;
			    * W8A8's quantized rows and their dispatch, i8: lower_quant.c) */
	/* the tail in row chunks (rowchunk.c): nodes read only after the block
	 * loop are emitted after it, depth first from the outputs */
	bool sink;
	bool pre_done; /* tier 3 (lower_preexp.c) emitted */
	bool *after;       /* emitted after the block loop */
	moe_id *order1;    /* their emission order */
	uint32_t norder1;
	moe_id *cat_of;    /* a part of an output joined along its rows: that concat (DMA'd out at once) */
	moe_id pr_node, pr_pos; /* lower_pairs.c: the block result kept in pair order in DM (pr_t), and pos */
	int32_t pr_t, pr_rl;    /* ... its DM tensor, and the dispatch's row list of 8-byte rows */
	int64_t pr_n;           /* ... its rows (T K) */
	/* spec_rows.c: block 0's rows gathered before the dispatch scatter */
	moe_id sr_idx, sr_grid;        /* the top-k indices [T, K] and the grid scatter, or MOE_NONE */
	int32_t sr_buf, sr_m, sr_list; /* the loop's row buffer (allocated early), the two index lists, or -1 */
	bool sr_used;                  /* ... the loop reads its rows from sr_buf */
	int pr_reg, pr_preg;    /* ... the slot (block & 1) of the block's result buffer, and of the pending block's */
	int lr_reg;             /* list_rows.c: the class guard's register of a block's row gather (-1: none yet) */
	bool quiet;             /* errors set failed without a diagnostic (a lowering tried again without pairs) */
	int32_t *leaf_t;   /* an input's HBM tensor (a slice of it reads HBM, not a DM copy), or -1 */
	int64_t G;
	int vreg_rows;
	/* lower_quant.c: act=fp8 activations quantized once per block for every
	 * projection reading them (node + 1, 0: none); scales staged whole */
	moe_id qx_act, qx_cfor;      /* ... and the chunk scales made ahead for einsum qx_cfor - 1 */
	int32_t qx_sa, qx_xq, qx_c;
	bool qscales_staged;
	moe_id w8_v1;  /* W8A8: x.q's v = xf R + 1, rounded in two passes (0: none) */
	int32_t w8_c1;      /* W8A8: tensor + 1 of the scales C of every block's gate/up contraction (0: none; lower_w8a8.c) */
	int64_t w8_cstride; /* ... one block's elements */
	int64_t w8_m, w8_w;  /* ... a block's rows, and the copies of each row's scale */
	int32_t w8_sg, w8_wb; /* ... its operands in DM: the grid's rows' scales, the blocks' channel scales */
	int w8_zreg;        /* ... a register holding 0 */
	moe_id w8_bsc;      /* ... the grid of the rows' scales it replaces (not fetched per block) */
	int32_t w8_rd1[2];   /* W8A8: tensors + 1 of channel scales staged with a row-factor slot per expert (0: none) */
	int64_t w8_rdoff[2]; /* ... the slot's offset from its expert's scales (flags=rowdiv) */
	struct tcpl_shared *sh; /* lower_shared.c: a shared expert's pieces inside the block loop, or NULL */
	bool sh_dm;             /* ... their results kept in DM through the loop where they fit (tried quietly first) */
	const int32_t *achunk;  /* lower_contract.c: a contraction's rows operand, one DM tensor per reduction chunk, or NULL */
	/* lower_dcomb.c: a decode's combine accumulated in the block loop (red: the reduce, else MOE_NONE) */
	struct {
		moe_id red;
		int32_t acc, y, grid, w;
		int64_t gbase, gscale, wbase, wstride, n;
	} dc;
} lw;

enum { R_NB = 1, R_G, R_SLOT, R_E, R_NEXT, R_E2, R_S2, R_ROWS, R_T, R_IN, R_IN2, R_GMAX, R_ROWT, R_PF, R_E3, R_PG, R_PROWS, R_FREE };

void tcpl_err(lw *c, moe_id n, const char *fmt, ...) MOE_PRINTF(3, 4);

static inline int64_t rup(int64_t a, int64_t b)
{
	return (a + b - 1) / b * b;
}

static inline int64_t esz(int dt)
{
	return (int64_t)moe_dtype_size((moe_dtype)dt);
}

/* ---- views ---- */
static inline void contiguous(const int64_t *shape, int rank, int64_t *stride)
{
	int64_t s = 1;
	for (int i = rank - 1; i >= 0; i--) {
		stride[i] = shape[i] == 1 ? 0 : s;
		s *= shape[i];
	}
}

static inline bool is_contig(const val *v, const ir_node *n)
{
	int64_t s = 1;
	for (int i = n->rank - 1; i >= 0; i--) {
		if (n->shape[i] != 1 && v->stride[i] != s)
			return false;
		s *= n->shape[i];
	}
	return true;
}

static inline val tview(int32_t t, moe_id owner, const ir_node *n)
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
static inline tcp_view mkview(const val *v, const ir_node *n, int ndim, const int *map)
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
static inline void bmap(const ir_node *n, int ndim, int *map)
{
	for (int k = 0; k < ndim; k++) {
		int d = k - (ndim - n->rank);
		map[k] = d >= 0 ? d : -1;
	}
}

static inline uint32_t imm_of(const ir_node *n, double v)
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

static inline int norm_axis(const ir_node *n, const ir_node *src, int64_t def)
{
	int64_t a = ir_attr_int(n, "axis", def);
	return ir_norm_axis((int)a, src->rank);
}

/* per-block shape of a region node: drop the leading G */
static inline ir_node block_node(const ir_node *n)
{
	ir_node b = *n;
	b.rank = (uint8_t)(n->rank - 1);
	memmove(b.shape, n->shape + 1, sizeof(int64_t) * (MOE_MAX_RANK - 1));
	return b;
}

/* ---- emission helpers ---- */
static inline void emit(lw *c, tcp_insn *in)
{
	tcp_emit(c->p, in);
}

static inline void li(lw *c, int rd, int64_t v)
{
	tcp_insn in = tcp_insn_init(TCP_OP_LI);
	in.rd = (uint8_t)rd;
	in.imm = v;
	emit(c, &in);
}

static inline void alui(lw *c, tcp_sop op, int rd, int ra, int rb, int64_t imm)
{
	tcp_insn in = tcp_insn_init(TCP_OP_ALU);
	in.sop = (uint8_t)op;
	in.rd = (uint8_t)rd;
	in.ra = (uint8_t)ra;
	in.rb = (uint8_t)rb;
	in.imm = imm;
	emit(c, &in);
}

static inline uint32_t br(lw *c, tcp_cond cc, int ra, int rb)
{
	tcp_insn in = tcp_insn_init(TCP_OP_BR);
	in.sop = (uint8_t)cc;
	in.ra = (uint8_t)ra;
	in.rb = (uint8_t)rb;
	in.target = -1;
	emit(c, &in);
	return c->p->ncode - 1;
}

static inline uint32_t jmp(lw *c)
{
	tcp_insn in = tcp_insn_init(TCP_OP_JMP);
	in.target = -1;
	emit(c, &in);
	return c->p->ncode - 1;
}

static inline void patch(lw *c, uint32_t at)
{
	c->p->code[at].target = (int32_t)c->p->ncode;
}

static inline void ld(lw *c, int rd, int32_t t, int reg, int64_t base, int64_t scale)
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
static inline void dma_copy(lw *c, int32_t dt, int64_t dbase, int dreg, int64_t dscale, int32_t st, int64_t sbase, int sreg,
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

/* lower_mem.c: placement */
int32_t tcpl_hbm_tensor(lw *c, const char *name, int kind, moe_dtype dt, int rank, const int64_t *shape);
int32_t tcpl_dm_tensor(lw *c, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape);
void tcpl_dm_place(lw *c, int32_t t, uint32_t i, int64_t off, int64_t need); /* live block i at off */
int32_t tcpl_dm_tensor_top(lw *c, moe_id at, const char *name, moe_dtype dt, int rank, const int64_t *shape);
void tcpl_dm_free(lw *c, int32_t t);
/* lower_check.c: DM tensors that share bytes while both are live (errors, count) */
int tcpl_check_dm(moe_ctx *ctx, const tcp_program *p, moe_loc loc);
/* lower_check.c: each tensor's live instructions [lo[t], hi[t]] as the
 * check counts them (-1: never named) */
void tcpl_live_spans(moe_ctx *ctx, const tcp_program *p, int64_t *lo, int64_t *hi);
/* legal_dma.c: the program's gathers and scatters rewritten through HBM into
 * the forms the machine has, sub loads given the switch where a slice does
 * not hold what it loads; *hbm_top grows by the HBM scratch. False (with a
 * diagnostic) when its DM scratch does not fit. */
bool tcpl_legalize(moe_ctx *ctx, tcp_program *p, const moe_tcp_machine *m, int64_t *hbm_top);
/* The value of node id as a view (materialized if an immediate or iota);
 * tcpl_dm_view: in DM, copying from HBM if needed. */
val *tcpl_need_view(lw *c, moe_id id);
val *tcpl_dm_view(lw *c, moe_id id);
/* Destination value for node id: per-block buffer inside the region, a fresh DM tensor otherwise. */
val *tcpl_out_val(lw *c, moe_id id, moe_dtype dt);
/* A DMA gather's result that is exactly one graph output, read by no node:
 * its HBM output tensor becomes the value (the gather writes it there, no
 * copy out); false, changing nothing, otherwise (lower.c). */
bool tcpl_gather_to_output(lw *c, moe_id id);
/* The DMA copy at code[at] joins the list of a DMA copy right before it (lower_mem.c). */
void tcpl_join_adjacent(lw *c, uint32_t at);
/* ... an output's copy, and a gather or scatter, right after a DMA copy, gather or scatter. */
void tcpl_join_output(lw *c, uint32_t at);
/* ... and a gather or scatter right after a DMA copy, gather or scatter. */
void tcpl_join_gs(lw *c, uint32_t at);
int tcpl_valid_reg(lw *c, moe_id id);
int tcpl_count_reg(lw *c, moe_id id, moe_id cnt); /* a scalar count's register (staged, loaded once) */
int tcpl_count_alu(lw *c, moe_id id, moe_id cnt); /* ... derived by scalar ALU from another count, or -1 */
int tcpl_new_reg(lw *c, moe_id at); /* a scalar register of its own (R_FREE and up) */

/* lower_vec.c: vector-engine passes */
void tcpl_materialize(lw *c, moe_id id);
val *tcpl_copy_contig(lw *c, moe_id id);
void tcpl_lower_elem(lw *c, moe_id id);
void tcpl_lower_reduce(lw *c, moe_id id);
void tcpl_lower_cumsum(lw *c, moe_id id);
void tcpl_lower_filter(lw *c, moe_id id);
void tcpl_lower_softmax(lw *c, moe_id id);
void tcpl_lower_one_hot(lw *c, moe_id id);
void tcpl_lower_concat(lw *c, moe_id id);

/* lower_route.c: DMA gathers and scatters, sequencer views */
void tcpl_lower_gather(lw *c, moe_id id);
void tcpl_lower_take_along(lw *c, moe_id id);
void tcpl_lower_scatter(lw *c, moe_id id);
void tcpl_lower_view_op(lw *c, moe_id id);

/* lower_scatter.c: scatter mode=add (vector adds in a run-time loop) */
void tcpl_lower_scatter_add(lw *c, moe_id id);

/* lower_contract.c */
void tcpl_lower_einsum(lw *c, moe_id id);
/* lower_rows.c: passes over rows with a run-time count as guarded row tiles */
void tcpl_emit_row_tiles(lw *c, const tcp_insn *in, int64_t first);
void tcpl_emit_row_steps(lw *c, const tcp_insn *in, int64_t first, int64_t step); /* then tiles of `step` rows */
int64_t tcpl_row_tile(int64_t rows);           /* the first tile's rows for a pass over `rows` */
bool tcpl_tile_outside(const lw *c, moe_id id); /* a serving pass whose readers all mask its padded rows */
void tcpl_emit_block_pass(lw *c, const tcp_insn *in); /* a block pass: small, tiled or whole by the block's rows */
uint32_t tcpl_block_rows_guard(lw *c, int64_t f);    /* branch taken when the block has more than f rows */
bool tcpl_upper_rows(const lw *c); /* no weight of the block loop streamed: upper row classes (row_classes.c) */
/* list_rows.c: a block's gather or scatter [1, B, row] with the index list of its count's row class */
void tcpl_emit_list_rows(lw *c, const tcp_insn *in, int kreg);
/* spec_fetch.c: a static weight copy inserted after the DMAs routing reads first (true: inserted) */
bool tcpl_spec_fetch(lw *c, int32_t buf, int64_t dbase, int64_t n, int32_t st, int64_t sbase);
/* spec_rows.c: block 0's rows listed and gathered right after top-k (docs/tcp-isa.md 7.4) */
void tcpl_spec_rows_plan(lw *c);
void tcpl_spec_rows_emit(lw *c, moe_id i);
int32_t tcpl_spec_rows_buffer(lw *c, moe_id s);
bool tcpl_spec_rows_take(lw *c);
int64_t tcpl_dm_live_top(const lw *c, int64_t *cap); /* the highest live DM end but that buffer; *cap: DM below it */
/* router_rows.c: an einsum before the loop in row chunks behind its operand's copy (docs/tcp-isa.md 7.2) */
void tcpl_router_rows(lw *c, moe_id i, uint32_t at);
void tcpl_copy_rows(lw *c, int32_t dt, int64_t dbase, int32_t st, int64_t sbase, int64_t rows, int64_t rowlen, int creg);
moe_id tcpl_input_rows_count(const lw *c, moe_id id); /* a token input copied in row tiles: by this count */
bool tcpl_copy_out_rows(lw *c, moe_id o, int32_t t, const val *v); /* a serving output's real rows only */

/* block_store.c: block results copied to their HBM grid, deferred by one block */
typedef struct tcpl_bstore {
	int32_t home, src;    /* the HBM grid, the block's DM buffer */
	int64_t rows, rowlen; /* per block */
	bool fine;            /* streamed weights: the rows of the fine row tiles */
} tcpl_bstore;
void tcpl_store_pending(lw *c, const tcpl_bstore *s, int ns); /* block g - 1's, in block g */
void tcpl_store_end(lw *c, const tcpl_bstore *s, int ns);     /* the last block's own; the rest pend */

/* lower_region.c: the block region and its loop */
void tcpl_find_region(lw *c);
/* lower_stage.c: an EP phase's received rows staged into DM once, in block order */
bool tcpl_stage_fits(const lw *c, moe_id s, int64_t n);
int tcpl_stage_count(lw *c, moe_id s);
int32_t tcpl_stage_buffer(lw *c, moe_id s, int64_t n, int32_t *tmp);
void tcpl_stage_emit(lw *c, moe_id s, int32_t buf, int64_t n, int32_t trw, int64_t rwbase, int64_t rws,
	const int32_t *tmp);
void tcpl_lower_region(lw *c);
int tcpl_region_projections(const lw *c, moe_id e);

/* lower_fuse.c: the legacy emitter's fusion plan (fused_into, alias_cast,
 * hbm_home of large gathers, ggrid/gdefer), after tcpl_find_region */
void tcpl_fusion_rule(lw *c);
/* dispatch by gather for the grid scatter i: its token list, the gather deferred */
void tcpl_mark_ggrid(lw *c, moe_id i);

/* lower.c */
void tcpl_lower_node(lw *c, moe_id id);
/* lower_pairs.c */
void tcpl_pairs_plan(lw *c);
void tcpl_pairs_alloc(lw *c, moe_id at, int32_t src, int64_t n, int32_t rowlist);
void tcpl_pairs_rows(lw *c);
bool tcpl_pairs_store(lw *c, moe_id i, int greg, int rreg);
bool tcpl_pairs_buffer(lw *c, moe_id i, const ir_node *b);
void tcpl_pairs_slot(lw *c);
bool tcpl_pairs_gather(lw *c, moe_id id);
/* The lowering state of g on machine m (a fresh program in c->p), and its
 * release (c->p excepted). */
void tcpl_init(lw *c, moe_ctx *ctx, const moe_graph *g, const moe_tcp_machine *m);
void tcpl_fini(lw *c);

/* lower_quant.c: quantized expert weights (dequant in the block loop) */
bool tcpl_quant_in_region(const lw *c, moe_id id); /* a dequant, or a view of one, joins the block region */
bool tcpl_quant_is_view(const lw *c, moe_id id);   /* a region slice / permutation of a dequant: no buffer */
bool tcpl_quant_no_buffer(const lw *c, moe_id id); /* ... or a dequant read as fp8 (act=fp8) */
void tcpl_lower_qview(lw *c, moe_id id);
void tcpl_lower_dequant(lw *c, moe_id id);
bool tcpl_lower_fp8_einsum(lw *c, moe_id id);      /* false: not an act=fp8 or W8A8 contraction */
void tcpl_w8a8_plan(lw *c);                        /* W8A8 activation chains: fused into their contraction */
bool tcpl_w8a8_lower_q(lw *c, moe_id id);          /* false: id is not W8A8's x.q rounded in two passes */
void tcpl_w8a8_act_plan(lw *c);                    /* lower_w8a8.c: x.q as i8 rows, its rounding, its dispatch */
void tcpl_w8a8_quantize(lw *c, moe_id id, const val *x, int64_t M, int64_t I, int vreg, const tcp_view *rdst, int32_t *R,
	int32_t *xq); /* lower_w8a8.c: a block's rows as i8 and their 127 / m (into rdst when given) */
bool tcpl_w8a8_stage_rowdiv(lw *c, moe_id w, int64_t M); /* lower_w8a8.c: down's scales staged with the row-factor slots */
moe_id tcpl_w8a8_pre_einsum(const lw *c, moe_id *bs, int64_t *M, int64_t *O, moe_id *ws); /* lower_quant.c */
void tcpl_w8a8_bulk(lw *c, int32_t tbe, int64_t bebase, int64_t bes); /* lower_w8a8.c: C of every block, before the loop */
void tcpl_w8a8_bulk_body(lw *c);
void tcpl_w8a8_bulk_end(lw *c);
int64_t tcpl_w8a8_tile(const lw *c, int64_t M, int64_t O, int64_t I, int64_t out_bytes); /* lower_w8a8.c: TRF rows per slice of an i8 contraction */
/* small block-scale tensors copied whole into DM, once: after the first contraction emitted
 * from code position `from` on (routing's inputs are fetched by then); UINT32_MAX: now */
void tcpl_quant_stage_after(lw *c, uint32_t from);
bool tcpl_quant_resident(const lw *c, moe_id id);  /* a per-block gather of such a DM-resident tensor */

/* lower_preexp.c: expert work independent of routing (a shared expert) gets tier 3, emitted by
 * tcpl_lower_pre_experts (lower.c) after the first block's fetch (lower_region.c) */
void tcpl_mark_pre_experts(lw *c);
bool tcpl_pre_experts_fit(const lw *c); /* their DM beside what is live now */
void tcpl_lower_pre_experts(lw *c, bool late); /* late: after the loop, as they did not fit in it */
/* lower_shared.c: a row-chunked tail's shared expert in pieces inside the block loop (docs/tcp-isa.md 7.4) */
void tcpl_shared_plan(lw *c);                 /* after order_after: the pieces leave the order after the loop */
void tcpl_shared_pos(lw *c, int64_t loop_pos); /* plan_order: their position */
void tcpl_shared_liveness(lw *c);             /* ... their values and weights freed by tcpl_shared_after */
void tcpl_shared_regs(lw *c);                 /* region prologue, before the skip branch */
void tcpl_shared_prologue(lw *c);             /* region prologue: the weights into DM */
void tcpl_shared_body(lw *c);                 /* end of the block body: a piece in some blocks */
void tcpl_shared_after(lw *c);                /* after the loop: the pieces left, the roots' views */
void tcpl_shared_fini(lw *c);
/* lower_decode.c: a decode's block rows read x's DM copy in place (7.4) */
bool tcpl_decode_scatter(lw *c, moe_id id);
bool tcpl_decode_view(const lw *c, moe_id id);
void tcpl_decode_reshape(lw *c, moe_id id);
val tcpl_decode_block_view(const lw *c, moe_id id);
void tcpl_decode_first_fetch(lw *c, int32_t buf, int64_t n, moe_id w, int32_t tbe, int64_t bebase, int64_t bes);
bool tcpl_nan_key(const lw *c, moe_id id); /* top-k's key of a softmax score: a view of it */
moe_id tcpl_nan_key_src(const lw *c, moe_id id);
/* lower_dcomb.c: a decode's combine accumulated block by block in the loop (7.4) */
void tcpl_dcomb_plan(lw *c, const int32_t *dmhome, int ndh);
void tcpl_dcomb_step(lw *c);
void tcpl_dcomb_finish(lw *c);

#endif
