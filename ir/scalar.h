/* ir/scalar.h: the scalar semantics of the elementwise ops of moec/ops.def,
 * written once and shared by every executor: the reference interpreter
 * (interp/), the host backend's constant folding (backend-c/lower.c), the
 * TCP simulator's vector-engine primitives (backend-tcp/sim/sim_exec.c) and the
 * canonicalize pass, which expands composite ops for the code generators.
 * docs/ir.md is the prose definition; docs/semantics.md the routing rules.
 *
 * Floats are computed in f32 from f32 operands; transcendental functions are
 * evaluated in double and rounded once to f32; the caller rounds the result
 * to the node's dtype (bf16). Integers wrap (two's complement).
 *
 * Composite ops (SC_COMPOSITES below) are defined by a short sequence of
 * primitive elementwise ops, each step's value rounded to the node's dtype.
 * The interpreter evaluates that sequence per element; canonicalize rewrites
 * the node into those nodes, so no code generator needs a case for it.
 * Adding one is a row of ops.def plus a row here. */
#ifndef MOEC_IR_SCALAR_H
#define MOEC_IR_SCALAR_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "moec/ir.h"

/* float -> i32: truncate toward 0, NaN -> 0, saturate at the i32 range */
static inline int32_t sc_f2i(float x)
{
	if (isnan(x))
		return 0;
	if (x >= 2147483648.0f)
		return INT32_MAX;
	if (x <= -2147483648.0f)
		return INT32_MIN;
	return (int32_t)x;
}

/* max/min: NaN if either operand is NaN; -0 orders below +0 */
static inline float sc_fmax(float a, float b)
{
	if (isnan(a))
		return a;
	if (isnan(b))
		return b;
	if (a == b)
		return signbit(a) ? b : a;
	return a > b ? a : b;
}

static inline float sc_fmin(float a, float b)
{
	if (isnan(a))
		return a;
	if (isnan(b))
		return b;
	if (a == b)
		return signbit(a) ? a : b;
	return a < b ? a : b;
}

/* ---- f32 arithmetic with a defined NaN (docs/abi.md) ----
 * IEEE 754 leaves open which NaN operand an operation returns, x86 returns its
 * first source operand's, and compilers may swap the operands of a commutative
 * add or mul. So add/sub/mul/div state it: the first operand if it is a NaN,
 * else the second if it is one, quieted (the quiet bit set, sign and payload
 * kept); otherwise the IEEE result (an invalid operation gives the CPU's
 * default NaN, which only inf - inf, 0 * inf, 0 / 0 and inf / inf produce). */
static inline float sc_quiet(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof u);
	u |= 0x00400000u;
	memcpy(&x, &u, sizeof x);
	return x;
}

static inline float sc_nan2(float a, float b, float r)
{
	return isnan(a) ? sc_quiet(a) : isnan(b) ? sc_quiet(b) : r;
}

static inline float sc_fadd(float a, float b) { return sc_nan2(a, b, a + b); }
static inline float sc_fsub(float a, float b) { return sc_nan2(a, b, a - b); }
static inline float sc_fmul(float a, float b) { return sc_nan2(a, b, a * b); }
static inline float sc_fdiv(float a, float b) { return sc_nan2(a, b, a / b); }

/* ---- float primitives (double inside, one rounding to f32) ---- */
static inline float sc_exp(float x) { return (float)exp((double)x); }
static inline float sc_log(float x) { return (float)log((double)x); }
static inline float sc_sqrt(float x) { return (float)sqrt((double)x); }
static inline float sc_rsqrt(float x) { return (float)(1.0 / sqrt((double)x)); }
static inline float sc_tanh(float x) { return (float)tanh((double)x); }
static inline float sc_erf(float x) { return (float)erf((double)x); }
static inline float sc_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

static inline int32_t sc_wrap(uint32_t u)
{
	return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)(u - 2147483648u) + INT32_MIN;
}

/* x >> s with the sign bit copied in (s taken mod 32) */
static inline int32_t sc_sar(int32_t a, int32_t b)
{
	uint32_t ua = (uint32_t)a, s = (uint32_t)b & 31u;
	return a >= 0 ? (int32_t)(ua >> s) : ~(int32_t)(~ua >> s);
}

/* ---- the primitive elementwise ops ---- */
/* Float unary op. false if op is not one. */
static inline bool sc_unary_f(moe_op op, float x, float *r)
{
	switch (op) {
	case MOE_OP_NEG: *r = -x; return true;
	case MOE_OP_ABS: *r = fabsf(x); return true;
	case MOE_OP_EXP: *r = sc_exp(x); return true;
	case MOE_OP_LOG: *r = sc_log(x); return true;
	case MOE_OP_SQRT: *r = sc_sqrt(x); return true;
	case MOE_OP_RSQRT: *r = sc_rsqrt(x); return true;
	case MOE_OP_TANH: *r = sc_tanh(x); return true;
	case MOE_OP_ERF: *r = sc_erf(x); return true;
	case MOE_OP_SIGMOID: *r = sc_sigmoid(x); return true;
	default: return false;
	}
}

/* Integer (i32 or bool) unary op. false if op is not one. */
static inline bool sc_unary_i(moe_op op, moe_dtype t, int32_t x, int32_t *r)
{
	switch (op) {
	case MOE_OP_NEG: *r = sc_wrap(0u - (uint32_t)x); return true;
	case MOE_OP_ABS: *r = x < 0 ? sc_wrap(0u - (uint32_t)x) : x; return true;
	case MOE_OP_NOT: *r = t == MOE_BOOL ? !x : ~x; return true;
	default: return false;
	}
}

