"""Parses an IR file (text, or JSON when the name ends in .json) in a context
where no target is registered, through libmoec.so next to the moec tool given,
and prints the context's diagnostics. Exit status 1 when the parse fails.

usage: bare_ctx.py MOEC FILE
"""
import ctypes
import os
import sys

moec, path = sys.argv[1], sys.argv[2]
# A sanitizer build's library needs the ASan runtime loaded first in the
# process: run again with it preloaded (Python's own allocations are not
# moec's, so leak checking is off for this process).
if os.environ.get("MOEC_TEST_SANITIZED") == "1" and "MOEC_BARE_PRELOADED" not in os.environ:
    import subprocess
    rt = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    env = dict(os.environ, MOEC_BARE_PRELOADED="1", LD_PRELOAD=rt,
               ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(moec)), "libmoec.so"))
lib.moe_ctx_new.restype = ctypes.c_void_p
lib.moe_ctx_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
parse = lib.moe_module_parse_json if path.endswith(".json") else lib.moe_module_parse_text
parse.restype = ctypes.c_void_p
parse.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
lib.moe_diag_string.restype = ctypes.c_void_p
lib.moe_diag_string.argtypes = [ctypes.c_void_p]
lib.moe_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.moe_module_free.argtypes = [ctypes.c_void_p]
lib.moe_ctx_free.argtypes = [ctypes.c_void_p]

ctx = lib.moe_ctx_new(None, None)
with open(path, "rb") as f:
    text = f.read()
m = parse(ctx, path.encode(), text, len(text))
s = lib.moe_diag_string(ctx)
if s:
    sys.stdout.write(ctypes.string_at(s).decode())
    lib.moe_free(ctx, s)
if m:
    lib.moe_module_free(m)
lib.moe_ctx_free(ctx)
sys.exit(0 if m else 1)
