/* backend-c/cgen.h: the loop-level kernel form shared by the C and LLVM emitters.
 *
 * cgen_lower turns a graph (without topk/experts) into one function body made
 * of loops, scalar assignments, stores, conditionals and fault returns over
 * typed flat buffers. Both emitters translate this form mechanically, node for
 * node, so the C and the LLVM code perform the same operations in the same
 * order and give bit-identical results (no reassociation, no contraction).
 *
 * Value types are i64 (indices), i32 (integers and bools as 0/1), f32 (float
 * values; bf16 memory is widened on load and stored from a value rounded by
 * CE_RBF16) and f64 (transcendental functions, which the reference evaluates
 * in double and rounds once, docs/ir.md). */
#ifndef MOEC_CGEN_H
#define MOEC_CGEN_H

#include "ir/ir.h"

typedef enum cg_ty { CT_I64, CT_I32, CT_F32, CT_F64 } cg_ty;

typedef enum cg_eop {
	CE_ICONST, /* i: value (I64 or I32) */
	CE_FCONST, /* d: value (F32 constants are exact floats) */
	CE_VAR,    /* var */
	CE_LOAD,   /* buf[a]; a is I64; result type from the buffer's dtype */
	/* binary, operands of the result type */
	CE_ADD, CE_SUB, CE_MUL,
	CE_FDIV,        /* f32 only */
	CE_SDIV,        /* i32: b != 0 guaranteed; INT_MIN / -1 wraps */
	CE_SREM,        /* i64 only, b > 0: index arithmetic */
	CE_AND, CE_OR, CE_XOR,
	CE_SHL, CE_LSHR, CE_ASHR, /* i32, count taken mod 32 */
	CE_MIN, CE_MAX, /* signed for ints; for f32 NaN if either is NaN */
	/* comparisons: result I32 0/1; operands of one type; f32: IEEE (NE is unordered) */
	CE_EQ, CE_NE, CE_LT, CE_LE, CE_GT, CE_GE,
	/* unary */
	CE_NEG, CE_ABS, CE_NOT, /* NOT: bitwise on i32 */
	CE_EXP, CE_LOG, CE_SQRT, CE_TANH, CE_ERF, /* libm on f32 (expf...) or f64 (exp...) */
	CE_SELECT, /* a (I32 cond) ? b : c */
	CE_CONV,   /* a to ty: i64<->i32 (trunc/sext), i32->f32/f64 (nearest even), f32<->f64,
	            * f32->i32 (trunc, NaN->0, saturating) */
	CE_BITS,   /* bit reinterpretation f32<->i32 */
	CE_RBF16,  /* f32 -> f32 rounded to bf16 precision, nearest even, NaN quieted */
	CE_ISNAN,  /* f32 -> I32 */
	CE_COUNT
} cg_eop;

typedef struct cg_expr cg_expr;
struct cg_expr {
	uint8_t op;
	uint8_t ty;
	int var, buf;
	int64_t i;
	double d;
	cg_expr *a, *b, *c;
};

typedef enum cg_sk { CS_FOR, CS_SET, CS_STORE, CS_IF, CS_FAULT, CS_DOT } cg_sk;

/* CS_DOT: a tile of DOT_LANES dot products sharing their rows of A, each
 * summed exactly like the generic loop (f32, from -0.0, k ascending, every
 * product rounded before it is added):
 *   for r < rows, j < DOT_LANES, jj = min(j, lanes - 1):
 *     dst[di + r*drow + j] = sum_{k < K} A[ai + r*astride + k] * W[wi + jj*wstride + k]
 * dst is an f32 buffer, A and W f32 or bf16 buffers (widened on load); lanes
 * >= 1. The LLVM emitter loads DOT_LANES rows of W, transposes them in
 * registers and vectorises across the lanes; the C emitter writes the loops.
 * That is the portable kernel. When A and W are both bf16 and the target has
 * AVX512-BF16 (and portable kernels were not asked for), the LLVM emitter
 * uses vdpbf16ps instead: the same exact products (a bf16 product is exact in
 * f32), added pairwise in another order, with bf16 denormal inputs and f32
 * denormal results flushed to zero; docs/abi.md bounds the difference. */
