/* runtime/safetensors.c: validated safetensors reader and sharded checkpoints.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data section; offsets are relative to it. Nothing of a file is
 * used before every entry has been checked. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "runtime/rt_io.h"

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Parsing a header may allocate ST_COST_PER_BYTE x its length (+1 MiB) and at
 * most ST_MAX_HEADER_COST (rt_json_shape.cost): a tensor entry with a name of
 * 40 bytes or more costs under 12 x its text. An array of more than
 * ST_MAX_ARRAY elements is refused before parsing (a longer shape is refused
 * after it, naming the tensor). */
#define ST_COST_PER_BYTE 24
#define ST_MAX_HEADER_COST ((uint64_t)512 << 20)
#define ST_MAX_ARRAY 64
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: JSON numbers above are inexact */

static const struct {
	const char *name;
	size_t bits;
} st_types[MOE_ST_DTYPE_COUNT] = {
	[MOE_ST_BOOL] = {"BOOL", 8}, [MOE_ST_U8] = {"U8", 8}, [MOE_ST_I8] = {"I8", 8},
	[MOE_ST_I16] = {"I16", 16}, [MOE_ST_U16] = {"U16", 16}, [MOE_ST_F16] = {"F16", 16},
	[MOE_ST_BF16] = {"BF16", 16}, [MOE_ST_I32] = {"I32", 32}, [MOE_ST_U32] = {"U32", 32},
	[MOE_ST_F32] = {"F32", 32}, [MOE_ST_I64] = {"I64", 64}, [MOE_ST_U64] = {"U64", 64},
	[MOE_ST_F64] = {"F64", 64}, [MOE_ST_F8_E4M3] = {"F8_E4M3", 8}, [MOE_ST_F8_E5M2] = {"F8_E5M2", 8},
	[MOE_ST_F8_E8M0] = {"F8_E8M0", 8}, [MOE_ST_F4] = {"F4", 4},
};

const char *moe_st_dtype_name(moe_st_dtype t)
{
	return (unsigned)t < MOE_ST_DTYPE_COUNT ? st_types[t].name : "?";
}

size_t moe_st_dtype_size(moe_st_dtype t)
{
	return (unsigned)t < MOE_ST_DTYPE_COUNT ? st_types[t].bits / 8 : 0;
}

struct moe_safetensors {
	moe_ctx *ctx;
	char *path;
	rt_map map;
	moe_st_tensor *t;
	size_t n, tcap;
	rt_strtab names;
	char **meta; /* key, value pairs */
	size_t nmeta;
};

void moe_safetensors_close(moe_safetensors *st)
{
	if (!st)
		return;
	moe_ctx *ctx = st->ctx;
	for (size_t i = 0; i < st->n; i++)
		rt_strfree(ctx, (char *)st->t[i].name);
	if (st->t)
		ctx_free(ctx, st->t, st->tcap * sizeof *st->t);
	for (size_t i = 0; i < 2 * st->nmeta; i++)
		rt_strfree(ctx, st->meta[i]);
	if (st->meta)
		ctx_free(ctx, st->meta, 2 * st->nmeta * sizeof *st->meta);
	rt_strtab_free(&st->names);
	rt_unmap(&st->map);
	rt_strfree(ctx, st->path);
	ctx_free(ctx, st, sizeof *st);
}

/* A JSON number that is an exact non-negative integer <= 2^53. */
static bool json_uint(const cJSON *v, int64_t *out)
{
	if (!cJSON_IsNumber(v))
		return false;
	double d = v->valuedouble;
	if (!(d >= 0 && d <= ST_MAX_EXACT) || d != (double)(int64_t)d)
		return false;
	*out = (int64_t)d;
	return true;
}

typedef struct range {
	int64_t begin, end;
	size_t idx;
} range;

