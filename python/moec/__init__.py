"""moec from Python: compile and run Mixture-of-Experts layers on NumPy arrays and PyTorch
tensors, through libmoec (ctypes; no compiler needed).

    import moec
    layer = moec.Layer.from_hf("tests/fixtures/hf/mixtral", tokens=5)
    y, stats = layer.run(x)                       # x: [5, D] ndarray or CPU tensor
    y, stats = layer.run(x, target="tcp")         # the TCP simulator
    layer.stats()                                 # FLOPs, weight bytes, grid, host memory (dict)

Errors are moec.Error (or MemoryError when the library's allocator refuses memory) whose
message is moec's diagnostics, `file:line:col: error: ...` with the source line and caret.
docs/python.md is the reference.
"""
import contextlib
import ctypes
import json
import os
import threading
import warnings

import numpy as np

from . import _lib
from ._lib import lib

__all__ = ["Layer", "Error", "version", "allocator", "library_path", "f32_to_bf16", "bf16_to_f32"]

library_path = _lib.path


def version():
    """The libmoec version, MAJOR.MINOR.PATCH."""
    return lib.moe_version_string().decode()


class Error(Exception):
    """A failed moec call. str(e) and e.diagnostics hold moec's diagnostics; e.status is
    the moe_status name ("invalid input", ...) or None."""

    def __init__(self, diagnostics, status=None):
        super().__init__(diagnostics)
        self.diagnostics = diagnostics
        self.status = status


# ---- the allocator hook (moe_alloc_fn) ----

class Allocator:
    """Counts (and with `limit`, bounds) the bytes the library takes through the context
    allocator hook of every context made while it is active (moec.allocator())."""

    def __init__(self, limit=None, fail_at=None):
        self.limit = limit
        self.fail_at = fail_at  # refuse request number fail_at (1-based), once
        self.requests = 0
        self.live = 0        # bytes handed out and not yet returned
        self.peak = 0
        self.calls = 0
        self.refused = 0
        self.contexts = 0    # contexts made and not yet freed
        self._lock = threading.Lock()
        self.fn = _lib.ALLOC_FN(self._hook)

    def _hook(self, ud, ptr, osize, nsize):
        with self._lock:
            if nsize == 0:
                if ptr:
                    self.live -= osize
                    _lib.libc.free(ptr)
                return None
            old = osize if ptr else 0
            self.requests += 1
            if self.requests == self.fail_at:
                self.refused += 1
                return None
            if self.limit is not None and self.live - old + nsize > self.limit:
                self.refused += 1
                return None
            q = _lib.libc.realloc(ptr, nsize)
            if q:
                self.calls += 1
                self.live += nsize - old
                self.peak = max(self.peak, self.live)
            return q


_active = []


@contextlib.contextmanager
def allocator(limit=None, fail_at=None):
    """Contexts made inside the block take their memory through a counting hook; with
    `limit`, a request that would put more than `limit` bytes live is refused, and with
    `fail_at`=k the k-th request is refused (as unit.test_oom's hook does), which moec
    reports as out of memory (MemoryError here). Yields the Allocator (live, peak,
    requests, refused, contexts): after the block, live and contexts are 0 unless
    something leaked."""
    a = Allocator(limit, fail_at)
    _active.append(a)
    try:
        yield a
    finally:
        _active.remove(a)


# Every refusal the library reports without MOE_ERR_NOMEM (a constructor that
# returns NULL) says "error: out of memory" in its diagnostic.
_NOMEM_TEXT = "error: out of memory"


