"""ctypes declarations of the libmoec entry points the package uses, and the
library lookup.

The shared library is searched in this order (the first that loads wins):
  1. $MOEC_LIBRARY, the path of a libmoec.so (an error if it does not load);
  2. the build tree: <repository>/build/libmoec.so, when this package runs from
     the source tree's python/ folder (PYTHONPATH=python);
  3. the install prefix recorded by `cmake --install` in moec/_install.py;
  4. the system loader (ctypes.util.find_library("moec"), LD_LIBRARY_PATH).
"""
import ctypes
import ctypes.util
import os

MAX_RANK = 8

# enum moe_status
OK, ERR_INVALID, ERR_IO, ERR_FORMAT, ERR_UNSUPPORTED, ERR_NOMEM, ERR_RUNTIME, ERR_INTERNAL = range(8)
# enum moe_dtype
F32, BF16, I32, BOOL, F8E4M3, I8, U8 = range(7)
DTYPE_NAMES = {F32: "f32", BF16: "bf16", I32: "i32", BOOL: "bool", F8E4M3: "f8e4m3", I8: "i8", U8: "u8"}
# enum moe_st_dtype
(ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32, ST_I64, ST_U64, ST_F64,
 ST_F8_E4M3, ST_F8_E5M2, ST_F8_E8M0, ST_F4) = range(17)
# enum moe_op: only the leaves the package looks at (rows of include/moec/ops.def, in order)
TOKENS_INPUT = b"n_tokens"

c_int64_p = ctypes.POINTER(ctypes.c_int64)
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class Loc(ctypes.Structure):
    _fields_ = [("file", ctypes.c_char_p), ("line", ctypes.c_int), ("col", ctypes.c_int), ("offset", ctypes.c_int64)]


class Tensor(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("rank", ctypes.c_int), ("shape", ctypes.c_int64 * MAX_RANK),
                ("data", ctypes.c_void_p), ("nbytes", ctypes.c_size_t), ("owned", ctypes.c_int)]


class StTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_RANK), ("numel", ctypes.c_int64), ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_size_t), ("offset", ctypes.c_int64)]