enum { DOT_LANES = 16 };
/* A CS_DOT statement computes a group of up to `group` such tiles side by
 * side (group 0 counts as 1): for u < group with lanes > u * DOT_LANES, tile u
 * is the tile above with lanes min(lanes - u * DOT_LANES, DOT_LANES), W rows
 * from wi + u * DOT_LANES * wstride and dst from di + u * dstep; rows of dst
 * are drow elements apart (0 counts as DOT_LANES) instead of DOT_LANES. Each
 * element is summed exactly as in its own tile; the group lets the vdpbf16ps
 * kernel reuse each broadcast pair of A across the group's columns. */
enum { DOT_GROUP = 4 };
typedef struct cg_dot {
	int abuf, wbuf, dbuf;
	struct cg_expr *rows, *lanes, *ai, *wi, *di; /* I64 */
	int64_t K, astride, wstride;
	int64_t group, dstep, drow;
} cg_dot;

typedef struct cg_stmt cg_stmt;
typedef struct cg_block {
	cg_stmt *first, *last;
} cg_block;

struct cg_stmt {
	uint8_t kind;
	cg_stmt *next;
	int var;         /* FOR: loop variable (I64); SET: target */
	int buf;         /* STORE */
	int code;        /* FAULT: value returned */
	cg_expr *a, *b;  /* FOR: lo, hi (hi is re-evaluated each iteration and must not depend on
	                  * variables set in the body); SET: value; STORE: index, value; IF: cond (I32) */
	cg_block body;   /* FOR body; IF then */
	cg_block els;    /* IF else */
	bool par;        /* FOR: a parallel loop. Its iterations are independent: they write
	                  * disjoint elements, read nothing another iteration writes, set only
	                  * variables that each iteration sets before reading, and never fault.
	                  * The LLVM emitter outlines the body and runs it over the thread pool;
	                  * the C emitter writes an ordinary loop. Either way every element is
	                  * computed by the same operations, so results do not depend on threads. */
	const char *comment; /* printed above the statement in C */
	cg_dot *dot;         /* DOT */
};

/* Where a buffer lives. */
typedef enum cg_bk { CB_INPUT, CB_WEIGHT, CB_OUTPUT, CB_WORK } cg_bk;

typedef struct cg_buf {
	uint8_t kind;
	uint8_t dtype; /* moe_dtype: F32, BF16, I32, BOOL */
	uint32_t index;  /* input/weight/output number */
	int64_t numel;
	int64_t offset;  /* CB_WORK: byte offset in the workspace */
	moe_id node;     /* the node it holds, MOE_NONE for scratch */
	bool writable;
	bool table;      /* CB_WORK: a lookup table of an elementwise op (lower.c, "Tables"): written
	                  * by its fill loop, then only read; never shares workspace with another
	                  * buffer, so the LLVM emitter tells LLVM that its loads do not alias any
	                  * access to another buffer (the lookup loop is then vectorised) */
} cg_buf;

typedef struct cg_var {
	uint8_t ty;
} cg_var;

/* One vector valid mask of a block einsum, for block statistics. */
typedef struct cg_mask {
	int buf;
	int64_t len, rows; /* mask length G; rows per block (the masked dimension) */
} cg_mask;

/* Fault codes returned by the layer function (docs/abi.md). */
enum { CG_FAULT_INDEX = 1, CG_FAULT_DIV0 = 2 };

typedef struct cg_prog {
	moe_ctx *ctx;
	ir_arena arena;
	const moe_graph *g;
	char cname[128];     /* sanitized layer name used in symbols */
	cg_buf *bufs;
	uint32_t nbufs, bufcap;
	cg_var *vars;
	uint32_t nvars, varcap;
	int *node_buf;       /* node id -> buffer id, -1 for none */
	moe_id *inputs, *weights; /* node ids in ABI order */
	uint32_t ninputs, nweights, noutputs;
	cg_mask *masks;
	uint32_t nmasks;
	int64_t workspace;   /* bytes */
	cg_block body;
} cg_prog;

/* Lower g. Returns NULL with diagnostics on unsupported input. */
cg_prog *cgen_lower(moe_ctx *ctx, const moe_graph *g);
void cgen_free(cg_prog *p);

