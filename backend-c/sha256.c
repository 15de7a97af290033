/* backend-c/sha256.c: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for
 * the JIT cache's entry names and its keyed integrity check (jit_cache.c).
 * Checked against the FIPS 180 examples and the RFC 4231 test cases
 * (tests/unit/test_jit_cache.c). */
#include <string.h>

#include "backend-c/cgen.h"

static const uint32_t K[64] = {
	0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
	0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
	0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
	0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
	0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
	0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
	0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
	0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

static uint32_t ror(uint32_t x, int n)
{
	return (x >> n) | (x << (32 - n));
}

static void block(cgen_sha256 *s, const unsigned char *p)
{
	uint32_t w[64];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6],
		 h = s->h[7];
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
		uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
		h = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	s->h[0] += a;
	s->h[1] += b;
	s->h[2] += c;
	s->h[3] += d;
	s->h[4] += e;
	s->h[5] += f;
	s->h[6] += g;
	s->h[7] += h;
}

void cgen_sha256_init(cgen_sha256 *s)
{
	static const uint32_t h0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au, 0x510e527fu, 0x9b05688cu,
		0x1f83d9abu, 0x5be0cd19u};
	memcpy(s->h, h0, sizeof h0);
	s->bytes = 0;
	s->nbuf = 0;
}

void cgen_sha256_update(cgen_sha256 *s, const void *data, size_t n)
{
	const unsigned char *p = data;
	s->bytes += n;
	if (s->nbuf) {
		size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
		memcpy(s->buf + s->nbuf, p, k);
		s->nbuf += k;
		p += k;
		n -= k;
		if (s->nbuf < 64)
			return;
		block(s, s->buf);
		s->nbuf = 0;
	}
	for (; n >= 64; p += 64, n -= 64)
		block(s, p);
	memcpy(s->buf, p, n);
	s->nbuf = n;
}

void cgen_sha256_final(cgen_sha256 *s, unsigned char out[CGEN_SHA256_LEN])
{
	uint64_t bits = s->bytes * 8;
	unsigned char pad[72] = {0x80};
	size_t npad = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
	for (int i = 0; i < 8; i++)
		pad[npad + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
	cgen_sha256_update(s, pad, npad + 8);
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 4; j++)
			out[4 * i + j] = (unsigned char)(s->h[i] >> (24 - 8 * j));
}

/* HMAC(K, m) = H((K' ^ opad) || H((K' ^ ipad) || m)), K' the key padded to 64
 * bytes (hashed first when longer). */
void cgen_hmac_init(cgen_hmac *h, const void *key, size_t klen)
{
	unsigned char k[64] = {0}, ipad[64];
	if (klen > 64) {
		cgen_sha256 s;
		cgen_sha256_init(&s);
		cgen_sha256_update(&s, key, klen);
		cgen_sha256_final(&s, k);
	} else if (klen) {
		memcpy(k, key, klen);
	}
	for (int i = 0; i < 64; i++) {
		ipad[i] = k[i] ^ 0x36;
		h->opad[i] = k[i] ^ 0x5c;
	}
	cgen_sha256_init(&h->inner);
	cgen_sha256_update(&h->inner, ipad, 64);
}

void cgen_hmac_update(cgen_hmac *h, const void *data, size_t n)
{
	cgen_sha256_update(&h->inner, data, n);
}

void cgen_hmac_final(cgen_hmac *h, unsigned char out[CGEN_SHA256_LEN])
{
	unsigned char in[CGEN_SHA256_LEN];
	cgen_sha256_final(&h->inner, in);
	cgen_sha256 o;
	cgen_sha256_init(&o);
	cgen_sha256_update(&o, h->opad, 64);
	cgen_sha256_update(&o, in, sizeof in);
	cgen_sha256_final(&o, out);
}
