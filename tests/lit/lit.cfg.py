# lit configuration for moec's golden tests (parse/print, passes, diagnostics).
import os
import lit.formats

config.name = "moec"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".moe", ".moeir", ".test", ".json"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.moec_obj_root, "tests", "lit")
config.substitutions.append(("%moec", os.path.join(config.moec_obj_root, "moec")))
config.substitutions.append(("%tcp_book", os.path.join(config.moec_obj_root, "tests", "tcp_book")))
config.substitutions.append(("%FileCheck", config.filecheck))
config.substitutions.append(("%examples", os.path.join(config.moec_src_root, "examples")))
config.substitutions.append(("%fixtures", os.path.join(config.moec_src_root, "tests", "fixtures")))
config.substitutions.append(("%python", config.python))
config.substitutions.append(("%srcroot", config.moec_src_root))
# Time and memory limits hold for the plain build; sanitizer builds check the rest.
sanitized = getattr(config, "moec_sanitized", "OFFOFF") not in ("OFFOFF", "")
config.environment["MOEC_TEST_SANITIZED"] = "1" if sanitized else "0"
# `UNSUPPORTED: sanitized` marks a real-size test whose paths a smaller test covers.
if sanitized:
    config.available_features.add("sanitized")
# The host engine that gives a TCP test its reference y (compared within a
# tolerance): the interpreter, or under the sanitizers the LLVM engine, whose
# generated code runs uninstrumented (the instrumented interpreter takes minutes
# on the real-size layers; the plain build compares with the interpreter itself).
# The Python checkers read it from MOEC_TEST_REF_ENGINE (tests/lit/tcp/Inputs/litio.py).
ref_engine = "--engine=llvm" if sanitized else "--engine=interp"
config.substitutions.append(("%ref_engine", ref_engine))
config.environment["MOEC_TEST_REF_ENGINE"] = ref_engine
config.environment["MOEC_LLVM_STATIC_CLI"] = "1" if getattr(config, "moec_llvm_static_cli", "ON") in ("ON", "1", "TRUE") else "0"
config.environment["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "")
config.environment["UBSAN_OPTIONS"] = os.environ.get("UBSAN_OPTIONS", "")
# `not` and `count` live beside FileCheck (Debian llvm-19-tools).
config.environment["PATH"] = os.pathsep.join(
    [os.path.dirname(config.filecheck), os.environ.get("PATH", "")])
# The host's bf16 dot-product kernels (and so its packed weights) need AVX512-BF16.
try:
    with open("/proc/cpuinfo") as f:
        if "avx512_bf16" in f.read():
            config.available_features.add("avx512bf16")
except OSError:
    pass
