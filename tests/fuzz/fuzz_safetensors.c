/* tests/fuzz/fuzz_safetensors.c: safetensors header and data.
 *
 * Input: a whole .safetensors file. It is opened from memory
 * (moe_safetensors_open_mem), every accepted entry is checked against the
 * promises of io.h and its bytes are touched (ASan sees any range outside
 * the input); then the same bytes, written to a private temporary file, are
 * opened as a checkpoint and bound to the weights of a small fixed layer
 * (moe_weights_load_from: lookup, {e} stacking, shape checks, conversion). */
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "moec/frontend.h"
#include "moec/io.h"
#include "tests/fuzz/fuzz_util.h"

/* Tensors: r [2,4] f32; u.0, u.1 [3,4]; d.0, d.1 [4,3]; bias [2] i32 stays unbound. */
static const char layer_src[] =
	"layer tiny {\n"
	"  dim T = 2, D = 4, F = 3, E = 2, K = 1, B = 2\n"
	"  dtype f32\n"
	"  input  x : [T, D]\n"
	"  weight router : [E, D]    = \"r\"\n"
	"  weight up     : [E, F, D] = \"u.{e}\"\n"
	"  weight down   : [E, D, F] = \"d.{e}\"\n"
	"  logits = einsum(\"td,ed->te\", x, router)\n"
	"  idx    = topk(logits, K)\n"
	"  w      = softmax(take_along(logits, idx, axis=1), axis=1)\n"
	"  y      = experts(x, idx, w, up=up, down=down, act=\"none\", block=B)\n"
	"  output y\n"
	"}\n";

static const moe_graph *tiny_graph(void)
{
	static moe_ctx *gctx;
	static moe_module *gm;
	if (!gm) {
		gctx = moe_ctx_new(NULL, NULL);
		gm = moe_parse_moe(gctx, "tiny.moe", layer_src, sizeof layer_src - 1, NULL);
		if (!gm) {
			moe_diag_print(gctx, stderr);
			FZ_FAIL("the fixed layer of the safetensors harness does not parse");
		}
	}
	return moe_module_graph(gm, 0);
}

static const char *scratch_path(void)
{
	static char path[128];
	if (!path[0]) {
		const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
		snprintf(path, sizeof path, "%s/moec-fuzz-st-%ld.safetensors", dir, (long)getpid());
	}
	return path;
}

static void check_open(const uint8_t *data, size_t size)
{
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	moe_safetensors *st = moe_safetensors_open_mem(ctx, "fuzz.safetensors", data, size);
	fz_check_result(ctx, 0, st != NULL, "moe_safetensors_open_mem");
	if (st) {
		volatile uint8_t sink = 0;
		size_t n = moe_safetensors_count(st);
		for (size_t i = 0; i < n; i++) {
			const moe_st_tensor *t = moe_safetensors_at(st, i);
			if (!t || !t->name)
				FZ_FAIL("entry %zu missing", i);
			if (t->rank < 0 || t->rank > MOE_MAX_RANK || (unsigned)t->dtype >= MOE_ST_DTYPE_COUNT)
				FZ_FAIL("entry %s: rank %d dtype %d", t->name, t->rank, (int)t->dtype);
			int64_t numel = 1;
			for (int k = 0; k < t->rank; k++) {
				if (t->shape[k] < 0)
					FZ_FAIL("entry %s: negative dim", t->name);
				numel *= t->shape[k];
			}
			if (numel != t->numel || (uint64_t)numel * moe_st_dtype_size(t->dtype) != t->nbytes)
				FZ_FAIL("entry %s: numel/nbytes disagree with shape", t->name);
			if (t->nbytes) {
				const uint8_t *p = t->data;
				if (p < data || p + t->nbytes > data + size || t->offset != p - data)
					FZ_FAIL("entry %s: data outside the input", t->name);
				sink ^= p[0] ^ p[t->nbytes - 1];
			}
			if (moe_safetensors_find(st, t->name) == NULL)
				FZ_FAIL("entry %s not found by name", t->name);
		}
		(void)moe_safetensors_metadata(st, "format");
		(void)sink;
		moe_safetensors_close(st);
	}
	fz_ctx_free(ctx, &h);
}

static void check_bind(const uint8_t *data, size_t size)
{
	const moe_graph *g = tiny_graph();
	const char *path = scratch_path();
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
		FZ_FAIL("cannot write %s", path);
	fz_heap h;
	moe_ctx *ctx = fz_ctx_new(&h);
	const char *paths[1] = {path};
	moe_checkpoint *ck = moe_checkpoint_open(ctx, paths, 1);
	if (ck) {
		moe_tensor_map *map = moe_tensor_map_new(ctx);
		int before = moe_error_count(ctx);
		moe_status s = moe_weights_load_from(ctx, g, ck, map);
		fz_check_result(ctx, before, s == MOE_OK, "moe_weights_load_from");
		moe_tensor_map_free(map);
		moe_checkpoint_close(ck);
	} else {
		fz_check_result(ctx, 0, 0, "moe_checkpoint_open");
	}
	fz_ctx_free(ctx, &h);
	unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_open(data, size);
	check_bind(data, size);
	return 0;
}