/* The C emitter (emit_c.c). */
moe_status cgen_emit_c(cg_prog *p, FILE *out);

/* Names of the emitted symbols: "moe_" + cname (+ suffix). */
void cgen_symbol(const cg_prog *p, const char *suffix, char *buf, size_t len);

/* The layer function of docs/abi.md. */
typedef int (*cgen_layer_fn)(const void *const *inputs, const void *const *weights, void *const *outputs,
	void *workspace);

/* Parallel loops (cg_stmt.par) in LLVM code: the layer function moe_L_par
 * takes a cgen_par as fifth argument and calls run(pool, body, env, lo, hi)
 * for each parallel loop; run must call body(env, a, b) over disjoint ranges
 * covering [lo, hi) and return when all have returned. moe_L is moe_L_par
 * with par == NULL (bodies called directly, in order). */
typedef void (*cgen_par_body)(void *env, int64_t lo, int64_t hi);
typedef struct cgen_par {
	void (*run)(void *pool, cgen_par_body body, void *env, int64_t lo, int64_t hi);
	void *pool;
} cgen_par;
typedef int (*cgen_layer_par_fn)(const void *const *inputs, const void *const *weights, void *const *outputs,
	void *workspace, const cgen_par *par);

/* The thread pool (pool.c): nthreads - 1 workers plus the calling thread.
 * NULL with a diagnostic when threads cannot be started. */
typedef struct cgen_pool cgen_pool;
cgen_pool *cgen_pool_create(moe_ctx *ctx, int nthreads);
void cgen_pool_free(cgen_pool *pool);
/* cgen_par.run for a cgen_pool: chunks of iterations, handed out dynamically. */
void cgen_pool_run(void *pool, cgen_par_body body, void *env, int64_t lo, int64_t hi);
/* Cores this process may run on (sched_getaffinity), at least 1. */
int cgen_cores(void);

/* The LLVM emitter (emit_llvm.c). kind: 0 textual IR, 1 object file. */
moe_status cgen_emit_llvm_file(cg_prog *p, const char *path, int kind);
/* ORC LLJIT: compiles p in process and returns its layer function. */
typedef struct cgen_jit cgen_jit;
typedef struct cgen_jit_opts {
	int portable;          /* in: no CPU-specific dot-product kernels */
	int no_cache;          /* in: bypass the on-disk cache */
	const char *cache_dir; /* in: NULL for the default */
	int cache;             /* out: moe_host_cache */
	const char *kernels;   /* out: "portable" or "avx512bf16" */
	const int *wpack;      /* in: NULL, or per buffer the slot of its packed copy (cgen_pack_plan), -1 for
	                        * none; slot s is weights[nweights + s] of the layer function. Only the
	                        * vdpbf16ps kernels read packed copies: when o->kernels is "portable", none
	                        * is read and none need be passed */
} cgen_jit_opts;
moe_status cgen_jit_create(cg_prog *p, cgen_jit_opts *o, cgen_jit **jit, cgen_layer_par_fn *fn);
void cgen_jit_free(cgen_jit *jit);

/* Packed bf16 weights (pack.c). cgen_pack_plan: per buffer of p, the slot of
 * its packed copy or -1 (slot), and the row length K it is packed with
 * (rowlen); returns the number of slots. A weight buffer is packed when every
 * CS_DOT reading it as W is bf16 x bf16 with whole rows (wstride == K), K a
 * multiple of 2 * DOT_LANES and numel a multiple of DOT_LANES * K.
 * cgen_pack_tiles packs tiles [t0, t1) of DOT_LANES rows of src into dst (the
 * layout is described in pack.c); dst must be 64-byte aligned (the tiles load
 * it with aligned loads). */
int cgen_pack_plan(const cg_prog *p, int *slot, int64_t *rowlen);
void cgen_pack_tiles(const uint16_t *src, uint16_t *dst, int64_t K, int64_t t0, int64_t t1);

