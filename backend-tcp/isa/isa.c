/* backend-tcp/isa/isa.c: the instruction set tables, program building, static
 * validation of a program against a machine, and CRC-32. */
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"

const char *const tcp_op_names[TCP_OP_COUNT] = {
#define X(id, s, c) s,
	TCP_OPS(X)
#undef X
};
const uint8_t tcp_op_ctx[TCP_OP_COUNT] = {
#define X(id, s, c) TCP_CTX_##c,
	TCP_OPS(X)
#undef X
};
const char *const tcp_ctx_names[TCP_NCTX] = {"control", "main", "sub", "dma"};
const char *const tcp_vop_names[TCP_V_COUNT] = {
#define X(id, s, st) s,
	TCP_VOPS(X)
#undef X
};
const uint8_t tcp_vop_stage[TCP_V_COUNT] = {
#define X(id, s, st) TCP_ST_##st,
	TCP_VOPS(X)
#undef X
};
const char *const tcp_stage_names[TCP_NSTAGE] = {"tag", "logic", "fxp", "fxp2fp", "float", "reduce", "fpdiv",
	"fp2fxp", "clip", "filter"};

tcp_program *tcp_prog_new(moe_ctx *ctx)
{
	tcp_program *p = ctx_alloc(ctx, sizeof *p);
	p->ctx = ctx;
	p->nblocks_t = p->bexp_t = -1;
	p->block_loop_pc = p->block_body_pc = -1;
	p->tier_loop_pc = p->tier_bexp_t = -1;
	return p;
}

/* A tensor's name and source: an empty one is the shared no_str, never
 * allocated (a compile's cost predictions build tensor tables of unnamed
 * buffers, and most sources are empty); every other is the program's own
 * copy. Neither is ever written through. */
static char no_str[1];

static char *str_dup(moe_ctx *ctx, const char *s)
{
	size_t n = strlen(s ? s : "");
	if (!n)
		return no_str;
	char *d = ctx_alloc(ctx, n + 1);
	memcpy(d, s, n);
	return d;
}

static void str_free(moe_ctx *ctx, char *s)
{
	if (s && s != no_str)
		ctx_free(ctx, s, strlen(s) + 1);
}

void tcp_prog_free(tcp_program *p)
{
	if (!p)
		return;
	moe_ctx *ctx = p->ctx;
	for (uint32_t i = 0; i < p->nt; i++) {
		str_free(ctx, p->t[i].name);
		str_free(ctx, p->t[i].source);
	}
	ctx_free(ctx, p->prep, p->prep_len + 1);
	ctx_free(ctx, p->t, p->tcap * sizeof *p->t);
	ctx_free(ctx, p->code, p->ccap * sizeof *p->code);
	ctx_free(ctx, p->consts, (size_t)p->constcap);
	ctx_free(ctx, p, sizeof *p);
}

void moe_tcp_program_free(moe_tcp_program *p)
{
	tcp_prog_free(p);
}

int32_t tcp_add_tensor(tcp_program *p, const char *name, int space, int kind, moe_dtype dt, int rank,
	const int64_t *shape)
{
	ctx_grow(p->ctx, (void **)&p->t, &p->tcap, p->nt + 1, sizeof *p->t);
	tcp_tensor *t = &p->t[p->nt];
	memset(t, 0, sizeof *t);
	t->name = str_dup(p->ctx, name);
	t->source = no_str;
	t->space = (uint8_t)space;
	t->kind = (uint8_t)kind;
	t->dtype = (uint8_t)dt;
	t->rank = (uint8_t)rank;
	t->numel = 1;
	t->copies = 1;
	for (int i = 0; i < rank; i++) {
		t->shape[i] = shape[i];
		t->numel *= shape[i];
	}
	return (int32_t)p->nt++;
}

uint32_t tcp_emit(tcp_program *p, const tcp_insn *in)
{
	ctx_grow(p->ctx, (void **)&p->code, &p->ccap, p->ncode + 1, sizeof *p->code);
	p->code[p->ncode] = *in;
	return p->ncode++;
}

tcp_view tcp_view_none(void)
{
	tcp_view v;
	memset(&v, 0, sizeof v);
	v.t = -1;
	v.reg = -1;
	return v;
}

/* ---- placement (tcp_int.h; docs/tcp-isa.md section 1) ---- */
int64_t tcp_tensor_bytes(const tcp_tensor *t)
{
	return t->numel * (int64_t)moe_dtype_size((moe_dtype)t->dtype);
}

int64_t tcp_layout_unit(const moe_tcp_machine *m, const tcp_tensor *t)
{
	if (t->part_bytes > 0)
		return t->part_bytes;
	return m->flit_bytes > 0 ? m->flit_bytes : 1;
}

int64_t tcp_layout_group(const moe_tcp_machine *m, const tcp_tensor *t)
{
	int64_t b = tcp_tensor_bytes(t), r = t->copies > 0 ? t->copies : 1, g = tcp_slices(m) / r;
	if (t->part_bytes > 0)
		return b > 0 ? (b + t->part_bytes - 1) / t->part_bytes : 1;
	return g > 0 ? g : 1;
}

