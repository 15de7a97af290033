/* backend-tcp/binary.c: the .tcpb container.
 *
 * Layout (little endian):
 *   0  magic "MOECTCPB"          8 bytes
 *   8  u32 format version (TCPB_VERSION)
 *  12  u32 section count (5)
 *  16  u32 CRC-32 of every byte from offset 24 to the end
 *  20  u32 reserved, 0
 *  24  section table: per section u32 kind, u32 reserved 0, u64 offset, u64 size
 *  ... section payloads: meta, tensors, constants, code, prep
 * Version 2 added each tensor's checkpoint source (after its name) and the
 * prep section (the weight-packing graph as IR JSON, possibly empty).
 * Version 4 added each tensor's layout (i64 part bytes, i32 copies, after
 * its constant offset); a version-3 file is read with every tensor spread
 * over the slices in one copy (part 0, copies 1), what version 3 meant.
 * One serializer walks every field in both directions, so the reader can
 * never disagree with the writer; every read is bounds-checked. */
#include <string.h>

#include "backend-tcp/isa/tcp_int.h"

#define TCPB_VERSION TCP_TCPB_VERSION
static const char tcpb_magic[8] = {'M', 'O', 'E', 'C', 'T', 'C', 'P', 'B'};
enum { SEC_META = 1, SEC_TENSORS, SEC_CONSTS, SEC_CODE, SEC_PREP, SEC_COUNT = 5 };

typedef struct ser {
	bool rd;
	uint8_t *buf; /* writing: growable */
	size_t len, cap, pos;
	const uint8_t *in; /* reading */
	size_t end;
	bool bad;
	uint32_t ver; /* reading: the file's version (3 or 4) */
} ser;

static void put(ser *s, const void *p, size_t n)
{
	if (s->len + n > s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 4096;
		while (nc < s->len + n)
			nc *= 2;
		uint8_t *nb = realloc(s->buf, nc);
		if (!nb) {
			s->bad = true;
			return;
		}
		s->buf = nb;
		s->cap = nc;
	}
	memcpy(s->buf + s->len, p, n);
	s->len += n;
}

static void get(ser *s, void *p, size_t n)
{
	if (s->bad || n > s->end - s->pos) {
		s->bad = true;
		memset(p, 0, n);
		return;
	}
	memcpy(p, s->in + s->pos, n);
	s->pos += n;
}

static void sx64(ser *s, int64_t *v)
{
	uint8_t b[8];
	if (s->rd) {
		get(s, b, 8);
		uint64_t u = 0;
		for (int i = 7; i >= 0; i--)
			u = u << 8 | b[i];
		*v = (int64_t)u;
	} else {
		uint64_t u = (uint64_t)*v;
		for (int i = 0; i < 8; i++)
			b[i] = (uint8_t)(u >> (8 * i));
		put(s, b, 8);
	}
}

static void sx32(ser *s, int32_t *v)
{
	int64_t w = *v;
	if (s->rd) {
		uint8_t b[4];
		get(s, b, 4);
		*v = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
	} else {
		uint32_t u = (uint32_t)w;
		uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
		put(s, b, 4);
	}
}

static void sx8(ser *s, uint8_t *v)
{
	if (s->rd)
		get(s, v, 1);
	else
		put(s, v, 1);
}

static void su32(ser *s, uint32_t *v)
{
	int32_t w = (int32_t)*v;
	sx32(s, &w);
	*v = (uint32_t)w;
}

static void s_meta(ser *s, tcp_program *p)
{
	int64_t *f[] = {&p->moe_T, &p->moe_K, &p->moe_D, &p->moe_F, &p->moe_E, &p->moe_B, &p->moe_G, &p->nproj,
		&p->router_E, &p->weight_bytes_per_expert, &p->act_bytes, &p->router_macs};
	for (size_t i = 0; i < sizeof f / sizeof *f; i++)
		sx64(s, f[i]);
	sx8(s, &p->dtype);
	sx32(s, &p->nblocks_t);
	sx32(s, &p->bexp_t);
	sx32(s, &p->block_loop_pc);
	sx32(s, &p->block_body_pc);
	/* a decode tier's fields follow only in a program that has one (older
	 * readers reject such a meta section as malformed) */
	if (s->rd ? s->pos < s->end : p->tier_n > 0) {
		sx64(s, &p->tier_n);
		sx32(s, &p->tier_loop_pc);
		sx32(s, &p->tier_bexp_t);
	}
}