class Setting(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class Settings(ctypes.Structure):
    _fields_ = [("items", ctypes.POINTER(Setting)), ("count", ctypes.c_size_t)]


class ImportOpts(ctypes.Structure):
    _fields_ = [("layer", ctypes.c_int), ("tokens", ctypes.c_int64), ("block", ctypes.c_int64),
                ("dtype", ctypes.c_int), ("prefix", ctypes.c_char_p), ("config_dtype", ctypes.c_int),
                ("ignore_quantization", ctypes.c_int)]


class RunOpts(ctypes.Structure):
    _fields_ = [("verify", ctypes.c_int), ("print_before", ctypes.c_char_p), ("print_after", ctypes.c_char_p),
                ("print_to", ctypes.c_void_p), ("reproducer", ctypes.c_char_p)]


class HostOpts(ctypes.Structure):
    _fields_ = [("engine", ctypes.c_int), ("repeat", ctypes.c_int), ("threads", ctypes.c_int),
                ("portable", ctypes.c_int), ("no_cache", ctypes.c_int), ("cache_dir", ctypes.c_char_p),
                ("cold", ctypes.c_int), ("weights_id", ctypes.c_char_p)]


class HostMemory(ctypes.Structure):
    _fields_ = [("weight_bytes", ctypes.c_size_t), ("io_bytes", ctypes.c_size_t),
                ("workspace_bytes", ctypes.c_size_t), ("packable_bytes", ctypes.c_size_t),
                ("packed_bytes", ctypes.c_size_t), ("peak_bytes", ctypes.c_size_t)]


class HostStats(ctypes.Structure):
    _fields_ = [("compute_seconds", ctypes.c_double), ("compile_seconds", ctypes.c_double),
                ("pack_seconds", ctypes.c_double), ("repeat", ctypes.c_int), ("workspace_bytes", ctypes.c_size_t),
                ("blocks_executed", ctypes.c_int64), ("blocks_skipped", ctypes.c_int64),
                ("rows_executed", ctypes.c_int64), ("grid_blocks_max", ctypes.c_int64), ("threads", ctypes.c_int),
                ("cache", ctypes.c_int), ("kernels", ctypes.c_char_p), ("setup_seconds", ctypes.c_double),
                ("pack_cache", ctypes.c_int)]


TCP_NENGINES = 6


class TcpStats(ctypes.Structure):
    _fields_ = [("simulated_seconds", ctypes.c_double), ("roofline_seconds", ctypes.c_double),
                ("roofline_ratio", ctypes.c_double), ("cycles", ctypes.c_int64),
                ("busy_cycles", ctypes.c_int64 * TCP_NENGINES), ("hbm_read_bytes", ctypes.c_int64),
                ("hbm_write_bytes", ctypes.c_int64), ("blocks_executed", ctypes.c_int64),
                ("blocks_skipped", ctypes.c_int64), ("blocks_max", ctypes.c_int64), ("commands", ctypes.c_int64),
                ("instructions", ctypes.c_int64), ("experts_hit", ctypes.c_int64), ("flops", ctypes.c_double),
                ("expert_seconds", ctypes.c_double), ("routing_seconds", ctypes.c_double),
                ("routing_busy_cycles", ctypes.c_int64 * TCP_NENGINES), ("timing_only", ctypes.c_int),
                ("expert_start_seconds", ctypes.c_double)]


class TcpRunOpts(ctypes.Structure):
    _fields_ = [("machine", ctypes.c_void_p), ("no_skip", ctypes.c_int), ("trace_path", ctypes.c_char_p),
                ("timing_only", ctypes.c_int), ("progress", ctypes.c_void_p), ("progress_ud", ctypes.c_void_p),
                ("lazy_weights", ctypes.c_void_p), ("observed", ctypes.c_void_p),
                ("sched_opts", ctypes.c_char_p)]


P = ctypes.c_void_p
S = ctypes.c_char_p
I = ctypes.c_int
Z = ctypes.c_size_t
u32 = ctypes.c_uint32
i64 = ctypes.c_int64
TP = ctypes.POINTER(Tensor)

# name: (restype, argtypes)
_PROTOS = {
    "moe_version_string": (S, []),
    "moe_status_string": (S, [I]),
    "moe_ctx_new": (P, [ALLOC_FN, P]),
    "moe_ctx_free": (None, [P]),
    "moe_error_count": (I, [P]),
    "moe_diag_count": (Z, [P]),
    "moe_diag_get": (None, [P, Z, ctypes.POINTER(I), P, ctypes.POINTER(S)]),
    "moe_diag_string": (P, [P]),
    "moe_diag_clear": (None, [P]),
    "moe_free": (None, [P, P]),
    "moe_ctx_add_source": (None, [P, S, S, Z]),
    "moe_parse_moe": (P, [P, S, S, Z, ctypes.POINTER(Settings)]),
    "moe_module_free": (None, [P]),
    "moe_module_num_graphs": (Z, [P]),
    "moe_module_graph": (P, [P, Z]),
    "moe_module_verify": (I, [P, P]),
    "moe_module_print": (None, [P, P]),
    "moe_module_print_dot": (None, [P, P]),
    "moe_module_to_json": (P, [P]),
    "moe_module_stats_json": (P, [P, P, S]),
    "moe_graph_name": (S, [P]),
    "moe_graph_num_nodes": (u32, [P]),
    "moe_graph_num_outputs": (u32, [P]),
    "moe_graph_output": (u32, [P, u32]),
    "moe_graph_get_dim": (I, [P, S, c_int64_p]),
    "moe_graph_dtype": (I, [P]),
    "moe_node_op": (I, [P, u32]),
    "moe_node_name": (S, [P, u32]),
    "moe_node_dtype": (I, [P, u32]),
    "moe_node_rank": (I, [P, u32]),
    "moe_node_shape": (c_int64_p, [P, u32]),
    "moe_node_get_str": (S, [P, u32, S]),
    "moe_node_new": (u32, [P, I, P, u32, Loc]),
    "moe_loc_none": (Loc, []),
    "moe_node_set_type": (None, [P, u32, I, c_int64_p, I]),
    "moe_node_set_name": (None, [P, u32, S]),
    "moe_node_set_str": (None, [P, u32, S, S]),
    "moe_op_from_name": (I, [S]),
    "moe_pipeline_named": (S, [S]),
    "moe_run_pipeline_text": (I, [P, S, P, ctypes.POINTER(RunOpts)]),
    "moe_tensor_new": (TP, [P, I, I, c_int64_p]),
    "moe_tensor_new_shape": (TP, [P, I, I, c_int64_p]),
    "moe_tensor_free": (None, [P, TP]),
    "moe_tensor_map_new": (P, [P]),
    "moe_tensor_map_free": (None, [P]),
    "moe_tensor_map_set": (I, [P, S, TP]),
    "moe_tensor_map_get": (TP, [P, S]),
    "moe_weights_load": (I, [P, P, ctypes.POINTER(S), Z, P]),
    "moe_weights_load_from": (I, [P, P, P, P]),
    "moe_checkpoint_open_tensors": (P, [P, S, ctypes.POINTER(StTensor), Z]),
    "moe_checkpoint_close": (None, [P]),
    "moe_import_hf": (I, [P, S, ctypes.POINTER(ImportOpts), ctypes.POINTER(P)]),
    "moe_import_hf_text": (I, [P, S, S, Z, ctypes.POINTER(ImportOpts), ctypes.POINTER(P)]),
    "moe_emit_c_file": (I, [P, P, S]),
    "moe_emit_llvm_ir": (I, [P, P, S]),
    "moe_emit_object": (I, [P, P, S]),
    "moe_interp_run": (I, [P, P, P, ctypes.POINTER(TP)]),
    "moe_host_opts_init": (None, [ctypes.POINTER(HostOpts)]),
    "moe_host_memory_plan": (I, [P, P, P, ctypes.POINTER(HostMemory)]),
    "moe_host_run_opts": (I, [P, P, P, ctypes.POINTER(HostOpts), ctypes.POINTER(TP), ctypes.POINTER(HostStats)]),
    "moe_tcp_register_passes": (I, [P]),
    "moe_tcp_set_pass_machine": (I, [P, P]),
    "moe_tcp_machine_default": (P, [P]),
    "moe_tcp_machine_load": (P, [P, S]),
    "moe_tcp_machine_free": (None, [P, P]),
    "moe_tcp_auto_block": (i64, [P, P, P, ctypes.POINTER(ctypes.c_double)]),
    "moe_tcp_compile": (P, [P, P, P]),
    "moe_tcp_program_free": (None, [P]),
    "moe_tcp_link_tier": (P, [P, P, P]),
    "moe_tcp_write_asm": (I, [P, P, S]),
    "moe_tcp_write_binary": (I, [P, P, S]),
    "moe_tcp_run": (I, [P, P, P, ctypes.POINTER(TcpRunOpts), ctypes.POINTER(TP), ctypes.POINTER(TcpStats)]),
    "moe_tcp_num_outputs": (u32, [P]),
    "moe_tcp_stats_json": (P, [P, ctypes.POINTER(TcpStats)]),
    "moe_tcp_engine_name": (S, [I]),
}


def _candidates():
    env = os.environ.get("MOEC_LIBRARY")
    if env:
        return [("MOEC_LIBRARY", env)]
    out = []
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(root, "include", "moec", "base.h")):
        out.append(("build tree", os.path.join(root, "build", "libmoec.so")))
    try:
        from . import _install  # written by cmake --install
        out.append(("install prefix", os.path.join(here, _install.LIBDIR, "libmoec.so")))
    except ImportError:
        pass
    found = ctypes.util.find_library("moec")
    out.append(("system loader", found or "libmoec.so"))
    return out