int64_t tcp_slice_holds(const moe_tcp_machine *m, const tcp_tensor *t, int64_t s)
{
	int64_t u = tcp_layout_unit(m, t), G = tcp_layout_group(m, t), b = tcp_tensor_bytes(t);
	int64_t r = t->copies > 0 ? t->copies : 1, nu = (b + u - 1) / u, j = s % G;
	if (s < 0 || s >= G * r || s >= tcp_slices(m) || j >= nu)
		return 0;
	int64_t k = (nu - 1 - j) / G + 1; /* units j, j + G, ... below nu */
	int64_t last = (nu - 1) % G == j ? nu * u - b : 0; /* the last unit's missing tail */
	return k * u - last;
}

bool tcp_slice_has(const moe_tcp_machine *m, const tcp_tensor *t, int64_t s, int64_t b)
{
	int64_t G = tcp_layout_group(m, t), r = t->copies > 0 ? t->copies : 1;
	if (b < 0 || b >= tcp_tensor_bytes(t) || s < 0 || s >= G * r || s >= tcp_slices(m))
		return false;
	return b / tcp_layout_unit(m, t) % G == s % G;
}

int64_t tcp_dm_side_bytes(const tcp_tensor *t, int64_t n)
{
	return t->space == TCP_HBM ? n : n * (t->copies > 0 ? t->copies : 1);
}

int64_t tcp_index_bytes_per_pe(const moe_tcp_machine *m)
{
	return m->index_bytes_per_pe; /* machine.json dma.index_bytes_per_pe */
}

tcp_insn tcp_insn_init(tcp_opcode op)
{
	tcp_insn in;
	memset(&in, 0, sizeof in);
	in.op = (uint8_t)op;
	in.rd = in.ra = in.rb = TCP_NOREG;
	in.vreg = -1;
	for (int i = 0; i < TCP_NVIEW; i++)
		in.v[i] = tcp_view_none();
	return in;
}

/* ---- CRC-32 (IEEE 802.3, reflected), table built on the fly ---- */
uint32_t tcp_crc32(const uint8_t *p, size_t n)
{
	uint32_t tab[256];
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
		tab[i] = c;
	}
	uint32_t c = 0xffffffffu;
	for (size_t i = 0; i < n; i++)
		c = tab[(c ^ p[i]) & 0xff] ^ (c >> 8);
	return c ^ 0xffffffffu;
}

/* ---- validation ---- */
typedef struct vc {
	moe_ctx *ctx;
	const tcp_program *p;
	const moe_tcp_machine *m;
	const char *file;
	int errors;
	char why[256];
} vc;

static void verr(vc *c, int64_t pc, const char *fmt, ...) MOE_PRINTF(3, 4);
static void verr(vc *c, int64_t pc, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (c->errors++ < 20) {
		if (pc >= 0)
			moe_diag(c->ctx, MOE_DIAG_ERROR, moe_loc_file(c->ctx, c->file), "instruction %lld (%s): %s",
				(long long)pc, tcp_op_names[c->p->code[pc].op], msg);
		else
			moe_diag(c->ctx, MOE_DIAG_ERROR, moe_loc_file(c->ctx, c->file), "%s", msg);
	}
}

static bool dtype_ok(int d)
{
	return d == MOE_F32 || d == MOE_BF16 || d == MOE_I32 || d == MOE_BOOL || d == MOE_F8E4M3 || d == MOE_U8 ||
	       d == MOE_I8;
}

/* A view's unit: elements of its tensor, or 4-bit elements of the tensor's
 * bytes for s0 of a tu.vec with TCP_F_E2M1 / TCP_F_I4. */
static int64_t view_numel(const tcp_insn *in, int which, const tcp_tensor *t)
{
	bool nib = in->op == TCP_OP_TU_VEC && which == TCP_V_S0 && (in->flags & (TCP_F_E2M1 | TCP_F_I4));
	return nib ? t->numel * (int64_t)moe_dtype_size((moe_dtype)t->dtype) * 2 : t->numel;
}

static int64_t space_cap(const moe_tcp_machine *m, int space)
{
	switch (space) {
	case TCP_DM: return m->dm_bytes_per_slice;
	case TCP_TRF: return tcp_trf_bytes(m);
	case TCP_VRF: return m->vrf_bytes_per_slice;
	default: return (int64_t)m->hbm_bytes;
	}
}

static const char *const space_names[TCP_NSPACE] = {"hbm", "dm", "trf", "vrf"};

