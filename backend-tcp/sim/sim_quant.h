/* backend-tcp/sim/sim_quant.h: the simulator's quantized element conversions
 * (docs/tcp-isa.md sections 5 and 6): the fetch unit widens
 * f8e4m3 to the f32 lane word and decodes 4-bit streams (E2M1 through its
 * table to f8e4m3, then f32; i4 less the zero point 8, to i32), and the cast
 * stage narrows f32 to f8e4m3, rounding to nearest even. */
#ifndef MOEC_TCP_SIM_QUANT_H
#define MOEC_TCP_SIM_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"
#include "ir/quant.h"

static inline uint32_t tcpq_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

/* f32 -> E4M3fn byte, nearest even; NaN and magnitudes past 464 (the midpoint
 * of 448 and the next step, 480, which fn lacks; 464 itself ties to 448) are
 * the NaN code. */
static inline uint8_t tcpq_to_e4m3(float f)
{
	uint8_t sign = signbit(f) ? 0x80u : 0u;
	float a = fabsf(f);
	if (isnan(a) || a > 464.0f)
		return (uint8_t)(sign | 0x7fu);
	int e;
	frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
	int ex = e - 1 < -6 ? -6 : e - 1; /* unbiased exponent, subnormals at 2^-6 */
	float q = ldexpf(a, 3 - ex);     /* the value in units of the last mantissa bit */
	float r = nearbyintf(q);          /* the default rounding mode: nearest even */
	int64_t m = (int64_t)r;
	if (m >= 16) { /* rounded up into the next binade */
		m >>= 1;
		ex++;
	}
	if (m == 0)
		return sign;
	if (m < 8) /* subnormal */
		return (uint8_t)(sign | (uint32_t)m);
	return (uint8_t)(sign | (uint32_t)((ex + 7) << 3) | (uint32_t)(m - 8));
}

/* The lane word of 4-bit element i of a tensor's bytes (flags TCP_F_E2M1 or TCP_F_I4). */
static inline uint32_t tcpq_nibble_word(const uint8_t *bytes, int64_t i, unsigned flags)
{
	uint32_t nib = i & 1 ? (uint32_t)bytes[i >> 1] >> 4 : (uint32_t)bytes[i >> 1] & 15u;
	if (flags & TCP_F_E2M1)
		return tcpq_bits(qt_e2m1(nib));
	return (uint32_t)((int32_t)nib - 8);
}

#endif
