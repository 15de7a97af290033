/* runtime/npy.c: strict NumPy .npy reader and atomic writer.
 *
 * File: "\x93NUMPY", major, minor, header length (u16 for 1.0, u32 for 2.0
 * and 3.0), a Python dict literal {'descr': ..., 'fortran_order': False,
 * 'shape': (...)} padded with spaces and '\n', then the C-order data. */
#include <stdlib.h>

#include "runtime/rt_io.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "moec's .npy code assumes a little-endian host"
#endif

/* The longest header read (numpy writes a few hundred bytes, and by default
 * reads at most 10,000): the header is scanned, never copied, but a 4 GiB
 * one would still be walked byte by byte. */
#define NPY_MAX_HEADER (1 << 20)

typedef enum npy_kind { NPY_F4, NPY_F2, NPY_BF16, NPY_I4, NPY_B1 } npy_kind;
static const struct {
	const char *descr;
	size_t size;
	const char *what;
} npy_kinds[] = {
	[NPY_F4] = {"<f4", 4, "f32"}, [NPY_F2] = {"<f2", 2, "f16"}, [NPY_BF16] = {"<u2", 2, "bf16 bits"},
	[NPY_I4] = {"<i4", 4, "i32"}, [NPY_B1] = {"|b1", 1, "bool"},
};

typedef struct npy_parser {
	moe_ctx *ctx;
	const char *file;
	const char *p, *end;
	int64_t base; /* file offset of the header text */
	const char *start;
} npy_parser;

static bool perr(npy_parser *ps, const char *at, const char *msg)
{
	rt_err_at(ps->ctx, ps->file, ps->base + (at - ps->start), "npy header: %s", msg);
	return false;
}

static void skip_ws(npy_parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static bool expect(npy_parser *ps, char c, const char *what)
{
	skip_ws(ps);
	if (ps->p >= ps->end || *ps->p != c)
		return perr(ps, ps->p, what);
	ps->p++;
	return true;
}

/* A quoted string without escapes into buf. */
static bool pstring(npy_parser *ps, char *buf, size_t n)
{
	skip_ws(ps);
	if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"'))
		return perr(ps, ps->p, "expected a quoted string");
	char q = *ps->p++;
	const char *s = ps->p;
	while (ps->p < ps->end && *ps->p != q) {
		if (*ps->p == '\\' || *ps->p == '\n')
			return perr(ps, ps->p, "unsupported character in a string");
		ps->p++;
	}
	if (ps->p >= ps->end)
		return perr(ps, s, "unterminated string");
	size_t len = (size_t)(ps->p - s);
	ps->p++;
	if (len >= n)
		return perr(ps, s, "string too long");
	memcpy(buf, s, len);
	buf[len] = 0;
	return true;
}

static bool pshape(npy_parser *ps, int *rank, int64_t *shape)
{
	if (!expect(ps, '(', "shape must be a tuple"))
		return false;
	*rank = 0;
	int64_t numel = 1;
	for (;;) {
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ')') {
			ps->p++;
			return true;
		}
		if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
			return perr(ps, ps->p, "shape entries must be non-negative integers");
		const char *s = ps->p;
		int64_t v = 0;
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
			if (!ir_mul_ov(v, 10, &v) || !ir_add_ov(v, *ps->p - '0', &v))
				return perr(ps, s, "shape entry overflows 64 bits");
			ps->p++;
		}
		if (*rank == MOE_MAX_RANK)
			return perr(ps, s, "rank exceeds the limit of 8");
		if (v == 0)
			return perr(ps, s, "empty arrays (a zero dimension) are not supported");
		if (v > MOE_MAX_DIM)
			return perr(ps, s, "dimension exceeds 2^31-1");
		if (!ir_mul_ov(numel, v, &numel))
			return perr(ps, s, "element count overflows 64 bits");
		shape[(*rank)++] = v;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			continue;
		}
		if (ps->p < ps->end && *ps->p == ')') {
			ps->p++;
			/* Python spells a 1-tuple "(n,)"; "(n)" is an int, not a tuple */
			if (*rank == 1)
				return perr(ps, ps->p - 1, "a one-dimensional shape is written (n,)");
			return true;
		}
		return perr(ps, ps->p, "expected ',' or ')' in shape");
	}
}

typedef struct npy_info {
	npy_kind kind;
	int rank;
	int64_t shape[MOE_MAX_RANK];
	int64_t numel;
	size_t data_off, nbytes;
} npy_info;