static void check_tensors(vc *c)
{
	const tcp_program *p = c->p;
	int64_t S = tcp_slices(c->m);
	for (uint32_t i = 0; i < p->nt; i++) {
		const tcp_tensor *t = &p->t[i];
		if (t->space >= TCP_NSPACE || t->kind >= TCP_NKIND || !dtype_ok(t->dtype) || t->rank > MOE_MAX_RANK) {
			verr(c, -1, "tensor %%%u: bad space, kind, dtype or rank", i);
			continue;
		}
		int64_t n = 1;
		bool ovf = false;
		for (int k = 0; k < t->rank; k++) {
			if (t->shape[k] < 1 || !ir_mul_ov(n, t->shape[k], &n))
				ovf = true;
		}
		int64_t bytes;
		if (ovf || n != t->numel || !ir_mul_ov(n, (int64_t)moe_dtype_size((moe_dtype)t->dtype), &bytes) ||
			bytes > ((int64_t)1 << 46)) {
			verr(c, -1, "tensor %%%u '%s': bad shape or element count", i, t->name);
			continue;
		}
		int64_t cap = space_cap(c->m, t->space);
		if (t->addr < 0 || t->slice_bytes < 0) {
			verr(c, -1, "tensor %%%u '%s': negative address", i, t->name);
			continue;
		}
		if (t->space == TCP_HBM) {
			if (t->addr % c->m->hbm_granule || t->addr > cap || bytes > cap - t->addr)
				verr(c, -1, "tensor %%%u '%s': HBM range [%lld, +%lld) is unaligned or beyond %.0f bytes", i, t->name,
					(long long)t->addr, (long long)bytes, c->m->hbm_bytes);
			if (t->part_bytes != 0 || t->copies != 1)
				verr(c, -1, "tensor %%%u '%s': an HBM tensor has no slice layout (layout=0x1)", i, t->name);
		} else if (t->part_bytes < 0 || t->copies < 1 || t->copies > S) {
			verr(c, -1, "tensor %%%u '%s': bad layout (part of %lld bytes, %d copies on %lld slices)", i, t->name,
				(long long)t->part_bytes, t->copies, (long long)S);
		} else {
			/* slice 0 holds the most: the first unit of every round */
			int64_t need = tcp_slice_holds(c->m, t, 0), P = tcp_layout_group(c->m, t);
			if (P > S / t->copies)
				verr(c, -1, "tensor %%%u '%s': layout of %lld parts x %d copies needs more than the %lld slices", i,
					t->name, (long long)P, t->copies, (long long)S);
			else if (t->slice_bytes < need)
				verr(c, -1, "tensor %%%u '%s': per-slice footprint %lld below the %lld bytes its layout puts on a slice", i, t->name,
					(long long)t->slice_bytes, (long long)need);
			else if (t->addr > cap || t->slice_bytes > cap - t->addr)
				verr(c, -1, "tensor %%%u '%s': %s capacity exceeded (offset %lld + %lld > %lld bytes per slice)", i,
					t->name, space_names[t->space], (long long)t->addr, (long long)t->slice_bytes, (long long)cap);
		}
		if (t->kind == TCP_T_CONST && (t->const_off < 0 || t->const_off > p->nconst || bytes > p->nconst - t->const_off))
			verr(c, -1, "tensor %%%u '%s': constant data outside the constants section", i, t->name);
		if ((t->kind == TCP_T_INPUT || t->kind == TCP_T_WEIGHT || t->kind == TCP_T_OUTPUT || t->kind == TCP_T_PACKED) &&
			(t->space != TCP_HBM || !t->name[0]))
			verr(c, -1, "tensor %%%u: bound tensors must be named and live in HBM", i);
	}
}

/* Static extent of a view: the lowest and highest element touched. False
 * when it does not fit int64 (hi - lo + 1 included): such a view is invalid. */
static bool view_extent(const tcp_view *v, int ndim, const int64_t *dim, int64_t *lo, int64_t *hi)
{
	int64_t a = v->base, b = v->base, s, span;
	for (int k = 0; k < ndim; k++) {
		if (__builtin_sub_overflow(dim[k], 1, &s) || __builtin_mul_overflow(v->stride[k], s, &s) ||
			(s < 0 ? __builtin_add_overflow(a, s, &a) : __builtin_add_overflow(b, s, &b)))
			return false;
	}
	if (__builtin_sub_overflow(b, a, &span) || span == INT64_MAX)
		return false;
	*lo = a;
	*hi = b;
	return true;
}

static bool reg_ok(int r, bool optional)
{
	return (optional && r == TCP_NOREG) || (r >= 0 && r < TCP_NREG);
}

/* spaces: bitmask of allowed spaces; need: the view must be present */
static void check_view(vc *c, int64_t pc, const tcp_insn *in, int which, unsigned spaces, bool need, int ndim,
	const int64_t *dim)
{
	static const char *const vn[TCP_NVIEW] = {"dst", "s0", "s1", "s2"};
	const tcp_view *v = &in->v[which];
	if (v->t < 0) {
		if (need)
			verr(c, pc, "missing operand %s", vn[which]);
		return;
	}
	if ((uint32_t)v->t >= c->p->nt) {
		verr(c, pc, "operand %s names tensor %%%d of %u", vn[which], v->t, c->p->nt);
		return;
	}
	const tcp_tensor *t = &c->p->t[v->t];
	if (!(spaces & (1u << t->space)))
		verr(c, pc, "operand %s: tensor '%s' is in %s, not allowed here", vn[which], t->name, space_names[t->space]);
	if (v->reg != -1 && !reg_ok(v->reg, false))
		verr(c, pc, "operand %s: bad offset register r%d", vn[which], v->reg);
	for (int k = 0; k < ndim; k++)
		if (v->stride[k] < -((int64_t)1 << 40) || v->stride[k] > ((int64_t)1 << 40)) {
			verr(c, pc, "operand %s: stride out of range", vn[which]);
			return;
		}
	if (v->base < -((int64_t)1 << 46) || v->base > ((int64_t)1 << 46) || v->scale < -((int64_t)1 << 40) ||
		v->scale > ((int64_t)1 << 40)) {
		verr(c, pc, "operand %s: offset out of range", vn[which]);
		return;
	}
	int64_t lo, hi;
	if (!view_extent(v, ndim, dim, &lo, &hi)) {
		verr(c, pc, "operand %s: the view's extent overflows", vn[which]);
		return;
	}
	/* with an offset register only the static part can be checked here;
	 * the simulator checks the rest when it runs */
	int64_t ne = view_numel(in, which, t);
	if (v->reg == -1 && (lo < 0 || hi >= ne))
		verr(c, pc, "operand %s: elements [%lld, %lld] outside tensor '%s' of %lld elements", vn[which],
			(long long)lo, (long long)hi, t->name, (long long)ne);
	if (v->reg != -1 && (lo > ne || hi - lo >= ne))
		verr(c, pc, "operand %s: a view of %lld elements cannot fit tensor '%s' of %lld", vn[which],
			(long long)(hi - lo + 1), t->name, (long long)ne);
}

