#!/usr/bin/env python3
"""The machine description drives the TCP plan (docs/tcp-compiler.md 9, must-show 4): a copy of
the built-in machine.json edited by this test, with no code change, and nothing else moved.

1. `dma.setup_cycles` doubled: block=auto's B for Qwen3-30B-A3B at T = 64 and 512 moves to
   larger blocks (fewer, larger weight fetches pay fewer setups), and its predicted time grows
   (each DMA command pays the setup); the schedule compiler's schedule (`--emit=tcp-sched`,
   its `meta` line) has the larger B too.
2. `memory.dm_bytes_per_slice` halved: every bench layer (examples/mixtral_8x7b, qwen3_30b_a3b,
   deepseek_v3, gpt_oss_20b) at T = 1 and 4096 still compiles, and its program validates
   against the halved machine
   (`moec check --machine`); at T = 4096 the program compiled for the built-in machine does
   not (it places buffers above the halved DM), so the plan moved.

usage: machine_drives.py MOEC SRC_DIR"""
import json
import os
import subprocess
import sys
import tempfile

LAYERS = ["mixtral_8x7b", "qwen3_30b_a3b", "deepseek_v3", "gpt_oss_20b"]


def stats(moec, src, layer, T, machine):
    cmd = [moec, "stats", os.path.join(src, "examples", layer + ".moe"), "--target=tcp", "--set", "T=%d" % T,
           "--json"] + (["--machine", machine] if machine else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stderr))
    d = json.loads(r.stdout)
    return d["tcp_block"]["B"], d["tcp_predict"]["seconds"]


def sched_B(moec, src, layer, T, machine):
    """B on the `meta` line of the layer's printed schedule (the schedule compiler)."""
    cmd = [moec, "compile", os.path.join(src, "examples", layer + ".moe"), "--target=tcp", "--set", "T=%d" % T,
           "--emit=tcp-sched", "-o", "-"] + (["--machine", machine] if machine else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stderr))
    for line in r.stdout.splitlines():
        if line.startswith("meta "):
            return int(dict(kv.split("=", 1) for kv in line.split()[1:])["B"])
    sys.exit("FAIL: %s: no meta line" % " ".join(cmd))


def main():
    moec, src = sys.argv[1], sys.argv[2]
    base = json.load(open(os.path.join(src, "backend-tcp", "isa", "machine.json")))
    fails = []
    with tempfile.TemporaryDirectory() as d:
        slow = json.loads(json.dumps(base))
        slow["dma"]["setup_cycles"] *= 2
        mslow = os.path.join(d, "setup2.json")
        json.dump(slow, open(mslow, "w"))
        for T in (64, 512):
            b0, p0 = stats(moec, src, "qwen3_30b_a3b", T, None)
            b1, p1 = stats(moec, src, "qwen3_30b_a3b", T, mslow)
            print("qwen3_30b_a3b T=%d: block=auto B %d -> %d, predicted %.1f -> %.1f us, with dma.setup_cycles "
                  "%d -> %d" % (T, b0, b1, p0 * 1e6, p1 * 1e6, base["dma"]["setup_cycles"], slow["dma"]["setup_cycles"]))
            if not b1 > b0:
                fails.append("qwen3_30b_a3b T=%d: B %d -> %d, want larger blocks" % (T, b0, b1))
            if not p1 > p0:
                fails.append("qwen3_30b_a3b T=%d: predicted %.1f -> %.1f us, want slower" % (T, p0 * 1e6, p1 * 1e6))
            s0, s1 = sched_B(moec, src, "qwen3_30b_a3b", T, None), sched_B(moec, src, "qwen3_30b_a3b", T, mslow)
            print("qwen3_30b_a3b T=%d: the schedule compiler's B %d -> %d" % (T, s0, s1))
            if not s1 > s0:
                fails.append("qwen3_30b_a3b T=%d: sched B %d -> %d, want larger blocks" % (T, s0, s1))
        half = json.loads(json.dumps(base))
        half["memory"]["dm_bytes_per_slice"] //= 2
        mhalf = os.path.join(d, "dm_half.json")
        json.dump(half, open(mhalf, "w"))
        for layer, T in [(l, t) for l in LAYERS for t in (1, 4096)]:
            out = os.path.join(d, "%s_%d.tcpb" % (layer, T))
            cmd = [moec, "compile", os.path.join(src, "examples", layer + ".moe"), "--target=tcp", "--set",
                   "T=%d" % T, "--machine", mhalf, "-o", out]
            r = subprocess.run(cmd, capture_output=True, text=True)
            ok = r.returncode == 0 and os.path.exists(out)
            if ok:
                r = subprocess.run([moec, "check", out, "--machine", mhalf], capture_output=True, text=True)
                ok = r.returncode == 0
            if ok and T == 4096:
                full = os.path.join(d, "full.tcpb")
                subprocess.run(cmd[:-4] + ["-o", full], check=True, capture_output=True)
                r = subprocess.run([moec, "check", full, "--machine", mhalf], capture_output=True, text=True)
                if r.returncode != 1 or "dm capacity exceeded" not in r.stderr:
                    fails.append("%s T=%d: the built-in machine's program passes the half-DM check" % (layer, T))
            print("%s T=%d with %d bytes of DM per slice: %s" %
                  (layer, T, half["memory"]["dm_bytes_per_slice"], "compiles and validates" if ok else "FAILS"))
            if not ok:
                fails.append("%s T=%d, half DM: %s" % (layer, T, r.stderr.strip()))
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