class _Ctx:
    """One moe_ctx for one operation, freed on exit."""

    def __init__(self):
        self.alloc = _active[-1] if _active else None
        fn = self.alloc.fn if self.alloc else _lib.ALLOC_FN()
        self.p = lib.moe_ctx_new(fn, None)
        if not self.p:
            raise MemoryError("moec: error: out of memory (the allocator refused the context)")
        if self.alloc:
            self.alloc.contexts += 1
        if lib.moe_tcp_register_passes(self.p) != _lib.OK:
            try:
                self.fail(_lib.ERR_NOMEM, "moec: error: cannot register the TCP passes")
            finally:
                self.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, etype, *exc):
        if etype is None and lib.moe_diag_count(self.p):
            # warnings and notes of a call that succeeded, as moec prints them
            warnings.warn(self.diagnostics().rstrip("\n"), Warning, stacklevel=3)
        lib.moe_ctx_free(self.p)
        if self.alloc:
            self.alloc.contexts -= 1
        self.p = None
        return False

    def diagnostics(self):
        s = lib.moe_diag_string(self.p)
        if not s:
            return ""
        return _lib.take_string(self.p, s)

    def fail(self, status=None, what=None):
        """Raise the context's diagnostics (MemoryError for an allocation refusal)."""
        text = self.diagnostics().rstrip("\n")
        lib.moe_diag_clear(self.p)
        if not text:
            text = what or "moec: error"
            if status is not None:
                text += " (%s)" % lib.moe_status_string(status).decode()
        if status == _lib.ERR_NOMEM or _NOMEM_TEXT in text:
            raise MemoryError(text)
        raise Error(text, lib.moe_status_string(status).decode() if status is not None else None)

    def check(self, status, what=None):
        if status != _lib.OK:
            self.fail(status, what)

    def need(self, ptr, what=None):
        if not ptr:
            self.fail(None, what)
        return ptr

    def error(self, msg):
        raise Error("moec: error: " + msg)


def _b(s):
    return None if s is None else (s if isinstance(s, bytes) else str(s).encode())


def _op(name):
    return lib.moe_op_from_name(name.encode())


_OP_INPUT, _OP_WEIGHT, _OP_DEQUANT = _op("input"), _op("weight"), _op("dequant")


# ---- arrays ----

_NP_OF = {_lib.F32: np.float32, _lib.BF16: np.uint16, _lib.I32: np.int32, _lib.BOOL: np.bool_,
          _lib.F8E4M3: np.uint8, _lib.U8: np.uint8, _lib.I8: np.int8}


def f32_to_bf16(a):
    """float32 -> bf16 bit patterns (uint16), round to nearest even, NaN kept and quieted:
    moe_f32_to_bf16 elementwise."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_to_f32(h):
    """bf16 bit patterns (uint16) -> float32, exactly."""
    return (np.ascontiguousarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _torch_tensor(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _as_numpy(x):
    """An ndarray sharing x's memory where possible; (array, is_bf16_bits)."""
    if _torch_tensor(x):
        import torch
        t = x.detach()
        if t.device.type != "cpu":
            raise Error("moec: error: tensors must be on the CPU (got %s)" % t.device)
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), True
        if getattr(torch, "float8_e4m3fn", None) is not None and t.dtype == torch.float8_e4m3fn:
            return t.view(torch.uint8).numpy(), False
        return t.numpy(), False
    return np.asarray(x), False


def _convert(a, dt, bits, what):
    """a as a C-contiguous array of moe dtype dt (no copy when it already is)."""
    if dt == _lib.BF16:
        if a.dtype == np.uint16:
            return np.ascontiguousarray(a)
        if a.dtype.kind == "f":
            return f32_to_bf16(a.astype(np.float32, copy=False))
    elif dt == _lib.F32:
        if a.dtype == np.float32:
            return np.ascontiguousarray(a)
        if bits:
            return bf16_to_f32(a)
        if a.dtype.kind == "f":
            return np.ascontiguousarray(a, dtype=np.float32)
    elif dt == _lib.I32 and a.dtype.kind in "iu":
        b = np.ascontiguousarray(a, dtype=np.int32)
        if a.dtype != np.int32 and not np.array_equal(b, a):
            raise Error("moec: error: %s: values do not fit i32" % what)
        return b
    elif dt == _lib.BOOL and a.dtype == np.bool_:
        return np.ascontiguousarray(a)
    elif dt in (_lib.U8, _lib.F8E4M3) and a.dtype == np.uint8:
        return np.ascontiguousarray(a)
    raise Error("moec: error: %s: an array of %s cannot bind a %s value" %
                (what, "bf16" if bits else a.dtype, _lib.DTYPE_NAMES.get(dt, dt)))


def _view(c, arr, dt, keep):
    """A moe_tensor header over arr's memory (not owned: the array stays Python's)."""
    shape = (ctypes.c_int64 * _lib.MAX_RANK)(*arr.shape)
    t = c.need(lib.moe_tensor_new_shape(c.p, dt, arr.ndim, shape), "cannot make a tensor")
    t.contents.data = arr.ctypes.data if arr.nbytes else None
    t.contents.nbytes = arr.nbytes
    t.contents.owned = 0
    keep.append(arr)
    return t


