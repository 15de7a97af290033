#!/usr/bin/env python3
"""The schedule's text form round-trips (docs/tcp-compiler.md 4.2, issue 31 must-show 2):
for every case in scope, the layer's schedule printed by `moec compile --emit=tcp-sched`,
read back and compiled (by `moec compile S.tsched` where this moec reads .tsched inputs,
else by the test tool tcp_sched_tool --tcpb given as --sched-tool) gives the same .tcpb
bytes as the direct `moec compile`. No stored output: both sides are made by this build.

Cases: every HF fixture family (or --families) of FIXTURES_DIR and each --more-fixtures
folder, for every saved input's dtype and T (bf16 and f32, T in {1, 5, 64}); the examples
EXAMPLES at T in {1, 5, 64} (E and K made small; seed and qwen3_30b_a3b at their own D and
F, the other examples at D = 64, F = 32). Quantized layers: the fixtures of
--quant-fixtures (tests/fixtures/quant) of QUANT_FAMILIES with the f32 and the bf16
compute type; the block-FP8 families of QACT_FAMILIES once more with fp8 activations
(`--quant-act=fp8`).

usage: tcp_roundtrip.py MOEC FIXTURES_DIR EXAMPLES_DIR [--families a,b] [--examples-only a,b]
                        [--sched-tool TCP_SCHED_TOOL] [--more-fixtures DIR ...] [--quant-fixtures DIR]
"""
import argparse
import filecmp
import os
import subprocess
import sys
import tempfile

import cases

FAMILIES = None  # every family of the fixtures
SMALL = ["--set", "D=64", "--set", "F=32"]
EXAMPLES = {  # seed and qwen3_30b_a3b at their own D and F; the others at SMALL dims
    "seed": ["--set", "E=8", "--set", "K=2"],
    "qwen3_30b_a3b": ["--set", "E=8", "--set", "K=2"],
    "deepseek_v3": SMALL + ["--set", "E=16", "--set", "K=4", "--set", "n_group=4", "--set", "topk_group=2"],
    "gpt_oss_20b": SMALL + ["--set", "E=8", "--set", "K=2"],
    "llama4_scout": SMALL + ["--set", "E=8", "--set", "K=1"],
    "mixtral_8x7b": SMALL + ["--set", "E=8", "--set", "K=2"],
    "olmoe_1b_7b": SMALL + ["--set", "E=8", "--set", "K=2"],
}
TOKENS = (1, 5, 64)
QUANT_FAMILIES = ["deepseek_v3", "qwen3_moe", "fp8ch_llama4", "mxfp4_gpt_oss", "int4_deepseek_v3",
                  "nvfp4_mixtral", "nvfp4_qwen3_moe", "nvfp4mo_qwen3_moe", "awq_mixtral", "awq_qwen3_moe",
                  "w8a8_mixtral", "w8a8_qwen3_moe", "gptq_mixtral", "gptq_qwen3_moe"]
# block FP8 in 128 x 128 blocks: run a second time with --quant-act=fp8
QACT_FAMILIES = ["deepseek_v3", "qwen3_moe"]

run = cases.run


def reader(a):
    """The command that compiles a .tsched into a .tcpb (a list to which IN and OUT are
    appended as the function gives them), or None."""
    p = subprocess.run([a.moec, "compile", "--help"], capture_output=True, text=True)
    if ".tsched" in p.stdout:
        return lambda src, out: [a.moec, "compile", src, "-o", out]
    if a.sched_tool:
        return lambda src, out: [a.sched_tool, "--tcpb", out, src]
    return None


def roundtrip(a, tally, case, moe, sets, tmp):
    ts, direct, back = (os.path.join(tmp, n) for n in ("s.tsched", "direct.tcpb", "back.tcpb"))
    run([a.moec, "compile", moe, "--target=tcp", "--emit=tcp-sched", "-o", ts] + sets)
    run([a.moec, "compile", moe, "--target=tcp", "-o", direct] + sets)
    run(a.reader(ts, back))
    tally.check(case, filecmp.cmp(direct, back, shallow=False), ".tcpb from the .tsched")


def hf_cases(a, tally, fixtures, tmp):
    for fam, dtype, T, _x in cases.inputs(fixtures, cases.families(fixtures, a.families), tokens=TOKENS):
        label = "" if fixtures == a.fixtures else os.path.basename(os.path.normpath(fixtures)) + "/"
        case = "%s%s %s T=%d" % (label, fam, dtype, T)
        with tally.case(case):
            d = os.path.join(fixtures, fam)
            moe = cases.import_layer(a.moec, d, T, os.path.join(tmp, "%s.moe" % fam))
            roundtrip(a, tally, case, moe, cases.dtype_sets(dtype), tmp)


def quant_cases(a, tally, qdir, tmp):
    for fam, dtype, T, _x in cases.inputs(qdir, cases.families(qdir, ",".join(QUANT_FAMILIES)), tokens=TOKENS):
        for dt in ("f32", "bf16"):
            case = "quant/%s %s T=%d" % (fam, dt, T)
            with tally.case(case):
                d = os.path.join(qdir, fam)
                moe = cases.import_layer(a.moec, d, T, os.path.join(tmp, "%s.moe" % fam))
                roundtrip(a, tally, case, moe, ["--set", "dtype=" + dt], tmp)
            if fam not in QACT_FAMILIES:
                continue
            case = "quant/%s %s T=%d --quant-act=fp8" % (fam, dt, T)
            with tally.case(case):
                roundtrip(a, tally, case, moe, ["--set", "dtype=" + dt, "--quant-act=fp8"], tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moec")
    ap.add_argument("fixtures")
    ap.add_argument("examples")
    ap.add_argument("--families", default=FAMILIES)
    ap.add_argument("--examples-only", dest="only", default=",".join(EXAMPLES))
    ap.add_argument("--sched-tool", default=None)
    ap.add_argument("--more-fixtures", action="append", default=[], help="another fixtures folder (repeatable)")
    ap.add_argument("--quant-fixtures", default=None, help="the quantized fixtures folder")
    a = ap.parse_args()
    a.reader = reader(a)
    if not a.reader:
        print("no reader of .tsched: give --sched-tool")
        return 1
    tally = cases.Tally(32)
    with tempfile.TemporaryDirectory() as tmp:
        for fdir in [a.fixtures] + a.more_fixtures:
            hf_cases(a, tally, fdir, tmp)
        if a.quant_fixtures:
            quant_cases(a, tally, a.quant_fixtures, tmp)
        for name in [n for n in a.only.split(",") if n]:
            for dt in ("bf16", "f32"):
                for T in TOKENS:
                    case = "%s %s T=%d" % (name, dt, T)
                    with tally.case(case):
                        moe = os.path.join(a.examples, name + ".moe")
                        sets = EXAMPLES[name] + ["--set", "T=%d" % T, "--set", "dtype=" + dt]
                        roundtrip(a, tally, case, moe, sets, tmp)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