static int range_cmp(const void *a, const void *b)
{
	const range *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

/* Check one header entry and fill *t; false after a diagnostic. */
static bool parse_entry(moe_ctx *ctx, const char *file, const cJSON *e, int64_t at, int64_t datalen,
	moe_st_tensor *t)
{
	const char *nm = e->string;
	if (!cJSON_IsObject(e)) {
		rt_err_at(ctx, file, at, "tensor '%s': header entry is not an object", nm);
		return false;
	}
	const cJSON *dt = NULL, *sh = NULL, *off = NULL;
	for (const cJSON *k = e->child; k; k = k->next) {
		const cJSON **slot = !strcmp(k->string, "dtype") ? &dt : !strcmp(k->string, "shape") ? &sh :
			!strcmp(k->string, "data_offsets") ? &off : NULL;
		if (!slot) {
			rt_err_at(ctx, file, at, "tensor '%s': unknown key '%s' in its header entry", nm, k->string);
			return false;
		}
		if (*slot) {
			rt_err_at(ctx, file, at, "tensor '%s': key '%s' appears twice", nm, k->string);
			return false;
		}
		*slot = k;
	}
	if (!dt || !sh || !off) {
		rt_err_at(ctx, file, at, "tensor '%s': header entry lacks '%s'", nm,
			!dt ? "dtype" : !sh ? "shape" : "data_offsets");
		return false;
	}
	if (!cJSON_IsString(dt)) {
		rt_err_at(ctx, file, at, "tensor '%s': dtype is not a string", nm);
		return false;
	}
	int ty = -1;
	for (int i = 0; i < MOE_ST_DTYPE_COUNT; i++)
		if (!strcmp(dt->valuestring, st_types[i].name))
			ty = i;
	if (ty < 0) {
		rt_err_at(ctx, file, at, "tensor '%s': unknown dtype '%s'", nm, dt->valuestring);
		return false;
	}
	t->dtype = (moe_st_dtype)ty;
	if (!cJSON_IsArray(sh)) {
		rt_err_at(ctx, file, at, "tensor '%s': shape is not an array", nm);
		return false;
	}
	int rank = cJSON_GetArraySize(sh);
	if (rank > MOE_MAX_RANK) {
		rt_err_at(ctx, file, at, "tensor '%s': rank %d exceeds the limit %d", nm, rank, MOE_MAX_RANK);
		return false;
	}
	t->rank = rank;
	int64_t numel = 1;
	int i = 0;
	for (const cJSON *d = sh->child; d; d = d->next, i++) {
		if (!json_uint(d, &t->shape[i])) {
			rt_err_at(ctx, file, at, "tensor '%s': shape[%d] is not a non-negative integer", nm, i);
			return false;
		}
		if (!ir_mul_ov(numel, t->shape[i], &numel)) {
			rt_err_at(ctx, file, at, "tensor '%s': element count overflows 64 bits", nm);
			return false;
		}
	}
	t->numel = numel;
	int64_t nbytes;
	if (!ir_mul_ov(numel, (int64_t)st_types[ty].bits, &nbytes)) {
		rt_err_at(ctx, file, at, "tensor '%s': byte size overflows 64 bits", nm);
		return false;
	}
	if (nbytes % 8) {
		rt_err_at(ctx, file, at, "tensor '%s': %lld %s elements do not fill whole bytes", nm, (long long)numel,
			st_types[ty].name);
		return false;
	}
	nbytes /= 8;
	int64_t b, en;
	if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(off->child, &b) ||
		!json_uint(off->child->next, &en)) {
		rt_err_at(ctx, file, at, "tensor '%s': data_offsets must be two non-negative integers", nm);
		return false;
	}
	if (b > en) {
		rt_err_at(ctx, file, at, "tensor '%s': data_offsets [%lld, %lld] are out of order", nm, (long long)b,
			(long long)en);
		return false;
	}
	if (en > datalen) {
		rt_err_at(ctx, file, at, "tensor '%s': data_offsets [%lld, %lld] end outside the data section of %lld bytes",
			nm, (long long)b, (long long)en, (long long)datalen);
		return false;
	}
	if (en - b != nbytes) {
		rt_err_at(ctx, file, at,
			"tensor '%s': data_offsets span %lld bytes but %s x %lld elements need %lld", nm,
			(long long)(en - b), st_types[ty].name, (long long)numel, (long long)nbytes);
		return false;
	}
	t->offset = b; /* made absolute by the caller */
	t->nbytes = (size_t)nbytes;
	return true;
}