def _to_numpy(t, raw=False):
    """A copy of a library tensor; bf16 widened to float32 exactly (as moec writes .npy)
    unless raw (the uint16 bit patterns)."""
    tc = t.contents
    shape = tuple(tc.shape[i] for i in range(tc.rank))
    npdt = _NP_OF[tc.dtype]
    n = int(np.prod(shape)) if shape else 1
    if tc.nbytes:
        buf = (ctypes.c_char * tc.nbytes).from_address(tc.data)
        a = np.frombuffer(buf, dtype=npdt, count=n).reshape(shape).copy()
    else:
        a = np.zeros(shape, dtype=npdt)
    if tc.dtype == _lib.BF16 and not raw:
        a = bf16_to_f32(a).reshape(shape)
    return a


_ST_OF_NP = {np.dtype(np.float32): _lib.ST_F32, np.dtype(np.float16): _lib.ST_F16,
             np.dtype(np.float64): _lib.ST_F64, np.dtype(np.int32): _lib.ST_I32, np.dtype(np.int64): _lib.ST_I64,
             np.dtype(np.int16): _lib.ST_I16, np.dtype(np.int8): _lib.ST_I8, np.dtype(np.uint8): _lib.ST_U8,
             np.dtype(np.uint16): _lib.ST_BF16, np.dtype(np.uint32): _lib.ST_U32, np.dtype(np.bool_): _lib.ST_BOOL}


def _st_dtype(x, a, bits):
    if bits:
        return _lib.ST_BF16
    if _torch_tensor(x):
        import torch
        if getattr(torch, "float8_e4m3fn", None) is not None and x.dtype == torch.float8_e4m3fn:
            return _lib.ST_F8_E4M3
    st = _ST_OF_NP.get(a.dtype)
    if st is None:
        raise Error("moec: error: an array of %s cannot be a checkpoint tensor" % a.dtype)
    return st


# ---- graphs ----

def _nodes(g, op):
    return [i for i in range(lib.moe_graph_num_nodes(g)) if lib.moe_node_op(g, i) == op]


def _node_info(g, i):
    shape = lib.moe_node_shape(g, i)
    rank = lib.moe_node_rank(g, i)
    return (lib.moe_node_name(g, i).decode(), lib.moe_node_dtype(g, i), tuple(shape[k] for k in range(rank)))


def _dim(g, name):
    v = ctypes.c_int64()
    return v.value if lib.moe_graph_get_dim(g, name.encode(), ctypes.byref(v)) else None


def _tokens_node(g):
    for i in _nodes(g, _OP_INPUT):
        if lib.moe_node_name(g, i) == _lib.TOKENS_INPUT:
            return i
    return None


def _lower(c, m, pipeline):
    named = lib.moe_pipeline_named(_b(pipeline))
    ro = _lib.RunOpts(verify=1)
    c.check(lib.moe_run_pipeline_text(c.p, named or _b(pipeline), m, ctypes.byref(ro)))


_TARGET_EXT = {".tcpb": "tcp", ".tcps": "tcp", ".c": "c", ".o": "obj", ".ll": "llvm-ir"}