static void s_view(ser *s, tcp_view *v)
{
	sx32(s, &v->t);
	sx32(s, &v->reg);
	sx64(s, &v->base);
	sx64(s, &v->scale);
	for (int k = 0; k < TCP_MAXD; k++)
		sx64(s, &v->stride[k]);
}

static void s_insn(ser *s, tcp_insn *in)
{
	uint8_t *b[] = {&in->op, &in->sop, &in->ndim, &in->nstep, &in->flags, &in->rd, &in->ra, &in->rb};
	for (size_t i = 0; i < sizeof b / sizeof *b; i++)
		sx8(s, b[i]);
	sx32(s, &in->vreg);
	sx32(s, &in->target);
	sx64(s, &in->imm);
	for (int k = 0; k < TCP_MAXD; k++)
		sx64(s, &in->dim[k]);
	for (int k = 0; k < TCP_NVIEW; k++)
		s_view(s, &in->v[k]);
	for (int k = 0; k < TCP_MAXSTEP; k++) {
		tcp_step *st = &in->step[k];
		sx8(s, &st->op);
		sx8(s, &st->x);
		sx8(s, &st->y);
		sx8(s, &st->ctr);
		sx8(s, &st->flags);
		su32(s, &st->imm);
	}
	sx64(s, &in->tile);
	sx64(s, &in->rows);
}

#define MAX_NAME 4096

/* A length-prefixed string: written from *w, read into buf (MAX_NAME + 1). */
static void s_str(ser *s, const char *w, char *buf)
{
	uint32_t nl = s->rd ? 0 : (uint32_t)strlen(w);
	su32(s, &nl);
	if (!s->rd) {
		put(s, w, nl);
		return;
	}
	if (nl > MAX_NAME) {
		s->bad = true;
		buf[0] = 0;
		return;
	}
	get(s, buf, nl);
	buf[nl] = 0;
	/* no NUL and no control byte but tab and newline (an ESC sequence would
	 * reach the terminal through `moec check` and every message quoting the
	 * name); the .moe lexer refuses raw control bytes in strings alike */
	for (uint32_t i = 0; i < nl; i++)
		if (((unsigned char)buf[i] < 0x20 && buf[i] != '\t' && buf[i] != '\n') || buf[i] == 0x7f)
			s->bad = true;
}

/* The tensor table; when reading, p->t is grown as entries arrive. */
static void s_tensors(ser *s, tcp_program *p)
{
	uint32_t n = p->nt;
	su32(s, &n);
	if (s->rd && (s->bad || n > (s->end - s->pos) / 16)) {
		s->bad = true;
		return;
	}
	for (uint32_t i = 0; i < n && !s->bad; i++) {
		tcp_tensor tmp, *t = s->rd ? &tmp : &p->t[i];
		if (s->rd)
			memset(&tmp, 0, sizeof tmp);
		char name[MAX_NAME + 1], source[MAX_NAME + 1];
		s_str(s, t->name, name);
		s_str(s, t->source, source);
		sx8(s, &t->space);
		sx8(s, &t->kind);
		sx8(s, &t->dtype);
		sx8(s, &t->rank);
		for (int k = 0; k < MOE_MAX_RANK; k++)
			sx64(s, &t->shape[k]);
		sx64(s, &t->numel);
		sx64(s, &t->addr);
		sx64(s, &t->slice_bytes);
		sx64(s, &t->const_off);
		if (!s->rd || s->ver >= 4) {
			uint32_t cp = (uint32_t)t->copies;
			sx64(s, &t->part_bytes);
			su32(s, &cp);
			t->copies = (int32_t)(cp > (uint32_t)INT32_MAX ? 0 : cp);
		} else {
			t->part_bytes = 0;
			t->copies = 1;
		}
		if (s->rd && !s->bad) {
			if (t->rank > MOE_MAX_RANK) {
				s->bad = true;
				return;
			}
			int32_t id = tcp_add_tensor(p, name, t->space, t->kind, (moe_dtype)t->dtype, 0, NULL);
			tcp_set_source(p, id, source);
			tcp_tensor *d = &p->t[id];
			char *nm = d->name, *src = d->source;
			*d = tmp;
			d->name = nm;
			d->source = src;
		}
	}
}

