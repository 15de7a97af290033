#!/usr/bin/env python3
"""`moec stats --target=tcp` predicts the whole layer's time (moe_tcp_predict on expected loads)
within 10% of the simulated time of the same program, and a run's own prediction
(`predicted_seconds` in `moec run --target=tcp --stats`, the program predicted on the loads the
run staged) within 1% of its `simulated_seconds` (docs/tcp-compiler.md 6.3: the residue).

Cases: the four bench layers (examples/mixtral_8x7b, qwen3_30b_a3b, deepseek_v3, gpt_oss_20b) at
T = 1, 64, 512 and 4096, and bench/qwen3_30b_a3b_fp8.moe at T = 512 with and without
--quant-act=fp8 (about 3 minutes on two cores, most of it DeepSeek-V3's T = 512 and 4096 runs;
the latter holds 4.5 GB while it computes the routing).
The simulated run is `moec run --timing-only` on a router-only checkpoint written here (the
tensor names and shapes of bench/make_checkpoint.py's table, routed experts left out; values
N(0, 0.02) from a seeded generator) and x ~ N(0, 1). DeepSeek-V3's e_score_correction_bias is
written as zeros: it is a learnt balancing term, and random values of the scores' own scale
decide the selection among near-equal sigmoid scores and skew the routing (the bench
checkpoint's do: 326 blocks at T = 4096 where uniform routing gives 256), which is the
router's doing and not the predictor's; expected loads model uniform routing.

usage: predict_layer.py MOEC SRC_DIR"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

TOL = 0.10      # expected-loads prediction against the simulated run
RESIDUE = 0.01  # the run's own loads


def tensors(src, model):
    sys.path.insert(0, os.path.join(src, "bench"))
    import make_checkpoint  # noqa: E402  (the names and shapes each example binds)
    return [t for t in make_checkpoint.tensors(model) if not t[3]]


def bf16_bits(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_checkpoint(path, ts, seed):
    rng = np.random.default_rng(seed)
    header, off, blobs = {}, 0, []
    for name, shape, forced, _ in ts:
        if name.endswith("e_score_correction_bias"):
            blob = np.zeros(shape, dtype=np.float32).tobytes()
        else:
            a = rng.standard_normal(shape, dtype=np.float32) * 0.02
            blob = a.tobytes() if forced == "f32" else bf16_bits(a).tobytes()
        header[name] = {"dtype": "F32" if forced == "f32" else "BF16", "shape": list(shape),
                        "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        blobs.append(blob)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p.stdout


def main():
    moec, src = sys.argv[1], sys.argv[2]
    ex = lambda n: os.path.join(src, "examples", n + ".moe")  # noqa: E731
    dims = {"mixtral_8x7b": 4096, "qwen3_30b_a3b": 2048, "deepseek_v3": 7168, "gpt_oss_20b": 2880}
    cases = []
    for m in ("mixtral_8x7b", "qwen3_30b_a3b", "deepseek_v3", "gpt_oss_20b"):
        for T in (1, 64, 512, 4096):
            cases.append((m, ex(m), m, T, []))
    fp8 = os.path.join(src, "bench", "qwen3_30b_a3b_fp8.moe")
    cases += [("qwen3_30b_a3b_fp8", fp8, "qwen3_30b_a3b", 512, []),
              ("qwen3_30b_a3b_fp8", fp8, "qwen3_30b_a3b", 512, ["--quant-act=fp8"])]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        cks, xs = {}, {}
        for name, moe, model, T, extra in cases:
            if model not in cks:
                cks[model] = os.path.join(tmp, model + ".safetensors")
                write_checkpoint(cks[model], tensors(src, model), 1234)
            D = dims[model]
            if (D, T) not in xs:
                xs[(D, T)] = os.path.join(tmp, "x_%d_%d.npy" % (D, T))
                np.save(xs[(D, T)], np.random.default_rng(T).standard_normal((T, D), dtype=np.float32))
            label = "%-18s T=%-4d %-16s" % (name, T, " ".join(extra))
            try:
                st = json.loads(run([moec, "stats", moe, "--target=tcp", "--set", "T=%d" % T, "--json"] + extra))
                sj = os.path.join(tmp, "s.json")
                run([moec, "run", moe, "--target=tcp", "--set", "T=%d" % T, "--weights", cks[model], "--input",
                     xs[(D, T)], "--timing-only", "--stats", sj] + extra)
                r = json.load(open(sj))
            except (RuntimeError, ValueError) as e:
                print("FAIL %s %s" % (label, str(e)[-600:]))
                bad += 1
                continue
            sim, own, pred = r["simulated_seconds"], r.get("predicted_seconds", 0.0), st["tcp_predict"]["seconds"]
            ok = abs(pred / sim - 1) <= TOL and abs(own / sim - 1) <= RESIDUE and st["tcp_predict"]["seconds"] > 0
            print("%-4s %s simulated %10.1f us, predicted %10.1f us (%+6.2f%%), on the run's loads %10.1f us "
                  "(%+.4f%%)" % ("ok" if ok else "FAIL", label, sim * 1e6, pred * 1e6, (pred / sim - 1) * 100,
                                 own * 1e6, (own / sim - 1) * 100))
            bad += not ok
    print("%d cases, %d failed" % (len(cases), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