/* ctx_defer clean-ups: a cJSON tree (cJSON's own malloc), a mapping */
static void json_unwind(void *root)
{
	cJSON_Delete(root);
}

static void map_unwind(void *m)
{
	rt_unmap(m);
}

static bool parse_metadata(moe_safetensors *st, const cJSON *m, int64_t at)
{
	if (!cJSON_IsObject(m)) {
		rt_err_at(st->ctx, st->path, at, "__metadata__ is not an object");
		return false;
	}
	size_t n = (size_t)cJSON_GetArraySize(m);
	for (const cJSON *k = m->child; k; k = k->next)
		if (!cJSON_IsString(k)) {
			rt_err_at(st->ctx, st->path, at, "__metadata__ value of '%s' is not a string", k->string);
			return false;
		}
	if (!n)
		return true;
	st->meta = ctx_alloc(st->ctx, 2 * n * sizeof *st->meta);
	for (const cJSON *k = m->child; k; k = k->next) {
		st->meta[2 * st->nmeta] = rt_strdup(st->ctx, k->string);
		st->meta[2 * st->nmeta + 1] = rt_strdup(st->ctx, k->valuestring);
		st->nmeta++;
	}
	return true;
}

static bool parse_file(moe_safetensors *st)
{
	moe_ctx *ctx = st->ctx;
	const char *file = st->path;
	const unsigned char *p = st->map.data;
	size_t len = st->map.len;
	if (len < 8) {
		rt_err_at(ctx, file, 0, "file of %zu bytes is too short for a safetensors header", len);
		return false;
	}
	uint64_t hl = rt_ld64(p);
	if (hl > ST_MAX_HEADER) {
		rt_err_at(ctx, file, 0, "header length %llu exceeds the 100 MB limit", (unsigned long long)hl);
		return false;
	}
	if (hl > len - 8) {
		rt_err_at(ctx, file, 0, "header length %llu exceeds the %zu bytes after the length field",
			(unsigned long long)hl, len - 8);
		return false;
	}
	if (hl < 2 || p[8] != '{') {
		rt_err_at(ctx, file, 8, "header is not a JSON object");
		return false;
	}
	const char *hdr = (const char *)p + 8, *end = NULL;
	/* what cJSON would allocate, bounded before it runs: the header's own
	 * size x ST_COST_PER_BYTE (+1 MiB), at most ST_MAX_HEADER_COST */
	rt_json_shape sh;
	uint64_t cap = (uint64_t)hl * ST_COST_PER_BYTE + ((uint64_t)1 << 20);
	rt_json_caps caps = {ST_MAX_HEADER, cap < ST_MAX_HEADER_COST ? cap : ST_MAX_HEADER_COST, "safetensors header"};
	if (!rt_json_check_caps(ctx, file, hdr, (size_t)hl, &caps, 8, &sh))
		return false;
	if (sh.max_array > ST_MAX_ARRAY) {
		rt_err_at(ctx, file, 8, "header holds an array of %zu elements; shapes have at most %d dims", sh.max_array,
			MOE_MAX_RANK);
		return false;
	}
	/* \u0000 in a key would make it compare as its prefix; keys' offsets for messages */
	size_t nkeys = 0;
	int64_t nul = rt_json_scan(hdr, (size_t)hl, NULL, 0, &nkeys);
	if (nul >= 0) {
		rt_err_at(ctx, file, 8 + nul, "a header string holds \\u0000");
		return false;
	}
	cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hl, &end, 0);
	if (!root || !cJSON_IsObject(root)) {
		const char *at = end; /* cJSON sets it on failure too; its global error pointer is shared between threads */
		int64_t off = at && at >= hdr && at <= hdr + hl ? 8 + (at - hdr) : 8;
		rt_err_at(ctx, file, off, "header is not valid JSON");
		cJSON_Delete(root);
		return false;
	}
	for (const char *q = end; q < hdr + hl; q++)
		if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
			rt_err_at(ctx, file, 8 + (q - hdr), "unexpected bytes after the JSON header");
			cJSON_Delete(root);
			return false;
		}
	int64_t base = 8 + (int64_t)hl, datalen = (int64_t)len - base;
	uint32_t dj = ctx_defer(ctx, json_unwind, root); /* out of memory below: delete the tree */
	int64_t *keyat = ctx_alloc(ctx, (nkeys ? nkeys : 1) * sizeof *keyat);
	rt_json_scan(hdr, (size_t)hl, keyat, nkeys, NULL);
	size_t n = 0, ki = 0;
	for (const cJSON *e = root->child; e; e = e->next)
		n += strcmp(e->string, "__metadata__") != 0;
	st->tcap = n ? n : 1;
	st->t = ctx_alloc(ctx, st->tcap * sizeof *st->t);
	rt_strtab_init(&st->names, ctx, n);
	bool ok = true, seen_meta = false;
	for (const cJSON *e = root->child; e && ok; e = e->next, ki++) {
		int64_t at = ki < nkeys ? 8 + keyat[ki] : 8; /* the entry's key */
		if (!strcmp(e->string, "__metadata__")) {
			if (seen_meta) {
				rt_err_at(ctx, file, at, "__metadata__ appears twice");
				ok = false;
			} else {
				ok = parse_metadata(st, e, at);
			}
			seen_meta = true;
			continue;
		}
		moe_st_tensor *t = &st->t[st->n];
		if (!parse_entry(ctx, file, e, at, datalen, t)) {
			ok = false;
			break;
		}
		t->name = rt_strdup(ctx, e->string);
		st->n++;
		if (!rt_strtab_put(&st->names, t->name, st->n - 1)) {
			rt_err_at(ctx, file, at, "tensor '%s' appears twice in the header", t->name);
			ok = false;
		}
	}
	ctx_undefer(ctx, dj);
	cJSON_Delete(root);
	ctx_free(ctx, keyat, (nkeys ? nkeys : 1) * sizeof *keyat);
	if (!ok)
		return false;
	/* ranges: sorted, they must tile the data section exactly */
	size_t rn = n ? n : 1;
	range *r = ctx_alloc(ctx, rn * sizeof *r);
	for (size_t i = 0; i < n; i++)
		r[i] = (range){st->t[i].offset, st->t[i].offset + (int64_t)st->t[i].nbytes, i};
	qsort(r, n, sizeof *r, range_cmp);
	int64_t at = 0;
	for (size_t i = 0; i < n && ok; i++) {
		if (r[i].begin < at) {
			rt_err_at(ctx, file, base + r[i].begin, "tensor '%s' [%lld, %lld] overlaps tensor '%s'",
				st->t[r[i].idx].name, (long long)r[i].begin, (long long)r[i].end,
				st->t[r[i - 1].idx].name);
			ok = false;
		} else if (r[i].begin > at) {
			rt_err_at(ctx, file, base + at, "data bytes [%lld, %lld) belong to no tensor", (long long)at,
				(long long)r[i].begin);
			ok = false;
		}
		at = r[i].end > at ? r[i].end : at;
	}
	if (ok && at != datalen) {
		rt_err_at(ctx, file, base + at, "%lld trailing data bytes belong to no tensor", (long long)(datalen - at));
		ok = false;
	}
	ctx_free(ctx, r, rn * sizeof *r);
	if (!ok)
		return false;
	for (size_t i = 0; i < n; i++) {
		st->t[i].offset += base;
		st->t[i].data = p + st->t[i].offset;
	}
	return true;
}

