/* moec/io.h: files moec reads and writes.
 *
 * - atomic output: every file moec writes goes to PATH.tmp.XXXXXX in the same
 *   directory, is flushed and fsync'ed, then renamed over PATH; on any failure
 *   the temporary is removed, so a half-written output never exists;
 * - safetensors checkpoints (single files and sharded model.safetensors.index.json),
 *   validated entry by entry before any data is used;
 * - binding the weight nodes of a graph to checkpoint tensors;
 * - NumPy .npy arrays (read strictly, written atomically);
 * - importing a HuggingFace config.json as .moe text.
 *
 * Malformed input is reported as a diagnostic `FILE: error: message` (with the
 * byte offset in moe_loc.offset where one is known) and a non-zero status. */
#ifndef MOEC_IO_H
#define MOEC_IO_H

#include "moec/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- whole files ---- */

/* Read a whole file into a buffer the caller frees with moe_free. A NUL is
 * appended (not counted in *len) so text can be parsed in place. Only a
 * regular file is read: a FIFO, device or directory is refused when opened
 * (opened with O_NONBLOCK, so a FIFO never blocks), and so is a file larger
 * than MOE_READ_MAX_DEFAULT bytes. */
#define MOE_READ_MAX_DEFAULT ((size_t)1 << 30)
MOE_API moe_status moe_read_file(moe_ctx *ctx, const char *path, char **data, size_t *len);
/* The same with a size cap of max bytes (0: MOE_READ_MAX_DEFAULT). */
MOE_API moe_status moe_read_file_max(moe_ctx *ctx, const char *path, size_t max, char **data, size_t *len);
/* Read an open descriptor (e.g. stdin, which may be a pipe) to its end, at
 * most max bytes (0: MOE_READ_MAX_DEFAULT); `name` is used in diagnostics. */
MOE_API moe_status moe_read_stream(moe_ctx *ctx, const char *name, int fd, size_t max, char **data, size_t *len);

/* ---- output ----
 * A regular file (or a new one) is written to PATH.tmp.XXXXXX beside it (the
 * base name shortened to fit NAME_MAX), flushed, fsync'ed and renamed over it;
 * a symbolic link is first resolved, so the link stays and its target is
 * replaced. An existing FIFO or character device (/dev/null, /dev/stdout) is
 * written straight through and never replaced; with MOE_OUTPUT_BINARY a
 * terminal is refused. A directory, block device or socket is refused. */
typedef struct moe_atomic_file moe_atomic_file;
enum {
	MOE_OUTPUT_BINARY = 1u << 0, /* binary contents: refused on a terminal */
};
MOE_API moe_atomic_file *moe_output_open(moe_ctx *ctx, const char *path, unsigned flags);
/* moe_output_open with flags 0. NULL with a diagnostic. */
MOE_API moe_atomic_file *moe_atomic_open(moe_ctx *ctx, const char *path);
/* The stream to write to; valid until commit or abort. */
MOE_API FILE *moe_atomic_stream(moe_atomic_file *f);
/* Flush, fsync, close and rename onto PATH (then fsync the directory). Frees f.
 * On failure (including an earlier write error on the stream) the temporary is
 * removed and PATH is untouched. */
MOE_API moe_status moe_atomic_commit(moe_atomic_file *f);
/* Discard: close and remove the temporary; PATH is untouched. Frees f. NULL is a no-op. */
MOE_API void moe_atomic_abort(moe_atomic_file *f);
/* One-shot: write len bytes atomically to path. */
MOE_API moe_status moe_write_file_atomic(moe_ctx *ctx, const char *path, const void *data, size_t len);
MOE_API moe_status moe_write_output(moe_ctx *ctx, const char *path, unsigned flags, const void *data, size_t len);
/* An error for every output that is the same file as an input (same st_dev
 * and st_ino; regular files) or as an earlier output (the same file, or the
 * same not-yet-existing name); NULL entries are skipped. MOE_ERR_INVALID then. */
MOE_API moe_status moe_check_outputs(moe_ctx *ctx, const char *const *inputs, size_t nin, const char *const *outputs,
	size_t nout);