#define SP(x) (1u << (x))

static int vdt(vc *c, const tcp_insn *in, int which)
{
	int t = in->v[which].t;
	return t >= 0 && (uint32_t)t < c->p->nt ? c->p->t[t].dtype : -1;
}

/* Takes a float-cluster ALU for op (mask of those taken): f.mul on FpMul0,
 * FpMul1, then FpFma; f.exp on FpExp, then FpFpu; the other transcendental
 * functions on FpFpu; add, sub, neg, abs and the scan on FpFma. */
static bool float_alu(const moe_tcp_machine *m, int op, int64_t *taken)
{
	static const int8_t mul[] = {TCP_FALU_MUL0, TCP_FALU_MUL1, TCP_FALU_FMA, -1}, ex[] = {TCP_FALU_EXP, TCP_FALU_FPU, -1},
			    fpu[] = {TCP_FALU_FPU, -1}, fma[] = {TCP_FALU_FMA, -1};
	const int8_t *pref = op == TCP_V_FMUL ? mul : op == TCP_V_FEXP ? ex :
		(op == TCP_V_FLOG || op == TCP_V_FSQRT || op == TCP_V_FTANH || op == TCP_V_FERF || op == TCP_V_FSIGM) ? fpu : fma;
	for (; *pref >= 0; pref++)
		if ((m->float_alus & (1 << *pref)) && !(*taken & (1 << *pref))) {
			*taken |= 1 << *pref;
			return true;
		}
	return false;
}

/* Whether a chain of n vector ops keeps the fixed stage order and finds a
 * float ALU for each float op (the rule check_vec applies); the lowering
 * asks it before fusing passes. */
bool tcp_vec_chain_ok(const moe_tcp_machine *m, const uint8_t *ops, int n)
{
	int last = -1;
	int64_t falu = 0;
	for (int s = 0; s < n; s++) {
		int stg = tcp_vop_stage[ops[s]];
		if ((stg <= last && !(stg == TCP_ST_FLOAT && last == TCP_ST_FLOAT)) ||
			(stg == TCP_ST_FLOAT && !float_alu(m, ops[s], &falu)))
			return false;
		last = stg;
	}
	return n <= TCP_MAXSTEP;
}

/* tu.vec: the ALU chain keeps the fixed stage order, each float ALU once
 * per pass; streams read are fetched. */
static void check_vec(vc *c, int64_t pc, const tcp_insn *in)
{
	const moe_tcp_machine *m = c->m;
	int last = -1;
	int64_t falu = 0;
	bool red = false;
	for (int s = 0; s < in->nstep; s++) {
		const tcp_step *st = &in->step[s];
		if (st->op >= TCP_V_COUNT || st->x > TCP_SRC_NONE || st->y > TCP_SRC_NONE ||
			(st->ctr >= in->ndim && (st->x == TCP_SRC_CTR || st->y == TCP_SRC_CTR))) {
			verr(c, pc, "step %d: bad operation or operand", s);
			continue;
		}
		int stg = tcp_vop_stage[st->op];
		if (stg == TCP_ST_FLOAT && last == TCP_ST_FLOAT) {
			/* the float cluster: another of its ALUs, each once per pass */
			if (!float_alu(m, st->op, &falu))
				verr(c, pc, "step %d (%s): no float ALU left in this pass (each of vector.float_alus is "
					"usable once)", s, tcp_vop_names[st->op]);
			continue;
		}
		if (stg <= last)
			verr(c, pc, "step %d (%s): stage %s after %s breaks the fixed stage order", s,
				tcp_vop_names[st->op], tcp_stage_names[stg], tcp_stage_names[last]);
		if (stg == TCP_ST_FLOAT && !float_alu(m, st->op, &falu))
			verr(c, pc, "step %d (%s): the machine has no float ALU for it", s, tcp_vop_names[st->op]);
		last = stg;
		if (stg == TCP_ST_REDUCE || st->op == TCP_V_COMPACT || st->op == TCP_V_ISCAN || st->op == TCP_V_FSCAN)
			red = true;
	}
	if (red && in->ndim < 1)
		verr(c, pc, "a reduce, scan or compaction needs an innermost dimension");
	check_view(c, pc, in, TCP_V_DST, SP(TCP_DM), true, in->ndim, in->dim);
	for (int w = TCP_V_S0; w <= TCP_V_S2; w++)
		check_view(c, pc, in, w, SP(TCP_DM) | SP(TCP_VRF), w == TCP_V_S0 && in->nstep == 0, in->ndim, in->dim);
	for (int s = 0; s < in->nstep; s++)
		for (int k = 0; k < 2; k++) {
			int src = k ? in->step[s].y : in->step[s].x;
			if (src >= TCP_SRC_S0 && src <= TCP_SRC_S2 && in->v[src - TCP_SRC_S0 + 1].t < 0)
				verr(c, pc, "step %d reads stream s%d that is not fetched", s, src - TCP_SRC_S0);
		}
}