static moe_safetensors *st_new(moe_ctx *ctx, const char *path)
{
	moe_safetensors *st = ctx_alloc(ctx, sizeof *st);
	st->ctx = ctx;
	st->path = rt_strdup(ctx, path);
	return st;
}

/* The mapping is unmapped by a throw while st is being read; once st is
 * returned, its owner (a checkpoint, the caller) releases it. */
static moe_safetensors *st_open(moe_ctx *ctx, const char *path, const void *data, size_t len)
{
	moe_safetensors *st = st_new(ctx, path);
	if (data || len)
		st->map = (rt_map){data, len, false};
	else if (rt_map_file(ctx, path, &st->map) != MOE_OK) {
		moe_safetensors_close(st);
		return NULL;
	}
	uint32_t dm = ctx_defer(ctx, map_unwind, &st->map);
	bool ok = parse_file(st);
	ctx_undefer(ctx, dm);
	if (!ok) {
		moe_safetensors_close(st);
		return NULL;
	}
	return st;
}

moe_safetensors *moe_safetensors_open(moe_ctx *ctx, const char *path)
{
	CTX_GUARDED(ctx, moe_safetensors *, NULL, st_open(ctx, path, NULL, 0));
}

moe_safetensors *moe_safetensors_open_mem(moe_ctx *ctx, const char *name, const void *data, size_t len)
{
	static const char empty[1];
	CTX_GUARDED(ctx, moe_safetensors *, NULL, st_open(ctx, name, len ? data : empty, len));
}