def _load():
    tried = []
    for how, path in _candidates():
        if how != "system loader" and how != "MOEC_LIBRARY" and not os.path.exists(path):
            tried.append("%s: %s (absent)" % (how, path))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s (%s)" % (how, path, e))
            if how == "MOEC_LIBRARY":
                break
            continue
        for name, (res, args) in _PROTOS.items():
            f = getattr(lib, name)
            f.restype = res
            f.argtypes = args
        return lib, path
    raise ImportError("moec: libmoec not found; tried " + "; ".join(tried) +
                      " (set MOEC_LIBRARY to the path of libmoec.so)")


lib, path = _load()

_libc = ctypes.CDLL(None)
_libc.realloc.restype = ctypes.c_void_p
_libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]
_libc.open_memstream.restype = ctypes.c_void_p
_libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
_libc.fclose.restype = ctypes.c_int
_libc.fclose.argtypes = [ctypes.c_void_p]
libc = _libc


def take_string(ctx, p):
    """The library's malloc'd string p as str, freed."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        lib.moe_free(ctx, p)


def capture(fn):
    """What fn(FILE*) writes, as str (an open_memstream stream)."""
    buf = ctypes.c_void_p()
    size = ctypes.c_size_t()
    f = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not f:
        raise MemoryError("moec: open_memstream failed")
    try:
        fn(f)
    finally:
        libc.fclose(f)
    try:
        return ctypes.string_at(buf.value, size.value).decode("utf-8", "replace") if buf.value else ""
    finally:
        libc.free(buf.value)
