/* backend-tcp/isa/bundle.c: a bucketed .tcpb, one program per token bucket
 * (docs/tcp-isa.md section 8.1).
 *
 * Each bucket's program is a version-4 .tcpb: a 144-byte header (magic,
 * version, section count, CRC, the section table) and five contiguous
 * sections. The bundle keeps of each program its bucket T, its CRC and the
 * pool ids of its five sections; the header is rebuilt on load. Equal
 * sections (the weight-packing graph of a quantized layer, constants, empty
 * sections) are stored once in the pool. Layout, little endian:
 *   0  "MOECTCPB", u32 version TCP_BUNDLE_VERSION, u32 buckets n,
 *      u32 CRC-32 of the index and pool table, u32 pool size m
 *  24  n x {u32 T, u32 program CRC, u32 pool id x 5}   (28 bytes each)
 *      m x u64 section size; then the m sections, back to back.
 * Loading checks the index CRC and the bounds, rebuilds every bucket's
 * .tcpb and loads it with moe_tcp_from_binary (its own CRC and the full
 * validation): a corrupt bucket rejects the whole file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"
#include "moec/io.h"

#define HDR 24
#define PHDR (24 + 5 * 24) /* a program's header and section table */
#define IDX 28

struct moe_tcp_bundle {
	moe_ctx *ctx;
	uint32_t n;
	int64_t T[TCP_MAX_BUCKETS];
	moe_tcp_program *p[TCP_MAX_BUCKETS];
};

static void w32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t r32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t r64(const uint8_t *b)
{
	return (uint64_t)r32(b) | (uint64_t)r32(b + 4) << 32;
}

typedef struct sec {
	const uint8_t *p;
	uint64_t n;
} sec;

/* The pool id of section s, added when no equal one is there. */
static uint32_t pool_add(sec *pool, uint32_t *m, sec s)
{
	for (uint32_t i = 0; i < *m; i++)
		if (pool[i].n == s.n && (!s.n || !memcmp(pool[i].p, s.p, s.n)))
			return i;
	pool[*m] = s;
	return (*m)++;
}

moe_status moe_tcp_bundle_write(moe_ctx *ctx, const moe_tcp_program *const *progs, const int64_t *T, uint32_t n,
	const char *path)
{
	if (!ctx || !progs || !T || !path || n < 1 || n > TCP_MAX_BUCKETS)
		return MOE_ERR_INVALID;
	for (uint32_t b = 0; b < n; b++)
		if (!progs[b] || T[b] < 1 || T[b] > INT32_MAX || (b && T[b] <= T[b - 1])) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_file(ctx, path),
				"a bucketed .tcpb takes 1 to %d programs with increasing token counts in 1..2147483647",
				TCP_MAX_BUCKETS);
			return MOE_ERR_INVALID;
		}
	uint8_t *bin[TCP_MAX_BUCKETS] = {0};
	size_t len[TCP_MAX_BUCKETS];
	sec pool[TCP_MAX_BUCKETS * 5];
	uint32_t ids[TCP_MAX_BUCKETS][5], m = 0;
	moe_status st = MOE_OK;
	for (uint32_t b = 0; b < n && st == MOE_OK; b++) {
		if ((st = tcp_encode(progs[b], &bin[b], &len[b])) != MOE_OK)
			break;
		size_t at = PHDR;
		for (int k = 0; k < 5; k++) {
			uint64_t sz = r64(bin[b] + 24 + 24 * k + 16);
			ids[b][k] = pool_add(pool, &m, (sec){bin[b] + at, sz});
			at += (size_t)sz;
		}
	}
	size_t total = HDR + (size_t)n * IDX + (size_t)m * 8;
	for (uint32_t i = 0; i < m; i++)
		total += (size_t)pool[i].n;
	uint8_t *out = st == MOE_OK ? calloc(1, total) : NULL;
	if (st == MOE_OK && !out)
		st = MOE_ERR_NOMEM;
	if (out) {
		memcpy(out, "MOECTCPB", 8);
		w32(out + 8, TCP_BUNDLE_VERSION);
		w32(out + 12, n);
		w32(out + 20, m);
		uint8_t *e = out + HDR;
		for (uint32_t b = 0; b < n; b++, e += IDX) {
			w32(e, (uint32_t)T[b]);
			w32(e + 4, r32(bin[b] + 16));
			for (int k = 0; k < 5; k++)
				w32(e + 8 + 4 * k, ids[b][k]);
		}
		for (uint32_t i = 0; i < m; i++, e += 8) {
			w32(e, (uint32_t)pool[i].n);
			w32(e + 4, (uint32_t)(pool[i].n >> 32));
		}
		w32(out + 16, tcp_crc32(out + HDR, (size_t)(e - out) - HDR));
		for (uint32_t i = 0; i < m; i++) {
			if (pool[i].n)
				memcpy(e, pool[i].p, (size_t)pool[i].n);
			e += pool[i].n;
		}
		st = moe_write_file_atomic(ctx, path, out, total);
	}
	free(out);
	for (uint32_t b = 0; b < n; b++)
		free(bin[b]);
	return st;
}