/* SHA-256 and HMAC-SHA256 (sha256.c). */
#define CGEN_SHA256_LEN 32
typedef struct cgen_sha256 {
	uint32_t h[8];
	uint64_t bytes;
	unsigned char buf[64];
	size_t nbuf;
} cgen_sha256;
void cgen_sha256_init(cgen_sha256 *s);
void cgen_sha256_update(cgen_sha256 *s, const void *data, size_t n);
void cgen_sha256_final(cgen_sha256 *s, unsigned char out[CGEN_SHA256_LEN]);
typedef struct cgen_hmac {
	cgen_sha256 inner;
	unsigned char opad[64];
} cgen_hmac;
void cgen_hmac_init(cgen_hmac *h, const void *key, size_t klen);
void cgen_hmac_update(cgen_hmac *h, const void *data, size_t n);
void cgen_hmac_final(cgen_hmac *h, unsigned char out[CGEN_SHA256_LEN]);

/* The JIT cache (jit_cache.c; the rules are in docs/abi.md, "The JIT cache"). */
#define CGEN_CACHE_SECRET 32                       /* bytes of the per-user key */
#define CGEN_CACHE_MAX_OBJECT ((uint64_t)256 << 20) /* the largest object an entry holds */
typedef struct cgen_cache {
	int dir;                                    /* the cache root, open (O_DIRECTORY) */
	char root[4096];                            /* its path */
	char name[48];                              /* the entry's file name in the root */
	unsigned char secret[CGEN_CACHE_SECRET];    /* the HMAC key (the root's "key" file) */
	const char *key;                            /* the key text (not owned) */
	size_t keylen;
} cgen_cache;
/* Opens the cache root dir (NULL: $XDG_CACHE_HOME/moec, else
 * $HOME/.cache/moec), creating it (and for the default the XDG directory
 * above it) with mode 0700 when missing but nothing above that; checks that
 * the root is a directory owned by the effective user and not writable by
 * group or others, and reads (or creates) its key. false when there is no
 * usable cache: a root or key that fails a check is a one-line warning on
 * ctx; a missing parent is silent. Close with cgen_cache_close. */
bool cgen_cache_open(moe_ctx *ctx, cgen_cache *c, const char *dir, const char *key, size_t keylen);
void cgen_cache_close(cgen_cache *c);
/* 1: *obj (malloc'd) and *len hold the verified object; 0: no entry; -1: an
 * entry that failed a check (not a regular file of the user, too long, wrong
 * key text or length, HMAC mismatch): never loaded, to be rewritten. */
int cgen_cache_load(const cgen_cache *c, void **obj, size_t *len);
/* Writes the entry through a temporary file (O_EXCL, mode 0600) and a rename;
 * false on failure (the cache is an optimisation: callers go on without it). */
bool cgen_cache_store(const cgen_cache *c, const void *obj, size_t len);
/* The entry's header and MAC, for tests that forge entries: HMAC-SHA256 under
 * secret over magic, key length, object length (u64 little-endian), key text
 * and object. */
#define CGEN_CACHE_HDR (8 + 8 + 8 + CGEN_SHA256_LEN)
void cgen_cache_mac(const unsigned char *secret, const char *key, size_t keylen, const void *obj, size_t len,
	unsigned char hdr[CGEN_CACHE_HDR]);

/* The packed-weight cache (jit_cache.c, "packed weights"), in a root opened
 * with cgen_cache_open. cgen_pack_map: 1 when *e maps the verified entry of
 * key holding len bytes (cgen_pack_unmap), 0 without an entry, -1 for an
 * entry that failed a check (*why says which; nothing mapped). cgen_pack_store
 * writes an entry through a temporary and a rename; false on failure. */
typedef struct cgen_pack_entry {
	void *map;         /* the entry's mapping (NULL: none) */
	size_t maplen;
	const void *data;  /* the packed weight in it, 64-byte aligned */
} cgen_pack_entry;
int cgen_pack_map(const cgen_cache *c, const char *key, size_t keylen, size_t len, cgen_pack_entry *e, const char **why);
void cgen_pack_unmap(cgen_pack_entry *e);
bool cgen_pack_store(const cgen_cache *c, const char *key, size_t keylen, const void *data, size_t len);

/* Write to path through a temporary file and a rename. write() fills f. */
moe_status cgen_write_atomic(moe_ctx *ctx, const char *path, moe_status (*write)(void *ud, FILE *f), void *ud);

#endif