static bool parse_header(moe_ctx *ctx, const char *file, const unsigned char *d, size_t len, npy_info *info)
{
	static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
	if (len < 10) {
		rt_err_at(ctx, file, 0, "file of %zu bytes is too short for a .npy header", len);
		return false;
	}
	if (memcmp(d, magic, 6)) {
		rt_err_at(ctx, file, 0, "not a .npy file (bad magic)");
		return false;
	}
	unsigned major = d[6], minor = d[7];
	if (major < 1 || major > 3 || minor != 0) {
		rt_err_at(ctx, file, 6, ".npy version %u.%u is not supported (1.0, 2.0, 3.0)", major, minor);
		return false;
	}
	size_t hstart = major == 1 ? 10 : 12;
	if (len < hstart) {
		rt_err_at(ctx, file, 8, "file ends inside the header length field");
		return false;
	}
	uint64_t hlen = major == 1 ? rt_ld16(d + 8) : rt_ld32(d + 8);
	if (hlen > NPY_MAX_HEADER) {
		rt_err_at(ctx, file, 8, "header length %llu exceeds the %d-byte limit", (unsigned long long)hlen, NPY_MAX_HEADER);
		return false;
	}
	if (hlen > len - hstart) {
		rt_err_at(ctx, file, 8, "header length %llu runs past the end of the file (%zu bytes)",
			(unsigned long long)hlen, len);
		return false;
	}
	npy_parser ps = {ctx, file, (const char *)d + hstart, (const char *)d + hstart + hlen, (int64_t)hstart,
		(const char *)d + hstart};
	bool have_descr = false, have_fo = false, have_shape = false;
	char descr[16];
	if (!expect(&ps, '{', "expected '{'"))
		return false;
	for (;;) {
		skip_ws(&ps);
		if (ps.p < ps.end && *ps.p == '}') {
			ps.p++;
			break;
		}
		const char *kat = ps.p;
		char key[32];
		if (!pstring(&ps, key, sizeof key) || !expect(&ps, ':', "expected ':' after a key"))
			return false;
		if (!strcmp(key, "descr")) {
			if (have_descr)
				return perr(&ps, kat, "key 'descr' appears twice");
			have_descr = true;
			const char *vat = ps.p;
			if (!pstring(&ps, descr, sizeof descr))
				return false;
			int k = -1;
			for (int i = 0; i < (int)(sizeof npy_kinds / sizeof *npy_kinds); i++)
				if (!strcmp(descr, npy_kinds[i].descr))
					k = i;
			if (k < 0) {
				char m[96];
				snprintf(m, sizeof m, "descr '%s' is not supported ('<f4', '<f2', '<u2' as bf16, '<i4', '|b1')",
					descr);
				return perr(&ps, vat, m);
			}
			info->kind = (npy_kind)k;
		} else if (!strcmp(key, "fortran_order")) {
			if (have_fo)
				return perr(&ps, kat, "key 'fortran_order' appears twice");
			have_fo = true;
			skip_ws(&ps);
			size_t rest = (size_t)(ps.end - ps.p);
			if (rest >= 5 && !memcmp(ps.p, "False", 5)) {
				ps.p += 5;
			} else if (rest >= 4 && !memcmp(ps.p, "True", 4)) {
				return perr(&ps, ps.p, "fortran_order True (column-major data) is not supported");
			} else {
				return perr(&ps, ps.p, "fortran_order must be False");
			}
		} else if (!strcmp(key, "shape")) {
			if (have_shape)
				return perr(&ps, kat, "key 'shape' appears twice");
			have_shape = true;
			if (!pshape(&ps, &info->rank, info->shape))
				return false;
		} else {
			char m[80];
			snprintf(m, sizeof m, "unexpected key '%s'", key);
			return perr(&ps, kat, m);
		}
		skip_ws(&ps);
		if (ps.p < ps.end && *ps.p == ',') {
			ps.p++;
			continue;
		}
		if (ps.p < ps.end && *ps.p == '}') {
			ps.p++;
			break;
		}
		return perr(&ps, ps.p, "expected ',' or '}'");
	}
	for (const char *q = ps.p; q < ps.end; q++)
		if (*q != ' ' && *q != '\n')
			return perr(&ps, q, "unexpected characters after the header dict");
	if (!have_descr || !have_fo || !have_shape)
		return perr(&ps, ps.start, !have_descr ? "missing key 'descr'" : !have_fo ? "missing key 'fortran_order'" :
								   "missing key 'shape'");
	int64_t numel = 1, nbytes;
	for (int i = 0; i < info->rank; i++)
		numel *= info->shape[i]; /* checked in pshape */
	if (!ir_mul_ov(numel, (int64_t)npy_kinds[info->kind].size, &nbytes)) {
		rt_err_at(ctx, file, (int64_t)hstart, "data size overflows 64 bits");
		return false;
	}
	info->numel = numel;
	info->data_off = hstart + (size_t)hlen;
	size_t have = len - info->data_off;
	if ((uint64_t)nbytes != have) {
		rt_err_at(ctx, file, (int64_t)info->data_off,
			"%s data of %lld elements needs %lld bytes but the file has %zu after the header%s",
			npy_kinds[info->kind].what, (long long)numel, (long long)nbytes, have,
			(uint64_t)nbytes > have ? " (truncated)" : " (trailing bytes)");
		return false;
	}
	info->nbytes = (size_t)nbytes;
	return true;
}

