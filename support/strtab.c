/* support/strtab.c: a string -> index hash table (open addressing, FNV-1a). */
#include <string.h>

#include "support/support.h"

static uint64_t str_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

void ctx_strtab_init(ctx_strtab *t, moe_ctx *ctx, size_t expect)
{
	size_t cap = 16;
	while (cap < expect * 2 + 1)
		cap *= 2;
	t->ctx = ctx;
	t->cap = cap;
	t->n = 0;
	t->keys = ctx_alloc(ctx, cap * sizeof *t->keys);
	t->vals = ctx_alloc(ctx, cap * sizeof *t->vals);
}

static void strtab_grow(ctx_strtab *t)
{
	ctx_strtab nt;
	ctx_strtab_init(&nt, t->ctx, t->cap);
	for (size_t i = 0; i < t->cap; i++)
		if (t->keys[i])
			ctx_strtab_put(&nt, t->keys[i], t->vals[i]);
	ctx_strtab_free(t);
	*t = nt;
}

bool ctx_strtab_put(ctx_strtab *t, const char *key, size_t val)
{
	if ((t->n + 1) * 2 > t->cap)
		strtab_grow(t);
	size_t m = t->cap - 1;
	for (size_t i = (size_t)str_hash(key) & m;; i = (i + 1) & m) {
		if (!t->keys[i]) {
			t->keys[i] = key;
			t->vals[i] = val;
			t->n++;
			return true;
		}
		if (!strcmp(t->keys[i], key))
			return false;
	}
}

bool ctx_strtab_get(const ctx_strtab *t, const char *key, size_t *val)
{
	if (!t->cap)
		return false;
	size_t m = t->cap - 1;
	for (size_t i = (size_t)str_hash(key) & m; t->keys[i]; i = (i + 1) & m)
		if (!strcmp(t->keys[i], key)) {
			*val = t->vals[i];
			return true;
		}
	return false;
}

void ctx_strtab_free(ctx_strtab *t)
{
	if (t->keys) {
		ctx_free(t->ctx, t->keys, t->cap * sizeof *t->keys);
		ctx_free(t->ctx, t->vals, t->cap * sizeof *t->vals);
	}
	t->keys = NULL;
	t->vals = NULL;
	t->cap = t->n = 0;
}