static void s_code(ser *s, tcp_program *p)
{
	uint32_t n = p->ncode;
	su32(s, &n);
	if (s->rd && (s->bad || n > (s->end - s->pos) / 64)) {
		s->bad = true;
		return;
	}
	for (uint32_t i = 0; i < n && !s->bad; i++) {
		tcp_insn tmp, *in = s->rd ? &tmp : &p->code[i];
		s_insn(s, in);
		if (s->rd && !s->bad)
			tcp_emit(p, &tmp);
	}
}

static void wr32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t rd32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t rd64(const uint8_t *b)
{
	return (uint64_t)rd32(b) | (uint64_t)rd32(b + 4) << 32;
}

moe_status tcp_encode(const tcp_program *cp, uint8_t **out, size_t *outlen)
{
	tcp_program *p = (tcp_program *)cp; /* the serializer only reads it when writing */
	size_t hdr = 24 + SEC_COUNT * 24;
	ser s = {0};
	uint8_t zero[256] = {0};
	put(&s, zero, hdr);
	size_t off[SEC_COUNT], sz[SEC_COUNT];
	for (int k = 0; k < SEC_COUNT; k++) {
		off[k] = s.len;
		switch (k + 1) {
		case SEC_META: s_meta(&s, p); break;
		case SEC_TENSORS: s_tensors(&s, p); break;
		case SEC_CONSTS: put(&s, p->consts ? p->consts : zero, (size_t)p->nconst); break;
		case SEC_CODE: s_code(&s, p); break;
		default: put(&s, p->prep ? (const uint8_t *)p->prep : zero, p->prep_len); break;
		}
		sz[k] = s.len - off[k];
	}
	if (s.bad) {
		free(s.buf);
		return MOE_ERR_NOMEM;
	}
	memcpy(s.buf, tcpb_magic, 8);
	wr32(s.buf + 8, TCPB_VERSION);
	wr32(s.buf + 12, SEC_COUNT);
	wr32(s.buf + 20, 0);
	for (int k = 0; k < SEC_COUNT; k++) {
		uint8_t *e = s.buf + 24 + 24 * k;
		wr32(e, (uint32_t)(k + 1));
		wr32(e + 4, 0);
		wr32(e + 8, (uint32_t)off[k]);
		wr32(e + 12, (uint32_t)((uint64_t)off[k] >> 32));
		wr32(e + 16, (uint32_t)sz[k]);
		wr32(e + 20, (uint32_t)((uint64_t)sz[k] >> 32));
	}
	wr32(s.buf + 16, tcp_crc32(s.buf + 24, s.len - 24));
	*out = s.buf;
	*outlen = s.len;
	return MOE_OK;
}

static tcp_program *fail(moe_ctx *ctx, const char *file, int64_t off, tcp_program *p, const char *msg)
{
	moe_loc l = moe_loc_file(ctx, file);
	l.offset = off;
	moe_diag(ctx, MOE_DIAG_ERROR, l, "not a valid .tcpb: %s", msg);
	tcp_prog_free(p);
	return NULL;
}