static moe_tensor *npy_parse(moe_ctx *ctx, const char *name, const void *data, size_t len, moe_dtype want)
{
	npy_info in = {0};
	const unsigned char *d = data;
	if (!parse_header(ctx, name, d, len, &in))
		return NULL;
	bool fl = want == MOE_F32 || want == MOE_BF16;
	bool ok = fl ? in.kind == NPY_F4 || in.kind == NPY_F2 || in.kind == NPY_BF16 :
		want == MOE_I32 ? in.kind == NPY_I4 : want == MOE_BOOL ? in.kind == NPY_B1 : false;
	if (!ok) {
		rt_err_at(ctx, name, -1, "array of %s cannot be read as %s", npy_kinds[in.kind].what, moe_dtype_name(want));
		return NULL;
	}
	const unsigned char *src = d + in.data_off;
	if (in.kind == NPY_B1)
		for (int64_t i = 0; i < in.numel; i++)
			if (src[i] > 1) {
				rt_err_at(ctx, name, (int64_t)in.data_off + i, "bool element %lld is %u, not 0 or 1", (long long)i,
					src[i]);
				return NULL;
			}
	moe_tensor *t = moe_tensor_new(ctx, want, in.rank, in.shape);
	if (!t)
		return NULL;
	if (fl)
		rt_convert_float(t->data, want, src, in.kind == NPY_F4 ? RT_SRC_F32 : in.kind == NPY_F2 ? RT_SRC_F16 : RT_SRC_BF16,
			(size_t)in.numel);
	else
		memcpy(t->data, src, in.nbytes);
	return t;
}

moe_tensor *moe_npy_parse(moe_ctx *ctx, const char *name, const void *data, size_t len, moe_dtype want)
{
	CTX_GUARDED(ctx, moe_tensor *, NULL, npy_parse(ctx, name, data, len, want));
}

static void map_unwind(void *m)
{
	rt_unmap(m);
}

static moe_tensor *npy_read(moe_ctx *ctx, const char *path, moe_dtype want)
{
	rt_map m;
	if (rt_map_file(ctx, path, &m) != MOE_OK)
		return NULL;
	uint32_t d = ctx_defer(ctx, map_unwind, &m); /* a refusal inside unmaps the file */
	moe_tensor *t = npy_parse(ctx, path, m.data, m.len, want);
	ctx_undefer(ctx, d);
	rt_unmap(&m);
	return t;
}

moe_tensor *moe_npy_read(moe_ctx *ctx, const char *path, moe_dtype want)
{
	CTX_GUARDED(ctx, moe_tensor *, NULL, npy_read(ctx, path, want));
}

static moe_status npy_write(moe_ctx *ctx, const char *path, const moe_tensor *t);

moe_status moe_npy_write(moe_ctx *ctx, const char *path, const moe_tensor *t)
{
	IR_ASSERT(path && t); /* API misuse (docs/api.md); a NULL ctx aborts in CTX_GUARDED */
	CTX_GUARDED(ctx, moe_status, MOE_ERR_NOMEM, npy_write(ctx, path, t));
}

static moe_status npy_write(moe_ctx *ctx, const char *path, const moe_tensor *t)
{
	const char *descr;
	switch (t->dtype) {
	case MOE_F32:
	case MOE_BF16: descr = "<f4"; break;
	case MOE_I32: descr = "<i4"; break;
	case MOE_BOOL: descr = "|b1"; break;
	default:
		rt_err_at(ctx, path, -1, "cannot write a %s tensor as .npy", moe_dtype_name(t->dtype));
		return MOE_ERR_UNSUPPORTED;
	}
	if (t->rank < 0 || t->rank > MOE_MAX_RANK) {
		rt_err_at(ctx, path, -1, "tensor rank %d is invalid", t->rank);
		return MOE_ERR_INVALID;
	}
	char hdr[512];
	int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
	for (int i = 0; i < t->rank; i++)
		n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
	n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s), }", t->rank == 1 ? "," : "");
	size_t total = 10 + (size_t)n + 1, padded = (total + 63) / 64 * 64;
	memset(hdr + n, ' ', padded - total);
	hdr[padded - 10 - 1] = '\n';
	unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)((padded - 10) & 0xff),
		(unsigned char)((padded - 10) >> 8)};
	moe_atomic_file *f = moe_output_open(ctx, path, MOE_OUTPUT_BINARY);
	if (!f)
		return MOE_ERR_IO;
	FILE *fp = moe_atomic_stream(f);
	fwrite(pre, 1, sizeof pre, fp);
	fwrite(hdr, 1, padded - 10, fp);
	int64_t numel = moe_tensor_numel(t);
	if (t->dtype == MOE_BF16) {
		const uint16_t *h = t->data;
		for (int64_t i = 0; i < numel; i++) {
			float v = rt_bf16_to_f32(h[i]);
			fwrite(&v, 4, 1, fp);
		}
	} else if (numel > 0) {
		fwrite(t->data, moe_dtype_size(t->dtype), (size_t)numel, fp);
	}
	return moe_atomic_commit(f); /* a failed fwrite leaves ferror set: commit reports it */
}