/* Float binary op: the value in *r, or 0/1 in *r for a comparison (then
 * *cmp is set). false if op is not one. */
static inline bool sc_binary_f(moe_op op, float a, float b, float *r, int32_t *cmp)
{
	switch (op) {
	case MOE_OP_ADD: *r = sc_fadd(a, b); return true;
	case MOE_OP_SUB: *r = sc_fsub(a, b); return true;
	case MOE_OP_MUL: *r = sc_fmul(a, b); return true;
	case MOE_OP_DIV: *r = sc_fdiv(a, b); return true;
	case MOE_OP_MIN: *r = sc_fmin(a, b); return true;
	case MOE_OP_MAX: *r = sc_fmax(a, b); return true;
	case MOE_OP_EQ: *cmp = a == b; return true;
	case MOE_OP_NE: *cmp = a != b; return true;
	case MOE_OP_LT: *cmp = a < b; return true;
	case MOE_OP_LE: *cmp = a <= b; return true;
	case MOE_OP_GT: *cmp = a > b; return true;
	case MOE_OP_GE: *cmp = a >= b; return true;
	default: return false;
	}
}

typedef enum sc_ires { SC_OK, SC_DIV0, SC_NOT_OP } sc_ires;

/* Integer binary op (division truncates; INT32_MIN / -1 is INT32_MIN). */
static inline sc_ires sc_binary_i(moe_op op, int32_t a, int32_t b, int32_t *r)
{
	uint32_t ua = (uint32_t)a, ub = (uint32_t)b, s = ub & 31u;
	switch (op) {
	case MOE_OP_ADD: *r = sc_wrap(ua + ub); break;
	case MOE_OP_SUB: *r = sc_wrap(ua - ub); break;
	case MOE_OP_MUL: *r = sc_wrap(ua * ub); break;
	case MOE_OP_DIV:
		if (b == 0)
			return SC_DIV0;
		*r = a == INT32_MIN && b == -1 ? INT32_MIN : a / b;
		break;
	case MOE_OP_MIN: *r = a < b ? a : b; break;
	case MOE_OP_MAX: *r = a > b ? a : b; break;
	case MOE_OP_AND: *r = a & b; break;
	case MOE_OP_OR: *r = a | b; break;
	case MOE_OP_XOR: *r = a ^ b; break;
	case MOE_OP_SHL: *r = sc_wrap(ua << s); break;
	case MOE_OP_SHR: *r = sc_wrap(ua >> s); break;
	case MOE_OP_SAR: *r = sc_sar(a, b); break;
	case MOE_OP_EQ: *r = a == b; break;
	case MOE_OP_NE: *r = a != b; break;
	case MOE_OP_LT: *r = a < b; break;
	case MOE_OP_LE: *r = a <= b; break;
	case MOE_OP_GT: *r = a > b; break;
	case MOE_OP_GE: *r = a >= b; break;
	default: return SC_NOT_OP;
	}
	return SC_OK;
}

/* ---- composite elementwise ops (float only) ----
 * A step applies a primitive op to two sources: SC_X0..SC_X2 (the node's
 * operands), SC_IMM (the step's constant), SC_S(k) (step k's value), or
 * SC_NO (unary op). The last step's value is the result.
 *   X(ID, steps...)   one row per composite op */
enum { SC_NO = -2, SC_IMM = -1, SC_X0 = 0, SC_X1 = 1, SC_X2 = 2 };
#define SC_S(k) (8 + (k))
#define SC_COMPOSITES(X) \
	X(RELU2, {MOE_OP_MAX, SC_X0, SC_IMM, 0.0f}, {MOE_OP_MUL, SC_S(0), SC_S(0), 0.0f}) /* max(x, 0)^2 */

typedef struct sc_step {
	moe_op op;
	int8_t a, b;
	float imm;
} sc_step;
enum { SC_MAX_STEPS = 8 };
typedef struct sc_composite_def {
	int nsteps;
	sc_step step[SC_MAX_STEPS];
} sc_composite_def;

/* The definition of op if it is composite, else NULL. */
static inline const sc_composite_def *sc_composite(moe_op op)
{
	switch (op) {
#define SC_ROW(id, ...)                                                                    \
	case MOE_OP_##id: {                                                                \
		static const sc_step s[] = {__VA_ARGS__};                                  \
		static const sc_composite_def d = {(int)(sizeof s / sizeof *s), {__VA_ARGS__}}; \
		return &d;                                                                 \
	}
		SC_COMPOSITES(SC_ROW)
#undef SC_ROW
	default: return NULL;
	}
}

/* A composite op on one element: x are its operands, round(t, v) rounds a
 * step's value to the node's dtype. */
static inline float sc_composite_eval(const sc_composite_def *d, const float *x, float (*round)(int, float), int t)
{
	float v[SC_MAX_STEPS] = {0};
	for (int k = 0; k < d->nsteps; k++) {
		const sc_step *s = &d->step[k];
		float in[2];
		int8_t src[2] = {s->a, s->b};
		for (int j = 0; j < 2; j++)
			in[j] = src[j] == SC_IMM ? s->imm : src[j] >= SC_S(0) ? v[src[j] - SC_S(0)] :
				src[j] >= 0 ? x[src[j]] : 0.0f;
		int32_t cmp = 0;
		float r = 0;
		if (s->b == SC_NO)
			sc_unary_f(s->op, in[0], &r);
		else
			sc_binary_f(s->op, in[0], in[1], &r, &cmp);
		v[k] = round(t, r);
	}
	return v[d->nsteps - 1];
}

#endif
