/* ir/quant.h: the quantized weight formats read by the `dequant` op.
 *
 * A quantized weight is two values: q, the packed elements, and s, their
 * scales, both with the same leading (expert) dims; `dequant(q, s,
 * format=F, block=[BN, BK])` is the float weight [..., N, K] with
 *   W[.., n, k] = decode(q, n, k) * scale(s[.., n / BN, k / BK])
 * rounded once to the result type (attribute `to`, f32 by default). Formats:
 *   fp8    q f8e4m3 [.., N, K]; s float [.., ceil(N/BN), ceil(K/BK)] (block FP8
 *          128x128 as DeepSeek-V3, Qwen3-FP8; per-channel FP8 is BN = 1, BK = K);
 *          edge blocks may be partial.
 *   mxfp4  q u8 [.., N, K/2] (element 2j in the low nibble of byte j, 2j+1 in
 *          the high), E2M1 values; s u8 [.., N, K/32] E8M0 exponents 2^(s-127);
 *          block [1, 32] (gpt-oss).
 *   int4   q i32 [.., N, ceil(K/8)] (element 8j+i is nibble i of word j, least
 *          significant first, value nibble - 8); s float [.., N, K/BK]; block
 *          [1, BK] (compressed-tensors pack-quantized, symmetric); attribute
 *          `k` gives K when it is not 8 x the packed width.
 *   gptq   four operands (q, s, z, g): q i32 [.., K/8, N] packed along K
 *          (element k of column n is nibble k%8 of word q[k/8, n], least
 *          significant first, unsigned 0..15); s float [.., NG, N] with
 *          NG = ceil(K/G); z i32 [.., NG, ceil(N/8)] zero points packed along N
 *          (nibble n%8 of z[grp, n/8]); g i32 [.., K] the group of each input
 *          channel (act-order permutes it); block [1, G]; attribute `zp` is
 *          added to each stored zero point (1 for GPTQ v1 checkpoints, 0 for
 *          gptq_v2). W[n, k] = f16((q - (z + zp)) * s[g[k], n]): each product
 *          is rounded to f16 (the checkpoint's scale type), then to `to`.
 *   awq    three operands (q, s, z), AutoAWQ's GEMM layout: q i32 [.., K, N/8]
 *          packed along N, z i32 [.., NG, N/8] likewise, s float [.., NG, N],
 *          NG = ceil(K/G), block [1, G]; output channel 8c+j of a word is its
 *          nibble (j/2) + 4(j%2) (packing order 0,2,4,6,1,3,5,7).
 *          W[n, k] = f16((q - z) * s[k/G, n]), then rounded to `to`.
 *   int8   q u8 [.., N, K], the bytes of two's-complement int8 values; s float
 *          [.., N, K/BK]; block [1, BK] (compressed-tensors int-quantized,
 *          symmetric, per channel: BK = K). W = f32(int8(q) * s), then `to`.
 *          With act="int8" (W8A8) the activation each such weight is
 *          contracted with is quantized per row first, as the reference does
 *          dynamically per token: m = max(max|x|, 1e-10), v = x * f32(127 / m),
 *          q = v rounded half away from zero (|q| <= 127), x' = q * f32(m / 127);
 *          blockwise-dispatch writes that quantization into the graph.
 *   nvfp4  three operands (q, s, g): q u8 [.., N, K/2] (element 2j in the low
 *          nibble of byte j, 2j+1 in the high), E2M1 values; s f8e4m3
 *          [.., N, K/16] (E4M3 scale per 16 elements); g f32 [.., 1], the
 *          global scale of each matrix; block [1, 16]. Attribute `gscale`
 *          says how g combines with a block scale, in f32: "div" (compressed-
 *          tensors' weight_global_scale) W = e2m1 * f32(e4m3(s) / g); "mul"
 *          (ModelOpt's weight_scale_2) W = e2m1 * f32(e4m3(s) * g); the
 *          product rounded once to f32, then to `to`.
 * Scalars here are shared by every executor so they cannot drift apart. */
#ifndef MOEC_IR_QUANT_H
#define MOEC_IR_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef enum qt_format { QT_FP8, QT_MXFP4, QT_INT4, QT_GPTQ, QT_AWQ, QT_NVFP4, QT_INT8, QT_NFORMATS } qt_format;

/* x rounded to IEEE binary16 (nearest even, subnormals, overflow to
 * infinity) and widened back to f32. */
