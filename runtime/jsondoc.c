/* runtime/jsondoc.c: reading a JSON document the way Python's json module
 * does (config.json, index files): the whole text must be one value (trailing
 * bytes other than whitespace are an error), an object key given twice keeps
 * its last value, and a string holding \u0000 is an error (C strings would
 * silently cut it there). Also the byte offsets of the top-level keys, for
 * messages that point at an entry. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_io.h"

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int64_t rt_json_scan(const char *t, size_t len, int64_t *keys, size_t nkeys, size_t *nfound)
{
	int64_t nul = -1;
	int depth = 0;
	char prev = 0; /* the last structural character outside strings */
	size_t found = 0;
	for (size_t i = 0; i < len; i++) {
		char c = t[i];
		if (c != '"') {
			if (c == '{' || c == '[')
				depth++;
			else if (c == '}' || c == ']')
				depth--;
			if (!is_space(c))
				prev = c;
			continue;
		}
		/* a string: a key of the top-level object when it follows { or , at depth 1 */
		if (depth == 1 && (prev == '{' || prev == ',')) {
			if (found < nkeys)
				keys[found] = (int64_t)i;
			found++;
		}
		size_t j = i + 1;
		for (; j < len && t[j] != '"'; j++)
			if (t[j] == '\\' && j + 1 < len) {
				if (t[j + 1] == 'u' && j + 5 < len && !memcmp(t + j + 2, "0000", 4) && nul < 0)
					nul = (int64_t)j;
				j++;
			}
		i = j;
		prev = '"';
	}
	if (nfound)
		*nfound = found;
	return nul;
}

typedef struct member {
	cJSON *item;
	size_t pos; /* place in the object */
} member;

static int member_cmp(const void *a, const void *b)
{
	const member *x = a, *y = b;
	int c = strcmp(x->item->string, y->item->string);
	return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* In every object of the tree, drop all but the last member of each key
 * (recursion depth is bounded by cJSON's nesting limit). */
static bool keep_last(cJSON *o)
{
	size_t n = 0;
	for (cJSON *c = o->child; c; c = c->next, n++)
		if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && !keep_last(c))
			return false;
	if (!cJSON_IsObject(o) || n < 2)
		return true;
	member *v = malloc(n * sizeof *v);
	if (!v)
		return false;
	size_t k = 0;
	for (cJSON *c = o->child; c; c = c->next, k++)
		v[k] = (member){c, k};
	qsort(v, n, sizeof *v, member_cmp);
	for (size_t i = 0; i + 1 < n; i++)
		if (!strcmp(v[i].item->string, v[i + 1].item->string))
			cJSON_Delete(cJSON_DetachItemViaPointer(o, v[i].item));
	free(v);
	return true;
}

const rt_json_caps rt_json_config_caps = {RT_JSON_CONFIG_MAX_BYTES, RT_JSON_CONFIG_MAX_COST, "config.json"};
const rt_json_caps rt_json_index_caps = {RT_JSON_INDEX_MAX_BYTES, RT_JSON_INDEX_MAX_COST, "sharded index"};

bool rt_json_check_caps(moe_ctx *ctx, const char *file, const char *text, size_t len, const rt_json_caps *caps,
	int64_t at, rt_json_shape *sh)
{
	if (len > caps->max_bytes) {
		rt_err_at(ctx, file, at, "JSON document of %zu bytes exceeds the limit of %zu bytes for a %s", len,
			caps->max_bytes, caps->kind);
		return false;
	}
	ctx_json_measure(text, len, sh);
	if (sh->cost > caps->max_cost) {
		rt_err_at(ctx, file, at, "JSON document holds %zu values and %zu strings: parsing it would take about %llu MiB, "
			"more than the %llu MiB moec allows a %s", sh->values, sh->strings,
			(unsigned long long)(sh->cost >> 20), (unsigned long long)(caps->max_cost >> 20), caps->kind);
		return false;
	}
	return true;
}

cJSON *rt_json_doc(moe_ctx *ctx, const char *file, const char *text, size_t len)
{
	return rt_json_doc_capped(ctx, file, text, len, &rt_json_config_caps);
}

cJSON *rt_json_doc_capped(moe_ctx *ctx, const char *file, const char *text, size_t len, const rt_json_caps *caps)
{
	rt_json_shape sh;
	if (!rt_json_check_caps(ctx, file, text, len, caps, -1, &sh))
		return NULL;
	int64_t nul = rt_json_scan(text, len, NULL, 0, NULL);
	if (nul >= 0) {
		rt_err_at(ctx, file, nul, "a JSON string holds \\u0000, which moec does not accept");
		return NULL;
	}
	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
	if (!root) {
		int64_t off = end && end >= text && end <= text + len ? end - text : -1;
		rt_err_at(ctx, file, off, "malformed JSON");
		return NULL;
	}
	for (const char *q = end; q && q < text + len; q++)
		if (!is_space(*q)) {
			rt_err_at(ctx, file, q - text, "unexpected bytes after the JSON document");
			cJSON_Delete(root);
			return NULL;
		}
	if (!keep_last(root)) {
		rt_err_at(ctx, file, -1, "out of memory");
		cJSON_Delete(root);
		return NULL;
	}
	return root;
}
