#!/usr/bin/env python3
"""tests/fuzz/gen_inputs.py: write the binary seeds and the hand-made hostile
inputs of the reader fuzzers (standard library only, deterministic).

  corpus/safetensors, corpus/npy   small valid files (seeds)
  regress/tcpb/bad_*               variants of corpus/tcpb/small.tcpb
  regress/<reader>/bad_*           malformed inputs every reader must reject
                                   with a diagnostic (docs/robustness.md)

Run from anywhere: python3 tests/fuzz/gen_inputs.py. Existing files of the
same name are overwritten; crash reproducers found by fuzzing (crash_*) are
never touched."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(sub, name, data):
    d = os.path.join(HERE, sub)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ----
ST_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "U8": 1, "BOOL": 1, "F64": 8, "I64": 8}


def st_file(entries, meta=None, header=None, pad=True, data_extra=b""):
    """entries: [(name, dtype, shape, bytes)] laid out back to back."""
    hdr, blob = {}, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, raw in entries:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = header if header is not None else json.dumps(hdr, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob + data_extra


def f32s(n, scale=0.25):
    return struct.pack("<%df" % n, *[(i % 7 - 3) * scale for i in range(n)])


def halfs(n, fmt):
    out = b""
    for i in range(n):
        v = struct.pack("<f", (i % 5 - 2) * 0.5)
        out += v[2:] if fmt == "bf16" else struct.pack("<e", (i % 5 - 2) * 0.5)
    return out


def tiny(dt):
    size = {"F32": 4, "BF16": 2, "F16": 2}[dt]
    enc = (lambda n: f32s(n)) if dt == "F32" else (lambda n: halfs(n, "bf16" if dt == "BF16" else "f16"))
    return [("r", dt, [2, 4], enc(8)), ("u.0", dt, [3, 4], enc(12)), ("u.1", dt, [3, 4], enc(12)),
            ("d.0", dt, [4, 3], enc(12)), ("d.1", dt, [4, 3], enc(12))]


put("corpus/safetensors", "tiny_f32.safetensors", st_file(tiny("F32"), meta={"format": "pt"}))
put("corpus/safetensors", "tiny_bf16.safetensors", st_file(tiny("BF16")))
put("corpus/safetensors", "tiny_f16.safetensors", st_file(tiny("F16"), meta={"format": "pt", "x": "y"}))
put("corpus/safetensors", "extra_i32_empty.safetensors",
    st_file(tiny("F32") + [("bias", "I32", [2], struct.pack("<2i", 1, -1)), ("none", "F32", [0, 4], b""),
                          ("scalar", "U8", [], b"\x07")]))
put("corpus/safetensors", "empty.safetensors", st_file([]))

good = tiny("F32")
bad_st = {
    "bad_short_file": b"\x10\x00\x00",
    "bad_header_len_huge": struct.pack("<Q", 1 << 63) + b"{}",
    "bad_header_len_past_eof": struct.pack("<Q", 4096) + b"{}      ",
    "bad_header_not_json": st_file([], header=b"{\"r\": [1, 2"),
    "bad_header_array": st_file([], header=b"[1, 2, 3]"),
    "bad_dtype": st_file([("r", "F128", [2], b"\0" * 32)]),
    "bad_shape_negative": st_file([], header=b'{"r":{"dtype":"F32","shape":[-2,4],"data_offsets":[0,32]}}', data_extra=b"\0" * 32),
    "bad_shape_overflow": st_file([], header=b'{"r":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]}}'),
    "bad_shape_float": st_file([], header=b'{"r":{"dtype":"F32","shape":[2.5],"data_offsets":[0,10]}}', data_extra=b"\0" * 10),
    "bad_rank_9": st_file([], header=b'{"r":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}', data_extra=b"\0"),
    "bad_size_mismatch": st_file([], header=b'{"r":{"dtype":"F32","shape":[2,4],"data_offsets":[0,16]}}', data_extra=b"\0" * 16),
    "bad_offsets_past_end": st_file([], header=b'{"r":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', data_extra=b"\0" * 4),
    "bad_offsets_huge": st_file([], header=b'{"r":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551616]}}'),
    "bad_offsets_reversed": st_file([], header=b'{"r":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}', data_extra=b"\0" * 8),
    "bad_offsets_overlap": st_file([], header=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', data_extra=b"\0" * 12),
    "bad_offsets_missing": st_file([], header=b'{"r":{"dtype":"F32","shape":[2]}}'),
    "bad_metadata_not_string": st_file([], header=b'{"__metadata__":{"format":1}}'),
    "bad_entry_not_object": st_file([], header=b'{"r":7}'),
    "bad_key_nul": st_file([], header=b'{"r\\u0000x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', data_extra=b"\0"),
    "bad_duplicate_name": st_file([], header=b'{"r":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"r":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', data_extra=b"\0\0"),
    # Valid file, but the layer's tensors are wrong: binding must complain, not read.
    "bad_bind_shape": st_file([("r", "F32", [4, 2], f32s(8))] + good[1:]),
    "bad_bind_dtype": st_file([("r", "I64", [2, 4], b"\0" * 64)] + good[1:]),
    "bad_bind_missing_expert": st_file(good[:2] + good[3:]),
}
for k, v in bad_st.items():
    put("regress/safetensors", k + ".safetensors", v)


# ---- npy ----
def npy(descr, shape, data, fortran=False, version=(1, 0), header=None):
    if header is None:
        sh = "(" + "".join("%d," % d for d in shape) + ")" if len(shape) != 1 else "(%d,)" % shape[0]
        if len(shape) > 1:
            sh = "(" + ", ".join(str(d) for d in shape) + ")"
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", sh)
    h = header.encode() if isinstance(header, str) else header
    lenfmt = "<H" if version[0] == 1 else "<I"
    pre = 10 if version[0] == 1 else 12
    total = pre + len(h) + 1
    h += b" " * (-total % 64) + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack(lenfmt, len(h)) + h + data


put("corpus/npy", "f4_2x3.npy", npy("<f4", [2, 3], f32s(6)))
put("corpus/npy", "f2_4.npy", npy("<f2", [4], halfs(4, "f16")))
put("corpus/npy", "u2_bf16_2x2.npy", npy("<u2", [2, 2], halfs(4, "bf16")))
put("corpus/npy", "i4_3.npy", npy("<i4", [3], struct.pack("<3i", 0, -5, 7)))
put("corpus/npy", "b1_5.npy", npy("|b1", [5], b"\x00\x01\x01\x00\x01"))
put("corpus/npy", "f4_scalar_v2.npy", npy("<f4", [], f32s(1), version=(2, 0)))
put("corpus/npy", "f4_empty_v3.npy", npy("<f4", [0, 4], b"", version=(3, 0)))

bad_npy = {
    "bad_magic": b"\x93NUMPZ\x01\x00\x10\x00" + b" " * 16,
    "bad_version": npy("<f4", [1], f32s(1), version=(9, 0)),
    "bad_header_len_past_eof": b"\x93NUMPY\x01\x00\xff\xff{'descr': '<f4'",
    "bad_fortran_order": npy("<f4", [2, 3], f32s(6), fortran=True),
    "bad_truncated_data": npy("<f4", [2, 3], f32s(5)),
    "bad_trailing_data": npy("<f4", [2], f32s(3)),
    "bad_big_endian": npy(">f4", [2], f32s(2)),
    "bad_descr_f8": npy("<f8", [1], b"\0" * 8),
    "bad_shape_overflow": npy("<f4", [1 << 40, 1 << 40], b""),
    "bad_shape_negative": npy("<f4", [-1], b""),
    "bad_shape_not_tuple": npy("", [], b"", header="{'descr': '<f4', 'fortran_order': False, 'shape': [2], }"),
    "bad_missing_key": npy("", [], f32s(2), header="{'descr': '<f4', 'shape': (2,), }"),
    "bad_extra_key": npy("", [], f32s(2), header="{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1, }"),
    "bad_duplicate_key": npy("", [], f32s(2), header="{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"),
    "bad_unterminated_dict": npy("", [], b"", header="{'descr': '<f4', 'fortran_order': False, 'shape': (2,"),
    "bad_rank_9": npy("|b1", [1] * 9, b"\x01"),
}
for k, v in bad_npy.items():
    put("regress/npy", k + ".npy", v)

# ---- HF config.json ----
mixtral = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96, "num_local_experts": 4,
           "num_experts_per_tok": 2, "num_hidden_layers": 2, "hidden_act": "silu"}


def cfg(**kw):
    c = dict(mixtral)
    for k, v in kw.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return json.dumps(c, indent=1)


bad_hf = {
    "bad_not_json": '{"model_type": "mixtral", ',
    "bad_not_object": "[1, 2]",
    "bad_unknown_model_type": cfg(model_type="gpt2"),
    "bad_missing_experts": cfg(num_local_experts=None),
    "bad_negative_experts": cfg(num_local_experts=-4),
    "bad_topk_gt_experts": cfg(num_experts_per_tok=9),
    "bad_hidden_string": cfg(hidden_size="64"),
    "bad_hidden_huge": cfg(hidden_size=1 << 40),
    "bad_hidden_float": cfg(hidden_size=64.5),
    "bad_layer_out_of_range": cfg(num_hidden_layers=0),
    "bad_unknown_act": cfg(hidden_act="swish7"),
    "bad_text_config_not_object": json.dumps({"model_type": "llama4", "text_config": 3}),
    # read as Python's json: the last duplicate wins, nothing may follow, no \u0000
    "bad_duplicate_key_last_wins": cfg()[:-1] + ', "model_type": "gpt2"}',
    "bad_trailing_garbage": cfg() + " xyz",
    "bad_nul_in_model_type": cfg(model_type="mixtral\u0000x"),
}
for k, v in bad_hf.items():
    put("regress/hfconfig", k + ".json", v)

# ---- .moe ----
seed_hdr = "layer s {\n  dim T = 4, D = 8, F = 4, E = 4, K = 2, B = 2\n  input x : [T, D]\n"
bad_moe = {
    "bad_syntax": "layer s { dim T = 4,, D = 8 }\n",
    "bad_unterminated_string": seed_hdr + '  weight r : [E, D] = "model.r\n}\n',
    "bad_undefined_name": seed_hdr + "  y = softmax(z, axis=1)\n  output y\n}\n",
    "bad_dim_too_big": "layer s {\n  dim T = 99999999999999999999\n}\n",
    "bad_dim_zero": "layer s {\n  dim T = 0\n  input x : [T]\n  output x\n}\n",
    "bad_unknown_op": seed_hdr + "  y = frobnicate(x)\n  output y\n}\n",
    "bad_nul_byte": "layer s {\n  dim T = 4\0\n}\n",
    "bad_deep_nesting": seed_hdr + "  y = " + "(" * 20000 + "x" + ")" * 20000 + "\n  output y\n}\n",
    "bad_long_identifier": seed_hdr + "  " + "y" * 10000 + " = x\n}\n",
    "bad_no_layer": "dim T = 4\n",
    "bad_duplicate_layer": "layer a {\n  dim T = 1\n  input x : [T]\n  output x\n}\nlayer a {\n  dim T = 1\n  input x : [T]\n  output x\n}\n",
}
for k, v in bad_moe.items():
    put("regress/moe", k + ".moe", v)
# With a --set selector byte (see fuzz_moe.c): T=0, a huge D, unknown names.
small = open(os.path.join(HERE, "corpus/moe/small.moe"), "rb").read()
put("regress/moe", "bad_set_zero.moe", b"\x05" + small)
put("regress/moe", "bad_set_huge.moe", b"\x06" + small)
put("regress/moe", "bad_set_junk.moe", b"\x07" + small)
put("corpus/moe", "small_set_bf16.moe", b"\x02" + small)
put("corpus/moe", "small_set_ek.moe", b"\x04" + small)

# ---- textual IR ----
ir_ok = open(os.path.join(HERE, "corpus/irtext/small.moeir"), encoding="utf-8").read()
bad_ir = {
    "bad_empty_module": "",
    "bad_garbage": "\x7fELF\x02\x01\x01",
    "bad_unknown_op": ir_ok.replace("softmax", "softmux", 1),
    "bad_unknown_dtype": ir_ok.replace("f32", "f31", 1),
    "bad_forward_ref": ir_ok.replace("(%0, %1)", "(%0, %7)", 1),
    "bad_arg_out_of_range": ir_ok.replace("(%0, %1)", "(%0, %4000000000)", 1),
    "bad_shape_disagrees": ir_ok.replace("f32[3, 5]", "f32[3, 6]", 1),
    "bad_huge_shape": ir_ok.replace("[", "[4294967296, 4294967296, ", 1),
    "bad_unterminated_string": ir_ok[: ir_ok.find('"') + 3],
    "bad_truncated": ir_ok[: len(ir_ok) // 2],
}
for k, v in bad_ir.items():
    put("regress/irtext", k + ".moeir", v)

# ---- JSON IR ----
j_ok = json.load(open(os.path.join(HERE, "corpus/irjson/small.json")))


def jmod(f):
    j = json.loads(json.dumps(j_ok))
    f(j)
    return json.dumps(j, indent=1)


bad_json = {
    "bad_not_json": '{"format": "moeir", ',
    "bad_format": jmod(lambda j: j.__setitem__("format", "onnx")),
    "bad_version": jmod(lambda j: j.__setitem__("version", 999)),
    "bad_layers_not_array": jmod(lambda j: j.__setitem__("layers", {"a": 1})),
    "bad_arg_out_of_range": jmod(lambda j: j["layers"][0]["nodes"][5].__setitem__("args", [0, 99])),
    "bad_id_out_of_order": jmod(lambda j: j["layers"][0]["nodes"][1].__setitem__("id", 7)),
    "bad_shape_negative": jmod(lambda j: j["layers"][0]["nodes"][0].__setitem__("shape", [-3, 8])),
    "bad_dtype_number": jmod(lambda j: j["layers"][0]["nodes"][0].__setitem__("dtype", 3)),
}
put("regress/irjson", "bad_not_json.json", bad_json.pop("bad_not_json"))
for k, v in bad_json.items():
    put("regress/irjson", k + ".json", v)
# ---- .tcpb ----
# Hostile variants of the seed (small.moe through the tcp pipeline). fix()
# recomputes the header CRC-32 so that the check behind the checksum is the one hit.
tcpb_seed = os.path.join(HERE, "corpus/tcpb/small.tcpb")
if os.path.exists(tcpb_seed):
    import zlib
    b = open(tcpb_seed, "rb").read()

    def fix(x):
        x = bytearray(x)
        x[16:20] = struct.pack("<I", zlib.crc32(bytes(x[24:])))
        return bytes(x)

    bad_tcpb = {
        "bad_short": b[:20],
        "bad_magic": b"MOECTCPX" + b[8:64],
        "bad_version": fix(b[:8] + struct.pack("<I", 99) + b[12:])[:4096],
        "bad_checksum": b[:24] + bytes([b[24] ^ 1]) + b[25:],
        "bad_truncated": b[:4096],
        "bad_section_count": fix((b[:12] + struct.pack("<I", 1000) + b[16:])[:4096]),
        "bad_section_offset": fix((b[:32] + struct.pack("<Q", 1 << 62) + b[40:])[:4096]),
    }
    for k, v in bad_tcpb.items():
        put("regress/tcpb", k + ".tcpb", v)
print("ok")
