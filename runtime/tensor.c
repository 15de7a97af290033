/* runtime/tensor.c: host tensors, bf16 conversion, name -> tensor maps.
 *
 * Every allocation goes through the context allocator. A tensor's data block
 * is allocated with max(nbytes, 1) bytes and freed with the same size, so an
 * embedder's allocator always sees matching sizes. */
#include <string.h>

#include "ir/ir.h"
#include "moec/runtime.h"

static size_t block_size(size_t nbytes)
{
	return nbytes ? nbytes : 1;
}

/* The tensor header of moe_tensor_new; NULL (with a diagnostic) on a bad type or size. */
static moe_tensor *tensor_header(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape)
{
	if ((unsigned)t >= MOE_DTYPE_COUNT) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tensor: unknown element type %d", (int)t);
		return NULL;
	}
	if (rank < 0 || rank > MOE_MAX_RANK || (rank > 0 && !shape)) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tensor: rank %d is outside 0..%d", rank, MOE_MAX_RANK);
		return NULL;
	}
	int64_t bytes = (int64_t)moe_dtype_size(t);
	for (int i = 0; i < rank; i++) {
		if (shape[i] < 0 || shape[i] > MOE_MAX_DIM) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tensor: dimension %d has size %lld, outside 0..%lld", i,
				(long long)shape[i], (long long)MOE_MAX_DIM);
			return NULL;
		}
		if (!ir_mul_ov(bytes, shape[i], &bytes)) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tensor: the byte size of a %s tensor of rank %d overflows",
				moe_dtype_name(t), rank);
			return NULL;
		}
	}
	/* the allocator takes size_t; refuse sizes no pointer difference can span */
	if ((uint64_t)bytes > (uint64_t)(PTRDIFF_MAX / 2)) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "tensor: %lld bytes is too large to allocate",
			(long long)bytes);
		return NULL;
	}
	moe_tensor *tn = ctx_try_alloc(ctx, sizeof *tn);
	if (!tn) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory allocating a tensor");
		return NULL;
	}
	tn->dtype = t;
	tn->rank = rank;
	for (int i = 0; i < rank; i++)
		tn->shape[i] = shape[i];
	tn->nbytes = (size_t)bytes;
	return tn;
}

moe_tensor *moe_tensor_new(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape)
{
	moe_tensor *tn = tensor_header(ctx, t, rank, shape);
	if (tn) {
		tn->data = ctx_try_alloc(ctx, block_size(tn->nbytes));
		if (!tn->data) {
			moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory allocating a tensor of %zu bytes",
				tn->nbytes);
			ctx_free(ctx, tn, sizeof *tn);
			return NULL;
		}
		tn->owned = 1;
	}
	return tn;
}

moe_tensor *moe_tensor_new_shape(moe_ctx *ctx, moe_dtype t, int rank, const int64_t *shape)
{
	return tensor_header(ctx, t, rank, shape); /* data NULL, not owned */
}

moe_tensor *moe_tensor_view(moe_ctx *ctx, const moe_tensor *t)
{
	moe_tensor *v = moe_tensor_new_shape(ctx, t->dtype, t->rank, t->shape);
	if (v) {
		v->data = t->data;
		v->nbytes = t->nbytes;
		v->owned = 0;
	}
	return v;
}

void moe_tensor_free(moe_ctx *ctx, moe_tensor *t)
{
	if (!t)
		return;
	if (t->owned)
		ctx_free(ctx, t->data, block_size(t->nbytes));
	ctx_free(ctx, t, sizeof *t);
}

int64_t moe_tensor_numel(const moe_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->rank; i++)
		if (!ir_mul_ov(n, t->shape[i], &n))
			return -1;
	return n;
}

/* ---- bf16 ---- */
uint16_t moe_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, set the quiet bit */
		return (uint16_t)((u >> 16) | 0x0040u);
	/* round to nearest, ties to even: add 0x7fff plus the lowest kept bit */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float moe_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	if ((h & 0x7fffu) > 0x7f80u)
		u |= 0x00400000u; /* quiet a signalling NaN */
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* ---- name -> tensor maps: insertion-ordered entries plus an open-addressed index ---- */
typedef struct map_entry {
	char *name;
	size_t namelen;
	moe_tensor *t;
} map_entry;

struct moe_tensor_map {
	moe_ctx *ctx;
	map_entry *ents;
	uint32_t nents, entcap;
	uint32_t *slots; /* entry index + 1, 0 = empty; size is a power of two */
	uint32_t nslots;
};

static uint32_t hash_name(const char *s)
{
	uint32_t h = 2166136261u; /* FNV-1a */
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 16777619u;
	}
	return h;
}