size_t moe_safetensors_count(const moe_safetensors *st)
{
	return st->n;
}

const moe_st_tensor *moe_safetensors_at(const moe_safetensors *st, size_t i)
{
	return i < st->n ? &st->t[i] : NULL;
}

const moe_st_tensor *moe_safetensors_find(const moe_safetensors *st, const char *name)
{
	size_t i;
	return rt_strtab_get(&st->names, name, &i) ? &st->t[i] : NULL;
}

const char *moe_safetensors_path(const moe_safetensors *st)
{
	return st->path;
}

const char *moe_safetensors_metadata(const moe_safetensors *st, const char *key)
{
	for (size_t i = 0; i < st->nmeta; i++)
		if (!strcmp(st->meta[2 * i], key))
			return st->meta[2 * i + 1];
	return NULL;
}

/* ---- checkpoints: files, sharded indexes, directories ---- */

typedef struct ck_shard {
	char *path;
	moe_safetensors *st;
	bool failed;
	uint32_t seq; /* the checkpoint's nopen when this shard was opened */
} ck_shard;

typedef struct ck_source {
	char *path;          /* as given */
	moe_safetensors *st; /* a single file, or NULL for an index */
	char *index;         /* the index path */
	char **names;        /* weight_map keys, owned */
	size_t *shard_of;
	size_t nnames;
	rt_strtab map;
	ck_shard *shards;
	size_t nshards, shcap;
} ck_source;

struct moe_checkpoint {
	moe_ctx *ctx;
	ck_source *src;
	size_t n;
	uint32_t nopen; /* shards opened so far */
};

static void source_free(moe_ctx *ctx, ck_source *s)
{
	rt_strfree(ctx, s->path);
	moe_safetensors_close(s->st);
	rt_strtab_free(&s->map);
	for (size_t i = 0; i < s->nnames; i++)
		rt_strfree(ctx, s->names[i]);
	if (s->names) {
		ctx_free(ctx, s->names, s->nnames * sizeof *s->names);
		ctx_free(ctx, s->shard_of, s->nnames * sizeof *s->shard_of);
	}
	for (size_t i = 0; i < s->nshards; i++) {
		rt_strfree(ctx, s->shards[i].path);
		moe_safetensors_close(s->shards[i].st);
	}
	if (s->shards)
		ctx_free(ctx, s->shards, s->shcap * sizeof *s->shards);
	rt_strfree(ctx, s->index);
}

void moe_checkpoint_close(moe_checkpoint *ck)
{
	if (!ck)
		return;
	for (size_t i = 0; i < ck->n; i++)
		source_free(ck->ctx, &ck->src[i]);
	if (ck->src)
		ctx_free(ck->ctx, ck->src, ck->n * sizeof *ck->src);
	ctx_free(ck->ctx, ck, sizeof *ck);
}

/* dir + "/" + rel in context memory. */
static char *path_join(moe_ctx *ctx, const char *dir, size_t dlen, const char *rel)
{
	size_t rl = strlen(rel);
	char *p = ctx_alloc(ctx, dlen + 1 + rl + 1);
	memcpy(p, dir, dlen);
	p[dlen] = '/';
	memcpy(p + dlen + 1, rel, rl + 1);
	if (!dlen)
		memmove(p, p + 1, rl + 1); /* no directory: rel itself */
	return p;
}

