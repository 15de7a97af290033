/* tests/unit/safetensors_fx.h: a safetensors checkpoint written from a
 * tensor map, for the unit tests (include after cmocka.h). */
#ifndef MOEC_SAFETENSORS_FX_H
#define MOEC_SAFETENSORS_FX_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "moec/runtime.h"

/* A safetensors file holding the tensors of b named in names (NULL-terminated). */
static inline void write_checkpoint(const char *path, const moe_tensor_map *b, const char *const *names)
{
	char hdr[4096] = "{";
	size_t off = 0;
	for (int i = 0; names[i]; i++) {
		const moe_tensor *t = moe_tensor_map_get(b, names[i]);
		char shape[128] = "";
		for (int k = 0; k < t->rank; k++)
			snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", k ? "," : "", (long long)t->shape[k]);
		snprintf(hdr + strlen(hdr), sizeof hdr - strlen(hdr), "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
			"\"data_offsets\":[%zu,%zu]}", i ? "," : "", names[i], t->dtype == MOE_BF16 ? "BF16" : "F32", shape, off,
			off + t->nbytes);
		off += t->nbytes;
	}
	strcat(hdr, "}");
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	uint64_t n = strlen(hdr);
	assert_int_equal(fwrite(&n, 8, 1, f), 1);
	assert_int_equal(fwrite(hdr, 1, n, f), n);
	for (int i = 0; names[i]; i++) {
		const moe_tensor *t = moe_tensor_map_get(b, names[i]);
		assert_int_equal(fwrite(t->data, 1, t->nbytes, f), t->nbytes);
	}
	fclose(f);
}

#endif