/* Outputs as a set, committed all or none (a command's several files).
 * add: a temporary beside path (symbolic links resolved; TARGET.set.XXXXXX,
 * the base name shortened to fit NAME_MAX), made now with the output mode,
 * whose name is returned for the writer to replace (path itself for an
 * existing FIFO or character device, written straight through); NULL with a
 * diagnostic (a directory or other non-regular file is refused). commit:
 * once every temporary has been replaced by a written regular file, renames
 * each onto its target in the order added (fsync'ing its directory);
 * MOE_ERR_IO with a diagnostic otherwise, the remaining temporaries removed.
 * abort: removes them all. Both free the set; abort(NULL) is a no-op. The
 * temporaries are listed for moe_cleanup_on_signals. */
typedef struct moe_output_set moe_output_set;
MOE_API moe_output_set *moe_output_set_new(moe_ctx *ctx);
MOE_API const char *moe_output_set_add(moe_output_set *s, const char *path);
MOE_API moe_status moe_output_set_commit(moe_output_set *s);
MOE_API void moe_output_set_abort(moe_output_set *s);
/* Temporaries (atomic outputs, the C engine's build directory) are listed in
 * a process-wide table while they exist. moe_cleanup_on_signals installs
 * handlers for SIGINT, SIGTERM and SIGHUP (not those ignored at the time)
 * that remove them and _exit(128 + signal); a program embedding the library
 * with its own handlers may call moe_remove_temporaries (async-signal-safe)
 * from them. */
MOE_API void moe_cleanup_on_signals(void);
MOE_API void moe_remove_temporaries(void);
/* Temporaries of the caller's in that table (up to 1280 at once): mkstemp
 * (mode 0600) and mkdtemp on tmpl (ending in XXXXXX, completed in place),
 * the name listed in *slot (-1 when the table is full: the file exists but
 * is not removed on a signal); moe_temp_track lists an existing path (a
 * slot or -1). moe_temp_forget(slot) unlists it once it is renamed or
 * removed (-1 is a no-op). The signals are blocked while a temporary is
 * made and listed, so no handler finds one made but not yet listed. */
MOE_API int moe_temp_file(char *tmpl, int *slot);
MOE_API char *moe_temp_dir(char *tmpl, int *slot);
MOE_API int moe_temp_track(const char *path);
MOE_API void moe_temp_forget(int slot);

/* ---- safetensors ---- */
typedef enum moe_st_dtype {
	MOE_ST_BOOL, MOE_ST_U8, MOE_ST_I8, MOE_ST_I16, MOE_ST_U16, MOE_ST_F16, MOE_ST_BF16,
	MOE_ST_I32, MOE_ST_U32, MOE_ST_F32, MOE_ST_I64, MOE_ST_U64, MOE_ST_F64,
	MOE_ST_F8_E4M3, MOE_ST_F8_E5M2, MOE_ST_F8_E8M0,
	MOE_ST_F4, /* E2M1, two elements per byte (the shape counts elements) */
	MOE_ST_DTYPE_COUNT
} moe_st_dtype;
MOE_API const char *moe_st_dtype_name(moe_st_dtype t); /* the header spelling, "F32" */
MOE_API size_t moe_st_dtype_size(moe_st_dtype t); /* bytes per element; 0 for F4 (half a byte) */

/* One validated entry. data points into the mapped file (nbytes long). */
typedef struct moe_st_tensor {
	const char *name;
	moe_st_dtype dtype;
	int rank;
	int64_t shape[MOE_MAX_RANK];
	int64_t numel;
	const void *data;
	size_t nbytes;
	int64_t offset; /* absolute byte offset of the data in the file */
} moe_st_tensor;

typedef struct moe_safetensors moe_safetensors;
/* Map and validate a .safetensors file: header length within the file and at
 * most 100 MB, JSON object of entries {dtype, shape, data_offsets} (plus an
 * optional __metadata__ object of strings), known dtypes, shapes of rank
 * <= MOE_MAX_RANK with non-negative dims and no overflow, byte size = dtype
 * size x numel, ranges inside the data section and not overlapping. NULL with
 * diagnostics on any error. */
MOE_API moe_safetensors *moe_safetensors_open(moe_ctx *ctx, const char *path);
/* The same on bytes in memory (not copied: they must outlive the result);
 * `name` is used in diagnostics. */
MOE_API moe_safetensors *moe_safetensors_open_mem(moe_ctx *ctx, const char *name, const void *data, size_t len);
MOE_API void moe_safetensors_close(moe_safetensors *st);
MOE_API size_t moe_safetensors_count(const moe_safetensors *st);
MOE_API const moe_st_tensor *moe_safetensors_at(const moe_safetensors *st, size_t i); /* file order */
MOE_API const moe_st_tensor *moe_safetensors_find(const moe_safetensors *st, const char *name);
MOE_API const char *moe_safetensors_path(const moe_safetensors *st);
/* The __metadata__ value for key, or NULL. */
MOE_API const char *moe_safetensors_metadata(const moe_safetensors *st, const char *key);