/* i8 x i8: exact i32 sums (|product| <= 2^14, so at most 2^17 - 1 of them),
 * an i32 result (and i32 partial with acc), or with scaled f32 scales per
 * output and a float result. */
static void check_contract_i8(vc *c, int64_t pc, const tcp_insn *in, int w)
{
	int d = vdt(c, in, TCP_V_DST), p = vdt(c, in, TCP_V_S2);
	bool sc = in->flags & TCP_F_SCALED;
	if (w >= 0 && w != MOE_I8)
		return; /* the operand rule below names it */
	if (in->dim[2] > TCP_I8_MAX_REDUCTION)
		verr(c, pc, "an i8 contraction reduces at most %d elements (its i32 sum is exact), got %lld",
			TCP_I8_MAX_REDUCTION, (long long)in->dim[2]);
	if (in->flags & TCP_F_BF16X3)
		verr(c, pc, "i8 operands take no bf16x3 split");
	if (sc && ((in->flags & TCP_F_ACC) || p != MOE_F32 || (d != MOE_F32 && d != MOE_BF16)))
		verr(c, pc, "a scaled i8 contraction takes f32 scales per output in s2, no acc, and an f32 or bf16 "
			    "result");
	if (!sc && (d != MOE_I32 || ((in->flags & TCP_F_ACC) && p != MOE_I32)))
		verr(c, pc, "an i8 contraction without scales writes its i32 sums (and adds an i32 partial with acc)");
}

static void check_contract(vc *c, int64_t pc, const tcp_insn *in)
{
	const moe_tcp_machine *m = c->m;
	/* dims = [M, O, I]: dst[m,o] = sum_i s0[m,i] * s1[o,i] (+ s2[m,o]) */
	if (in->ndim != 3) {
		verr(c, pc, "contraction needs dims [rows, outputs, reduction]");
		return;
	}
	int64_t dmo[3] = {in->dim[0], in->dim[1], 1}, dmi[3] = {in->dim[0], 1, in->dim[2]},
		doi[3] = {1, in->dim[1], in->dim[2]};
	check_view(c, pc, in, TCP_V_DST, SP(TCP_DM), true, 3, dmo);
	check_view(c, pc, in, TCP_V_S0, SP(TCP_DM), true, 3, dmi);
	check_view(c, pc, in, TCP_V_S1, SP(TCP_TRF), true, 3, doi);
	int a = vdt(c, in, TCP_V_S0), w = vdt(c, in, TCP_V_S1);
	/* s2 with scaled: the f32 scales of (m, o, 128-wide chunk) for f8, of (m, o) for i8 */
	bool sc = in->flags & TCP_F_SCALED, i8 = a == MOE_I8;
	int64_t dch[3] = {in->dim[0], in->dim[1], i8 ? 1 : in->dim[2] / TCP_SCALE_CHUNK};
	if (in->flags & TCP_F_ROWDIV) { /* col[o] = s2[0, o, 0], row[m] = s2[m, 0, 1] */
		int64_t dcol[3] = {1, in->dim[1], 1}, drow[3] = {in->dim[0], 1, 1};
		tcp_insn r = *in;
		r.v[TCP_V_S2].base += in->v[TCP_V_S2].stride[2];
		check_view(c, pc, in, TCP_V_S2, SP(TCP_DM), true, 3, dcol);
		check_view(c, pc, &r, TCP_V_S2, SP(TCP_DM), true, 3, drow);
		if (!sc || !i8)
			verr(c, pc, "rowdiv divides the scale of a scaled i8 contraction");
	} else
		check_view(c, pc, in, TCP_V_S2, SP(TCP_DM), (in->flags & TCP_F_ACC) != 0 || sc, 3, sc ? dch : dmo);
	if (i8)
		check_contract_i8(c, pc, in, w);
	else if (sc && (a != MOE_F8E4M3 || (in->flags & (TCP_F_ACC | TCP_F_BF16X3)) || in->dim[2] % TCP_SCALE_CHUNK ||
			  vdt(c, in, TCP_V_S2) != MOE_F32))
		verr(c, pc, "a scaled contraction takes f8e4m3 operands, f32 scales in s2 and a reduction of whole "
			    "%d-element chunks, without acc", TCP_SCALE_CHUNK);
	if (a >= 0 && w >= 0 && (a != w || (a != MOE_BF16 && a != MOE_F32 && a != MOE_F8E4M3 && a != MOE_I8)))
		verr(c, pc, "contraction operands must both be bf16 (or f32 split into bf16 parts), both f8e4m3 or "
			    "both i8");
	if (a == MOE_F32 && !(in->flags & TCP_F_BF16X3))
		verr(c, pc, "f32 operands need the bf16x3 split");
	if (in->tile < 1 || in->tile > in->dim[1])
		verr(c, pc, "tile of %lld TRF rows per slice outside [1, %lld]", (long long)in->tile,
			(long long)in->dim[1]);
	else if (in->tile * in->dim[2] * (a == MOE_F32 ? 4 : a == MOE_F8E4M3 || a == MOE_I8 ? 1 : 2) > tcp_trf_bytes(m))
		verr(c, pc, "TRF tile of %lld rows x %lld does not fit %lld TRF bytes per slice", (long long)in->tile,
			(long long)in->dim[2], (long long)tcp_trf_bytes(m));
}

