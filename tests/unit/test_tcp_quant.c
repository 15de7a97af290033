/* tests/unit/test_tcp_quant.c: the TCP simulator's quantized element
 * conversions (backend-tcp/sim/sim_quant.h) against the format
 * definitions: the cast stage's f32 -> E4M3fn rounding (every code, the
 * midpoints between neighbours, the saturation edge) and the fetch unit's
 * 4-bit decodings (E2M1 through the table, i4 less the zero point). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "backend-tcp/sim/sim_quant.h"

static float bits_f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Every finite code encodes back to itself (signed zeros included); NaN codes give NaN. */
static void test_e4m3_codes_round_trip(void **state)
{
	(void)state;
	for (uint32_t c = 0; c < 256; c++) {
		float v = qt_e4m3(c);
		uint8_t back = tcpq_to_e4m3(v);
		if ((c & 0x7f) == 0x7f)
			assert_int_equal(back & 0x7f, 0x7f);
		else
			assert_int_equal(back, c);
	}
}

/* Between two neighbouring positive codes the midpoint goes to the even
 * code, anything past it to the upper one; negative values mirror. */
static void test_e4m3_nearest_even(void **state)
{
	(void)state;
	for (uint32_t c = 0; c < 126; c++) {
		float lo = qt_e4m3(c), hi = qt_e4m3(c + 1), mid = (lo + hi) / 2;
		uint32_t even = (c & 1) ? c + 1 : c;
		assert_int_equal(tcpq_to_e4m3(mid), even);
		assert_int_equal(tcpq_to_e4m3(nextafterf(mid, hi)), c + 1);
		assert_int_equal(tcpq_to_e4m3(nextafterf(mid, lo)), c);
		assert_int_equal(tcpq_to_e4m3(-mid), 0x80 | even);
	}
	/* 448 is the largest; 464 (the midpoint to the missing 480) ties to it, past it is NaN */
	assert_int_equal(tcpq_to_e4m3(464.0f), 0x7e);
	assert_int_equal(tcpq_to_e4m3(nextafterf(464.0f, 1e9f)), 0x7f);
	assert_int_equal(tcpq_to_e4m3(-1e9f), 0xff);
	assert_int_equal(tcpq_to_e4m3(NAN) & 0x7f, 0x7f);
	assert_int_equal(tcpq_to_e4m3(1e-30f), 0); /* below half the smallest subnormal, 2^-10 */
}

/* Element i of a byte stream: the low nibble of byte i/2 when i is even. */
static void test_nibble_words(void **state)
{
	(void)state;
	const uint8_t b[2] = {0x21, 0xf8};
	static const float e2m1[4] = {0.5f, 1.0f, -0.0f, -6.0f};
	static const int32_t i4[4] = {-7, -6, 0, 7};
	for (int i = 0; i < 4; i++) {
		float f = bits_f(tcpq_nibble_word(b, i, TCP_F_E2M1));
		assert_true(f == e2m1[i] && signbit(f) == signbit(e2m1[i]));
		assert_int_equal((int32_t)tcpq_nibble_word(b, i, TCP_F_I4), i4[i]);
	}
	/* every E2M1 code decodes to the table value (0, .5, 1, 1.5, 2, 3, 4, 6, signed by bit 3) */
	static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
	for (uint8_t n = 0; n < 16; n++) {
		uint8_t byte = n;
		float f = bits_f(tcpq_nibble_word(&byte, 0, TCP_F_E2M1));
		assert_true(f == ((n & 8) ? -mag[n & 7] : mag[n & 7]));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_e4m3_codes_round_trip),
		cmocka_unit_test(test_e4m3_nearest_even),
		cmocka_unit_test(test_nibble_words),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