_Static_assert(TCP_BUNDLE_VERSION == 257u, "the version the header diagnostic names");
bool tcp_is_bundle(const uint8_t *buf, size_t len)
{
	return len >= HDR && !memcmp(buf, "MOECTCPB", 8) && r32(buf + 8) == TCP_BUNDLE_VERSION;
}

static moe_tcp_bundle *bad(moe_ctx *ctx, const char *file, int64_t off, moe_tcp_bundle *b, const char *msg)
{
	moe_loc l = moe_loc_file(ctx, file);
	l.offset = off;
	moe_diag(ctx, MOE_DIAG_ERROR, l, "not a valid bucketed .tcpb: %s", msg);
	moe_tcp_bundle_free(b);
	return NULL;
}

/* Bucket b's .tcpb rebuilt from the pool into a new buffer (*len). */
static uint8_t *rebuild(const uint8_t *e, const sec *pool, size_t *len)
{
	size_t n = PHDR;
	for (int k = 0; k < 5; k++)
		n += (size_t)pool[r32(e + 8 + 4 * k)].n;
	uint8_t *buf = calloc(1, n);
	if (!buf)
		return NULL;
	memcpy(buf, "MOECTCPB", 8);
	w32(buf + 8, TCP_TCPB_VERSION);
	w32(buf + 12, 5);
	w32(buf + 16, r32(e + 4));
	size_t at = PHDR;
	for (int k = 0; k < 5; k++) {
		const sec *s = &pool[r32(e + 8 + 4 * k)];
		uint8_t *t = buf + 24 + 24 * k;
		w32(t, (uint32_t)(k + 1));
		w32(t + 8, (uint32_t)at);
		w32(t + 12, (uint32_t)((uint64_t)at >> 32));
		w32(t + 16, (uint32_t)s->n);
		w32(t + 20, (uint32_t)(s->n >> 32));
		if (s->n)
			memcpy(buf + at, s->p, (size_t)s->n);
		at += (size_t)s->n;
	}
	*len = n;
	return buf;
}