/* A shard name must stay inside the index's directory. */
static bool safe_relative(const char *s)
{
	if (!*s || *s == '/')
		return false;
	for (const char *c = s; *c;) {
		const char *e = strchr(c, '/');
		size_t n = e ? (size_t)(e - c) : strlen(c);
		if (n == 2 && c[0] == '.' && c[1] == '.')
			return false;
		c += n + (e != NULL);
	}
	return true;
}

static bool load_index(moe_ctx *ctx, const char *path, ck_source *s)
{
	char *text;
	size_t len;
	rt_json_shape sh;
	if (moe_read_file_max(ctx, path, RT_JSON_INDEX_MAX_BYTES, &text, &len) != MOE_OK)
		return false;
	if (!rt_json_check_caps(ctx, path, text, len, &rt_json_index_caps, -1, &sh)) {
		free(text);
		return false;
	}
	cJSON *root = cJSON_ParseWithLength(text, len);
	free(text); /* malloc'd: released before the next context allocation */
	const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
	if (!root || !cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
		rt_err_at(ctx, path, -1, root ? "sharded index has no \"weight_map\" object" :
						"sharded index is not valid JSON");
		cJSON_Delete(root);
		return false;
	}
	uint32_t dj = ctx_defer(ctx, json_unwind, root);
	s->index = rt_strdup(ctx, path);
	const char *slash = strrchr(path, '/');
	size_t dlen = slash ? (size_t)(slash - path) : 0;
	if (slash == path)
		dlen = 1; /* an index in "/" */
	size_t n = (size_t)cJSON_GetArraySize(wm);
	s->nnames = n ? n : 1;
	s->names = ctx_alloc(ctx, s->nnames * sizeof *s->names);
	s->shard_of = ctx_alloc(ctx, s->nnames * sizeof *s->shard_of);
	rt_strtab_init(&s->map, ctx, n);
	rt_strtab shards;
	rt_strtab_init(&shards, ctx, 16);
	size_t i = 0;
	bool ok = true;
	for (const cJSON *e = wm->child; e; e = e->next, i++) {
		s->names[i] = rt_strdup(ctx, e->string);
		if (!cJSON_IsString(e) || !safe_relative(e->valuestring)) {
			rt_err_at(ctx, path, -1, "weight_map entry '%s' must be a relative file name inside the index's directory",
				e->string);
			ok = false;
			break;
		}
		size_t k;
		if (!rt_strtab_get(&shards, e->valuestring, &k)) {
			if (s->nshards == s->shcap) {
				size_t nc = s->shcap ? s->shcap * 2 : 8;
				s->shards = ctx_realloc(ctx, s->shards, s->shcap * sizeof *s->shards, nc * sizeof *s->shards);
				s->shcap = nc;
			}
			k = s->nshards++;
			s->shards[k] = (ck_shard){path_join(ctx, path, dlen, e->valuestring), NULL, false, 0};
			/* the key must outlive the table: use the joined path's tail */
			rt_strtab_put(&shards, s->shards[k].path + (dlen ? dlen + 1 : 0), k);
		}
		s->shard_of[i] = k;
		if (!rt_strtab_put(&s->map, s->names[i], i)) {
			rt_err_at(ctx, path, -1, "weight_map lists '%s' twice", e->string);
			ok = false;
			break;
		}
	}
	rt_strtab_free(&shards);
	ctx_undefer(ctx, dj);
	cJSON_Delete(root);
	return ok;
}

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static bool open_source(moe_ctx *ctx, const char *path, ck_source *s)
{
	struct stat sb;
	if (stat(path, &sb) != 0) {
		rt_err_at(ctx, path, -1, "cannot open: %s", strerror(errno));
		return false;
	}
	if (S_ISDIR(sb.st_mode)) {
		size_t dlen = strlen(path);
		while (dlen > 1 && path[dlen - 1] == '/')
			dlen--;
		char *idx = path_join(ctx, path, dlen, "model.safetensors.index.json");
		bool ok;
		if (stat(idx, &sb) == 0) {
			ok = load_index(ctx, idx, s);
		} else {
			char *one = path_join(ctx, path, dlen, "model.safetensors");
			if (stat(one, &sb) == 0) {
				s->st = moe_safetensors_open(ctx, one);
				ok = s->st != NULL;
			} else {
				rt_err_at(ctx, path, -1, "directory holds neither model.safetensors.index.json nor model.safetensors");
				ok = false;
			}
			rt_strfree(ctx, one);
		}
		rt_strfree(ctx, idx);
		return ok;
	}
	if (ends_with(path, ".json"))
		return load_index(ctx, path, s);
	s->st = moe_safetensors_open(ctx, path);
	return s->st != NULL;
}

