/* support/json_measure.c: what parsing a JSON text would cost, counted in one
 * pass over the text without allocating (support.h, ctx_json_measure). Every
 * reader of JSON (config.json, safetensors headers, JSON IR) checks it against
 * its cap before cJSON builds a tree. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "support/support.h"

static bool json_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

#define SHAPE_STACK 1024 /* deeper than cJSON's nesting limit: classification stops there */

void ctx_json_measure(const char *t, size_t len, ctx_json_shape *sh)
{
	static const uint64_t one = 1;
	unsigned char obj[SHAPE_STACK / 8] = {0}; /* per level: an object (1) or an array */
	size_t items[SHAPE_STACK];                /* elements so far of the array at each level */
	int depth = 0;
	char prev = 0; /* the last structural character outside strings, 'v' after a scalar */
	*sh = (ctx_json_shape){0};
	for (size_t i = 0; i < len; i++) {
		char c = t[i];
		bool in_obj = depth > 0 && depth <= SHAPE_STACK && (obj[(depth - 1) / 8] >> ((depth - 1) % 8) & 1);
		if (json_space(c))
			continue;
		if (c == '"') {
			bool key = in_obj && (prev == '{' || prev == ',');
			sh->strings++;
			if (!key)
				sh->values++;
			if (!key && depth > 0 && depth <= SHAPE_STACK && !in_obj)
				items[depth - 1]++;
			size_t j = i + 1;
			for (; j < len && t[j] != '"'; j++)
				j += t[j] == '\\';
			i = j;
			prev = key ? 'k' : 'v';
			continue;
		}
		if (c == '{' || c == '[') {
			sh->values++;
			if (depth > 0 && depth <= SHAPE_STACK && !in_obj)
				items[depth - 1]++;
			depth++;
			if (depth > sh->depth)
				sh->depth = depth;
			if (depth <= SHAPE_STACK) {
				unsigned char bit = (unsigned char)(one << ((depth - 1) % 8));
				obj[(depth - 1) / 8] = (unsigned char)(c == '{' ? obj[(depth - 1) / 8] | bit : obj[(depth - 1) / 8] & ~bit);
				items[depth - 1] = 0;
			}
			prev = c;
		} else if (c == '}' || c == ']') {
			if (c == ']' && depth > 0 && depth <= SHAPE_STACK && items[depth - 1] > sh->max_array)
				sh->max_array = items[depth - 1];
			depth -= depth > 0;
			prev = 'v';
		} else if (c == ',' || c == ':') {
			prev = c;
		} else if (prev != 'v') { /* the first byte of a number, true, false or null */
			sh->values++;
			if (depth > 0 && depth <= SHAPE_STACK && !in_obj)
				items[depth - 1]++;
			prev = 'v';
		}
	}
	sh->cost = (uint64_t)sh->values * CTX_JSON_NODE_BYTES + (uint64_t)sh->strings * CTX_JSON_STRING_BYTES + len;
}