/* The largest number of bytes of an i32 index view [G, n] that one slice of
 * its DM tensor holds (views with an offset register: bounded by what the
 * layout puts on a slice). */
static int64_t index_bytes_per_slice(vc *c, const tcp_insn *in)
{
	const tcp_view *v = &in->v[TCP_V_S1];
	const tcp_tensor *t = &c->p->t[v->t];
	int64_t u = tcp_layout_unit(c->m, t), P = tcp_layout_group(c->m, t), n = in->dim[0] * in->dim[1];
	if (v->reg >= 0 || n > ((int64_t)1 << 22) || P > 65536) {
		int64_t most = tcp_slice_holds(c->m, t, 0);
		return 4 * n < most ? 4 * n : most;
	}
	int64_t *cnt = ctx_alloc(c->ctx, (size_t)P * sizeof *cnt), most = 0;
	for (int64_t g = 0; g < in->dim[0]; g++)
		for (int64_t j = 0; j < in->dim[1]; j++) {
			int64_t b = (v->base + g * v->stride[0] + j * v->stride[1]) * 4, q = b / u % P;
			if (b >= 0 && (cnt[q] += 4) > most)
				most = cnt[q];
		}
	ctx_free(c->ctx, cnt, (size_t)P * sizeof *cnt);
	return most;
}

/* dma.gather / dma.scatter: dims = [groups, n, row], the index list s1 is
 * [groups, n]. Indirect DMA has HBM on one side (MODEL.md section 3): a
 * gather moves HBM rows into DM by an HBM list of byte offsets (scaled) or a
 * DM list of row positions (unscaled, at most dma.index_bytes_per_pe of it
 * per slice); a scatter moves DM rows to HBM by an HBM list of byte offsets. */
static void check_gs(vc *c, int64_t pc, const tcp_insn *in)
{
	bool gather = in->op == TCP_OP_DMA_GATHER, scaled = in->flags & TCP_F_HBMIDX;
	unsigned dmh = SP(TCP_HBM) | SP(TCP_DM);
	if (in->ndim != 3 || in->rows < 1 || in->rows > ((int64_t)1 << 31)) {
		verr(c, pc, "gather/scatter need dims [groups, indices, row] and rows >= 1");
		return;
	}
	int64_t d3[3] = {in->dim[0], gather ? in->dim[1] : in->rows, in->dim[2]};
	int64_t s3[3] = {in->dim[0], gather ? in->rows : in->dim[1], in->dim[2]};
	int e0 = c->errors;
	check_view(c, pc, in, TCP_V_DST, dmh, true, 3, d3);
	check_view(c, pc, in, TCP_V_S0, dmh, true, 3, s3);
	check_view(c, pc, in, TCP_V_S1, dmh, true, 2, in->dim);
	if (c->errors != e0)
		return;
	if (vdt(c, in, TCP_V_S1) != MOE_I32)
		verr(c, pc, "index list must be i32");
	if (moe_dtype_size((moe_dtype)vdt(c, in, TCP_V_DST)) != moe_dtype_size((moe_dtype)vdt(c, in, TCP_V_S0)))
		verr(c, pc, "DMA moves bytes: element sizes differ");
	int ds = c->p->t[in->v[TCP_V_DST].t].space, ss = c->p->t[in->v[TCP_V_S0].t].space,
	    is = c->p->t[in->v[TCP_V_S1].t].space;
	const char *dn = ds == TCP_HBM ? "HBM" : "DM", *sn = ss == TCP_HBM ? "HBM" : "DM";
	if (gather && (ss != TCP_HBM || ds != TCP_DM))
		verr(c, pc, "a gather moves HBM rows into DM (dma.indirect.gather = hbm_to_dm), not %s -> %s", sn, dn);
	if (!gather && (ss != TCP_DM || ds != TCP_HBM))
		verr(c, pc, "a scatter moves DM rows to HBM (dma.indirect.scatter = dm_to_hbm), not %s -> %s", sn, dn);
	if (!gather && !scaled)
		verr(c, pc, "the unscaled scatter (a DM list of row positions) does not exist "
			    "(dma.indirect.unscaled_scatter = false): scatter by an HBM list of byte offsets (flags=scaled)");
	if (scaled && is != TCP_HBM)
		verr(c, pc, "a scaled %s reads its index list of byte offsets from HBM, not DM", gather ? "gather" : "scatter");
	if (scaled && in->v[ds == TCP_HBM ? TCP_V_DST : TCP_V_S0].stride[1] < 1)
		verr(c, pc, "a scaled %s needs a positive row stride on its HBM side", gather ? "gather" : "scatter");
	if (gather && !scaled && is != TCP_DM)
		verr(c, pc, "an unscaled gather reads its index list of row positions from DM, not HBM");
	if (gather && !scaled && is == TCP_DM && c->errors == e0) {
		int64_t most = index_bytes_per_slice(c, in), cap = tcp_index_bytes_per_pe(c->m);
		if (most > cap)
			verr(c, pc, "the index list puts %lld bytes on one slice, over dma.index_bytes_per_pe = %lld", (long long)most,
				(long long)cap);
	}
}

