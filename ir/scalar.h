/* ir/scalar.h: the scalar semantics of IR ops that every executor shares
 * (the interpreter, the host backend's constant folding, the TCP simulator),
 * so that they cannot drift apart. docs/ir.md is the prose definition. */
#ifndef MOEC_IR_SCALAR_H
#define MOEC_IR_SCALAR_H

#include <math.h>
#include <stdint.h>

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

#endif