moe_tensor_map *moe_tensor_map_new(moe_ctx *ctx)
{
	moe_tensor_map *m = ctx_soft_alloc(ctx, sizeof *m);
	if (!m) {
		moe_diag(ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory creating a tensor map");
		return NULL;
	}
	m->ctx = ctx;
	return m;
}

void moe_tensor_map_free(moe_tensor_map *m)
{
	if (!m)
		return;
	moe_ctx *c = m->ctx;
	for (uint32_t i = 0; i < m->nents; i++) {
		ctx_free(c, m->ents[i].name, m->ents[i].namelen + 1);
		moe_tensor_free(c, m->ents[i].t);
	}
	ctx_free(c, m->ents, (size_t)m->entcap * sizeof *m->ents);
	ctx_free(c, m->slots, (size_t)m->nslots * sizeof *m->slots);
	ctx_free(c, m, sizeof *m);
}

/* slot holding `name`, or the empty slot where it would go */
static uint32_t *find_slot(const moe_tensor_map *m, const char *name)
{
	uint32_t mask = m->nslots - 1;
	for (uint32_t i = hash_name(name) & mask;; i = (i + 1) & mask) {
		uint32_t e = m->slots[i];
		if (!e || !strcmp(m->ents[e - 1].name, name))
			return &m->slots[i];
	}
}

/* Fills the new index slots (nslots entries, zeroed) and takes them. */
static void rehash(moe_tensor_map *m, uint32_t *slots, uint32_t nslots)
{
	ctx_free(m->ctx, m->slots, (size_t)m->nslots * sizeof *m->slots);
	m->slots = slots;
	m->nslots = nslots;
	for (uint32_t i = 0; i < m->nents; i++)
		*find_slot(m, m->ents[i].name) = i + 1;
}

/* Every block is taken before the map changes: out of memory leaves it as
 * it was (and frees t, which the map owned from the call). */
moe_status moe_tensor_map_set(moe_tensor_map *m, const char *name, moe_tensor *t)
{
	IR_ASSERT(m && name);
	if (m->nslots) {
		uint32_t *s = find_slot(m, name);
		if (*s) {
			map_entry *e = &m->ents[*s - 1];
			if (e->t != t)
				moe_tensor_free(m->ctx, e->t);
			e->t = t;
			return MOE_OK;
		}
	}
	IR_ASSERT(m->nents < UINT32_MAX / 4);
	size_t len = strlen(name);
	char *nm = ctx_try_alloc(m->ctx, len + 1);
	uint32_t nslots = m->nslots, *slots = NULL;
	if ((uint64_t)(m->nents + 1) * 2 > nslots) {
		nslots = nslots ? nslots * 2 : 16;
		slots = ctx_try_alloc(m->ctx, (size_t)nslots * sizeof *slots);
	}
	if (nm && (slots || nslots == m->nslots) && m->nents + 1 > m->entcap) {
		uint32_t cap = m->entcap ? m->entcap * 2 : 8;
		map_entry *ents = ctx_try_realloc(m->ctx, m->ents, (size_t)cap * sizeof *ents);
		if (ents) {
			m->ents = ents;
			m->entcap = cap;
		}
	}
	if (!nm || (!slots && nslots != m->nslots) || m->nents + 1 > m->entcap) {
		ctx_free(m->ctx, nm, 0);
		ctx_free(m->ctx, slots, 0);
		moe_tensor_free(m->ctx, t);
		if (ctx_guarded(m->ctx)) /* inside the library: the guarded call fails */
			ctx_throw(m->ctx, len + 1);
		moe_diag(m->ctx, MOE_DIAG_ERROR, moe_loc_none(), "out of memory adding tensor '%s' to a map", name);
		return MOE_ERR_NOMEM;
	}
	if (slots)
		rehash(m, slots, nslots);
	map_entry *e = &m->ents[m->nents];
	e->namelen = len;
	e->name = nm;
	memcpy(e->name, name, len + 1);
	e->t = t;
	m->nents++;
	*find_slot(m, name) = m->nents;
	return MOE_OK;
}

/* Moves every entry of from into m (an entry of the same name is replaced),
 * leaving from empty. Every block is taken before m changes, and then
 * ctx_commit_point: a guarded call that fills a map of its own and moves it
 * into its caller's map last leaves the caller's map as it was on a throw. */
void rt_tensor_map_move(moe_tensor_map *m, moe_tensor_map *from)
{
	moe_ctx *c = m->ctx;
	uint32_t need = m->nents + from->nents, cap = m->entcap, nslots = m->nslots ? m->nslots : 16;
	while (cap < need)
		cap = cap ? cap * 2 : 8;
	while ((uint64_t)need * 2 > nslots)
		nslots *= 2;
	map_entry *ents = ctx_alloc(c, (size_t)(cap ? cap : 1) * sizeof *ents);
	uint32_t *slots = ctx_alloc(c, (size_t)nslots * sizeof *slots);
	ctx_commit_point(c);
	if (m->nents)
		memcpy(ents, m->ents, (size_t)m->nents * sizeof *ents);
	ctx_free(c, m->ents, 0);
	m->ents = ents;
	m->entcap = cap ? cap : 1;
	rehash(m, slots, nslots);
	for (uint32_t i = 0; i < from->nents; i++) {
		map_entry *fe = &from->ents[i];
		uint32_t *s = find_slot(m, fe->name);
		if (*s) { /* replace: the name block of from is not needed */
			map_entry *e = &m->ents[*s - 1];
			if (e->t != fe->t)
				moe_tensor_free(c, e->t);
			e->t = fe->t;
			ctx_free(c, fe->name, 0);
		} else {
			m->ents[m->nents] = *fe;
			*s = ++m->nents;
		}
	}
	from->nents = 0;
	ctx_free(c, from->slots, 0);
	from->slots = NULL;
	from->nslots = 0;
}

moe_tensor *moe_tensor_map_get(const moe_tensor_map *m, const char *name)
{
	if (!m || !name || !m->nslots)
		return NULL;
	uint32_t s = *find_slot(m, name);
	return s ? m->ents[s - 1].t : NULL;
}