static void check_insn(vc *c, int64_t pc)
{
	const tcp_insn *in = &c->p->code[pc];
	if (in->op >= TCP_OP_COUNT) {
		verr(c, -1, "instruction %lld: unknown opcode %u", (long long)pc, in->op);
		return;
	}
	if (in->ndim > TCP_MAXD || in->nstep > TCP_MAXSTEP) {
		verr(c, pc, "too many dimensions or steps");
		return;
	}
	if (in->phase >= TCP_PH_COUNT) {
		verr(c, pc, "unknown phase %u", in->phase);
		return;
	}
	for (int k = 0; k < in->ndim; k++)
		if (in->dim[k] < 1 || in->dim[k] > ((int64_t)1 << 31)) {
			verr(c, pc, "dimension %d size %lld outside [1, 2^31]", k, (long long)in->dim[k]);
			return;
		}
	if ((in->flags & TCP_F_JOIN) && tcp_op_ctx[in->op] != TCP_CTX_DMA && tcp_op_ctx[in->op] != TCP_CTX_MAIN)
		verr(c, pc, "only a DMA command joins the preceding DMA command's descriptors (join), only a Tensor Unit pass "
			    "routes through the switch (switch)");
	unsigned nib = in->op == TCP_OP_TU_CONTRACT && (in->flags & TCP_F_I4) == 0 ? 0 : in->flags & (TCP_F_E2M1 | TCP_F_I4);
	if (nib && (in->op != TCP_OP_TU_VEC || nib == (TCP_F_E2M1 | TCP_F_I4) || (unsigned)in->v[TCP_V_S0].t >= c->p->nt ||
			   c->p->t[in->v[TCP_V_S0].t].space != TCP_DM))
		verr(c, pc, "4-bit decoding (e2m1 or i4, not both) applies to a vector pass's s0 in DM");
	if ((in->flags & TCP_F_SCALED) && in->op != TCP_OP_TU_CONTRACT && in->op != TCP_OP_DMA_GATHER &&
		in->op != TCP_OP_DMA_SCATTER)
		verr(c, pc, "only a contraction, a gather or a scatter is scaled");
	if ((in->flags & TCP_F_XSLICE) && in->op != TCP_OP_TU_VEC && in->op != TCP_OP_SUB_TRF && in->op != TCP_OP_SUB_VRF)
		verr(c, pc, "only a vector pass or a sub load crosses slices (xslice)");
	if ((in->flags & TCP_F_VROWS) && in->op != TCP_OP_DMA_GATHER && in->op != TCP_OP_DMA_SCATTER)
		verr(c, pc, "only a gather or scatter counts valid groups (vrows)");
	if (in->vreg != -1 && !reg_ok(in->vreg, false))
		verr(c, pc, "bad valid-count register r%d", in->vreg);
	unsigned dmh = SP(TCP_HBM) | SP(TCP_DM);
	switch ((tcp_opcode)in->op) {
	case TCP_OP_HALT:
		break;
	case TCP_OP_LI:
		if (!reg_ok(in->rd, false))
			verr(c, pc, "bad destination register");
		break;
	case TCP_OP_ALU:
		if (in->sop >= TCP_S_COUNT || !reg_ok(in->rd, false) || !reg_ok(in->ra, false) || !reg_ok(in->rb, true))
			verr(c, pc, "bad operation or register");
		break;
	case TCP_OP_LD:
		if (!reg_ok(in->rd, false))
			verr(c, pc, "bad destination register");
		check_view(c, pc, in, TCP_V_S0, dmh, true, 0, in->dim);
		if (vdt(c, in, TCP_V_S0) != MOE_I32)
			verr(c, pc, "ld reads i32 tensors only");
		break;
	case TCP_OP_BR:
		if (in->sop >= TCP_C_COUNT || !reg_ok(in->ra, false) || !reg_ok(in->rb, false))
			verr(c, pc, "bad condition or register");
		/* fallthrough */
	case TCP_OP_JMP:
		if (in->target < 0 || (uint32_t)in->target >= c->p->ncode)
			verr(c, pc, "branch target %d outside the code (%u instructions)", in->target, c->p->ncode);
		break;
	case TCP_OP_SIG:
	case TCP_OP_WAIT:
		if (in->target < 0 || in->target >= TCP_NTOK || in->sop < TCP_CTX_MAIN || in->sop >= TCP_NCTX)
			verr(c, pc, "bad token or context");
		break;
	case TCP_OP_DMA_COPY:
		if (in->ndim < 1)
			verr(c, pc, "needs at least one dimension");
		check_view(c, pc, in, TCP_V_DST, dmh, true, in->ndim, in->dim);
		check_view(c, pc, in, TCP_V_S0, dmh, true, in->ndim, in->dim);
		if (vdt(c, in, TCP_V_DST) >= 0 && vdt(c, in, TCP_V_S0) >= 0 &&
			moe_dtype_size((moe_dtype)vdt(c, in, TCP_V_DST)) != moe_dtype_size((moe_dtype)vdt(c, in, TCP_V_S0)))
			verr(c, pc, "DMA copies bytes: element sizes differ");
		break;
	case TCP_OP_DMA_GATHER:
	case TCP_OP_DMA_SCATTER: check_gs(c, pc, in); break;
	case TCP_OP_DMA_SPM:
		/* up to three i32 views staged into the control processor's SPM */
		if (in->ndim < 1)
			verr(c, pc, "needs at least one dimension");
		if (in->v[TCP_V_DST].t >= 0)
			verr(c, pc, "dma.spm has no dst (it writes SPM)");
		for (int w = TCP_V_S0; w <= TCP_V_S2; w++) {
			check_view(c, pc, in, w, dmh, w == TCP_V_S0, in->ndim, in->dim);
			if (in->v[w].t >= 0 && vdt(c, in, w) != MOE_I32)
				verr(c, pc, "dma.spm stages i32 tensors only");
		}
		break;
	case TCP_OP_SUB_TRF:
	case TCP_OP_SUB_VRF:
		if (in->ndim < 1)
			verr(c, pc, "needs at least one dimension");
		check_view(c, pc, in, TCP_V_DST, SP(in->op == TCP_OP_SUB_TRF ? TCP_TRF : TCP_VRF), true, in->ndim, in->dim);
		check_view(c, pc, in, TCP_V_S0, SP(TCP_DM), true, in->ndim, in->dim);
		if (c->errors == 0 && !(in->flags & TCP_F_SWITCH) && !tcp_load_local(c->p, c->m, in, c->why, sizeof c->why))
			verr(c, pc, "%s: a slice's load reads only its own DM (without flags=xslice, the switch)", c->why);
		break;
	case TCP_OP_TU_VEC:
	case TCP_OP_TU_CONTRACT:
		(in->op == TCP_OP_TU_VEC ? check_vec : check_contract)(c, pc, in);
		if (c->errors == 0 && !(in->flags & TCP_F_ROUTE) && tcp_pass_remote(c->p, c->m, in, c->why, sizeof c->why))
			verr(c, pc, "%s: a slice fetches and commits only its own DM (without flags=switch)", c->why);
		break;
	case TCP_OP_COUNT:
		break;
	}
}

