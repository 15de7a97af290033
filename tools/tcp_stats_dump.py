#!/usr/bin/env python3
"""tools/tcp_stats_dump.py MOEC OUT.json: the simulator's figures for a build, to compare
two builds byte for byte (cmp) when a change must not move them.

`moec run --target=tcp --stats` on every HF and quantized fixture input (tests/fixtures,
T in {1, 5, 64}, f32 and bf16) and on every example at test size (T in {1, 64}, bf16,
random weights from a fixed seed): per run its exit status, the stats JSON without the
host's times and memory, and the sha256 of y; for a refused run, its error text."""
import hashlib, json, os, subprocess, sys, tempfile, glob
import numpy as np
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "tests", "e2e"))
import examples_targets as ex
moec, out = sys.argv[1], sys.argv[2]
HOST = {"load_seconds", "peak_rss_bytes", "pack_seconds", "wall_seconds"}
res = {}
def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stderr
with tempfile.TemporaryDirectory() as t:
    def one(key, cmd):
        s, y = os.path.join(t, "s.json"), os.path.join(t, "y.npy")
        for f in (s, y):
            if os.path.exists(f): os.remove(f)
        rc, err = run(cmd + ["-o", y, "--target=tcp", "--stats", s])
        r = {"rc": rc}
        if rc == 0:
            st = json.load(open(s))
            r["stats"] = {k: v for k, v in st.items() if k not in HOST}
            r["y"] = hashlib.sha256(open(y, "rb").read()).hexdigest()
        else:
            r["err"] = err.split("error:")[-1][:200]
        res[key] = r
    for cfg in sorted(glob.glob(root + "/tests/fixtures/hf/*/config.json") + glob.glob(root + "/tests/fixtures/quant/*/config.json")):
        d = os.path.dirname(cfg)
        for x in sorted(glob.glob(d + "/x_*_T*.npy")):
            dt, T = x.split("_")[-2], x.split("_T")[-1][:-4]
            moe = os.path.join(t, "l.moe")
            if run([moec, "import-hf", cfg, "--tokens", T, "-o", moe])[0]:
                continue
            sets = ["--set", "dtype=bf16"] if dt == "bfloat16" else []
            one("%s/%s %s T=%s" % (os.path.basename(os.path.dirname(d)), os.path.basename(d), dt, T),
                [moec, "run", moe, "--weights", d + "/model.safetensors", "--input", x] + sets)
    rng = np.random.default_rng(3)
    for name in sorted(ex.EXTRA):
        f = os.path.join(root, "examples", name + ".moe")
        for T in ("1", "64"):
            sets = ex.SMALL[2:] + ex.EXTRA[name] + ["--set", "T=" + T, "--set", "dtype=bf16"]
            ir = json.loads(subprocess.run([moec, "ir", f, "--format=json"] + sets, capture_output=True, text=True).stdout)
            tensors, xs = {}, None
            for n in ir["layers"][0]["nodes"]:
                if n["op"] == "input": xs = n["shape"]
                if n["op"] != "weight": continue
                src, shape = n["attrs"]["source"]["str"], n["shape"]
                if "{e}" in src:
                    for e in range(shape[0]): tensors[src.replace("{e}", str(e))] = rng.standard_normal(shape[1:]) * 0.3
                else:
                    tensors[src] = rng.standard_normal(shape) * 0.1
            w, x = os.path.join(t, "w.safetensors"), os.path.join(t, "x.npy")
            ex.write_safetensors(w, tensors)
            np.save(x, rng.standard_normal(xs).astype(np.float32))
            one("example %s T=%s" % (name, T), [moec, "run", f, "--weights", w, "--input", x] + sets)
json.dump(res, open(out, "w"), indent=1, sort_keys=True)
print(len(res), "runs,", sum(r["rc"] == 0 for r in res.values()), "ok")