tcp_program *tcp_decode(moe_ctx *ctx, const char *file, const uint8_t *buf, size_t len)
{
	char msg[160];
	if (len < 24 || memcmp(buf, tcpb_magic, 8))
		return fail(ctx, file, 0, NULL, len < 24 ? "file too short for the header" : "bad magic (expected MOECTCPB)");
	uint32_t ver = rd32(buf + 8), nsec = rd32(buf + 12);
	if (ver == TCP_BUNDLE_VERSION)
		return fail(ctx, file, 8, NULL, "a bucketed .tcpb (several programs): load it with moe_tcp_bundle_load");
	if (ver == 256)
		return fail(ctx, file, 8, NULL, "a bucketed .tcpb of an earlier moec (bundle version 256, programs of version 3): "
						"compile it again");
	if (ver != TCPB_VERSION && ver != 3) {
		snprintf(msg, sizeof msg, "format version %u, this moec reads versions 3 and %u", ver, TCPB_VERSION);
		return fail(ctx, file, 8, NULL, msg);
	}
	if (nsec != SEC_COUNT || len < 24 + (size_t)nsec * 24)
		return fail(ctx, file, 12, NULL, "bad section count or truncated section table");
	uint32_t crc = tcp_crc32(buf + 24, len - 24);
	if (crc != rd32(buf + 16)) {
		snprintf(msg, sizeof msg, "checksum mismatch (stored %08x, computed %08x): the file is corrupt or truncated",
			rd32(buf + 16), crc);
		return fail(ctx, file, 16, NULL, msg);
	}
	size_t off[SEC_COUNT], sz[SEC_COUNT];
	bool seen[SEC_COUNT] = {false};
	for (uint32_t k = 0; k < nsec; k++) {
		const uint8_t *e = buf + 24 + 24 * k;
		uint32_t kind = rd32(e);
		uint64_t o = rd64(e + 8), z = rd64(e + 16);
		if (kind < 1 || kind > SEC_COUNT || seen[kind - 1] || rd32(e + 4))
			return fail(ctx, file, 24 + 24 * (int64_t)k, NULL, "unknown or repeated section");
		if (o < 24 + (uint64_t)nsec * 24 || o > len || z > len - o)
			return fail(ctx, file, 24 + 24 * (int64_t)k, NULL, "section outside the file");
		seen[kind - 1] = true;
		off[kind - 1] = (size_t)o;
		sz[kind - 1] = (size_t)z;
	}
	tcp_program *p = tcp_prog_new(ctx);
	static const char *const names[SEC_COUNT] = {"meta", "tensors", "constants", "code", "prep"};
	for (int k = 0; k < SEC_COUNT; k++) {
		ser s = {.rd = true, .in = buf, .pos = off[k], .end = off[k] + sz[k], .ver = ver};
		switch (k + 1) {
		case SEC_META: s_meta(&s, p); break;
		case SEC_TENSORS: s_tensors(&s, p); break;
		case SEC_CONSTS:
			p->nconst = p->constcap = (int64_t)sz[k];
			p->consts = ctx_alloc(ctx, sz[k] ? sz[k] : 1);
			p->constcap = sz[k] ? (int64_t)sz[k] : 1;
			memcpy(p->consts, buf + off[k], sz[k]);
			s.pos = s.end;
			break;
		case SEC_CODE: s_code(&s, p); break;
		default:
			/* IR JSON text: no NUL inside, and no raw control byte but the
			 * whitespace JSON allows (the checkpoint names in it reach the
			 * terminal through `moec check`, like the tensor table's);
			 * parsed and checked by the validator */
			for (uint64_t j = 0; j < sz[k] && !s.bad; j++) {
				unsigned char ch = buf[off[k] + j];
				s.bad = (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch == 0x7f;
			}
			if (s.bad)
				break;
			p->prep_len = sz[k];
			p->prep = ctx_alloc(ctx, sz[k] + 1);
			memcpy(p->prep, buf + off[k], sz[k]);
			s.pos = s.end;
			break;
		}
		if (s.bad || s.pos != s.end) {
			snprintf(msg, sizeof msg, "section '%s' is malformed", names[k]);
			return fail(ctx, file, (int64_t)s.pos, p, msg);
		}
	}
	return p;
}
