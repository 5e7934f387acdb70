"""Plots of the fused-MoE layer figures (experiments/moe/h200_session9): share of the HBM bound of the
experts touched at decode sizes (CUDA-graph replay, router included), and TFLOP/s at prefill sizes."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent / "h200_session9"
PEAK_TBS = 4.8
EXPERT_MB = {"qwen3": 3 * 768 * 2048 * 2 / 1e6}  # bf16 w13 + w2 of one expert


def rows(name: str) -> list[dict]:
    return json.loads((HERE / name).read_text())["rows"]


# the swept tiles with the alignment as torch ops (before) and in Triton (final, kernels/moe_align.py)
grouped = {r["tokens"]: r for r in rows("moe_bench_qwen3_bf16_tuned.json") if r["kind"] == "bfloat16"}
final = {r["tokens"]: r for r in rows("moe_bench_qwen3_bf16_final.json") if r["tokens"] >= 16}
gemv = {  # the default tiles' run: GEMV at 1 and 4 tokens (128 experts, top-8: <= 0.5 pairs per expert)
    r["tokens"]: r
    for r in rows("moe_bench_gemv.json")
    if r["shape"] == "qwen3" and r["kind"] == "bfloat16" and r["tokens"] <= 4
}
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for label, data in (
    ("grouped GEMM, swept tiles, torch alignment", grouped),
    ("grouped GEMM, swept tiles, Triton alignment", final),
    ("GEMV (default below 0.5 pairs/expert)", gemv),
):
    ts = sorted(t for t in data if t <= 64 and data[t].get("triton_graph_ms"))
    share = [data[t]["experts_hit"] * EXPERT_MB["qwen3"] / 1e3 / data[t]["triton_graph_ms"] / PEAK_TBS for t in ts]
    ax1.plot(ts, [100 * s for s in share], "o-", label=label)
ax1.axhline(70, color="gray", ls="--", label="target 70%")
ax1.set(xscale="log", xlabel="tokens", ylabel="% of 4.8 TB/s (experts touched)",
        title="Qwen3-30B-A3B MoE layer, bf16, decode sizes")  # fmt: skip
ax1.legend(fontsize=8)
ts = sorted(t for t in grouped if t >= 256)
ax2.plot(ts, [grouped[t]["tflops"] for t in ts], "o-", label="fused MoE, torch alignment (eager, with routing + sum)")
tf = sorted(t for t in final if t >= 256)
ax2.plot(tf, [final[t]["tflops"] for t in tf], "s", label="fused MoE, Triton alignment")
ax2.axhline(450, color="gray", ls="--", label="target 450")
ax2.set(xscale="log", xlabel="tokens", ylabel="TFLOP/s", title="prefill sizes")
ax2.set_xticks(ts, [str(t) for t in ts])
ax2.minorticks_off()
ax2.legend(fontsize=8)
fig.tight_layout()
fig.savefig(HERE / "moe_layer_h200.png", dpi=110)
print(HERE / "moe_layer_h200.png")