/* A checkpoint: several sources searched in order. A source is a .safetensors
 * file, a sharded index (*.index.json: {"weight_map": {name: shard}} with
 * shard paths relative to the index's directory; shards are opened when first
 * needed), or a directory holding model.safetensors.index.json or
 * model.safetensors. */
typedef struct moe_checkpoint moe_checkpoint;
MOE_API moe_checkpoint *moe_checkpoint_open(moe_ctx *ctx, const char *const *paths, size_t npaths);
/* What identifies the bytes of checkpoint files, for moe_host_opts.weights_id:
 * per file, a line of its real path, device, inode, size, modification time
 * (ns) and an FNV-1a-64 digest of its safetensors header. malloc'd (free
 * it), or NULL when a path is not a regular .safetensors file (a directory
 * or a sharded index, whose shards are not all named) or cannot be read. */
MOE_API char *moe_checkpoint_id(const char *const *paths, size_t npaths);
/* A checkpoint over n tensors in memory (a language binding's arrays, a
 * state dict): each entry gives name, dtype, rank, shape, data and nbytes
 * (numel and offset are filled in; offset is -1). Names are copied, data is
 * not: it must stay valid and unchanged until moe_checkpoint_close. name (may
 * be NULL: "<memory>") names the source in diagnostics. An entry whose byte
 * size is not its dtype's size times its element count, a bad dtype, rank or
 * dim, and a name given twice are errors (NULL). */
MOE_API moe_checkpoint *moe_checkpoint_open_tensors(moe_ctx *ctx, const char *name, const moe_st_tensor *entries,
	size_t n);
MOE_API void moe_checkpoint_close(moe_checkpoint *ck);
/* The first source's tensor of that name. NULL without a diagnostic when no
 * source has it; NULL with diagnostics when the shard holding it is bad. With
 * file non-NULL, *file is set to the path of the file holding it. */
MOE_API const moe_st_tensor *moe_checkpoint_find(moe_checkpoint *ck, const char *name, const char **file);

/* Bind every `weight` node of g: its `source` attribute names a tensor
 * (`{layer}` is replaced by the graph's `layer` dim, when it has one); a
 * source containing `{e}` is a per-expert template whose E = shape[0] tensors
 * (e = 0..E-1) are stacked. Stored shapes must equal the node shape (shape[1:]
 * for templates). Stored F32/BF16/F16 convert to an f32 or bf16 node (bf16 by
 * round-to-nearest-even), stored I32 to an i32 node. Tensors are stored in out
 * under the weight node's name. All weights are checked; every problem is a
 * diagnostic naming the tensor and file. */
MOE_API moe_status moe_weights_load(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t npaths,
	moe_tensor_map *out);
/* Flags of moe_weights_load_ex. */
enum {
	/* A weight none of whose tensors is in the checkpoint (for a per-expert
	 * template: none of its E) is bound as a tensor with its dtype and shape
	 * but data == NULL, and counted in *absent. Only a timing-only TCP run
	 * (moe_tcp_run_opts.timing_only) accepts such tensors; it stops with a
	 * run-time fault if it needs their values (routing does; the expert FFNs,
	 * whose arithmetic a timing-only run skips, do not). */
	MOE_WEIGHTS_ALLOW_ABSENT = 1u << 0,
	/* A per-expert ({e}) weight is checked (every expert's header) but bound
	 * without data (data == NULL), to be read a row at a time with
	 * moe_weights_load_row from the same checkpoint: a TCP run given that
	 * checkpoint (moe_tcp_run_opts.lazy_weights) reads only the experts it
	 * touches. */
	MOE_WEIGHTS_DEFER = 1u << 1,
};
/* moe_weights_load with flags; *absent (may be NULL) counts absent weights. */
MOE_API moe_status moe_weights_load_ex(moe_ctx *ctx, const moe_graph *g, const char *const *paths, size_t npaths,
	unsigned flags, moe_tensor_map *out, size_t *absent);