void rt_checkpoint_mark(moe_checkpoint *ck, bool all, rt_ck_mark *m)
{
	m->ck = ck;
	m->all = all;
	m->nopen = ck->nopen;
}

/* A throw inside a guarded call that used ck (its blocks born in the call go
 * with the throw): unmap every file (all: ck itself is the call's), or forget
 * the shards opened since the mark, leaving an older ck as it was. */
void rt_checkpoint_unwind(void *arg)
{
	const rt_ck_mark *m = arg;
	moe_checkpoint *ck = m->ck;
	for (size_t i = 0; ck->src && i < ck->n; i++) {
		ck_source *s = &ck->src[i];
		if (s->st && m->all)
			rt_unmap(&s->st->map);
		for (size_t k = 0; k < s->nshards; k++) {
			ck_shard *sh = &s->shards[k];
			if (!m->all && (!sh->st || sh->seq <= m->nopen))
				continue;
			if (sh->st)
				rt_unmap(&sh->st->map);
			sh->st = NULL;
			sh->failed = false;
		}
	}
}

static moe_checkpoint *checkpoint_open(moe_ctx *ctx, const char *const *paths, size_t npaths)
{
	if (!npaths) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "no checkpoint files given");
		return NULL;
	}
	moe_checkpoint *ck = ctx_alloc(ctx, sizeof *ck);
	ck->ctx = ctx;
	rt_ck_mark mk;
	rt_checkpoint_mark(ck, true, &mk);
	uint32_t d = ctx_defer(ctx, rt_checkpoint_unwind, &mk);
	ck->src = ctx_alloc(ctx, npaths * sizeof *ck->src);
	ck->n = npaths;
	bool ok = true;
	for (size_t i = 0; i < npaths; i++) {
		ck->src[i].path = rt_strdup(ctx, paths[i]);
		ok &= open_source(ctx, paths[i], &ck->src[i]);
	}
	ctx_undefer(ctx, d);
	if (!ok) {
		moe_checkpoint_close(ck);
		return NULL;
	}
	return ck;
}

moe_checkpoint *moe_checkpoint_open(moe_ctx *ctx, const char *const *paths, size_t npaths)
{
	CTX_GUARDED(ctx, moe_checkpoint *, NULL, checkpoint_open(ctx, paths, npaths));
}

/* One in-memory source: a moe_safetensors without a mapping whose entries
 * point at the caller's bytes. Each entry is checked as a file's header
 * entry is (dtype, rank, shape, byte size); names are copied. */
static moe_safetensors *st_from_entries(moe_ctx *ctx, const char *name, const moe_st_tensor *e, size_t n)
{
	moe_safetensors *st = st_new(ctx, name);
	st->tcap = n ? n : 1;
	st->t = ctx_alloc(ctx, st->tcap * sizeof *st->t);
	rt_strtab_init(&st->names, ctx, n);
	bool ok = true;
	for (size_t i = 0; i < n && ok; i++) {
		const char *nm = e[i].name ? e[i].name : "";
		int64_t numel = 1, bits = 0;
		ok = e[i].name && *e[i].name && (unsigned)e[i].dtype < MOE_ST_DTYPE_COUNT && e[i].rank >= 0 &&
		     e[i].rank <= MOE_MAX_RANK && (e[i].data || !e[i].nbytes);
		for (int d = 0; ok && d < e[i].rank; d++)
			ok = e[i].shape[d] >= 0 && ir_mul_ov(numel, e[i].shape[d], &numel);
		ok = ok && ir_mul_ov(numel, (int64_t)st_types[e[i].dtype].bits, &bits) && bits % 8 == 0 &&
		     (uint64_t)(bits / 8) == (uint64_t)e[i].nbytes;
		if (!ok) {
			rt_err_at(ctx, name, -1, "tensor %zu ('%s'): the name, dtype, shape or byte size is not valid", i, nm);
			break;
		}
		moe_st_tensor *t = &st->t[st->n];
		*t = e[i];
		t->numel = numel;
		t->offset = -1;
		t->name = rt_strdup(ctx, nm);
		st->n++;
		if (!rt_strtab_put(&st->names, t->name, st->n - 1)) {
			rt_err_at(ctx, name, -1, "tensor '%s' is given twice", t->name);
			ok = false;
		}
	}
	if (!ok) {
		moe_safetensors_close(st);
		return NULL;
	}
	return st;
}

