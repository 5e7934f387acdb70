"""Plots of session 27's MoE variant A/B (experiments/moe/h200_session27): the layer's TFLOP/s at prefill sizes
under each grouped-GEMM variant (Qwen3-30B-A3B, bf16 and FP8 block), and the layer's time at 1 and 4 tokens
under each GEMV variant (Qwen3-30B-A3B and gpt-oss-20b shapes, bf16 / FP8 block / MXFP4).

    python experiments/moe/plot_variants.py
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent / "h200_session27"


def rows(name: str) -> list[dict]:
    return json.loads((HERE / name).read_text())["rows"]


fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
for kind, marker, color in (("bfloat16", "o", "C0"), ("fp8_block", "s", "C3")):
    data = sorted((r for r in rows("moe_variants_prefill.json") if r["kind"] == kind), key=lambda r: r["tokens"])
    ts = [r["tokens"] for r in data]
    for variant, style in (("none", "--"), ("tma", "-")):
        ax1.plot(ts, [r["variants"][variant]["tflops"] for r in data], marker + style, color=color,
                 label=f"{kind}, {'all three descriptor reads' if variant == 'tma' else 'pointer loads'}")  # fmt: skip
ax1.axhline(450, color="gray", ls=":", label="target 450 (bf16, 8192)")
ax1.set(xscale="log", xlabel="tokens", ylabel="TFLOP/s (layer, eager, routing included)",
        title="Qwen3-30B-A3B MoE layer, prefill sizes, H200")  # fmt: skip
ax1.set_xticks([1024, 4096, 8192], ["1024", "4096", "8192"])
ax1.minorticks_off()
ax1.legend(fontsize=7)

decode = rows("moe_variants_decode.json")
labels, width = [], 0.2
variants = ("none", "joint", "sum_slots", "both")
for i, r in enumerate(decode):
    labels.append(f"{r['shape']} {r['kind'].replace('bfloat16', 'bf16').replace('_block', '')} T={r['tokens']}")
    base = r["variants"]["none"]["graph_ms"]
    for j, v in enumerate(variants):
        ax2.bar(i + (j - 1.5) * width, 100 * r["variants"][v]["graph_ms"] / base, width,
                color=f"C{j}", label=v if i == 0 else None)  # fmt: skip
ax2.axhline(100, color="gray", lw=0.8)
ax2.set_xticks(range(len(labels)), labels, fontsize=7, rotation=40, ha="right")
ax2.set(ylabel="% of the time with no variant (graph replay)", ylim=(75, 120),
        title="MoE GEMV variants at decode sizes, H200")  # fmt: skip
ax2.legend(fontsize=7, ncol=4)
fig.tight_layout()
fig.savefig(HERE / "moe_variants_h200.png", dpi=110)
print(HERE / "moe_variants_h200.png")