static inline float qt_f16(float x)
{
	if (x != x)
		return x;
	float a = fabsf(x), r;
	if (a < 0x1p-14f) { /* subnormal: multiples of 2^-24, the ulp of 0.5 in f32 */
		r = (a + 0.5f) - 0.5f;
	} else {
		uint32_t b;
		memcpy(&b, &a, 4);
		b = (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu;
		memcpy(&r, &b, 4);
		if (r > 65504.0f)
			r = INFINITY;
	}
	return x < 0 ? -r : r;
}

/* E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN, largest 448. */
static inline float qt_e4m3(uint32_t b)
{
	uint32_t e = (b >> 3) & 15u, m = b & 7u;
	float v = (b & 0x7fu) == 0x7fu ? NAN : e ? ldexpf((float)(8u + m), (int)e - 10) : ldexpf((float)m, -9);
	return b & 0x80u ? -v : v;
}

/* E2M1: bit 3 the sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6. */
static inline float qt_e2m1(uint32_t nib)
{
	uint32_t c = nib & 7u;
	float v = c < 2 ? 0.5f * (float)c : ldexpf((float)(2u + (c & 1u)), (int)(c >> 1) - 2);
	return nib & 8u ? -v : v;
}

/* E8M0: 2^(s - 127); 255 is NaN. */
static inline float qt_e8m0(uint32_t s)
{
	s &= 0xffu;
	return s == 255u ? NAN : ldexpf(1.0f, (int)s - 127);
}

/* One element of a dequantized weight in f32 (before rounding to `to`):
 * raw = the packed byte (fp8, mxfp4) or word (int4) holding element k,
 * scale = the scale element (for mxfp4 its E8M0 byte). */
static inline float qt_value(qt_format f, uint32_t raw, int64_t k, float scale_f, uint32_t scale_u8)
{
	switch (f) {
	case QT_FP8: return qt_e4m3(raw) * scale_f;
	case QT_MXFP4: return qt_e2m1(k & 1 ? raw >> 4 : raw & 15u) * qt_e8m0(scale_u8);
	case QT_INT8: return (float)((int32_t)(raw & 255u) - (int32_t)((raw & 128u) << 1)) * scale_f;
	default: return (float)((int32_t)((raw >> (4 * (k & 7))) & 15u) - 8) * scale_f;
	}
}

/* Elements per packed q element: 1, 2, 8. */
static inline int64_t qt_pack(qt_format f)
{
	return f == QT_FP8 || f == QT_INT8 ? 1 : f == QT_MXFP4 || f == QT_NVFP4 ? 2 : 8;
}

/* One nvfp4 element k: the byte holding it, its E4M3 scale byte, the global
 * scale g and whether g divides (gscale "div") or multiplies ("mul"). */
static inline float qt_nvfp4(uint32_t raw, int64_t k, uint32_t sbyte, float g, int div)
{
	float s = div ? qt_e4m3(sbyte) / g : qt_e4m3(sbyte) * g;
	return qt_e2m1(k & 1 ? raw >> 4 : raw & 15u) * s;
}

/* The nibble of an awq word holding output channel 8c + j. */
static inline int qt_awq_nibble(int64_t j)
{
	return (int)((j & 7) >> 1) + (int)((j & 1) << 2);
}

/* One awq element of output channel n: its value word, its zero-point word, the scale. */
static inline float qt_awq(uint32_t qword, uint32_t zword, int64_t n, float scale)
{
	int sh = 4 * qt_awq_nibble(n);
	return qt_f16((float)((int32_t)((qword >> sh) & 15u) - (int32_t)((zword >> sh) & 15u)) * scale);
}

/* One gptq element: the word holding it, its zero-point word, the scale. */
static inline float qt_gptq(uint32_t qword, int64_t k, uint32_t zword, int64_t n, int64_t zp, float scale)
{
	int32_t q = (int32_t)((qword >> (4 * (k & 7))) & 15u), z = (int32_t)((zword >> (4 * (n & 7))) & 15u);
	return qt_f16((float)(q - z - (int32_t)zp) * scale);
}

/* The format named by a dequant node's `format`, -1 if unknown. */
static inline int qt_format_from_name(const char *s)
{
	return !s ? -1 : !strcmp(s, "fp8") ? QT_FP8 : !strcmp(s, "mxfp4") ? QT_MXFP4 : !strcmp(s, "int4") ? QT_INT4
	       : !strcmp(s, "gptq") ? QT_GPTQ : !strcmp(s, "awq") ? QT_AWQ : !strcmp(s, "nvfp4") ? QT_NVFP4
	       : !strcmp(s, "int8") ? QT_INT8 : -1;
}

/* A dequant node's geometry, filled by ir_dequant_info from a verified node. */
typedef struct qt_info {
	qt_format fmt;
	int64_t bn, bk; /* block */
	int64_t N, K;   /* result's last two dims */
} qt_info;

#endif