/* The same against an open checkpoint. */
MOE_API moe_status moe_weights_load_from(moe_ctx *ctx, const moe_graph *g, moe_checkpoint *ck, moe_tensor_map *out);
/* moe_weights_load_ex against an open checkpoint. */
MOE_API moe_status moe_weights_load_from_ex(moe_ctx *ctx, const moe_graph *g, moe_checkpoint *ck, unsigned flags,
	moe_tensor_map *out, size_t *absent);
/* Row `row` (expert `row`) of the per-expert ({e}) weight node id of g, read
 * from ck and converted to the node's dtype into dst (nbytes: one row's
 * bytes, checked). The tensor's shape and dtype are checked again: a
 * mismatch is a diagnostic and MOE_ERR_INVALID, nothing is trusted. */
MOE_API moe_status moe_weights_load_row(moe_ctx *ctx, const moe_graph *g, moe_id id, moe_checkpoint *ck, int64_t row,
	void *dst, size_t nbytes);

/* ---- NumPy .npy ----
 * Accepted: magic \x93NUMPY, version 1.0, 2.0 or 3.0, a header dict with exactly
 * the keys descr, fortran_order (must be False) and shape; descr one of
 * '<f4' (f32), '<f2' (IEEE half, converted on read), '<u2' (moec's spelling
 * for bf16 bit patterns; NumPy has no bf16), '<i4' (i32), '|b1' (bool); the
 * data must be exactly the rest of the file. */
/* Read into a new tensor of dtype `want`: floats convert among f32/bf16 (to
 * bf16 by round-to-nearest-even), i32 and bool read only as themselves. */
MOE_API moe_tensor *moe_npy_read(moe_ctx *ctx, const char *path, moe_dtype want);
MOE_API moe_tensor *moe_npy_parse(moe_ctx *ctx, const char *name, const void *data, size_t len, moe_dtype want);
/* Write atomically: f32 and bf16 tensors as '<f4' (bf16 widened exactly),
 * i32 as '<i4', bool as '|b1'. Version 1.0 header padded to 64 bytes. */
MOE_API moe_status moe_npy_write(moe_ctx *ctx, const char *path, const moe_tensor *t);

/* ---- HuggingFace import ---- */
typedef struct moe_import_opts {
	int layer;          /* decoder layer index (must be an MoE layer) */
	int64_t tokens;     /* T, the static token count; 0 = 16 */
	int64_t block;      /* B, the expert block size; 0 = 64 */
	moe_dtype dtype;    /* layer compute type: MOE_F32 or MOE_BF16 */
	const char *prefix; /* tensor name prefix; NULL = the family's, "model.layers.{layer}." */
	int config_dtype;   /* follow the config's torch_dtype / dtype (bfloat16 -> bf16, float32 and
	                     * float16 -> f32); dtype is used when the config names none */
	int ignore_quantization; /* write a quantized checkpoint's layer as if unquantized (its
	                           * shapes) instead of reading its quantization_config: block
	                           * fp8, fbgemm_fp8, compressed-tensors int4 / channel fp8 and
	                           * mxfp4 experts become packed weights read by dequant */
	int first_moe_layer; /* layer is ignored: import the config's first MoE layer, said in a note */
} moe_import_opts;
/* Read an HF config.json and write a .moe layer (docs/language.md) that
 * computes that family's MoE block exactly as HF does, with weights bound to
 * the checkpoint's tensor names. The families are listed by
 * moe_import_hf_families (docs/families.md); a text model nested under
 * text_config / language_config is found. *moe_text is NUL-terminated; free
 * with moe_free. */
MOE_API moe_status moe_import_hf(moe_ctx *ctx, const char *config_path, const moe_import_opts *opts,
	char **moe_text);
/* The same on config text already in memory; `name` is used in diagnostics. */
MOE_API moe_status moe_import_hf_text(moe_ctx *ctx, const char *name, const char *json, size_t len,
	const moe_import_opts *opts, char **moe_text);
/* The family table as text: MOE_HF_LIST_TEXT (moec import-hf --list), MOE_HF_LIST_MARKDOWN
 * (docs/families.md) or MOE_HF_LIST_NAMES (the model_types, comma-separated). Free with moe_free. */
typedef enum moe_hf_list_format { MOE_HF_LIST_TEXT, MOE_HF_LIST_MARKDOWN, MOE_HF_LIST_NAMES } moe_hf_list_format;
MOE_API moe_status moe_import_hf_families(moe_ctx *ctx, moe_hf_list_format format, char **text);

#ifdef __cplusplus
}
#endif
#endif