static moe_checkpoint *checkpoint_open_tensors(moe_ctx *ctx, const char *name, const moe_st_tensor *e, size_t n)
{
	moe_safetensors *st = st_from_entries(ctx, name ? name : "<memory>", e, n);
	if (!st)
		return NULL;
	moe_checkpoint *ck = ctx_alloc(ctx, sizeof *ck);
	ck->ctx = ctx;
	ck->src = ctx_alloc(ctx, sizeof *ck->src);
	ck->n = 1;
	ck->src[0].path = rt_strdup(ctx, st->path);
	ck->src[0].st = st;
	return ck;
}

moe_checkpoint *moe_checkpoint_open_tensors(moe_ctx *ctx, const char *name, const moe_st_tensor *entries, size_t n)
{
	CTX_GUARDED(ctx, moe_checkpoint *, NULL, checkpoint_open_tensors(ctx, name, entries, n));
}

static const moe_st_tensor *checkpoint_find(moe_checkpoint *ck, const char *name, const char **file);

/* Opening a shard the first time allocates: a refusal leaves ck as it was. */
const moe_st_tensor *moe_checkpoint_find(moe_checkpoint *ck, const char *name, const char **file)
{
	CTX_GUARDED(ck->ctx, const moe_st_tensor *, NULL, checkpoint_find(ck, name, file));
}

static const moe_st_tensor *checkpoint_find(moe_checkpoint *ck, const char *name, const char **file)
{
	for (size_t i = 0; i < ck->n; i++) {
		ck_source *s = &ck->src[i];
		if (s->st) {
			const moe_st_tensor *t = moe_safetensors_find(s->st, name);
			if (t) {
				if (file)
					*file = s->st->path;
				return t;
			}
			continue;
		}
		size_t k;
		if (!rt_strtab_get(&s->map, name, &k))
			continue;
		ck_shard *sh = &s->shards[s->shard_of[k]];
		if (!sh->st && !sh->failed) {
			sh->st = moe_safetensors_open(ck->ctx, sh->path);
			sh->failed = sh->st == NULL;
			sh->seq = ++ck->nopen;
		}
		if (sh->failed) {
			rt_err_at(ck->ctx, s->index, -1, "tensor '%s' is in shard '%s', which could not be read", name,
				sh->path);
			return NULL;
		}
		const moe_st_tensor *t = moe_safetensors_find(sh->st, name);
		if (!t) {
			rt_err_at(ck->ctx, sh->path, -1, "the index %s places tensor '%s' in this shard, but it is not there",
				s->index, name);
			return NULL;
		}
		if (file)
			*file = sh->path;
		return t;
	}
	return NULL;
}

size_t rt_checkpoint_nsources(const moe_checkpoint *ck)
{
	return ck->n;
}

const char *rt_checkpoint_source(const moe_checkpoint *ck, size_t i)
{
	return ck->src[i].path;
}

void rt_checkpoint_names(const moe_checkpoint *ck, void (*fn)(void *arg, const char *name), void *arg)
{
	for (size_t i = 0; i < ck->n; i++) {
		const ck_source *s = &ck->src[i];
		if (s->st)
			for (size_t k = 0; k < s->st->n; k++)
				fn(arg, s->st->t[k].name);
		else
			for (size_t k = 0; k < s->nnames; k++)
				fn(arg, s->names[k]);
	}
}