moe_tcp_bundle *moe_tcp_bundle_from_binary(moe_ctx *ctx, const char *file, const uint8_t *buf, size_t len,
	const moe_tcp_machine *machine)
{
	if (!tcp_is_bundle(buf, len))
		return bad(ctx, file, 0, NULL, "no bundle header (magic MOECTCPB, version 257)");
	uint32_t n = r32(buf + 12), m = r32(buf + 20);
	if (n < 1 || n > TCP_MAX_BUCKETS || m < 1 || m > 5 * n)
		return bad(ctx, file, 12, NULL, "bad bucket or section count");
	size_t idx_end = HDR + (size_t)n * IDX + (size_t)m * 8;
	if (len < idx_end)
		return bad(ctx, file, HDR, NULL, "truncated bucket index");
	if (tcp_crc32(buf + HDR, idx_end - HDR) != r32(buf + 16))
		return bad(ctx, file, 16, NULL, "index checksum mismatch: the file is corrupt");
	sec pool[TCP_MAX_BUCKETS * 5];
	size_t at = idx_end;
	for (uint32_t i = 0; i < m; i++) {
		uint64_t sz = r64(buf + HDR + (size_t)n * IDX + 8 * i);
		if (sz > len - at)
			return bad(ctx, file, (int64_t)(HDR + n * IDX + 8 * i), NULL, "section outside the file");
		pool[i] = (sec){buf + at, sz};
		at += (size_t)sz;
	}
	if (at != len)
		return bad(ctx, file, (int64_t)at, NULL, "bytes after the last section");
	moe_tcp_bundle *b = calloc(1, sizeof *b);
	if (!b)
		return NULL;
	b->ctx = ctx;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = buf + HDR + (size_t)i * IDX;
		int64_t T = r32(e);
		bool ids_ok = T >= 1 && (i == 0 || T > b->T[i - 1]);
		for (int k = 0; k < 5; k++)
			ids_ok = ids_ok && r32(e + 8 + 4 * k) < m;
		if (!ids_ok)
			return bad(ctx, file, (int64_t)(e - buf), b, "bucket sizes must increase and sections exist");
		size_t pl;
		uint8_t *pb = rebuild(e, pool, &pl);
		char name[64];
		snprintf(name, sizeof name, "bucket T=%lld", (long long)T);
		moe_tcp_program *p = pb ? moe_tcp_from_binary(ctx, name, pb, pl, machine) : NULL;
		free(pb);
		if (!p)
			return bad(ctx, file, (int64_t)(e - buf), b, "a bucket is corrupt (above)");
		/* the label is the program's T: the rows of each of its inputs and outputs */
		for (uint32_t k = 0; k < p->nt; k++) {
			const tcp_tensor *t = &p->t[k];
			if ((t->kind == TCP_T_INPUT || t->kind == TCP_T_OUTPUT) && t->rank >= 1 && t->shape[0] != T) {
				char why[160];
				snprintf(why, sizeof why, "bucket %u is labelled T=%lld but its program's %s '%s' has %lld rows",
					(unsigned)i, (long long)T, t->kind == TCP_T_INPUT ? "input" : "output", t->name,
					(long long)t->shape[0]);
				moe_tcp_program_free(p);
				return bad(ctx, file, (int64_t)(e - buf), b, why);
			}
		}
		b->T[b->n] = T;
		b->p[b->n++] = p;
	}
	return b;
}

moe_tcp_bundle *moe_tcp_bundle_load(moe_ctx *ctx, const char *path, const moe_tcp_machine *machine)
{
	char *buf;
	size_t len;
	if (moe_read_file_max(ctx, path, TCP_MAX_BINARY_BYTES, &buf, &len) != MOE_OK)
		return NULL;
	moe_tcp_bundle *b = moe_tcp_bundle_from_binary(ctx, path, (const uint8_t *)buf, len, machine);
	free(buf);
	return b;
}

void moe_tcp_bundle_free(moe_tcp_bundle *b)
{
	if (!b)
		return;
	for (uint32_t i = 0; i < b->n; i++)
		moe_tcp_program_free(b->p[i]);
	free(b);
}

uint32_t moe_tcp_bundle_count(const moe_tcp_bundle *b)
{
	return b ? b->n : 0;
}

int64_t moe_tcp_bundle_tokens(const moe_tcp_bundle *b, uint32_t i)
{
	return b && i < b->n ? b->T[i] : -1;
}

const moe_tcp_program *moe_tcp_bundle_program(const moe_tcp_bundle *b, uint32_t i)
{
	return b && i < b->n ? b->p[i] : NULL;
}

int moe_tcp_bundle_pick(const moe_tcp_bundle *b, int64_t n)
{
	for (uint32_t i = 0; b && n >= 0 && i < b->n; i++)
		if (b->T[i] >= n)
			return (int)i;
	return -1;
}

int moe_tcp_is_bundle(const uint8_t *buf, size_t len)
{
	return buf && tcp_is_bundle(buf, len);
}
