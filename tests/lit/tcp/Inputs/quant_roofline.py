"""Checks the roofline and floor byte and MAC counts of a quantized layer (`moec stats
--target=tcp --json` on stdin) against figures computed here by hand from the layer's
declared shapes and machine.json: the experts' and other weights' *stored* bytes (quantized
values and scales as the checkpoint holds them), the projections' MACs, and the MAC rate of
the contraction the layer uses (f8 x f8 with --quant-act=fp8).

usage: quant_roofline.py MACHINE.json CASE < stats.json   (prints OK or the mismatches)"""
import json
import sys

m = json.load(open(sys.argv[1]))
case = sys.argv[2]
j = json.load(sys.stdin)
S = m["clusters"] * m["slices_per_cluster"]
lanes, clk, hbm = m["lanes_per_slice"], m["clock_hz"], m["memory"]["hbm_bytes_per_s"]
rate = m["contraction"]["macs_per_lane_per_cycle"]
peak = m["peak_ops_per_s"]

if case.startswith("fp8"):  # tests/fixtures/quant/deepseek_v3: block FP8 experts and shared expert, bf16
    T = int(case.split("T")[1])
    D, F, E, K, Sh = 128, 128, 8, 2, 128
    # per expert: gate, up [F, D] and down [D, F] f8 (1 byte), one f32 scale per 128 x 128 block
    wexp = 3 * (F * D * 1 + (F // 128) * (D // 128) * 4)
    # router bf16 [E, D], correction bias f32 [E], the shared expert as stored (fp8 and scales), x and y bf16
    other = E * D * 2 + E * 4 + 3 * (Sh * D * 1 + 4) + 2 * T * D * 2
    macs = T * K * D * F * 3 + T * E * D + 3 * T * Sh * D      # experts, router, shared expert
    mt = "f8"                                                  # --quant-act=fp8: f8 x f8 contractions
elif case == "mxfp4":  # tests/fixtures/quant/mxfp4_gpt_oss imported with dtype=bf16, T = 5
    T, D, F, E, K = 5, 64, 64, 8, 2
    # per expert: gate_up [2F, D/32, 16] u8 (two E2M1 per byte) + [2F, D/32] u8 E8M0 scales + bias bf16 [2F];
    # down [D, F/32, 16] + [D, F/32] + bias bf16 [D]
    wexp = 2 * F * (D // 32) * 16 + 2 * F * (D // 32) + 2 * F * 2 + D * (F // 32) * 16 + D * (F // 32) + D * 2
    other = E * D * 2 + E * 2 + 2 * T * D * 2                  # router and its bias bf16, x and y
    macs = T * K * D * F * 3 + T * E * D                       # gate, up, down; router
    mt = "bf16"                                                # weight-only: bf16 contractions
else:
    sys.exit("unknown case " + case)

bad = []


def near(name, got, want):
    if abs(got - want) > 1e-6 * abs(want):
        bad.append("%s: %r, expected %r" % (name, got, want))


fl, pr = j["tcp_floor"], j["tcp_predict"]
h = E * (1 - (1 - K / E) ** T)                                 # expected experts hit (uniform routing)
near("floor weight_bytes", fl["weight_bytes"], h * wexp)
near("floor other_bytes", fl["other_bytes"], other)
near("floor macs", fl["macs"], macs)
near("floor mac_rate", fl["mac_rate"], S * lanes * rate[mt])
# R1 at the contract's rates: the DMA context's best rate is min(pool, engines, DMNs) bytes/cycle
rho = min(hbm / clk, m["dma"]["engines"] * m["dma"]["bytes_per_cycle_per_engine"],
          m["clusters"] * m["memory"]["dmns_per_cluster"] * m["memory"]["dm_bytes_per_cycle_per_dmn"])
near("floor roofline_seconds", fl["roofline_seconds"],
     max(macs / (S * lanes * rate[mt]), (h * wexp + other) / rho) / clk)
# the prediction's roofline (MODEL.md 6): FLOPs at the peak of the contraction used, bytes over the HBM pool,
# for the experts the predicted routing hit
hp = pr["experts_hit"]
near("flops", j["flops"], 2 * macs)
near("predict roofline_seconds", pr["roofline_seconds"], max(2 * macs / peak[mt], (hp * wexp + other) / hbm))
print("OK" if not bad else "\n".join(bad))