class Layer:
    """One MoE layer: its .moe text and the `set` overrides applied when it is parsed.

    Layer(path_or_text, set=None, name=None): a .moe file (a path) or .moe text; `set`
    maps dims, params or "dtype" to values, as `moec --set NAME=VALUE`. Parsing happens
    here, so a bad layer raises moec.Error at once."""

    def __init__(self, source, set=None, name=None, checkpoint=None):
        if isinstance(source, os.PathLike) or (isinstance(source, str) and "{" not in source):
            path = os.fspath(source)
            with open(path, "rb") as f:
                self.text = f.read()
            self.file = name or path
        else:
            self.text = source if isinstance(source, bytes) else source.encode()
            self.file = name or "<string>"
        self.sets = {str(k): str(v) for k, v in (set or {}).items()}
        self.checkpoint = checkpoint
        with _Ctx() as c:
            m = self._parse(c)
            try:
                g = self._one(c, m)
                self.name = lib.moe_graph_name(g).decode()
                self.dtype = _lib.DTYPE_NAMES[lib.moe_graph_dtype(g)]
                self.inputs = [_node_info(g, i) for i in _nodes(g, _OP_INPUT)]
                self.weights = [_node_info(g, i) + (lib.moe_node_get_str(g, i, b"source").decode(),)
                                for i in _nodes(g, _OP_WEIGHT)]
                self.T = _dim(g, "T")
            finally:
                lib.moe_module_free(m)

    # -- constructors --
    @classmethod
    def from_hf(cls, path, layer=None, tokens=None, block=None, dtype=None, ignore_quantization=False, set=None):
        """The MoE layer of a HuggingFace config: `path` is a config.json, a model directory
        holding one (its checkpoint becomes the layer's default weights), or the config as
        a dict (a PyTorch model's config in memory). As `moec import-hf`: layer (default
        0), tokens T (default 16), block B (default 64), dtype ("f32"/"bf16"; default the
        config's torch_dtype)."""
        opts = _lib.ImportOpts(layer=layer or 0, tokens=tokens or 0, block=block or 0, dtype=_lib.F32,
                               config_dtype=1, ignore_quantization=int(bool(ignore_quantization)))
        if dtype is not None:
            opts.dtype = {"f32": _lib.F32, "float32": _lib.F32, "bf16": _lib.BF16, "bfloat16": _lib.BF16}[str(dtype)]
            opts.config_dtype = 0
        out = ctypes.c_void_p()
        ckpt = None
        with _Ctx() as c:
            if isinstance(path, dict):
                js = json.dumps(path).encode()
                name = "<config>"
                c.check(lib.moe_import_hf_text(c.p, name.encode(), js, len(js), ctypes.byref(opts), ctypes.byref(out)))
            else:
                p = os.fspath(path)
                cfg = os.path.join(p, "config.json") if os.path.isdir(p) else p
                d = os.path.dirname(cfg) or "."
                if any(os.path.exists(os.path.join(d, f)) for f in ("model.safetensors", "model.safetensors.index.json")):
                    ckpt = d
                name = cfg
                c.check(lib.moe_import_hf(c.p, cfg.encode(), ctypes.byref(opts), ctypes.byref(out)))
            text = _lib.take_string(c.p, out.value)
        return cls(text, set=set, name="%s:layer%d.moe" % (name, opts.layer), checkpoint=ckpt)

    def with_set(self, **sets):
        """A copy with more overrides (Layer.with_set(T=1, dtype="bf16"))."""
        s = dict(self.sets)
        s.update({k: str(v) for k, v in sets.items()})
        return Layer(self.text, set=s, name=self.file, checkpoint=self.checkpoint)

    # -- internals --
    def _host_memory(self, c):
        """moe_host_memory_plan of the layer lowered by the host pipeline, as `moec stats`
        reports it (a dict), or None where the host pipeline does not lower it."""
        m = self._parse(c)
        try:
            ro = _lib.RunOpts(verify=1)
            hm = _lib.HostMemory()
            if (lib.moe_module_num_graphs(m) != 1 or
                    lib.moe_run_pipeline_text(c.p, b"host", m, ctypes.byref(ro)) != 0 or
                    lib.moe_host_memory_plan(c.p, lib.moe_module_graph(m, 0), None, ctypes.byref(hm)) != 0):
                lib.moe_diag_clear(c.p)
                return None
            return {k: int(getattr(hm, k)) for k in ("peak_bytes", "weight_bytes", "packed_bytes",
                                                      "packable_bytes", "workspace_bytes", "io_bytes")}
        finally:
            lib.moe_module_free(m)

    def _parse(self, c, extra=None):
        sets = dict(self.sets)
        sets.update(extra or {})
        items = (_lib.Setting * max(1, len(sets)))(*[_lib.Setting(_b(k), _b(v)) for k, v in sets.items()])
        st = _lib.Settings(items, len(sets))
        m = lib.moe_parse_moe(c.p, self.file.encode(), self.text, len(self.text), ctypes.byref(st))
        return c.need(m)

    def _one(self, c, m):
        n = lib.moe_module_num_graphs(m)
        if n != 1:
            lib.moe_module_free(m)
            c.error("%s holds %d layers; a Layer takes a file with one layer" % (self.file, n))
        return lib.moe_module_graph(m, 0)

    def _tcp_module(self, c, mach, extra=None, quant_act=None):
        """The module for the TCP target: block=auto unless B is set (docs/tcp-isa.md 7.8)."""
        m = self._parse(c, extra)
        # --quant-act first: block=auto prices the layer as it runs
        self._quant_act(m, quant_act)
        autob, pred = 0, 0.0
        sets = dict(self.sets)
        sets.update(extra or {})
        if "B" not in sets and lib.moe_module_num_graphs(m) == 1:
            g = lib.moe_module_graph(m, 0)
            cur = _dim(g, "B")
            if cur is not None:
                p = ctypes.c_double()
                B = lib.moe_tcp_auto_block(c.p, g, mach, ctypes.byref(p))
                autob, pred = B, p.value
                if B > 0 and B != cur:
                    lib.moe_module_free(m)
                    e = dict(extra or {})
                    e["B"] = str(B)
                    m = self._parse(c, e)
                    self._quant_act(m, quant_act)
        return m, autob, pred

    @staticmethod
    def _quant_act(m, quant_act):
        if quant_act == "fp8":
            for k in range(lib.moe_module_num_graphs(m)):
                g = lib.moe_module_graph(m, k)
                for i in _nodes(g, _OP_DEQUANT):
                    if lib.moe_node_get_str(g, i, b"format") == b"fp8":
                        lib.moe_node_set_str(g, i, b"act", b"fp8")

    def _machine(self, c, machine):
        m = c.need(lib.moe_tcp_machine_load(c.p, _b(os.fspath(machine))) if machine
                   else lib.moe_tcp_machine_default(c.p))
        c.check(lib.moe_tcp_set_pass_machine(c.p, m))  # the tcp pipeline's graph passes plan for it
        return m

    def _tier(self, c, g, mach, prog, quant_act, decode_tier):
        """Link the decode tier (T = 1) behind a serving program (docs/tcp-isa.md 7.4)."""
        T = _dim(g, "T")
        if not decode_tier or _tokens_node(g) is None or not T or T <= 1:
            return prog
        m1, _, _ = self._tcp_module(c, mach, {"T": "1"}, quant_act)
        try:
            g1 = self._one(c, m1)
            nt = _tokens_node(g1)
            if nt is not None:
                lib.moe_node_set_name(g1, nt, _lib.TOKENS_INPUT + b".tier")
            _lower(c, m1, "tcp")
            d = c.need(lib.moe_tcp_compile(c.p, g1, mach))
            errs = lib.moe_error_count(c.p)
            linked = lib.moe_tcp_link_tier(c.p, prog, d)
            lib.moe_tcp_program_free(d)
            if not linked:
                if lib.moe_error_count(c.p) != errs:
                    c.fail()
                lib.moe_diag_clear(c.p)  # a note: the serving program runs alone
                return prog
            lib.moe_tcp_program_free(prog)
            return linked
        finally:
            lib.moe_module_free(m1)

    # -- what the command line does --
    def stats(self, target=None, pipeline=None):
        """`moec stats --json [--target=tcp]` as a dict, the same keys: dims, flops,
        weight_bytes, grid_blocks_max (tight, seed, vLLM), block buffers after `pipeline`
        (default: tcp); on the host, host_memory: the predicted peak of a host run and its
        parts (None where the host pipeline does not lower the layer); with target="tcp",
        tcp_block: the B block=auto picks."""
        with _Ctx() as c:
            autob, pred, mach = 0, 0.0, None
            if target == "tcp":
                mach = self._machine(c, None)
                m, autob, pred = self._tcp_module(c, mach)
            elif target in (None, "host"):
                m = self._parse(c)
            else:
                c.error("stats: target must be host or tcp, not '%s'" % target)
            try:
                named = lib.moe_pipeline_named(_b(pipeline)) if pipeline else None
                js = _lib.take_string(c.p, c.need(lib.moe_module_stats_json(c.p, m, named or _b(pipeline))))
            finally:
                lib.moe_module_free(m)
                if mach:
                    lib.moe_tcp_machine_free(c.p, mach)
            d = json.loads(js)
            # as `moec stats`: the sum of every IR value is not shown (no run holds them
            # all at once); the host's predicted memory is
            d.pop("buffers", None)
            d.pop("buffer_bytes_total", None)
            if target in (None, "host"):
                d["host_memory"] = self._host_memory(c)
            if autob > 0:
                d = dict([("tcp_block", {"B": autob, "auto": True, "predicted_block_loop_seconds": pred})] +
                         list(d.items()))
            return d

    def ir(self, pipeline=None, format="text"):
        """The IR as text ("text", "json" or "dot"), after `pipeline` ("host", "tcp" or a
        pass list) when given."""
        with _Ctx() as c:
            m = self._parse(c)
            try:
                if pipeline:
                    _lower(c, m, pipeline)
                if format == "json":
                    return _lib.take_string(c.p, c.need(lib.moe_module_to_json(m)))
                fn = {"text": lib.moe_module_print, "dot": lib.moe_module_print_dot}.get(format)
                if not fn:
                    c.error("ir: format must be text, json or dot, not '%s'" % format)
                return _lib.capture(lambda f: fn(m, f))
            finally:
                lib.moe_module_free(m)

    def compile(self, target=None, path=None, machine=None, quant_act=None, decode_tier=True):
        """`moec compile`: write `path` for target "c", "obj", "llvm-ir" or "tcp" (.tcpb
        binary or .tcps assembly); the target follows the name when not given."""
        if path is None:
            raise Error("moec: error: compile needs a path")
        path = os.fspath(path)
        named = next((t for e, t in _TARGET_EXT.items() if path.endswith(e)), None)
        target = target or named
        if not target:
            raise Error("moec: error: cannot tell the target from the name '%s' (.tcpb, .tcps, .c, .o, .ll): "
                        "give target" % path)
        if named and target != named:
            raise Error("moec: error: %s names %s output, not target=%s" % (path, named, target))
        with _Ctx() as c:
            if target == "tcp":
                if not (path.endswith(".tcpb") or path.endswith(".tcps")):
                    c.error("target tcp writes assembly (.tcps) or a binary (.tcpb); name the output so")
                mach = self._machine(c, machine)
                m, prog = None, None
                try:
                    m, _, _ = self._tcp_module(c, mach, None, quant_act)
                    g = self._one(c, m)
                    _lower(c, m, "tcp")
                    prog = c.need(lib.moe_tcp_compile(c.p, g, mach))
                    prog = self._tier(c, g, mach, prog, quant_act, decode_tier)
                    w = lib.moe_tcp_write_asm if path.endswith(".tcps") else lib.moe_tcp_write_binary
                    c.check(w(c.p, prog, path.encode()))
                finally:
                    lib.moe_tcp_program_free(prog)
                    lib.moe_module_free(m)
                    lib.moe_tcp_machine_free(c.p, mach)
                return path
            emit = {"c": lib.moe_emit_c_file, "obj": lib.moe_emit_object, "llvm-ir": lib.moe_emit_llvm_ir}.get(target)
            if not emit:
                c.error("compile: target must be c, obj, llvm-ir or tcp, not '%s'" % target)
            m = self._parse(c)
            try:
                g = self._one(c, m)
                _lower(c, m, "host")
                c.check(emit(c.p, g, path.encode()))
            finally:
                lib.moe_module_free(m)
            return path

    def run(self, x, weights=None, target="host", tokens=None, threads=None, engine="llvm", kernels="auto",
            repeat=1, no_cache=False, cold=False, machine=None, trace=None, no_skip=False, quant_act=None,
            decode_tier=True, raw=False):
        """Run the layer on x and return (y, stats).

        x: an array (ndarray, CPU torch tensor, anything with the buffer protocol) of the
        input's shape [T, D], or {input name: array} for several inputs; float arrays are
        converted to the layer's dtype as moec run converts an .npy (bf16: round to nearest
        even), uint16 arrays and torch.bfloat16 tensors are taken as bf16 bit patterns.
        weights: a checkpoint (a .safetensors file, a sharded index or a model directory, or
        a list of them: the library maps the files), or a dict of arrays / tensors: keyed by
        the checkpoint's tensor names (a state dict: converted and stacked by the library as
        a file's would be), or by the layer's weight names with their exact shapes (bound
        without a copy when the dtype matches). Default: the checkpoint of from_hf's model
        directory.
        target: "host" (engine "llvm", "c" or "interp"; threads, kernels, repeat, no_cache,
        cold as moec run) or "tcp" (the simulator; machine, trace (a path for the Chrome
        trace, or True: its events in stats["trace"]), no_skip, quant_act, decode_tier). tokens=N serves N real tokens of the layer compiled for T (x may have
        N rows). y is float32 for a bf16 layer (widened exactly) unless raw=True (the uint16
        bit patterns). stats is the dict `moec run --stats` writes."""
        if target not in ("host", "tcp"):
            raise Error("moec: error: target must be host or tcp, not '%s'" % target)
        if weights is None:
            weights = self.checkpoint
        if weights is None:
            raise Error("moec: error: run needs weights (a checkpoint path or a dict of arrays)")
        if tokens is not None and (int(tokens) < 0 or int(tokens) > 2147483647):
            raise Error("moec: error: tokens must be an integer in 0..2147483647, got %r" % (tokens,))
        keep = []  # arrays whose memory the library reads
        with _Ctx() as c:
            m = mach = prog = bind = None
            outs = (_lib.TP * 16)()
            try:
                if target == "tcp":
                    mach = self._machine(c, machine)
                    m, _, _ = self._tcp_module(c, mach, None, quant_act)
                else:
                    m = self._parse(c)
                g = self._one(c, m)
                if tokens is not None and _tokens_node(g) is None:
                    nid = lib.moe_node_new(g, _OP_INPUT, None, 0, lib.moe_loc_none())
                    lib.moe_node_set_type(g, nid, _lib.I32, None, 0)
                    lib.moe_node_set_name(g, nid, _lib.TOKENS_INPUT)
                _lower(c, m, target)
                if lib.moe_graph_num_outputs(g) > 16:
                    c.error("a layer with more than 16 outputs cannot be run")
                bind = c.need(lib.moe_tensor_map_new(c.p))
                self._bind_weights(c, g, weights, bind, keep)
                if tokens is not None:
                    t = c.need(lib.moe_tensor_new(c.p, _lib.I32, 0, None))
                    ctypes.cast(t.contents.data, ctypes.POINTER(ctypes.c_int32))[0] = int(tokens)
                    c.check(lib.moe_tensor_map_set(bind, _lib.TOKENS_INPUT, t))
                self._bind_inputs(c, g, x, bind, keep, tokens)
                if target == "tcp":
                    prog = c.need(lib.moe_tcp_compile(c.p, g, mach))
                    prog = self._tier(c, g, mach, prog, quant_act, decode_tier)
                    stats = self._run_tcp(c, prog, mach, bind, outs, trace, no_skip)
                else:
                    stats = self._run_host(c, g, bind, outs, engine, kernels, repeat, threads, no_cache, cold)
                y = _to_numpy(outs[0], raw)
                if tokens is not None and y.ndim >= 1 and tokens < y.shape[0]:
                    y = y[:tokens].copy()
                return y, stats
            finally:
                for i in range(16):
                    if outs[i]:
                        lib.moe_tensor_free(c.p, outs[i])
                if bind:
                    lib.moe_tensor_map_free(bind)
                lib.moe_tcp_program_free(prog)
                lib.moe_module_free(m)
                if mach:
                    lib.moe_tcp_machine_free(c.p, mach)

    def _bind_weights(self, c, g, weights, bind, keep):
        wnodes = [_node_info(g, i) for i in _nodes(g, _OP_WEIGHT)]
        if isinstance(weights, (str, bytes, os.PathLike)):
            weights = [weights]
        if isinstance(weights, (list, tuple)):
            paths = (ctypes.c_char_p * max(1, len(weights)))(*[_b(os.fspath(p)) for p in weights])
            c.check(lib.moe_weights_load(c.p, g, paths, len(weights), bind))
            return
        if not hasattr(weights, "keys"):
            c.error("weights must be a checkpoint path, a list of them, or a dict of arrays")
        if wnodes and all(n in weights for n, _, _ in wnodes):
            # the layer's own weight names: views of the caller's arrays
            for name, dt, shape in wnodes:
                a, bits = _as_numpy(weights[name])
                a = _convert(a, dt, bits, "weight '%s'" % name)
                if a.shape != shape:
                    c.error("weight '%s' has shape %s; the layer needs %s" % (name, list(a.shape), list(shape)))
                c.check(lib.moe_tensor_map_set(bind, name.encode(), _view(c, a, dt, keep)))
            return
        # a state dict: an in-memory checkpoint the library binds as it binds a file
        names = list(weights.keys())
        ents = (_lib.StTensor * max(1, len(names)))()
        for k, name in enumerate(names):
            x = weights[name]
            a, bits = _as_numpy(x)
            st = _st_dtype(x, a, bits)
            a = np.ascontiguousarray(a)
            keep.append(a)
            e = ents[k]
            e.name = _b(name)
            e.dtype = st
            e.rank = a.ndim
            for d in range(a.ndim):
                e.shape[d] = a.shape[d]
            e.data = a.ctypes.data if a.nbytes else None
            e.nbytes = a.nbytes
        ck = c.need(lib.moe_checkpoint_open_tensors(c.p, b"<weights dict>", ents, len(names)))
        try:
            c.check(lib.moe_weights_load_from(c.p, g, ck, bind))
        finally:
            lib.moe_checkpoint_close(ck)

    def _bind_inputs(self, c, g, x, bind, keep, tokens):
        free = [i for i in _nodes(g, _OP_INPUT) if not lib.moe_tensor_map_get(bind, lib.moe_node_name(g, i))]
        if isinstance(x, dict):
            items = list(x.items())
        elif len(free) == 1:
            items = [(lib.moe_node_name(g, free[0]).decode(), x)]
        else:
            c.error("the layer has several inputs: give x as {name: array, ...}")
        for name, arr in items:
            node = next((i for i in free if lib.moe_node_name(g, i).decode() == name), None)
            if node is None:
                c.error("x names no input of the layer: '%s'" % name)
            _, dt, shape = _node_info(g, node)
            a, bits = _as_numpy(arr)
            a = _convert(a, dt, bits, "input '%s'" % name)
            if (tokens is not None and a.ndim == len(shape) and a.ndim >= 1 and a.shape[0] == tokens and
                    tokens < shape[0] and a.shape[1:] == shape[1:]):
                p = np.zeros(shape, dtype=a.dtype)  # rows past the real tokens stay zero
                p[:tokens] = a
                a = p
            if a.shape != shape:
                c.error("shape %s does not match input '%s' %s%s" % (
                    list(a.shape), name, list(shape),
                    " (use set={'T': ...} or Layer.with_set(T=...))" if a.ndim == 2 and len(shape) == 2 and
                    a.shape[1] == shape[1] else ""))
            c.check(lib.moe_tensor_map_set(bind, name.encode(), _view(c, a, dt, keep)))
        for i in _nodes(g, _OP_INPUT):
            if not lib.moe_tensor_map_get(bind, lib.moe_node_name(g, i)):
                c.error("input '%s' of the layer is not bound" % lib.moe_node_name(g, i).decode())

    def _run_host(self, c, g, bind, outs, engine, kernels, repeat, threads, no_cache, cold):
        if engine == "interp":
            c.check(lib.moe_interp_run(c.p, g, bind, outs))
            return {"target": "host", "engine": "interp"}
        if engine not in ("llvm", "c"):
            c.error("engine must be llvm, c or interp, not '%s'" % engine)
        if kernels not in ("auto", "portable"):
            c.error("kernels must be auto or portable, got '%s'" % kernels)
        if threads is not None and int(threads) < 1:
            c.error("threads must be at least 1 (leave it out for every core)")
        ho = _lib.HostOpts()
        lib.moe_host_opts_init(ctypes.byref(ho))
        ho.engine = 1 if engine == "c" else 0
        ho.repeat = int(repeat)
        ho.threads = int(threads or 0)
        ho.portable = int(kernels == "portable")
        ho.no_cache = int(bool(no_cache))
        ho.cold = int(bool(cold))
        hs = _lib.HostStats()
        c.check(lib.moe_host_run_opts(c.p, g, bind, ctypes.byref(ho), outs, ctypes.byref(hs)))
        return {"target": "host", "engine": engine, "compute_seconds": hs.compute_seconds,
                "compile_seconds": hs.compile_seconds, "setup_seconds": hs.setup_seconds,
                "pack_seconds": hs.pack_seconds, "repeat": hs.repeat, "workspace_bytes": hs.workspace_bytes,
                "blocks_executed": hs.blocks_executed, "blocks_skipped": hs.blocks_skipped,
                "rows_executed": hs.rows_executed, "grid_blocks_max": hs.grid_blocks_max, "threads": hs.threads,
                "cache": ("off", "miss", "hit", "bad")[hs.cache], "kernels": (hs.kernels or b"").decode()}

    def _run_tcp(self, c, prog, mach, bind, outs, trace, no_skip):
        tmp = None
        if trace is True:  # the events come back in stats["trace"]
            import tempfile
            tmp = tempfile.TemporaryDirectory(prefix="moec-trace.")
            trace = os.path.join(tmp.name, "trace.json")
        try:
            ro = _lib.TcpRunOpts(machine=mach, no_skip=int(bool(no_skip)),
                                 trace_path=_b(os.fspath(trace)) if trace else None)
            st = _lib.TcpStats()
            c.check(lib.moe_tcp_run(c.p, prog, bind, ctypes.byref(ro), outs, ctypes.byref(st)))
            d = json.loads(_lib.take_string(c.p, c.need(lib.moe_tcp_stats_json(c.p, ctypes.byref(st)))))
            if tmp:
                with open(trace) as f:
                    d["trace"] = json.load(f)
            return d
        finally:
            if tmp:
                tmp.cleanup()

    def _repr_html_(self):
        from . import notebook
        return notebook.stats_html(self)

    def __repr__(self):
        return "moec.Layer(%r, %s, T=%s, sets=%r)" % (self.name, self.dtype, self.T, self.sets)