moe_status tcp_validate(moe_ctx *ctx, const tcp_program *p, const moe_tcp_machine *m, const char *file)
{
	vc c = {ctx, p, m, file ? file : "<program>", 0, ""};
	check_tensors(&c);
	if (p->ncode == 0)
		verr(&c, -1, "program has no instructions");
	/* check_insn indexes by a tensor's space and dtype: only with valid tensors */
	for (uint32_t i = 0; i < p->ncode && c.errors == 0; i++)
		check_insn(&c, i);
	if (p->ncode && p->code[p->ncode - 1].op != TCP_OP_HALT && p->code[p->ncode - 1].op != TCP_OP_JMP)
		verr(&c, -1, "the last instruction must be halt or jmp (control would run off the code)");
	if (p->nblocks_t >= (int32_t)p->nt || p->bexp_t >= (int32_t)p->nt || p->nblocks_t < -1 || p->bexp_t < -1 ||
		p->block_loop_pc >= (int32_t)p->ncode || p->block_body_pc >= (int32_t)p->ncode ||
		p->tier_loop_pc >= (int32_t)p->ncode || p->tier_bexp_t >= (int32_t)p->nt || p->tier_loop_pc < -1 ||
		p->tier_bexp_t < -1 || p->tier_n < 0 || p->tier_n > p->moe_T)
		verr(&c, -1, "program metadata names a tensor or instruction that does not exist");
	bool packed = false;
	for (uint32_t i = 0; i < p->nt; i++)
		packed |= p->t[i].kind == TCP_T_PACKED;
	if (packed || p->prep_len) {
		/* the weight-packing graph parses, verifies and matches the packed tensors */
		moe_module *pm = tcp_prep_module(ctx, p, c.file);
		if (!pm)
			c.errors++;
		moe_module_free(pm);
	}
	if (c.errors > 20)
		moe_diag(ctx, MOE_DIAG_NOTE, moe_loc_file(ctx, c.file), "%d further errors not shown", c.errors - 20);
	return c.errors ? MOE_ERR_FORMAT : MOE_OK;
}

const char *const tcp_kind_names[TCP_NKIND] = {"scratch", "input", "weight", "output", "const", "packed"};

void tcp_set_source(tcp_program *p, int32_t t, const char *source)
{
	tcp_tensor *tt = &p->t[t];
	str_free(p->ctx, tt->source);
	tt->source = no_str;
	tt->source = str_dup(p->ctx, source);
}
