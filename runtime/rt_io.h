/* runtime/rt_io.h: helpers shared by the file readers and writers of runtime/
 * (element conversions, a growable text buffer, located diagnostics). */
#ifndef MOEC_RT_IO_H
#define MOEC_RT_IO_H

#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/types.h>

#include "ir/ir.h"
#include "moec/io.h"

/* f32 -> bf16 bits, round to nearest even; NaN stays NaN (quieted). */
static inline uint16_t rt_f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static inline float rt_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* IEEE binary16 -> f32, exact (subnormals, infinities, NaN payloads kept). */
static inline float rt_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
	if (exp == 0x1f) {
		u = sign | 0x7f800000u | (man << 13);
	} else if (exp) {
		u = sign | ((exp + 112u) << 23) | (man << 13);
	} else if (man) {
		int e = 113; /* 127 - 15 + 1: subnormal, normalise */
		while (!(man & 0x400u)) {
			man <<= 1;
			e--;
		}
		u = sign | ((uint32_t)e << 23) | ((man & 0x3ffu) << 13);
	} else {
		u = sign;
	}
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint16_t rt_ld16(const unsigned char *p)
{
	return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static inline uint32_t rt_ld32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rt_ld64(const unsigned char *p)
{
	return (uint64_t)rt_ld32(p) | (uint64_t)rt_ld32(p + 4) << 32;
}

/* Growable NUL-terminated text, malloc'ed (freed with free / moe_free). */
/* A growable string: malloc'd, or with ctx set context blocks (a refusal
 * unwinds inside a guarded call, else sets oom). */
typedef struct rt_buf {
	char *s;
	size_t len, cap;
	bool oom;
	moe_ctx *ctx;
} rt_buf;
void rt_buf_printf(rt_buf *b, const char *fmt, ...) MOE_PRINTF(2, 3);
void rt_buf_free(rt_buf *b);

/* An error at a byte offset of a file: support/support.h ctx_err_at. */
#define rt_err_at ctx_err_at

/* The mode of every file moec writes: 0644 less the process's umask. */
mode_t rt_output_mode(void);

/* A read-only mapping of a whole file (or an empty one). */
typedef struct rt_map {
	const unsigned char *data;
	size_t len;
	bool mapped;
} rt_map;
moe_status rt_map_file(moe_ctx *ctx, const char *path, rt_map *m);
void rt_unmap(rt_map *m);

/* Installs handler for SIGINT, SIGTERM and SIGHUP, each blocked while it
 * runs; a signal the parent left ignored (nohup) stays ignored. */
void rt_signals_install(void (*handler)(int));
/* on: blocks those three signals in the calling thread, the previous mask in
 * *old; off: restores *old. Around creating and registering a temporary, so
 * that no signal finds one created but not yet registered. */
void rt_block_signals(bool on, sigset_t *old);
/* fsync the directory holding path so that a rename into it is durable;
 * best effort, allocates nothing (a commit cannot fail after its rename). */
void rt_sync_dir(const char *path);

/* JSON documents (runtime/jsondoc.c), read as Python's json reads them:
 * one value and nothing after it but whitespace, the last of duplicate keys
 * kept, and \u0000 in a string rejected. NULL with a located diagnostic.
 * Free with cJSON_Delete. */
struct cJSON;
struct cJSON *rt_json_doc(moe_ctx *ctx, const char *file, const char *text, size_t len);

/* What parsing a JSON text would build: ctx_json_measure (support.h). */
typedef ctx_json_shape rt_json_shape;

/* Caps of a kind of JSON document: its size, and the estimated cost of
 * parsing it (rt_json_shape.cost). Both are checked before cJSON runs. */
typedef struct rt_json_caps {
	size_t max_bytes;
	uint64_t max_cost;
	const char *kind; /* for messages: "config.json" */
} rt_json_caps;
/* config.json (and the quantization_config inside it) */
#define RT_JSON_CONFIG_MAX_BYTES ((size_t)8 << 20)
#define RT_JSON_CONFIG_MAX_COST ((uint64_t)256 << 20)
/* model.safetensors.index.json (a weight_map entry per tensor) */
#define RT_JSON_INDEX_MAX_BYTES ((size_t)64 << 20)
#define RT_JSON_INDEX_MAX_COST ((uint64_t)512 << 20)
extern const rt_json_caps rt_json_config_caps, rt_json_index_caps;
/* rt_json_doc under caps (rt_json_doc itself uses rt_json_config_caps). */
struct cJSON *rt_json_doc_capped(moe_ctx *ctx, const char *file, const char *text, size_t len,
	const rt_json_caps *caps);
/* false with a located diagnostic when text exceeds caps. */
bool rt_json_check_caps(moe_ctx *ctx, const char *file, const char *text, size_t len, const rt_json_caps *caps,
	int64_t at, rt_json_shape *sh);
/* One pass over JSON text: returns the offset of the first \u0000 escape
 * inside a string (-1: none); fills keys[0..nkeys) with the offsets of the
 * top-level object's keys in order and *nfound with their count. */
int64_t rt_json_scan(const char *text, size_t len, int64_t *keys, size_t nkeys, size_t *nfound);

/* The string table lives in support/ (ctx_strtab); these names stay for runtime/. */
typedef ctx_strtab rt_strtab;
#define rt_strtab_init ctx_strtab_init
#define rt_strtab_put ctx_strtab_put
#define rt_strtab_get ctx_strtab_get
#define rt_strtab_free ctx_strtab_free

/* Copy of s in context memory; free with rt_strfree. */
char *rt_strdup(moe_ctx *ctx, const char *s);
void rt_strfree(moe_ctx *ctx, char *s);

/* Move every entry of from into m, taking every block first (runtime/tensor.c). */
void rt_tensor_map_move(moe_tensor_map *m, moe_tensor_map *from);
/* ctx_defer clean-up of a checkpoint used inside a guarded call (a throw frees
 * the blocks born in the call): with all, unmap every file (ck is the call's
 * own); else unmap and forget the shards opened since rt_checkpoint_mark. */
typedef struct rt_ck_mark {
	moe_checkpoint *ck;
	bool all;
	uint32_t nopen;
} rt_ck_mark;
void rt_checkpoint_mark(moe_checkpoint *ck, bool all, rt_ck_mark *m);
void rt_checkpoint_unwind(void *mark);
/* The paths a checkpoint was opened from, for messages. */
size_t rt_checkpoint_nsources(const moe_checkpoint *ck);
const char *rt_checkpoint_source(const moe_checkpoint *ck, size_t i);
/* Calls fn with every tensor name the checkpoint's headers and indexes list
 * (no shard is opened). */
void rt_checkpoint_names(const moe_checkpoint *ck, void (*fn)(void *arg, const char *name), void *arg);

/* Convert n elements of a stored float format to f32 or bf16 (little-endian source). */
typedef enum rt_src { RT_SRC_F32, RT_SRC_BF16, RT_SRC_F16 } rt_src;
void rt_convert_float(void *dst, moe_dtype to, const unsigned char *src, rt_src from, size_t n);

#endif
